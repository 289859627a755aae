/*
 * pool.h: the allocator core for one device. No I/O: memory comes from a struct backend, and
 * who may have how much is decided by the caller (policy) and passed in as headroom.
 *
 * Segments come from the backend in classes: requests of at most 1 MiB share 2 MiB segments,
 * up to 10 MiB share 20 MiB segments, larger ones get a segment of their own rounded up to
 * 2 MiB. Each owner's blocks are carved from its segments by the allocator core (common/heap.h):
 * rounded to 512 bytes, found best-fit in O(log n), split on allocation and merged with free
 * neighbours on free.
 *
 * Each segment is leased to one owner (a client) at a time, because a handle to a segment
 * opens all of it. When an owner's segment holds no live block, it is marked releasing: the
 * owner is told to unmap it and confirm with pool_release(), after which the segment goes to
 * the pool's cache (LRU) and any owner may lease it. A segment that changes tenant is zeroed
 * by the backend first.
 *
 * Byte accounting (checked by pool_check()): reserved = in use + free in owners' segments +
 * cached, and each owner's reserved is the sum of its segments.
 */
#ifndef GP_POOL_H
#define GP_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "heap.h"
#include "rbtree.h"

/* The protocol's names for the allocator core's rounding and largest request (common/heap.h). */
#define POOL_BLOCK_ALIGN HEAP_BLOCK_ALIGN
#define POOL_MAX_REQUEST HEAP_MAX_REQUEST

struct pool;

/* One client's part of one pool. Embedded in the session; fields above the line are read-only. */
struct pool_owner {
        uint64_t reserved_bytes;        /* sum of the sizes of its segments */
        uint64_t segments;
        uint32_t tenant;                /* segments changing tenant are zeroed */
        uint64_t keep_bytes;            /* it keeps up to this much of segments with no live block */
        uint64_t leased_bytes;          /* of reserved_bytes: segments leased whole (pool_lease), carved by the owner */
        /* What the owner says it holds in its leased segments (Usage), and when it said so. */
        uint64_t reported_in_use_bytes;
        uint64_t reported_held_free_bytes;
        uint64_t reported_at_ms;
        bool reported;
        /* ---- private to pool.c ---- */
        struct pool *pool;
        struct gp_rb_tree segments_by_id;
        struct heap heap;               /* carves its blocks from its leased segments */
        struct pool_owner *prev, *next;
};

/* The live blocks the pool carved for the owner (rounded sizes), and their bytes. */
static inline uint64_t pool_owner_blocks(const struct pool_owner *owner) {
        return owner->heap.blocks;
}

static inline uint64_t pool_owner_carved_bytes(const struct pool_owner *owner) {
        return owner->heap.in_use_bytes;
}

/* The segments with no live block the owner keeps (keep_bytes at most): its heap's empty ones. */
static inline uint64_t pool_owner_kept_bytes(const struct pool_owner *owner) {
        return owner->heap.empty_bytes;
}

/* What the owner uses: the blocks the pool carved for it, and what it reports of its leased segments. */
static inline uint64_t pool_owner_in_use(const struct pool_owner *owner) {
        return owner->heap.in_use_bytes + owner->reported_in_use_bytes;
}

/* What pool_alloc() handed out. */
struct pool_lease {
        uint64_t segment_id;
        uint64_t segment_size;
        uint64_t offset;
        uint64_t size;                  /* the block's rounded size */
        bool new_segment;               /* leased to the owner by this call: export its handle */
        const struct backend_mem *mem;  /* the segment's memory, for exporting */
};

struct pool_stats {
        uint64_t total_bytes;           /* capacity */
        uint64_t reserved_bytes;        /* held from the backend */
        uint64_t in_use_bytes;          /* blocks the pool carved, and what owners of whole segments report */
        uint64_t cached_bytes;          /* wholly free segments in the cache */
        uint64_t segments;
        uint64_t cached_segments;
        uint64_t evictions_total;               /* cached segments released to make room */
        uint64_t decay_releases_total;          /* cached segments idle too long */
        uint64_t watermark_releases_total;      /* cached segments over the watermark */
};

/* Makes a pool for one device of backend, of capacity_bytes. Returns 0 or -ENOMEM. */
int pool_new(struct backend *backend, unsigned device, uint64_t capacity_bytes, struct pool **ret);

/* The clock (milliseconds, monotonic) the cache's ages are read on; tests set their own. */
void pool_set_clock(struct pool *pool, uint64_t (*clock_ms)(void *ctx), void *ctx);

/*
 * Gives back to the backend every cached segment idle for idle_ms or more, oldest first.
 * Returns the bytes released; *ret_next_ms (if given) is how long until the next one is due,
 * or UINT64_MAX when the cache is empty.
 */
uint64_t pool_release_idle(struct pool *pool, uint64_t idle_ms, uint64_t *ret_next_ms);

