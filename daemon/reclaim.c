/* reclaim.c: asking clients for the segments they keep free (see reclaim.h). */
#include "reclaim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "node.h"
#include "session.h"
#include "size.h"

/*
 * Asks c for empty segments worth want bytes on device (UINT64_MAX: all of them). Its report
 * is only as fresh as its latest message, so it is asked whatever it reported. Returns the
 * bytes asked as far as known: what it reported held free, up to want. Sets *ret_asked when
 * the request went out.
 */
static uint64_t ask(struct node *node, struct session *c, unsigned device, uint64_t want, bool to_backend,
                    bool *ret_asked) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReclaimRequest rr = GPUPOOL__RECLAIM_REQUEST__INIT;
        const struct pool_owner *o = &c->owners[device];
        uint64_t claim;
        int r;

        if (c->reclaim.outstanding >= RECLAIM_MAX_OUTSTANDING)
                return 0;       /* it has not answered that many: asking more would not help */
        if (!o->reserved_bytes)
                return 0;       /* it leases nothing there */
        rr.has_device = 1;
        rr.device = device;
        rr.has_bytes = want != UINT64_MAX;
        rr.bytes = want;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM;
        env.reclaim = &rr;
        r = session_push(c->control, &env);
        if (r < 0) {
                session_log(c, LOG_LEVEL_WARN, "client %llu (pid %d): cannot ask for its free segments: %s",
                            (unsigned long long) c->id, (int) c->pid, strerror(-r));
                return 0;
        }
        session_log(c, LOG_LEVEL_DEBUG, "asked client %llu (pid %d) for free segments on device %u",
                    (unsigned long long) c->id, (int) c->pid, device);
        *ret_asked = true;
        if (to_backend)
                c->reclaim.to_backend |= 1ULL << c->reclaim.outstanding;
        if (!c->reclaim.outstanding)
                c->reclaim.since_ms = uv_now(node->loop);
        c->reclaim.outstanding++;
        node->reclaim_outstanding++;
        claim = o->reported_held_free_bytes < want ? o->reported_held_free_bytes : want;
        c->reclaim.claimed_bytes += claim;
        /* As far as it is trusted: one that did not honour its claims covers less of the request. */
        return claim >> c->reclaim.distrust;
}

/*
 * A round of c's requests is over (all answered, or written off): whether it gave back at least
 * half of what it claimed decides how far its next reports, and its principal's, are trusted.
 */
static void judge(struct session *c) {
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];

        if (!c->reclaim.claimed_bytes)
                return;
        if (c->reclaim.given_bytes * 2 < c->reclaim.claimed_bytes) {
                if (c->reclaim.distrust < RECLAIM_MAX_DISTRUST)
                        c->reclaim.distrust++;
                session_log(c, LOG_LEVEL_INFO, "client %llu ('%s', pid %d) gave back %s of the %s it reported free when "
                            "asked: what it reports free counts for 1/%u in whom to ask", (unsigned long long) c->id,
                            c->name, (int) c->pid, gp_size_format(c->reclaim.given_bytes, b1, sizeof(b1)),
                            gp_size_format(c->reclaim.claimed_bytes, b2, sizeof(b2)), 1u << c->reclaim.distrust);
        } else if (c->reclaim.given_bytes >= c->reclaim.claimed_bytes && c->reclaim.distrust) {
                c->reclaim.distrust--;
        }
        c->reclaim.claimed_bytes = c->reclaim.given_bytes = 0;
        node_distrust_set(c->node, c->principal, c->reclaim.distrust);
}

void reclaim_write_off(struct session *c) {
        if (!c->reclaim.outstanding)
                return;
        session_forget_reclaims(c);
        judge(c);
}

void reclaim_expire(struct node *node, uint64_t now_ms) {
        uint64_t timeout = node->options->reclaim_timeout_ms;

        if (!node->reclaim_outstanding)
                return;
        SESSION_FOREACH(c, node)
                if (c->reclaim.outstanding && now_ms - c->reclaim.since_ms >= timeout) {
                        session_log(c, LOG_LEVEL_INFO, "client %llu ('%s', pid %d) did not answer %u request%s for memory "
                                    "back within %llu ms (reclaim_timeout): written off", (unsigned long long) c->id,
                                    c->name, (int) c->pid, c->reclaim.outstanding, c->reclaim.outstanding == 1 ? "" : "s",
                                    (unsigned long long) timeout);
                        reclaim_write_off(c);
                }
}

bool reclaim_pending_for(const struct node *node, uint64_t round) {
        if (!node->reclaim_outstanding)
                return false;
        SESSION_FOREACH(c, node)
                if (c->reclaim.outstanding && c->reclaim.asked_for == round)
                        return true;
        return false;
}

/* Whether c can be asked to give memory back on device for requester: another client that leases there, with a channel. */
static bool askable(const struct session *c, const struct session *requester, unsigned device) {
        return c != requester && c->control && c->tenant && c->state == SESSION_READY && c->owners[device].reserved_bytes;
}

