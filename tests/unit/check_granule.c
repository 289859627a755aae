/*
 * check_granule.c: physical granules behind virtual ranges (common/granule.c): what a block
 * maps and obtains, idle granules unmapped highest first and mapped again where needed,
 * failures that leave nothing counted, spares given back, the refusals, and random churn
 * through the allocator core with granule_check() after every step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "granule.h"
#include "heap.h"
#include "suites.h"

#define G 4096ULL

/* The test's mapping: records each operation, fails where told. */
struct rec {
        uint64_t next_phys;
        uint64_t maps[64], unmaps[64];          /* granule indices, in order */
        unsigned map_count, unmap_count;
        int fail_obtain;                        /* the errno obtain returns, or 0 */
        int fail_map_after;                     /* maps that succeed before one fails; -1: none fails */
        uint64_t mapped_phys[1024];             /* phys at each granule of the first range, to check reuse */
        uint64_t clock;                         /* what now returns */
        uint64_t runs[64][2];                   /* the runs made usable: first granule, count */
        unsigned run_count;
        int fail_access;                        /* the errno access returns, or 0 */
};

static int rec_map(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        struct rec *t = ctx;

        (void) r;
        if (t->fail_map_after == 0)
                return -EIO;
        if (t->fail_map_after > 0)
                t->fail_map_after--;
        if (t->map_count < 64)
                t->maps[t->map_count++] = k;
        if (k < 1024)
                t->mapped_phys[k] = phys;
        return 0;
}

static void rec_unmap(void *ctx, struct granule_range *r, uint64_t k, uint64_t phys) {
        struct rec *t = ctx;

        (void) r, (void) phys;
        if (t->unmap_count < 64)
                t->unmaps[t->unmap_count++] = k;
}

static int rec_obtain(void *ctx, uint64_t n, uint64_t *phys) {
        struct rec *t = ctx;

        if (t->fail_obtain)
                return -t->fail_obtain;
        for (uint64_t i = 0; i < n; i++)
                phys[i] = 1000 + t->next_phys++;
        return 0;
}

static uint64_t rec_now(void *ctx) {
        return ((struct rec *) ctx)->clock;
}

static int rec_access(void *ctx, struct granule_range *r, uint64_t first, uint64_t n) {
        struct rec *t = ctx;

        (void) r;
        if (t->fail_access)
                return -t->fail_access;
        if (t->run_count < 64) {
                t->runs[t->run_count][0] = first;
                t->runs[t->run_count++][1] = n;
        }
        return 0;
}

static const struct granule_ops rec_ops = { rec_map, rec_unmap, rec_obtain, rec_now, rec_access };

static void check_ok(const struct granule_set *s) {
        char why[256] = "";

        ck_assert_msg(granule_check(s, why, sizeof(why)) == 0, "%s", why);
}

/* A set of granules of G bytes over a recorder that fails nothing. */
static void start_set(struct granule_set *s, struct rec *t) {
        memset(t, 0, sizeof(*t));
        t->fail_map_after = -1;
        ck_assert_int_eq(granule_set_init(s, G, &rec_ops, t), 0);
}

static void start(struct granule_set *s, struct granule_range *r, struct rec *t, uint64_t granules) {
        start_set(s, t);
        ck_assert_int_eq(granule_range_init(s, r, granules * G), 0);
}

static void finish(struct granule_set *s, struct granule_range *r) {
        granule_range_destroy(r);
        granule_set_destroy(s);
}

