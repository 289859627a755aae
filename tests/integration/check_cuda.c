/*
 * check_cuda.c: gpupoold's cuda backend end to end, with real client processes that write
 * and read device memory through the driver API.
 *
 * The same tests run on two drivers. "make test" runs them on the fake driver
 * (tests/fakecuda, through $GPUPOOL_LIBCUDA), together with tests of things only the fake
 * can arrange: several GPUs renumbered by CUDA_VISIBLE_DEVICES, streams held still, the
 * driver's rules enforced. "make check-gpu" runs them on the real libcuda.so.1 of a GPU
 * machine (tests/check_gpu_main.c). Held work is held on both: the fake holds a stream
 * still; on a GPU the stream waits (cuStreamWaitValue32) for a word in host memory that the
 * test writes to let it go.
 *
 * This file holds the scenarios every backend must pass and the suites; the fake driver's own
 * rules are in check_cuda_fake.c, cuda-vmm's in check_cuda_vmm.c, the node's memory in
 * check_cuda_node.c, and what they share in cudatest.c.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudatest.h"
#include "suites.h"

/* ---- several clients' data ---- */

struct worker {
        int index;
        int rounds;
};

static int data_client(struct testd *d, void *arg) {
        enum { LIVE = 12 };
        static const size_t sizes[] = { 512, 4096, 100000, 1 * MiB, 3 * MiB, 12 * MiB, 30 * MiB };
        struct worker *w = arg;
        struct { void *p; size_t size; unsigned tag; } live[LIVE] = { 0 };
        unsigned seed = (unsigned) w->index * 7919u + 3, tag = (unsigned) w->index << 16;
        gpupool_client *c = NULL;
        struct gpu g;
        char name[32];

        if (gpu_open(&g) < 0)
                return 10;
        snprintf(name, sizeof(name), "gpu-worker-%d", w->index);
        if (gpupool_connect(d->sock, name, &c) < 0)
                return 11;
        for (int step = 0; step < w->rounds * LIVE; step++) {
                int s = (int) (rand_r(&seed) % LIVE);

                if (live[s].p) {
                        if (!pattern_intact(&g, live[s].p, live[s].size, live[s].tag))
                                return 12;
                        if (gpupool_free(c, live[s].p) < 0)
                                return 13;
                        live[s].p = NULL;
                } else {
                        live[s].size = sizes[rand_r(&seed) % (sizeof(sizes) / sizeof(sizes[0]))];
                        live[s].tag = ++tag;
                        if (gpupool_alloc(c, 0, live[s].size, &live[s].p) < 0)
                                return 14;
                        if (write_pattern(&g, live[s].p, live[s].size, live[s].tag) < 0)
                                return 15;
                }
        }
        for (int s = 0; s < LIVE; s++)
                if (live[s].p && !pattern_intact(&g, live[s].p, live[s].size, live[s].tag))
                        return 16;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_clients_data_intact) {
        BACKEND_OF_LOOP;
        enum { N = 4 };
        struct worker w[N];
        pid_t pids[N];
        struct testd d;

        cuda_start(&d, NULL, NULL);
        for (int i = 0; i < N; i++) {
                w[i] = (struct worker) { .index = i, .rounds = 8 };
                pids[i] = spawn(data_client, &d, &w[i]);
        }
        for (int i = 0; i < N; i++)
                ck_assert_msg(reap(pids[i]) == 0, "client %d found its data damaged or failed", i);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

/* ---- a killed client ---- */

static int gpu_holder(struct testd *d, void *arg) {
        int *fds = arg;
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "gpu-holder", &c) < 0 ||
            gpupool_alloc(c, 0, 24 * MiB, &p) < 0 || write_pattern(&g, p, 24 * MiB, 7) < 0)
                return 1;
        if (write(fds[1], "x", 1) != 1)
                return 2;
        for (;;)
                pause();
}

START_TEST(test_cuda_killed_client_memory_returns) {
        BACKEND_OF_LOOP;
        struct testd d;
        int fds[2];
        char ch;
        pid_t pid;

        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(pipe(fds), 0);
        pid = spawn(gpu_holder, &d, fds);
        ck_assert_int_eq(read(fds[0], &ch, 1), 1);
        ck_assert_int_ge(testd_device(&d, 0, "reserved_bytes"), 24 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        kill(pid, SIGKILL);
        ck_assert_int_eq(reap(pid), 128 + SIGKILL);
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the killed client's memory did not return");
        /* Its segment is cached, and a new client can have it (the daemon frees it at stop: see cuda_stop). */
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), testd_device(&d, 0, "reserved_bytes"));
        cuda_stop(&d);
}
END_TEST

