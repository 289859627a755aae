/*
 * lag.c: "make bench-lag": what a GPU that runs behind the CPU costs a real allocation pattern
 * in memory, on the fake driver.
 *
 * PyTorch's CPU queues work far ahead of its GPU, and frees blocks on the stream that will
 * reuse them: its own allocator hands such a block to the next allocation on that stream at
 * once (the stream orders the work). gpupool_free_async() does the same for that stream, and
 * makes the block any allocation's once an event recorded after it (one for many frees) has
 * completed. What a process holds beyond frees at once, and the events it records, may depend
 * on how far the GPU lags. This replays allocation traces
 * (bench/traces/README.md) on one stream through gpupool_alloc_async() and
 * gpupool_free_async(), against a gpupoold on the fake driver (tests/fakecuda, whose
 * fakecuda_stream_hold() holds a stream's work), each operation queueing a 1-byte memset on
 * the stream as its kernel, with the GPU:
 *
 *   sync          no lag: every free is gpupool_free(), the block free at once, as PyTorch's
 *                 allocator treats a block freed on the stream that reuses it (the baseline);
 *   N             frees on the stream, whose work is held and let run every N operations, so
 *                 that the GPU ends up to N operations behind; after each catch-up the replay
 *                 waits for the library's reaper to return the completed frees (it does so
 *                 within a millisecond of the GPU's progress, when a training step's
 *                 operations are tens of microseconds apart);
 *   held          frees on the stream, whose work never runs during the trace: no free's event
 *                 completes, only same-stream reuse.
 *
 * Per trace and lag it prints the most the process held mapped (peak leased, MiB), the most
 * the trace held live (peak in use, sizes rounded to 512 B) and their ratio, the round trips to
 * the daemon, the segments imported, the trace's frees and the events the process recorded
 * meanwhile (cuEventRecord, counted by the fake driver). Each trace and lag has a gpupoold of its own (the
 * build's, --backend cuda, an empty config) and a handle of its own, so that no run finds
 * another's segments in the daemon's cache.
 *
 * With a lag the results vary from run to run (the sync rows do not): each trace and lag runs
 * --runs times (5), and the row is the run of median peak leased, with the range of the ratio.
 *
 * --api cupy makes the lags' calls through CuPy's hooks instead (gpupool_cupy_stream() saying the
 * stream, gpupool_cupy_malloc() and gpupool_cupy_free(), which name none); sync stays
 * gpupool_free().
 *
 * Usage: lag --build DIR [--lags sync,16,256,4096,held] [--runs N] [--api torch|cupy] TRACE.csv...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_open.h"
#include "gpupool.h"
#include "private_daemon.h"
#include "trace.h"

#define MiB (1ULL << 20)
#define LAG_SYNC (-1L)
#define LAG_HELD (-2L)
#define MAX_RUNS 15

struct lag {
        struct gp_cuda cu;
        gp_cu_deviceptr scratch;        /* what each operation's stand-in kernel writes */
        int (*hold)(gp_cu_stream s, int hold);          /* the fake driver's */
        unsigned long long (*event_records)(void);      /* the fake driver's: events this process recorded */
        const char *build;
        bool cupy;                      /* --api cupy: through CuPy's hooks (the allocation's stream said once) */
        char dir[64], sock[128];
};

struct result {
        uint64_t peak_leased, peak_in_use, trips, imports;
        uint64_t events, frees;         /* events recorded during the trace, and its frees */
        unsigned late;          /* catch-ups after which frees were still pending after 200 ms */
};

/*
 * Lets the held stream's work run, and waits (up to 200 ms) while it runs until the library has
 * returned every free to the process's pool, as it does within a few milliseconds of the GPU's
 * progress (a stream's latest frees get their fence from the reaper after 2 ms): nothing is
 * pending once what the process maps is all live or free. Then holds the stream again, its work
 * run to the end. Returns 0, or -ETIMEDOUT if the library did not.
 */
static int catch_up(struct lag *l, gp_cu_stream s, gpupool_client *c) {
        struct gpupool_stats st;
        int r = -ETIMEDOUT;

        l->hold(s, 0);
        for (int i = 0; i < 200 && r < 0; i++) {
                if (gpupool_stats(c, &st) < 0)
                        abort();
                if (st.live_bytes + st.cached_bytes >= st.mapped_bytes)
                        r = 0;
                else
                        usleep(1000);
        }
        if (l->cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "lag: cuStreamSynchronize failed\n");
                exit(1);
        }
        l->hold(s, 1);
        return r;
}

