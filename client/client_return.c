/*
 * client_return.c: what the process tells gpupoold it holds (Usage, with every lease and
 * return), and what it gives back. Segments (or granules) holding no live block go back once
 * unmapped (ReturnRequest): at the idle time, on gpupool_trim(), when the daemon asks for
 * memory, and after a lease refused for want of room; more than one request's
 * CLIENT_RETURN_BATCH go in requests sent back to back, a round trip per RETURN_WINDOW.
 * Segments a wrong lease reply named wait in a client_returns until the connection is free
 * again. All called locked.
 */
#include "client_return.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client_call.h"
#include "client_grow.h"
#include "client_segment.h"
#include "client_tcache.h"

#define RETURN_WINDOW (CLIENT_PIPELINE * CLIENT_RETURN_BATCH)

/*
 * What a framework's cache holds unused of device d's blocks, as it last said
 * (gpupool_release_report()), within what is in use there (parked: in the threads' caches).
 */
static uint64_t framework_free(gpupool_client *c, unsigned d, uint64_t parked) {
        uint64_t in_use = c->devices[d].heap.in_use_bytes - parked;

        return c->devices[d].framework_free < in_use ? c->devices[d].framework_free : in_use;
}

/*
 * What the process holds free on device d that it could give back when asked: empty segments,
 * or granules no block touches, and what a framework's cache would free (gpupool_release_wait()).
 */
static uint64_t held_free(gpupool_client *c, unsigned d, uint64_t parked) {
        return (c->grow ? client_grow_free_bytes(c, d) : c->devices[d].heap.empty_bytes) + framework_free(c, d, parked);
}

size_t client_usage(gpupool_client *c, Gpupool__Usage *u, Gpupool__Usage **ptrs) {
        uint64_t parked[CLIENT_MAX_DEVICES];
        size_t n = 0;

        /* The threads' caches hold blocks the application freed: not in use. */
        client_tcache_bytes(c, parked, NULL);
        for (unsigned d = 0; d < c->device_count; d++) {
                struct client_device *dev = &c->devices[d];
                const struct heap *h = &dev->heap;

                /* A device it gave everything back on is reported once more, as empty. */
                if (!h->segment_count && !dev->reported_in_use && !dev->reported_held_free)
                        continue;
                gpupool__usage__init(&u[n]);
                u[n].device = d;
                u[n].in_use_bytes = h->in_use_bytes - parked[d] - framework_free(c, d, parked[d]);
                u[n].held_free_bytes = held_free(c, d, parked[d]);
                dev->reported_in_use = u[n].in_use_bytes;
                dev->reported_held_free = u[n].held_free_bytes;
                ptrs[n] = &u[n];
                n++;
        }
        return n;
}

bool client_usage_changed(gpupool_client *c) {
        uint64_t parked[CLIENT_MAX_DEVICES];

        client_tcache_bytes(c, parked, NULL);
        for (unsigned d = 0; d < c->device_count; d++) {
                const struct client_device *dev = &c->devices[d];

                if (dev->heap.in_use_bytes - parked[d] - framework_free(c, d, parked[d]) != dev->reported_in_use ||
                    held_free(c, d, parked[d]) != dev->reported_held_free)
                        return true;
        }
        return false;
}

/* Sends the ReturnRequest of ids[i, i + CLIENT_RETURN_BATCH) of n, the usage u (n_usage of it) with the last. Locked. */
static int return_send(gpupool_client *c, const uint64_t *ids, size_t n, size_t i, Gpupool__Usage **u, size_t n_usage) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;

        rr.segment_ids = (uint64_t *) ids + i;
        rr.n_segment_ids = n - i < CLIENT_RETURN_BATCH ? n - i : CLIENT_RETURN_BATCH;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        req.return_segments = &rr;
        if (i + rr.n_segment_ids == n) {
                /* Last, so that the daemon hears what the process holds once every segment is back. */
                req.n_usage = n_usage;
                req.usage = u;
        }
        return gp_conn_send(&c->conn, &req);
}

/* The first failure is the one reported: its errno into *r and its sentence into the handle's error. Locked. */
static void return_fail(gpupool_client *c, int *r, int failure) {
        if (*r)
                return;
        *r = failure;
        client_set_error(c, "%s", c->conn.error);
}

