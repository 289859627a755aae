/*
 * check_process_pool.c: the process's own pool (client/client_pool.c) end to
 * end on the host backend: a steady state that asks the daemon nothing, what the daemon is
 * told, segments given back when idle, under a limit, on trim and when another process needs
 * the memory (elasticity), each thread's cache of small blocks, scopes, and bad settings.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)

static gpupool_client *connect_leasing(struct testd *d, const char *name) {
        gpupool_client *c;

        ck_assert_int_eq(gpupool_connect(d->sock, name, &c), 0);
        return c;
}

/* A training step's shape: the same sizes allocated and freed, in the same order, again and again. */
static void step(gpupool_client *c) {
        static const size_t sizes[] = { 4 * KiB, 3 * MiB, 700 * KiB, 24 * MiB, 1000, 8 * MiB, 64 * KiB, 3 * MiB };
        void *p[sizeof(sizes) / sizeof(sizes[0])];

        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                ck_assert_int_eq(gpupool_alloc(c, 0, sizes[i], &p[i]), 0);
                /* Host memory, really ours: its first and last bytes are writable. */
                memset(p[i], (int) i, sizes[i] < 4096 ? sizes[i] : 4096);
                ((volatile char *) p[i])[sizes[i] - 1] = (char) i;
        }
        for (size_t i = sizeof(sizes) / sizeof(sizes[0]); i-- > 0;)
                ck_assert_int_eq(gpupool_free(c, p[i]), 0);
}

START_TEST(test_steady_state_asks_nothing) {
        struct gpupool_grow_stats gs;
        struct gpupool_stats first, st;
        gpupool_client *c;
        struct testd d;

        testd_start(&d, NULL);
        c = connect_leasing(&d, "steady");
        step(c);
        ck_assert_int_eq(gpupool_stats(c, &first), 0);
        ck_assert_uint_eq(first.live_blocks, 0);
        ck_assert_uint_gt(first.segments_imported, 0);
        ck_assert_uint_eq(first.cached_bytes, first.mapped_bytes);      /* all of it free, in the process */
        for (int i = 0; i < 200; i++)
                step(c);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.round_trips, first.round_trips);
        ck_assert_uint_eq(st.segments_imported, first.segments_imported);
        ck_assert_uint_eq(st.mapped_bytes, first.mapped_bytes);
        /* Whole segments: no granule under any range. */
        ck_assert_int_eq(gpupool_grow_stats(c, &gs), 0);
        ck_assert(!gs.granules_held && !gs.granules_free && !gs.granules_mapped && !gs.granules_unmapped);
        /* The daemon counts what the process leases; it heard what it holds with its last lease. */
        ck_assert_int_eq(testd_client_field(&d, 0, "steady", "reserved_bytes"), (long long) st.mapped_bytes);
        ck_assert_int_eq(testd_client_field(&d, 0, "steady", "reserved_bytes"), (long long) st.mapped_bytes);
        ck_assert_int_ge(testd_client_field(&d, 0, "steady", "report_age_ms"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), (long long) st.mapped_bytes);
        /* Trimmed, every segment goes back, and the report that came with it says so. */
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.mapped_bytes, 0);
        ck_assert_uint_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "steady", "reserved_bytes"), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "steady", "held_free_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), (long long) first.mapped_bytes);
        json_decref(testd_ctl(&d, "check"));        /* every invariant of the daemon holds */
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Process A of the elasticity test: allocates 700 MiB in blocks of block bytes, frees it all and idles. */
struct idler {
        size_t block;
        int ready[2], go[2];
};