START_TEST(test_take_maps_what_blocks_touch) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 64);
        /* A block over granules 0 and 1: both obtained and mapped. */
        ck_assert_int_eq(granule_take(&r, 0, G + G / 2), 0);
        ck_assert_uint_eq(s.held, 2);
        ck_assert_uint_eq(s.obtained, 2);
        ck_assert_uint_eq(t.map_count, 2);
        /* Another in the rest of granule 1: nothing to map. */
        ck_assert_int_eq(granule_take(&r, G + G / 2, G / 2), 0);
        ck_assert_uint_eq(t.map_count, 2);
        check_ok(&s);
        /* The first freed: granule 0 is idle, granule 1 still holds the second block. */
        granule_give(&r, 0, G + G / 2);
        ck_assert_uint_eq(r.idle_count, 1);
        ck_assert_uint_eq(r.mapped_count, 2);
        check_ok(&s);
        /* A block in granule 0 again: mapped already, nothing obtained. */
        ck_assert_int_eq(granule_take(&r, 512, 512), 0);
        ck_assert_uint_eq(r.idle_count, 0);
        ck_assert_uint_eq(s.obtained, 2);
        ck_assert_uint_eq(t.map_count, 2);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_idle_granules_move_highest_first) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;
        uint64_t phys20, phys30;

        start(&s, &r, &t, 64);
        for (uint64_t k = 10; k <= 30; k += 10)
                ck_assert_int_eq(granule_take(&r, k * G, G), 0);
        phys20 = t.mapped_phys[20];
        phys30 = t.mapped_phys[30];
        for (uint64_t k = 10; k <= 30; k += 10)
                granule_give(&r, k * G, G);
        ck_assert_uint_eq(r.idle_count, 3);
        /* Two granules needed at 5 and 6: the idle 30 and 20 move there, none is obtained. */
        ck_assert_int_eq(granule_take(&r, 5 * G, 2 * G), 0);
        ck_assert_uint_eq(s.obtained, 3);
        ck_assert_uint_eq(s.held, 3);
        ck_assert_uint_eq(t.unmap_count, 2);
        ck_assert_uint_eq(t.unmaps[0], 30);
        ck_assert_uint_eq(t.unmaps[1], 20);
        ck_assert(t.mapped_phys[5] == phys20 || t.mapped_phys[5] == phys30);
        ck_assert(t.mapped_phys[6] == phys20 || t.mapped_phys[6] == phys30);
        ck_assert_uint_ne(t.mapped_phys[5], t.mapped_phys[6]);
        ck_assert_uint_eq(r.idle_count, 1);     /* 10 stays where it is */
        check_ok(&s);
        /* Two more: 10 moves, one is obtained. */
        ck_assert_int_eq(granule_take(&r, 40 * G, 2 * G), 0);
        ck_assert_uint_eq(s.obtained, 4);
        ck_assert_uint_eq(t.unmaps[2], 10);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_failures_count_nothing) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 64);
        /* The lease fails: nothing counted, nothing held. */
        t.fail_obtain = ENOMEM;
        ck_assert_int_eq(granule_take(&r, 0, 3 * G), -ENOMEM);
        ck_assert_uint_eq(s.held, 0);
        ck_assert_uint_eq(r.refs[0] + r.refs[1] + r.refs[2], 0);
        check_ok(&s);
        /* The second map fails: the first granule, never made usable, is unmapped again; all three spare. */
        t.fail_obtain = 0;
        t.fail_map_after = 1;
        ck_assert_int_eq(granule_take(&r, 0, 3 * G), -EIO);
        ck_assert_uint_eq(s.held, 3);
        ck_assert_uint_eq(r.mapped_count, 0);
        ck_assert_uint_eq(r.idle_count, 0);
        ck_assert_uint_eq(s.spare_count, 3);
        check_ok(&s);
        /* Then it works, from what it holds. */
        t.fail_map_after = -1;
        ck_assert_int_eq(granule_take(&r, 0, 3 * G), 0);
        ck_assert_uint_eq(s.obtained, 3);
        ck_assert_uint_eq(s.spare_count, 0);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_spares_given_back) {
        struct granule_range r;
        struct granule_set s;
        uint64_t phys[8];
        struct rec t;

        start(&s, &r, &t, 64);
        ck_assert_int_eq(granule_take(&r, 0, 4 * G), 0);
        ck_assert_int_eq(granule_take(&r, 8 * G, G), 0);
        granule_give(&r, 0, 4 * G);
        ck_assert_uint_eq(granule_unmap_idle(&s, 100, UINT64_MAX), 4);
        ck_assert_uint_eq(s.spare_count, 4);
        ck_assert_uint_eq(granule_release_spares(&s, phys, 3, UINT64_MAX), 3);
        ck_assert_uint_eq(s.held, 2);
        check_ok(&s);
        ck_assert_uint_eq(granule_release_spares(&s, phys, 8, UINT64_MAX), 1);
        ck_assert_uint_eq(granule_release_spares(&s, phys, 8, UINT64_MAX), 0);
        ck_assert_uint_eq(s.held, 1);           /* the live block's */
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_idle_return_by_age) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 64);
        ck_assert_int_eq(granule_take(&r, 0, 2 * G), 0);
        ck_assert_int_eq(granule_take(&r, 4 * G, 2 * G), 0);
        t.clock = 100;
        granule_give(&r, 0, 2 * G);
        t.clock = 200;
        granule_give(&r, 4 * G, 2 * G);
        ck_assert_uint_eq(granule_free_count(&s), 4);
        /* Only those idle since 150 or before: granules 0 and 1, though 4 and 5 are higher. */
        t.unmap_count = 0;
        ck_assert_uint_eq(granule_unmap_idle(&s, 100, 150), 2);
        ck_assert_uint_eq(t.unmap_count, 2);
        ck_assert_uint_eq(t.unmaps[0], 1);
        ck_assert_uint_eq(t.unmaps[1], 0);
        ck_assert_uint_eq(granule_free_count(&s), 4);   /* two idle, two spare */
        ck_assert_uint_eq(granule_unmap_idle(&s, 100, 199), 0);
        ck_assert_uint_eq(granule_unmap_idle(&s, 100, 200), 2);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_obtained_ahead) {
        struct granule_range r;
        struct granule_set s;
        uint64_t phys[4] = { 7, 8, 9, 10 };
        struct rec t;

        start(&s, &r, &t, 64);
        ck_assert_uint_eq(granule_shortfall(&r, 0, 3 * G), 3);
        ck_assert_int_eq(granule_take(&r, 0, 2 * G), 0);
        granule_give(&r, 0, 2 * G);
        /* The block's own idle granule serves it in place; the other idle one moves. */
        ck_assert_uint_eq(granule_shortfall(&r, G, 4 * G), 2);
        ck_assert_uint_eq(granule_shortfall(&r, 10 * G, 2 * G), 0);
        ck_assert_uint_eq(granule_shortfall(&r, 10 * G, 3 * G), 1);
        ck_assert_int_eq(granule_add_spares(&s, phys, 2), 0);
        ck_assert_uint_eq(s.held, 4);
        ck_assert_uint_eq(granule_shortfall(&r, G, 4 * G), 0);
        /* Obtaining would fail: the take must not need to. */
        t.fail_obtain = EIO;
        ck_assert_int_eq(granule_take(&r, G, 4 * G), 0);
        ck_assert_uint_eq(s.held, 4);
        ck_assert_uint_eq(granule_free_count(&s), 0);
        ck_assert_uint_eq(granule_shortfall(&r, 0, G), 1);      /* granule 0 moved to serve it */
        ck_assert_uint_eq(granule_shortfall(&r, 2 * G, 2 * G), 0);      /* mapped, live */
        ck_assert_uint_eq(granule_shortfall(&r, 0, 0), 0);
        check_ok(&s);
        t.fail_obtain = 0;
        finish(&s, &r);
}
END_TEST

