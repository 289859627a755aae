/*
 * conn.c: request and reply over a blocking SEQPACKET socket, for gpupool's clients.
 */
#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "size.h"

static void set_error(struct gp_conn *c, const char *message) {
        snprintf(c->error, sizeof(c->error), "%s", message ? message : "");
}

static void close_fds(const int *fds, size_t nfds) {
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
}

static void drop(Gpupool__Envelope *rep, const int *fds, size_t nfds) {
        gpupool__envelope__free_unpacked(rep, NULL);
        close_fds(fds, nfds);
}

/* Marks c unusable from now on, broken by errno r. Returns r. */
static int break_with(struct gp_conn *c, int r) {
        c->broke_with = r;
        __atomic_store_n(&c->broken, true, __ATOMIC_RELAXED);   /* read unlocked by the client's fast path */
        return r;
}

/* The connection is unusable from now on; returns the errno the caller reports. */
static int broken(struct gp_conn *c, int r) {
        if (r == 0 || r == -EPIPE || r == -ECONNRESET || r == -ENOTCONN) {
                set_error(c, "gpupoold closed the connection");
                return break_with(c, -ECONNRESET);
        }
        if (r == -EPROTO) {
                set_error(c, "gpupoold sent a message this version cannot read");
                return break_with(c, -EPROTO);
        }
        if (r == -EAGAIN || r == -ETIMEDOUT) {
                snprintf(c->error, sizeof(c->error), "gpupoold did not answer within %llu ms ($GPUPOOL_TIMEOUT): it is "
                         "stopped or hung; this connection is given up", (unsigned long long) c->timeout_ms);
                return break_with(c, -ETIMEDOUT);
        }
        set_error(c, strerror(-r));
        return break_with(c, -ECONNRESET);
}

/* Sends req with send_nfds descriptors; gp_conn_reply_fds() reads its reply, after those of the requests sent before it. */
static int send_request(struct gp_conn *c, Gpupool__Envelope *req, const int *send_fds, size_t send_nfds) {
        int n, sent;

        if (c->broken) {
                set_error(c, "the connection to gpupoold is gone");
                return -ECONNRESET;
        }
        req->version = GP_PROTOCOL_VERSION;
        req->id = c->next_id;
        n = gp_wire_pack(req, c->buf, GP_MAX_REQUEST_BYTES);
        if (n < 0)
                return n;
        /*
         * A daemon that refuses the connection sends why, then closes: the send may fail, or
         * the first read report the reset, with the reason still queued. Read on once for it.
         */
        sent = gp_wire_send_packet_fds(c->sock, c->buf, (size_t) n, send_fds, send_nfds);
        if (sent < 0 && sent != -EPIPE && sent != -ECONNRESET)
                return broken(c, sent);
        if (sent < 0)
                c->send_failed = sent;
        if (!c->unanswered)
                c->trips++;
        c->next_id++;
        c->calls++;
        c->unanswered++;
        return 0;
}