int client_return(gpupool_client *c, const uint64_t *ids, size_t n) {
        Gpupool__Usage u[CLIENT_MAX_DEVICES], *ptrs[CLIENT_MAX_DEVICES];
        size_t n_usage, requests = (n + CLIENT_RETURN_BATCH - 1) / CLIENT_RETURN_BATCH, sent = 0, read = 0;
        int r = 0, rs;

        client_conn_wait(c);
        n_usage = client_usage(c, u, ptrs);
        /* Sent back to back, up to CLIENT_PIPELINE unanswered; after a failure none more goes, and those out are read. */
        while (read < sent || (r == 0 && sent < requests)) {
                Gpupool__Envelope *rep;
                size_t nfds;
                int rr;

                while (r == 0 && sent < requests && sent - read < CLIENT_PIPELINE) {
                        if ((rs = return_send(c, ids, n, sent * CLIENT_RETURN_BATCH, ptrs, n_usage)) < 0)
                                return_fail(c, &r, rs);
                        else
                                sent++;
                }
                if (read == sent)
                        break;
                rr = gp_conn_reply_fds(&c->conn, GPUPOOL__ENVELOPE__BODY_RETURN_REPLY, &rep, NULL, 0, &nfds);
                if (rr < 0)
                        return_fail(c, &r, rr);
                if (rr < 0 && c->conn.broken)
                        break;          /* no reply more can be read */
                read++;
                /* Unmapped already either way: one the daemon did not know is its to sort out. */
                if (rr == 0)
                        gpupool__envelope__free_unpacked(rep, NULL);
        }
        c->round_trips = c->conn.trips;
        return r;
}

/* Leaves out of ids (n, unmapped already) those of no daemon (CLIENT_ORPHAN): nobody takes them back. Returns how many stay. */
static size_t daemon_ids(uint64_t *ids, size_t n) {
        size_t kept = 0;

        for (size_t i = 0; i < n; i++)
                if (!(ids[i] & CLIENT_ORPHAN))
                        ids[kept++] = ids[i];
        return kept;
}

/* Takes empty piece s out of the pool: its id into ids[*n], its bytes added to *bytes. */
static void take_piece(gpupool_client *c, struct heap_segment *s, uint64_t *ids, size_t *n, uint64_t *bytes) {
        struct mapping *m = gp_rb_entry(s, struct mapping, hs);

        (void) heap_remove(s);
        ids[(*n)++] = m->segment_id;
        *bytes += m->size;
        client_mapping_drop(c, m);
}

size_t client_take_pieces(gpupool_client *c, int device, uint64_t want, uint64_t before_ms, bool largest, uint64_t *ids,
                          size_t max, uint64_t *ret_bytes) {
        uint64_t bytes = 0;
        size_t n = 0;

        for (unsigned d = 0; d < c->device_count && n < max && bytes < want; d++) {
                if (device >= 0 && (unsigned) device != d)
                        continue;
                while (n < max && bytes < want) {
                        struct heap_segment *pick = NULL;

                        /* The empty list is oldest emptied first; the ranges in it are no pieces. */
                        for (struct heap_segment *s = c->devices[d].heap.empty_head; s; s = s->empty_next) {
                                if (s->class != HEAP_CLASS_PIECE || gp_rb_entry(s, struct mapping, hs)->emptied_ms > before_ms)
                                        continue;
                                if (!pick || (largest && s->size > pick->size))
                                        pick = s;
                                if (!largest)
                                        break;
                        }
                        if (!pick)
                                break;
                        take_piece(c, pick, ids, &n, &bytes);
                }
        }
        *ret_bytes = bytes;
        return n;
}

size_t client_take_empty(gpupool_client *c, int device, uint64_t want, uint64_t before_ms, uint64_t *ids, size_t max,
                         uint64_t *ret_bytes) {
        uint64_t bytes = 0;
        size_t n = 0;

        if (c->grow) {
                uint64_t more = 0;

                /* Pieces first: one is gigabytes, where granules go back 2 MiB at a time. */
                n = client_take_pieces(c, device, want, before_ms, false, ids, max, &bytes);
                if (n < max && bytes < want)
                        n += client_grow_take_free(c, device, want - bytes, before_ms, ids + n, max - n, &more);
                if (ret_bytes)
                        *ret_bytes = bytes + more;
                return daemon_ids(ids, n);
        }
        for (unsigned d = 0; d < c->device_count && n < max && bytes < want; d++) {
                struct heap *h = &c->devices[d].heap;
                struct heap_segment *s;

                if (device >= 0 && (unsigned) device != d)
                        continue;
                /* Oldest emptied first: the newest are the likeliest to serve the next allocations. */
                while (n < max && bytes < want && (s = heap_oldest_empty(h))) {
                        struct mapping *m = gp_rb_entry(s, struct mapping, hs);

                        if (m->emptied_ms > before_ms)
                                break;
                        (void) heap_remove(s);
                        ids[n++] = m->segment_id;
                        bytes += m->size;
                        client_mapping_drop(c, m);
                }
        }
        if (ret_bytes)
                *ret_bytes = bytes;
        return daemon_ids(ids, n);
}

