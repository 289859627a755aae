/*
 * frag.c: "make bench-frag": how much memory each allocator policy holds to serve a trace.
 *
 * Replays allocation traces (the CSV files in bench/traces: time, op, id, size, stream) through
 * the policies below and reports, for each, the peak of memory reserved from the device, the
 * peak the client holds, the peak of memory in use (the sizes asked, rounded to 512 B), and
 * the ratio of reserved to in use: 1.00 would be no overhead at all. The policies:
 *
 *   client   gpupool: the process's own pool, the allocator core (common/heap.c) carving the
 *            segments the process leases, of the request's class (2/20 MiB, or its own
 *            rounded to 2 MiB), 512 B best fit with split and merge, kept while empty (a
 *            replay has no idle time, and nobody asks for them back);
 *   pytorch  a re-implementation of PyTorch's CUDACachingAllocator defaults (from its source,
 *            see docs/performance.md): small (<= 1 MiB) and large pools, 2 MiB segments for
 *            small requests, 20 MiB for 1-10 MiB, larger rounded to 2 MiB; best fit; split a
 *            small block when 512 B or more remain, a large one when more than 1 MiB remains;
 *            merge with free neighbours; never give a segment back;
 *   cupy     a re-implementation of CuPy's MemoryPool: a segment of exactly the rounded size
 *            on a miss, best fit over all free chunks, split and merge, never given back;
 *   none     no cache: every allocation is its own rounded segment, freed at once.
 *
 * And three models of segments that grow in place, each over one large virtual range per
 * class carved by the same allocator core (best fit, split, merge; granule and grow place a
 * block as libgpupool does, where the fewest of its granules are not mapped among the best fit
 * and the free blocks up to twice its size: granule_choice()):
 *
 *   expand   the range is backed by 2 MiB granules mapped at its end as it grows, never
 *            unmapped: PyTorch's expandable_segments without empty_cache();
 *   granule  common/granule.c alone: physical granules are interchangeable, each granule a
 *            block touches is mapped where it lies, and when the process has no spare
 *            granule it unmaps whole free granules (the highest first, as many as the block
 *            needs) to map them again there, and obtains only what that cannot cover;
 *   grow     libgpupool's $GPUPOOL_SEGMENTS=grow: the same core under the client's lease
 *            policy (granule_plan()): a block obtains what it lacks rather than move idle
 *            granules while the process holds within a 24th over its peak in use, with
 *            granule_ahead() more, leased and taken as spares before the block is mapped
 *            (the daemon here has every granule asked at once).
 *
 *   big      a study, not libgpupool: grow, but a block of BIG bytes or more (-b MiB each, 64
 *            MiB unless given) is an allocation of its own (a piece, its size rounded to the
 *            granule: one lease, one import, one map), kept idle once freed for a block it
 *            fits within a 24th, and given back, the largest idle first, where a new piece
 *            would take what the process holds (granules and pieces) past a 24th over its
 *            peak in use; the granules' budget is that less what the pieces hold (see
 *            struct pieces below).
 *
 *   runs     a study, not libgpupool: each run of granules a block lacks leased as one physical
 *            allocation (a piece, imported and mapped whole), and runs-adapt, which gives back
 *            idle pieces a block would mostly waste and leases granule by granule under
 *            pressure, and runs-budget, which leases a run as one piece only where the budget
 *            has room for it and granule by granule where not (see run_runs() below): what
 *            fewer imports would cost in memory.
 *
 *   bound    not a policy: the fewest leases (and so imports) that any process can take
 *            whose policy never holds more than 1.05 of its peak in use so far, placement
 *            ignored (run_bound() below says why nothing within that bound does better), over
 *            the trace and in its second half (where 0 says none must lease).
 *
 *            The granule and grow rows also give their cost: the leases (each a round trip, however
 *            many granules it brings), the granules leased, the maps and the unmaps, over the
 *            whole trace and over its second half (a program's steady state, where a caching
 *            allocator pays nothing: on cuda-vmm a map is a cuMemMap and a cuMemSetAccess, an
 *            unmap a cuMemUnmap).
 *
 * Usage: frag [-g GRANULE_MIB] [-b BIG_MIB...] TRACE.csv...   (the models' granule, 2 MiB unless
 *        given; -b, which may be given more than once, the big model's sizes, 64 MiB unless given)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granule.h"
#include "heap.h"
#include "rbtree.h"
#include "trace.h"

#define MiB (1ULL << 20)


static uint64_t round512(uint64_t n) {
        return (n + 511) & ~511ULL;
}

/* ---- a generic segment allocator: the pytorch and cupy policies ---- */

struct seg;

struct blk {
        struct seg *seg;
        uint64_t off, size;
        bool free;
        struct blk *prev, *next;
        struct gp_rb_node node;         /* in its pool's free index while free */
};

struct seg {
        int pool;
        uint64_t id;                    /* creation order: ties in the free index break on it, the same every run */
};

struct policy {
        int (*pool_of)(uint64_t rsize);
        uint64_t (*segment_size)(uint64_t rsize);
        bool (*should_split)(int pool, uint64_t remaining);
};

struct segalloc {
        const struct policy *p;
        struct gp_rb_tree free_index[2];
        uint64_t reserved, in_use, next_seg;
};

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_free(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct blk *a = gp_rb_entry(x, struct blk, node), *b = gp_rb_entry(y, struct blk, node);

        if (a->size != b->size)
                return CMP(a->size, b->size);
        if (a->seg != b->seg)
                return CMP(a->seg->id, b->seg->id);
        return CMP(a->off, b->off);
}

