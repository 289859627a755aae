/*
 * pool.c: the allocator core (see pool.h for the model).
 *
 * Data structures, all intrusive red-black trees so that no operation scans:
 *   pool->segments_by_id         every segment the pool holds from the backend
 *   pool->cache_by_size          cached segments by (size, newest first): lease lookup
 *   pool->cache_by_age           cached segments oldest first: LRU release
 *   owner->segments_by_id        the segments leased to one owner
 *   owner->free_index[class]     its free blocks by (size, segment id, offset): best fit
 *   segment->live                its live blocks by offset: free() lookup
 * Blocks of a segment also form an address-ordered list, for merging neighbours.
 */
#include "pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum segment_state {
        SEGMENT_LEASED,         /* owner holds live blocks in it */
        SEGMENT_RELEASING,      /* no live block; waiting for the owner to unmap it */
        SEGMENT_CACHED,         /* in the pool's cache, no owner */
};

struct block {
        struct segment *segment;
        uint64_t offset;
        uint64_t size;
        bool free;
        struct block *prev, *next;      /* address order within the segment */
        struct gp_rb_node node;         /* free: owner->free_index; live: segment->live */
};

struct segment {
        uint64_t id;
        uint64_t size;
        enum segment_state state;
        enum pool_class class;
        struct pool_owner *owner;
        uint32_t last_tenant;
        bool has_tenant;
        uint64_t live_blocks;
        bool kept;                      /* leased, no live block, kept mapped by its owner */
        bool to_backend;                /* reclaimed by a flush: straight back to the backend once released */
        uint64_t cache_seq;
        uint64_t cached_at_ms;          /* when it entered the cache */
        struct block *first;
        struct gp_rb_tree live;
        struct backend_mem mem;
        struct gp_rb_node by_id;        /* pool->segments_by_id */
        struct gp_rb_node owner_node;   /* owner->segments_by_id, or pool->cache_by_size */
        struct gp_rb_node age_node;     /* pool->cache_by_age */
};

struct pool {
        struct backend *backend;
        unsigned device;
        uint64_t capacity_bytes;
        uint64_t reserved_bytes;
        uint64_t in_use_bytes;
        uint64_t cached_bytes;
        uint64_t next_id;
        uint64_t cache_seq;
        uint64_t evictions, decay_releases, watermark_releases;
        uint64_t (*clock_ms)(void *ctx);
        void *clock_ctx;
        struct gp_rb_tree segments_by_id;
        struct gp_rb_tree cache_by_size;
        struct gp_rb_tree cache_by_age;
        struct pool_owner *owners;
};

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_free_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct block *a = gp_rb_entry(x, struct block, node);
        const struct block *b = gp_rb_entry(y, struct block, node);

        if (a->size != b->size)
                return CMP(a->size, b->size);
        if (a->segment->id != b->segment->id)
                return CMP(a->segment->id, b->segment->id);
        return CMP(a->offset, b->offset);
}

static int cmp_live_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct block, node)->offset, gp_rb_entry(y, struct block, node)->offset);
}

static int cmp_segment_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct segment, by_id)->id, gp_rb_entry(y, struct segment, by_id)->id);
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

static uint64_t round_up(uint64_t v, uint64_t align) {
        return (v + align - 1) / align * align;
}

static uint64_t class_segment_bytes(uint64_t rsize) {
        if (rsize <= POOL_SMALL_REQUEST)
                return POOL_SMALL_SEGMENT;
        if (rsize <= POOL_MEDIUM_REQUEST)
                return POOL_MEDIUM_SEGMENT;
        return round_up(rsize, POOL_SEGMENT_ALIGN);
}

uint64_t pool_min_segment_bytes(uint64_t size) {
        if (size == 0 || size > POOL_MAX_REQUEST)
                return 0;
        return round_up(round_up(size, POOL_BLOCK_ALIGN), POOL_SEGMENT_ALIGN);
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
        *ret = p;
        return 0;
}

static void segment_destroy(struct pool *p, struct segment *s) {
        struct block *b = s->first;

        while (b) {
                struct block *next = b->next;

                free(b);
                b = next;
        }
        gp_rb_remove(&p->segments_by_id, &s->by_id);
        p->reserved_bytes -= s->size;
        p->backend->ops->mem_destroy(p->backend, p->device, &s->mem, s->size);
        free(s);
}

