/*
 * server.h: the daemon's one libuv loop: the listening socket, the sessions, the pools (one
 * per device) and the signals that stop it.
 */
#ifndef GP_SERVER_H
#define GP_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "log.h"
#include "config.h"
#include "metrics.h"
#include "options.h"
#include "policy.h"
#include "pool.h"
#include "wire.h"

struct session;

/*
 * Connections of root and the daemon's user let in past --max-clients and max_clients_per_uid,
 * for administrative requests: silent peers filling the limits cannot lock the operator out.
 */
#define SERVER_OPERATOR_ROOM 8

/* Processes with a set-limit --pid at once. */
#define SERVER_MAX_PID_LIMITS 64

/* A set-limit --pid: the process (its start time tells a reused pid apart) and its limit. */
struct pid_limit {
        pid_t pid;
        unsigned long long start_time;  /* /proc/PID/stat's starttime, in clock ticks after boot */
        uint64_t max_bytes;             /* per device; 0: no limit */
};

struct server {
        uv_loop_t *loop;
        const struct options *options; /* &config.options */
        struct config config;           /* as loaded, with the command line over it */
        int argc;                       /* the command line, to read again on reload */
        char **argv;
        struct policy policy;
        struct backend *backend;
        struct pool *pools[BACKEND_MAX_DEVICES];
        struct backend_device_info devices[BACKEND_MAX_DEVICES];   /* as the backend described them */
        uint64_t reclaims_total[BACKEND_MAX_DEVICES];   /* segments clients gave back when asked */
        uint64_t leases_total[BACKEND_MAX_DEVICES];             /* segments leased */
        uint64_t refusals_total[METRICS_REFUSAL_COUNT];         /* allocations refused, by reason */
        uint64_t checks_total;          /* server_check() runs */
        struct log_ratelimit peer_log;  /* what all clients together may make it log */
        int spare_fd;                   /* given up to accept and refuse a client when out of descriptors */
        uv_timer_t accept_timer;        /* accepting again after running out of descriptors */
        bool accept_timer_open;
        uv_timer_t reclaim_timer;       /* the earliest parked allocation's deadline */
        bool reclaim_timer_open;
        uv_timer_t stuck_timer;         /* every second: clients that do not read their replies */
        bool stuck_timer_open;
        unsigned device_count;
        int listen_fd;
        bool listen_inherited;          /* systemd's socket ($LISTEN_FDS): the path is its to remove */
        uv_poll_t listen_poll;
        uv_timer_t watchdog_timer;      /* WATCHDOG=1 at half of $WATCHDOG_USEC */
        bool watchdog_timer_open;
        char status[256];               /* the latest STATUS= sent to systemd */
        struct metrics_http *metrics_http;      /* GET /metrics (metrics_listen), or NULL */
        uv_signal_t sigint, sigterm, sighup;
        bool signals_open;
        uv_timer_t decay_timer;         /* fires when the oldest cached segment has idled idle_release */
        bool decay_timer_open;
        struct session *sessions;       /* connected and exiting clients */
        unsigned connected;             /* sessions with an open socket, of --max-clients */
        unsigned admin_connected;       /* operators' sessions let in past the limits */
        uint64_t next_client_id;
        struct pid_limit pid_limits[SERVER_MAX_PID_LIMITS];     /* set-limit --pid, until a reload */
        unsigned pid_limit_count;
        bool stopping;
        uint8_t recv_buf[GP_MAX_REQUEST_BYTES];
        struct gp_wire_arena arena;     /* the current request's decoded structures */
        unsigned parked;                /* sessions with a parked allocation */
        unsigned reclaim_outstanding;   /* reclaim requests no client has answered yet */
};

/*
 * Sets the server up on loop with config (copied; argv is kept for reloads) and backend
 * (taken over: the server closes it): a pool per device, the listening socket (a stale socket
 * file is replaced; a live one is an error) and the signal handlers. Returns 0 or a negative
 * errno, logged.
 */
int server_start(struct server *server, uv_loop_t *loop, const struct config *config, int argc, char **argv,
                 struct backend *backend);

/* Tells systemd (if it listens) the daemon's state in one line: clients and bytes in use. Sent only when it changed. */
void server_notify_status(struct server *server);

/* server_start() without the socket and the signals: for the protocol fuzzer, which brings its own sessions. */
int server_init(struct server *server, uv_loop_t *loop, const struct config *config, int argc, char **argv,
                struct backend *backend);

/*
 * Reads the config file again (SIGHUP, gpupoolctl reload) and applies it to every client
 * without disconnecting anyone; set-limit overrides are dropped. A config that does not load
 * or does not fit the devices is refused and the old one stays, untouched. Returns 0 or a
 * negative errno, logged; why says what was loaded, or why it was refused.
 */
int server_reload(struct server *server, char *why, size_t why_size);

/*
 * set-limit --pid: every connection of pid, now and later ones of the same process (not of a
 * later process that reuses the pid), may reserve max_bytes per device (0: no limit) until
 * the next reload. Returns 0, -ESRCH when no such process runs, or -ENOSPC when
 * SERVER_MAX_PID_LIMITS processes have one already.
 */
int server_set_pid_limit(struct server *server, pid_t pid, uint64_t max_bytes);

/* The set-limit of a new connection of pid: POLICY_NO_OVERRIDE when its process has none. */
uint64_t server_pid_limit(struct server *server, pid_t pid);


/*
 * Makes room for every descriptor the settings o can need with backend
 * (options_fds_needed()): raises the soft limit up to the hard one. Returns 0, or a negative
 * errno with why (a hard limit too low says what to raise or lower).
 */
int server_fit_fd_limit(const struct options *o, const struct backend *backend, char *why, size_t why_size);

/*
 * Logs a message that a client's doing caused (its connection, refusals, bad input), under
 * the rate limit for all clients together; session_log() adds the client's own limit.
 */
#define server_log(server, level, ...)                                          \
        do {                                                                    \
                if ((level) <= log_max_level)                                   \
                        server_log_write((server), (level), __VA_ARGS__);       \
        } while (0)
void server_log_write(struct server *server, enum log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
void server_log_writev(struct server *server, enum log_level level, const char *fmt, va_list ap)
        __attribute__((format(printf, 3, 0)));

/* Why a connection is over --max-clients, or (per_uid) over max_clients_per_uid for uid. */
void server_limit_text(const struct server *server, bool per_uid, uid_t uid, char *buf, size_t size);

/* Begins an orderly stop: closes every handle, so that uv_run() returns. */
void server_stop(struct server *server);

/* Checks every pool and the tenants' sums. Returns 0, or -EUCLEAN with what is wrong in why. */
int server_check(struct server *server, char *why, size_t why_size);

/*
 * After anything that may have changed a pool: holds the cache to its watermark, arms the
 * idle-release timer, and with --check-invariants checks every pool and the tenants' sums
 * (aborting on a broken invariant).
 */
void server_after_change(struct server *server);

#endif
