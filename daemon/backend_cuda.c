/*
 * backend_cuda.c: GPU memory through the CUDA driver API, loaded at run time (cudadrv.h).
 *
 * Every GPU of the node is a device of the pool. The daemon works in each GPU's primary
 * context, the one the CUDA runtime and every framework in the clients use too. A segment is
 * one cuMemAlloc_v2 allocation, exported with cuIpcGetMemHandle: a legacy IPC handle opens the
 * whole allocation, which is why the pool leases whole segments to one client at a time and
 * never sub-allocates across clients. Segments are 2 MiB multiples, as NVIDIA recommends for
 * memory shared over IPC.
 *
 * A device's capacity is its free memory at start (cuMemGetInfo_v2, once the daemon's own
 * context exists) less --headroom, left to the driver, to the clients' own contexts and to
 * processes that do not use gpupool. The headroom is kept as others take memory: the pool
 * asks cuMemGetInfo_v2 before it makes a segment and every second (device_memory), does not
 * grow into the headroom, and gives its cache back when others have taken some of it.
 * cuMemAlloc_v2 failing for lack of memory is reported to the pool as -ENOMEM, which releases
 * its cache and tries again.
 *
 * Zeroing (a segment changing tenant) queues cuMemsetD8Async and an event on a stream of the
 * daemon's; the segment is handed out once the event has completed (the loop polls it): the
 * next tenant's work runs in another process's context, which nothing would order after ours.
 *
 * cuda-vmm memory outlives the daemon (clients hold handles and mappings of it) and a daemon
 * after this one adopts the descriptors clients kept (cuda_mem_adopt), knowing memory by the
 * file this daemon exported of it (vmm_name(), kcmp(2)); the legacy backend's allocations die
 * with the daemon's context.
 *
 * Compute modes: a GPU in EXCLUSIVE_PROCESS mode (common on shared clusters) admits one
 * process's context at a time, and one in PROHIBITED mode none; gpupoold's context would lock
 * every client out of the first, and cannot exist on the second. Such GPUs are skipped with a
 * log line that says why and what to do; the pool's devices are the GPUs left, in order (the
 * clients match them by UUID). If none is left gpupoold does not start.
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/kcmp.h>

#include "cudadrv.h"
#include "log.h"
#include "rbtree.h"
#include "size.h"

struct cuda_device {
        int ordinal;                    /* the daemon's CUDA ordinal (cuda-vmm's location id) */
        gp_cu_device dev;
        gp_cu_context ctx;              /* the primary context, retained */
        gp_cu_stream stream;            /* for zeroing: polled by an event, never synchronized */
        uint64_t capacity_bytes;
        gp_cu_uuid uuid;
        char name[96];
};

struct cuda_backend {
        struct backend base;
        struct gp_cuda cu;
        bool vmm;                       /* cuda-vmm: cuMemCreate segments, exported as descriptors */
        bool named;                     /* cuda-vmm with kcmp(2): segments named by their file (files) */
        struct backend_ops ops;         /* cuda_ops, adopting too where named */
        struct gp_rb_tree files;        /* struct vmm_file, in kcmp(2)'s order of their files */
        uint64_t last_ident;
        char no_adopt_why[192];
        uint64_t headroom_bytes;        /* --headroom: left free on each GPU for everyone else */
        struct cuda_device devs[BACKEND_MAX_DEVICES];
};

static struct cuda_backend *cuda_of(struct backend *b) {
        return (struct cuda_backend *) b;
}

/* Makes the device's primary context current for a driver call; pair with pop(). */
static int push(struct cuda_backend *c, struct cuda_device *d) {
        gp_cu_result r = c->cu.cuCtxPushCurrent(d->ctx);

        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: cuCtxPushCurrent: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 0;
}

static void pop(struct cuda_backend *c) {
        gp_cu_context ctx;

        (void) c->cu.cuCtxPopCurrent(&ctx);
}

/*
 * An entry point's device, with its primary context made current (pair with pop()); NULL with
 * *err set when there is no such device or the context cannot be made current.
 */
static struct cuda_device *enter(struct cuda_backend *c, unsigned device, int *err) {
        if (device >= c->base.device_count) {
                *err = -ENODEV;
                return NULL;
        }
        *err = push(c, &c->devs[device]);
        return *err < 0 ? NULL : &c->devs[device];
}