static void sa_init(struct segalloc *s, const struct policy *p) {
        memset(s, 0, sizeof(*s));
        s->p = p;
        gp_rb_init(&s->free_index[0], cmp_free);
        gp_rb_init(&s->free_index[1], cmp_free);
}

static struct blk *sa_alloc(struct segalloc *s, uint64_t size) {
        uint64_t rsize = round512(size);
        int pool = s->p->pool_of(rsize);
        static struct seg first = { .id = 0 };
        struct blk key = { .seg = &first, .off = 0, .size = rsize }, *b;
        struct gp_rb_node *n = gp_rb_lower_bound(&s->free_index[pool], &key.node);

        if (n) {
                b = gp_rb_entry(n, struct blk, node);
                gp_rb_remove(&s->free_index[pool], &b->node);
        } else {
                struct seg *g = calloc(1, sizeof(*g));

                b = calloc(1, sizeof(*b));
                g->pool = pool;
                g->id = ++s->next_seg;
                b->seg = g;
                b->size = s->p->segment_size(rsize);
                s->reserved += b->size;
        }
        if (b->size > rsize && s->p->should_split(pool, b->size - rsize)) {
                struct blk *rest = calloc(1, sizeof(*rest));

                *rest = (struct blk) { .seg = b->seg, .off = b->off + rsize, .size = b->size - rsize, .free = true,
                                       .prev = b, .next = b->next };
                if (b->next)
                        b->next->prev = rest;
                b->next = rest;
                b->size = rsize;
                gp_rb_insert(&s->free_index[pool], &rest->node);
        }
        b->free = false;
        s->in_use += rsize;
        return b;
}

static void sa_free(struct segalloc *s, struct blk *b, uint64_t size) {
        int pool = b->seg->pool;

        s->in_use -= round512(size);
        b->free = true;
        if (b->next && b->next->free) {
                struct blk *n = b->next;

                gp_rb_remove(&s->free_index[pool], &n->node);
                b->size += n->size;
                b->next = n->next;
                if (n->next)
                        n->next->prev = b;
                free(n);
        }
        if (b->prev && b->prev->free) {
                struct blk *p = b->prev;

                gp_rb_remove(&s->free_index[pool], &p->node);
                p->size += b->size;
                p->next = b->next;
                if (b->next)
                        b->next->prev = p;
                free(b);
                b = p;
        }
        gp_rb_insert(&s->free_index[pool], &b->node);
}

static int pt_pool(uint64_t r) {
        return r <= MiB ? 0 : 1;
}

static uint64_t pt_segment(uint64_t r) {
        if (r <= MiB)
                return 2 * MiB;
        if (r < 10 * MiB)
                return 20 * MiB;
        return (r + 2 * MiB - 1) & ~(2 * MiB - 1);
}

static bool pt_split(int pool, uint64_t remaining) {
        return pool == 0 ? remaining >= 512 : remaining > MiB;
}

static const struct policy pytorch = { pt_pool, pt_segment, pt_split };

static int cp_pool(uint64_t r) {
        (void) r;
        return 0;
}

static uint64_t cp_segment(uint64_t r) {
        return r;
}

static bool cp_split(int pool, uint64_t remaining) {
        (void) pool;
        return remaining >= 512;
}

static const struct policy cupy = { cp_pool, cp_segment, cp_split };

/* ---- replay ---- */

struct result {
        uint64_t peak_reserved, peak_held, peak_in_use;
        uint64_t segments;              /* client and runs: physical allocations obtained, each an import */
        uint64_t segments_half;         /* bound: the leases in the trace's second half */
};


static struct result run_segalloc(const struct policy *p, const struct op *ops, size_t n, uint64_t max_id) {
        struct blk **live = calloc(max_id + 1, sizeof(*live));
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes));
        struct result r = { 0 };
        struct segalloc s;

        sa_init(&s, p);
        for (size_t i = 0; i < n; i++) {
                if (ops[i].alloc) {
                        live[ops[i].id] = sa_alloc(&s, ops[i].size);
                        sizes[ops[i].id] = ops[i].size;
                } else if (live[ops[i].id]) {
                        sa_free(&s, live[ops[i].id], sizes[ops[i].id]);
                        live[ops[i].id] = NULL;
                }
                if (s.reserved > r.peak_reserved)
                        r.peak_reserved = r.peak_held = s.reserved;
                if (s.in_use > r.peak_in_use)
                        r.peak_in_use = s.in_use;
        }
        free(live);
        free(sizes);
        return r;      /* the blocks and segments are left to the process's exit */
}

/*
 * The process's own pool (libgpupool over leased segments): common/heap.c carving segments of
 * the request's class that the process leases from the daemon and keeps while they hold
 * nothing (a replay has no idle time and no one asking for them back).
 */
