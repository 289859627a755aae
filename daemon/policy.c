/*
 * policy.c: clients' and tenants' limits, tenants' guarantees, whom to ask for memory, and the
 * pool's rules (see policy.h). No I/O.
 */
#include "policy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "size.h"

void policy_configure(struct policy *p, const struct config *c) {
        /* Sums and counts start at zero: the caller maps every client to its tenant again. */
        p->client_limit_bytes = c->options.client_limit_bytes;
        p->max_cached_bytes = c->options.max_cached_bytes;
        p->max_cached_percent = c->options.max_cached_percent;
        p->tenant_count = p->config_tenant_count = c->tenant_count;
        for (unsigned i = 0; i < c->tenant_count; i++) {
                struct tenant *t = &p->tenants[i];

                memset(t, 0, sizeof(*t));
                t->conf = c->tenants[i];
                t->max_bytes = t->conf.max_bytes;
                t->guarantee_bytes = t->conf.guarantee_bytes;
        }
}

void policy_reserve(struct policy *p, const struct reservations *rs) {
        p->tenant_count = p->config_tenant_count;
        for (unsigned i = 0; i < rs->count; i++) {
                const struct reservation *r = &rs->r[i];
                struct tenant *t = &p->tenants[p->tenant_count];

                if (r->absent)
                        continue;
                p->tenant_count++;
                memset(t, 0, sizeof(*t));
                snprintf(t->conf.name, sizeof(t->conf.name), "%s", r->key);
                snprintf(t->conf.where, sizeof(t->conf.where), "reservation %s", r->key);
                t->conf.device_set = true;
                t->conf.device = r->device;
                t->conf.max_bytes = t->max_bytes = r->limit_bytes;
                t->conf.guarantee_bytes = t->guarantee_bytes = r->guarantee_bytes;
                t->reservation = r;
        }
}

_Static_assert(RESERVATION_KEY_MAX < sizeof(((struct tenant_conf *) 0)->name), "a reservation's key is its tenant's name");

_Static_assert(CONFIG_MAX_DEVICES == BACKEND_MAX_DEVICES, "a tenant's device = is any device the daemon may have");

int policy_check_guarantees(const struct policy *p, char *why, size_t why_size) {
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];

        for (unsigned i = 0; i < p->tenant_count; i++) {
                const struct tenant_conf *c = &p->tenants[i].conf;

                if (c->device_set && c->device >= p->device_count) {
                        snprintf(why, why_size, "%s %s is for device %u, and the daemon has %u device%s (0 to %u)",
                                 p->tenants[i].reservation ? "reservation" : "tenant", c->name, c->device, p->device_count,
                                 p->device_count == 1 ? "" : "s", p->device_count - 1);
                        return -EINVAL;
                }
                /* A reservation's key is its tenant's name: the config's tenants may not take it. */
                for (unsigned j = 0; p->tenants[i].reservation && j < p->config_tenant_count; j++)
                        if (strcmp(p->tenants[j].conf.name, c->name) == 0) {
                                snprintf(why, why_size, "tenant %s (%s) has the key of a reservation: rename the tenant, or "
                                         "delete the reservation", c->name, p->tenants[j].conf.where);
                                return -EINVAL;
                        }
        }
        for (unsigned d = 0; d < p->device_count; d++) {
                uint64_t sum = 0, reserved = 0;

                for (unsigned i = 0; i < p->tenant_count; i++) {
                        sum += tenant_guarantee(&p->tenants[i], d);
                        if (p->tenants[i].reservation)
                                reserved += tenant_guarantee(&p->tenants[i], d);
                }
                if (sum > p->capacity_bytes[d]) {
                        char of_it[GP_SIZE_FORMAT_MAX + 40] = "";

                        if (reserved)
                                snprintf(of_it, sizeof(of_it), " (%s of it reservations')", gp_size_format(reserved, b1, sizeof(b1)));
                        snprintf(why, why_size, "the tenants' guarantees on device %u add up to %s%s, more than its capacity "
                                 "of %s", d, gp_size_format(sum, b1, sizeof(b1)), of_it,
                                 gp_size_format(p->capacity_bytes[d], b2, sizeof(b2)));
                        return -EINVAL;
                }
        }
        return 0;
}

