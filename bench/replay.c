/*
 * replay.c: "make bench-replay": what a real allocation pattern costs through libgpupool.
 *
 * Replays allocation traces (CSV: time, op, id, size, stream; see bench/traces/README.md)
 * through libgpupool against a private gpupoold (host backend, 16 GiB, an empty config), one
 * daemon and one handle per trace and way, with the library's default settings otherwise
 * (every GPUPOOL_ variable that changes them is unset). Each trace is replayed three ways, in
 * the same run:
 *
 *   malloc        glibc's malloc and free of the same sizes, in this process: the baseline for
 *                 ns/op (it leases and maps nothing, so only its times are printed);
 *   process       libgpupool: the process's own pool over segments leased from the daemon whole;
 *   grow          the same with GPUPOOL_SEGMENTS=grow: segments that grow in place, over 2 MiB
 *                 granules leased up to 128 at a time (a granule counts as a segment imported);
 *                 not on the legacy cuda backend, whose segments are always whole;
 *   grow+stock    grow against a daemon with granule_stock = 128: the granules a lease takes
 *                 are made ahead of the next lease, between requests (gpupoold.conf(5)).
 *
 * Per trace and way it prints:
 *
 *   ops           operations in the trace;
 *   round trips   the times the handle waited for the daemon (gpupool_stats().round_trips, from
 *                 the clock's start; a block's granule leases sent together count once), over
 *                 the whole trace and over its second half;
 *   imports       segments the process mapped (segments_imported: on a GPU each is a
 *                 cuIpcOpenMemHandle), likewise;
 *   ns/op         median and p99 of one operation (an alloc or a free), CLOCK_MONOTONIC;
 *   peak leased   the most the process held mapped from the daemon (mapped_bytes), MiB;
 *   peak in use   the most the trace held live (sizes rounded to 512 B), MiB, and the ratio;
 *   granule maps  grow: the times a granule was mapped under blocks, and unmapped from there
 *   and unmaps    (gpupool_grow_stats(); on cuda-vmm a cuMemMap and a cuMemUnmap each), over the
 *                 whole trace and its second half (0 with whole segments).
 *
 * Before the clock starts, each handle allocates one block of 512 B, frees it and gives back
 * what it holds (gpupool_trim()): what a process pays once, whatever it allocates (on a GPU
 * the driver's context, a tenth of a second or more at the first import; with grow, the
 * ranges' reservation), is then no operation's, and the counts start from there.
 *
 * The counters are read with gpupool_stats() after every operation, outside the timed part.
 * Memory is never touched: the host backend's segments are memfds that cost no RAM until
 * written.
 *
 * With --backend cuda or cuda-vmm the daemon leases GPU 0's memory (cuda: legacy IPC handles,
 * one cuIpcOpenMemHandle per import; cuda-vmm: descriptors) and the figures are the driver's.
 * Before the traces it then times a whole segment's lease step by step (lease_steps()), in a
 * process of its own over the raw protocol, for 2 MiB to 1 GiB: the daemon's reply to a lease of
 * a new segment and of one from its cache (the difference is what making one costs it), then
 * what the process does with it (cuda-vmm: the import, the close of the descriptor, the range's
 * reserve and map, the access; cuda: the IPC open), and its return; medians of LEASE_REPS.
 *
 * --lease-steps times only that, with no trace; --daemon-conf FILE gives its daemon that config
 * (to tell which of gpupoold's settings a step's time depends on).
 *
 * Usage: replay --build DIR [--backend host|cuda|cuda-vmm] TRACE.csv...
 *        replay --build DIR --backend cuda|cuda-vmm --lease-steps [--daemon-conf FILE]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "cudadrv.h"
#include "gpupool.h"
#include "measure.h"
#include "private_daemon.h"
#include "trace.h"

#define MiB (1ULL << 20)
#define LEASE_REPS 8

static char dir[64], sock_path[128];
static const char *backend = "host";

static pid_t start_daemon(const char *build) {
        if (strcmp(backend, "host") == 0)
                return private_daemon_start(build, dir, sock_path, "16G");
        return private_daemon_start_backend(build, dir, sock_path, backend, NULL);
}

static void stop_daemon(pid_t pid) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
}

/* ---- a whole segment's lease, step by step (cuda and cuda-vmm) ---- */

/* The steps of a lease, in the order they are printed, and one step's times, in µs. */
enum { STEP_NEW, STEP_CACHED, STEP_IMPORT, STEP_CLOSE, STEP_MAP, STEP_ACCESS, STEP_UNMAP, STEP_RETURN, STEPS };

struct step {
        double us[LEASE_REPS];
        int n;
};

