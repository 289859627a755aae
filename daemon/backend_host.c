/*
 * backend_host.c: shared host memory as the pool's "device".
 *
 * Each segment is a sealed memfd. The daemon never maps it: it passes the descriptor to the
 * client over SCM_RIGHTS and the client maps it. The seals stop a client from shrinking or
 * growing the file, which would fault every other mapping of it. A segment changing uid gets a
 * fresh memfd (a client may keep the old one), and the old one's pages go back to the kernel.
 * This backend serves CPU-only machines, CI and tests, and is a usable shared-memory pool of
 * its own.
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

struct host_backend {
        struct backend base;
        uint64_t capacity_bytes;
};

static int host_device_info(struct backend *b, unsigned device, struct backend_device_info *ret) {
        struct host_backend *h = (struct host_backend *) b;

        if (device != 0)
                return -ENODEV;
        memset(ret, 0, sizeof(*ret));
        ret->total_bytes = h->capacity_bytes;
        return 0;
}

/* A sealed memfd of size bytes. Returns it, or a negative errno. */
static int segment_memfd(uint64_t size) {
        int fd, r;

        fd = memfd_create("gpupool-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;  /* EMFILE and ENFILE too: out of descriptors is not a full device */
        if (ftruncate(fd, (off_t) size) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

static int host_mem_create(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret) {
        int fd;

        (void) b;
        if (device != 0)
                return -ENODEV;
        if ((fd = segment_memfd(size)) < 0)
                return fd;
        memset(ret, 0, sizeof(*ret));
        ret->fd = fd;
        return 0;
}

static void host_mem_destroy(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        (void) b, (void) device, (void) size;
        if (mem->fd >= 0)
                close(mem->fd);
        mem->fd = -1;
}

/*
 * A segment changing uid gets a fresh memfd: the one it had may still be open or mapped in the
 * process that returned it (nothing can take a descriptor back), and whatever the next owner
 * writes must never show there. The old one's pages are punched out first, so that a process
 * keeping it holds no memory until it writes there again; closing it leaves it to that process.
 */
static int host_mem_zero(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        int fd;

        (void) b, (void) device;
        if (fallocate(mem->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t) size) < 0)
                log_warn("host backend: punching out a segment of %llu bytes changing uid failed: %s",
                         (unsigned long long) size, strerror(errno));
        if ((fd = segment_memfd(size)) < 0) {
                log_warn("host backend: fresh memory for a segment of %llu bytes changing uid: %s",
                         (unsigned long long) size, strerror(-fd));
                return fd;
        }
        close(mem->fd);
        mem->fd = fd;
        return 0;
}

static int host_mem_zero_done(struct backend *b, unsigned device, struct backend_mem *mem) {
        (void) b, (void) device, (void) mem;
        return 1;       /* host_mem_zero() never leaves work running */
}

static void host_close(struct backend *b) {
        free(b);
}

static const struct backend_ops host_ops = {
        .device_info = host_device_info,
        .mem_create = host_mem_create,
        .mem_destroy = host_mem_destroy,
        .mem_zero = host_mem_zero,
        .mem_zero_done = host_mem_zero_done,
        .close = host_close,
};

int backend_host_open(uint64_t capacity_bytes, struct backend **ret) {
        struct host_backend *h = calloc(1, sizeof(*h));

        if (!h)
                return -ENOMEM;
        h->base.ops = &host_ops;
        h->base.name = "host";
        h->base.device_count = 1;
        h->base.data = h;
        h->base.fd_bytes = capacity_bytes;      /* a memfd per segment */
        h->capacity_bytes = capacity_bytes;
        *ret = &h->base;
        return 0;
}