/* The lease policy: up to what the blocks hold in use and a 32nd more, and at least a 192nd of what is held ahead. */
START_TEST(test_lease_ahead) {
        struct granule_range r;
        struct granule_set s;
        uint64_t phys[400];
        struct rec t;

        start(&s, &r, &t, 64);
        /* Nothing lacking, nothing leased ahead. */
        ck_assert_uint_eq(granule_ahead(&s, 0, 64 * G), 0);
        /* 64 granules in use and a 32nd more are 66. */
        ck_assert_uint_eq(granule_ahead(&s, 64, 64 * G), 2);
        ck_assert_uint_eq(granule_ahead(&s, 60, 64 * G), 6);
        /* The 32nd is of bytes, rounded up to whole granules: 10 granules and a byte take 11, and 63 take 65. */
        ck_assert_uint_eq(granule_ahead(&s, 11, 10 * G + 1), 0);
        ck_assert_uint_eq(granule_ahead(&s, 10, 10 * G + 1), 1);
        ck_assert_uint_eq(granule_ahead(&s, 63, 63 * G), 2);
        for (uint64_t i = 0; i < 400; i++)
                phys[i] = i;
        ck_assert_int_eq(granule_add_spares(&s, phys, 400), 0);
        /* Holding more than the slack already: a 192nd of what it will hold, 402 and 592. */
        ck_assert_uint_eq(granule_ahead(&s, 2, 100 * G), 2);
        ck_assert_uint_eq(granule_ahead(&s, 192, 100 * G), 3);
        /* Or where the slack leaves less: 398 in use take 411, one more than the 410, and a 192nd is 2. */
        ck_assert_uint_eq(granule_ahead(&s, 10, 398 * G), 2);
        /* The slack where it is more: 416 in use take 429. */
        ck_assert_uint_eq(granule_ahead(&s, 10, 416 * G), 19);
        check_ok(&s);
        (void) granule_release_spares(&s, phys, 400, UINT64_MAX);
        finish(&s, &r);
}
END_TEST

