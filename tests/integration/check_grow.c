/*
 * check_grow.c: segments that grow in place ($GPUPOOL_SEGMENTS=grow, client/client_grow.c)
 * end to end on the host backend: blocks side by side in one range, a block landing where
 * granules are still mapped, granules leased many at a time and moved where they are needed, a block of more granules than one lease brings (its
 * leases sent together), the limit and a full device leaving nothing leased, idle granules
 * given back, another process's reclaim, threads growing the ranges at once, blocks of
 * gigabytes given pieces of their own, the descriptors
 * kept for adoption (the table grown once, none in a forked child), and a bad setting.
 * Processes that outlive their daemon are in check_survive.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)

static gpupool_client *connect_growing(struct testd *d, const char *name) {
        return connect_segments(d->sock, name, "grow");
}

static struct gpupool_grow_stats grow_stats(gpupool_client *c) {
        struct gpupool_grow_stats gs;

        ck_assert_int_eq(gpupool_grow_stats(c, &gs), 0);
        return gs;
}

START_TEST(test_grow_in_place) {
        struct gpupool_grow_stats gs;
        struct gpupool_stats st, before;
        gpupool_client *c;
        struct testd d;
        char *a, *b, *x;

        testd_start(&d, NULL);
        c = connect_growing(&d, "grower");
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, (void **) &a), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 5 * MiB, (void **) &b), 0);
        /* Side by side: the range grew under b, no new segment was started. */
        ck_assert_ptr_eq(b, a + 3 * MiB);
        /*
         * [0, 8 MiB): four granules, and a fifth the second lease brought ahead: what the
         * process holds comes to 8 MiB in use and a 32nd more, in granules (granule_ahead()).
         */
        st = client_stats(c);
        ck_assert_uint_eq(st.mapped_segments, 5);
        ck_assert_uint_eq(st.mapped_bytes, 10 * MiB);
        ck_assert_uint_eq(st.segments_imported, 5);
        ck_assert_uint_eq(st.round_trips, 3);           /* hello, and a lease for each block */
        page_fill(a, 3 * MiB, 1);
        page_fill(b, 5 * MiB, 2);
        ck_assert(page_intact(a, 3 * MiB, 1) && page_intact(b, 5 * MiB, 2));
        /* The daemon counts each granule as a segment of the process's. */
        ck_assert_int_eq(testd_client_field(&d, 0, "grower", "reserved_bytes"), 10 * MiB);
        ck_assert_int_eq(testd_client_field(&d, 0, "grower", "segments"), 5);

        /* a freed: its first granule is idle (the second holds b too), and the spare is free too. */
        ck_assert_int_eq(gpupool_free(c, a), 0);
        ck_assert_uint_eq(gpupool_cached_bytes(c), 5 * MiB);
        ck_assert(testd_client_becomes(&d, 0, "grower", "held_free_bytes", 4 * MiB));
        /*
         * 6 MiB does not fit a's place: it goes after b, over three granules, the spare and a's
         * idle granule among them. Holding 11 MiB in use and a 32nd more takes six granules:
         * the one the lease brings, and the idle granule moves.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, (void **) &x), 0);
        ck_assert_ptr_eq(x, b + 5 * MiB);
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips, 4);
        ck_assert_uint_eq(st.mapped_segments, 6);       /* granules 1 to 6: one moved, one spare, one leased */
        /* Mapped under blocks: 2 for a, 2 for b, 3 for x; unmapped: the one that moved. */
        gs = grow_stats(c);
        ck_assert_uint_eq(gs.granules_held, 6);
        ck_assert_uint_eq(gs.granules_free, 0);
        ck_assert_uint_eq(gs.granules_mapped, 7);
        ck_assert_uint_eq(gs.granules_unmapped, 1);
        ck_assert_uint_eq(st.segments_imported, 6);
        page_fill(x, 6 * MiB, 3);
        ck_assert(page_intact(b, 5 * MiB, 2) && page_intact(x, 6 * MiB, 3));

        /* The steady state asks the daemon nothing and maps nothing (a's place lacks the granule that moved, once). */
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, (void **) &a), 0);
        ck_assert_int_eq(gpupool_free(c, a), 0);
        before = client_stats(c);
        gs = grow_stats(c);
        for (int i = 0; i < 100; i++) {
                ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, (void **) &a), 0);
                ((volatile char *) a)[3 * MiB - 1] = 1;
                ck_assert_int_eq(gpupool_free(c, a), 0);
        }
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips, before.round_trips);
        ck_assert_uint_eq(st.segments_imported, before.segments_imported);
        ck_assert_uint_eq(grow_stats(c).granules_mapped, gs.granules_mapped);
        ck_assert_uint_eq(grow_stats(c).granules_unmapped, gs.granules_unmapped);
        ck_assert(page_intact(b, 5 * MiB, 2) && page_intact(x, 6 * MiB, 3));

        /* Trimmed with blocks live: only granules no block touches go back. */
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 6);
        ck_assert_int_eq(gpupool_free(c, b), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 3);         /* x's granules 4 to 6 */
        ck_assert(page_intact(x, 6 * MiB, 3));
        ck_assert_int_eq(testd_client_field(&d, 0, "grower", "reserved_bytes"), 6 * MiB);
        ck_assert_int_eq(gpupool_free(c, x), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.mapped_bytes, 0);
        ck_assert_uint_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "grower", "reserved_bytes"), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "grower", "held_free_bytes"), 0);
        json_decref(testd_ctl(&d, "check"));

        /* A reconnect forgets the ranges; the next allocation sets them up anew. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, (void **) &a), 0);
        ck_assert_int_eq(gpupool_reconnect(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, (void **) &a), 0);
        page_fill(a, 64 * KiB, 4);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1);
        ck_assert_int_eq(gpupool_free(c, a), 0);
        gpupool_disconnect(c);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * One round of a program's steady state beside a resident 200 MiB: p and q of 6 MiB, p freed,
 * r of 10 MiB (too large for p's place: it lands after q), q and r freed. Its blocks touch 111
 * granules in all, the resident block's 100 among them.
 */
