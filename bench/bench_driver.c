/*
 * bench_driver.c: what each driver call on libgpupool's stream-ordered path costs, and which
 * of them a graph capture forbids (make bench-driver).
 *
 * A stream-ordered free (gpupool_free_async, PyTorch's free through the hooks) makes driver
 * calls on the caller's thread; on a GPU their cost is the allocator's. This times each call
 * alone, on device 0's primary context and one non-blocking stream, as the median of
 * --rounds rounds of --calls calls, in ns per call; then, with --socket, a
 * gpupool_alloc_async + gpupool_free_async pair on that stream and a gpupool_alloc +
 * gpupool_free pair, the allocator's whole cost. Then it starts a capture in
 * CU_STREAM_CAPTURE_MODE_GLOBAL on one stream and prints what each call returns, in the
 * capturing thread and in the relaxed mode, on the capturing stream and on another.
 *
 * It runs on the driver gp_cuda_load() finds ($GPUPOOL_LIBCUDA: the fake driver too).
 *
 * Usage: bench_driver [--socket PATH] [--calls N] [--rounds N]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "gpupool.h"
#include "measure.h"

static struct gp_cuda cu;
static gp_cu_stream s, other;
static gp_cu_event ev, ev2;
static gp_cu_context ctx;
static gpupool_client *client;
static unsigned calls = 100000, rounds = 11;

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
        qsort(r, rounds, sizeof(*r), cmp_double);
        printf("%-48s %8.0f ns\n", name, r[rounds / 2]);
        free(r);
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
                { "rounds", required_argument, NULL, 'r' }, { NULL, 0, NULL, 0 },
        };
        const char *sock = NULL;
        gp_cu_device dev;
        char err[256];
        int o;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                if (o == 's')
                        sock = optarg;
                else if (o == 'n')
                        calls = (unsigned) strtoul(optarg, NULL, 10);
                else if (o == 'r')
                        rounds = (unsigned) strtoul(optarg, NULL, 10);
                else
                        return 2;
        }
        if (!calls || !rounds) {
                fprintf(stderr, "bench_driver: --calls and --rounds must be at least 1\n");
                return 2;
        }
        if (gp_cuda_load(&cu, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_driver: %s\n", err);
                return 1;
        }
        *(void **) &begin_capture = gp_cuda_symbol(&cu, "cuStreamBeginCapture", 10010);
        *(void **) &end_capture = gp_cuda_symbol(&cu, "cuStreamEndCapture", 10000);
        *(void **) &graph_destroy = gp_cuda_symbol(&cu, "cuGraphDestroy", 10000);
        if (!begin_capture || !end_capture || !graph_destroy || cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS ||
            cu.cuDevicePrimaryCtxRetain(&ctx, dev) != GP_CUDA_SUCCESS || cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS ||
            cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
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
                time_call("gpupool_alloc + gpupool_free (64 KiB)", call_pair);
                time_call("gpupool_alloc_async + gpupool_free_async (64 KiB)", call_pair_async);
                if (cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS)
                        return 1;
                gpupool_disconnect(client);
        }
        capture_rules(GP_CU_STREAM_CAPTURE_MODE_GLOBAL);
        capture_rules(GP_CU_STREAM_CAPTURE_MODE_RELAXED);
        return 0;
}