/* Checks granule_plan() of a block at [first, first + n) granules of r. */
static void plan_is(struct granule_range *r, uint64_t first, uint64_t n, uint64_t peak, uint64_t in_use, uint64_t must,
                    uint64_t want, uint64_t ahead) {
        struct granule_plan p;

        granule_plan(r, first * G, n * G, peak, in_use, &p);
        ck_assert_uint_eq(p.must, must);
        ck_assert_uint_eq(p.want, want);
        ck_assert_uint_eq(p.ahead, ahead);
}

/*
 * The plan of a lease: rather than move idle granules, a block obtains what it lacks as long as
 * the set holds within a 24th over its peak in use, in a lease of its own only for room of a
 * 96th of what it holds, and such a lease brings the rest of the room.
 */
START_TEST(test_lease_plan) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 1024);
        /* 200 granules held, all idle. */
        ck_assert_int_eq(granule_take(&r, 0, 200 * G), 0);
        granule_give(&r, 0, 200 * G);
        /* A block of 4 elsewhere must have none (the idle ones can move); the budget of a 200-granule peak is 209. */
        plan_is(&r, 300, 4, 200 * G, 4 * G, 0, 4, 9);
        /* A peak of 195: the budget is 204, the room 4, all the block lacks; granule_ahead() asks 1 more. */
        plan_is(&r, 300, 4, 195 * G, 4 * G, 0, 4, 5);
        /* 193: a room of 2, just a 96th of 200, and 2 of the 4 come (with 1 ahead); the idle ones move for the rest. */
        plan_is(&r, 300, 4, 193 * G, 4 * G, 0, 2, 3);
        /* 192: no room, nothing to lease; nor with no peak (the caller asks for no more than it must). */
        plan_is(&r, 300, 4, 192 * G, 4 * G, 0, 0, 0);
        plan_is(&r, 300, 4, 0, 4 * G, 0, 0, 0);
        /* Over a block of granules mapped already, nothing either. */
        plan_is(&r, 10, 4, 200 * G, 4 * G, 0, 0, 0);
        /* Room under a 96th of 200: a peak of 192.5 granules leaves 1, not worth a lease of its own. */
        plan_is(&r, 300, 4, 192 * G + G / 2, 4 * G, 0, 0, 0);
        /*
         * 210 lacking where 200 are idle: 10 it must have. A 210-granule peak's budget is 219: 19
         * wanted, granule_ahead() of 19 is a 192nd of 219 (1), 10 ahead in all.
         */
        plan_is(&r, 300, 210, 210 * G, 210 * G, 10, 19, 10);
        /* With no peak, the shortfall and granule_ahead(): 210 in use and a 32nd are 217, 7 more than 210. */
        plan_is(&r, 300, 210, 0, 210 * G, 10, 10, 7);
        /* An empty or outside block lacks nothing. */
        plan_is(&r, 300, 0, 200 * G, 4 * G, 0, 0, 0);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

/* Checks that run i made usable granules first to first + n - 1. */
static void run_is(const struct rec *t, unsigned i, uint64_t first, uint64_t n) {
        ck_assert_uint_gt(t->run_count, i);
        ck_assert_uint_eq(t->runs[i][0], first);
        ck_assert_uint_eq(t->runs[i][1], n);
}

/*
 * The granules a take maps are made usable a run at a time (on cuda-vmm one cuMemSetAccess
 * over mappings side by side); those that cannot be are unmapped again, spares, and so are
 * those mapped before a map that failed.
 */
