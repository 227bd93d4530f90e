/*
 * The slice of the CUDA driver ABI (x86-64 / aarch64, CUDA >= 11.3) that the
 * shim and its test stub need. Declared here rather than taken from cuda.h so
 * that the shim builds on machines without the CUDA toolkit (CI); every type
 * matches the driver's binary layout, handles are opaque pointers.
 */
#ifndef GPUSHARE_CUDA_ABI_H
#define GPUSHARE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906

typedef int CUdevice;
typedef struct {
    char bytes[16];
} CUuuid;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;

typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUevent_st *CUevent;
#define CU_EVENT_DEFAULT 0
#define CU_EVENT_DISABLE_TIMING 2
#define CUDA_ERROR_NOT_READY 600
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
typedef int CUmemPool_attribute;
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 8
typedef void (*CUhostFn)(void *userData);

/* cuLaunchKernelEx's configuration: the launch bound reads the stream of a launch that succeeded. */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32 && sizeof(CUlaunchConfig) == 56, "CUlaunchConfig layout");

/* Passed only by pointer: layout irrelevant to the shim. */
typedef struct CUDA_LAUNCH_PARAMS_st CUDA_LAUNCH_PARAMS;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* Read for the device pointers they copy (which GPUs' locks a copy takes, docs/multigpu.md): the
 * driver's layouts. A side of memory type CU_MEMORYTYPE_DEVICE or _UNIFIED names its srcDevice/dstDevice. */
typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
_Static_assert(offsetof(CUDA_MEMCPY2D, dstDevice) == 88 && sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D layout");
/* CUDA_MEMCPY3D_PEER is CUDA_MEMCPY3D with each side's reserved pointer its context. */
#define GS_MEMCPY3D_FIELDS(ctx0, ctx1)                                                             \
    size_t srcXInBytes, srcY, srcZ, srcLOD;                                                        \
    int srcMemoryType;                                                                             \
    const void *srcHost;                                                                           \
    CUdeviceptr srcDevice;                                                                         \
    void *srcArray;                                                                                \
    ctx0;                                                                                          \
    size_t srcPitch, srcHeight;                                                                    \
    size_t dstXInBytes, dstY, dstZ, dstLOD;                                                        \
    int dstMemoryType;                                                                             \
    void *dstHost;                                                                                 \
    CUdeviceptr dstDevice;                                                                         \
    void *dstArray;                                                                                \
    ctx1;                                                                                          \
    size_t dstPitch, dstHeight;                                                                    \
    size_t WidthInBytes, Height, Depth;
typedef struct CUDA_MEMCPY3D_st {
    GS_MEMCPY3D_FIELDS(void *reserved0, void *reserved1)
} CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_PEER_st {
    GS_MEMCPY3D_FIELDS(CUcontext srcContext, CUcontext dstContext)
} CUDA_MEMCPY3D_PEER;
_Static_assert(offsetof(CUDA_MEMCPY3D, dstDevice) == 136 && sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D layout");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, dstContext) == 152, "CUDA_MEMCPY3D_PEER layout");

/* Passed by value to cuMemPrefetchAsync_v2: layout matters. */
typedef struct CUmemLocation_st {
    int type;
    int id;
} CUmemLocation;

/* Virtual memory management: passed by pointer, but the shim fills them in. */
typedef unsigned long long CUmemGenericAllocationHandle;
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
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
    int flags;
} CUmemAccessDesc;
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");

typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

/* Shareable handles of VMM allocations: a POSIX file descriptor travels as an int, in and out. */
typedef int CUmemAllocationHandleType;
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CU_MEM_HANDLE_TYPE_FABRIC 8
typedef struct CUmemFabricHandle_st {
    unsigned char data[64];
} CUmemFabricHandle;

/* Context limits: the device malloc heap is device memory the context takes for kernels' malloc. */
typedef int CUlimit;
#define CU_LIMIT_MALLOC_HEAP_SIZE 2

/* Arrays (textures and surfaces): what the memory limit estimates their memory from. */
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef int CUarray_format;
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24 && sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "array descriptor layout");

typedef int CUpointer_attribute;
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define CU_POINTER_ATTRIBUTE_SYNC_MEMOPS 6
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_MAPPED 13
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4
#define CU_STREAM_NON_BLOCKING 1

typedef int CUstreamCaptureMode;
typedef int CUstreamCaptureStatus;
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

typedef int CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

#endif
