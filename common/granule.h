/*
 * granule.h: physical granules behind virtual ranges, for segments that grow in place.
 *
 * The allocator core (heap.h) carves blocks from a virtual range; this layer keeps what backs
 * it. The range is cut into granules of one size; physical granules (each named by the
 * caller's id: a memfd, a cuMemCreate allocation) are interchangeable, and each granule a live
 * block touches must have one mapped there. A granule no live block touches stays mapped
 * ("idle") for the next blocks, until a block elsewhere needs memory and the process has no
 * spare: then idle granules are unmapped (the highest first, only as many as needed) and mapped
 * again where they are needed, and only what that cannot cover is obtained anew. A caller that
 * leases ahead of granule_take() follows granule_plan(): it obtains rather than moves within a
 * budget over its peak, with more ahead as granule_ahead() says, which the blocks after it take
 * before anything moves. bench/frag.c measures it: 1.041 or less held per byte in use on every
 * trace with no lease policy, 1.047 or less with this one, which moves none to a third as many
 * granules in the steady state of four traces of the six (docs/performance.md).
 *
 * The caller does the mapping (granule_ops) and serializes every call on one set. Nothing
 * here does I/O.
 */
#ifndef GP_GRANULE_H
#define GP_GRANULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRANULE_MAX_RANGES 8

struct granule_range;

struct granule_ops {
        /* Maps physical granule phys at granule k of r. Returns 0 or a negative errno. */
        int (*map)(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys);
        /* Unmaps granule k of r, which phys backs (it becomes a spare). Cannot fail. */
        void (*unmap)(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys);
        /* Obtains n more physical granules, their ids into phys. Returns 0 or a negative errno. */
        int (*obtain)(void *ctx, uint64_t n, uint64_t *phys);
        /* The caller's clock, read when a granule becomes idle (stamped on it); NULL: always 0. */
        uint64_t (*now)(void *ctx);
        /*
         * Makes granules first to first + n - 1 of r, side by side and just mapped, usable, in
         * one call (cuda-vmm: one cuMemSetAccess over the run, as the driver allows over
         * mappings side by side); NULL: a map is enough. Returns 0 or a negative errno.
         */
        int (*access)(void *ctx, struct granule_range *r, uint64_t first, uint64_t n);
};

/* One virtual range. Read-only outside granule.c. */
struct granule_range {
        struct granule_set *set;
        uint64_t count;                 /* granules in the range */
        uint32_t *refs;                 /* live blocks touching each granule */
        uint64_t *mapped, *idle;        /* bitmaps: mapped; mapped and touched by no live block */
        uint64_t *phys;                 /* the physical granule mapped at each, while mapped */
        uint64_t *idle_since;           /* the ops' clock when each became idle, while idle */
        uint64_t mapped_count, idle_count;
};

/* The ranges that share one device's physical granules. Read-only outside granule.c. */
struct granule_set {
        uint64_t granule_bytes;
        const struct granule_ops *ops;
        void *ctx;
        struct granule_range *ranges[GRANULE_MAX_RANGES];
        unsigned range_count;
        uint64_t *spare;                /* physical granules mapped nowhere */
        uint64_t *spare_since;          /* the ops' clock when each became free (obtained, or idle) */
        uint64_t spare_count, spare_cap;
        uint64_t held;                  /* physical granules: mapped or spare */
        uint64_t maps, unmaps, obtained;        /* operations since init */
};

/* Returns 0, or -EINVAL for a granule that is 0. */
int granule_set_init(struct granule_set *s, uint64_t granule_bytes, const struct granule_ops *ops, void *ctx);
/* Frees the set's own memory (the caller has given its physical granules back). */
void granule_set_destroy(struct granule_set *s);

/* Adds a range of bytes (a multiple of the granule) to s. Returns 0, -EINVAL, -ENOSPC (too many) or -ENOMEM. */
int granule_range_init(struct granule_set *s, struct granule_range *r, uint64_t bytes);
/* Takes r out of its set; the physical granules mapped there leave the set, to the caller. */
void granule_range_destroy(struct granule_range *r);

/*
 * Before a block at [offset, offset + size) of r is handed out: counts it on its granules and
 * maps each that is not, from a spare, else from idle granules elsewhere, else obtained, each
 * run of them side by side made usable at once (ops->access). Returns 0, or a negative errno
 * (ops failed, or no memory for the records) with nothing counted: granules it mapped and made
 * usable stay mapped, idle; those it could not make usable are unmapped again, spares.
 */
int granule_take(struct granule_range *r, uint64_t offset, uint64_t size);

/* After the block at [offset, offset + size) of r was freed: its granules no other block touches become idle. */
void granule_give(struct granule_range *r, uint64_t offset, uint64_t size);

/*
 * Unmaps up to want idle granules of every range that became idle at or before before (the
 * ops' clock; UINT64_MAX: any), the highest first, into the spares. Returns how many.
 */
uint64_t granule_unmap_idle(struct granule_set *s, uint64_t want, uint64_t before);

