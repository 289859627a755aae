/*
 * preload.c: libgpupool-run.so, which gpupool-run preloads into a program that knows nothing
 * of gpupool, so that the program's CUDA device memory comes from gpupoold's pool, under its
 * limits. It uses libgpupool's public API only (include/gpupool.h).
 *
 * A program reaches the driver three ways, and each finds the entry points here first:
 *
 *   - linked with -lcuda: the dynamic linker binds its calls by name, and a preloaded
 *     library's names come before libcuda.so.1's (cuMemAlloc_v2 and the rest below);
 *   - dlopen("libcuda.so.1") and dlsym(): dlsym() is this library's, which hands out its own
 *     entry point where the driver would hand out one it replaces, and the driver's otherwise;
 *   - cuGetProcAddress_v2 (and CUDA 11.3's cuGetProcAddress), which the CUDA runtime, dynamic
 *     or static, uses for every entry point after dlsym() found it: this library's asks the
 *     driver, and replaces what the driver answered only for the functions below, at the ABI
 *     version asked for (cuMemAlloc from 3020, the _v2 ABI; an older version, the 32-bit ABI
 *     of CUDA 2.0, goes to the driver), with every flag.
 *
 * libgpupool itself reaches the real driver: its own dlsym() calls are passed through (the
 * caller's address says whose they are), and the driver's cuGetProcAddress_v2 hands it the
 * driver's entry points.
 *
 * Served from the pool: cuMemAlloc_v2 and cuMemAllocPitch_v2 (a refusal by a limit or a full
 * device is CUDA_ERROR_OUT_OF_MEMORY, and gpupoold's sentence goes to standard error),
 * cuMemFree_v2 (the block freed after the work queued before on the legacy stream and the
 * blocking streams, as the driver orders a free: gpupool_free_async() on the legacy stream),
 * cuMemAllocAsync, cuMemFreeAsync and cuMemAllocFromPoolAsync on the default pool (of the
 * stream's device, its context's, as the driver allocates), and their
 * per-thread-stream variants (gpupool_alloc_async(), gpupool_free_async() on the stream),
 * cuMemGetInfo_v2 and cuDeviceTotalMem_v2 (the client's view: gpupool_device_memory()),
 * cuMemGetAddressRange_v2 and cuPointerGetAttribute(s)'s range (the block's own:
 * gpupool_block_range()). cuIpcGetMemHandle of a block is refused (CUDA_ERROR_NOT_SUPPORTED):
 * the handle would open its whole segment. Memory the pool did not hand out goes to the
 * driver. cuMemCreate on a GPU is the driver's, charged to the client's limits until its
 * cuMemRelease (gpupool_charge()): refused, CUDA_ERROR_OUT_OF_MEMORY, where a limit has no room.
 * Not intercepted, and so the driver's as before, outside the client's limits: a pool the
 * program made (cuMemPoolCreate), managed memory.
 *
 * The pool serves a program working in a GPU's primary context, the CUDA runtime's (and
 * libgpupool's, where the pool's memory is mapped): a context the program made itself
 * (cuCtxCreate) is the driver's, since memory mapped in one context is not another's.
 *
 * The handle connects at the first allocation (the runtime may ask for entry points before
 * cuInit), with $GPUPOOL_SOCKET and $GPUPOOL_CLIENT_NAME; a forked child connects its own.
 * With no daemon to connect to, $GPUPOOL_RUN_WITHOUT_DAEMON says what happens: "driver" (the
 * default) allocates from the driver, saying so once; "refuse" makes every allocation
 * CUDA_ERROR_OUT_OF_MEMORY, saying why.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool.h"

#define EXPORT __attribute__((visibility("default")))

/* The driver's types and results this library uses (cuda.h's, by value). */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
/* cuMemCreate's properties, as far as this library reads them (cuda.h's CUmemAllocationProp starts so). */
typedef struct {
        int type;
        int requested_handle_types;
        struct {
                int type;
                int id;
        } location;
} CUmemAllocationProp_head;
#define CU_MEM_LOCATION_TYPE_DEVICE 1
enum {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_NOT_FOUND = 500,
        CUDA_ERROR_NOT_SUPPORTED = 801,
        CUDA_ERROR_UNKNOWN = 999,
};
#define CU_STREAM_PER_THREAD ((CUstream) 0x2)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_IPC_HANDLE_SIZE 64

typedef CUresult (*gpa2_fn)(const char *symbol, void **pfn, int version, uint64_t flags, int *status);
typedef CUresult (*gpa_fn)(const char *symbol, void **pfn, int version, uint64_t flags);
typedef void *(*dlsym_fn)(void *handle, const char *name);

