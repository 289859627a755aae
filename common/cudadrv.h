/*
 * cudadrv.h: the CUDA driver API, loaded at run time.
 *
 * Neither the daemon nor the library links libcuda: one binary runs on GPU and CPU-only
 * machines, and tests swap in a fake driver through $GPUPOOL_LIBCUDA. gp_cuda_load() opens
 * the driver with dlopen() and resolves every entry point through cuGetProcAddress_v2 with an
 * explicit ABI version, never by its unversioned name: "cuMemAlloc" is the 32-bit ABI of
 * CUDA 2.0 (cuda.h maps the name to cuMemAlloc_v2 at compile time, dlsym() does not).
 *
 * The types below mirror cuda.h's under our own names, so that this builds where the CUDA
 * toolkit is not installed; tests/cuda_abi.c checks them against cuda.h where it is, and
 * tests/cuda_abi_signatures.c, which defines GP_CUDA_TYPES_FROM_CUDA_H and these names as
 * cuda.h's own types, checks that every entry point has exactly the toolkit's signature.
 */
#ifndef GP_CUDADRV_H
#define GP_CUDADRV_H

#include <stddef.h>
#include <stdint.h>

#define GP_CU_IPC_HANDLE_SIZE 64

#ifndef GP_CUDA_TYPES_FROM_CUDA_H
typedef int gp_cu_result;                       /* CUresult */
typedef int gp_cu_device;                       /* CUdevice */
typedef unsigned long long gp_cu_deviceptr;     /* CUdeviceptr (the 64-bit _v2 one) */
typedef struct gp_cu_ctx_st *gp_cu_context;     /* CUcontext */
typedef struct gp_cu_stream_st *gp_cu_stream;   /* CUstream */
typedef struct gp_cu_event_st *gp_cu_event;     /* CUevent */
typedef struct gp_cu_mempool_st *gp_cu_mempool; /* CUmemoryPool */
typedef int gp_cu_capture_status;               /* CUstreamCaptureStatus */
typedef int gp_cu_capture_mode;                 /* CUstreamCaptureMode */
typedef int gp_cu_device_attribute;             /* CUdevice_attribute */
typedef struct { char reserved[GP_CU_IPC_HANDLE_SIZE]; } gp_cu_ipc_mem_handle;  /* CUipcMemHandle */
typedef struct { char bytes[16]; } gp_cu_uuid;                                  /* CUuuid */
/* Virtual memory management (cuMemCreate and its kin): the cuda-vmm backend's. */
typedef unsigned long long gp_cu_mem_handle;    /* CUmemGenericAllocationHandle */
typedef int gp_cu_mem_handle_type;              /* CUmemAllocationHandleType */
typedef int gp_cu_mem_granularity_flags;        /* CUmemAllocationGranularity_flags */
typedef struct {                                /* CUmemLocation */
        int type;
        int id;
} gp_cu_mem_location;
typedef struct {                                /* CUmemAllocationProp */
        int type;
        gp_cu_mem_handle_type requested_handle_types;
        gp_cu_mem_location location;
        void *win32_handle_meta_data;
        struct {
                unsigned char compression_type;
                unsigned char gpu_direct_rdma_capable;
                unsigned short usage;
                unsigned char reserved[4];
        } alloc_flags;
} gp_cu_mem_prop;
typedef struct {                                /* CUmemAccessDesc */
        gp_cu_mem_location location;
        int flags;
} gp_cu_mem_access_desc;
#endif

/* Result codes, as in cuda.h. */
#define GP_CUDA_SUCCESS 0
#define GP_CUDA_ERROR_INVALID_VALUE 1
#define GP_CUDA_ERROR_OUT_OF_MEMORY 2
#define GP_CUDA_ERROR_NOT_INITIALIZED 3
#define GP_CUDA_ERROR_DEINITIALIZED 4
#define GP_CUDA_ERROR_DEVICE_UNAVAILABLE 46
#define GP_CUDA_ERROR_NO_DEVICE 100
#define GP_CUDA_ERROR_INVALID_DEVICE 101
#define GP_CUDA_ERROR_INVALID_CONTEXT 201
#define GP_CUDA_ERROR_MAP_FAILED 205
#define GP_CUDA_ERROR_ALREADY_MAPPED 208
#define GP_CUDA_ERROR_INVALID_HANDLE 400
#define GP_CUDA_ERROR_NOT_FOUND 500
#define GP_CUDA_ERROR_ILLEGAL_STATE 401
#define GP_CUDA_ERROR_NOT_READY 600
#define GP_CUDA_ERROR_ILLEGAL_ADDRESS 700
#define GP_CUDA_ERROR_NOT_PERMITTED 800
#define GP_CUDA_ERROR_NOT_SUPPORTED 801
#define GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define GP_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define GP_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define GP_CUDA_ERROR_CAPTURED_EVENT 907
#define GP_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define GP_CUDA_ERROR_UNKNOWN 999

