/*
 * backend_cuda_vmm.c: the cuda-vmm backend's segments (backend_cuda.h): each a cuMemCreate
 * allocation, exported as a POSIX descriptor that the lessee maps, and mapped in the daemon too
 * (for zeroing). Such memory outlives the daemon (clients hold handles and mappings of it), and
 * a daemon after this one adopts the descriptors clients kept (vmm_mem_adopt), knowing memory
 * by the file this daemon exported of it (vmm_name(), kcmp(2)). A named object's segment is
 * made read-only in the daemon's mapping (vmm_mem_seal): the driver has no seal.
 */
#define _GNU_SOURCE
#include "backend_cuda.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/kcmp.h>

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

int cuda_vmm_create(struct cuda_backend *c, struct cuda_device *d, uint64_t size, struct backend_mem *ret) {
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

void cuda_vmm_destroy(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_result r;

        vmm_unmake(c, d, mem, size);
        r = c->cu.cuMemAddressFree(mem->addr, size);
        if (r != GP_CUDA_SUCCESS)
                log_err("cuda-vmm: %s: cuMemAddressFree: %s", d->name, gp_cuda_error_name(&c->cu, r));
        mem->addr = 0;
}

/*
 * A process may keep the descriptor or a mapping of memory it gave back: memory that changes
 * uid is therefore fresh, never the old zeroed, and the old goes to whoever still holds it.
 * (Fresh memory is zeroed all the same: the driver does not say it is.)
 */
int cuda_vmm_fresh(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_mem_handle h;
        gp_cu_result r;
        int fd;

        vmm_unmake(c, d, mem, size);
        r = vmm_make(c, d, size, mem->addr, &h, &fd);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: fresh memory for a segment changing uid: %s", d->name, gp_cuda_error_name(&c->cu, r));
                /* The segment has no memory now: the pool destroys it, which frees only its range. */
                mem->vmm_handle = 0;
                return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        mem->vmm_handle = h;
        mem->fd = fd;
        return 0;
}

/*
 * cuda-vmm: a segment a client kept from a daemon before this one: a descriptor the driver
 * exported of memory on this GPU, made for descriptors, that maps as size bytes. It is imported,
 * mapped in a range of the daemon's (for zeroing) and named by its file. Memory the client made
 * itself passes too, and is counted as the client's like any other. The driver does not say an
 * allocation's size: one larger than size maps as size bytes, and the rest is the client's own.
 */
static int vmm_mem_adopt(struct backend *b, unsigned device, int fd, uint64_t size, bool sealed, struct backend_mem *ret,
                          char *why, size_t why_size) {
        struct cuda_backend *c = cuda_of(b);
        gp_cu_mem_prop prop;
        gp_cu_mem_handle h = 0;
        gp_cu_deviceptr va = 0;
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = cuda_enter(c, device, &err))) {
                snprintf(why, why_size, "on a device this daemon cannot use now");
                return err;
        }
        r = c->cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != GP_CUDA_SUCCESS) {
                cuda_pop(c);
                snprintf(why, why_size, "not memory the CUDA driver exported as a descriptor (cuMemImportFromShareableHandle: "
                         "%s)", gp_cuda_error_name(&c->cu, r));
                return -EINVAL;
        }
        /*
         * Only where the memory is, as an imported handle carries it: the driver does not say that
         * an import keeps the creator's requested handle types (on an H200, driver 580.159.04, an
         * adoption checked them and refused every client's memory), and the import itself has
         * shown that the memory was exported as a descriptor.
         */
        r = c->cu.cuMemGetAllocationPropertiesFromHandle(&prop, h);
        if (r != GP_CUDA_SUCCESS || prop.location.type != GP_CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != d->ordinal) {
                (void) c->cu.cuMemRelease(h);
                cuda_pop(c);
                if (r != GP_CUDA_SUCCESS)
                        snprintf(why, why_size, "memory whose properties the driver does not tell "
                                 "(cuMemGetAllocationPropertiesFromHandle: %s)", gp_cuda_error_name(&c->cu, r));
                else
                        snprintf(why, why_size, "not memory of GPU %d (%s): its location is %s %d (type %d, handle types "
                                 "0x%llx)", d->ordinal, d->name,
                                 prop.location.type == GP_CU_MEM_LOCATION_TYPE_DEVICE ? "GPU" : "location type",
                                 prop.location.type == GP_CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id : (int) prop.location.type,
                                 (int) prop.type, (unsigned long long) prop.requested_handle_types);
                return -EINVAL;
        }
        r = c->cu.cuMemAddressReserve(&va, size, 0, 0, 0);
        if (r == GP_CUDA_SUCCESS && (r = vmm_map(c, d, va, size, h)) != GP_CUDA_SUCCESS)
                (void) c->cu.cuMemAddressFree(va, size);
        /* A named object's: the daemon's mapping read-only again, as vmm_mem_seal() made it. */
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
                cuda_pop(c);
                if (r == GP_CUDA_ERROR_OUT_OF_MEMORY) {
                        snprintf(why, why_size, "memory the daemon has no room to map now");
                        return -ENOMEM;
                }
                snprintf(why, why_size, "memory that does not map as %llu bytes (%s)", (unsigned long long) size,
                         gp_cuda_error_name(&c->cu, r));
                return -EINVAL;
        }
        cuda_pop(c);
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
static int vmm_mem_seal(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = cuda_enter(c, device, &err)))
                return err;
        r = vmm_read_only(c, d, mem->addr, size);
        cuda_pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: making a %llu-byte object read-only: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 0;
}

static uint64_t vmm_mem_ident(struct backend *b, unsigned device, const struct backend_mem *mem) {
        struct vmm_file *f = vmm_named(cuda_of(b), mem->fd);

        (void) device;
        return f ? f->ident : 0;
}

/*
 * cuda-vmm: whether GPU d has what the backend needs (virtual memory management, descriptor
 * handles, a granularity that divides 2 MiB segments). Returns 0, with *r the driver's result
 * and *what the call when a query failed; or -ENOTSUP with a sentence in err.
 */
int cuda_vmm_supported(struct cuda_backend *c, struct cuda_device *d, gp_cu_result *r, const char **what, char *err,
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

void cuda_vmm_setup(struct cuda_backend *c) {
        int k = kcmp_probe();

        c->ops.mem_seal = vmm_mem_seal;
        gp_rb_init(&c->files, cmp_file);
        c->named = k == 0;
        if (c->named) {
                /* It adopts what clients kept from a daemon before this one. */
                c->ops.mem_adopt = vmm_mem_adopt;
                c->ops.mem_ident = vmm_mem_ident;
                return;
        }
        snprintf(c->no_adopt_why, sizeof(c->no_adopt_why), "kcmp(2) is refused here (%s), and without it the daemon "
                 "cannot tell two descriptors of the same memory apart", strerror(-k));
        c->base.no_adopt_why = c->no_adopt_why;
        log_warn("cuda-vmm: %s: after a restart of gpupoold, clients keep their memory uncounted until they give it back "
                 "(allow kcmp in the seccomp filter; systemd's @system-service does)", c->no_adopt_why);
}

void cuda_vmm_close(struct cuda_backend *c) {
        struct gp_rb_node *n;

        /* Every segment was destroyed, and forgot its name: none is left but by a bug. */
        while ((n = gp_rb_first(&c->files))) {
                gp_rb_remove(&c->files, n);
                free(gp_rb_entry(n, struct vmm_file, node));
        }
}
