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
 * Served from the pool: cuMemAlloc_v2 (a refusal by a limit or a full device is
 * CUDA_ERROR_OUT_OF_MEMORY, and gpupoold's sentence goes to standard error), cuMemFree_v2 (the
 * block freed after the work queued before on the legacy stream and the blocking streams, as
 * the driver orders a free: gpupool_free_async() on the legacy stream), cuMemGetInfo_v2 and
 * cuDeviceTotalMem_v2 (the client's view: gpupool_device_memory()), cuMemGetAddressRange_v2
 * (the block's own range: gpupool_block_range()). Memory the pool did not hand out goes to the
 * driver. Not intercepted yet, and so the driver's as before: the stream-ordered allocator
 * (cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync), cuMemAllocPitch_v2,
 * cuPointerGetAttribute(s), cuMemCreate and the rest of virtual memory management, IPC
 * handles, managed memory.
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
enum {
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_NOT_FOUND = 500,
        CUDA_ERROR_UNKNOWN = 999,
};

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
} drv = { .once = PTHREAD_ONCE_INIT };

/* The handle, connected at the first allocation. */
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static gpupool_client *shared;          /* atomic once set */
static bool no_daemon;                  /* handle_lock: a connect failed; the driver's or refused, as said */
static bool refuse_without_daemon;

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

static void *driver_symbol(const char *name, int version) {
        void *pfn = NULL;
        int status = 0;

        if (drv.get_proc_address_v2 && drv.get_proc_address_v2(name, &pfn, version, 0, &status) == CUDA_SUCCESS)
                return pfn;
        return NULL;
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
}

static void driver(void) {
        pthread_once(&drv.once, load_driver);
}

/* In a forked child the handle's sockets and threads are the parent's: the child connects its own. */
static void forget_in_child(void) {
        shared = NULL;
        no_daemon = false;
        pthread_mutex_init(&handle_lock, NULL);
}

__attribute__((constructor)) static void preload_init(void) {
        const char *w = getenv("GPUPOOL_RUN_WITHOUT_DAEMON");

        refuse_without_daemon = w && strcmp(w, "refuse") == 0;
        if (w && *w && strcmp(w, "refuse") != 0 && strcmp(w, "driver") != 0)
                say("$GPUPOOL_RUN_WITHOUT_DAEMON=%s is neither \"driver\" nor \"refuse\": \"driver\"", w);
        (void) pthread_atfork(NULL, NULL, forget_in_child);
}

/* The handle, connecting it at first use; NULL without a daemon (said once). */
static gpupool_client *client(void) {
        gpupool_client *c = __atomic_load_n(&shared, __ATOMIC_ACQUIRE);
        char why[512];
        int r;

        if (c)
                return c;
        pthread_mutex_lock(&handle_lock);
        if (!shared && !no_daemon) {
                const char *name = getenv("GPUPOOL_CLIENT_NAME");

                r = gpupool_connect(NULL, name && *name ? name : NULL, &c);
                if (r == 0) {
                        __atomic_store_n(&shared, c, __ATOMIC_RELEASE);
                } else {
                        no_daemon = true;
                        gpupool_last_error(NULL, why, sizeof(why));
                        say("no gpupoold to take memory from (%s): %s", why[0] ? why : gpupool_strerror(r),
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

/* The current context's device; CUDA's error where there is none. */
static CUresult current_device(CUdevice *dev) {
        if (!drv.ctx_get_device)
                return CUDA_ERROR_NOT_INITIALIZED;
        return drv.ctx_get_device(dev);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
        gpupool_client *c;
        CUdevice dev;
        CUresult res;
        void *p;
        int r;

        driver();
        if (!dptr || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        if ((res = current_device(&dev)) != CUDA_SUCCESS)
                return res;
        if (!(c = client())) {
                if (refuse_without_daemon)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                return drv.mem_alloc ? drv.mem_alloc(dptr, size) : CUDA_ERROR_NOT_INITIALIZED;
        }
        r = gpupool_alloc(c, dev, size, &p);
        if (r == 0) {
                *dptr = (CUdeviceptr) (uintptr_t) p;
                return CUDA_SUCCESS;
        }
        if (r == -ENODEV)
                return drv.mem_alloc ? drv.mem_alloc(dptr, size) : CUDA_ERROR_NOT_INITIALIZED;    /* a GPU gpupoold does not serve */
        {
                char why[512];

                gpupool_last_error(c, why, sizeof(why));
                say("cuMemAlloc of %zu bytes on device %d: %s: %s", size, dev, gpupool_strerror(r), why);
        }
        return r == -EINVAL ? CUDA_ERROR_INVALID_VALUE : r == -EIO ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
        gpupool_client *c = connected();
        int r;

        driver();
        if (c && dptr) {
                /* After the work queued before on the legacy stream, which waits for every blocking stream's. */
                r = gpupool_free_async(c, (void *) (uintptr_t) dptr, NULL);
                if (r == 0)
                        return CUDA_SUCCESS;
                if (r != -ENOENT) {
                        char why[512];

                        gpupool_last_error(c, why, sizeof(why));
                        say("cuMemFree of %#llx: %s: %s", dptr, gpupool_strerror(r), why);
                        return r == -EBUSY ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_UNKNOWN;
                }
        }
        return drv.mem_free ? drv.mem_free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
        uint64_t f, t;
        gpupool_client *c;
        CUdevice dev;
        CUresult res;

        driver();
        if (!free_bytes || !total_bytes)
                return CUDA_ERROR_INVALID_VALUE;
        if ((res = current_device(&dev)) != CUDA_SUCCESS)
                return res;
        if ((c = client()) && gpupool_device_memory(c, dev, &f, &t) == 0) {
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

/* What this library hands out in place of the driver's: a base name, from which ABI version, and under which exported name. */
static const struct hook {
        const char *base;
        int from_version;
        const char *exported;
        void *fn;
} hooks[] = {
        { "cuMemAlloc", 3020, "cuMemAlloc_v2", (void *) cuMemAlloc_v2 },
        { "cuMemFree", 3020, "cuMemFree_v2", (void *) cuMemFree_v2 },
        { "cuMemGetInfo", 3020, "cuMemGetInfo_v2", (void *) cuMemGetInfo_v2 },
        { "cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2", (void *) cuMemGetAddressRange_v2 },
        { "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", (void *) cuDeviceTotalMem_v2 },
        { "cuGetProcAddress", 12000, "cuGetProcAddress_v2", NULL },     /* set below: defined after */
        { "cuGetProcAddress", 11030, "cuGetProcAddress", NULL },
};

static void *hook_for(const char *base, int version);

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
        CUresult r;
        void *h;

        driver();
        if (!drv.get_proc_address_v2)
                return CUDA_ERROR_NOT_INITIALIZED;
        r = drv.get_proc_address_v2(symbol, pfn, version, flags, status);
        /* Only where the driver has the function at that ABI: otherwise its answer stands. */
        if (r == CUDA_SUCCESS && pfn && *pfn && symbol && (h = hook_for(symbol, version)))
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
        if (r == CUDA_SUCCESS && pfn && *pfn && symbol && (h = hook_for(symbol, version)))
                *pfn = h;
        return r;
}

/* This library's function for base at ABI version, or NULL: the highest of its versions the version reaches. */
static void *hook_for(const char *base, int version) {
        const struct hook *best = NULL;

        for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
                if (strcmp(hooks[i].base, base) == 0 && version >= hooks[i].from_version &&
                    (!best || hooks[i].from_version > best->from_version))
                        best = &hooks[i];
        if (!best)
                return NULL;
        if (strcmp(best->exported, "cuGetProcAddress_v2") == 0)
                return (void *) cuGetProcAddress_v2;
        if (strcmp(best->exported, "cuGetProcAddress") == 0)
                return (void *) cuGetProcAddress;
        return best->fn;
}

/* This library's function exported as name (the driver's exported name), or NULL. */
static void *hook_named(const char *name) {
        for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
                if (strcmp(hooks[i].exported, name) == 0)
                        return hook_for(hooks[i].base, hooks[i].from_version);
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
