/*
 * client_mem.h: the library's memory seam (client_mem.c), as daemon/backend.h is the daemon's:
 * how this process maps what a backend leases, and the GPU driver behind it. The layers above
 * say what to map and where; one table per backend says how, and a GPU backend's table points
 * at its vendor's driver table (devices, streams, events). Above it, code asks what a backend
 * can do, never its name: the stream layer and the public API whether its devices queue work
 * (driver: stream-ordered frees, fences), the objects whether it exports descriptors or IPC
 * handles (ipc), resume whether mappings outlive the daemon, the pool whether segments grow
 * (grows). Nothing above this seam includes a driver's header or names a driver's type: a
 * second vendor's backend (HIP's IPC and VMM calls mirror CUDA's) is one more memory table and
 * one driver file (as client_cuda.c is CUDA's) with its driver table.
 *
 *   host      a memfd per segment, mmap()ed; ranges are address space reserved PROT_NONE, a
 *             granule is parked at a spot of its own and mapped under blocks with mremap()
 *   cuda      a legacy IPC handle per segment, opened in the GPU's primary context; no ranges
 *   cuda-vmm  a descriptor of cuMemCreate memory per segment, imported and mapped in a range
 *             of the process's own (cuMemAddressReserve, cuMemMap, cuMemSetAccess)
 *
 * All called locked.
 */
#ifndef GP_CLIENT_MEM_H
#define GP_CLIENT_MEM_H

#include <stdbool.h>
#include <stdint.h>

#include "client_common.h"

/* An imported granule: cuda-vmm its CUmemGenericAllocationHandle, host its parking spot's address. */
typedef uint64_t client_mem_handle;

/*
 * A GPU vendor's driver as the library uses it: the process's devices matched to the daemon's,
 * their contexts, streams and events. d is the daemon's index of a device. Called locked, but
 * event_wait() (the reaper thread's) and thread_relaxed().
 */
/* What stream_id() and fence() ask the driver of a stream: whether it captures a graph, its id. */
#define CLIENT_ASK_CAPTURE 1u
#define CLIENT_ASK_ID 2u

struct client_driver_ops {
        /*
         * Loads the driver and matches the daemon's devices (hello's, by UUID) to this process's
         * (c->local_to_daemon); the driver's state starts afresh. Returns 0 or a negative errno
         * with the error set.
         */
        int (*setup)(gpupool_client *c, const Gpupool__HelloReply *hello);
        /* Whether a daemon's hello names the same devices, each the same GPU of this process, as setup's did. */
        bool (*same_devices)(gpupool_client *c, const Gpupool__HelloReply *hello);
        /*
         * What ask (CLIENT_ASK_*) says to ask the driver of stream: whether it is capturing a
         * graph, and its id (cuStreamGetId: a destroyed stream's handle may come back for
         * another stream, an id never), set in *ret. Returns 0; 1, with no id, when the stream
         * is capturing; or -EINVAL with the error set (not a stream of this process's device d).
         */
        int (*stream_id)(gpupool_client *c, unsigned d, void *stream, unsigned ask, unsigned long long *ret);
        /*
         * Records an event on stream after the work queued so far: one fence for the frees
         * queued on it before; first, as ask says, whether the stream captures and whether it
         * is still the stream of id. Returns 0; recording nothing, 1 when the stream is
         * capturing a graph, 2 when the handle is no longer that stream's; or a negative errno
         * with the error set.
         */
        int (*fence)(gpupool_client *c, unsigned d, void *stream, unsigned long long id, unsigned ask, client_event *ret);
        /* 1 when e has completed, 0 when not yet; with wait, waits asleep first. -EIO (error set): never taken for done. */
        int (*event_done)(gpupool_client *c, unsigned d, client_event e, bool wait);
        /* Keeps an event fence() made for reuse. Cannot fail. */
        void (*event_put)(gpupool_client *c, unsigned d, client_event e);
        /* Unlocked, the reaper's: waits asleep for e. 0 when it completed, -EIO when the driver failed. */
        int (*event_wait)(gpupool_client *c, unsigned d, client_event e);
        /* The calling thread (the reaper) may wait while the application captures a graph, for good. */
        void (*thread_relaxed)(gpupool_client *c);
        /* Waits for all of this process's work on the devices it used. 0, or -EIO with the error set. */
        int (*synchronize)(gpupool_client *c);
        /* Once every mapping is closed and the reaper stopped: the events, the contexts, the state. Idempotent. */
        void (*teardown)(gpupool_client *c);
};

