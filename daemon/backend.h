/*
 * backend.h: the seam between the pool and the memory it hands out.
 *
 * A backend owns devices and makes, zeroes and destroys segments of memory on them; the pool
 * never touches memory itself. "host" makes memfd segments exported as file descriptors;
 * "cuda" makes cuMemAlloc_v2 segments exported as 64-byte IPC handles; "cuda-vmm" makes
 * cuMemCreate allocations exported as file descriptors (backend_cuda_vmm.c). Tests plug in a
 * counting backend of their own, and a fault-injecting wrapper (backend_fault.c).
 */
#ifndef GP_BACKEND_H
#define GP_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define BACKEND_MAX_DEVICES 64

/* One segment of backend memory, as the backend made it. */
struct backend_mem {
        int fd;                 /* host: the memfd, the memory itself; -1 otherwise (cuda-vmm keeps no descriptor) */
        uint64_t addr;          /* cuda: device pointer (cuda-vmm: the daemon's own range, mapped where vmm_mapped); 0 otherwise */
        bool vmm_mapped;        /* cuda-vmm: the daemon has mapped the memory at addr (to name, zero or seal it) */
        uint64_t vmm_handle;    /* cuda-vmm: the physical allocation (CUmemGenericAllocationHandle) */
        uint64_t ident;         /* cuda-vmm: the driver's name for the allocation (mem_ident), 0: none */
        uint8_t ipc_handle[GP_IPC_HANDLE_BYTES];        /* cuda: exported handle */
        size_t ipc_handle_len;  /* 0 when the backend exports a file descriptor */
        void *zeroing;          /* cuda: the event a zeroing under way will complete, or NULL */
        /* cuda-vmm: a descriptor exported ahead (mem_export_ahead), which the next mem_export hands over */
        bool exported_ahead;
        int export_fd;          /* while exported_ahead */
        /*
         * Memory a process holds that the daemon was not handed (AdoptRequest.held, where the
         * backend adopts_held): none of the above is set, and there is nothing to destroy.
         */
        bool held;
};

struct backend_device_info {
        uint64_t total_bytes;   /* what the pool may reserve on this device */
        uint8_t uuid[16];
        int has_uuid;
        bool mig;               /* a MIG instance: its UUID is written "MIG-…", not "GPU-…" */
};

/* A device's memory as the driver sees it now, every process on the node counted. */
struct backend_device_memory {
        uint64_t free_bytes;            /* free on the device now */
        uint64_t total_bytes;           /* the device's memory */
        uint64_t headroom_bytes;        /* what the pool leaves free: others' contexts, libraries, programs */
};

/* "GPU-" or "MIG-", then the UUID in 8-4-4-4-12 hex, as nvidia-smi -L writes it; and its NUL. */
#define BACKEND_UUID_TEXT_MAX 41

/* Writes a device's UUID as nvidia-smi -L does (the device has one: has_uuid). */
void backend_uuid_text(const uint8_t uuid[16], bool mig, char buf[BACKEND_UUID_TEXT_MAX]);

struct backend;

struct backend_ops {
        /* Describes one device. Returns 0 or a negative errno. */
        int (*device_info)(struct backend *b, unsigned device, struct backend_device_info *ret);
        /* Makes a segment of size bytes. Returns 0, -ENOMEM when the device is full, or another negative errno. */
        int (*mem_create)(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret);
        /* Gives a segment back. Cannot fail from the pool's point of view; errors are the backend's to log. */
        void (*mem_destroy)(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size);
        /*
         * Zeroes a segment before it changes uid; where clients hold its memory by a descriptor
         * they may keep (host, cuda-vmm), gives it fresh memory instead, so that what the next
         * owner writes never shows in the old. Returns 0 when it is zero already, 1 when the
         * zeroing runs on the device (mem_zero_done says when it has ended; never waited for in
         * the daemon's loop), or a negative errno.
         */
        int (*mem_zero)(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size);
        /* After mem_zero returned 1: 1 once the segment is zero, 0 while not yet, a negative errno if it failed. */
        int (*mem_zero_done)(struct backend *b, unsigned device, struct backend_mem *mem);
        /*
         * Optional (NULL: the backend cannot tell, and only the capacity bounds the pool): the
         * device's memory now, every process counted. Returns 0 or a negative errno.
         */
        int (*device_memory)(struct backend *b, unsigned device, struct backend_device_memory *ret);
        /* Frees the backend. Every segment has been destroyed by then. */
        void (*close)(struct backend *b);
        /*
         * Optional (NULL: the backend cannot adopt memory): makes *ret of fd, which a client
         * says is a segment of size bytes that a daemon before this one leased it, after
         * checking that it is one; on success *ret owns fd where ret->fd is fd (host: the
         * memfd is the memory), else fd is still the caller's to close (cuda-vmm: the memory
         * imported, the descriptor not kept). sealed: a named object's segment that daemon
         * sealed (mem_seal), kept in systemd's store, sealed again here. Returns 0, or a
         * negative errno with what fd is instead in why (-EINVAL: not a segment of that
         * size), fd still the caller's.
         */
        int (*mem_adopt)(struct backend *b, unsigned device, int fd, uint64_t size, bool sealed, struct backend_mem *ret,
                         char *why, size_t why_size);
        /*
         * Optional: a number naming a segment's memory, the same for every descriptor the
         * backend can tell is of it (host: any, by the memfd's inode; cuda-vmm: any, where the
         * driver names allocations: cuda_vmm_identify()) and no other memory's while the
         * segment lives; 0 when it has none. The pool adopts no memory it holds already by it.
         */
        uint64_t (*mem_ident)(struct backend *b, unsigned device, const struct backend_mem *mem);
        /*
         * Optional (NULL: the backend cannot make memory immutable, and has no named objects):
         * makes a segment of size bytes immutable for good, for a named object, before anyone
         * else maps it: host seals its memfd against writing; cuda-vmm, whose driver has no
         * seal, makes its own mapping read-only, and read-only is then the library's mapping
         * (see reopens_read_only). Returns 0, -EBUSY while a writable mapping of it exists, or
         * another negative errno. The segment is destroyed, never reused, once the object goes.
         */
        int (*mem_seal)(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size);
        /*
         * Optional (NULL: segments go as IPC handles, not descriptors): a descriptor of a
         * segment's memory to pass to a client or systemd's store, the caller's to close once
         * sent (host: the memfd again, or with read_only opened anew for reading only;
         * cuda-vmm: a new export, so that the daemon holds no descriptor per segment). Returns
         * it, or a negative errno.
         */
        int (*mem_export)(struct backend *b, unsigned device, struct backend_mem *mem, bool read_only);
        /*
         * Optional: exports the segment's descriptor now, off a request's path (the granule
         * stock's, as it is made), and keeps it for the next mem_export, which hands it over;
         * at most most held per device (backend_exports_ahead()), let go with the memory.
         * Returns 0 (or 0 with none made, where the segment has nothing to export), -ENOSPC at
         * that most, or another negative errno, nothing held.
         */
        int (*mem_export_ahead)(struct backend *b, unsigned device, struct backend_mem *mem, unsigned most);
};

