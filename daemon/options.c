/*
 * options.c: parsing gpupoold's command line.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"
#include "wire.h"

const char options_usage[] =
        "Usage: gpupoold [OPTIONS]\n"
        "\n"
        "Serve pooled GPU (or shared host) memory to the processes of this node.\n"
        "\n"
        "  --socket PATH          listen on PATH (default " GP_DEFAULT_SOCKET ")\n"
        "  --backend NAME         host, cuda or auto (default auto: cuda when a GPU\n"
        "                         backend is available, else host)\n"
        "  --host-capacity SIZE   bytes the host backend may hand out (default 1G)\n"
        "  --headroom SIZE        device memory the cuda backend leaves to the driver\n"
        "                         and other users, per GPU (default 512M)\n"
        "  --client-limit SIZE    most bytes one client may reserve (default: no limit)\n"
        "  --max-clients N        most connected clients, 1 to 1024 (default 1024)\n"
        "  --max-blocks N         most live blocks one client may hold (default 1048576)\n"
        "  --log-level LEVEL      err, warn, info or debug (default info)\n"
        "  --check-invariants     check the pools after every request (slow; for tests)\n"
        "  --help                 show this text\n"
        "  --version              show the version\n"
        "\n"
        "SIZE is bytes, or a number with K, M, G, T (powers of 1024; \"KiB\" and \"KB\" too),\n"
        "e.g. 512M, 4G, 1.5GiB.\n";

enum {
        OPT_SOCKET = 256,
        OPT_BACKEND,
        OPT_HOST_CAPACITY,
        OPT_HEADROOM,
        OPT_CLIENT_LIMIT,
        OPT_MAX_CLIENTS,
        OPT_MAX_BLOCKS,
        OPT_LOG_LEVEL,
        OPT_CHECK_INVARIANTS,
        OPT_HELP,
        OPT_VERSION,
};

static const struct option long_options[] = {
        { "socket", required_argument, NULL, OPT_SOCKET },
        { "backend", required_argument, NULL, OPT_BACKEND },
        { "host-capacity", required_argument, NULL, OPT_HOST_CAPACITY },
        { "headroom", required_argument, NULL, OPT_HEADROOM },
        { "client-limit", required_argument, NULL, OPT_CLIENT_LIMIT },
        { "max-clients", required_argument, NULL, OPT_MAX_CLIENTS },
        { "max-blocks", required_argument, NULL, OPT_MAX_BLOCKS },
        { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
        { "check-invariants", no_argument, NULL, OPT_CHECK_INVARIANTS },
        { "help", no_argument, NULL, OPT_HELP },
        { "version", no_argument, NULL, OPT_VERSION },
        { 0 },
};

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

int options_parse(int argc, char **argv, struct options *ret, char *err, size_t err_size) {
        struct options o = {
                .action = OPTIONS_RUN,
                .socket_path = GP_DEFAULT_SOCKET,
                .backend = BACKEND_AUTO,
                .host_capacity_bytes = OPTIONS_DEFAULT_HOST_CAPACITY,
                .headroom_bytes = OPTIONS_DEFAULT_HEADROOM,
                .log_level = LOG_LEVEL_INFO,
                .max_clients = OPTIONS_DEFAULT_MAX_CLIENTS,
                .max_blocks = OPTIONS_DEFAULT_MAX_BLOCKS,
        };
        int c, r;

        optind = 0;     /* glibc: start over, so that tests can parse many command lines */
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
                switch (c) {
                case OPT_SOCKET:
                        if (!*optarg) {
                                snprintf(err, err_size, "--socket: the path is empty");
                                return -EINVAL;
                        }
                        if (strlen(optarg) >= 108) {
                                snprintf(err, err_size, "--socket: path longer than 107 bytes: %s", optarg);
                                return -EINVAL;
                        }
                        o.socket_path = optarg;
                        break;
                case OPT_BACKEND:
                        if (strcmp(optarg, "auto") == 0)
                                o.backend = BACKEND_AUTO;
                        else if (strcmp(optarg, "host") == 0)
                                o.backend = BACKEND_HOST;
                        else if (strcmp(optarg, "cuda") == 0)
                                o.backend = BACKEND_CUDA;
                        else {
                                snprintf(err, err_size, "--backend: unknown backend '%s' (host, cuda or auto)", optarg);
                                return -EINVAL;
                        }
                        break;
                case OPT_HOST_CAPACITY:
                case OPT_HEADROOM:
                case OPT_CLIENT_LIMIT: {
                        const char *name = c == OPT_HOST_CAPACITY ? "--host-capacity" :
                                           c == OPT_HEADROOM      ? "--headroom" : "--client-limit";
                        uint64_t bytes;

                        r = gp_size_parse(optarg, &bytes);
                        if (r < 0) {
                                snprintf(err, err_size, "%s: '%s' is not a size%s", name, optarg,
                                         r == -ERANGE ? " (too large)" : " (e.g. 512M, 4G, 1.5GiB)");
                                return -EINVAL;
                        }
                        if (c == OPT_HOST_CAPACITY) {
                                if (bytes < (2ULL << 20)) {
                                        snprintf(err, err_size, "--host-capacity: '%s' is less than one 2 MiB segment", optarg);
                                        return -EINVAL;
                                }
                                o.host_capacity_bytes = bytes;
                        } else if (c == OPT_HEADROOM) {
                                o.headroom_bytes = bytes;
                        } else {
                                o.client_limit_bytes = bytes;
                        }
                        break;
                }
                case OPT_MAX_CLIENTS:
                        if (parse_count(optarg, 1, 1024, &o.max_clients) < 0) {
                                snprintf(err, err_size, "--max-clients: '%s' is not a number from 1 to 1024", optarg);
                                return -EINVAL;
                        }
                        break;
                case OPT_MAX_BLOCKS:
                        if (parse_count(optarg, 1, UINT_MAX, &o.max_blocks) < 0) {
                                snprintf(err, err_size, "--max-blocks: '%s' is not a positive number", optarg);
                                return -EINVAL;
                        }
                        break;
                case OPT_LOG_LEVEL:
                        if (log_level_parse(optarg, &o.log_level) < 0) {
                                snprintf(err, err_size, "--log-level: unknown level '%s' (err, warn, info or debug)", optarg);
                                return -EINVAL;
                        }
                        break;
                case OPT_CHECK_INVARIANTS:
                        o.check_invariants = true;
                        break;
                case OPT_HELP:
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
