/*
 * client_hooks.c: the allocator hooks PyTorch and CuPy load by name. They cannot be handed a
 * handle, so they share one per process, connected at first use; and they cannot return an
 * errno, so each thread keeps its latest failure for the Python side to read. For PyTorch,
 * which does not check for NULL, a refusal can instead be thrown as a C++ exception, through
 * the C++ runtime the process already has loaded (this file is built with -fexceptions).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_common.h"
#include "size.h"

#define HOOK_ERROR_MAX GP_MAX_ERROR_BYTES

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static gpupool_client *hook_handle;     /* atomic; set once under hook_lock, dropped in a forked child */
static gpupool_client *volatile hook_inherited;        /* in a forked child: the parent's handle, kept, never freed */
static pthread_once_t hook_fork_once = PTHREAD_ONCE_INIT;
static unsigned torch_promises;         /* atomic: PyTorch's hooks' promises (gpupool_torch_promise) */
static unsigned hook_captures;          /* hook_lock: captures under way (gpupool_hook_capture) */

static __thread int hook_errno;
static __thread char hook_error[HOOK_ERROR_MAX];

/* The C++ runtime's exception entry points, found in the process (gpupool_torch_set_throw). */
static struct {
        void *(*allocate)(size_t);
        void (*raise)(void *, void *, void (*)(void *));
        void (*construct)(void *, const char *);        /* std::runtime_error::runtime_error(const char *) */
        void (*destroy)(void *);
        void *type;                                     /* typeid(std::runtime_error) */
} cxx;
static int torch_throw;                 /* atomic */

static void hook_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hook_fail(int err, const char *fmt, ...) {
        va_list ap;

        hook_errno = err;
        va_start(ap, fmt);
        vsnprintf(hook_error, sizeof(hook_error), fmt, ap);
        va_end(ap);
}

static void hook_ok(void) {
        hook_errno = 0;
        hook_error[0] = '\0';
}

/*
 * In a forked child the handle's sockets and threads are the parent's: forget it, not free it
 * (its locks may be held by threads that do not exist here). It stays referenced, as memory the
 * child inherited and keeps, rather than lost to leak checkers.
 */
static void forget_in_child(void) {
        hook_inherited = __atomic_exchange_n(&hook_handle, NULL, __ATOMIC_ACQ_REL);
        pthread_mutex_init(&hook_lock, NULL);
}

static void register_fork(void) {
        (void) pthread_atfork(NULL, NULL, forget_in_child);
}

GPUPOOL_EXPORT int gpupool_hook_client(gpupool_client **ret_client) {
        gpupool_client *c = __atomic_load_n(&hook_handle, __ATOMIC_ACQUIRE);
        const char *name;
        int r = 0;

        if (!ret_client)
                return -EINVAL;
        if (c) {
                *ret_client = c;        /* every hooked allocation comes here: nothing more on this path */
                return 0;
        }
        name = getenv("GPUPOOL_CLIENT_NAME");
        pthread_once(&hook_fork_once, register_fork);
        pthread_mutex_lock(&hook_lock);
        if (!hook_handle) {
                r = gpupool_connect(NULL, name && *name ? name : NULL, &c);
                char why[GP_MAX_ERROR_BYTES];

                /* The library's sentence names the socket and what to do; the daemon's reason where it refused us. */
                if (gpupool_last_error(NULL, why, sizeof(why)) == 0)
                        snprintf(why, sizeof(why), "%s", gpupool_strerror(r));
                if (r == 0) {
                        /* Captures the glue told of before the handle existed, said before any allocation. */
                        for (unsigned i = 0; i < hook_captures; i++)
                                (void) gpupool_capture_begin(c);
                        __atomic_store_n(&hook_handle, c, __ATOMIC_RELEASE);
                }
                else
                        hook_fail(r, "%s%s", why, r == -EINVAL ? " (check $GPUPOOL_CLIENT_NAME and the $GPUPOOL_* settings)" : "");
        }
        c = hook_handle;
        pthread_mutex_unlock(&hook_lock);
        if (r == 0)
                *ret_client = c;
        return r;
}

GPUPOOL_EXPORT int gpupool_torch_promise(unsigned promises) {
        if (promises & ~(GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD))
                return -EINVAL;
        __atomic_or_fetch(&torch_promises, promises, __ATOMIC_RELEASE);
        return 0;
}

