/*
 * check_scopes.c: the client library's own layers, end to end on the host backend: the client
 * cache (freed blocks reused without a round trip, bounded, given back; its per-thread
 * magazines under threads that race, exit and reconnect), scopes (every block
 * of a scope freed at its end, in batches) and arenas (bump allocation in one block).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
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
        struct gpupool_stats st;
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
        /* Only the block from outside the scope is left; trimmed, every emptied segment goes back. */
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 1);
        ck_assert_uint_eq(st.live_bytes, 4096);
        ck_assert_int_eq(gpupool_trim(c), 0);
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
        /* Kept segments serve blocks the daemon carves ($GPUPOOL_LEASE=0), until that path goes. */
        setenv("GPUPOOL_LEASE", "0", 1);
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
        struct gpupool_stats st;
        gpupool_client *c;
        gpupool_arena *a;
        struct testd d;
        char msg[300];
        void *p, *q, *first;
        int n = 0;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "pipeline", &c), 0);
        ck_assert_int_eq(gpupool_arena_create(c, 0, 1 * MiB, &a), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_bytes, 1 * MiB);                              /* one block of the pool */
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
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_bytes, 1 * MiB);
        /* Reset: it starts over from the beginning. */
        gpupool_arena_reset(a);
        ck_assert_int_eq(gpupool_arena_used(a), 0);
        ck_assert_int_eq(gpupool_arena_alloc(a, 10, 1, &p), 0);
        ck_assert_ptr_eq(p, first);
        ck_assert_int_eq(gpupool_arena_destroy(a), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_bytes, 0);
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
        /* The client cache sits in front of blocks the daemon carves ($GPUPOOL_LEASE=0), until that path goes. */
        setenv("GPUPOOL_LEASE", "0", 1);
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
        /* The client cache sits in front of blocks the daemon carves ($GPUPOOL_LEASE=0), until that path goes. */
        setenv("GPUPOOL_LEASE", "0", 1);
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

/* Threads of one handle allocating, writing, checking and freeing, some blocks freed by another thread. */
struct racer_shared {
        gpupool_client *c;
        pthread_mutex_t lock;
        void *handoff[16];              /* blocks one thread allocated for another to free */
        uint64_t limit;
        bool stop;
        int failures;
};

struct racer {
        struct racer_shared *sh;
        unsigned id;
};

static void racer_failed(struct racer_shared *sh) {
        __atomic_add_fetch(&sh->failures, 1, __ATOMIC_RELAXED);
}

/* Marks a block as ours (its first and last 8 bytes), and checks the mark before freeing it. */
static void mark(void *p, size_t size, uint64_t tag) {
        memcpy(p, &tag, 8);
        memcpy((char *) p + size - 8, &tag, 8);
}

static bool marked(const void *p, size_t size, uint64_t tag) {
        uint64_t a, b;

        memcpy(&a, p, 8);
        memcpy(&b, (const char *) p + size - 8, 8);
        return a == tag && b == tag;
}

static void *racer_main(void *arg) {
        static const size_t sizes[] = { 512, 4096, 65536, 1000 };
        struct racer *r = arg;
        struct racer_shared *sh = r->sh;
        void *live[8] = { 0 };
        size_t live_size[8] = { 0 };
        unsigned seed = r->id;

        for (unsigned i = 0; i < 3000; i++) {
                unsigned k = (unsigned) rand_r(&seed) % 8;
                size_t size = sizes[(unsigned) rand_r(&seed) % 4];
                uint64_t tag;

                if (live[k]) {
                        tag = (uint64_t) (uintptr_t) live[k] ^ r->id;
                        if (!marked(live[k], live_size[k], tag) || gpupool_free(sh->c, live[k]) < 0)
                                racer_failed(sh);
                        live[k] = NULL;
                }
                if (gpupool_alloc(sh->c, 0, size, &live[k]) < 0) {
                        racer_failed(sh);
                        continue;
                }
                live_size[k] = size;
                mark(live[k], size, (uint64_t) (uintptr_t) live[k] ^ r->id);
                if (gpupool_cached_bytes(sh->c) > sh->limit)
                        racer_failed(sh);
                if (i % 7 == 0) {
                        /* Hand a block over: another thread frees it, into its own magazine. */
                        unsigned h = (unsigned) rand_r(&seed) % 16;
                        void *theirs;

                        pthread_mutex_lock(&sh->lock);
                        theirs = sh->handoff[h];
                        sh->handoff[h] = live[k];
                        pthread_mutex_unlock(&sh->lock);
                        live[k] = NULL;
                        if (theirs && gpupool_free(sh->c, theirs) < 0)
                                racer_failed(sh);
                }
        }
        for (unsigned k = 0; k < 8; k++)
                if (live[k] && gpupool_free(sh->c, live[k]) < 0)
                        racer_failed(sh);
        return NULL;
}

