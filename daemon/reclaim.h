/*
 * reclaim.h: step 3 of the eviction ladder. A process keeps the segments it leases mapped
 * when they empty, so that its next allocations need no request and no new mapping. When a
 * device is full, the daemon asks the clients whose memory would serve (policy_reclaim_order():
 * tenants over their guarantee first, then the largest reported free first) to give such
 * segments back until what they reported covers the request, on each client's control
 * channel; the library
 * answers on its control thread. The lease that ran short waits a bounded time
 * (reclaim_timeout) for the segments to come back. gpupoolctl trim and flush --tenant ask the
 * same of chosen clients.
 */
#ifndef GP_RECLAIM_H
#define GP_RECLAIM_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

struct node;
struct session;

/* The most segments one ReclaimRequest or ReclaimReply names (it must fit a request packet). */
#define RECLAIM_MAX_SEGMENTS 256
/* The most reclaim requests a client may leave unanswered; it is asked nothing more until it answers. */
#define RECLAIM_MAX_OUTSTANDING 64

/* The most a client's reports are discounted for claims it did not honour: they count for 1/64 then. */
#define RECLAIM_MAX_DISTRUST 6

/*
 * The one way the daemon asks clients for memory: asks clients other than requester, in
 * policy's order (policy_reclaim_order()), for empty segments worth at least want_bytes on
 * device. For a lease (requester, and round naming the parked lease): those asked for it
 * already are not asked again, and what comes back goes to the cache, for it. For the
 * headroom (requester NULL, round 0: others, a new process's context or a program without
 * gpupool, took part of it and the cache is empty): only clients over their tenant's
 * guarantee, nothing while an earlier request is unanswered, and what comes back goes to the
 * backend. Returns the bytes asked for as far as they are trusted (what each held free as of
 * its latest report, discounted for claims it did not honour before), and the number of
 * clients asked in *ret_clients.
 */
uint64_t reclaim_ask(struct node *node, struct session *requester, unsigned device, uint64_t want_bytes, uint64_t round,
                     unsigned *ret_clients);

/*
 * What reclaim_ask() could ask back for requester on device now: the segments the clients it
 * would ask keep free, as far as their reports are trusted. What the daemon tells a client it
 * may take (MemInfoReply), never what it lets it have.
 */
uint64_t reclaim_askable_bytes(const struct node *node, const struct session *requester, unsigned device);

/* Whether a client asked for the parked lease named round has not answered yet. */
bool reclaim_pending_for(const struct node *node, uint64_t round);

/*
 * Writes off the requests that clients have left unanswered for reclaim_timeout: they count
 * as answered with nothing (no lease or headroom waits on them), and as claims not honoured.
 */
void reclaim_expire(struct node *node, uint64_t now_ms);

/* Writes off every request c has not answered (its control channel closed, say). */
void reclaim_write_off(struct session *c);

/*
 * Asks client for every empty segment it holds, on device (-1: every device); with to_backend
 * they go to the backend when they come back, not to the cache. Adds what it held free as of
 * its latest report to *bytes, and 1 to *clients when the client was asked anything.
 */
void reclaim_all(struct node *node, struct session *client, int device, bool to_backend, uint32_t *clients,
                 uint64_t *bytes);

/* A control channel's answer: the client unmapped these segments; they go to the cache (or the backend). */
void reclaim_answered(struct session *control, const Gpupool__ReclaimReply *reply);

#endif
