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
 * Only the client processes a test spawns touch CUDA: a process forked after cuInit cannot
 * use the driver, on a real GPU as on the fake.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gpupool.h"
#include "suites.h"
#include "testlib.h"
#include "wire.h"

#define MiB (1ULL << 20)

static bool on_gpu;                     /* the real driver (make check-gpu) */
static char fake_dir[64];

/* What a client process needs of the driver beyond what libgpupool uses. */
struct gpu {
        struct gp_cuda cu;
        gp_cu_context ctx;
        gp_cu_result (*memset_d32)(gp_cu_deviceptr p, unsigned v, size_t n);
        gp_cu_result (*memset_d8_async)(gp_cu_deviceptr p, unsigned char v, size_t n, gp_cu_stream s);
        gp_cu_result (*htod)(gp_cu_deviceptr dst, const void *src, size_t n);
        gp_cu_result (*dtoh)(void *dst, gp_cu_deviceptr src, size_t n);
        gp_cu_result (*begin_capture)(gp_cu_stream s, int mode);
        gp_cu_result (*end_capture)(gp_cu_stream s, void **graph);
        gp_cu_result (*graph_destroy)(void *graph);
        int (*hold)(gp_cu_stream s, int hold);  /* fake only; gpu_hold() on a GPU */
        gp_cu_result (*host_alloc)(void **p, size_t n, unsigned flags);                 /* GPU only */
        gp_cu_result (*host_device_ptr)(gp_cu_deviceptr *d, void *p, unsigned flags);   /* GPU only */
        gp_cu_result (*wait_value32)(gp_cu_stream s, gp_cu_deviceptr addr, uint32_t v, unsigned flags); /* GPU only */
        volatile uint32_t *gates;               /* GPU only: a word per hold, 1 lets its stream go */
        gp_cu_deviceptr gates_dev;
        int ngates;
        struct { gp_cu_stream s; int gate; } held[16];
        int (*open_handles)(void);              /* fake only */
        unsigned long long (*event_queries)(void);      /* fake only */
        unsigned long long (*set_access_calls)(void);   /* fake only */
        void (*fail_events)(int r);             /* fake only */
        void (*release_all)(void);              /* fake only */
        int (*run)(gp_cu_stream s, unsigned n); /* fake only: n more operations of a held stream */
};

/* In a client process: the driver, and device 0's primary context made current. */
static int gpu_open(struct gpu *g) {
        char err[256];
        gp_cu_device dev;

        if (gp_cuda_load(&g->cu, err, sizeof(err)) < 0) {
                fprintf(stderr, "client: %s\n", err);
                return -1;
        }
        *(void **) &g->memset_d32 = gp_cuda_symbol(&g->cu, "cuMemsetD32", 3020);
        *(void **) &g->memset_d8_async = gp_cuda_symbol(&g->cu, "cuMemsetD8Async", 3020);
        *(void **) &g->htod = gp_cuda_symbol(&g->cu, "cuMemcpyHtoD", 3020);
        *(void **) &g->dtoh = gp_cuda_symbol(&g->cu, "cuMemcpyDtoH", 3020);
        *(void **) &g->begin_capture = gp_cuda_symbol(&g->cu, "cuStreamBeginCapture", 10010);
        *(void **) &g->end_capture = gp_cuda_symbol(&g->cu, "cuStreamEndCapture", 10000);
        *(void **) &g->graph_destroy = gp_cuda_symbol(&g->cu, "cuGraphDestroy", 10000);
        if (!on_gpu) {
                *(void **) &g->hold = dlsym(g->cu.lib, "fakecuda_stream_hold");
                *(void **) &g->open_handles = dlsym(g->cu.lib, "fakecuda_open_handles");
                *(void **) &g->event_queries = dlsym(g->cu.lib, "fakecuda_event_queries");
                *(void **) &g->set_access_calls = dlsym(g->cu.lib, "fakecuda_set_access_calls");
                *(void **) &g->fail_events = dlsym(g->cu.lib, "fakecuda_fail_events");
                *(void **) &g->release_all = dlsym(g->cu.lib, "fakecuda_release_all");
                *(void **) &g->run = dlsym(g->cu.lib, "fakecuda_stream_run");
        } else {
                *(void **) &g->host_alloc = gp_cuda_symbol(&g->cu, "cuMemHostAlloc", 3020);
                *(void **) &g->host_device_ptr = gp_cuda_symbol(&g->cu, "cuMemHostGetDevicePointer", 3020);
                *(void **) &g->wait_value32 = gp_cuda_symbol(&g->cu, "cuStreamWaitValue32", 12000);
        }
        g->ngates = 0;
        memset(g->held, 0, sizeof(g->held));
        if (!g->memset_d32 || !g->memset_d8_async || !g->htod || !g->dtoh || !g->begin_capture || !g->end_capture ||
            !g->graph_destroy ||
            g->cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS || g->cu.cuDevicePrimaryCtxRetain(&g->ctx, dev) != GP_CUDA_SUCCESS ||
            g->cu.cuCtxPushCurrent(g->ctx) != GP_CUDA_SUCCESS)
                return -1;
        if (on_gpu) {
                void *host;

                if (!g->host_alloc || !g->host_device_ptr || !g->wait_value32 ||
                    g->host_alloc(&host, 4096, 0x01 | 0x02 /* PORTABLE | DEVICEMAP */) != GP_CUDA_SUCCESS ||
                    g->host_device_ptr(&g->gates_dev, host, 0) != GP_CUDA_SUCCESS) {
                        fprintf(stderr, "client: no host-mapped memory for cuStreamWaitValue32\n");
                        return -1;
                }
                g->gates = host;
        }
        return 0;
}

/*
 * Holds stream s still (hold 1) until it is let go (hold 0): on the fake by its own switch,
 * on a GPU by a wait for a fresh word of host memory to become 1.
 */