static int replay(struct lag *l, const struct trace *t, long lag, struct result *res) {
        struct gpupool_stats st;
        struct trace_live live;
        gpupool_client *c;
        gp_cu_stream s;
        int r;

        *res = (struct result) { 0 };
        if (l->cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "lag: cuStreamCreate failed\n");
                exit(1);
        }
        if (lag != LAG_SYNC)
                l->hold(s, 1);
        r = gpupool_connect(l->sock, "lag", &c);
        if (r < 0) {
                fprintf(stderr, "lag: cannot connect to %s: %s\n", l->sock, gpupool_strerror(r));
                exit(1);
        }
        trace_live_init(&live, t);
        res->events = l->event_records();
        for (size_t i = 0; i < t->n; i++) {
                const struct op *o = &t->ops[i];
                void *p = NULL;

                if (lag > 0 && i && i % (size_t) lag == 0 && catch_up(l, s, c) < 0)
                        res->late++;
                /* The operation's kernel: work of the stream that a free's event comes after. */
                if (lag != LAG_SYNC && l->cu.cuMemsetD8Async(l->scratch, 0, 1, s) != GP_CUDA_SUCCESS) {
                        fprintf(stderr, "lag: cuMemsetD8Async failed\n");
                        exit(1);
                }
                if ((r = trace_live_check(&live, o, "lag")) <= 0) {
                        if (r < 0)
                                break;
                        continue;
                }
                if (lag != LAG_SYNC && l->cupy) {
                        /* CuPy's allocator interface: no stream in the calls, the current one said before. */
                        gpupool_cupy_stream((struct CUstream_st *) s);
                        if (!o->alloc)
                                gpupool_cupy_free(c, live.ptrs[o->id], 0);
                        else
                                p = gpupool_cupy_malloc(c, o->size, 0);
                        r = gpupool_hook_last_error(NULL, 0);
                } else if (!o->alloc) {
                        r = lag == LAG_SYNC ? gpupool_free(c, live.ptrs[o->id]) : gpupool_free_async(c, live.ptrs[o->id], s);
                } else {
                        r = gpupool_alloc_async(c, 0, o->size, s, &p);
                }
                if (r < 0) {
                        char why[256];

                        if (lag != LAG_SYNC && l->cupy)
                                gpupool_hook_last_error(why, sizeof(why));
                        else
                                gpupool_last_error(c, why, sizeof(why));
                        fprintf(stderr, "lag: %s %llu bytes: %s\n", o->alloc ? "allocating" : "freeing",
                                (unsigned long long) (o->alloc ? o->size : live.sizes[o->id]), why);
                        break;
                }
                res->frees += !o->alloc;
                trace_live_done(&live, o, p);
                res->peak_in_use = live.peak;
                if (gpupool_stats(c, &st) < 0)
                        abort();
                if (st.mapped_bytes > res->peak_leased)
                        res->peak_leased = st.mapped_bytes;
        }
        res->events = l->event_records() - res->events;
        if (r >= 0 && gpupool_stats(c, &st) == 0) {
                res->trips = st.round_trips;
                res->imports = st.segments_imported;
        }
        if (lag != LAG_SYNC)
                l->hold(s, 0);
        (void) l->cu.cuStreamSynchronize(s);
        for (uint64_t id = 0; id <= t->max_id; id++)
                if (live.ptrs[id])
                        (void) gpupool_free(c, live.ptrs[id]);
        gpupool_disconnect(c);
        (void) l->cu.cuStreamDestroy(s);
        trace_live_free(&live);
        return r < 0 ? r : 0;
}

static double ratio(const struct result *r) {
        return r->peak_in_use ? (double) r->peak_leased / (double) r->peak_in_use : 0;
}

static int cmp_leased(const void *a, const void *b) {
        const struct result *x = a, *y = b;

        return x->peak_leased < y->peak_leased ? -1 : x->peak_leased > y->peak_leased;
}