static void steady_round(gpupool_client *c, unsigned seed) {
        void *p, *q, *r;

        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), 0);
        page_fill(p, 6 * MiB, seed);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 10 * MiB, &r), 0);
        page_fill(r, 10 * MiB, seed + 1);
        ck_assert(page_intact(r, 10 * MiB, seed + 1));
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, r), 0);
}

/*
 * A resident 200 MiB and 21 rounds of steady_round(), under limit ("": none). 200 MiB is 100
 * granules and 4 ahead; q lacks 2 beyond them, and 4 more come ahead (110). r lacks 1 where
 * p's 3 are idle: the peak of 216 MiB and a 24th allow 113 granules, so it leases the 3 of the
 * room (granules ahead only) instead of moving one, and held granules come then. After the
 * first round, nothing is asked of the daemon either way; moved says how many granules the
 * first round moved, and whether they go on moving.
 */
static void steady_state(const char *limit, uint64_t held, uint64_t moved) {
        struct gpupool_grow_stats gs;
        gpupool_client *c;
        struct testd d;
        void *w;

        if (*limit)
                testd_start(&d, "--client-limit", limit, NULL);
        else
                testd_start(&d, NULL);
        c = connect_growing(&d, "steady");
        ck_assert_int_eq(gpupool_alloc(c, 0, 200 * MiB, &w), 0);
        steady_round(c, 1);
        gs = grow_stats(c);
        ck_assert_uint_eq(client_stats(c).round_trips, 4);
        ck_assert_uint_eq(gs.granules_held, held);
        ck_assert_uint_eq(gs.granules_unmapped, moved);
        for (unsigned i = 0; i < 20; i++)
                steady_round(c, 2 + i);
        ck_assert_uint_eq(client_stats(c).round_trips, 4);
        gs = grow_stats(c);
        ck_assert_uint_eq(gs.granules_held, held);
        if (moved)
                ck_assert_uint_gt(gs.granules_unmapped, moved);
        else
                ck_assert_uint_eq(gs.granules_mapped, 111);     /* each granule its blocks touch, once */
        ck_assert_uint_eq(gs.granules_unmapped > 0, moved > 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "steady", "reserved_bytes"), (int64_t) (held * 2 * MiB));
        ck_assert_int_eq(gpupool_free(c, w), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}

/*
 * Where the room allows, a block that lands where nothing is mapped gets granules of its own
 * rather than move idle ones (granule_plan()): in the steady state nothing moves.
 */
START_TEST(test_grow_steady_state_moves_nothing) {
        steady_state("", 113, 0);
}
END_TEST

/*
 * Under a limit that leaves no room (110 granules), the granules a block wants beyond what it
 * must have do not come: idle granules move for it, and it does not ask again each round.
 */
START_TEST(test_grow_wanted_beyond_limit) {
        steady_state("220M", 110, 1);
}
END_TEST