static void *trimmer_main(void *arg) {
        struct racer_shared *sh = arg;

        while (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED)) {
                if (gpupool_trim(sh->c) < 0)
                        racer_failed(sh);
                usleep(2000);
        }
        return NULL;
}

static void *free_and_exit(void *arg) {
        gpupool_client *c = arg;
        void *p[10];

        for (int i = 0; i < 10; i++)
                if (gpupool_alloc(c, 0, 8192, &p[i]) < 0)
                        return (void *) 1;
        for (int i = 0; i < 10; i++)
                if (gpupool_free(c, p[i]) < 0)
                        return (void *) 2;
        return NULL;
}

START_TEST(test_thread_cache) {
        struct racer_shared sh = { .limit = 2 * MiB };
        struct racer r[4];
        pthread_t t[4], trimmer;
        void *p, *q, *ret;
        struct testd d;

        testd_start(&d, NULL);
        /* The client cache sits in front of blocks the daemon carves ($GPUPOOL_LEASE=0), until that path goes. */
        setenv("GPUPOOL_LEASE", "0", 1);
        setenv("GPUPOOL_CLIENT_CACHE", "2M", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "threads", &sh.c), 0);
        pthread_mutex_init(&sh.lock, NULL);
        /* Four threads racing (and a fifth trimming): no block is handed out twice, the bound holds. */
        ck_assert_int_eq(pthread_create(&trimmer, NULL, trimmer_main, &sh), 0);
        for (unsigned i = 0; i < 4; i++) {
                r[i] = (struct racer) { .sh = &sh, .id = i + 1 };
                ck_assert_int_eq(pthread_create(&t[i], NULL, racer_main, &r[i]), 0);
        }
        for (unsigned i = 0; i < 4; i++)
                ck_assert_int_eq(pthread_join(t[i], NULL), 0);
        __atomic_store_n(&sh.stop, true, __ATOMIC_RELAXED);
        ck_assert_int_eq(pthread_join(trimmer, NULL), 0);
        ck_assert_int_eq(sh.failures, 0);
        for (unsigned h = 0; h < 16; h++)
                if (sh.handoff[h])
                        ck_assert_int_eq(gpupool_free(sh.c, sh.handoff[h]), 0);
        ck_assert_int_le(gpupool_cached_bytes(sh.c), sh.limit);
        ck_assert_int_eq(gpupool_trim(sh.c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);

        /* A thread that exits with blocks in its magazine: they stay cached, and trim gives them back. */
        ck_assert_int_eq(pthread_create(&t[0], NULL, free_and_exit, sh.c), 0);
        ck_assert_int_eq(pthread_join(t[0], &ret), 0);
        ck_assert_ptr_null(ret);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 10 * 8192);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 10 * 8192);
        ck_assert_int_eq(gpupool_trim(sh.c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);

        /* This thread's magazine: the same block back; a double free is caught on the fast path too. */
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(sh.c, p), 0);
        ck_assert_int_eq(gpupool_free(sh.c, p), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4000, &q), 0);
        ck_assert_ptr_eq(q, p);
        /* Inside a scope the allocation takes the locked path and belongs to the scope. */
        ck_assert_int_eq(gpupool_free(sh.c, q), 0);
        ck_assert_int_eq(gpupool_scope_begin(sh.c), 0);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &q), 0);
        ck_assert_int_eq(gpupool_scope_end(sh.c), 0);
        ck_assert_int_eq(gpupool_free(sh.c, q), -ENOENT);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 4096);             /* the magazine's block, still there */

        /* A restarted daemon: what the magazine held is forgotten with the old session. */
        testd_crash_and_restart(&d);
        ck_assert_int_eq(gpupool_reconnect(sh.c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 0);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &q), 0);
        mark(q, 4096, 42);
        ck_assert_int_eq(gpupool_free(sh.c, q), 0);
        gpupool_disconnect(sh.c);
        pthread_mutex_destroy(&sh.lock);

        /* Off, and a value that is neither 0 nor 1. */
        setenv("GPUPOOL_THREAD_CACHE", "0", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "shared-only", &sh.c), 0);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(sh.c, p), 0);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &q), 0);
        ck_assert_ptr_eq(q, p);                                         /* from the shared cache */
        ck_assert_int_eq(gpupool_free(sh.c, q), 0);
        gpupool_disconnect(sh.c);
        setenv("GPUPOOL_THREAD_CACHE", "yes", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad", &sh.c), -EINVAL);
        unsetenv("GPUPOOL_THREAD_CACHE");
        setenv("GPUPOOL_CLIENT_CACHE", "0", 1);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
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
        tcase_add_test(tc, test_thread_cache);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
