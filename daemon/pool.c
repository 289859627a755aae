/*
 * pool.c: the node's segments on one device (see pool.h for the model; the segment and the pool
 * are in pool_internal.h, shared with pool_check.c, the invariants).
 *
 * Data structures, all intrusive red-black trees so that no operation scans:
 *   pool->segments_by_id         every segment the pool holds from the backend
 *   pool->cache_by_size          cached segments by (size, newest first): lease lookup
 *   pool->cache_by_age           cached segments oldest first: LRU release
 *   owner->segments_by_id        the segments leased to one owner
 *   pool->by_ident               segments whose backend names their memory (mem_ident): what
 *                                adoption checks, so that no memory is the pool's twice
 */
#include "pool.h"
#include "pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policy.h"
#include "wire.h"

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_segment_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct segment, by_id)->id, gp_rb_entry(y, struct segment, by_id)->id);
}

static int cmp_ident(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct segment, ident_node)->ident, gp_rb_entry(y, struct segment, ident_node)->ident);
}

static int cmp_owner_segment(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct segment, owner_node)->id, gp_rb_entry(y, struct segment, owner_node)->id);
}

/* Smallest first; among equal sizes the most recently cached first (its pages are warm). */
static int cmp_cache_size(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct segment *a = gp_rb_entry(x, struct segment, owner_node);
        const struct segment *b = gp_rb_entry(y, struct segment, owner_node);

        if (a->size != b->size)
                return CMP(a->size, b->size);
        return CMP(b->cache_seq, a->cache_seq);
}

static int cmp_cache_age(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct segment, age_node)->cache_seq, gp_rb_entry(y, struct segment, age_node)->cache_seq);
}

uint64_t pool_min_segment_bytes(uint64_t size) {
        return heap_min_segment_bytes(heap_round(size));
}