struct tenant *policy_tenant_for(struct policy *p, uint32_t uid, uint32_t gid, const char *name, const char *cgroup,
                                 const char *pod_uid) {
        if (pod_uid && *pod_uid)
                for (unsigned i = p->config_tenant_count; i < p->tenant_count; i++)
                        for (unsigned j = 0; j < p->tenants[i].reservation->pod_count; j++)
                                if (strcmp(p->tenants[i].reservation->pods[j], pod_uid) == 0)
                                        return &p->tenants[i];
        for (unsigned i = 1; i < p->config_tenant_count; i++)
                if (tenant_conf_matches(&p->tenants[i].conf, uid, gid, name, cgroup))
                        return &p->tenants[i];
        return &p->tenants[0];
}

struct tenant *policy_tenant_by_name(struct policy *p, const char *name) {
        for (unsigned i = 0; i < p->tenant_count; i++)
                if (strcmp(p->tenants[i].conf.name, name) == 0)
                        return &p->tenants[i];
        return NULL;
}

int policy_set_tenant_limits(struct policy *p, struct tenant *t, uint64_t max_bytes, uint64_t guarantee_bytes, char *why,
                             size_t why_size) {
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];
        uint64_t old_guarantee = t->guarantee_bytes;

        if (max_bytes && guarantee_bytes > max_bytes) {
                snprintf(why, why_size, "tenant %s: a guarantee of %s is more than its max of %s", t->conf.name,
                         gp_size_format(guarantee_bytes, b1, sizeof(b1)), gp_size_format(max_bytes, b2, sizeof(b2)));
                return -EINVAL;
        }
        t->guarantee_bytes = guarantee_bytes;
        if (policy_check_guarantees(p, why, why_size) < 0) {
                t->guarantee_bytes = old_guarantee;
                return -EINVAL;
        }
        t->max_bytes = max_bytes;
        t->overridden = true;
        return 0;
}

/* A client's limit, and where it comes from in *ret_from. */
static uint64_t client_limit(const struct policy *p, const struct tenant *t, uint64_t override_bytes,
                             enum policy_limit_source *ret_from) {
        if (override_bytes != POLICY_NO_OVERRIDE) {
                *ret_from = POLICY_LIMIT_PID;
                return override_bytes;
        }
        if (t->conf.client_max_set) {
                *ret_from = POLICY_LIMIT_TENANT;
                return t->conf.client_max_bytes;
        }
        *ret_from = POLICY_LIMIT_DEFAULT;
        return p->client_limit_bytes;
}

uint64_t policy_client_limit(const struct policy *p, const struct tenant *t, uint64_t override_bytes) {
        enum policy_limit_source from;

        return client_limit(p, t, override_bytes, &from);
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

                uint64_t used = o->sums[device].reserved_bytes + o->charged_bytes[device];

                if (o != t && tenant_guarantee(o, device) > used)
                        held += tenant_guarantee(o, device) - used;
        }
        return held;
}

uint64_t policy_charged_bytes(const struct policy *p, unsigned device) {
        uint64_t charged = 0;

        for (unsigned i = 0; i < p->tenant_count; i++)
                charged += p->tenants[i].charged_bytes[device];
        return charged;
}

/* Makes limit (0: none) against used the admission's bound when it leaves less room than the bound so far. */
static void bound_by(struct policy_admission *a, enum policy_bound bound, uint64_t limit, uint64_t used) {
        uint64_t r = room(limit, used);

        if (r < a->headroom_bytes) {
                a->headroom_bytes = r;
                a->bound = bound;
                a->limit_bytes = limit;
                a->used_bytes = used;
        }
}

uint64_t policy_device_held(const struct policy *p, unsigned device, const struct pool_stats *st) {
        return st->reserved_bytes - st->cached_bytes + policy_charged_bytes(p, device);
}

uint64_t policy_device_room(const struct policy *p, const struct tenant *t, unsigned device, const struct pool_stats *st) {
        uint64_t used = policy_device_held(p, device, st) + policy_held_for_others(p, t, device);

        return st->total_bytes > used ? st->total_bytes - used : 0;
}

