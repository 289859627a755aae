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
 * cuda-vmm's segments (cuMemCreate memory, exported as descriptors, adopted after a restart)
 * are backend_cuda_vmm.c's; the legacy backend's allocations die with the daemon's context.
 *
 * Compute modes: a GPU in EXCLUSIVE_PROCESS mode (common on shared clusters) admits one
 * process's context at a time, and one in PROHIBITED mode none; gpupoold's context would lock
 * every client out of the first, and cannot exist on the second. Such GPUs are skipped with a
 * log line that says why and what to do; the pool's devices are the GPUs left, in order (the
 * clients match them by UUID). If none is left gpupoold does not start.
 */
#define _GNU_SOURCE
#include "backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "size.h"

_Static_assert(GP_IPC_HANDLE_BYTES == GP_CU_IPC_HANDLE_SIZE, "the wire's IPC handle is CUDA's");

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

        if (!(d = cuda_enter(c, device, &err)))
                return err;
        r = c->cu.cuMemGetInfo(&free_bytes, &total_bytes);
        cuda_pop(c);
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

static int cuda_mem_create(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret) {
        struct cuda_backend *c = cuda_of(b);
        gp_cu_ipc_mem_handle handle;
        gp_cu_deviceptr dptr = 0;
        struct cuda_device *d;
        gp_cu_result r;
        int err;

        if (!(d = cuda_enter(c, device, &err)))
                return err;
        if (c->vmm) {
                err = cuda_vmm_create(c, d, size, ret);
                cuda_pop(c);
                return err;
        }
        r = c->cu.cuMemAlloc(&dptr, size);
        if (r != GP_CUDA_SUCCESS) {
                cuda_pop(c);
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
                cuda_pop(c);
                return -EIO;
        }
        cuda_pop(c);
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

        if (!mem->addr || !(d = cuda_enter(c, device, &err)))
                return;
        if (mem->zeroing) {
                /* Destroyed while its zeroing runs: the driver lets the event go once it completes. */
                (void) c->cu.cuEventDestroy((gp_cu_event) mem->zeroing);
                mem->zeroing = NULL;
        }
        if (c->vmm) {
                cuda_vmm_destroy(c, d, mem, size);
                cuda_pop(c);
                return;
        }
        r = c->cu.cuMemFree(mem->addr);
        cuda_pop(c);
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

        if (!(d = cuda_enter(c, device, &err)))
                return err;
        if (c->vmm && (err = cuda_vmm_fresh(c, d, mem, size)) < 0) {
                cuda_pop(c);
                return err;
        }
        r = c->cu.cuMemsetD8Async(mem->addr, 0, size, d->stream);
        if (r == GP_CUDA_SUCCESS)
                r = c->cu.cuEventCreate(&e, GP_CU_EVENT_DISABLE_TIMING);
        if (r == GP_CUDA_SUCCESS) {
                r = c->cu.cuEventRecord(e, d->stream);
                if (r != GP_CUDA_SUCCESS)
                        (void) c->cu.cuEventDestroy(e);
        }
        cuda_pop(c);
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

        if (!(d = cuda_enter(c, device, &err)))
                return err;
        r = c->cu.cuEventQuery((gp_cu_event) mem->zeroing);
        if (r != GP_CUDA_ERROR_NOT_READY) {
                (void) c->cu.cuEventDestroy((gp_cu_event) mem->zeroing);
                mem->zeroing = NULL;
        }
        cuda_pop(c);
        if (r == GP_CUDA_ERROR_NOT_READY)
                return 0;
        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: zeroing a segment: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 1;
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

static void cuda_close(struct backend *b) {
        struct cuda_backend *c = cuda_of(b);

        for (unsigned i = 0; i < b->device_count; i++) {
                struct cuda_device *d = &c->devs[i];

                if ((d->stream || d->kept_export_fd >= 0) && cuda_push(c, d) == 0) {
                        if (d->stream)
                                (void) c->cu.cuStreamDestroy(d->stream);
                        cuda_vmm_drop_export(c, d);
                        cuda_pop(c);
                }
                if (d->ctx)
                        (void) c->cu.cuDevicePrimaryCtxRelease(d->dev);
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
        d->kept_export_fd = -1;
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
                int supported = cuda_vmm_supported(c, d, &r, &what, err, err_size);

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
        if (cuda_push(c, d) < 0) {
                snprintf(err, err_size, "GPU %d (%s): cannot make its primary context current", ordinal, d->name);
                return -EIO;
        }
        if (c->vmm && c->keep_export)
                cuda_vmm_keep_export(c, d);
        what = "cuMemGetInfo_v2";
        r = c->cu.cuMemGetInfo(&free_bytes, &total_bytes);
        if (r == GP_CUDA_SUCCESS) {
                what = "cuStreamCreate";
                r = c->cu.cuStreamCreate(&d->stream, GP_CU_STREAM_NON_BLOCKING);
        }
        cuda_pop(c);
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

int backend_cuda_open(uint64_t headroom_bytes, bool vmm, bool keep_export, struct backend **ret, char *err,
                      size_t err_size) {
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
        c->base.no_adopt_why = vmm ? NULL : "its segments lived in the daemon's context and went with it";
        c->vmm = vmm;
        c->keep_export = keep_export;
        c->ops.mem_seal = cuda_legacy_seal;
        if (vmm)
                cuda_vmm_setup(c);
        c->base.data = c;
        c->headroom_bytes = headroom_bytes;
        c->base.adopt_grows = vmm;
        c->base.adopts_held = vmm;
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
                cuda_vmm_identify(c);
        *ret = &c->base;
        return 0;
}
