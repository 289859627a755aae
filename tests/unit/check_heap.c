/*
 * check_heap.c: the allocator core (common/heap.c) through its header: rounding and classes,
 * best fit with its tie-break, split and merge, the empty list, blocks held for a lane, the
 * cheapest of the fits by a caller's cost, and random churn against a model of which bytes
 * are live (and held for which lane, until which fence), with heap_check() after every step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"
#include "suites.h"

#define MiB (1ULL << 20)

static void check_ok(const struct heap *h) {
        char why[256] = "";

        ck_assert_msg(heap_check(h, why, sizeof(why)) == 0, "%s", why);
}

START_TEST(test_rounding_and_classes) {
        ck_assert_uint_eq(heap_round(0), 0);
        ck_assert_uint_eq(heap_round(1), 512);
        ck_assert_uint_eq(heap_round(512), 512);
        ck_assert_uint_eq(heap_round(513), 1024);
        ck_assert_uint_eq(heap_round(HEAP_MAX_REQUEST), HEAP_MAX_REQUEST);
        ck_assert_uint_eq(heap_round(HEAP_MAX_REQUEST + 1), 0);
        ck_assert_uint_eq(heap_round(UINT64_MAX), 0);
        ck_assert_int_eq(heap_class_of(MiB), HEAP_CLASS_SMALL);
        ck_assert_int_eq(heap_class_of(MiB + 512), HEAP_CLASS_LARGE);
        ck_assert_uint_eq(heap_segment_bytes(512), 2 * MiB);
        ck_assert_uint_eq(heap_segment_bytes(MiB), 2 * MiB);
        ck_assert_uint_eq(heap_segment_bytes(MiB + 512), 20 * MiB);
        ck_assert_uint_eq(heap_segment_bytes(10 * MiB), 20 * MiB);
        ck_assert_uint_eq(heap_segment_bytes(10 * MiB + 512), 12 * MiB);
        ck_assert_uint_eq(heap_min_segment_bytes(512), 2 * MiB);
        ck_assert_uint_eq(heap_min_segment_bytes(6 * MiB + 512), 8 * MiB);
}
END_TEST

START_TEST(test_best_fit_split_merge) {
        struct heap h;
        struct heap_segment a, b;
        struct heap_block *x, *y, *z, *w;

        heap_init(&h);
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_SMALL, 4096));
        ck_assert_int_eq(heap_add(&h, &a, 7, 2 * MiB, HEAP_CLASS_SMALL), 0);
        ck_assert_int_eq(heap_add(&h, &b, 3, 2 * MiB, HEAP_CLASS_SMALL), 0);
        ck_assert_int_eq(heap_add(&h, &b, 3, 1000, HEAP_CLASS_SMALL), -EINVAL);
        ck_assert_uint_eq(h.empty_count, 2);
        check_ok(&h);

        /* Equal sizes: the lowest segment id wins, carved from the front. */
        x = heap_alloc(&h, HEAP_CLASS_SMALL, 4096);
        ck_assert_ptr_eq(x->segment, &b);
        ck_assert_uint_eq(x->offset, 0);
        y = heap_alloc(&h, HEAP_CLASS_SMALL, 8192);
        z = heap_alloc(&h, HEAP_CLASS_SMALL, 4096);
        ck_assert_ptr_eq(y->segment, &b);
        ck_assert_uint_eq(y->offset, 4096);
        ck_assert_uint_eq(z->offset, 12288);
        ck_assert_uint_eq(h.in_use_bytes, 16384);
        ck_assert_uint_eq(h.blocks, 3);
        ck_assert_uint_eq(h.empty_count, 1);
        ck_assert_ptr_eq(heap_oldest_empty(&h), &a);
        ck_assert_uint_eq(heap_free_bytes(&h), 4 * MiB - 16384);
        check_ok(&h);

        /* A hole of 8 KiB is the best fit for 6 KiB, ahead of the rest of b and all of a. */
        ck_assert(!heap_free(&h, y));
        w = heap_alloc(&h, HEAP_CLASS_SMALL, 6144);
        ck_assert_ptr_eq(w->segment, &b);
        ck_assert_uint_eq(w->offset, 4096);
        check_ok(&h);

        /* The wrong class finds nothing: small segments never serve large requests. */
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_LARGE, 2 * MiB));
        ck_assert_ptr_eq(heap_find_live(&b, 4096), w);
        ck_assert_ptr_null(heap_find_live(&b, 5120));

        /* Freeing everything merges b back into one block and lists it empty after a. */
        ck_assert(!heap_free(&h, x));
        ck_assert(!heap_free(&h, z));
        ck_assert(heap_free(&h, w));
        ck_assert_uint_eq(h.empty_count, 2);
        ck_assert_ptr_eq(heap_oldest_empty(&h), &a);
        ck_assert_ptr_null(b.first->next);
        ck_assert_uint_eq(b.first->size, 2 * MiB);
        check_ok(&h);
        ck_assert_int_eq(heap_remove(&a), 0);
        ck_assert_int_eq(heap_remove(&b), 0);
}
END_TEST

