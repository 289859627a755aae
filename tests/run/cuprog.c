/*
 * cuprog.c: a CUDA program that knows nothing of gpupool, for gpupool-run's tests, in the three
 * ways a program reaches the driver. Built twice: cuprog-linked is linked with -lcuda and calls
 * the driver by name (cuda.h's names: cuMemAlloc_v2...); cuprog-dynamic dlopen()s libcuda.so.1
 * and finds each entry point with dlsym() ("dlsym") or, as the CUDA runtime does, through
 * cuGetProcAddress_v2 ("procaddr").
 *
 * Usage: cuprog-linked ACTION... | cuprog-dynamic dlsym|procaddr ACTION...
 *   fill N     allocates 1 MiB blocks, up to N, until the driver refuses; checks the data
 *              written to the first, its range, cuMemGetInfo_v2; prints what it saw; frees all
 *   hold N     allocates N MiB, says "held", waits for a line on stdin, frees, says "freed"
 *   cache N    allocates N MiB, frees it, says "cached", waits for a line on stdin
 *   ownctx N   allocates N MiB in a context of its own (cuCtxCreate_v2), then frees them
 *   async N    the same as fill on a stream (cuMemAllocAsync, cuMemFreeAsync), then a pitched
 *              allocation
 *   stream1 N  with GPU 0's primary context current, allocates N MiB with cuMemAllocAsync on a
 *              stream of GPU 1's, says "held", waits for a line on stdin, frees them there
 *   create N   makes 2 MiB allocations with cuMemCreate, up to N, until the driver refuses;
 *              then cuMemGetInfo_v2 and a 1 MiB cuMemAlloc_v2; releases one, allocates again;
 *              releases all
 * Each line it prints is "key value..." for the test to read.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define MiB (1ULL << 20)

static struct {
        CUresult (*init)(unsigned flags);
        CUresult (*device_get)(CUdevice *d, int ordinal);
        CUresult (*ctx_retain)(CUcontext *c, CUdevice d);
        CUresult (*ctx_set)(CUcontext c);
        CUresult (*mem_alloc)(CUdeviceptr *p, size_t size);
        CUresult (*mem_free)(CUdeviceptr p);
        CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
        CUresult (*address_range)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
        CUresult (*htod)(CUdeviceptr dst, const void *src, size_t n);
        CUresult (*dtoh)(void *dst, CUdeviceptr src, size_t n);
        CUresult (*pointer_attribute)(void *data, int attribute, CUdeviceptr p);
        CUresult (*ipc_handle)(void *handle, CUdeviceptr p);
        CUresult (*stream_create)(void **s, unsigned flags);
        CUresult (*stream_sync)(void *s);
        CUresult (*alloc_async)(CUdeviceptr *p, size_t size, void *s);
        CUresult (*free_async)(CUdeviceptr p, void *s);
        CUresult (*alloc_pitch)(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned element);
        CUresult (*ctx_create)(CUcontext *c, unsigned flags, CUdevice d);
        CUresult (*ctx_destroy)(CUcontext c);
        CUresult (*mem_create)(unsigned long long *handle, size_t size, const void *prop, unsigned long long flags);
        CUresult (*mem_release)(unsigned long long handle);
} cu;

/* cuda.h's CUmemAllocationProp: pinned memory on device 0, no handle type to share it by. */
static const struct {
        int type, handle_types;
        struct {
                int type, id;
        } location;
        void *win32;
        unsigned char flags[8];
} on_gpu0 = { .type = 1 /* CU_MEM_ALLOCATION_TYPE_PINNED */, .location = { 1 /* CU_MEM_LOCATION_TYPE_DEVICE */, 0 } };

#ifdef CUPROG_LINKED
CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d);
CUresult cuCtxSetCurrent(CUcontext c);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p);
CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr p);
CUresult cuStreamCreate(void **s, unsigned flags);
CUresult cuStreamSynchronize(void *s);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *s);
CUresult cuMemFreeAsync(CUdeviceptr p, void *s);
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned element);
CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d);
CUresult cuCtxDestroy_v2(CUcontext c);
CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop, unsigned long long flags);
CUresult cuMemRelease(unsigned long long handle);