static uint64_t monotonic_ms(void *ctx) {
        struct timespec ts;

        (void) ctx;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

void pool_set_clock(struct pool *p, uint64_t (*clock_ms)(void *ctx), void *ctx) {
        p->clock_ms = clock_ms;
        p->clock_ctx = ctx;
}

int pool_new(struct backend *backend, unsigned device, uint64_t capacity_bytes, struct pool **ret) {
        struct pool *p = calloc(1, sizeof(*p));

        if (!p)
                return -ENOMEM;
        p->backend = backend;
        p->device = device;
        p->capacity_bytes = capacity_bytes;
        p->clock_ms = monotonic_ms;
        /* The device sits in the top byte, so segment ids are unique across the daemon. */
        p->next_id = ((uint64_t) device << 56) | 1;
        gp_rb_init(&p->segments_by_id, cmp_segment_id);
        gp_rb_init(&p->cache_by_size, cmp_cache_size);
        gp_rb_init(&p->cache_by_age, cmp_cache_age);
        gp_rb_init(&p->zeroing, cmp_owner_segment);
        gp_rb_init(&p->by_ident, cmp_ident);
        *ret = p;
        return 0;
}

/* Names s by its memory (the backend's mem_ident) in pool->by_ident, after a new memory or none. */
static void segment_name(struct pool *p, struct segment *s) {
        if (s->ident)
                gp_rb_remove(&p->by_ident, &s->ident_node);
        s->ident = p->backend->ops->mem_ident ? p->backend->ops->mem_ident(p->backend, p->device, &s->mem) : 0;
        if (s->ident)
                gp_rb_insert(&p->by_ident, &s->ident_node);
}

static void segment_destroy(struct pool *p, struct segment *s) {
        if (s->ident)
                gp_rb_remove(&p->by_ident, &s->ident_node);
        gp_rb_remove(&p->segments_by_id, &s->by_id);
        p->reserved_bytes -= s->size;
        p->backend->ops->mem_destroy(p->backend, p->device, &s->mem, s->size);
        free(s);
}

/* Gives the least recently cached segment back to the backend. Returns its size, 0 if none. */
static uint64_t cache_release_oldest(struct pool *p) {
        struct gp_rb_node *n = gp_rb_first(&p->cache_by_age);
        struct segment *s;
        uint64_t size;

        if (!n)
                return 0;
        s = gp_rb_entry(n, struct segment, age_node);
        gp_rb_remove(&p->cache_by_age, &s->age_node);
        gp_rb_remove(&p->cache_by_size, &s->owner_node);
        p->cached_bytes -= s->size;
        p->fresh_granules -= pool_fresh_granule(s);
        size = s->size;
        segment_destroy(p, s);
        return size;
}

/*
 * What the capacity has left: less what the pool holds and, where the backend cannot tell the
 * device's free memory (the host backend), less what clients charged outside the pool
 * (pool_set_charged()); where it can, the device's room (device_room()) shows that already.
 */
static uint64_t capacity_left(const struct pool *p) {
        uint64_t used = p->reserved_bytes + (p->backend->ops->device_memory ? 0 : p->charged_bytes);

        return p->capacity_bytes > used ? p->capacity_bytes - used : 0;
}

/* Whether size more bytes fit the capacity and, where bounded, room (what the device has free beyond its headroom). */
static bool fits(const struct pool *p, uint64_t size, bool bounded, int64_t room) {
        return size <= capacity_left(p) && (!bounded || (int64_t) size <= room);
}

/*
 * Evicts cached segments, oldest first, until size more bytes fit (fits(); each release adds
 * to room). False if the cache runs out.
 */
static bool make_room(struct pool *p, uint64_t size, bool bounded, int64_t room) {
        while (!fits(p, size, bounded, room)) {
                uint64_t released = cache_release_oldest(p);

                if (!released)
                        return false;
                room += (int64_t) released;
                p->evictions++;
        }
        return true;
}

bool pool_read_device(struct pool *p) {
        struct backend_device_memory m;

        if (!p->backend->ops->device_memory || p->backend->ops->device_memory(p->backend, p->device, &m) < 0)
                return false;
        p->gpu = m;
        p->gpu_known = true;
        return true;
}

/*
 * How much more the pool may take of the device and still leave the headroom free, by the
 * driver now: negative when others (contexts, libraries, programs without gpupool) have taken
 * some of the headroom. False when the backend cannot tell.
 */
static bool device_room(struct pool *p, int64_t *ret) {
        if (!pool_read_device(p))
                return false;
        *ret = (int64_t) p->gpu.free_bytes - (int64_t) p->gpu.headroom_bytes;
        return true;
}

uint64_t pool_keep_headroom(struct pool *p, uint64_t *ret_short) {
        uint64_t bytes = 0, size;
        int64_t room;

        *ret_short = 0;
        if (!device_room(p, &room))
                return 0;
        while (room < 0 && (size = cache_release_oldest(p))) {
                room += (int64_t) size;
                bytes += size;
                p->gpu.free_bytes += size;
                p->headroom_releases++;
        }
        if (room < 0)
                *ret_short = (uint64_t) -room;
        return bytes;
}

uint64_t pool_follow_device(struct pool *p) {
        uint64_t target, seg = 2ULL << 20;

        if (!p->gpu_known || p->gpu.free_bytes + p->reserved_bytes <= p->gpu.headroom_bytes)
                return 0;
        target = (p->gpu.free_bytes + p->reserved_bytes - p->gpu.headroom_bytes) & ~(seg - 1);
        if (target > p->gpu.total_bytes)
                target = p->gpu.total_bytes & ~(seg - 1);
        if (target <= p->capacity_bytes)
                return 0;
        target -= p->capacity_bytes;
        p->capacity_bytes += target;
        return target;
}

void pool_flush(struct pool *p, uint64_t *ret_segments, uint64_t *ret_bytes) {
        uint64_t segments = 0, bytes = p->cached_bytes;

        while (cache_release_oldest(p))
                segments++;
        if (ret_segments)
                *ret_segments = segments;
        if (ret_bytes)
                *ret_bytes = bytes;
}

void pool_free(struct pool *p) {
        struct gp_rb_node *n;

        if (!p)
                return;
        pool_flush(p, NULL, NULL);
        /* Owners are detached first; anything left is released without ceremony. */
        while ((n = gp_rb_first(&p->segments_by_id)))
                segment_destroy(p, gp_rb_entry(n, struct segment, by_id));
        free(p);
}

void pool_owner_attach(struct pool *p, struct pool_owner *o, uint64_t principal) {
        memset(o, 0, sizeof(*o));
        o->pool = p;
        o->principal = principal;
        gp_rb_init(&o->segments_by_id, cmp_owner_segment);
        o->next = p->owners;
        if (p->owners)
                p->owners->prev = o;
        p->owners = o;
}

void pool_owner_set_group(struct pool_owner *o, struct pool_group *g) {
        if (o->group) {
                o->group->reserved_bytes -= o->reserved_bytes;
                o->group->in_use_bytes -= o->reported_in_use_bytes;
        }
        o->group = g;
        if (g) {
                g->reserved_bytes += o->reserved_bytes;
                g->in_use_bytes += o->reported_in_use_bytes;
        }
}

/* Puts an unowned segment into the cache, newest. */
static void cache_insert(struct pool *p, struct segment *s) {
        s->cache_seq = ++p->cache_seq;
        s->cached_at_ms = p->clock_ms(p->clock_ctx);
        gp_rb_insert(&p->cache_by_size, &s->owner_node);
        gp_rb_insert(&p->cache_by_age, &s->age_node);
        p->cached_bytes += s->size;
        p->fresh_granules += pool_fresh_granule(s);
}

/* Takes a segment from its owner; returns the owner. */
static struct pool_owner *segment_take_back(struct segment *s) {
        struct pool_owner *o = s->owner;

        gp_rb_remove(&o->segments_by_id, &s->owner_node);
        o->reserved_bytes -= s->size;
        if (o->group)
                o->group->reserved_bytes -= s->size;
        o->segments--;
        s->owner = NULL;
        return o;
}

/* Moves a segment out of its owner into the cache (or, marked to_backend, back to the backend). */
static void segment_to_cache(struct pool *p, struct segment *s) {
        struct pool_owner *o = segment_take_back(s);

        /* A segment that is, or may come out, sealed against writing is nobody's again. */
        if (s->to_backend || s->sealing || s->sealed) {
                segment_destroy(p, s);
                return;
        }
        s->last_principal = o->principal;
        s->has_principal = true;
        cache_insert(p, s);
}

uint64_t pool_owner_detach(struct pool_owner *o) {
        struct pool *p = o->pool;
        struct gp_rb_node *n;
        uint64_t released = o->reserved_bytes;

        if (!p)
                return 0;
        while ((n = gp_rb_first(&o->segments_by_id)))
                segment_to_cache(p, gp_rb_entry(n, struct segment, owner_node));
        p->reported_in_use_bytes -= o->reported_in_use_bytes;
        if (o->group)
                o->group->in_use_bytes -= o->reported_in_use_bytes;
        if (o->prev)
                o->prev->next = o->next;
        else
                p->owners = o->next;
        if (o->next)
                o->next->prev = o->prev;
        memset(o, 0, sizeof(*o));
        return released;
}

static struct segment *segment_find(const struct pool *p, uint64_t id) {
        struct segment key = { .id = id };
        struct gp_rb_node *n = gp_rb_find(&p->segments_by_id, &key.by_id);

        return n ? gp_rb_entry(n, struct segment, by_id) : NULL;
}

/* o's segment segment_id, or NULL where o leases no such segment. */
static struct segment *leased(const struct pool *p, const struct pool_owner *o, uint64_t segment_id) {
        struct segment *s = segment_find(p, segment_id);

        return s && s->owner == o ? s : NULL;
}

/* The smallest cached segment that serves one of size bytes (policy_cache_serves()), within limit. */
static struct segment *cache_take(struct pool *p, uint64_t size, uint64_t limit) {
        struct segment key = { .size = size, .cache_seq = UINT64_MAX };
        struct gp_rb_node *n = gp_rb_lower_bound(&p->cache_by_size, &key.owner_node);
        struct segment *s;

        if (!n)
                return NULL;
        s = gp_rb_entry(n, struct segment, owner_node);
        if (s->size > limit || !policy_cache_serves(s->size, size))
                return NULL;
        gp_rb_remove(&p->cache_by_size, &s->owner_node);
        gp_rb_remove(&p->cache_by_age, &s->age_node);
        p->cached_bytes -= s->size;
        p->fresh_granules -= pool_fresh_granule(s);
        return s;
}

/* A new segment of size bytes of mem (the backend's), in the pool's indices and counts, owned by no one yet. */
static struct segment *segment_add(struct pool *p, uint64_t size, const struct backend_mem *mem) {
        struct segment *s = calloc(1, sizeof(*s));

        if (!s)
                return NULL;
        s->id = p->next_id++;
        s->size = size;
        s->mem = *mem;
        gp_rb_insert(&p->segments_by_id, &s->by_id);
        segment_name(p, s);
        p->reserved_bytes += size;
        return s;
}

static int segment_create(struct pool *p, uint64_t size, struct segment **ret) {
        struct backend_mem mem;
        int r;

        r = p->backend->ops->mem_create(p->backend, p->device, size, &mem);
        if (r < 0)
                return r;
        if (!(*ret = segment_add(p, size, &mem))) {
                p->backend->ops->mem_destroy(p->backend, p->device, &mem, size);
                return -ENOMEM;
        }
        return 0;
}

/*
 * Whether the backend's failure r to make a segment may be the cache's doing: it is fuller than
 * our count says (other users), or out of descriptors (a host segment is one), with segments
 * cached that, released, make room.
 */
static bool backend_short(const struct pool *p, int r) {
        return (r == -ENOMEM || r == -EMFILE || r == -ENFILE) && p->cached_bytes;
}

/*
 * Finds or makes a segment for a request of rsize bytes from one source (pool.h), by policy's
 * rules (policy.h): the class size if the headroom allows, else the smallest that serves.
 * -ENOENT: none from this source.
 */
static int segment_obtain(struct pool *p, enum pool_source from, uint64_t rsize, uint64_t headroom, struct segment **ret) {
        uint64_t want = policy_segment_bytes(rsize, headroom), min = heap_min_segment_bytes(rsize), left;
        int64_t room = 0;
        bool bounded;
        int r;

        if (min > headroom)
                return -EDQUOT;
        if (from == POOL_FROM_CACHE) {
                *ret = cache_take(p, want, headroom);
                if (!*ret && min < want)
                        *ret = cache_take(p, min, headroom);
                return *ret ? 0 : -ENOENT;
        }
        /* The device's headroom bounds the pool as its capacity does: others took part of it, or not. */
        bounded = device_room(p, &room);
        left = capacity_left(p);
        if (bounded && (room < 0 || (uint64_t) room < left))
                left = room < 0 ? 0 : (uint64_t) room;
        want = policy_segment_bytes(rsize, headroom < left ? headroom : left);
        if (from == POOL_FROM_FREE) {
                if (!fits(p, want, bounded, room))
                        return -ENOENT;
                r = segment_create(p, want, ret);
                return backend_short(p, r) ? -ENOENT : r;      /* the cache, released, may serve */
        }
        if (!make_room(p, want, bounded, room))
                return -ENOMEM;
        r = segment_create(p, want, ret);
        if (backend_short(p, r)) {
                /* The whole cache goes, and a retry. */
                while (cache_release_oldest(p))
                        p->evictions++;
                r = segment_create(p, want, ret);
        }
        return r;
}

int pool_stock(struct pool *p, uint64_t max_cached_bytes, unsigned exports_ahead) {
        struct segment *s;
        int64_t room = 0;
        bool bounded;
        int r;

        if (p->cached_bytes + GP_GRANULE_BYTES > max_cached_bytes)
                return -ENOSPC;
        bounded = device_room(p, &room);
        if (!fits(p, GP_GRANULE_BYTES, bounded, room))
                return -ENOSPC;
        if ((r = segment_create(p, GP_GRANULE_BYTES, &s)) < 0)
                return r;
        /* Its descriptor too, where the backend keeps one ahead: its lease then exports nothing (else it does). */
        if (p->backend->ops->mem_export_ahead)
                (void) p->backend->ops->mem_export_ahead(p->backend, p->device, &s->mem, exports_ahead);
        cache_insert(p, s);
        p->stocked++;
        return 0;
}

uint64_t pool_stocked(const struct pool *p) {
        return p->fresh_granules;
}

/*
 * Zeroes s (out of the cache or new) if it last belonged to another principal than o. Returns
 * 0 when it may be leased now; -EINPROGRESS when the zeroing runs on the device (s waits in
 * pool->zeroing, and comes into the cache clean once pool_poll_zeroing() sees it end); or a
 * negative errno, s destroyed.
 */
static int segment_zero_for(struct pool *p, struct pool_owner *o, struct segment *s) {
        int r;

        if (!s->has_principal || s->last_principal == o->principal)
                return 0;
        r = p->backend->ops->mem_zero(p->backend, p->device, &s->mem, s->size);
        if (r < 0) {
                segment_destroy(p, s);
                return r;
        }
        s->has_principal = false;       /* zero: anyone's */
        segment_name(p, s);     /* its memory may be fresh */
        if (r == 0)
                return 0;
        s->zeroing = true;
        gp_rb_insert(&p->zeroing, &s->owner_node);
        p->zeroing_bytes += s->size;
        return -EINPROGRESS;
}

unsigned pool_poll_zeroing(struct pool *p) {
        struct gp_rb_node *n = gp_rb_first(&p->zeroing), *next;
        unsigned ended = 0;

        for (; n; n = next) {
                struct segment *s = gp_rb_entry(n, struct segment, owner_node);
                int r = p->backend->ops->mem_zero_done(p->backend, p->device, &s->mem);

                next = gp_rb_next(n);
                if (r == 0)
                        continue;
                gp_rb_remove(&p->zeroing, n);
                p->zeroing_bytes -= s->size;
                s->zeroing = false;
                ended++;
                if (r < 0)
                        segment_destroy(p, s);  /* not known to be zero: nobody gets it */
                else
                        cache_insert(p, s);
        }
        return ended;
}

bool pool_zeroing(const struct pool *p) {
        return p->zeroing.count != 0;
}

/* Leases s (out of the cache, or new) to o. */
static void segment_give(struct pool_owner *o, struct segment *s, struct pool_lease *ret) {
        s->owner = o;
        gp_rb_insert(&o->segments_by_id, &s->owner_node);
        o->reserved_bytes += s->size;
        if (o->group)
                o->group->reserved_bytes += s->size;
        o->segments++;
        *ret = (struct pool_lease) {
                .segment_id = s->id,
                .segment_size = s->size,
                .mem = &s->mem,
        };
}

int pool_lease(struct pool *p, struct pool_owner *o, enum pool_source from, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret) {
        uint64_t rsize = heap_round(size);
        struct segment *s;
        int r;

        if (!rsize || rsize > POOL_MAX_REQUEST)
                return -EINVAL;
        r = segment_obtain(p, from, rsize, headroom_bytes, &s);
        if (r < 0)
                return r;
        r = segment_zero_for(p, o, s);
        if (r < 0)
                return r;
        segment_give(o, s, ret);
        return 0;
}

int pool_adopt(struct pool *p, struct pool_owner *o, const struct backend_mem *mem, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret) {
        struct segment *s;

        if (size > headroom_bytes)
                return -EDQUOT;
        /* Within the capacity, as a new segment would be (its memory exists on the device already). */
        if (!make_room(p, size, false, 0))
                return -ENOMEM;
        if (!(s = segment_add(p, size, mem)))
                return -ENOMEM;
        /* Memory the backend cannot pass on (cuda-vmm's is imported, or the process's own): nobody's after its owner's. */
        s->to_backend = p->backend->adopts_held;
        segment_give(o, s, ret);
        return 0;
}

void pool_set_charged(struct pool *p, uint64_t charged_bytes) {
        p->charged_bytes = charged_bytes;
}

void pool_set_capacity(struct pool *p, uint64_t capacity_bytes) {
        p->capacity_bytes = capacity_bytes > p->reserved_bytes ? capacity_bytes : p->reserved_bytes;
}

bool pool_holds(const struct pool *p, uint64_t ident) {
        struct segment key = { .ident = ident };

        return ident && gp_rb_find(&p->by_ident, &key.ident_node);
}

void pool_adopt_undo(struct pool *p, struct pool_owner *o, uint64_t segment_id) {
        struct segment *s = leased(p, o, segment_id);

        if (!s)
                return;
        (void) segment_take_back(s);
        segment_destroy(p, s);
}

void pool_lease_undo(struct pool *p, struct pool_owner *o, uint64_t segment_id) {
        struct segment *s = leased(p, o, segment_id);

        if (s)
                segment_to_cache(p, s);
}

/* o's segment segment_id in *ret, if it may be sealed: 0, -ENOENT, -EOPNOTSUPP or -EPERM. */
static int sealable(struct pool *p, const struct pool_owner *o, uint64_t segment_id, struct segment **ret) {
        struct segment *s = leased(p, o, segment_id);

        if (!s)
                return -ENOENT;
        if (!p->backend->ops->mem_seal)
                return -EOPNOTSUPP;
        if (s->mem.held)
                return -EPERM;          /* adopted by its process's word: the daemon has no memory to seal or send */
        *ret = s;
        return 0;
}

int pool_seal(struct pool *p, const struct pool_owner *o, uint64_t segment_id) {
        struct segment *s;
        int r = sealable(p, o, segment_id, &s);

        return r < 0 ? r : p->backend->ops->mem_seal(p->backend, p->device, &s->mem, s->size);
}

int pool_seal_begin(struct pool *p, const struct pool_owner *o, uint64_t segment_id, struct backend_mem *ret_mem) {
        struct segment *s;
        int r = sealable(p, o, segment_id, &s);

        if (r < 0)
                return r;
        if (s->sealing)
                return -EBUSY;
        *ret_mem = s->mem;
        ret_mem->exported_ahead = false;        /* the segment's own, never the copy's */
        if (s->mem.fd >= 0 && (ret_mem->fd = fcntl(s->mem.fd, F_DUPFD_CLOEXEC, 3)) < 0)
                return -errno;
        s->sealing = true;
        return 0;
}

void pool_seal_end(struct pool *p, uint64_t segment_id, bool sealed) {
        struct segment *s = segment_find(p, segment_id);

        /* Gone meanwhile (released, so destroyed): nothing of it is left to mark. */
        if (!s)
                return;
        s->sealing = false;
        s->sealed |= sealed;
}

const struct backend_mem *pool_leased_mem(const struct pool *p, const struct pool_owner *o, uint64_t segment_id) {
        struct segment *s = leased(p, o, segment_id);

        return s ? &s->mem : NULL;
}

int pool_leased_export(struct pool *p, const struct pool_owner *o, uint64_t segment_id, bool read_only) {
        struct segment *s = leased(p, o, segment_id);

        if (!s)
                return -ENOENT;
        if (!p->backend->ops->mem_export)
                return -EOPNOTSUPP;
        return p->backend->ops->mem_export(p->backend, p->device, &s->mem, read_only);
}

/* Sets the owner's report, held to what it leases (held free first), and the pool's sum. */
static void owner_set_report(struct pool_owner *o, uint64_t in_use, uint64_t held_free) {
        uint64_t held = held_free < o->reserved_bytes ? held_free : o->reserved_bytes;

        if (in_use > o->reserved_bytes - held)
                in_use = o->reserved_bytes - held;
        o->pool->reported_in_use_bytes += in_use - o->reported_in_use_bytes;
        if (o->group)
                o->group->in_use_bytes += in_use - o->reported_in_use_bytes;   /* unsigned wrap subtracts */
        o->reported_in_use_bytes = in_use;
        o->reported_held_free_bytes = held;
}

int pool_transfer(struct pool *p, struct pool_owner *from, struct pool_owner *to, uint64_t segment_id,
                  uint64_t *ret_size) {
        struct segment *s = segment_find(p, segment_id);
        struct pool_lease lease;

        if (!s || s->owner != from)
                return -ENOENT;
        (void) segment_take_back(s);
        segment_give(to, s, &lease);
        /* What from said it holds fits what it leases now. */
        owner_set_report(from, from->reported_in_use_bytes, from->reported_held_free_bytes);
        *ret_size = s->size;
        return 0;
}

void pool_owner_report(struct pool_owner *o, uint64_t in_use, uint64_t held_free, uint64_t now_ms) {
        owner_set_report(o, in_use, held_free);
        o->reported_at_ms = now_ms;
        o->reported = true;
}

int pool_return(struct pool *p, struct pool_owner *o, uint64_t segment_id, bool to_backend) {
        struct segment *s = o ? leased(p, o, segment_id) : NULL;
        uint64_t size;

        if (!s)
                return -ENOENT;
        size = s->size;
        s->to_backend |= to_backend;    /* an adopted one goes back to the backend all the same (pool_adopt()) */
        segment_to_cache(p, s);         /* s is gone when it went to the backend */
        /* Only a segment with no live block comes back: it was part of what the owner held free. */
        owner_set_report(o, o->reported_in_use_bytes,
                         o->reported_held_free_bytes - (o->reported_held_free_bytes < size ? o->reported_held_free_bytes : size));
        return 0;
}

void pool_get_stats(const struct pool *p, struct pool_stats *ret) {
        *ret = (struct pool_stats) {
                .total_bytes = p->capacity_bytes,
                .charged_bytes = p->charged_bytes,
                .reserved_bytes = p->reserved_bytes,
                .in_use_bytes = p->reported_in_use_bytes,
                .cached_bytes = p->cached_bytes,
                .segments = p->segments_by_id.count,
                .cached_segments = p->cache_by_age.count,
                .zeroing_bytes = p->zeroing_bytes,
                .gpu_known = p->gpu_known,
                .gpu_free_bytes = p->gpu.free_bytes,
                .gpu_total_bytes = p->gpu.total_bytes,
                .headroom_bytes = p->gpu.headroom_bytes,
                .headroom_releases_total = p->headroom_releases,
                .evictions_total = p->evictions,
                .idle_releases_total = p->idle_releases,
                .watermark_releases_total = p->watermark_releases,
                .stocked_total = p->stocked,
        };
}

uint64_t pool_release_idle(struct pool *p, uint64_t idle_ms, uint64_t *ret_next_ms) {
        uint64_t now = p->clock_ms(p->clock_ctx), bytes = 0;
        struct gp_rb_node *n;

        /* Oldest first: stop at the first segment that has not been idle long enough. */
        while ((n = gp_rb_first(&p->cache_by_age))) {
                struct segment *s = gp_rb_entry(n, struct segment, age_node);

                if (now - s->cached_at_ms < idle_ms) {
                        if (ret_next_ms)
                                *ret_next_ms = s->cached_at_ms + idle_ms - now;
                        return bytes;
                }
                bytes += s->size;
                cache_release_oldest(p);
                p->idle_releases++;
        }
        if (ret_next_ms)
                *ret_next_ms = UINT64_MAX;
        return bytes;
}

uint64_t pool_idle_due_ms(const struct pool *p, uint64_t idle_ms) {
        struct gp_rb_node *n = gp_rb_first(&p->cache_by_age);
        uint64_t now, at;

        if (!n)
                return UINT64_MAX;
        now = p->clock_ms(p->clock_ctx);
        at = gp_rb_entry(n, struct segment, age_node)->cached_at_ms + idle_ms;
        return at > now ? at - now : 0;
}

uint64_t pool_trim_cache(struct pool *p, uint64_t max_cached_bytes) {
        uint64_t bytes = 0;

        while (p->cached_bytes > max_cached_bytes) {
                bytes += gp_rb_entry(gp_rb_first(&p->cache_by_age), struct segment, age_node)->size;
                cache_release_oldest(p);
                p->watermark_releases++;
        }
        return bytes;
}
