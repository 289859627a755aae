/*
 * policy.h: who may have how much, and whom to ask for memory back. No I/O: every decision
 * here is a function of its arguments (tests/unit/check_policy.c). The request layer asks
 * policy how many more bytes a client may reserve on a device (policy_admit()), passes that to
 * pool_lease() as headroom and, when the pool refuses, turns policy's answer (the limit that
 * bound and the numbers it met) into the sentence and the refusal's reason
 * (policy_refusal_of()). When the device is full, policy ranks the clients worth asking to give
 * back what they keep free (policy_reclaim_order()); it sets the cache's watermark, checks and
 * applies runtime limits (policy_set_tenant_limits()), and makes the pool's rules below.
 *
 * Three limits bind, per device: the client's own (its tenant's client_max, else [limits]
 * client_max / --client-limit, or a runtime set-limit on its pid), its tenant's max over all
 * the tenant's clients, and the guarantees of the other tenants: memory a tenant is
 * guaranteed and does not use is held back from everyone else.
 *
 * A tenant's reserved bytes on a device are a pool group (pool.h): the pool keeps the sum as
 * the tenant's clients lease and return; node_check() recomputes it from the sessions (session_check_tenants()).
 */
#ifndef GP_POLICY_H
#define GP_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "pool.h"
#include "reservations.h"

/* The config's tenants, then a tenant per reservation (policy_reserve()). */
#define POLICY_MAX_TENANTS (CONFIG_MAX_TENANTS + RESERVATIONS_MAX)

struct tenant {
        struct tenant_conf conf;        /* its rules and its limits as the config file says */
        uint64_t max_bytes;             /* in force: the file's, or a runtime set-limit's */
        uint64_t guarantee_bytes;
        bool overridden;                /* set-limit changed it; a reload restores the file's */
        struct pool_group sums[BACKEND_MAX_DEVICES];    /* its clients' reserved bytes, kept by the pool */
        /* What its clients charged of memory outside the pool (ChargeRequest), kept by the sessions. */
        uint64_t charged_bytes[BACKEND_MAX_DEVICES];
        unsigned clients;
        /* A reservation's tenant: the reservation (the node's table); NULL for the config's. */
        const struct reservation *reservation;
};

enum policy_bound {
        POLICY_UNBOUND,
        POLICY_CLIENT,                  /* the client's limit */
        POLICY_TENANT,                  /* its tenant's max */
        POLICY_GUARANTEES,              /* other tenants' unused guarantees */
        POLICY_OTHER_DEVICE,            /* its tenant holds memory on another device only (device =) */
};

/* Why a lease was refused: the label values of gpupool_refusals_total, in this order. */
enum policy_refusal {
        POLICY_REFUSED_CLIENT_LIMIT,    /* "client_limit": over the client's limit */
        POLICY_REFUSED_TENANT_LIMIT,    /* "tenant_limit": over its tenant's max */
        POLICY_REFUSED_GUARANTEES,      /* "guarantees": held back for other tenants' guarantees */
        POLICY_REFUSED_DEVICE_FULL,     /* "device_full": no memory left after the eviction ladder */
        POLICY_REFUSED_BACKEND_ERROR,   /* "backend_error": the backend failed */
        POLICY_REFUSED_UNREAD,          /* "unread_budget": others' unread descriptors held its reply past send_timeout */
        POLICY_REFUSAL_COUNT,
};

/* Where a client's limit comes from. */
enum policy_limit_source {
        POLICY_LIMIT_DEFAULT,           /* [limits] client_max, --client-limit */
        POLICY_LIMIT_TENANT,            /* its tenant's client_max */
        POLICY_LIMIT_PID,               /* set-limit --pid */
};

/*
 * Policy's answer to a lease: how many more bytes the client may reserve on the device, the
 * limit that gives that answer and what it met, so that a refusal can say all of it.
 */
struct policy_admission {
        uint64_t headroom_bytes;        /* UINT64_MAX: nothing binds */
        enum policy_bound bound;
        /* POLICY_CLIENT: the client's limit; POLICY_TENANT: the tenant's max; POLICY_GUARANTEES: the capacity. */
        uint64_t limit_bytes;
        /* What counts against it: the client's or the tenant's reserved bytes, or what all clients hold. */
        uint64_t used_bytes;
        uint64_t held_back_bytes;       /* POLICY_GUARANTEES: held for the other tenants' unused guarantees */
        enum policy_limit_source client_limit_from;
};

