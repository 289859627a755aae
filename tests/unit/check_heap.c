/*
 * check_heap.c: the allocator core (common/heap.c) through its header: rounding and classes,
 * best fit with its tie-break, split and merge, the empty list, and random churn against a
 * model of which bytes are live, with heap_check() after every step.
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

Suite *suite_heap(void) {
        Suite *s = suite_create("heap");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_rounding_and_classes);
        tcase_add_test(tc, test_best_fit_split_merge);
        tcase_add_test(tc, test_remove_and_drop);
        tcase_add_test(tc, test_check_catches_corruption);
        tcase_add_test(tc, test_random_churn);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