static struct result run_client(const struct op *ops, size_t n, uint64_t max_id) {
        struct heap_block **live = calloc(max_id + 1, sizeof(*live));
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes));
        struct result r = { 0 };
        uint64_t leased = 0, next_id = 1, in_use = 0;
        struct heap h;

        heap_init(&h);
        for (size_t i = 0; i < n; i++) {
                if (ops[i].alloc) {
                        uint64_t rsize = heap_round(ops[i].size);
                        enum heap_class class = heap_class_of(rsize);
                        struct heap_block *b = heap_alloc(&h, class, rsize);

                        if (!b) {
                                struct heap_segment *s = calloc(1, sizeof(*s));
                                uint64_t size = heap_segment_bytes(rsize);

                                if (!s || heap_add(&h, s, next_id++, size, class) < 0)
                                        exit(1);
                                leased += size;
                                r.segments++;
                                b = heap_alloc(&h, class, rsize);
                        }
                        live[ops[i].id] = b;
                        sizes[ops[i].id] = rsize;
                        in_use += rsize;
                } else if (live[ops[i].id]) {
                        (void) heap_free(&h, live[ops[i].id]);
                        live[ops[i].id] = NULL;
                        in_use -= sizes[ops[i].id];
                }
                if (leased > r.peak_reserved)
                        r.peak_reserved = r.peak_held = leased;
                /* As asked, rounded: a large block may hold up to 1 MiB more that nobody asked for. */
                if (in_use > r.peak_in_use)
                        r.peak_in_use = in_use;
        }
        free(live);
        free(sizes);
        return r;      /* the blocks and segments are left to the process's exit */
}

/* ---- models of segments that grow in place ---- */

static uint64_t granule_bytes = 2ULL << 20;            /* the models' granule (-g MiB) */
#define RANGE_GRANULES (1ULL << 19)                     /* per class: 1 TiB of virtual range at 2 MiB */
#define RANGE (RANGE_GRANULES * granule_bytes)

/* The granule model's mapping: nothing to map in a replay; physical granules numbered as obtained. */
static int model_map(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        (void) ctx, (void) r, (void) k, (void) phys;
        return 0;
}

static void model_unmap(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        (void) ctx, (void) r, (void) k, (void) phys;
}

static int model_obtain(void *ctx, uint64_t n, uint64_t *phys) {
        uint64_t *next = ctx;

        for (uint64_t i = 0; i < n; i++)
                phys[i] = (*next)++;
        return 0;
}

static const struct granule_ops model_ops = { model_map, model_unmap, model_obtain, NULL, NULL };

enum model { EXPAND, GRANULE, GROW };

/* The grow model's lease: n granules obtained and taken as spares, before the block is mapped. */
static void lease_spares(struct granule_set *g, uint64_t *next_phys, uint64_t n) {
        uint64_t *phys = malloc(n * sizeof(*phys));

        if (!phys || model_obtain(next_phys, n, phys) < 0 || granule_add_spares(g, phys, n) < 0)
                exit(1);
        free(phys);
}

/* The leases of the granule models, over the trace and before its second half. */
struct leases {
        uint64_t all, half;
};

/*
 * The big model's pieces: each block of big_bytes or more has an allocation of its own (a
 * piece, leased, imported and mapped whole), kept idle once freed. A piece serves a later
 * block it fits within a GRANULE_KEEP_DIVISOR-th; else a new one is leased, idle pieces going
 * back first, the largest first, then granules no block touches, while the new one would take
 * what the process holds past that share over its peak in use.
 */
struct pieces {
        uint64_t big_bytes;
        uint64_t *size;                 /* each piece's (0: given back) */
        bool *busy;
        size_t n, cap;
        uint64_t *of;                   /* per live block id: its piece + 1, or 0 */
        uint64_t held, in_use;          /* bytes of the pieces held; of the blocks on them */
        uint64_t leases, returns, leases_half, returns_half;
        uint64_t granules_back;         /* granules given back to make room for pieces */
};

/* Gives idle pieces back, the largest first, while the granules of g, the pieces and more bytes pass cap. */
static void pieces_make_room(struct pieces *pc, const struct granule_set *g, uint64_t more, uint64_t cap) {
        while (g->held * granule_bytes + pc->held + more > cap) {
                size_t largest = SIZE_MAX;

                for (size_t i = 0; i < pc->n; i++)
                        if (pc->size[i] && !pc->busy[i] && (largest == SIZE_MAX || pc->size[i] > pc->size[largest]))
                                largest = i;
                if (largest == SIZE_MAX)
                        return;
                pc->held -= pc->size[largest];
                pc->size[largest] = 0;
                pc->returns++;
        }
}

/* A piece for block id of rsize bytes, within cap bytes held with the granules of g. */
static void piece_take(struct pieces *pc, struct granule_set *g, uint64_t id, uint64_t rsize, uint64_t cap) {
        uint64_t want = (rsize + granule_bytes - 1) / granule_bytes * granule_bytes;
        size_t best = SIZE_MAX;

        for (size_t i = 0; i < pc->n; i++)
                if (pc->size[i] && !pc->busy[i] && pc->size[i] >= rsize &&
                    pc->size[i] - rsize <= rsize / GRANULE_KEEP_DIVISOR && (best == SIZE_MAX || pc->size[i] < pc->size[best]))
                        best = i;
        if (best == SIZE_MAX) {
                pieces_make_room(pc, g, want, cap);
                if (g->held * granule_bytes + pc->held + want > cap) {
                        uint64_t over = (g->held * granule_bytes + pc->held + want - cap + granule_bytes - 1) / granule_bytes;
                        uint64_t *phys = malloc(over * sizeof(*phys));

                        if (!phys)
                                exit(1);
                        pc->granules_back += granule_release(g, phys, over, UINT64_MAX);
                        free(phys);
                }
                if (pc->n == pc->cap) {
                        pc->cap = pc->cap ? 2 * pc->cap : 64;
                        pc->size = realloc(pc->size, pc->cap * sizeof(*pc->size));
                        pc->busy = realloc(pc->busy, pc->cap * sizeof(*pc->busy));
                        if (!pc->size || !pc->busy)
                                exit(1);
                }
                best = pc->n++;
                pc->size[best] = want;
                pc->held += want;
                pc->leases++;
        }
        pc->busy[best] = true;
        pc->of[id] = best + 1;
        pc->in_use += rsize;
}

