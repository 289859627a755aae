/*
 * bench_driver.c: what each driver call on libgpupool's stream-ordered path costs, and which
 * of them a graph capture forbids (make bench-driver).
 *
 * A stream-ordered free (gpupool_free_async, PyTorch's free through the hooks) makes driver
 * calls on the caller's thread; on a GPU their cost is the allocator's. This times each call
 * alone, on device 0's primary context and one non-blocking stream, as the median of
 * --rounds rounds of --calls calls, in ns per call; then, with --socket, a
 * gpupool_alloc_async + gpupool_free_async pair on that stream and a gpupool_alloc +
 * gpupool_free pair, the allocator's whole cost. Then what moving a granule costs, which
 * segments that grow in place do on cuda-vmm when an idle granule goes under a new block
 * (common/granule.c): cuMemUnmap of a 2 MiB cuMemCreate allocation at one place of a reserved
 * range, cuMemMap at another and cuMemSetAccess, each timed alone on an idle device (median of
 * --moves moves), then whole moves while another stream's work is outstanding (held by
 * cuStreamWaitValue32 on a word of host memory, or the fake driver's hold, let go 50 ms
 * later by a thread), to see whether a move waits for the device's work: the driver documents
 * cuMemUnmap and cuMemSetAccess as "synchronous for most use cases". Then it starts a capture
 * in CU_STREAM_CAPTURE_MODE_GLOBAL on one stream and prints what each call returns, in the
 * capturing thread and in the relaxed mode, on the capturing stream and on another.
 *
 * It runs on the driver gp_cuda_load() finds ($GPUPOOL_LIBCUDA: the fake driver too).
 *
 * Usage: bench_driver [--socket PATH] [--calls N] [--rounds N] [--moves N]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudadrv.h"
#include "gpu_open.h"
#include "gpupool.h"
#include "measure.h"

static struct gp_cuda cu;
static gp_cu_stream s, other;
static gp_cu_event ev, ev2;
static gp_cu_context ctx;
static gpupool_client *client;
static unsigned calls = 100000, rounds = 11, moves = 1001;

static gp_cu_result (*begin_capture)(gp_cu_stream s, int mode);
static gp_cu_result (*end_capture)(gp_cu_stream s, void **graph);
static gp_cu_result (*graph_destroy)(void *graph);

/* The calls timed; each returns the driver's result. */
static gp_cu_result call_push_pop(void) {
        gp_cu_context c;
        gp_cu_result r = cu.cuCtxPushCurrent(ctx);

        return r == GP_CUDA_SUCCESS ? cu.cuCtxPopCurrent(&c) : r;
}

static gp_cu_result call_stream_id(void) {
        unsigned long long id;

        return cu.cuStreamGetId(s, &id);
}

static gp_cu_result call_is_capturing(void) {
        int st;

        return cu.cuStreamIsCapturing(s, &st);
}

static gp_cu_result call_record(void) {
        return cu.cuEventRecord(ev, s);
}

static gp_cu_result call_query(void) {
        gp_cu_result r = cu.cuEventQuery(ev2);

        return r == GP_CUDA_ERROR_NOT_READY ? GP_CUDA_SUCCESS : r;
}

static gp_cu_result call_relax_pair(void) {
        int mode = GP_CU_STREAM_CAPTURE_MODE_RELAXED;
        gp_cu_result r = cu.cuThreadExchangeStreamCaptureMode(&mode);

        return r == GP_CUDA_SUCCESS ? cu.cuThreadExchangeStreamCaptureMode(&mode) : r;
}

static gp_cu_result call_pair_async(void) {
        void *p;

        if (gpupool_alloc_async(client, 0, 64 * 1024, s, &p) < 0 || gpupool_free_async(client, p, s) < 0)
                return GP_CUDA_ERROR_UNKNOWN;
        return GP_CUDA_SUCCESS;
}

static gp_cu_result call_pair(void) {
        void *p;

        if (gpupool_alloc(client, 0, 64 * 1024, &p) < 0 || gpupool_free(client, p) < 0)
                return GP_CUDA_ERROR_UNKNOWN;
        return GP_CUDA_SUCCESS;
}

/* The same pair on a handle with both promises (gpupool_promise()), and through PyTorch's hooks, which make them. */
static gpupool_client *promised;