int client_return_taken(gpupool_client *c, client_take_fn take, const void *arg, uint64_t want) {
        uint64_t batch[CLIENT_RETURN_BATCH], *ids = malloc(RETURN_WINDOW * sizeof(*ids)), bytes = 0;
        size_t cap = ids ? RETURN_WINDOW : CLIENT_RETURN_BATCH, n, got = 0;
        bool more = true;
        int r = 0;

        if (!ids)
                ids = batch;
        while (r == 0 && more && bytes < want) {
                for (n = 0; more && n < cap && bytes < want; n += got) {
                        uint64_t b, max = cap - n < CLIENT_RETURN_BATCH ? cap - n : CLIENT_RETURN_BATCH;

                        got = take(c, arg, want - bytes, ids + n, max, &b);
                        bytes += b;
                        more = got == max;
                }
                if (n)
                        r = client_return(c, ids, n);
        }
        if (ids != batch)
                free(ids);
        return r;
}

/* Empty segments (client_take_empty()), to give back (client_return_taken()). */
struct take_empty {
        int device;
        uint64_t before_ms;
};

static size_t take_empty(gpupool_client *c, const void *arg, uint64_t want, uint64_t *ids, size_t max, uint64_t *ret_bytes) {
        const struct take_empty *t = arg;

        return client_take_empty(c, t->device, want, t->before_ms, ids, max, ret_bytes);
}

/* client_return_taken() once the connection is free; -ECONNRESET with the daemon gone. */
static int return_when_free(gpupool_client *c, client_take_fn take, const void *arg, uint64_t want) {
        /*
         * The connection first: an adoption under way renames what it would take (and a lease
         * out may bring more). From here on the lock is not let go until the ids have gone.
         */
        client_conn_wait(c);
        /* Nobody to give it to: cuda-vmm memory stays the process's until it reconnects. */
        if (client_daemon_gone(c))
                return -ECONNRESET;
        return client_return_taken(c, take, arg, want);
}

int client_return_empty(gpupool_client *c, int device, uint64_t want, uint64_t before_ms) {
        struct take_empty t = { device, before_ms };

        return return_when_free(c, take_empty, &t, want);
}

/* Granules no block touches on a device (client_return_granules()). */
static size_t take_granules(gpupool_client *c, const void *arg, uint64_t want, uint64_t *ids, size_t max, uint64_t *ret_bytes) {
        size_t n = client_grow_take_free(c, (int) *(const unsigned *) arg, want, UINT64_MAX, ids, max, ret_bytes);

        return daemon_ids(ids, n);
}

int client_return_granules(gpupool_client *c, unsigned d, uint64_t want) {
        return return_when_free(c, take_granules, &d, want);
}

/* Empty pieces of a device, the largest first (client_return_pieces()). */
static size_t take_largest(gpupool_client *c, const void *arg, uint64_t want, uint64_t *ids, size_t max, uint64_t *ret_bytes) {
        size_t n = client_take_pieces(c, (int) *(const unsigned *) arg, want, UINT64_MAX, true, ids, max, ret_bytes);

        return daemon_ids(ids, n);
}

int client_return_pieces(gpupool_client *c, unsigned d, uint64_t want) {
        return return_when_free(c, take_largest, &d, want);
}

void client_returns_add(struct client_returns *b, uint64_t id) {
        if (b->n == b->cap) {
                size_t cap = b->cap ? 2 * b->cap : CLIENT_RETURN_BATCH;
                uint64_t *ids = realloc(b->ids, cap * sizeof(*ids));

                if (!ids) {
                        b->lost++;
                        return;
                }
                b->ids = ids;
                b->cap = cap;
        }
        b->ids[b->n++] = id;
}

void client_returns_send(gpupool_client *c, struct client_returns *b) {
        char why[sizeof(c->error)];

        snprintf(why, sizeof(why), "%s", c->error);
        if (b->n)
                (void) client_return(c, b->ids, b->n);
        if (b->lost)
                client_set_error(c, "%s (and %zu segments the daemon counts as this process's could not be given back: "
                                    "out of memory)", why, b->lost);
        else
                client_set_error(c, "%s", why);
        free(b->ids);
        *b = (struct client_returns) { 0 };
}