/* Adds the time since t (ns) to step st. */
static void step_took(struct step *st, double t) {
        st->us[st->n++] = (now_ns() - t) / 1e3;
}

/* A lease of size on device 0 over c (exact: never a larger segment from the cache), its reply in *rep. */
static int raw_lease(struct gp_conn *c, uint64_t size, Gpupool__Envelope **rep, int *fd) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;

        lr.device = 0;
        lr.size = size;
        lr.has_exact = lr.exact = true;
        req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        req.lease = &lr;
        return gp_conn_call(c, &req, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, rep, fd);
}

static int raw_return(struct gp_conn *c, uint64_t *ids, size_t n) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;
        int r;

        rr.segment_ids = ids;
        rr.n_segment_ids = n;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        req.return_segments = &rr;
        r = gp_conn_call(c, &req, GPUPOOL__ENVELOPE__BODY_RETURN_REPLY, &rep, NULL);
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

/*
 * What the process does with a leased segment of size, each step's time added to s: maps it
 * (cuda-vmm: imports fd and closes it, as libgpupool does, then reserves, maps, sets access;
 * cuda: opens the IPC handle), then undoes that. fd is closed on every way out. Returns 0 or -1.
 */
static int map_steps(struct gp_cuda *cu, const Gpupool__LeaseReply *lr, int fd, uint64_t size, struct step *s) {
        gp_cu_mem_access_desc rw = { .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
                                     .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        gp_cu_deviceptr va = 0;
        gp_cu_mem_handle h;
        double t = now_ns();

        if (fd < 0) {
                gp_cu_ipc_mem_handle ih;

                if (!lr->has_ipc_handle || lr->ipc_handle.len != sizeof(ih.reserved))
                        return -1;
                memcpy(ih.reserved, lr->ipc_handle.data, sizeof(ih.reserved));
                if (cu->cuIpcOpenMemHandle(&va, ih, GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != GP_CUDA_SUCCESS)
                        return -1;
                step_took(&s[STEP_IMPORT], t);
                t = now_ns();
                (void) cu->cuIpcCloseMemHandle(va);
                step_took(&s[STEP_UNMAP], t);
                return 0;
        }
        if (cu->cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
            GP_CUDA_SUCCESS) {
                close(fd);
                return -1;
        }
        step_took(&s[STEP_IMPORT], t);
        t = now_ns();
        close(fd);
        step_took(&s[STEP_CLOSE], t);
        t = now_ns();
        if (cu->cuMemAddressReserve(&va, size, 0, 0, 0) != GP_CUDA_SUCCESS || cu->cuMemMap(va, size, 0, h, 0) != GP_CUDA_SUCCESS) {
                (void) cu->cuMemRelease(h);
                return -1;
        }
        step_took(&s[STEP_MAP], t);
        t = now_ns();
        (void) cu->cuMemSetAccess(va, size, &rw, 1);
        step_took(&s[STEP_ACCESS], t);
        t = now_ns();
        (void) cu->cuMemUnmap(va, size);
        (void) cu->cuMemAddressFree(va, size);
        (void) cu->cuMemRelease(h);
        step_took(&s[STEP_UNMAP], t);
        return 0;
}

/* In a process of its own (the parent's CUDA context is made later): the steps of LEASE_REPS leases per size. */
static int lease_steps_child(void) {
        static const uint64_t sizes[] = { 2 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB };
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        struct gp_conn c = { .sock = -1 };
        struct gp_cuda cu;
        gp_cu_context ctx;
        gp_cu_device dev;
        char err[256];

        if (gp_cuda_load(&cu, err, sizeof(err)) < 0 || cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS ||
            cu.cuDevicePrimaryCtxRetain(&ctx, dev) != GP_CUDA_SUCCESS || cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "replay: lease steps: no GPU 0: %s\n", err);
                return 1;
        }
        hello.name = "lease-steps";
        if (gp_conn_open(&c, sock_path, &hello, NULL) < 0) {
                fprintf(stderr, "replay: lease steps: %s\n", c.error);
                return 1;
        }
        printf("# a whole segment's lease, step by step (a process of its own, the raw protocol), median us of %d\n",
               LEASE_REPS);
        printf("%-10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "segment", "lease new", "lease cached", "import",
               "close", "map", "access", "unmap", "return");
        for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
                struct step s[STEPS];
                uint64_t ids[LEASE_REPS];

                memset(s, 0, sizeof(s));

                /* New: held until all are made, so that each is made; then returned, and leased again from the cache. */
                for (int pass = 0; pass < 2; pass++) {
                        int n = 0;

                        for (int r = 0; r < LEASE_REPS; r++) {
                                Gpupool__Envelope *rep = NULL;
                                int fd = -1;
                                double t = now_ns();

                                if (raw_lease(&c, sizes[z], &rep, &fd) < 0)
                                        break;
                                step_took(&s[pass ? STEP_CACHED : STEP_NEW], t);
                                ids[n++] = rep->lease_reply->segment_id;
                                if (pass == 0) {
                                        if (map_steps(&cu, rep->lease_reply, fd, sizes[z], s) < 0)     /* closes fd */
                                                fprintf(stderr, "replay: lease steps: a %llu MiB segment did not map\n",
                                                        (unsigned long long) (sizes[z] / MiB));
                                } else if (fd >= 0) {
                                        close(fd);
                                }
                                gpupool__envelope__free_unpacked(rep, NULL);
                        }
                        double t = now_ns();

                        if (n && raw_return(&c, ids, (size_t) n) == 0 && pass == 1)
                                s[STEP_RETURN].us[s[STEP_RETURN].n++] = (now_ns() - t) / 1e3 / n;
                }
                printf("%7llu MiB", (unsigned long long) (sizes[z] / MiB));
                for (int k = 0; k < STEPS; k++) {
                        if (s[k].n)
                                printf(" %10.1f", median(s[k].us, (size_t) s[k].n));
                        else
                                printf(" %10s", "-");   /* not a step of this backend */
                }
                printf("\n");
        }
        fflush(stdout);
        gp_conn_close(&c);
        return 0;
}

