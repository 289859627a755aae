/*
 * evict.c: the eviction ladder. Where the memory for a lease comes from, in the order it is
 * tried, top to bottom in evict_lease(), numbered as docs/design.md ("When memory runs short")
 * numbers the steps:
 *
 *   0.  the limits: what the client, its process, its tenant and other tenants' unused
 *       guarantees leave it (evict_admit(), policy_admit()); over them, refused
 *   1.  a cached segment that serves (pool_lease(POOL_FROM_CACHE): policy_cache_serves())
 *   2a. a new segment in free capacity, within what the device has free beyond its headroom
 *       (POOL_FROM_FREE)
 *   2b. cached segments given back to the backend, least recently cached first, until a new
 *       one fits (POOL_FROM_EVICTION)
 *   2c. named objects nobody had attached for idle_objects, the idlest first
 *       (objects_evict_idle(): policy_object_evictable(), policy_object_serves()); then from 0
 *   3a. clients asked for the segments they keep free, in policy's order (reclaim_ask():
 *       policy_reclaim_order(), over their guarantee first), while the lease waits, parked,
 *       tried again from 0 whenever memory comes back
 *   3b. when those asked gave too little, or half its time is gone, the clients not asked yet
 *       (evict_ask_more())
 *   4.  nothing left: the request layer refuses it, saying whom it asked and who holds the device
 *
 * Memory a client is using is never taken. A segment being zeroed for the client (it last
 * belonged to another principal) makes the lease wait for the GPU instead, up to the same
 * deadline. The ladder decides nothing policy.c decides: it asks it, in order.
 *
 * The headroom's ladder (evict_keep_headroom()) is the same, shorter: the cache, then clients
 * over their guarantee.
 */
#include "evict.h"

#include <errno.h>
#include <inttypes.h>

#include "log.h"
#include "node.h"
#include "objects.h"
#include "reclaim.h"
#include "session.h"
#include "size.h"

/*
 * What the client's process reserves and charges on device through its other connections,
 * exiting ones included: a set-limit --pid is the process's limit. 0 without one (nothing to sum).
 */
static uint64_t process_others(const struct session *s, unsigned device) {
        uint64_t bytes = 0;

        if (s->limit_override_bytes == POLICY_NO_OVERRIDE)
                return 0;
        SESSION_FOREACH(c, s->node)
                if (c != s && c->pid == s->pid && c->owners)
                        bytes += c->owners[device].reserved_bytes + c->charged_bytes[device];
        return bytes;
}

void evict_admit(struct session *s, unsigned device, const struct pool_stats *st, struct policy_admission *ret) {
        struct node *node = s->node;

        policy_admit(&node->policy, s->tenant, s->limit_override_bytes, process_others(s, device),
                     objects_principal_bytes(node, s->principal, device) + s->charged_bytes[device], &s->owners[device],
                     device, st, ret);
}

/* Steps 1 to 2b, in one device's pool: a segment for size bytes, within headroom bytes. */
static int from_pool(struct pool *p, struct pool_owner *o, uint64_t size, uint64_t headroom, struct pool_lease *ret) {
        /* 1. A cached segment that serves (zeroed first if it last held another principal's data). */
        int r = pool_lease(p, o, POOL_FROM_CACHE, size, headroom, ret);

        /* 2a. Free capacity, and what the GPU has free beyond the headroom. */
        if (r == -ENOENT)
                r = pool_lease(p, o, POOL_FROM_FREE, size, headroom, ret);
        /* 2b. The cache given back to the backend, least recently cached first, until a new segment fits. */
        if (r == -ENOENT)
                r = pool_lease(p, o, POOL_FROM_EVICTION, size, headroom, ret);
        return r;
}

/*
 * Whether a lease of another session waits on device for memory that clients were asked to
 * give back: what comes back is for it, so no one is given granules ahead meanwhile (they
 * would take it, and the waiting lease would wait on, or fail, for memory nobody needed).
 */
static bool others_wait_for_memory(const struct session *s, uint32_t device) {
        if (!s->node->parked)
                return false;
        SESSION_FOREACH(c, s->node)
                if (c != s && c->parked && c->lease->device == device && !c->lease->zeroing)
                        return true;
        return false;
}

