/*
 * cuda_abi.c: checks common/cudadrv.h's mirror of the driver API against the CUDA toolkit's
 * own cuda.h, at compile time. "make test" compiles it where a toolkit is installed
 * ($(CUDA_INCLUDE)); nothing here runs.
 */
#include <cuda.h>
#include <stddef.h>

#include "cudadrv.h"

#define SAME(ours, theirs) _Static_assert((ours) == (theirs), #ours " differs from cuda.h's " #theirs)
#define SAME_SIZE(ours, theirs) _Static_assert(sizeof(ours) == sizeof(theirs), "size of " #ours " differs from cuda.h's " #theirs)

SAME(GP_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(GP_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(GP_CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME(GP_CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(GP_CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED);
SAME(GP_CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(GP_CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME(GP_CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(GP_CUDA_ERROR_MAP_FAILED, CUDA_ERROR_MAP_FAILED);
SAME(GP_CUDA_ERROR_ALREADY_MAPPED, CUDA_ERROR_ALREADY_MAPPED);
SAME(GP_CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME(GP_CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
SAME(GP_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(GP_CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED);
SAME(GP_CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(GP_CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
SAME(GP_CU_IPC_HANDLE_SIZE, CU_IPC_HANDLE_SIZE);
SAME(GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME(GP_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(GP_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(GP_CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_DEFAULT);
SAME(GP_CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS);
SAME(GP_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
SAME_SIZE(gp_cu_result, CUresult);
SAME_SIZE(gp_cu_device, CUdevice);
SAME_SIZE(gp_cu_deviceptr, CUdeviceptr);
SAME_SIZE(gp_cu_ipc_mem_handle, CUipcMemHandle);
SAME_SIZE(gp_cu_uuid, CUuuid);
SAME_SIZE(int, CUdriverProcAddressQueryResult);
SAME(CUDA_VERSION >= 12000, 1);         /* cuGetProcAddress_v2's signature */

/* Each entry point's ABI version must be one the toolkit names a PFN_<name>_v<version> for. */
#include <cudaTypedefs.h>
#define SAME_PFN(name, version, ret, args) \
        _Static_assert(sizeof(((struct gp_cuda *) 0)->name) == sizeof(PFN_##name##_v##version), #name);
GP_CUDA_ENTRY_POINTS(SAME_PFN)