/*
 * A process killed while its device work runs on gpupool memory: it queues memsets over a
 * block, about a second of them on a GPU, and is killed while they run. Its memory goes back;
 * a process of the same uid takes that very segment from the cache and writes its own bytes;
 * once the dead one's work would have ended they are intact and its context sound. On a GPU
 * the driver must have stopped the dead process's work before its exit completed (the pidfd
 * the daemon watches); on the fake driver the work, held, dies with the process's threads.
 */
#define KILLED_BLOCK (on_gpu ? 1024 * MiB : 16 * MiB)
#define KILLED_MEMSETS (on_gpu ? 3000 : 50)

static int busy_victim(struct testd *d, void *arg) {
        int *fds = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s;
        gp_cu_event e;
        struct gpu g;
        void *p;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "busy-victim", &c) < 0 ||
            gpupool_alloc(c, 0, KILLED_BLOCK, &p) < 0 || g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&e, 0) != GP_CUDA_SUCCESS)
                return 1;
        /* On the fake the stream is held: its memsets are still to run when it is killed. */
        if (!on_gpu && gpu_hold(&g, s, 1) < 0)
                return 1;
        for (int i = 0; i < KILLED_MEMSETS; i++)
                if (g.memset_d8_async(dptr(p), 0xaa, KILLED_BLOCK, s) != GP_CUDA_SUCCESS)
                        return 2;
        if (g.cu.cuEventRecord(e, s) != GP_CUDA_SUCCESS || g.cu.cuEventQuery(e) != GP_CUDA_ERROR_NOT_READY)
                return 3;       /* it must still be running when it is killed */
        if (write(fds[1], "x", 1) != 1)
                return 4;
        for (;;)
                pause();
}

static int after_victim(struct testd *d, void *arg) {
        long long *cached = arg;
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "after-victim", &c) < 0 ||
            gpupool_alloc(c, 0, KILLED_BLOCK, &p) < 0)
                return 1;
        /* The dead one's memory, from the cache (a process growing in place may lease granules ahead too). */
        if (testd_device(d, 0, "cached_bytes") > *cached - (long long) KILLED_BLOCK) {
                fprintf(stderr, "after the killed client: %lld bytes cached, %lld before\n", testd_device(d, 0, "cached_bytes"),
                        *cached);
                return 2;
        }
        if (write_pattern(&g, p, KILLED_BLOCK, 11) < 0 || g.cu.cuCtxSynchronize() != GP_CUDA_SUCCESS)
                return 3;
        usleep(on_gpu ? 1500 * 1000 : 200 * 1000);     /* longer than the dead one's work would have run */
        if (!pattern_intact(&g, p, KILLED_BLOCK, 11))
                return 4;       /* the dead process's memsets landed after its death */
        if (g.cu.cuCtxSynchronize() != GP_CUDA_SUCCESS || gpupool_free(c, p) < 0)
                return 5;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_killed_with_work_running) {
        BACKEND_OF_LOOP;
        long long cached;
        struct testd d;
        int fds[2], status;
        char ch;
        pid_t pid;

        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(pipe(fds), 0);
        pid = spawn(busy_victim, &d, fds);
        ck_assert_msg(read(fds[0], &ch, 1) == 1, "the victim failed at step %d", reap(pid));
        kill(pid, SIGKILL);
        ck_assert_int_eq(reap(pid), 128 + SIGKILL);
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the killed client's memory did not return");
        cached = testd_device(&d, 0, "cached_bytes");
        ck_assert_int_ge(cached, (long long) KILLED_BLOCK);
        status = reap(spawn(after_victim, &d, &cached));
        ck_assert_msg(status == 0, "the process after the killed one failed at step %d", status);
        close(fds[0]);
        close(fds[1]);
        cuda_stop(&d);
}
END_TEST

/* ---- limits ---- */

