/*
 * server.c: the listening socket, accepting clients, signals and an orderly stop.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "request.h"
#include "session.h"

/*
 * Refuses a connection over --max-clients with one packet saying why, so the client reports
 * it instead of a bare reset. The packet is id 0: the client has not asked anything yet.
 */
static void refuse_client(struct server *server, int fd) {
        struct session fake = { .server = server };
        struct reply rep;
        char why[128];

        snprintf(why, sizeof(why), "the daemon already serves %u clients, its limit (--max-clients)",
                 server->options->max_clients);
        request_error_reply(&fake, 0, -EDQUOT, true, why, &rep);
        (void) gp_wire_send_packet(fd, server->send_buf, rep.len, -1);
        close(fd);
}

static void on_connection(uv_poll_t *handle, int status, int events) {
        struct server *server = handle->data;

        (void) events;
        if (status < 0) {
                log_err("listening socket: %s", uv_strerror(status));
                return;
        }
        /* Accept what is queued, a bounded number at a time. */
        for (int i = 0; i < 64; i++) {
                int fd = accept4(server->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                int r;

                if (fd < 0) {
                        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                                log_warn("accept: %s", strerror(errno));
                        return;
                }
                if (server->connected >= server->options->max_clients) {
                        log_warn("refusing a client: %u connected, the limit (--max-clients)", server->connected);
                        refuse_client(server, fd);
                        continue;
                }
                r = session_start(server, fd);
                if (r < 0)
                        log_warn("cannot start a session: %s", strerror(-r));
        }
}

static void on_signal(uv_signal_t *handle, int signum) {
        struct server *server = handle->data;

        log_info("%s: shutting down", strsignal(signum));
        server_stop(server);
}

/*
 * Binds path. A socket file nobody listens on is a leftover of a crash and is replaced; one
 * that answers belongs to a running daemon, and starting a second is an error.
 */
static int listen_on(const char *path, int *ret_fd) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        struct stat st;
        int fd, probe, r;

        if (strlen(path) >= sizeof(addr.sun_path))
                return -ENAMETOOLONG;
        strcpy(addr.sun_path, path);
        if (lstat(path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode)) {
                        log_err("%s exists and is not a socket; not replacing it", path);
                        return -EEXIST;
                }
                if (gp_wire_connect(path, &probe) == 0) {
                        close(probe);
                        log_err("another gpupoold is listening on %s", path);
                        return -EADDRINUSE;
                }
                if (unlink(path) < 0)
                        return -errno;
        }
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0 || listen(fd, 128) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        /* Any local user may connect; what each may have is the policy's to decide. */
        if (chmod(path, 0666) < 0) {
                r = -errno;
                close(fd);
                unlink(path);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int server_start(struct server *server, uv_loop_t *loop, const struct options *options, struct backend *backend) {
        int r;

        server->loop = loop;
        server->options = options;
        server->policy.client_limit_bytes = options->client_limit_bytes;
        server->policy.max_blocks = options->max_blocks;
        server->backend = backend;
        server->device_count = backend->device_count;
        server->next_client_id = 1;
        server->listen_fd = -1;

        for (unsigned d = 0; d < server->device_count; d++) {
                struct backend_device_info info;

                r = backend->ops->device_info(backend, d, &info);
                if (r < 0) {
                        log_err("device %u: %s", d, strerror(-r));
                        return r;
                }
                server->devices[d] = info;
                r = pool_new(backend, d, info.total_bytes, &server->pools[d]);
                if (r < 0)
                        return r;
        }
        /*
         * Signals first: once the socket is live a client (or a test) may ask for a stop at
         * once, and a SIGTERM before the handler exists would kill the daemon uncleanly.
         */
        uv_signal_init(loop, &server->sigint);
        uv_signal_init(loop, &server->sigterm);
        server->sigint.data = server->sigterm.data = server;
        uv_signal_start(&server->sigint, on_signal, SIGINT);
        uv_signal_start(&server->sigterm, on_signal, SIGTERM);
        server->signals_open = true;
        /* A client that vanishes mid-send must not kill the daemon (sends also use MSG_NOSIGNAL). */
        signal(SIGPIPE, SIG_IGN);

        r = listen_on(options->socket_path, &server->listen_fd);
        if (r < 0) {
                log_err("cannot listen on %s: %s", options->socket_path, strerror(-r));
                return r;
        }
        uv_poll_init(loop, &server->listen_poll, server->listen_fd);
        server->listen_poll.data = server;
        uv_poll_start(&server->listen_poll, UV_READABLE, on_connection);
        return 0;
}

static void free_pools(struct server *server) {
        for (unsigned d = 0; d < server->device_count; d++) {
                pool_free(server->pools[d]);
                server->pools[d] = NULL;
        }
        if (server->backend)
                server->backend->ops->close(server->backend);
        server->backend = NULL;
}

void server_stop(struct server *server) {
        if (server->stopping)
                return;
        server->stopping = true;
        if (server->signals_open) {
                uv_close((uv_handle_t *) &server->sigint, NULL);
                uv_close((uv_handle_t *) &server->sigterm, NULL);
                server->signals_open = false;
        }
        if (server->listen_fd >= 0) {
                uv_close((uv_handle_t *) &server->listen_poll, NULL);
                close(server->listen_fd);
                server->listen_fd = -1;
                unlink(server->options->socket_path);
        }
        while (server->sessions)
                session_destroy(server->sessions);
        free_pools(server);
}

void server_check_invariants(struct server *server) {
        char why[256];

        if (!server->options->check_invariants)
                return;
        for (unsigned d = 0; d < server->device_count; d++) {
                if (server->pools[d] && pool_check(server->pools[d], why, sizeof(why)) < 0) {
                        log_err("invariant broken: %s", why);
                        abort();
                }
        }
}
