/*
 * client_pool.c: the process's own pool. Its blocks are carved in the process by the
 * allocator core (common/heap.c), one heap per device over the segments the process leases
 * whole from gpupoold (LeaseRequest), so that an allocation or a free that fits what the
 * process holds makes no request and maps nothing. A segment that empties stays mapped for the
 * next allocations until the daemon asks for memory back (on the control channel), it has
 * been empty for the idle time ($GPUPOOL_IDLE_RETURN), the process needs room under its own
 * limit for another segment, gpupool_trim(), or disconnect (given back by client_return.c).
 * Every lease and return tells the daemon what the process holds per device (Usage).
 */
#include "client_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_call.h"
#include "client_grow.h"
#include "client_mem.h"
#include "client_return.h"
#include "client_segment.h"
#include "client_stream.h"
#include "client_tcache.h"

int client_pool_trim(gpupool_client *c, int device, uint64_t want) {
        /* What the threads' caches hold may be all that keeps a segment from emptying, and blocks held for a stream. */
        client_pool_drain(c, true);
        if (client_stream_pending(c))
                (void) client_stream_collect(c, 1);
        return client_return_empty(c, device, want, UINT64_MAX);
}

void client_pool_tick(gpupool_client *c, uint64_t now_ms) {
        client_pool_drain(c, false);
        if (c->idle_return_ms && now_ms >= c->idle_return_ms)
                (void) client_return_empty(c, -1, UINT64_MAX, now_ms - c->idle_return_ms);
}

uint64_t client_pool_free_bytes(gpupool_client *c) {
        uint64_t bytes;

        client_tcache_bytes(c, NULL, &bytes);
        /* Not what is held for a stream until its fence: it is no one else's yet. */
        for (unsigned d = 0; d < c->device_count; d++)
                bytes += (c->grow ? client_grow_mapped(c, d) - c->devices[d].heap.in_use_bytes :
                                    heap_free_bytes(&c->devices[d].heap)) -
                         c->devices[d].heap.held_bytes;
        return bytes;
}

/*
 * A lease with the daemon gone: at once, saying what the process still has. The handle
 * reconnects on its own only to a daemon that came back (the control channel ended with the
 * old one); a connection given up while the daemon lives on (no answer in time, a message it
 * cannot read, a refusal) stays given up until gpupool_reconnect(). Locked.
 */
static int daemon_gone_error(gpupool_client *c) {
        bool refused = c->resume_refused, closed = __atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) ||
                                                   c->conn.broke_with == -ECONNRESET;
        const char *why = "gpupoold is gone (or the connection to it is)";

        if (refused)
                why = "gpupoold came back with other devices (or another backend) than this process holds memory of, so it "
                      "cannot adopt that memory";
        else if (!closed && c->conn.broke_with == -ETIMEDOUT)
                why = "the connection to gpupoold is given up: it did not answer in time ($GPUPOOL_TIMEOUT)";
        else if (!closed && c->conn.broke_with == -EPROTO)
                why = "the connection to gpupoold is given up: it sent a message this version cannot read";
        else if (!closed)
                why = "the connection to gpupoold is given up: it refused this process";

        if (client_memory_lost(c))
                client_set_error(c, "%s; gpupool_reconnect() starts anew", why);
        else
                client_set_error(c, "%s: this process goes on allocating from the %s it holds, but cannot lease more%s; "
                                    "gpupool_reconnect() starts anew%s",
                                 why, c->mem->memory,
                                 refused || !closed ? "" :
                                 " until it has reconnected, which it does on its own once gpupoold listens again",
                                 refused ? " (its blocks are then gone)" : "");
        return -ECONNRESET;
}

/*
 * Sends a LeaseRequest for a segment for size bytes on device d (exact: of that size rounded to
 * 2 MiB and no larger; granules go through lease_granules()) and waits for its reply and up to
 * max_fds descriptors. The daemon may
 * park it while other processes give memory back: the lock must not wait with it. Returns 0,
 * or a negative errno with the error set. Locked.
 */
