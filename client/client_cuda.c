/*
 * client_cuda.c: libgpupool's side of the cuda backend.
 *
 * Devices: the daemon names its GPUs by UUID, because ordinals differ between processes
 * ($CUDA_VISIBLE_DEVICES renumbers them). At connect the library asks the driver for the UUID
 * of each GPU this process sees and keeps the map from the caller's ordinal to the daemon's
 * index; a GPU's primary context (the one the CUDA runtime and the frameworks use) is
 * retained on its first allocation, not before, since creating one costs time and memory.
 *
 * Segments: a segment's IPC handle is opened once per process, with
 * cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) in the primary context, and
 * closed when the daemon says the segment holds no live block of ours.
 *
 * Stream-ordered frees: gpupool_free_async() records an event on the caller's stream and
 * returns; the block goes back to the daemon once the event has completed. A reaper thread
 * (started on the first such free) waits for the oldest pending event and then returns every
 * block whose event has completed; every allocation call also returns the completed ones
 * first. Nothing the caller calls waits for the device, except gpupool_disconnect(), which
 * must not give memory back while queued work may still touch it.
 */
#define _GNU_SOURCE
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int push(gpupool_client *c, struct client_device *d) {
        gp_cu_result r = c->cu.cuCtxPushCurrent(d->ctx);

        if (r != GP_CUDA_SUCCESS) {
                client_set_error(c, "cuCtxPushCurrent: %s", gp_cuda_error_name(&c->cu, r));
                return gp_cuda_errno(r);
        }
        return 0;
}

static void pop(gpupool_client *c) {
        gp_cu_context ctx;

        (void) c->cu.cuCtxPopCurrent(&ctx);
}

int client_cuda_setup(gpupool_client *c, const Gpupool__HelloReply *hello) {
        char err[256];
        int count = 0, r;

        for (int i = 0; i < CLIENT_MAX_DEVICES; i++)
                c->local_to_daemon[i] = -1;
        /* The CUDA side of each device starts afresh; the process's pool on it is not ours to touch. */
        for (int i = 0; i < CLIENT_MAX_DEVICES; i++) {
                struct client_device *d = &c->devices[i];

                d->visible = false;
                d->dev = 0;
                d->ctx = NULL;
                d->spare_events = NULL;
                d->spare_count = d->spare_cap = 0;
        }
        r = gp_cuda_load(&c->cu, err, sizeof(err));
        if (r < 0) {
                client_set_error(c, "%s", err);
                return r;
        }
        if (c->cu.cuDeviceGetCount(&count) != GP_CUDA_SUCCESS)
                count = 0;
        c->local_count = count < CLIENT_MAX_DEVICES ? count : CLIENT_MAX_DEVICES;
        for (int i = 0; i < c->local_count; i++) {
                gp_cu_device dev;
                gp_cu_uuid uuid;

                if (c->cu.cuDeviceGet(&dev, i) != GP_CUDA_SUCCESS || c->cu.cuDeviceGetUuid(&uuid, dev) != GP_CUDA_SUCCESS)
                        continue;
                for (unsigned d = 0; d < c->device_count; d++) {
                        const Gpupool__DeviceInfo *info = hello->devices[d];

                        if (info->has_uuid && info->uuid.len == sizeof(uuid.bytes) &&
                            memcmp(info->uuid.data, uuid.bytes, sizeof(uuid.bytes)) == 0) {
                                c->local_to_daemon[i] = (int) d;
                                c->devices[d].visible = true;
                                c->devices[d].dev = dev;
                        }
                }
        }
        return 0;
}

/* The device's primary context, retained on first use. */
static int device_ready(gpupool_client *c, struct client_device *d) {
        gp_cu_result r;

        if (d->ctx)
                return 0;
        r = c->cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
        if (r != GP_CUDA_SUCCESS) {
                d->ctx = NULL;
                client_set_error(c, "cuDevicePrimaryCtxRetain: %s", gp_cuda_error_name(&c->cu, r));
                return gp_cuda_errno(r);
        }
        return 0;
}

