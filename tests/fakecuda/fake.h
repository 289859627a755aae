/*
 * fake.h: what the fake driver's files share (fakecuda.c, fakecuda_vmm.c): its lock and
 * devices, the node's ledger, the checks every entry point starts with, and the virtual
 * memory management entry points the entry-point table names. Not an interface of the
 * library: every name here is hidden; only EXPORT'ed ones leave libfakecuda.so.
 */
#ifndef GP_FAKE_H
#define GP_FAKE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadrv.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 8

typedef gp_cu_result CUresult;
typedef gp_cu_deviceptr CUdeviceptr;

struct ctx;
struct phys;

/* fakecuda.c: the process's driver state, guarded by lock. */
extern pthread_mutex_t lock;
extern int gpus;                        /* physical GPUs */
extern int visible[MAX_GPUS], nvisible; /* ordinal -> physical */
extern bool vmm_off;                    /* $FAKECUDA_VMM=0: GPUs without VMM or descriptor handles */
extern unsigned long long set_access_calls;     /* cuMemSetAccess calls (test hook) */

/* Says what broke in the fake itself, and aborts. */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Where "device memory" files are: $FAKECUDA_DIR, else /dev/shm. */
const char *mem_dir(void);

/* The node's ledger (fakecuda.c): under ledger_lock(), whether size more fits on gpu, and charging cuMemCreate memory. */
void ledger_lock(void);
void ledger_unlock(void);
bool ledger_fits(int gpu, uint64_t size);
void ledger_vmm_charge(int gpu, uint64_t size);
/* Frees cuMemCreate memory at path if no process holds it any more; whether it did. Under ledger_lock(). */
bool vmm_free_if_unheld(const char *path, int gpu, uint64_t size);

/* Every call but cuInit and the pure lookups starts with ready(); current() is the context made current. */
CUresult ready(void);
struct ctx *current(void);
/* Whether a capture under way forbids this thread a potentially unsafe call (invalidating it). Call locked. */
bool capture_forbids(void);
/* Whether [p, p + n) lies in [base, base + size). */
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

/* fakecuda_vmm.c: the mappings of this process, and the host bytes behind device addresses mapped there. */
/* A physical allocation mapped into a reservation: the device address faults on the CPU; host reaches the bytes. */
struct vmap {
        struct vmap *next;
        CUdeviceptr ptr;
        size_t size;
        struct phys *phys;
        uint8_t *host;
        int access;                     /* CU_MEM_ACCESS_FLAGS_*: none until cuMemSetAccess */
};

extern struct vmap *vmaps;
/* The host bytes behind [p, p + n): mapped and accessible throughout, or NULL. Call locked. */
uint8_t *vmap_bytes(CUdeviceptr p, size_t n);

/* The entry points of virtual memory management, for the entry-point table. */
CUresult fk_MemGetAllocationGranularity(size_t *granularity, const gp_cu_mem_prop *prop, gp_cu_mem_granularity_flags option);
CUresult fk_MemCreate(gp_cu_mem_handle *handle, size_t size, const gp_cu_mem_prop *prop, unsigned long long flags);
CUresult fk_MemRelease(gp_cu_mem_handle handle);
CUresult fk_MemExportToShareableHandle(void *shareable, gp_cu_mem_handle handle, gp_cu_mem_handle_type type, unsigned long long flags);
CUresult fk_MemImportFromShareableHandle(gp_cu_mem_handle *handle, void *os_handle, gp_cu_mem_handle_type type);
CUresult fk_MemGetAllocationPropertiesFromHandle(gp_cu_mem_prop *prop, gp_cu_mem_handle handle);
CUresult fk_MemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult fk_MemAddressFree(CUdeviceptr ptr, size_t size);
CUresult fk_MemMap(CUdeviceptr ptr, size_t size, size_t offset, gp_cu_mem_handle handle, unsigned long long flags);
CUresult fk_MemUnmap(CUdeviceptr ptr, size_t size);
CUresult fk_MemSetAccess(CUdeviceptr ptr, size_t size, const gp_cu_mem_access_desc *desc, size_t count);

#endif
