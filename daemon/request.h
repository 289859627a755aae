/*
 * request.h: what the daemon does with each request: one handler per message kind, each
 * turning a checked request into a packed reply. A table of the kinds (request.c) says who
 * may send each (operators only, control channels only, or never them, and what an
 * operator's connection past the limits may ask); request_handle() checks that in one place,
 * before the handler.
 */
#ifndef GP_REQUEST_H
#define GP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

struct session;

/*
 * A reply packed into the reply itself when it fits: every reply but a status of many
 * clients, the metrics or a hello of many devices (an error's sentence is less than
 * GP_MAX_ERROR_BYTES).
 * Larger ones go into memory the reply owns.
 */
#define REPLY_INLINE_BYTES 1024

/*
 * A reply owns its bytes: nothing else holds them, so it may wait (a socket that is full)
 * while the daemon answers others. session_send() takes it; reply_release() frees one that is
 * not sent.
 */
struct reply {
        uint8_t *heap;          /* the packed reply when larger than inline_bytes, else NULL */
        size_t len;
        int fd;                 /* descriptor to pass with it, or -1 */
        bool disconnect;        /* drop the client after sending */
        bool none;              /* nothing to send: the message was an answer, not a request */
        bool parked;            /* no reply yet: the request waits (session_park()) */
        uint8_t inline_bytes[REPLY_INLINE_BYTES];
};

/* The packed reply. */
static inline const uint8_t *reply_bytes(const struct reply *rep) {
        return rep->heap ? rep->heap : rep->inline_bytes;
}

/* Frees what a reply owns (it is not sent). */
void reply_release(struct reply *rep);

struct server;

/* The most segments one ReturnRequest names. */
#define REQUEST_MAX_RETURNS 256

/* Handles one request of session; fills *ret: a reply, or none, or parked. */
void request_handle(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/*
 * Tries the parked allocations again (memory came back, or their time is up: then they fail
 * for good, saying what was tried). Returns the earliest deadline left (loop clock, ms), or
 * UINT64_MAX with none parked.
 */
uint64_t request_retry_parked(struct server *server, uint64_t now_ms);

/* Packs env as the reply (with fd, or -1) into *ret. */
void request_pack(Gpupool__Envelope *env, int fd, bool disconnect, struct reply *ret);

/* Initializes env as a successful reply to request id. */
void request_ok(Gpupool__Envelope *env, uint64_t id);

/* The operators' requests (request_admin.c). */
void request_status(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_flush(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_set_limit(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_trim(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_check(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_metrics(struct session *session, const Gpupool__Envelope *req, struct reply *ret);
void request_reload(struct session *session, const Gpupool__Envelope *req, struct reply *ret);

/* Packs an error reply for request id (0 when unknown) into *ret. */
void request_error_reply(uint64_t id, int err, bool disconnect, const char *message, struct reply *ret);

#endif
