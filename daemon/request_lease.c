/*
 * request_lease.c: the requests that hand a client memory: leases (sent down the eviction
 * ladder, evict.c; parked while it waits; the refusals' sentences), adoptions of what a
 * process kept from a daemon before this one, and charges of memory it allocated outside the
 * pool.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evict.h"
#include "log.h"
#include "node.h"
#include "objects.h"
#include "peerfd.h"
#include "reclaim.h"
#include "session.h"
#include "size.h"

/* Refuses a lease: the reason goes to the client and, at info, to the log. */
static void refuse(struct session *s, uint64_t id, int err, enum policy_refusal reason, unsigned device, uint64_t size,
                   const char *why, struct reply *ret) {
        s->node->refusals_total[reason]++;
        session_log(s, LOG_LEVEL_INFO, "client %llu ('%s', pid %d, tenant %s): %" PRIu64 " bytes on device %u refused: %s",
                    (unsigned long long) s->id, s->name, (int) s->pid, s->tenant ? s->tenant->conf.name : "-", size, device,
                    why);
        reply_error(id, err, false, why, ret);
}

/* The part of a refusal that says which limit a segment of seg bytes met: "would take client ... over its limit of ...". */
static void limit_message(const struct session *s, unsigned d, uint64_t seg, const struct policy_admission *a,
                          char *why, size_t why_size) {
        static const char *const limit_from[] = {
                [POLICY_LIMIT_DEFAULT] = "client_max, --client-limit",
                [POLICY_LIMIT_TENANT] = "its tenant's client_max",
                [POLICY_LIMIT_PID] = "set-limit --pid",
        };
        const struct tenant *t = s->tenant;
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX], b4[GP_SIZE_FORMAT_MAX];

        switch (a->bound) {
        case POLICY_CLIENT:
                if (a->client_limit_from == POLICY_LIMIT_PID) {
                        snprintf(why, why_size, "would take process %d (client '%s' and its other connections, tenant %s) "
                                 "to %s reserved, over its limit of %s (set-limit --pid)", (int) s->pid, s->name,
                                 t->conf.name, gp_size_format(a->used_bytes + seg, b2, sizeof(b2)),
                                 gp_size_format(a->limit_bytes, b3, sizeof(b3)));
                        return;
                }
                {
                        uint64_t objects = objects_principal_bytes(s->node, s->principal, d);
                        int n = snprintf(why, why_size, "would take client '%s' (pid %d, tenant %s) to %s reserved, over its "
                                         "limit of %s (%s)", s->name, (int) s->pid, t->conf.name,
                                         gp_size_format(a->used_bytes + seg, b2, sizeof(b2)),
                                         gp_size_format(a->limit_bytes, b3, sizeof(b3)), limit_from[a->client_limit_from]);

                        /* Named objects it published count too: say how much, or the sum looks wrong. */
                        if (objects && n > 0 && (size_t) n < why_size)
                                snprintf(why + n, why_size - (size_t) n, "; %s of it in named objects it published",
                                         gp_size_format(objects, b4, sizeof(b4)));
                }
                return;
        case POLICY_TENANT:
                if (t->reservation) {
                        snprintf(why, why_size, "would take reservation %s (%u client%s of its pods) to %s reserved on device "
                                 "%u, over its limit of %s", t->conf.name, t->clients, t->clients == 1 ? "" : "s",
                                 gp_size_format(a->used_bytes + seg, b2, sizeof(b2)), d,
                                 gp_size_format(a->limit_bytes, b3, sizeof(b3)));
                        return;
                }
                snprintf(why, why_size, "would take tenant %s (%u client%s) to %s reserved, over its max of %s%s", t->conf.name,
                         t->clients, t->clients == 1 ? "" : "s", gp_size_format(a->used_bytes + seg, b2, sizeof(b2)),
                         gp_size_format(a->limit_bytes, b3, sizeof(b3)), t->overridden ? " (set-limit)" : "");
                return;
        case POLICY_GUARANTEES:
                snprintf(why, why_size,
                         "does not fit: of the device's %s, clients hold %s and %s is held back for other tenants' unused "
                         "guarantees (tenant %s holds %s)",
                         gp_size_format(a->limit_bytes, b2, sizeof(b2)),
                         gp_size_format(a->used_bytes - a->held_back_bytes, b3, sizeof(b3)),
                         gp_size_format(a->held_back_bytes, b4, sizeof(b4)), t->conf.name,
                         gp_size_format(t->sums[d].reserved_bytes, b1, sizeof(b1)));
                return;
        case POLICY_OTHER_DEVICE:
                if (t->reservation) {
                        snprintf(why, why_size, "reservation %s is for device %u: its pods have memory there only, not on "
                                 "device %u", t->conf.name, t->conf.device, d);
                        return;
                }
                snprintf(why, why_size, "tenant %s holds memory on device %u only (device = in its config), not on "
                         "device %u", t->conf.name, t->conf.device, d);
                return;
        case POLICY_UNBOUND:
                break;
        }
        snprintf(why, why_size, "no limit allows");
}

