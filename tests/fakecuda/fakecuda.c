/*
 * fakecuda.c: a CUDA driver for machines without a GPU, loaded through $GPUPOOL_LIBCUDA.
 *
 * It implements the entry points gpupool, its tests and its benchmark use, and enforces the
 * documented rules that bite a GPU memory service, so that breaking one fails in CI rather
 * than on a customer's GPU:
 *
 *   - entry points are found through cuGetProcAddress_v2 by base name and ABI version, and
 *     are exported by name as libcuda.so.1 exports them (cuMemAlloc_v2, cuStreamDestroy_v2:
 *     FK_EXPORT), for programs linked with -lcuda or that dlsym() them; the unversioned
 *     exports (cuMemAlloc, cuMemFree, cuMemGetInfo) are the 32-bit ABI of CUDA 2.0, as in the
 *     real libcuda, and truncate 64-bit pointers and sizes;
 *   - device memory is not host memory: a CUdeviceptr points at an inaccessible (PROT_NONE)
 *     reservation, so dereferencing one faults; cuMemcpy and cuMemset reach the bytes;
 *   - cuIpcGetMemHandle wants the base of an allocation (an interior pointer is refused);
 *     a handle opens the whole allocation; opening it in the exporting process fails with
 *     CUDA_ERROR_INVALID_CONTEXT; a second open in one process returns the same pointer
 *     (refcounted) and cuIpcCloseMemHandle undoes one open;
 *   - freeing memory another process still has open is undefined behaviour in CUDA: here it
 *     aborts the freeing process, with a message;
 *   - a process forked after cuInit cannot use the driver (CUDA_ERROR_NOT_INITIALIZED);
 *   - calls that need a context fail without a current one (CUDA_ERROR_INVALID_CONTEXT);
 *   - $CUDA_VISIBLE_DEVICES selects and renumbers the GPUs, whose UUIDs stay fixed, by
 *     ordinal, by "GPU-" UUID (or a unique start of one), or by a MIG instance's "MIG-" UUID;
 *   - waits spin (cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize), as in a context
 *     of the default scheduling; only an event made with CU_EVENT_BLOCKING_SYNC waits asleep;
 *   - streams and events belong to the context they were made in and are refused with
 *     another's; a destroyed stream's work still runs, and its handle comes back for the next
 *     stream made (cuStreamGetId tells them apart);
 *   - the legacy default stream (NULL, CU_STREAM_LEGACY) is a stream of its context that
 *     waits for the work queued before on every blocking stream (made without
 *     CU_STREAM_NON_BLOCKING), which wait for its own in turn; CU_STREAM_PER_THREAD is a
 *     blocking stream of each thread; the synchronous memsets go to the legacy stream and
 *     return at once, the synchronous copies wait for it (the driver's "API synchronization
 *     behavior"); the default streams cannot be captured;
 *   - graph capture: work and events on a capturing stream become graph nodes (run nothing,
 *     complete nothing); a potentially unsafe call (allocation, free, IPC open or close, an
 *     event query or wait, a synchronization) made while a capture forbids it, by the modes
 *     of cuThreadExchangeStreamCaptureMode, fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 *     and invalidates the capture; so does cuStreamGetId on a capturing stream, in any mode;
 *     an event recorded in a capture cannot be queried (CUDA_ERROR_CAPTURED_EVENT);
 *   - a process may make contexts of its own besides the primary ones (cuCtxCreate_v2,
 *     made current; cuCtxDestroy_v2), each taking device memory as a context does;
 *   - the default streams are the current context's: a call naming one without a current
 *     context fails (CUDA_ERROR_INVALID_CONTEXT), each context's has an id of its own, and
 *     cuStreamIsCapturing of the legacy stream while a blocking stream of its context
 *     captures says CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (cuda.h);
 *   - compute modes: no context on a PROHIBITED GPU, one process's at a time on an
 *     EXCLUSIVE_PROCESS one (CUDA_ERROR_DEVICE_UNAVAILABLE);
 *   - cuIpcOpenMemHandle costs time that grows with the allocation's size (what an H100
 *     took, by default), and a handle cannot be opened in another PID namespace than its
 *     exporter's (CUDA_ERROR_INVALID_CONTEXT), as legacy IPC handles cannot;
 *   - virtual memory management as documented: cuMemCreate sizes are granularity (2 MiB)
 *     multiples; only memory made for POSIX descriptors exports as one; an imported descriptor
 *     must name device memory, whose GPU cuMemGetAllocationPropertiesFromHandle gives as this
 *     process's ordinal; each export is a file of its own; cuMemMap wants offset 0, the whole allocation and a range of a
 *     reservation not mapped yet; mappings side by side are one range of addresses (a copy or
 *     memset may span them); a mapping is not accessible until cuMemSetAccess, and one made
 *     read-only (CU_MEM_ACCESS_FLAGS_PROT_READ) is read by copies but a copy or memset into
 *     it is refused at the call (CUDA_ERROR_INVALID_VALUE; the context lives); unmapping
 *     takes whole mappings, and a reservation is freed only unmapped; the memory lives while
 *     any process holds a handle, a descriptor or a mapping of it (its creator's exit
 *     included), and is freed with the last; a process keeps no descriptor per allocation it
 *     holds (the driver keeps none), so only the exports it holds count against its limit; an
 *     imported handle's properties carry no requested handle types, and it cannot be exported
 *     again (CUDA_ERROR_INVALID_VALUE); cuMemMap of a size not the handle's is
 *     CUDA_ERROR_NOT_SUPPORTED; cuPointerGetAttribute gives a mapping's allowed handle types,
 *     access flags, size and CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, its handle's own, counted
 *     per process from small numbers (before cuMemSetAccess too), unless
 *     $FAKECUDA_BLOCK_IDS=allocation gives every import of an allocation one id; cuMemGetAccess
 *     answers; a fabric handle is supported but not permitted (CUDA_ERROR_NOT_PERMITTED): all
 *     as an H200 answered bench/vmm_probe.c (bench/results/2026-11-28-H200-d2ec017/);
 *   - a GPU's memory is the node's: every process's allocations and contexts count against
 *     it (a context takes memory too, so on a full GPU cuDevicePrimaryCtxRetain fails with
 *     CUDA_ERROR_OUT_OF_MEMORY), cuMemGetInfo reports what all processes leave free, and what
 *     a process had comes back when it exits.
 *
 * "Device memory" is a file per allocation in $FAKECUDA_DIR (default /dev/shm), which every
 * process of the test can open; an IPC handle names it. Importers hold a shared flock() on
 * it, which is how a free by the exporter sees that someone still has it open. Streams are
 * worker threads running their operations in order; an event is a point in a stream's
 * sequence. fakecuda_stream_hold() stops a stream's worker, so tests can keep device work
 * pending for as long as they need instead of sleeping; an exclusive flock() on
 * $FAKECUDA_DIR/fakecuda-memsets.hold holds every memset, in every process (the daemon's too).
 *
 * Knobs: $FAKECUDA_DEVICES (GPUs on the node, default 1; 0 = none), $FAKECUDA_MEM (bytes per
 * GPU, default 1.5 GiB and a context: 512 MiB of pool under the default headroom; K/M/G
 * suffixes), $FAKECUDA_CONTEXT_MEM (what a process's context takes of a GPU, default 16 MiB;
 * a real one takes hundreds: 518 MiB seen on an H100 with CUDA 13), $FAKECUDA_COMPUTE_MODES
 * (a mode per GPU, "default", "prohibited" or "exclusive-process", comma-separated),
 * $FAKECUDA_MIG (the GPUs that are MIG instances, e.g. "1"), $FAKECUDA_VMM=0 (GPUs without
 * virtual memory management or descriptor handles), $FAKECUDA_IPC_OPEN_NS and $FAKECUDA_IPC_OPEN_NS_PER_MIB (what a first cuIpcOpenMemHandle of
 * an allocation takes: default 50 us and 50 ns per MiB, as on an H100 with driver 580).
 * $FAKECUDA_VMM_COSTS=0 makes the virtual memory calls free, which otherwise take what an H200
 * took, each call apart (fakecuda_vmm.c: cuMemCreate 20 us, an export 33 us, an import 28 us,
 * a reserve 0.8 us, a map 1.1 us, cuMemSetAccess 28 us and 62 ns per MiB, an unmap 19 us and
 * 29 ns per MiB, a release 9 us).
 * $FAKECUDA_DIR also holds fakecuda-ledger, the node's memory use by process.
 *
 * This file has cuInit, the devices and contexts, the entry-point table and the test hooks
 * that count calls: fakecuda_calls() counts every call of each entry point handed out, by
 * thread and in all (the fake is built with -finstrument-functions for it). Device memory and IPC handles are in fakecuda_mem.c; the node's ledger is
 * in fakecuda_ledger.c; streams, events and memsets are in fakecuda_stream.c; virtual memory
 * management (cuMemCreate and the rest) is in fakecuda_vmm.c; what the files share is in
 * fake.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define FAKE_DRIVER_VERSION 12080

enum compute_mode { MODE_DEFAULT = 0, MODE_PROHIBITED = 2, MODE_EXCLUSIVE_PROCESS = 3 };
static int compute_modes[MAX_GPUS];
static bool mig[MAX_GPUS];              /* a MIG instance ($FAKECUDA_MIG): "MIG-" UUID, " MIG " in its name */
bool vmm_off;                           /* $FAKECUDA_VMM=0: GPUs without VMM or descriptor handles */
bool block_ids_by_allocation;           /* $FAKECUDA_BLOCK_IDS=allocation: one MEMORY_BLOCK_ID per allocation */

pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t init_pid;                  /* 0 before cuInit */
int gpus;                               /* physical GPUs */
int visible[MAX_GPUS], nvisible;        /* ordinal -> physical */
uint64_t capacity;                      /* bytes per GPU ($FAKECUDA_MEM) */
static uint64_t context_bytes;          /* what a context takes of its GPU ($FAKECUDA_CONTEXT_MEM) */

static struct ctx ctxs[MAX_GPUS];              /* each GPU's primary context */
#define MAX_USER_CTXS 16
static struct ctx user_ctxs[MAX_USER_CTXS];     /* cuCtxCreate's: retained (1) while they live */
unsigned long long set_access_calls;            /* cuMemSetAccess calls (test hook) */
static __thread struct ctx *ctx_stack[16];
static __thread int ctx_depth;

void fatal(const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        fputs("fakecuda: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        abort();
}

uint64_t parse_bytes(const char *s, uint64_t dflt) {
        char *end;
        unsigned long long v;

        if (!s || !*s)
                return dflt;
        v = strtoull(s, &end, 10);
        switch (*end) {
        case 'K': case 'k': v <<= 10; break;
        case 'M': case 'm': v <<= 20; break;
        case 'G': case 'g': v <<= 30; break;
        default: break;
        }
        return v;
}

const char *mem_dir(void) {
        const char *d = getenv("FAKECUDA_DIR");

        return d && *d ? d : "/dev/shm";
}

/* $FAKECUDA_COMPUTE_MODES: a mode per physical GPU, "default", "prohibited" or "exclusive-process", comma-separated. */
static void parse_compute_modes(const char *spec) {
        int gpu = 0;

        memset(compute_modes, 0, sizeof(compute_modes));
        for (const char *p = spec; p && *p && gpu < MAX_GPUS; gpu++) {
                size_t n = strcspn(p, ",");

                if (n == 10 && strncmp(p, "prohibited", n) == 0)
                        compute_modes[gpu] = MODE_PROHIBITED;
                else if (n == 17 && strncmp(p, "exclusive-process", n) == 0)
                        compute_modes[gpu] = MODE_EXCLUSIVE_PROCESS;
                p += n + (p[n] == ',');
        }
}

/* Every call but cuInit and the pure lookups starts here. */
CUresult ready(void) {
        if (!init_pid || init_pid != getpid())
                return GP_CUDA_ERROR_NOT_INITIALIZED;
        return GP_CUDA_SUCCESS;
}

struct ctx *current(void) {
        return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

/* ---- initialization and devices ---- */

/* GPU gpu's UUID as nvidia-smi -L prints it: "GPU-" or, for a MIG instance, "MIG-", then 8-4-4-4-12 hex. */
static void uuid_text(int gpu, char *buf, size_t size) {
        unsigned char u[16];

        for (int i = 0; i < 16; i++)
                u[i] = (unsigned char) (0xf0 + gpu + i * 17);
        snprintf(buf, size, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 mig[gpu] ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                 u[12], u[13], u[14], u[15]);
}

/*
 * One entry of $CUDA_VISIBLE_DEVICES, as CUDA reads it: an ordinal, a "GPU-" UUID or a unique
 * start of one, or a MIG instance's "MIG-" UUID. Returns the physical GPU, or -1.
 */
static int visible_entry(const char *s, size_t n) {
        char uuid[48];
        int found = -1;

        if (n > 4 && (strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0)) {
                for (int g = 0; g < gpus; g++) {
                        uuid_text(g, uuid, sizeof(uuid));
                        if (strncmp(uuid, s, n) == 0) {
                                if (found >= 0)
                                        return -1;      /* not unique */
                                found = g;
                        }
                }
                return found;
        }
        for (size_t i = 0; i < n; i++)
                if (s[i] < '0' || s[i] > '9')
                        return -1;
        found = n ? atoi(s) : -1;
        return found < gpus ? found : -1;
}

static CUresult fk_Init(unsigned flags) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");

        if (flags)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        if (init_pid && init_pid != getpid()) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_NOT_INITIALIZED;  /* forked after cuInit: unusable, as in CUDA */
        }
        if (!init_pid) {
                gpus = (int) parse_bytes(getenv("FAKECUDA_DEVICES"), 1);
                if (gpus > MAX_GPUS)
                        gpus = MAX_GPUS;
                context_bytes = parse_bytes(getenv("FAKECUDA_CONTEXT_MEM"), 16ULL << 20);
                capacity = parse_bytes(getenv("FAKECUDA_MEM"), (1536ULL << 20) + context_bytes);
                nvisible = 0;
                memset(mig, 0, sizeof(mig));
                for (const char *m = getenv("FAKECUDA_MIG"); m && *m; m += strcspn(m, ",") + (m[strcspn(m, ",")] == ',')) {
                        int g = atoi(m);

                        if (g >= 0 && g < MAX_GPUS)
                                mig[g] = true;
                }
                if (cvd) {
                        /* As CUDA: ordinals or UUIDs; the first invalid entry ends the list. */
                        for (const char *s = cvd; *s && nvisible < MAX_GPUS; ) {
                                size_t n = strcspn(s, ",");
                                int v = visible_entry(s, n);

                                if (v < 0)
                                        break;
                                visible[nvisible++] = v;
                                s += n + (s[n] == ',');
                        }
                } else {
                        for (int i = 0; i < gpus; i++)
                                visible[nvisible++] = i;
                }
                for (int i = 0; i < MAX_GPUS; i++) {
                        ctxs[i].gpu = i;
                        ctxs[i].exclusive_fd = -1;
                }
                parse_compute_modes(getenv("FAKECUDA_COMPUTE_MODES"));
                vmm_off = getenv("FAKECUDA_VMM") && strcmp(getenv("FAKECUDA_VMM"), "0") == 0;
                block_ids_by_allocation = getenv("FAKECUDA_BLOCK_IDS") && strcmp(getenv("FAKECUDA_BLOCK_IDS"), "allocation") == 0;
                mem_init();
                vmm_init();
                ledger_join();
                init_pid = getpid();
        }
        pthread_mutex_unlock(&lock);
        return nvisible ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_NO_DEVICE;
}

