/*
 * backend_host.c: shared host memory as the pool's "device".
 *
 * Each segment is a sealed memfd. The daemon never maps it: it passes the descriptor to the
 * client over SCM_RIGHTS and the client maps it. The seals stop a client from shrinking or
 * growing the file, which would fault every other mapping of it. A segment changing uid gets a
 * fresh memfd (a client may keep the old one), and the old one's pages go back to the kernel.
 * A daemon after this one adopts the memfds clients kept (host_mem_adopt): its memory outlives
 * the daemon.
 * This backend serves CPU-only machines, CI and tests, and is a usable shared-memory pool of
 * its own.
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/*
 * The seals every segment has: a client cannot resize it under another's mapping. F_SEAL_SEAL
 * is left off, so that a segment can be sealed against writing when it becomes a named object
 * (host_mem_seal()); a client that seals one it leases itself only keeps itself from mapping it
 * (a segment changing principal gets a fresh memfd, host_mem_zero()).
 */
#define SEGMENT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

/* A sealed memfd of size bytes. Returns it, or a negative errno. */
static int segment_memfd(uint64_t size) {
        int fd, r;

        fd = memfd_create("gpupool-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;  /* EMFILE and ENFILE too: out of descriptors is not a full device */
        if (ftruncate(fd, (off_t) size) < 0 || fcntl(fd, F_ADD_SEALS, SEGMENT_SEALS) < 0) {
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

/*
 * A named object's segment, sealed against writing for good: no write(2), no writable mapping,
 * whoever holds a descriptor of it (reopening one through /proc included). The kernel refuses
 * while a writable mapping exists: the publisher has made its own read-only first.
 */
static int host_mem_seal(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        (void) b, (void) device, (void) size;
        if (fcntl(mem->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0)
                return -errno;
        return 0;
}

static int host_mem_zero_done(struct backend *b, unsigned device, struct backend_mem *mem) {
        (void) b, (void) device, (void) mem;
        return 1;       /* host_mem_zero() never leaves work running */
}

/* Linux 6.3's seal against making a memfd executable, which the kernel may add by itself (vm.memfd_noexec): harmless here. */
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif

/*
 * A segment a client kept from a daemon before this one: a memfd (seals are for shared memory
 * only) of the size it says, sealed exactly as ours are, open for reading and writing. Its
 * memory is the client's own either way: one it made itself with our seals passes too, and is
 * counted as the client's like any other.
 *
 * F_GET_SEALS comes first: it fails at once on anything but shared memory and never reaches a
 * file system, whereas fstat(2) of a FUSE file waits for its server, which may never answer,
 * and would stall the loop. Only once the descriptor is known to be shmem is it fstat()ed.
 * Write seals are refused: the daemon could not zero, punch or lease such memory to anyone.
 */
static int host_mem_adopt(struct backend *b, unsigned device, int fd, uint64_t size, bool sealed, struct backend_mem *ret,
                          char *why, size_t why_size) {
        /* A named object's: host_mem_seal() added these. */
        int want = sealed ? SEGMENT_SEALS | F_SEAL_WRITE : SEGMENT_SEALS;
        struct stat st;
        int seals, flags;

        (void) b;
        if (device != 0)
                return -ENODEV;
        if ((seals = fcntl(fd, F_GET_SEALS)) < 0) {
                snprintf(why, why_size, "not a memfd");
                return -EINVAL;
        }
        /* A daemon before this one sealed its segments with F_SEAL_SEAL too: either is a segment's. */
        if ((seals & ~(F_SEAL_EXEC | F_SEAL_SEAL)) != want) {
                snprintf(why, why_size, "not sealed as a %s is (seals %#x, a %s's are exactly %#x%s)",
                         sealed ? "named object" : "segment", seals, sealed ? "named object" : "segment", want,
                         !sealed && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) ? ": it is sealed against writing" : "");
                return -EINVAL;
        }
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                snprintf(why, why_size, "not a memfd");
                return -EINVAL;
        }
        if ((uint64_t) st.st_size != size) {
                snprintf(why, why_size, "a memfd of %lld bytes, not %llu", (long long) st.st_size, (unsigned long long) size);
                return -EINVAL;
        }
        if (!sealed && ((flags = fcntl(fd, F_GETFL)) < 0 || (flags & O_ACCMODE) != O_RDWR)) {
                snprintf(why, why_size, "a memfd open read-only, which nobody else could map to write");
                return -EINVAL;
        }
        memset(ret, 0, sizeof(*ret));
        ret->fd = fd;
        return 0;
}

/* A memfd's inode: the same for every descriptor of it, and no other file's while it is open. */
static uint64_t host_mem_ident(struct backend *b, unsigned device, const struct backend_mem *mem) {
        struct stat st;

        (void) b, (void) device;
        if (mem->fd < 0 || fstat(mem->fd, &st) < 0)
                return 0;
        return ((uint64_t) st.st_dev << 32) ^ (uint64_t) st.st_ino;
}

static int host_mem_export(struct backend *b, unsigned device, struct backend_mem *mem, bool read_only) {
        char path[64];
        int fd;

        (void) b, (void) device;
        if (!read_only)
                fd = fcntl(mem->fd, F_DUPFD_CLOEXEC, 0);
        else {
                /* A file opened anew for reading only: the process can map it no other way. */
                snprintf(path, sizeof(path), "/proc/self/fd/%d", mem->fd);
                fd = open(path, O_RDONLY | O_CLOEXEC);
        }
        return fd < 0 ? -errno : fd;
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
        .mem_adopt = host_mem_adopt,
        .mem_ident = host_mem_ident,
        .mem_seal = host_mem_seal,
        .mem_export = host_mem_export,
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
        h->base.reopens_read_only = true;
        h->base.seal_waits = true;
        h->capacity_bytes = capacity_bytes;
        *ret = &h->base;
        return 0;
}