void backend_uuid_text(const uint8_t u[16], bool mig, char buf[BACKEND_UUID_TEXT_MAX]) {
        snprintf(buf, BACKEND_UUID_TEXT_MAX, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 mig ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
                 u[13], u[14], u[15]);
}

/*
 * Whether the device is a MIG instance: the driver API has no attribute for it, but a MIG
 * instance's name carries its profile ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"), and
 * cuDeviceGetUuid_v2 gives its MIG UUID, which nvidia-smi -L writes "MIG-…".
 */
static bool is_mig(const struct cuda_device *d) {
        return strstr(d->name, " MIG ") != NULL;
}

static int cuda_device_info(struct backend *b, unsigned device, struct backend_device_info *ret) {
        struct cuda_backend *c = cuda_of(b);

        if (device >= b->device_count)
                return -ENODEV;
        memset(ret, 0, sizeof(*ret));
        ret->total_bytes = c->devs[device].capacity_bytes;
        memcpy(ret->uuid, c->devs[device].uuid.bytes, sizeof(ret->uuid));
        ret->has_uuid = 1;
        ret->mig = is_mig(&c->devs[device]);
        return 0;
}

static int cuda_device_memory(struct backend *b, unsigned device, struct backend_device_memory *ret) {
        struct cuda_backend *c = cuda_of(b);
        size_t free_bytes = 0, total_bytes = 0;
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err)))
                return err;
        r = c->cu.cuMemGetInfo(&free_bytes, &total_bytes);
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: cuMemGetInfo_v2: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        *ret = (struct backend_device_memory) {
                .free_bytes = free_bytes,
                .total_bytes = total_bytes,
                .headroom_bytes = c->headroom_bytes,
        };
        return 0;
}

/* ---- cuda-vmm: a segment is a cuMemCreate allocation, exported as a descriptor, mapped in the daemon too ---- */

static gp_cu_mem_prop vmm_prop(const struct cuda_device *d) {
        return (gp_cu_mem_prop) {
                .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
                .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal },
        };
}

/*
 * Which memory a descriptor is. The driver names none: each export is a file of its own, and
 * nothing of a descriptor tells which allocation it is. What the daemon can tell is whether two
 * descriptors are the same open file, with kcmp(2) (KCMP_FILE), which orders files too. It
 * exports each segment's memory once and hands that one file to the segment's lessee, who keeps
 * it; a descriptor handed back for adoption is that file, and is named by the segment it came
 * from. (A process that exports memory it imported again makes a new file of it: the daemon
 * takes that for other memory, counted apart, which only ever counts the process more.)
 */
struct vmm_file {
        struct gp_rb_node node;
        int fd;                         /* the descriptor it was named by: a segment's, or one being adopted */
        uint64_t ident;
};

static pid_t kcmp_self;

static int cmp_file(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        int a = gp_rb_entry(x, struct vmm_file, node)->fd, b = gp_rb_entry(y, struct vmm_file, node)->fd;
        long r = syscall(SYS_kcmp, kcmp_self, kcmp_self, KCMP_FILE, (unsigned long) a, (unsigned long) b);

        /* 0: the same file; 1 and 2: before and after, in an order that holds while both are open. */
        return r == 0 ? 0 : r == 1 ? -1 : r == 2 ? 1 : (a > b) - (a < b);
}

/* Whether kcmp(2) works here: a seccomp filter, or a kernel without CONFIG_KCMP, may refuse it. */
static int kcmp_probe(void) {
        int p[2], err = 0;

        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        kcmp_self = getpid();
        if (syscall(SYS_kcmp, kcmp_self, kcmp_self, KCMP_FILE, (unsigned long) p[0], (unsigned long) p[1]) < 0)
                err = -errno;
        close(p[0]);
        close(p[1]);
        return err;
}

static struct vmm_file *vmm_named(struct cuda_backend *c, int fd) {
        struct vmm_file key = { .fd = fd };
        struct gp_rb_node *n = fd >= 0 ? gp_rb_find(&c->files, &key.node) : NULL;

        return n ? gp_rb_entry(n, struct vmm_file, node) : NULL;
}