/*
 * expand: each class's range is mapped up to the end of the highest block it ever held.
 * granule and grow: common/granule.c keeps what backs the ranges (grow leasing as libgpupool
 * does). Leaves the granule models' counts in g, and at the second half's start in half.
 */
static struct result run_growing(const struct op *ops, size_t n, uint64_t max_id, enum model model, struct granule_set *g,
                                 struct granule_set *half, struct leases *leases, struct pieces *pc) {
        bool remap = model != EXPAND;
        struct heap_block **live = calloc(max_id + 1, sizeof(*live));
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes)), in_use = 0, extent[HEAP_CARVED_CLASSES] = { 0 }, held = 0;
        uint64_t next_phys = 0;
        struct granule_range range[HEAP_CARVED_CLASSES];
        struct heap_segment seg[HEAP_CARVED_CLASSES];
        struct result r = { 0 };
        struct heap h;

        heap_init(&h);
        if (!live || !sizes || granule_set_init(g, granule_bytes, &model_ops, &next_phys) < 0)
                exit(1);
        for (int c = 0; c < HEAP_CARVED_CLASSES; c++)
                if (heap_add(&h, &seg[c], (uint64_t) c + 1, RANGE, (enum heap_class) c) < 0 ||
                    (remap && granule_range_init(g, &range[c], RANGE) < 0))
                        exit(1);
        for (size_t i = 0; i < n; i++) {
                if (i == n / 2) {
                        *half = *g;     /* the counts at the second half's start */
                        leases->half = leases->all;
                        if (pc) {
                                pc->leases_half = pc->leases;
                                pc->returns_half = pc->returns;
                        }
                }
                if (ops[i].alloc && pc && heap_round(ops[i].size) >= pc->big_bytes) {
                        uint64_t rsize = heap_round(ops[i].size);
                        uint64_t peak = in_use + rsize > r.peak_in_use ? in_use + rsize : r.peak_in_use;

                        piece_take(pc, g, ops[i].id, rsize, peak + peak / GRANULE_KEEP_DIVISOR);
                        sizes[ops[i].id] = rsize;
                        in_use += rsize;
                } else if (!ops[i].alloc && pc && pc->of[ops[i].id]) {
                        pc->busy[pc->of[ops[i].id] - 1] = false;
                        pc->of[ops[i].id] = 0;
                        pc->in_use -= sizes[ops[i].id];
                        in_use -= sizes[ops[i].id];
                } else if (ops[i].alloc) {
                        uint64_t rsize = heap_round(ops[i].size);
                        enum heap_class class = heap_class_of(rsize);
                        struct heap_choice choice;
                        struct heap_block *b;
                        bool on_lane;

                        if (remap)
                                granule_choice(range, rsize, &choice);
                        b = remap ? heap_alloc_cheapest(&h, class, rsize, 0, &on_lane, &choice) : heap_alloc(&h, class, rsize);
                        uint64_t end;

                        if (!b)
                                exit(1);
                        end = (b->offset + b->size + granule_bytes - 1) / granule_bytes;
                        if (remap) {
                                uint64_t peak = in_use + rsize > r.peak_in_use ? in_use + rsize : r.peak_in_use;
                                struct granule_plan plan;
                                uint64_t lack;  /* granule: what granule_take() will obtain; grow: the lease */

                                if (model == GROW) {
                                        uint64_t granule_peak = peak, granule_in_use = in_use + rsize;

                                        /*
                                         * The big model: the granules' budget is what the pieces leave of it,
                                         * and idle pieces go back first where the granules a block must have
                                         * would pass it.
                                         */
                                        if (pc) {
                                                uint64_t off;

                                                pieces_make_room(pc, g, granule_shortfall(&range[class], b->offset, b->size) *
                                                                 granule_bytes, peak + peak / GRANULE_KEEP_DIVISOR);
                                                off = pc->held * GRANULE_KEEP_DIVISOR / (GRANULE_KEEP_DIVISOR + 1);
                                                granule_peak = granule_peak > off ? granule_peak - off : 0;
                                                granule_in_use -= pc->in_use;
                                        }
                                        granule_plan(&range[class], b->offset, b->size, granule_peak, granule_in_use, &plan);
                                        lack = plan.must + plan.ahead;
                                        if (lack)
                                                lease_spares(g, &next_phys, lack);
                                } else {
                                        lack = granule_shortfall(&range[class], b->offset, b->size);
                                }
                                leases->all += lack != 0;
                                if (granule_take(&range[class], b->offset, b->size) < 0)
                                        exit(1);
                        } else if (end > extent[class]) {
                                held += end - extent[class];
                                extent[class] = end;
                        }
                        live[ops[i].id] = b;
                        sizes[ops[i].id] = rsize;
                        in_use += rsize;
                } else if (live[ops[i].id]) {
                        struct heap_block *b = live[ops[i].id];

                        if (remap)
                                granule_give(&range[b->segment->class], b->offset, b->size);
                        (void) heap_free(&h, b);
                        live[ops[i].id] = NULL;
                        in_use -= sizes[ops[i].id];
                }
                if (remap)
                        held = g->held;
                if (held * granule_bytes + (pc ? pc->held : 0) > r.peak_reserved)
                        r.peak_reserved = r.peak_held = held * granule_bytes + (pc ? pc->held : 0);
                if (in_use > r.peak_in_use)
                        r.peak_in_use = in_use;
        }
        if (remap) {
                char why[256];

                if (granule_check(g, why, sizeof(why)) < 0) {
                        fprintf(stderr, "frag: %s\n", why);
                        exit(1);
                }
                for (int c = 0; c < HEAP_CARVED_CLASSES; c++)
                        granule_range_destroy(&range[c]);
        }
        granule_set_destroy(g);
        free(live);
        free(sizes);
        return r;      /* the blocks are left to the process's exit */
}


