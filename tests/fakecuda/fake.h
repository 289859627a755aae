/*
 * fake.h: what the fake driver's files share (fakecuda.c, fakecuda_ledger.c, fakecuda_mem.c,
 * fakecuda_stream.c, fakecuda_vmm.c): its lock, devices and contexts, the node's ledger, the
 * checks every entry point starts with, and the entry points that the entry-point table in
 * fakecuda.c names. Not an interface of the library: every name here is hidden; only
 * EXPORT'ed ones leave libfakecuda.so.
 */
#ifndef GP_FAKE_H
#define GP_FAKE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadrv.h"
#include "rbtree.h"

#define EXPORT __attribute__((visibility("default")))
/*
 * Exports entry point fn under name, as libcuda.so.1 exports each of its entry points by
 * name (the ABI version's: cuMemAlloc_v2), for programs linked with -lcuda and those that
 * dlsym() them. In the file that defines fn.
 */
#define FK_EXPORT(name, fn) extern __typeof__(fn) name __attribute__((alias(#fn), visibility("default")))
#define MAX_GPUS 8

typedef gp_cu_result CUresult;
typedef gp_cu_deviceptr CUdeviceptr;

struct phys;

/* A GPU's primary context, one per physical GPU. */
struct ctx {
        int gpu;                        /* physical index */
        int retained;
        int exclusive_fd;               /* EXCLUSIVE_PROCESS: the device's lock file, held while retained */
};

/* fakecuda.c: the process's driver state, guarded by lock. */
extern pthread_mutex_t lock;
extern uint64_t capacity;               /* bytes per GPU ($FAKECUDA_MEM), set at cuInit */
extern int gpus;                        /* physical GPUs */
extern int visible[MAX_GPUS], nvisible; /* ordinal -> physical */
extern bool block_ids_by_allocation;    /* $FAKECUDA_BLOCK_IDS=allocation */
extern bool vmm_off;                    /* $FAKECUDA_VMM=0: GPUs without VMM or descriptor handles */
extern unsigned long long set_access_calls;     /* cuMemSetAccess calls (test hook) */

/* Says what broke in the fake itself, and aborts. */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Where "device memory" files are: $FAKECUDA_DIR, else /dev/shm. */
const char *mem_dir(void);
/* A test hook's call counter, read under lock. */
unsigned long long counted(const unsigned long long *counter);

/*
 * fakecuda_ledger.c: the node's memory, every process's. ledger_join() maps it at cuInit and
 * takes this process's slot. Under ledger_lock(): whether size more fits on gpu, what every
 * process has of it (with check, those that exited are forgotten first), charging cuMemCreate
 * memory, and freeing such memory at path if no process holds it any more (whether it did).
 * ledger_charge() takes the lock itself: whether the node had size more for this process.
 */
void ledger_join(void);
void ledger_lock(void);
void ledger_unlock(void);
bool ledger_fits(int gpu, uint64_t size);
uint64_t ledger_used(int gpu, bool check);
void ledger_vmm_charge(int gpu, uint64_t size);
/* Frees cuMemCreate memory nobody holds: 1 freed, 0 held by a handle or mapping, -1 by exported descriptors alone. */
int vmm_free_if_unheld(const char *path, int gpu, uint64_t size);
/* This process holds cuMemCreate memory: when it exits, the next check sweeps what it held. */
void ledger_vmm_holder(void);
uint64_t ledger_vmm_id(void);
/* fakecuda_vmm.c: whether any process holds a handle or a mapping of cuMemCreate allocation id. */
bool vmm_held(uint64_t id);
bool ledger_charge(int gpu, uint64_t size);
/*
 * Whether an exported descriptor of any cuMemCreate memory is open anywhere on the node, before
 * an export of allocation id on gpu, which it records: the driver keeps one internal client for
 * the whole host's exports, built when their count leaves zero. Under ledger_lock().
 */
