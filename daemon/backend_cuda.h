/*
 * backend_cuda.h: what the cuda backend's two files share (backend_cuda.c, the backend and its
 * legacy IPC segments; backend_cuda_vmm.c, cuda-vmm's cuMemCreate segments): the backend's and
 * its devices' state, the primary context made current around a driver call, and cuda-vmm's
 * calls. Not for the rest of the daemon, which reaches a backend through backend.h's table.
 */
#ifndef GP_BACKEND_CUDA_H
#define GP_BACKEND_CUDA_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "cudadrv.h"
#include "log.h"

struct cuda_device {
        int ordinal;                    /* the daemon's CUDA ordinal (cuda-vmm's location id) */
        gp_cu_device dev;
        gp_cu_context ctx;              /* the primary context, retained */
        gp_cu_stream stream;            /* for zeroing: polled by an event, never synchronized */
        uint64_t capacity_bytes;
        unsigned exports_ahead;         /* cuda-vmm: descriptors held ahead of their send (mem_export_ahead) */
        int kept_export_fd;             /* cuda-vmm: an export kept open for the daemon's life (cuda_vmm_keep_export()); -1: none */
        gp_cu_mem_handle kept_export_handle;    /* its memory's handle, held with it */
        gp_cu_uuid uuid;
        char name[96];
};

struct cuda_backend {
        struct backend base;
        struct gp_cuda cu;
        bool vmm;                       /* cuda-vmm: cuMemCreate segments, exported as descriptors */
        bool block_ids;                 /* cuda-vmm: the driver's memory block ids name allocations (cuda_vmm_identify()) */
        bool keep_export;               /* cuda-vmm: keep one export open per GPU (export_keepalive) */
        gp_cu_result (*pointer_attribute)(void *data, int attribute, gp_cu_deviceptr p);      /* cuPointerGetAttribute */
        struct backend_ops ops;         /* cuda_ops, and cuda-vmm's */
        uint64_t headroom_bytes;        /* --headroom: left free on each GPU for everyone else */
        struct cuda_device devs[BACKEND_MAX_DEVICES];
};

static inline struct cuda_backend *cuda_of(struct backend *b) {
        return (struct cuda_backend *) b;
}

/* Makes the device's primary context current for a driver call; pair with cuda_pop(). */
static inline int cuda_push(struct cuda_backend *c, struct cuda_device *d) {
        gp_cu_result r = c->cu.cuCtxPushCurrent(d->ctx);

        if (r != GP_CUDA_SUCCESS) {
                log_err("cuda: %s: cuCtxPushCurrent: %s", d->name, gp_cuda_error_name(&c->cu, r));
                return -EIO;
        }
        return 0;
}

static inline void cuda_pop(struct cuda_backend *c) {
        gp_cu_context ctx;

        (void) c->cu.cuCtxPopCurrent(&ctx);
}

/*
 * An entry point's device, with its primary context made current (pair with cuda_pop()); NULL with
 * *err set when there is no such device or the context cannot be made current.
 */
static inline struct cuda_device *cuda_enter(struct cuda_backend *c, unsigned device, int *err) {
        if (device >= c->base.device_count) {
                *err = -ENODEV;
                return NULL;
        }
        *err = cuda_push(c, &c->devs[device]);
        return *err < 0 ? NULL : &c->devs[device];
}

/*
 * cuda-vmm (backend_cuda_vmm.c). Each is called with d's context made current (cuda_enter()).
 * cuda_vmm_setup() fills what cuda-vmm adds to the backend (sealing, adoption, exports), before
 * any device opens; cuda_vmm_identify(), once they are open, asks the driver whether it names
 * allocations, and where it does, names segments by it (mem_ident) and logs which it found.
 */
void cuda_vmm_setup(struct cuda_backend *c);
void cuda_vmm_identify(struct cuda_backend *c);
/* Whether GPU d has what cuda-vmm needs; as open_device() reports it (see backend_cuda_vmm.c). */
int cuda_vmm_supported(struct cuda_backend *c, struct cuda_device *d, gp_cu_result *r, const char **what, char *err,
                       size_t err_size);
/*
 * Keeps one export of a 2 MiB allocation of GPU d open for the daemon's life, so that no lease's
 * export finds none open on the host (the driver's price of that is in backend_cuda_vmm.c), and
 * logs that it does; logs why where it cannot, and the daemon goes on without it. Before the
 * device's capacity is read: the capacity leaves its 2 MiB out. cuda_vmm_drop_export() lets go
 * of it (pushed), at the backend's close.
 */
void cuda_vmm_keep_export(struct cuda_backend *c, struct cuda_device *d);
void cuda_vmm_drop_export(struct cuda_backend *c, struct cuda_device *d);
/* A segment of size bytes: reserved, made, exported and mapped. Returns 0, -ENOMEM or -EIO. */
int cuda_vmm_create(struct cuda_backend *c, struct cuda_device *d, uint64_t size, struct backend_mem *ret);
/* Lets go of everything of the segment: its memory, its descriptor, its range. */
void cuda_vmm_destroy(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size);
/* Fresh memory under the segment's range, for one changing uid. Returns 0, -ENOMEM or -EIO (then it has none). */
int cuda_vmm_fresh(struct cuda_backend *c, struct cuda_device *d, struct backend_mem *mem, uint64_t size);

#endif