/* Turns policy's refusal of a lease into the sentence: the request, the limit and the use that it met. */
static void quota_message(const struct session *s, unsigned d, uint64_t size, const struct policy_admission *a,
                          char *why, size_t why_size) {
        uint64_t seg = pool_min_segment_bytes(size);
        char b1[GP_SIZE_FORMAT_MAX];
        int n;

        n = snprintf(why, why_size, "a block of %" PRIu64 " bytes on device %u needs a %s segment, which ", size, d,
                     gp_size_format(seg, b1, sizeof(b1)));
        if (n < 0 || (size_t) n >= why_size)
                return;
        limit_message(s, d, seg, a, why + n, why_size - (size_t) n);
}

/* The most clients a refusal names as holding a full device's memory. */
#define HOLDERS_NAMED 3

/*
 * Who holds device's memory, for the refusal of a lease that did not fit: the clients leasing
 * most there, each with what it last reported in use and free, and the rest summed.
 */
static void holders_text(const struct node *node, unsigned device, char *buf, size_t size) {
        const struct session *top[HOLDERS_NAMED] = { NULL };
        uint64_t rest_bytes = 0, now = uv_now(node->loop);
        unsigned rest = 0;
        size_t len;
        int n;

        SESSION_FOREACH(c, node) {
                const struct session *x = c;

                if (!c->owners || !c->owners[device].reserved_bytes)
                        continue;
                /* Insertion into the few largest; what falls off the end is the rest. */
                for (unsigned i = 0; i < HOLDERS_NAMED && x; i++)
                        if (!top[i] || x->owners[device].reserved_bytes > top[i]->owners[device].reserved_bytes) {
                                const struct session *t = top[i];

                                top[i] = x;
                                x = t;
                        }
                if (x) {
                        rest++;
                        rest_bytes += x->owners[device].reserved_bytes;
                }
        }
        n = snprintf(buf, size, "; it is leased to");
        for (unsigned i = 0; i < HOLDERS_NAMED && top[i] && n > 0 && (size_t) n < size; i++) {
                const struct pool_owner *o = &top[i]->owners[device];
                char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX], age[48] = "";

                len = (size_t) n;
                if (o->reported)
                        snprintf(age, sizeof(age), " as of %llu ms ago",
                                 (unsigned long long) (now > o->reported_at_ms ? now - o->reported_at_ms : 0));
                n += snprintf(buf + len, size - len, "%s client %llu '%s' (pid %d, tenant %s): %s, %s in use and %s free%s",
                              i ? "," : "", (unsigned long long) top[i]->id, top[i]->name, (int) top[i]->pid,
                              top[i]->tenant ? top[i]->tenant->conf.name : "-",
                              gp_size_format(o->reserved_bytes, b1, sizeof(b1)),
                              gp_size_format(o->reported_in_use_bytes, b2, sizeof(b2)),
                              gp_size_format(o->reported_held_free_bytes, b3, sizeof(b3)), o->reported ? age : " (not reported)");
        }
        if (!top[0])
                snprintf(buf, size, "; no client leases any of it");
        else if (rest && n > 0 && (size_t) n < size) {
                char b[GP_SIZE_FORMAT_MAX];

                snprintf(buf + n, size - (size_t) n, ", and %u client%s more %s", rest, rest == 1 ? "" : "s",
                         gp_size_format(rest_bytes, b, sizeof(b)));
        }
}

/*
 * A leased segment's handle for a reply: sets its IPC handle (cuda), or returns true where its
 * descriptor goes with the packet instead (host, cuda-vmm).
 */
static bool segment_handle(const struct backend_mem *mem, protobuf_c_boolean *ret_has, ProtobufCBinaryData *ret_handle) {
        if (!mem->ipc_handle_len)
                return true;
        *ret_has = 1;
        ret_handle->len = mem->ipc_handle_len;
        ret_handle->data = (uint8_t *) mem->ipc_handle;
        return false;
}

