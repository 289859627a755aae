/*
 * client_grow.c: segments that grow in place. On a device, the process reserves one virtual
 * range per heap class, twice the device's size each, and the device's heap carves each as a
 * single segment, so a block is never confined to one leased segment: a range only ever
 * grows. Under the blocks, common/granule.c keeps which 2 MiB granules are mapped, and with
 * what: the physical granules are 2 MiB segments the daemon leases up to 128 at a time
 * (LeaseRequest.granules), interchangeable, and named here by their index in the device's
 * table of them.
 *
 * Descriptors, as the handle's memory seam takes them (client_mem.c):
 *
 *   host      each granule's memfd is mapped once at a parking spot of its own (a third range
 *             after the two), and kept for a daemon after this one to adopt (client_fd_keep(),
 *             client_resume()). Mapping it under a block makes a second mapping of
 *             the same pages (mremap() with an old size of 0, which duplicates a shared
 *             mapping); unmapping puts the reservation back over it. The parking mapping keeps
 *             the memory until the granule goes back. No step leaves a hole another mmap()
 *             of the process could take.
 *   cuda-vmm  each descriptor is imported (cuMemImportFromShareableHandle) and kept, as on
 *             host; the handle is mapped under blocks (cuMemMap; each run of granules a block
 *             maps side by side is made accessible in one cuMemSetAccess, as PyTorch's
 *             expandable segments do) and unmapped (cuMemUnmap) as they need it, and released
 *             when the granule goes back.
 */
#define _GNU_SOURCE
#include "client_grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_keep.h"
#include "client_mem.h"
#include "client_segment.h"
#include "granule.h"
#include "rbtree.h"
#include "wire.h"

#define G GP_GRANULE_BYTES

/* A physical granule the process holds, or a free entry. */
struct grow_granule {
        bool held;
        uint64_t segment_id;            /* the daemon's (CLIENT_ORPHAN set: no daemon's, after a refused adoption) */
        int fd;                         /* its descriptor, kept for a later daemon to adopt (-1: none) */
        client_mem_handle handle;       /* as the memory seam imported it */
        uint64_t next_free;             /* free entries: the next, or UINT64_MAX */
        struct gp_rb_node by_id;        /* held: in the device's index by segment id */
};

struct client_grow {
        gpupool_client *client;
        unsigned device;
        struct granule_set set;
        struct granule_range range[HEAP_CARVED_CLASSES];
        struct mapping view[HEAP_CARVED_CLASSES];  /* each range as its blocks see it: hs is in the device's heap */
        uint8_t *base;                  /* the reservation: the ranges, then the parking spots (mem->parks) */
        uint64_t range_bytes, reserved_bytes;
        uint8_t *park;                  /* mem->parks: granule i is parked at park + i * G */
        struct grow_granule *granules;  /* one per parking spot: as many as the device has granules */
        uint64_t granule_cap, free_head;
        uint64_t used;                  /* entries ever taken: those past it are free, and untouched (calloc()'s pages) */
        struct gp_rb_tree by_id;        /* the held granules by segment id (but while an adoption renames them) */
        uint64_t peak_in_use;           /* the most the device's blocks held since granules last went back */
        bool want_none;                 /* the daemon had fewer granules to spare than wanted: ask again after a return */
};

static int cmp_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        uint64_t a = gp_rb_entry(x, struct grow_granule, by_id)->segment_id;
        uint64_t b = gp_rb_entry(y, struct grow_granule, by_id)->segment_id;

        return a < b ? -1 : a > b;
}

static int grow_map(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys);
static void grow_unmap(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys);
static int grow_obtain(void *ctx, uint64_t n, uint64_t *phys);
static uint64_t grow_now(void *ctx);
static int grow_access(void *ctx, struct granule_range *r, uint64_t first, uint64_t n);

static const struct granule_ops grow_ops = { grow_map, grow_unmap, grow_obtain, grow_now, grow_access };

/* The range of a block's segment. */
static struct granule_range *range_of(struct client_grow *g, const struct heap_segment *s) {
        return &g->range[s->class];
}

static uint8_t *granule_addr(struct client_grow *g, struct granule_range *r, uint64_t k) {
        return g->view[r - g->range].base + k * G;
}