/* Pieces: a block takes its whole segment, a free piece serves only a block it fits within a 24th, and heap_alloc_in() carves a given one. */
START_TEST(test_pieces) {
        struct heap h;
        struct heap_segment a, b, l;
        struct heap_block *x, *y;

        heap_init(&h);
        ck_assert_int_eq(heap_add(&h, &a, 1, 4800 * MiB, HEAP_CLASS_PIECE), 0);
        ck_assert_int_eq(heap_add(&h, &l, 3, 8192 * MiB, HEAP_CLASS_LARGE), 0);
        /* 4,800 is more than 4,096 and a 24th: no piece serves, and no large segment either. */
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_PIECE, 4096 * MiB));
        x = heap_alloc(&h, HEAP_CLASS_PIECE, 4700 * MiB);
        ck_assert_ptr_eq(x->segment, &a);
        ck_assert_uint_eq(x->size, 4800 * MiB);         /* never split: the rest stays the block's */
        ck_assert_uint_eq(x->asked, 4700 * MiB);
        ck_assert_uint_eq(h.asked_bytes, 4700 * MiB);
        check_ok(&h);
        /* A piece holds one block: nothing else is carved from it, and the large class never sees it. */
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_PIECE, 64 * MiB));
        y = heap_alloc(&h, HEAP_CLASS_LARGE, 4700 * MiB);
        ck_assert_ptr_eq(y->segment, &l);
        ck_assert(heap_free(&h, x));
        ck_assert(heap_free(&h, y));
        /* heap_alloc_in(): the piece just added, whatever its fit; none from one that is not empty or too small. */
        ck_assert_int_eq(heap_add(&h, &b, 2, 6144 * MiB, HEAP_CLASS_PIECE), 0);
        x = heap_alloc_in(&h, &b, 4700 * MiB);
        ck_assert_ptr_eq(x->segment, &b);
        ck_assert_uint_eq(x->size, 6144 * MiB);
        ck_assert_ptr_null(heap_alloc_in(&h, &b, 512));
        ck_assert_ptr_null(heap_alloc_in(&h, &a, 4801 * MiB));
        check_ok(&h);
        ck_assert(heap_free(&h, x));
        ck_assert_uint_eq(h.empty_count, 3);
        check_ok(&h);
        ck_assert_uint_eq(heap_drop(&a) + heap_drop(&b) + heap_drop(&l), 0);
}
END_TEST

START_TEST(test_remove_and_drop) {
        struct heap h;
        struct heap_segment a, b;
        struct heap_block *x;

        heap_init(&h);
        ck_assert_int_eq(heap_add(&h, &a, 1, 20 * MiB, HEAP_CLASS_LARGE), 0);
        ck_assert_int_eq(heap_add(&h, &b, 2, 20 * MiB, HEAP_CLASS_LARGE), 0);
        x = heap_alloc(&h, HEAP_CLASS_LARGE, 3 * MiB);
        ck_assert_ptr_eq(x->segment, &a);
        ck_assert(heap_alloc(&h, HEAP_CLASS_LARGE, 5 * MiB));
        /* 12 MiB remain in a: 11.5 MiB leave a sliver of 512 KiB, which the block keeps. */
        ck_assert_uint_eq(heap_alloc(&h, HEAP_CLASS_LARGE, 11 * MiB + 512 * 1024)->size, 12 * MiB);
        ck_assert_int_eq(heap_remove(&a), -EBUSY);
        ck_assert_int_eq(heap_remove(&b), 0);
        ck_assert_ptr_null(b.heap);
        ck_assert_uint_eq(h.segment_count, 1);
        ck_assert_uint_eq(h.empty_count, 0);
        check_ok(&h);
        /* Nothing is carved from a removed segment. */
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_LARGE, 512));
        ck_assert_uint_eq(heap_drop(&a), 20 * MiB);
        ck_assert_uint_eq(h.in_use_bytes, 0);
        ck_assert_uint_eq(h.blocks, 0);
        ck_assert_uint_eq(h.size_bytes, 0);
        ck_assert_ptr_null(h.segments);
        check_ok(&h);
}
END_TEST