static int limit_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        char msg[512];
        void *a, *b;

        (void) arg;
        if (gpupool_connect(d->sock, "limited", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, 40 * MiB, &a) < 0)
                return 2;
        if (gpupool_alloc(c, 0, 40 * MiB, &b) != -EDQUOT)
                return 3;
        gpupool_last_error(c, msg, sizeof(msg));
        if (!strstr(msg, "--client-limit"))
                return 4;
        if (gpupool_free(c, a) < 0)
                return 5;
        gpupool_disconnect(c);
        return 0;
}

static int oversize_client(struct testd *d, void *arg) {
        long long total = *(long long *) arg;
        gpupool_client *c = NULL;
        char msg[512];
        void *a, *b;

        /* More than the device holds is no quota matter: -ENOMEM, said so, and nothing is lost. */
        if (gpupool_connect(d->sock, "greedy", &c) < 0 || gpupool_alloc(c, 0, 4096, &a) < 0)
                return 1;
        if (gpupool_alloc(c, 0, (size_t) total + 2 * MiB, &b) != -ENOMEM)
                return 2;
        gpupool_last_error(c, msg, sizeof(msg));
        if (!strstr(msg, "can never fit") || !strstr(msg, "in all"))
                return 3;
        if (gpupool_free(c, a) < 0)
                return 4;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_limits_hold) {
        BACKEND_OF_LOOP;
        struct testd d;
        long long total;

        cuda_start(&d, "--client-limit", "64M");
        total = testd_device(&d, 0, "total_bytes");
        ck_assert_int_gt(total, 0);
        ck_assert_int_eq(reap(spawn(limit_client, &d, &total)), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
        (void) choose_backend(_i);      /* the loop's backend again (cuda_stop() went back to the legacy one) */
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "total_bytes"), total);
        ck_assert_int_eq(reap(spawn(oversize_client, &d, &total)), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

/* ---- stream-ordered free ---- */

/*
 * Frees a block with gpupool_free_async() behind long device work and checks that the call
 * returns at once, that the block is not handed out again (to this process or, by the
 * daemon, to anyone) while the work runs, and that it returns once the work is done.
 */
static int free_async_client(struct testd *d, void *arg) {
        const size_t size = 64 * MiB;
        void *fail_page = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s;
        gp_cu_event done;
        struct gpu g;
        void *a, *b;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "async", &c) < 0)
                FAIL();
        if (g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_alloc(c, 0, size, &a) < 0 || queue_work(&g, s, a, size) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_free_async(c, a, s) < 0)
                FAIL();
        /* The call returned while the work still runs: it did not wait for it. */
        if (g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                FAIL();
        if (gpupool_alloc(c, 0, size, &b) < 0 || b == a)
                FAIL();         /* handed out again under running work */
        /* Its segment stays leased to this process: nobody else can get it either. */
        if (testd_device(d, 0, "reserved_bytes") - testd_device(d, 0, "cached_bytes") < (long long) (2 * size))
                FAIL();
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS)
                FAIL();
        /* Once the work is done the block goes back without another call of ours (as the daemon hears). */
        if (!testd_device_becomes(d, 0, "in_use_bytes", (long long) size))
                FAIL();
        if (gpupool_free(c, b) < 0)
                FAIL();
        /* Bad frees are refused at once, with nothing queued. */
        if (gpupool_free_async(c, a, s) != -ENOENT || gpupool_free_async(c, NULL, s) != -ENOENT)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}


/*
 * A handle disconnected with blocks live lets go of every descriptor it kept for them, as of
 * every handle and mapping: one kept past the handle would keep the memory alive with it.
 */
static int disconnect_keeps_nothing_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        void *p, *q;
        int before;

        (void) arg;
        /* The driver's own descriptors, opened once, are there before the count. */
        if (gpupool_connect(d->sock, "warm", &c) < 0 || gpupool_alloc(c, 0, 4096, &p) < 0 || gpupool_free(c, p) < 0)
                return 1;
        gpupool_disconnect(c);
        before = fds_from(0);
        if (gpupool_connect(d->sock, "holding", &c) < 0 || gpupool_alloc(c, 0, 8 << 20, &p) < 0 ||
            gpupool_alloc(c, 0, 100000, &q) < 0)
                return 2;
        gpupool_disconnect(c);
        if (fds_from(0) != before) {
                fprintf(stderr, "disconnect_keeps_nothing_client: %d descriptors open before, %d after\n", before,
                        fds_from(0));
                return 3;
        }
        return 0;
}