static int gpu_hold(struct gpu *g, gp_cu_stream s, int hold) {
        if (!on_gpu)
                return g->hold(s, hold);
        for (size_t i = 0; i < sizeof(g->held) / sizeof(g->held[0]); i++) {
                if (hold && !g->held[i].s) {
                        if (g->ngates == 1024)
                                return -1;
                        g->held[i].s = s;
                        g->held[i].gate = g->ngates++;
                        g->gates[g->held[i].gate] = 0;
                        return g->wait_value32(s, g->gates_dev + 4 * (gp_cu_deviceptr) g->held[i].gate, 1,
                                               0 /* CU_STREAM_WAIT_VALUE_GEQ */) == GP_CUDA_SUCCESS ? 0 : -1;
                }
                if (!hold && g->held[i].s == s) {
                        __atomic_store_n(&g->gates[g->held[i].gate], 1, __ATOMIC_SEQ_CST);
                        g->held[i].s = NULL;
                }
        }
        return hold ? -1 : 0;
}

static gp_cu_deviceptr dptr(void *p) {
        return (gp_cu_deviceptr) (uintptr_t) p;
}

/* Writes a pattern only (tag, size) produce, half by cuMemsetD32 and half by cuMemcpyHtoD. */
static int write_pattern(struct gpu *g, void *p, size_t size, unsigned tag) {
        size_t words = size / 4, half = words / 2;
        uint32_t *buf;
        int r = 0;

        if (g->memset_d32(dptr(p), 0x9e3779b9u * tag, half) != GP_CUDA_SUCCESS)
                return -1;
        buf = malloc((words - half) * 4 + 4);
        for (size_t i = 0; i < words - half; i++)
                buf[i] = tag * 2654435761u + (uint32_t) i;
        if (g->htod(dptr(p) + half * 4, buf, (words - half) * 4) != GP_CUDA_SUCCESS)
                r = -1;
        free(buf);
        return r;
}

static bool pattern_intact(struct gpu *g, void *p, size_t size, unsigned tag) {
        size_t words = size / 4, half = words / 2;
        uint32_t *buf = malloc(words * 4 + 4);
        bool ok = g->dtoh(buf, dptr(p), words * 4) == GP_CUDA_SUCCESS;

        for (size_t i = 0; ok && i < half; i++)
                ok = buf[i] == 0x9e3779b9u * tag;
        for (size_t i = half; ok && i < words; i++)
                ok = buf[i] == tag * 2654435761u + (uint32_t) (i - half);
        free(buf);
        return ok;
}

/*
 * The backend cuda_start() starts: the scenarios every backend must pass run as loop tests,
 * once on cuda (legacy IPC handles), once on cuda-vmm (descriptors of cuMemCreate memory),
 * and once on cuda-vmm with the clients' segments growing in place ($GPUPOOL_SEGMENTS=grow).
 */
static const char *const cuda_backends[] = { "cuda", "cuda-vmm", "cuda-vmm" };
#define BACKEND_LOOPS 3
static const char *cuda_backend = "cuda";

static bool choose_backend(int i) {
        cuda_backend = cuda_backends[i];
        if (i == 2)
                setenv("GPUPOOL_SEGMENTS", "grow", 1);
        else
                unsetenv("GPUPOOL_SEGMENTS");
        return true;
}

/* First in a loop test's body: the backend of this iteration. */
#define BACKEND_OF_LOOP const bool backend_chosen_ __attribute__((unused)) = choose_backend(_i)

/* On the fake: a fresh node, a directory of "device memory" ($FAKECUDA_DIR) of its own. */
static void fake_node_new(void) {
        if (on_gpu)
                return;
        strcpy(fake_dir, "/tmp/gpupool-fakecuda-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(fake_dir));
        ck_assert_int_eq(chmod(fake_dir, 0777), 0);
        setenv("FAKECUDA_DIR", fake_dir, 1);
}

/* On the fake: every allocation must have been freed by now; removes the node's directory. */
static void fake_node_done(void) {
        char ledger[sizeof(fake_dir) + 32];
        struct dirent *e;
        DIR *dir;

        if (on_gpu)
                return;
        snprintf(ledger, sizeof(ledger), "%s/fakecuda-ledger", fake_dir);
        (void) unlink(ledger);  /* which processes use what: no memory of its own */
        /* cuMemCreate memory nobody holds (its holders exited) is what the driver frees: only held memory is left. */
        dir = opendir(fake_dir);
        while (dir && (e = readdir(dir))) {
                int fd;

                if (strncmp(e->d_name, "fakecuda-vmm-", 13) != 0)
                        continue;
                fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_CLOEXEC);
                if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0)
                        (void) unlinkat(dirfd(dir), e->d_name, 0);
                if (fd >= 0)
                        close(fd);
        }
        if (dir)
                closedir(dir);
        ck_assert_msg(rmdir(fake_dir) == 0, "device memory left allocated after the daemon stopped (%s: %s)",
                      fake_dir, strerror(errno));
}

/* Starts a cuda daemon (and, on the fake, on a fresh node). */
static void cuda_start(struct testd *d, const char *extra1, const char *extra2) {
        fake_node_new();
        testd_start(d, "--backend", cuda_backend, extra1, extra2, NULL);
}

/* Starts a cuda-vmm daemon on a fresh node (cuda_stop() goes back to the legacy backend). */
static void vmm_start(struct testd *d) {
        cuda_backend = "cuda-vmm";
        cuda_start(d, NULL, NULL);
}

