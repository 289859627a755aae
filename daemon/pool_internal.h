/*
 * pool_internal.h: the pool's segments and indices, for pool.c and pool_check.c alone (no
 * other file includes it: pool.h is the pool's interface).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "pool.h"
#include "rbtree.h"
#include "wire.h"

/*
 * A segment is leased to its owner (owner set), in the pool's cache, or being zeroed (owner
 * NULL, zeroing set: in pool->zeroing until the backend says it is zero, then cached clean).
 */
struct segment {
        uint64_t id;
        uint64_t size;
        struct pool_owner *owner;
        uint64_t last_principal;
        bool has_principal;
        bool to_backend;                /* reclaimed by a flush: straight back to the backend once released */
        bool sealing, sealed;           /* a seal under way off the loop, or done: back to the backend once released */
        bool zeroing;
        uint64_t cache_seq;
        uint64_t cached_at_ms;          /* when it entered the cache */
        uint64_t ident;                 /* the backend's name for its memory (mem_ident), 0: none */
        struct backend_mem mem;
        struct gp_rb_node by_id;        /* pool->segments_by_id */
        struct gp_rb_node owner_node;   /* owner->segments_by_id, pool->cache_by_size or pool->zeroing */
        struct gp_rb_node age_node;     /* pool->cache_by_age */
        struct gp_rb_node ident_node;   /* pool->by_ident, where ident is set */
};

struct pool {
        struct backend *backend;
        unsigned device;
        uint64_t capacity_bytes;
        uint64_t reserved_bytes;
        uint64_t reported_in_use_bytes; /* what owners report */
        uint64_t cached_bytes;
        uint64_t charged_bytes;         /* clients' memory on the device outside the pool (pool_set_charged()) */
        uint64_t next_id;
        uint64_t cache_seq;
        uint64_t evictions, idle_releases, watermark_releases;
        uint64_t fresh_granules;        /* cached segments of one granule that no principal held: the stock */
        uint64_t stocked;               /* segments made ahead (pool_stock()) */
        uint64_t (*clock_ms)(void *ctx);
        void *clock_ctx;
        struct gp_rb_tree segments_by_id;
        struct gp_rb_tree cache_by_size;
        struct gp_rb_tree cache_by_age;
        struct gp_rb_tree zeroing;      /* by id: segments whose zeroing runs on the device */
        struct gp_rb_tree by_ident;     /* segments by ident, those with one */
        uint64_t zeroing_bytes;
        struct backend_device_memory gpu;       /* the device's memory at the last reading */
        bool gpu_known;                         /* the backend tells it (pool_read_device) */
        uint64_t headroom_releases;
        struct pool_owner *owners;
};

/* Whether cached segment s is a segment of the stock: one granule, held by no principal since it was made. */
static inline bool pool_fresh_granule(const struct segment *s) {
        return s->size == GP_GRANULE_BYTES && !s->has_principal;
}