/* ---- a model of one physical allocation per run (a study: libgpupool leases granules) ---- */

/*
 * On cuda-vmm every physical allocation is imported and mapped whole (cuMemMap's offset
 * "currently must be zero"), so a process imports one per granule it leases. This model asks
 * what leasing each run of granules a block lacks as one allocation would hold instead: a
 * piece, mapped whole where the block lies, serving every block that lands on it, moved only
 * whole into a run it fits and given back whole. Within the same budget as grow (a
 * GRANULE_KEEP_DIVISOR-th over the peak in use) it leases; past it, it moves idle pieces that
 * fit the run, the largest first, then gives back idle pieces, the largest first, until the
 * run fits. No granules ahead.
 *
 * runs-adapt adds two rules: an idle piece that a new block would cover less than half of goes
 * back before the block lands (its bytes would otherwise be held for nothing), and each time a
 * lease does not fit the budget, runs shorter than a threshold (1 granule at first, doubled
 * each time) are leased granule by granule.
 */
struct piece {
        uint64_t first, len, busy;      /* granules first..first + len - 1 of its class's range; how many a live block touches */
        int class;
        bool mapped;                    /* false once given back (len 0) */
};

struct runs {
        bool adapt;
        bool budget;                    /* runs-budget: a run as one piece only where the budget has room for it */
        struct piece *p;
        size_t n, cap;
        int64_t *at[HEAP_CARVED_CLASSES];  /* the piece mapped at each granule, or -1 */
        uint32_t *refs[HEAP_CARVED_CLASSES];       /* live blocks touching each granule */
        uint64_t held, threshold;       /* granules held; runs shorter than threshold are leased granule by granule */
        struct runs_counts {
                uint64_t leases, imports, moves, returns;       /* imports: pieces leased */
        } count;
};

static void piece_place(struct runs *m, size_t i, int class, uint64_t first) {
        struct piece *p = &m->p[i];

        *p = (struct piece) { .first = first, .len = p->len, .class = class, .mapped = true };
        for (uint64_t k = first; k < first + p->len; k++) {
                m->at[class][k] = (int64_t) i;
                p->busy += m->refs[class][k] != 0;
        }
}

static void piece_unplace(struct runs *m, size_t i) {
        for (uint64_t k = m->p[i].first; k < m->p[i].first + m->p[i].len; k++)
                m->at[m->p[i].class][k] = -1;
        m->p[i].mapped = false;
}

static void piece_lease(struct runs *m, int class, uint64_t first, uint64_t len) {
        if (m->n == m->cap) {
                m->cap = m->cap ? 2 * m->cap : 1024;
                if (!(m->p = realloc(m->p, m->cap * sizeof(*m->p))))
                        exit(1);
        }
        m->p[m->n].len = len;
        piece_place(m, m->n++, class, first);
        m->held += len;
        m->count.imports++;
}

static void piece_give_back(struct runs *m, size_t i) {
        piece_unplace(m, i);
        m->held -= m->p[i].len;
        m->p[i].len = 0;
        m->count.returns++;
}

/* The largest idle piece, of at most max granules; SIZE_MAX if none. */
static size_t piece_idle(const struct runs *m, uint64_t max) {
        size_t best = SIZE_MAX;

        for (size_t i = 0; i < m->n; i++)
                if (m->p[i].mapped && !m->p[i].busy && m->p[i].len <= max && (best == SIZE_MAX || m->p[i].len > m->p[best].len))
                        best = i;
        return best;
}

/* Backs granules first..last of class (unmapped, the block's) within the budget. Returns whether it leased. */
static bool runs_fill(struct runs *m, int class, uint64_t first, uint64_t last, uint64_t budget) {
        uint64_t need = last - first + 1, room = budget > m->held ? budget - m->held : 0;
        size_t i;

        while (need > room && (i = piece_idle(m, need)) != SIZE_MAX) {
                uint64_t len = m->p[i].len;

                piece_unplace(m, i);
                piece_place(m, i, class, first);
                m->count.moves++;
                first += len;
                need -= len;
        }
        if (need > room && m->adapt && m->threshold <= RANGE_GRANULES)
                m->threshold *= 2;      /* past the range's granules: granule by granule from now on */
        while (need > room && (i = piece_idle(m, UINT64_MAX)) != SIZE_MAX) {
                piece_give_back(m, i);
                room = budget > m->held ? budget - m->held : 0;
        }
        if (!need)
                return false;
        if (m->budget) {
                /* runs-budget: one piece where it fits the budget, else granule by granule (each moves alone later). */
                for (uint64_t len = need <= room ? need : 1; need; first += len, need -= len)
                        piece_lease(m, class, first, len);
                return true;
        }
        for (uint64_t len = need < m->threshold ? 1 : need; need; first += len, need -= len)
                piece_lease(m, class, first, len);
        return true;
}

