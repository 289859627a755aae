/*
 * check_cuda_fake.c: the fake driver's rules, as strict as the real driver's where behaviour
 * matters (devices renumbered, handles opened once, streams and events, reaping, compute
 * modes, PID namespaces, the cost of an IPC open, the legacy stream), each with gpupoold and
 * libgpupool run against it. Part of the cuda-fake suite (check_cuda.c).
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudatest.h"

struct visible {
        const char *cvd;
        unsigned expect_daemon_device;
};


static int visible_client(struct testd *d, void *arg) {
        struct visible *v = arg;
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        setenv("CUDA_VISIBLE_DEVICES", v->cvd, 1);
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "renumbered", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, 6 * MiB, &p) < 0 || write_pattern(&g, p, 6 * MiB, 5) < 0 || !pattern_intact(&g, p, 6 * MiB, 5))
                return 2;
        /* Our device 0 is the daemon's device expect_daemon_device: only that one leased us memory. */
        if (leased_on(d, v->expect_daemon_device) < (long long) (6 * MiB) || leased_on(d, 1 - v->expect_daemon_device) != 0)
                return 3;
        if (gpupool_alloc(c, 1, 4096, &p) != -ENODEV)
                return 4;       /* this process sees one GPU */
        gpupool_disconnect(c);
        return 0;
}

/*
 * A tenant of one GPU (device = 1) on a node of two: its clients lease and charge there, and
 * are refused on the other, saying why; its guarantee is held back on its GPU alone, and the
 * tenants' view names its device. A tenant for a GPU the node lacks stops the daemon's start.
 */
START_TEST(test_fake_tenant_of_one_gpu) {
        gpupool_client *one, *other;
        char msg[512], cmd[512], out[4096];
        struct testd d;
        void *p;

        setenv("FAKECUDA_DEVICES", "2", 1);
        cuda_start(&d, "--config", conf_new("[tenant:one]\nmatch_name = one-*\ndevice = 1\nguarantee = 256M\n"));
        ck_assert_int_eq(gpupool_connect(d.sock, "one-a", &one), 0);
        ck_assert_int_eq(gpupool_alloc(one, 1, 64 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(one, p), 0);
        ck_assert_int_eq(gpupool_alloc(one, 0, 64 * MiB, &p), -EDQUOT);
        gpupool_last_error(one, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "tenant one holds memory on device 1 only (device = in its config), not on device 0"),
                      "%s", msg);
        ck_assert_int_eq(gpupool_charge(one, 0, 4 * MiB), -EDQUOT);
        ck_assert_int_eq(gpupool_charge(one, 1, 4 * MiB), 0);
        ck_assert_int_eq(gpupool_uncharge(one, 1, 4 * MiB), 0);
        /* Its guarantee is GPU 1's: another tenant's client may lease 256 MiB less there than on GPU 0. */
        ck_assert_int_eq(gpupool_connect(d.sock, "other", &other), 0);
        {
                uint64_t free0, free1, total;

                ck_assert_int_eq(gpupool_device_memory(other, 0, &free0, &total), 0);
                ck_assert_int_eq(gpupool_device_memory(other, 1, &free1, &total), 0);
                ck_assert_msg(free0 - free1 == 256 * MiB, "device 0 leaves %llu, device 1 %llu", (unsigned long long) free0,
                              (unsigned long long) free1);
        }
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s limits", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "name=one-* device=1"), "%s", out);
        gpupool_disconnect(other);
        gpupool_disconnect(one);
        cuda_stop(&d);
        conf_remove();
        /* GPU 2 of two: refused at start, saying so. */
        fake_node_new();
        {
                const char *conf = conf_new("[tenant:two]\nmatch_name = two-*\ndevice = 2\n");

                snprintf(cmd, sizeof(cmd), "%s/gpupoold --backend cuda --config %s --socket %s.sock 2>&1", build_dir(), conf,
                         conf);
        }
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "tenant two is for device 2, and the daemon has 2 devices (0 to 1)"), "%s", out);
        fake_node_done();
        conf_remove();
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/*
 * By ordinal, by a unique start of a GPU's UUID, and by a MIG instance's UUID (the fake's GPU 1
 * is one here); the metrics label each device with its UUID as nvidia-smi -L writes it.
 */
START_TEST(test_fake_visible_devices_renumbered) {
        static const char gpu0[] = "GPU-f0011223-3445-5667-7889-9aabbccddeef";
        static const char mig1[] = "MIG-f1021324-3546-5768-798a-9bacbdcedff0";
        struct visible second = { "1", 1 }, first = { "0", 0 }, by_uuid = { "GPU-f0011223", 0 }, by_mig = { mig1, 1 };
        char cmd[512], out[4096];
        struct testd d;

        setenv("FAKECUDA_DEVICES", "2", 1);
        setenv("FAKECUDA_MIG", "1", 1);
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(testd_device(&d, 1, "total_bytes"), testd_device(&d, 0, "total_bytes"));
        ck_assert_int_eq(reap(spawn(visible_client, &d, &second)), 0);
        ck_assert_int_eq(reap(spawn(visible_client, &d, &first)), 0);
        ck_assert_int_eq(reap(spawn(visible_client, &d, &by_uuid)), 0);
        ck_assert_int_eq(reap(spawn(visible_client, &d, &by_mig)), 0);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics | grep -c "
                 "-e '^gpupool_device_total_bytes{device=\"0\",uuid=\"%s\"}' -e '^gpupool_device_total_bytes{device=\"1\",uuid=\"%s\"}'",
                 build_dir(), d.sock, gpu0, mig1);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(atoi(out) == 2, "the devices' UUIDs are not labelled as nvidia-smi writes them: %s", out);
        ck_assert(testd_log_wait(&d, "Fake GPU 1 MIG 1g.10gb (MIG-f1021324-3546-5768-798a-9bacbdcedff0)"));
        cuda_stop(&d);
        unsetenv("FAKECUDA_MIG");
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