static int idler_main(struct testd *d, void *arg) {
        struct idler *a = arg;
        size_t n = 700 * MiB / a->block + (700 * MiB % a->block != 0);
        void **p = calloc(n, sizeof(*p));
        gpupool_client *c;
        char ch = 'y';

        setenv("GPUPOOL_IDLE_RETURN", "0", 1);  /* nothing goes back by itself: only when asked */
        if (!p || gpupool_connect(d->sock, "idler", &c) < 0)
                return 1;
        for (size_t i = 0; i < n; i++)
                if (gpupool_alloc(c, 0, a->block, &p[i]) < 0)
                        ch = 'n';
        for (size_t i = 0; i < n; i++)
                if (p[i] && gpupool_free(c, p[i]) < 0)
                        ch = 'n';
        if (write(a->ready[1], &ch, 1) != 1 || read(a->go[0], &ch, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        free(p);
        return 0;
}

static void elasticity(size_t block) {
        struct idler a = { .block = block };
        gpupool_client *b;
        struct testd d;
        char ready;
        double t0, took;
        void *p;
        pid_t pid;

        testd_start(&d, "--host-capacity", "1G", NULL);
        ck_assert_int_eq(pipe(a.ready), 0);
        ck_assert_int_eq(pipe(a.go), 0);
        pid = spawn(idler_main, &d, &a);
        ck_assert_int_eq(read(a.ready[0], &ready, 1), 1);
        ck_assert_int_eq(ready, 'y');
        ck_assert_int_ge(testd_client_field(&d, 0, "idler", "reserved_bytes"), 700 * MiB);
        /* A holds nothing in use and everything leased; B's 700 MiB fits only with it back. */
        b = connect_leasing(&d, "needy");
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(b, 0, 700 * MiB, &p), 0);
        took = now_s() - t0;
        ck_assert_msg(took < 1.0, "took %.3f s", took);
        ck_assert_int_gt(testd_device(&d, 0, "reclaims_total"), 0);
        ck_assert_int_lt(testd_client_field(&d, 0, "idler", "reserved_bytes"), 324 * MiB);
        ck_assert_int_eq(gpupool_free(b, p), 0);
        gpupool_disconnect(b);
        ck_assert_int_eq(write(a.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(a.ready[0]), close(a.ready[1]), close(a.go[0]), close(a.go[1]);
        ck_assert_int_eq(testd_stop(&d), 0);
}

START_TEST(test_elasticity_1m_blocks) {
        elasticity(1 * MiB);
}
END_TEST

START_TEST(test_elasticity_64m_blocks) {
        elasticity(64 * MiB);
}
END_TEST

/* Process B's thread: a lease the daemon parks while it asks memory back. */
struct parked_lease {
        gpupool_client *c;
        void *p;
        int r;
        bool done;      /* atomic */
};

static void *parked_lease_main(void *arg) {
        struct parked_lease *l = arg;

        l->r = gpupool_alloc(l->c, 0, 400 * MiB, &l->p);
        __atomic_store_n(&l->done, true, __ATOMIC_RELEASE);
        return NULL;
}

/*
 * A process whose thread waits in a parked lease still answers the daemon's requests for
 * memory back; else two processes, each waiting for what the other holds free, both fail
 * after the reclaim timeout. Here B's lease waits on a peer that never answers, while A's
 * allocation needs what B holds free: A gets it at once, with B's lease still waiting.
 */
START_TEST(test_parked_lease_still_answers_reclaim) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__Envelope *rep;
        struct parked_lease b = { 0 };
        gpupool_client *a;
        pthread_t thread;
        uint64_t hog_id, hog_segment;
        int hog, hog_control;
        double t0, took;
        void *p;
        struct testd d;

        testd_start(&d, "--host-capacity", "1G", "--reclaim-timeout", "60s", NULL);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        /* B holds 300 MiB leased and empty. */
        b.c = connect_leasing(&d, "holder");
        ck_assert_int_eq(gpupool_alloc(b.c, 0, 300 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(b.c, p), 0);
        /* A hog leases 700 MiB and never answers on its control channel. */
        hello.name = "hog";
        hog = raw_hello_with(&d, &hello, &hog_id);
        hello.has_control_for = 1;
        hello.control_for = hog_id;
        hog_control = raw_hello_with(&d, &hello, NULL);
        rep = raw_lease(hog, 0, 700 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        hog_segment = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);

        /* B's 400 MiB does not fit: the daemon asks the hog, and B's lease waits for it. */
        ck_assert_int_eq(pthread_create(&thread, NULL, parked_lease_main, &b), 0);
        rep = raw_recv(hog_control);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_RECLAIM);
        gpupool__envelope__free_unpacked(rep, NULL);

        /* A's 200 MiB fits only with what B holds empty: B's control thread gives it back. */
        a = connect_leasing(&d, "needy");
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(a, 0, 200 * MiB, &p), 0);
        took = now_s() - t0;
        ck_assert_msg(took < 10.0, "took %.3f s", took);
        ck_assert(!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE));
        ck_assert_int_eq(testd_client_field(&d, 0, "holder", "reserved_bytes"), 0);

        /* The hog gives its segment back: B's lease gets the memory. */
        rep = raw_return(hog, &hog_segment, 1, NULL);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(pthread_join(thread, NULL), 0);
        ck_assert_int_eq(b.r, 0);
        ck_assert_int_eq(gpupool_free(b.c, b.p), 0);
        ck_assert_int_eq(gpupool_free(a, p), 0);
        gpupool_disconnect(a);
        gpupool_disconnect(b.c);
        close(hog_control);
        close(hog);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Process A of the framework test: a framework's cache of 700 MiB over its blocks, and its thread that frees it when asked. */
struct framework {
        gpupool_client *c;
        void *blocks[11];
        int ready[2], go[2];
        int asked, last;        /* the waiting thread's: times it was asked, and its last answer */
};

static void *framework_thread(void *arg) {
        struct framework *f = arg;

        while ((f->last = gpupool_release_wait(f->c, 10000)) >= 0) {
                if (f->last == 0)
                        continue;
                f->asked++;
                /* The framework frees what its cache holds unused, from its own thread, then says so. */
                for (size_t i = 0; i < 11; i++)
                        if (f->blocks[i] && gpupool_free(f->c, f->blocks[i]) == 0)
                                f->blocks[i] = NULL;
                (void) gpupool_release_report(f->c, 0, 0);
                (void) gpupool_release_done(f->c);
        }
        return NULL;
}

static int framework_main(struct testd *d, void *arg) {
        struct framework *f = arg;
        pthread_t thread;
        char ch = 'y';

        setenv("GPUPOOL_IDLE_RETURN", "0", 1);  /* nothing goes back by itself: only when asked */
        if (gpupool_connect(d->sock, "framework", &f->c) < 0)
                return 1;
        for (size_t i = 0; i < 11; i++)
                if (gpupool_alloc(f->c, 0, 64 * MiB, &f->blocks[i]) < 0)
                        ch = 'n';
        if (gpupool_release_report(f->c, 0, 11 * 64 * MiB) < 0 || gpupool_release_report(f->c, 1, 1) != -ENODEV ||
            pthread_create(&thread, NULL, framework_thread, f) != 0)
                ch = 'n';
        if (write(f->ready[1], &ch, 1) != 1 || read(f->go[0], &ch, 1) != 1)
                return 2;
        /* Disconnecting lets the waiting thread go first: it is told the handle is closing. */
        gpupool_disconnect(f->c);
        if (pthread_join(thread, NULL) != 0 || f->last != -ECANCELED)
                return 3;
        return f->asked == 1 ? 0 : 4;
}

/*
 * A framework's own cache (PyTorch's allocator over gpupool's blocks) holds memory only the
 * framework can free: the process reports it as free, so the daemon asks it, and its thread
 * waiting in gpupool_release_wait() frees it; the answer to the daemon carries what emptied.
 */
START_TEST(test_framework_cache_goes_back) {
        struct framework f = { 0 };
        gpupool_client *b;
        struct testd d;
        double t0, took;
        char ready;
        void *p;
        pid_t pid;

        testd_start(&d, "--host-capacity", "1G", NULL);
        ck_assert_int_eq(pipe(f.ready), 0);
        ck_assert_int_eq(pipe(f.go), 0);
        pid = spawn(framework_main, &d, &f);
        ck_assert_int_eq(read(f.ready[0], &ready, 1), 1);
        ck_assert_int_eq(ready, 'y');
        /* Reported within a second (the control thread's usage report): free, not in use. */
        for (t0 = now_s(); testd_client_field(&d, 0, "framework", "held_free_bytes") < 11 * 64 * (long long) MiB &&
                           now_s() - t0 < 5;)
                nap_ms(20);
        ck_assert_int_eq(testd_client_field(&d, 0, "framework", "held_free_bytes"), 11 * 64 * (long long) MiB);
        ck_assert_int_eq(testd_client_field(&d, 0, "framework", "in_use_bytes"), 0);
        /* B's 700 MiB fits only with the framework's cache freed. */
        b = connect_leasing(&d, "needy");
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(b, 0, 700 * MiB, &p), 0);
        took = now_s() - t0;
        ck_assert_msg(took < 1.0, "took %.3f s", took);
        ck_assert_int_lt(testd_client_field(&d, 0, "framework", "reserved_bytes"), 324 * MiB);
        ck_assert_int_eq(gpupool_free(b, p), 0);
        gpupool_disconnect(b);
        ck_assert_int_eq(write(f.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(f.ready[0]), close(f.ready[1]), close(f.go[0]), close(f.go[1]);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_idle_segments_go_back) {
        gpupool_client *c;
        struct testd d;
        void *p;

        testd_start(&d, NULL);
        setenv("GPUPOOL_IDLE_RETURN", "300ms", 1);
        c = connect_leasing(&d, "idle");
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 20 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        /* The control thread looks once a second: within a few, the empty segment is the daemon's again. */
        ck_assert(testd_device_becomes(&d, 0, "cached_bytes", 20 * MiB));
        ck_assert_uint_eq(gpupool_cached_bytes(c), 0);
        /* And the next allocation leases anew. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_limit_makes_room_from_empty_segments) {
        gpupool_client *c;
        struct testd d;
        char msg[512];
        void *p, *q;

        testd_start(&d, "--client-limit", "64M", NULL);
        c = connect_leasing(&d, "limited");
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /* 40 MiB held empty + a 50 MiB segment is over 64 MiB: the empty one goes back first. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 50 * MiB, &p), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "limited", "reserved_bytes"), 50 * MiB);
        /* In use, nothing is given back: the limit refuses, saying so. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 20 * MiB, &q), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "over its limit of 64.0 MiB"), "%s", msg);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A thread that parks a freed 4 KiB block in its cache and exits, or waits for its handle to go and then uses another. */
struct cache_thread {
        gpupool_client *c, *next;
        int go[2], done[2];
        void *p;
        int failures;
};

static void *parker_main(void *arg) {
        struct cache_thread *t = arg;
        char ch;

        if (gpupool_alloc(t->c, 0, 4 * KiB, &t->p) < 0 || gpupool_free(t->c, t->p) < 0)
                t->failures++;
        if (!t->next)
                return NULL;    /* exits with the block parked */
        if (write(t->done[1], "d", 1) != 1 || read(t->go[0], &ch, 1) != 1)
                t->failures++;
        /* Its first handle is gone: the cache it had is dead, and the next handle gets one of its own. */
        for (int i = 0; i < 3; i++) {
                void *q;

                if (gpupool_alloc(t->next, 0, 4 * KiB, &q) < 0 || gpupool_free(t->next, q) < 0)
                        t->failures++;
        }
        return NULL;
}

START_TEST(test_thread_caches) {
        struct cache_thread t = { 0 };
        struct gpupool_stats st, first;
        gpupool_client *c, *other;
        pthread_t thread;
        struct testd d;
        void *p, *q;
        char ch;

        testd_start(&d, "--host-capacity", "4M", "--reclaim-timeout", "3s", NULL);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        c = connect_leasing(&d, "cached");
        /* Freed, a small block is the thread's next allocation of its size, with no request and no lock of the pool. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * KiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_stats(c, &first), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4000, &q), 0);
        ck_assert_ptr_eq(q, p);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, q), -ENOENT);  /* parked is not live: a double free is still caught */
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.round_trips, first.round_trips);
        ck_assert_uint_eq(st.live_blocks, 0);
        ck_assert_uint_eq(st.cached_bytes, 2 * MiB);    /* parked counts as the pool's free */
        /* Parked is not in use: the daemon hears 0; the segment is not empty while the block is parked. */
        ck_assert(testd_client_becomes(&d, 0, "cached", "in_use_bytes", 0));
        ck_assert_int_eq(testd_client_field(&d, 0, "cached", "held_free_bytes"), 0);

        /* Another process's 4 MiB needs that segment: the daemon asks, and the cache lets go of it. */
        other = connect_leasing(&d, "needy");
        ck_assert_int_eq(gpupool_alloc(other, 0, 4 * MiB, &q), 0);
        ck_assert_int_eq(testd_client_field(&d, 0, "cached", "reserved_bytes"), 0);
        ck_assert_int_eq(gpupool_free(other, q), 0);
        ck_assert_int_eq(gpupool_trim(other), 0);

        /* A thread exits with a block parked: within seconds the handle takes it back and its segment empties. */
        t.c = c;
        ck_assert_int_eq(pthread_create(&thread, NULL, parker_main, &t), 0);
        ck_assert_int_eq(pthread_join(thread, NULL), 0);
        ck_assert_int_eq(t.failures, 0);
        ck_assert(testd_client_becomes(&d, 0, "cached", "held_free_bytes", 2 * MiB));
        ck_assert_int_eq(testd_client_field(&d, 0, "cached", "in_use_bytes"), 0);

        /* A handle disconnected while a thread's cache holds a block of it; the thread goes on with another. */
        ck_assert_int_eq(pipe(t.go), 0);
        ck_assert_int_eq(pipe(t.done), 0);
        t.next = other;
        ck_assert_int_eq(pthread_create(&thread, NULL, parker_main, &t), 0);
        ck_assert_int_eq(read(t.done[0], &ch, 1), 1);
        gpupool_disconnect(c);
        ck_assert_int_eq(write(t.go[1], "g", 1), 1);
        ck_assert_int_eq(pthread_join(thread, NULL), 0);
        ck_assert_int_eq(t.failures, 0);
        ck_assert_int_eq(gpupool_stats(other, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 0);
        ck_assert_uint_eq(st.cached_bytes, st.mapped_bytes);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        close(t.go[0]), close(t.go[1]), close(t.done[0]), close(t.done[1]);
        gpupool_disconnect(other);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_scopes_and_bad_settings) {
        struct gpupool_stats st;
        gpupool_client *c;
        struct testd d;
        void *p;

        testd_start(&d, NULL);
        c = connect_leasing(&d, "scoped");
        ck_assert_int_eq(gpupool_alloc(c, 0, 8 * KiB, &p), 0);
        ck_assert_int_eq(gpupool_scope_begin(c), 0);
        for (int i = 0; i < 300; i++) {
                void *x;

                ck_assert_int_eq(gpupool_alloc(c, 0, 4 * KiB, &x), 0);
        }
        ck_assert_int_eq(gpupool_scope_end(c), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 1);           /* the scope's blocks are freed, the one before it kept */
        ck_assert_uint_eq(st.live_bytes, 8 * KiB);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, p), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(c, 0, (size_t) 1 << 47, &p), -EINVAL);
        gpupool_disconnect(c);
        setenv("GPUPOOL_IDLE_RETURN", "soon", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad", &c), -EINVAL);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_process_pool(void) {
        Suite *s = suite_create("process_pool");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_steady_state_asks_nothing);
        tcase_add_test(tc, test_elasticity_1m_blocks);
        tcase_add_test(tc, test_elasticity_64m_blocks);
        tcase_add_test(tc, test_parked_lease_still_answers_reclaim);
        tcase_add_test(tc, test_framework_cache_goes_back);
        tcase_add_test(tc, test_idle_segments_go_back);
        tcase_add_test(tc, test_limit_makes_room_from_empty_segments);
        tcase_add_test(tc, test_thread_caches);
        tcase_add_test(tc, test_scopes_and_bad_settings);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