/*
 * Where the GPU itself is what is short (others took part of the headroom, so the pool may not
 * grow by segment bytes even under its capacity), says so in buf; else buf is empty.
 */
static void headroom_text(const struct pool_stats *st, uint64_t segment, char *buf, size_t size) {
        char f[GP_SIZE_FORMAT_MAX], h[GP_SIZE_FORMAT_MAX], o[GP_SIZE_FORMAT_MAX];
        uint64_t outside;

        buf[0] = '\0';
        if (!st->gpu_known || st->gpu_free_bytes >= st->headroom_bytes + segment)
                return;
        outside = st->gpu_total_bytes - st->gpu_free_bytes;
        outside = outside > st->reserved_bytes ? outside - st->reserved_bytes : 0;
        snprintf(buf, size, "; the GPU has %s free, and the pool leaves %s of it (headroom) to contexts and programs "
                 "outside the pool, which use %s now",
                 gp_size_format(st->gpu_free_bytes, f, sizeof(f)), gp_size_format(st->headroom_bytes, h, sizeof(h)),
                 gp_size_format(outside, o, sizeof(o)));
}

/* Refuses a lease over a limit: which limit, and what it met. */
static void refuse_quota(struct session *s, uint64_t id, uint32_t device, uint64_t size, const struct policy_admission *adm,
                         struct reply *ret) {
        char why[GP_MAX_ERROR_BYTES];

        quota_message(s, device, size, adm, why, sizeof(why));
        refuse(s, id, -EDQUOT, policy_refusal_of(adm->bound), device, size, why, ret);
}

/* Refuses a lease the device has no room for after the eviction ladder: what was tried, who holds the memory. */
static void refuse_full(struct session *s, const struct evict_lease *l, enum evict_attempt attempt, struct reply *ret) {
        uint64_t id = l->id, size = l->size;
        uint32_t device = l->device;
        struct node *node = s->node;
        char why[GP_MAX_ERROR_BYTES], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];
        /* Sized so that the refusal's parts fit in why together (gcc checks the sum). */
        char tried[160] = "", holders[384], gpu[200], charged[64] = "";
        struct pool_stats st;

        if (attempt == EVICT_FINAL)
                snprintf(tried, sizeof(tried), "; asked %u client%s for %s they reported free, and not enough "
                         "came back within %llu ms (reclaim_timeout)",
                         l->asked_clients, l->asked_clients == 1 ? "" : "s", gp_size_format(l->asked_bytes, b1, sizeof(b1)),
                         (unsigned long long) node->options->reclaim_timeout_ms);
        else
                snprintf(tried, sizeof(tried), "; no other client could give back memory that would serve "
                         "(tenants under their guarantee keep theirs)");
        holders_text(node, device, holders, sizeof(holders));
        pool_get_stats(node->pools[device], &st);
        headroom_text(&st, pool_min_segment_bytes(size), gpu, sizeof(gpu));
        if (st.charged_bytes)
                snprintf(charged, sizeof(charged), " (and %s charged outside the pool)",
                         gp_size_format(st.charged_bytes, b1, sizeof(b1)));
        snprintf(why, sizeof(why),
                 "device %u is full: %" PRIu64 " bytes asked, %s of %s reserved%s and %s in use after "
                 "releasing the cache%s%s%s",
                 device, size, gp_size_format(st.reserved_bytes, b1, sizeof(b1)),
                 gp_size_format(st.total_bytes, b2, sizeof(b2)), charged, gp_size_format(st.in_use_bytes, b3, sizeof(b3)),
                 gpu, tried, holders);
        refuse(s, id, -ENOMEM, POLICY_REFUSED_DEVICE_FULL, device, size, why, ret);
}

/* Refuses a lease larger than the device's whole pool: it can never fit, whoever gives memory back. */
static void refuse_never_fits(struct session *s, uint64_t id, uint32_t device, uint64_t size, const struct pool_stats *st,
                              struct reply *ret) {
        char why[GP_MAX_ERROR_BYTES], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];

        snprintf(why, sizeof(why), "device %u can never fit %" PRIu64 " bytes (%s): it holds %s in all (its pool's capacity)",
                 device, size, gp_size_format(pool_min_segment_bytes(size), b1, sizeof(b1)),
                 gp_size_format(st->total_bytes, b2, sizeof(b2)));
        refuse(s, id, -ENOMEM, POLICY_REFUSED_DEVICE_FULL, device, size, why, ret);
}