static int lease_call(gpupool_client *c, unsigned d, uint64_t size, bool exact, Gpupool__Envelope **ret_reply, int *fds,
                      size_t max_fds, size_t *ret_nfds) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        Gpupool__Usage u[CLIENT_MAX_DEVICES], *ptrs[CLIENT_MAX_DEVICES];
        int r;

        client_conn_wait(c);    /* an adoption under way ends with the daemon back */
        if (client_daemon_gone(c))
                return daemon_gone_error(c);
        lr.device = d;
        lr.size = size;
        lr.has_exact = exact;
        lr.exact = exact;
        req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        req.lease = &lr;
        req.n_usage = client_usage(c, u, ptrs);
        req.usage = ptrs;
        r = client_call_unlocked(c, &req, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, ret_reply, fds, max_fds, ret_nfds);
        /* The daemon found gone by this call says so too; a timeout and a reply out of step keep their own. */
        return r < 0 && r != -ETIMEDOUT && r != -EPROTO && client_daemon_gone(c) ? daemon_gone_error(c) : r;
}

/*
 * After a lease reply it refused (client_set_error() said why): the segments it names that
 * this process does not hold are to go back, since the daemon counts them leased to it; one
 * it holds already stays its own. Locked.
 */
static void refused_segments(gpupool_client *c, const Gpupool__LeaseReply *l, struct client_returns *b) {
        for (size_t i = 0; i <= l->n_more_segment_ids; i++) {
                uint64_t id = i ? l->more_segment_ids[i - 1] : l->segment_id;

                if (!client_mapping_by_id(c, id) && !client_grow_holds(c, id))
                        client_returns_add(b, id);
        }
}

/* The same, given back at once. Locked. */
static void return_refused(gpupool_client *c, const Gpupool__LeaseReply *l) {
        struct client_returns b = { 0 };

        refused_segments(c, l, &b);
        client_returns_send(c, &b);
}

/*
 * Leases a segment on device d for a block of rsize bytes and adds it to the device's heap,
 * in class (*ret_m: its mapping, if asked). Returns 0 or a negative errno with the error set.
 * Locked.
 */