/*
 * No backend of CUDA keeps a descriptor per segment: cuda-vmm holds the driver's handles and
 * mappings, and exports a descriptor only when a daemon after this one asks to adopt (a
 * descriptor per 2 MiB would run into the limit of a process holding a GPU's worth); the legacy
 * backend has none. And a forked child (which cannot use CUDA) holds none either.
 */
static int fork_keeps_nothing_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        void *p, *q;
        int kept;

        (void) arg;
        if (gpupool_connect(d->sock, "forking", &c) < 0 || gpupool_alloc(c, 0, 8 << 20, &p) < 0 ||
            gpupool_alloc(c, 0, 100000, &q) < 0)
                return 1;
        kept = fds_from(1024);
        if (kept != 0)
                return 2;
        if (fds_from_in_child(1024) != 0 || fds_from(1024) != kept)
                return 3;
        if (gpupool_free(c, p) < 0 || gpupool_free(c, q) < 0)
                return 4;
        gpupool_disconnect(c);
        return fds_from(1024) == 0 ? 0 : 5;
}

START_TEST(test_cuda_fork_keeps_no_descriptor) {
        BACKEND_OF_LOOP;
        if (under_valgrind()) {
                TEST_SKIP("valgrind keeps descriptors of its own at the top of the table");
                return;
        }
        run_client(fork_keeps_nothing_client, "fork_keeps_nothing_client");
}
END_TEST

START_TEST(test_cuda_disconnect_keeps_no_descriptor) {
        BACKEND_OF_LOOP;
        run_client(disconnect_keeps_nothing_client, "disconnect_keeps_nothing_client");
}
END_TEST

START_TEST(test_cuda_free_async_waits_for_stream) {
        BACKEND_OF_LOOP;
        run_client(free_async_client, "free_async_client");
}
END_TEST

/*
 * The process's own pool on CUDA: each leased segment's handle is opened
 * once and kept while the blocks in it come and go; a block freed on a stream is reused at
 * once on that stream, by nobody else until its work ends; data stays intact; trimmed, every
 * handle is closed and every segment back with the daemon.
 */
static int process_pool_client(struct testd *d, void *arg) {
        static const size_t sizes[] = { 4096, 3 << 20, 700 << 10, 1 << 20, 24 << 20 };
        void *fail_page = arg;
        const char *segments = getenv("GPUPOOL_SEGMENTS");
        struct gpupool_grow_stats gfirst, gst;
        struct gpupool_stats first, st;
        gpupool_client *c = NULL;
        gp_cu_stream s, other;
        gp_cu_event done;
        struct gpu g;
        void *a, *b, *plain, *on_other, *p[5];

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "process-pool", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                FAIL();
        for (int round = 0; round < 20; round++) {
                for (int i = 0; i < 5; i++)
                        if (gpupool_alloc(c, 0, sizes[i], &p[i]) < 0 || write_pattern(&g, p[i], sizes[i], (unsigned) (round * 5 + i)) < 0)
                                FAIL();
                for (int i = 0; i < 5; i++)
                        if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (round * 5 + i)) || gpupool_free(c, p[i]) < 0)
                                FAIL();
                if (round == 0 && (gpupool_stats(c, &first) < 0 || gpupool_grow_stats(c, &gfirst) < 0))
                        FAIL();
        }
        if (gpupool_stats(c, &st) < 0 || st.segments_imported != first.segments_imported ||
            st.round_trips != first.round_trips)
                FAIL();         /* the rounds after the first asked and opened nothing */
        /* Nor mapped or unmapped a granule (cuMemMap, cuMemUnmap), where the segments grow in place. */
        if (gpupool_grow_stats(c, &gst) < 0 || gst.granules_mapped != gfirst.granules_mapped ||
            gst.granules_unmapped != gfirst.granules_unmapped ||
            (segments && strcmp(segments, "grow") == 0) != (gfirst.granules_mapped > 0))
                FAIL();
        /* Granules mapped side by side are made accessible together: fewer cuMemSetAccess than granules (24 MiB is 12). */
        if (!on_gpu && gst.granules_mapped && g.set_access_calls() >= gst.granules_mapped)
                FAIL();
        if (!on_gpu && g.open_handles() != (int) st.mapped_segments)
                FAIL();         /* one open handle per leased segment, kept while empty */
        /* Freed on a stream under running work: reused on that stream at once, by nobody else. */
        if (gpupool_alloc(c, 0, 1 << 20, &a) < 0 || queue_work(&g, s, a, 1 << 20) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS || gpupool_free_async(c, a, s) < 0)
                FAIL();
        if (gpupool_alloc(c, 0, 1 << 20, &plain) < 0 || plain == a ||
            gpupool_alloc_async(c, 0, 1 << 20, other, &on_other) < 0 || on_other == a)
                FAIL();
        if (gpupool_alloc_async(c, 0, 1 << 20, s, &b) < 0 || b != a)
                FAIL();
        if (g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                FAIL();
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || gpupool_free(c, b) < 0 || gpupool_free(c, plain) < 0 ||
            gpupool_free(c, on_other) < 0)
                FAIL();
        /* Trimmed: every segment goes back, its handle closed first. */
        if (gpupool_trim(c) < 0 || gpupool_stats(c, &st) < 0 || st.mapped_segments != 0)
                FAIL();
        if (!on_gpu && g.open_handles() != 0)
                FAIL();
        if (testd_device(d, 0, "reserved_bytes") != testd_device(d, 0, "cached_bytes"))
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_process_pool) {
        BACKEND_OF_LOOP;
        run_client(process_pool_client, "process_pool_client");
}
END_TEST

