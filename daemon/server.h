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
#include "options.h"
#include "policy.h"
#include "pool.h"
#include "wire.h"

struct session;

struct server {
        uv_loop_t *loop;
        const struct options *options;
        struct policy policy;
        struct backend *backend;
        struct pool *pools[BACKEND_MAX_DEVICES];
        struct backend_device_info devices[BACKEND_MAX_DEVICES];   /* as the backend described them */
        unsigned device_count;
        int listen_fd;
        uv_poll_t listen_poll;
        uv_signal_t sigint, sigterm;
        bool signals_open;
        struct session *sessions;       /* connected and exiting clients */
        unsigned connected;             /* sessions with an open socket */
        uint64_t next_client_id;
        bool stopping;
        uint8_t recv_buf[GP_MAX_REQUEST_BYTES];
        uint8_t send_buf[GP_MAX_REPLY_BYTES];
};

/*
 * Sets the server up on loop with backend (taken over: the server closes it): a pool per
 * device, the listening socket (a stale socket file is replaced; a live one is an error) and
 * the signal handlers. Returns 0 or a negative errno, logged.
 */
int server_start(struct server *server, uv_loop_t *loop, const struct options *options, struct backend *backend);

/* Begins an orderly stop: closes every handle, so that uv_run() returns. */
void server_stop(struct server *server);

/* With --check-invariants: checks every pool and aborts on a broken invariant. */
void server_check_invariants(struct server *server);

#endif