START_TEST(test_check_catches_corruption) {
        struct heap h;
        struct heap_segment a;
        struct heap_block *x;
        char why[256];

        heap_init(&h);
        ck_assert_int_eq(heap_add(&h, &a, 1, 2 * MiB, HEAP_CLASS_SMALL), 0);
        x = heap_alloc(&h, HEAP_CLASS_SMALL, 4096);
        check_ok(&h);
        h.in_use_bytes += 512;
        ck_assert_int_eq(heap_check(&h, why, sizeof(why)), -EUCLEAN);
        ck_assert_ptr_nonnull(strstr(why, "live blocks"));
        h.in_use_bytes -= 512;
        x->size += 512;         /* overlaps its neighbour */
        ck_assert_int_eq(heap_check(&h, why, sizeof(why)), -EUCLEAN);
        ck_assert_ptr_nonnull(strstr(why, "tiling"));
        x->size -= 512;
        check_ok(&h);
        ck_assert(heap_free(&h, x));
        ck_assert_int_eq(heap_remove(&a), 0);
}
END_TEST

#define SEGMENTS 6
#define LIVE_MAX 400

/* Random allocations and frees over segments of both classes, against a byte map of each segment. */
START_TEST(test_random_churn) {
        static uint8_t map[SEGMENTS][20 * MiB / 512];
        struct heap_segment segs[SEGMENTS];
        struct heap_block *live[LIVE_MAX];
        size_t n = 0;
        unsigned seed = 4242;
        struct heap h;

        heap_init(&h);
        memset(map, 0, sizeof(map));
        for (int i = 0; i < SEGMENTS; i++)
                ck_assert_int_eq(heap_add(&h, &segs[i], (uint64_t) i + 1, i < 3 ? 2 * MiB : 20 * MiB,
                                          i < 3 ? HEAP_CLASS_SMALL : HEAP_CLASS_LARGE), 0);
        for (int step = 0; step < 20000; step++) {
                bool alloc = n == 0 || (n < LIVE_MAX && rand_r(&seed) % 2);

                if (alloc) {
                        uint64_t size = rand_r(&seed) % 4 ? 1 + (uint64_t) rand_r(&seed) % (256 * 1024)
                                                          : MiB + (uint64_t) rand_r(&seed) % (4 * MiB);
                        uint64_t rsize = heap_round(size);
                        struct heap_block *b = heap_alloc(&h, heap_class_of(rsize), rsize);
                        int s;

                        if (!b)
                                continue;
                        s = (int) (b->segment - segs);
                        /* Plain ifs in the loops: each ck_assert is a message to Check's parent process. */
                        if (b->size < rsize ||
                            b->size > rsize + (heap_class_of(rsize) == HEAP_CLASS_SMALL ? 0 : HEAP_SMALL_REQUEST) ||
                            b->offset + b->size > segs[s].size)
                                ck_abort_msg("step %d: a block of %llu at %llu for %llu bytes", step,
                                             (unsigned long long) b->size, (unsigned long long) b->offset,
                                             (unsigned long long) rsize);
                        for (uint64_t u = b->offset / 512; u < (b->offset + b->size) / 512; u++) {
                                if (map[s][u])
                                        ck_abort_msg("step %d: block overlaps a live one", step);
                                map[s][u] = 1;
                        }
                        live[n++] = b;
                } else {
                        size_t i = (size_t) rand_r(&seed) % n;
                        struct heap_block *b = live[i];
                        int s = (int) (b->segment - segs);

                        for (uint64_t u = b->offset / 512; u < (b->offset + b->size) / 512; u++)
                                map[s][u] = 0;
                        (void) heap_free(&h, b);
                        live[i] = live[--n];
                }
                if (step % 16 == 0)
                        check_ok(&h);
        }
        while (n)
                (void) heap_free(&h, live[--n]);
        check_ok(&h);
        /* Every segment merged back into one free block. */
        ck_assert_uint_eq(h.empty_count, SEGMENTS);
        for (int i = 0; i < SEGMENTS; i++) {
                ck_assert_ptr_null(segs[i].first->next);
                ck_assert_int_eq(heap_remove(&segs[i]), 0);
        }
        check_ok(&h);
        ck_assert_uint_eq(h.segment_count, 0);
}
END_TEST


static unsigned emptied_count;
static uint64_t released_bytes;

static void on_released(void *ctx, struct heap_block *b) {
        (void) ctx;
        released_bytes += b->size;
}