static int open_once_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        struct gpu g;
        void *a, *b;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "opener", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, 4096, &a) < 0 || gpupool_alloc(c, 0, 8192, &b) < 0)
                return 2;
        if (g.open_handles() != 1)
                return 3;       /* two blocks of one segment: one open handle */
        if (gpupool_free(c, a) < 0 || g.open_handles() != 1 || gpupool_free(c, b) < 0)
                return 4;
        if (g.open_handles() != 1)
                return 5;       /* emptied, the segment stays the process's, open for the next blocks */
        if (gpupool_trim(c) < 0 || g.open_handles() != 0)
                return 6;       /* given back: its handle is closed first */
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_handle_opened_once_and_closed) {
        struct testd d;

        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(reap(spawn(open_once_client, &d, NULL)), 0);
        cuda_stop(&d);
}
END_TEST

/* The driver's rules, as the fake enforces them: if these pass, the tests above are honest. */
/* A block freed on a stream is reused on that stream at once, by nobody else until its work ends. */
static int stream_cache_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        gp_cu_stream s, other;
        gp_cu_event done;
        struct gpu g;
        void *a, *b, *plain, *other_stream;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "stream-cache", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                return 1;
        if (gpupool_alloc(c, 0, 1 << 20, &a) < 0 || queue_work(&g, s, a, 1 << 20) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS || gpupool_free_async(c, a, s) < 0)
                return 2;
        /*
         * Not for a plain allocation, nor for another stream, while the work runs. (Both stay
         * live until the next step: a block in the cache that is ready would do for it too.)
         */
        if (gpupool_alloc(c, 0, 1 << 20, &plain) < 0 || plain == a)
                return 3;
        if (gpupool_alloc_async(c, 0, 1 << 20, other, &other_stream) < 0 || other_stream == a)
                return 4;
        /* On its own stream: at once, with the work still queued. */
        if (gpupool_alloc_async(c, 0, 1 << 20, s, &b) < 0 || b != a || gpupool_free(c, plain) < 0 ||
            gpupool_free(c, other_stream) < 0)
                return 5;
        if (g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                return 6;
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || gpupool_free(c, b) < 0)
                return 7;
        /* Freed plainly now: the next plain allocation of the size takes it from the cache. */
        if (gpupool_alloc(c, 0, 1 << 20, &b) < 0 || b != a || gpupool_free(c, b) < 0)
                return 8;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_stream_aware_cache) {
        run_client(stream_cache_client, "stream_cache_client");
}
END_TEST


/*
 * Reaping stops at the first free of a stream whose work has not ended: with a thousand frees
 * pending on one stream, an allocation asks the driver about one event, not a thousand; a
 * free on another stream completes meanwhile.
 */
static int many_pending_client(struct testd *d, void *arg) {
        enum { PENDING = 1000 };
        void *fail_page = arg;
        static void *blocks[PENDING];
        gpupool_client *c = NULL;
        gp_cu_stream s, other;
        unsigned long long queries;
        struct gpupool_stats st;
        struct gpu g;
        void *p, *q;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "many-pending", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                FAIL();
        for (int i = 0; i < PENDING; i++)
                if (gpupool_alloc(c, 0, 64 * 1024, &blocks[i]) < 0)
                        FAIL();
        if (queue_work(&g, s, blocks[0], 64 * 1024) < 0)
                FAIL();
        for (int i = 0; i < PENDING; i++)
                if (gpupool_free_async(c, blocks[i], s) < 0)
                        FAIL();
        if (gpupool_alloc(c, 0, 4096, &q) < 0 || gpupool_free_async(c, q, other) < 0)
                FAIL();
        queries = g.event_queries();
        if (gpupool_alloc(c, 0, 8192, &p) < 0)
                FAIL();
        if (g.event_queries() - queries > 4) {
                fprintf(stderr, "many_pending_client: one allocation made %llu event queries\n", g.event_queries() - queries);
                FAIL();
        }
        /* The other stream's free completed although the first stream's are still pending. */
        if (gpupool_stats(c, &st) < 0 || st.live_blocks != 1 || gpupool_alloc(c, 0, 4096, &q) < 0)
                FAIL();
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || gpupool_free(c, p) < 0 || gpupool_free(c, q) < 0)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_reaping_stops_at_pending_work) {
        run_client(many_pending_client, "many_pending_client");
}
END_TEST

/*
 * A batch of completed frees costs a few event queries, not one each: of 1,000 frees pending
 * on one stream, each behind its own work and fenced 64 at a time, the fake runs exactly the
 * work of the first 512 (while the reaper waits on an older free of another stream, held for
 * good); an allocation the pool cannot serve then returns those 512 and no other, having
 * searched the queue for where the completed ones end. (Frees held side by side merge, and
 * wait for the later fence: the 64 KiB blocks fill 2 MiB segments 32 at a time, so the 512
 * fill 16 segments, and no later free shares one with them.)
 */