struct client_mem_ops {
        const char *backend;            /* as the daemon names it in hello */
        const char *memory;             /* what the application is told it holds: "memory", "cuda-vmm memory" */
        /* A GPU's: its devices queue work (ordinals by UUID, stream-ordered frees, fences); NULL: host memory. */
        const struct client_driver_ops *driver;
        bool ipc;                       /* segments come as IPC handles (one open per process), not descriptors */
        bool outlives_daemon;           /* what the process maps lives while it maps it, daemon or not */
        bool grows;                     /* ranges and granules: segments may grow in place (the calls below) */
        bool parks;                     /* an imported granule takes a parking spot in the device's reservation */

        /*
         * A whole segment: maps what the daemon handed over (m->size bytes of device m->device),
         * fd (still the caller's) or m->handle, and sets m->base. Returns 0 or a negative errno
         * with the error set.
         */
        int (*segment_map)(gpupool_client *c, struct mapping *m, int fd);
        void (*segment_unmap)(gpupool_client *c, struct mapping *m);

        /* The rest where grows only. Reserves bytes of device d's address space aligned to align, at *ret. */
        int (*reserve)(gpupool_client *c, unsigned d, uint64_t bytes, uint64_t align, uint8_t **ret);
        /* Frees a reservation (nothing may be mapped in it). */
        void (*unreserve)(gpupool_client *c, unsigned d, uint8_t *base, uint64_t bytes);
        /* Imports descriptor fd (still the caller's) of size bytes, at park where parks. */
        int (*import)(gpupool_client *c, unsigned d, int fd, uint64_t size, uint8_t *park, client_mem_handle *ret);
        /* Lets go of an imported granule: its memory goes once nothing maps it either. */
        void (*release)(gpupool_client *c, unsigned d, client_mem_handle h, uint64_t size);
        /*
         * Maps h at va (size bytes), not accessible until access() makes it readable and
         * writable: mappings side by side are made so in one call. fd is the descriptor the
         * granule came with where the process keeps it (host), else -1.
         */
        int (*map)(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size, client_mem_handle h, int fd);
        int (*access)(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size);
        /* Unmaps what map() mapped, the reservation kept. Returns 0, or -EIO when refused (then va stays taken). */
        int (*unmap)(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size);

        /*
         * Named objects (client_objects.c); NULL where the backend has none. Zeroes n bytes at p
         * of device d, written when it returns, with the device's work queued before it ended.
         */
        int (*zero)(gpupool_client *c, unsigned d, uint8_t *p, uint64_t n);
        /* Makes whole segment m's mapping read-only or (writable) writable again, in place. */
        int (*protect)(gpupool_client *c, struct mapping *m, bool writable);
        /*
         * Maps an object's segment of size bytes of device d, read-only where the backend can
         * (not cuda: an IPC handle opens read-write), at *ret: fd (still the caller's), or
         * where segments come as IPC handles, ipc_handle (GP_IPC_HANDLE_BYTES).
         */
        int (*map_read)(gpupool_client *c, unsigned d, int fd, const uint8_t *ipc_handle, uint64_t size, uint8_t **ret);
        /* Unmaps what map_read() mapped, or a segment's mapping protect() made read-only. */
        void (*unmap_read)(gpupool_client *c, unsigned d, uint8_t *base, uint64_t size);
        /*
         * A daemon after this one adopts what the process holds by the process's word
         * (AdoptRequest.held), and the process keeps no descriptor per segment (cuda-vmm: the
         * driver exports no imported memory, as an H200 showed, so there is none to hand over).
         * Else (host) the descriptor a segment came with, the memory itself, is kept and handed
         * over (client_keep.c).
         */
        bool adopted_held;
};

extern const struct client_mem_ops client_mem_host, client_mem_cuda, client_mem_vmm;

/*
 * Whether what the process leases outlives the daemon: host and cuda-vmm memory lives while
 * this process maps it, daemon or not (a memfd's pages, the driver's rule for a cuMemCreate
 * allocation), and a daemon that lives on with the connection broken keeps it this process's
 * until it exits (its pidfd): the pool goes on serving it, and a daemon after it adopts it. On
 * the cuda backend it lived in the daemon's context.
 */
static inline bool client_memory_outlives_daemon(const gpupool_client *c) {
        return __atomic_load_n(&c->mem, __ATOMIC_ACQUIRE)->outlives_daemon;
}

/* Whether what the process leases went with the daemon. */
static inline bool client_memory_lost(gpupool_client *c) {
        return !client_memory_outlives_daemon(c) && client_daemon_gone(c);
}

/* The table for a backend as hello names it, or NULL for one this library does not know. */
const struct client_mem_ops *client_mem_of(const char *backend);

#endif
