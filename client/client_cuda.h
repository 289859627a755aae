/*
 * client_cuda.h: libgpupool's side of the cuda backend (client_cuda.c), the lowest layer. All
 * called locked.
 */
#ifndef GP_CLIENT_CUDA_H
#define GP_CLIENT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/* Loads the driver and matches the daemon's GPUs (hello's devices) to this process's by UUID. */
int client_cuda_setup(gpupool_client *c, const Gpupool__HelloReply *hello);

/* Opens a segment's IPC handle (m->handle) in d's primary context; sets m->base. */
int client_cuda_open(gpupool_client *c, struct client_device *d, struct mapping *m);

/* Closes what client_cuda_open() opened. */
void client_cuda_close(gpupool_client *c, struct client_device *d, struct mapping *m);

/* Whether a daemon's hello names the same devices, each the same GPU of this process, as the session's did. */
bool client_cuda_same_devices(gpupool_client *c, const Gpupool__HelloReply *hello);

/*
 * cuda-vmm's calls (client_mem.c maps segments and granules with them). Each makes d's context
 * current for its call. Reserves bytes of d's address space aligned to align, at *ret.
 * Returns 0 or a negative errno with the error set.
 */
int client_cuda_reserve(gpupool_client *c, struct client_device *d, uint64_t bytes, uint64_t align, uint8_t **ret);
/* Frees what client_cuda_reserve() reserved (nothing may be mapped in it). */
void client_cuda_unreserve(gpupool_client *c, struct client_device *d, uint8_t *base, uint64_t bytes);
/* Imports the descriptor fd (still the caller's) of size bytes as a handle of its memory. Returns 0 or a negative errno, the error set. */
int client_cuda_import(gpupool_client *c, struct client_device *d, int fd, uint64_t size, gp_cu_mem_handle *ret);
/* Lets go of an imported handle: the memory goes once nothing maps it either. */
void client_cuda_release(gpupool_client *c, struct client_device *d, gp_cu_mem_handle h);
/*
 * cuda-vmm: a descriptor of the memory mapped at va (a whole segment, whose handle was let go:
 * cuMemRetainAllocationHandle), or where va is NULL of handle h, exported now for a daemon
 * after this one to adopt; the caller closes *ret_fd. Returns 0 or a negative errno, the error set.
 */
int client_cuda_export(gpupool_client *c, struct client_device *d, uint8_t *va, gp_cu_mem_handle h, int *ret_fd);
/*
 * Maps handle h at va (size bytes), not usable yet; and access to [va, va + size), mappings
 * side by side (one call for all): readable and writable, or (!writable) readable only.
 */
int client_cuda_map(gpupool_client *c, struct client_device *d, uint8_t *va, uint64_t size, gp_cu_mem_handle h);
int client_cuda_access(gpupool_client *c, struct client_device *d, uint8_t *va, uint64_t size, bool writable);
/*
 * Zeroes [p, p + n) and waits for d's work queued before it, the application's included, to
 * end (cuCtxSynchronize). Returns 0 or -EIO with the error set.
 */
int client_cuda_zero(gpupool_client *c, struct client_device *d, uint8_t *p, uint64_t n);
/* Unmaps what client_cuda_map() mapped; the handle stays. Returns 0, or -EIO when the driver refused. */
int client_cuda_unmap(gpupool_client *c, struct client_device *d, uint8_t *va, uint64_t size);

/*
 * The driver's id of stream (cuStreamGetId) in d's primary context. Returns 0; 1, with no
 * id, when the stream is capturing a CUDA graph; or -EINVAL with the error set.
 */
int client_cuda_stream_id(gpupool_client *c, struct client_device *d, void *stream, unsigned long long *ret);

/*
 * Records an event on stream (of id, as cuStreamGetId named it) in d's primary context after the
 * work queued so far: one fence for the frees queued on it before. Returns 0; recording
 * nothing, 1 when the stream is capturing a graph, 2 when the handle is no longer that stream's
 * (it was destroyed, or its handle came back for another); or a negative errno with the error set.
 */
int client_cuda_fence(gpupool_client *c, struct client_device *d, void *stream, unsigned long long id, gp_cu_event *ret);

/*
 * 1 when event e of d has completed, 0 when not yet; with wait, waits for it first, asleep.
 * -EIO, with the error set, when the driver fails: never taken for done.
 */
int client_cuda_event_done(gpupool_client *c, struct client_device *d, gp_cu_event e, bool wait);

/* Keeps an event of d for reuse (one client_cuda_fence() made). Cannot fail. */
void client_cuda_event_put(gpupool_client *c, struct client_device *d, gp_cu_event e);

/* Unlocked, for the reaper thread: waits asleep for e. 0 when it completed, -EIO when the driver failed. */
int client_cuda_event_wait(gpupool_client *c, struct client_device *d, gp_cu_event e);

/* Puts the calling thread (the reaper) in CU_STREAM_CAPTURE_MODE_RELAXED for good. */
void client_cuda_thread_relaxed(gpupool_client *c);

/*
 * Waits for every piece of work of this process on the GPUs it used (cuCtxSynchronize in each
 * primary context). Returns 0, or -EIO with the error set when the driver failed.
 */
int client_cuda_synchronize(gpupool_client *c);

/* Once every mapping is closed and the reaper stopped: destroys the events and releases the contexts. */
void client_cuda_teardown(gpupool_client *c);

#endif
