/*
 * gpu_open.h: how the benchmarks that drive a GPU themselves (bench_gpu.c, bench_driver.c,
 * bench_pending.c, lag.c, objects.c) start: the driver gp_cuda_load() finds ($GPUPOOL_LIBCUDA:
 * the fake driver too) and GPU 0's primary context current on the calling thread.
 */
#ifndef GP_BENCH_GPU_OPEN_H
#define GP_BENCH_GPU_OPEN_H

#include <stdio.h>
#include <stdlib.h>

#include "cudadrv.h"

/*
 * Loads the driver into *cu and makes GPU 0's primary context (*ret_ctx, if asked) current;
 * returns GPU 0, or exits 1 saying why (as who).
 */
static inline gp_cu_device bench_gpu_open(struct gp_cuda *cu, gp_cu_context *ret_ctx, const char *who) {
        gp_cu_context ctx;
        gp_cu_device dev;
        gp_cu_result r;
        char err[256];

        if (gp_cuda_load(cu, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s: %s\n", who, err);
                exit(1);
        }
        if ((r = cu->cuDeviceGet(&dev, 0)) != GP_CUDA_SUCCESS || (r = cu->cuDevicePrimaryCtxRetain(&ctx, dev)) != GP_CUDA_SUCCESS ||
            (r = cu->cuCtxPushCurrent(ctx)) != GP_CUDA_SUCCESS) {
                fprintf(stderr, "%s: cannot use GPU 0: %s\n", who, gp_cuda_error_name(cu, r));
                exit(1);
        }
        if (ret_ctx)
                *ret_ctx = ctx;
        return dev;
}

#endif