/* Names fd's file, unless it has a name already (then fd is a second descriptor of it). Returns 0 or -ENOMEM. */
static int vmm_name(struct cuda_backend *c, int fd) {
        struct vmm_file *f;

        if (!c->named)
                return 0;
        if (!(f = malloc(sizeof(*f))))
                return -ENOMEM;
        f->fd = fd;
        f->ident = ++c->last_ident;
        if (gp_rb_insert(&c->files, &f->node))
                free(f);
        return 0;
}

/* Forgets fd's file, before fd closes, if fd is the descriptor it was named by. */
static void vmm_unname(struct cuda_backend *c, int fd) {
        struct vmm_file *f = c->named ? vmm_named(c, fd) : NULL;

        if (f && f->fd == fd) {
                gp_rb_remove(&c->files, &f->node);
                free(f);
        }
}

/* Makes the daemon's mapping at va read-only (a named object's). Pushed. */
static gp_cu_result vmm_read_only(struct cuda_backend *c, struct cuda_device *d, gp_cu_deviceptr va, uint64_t size) {
        gp_cu_mem_access_desc ro = { .location = vmm_prop(d).location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READ };

        return c->cu.cuMemSetAccess(va, size, &ro, 1);
}

/* Maps h at va for the device to read and write. Pushed. Returns a driver result; on failure nothing is mapped. */
static gp_cu_result vmm_map(struct cuda_backend *c, struct cuda_device *d, gp_cu_deviceptr va, uint64_t size,
                            gp_cu_mem_handle h) {
        gp_cu_mem_access_desc rw = { .location = vmm_prop(d).location, .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        gp_cu_result r = c->cu.cuMemMap(va, size, 0, h, 0);

        if (r == GP_CUDA_SUCCESS) {
                r = c->cu.cuMemSetAccess(va, size, &rw, 1);
                if (r != GP_CUDA_SUCCESS)
                        (void) c->cu.cuMemUnmap(va, size);
        }
        return r;
}

/*
 * Fresh physical memory for a segment: made, exported as a descriptor (named by its file), and
 * mapped at va (the daemon's own mapping, for zeroing). Pushed. Returns a driver result
 * (CUDA_ERROR_OUT_OF_MEMORY too when the name could not be kept); on failure nothing is left.
 */
static gp_cu_result vmm_make(struct cuda_backend *c, struct cuda_device *d, uint64_t size, gp_cu_deviceptr va,
                             gp_cu_mem_handle *ret_handle, int *ret_fd) {
        gp_cu_mem_prop prop = vmm_prop(d);
        gp_cu_mem_handle h;
        gp_cu_result r;
        int fd = -1;

        r = c->cu.cuMemCreate(&h, size, &prop, 0);
        if (r != GP_CUDA_SUCCESS)
                return r;
        r = c->cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r == GP_CUDA_SUCCESS) {
                r = vmm_map(c, d, va, size, h);
                if (r == GP_CUDA_SUCCESS && vmm_name(c, fd) < 0) {
                        (void) c->cu.cuMemUnmap(va, size);
                        r = GP_CUDA_ERROR_OUT_OF_MEMORY;
                }
                if (r != GP_CUDA_SUCCESS)
                        close(fd);
        }
        if (r != GP_CUDA_SUCCESS) {
                (void) c->cu.cuMemRelease(h);
                return r;
        }
        *ret_handle = h;
        *ret_fd = fd;
        return GP_CUDA_SUCCESS;
}