/* Stops it; on the fake, every allocation must have been freed by then. */
static void cuda_stop(struct testd *d) {
        ck_assert_int_eq(testd_stop(d), 0);
        fake_node_done();
        cuda_backend = "cuda";
}

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
        if (!strstr(msg, "is full"))
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
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(reap(spawn(oversize_client, &d, &total)), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

/* ---- stream-ordered free ---- */

/*
 * What a client process that failed leaves on run_client()'s shared page: the line it failed
 * at and gpupool's sentence about the latest failure (the hooks' where c is NULL).
 */
struct client_failure {
        long long line;
        char error[1016];
};

static void client_failed(void *page, int line, gpupool_client *c) {
        struct client_failure *f = page;

        f->line = line;
        if (c)
                gpupool_last_error(c, f->error, sizeof(f->error));
        else
                gpupool_hook_last_error(f->error, sizeof(f->error));
}

/* In a client function with fail_page (run_client's page) and c (NULL until connected). */
#define FAIL() do { client_failed(fail_page, __LINE__, c); return 1; } while (0)

/*
 * Runs client in a process of its own against d; it must exit 0. What it failed at, if it
 * did, is in the message.
 */
static void check_client(struct testd *d, int (*client)(struct testd *d, void *arg), const char *name) {
        struct client_failure *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        int status;

        ck_assert_ptr_ne(f, MAP_FAILED);
        status = reap(spawn(client, d, f));
        ck_assert_msg(status == 0, "%s failed: exit %d (line %lld: %s)", name, status, f->line,
                      f->error[0] ? f->error : "no error from gpupool");
        munmap(f, sizeof(*f));
}

/* Queues device work on s writing block p, held still until release_work(). */
static int queue_work(struct gpu *g, gp_cu_stream s, void *p, size_t size) {
        if (gpu_hold(g, s, 1) < 0 || g->memset_d8_async(dptr(p), 0xa5, size, s) != GP_CUDA_SUCCESS)
                return -1;
        return 0;
}

static void release_work(struct gpu *g, gp_cu_stream s) {
        gpu_hold(g, s, 0);
}

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

/* Runs client against a fresh cuda daemon, as check_client(); it must leave nothing in use. */
static void run_client(int (*client)(struct testd *d, void *arg), const char *name) {
        struct testd d;

        cuda_start(&d, NULL, NULL);
        check_client(&d, client, name);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
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
 * A forked child (which cannot use CUDA) holds none of the descriptors kept for adoption
 * (cuda-vmm): each would keep its GPU memory alive after the parent gave it back, counted
 * nowhere. The legacy backend keeps none to begin with.
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
        if (strcmp(cuda_backend, "cuda-vmm") == 0 ? kept < 2 : kept != 0)
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
 */
static int hooks_client(struct testd *d, void *arg) {
        const size_t size = 64 * MiB;
        void *fail_page = arg;
        gpupool_client *const c = NULL;        /* the hooks' own: errors come from gpupool_hook_last_error() */
        gp_cu_stream s;
        gp_cu_event done;
        struct gpu g;
        void *a, *b;

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
                fprintf(stderr, "test_cuda_segment_zeroed_across_uids: not root, nothing to check\n");
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
                fprintf(stderr, "test_fake_zeroing_does_not_block_the_daemon: not root, nothing to check\n");
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


struct visible {
        const char *cvd;
        unsigned expect_daemon_device;
};

/* What device index holds leased to clients: reserved but not cached. */
static long long leased_on(struct testd *d, unsigned index) {
        return testd_device(d, index, "reserved_bytes") - testd_device(d, index, "cached_bytes");
}

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
 * on one stream, each behind its own work, the fake runs exactly the work of the first 500
 * (while the reaper waits on an older free of another stream, held for good); an allocation
 * the pool cannot serve then returns those 500 and no other, having searched the queue for
 * where the completed ones end.
 */
static int batch_client(struct testd *d, void *arg) {
        enum { PENDING = 1000, DONE = 500, SIZE = 64 * 1024 };
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
        /* The oldest free, on t, held: the reaper waits on it and looks at nothing else. */
        if (gpupool_alloc(c, 0, SIZE, &x) < 0 || queue_work(&g, t, x, SIZE) < 0 || gpupool_free_async(c, x, t) < 0)
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
                fprintf(stderr, "test_fake_pid_namespace_refused: not root, cannot make a PID namespace\n");
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

/* ---- the fake's virtual memory management: cuMemCreate memory shared by descriptor ---- */

static const gp_cu_mem_prop vmm_prop = {
        .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
};

static const gp_cu_mem_access_desc vmm_rw = {
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
        .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
};

/* Whether the first bytes at p read value. */
static bool vmm_reads(struct gpu *g, gp_cu_deviceptr p, unsigned char value) {
        unsigned char buf[64];

        if (g->dtoh(buf, p, sizeof(buf)) != GP_CUDA_SUCCESS)
                return false;
        for (size_t i = 0; i < sizeof(buf); i++)
                if (buf[i] != value)
                        return false;
        return true;
}

/* Makes 4 MiB, checks the rules on it, shares it by descriptor over sock, and lets go of it first. */
static int vmm_exporter(struct testd *d, void *arg) {
        int *sv = arg, sock = sv[0], fd = -1;
        size_t granularity = 0, free0, free1, total;
        unsigned char fill[64], byte;
        gp_cu_deviceptr va;
        gp_cu_mem_handle h, unexportable;
        gp_cu_mem_prop plain = vmm_prop;
        struct gpu g;

        (void) d;
        close(sv[1]);   /* the importer's end: its exit must reach us */
        memset(fill, 0xab, sizeof(fill));
        plain.requested_handle_types = GP_CU_MEM_HANDLE_TYPE_NONE;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free0, &total) != GP_CUDA_SUCCESS)
                return 1;
        if (g.cu.cuMemGetAllocationGranularity(&granularity, &vmm_prop, GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM) != GP_CUDA_SUCCESS ||
            granularity != 2 * MiB)
                return 2;
        if (g.cu.cuMemCreate(&h, 1 * MiB, &vmm_prop, 0) != GP_CUDA_ERROR_INVALID_VALUE)
                return 3;       /* not a multiple of the granularity */
        if (g.cu.cuMemCreate(&h, 4 * MiB, &vmm_prop, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS || free1 != free0 - 4 * MiB)
                return 4;       /* the node's memory, counted */
        if (g.cu.cuMemCreate(&unexportable, 2 * MiB, &plain, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemExportToShareableHandle(&fd, unexportable, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
                    GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemRelease(unexportable) != GP_CUDA_SUCCESS)
                return 5;       /* only what was made for descriptors exports as one */
        if (g.cu.cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemMap(va, 4 * MiB, 2 * MiB, h, 0) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemMap(va + 4 * MiB, 2 * MiB, 0, h, 0) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_ERROR_ALREADY_MAPPED)
                return 6;       /* offset 0, the whole allocation, on a range not mapped yet */
        if (g.htod(va, fill, sizeof(fill)) != GP_CUDA_ERROR_INVALID_VALUE)
                return 7;       /* mapped is not accessible before cuMemSetAccess */
        if (g.cu.cuMemSetAccess(va, 2 * MiB, &vmm_rw, 1) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemSetAccess(va, 4 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS || g.htod(va, fill, sizeof(fill)) != GP_CUDA_SUCCESS)
                return 8;
        if (g.cu.cuMemAddressFree(va, 8 * MiB) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemUnmap(va, 2 * MiB) != GP_CUDA_ERROR_INVALID_VALUE)
                return 9;       /* unmap before free; no sub-range */
        if (g.cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS ||
            gp_wire_send_packet(sock, (const uint8_t *) "m", 1, fd) < 0)
                return 10;
        close(fd);
        /* The importer wrote through its own mapping: the same memory. */
        if (read(sock, &byte, 1) != 1 || !vmm_reads(&g, va, 0xcd))
                return 11;
        if (g.cu.cuMemUnmap(va, 4 * MiB) != GP_CUDA_SUCCESS || g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS ||
            g.cu.cuMemRelease(h) != GP_CUDA_ERROR_INVALID_VALUE || g.cu.cuMemAddressFree(va, 8 * MiB) != GP_CUDA_SUCCESS)
                return 12;
        return 0;       /* and exits: the importer's mapping keeps the memory */
}

static int vmm_importer(struct testd *d, void *arg) {
        int *sv = arg, sock = sv[1], fd = -1, junk;
        unsigned char fill[64], buf[8];
        size_t free1, free2, total;
        gp_cu_mem_handle h, bad;
        gp_cu_deviceptr va;
        struct gpu g;

        (void) d;
        close(sv[0]);   /* the exporter's end: its exit must reach us */
        memset(fill, 0xcd, sizeof(fill));
        /* The GPU opened only now: our context would count in what the exporter measures. */
        if (gp_wire_recv_packet(sock, buf, sizeof(buf), &fd) != 1 || fd < 0 || gpu_open(&g) < 0)
                return 1;
        junk = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (g.cu.cuMemImportFromShareableHandle(&bad, (void *) (uintptr_t) junk, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
            GP_CUDA_ERROR_INVALID_VALUE)
                return 2;       /* a descriptor that is not device memory */
        close(junk);
        if (g.cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
            GP_CUDA_SUCCESS)
                return 3;
        close(fd);      /* as NCCL does: the handle holds the memory now */
        if (g.cu.cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS || g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS || g.cu.cuMemSetAccess(va, 4 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS)
                return 4;       /* released while mapped: the mapping keeps it */
        if (!vmm_reads(&g, va, 0xab) || g.htod(va, fill, sizeof(fill)) != GP_CUDA_SUCCESS || write(sock, "w", 1) != 1)
                return 5;
        /* The exporter let go and exited: the memory lives while this mapping does. */
        if (read(sock, buf, 1) != 0)
                return 6;
        if (!vmm_reads(&g, va, 0xcd) || g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS)
                return 7;
        if (g.cu.cuMemUnmap(va, 4 * MiB) != GP_CUDA_SUCCESS || g.cu.cuMemAddressFree(va, 4 * MiB) != GP_CUDA_SUCCESS ||
            g.cu.cuMemGetInfo(&free2, &total) != GP_CUDA_SUCCESS || free2 != free1 + 4 * MiB)
                return 8;       /* nobody holds it any more: freed */
        return 0;
}

START_TEST(test_fake_vmm_rules) {
        pid_t exporter, importer;
        int sv[2], e, i;

        fake_node_new();
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        exporter = spawn(vmm_exporter, NULL, sv);
        importer = spawn(vmm_importer, NULL, sv);
        close(sv[0]);
        close(sv[1]);
        e = reap(exporter);
        i = reap(importer);
        ck_assert_msg(e == 0, "the exporter's side of the VMM rules failed at step %d", e);
        ck_assert_msg(i == 0, "the importer's side of the VMM rules failed at step %d", i);
        fake_node_done();       /* nothing left: the last holder freed it */
}
END_TEST

/*
 * With cuda-vmm, a client in a PID namespace of its own (a container) is served: descriptors
 * pass namespaces, which legacy IPC handles do not.
 */
static int pidns_vmm_client(struct testd *d, void *arg) {
        pid_t pid;
        int status;

        (void) arg;
        if (unshare(CLONE_NEWPID) < 0)
                return 10;
        pid = fork();           /* the new namespace's pid 1 */
        if (pid < 0)
                return 11;
        if (pid == 0) {
                gpupool_client *c = NULL;
                struct gpu g;
                void *p;

                if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "contained", &c) < 0 ||
                    gpupool_alloc(c, 0, 6 * MiB, &p) < 0)
                        _exit(12);
                if (write_pattern(&g, p, 6 * MiB, 9) < 0 || !pattern_intact(&g, p, 6 * MiB, 9) || gpupool_free(c, p) < 0)
                        _exit(13);
                gpupool_disconnect(c);
                _exit(0);
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
                return 14;
        return WEXITSTATUS(status);
}

START_TEST(test_fake_vmm_serves_pid_namespace) {
        struct testd d;

        if (geteuid() != 0) {
                fprintf(stderr, "test_fake_vmm_serves_pid_namespace: not root, cannot make a PID namespace\n");
                return;
        }
        vmm_start(&d);
        ck_assert_msg(reap(spawn(pidns_vmm_client, &d, NULL)) == 0, "a client in its own PID namespace was not served");
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

/* Imports three granules' descriptors and maps them side by side in a range of its own. */
static int import_granules(struct testd *d, void *arg) {
        const int *fds = arg;
        gp_cu_deviceptr va;
        struct gpu g;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemAddressReserve(&va, 6 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS)
                return 1;
        for (int i = 0; i < 3; i++) {
                gp_cu_mem_handle h;

                if (g.cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fds[i],
                                                        GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != GP_CUDA_SUCCESS ||
                    g.cu.cuMemMap(va + (gp_cu_deviceptr) i * 2 * MiB, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
                    g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS)
                        return 2 + i;
        }
        if (g.cu.cuMemSetAccess(va, 6 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS || g.memset_d32(va, 0x5a5a5a5a, 6 * MiB / 4) != GP_CUDA_SUCCESS ||
            g.cu.cuMemUnmap(va, 6 * MiB) != GP_CUDA_SUCCESS || g.cu.cuMemAddressFree(va, 6 * MiB) != GP_CUDA_SUCCESS)
                return 5;
        return 0;
}

/*
 * Granule leases: on cuda-vmm, a descriptor of its own cuMemCreate memory per granule, which
 * another process imports and maps; the legacy backend refuses them with the reason.
 */
START_TEST(test_fake_granule_leases) {
        int fds[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;
        int sock, r;

        vmm_start(&d);
        sock = raw_hello(&d, "granules");
        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 3);
        ck_assert_uint_eq(rep->lease_reply->n_more_segment_ids, 2);
        ck_assert(!rep->lease_reply->has_ipc_handle);
        gpupool__envelope__free_unpacked(rep, NULL);
        r = reap(spawn(import_granules, NULL, fds));
        ck_assert_msg(r == 0, "the granules' descriptors did not import (step %d)", r);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 6 * MiB);
        close(sock);
        cuda_stop(&d);

        cuda_start(&d, NULL, NULL);     /* the legacy backend */
        sock = raw_hello(&d, "granules");
        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_uint_eq(nfds, 0);
        ck_assert_msg(strstr(rep->error, "granule leases need the host or cuda-vmm backend"), "%s", rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        close(sock);
        cuda_stop(&d);
}
END_TEST

/* A client that keeps the descriptor of cuda-vmm memory it returned reads nothing another uid writes there. */
START_TEST(test_fake_vmm_kept_descriptor_reads_nothing) {
        struct testd d;

        if (geteuid() != 0) {
                fprintf(stderr, "test_fake_vmm_kept_descriptor_reads_nothing: not root, nothing to check\n");
                return;
        }
        vmm_start(&d);
        check_kept_descriptor_reads_nothing(&d, 0);
        cuda_stop(&d);
}
END_TEST

/* ---- cuda-vmm memory outlives the daemon ---- */

/*
 * Holds blocks with data in them; once the daemon is killed, finds the data intact, goes on
 * allocating from what it holds, and is told at once that it cannot lease more; once a daemon
 * is back, is adopted by it on its own, counted once, its data still intact.
 */
static int survivor_client(struct testd *d, void *arg) {
        enum { N = 6 };
        static const size_t sizes[N] = { 4096, 100000, 1 * MiB, 3 * MiB, 3 * MiB, 8 * MiB };
        struct survivor *w = arg;
        gpupool_client *c = NULL;
        struct gpupool_stats held;
        char err[512], b;
        void *p[N], *big;
        struct gpu g;
        int r;

        setenv("GPUPOOL_SEGMENTS", w->index % 2 ? "whole" : "grow", 1);
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "survivor", &c) < 0)
                return 1;
        for (int i = 0; i < N; i++)
                if (gpupool_alloc(c, 0, sizes[i], &p[i]) < 0 || write_pattern(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)) < 0)
                        return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 4;
        /* Freed and allocated again from what the process holds: no daemon needed. */
        for (int round = 0; round < 3; round++) {
                if (gpupool_free(c, p[3]) != 0 || gpupool_alloc(c, 0, sizes[3], &p[3]) != 0 ||
                    write_pattern(&g, p[3], sizes[3], (unsigned) (w->index * 16 + 3)) < 0)
                        return 5;
        }
        /* More than it holds needs the daemon: refused at once, saying so. */
        r = gpupool_alloc(c, 0, 256 * MiB, &big);
        gpupool_last_error(c, err, sizeof(err));
        if (r != -ECONNRESET || !strstr(err, "goes on allocating from the cuda-vmm memory it holds")) {
                fprintf(stderr, "survivor %d: %d: %s\n", w->index, r, err);
                return 6;
        }
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 7;
        if (gpupool_stats(c, &held) != 0 || !survivor_restarted(w))
                return 8;
        /* The new daemon: the process reconnects on its own, and it adopts what the process holds, counted once. */
        if (!(big = survivor_adopted(d, w, c, &held, 32 * MiB)) || write_pattern(&g, big, 32 * MiB, 3) < 0)
                return 9;
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)) || gpupool_free(c, p[i]) != 0)
                        return 11;
        if (!pattern_intact(&g, big, 32 * MiB, 3) || gpupool_free(c, big) != 0 || gpupool_trim(c) != 0)
                return 12;
        gpupool_disconnect(c);
        return 0;
}

/* kill -9 of a cuda-vmm daemon under four processes, two in each mode: each keeps its data, goes on, and is adopted. */
START_TEST(test_vmm_survives_daemon_kill) {
        struct testd d;

        vmm_start(&d);
        run_survivors(&d, 4, survivor_client);
        unsetenv("GPUPOOL_SEGMENTS");
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        cuda_stop(&d);          /* what the clients held went back: nothing is left */
}
END_TEST

/*
 * Holds a block on its device 0 while the daemon, which sees that GPU alone, is killed and
 * comes back seeing only the other GPU (the test relaunches it so): the process is refused
 * adoption and told why at its next lease, keeps its data and allocates within what it holds,
 * and gpupool_reconnect() starts anew on the GPU the daemon has now.
 */
static int other_gpus_client(struct testd *d, void *arg) {
        struct survivor *w = arg;
        gpupool_client *c = NULL;
        char err[512], b;
        void *p, *big;
        struct gpu g;
        int r;

        unsetenv("CUDA_VISIBLE_DEVICES");       /* this process sees both GPUs; each daemon one */
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "moved", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, 3 * MiB, &p) < 0 || write_pattern(&g, p, 3 * MiB, 21) < 0)
                return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        /* The control thread tries the new daemon within a second, and is refused: the next lease says why. */
        for (double t0 = now_s();; nap_ms(50)) {
                r = gpupool_alloc(c, 0, 256 * MiB, &big);
                gpupool_last_error(c, err, sizeof(err));
                if (r != -ECONNRESET || now_s() - t0 > 20) {
                        fprintf(stderr, "other_gpus_client: %d: %s\n", r, err);
                        return 4;
                }
                if (strstr(err, "came back with other devices (or another backend) than this process holds memory of"))
                        break;
        }
        if (!pattern_intact(&g, p, 3 * MiB, 21) || leased_on(d, 0) != 0)
                return 5;       /* intact, and nothing of it adopted */
        if (gpupool_free(c, p) != 0 || gpupool_alloc(c, 0, 3 * MiB, &p) != 0 || write_pattern(&g, p, 3 * MiB, 22) < 0 ||
            !pattern_intact(&g, p, 3 * MiB, 22))
                return 6;       /* within what it holds */
        if (gpupool_reconnect(c) != 0)
                return 7;
        /* Anew: the daemon's one GPU is this process's device 1; its device 0 is not the daemon's. */
        if (gpupool_alloc(c, 1, 3 * MiB, &p) != 0 || leased_on(d, 0) < (long long) (3 * MiB) ||
            gpupool_alloc(c, 0, 4096, &big) != -ENODEV || gpupool_free(c, p) != 0)
                return 8;
        gpupool_disconnect(c);
        return 0;
}

/* A cuda-vmm daemon that comes back with another GPU than a process holds memory of adopts none of it. */
START_TEST(test_fake_vmm_resume_refused_other_gpus) {
        struct survivor w = { 0 };
        struct testd d;
        int status;
        pid_t pid;
        char b;

        setenv("FAKECUDA_DEVICES", "2", 1);
        setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        vmm_start(&d);
        ck_assert(pipe(w.up) == 0 && pipe(w.go) == 0);
        pid = spawn(other_gpus_client, &d, &w);
        ck_assert_int_eq(read(w.up[0], &b, 1), 1);
        testd_crash(&d);
        setenv("CUDA_VISIBLE_DEVICES", "1", 1);
        testd_relaunch(&d);
        unsetenv("CUDA_VISIBLE_DEVICES");
        ck_assert_int_eq(write(w.go[1], "g", 1), 1);
        status = reap(pid);
        ck_assert_msg(status == 0, "other_gpus_client failed at step %d", status);
        close(w.up[0]), close(w.up[1]), close(w.go[0]), close(w.go[1]);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(leased_on(&d, 0), 0);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/* An adoption of n segments of device refused whole with STATUS_INVALID, saying text. */
static void vmm_adopt_refused(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, const char *text) {
        Gpupool__Envelope *rep = raw_adopt(sock, device, sizes, n, fds, n);

        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(rep->error && strstr(rep->error, text), "%s", rep->error ? rep->error : "(no message)");
        gpupool__envelope__free_unpacked(rep, NULL);
}

/* Adopts n segments of device that must all be adopted. */
static void vmm_adopt_all(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds) {
        Gpupool__Envelope *rep = raw_adopt(sock, device, sizes, n, fds, n);

        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error ? rep->error : "");
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, n);
        gpupool__envelope__free_unpacked(rep, NULL);
}

/*
 * What a cuda-vmm daemon adopts, over the raw protocol: granules a process kept from the daemon
 * before it, each once; not a descriptor that is no CUDA memory, memory of another GPU (on the
 * fake, which has two), memory stated larger than it maps, the same memory twice, nor memory
 * the daemon holds. A daemon that cannot use kcmp(2) adopts nothing, and the legacy backend
 * neither, each saying why.
 */
START_TEST(test_vmm_adoption) {
        uint64_t two[2] = { 2 * MiB, 2 * MiB }, four = 4 * MiB;
        int fds[GP_WIRE_MAX_FDS], other[GP_WIRE_MAX_FDS], now[GP_WIRE_MAX_FDS], pair[2], pipe_fds[2], sock;
        bool two_gpus = !on_gpu;
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;

        if (two_gpus)
                setenv("FAKECUDA_DEVICES", "2", 1);
        vmm_start(&d);
        sock = raw_hello(&d, "before");
        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 3);
        gpupool__envelope__free_unpacked(rep, NULL);
        if (two_gpus) {
                rep = raw_lease_granules(sock, 1, 1, 2 * MiB, other, &nfds);
                ck_assert_uint_eq(nfds, 1);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        testd_crash_and_restart(&d);
        close(sock);
        sock = raw_hello(&d, "after");

        ck_assert_int_eq(pipe(pipe_fds), 0);
        vmm_adopt_refused(sock, 0, two, 1, pipe_fds, "not memory the CUDA driver exported as a descriptor");
        if (two_gpus)
                vmm_adopt_refused(sock, 0, two, 1, other, "not memory of GPU 0");
        vmm_adopt_refused(sock, 0, &four, 1, fds, "does not map as 4194304 bytes");
        pair[0] = fds[0];
        pair[1] = dup(fds[0]);
        vmm_adopt_refused(sock, 0, two, 2, pair, "the same memory as descriptor 0");
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);

        /* Adopted once, counted once; again, by any descriptor of it, it is held already. */
        vmm_adopt_all(sock, 0, two, 2, fds);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "after", "reserved_bytes"), 4 * MiB);
        vmm_adopt_refused(sock, 0, two, 1, &pair[1], "holds already");
        /* Nor memory this daemon leases now. */
        rep = raw_lease_granules(sock, 0, 1, 2 * MiB, now, &nfds);
        ck_assert_uint_eq(nfds, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        vmm_adopt_refused(sock, 0, two, 1, now, "holds already");
        if (two_gpus)
                vmm_adopt_all(sock, 1, two, 1, other);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 6 * MiB);
        json_decref(testd_ctl(&d, "check"));

        /* Where kcmp(2) is refused, nothing is adopted, saying why. */
        testd_crash(&d);
        d.refuse_kcmp = true;
        testd_relaunch(&d);
        close(sock);
        sock = raw_hello(&d, "no-kcmp");
        vmm_adopt_refused(sock, 0, two, 1, &fds[2], "kcmp(2) is refused here");
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);

        /* The legacy backend's memory goes with its daemon: nothing to adopt. */
        testd_start(&d, "--backend", "cuda", NULL);
        sock = raw_hello(&d, "legacy");
        vmm_adopt_refused(sock, 0, two, 1, &fds[2], "its segments lived in the daemon's context and went with it");
        close(sock);
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        close(pair[1]);
        close(now[0]);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        if (two_gpus)
                close(other[0]);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
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