/* The driver, as this library reaches it. */
static struct {
        pthread_once_t once;
        void *lib;                                      /* libcuda.so.1 (or $GPUPOOL_LIBCUDA), never closed */
        dlsym_fn dlsym;                                 /* the C library's */
        gpa2_fn get_proc_address_v2;
        gpa_fn get_proc_address;
        CUresult (*mem_alloc)(CUdeviceptr *dptr, size_t size);
        CUresult (*mem_free)(CUdeviceptr dptr);
        CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
        CUresult (*mem_get_address_range)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
        CUresult (*device_total_mem)(size_t *bytes, CUdevice dev);
        CUresult (*ctx_get_device)(CUdevice *dev);
        CUresult (*ctx_get_current)(void **ctx);
        CUresult (*primary_ctx_get_state)(CUdevice dev, unsigned *flags, int *active);
        CUresult (*primary_ctx_retain)(void **ctx, CUdevice dev);
        CUresult (*primary_ctx_release)(CUdevice dev);
        CUresult (*mem_alloc_async)(CUdeviceptr *dptr, size_t size, CUstream s);
        CUresult (*mem_alloc_async_ptsz)(CUdeviceptr *dptr, size_t size, CUstream s);
        CUresult (*mem_free_async)(CUdeviceptr dptr, CUstream s);
        CUresult (*mem_free_async_ptsz)(CUdeviceptr dptr, CUstream s);
        CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s);
        CUresult (*mem_alloc_from_pool_async_ptsz)(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s);
        CUresult (*device_get_default_mem_pool)(CUmemoryPool *pool, CUdevice dev);
        CUresult (*pointer_get_attribute)(void *data, int attribute, CUdeviceptr ptr);
        CUresult (*ipc_get_mem_handle)(void *handle, CUdeviceptr dptr);
        CUresult (*mem_create)(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
                               unsigned long long flags);
        CUresult (*mem_release)(CUmemGenericAllocationHandle handle);
        CUresult (*stream_get_ctx)(CUstream s, void **ctx);
        CUresult (*ctx_push)(void *ctx);
        CUresult (*ctx_pop)(void **ctx);
} drv = { .once = PTHREAD_ONCE_INIT };

/* The handle, connected at the first allocation. */
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static gpupool_client *shared;          /* atomic once set */
static bool no_daemon;                  /* handle_lock: a connect failed; the driver's or refused, as said */
static bool refuse_without_daemon;
static pthread_mutex_t created_lock = PTHREAD_MUTEX_INITIALIZER;      /* cuMemCreate's handles (created[]) */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
        char line[1024];
        va_list ap;
        int n;

        n = snprintf(line, sizeof(line), "gpupool-run: %d: ", (int) getpid());
        va_start(ap, fmt);
        vsnprintf(line + n, sizeof(line) - (size_t) n, fmt, ap);
        va_end(ap);
        fprintf(stderr, "%s\n", line);
}

/* The C library's dlsym, whichever version this glibc gives it (found once; a race finds the same). */
static dlsym_fn libc_dlsym(void) {
        static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0" };
        static dlsym_fn found;
        dlsym_fn f = __atomic_load_n(&found, __ATOMIC_ACQUIRE);

        for (size_t i = 0; !f && i < sizeof(versions) / sizeof(versions[0]); i++)
                *(void **) &f = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        __atomic_store_n(&found, f, __ATOMIC_RELEASE);
        return f;
}

/* This thread is loading the driver: its dlsym() calls meanwhile are the driver's own. */
static __thread bool loading;

static void *driver_symbol_with(const char *name, int version, uint64_t flags) {
        void *pfn = NULL;
        int status = 0;

        if (drv.get_proc_address_v2 && drv.get_proc_address_v2(name, &pfn, version, flags, &status) == CUDA_SUCCESS)
                return pfn;
        return NULL;
}

static void *driver_symbol(const char *name, int version) {
        return driver_symbol_with(name, version, 0);
}