/* Lets go of a segment's physical memory: its descriptor, the daemon's mapping, its handle. Pushed. */
static void vmm_unmake(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_result r;

        if (mem->fd >= 0) {
                vmm_unname(c, mem->fd);
                close(mem->fd);
        }
        mem->fd = -1;
        if (!mem->vmm_handle)
                return;         /* it has none (fresh memory for it could not be made) */
        r = c->cu.cuMemUnmap(mem->addr, size);
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuMemRelease(mem->vmm_handle);
        if (r != GP_CUDA_SUCCESS)
                log_err("cuda-vmm: %s: letting go of a %llu-byte segment: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
}

static int vmm_mem_create(struct cuda_backend *c, struct cuda_device *d, uint64_t size, struct backend_mem *ret) {
        gp_cu_deviceptr va = 0;
        gp_cu_mem_handle h = 0;
        gp_cu_result r;
        int fd = -1;

        r = c->cu.cuMemAddressReserve(&va, size, 0, 0, 0);
        if (r == GP_CUDA_SUCCESS) {
                r = vmm_make(c, d, size, va, &h, &fd);
                if (r != GP_CUDA_SUCCESS)
                        (void) c->cu.cuMemAddressFree(va, size);
        }
        if (r != GP_CUDA_SUCCESS) {
                if (r == GP_CUDA_ERROR_OUT_OF_MEMORY) {
                        log_debug("cuda-vmm: %s: cuMemCreate of %llu bytes: out of memory", d->name, (unsigned long long) size);
                        return -ENOMEM;
                }
                log_err("cuda-vmm: %s: making a %llu-byte segment: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        memset(ret, 0, sizeof(*ret));
        ret->fd = fd;
        ret->addr = va;
        ret->vmm_handle = h;
        return 0;
}

static int cuda_mem_create(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret) {
        struct cuda_backend *c = cuda_of(b);
        gp_cu_ipc_mem_handle handle;
        gp_cu_deviceptr dptr = 0;
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err)))
                return err;
        if (c->vmm) {
                err = vmm_mem_create(c, d, size, ret);
                pop(c);
                return err;
        }
        r = c->cu.cuMemAlloc(&dptr, size);
        if (r != GP_CUDA_SUCCESS) {
                pop(c);
                if (r == GP_CUDA_ERROR_OUT_OF_MEMORY) {
                        log_debug("cuda: %s: cuMemAlloc_v2 of %llu bytes: out of memory", d->name,
                                  (unsigned long long) size);
                        return -ENOMEM;
                }
                log_err("cuda: %s: cuMemAlloc_v2 of %llu bytes: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        r = c->cu.cuIpcGetMemHandle(&handle, dptr);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: cuIpcGetMemHandle: %s", d->name, gp_cuda_error_name(&c->cu, r));
                (void) c->cu.cuMemFree(dptr);
                pop(c);
                return -EIO;
        }
        pop(c);
        memset(ret, 0, sizeof(*ret));
        ret->fd = -1;
        ret->addr = dptr;
        memcpy(ret->ipc_handle, handle.reserved, sizeof(handle.reserved));
        ret->ipc_handle_len = sizeof(handle.reserved);
        return 0;
}

static void cuda_mem_destroy(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!mem->addr || !(d = enter(c, device, &err)))
                return;
        if (mem->zeroing) {
                /* Destroyed while its zeroing runs: the driver lets the event go once it completes. */
                (void) c->cu.cuEventDestroy((gp_cu_event) mem->zeroing);
                mem->zeroing = NULL;
        }
        if (c->vmm) {
                vmm_unmake(c, d, mem, size);
                r = c->cu.cuMemAddressFree(mem->addr, size);
                pop(c);
                if (r != GP_CUDA_SUCCESS)
                        log_err("cuda-vmm: %s: cuMemAddressFree: %s", d->name, gp_cuda_error_name(&c->cu, r));
                mem->addr = 0;
                return;
        }
        r = c->cu.cuMemFree(mem->addr);
        pop(c);
        if (r != GP_CUDA_SUCCESS)
                log_err("cuda: %s: cuMemFree_v2 of a %llu-byte segment: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
        mem->addr = 0;
}

/*
 * Queues a memset of the segment and an event after it, and returns 1: the loop polls the
 * event (cuda_mem_zero_done) and never waits for the GPU, which may be time-sliced against
 * clients' kernels for milliseconds, or hung.
 */
static int cuda_mem_zero(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_event e = NULL;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err)))
                return err;
        if (c->vmm) {
                /*
                 * A process may keep the descriptor or a mapping of memory it gave back: memory that
                 * changes uid is therefore fresh, never the old zeroed, and the old goes to whoever
                 * still holds it. Fresh memory is zeroed all the same: the driver does not say it is.
                 */
                gp_cu_mem_handle h;
                int fd;

                vmm_unmake(c, d, mem, size);
                r = vmm_make(c, d, size, mem->addr, &h, &fd);
                if (r != GP_CUDA_SUCCESS) {
                        pop(c);
                        log_err("cuda-vmm: %s: fresh memory for a segment changing uid: %s", d->name,
                                gp_cuda_error_name(&c->cu, r));
                        /* The segment has no memory now: the pool destroys it, which frees only its range. */
                        mem->vmm_handle = 0;
                        return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
                }
                mem->vmm_handle = h;
                mem->fd = fd;
        }
        r = c->cu.cuMemsetD8Async(mem->addr, 0, size, d->stream);
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuEventCreate(&e, GP_CU_EVENT_DISABLE_TIMING);
        if (r == GP_CUDA_SUCCESS) {
                r = c->cu.cuEventRecord(e, d->stream);
                if (r != GP_CUDA_SUCCESS)
                        (void) c->cu.cuEventDestroy(e);
        }
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: zeroing a %llu-byte segment: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        mem->zeroing = e;
        return 1;
}