static void on_emptied(void *ctx, struct heap_segment *s) {
        (void) ctx, (void) s;
        emptied_count++;
}

static const struct heap_release_ops release_ops = { on_released, on_emptied };

/* A segment of 2 MiB in h, carved into a and b of 512 KiB and c of 1 MiB, in that order. */
static void three_blocks(struct heap *h, struct heap_segment *seg, struct heap_block **a, struct heap_block **b,
                         struct heap_block **c) {
        heap_init(h);
        ck_assert_int_eq(heap_add(h, seg, 1, 2 * MiB, HEAP_CLASS_SMALL), 0);
        *a = heap_alloc(h, HEAP_CLASS_SMALL, 512 * 1024);
        *b = heap_alloc(h, HEAP_CLASS_SMALL, 512 * 1024);
        *c = heap_alloc(h, HEAP_CLASS_SMALL, 1024 * 1024);
        ck_assert_ptr_nonnull(*c);
}

/* A held block: its lane's at once, split and merged there; nobody else's until its fence. */
START_TEST(test_held_for_a_lane) {
        struct heap_segment seg;
        struct heap_block *a, *b, *c, *x;
        struct heap h;
        bool held;

        three_blocks(&h, &seg, &a, &b, &c);
        heap_free_held(&h, b, 1, 7);
        check_ok(&h);
        ck_assert_uint_eq(seg.held_blocks, 1);
        /* Nobody else's: neither an allocation on no lane nor one on lane 2. */
        ck_assert_ptr_null(heap_alloc(&h, HEAP_CLASS_SMALL, 512));
        ck_assert_ptr_null(heap_alloc_on(&h, HEAP_CLASS_SMALL, 512, 2, &held));
        /* Lane 1's at once, split: the rest stays held. */
        x = heap_alloc_on(&h, HEAP_CLASS_SMALL, 4096, 1, &held);
        ck_assert_ptr_nonnull(x);
        ck_assert(held);
        ck_assert_uint_eq(x->offset, 512 * 1024);
        ck_assert_uint_eq(x->size, 4096);
        ck_assert_uint_eq(seg.held_blocks, 1);
        check_ok(&h);
        /* Freed held again, it merges with the held rest (fence 9 now), and with a and c held for lane 1. */
        heap_free_held(&h, x, 1, 9);
        ck_assert_uint_eq(seg.held_blocks, 1);
        heap_free_held(&h, a, 1, 8);
        ck_assert_uint_eq(seg.held_blocks, 1);
        check_ok(&h);
        ck_assert_uint_eq(h.empty_count, 0);
        /* Held is not empty: it cannot go. */
        ck_assert_int_eq(heap_remove(&seg), -EBUSY);
        heap_free_held(&h, c, 1, 9);
        ck_assert_ptr_null(seg.first->next);
        ck_assert_uint_eq(seg.first->fence, 9);
        ck_assert_uint_eq(h.empty_count, 0);
        /* Not before the latest fence of what merged, nor for another lane. */
        emptied_count = 0;
        released_bytes = 0;
        ck_assert_uint_eq(heap_release(&h, 1, 8, &release_ops, NULL), 0);
        ck_assert_uint_eq(heap_release(&h, 2, UINT64_MAX, &release_ops, NULL), 0);
        ck_assert_uint_eq(heap_release(&h, 1, 9, &release_ops, NULL), 1);
        ck_assert_uint_eq(released_bytes, 2 * MiB);
        ck_assert_uint_eq(emptied_count, 1);
        ck_assert_uint_eq(h.empty_count, 1);
        check_ok(&h);
        ck_assert_int_eq(heap_remove(&seg), 0);
        check_ok(&h);
}
END_TEST

