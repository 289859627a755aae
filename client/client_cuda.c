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
 * Streams: the caller's are asked whether they capture and what their id is with no context
 * made current (a stream is of the context it was made in); the default streams are the
 * current context's, so the GPU's primary context is pushed for them.
 *
 * Events: stream-ordered frees (client_stream.c) record one on the caller's stream in the
 * GPU's primary context, made current for it; done ones are kept per device for reuse. They are made with
 * CU_EVENT_BLOCKING_SYNC: waiting for an event without it spins the waiting thread's core
 * (cuda.h, cuEventCreate), and a training loop nearly always has a free pending.
 *
 * Graph capture: a free on a stream that is capturing a CUDA graph is refused (the event
 * would be a node of the graph, standing for no work now, and the block is the graph's for as
 * long as the graph lives). The library's own calls that a capture under way forbids in the
 * default global mode (event queries and waits, IPC opens and closes, synchronizing) run with
 * the calling thread switched to CU_STREAM_CAPTURE_MODE_RELAXED, as PyTorch's allocator does
 * around cudaMalloc, so that they never invalidate the application's capture.
 */
#define _GNU_SOURCE
#include "client_cuda.h"

#include "client_common.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(GP_IPC_HANDLE_BYTES == GP_CU_IPC_HANDLE_SIZE, "the wire's IPC handle is CUDA's");
_Static_assert(sizeof(client_event) == sizeof(gp_cu_event), "a fence's event is a CUevent");

/* What the driver keeps of one of the daemon's devices in this process. */
struct cuda_device {
        bool visible;                   /* the GPU with this UUID is visible here */
        gp_cu_device dev;               /* this process's handle for it */
        gp_cu_context ctx;              /* its primary context, retained on first use */
        /*
         * Recorded-and-done events kept for reuse. Room for every event made is kept, so that
         * putting one back never fails (and never destroys one the reaper may wait for).
         */
        gp_cu_event *spare_events;
        unsigned spare_count, spare_cap, event_count;
};

/* The handle's driver state (c->driver_state), from setup() to teardown(). */
struct cuda_state {
        struct gp_cuda cu;              /* the driver's entry points */
        struct cuda_device devices[CLIENT_MAX_DEVICES];
};

static inline struct gp_cuda *cu(gpupool_client *c) {
        return &((struct cuda_state *) c->driver_state)->cu;
}

static inline struct cuda_device *device_of(gpupool_client *c, unsigned d) {
        return &((struct cuda_state *) c->driver_state)->devices[d];
}

static int push(gpupool_client *c, struct cuda_device *d) {
        gp_cu_result r = cu(c)->cuCtxPushCurrent(d->ctx);

        if (r != GP_CUDA_SUCCESS) {
                client_set_error(c, "cuCtxPushCurrent: %s", gp_cuda_error_name(cu(c), r));
                return gp_cuda_errno(r);
        }
        return 0;
}

static void pop(gpupool_client *c) {
        gp_cu_context ctx;

        (void) cu(c)->cuCtxPopCurrent(&ctx);
}

/* Lets this thread make calls that a graph capture under way forbids; returns its mode, for unrelax(). */
static int relax(gpupool_client *c) {
        int mode = GP_CU_STREAM_CAPTURE_MODE_RELAXED;

        if (cu(c)->cuThreadExchangeStreamCaptureMode(&mode) != GP_CUDA_SUCCESS)
                return -1;
        return mode;
}

static void unrelax(gpupool_client *c, int mode) {
        if (mode >= 0)
                (void) cu(c)->cuThreadExchangeStreamCaptureMode(&mode);
}

/* d's context made current and the thread relaxed, for a call a capture would forbid (pair with leave()). */
static int enter(gpupool_client *c, struct cuda_device *d, int *ret_mode) {
        int err = push(c, d);

        *ret_mode = err == 0 ? relax(c) : -1;
        return err;
}

static void leave(gpupool_client *c, int mode) {
        unrelax(c, mode);
        pop(c);
}

/* Which of the daemon's devices (hello's) each GPU of this process is, by UUID: map[ordinal], -1 for none. */
static void match_devices(gpupool_client *c, const Gpupool__HelloReply *hello, int map[CLIENT_MAX_DEVICES]) {
        for (int i = 0; i < CLIENT_MAX_DEVICES; i++) {
                gp_cu_device dev;
                gp_cu_uuid uuid;

                map[i] = -1;
                if (i >= c->local_count || cu(c)->cuDeviceGet(&dev, i) != GP_CUDA_SUCCESS ||
                    cu(c)->cuDeviceGetUuid(&uuid, dev) != GP_CUDA_SUCCESS)
                        continue;
                for (size_t d = 0; d < hello->n_devices && d < CLIENT_MAX_DEVICES; d++) {
                        const Gpupool__DeviceInfo *info = hello->devices[d];

                        if (info->has_uuid && info->uuid.len == sizeof(uuid.bytes) &&
                            memcmp(info->uuid.data, uuid.bytes, sizeof(uuid.bytes)) == 0)
                                map[i] = (int) d;
                }
        }
}

