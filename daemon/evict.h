/*
 * evict.h: the eviction ladder (evict.c), the one place that says where memory for a lease
 * comes from and in what order, and what keeps each device's headroom free. The request layer
 * calls it and turns its outcome into the reply (request_lease.c); the node's headroom timer
 * reaches it through its hook.
 */
#ifndef GP_EVICT_H
#define GP_EVICT_H

#include <stdbool.h>
#include <stdint.h>

#include "policy.h"
#include "pool.h"
#include "wire.h"

struct node;
struct session;

/*
 * One lease going down the ladder, and where it stands while it waits (parked). The request
 * layer keeps it with its session (session->lease) from the request to the reply.
 */
struct evict_lease {
        uint64_t id;                    /* the request's */
        uint32_t device;
        uint64_t size;                  /* a segment for size bytes, or the granules' bytes */
        unsigned granules;              /* a granule lease's count, or 0 */
        unsigned ahead;                 /* and how many more it would take where they fit at once */
        bool exact;                     /* a segment of the size rounded to 2 MiB, not a larger one from the cache */
        /* While it waits: */
        uint64_t deadline_ms;           /* on the loop's clock: then it is tried a last time */
        uint64_t round;                 /* names it to the clients asked for it (node->reclaim_rounds) */
        uint64_t ask_more_ms;           /* when it asks the next clients if those asked have not given enough */
        uint64_t asked_bytes;           /* what the clients asked for it said they held free, as far as trusted */
        unsigned asked_clients;
        bool zeroing;                   /* it waits for a segment being zeroed for it, not for clients */
        uint64_t zero_seq;              /* node->zeroings_ended when it last tried */
};

/* Which try at a lease. */
enum evict_attempt {
        EVICT_FIRST,            /* a new request: it may wait while others are asked for memory */
        EVICT_RETRY,            /* waiting, and memory came back: still short, it waits on */
        EVICT_FINAL,            /* waiting, and its time is up */
};

/* Where a try ended. */
enum evict_outcome {
        EVICT_LEASED,           /* result->count segments in result->leases (0: granules ahead only, none fitted) */
        EVICT_OVER_LIMIT,       /* a limit refuses it: result->admission says which, and what it met */
        EVICT_NEVER_FITS,       /* more than the device holds in all: nobody is asked */
        EVICT_WAITS,            /* it waits (lease->deadline_ms): for clients asked for memory, or for a zeroing */
        EVICT_FULL,             /* nothing left on the ladder */
        EVICT_FAILED,           /* the backend failed (result->err; -EINPROGRESS: a zeroing that did not end in time) */
};

struct evict_result {
        struct policy_admission admission;      /* what the limits left the client, and which gave it */
        struct pool_stats stats;                /* the device's pool as the try found it */
        int err;
        unsigned count;
        struct pool_lease leases[GP_MAX_LEASE_GRANULES];
};

/*
 * What the limits leave client s on device (policy_admit()): its own, its process's (set-limit
 * --pid, over its other connections), its tenant's, and other tenants' unused guarantees held
 * back. The ladder's first question; adoption asks it too. st: the device's pool now.
 */
void evict_admit(struct session *s, unsigned device, const struct pool_stats *st, struct policy_admission *ret);

/* One try at lease l of session s, down the ladder in its order (evict.c). */
enum evict_outcome evict_lease(struct session *s, struct evict_lease *l, enum evict_attempt attempt,
                               struct evict_result *result);

/*
 * A waiting lease that still does not fit: once every client asked for it has answered (or was
 * written off) and gave back too little, or once half its time is gone with answers missing,
 * the clients not asked yet are asked too, within the same deadline. Returns whether it still
 * waits for someone; false: nobody is left to ask.
 */
bool evict_ask_more(struct session *s, struct evict_lease *l, uint64_t now_ms);

/*
 * Others took part of a device's headroom (a process started, a library allocated, a program
 * without gpupool runs): the cache goes back to the backend first, oldest first, and then
 * clients over their guarantee are asked for what they keep free. Every device; the node's
 * headroom timer, through its hook.
 */
void evict_keep_headroom(struct node *node);

#endif
