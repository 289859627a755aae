/*
 * vmm_probe.c: what the CUDA driver really does with cuda-vmm memory shared by descriptor,
 * the facts gpupool's cuda-vmm backend assumes (and tests/fakecuda models). One GPU, ~5 s.
 *
 *   make build/bench/vmm_probe      # also built by make gpu-tools
 *   build/bench/vmm_probe           # real driver (libcuda.so.1)
 *   GPUPOOL_LIBCUDA=build/tests/libfakecuda.so FAKECUDA_DIR=$(mktemp -d) build/bench/vmm_probe   # the fake
 *
 * Processes, all forked before any CUDA call (a process forked after cuInit cannot use it):
 *   A  creator   cuMemCreate 4 MiB (POSIX fd), filled 0xab, exported twice; the daemon's role
 *   B  importer  a fresh process, as a restarted gpupoold adopting a client's descriptor
 *   C1 reader    maps it CU_MEM_ACCESS_FLAGS_PROT_READ, writes with cuMemsetD8Async (test_vmm_objects)
 *   C2 reader    the same, writing from a kernel (PTX, JIT) instead of a memset
 *   D  client    imports what A exports in gpupoold's pattern, to time A's exports (daemon_pattern)
 *   E  daemon    gpupoold's start step by step, an export timed after each (daemon_start)
 *   F  many      what a granule's calls cost when several are made at once (many_at_once): imports
 *                on 1 to 8 threads, one cuMemUnmap and one cuMemSetAccess over a run of granules
 *                mapped side by side, against one call per granule, and imports while A exports;
 *                A exports on 1 to 8 threads
 * A's first steps, before any other export exists on the node (export_count): what an export and
 * its close cost with no other export open anywhere, with one, 10 and 1,000 open, and in
 * gpupoold's pattern with D, with and without D holding one export of its own.
 * Every line is "[who] what: result". Exit 0 unless the driver would not load.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/kcmp.h>

#include "cudadrv.h"

#define MiB (1ULL << 20)
#define FABRIC 0x8              /* CU_MEM_HANDLE_TYPE_FABRIC */
#define ATTR_FABRIC_SUPPORTED 128
#define PTR_ALLOWED_HANDLE_TYPES 14
#define PTR_ACCESS_FLAGS 16
#define PTR_MAPPING_SIZE 18
#define PTR_MEMORY_BLOCK_ID 20

static struct gp_cuda cu;
static gp_cu_context probe_ctx;   /* the primary context cuda_up() made current, for threads */
static const char *who = "?";
static gp_cu_result (*retain)(gp_cu_mem_handle *, void *);
static gp_cu_result (*get_access)(unsigned long long *, const gp_cu_mem_location *, gp_cu_deviceptr);
static gp_cu_result (*ptr_attr)(void *, int, gp_cu_deviceptr);
static gp_cu_result (*memset8)(gp_cu_deviceptr, unsigned char, size_t);
static gp_cu_result (*memset8_async)(gp_cu_deviceptr, unsigned char, size_t, gp_cu_stream);
static gp_cu_result (*dtoh)(void *, gp_cu_deviceptr, size_t);
static gp_cu_result (*htod)(gp_cu_deviceptr, const void *, size_t);
static gp_cu_result (*mod_load)(void **, const void *);
static gp_cu_result (*mod_func)(void **, void *, const char *);
static gp_cu_result (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, gp_cu_stream,
                              void **, void **);

static const char *rs(gp_cu_result r) {
        return gp_cuda_error_name(&cu, r);
}

static double now_ns(void) {
        struct timespec t;

        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1e9 + t.tv_nsec;
}

static int open_fds(void) {
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;

        while (d && (e = readdir(d)))
                n += e->d_name[0] != '.';
        if (d)
                closedir(d);
        return n - 1;   /* the directory's own */
}

static const gp_cu_mem_prop base_prop = {
        .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
};