/* Refuses a lease the backend failed (err), as -EIO, and logs it as an error. */
static void refuse_backend(struct session *s, uint64_t id, uint32_t device, uint64_t size, int err, struct reply *ret) {
        struct node *node = s->node;
        char why[GP_MAX_ERROR_BYTES];

        if (err == -EINPROGRESS)
                snprintf(why, sizeof(why), "device %u did not finish zeroing a segment for this lease within %llu ms "
                         "(reclaim_timeout): the GPU is busy or stuck", device,
                         (unsigned long long) node->options->reclaim_timeout_ms);
        else if (err == -EMFILE || err == -ENFILE)
                snprintf(why, sizeof(why), "the %s backend cannot make a segment: the daemon is out of file "
                         "descriptors (%s; see LimitNOFILE= in docs/operations.md)", node->backend->name,
                         strerror(-err));
        else
                snprintf(why, sizeof(why), "the %s backend failed: %s", node->backend->name, strerror(-err));
        session_log(s, err == -EINPROGRESS ? LOG_LEVEL_WARN : LOG_LEVEL_ERR, "client %llu: allocating %" PRIu64 " bytes: %s",
                    (unsigned long long) s->id, size, why);
        node->refusals_total[POLICY_REFUSED_BACKEND_ERROR]++;
        reply_error(id, -EIO, false, why, ret);
}