/* Flags and enum values, as in cuda.h. */
#define GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define GP_CU_EVENT_BLOCKING_SYNC 0x1
#define GP_CU_EVENT_DISABLE_TIMING 0x2
#define GP_CU_STREAM_CAPTURE_STATUS_NONE 0
#define GP_CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define GP_CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define GP_CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define GP_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define GP_CU_STREAM_CAPTURE_MODE_RELAXED 2
#define GP_CU_STREAM_NON_BLOCKING 0x1
#define GP_CU_DEVICE_ATTRIBUTE_COMPUTE_MODE 20
#define GP_CU_COMPUTEMODE_DEFAULT 0
#define GP_CU_COMPUTEMODE_PROHIBITED 2
#define GP_CU_COMPUTEMODE_EXCLUSIVE_PROCESS 3
#define GP_CU_GET_PROC_ADDRESS_DEFAULT 0
#define GP_CU_GET_PROC_ADDRESS_SUCCESS 0
#define GP_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define GP_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define GP_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define GP_CU_MEM_HANDLE_TYPE_NONE 0x0
#define GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define GP_CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define GP_CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define GP_CU_MEM_ACCESS_FLAGS_PROT_NONE 0x0
#define GP_CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define GP_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1

/* Every entry point gpupool uses, with the ABI version it is resolved at. */
#define GP_CUDA_ENTRY_POINTS(X) \
        X(cuInit, 2000, gp_cu_result, (unsigned flags)) \
        X(cuDriverGetVersion, 2020, gp_cu_result, (int *version)) \
        X(cuGetErrorName, 6000, gp_cu_result, (gp_cu_result r, const char **name)) \
        X(cuDeviceGetCount, 2000, gp_cu_result, (int *count)) \
        X(cuDeviceGet, 2000, gp_cu_result, (gp_cu_device *dev, int ordinal)) \
        X(cuDeviceGetName, 2000, gp_cu_result, (char *name, int len, gp_cu_device dev)) \
        X(cuDeviceGetUuid, 11040, gp_cu_result, (gp_cu_uuid *uuid, gp_cu_device dev)) \
        X(cuDevicePrimaryCtxRetain, 7000, gp_cu_result, (gp_cu_context *ctx, gp_cu_device dev)) \
        X(cuDevicePrimaryCtxRelease, 11000, gp_cu_result, (gp_cu_device dev)) \
        X(cuCtxPushCurrent, 4000, gp_cu_result, (gp_cu_context ctx)) \
        X(cuCtxPopCurrent, 4000, gp_cu_result, (gp_cu_context *ctx)) \
        X(cuMemGetInfo, 3020, gp_cu_result, (size_t *free_bytes, size_t *total_bytes)) \
        X(cuMemAlloc, 3020, gp_cu_result, (gp_cu_deviceptr *dptr, size_t size)) \
        X(cuMemFree, 3020, gp_cu_result, (gp_cu_deviceptr dptr)) \
        X(cuMemGetAddressRange, 3020, gp_cu_result, (gp_cu_deviceptr *base, size_t *size, gp_cu_deviceptr dptr)) \
        X(cuMemsetD8Async, 3020, gp_cu_result, (gp_cu_deviceptr dptr, unsigned char value, size_t n, gp_cu_stream s)) \
        X(cuIpcGetMemHandle, 4010, gp_cu_result, (gp_cu_ipc_mem_handle *handle, gp_cu_deviceptr dptr)) \
        X(cuIpcOpenMemHandle, 11000, gp_cu_result, (gp_cu_deviceptr *dptr, gp_cu_ipc_mem_handle handle, unsigned flags)) \
        X(cuIpcCloseMemHandle, 4010, gp_cu_result, (gp_cu_deviceptr dptr)) \
        X(cuStreamCreate, 2000, gp_cu_result, (gp_cu_stream *s, unsigned flags)) \
        X(cuStreamSynchronize, 2000, gp_cu_result, (gp_cu_stream s)) \
        X(cuStreamDestroy, 4000, gp_cu_result, (gp_cu_stream s)) \
        X(cuEventCreate, 2000, gp_cu_result, (gp_cu_event *e, unsigned flags)) \
        X(cuEventRecord, 2000, gp_cu_result, (gp_cu_event e, gp_cu_stream s)) \
        X(cuEventQuery, 2000, gp_cu_result, (gp_cu_event e)) \
        X(cuEventSynchronize, 2000, gp_cu_result, (gp_cu_event e)) \
        X(cuEventDestroy, 4000, gp_cu_result, (gp_cu_event e)) \
        X(cuStreamGetId, 12000, gp_cu_result, (gp_cu_stream s, unsigned long long *id)) \
        X(cuStreamIsCapturing, 10000, gp_cu_result, (gp_cu_stream s, gp_cu_capture_status *status)) \
        X(cuThreadExchangeStreamCaptureMode, 10010, gp_cu_result, (gp_cu_capture_mode *mode)) \
        X(cuCtxSynchronize, 2000, gp_cu_result, (void)) \
        X(cuDeviceGetAttribute, 2000, gp_cu_result, (int *value, gp_cu_device_attribute attribute, gp_cu_device dev)) \
        X(cuMemGetAllocationGranularity, 10020, gp_cu_result, \
          (size_t *granularity, const gp_cu_mem_prop *prop, gp_cu_mem_granularity_flags option)) \
        X(cuMemCreate, 10020, gp_cu_result, \
          (gp_cu_mem_handle *handle, size_t size, const gp_cu_mem_prop *prop, unsigned long long flags)) \
        X(cuMemRelease, 10020, gp_cu_result, (gp_cu_mem_handle handle)) \
        X(cuMemExportToShareableHandle, 10020, gp_cu_result, \
          (void *shareable, gp_cu_mem_handle handle, gp_cu_mem_handle_type type, unsigned long long flags)) \
        X(cuMemImportFromShareableHandle, 10020, gp_cu_result, \
          (gp_cu_mem_handle *handle, void *os_handle, gp_cu_mem_handle_type type)) \
        X(cuMemGetAllocationPropertiesFromHandle, 10020, gp_cu_result, (gp_cu_mem_prop *prop, gp_cu_mem_handle handle)) \
        X(cuMemAddressReserve, 10020, gp_cu_result, \
          (gp_cu_deviceptr *ptr, size_t size, size_t alignment, gp_cu_deviceptr addr, unsigned long long flags)) \
        X(cuMemAddressFree, 10020, gp_cu_result, (gp_cu_deviceptr ptr, size_t size)) \
        X(cuMemMap, 10020, gp_cu_result, \
          (gp_cu_deviceptr ptr, size_t size, size_t offset, gp_cu_mem_handle handle, unsigned long long flags)) \
        X(cuMemUnmap, 10020, gp_cu_result, (gp_cu_deviceptr ptr, size_t size)) \
        X(cuMemSetAccess, 10020, gp_cu_result, \
          (gp_cu_deviceptr ptr, size_t size, const gp_cu_mem_access_desc *desc, size_t count)) \
        X(cuMemRetainAllocationHandle, 11000, gp_cu_result, (gp_cu_mem_handle *handle, void *addr))