/*
 * The clients other than requester (NULL: none) that may be asked for memory on device for it,
 * in policy's order (those whose memory would serve it, over their guarantee and largest
 * first); with a round (not 0), only those not asked for it yet. Into *ret (free it), how many
 * returned; 0 and NULL for none (or no memory to list them).
 */
static size_t candidates_for(const struct node *node, const struct session *requester, unsigned device, uint64_t round,
                             struct policy_candidate **ret) {
        struct policy_candidate *candidates;
        size_t n = 0;

        *ret = NULL;
        SESSION_FOREACH(c, node)
                n += askable(c, requester, device) && (!round || c->reclaim.asked_for != round);
        candidates = n ? calloc(n, sizeof(*candidates)) : NULL;
        if (!candidates)
                return 0;
        n = 0;
        SESSION_FOREACH(c, node)
                if (askable(c, requester, device) && (!round || c->reclaim.asked_for != round))
                        candidates[n++] = (struct policy_candidate) {
                                /* Reports of a client that did not honour its claims count for less. */
                                .tenant = c->tenant,
                                .held_free_bytes = c->owners[device].reported_held_free_bytes >> c->reclaim.distrust,
                                .client = c,
                        };
        *ret = candidates;
        return policy_reclaim_order(requester ? requester->tenant : NULL, device, candidates, n);
}

uint64_t reclaim_askable_bytes(const struct node *node, const struct session *requester, unsigned device) {
        struct policy_candidate *candidates;
        size_t n = candidates_for(node, requester, device, 0, &candidates);
        uint64_t bytes = 0;

        for (size_t i = 0; i < n; i++)
                bytes += candidates[i].held_free_bytes;
        free(candidates);
        return bytes;
}

/*
 * Asks, in policy's order, clients other than requester (NULL: none) for want_bytes on device;
 * with a round (not 0), only those not asked for it yet, and each asked is marked with it.
 */
static uint64_t ask_in_order(struct node *node, struct session *requester, unsigned device, uint64_t want_bytes,
                             bool to_backend, uint64_t round, unsigned *ret_clients) {
        struct policy_candidate *candidates;
        uint64_t asked = 0;
        size_t n;

        /* Asking pushes a message and ends no session: the candidates stay valid while they are asked. */
        *ret_clients = 0;
        n = candidates_for(node, requester, device, round, &candidates);
        for (size_t i = 0; i < n && asked < want_bytes; i++) {
                bool pushed = false;

                struct session *c = candidates[i].client;

                asked += ask(node, c, device, want_bytes - asked, to_backend, &pushed);
                *ret_clients += pushed;
                if (pushed && round)
                        c->reclaim.asked_for = round;
        }
        free(candidates);
        return asked;
}

uint64_t reclaim_ask(struct node *node, struct session *requester, unsigned device, uint64_t want_bytes, uint64_t round,
                     unsigned *ret_clients) {
        char b[GP_SIZE_FORMAT_MAX];
        uint64_t asked;

        if (requester)
                return ask_in_order(node, requester, device, want_bytes, false, round, ret_clients);
        /* For the headroom, once at a time: what was asked before is still on its way back, unless it is overdue. */
        *ret_clients = 0;
        reclaim_expire(node, uv_now(node->loop));
        if (node->reclaim_outstanding)
                return 0;
        asked = ask_in_order(node, NULL, device, want_bytes, true, 0, ret_clients);
        if (*ret_clients)
                log_info("device %u: others took part of the headroom and the cache is empty: asked %u client%s for %s "
                         "of segments they keep free", device, *ret_clients, *ret_clients == 1 ? "" : "s",
                         gp_size_format(asked, b, sizeof(b)));
        return asked;
}

void reclaim_all(struct node *node, struct session *c, int device, bool to_backend, uint32_t *clients,
                 uint64_t *bytes) {
        bool asked = false;

        if (!c->control || c->state != SESSION_READY)
                return;
        for (unsigned d = 0; d < node->device_count; d++)
                if (device < 0 || (unsigned) device == d)
                        *bytes += ask(node, c, d, UINT64_MAX, to_backend, &asked);
        *clients += asked;
}

void reclaim_answered(struct session *control, const Gpupool__ReclaimReply *reply) {
        struct session *c = control->control_of;
        struct node *node = control->node;
        bool to_backend = false;

        if (!c)
                return;
        bool counted = c->reclaim.outstanding;

        if (counted) {
                /* Answers come in the order asked: this one is the lowest bit's. */
                to_backend = c->reclaim.to_backend & 1;
                c->reclaim.to_backend >>= 1;
                c->reclaim.outstanding--;
                node->reclaim_outstanding--;
                c->reclaim.since_ms = uv_now(node->loop);       /* the next one waits from now, at most */
        }
        for (size_t i = 0; i < reply->n_segment_ids && i < RECLAIM_MAX_SEGMENTS; i++) {
                uint64_t id = reply->segment_ids[i], d = id >> 56;
                uint64_t before = d < node->device_count ? c->owners[d].reserved_bytes : 0;

                if (session_return(c, id, to_backend) == 0) {
                        node->reclaims_total[d]++;
                        c->reclaim.given_bytes += before - c->owners[d].reserved_bytes;
                }
        }
        if (counted && !c->reclaim.outstanding)
                judge(c);
}