/* Free and held blocks side by side: a free block never swallows a held one, a held one swallows free ones. */
START_TEST(test_held_and_free_neighbours) {
        struct heap_segment seg;
        struct heap_block *a, *b, *c, *x;
        struct heap h;
        bool held;

        three_blocks(&h, &seg, &a, &b, &c);
        heap_free_held(&h, b, 1, 1);
        ck_assert(!heap_free(&h, a));
        ck_assert_ptr_eq(seg.first->next, b);   /* a did not merge into b */
        check_ok(&h);
        /* Lane 2 fits in a, not in b. */
        x = heap_alloc_on(&h, HEAP_CLASS_SMALL, 512 * 1024, 2, &held);
        ck_assert_ptr_nonnull(x);
        ck_assert(!held);
        ck_assert_uint_eq(x->offset, 0);
        ck_assert(!heap_free(&h, x));
        /* c held for lane 1 takes b, held for lane 1 too, and through it a, free: the fence is the later one. */
        heap_free_held(&h, c, 1, 2);
        check_ok(&h);
        ck_assert_uint_eq(seg.held_blocks, 1);
        ck_assert_ptr_null(seg.first->next);
        ck_assert_uint_eq(seg.first->lane, 1);
        ck_assert_uint_eq(seg.first->fence, 2);
        ck_assert_uint_eq(heap_release(&h, 1, 1, NULL, NULL), 0);
        ck_assert_uint_eq(heap_release(&h, 1, 2, NULL, NULL), 1);
        check_ok(&h);
        /* Held for two lanes side by side: no merge; a free block beside them takes neither. */
        a = heap_alloc(&h, HEAP_CLASS_SMALL, 512 * 1024);
        b = heap_alloc(&h, HEAP_CLASS_SMALL, 512 * 1024);
        c = heap_alloc(&h, HEAP_CLASS_SMALL, 1024 * 1024);
        heap_free_held(&h, a, 1, 3);
        heap_free_held(&h, b, 3, 1);
        ck_assert(!heap_free(&h, c));
        ck_assert_uint_eq(seg.held_blocks, 2);
        ck_assert_uint_eq(h.empty_count, 0);
        check_ok(&h);
        ck_assert_uint_eq(heap_release(&h, 1, 3, NULL, NULL), 1);
        ck_assert_uint_eq(heap_release(&h, 3, 1, NULL, NULL), 1);
        ck_assert_ptr_null(seg.first->next);
        ck_assert_uint_eq(h.empty_count, 1);
        check_ok(&h);
        ck_assert_int_eq(heap_remove(&seg), 0);
}
END_TEST

/* A segment that holds whole: held blocks neither merge nor split, and serve a quarter less at most. */
START_TEST(test_held_whole) {
        struct heap_segment seg;
        struct heap_block *a, *b, *x;
        struct heap h;
        bool held;

        heap_init(&h);
        ck_assert_int_eq(heap_add(&h, &seg, 1, 2 * MiB, HEAP_CLASS_SMALL), 0);
        heap_hold_whole(&seg);
        a = heap_alloc(&h, HEAP_CLASS_SMALL, 512 * 1024);
        b = heap_alloc(&h, HEAP_CLASS_SMALL, 512 * 1024);
        heap_free_held(&h, a, 1, 1);
        heap_free_held(&h, b, 1, 1);
        ck_assert_uint_eq(seg.held_blocks, 2);
        check_ok(&h);
        /* Too small for a quarter less: the free rest serves it. */
        x = heap_alloc_on(&h, HEAP_CLASS_SMALL, 256 * 1024, 1, &held);
        ck_assert(!held);
        ck_assert_uint_eq(x->offset, 1024 * 1024);
        ck_assert(!heap_free(&h, x));
        /* Within a quarter: carved whole. */
        x = heap_alloc_on(&h, HEAP_CLASS_SMALL, 448 * 1024, 1, &held);
        ck_assert(held);
        ck_assert_uint_eq(x->size, 512 * 1024);
        ck_assert_uint_eq(x->asked, 448 * 1024);
        ck_assert_uint_eq(seg.held_blocks, 1);
        check_ok(&h);
        (void) heap_free(&h, x);
        ck_assert_uint_eq(heap_release(&h, 1, 1, NULL, NULL), 1);
        ck_assert_ptr_null(seg.first->next);
        check_ok(&h);
        ck_assert_int_eq(heap_remove(&seg), 0);
}
END_TEST

#define LANES 3

/*
 * Random allocations on lanes 0 to LANES, frees at once or held for a lane, and releases,
 * against a map of each 512 bytes: live, free, or held for a lane until a fence. An allocation
 * never gets bytes live or held for another lane whose fence has not been released.
 */