/* Checks the pieces against the granules and the count held; exits with what is wrong. */
static void runs_check(const struct runs *m) {
        uint64_t held = 0;

        for (size_t i = 0; i < m->n; i++) {
                uint64_t busy = 0;

                held += m->p[i].len;
                for (uint64_t k = m->p[i].first; m->p[i].mapped && k < m->p[i].first + m->p[i].len; k++) {
                        busy += m->refs[m->p[i].class][k] != 0;
                        if (m->at[m->p[i].class][k] != (int64_t) i) {
                                fprintf(stderr, "frag: runs: piece %zu is not mapped at granule %" PRIu64 "\n", i, k);
                                exit(1);
                        }
                }
                if (busy != m->p[i].busy) {
                        fprintf(stderr, "frag: runs: piece %zu counts %" PRIu64 " busy granules, not %" PRIu64 "\n", i,
                                m->p[i].busy, busy);
                        exit(1);
                }
        }
        if (held != m->held) {
                fprintf(stderr, "frag: runs: %" PRIu64 " granules held, not %" PRIu64 "\n", m->held, held);
                exit(1);
        }
}

/* Leaves the counts in all, and at the second half's start in half. */
static struct result run_runs(const struct op *ops, size_t n, uint64_t max_id, bool adapt, bool by_budget,
                              struct runs_counts *all, struct runs_counts *half) {
        struct heap_block **live = calloc(max_id + 1, sizeof(*live));
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes)), in_use = 0;
        struct runs m = { .adapt = adapt, .budget = by_budget, .threshold = 1 };
        struct heap_segment seg[HEAP_CARVED_CLASSES];
        struct result r = { 0 };
        struct heap h;

        heap_init(&h);
        for (int c = 0; c < HEAP_CARVED_CLASSES; c++) {
                m.at[c] = malloc(RANGE_GRANULES * sizeof(*m.at[c]));
                m.refs[c] = calloc(RANGE_GRANULES, sizeof(*m.refs[c]));
                if (!live || !sizes || !m.at[c] || !m.refs[c] ||
                    heap_add(&h, &seg[c], (uint64_t) c + 1, RANGE, (enum heap_class) c) < 0)
                        exit(1);
                memset(m.at[c], 0xff, RANGE_GRANULES * sizeof(*m.at[c]));
        }
        for (size_t i = 0; i < n; i++) {
                if (i == n / 2)
                        *half = m.count;
                if (ops[i].alloc) {
                        uint64_t rsize = heap_round(ops[i].size);
                        enum heap_class c = heap_class_of(rsize);
                        struct heap_block *b = heap_alloc(&h, c, rsize);
                        uint64_t first, last, budget;
                        bool leased = false;

                        if (!b)
                                exit(1);
                        in_use += rsize;
                        if (in_use > r.peak_in_use)
                                r.peak_in_use = in_use;
                        budget = (r.peak_in_use + r.peak_in_use / GRANULE_KEEP_DIVISOR + granule_bytes - 1) / granule_bytes;
                        first = b->offset / granule_bytes;
                        last = (b->offset + b->size - 1) / granule_bytes;
                        /* Each piece under the block judged once: from k, on to the granule after it. */
                        for (uint64_t k = first, next; adapt && k <= last; k = next) {
                                int64_t at = m.at[c][k];
                                uint64_t end, inside;

                                next = k + 1;
                                if (at < 0)
                                        continue;
                                end = m.p[at].first + m.p[at].len;
                                next = end;
                                inside = (end - 1 < last ? end - 1 : last) - (m.p[at].first > first ? m.p[at].first : first) + 1;
                                if (!m.p[at].busy && m.p[at].len - inside > inside)
                                        piece_give_back(&m, (size_t) at);
                        }
                        for (uint64_t k = first; k <= last; k++)
                                if (m.refs[c][k]++ == 0 && m.at[c][k] >= 0)
                                        m.p[m.at[c][k]].busy++;
                        for (uint64_t k = first, end; k <= last; k = end + 1) {
                                for (end = k; m.at[c][k] < 0 && end < last && m.at[c][end + 1] < 0; end++)
                                        ;
                                if (m.at[c][k] < 0)
                                        leased |= runs_fill(&m, c, k, end, budget);
                        }
                        m.count.leases += leased;
                        live[ops[i].id] = b;
                        sizes[ops[i].id] = rsize;
                } else if (live[ops[i].id]) {
                        struct heap_block *b = live[ops[i].id];
                        int c = b->segment->class;

                        for (uint64_t k = b->offset / granule_bytes; k <= (b->offset + b->size - 1) / granule_bytes; k++)
                                if (--m.refs[c][k] == 0 && m.at[c][k] >= 0)
                                        m.p[m.at[c][k]].busy--;
                        (void) heap_free(&h, b);
                        live[ops[i].id] = NULL;
                        in_use -= sizes[ops[i].id];
                }
                if (m.held * granule_bytes > r.peak_reserved)
                        r.peak_reserved = r.peak_held = m.held * granule_bytes;
        }
        runs_check(&m);
        *all = m.count;
        r.segments = m.count.imports;
        for (int c = 0; c < HEAP_CARVED_CLASSES; c++) {
                free(m.at[c]);
                free(m.refs[c]);
        }
        free(m.p);
        free(live);
        free(sizes);
        return r;
}