/* With the daemon gone, a block that wants granules beyond what it must have moves idle ones, and is served. */
START_TEST(test_grow_wanted_without_daemon) {
        gpupool_client *c;
        struct testd d;
        void *w, *p, *q, *r;

        testd_start(&d, NULL);
        c = connect_growing(&d, "orphan");
        ck_assert_int_eq(gpupool_alloc(c, 0, 200 * MiB, &w), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        testd_crash(&d);
        /* As in steady_round(), r lacks one granule where three are idle, and would lease the room. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 10 * MiB, &r), 0);
        page_fill(r, 10 * MiB, 7);
        ck_assert(page_intact(r, 10 * MiB, 7));
        ck_assert_uint_eq(grow_stats(c).granules_unmapped, 1);
        ck_assert_uint_eq(grow_stats(c).granules_held, 110);
        ck_assert_int_eq(gpupool_free(c, r), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, w), 0);
        gpupool_disconnect(c);
        testd_relaunch(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_grow_block_of_many_leases) {
        struct gpupool_stats before, st;
        gpupool_client *c, *hog;
        struct testd d;
        char msg[512];
        void *p, *small, *held;

        testd_start(&d, "--host-capacity", "1G", NULL);
        c = connect_growing(&d, "big");
        before = client_stats(c);
        /*
         * 300 MiB is 150 granules: two leases, at most 128 granules each, sent together (one
         * round trip). The second asks for five more ahead (300 MiB and a 32nd more take 155
         * granules), which the daemon has.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 300 * MiB, &p), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips - before.round_trips, 1);
        ck_assert_uint_eq(st.mapped_segments, 155);
        page_fill(p, 300 * MiB, 5);
        ck_assert(page_intact(p, 300 * MiB, 5));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);

        /*
         * More than the device has left (another client uses 600 MiB of its 1 GiB): three leases
         * at once, the second refused (the device is full), the third, already sent, granted.
         * What the first and third brought goes back, and the daemon's sentence stays.
         */
        hog = connect_growing(&d, "hog");
        ck_assert_int_eq(gpupool_alloc(hog, 0, 600 * MiB, &held), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &small), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 600 * MiB, &p), -ENOMEM);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "cannot allocate 629145600 bytes on device 0") && strstr(msg, "device 0 is full"), "%s", msg);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1);
        ck_assert_int_eq(testd_client_field(&d, 0, "big", "reserved_bytes"), 2 * MiB);
        ck_assert_int_eq(gpupool_free(hog, held), 0);
        gpupool_disconnect(hog);
        /*
         * More than the whole device: no granule is leased for it (they would be given back
         * after the device had been taken for nothing), and the daemon says it can never fit.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 1100 * MiB, &p), -ENOMEM);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "can never fit 1153433600 bytes") && strstr(msg, "in all"), "%s", msg);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1);
        ck_assert_int_eq(testd_client_field(&d, 0, "big", "reserved_bytes"), 2 * MiB);
        /* And what is left serves. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 500 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, small), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Set in each granule of a block, one byte a granule, and checked. */
static void mark_granules(char *p, uint64_t granules) {
        for (uint64_t i = 0; i < granules; i++)
                p[i * 2 * MiB + (i % 4096)] = (char) (i * 7 + 1);
}

static bool granules_marked(const char *p, uint64_t granules) {
        for (uint64_t i = 0; i < granules; i++)
                if (p[i * 2 * MiB + (i % 4096)] != (char) (i * 7 + 1))
                        return false;
        return true;
}

/*
 * A block of more leases than go out at once (16 of 128 granules): they go back to back, the
 * next sent as each reply comes, in one round trip; a refusal at the last gives all back.
 */
