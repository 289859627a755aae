/*
 * server.h: the top of the daemon's one libuv loop: the listening socket, accepting and
 * admitting clients, the signals, systemd, and the hooks that join the layers below.
 */
#ifndef GP_SERVER_H
#define GP_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "metrics.h"
#include "node.h"
#include "options.h"

/*
 * The daemon: its node (node.h) and what faces the outside: the listening socket, the
 * signals, systemd's notifications and watchdog, the metrics endpoint.
 */
struct server {
        struct node node;               /* the state below the sessions */
        int argc;                       /* the command line, to read again on reload */
        char **argv;
        int spare_fd;                   /* given up to accept and refuse a client when out of descriptors */
        uv_timer_t accept_timer;        /* accepting again after running out of descriptors */
        bool accept_timer_open;
        uv_timer_t stuck_timer;         /* every second: clients that do not read their replies */
        bool stuck_timer_open;
        int listen_fd;
        bool listen_inherited;          /* systemd's socket ($LISTEN_FDS): the path is its to remove */
        uv_poll_t listen_poll;
        uv_timer_t watchdog_timer;      /* WATCHDOG=1 at half of $WATCHDOG_USEC */
        bool watchdog_timer_open;
        char status[256];               /* the latest STATUS= sent to systemd */
        struct metrics_http *metrics_http;      /* GET /metrics (metrics_listen), or NULL */
        uv_signal_t sigint, sigterm, sighup;
        bool signals_open;
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
 * Makes room for every descriptor the settings o can need with backend
 * (options_fds_needed(), with the descriptors the backend holds ahead for the granule stock:
 * backend_exports_ahead()): raises the soft limit up to the hard one. Where the hard limit is
 * too low for max_clients at its default, lowers o->max_clients to what fits and logs it
 * (never below OPTIONS_MIN_FITTED_CLIENTS). Returns 0, or a negative errno with why (a hard
 * limit too low for a max_clients that was chosen says what to raise or lower).
 */
int server_fit_fd_limit(struct options *o, const struct backend *backend, char *why, size_t why_size);

/* Begins an orderly stop: closes every handle, so that uv_run() returns. */
void server_stop(struct server *server);

#endif
