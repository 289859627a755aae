/*
 * check_scopes.c: the client library's own layers, end to end on the host backend: the client
 * cache (freed blocks reused without a round trip, bounded, given back), scopes (every block
 * of a scope freed at its end, in batches) and arenas (bump allocation in one block).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

START_TEST(test_scope_frees_what_is_left) {
        enum { N = 300 };
        static void *p[N];
        gpupool_client *c;
        struct testd d;
        void *kept, *inner;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "scoped", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &kept), 0);        /* outside any scope */
        ck_assert_int_eq(gpupool_scope_begin(c), 0);
        for (int i = 0; i < N; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, i % 10 == 0 ? 3 * MiB : 1000 + (size_t) i * 100, &p[i]), 0);
        for (int i = 0; i < N; i += 7)
                ck_assert_int_eq(gpupool_free(c, p[i]), 0);             /* some freed by hand */
        /* A nested scope ends first and takes only its own. */
        ck_assert_int_eq(gpupool_scope_begin(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 8192, &inner), 0);
        ck_assert_int_eq(gpupool_scope_end(c), 0);
        ck_assert_int_eq(gpupool_free(c, inner), -ENOENT);
        ck_assert_int_eq(gpupool_free(c, p[1]), 0);                     /* the outer scope's are alive */
        ck_assert_int_eq(gpupool_scope_end(c), 0);                      /* 3 batches of at most 128 */
        for (int i = 2; i < N; i++)
                if (i % 7)
                        ck_assert_int_eq(gpupool_free(c, p[i]), -ENOENT);
        /* Only the block from outside the scope is left; emptied segments went back. */
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 4096);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        memset(kept, 1, 4096);
        ck_assert_int_eq(gpupool_scope_end(c), -EINVAL);                /* no scope open */
        for (int i = 0; i < 16; i++)
                ck_assert_int_eq(gpupool_scope_begin(c), 0);
        ck_assert_int_eq(gpupool_scope_begin(c), -EINVAL);              /* 16 deep at most */
        for (int i = 0; i < 16; i++)
                ck_assert_int_eq(gpupool_scope_end(c), 0);
        ck_assert_int_eq(gpupool_free(c, kept), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_scope_with_kept_segments) {
        gpupool_client *c;
        struct testd d;
        void *p[20];

        testd_start(&d, NULL);
        setenv("GPUPOOL_KEEP_FREE", "64M", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "keeping", &c), 0);
        unsetenv("GPUPOOL_KEEP_FREE");
        ck_assert_int_eq(gpupool_scope_begin(c), 0);
        for (int i = 0; i < 20; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, &p[i]), 0);
        ck_assert_int_eq(gpupool_scope_end(c), 0);
        /* 40 MiB kept by the client (under its 64 MiB), nothing in use, nothing cached. */
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 40 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        /* The kept segments serve the next scope without new ones. */
        ck_assert_int_eq(gpupool_scope_begin(c), 0);
        for (int i = 0; i < 20; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, &p[i]), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 40 * MiB);
        ck_assert_int_eq(gpupool_scope_end(c), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), testd_device(&d, 0, "cached_bytes"));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_arena) {
        gpupool_client *c;
        gpupool_arena *a;
        struct testd d;
        char msg[300];
        void *p, *q, *first;
        int n = 0;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "pipeline", &c), 0);
        ck_assert_int_eq(gpupool_arena_create(c, 0, 1 * MiB, &a), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 1 * MiB);            /* one block from the daemon */
        ck_assert_int_eq(gpupool_arena_alloc(a, 10, 1, &first), 0);
        ck_assert_int_eq(gpupool_arena_alloc(a, 100, 0, &p), 0);
        ck_assert_int_eq((uintptr_t) p % 256, 0);                       /* default alignment */
        ck_assert_int_eq(gpupool_arena_alloc(a, 100, 4096, &q), 0);
        ck_assert_int_eq((uintptr_t) q % 4096, 0);
        ck_assert((uintptr_t) q > (uintptr_t) p);
        memset(q, 7, 100);
        ck_assert_int_eq(gpupool_arena_alloc(a, 100, 3, &p), -EINVAL);  /* not a power of two */
        ck_assert_int_eq(gpupool_arena_alloc(a, 0, 0, &p), -EINVAL);
        /* Fill it: the overflow is reported, never grown into. */
        while (gpupool_arena_alloc(a, 64 * 1024, 0, &p) == 0)
                n++;
        ck_assert_int_ge(n, 14);
        ck_assert_int_eq(gpupool_arena_alloc(a, 64 * 1024, 0, &p), -ENOSPC);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "the arena of 1048576 bytes has"), "%s", msg);
        ck_assert_int_le(gpupool_arena_used(a), 1 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 1 * MiB);
        /* Reset: it starts over from the beginning. */
        gpupool_arena_reset(a);
        ck_assert_int_eq(gpupool_arena_used(a), 0);
        ck_assert_int_eq(gpupool_arena_alloc(a, 10, 1, &p), 0);
        ck_assert_ptr_eq(p, first);
        ck_assert_int_eq(gpupool_arena_destroy(a), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        ck_assert_int_eq(gpupool_arena_create(c, 0, 0, &a), -EINVAL);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

static long long client_cached(struct testd *d) {
        json_t *st = testd_ctl(d, "status"), *c = status_client_by_pid(st, getpid());
        long long v = c ? json_integer_value(json_object_get(c, "cached_in_client_bytes")) : -1;

        json_decref(st);
        return v;
}

START_TEST(test_client_cache) {
        gpupool_client *c;
        struct testd d;
        void *p, *q, *big, *r[8];

        testd_start(&d, "--client-limit", "32M", NULL);
        setenv("GPUPOOL_CLIENT_CACHE", "8M", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "cached", &c), 0);
        unsetenv("GPUPOOL_CLIENT_CACHE");
        ck_assert_int_eq(gpupool_alloc(c, 0, 100000, &p), 0);
        memset(p, 5, 100000);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /*
         * Freed into the process's cache: the daemon still counts it in use, and learns how much
         * the client caches with the client's next request (here, an allocation of another size).
         */
        ck_assert_int_eq(gpupool_cached_bytes(c), 100352);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 100352);
        ck_assert_int_eq(gpupool_alloc(c, 0, 512, &q), 0);
        ck_assert_int_eq(client_cached(&d), 100352);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        /* The same rounded size comes back from the cache: the same block, no round trip. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 100300, &q), 0);
        ck_assert_ptr_eq(q, p);
        ck_assert_int_eq(gpupool_cached_bytes(c), 512);                /* the 512-byte block stays cached */
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, q), -ENOENT);                 /* a double free is still caught */
        /* Bounded: over 8 MiB the least recently freed go back to the daemon. */
        for (int i = 0; i < 8; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, 1 * MiB + 4096 * (size_t) i, &r[i]), 0);
        for (int i = 0; i < 8; i++)
                ck_assert_int_eq(gpupool_free(c, r[i]), 0);
        ck_assert_int_le(gpupool_cached_bytes(c), 8 * MiB);
        /* Blocks larger than the whole cache are never cached. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 9 * MiB, &big), 0);
        ck_assert_int_eq(gpupool_free(c, big), 0);
        ck_assert_int_le(gpupool_cached_bytes(c), 8 * MiB);
        /* A limit that would refuse: the cache is given back first, and the allocation succeeds. */
        ck_assert_int_gt(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 28 * MiB, &big), 0);
        ck_assert_int_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(gpupool_free(c, big), 0);
        /* Trim gives everything back. */
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        gpupool_disconnect(c);
        /* Off: every free goes to the daemon at once. */
        setenv("GPUPOOL_CLIENT_CACHE", "0", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "uncached", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        gpupool_disconnect(c);
        setenv("GPUPOOL_CLIENT_CACHE", "lots", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad", &c), -EINVAL);
        setenv("GPUPOOL_CLIENT_CACHE", "0", 1);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A client that fills its cache and then makes no call until told to go. */
struct cacher {
        size_t block;
        int n;
        const char *idle;
        int ready[2], go[2];
};

static int cacher_main(struct testd *d, void *arg) {
        struct cacher *k = arg;
        gpupool_client *c;
        void *p[64];
        char ch;

        setenv("GPUPOOL_CLIENT_CACHE", "64M", 1);
        setenv("GPUPOOL_CLIENT_CACHE_IDLE", k->idle, 1);
        if (gpupool_connect(d->sock, "cacher", &c) < 0)
                return 1;
        for (int i = 0; i < k->n; i++)
                if (gpupool_alloc(c, 0, k->block, &p[i]) < 0)
                        return 2;
        for (int i = 0; i < k->n; i++)
                if (gpupool_free(c, p[i]) < 0)
                        return 3;
        if (write(k->ready[1], "r", 1) != 1 || read(k->go[0], &ch, 1) != 1)
                return 4;
        gpupool_disconnect(c);
        return 0;
}

static pid_t start_cacher(struct testd *d, struct cacher *k) {
        pid_t pid;
        char ch;

        ck_assert_int_eq(pipe(k->ready), 0);
        ck_assert_int_eq(pipe(k->go), 0);
        pid = spawn(cacher_main, d, k);
        ck_assert_int_eq(read(k->ready[0], &ch, 1), 1);
        return pid;
}

static void stop_cacher(struct cacher *k, pid_t pid) {
        ck_assert_int_eq(write(k->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(k->ready[0]), close(k->ready[1]), close(k->go[0]), close(k->go[1]);
}

START_TEST(test_client_cache_given_back) {
        struct cacher k = { .block = 4 * MiB, .n = 10, .idle = "0" };
        char cmd[512], out[512];
        gpupool_client *c;
        struct testd d;
        double t0;
        pid_t pid;
        void *p;

        testd_start(&d, "--host-capacity", "48M", NULL);
        /* On trim: the cache comes back without the client making a call. */
        pid = start_cacher(&d, &k);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 40 * MiB);           /* all of it in its cache */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s trim --pid %d 2>&1", build_dir(), d.sock, (int) pid);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "asked 1 client"), "%s", out);
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the trimmed cache did not come back");
        stop_cacher(&k, pid);

        /* On a full device: another client's allocation gets what the cache held. */
        pid = start_cacher(&d, &k);
        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &c), 0);
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(c, 0, 30 * MiB, &p), 0);
        ck_assert_msg(now_s() - t0 < 0.1 + 0.5, "the allocation waited %.3f s", now_s() - t0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        stop_cacher(&k, pid);

        /* When idle: back after its idle time, again with no call. */
        k.idle = "1s";
        pid = start_cacher(&d, &k);
        t0 = now_s();
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the idle cache did not come back");
        ck_assert_msg(now_s() - t0 > 0.5, "given back before it was idle for a second");
        stop_cacher(&k, pid);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_scopes(void) {
        Suite *s = suite_create("scopes");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_scope_frees_what_is_left);
        tcase_add_test(tc, test_scope_with_kept_segments);
        tcase_add_test(tc, test_arena);
        tcase_add_test(tc, test_client_cache);
        tcase_add_test(tc, test_client_cache_given_back);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