static int lease_steps(const char *build) {
        pid_t daemon = start_daemon(build), child;
        int status = 1;

        fflush(stdout);
        child = fork();
        if (child == 0)
                _exit(lease_steps_child());
        if (child > 0)
                waitpid(child, &status, 0);
        stop_daemon(daemon);
        return child > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

struct result {
        size_t ops;
        uint64_t trips, trips_half, imports, imports_half;
        uint64_t maps, maps_half, unmaps, unmaps_half;          /* granules, grow only */
        double median_ns, p99_ns, mean_ns;      /* mean: the whole trace's time over its operations */
        uint64_t peak_leased, peak_in_use;
};

static int replay(const struct trace *t, struct result *res) {
        double *ns = calloc(t->n ? t->n : 1, sizeof(*ns));
        struct gpupool_stats st, half = { 0 }, base = { 0 };
        struct gpupool_grow_stats gs, ghalf = { 0 }, gbase = { 0 };
        struct trace_live live;
        gpupool_client *c;
        size_t timed = 0;
        void *warm;
        int r;

        if (!ns)
                abort();
        *res = (struct result) { .ops = t->n };
        r = gpupool_connect(sock_path, "replay", &c);
        if (r < 0) {
                fprintf(stderr, "replay: cannot connect: %s\n", gpupool_strerror(r));
                free(ns);
                return r;
        }
        /* What the process pays once, before the clock (above). */
        if ((r = gpupool_alloc(c, 0, 512, &warm)) < 0 || (r = gpupool_free(c, warm)) < 0 || (r = gpupool_trim(c)) < 0 ||
            (r = gpupool_stats(c, &base)) < 0 || (r = gpupool_grow_stats(c, &gbase)) < 0) {
                fprintf(stderr, "replay: the block before the clock: %s\n", gpupool_strerror(r));
                gpupool_disconnect(c);
                free(ns);
                return r;
        }
        trace_live_init(&live, t);
        for (size_t i = 0; i < t->n; i++) {
                const struct op *o = &t->ops[i];
                void *p = NULL;
                double t0;

                if (i == t->n / 2 && (gpupool_stats(c, &half) < 0 || gpupool_grow_stats(c, &ghalf) < 0))
                        abort();
                if ((r = trace_live_check(&live, o, "replay")) <= 0) {
                        if (r < 0)
                                break;
                        continue;
                }
                t0 = now_ns();
                r = o->alloc ? gpupool_alloc(c, 0, o->size, &p) : gpupool_free(c, live.ptrs[o->id]);
                ns[timed++] = now_ns() - t0;
                if (r < 0) {
                        char why[256];

                        gpupool_last_error(c, why, sizeof(why));
                        fprintf(stderr, "replay: %s %llu bytes: %s\n", o->alloc ? "allocating" : "freeing",
                                (unsigned long long) (o->alloc ? o->size : live.sizes[o->id]), why);
                        break;
                }
                trace_live_done(&live, o, p);
                res->peak_in_use = live.peak;
                if (gpupool_stats(c, &st) < 0)
                        abort();
                if (st.mapped_bytes > res->peak_leased)
                        res->peak_leased = st.mapped_bytes;
        }
        if (r >= 0 && gpupool_stats(c, &st) == 0 && gpupool_grow_stats(c, &gs) == 0) {
                res->maps = gs.granules_mapped - gbase.granules_mapped;
                res->maps_half = gs.granules_mapped - ghalf.granules_mapped;
                res->unmaps = gs.granules_unmapped - gbase.granules_unmapped;
                res->unmaps_half = gs.granules_unmapped - ghalf.granules_unmapped;
                res->trips = st.round_trips - base.round_trips;
                res->trips_half = st.round_trips - half.round_trips;
                res->imports = st.segments_imported - base.segments_imported;
                res->imports_half = st.segments_imported - half.segments_imported;
                for (size_t i = 0; i < timed; i++)
                        res->mean_ns += ns[i] / (double) timed;
                qsort(ns, timed, sizeof(*ns), cmp_double);
                res->median_ns = timed ? ns[timed / 2] : 0;
                res->p99_ns = timed ? ns[timed * 99 / 100] : 0;
        }
        gpupool_disconnect(c);
        trace_live_free(&live);
        free(ns);
        return r < 0 ? r : 0;
}

/* The baseline: the trace's sizes through malloc and free, timed alike. Memory is not touched. */
static int replay_malloc(const struct trace *t, struct result *res) {
        void **ptrs = calloc(t->max_id + 1, sizeof(*ptrs));
        double *ns = calloc(t->n ? t->n : 1, sizeof(*ns));
        size_t timed = 0;

        if (!ptrs || !ns)
                abort();
        *res = (struct result) { .ops = t->n };
        for (size_t i = 0; i < t->n; i++) {
                const struct op *o = &t->ops[i];
                double t0;

                if (o->alloc) {
                        if (ptrs[o->id])
                                continue;       /* the process pool's replay says so */
                        t0 = now_ns();
                        ptrs[o->id] = malloc(o->size);
                        ns[timed++] = now_ns() - t0;
                        if (!ptrs[o->id])
                                return -ENOMEM;
                } else if (ptrs[o->id]) {
                        t0 = now_ns();
                        free(ptrs[o->id]);
                        ns[timed++] = now_ns() - t0;
                        ptrs[o->id] = NULL;
                }
        }
        for (size_t i = 0; i < timed; i++)
                res->mean_ns += ns[i] / (double) timed;
        qsort(ns, timed, sizeof(*ns), cmp_double);
        res->median_ns = timed ? ns[timed / 2] : 0;
        res->p99_ns = timed ? ns[timed * 99 / 100] : 0;
        for (uint64_t id = 0; id <= t->max_id; id++)
                free(ptrs[id]);
        free(ptrs);
        free(ns);
        return 0;
}

static const char *trace_name(const char *path, char *buf, size_t size) {
        const char *base = strrchr(path, '/');
        size_t len;

        base = base ? base + 1 : path;
        len = strcspn(base, ".");
        snprintf(buf, size, "%.*s", (int) len, base);
        return buf;
}

static const char usage[] =
        "usage: replay --build DIR [--backend host|cuda|cuda-vmm] TRACE.csv...\n"
        "       replay --build DIR --backend cuda|cuda-vmm --lease-steps [--daemon-conf FILE]\n";

/* Reads the config file path (at most size - 1 bytes) into buf, for the lease steps' daemon. Returns 0 or -1, saying why. */
static int read_conf(const char *path, char *buf, size_t size) {
        FILE *f = fopen(path, "r");
        size_t n;

        if (!f) {
                fprintf(stderr, "replay: --daemon-conf %s: %s\n", path, strerror(errno));
                return -1;
        }
        n = fread(buf, 1, size - 1, f);
        buf[n] = 0;
        if (!feof(f)) {
                fprintf(stderr, "replay: --daemon-conf %s: more than %zu bytes\n", path, size - 1);
                n = 0;
        }
        fclose(f);
        return n ? 0 : -1;
}

int main(int argc, char **argv) {
        static const struct option longopts[] = { { "build", required_argument, NULL, 'b' },
                                                  { "backend", required_argument, NULL, 'B' },
                                                  { "lease-steps", no_argument, NULL, 'l' },
                                                  { "daemon-conf", required_argument, NULL, 'c' }, { NULL, 0, NULL, 0 } };
        static char conf_text[4096];
        bool steps_only = false;
        static const char *defaults[] = { "GPUPOOL_TIMEOUT", "GPUPOOL_IDLE_RETURN", "GPUPOOL_SEGMENTS" };
        static const char *const ways[] = { "process", "grow", "grow+stock" };
        const char *build = NULL;
        int opt, failed = 0, nways;

        while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
                if (opt == 'b')
                        build = optarg;
                else if (opt == 'B' && (strcmp(optarg, "host") == 0 || strcmp(optarg, "cuda") == 0 ||
                                        strcmp(optarg, "cuda-vmm") == 0))
                        backend = optarg;
                else if (opt == 'l')
                        steps_only = true;
                else if (opt == 'c' && read_conf(optarg, conf_text, sizeof(conf_text)) == 0)
                        private_daemon_conf = conf_text;
                else {
                        fprintf(stderr, "%s", usage);
                        return 2;
                }
        }
        if (!build || (steps_only ? optind != argc || strcmp(backend, "host") == 0 : optind == argc)) {
                fprintf(stderr, "%s", usage);
                return 2;
        }
        /* The legacy cuda backend's segments are whole: a grow row would be the process row again. */
        nways = strcmp(backend, "cuda") == 0 ? 1 : 3;
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
                unsetenv(defaults[i]);
        snprintf(dir, sizeof(dir), "/tmp/gpupool-replay.XXXXXX");
        if (!mkdtemp(dir)) {
                perror("replay: mkdtemp");
                return 1;
        }
        snprintf(sock_path, sizeof(sock_path), "%s/gpupool.sock", dir);
        if (strcmp(backend, "host") != 0 && lease_steps(build) < 0)
                failed = 1;
        private_daemon_conf = NULL;     /* --daemon-conf is the lease steps' daemon's only */
        if (steps_only) {
                private_daemon_remove(dir, sock_path);
                return failed;
        }
        printf("# backend %s%s\n", backend, nways == 1 ? " (whole segments only: it does not grow them in place)" : "");
        printf("%-14s %-8s %7s %17s %15s %23s %12s %12s %6s %15s %15s\n", "trace", "pool", "ops", "round trips", "imports",
               "ns/op", "peak leased", "peak in use", "ratio", "granule maps", "unmaps");
        printf("%-14s %-8s %7s %8s %8s %7s %7s %7s %7s %7s %12s %12s %6s %7s %7s %7s %7s\n", "", "", "", "all", "2nd half", "all",
               "2nd half", "median", "p99", "mean", "MiB", "MiB", "", "all", "2nd half", "all", "2nd half");
        for (int a = optind; a < argc; a++) {
                struct trace t;
                struct result res;
                char name[64];
                pid_t pid;
                int r = trace_read(argv[a], &t);

                if (r < 0) {
                        fprintf(stderr, "replay: %s: %s\n", argv[a], strerror(-r));
                        failed = 1;
                        continue;
                }
                if (replay_malloc(&t, &res) == 0)
                        printf("%-14s %-8s %7zu %8s %8s %7s %7s %7.0f %7.0f %7.0f %12s %12s %6s %7s %7s %7s %7s\n",
                               trace_name(argv[a], name, sizeof(name)), "malloc", res.ops, "-", "-", "-", "-", res.median_ns,
                               res.p99_ns, res.mean_ns, "-", "-", "-", "-", "-", "-", "-");
                for (int w = 0; w < nways; w++) {
                        if (w >= 1)
                                setenv("GPUPOOL_SEGMENTS", "grow", 1);
                        private_daemon_conf = w == 2 ? "[pool]\ngranule_stock = 128\n" : NULL;
                        pid = start_daemon(build);
                        r = replay(&t, &res);
                        stop_daemon(pid);
                        unsetenv("GPUPOOL_SEGMENTS");
                        if (r < 0)
                                failed = 1;
                        else
                                printf("%-14s %-8s %7zu %8llu %8llu %7llu %7llu %7.0f %7.0f %7.0f %12.1f %12.1f %6.3f %7llu "
                                       "%7llu %7llu %7llu\n",
                                       trace_name(argv[a], name, sizeof(name)), ways[w], res.ops,
                                       (unsigned long long) res.trips, (unsigned long long) res.trips_half,
                                       (unsigned long long) res.imports, (unsigned long long) res.imports_half,
                                       res.median_ns, res.p99_ns, res.mean_ns, (double) res.peak_leased / MiB,
                                       (double) res.peak_in_use / MiB,
                                       res.peak_in_use ? (double) res.peak_leased / (double) res.peak_in_use : 0,
                                       (unsigned long long) res.maps, (unsigned long long) res.maps_half,
                                       (unsigned long long) res.unmaps, (unsigned long long) res.unmaps_half);
                        fflush(stdout);
                }
                free(t.ops);
        }
        private_daemon_remove(dir, sock_path);
        return failed;
}
