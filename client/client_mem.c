/*
 * client_mem.c: the library's memory seam, one table per backend (client_mem.h). The host
 * backend's calls are here; the CUDA ones go to the driver through client_cuda.c.
 */
#define _GNU_SOURCE
#include "client_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_cuda.h"
#include "client_keep.h"
#include "granule.h"

/* host: a memfd per segment, mapped shared. */
static int host_segment_map(gpupool_client *c, struct mapping *m, int fd) {
        void *base;

        if (!client_fd_is_memory(fd, m->size)) {
                client_set_error(c, "gpupoold sent a segment that is not %llu bytes of memory", (unsigned long long) m->size);
                return -EPROTO;
        }
        base = client_fd_map(fd, m->size, NULL, PROT_READ | PROT_WRITE);
        if (base == MAP_FAILED) {
                client_set_error(c, "cannot map the segment into this process");
                return -ENOMEM;
        }
        m->base = base;
        return 0;
}

static void host_segment_unmap(gpupool_client *c, struct mapping *m) {
        (void) c;
        (void) munmap(m->base, m->size);
}

/* Address space only, never backed by itself, aligned to align (a power of two). */
static int host_reserve(gpupool_client *c, unsigned d, uint64_t bytes, uint64_t align, uint8_t **ret) {
        uint8_t *p;
        uintptr_t aligned;

        if (!align)
                align = 1;
        p = mmap(NULL, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
                client_set_error(c, "cannot reserve %llu bytes of address space for device %u: %m", (unsigned long long) bytes, d);
                return -ENOMEM;
        }
        /* The rest given back. */
        aligned = ((uintptr_t) p + align - 1) & ~(uintptr_t) (align - 1);
        if (aligned > (uintptr_t) p)
                (void) munmap(p, aligned - (uintptr_t) p);
        (void) munmap((uint8_t *) aligned + bytes, (uintptr_t) p + align - aligned);
        /* A forked child must not keep this memory: it may be another client's tomorrow. */
        (void) madvise((void *) aligned, bytes, MADV_DONTFORK);
        *ret = (uint8_t *) aligned;
        return 0;
}

static void host_unreserve(gpupool_client *c, unsigned d, uint8_t *base, uint64_t bytes) {
        (void) c, (void) d;
        (void) munmap(base, bytes);
}