int gp_conn_reply_fds(struct gp_conn *c, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply, int *fds,
                      size_t max_fds, size_t *ret_nfds) {
        uint64_t id = c->next_id - c->unanswered;
        int got[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *rep = NULL;
        size_t nfds = 0;
        int n, r;

        *ret_nfds = 0;
        if (c->broken) {
                set_error(c, "the connection to gpupoold is gone");
                return -ECONNRESET;
        }
        for (bool retried = false;;) {
                n = gp_wire_recv_packet_fds(c->sock, c->buf, sizeof(c->buf), got, &nfds);
                if (n == -ECONNRESET && !retried) {
                        retried = true;
                        continue;
                }
                if (n <= 0) {
                        close_fds(got, nfds);
                        return broken(c, c->send_failed ? c->send_failed : n);
                }
                if (gp_wire_unpack(c->buf, (size_t) n, &rep) < 0) {
                        close_fds(got, nfds);
                        return broken(c, -EPROTO);
                }
                if (rep->id == id)
                        break;
                if (rep->id != 0) {
                        drop(rep, got, nfds);
                        return broken(c, -EPROTO);
                }
                if (rep->has_status && rep->status != GPUPOOL__STATUS__STATUS_OK) {
                        /* Pushed with id 0 and an error: the daemon refused this connection. */
                        set_error(c, rep->error);
                        r = gp_status_to_errno(rep->status);
                        drop(rep, got, nfds);
                        return break_with(c, r);
                }
                /* A pushed message this version does not act on. */
                drop(rep, got, nfds);
                nfds = 0;
        }
        c->unanswered--;
        if (rep->has_status && rep->status != GPUPOOL__STATUS__STATUS_OK) {
                set_error(c, rep->error);
                r = gp_status_to_errno(rep->status);
                drop(rep, got, nfds);
                return r;
        }
        if (rep->body_case != want || nfds > max_fds) {
                drop(rep, got, nfds);
                r = broken(c, -EPROTO);
                set_error(c, nfds > max_fds ? "gpupoold sent more descriptors than the reply can carry" :
                                              "gpupoold answered with the wrong kind of message");
                return r;
        }
        if (nfds)
                memcpy(fds, got, nfds * sizeof(int));
        *ret_nfds = nfds;
        *ret_reply = rep;
        return 0;
}

/* One call: req with send_nfds descriptors, its reply with up to max_fds. */
static int call(struct gp_conn *c, Gpupool__Envelope *req, const int *send_fds, size_t send_nfds,
                Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply, int *fds, size_t max_fds, size_t *ret_nfds) {
        int r = send_request(c, req, send_fds, send_nfds);

        *ret_nfds = 0;
        return r < 0 ? r : gp_conn_reply_fds(c, want, ret_reply, fds, max_fds, ret_nfds);
}

int gp_conn_send(struct gp_conn *c, Gpupool__Envelope *req) {
        return send_request(c, req, NULL, 0);
}

int gp_conn_call_fds(struct gp_conn *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                     Gpupool__Envelope **ret_reply, int *fds, size_t max_fds, size_t *ret_nfds) {
        return call(c, req, NULL, 0, want, ret_reply, fds, max_fds, ret_nfds);
}

int gp_conn_call_passing(struct gp_conn *c, Gpupool__Envelope *req, const int *fds, size_t nfds,
                         Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply) {
        size_t got;

        return call(c, req, fds, nfds, want, ret_reply, NULL, 0, &got);
}

int gp_conn_call(struct gp_conn *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                 Gpupool__Envelope **ret_reply, int *ret_fd) {
        int fd = -1;
        size_t nfds;
        int r = gp_conn_call_fds(c, req, want, ret_reply, &fd, 1, &nfds);

        if (r == 0 && ret_fd)
                *ret_fd = nfds ? fd : -1;
        else if (r == 0 && nfds)
                close(fd);
        return r;
}

/* What is at path, which connect(2) refused, when it is not a socket: "a directory", or NULL. */
static const char *not_a_socket(const char *path) {
        struct stat st;

        if (stat(path, &st) < 0 || S_ISSOCK(st.st_mode))
                return NULL;
        if (S_ISDIR(st.st_mode))
                return "a directory";
        if (S_ISREG(st.st_mode))
                return "a regular file";
        if (S_ISFIFO(st.st_mode))
                return "a FIFO";
        if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
                return "a device file";
        return "not a socket";
}

/* Why a connect to path failed, and what to do, for whoever reads the error first: a newcomer, often. */
static void connect_error(struct gp_conn *c, const char *path, int r) {
        const char *what = r == -ECONNREFUSED ? not_a_socket(path) : NULL;

        if (what)
                snprintf(c->error, sizeof(c->error), "%s is %s, not gpupoold's socket: set $GPUPOOL_SOCKET to the socket "
                         "gpupoold listens on (default " GP_DEFAULT_SOCKET ")", path, what);
        else if (r == -ENOENT || r == -ECONNREFUSED)
                snprintf(c->error, sizeof(c->error), "no gpupoold listens at %s (%s): start it, or set $GPUPOOL_SOCKET to "
                         "the socket it listens on", path, r == -ENOENT ? "there is no such socket" :
                                                             "the socket is there, and nobody accepts on it: "
                                                             "a daemon that stopped left it");
        else if (r == -EACCES)
                snprintf(c->error, sizeof(c->error), "may not connect to gpupoold at %s: %s (is this user in group "
                         "gpupool?)", path, strerror(-r));
        else
                snprintf(c->error, sizeof(c->error), "cannot connect to gpupoold at %s: %s", path, strerror(-r));
}

int gp_conn_open(struct gp_conn *c, const char *path, const Gpupool__Hello *hello, Gpupool__Envelope **ret_hello) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello h = *hello;
        int r;

        const char *timeout = getenv("GPUPOOL_TIMEOUT");

        c->sock = -1;
        __atomic_store_n(&c->broken, false, __ATOMIC_RELAXED);
        c->broke_with = 0;
        c->next_id = 1;
        c->unanswered = 0;
        c->send_failed = 0;
        c->error[0] = '\0';
        c->timeout_ms = GP_CONN_DEFAULT_TIMEOUT_MS;
        if (timeout && *timeout && gp_duration_parse(timeout, &c->timeout_ms) < 0) {
                snprintf(c->error, sizeof(c->error), "$GPUPOOL_TIMEOUT: '%.64s' is not a duration (e.g. 30s, 2min; 0 for none)",
                         timeout);
                return -EINVAL;
        }
        path = gp_wire_socket_path(path);
        r = gp_wire_connect_timeout(path, c->timeout_ms, &c->sock);
        if (r < 0) {
                connect_error(c, path, r);
                return r;
        }
        req.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        req.hello = &h;
        r = gp_conn_call(c, &req, GPUPOOL__ENVELOPE__BODY_HELLO_REPLY, &rep, NULL);
        if (r < 0) {
                char why[sizeof(c->error)];
                size_t n, len;

                /* The daemon's reason, or why it did not answer, with the daemon it was (cut to fit). */
                snprintf(why, sizeof(why), "%s", c->error);
                n = (size_t) snprintf(c->error, sizeof(c->error), "gpupoold at %s: ", path);
                if (n < sizeof(c->error)) {
                        len = strlen(why);
                        if (len > sizeof(c->error) - 1 - n)
                                len = sizeof(c->error) - 1 - n;
                        memcpy(c->error + n, why, len);
                        c->error[n + len] = '\0';
                }
                gp_conn_close(c);
                return r;
        }
        if (ret_hello)
                *ret_hello = rep;
        else
                gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

void gp_conn_close(struct gp_conn *c) {
        if (c->sock >= 0)
                close(c->sock);
        c->sock = -1;
}

void gp_conn_give_up(struct gp_conn *c, int r) {
        gp_conn_close(c);
        (void) break_with(c, r);
}