/* ---- the node's memory: every process's allocations and contexts count ---- */

struct node_memory {
        int up[2];                      /* children to the test: a byte when they are ready */
        int go[2], go2[2];              /* the test to the holder, and to the checker: a byte to go on */
};

/* Holds 256 MiB of the GPU and a context until told to go on, then exits without freeing either. */
static int holder_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemAlloc(&p, 256 * MiB) != GP_CUDA_SUCCESS)
                return 1;
        if (write(m->up[1], "h", 1) != 1 || read(m->go[0], &c, 1) != 1)
                return 2;
        return 0;
}

/* Sees the holder's memory and context in cuMemGetInfo and cuMemAlloc, fills the GPU, then sees the holder's come back. */
static int checker_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        size_t free1, free2, total;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS)
                return 1;
        if (total != 1024 * MiB || free1 != total - 2 * 64 * MiB - 256 * MiB) {
                fprintf(stderr, "checker: %zu free of %zu, not the two contexts and the holder's 256 MiB less\n", free1, total);
                return 2;
        }
        if (g.cu.cuMemAlloc(&p, free1 + 4096) != GP_CUDA_ERROR_OUT_OF_MEMORY)
                return 3;       /* what another process holds is not free */
        if (g.cu.cuMemAlloc(&p, free1 - 32 * MiB) != GP_CUDA_SUCCESS)
                return 4;
        if (write(m->up[1], "c", 1) != 1 || read(m->go2[0], &c, 1) != 1)
                return 5;
        /* The holder has exited: what it had is free again. */
        if (g.cu.cuMemGetInfo(&free2, &total) != GP_CUDA_SUCCESS || free2 != 32 * MiB + 256 * MiB + 64 * MiB) {
                fprintf(stderr, "checker: %zu free after the holder exited\n", free2);
                return 6;
        }
        return g.cu.cuMemFree(p) == GP_CUDA_SUCCESS ? 0 : 7;
}

