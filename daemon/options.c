/*
 * options.c: gpupoold's settings: one table, read by the command-line parser and by the
 * config file's loader alike.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "size.h"
#include "wire.h"

const char options_usage[] =
        "Usage: gpupoold [OPTIONS]\n"
        "\n"
        "Serve pooled GPU (or shared host) memory to the processes of this node.\n"
        "\n"
        "  --config FILE          read settings and tenants from FILE and FILE.d/*.conf\n"
        "                         (default " OPTIONS_DEFAULT_CONFIG ", if it exists)\n"
        "  --check-config         check the config and exit: 0 when good, 1 saying why\n"
        "  --socket PATH          listen on PATH (default " GP_DEFAULT_SOCKET ")\n"
        "  --backend NAME         host, cuda, cuda-vmm or auto (default auto: cuda\n"
        "                         when a GPU backend is available, else host)\n"
        "  --host-capacity SIZE   bytes the host backend may hand out (default 1G)\n"
        "  --headroom SIZE        device memory the cuda backend leaves free for\n"
        "                         contexts and other programs, per GPU (default 1G)\n"
        "  --client-limit SIZE    most bytes one client may reserve (default: no limit)\n"
        "  --idle-release TIME    give cached memory idle this long back (default 5min;\n"
        "                         0: never)\n"
        "  --max-cached SIZE|N%   most memory the cache may hold (default 25%)\n"
        "  --granule-stock N      2 MiB segments made ahead per device, 0 to 4096, for the\n"
        "                         granule leases of segments that grow in place (default 0)\n"
        "  --export-keepalive[=yes|no]  cuda-vmm: keep one export per GPU open, so that\n"
        "                         a lease's export costs no driver rebuild (default yes)\n"
        "  --idle-objects TIME    a named object nobody attached this long may be evicted\n"
        "                         under memory pressure (default 0: never)\n"
        "  --reclaim-timeout TIME how long an allocation waits for clients to give memory\n"
        "                         back (default 100ms)\n"
        "  --max-clients N        most connected clients, 1 to 1024 (default 1024)\n"
        "  --send-timeout TIME    disconnect a client that leaves a reply unread this long\n"
        "                         (default 10s)\n"
        "  --hello-timeout TIME   disconnect a connection that has not said hello after\n"
        "                         this long (default 10s; 0: never)\n"
        "  --max-clients-per-uid N  most connections of one uid, 1 to 1024 (default 256);\n"
        "                         root and the daemon's user may exceed it and\n"
        "                         --max-clients by 8 for administrative requests\n"
        "  --log-level LEVEL      err, warn, info or debug (default info)\n"
        "  --state-dir DIR        keep the reservations in DIR, across restarts (default\n"
        "                         $STATE_DIRECTORY, as systemd sets it; else none, and\n"
        "                         reservations are refused)\n"
        "  --metrics-listen ADDR  serve Prometheus metrics at http://ADDR/metrics: IP:PORT,\n"
        "                         [IPV6]:PORT or PORT alone for 127.0.0.1 (default: off)\n"
        "  --check-invariants[=yes|no]  check the pools after every request (slow; for\n"
        "                         tests)\n"
        "  -h, --help             show this text\n"
        "  --version              show the version\n"
        "\n"
        "SIZE is bytes, or a number with K, M, G, T (powers of 1024; \"KiB\" and \"KB\" too),\n"
        "e.g. 512M, 4G, 1.5GiB. TIME is a number with ms, s, min, h or d, e.g. 30s, 5min.\n"
        "A config file has a key for every option but --config and --check-config;\n"
        "options given here win over the file. --max-blocks (max_blocks) is obsolete:\n"
        "blocks are carved in each process; it is accepted and ignored, with a warning.\n";

enum kind {
        K_PATH,
        K_BACKEND,
        K_SIZE,
        K_CAPACITY,             /* a size of at least one 2 MiB segment */
        K_DURATION,
        K_SIZE_OR_PERCENT,
        K_CLIENTS,
        K_GRANULES,             /* 0 to OPTIONS_MAX_GRANULE_STOCK */
        K_OBSOLETE_COUNT,       /* still parsed as a positive number, then ignored with a warning */
        K_LEVEL,
        K_BOOL,
        K_LISTEN,
        K_DIR,                  /* an absolute path, of OPTIONS_DIR_MAX bytes at most */
};

/* One setting: its option, its config key, and where its value goes. */
struct setting {
        const char *option;
        const char *section;
        const char *key;
        enum kind kind;
        size_t offset;
};

