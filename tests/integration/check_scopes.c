/*
 * check_scopes.c: the client library's own layers, end to end on the host backend: scopes
 * (every block of a scope freed at its end), arenas (bump allocation in one block), and the
 * process's pool under threads of one handle that race, free each other's blocks, trim, and
 * reconnect to a restarted daemon.
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
        ck_assert_int_eq(gpupool_scope_end(c), 0);
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

/* Threads of one handle allocating, writing, checking and freeing, some blocks freed by another thread. */
struct racer_shared {
        gpupool_client *c;
        pthread_mutex_t lock;
        void *handoff[16];              /* blocks one thread allocated for another to free */
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
                if (i % 7 == 0) {
                        /* Hand a block over: another thread frees it. */
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

START_TEST(test_threads_share_the_pool) {
        struct racer_shared sh = { 0 };
        struct gpupool_stats st;
        struct racer r[4];
        pthread_t t[4], trimmer;
        struct testd d;
        void *p, *q;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "threads", &sh.c), 0);
        pthread_mutex_init(&sh.lock, NULL);
        /* Four threads racing (and a fifth trimming): no block is handed out twice, nor changed under its holder. */
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
        ck_assert_int_eq(gpupool_stats(sh.c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 0);
        ck_assert_uint_eq(st.cached_bytes, st.mapped_bytes);           /* all of it free, in the process */
        ck_assert_int_eq(gpupool_trim(sh.c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), testd_device(&d, 0, "cached_bytes"));

        /* Freed, a block is there for the next allocation of its size; a double free is caught. */
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(sh.c, p), 0);
        ck_assert_int_eq(gpupool_free(sh.c, p), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4000, &q), 0);
        ck_assert_ptr_eq(q, p);
        ck_assert_int_eq(gpupool_free(sh.c, q), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 2 * MiB);         /* its segment, held free */

        /* A restarted daemon: what the pool held is forgotten with the old session. */
        testd_crash_and_restart(&d);
        ck_assert_int_eq(gpupool_reconnect(sh.c), 0);
        ck_assert_int_eq(gpupool_cached_bytes(sh.c), 0);
        ck_assert_int_eq(gpupool_alloc(sh.c, 0, 4096, &q), 0);
        mark(q, 4096, 42);
        ck_assert_int_eq(gpupool_free(sh.c, q), 0);
        gpupool_disconnect(sh.c);
        pthread_mutex_destroy(&sh.lock);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_scopes(void) {
        Suite *s = suite_create("scopes");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_scope_frees_what_is_left);
        tcase_add_test(tc, test_arena);
        tcase_add_test(tc, test_threads_share_the_pool);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