/* A client that may be asked to give memory back (policy_reclaim_order()). */
struct policy_candidate {
        const struct tenant *tenant;
        uint64_t held_free_bytes;       /* what it last reported it keeps free on the device */
        void *client;                   /* the caller's */
        uint64_t excess_bytes;          /* set by policy: how far its tenant is over its guarantee */
};

struct policy {
        uint64_t client_limit_bytes;    /* [limits] client_max: per client and device; 0: none */
        uint64_t max_cached_bytes;      /* the cache's watermark: max_cached */
        unsigned max_cached_percent;    /* or a share of each device's capacity; 0: max_cached_bytes */
        unsigned device_count;
        uint64_t capacity_bytes[BACKEND_MAX_DEVICES];
        unsigned tenant_count;          /* tenants[0] is "default" */
        unsigned config_tenant_count;   /* the config's, first; the reservations' after them */
        struct tenant tenants[POLICY_MAX_TENANTS];
};

/* Whether tenant t's clients may hold memory on device: every device, or its one (device =). */
static inline bool tenant_on(const struct tenant *t, unsigned device) {
        return !t->conf.device_set || t->conf.device == device;
}

/* Tenant t's guarantee on device: none where it holds nothing. */
static inline uint64_t tenant_guarantee(const struct tenant *t, unsigned device) {
        return tenant_on(t, device) ? t->guarantee_bytes : 0;
}

/*
 * Sets limits and tenants from a loaded config (a start, or a reload: runtime overrides go).
 * The reservations' tenants go too: policy_reserve() makes them again.
 */
void policy_configure(struct policy *p, const struct config *c);

/*
 * Makes a tenant of each reservation of rs whose GPU is there (not absent), after the config's,
 * in place of those it had: for
 * the reservation's pods, on its device only, its limit the tenant's max and its guarantee the
 * tenant's. rs must outlive them. As policy_configure(), their sums start at zero: the caller
 * maps every client to its tenant again. Check the guarantees after (policy_check_guarantees()).
 */
void policy_reserve(struct policy *p, const struct reservations *rs);

/*
 * Whether the tenants' guarantees fit every device, each tenant of one device names one the
 * daemon has, and no tenant of the config has a reservation's key. Returns 0, or -EINVAL
 * saying which does not.
 */
int policy_check_guarantees(const struct policy *p, char *why, size_t why_size);

/*
 * The tenant a client of uid, gid, declared name, cgroup (NULL: unknown) and pod (its UID, as
 * its cgroup names it; NULL or "": in no pod) belongs to: its pod's reservation, else the first
 * of the config's tenants that matches, else default.
 */
struct tenant *policy_tenant_for(struct policy *p, uint32_t uid, uint32_t gid, const char *name, const char *cgroup,
                                 const char *pod_uid);

/* The tenant called name, or NULL. */
struct tenant *policy_tenant_by_name(struct policy *p, const char *name);

/*
 * A runtime set-limit of tenant t: its max (0: none) and guarantee, until the next reload.
 * Refused, nothing changed, where the guarantee is more than the max or the guarantees would
 * no longer fit every device. Returns 0, or -EINVAL with why.
 */
int policy_set_tenant_limits(struct policy *p, struct tenant *t, uint64_t max_bytes, uint64_t guarantee_bytes, char *why,
                             size_t why_size);

/* No runtime override of a client's limit (set-limit --pid sets one; its 0 is "no limit"). */
#define POLICY_NO_OVERRIDE UINT64_MAX

/*
 * A client's limit on each device: its runtime override (POLICY_NO_OVERRIDE for none), else
 * its tenant's client_max, else the default. 0: none.
 */
uint64_t policy_client_limit(const struct policy *p, const struct tenant *t, uint64_t override_bytes);

