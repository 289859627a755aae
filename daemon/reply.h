/*
 * reply.h: a reply to a client, packed and owning its bytes. Below the sessions (which send
 * replies) and the requests (which make them): it knows the wire format and nothing else.
 */
#ifndef GP_REPLY_H
#define GP_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/*
 * A reply packed into the reply itself when it fits: every reply but a status of many
 * clients, the metrics or a hello of many devices (an error's sentence is less than
 * GP_MAX_ERROR_BYTES).
 * Larger ones go into memory the reply owns.
 */
#define REPLY_INLINE_BYTES 1024

/*
 * The descriptors to pass with a reply: those of segments of device leased to the client, in
 * order. The session looks each up as it sends, so that one the client returned on its control
 * channel while the reply waited is never sent.
 */
struct pool_owner;
struct object;

struct reply_fds {
        unsigned n;
        uint32_t device;
        const struct pool_owner *owner;         /* whose segments they are: NULL, the session's; else a named object's */
        bool read_only;                         /* each opened anew for reading only (a named object's) */
        /*
         * What a reply refused instead undoes (session.c, where others' unread descriptors hold
         * it too long): the request it answers, and the object it attaches (NULL: the
         * segments are a lease, given back).
         */
        uint64_t request_id;
        struct object *object;
        uint64_t segments[GP_MAX_LEASE_GRANULES];
};

/*
 * A reply owns its bytes: nothing else holds them, so it may wait (a socket that is full)
 * while the daemon answers others. session_send() takes it; reply_release() frees one that is
 * not sent.
 */
struct reply {
        uint8_t *heap;          /* the packed reply when larger than inline_bytes, else NULL */
        size_t len;
        struct reply_fds fds;   /* n 0: none */
        bool disconnect;        /* drop the client after sending */
        bool none;              /* nothing to send: the message was an answer, not a request */
        bool parked;            /* no reply yet: the request waits (session_park()) */
        bool held;              /* no reply yet: its work runs off the loop (session_hold()) */
        uint8_t inline_bytes[REPLY_INLINE_BYTES];
};

/* The packed reply. */
static inline const uint8_t *reply_bytes(const struct reply *rep) {
        return rep->heap ? rep->heap : rep->inline_bytes;
}

/* Frees what a reply owns (it is not sent). */
void reply_release(struct reply *rep);

/*
 * Packs env as the reply (with no descriptor: the caller sets them) into *ret. Returns 0, or
 * -EIO where *ret became an error reply instead (no memory for it, or too large).
 */
int reply_pack(Gpupool__Envelope *env, bool disconnect, struct reply *ret);

/* Initializes env as a successful reply to request id. */
void reply_ok(Gpupool__Envelope *env, uint64_t id);

/* Packs an error reply for request id (0 when unknown) into *ret. */
void reply_error(uint64_t id, int err, bool disconnect, const char *message, struct reply *ret);

#endif