static int grow_map(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        struct client_grow *g = ctx;
        gpupool_client *c = g->client;

        /* grow_access() follows */
        return c->mem->map(c, g->device, granule_addr(g, r, k), G, g->granules[phys].handle, g->granules[phys].fd);
}

static void grow_unmap(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        struct client_grow *g = ctx;
        gpupool_client *c = g->client;

        (void) phys;
        (void) c->mem->unmap(c, g->device, granule_addr(g, r, k), G);
}

static int grow_obtain(void *ctx, uint64_t n, uint64_t *phys) {
        struct client_grow *g = ctx;

        /* The pool leases granules ahead of granule_take() (it lets go of the lock to): one lacking is a bug of ours. */
        (void) n, (void) phys;
        client_set_error(g->client, "the process's pool mapped a block it had not leased the granules of");
        return -EPROTO;
}

static uint64_t grow_now(void *ctx) {
        (void) ctx;
        return client_now_ms();
}

/* A run of granules just mapped side by side, made readable and writable in one call (cuda-vmm: cuMemSetAccess). */
static int grow_access(void *ctx, struct granule_range *r, uint64_t first, uint64_t n) {
        struct client_grow *g = ctx;
        gpupool_client *c = g->client;

        return c->mem->access(c, g->device, granule_addr(g, r, first), n * G);
}

/* Lets go of what the process holds of granule i: what the seam imported, and its kept descriptor. */
static void granule_let_go(struct client_grow *g, uint64_t i) {
        gpupool_client *c = g->client;

        c->mem->release(c, g->device, g->granules[i].handle, G);
        client_fd_release(g->granules[i].fd);
}

/*
 * Unmaps and frees everything of g, set up in full or in part: its ranges leave the device's
 * heap with their blocks (their holders are forgotten), and its granules are let go.
 */
static void grow_free(struct client_grow *g) {
        gpupool_client *c = g->client;

        /* Its maps and unmaps stay counted (gpupool_grow_stats()). */
        c->granules_before.mapped += g->set.maps;
        c->granules_before.unmapped += g->set.unmaps;
        for (int k = 0; k < HEAP_CARVED_CLASSES; k++) {
                struct granule_range *r = &g->range[k];

                if (g->view[k].hs.heap)
                        (void) heap_drop(&g->view[k].hs);
                /* Mappings go one by one: a driver frees no reservation with a mapping in it. */
                for (uint64_t i = 0; i < r->count; i++)
                        if (r->mapped[i / 64] >> (i % 64) & 1)
                                (void) c->mem->unmap(c, g->device, granule_addr(g, r, i), G);
                granule_range_destroy(r);
        }
        for (uint64_t i = 0; i < g->used; i++)
                if (g->granules[i].held)
                        granule_let_go(g, i);
        c->mem->unreserve(c, g->device, g->base, g->reserved_bytes);
        granule_set_destroy(&g->set);
        free(g->granules);
        free(g);
}

int client_grow_start(gpupool_client *c, unsigned d) {
        struct client_device *dev = &c->devices[d];
        struct client_grow *g;
        uint64_t granules = (dev->total_bytes + G - 1) / G;
        int r;

        if (dev->grow)
                return 0;
        if (!granules) {
                client_set_error(c, "device %u has no memory", d);
                return -ENOMEM;
        }
        g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->client = c;
        g->device = d;
        g->granule_cap = granules;
        gp_rb_init(&g->by_id, cmp_id);
        /* Twice the device per class: room for what the heap's best fit leaves between blocks. */
        g->range_bytes = 2 * granules * G;
        g->reserved_bytes = HEAP_CARVED_CLASSES * g->range_bytes + (c->mem->parks ? granules * G : 0);
        g->granules = calloc(granules, sizeof(*g->granules));
        if (!g->granules) {
                free(g);
                return -ENOMEM;
        }
        g->free_head = UINT64_MAX;     /* entries are taken from used up, then from those freed */
        r = c->mem->reserve(c, d, g->reserved_bytes, G, &g->base);
        if (r < 0) {
                free(g->granules);
                free(g);
                return r;
        }
        g->park = g->base + HEAP_CARVED_CLASSES * g->range_bytes;
        (void) granule_set_init(&g->set, G, &grow_ops, g);
        for (int k = 0; k < HEAP_CARVED_CLASSES; k++) {
                struct mapping *m = &g->view[k];

                m->base = g->base + (uint64_t) k * g->range_bytes;
                m->size = g->range_bytes;
                m->device = d;
                m->grow = true;
                m->fd = -1;
                r = granule_range_init(&g->set, &g->range[k], g->range_bytes);
                /* Ids of its own, above any the daemon gives: they order equal free blocks only. */
                if (r == 0)
                        r = heap_add(&dev->heap, &m->hs, UINT64_MAX - (uint64_t) k, g->range_bytes, (enum heap_class) k);
                /* A block freed on a stream keeps its granules until its fence: held whole, never merged or split. */
                if (r == 0)
                        heap_hold_whole(&m->hs);
                if (r < 0) {
                        grow_free(g);
                        return r;
                }
        }
        dev->grow = g;
        return 0;
}