static int batch_client(struct testd *d, void *arg) {
        /* DONE a multiple of the 64 frees one fence covers: what comes back is what DONE operations fenced. */
        enum { PENDING = 1000, DONE = 512, SIZE = 64 * 1024 };
        void *fail_page = arg;
        static void *blocks[PENDING];
        gpupool_client *c = NULL;
        struct gpupool_stats st0, st1;
        unsigned long long queries;
        gp_cu_stream s, t;
        struct gpu g;
        void *x, *big;
        size_t big_size;
        int i;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "batch", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&t, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS || g.hold(s, 1) < 0)
                FAIL();
        /* The oldest free, on t, held (of the large class, in a segment of its own): the reaper waits on it and looks at nothing else. */
        if (gpupool_alloc(c, 0, 2 << 20, &x) < 0 || queue_work(&g, t, x, SIZE) < 0 || gpupool_free_async(c, x, t) < 0)
                FAIL();
        for (i = 0; i < PENDING; i++)
                if (gpupool_alloc(c, 0, SIZE, &blocks[i]) < 0)
                        FAIL();
        for (i = 0; i < PENDING; i++)
                if (g.memset_d8_async(dptr(blocks[i]), 0x5a, SIZE, s) != GP_CUDA_SUCCESS ||
                    gpupool_free_async(c, blocks[i], s) < 0)
                        FAIL();
        if (g.run(s, DONE) < 0 || gpupool_stats(c, &st0) < 0)
                FAIL();
        /* Larger than all the process maps: the pool cannot serve it, so it reaps first. */
        big_size = st0.mapped_bytes + (1 << 20);
        queries = g.event_queries();
        if (gpupool_alloc(c, 0, big_size, &big) < 0 || gpupool_stats(c, &st1) < 0)
                FAIL();
        queries = g.event_queries() - queries;
        /* What the process maps is live, cached or pending: exactly the 500 left pending. */
        if ((st1.live_bytes + st1.cached_bytes) - (st0.live_bytes + st0.cached_bytes) !=
            DONE * SIZE + (st1.mapped_bytes - st0.mapped_bytes)) {
                fprintf(stderr, "batch_client: %lld bytes came back, not %u\n",
                        (long long) ((st1.live_bytes + st1.cached_bytes) - (st0.live_bytes + st0.cached_bytes) -
                                     (st1.mapped_bytes - st0.mapped_bytes)),
                        DONE * SIZE);
                FAIL();
        }
        if (queries > 24) {
                fprintf(stderr, "batch_client: %llu event queries to return a batch of %d\n", queries, DONE);
                FAIL();
        }
        release_work(&g, s);
        release_work(&g, t);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || g.cu.cuStreamSynchronize(t) != GP_CUDA_SUCCESS ||
            gpupool_free(c, big) < 0)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

/*
 * One fence covers many frees: 1,000 frees on one stream, each behind work of its own, record
 * at most one event per 64 of them (PyTorch frees hundreds of blocks a step, and each event is
 * a command on the stream); a free comes back only once the work before it has run, fenced or
 * not; and once all the work has run, every one comes back with no further call of the
 * process's (the last, fewer than 64, fenced by the reaper in time).
 */
/* What a process maps that is neither live nor free: its stream-ordered frees still pending. */
static uint64_t pending(const struct gpupool_stats *st) {
        return st->mapped_bytes - st->live_bytes - st->cached_bytes;
}

static int fence_client(struct testd *d, void *arg) {
        enum { FREES = 1000, FENCED = 960, SIZE = 64 * 1024 };
        void *fail_page = arg;
        static void *blocks[FREES];
        gpupool_client *c = NULL;
        unsigned long long events;
        struct gpupool_stats st;
        gp_cu_stream s;
        struct gpu g;
        int i;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "fences", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS || g.hold(s, 1) < 0)
                FAIL();
        for (i = 0; i < FREES; i++)
                if (gpupool_alloc(c, 0, SIZE, &blocks[i]) < 0)
                        FAIL();
        events = g.event_records();
        for (i = 0; i < FREES; i++)
                if (g.memset_d8_async(dptr(blocks[i]), 0x5a, SIZE, s) != GP_CUDA_SUCCESS ||
                    gpupool_free_async(c, blocks[i], s) < 0)
                        FAIL();
        events = g.event_records() - events;
        if (events > FREES / 64 + 1) {
                fprintf(stderr, "fence_client: %llu events for %d frees\n", events, FREES);
                FAIL();
        }
        /*
         * The work of the first 960 runs: the frees a fence at or before it covers come back, never
         * the 40 after, whose work has not run. A fence covers at most 64, but the reaper may
         * record one early (after 2 ms), so up to 63 before the 961st may wait with them for a
         * fence after it, and frees held side by side merge and wait for the later fence: up to
         * 31 more before those, in the 2 MiB segment of the first (32 blocks of 64 KiB).
         */
        if (g.run(s, FENCED) < 0)
                FAIL();
        for (double t0 = now_s(); gpupool_stats(c, &st) == 0 && pending(&st) > (FREES - FENCED + 63 + 31) * SIZE &&
             now_s() - t0 < 5; nap_ms(5))
                ;
        if (gpupool_stats(c, &st) < 0 || pending(&st) < (FREES - FENCED) * SIZE ||
            pending(&st) > (FREES - FENCED + 63 + 31) * SIZE) {
                fprintf(stderr, "fence_client: %llu bytes pending, not the %d frees whose work has not run and at most "
                        "94 more\n", (unsigned long long) pending(&st), FREES - FENCED);
                FAIL();
        }
        release_work(&g, s);
        for (double t0 = now_s(); gpupool_stats(c, &st) == 0 && st.live_bytes && now_s() - t0 < 5; nap_ms(5))
                ;
        if (gpupool_stats(c, &st) < 0 || st.live_bytes != 0) {
                fprintf(stderr, "fence_client: %llu bytes still live once the work ran\n", (unsigned long long) st.live_bytes);
                FAIL();
        }
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_one_fence_for_many_frees) {
        run_client(fence_client, "fence_client");
}
END_TEST