static int cuda_setup(gpupool_client *c, const Gpupool__HelloReply *hello) {
        struct cuda_state *s;
        char err[256];
        int count = 0, r;

        for (int i = 0; i < CLIENT_MAX_DEVICES; i++)
                c->local_to_daemon[i] = -1;
        c->local_count = 0;
        /* A fresh state: the last session's went with its teardown (drop_everything()). */
        s = calloc(1, sizeof(*s));
        if (!s) {
                client_set_error(c, "out of memory for the CUDA driver's state");
                return -ENOMEM;
        }
        r = gp_cuda_load(&s->cu, err, sizeof(err));
        if (r < 0) {
                free(s);
                client_set_error(c, "%s", err);
                return r;
        }
        c->driver_state = s;
        if (cu(c)->cuDeviceGetCount(&count) != GP_CUDA_SUCCESS)
                count = 0;
        c->local_count = count < CLIENT_MAX_DEVICES ? count : CLIENT_MAX_DEVICES;
        match_devices(c, hello, c->local_to_daemon);
        for (int i = 0; i < c->local_count; i++)
                if (c->local_to_daemon[i] >= 0) {
                        struct cuda_device *d = device_of(c, (unsigned) c->local_to_daemon[i]);

                        d->visible = true;
                        (void) cu(c)->cuDeviceGet(&d->dev, i);
                }
        return 0;
}

static bool cuda_same_devices(gpupool_client *c, const Gpupool__HelloReply *hello) {
        int map[CLIENT_MAX_DEVICES];

        if (hello->n_devices != c->device_count)
                return false;
        match_devices(c, hello, map);
        return memcmp(map, c->local_to_daemon, sizeof(map)) == 0;
}

/* The device's primary context, retained on first use. */
static int device_ready(gpupool_client *c, struct cuda_device *d) {
        gp_cu_result r;

        if (d->ctx)
                return 0;
        r = cu(c)->cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
        if (r != GP_CUDA_SUCCESS) {
                d->ctx = NULL;
                client_set_error(c, "cuDevicePrimaryCtxRetain: %s", gp_cuda_error_name(cu(c), r));
                return gp_cuda_errno(r);
        }
        return 0;
}

/*
 * The device a leased segment is on, with its context retained and made current for mapping
 * the segment (pair with pop()). Returns 0 or a negative errno with the error set.
 */
static int segment_device_enter(gpupool_client *c, struct cuda_device *d) {
        int err;

        if (!d->visible) {
                client_set_error(c, "gpupoold handed out memory of a GPU this process cannot see");
                return -EPROTO;
        }
        err = device_ready(c, d);
        return err < 0 ? err : push(c, d);
}

