/*
 * client_mem.h: the library's memory seam (client_mem.c), as daemon/backend.h is the daemon's:
 * how this process maps what a backend leases. The layers above say what to map and where;
 * one table per backend says how. Above it, code asks what a backend can do, never its name:
 * the stream layer and the public API whether its devices are CUDA's (streams: stream-ordered
 * frees, events), the objects whether it exports descriptors or IPC handles (ipc), resume
 * whether mappings outlive the daemon, the pool whether segments grow (grows).
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

struct client_mem_ops {
        const char *backend;            /* as the daemon names it in hello */
        const char *memory;             /* what the application is told it holds: "memory", "cuda-vmm memory" */
        bool streams;                   /* CUDA devices: ordinals by UUID, stream-ordered frees, work to wait for */
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
         * where segments come as IPC handles, ipc_handle (GP_CU_IPC_HANDLE_SIZE bytes).
         */
        int (*map_read)(gpupool_client *c, unsigned d, int fd, const uint8_t *ipc_handle, uint64_t size, uint8_t **ret);
        /* Unmaps what map_read() mapped, or a segment's mapping protect() made read-only. */
        void (*unmap_read)(gpupool_client *c, unsigned d, uint8_t *base, uint64_t size);
        /*
         * A descriptor of the memory of device d mapped at base (a whole segment), or (base NULL)
         * of granule h, for a daemon after this one to adopt; made now, the caller's to close.
         * Returns it or a negative errno with the error set. NULL where segments come as
         * descriptors that are the memory itself (host): the one a segment came with is kept
         * instead (client_keep.c). With it (cuda-vmm) the process keeps none per segment.
         */
        int (*export)(gpupool_client *c, unsigned d, uint8_t *base, client_mem_handle h);
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
