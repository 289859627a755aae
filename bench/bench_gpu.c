/*
 * bench_gpu.c: what an allocation costs, with and without gpupool (make bench-gpu).
 *
 * One workload, replayed identically by three allocators:
 *   a. cuMemAlloc_v2 + cuMemFree_v2, the driver directly;
 *   b. cuMemAllocAsync + cuMemFreeAsync on the device's default pool, which keeps what it
 *      frees (release threshold: everything), on one stream;
 *   c. gpupool_alloc + gpupool_free through a running gpupoold.
 * The workload is the seed shape: --ops allocations (default one million) of mixed sizes
 * from 512 B to 64 MiB (log-uniform within three bands: 70% up to 64 KiB, 25% up to 4 MiB,
 * 5% up to 64 MiB), with frees interleaved so that about --live blocks stay allocated, freed
 * in random order. Each call is timed on the host clock; the report gives the median, p99 and
 * mean of allocations and of frees, and the wall time of the whole replay.
 *
 * Then the first import of a segment: a second process exports cuMemAlloc_v2 allocations of
 * 2 MiB to 1 GiB (--import-reps of each) and this one times cuIpcOpenMemHandle_v2 (and
 * cuIpcCloseMemHandle) on each, as a client does on its first block of a new segment on the
 * cuda backend; and the same sizes of cuMemCreate memory exported as file descriptors, which
 * this one imports, maps in a range it reserves and makes accessible, as a client does on the
 * cuda-vmm backend (and unmaps and frees), each call timed, and the close of the descriptor
 * once imported (the export's last reference); the exporter's side, cuMemCreate, the export
 * and the close of its descriptor once sent (as gpupoold's), is timed too.
 *
 * Usage: bench_gpu --socket PATH [--ops N] [--live N] [--import-reps N] [--skip-direct]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gpu_open.h"
#include "gpupool.h"
#include "measure.h"
#include "wire.h"

#define MiB (1ULL << 20)

struct step {
        int slot;               /* which live slot */
        size_t size;            /* 0: free the slot */
};

struct stats {
        double *alloc_us, *free_us;
        size_t nalloc, nfree;
        double wall_s;
        unsigned long long failed;
};