/* On a full GPU a new process cannot even make its context. */
static int late_client(struct testd *d, void *arg) {
        char err[256];
        struct gp_cuda cu;
        gp_cu_device dev;
        gp_cu_context ctx;

        (void) d, (void) arg;
        if (gp_cuda_load(&cu, err, sizeof(err)) < 0 || cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS)
                return 1;
        return cu.cuDevicePrimaryCtxRetain(&ctx, dev) == GP_CUDA_ERROR_OUT_OF_MEMORY ? 0 : 2;
}

START_TEST(test_fake_memory_is_the_nodes) {
        struct node_memory m;
        pid_t holder, checker;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        fake_node_new();
        ck_assert(pipe(m.up) == 0 && pipe(m.go) == 0 && pipe(m.go2) == 0);
        holder = spawn(holder_client, NULL, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        checker = spawn(checker_client, NULL, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        ck_assert_msg(reap(spawn(late_client, NULL, NULL)) == 0, "a context was made on a full GPU");
        ck_assert_int_eq(write(m.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(holder), 0);
        ck_assert_int_eq(write(m.go2[1], "g", 1), 1);
        ck_assert_msg(reap(checker) == 0, "the node's memory was not counted across processes");
        for (int i = 0; i < 2; i++) {
                close(m.up[i]), close(m.go[i]), close(m.go2[i]);
        }
        fake_node_done();       /* the holder's allocation went with it */
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}
END_TEST

/* ---- the headroom is kept as other processes take memory ---- */

/* Leases 256 MiB and exits holding it: the daemon caches the segment. */
static int leaving_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        void *p;

        (void) arg;
        return gpupool_connect(d->sock, "leaving", &c) == 0 && gpupool_alloc(c, 0, 256 * MiB, &p) == 0 ? 0 : 1;
}

/* A program without gpupool: takes all but 128 MiB of what the GPU has free, until told to let go. */
static int hog_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        size_t free_bytes, total;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free_bytes, &total) != GP_CUDA_SUCCESS ||
            g.cu.cuMemAlloc(&p, free_bytes - 128 * MiB) != GP_CUDA_SUCCESS)
                return 1;
        if (write(m->up[1], "h", 1) != 1 || read(m->go[0], &c, 1) != 1)
                return 2;
        return g.cu.cuMemFree(p) == GP_CUDA_SUCCESS ? 0 : 3;
}