static int find(int argc, char **argv) {
        cu.init = cuInit;
        cu.device_get = cuDeviceGet;
        cu.ctx_retain = cuDevicePrimaryCtxRetain;
        cu.ctx_set = cuCtxSetCurrent;
        cu.mem_alloc = cuMemAlloc_v2;
        cu.mem_free = cuMemFree_v2;
        cu.mem_get_info = cuMemGetInfo_v2;
        cu.address_range = cuMemGetAddressRange_v2;
        cu.htod = cuMemcpyHtoD_v2;
        cu.dtoh = cuMemcpyDtoH_v2;
        cu.pointer_attribute = cuPointerGetAttribute;
        cu.ipc_handle = cuIpcGetMemHandle;
        cu.stream_create = cuStreamCreate;
        cu.stream_sync = cuStreamSynchronize;
        cu.alloc_async = cuMemAllocAsync;
        cu.free_async = cuMemFreeAsync;
        cu.alloc_pitch = cuMemAllocPitch_v2;
        cu.ctx_create = cuCtxCreate_v2;
        cu.ctx_destroy = cuCtxDestroy_v2;
        cu.mem_create = cuMemCreate;
        cu.mem_release = cuMemRelease;
        (void) argc, (void) argv;
        printf("kind linked\n");
        return 1;
}
#else
static int find(int argc, char **argv) {
        static const struct { const char *name; int version; void **slot; } fns[] = {
                { "cuInit", 2000, (void **) &cu.init }, { "cuDeviceGet", 2000, (void **) &cu.device_get },
                { "cuDevicePrimaryCtxRetain", 7000, (void **) &cu.ctx_retain },
                { "cuCtxSetCurrent", 4000, (void **) &cu.ctx_set }, { "cuMemAlloc", 3020, (void **) &cu.mem_alloc },
                { "cuMemFree", 3020, (void **) &cu.mem_free }, { "cuMemGetInfo", 3020, (void **) &cu.mem_get_info },
                { "cuMemGetAddressRange", 3020, (void **) &cu.address_range },
                { "cuMemcpyHtoD", 3020, (void **) &cu.htod }, { "cuMemcpyDtoH", 3020, (void **) &cu.dtoh },
                { "cuPointerGetAttribute", 4000, (void **) &cu.pointer_attribute },
                { "cuIpcGetMemHandle", 4010, (void **) &cu.ipc_handle },
                { "cuStreamCreate", 2000, (void **) &cu.stream_create },
                { "cuStreamSynchronize", 2000, (void **) &cu.stream_sync },
                { "cuMemAllocAsync", 11020, (void **) &cu.alloc_async }, { "cuMemFreeAsync", 11020, (void **) &cu.free_async },
                { "cuMemAllocPitch", 3020, (void **) &cu.alloc_pitch },
                { "cuCtxCreate", 3020, (void **) &cu.ctx_create }, { "cuCtxDestroy", 4000, (void **) &cu.ctx_destroy },
                { "cuMemCreate", 10020, (void **) &cu.mem_create }, { "cuMemRelease", 10020, (void **) &cu.mem_release },
        };
        /* The names libcuda.so.1 exports them by: cuda.h's #define of each. */
        static const char *const exported[] = { "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                                                "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2",
                                                "cuMemGetAddressRange_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
                                                "cuPointerGetAttribute", "cuIpcGetMemHandle", "cuStreamCreate",
                                                "cuStreamSynchronize", "cuMemAllocAsync", "cuMemFreeAsync",
                                                "cuMemAllocPitch_v2", "cuCtxCreate_v2", "cuCtxDestroy_v2",
                                                "cuMemCreate", "cuMemRelease" };
        CUresult (*gpa)(const char *, void **, int, uint64_t, int *) = NULL;
        void *lib;

        if (argc < 2 || (strcmp(argv[1], "dlsym") != 0 && strcmp(argv[1], "procaddr") != 0)) {
                fprintf(stderr, "cuprog-dynamic: dlsym or procaddr first\n");
                exit(2);
        }
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
                fprintf(stderr, "cuprog: %s\n", dlerror());
                exit(1);
        }
        if (strcmp(argv[1], "procaddr") == 0)
                *(void **) &gpa = dlsym(lib, "cuGetProcAddress_v2");
        for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
                int status = -1;

                if (gpa ? gpa(fns[i].name, fns[i].slot, fns[i].version, 0, &status) != 0 :
                          !(*fns[i].slot = dlsym(lib, exported[i]))) {
                        fprintf(stderr, "cuprog: no %s\n", fns[i].name);
                        exit(1);
                }
        }
        printf("kind %s\n", argv[1]);
        return 2;
}
#endif

