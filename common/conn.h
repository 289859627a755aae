/*
 * conn.h: a client's connection to gpupoold: connect and hello, then requests and their
 * replies on a blocking socket, one at a time or several sent before their replies are read. Both libgpupool and gpupoolctl talk through this, so
 * refusals, resets and malformed replies are handled the same way in both.
 */
#ifndef GP_CONN_H
#define GP_CONN_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

/* How long a request waits for its reply by default ($GPUPOOL_TIMEOUT overrides; 0: forever). */
#define GP_CONN_DEFAULT_TIMEOUT_MS 30000

struct gp_conn {
        int sock;                       /* -1 when not connected */
        uint64_t timeout_ms;            /* per send and per reply; 0: none */
        bool broken;                    /* the daemon is gone or spoke nonsense; written atomically (read unlocked) */
        int broke_with;                 /* while broken: the errno that broke it (-ECONNRESET: the daemon closed it) */
        uint64_t next_id;
        uint64_t unanswered;            /* requests sent whose replies are not read yet */
        int send_failed;                /* a send the daemon's end refused (-EPIPE): read on for why */
        uint64_t calls;                 /* requests sent, hello included, for as long as the struct lives */
        uint64_t trips;                 /* round trips: requests sent while none was unanswered */
        char error[GP_MAX_ERROR_BYTES]; /* why the latest call failed */
        uint8_t buf[GP_MAX_REPLY_BYTES];
};

/*
 * Connects to path (see gp_wire_socket_path()) and says hello (its name, and what else the
 * caller set). Every later send and reply waits at most $GPUPOOL_TIMEOUT (a duration; default
 * 30s; 0: forever). Returns 0 with the hello reply in *ret_hello (NULL to drop it), or a
 * negative errno with error set: connect(2)'s error, -ETIMEDOUT, -EINVAL for a
 * $GPUPOOL_TIMEOUT that is not a duration, or the daemon's refusal (-EDQUOT over
 * --max-clients). c is closed on failure.
 */
int gp_conn_open(struct gp_conn *c, const char *path, const Gpupool__Hello *hello, Gpupool__Envelope **ret_hello);

/*
 * Sends req and waits for its reply, which must carry body want (NOT_SET: a status only).
 * Returns 0 with the reply (free it with gpupool__envelope__free_unpacked()) and, when ret_fd
 * is given, the descriptor it carried or -1. On failure returns the errno of the daemon's
 * status, -EPROTO for a reply that cannot be read, -ETIMEDOUT when the daemon did not answer
 * within the timeout (stopped, or hung), or -ECONNRESET when it is gone; error says why. The
 * last three make the connection unusable: a late reply could otherwise answer a later request.
 */
int gp_conn_call(struct gp_conn *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                 Gpupool__Envelope **ret_reply, int *ret_fd);

/*
 * The same for a reply that may carry up to max_fds descriptors (a granule lease): they go
 * into fds, *ret_nfds says how many. A reply with more is a protocol error (all are closed).
 */
int gp_conn_call_fds(struct gp_conn *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                     Gpupool__Envelope **ret_reply, int *fds, size_t max_fds, size_t *ret_nfds);

/* A call whose request carries nfds descriptors (an adoption's; still the caller's after), to a reply that carries none. */
int gp_conn_call_passing(struct gp_conn *c, Gpupool__Envelope *req, const int *fds, size_t nfds,
                         Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply);

/*
 * Requests sent back to back, their replies read afterwards (in the order the requests went,
 * as the protocol answers them), so that several cost one round trip: gp_conn_send() sends
 * one, gp_conn_reply_fds() reads the reply to the oldest not yet read, with the results of
 * gp_conn_call_fds(). Every reply is read before the next gp_conn_call*(). The caller keeps
 * few enough unanswered that the daemon's replies fit the socket while it sends (a few dozen
 * packets): past that both ends would wait on each other until the timeout.
 */
int gp_conn_send(struct gp_conn *c, Gpupool__Envelope *req);
int gp_conn_reply_fds(struct gp_conn *c, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply, int *fds,
                      size_t max_fds, size_t *ret_nfds);

/* Closes the socket. Safe to call twice. */
void gp_conn_close(struct gp_conn *c);

/* Closes the socket and marks c broken by errno r (-ECONNRESET: as if the daemon had closed it). */
void gp_conn_give_up(struct gp_conn *c, int r);

#endif