START_TEST(test_grow_leases_sent_together) {
        struct gpupool_stats before, st;
        gpupool_client *c;
        struct testd d;
        char msg[512];
        void *p, *q;

        testd_start(&d, "--host-capacity", "5G", "--client-limit", "4700M", NULL);
        setenv("GPUPOOL_GROW_PIECE", "off", 1);        /* every block on granules, as large as it is */
        c = connect_growing(&d, "together");
        before = client_stats(c);
        /*
         * 2,314 granules: 19 leases, the last of 10 and up to 73 ahead (4,628 MiB and a 32nd
         * more take 2,387 granules), of which the limit of 2,350 lets 36 come.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 2314 * 2 * MiB, &p), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips - before.round_trips, 1);
        ck_assert_uint_eq(st.mapped_segments, 2350);
        ck_assert_int_eq(testd_client_field(&d, 0, "together", "reserved_bytes"), 2350 * 2 * MiB);
        mark_granules(p, 2314);
        ck_assert(granules_marked(p, 2314));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "together", "reserved_bytes"), 0);

        /*
         * 2,400 granules: the first 18 leases fit the limit of 2,350, the 19th does not. The
         * 2,304 granules they brought go back in requests sent together: one round trip more.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &q), 0);
        before = client_stats(c);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2400 * 2 * MiB, &p), -EDQUOT);
        ck_assert_uint_eq(client_stats(c).round_trips - before.round_trips, 2);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "cannot allocate 5033164800 bytes on device 0 (2400 more granules") &&
                      strstr(msg, "over its limit of 4.6 GiB"), "%s", msg);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1);         /* the small block's granule */
        ck_assert_int_eq(testd_client_field(&d, 0, "together", "reserved_bytes"), 2 * MiB);
        /* And what is left serves. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 2300 * 2 * MiB, &p), 0);
        mark_granules(p, 2300);
        ck_assert(granules_marked(p, 2300));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A trim of more granules than one request names (256) sends its requests together: a round trip per 4,096. */
START_TEST(test_grow_trim_together) {
        struct gpupool_stats before, st;
        gpupool_client *c;
        struct testd d;
        void *p, *q;

        testd_start(&d, "--host-capacity", "10G", NULL);
        setenv("GPUPOOL_GROW_PIECE", "off", 1);        /* every block on granules, as large as it is */
        c = connect_growing(&d, "trimmer");
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &q), 0);
        /*
         * 4,200 granules, and 131 ahead would bring the 8,400 MiB in use and a 32nd more: 127, a
         * packet's worth, come with the last of the block's requests, which asks for its last
         * granule only (the one before asks for 103).
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4200 * 2 * MiB, &p), 0);
        mark_granules(p, 4200);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.mapped_segments, 1 + 4200 + 127);
        /* All but the small block's granule go back, in 17 requests or more: two round trips. */
        before = st;
        ck_assert_int_eq(gpupool_trim(c), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips - before.round_trips, 2);
        ck_assert_uint_eq(st.mapped_segments, 1);
        ck_assert_int_eq(testd_client_field(&d, 0, "trimmer", "reserved_bytes"), 2 * MiB);
        ck_assert_int_eq(testd_client_field(&d, 0, "trimmer", "held_free_bytes"), 0);    /* the granule the small block touches */
        json_decref(testd_ctl(&d, "check"));
        /* And the daemon has them: they serve again. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4200 * 2 * MiB, &p), 0);
        mark_granules(p, 4200);
        ck_assert(granules_marked(p, 4200));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /*
         * 4,097 granules leave one for the last of 33 requests, and 128 ahead would bring them
         * to their bytes and a 32nd more: that one granule carries the 127 a packet takes.
         */
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4097 * 2 * MiB, &p), 0);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1 + 4097 + 127);
        mark_granules(p, 4097);
        ck_assert(granules_marked(p, 4097));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_grow_limit) {
        gpupool_client *c;
        struct testd d;
        char msg[512];
        void *p, *q;

        testd_start(&d, "--client-limit", "64M", NULL);
        c = connect_growing(&d, "limited");
        /* 20 granules, and one ahead (40 MiB and a 32nd more take 21). */
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /* Those 21 serve the next block where they are; 4 more are leased, and one ahead. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 50 * MiB, &p), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "limited", "reserved_bytes"), 52 * MiB);
        /* Over the limit: refused, saying so, with nothing more leased. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 20 * MiB, &q), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "over its limit of 64.0 MiB"), "%s", msg);
        ck_assert_int_eq(testd_client_field(&d, 0, "limited", "reserved_bytes"), 52 * MiB);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 26);
        /* Larger than the device and its range: the daemon's verdict all the same, the limit first. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 2ULL << 30, &q), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "over its limit of 64.0 MiB"), "%s", msg);
        ck_assert_int_eq(testd_client_field(&d, 0, "limited", "reserved_bytes"), 52 * MiB);
        /* 14 MiB fits under it (the spare and 6 more); none ahead fits the limit. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 14 * MiB, &q), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "limited", "reserved_bytes"), 64 * MiB);
        page_fill(q, 14 * MiB, 6);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_grow_idle_granules_go_back) {
        gpupool_client *c;
        struct testd d;
        void *p, *q;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "300ms", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "idle", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &q), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "idle", "reserved_bytes"), 6 * MiB);
        /* The control thread looks once a second: within a few, the idle granules are the daemon's again. */
        ck_assert(testd_client_becomes(&d, 0, "idle", "reserved_bytes", 2 * MiB));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 4 * MiB);
        ck_assert_uint_eq(client_stats(c).mapped_segments, 1);         /* the small block's granule stays */
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "idle", "reserved_bytes"), 6 * MiB);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * A block lands where its granules are still mapped rather than at the best fit whose granules
 * went back: of two holes, 4 MiB whose granules were given back (idle past GPUPOOL_IDLE_RETURN)
 * and 6 MiB still mapped, a block of 4 MiB takes the second, and maps, leases and moves nothing.
 */
