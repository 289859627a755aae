/*
 * options.h: gpupoold's settings, from defaults, the config file (config.h) and the command
 * line, in that order: the command line wins. One table of settings serves both sources, so
 * a value is checked the same way wherever it comes from, and every setting of one has a name
 * in the other. Kept apart from main() so that every accepted and refused value has a test.
 */
#ifndef GP_OPTIONS_H
#define GP_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "log.h"

enum backend_choice {
        BACKEND_AUTO,
        BACKEND_HOST,
        BACKEND_CUDA,
        BACKEND_CUDA_VMM,
};

enum options_action {
        OPTIONS_RUN,
        OPTIONS_HELP,
        OPTIONS_VERSION,
        OPTIONS_CHECK_CONFIG,   /* load and check the config, then exit */
};

#ifndef GP_SYSCONFDIR
#define GP_SYSCONFDIR "/etc"            /* make SYSCONFDIR=... */
#endif
#define OPTIONS_DEFAULT_CONFIG GP_SYSCONFDIR "/gpupool/gpupoold.conf"
#define OPTIONS_DEFAULT_HOST_CAPACITY (1ULL << 30)
#define OPTIONS_DEFAULT_HEADROOM (1ULL << 30)
#define OPTIONS_DEFAULT_MAX_CLIENTS 1024
#define OPTIONS_DEFAULT_IDLE_RELEASE_MS (5ULL * 60 * 1000)
#define OPTIONS_DEFAULT_MAX_CACHED_PERCENT 25
#define OPTIONS_DEFAULT_RECLAIM_TIMEOUT_MS 100
#define OPTIONS_DEFAULT_SEND_TIMEOUT_MS 10000
#define OPTIONS_DEFAULT_HELLO_TIMEOUT_MS 10000
#define OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID 256
#define OPTIONS_MAX_GRANULE_STOCK 4096
#define OPTIONS_PATH_MAX 4096
#define OPTIONS_DIR_MAX 1023    /* the state directory: its files' names fit after it */

/*
 * Descriptors one client can make the daemon hold: its socket and pidfd, its control
 * channel's socket and pidfd. (A reply waiting for the socket to drain names its segments,
 * whose descriptors are made only as it is sent: session.c.)
 */
#define OPTIONS_FDS_PER_CLIENT 4
/*
 * Descriptors held whatever the clients: stdio, the loop and its signals, the listening
 * sockets, cuda-vmm's export kept open per GPU (export_keepalive), metrics scrapes, the operators' connections beyond
 * --max-clients, room for those the closer thread has not closed yet, and the most one reply
 * carries (GP_MAX_LEASE_GRANULES, made for the send and closed after it).
 */
#define OPTIONS_FDS_FIXED (192 + 128)
/* The fewest clients the daemon fits max_clients to at its default (server_fit_fd_limit()). */
#define OPTIONS_MIN_FITTED_CLIENTS 16

struct options {
        enum options_action action;
        char socket_path[108];
        char config_path[OPTIONS_PATH_MAX];
        bool config_given;              /* --config: the file must exist */
        enum backend_choice backend;
        uint64_t host_capacity_bytes;
        uint64_t headroom_bytes;        /* cuda: device memory left to others, per GPU */
        uint64_t client_limit_bytes;    /* default per-client limit; 0: none */
        uint64_t idle_release_ms;       /* cached memory idle this long goes back; 0: never */
        uint64_t idle_objects_ms;       /* a named object unattached this long may be evicted under pressure; 0: never */
        uint64_t max_cached_bytes;      /* cache watermark in bytes, when max_cached_percent is 0 ... */
        unsigned max_cached_percent;    /* ... else in percent of the device (1 to 100) */
        unsigned granule_stock;         /* 2 MiB segments made ahead per device for granule leases; 0: none */
        bool export_keepalive;          /* cuda-vmm: one export kept open per GPU, so that no lease's export finds none */
        uint64_t reclaim_timeout_ms;    /* how long an allocation waits for clients to give memory back */
        uint64_t send_timeout_ms;       /* how long a reply may wait for its client to read it */
        uint64_t hello_timeout_ms;      /* how long a new connection may take to say hello; 0: forever */
        unsigned max_clients_per_uid;   /* connections one uid may hold (operators may go past, for admin requests) */
        enum log_level log_level;
        unsigned max_clients;
        bool obsolete_max_blocks;       /* --max-blocks or max_blocks was given: warned about, ignored */
        bool check_invariants;          /* run pool_check() after every request */
        char state_dir[OPTIONS_DIR_MAX + 1];    /* where the reservations are kept; "": nowhere (reservations refused) */
        struct sockaddr_storage metrics_addr;   /* GET /metrics here; ss_family AF_UNSPEC: not served */
};

/* The defaults. */
void options_defaults(struct options *ret);

/*
 * Parses argv over the defaults. Returns 0 and fills *ret, or -EINVAL with a one-line
 * message naming the option in err; *ret is untouched on failure.
 */
int options_parse(int argc, char **argv, struct options *ret, char *err, size_t err_size);

/* Parses argv over base (the config file's values): the command line wins. As options_parse(). */
int options_parse_over(int argc, char **argv, const struct options *base, struct options *ret, char *err,
                       size_t err_size);

/*
 * Sets the config file's key in section ("daemon", "pool", "limits") to value. Returns 0,
 * -ENOENT for a key no setting has, or -EINVAL with a message (without the key) in err.
 */
int options_set_key(struct options *o, const char *section, const char *key, const char *value, char *err,
                    size_t err_size);

/*
 * Parses a metrics_listen address: "IPV4:PORT", "[IPV6]:PORT", "localhost:PORT", or "PORT"
 * alone for 127.0.0.1 (loopback unless an address says otherwise); "" or "off" for none
 * (ss_family AF_UNSPEC). Port 0 takes any free port (the log says which). Returns 0 or -EINVAL.
 */
int options_parse_listen(const char *text, struct sockaddr_storage *ret);

/*
 * The file descriptors the daemon needs at most with these settings: OPTIONS_FDS_FIXED, each
 * of --max-clients, and one per segment of the fd_bytes a backend keeps as descriptors (host:
 * a memfd each; segments are at least 2 MiB). cuda-vmm keeps none: its exports live for a send.
 */
uint64_t options_fds_needed(const struct options *o, uint64_t fd_bytes);

/* The --help text. */
extern const char options_usage[];

#endif