static long parse_lag(const char *s) {
        char *end;
        long v;

        if (strcmp(s, "sync") == 0)
                return LAG_SYNC;
        if (strcmp(s, "held") == 0)
                return LAG_HELD;
        v = strtol(s, &end, 10);
        if (end == s || *end || v < 1) {
                fprintf(stderr, "lag: a lag is sync, held or a count of operations (1 or more), not '%s'\n", s);
                exit(2);
        }
        return v;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "build", required_argument, NULL, 'b' }, { "lags", required_argument, NULL, 'l' },
                { "runs", required_argument, NULL, 'r' }, { "api", required_argument, NULL, 'a' }, { 0 },
        };
        char lags_arg[256] = "sync,16,256,4096,held";
        struct lag l = { 0 };
        unsigned runs = 5;
        int o, failed = 0;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (o) {
                case 'b': l.build = optarg; break;
                case 'r': runs = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'l': snprintf(lags_arg, sizeof(lags_arg), "%s", optarg); break;
                case 'a':
                        if (strcmp(optarg, "cupy") != 0 && strcmp(optarg, "torch") != 0) {
                                fprintf(stderr, "lag: --api is torch (gpupool_alloc_async, gpupool_free_async) or cupy "
                                                "(CuPy's hooks), not '%s'\n", optarg);
                                return 2;
                        }
                        l.cupy = strcmp(optarg, "cupy") == 0;
                        break;
                default: return 2;
                }
        }
        if (!l.build || optind >= argc || runs < 1 || runs > MAX_RUNS) {
                fprintf(stderr, "usage: lag --build DIR [--lags sync,16,256,4096,held] [--runs 1-%d] [--api torch|cupy] "
                                "TRACE.csv...\n", MAX_RUNS);
                return 2;
        }
        snprintf(l.dir, sizeof(l.dir), "/tmp/gpupool-lag-XXXXXX");
        if (!mkdtemp(l.dir)) {
                perror("lag: mkdtemp");
                return 1;
        }
        snprintf(l.sock, sizeof(l.sock), "%s/sock", l.dir);
        bench_gpu_open(&l.cu, NULL, "lag");
        *(void **) &l.hold = dlsym(l.cu.lib, "fakecuda_stream_hold");
        *(void **) &l.event_records = dlsym(l.cu.lib, "fakecuda_event_records");
        if (!l.hold || !l.event_records) {
                fprintf(stderr, "lag: runs on the fake driver only (tests/fakecuda, $GPUPOOL_LIBCUDA): it holds a "
                                "stream's work with fakecuda_stream_hold()\n");
                return 2;
        }
        if (l.cu.cuMemAlloc(&l.scratch, 512) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "lag: cuMemAlloc of 512 bytes on GPU 0 failed\n");
                return 1;
        }
        printf("# the fake driver; one stream; lag: how many operations the GPU may run behind (sync: frees at once);\n"
               "# the lags' calls: %s\n"
               "# the run of median peak leased of %u, each with a gpupoold of its own, and the range of the ratio\n",
               l.cupy ? "CuPy's hooks (gpupool_cupy_stream, gpupool_cupy_malloc, gpupool_cupy_free)"
                      : "gpupool_alloc_async, gpupool_free_async",
               runs);
        printf("%-16s %6s %7s %14s %14s %7s %12s %12s %8s %8s %8s\n", "trace", "lag", "ops", "peak leased", "peak in use", "ratio",
               "range", "round trips", "imports", "frees", "events");
        for (int i = optind; i < argc; i++) {
                const char *base = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
                char name[64], lags[256], *save = NULL;
                struct trace t;

                snprintf(name, sizeof(name), "%.*s", (int) strcspn(base, "."), base);
                if (trace_read(argv[i], &t) < 0) {
                        fprintf(stderr, "lag: cannot read the trace %s\n", argv[i]);
                        return 1;
                }
                snprintf(lags, sizeof(lags), "%s", lags_arg);
                for (char *tok = strtok_r(lags, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                        long lag = parse_lag(tok);
                        struct result res[MAX_RUNS];
                        unsigned late = 0;
                        int r = 0;

                        for (unsigned k = 0; k < runs && r == 0; k++) {
                                pid_t pid = private_daemon_start_backend(l.build, l.dir, l.sock, "cuda", NULL);

                                r = replay(&l, &t, lag, &res[k]);
                                kill(pid, SIGTERM);
                                waitpid(pid, NULL, 0);
                                late += res[k].late;
                        }
                        if (r < 0) {
                                printf("%-16s %6s %7zu %s\n", name, tok, t.n, "failed (above)");
                                failed = 1;
                                continue;
                        }
                        /* The runs sorted by what they held: the median's row, and the range. */
                        qsort(res, runs, sizeof(res[0]), cmp_leased);
                        printf("%-16s %6s %7zu %10.1f MiB %10.1f MiB %7.3f %6.3f-%5.3f %12llu %8llu %8llu %8llu", name, tok,
                               t.n, (double) res[runs / 2].peak_leased / MiB, (double) res[runs / 2].peak_in_use / MiB,
                               ratio(&res[runs / 2]), ratio(&res[0]), ratio(&res[runs - 1]),
                               (unsigned long long) res[runs / 2].trips, (unsigned long long) res[runs / 2].imports,
                               (unsigned long long) res[runs / 2].frees, (unsigned long long) res[runs / 2].events);
                        if (late)
                                printf("  (%u catch-ups found frees still pending after 200 ms)", late);
                        printf("\n");
                        fflush(stdout);
                }
                free(t.ops);
        }
        private_daemon_remove(l.dir, l.sock);
        return failed;
}