START_TEST(test_fake_reaping_a_batch_costs_few_queries) {
        run_client(batch_client, "batch_client");
}
END_TEST

/*
 * A destroyed stream's handle may come back for a new stream while the old one's work still
 * runs: a block freed on the old stream is not the new stream's to take.
 */
static int stream_reuse_client(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s, again;
        struct gpu g;
        void *a, *b;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "stream-reuse", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_alloc(c, 0, 1 * MiB, &a) < 0 || queue_work(&g, s, a, 1 * MiB) < 0 || gpupool_free_async(c, a, s) < 0)
                FAIL();
        if (g.cu.cuStreamDestroy(s) != GP_CUDA_SUCCESS || g.cu.cuStreamCreate(&again, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                FAIL();
        if (again != s)
                FAIL();         /* the fake hands the handle out again, as the driver may */
        if (gpupool_alloc_async(c, 0, 1 * MiB, again, &b) < 0 || b == a)
                FAIL();         /* the old stream's work still writes a */
        g.release_all();
        if (g.cu.cuStreamSynchronize(again) != GP_CUDA_SUCCESS || gpupool_free(c, b) < 0)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_stream_handle_reused) {
        run_client(stream_reuse_client, "stream_reuse_client");
}
END_TEST

/* This thread's calls of the stream calls and of all entry points since *since, which it moves on. */
struct call_count {
        unsigned long long id, capturing, push, all;
};

static struct call_count calls_since(struct gpu *g, struct call_count *since) {
        struct call_count now = { g->calls("cuStreamGetId", 1), g->calls("cuStreamIsCapturing", 1),
                                  g->calls("cuCtxPushCurrent", 1), g->calls(NULL, 1) };
        struct call_count d = { now.id - since->id, now.capturing - since->capturing, now.push - since->push,
                                now.all - since->all };

        *since = now;
        return d;
}

/* pairs stream-ordered pairs of 1 MiB on c, on s and t in turn. 0 or -1. */
static int pairs_on(gpupool_client *c, gp_cu_stream s, gp_cu_stream t, unsigned pairs) {
        void *p;

        for (unsigned i = 0; i < pairs; i++) {
                gp_cu_stream on = i % 2 ? t : s;

                if (gpupool_alloc_async(c, 0, 1 * MiB, on, &p) < 0 || gpupool_free_async(c, p, on) < 0)
                        return -1;
        }
        return 0;
}

/*
 * The stream-ordered path's driver calls, counted by the fake: a pair asks each stream's id and
 * capture status once per call (4 calls) and makes no context current for a stream the caller
 * made; under both promises a pair makes none, and so does one through PyTorch's hooks once
 * gpupool_torch_promise() has promised for them (CuPy's, on the same shared handle, still
 * ask); a fence (one per 64 frees) pushes the context, records, pops. Captures told of are asked about again, and a free in one is still refused.
 * The default streams are the current context's: a free on the legacy stream works with no
 * context current (the library makes its own current for it), and one while a blocking
 * stream captures is refused (the driver says CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
 */
static int promise_client(struct testd *d, void *arg) {
        enum { PAIRS = 640, FENCES = 2 * PAIRS / 64 + 2 };
        void *fail_page = arg, *graph = NULL, *x, *y;
        gpupool_client *c = NULL, *p = NULL;
        struct call_count since = { 0 }, n;
        gp_cu_stream s, t, blocking;
        gp_cu_context ctx;
        struct gpu g;

        if (gpu_open(&g) < 0 || !g.calls || gpupool_connect(d->sock, "asks", &c) < 0 ||
            gpupool_connect(d->sock, "promises", &p) < 0 ||
            gpupool_promise(p, GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&t, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&blocking, 0) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_promise(p, 4) != -EINVAL || gpupool_capture_end(p) != -EINVAL)
                FAIL();
        /* No stream: refused, saying which call refused it, and the block stays the application's. */
        {
                char err[512];

                if (gpupool_alloc(c, 0, 1 * MiB, &x) < 0 || gpupool_free_async(c, x, (void *) (uintptr_t) 0x1000) != -EINVAL)
                        FAIL();
                gpupool_last_error(c, err, sizeof(err));
                if (!strstr(err, "cuStreamIsCapturing: CUDA_ERROR_INVALID_HANDLE") || gpupool_free(c, x) < 0)
                        FAIL();
        }
        /* Warm: each handle's pool holds what the two streams use. */
        if (pairs_on(c, s, t, 200) < 0 || pairs_on(p, s, t, 200) < 0)
                FAIL();
        (void) calls_since(&g, &since);
        if (pairs_on(c, s, t, PAIRS) < 0)
                FAIL();
        n = calls_since(&g, &since);
        /* An allocation asks nothing while no free waits anywhere: after a fence the reaper completed at once. */
        if (n.id > 2 * PAIRS || n.id + FENCES < 2 * PAIRS || n.capturing != n.id || n.push > FENCES ||
            n.all > 4 * PAIRS + 3 * FENCES) {
                fprintf(stderr, "promise_client: %llu calls (%llu ids, %llu capture checks, %llu pushes) for %d pairs\n",
                        n.all, n.id, n.capturing, n.push, PAIRS);
                FAIL();
        }
        if (pairs_on(p, s, t, PAIRS) < 0)
                FAIL();
        n = calls_since(&g, &since);
        if (n.id || n.capturing || n.push > FENCES || n.all > 3 * FENCES) {
                fprintf(stderr, "promise_client: %llu calls (%llu ids, %llu capture checks, %llu pushes) for %d promised pairs\n",
                        n.all, n.id, n.capturing, n.push, PAIRS);
                FAIL();
        }
        /* PyTorch's hooks, promised before their shared handle connects (as use_with_torch() does). */
        setenv("GPUPOOL_SOCKET", d->sock, 1);
        if (gpupool_torch_promise(8) != -EINVAL || gpupool_torch_promise(GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD) < 0)
                FAIL();
        for (int k = 0; k < 2; k++) {
                (void) calls_since(&g, &since);
                for (unsigned i = 0; i < PAIRS; i++) {
                        gp_cu_stream on = i % 2 ? t : s;

                        if (!(x = gpupool_torch_alloc(1 * MiB, 0, (struct CUstream_st *) on)))
                                FAIL();
                        gpupool_torch_free(x, 1 * MiB, 0, (struct CUstream_st *) on);
                        if (gpupool_hook_last_error(NULL, 0) < 0)
                                FAIL();
                }
                n = calls_since(&g, &since);
        }
        if (n.id || n.capturing || n.push > FENCES || n.all > 3 * FENCES) {
                fprintf(stderr, "promise_client: %llu calls (%llu ids, %llu capture checks) for %d pairs of the hooks\n",
                        n.all, n.id, n.capturing, PAIRS);
                FAIL();
        }
        /* CuPy's hooks, on the same shared handle, promise nothing: each call asks. */
        gpupool_cupy_stream((struct CUstream_st *) s);
        (void) calls_since(&g, &since);
        for (unsigned i = 0; i < 64; i++) {
                if (!(x = gpupool_cupy_malloc(NULL, 1 * MiB, 0)))
                        FAIL();
                gpupool_cupy_free(NULL, x, 0);
        }
        n = calls_since(&g, &since);
        if (n.id > 2 * 64 || n.id + 2 < 2 * 64 || n.capturing != n.id) {
                fprintf(stderr, "promise_client: CuPy's hooks asked %llu ids and %llu capture checks for 64 pairs\n",
                        n.id, n.capturing);
                FAIL();
        }
        /* A capture told of: the driver is asked, and a free in it refused. */
        if (gpupool_alloc_async(p, 0, 1 * MiB, s, &x) < 0 || gpupool_capture_begin(p) != 1 ||
            g.begin_capture(s, GP_CU_STREAM_CAPTURE_MODE_GLOBAL) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_free_async(p, x, s) != -EBUSY || gpupool_alloc_async(p, 0, 1 * MiB, s, &y) < 0)
                FAIL();
        if (g.end_capture(s, &graph) != GP_CUDA_SUCCESS || !graph || gpupool_capture_end(p) != 0)
                FAIL();         /* the library's calls invalidated the capture */
        (void) g.graph_destroy(graph);
        graph = NULL;
        if (gpupool_free_async(p, x, s) < 0 || gpupool_free(p, y) < 0)
                FAIL();
        /* The legacy stream while a blocking stream captures: capturing too. */
        if (gpupool_alloc_async(c, 0, 1 * MiB, NULL, &x) < 0 ||
            g.begin_capture(blocking, GP_CU_STREAM_CAPTURE_MODE_RELAXED) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_free_async(c, x, NULL) != -EBUSY || g.end_capture(blocking, &graph) != GP_CUDA_SUCCESS || !graph)
                FAIL();
        (void) g.graph_destroy(graph);
        /* No context current: a stream of the caller's needs none, the legacy stream the library's. */
        if (g.cu.cuCtxPopCurrent(&ctx) != GP_CUDA_SUCCESS)
                FAIL();
        {
                unsigned long long id;

                if (g.cu.cuStreamGetId(NULL, &id) != GP_CUDA_ERROR_INVALID_CONTEXT)
                        FAIL();         /* the fake's default streams are the current context's */
        }
        if (gpupool_free_async(c, x, NULL) < 0 || pairs_on(c, s, NULL, 10) < 0 || pairs_on(p, s, NULL, 10) < 0)
                FAIL();
        if (g.cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS || g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamSynchronize(t) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_disconnect(p);
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_stream_calls_and_promises) {
        run_client(promise_client, "promise_client");
}
END_TEST

/*
 * A driver error is never taken for "the work is done": the block stays pending (nobody gets
 * it), and gpupool_disconnect() then says no bye, so the daemon keeps the memory until the
 * process has exited.
 */
static int event_error_client(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s;
        struct gpu g;
        void *a, *b, *big;
        char err[512];

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "event-error", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_alloc(c, 0, 1 * MiB, &a) < 0 || queue_work(&g, s, a, 1 * MiB) < 0 || gpupool_free_async(c, a, s) < 0)
                FAIL();
        /* Enough frees on s that an allocation the pool cannot serve fences them (STREAM_FENCE_MISS_FREES). */
        for (int i = 1; i < 32; i++) {
                void *small;

                if (gpupool_alloc(c, 0, 64 * 1024, &small) < 0 || gpupool_free_async(c, small, s) < 0)
                        FAIL();
        }
        g.fail_events(719);     /* CUDA_ERROR_LAUNCH_FAILED: the context is lost */
        release_work(&g, s);
        if (gpupool_alloc(c, 0, 1 * MiB, &b) < 0 || b == a)
                FAIL();
        /* One the pool cannot serve reaps before it asks the daemon, and says what it met. */
        if (gpupool_alloc(c, 0, 24 * MiB, &big) < 0)
                FAIL();
        gpupool_last_error(c, err, sizeof(err));
        if (!strstr(err, "cannot tell whether device work on a freed block ended") || gpupool_free(c, big) < 0)
                FAIL();
        gpupool_disconnect(c);
        /* No bye: what we leased is still ours as the daemon sees it, though our socket is closed. */
        if (leased_on(d, 0) < (long long) (2 * MiB))
                FAIL();
        return 0;
}

START_TEST(test_fake_event_error_is_not_done) {
        struct testd d;

        cuda_start(&d, NULL, NULL);
        check_client(&d, event_error_client, "event_error_client");
        /* Once the process is gone, its memory comes back. */
        ck_assert(testd_device_becomes(&d, 0, "cached_bytes", testd_device(&d, 0, "reserved_bytes")));
        cuda_stop(&d);
}
END_TEST


/* A GPU in EXCLUSIVE_PROCESS mode stays out of the pool: gpupoold's context would lock out the client's own. */
static int exclusive_client(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        /* GPU 0, the exclusive one, is this process's: its own context there works. */
        if (gpu_open(&g) < 0)
                FAIL();
        if (gpupool_connect(d->sock, "exclusive", &c) < 0)
                FAIL();
        if (gpupool_alloc(c, 0, 4096, &p) != -ENODEV)
                FAIL();         /* not a GPU gpupoold serves */
        if (gpupool_alloc(c, 1, 6 * MiB, &p) < 0 || gpupool_free(c, p) < 0)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_compute_modes) {
        const char *b = build_dir();
        char cmd[768], out[4096], lock[128];
        struct testd d;

        setenv("FAKECUDA_DEVICES", "2", 1);
        setenv("FAKECUDA_COMPUTE_MODES", "exclusive-process,default", 1);
        cuda_start(&d, NULL, NULL);
        snprintf(cmd, sizeof(cmd), "grep -c 'GPU 0 (Fake GPU 0) skipped: its compute mode is EXCLUSIVE_PROCESS' %s", d.log);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        {
                json_t *st = testd_ctl(&d, "status");

                ck_assert_int_eq(json_array_size(json_object_get(st, "devices")), 1);
                json_decref(st);
        }
        check_client(&d, exclusive_client, "exclusive_client");
        snprintf(lock, sizeof(lock), "%s/fakecuda-gpu0.exclusive", fake_dir);
        unlink(lock);
        cuda_stop(&d);
        /* No GPU left to pool: gpupoold does not start, and says why (auto does not pass it for a CPU node). */
        fake_node_new();
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s FAKECUDA_COMPUTE_MODES=prohibited,exclusive-process "
                 "%s/gpupoold --backend auto --socket /tmp/gp-never.sock 2>&1", getenv("GPUPOOL_LIBCUDA"), b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "every GPU (2) is in a compute mode that keeps it out of the pool"), "%s", out);
        ck_assert_msg(strstr(out, "its compute mode is PROHIBITED"), "%s", out);
        fake_node_done();
        unsetenv("FAKECUDA_COMPUTE_MODES");
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST


