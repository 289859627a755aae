/*
 * pool.h: the node's segments on one device. No I/O: memory comes from a struct backend, and
 * who may have how much is decided by the caller (policy) and passed in as headroom. The
 * pool's own rules (a new segment's size, which cached one serves, least recently cached
 * released first) are policy's too, named in policy.h.
 *
 * Segments come from the backend in classes (common/heap.h sizes them): a request of at most
 * 1 MiB gets a 2 MiB segment, up to 10 MiB a 20 MiB one, larger ones a segment of their own
 * rounded up to 2 MiB. Each segment is leased whole to one owner (a client) at a time, because
 * a handle to a segment opens all of it; the owner's process carves its blocks from it
 * (client/client_pool.c) and says what it holds (pool_owner_report()). A segment it returns
 * goes to the pool's cache (LRU), from which any owner may lease it; a segment that changes
 * tenant is zeroed by the backend first.
 *
 * Byte accounting (checked by pool_check()): reserved = leased + cached, and each owner's
 * reserved is the sum of its segments.
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

/*
 * Sums over a group of owners (a tenant's clients on one device). The pool keeps them as its
 * owners lease, return, report and detach, so that nobody accounts for them twice.
 */
struct pool_group {
        uint64_t reserved_bytes;
        uint64_t in_use_bytes;          /* as the owners last reported */
};

/* One client's part of one pool. Embedded in the session; fields above the line are read-only. */
struct pool_owner {
        uint64_t reserved_bytes;        /* sum of the sizes of the segments leased to it */
        uint64_t segments;
        uint64_t principal;             /* segments moving to another principal are zeroed (identity.h) */
        /* What the owner says it holds in its segments (Usage), and when it said so. */
        uint64_t reported_in_use_bytes;
        uint64_t reported_held_free_bytes;
        uint64_t reported_at_ms;
        bool reported;
        /* ---- private to pool.c ---- */
        struct pool_group *group;       /* the sums its bytes are part of, or NULL */
        struct pool *pool;
        struct gp_rb_tree segments_by_id;
        struct pool_owner *prev, *next;
};

/* What pool_lease() leased. */
struct pool_lease {
        uint64_t segment_id;
        uint64_t segment_size;
        const struct backend_mem *mem;  /* the segment's memory, for exporting */
};

struct pool_stats {
        uint64_t total_bytes;           /* capacity */
        uint64_t reserved_bytes;        /* held from the backend */
        uint64_t in_use_bytes;          /* what owners report of their live blocks */
        uint64_t cached_bytes;          /* wholly free segments in the cache */
        uint64_t charged_bytes;         /* what clients charged outside the pool (pool_set_charged()) */
        uint64_t segments;
        uint64_t cached_segments;
        uint64_t zeroing_bytes;         /* segments being zeroed on the device, for a lease that waits */
        uint64_t evictions_total;               /* cached segments released to make room */
        uint64_t idle_releases_total;          /* cached segments idle too long */
        uint64_t watermark_releases_total;      /* cached segments over the watermark */
        uint64_t stocked_total;                 /* granule segments made ahead (pool_stock()) */
        /* The device as the driver saw it at the last reading (gpu_known: the backend tells it). */
        bool gpu_known;
        uint64_t gpu_free_bytes;                /* free on the device, every process counted */
        uint64_t gpu_total_bytes;
        uint64_t headroom_bytes;                /* what the pool leaves free on the device */
        uint64_t headroom_releases_total;       /* cached segments released because others took the headroom */
};

/*
 * The stock: segments of one granule (GP_GRANULE_BYTES) made ahead of the leases that will ask
 * for them (a granule lease's), so that such a lease finds them in the cache instead of
 * waiting for the backend to make each. pool_stock() makes one into the cache, fresh (held by
 * no principal: anyone's, unzeroed), where the capacity, the device's room beyond its headroom
 * and max_cached_bytes allow it without evicting anything: 0, -ENOSPC without room, or the
 * backend's error. They are cached segments like any other (leased, evicted, released idle or
 * past the watermark, flushed). Where the backend exports descriptors ahead, it exports the
 * new one's too, while it holds fewer than exports_ahead on the device (backend_exports_ahead()),
 * so that its lease exports nothing. pool_stocked() counts the fresh granules in the cache.
 */
int pool_stock(struct pool *pool, uint64_t max_cached_bytes, unsigned exports_ahead);
uint64_t pool_stocked(const struct pool *pool);

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

/*
 * Reads the device's memory from the backend now (the stats show it). Returns false when the
 * backend cannot tell.
 */
bool pool_read_device(struct pool *pool);