START_TEST(test_random_churn_lanes) {
        static uint8_t map[SEGMENTS][20 * MiB / 512];           /* 0 free, 1 live, 2 + lane held */
        static uint32_t fence_of[SEGMENTS][20 * MiB / 512];
        struct heap_segment segs[SEGMENTS];
        struct heap_block *live[LIVE_MAX];
        uint32_t fence_next[LANES + 1] = { 0 }, released[LANES + 1] = { 0 };
        size_t n = 0;
        unsigned seed = 777;
        struct heap h;

        heap_init(&h);
        memset(map, 0, sizeof(map));
        for (int i = 0; i < SEGMENTS; i++) {
                ck_assert_int_eq(heap_add(&h, &segs[i], (uint64_t) i + 1, i < 3 ? 2 * MiB : 20 * MiB,
                                          i < 3 ? HEAP_CLASS_SMALL : HEAP_CLASS_LARGE), 0);
                if (i == 2 || i == 5)
                        heap_hold_whole(&segs[i]);
        }
        for (uint32_t l = 1; l <= LANES; l++)
                fence_next[l] = 1;
        for (int step = 0; step < 30000; step++) {
                unsigned what = (unsigned) rand_r(&seed) % 16;

                if (what < 7 && n < LIVE_MAX) {
                        uint64_t size = rand_r(&seed) % 4 ? 1 + (uint64_t) rand_r(&seed) % (256 * 1024)
                                                          : MiB + (uint64_t) rand_r(&seed) % (4 * MiB);
                        uint64_t rsize = heap_round(size);
                        uint32_t lane = (uint32_t) rand_r(&seed) % (LANES + 1);
                        bool held = false;
                        struct heap_block *b = heap_alloc_on(&h, heap_class_of(rsize), rsize, lane, &held);
                        int s;

                        if (!b)
                                continue;
                        s = (int) (b->segment - segs);
                        if (b->size < rsize || b->offset + b->size > segs[s].size ||
                            (held && b->segment->hold_whole ? b->size > rsize + rsize / 4
                                                            : b->size > rsize + (heap_class_of(rsize) == HEAP_CLASS_SMALL
                                                                                         ? 0
                                                                                         : HEAP_SMALL_REQUEST)))
                                ck_abort_msg("step %d: a block of %llu at %llu for %llu bytes", step,
                                             (unsigned long long) b->size, (unsigned long long) b->offset,
                                             (unsigned long long) rsize);
                        for (uint64_t u = b->offset / 512; u < (b->offset + b->size) / 512; u++) {
                                if (map[s][u] == 1)
                                        ck_abort_msg("step %d: block overlaps a live one", step);
                                if (map[s][u] >= 2 && map[s][u] != 2 + lane)
                                        ck_abort_msg("step %d: lane %u got bytes held for lane %u until fence %u", step,
                                                     lane, map[s][u] - 2, fence_of[s][u]);
                                map[s][u] = 1;
                        }
                        live[n++] = b;
                } else if (what < 14 && n) {
                        size_t i = (size_t) rand_r(&seed) % n;
                        struct heap_block *b = live[i];
                        int s = (int) (b->segment - segs);
                        uint32_t lane = (uint32_t) rand_r(&seed) % (LANES + 1);

                        for (uint64_t u = b->offset / 512; u < (b->offset + b->size) / 512; u++) {
                                map[s][u] = lane ? 2 + lane : 0;
                                fence_of[s][u] = lane ? fence_next[lane] : 0;
                        }
                        if (lane)
                                heap_free_held(&h, b, lane, fence_next[lane]);
                        else
                                (void) heap_free(&h, b);
                        live[i] = live[--n];
                } else if (what == 14) {
                        /* A lane's fence recorded: later frees wait for the next. */
                        uint32_t lane = 1 + (uint32_t) rand_r(&seed) % LANES;

                        fence_next[lane]++;
                } else {
                        /* A lane's fences completed up to one recorded. */
                        uint32_t lane = 1 + (uint32_t) rand_r(&seed) % LANES;
                        uint32_t upto = fence_next[lane] - 1;

                        if (upto <= released[lane])
                                continue;
                        upto = released[lane] + 1 + (uint32_t) rand_r(&seed) % (upto - released[lane]);
                        (void) heap_release(&h, lane, upto, NULL, NULL);
                        released[lane] = upto;
                        for (int s = 0; s < SEGMENTS; s++)
                                for (uint64_t u = 0; u < segs[s].size / 512; u++)
                                        if (map[s][u] == 2 + lane && fence_of[s][u] <= upto)
                                                map[s][u] = 0;
                }
                if (step % 16 == 0)
                        check_ok(&h);
        }
        while (n)
                (void) heap_free(&h, live[--n]);
        for (uint32_t l = 1; l <= LANES; l++)
                (void) heap_release(&h, l, UINT64_MAX, NULL, NULL);
        check_ok(&h);
        ck_assert_uint_eq(h.held_fences.count, 0);
        ck_assert_uint_eq(h.empty_count, SEGMENTS);
        for (int i = 0; i < SEGMENTS; i++) {
                ck_assert_ptr_null(segs[i].first->next);
                ck_assert_int_eq(heap_remove(&segs[i]), 0);
        }
        check_ok(&h);
}
END_TEST

