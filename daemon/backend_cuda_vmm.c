/*
 * backend_cuda_vmm.c: the cuda-vmm backend's segments (backend_cuda.h): each a cuMemCreate
 * allocation, mapped in the daemon (for zeroing) and exported as a POSIX descriptor only to be
 * sent (vmm_mem_export), so that the daemon holds allocation handles, not a descriptor per
 * segment: its descriptors do not grow with the GPUs (one per 2 MiB granule would be ~72,000 on
 * one H200, more than a container's usual hard limit). Such memory outlives the daemon (clients
 * hold handles and mappings of it). The driver exports no imported memory, so a client cannot
 * hand a daemon after this one what it holds: that one counts it by the client's word
 * (adopts_held); it adopts descriptors (vmm_mem_adopt) of named objects from systemd's store,
 * and of memory a client made itself, knowing an allocation by the driver's name for it where
 * the driver gives one (cuda_vmm_identify()). A named object's segment is made read-only in the
 * daemon's mapping (vmm_mem_seal): the driver has no seal.
 */
#define _GNU_SOURCE
#include "backend_cuda.h"

#include <errno.h>
#include <fcntl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VMM_ATTRIBUTE_MEMORY_BLOCK_ID 20        /* CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID */

static gp_cu_mem_prop vmm_prop(const struct cuda_device *d) {
        return (gp_cu_mem_prop) {
                .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
                .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal },
        };
}

/*
 * The driver's name for the allocation mapped at va (CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID), where
 * cuda_vmm_identify() found that it names allocations, not imports; else 0. Pushed.
 */
