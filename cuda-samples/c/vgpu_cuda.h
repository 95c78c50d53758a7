/*
 * vgpu_cuda.h: the small subset of the CUDA driver API the libvgpu samples use.
 *
 * Written for this project (no NVIDIA header is needed to build the samples). Every type,
 * enum value, struct layout and prototype here was checked against CUDA 12.6 cuda.h; only
 * entry points that exist unchanged in CUDA 12 and 13 drivers are declared, always under
 * their exported (versioned) symbol names, so the link-time stub and the real driver agree.
 *
 * NVML is not linked: a few NVML entry points are loaded at run time with
 * dlopen("libnvidia-ml.so.1") + dlsym (see nvml_* in common.h), so the samples run where
 * NVML is absent and NVML goes through the dlsym path that libvgpu hooks.
 */
#ifndef VGPU_CUDA_H
#define VGPU_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;

typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* CUresult: only the values the samples name; any other code is printed by number/name. */
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,            /* kHz */
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
} CUdevice_attribute;

/* cuMemAllocManaged flags */
#define CU_MEM_ATTACH_GLOBAL 0x1

/* cuStreamCreate flags */
#define CU_STREAM_DEFAULT 0x0
#define CU_STREAM_NON_BLOCKING 0x1
/* cuStreamWaitValue32 flags */
#define CU_STREAM_WAIT_VALUE_GEQ 0x0

typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Virtual memory management (cuMemCreate & co) */
typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
} CUmemAllocationHandleType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
} CUmemAccess_flags;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1
} CUmemLocationType;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
} CUmemAllocationType;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* Stream-ordered allocator pools (CUDA 12.6 layout: 88 bytes, same size as 11.x) */
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Graph memory nodes (CUDA 11.4+) */
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef enum CUjit_option_enum {
    CU_JIT_INFO_LOG_BUFFER = 3,
    CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    CU_JIT_ERROR_LOG_BUFFER = 5,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
} CUjit_option;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/*
 * VGPU_CUDA_FUNCTIONS(X): every driver entry point the samples link against directly, as
 * X(return, exported symbol, (parameter list)). build.rs generates the link-time stub
 * libcuda.so.1 from this list (it parses these lines), and the prototypes below come from it,
 * so the stub and the declarations cannot drift apart. One entry per line.
 */
#define VGPU_CUDA_FUNCTIONS(X) \
    X(CUresult, cuInit, (unsigned int Flags)) \
    X(CUresult, cuDriverGetVersion, (int *driverVersion)) \
    X(CUresult, cuDeviceGet, (CUdevice *device, int ordinal)) \
    X(CUresult, cuDeviceGetCount, (int *count)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxSynchronize, (void)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr)) \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
    X(CUresult, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(CUresult, cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)) \
    X(CUresult, cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)) \
    X(CUresult, cuArrayDestroy, (CUarray hArray)) \
    X(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels)) \
    X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray)) \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream)) \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps)) \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool pool)) \
    X(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep)) \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool_out, CUdevice dev)) \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(CUresult, cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)) \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)) \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle)) \
    X(CUresult, cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
    X(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)) \
    X(CUresult, cuStreamCreate, (CUstream *phStream, unsigned int Flags)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream hStream)) \
    X(CUresult, cuStreamSynchronize, (CUstream hStream)) \
    X(CUresult, cuStreamCreateWithPriority, (CUstream *phStream, unsigned int flags, int priority)) \
    X(CUresult, cuStreamQuery, (CUstream hStream)) \
    X(CUresult, cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)) \
    X(CUresult, cuEventCreate, (CUevent *phEvent, unsigned int Flags)) \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream)) \
    X(CUresult, cuEventSynchronize, (CUevent hEvent)) \
    X(CUresult, cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent)) \
    X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues)) \
    X(CUresult, cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name)) \
    X(CUresult, cuModuleUnload, (CUmodule hmod)) \
    X(CUresult, cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec hGraphExec)) \
    X(CUresult, cuGraphDestroy, (CUgraph hGraph)) \
    X(CUresult, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx)) \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value)) \
    X(CUresult, cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)) \
    X(CUresult, cuDeviceGetGraphMemAttribute, (CUdevice device, int attr, void *value)) \
    X(CUresult, cuDeviceGraphMemTrim, (CUdevice device)) \
    X(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *handle, void *addr)) \
    X(CUresult, cuGraphCreate, (CUgraph *phGraph, unsigned int flags)) \
    X(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)) \
    X(CUresult, cuGraphAddMemFreeNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUdeviceptr dptr))

#define VGPU_DECLARE_CU(ret, name, params) ret name params;
VGPU_CUDA_FUNCTIONS(VGPU_DECLARE_CU)
#undef VGPU_DECLARE_CU

/* Not linked directly (looked up with dlsym so a driver without them is tolerated). */
typedef CUresult (*PFN_cuGetErrorName)(CUresult error, const char **pStr);
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus);

/* ---- NVML subset (loaded at run time; layouts checked against nvml.h) ---- */
typedef int nvmlReturn_t; /* NVML_SUCCESS = 0 */
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define VGPU_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

#ifdef __cplusplus
}
#endif
#endif /* VGPU_CUDA_H */