void policy_admit(const struct policy *p, const struct tenant *t, uint64_t override_bytes, uint64_t process_other_bytes,
                  uint64_t other_bytes, const struct pool_owner *owner, unsigned device, const struct pool_stats *st,
                  struct policy_admission *ret) {
        uint64_t held = policy_held_for_others(p, t, device);
        enum policy_limit_source from;
        uint64_t limit = client_limit(p, t, override_bytes, &from);

        *ret = (struct policy_admission) {
                .headroom_bytes = UINT64_MAX,
                .bound = POLICY_UNBOUND,
                .held_back_bytes = held,
                .client_limit_from = from,
        };
        if (!tenant_on(t, device)) {
                /* Its tenant's memory is on its one device: none here, whatever the limits. */
                ret->headroom_bytes = 0;
                ret->bound = POLICY_OTHER_DEVICE;
                return;
        }
        bound_by(ret, POLICY_CLIENT, limit,
                 owner->reserved_bytes + other_bytes + (from == POLICY_LIMIT_PID ? process_other_bytes : 0));
        bound_by(ret, POLICY_TENANT, t->max_bytes, t->sums[device].reserved_bytes + t->charged_bytes[device]);
        /*
         * What clients hold is theirs, leased or charged; what is cached can be released; the
         * rest, less what is held back, is ours.
         */
        if (held)
                bound_by(ret, POLICY_GUARANTEES, st->total_bytes, policy_device_held(p, device, st) + held);
}

static uint64_t excess(const struct tenant *t, unsigned device) {
        uint64_t r = t->sums[device].reserved_bytes;

        return r > tenant_guarantee(t, device) ? r - tenant_guarantee(t, device) : 0;
}

static int by_rank(const void *a, const void *b) {
        const struct policy_candidate *x = a, *y = b;

        if (!!x->excess_bytes != !!y->excess_bytes)
                return x->excess_bytes ? -1 : 1;
        if (x->held_free_bytes != y->held_free_bytes)
                return x->held_free_bytes > y->held_free_bytes ? -1 : 1;
        if (x->excess_bytes != y->excess_bytes)
                return x->excess_bytes > y->excess_bytes ? -1 : 1;
        return 0;
}

size_t policy_reclaim_order(const struct tenant *requester, unsigned device, struct policy_candidate *c, size_t n) {
        size_t kept = 0;

        for (size_t i = 0; i < n; i++) {
                c[i].excess_bytes = excess(c[i].tenant, device);
                if (c[i].excess_bytes || c[i].tenant == requester)
                        c[kept++] = c[i];
        }
        qsort(c, kept, sizeof(*c), by_rank);
        return kept;
}

enum policy_refusal policy_refusal_of(enum policy_bound bound) {
        return bound == POLICY_TENANT || bound == POLICY_OTHER_DEVICE ? POLICY_REFUSED_TENANT_LIMIT :
               bound == POLICY_GUARANTEES ? POLICY_REFUSED_GUARANTEES : POLICY_REFUSED_CLIENT_LIMIT;
}

uint64_t policy_segment_bytes(uint64_t rsize, uint64_t limit_bytes) {
        uint64_t want = heap_segment_bytes(rsize);

        return want <= limit_bytes ? want : heap_min_segment_bytes(rsize);
}

bool policy_cache_serves(uint64_t segment_bytes, uint64_t want_bytes) {
        return segment_bytes >= want_bytes && segment_bytes - want_bytes <= want_bytes / 4;
}

bool policy_object_evictable(uint64_t idle_objects_ms, uint64_t idle_since_ms, uint64_t now_ms) {
        return idle_objects_ms && now_ms >= idle_since_ms && now_ms - idle_since_ms >= idle_objects_ms;
}

bool policy_object_serves(const struct tenant *owner, const struct tenant *requester, unsigned device) {
        return !owner || owner == requester || excess(owner, device) > 0;
}

uint64_t policy_max_cached(const struct policy *p, unsigned device) {
        if (p->max_cached_percent)
                return p->capacity_bytes[device] * p->max_cached_percent / 100;   /* capacities are far below 2^64 / 100 */
        return p->max_cached_bytes;
}