int client_cuda_open(gpupool_client *c, struct mapping *m) {
        struct cuda_device *d = device_of(c, m->device);
        gp_cu_ipc_mem_handle handle;
        gp_cu_deviceptr base = 0, range_base = 0;
        size_t range_size = 0;
        gp_cu_result r;
        int err, mode;

        err = segment_device_enter(c, d);
        if (err < 0)
                return err;
        memcpy(handle.reserved, m->handle, sizeof(handle.reserved));
        mode = relax(c);
        r = cu(c)->cuIpcOpenMemHandle(&base, handle, GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        unrelax(c, mode);
        if (r != GP_CUDA_SUCCESS) {
                pop(c);
                client_set_error(c, "cuIpcOpenMemHandle_v2 of a %llu-byte segment: %s", (unsigned long long) m->size,
                                 gp_cuda_error_name(cu(c), r));
                return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        /* The handle opens the whole allocation: it must hold the segment the daemon described. */
        r = cu(c)->cuMemGetAddressRange(&range_base, &range_size, base);
        if (r != GP_CUDA_SUCCESS || range_base != base || range_size < m->size) {
                mode = relax(c);
                (void) cu(c)->cuIpcCloseMemHandle(base);
                leave(c, mode);
                client_set_error(c, "the IPC handle of segment %llu opens %zu bytes, not the %llu gpupoold described",
                                 (unsigned long long) m->segment_id, range_size, (unsigned long long) m->size);
                return -EPROTO;
        }
        pop(c);
        m->base = (uint8_t *) (uintptr_t) base;
        return 0;
}

void client_cuda_close(gpupool_client *c, struct mapping *m) {
        struct cuda_device *d = device_of(c, m->device);
        int mode;

        if (enter(c, d, &mode) < 0)
                return;
        (void) cu(c)->cuIpcCloseMemHandle((gp_cu_deviceptr) (uintptr_t) m->base);
        leave(c, mode);
}

/* A driver call's failure as the error, and its errno. */
static int vmm_failed(gpupool_client *c, const char *what, uint64_t size, gp_cu_result r) {
        client_set_error(c, "cuda-vmm: %s of %llu bytes: %s", what, (unsigned long long) size, gp_cuda_error_name(cu(c), r));
        return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

int client_cuda_reserve(gpupool_client *c, unsigned i, uint64_t bytes, uint64_t align, uint8_t **ret) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_deviceptr va = 0;
        gp_cu_result r;
        int err, mode;

        err = segment_device_enter(c, d);
        if (err < 0)
                return err;
        mode = relax(c);
        r = cu(c)->cuMemAddressReserve(&va, bytes, align, 0, 0);
        leave(c, mode);
        if (r != GP_CUDA_SUCCESS)
                return vmm_failed(c, "cuMemAddressReserve", bytes, r);
        *ret = (uint8_t *) (uintptr_t) va;
        return 0;
}

void client_cuda_unreserve(gpupool_client *c, unsigned i, uint8_t *base, uint64_t bytes) {
        struct cuda_device *d = device_of(c, i);
        int mode;

        if (enter(c, d, &mode) < 0)
                return;
        (void) cu(c)->cuMemAddressFree((gp_cu_deviceptr) (uintptr_t) base, bytes);
        leave(c, mode);
}

int client_cuda_import(gpupool_client *c, unsigned i, int fd, uint64_t size, gp_cu_mem_handle *ret) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_result r;
        int err, mode;

        err = segment_device_enter(c, d);
        if (err < 0)
                return err;
        mode = relax(c);
        /* The descriptor by value, as the driver takes it; the handle holds the memory from here. */
        r = cu(c)->cuMemImportFromShareableHandle(ret, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        leave(c, mode);
        return r == GP_CUDA_SUCCESS ? 0 : vmm_failed(c, "cuMemImportFromShareableHandle", size, r);
}

void client_cuda_release(gpupool_client *c, unsigned i, gp_cu_mem_handle h) {
        struct cuda_device *d = device_of(c, i);
        if (push(c, d) < 0)
                return;
        (void) cu(c)->cuMemRelease(h);
        pop(c);
}

int client_cuda_map(gpupool_client *c, unsigned i, uint8_t *va, uint64_t size, gp_cu_mem_handle h) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_result r;
        int err, mode;

        err = enter(c, d, &mode);
        if (err < 0)
                return err;
        r = cu(c)->cuMemMap((gp_cu_deviceptr) (uintptr_t) va, size, 0, h, 0);
        leave(c, mode);
        return r == GP_CUDA_SUCCESS ? 0 : vmm_failed(c, "cuMemMap", size, r);
}

int client_cuda_access(gpupool_client *c, unsigned i, uint8_t *va, uint64_t size, bool writable) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_mem_access_desc rw = {
                .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = (int) d->dev },
                .flags = writable ? GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE : GP_CU_MEM_ACCESS_FLAGS_PROT_READ,
        };
        gp_cu_result r;
        int err, mode;

        err = enter(c, d, &mode);
        if (err < 0)
                return err;
        r = cu(c)->cuMemSetAccess((gp_cu_deviceptr) (uintptr_t) va, size, &rw, 1);
        leave(c, mode);
        return r == GP_CUDA_SUCCESS ? 0 : vmm_failed(c, "cuMemSetAccess", size, r);
}

int client_cuda_zero(gpupool_client *c, unsigned i, uint8_t *p, uint64_t n) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_result r = GP_CUDA_SUCCESS;
        int err, mode;

        err = enter(c, d, &mode);
        if (err < 0)
                return err;
        /* On the legacy stream, then everything the context has queued: nothing writes after. */
        if (n)
                r = cu(c)->cuMemsetD8Async((gp_cu_deviceptr) (uintptr_t) p, 0, n, NULL);
        if (r == GP_CUDA_SUCCESS)
                r = cu(c)->cuCtxSynchronize();
        leave(c, mode);
        if (r != GP_CUDA_SUCCESS) {
                client_set_error(c, "cuda-vmm: zeroing %llu bytes on GPU %d: %s", (unsigned long long) n, (int) d->dev,
                                 gp_cuda_error_name(cu(c), r));
                return -EIO;
        }
        return 0;
}

