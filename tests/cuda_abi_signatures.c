/*
 * cuda_abi_signatures.c: every entry point of common/cudadrv.h has exactly the signature of
 * the toolkit's PFN_<name>_v<version>, return type and every parameter, checked at compile
 * time with our type names standing for cuda.h's own types ("make test" compiles it where a
 * toolkit is installed, as tests/cuda_abi.c; nothing here runs). tests/cuda_abi.c checks that
 * our own types have the same sizes and constants the same values.
 */
#include <cuda.h>
#include <cudaTypedefs.h>

#define GP_CUDA_TYPES_FROM_CUDA_H
typedef CUresult gp_cu_result;
typedef CUdevice gp_cu_device;
typedef CUdeviceptr gp_cu_deviceptr;
typedef CUcontext gp_cu_context;
typedef CUstream gp_cu_stream;
typedef CUevent gp_cu_event;
typedef CUmemoryPool gp_cu_mempool;
typedef CUstreamCaptureStatus gp_cu_capture_status;
typedef CUstreamCaptureMode gp_cu_capture_mode;
typedef CUdevice_attribute gp_cu_device_attribute;
typedef CUipcMemHandle gp_cu_ipc_mem_handle;
typedef CUuuid gp_cu_uuid;
typedef CUmemGenericAllocationHandle gp_cu_mem_handle;
typedef CUmemAllocationHandleType gp_cu_mem_handle_type;
typedef CUmemAllocationGranularity_flags gp_cu_mem_granularity_flags;
typedef CUmemLocation gp_cu_mem_location;
typedef CUmemAllocationProp gp_cu_mem_prop;
typedef CUmemAccessDesc gp_cu_mem_access_desc;

#include "cudadrv.h"

#define SAME_SIGNATURE(name, version, ret, args)                                                        \
        _Static_assert(__builtin_types_compatible_p(__typeof__(((struct gp_cuda *) 0)->name),          \
                                                    PFN_##name##_v##version),                           \
                       #name " at version " #version " differs from cuda.h's PFN_" #name "_v" #version);
GP_CUDA_ENTRY_POINTS(SAME_SIGNATURE)