/*
 * One lane is served as with every free at once: a heap whose frees are all held for lane 1
 * (fenced and released now and then) hands out the very blocks a heap of plain frees does,
 * step by step (PyTorch's one stream, whatever the GPU's lag).
 */
START_TEST(test_one_lane_as_free) {
        struct heap_segment segs_a[SEGMENTS], segs_b[SEGMENTS];
        struct heap_block *live_a[LIVE_MAX], *live_b[LIVE_MAX];
        uint64_t fence = 1, released = 0;
        size_t n = 0;
        unsigned seed = 99;
        struct heap a, b;

        heap_init(&a);
        heap_init(&b);
        for (int i = 0; i < SEGMENTS; i++) {
                uint64_t size = i < 3 ? 2 * MiB : 20 * MiB;
                enum heap_class class = i < 3 ? HEAP_CLASS_SMALL : HEAP_CLASS_LARGE;

                ck_assert_int_eq(heap_add(&a, &segs_a[i], (uint64_t) i + 1, size, class), 0);
                ck_assert_int_eq(heap_add(&b, &segs_b[i], (uint64_t) i + 1, size, class), 0);
        }
        for (int step = 0; step < 20000; step++) {
                unsigned what = (unsigned) rand_r(&seed) % 16;

                if (what < 7 && n < LIVE_MAX) {
                        uint64_t size = rand_r(&seed) % 4 ? 1 + (uint64_t) rand_r(&seed) % (256 * 1024)
                                                          : MiB + (uint64_t) rand_r(&seed) % (4 * MiB);
                        uint64_t rsize = heap_round(size);
                        bool held;
                        struct heap_block *x = heap_alloc_on(&a, heap_class_of(rsize), rsize, 1, &held);
                        struct heap_block *y = heap_alloc(&b, heap_class_of(rsize), rsize);

                        if (!x != !y || (x && (x->segment - segs_a != y->segment - segs_b || x->offset != y->offset ||
                                               x->size != y->size)))
                                ck_abort_msg("step %d: the held heap gave another block than the plain one", step);
                        if (x) {
                                live_a[n] = x;
                                live_b[n++] = y;
                        }
                } else if (what < 14 && n) {
                        size_t i = (size_t) rand_r(&seed) % n;

                        heap_free_held(&a, live_a[i], 1, fence);
                        (void) heap_free(&b, live_b[i]);
                        live_a[i] = live_a[--n];
                        live_b[i] = live_b[n];
                } else if (what == 14) {
                        fence++;
                } else if (fence - 1 > released) {
                        released += 1 + (uint64_t) rand_r(&seed) % (fence - 1 - released);
                        (void) heap_release(&a, 1, released, NULL, NULL);
                }
                if (step % 64 == 0) {
                        check_ok(&a);
                        check_ok(&b);
                }
        }
        check_ok(&a);
        for (int i = 0; i < SEGMENTS; i++) {
                (void) heap_drop(&segs_a[i]);
                (void) heap_drop(&segs_b[i]);
        }
        check_ok(&a);
        ck_assert_uint_eq(a.held_bytes, 0);
}
END_TEST

/* heap_choice's cost for the test: what costs[] says of a block's offset (in MiB), and how often it was asked. */
struct costs {
        uint64_t of[64];
        unsigned asked;
};

static uint64_t cost_at(void *ctx, const struct heap_block *b, uint64_t rsize) {
        struct costs *t = ctx;

        (void) rsize;
        t->asked++;
        return t->of[b->offset / MiB];
}