static void print_props(const char *what, gp_cu_mem_handle h) {
        gp_cu_mem_prop p;
        gp_cu_result r;

        memset(&p, 0x5c, sizeof(p));    /* fields the driver leaves alone show as 0x5c5c5c5c */
        r = cu.cuMemGetAllocationPropertiesFromHandle(&p, h);
        printf("[%s] %s: %s type=%d requestedHandleTypes=0x%x location.type=%d location.id=%d win32=%p "
               "allocFlags={comp=%u rdma=%u usage=%u}\n", who, what, rs(r), p.type, (unsigned) p.requested_handle_types,
               p.location.type, p.location.id, p.win32_handle_meta_data, p.alloc_flags.compression_type,
               p.alloc_flags.gpu_direct_rdma_capable, p.alloc_flags.usage);
        if (r == GP_CUDA_SUCCESS) {
                /* vmm_mem_adopt() in daemon/backend_cuda_vmm.c: the location alone, since 1b94658 */
                bool located = p.location.type == GP_CU_MEM_LOCATION_TYPE_DEVICE && p.location.id == 0;

                printf("[%s] %s: gpupoold's adoption check would %s; the check before 026efed would %s%s%s%s\n", who, what,
                       located ? "accept it" : "REFUSE it (location)",
                       !located || p.type != GP_CU_MEM_ALLOCATION_TYPE_PINNED ||
                                       !(p.requested_handle_types & GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ?
                               "refuse it:" : "accept it",
                       p.type != GP_CU_MEM_ALLOCATION_TYPE_PINNED ? " type" : "",
                       !located ? " location" : "",
                       !(p.requested_handle_types & GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ? " requestedHandleTypes" : "");
        }
}

static void print_fd(const char *what, int fd) {
        char link[64], path[256] = "?";
        struct stat st;
        ssize_t n;

        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        if ((n = readlink(link, path, sizeof(path) - 1)) > 0)
                path[n] = '\0';
        if (fstat(fd, &st) < 0)
                memset(&st, 0, sizeof(st));
        printf("[%s] %s: fd %d -> %s, mode 0%o, dev %lu:%lu, ino %lu, rdev %lu:%lu, size %lld, flags 0%o\n", who, what, fd, path,
               (unsigned) st.st_mode, (unsigned long) (st.st_dev >> 8), (unsigned long) (st.st_dev & 0xff),
               (unsigned long) st.st_ino, (unsigned long) (st.st_rdev >> 8), (unsigned long) (st.st_rdev & 0xff),
               (long long) st.st_size, (unsigned) fcntl(fd, F_GETFL));
}

static void ptr_attrs(const char *what, gp_cu_deviceptr va) {
        unsigned long long id = 0, size = 0;
        int types = -1, flags = -1;
        gp_cu_result r1, r2, r3, r4;

        if (!ptr_attr) {
                printf("[%s] %s: cuPointerGetAttribute absent\n", who, what);
                return;
        }
        r1 = ptr_attr(&types, PTR_ALLOWED_HANDLE_TYPES, va);
        r2 = ptr_attr(&flags, PTR_ACCESS_FLAGS, va);
        r3 = ptr_attr(&size, PTR_MAPPING_SIZE, va);
        r4 = ptr_attr(&id, PTR_MEMORY_BLOCK_ID, va);
        printf("[%s] %s: ALLOWED_HANDLE_TYPES %s 0x%x, ACCESS_FLAGS %s %d, MAPPING_SIZE %s %llu, MEMORY_BLOCK_ID %s %llu\n", who,
               what, rs(r1), types, rs(r2), flags, rs(r3), size, rs(r4), id);
}

/* A range of its own with h mapped (map_size of it) and made accessible with flags (-1: access never set); 0 on failure (said). */
static gp_cu_deviceptr map_at(const char *what, gp_cu_mem_handle h, uint64_t reserve, uint64_t map_size, int flags) {
        gp_cu_mem_access_desc a = { .location = base_prop.location, .flags = flags };
        gp_cu_deviceptr va = 0;
        gp_cu_result r = cu.cuMemAddressReserve(&va, reserve, 0, 0, 0), r2 = -1;

        if (r == GP_CUDA_SUCCESS && (r = cu.cuMemMap(va, map_size, 0, h, 0)) == GP_CUDA_SUCCESS && flags >= 0)
                r2 = cu.cuMemSetAccess(va, map_size, &a, 1);
        printf("[%s] %s: cuMemMap %llu MiB: %s; cuMemSetAccess(flags %d): %s\n", who, what,
               (unsigned long long) (map_size / MiB), rs(r), flags, r2 == -1 ? "-" : rs(r2));
        if (r != GP_CUDA_SUCCESS) {
                if (va)
                        (void) cu.cuMemAddressFree(va, reserve);
                return 0;
        }
        return va;
}

static int send_fds(int sock, const void *buf, size_t len, const int *fds, int n) {
        char cbuf[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
        struct cmsghdr *c;

        if (n) {
                m.msg_control = cbuf;
                m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
                c = CMSG_FIRSTHDR(&m);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
        }
        return sendmsg(sock, &m, 0) < 0 ? -1 : 0;
}

static int recv_fds(int sock, void *buf, size_t len, int *fds, int max) {
        char cbuf[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = { .iov_base = buf, .iov_len = len };
        struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        struct cmsghdr *c;
        int n = 0;

        if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) <= 0)
                return -1;
        for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                        n = (int) ((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        memcpy(fds, CMSG_DATA(c), sizeof(int) * (n < max ? n : max));
                }
        return n;
}

static int cuda_up(void) {
        gp_cu_context ctx;
        gp_cu_device dev;
        char err[256];

        if (gp_cuda_load(&cu, err, sizeof(err)) < 0) {
                printf("[%s] %s\n", who, err);
                return -1;
        }
        *(void **) &retain = gp_cuda_symbol(&cu, "cuMemRetainAllocationHandle", 11000);
        *(void **) &get_access = gp_cuda_symbol(&cu, "cuMemGetAccess", 10020);
        *(void **) &ptr_attr = gp_cuda_symbol(&cu, "cuPointerGetAttribute", 4000);
        *(void **) &memset8 = gp_cuda_symbol(&cu, "cuMemsetD8", 3020);
        *(void **) &memset8_async = gp_cuda_symbol(&cu, "cuMemsetD8Async", 3020);
        *(void **) &dtoh = gp_cuda_symbol(&cu, "cuMemcpyDtoH", 3020);
        *(void **) &htod = gp_cuda_symbol(&cu, "cuMemcpyHtoD", 3020);
        *(void **) &mod_load = gp_cuda_symbol(&cu, "cuModuleLoadData", 2000);
        *(void **) &mod_func = gp_cuda_symbol(&cu, "cuModuleGetFunction", 2000);
        *(void **) &launch = gp_cuda_symbol(&cu, "cuLaunchKernel", 4000);
        if (cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS || cu.cuDevicePrimaryCtxRetain(&ctx, dev) != GP_CUDA_SUCCESS ||
            cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS) {
                printf("[%s] no context on device 0\n", who);
                return -1;
        }
        probe_ctx = ctx;
        return 0;
}

/* B: a fresh process given the creator's two exports of one allocation (and another allocation's). */
static int importer(int sock) {
        int fds[4] = { -1, -1, -1, -1 }, n0, n1, n2, n3;
        gp_cu_mem_handle h1 = 0, h1b = 0, h2 = 0, hr = 0, hother = 0;
        gp_cu_deviceptr va1, va2, va1b, vap, vaother;
        gp_cu_result r;
        char buf[8];
        double t0;

        who = "B";
        if (recv_fds(sock, buf, sizeof(buf), fds, 4) != 3 || cuda_up() < 0)
                return 1;
        n0 = open_fds();
        print_fd("received export #1", fds[0]);
        r = cu.cuMemImportFromShareableHandle(&h1, (void *) (uintptr_t) fds[0], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf("[B] import export #1: %s, handle 0x%llx\n", rs(r), h1);
        if (r != GP_CUDA_SUCCESS)
                return 2;
        print_props("imported handle's properties (what vmm_mem_adopt sees)", h1);
        r = cu.cuMemImportFromShareableHandle(&h1b, (void *) (uintptr_t) fds[0], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf("[B] import export #1 again: %s, handle 0x%llx (%s)\n", rs(r), h1b, h1b == h1 ? "the same" : "another");
        r = cu.cuMemImportFromShareableHandle(&h2, (void *) (uintptr_t) fds[1], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf("[B] import export #2 (same allocation, second export): %s, handle 0x%llx (%s)\n", rs(r), h2,
               h2 == h1 ? "the same as #1's" : "another than #1's");
        r = cu.cuMemImportFromShareableHandle(&hother, (void *) (uintptr_t) fds[2], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf("[B] import another allocation's export: %s, handle 0x%llx\n", rs(r), hother);
        n1 = open_fds();
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        n2 = open_fds();
        va1 = map_at("export #1, whole", h1, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        va2 = map_at("export #2, whole", h2, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        va1b = map_at("export #1 imported again, whole", h1b, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        vap = map_at("export #1, 2 MiB prefix of 4", h1, 2 * MiB, 2 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        (void) map_at("export #1, 6 MiB (more than it has)", h1, 6 * MiB, 6 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        vaother = map_at("another allocation", hother, 2 * MiB, 2 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        n3 = open_fds();
        printf("[B] open fds: %d before imports, %d holding 3 received + 4 imports, %d after closing the 3, %d after mapping "
               "(the driver keeps %d per import)\n", n0, n1, n2, n3, n2 - n0);
        if (va1) {
                unsigned char b = 0;

                r = dtoh(&b, va1, 1);
                printf("[B] reads the creator's fill through export #1: %s 0x%02x\n", rs(r), b);
                ptr_attrs("mapping of export #1", va1);
        }
        if (va2)
                ptr_attrs("mapping of export #2 (same allocation)", va2);
        if (va1b)
                ptr_attrs("mapping of export #1's second import", va1b);
        if (vap)
                ptr_attrs("prefix mapping of export #1", vap);
        if (vaother)
                ptr_attrs("mapping of another allocation", vaother);
        if (va1 && retain) {
                /* As libgpupool leaves it: the imported handle released, the mapping holding the memory. */
                printf("[B] cuMemRelease of the imported handle, still mapped: %s\n", rs(cu.cuMemRelease(h1)));
                r = retain(&hr, (void *) (uintptr_t) va1);
                printf("[B] cuMemRetainAllocationHandle(mapping of #1): %s, handle 0x%llx (%s the imported 0x%llx)\n", rs(r), hr,
                       hr == h1 ? "==" : "!=", h1);
                if (r == GP_CUDA_SUCCESS) {
                        int fd = -1;

                        print_props("retained handle's properties", hr);
                        r = cu.cuMemExportToShareableHandle(&fd, hr, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                        printf("[B] re-export of the retained (imported) handle: %s\n", rs(r));
                        if (r == GP_CUDA_SUCCESS) {
                                print_fd("re-exported", fd);
                                close(fd);
                        }
                        (void) cu.cuMemRelease(hr);
                }
        }
        t0 = now_ns();
        for (int i = 0; i < 200; i++) {
                int fd = -1;
                gp_cu_mem_handle t;

                if (cu.cuMemExportToShareableHandle(&fd, h2, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS ||
                    cu.cuMemImportFromShareableHandle(&t, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
                            GP_CUDA_SUCCESS) {
                        printf("[B] export+import loop failed at %d\n", i);
                        break;
                }
                close(fd);
                (void) cu.cuMemRelease(t);
        }
        printf("[B] export + import + close + release of an imported handle: %.1f us each (200)\n", (now_ns() - t0) / 200 / 1e3);
        return 0;
}

static const char ptx[] =
        ".version 7.0\n.target sm_70\n.address_size 64\n"
        ".visible .entry poke(.param .u64 p)\n{\n.reg .b64 %rd<2>;\n.reg .b32 %r<2>;\n"
        "ld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd1, %rd1;\nmov.u32 %r1, 1515870810;\n"
        "st.global.u32 [%rd1], %r1;\nret;\n}\n";

/* C1/C2: maps the allocation read-only, as libgpupool attaches an object, and writes into it. */
static int reader(int sock, bool kernel) {
        int fds[4] = { -1 };
        gp_cu_mem_handle h;
        gp_cu_deviceptr va;
        unsigned long long flags = 99;
        unsigned char b = 0;
        gp_cu_result r, rs2 = -1;
        char buf[8];

        who = kernel ? "C2" : "C1";
        if (recv_fds(sock, buf, sizeof(buf), fds, 4) < 1 || cuda_up() < 0)
                return 1;
        if ((r = cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fds[0], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) !=
            GP_CUDA_SUCCESS) {
                printf("[%s] import: %s\n", who, rs(r));
                return 2;
        }
        close(fds[0]);
        if (!(va = map_at("mapped PROT_READ", h, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READ)))
                return 3;
        (void) cu.cuMemRelease(h);
        if (get_access) {
                r = get_access(&flags, &base_prop.location, va);
                printf("[%s] cuMemGetAccess: %s flags %llu\n", who, rs(r), flags);
        }
        ptr_attrs("read-only mapping", va);
        r = dtoh(&b, va, 1);
        printf("[%s] read (cuMemcpyDtoH): %s 0x%02x\n", who, rs(r), b);
        if (!kernel) {
                unsigned char src[4096];

                r = memset8_async(va, 0x00, 4096, NULL);
                if (r == GP_CUDA_SUCCESS)
                        rs2 = cu.cuCtxSynchronize();
                printf("[%s] write 4 KiB (cuMemsetD8Async, legacy stream): %s; cuCtxSynchronize: %s   "
                       "<- test_vmm_objects wants CUDA_ERROR_ILLEGAL_ADDRESS from one of them\n", who, rs(r),
                       rs2 == -1 ? "-" : rs(rs2));
                memset(src, 0x11, sizeof(src));
                printf("[%s] write 4 KiB at +1 MiB (cuMemcpyHtoD): %s\n", who, rs(htod(va + MiB, src, sizeof(src))));
        } else if (!mod_load || !mod_func || !launch) {
                printf("[%s] cuModuleLoadData/cuLaunchKernel absent: no kernel write\n", who);
        } else {
                void *mod = NULL, *fn = NULL, *args[1] = { &va };

                r = mod_load(&mod, ptx);
                if (r == GP_CUDA_SUCCESS)
                        r = mod_func(&fn, mod, "poke");
                if (r == GP_CUDA_SUCCESS)
                        r = launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
                if (r == GP_CUDA_SUCCESS)
                        rs2 = cu.cuCtxSynchronize();
                printf("[%s] write 4 bytes from a kernel (st.global): launch %s; cuCtxSynchronize: %s\n", who, rs(r),
                       rs2 == -1 ? "-" : rs(rs2));
        }
        r = dtoh(&b, va, 1);
        printf("[%s] read back byte 0: %s 0x%02x (%s)\n", who, rs(r), b,
               r != GP_CUDA_SUCCESS ? "context gone" : b == 0xab ? "unchanged: the write did not land" :
               "CHANGED: the write landed, read-only not enforced");
        return 0;
}

/* The median of n values (sorts them). */
static double median_of(double *v, int n) {
        for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                        double x = v[j];

                        v[j] = v[j - 1];
                        v[j - 1] = x;
                }
        return n ? v[n / 2] : 0;
}

/*
 * What an export costs by what the process did with the memory before: gpupoold exports a
 * segment on every lease, and holds it created only, mapped with no access set (where block ids
 * name allocations, to know it by its id) or mapped and accessible (where it zeroed it). Fresh
 * 2 MiB allocations, 20 of each: the first export and a second one, medians.
 */
static void export_costs(void) {
        static const char *const states[] = { "created, never mapped", "mapped, no access set", "mapped and accessible" };
        gp_cu_mem_access_desc rw = { .location = base_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };

        for (int st = 0; st < 3; st++) {
                double first[20], again[20];
                int n = 0;

                for (int i = 0; i < 20; i++) {
                        gp_cu_mem_handle h;
                        gp_cu_deviceptr va = 0;
                        int fd = -1;
                        double t;

                        if (cu.cuMemCreate(&h, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS)
                                break;
                        if (st > 0 && (cu.cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS ||
                                       cu.cuMemMap(va, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS)) {
                                (void) cu.cuMemRelease(h);
                                break;
                        }
                        if (st == 2)
                                (void) cu.cuMemSetAccess(va, 2 * MiB, &rw, 1);
                        t = now_ns();
                        if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == GP_CUDA_SUCCESS) {
                                first[n] = (now_ns() - t) / 1e3;
                                close(fd);
                                t = now_ns();
                                if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                                    GP_CUDA_SUCCESS) {
                                        again[n++] = (now_ns() - t) / 1e3;
                                        close(fd);
                                }
                        }
                        if (va) {
                                (void) cu.cuMemUnmap(va, 2 * MiB);
                                (void) cu.cuMemAddressFree(va, 2 * MiB);
                        }
                        (void) cu.cuMemRelease(h);
                }
                printf("[A] export of 2 MiB %s: first %.1f us, again %.1f us (medians of %d)\n", states[st],
                       median_of(first, n), median_of(again, n), n);
        }
}

/*
 * D: gpupoold's client, for daemon_pattern(): for each descriptor A sends, does what the byte
 * says ('c' closes it; 'i' imports it and keeps the import; 'm' imports, maps, sets access,
 * unmaps and releases, as a client's first block of a segment does), closes it, and answers
 * with how long the close took (us, a double).
 */
static int partner(int sock) {
        gp_cu_mem_access_desc rw = { .location = base_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        gp_cu_mem_handle kept[256];
        int nkept = 0, kept_fd = -1;

        who = "D";
        if (cuda_up() < 0)
                return 1;
        for (;;) {
                char mode = 0;
                int fd = -1;
                gp_cu_mem_handle h;
                gp_cu_deviceptr va = 0;

                if (recv_fds(sock, &mode, 1, &fd, 1) < 0 || mode == 'q')
                        break;
                if (mode == 'k') {      /* an export to hold open until the end, doing nothing with it */
                        double none = 0;

                        if (kept_fd >= 0)
                                close(kept_fd);
                        kept_fd = fd;
                        if (send_fds(sock, &none, sizeof(none), NULL, 0) < 0)
                                break;
                        continue;
                }
                if (fd >= 0 && mode != 'c' &&
                    cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                            GP_CUDA_SUCCESS) {
                        if (mode == 'i' && nkept < 256) {
                                kept[nkept++] = h;
                        } else {
                                if (cu.cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == GP_CUDA_SUCCESS) {
                                        if (cu.cuMemMap(va, 2 * MiB, 0, h, 0) == GP_CUDA_SUCCESS) {
                                                (void) cu.cuMemSetAccess(va, 2 * MiB, &rw, 1);
                                                (void) cu.cuMemUnmap(va, 2 * MiB);
                                        }
                                        (void) cu.cuMemAddressFree(va, 2 * MiB);
                                }
                                (void) cu.cuMemRelease(h);
                        }
                }
                double t = now_ns(), us;

                if (fd >= 0)
                        close(fd);
                us = (now_ns() - t) / 1e3;
                if (send_fds(sock, &us, sizeof(us), NULL, 0) < 0)
                        break;
        }
        while (nkept)
                (void) cu.cuMemRelease(kept[--nkept]);
        if (kept_fd >= 0)
                close(kept_fd);
        return 0;
}

/*
 * gpupoold's pattern: it exports a segment, sends the descriptor, closes its own, and the client
 * does something with it before the next export. Each mode's exports timed (20, medians), the
 * first left out: 'n' nothing sent (closed here), 'c' the client closes it, 'i' it imports and
 * keeps the import, 'm' it imports, maps and lets go; 'f' as 'm', of a fresh allocation each time.
 */
static void daemon_pattern(int sock) {
        static const char modes[] = "ncimf";
        gp_cu_mem_access_desc rw = { .location = base_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };

        for (const char *m = modes; *m; m++) {
                double us[20], close_us[20];
                int n = 0, nc = 0;
                gp_cu_mem_handle h = 0;
                gp_cu_deviceptr va = 0;

                for (int i = 0; i <= 20; i++) {
                        char mode = *m == 'f' ? 'm' : *m;
                        double closed = 0;
                        int fd = -1, got = -1, none = -1;
                        double t;

                        if (!h || *m == 'f') {
                                if (h) {
                                        (void) cu.cuMemUnmap(va, 2 * MiB);
                                        (void) cu.cuMemAddressFree(va, 2 * MiB);
                                        (void) cu.cuMemRelease(h);
                                }
                                if (cu.cuMemCreate(&h, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS ||
                                    cu.cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS ||
                                    cu.cuMemMap(va, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS) {
                                        printf("[A] daemon pattern: no memory\n");
                                        return;
                                }
                                (void) cu.cuMemSetAccess(va, 2 * MiB, &rw, 1);
                        }
                        t = now_ns();
                        if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                                break;
                        if (i)
                                us[n++] = (now_ns() - t) / 1e3;
                        if (mode != 'n' && send_fds(sock, &mode, 1, &fd, 1) == 0)
                                got = recv_fds(sock, &closed, sizeof(closed), &none, 1);
                        close(fd);
                        if (mode != 'n' && got < 0)
                                break;
                        if (mode != 'n' && i)
                                close_us[nc++] = closed;
                }
                if (h) {
                        (void) cu.cuMemUnmap(va, 2 * MiB);
                        (void) cu.cuMemAddressFree(va, 2 * MiB);
                        (void) cu.cuMemRelease(h);
                }
                printf("[A] export after the last one was %s: %.1f us (median of %d)\n",
                       *m == 'n' ? "closed here, never sent" : *m == 'c' ? "sent, and closed by the client" :
                       *m == 'i' ? "sent, imported and kept by the client" : *m == 'm' ? "sent, imported, mapped and let go by the client" :
                       "of a fresh allocation, each sent, imported, mapped and let go", median_of(us, n), n);
                if (nc)
                        printf("[D] its close of the descriptor there: %.1f us (median of %d)\n", median_of(close_us, nc), nc);
        }
        (void) send_fds(sock, "q", 1, NULL, 0);
}

/*
 * n exports of h, each closed at once, with held exports of another allocation open meanwhile:
 * the medians of the exports and of the closes, in us, in *export_us and *close_us. Returns how
 * many were made.
 */
static int export_close(gp_cu_mem_handle h, int n, double *export_us, double *close_us) {
        double e[200], c[200], t;
        int made = 0;

        for (; made < n && made < 200; made++) {
                int fd = -1;

                t = now_ns();
                if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                        break;
                e[made] = (now_ns() - t) / 1e3;
                t = now_ns();
                close(fd);
                c[made] = (now_ns() - t) / 1e3;
        }
        *export_us = median_of(e, made);
        *close_us = median_of(c, made);
        return made;
}

/*
 * A, first of all, before any other export exists: the driver keeps one internal client for the
 * whole host's exported objects, built when the host's count of open exports leaves zero and torn
 * down when the last export descriptor anywhere closes (NVIDIA's open kernel modules, 580 branch,
 * rmobjexportimport.c), a lead for gpupoold's 0.6 ms exports that no step of this probe could
 * show while it kept an export open. Exports and closes with none open, with 1, 10 and 1,000 open
 * here, and gpupoold's pattern with D (send, A's close, D's import, map and close) without and
 * with D holding an export of its own.
 */
static void export_count(int sock) {
        static const int held_counts[] = { 0, 1, 10, 1000 };
        gp_cu_mem_handle h, hk;
        double e, c;
        int n, kept = -1;

        if (cu.cuMemCreate(&h, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS ||
            cu.cuMemCreate(&hk, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS) {
                printf("[A] export count: no memory\n");
                return;
        }
        n = export_close(h, 200, &e, &c);
        printf("[A] export + close of 2 MiB, no other export open anywhere: export %.1f us, close %.1f us (medians of %d)\n",
               e, c, n);
        if (cu.cuMemExportToShareableHandle(&kept, hk, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == GP_CUDA_SUCCESS) {
                n = export_close(h, 200, &e, &c);
                printf("[A] export + close of 2 MiB, one export of another allocation kept open: export %.1f us, close %.1f us "
                       "(medians of %d)\n", e, c, n);
                close(kept);
        }
        {
                struct rlimit rl;

                if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 1100 && rl.rlim_max >= 1100) {
                        rl.rlim_cur = 1100;
                        (void) setrlimit(RLIMIT_NOFILE, &rl);
                }
        }
        for (size_t k = 0; k < sizeof(held_counts) / sizeof(held_counts[0]); k++) {
                static int held[1000];
                int nheld = 0;

                while (nheld < held_counts[k] &&
                       cu.cuMemExportToShareableHandle(&held[nheld], hk, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                               GP_CUDA_SUCCESS)
                        nheld++;
                n = export_close(h, 50, &e, &c);
                printf("[A] export + close with %d export%s of another allocation open (%d asked): export %.1f us, close %.1f us "
                       "(medians of %d)\n", nheld, nheld == 1 ? "" : "s", held_counts[k], e, c, n);
                while (nheld)
                        close(held[--nheld]);
        }
        for (int with = 0; with < 2; with++) {
                double us[20], close_us[20];
                int got = 0;

                if (with) {     /* D holds an export of its own from now on */
                        char mode = 'k';
                        double none;
                        int fd = -1, dummy = -1;

                        if (cu.cuMemExportToShareableHandle(&fd, hk, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS ||
                            send_fds(sock, &mode, 1, &fd, 1) < 0 || recv_fds(sock, &none, sizeof(none), &dummy, 1) < 0)
                                break;
                        close(fd);
                }
                for (int i = 0; i < 20; i++) {
                        char mode = 'm';
                        double t, closed = 0;
                        int fd = -1, none = -1;

                        t = now_ns();
                        if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                                break;
                        us[got] = (now_ns() - t) / 1e3;
                        if (send_fds(sock, &mode, 1, &fd, 1) < 0 || recv_fds(sock, &closed, sizeof(closed), &none, 1) < 0) {
                                close(fd);
                                break;
                        }
                        close(fd);
                        close_us[got++] = closed;
                }
                printf("[A] gpupoold's pattern (export, send, close; D imports, maps, lets go, closes), %s: export %.1f us, "
                       "D's close %.1f us (medians of %d)\n", with ? "D holding one export open" : "no other export open",
                       median_of(us, got), median_of(close_us, got), got);
        }
        (void) cu.cuMemRelease(hk);
        (void) cu.cuMemRelease(h);
}

/*
 * The median time of 20 exports (each closed) of a fresh 2 MiB allocation, in us, pause_us apart
 * (gpupoold's come milliseconds apart, this probe's other loops' microseconds), each after a
 * cuMemGetInfo where info_first; -1 where none could be made.
 */
static double export_median(bool push, gp_cu_context ctx, unsigned pause_us, bool info_first) {
        gp_cu_mem_handle h;
        double us[20];
        int n = 0;

        if (push && cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS)
                return -1;
        if (cu.cuMemCreate(&h, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS) {
                if (push)
                        (void) cu.cuCtxPopCurrent(&ctx);
                return -1;
        }
        if (push)
                (void) cu.cuCtxPopCurrent(&ctx);
        for (int i = 0; i < 20; i++) {
                int fd = -1;
                double t;
                gp_cu_result r;

                if (pause_us)
                        usleep(pause_us);
                if (info_first) {       /* as a lease: gpupoold asks what is free first (pool_read_device()) */
                        size_t fr, tot;

                        if (push)
                                (void) cu.cuCtxPushCurrent(ctx);
                        (void) cu.cuMemGetInfo(&fr, &tot);
                        if (push)
                                (void) cu.cuCtxPopCurrent(&ctx);
                }
                t = now_ns();
                if (push)
                        (void) cu.cuCtxPushCurrent(ctx);
                r = cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                if (push)
                        (void) cu.cuCtxPopCurrent(&ctx);
                if (r != GP_CUDA_SUCCESS)
                        break;
                us[n++] = (now_ns() - t) / 1e3;
                close(fd);
        }
        (void) cu.cuMemRelease(h);
        return n ? median_of(us, n) : -1;
}

/*
 * E: gpupoold's start, step by step, with the time of an export after each (an H200 gave gpupoold
 * exports of about 0.6 ms, and this probe's of about 20 us): its primary context retained and
 * current; cuMemGetInfo and a non-blocking stream; the allocations, exports, imports of its own
 * exports and mappings of its block id check (vmm_block_ids_name_allocations()); then each
 * export between a push and a pop of the context (cuda_enter()), right after a cuMemGetInfo as a
 * lease asks first, and 0.1 to 30 ms after the last.
 */
static int daemon_start(void) {
        gp_cu_mem_prop prop = base_prop;
        gp_cu_context ctx = NULL;
        gp_cu_stream stream;
        gp_cu_device dev;
        size_t fr, tot;
        char err[256];

        who = "E";
        if (gp_cuda_load(&cu, err, sizeof(err)) < 0 || cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS ||
            cu.cuDevicePrimaryCtxRetain(&ctx, dev) != GP_CUDA_SUCCESS || cu.cuCtxPushCurrent(ctx) != GP_CUDA_SUCCESS)
                return 1;
        *(void **) &ptr_attr = gp_cuda_symbol(&cu, "cuPointerGetAttribute", 4000);
        printf("[E] export with the primary context retained and current: %.1f us\n", export_median(false, NULL, 0, false));
        printf("[E] cuMemGetInfo %s, cuStreamCreate(NON_BLOCKING) %s\n", rs(cu.cuMemGetInfo(&fr, &tot)),
               rs(cu.cuStreamCreate(&stream, GP_CU_STREAM_NON_BLOCKING)));
        printf("[E] export after them: %.1f us\n", export_median(false, NULL, 0, false));
        {
                gp_cu_mem_handle h[4] = { 0 };
                gp_cu_deviceptr va = 0;
                int fds[2] = { -1, -1 }, mapped = 0;
                gp_cu_result r = cu.cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0);

                if (r == GP_CUDA_SUCCESS)
                        r = cu.cuMemCreate(&h[0], 2 * MiB, &prop, 0);
                if (r == GP_CUDA_SUCCESS)
                        r = cu.cuMemCreate(&h[3], 2 * MiB, &prop, 0);
                for (int i = 0; i < 2 && r == GP_CUDA_SUCCESS; i++)
                        r = cu.cuMemExportToShareableHandle(&fds[i], h[0], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                for (int i = 0; i < 2 && r == GP_CUDA_SUCCESS; i++)
                        r = cu.cuMemImportFromShareableHandle(&h[1 + i], (void *) (uintptr_t) fds[i],
                                                              GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                for (; mapped < 4 && r == GP_CUDA_SUCCESS; mapped++)
                        r = cu.cuMemMap(va + (uint64_t) mapped * 2 * MiB, 2 * MiB, 0, h[mapped], 0);
                for (int i = 0; i < 4 && r == GP_CUDA_SUCCESS && ptr_attr; i++) {
                        unsigned long long id = 0;

                        r = ptr_attr(&id, 20 /* MEMORY_BLOCK_ID */, va + (uint64_t) i * 2 * MiB);
                }
                printf("[E] gpupoold's block id check: %s\n", rs(r));
                while (mapped--)
                        (void) cu.cuMemUnmap(va + (uint64_t) mapped * 2 * MiB, 2 * MiB);
                for (int i = 0; i < 4; i++)
                        if (h[i])
                                (void) cu.cuMemRelease(h[i]);
                for (int i = 0; i < 2; i++)
                        if (fds[i] >= 0)
                                close(fds[i]);
                if (va)
                        (void) cu.cuMemAddressFree(va, 8 * MiB);
        }
        printf("[E] export after it: %.1f us\n", export_median(false, NULL, 0, false));
        (void) cu.cuCtxPopCurrent(&ctx);
        printf("[E] export between a push and a pop of the context: %.1f us\n", export_median(true, ctx, 0, false));
        printf("[E] export right after cuMemGetInfo, as a lease: %.1f us\n", export_median(true, ctx, 0, true));
        printf("[E] so, 3000 us after the last: %.1f us\n", export_median(true, ctx, 3000, true));
        for (unsigned pause = 100; pause <= 10000; pause *= 10)
                for (unsigned k = 1; k <= 3; k *= 3)
                        printf("[E] export %u us after the last: %.1f us\n", pause * k,
                               export_median(true, ctx, pause * k, false));
        return 0;
}

/*
 * F and A: what a granule's calls cost when a process makes several at once. A lease of
 * granules brings up to 128 descriptors, each an import (cuMemImportFromShareableHandle, 28 us
 * on an H200 alone), and the daemon exports each: whether threads of one process import (or
 * export) side by side or the driver takes them one at a time is what says whether a lease's
 * imports can be spread over threads. And a move unmaps granules one call each (cuMemUnmap,
 * 14 to 19 us): whether one call unmaps a run of them mapped side by side, and for how much.
 */
#define MANY 64

struct many_job {
        int op;                         /* 'i': import fds[]; 'e': export handles[] */
        const int *fds;
        const gp_cu_mem_handle *handles;
        gp_cu_mem_handle *out;          /* 'i': the imports */
        int n;
        int failed;
};

static void *many_thread(void *arg) {
        struct many_job *j = arg;

        if (cu.cuCtxPushCurrent(probe_ctx) != GP_CUDA_SUCCESS) {
                j->failed = j->n;
                return NULL;
        }
        for (int i = 0; i < j->n; i++) {
                int fd = -1;

                if (j->op == 'i')
                        j->failed += cu.cuMemImportFromShareableHandle(&j->out[i], (void *) (uintptr_t) j->fds[i],
                                                                       GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != GP_CUDA_SUCCESS;
                else if (cu.cuMemExportToShareableHandle(&fd, j->handles[i], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
                         GP_CUDA_SUCCESS)
                        j->failed++;
                else
                        close(fd);
        }
        (void) cu.cuCtxPopCurrent(NULL);
        return NULL;
}

/* MANY imports of fds (op 'i', into out) or exports of handles ('e') split over threads; returns the wall time in us. */
static double many_on(int op, int threads, const int *fds, const gp_cu_mem_handle *handles, gp_cu_mem_handle *out, int *failed) {
        struct many_job jobs[8];
        pthread_t tid[8];
        double t = now_ns();
        int per = MANY / threads;

        *failed = 0;
        for (int k = 0; k < threads; k++) {
                jobs[k] = (struct many_job) { .op = op, .fds = fds ? fds + k * per : NULL,
                                              .handles = handles ? handles + k * per : NULL, .out = out ? out + k * per : NULL,
                                              .n = per };
                if (pthread_create(&tid[k], NULL, many_thread, &jobs[k]) != 0)
                        jobs[k].failed = per, tid[k] = 0;
        }
        for (int k = 0; k < threads; k++) {
                if (tid[k])
                        pthread_join(tid[k], NULL);
                *failed += jobs[k].failed;
        }
        return (now_ns() - t) / 1e3;
}

/*
 * MANY imports of fds (op 'i', released after each round) or exports of handles ('e') on 1 to
 * 8 threads, 5 rounds each: the medians, printed by who.
 */
static void many_by_threads(int op, const int *fds, const gp_cu_mem_handle *handles) {
        const char *what = op == 'i' ? "import" : "export";
        gp_cu_mem_handle out[MANY];

        for (int threads = 1; threads <= 8; threads *= 2) {
                double us[5];
                int failed = 0, f;

                for (int rep = 0; rep < 5; rep++) {
                        us[rep] = many_on(op, threads, fds, handles, op == 'i' ? out : NULL, &f);
                        failed += f;
                        for (int i = 0; op == 'i' && i < MANY && !f; i++)
                                (void) cu.cuMemRelease(out[i]);
                }
                printf("[%s] %d %ss on %d thread%s: %.1f us in all, %.1f us per %s (median of 5); %d failed\n", who, MANY,
                       what, threads, threads == 1 ? "" : "s", median_of(us, 5), median_of(us, 5) / MANY, what, failed);
        }
}

/* F: a fresh process given MANY descriptors of 2 MiB granules, one message each. */
static int many_at_once(int sock) {
        gp_cu_mem_access_desc rw = { .location = base_prop.location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        gp_cu_mem_handle h[MANY];
        gp_cu_deviceptr va = 0;
        int fds[MANY], n = 0;

        who = "F";
        if (cuda_up() < 0)
                return 1;
        while (n < MANY) {
                char b;

                if (recv_fds(sock, &b, 1, &fds[n], 1) != 1)
                        break;
                n++;
        }
        printf("[F] %d descriptors of 2 MiB granules received\n", n);
        if (n < MANY)
                return 1;
        many_by_threads('i', fds, NULL);
        /* Runs of granules side by side: one cuMemUnmap and one cuMemSetAccess over the run, or one per granule. */
        for (int i = 0; i < 16; i++)
                if (cu.cuMemImportFromShareableHandle(&h[i], (void *) (uintptr_t) fds[i], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
                    GP_CUDA_SUCCESS)
                        return 1;
        if (cu.cuMemAddressReserve(&va, 16 * 2 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS)
                return 1;
        for (int run = 1; run <= 16; run *= 2) {
                double one_access[5], each_access[5], one_unmap[5], each_unmap[5], t;
                gp_cu_result r_access = GP_CUDA_SUCCESS, r_unmap = GP_CUDA_SUCCESS;
                int reps = 0;

                for (int rep = 0; rep < 5; rep++, reps++) {
                        for (int way = 0; way < 2; way++) {
                                gp_cu_result r;

                                for (int i = 0; i < run; i++)
                                        if (cu.cuMemMap(va + (uint64_t) i * 2 * MiB, 2 * MiB, 0, h[i], 0) != GP_CUDA_SUCCESS)
                                                return 1;
                                t = now_ns();
                                if (way == 0) {
                                        r = cu.cuMemSetAccess(va, (uint64_t) run * 2 * MiB, &rw, 1);
                                        one_access[rep] = (now_ns() - t) / 1e3;
                                        r_access = r != GP_CUDA_SUCCESS ? r : r_access;
                                } else {
                                        for (int i = 0; i < run; i++)
                                                (void) cu.cuMemSetAccess(va + (uint64_t) i * 2 * MiB, 2 * MiB, &rw, 1);
                                        each_access[rep] = (now_ns() - t) / 1e3;
                                }
                                t = now_ns();
                                if (way == 0) {
                                        r = cu.cuMemUnmap(va, (uint64_t) run * 2 * MiB);
                                        one_unmap[rep] = (now_ns() - t) / 1e3;
                                        if (r != GP_CUDA_SUCCESS) {
                                                r_unmap = r;
                                                for (int i = 0; i < run; i++)
                                                        (void) cu.cuMemUnmap(va + (uint64_t) i * 2 * MiB, 2 * MiB);
                                        }
                                } else {
                                        for (int i = 0; i < run; i++)
                                                (void) cu.cuMemUnmap(va + (uint64_t) i * 2 * MiB, 2 * MiB);
                                        each_unmap[rep] = (now_ns() - t) / 1e3;
                                }
                        }
                }
                printf("[F] a run of %2d granules side by side: one cuMemSetAccess %s %.1f us, one per granule %.1f us; "
                       "one cuMemUnmap %s %.1f us, one per granule %.1f us (medians of %d)\n",
                       run, rs(r_access), median_of(one_access, reps), median_of(each_access, reps), rs(r_unmap),
                       median_of(one_unmap, reps), median_of(each_unmap, reps), reps);
        }
        (void) cu.cuMemAddressFree(va, 16 * 2 * MiB);
        for (int i = 0; i < 16; i++)
                (void) cu.cuMemRelease(h[i]);
        /*
         * The daemon exports while a client imports: F imports MANY on one thread while A exports
         * MANY of its own at the same time, each timed alone above. Side by side, each takes what
         * it took alone; taken one at a time by the driver, each takes about the sum.
         */
        {
                double us;
                int failed;

                if (write(sock, "g", 1) != 1)
                        return 1;
                us = many_on('i', 1, fds, NULL, h, &failed);
                printf("[F] %d imports on 1 thread while A exports %d: %.1f us in all, %.1f us per import; %d failed\n", MANY,
                       MANY, us, us / MANY, failed);
                for (int i = 0; i < MANY && !failed; i++)
                        (void) cu.cuMemRelease(h[i]);
        }
        for (int i = 0; i < MANY; i++)
                close(fds[i]);
        return 0;
}

int main(void) {
        int sv[6][2], status, fd1 = -1, fd2 = -1, fd3 = -1, n0, n1;
        gp_cu_mem_handle h, hother, hfab;
        gp_cu_deviceptr va;
        size_t gmin = 0, grec = 0;
        pid_t pid[6];
        int vmm = -1, posix = -1, fabric = -1;
        gp_cu_result r;
        double t0;

        setvbuf(stdout, NULL, _IOLBF, 0);
        for (int i = 0; i < 6; i++) {
                if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv[i]) < 0)
                        return 1;
                if ((pid[i] = fork()) == 0) {
                        close(sv[i][0]);
                        alarm(50);
                        if (i == 4) {      /* alone on the GPU: started once A is done */
                                char go;

                                _exit(read(sv[i][1], &go, 1) == 1 ? daemon_start() : 1);
                        }
                        if (i == 5)
                                _exit(many_at_once(sv[i][1]));
                        _exit(i == 0 ? importer(sv[i][1]) : i == 3 ? partner(sv[i][1]) : reader(sv[i][1], i == 2));
                }
                close(sv[i][1]);
        }
        who = "A";
        alarm(55);
        if (cuda_up() < 0)
                return 1;
        {
                char name[128] = "?";
                gp_cu_device dev;

                (void) cu.cuDeviceGet(&dev, 0);
                (void) cu.cuDeviceGetName(name, sizeof(name), dev);
                (void) cu.cuDeviceGetAttribute(&vmm, GP_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
                (void) cu.cuDeviceGetAttribute(&posix, GP_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
                (void) cu.cuDeviceGetAttribute(&fabric, ATTR_FABRIC_SUPPORTED, dev);
                (void) cu.cuMemGetAllocationGranularity(&gmin, &base_prop, GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
                (void) cu.cuMemGetAllocationGranularity(&grec, &base_prop, GP_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
                printf("[A] driver %d, GPU 0 %s: VMM %d, POSIX fd %d, FABRIC %d; granularity min %zu recommended %zu\n",
                       cu.driver_version, name, vmm, posix, fabric, gmin, grec);
        }
        export_count(sv[3][0]);
        r = cu.cuMemCreate(&h, 4 * MiB, &base_prop, 0);
        printf("[A] cuMemCreate 4 MiB (POSIX fd): %s\n", rs(r));
        if (r != GP_CUDA_SUCCESS || cu.cuMemCreate(&hother, 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS)
                return 1;
        print_props("created handle's properties", h);
        if ((va = map_at("own mapping", h, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)))
                {
                        r = memset8(va, 0xab, 4 * MiB);
                        printf("[A] fill 0xab: %s, cuCtxSynchronize %s\n", rs(r), rs(cu.cuCtxSynchronize()));
                }
        if (va)
                ptr_attrs("own mapping", va);
        {
                /*
                 * gpupoold maps each segment it makes to name it by its block id (and to zero it);
                 * were the id given without cuMemSetAccess, a granule it makes would not need one.
                 */
                gp_cu_deviceptr van = map_at("mapping with no access set", hother, 2 * MiB, 2 * MiB, -1);

                if (van) {
                        ptr_attrs("mapping with no access set (MEMORY_BLOCK_ID given?)", van);
                        printf("[A] cuMemUnmap of it: %s; cuMemAddressFree: %s\n", rs(cu.cuMemUnmap(van, 2 * MiB)),
                               rs(cu.cuMemAddressFree(van, 2 * MiB)));
                }
        }
        {
                int fd = -1;
                gp_cu_mem_handle hi = 0;
                gp_cu_deviceptr vai;

                r = cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                if (r == GP_CUDA_SUCCESS)
                        r = cu.cuMemImportFromShareableHandle(&hi, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                printf("[A] import of its own export: %s, handle 0x%llx (created 0x%llx)\n", rs(r), hi, h);
                if (fd >= 0)
                        close(fd);
                if (r == GP_CUDA_SUCCESS) {
                        print_props("own re-imported handle's properties", hi);
                        if ((vai = map_at("own re-import", hi, 4 * MiB, 4 * MiB, GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)))
                                ptr_attrs("own re-import's mapping (MEMORY_BLOCK_ID as the own mapping's?)", vai);
                        (void) cu.cuMemRelease(hi);
                }
        }
        n0 = open_fds();
        r = cu.cuMemExportToShareableHandle(&fd1, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("[A] export #1: %s\n", rs(r));
        r = cu.cuMemExportToShareableHandle(&fd2, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("[A] export #2 of the same handle: %s\n", rs(r));
        (void) cu.cuMemExportToShareableHandle(&fd3, hother, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        n1 = open_fds();
        print_fd("export #1", fd1);
        print_fd("export #2", fd2);
        print_fd("another allocation's export", fd3);
        printf("[A] kcmp(KCMP_FILE) export #1 vs #2: %ld (0: one file; each export a file of its own otherwise); "
               "open fds +%d for 3 exports\n",
               syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, (unsigned long) fd1, (unsigned long) fd2), n1 - n0);
        t0 = now_ns();
        for (int i = 0; i < 1000; i++) {
                int fd = -1;

                if (cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                        break;
                close(fd);
        }
        printf("[A] cuMemExportToShareableHandle + close: %.1f us each (1000)\n", (now_ns() - t0) / 1000 / 1e3);
        export_costs();
        daemon_pattern(sv[3][0]);
        waitpid(pid[3], NULL, 0);
        {
                gp_cu_mem_prop fp = base_prop;
                unsigned char f1[64], f2[64];

                fp.requested_handle_types = FABRIC;
                r = cu.cuMemCreate(&hfab, 2 * MiB, &fp, 0);
                printf("[A] cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC: %s\n", rs(r));
                if (r == GP_CUDA_SUCCESS) {
                        gp_cu_result e1 = cu.cuMemExportToShareableHandle(f1, hfab, FABRIC, 0);
                        gp_cu_result e2 = cu.cuMemExportToShareableHandle(f2, hfab, FABRIC, 0);

                        printf("[A] fabric exports: %s, %s; the two 64-byte handles are %s\n", rs(e1), rs(e2),
                               memcmp(f1, f2, 64) ? "different" : "IDENTICAL (an identity without descriptors)");
                        (void) cu.cuMemRelease(hfab);
                }
        }
        /* B gets both exports of h and one of hother; C1 and C2 one each of h. */
        {
                int three[3] = { fd1, fd2, fd3 };

                (void) send_fds(sv[0][0], "m", 1, three, 3);
        }
        waitpid(pid[0], &status, 0);
        printf("[A] B exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        for (int i = 1; i < 3; i++) {
                int fd = -1;

                (void) cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                (void) send_fds(sv[i][0], "m", 1, &fd, 1);
                close(fd);
                waitpid(pid[i], &status, 0);
                printf("[A] C%d exited %d\n", i, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        if (va) {
                unsigned char b = 0;

                r = dtoh(&b, va, 1);
                printf("[A] creator reads byte 0 after the readers: %s 0x%02x\n", rs(r), b);
        }
        if (write(sv[4][0], "g", 1) == 1) {
                waitpid(pid[4], &status, 0);
                printf("[A] E exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        {
                gp_cu_mem_handle g[MANY];
                int made = 0;

                for (; made < MANY; made++) {
                        int fd = -1;

                        if (cu.cuMemCreate(&g[made], 2 * MiB, &base_prop, 0) != GP_CUDA_SUCCESS)
                                break;
                        if (cu.cuMemExportToShareableHandle(&fd, g[made], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
                                    GP_CUDA_SUCCESS ||
                            send_fds(sv[5][0], "g", 1, &fd, 1) < 0) {
                                if (fd >= 0)
                                        close(fd);
                                (void) cu.cuMemRelease(g[made]);
                                break;
                        }
                        close(fd);
                }
                if (made == MANY) {
                        char go;
                        int failed;
                        double us;

                        /* F says when it starts its imports beside these exports. */
                        if (read(sv[5][0], &go, 1) == 1) {
                                us = many_on('e', 1, NULL, g, NULL, &failed);
                                printf("[A] %d exports on 1 thread while F imports %d: %.1f us in all, %.1f us per export; "
                                       "%d failed\n", MANY, MANY, us, us / MANY, failed);
                        }
                }
                close(sv[5][0]);        /* F sees the end if fewer came */
                waitpid(pid[5], &status, 0);
                printf("[A] F exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                if (made == MANY)
                        many_by_threads('e', NULL, g);
                while (made)
                        (void) cu.cuMemRelease(g[--made]);
        }
        return 0;
}