/*
 * How many more bytes owner (of tenant t, with a set-limit override_bytes or
 * POLICY_NO_OVERRIDE) may reserve on device, given the device's stats; *ret says which limit
 * gave the answer and what it met. A set-limit --pid bounds the process, not the connection:
 * process_other_bytes, what its other connections reserve on device, counts against it too.
 * other_bytes counts against the client's limit whichever it is: what the named objects its
 * principal published hold on device (a publish moves a segment out of the client's lease, not
 * out of what it holds), and what it charged of memory outside the pool. The tenant's charges
 * count against its max.
 */
void policy_admit(const struct policy *p, const struct tenant *t, uint64_t override_bytes, uint64_t process_other_bytes,
                  uint64_t other_bytes, const struct pool_owner *owner, unsigned device, const struct pool_stats *st,
                  struct policy_admission *ret);

/*
 * Of the n candidates, keeps those whose memory would serve a client of tenant requester on
 * device (a tenant under its guarantee keeps what it holds back for itself: only its own
 * clients gain from what it gives), ranked: tenants over their guarantee first, then largest
 * reported free first, then largest excess. Returns how many it kept, at the front.
 */
size_t policy_reclaim_order(const struct tenant *requester, unsigned device, struct policy_candidate *c, size_t n);

/* The reason a lease refused for going past bound (never POLICY_UNBOUND) is counted under. */
enum policy_refusal policy_refusal_of(enum policy_bound bound);

/*
 * The pool's rules, which pool.c applies on its trees:
 *
 *   size fallback  a request gets its class's segment (heap_segment_bytes(): 2 MiB up to 1 MiB,
 *                  20 MiB up to 10 MiB, its own rounded size above) where that fits limit_bytes
 *                  (the client's headroom, the capacity and the device's room left), else the
 *                  smallest segment that serves it: policy_segment_bytes().
 *   reuse          a cached segment serves a segment of want bytes if it is want to a quarter
 *                  more (policy_cache_serves()): the smallest such, the most recently cached
 *                  among equals, before any new one is made.
 *   eviction       cached segments go back to the backend least recently cached first (LRU),
 *                  to make room for a new segment, past the watermark (policy_max_cached()),
 *                  once idle for idle_release, and when others take part of the headroom.
 */
uint64_t policy_segment_bytes(uint64_t rsize, uint64_t limit_bytes);
bool policy_cache_serves(uint64_t segment_bytes, uint64_t want_bytes);

/*
 * Whether a named object nobody has attached since idle_since_ms may be evicted at now_ms
 * under idle_objects_ms (0: never): after the cache, before other clients are asked.
 */
bool policy_object_evictable(uint64_t idle_objects_ms, uint64_t idle_since_ms, uint64_t now_ms);

/*
 * Whether an object of tenant owner on device may be evicted for a lease of tenant requester:
 * as with reclaim (policy_reclaim_order()), what a tenant under its guarantee holds serves only
 * its own clients, so its objects go only for them.
 */
bool policy_object_serves(const struct tenant *owner, const struct tenant *requester, unsigned device);

/* The most bytes device's cache may hold (the watermark). */
uint64_t policy_max_cached(const struct policy *p, unsigned device);

/*
 * Bytes of device held back from tenant t for the other tenants' unused guarantees (what a
 * tenant leases and charges uses its guarantee).
 */
uint64_t policy_held_for_others(const struct policy *p, const struct tenant *t, unsigned device);

/* What clients hold on device: leased (the cache can be released) or charged. */
uint64_t policy_device_held(const struct policy *p, unsigned device, const struct pool_stats *st);

/*
 * What a client of tenant t could lease on device now, the device's side of it: its capacity
 * less what clients hold (leased or charged; the cache can be released) and what is held back
 * for the other tenants' unused guarantees. The limits are policy_admit()'s.
 */
uint64_t policy_device_room(const struct policy *p, const struct tenant *t, unsigned device, const struct pool_stats *st);

/*
 * What every tenant's clients have charged on device: memory the driver made for them outside
 * the pool (gpupool-run's cuMemCreate, PyTorch's expandable segments), which the device holds
 * as it holds a lease of as many bytes, and which counts wherever such a lease would.
 */
uint64_t policy_charged_bytes(const struct policy *p, unsigned device);


#endif