/* Answers a lease with the count segments it got (none: granules ahead only, and none fitted at once). */
static void lease_granted(struct session *s, uint64_t id, uint32_t device, const struct pool_lease *leases, unsigned count,
                          struct reply *ret) {
        struct node *node = s->node;
        Gpupool__LeaseReply lr = GPUPOOL__LEASE_REPLY__INIT;
        Gpupool__Envelope env;
        bool pass_fds = false;

        reply_ok(&env, id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE_REPLY;
        env.lease_reply = &lr;
        if (count == 0) {
                lr.segment_size = GP_GRANULE_BYTES;     /* a reply that names no segment */
                (void) reply_pack(&env, false, ret);
                return;
        }
        node->leases_total[device]++;
        /* The ids, in the order their descriptors go (the reply's list of them, after the first). */
        for (unsigned i = 0; i < count; i++)
                ret->fds.segments[i] = leases[i].segment_id;
        lr.segment_id = leases[0].segment_id;
        lr.segment_size = leases[0].segment_size;
        lr.more_segment_ids = ret->fds.segments + 1;
        lr.n_more_segment_ids = count - 1;
        /* A granule lease is refused on a backend of IPC handles: each of its segments has a descriptor. */
        pass_fds = segment_handle(leases[0].mem, &lr.has_ipc_handle, &lr.ipc_handle);
        if (reply_pack(&env, false, ret) < 0) {
                /* The client hears of no segment: none stays its. */
                for (unsigned i = 0; i < count; i++)
                        pool_lease_undo(node->pools[device], &s->owners[device], leases[i].segment_id);
                return;
        }
        if (pass_fds) {
                ret->fds.device = device;
                ret->fds.request_id = id;
                ret->fds.n = count;
        }
}

/*
 * One try at lease l down the eviction ladder (evict.c). Fills *ret with the reply and returns
 * true, or returns false when the lease waits (parked) for other clients to give memory back,
 * or for a segment being zeroed for it (never one of granules ahead only).
 */
static bool lease_attempt(struct session *s, struct evict_lease *l, enum evict_attempt attempt, struct reply *ret) {
        struct evict_result r;

        switch (evict_lease(s, l, attempt, &r)) {
        case EVICT_LEASED:
                lease_granted(s, l->id, l->device, r.leases, r.count, ret);
                if (l->granules || l->ahead)
                        node_stock_want(s->node, l->device, r.count);
                return true;
        case EVICT_OVER_LIMIT:
                refuse_quota(s, l->id, l->device, l->size, &r.admission, ret);
                return true;
        case EVICT_NEVER_FITS:
                refuse_never_fits(s, l->id, l->device, l->size, &r.stats, ret);
                return true;
        case EVICT_WAITS:
                if (attempt == EVICT_FIRST)
                        *ret = (struct reply) { .parked = true };
                return false;
        case EVICT_FULL:
                refuse_full(s, l, attempt, ret);
                return true;
        case EVICT_FAILED:
                break;
        }
        refuse_backend(s, l->id, l->device, l->size, r.err, ret);
        return true;
}

/* Checks a lease's device and size, then makes the first attempt. */
void request_lease(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        uint32_t device = req->lease->device, granules = req->lease->granules, ahead = req->lease->granules_ahead;
        uint64_t size = req->lease->size, id = req->id;
        char why[200];

        if (device >= node->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", device, node->device_count);
                reply_error(id, -ENODEV, false, why, ret);
                return;
        }
        if (size == 0 || size > POOL_MAX_REQUEST) {
                snprintf(why, sizeof(why), "cannot lease a segment for %" PRIu64 " bytes: a request is 1 byte to 64 TiB",
                         size);
                reply_error(id, -EINVAL, false, why, ret);
                return;
        }
        if (req->lease->has_granules_ahead && (!req->lease->has_granules || ahead > GP_MAX_LEASE_GRANULES - granules)) {
                snprintf(why, sizeof(why), "granules_ahead is for a granule lease, granules and granules_ahead %d at "
                         "most together, not %u and %u", GP_MAX_LEASE_GRANULES, granules, ahead);
                reply_error(id, -EINVAL, false, why, ret);
                return;
        }
        if (req->lease->has_exact && req->lease->exact && req->lease->has_granules) {
                snprintf(why, sizeof(why), "exact is for a segment lease: a granule lease's segments are each the granule");
                reply_error(id, -EINVAL, false, why, ret);
                return;
        }
        if (req->lease->has_granules) {
                /* Granules 0 asks for granules ahead only (none: a lease of nothing). */
                if ((granules == 0 && ahead == 0) || granules > GP_MAX_LEASE_GRANULES || size != GP_GRANULE_BYTES) {
                        snprintf(why, sizeof(why), "a granule lease asks for 1 to %d granules of %llu bytes, or for 0 "
                                 "and some ahead, not %u of %" PRIu64 " and %u ahead", GP_MAX_LEASE_GRANULES,
                                 GP_GRANULE_BYTES, granules, size, ahead);
                        reply_error(id, -EINVAL, false, why, ret);
                        return;
                }
                if (node->backend->ipc_handles) {
                        snprintf(why, sizeof(why), "the %s backend exports legacy IPC handles, which map a segment only "
                                 "whole at an address of the driver's: granule leases need the host or cuda-vmm backend",
                                 node->backend->name);
                        reply_error(id, -EINVAL, false, why, ret);
                        return;
                }
                size = (uint64_t) granules * GP_GRANULE_BYTES;
        }
        if (!s->lease && !(s->lease = calloc(1, sizeof(*s->lease)))) {
                reply_error(id, -ENOMEM, false, "the daemon is out of memory for a lease", ret);
                return;
        }
        *s->lease = (struct evict_lease) { .id = id, .device = device, .size = size, .granules = granules, .ahead = ahead,
                                           .exact = req->lease->has_exact && req->lease->exact };
        (void) lease_attempt(s, s->lease, EVICT_FIRST, ret);
}

/* Room for an adoption's segments: as many as a granule lease's, their descriptors in one packet. */
#define ADOPT_MAX GP_MAX_LEASE_GRANULES

/*
 * Checks an adoption's descriptors (node->recv_fds, one per size) before any is adopted: each
 * the backend's segment of its size, of memory neither the pool nor another of them holds.
 * Fills mems, taking the descriptors a backend keeps (their entries go to -1). Returns 0, or a negative errno
 * with why, every mem made destroyed again.
 */
static int adopt_check(struct session *s, uint32_t device, const uint64_t *sizes, size_t n, struct backend_mem *mems,
                       char *why, size_t why_size) {
        struct node *node = s->node;
        struct backend *b = node->backend;
        uint64_t idents[ADOPT_MAX];
        char what[160], b1[GP_SIZE_FORMAT_MAX];
        size_t made, bad = n;
        int r = 0;

        for (made = 0; made < n && bad == n; made++) {
                /* Nothing that could wait on a file system (FUSE, a network's) looks at it before this. */
                r = peerfd_check(node->recv_fds[made], s->pid, what, sizeof(what));
                if (r == 0)
                        r = b->ops->mem_adopt(b, device, node->recv_fds[made], sizes[made], false, &mems[made], what,
                                              sizeof(what));
                if (r < 0) {
                        bad = made;
                        break;
                }
                if (mems[made].fd == node->recv_fds[made])
                        node->recv_fds[made] = -1;      /* mems[made]'s now; else the closer's, as the session's other descriptors */
                idents[made] = b->ops->mem_ident ? b->ops->mem_ident(b, device, &mems[made]) : 0;
                for (size_t j = 0; j < made && idents[made] && bad == n; j++)
                        if (idents[j] == idents[made]) {
                                snprintf(what, sizeof(what), "the same memory as descriptor %zu", j);
                                bad = made;
                        }
                if (bad == n && idents[made] && pool_holds(node->pools[device], idents[made])) {
                        snprintf(what, sizeof(what), "memory this daemon holds already (leased, cached or adopted)");
                        bad = made;
                }
                if (bad != n)
                        r = -EINVAL;
        }
        if (r == 0)
                return 0;
        while (made--)
                b->ops->mem_destroy(b, device, &mems[made], sizes[made]);
        snprintf(why, why_size, "descriptor %zu of the adoption (a segment of %s on device %u) is %s: nothing adopted", bad,
                 gp_size_format(sizes[bad], b1, sizeof(b1)), device, what);
        return r;
}

/*
 * The segments of an adoption by the process's word (AdoptRequest.held; adopts_held: cuda-vmm),
 * as memory of none of the backend's, in mems. Their sizes may not take the device's capacity,
 * which each adopted grows (node_adopted()), past the GPU's memory: more than that no process
 * can hold. Returns 0, or a negative errno with the reason in why: nothing adopted.
 */
static int held_check(struct node *node, uint32_t device, const uint64_t *sizes, size_t n, struct backend_mem *mems,
                      char *why, size_t why_size) {
        struct backend *b = node->backend;
        struct backend_device_memory dm;
        struct pool_stats st;
        uint64_t sum = 0;
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];

        for (size_t i = 0; i < n; i++) {
                mems[i] = (struct backend_mem) { .fd = -1, .held = true };
                sum += sizes[i];
        }
        pool_get_stats(node->pools[device], &st);
        if (b->ops->device_memory && b->ops->device_memory(b, device, &dm) == 0 && st.total_bytes + sum > dm.total_bytes) {
                snprintf(why, why_size, "an adoption of %s held on device %u would take its capacity of %s past the GPU's "
                         "memory (%s): nothing adopted", gp_size_format(sum, b1, sizeof(b1)), device,
                         gp_size_format(st.total_bytes, b2, sizeof(b2)), gp_size_format(dm.total_bytes, b3, sizeof(b3)));
                return -EINVAL;
        }
        return 0;
}

