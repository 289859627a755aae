/* cudadrv.c: see cudadrv.h. */
#define _GNU_SOURCE
#include "cudadrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry_point {
        const char *name;
        int version;
        size_t offset;
};

#define GP_CUDA_ENTRY(name, version, ret, args) { #name, version, offsetof(struct gp_cuda, name) },
static const struct entry_point entry_points[] = { GP_CUDA_ENTRY_POINTS(GP_CUDA_ENTRY) };

void *gp_cuda_symbol(const struct gp_cuda *cu, const char *name, int version) {
        void *pfn = NULL;
        int status = -1;

        if (cu->cuGetProcAddress(name, &pfn, version, GP_CU_GET_PROC_ADDRESS_DEFAULT, &status) != GP_CUDA_SUCCESS ||
            status != GP_CU_GET_PROC_ADDRESS_SUCCESS)
                return NULL;
        return pfn;
}

const char *gp_cuda_error_name(const struct gp_cuda *cu, gp_cu_result r) {
        static __thread char buf[32];
        const char *name = NULL;

        if (cu->cuGetErrorName && cu->cuGetErrorName(r, &name) == GP_CUDA_SUCCESS && name)
                return name;
        snprintf(buf, sizeof(buf), "CUDA error %d", r);
        return buf;
}

int gp_cuda_errno(gp_cu_result r) {
        switch (r) {
        case GP_CUDA_SUCCESS:
                return 0;
        case GP_CUDA_ERROR_OUT_OF_MEMORY:
                return -ENOMEM;
        case GP_CUDA_ERROR_INVALID_VALUE:
        case GP_CUDA_ERROR_INVALID_HANDLE:
        case GP_CUDA_ERROR_INVALID_CONTEXT:
                return -EINVAL;
        case GP_CUDA_ERROR_NO_DEVICE:
        case GP_CUDA_ERROR_INVALID_DEVICE:
                return -ENODEV;
        default:
                return -EIO;
        }
}

int gp_cuda_load(struct gp_cuda *cu, char *err, size_t err_size) {
        const char *path = getenv("GPUPOOL_LIBCUDA");
        gp_cu_result r;
        int count = 0;

        memset(cu, 0, sizeof(*cu));
        if (!path || !*path)
                path = "libcuda.so.1";
        cu->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!cu->lib) {
                snprintf(err, err_size, "no CUDA driver: cannot load %s (%s)", path, dlerror());
                return -ENOENT;
        }
        /* cuGetProcAddress_v2 (CUDA 12.0) is the one name we look up directly. */
        *(void **) &cu->cuGetProcAddress = dlsym(cu->lib, "cuGetProcAddress_v2");
        if (!cu->cuGetProcAddress) {
                snprintf(err, err_size, "the CUDA driver in %s is too old: it has no cuGetProcAddress_v2 (CUDA 12.0 or newer is needed)",
                         path);
                return -ENOSYS;
        }
        for (size_t i = 0; i < sizeof(entry_points) / sizeof(entry_points[0]); i++) {
                void *pfn = gp_cuda_symbol(cu, entry_points[i].name, entry_points[i].version);

                if (!pfn) {
                        snprintf(err, err_size, "the CUDA driver in %s lacks %s (ABI version %d)", path,
                                 entry_points[i].name, entry_points[i].version);
                        return -ENOSYS;
                }
                memcpy((char *) cu + entry_points[i].offset, &pfn, sizeof(pfn));
        }
        r = cu->cuInit(0);
        if (r == GP_CUDA_SUCCESS)
                r = cu->cuDeviceGetCount(&count);
        if (r == GP_CUDA_ERROR_NO_DEVICE || (r == GP_CUDA_SUCCESS && count == 0)) {
                snprintf(err, err_size, "the CUDA driver (%s) finds no GPU", path);
                return -ENODEV;
        }
        if (r != GP_CUDA_SUCCESS) {
                snprintf(err, err_size, "the CUDA driver (%s) failed to start: %s", path, gp_cuda_error_name(cu, r));
                return -EIO;
        }
        (void) cu->cuDriverGetVersion(&cu->driver_version);
        return 0;
}
