/*
 * bench_pending.c: what an allocation costs while stream-ordered frees wait for the device
 * (make bench-pending).
 *
 * PyTorch's CPU runs far ahead of its GPU, so thousands of frees may be pending, each behind
 * an event, when the next allocation comes. This times gpupool_alloc + gpupool_free pairs of
 * 64 KiB (served by the process's pool) with no free pending, the baseline, and then with
 * --pending frees (default 10,000) queued with gpupool_free_async on a stream whose work has
 * not ended, and on 1 and 4 such streams. Every allocation reaps first, so the pairs show
 * what the pending frees cost it. Reported: the median of --rounds rounds of --pairs pairs,
 * in ns per pair, and on the fake driver the cuEventQuery calls per pair (exact from run to
 * run; the fake's own query is slower than the driver's, so its ns say less).
 *
 * The stream's work: on the fake driver (tests/fakecuda, $GPUPOOL_LIBCUDA) the stream is held
 * still; on a GPU, a chain of cuMemsetD8Async long enough to outlast the measurement.
 *
 * Usage: bench_pending --socket PATH [--pending N] [--pairs N] [--rounds N]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudadrv.h"
#include "gpu_open.h"
#include "gpupool.h"
#include "measure.h"

struct bench {
        struct gp_cuda cu;
        gp_cu_result (*memset_d8_async)(gp_cu_deviceptr p, unsigned char v, size_t n, gp_cu_stream s);
        int (*hold)(gp_cu_stream s, int hold);          /* the fake driver's */
        unsigned long long (*event_queries)(void);      /* the fake driver's */
        gpupool_client *c;
        unsigned pairs, rounds;
};

/* The median over the rounds of ns per alloc+free pair; on the fake, *ret_queries: cuEventQuery calls per pair. */
static double pairs_ns(struct bench *b, double *ret_queries) {
        double *r = calloc(b->rounds, sizeof(*r)), med;
        unsigned long long q0 = b->event_queries ? b->event_queries() : 0;

        for (unsigned k = 0; k < b->rounds; k++) {
                double t = now_ns();

                for (unsigned i = 0; i < b->pairs; i++) {
                        void *p;

                        if (gpupool_alloc(b->c, 0, 64 * 1024, &p) < 0 || gpupool_free(b->c, p) < 0) {
                                fprintf(stderr, "bench_pending: allocation failed\n");
                                exit(1);
                        }
                }
                r[k] = (now_ns() - t) / b->pairs;
        }
        *ret_queries = b->event_queries ? (double) (b->event_queries() - q0) / ((double) b->pairs * b->rounds) : -1;
        qsort(r, b->rounds, sizeof(*r), cmp_double);
        med = r[b->rounds / 2];
        free(r);
        return med;
}

/* Queues pending frees spread over nstreams streams kept busy; returns the streams. */
static void make_pending(struct bench *b, unsigned pending, unsigned nstreams, gp_cu_stream *streams, void **blocks) {
        for (unsigned s = 0; s < nstreams; s++) {
                if (b->cu.cuStreamCreate(&streams[s], GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS) {
                        fprintf(stderr, "bench_pending: cuStreamCreate failed\n");
                        exit(1);
                }
                if (b->hold)
                        b->hold(streams[s], 1);
        }
        for (unsigned i = 0; i < pending; i++)
                if (gpupool_alloc(b->c, 0, 4096, &blocks[i]) < 0) {
                        fprintf(stderr, "bench_pending: allocation failed\n");
                        exit(1);
                }
        /* Work on each stream: one memset the fake holds, or on a GPU about 2 s of them. */
        for (unsigned s = 0; s < nstreams; s++)
                for (int k = 0; k < (b->hold ? 1 : 20000); k++)
                        if (b->memset_d8_async((gp_cu_deviceptr) (uintptr_t) blocks[s], 1, 4096, streams[s]) != GP_CUDA_SUCCESS) {
                                fprintf(stderr, "bench_pending: cuMemsetD8Async failed\n");
                                exit(1);
                        }
        for (unsigned i = 0; i < pending; i++)
                if (gpupool_free_async(b->c, blocks[i], streams[i % nstreams]) < 0) {
                        fprintf(stderr, "bench_pending: gpupool_free_async failed\n");
                        exit(1);
                }
}

static void end_pending(struct bench *b, unsigned nstreams, gp_cu_stream *streams) {
        for (unsigned s = 0; s < nstreams; s++) {
                if (b->hold)
                        b->hold(streams[s], 0);
                (void) b->cu.cuStreamSynchronize(streams[s]);
                (void) b->cu.cuStreamDestroy(streams[s]);
        }
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "socket", required_argument, NULL, 's' }, { "pending", required_argument, NULL, 'n' },
                { "pairs", required_argument, NULL, 'p' }, { "rounds", required_argument, NULL, 'r' }, { 0 },
        };
        struct bench b = { .pairs = 2000, .rounds = 21 };
        const char *sock = NULL;
        unsigned pending = 10000;
        double base, queries;
        int o;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (o) {
                case 's': sock = optarg; break;
                case 'n': pending = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'p': b.pairs = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'r': b.rounds = (unsigned) strtoul(optarg, NULL, 10); break;
                default: return 2;
                }
        }
        if (!sock || !pending || !b.pairs || !b.rounds) {
                fprintf(stderr, "usage: bench_pending --socket PATH [--pending N] [--pairs N] [--rounds N]\n");
                return 2;
        }
        bench_gpu_open(&b.cu, NULL, "bench_pending");
        *(void **) &b.memset_d8_async = gp_cuda_symbol(&b.cu, "cuMemsetD8Async", 3020);
        *(void **) &b.hold = dlsym(b.cu.lib, "fakecuda_stream_hold");
        *(void **) &b.event_queries = dlsym(b.cu.lib, "fakecuda_event_queries");
        if (gpupool_connect(sock, "bench-pending", &b.c) < 0) {
                fprintf(stderr, "bench_pending: cannot connect to %s\n", sock);
                return 1;
        }
        printf("# %s driver; %u pairs of gpupool_alloc+gpupool_free (64 KiB) per round, median of %u rounds\n",
               b.hold ? "the fake" : "a real", b.pairs, b.rounds);
        base = pairs_ns(&b, &queries);
        printf("%-44s %10.0f ns/pair", "no free pending (baseline)", base);
        if (queries >= 0)
                printf(", %.1f event queries/pair", queries);
        printf("\n");
        for (unsigned nstreams = 1; nstreams <= 4; nstreams *= 4) {
                gp_cu_stream streams[4];
                void **blocks = calloc(pending, sizeof(*blocks));
                char what[64];
                double ns;

                make_pending(&b, pending, nstreams, streams, blocks);
                ns = pairs_ns(&b, &queries);
                snprintf(what, sizeof(what), "%u frees pending on %u stream%s", pending, nstreams, nstreams == 1 ? "" : "s");
                printf("%-44s %10.0f ns/pair (%.2fx the baseline)", what, ns, ns / base);
                if (queries >= 0)
                        printf(", %.1f event queries/pair", queries);
                printf("\n");
                end_pending(&b, nstreams, streams);
                free(blocks);
        }
        gpupool_disconnect(b.c);
        return 0;
}