static gp_cu_result call_pair_promised(void) {
        void *p;

        if (gpupool_alloc_async(promised, 0, 64 * 1024, s, &p) < 0 || gpupool_free_async(promised, p, s) < 0)
                return GP_CUDA_ERROR_UNKNOWN;
        return GP_CUDA_SUCCESS;
}

static gp_cu_result call_pair_torch(void) {
        void *p = gpupool_torch_alloc(64 * 1024, 0, (struct CUstream_st *) s);

        if (!p)
                return GP_CUDA_ERROR_UNKNOWN;
        gpupool_torch_free(p, 64 * 1024, 0, (struct CUstream_st *) s);
        return gpupool_hook_last_error(NULL, 0) ? GP_CUDA_ERROR_UNKNOWN : GP_CUDA_SUCCESS;
}

static void time_call(const char *name, gp_cu_result (*fn)(void)) {
        double *r = calloc(rounds, sizeof(*r));

        for (unsigned k = 0; k < rounds; k++) {
                double t = now_ns();

                for (unsigned i = 0; i < calls; i++) {
                        gp_cu_result res = fn();

                        if (res != GP_CUDA_SUCCESS) {
                                fprintf(stderr, "bench_driver: %s: %s\n", name, gp_cuda_error_name(&cu, res));
                                exit(1);
                        }
                }
                r[k] = (now_ns() - t) / calls;
        }
        printf("%-48s %8.0f ns\n", name, median(r, rounds));
        free(r);
}

/* ---- what a granule move costs (cuda-vmm, segments that grow in place) ---- */

#define HOLD_MS 50
#define HELD_MOVES 11

/* Holds a stream's work back: on a GPU a wait for a word of host memory, on the fake its hold. */
struct holder {
        int (*fake_hold)(gp_cu_stream s, int hold);     /* the fake driver's, else NULL */
        gp_cu_result (*wait_value32)(gp_cu_stream s, gp_cu_deviceptr addr, uint32_t v, unsigned flags);
        volatile uint32_t *gate;                        /* GPU: 1 lets the stream go */
        gp_cu_deviceptr gate_dev;
        gp_cu_stream s;
};

static int holder_open(struct holder *h, gp_cu_stream st) {
        gp_cu_result (*host_alloc)(void **p, size_t size, unsigned flags);
        gp_cu_result (*host_device_ptr)(gp_cu_deviceptr *d, void *p, unsigned flags);
        void *host;

        h->s = st;
        *(void **) &h->fake_hold = dlsym(cu.lib, "fakecuda_stream_hold");
        if (h->fake_hold)
                return 0;
        *(void **) &host_alloc = gp_cuda_symbol(&cu, "cuMemHostAlloc", 3020);
        *(void **) &host_device_ptr = gp_cuda_symbol(&cu, "cuMemHostGetDevicePointer", 3020);
        *(void **) &h->wait_value32 = gp_cuda_symbol(&cu, "cuStreamWaitValue32", 12000);
        if (!host_alloc || !host_device_ptr || !h->wait_value32 ||
            host_alloc(&host, 4096, 0x01 | 0x02 /* PORTABLE | DEVICEMAP */) != GP_CUDA_SUCCESS ||
            host_device_ptr(&h->gate_dev, host, 0) != GP_CUDA_SUCCESS)
                return -1;
        h->gate = host;
        return 0;
}

static int holder_hold(struct holder *h) {
        if (h->fake_hold)
                return h->fake_hold(h->s, 1);
        *h->gate = 0;
        return h->wait_value32(h->s, h->gate_dev, 1, 0 /* CU_STREAM_WAIT_VALUE_GEQ */) == GP_CUDA_SUCCESS ? 0 : -1;
}

static void holder_let_go(struct holder *h) {
        if (h->fake_hold)
                (void) h->fake_hold(h->s, 0);
        else if (h->gate)
                __atomic_store_n(h->gate, 1, __ATOMIC_SEQ_CST);
}

static void *holder_let_go_later(void *arg) {
        struct timespec ts = { 0, HOLD_MS * 1000000L };

        nanosleep(&ts, NULL);
        holder_let_go(arg);
        return NULL;
}