/*
 * A granule lease's n segments, all of them or none (those leased before one failed go back
 * to the cache), then up to ahead more as long as each fits at once, into leases. Each may
 * take what is left of headroom once those before it are counted. Returns how many were
 * leased (n to n + ahead), or a negative errno.
 */
static int lease_granules(struct pool *p, struct pool_owner *o, unsigned n, unsigned ahead, uint64_t headroom,
                          struct pool_lease *leases) {
        unsigned i;

        /* A request of the small class takes a segment of exactly the granule, its class size and its least. */
        _Static_assert(HEAP_SMALL_SEGMENT == GP_GRANULE_BYTES, "a small request's segment is one granule");
        /* Over a limit as a whole: refused before any granule is made (the device's own room is found granule by granule). */
        if ((uint64_t) n * GP_GRANULE_BYTES > headroom)
                return -EDQUOT;
        for (i = 0; i < n + ahead; i++) {
                uint64_t taken = (uint64_t) i * GP_GRANULE_BYTES;
                int r = from_pool(p, o, HEAP_SMALL_REQUEST, headroom > taken ? headroom - taken : 0, &leases[i]);

                /* One asked ahead that does not fit, or is being zeroed (-EINPROGRESS; it goes to the cache), ends them. */
                if (r < 0 && i >= n)
                        break;
                if (r < 0) {
                        while (i--)
                                pool_lease_undo(p, o, leases[i].segment_id);
                        return r;
                }
        }
        return (int) i;
}

/*
 * Steps 1 to 2b for what l asks, within headroom bytes: a segment for its size, or its granules
 * (and up to its ahead more). Returns how many segments it leased (1 for a segment; 0 to
 * granules + ahead), or a negative errno: -EDQUOT over a limit, -ENOMEM when the device is
 * full, -EINPROGRESS when the segment is being zeroed for the client, another the backend's.
 */
static int from_device(struct session *s, const struct evict_lease *l, uint64_t headroom, struct pool_lease *leases) {
        struct pool *p = s->node->pools[l->device];
        unsigned ahead = l->ahead;
        int r;

        if (!l->granules && !ahead) {
                uint64_t least = heap_min_segment_bytes(heap_round(l->size));

                /* Exact: the headroom bounds what the cache may serve (and a new segment is that size already). */
                if (l->exact && headroom > least)
                        headroom = least;
                return (r = from_pool(p, &s->owners[l->device], l->size, headroom, &leases[0])) < 0 ? r : 1;
        }
        if (ahead && others_wait_for_memory(s, l->device))
                ahead = 0;
        return lease_granules(p, &s->owners[l->device], l->granules, ahead, headroom, leases);
}

/* l waits until now + reclaim_timeout, asked naming round; those asked have half the time to give back enough. */
static void wait_from_now(struct node *node, struct evict_lease *l, uint64_t round, uint64_t asked, unsigned clients) {
        uint64_t now = uv_now(node->loop), timeout = node->options->reclaim_timeout_ms;

        l->round = round;
        l->asked_bytes = asked;
        l->asked_clients = clients;
        l->deadline_ms = now + timeout;
        l->ask_more_ms = now + timeout / 2;
}