int client_cuda_open(gpupool_client *c, struct mapping *m) {
        struct client_device *d = &c->devices[m->device];
        gp_cu_ipc_mem_handle handle;
        gp_cu_deviceptr base = 0, range_base = 0;
        size_t range_size = 0;
        gp_cu_result r;
        int err;

        if (!d->visible) {
                client_set_error(c, "gpupoold handed out memory of a GPU this process cannot see");
                return -EPROTO;
        }
        err = device_ready(c, d);
        if (err < 0)
                return err;
        err = push(c, d);
        if (err < 0)
                return err;
        memcpy(handle.reserved, m->handle, sizeof(handle.reserved));
        r = c->cu.cuIpcOpenMemHandle(&base, handle, GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != GP_CUDA_SUCCESS) {
                pop(c);
                client_set_error(c, "cuIpcOpenMemHandle_v2 of a %llu-byte segment: %s", (unsigned long long) m->size,
                                 gp_cuda_error_name(&c->cu, r));
                return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        /* The handle opens the whole allocation: it must hold the segment the daemon described. */
        r = c->cu.cuMemGetAddressRange(&range_base, &range_size, base);
        if (r != GP_CUDA_SUCCESS || range_base != base || range_size < m->size) {
                (void) c->cu.cuIpcCloseMemHandle(base);
                pop(c);
                client_set_error(c, "the IPC handle of segment %llu opens %zu bytes, not the %llu gpupoold described",
                                 (unsigned long long) m->segment_id, range_size, (unsigned long long) m->size);
                return -EPROTO;
        }
        pop(c);
        m->base = (uint8_t *) (uintptr_t) base;
        return 0;
}

void client_cuda_close(gpupool_client *c, struct mapping *m) {
        struct client_device *d = &c->devices[m->device];

        if (push(c, d) < 0)
                return;
        (void) c->cu.cuIpcCloseMemHandle((gp_cu_deviceptr) (uintptr_t) m->base);
        pop(c);
}

static void spare_event(gpupool_client *c, struct client_device *d, gp_cu_event e) {
        if (d->spare_count == d->spare_cap) {
                unsigned cap = d->spare_cap ? d->spare_cap * 2 : 16;
                gp_cu_event *n = realloc(d->spare_events, cap * sizeof(*n));

                if (!n) {
                        (void) c->cu.cuEventDestroy(e);
                        return;
                }
                d->spare_events = n;
                d->spare_cap = cap;
        }
        d->spare_events[d->spare_count++] = e;
}

static void *reaper_main(void *arg);

int client_cuda_defer_free(gpupool_client *c, struct block *b, void *stream) {
        struct client_device *d = &c->devices[b->mapping->device];
        struct deferred *q = calloc(1, sizeof(*q));
        gp_cu_event e = NULL;
        gp_cu_result r;
        int err;

        if (!q)
                return -ENOMEM;
        err = push(c, d);
        if (err < 0) {
                free(q);
                return err;
        }
        if (d->spare_count) {
                e = d->spare_events[--d->spare_count];
                r = GP_CUDA_SUCCESS;
        } else {
                r = c->cu.cuEventCreate(&e, GP_CU_EVENT_DISABLE_TIMING);
        }
        if (r == GP_CUDA_SUCCESS) {
                r = c->cu.cuEventRecord(e, (gp_cu_stream) stream);
                if (r != GP_CUDA_SUCCESS)
                        spare_event(c, d, e);
        }
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                free(q);
                /* Typically a stream of another context than the GPU's primary one. */
                client_set_error(c, "cannot record an event on the stream: %s (the block stays allocated)",
                                 gp_cuda_error_name(&c->cu, r));
                return r == GP_CUDA_ERROR_INVALID_HANDLE || r == GP_CUDA_ERROR_INVALID_CONTEXT ? -EINVAL : -EIO;
        }
        q->block = b;
        q->stream = stream;
        q->event = e;
        q->device = b->mapping->device;
        /*
         * Live until its work ends, but nobody's to free again, nor the scope's; an allocation
         * on this same stream may take it at once (the stream orders the new work after the old).
         */
        b->freeing = true;
        (void) client_live_insert(c, b);
        if (c->deferred_tail)
                c->deferred_tail->next = q;
        else
                c->deferred_head = q;
        c->deferred_tail = q;
        if (!c->reaper_started && pthread_create(&c->reaper, NULL, reaper_main, c) == 0)
                c->reaper_started = true;
        /* Without a reaper thread the next call of this handle still returns the block. */
        pthread_cond_signal(&c->deferred_cond);
        return 0;
}