/*
 * Keeps the device's headroom free: when others (a new process's context, libraries, programs
 * without gpupool) have taken part of it, releases cached segments, oldest first, until the
 * headroom is free again or the cache is empty. Returns the bytes released; *ret_short is what
 * of the headroom others still hold after that (0: none, or the backend cannot tell).
 */
uint64_t pool_keep_headroom(struct pool *pool, uint64_t *ret_short);

/*
 * Grows the capacity to what the device would give a pool started now: its free memory and
 * what the pool holds, less the headroom, in 2 MiB segments, where that is more (memory others
 * held when the pool's capacity was read is free again: the contexts of clients alive at a
 * restart, a program that exited). Never shrinks it. Reads the device as last read
 * (pool_keep_headroom() reads it). Returns the bytes the capacity grew by.
 */
uint64_t pool_follow_device(struct pool *pool);

/* Releases the oldest cached segments until at most max_cached_bytes are cached. Returns the bytes released. */
uint64_t pool_trim_cache(struct pool *pool, uint64_t max_cached_bytes);

/* Gives every segment back to the backend and frees the pool. Owners must be detached first. NULL is fine. */
void pool_free(struct pool *pool);

/*
 * Attaches an owner (zeroed by the caller or not) to pool, as principal: a segment that last
 * belonged to another principal is zeroed (or made fresh) before it is leased to it.
 */
void pool_owner_attach(struct pool *pool, struct pool_owner *owner, uint64_t principal);

/*
 * Makes the owner's reserved and reported in-use bytes part of group (NULL: of none), taking
 * them out of the group they were part of: from then on the pool keeps group's sums as the
 * owner leases, returns and reports.
 */
void pool_owner_set_group(struct pool_owner *owner, struct pool_group *group);

/*
 * Returns everything the owner holds to the cache and detaches it. Call
 * only when the owner can no longer touch the memory (it unmapped it, or its process has
 * exited). Returns the bytes that went back to the cache.
 */
uint64_t pool_owner_detach(struct pool_owner *owner);

/*
 * Keeps what the owner reports it holds in its segments: in_use_bytes in live blocks,
 * held_free_bytes in segments holding none, as of now_ms; clamped to what it leases (held
 * free first). The pool's in-use bytes count the reports.
 */
void pool_owner_report(struct pool_owner *owner, uint64_t in_use_bytes, uint64_t held_free_bytes, uint64_t now_ms);

/*
 * Where a lease's segment comes from: the pool's rungs of the eviction ladder, which evict.c
 * climbs in this order.
 */
enum pool_source {
        POOL_FROM_CACHE,        /* a cached segment that serves (policy_cache_serves(): at most a quarter more) */
        POOL_FROM_FREE,         /* a new one in free capacity, and in what the device has free beyond its headroom */
        POOL_FROM_EVICTION,     /* a new one once cached segments, least recently cached first, went back to the backend */
};

/*
 * Leases owner a whole segment for a block of size bytes, which the owner carves itself, from
 * one source: the class's segment if headroom_bytes allows (how many more bytes the owner may
 * reserve; UINT64_MAX: no limit), else the smallest that serves; zeroed when it last belonged
 * to another principal. A new segment must fit both the capacity and what the device has free
 * beyond its headroom (where the backend tells it); a request of HEAP_SMALL_REQUEST takes
 * exactly one granule (a granule lease's segments). Returns 0 and fills *ret; -ENOENT when the
 * source has none (the cache none that serves; free capacity too little, or the backend
 * fuller than counted with segments cached); -EINVAL for a size of 0 or over
 * POOL_MAX_REQUEST; -EDQUOT when the smallest segment that would serve exceeds
 * headroom_bytes; -ENOMEM when the device is full with the cache released (POOL_FROM_EVICTION);
 * -EINPROGRESS when the segment it found must be zeroed for this owner's principal and the
 * zeroing runs on the device (ask again once pool_poll_zeroing() has seen it end: the segment
 * is then in the cache, zero); or the backend's error.
 */
int pool_lease(struct pool *pool, struct pool_owner *owner, enum pool_source from, uint64_t size, uint64_t headroom_bytes,
               struct pool_lease *ret);

/*
 * Takes memory a client holds from a daemon before this one (mem, the backend's mem_adopt made
 * it) into the pool as a segment of size bytes leased to owner, as if just leased: within
 * headroom_bytes (-EDQUOT) and the capacity, the cache making room oldest first (-ENOMEM).
 * The caller has checked that the pool does not hold that memory already (pool_holds()).
 * Returns 0 and fills *ret, the pool then owning mem; else mem stays the caller's.
 */
int pool_adopt(struct pool *pool, struct pool_owner *owner, const struct backend_mem *mem, uint64_t size,
               uint64_t headroom_bytes, struct pool_lease *ret);

