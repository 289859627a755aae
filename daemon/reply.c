/* reply.c: packing a reply into bytes of its own (see reply.h). */
#include "reply.h"

#include <errno.h>
#include <stdlib.h>

_Static_assert(GP_MAX_ERROR_BYTES + 64 <= REPLY_INLINE_BYTES, "an error reply fits a reply's own bytes");

void reply_release(struct reply *rep) {
        free(rep->heap);
        rep->heap = NULL;
}

/* Sets the reply's fields but its bytes. */
static void reply_set(struct reply *ret, size_t len, bool disconnect) {
        ret->len = len;
        ret->fds.n = 0;
        ret->fds.owner = NULL;
        ret->fds.read_only = false;
        ret->fds.request_id = 0;
        ret->fds.object = NULL;
        ret->disconnect = disconnect;
        ret->none = ret->parked = false;
}

int reply_pack(Gpupool__Envelope *env, bool disconnect, struct reply *ret) {
        /* One pass into the reply itself; only a larger reply is sized, then packed into memory of its own. */
        int n = gp_wire_pack(env, ret->inline_bytes, sizeof(ret->inline_bytes));
        size_t size;

        ret->heap = NULL;
        if (n == -EMSGSIZE && (size = gpupool__envelope__get_packed_size(env)) <= GP_MAX_REPLY_BYTES) {
                ret->heap = malloc(size);
                if (!ret->heap) {
                        reply_error(env->id, -EIO, false, "the daemon is out of memory for the reply", ret);
                        return -EIO;
                }
                n = gp_wire_pack(env, ret->heap, size);
        }
        if (n < 0) {
                /* Only a status of very many clients could get here; say so rather than truncate. */
                reply_release(ret);
                reply_error(env->id, -EIO, false, "the reply is larger than the protocol allows", ret);
                return -EIO;
        }
        reply_set(ret, (size_t) n, disconnect);
        return 0;
}

void reply_error(uint64_t id, int err, bool disconnect, const char *message, struct reply *ret) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        int n;

        env.version = GP_PROTOCOL_VERSION;
        env.id = id;
        env.has_status = 1;
        env.status = gp_errno_to_status(err);
        env.error = (char *) message;
        ret->heap = NULL;
        n = gp_wire_pack(&env, ret->inline_bytes, sizeof(ret->inline_bytes));
        /* An error reply is a few hundred bytes at most: it always fits. */
        reply_set(ret, n > 0 ? (size_t) n : 0, disconnect);
}

void reply_ok(Gpupool__Envelope *env, uint64_t id) {
        gpupool__envelope__init(env);
        env->version = GP_PROTOCOL_VERSION;
        env->id = id;
        env->has_status = 1;
        env->status = GPUPOOL__STATUS__STATUS_OK;
}