/*
 * Adopts the segments a process kept from a daemon before this one (AdoptRequest), leasing
 * them to it in order while its limits and the capacity allow; the rest stay the process's own.
 */
void request_adopt(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        const Gpupool__AdoptRequest *rq = req->adopt;
        Gpupool__AdoptReply ar = GPUPOOL__ADOPT_REPLY__INIT;
        struct backend_mem mems[ADOPT_MAX];
        uint64_t ids[ADOPT_MAX], bytes = 0;
        char why[GP_MAX_ERROR_BYTES], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];
        uint32_t device = rq->device;
        Gpupool__Envelope env;
        size_t n = rq->n_sizes, i;
        bool held = rq->has_held && rq->held;
        int r = 0;

        if (device >= node->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", device, node->device_count);
                reply_error(req->id, -ENODEV, false, why, ret);
                return;
        }
        /* Each with its descriptor, or (held) none. */
        if (n == 0 || n > ADOPT_MAX || node->recv_nfds != (held ? 0 : n)) {
                snprintf(why, sizeof(why), "an adoption%s names 1 to %d segments%s, not %zu with %zu",
                         held ? " of held memory" : "", ADOPT_MAX, held ? " and no descriptor" : ", each with its descriptor", n,
                         node->recv_nfds);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        for (i = 0; i < n; i++)
                if (rq->sizes[i] == 0 || rq->sizes[i] % GP_GRANULE_BYTES || rq->sizes[i] > heap_min_segment_bytes(POOL_MAX_REQUEST)) {
                        snprintf(why, sizeof(why), "segment %zu of the adoption is of %" PRIu64 " bytes: a segment is a "
                                 "multiple of %llu bytes, up to the largest request's", i, rq->sizes[i], GP_GRANULE_BYTES);
                        reply_error(req->id, -EINVAL, false, why, ret);
                        return;
                }
        if (!node->backend->ops->mem_adopt) {
                snprintf(why, sizeof(why), "the %s backend cannot adopt memory: %s", node->backend->name,
                         node->backend->no_adopt_why ? node->backend->no_adopt_why : "(no reason given)");
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (held && !node->backend->adopts_held) {
                snprintf(why, sizeof(why), "the %s backend adopts a segment only with its descriptor, which is its memory",
                         node->backend->name);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (held)
                r = held_check(node, device, rq->sizes, n, mems, why, sizeof(why));
        else
                r = adopt_check(s, device, rq->sizes, n, mems, why, sizeof(why));
        if (r < 0) {
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): adoption refused: %s", (unsigned long long) s->id,
                            (int) s->pid, why);
                reply_error(req->id, r, false, why, ret);
                return;
        }
        for (i = 0; i < n; i++) {
                struct pool_owner *owner = &s->owners[device];
                struct policy_admission adm;
                struct pool_lease lease;
                struct pool_stats st;

                /* On cuda-vmm its memory was left out of the capacity at start: counted once, in it (node_adopted()). */
                node_adopted(node, device, rq->sizes[i], true);
                pool_get_stats(node->pools[device], &st);
                evict_admit(s, device, &st, &adm);
                r = pool_adopt(node->pools[device], owner, &mems[i], rq->sizes[i], adm.headroom_bytes, &lease);
                if (r < 0)
                        node_adopted(node, device, rq->sizes[i], false);
                if (r == -EDQUOT) {
                        int k = snprintf(why, sizeof(why), "adopting a segment of %s on device %u ",
                                         gp_size_format(rq->sizes[i], b1, sizeof(b1)), device);

                        limit_message(s, device, rq->sizes[i], &adm, why + k, sizeof(why) - (size_t) k);
                } else if (r == -ENOMEM) {
                        snprintf(why, sizeof(why), "device %u is full: adopting a segment of %s would take it to %s "
                                 "reserved, over its capacity of %s", device, gp_size_format(rq->sizes[i], b1, sizeof(b1)),
                                 gp_size_format(st.reserved_bytes + rq->sizes[i], b2, sizeof(b2)),
                                 gp_size_format(st.total_bytes, b3, sizeof(b3)));
                } else if (r < 0) {
                        snprintf(why, sizeof(why), "adopting a segment of %s on device %u: %s",
                                 gp_size_format(rq->sizes[i], b1, sizeof(b1)), device, strerror(-r));
                }
                if (r < 0)
                        break;
                ids[i] = lease.segment_id;
                bytes += rq->sizes[i];
        }
        /* What was not adopted stays the process's alone: the daemon lets go of its descriptors. */
        for (size_t j = i; j < n; j++)
                node->backend->ops->mem_destroy(node->backend, device, &mems[j], rq->sizes[j]);
        session_log(s, LOG_LEVEL_INFO, "client %llu ('%s', pid %d): adopted %zu of %zu segments (%s) on device %u%s%s%s",
                    (unsigned long long) s->id, s->name, (int) s->pid, i, n, gp_size_format(bytes, b1, sizeof(b1)), device,
                    held ? ", held by the process (by its word)" : "", i < n ? "; the rest refused: " : "", i < n ? why : "");
        reply_ok(&env, req->id);
        ar.segment_ids = ids;
        ar.n_segment_ids = i;
        if (i < n) {
                ar.has_refused_status = true;
                ar.refused_status = gp_errno_to_status(r);
                ar.refused_error = why;
        }
        env.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT_REPLY;
        env.adopt_reply = &ar;
        if (reply_pack(&env, false, ret) < 0)
                for (i = 0; i < ar.n_segment_ids; i++) {
                        pool_adopt_undo(node->pools[device], &s->owners[device], ids[i]);
                        node_adopted(node, device, rq->sizes[i], false);
                }
}

