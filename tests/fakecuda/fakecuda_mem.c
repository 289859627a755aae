/*
 * fakecuda_mem.c: the fake driver's device memory (cuMemAlloc and the rest), the synchronous
 * copies, and legacy IPC handles, with the rules fakecuda.c's top comment lists: device
 * addresses that fault on the CPU, a file per allocation that other processes open through an
 * IPC handle, the handle wanting an allocation's base and opening the whole of it, refcounted
 * opens, a free of memory another process has open aborting, opens that cost time and are
 * refused across PID namespaces.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "fake.h"

#define HANDLE_MAGIC 0x55434b46u        /* "FKCU" */

struct alloc {
        struct alloc *next;
        uint64_t id;
        int gpu;
        CUdeviceptr dptr;               /* PROT_NONE reservation: the "device address" */
        size_t size;
        uint8_t *host;                  /* the bytes, mapped for cuMemcpy/cuMemset */
        int fd;
        bool imported;
        int opens;                      /* imported: cuIpcOpenMemHandle count */
        pid_t exporter;
};

struct wire_handle {                    /* what a CUipcMemHandle holds here */
        uint32_t magic;
        int32_t gpu;
        int32_t pid;
        uint32_t pad;
        uint64_t id;
        uint64_t size;
        uint64_t pidns;                 /* the exporter's PID namespace (its inode) */
};

static struct alloc *allocs;
static uint64_t next_id = 1;
static uint64_t ipc_open_ns, ipc_open_ns_per_mib;      /* what a first cuIpcOpenMemHandle takes */
static uint64_t my_pidns;               /* this process's PID namespace (its inode) */

static void mem_path(char *buf, size_t size, pid_t pid, uint64_t id) {
        snprintf(buf, size, "%s/fakecuda-%d-%llu", mem_dir(), (int) pid, (unsigned long long) id);
}

/* Reads the knobs of IPC opens, and this process's PID namespace. At cuInit, locked. */
void mem_init(void) {
        struct stat ns;

        /* An H100 with driver 580 took 50 us for 2 MiB and 102 us for 1 GiB (docs/performance.md). */
        ipc_open_ns = parse_bytes(getenv("FAKECUDA_IPC_OPEN_NS"), 50000);
        ipc_open_ns_per_mib = parse_bytes(getenv("FAKECUDA_IPC_OPEN_NS_PER_MIB"), 50);
        my_pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t) ns.st_ino : 0;
}

static uint64_t mono_ns(void) {
        struct timespec t;

        clock_gettime(CLOCK_MONOTONIC, &t);
        return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

uint64_t fake_now_ns(void) {
        return mono_ns();
}

void fake_spend(uint64_t ns) {
        fake_spend_since(mono_ns(), ns);
}

/*
 * Asleep for all but the last 100 us, with the thread's timer slack at 1 ns meanwhile (the
 * default 50 us would triple a 28 us call), then spinning to the end: a driver call's time, not
 * the scheduler's. A call shorter than that spins throughout: a wake-up takes tens of
 * microseconds on a busy or virtual machine, and with 15 us left to spin a 28 us import took 35
 * (bench/vmm_probe.c's process F on the fake; its cuMemSetAccess, whose own work left no time
 * to sleep, took 28.4). From the call's start: what the fake did meanwhile is part of the time.
 */
#define SPIN_NS 100000

void fake_spend_since(uint64_t start, uint64_t ns) {
        uint64_t end = start + ns, slack;

        if (!ns)
                return;
        if (end > mono_ns() + SPIN_NS) {
                uint64_t wake = end - SPIN_NS;
                struct timespec ts = { .tv_sec = (time_t) (wake / 1000000000u), .tv_nsec = (long) (wake % 1000000000u) };

                slack = (uint64_t) prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
                (void) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
                        ;
                (void) prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0);
        }
        while (mono_ns() < end)
                ;
}

/* ---- memory ---- */