/* How many of the granules under [offset, offset + size) of r are not mapped (0 for a span outside r). */
uint64_t granule_unmapped(const struct granule_range *r, uint64_t offset, uint64_t size);

/*
 * How many physical granules granule_take() of the same block would obtain now: those of its
 * granules that are not mapped, less the spares and the idle granules elsewhere. A caller
 * whose obtaining must not run inside granule_take() (it lets go of a lock) obtains them
 * first and hands them over with granule_add_spares(); then granule_take() obtains nothing.
 */
uint64_t granule_shortfall(const struct granule_range *r, uint64_t offset, uint64_t size);

/*
 * The lease policy of segments that grow in place (libgpupool's, and bench/frag.c's model of
 * it), for the block at [offset, offset + size) of r, where the set's blocks hold in_use bytes
 * now and held peak_in_use at most (both counting it) since the caller last gave granules back:
 *
 *   must   what it cannot do without (granule_shortfall());
 *   want   must, or more: rather than move idle granules, it obtains what its unmapped granules
 *          lack beyond the spares, as long as the set then holds within a GRANULE_KEEP_DIVISOR-th
 *          over peak_in_use, so that a program in a steady state ends up with every granule its
 *          blocks land on mapped and moves none (on cuda-vmm a move is a cuMemUnmap,
 *          "synchronous for most use cases", a cuMemMap and a cuMemSetAccess); past that budget,
 *          idle granules move as before. Where must is 0, only for room of at least a
 *          GRANULE_KEEP_MIN_DIVISOR-th of what the set holds: a lease is a round trip;
 *   ahead  how many to ask for beyond must, where the daemon has them at once (want - must
 *          among them): granule_ahead() more, or the rest of the budget's room where the block
 *          wants more than it must have.
 *
 * All 0: the spares and idle granules cover it. peak_in_use 0 asks for must only (and ahead).
 * Measured by bench-frag and bench-replay (see docs/performance.md).
 */
#define GRANULE_KEEP_DIVISOR 24
#define GRANULE_KEEP_MIN_DIVISOR 96
struct granule_plan {
        uint64_t must, want, ahead;
};
void granule_plan(const struct granule_range *r, uint64_t offset, uint64_t size, uint64_t peak_in_use, uint64_t in_use,
                  struct granule_plan *p);

/*
 * The ahead part of granule_plan(): when a block of a set whose blocks hold in_use bytes (that
 * block among them) lacks shortfall granules, how many more the caller asks for with them,
 * where the daemon has them at once. Enough to bring what the set holds to in_use and a GRANULE_SLACK_DIVISOR-th more, so
 * that the blocks of the next iterations find granules mapped where they land, or spares,
 * instead of moving idle ones, and the next growth needs no lease; and at least a
 * GRANULE_AHEAD_DIVISOR-th of what the set will hold, so that a set the blocks fragment past
 * that slack still grows in fewer leases. Measured by bench-replay and bench-frag (see
 * docs/performance.md).
 */
#define GRANULE_SLACK_DIVISOR 32
#define GRANULE_AHEAD_DIVISOR 192
uint64_t granule_ahead(const struct granule_set *s, uint64_t shortfall, uint64_t in_use);

/*
 * Where a block lands in a set's ranges (libgpupool's placement, and bench/frag.c's model of
 * it), for heap_alloc_cheapest() over a heap whose segments of class k are ranges[k]: not the
 * best fit alone but, of the best fit and the free blocks after it in size order of at most
 * twice rsize (or a granule more), GRANULE_PLACE_TRIES in all, the first with the fewest
 * granules under it not mapped (granule_unmapped()). A hole whose granules are still mapped
 * serves the block where the best fit would have it map granules there, moved from elsewhere
 * or leased; only blocks up to twice the size are weighed, so that a block is not carved from
 * the large free spans the blocks after it need whole. Measured by bench-frag and bench-replay
 * (see docs/performance.md).
 */
#define GRANULE_PLACE_TRIES 16
struct heap_choice;
void granule_choice(struct granule_range *ranges, uint64_t rsize, struct heap_choice *ret);

/* Adds n physical granules obtained by the caller to the spares, free from now on. Returns 0, or -ENOMEM with none added. */
int granule_add_spares(struct granule_set *s, const uint64_t *phys, uint64_t n);

/* Physical granules held that no live block touches: idle in every range, and spare. */
uint64_t granule_free_count(const struct granule_set *s);

/*
 * Takes up to max spares free since at or before before (UINT64_MAX: any) out of the set, to
 * give them back, the oldest first, their ids into phys. Returns how many.
 */
uint64_t granule_release_spares(struct granule_set *s, uint64_t *phys, uint64_t max, uint64_t before);

/*
 * Takes up to max granules no live block touches, free since at or before before, out of the
 * set: spares first, then idle granules (unmapped, the highest first). Returns how many.
 */
uint64_t granule_release(struct granule_set *s, uint64_t *phys, uint64_t max, uint64_t before);

/* Checks every count and bitmap against the others. Returns 0, or -EUCLEAN with what is wrong in why. */
int granule_check(const struct granule_set *s, char *why, size_t why_size);

#endif