static int cuda_mem_zero_done(struct backend *b, unsigned device, struct backend_mem *mem) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err)))
                return err;
        r = c->cu.cuEventQuery((gp_cu_event) mem->zeroing);
        if (r != GP_CUDA_ERROR_NOT_READY) {
                (void) c->cu.cuEventDestroy((gp_cu_event) mem->zeroing);
                mem->zeroing = NULL;
        }
        pop(c);
        if (r == GP_CUDA_ERROR_NOT_READY)
                return 0;
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: zeroing a segment: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 1;
}

/*
 * cuda-vmm: a segment a client kept from a daemon before this one: a descriptor the driver
 * exported of memory on this GPU, made for descriptors, that maps as size bytes. It is imported,
 * mapped in a range of the daemon's (for zeroing) and named by its file. Memory the client made
 * itself passes too, and is counted as the client's like any other. The driver does not say an
 * allocation's size: one larger than size maps as size bytes, and the rest is the client's own.
 */
static int cuda_mem_adopt(struct backend *b, unsigned device, int fd, uint64_t size, bool sealed, struct backend_mem *ret,
                          char *why, size_t why_size) {
        struct cuda_backend *c = cuda_of(b);
        gp_cu_mem_prop prop;
        gp_cu_mem_handle h = 0;
        gp_cu_deviceptr va = 0;
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err))) {
                snprintf(why, why_size, "on a device this daemon cannot use now");
                return err;
        }
        r = c->cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != GP_CUDA_SUCCESS) {
                pop(c);
                snprintf(why, why_size, "not memory the CUDA driver exported as a descriptor (cuMemImportFromShareableHandle: "
                         "%s)", gp_cuda_error_name(&c->cu, r));
                return -EINVAL;
        }
        r = c->cu.cuMemGetAllocationPropertiesFromHandle(&prop, h);
        if (r != GP_CUDA_SUCCESS || prop.type != GP_CU_MEM_ALLOCATION_TYPE_PINNED ||
            prop.location.type != GP_CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != d->ordinal ||
            !(prop.requested_handle_types & GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
                (void) c->cu.cuMemRelease(h);
                pop(c);
                if (r != GP_CUDA_SUCCESS)
                        snprintf(why, why_size, "memory whose properties the driver does not tell "
                                 "(cuMemGetAllocationPropertiesFromHandle: %s)", gp_cuda_error_name(&c->cu, r));
                else
                        snprintf(why, why_size, "not memory of GPU %d (%s) made to be shared as a descriptor (its location "
                                 "is %s %d)", d->ordinal, d->name,
                                 prop.location.type == GP_CU_MEM_LOCATION_TYPE_DEVICE ? "GPU" : "type", prop.location.id);
                return -EINVAL;
        }
        r = c->cu.cuMemAddressReserve(&va, size, 0, 0, 0);
        if (r == GP_CUDA_SUCCESS && (r = vmm_map(c, d, va, size, h)) != GP_CUDA_SUCCESS)
                (void) c->cu.cuMemAddressFree(va, size);
        /* A named object's: the daemon's mapping read-only again, as cuda_mem_seal() made it. */
        if (r == GP_CUDA_SUCCESS && sealed && (r = vmm_read_only(c, d, va, size)) != GP_CUDA_SUCCESS) {
                (void) c->cu.cuMemUnmap(va, size);
                (void) c->cu.cuMemAddressFree(va, size);
        }
        if (r == GP_CUDA_SUCCESS && vmm_name(c, fd) < 0) {
                (void) c->cu.cuMemUnmap(va, size);
                (void) c->cu.cuMemAddressFree(va, size);
                r = GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (r != GP_CUDA_SUCCESS) {
                (void) c->cu.cuMemRelease(h);
                pop(c);
                if (r == GP_CUDA_ERROR_OUT_OF_MEMORY) {
                        snprintf(why, why_size, "memory the daemon has no room to map now");
                        return -ENOMEM;
                }
                snprintf(why, why_size, "memory that does not map as %llu bytes (%s)", (unsigned long long) size,
                         gp_cuda_error_name(&c->cu, r));
                return -EINVAL;
        }
        pop(c);
        memset(ret, 0, sizeof(*ret));
        ret->fd = fd;
        ret->addr = va;
        ret->vmm_handle = h;
        return 0;
}

/*
 * cuda-vmm: a named object's segment. The driver has no seal: the daemon's own mapping becomes
 * read-only, and each process that attaches maps it with read access only (libgpupool). A
 * process that imports the descriptor with the driver itself could map it writable: what may
 * attach is who is trusted with it (docs/security.md).
 */
static int cuda_mem_seal(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = enter(c, device, &err)))
                return err;
        r = vmm_read_only(c, d, mem->addr, size);
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: making a %llu-byte object read-only: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 0;
}