#define TRY(call) do { CUresult r_ = (call); if (r_) { printf("error %s %d\n", #call, r_); return 1; } } while (0)

int main(int argc, char **argv) {
        int a = find(argc, argv);
        static CUdeviceptr blocks[4096];
        unsigned char out[4096], in[4096];
        CUdeviceptr base = 0;
        size_t f, t, size = 0;
        unsigned long n;
        CUcontext ctx;
        CUdevice dev;
        unsigned i;

        if (argc < a + 2 || (n = strtoul(argv[a + 1], NULL, 10)) == 0 || n > 4096) {
                fprintf(stderr, "usage: cuprog [dlsym|procaddr] fill|hold|cache|ownctx|async|stream1|create N\n");
                return 2;
        }
        TRY(cu.init(0));
        TRY(cu.device_get(&dev, 0));
        TRY(cu.ctx_retain(&ctx, dev));
        TRY(cu.ctx_set(ctx));
        TRY(cu.mem_get_info(&f, &t));
        printf("info %zu %zu\n", f, t);
        printf("pid %d\n", (int) getpid());
        if (strcmp(argv[a], "ownctx") == 0) {
                CUcontext own;

                /* In a context of its own: the driver's memory, as many blocks as the GPU has. */
                TRY(cu.ctx_create(&own, 0, dev));
                TRY(cu.mem_get_info(&f, &t));
                printf("ownctx %zu %zu\n", f, t);
                for (i = 0; i < n; i++)
                        if (cu.mem_alloc(&blocks[i], MiB)) {
                                printf("refused %u\n", i);
                                break;
                        }
                if (i == n)
                        printf("allocated %u\n", i);
                while (i)
                        TRY(cu.mem_free(blocks[--i]));
                TRY(cu.ctx_destroy(own));
                printf("freed\n");
                return 0;
        }
        if (strcmp(argv[a], "stream1") == 0) {
                CUcontext ctx1;
                CUdevice dev1;
                char line[16];
                void *s;

                /* The stream is GPU 1's; the allocation is for its device, whatever context is current. */
                TRY(cu.device_get(&dev1, 1));
                TRY(cu.ctx_retain(&ctx1, dev1));
                TRY(cu.ctx_set(ctx1));
                TRY(cu.stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */));
                TRY(cu.ctx_set(ctx));
                for (i = 0; i < n; i++)
                        TRY(cu.alloc_async(&blocks[i], MiB, s));
                TRY(cu.stream_sync(s));
                printf("held\n");
                fflush(stdout);
                if (!fgets(line, sizeof(line), stdin))
                        return 1;
                while (i)
                        TRY(cu.free_async(blocks[--i], s));
                TRY(cu.stream_sync(s));
                printf("freed\n");
                return 0;
        }
        if (strcmp(argv[a], "create") == 0) {
                static unsigned long long handles[4096];
                CUdeviceptr p;
                CUresult r;

                /* Virtual memory management's allocations: the driver's, counted against the client's limit. */
                for (i = 0; i < n; i++)
                        if ((r = cu.mem_create(&handles[i], 2 * MiB, &on_gpu0, 0))) {
                                printf("refused %u %d\n", i, r);
                                break;
                        }
                if (i == n)
                        printf("created %u\n", i);
                TRY(cu.mem_get_info(&f, &t));
                printf("full %zu %zu\n", f, t);
                printf("alloc %d\n", r = cu.mem_alloc(&p, MiB));
                if (r == 0)
                        TRY(cu.mem_free(p));
                if (i) {
                        TRY(cu.mem_release(handles[--i]));
                        printf("alloc-after-release %d\n", r = cu.mem_alloc(&p, MiB));
                        if (r == 0)
                                TRY(cu.mem_free(p));
                }
                while (i)
                        TRY(cu.mem_release(handles[--i]));
                TRY(cu.mem_get_info(&f, &t));
                printf("released %zu %zu\n", f, t);
                return 0;
        }
        if (strcmp(argv[a], "async") == 0) {
                void *s;

                /* On a stream: until refused; then a pitched allocation; then every block freed on the stream. */
                TRY(cu.stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */));
                for (i = 0; i < n; i++) {
                        CUresult r = cu.alloc_async(&blocks[i], MiB, s);

                        if (r) {
                                printf("refused %u %d\n", i, r);
                                break;
                        }
                }
                while (i)
                        TRY(cu.free_async(blocks[--i], s));
                TRY(cu.stream_sync(s));
                {
                        CUdeviceptr p;
                        size_t pitch;

                        TRY(cu.alloc_pitch(&p, &pitch, 1000, 64, 4));
                        TRY(cu.address_range(&base, &size, p));
                        printf("pitch %zu %zu\n", pitch, size);
                        TRY(cu.mem_free(p));
                }
                printf("freed\n");
                return 0;
        }
        if (strcmp(argv[a], "hold") == 0 || strcmp(argv[a], "cache") == 0) {
                char line[16];

                for (i = 0; i < n; i++)
                        TRY(cu.mem_alloc(&blocks[i], MiB));
                if (strcmp(argv[a], "cache") == 0) {
                        /* Freed, and kept by the process's pool, idle, until the daemon asks for it. */
                        while (i)
                                TRY(cu.mem_free(blocks[--i]));
                        printf("cached\n");
                        fflush(stdout);
                        return fgets(line, sizeof(line), stdin) ? 0 : 1;
                }
                TRY(cu.mem_get_info(&f, &t));
                printf("held %zu %zu\n", f, t);
                fflush(stdout);
                if (!fgets(line, sizeof(line), stdin))
                        return 1;
                for (i = 0; i < n; i++)
                        TRY(cu.mem_free(blocks[i]));
                printf("freed\n");
                return 0;
        }
        for (i = 0; i < n; i++) {
                CUresult r = cu.mem_alloc(&blocks[i], MiB);

                if (r) {
                        printf("refused %u %d\n", i, r);
                        break;
                }
        }
        if (i == n)
                printf("allocated %u\n", i);
        if (i) {
                for (size_t k = 0; k < sizeof(out); k++)
                        out[k] = (unsigned char) (k * 7 + 3);
                TRY(cu.htod(blocks[0] + 1000, out, sizeof(out)));
                TRY(cu.dtoh(in, blocks[0] + 1000, sizeof(in)));
                printf("data %s\n", memcmp(in, out, sizeof(in)) == 0 ? "ok" : "wrong");
                TRY(cu.address_range(&base, &size, blocks[0] + 100));
                printf("range %s %zu\n", base == blocks[0] ? "base" : "elsewhere", size);
                base = 0;
                size = 0;
                TRY(cu.pointer_attribute(&base, 11 /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR */, blocks[0] + 100));
                TRY(cu.pointer_attribute(&size, 12 /* CU_POINTER_ATTRIBUTE_RANGE_SIZE */, blocks[0] + 100));
                printf("attribute %s %zu\n", base == blocks[0] ? "base" : "elsewhere", size);
                printf("ipc %d\n", cu.ipc_handle(out, blocks[0]));
        }
        TRY(cu.mem_get_info(&f, &t));
        printf("full %zu %zu\n", f, t);
        while (i)
                TRY(cu.mem_free(blocks[--i]));
        printf("freed\n");
        return 0;
}