int client_cuda_unmap(gpupool_client *c, unsigned i, uint8_t *va, uint64_t size) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_result r;
        int mode;

        if (enter(c, d, &mode) < 0)
                return -EIO;
        r = cu(c)->cuMemUnmap((gp_cu_deviceptr) (uintptr_t) va, size);
        leave(c, mode);
        return r == GP_CUDA_SUCCESS ? 0 : -EIO;
}

/* CUstream handles that name a stream of the current context: NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD. */
static bool is_default_stream(const void *stream) {
        return (uintptr_t) stream <= 2;
}

/*
 * What ask says, of stream: whether it is capturing a graph (*ret_capturing), and if not its
 * id. cuStreamGetId on a capturing stream fails and invalidates the capture, in every capture
 * mode: ask first.
 */
static gp_cu_result ask_stream(gpupool_client *c, void *stream, unsigned ask, int *ret_capturing, unsigned long long *ret_id,
                               const char **ret_call) {
        int status = GP_CU_STREAM_CAPTURE_STATUS_NONE;
        gp_cu_result r;

        *ret_capturing = 0;
        *ret_call = "cuStreamIsCapturing";
        if (ask & CLIENT_ASK_CAPTURE) {
                r = cu(c)->cuStreamIsCapturing((gp_cu_stream) stream, &status);
                /* The legacy default stream while a blocking stream captures: capturing too. */
                *ret_capturing = r == GP_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
                                 (r == GP_CUDA_SUCCESS && status != GP_CU_STREAM_CAPTURE_STATUS_NONE);
                if (*ret_capturing || r != GP_CUDA_SUCCESS)
                        return *ret_capturing ? GP_CUDA_SUCCESS : r;
        }
        *ret_call = "cuStreamGetId";
        return ask & CLIENT_ASK_ID ? cu(c)->cuStreamGetId((gp_cu_stream) stream, ret_id) : GP_CUDA_SUCCESS;
}

/*
 * Neither call needs the library's context for a stream the caller made: a stream is of the
 * context it was made in. A default stream is the current context's, so d's is made current
 * for one; and should the driver refuse the calls without it, they are made again with it.
 */
static int cuda_stream_id(gpupool_client *c, unsigned i, void *stream, unsigned ask, unsigned long long *ret) {
        struct cuda_device *d = device_of(c, i);
        bool pushed = is_default_stream(stream);
        const char *call;
        gp_cu_result r;
        int err, capturing;

        if (pushed && (err = push(c, d)) < 0)
                return err;
        r = ask_stream(c, stream, ask, &capturing, ret, &call);
        if (r != GP_CUDA_SUCCESS && !pushed && push(c, d) == 0) {
                pushed = true;
                r = ask_stream(c, stream, ask, &capturing, ret, &call);
        }
        if (pushed)
                pop(c);
        if (r != GP_CUDA_SUCCESS) {
                client_set_error(c, "%s: %s (not a stream of this process?)", call, gp_cuda_error_name(cu(c), r));
                return -EINVAL;
        }
        return capturing;
}

static void cuda_event_put(gpupool_client *c, unsigned i, client_event e) {
        struct cuda_device *d = device_of(c, i);

        /* event_get() made room for every event it made. */
        d->spare_events[d->spare_count++] = e;
}

/* A spare event of d, or a new one (with room kept to put it back). Pushed. */
static gp_cu_result event_get(gpupool_client *c, struct cuda_device *d, gp_cu_event *ret) {
        gp_cu_result r;

        if (d->spare_count) {
                *ret = d->spare_events[--d->spare_count];
                return GP_CUDA_SUCCESS;
        }
        if (d->event_count == d->spare_cap) {
                unsigned cap = d->spare_cap ? d->spare_cap * 2 : 16;
                gp_cu_event *n = realloc(d->spare_events, cap * sizeof(*n));

                if (!n)
                        return GP_CUDA_ERROR_OUT_OF_MEMORY;
                d->spare_events = n;
                d->spare_cap = cap;
        }
        r = cu(c)->cuEventCreate(ret, GP_CU_EVENT_BLOCKING_SYNC | GP_CU_EVENT_DISABLE_TIMING);
        if (r == GP_CUDA_SUCCESS)
                d->event_count++;
        return r;
}