START_TEST(test_access_per_run) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 64);
        ck_assert_int_eq(granule_take(&r, 0, G), 0);
        run_is(&t, 0, 0, 1);
        /* Granule 0 mapped already: 1 to 5 in one run. */
        ck_assert_int_eq(granule_take(&r, 0, 6 * G), 0);
        ck_assert_uint_eq(t.run_count, 2);
        run_is(&t, 1, 1, 5);
        /* A mapped granule in the middle splits the run in two. */
        ck_assert_int_eq(granule_take(&r, 10 * G, G), 0);
        ck_assert_int_eq(granule_take(&r, 8 * G, 5 * G), 0);
        ck_assert_uint_eq(t.run_count, 5);
        run_is(&t, 2, 10, 1);
        run_is(&t, 3, 8, 2);
        run_is(&t, 4, 11, 2);
        ck_assert_uint_eq(s.held, 11);
        check_ok(&s);
        /* Made usable it cannot be: its 4 new granules are unmapped again, spares, and nothing is counted. */
        t.fail_access = EIO;
        t.unmap_count = 0;
        ck_assert_int_eq(granule_take(&r, 20 * G, 4 * G), -EIO);
        ck_assert_uint_eq(t.unmap_count, 4);
        ck_assert_uint_eq(s.held, 15);
        ck_assert_uint_eq(s.spare_count, 4);
        ck_assert_uint_eq(r.mapped_count, 11);
        ck_assert_uint_eq(r.refs[20], 0);
        check_ok(&s);
        /* A map fails after two (of 5: the 4 spares and one obtained): those two were never made usable, and go back too. */
        t.fail_access = 0;
        t.fail_map_after = 2;
        t.unmap_count = 0;
        ck_assert_int_eq(granule_take(&r, 30 * G, 5 * G), -EIO);
        ck_assert_uint_eq(t.unmap_count, 2);
        ck_assert_uint_eq(t.run_count, 5);
        ck_assert_uint_eq(r.mapped_count, 11);
        ck_assert_uint_eq(s.held, 16);
        ck_assert_uint_eq(s.spare_count, 5);
        check_ok(&s);
        /* Working again, the spares serve, made usable as one run. */
        t.fail_map_after = -1;
        ck_assert_int_eq(granule_take(&r, 20 * G, 4 * G), 0);
        run_is(&t, 5, 20, 4);
        ck_assert_uint_eq(s.held, 16);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_spares_keep_their_age) {
        struct granule_range r;
        struct granule_set s;
        uint64_t ahead[3] = { 7, 8, 9 }, phys[8];
        struct rec t;

        start(&s, &r, &t, 64);
        t.clock = 100;
        ck_assert_int_eq(granule_take(&r, 0, G), 0);
        granule_give(&r, 0, G);                         /* idle since 100 */
        t.clock = 300;
        ck_assert_int_eq(granule_add_spares(&s, ahead, 3), 0);  /* free since 300 */
        /* Obtained ahead is not old: only the granule idle since 100 goes at 200. */
        ck_assert_uint_eq(granule_release(&s, phys, 8, 200), 1);
        ck_assert_uint_eq(phys[0], 1000);
        ck_assert_uint_eq(s.spare_count, 3);
        check_ok(&s);
        /* An idle granule unmapped into the spares keeps its own age. */
        t.clock = 400;
        ck_assert_int_eq(granule_take(&r, 4 * G, 2 * G), 0);    /* takes 9 and 8 */
        t.clock = 500;
        granule_give(&r, 4 * G, 2 * G);                 /* idle since 500 */
        ck_assert_uint_eq(granule_unmap_idle(&s, 1, UINT64_MAX), 1);
        ck_assert_uint_eq(granule_release_spares(&s, phys, 8, 499), 1);
        ck_assert_uint_eq(phys[0], 7);
        ck_assert_uint_eq(granule_release_spares(&s, phys, 8, 499), 0);
        /* Any age: the spare first, then the idle granule. */
        ck_assert_uint_eq(granule_release(&s, phys, 1, UINT64_MAX), 1);
        ck_assert_uint_eq(granule_free_count(&s), 1);
        ck_assert_uint_eq(granule_release(&s, phys, 8, UINT64_MAX), 1);
        ck_assert_uint_eq(s.held, 0);
        check_ok(&s);
        finish(&s, &r);
}
END_TEST

