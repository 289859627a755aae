/*
 * policy.h: who may have how much. The pool asks nothing; the session asks policy how many
 * more bytes a client may reserve on a device and passes that to pool_alloc() as headroom.
 * Today that is the per-client limit; tenants' limits and guarantees join here later.
 */
#ifndef GP_POLICY_H
#define GP_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

struct policy {
        uint64_t client_limit_bytes;    /* per client and device; 0: none */
        unsigned max_blocks;            /* live blocks per client and device */
};

/* How many more bytes owner may reserve: UINT64_MAX when unlimited. */
uint64_t policy_headroom(const struct policy *policy, const struct pool_owner *owner);

/*
 * Whether owner may allocate another block of size bytes at all. Returns 0, or -EDQUOT with
 * the reason in why.
 */
int policy_admit(const struct policy *policy, const struct pool_owner *owner, uint64_t size,
                 char *why, size_t why_size);

#endif