/* Device d's pieces: the bytes they hold, what their blocks were carved for, and the bytes of those empty. */
static void pieces_of(gpupool_client *c, unsigned d, uint64_t *ret_held, uint64_t *ret_asked, uint64_t *ret_empty) {
        const struct heap *h = &c->devices[d].heap;
        uint64_t held = 0, asked = 0, empty = 0;

        /*
         * The heap's segments are the ranges and the pieces, a few at most (each is gigabytes);
         * with none (the ranges alone), nothing to look at: every allocation plans its granules.
         */
        for (const struct heap_segment *s = h->segment_count > HEAP_CARVED_CLASSES ? h->segments : NULL; s; s = s->next) {
                if (s->class != HEAP_CLASS_PIECE)
                        continue;
                held += s->size;
                if (s->live_blocks)
                        asked += s->first->asked;       /* its one block */
                else if (!s->held_blocks)
                        empty += s->size;
        }
        if (ret_held)
                *ret_held = held;
        if (ret_asked)
                *ret_asked = asked;
        if (ret_empty)
                *ret_empty = empty;
}

/* The most device d's blocks held since granules last went back, now counted in. */
static uint64_t peak_of(struct client_device *dev) {
        struct client_grow *g = dev->grow;

        /* What its blocks were carved for, as bench/frag.c's model counts it (the blocks the threads' caches park too). */
        if (dev->heap.asked_bytes > g->peak_in_use)
                g->peak_in_use = dev->heap.asked_bytes;
        return g->peak_in_use;
}

uint64_t client_grow_over(gpupool_client *c, unsigned d, uint64_t more, uint64_t in_use_more) {
        struct client_device *dev = &c->devices[d];
        uint64_t peak = peak_of(dev), pieces, held, cap;

        if (dev->heap.asked_bytes + in_use_more > peak)
                peak = dev->heap.asked_bytes + in_use_more;
        pieces_of(c, d, &pieces, NULL, NULL);
        cap = peak + peak / GRANULE_KEEP_DIVISOR;
        held = dev->grow->set.held * G + pieces + more;
        return held > cap ? held - cap : 0;
}

uint64_t client_grow_plan(gpupool_client *c, const struct heap_block *hb, struct granule_plan *p) {
        unsigned d = gp_rb_entry(hb->segment, struct mapping, hs)->device;
        struct client_device *dev = &c->devices[d];
        struct client_grow *g = dev->grow;
        uint64_t peak = peak_of(dev), pieces, asked, off;

        /*
         * The granules' budget is what the pieces leave of it: over the peak less the pieces'
         * bytes (so that the two together keep within the budget over the peak), for the blocks
         * on granules alone.
         */
        pieces_of(c, d, &pieces, &asked, NULL);
        off = pieces * GRANULE_KEEP_DIVISOR / (GRANULE_KEEP_DIVISOR + 1);
        peak = peak > off ? peak - off : 0;
        granule_plan(range_of(g, hb->segment), hb->offset, hb->size, g->want_none ? 0 : peak,
                     dev->heap.asked_bytes - asked, p);
        return p->must + p->ahead;
}

void client_grow_wanted(gpupool_client *c, unsigned d, bool all_came) {
        c->devices[d].grow->want_none = !all_came;
}

/* Lets go of granule i's memory (unmapped everywhere but its parking spot) and frees its entry. */
static void granule_drop(struct client_grow *g, uint64_t i) {
        gp_rb_remove(&g->by_id, &g->granules[i].by_id);
        granule_let_go(g, i);
        g->granules[i] = (struct grow_granule) { .next_free = g->free_head, .fd = -1 };
        g->free_head = i;
}