/* Asks for 256 MiB: refused while the GPU lacks it beyond the headroom, saying so; served once it has it. */
static int headroom_client(struct testd *d, void *arg) {
        bool want_refusal = arg != NULL;
        gpupool_client *c = NULL;
        char err[1024];
        void *p;
        int r;

        if (gpupool_connect(d->sock, "headroom", &c) < 0)
                return 1;
        r = gpupool_alloc(c, 0, 256 * MiB, &p);
        if (!want_refusal)
                return r == 0 ? 0 : 2;
        gpupool_last_error(c, err, sizeof(err));
        if (r != -ENOMEM || !strstr(err, "of it (headroom) to contexts and programs outside the pool")) {
                fprintf(stderr, "headroom_client: %d: %s\n", r, err);
                return 3;
        }
        return 0;
}

START_TEST(test_fake_headroom_kept) {
        struct node_memory m;
        char cmd[512], out[4096];
        struct testd d;
        pid_t hog;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        cuda_start(&d, "--headroom=256M", "--max-cached=100%");
        ck_assert_int_eq(testd_device(&d, 0, "total_bytes"), 1024 * MiB - 64 * MiB - 256 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "gpu_total_bytes"), 1024 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "headroom_bytes"), 256 * MiB);
        ck_assert_int_eq(reap(spawn(leaving_client, &d, NULL)), 0);
        ck_assert(testd_device_becomes(&d, 0, "cached_bytes", testd_device(&d, 0, "reserved_bytes")));
        ck_assert_int_ge(testd_device(&d, 0, "cached_bytes"), 256 * MiB);

        /* A program without gpupool leaves 128 MiB free: the daemon gives its cache back for the headroom. */
        ck_assert(pipe(m.up) == 0 && pipe(m.go) == 0);
        hog = spawn(hog_client, &d, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        ck_assert_msg(testd_device_becomes(&d, 0, "cached_bytes", 0), "the cache was kept with the headroom taken");
        ck_assert_int_ge(testd_device(&d, 0, "gpu_free_bytes"), 256 * MiB);
        ck_assert_int_ge(testd_device(&d, 0, "headroom_releases_total"), 1);
        ck_assert(testd_log_wait(&d, "others had taken part of the 256.0 MiB headroom"));
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics | grep -c '^gpupool_headroom_releases_total{.*} [1-9]'",
                 build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "no headroom releases in the metrics: %s", out);

        /* Growing would take the headroom: refused, with why; once the program exits, served. */
        ck_assert_msg(reap(spawn(headroom_client, &d, &m)) == 0, "the pool grew into the headroom, or did not say why not");
        ck_assert_int_eq(write(m.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(hog), 0);
        ck_assert_msg(reap(spawn(headroom_client, &d, NULL)) == 0, "memory the program gave back did not serve");
        for (int i = 0; i < 2; i++) {
                close(m.up[i]);
                close(m.go[i]);
        }
        cuda_stop(&d);
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}
END_TEST