static double now_us(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec / 1e3;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

static double uniform(void) {
        return (double) (rng() >> 11) / 9007199254740992.0;
}

static size_t log_uniform(double lo, double hi) {
        return (size_t) (lo * pow(hi / lo, uniform()));
}

static size_t pick_size(void) {
        double u = uniform();

        if (u < 0.70)
                return log_uniform(512, 64 * 1024);
        if (u < 0.95)
                return log_uniform(64 * 1024, 4 * MiB);
        return log_uniform(4 * MiB, 64 * MiB);
}

/* The workload: ops allocations, frees interleaved, about live blocks held, then all freed. */
static struct step *make_workload(size_t ops, int live, size_t *ret_n) {
        struct step *w = malloc((2 * ops + (size_t) live) * sizeof(*w));
        int *used = calloc((size_t) live, sizeof(int)), nused = 0;
        int *slots = malloc((size_t) live * sizeof(int));
        size_t n = 0, allocs = 0;

        for (int i = 0; i < live; i++)
                slots[i] = i;
        while (allocs < ops) {
                bool alloc = nused == 0 || (nused < live && uniform() < 0.5 + 0.5 * (1.0 - (double) nused / live));

                if (alloc) {
                        /* Take a free slot: slots[nused..] are free. */
                        int k = nused + (int) (rng() % (uint64_t) (live - nused)), s = slots[k];

                        slots[k] = slots[nused];
                        slots[nused++] = s;
                        used[s] = 1;
                        w[n++] = (struct step) { s, pick_size() };
                        allocs++;
                } else {
                        int k = (int) (rng() % (uint64_t) nused), s = slots[k];

                        slots[k] = slots[--nused];
                        slots[nused] = s;
                        used[s] = 0;
                        w[n++] = (struct step) { s, 0 };
                }
        }
        for (int i = 0; i < live; i++)
                if (used[i])
                        w[n++] = (struct step) { i, 0 };
        free(used);
        free(slots);
        *ret_n = n;
        return w;
}

static void report(const char *name, const char *what, double *v, size_t n) {
        double sum = 0;

        if (!n) {
                printf("%-34s %-6s       (none)\n", name, what);
                return;
        }
        qsort(v, n, sizeof(*v), cmp_double);
        for (size_t i = 0; i < n; i++)
                sum += v[i];
        printf("%-34s %-6s %10zu %12.2f %12.2f %12.2f\n", name, what, n, v[n / 2], v[(size_t) ((double) n * 0.99)],
               sum / (double) n);
}

static void report_all(const char *name, struct stats *st) {
        report(name, "alloc", st->alloc_us, st->nalloc);
        report(name, "free", st->free_us, st->nfree);
        printf("%-34s wall %.3f s, %llu failed allocations\n", name, st->wall_s, st->failed);
}

/* The three allocators behind one pair of calls. */
struct allocator {
        const char *name;
        int (*alloc)(struct allocator *a, size_t size, void **p);
        int (*free)(struct allocator *a, void *p);
        void (*finish)(struct allocator *a);
        struct gp_cuda *cu;
        gp_cu_stream stream;
        gp_cu_result (*alloc_async)(gp_cu_deviceptr *p, size_t size, gp_cu_stream s);
        gp_cu_result (*free_async)(gp_cu_deviceptr p, gp_cu_stream s);
        gp_cu_result (*ctx_sync)(void);
        gpupool_client *client;
};

static int direct_alloc(struct allocator *a, size_t size, void **p) {
        gp_cu_deviceptr d;
        int r = a->cu->cuMemAlloc(&d, size);

        *p = (void *) (uintptr_t) d;
        return r ? -ENOMEM : 0;
}

static int direct_free(struct allocator *a, void *p) {
        return a->cu->cuMemFree((gp_cu_deviceptr) (uintptr_t) p) ? -EIO : 0;
}

static int pool_alloc(struct allocator *a, size_t size, void **p) {
        gp_cu_deviceptr d;
        int r = a->alloc_async(&d, size, a->stream);

        *p = (void *) (uintptr_t) d;
        return r ? -ENOMEM : 0;
}

static int pool_free(struct allocator *a, void *p) {
        return a->free_async((gp_cu_deviceptr) (uintptr_t) p, a->stream) ? -EIO : 0;
}

static void pool_finish(struct allocator *a) {
        (void) a->cu->cuStreamSynchronize(a->stream);
}

static int gpupool_alloc_fn(struct allocator *a, size_t size, void **p) {
        return gpupool_alloc(a->client, 0, size, p);
}

static int gpupool_free_fn(struct allocator *a, void *p) {
        return gpupool_free(a->client, p);
}

static void replay(struct allocator *a, const struct step *w, size_t n, int live, struct stats *st) {
        void **slot = calloc((size_t) live, sizeof(void *));
        double t0 = now_us();

        st->nalloc = st->nfree = 0;
        st->failed = 0;
        for (size_t i = 0; i < n; i++) {
                double t = now_us();

                if (w[i].size) {
                        int r = a->alloc(a, w[i].size, &slot[w[i].slot]);

                        st->alloc_us[st->nalloc++] = now_us() - t;
                        if (r < 0) {
                                slot[w[i].slot] = NULL;
                                st->failed++;
                        }
                } else if (slot[w[i].slot]) {
                        if (a->free(a, slot[w[i].slot]) < 0) {
                                fprintf(stderr, "%s: free failed\n", a->name);
                                exit(1);
                        }
                        st->free_us[st->nfree++] = now_us() - t;
                        slot[w[i].slot] = NULL;
                }
        }
        if (a->finish)
                a->finish(a);
        st->wall_s = (now_us() - t0) / 1e6;
        free(slot);
}

/* ---- first import ---- */

static const size_t import_sizes[] = { 2 * MiB, 20 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB };
#define NSIZES (sizeof(import_sizes) / sizeof(import_sizes[0]))

/* What the exporter measured of making and exporting cuMemCreate memory, sent after the descriptors. */
struct vmm_made {
        double create_us[NSIZES][64], map_us[NSIZES][64], access_us[NSIZES][64], export_us[NSIZES][64];
        double close_us[NSIZES][64];    /* its descriptor's close once sent (the message holds it still) */
        int n[NSIZES];
};

static const gp_cu_mem_prop vmm_prop = {
        .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
};

/*
 * The exporting process: allocates, writes the handles to out, then makes as much cuMemCreate
 * memory and sends its descriptors over sock (a byte each, 'x' with none when it could not),
 * then what that took; waits for a byte on in (or its end: the parent gone, on any path) and
 * frees. It holds about 26 GiB meanwhile.
 */
static int exporter(int reps, int out, int in, int sock) {
        struct gp_cuda cu;
        gp_cu_context ctx;
        gp_cu_device dev;
        gp_cu_deviceptr *p = calloc(NSIZES * (size_t) reps, sizeof(*p));
        gp_cu_mem_handle *h = calloc(NSIZES * (size_t) reps, sizeof(*h));
        gp_cu_deviceptr *va = calloc(NSIZES * (size_t) reps, sizeof(*va));
        gp_cu_mem_access_desc rw = { .location = vmm_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        static struct vmm_made made;
        char err[256], ch;

        if (gp_cuda_load(&cu, err, sizeof(err)) < 0 || cu.cuDeviceGet(&dev, 0) || cu.cuDevicePrimaryCtxRetain(&ctx, dev) ||
            cu.cuCtxPushCurrent(ctx))
                return 1;
        for (size_t s = 0; s < NSIZES; s++)
                for (int r = 0; r < reps; r++) {
                        gp_cu_ipc_mem_handle ih;

                        if (cu.cuMemAlloc(&p[s * (size_t) reps + (size_t) r], import_sizes[s]) ||
                            cu.cuIpcGetMemHandle(&ih, p[s * (size_t) reps + (size_t) r]))
                                memset(&ih, 0, sizeof(ih));    /* the importer reports it */
                        if (write(out, &ih, sizeof(ih)) != sizeof(ih))
                                return 2;
                }
        for (size_t s = 0; s < NSIZES; s++)
                for (int r = 0; r < reps; r++) {
                        gp_cu_mem_handle *hh = &h[s * (size_t) reps + (size_t) r];
                        gp_cu_deviceptr *v = &va[s * (size_t) reps + (size_t) r];
                        double t = now_us(), t1, t2, t3;
                        bool timed = false;
                        int fd = -1;

                        /*
                         * As gpupoold makes a segment: created, mapped in a range of its own and made
                         * accessible (fresh memory: the first mapping of it), then exported to send.
                         */
                        if (cu.cuMemCreate(hh, import_sizes[s], &vmm_prop, 0)) {
                                *hh = 0;
                        } else {
                                t1 = now_us();
                                if (cu.cuMemAddressReserve(v, import_sizes[s], 0, 0, 0) ||
                                    cu.cuMemMap(*v, import_sizes[s], 0, *hh, 0)) {
                                        *v = 0;
                                        t2 = t3 = now_us();
                                } else {
                                        t2 = now_us();
                                        (void) cu.cuMemSetAccess(*v, import_sizes[s], &rw, 1);
                                        t3 = now_us();
                                }
                                if (cu.cuMemExportToShareableHandle(&fd, *hh, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
                                        fd = -1;
                                else if (made.n[s] < 64 && *v) {
                                        made.create_us[s][made.n[s]] = t1 - t;
                                        made.map_us[s][made.n[s]] = t2 - t1;
                                        made.access_us[s][made.n[s]] = t3 - t2;
                                        made.export_us[s][made.n[s]++] = now_us() - t3;
                                        timed = true;
                                }
                        }
                        if (gp_wire_send_packet(sock, (const uint8_t *) (fd >= 0 ? "m" : "x"), 1, fd) < 0)
                                return 4;
                        if (fd >= 0) {
                                t = now_us();
                                close(fd);
                                if (timed)
                                        made.close_us[s][made.n[s] - 1] = now_us() - t;
                        }
                }
        if (write(out, &made, sizeof(made)) != (ssize_t) sizeof(made))
                return 5;
        if (read(in, &ch, 1) < 0)
                return 3;
        for (size_t i = 0; i < NSIZES * (size_t) reps; i++) {
                if (p[i])
                        (void) cu.cuMemFree(p[i]);
                if (va[i] && cu.cuMemUnmap(va[i], import_sizes[i / (size_t) reps]) == GP_CUDA_SUCCESS)
                        (void) cu.cuMemAddressFree(va[i], import_sizes[i / (size_t) reps]);
                if (h[i])
                        (void) cu.cuMemRelease(h[i]);
        }
        return 0;
}

/* The exporter and the parent's end of the pipe that lets it go; exporter_stop() on every way out. */
static pid_t exporter_pid;
static int exporter_go = -1;

static void exporter_stop(void) {
        if (exporter_go >= 0) {
                close(exporter_go);     /* its read ends: it frees what it exported and exits */
                exporter_go = -1;
        }
        if (exporter_pid > 0) {
                waitpid(exporter_pid, NULL, 0);
                exporter_pid = 0;
        }
}

/* Reads n bytes from the pipe, however it splits them (the exporter's report is larger than PIPE_BUF). */
static bool read_all(int fd, void *buf, size_t n) {
        for (size_t got = 0; got < n;) {
                ssize_t r = read(fd, (char *) buf + got, n - got);

                if (r <= 0)
                        return false;
                got += (size_t) r;
        }
        return true;
}

/* The cuda-vmm import: each descriptor imported, mapped in a reserved range, made accessible, then undone. */
static void bench_vmm_import(struct gp_cuda *cu, int reps, int in, int sock) {
        double *import_us = calloc((size_t) reps, sizeof(double)), *map_us = calloc((size_t) reps, sizeof(double));
        double *unmap_us = calloc((size_t) reps, sizeof(double)), *close_us = calloc((size_t) reps, sizeof(double));
        gp_cu_mem_access_desc rw = { .location = vmm_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        static struct vmm_made made;

        printf("\n%-34s %-6s %10s %12s %12s %12s\n", "cuda-vmm import of a segment", "call", "n", "median_us", "p99_us",
               "mean_us");
        for (size_t s = 0; s < NSIZES; s++) {
                char name[64];
                int n = 0;

                for (int r = 0; r < reps; r++) {
                        gp_cu_mem_handle h;
                        gp_cu_deviceptr va;
                        uint8_t byte;
                        int fd = -1;
                        double t;

                        if (gp_wire_recv_packet(sock, &byte, 1, &fd) != 1)
                                return;
                        if (fd < 0)
                                continue;       /* the exporter could not make this one */
                        /* What a cuda-vmm client does on a segment's first block: import, reserve, map, set access. */
                        t = now_us();
                        if (cu->cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd,
                                                               GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
                                close(fd);
                                continue;
                        }
                        import_us[n] = now_us() - t;
                        t = now_us();
                        close(fd);      /* the last reference to the export: the exporter closed its own */
                        close_us[n] = now_us() - t;
                        t = now_us();
                        if (cu->cuMemAddressReserve(&va, import_sizes[s], 0, 0, 0) || cu->cuMemMap(va, import_sizes[s], 0, h, 0) ||
                            cu->cuMemSetAccess(va, import_sizes[s], &rw, 1)) {
                                (void) cu->cuMemRelease(h);
                                continue;       /* left mapped or reserved: the benchmark's process ends soon */
                        }
                        (void) cu->cuMemRelease(h);
                        map_us[n] = now_us() - t;
                        t = now_us();
                        (void) cu->cuMemUnmap(va, import_sizes[s]);
                        (void) cu->cuMemAddressFree(va, import_sizes[s]);
                        unmap_us[n++] = now_us() - t;
                }
                snprintf(name, sizeof(name), "segment of %zu MiB", (size_t) (import_sizes[s] / MiB));
                report(name, "import", import_us, (size_t) n);
                report(name, "close", close_us, (size_t) n);
                report(name, "map", map_us, (size_t) n);
                report(name, "unmap", unmap_us, (size_t) n);
        }
        free(import_us);
        free(map_us);
        free(unmap_us);
        free(close_us);
        if (!read_all(in, &made, sizeof(made)))
                return;
        printf("\n%-34s %-6s %10s %12s %12s %12s\n", "cuda-vmm making a segment", "call", "n", "median_us", "p99_us",
               "mean_us");
        for (size_t s = 0; s < NSIZES; s++) {
                char name[64];

                snprintf(name, sizeof(name), "segment of %zu MiB", (size_t) (import_sizes[s] / MiB));
                report(name, "create", made.create_us[s], (size_t) made.n[s]);
                report(name, "map", made.map_us[s], (size_t) made.n[s]);       /* reserve and map, fresh memory */
                report(name, "access", made.access_us[s], (size_t) made.n[s]);  /* its first cuMemSetAccess */
                report(name, "export", made.export_us[s], (size_t) made.n[s]);
                report(name, "close", made.close_us[s], (size_t) made.n[s]);   /* as gpupoold's, once sent */
        }
}

static void bench_import(struct gp_cuda *cu, int reps, int in, int out, int sock) {
        double *open_us = calloc((size_t) reps, sizeof(double)), *close_us = calloc((size_t) reps, sizeof(double));

        printf("\n%-34s %-6s %10s %12s %12s %12s\n", "first import of a segment", "call", "n", "median_us", "p99_us", "mean_us");
        for (size_t s = 0; s < NSIZES; s++) {
                char name[64];
                int n = 0;

                for (int r = 0; r < reps; r++) {
                        gp_cu_ipc_mem_handle h, zero = { 0 };
                        gp_cu_deviceptr p;
                        double t;

                        if (read(in, &h, sizeof(h)) != sizeof(h))
                                return;
                        if (memcmp(&h, &zero, sizeof(h)) == 0)
                                continue;       /* the exporter could not allocate this one */
                        t = now_us();
                        if (cu->cuIpcOpenMemHandle(&p, h, GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
                                continue;
                        open_us[n] = now_us() - t;
                        t = now_us();
                        (void) cu->cuIpcCloseMemHandle(p);
                        close_us[n++] = now_us() - t;
                }
                snprintf(name, sizeof(name), "segment of %zu MiB", (size_t) (import_sizes[s] / MiB));
                report(name, "open", open_us, (size_t) n);
                report(name, "close", close_us, (size_t) n);
        }
        bench_vmm_import(cu, reps, in, sock);
        if (write(out, "x", 1) < 0)
                perror("bench_gpu");
        exporter_stop();
        free(open_us);
        free(close_us);
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "socket", required_argument, NULL, 's' }, { "ops", required_argument, NULL, 'n' },
                { "live", required_argument, NULL, 'l' },   { "import-reps", required_argument, NULL, 'r' },
                { "skip-direct", no_argument, NULL, 'd' },   { 0 },
        };
        const char *socket_path = NULL;
        size_t ops = 1000000, n;
        int live = 1024, reps = 10, c, to_child[2], from_child[2], fds[2];
        bool skip_direct = false;
        struct allocator a;
        struct stats st;
        struct step *w;
        struct gp_cuda cu;
        gp_cu_device dev;
        gp_cu_mempool mempool;
        gp_cu_result (*get_pool)(gp_cu_mempool *pool, gp_cu_device d);
        gp_cu_result (*set_attr)(gp_cu_mempool pool, int attr, void *value);
        uint64_t threshold = UINT64_MAX;
        gp_cu_result (*trim_pool)(gp_cu_mempool pool, size_t keep);

        while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (c) {
                case 's': socket_path = optarg; break;
                case 'n': ops = strtoull(optarg, NULL, 10); break;
                case 'l': live = atoi(optarg); break;
                case 'r': reps = atoi(optarg); break;
                case 'd': skip_direct = true; break;
                default:
                        fprintf(stderr, "usage: bench_gpu --socket PATH [--ops N] [--live N] [--import-reps N] [--skip-direct]\n");
                        return 2;
                }
        }
        if (!socket_path || ops == 0 || live <= 0 || reps <= 0 || reps > 64) {
                fprintf(stderr, "bench_gpu: --socket is required; --ops and --live must be positive, --import-reps 1 to 64\n");
                return 2;
        }
        /* The exporter is forked before this process touches CUDA. */
        if (pipe(to_child) < 0 || pipe(from_child) < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) < 0)
                return 1;
        exporter_pid = fork();
        if (exporter_pid < 0)
                return 1;
        if (exporter_pid == 0) {
                /* Only its own ends: the parent's exit must end its wait. */
                close(to_child[1]);
                close(from_child[0]);
                close(fds[0]);
                _exit(exporter(reps, from_child[1], to_child[0], fds[1]));
        }
        close(to_child[0]);
        close(from_child[1]);
        close(fds[1]);
        exporter_go = to_child[1];
        atexit(exporter_stop);

        dev = bench_gpu_open(&cu, NULL, "bench_gpu");
        {
                char name[128] = "";

                cu.cuDeviceGetName(name, sizeof(name), dev);
                printf("device: %s, driver %d.%d\n", name, cu.driver_version / 1000, cu.driver_version % 1000 / 10);
        }
        w = make_workload(ops, live, &n);
        st.alloc_us = malloc(ops * sizeof(double));
        st.free_us = malloc(ops * sizeof(double));
        printf("workload: %zu allocations of 512 B to 64 MiB, about %d live, %zu calls\n\n", ops, live, n);
        printf("%-34s %-6s %10s %12s %12s %12s\n", "allocator", "call", "n", "median_us", "p99_us", "mean_us");

        if (!skip_direct) {
                a = (struct allocator) { .name = "a. cuMemAlloc_v2/cuMemFree_v2", .alloc = direct_alloc, .free = direct_free, .cu = &cu };
                replay(&a, w, n, live, &st);
                report_all(a.name, &st);
        }

        *(void **) &a.alloc_async = gp_cuda_symbol(&cu, "cuMemAllocAsync", 11020);
        *(void **) &get_pool = gp_cuda_symbol(&cu, "cuDeviceGetDefaultMemPool", 11020);
        *(void **) &set_attr = gp_cuda_symbol(&cu, "cuMemPoolSetAttribute", 11020);
        a = (struct allocator) { .name = "b. cuMemAllocAsync/cuMemFreeAsync", .alloc = pool_alloc, .free = pool_free,
                                 .finish = pool_finish, .cu = &cu, .alloc_async = a.alloc_async };
        *(void **) &a.free_async = gp_cuda_symbol(&cu, "cuMemFreeAsync", 11020);
        if (!a.alloc_async || !a.free_async || !get_pool || !set_attr || get_pool(&mempool, dev) ||
            set_attr(mempool, GP_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) ||
            cu.cuStreamCreate(&a.stream, GP_CU_STREAM_NON_BLOCKING)) {
                printf("%-34s not available on this driver\n", a.name);
        } else {
                replay(&a, w, n, live, &st);
                report_all(a.name, &st);
                (void) cu.cuStreamDestroy(a.stream);
                /* Its pool keeps everything (the threshold): give it back before gpupool's turn. */
                *(void **) &trim_pool = gp_cuda_symbol(&cu, "cuMemPoolTrimTo", 11020);
                if (trim_pool)
                        (void) trim_pool(mempool, 0);
        }

        a = (struct allocator) { .name = "c. gpupool_alloc/gpupool_free", .alloc = gpupool_alloc_fn, .free = gpupool_free_fn };
        c = gpupool_connect(socket_path, "bench_gpu", &a.client);
        if (c < 0) {
                fprintf(stderr, "bench_gpu: cannot connect to gpupoold at %s: %s\n", socket_path, gpupool_strerror(c));
                return 1;
        }
        replay(&a, w, n, live, &st);
        report_all(a.name, &st);
        gpupool_disconnect(a.client);

        bench_import(&cu, reps, from_child[0], to_child[1], fds[0]);
        free(w);
        free(st.alloc_us);
        free(st.free_us);
        return 0;
}