bool ledger_export_alive(int gpu, uint64_t id);
void ledger_uncharge(int gpu, uint64_t size);

/* fakecuda.c: every call but cuInit and the pure lookups starts with ready(); current() is the context made current. */
CUresult ready(void);
struct ctx *current(void);
/*
 * fakecuda_stream.c: whether a capture under way forbids this thread a potentially unsafe
 * call (invalidating it). Call locked.
 */
bool capture_forbids(void);
/* fakecuda_mem.c: whether [p, p + n) lies in [base, base + size). */
bool within(CUdeviceptr p, size_t n, CUdeviceptr base, size_t size);

#define NEED_CTX()                                              \
        do {                                                    \
                CUresult r_ = ready();                          \
                if (r_)                                         \
                        return r_;                              \
                if (!current())                                 \
                        return GP_CUDA_ERROR_INVALID_CONTEXT;   \
        } while (0)

/* Returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED from a potentially unsafe call made during a capture. */
#define NO_UNSAFE_CALL_IN_CAPTURE()                                             \
        do {                                                                    \
                bool forbidden_;                                                \
                pthread_mutex_lock(&lock);                                      \
                forbidden_ = capture_forbids();                                 \
                pthread_mutex_unlock(&lock);                                    \
                if (forbidden_)                                                 \
                        return GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;        \
        } while (0)

/* A size from the environment: a number with an optional K, M or G suffix; dflt when unset or empty. */
uint64_t parse_bytes(const char *s, uint64_t dflt);

/* fakecuda_mem.c: reads its knobs at cuInit, locked. */
void mem_init(void);
/* fakecuda_vmm.c: reads $FAKECUDA_VMM_COSTS. At cuInit, locked. */
void vmm_init(void);
/* Spends ns nanoseconds (asleep but for the last 100 us, spun), as a driver call that takes that long (never under the fake's lock). */
void fake_spend(uint64_t ns);
/* The same for a call that began at start (fake_now_ns()): its own work counts in the time it takes. */
void fake_spend_since(uint64_t start, uint64_t ns);
uint64_t fake_now_ns(void);
/*
 * The host bytes behind [p, p + n) (an allocation, or a mapping made accessible) in *ret, for
 * reading or (write) writing too. Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_VALUE (not device
 * memory this process can reach, or a write where only reading is allowed: refused at the
 * call, the context unharmed, as the driver refuses it). Takes lock.
 */
CUresult bytes_at(CUdeviceptr p, size_t n, bool write, uint8_t **ret);

/* The entry points of device memory, copies and IPC handles, for the entry-point table. */
CUresult fk_MemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult fk_MemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned element_size);
CUresult fk_MemFree_v2(CUdeviceptr dptr);
CUresult fk_MemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult fk_MemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
CUresult fk_MemAlloc_v1(unsigned *dptr, unsigned size);
CUresult fk_MemFree_v1(unsigned dptr);
CUresult fk_MemGetInfo_v1(unsigned *free_bytes, unsigned *total_bytes);
CUresult fk_MemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult fk_MemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult fk_IpcGetMemHandle(gp_cu_ipc_mem_handle *handle, CUdeviceptr dptr);
CUresult fk_IpcOpenMemHandle_v2(CUdeviceptr *dptr, gp_cu_ipc_mem_handle handle, unsigned flags);
CUresult fk_IpcCloseMemHandle(CUdeviceptr dptr);

/* fakecuda_stream.c: waits (spinning) until the legacy stream has run what was queued before, in its order. */
CUresult legacy_synchronize(void);

