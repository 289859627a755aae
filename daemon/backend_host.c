/*
 * backend_host.c: shared host memory as the pool's "device".
 *
 * Each segment is a sealed memfd. The daemon never maps it: it passes the descriptor to the
 * client over SCM_RIGHTS and the client maps it. The seals stop a client from shrinking or
 * growing the file, which would fault every other mapping of it. Zeroing punches the whole
 * range out, which also hands the pages back to the kernel. This backend serves CPU-only
 * machines, CI and tests, and is a usable shared-memory pool of its own.
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

static int host_mem_create(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret) {
        int fd, r;

        (void) b;
        if (device != 0)
                return -ENODEV;
        fd = memfd_create("gpupool-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;  /* EMFILE and ENFILE too: out of descriptors is not a full device */
        if (ftruncate(fd, (off_t) size) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
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

static int host_mem_zero(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        (void) b, (void) device;
        if (fallocate(mem->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t) size) < 0) {
                int r = -errno;

                log_warn("host backend: zeroing a segment of %llu bytes failed: %s",
                         (unsigned long long) size, strerror(-r));
                return r;
        }
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