/* Puts the reservation back over [at, at + size), in one step, so that no hole opens. */
static void reserve_again(uint8_t *at, uint64_t size) {
        if (mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
                (void) munmap(at, size);
}

/* A granule's memfd, mapped once at its parking spot, which keeps the pages until it is released. */
static int host_import(gpupool_client *c, unsigned d, int fd, uint64_t size, uint8_t *park, client_mem_handle *ret) {
        void *at;

        if (!client_fd_is_memory(fd, size)) {
                client_set_error(c, "gpupoold sent a granule of device %u that is not 2 MiB of memory", d);
                return -EPROTO;
        }
        at = client_fd_map(fd, size, park, PROT_READ | PROT_WRITE);
        if (at == MAP_FAILED) {
                reserve_again(park, size);
                client_set_error(c, "cannot map a granule of device %u into this process: %m", d);
                return -ENOMEM;
        }
        *ret = (client_mem_handle) (uintptr_t) at;
        return 0;
}

static void host_release(gpupool_client *c, unsigned d, client_mem_handle h, uint64_t size) {
        (void) c, (void) d;
        reserve_again((uint8_t *) (uintptr_t) h, size);
}

/*
 * A second mapping of the parked pages, over the reservation: mremap() of a shared mapping with
 * an old size of 0, which needs no descriptor; where that is refused (EINVAL: valgrind, which
 * does not emulate it), the memfd kept for the granule mapped again at va.
 */
static int host_map(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size, client_mem_handle h, int fd) {
        if (mremap((void *) (uintptr_t) h, 0, size, MREMAP_MAYMOVE | MREMAP_FIXED, va) == MAP_FAILED &&
            (errno != EINVAL || fd < 0 || client_fd_map(fd, size, va, PROT_READ | PROT_WRITE) == MAP_FAILED)) {
                client_set_error(c, "cannot map a granule of device %u into this process: %m", d);
                return -ENOMEM;
        }
        return 0;
}

static int host_access(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size) {
        (void) c, (void) d, (void) va, (void) size;
        return 0;       /* mapped readable and writable */
}

static int host_unmap(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size) {
        (void) c, (void) d;
        reserve_again(va, size);        /* the parked mapping keeps the pages */
        return 0;
}

static int host_zero(gpupool_client *c, unsigned d, uint8_t *p, uint64_t n) {
        (void) c, (void) d;
        memset(p, 0, n);
        return 0;
}

/*
 * Maps m's segment again in place from its kept descriptor: writable, or read-only from a
 * descriptor opened anew for reading only (a mapping the kernel will not let become writable,
 * and not a writable one, which a seal against writing needs).
 */
static int host_protect(gpupool_client *c, struct mapping *m, bool writable) {
        char path[64];
        int fd = m->fd, err = 0;

        if (fd < 0) {
                client_set_error(c, "this process kept no descriptor of the segment (past its descriptor limit): it "
                                    "cannot map it again read-only");
                return -EINVAL;
        }
        if (!writable) {
                snprintf(path, sizeof(path), "/proc/self/fd/%d", m->fd);
                if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
                        err = -errno;
        }
        if (err == 0 && client_fd_map(fd, m->size, m->base, writable ? PROT_READ | PROT_WRITE : PROT_READ) == MAP_FAILED)
                err = -errno;
        if (!writable && fd >= 0)
                close(fd);
        if (err < 0)
                client_set_error(c, "cannot map the segment again %s: %s", writable ? "writable" : "read-only", strerror(-err));
        return err;
}

static int host_map_read(gpupool_client *c, unsigned d, int fd, const uint8_t *ipc_handle, uint64_t size, uint8_t **ret) {
        void *base;

        (void) ipc_handle;
        if (!client_fd_is_memory(fd, size)) {
                client_set_error(c, "gpupoold sent an object of device %u that is not %llu bytes of memory", d,
                                 (unsigned long long) size);
                return -EPROTO;
        }
        /* Kept from forked children too: a child detaches nothing when it exits. */
        base = client_fd_map(fd, size, NULL, PROT_READ);
        if (base == MAP_FAILED) {
                client_set_error(c, "cannot map an object of %llu bytes into this process: %m", (unsigned long long) size);
                return -ENOMEM;
        }
        *ret = base;
        return 0;
}

static void host_unmap_read(gpupool_client *c, unsigned d, uint8_t *base, uint64_t size) {
        (void) c, (void) d;
        (void) munmap(base, size);
}

const struct client_mem_ops client_mem_host = {
        .backend = "host",
        .memory = "memory",
        .outlives_daemon = true,
        .grows = true,
        .parks = true,
        .segment_map = host_segment_map,
        .segment_unmap = host_segment_unmap,
        .reserve = host_reserve,
        .unreserve = host_unreserve,
        .import = host_import,
        .release = host_release,
        .map = host_map,
        .access = host_access,
        .unmap = host_unmap,
        .zero = host_zero,
        .protect = host_protect,
        .map_read = host_map_read,
        .unmap_read = host_unmap_read,
};

/* cuda: the segment's IPC handle (m->handle), opened in the device's primary context. */
static int ipc_segment_map(gpupool_client *c, struct mapping *m, int fd) {
        (void) fd;
        return client_cuda_open(c, m);
}

static void ipc_segment_unmap(gpupool_client *c, struct mapping *m) {
        client_cuda_close(c, m);
}

/* Zeroes on the device, as cuda-vmm does (client_cuda.c). */
static int cuda_zero(gpupool_client *c, unsigned d, uint8_t *p, uint64_t n) {
        return client_cuda_zero(c, d, p, n);
}

/* An IPC handle opens read-write, whatever one asks: a named object stays as it is. */
static int ipc_protect(gpupool_client *c, struct mapping *m, bool writable) {
        (void) c, (void) m, (void) writable;
        return 0;
}

static int ipc_map_read(gpupool_client *c, unsigned d, int fd, const uint8_t *ipc_handle, uint64_t size, uint8_t **ret) {
        struct mapping m = { .device = d, .size = size };
        int r;

        (void) fd;
        memcpy(m.handle, ipc_handle, sizeof(m.handle));
        if ((r = client_cuda_open(c, &m)) == 0)
                *ret = m.base;
        return r;
}

static void ipc_unmap_read(gpupool_client *c, unsigned d, uint8_t *base, uint64_t size) {
        struct mapping m = { .device = d, .size = size, .base = base };

        client_cuda_close(c, &m);
}

const struct client_mem_ops client_mem_cuda = {
        .backend = "cuda",
        .memory = "memory",
        .driver = &client_driver_cuda,
        .ipc = true,
        .segment_map = ipc_segment_map,
        .segment_unmap = ipc_segment_unmap,
        .zero = cuda_zero,
        .protect = ipc_protect,
        .map_read = ipc_map_read,
        .unmap_read = ipc_unmap_read,
};

/* cuda-vmm: the driver's calls, each in the device's context (client_cuda.c). */
static int vmm_reserve(gpupool_client *c, unsigned d, uint64_t bytes, uint64_t align, uint8_t **ret) {
        return client_cuda_reserve(c, d, bytes, align, ret);
}

static void vmm_unreserve(gpupool_client *c, unsigned d, uint8_t *base, uint64_t bytes) {
        client_cuda_unreserve(c, d, base, bytes);
}

static int vmm_import(gpupool_client *c, unsigned d, int fd, uint64_t size, uint8_t *park, client_mem_handle *ret) {
        gp_cu_mem_handle h;
        int r;

        (void) park;
        r = client_cuda_import(c, d, fd, size, &h);
        if (r == 0)
                *ret = (client_mem_handle) h;
        return r;
}

static void vmm_release(gpupool_client *c, unsigned d, client_mem_handle h, uint64_t size) {
        (void) size;
        client_cuda_release(c, d, (gp_cu_mem_handle) h);
}

static int vmm_map(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size, client_mem_handle h, int fd) {
        (void) fd;      /* cuda-vmm keeps no descriptor: the handle holds the memory */
        return client_cuda_map(c, d, va, size, (gp_cu_mem_handle) h);
}

static int vmm_access(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size) {
        return client_cuda_access(c, d, va, size, true);
}

static int vmm_unmap(gpupool_client *c, unsigned d, uint8_t *va, uint64_t size) {
        return client_cuda_unmap(c, d, va, size);
}

/*
 * A whole allocation, fd of size bytes: imported, mapped in a range of its own and made
 * accessible (or, !writable, readable only), at *ret; the handle goes, the mapping keeps the memory.
 */
static int vmm_map_whole(gpupool_client *c, unsigned d, int fd, uint64_t size, bool writable, uint8_t **ret) {
        client_mem_handle h = 0;
        uint8_t *va = NULL;
        int r;

        r = vmm_import(c, d, fd, size, NULL, &h);
        if (r < 0)
                return r;
        r = vmm_reserve(c, d, size, 0, &va);
        /* The whole allocation, which must be the size the daemon described. */
        if (r == 0 && (r = vmm_map(c, d, va, size, h, -1)) == 0 &&
            (r = client_cuda_access(c, d, va, size, writable)) < 0)
                (void) vmm_unmap(c, d, va, size);
        if (r < 0 && va)
                vmm_unreserve(c, d, va, size);
        vmm_release(c, d, h, size);
        if (r == 0)
                *ret = va;
        return r;
}

static int vmm_segment_map(gpupool_client *c, struct mapping *m, int fd) {
        return vmm_map_whole(c, m->device, fd, m->size, true, &m->base);
}

static void vmm_unmap_read(gpupool_client *c, unsigned d, uint8_t *base, uint64_t size) {
        /* An address still mapped is not freed: the driver would refuse it. */
        if (vmm_unmap(c, d, base, size) == 0)
                vmm_unreserve(c, d, base, size);
}

static void vmm_segment_unmap(gpupool_client *c, struct mapping *m) {
        vmm_unmap_read(c, m->device, m->base, m->size);
}

static int vmm_protect(gpupool_client *c, struct mapping *m, bool writable) {
        return client_cuda_access(c, m->device, m->base, m->size, writable);
}

static int vmm_map_read(gpupool_client *c, unsigned d, int fd, const uint8_t *ipc_handle, uint64_t size, uint8_t **ret) {
        (void) ipc_handle;
        return vmm_map_whole(c, d, fd, size, false, ret);
}

const struct client_mem_ops client_mem_vmm = {
        .backend = "cuda-vmm",
        .memory = "cuda-vmm memory",
        .driver = &client_driver_cuda,
        .outlives_daemon = true,
        .grows = true,
        .segment_map = vmm_segment_map,
        .segment_unmap = vmm_segment_unmap,
        .reserve = vmm_reserve,
        .unreserve = vmm_unreserve,
        .import = vmm_import,
        .release = vmm_release,
        .map = vmm_map,
        .access = vmm_access,
        .unmap = vmm_unmap,
        .zero = cuda_zero,
        .protect = vmm_protect,
        .map_read = vmm_map_read,
        .unmap_read = vmm_unmap_read,
        .adopted_held = true,
};

const struct client_mem_ops *client_mem_of(const char *backend) {
        static const struct client_mem_ops *const all[] = { &client_mem_host, &client_mem_cuda, &client_mem_vmm };

        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
                if (strcmp(all[i]->backend, backend) == 0)
                        return all[i];
        return NULL;
}