/* Another process's allocations, exported: a handle for each size, kept until told to go. */
struct exporter {
        size_t sizes[2];
        int up[2], go[2];               /* the handles come up; a byte down lets the exporter exit */
};

static int exporter_client(struct testd *d, void *arg) {
        struct exporter *x = arg;
        gp_cu_ipc_mem_handle h;
        gp_cu_deviceptr p[2];
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0)
                return 1;
        for (int i = 0; i < 2; i++)
                if (g.cu.cuMemAlloc(&p[i], x->sizes[i]) != GP_CUDA_SUCCESS || g.cu.cuIpcGetMemHandle(&h, p[i]) != GP_CUDA_SUCCESS ||
                    write(x->up[1], &h, sizeof(h)) != (ssize_t) sizeof(h))
                        return 2;
        if (read(x->go[0], &c, 1) != 1)
                return 3;
        return g.cu.cuMemFree(p[0]) == GP_CUDA_SUCCESS && g.cu.cuMemFree(p[1]) == GP_CUDA_SUCCESS ? 0 : 4;
}

static pid_t exporter_start(struct exporter *x, size_t a, size_t b, gp_cu_ipc_mem_handle *ret) {
        pid_t pid;

        x->sizes[0] = a;
        x->sizes[1] = b;
        ck_assert(pipe(x->up) == 0 && pipe(x->go) == 0);
        pid = spawn(exporter_client, NULL, x);
        for (int i = 0; i < 2; i++)
                ck_assert_int_eq(read(x->up[0], &ret[i], sizeof(ret[i])), sizeof(ret[i]));
        return pid;
}