/*
 * Legacy cuda: nothing can be sealed, nor mapped read-only: a legacy IPC handle opens the
 * allocation for reading and writing (cuIpcOpenMemHandle has no read-only flag). A named
 * object's memory is not written by gpupool, and nothing stops a process that attached it from
 * writing (docs/security.md); it dies with the daemon's context.
 */
static int cuda_legacy_seal(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        (void) b, (void) device, (void) mem, (void) size;
        return 0;
}

static uint64_t cuda_mem_ident(struct backend *b, unsigned device, const struct backend_mem *mem) {
        struct vmm_file *f = vmm_named(cuda_of(b), mem->fd);

        (void) device;
        return f ? f->ident : 0;
}

static void cuda_close(struct backend *b) {
        struct cuda_backend *c = cuda_of(b);
        struct gp_rb_node *n;

        for (unsigned i = 0; i < b->device_count; i++) {
                struct cuda_device *d = &c->devs[i];

                if (d->stream && push(c, d) == 0) {
                        (void) c->cu.cuStreamDestroy(d->stream);
                        pop(c);
                }
                if (d->ctx)
                        (void) c->cu.cuDevicePrimaryCtxRelease(d->dev);
        }
        /* Every segment was destroyed, and forgot its name: none is left but by a bug. */
        while ((n = gp_rb_first(&c->files))) {
                gp_rb_remove(&c->files, n);
                free(gp_rb_entry(n, struct vmm_file, node));
        }
        free(c);
}

static const struct backend_ops cuda_ops = {
        .device_info = cuda_device_info,
        .mem_create = cuda_mem_create,
        .mem_destroy = cuda_mem_destroy,
        .mem_zero = cuda_mem_zero,
        .mem_zero_done = cuda_mem_zero_done,
        .device_memory = cuda_device_memory,
        .close = cuda_close,
};

/*
 * cuda-vmm: whether GPU d has what the backend needs (virtual memory management, descriptor
 * handles, a granularity that divides 2 MiB segments). Returns 0, with *r the driver's result
 * and *what the call when a query failed; or -ENOTSUP with a sentence in err.
 */