START_TEST(test_refusals) {
        struct granule_range r[GRANULE_MAX_RANGES + 1];
        struct granule_set s;
        struct rec t;

        memset(&t, 0, sizeof(t));
        ck_assert_int_eq(granule_set_init(&s, 0, &rec_ops, &t), -EINVAL);
        ck_assert_int_eq(granule_set_init(&s, G, &rec_ops, &t), 0);
        ck_assert_int_eq(granule_range_init(&s, &r[0], 0), -EINVAL);
        ck_assert_int_eq(granule_range_init(&s, &r[0], G + 512), -EINVAL);
        for (int i = 0; i < GRANULE_MAX_RANGES; i++)
                ck_assert_int_eq(granule_range_init(&s, &r[i], 4 * G), 0);
        ck_assert_int_eq(granule_range_init(&s, &r[GRANULE_MAX_RANGES], 4 * G), -ENOSPC);
        ck_assert_int_eq(granule_take(&r[0], 0, 0), -EINVAL);
        ck_assert_int_eq(granule_take(&r[0], 3 * G, G + 1), -EINVAL);  /* past the range's end */
        ck_assert_int_eq(granule_take(&r[0], UINT64_MAX - 10, 100), -EINVAL);
        check_ok(&s);
        for (int i = 0; i < GRANULE_MAX_RANGES; i++)
                granule_range_destroy(&r[i]);
        ck_assert_uint_eq(s.range_count, 0);
        granule_set_destroy(&s);
}
END_TEST

/* Random blocks of two ranges carved by the allocator core; every live block's granules stay mapped. */
START_TEST(test_unmapped_counts) {
        struct granule_range r;
        struct granule_set s;
        struct rec t;

        start(&s, &r, &t, 200);
        /* Granules 60..69 and 130 mapped: spans across words, and one granule. */
        ck_assert_int_eq(granule_take(&r, 60 * G, 10 * G), 0);
        ck_assert_int_eq(granule_take(&r, 130 * G + 100, 512), 0);
        ck_assert_uint_eq(granule_unmapped(&r, 0, 200 * G), 189);
        ck_assert_uint_eq(granule_unmapped(&r, 60 * G, 10 * G), 0);
        ck_assert_uint_eq(granule_unmapped(&r, 59 * G, 12 * G), 2);
        ck_assert_uint_eq(granule_unmapped(&r, 63 * G + 1, G), 0);     /* granules 63 and 64 */
        ck_assert_uint_eq(granule_unmapped(&r, 127 * G, 4 * G), 3);
        ck_assert_uint_eq(granule_unmapped(&r, 128 * G, 64 * G), 63);  /* one word exactly */
        ck_assert_uint_eq(granule_unmapped(&r, 199 * G, G), 1);
        /* Outside the range, or nothing: 0. */
        ck_assert_uint_eq(granule_unmapped(&r, 199 * G, 2 * G), 0);
        ck_assert_uint_eq(granule_unmapped(&r, 0, 0), 0);
        finish(&s, &r);
}
END_TEST

START_TEST(test_placement_where_mapped) {
        struct heap_block *b[5], *x;
        struct granule_range r;
        struct heap_segment seg;
        struct granule_set s;
        struct rec t;
        struct heap h;
        bool held;
        struct heap_choice choice;
        static const uint64_t sizes[5] = { 1, 3, 1, 2, 1 };     /* granules, side by side from 0 */

        heap_init(&h);
        start(&s, &r, &t, 64);
        ck_assert_int_eq(heap_add(&h, &seg, 1, 64 * G, HEAP_CLASS_SMALL), 0);
        granule_choice(&r, 2 * G, &choice);     /* the heap's one class, HEAP_CLASS_SMALL: the first range */
        for (int i = 0; i < 5; i++) {
                ck_assert_ptr_nonnull(b[i] = heap_alloc(&h, HEAP_CLASS_SMALL, sizes[i] * G));
                ck_assert_int_eq(granule_take(&r, b[i]->offset, b[i]->size), 0);
        }
        /* Holes of 3 granules at 1 and of 2 at 5, idle; the highest two, 5 and 6, moved out. */
        for (int i = 1; i <= 3; i += 2) {
                granule_give(&r, b[i]->offset, b[i]->size);
                (void) heap_free(&h, b[i]);
        }
        ck_assert_uint_eq(granule_unmap_idle(&s, 2, UINT64_MAX), 2);
        ck_assert_uint_eq(s.spare_count, 2);
        check_ok(&s);

        /* 2 granules: the best fit (at 5) lacks both; the hole at 1, still mapped, serves it as it is. */
        x = heap_alloc_cheapest(&h, HEAP_CLASS_SMALL, 2 * G, 0, &held, &choice);
        ck_assert_uint_eq(x->offset, 1 * G);
        t.map_count = 0;
        ck_assert_int_eq(granule_take(&r, x->offset, x->size), 0);
        ck_assert_uint_eq(t.map_count, 0);
        ck_assert_uint_eq(s.spare_count, 2);
        check_ok(&s);

        /* Where every fit lacks as much, the best fit. */
        granule_give(&r, x->offset, x->size);
        (void) heap_free(&h, x);
        ck_assert_uint_eq(granule_unmap_idle(&s, 3, UINT64_MAX), 3);
        x = heap_alloc_cheapest(&h, HEAP_CLASS_SMALL, 2 * G, 0, &held, &choice);
        ck_assert_uint_eq(x->offset, 5 * G);
        ck_assert_int_eq(granule_take(&r, x->offset, x->size), 0);
        check_ok(&s);
        finish(&s, &r);
        for (int i = 0; i < 5; i += 2)
                (void) heap_free(&h, b[i]);
        (void) heap_free(&h, x);
        ck_assert_int_eq(heap_remove(&seg), 0);
}
END_TEST