#define AT(field) offsetof(struct options, field)
static const struct setting settings[] = {
        { "socket", "daemon", "socket", K_PATH, AT(socket_path) },
        { "backend", "daemon", "backend", K_BACKEND, AT(backend) },
        { "host-capacity", "daemon", "host_capacity", K_CAPACITY, AT(host_capacity_bytes) },
        { "log-level", "daemon", "log_level", K_LEVEL, AT(log_level) },
        { "max-clients", "daemon", "max_clients", K_CLIENTS, AT(max_clients) },
        { "send-timeout", "daemon", "send_timeout", K_DURATION, AT(send_timeout_ms) },
        { "hello-timeout", "daemon", "hello_timeout", K_DURATION, AT(hello_timeout_ms) },
        { "max-clients-per-uid", "daemon", "max_clients_per_uid", K_CLIENTS, AT(max_clients_per_uid) },
        { "check-invariants", "daemon", "check_invariants", K_BOOL, AT(check_invariants) },
        { "metrics-listen", "daemon", "metrics_listen", K_LISTEN, AT(metrics_addr) },
        { "state-dir", "daemon", "state_dir", K_DIR, AT(state_dir) },
        { "headroom", "pool", "headroom", K_SIZE, AT(headroom_bytes) },
        { "idle-release", "pool", "idle_release", K_DURATION, AT(idle_release_ms) },
        { "idle-objects", "pool", "idle_objects", K_DURATION, AT(idle_objects_ms) },
        { "max-cached", "pool", "max_cached", K_SIZE_OR_PERCENT, AT(max_cached_bytes) },
        { "granule-stock", "pool", "granule_stock", K_GRANULES, AT(granule_stock) },
        { "export-keepalive", "pool", "export_keepalive", K_BOOL, AT(export_keepalive) },
        { "reclaim-timeout", "pool", "reclaim_timeout", K_DURATION, AT(reclaim_timeout_ms) },
        { "client-limit", "limits", "client_max", K_SIZE, AT(client_limit_bytes) },
        { "max-blocks", "limits", "max_blocks", K_OBSOLETE_COUNT, AT(obsolete_max_blocks) },
};
#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

void options_defaults(struct options *o) {
        const char *sd;

        memset(o, 0, sizeof(*o));
        o->action = OPTIONS_RUN;
        snprintf(o->socket_path, sizeof(o->socket_path), "%s", GP_DEFAULT_SOCKET);
        snprintf(o->config_path, sizeof(o->config_path), "%s", OPTIONS_DEFAULT_CONFIG);
        o->backend = BACKEND_AUTO;
        o->host_capacity_bytes = OPTIONS_DEFAULT_HOST_CAPACITY;
        o->headroom_bytes = OPTIONS_DEFAULT_HEADROOM;
        o->idle_release_ms = OPTIONS_DEFAULT_IDLE_RELEASE_MS;
        o->max_cached_percent = OPTIONS_DEFAULT_MAX_CACHED_PERCENT;
        o->reclaim_timeout_ms = OPTIONS_DEFAULT_RECLAIM_TIMEOUT_MS;
        o->send_timeout_ms = OPTIONS_DEFAULT_SEND_TIMEOUT_MS;
        o->hello_timeout_ms = OPTIONS_DEFAULT_HELLO_TIMEOUT_MS;
        o->max_clients_per_uid = OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID;
        o->log_level = LOG_LEVEL_INFO;
        o->max_clients = OPTIONS_DEFAULT_MAX_CLIENTS;
        o->export_keepalive = true;
        /* systemd's StateDirectory=: the first of its directories. */
        if ((sd = getenv("STATE_DIRECTORY")) && sd[0] == '/' && strcspn(sd, ":") < sizeof(o->state_dir))
                snprintf(o->state_dir, sizeof(o->state_dir), "%.*s", (int) strcspn(sd, ":"), sd);
}