static int vmm_supported(struct cuda_backend *c, struct cuda_device *d, gp_cu_result *r, const char **what, char *err,
                         size_t err_size) {
        gp_cu_mem_prop prop = vmm_prop(d);
        size_t granularity = 0;
        int vmm = 0, fds = 0;

        *what = "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)";
        *r = c->cu.cuDeviceGetAttribute(&vmm, GP_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d->dev);
        if (*r == GP_CUDA_SUCCESS) {
                *what = "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)";
                *r = c->cu.cuDeviceGetAttribute(&fds, GP_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d->dev);
        }
        if (*r != GP_CUDA_SUCCESS)
                return 0;
        if (!vmm || !fds) {
                snprintf(err, err_size, "GPU %d (%s) does not support %s, which cuda-vmm needs; --backend cuda uses "
                         "legacy IPC handles instead", d->ordinal, d->name,
                         !vmm ? "virtual memory management" : "exporting memory as a POSIX file descriptor");
                return -ENOTSUP;
        }
        *what = "cuMemGetAllocationGranularity";
        *r = c->cu.cuMemGetAllocationGranularity(&granularity, &prop, GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (*r == GP_CUDA_SUCCESS && (granularity == 0 || (2ULL << 20) % granularity)) {
                snprintf(err, err_size, "GPU %d (%s): its allocation granularity, %zu bytes, does not divide the pool's "
                         "2 MiB segments", d->ordinal, d->name, granularity);
                return -ENOTSUP;
        }
        return 0;
}

/*
 * Opens GPU ordinal as the pool's device d (c->base.device_count counts it already). Returns
 * 0, 1 when its compute mode keeps it out of the pool (logged), or a negative errno with a
 * sentence in err.
 */
static int open_device(struct cuda_backend *c, unsigned index, int ordinal, uint64_t headroom_bytes, char *err,
                       size_t err_size) {
        struct cuda_device *d = &c->devs[index];
        char total_s[GP_SIZE_FORMAT_MAX], free_s[GP_SIZE_FORMAT_MAX], cap_s[GP_SIZE_FORMAT_MAX];
        char uuid[BACKEND_UUID_TEXT_MAX];
        size_t free_bytes = 0, total_bytes = 0;
        int mode = GP_CU_COMPUTEMODE_DEFAULT;
        const char *what;
        gp_cu_result r;

        d->ordinal = ordinal;
        what = "cuDeviceGet";
        r = c->cu.cuDeviceGet(&d->dev, ordinal);
        if (r == GP_CUDA_SUCCESS) {
                what = "cuDeviceGetName";
                r = c->cu.cuDeviceGetName(d->name, (int) sizeof(d->name), d->dev);
        }
        d->name[sizeof(d->name) - 1] = '\0';    /* a string in every message below, whatever the driver wrote */
        if (r == GP_CUDA_SUCCESS) {
                what = "cuDeviceGetUuid_v2";
                r = c->cu.cuDeviceGetUuid(&d->uuid, d->dev);
        }
        if (r == GP_CUDA_SUCCESS) {
                what = "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)";
                r = c->cu.cuDeviceGetAttribute(&mode, GP_CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, d->dev);
        }
        if (r == GP_CUDA_SUCCESS && (mode == GP_CU_COMPUTEMODE_EXCLUSIVE_PROCESS || mode == GP_CU_COMPUTEMODE_PROHIBITED)) {
                log_warn("cuda: GPU %d (%s) skipped: its compute mode is %s, which %s; to pool it, set it to "
                         "DEFAULT (nvidia-smi -i %d -c DEFAULT)", ordinal, d->name,
                         mode == GP_CU_COMPUTEMODE_PROHIBITED ? "PROHIBITED" : "EXCLUSIVE_PROCESS",
                         mode == GP_CU_COMPUTEMODE_PROHIBITED ? "allows no CUDA context on it" :
                         "allows one process's context at a time: gpupoold's would lock out every client",
                         ordinal);
                return 1;
        }
        if (r == GP_CUDA_SUCCESS && c->vmm) {
                int supported = vmm_supported(c, d, &r, &what, err, err_size);

                if (supported < 0)
                        return supported;
        }
        if (r == GP_CUDA_SUCCESS) {
                what = "cuDevicePrimaryCtxRetain";
                r = c->cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
        }
        if (r != GP_CUDA_SUCCESS) {
                d->ctx = NULL;
                snprintf(err, err_size, "GPU %d: %s: %s", ordinal, what, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        if (push(c, d) < 0) {
                snprintf(err, err_size, "GPU %d (%s): cannot make its primary context current", ordinal, d->name);
                return -EIO;
        }
        what = "cuMemGetInfo_v2";
        r = c->cu.cuMemGetInfo(&free_bytes, &total_bytes);
        if (r == GP_CUDA_SUCCESS) {
                what = "cuStreamCreate";
                r = c->cu.cuStreamCreate(&d->stream, GP_CU_STREAM_NON_BLOCKING);
        }
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                d->stream = NULL;
                snprintf(err, err_size, "GPU %d (%s): %s: %s", ordinal, d->name, what, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        /*
         * What is free now, with our context made (about 0.5 GiB on an H100 with CUDA 13), less
         * the headroom; whole 2 MiB segments only: the pool never asks for less.
         */
        d->capacity_bytes = free_bytes > headroom_bytes ? (free_bytes - headroom_bytes) & ~((2ULL << 20) - 1) : 0;
        if (d->capacity_bytes == 0) {
                snprintf(err, err_size, "GPU %d (%s): --headroom %s leaves nothing of its %s free", ordinal, d->name,
                         gp_size_format(headroom_bytes, cap_s, sizeof(cap_s)),
                         gp_size_format(free_bytes, free_s, sizeof(free_s)));
                return -EINVAL;
        }
        backend_uuid_text((const uint8_t *) d->uuid.bytes, is_mig(d), uuid);
        log_info("cuda: device %u (GPU %d): %s (%s), %s total, %s free now, pool capacity %s", index, ordinal, d->name,
                 uuid, gp_size_format(total_bytes, total_s, sizeof(total_s)),
                 gp_size_format(free_bytes, free_s, sizeof(free_s)), gp_size_format(d->capacity_bytes, cap_s, sizeof(cap_s)));
        return 0;
}

int backend_cuda_open(uint64_t headroom_bytes, bool vmm, struct backend **ret, char *err, size_t err_size) {
        struct cuda_backend *c = calloc(1, sizeof(*c));
        int count = 0, r;

        if (!c) {
                snprintf(err, err_size, "out of memory");
                return -ENOMEM;
        }
        c->ops = cuda_ops;
        c->base.ops = &c->ops;
        c->base.name = vmm ? "cuda-vmm" : "cuda";
        c->base.ipc_handles = !vmm;
        c->base.no_adopt_why = "its segments lived in the daemon's context and went with it";
        c->vmm = vmm;
        c->ops.mem_seal = vmm ? cuda_mem_seal : cuda_legacy_seal;
        gp_rb_init(&c->files, cmp_file);
        if (vmm) {
                int k = kcmp_probe();

                c->named = k == 0;
                if (c->named) {
                        /* It adopts what clients kept from a daemon before this one. */
                        c->ops.mem_adopt = cuda_mem_adopt;
                        c->ops.mem_ident = cuda_mem_ident;
                } else {
                        snprintf(c->no_adopt_why, sizeof(c->no_adopt_why), "kcmp(2) is refused here (%s), and "
                                 "without it the daemon cannot tell two descriptors of the same memory apart", strerror(-k));
                        c->base.no_adopt_why = c->no_adopt_why;
                        log_warn("cuda-vmm: %s: after a restart of gpupoold, clients keep their memory uncounted until they "
                                 "give it back (allow kcmp in the seccomp filter; systemd's @system-service does)",
                                 c->no_adopt_why);
                }
        }
        c->base.data = c;
        c->headroom_bytes = headroom_bytes;
        r = gp_cuda_load(&c->cu, err, err_size);
        if (r < 0) {
                free(c);
                return r;
        }
        (void) c->cu.cuDeviceGetCount(&count);
        if (count > BACKEND_MAX_DEVICES) {
                log_warn("cuda: the node has %d GPUs; gpupoold serves the first %d", count, BACKEND_MAX_DEVICES);
                count = BACKEND_MAX_DEVICES;
        }
        log_info("cuda: driver %d.%d, %d GPU%s", c->cu.driver_version / 1000, c->cu.driver_version % 1000 / 10, count,
                 count == 1 ? "" : "s");
        for (int i = 0; i < count; i++) {
                unsigned index = c->base.device_count;

                /* Count it first: cuda_close() releases what a half-opened device retained. */
                c->base.device_count = index + 1;
                r = open_device(c, index, i, headroom_bytes, err, err_size);
                if (r < 0) {
                        cuda_close(&c->base);
                        return r;
                }
                if (r == 1) {
                        memset(&c->devs[index], 0, sizeof(c->devs[index]));
                        c->base.device_count = index;
                }
        }
        if (c->base.device_count == 0) {
                snprintf(err, err_size, "every GPU (%d) is in a compute mode that keeps it out of the pool "
                         "(EXCLUSIVE_PROCESS or PROHIBITED; see the log lines above)", count);
                cuda_close(&c->base);
                return -EPERM;
        }
        if (vmm)
                for (unsigned i = 0; i < c->base.device_count; i++)
                        c->base.fd_bytes += c->devs[i].capacity_bytes;  /* an exported descriptor per segment */
        *ret = &c->base;
        return 0;
}