/*
 * The framework hooks on the CUDA side: PyTorch's free is ordered on the stream it names, so
 * the block is not handed to another allocation (CuPy's here) while the work queued before
 * the free runs; the hooks connect by $GPUPOOL_SOCKET and take the process's device ordinal.
 * CuPy's free names no stream: it is ordered on the stream the block was allocated on (the
 * current one gpupool_cupy_stream() said), so CuPy's next allocation on that stream takes it
 * at once, and one on the legacy stream (which does not wait for a non-blocking stream) does
 * not.
 */
static int hooks_client(struct testd *d, void *arg) {
        const size_t size = 64 * MiB;
        void *fail_page = arg;
        gpupool_client *const c = NULL;        /* the hooks' own: errors come from gpupool_hook_last_error() */
        gp_cu_stream s;
        gp_cu_event done;
        struct gpu g;
        void *a, *b, *other;

        setenv("GPUPOOL_SOCKET", d->sock, 1);
        setenv("GPUPOOL_CLIENT_NAME", "torch-hooked", 1);
        if (gpu_open(&g) < 0 || g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                FAIL();
        a = gpupool_torch_alloc((ssize_t) size, 0, (struct CUstream_st *) s);
        if (!a || queue_work(&g, s, a, size) < 0 || g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_torch_free(a, (ssize_t) size, 0, (struct CUstream_st *) s);
        if (gpupool_hook_last_error(NULL, 0) != 0 || g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                FAIL();
        b = gpupool_cupy_malloc(NULL, size, 0);
        if (!b || b == a)
                FAIL();         /* handed out again under running work */
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_cupy_free(NULL, b, 0);
        if (gpupool_hook_last_error(NULL, 0) != 0)
                FAIL();
        gpupool_cupy_stream((struct CUstream_st *) s);
        b = gpupool_cupy_malloc(NULL, size, 0);
        if (!b || queue_work(&g, s, b, size) < 0 || g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_cupy_free(NULL, b, 0);
        gpupool_cupy_stream(NULL);
        a = gpupool_cupy_malloc(NULL, size, 0);
        gpupool_cupy_stream((struct CUstream_st *) s);
        other = gpupool_cupy_malloc(NULL, size, 0);
        if (!a || a == b || other != b || g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                FAIL();         /* the legacy stream's allocation got it under running work, or s's did not */
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_cupy_free(NULL, other, 0);
        gpupool_cupy_stream(NULL);
        gpupool_cupy_free(NULL, a, 0);
        if (gpupool_hook_last_error(NULL, 0) != 0)
                FAIL();
        /* Everything goes back without another call of ours. */
        if (!testd_device_becomes(d, 0, "in_use_bytes", 0))
                FAIL();
        return 0;
}

START_TEST(test_cuda_framework_hooks_stream_ordered) {
        BACKEND_OF_LOOP;
        run_client(hooks_client, "hooks_client");
}
END_TEST

struct releaser {
        struct gpu *g;
        gp_cu_stream s;
};

static void *release_later(void *arg) {
        struct releaser *r = arg;
        struct timespec ts = { 0, 200 * 1000000L };

        /* Not a wait for something to happen: the test holds whatever the timing. */
        nanosleep(&ts, NULL);
        release_work(r->g, r->s);
        return NULL;
}

static int disconnect_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        gp_cu_stream s;
        gp_cu_event done;
        struct releaser rel;
        pthread_t t;
        struct gpu g;
        void *a;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "leaver", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                return 1;
        if (gpupool_alloc(c, 0, 64 * MiB, &a) < 0 || queue_work(&g, s, a, 64 * MiB) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS || gpupool_free_async(c, a, s) < 0)
                return 2;
        rel = (struct releaser) { &g, s };
        pthread_create(&t, NULL, release_later, &rel);
        gpupool_disconnect(c);
        /* Disconnect gave the memory back: the work on it must have ended first. */
        if (g.cu.cuEventQuery(done) != GP_CUDA_SUCCESS)
                return 3;
        pthread_join(t, NULL);
        return 0;
}

START_TEST(test_cuda_disconnect_waits_for_pending_frees) {
        BACKEND_OF_LOOP;
        run_client(disconnect_client, "disconnect_client");
}
END_TEST


/* The CPU time this process has used, in ms. */
static double cpu_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/*
 * A free pending behind device work does not cost the process a core: the reaper waits
 * asleep (an event made without CU_EVENT_BLOCKING_SYNC spins in cuEventSynchronize).
 */
static int idle_wait_client(struct testd *d, void *arg) {
        const size_t size = 64 * MiB;
        void *fail_page = arg;
        struct timespec second = { 1, 0 };
        gpupool_client *c = NULL;
        gp_cu_stream s;
        gp_cu_event done;
        struct gpu g;
        double spent;
        void *a;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "idle-wait", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_alloc(c, 0, size, &a) < 0 || queue_work(&g, s, a, size) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS || gpupool_free_async(c, a, s) < 0)
                FAIL();
        spent = cpu_ms();
        nanosleep(&second, NULL);       /* the scenario: a second with a free pending, not a wait for an event */
        spent = cpu_ms() - spent;
        if (g.cu.cuEventQuery(done) != GP_CUDA_ERROR_NOT_READY)
                FAIL();
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS)
                FAIL();
        if (spent >= 50) {
                fprintf(stderr, "idle_wait_client: %.1f ms of CPU in a second with one free pending\n", spent);
                FAIL();
        }
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_pending_free_costs_no_cpu) {
        BACKEND_OF_LOOP;
        run_client(idle_wait_client, "idle_wait_client");
}
END_TEST

/*
 * gpupool_disconnect() gives the memory back only once the work this process queued on it
 * has ended, freed or not: the daemon may hand it to another uid at once.
 */
static int disconnect_busy_client(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s;
        gp_cu_event done;
        struct releaser rel;
        pthread_t t;
        struct gpu g;
        void *a;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "busy-leaver", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuEventCreate(&done, GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS)
                FAIL();
        /* Still allocated: the application never freed it, and its kernels still write it. */
        if (gpupool_alloc(c, 0, 64 * MiB, &a) < 0 || queue_work(&g, s, a, 64 * MiB) < 0 ||
            g.cu.cuEventRecord(done, s) != GP_CUDA_SUCCESS)
                FAIL();
        rel = (struct releaser) { &g, s };
        pthread_create(&t, NULL, release_later, &rel);
        gpupool_disconnect(c);
        if (g.cu.cuEventQuery(done) != GP_CUDA_SUCCESS)
                FAIL();         /* bye went out while our work still wrote the memory */
        pthread_join(t, NULL);
        return 0;
}

START_TEST(test_cuda_disconnect_waits_for_device_work) {
        BACKEND_OF_LOOP;
        run_client(disconnect_busy_client, "disconnect_busy_client");
}
END_TEST

/*
 * CUDA graph capture: a free on a capturing stream is refused, the block staying the
 * application's; an allocation on it (as PyTorch's during a capture) is served; the
 * library's own driver calls during a global-mode capture (the reaper's waits, an allocation
 * that maps a new segment) do not invalidate the capture. cuStreamGetId on a capturing
 * stream would: the driver refuses it and invalidates the capture, in every mode.
 */
static int capture_client(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        gp_cu_stream s, other;
        struct gpu g;
        void *graph = NULL, *a, *b, *big, *in_graph;
        char err[512];

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "capture", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                FAIL();
        /* A free pending on another stream, which the reaper will wait for during the capture. */
        if (gpupool_alloc(c, 0, 1 * MiB, &b) < 0 || queue_work(&g, other, b, 1 * MiB) < 0 ||
            gpupool_free_async(c, b, other) < 0 || gpupool_alloc(c, 0, 1 * MiB, &a) < 0)
                FAIL();
        if (g.begin_capture(s, GP_CU_STREAM_CAPTURE_MODE_GLOBAL) != GP_CUDA_SUCCESS)
                FAIL();
        if (gpupool_free_async(c, a, s) != -EBUSY)
                FAIL();
        gpupool_last_error(c, err, sizeof(err));
        if (!strstr(err, "capturing a CUDA graph"))
                FAIL();
        /* With a free pending (on other): the allocation looks for a block freed on its stream. */
        if (gpupool_alloc_async(c, 0, 1 * MiB, s, &in_graph) < 0)
                FAIL();
        release_work(&g, other);
        /* An allocation that leases and maps a new segment, and reaps, in the capturing thread. */
        if (gpupool_alloc(c, 0, 40 * MiB, &big) < 0)
                FAIL();
        if (g.end_capture(s, &graph) != GP_CUDA_SUCCESS || !graph)
                FAIL();         /* our calls invalidated the application's capture */
        (void) g.graph_destroy(graph);
        /* The refused block is still the application's. */
        if (gpupool_free(c, a) < 0 || gpupool_free(c, big) < 0 || gpupool_free(c, in_graph) < 0 ||
            g.cu.cuStreamSynchronize(other) != GP_CUDA_SUCCESS)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_graph_capture) {
        BACKEND_OF_LOOP;
        run_client(capture_client, "capture_client");
}
END_TEST

/* ---- tenants ---- */

static int dirty_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "root", &c) < 0 || gpupool_alloc(c, 0, 64 * 1024, &p) < 0 ||
            write_pattern(&g, p, 64 * 1024, 99) < 0 || gpupool_free(c, p) < 0)
                return 1;
        gpupool_disconnect(c);
        return 0;
}