/* Op op applied to the bytes in use, in_use, with sizes[] the live allocations' (rounded to 512 B). */
static uint64_t in_use_after(const struct op *op, uint64_t *sizes, uint64_t in_use) {
        if (!op->alloc) {
                in_use -= sizes[op->id];
                sizes[op->id] = 0;
                return in_use;
        }
        sizes[op->id] = round512(op->size);
        return in_use + sizes[op->id];
}

static struct result run_none(const struct op *ops, size_t n, uint64_t max_id) {
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes)), in_use = 0;
        struct result r = { 0 };

        for (size_t i = 0; i < n; i++) {
                in_use = in_use_after(&ops[i], sizes, in_use);
                if (in_use > r.peak_in_use)
                        r.peak_in_use = in_use;
                r.peak_reserved = r.peak_held = r.peak_in_use;  /* no cache: it holds exactly what is in use */
        }
        free(sizes);
        return r;
}

/*
 * The greedy lease of run_bound(): what a process within the bound holds after a block takes
 * the use to in_use past held, with peak the most in use so far.
 */
static uint64_t bound_cap(uint64_t peak) {
        uint64_t slack = peak / 20 > 8 * MiB ? peak / 20 : 8 * MiB;

        return (peak + slack) / granule_bytes * granule_bytes;
}

/*
 * The fewest leases a process can take whose policy keeps what it holds within 1.05 of its
 * peak in use (or 8 MiB over it, for small peaks) on any trace, counted in r.segments.
 *
 * Such a policy does not know the trace ahead, and the trace may end (or free everything)
 * after any operation, so it can never hold more than that cap of the peak so far. Placement
 * is ignored, which only helps: any granule held serves any block. Then a lease is needed
 * exactly when a block takes the use past what is held, holding more never makes a later
 * lease necessary, so leasing up to the cap each time takes the fewest: a lower bound for
 * every policy under the cap, and for its imports too, a lease bringing one at least. In
 * r.segments_half, the fewest in the trace's second half: greedily from the most any such
 * policy can hold at its start; 0 where none must lease there.
 */
static struct result run_bound(const struct op *ops, size_t n, uint64_t max_id) {
        uint64_t *sizes = calloc(max_id + 1, sizeof(*sizes)), in_use = 0, held = 0, held_late = 0;
        struct result r = { 0 };

        if (!sizes)
                exit(1);
        for (size_t i = 0; i < n; i++) {
                /*
                 * The second half's leases: from the most any such process can hold at its start
                 * (all the bound allows then), leasing greedily after, none takes fewer there.
                 */
                if (i == n / 2)
                        held_late = held > bound_cap(r.peak_in_use) ? held : bound_cap(r.peak_in_use);
                in_use = in_use_after(&ops[i], sizes, in_use);
                if (!ops[i].alloc)
                        continue;
                if (in_use > r.peak_in_use)
                        r.peak_in_use = in_use;
                if (in_use > held) {
                        uint64_t cap = bound_cap(r.peak_in_use);
                        uint64_t need = (in_use + granule_bytes - 1) / granule_bytes * granule_bytes;

                        held = cap > need ? cap : need;
                        r.segments++;
                }
                if (i >= n / 2 && in_use > held_late) {
                        uint64_t cap = bound_cap(r.peak_in_use);
                        uint64_t need = (in_use + granule_bytes - 1) / granule_bytes * granule_bytes;

                        held_late = cap > need ? cap : need;
                        r.segments_half++;
                }
                if (held > r.peak_reserved)
                        r.peak_reserved = r.peak_held = held;
        }
        free(sizes);
        return r;
}

static void row(const char *trace, const char *name, struct result r) {
        printf("%-12s %-13s %14.1f %14.1f %14.1f %8.3f\n", trace, name, (double) r.peak_reserved / MiB,
               (double) r.peak_held / MiB, (double) r.peak_in_use / MiB, (double) r.peak_reserved / (double) r.peak_in_use);
}