static int parse_count(const char *text, unsigned min, unsigned max, unsigned *ret) {
        unsigned long v;
        char *end;

        if (!text || *text < '0' || *text > '9')
                return -EINVAL;
        errno = 0;
        v = strtoul(text, &end, 10);
        if (errno || *end || v < min || v > max)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

/* Sets one setting from text; on failure err says why (after the name, which the caller adds). */
static int set(struct options *o, const struct setting *s, const char *v, char *err, size_t err_size) {
        void *field = (char *) o + s->offset;
        uint64_t bytes;
        unsigned n;
        int r;

        switch (s->kind) {
        case K_PATH:
                if (!*v) {
                        snprintf(err, err_size, "the path is empty");
                        return -EINVAL;
                }
                if (strlen(v) >= sizeof(o->socket_path)) {
                        snprintf(err, err_size, "path longer than %zu bytes: %s", sizeof(o->socket_path) - 1, v);
                        return -EINVAL;
                }
                snprintf(o->socket_path, sizeof(o->socket_path), "%s", v);
                return 0;
        case K_BACKEND:
                if (strcmp(v, "auto") == 0)
                        o->backend = BACKEND_AUTO;
                else if (strcmp(v, "host") == 0)
                        o->backend = BACKEND_HOST;
                else if (strcmp(v, "cuda") == 0)
                        o->backend = BACKEND_CUDA;
                else if (strcmp(v, "cuda-vmm") == 0)
                        o->backend = BACKEND_CUDA_VMM;
                else {
                        snprintf(err, err_size, "unknown backend '%s' (host, cuda, cuda-vmm or auto)", v);
                        return -EINVAL;
                }
                return 0;
        case K_SIZE:
        case K_CAPACITY:
                r = gp_size_parse(v, &bytes);
                if (r < 0) {
                        snprintf(err, err_size, "'%s' is not a size%s", v, r == -ERANGE ? " (too large)" : " (e.g. 512M, 4G, 1.5GiB)");
                        return -EINVAL;
                }
                if (s->kind == K_CAPACITY && bytes < (2ULL << 20)) {
                        snprintf(err, err_size, "'%s' is less than one 2 MiB segment", v);
                        return -EINVAL;
                }
                *(uint64_t *) field = bytes;
                return 0;
        case K_DURATION:
                if (gp_duration_parse(v, &bytes) < 0) {
                        snprintf(err, err_size, "'%s' is not a duration (e.g. 100ms, 30s, 5min, 2h; 0 for none)", v);
                        return -EINVAL;
                }
                *(uint64_t *) field = bytes;
                return 0;
        case K_SIZE_OR_PERCENT: {
                size_t len = strlen(v);

                if (len > 1 && v[len - 1] == '%') {
                        char num[16];

                        snprintf(num, sizeof(num), "%.*s", (int) (len - 1), v);
                        if (len - 1 >= sizeof(num) || parse_count(num, 0, 100, &n) < 0) {
                                snprintf(err, err_size, "'%s' is not a percentage from 0%% to 100%%", v);
                                return -EINVAL;
                        }
                        o->max_cached_percent = n;
                        o->max_cached_bytes = 0;
                        /* 0% is "nothing cached": a byte count of 0 says the same. */
                        return 0;
                }
                if (gp_size_parse(v, &bytes) < 0) {
                        snprintf(err, err_size, "'%s' is neither a size nor a percentage (e.g. 4G, 25%%)", v);
                        return -EINVAL;
                }
                o->max_cached_bytes = bytes;
                o->max_cached_percent = 0;
                return 0;
        }
        case K_CLIENTS:
                if (parse_count(v, 1, 1024, &n) < 0) {
                        snprintf(err, err_size, "'%s' is not a number from 1 to 1024", v);
                        return -EINVAL;
                }
                *(unsigned *) field = n;
                return 0;
        case K_GRANULES:
                if (parse_count(v, 0, OPTIONS_MAX_GRANULE_STOCK, &n) < 0) {
                        snprintf(err, err_size, "'%s' is not a number from 0 to %d", v, OPTIONS_MAX_GRANULE_STOCK);
                        return -EINVAL;
                }
                *(unsigned *) field = n;
                return 0;
        case K_OBSOLETE_COUNT:
                if (parse_count(v, 1, UINT_MAX, &n) < 0) {
                        snprintf(err, err_size, "'%s' is not a positive number", v);
                        return -EINVAL;
                }
                *(bool *) field = true;
                return 0;
        case K_LEVEL:
                if (log_level_parse(v, &o->log_level) < 0) {
                        snprintf(err, err_size, "unknown level '%s' (err, warn, info or debug)", v);
                        return -EINVAL;
                }
                return 0;
        case K_BOOL:
                if (!strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "on"))
                        *(bool *) field = true;
                else if (!strcasecmp(v, "no") || !strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "off"))
                        *(bool *) field = false;
                else {
                        snprintf(err, err_size, "'%s' is not yes or no", v);
                        return -EINVAL;
                }
                return 0;
        case K_DIR:
                if (v[0] != '/' || strlen(v) >= sizeof(o->state_dir)) {
                        snprintf(err, err_size, "'%.64s' is not an absolute path of at most %zu bytes", v, sizeof(o->state_dir) - 1);
                        return -EINVAL;
                }
                snprintf(field, sizeof(o->state_dir), "%s", v);
                return 0;
        case K_LISTEN:
                if (options_parse_listen(v, field) < 0) {
                        snprintf(err, err_size, "'%s' is not an address to listen on (127.0.0.1:9464, [::1]:9464, 9464 or off)", v);
                        return -EINVAL;
                }
                return 0;
        }
        return -EINVAL;
}

