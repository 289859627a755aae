/*
 * cudatest.c: the helpers the cuda suites share (cudatest.h). Only the client processes a
 * test spawns touch CUDA: a process forked after cuInit cannot use the driver, on a real GPU
 * as on the fake.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudatest.h"

bool on_gpu;            /* the real driver (make check-gpu) */
char fake_dir[96];      /* the fake node's directory, $FAKECUDA_DIR */

/* In a client process: the driver, and device 0's primary context made current. */
int gpu_open(struct gpu *g) {
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
                *(void **) &g->event_records = dlsym(g->cu.lib, "fakecuda_event_records");
                *(void **) &g->set_access_calls = dlsym(g->cu.lib, "fakecuda_set_access_calls");
                *(void **) &g->calls = dlsym(g->cu.lib, "fakecuda_calls");
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
int gpu_hold(struct gpu *g, gp_cu_stream s, int hold) {
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

gp_cu_deviceptr dptr(void *p) {
        return (gp_cu_deviceptr) (uintptr_t) p;
}

/* Writes a pattern only (tag, size) produce, half by cuMemsetD32 and half by cuMemcpyHtoD. */
int write_pattern(struct gpu *g, void *p, size_t size, unsigned tag) {
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

bool pattern_intact(struct gpu *g, void *p, size_t size, unsigned tag) {
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
const char *cuda_backend = "cuda";

bool choose_backend(int i) {
        cuda_backend = cuda_backends[i];
        if (i == 2)
                setenv("GPUPOOL_SEGMENTS", "grow", 1);
        else
                unsetenv("GPUPOOL_SEGMENTS");
        return true;
}

/* On the fake: a fresh node, a directory of "device memory" ($FAKECUDA_DIR) of its own. */
void fake_node_new(void) {
        if (on_gpu)
                return;
        /* In memory where there is a tmpfs, as the fake's own default: a disk's inodes make every cuMemCreate slow. */
        if (!test_mkdtemp_shm(fake_dir, sizeof(fake_dir), "fakecuda"))
                test_mkdtemp(fake_dir, sizeof(fake_dir), "fakecuda");
        ck_assert_int_eq(chmod(fake_dir, 0777), 0);
        setenv("FAKECUDA_DIR", fake_dir, 1);
}

/* On the fake: every allocation must have been freed by now; removes the node's directory. */
void fake_node_done(void) {
        char ledger[sizeof(fake_dir) + 32];
        struct dirent *e;
        DIR *dir;

        if (on_gpu)
                return;
        snprintf(ledger, sizeof(ledger), "%s/fakecuda-ledger", fake_dir);
        (void) unlink(ledger);  /* which processes use what: no memory of its own */
        snprintf(ledger, sizeof(ledger), "%s/fakecuda-exports", fake_dir);
        (void) unlink(ledger);  /* the exports' count (fake_exports()) */
        snprintf(ledger, sizeof(ledger), "%s/fakecuda-export-builds", fake_dir);
        (void) unlink(ledger);  /* those that found no other export open */
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
void cuda_start(struct testd *d, const char *extra1, const char *extra2) {
        fake_node_new();
        testd_start(d, "--backend", cuda_backend, extra1, extra2, NULL);
}

/* Starts a cuda-vmm daemon on a fresh node (cuda_stop() goes back to the legacy backend). */
void vmm_start(struct testd *d) {
        cuda_backend = "cuda-vmm";
        cuda_start(d, NULL, NULL);
}

/* Stops it; on the fake, every allocation must have been freed by then. */
void cuda_stop(struct testd *d) {
        ck_assert_int_eq(testd_stop(d), 0);
        fake_node_done();
        cuda_backend = "cuda";
}


void client_failed(void *page, int line, gpupool_client *c) {
        struct client_failure *f = page;

        f->line = line;
        if (c)
                gpupool_last_error(c, f->error, sizeof(f->error));
        else
                gpupool_hook_last_error(f->error, sizeof(f->error));
}

/*
 * Runs client in a process of its own against d; it must exit 0. What it failed at, if it
 * did, is in the message.
 */
void check_client(struct testd *d, int (*client)(struct testd *d, void *arg), const char *name) {
        struct client_failure *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        int status;

        ck_assert_ptr_ne(f, MAP_FAILED);
        status = reap(spawn(client, d, f));
        ck_assert_msg(status == 0, "%s failed: exit %d (line %lld: %s)", name, status, f->line,
                      f->error[0] ? f->error : "no error from gpupool");
        munmap(f, sizeof(*f));
}

/* Queues device work on s writing block p, held still until release_work(). */
int queue_work(struct gpu *g, gp_cu_stream s, void *p, size_t size) {
        if (gpu_hold(g, s, 1) < 0 || g->memset_d8_async(dptr(p), 0xa5, size, s) != GP_CUDA_SUCCESS)
                return -1;
        return 0;
}

void release_work(struct gpu *g, gp_cu_stream s) {
        gpu_hold(g, s, 0);
}

/* Runs client against a fresh cuda daemon, as check_client(); it must leave nothing in use. */
void run_client(int (*client)(struct testd *d, void *arg), const char *name) {
        struct testd d;

        cuda_start(&d, NULL, NULL);
        check_client(&d, client, name);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
/* What device index holds leased to clients: reserved but not cached. */
long long leased_on(struct testd *d, unsigned index) {
        return testd_device(d, index, "reserved_bytes") - testd_device(d, index, "cached_bytes");
}