/* How long until the oldest cached segment has been idle idle_ms (0: it has), or UINT64_MAX with none cached. */
uint64_t pool_idle_due_ms(const struct pool *pool, uint64_t idle_ms);

/* Releases the oldest cached segments until at most max_cached_bytes are cached. Returns the bytes released. */
uint64_t pool_trim_cache(struct pool *pool, uint64_t max_cached_bytes);

/* Gives every segment back to the backend and frees the pool. Owners must be detached first. NULL is fine. */
void pool_free(struct pool *pool);

/* Attaches an owner (zeroed by the caller or not) to pool. */
void pool_owner_attach(struct pool *pool, struct pool_owner *owner, uint32_t tenant);

/*
 * Returns everything the owner holds to the cache, frees its blocks and detaches it. Call
 * only when the owner can no longer touch the memory (it unmapped it, or its process has
 * exited). Returns the bytes that went back to the cache.
 */
uint64_t pool_owner_detach(struct pool_owner *owner);

/*
 * Allocates size bytes for owner. headroom_bytes is how many more bytes the owner may reserve
 * (UINT64_MAX: no limit); a new segment is leased only within it. Returns 0 and fills *ret,
 * -EINVAL for a size of 0 or over POOL_MAX_REQUEST, -EDQUOT when the smallest segment that
 * would serve exceeds headroom_bytes, -ENOMEM when the device is full after releasing the
 * cache, or the backend's error.
 */
int pool_alloc(struct pool *pool, struct pool_owner *owner, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret);

/*
 * Keeps what the owner reports it holds in its leased segments: in_use_bytes in live blocks,
 * held_free_bytes in segments holding none, as of now_ms; clamped to what it leases (held
 * free first). The pool's in-use bytes count the reports.
 */
void pool_owner_report(struct pool_owner *owner, uint64_t in_use_bytes, uint64_t held_free_bytes, uint64_t now_ms);

/*
 * Leases owner a whole segment for a block of size bytes, which the owner carves itself: the
 * class's segment if headroom_bytes allows, else the smallest that serves, from the cache
 * (zeroed when it changes tenant) or the backend, as pool_alloc() finds one. Fills *ret
 * (new_segment set, offset 0, size the segment's). Errors as pool_alloc().
 */
int pool_lease(struct pool *pool, struct pool_owner *owner, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret);

/*
 * The owner has unmapped a segment leased whole: it goes to the cache, or with to_backend back
 * to the backend. Returns 0, or -ENOENT for a segment not leased whole to the owner.
 */
int pool_return(struct pool *pool, struct pool_owner *owner, uint64_t segment_id, bool to_backend);

/*
 * Frees the owner's block at offset in segment_id. Returns 0, or -ENOENT when the owner has
 * no live block starting there. *ret_release is set when the segment holds no live block any
 * more and the owner must unmap it and call pool_release().
 */
int pool_free_block(struct pool *pool, struct pool_owner *owner, uint64_t segment_id, uint64_t offset,
                    bool *ret_release);

/*
 * The owner has unmapped a segment that pool_free_block() told it to release: it goes to the
 * cache. Returns 0, -ENOENT for a segment the owner does not hold, -EBUSY for one that still
 * has live blocks.
 */
int pool_release(struct pool *pool, struct pool_owner *owner, uint64_t segment_id);

/*
 * Takes back segments owner keeps with no live block (see keep_bytes), until want_bytes:
 * they become releasing (the owner is to unmap them and call pool_release()), and nothing of
 * the owner's is placed in them any more. With to_backend, pool_release() gives them to the
 * backend instead of the cache. Fills ret_ids (at most max_ids), sets *ret_bytes, returns how
 * many.
 */
size_t pool_reclaim(struct pool *pool, struct pool_owner *owner, uint64_t want_bytes, bool to_backend, uint64_t *ret_ids,
                    size_t max_ids, uint64_t *ret_bytes);

/* Undoes pool_reclaim() for segments the owner could not be told about: it keeps them again. */
void pool_unreclaim(struct pool *pool, struct pool_owner *owner, const uint64_t *ids, size_t n);

/* Gives every cached segment back to the backend. Sets the count and bytes released. */
void pool_flush(struct pool *pool, uint64_t *ret_segments, uint64_t *ret_bytes);

void pool_get_stats(const struct pool *pool, struct pool_stats *ret);

/* The smallest segment a request of size bytes can be served from (for error messages). */
uint64_t pool_min_segment_bytes(uint64_t size);

/*
 * Checks every invariant: blocks tile their segments without overlap, no two free
 * neighbours, the indices hold exactly the free blocks, and the byte accounting sums per
 * owner and per device. Returns 0, or -EUCLEAN with what is wrong in why.
 */
int pool_check(const struct pool *pool, char *why, size_t why_size);

#endif