/* Gives the least recently cached segment back to the backend. Returns false if none. */
static bool cache_release_oldest(struct pool *p) {
        struct gp_rb_node *n = gp_rb_first(&p->cache_by_age);
        struct segment *s;

        if (!n)
                return false;
        s = gp_rb_entry(n, struct segment, age_node);
        gp_rb_remove(&p->cache_by_age, &s->age_node);
        gp_rb_remove(&p->cache_by_size, &s->owner_node);
        p->cached_bytes -= s->size;
        segment_destroy(p, s);
        return true;
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

void pool_owner_attach(struct pool *p, struct pool_owner *o, uint32_t tenant) {
        memset(o, 0, sizeof(*o));
        o->pool = p;
        o->tenant = tenant;
        gp_rb_init(&o->segments_by_id, cmp_owner_segment);
        for (int c = 0; c < POOL_CLASS_COUNT; c++)
                gp_rb_init(&o->free_index[c], cmp_free_block);
        o->next = p->owners;
        if (p->owners)
                p->owners->prev = o;
        p->owners = o;
}

/* Moves a segment that holds no block structures into the cache. */
static void segment_to_cache(struct pool *p, struct segment *s) {
        struct pool_owner *o = s->owner;

        gp_rb_remove(&o->segments_by_id, &s->owner_node);
        o->reserved_bytes -= s->size;
        o->segments--;
        s->owner = NULL;
        if (s->kept) {
                /* Kept by the owner that is letting go of it (it left): nobody keeps it now. */
                s->kept = false;
                o->kept_bytes -= s->size;
        }
        if (s->to_backend) {
                segment_destroy(p, s);
                return;
        }
        s->last_tenant = o->tenant;
        s->has_tenant = true;
        s->state = SEGMENT_CACHED;
        s->cache_seq = ++p->cache_seq;
        s->cached_at_ms = p->clock_ms(p->clock_ctx);
        gp_rb_insert(&p->cache_by_size, &s->owner_node);
        gp_rb_insert(&p->cache_by_age, &s->age_node);
        p->cached_bytes += s->size;
}

uint64_t pool_owner_detach(struct pool_owner *o) {
        struct pool *p = o->pool;
        struct gp_rb_node *n;
        uint64_t released = o->reserved_bytes;

        if (!p)
                return 0;
        while ((n = gp_rb_first(&o->segments_by_id))) {
                struct segment *s = gp_rb_entry(n, struct segment, owner_node);
                struct block *b = s->first;

                while (b) {
                        struct block *next = b->next;

                        if (!b->free)
                                p->in_use_bytes -= b->size;
                        free(b);
                        b = next;
                }
                s->first = NULL;
                s->live_blocks = 0;
                gp_rb_init(&s->live, cmp_live_block);
                segment_to_cache(p, s);
        }
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

/* A cached segment of at least size bytes and at most a quarter more, within limit. */
static struct segment *cache_take(struct pool *p, uint64_t size, uint64_t limit) {
        struct segment key = { .size = size, .cache_seq = UINT64_MAX };
        struct gp_rb_node *n = gp_rb_lower_bound(&p->cache_by_size, &key.owner_node);
        struct segment *s;

        if (!n)
                return NULL;
        s = gp_rb_entry(n, struct segment, owner_node);
        if (s->size > limit || s->size > size + size / 4)
                return NULL;
        gp_rb_remove(&p->cache_by_size, &s->owner_node);
        gp_rb_remove(&p->cache_by_age, &s->age_node);
        p->cached_bytes -= s->size;
        return s;
}

static int segment_create(struct pool *p, uint64_t size, struct segment **ret) {
        struct segment *s = calloc(1, sizeof(*s));
        int r;

        if (!s)
                return -ENOMEM;
        r = p->backend->ops->mem_create(p->backend, p->device, size, &s->mem);
        if (r < 0) {
                free(s);
                return r;
        }
        s->id = p->next_id++;
        s->size = size;
        gp_rb_init(&s->live, cmp_live_block);
        gp_rb_insert(&p->segments_by_id, &s->by_id);
        p->reserved_bytes += size;
        *ret = s;
        return 0;
}

/*
 * Finds or makes a segment for a request of rsize bytes: the class size if the headroom
 * allows, else the smallest that serves. The cache comes first, then free capacity, then
 * releasing cached segments (oldest first) to make room.
 */
static int segment_obtain(struct pool *p, uint64_t rsize, uint64_t headroom, struct segment **ret) {
        uint64_t want = class_segment_bytes(rsize), min = round_up(rsize, POOL_SEGMENT_ALIGN);
        struct segment *s;
        int r;

        if (min > headroom)
                return -EDQUOT;
        if (want > headroom)
                want = min;
        s = cache_take(p, want, headroom);
        if (!s && min < want)
                s = cache_take(p, min, headroom);
        if (s) {
                *ret = s;
                return 0;
        }
        if (p->reserved_bytes + want > p->capacity_bytes)
                want = min;
        while (p->reserved_bytes + want > p->capacity_bytes) {
                if (!cache_release_oldest(p))
                        return -ENOMEM;
                p->evictions++;
        }
        r = segment_create(p, want, ret);
        if ((r == -ENOMEM || r == -EMFILE || r == -ENFILE) && p->cached_bytes) {
                /*
                 * The backend is fuller than our count says (other users), or out of
                 * descriptors (a host segment is one): make room and retry.
                 */
                while (cache_release_oldest(p))
                        p->evictions++;
                r = segment_create(p, want, ret);
        }
        return r;
}

static int segment_lease(struct pool *p, struct pool_owner *o, struct segment *s, enum pool_class class) {
        struct block *b;

        if (s->has_tenant && s->last_tenant != o->tenant) {
                int r = p->backend->ops->mem_zero(p->backend, p->device, &s->mem, s->size);

                if (r < 0) {
                        segment_destroy(p, s);
                        return r;
                }
        }
        b = calloc(1, sizeof(*b));
        if (!b) {
                segment_destroy(p, s);
                return -ENOMEM;
        }
        b->segment = s;
        b->size = s->size;
        b->free = true;
        s->first = b;
        s->owner = o;
        s->class = class;
        s->state = SEGMENT_LEASED;
        gp_rb_insert(&o->segments_by_id, &s->owner_node);
        gp_rb_insert(&o->free_index[class], &b->node);
        o->reserved_bytes += s->size;
        o->segments++;
        return 0;
}

/*
 * Takes rsize bytes from the front of free block b, splitting off the rest. Cannot fail: if
 * there is no memory for the rest's record, the whole block is handed out instead.
 */
static void block_carve(struct pool *p, struct pool_owner *o, struct block *b, uint64_t rsize) {
        struct segment *s = b->segment;
        struct block *rest = b->size - rsize >= POOL_BLOCK_ALIGN ? calloc(1, sizeof(*rest)) : NULL;

        if (rest) {
                gp_rb_remove(&o->free_index[s->class], &b->node);
                rest->segment = s;
                rest->offset = b->offset + rsize;
                rest->size = b->size - rsize;
                rest->free = true;
                rest->prev = b;
                rest->next = b->next;
                if (b->next)
                        b->next->prev = rest;
                b->next = rest;
                b->size = rsize;
                gp_rb_insert(&o->free_index[s->class], &rest->node);
        } else {
                gp_rb_remove(&o->free_index[s->class], &b->node);
        }
        b->free = false;
        gp_rb_insert(&s->live, &b->node);
        if (s->kept) {
                s->kept = false;
                o->kept_bytes -= s->size;
        }
        s->live_blocks++;
        o->in_use_bytes += b->size;
        o->blocks++;
        p->in_use_bytes += b->size;
}

int pool_alloc(struct pool *p, struct pool_owner *o, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret) {
        /* Sorts before every real block of the same size: segment ids start at 1. */
        static const struct segment key_segment = { .id = 0 };
        struct block key = { .segment = (struct segment *) &key_segment }, *b;
        enum pool_class class;
        struct segment *s;
        struct gp_rb_node *n;
        bool new_segment = false;
        uint64_t rsize;
        int r;

        if (size == 0 || size > POOL_MAX_REQUEST)
                return -EINVAL;
        rsize = round_up(size, POOL_BLOCK_ALIGN);
        class = rsize <= POOL_SMALL_REQUEST ? POOL_CLASS_SMALL : POOL_CLASS_LARGE;

        key.size = rsize;
        n = gp_rb_lower_bound(&o->free_index[class], &key.node);
        if (n) {
                b = gp_rb_entry(n, struct block, node);
        } else {
                r = segment_obtain(p, rsize, headroom_bytes, &s);
                if (r < 0)
                        return r;
                r = segment_lease(p, o, s, class);
                if (r < 0)
                        return r;
                b = s->first;
                new_segment = true;
        }
        block_carve(p, o, b, rsize);
        *ret = (struct pool_lease) {
                .segment_id = b->segment->id,
                .segment_size = b->segment->size,
                .offset = b->offset,
                .size = b->size,
                .new_segment = new_segment,
                .mem = &b->segment->mem,
        };
        return 0;
}

/* Joins b's successor into b. The caller has taken the successor out of the free index. */
static void block_absorb_next(struct block *b) {
        struct block *n = b->next;

        b->size += n->size;
        b->next = n->next;
        if (n->next)
                n->next->prev = b;
        free(n);
}

int pool_free_block(struct pool *p, struct pool_owner *o, uint64_t segment_id, uint64_t offset,
                    bool *ret_release) {
        struct segment *s = segment_find(p, segment_id);
        struct block key = { .offset = offset }, *b;
        struct gp_rb_node *n;

        if (!s || s->owner != o || s->state != SEGMENT_LEASED)
                return -ENOENT;
        n = gp_rb_find(&s->live, &key.node);
        if (!n)
                return -ENOENT;
        b = gp_rb_entry(n, struct block, node);
        gp_rb_remove(&s->live, &b->node);
        s->live_blocks--;
        o->in_use_bytes -= b->size;
        o->blocks--;
        p->in_use_bytes -= b->size;
        b->free = true;

        if (b->next && b->next->free) {
                gp_rb_remove(&o->free_index[s->class], &b->next->node);
                block_absorb_next(b);
        }
        if (b->prev && b->prev->free) {
                b = b->prev;
                gp_rb_remove(&o->free_index[s->class], &b->node);
                block_absorb_next(b);
        }
        if (s->live_blocks == 0 && o->kept_bytes + s->size <= o->keep_bytes) {
                /* The owner keeps it mapped for its next allocations; it may be asked for it back. */
                s->kept = true;
                o->kept_bytes += s->size;
                gp_rb_insert(&o->free_index[s->class], &b->node);
                *ret_release = false;
                return 0;
        }
        if (s->live_blocks == 0) {
                /* b is the whole segment now; the owner must unmap before anyone else gets it. */
                free(b);
                s->first = NULL;
                s->state = SEGMENT_RELEASING;
                *ret_release = true;
                return 0;
        }
        gp_rb_insert(&o->free_index[s->class], &b->node);
        *ret_release = false;
        return 0;
}

size_t pool_reclaim(struct pool *p, struct pool_owner *o, uint64_t want_bytes, bool to_backend, uint64_t *ret_ids,
                    size_t max_ids, uint64_t *ret_bytes) {
        uint64_t bytes = 0;
        size_t n = 0;

        (void) p;
        for (struct gp_rb_node *x = gp_rb_first(&o->segments_by_id); x && n < max_ids && bytes < want_bytes;
             x = gp_rb_next(x)) {
                struct segment *s = gp_rb_entry(x, struct segment, owner_node);

                if (!s->kept)
                        continue;
                /* Its one free block leaves the index: nothing of the owner's lands there any more. */
                gp_rb_remove(&o->free_index[s->class], &s->first->node);
                free(s->first);
                s->first = NULL;
                s->kept = false;
                s->to_backend = to_backend;
                s->state = SEGMENT_RELEASING;
                o->kept_bytes -= s->size;
                bytes += s->size;
                ret_ids[n++] = s->id;
        }
        *ret_bytes = bytes;
        return n;
}

void pool_unreclaim(struct pool *p, struct pool_owner *o, const uint64_t *ids, size_t n) {
        for (size_t i = 0; i < n; i++) {
                struct segment *s = segment_find(p, ids[i]);
                struct block *b;

                if (!s || s->owner != o || s->state != SEGMENT_RELEASING || s->first || o->kept_bytes + s->size > o->keep_bytes)
                        continue;
                b = calloc(1, sizeof(*b));
                if (!b)
                        continue;       /* it stays releasing: the owner's exit returns it */
                b->segment = s;
                b->size = s->size;
                b->free = true;
                s->first = b;
                s->state = SEGMENT_LEASED;
                s->kept = true;
                s->to_backend = false;
                o->kept_bytes += s->size;
                gp_rb_insert(&o->free_index[s->class], &b->node);
        }
}

int pool_release(struct pool *p, struct pool_owner *o, uint64_t segment_id) {
        struct segment *s = segment_find(p, segment_id);

        if (!s || s->owner != o)
                return -ENOENT;
        if (s->state != SEGMENT_RELEASING)
                return -EBUSY;
        segment_to_cache(p, s);
        return 0;
}

void pool_get_stats(const struct pool *p, struct pool_stats *ret) {
        *ret = (struct pool_stats) {
                .total_bytes = p->capacity_bytes,
                .reserved_bytes = p->reserved_bytes,
                .in_use_bytes = p->in_use_bytes,
                .cached_bytes = p->cached_bytes,
                .segments = p->segments_by_id.count,
                .cached_segments = p->cache_by_age.count,
                .evictions_total = p->evictions,
                .decay_releases_total = p->decay_releases,
                .watermark_releases_total = p->watermark_releases,
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
                p->decay_releases++;
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

#define FAIL(...)                                       \
        do {                                            \
                snprintf(why, why_size, __VA_ARGS__);   \
                return -EUCLEAN;                        \
        } while (0)

/* Checks one leased or releasing segment's blocks; adds to the owner sums. */
static int check_segment_blocks(const struct segment *s, uint64_t *in_use, uint64_t *blocks,
                                uint64_t *free_blocks, char *why, size_t why_size) {
        const struct pool_owner *o = s->owner;
        uint64_t offset = 0, live = 0;

        if (s->kept && (s->state != SEGMENT_LEASED || s->live_blocks || !s->first || s->first->next || !s->first->free))
                FAIL("segment %" PRIu64 " is kept but not one whole free block", s->id);
        if (s->state == SEGMENT_RELEASING) {
                if (s->first || s->live_blocks || s->live.count)
                        FAIL("segment %" PRIu64 " is releasing but holds blocks", s->id);
                return 0;
        }
        if (!s->first || s->first->prev)
                FAIL("segment %" PRIu64 " is leased but has no first block", s->id);
        for (const struct block *b = s->first; b; b = b->next) {
                if (b->segment != s || b->offset != offset || b->size == 0 ||
                    b->size % POOL_BLOCK_ALIGN || (b->next && b->next->prev != b))
                        FAIL("segment %" PRIu64 ": block at %" PRIu64 " breaks the tiling", s->id, b->offset);
                if (b->free) {
                        if (b->next && b->next->free)
                                FAIL("segment %" PRIu64 ": free neighbours at %" PRIu64 " not merged", s->id, b->offset);
                        if (gp_rb_find(&o->free_index[s->class], &b->node) != &b->node)
                                FAIL("segment %" PRIu64 ": free block at %" PRIu64 " missing from the index", s->id, b->offset);
                        (*free_blocks)++;
                } else {
                        if (gp_rb_find(&s->live, &b->node) != &b->node)
                                FAIL("segment %" PRIu64 ": live block at %" PRIu64 " missing from the index", s->id, b->offset);
                        live++;
                        *in_use += b->size;
                }
                offset += b->size;
        }
        if (offset != s->size)
                FAIL("segment %" PRIu64 ": blocks cover %" PRIu64 " of %" PRIu64 " bytes", s->id, offset, s->size);
        if (live != s->live_blocks || live != s->live.count || (live == 0 && !s->kept))
                FAIL("segment %" PRIu64 ": %" PRIu64 " live blocks, counted %" PRIu64, s->id, live, s->live_blocks);
        *blocks += live;
        return 0;
}

int pool_check(const struct pool *p, char *why, size_t why_size) {
        uint64_t reserved = 0, in_use = 0, cached = 0, cached_count = 0, owned = 0;

        if (gp_rb_verify(&p->segments_by_id) || gp_rb_verify(&p->cache_by_size) ||
            gp_rb_verify(&p->cache_by_age))
                FAIL("a pool index is not a valid red-black tree");
        for (struct gp_rb_node *n = gp_rb_first(&p->segments_by_id); n; n = gp_rb_next(n)) {
                const struct segment *s = gp_rb_entry(n, struct segment, by_id);

                reserved += s->size;
                if (s->state == SEGMENT_CACHED) {
                        if (s->owner || s->first)
                                FAIL("cached segment %" PRIu64 " has an owner or blocks", s->id);
                        if (gp_rb_find(&p->cache_by_age, &s->age_node) != &s->age_node)
                                FAIL("cached segment %" PRIu64 " missing from the cache", s->id);
                        cached += s->size;
                        cached_count++;
                } else if (!s->owner || s->owner->pool != p) {
                        FAIL("segment %" PRIu64 " is leased to no owner of this pool", s->id);
                } else {
                        owned++;
                }
        }
        if (reserved != p->reserved_bytes || cached != p->cached_bytes ||
            cached_count != p->cache_by_size.count || cached_count != p->cache_by_age.count)
                FAIL("device %u: reserved %" PRIu64 " (counted %" PRIu64 "), cached %" PRIu64 " (counted %" PRIu64 ")",
                     p->device, reserved, p->reserved_bytes, cached, p->cached_bytes);
        if (p->reserved_bytes > p->capacity_bytes)
                FAIL("device %u: reserved %" PRIu64 " over capacity %" PRIu64, p->device, p->reserved_bytes, p->capacity_bytes);

        for (const struct pool_owner *o = p->owners; o; o = o->next) {
                uint64_t o_reserved = 0, o_in_use = 0, o_blocks = 0, free_blocks = 0, indexed = 0, kept = 0;
                int r;

                if (gp_rb_verify(&o->segments_by_id))
                        FAIL("an owner's segment index is not a valid red-black tree");
                for (struct gp_rb_node *n = gp_rb_first(&o->segments_by_id); n; n = gp_rb_next(n)) {
                        const struct segment *s = gp_rb_entry(n, struct segment, owner_node);

                        if (s->owner != o)
                                FAIL("segment %" PRIu64 " is in an owner's index but not its", s->id);
                        o_reserved += s->size;
                        kept += s->kept ? s->size : 0;
                        r = check_segment_blocks(s, &o_in_use, &o_blocks, &free_blocks, why, why_size);
                        if (r < 0)
                                return r;
                        owned--;
                }
                for (int c = 0; c < POOL_CLASS_COUNT; c++) {
                        if (gp_rb_verify(&o->free_index[c]))
                                FAIL("an owner's free index is not a valid red-black tree");
                        indexed += o->free_index[c].count;
                }
                if (o_reserved != o->reserved_bytes || o_in_use != o->in_use_bytes || o_blocks != o->blocks ||
                    o->segments != o->segments_by_id.count)
                        FAIL("owner: reserved %" PRIu64 "/%" PRIu64 ", in use %" PRIu64 "/%" PRIu64 ", blocks %" PRIu64 "/%" PRIu64,
                             o_reserved, o->reserved_bytes, o_in_use, o->in_use_bytes, o_blocks, o->blocks);
                if (indexed != free_blocks)
                        FAIL("owner: %" PRIu64 " blocks indexed free, %" PRIu64 " free", indexed, free_blocks);
                if (kept != o->kept_bytes || kept > o->keep_bytes)
                        FAIL("owner: keeps %" PRIu64 " bytes free, counted %" PRIu64 ", may keep %" PRIu64, kept, o->kept_bytes,
                             o->keep_bytes);
                in_use += o_in_use;
        }
        if (owned != 0)
                FAIL("device %u: %" PRIu64 " leased segments belong to no attached owner", p->device, owned);
        if (in_use != p->in_use_bytes)
                FAIL("device %u: in use %" PRIu64 ", counted %" PRIu64, p->device, in_use, p->in_use_bytes);
        return 0;
}
