/*
 * policy.c: clients' and tenants' limits, and tenants' guarantees (see policy.h).
 */
#include "policy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "size.h"

void policy_configure(struct policy *p, const struct config *c) {
        /* Sums and counts start at zero: the caller maps every client to its tenant again. */
        p->client_limit_bytes = c->options.client_limit_bytes;
        p->tenant_count = c->tenant_count;
        for (unsigned i = 0; i < c->tenant_count; i++) {
                struct tenant *t = &p->tenants[i];

                memset(t, 0, sizeof(*t));
                t->conf = c->tenants[i];
                t->max_bytes = t->conf.max_bytes;
                t->guarantee_bytes = t->conf.guarantee_bytes;
        }
}

int policy_check_guarantees(const struct policy *p, char *why, size_t why_size) {
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];
        uint64_t sum = 0;

        for (unsigned i = 0; i < p->tenant_count; i++)
                sum += p->tenants[i].guarantee_bytes;
        for (unsigned d = 0; d < p->device_count; d++)
                if (sum > p->capacity_bytes[d]) {
                        snprintf(why, why_size, "the tenants' guarantees add up to %s, more than device %u's capacity of %s",
                                 gp_size_format(sum, b1, sizeof(b1)), d, gp_size_format(p->capacity_bytes[d], b2, sizeof(b2)));
                        return -EINVAL;
                }
        return 0;
}

struct tenant *policy_tenant_for(struct policy *p, uint32_t uid, uint32_t gid, const char *name) {
        for (unsigned i = 1; i < p->tenant_count; i++)
                if (tenant_conf_matches(&p->tenants[i].conf, uid, gid, name))
                        return &p->tenants[i];
        return &p->tenants[0];
}

struct tenant *policy_tenant_by_name(struct policy *p, const char *name) {
        for (unsigned i = 0; i < p->tenant_count; i++)
                if (strcmp(p->tenants[i].conf.name, name) == 0)
                        return &p->tenants[i];
        return NULL;
}

uint64_t policy_client_limit(const struct policy *p, const struct tenant *t, uint64_t override_bytes) {
        if (override_bytes != POLICY_NO_OVERRIDE)
                return override_bytes;
        if (t->conf.client_max_set)
                return t->conf.client_max_bytes;
        return p->client_limit_bytes;
}

static uint64_t room(uint64_t limit, uint64_t used) {
        if (!limit)
                return UINT64_MAX;
        return used >= limit ? 0 : limit - used;
}

uint64_t policy_held_for_others(const struct policy *p, const struct tenant *t, unsigned device) {
        uint64_t held = 0;

        for (unsigned i = 0; i < p->tenant_count; i++) {
                const struct tenant *o = &p->tenants[i];

                if (o != t && o->guarantee_bytes > o->reserved_bytes[device])
                        held += o->guarantee_bytes - o->reserved_bytes[device];
        }
        return held;
}

uint64_t policy_headroom(const struct policy *p, const struct tenant *t, uint64_t client_limit_bytes,
                         const struct pool_owner *owner, unsigned device, const struct pool_stats *st,
                         enum policy_bound *ret_bound) {
        uint64_t best = UINT64_MAX, r, held = policy_held_for_others(p, t, device);
        enum policy_bound bound = POLICY_UNBOUND;

        r = room(client_limit_bytes, owner->reserved_bytes);
        if (r < best) {
                best = r;
                bound = POLICY_CLIENT;
        }
        r = room(t->max_bytes, t->reserved_bytes[device]);
        if (r < best) {
                best = r;
                bound = POLICY_TENANT;
        }
        if (held) {
                /* What clients hold is theirs; what is cached can be released; the rest, less what is held back, is ours. */
                uint64_t clients = st->reserved_bytes - st->cached_bytes;

                r = room(st->total_bytes, clients + held);
                if (r < best) {
                        best = r;
                        bound = POLICY_GUARANTEES;
                }
        }
        *ret_bound = bound;
        return best;
}

void policy_account(struct policy *p, struct tenant *t, unsigned device, uint64_t before, uint64_t after) {
        (void) p;
        t->reserved_bytes[device] += after - before;    /* unsigned wrap does the subtraction */
}