static bool is_parked(const struct session *c, const void *arg) {
        (void) arg;
        return c->parked;
}

/* Called by node_after_change() through node->hooks.retry_parked (node.h lists the hooks). */
uint64_t request_retry_parked(struct node *node, uint64_t now_ms) {
        struct session **parked;
        uint64_t next = UINT64_MAX;
        /*
         * Collected first: answering one may end its session, and with it that session's
         * control channel, which is never parked itself.
         */
        ssize_t n = session_collect(node, is_parked, NULL, &parked);

        if (n < 0)
                return now_ms + 10;     /* out of memory for a moment: try again soon */
        reclaim_expire(node, now_ms);
        for (ssize_t i = 0; i < n; i++) {
                struct session *c = parked[i];
                struct evict_lease *l = c->lease;
                struct reply rep = { 0 };
                bool final = now_ms >= l->deadline_ms;

                /* Waiting for a zeroing: asking again before one ends would only start another. */
                if (l->zeroing && l->zero_seq == node->zeroings_ended && now_ms < l->deadline_ms) {
                        if (l->deadline_ms < next)
                                next = l->deadline_ms;
                        continue;
                }
                if (lease_attempt(c, l, final ? EVICT_FINAL : EVICT_RETRY, &rep) ||
                    (!l->zeroing && !evict_ask_more(c, l, now_ms) && lease_attempt(c, l, EVICT_FINAL, &rep))) {
                        session_unpark(c);
                        (void) session_send(c, &rep);
                        continue;
                }
                if (l->deadline_ms < next)
                        next = l->deadline_ms;
                if (!l->zeroing && l->ask_more_ms < next)
                        next = l->ask_more_ms;
        }
        free(parked);
        return next;
}