GPUPOOL_EXPORT int gpupool_hook_capture(int begin) {
        int r;

        pthread_mutex_lock(&hook_lock);
        if (begin ? hook_captures == INT_MAX : !hook_captures) {
                r = -EINVAL;
        } else {
                hook_captures += begin ? 1 : -1;
                r = (int) hook_captures;
                if (hook_handle)
                        (void) (begin ? gpupool_capture_begin(hook_handle) : gpupool_capture_end(hook_handle));
        }
        pthread_mutex_unlock(&hook_lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_hook_last_error(char *buf, size_t size) {
        if (size)
                snprintf(buf, size, "%s", hook_error);
        return hook_errno;
}

/* The handle's own sentence about its latest failure, after "what: errno text". */
static void fail_on(gpupool_client *c, int err, const char *what) {
        char why[512];

        gpupool_last_error(c, why, sizeof(why));
        hook_fail(err, "%s: %s%s%s", what, gpupool_strerror(err), why[0] ? ": " : "", why);
}

/* An allocation of size bytes on device, for a hook making promises; NULL and the reason kept on failure. */
static void *hook_alloc(gpupool_client *c, size_t size, int device, void *stream, bool on_stream, unsigned promises) {
        char what[96], b[GP_SIZE_FORMAT_MAX];
        void *p = NULL;
        int r;

        if (size == 0) {
                hook_ok();
                return NULL;
        }
        if (!c && gpupool_hook_client(&c) < 0)
                return NULL;
        r = on_stream ? client_alloc_async(c, device, size, stream, promises, &p) : gpupool_alloc(c, device, size, &p);
        if (r < 0) {
                snprintf(what, sizeof(what), "allocating %s (%zu bytes) on device %d", gp_size_format(size, b, sizeof(b)), size,
                         device);
                fail_on(c, r, what);
                return NULL;
        }
        hook_ok();
        return p;
}

static void hook_free(gpupool_client *c, void *ptr, void *stream, unsigned promises) {
        int r;

        if (!ptr) {
                hook_ok();
                return;
        }
        if (!c)
                c = __atomic_load_n(&hook_handle, __ATOMIC_ACQUIRE);
        if (!c) {
                hook_fail(-ENOENT, "freeing %p: this process has no gpupool allocations (never connected)", ptr);
                return;
        }
        r = client_free_async(c, ptr, stream, promises);
        if (r < 0) {
                char what[64];

                snprintf(what, sizeof(what), "freeing %p", ptr);
                fail_on(c, r, what);
                return;
        }
        hook_ok();
}

/* Throws std::runtime_error(message) through the caller (PyTorch's C++). Returns only if it cannot. */
static void throw_refusal(void) {
        char msg[HOOK_ERROR_MAX + 64];
        void *e;

        if (!__atomic_load_n(&torch_throw, __ATOMIC_ACQUIRE))
                return;
        snprintf(msg, sizeof(msg), "CUDA out of memory. gpupool refused %s", hook_error);
        /* Larger than any std::runtime_error layout (16 bytes in libstdc++): the runtime only needs at least. */
        e = cxx.allocate(64);
        cxx.construct(e, msg);
        cxx.raise(e, cxx.type, cxx.destroy);
}

GPUPOOL_EXPORT int gpupool_torch_set_throw(int on) {
        void *h;

        if (!on) {
                __atomic_store_n(&torch_throw, 0, __ATOMIC_RELEASE);
                return 0;
        }
        /* The process's own C++ runtime, never a second one: its exceptions are what the caller catches. */
        h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
                return -ENOENT;
        pthread_mutex_lock(&hook_lock);
        cxx.allocate = (void *(*)(size_t)) dlsym(h, "__cxa_allocate_exception");
        cxx.raise = (void (*)(void *, void *, void (*)(void *))) dlsym(h, "__cxa_throw");
        cxx.construct = (void (*)(void *, const char *)) dlsym(h, "_ZNSt13runtime_errorC1EPKc");
        cxx.destroy = (void (*)(void *)) dlsym(h, "_ZNSt13runtime_errorD1Ev");
        cxx.type = dlsym(h, "_ZTISt13runtime_error");
        on = cxx.allocate && cxx.raise && cxx.construct && cxx.destroy && cxx.type;
        pthread_mutex_unlock(&hook_lock);
        dlclose(h);     /* RTLD_NOLOAD took a reference; the runtime stays loaded for its users */
        if (!on)
                return -ENOENT;
        __atomic_store_n(&torch_throw, 1, __ATOMIC_RELEASE);
        return 0;
}

GPUPOOL_EXPORT void *gpupool_torch_alloc(ssize_t size, int device, struct CUstream_st *stream) {
        void *p;

        if (size < 0) {
                hook_fail(-EINVAL, "allocating %zd bytes: a size is not negative", size);
                throw_refusal();
                return NULL;
        }
        p = hook_alloc(NULL, (size_t) size, device, stream, true, __atomic_load_n(&torch_promises, __ATOMIC_ACQUIRE));
        if (!p && hook_errno)
                throw_refusal();
        return p;
}

GPUPOOL_EXPORT void gpupool_torch_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream) {
        (void) size, (void) device;     /* the library knows each block's size and device */
        hook_free(NULL, ptr, stream, __atomic_load_n(&torch_promises, __ATOMIC_ACQUIRE));
}

/* CuPy's current stream on this thread, as gpupool_cupy_stream() last said (NULL: the legacy one). */
static __thread void *cupy_stream;

GPUPOOL_EXPORT void gpupool_cupy_stream(struct CUstream_st *stream) {
        cupy_stream = stream;
}

GPUPOOL_EXPORT void *gpupool_cupy_malloc(void *param, size_t size, int device) {
        return hook_alloc(param, size, device, cupy_stream, true, 0);
}

GPUPOOL_EXPORT void gpupool_cupy_free(void *param, void *ptr, int device) {
        (void) device;
        /* CuPy's free names no stream: its pool orders a free on the allocation's stream, and so does this. */
        hook_free(param, ptr, GPUPOOL_STREAM_OF_ALLOC, 0);
}