START_TEST(test_random_churn) {
        enum { SLOTS = 200 };
        struct heap_block *live[SLOTS] = { NULL };
        struct granule_range r[2];
        struct heap_segment seg[2];
        struct granule_set s;
        unsigned seed = 99;
        struct heap h;
        struct rec t;

        heap_init(&h);
        start_set(&s, &t);
        for (int c = 0; c < 2; c++) {
                ck_assert_int_eq(heap_add(&h, &seg[c], (uint64_t) c + 1, 4096 * G, (enum heap_class) c), 0);
                ck_assert_int_eq(granule_range_init(&s, &r[c], 4096 * G), 0);
        }
        for (int step = 0; step < 20000; step++) {
                unsigned i = (unsigned) rand_r(&seed) % SLOTS;

                if (live[i]) {
                        granule_give(&r[live[i]->segment->class], live[i]->offset, live[i]->size);
                        (void) heap_free(&h, live[i]);
                        live[i] = NULL;
                } else {
                        uint64_t size = heap_round(1 + (uint64_t) rand_r(&seed) % (rand_r(&seed) % 4 ? 2 * G : 40 * G));
                        /* Up to a granule in the one range, larger ones in the other. */
                        enum heap_class c = size <= G ? HEAP_CLASS_SMALL : HEAP_CLASS_LARGE;

                        struct heap_choice choice;
                        bool held;

                        /* Half placed as libgpupool places them, where the fewest granules are not mapped. */
                        granule_choice(r, size, &choice);
                        live[i] = step % 2 ? heap_alloc(&h, c, size) : heap_alloc_cheapest(&h, c, size, 0, &held, &choice);
                        ck_assert_ptr_nonnull(live[i]);
                        ck_assert_int_eq(granule_take(&r[c], live[i]->offset, live[i]->size), 0);
                }
                if (step % 97 == 0)
                        (void) granule_unmap_idle(&s, (uint64_t) rand_r(&seed) % 8, UINT64_MAX);
                if (step % 500 == 0)
                        check_ok(&s);
        }
        check_ok(&s);
        /* What it holds never passed what it obtained, and every granule held is mapped or spare. */
        ck_assert_uint_eq(s.held, s.obtained);
        for (int c = 0; c < 2; c++)
                granule_range_destroy(&r[c]);
        granule_set_destroy(&s);
        for (unsigned i = 0; i < SLOTS; i++)
                if (live[i])
                        (void) heap_free(&h, live[i]);
        for (int c = 0; c < 2; c++)
                ck_assert_int_eq(heap_remove(&seg[c]), 0);
}
END_TEST

Suite *suite_granule(void) {
        Suite *s = suite_create("granule");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_take_maps_what_blocks_touch);
        tcase_add_test(tc, test_idle_granules_move_highest_first);
        tcase_add_test(tc, test_failures_count_nothing);
        tcase_add_test(tc, test_spares_given_back);
        tcase_add_test(tc, test_idle_return_by_age);
        tcase_add_test(tc, test_obtained_ahead);
        tcase_add_test(tc, test_lease_ahead);
        tcase_add_test(tc, test_lease_plan);
        tcase_add_test(tc, test_access_per_run);
        tcase_add_test(tc, test_spares_keep_their_age);
        tcase_add_test(tc, test_refusals);
        tcase_add_test(tc, test_unmapped_counts);
        tcase_add_test(tc, test_placement_where_mapped);
        tcase_add_test(tc, test_random_churn);
        suite_add_tcase(s, tc);
        return s;
}