/*
 * Counts memory the process allocated outside the pool against its limits (a charge), or stops
 * counting it (a release). A charge is admitted as a lease of as many bytes is by the limits,
 * at once: it never waits, and no client is asked for memory for it.
 */
void request_charge(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__ChargeReply cr = GPUPOOL__CHARGE_REPLY__INIT;
        const Gpupool__ChargeRequest *c = req->charge;
        struct node *node = s->node;
        uint64_t bytes = c->bytes;
        uint32_t d = c->device;
        Gpupool__Envelope env;
        char why[GP_MAX_ERROR_BYTES], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];

        if (d >= node->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", d, node->device_count);
                reply_error(req->id, -ENODEV, false, why, ret);
                return;
        }
        if (bytes == 0 || bytes > POOL_MAX_REQUEST) {
                snprintf(why, sizeof(why), "cannot charge %" PRIu64 " bytes: a charge is 1 byte to 64 TiB", bytes);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (c->has_release && c->release) {
                if (session_charge(s, d, bytes, true) < 0) {
                        snprintf(why, sizeof(why), "cannot release %s on device %u: the client has %s charged there",
                                 gp_size_format(bytes, b1, sizeof(b1)), d,
                                 gp_size_format(s->charged_bytes[d], b2, sizeof(b2)));
                        reply_error(req->id, -EINVAL, false, why, ret);
                        return;
                }
        } else {
                struct policy_admission adm;
                struct pool_stats st;

                uint64_t held;

                pool_get_stats(node->pools[d], &st);
                evict_admit(s, d, &st, &adm);
                /* The device, as a lease of as many bytes finds it once the cache is released: leases and charges together. */
                held = policy_device_held(&node->policy, d, &st);
                if (bytes <= adm.headroom_bytes && (held > st.total_bytes || bytes > st.total_bytes - held)) {
                        snprintf(why, sizeof(why), "memory of %s on device %u allocated outside the pool: the device holds "
                                 "%s in all, of which clients lease and charge %s", gp_size_format(bytes, b1, sizeof(b1)), d,
                                 gp_size_format(st.total_bytes, b2, sizeof(b2)), gp_size_format(held, b3, sizeof(b3)));
                        refuse(s, req->id, -ENOMEM, POLICY_REFUSED_DEVICE_FULL, d, bytes, why, ret);
                        return;
                }
                if (bytes > adm.headroom_bytes) {
                        int n = snprintf(why, sizeof(why), "memory of %s on device %u allocated outside the pool, ",
                                         gp_size_format(bytes, b1, sizeof(b1)), d);

                        if (n > 0 && (size_t) n < sizeof(why))
                                limit_message(s, d, bytes, &adm, why + n, sizeof(why) - (size_t) n);
                        refuse(s, req->id, -EDQUOT, policy_refusal_of(adm.bound), d, bytes, why, ret);
                        return;
                }
                (void) session_charge(s, d, bytes, false);
        }
        cr.charged_bytes = s->charged_bytes[d];
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_CHARGE_REPLY;
        env.charge_reply = &cr;
        (void) reply_pack(&env, false, ret);
}