/* Takes a free entry for segment id and fills it from fd (closed). Returns its index, or a negative errno. */
static int64_t granule_new(struct client_grow *g, uint64_t id, int fd) {
        gpupool_client *c = g->client;
        uint64_t i = g->free_head != UINT64_MAX ? g->free_head : g->used;
        int r = 0;

        if (i == g->granule_cap) {
                close(fd);
                client_set_error(c, "gpupoold leased more granules of device %u than it has", g->device);
                return -EPROTO;
        }
        if (client_mapping_by_id(c, id) || client_grow_holds(c, id)) {
                close(fd);
                client_set_error(c, "gpupoold leased segment %llu, which this process holds already",
                                 (unsigned long long) id);
                return -EPROTO;
        }
        r = c->mem->import(c, g->device, fd, G, g->park + i * G, &g->granules[i].handle);
        if (r < 0) {
                close(fd);
                return r;
        }
        g->granules[i].fd = -1;
        if (!c->mem->adopted_held)
                g->granules[i].fd = client_fd_keep(fd);        /* for a daemon after this one to adopt */
        else
                close(fd);      /* the handle holds the memory; a daemon after this one adopts it by our word */
        if (i == g->used)
                g->used++;
        else
                g->free_head = g->granules[i].next_free;
        g->granules[i].held = true;
        g->granules[i].segment_id = id;
        (void) gp_rb_insert(&g->by_id, &g->granules[i].by_id);   /* not there: looked for above */
        return (int64_t) i;
}

int client_grow_adopt(gpupool_client *c, unsigned d, const uint64_t *ids, const int *fds, size_t n) {
        struct client_grow *g = c->devices[d].grow;
        uint64_t phys[GP_MAX_LEASE_GRANULES];
        size_t ok = 0, used = 0;
        int r = 0;

        if (n > GP_MAX_LEASE_GRANULES) {
                client_set_error(c, "gpupoold leased %zu granules at once, more than %d", n, GP_MAX_LEASE_GRANULES);
                r = -EPROTO;
        }
        while (r == 0 && used < n) {
                int64_t i = granule_new(g, ids[used], fds[used]);

                used++;
                if (i < 0)
                        r = (int) i;
                else
                        phys[ok++] = (uint64_t) i;
        }
        if (r == 0 && (r = granule_add_spares(&g->set, phys, n)) < 0)
                client_set_error(c, "out of memory for the records of %zu granules", n);
        if (r < 0) {
                /* None taken: the daemon has them all back. */
                while (ok > 0)
                        granule_drop(g, phys[--ok]);
                for (; used < n; used++)
                        close(fds[used]);
                return r;
        }
        c->segments_imported += n;
        return 0;
}

bool client_grow_holds(gpupool_client *c, uint64_t id) {
        struct grow_granule key = { .segment_id = id };

        for (unsigned d = 0; d < c->device_count; d++)
                if (c->devices[d].grow && gp_rb_find(&c->devices[d].grow->by_id, &key.by_id))
                        return true;
        return false;
}

void client_grow_choice(gpupool_client *c, unsigned d, uint64_t rsize, struct heap_choice *choice) {
        granule_choice(c->devices[d].grow->range, rsize, choice);
}

int client_grow_take(gpupool_client *c, struct heap_block *hb) {
        struct client_grow *g = c->devices[gp_rb_entry(hb->segment, struct mapping, hs)->device].grow;

        return granule_take(range_of(g, hb->segment), hb->offset, hb->size);
}

void client_grow_give(gpupool_client *c, struct heap_segment *s, uint64_t offset, uint64_t size) {
        struct client_grow *g = c->devices[gp_rb_entry(s, struct mapping, hs)->device].grow;

        granule_give(range_of(g, s), offset, size);
}

/* Lets go of the n granules of g taken out of its set (phys), their segment ids into ids. */
static void drop_all(struct client_grow *g, const uint64_t *phys, size_t n, uint64_t *ids) {
        for (size_t i = 0; i < n; i++) {
                ids[i] = g->granules[phys[i]].segment_id;
                granule_drop(g, phys[i]);
        }
}