/* The most descriptors a backend holds ahead per device, whatever --granule-stock says (the fd limit counts them). */
#define BACKEND_EXPORTS_AHEAD_MAX 128

struct backend {
        const struct backend_ops *ops;
        const char *name;       /* "host", "cuda", "cuda-vmm": shown by status */
        unsigned device_count;
        void *data;
        uint64_t faults_injected;       /* by the test-only fault wrapper; 0 otherwise */
        bool ipc_handles;               /* exports legacy CUDA IPC handles, which need the daemon's PID namespace */
        /*
         * Its descriptors are files the kernel opens anew for reading only (host: a memfd through
         * /proc), so that a named object's attacher can map it no other way.
         */
        bool reopens_read_only;
        /*
         * Its mem_seal may wait on what a client controls (host: the kernel waits, up to about
         * 150 ms, for pages pinned by vmsplice(2) or io_uring before it refuses): the daemon
         * calls it off its loop, on a copy of the segment's mem with a descriptor of its own.
         */
        bool seal_waits;
        uint64_t fd_bytes;              /* memory it keeps as a descriptor per segment (host): the fd limit's */
        /*
         * Memory it adopts was not free when it read its capacity (cuda-vmm: the GPU's free
         * memory at start, which leaves out what clients of a daemon before it still hold), so
         * adopting a segment makes the device's capacity as much larger (node_adopted()).
         */
        bool adopt_grows;
        /*
         * What it adopts it cannot pass on (cuda-vmm: the driver exports no imported memory, as
         * an H200 showed), and a process cannot hand it the memory it holds either (the
         * process's is imported too): a process has it adopt segments by its word, with no
         * descriptor (AdoptRequest.held: mem.held), counted as the process's like any other;
         * and every adopted segment goes back to the backend when released, never to the cache.
         */
        bool adopts_held;
        const char *no_adopt_why;       /* where mem_adopt is NULL: why, told to a client that asks */
};

/*
 * How many descriptors b holds ahead per device with a granule stock of granule_stock: one per
 * granule of it, at most BACKEND_EXPORTS_AHEAD_MAX; 0 where it exports none ahead. The fd
 * limit counts them (server_fit_fd_limit()), and the stock holds them to it (pool_stock()).
 */
static inline unsigned backend_exports_ahead(const struct backend *b, unsigned granule_stock) {
        if (!b->ops->mem_export_ahead)
                return 0;
        return granule_stock < BACKEND_EXPORTS_AHEAD_MAX ? granule_stock : BACKEND_EXPORTS_AHEAD_MAX;
}

/* The host backend: one device of capacity_bytes of memfd memory. Returns 0 or a negative errno. */
int backend_host_open(uint64_t capacity_bytes, struct backend **ret);

/*
 * The cuda backend: every GPU of the node, each of its total memory less headroom_bytes; with
 * vmm, the cuda-vmm backend (segments of cuMemCreate memory exported as file descriptors),
 * which every GPU must support. Returns 0, or a negative errno with a sentence in err: -ENOENT
 * no driver, -ENODEV no GPU, -ENOSYS a driver too old, -ENOTSUP a GPU without virtual memory
 * management or descriptor handles (vmm), -EIO or -EINVAL otherwise. With vmm and keep_export,
 * one export per GPU stays open for the backend's life (export_keepalive, gpupoold.conf(5)).
 */
int backend_cuda_open(uint64_t headroom_bytes, bool vmm, bool keep_export, struct backend **ret, char *err,
                      size_t err_size);

/*
 * TEST ONLY: wraps inner (taken over) so that segment creations, exports and zeroings fail at
 * the rates spec gives ("create=0.05,export=0.02,zero=0.1,seed=7"). Returns 0, or -EINVAL
 * with a sentence in err (inner is then still the caller's).
 */
int backend_fault_wrap(struct backend *inner, const char *spec, struct backend **ret, char *err, size_t err_size);

#endif
