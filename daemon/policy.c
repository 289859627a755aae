/*
 * policy.c: limits on what one client may hold.
 */
#include "policy.h"

#include <errno.h>
#include <stdio.h>

uint64_t policy_headroom(const struct policy *policy, const struct pool_owner *owner) {
        if (!policy->client_limit_bytes)
                return UINT64_MAX;
        if (owner->reserved_bytes >= policy->client_limit_bytes)
                return 0;
        return policy->client_limit_bytes - owner->reserved_bytes;
}

int policy_admit(const struct policy *policy, const struct pool_owner *owner, uint64_t size,
                 char *why, size_t why_size) {
        (void) size;
        if (owner->blocks >= policy->max_blocks) {
                snprintf(why, why_size, "the client holds %llu live blocks, the most one client may hold (--max-blocks)",
                         (unsigned long long) owner->blocks);
                return -EDQUOT;
        }
        return 0;
}