/* The entry points of streams, events and memsets, for the entry-point table. */
CUresult fk_CtxSynchronize(void);
CUresult fk_StreamCreate(gp_cu_stream *ret, unsigned flags);
CUresult fk_StreamDestroy_v2(gp_cu_stream hs);
CUresult fk_StreamSynchronize(gp_cu_stream hs);
CUresult fk_StreamGetId(gp_cu_stream hs, unsigned long long *id);
CUresult fk_StreamGetCtx(gp_cu_stream hs, gp_cu_context *ret);
CUresult fk_StreamBeginCapture(gp_cu_stream hs, int mode);
CUresult fk_StreamEndCapture(gp_cu_stream hs, void **graph);
CUresult fk_StreamIsCapturing(gp_cu_stream hs, int *status);
CUresult fk_ThreadExchangeStreamCaptureMode(int *mode);
CUresult fk_GraphDestroy(void *graph);
CUresult fk_EventCreate(gp_cu_event *ret, unsigned flags);
CUresult fk_EventRecord(gp_cu_event he, gp_cu_stream hs);
CUresult fk_EventQuery(gp_cu_event he);
CUresult fk_EventSynchronize(gp_cu_event he);
CUresult fk_EventDestroy_v2(gp_cu_event he);
CUresult fk_MemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n);
CUresult fk_MemsetD32_v2(CUdeviceptr p, unsigned v, size_t n);
CUresult fk_MemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, gp_cu_stream s);
CUresult fk_MemsetD32Async(CUdeviceptr p, unsigned v, size_t n, gp_cu_stream s);

/* fakecuda_vmm.c: the mappings of this process, and the host bytes behind device addresses mapped there. */
/* A physical allocation mapped into a reservation: the device address faults on the CPU; host reaches the bytes. */
struct vmap {
        struct gp_rb_node by_ptr;       /* in vmaps */
        CUdeviceptr ptr;
        size_t size;
        struct phys *phys;
        uint8_t *host;
        int access;                     /* CU_MEM_ACCESS_FLAGS_*: none until cuMemSetAccess */
};

/* This process's mappings by address (logarithmic lookups: the driver's take no longer with many). */
extern struct gp_rb_tree vmaps;
/*
 * The host bytes behind [p, p + n): mapped and accessible throughout, or NULL; *ret_read_only
 * set when some of it is mapped for reading only. Call locked.
 */
uint8_t *vmap_bytes(CUdeviceptr p, size_t n, bool *ret_read_only);

/* CU_MEM_HANDLE_TYPE_FABRIC and CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED (cuda.h). */
#define FK_MEM_HANDLE_TYPE_FABRIC 0x8
#define FK_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED 128

/* The entry points of virtual memory management, for the entry-point table. */
CUresult fk_MemGetAllocationGranularity(size_t *granularity, const gp_cu_mem_prop *prop, gp_cu_mem_granularity_flags option);
CUresult fk_MemCreate(gp_cu_mem_handle *handle, size_t size, const gp_cu_mem_prop *prop, unsigned long long flags);
CUresult fk_MemRelease(gp_cu_mem_handle handle);
CUresult fk_MemExportToShareableHandle(void *shareable, gp_cu_mem_handle handle, gp_cu_mem_handle_type type, unsigned long long flags);
CUresult fk_MemImportFromShareableHandle(gp_cu_mem_handle *handle, void *os_handle, gp_cu_mem_handle_type type);
CUresult fk_MemGetAllocationPropertiesFromHandle(gp_cu_mem_prop *prop, gp_cu_mem_handle handle);
CUresult fk_MemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult fk_MemAddressFree(CUdeviceptr ptr, size_t size);
CUresult fk_MemRetainAllocationHandle(gp_cu_mem_handle *handle, void *addr);
CUresult fk_PointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult fk_MemMap(CUdeviceptr ptr, size_t size, size_t offset, gp_cu_mem_handle handle, unsigned long long flags);
CUresult fk_MemUnmap(CUdeviceptr ptr, size_t size);
CUresult fk_MemSetAccess(CUdeviceptr ptr, size_t size, const gp_cu_mem_access_desc *desc, size_t count);
CUresult fk_MemGetAccess(unsigned long long *flags, const gp_cu_mem_location *location, CUdeviceptr ptr);

#endif