/* Frees q's block into the process's pool and recycles its event. Locked. */
static void complete(gpupool_client *c, struct deferred *q) {
        spare_event(c, &c->devices[q->device], q->event);
        if (q->block)
                (void) client_free_block(c, q->block);
        free(q);
}

void client_cuda_reap(gpupool_client *c, bool wait) {
        struct deferred **pp = &c->deferred_head, *q;

        while ((q = *pp)) {
                struct client_device *d = &c->devices[q->device];
                gp_cu_result r = GP_CUDA_ERROR_NOT_READY;

                if (push(c, d) == 0) {
                        r = wait ? c->cu.cuEventSynchronize(q->event) : c->cu.cuEventQuery(q->event);
                        pop(c);
                }
                if (r == GP_CUDA_ERROR_NOT_READY) {
                        pp = &q->next;
                        continue;
                }
                /* Done, or the context failed and no more of its work will run: either way the block is free. */
                *pp = q->next;
                complete(c, q);
        }
        c->deferred_tail = NULL;
        for (q = c->deferred_head; q; q = q->next)
                c->deferred_tail = q;
}

static void *reaper_main(void *arg) {
        gpupool_client *c = arg;

        pthread_mutex_lock(&c->lock);
        for (;;) {
                struct deferred *oldest;
                struct client_device *d;
                gp_cu_event e;

                while (!c->stopping && !c->deferred_head)
                        pthread_cond_wait(&c->deferred_cond, &c->lock);
                if (c->stopping)
                        break;
                oldest = c->deferred_head;
                d = &c->devices[oldest->device];
                e = oldest->event;
                /*
                 * Wait without the lock, so the application's calls go on meanwhile. Another
                 * thread may complete this free and reuse the event meanwhile, which only makes
                 * this wait end sooner or later; events are destroyed only after we are joined.
                 */
                pthread_mutex_unlock(&c->lock);
                if (c->cu.cuCtxPushCurrent(d->ctx) == GP_CUDA_SUCCESS) {
                        (void) c->cu.cuEventSynchronize(e);
                        pop(c);
                }
                pthread_mutex_lock(&c->lock);
                client_cuda_reap(c, false);
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
}

void client_cuda_forget_deferred(gpupool_client *c) {
        struct deferred *q;

        while ((q = c->deferred_head)) {
                c->deferred_head = q->next;
                /* Its block, live and marked freeing, goes with the live table (drop_everything()). */
                spare_event(c, &c->devices[q->device], q->event);
                free(q);
        }
        c->deferred_tail = NULL;
}

void client_cuda_teardown(gpupool_client *c) {
        if (c->reaper_started) {
                c->stopping = true;
                pthread_cond_broadcast(&c->deferred_cond);
                pthread_mutex_unlock(&c->lock);
                pthread_join(c->reaper, NULL);
                pthread_mutex_lock(&c->lock);
                c->reaper_started = false;
        }
        for (unsigned i = 0; i < c->device_count; i++) {
                struct client_device *d = &c->devices[i];

                if (d->ctx && push(c, d) == 0) {
                        for (unsigned k = 0; k < d->spare_count; k++)
                                (void) c->cu.cuEventDestroy(d->spare_events[k]);
                        pop(c);
                }
                free(d->spare_events);
                d->spare_events = NULL;
                d->spare_count = d->spare_cap = 0;
                if (d->ctx)
                        (void) c->cu.cuDevicePrimaryCtxRelease(d->dev);
                d->ctx = NULL;
        }
}