/* Allocates 256 MiB and frees it: its process keeps the segment, free, until told to exit. */
static int keeper_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        gpupool_client *c = NULL;
        void *p;
        char b;

        if (gpupool_connect(d->sock, "keeper", &c) < 0 || gpupool_alloc(c, 0, 256 * MiB, &p) < 0 || gpupool_free(c, p) < 0)
                return 1;
        if (write(m->up[1], "k", 1) != 1 || read(m->go[0], &b, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        return 0;
}

/* With the cache empty, what clients keep free goes back for the headroom. */
START_TEST(test_fake_headroom_reclaimed_from_clients) {
        struct node_memory keep, hog_pipes;
        pid_t keeper, hog;
        struct testd d;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        cuda_start(&d, "--headroom=256M", NULL);
        ck_assert(pipe(keep.up) == 0 && pipe(keep.go) == 0 && pipe(hog_pipes.up) == 0 && pipe(hog_pipes.go) == 0);
        setenv("GPUPOOL_IDLE_RETURN", "10min", 1);     /* the keeper gives nothing back by itself */
        keeper = spawn(keeper_client, &d, &keep);
        unsetenv("GPUPOOL_IDLE_RETURN");
        ck_assert_int_eq(read(keep.up[0], &c, 1), 1);
        ck_assert(testd_client_becomes(&d, keeper, NULL, "held_free_bytes", 256 * MiB));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);

        hog = spawn(hog_client, &d, &hog_pipes);
        ck_assert_int_eq(read(hog_pipes.up[0], &c, 1), 1);
        ck_assert_msg(testd_client_becomes(&d, keeper, NULL, "reserved_bytes", 0),
                      "the client kept its free segment with the headroom taken");
        ck_assert(testd_log_wait(&d, "others took part of the headroom and the cache is empty: asked 1 client for 128.0 MiB"));
        ck_assert_int_ge(testd_device(&d, 0, "gpu_free_bytes"), 256 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);      /* straight back to the driver */
        ck_assert_int_ge(testd_device(&d, 0, "reclaims_total"), 1);

        ck_assert(write(hog_pipes.go[1], "g", 1) == 1 && write(keep.go[1], "g", 1) == 1);
        ck_assert_int_eq(reap(hog), 0);
        ck_assert_int_eq(reap(keeper), 0);
        for (int i = 0; i < 2; i++) {
                close(keep.up[i]);
                close(keep.go[i]);
                close(hog_pipes.up[i]);
                close(hog_pipes.go[i]);
        }
        cuda_stop(&d);
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}
END_TEST