static int nobody_client(struct testd *d, void *arg) {
        uint8_t buf[64 * 1024];
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        /* The fake driver from where the other uid can read it (the build directory may be private). */
        if (arg)
                setenv("GPUPOOL_LIBCUDA", arg, 1);
        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "nobody", &c) < 0 || gpupool_alloc(c, 0, sizeof(buf), &p) < 0)
                return 21;
        if (g.dtoh(buf, dptr(p), sizeof(buf)) != GP_CUDA_SUCCESS)
                return 22;
        for (size_t i = 0; i < sizeof(buf); i++)
                if (buf[i])
                        return 23;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_cuda_segment_zeroed_across_uids) {
        BACKEND_OF_LOOP;
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        ck_assert_int_eq(reap(spawn(dirty_client, &d, NULL)), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        {
                char lib[256];
                const char *fake = on_gpu ? NULL : getenv("GPUPOOL_LIBCUDA");

                ck_assert_int_eq(reap(spawn(nobody_client, &d,
                                            fake ? (void *) testd_copy_for_others(&d, fake, lib, sizeof(lib)) : NULL)), 0);
                if (fake)
                        unlink(lib);
        }
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 2 * MiB);     /* the same segment, zeroed */
        cuda_stop(&d);
}
END_TEST

/* ---- fake driver only ---- */