/* Whether [p, p + n) lies in [base, base + size). */
bool within(CUdeviceptr p, size_t n, CUdeviceptr base, size_t size) {
        return p >= base && p < base + size && n <= size - (p - base);
}

/* The allocation containing [p, p + n), or NULL. Call locked. */
static struct alloc *find(CUdeviceptr p, size_t n) {
        for (struct alloc *a = allocs; a; a = a->next)
                if (within(p, n, a->dptr, a->size))
                        return a;
        return NULL;
}

static struct alloc *find_base(CUdeviceptr p) {
        for (struct alloc *a = allocs; a; a = a->next)
                if (a->dptr == p)
                        return a;
        return NULL;
}

static void unlink_alloc(struct alloc *a) {
        for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next)
                if (*pp == a) {
                        *pp = a->next;
                        return;
                }
}

/* Maps the bytes of fd and reserves a device address for them. Call locked. */
static CUresult map_alloc(struct alloc *a) {
        void *dev, *host;

        host = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
        if (host == MAP_FAILED)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        dev = mmap(NULL, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (dev == MAP_FAILED) {
                munmap(host, a->size);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->host = host;
        a->dptr = (CUdeviceptr) (uintptr_t) dev;
        return GP_CUDA_SUCCESS;
}

static void unmap_alloc(struct alloc *a) {
        munmap(a->host, a->size);
        munmap((void *) (uintptr_t) a->dptr, a->size);
        close(a->fd);
}

CUresult fk_MemAlloc_v2(CUdeviceptr *dptr, size_t size) {
        struct alloc *a;
        char path[256];
        CUresult r;
        int gpu;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (!dptr || size == 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        gpu = current()->gpu;
        size = (size + 4095) & ~(size_t) 4095;
        pthread_mutex_lock(&lock);
        if (!ledger_charge(gpu, size)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;     /* the GPU is full, with every process's memory */
        }
        a = calloc(1, sizeof(*a));
        if (!a) {
                ledger_uncharge(gpu, size);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->id = next_id++;
        a->gpu = gpu;
        a->size = size;
        a->exporter = getpid();
        mem_path(path, sizeof(path), a->exporter, a->id);
        a->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (a->fd < 0)
                fatal("cannot create %s: %s", path, strerror(errno));
        (void) fchmod(a->fd, 0666);     /* importers may run as another uid */
        if (ftruncate(a->fd, (off_t) size) < 0)
                fatal("cannot size %s: %s", path, strerror(errno));
        r = map_alloc(a);
        if (r) {
                close(a->fd);
                unlink(path);
                free(a);
                ledger_uncharge(gpu, size);
                pthread_mutex_unlock(&lock);
                return r;
        }
        a->next = allocs;
        allocs = a;
        pthread_mutex_unlock(&lock);
        *dptr = a->dptr;
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemFree_v2(CUdeviceptr dptr) {
        struct alloc *a;
        char path[256];

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || a->imported) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;    /* not an allocation of ours (or an IPC mapping) */
        }
        mem_path(path, sizeof(path), a->exporter, a->id);
        if (flock(a->fd, LOCK_EX | LOCK_NB) < 0)
                fatal("cuMemFree of a %zu-byte allocation that another process still has open through "
                      "cuIpcOpenMemHandle: undefined behaviour in CUDA", a->size);
        unlink_alloc(a);
        ledger_uncharge(a->gpu, a->size);
        unlink(path);
        unmap_alloc(a);
        free(a);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
        NEED_CTX();
        ledger_lock();
        *free_bytes = capacity - ledger_used(current()->gpu, true);     /* every process's memory counted */
        *total_bytes = capacity;
        ledger_unlock();
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
        struct alloc *a;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        a = find(dptr, 1);
        if (a) {
                if (base)
                        *base = a->dptr;
                if (size)
                        *size = a->size;
        }
        pthread_mutex_unlock(&lock);
        return a ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_NOT_FOUND;
}

/* The 32-bit ABI of CUDA 2.0, which the unversioned names still export. */
CUresult fk_MemAlloc_v1(unsigned *dptr, unsigned size) {
        CUdeviceptr p;
        CUresult r = fk_MemAlloc_v2(&p, size);

        if (r == GP_CUDA_SUCCESS)
                *dptr = (unsigned) p;          /* the top half of the address is lost */
        return r;
}

CUresult fk_MemFree_v1(unsigned dptr) {
        return fk_MemFree_v2(dptr);
}

CUresult fk_MemGetInfo_v1(unsigned *free_bytes, unsigned *total_bytes) {
        size_t f, t;
        CUresult r = fk_MemGetInfo_v2(&f, &t);

        if (r == GP_CUDA_SUCCESS) {
                *free_bytes = (unsigned) f;
                *total_bytes = (unsigned) t;
        }
        return r;
}

CUresult bytes_at(CUdeviceptr p, size_t n, bool write, uint8_t **ret) {
        struct alloc *a;
        bool read_only = false;

        pthread_mutex_lock(&lock);
        a = find(p, n);
        *ret = a ? a->host + (p - a->dptr) : vmap_bytes(p, n, &read_only);
        /*
         * A copy or memset into a read-only mapping is refused when it is called, and the
         * context lives: what an H200 did (driver 580.159.04, bench/results/2026-11-28-H200-d2ec017/).
         * Only a kernel's store faults there, and no kernel runs here.
         */
        if (*ret && write && read_only) {
                *ret = NULL;
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        pthread_mutex_unlock(&lock);
        return *ret ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/*
 * The synchronous copies run once the legacy stream, and so every blocking stream's work
 * queued before, has run (the driver's "API synchronization behavior"; the synchronous
 * memsets, in fakecuda_stream.c, return at once).
 */
CUresult fk_MemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
        uint8_t *h;
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if ((r = bytes_at(dst, n, true, &h)))
                return r;
        r = legacy_synchronize();
        if (r == GP_CUDA_SUCCESS)
                memcpy(h, src, n);
        return r;
}

CUresult fk_MemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
        uint8_t *h;
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if ((r = bytes_at(src, n, false, &h)))
                return r;
        r = legacy_synchronize();
        if (r == GP_CUDA_SUCCESS)
                memcpy(dst, h, n);
        return r;
}

/* ---- IPC ---- */

CUresult fk_IpcGetMemHandle(gp_cu_ipc_mem_handle *handle, CUdeviceptr dptr) {
        struct wire_handle w = { .magic = HANDLE_MAGIC };
        struct alloc *a;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || a->imported) {
                /* The documented contract: the base of a cuMemAlloc allocation, nothing else. */
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        w.gpu = a->gpu;
        w.pid = (int32_t) a->exporter;
        w.id = a->id;
        w.size = a->size;
        w.pidns = my_pidns;
        pthread_mutex_unlock(&lock);
        memset(handle, 0, sizeof(*handle));
        memcpy(handle->reserved, &w, sizeof(w));
        return GP_CUDA_SUCCESS;
}

CUresult fk_IpcOpenMemHandle_v2(CUdeviceptr *dptr, gp_cu_ipc_mem_handle handle, unsigned flags) {
        struct wire_handle w;
        struct alloc *a;
        struct stat st;
        char path[256];
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        memcpy(&w, handle.reserved, sizeof(w));
        if (!dptr || flags != GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (w.magic != HANDLE_MAGIC || w.gpu < 0 || w.gpu >= gpus)
                return GP_CUDA_ERROR_INVALID_HANDLE;
        if (w.pidns != my_pidns)
                return GP_CUDA_ERROR_INVALID_CONTEXT;  /* as CUDA: not across PID namespaces (containers) */
        if (w.pid == getpid())
                return GP_CUDA_ERROR_INVALID_CONTEXT;  /* as CUDA: not in the exporting process */
        pthread_mutex_lock(&lock);
        for (a = allocs; a; a = a->next)
                if (a->imported && a->exporter == w.pid && a->id == w.id) {
                        a->opens++;
                        *dptr = a->dptr;
                        pthread_mutex_unlock(&lock);
                        return GP_CUDA_SUCCESS;
                }
        a = calloc(1, sizeof(*a));
        if (!a) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        mem_path(path, sizeof(path), w.pid, w.id);
        a->fd = open(path, O_RDWR | O_CLOEXEC);
        if (a->fd < 0 || fstat(a->fd, &st) < 0 || (uint64_t) st.st_size != w.size) {
                /* The exporter freed it (or never made it): a stale or forged handle. */
                if (a->fd >= 0)
                        close(a->fd);
                free(a);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_HANDLE;
        }
        (void) flock(a->fd, LOCK_SH);
        a->id = w.id;
        a->gpu = w.gpu;
        a->size = w.size;
        a->imported = true;
        a->opens = 1;
        a->exporter = w.pid;
        r = map_alloc(a);
        if (r) {
                close(a->fd);
                free(a);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_MAP_FAILED;
        }
        a->next = allocs;
        allocs = a;
        *dptr = a->dptr;
        pthread_mutex_unlock(&lock);
        /* Mapping another process's allocation costs time that grows with its size. */
        fake_spend(ipc_open_ns + ipc_open_ns_per_mib * (w.size >> 20));
        return GP_CUDA_SUCCESS;
}

CUresult fk_IpcCloseMemHandle(CUdeviceptr dptr) {
        struct alloc *a;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || !a->imported) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        if (--a->opens == 0) {
                unlink_alloc(a);
                unmap_alloc(a);
                free(a);
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

/* ---- test hooks (not CUDA) ---- */

/* How many mappings of device memory this process has: IPC handles open, and VMM mappings. */
EXPORT int fakecuda_open_handles(void) {
        int n = 0;

        pthread_mutex_lock(&lock);
        for (struct alloc *a = allocs; a; a = a->next)
                n += a->imported;
        n += (int) vmaps.count; /* another process's memory mapped here, or ours: a mapping each */
        pthread_mutex_unlock(&lock);
        return n;
}

/* Rows of width bytes at a pitch of a multiple of 512 bytes, as the driver's works with its 2D copies. */
CUresult fk_MemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned element_size) {
        size_t p = (width + 511) & ~(size_t) 511;
        CUresult r;

        if (!dptr || !pitch || !width || !height || (element_size != 4 && element_size != 8 && element_size != 16) ||
            p < width || height > SIZE_MAX / p)
                return GP_CUDA_ERROR_INVALID_VALUE;
        r = fk_MemAlloc_v2(dptr, p * height);
        if (r == GP_CUDA_SUCCESS)
                *pitch = p;
        return r;
}

/* The entry points above under the names libcuda.so.1 exports them by (fake.h, FK_EXPORT). */
FK_EXPORT(cuIpcGetMemHandle, fk_IpcGetMemHandle);
FK_EXPORT(cuIpcOpenMemHandle_v2, fk_IpcOpenMemHandle_v2);
FK_EXPORT(cuIpcCloseMemHandle, fk_IpcCloseMemHandle);
FK_EXPORT(cuMemAlloc_v2, fk_MemAlloc_v2);
FK_EXPORT(cuMemFree_v2, fk_MemFree_v2);
FK_EXPORT(cuMemGetInfo_v2, fk_MemGetInfo_v2);
FK_EXPORT(cuMemGetAddressRange_v2, fk_MemGetAddressRange_v2);
FK_EXPORT(cuMemcpyHtoD_v2, fk_MemcpyHtoD_v2);
FK_EXPORT(cuMemcpyDtoH_v2, fk_MemcpyDtoH_v2);
FK_EXPORT(cuMemAllocPitch_v2, fk_MemAllocPitch_v2);