enum evict_outcome evict_lease(struct session *s, struct evict_lease *l, enum evict_attempt attempt,
                               struct evict_result *result) {
        struct node *node = s->node;
        uint64_t need = pool_min_segment_bytes(l->size), round, asked;
        unsigned clients = 0;
        int r;

        /* 0. The limits. */
        pool_get_stats(node->pools[l->device], &result->stats);
        evict_admit(s, l->device, &result->stats, &result->admission);
        /* 1 to 2b. The pool: its cache, free capacity, its cache given back. */
        l->zeroing = false;
        r = from_device(s, l, result->admission.headroom_bytes, result->leases);
        result->err = r < 0 ? r : 0;
        if (r >= 0) {
                result->count = (unsigned) r;
                return EVICT_LEASED;
        }
        if (r == -EDQUOT)
                return EVICT_OVER_LIMIT;
        if (r == -EINPROGRESS) {
                /*
                 * The segment is being zeroed for this client, on the GPU: wait for it, as for a
                 * reclaim, while the loop serves everyone else. Up to reclaim_timeout: a GPU
                 * that does not finish a memset in that time is stuck.
                 */
                l->zeroing = true;
                l->zero_seq = node->zeroings_ended;
                if (attempt == EVICT_FIRST) {
                        wait_from_now(node, l, ++node->reclaim_rounds, 0, 0);
                        session_log(s, LOG_LEVEL_DEBUG, "client %llu: lease of %" PRIu64 " bytes on device %u waits "
                                    "for a segment being zeroed", (unsigned long long) s->id, l->size, l->device);
                        return EVICT_WAITS;
                }
                return uv_now(node->loop) < l->deadline_ms ? EVICT_WAITS : EVICT_FAILED;
        }
        if (r != -ENOMEM)
                return EVICT_FAILED;
        /* More than the device holds in all (within the limits): nothing on the ladder can serve it. */
        if (need > result->stats.total_bytes)
                return EVICT_NEVER_FITS;
        /* Waiting, and memory came back but not enough: those asked may give more. */
        if (attempt == EVICT_RETRY)
                return EVICT_WAITS;
        /* 2c. Named objects nobody attached for idle_objects; then from 0 again. */
        if (objects_evict_idle(node, l->device, need, s->tenant))
                return evict_lease(s, l, attempt, result);
        /* 3a. Clients asked for what they keep free, in policy's order; the lease waits for them. */
        if (attempt == EVICT_FIRST) {
                round = ++node->reclaim_rounds;
                asked = reclaim_ask(node, s, l->device, need, round, &clients);
                if (clients) {
                        wait_from_now(node, l, round, asked, clients);
                        return EVICT_WAITS;
                }
        }
        /* 4. Nothing left. */
        return EVICT_FULL;
}

/* 3b. Those not asked yet, once those asked gave too little or half the time is gone. */
bool evict_ask_more(struct session *s, struct evict_lease *l, uint64_t now_ms) {
        struct node *node = s->node;
        bool pending = reclaim_pending_for(node, l->round);
        uint64_t asked;
        unsigned clients = 0;

        if (pending && now_ms < l->ask_more_ms)
                return true;
        asked = reclaim_ask(node, s, l->device, pool_min_segment_bytes(l->size), l->round, &clients);
        if (!clients) {
                /* Nobody left to ask: only an answer (which retries it) or the deadline moves it now. */
                l->ask_more_ms = UINT64_MAX;
                return pending;
        }
        /* Half of what is left again, and never now: the loop's timers would run it again at once. */
        l->ask_more_ms = now_ms + ((l->deadline_ms - now_ms) / 2 ?: 1);
        l->asked_bytes += asked;
        l->asked_clients += clients;
        session_log(s, LOG_LEVEL_DEBUG, "client %llu: those asked gave back too little %s: asked %u more",
                    (unsigned long long) s->id, pending ? "in time" : "of what they claimed", clients);
        return true;
}

void evict_keep_headroom(struct node *node) {
        char b[GP_SIZE_FORMAT_MAX], f[GP_SIZE_FORMAT_MAX], h[GP_SIZE_FORMAT_MAX];
        bool released = false;

        for (unsigned d = 0; d < node->device_count; d++) {
                /* The cache first, oldest first. */
                uint64_t short_bytes, bytes = pool_keep_headroom(node->pools[d], &short_bytes), grown;
                struct pool_stats st;

                /* Memory others held when the capacity was read, free again: the pool's to use (docs/design.md). */
                if ((grown = pool_follow_device(node->pools[d]))) {
                        pool_get_stats(node->pools[d], &st);
                        node->policy.capacity_bytes[d] = st.total_bytes;
                        log_info("device %u: capacity %s, %s more: memory others held when it was read (contexts of "
                                 "clients alive at a restart, programs that exited) is free again", d,
                                 gp_size_format(st.total_bytes, f, sizeof(f)), gp_size_format(grown, b, sizeof(b)));
                        released = true;
                }
                /* Still short with the cache empty: clients over their guarantee give back what they keep free. */
                if (short_bytes) {
                        unsigned clients;

                        (void) reclaim_ask(node, NULL, d, short_bytes, 0, &clients);
                }
                if (!bytes)
                        continue;
                released = true;
                pool_get_stats(node->pools[d], &st);
                log_info("device %u: released %s of cache: others had taken part of the %s headroom (%s free on the GPU now)",
                         d, gp_size_format(bytes, b, sizeof(b)), gp_size_format(st.headroom_bytes, h, sizeof(h)),
                         gp_size_format(st.gpu_free_bytes, f, sizeof(f)));
        }
        if (released)
                node_after_change(node);
}