#define GP_CUDA_DECLARE(name, version, ret, args) ret (*name) args;

/* The loaded driver. All function pointers are set once gp_cuda_load() succeeds. */
struct gp_cuda {
        void *lib;
        int driver_version;             /* 1000 * major + 10 * minor */
        gp_cu_result (*cuGetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags, int *status);
        GP_CUDA_ENTRY_POINTS(GP_CUDA_DECLARE)
};

/*
 * Opens the driver ($GPUPOOL_LIBCUDA, else libcuda.so.1), resolves the entry points and calls
 * cuInit(0). Returns 0, or with a sentence in err: -ENOENT when there is no driver to load,
 * -ENODEV when it finds no GPU, -ENOSYS when it is too old (an entry point is missing), -EIO
 * when it fails otherwise. The driver stays loaded (as with the CUDA runtime): unloading
 * libcuda under a process that may still use it is not safe.
 */
int gp_cuda_load(struct gp_cuda *cu, char *err, size_t err_size);

/* Resolves one more entry point at version (tests, benchmarks). NULL when the driver lacks it. */
void *gp_cuda_symbol(const struct gp_cuda *cu, const char *name, int version);

/* The driver's name for r ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUDA error N". Not thread-safe for unknown codes. */
const char *gp_cuda_error_name(const struct gp_cuda *cu, gp_cu_result r);

/* A negative errno for a driver result: -ENOMEM for out of memory, -EINVAL, -ENODEV, else -EIO. */
int gp_cuda_errno(gp_cu_result r);

#endif