/* The granule: device 0's memory, exportable as a descriptor (as gpupoold makes it), read and written by device 0. */
static const gp_cu_mem_prop granule_prop = { .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
                                             .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             .location = { GP_CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
static const gp_cu_mem_access_desc granule_rw = { .location = { GP_CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                                                  .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };

/* Moves granule g from place at[from] to at[!from] of a reserved range, each call's ns into t[3]. */
static gp_cu_result move_granule(gp_cu_mem_handle g, const gp_cu_deviceptr at[2], int from, size_t size, double t[3]) {
        gp_cu_result r;
        double t0 = now_ns(), t1, t2;

        r = cu.cuMemUnmap(at[from], size);
        t1 = now_ns();
        if (r == GP_CUDA_SUCCESS)
                r = cu.cuMemMap(at[!from], size, 0, g, 0);
        t2 = now_ns();
        if (r == GP_CUDA_SUCCESS)
                r = cu.cuMemSetAccess(at[!from], size, &granule_rw, 1);
        t[0] = t1 - t0;
        t[1] = t2 - t1;
        t[2] = now_ns() - t2;
        return r;
}

static void granule_moves(void) {
        static const char *const names[3] = { "cuMemUnmap", "cuMemMap", "cuMemSetAccess" };
        double *t[3] = { calloc(moves, sizeof(double)), calloc(moves, sizeof(double)), calloc(moves, sizeof(double)) };
        double held[HELD_MOVES], one[3];
        gp_cu_deviceptr base = 0, at[2], work = 0;
        gp_cu_mem_handle g = 0;
        gp_cu_stream busy = NULL;
        struct holder h = { 0 };
        unsigned waited = 0, k;
        size_t size = 0;
        int from = 0;
        gp_cu_result r;

#define TRY(call) do { if ((r = (call)) != GP_CUDA_SUCCESS) { \
                printf("granule moves: %s: %s\n", #call, gp_cuda_error_name(&cu, r)); goto out; } } while (0)
        TRY(cu.cuMemGetAllocationGranularity(&size, &granule_prop, GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        if (size < (2u << 20))
                size = 2u << 20;        /* what gpupool's granule is */
        TRY(cu.cuMemCreate(&g, size, &granule_prop, 0));
        TRY(cu.cuMemAddressReserve(&base, 2 * size, 0, 0, 0));
        at[0] = base;
        at[1] = base + size;
        TRY(cu.cuMemMap(at[0], size, 0, g, 0));
        TRY(cu.cuMemSetAccess(at[0], size, &granule_rw, 1));
        for (k = 0; k < moves; k++, from = !from) {
                TRY(move_granule(g, at, from, size, one));
                for (int c = 0; c < 3; c++)
                        t[c][k] = one[c];
        }
        printf("granule move on cuda-vmm (%zu MiB), idle device, median of %u moves:\n", size >> 20, moves);
        for (int c = 0; c < 3; c++)
                printf("  %-46s %8.0f ns\n", names[c], median(t[c], moves));
        /* The same with another stream's work outstanding: a wait, then a memset of memory of its own. */
        TRY(cu.cuStreamCreate(&busy, GP_CU_STREAM_NON_BLOCKING));
        TRY(cu.cuMemAlloc(&work, size));
        if (holder_open(&h, busy) < 0) {
                printf("granule moves: no host-mapped memory or cuStreamWaitValue32 to hold a stream with\n");
                goto out;
        }
        for (k = 0; k < HELD_MOVES; k++, from = !from) {
                pthread_t thread;
                double t0;

                if (holder_hold(&h) < 0) {
                        printf("granule moves: cannot hold a stream\n");
                        goto out;
                }
                TRY(cu.cuMemsetD8Async(work, (unsigned char) k, size, busy));
                if (pthread_create(&thread, NULL, holder_let_go_later, &h) != 0) {
                        printf("granule moves: no thread to let the stream go\n");
                        goto out;
                }
                t0 = now_ns();
                r = move_granule(g, at, from, size, one);
                held[k] = now_ns() - t0;
                pthread_join(thread, NULL);
                if (r != GP_CUDA_SUCCESS) {
                        printf("granule moves: a move with work held: %s\n", gp_cuda_error_name(&cu, r));
                        goto out;
                }
                waited += held[k] >= HOLD_MS * 1e6 * 0.8;
                TRY(cu.cuStreamSynchronize(busy));
        }
        printf("granule move with another stream's work held %d ms: median %.0f ns, %u of %d moves waited for it\n",
               HOLD_MS, median(held, HELD_MOVES), waited, HELD_MOVES);
out:
        if (busy) {
                holder_let_go(&h);      /* a stream left held by a failure above */
                (void) cu.cuStreamSynchronize(busy);
        }
        if (base) {
                (void) cu.cuMemUnmap(at[from], size);
                (void) cu.cuMemAddressFree(base, 2 * size);
        }
        if (g)
                (void) cu.cuMemRelease(g);
        if (work)
                (void) cu.cuMemFree(work);
        if (busy)
                (void) cu.cuStreamDestroy(busy);
        for (int c = 0; c < 3; c++)
                free(t[c]);
#undef TRY
}

/* ---- how many driver calls a pair makes (the fake driver counts them: fakecuda_calls()) ---- */

#define COUNT_WARMUP 2000
#define COUNT_PAIRS 20000

static unsigned long long (*fake_calls)(const char *name, int mine);
static const char *(*fake_call_name)(unsigned i);

enum count_path { PATH_C, PATH_PROMISED, PATH_TORCH };

/* One pair of size bytes on stream st by path; 0 or -1. */
static int count_pair(enum count_path path, size_t size, gp_cu_stream st) {
        void *p = NULL;

        if (path == PATH_TORCH) {
                if (!(p = gpupool_torch_alloc((ssize_t) size, 0, (struct CUstream_st *) st)))
                        return -1;
                gpupool_torch_free(p, (ssize_t) size, 0, (struct CUstream_st *) st);
                return gpupool_hook_last_error(NULL, 0) ? -1 : 0;
        }
        gpupool_client *h = path == PATH_C ? client : promised;

        return gpupool_alloc_async(h, 0, size, st, &p) < 0 || gpupool_free_async(h, p, st) < 0 ? -1 : 0;
}

/*
 * Pairs by path: the i-th on streams[i % nstreams], of sizes[i % nsizes]; after COUNT_WARMUP
 * of them, the calls per pair of COUNT_PAIRS more, on this thread (exact from run to run) and in
 * all the process's threads (the library's reaper thread's waits and queries too, which vary),
 * and this thread's calls by entry point.
 */
static void count_calls(const char *what, enum count_path path, const size_t *sizes, unsigned nsizes,
                        const gp_cu_stream *streams, unsigned nstreams) {
        unsigned long long mine, all, each[128];
        char why[256];
        unsigned n = 0;

        for (unsigned i = 0; i < COUNT_WARMUP; i++)
                if (count_pair(path, sizes[i % nsizes], streams[i % nstreams]) < 0)
                        goto failed;
        mine = fake_calls(NULL, 1);
        all = fake_calls(NULL, 0);
        for (n = 0; n < 128 && fake_call_name(n); n++)
                each[n] = fake_calls(fake_call_name(n), 1);
        for (unsigned i = 0; i < COUNT_PAIRS; i++)
                if (count_pair(path, sizes[i % nsizes], streams[i % nstreams]) < 0)
                        goto failed;
        printf("  %-46s %6.2f %6.2f ", what, (double) (fake_calls(NULL, 1) - mine) / COUNT_PAIRS,
               (double) (fake_calls(NULL, 0) - all) / COUNT_PAIRS);
        for (unsigned k = 0, first = 1; k < n; k++) {
                unsigned long long d = fake_calls(fake_call_name(k), 1) - each[k];

                if (d) {
                        printf("%s%s %.2f", first ? " " : ", ", fake_call_name(k), (double) d / COUNT_PAIRS);
                        first = 0;
                }
        }
        printf("\n");
        return;
failed:
        gpupool_last_error(path == PATH_C ? client : promised, why, sizeof(why));
        printf("  %-46s failed: %s\n", what, path == PATH_TORCH ? "see gpupool_hook_last_error()" : why);
}

static void count_paths(void) {
        static const size_t one[] = { 1u << 20 };
        static const size_t eight[] = { 256u << 10, 512u << 10, 1u << 20, 3u << 19, 2u << 20, 3u << 20, 5u << 20, 8u << 20 };
        static const struct { const char *name; enum count_path path; } paths[] = {
                { "gpupool_alloc_async + gpupool_free_async", PATH_C },
                { "the same, both promises (gpupool_promise)", PATH_PROMISED },
                { "gpupool_torch_alloc + gpupool_torch_free", PATH_TORCH },
        };
        gp_cu_stream two[2] = { s, other };
        char what[96];

        printf("driver calls per alloc+free pair after %d pairs, of %d pairs: this thread, all threads, this thread's by entry point\n",
               COUNT_WARMUP, COUNT_PAIRS);
        for (unsigned k = 0; k < sizeof(paths) / sizeof(paths[0]); k++) {
                printf("%s:\n", paths[k].name);
                count_calls("1 MiB, one stream", paths[k].path, one, 1, &s, 1);
                count_calls("8 sizes (256 KiB to 8 MiB) in turn, one stream", paths[k].path, eight, 8, &s, 1);
                snprintf(what, sizeof(what), "1 MiB, two streams alternating");
                count_calls(what, paths[k].path, one, 1, two, 2);
                count_calls("8 sizes in turn, two streams alternating", paths[k].path, eight, 8, two, 2);
        }
}

/*
 * What the stream calls of the library's path return with no context current: on a stream
 * the caller made, and on the legacy default stream (the current context's).
 */
static void context_rules(void) {
        unsigned long long id;
        gp_cu_context c;
        gp_cu_result r;
        int st;

        if (cu.cuCtxPopCurrent(&c) != GP_CUDA_SUCCESS)
                return;
        printf("no context current:\n");
#define SHOW(what, call) do { r = (call); printf("  %-44s %s\n", what, gp_cuda_error_name(&cu, r)); } while (0)
        SHOW("cuStreamIsCapturing(s)", cu.cuStreamIsCapturing(s, &st));
        SHOW("cuStreamGetId(s)", cu.cuStreamGetId(s, &id));
        SHOW("cuEventRecord(ev, s)", cu.cuEventRecord(ev, s));
        SHOW("cuEventQuery(ev)", cu.cuEventQuery(ev));
        SHOW("cuStreamIsCapturing(NULL)", cu.cuStreamIsCapturing(NULL, &st));
        SHOW("cuStreamGetId(NULL)", cu.cuStreamGetId(NULL, &id));
#undef SHOW
        (void) cu.cuCtxPushCurrent(ctx);
        (void) cu.cuStreamSynchronize(s);
}

/* What each call returns during a global capture on s, in mode (the thread's). */
static void capture_rules(int mode) {
        unsigned long long id;
        gp_cu_event e = NULL;
        void *graph = NULL;
        int st = -1, m;
        gp_cu_result r;

        r = begin_capture(s, GP_CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (r != GP_CUDA_SUCCESS) {
                printf("cuStreamBeginCapture: %s\n", gp_cuda_error_name(&cu, r));
                return;
        }
        m = mode;
        (void) cu.cuThreadExchangeStreamCaptureMode(&m);
        printf("capture in global mode on stream s, this thread %s:\n",
               mode == GP_CU_STREAM_CAPTURE_MODE_RELAXED ? "relaxed" : "in global mode");
#define SHOW(what, call) do { r = (call); printf("  %-44s %s\n", what, gp_cuda_error_name(&cu, r)); } while (0)
        SHOW("cuStreamIsCapturing(s)", cu.cuStreamIsCapturing(s, &st));
        printf("  %-44s %d\n", "  status", st);
        SHOW("cuStreamIsCapturing(other)", cu.cuStreamIsCapturing(other, &st));
        SHOW("cuStreamGetId(s)", cu.cuStreamGetId(s, &id));
        SHOW("cuStreamGetId(other)", cu.cuStreamGetId(other, &id));
        SHOW("cuEventCreate", cu.cuEventCreate(&e, GP_CU_EVENT_BLOCKING_SYNC | GP_CU_EVENT_DISABLE_TIMING));
        SHOW("cuEventRecord(other)", cu.cuEventRecord(ev, other));
        SHOW("cuEventQuery", cu.cuEventQuery(ev));
        SHOW("cuCtxPushCurrent", cu.cuCtxPushCurrent(ctx));
        {
                gp_cu_context c;

                SHOW("cuCtxPopCurrent", cu.cuCtxPopCurrent(&c));
        }
        (void) cu.cuThreadExchangeStreamCaptureMode(&m);
        SHOW("cuStreamEndCapture(s)", end_capture(s, &graph));
        if (graph)
                (void) graph_destroy(graph);
        if (e)
                (void) cu.cuEventDestroy(e);
#undef SHOW
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "socket", required_argument, NULL, 's' }, { "calls", required_argument, NULL, 'n' },
                { "rounds", required_argument, NULL, 'r' }, { "moves", required_argument, NULL, 'm' },
                { NULL, 0, NULL, 0 },
        };
        const char *sock = NULL;
        int o;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                if (o == 's')
                        sock = optarg;
                else if (o == 'n')
                        calls = (unsigned) strtoul(optarg, NULL, 10);
                else if (o == 'r')
                        rounds = (unsigned) strtoul(optarg, NULL, 10);
                else if (o == 'm')
                        moves = (unsigned) strtoul(optarg, NULL, 10);
                else
                        return 2;
        }
        if (!calls || !rounds || !moves) {
                fprintf(stderr, "bench_driver: --calls, --rounds and --moves must be at least 1\n");
                return 2;
        }
        bench_gpu_open(&cu, &ctx, "bench_driver");
        *(void **) &begin_capture = gp_cuda_symbol(&cu, "cuStreamBeginCapture", 10010);
        *(void **) &end_capture = gp_cuda_symbol(&cu, "cuStreamEndCapture", 10000);
        *(void **) &graph_destroy = gp_cuda_symbol(&cu, "cuGraphDestroy", 10000);
        if (!begin_capture || !end_capture || !graph_destroy || cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            cu.cuEventCreate(&ev, GP_CU_EVENT_BLOCKING_SYNC | GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS ||
            cu.cuEventCreate(&ev2, GP_CU_EVENT_BLOCKING_SYNC | GP_CU_EVENT_DISABLE_TIMING) != GP_CUDA_SUCCESS ||
            cu.cuEventRecord(ev2, s) != GP_CUDA_SUCCESS || cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "bench_driver: the driver has no GPU 0 to work on\n");
                return 1;
        }
        printf("# driver %d.%d; median of %u rounds of %u calls\n", cu.driver_version / 1000,
               cu.driver_version % 1000 / 10, rounds, calls);
        time_call("cuCtxPushCurrent + cuCtxPopCurrent", call_push_pop);
        time_call("cuStreamGetId", call_stream_id);
        time_call("cuStreamIsCapturing", call_is_capturing);
        time_call("cuEventRecord (empty stream)", call_record);
        time_call("cuEventQuery (completed event)", call_query);
        time_call("cuThreadExchangeStreamCaptureMode, twice", call_relax_pair);
        if (sock) {
                if (gpupool_connect(sock, "bench-driver", &client) < 0) {
                        fprintf(stderr, "bench_driver: cannot connect to %s\n", sock);
                        return 1;
                }
                /* The hooks' shared handle connects to the same daemon, promised as use_with_torch() does. */
                setenv("GPUPOOL_SOCKET", sock, 1);
                if (gpupool_connect(sock, "bench-driver", &promised) < 0 ||
                    gpupool_promise(promised, GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD) < 0 ||
                    gpupool_torch_promise(GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD) < 0) {
                        fprintf(stderr, "bench_driver: cannot connect to %s with promises\n", sock);
                        return 1;
                }
                time_call("gpupool_alloc + gpupool_free (64 KiB)", call_pair);
                time_call("gpupool_alloc_async + gpupool_free_async (64 KiB)", call_pair_async);
                time_call("the same, both promises (gpupool_promise)", call_pair_promised);
                time_call("gpupool_torch_alloc + gpupool_torch_free", call_pair_torch);
                *(void **) &fake_calls = dlsym(cu.lib, "fakecuda_calls");
                *(void **) &fake_call_name = dlsym(cu.lib, "fakecuda_call_name");
                if (fake_calls && fake_call_name)
                        count_paths();
                if (cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || cu.cuStreamSynchronize(other) != GP_CUDA_SUCCESS)
                        return 1;
                gpupool_disconnect(promised);
                gpupool_disconnect(client);
        }
        context_rules();
        granule_moves();
        capture_rules(GP_CU_STREAM_CAPTURE_MODE_GLOBAL);
        capture_rules(GP_CU_STREAM_CAPTURE_MODE_RELAXED);
        return 0;
}