int main(int argc, char **argv) {
        uint64_t big[8] = { 64 * MiB };
        size_t nbig = 0;

        while (argc > 2 && (strcmp(argv[1], "-g") == 0 || strcmp(argv[1], "-b") == 0)) {
                char *end;
                unsigned long mib = strtoul(argv[2], &end, 10);

                if (*end || mib == 0 || mib > (argv[1][1] == 'g' ? 1024UL : 1UL << 20)) {
                        fprintf(stderr, "frag: %s takes %s, not '%s'\n", argv[1],
                                argv[1][1] == 'g' ? "a granule of 1 to 1024 MiB" : "a size of 1 MiB to 1 TiB", argv[2]);
                        return 2;
                }
                if (argv[1][1] == 'g') {
                        granule_bytes = (uint64_t) mib << 20;
                } else if (nbig == sizeof(big) / sizeof(big[0])) {
                        fprintf(stderr, "frag: -b at most %zu times\n", sizeof(big) / sizeof(big[0]));
                        return 2;
                } else {
                        big[nbig++] = (uint64_t) mib << 20;
                }
                argc -= 2;
                argv += 2;
        }
        nbig = nbig ? nbig : 1;
        if (argc < 2) {
                fprintf(stderr, "usage: frag [-g GRANULE_MIB] [-b BIG_MIB...] TRACE.csv...\n");
                return 2;
        }
        printf("%-12s %-13s %14s %14s %14s %8s\n", "trace", "policy", "peak reserved", "peak held", "peak in use", "ratio");
        printf("%-12s %-13s %14s %14s %14s %8s\n", "", "", "MiB", "MiB", "MiB", "");
        for (int i = 1; i < argc; i++) {
                const char *base = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
                char name[64];
                struct granule_set g, half;
                struct leases leases = { 0 };
                struct trace t;
                int r = trace_read(argv[i], &t);
                const struct op *ops = t.ops;
                uint64_t max_id = t.max_id;
                size_t n = t.n;

                if (r < 0) {
                        fprintf(stderr, "frag: cannot read %s: %s\n", argv[i], strerror(-r));
                        return 1;
                }
                snprintf(name, sizeof(name), "%.*s", (int) (strcspn(base, ".")), base);
                struct result client = run_client(ops, n, max_id);

                row(name, "client", client);
                printf("%-12s %-13s %" PRIu64 " segments leased, each a lease and an import\n", "", "", client.segments);
                row(name, "pytorch", run_segalloc(&pytorch, ops, n, max_id));
                row(name, "cupy", run_segalloc(&cupy, ops, n, max_id));
                row(name, "none", run_none(ops, n, max_id));
                row(name, "expand", run_growing(ops, n, max_id, EXPAND, &g, &half, &leases, NULL));
                for (int m = GRANULE; m <= GROW; m++) {
                        leases = (struct leases) { 0 };
                        row(name, m == GRANULE ? "granule" : "grow", run_growing(ops, n, max_id, (enum model) m, &g, &half,
                                                                                 &leases, NULL));
                        printf("%-12s %-13s %" PRIu64 " leases of %" PRIu64 " granules, %" PRIu64 " maps, %" PRIu64
                               " unmaps, for %zu ops\n", "", "", leases.all, g.obtained, g.maps, g.unmaps, n);
                        printf("%-12s %-13s second half: %" PRIu64 " leases of %" PRIu64 " granules, %" PRIu64 " maps, %"
                               PRIu64 " unmaps, for %zu ops\n", "", "", leases.all - leases.half, g.obtained - half.obtained,
                               g.maps - half.maps, g.unmaps - half.unmaps, n - n / 2);
                }
                for (size_t k = 0; k < nbig; k++) {
                        struct pieces pc = { .big_bytes = big[k], .of = calloc(max_id + 1, sizeof(*pc.of)) };
                        char label[32];

                        if (!pc.of)
                                return 1;
                        leases = (struct leases) { 0 };
                        snprintf(label, sizeof(label), "big-%" PRIu64, (uint64_t) (big[k] / MiB));
                        row(name, label, run_growing(ops, n, max_id, GROW, &g, &half, &leases, &pc));
                        printf("%-12s %-13s %" PRIu64 " leases, %" PRIu64 " imports (%" PRIu64 " pieces, %" PRIu64
                               " given back, and %" PRIu64 " granules), %" PRIu64 " maps, %" PRIu64 " unmaps; second half: %"
                               PRIu64 " leases, %" PRIu64 " imports, %" PRIu64 " maps, %" PRIu64 " unmaps\n", "", "",
                               leases.all + pc.leases, g.obtained + pc.leases, pc.leases, pc.returns, pc.granules_back,
                               g.maps + pc.leases, g.unmaps + pc.returns,
                               leases.all - leases.half + pc.leases - pc.leases_half,
                               g.obtained - half.obtained + pc.leases - pc.leases_half,
                               g.maps - half.maps + pc.leases - pc.leases_half, g.unmaps - half.unmaps + pc.returns - pc.returns_half);
                        free(pc.of);
                        free(pc.size);
                        free(pc.busy);
                }
                for (int way = 0; way <= 2; way++) {
                        static const char *const names[] = { "runs", "runs-adapt", "runs-budget" };
                        struct runs_counts all = { 0 }, second = { 0 };

                        row(name, names[way], run_runs(ops, n, max_id, way == 1, way == 2, &all, &second));
                        printf("%-12s %-13s %" PRIu64 " leases, %" PRIu64 " imports, %" PRIu64 " moves, %" PRIu64
                               " given back; second half: %" PRIu64 " leases, %" PRIu64 " imports, %" PRIu64 " moves\n", "", "",
                               all.leases, all.imports, all.moves, all.returns, all.leases - second.leases,
                               all.imports - second.imports, all.moves - second.moves);
                }
                struct result bound = run_bound(ops, n, max_id);

                row(name, "bound", bound);
                printf("%-12s %-13s %" PRIu64 " leases: no policy within 1.05 of the peak so far leases fewer; %" PRIu64
                       " in the second half, where none leases fewer (0: none must)\n", "", "", bound.segments,
                       bound.segments_half);
                free(t.ops);
        }
        return 0;
}