static void load_driver(void) {
        const char *path = getenv("GPUPOOL_LIBCUDA");

        drv.dlsym = libc_dlsym();
        if (!drv.dlsym)
                return;
        loading = true;
        drv.lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        loading = false;
        if (!drv.lib)
                return;
        *(void **) &drv.get_proc_address_v2 = drv.dlsym(drv.lib, "cuGetProcAddress_v2");
        *(void **) &drv.get_proc_address = drv.dlsym(drv.lib, "cuGetProcAddress");
        /* Asking for an entry point needs no cuInit: the runtime asks before it too. */
        *(void **) &drv.mem_alloc = driver_symbol("cuMemAlloc", 3020);
        *(void **) &drv.mem_free = driver_symbol("cuMemFree", 3020);
        *(void **) &drv.mem_get_info = driver_symbol("cuMemGetInfo", 3020);
        *(void **) &drv.mem_get_address_range = driver_symbol("cuMemGetAddressRange", 3020);
        *(void **) &drv.device_total_mem = driver_symbol("cuDeviceTotalMem", 3020);
        *(void **) &drv.ctx_get_device = driver_symbol("cuCtxGetDevice", 2000);
        *(void **) &drv.ctx_get_current = driver_symbol("cuCtxGetCurrent", 4000);
        *(void **) &drv.primary_ctx_get_state = driver_symbol("cuDevicePrimaryCtxGetState", 7000);
        *(void **) &drv.primary_ctx_retain = driver_symbol("cuDevicePrimaryCtxRetain", 7000);
        *(void **) &drv.primary_ctx_release = driver_symbol("cuDevicePrimaryCtxRelease", 11000);
        *(void **) &drv.mem_alloc_async = driver_symbol("cuMemAllocAsync", 11020);
        *(void **) &drv.mem_free_async = driver_symbol("cuMemFreeAsync", 11020);
        *(void **) &drv.mem_alloc_from_pool_async = driver_symbol("cuMemAllocFromPoolAsync", 11020);
        /* The per-thread default stream's: what a program built for it asks for (its NULL is that stream). */
        *(void **) &drv.mem_alloc_async_ptsz = driver_symbol_with("cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        *(void **) &drv.mem_free_async_ptsz = driver_symbol_with("cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        *(void **) &drv.mem_alloc_from_pool_async_ptsz =
                driver_symbol_with("cuMemAllocFromPoolAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        *(void **) &drv.device_get_default_mem_pool = driver_symbol("cuDeviceGetDefaultMemPool", 11020);
        *(void **) &drv.pointer_get_attribute = driver_symbol("cuPointerGetAttribute", 4000);
        *(void **) &drv.ipc_get_mem_handle = driver_symbol("cuIpcGetMemHandle", 4010);
        *(void **) &drv.mem_create = driver_symbol("cuMemCreate", 10020);
        *(void **) &drv.mem_release = driver_symbol("cuMemRelease", 10020);
        *(void **) &drv.stream_get_ctx = driver_symbol("cuStreamGetCtx", 9020);
        *(void **) &drv.ctx_push = driver_symbol("cuCtxPushCurrent", 4000);
        *(void **) &drv.ctx_pop = driver_symbol("cuCtxPopCurrent", 4000);
}

static void driver(void) {
        pthread_once(&drv.once, load_driver);
}

/* In a forked child the handle's sockets and threads are the parent's: the child connects its own. */
static void forget_in_child(void) {
        shared = NULL;
        no_daemon = false;
        pthread_mutex_init(&handle_lock, NULL);
        pthread_mutex_init(&created_lock, NULL);        /* the parent's handles are not the child's */
}

__attribute__((constructor)) static void preload_init(void) {
        const char *w = getenv("GPUPOOL_RUN_WITHOUT_DAEMON");

        refuse_without_daemon = w && strcmp(w, "refuse") == 0;
        if (w && *w && strcmp(w, "refuse") != 0 && strcmp(w, "driver") != 0)
                say("$GPUPOOL_RUN_WITHOUT_DAEMON=%s is neither \"driver\" nor \"refuse\": \"driver\"", w);
        (void) pthread_atfork(NULL, NULL, forget_in_child);
}

/*
 * The handle, connecting it at first use; NULL without a daemon (said once). A daemon whose
 * backend hands out host memory ("host": a CPU-only node, or a GPU node whose driver failed to
 * load in gpupoold) is no daemon here: its pointers are not this GPU's device memory, which the
 * driver's copies and kernels would refuse, nor its pool this GPU's memory.
 */
static gpupool_client *client(void) {
        gpupool_client *c = __atomic_load_n(&shared, __ATOMIC_ACQUIRE);
        char why[512];
        int r;

        if (c)
                return c;
        pthread_mutex_lock(&handle_lock);
        if (!shared && !no_daemon) {
                const char *name = getenv("GPUPOOL_CLIENT_NAME");
                const char *backend = NULL;

                r = gpupool_connect(NULL, name && *name ? name : NULL, &c);
                if (r == 0 && (backend = gpupool_backend(c)) && strcmp(backend, "cuda") != 0 && strcmp(backend, "cuda-vmm") != 0) {
                        snprintf(why, sizeof(why), "the gpupoold that answered serves %s memory (its backend is \"%s\"), "
                                 "not this GPU's device memory", strcmp(backend, "host") == 0 ? "host" : "other", backend);
                        gpupool_disconnect(c);
                        c = NULL;
                        r = -ENODEV;
                } else if (r < 0) {
                        gpupool_last_error(NULL, why, sizeof(why));
                        if (!why[0])
                                snprintf(why, sizeof(why), "%s", gpupool_strerror(r));
                }
                if (r == 0) {
                        __atomic_store_n(&shared, c, __ATOMIC_RELEASE);
                } else {
                        no_daemon = true;
                        say("no gpupoold to take memory from (%s): %s", why,
                            refuse_without_daemon ? "every allocation is refused ($GPUPOOL_RUN_WITHOUT_DAEMON=refuse)" :
                                                    "allocating from the CUDA driver instead");
                }
        }
        c = shared;
        pthread_mutex_unlock(&handle_lock);
        return c;
}

/* The handle if it is connected, without connecting: a free or a question needs no daemon yet. */
static gpupool_client *connected(void) {
        return __atomic_load_n(&shared, __ATOMIC_ACQUIRE);
}

/* The primary context of each device as last seen active (atomic): where the pool's memory is mapped. */
#define MAX_DEVICES 64
static void *primaries[MAX_DEVICES];

/* Whether ctx is a device's primary context as last seen active: its device into *dev. */
static bool seen_primary(const void *ctx, CUdevice *dev) {
        for (int d = 0; d < MAX_DEVICES; d++)
                if (__atomic_load_n(&primaries[d], __ATOMIC_ACQUIRE) == ctx) {
                        *dev = d;
                        return true;
                }
        return false;
}

/*
 * The current context's device, where the pool may serve it: CUDA_SUCCESS and the device when
 * the current context is the device's primary context (the CUDA runtime's, and libgpupool's,
 * where the pool's memory is mapped); CUDA_ERROR_NOT_FOUND for a context the program made
 * itself, which the driver serves (memory mapped in one context is not another's); CUDA's
 * error where there is no context. One call when the primary context is the one last seen.
 */
static CUresult current_device(CUdevice *dev) {
        void *cur = NULL, *primary = NULL;
        unsigned flags;
        CUresult r;
        int active = 0;

        if (!drv.ctx_get_device || !drv.ctx_get_current)
                return CUDA_ERROR_NOT_INITIALIZED;
        if ((r = drv.ctx_get_current(&cur)) != CUDA_SUCCESS)
                return r;
        if (!cur)
                return CUDA_ERROR_INVALID_CONTEXT;
        /* A primary context seen before names its device: no more driver calls on an allocation. */
        if (seen_primary(cur, dev))
                return CUDA_SUCCESS;
        if ((r = drv.ctx_get_device(dev)) != CUDA_SUCCESS)
                return r;
        if (*dev < 0 || *dev >= MAX_DEVICES)
                return CUDA_ERROR_NOT_FOUND;
        /* Only an active primary context may be the current one: asking for it then creates nothing. */
        if (!drv.primary_ctx_get_state || !drv.primary_ctx_retain || !drv.primary_ctx_release ||
            drv.primary_ctx_get_state(*dev, &flags, &active) != CUDA_SUCCESS || !active ||
            drv.primary_ctx_retain(&primary, *dev) != CUDA_SUCCESS)
                return CUDA_ERROR_NOT_FOUND;
        (void) drv.primary_ctx_release(*dev);
        __atomic_store_n(&primaries[*dev], primary, __ATOMIC_RELEASE);
        return primary == cur ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* A default stream: NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, the current context's. */
static bool default_stream(CUstream s) {
        return (uintptr_t) s <= 2;
}

/*
 * The device a stream-ordered allocation on s is for, where the pool may serve it: as the
 * driver allocates, from the pool of the stream's device, which is its context's (a default
 * stream's is the current context), so current_device() of that context. One driver call for
 * a stream of a primary context seen before.
 */
static CUresult stream_device(CUstream s, CUdevice *dev) {
        void *ctx = NULL, *popped;
        CUresult r;

        if (default_stream(s) || !drv.stream_get_ctx || !drv.ctx_push || !drv.ctx_pop)
                return current_device(dev);
        if ((r = drv.stream_get_ctx(s, &ctx)) != CUDA_SUCCESS)
                return r;
        if (seen_primary(ctx, dev))
                return CUDA_SUCCESS;
        /* A context not seen yet: asked with it current. */
        if ((r = drv.ctx_push(ctx)) != CUDA_SUCCESS)
                return r;
        r = current_device(dev);
        (void) drv.ctx_pop(&popped);
        return r;
}

/* The driver's entry point an allocation or free goes to where the pool does not serve it, with its stream and pool. */
struct by_driver {
        CUresult (*sync)(CUdeviceptr *dptr, size_t size);
        CUresult (*async)(CUdeviceptr *dptr, size_t size, CUstream s);
        CUresult (*free_sync)(CUdeviceptr dptr);
        CUresult (*free_async)(CUdeviceptr dptr, CUstream s);
        CUresult (*from_pool)(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s);
        CUmemoryPool pool;
        CUstream s;
};

static CUresult driver_alloc(const struct by_driver *d, CUdeviceptr *dptr, size_t size) {
        return d->from_pool ? d->from_pool(dptr, size, d->pool, d->s) : d->async ? d->async(dptr, size, d->s) :
               d->sync ? d->sync(dptr, size) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult driver_free(const struct by_driver *d, CUdeviceptr dptr) {
        return d->free_async ? d->free_async(dptr, d->s) : d->free_sync ? d->free_sync(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

/* Says why libgpupool refused call, with gpupoold's sentence. */
static void say_refused(gpupool_client *c, const char *call, int r) {
        char why[512];

        gpupool_last_error(c, why, sizeof(why));
        say("%s: %s: %s", call, gpupool_strerror(r), why);
}

/*
 * A block of size bytes from the pool, at once or (on_stream) ordered on stream, for call (the
 * entry point's name): the driver's where the pool does not serve the current context or the
 * device, or there is no daemon (unless refused without one).
 */
static CUresult pool_alloc(const char *call, CUdeviceptr *dptr, size_t size, bool on_stream, CUstream stream,
                           const struct by_driver *by) {
        char what[128];
        gpupool_client *c;
        CUdevice dev;
        CUresult res;
        void *p;
        int r;

        driver();
        if (!dptr || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        if ((res = on_stream ? stream_device(stream, &dev) : current_device(&dev)) == CUDA_ERROR_NOT_FOUND)
                return driver_alloc(by, dptr, size);    /* a context of the program's */
        if (res != CUDA_SUCCESS)
                return res;
        if (!(c = client()))
                return refuse_without_daemon ? CUDA_ERROR_OUT_OF_MEMORY : driver_alloc(by, dptr, size);
        r = on_stream ? gpupool_alloc_async(c, dev, size, stream, &p) : gpupool_alloc(c, dev, size, &p);
        if (r == 0) {
                *dptr = (CUdeviceptr) (uintptr_t) p;
                return CUDA_SUCCESS;
        }
        if (r == -ENODEV)
                return driver_alloc(by, dptr, size);    /* a GPU gpupoold does not serve */
        snprintf(what, sizeof(what), "%s of %zu bytes on device %d", call, size, dev);
        say_refused(c, what, r);
        return r == -EINVAL ? CUDA_ERROR_INVALID_VALUE : r == -EIO ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_OUT_OF_MEMORY;
}

/*
 * Frees a block of the pool after the work queued before on stream (NULL: the legacy stream,
 * which waits for every blocking stream's, as the driver orders cuMemFree); memory the pool
 * did not hand out is the driver's.
 */
static CUresult pool_free(const char *call, CUdeviceptr dptr, CUstream stream, const struct by_driver *by) {
        gpupool_client *c = connected();
        char what[96];
        int r;

        driver();
        if (!c || !dptr || (r = gpupool_free_async(c, (void *) (uintptr_t) dptr, stream)) == -ENOENT)
                return driver_free(by, dptr);
        if (r == 0)
                return CUDA_SUCCESS;
        snprintf(what, sizeof(what), "%s of %#llx", call, dptr);
        say_refused(c, what, r);
        return r == -EBUSY || r == -EINVAL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_UNKNOWN;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
        driver();
        return pool_alloc("cuMemAlloc", dptr, size, false, NULL, &(struct by_driver) { .sync = drv.mem_alloc });
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
        driver();
        return pool_free("cuMemFree", dptr, NULL, &(struct by_driver) { .free_sync = drv.mem_free });
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
        uint64_t f, t;
        gpupool_client *c;
        CUdevice dev;
        CUresult res;

        driver();
        if (!free_bytes || !total_bytes)
                return CUDA_ERROR_INVALID_VALUE;
        if ((res = current_device(&dev)) != CUDA_SUCCESS && res != CUDA_ERROR_NOT_FOUND)
                return res;
        if (res == CUDA_SUCCESS && (c = client()) && gpupool_device_memory(c, dev, &f, &t) == 0) {
                *free_bytes = (size_t) f;
                *total_bytes = (size_t) t;
                return CUDA_SUCCESS;
        }
        return drv.mem_get_info ? drv.mem_get_info(free_bytes, total_bytes) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
        uint64_t f, t;
        gpupool_client *c;

        driver();
        if (!bytes)
                return CUDA_ERROR_INVALID_VALUE;
        if ((c = client()) && gpupool_device_memory(c, dev, &f, &t) == 0) {
                *bytes = (size_t) t;
                return CUDA_SUCCESS;
        }
        return drv.device_total_mem ? drv.device_total_mem(bytes, dev) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
        gpupool_client *c = connected();
        size_t n;
        void *b;

        driver();
        if (c && gpupool_block_range(c, (void *) (uintptr_t) dptr, &b, &n) == 0) {
                /* Either may be NULL, as the driver allows. */
                if (base)
                        *base = (CUdeviceptr) (uintptr_t) b;
                if (size)
                        *size = n;
                return CUDA_SUCCESS;
        }
        return drv.mem_get_address_range ? drv.mem_get_address_range(base, size, dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

/*
 * Rows of width bytes, each starting at a multiple of 512 bytes (the pitch), as the driver's
 * pitch works with cuMemcpy2D: the block is pitch * height bytes of the pool.
 */
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned element_size) {
        size_t p;
        CUresult r;

        if (!dptr || !pitch || !width || !height || (element_size != 4 && element_size != 8 && element_size != 16))
                return CUDA_ERROR_INVALID_VALUE;
        p = (width + 511) & ~(size_t) 511;
        if (p < width || height > SIZE_MAX / p)
                return CUDA_ERROR_INVALID_VALUE;
        r = cuMemAlloc_v2(dptr, p * height);
        if (r == CUDA_SUCCESS)
                *pitch = p;
        return r;
}

/*
 * The stream-ordered allocator, on the default pool: gpupool_alloc_async() and
 * gpupool_free_async() on the stream, which free a block for that stream at once and for
 * others once the work queued before has run, as the driver's pool does. The _ptsz variants
 * are the per-thread default stream's, whose NULL is CU_STREAM_PER_THREAD.
 */
static CUstream per_thread(CUstream s) {
        return s ? s : CU_STREAM_PER_THREAD;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
        driver();
        return pool_alloc("cuMemAllocAsync", dptr, size, true, s, &(struct by_driver) { .async = drv.mem_alloc_async, .s = s });
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
        driver();
        return pool_alloc("cuMemAllocAsync", dptr, size, true, per_thread(s),
                          &(struct by_driver) { .async = drv.mem_alloc_async_ptsz, .s = s });
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
        driver();
        return pool_free("cuMemFreeAsync", dptr, s, &(struct by_driver) { .free_async = drv.mem_free_async, .s = s });
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
        driver();
        return pool_free("cuMemFreeAsync", dptr, per_thread(s), &(struct by_driver) { .free_async = drv.mem_free_async_ptsz, .s = s });
}

/* Whether pool is the default pool of the device of stream s, the one cuMemAllocAsync on s takes from. */
static bool default_pool(CUmemoryPool pool, CUstream s) {
        CUmemoryPool dflt = NULL;
        CUdevice dev;

        return pool && stream_device(s, &dev) == CUDA_SUCCESS && drv.device_get_default_mem_pool &&
               drv.device_get_default_mem_pool(&dflt, dev) == CUDA_SUCCESS && dflt == pool;
}

/* A pool the program made keeps its own attributes (its limits, its sharing): the driver's. */
static CUresult alloc_from_pool_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s, CUstream on,
                                      CUresult (*driver_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream)) {
        struct by_driver by = { .from_pool = driver_fn, .pool = pool, .s = s };

        if (!default_pool(pool, on))
                return driver_alloc(&by, dptr, size);
        return pool_alloc("cuMemAllocFromPoolAsync", dptr, size, true, on, &by);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
        driver();
        return alloc_from_pool_async(dptr, size, pool, s, s, drv.mem_alloc_from_pool_async);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
        driver();
        return alloc_from_pool_async(dptr, size, pool, s, per_thread(s), drv.mem_alloc_from_pool_async_ptsz);
}

/* A block's range, as cuMemGetAddressRange_v2 gives it; every other attribute is the driver's. */
EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
        gpupool_client *c = connected();
        size_t n;
        void *b;

        driver();
        if (c && data && (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) &&
            gpupool_block_range(c, (void *) (uintptr_t) ptr, &b, &n) == 0) {
                if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
                        *(CUdeviceptr *) data = (CUdeviceptr) (uintptr_t) b;
                else
                        *(size_t *) data = n;
                return CUDA_SUCCESS;
        }
        return drv.pointer_get_attribute ? drv.pointer_get_attribute(data, attribute, ptr) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuPointerGetAttributes(unsigned count, int *attributes, void **data, CUdeviceptr ptr) {
        driver();
        if (!attributes || !data)
                return CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; i < count; i++) {
                CUresult r = cuPointerGetAttribute(data[i], attributes[i], ptr);

                if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE)
                        return r;
        }
        return CUDA_SUCCESS;
}

/*
 * An IPC handle opens a whole allocation: a block's would open its segment, other blocks of
 * the pool's included, at another address. Refused, saying so; the driver's own memory is the
 * driver's.
 */
EXPORT CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr dptr) {
        gpupool_client *c = connected();
        size_t n;
        void *b;

        driver();
        if (c && gpupool_block_range(c, (void *) (uintptr_t) dptr, &b, &n) == 0) {
                say("cuIpcGetMemHandle of %#llx: a block of gpupool's pool cannot be exported by an IPC handle "
                    "(it would open the whole segment): CUDA_ERROR_NOT_SUPPORTED; share memory between processes "
                    "with gpupool's named objects (libgpupool(3))", dptr);
                return CUDA_ERROR_NOT_SUPPORTED;
        }
        return drv.ipc_get_mem_handle ? drv.ipc_get_mem_handle(handle, dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

/*
 * Memory the program made with cuMemCreate on a GPU, charged to the client's limits
 * (gpupool_charge()) until cuMemRelease: each handle's device and size, by handle.
 */
#define CREATED_BUCKETS 1024
struct created {
        struct created *next;
        CUmemGenericAllocationHandle handle;
        CUdevice dev;
        size_t size;
};
static struct created *created[CREATED_BUCKETS];

static struct created **created_at(CUmemGenericAllocationHandle handle) {
        struct created **at = &created[(handle ^ handle >> 17) % CREATED_BUCKETS];

        while (*at && (*at)->handle != handle)
                at = &(*at)->next;
        return at;
}

/*
 * Memory made outside the pool (virtual memory management) passes through to the driver but
 * counts against the client's limits, as what the pool leases does: charged before the driver
 * makes it, refused (CUDA_ERROR_OUT_OF_MEMORY, gpupoold's sentence on standard error) where a
 * limit has no room. Host memory and a GPU gpupoold does not serve are the driver's alone.
 */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
                            unsigned long long flags) {
        const CUmemAllocationProp_head *head = prop;
        struct created *e = NULL;
        gpupool_client *c = NULL;
        char what[128];
        CUresult res;
        int r = -ENODEV;

        driver();
        if (!drv.mem_create)
                return CUDA_ERROR_NOT_INITIALIZED;
        if (!handle || !head || size == 0)
                return drv.mem_create(handle, size, prop, flags);       /* the driver's error */
        if (head->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
                if (!(c = client()) && refuse_without_daemon)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                if (c && (r = gpupool_charge(c, head->location.id, size)) < 0 && r != -ENODEV) {
                        snprintf(what, sizeof(what), "cuMemCreate of %zu bytes on device %d", size, head->location.id);
                        say_refused(c, what, r);
                        return r == -EINVAL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
                }
        }
        if (r == 0 && !(e = malloc(sizeof(*e)))) {
                (void) gpupool_uncharge(c, head->location.id, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        res = drv.mem_create(handle, size, prop, flags);
        if (!e)
                return res;
        if (res != CUDA_SUCCESS) {
                (void) gpupool_uncharge(c, head->location.id, size);
                free(e);
                return res;
        }
        *e = (struct created) { .handle = *handle, .dev = head->location.id, .size = size };
        pthread_mutex_lock(&created_lock);
        e->next = *created_at(*handle);
        *created_at(*handle) = e;
        pthread_mutex_unlock(&created_lock);
        return res;
}

/*
 * The charge ends with the handle: the driver frees the memory once it is also unmapped, which
 * a program does first (a mapping left after the release stays uncounted until unmapped).
 */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
        struct created **at, *e = NULL;
        CUresult res;

        driver();
        if (!drv.mem_release)
                return CUDA_ERROR_NOT_INITIALIZED;
        if ((res = drv.mem_release(handle)) != CUDA_SUCCESS)
                return res;
        pthread_mutex_lock(&created_lock);
        if (*(at = created_at(handle))) {
                e = *at;
                *at = e->next;
        }
        pthread_mutex_unlock(&created_lock);
        if (e) {
                gpupool_client *c = connected();

                if (c)
                        (void) gpupool_uncharge(c, e->dev, e->size);
                free(e);
        }
        return res;
}

/* What this library hands out in place of the driver's: a base name, from which ABI version, and under which exported name. */
static const struct hook {
        const char *base;
        int from_version;
        const char *exported;
        void *fn;
        void *fn_ptsz;                  /* asked with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, if it differs */
} hooks[] = {
        { "cuMemAlloc", 3020, "cuMemAlloc_v2", (void *) cuMemAlloc_v2, NULL },
        { "cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", (void *) cuMemAllocPitch_v2, NULL },
        { "cuMemAllocAsync", 11020, "cuMemAllocAsync", (void *) cuMemAllocAsync, (void *) cuMemAllocAsync_ptsz },
        { "cuMemAllocAsync", 11020, "cuMemAllocAsync_ptsz", (void *) cuMemAllocAsync_ptsz, (void *) cuMemAllocAsync_ptsz },
        { "cuMemFreeAsync", 11020, "cuMemFreeAsync", (void *) cuMemFreeAsync, (void *) cuMemFreeAsync_ptsz },
        { "cuMemFreeAsync", 11020, "cuMemFreeAsync_ptsz", (void *) cuMemFreeAsync_ptsz, (void *) cuMemFreeAsync_ptsz },
        { "cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", (void *) cuMemAllocFromPoolAsync,
          (void *) cuMemAllocFromPoolAsync_ptsz },
        { "cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync_ptsz", (void *) cuMemAllocFromPoolAsync_ptsz,
          (void *) cuMemAllocFromPoolAsync_ptsz },
        { "cuPointerGetAttribute", 4000, "cuPointerGetAttribute", (void *) cuPointerGetAttribute, NULL },
        { "cuPointerGetAttributes", 7000, "cuPointerGetAttributes", (void *) cuPointerGetAttributes, NULL },
        { "cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle", (void *) cuIpcGetMemHandle, NULL },
        { "cuMemFree", 3020, "cuMemFree_v2", (void *) cuMemFree_v2, NULL },
        { "cuMemGetInfo", 3020, "cuMemGetInfo_v2", (void *) cuMemGetInfo_v2, NULL },
        { "cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2", (void *) cuMemGetAddressRange_v2, NULL },
        { "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", (void *) cuDeviceTotalMem_v2, NULL },
        { "cuMemCreate", 10020, "cuMemCreate", (void *) cuMemCreate, NULL },
        { "cuMemRelease", 10020, "cuMemRelease", (void *) cuMemRelease, NULL },
        { "cuGetProcAddress", 12000, "cuGetProcAddress_v2", NULL, NULL },      /* set in hook_for(): defined after */
        { "cuGetProcAddress", 11030, "cuGetProcAddress", NULL, NULL },
};

static void *hook_for(const char *base, int version, uint64_t flags);

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
        CUresult r;
        void *h;

        driver();
        if (!drv.get_proc_address_v2)
                return CUDA_ERROR_NOT_INITIALIZED;
        r = drv.get_proc_address_v2(symbol, pfn, version, flags, status);
        /* Only where the driver has the function at that ABI: otherwise its answer stands. */
        if (r == CUDA_SUCCESS && pfn && *pfn && symbol && (h = hook_for(symbol, version, flags)))
                *pfn = h;
        return r;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
        CUresult r;
        void *h;

        driver();
        if (!drv.get_proc_address)
                return CUDA_ERROR_NOT_INITIALIZED;
        r = drv.get_proc_address(symbol, pfn, version, flags);
        if (r == CUDA_SUCCESS && pfn && *pfn && symbol && (h = hook_for(symbol, version, flags)))
                *pfn = h;
        return r;
}

/* Hook h's function, as asked with flags. */
static void *hook_fn(const struct hook *h, uint64_t flags) {
        if (strcmp(h->exported, "cuGetProcAddress_v2") == 0)
                return (void *) cuGetProcAddress_v2;
        if (strcmp(h->exported, "cuGetProcAddress") == 0)
                return (void *) cuGetProcAddress;
        return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && h->fn_ptsz ? h->fn_ptsz : h->fn;
}

/*
 * This library's function for base at ABI version, asked with flags, or NULL: the highest of
 * its versions the version reaches (the first of a base name's entries is its own name's).
 */
static void *hook_for(const char *base, int version, uint64_t flags) {
        const struct hook *best = NULL;

        for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
                if (strcmp(hooks[i].base, base) == 0 && version >= hooks[i].from_version &&
                    (!best || hooks[i].from_version > best->from_version))
                        best = &hooks[i];
        return best ? hook_fn(best, flags) : NULL;
}

/* This library's function exported as name (the driver's exported name), or NULL. */
static void *hook_named(const char *name) {
        for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
                if (strcmp(hooks[i].exported, name) == 0)
                        return hook_fn(&hooks[i], 0);
        return NULL;
}

/* Whether code at addr is libgpupool's or this library's: their dlsym() calls reach the driver itself. */
static bool ours(const void *addr) {
        Dl_info at, lib, self;

        return dladdr(addr, &at) && ((dladdr((void *) gpupool_connect, &lib) && at.dli_fbase == lib.dli_fbase) ||
                                     (dladdr((void *) hook_for, &self) && at.dli_fbase == self.dli_fbase));
}

/*
 * RTLD_NEXT means "after the caller's object", which the C library reads from its return
 * address: that lookup is a tail call, so that the return address is still the program's
 * (built with sibling calls even where the rest is not, as under the sanitizers' -O1).
 */
EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *restrict handle, const char *restrict name) {
        void *caller = __builtin_return_address(0), *found, *h;
        dlsym_fn real = libc_dlsym();

        if (!real)
                return NULL;
        if (handle == RTLD_NEXT)
                return real(handle, name);
        found = real(handle, name);
        /* The driver's entry point, asked by the program: this library's in its place. */
        if (found && strncmp(name, "cu", 2) == 0 && !loading && (h = hook_named(name)) && found != h &&
            !ours(caller)) {
                driver();
                if (drv.lib && real(drv.lib, name) == found)
                        return h;
        }
        return found;
}