int options_parse_listen(const char *text, struct sockaddr_storage *ret) {
        struct sockaddr_storage addr = { .ss_family = AF_UNSPEC };
        char host[INET6_ADDRSTRLEN + 2];
        const char *port_text = text, *colon;
        unsigned port;

        if (!*text || strcmp(text, "off") == 0) {
                *ret = addr;
                return 0;
        }
        colon = strrchr(text, ':');
        if (colon) {
                if ((size_t) (colon - text) >= sizeof(host))
                        return -EINVAL;
                snprintf(host, sizeof(host), "%.*s", (int) (colon - text), text);
                port_text = colon + 1;
        } else {
                snprintf(host, sizeof(host), "127.0.0.1");      /* a port alone: loopback */
        }
        if (parse_count(port_text, 0, 65535, &port) < 0)
                return -EINVAL;
        if (strcmp(host, "localhost") == 0)
                snprintf(host, sizeof(host), "127.0.0.1");
        if (host[0] == '[') {
                size_t len = strlen(host);

                if (len < 3 || host[len - 1] != ']')
                        return -EINVAL;
                host[len - 1] = '\0';
                if (uv_ip6_addr(host + 1, (int) port, (struct sockaddr_in6 *) &addr) < 0)
                        return -EINVAL;
        } else if (uv_ip4_addr(host, (int) port, (struct sockaddr_in *) &addr) < 0 || strchr(host, ':')) {
                return -EINVAL;
        }
        *ret = addr;
        return 0;
}

uint64_t options_fds_needed(const struct options *o, uint64_t fd_bytes) {
        return OPTIONS_FDS_FIXED + (uint64_t) o->max_clients * OPTIONS_FDS_PER_CLIENT + fd_bytes / (2ULL << 20);
}

int options_set_key(struct options *o, const char *section, const char *key, const char *value, char *err,
                    size_t err_size) {
        for (size_t i = 0; i < NSETTINGS; i++)
                if (strcmp(settings[i].section, section) == 0 && strcmp(settings[i].key, key) == 0)
                        return set(o, &settings[i], value, err, err_size);
        return -ENOENT;
}

enum {
        OPT_CONFIG = 256,
        OPT_CHECK_CONFIG,
        OPT_HELP,
        OPT_VERSION,
        OPT_SETTING,            /* OPT_SETTING + i: settings[i] */
};

int options_parse_over(int argc, char **argv, const struct options *base, struct options *ret, char *err,
                       size_t err_size) {
        struct option long_options[NSETTINGS + 5];
        struct options o = *base;
        char why[256];
        size_t n = 0;
        int c;

        for (size_t i = 0; i < NSETTINGS; i++)
                long_options[n++] = (struct option) { settings[i].option,
                                                      settings[i].kind == K_BOOL ? optional_argument : required_argument, NULL,
                                                      OPT_SETTING + (int) i };
        long_options[n++] = (struct option) { "config", required_argument, NULL, OPT_CONFIG };
        long_options[n++] = (struct option) { "check-config", no_argument, NULL, OPT_CHECK_CONFIG };
        long_options[n++] = (struct option) { "help", no_argument, NULL, OPT_HELP };
        long_options[n++] = (struct option) { "version", no_argument, NULL, OPT_VERSION };
        long_options[n] = (struct option) { 0 };

        optind = 0;     /* glibc: start over, so that tests (and reloads) can parse many command lines */
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
                if (c >= OPT_SETTING && c < OPT_SETTING + (int) NSETTINGS) {
                        const struct setting *s = &settings[c - OPT_SETTING];

                        if (set(&o, s, s->kind == K_BOOL && !optarg ? "yes" : optarg, why, sizeof(why)) < 0) {
                                snprintf(err, err_size, "--%s: %s", s->option, why);
                                return -EINVAL;
                        }
                        continue;
                }
                switch (c) {
                case OPT_CONFIG:
                        if (!*optarg || strlen(optarg) >= sizeof(o.config_path)) {
                                snprintf(err, err_size, "--config: the path is empty or too long");
                                return -EINVAL;
                        }
                        snprintf(o.config_path, sizeof(o.config_path), "%s", optarg);
                        o.config_given = true;
                        break;
                case OPT_CHECK_CONFIG:
                        o.action = OPTIONS_CHECK_CONFIG;
                        break;
                case OPT_HELP:
                case 'h':
                        o.action = OPTIONS_HELP;
                        break;
                case OPT_VERSION:
                        o.action = OPTIONS_VERSION;
                        break;
                case ':':
                        snprintf(err, err_size, "%s: needs a value", argv[optind - 1]);
                        return -EINVAL;
                default:
                        if (optopt)
                                snprintf(err, err_size, "unknown option '-%c'", optopt);
                        else
                                snprintf(err, err_size, "unknown option '%s'", argv[optind - 1]);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                snprintf(err, err_size, "unexpected argument '%s'", argv[optind]);
                return -EINVAL;
        }
        *ret = o;
        return 0;
}

int options_parse(int argc, char **argv, struct options *ret, char *err, size_t err_size) {
        struct options base;

        options_defaults(&base);
        return options_parse_over(argc, argv, &base, ret, err, err_size);
}