/* An event is of the context it was made in, and is recorded with that context current. */
static int cuda_fence(gpupool_client *c, unsigned i, void *stream, unsigned long long id, unsigned ask, client_event *ret) {
        struct cuda_device *d = device_of(c, i);
        unsigned long long now_id = id;
        const char *call;
        gp_cu_event e = NULL;
        int err, capturing = 0;
        gp_cu_result r = GP_CUDA_SUCCESS;

        err = push(c, d);
        if (err < 0)
                return err;
        if (ask)
                r = ask_stream(c, stream, ask, &capturing, &now_id, &call);
        if (r != GP_CUDA_SUCCESS || capturing || now_id != id) {
                /* Capturing (a later fence), or the handle is another stream's now (none). */
                pop(c);
                return capturing ? 1 : 2;
        }
        r = event_get(c, d, &e);
        if (r == GP_CUDA_SUCCESS) {
                r = cu(c)->cuEventRecord(e, (gp_cu_stream) stream);
                if (r != GP_CUDA_SUCCESS)
                        cuda_event_put(c, i, e);
        }
        pop(c);
        if (r != GP_CUDA_SUCCESS) {
                client_set_error(c, "cannot record an event on the stream: %s", gp_cuda_error_name(cu(c), r));
                return r == GP_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        *ret = e;
        return 0;
}

static int cuda_event_done(gpupool_client *c, unsigned i, client_event e, bool wait) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_result r;
        int mode;

        if (enter(c, d, &mode) < 0)
                return -EIO;
        r = wait ? cu(c)->cuEventSynchronize(e) : cu(c)->cuEventQuery(e);
        leave(c, mode);
        if (r == GP_CUDA_SUCCESS)
                return 1;
        if (r == GP_CUDA_ERROR_NOT_READY)
                return 0;
        /* Not proof that the work ended: what waits on it stays where it is. */
        client_set_error(c, "the driver cannot tell whether device work on a freed block ended: %s "
                            "(the block stays pending until the process exits)", gp_cuda_error_name(cu(c), r));
        return -EIO;
}

static void cuda_thread_relaxed(gpupool_client *c) {
        (void) relax(c);
}

static int cuda_event_wait(gpupool_client *c, unsigned i, client_event e) {
        struct cuda_device *d = device_of(c, i);
        gp_cu_context ctx;
        gp_cu_result r;

        /* Called unlocked: the driver directly, nothing of the handle's. */
        if (cu(c)->cuCtxPushCurrent(d->ctx) != GP_CUDA_SUCCESS)
                return -EIO;
        r = cu(c)->cuEventSynchronize(e);
        (void) cu(c)->cuCtxPopCurrent(&ctx);
        return r == GP_CUDA_SUCCESS ? 0 : -EIO;
}

static int cuda_synchronize(gpupool_client *c) {
        int err = 0;

        for (unsigned i = 0; c->driver_state && i < c->device_count; i++) {
                struct cuda_device *d = device_of(c, i);
                gp_cu_result r;
                int mode;

                if (!d->ctx || enter(c, d, &mode) < 0)
                        continue;
                r = cu(c)->cuCtxSynchronize();
                leave(c, mode);
                if (r != GP_CUDA_SUCCESS) {
                        client_set_error(c, "cuCtxSynchronize on GPU %u: %s", i, gp_cuda_error_name(cu(c), r));
                        err = -EIO;
                }
        }
        return err;
}

static void cuda_teardown(gpupool_client *c) {
        if (!c->driver_state)
                return;
        for (unsigned i = 0; i < CLIENT_MAX_DEVICES; i++) {
                struct cuda_device *d = device_of(c, i);

                if (d->ctx && push(c, d) == 0) {
                        for (unsigned k = 0; k < d->spare_count; k++)
                                (void) cu(c)->cuEventDestroy(d->spare_events[k]);
                        pop(c);
                }
                free(d->spare_events);
                if (d->ctx)
                        (void) cu(c)->cuDevicePrimaryCtxRelease(d->dev);
        }
        free(c->driver_state);
        c->driver_state = NULL;
}

const struct client_driver_ops client_driver_cuda = {
        .setup = cuda_setup,
        .same_devices = cuda_same_devices,
        .stream_id = cuda_stream_id,
        .fence = cuda_fence,
        .event_done = cuda_event_done,
        .event_put = cuda_event_put,
        .event_wait = cuda_event_wait,
        .thread_relaxed = cuda_thread_relaxed,
        .synchronize = cuda_synchronize,
        .teardown = cuda_teardown,
};