static void exporter_stop(struct exporter *x, pid_t pid) {
        ck_assert_int_eq(write(x->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        for (int i = 0; i < 2; i++) {
                close(x->up[i]);
                close(x->go[i]);
        }
}

/*
 * In a PID namespace of its own (a container), a client of the cuda backend is refused at
 * hello, saying why; and, as with the driver, a handle exported outside does not open there.
 */
static int pidns_client(struct testd *d, void *arg) {
        gp_cu_ipc_mem_handle *h = arg;
        gpupool_client *c = NULL;
        pid_t pid;
        int status;

        if (unshare(CLONE_NEWPID) < 0)
                return 10;
        pid = fork();           /* the first child is the new namespace's pid 1 */
        if (pid < 0)
                return 11;
        if (pid == 0) {
                gp_cu_deviceptr p;
                struct gpu g;

                if (gpupool_connect(d->sock, "contained", &c) != -EACCES)
                        _exit(12);
                if (gpu_open(&g) < 0)
                        _exit(13);
                _exit(g.cu.cuIpcOpenMemHandle(&p, h[0], GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == GP_CUDA_ERROR_INVALID_CONTEXT ?
                      0 : 14);
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
                return 15;
        return WEXITSTATUS(status);
}

START_TEST(test_fake_pid_namespace_refused) {
        gp_cu_ipc_mem_handle h[2];
        char cmd[512], out[4096];
        struct exporter x;
        struct testd d;
        pid_t exporter;

        if (geteuid() != 0) {
                TEST_SKIP("making a PID namespace needs root");
                return;
        }

        cuda_start(&d, NULL, NULL);
        exporter = exporter_start(&x, 2 * MiB, 2 * MiB, h);
        ck_assert_int_eq(reap(spawn(pidns_client, &d, h)), 0);
        exporter_stop(&x, exporter);
        snprintf(cmd, sizeof(cmd), "grep -c 'runs in a PID namespace of its own, and IPC handles cannot be opened' %s", d.log);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        cuda_stop(&d);
}
END_TEST

static double now_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

/* Opens both handles and times each: the larger allocation must cost more, by the knobs. */
static int import_timer_client(struct testd *d, void *arg) {
        gp_cu_ipc_mem_handle *h = arg;
        double ms[2];
        struct gpu g;

        (void) d;
        if (gpu_open(&g) < 0)
                return 1;
        for (int i = 0; i < 2; i++) {
                gp_cu_deviceptr p;
                double t0 = now_ms();

                if (g.cu.cuIpcOpenMemHandle(&p, h[i], GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != GP_CUDA_SUCCESS)
                        return 2;
                ms[i] = now_ms() - t0;
                if (g.cu.cuIpcCloseMemHandle(p) != GP_CUDA_SUCCESS)
                        return 3;
        }
        /* 1 ms per MiB: 2 MiB take 2 ms and more, 64 MiB 64 ms and more. */
        if (ms[0] < 2.0 || ms[1] < 64.0 || ms[1] < ms[0] + 32.0) {
                fprintf(stderr, "import_timer_client: 2 MiB opened in %.1f ms, 64 MiB in %.1f ms\n", ms[0], ms[1]);
                return 4;
        }
        return 0;
}

START_TEST(test_fake_ipc_open_cost_grows_with_size) {
        gp_cu_ipc_mem_handle h[2];
        struct exporter x;
        pid_t exporter;

        setenv("FAKECUDA_IPC_OPEN_NS", "0", 1);
        setenv("FAKECUDA_IPC_OPEN_NS_PER_MIB", "1000000", 1);
        fake_node_new();
        exporter = exporter_start(&x, 2 * MiB, 64 * MiB, h);
        ck_assert_msg(reap(spawn(import_timer_client, NULL, h)) == 0, "opening a handle did not cost more for more memory");
        exporter_stop(&x, exporter);
        fake_node_done();
        unsetenv("FAKECUDA_IPC_OPEN_NS_PER_MIB");
        unsetenv("FAKECUDA_IPC_OPEN_NS");
}
END_TEST

/*
 * The legacy default stream waits for the work queued before on every blocking stream of its
 * context, and blocking streams wait for it; a non-blocking stream is ordered with neither.
 */
static int legacy_client(struct testd *d, void *arg) {
        gp_cu_stream blocking, nonblocking;
        gp_cu_event after_blocking, on_legacy, on_nonblocking;
        gp_cu_deviceptr p;
        unsigned char byte;
        struct gpu g;

        (void) d, (void) arg;
        if (gpu_open(&g) < 0 || g.cu.cuMemAlloc(&p, 4096) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&blocking, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&nonblocking, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&after_blocking, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&on_legacy, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&on_nonblocking, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                return 1;
        /* Held work on both streams: 1 on the blocking one, then 2 on the legacy stream. */
        if (gpu_hold(&g, blocking, 1) < 0 || gpu_hold(&g, nonblocking, 1) < 0 ||
            g.memset_d8_async(p, 1, 4096, blocking) != GP_CUDA_SUCCESS ||
            g.memset_d8_async(p + 2048, 7, 16, nonblocking) != GP_CUDA_SUCCESS ||
            g.memset_d8_async(p, 2, 2048, NULL) != GP_CUDA_SUCCESS ||
            g.cu.cuEventRecord(on_legacy, NULL) != GP_CUDA_SUCCESS ||
            g.cu.cuEventRecord(after_blocking, blocking) != GP_CUDA_SUCCESS)
                return 2;
        if (g.cu.cuEventQuery(on_legacy) != GP_CUDA_ERROR_NOT_READY)
                return 3;       /* the legacy stream ran before the blocking stream's work */
        /* Only the blocking stream goes on: the legacy stream follows it, the non-blocking one is still held. */
        if (gpu_hold(&g, blocking, 0) < 0 || g.cu.cuEventSynchronize(on_legacy) != GP_CUDA_SUCCESS ||
            g.cu.cuEventSynchronize(after_blocking) != GP_CUDA_SUCCESS)
                return 4;
        if (g.cu.cuEventRecord(on_nonblocking, nonblocking) != GP_CUDA_SUCCESS ||
            g.cu.cuEventQuery(on_nonblocking) != GP_CUDA_ERROR_NOT_READY)
                return 5;
        if (g.dtoh(&byte, p, 1) != GP_CUDA_SUCCESS || byte != 2)
                return 6;       /* the legacy stream's 2 came after the blocking stream's 1 */
        if (gpu_hold(&g, nonblocking, 0) < 0 || g.cu.cuStreamSynchronize(nonblocking) != GP_CUDA_SUCCESS)
                return 7;
        return g.cu.cuMemFree(p) == GP_CUDA_SUCCESS ? 0 : 8;
}

START_TEST(test_fake_legacy_stream_order) {
        fake_node_new();
        ck_assert_msg(reap(spawn(legacy_client, NULL, NULL)) == 0, "the legacy stream's order is not the driver's");
        fake_node_done();
}
END_TEST

static int rules_client(struct testd *d, void *arg) {
        gp_cu_result (*mem_alloc_v1)(unsigned *p, unsigned size);
        gp_cu_deviceptr p = 0, base = 0;
        gp_cu_ipc_mem_handle h;
        size_t size = 0;
        struct gpu g;

        (void) d, (void) arg;
        if (gpu_open(&g) < 0)
                return 1;
        /* cuMemAlloc at version 2000 is the 32-bit ABI; gp_cuda_load() got the 64-bit one. */
        *(void **) &mem_alloc_v1 = gp_cuda_symbol(&g.cu, "cuMemAlloc", 2000);
        if (!mem_alloc_v1 || (void *) mem_alloc_v1 == (void *) g.cu.cuMemAlloc || dlsym(g.cu.lib, "cuMemAlloc") == NULL)
                return 2;
        if (g.cu.cuMemAlloc(&p, 5ULL << 30) != GP_CUDA_SUCCESS || g.cu.cuMemGetAddressRange(&base, &size, p) != GP_CUDA_SUCCESS ||
            size != 5ULL << 30)
                return 3;       /* a size over 4 GiB survives the call */
        if (g.cu.cuIpcGetMemHandle(&h, p + 4096) != GP_CUDA_ERROR_INVALID_VALUE)
                return 4;       /* interior pointers are not exportable */
        if (g.cu.cuIpcGetMemHandle(&h, p) != GP_CUDA_SUCCESS)
                return 5;
        if (g.cu.cuIpcOpenMemHandle(&base, h, GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != GP_CUDA_ERROR_INVALID_CONTEXT)
                return 6;       /* not in the exporting process */
        if (g.cu.cuMemFree(p) != GP_CUDA_SUCCESS)
                return 7;
        return 0;
}

static void on_segv(int sig) {
        (void) sig;
        _exit(77);
}

static int deref_client(struct testd *d, void *arg) {
        struct sigaction sa = { .sa_handler = on_segv };
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "deref", &c) < 0 || gpupool_alloc(c, 0, 4096, &p) < 0)
                return 1;
        /* Our own handler, so that a sanitizer's does not report the fault we want. */
        sigaction(SIGSEGV, &sa, NULL);
        return *(volatile unsigned char *) p;   /* device memory: this must fault */
}

START_TEST(test_fake_driver_rules) {
        struct testd d;

        setenv("FAKECUDA_MEM", "8G", 1);
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(reap(spawn(rules_client, &d, NULL)), 0);
        {
                int status = reap(spawn(deref_client, &d, NULL));

                /* Under make valgrind, valgrind reports the read as invalid first (exit 99): as good a proof. */
                ck_assert_msg(status == 77 || (status == 99 && getenv("GPUPOOL_DAEMON_WRAPPER")),
                              "reading device memory from the CPU did not fault (exit %d)", status);
        }
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the faulted client's memory did not return");
        cuda_stop(&d);
        unsetenv("FAKECUDA_MEM");
}
END_TEST

void cuda_fake_add(TCase *tc) {
        tcase_add_test(tc, test_fake_visible_devices_renumbered);
        tcase_add_test(tc, test_fake_tenant_of_one_gpu);
        tcase_add_test(tc, test_fake_handle_opened_once_and_closed);
        tcase_add_test(tc, test_fake_stream_aware_cache);
        tcase_add_test(tc, test_fake_reaping_stops_at_pending_work);
        tcase_add_test(tc, test_fake_reaping_a_batch_costs_few_queries);
        tcase_add_test(tc, test_fake_one_fence_for_many_frees);
        tcase_add_test(tc, test_fake_stream_handle_reused);
        tcase_add_test(tc, test_fake_stream_calls_and_promises);
        tcase_add_test(tc, test_fake_event_error_is_not_done);
        tcase_add_test(tc, test_fake_compute_modes);
        tcase_add_test(tc, test_fake_pid_namespace_refused);
        tcase_add_test(tc, test_fake_driver_rules);
        tcase_add_test(tc, test_fake_legacy_stream_order);
        tcase_add_test(tc, test_fake_ipc_open_cost_grows_with_size);
}