START_TEST(test_cheapest_of_the_fits) {
        struct costs t = { .asked = 0 };
        struct heap_choice choice = { cost_at, &t, 8 * MiB, 16 };
        struct heap_block *b[6], *x;
        struct heap_segment s, p;
        struct heap h;
        bool held;

        heap_init(&h);
        ck_assert_int_eq(heap_add(&h, &s, 1, 64 * MiB, HEAP_CLASS_LARGE), 0);
        /* Holes of 4 MiB at 0, 6 MiB at 6 and 8 MiB at 14, between blocks of 2 MiB, then the rest at 24. */
        {
                static const uint64_t sizes[6] = { 4, 2, 6, 2, 8, 2 };

                for (int i = 0; i < 6; i++)
                        ck_assert_ptr_nonnull(b[i] = heap_alloc(&h, HEAP_CLASS_LARGE, sizes[i] * MiB));
        }
        ck_assert(!heap_free(&h, b[0]));
        ck_assert(!heap_free(&h, b[2]));
        ck_assert(!heap_free(&h, b[4]));
        check_ok(&h);

        /* The best fit costs 3, the hole at 6 nothing: that one, and nothing after it is asked. */
        t.of[0] = 3;
        t.of[14] = 0;
        x = heap_alloc_cheapest(&h, HEAP_CLASS_LARGE, 4 * MiB, 0, &held, &choice);
        ck_assert(!held);
        ck_assert_uint_eq(x->offset, 6 * MiB);
        ck_assert_uint_eq(t.asked, 2);
        (void) heap_free(&h, x);

        /* Equal costs: the best fit, though every fit up to max_size was asked. */
        t = (struct costs) { .of = { [0] = 1, [6] = 1, [14] = 1 } };
        x = heap_alloc_cheapest(&h, HEAP_CLASS_LARGE, 4 * MiB, 0, &held, &choice);
        ck_assert_uint_eq(x->offset, 0);
        ck_assert_uint_eq(t.asked, 3);  /* 4, 6 and 8 MiB; not the rest of 40 */
        (void) heap_free(&h, x);

        /* Past max_size nothing is weighed, nor past tries. */
        t = (struct costs) { .of = { [0] = 2, [6] = 1, [14] = 0 } };
        choice.max_size = 6 * MiB;
        x = heap_alloc_cheapest(&h, HEAP_CLASS_LARGE, 4 * MiB, 0, &held, &choice);
        ck_assert_uint_eq(x->offset, 6 * MiB);
        (void) heap_free(&h, x);
        choice.max_size = 8 * MiB;
        choice.tries = 1;
        x = heap_alloc_cheapest(&h, HEAP_CLASS_LARGE, 4 * MiB, 0, &held, &choice);
        ck_assert_uint_eq(x->offset, 0);
        ck_assert_uint_eq(t.asked, 3);
        (void) heap_free(&h, x);
        choice.tries = 16;
        check_ok(&h);

        /* A block held for the lane, a better fit than any free one, is taken unweighed. */
        {
                struct heap_segment q;
                struct heap hq;
                struct heap_block *y;

                heap_init(&hq);
                ck_assert_int_eq(heap_add(&hq, &q, 1, 12 * MiB, HEAP_CLASS_LARGE), 0);
                ck_assert_ptr_nonnull(heap_alloc(&hq, HEAP_CLASS_LARGE, 2 * MiB));
                ck_assert_ptr_nonnull(y = heap_alloc(&hq, HEAP_CLASS_LARGE, 2 * MiB));
                ck_assert_ptr_nonnull(heap_alloc(&hq, HEAP_CLASS_LARGE, 4 * MiB));
                heap_free_held(&hq, y, 1, 7);  /* 2 MiB at 2, between live blocks; 4 MiB free at 8 */
                t = (struct costs) { .of = { [2] = 5, [8] = 0 } };
                x = heap_alloc_cheapest(&hq, HEAP_CLASS_LARGE, 2 * MiB, 1, &held, &choice);
                ck_assert(held);
                ck_assert_uint_eq(x->offset, 2 * MiB);
                ck_assert_uint_eq(t.asked, 0);
                check_ok(&hq);
                (void) heap_drop(&q);
        }

        /* A piece is carved whole from the best fit, never weighed. */
        ck_assert_int_eq(heap_add(&h, &p, 2, 8 * MiB, HEAP_CLASS_PIECE), 0);
        x = heap_alloc_cheapest(&h, HEAP_CLASS_PIECE, 8 * MiB, 0, &held, &choice);
        ck_assert_ptr_eq(x->segment, &p);
        ck_assert_uint_eq(t.asked, 0);
        check_ok(&h);
        (void) heap_drop(&p);
        (void) heap_drop(&s);
}
END_TEST

Suite *suite_heap(void) {
        Suite *s = suite_create("heap");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_rounding_and_classes);
        tcase_add_test(tc, test_best_fit_split_merge);
        tcase_add_test(tc, test_remove_and_drop);
        tcase_add_test(tc, test_pieces);
        tcase_add_test(tc, test_check_catches_corruption);
        tcase_add_test(tc, test_random_churn);
        tcase_add_test(tc, test_held_for_a_lane);
        tcase_add_test(tc, test_held_and_free_neighbours);
        tcase_add_test(tc, test_held_whole);
        tcase_add_test(tc, test_random_churn_lanes);
        tcase_add_test(tc, test_one_lane_as_free);
        tcase_add_test(tc, test_cheapest_of_the_fits);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