size_t client_grow_take_free(gpupool_client *c, int device, uint64_t want, uint64_t before_ms, uint64_t *ids, size_t max,
                             uint64_t *ret_bytes) {
        uint64_t phys[CLIENT_RETURN_BATCH];
        size_t n = 0;

        if (max > CLIENT_RETURN_BATCH)
                max = CLIENT_RETURN_BATCH;
        for (unsigned d = 0; d < c->device_count && n < max && (uint64_t) n * G < want; d++) {
                struct client_grow *g = c->devices[d].grow;
                uint64_t left = max - n, got;

                if (!g || (device >= 0 && (unsigned) device != d))
                        continue;
                if (want != UINT64_MAX && (want - (uint64_t) n * G + G - 1) / G < left)
                        left = (want - (uint64_t) n * G + G - 1) / G;
                /* Spares free long enough first (mapped nowhere), then idle granules, the highest first. */
                got = granule_release(&g->set, phys, left, before_ms);
                drop_all(g, phys, got, ids + n);
                n += got;
                if (got) {
                        /* The budget of granule_plan() starts again from what the blocks hold now. */
                        g->peak_in_use = c->devices[d].heap.asked_bytes;
                        g->want_none = false;
                }
        }
        *ret_bytes = (uint64_t) n * G;
        return n;
}

size_t client_grow_take_spares(gpupool_client *c, unsigned d, uint64_t *ids, size_t max) {
        struct client_grow *g = c->devices[d].grow;
        uint64_t phys[CLIENT_RETURN_BATCH];
        size_t n;

        if (!g)
                return 0;
        n = granule_release_spares(&g->set, phys, max < CLIENT_RETURN_BATCH ? max : CLIENT_RETURN_BATCH, UINT64_MAX);
        drop_all(g, phys, n, ids);
        return n;
}

size_t client_grow_kept(gpupool_client *c, unsigned d, struct client_kept *out, size_t max) {
        struct client_grow *g = c->devices[d].grow;
        size_t n = 0;

        for (uint64_t i = 0; g && i < g->used && n < max; i++)
                if (g->granules[i].held)
                        out[n++] = (struct client_kept) { .id = &g->granules[i].segment_id, .fd = g->granules[i].fd,
                                                          .size = G, .renamed = g->granules[i].segment_id };
        return n;
}

void client_grow_index(gpupool_client *c, unsigned d, bool in) {
        struct client_grow *g = c->devices[d].grow;

        for (uint64_t i = 0; g && i < g->used; i++) {
                if (!g->granules[i].held)
                        continue;
                if (in)
                        (void) gp_rb_insert(&g->by_id, &g->granules[i].by_id);
                else
                        gp_rb_remove(&g->by_id, &g->granules[i].by_id);
        }
}

void client_grow_stats(gpupool_client *c, struct gpupool_grow_stats *st) {
        *st = (struct gpupool_grow_stats) { .granules_mapped = c->granules_before.mapped, .granules_unmapped = c->granules_before.unmapped };
        for (unsigned d = 0; d < c->device_count; d++) {
                struct client_grow *g = c->devices[d].grow;

                if (!g)
                        continue;
                st->granules_held += g->set.held;
                st->granules_free += granule_free_count(&g->set);
                st->granules_mapped += g->set.maps;
                st->granules_unmapped += g->set.unmaps;
        }
}

uint64_t client_grow_held(gpupool_client *c, unsigned d) {
        return c->devices[d].grow ? c->devices[d].grow->set.held : 0;
}

uint64_t client_grow_mapped(gpupool_client *c, unsigned d) {
        uint64_t pieces;

        pieces_of(c, d, &pieces, NULL, NULL);
        return client_grow_held(c, d) * G + pieces;
}

uint64_t client_grow_free_bytes(gpupool_client *c, unsigned d) {
        uint64_t empty;

        pieces_of(c, d, NULL, NULL, &empty);
        return (c->devices[d].grow ? granule_free_count(&c->devices[d].grow->set) * G : 0) + empty;
}

void client_grow_forget(gpupool_client *c) {
        for (unsigned d = 0; d < CLIENT_MAX_DEVICES; d++) {
                if (c->devices[d].grow)
                        grow_free(c->devices[d].grow);
                c->devices[d].grow = NULL;
        }
}