START_TEST(test_grow_lands_where_mapped) {
        struct gpupool_grow_stats gs;
        struct gpupool_stats st;
        char *p6, *q1, *p4, *q2, *x;
        gpupool_client *c;
        struct testd d;
        uint64_t held;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "300ms", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "lander", &c), 0);
        /* Side by side from the range's start, each on granules of its own: 6, 2, 4 and 2 MiB. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, (void **) &p6), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, (void **) &q1), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, (void **) &p4), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, (void **) &q2), 0);
        ck_assert_ptr_eq(q1, p6 + 6 * MiB);
        ck_assert_ptr_eq(p4, q1 + 2 * MiB);
        ck_assert_ptr_eq(q2, p4 + 4 * MiB);
        gs = grow_stats(c);
        held = gs.granules_held - gs.granules_free;     /* the blocks' 7, without the spares leased ahead */
        ck_assert_uint_eq(held, 7);
        /* The 4 MiB block freed, and its granules and the spares given back once idle long enough. */
        ck_assert_int_eq(gpupool_free(c, p4), 0);
        ck_assert(testd_client_becomes(&d, 0, "lander", "reserved_bytes", (long long) (held - 2) * (long long) (2 * MiB)));
        /* The 6 MiB block freed just now: its granules stay mapped, idle. */
        ck_assert_int_eq(gpupool_free(c, p6), 0);
        gs = grow_stats(c);
        st = client_stats(c);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, (void **) &x), 0);
        ck_assert_ptr_eq(x, p6);
        ck_assert_uint_eq(grow_stats(c).granules_mapped, gs.granules_mapped);
        ck_assert_uint_eq(grow_stats(c).granules_unmapped, gs.granules_unmapped);
        ck_assert_uint_eq(client_stats(c).round_trips, st.round_trips);
        page_fill(x, 4 * MiB, 5);
        ck_assert(page_intact(x, 4 * MiB, 5));
        ck_assert_int_eq(gpupool_free(c, x), 0);
        ck_assert_int_eq(gpupool_free(c, q1), 0);
        ck_assert_int_eq(gpupool_free(c, q2), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A granule leased ahead is free from when it came: the idle time counts from then, not from the next tick. */
START_TEST(test_grow_ahead_waits_its_idle_time) {
        gpupool_client *c;
        struct testd d;
        void *big, *small;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "3s", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "ahead", &c), 0);
        /*
         * 128 granules, and 4 ahead (256 MiB and a 32nd more take 132): the 128 fill a lease,
         * so the last of them goes in a second one, sent with it, that asks for the 4.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 256 * MiB, &big), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "ahead", "reserved_bytes"), 264 * MiB);
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &small), 0);    /* one of those: no lease */
        ck_assert_int_eq(testd_client_field(&d, 0, "ahead", "reserved_bytes"), 264 * MiB);
        /* A tick has passed once the report says the other three free; they are still held then. */
        ck_assert(testd_client_becomes(&d, 0, "ahead", "held_free_bytes", 6 * MiB));
        ck_assert_int_eq(testd_client_field(&d, 0, "ahead", "reserved_bytes"), 264 * MiB);
        /* Three seconds on, they go back. */
        ck_assert(testd_client_becomes(&d, 0, "ahead", "reserved_bytes", 258 * MiB));
        ck_assert_int_eq(testd_client_field(&d, 0, "ahead", "held_free_bytes"), 0);
        ck_assert_int_eq(gpupool_free(c, small), 0);
        ck_assert_int_eq(gpupool_free(c, big), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A process that grows to 700 MiB in blocks of 1 MiB, frees it all, and idles until told. */
static int idler_main(struct testd *d, void *arg) {
        int *pipes = arg;
        void *p[700];
        gpupool_client *c;
        char ch = 'y';
        int n;

        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        if (gpupool_connect(d->sock, "idler", &c) < 0)
                return 1;
        for (n = 0; n < 700 && ch == 'y'; n++)
                if (gpupool_alloc(c, 0, MiB, &p[n]) < 0)
                        ch = 'n', n--;
        for (int i = 0; i < n; i++)     /* only what it got: the rest of p was never written */
                if (gpupool_free(c, p[i]) < 0)
                        ch = 'n';
        if (write(pipes[1], &ch, 1) != 1 || read(pipes[2], &ch, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        return 0;
}

/* Holds an idle piece of 300 MiB ($GPUPOOL_GROW_PIECE 64M) and a block of 1 MiB, until told to go. */
static int piece_idler_main(struct testd *d, void *arg) {
        int *pipes = arg;
        void *piece, *small;
        gpupool_client *c;
        char ch = 'y';

        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_GROW_PIECE", "64M", 1);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        if (gpupool_connect(d->sock, "idler", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, MiB, &small) < 0 || gpupool_alloc(c, 0, 300 * MiB, &piece) < 0 || gpupool_free(c, piece) < 0)
                ch = 'n';
        if (write(pipes[1], &ch, 1) != 1 || read(pipes[2], &ch, 1) != 1)
                return 2;
        /* What it kept serves still: the small block's granule. */
        ((volatile char *) small)[MiB - 1] = 1;
        if (gpupool_free(c, small) < 0)
                return 3;
        gpupool_disconnect(c);
        return 0;
}

/* A process holding memory (idler_main, piece_idler_main) until told to go: its pipes and pid. */
struct idler {
        int ready[2], go[2], pipes[3];
        pid_t pid;
};

/* Starts fn on d and waits until it says it holds what it should ('y'). */
static void idler_start(struct testd *d, int (*fn)(struct testd *, void *), struct idler *w) {
        char ch;

        ck_assert_int_eq(pipe(w->ready), 0);
        ck_assert_int_eq(pipe(w->go), 0);
        w->pipes[0] = w->ready[0], w->pipes[1] = w->ready[1], w->pipes[2] = w->go[0];
        w->pid = spawn(fn, d, w->pipes);
        ck_assert_int_eq(read(w->ready[0], &ch, 1), 1);
        ck_assert_int_eq(ch, 'y');
}

/* Tells it to go, and checks that it ended well. */
static void idler_stop(struct idler *w) {
        ck_assert_int_eq(write(w->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(w->pid), 0);
        close(w->ready[0]), close(w->ready[1]), close(w->go[0]), close(w->go[1]);
}

/* Another process's lease takes an idle piece back first, in the answer to the daemon's reclaim. */
START_TEST(test_grow_piece_reclaim) {
        struct idler w;
        gpupool_client *b;
        struct testd d;
        void *p;

        testd_start(&d, "--host-capacity", "1G", NULL);
        idler_start(&d, piece_idler_main, &w);
        ck_assert_int_ge(testd_client_field(&d, 0, "idler", "reserved_bytes"), 302 * MiB);
        ck_assert(testd_client_becomes(&d, 0, "idler", "held_free_bytes",
                                       testd_client_field(&d, 0, "idler", "reserved_bytes") - 2 * MiB));
        /* 800 MiB fits only with the idler's piece back. */
        b = connect_segments(d.sock, "needy", "whole");
        ck_assert_int_eq(gpupool_alloc(b, 0, 800 * MiB, &p), 0);
        ck_assert_int_lt(testd_client_field(&d, 0, "idler", "reserved_bytes"), 300 * MiB);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(gpupool_free(b, p), 0);
        idler_stop(&w);
        gpupool_disconnect(b);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_grow_reclaim) {
        struct idler w;
        long long held;
        gpupool_client *b;
        struct testd d;
        void *p;

        testd_start(&d, "--host-capacity", "1G", NULL);
        idler_start(&d, idler_main, &w);
        /*
         * 350 granules, and ahead at each lease what brings those held to a 32nd more than in
         * use, or at least a 192nd of them: at most 22 and 4 granules more.
         */
        held = testd_client_field(&d, 0, "idler", "reserved_bytes");
        ck_assert_int_ge(held, 700 * MiB);
        ck_assert_int_le(held, 700 * MiB + 26 * 2 * MiB);
        ck_assert(testd_client_becomes(&d, 0, "idler", "held_free_bytes", held));
        /* 700 MiB fits only with what the idler holds free: it gives back granules, more than one answer's 256. */
        b = connect_growing(&d, "needy");
        ck_assert_int_eq(gpupool_alloc(b, 0, 700 * MiB, &p), 0);
        page_fill(p, 700 * MiB, 7);
        ck_assert(page_intact(p, 700 * MiB, 7));
        ck_assert_int_le(testd_client_field(&d, 0, "idler", "reserved_bytes"), 1024 * MiB - 700 * MiB);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(gpupool_free(b, p), 0);
        idler_stop(&w);
        gpupool_disconnect(b);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A thread that grows and shrinks the ranges with blocks of many sizes, checking its data throughout. */
struct churner {
        gpupool_client *c;
        unsigned seed;
        int failures;
};

static void *churn_main(void *arg) {
        struct churner *t = arg;
        void *p[16] = { 0 };
        size_t size[16] = { 0 };
        unsigned seed = t->seed;

        for (int i = 0; i < 400; i++) {
                unsigned k = (unsigned) rand_r(&seed) % 16;

                if (p[k]) {
                        if (!page_intact(p[k], size[k], t->seed + k) || gpupool_free(t->c, p[k]) < 0)
                                t->failures++;
                        p[k] = NULL;
                        continue;
                }
                /* From 512 bytes to 8 MiB, both classes. */
                size[k] = (size_t) 512 << ((unsigned) rand_r(&seed) % 15);
                size[k] += (size_t) rand_r(&seed) % 4096;
                if (gpupool_alloc(t->c, 0, size[k], &p[k]) < 0) {
                        t->failures++;
                        p[k] = NULL;
                        continue;
                }
                page_fill(p[k], size[k], t->seed + k);
        }
        for (int k = 0; k < 16; k++)
                if (p[k] && (!page_intact(p[k], size[k], t->seed + k) || gpupool_free(t->c, p[k]) < 0))
                        t->failures++;
        return NULL;
}

START_TEST(test_grow_threads) {
        struct churner t[4];
        pthread_t thread[4];
        gpupool_client *c;
        struct testd d;

        testd_start(&d, "--host-capacity", "2G", NULL);
        c = connect_growing(&d, "threads");
        for (int i = 0; i < 4; i++) {
                t[i] = (struct churner) { .c = c, .seed = 17 * (unsigned) i + 3 };
                ck_assert_int_eq(pthread_create(&thread[i], NULL, churn_main, &t[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
                ck_assert_int_eq(pthread_join(thread[i], NULL), 0);
                ck_assert_int_eq(t[i].failures, 0);
        }
        ck_assert_uint_eq(client_stats(c).live_blocks, 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_uint_eq(client_stats(c).mapped_bytes, 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "threads", "reserved_bytes"), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * The descriptor table grows once, at connect, with room for a kept descriptor per granule of
 * the device: not by doubling as granules arrive, each doubling an RCU wait once the process
 * has threads (the handle's control thread is one).
 */
START_TEST(test_grow_descriptor_table_grown_at_connect) {
        const long want = 1024 + 2048;  /* the floor of kept descriptors, and 4 GiB in 2 MiB */
        long before, at_connect;
        struct rlimit rl;
        gpupool_client *c;
        struct testd d;
        void *p;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
        if (under_tool() || (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 8192))
                return;         /* valgrind keeps a table of its own; a hard limit that leaves no room to keep 2048 */
        testd_start(&d, "--host-capacity", "4G", NULL);
        before = fd_table_size(getpid());
        ck_assert_msg(before > 0 && before < want, "the test's process has a table of %ld already", before);
        c = connect_growing(&d, "table");
        at_connect = fd_table_size(getpid());
        ck_assert_msg(at_connect >= want, "a table of %ld after connecting, %ld before", at_connect, before);
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * 1024 * MiB, &p), 0);
        ck_assert_uint_ge(client_stats(c).mapped_bytes, 3 * 1024 * MiB);
        ck_assert_int_eq(fd_table_size(getpid()), at_connect);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * A forked child holds none of the descriptors the process keeps for adoption, in either mode
 * (nor its mappings, MADV_DONTFORK): it would keep the memory alive after the parent gave it
 * back. The parent keeps its own and goes on.
 */
START_TEST(test_forked_child_keeps_no_descriptor) {
        static const char *modes[] = { "grow", "whole" };
        gpupool_client *c;
        struct testd d;
        void *p, *q;
        int kept;

        if (under_valgrind()) {
                TEST_SKIP("valgrind keeps descriptors of its own at the top of the table");
                return;
        }

        testd_start(&d, NULL);
        for (int m = 0; m < 2; m++) {
                c = connect_segments(d.sock, modes[m], modes[m]);
                ck_assert_int_eq(gpupool_alloc(c, 0, 8 * MiB, &p), 0);
                ck_assert_int_eq(gpupool_alloc(c, 0, 100000, &q), 0);
                kept = fds_from(1024);
                ck_assert_msg(kept >= 2, "%s: %d descriptors kept", modes[m], kept);
                ck_assert_int_eq(fds_from_in_child(1024), 0);
                ck_assert_int_eq(fds_from(1024), kept);
                page_fill(p, 8 * MiB, 7);
                ck_assert(page_intact(p, 8 * MiB, 7));
                ck_assert_int_eq(gpupool_free(c, p), 0);
                ck_assert_int_eq(gpupool_free(c, q), 0);
                gpupool_disconnect(c);
                ck_assert_int_eq(fds_from(1024), 0);
        }
        unsetenv("GPUPOOL_SEGMENTS");
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_grow_bad_setting) {
        gpupool_client *c;
        struct testd d;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SEGMENTS", "sideways", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad", &c), -EINVAL);
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        for (int i = 0; i < 3; i++) {
                static const char *const bad[] = { "big", "63M", "4Q" };
                char msg[256];

                setenv("GPUPOOL_GROW_PIECE", bad[i], 1);
                ck_assert_int_eq(gpupool_connect(d.sock, "bad", &c), -EINVAL);
                gpupool_last_error(NULL, msg, sizeof(msg));
                ck_assert_msg(strstr(msg, "$GPUPOOL_GROW_PIECE") && strstr(msg, "neither a size of 64M or more nor off"), "%s", msg);
        }
        setenv("GPUPOOL_GROW_PIECE", "off", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "off", &c), 0);
        gpupool_disconnect(c);
        setenv("GPUPOOL_GROW_PIECE", "64M", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "least", &c), 0);
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_GROW_PIECE");
        setenv("GPUPOOL_SEGMENTS", "whole", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "whole", &c), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Writes a byte at each end of block p of size bytes (a piece is gigabytes: its pages are touched only there). */
static void ends_fill(char *p, uint64_t size, char v) {
        p[0] = v;
        p[size - 1] = v;
}

/*
 * A block of GROW_PIECE_BYTES (4 GiB) or more is a piece: one segment leased for it alone,
 * one import and one map, outside the ranges, where granules would be 2,048 leases' worth.
 * An idle piece serves a later block it fits within a 24th, with no request; one that does not
 * fit goes back before a new one is leased, where holding both would pass the budget over the
 * peak in use; trim, the limit and the daemon's view count it.
 */
START_TEST(test_grow_pieces) {
        const uint64_t GiB = 1ULL << 30, P = 4 * GiB + 100 * MiB;
        struct gpupool_stats st, before;
        uint64_t total, free_bytes;
        gpupool_client *c;
        struct testd d;
        char *a, *p, *q, msg[512];

        /* 10 GiB: its ranges reserve 50 GiB (valgrind refused the 80 of 16G); a cache that keeps what goes back. */
        testd_start(&d, "--host-capacity", "10G", "--max-cached", "100%", NULL);
        c = connect_growing(&d, "pieces");
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, (void **) &a), 0);
        before = client_stats(c);
        ck_assert_int_eq(gpupool_alloc(c, 0, P, (void **) &p), 0);
        st = client_stats(c);
        ck_assert_uint_eq(st.round_trips, before.round_trips + 1);
        ck_assert_uint_eq(st.segments_imported, before.segments_imported + 1);
        ck_assert_uint_eq(st.mapped_segments, before.mapped_segments + 1);
        ck_assert_uint_eq(st.mapped_bytes, before.mapped_bytes + P);
        ck_assert_uint_eq(grow_stats(c).granules_held, before.mapped_segments);     /* no granule for it */
        ck_assert(p < a || p >= a + 16 * GiB);  /* not in a's range */
        ends_fill(p, P, 7);
        ck_assert_int_eq(testd_client_field(&d, 0, "pieces", "reserved_bytes"), (int64_t) (before.mapped_bytes + P));
        /* What the process may still use counts the piece as used. */
        ck_assert_int_eq(gpupool_device_memory(c, 0, &free_bytes, &total), 0);
        ck_assert_uint_eq(total, 10 * GiB);
        ck_assert_uint_le(free_bytes, total - P - 6 * MiB);
        st = client_stats(c);   /* that asked the daemon */

        /* Freed, it stays for the next, counted free here and by the daemon. */
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_uint_eq(gpupool_cached_bytes(c), before.mapped_bytes - 6 * MiB + P);
        ck_assert(testd_client_becomes(&d, 0, "pieces", "held_free_bytes",
                                       (int64_t) (before.mapped_bytes - 6 * MiB + P)));
        /* 4 GiB fits it within a 24th: the same piece, no request. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * GiB, (void **) &q), 0);
        ck_assert_ptr_eq(q, p);
        ck_assert(q[0] == 7 && q[P - 1] == 7);
        ck_assert_uint_eq(client_stats(c).round_trips, st.round_trips);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        /*
         * 5 GiB does not fit it: a new piece, and the idle one goes back first, since holding
         * both would pass the budget over the peak in use (a return and a lease).
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 5 * GiB, (void **) &p), 0);
        ck_assert_uint_eq(client_stats(c).round_trips, st.round_trips + 2);
        ck_assert_uint_eq(client_stats(c).mapped_bytes, before.mapped_bytes + 5 * GiB);
        ck_assert_int_eq(testd_client_field(&d, 0, "pieces", "reserved_bytes"), (int64_t) (before.mapped_bytes + 5 * GiB));
        ends_fill(p, 5 * GiB, 8);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /* Granules a block must have that would pass the budget with an idle piece: the piece goes back first. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * GiB, (void **) &q), 0);
        ck_assert_uint_eq(client_stats(c).mapped_bytes, grow_stats(c).granules_held * 2 * MiB);
        ck_assert_int_eq(testd_client_field(&d, 0, "pieces", "reserved_bytes"),
                         (int64_t) (grow_stats(c).granules_held * 2 * MiB));
        ck_assert_int_eq(gpupool_free(c, q), 0);
        /*
         * 4 GiB is leased exact: not a piece the daemon's cache holds (4.1 or 5 GiB, within the
         * quarter more the cache serves otherwise), which would hold past the budget, but 4 GiB.
         */
        ck_assert_int_ge(testd_device(&d, 0, "cached_bytes"), (int64_t) P);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * GiB, (void **) &p), 0);
        ck_assert_uint_eq(client_stats(c).mapped_bytes - grow_stats(c).granules_held * 2 * MiB, 4 * GiB);
        ck_assert_int_eq(gpupool_free(c, p), 0);

        /* Larger than the device: the daemon's refusal, nothing left leased for it. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 20 * GiB, (void **) &p), -ENOMEM);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "can never fit 21474836480 bytes"), "%s", msg);
        json_decref(testd_ctl(&d, "check"));
        /* A piece live stays through a trim; freed, it goes back with the granules. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * GiB, (void **) &p), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "pieces", "reserved_bytes"), (int64_t) (4 * GiB + 6 * MiB));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, a), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_uint_eq(client_stats(c).mapped_bytes, 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "pieces", "reserved_bytes"), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_grow(void) {
        Suite *s = suite_create("grow");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_grow_in_place);
        tcase_add_test(tc, test_grow_steady_state_moves_nothing);
        tcase_add_test(tc, test_grow_wanted_beyond_limit);
        tcase_add_test(tc, test_grow_wanted_without_daemon);
        tcase_add_test(tc, test_grow_block_of_many_leases);
        tcase_add_test(tc, test_grow_leases_sent_together);
        tcase_add_test(tc, test_grow_trim_together);
        tcase_add_test(tc, test_grow_limit);
        tcase_add_test(tc, test_grow_idle_granules_go_back);
        tcase_add_test(tc, test_grow_ahead_waits_its_idle_time);
        tcase_add_test(tc, test_grow_lands_where_mapped);
        tcase_add_test(tc, test_grow_reclaim);
        tcase_add_test(tc, test_grow_threads);
        tcase_add_test(tc, test_grow_descriptor_table_grown_at_connect);
        tcase_add_test(tc, test_forked_child_keeps_no_descriptor);
        tcase_add_test(tc, test_grow_bad_setting);
        tcase_add_test(tc, test_grow_pieces);
        tcase_add_test(tc, test_grow_piece_reclaim);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