START_TEST(test_fake_start_without_driver_or_gpu) {
        const char *b = build_dir();
        char cmd[768], out[4096];
        const char *lib = getenv("GPUPOOL_LIBCUDA");
        struct testd d;

        fake_node_new();
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=/nonexistent/libcuda.so.1 %s/gpupoold --backend cuda --socket /tmp/gp-never.sock 2>&1", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--backend cuda: no CUDA driver: cannot load /nonexistent/libcuda.so.1"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s FAKECUDA_DEVICES=0 %s/gpupoold --backend cuda --socket /tmp/gp-never.sock 2>&1", lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "finds no GPU"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s %s/gpupoold --backend cuda --headroom 4G --socket /tmp/gp-never.sock 2>&1", lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--headroom 4.0 GiB leaves nothing"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s FAKECUDA_VMM=0 %s/gpupoold --backend cuda-vmm --socket /tmp/gp-never.sock 2>&1",
                 lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--backend cuda-vmm: GPU 0 (Fake GPU 0) does not support virtual memory management"), "%s", out);

        /* auto: no GPU means the host backend, said in the log. */
        setenv("FAKECUDA_DEVICES", "0", 1);
        testd_start(&d, "--backend", "auto", NULL);
        unsetenv("FAKECUDA_DEVICES");
        {
                json_t *st = testd_ctl(&d, "status");
                json_t *dev = json_array_get(json_object_get(st, "devices"), 0);

                ck_assert_str_eq(json_string_value(json_object_get(dev, "backend")), "host");
                json_decref(st);
        }
        snprintf(cmd, sizeof(cmd), "grep -c 'finds no GPU; using the host backend' %s", d.log);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        fake_node_done();
}
END_TEST

static void add_common(TCase *tc) {
        tcase_add_loop_test(tc, test_cuda_clients_data_intact, 0, BACKEND_LOOPS);
        tcase_add_loop_test(tc, test_cuda_killed_client_memory_returns, 0, BACKEND_LOOPS);
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
        tcase_add_test(tc, test_vmm_survives_daemon_kill);
        tcase_add_test(tc, test_vmm_adoption);
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
        tcase_add_test(tc, test_fake_visible_devices_renumbered);
        tcase_add_test(tc, test_fake_handle_opened_once_and_closed);
        tcase_add_test(tc, test_fake_stream_aware_cache);
        tcase_add_test(tc, test_fake_reaping_stops_at_pending_work);
        tcase_add_test(tc, test_fake_reaping_a_batch_costs_few_queries);
        tcase_add_test(tc, test_fake_zeroing_does_not_block_the_daemon);
        tcase_add_test(tc, test_fake_stream_handle_reused);
        tcase_add_test(tc, test_fake_event_error_is_not_done);
        tcase_add_test(tc, test_fake_compute_modes);
        tcase_add_test(tc, test_fake_pid_namespace_refused);
        tcase_add_test(tc, test_fake_driver_rules);
        tcase_add_test(tc, test_fake_start_without_driver_or_gpu);
        tcase_add_test(tc, test_fake_memory_is_the_nodes);
        tcase_add_test(tc, test_fake_legacy_stream_order);
        tcase_add_test(tc, test_fake_vmm_rules);
        tcase_add_test(tc, test_fake_vmm_serves_pid_namespace);
        tcase_add_test(tc, test_fake_vmm_kept_descriptor_reads_nothing);
        tcase_add_test(tc, test_fake_vmm_resume_refused_other_gpus);
        tcase_add_test(tc, test_fake_granule_leases);
        tcase_add_test(tc, test_fake_ipc_open_cost_grows_with_size);
        tcase_add_test(tc, test_fake_headroom_kept);
        tcase_add_test(tc, test_fake_headroom_reclaimed_from_clients);
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