static uint64_t vmm_block_id(struct cuda_backend *c, gp_cu_deviceptr va) {
        unsigned long long id = 0;

        if (!c->block_ids || c->pointer_attribute(&id, VMM_ATTRIBUTE_MEMORY_BLOCK_ID, va) != GP_CUDA_SUCCESS)
                return 0;
        return id;
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
 * Fresh physical memory for a segment: made, and mapped at va (the daemon's own mapping, for
 * zeroing). Pushed. Returns a driver result; on failure nothing is left.
 */
static gp_cu_result vmm_make(struct cuda_backend *c, struct cuda_device *d, uint64_t size, gp_cu_deviceptr va,
                             gp_cu_mem_handle *ret_handle) {
        gp_cu_mem_prop prop = vmm_prop(d);
        gp_cu_mem_handle h;
        gp_cu_result r;

        r = c->cu.cuMemCreate(&h, size, &prop, 0);
        if (r != GP_CUDA_SUCCESS)
                return r;
        r = vmm_map(c, d, va, size, h);
        if (r != GP_CUDA_SUCCESS) {
                (void) c->cu.cuMemRelease(h);
                return r;
        }
        *ret_handle = h;
        return GP_CUDA_SUCCESS;
}

/* The descriptor held ahead for mem (vmm_mem_export_ahead()), now the caller's; -1 where none is held. */
static int take_ahead(struct cuda_device *d, struct backend_mem *mem) {
        if (!mem->exported_ahead)
                return -1;
        mem->exported_ahead = false;
        d->exports_ahead--;
        return mem->export_fd;
}

/* Lets go of a segment's physical memory: its descriptor held ahead, the daemon's mapping, where it made one, and its handle. Pushed. */
static void vmm_unmake(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_result r = GP_CUDA_SUCCESS;
        int ahead = take_ahead(d, mem);

        if (ahead >= 0)
                close(ahead);
        mem->ident = 0;
        if (!mem->vmm_handle)
                return;         /* it has none (fresh memory for it could not be made) */
        if (mem->vmm_mapped)
                r = c->cu.cuMemUnmap(mem->addr, size);
        mem->vmm_mapped = false;
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuMemRelease(mem->vmm_handle);
        if (r != GP_CUDA_SUCCESS)
                log_err("cuda-vmm: %s: letting go of a %llu-byte segment: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
        mem->vmm_handle = 0;
}

/*
 * The driver copies every exported object into one internal client for the whole host, which it
 * builds (a client, a device and a subdevice, each a round trip to the GPU's firmware) when the
 * host's count of open exports leaves zero, and tears down when the last one anywhere is closed
 * (NVIDIA's open kernel modules, 580 branch, rmobjexportimport.c). A lease's export is sent and
 * closed, and the client closes its copy once imported: with no other export open, every lease
 * paid the build and its client the teardown, about 0.6 ms each on an H200 where an export costs
 * 20-35 us (bench/results/2026-11-28-H200-2813daa/). One export kept open keeps the count above
 * zero. Its memory, the one granule it needs, is held by its handle too, as every segment's is,
 * not by a descriptor alone (which the driver does not document as keeping memory alive).
 */
void cuda_vmm_keep_export(struct cuda_backend *c, struct cuda_device *d) {
        gp_cu_mem_prop prop = vmm_prop(d);
        gp_cu_mem_handle h;
        gp_cu_result r;
        int fd = -1;

        r = c->cu.cuMemCreate(&h, 2ULL << 20, &prop, 0);
        if (r == GP_CUDA_SUCCESS && (r = c->cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                                           0)) != GP_CUDA_SUCCESS)
                (void) c->cu.cuMemRelease(h);
        if (r != GP_CUDA_SUCCESS) {
                log_warn("cuda-vmm: GPU %d (%s): no export kept open (%s): each lease's export may cost the driver's "
                         "build of its export client, about 0.6 ms", d->ordinal, d->name, gp_cuda_error_name(&c->cu, r));
                return;
        }
        (void) fcntl(fd, F_SETFD, FD_CLOEXEC);  /* the driver's descriptor: whether it is close-on-exec is not said */
        d->kept_export_fd = fd;
        d->kept_export_handle = h;
        log_info("cuda-vmm: GPU %d (%s): one 2 MiB export kept open for the daemon's life (export_keepalive), so that "
                 "a lease's export costs the driver's price, not the build of its export client", d->ordinal, d->name);
}

void cuda_vmm_drop_export(struct cuda_backend *c, struct cuda_device *d) {
        if (d->kept_export_fd < 0)
                return;
        close(d->kept_export_fd);
        (void) c->cu.cuMemRelease(d->kept_export_handle);
        d->kept_export_fd = -1;
        d->kept_export_handle = 0;
}

/*
 * A new segment: its memory made, and a range of the daemon's for it. The daemon maps it there
 * only where the driver's block ids name allocations (to know the segment by its id; the id is
 * given before any cuMemSetAccess, as an H200 answered bench/vmm_probe.c), and otherwise when it
 * must zero or seal it (cuda_vmm_fresh(), vmm_mem_seal()): on the request's path a segment costs
 * its create, and its export when it is sent, not a mapping and an access nobody uses.
 */
int cuda_vmm_create(struct cuda_backend *c, struct cuda_device *d, uint64_t size, struct backend_mem *ret) {
        gp_cu_mem_prop prop = vmm_prop(d);
        gp_cu_deviceptr va = 0;
        gp_cu_mem_handle h = 0;
        gp_cu_result r;

        r = c->cu.cuMemAddressReserve(&va, size, 0, 0, 0);
        if (r == GP_CUDA_SUCCESS) {
                r = c->cu.cuMemCreate(&h, size, &prop, 0);
                if (r == GP_CUDA_SUCCESS && c->block_ids && (r = c->cu.cuMemMap(va, size, 0, h, 0)) != GP_CUDA_SUCCESS)
                        (void) c->cu.cuMemRelease(h);
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
        ret->fd = -1;
        ret->addr = va;
        ret->vmm_handle = h;
        ret->vmm_mapped = c->block_ids;
        ret->ident = c->block_ids ? vmm_block_id(c, va) : 0;
        return 0;
}

void cuda_vmm_destroy(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_result r;

        vmm_unmake(c, d, mem, size);
        r = c->cu.cuMemAddressFree(mem->addr, size);
        if (r != GP_CUDA_SUCCESS)
                log_err("cuda-vmm: %s: cuMemAddressFree: %s", d->name, gp_cuda_error_name(&c->cu, r));
        mem->addr = 0;
        if (mem->fd >= 0) {
                close(mem->fd);         /* an adopted object's descriptor (vmm_mem_adopt()) */
                mem->fd = -1;
        }
}

/*
 * A process may keep the descriptor or a mapping of memory it gave back: memory that changes
 * uid is therefore fresh, never the old zeroed, and the old goes to whoever still holds it.
 * (Fresh memory is zeroed all the same: the driver does not say it is.)
 */
int cuda_vmm_fresh(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size) {
        gp_cu_mem_handle h;
        gp_cu_result r;

        vmm_unmake(c, d, mem, size);
        r = vmm_make(c, d, size, mem->addr, &h);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: fresh memory for a segment changing uid: %s", d->name, gp_cuda_error_name(&c->cu, r));
                /* The segment has no memory now: the pool destroys it, which frees only its range. */
                mem->vmm_handle = 0;
                return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        mem->vmm_handle = h;
        mem->vmm_mapped = true;         /* and accessible, to be zeroed */
        mem->ident = vmm_block_id(c, mem->addr);
        return 0;
}

/*
 * cuda-vmm: a segment a client kept from a daemon before this one: a descriptor the driver
 * exported of memory on this GPU that maps as size bytes. It is imported, mapped in a range of
 * the daemon's (for zeroing) and named by the driver's name for it, where there is one. The
 * driver exports no imported memory again (an H200, driver 580.159.04: CUDA_ERROR_INVALID_VALUE,
 * bench/results/2026-11-28-H200-d2ec017/), so a named object's descriptor (sealed: from
 * systemd's store) is kept, *ret's, for the attachers' copies (vmm_mem_export()); any other
 * stays the caller's, to close, and its segment is nobody's after its process's (adopts_held).
 * Memory the client made itself passes too, and is counted as the client's like any other. The
 * driver does not say an allocation's size: one larger than size maps as size bytes, and the
 * rest is the client's own.
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
        memset(ret, 0, sizeof(*ret));
        ret->fd = sealed ? fd : -1;
        ret->addr = va;
        ret->vmm_handle = h;
        ret->vmm_mapped = true;
        ret->ident = vmm_block_id(c, va);
        cuda_pop(c);
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
        /* Mapped here for the first time where it was never zeroed or named: read-only from the start. */
        r = mem->vmm_mapped ? GP_CUDA_SUCCESS : c->cu.cuMemMap(mem->addr, size, 0, mem->vmm_handle, 0);
        if (r == GP_CUDA_SUCCESS) {
                mem->vmm_mapped = true;
                r = vmm_read_only(c, d, mem->addr, size);
        }
        cuda_pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: making a %llu-byte object read-only: %s", d->name, (unsigned long long) size,
                        gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 0;
}

static uint64_t vmm_mem_ident(struct backend *b, unsigned device, const struct backend_mem *mem) {
        (void) b, (void) device;
        return mem->ident;
}

/*
 * cuda-vmm: a descriptor of the segment's memory for one send (a named object's too: read-only
 * is the attacher's mapping, not the file): the one exported ahead, handed over, else exported
 * now; or a copy of the one an adopted object came with, which the driver would not export
 * again. The caller closes it.
 */
static int vmm_mem_export(struct backend *b, unsigned device, struct backend_mem *mem, bool read_only) {
        struct cuda_backend *c = cuda_of(b);
        struct cuda_device *d;
        gp_cu_result r;
        int err, fd = -1;

        (void) read_only;
        if (mem->exported_ahead && device < b->device_count)
                return take_ahead(&c->devs[device], mem);
        if (mem->fd >= 0)
                return (fd = fcntl(mem->fd, F_DUPFD_CLOEXEC, 3)) < 0 ? -errno : fd;
        if (!mem->vmm_handle)
                return -ENOENT;
        if (!(d = cuda_enter(c, device, &err)))
                return err;
        r = c->cu.cuMemExportToShareableHandle(&fd, mem->vmm_handle, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        cuda_pop(c);
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda-vmm: %s: exporting a segment as a descriptor: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return fd;
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

/*
 * cuda-vmm: the segment's descriptor exported now, kept for its next send (vmm_mem_export()), so
 * that a granule of the stock costs its lease no export: at most most per device.
 */
static int vmm_mem_export_ahead(struct backend *b, unsigned device, struct backend_mem *mem, unsigned most) {
        struct cuda_backend *c = cuda_of(b);
        int fd;

        if (device >= b->device_count)
                return -ENODEV;
        if (mem->exported_ahead || !mem->vmm_handle || mem->fd >= 0)
                return 0;       /* held already, or nothing of its own to export (an adopted object's descriptor) */
        if (c->devs[device].exports_ahead >= most)
                return -ENOSPC;
        if ((fd = vmm_mem_export(b, device, mem, false)) < 0)
                return fd;
        mem->export_fd = fd;
        mem->exported_ahead = true;
        c->devs[device].exports_ahead++;
        return 0;
}

void cuda_vmm_setup(struct cuda_backend *c) {
        c->ops.mem_seal = vmm_mem_seal;
        c->ops.mem_adopt = vmm_mem_adopt;
        c->ops.mem_export = vmm_mem_export;
        c->ops.mem_export_ahead = vmm_mem_export_ahead;
}

/*
 * Whether the driver's CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID names allocations, so that two
 * descriptors of one allocation are known as one memory: asked of the driver itself, on GPU d,
 * with an allocation mapped as created and through two imports of two exports of it (as the old
 * daemon's and a restarted one's, and a client's handed back twice), beside another allocation.
 * The same id for the three and another for the other: the driver names allocations. Pushed.
 * Returns 1, or 0 with why.
 */
static int vmm_block_ids_name_allocations(struct cuda_backend *c, struct cuda_device *d, char *why, size_t why_size) {
        gp_cu_mem_prop prop = vmm_prop(d);
        gp_cu_mem_handle h[4] = { 0 };
        gp_cu_deviceptr va = 0;
        unsigned long long ids[4] = { 0 };
        const uint64_t g = 2ULL << 20;
        int fds[2] = { -1, -1 }, mapped = 0, ok = 0;
        gp_cu_result r;

        r = c->cu.cuMemAddressReserve(&va, 4 * g, 0, 0, 0);
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuMemCreate(&h[0], g, &prop, 0);
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuMemCreate(&h[3], g, &prop, 0);
        for (int i = 0; i < 2 && r == GP_CUDA_SUCCESS; i++)
                r = c->cu.cuMemExportToShareableHandle(&fds[i], h[0], GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        for (int i = 0; i < 2 && r == GP_CUDA_SUCCESS; i++)
                r = c->cu.cuMemImportFromShareableHandle(&h[1 + i], (void *) (uintptr_t) fds[i],
                                                         GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        for (; mapped < 4 && r == GP_CUDA_SUCCESS; mapped++)
                r = c->cu.cuMemMap(va + (uint64_t) mapped * g, g, 0, h[mapped], 0);
        if (r != GP_CUDA_SUCCESS && mapped < 4)
                snprintf(why, why_size, "the driver would not make, export, import and map two allocations to ask: %s",
                         gp_cuda_error_name(&c->cu, r));
        for (int i = 0; i < 4 && r == GP_CUDA_SUCCESS; i++) {
                r = c->pointer_attribute(&ids[i], VMM_ATTRIBUTE_MEMORY_BLOCK_ID, va + (uint64_t) i * g);
                if (r != GP_CUDA_SUCCESS)
                        snprintf(why, why_size, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID) refused: %s",
                                 gp_cuda_error_name(&c->cu, r));
        }
        if (r == GP_CUDA_SUCCESS) {
                ok = ids[0] && ids[0] == ids[1] && ids[1] == ids[2] && ids[3] != ids[0];
                if (!ok)
                        snprintf(why, why_size, "the driver's memory block ids name mappings, not allocations (an "
                                 "allocation's own %llu, its imports' %llu and %llu, another's %llu)", ids[0], ids[1],
                                 ids[2], ids[3]);
        }
        while (mapped--)
                (void) c->cu.cuMemUnmap(va + (uint64_t) mapped * g, g);
        for (int i = 0; i < 4; i++)
                if (h[i])
                        (void) c->cu.cuMemRelease(h[i]);
        for (int i = 0; i < 2; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        if (va)
                (void) c->cu.cuMemAddressFree(va, 4 * g);
        return ok;
}

void cuda_vmm_identify(struct cuda_backend *c) {
        struct cuda_device *d;
        char why[256] = "";
        int err;

        c->pointer_attribute = gp_cuda_symbol(&c->cu, "cuPointerGetAttribute", 4000);
        if (!c->pointer_attribute)
                snprintf(why, sizeof(why), "the driver has no cuPointerGetAttribute");
        else if ((d = cuda_enter(c, 0, &err))) {
                c->block_ids = vmm_block_ids_name_allocations(c, d, why, sizeof(why)) == 1;
                cuda_pop(c);
        } else
                snprintf(why, sizeof(why), "GPU 0's context could not be made current");
        if (c->block_ids) {
                c->ops.mem_ident = vmm_mem_ident;
                log_info("cuda-vmm: the driver names allocations (memory block ids): an adoption counts memory handed "
                         "back twice, or held already, once");
                return;
        }
        log_info("cuda-vmm: %s; an adoption cannot tell two descriptors of one allocation apart, so memory a client "
                 "hands back twice is counted twice, against its own limits (docs/security.md)", why);
}