static CUresult fk_DriverGetVersion(int *v) {
        if (!v)
                return GP_CUDA_ERROR_INVALID_VALUE;
        *v = FAKE_DRIVER_VERSION;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetCount(int *n) {
        CUresult r = ready();

        if (r)
                return r;
        *n = nvisible;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGet(gp_cu_device *d, int ordinal) {
        CUresult r = ready();

        if (r)
                return r;
        if (ordinal < 0 || ordinal >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *d = ordinal;
        return GP_CUDA_SUCCESS;
}

/* The device's memory: what $FAKECUDA_MEM gives each GPU. */
static CUresult fk_DeviceTotalMem_v2(size_t *bytes, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (!bytes)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *bytes = capacity;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetName(char *name, int len, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible || len <= 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        /* A MIG instance's name carries its profile, as "NVIDIA A100-SXM4-40GB MIG 1g.5gb" does. */
        snprintf(name, (size_t) len, "Fake GPU %d%s", visible[d], mig[visible[d]] ? " MIG 1g.10gb" : "");
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetUuid(gp_cu_uuid *uuid, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        /* Fixed per physical GPU, whatever CUDA_VISIBLE_DEVICES says. */
        for (int i = 0; i < 16; i++)
                uuid->bytes[i] = (char) (0xf0 + visible[d] + i * 17);
        return GP_CUDA_SUCCESS;
}

/*
 * As the driver: no context on a PROHIBITED GPU, and on an EXCLUSIVE_PROCESS one only in one
 * process at a time (a lock on a file of the GPU's, which the process's exit lets go of too).
 */
static CUresult fk_DeviceGetAttribute(int *value, int attribute, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (!value)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        switch (attribute) {
        case GP_CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
                *value = compute_modes[visible[d]];
                return GP_CUDA_SUCCESS;
        case GP_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        case GP_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        case FK_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
                /* Fabric handles too, as an H200 said, though cuMemCreate of one is not permitted here. */
                *value = !vmm_off;
                return GP_CUDA_SUCCESS;
        default:
                return GP_CUDA_ERROR_INVALID_VALUE;    /* not one the fake knows */
        }
}

static CUresult fk_DevicePrimaryCtxRetain(gp_cu_context *c, gp_cu_device d) {
        struct ctx *x;
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        x = &ctxs[visible[d]];
        if (compute_modes[x->gpu] == MODE_PROHIBITED)
                return GP_CUDA_ERROR_DEVICE_UNAVAILABLE;
        pthread_mutex_lock(&lock);
        if (compute_modes[x->gpu] == MODE_EXCLUSIVE_PROCESS && x->retained == 0) {
                char path[256];

                snprintf(path, sizeof(path), "%s/fakecuda-gpu%d.exclusive", mem_dir(), x->gpu);
                x->exclusive_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
                if (x->exclusive_fd < 0 || flock(x->exclusive_fd, LOCK_EX | LOCK_NB) < 0) {
                        if (x->exclusive_fd >= 0)
                                close(x->exclusive_fd);
                        x->exclusive_fd = -1;
                        pthread_mutex_unlock(&lock);
                        return GP_CUDA_ERROR_DEVICE_UNAVAILABLE;
                }
                (void) fchmod(x->exclusive_fd, 0666);
        }
        if (x->retained == 0 && !ledger_charge(x->gpu, context_bytes)) {
                /* A context takes device memory too: on a full GPU a new process cannot start. */
                if (x->exclusive_fd >= 0)
                        close(x->exclusive_fd);
                x->exclusive_fd = -1;
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        x->retained++;
        pthread_mutex_unlock(&lock);
        *c = (gp_cu_context) &ctxs[visible[d]];
        return GP_CUDA_SUCCESS;
}

/* Whether the device's primary context is active (retained by someone in this process); no flags are set. */
static CUresult fk_DevicePrimaryCtxGetState(gp_cu_device d, unsigned *flags, int *active) {
        CUresult r = ready();

        if (r)
                return r;
        if (!flags || !active)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        pthread_mutex_lock(&lock);
        *flags = 0;
        *active = ctxs[visible[d]].retained > 0;
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DevicePrimaryCtxRelease(gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible || ctxs[visible[d]].retained == 0)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        if (--ctxs[visible[d]].retained == 0) {
                ledger_uncharge(ctxs[visible[d]].gpu, context_bytes);
                if (ctxs[visible[d]].exclusive_fd >= 0) {
                        close(ctxs[visible[d]].exclusive_fd);
                        ctxs[visible[d]].exclusive_fd = -1;
                }
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static bool valid_ctx(gp_cu_context c) {
        struct ctx *x = (struct ctx *) c;

        return ((x >= ctxs && x < ctxs + MAX_GPUS) || (x >= user_ctxs && x < user_ctxs + MAX_USER_CTXS)) && x->retained > 0;
}

/*
 * A context of the program's own on device d, besides its primary one, made current (pushed),
 * as cuCtxCreate makes it; it takes device memory as a primary context does. Its streams,
 * events and default streams are its own. (The compute modes bind primary contexts only here.)
 */
static CUresult fk_CtxCreate_v2(gp_cu_context *c, unsigned flags, gp_cu_device d) {
        struct ctx *x = NULL;
        CUresult r = ready();

        (void) flags;
        if (r)
                return r;
        if (!c)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        if (compute_modes[visible[d]] == MODE_PROHIBITED)
                return GP_CUDA_ERROR_DEVICE_UNAVAILABLE;
        pthread_mutex_lock(&lock);
        for (int i = 0; i < MAX_USER_CTXS && !x; i++)
                if (user_ctxs[i].retained == 0)
                        x = &user_ctxs[i];
        if (!x || ctx_depth == 16 || !ledger_charge(visible[d], context_bytes)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        *x = (struct ctx) { .gpu = visible[d], .retained = 1, .exclusive_fd = -1 };
        pthread_mutex_unlock(&lock);
        ctx_stack[ctx_depth++] = x;
        *c = (gp_cu_context) x;
        return GP_CUDA_SUCCESS;
}

/* Ends a context cuCtxCreate made; it is no longer current to this thread. */
static CUresult fk_CtxDestroy_v2(gp_cu_context c) {
        struct ctx *x = (struct ctx *) c;
        int k = 0;
        CUresult r = ready();

        if (r)
                return r;
        if (!(x >= user_ctxs && x < user_ctxs + MAX_USER_CTXS) || x->retained == 0)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        x->retained = 0;
        ledger_uncharge(x->gpu, context_bytes);
        pthread_mutex_unlock(&lock);
        for (int i = 0; i < ctx_depth; i++)
                if (ctx_stack[i] != x)
                        ctx_stack[k++] = ctx_stack[i];
        ctx_depth = k;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_CtxPushCurrent(gp_cu_context c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!valid_ctx(c) || ctx_depth == 16)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        ctx_stack[ctx_depth++] = (struct ctx *) c;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_CtxPopCurrent(gp_cu_context *c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!ctx_depth)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        ctx_depth--;
        if (c)
                *c = (gp_cu_context) ctx_stack[ctx_depth];
        return GP_CUDA_SUCCESS;
}

static CUresult fk_CtxGetCurrent(gp_cu_context *c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!c)
                return GP_CUDA_ERROR_INVALID_VALUE;
        *c = (gp_cu_context) current();
        return GP_CUDA_SUCCESS;
}

/* The current context's device, as this process numbers it. */
static CUresult fk_CtxGetDevice(gp_cu_device *d) {
        struct ctx *x;
        CUresult r = ready();

        if (r)
                return r;
        if (!d)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (!(x = current()))
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        for (int o = 0; o < nvisible; o++)
                if (visible[o] == x->gpu) {
                        *d = o;
                        return GP_CUDA_SUCCESS;
                }
        return GP_CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult fk_CtxSetCurrent(gp_cu_context c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!c) {
                if (ctx_depth)
                        ctx_depth--;
                return GP_CUDA_SUCCESS;
        }
        if (!valid_ctx(c))
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        if (ctx_depth)
                ctx_stack[ctx_depth - 1] = (struct ctx *) c;
        else
                ctx_stack[ctx_depth++] = (struct ctx *) c;
        return GP_CUDA_SUCCESS;
}

/* ---- stream-ordered allocation, for the benchmark's baseline ---- */

static CUresult fk_MemAllocAsync(CUdeviceptr *dptr, size_t size, gp_cu_stream s) {
        (void) s;
        return fk_MemAlloc_v2(dptr, size);
}

static CUresult fk_MemFreeAsync(CUdeviceptr dptr, gp_cu_stream s) {
        (void) s;
        return fk_MemFree_v2(dptr);
}

static CUresult fk_DeviceGetDefaultMemPool(gp_cu_mempool *pool, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *pool = (gp_cu_mempool) &ctxs[visible[d]];
        return GP_CUDA_SUCCESS;
}

static CUresult fk_MemPoolSetAttribute(gp_cu_mempool pool, int attr, void *value) {
        (void) pool, (void) attr;
        return value ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* The fake's stream-ordered frees free at once: there is never anything to trim. */
static CUresult fk_MemPoolTrimTo(gp_cu_mempool pool, size_t keep) {
        (void) keep;
        return pool ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* ---- errors and entry points ---- */

static CUresult fk_GetErrorName(CUresult r, const char **name) {
        static const struct { CUresult r; const char *name; } names[] = {
                { GP_CUDA_SUCCESS, "CUDA_SUCCESS" },
                { GP_CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE" },
                { GP_CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY" },
                { GP_CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED" },
                { GP_CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE" },
                { GP_CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE" },
                { GP_CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE" },
                { GP_CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT" },
                { GP_CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED" },
                { GP_CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE" },
                { GP_CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND" },
                { GP_CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY" },
                { GP_CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS" },
                { GP_CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE" },
                { GP_CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED" },
                { GP_CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" },
                { GP_CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD" },
        };

        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                if (names[i].r == r) {
                        *name = names[i].name;
                        return GP_CUDA_SUCCESS;
                }
        *name = NULL;
        return GP_CUDA_ERROR_INVALID_VALUE;
}

struct symbol {
        const char *name;
        int version;                    /* the lowest cudaVersion that gets this ABI */
        void *fn;
};

#define SYM(name, version, fn) { name, version, (void *) fn }
static const struct symbol symbols[] = {
        SYM("cuInit", 2000, fk_Init),
        SYM("cuDriverGetVersion", 2020, fk_DriverGetVersion),
        SYM("cuGetErrorName", 6000, fk_GetErrorName),
        SYM("cuDeviceGetCount", 2000, fk_DeviceGetCount),
        SYM("cuDeviceGet", 2000, fk_DeviceGet),
        SYM("cuDeviceGetName", 2000, fk_DeviceGetName),
        SYM("cuDeviceGetUuid", 9020, fk_DeviceGetUuid),
        SYM("cuDeviceGetUuid", 11040, fk_DeviceGetUuid),
        SYM("cuDeviceGetAttribute", 2000, fk_DeviceGetAttribute),
        SYM("cuDevicePrimaryCtxRetain", 7000, fk_DevicePrimaryCtxRetain),
        SYM("cuDevicePrimaryCtxRelease", 11000, fk_DevicePrimaryCtxRelease),
        SYM("cuCtxPushCurrent", 4000, fk_CtxPushCurrent),
        SYM("cuCtxPopCurrent", 4000, fk_CtxPopCurrent),
        SYM("cuCtxSetCurrent", 4000, fk_CtxSetCurrent),
        SYM("cuCtxGetCurrent", 4000, fk_CtxGetCurrent),
        SYM("cuCtxCreate", 3020, fk_CtxCreate_v2),
        SYM("cuCtxDestroy", 4000, fk_CtxDestroy_v2),
        SYM("cuDevicePrimaryCtxGetState", 7000, fk_DevicePrimaryCtxGetState),
        SYM("cuCtxGetDevice", 2000, fk_CtxGetDevice),
        SYM("cuDeviceTotalMem", 3020, fk_DeviceTotalMem_v2),
        SYM("cuCtxSynchronize", 2000, fk_CtxSynchronize),
        SYM("cuMemAlloc", 2000, fk_MemAlloc_v1),
        SYM("cuMemAlloc", 3020, fk_MemAlloc_v2),
        SYM("cuMemAllocPitch", 3020, fk_MemAllocPitch_v2),
        SYM("cuMemFree", 2000, fk_MemFree_v1),
        SYM("cuMemFree", 3020, fk_MemFree_v2),
        SYM("cuMemGetInfo", 2000, fk_MemGetInfo_v1),
        SYM("cuMemGetInfo", 3020, fk_MemGetInfo_v2),
        SYM("cuMemGetAddressRange", 3020, fk_MemGetAddressRange_v2),
        SYM("cuMemsetD8", 3020, fk_MemsetD8_v2),
        SYM("cuMemsetD32", 3020, fk_MemsetD32_v2),
        SYM("cuMemsetD8Async", 3020, fk_MemsetD8Async),
        SYM("cuMemsetD32Async", 3020, fk_MemsetD32Async),
        SYM("cuMemcpyHtoD", 3020, fk_MemcpyHtoD_v2),
        SYM("cuMemcpyDtoH", 3020, fk_MemcpyDtoH_v2),
        SYM("cuIpcGetMemHandle", 4010, fk_IpcGetMemHandle),
        SYM("cuIpcOpenMemHandle", 11000, fk_IpcOpenMemHandle_v2),
        SYM("cuIpcCloseMemHandle", 4010, fk_IpcCloseMemHandle),
        SYM("cuStreamCreate", 2000, fk_StreamCreate),
        SYM("cuStreamDestroy", 4000, fk_StreamDestroy_v2),
        SYM("cuStreamSynchronize", 2000, fk_StreamSynchronize),
        SYM("cuStreamGetId", 12000, fk_StreamGetId),
        SYM("cuStreamGetCtx", 9020, fk_StreamGetCtx),
        SYM("cuStreamBeginCapture", 10010, fk_StreamBeginCapture),
        SYM("cuStreamEndCapture", 10000, fk_StreamEndCapture),
        SYM("cuStreamIsCapturing", 10000, fk_StreamIsCapturing),
        SYM("cuThreadExchangeStreamCaptureMode", 10010, fk_ThreadExchangeStreamCaptureMode),
        SYM("cuGraphDestroy", 10000, fk_GraphDestroy),
        SYM("cuEventCreate", 2000, fk_EventCreate),
        SYM("cuEventRecord", 2000, fk_EventRecord),
        SYM("cuEventQuery", 2000, fk_EventQuery),
        SYM("cuEventSynchronize", 2000, fk_EventSynchronize),
        SYM("cuEventDestroy", 4000, fk_EventDestroy_v2),
        SYM("cuMemAllocAsync", 11020, fk_MemAllocAsync),
        SYM("cuMemFreeAsync", 11020, fk_MemFreeAsync),
        SYM("cuDeviceGetDefaultMemPool", 11020, fk_DeviceGetDefaultMemPool),
        SYM("cuMemPoolSetAttribute", 11020, fk_MemPoolSetAttribute),
        SYM("cuMemPoolTrimTo", 11020, fk_MemPoolTrimTo),
        SYM("cuMemGetAccess", 10020, fk_MemGetAccess),
        SYM("cuMemGetAllocationGranularity", 10020, fk_MemGetAllocationGranularity),
        SYM("cuMemCreate", 10020, fk_MemCreate),
        SYM("cuMemRelease", 10020, fk_MemRelease),
        SYM("cuMemExportToShareableHandle", 10020, fk_MemExportToShareableHandle),
        SYM("cuMemImportFromShareableHandle", 10020, fk_MemImportFromShareableHandle),
        SYM("cuMemGetAllocationPropertiesFromHandle", 10020, fk_MemGetAllocationPropertiesFromHandle),
        SYM("cuMemAddressReserve", 10020, fk_MemAddressReserve),
        SYM("cuMemAddressFree", 10020, fk_MemAddressFree),
        SYM("cuMemMap", 10020, fk_MemMap),
        SYM("cuMemUnmap", 10020, fk_MemUnmap),
        SYM("cuMemSetAccess", 10020, fk_MemSetAccess),
        SYM("cuMemRetainAllocationHandle", 11000, fk_MemRetainAllocationHandle),
        SYM("cuPointerGetAttribute", 4000, fk_PointerGetAttribute),
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
        const struct symbol *best = NULL;
        bool named = false;

        if (!symbol || !pfn || version > FAKE_DRIVER_VERSION || flags > 2)
                return GP_CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
                if (strcmp(symbols[i].name, symbol) != 0)
                        continue;
                named = true;
                if (symbols[i].version <= version && (!best || symbols[i].version > best->version))
                        best = &symbols[i];
        }
        *pfn = best ? best->fn : NULL;
        if (status)
                *status = best ? 0 : named ? 2 : 1;    /* SUCCESS, VERSION_NOT_SUFFICIENT, SYMBOL_NOT_FOUND */
        return GP_CUDA_SUCCESS;
}

/*
 * The calls of the entry points cuGetProcAddress_v2 hands out, counted for fakecuda_calls():
 * the fake is built with -finstrument-functions, and a function entered with no other of the
 * fake's under way on its thread is a call from outside, counted when it is an entry point.
 */
#define NSYMBOLS (sizeof(symbols) / sizeof(symbols[0]))
static __thread unsigned call_depth;
static __thread unsigned long long calls_mine[NSYMBOLS];
static unsigned long long calls_all[NSYMBOLS];          /* atomic */

__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site) {
        (void) site;
        if (call_depth++)
                return;
        for (size_t i = 0; i < NSYMBOLS; i++)
                if (symbols[i].fn == fn) {
                        calls_mine[i]++;
                        __atomic_add_fetch(&calls_all[i], 1, __ATOMIC_RELAXED);
                        return;
                }
}

__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site) {
        (void) fn, (void) site;
        call_depth--;
}

/* CUDA 11.3's cuGetProcAddress, without the symbol's status, as libcuda.so.1 still exports it. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
        return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* The unversioned names, exported as the real driver exports them: the 32-bit ABI. */
EXPORT CUresult cuInit(unsigned flags) { return fk_Init(flags); }
EXPORT CUresult cuMemAlloc(unsigned *dptr, unsigned size) { return fk_MemAlloc_v1(dptr, size); }
EXPORT CUresult cuMemFree(unsigned dptr) { return fk_MemFree_v1(dptr); }
EXPORT CUresult cuMemGetInfo(unsigned *free_bytes, unsigned *total_bytes) { return fk_MemGetInfo_v1(free_bytes, total_bytes); }

/* ---- test hooks (not CUDA) ---- */

/* A call counter's value, read locked. */
unsigned long long counted(const unsigned long long *counter) {
        unsigned long long n;

        pthread_mutex_lock(&lock);
        n = *counter;
        pthread_mutex_unlock(&lock);
        return n;
}

/*
 * Calls of the entry point name (every version of it; NULL: of all entry points) made through
 * the pointers cuGetProcAddress_v2 handed out, by the calling thread (mine) or the process.
 */
EXPORT unsigned long long fakecuda_calls(const char *name, int mine) {
        unsigned long long n = 0;

        for (size_t i = 0; i < NSYMBOLS; i++)
                if (!name || strcmp(symbols[i].name, name) == 0)
                        n += mine ? calls_mine[i] : __atomic_load_n(&calls_all[i], __ATOMIC_RELAXED);
        return n;
}

/* The i-th entry point's name, each name once; NULL past the last. */
EXPORT const char *fakecuda_call_name(unsigned i) {
        for (size_t k = 0; k < NSYMBOLS; k++) {
                bool first = true;

                for (size_t j = 0; j < k && first; j++)
                        first = strcmp(symbols[j].name, symbols[k].name) != 0;
                if (first && i-- == 0)
                        return symbols[k].name;
        }
        return NULL;
}

/* How many times cuMemSetAccess was called in this process. */
EXPORT unsigned long long fakecuda_set_access_calls(void) {
        return counted(&set_access_calls);
}

/* The entry points above under the names libcuda.so.1 exports them by (fake.h, FK_EXPORT). */
FK_EXPORT(cuDriverGetVersion, fk_DriverGetVersion);
FK_EXPORT(cuGetErrorName, fk_GetErrorName);
FK_EXPORT(cuDeviceGetCount, fk_DeviceGetCount);
FK_EXPORT(cuDeviceGet, fk_DeviceGet);
FK_EXPORT(cuDeviceGetName, fk_DeviceGetName);
FK_EXPORT(cuDeviceGetUuid, fk_DeviceGetUuid);
FK_EXPORT(cuDeviceGetUuid_v2, fk_DeviceGetUuid);
FK_EXPORT(cuDeviceGetAttribute, fk_DeviceGetAttribute);
FK_EXPORT(cuDevicePrimaryCtxRetain, fk_DevicePrimaryCtxRetain);
FK_EXPORT(cuDevicePrimaryCtxRelease_v2, fk_DevicePrimaryCtxRelease);
FK_EXPORT(cuCtxPushCurrent_v2, fk_CtxPushCurrent);
FK_EXPORT(cuCtxPopCurrent_v2, fk_CtxPopCurrent);
FK_EXPORT(cuCtxSetCurrent, fk_CtxSetCurrent);
FK_EXPORT(cuCtxGetCurrent, fk_CtxGetCurrent);
FK_EXPORT(cuCtxCreate_v2, fk_CtxCreate_v2);
FK_EXPORT(cuCtxDestroy_v2, fk_CtxDestroy_v2);
FK_EXPORT(cuDevicePrimaryCtxGetState, fk_DevicePrimaryCtxGetState);
FK_EXPORT(cuCtxGetDevice, fk_CtxGetDevice);
FK_EXPORT(cuDeviceTotalMem_v2, fk_DeviceTotalMem_v2);
FK_EXPORT(cuMemAllocAsync, fk_MemAllocAsync);
FK_EXPORT(cuMemFreeAsync, fk_MemFreeAsync);
FK_EXPORT(cuDeviceGetDefaultMemPool, fk_DeviceGetDefaultMemPool);
FK_EXPORT(cuMemPoolSetAttribute, fk_MemPoolSetAttribute);
FK_EXPORT(cuMemPoolTrimTo, fk_MemPoolTrimTo);