/* A client of uid 0 that leases new memory: it must be served while the daemon zeroes for another. */
static int bystander_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        struct gpu g;
        void *p;

        (void) arg;
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "bystander", &c) < 0 || gpupool_alloc(c, 0, 3 * MiB, &p) < 0 ||
            gpupool_free(c, p) < 0)
                return 1;
        gpupool_disconnect(c);
        return 0;
}

/*
 * The daemon never waits for the GPU in its loop: while the zeroing of a segment that changes
 * tenant is held on the device, the lease that needs it waits, parked, and another client is
 * served; once the zeroing ends, the lease gets the segment, zero.
 */
START_TEST(test_fake_zeroing_does_not_block_the_daemon) {
        char lib[256], gate[128], cmd[512], out[256];
        const char *fake = getenv("GPUPOOL_LIBCUDA");
        struct testd d;
        pid_t waiter, bystander;
        int fd, status = -1;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        ck_assert_int_eq(reap(spawn(dirty_client, &d, NULL)), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        /* Hold every memset: the daemon's zeroing will not end until we let it. */
        snprintf(gate, sizeof(gate), "%s/fakecuda-memsets.hold", fake_dir);
        fd = open(gate, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(flock(fd, LOCK_EX), 0);
        waiter = spawn(nobody_client, &d, (void *) testd_copy_for_others(&d, fake, lib, sizeof(lib)));
        snprintf(cmd, sizeof(cmd), "for i in $(seq 500); do grep -q 'waits for a segment being zeroed' %s && exit 0; "
                 "sleep 0.01; done; exit 1", d.log);
        if (run_capture(cmd, out, sizeof(out)) != 0) {
                flock(fd, LOCK_UN);
                ck_abort_msg("the lease never waited for the zeroing: the daemon zeroes in its loop");
        }
        /* The loop is free: another client leases (a new segment) and leaves, within 5 s. */
        bystander = spawn(bystander_client, &d, NULL);
        for (int i = 0; i < 500 && waitpid(bystander, &status, WNOHANG) == 0; i++)
                nanosleep(&(struct timespec){ 0, 10 * 1000000L }, NULL);
        if (status == -1) {
                flock(fd, LOCK_UN);     /* let the daemon go before failing */
                ck_abort_msg("a client was not served while a zeroing was held: the daemon waited for the GPU");
        }
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bystander_client failed");
        ck_assert_int_eq(testd_device(&d, 0, "zeroing_bytes"), 2 * MiB);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics | grep -c '^gpupool_device_zeroing_bytes{.*} 2097152$'",
                 build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "no zeroing in the metrics: %s", out);
        /* Let the zeroing end: the parked lease gets the segment, and reads zeros. */
        ck_assert_int_eq(flock(fd, LOCK_UN), 0);
        close(fd);
        ck_assert_int_eq(reap(waiter), 0);
        unlink(lib);
        unlink(gate);
        ck_assert_int_eq(testd_device(&d, 0, "zeroing_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

static void add_common(TCase *tc) {
        tcase_add_loop_test(tc, test_cuda_clients_data_intact, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_killed_client_memory_returns, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_killed_with_work_running, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_limits_hold, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_free_async_waits_for_stream, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_disconnect_keeps_no_descriptor, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_fork_keeps_no_descriptor, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_disconnect_waits_for_pending_frees, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_framework_hooks_stream_ordered, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_segment_zeroed_across_uids, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_process_pool, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_pending_free_costs_no_cpu, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_disconnect_waits_for_device_work, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_graph_capture, 0, BACKEND_LOOPS);
        cuda_vmm_add_common(tc);
}

/* Every daemon and client of the fake suite loads the fake driver; the other suites must not. */
static void use_fake_driver(void) {
        char lib[512], *abs;

        snprintf(lib, sizeof(lib), "%s/tests/libfakecuda.so", build_dir());
        /* Clients may run elsewhere than here: make the path absolute. */
        abs = realpath(lib, NULL);
        setenv("GPUPOOL_LIBCUDA", abs ? abs : lib, 1);
        free(abs);
}

static void stop_using_fake_driver(void) {
        unsetenv("GPUPOOL_LIBCUDA");
}

Suite *suite_cuda_fake(void) {
        Suite *s = suite_create("cuda-fake");
        TCase *tc = tcase_create("fake driver");

        on_gpu = false;
        tcase_add_unchecked_fixture(tc, use_fake_driver, stop_using_fake_driver);
        add_common(tc);
        tcase_add_test(tc, test_fake_zeroing_does_not_block_the_daemon);
        cuda_fake_add(tc);
        cuda_vmm_add_fake(tc);
        cuda_node_add(tc);
        cuda_run_add(tc);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}

Suite *suite_cuda_gpu(void) {
        Suite *s = suite_create("cuda-gpu");
        TCase *tc = tcase_create("real GPU");

        on_gpu = true;
        add_common(tc);
        tcase_set_timeout(tc, 300);
        suite_add_tcase(s, tc);
        return s;
}
