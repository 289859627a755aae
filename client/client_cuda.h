/*
 * client_cuda.h: libgpupool's side of the CUDA driver (client_cuda.c), the lowest layer, below
 * the memory seam: client_mem.c's cuda and cuda-vmm tables call it, and point at its driver
 * table. Nothing above the seam includes this header. d is the daemon's index of a device.
 * All called locked.
 */
#ifndef GP_CLIENT_CUDA_H
#define GP_CLIENT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"
#include "client_mem.h"
#include "cudadrv.h"

/* CUDA's devices, contexts, streams and events, for the layers above the seam (client_mem.h). */
extern const struct client_driver_ops client_driver_cuda;

/* Opens a segment's IPC handle (m->handle) in its device's primary context; sets m->base. */
int client_cuda_open(gpupool_client *c, struct mapping *m);

/* Closes what client_cuda_open() opened. */
void client_cuda_close(gpupool_client *c, struct mapping *m);

/*
 * cuda-vmm's calls (client_mem.c maps segments and granules with them). Each makes d's context
 * current for its call. Reserves bytes of d's address space aligned to align, at *ret.
 * Returns 0 or a negative errno with the error set.
 */
int client_cuda_reserve(gpupool_client *c, unsigned d, uint64_t bytes, uint64_t align, uint8_t **ret);
/* Frees what client_cuda_reserve() reserved (nothing may be mapped in it). */
void client_cuda_unreserve(gpupool_client *c, unsigned d, uint8_t *base, uint64_t bytes);
/* Imports the descriptor fd (still the caller's) of size bytes as a handle of its memory. Returns 0 or a negative errno, the error set. */
int client_cuda_import(gpupool_client *c, unsigned d, int fd, uint64_t size, gp_cu_mem_handle *ret);
/* Lets go of an imported handle: the memory goes once nothing maps it either. */
void client_cuda_release(gpupool_client *c, unsigned d, gp_cu_mem_handle h);
/*
 * Maps handle h at va (size bytes), not usable yet; and access to [va, va + size), mappings
 * side by side (one call for all): readable and writable, or (!writable) readable only.
 */
int client_cuda_map(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size, gp_cu_mem_handle h);
int client_cuda_access(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size, bool writable);
/*
 * Zeroes [p, p + n) and waits for d's work queued before it, the application's included, to
 * end (cuCtxSynchronize). Returns 0 or -EIO with the error set.
 */
int client_cuda_zero(gpupool_client *c, unsigned d, uint8_t *p, uint64_t n);
/* Unmaps what client_cuda_map() mapped; the handle stays. Returns 0, or -EIO when the driver refused. */
int client_cuda_unmap(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size);

#endif