/* Whether the pool holds the memory the backend's mem_ident names ident (0: never). */
bool pool_holds(const struct pool *pool, uint64_t ident);

/* Gives an adopted segment that never reached its owner back to the backend (not to the cache: it never was the pool's). */
void pool_adopt_undo(struct pool *pool, struct pool_owner *owner, uint64_t segment_id);

/* Takes back a segment leased to the owner that never reached it (its report is left as it is). */
void pool_lease_undo(struct pool *pool, struct pool_owner *owner, uint64_t segment_id);

/*
 * Moves the segment segment_id from owner from to owner to, as it is (no zeroing: the caller
 * gives it to the same principal), and says its size. Returns 0, or -ENOENT when from does not
 * lease it.
 */
int pool_transfer(struct pool *pool, struct pool_owner *from, struct pool_owner *to, uint64_t segment_id,
                  uint64_t *ret_size);

/*
 * Makes the segment segment_id that owner leases immutable for good (a named object's, through
 * the backend's mem_seal). Returns 0, -ENOENT, -EOPNOTSUPP where the backend cannot, -EPERM
 * where the daemon has none of its memory (mem.held), -EBUSY while it is mapped writable
 * somewhere, or another negative errno. Give it back to the backend,
 * not the cache, when its owner is done with it.
 */
int pool_seal(struct pool *pool, const struct pool_owner *owner, uint64_t segment_id);

/*
 * A seal of segment_id of o that runs off the loop (backend seal_waits): *ret_mem becomes a copy
 * of its mem, with a descriptor of its own (the caller's to close), for the backend's mem_seal
 * on another thread. Until pool_seal_end() says how it went, and for good once sealed, the
 * segment goes back to the backend, never to the cache, whenever it is released: it may come
 * out sealed against writing. Returns 0, -ENOENT (not o's), -EOPNOTSUPP, -EPERM (as pool_seal()),
 * -EBUSY (a seal of it under way), or an errno of the descriptor's duplication.
 */
int pool_seal_begin(struct pool *p, const struct pool_owner *o, uint64_t segment_id, struct backend_mem *ret_mem);
void pool_seal_end(struct pool *p, uint64_t segment_id, bool sealed);

/*
 * A descriptor of a segment leased to the owner, made now (or the one made ahead, handed over:
 * backend mem_export_ahead) and the caller's to close once sent (read_only: opened for reading
 * only, where the backend reopens files); -ENOENT when the owner
 * leases no such segment, -EOPNOTSUPP where the backend passes no descriptors, or another
 * negative errno (-EMFILE: the daemon is out of descriptors).
 */
int pool_leased_export(struct pool *pool, const struct pool_owner *owner, uint64_t segment_id, bool read_only);
/* The memory of a segment leased to the owner (its IPC handle, say), or NULL. */
const struct backend_mem *pool_leased_mem(const struct pool *pool, const struct pool_owner *owner, uint64_t segment_id);

/* Asks the backend about each zeroing under way; those ended go to the cache (failed ones to the backend). Returns how many ended. */
unsigned pool_poll_zeroing(struct pool *pool);

/* Whether a zeroing runs on the device. */
bool pool_zeroing(const struct pool *pool);

/*
 * The owner has unmapped a segment it leased: it goes to the cache, or with to_backend back
 * to the backend. Returns 0, or -ENOENT for a segment not leased to the owner.
 */
int pool_return(struct pool *pool, struct pool_owner *owner, uint64_t segment_id, bool to_backend);

/* Gives every cached segment back to the backend. Sets the count and bytes released. */
void pool_flush(struct pool *pool, uint64_t *ret_segments, uint64_t *ret_bytes);

void pool_get_stats(const struct pool *pool, struct pool_stats *ret);

/*
 * What clients charged on the pool's device, memory outside the pool (a ChargeRequest): where
 * the backend cannot tell the device's free memory (the host backend), it takes room from the
 * capacity as leases do; where it can, the device's free memory shows it already.
 */
void pool_set_charged(struct pool *pool, uint64_t charged_bytes);

/* Changes the pool's capacity (memory adopted that was not in it: node_adopted()). Never below what it reserves. */
void pool_set_capacity(struct pool *pool, uint64_t capacity_bytes);

/* The smallest segment a request of size bytes can be served from (for error messages). */
uint64_t pool_min_segment_bytes(uint64_t size);

/*
 * Checks every invariant: every segment is leased to one attached owner or cached, the
 * indices hold exactly those, owners' reports fit what they lease, and the byte accounting
 * sums per owner and per device. Returns 0, or -EUCLEAN with what is wrong in why.
 */
int pool_check(const struct pool *pool, char *why, size_t why_size);

#endif