static int lease(gpupool_client *c, unsigned d, uint64_t rsize, enum heap_class class, struct mapping **ret_m) {
        const Gpupool__LeaseReply *l;
        Gpupool__Envelope *rep;
        struct mapping *m;
        size_t nfds;
        int r, fd = -1;

        /* A piece holds no more than its block: the cache's larger segments do not serve it. */
        r = lease_call(c, d, rsize, class == HEAP_CLASS_PIECE, &rep, &fd, 1, &nfds);
        if (r < 0)
                return r;
        l = rep->lease_reply;
        if (l->segment_size < rsize || l->segment_size % HEAP_BLOCK_ALIGN || client_mapping_by_id(c, l->segment_id)) {
                if (fd >= 0)
                        close(fd);
                client_set_error(c, "gpupoold leased a segment that cannot serve the request or that this process "
                                    "maps already");
                return_refused(c, l);
                r = -EPROTO;
                goto out;
        }
        r = client_mapping_add(c, d, l->segment_id, l->segment_size, l->has_ipc_handle ? &l->ipc_handle : NULL, fd, &m);
        if (r < 0) {
                uint64_t id = l->segment_id;

                /* Never mapped: the daemon takes it back. */
                (void) client_return(c, &id, 1);
                goto out;
        }
        r = heap_add(&c->devices[d].heap, &m->hs, m->segment_id, m->size, class);
        if (r < 0) {
                uint64_t id = m->segment_id;

                client_mapping_drop(c, m);
                (void) client_return(c, &id, 1);
                goto out;
        }
        m->emptied_ms = client_now_ms();
        if (ret_m)
                *ret_m = m;
out:
        gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

/* A block's granule leases (lease_granules()): requests sent and replies read, and what came. */
struct lease_pipe {
        unsigned d;
        uint64_t n, ahead;              /* granules asked, and up to ahead more with the last request */
        uint64_t last;                  /* granules the last request asks for */
        uint64_t requests, sent, read;
        uint64_t obtained;              /* granules that came, taken as spares */
        int r;                          /* the first failure (0: none) */
        char why[GP_MAX_ERROR_BYTES];   /* its sentence, the handle's error once the replies are read */
        struct client_returns back;     /* segments of replies refused, to go back after */
};

/*
 * Request i's granules, and how many more it asks ahead: only the last asks any, so that the
 * daemon, which serves the requests in order, never gives granules ahead that a granule
 * asked after them would then lack. The others carry the rest, a packet's worth each.
 */
static uint64_t pipe_batch(const struct lease_pipe *p, uint64_t i, uint64_t *ret_ahead) {
        uint64_t full = GP_MAX_LEASE_GRANULES, rest;

        if (i + 1 == p->requests) {
                *ret_ahead = p->ahead < full - p->last ? p->ahead : full - p->last;
                return p->last;
        }
        *ret_ahead = 0;
        rest = p->n - p->last - i * full;
        return rest < full ? rest : full;
}

/* The first failure is the one the caller reports: later ones (their sentences in c->error too) are not. Locked. */
static void pipe_fail(struct lease_pipe *p, int r, const char *why) {
        if (p->r)
                return;
        p->r = r;
        snprintf(p->why, sizeof(p->why), "%s", why);
}

/*
 * Sends the pipe's next requests, as many as CLIENT_PIPELINE lets be unanswered, the first
 * with the usage u (n_usage of it). Stops at a failure: none goes after one. Unlocked, the
 * connection lent to this thread.
 */
static int pipe_send(gpupool_client *c, struct lease_pipe *p, Gpupool__Usage **u, size_t n_usage) {
        while (p->sent < p->requests && p->sent - p->read < CLIENT_PIPELINE) {
                Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
                Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
                uint64_t ahead, batch = pipe_batch(p, p->sent, &ahead);
                int r;

                lr.device = p->d;
                lr.size = GP_GRANULE_BYTES;
                lr.has_granules = true;
                lr.granules = (uint32_t) batch;
                lr.has_granules_ahead = ahead != 0;
                lr.granules_ahead = (uint32_t) ahead;
                req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
                req.lease = &lr;
                if (p->sent == 0) {
                        req.n_usage = n_usage;
                        req.usage = u;
                }
                if ((r = gp_conn_send(&c->conn, &req)) < 0)
                        return r;
                p->sent++;
        }
        return 0;
}

/* Takes reply rep of request p->read - 1 (nfds descriptors in fds): its granules become spares. Locked. */
static void pipe_take(gpupool_client *c, struct lease_pipe *p, Gpupool__Envelope *rep, int *fds, size_t nfds) {
        const Gpupool__LeaseReply *l = rep->lease_reply;
        uint64_t ids[GP_MAX_LEASE_GRANULES], ahead, n = pipe_batch(p, p->read - 1, &ahead);
        size_t got = l->segment_id ? 1 + l->n_more_segment_ids : 0;    /* id 0: none came (granules ahead only) */
        int r = -EPROTO;

        if (l->segment_size != GP_GRANULE_BYTES || got < n || got > n + ahead || nfds != got ||
            (!got && l->n_more_segment_ids)) {
                for (size_t i = 0; i < nfds; i++)
                        close(fds[i]);
                client_set_error(c, "gpupoold answered a lease of %llu granules (and up to %llu more) with %zu segments "
                                    "of %llu bytes and %zu descriptors", (unsigned long long) n,
                                 (unsigned long long) ahead, got, (unsigned long long) l->segment_size, nfds);
        } else if (!got) {
                return;
        } else {
                for (size_t i = 0; i < got; i++)
                        ids[i] = i ? l->more_segment_ids[i - 1] : l->segment_id;
                r = client_grow_adopt(c, p->d, ids, fds, got);
                if (r == 0) {
                        p->obtained += got;
                        return;
                }
        }
        /* None taken: the daemon takes them back, but for one this process held already. */
        pipe_fail(p, r, c->error);
        if (l->segment_id)
                refused_segments(c, l, &p->back);
}

/*
 * Leases n granules on device d, and up to ahead more where the daemon has them at once, as
 * spares of its ranges: a request per GP_MAX_LEASE_GRANULES, sent back to back
 * (CLIENT_PIPELINE), the lock let go while they are out. After a failure no request more
 * goes, the replies of those out are read, and what they bring is a spare too (the caller
 * gives them back). Returns 0 or the first failure's negative errno with the error set;
 * *ret_obtained says how many came either way. Locked.
 */
static int lease_granules(gpupool_client *c, unsigned d, uint64_t n, uint64_t ahead, uint64_t *ret_obtained) {
        struct lease_pipe p = { .d = d, .n = n, .ahead = ahead };
        Gpupool__Usage u[CLIENT_MAX_DEVICES], *ptrs[CLIENT_MAX_DEVICES];
        size_t n_usage;

        /*
         * The last request asks for what is left after the others' full packets, or, where the
         * granules ahead need more room than that leaves, for one granule in a request of its own.
         */
        p.last = n ? (n - 1) % GP_MAX_LEASE_GRANULES + 1 : 0;        /* n 0: one request, of granules ahead only */
        p.requests = n ? (n + GP_MAX_LEASE_GRANULES - 1) / GP_MAX_LEASE_GRANULES : 1;
        if (ahead > GP_MAX_LEASE_GRANULES - p.last && p.last > 1) {
                p.last = 1;
                p.requests++;
        }
        *ret_obtained = 0;
        client_conn_wait(c);    /* an adoption under way ends with the daemon back */
        if (client_daemon_gone(c))
                return daemon_gone_error(c);
        n_usage = client_usage(c, u, ptrs);
        client_conn_take(c);
        while (p.read < p.sent || (!p.r && p.sent < p.requests)) {
                int fds[GP_MAX_LEASE_GRANULES];
                Gpupool__Envelope *rep = NULL;
                size_t nfds = 0;
                bool reading;
                int rs = 0, r = 0;

                pthread_mutex_unlock(&c->lock);
                if (!p.r)
                        rs = pipe_send(c, &p, ptrs, n_usage);
                reading = p.read < p.sent;
                if (reading)
                        r = gp_conn_reply_fds(&c->conn, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, &rep, fds,
                                              GP_MAX_LEASE_GRANULES, &nfds);
                pthread_mutex_lock(&c->lock);
                if (rs < 0)
                        pipe_fail(&p, rs, c->conn.error);
                if (!reading)
                        continue;       /* nothing went: the failure ends the loop */
                if (r < 0 && c->conn.broken) {
                        /* No reply more can be read; what the daemon leased it counts until this handle starts anew. */
                        pipe_fail(&p, r, c->conn.error);
                        break;
                }
                p.read++;
                if (r < 0)
                        pipe_fail(&p, r, c->conn.error);        /* refused: the others' replies come still */
                else
                        pipe_take(c, &p, rep, fds, nfds);
                if (rep)
                        gpupool__envelope__free_unpacked(rep, NULL);
        }
        client_conn_give(c);
        if (p.r)
                client_set_error(c, "%s", p.why);
        if (p.back.n || p.back.lost)
                client_returns_send(c, &p.back);
        *ret_obtained = p.obtained;
        /* The daemon found gone says so; a timeout and a reply out of step keep their own. */
        if (p.r < 0 && p.r != -ETIMEDOUT && p.r != -EPROTO && client_daemon_gone(c))
                return daemon_gone_error(c);
        return p.r;
}

/* Spares of device *arg, to give back (client_return_taken()). */
static size_t take_spares(gpupool_client *c, const void *arg, uint64_t want, uint64_t *ids, size_t max, uint64_t *ret_bytes) {
        uint64_t left = want / GP_GRANULE_BYTES;
        size_t n = client_grow_take_spares(c, *(const unsigned *) arg, ids, left < max ? left : max);

        *ret_bytes = n * GP_GRANULE_BYTES;
        return n;
}

/*
 * After a lease for a block of size bytes that lacked lacking granules was refused: the
 * obtained granules leased for it before go back at once, and the error says so, the
 * daemon's sentence kept. Locked.
 */
static void return_leased(gpupool_client *c, unsigned d, uint64_t size, uint64_t lacking, uint64_t obtained) {
        char why[sizeof(c->error)];

        snprintf(why, sizeof(why), "%s", c->error);
        (void) client_return_taken(c, take_spares, &d, obtained * GP_GRANULE_BYTES);
        client_set_error(c, "cannot allocate %llu bytes on device %u (%llu more granules than it had leased, asked for "
                            "in leases of up to %d): %s", (unsigned long long) size, d, (unsigned long long) lacking,
                         GP_MAX_LEASE_GRANULES, why);
}

/*
 * Maps what block hb of device d lacks, leasing the granules it needs first, with the lock
 * let go while a lease is out (another thread may meanwhile take or free granules: counted
 * again after each). Returns 0 or a negative errno with the error set. Locked.
 */
static int grow_map_block(gpupool_client *c, unsigned d, struct heap_block *hb) {
        struct granule_plan p;
        uint64_t obtained = 0, got, over;
        bool drained = false, leased = false, fenced_all = false;
        int r;

        /* Counted again after each lease: while it was out, other threads may have taken granules, or freed some. */
        while (client_grow_plan(c, hb, &p)) {
                if (!p.must && leased)
                        break;          /* idle granules move for the rest */
                if (!drained) {
                        /* Blocks the threads' caches park, and stream-ordered frees done, may leave granules idle. */
                        drained = true;
                        client_pool_drain(c, true);
                        if (client_stream_pending(c))
                                (void) client_stream_collect(c, STREAM_FENCE_MISS_FREES);
                        continue;
                }
                /* Idle pieces go back first where the granules it must have would pass the budget with them. */
                if (p.must && (over = client_grow_over(c, d, p.must * GP_GRANULE_BYTES, 0)))
                        (void) client_return_pieces(c, d, over);
                /*
                 * Only what it must have can be refused or waited for; the rest comes where the
                 * daemon has it at once (with nothing it must have, the request asks for granules
                 * ahead only), and what does not come is covered by moving idle granules.
                 */
                r = lease_granules(c, d, p.must, p.ahead, &got);
                leased = true;
                if (r < 0 && !p.must) {
                        client_grow_wanted(c, d, false);        /* a daemon without room at once, or none */
                        continue;
                }
                if ((r == -EDQUOT || r == -ENOMEM) && !fenced_all && client_stream_pending(c)) {
                        /* Refused: every stream's frees fenced now, and what has completed may leave granules idle. */
                        fenced_all = true;
                        obtained += got;
                        (void) client_stream_collect(c, 1);
                        continue;
                }
                if (r < 0) {
                        if (obtained + got)
                                return_leased(c, d, hb->size, p.must + obtained, obtained + got);
                        return r;
                }
                if (p.want > p.must)
                        client_grow_wanted(c, d, got >= p.want);
                obtained += got;
        }
        return client_grow_take(c, hb);
}

/*
 * A block the device's range has no room for: larger than the device, or a range that the
 * blocks fragment. The daemon's refusal of a segment that size says why, a limit first, as it
 * would have without the range; if it grants one, it has it back. Returns a negative errno,
 * the error set. Locked.
 */
static int range_full(gpupool_client *c, unsigned d, uint64_t rsize) {
        Gpupool__Envelope *rep;
        uint64_t id;
        size_t nfds;
        int r, fd = -1;

        r = lease_call(c, d, rsize, false, &rep, &fd, 1, &nfds);
        if (r < 0)
                return r;
        id = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (nfds)
                close(fd);
        (void) client_return(c, &id, 1);
        client_set_error(c, "cannot allocate %llu bytes on device %u: its address range in this process is full (the "
                            "device has %llu bytes)", (unsigned long long) rsize, d,
                         (unsigned long long) c->devices[d].total_bytes);
        return -ENOMEM;
}

/*
 * With no daemon to lease from, growing in place: the block carved from the smallest empty
 * piece that holds it, however much larger (a piece's memory cannot become granules), so that a
 * process that freed its blocks goes on allocating within what it holds, as its error says; or
 * NULL. Locked.
 */
static struct heap_block *piece_without_daemon(gpupool_client *c, unsigned d, uint64_t rsize) {
        struct heap *h = &c->devices[d].heap;
        struct heap_segment *pick = NULL;

        if (!client_daemon_gone(c))
                return NULL;
        for (struct heap_segment *s = h->empty_head; s; s = s->empty_next)
                if (s->class == HEAP_CLASS_PIECE && s->size >= rsize && (!pick || s->size < pick->size))
                        pick = s;
        return pick ? heap_alloc_in(h, pick, rsize) : NULL;
}

/*
 * A piece for a block of rsize bytes (c->piece_bytes or more) on device d: an idle one it
 * fits (or one lane holds), else a new one, leased once what the device holds leaves room for
 * it within the budget: idle pieces go back first, the largest first, then granules no block
 * touches. A lease refused for want of room is asked again after every stream's frees are
 * fenced, then after what the process holds empty has gone back. Locked.
 */
static struct heap_block *piece_alloc(gpupool_client *c, unsigned d, uint64_t rsize, uint32_t lane, int *ret) {
        struct heap *h = &c->devices[d].heap;
        uint64_t want = heap_min_segment_bytes(rsize), over;
        struct heap_block *hb;
        struct mapping *m = NULL;
        bool held;

        *ret = 0;
        if ((hb = heap_alloc_on(h, HEAP_CLASS_PIECE, rsize, lane, &held)))
                return hb;
        if (client_stream_pending(c)) {
                (void) client_stream_collect(c, STREAM_FENCE_MISS_FREES);
                if ((hb = heap_alloc_on(h, HEAP_CLASS_PIECE, rsize, lane, &held)))
                        return hb;
        }
        if ((over = client_grow_over(c, d, want, rsize)))
                (void) client_return_pieces(c, d, over);
        if ((over = client_grow_over(c, d, want, rsize)))
                (void) client_return_granules(c, d, over);
        *ret = lease(c, d, rsize, HEAP_CLASS_PIECE, &m);
        if ((*ret == -EDQUOT || *ret == -ENOMEM) && client_stream_pending(c)) {
                (void) client_stream_collect(c, 1);
                if ((hb = heap_alloc_on(h, HEAP_CLASS_PIECE, rsize, lane, &held))) {
                        *ret = 0;
                        return hb;
                }
                *ret = lease(c, d, rsize, HEAP_CLASS_PIECE, &m);
        }
        if ((*ret == -EDQUOT || *ret == -ENOMEM) && client_pool_trim(c, (int) d, UINT64_MAX) == 0)
                *ret = lease(c, d, rsize, HEAP_CLASS_PIECE, &m);
        if (*ret == -ECONNRESET && (hb = piece_without_daemon(c, d, rsize)))
                *ret = 0;
        if (*ret < 0 || hb)
                return hb;
        /* Of the size asked (exact), or, from a daemon before exact, up to a quarter larger: this block's either way. */
        hb = heap_alloc_in(h, &m->hs, rsize);
        if (!hb) {
                /* Added to the heap and carved under the lock, never let go between: only a bug of ours. */
                client_set_error(c, "the process's pool lost the piece it had just leased for %llu bytes",
                                 (unsigned long long) rsize);
                *ret = -EPROTO;
        }
        return hb;
}

/*
 * Carves a block of rsize bytes of class from device d's ranges, where the fewest of its
 * granules are not mapped (client_grow_choice()), or what lane holds there, and maps what it
 * lacks (a held block has its granules mapped); a block of c->piece_bytes or more is a piece
 * (piece_alloc()). Locked.
 */
static struct heap_block *grow_alloc(gpupool_client *c, unsigned d, enum heap_class class, uint64_t rsize, uint32_t lane,
                                     int *ret) {
        struct client_device *dev = &c->devices[d];
        struct heap_choice choice;
        struct heap_block *hb;
        bool held;

        *ret = client_grow_start(c, d);
        if (*ret < 0)
                return NULL;
        /*
         * Larger than the whole device: no granules would ever be enough, and leasing them first
         * took the device's memory for nothing before a "device is full". The daemon's refusal of
         * a segment that size says what a whole segment's would: a limit, or that it can never fit.
         */
        if (rsize > dev->total_bytes) {
                *ret = range_full(c, d, rsize);
                return NULL;
        }
        if (rsize >= c->piece_bytes)
                return piece_alloc(c, d, rsize, lane, ret);
        client_grow_choice(c, d, rsize, &choice);
        hb = heap_alloc_cheapest(&dev->heap, class, rsize, lane, &held, &choice);
        if (!hb) {
                *ret = range_full(c, d, rsize);
                return NULL;
        }
        if (held)
                return hb;
        *ret = grow_map_block(c, d, hb);
        if (*ret < 0) {
                /* Its granules stay as they are, idle or spare, for the next. */
                (void) heap_free(&dev->heap, hb);
                if (*ret == -ECONNRESET && (hb = piece_without_daemon(c, d, rsize))) {
                        *ret = 0;
                        return hb;
                }
                return NULL;
        }
        return hb;
}

/* A block from the heap of device d: free, or held for lane. Locked. */
static struct heap_block *carve(gpupool_client *c, unsigned d, enum heap_class class, uint64_t rsize, uint32_t lane) {
        bool held;

        return heap_alloc_on(&c->devices[d].heap, class, rsize, lane, &held);
}

/*
 * With no daemon to lease from: the block from another class's free memory (a small block in a
 * large segment, a large one in a small segment it fits), so that a process that freed its
 * blocks goes on allocating within what it holds, as its error says; a daemon back serves each
 * class from its own segments again. Locked.
 */
static struct heap_block *carve_any_class(gpupool_client *c, unsigned d, enum heap_class class, uint64_t rsize,
                                          uint32_t lane) {
        struct heap_block *hb = NULL;

        for (int k = 0; k < HEAP_CARVED_CLASSES && !hb; k++)
                if ((enum heap_class) k != class)
                        hb = carve(c, d, (enum heap_class) k, rsize, lane);
        return hb;
}

int client_pool_alloc(gpupool_client *c, unsigned d, int device, uint64_t rsize, void *stream, uint32_t lane,
                      void **ret_ptr) {
        struct client_device *dev = &c->devices[d];
        enum heap_class class = heap_class_of(rsize);
        struct heap_block *hb;
        struct mapping *m;
        struct block *b;
        int r;

        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        if (c->grow) {
                hb = grow_alloc(c, d, class, rsize, lane, &r);
                if (!hb) {
                        free(b);
                        return r;
                }
        } else {
                hb = carve(c, d, class, rsize, lane);
        }
        if (!hb && c->tcaches) {
                /* Blocks parked in the threads' caches may be what splits the free range it needs. */
                client_pool_drain(c, true);
                hb = carve(c, d, class, rsize, lane);
        }
        if (!hb && client_stream_pending(c)) {
                /* Stream-ordered frees held for their streams: fenced, and released where their work has ended. */
                (void) client_stream_collect(c, STREAM_FENCE_MISS_FREES);
                hb = carve(c, d, class, rsize, lane);
        }
        while (!hb && c->conn_busy) {
                /* Another thread's lease is out: what it brings may serve this one too. */
                client_conn_wait(c);
                hb = carve(c, d, class, rsize, lane);
        }
        if (!hb) {
                r = lease(c, d, rsize, class, NULL);
                if ((r == -EDQUOT || r == -ENOMEM) && client_stream_pending(c)) {
                        /* Refused: every stream's frees fenced now, and what has completed may serve it. */
                        (void) client_stream_collect(c, 1);
                        if ((hb = carve(c, d, class, rsize, lane)))
                                r = 0;
                }
                if (!hb && (r == -EDQUOT || r == -ENOMEM)) {
                        /* client_pool_trim() empties the threads' caches first. */
                        /* What this process holds empty counts against its limit and the device: give it back, ask again. */
                        if (dev->heap.empty_bytes && client_pool_trim(c, (int) d, UINT64_MAX) == 0)
                                r = lease(c, d, rsize, class, NULL);
                }
                if (!hb && r == -ECONNRESET && client_daemon_gone(c) && (hb = carve_any_class(c, d, class, rsize, lane)))
                        r = 0;
                if (r < 0) {
                        free(b);
                        return r;
                }
                if (!hb)
                        hb = heap_alloc(&dev->heap, class, rsize);
        }
        m = gp_rb_entry(hb->segment, struct mapping, hs);
        b->hb = hb;
        b->ptr = m->base + hb->offset;
        b->size = hb->size;
        b->mapping = m;
        b->local_device = device;
        b->stream = stream;
        b->epoch = c->epoch;
        b->scope = c->scope.depth ? c->scope.ids[c->scope.depth - 1] : 0;
        r = client_live_insert(c, b);
        if (r < 0) {
                /* Only a bug of ours puts two live blocks at one address. */
                client_set_error(c, "the process's pool handed out a block that is live already");
                b->hb = hb;
                b->mapping = m;
                (void) client_pool_free(c, b);
                return -EPROTO;
        }
        *ret_ptr = b->ptr;
        return 0;
}

int client_pool_free(gpupool_client *c, struct block *b) {
        struct mapping *m = b->mapping;

        if (m->grow)
                client_grow_give(c, b->hb->segment, b->hb->offset, b->hb->size);
        if (heap_free(&c->devices[m->device].heap, b->hb))
                m->emptied_ms = client_now_ms();
        free(b);
        return 0;
}

int client_free_unlinked(gpupool_client *c, struct block *b) {
        if (b->epoch != c->epoch) {
                /* Taken out by a thread while gpupool_reconnect() forgot the session it came from. */
                free(b);
                return 0;
        }
        return client_pool_free(c, b);
}

void client_pool_drain(gpupool_client *c, bool all) {
        client_tcache_drain(c, all, client_free_unlinked);
}

GPUPOOL_EXPORT int gpupool_trim(gpupool_client *c) {
        int r;

        if (!c)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        r = client_pool_trim(c, -1, UINT64_MAX);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT size_t gpupool_cached_bytes(gpupool_client *c) {
        size_t bytes;

        if (!c)
                return 0;
        pthread_mutex_lock(&c->lock);
        bytes = client_pool_free_bytes(c);
        pthread_mutex_unlock(&c->lock);
        return bytes;
}
