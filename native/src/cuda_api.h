// Our own declarations of the CUDA driver API subset we use. The extension must build
// without a CUDA toolkit, so cuda.h is never included; the values below are ABI-stable.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using cuuint64_t = unsigned long long;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphNode_st* CUgraphNode;
typedef struct CUgraphExec_st* CUgraphExec;
}

namespace pgk::cu {

constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorDeinitialized = 4;
constexpr CUresult kErrorNoDevice = 100;
constexpr CUresult kErrorNotReady = 600;
constexpr CUresult kErrorPeerAccessAlreadyEnabled = 704;

constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrWarpSize = 10;
constexpr int kAttrClockRate = 13;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrPciBusId = 33;
constexpr int kAttrL2CacheSize = 38;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedPerMultiprocessor = 81;
constexpr int kAttrMaxSharedPerBlockOptin = 97;

constexpr int kFuncMaxThreadsPerBlock = 0;
constexpr int kFuncSharedSizeBytes = 1;
constexpr int kFuncConstSizeBytes = 2;
constexpr int kFuncLocalSizeBytes = 3;
constexpr int kFuncNumRegs = 4;
constexpr int kFuncMaxDynamicSharedSizeBytes = 8;

constexpr unsigned kStreamNonBlocking = 0x1;
constexpr unsigned kEventDefault = 0x0;
constexpr unsigned kEventBlockingSync = 0x1;
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kMemHostAllocPortable = 0x1;

constexpr int kCaptureModeGlobal = 0;
constexpr int kCaptureModeThreadLocal = 1;
constexpr int kCaptureModeRelaxed = 2;
constexpr int kCaptureStatusNone = 0;

constexpr int kPointerAttrMemoryType = 2;

// cuLaunchKernelEx: a launch attribute is its id, padding to 8 bytes, and a 64-byte value
// union; programmatic stream serialization (id 6) lets the kernel start while the one
// before it in the stream finishes, to wait on it with griddepcontrol.wait (SM 9.0+).
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char raw[64];
    int value;
  };
};
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_mem;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
constexpr unsigned kMemoryTypeHost = 1;

// A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS_v2, what the entry points below take
// at kApiVersion): the function, or where it is null a CUkernel, and its context.
constexpr int kGraphNodeTypeKernel = 0;
struct KernelNodeParams {
  CUfunction func;
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_mem;
  void** kernel_params;
  void** extra;
  void* kern;
  CUcontext ctx;
};

// A graph edge's annotation (CUgraphEdgeData): where the upstream node releases the edge
// (from_port) and how (type). A programmatic edge (type 1) lets the downstream kernel start
// early and wait inside (griddepcontrol.wait: the upstream complete, its writes visible);
// its port says when it may start: port 1 when every upstream block has triggered or
// exited, port 2 (launch order) when every upstream block has begun.
struct EdgeData {
  unsigned char from_port;
  unsigned char to_port;
  unsigned char type;
  unsigned char reserved[5];
};
constexpr unsigned char kGraphPortProgrammatic = 1;
constexpr unsigned char kGraphPortLaunchOrder = 2;
constexpr unsigned char kGraphDependencyProgrammatic = 1;

// cuTensorMapEncodeTiled's output: 128 opaque bytes, 64-byte aligned, that a kernel takes by
// value (a __grid_constant__ parameter) for the bulk tensor copies (SM 9.0+).
struct alignas(64) TensorMap {
  unsigned char bytes[128];
};

// Every entry point below is requested from cuGetProcAddress at this ABI version, which
// selects the _v2/_v3 variants whose signatures are written here.
constexpr int kApiVersion = 12000;

// X(name, signature). All return CUresult.
#define PGK_DRIVER_ENTRY_POINTS(X)                                                           \
  X(cuInit, (unsigned int))                                                                  \
  X(cuDriverGetVersion, (int*))                                                              \
  X(cuGetErrorName, (CUresult, const char**))                                                \
  X(cuGetErrorString, (CUresult, const char**))                                              \
  X(cuDeviceGetCount, (int*))                                                                \
  X(cuDeviceGet, (CUdevice*, int))                                                           \
  X(cuDeviceGetName, (char*, int, CUdevice))                                                 \
  X(cuDeviceGetAttribute, (int*, int, CUdevice))                                             \
  X(cuDeviceTotalMem, (size_t*, CUdevice))                                                   \
  X(cuDevicePrimaryCtxRetain, (CUcontext*, CUdevice))                                        \
  X(cuDevicePrimaryCtxRelease, (CUdevice))                                                   \
  X(cuCtxSetCurrent, (CUcontext))                                                            \
  X(cuCtxGetCurrent, (CUcontext*))                                                           \
  X(cuCtxSynchronize, ())                                                                    \
  X(cuCtxGetStreamPriorityRange, (int*, int*))                                               \
  X(cuMemGetInfo, (size_t*, size_t*))                                                        \
  X(cuMemAlloc, (CUdeviceptr*, size_t))                                                      \
  X(cuMemFree, (CUdeviceptr))                                                                \
  X(cuMemHostAlloc, (void**, size_t, unsigned int))                                          \
  X(cuMemFreeHost, (void*))                                                                  \
  X(cuPointerGetAttribute, (void*, int, CUdeviceptr))                                        \
  X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))                         \
  X(cuMemsetD32Async, (CUdeviceptr, unsigned int, size_t, CUstream))                         \
  X(cuMemcpyHtoDAsync, (CUdeviceptr, const void*, size_t, CUstream))                         \
  X(cuMemcpyDtoHAsync, (void*, CUdeviceptr, size_t, CUstream))                               \
  X(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                         \
  X(cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream))    \
  X(cuDeviceCanAccessPeer, (int*, CUdevice, CUdevice))                                       \
  X(cuCtxEnablePeerAccess, (CUcontext, unsigned int))                                        \
  X(cuStreamCreateWithPriority, (CUstream*, unsigned int, int))                              \
  X(cuStreamDestroy, (CUstream))                                                             \
  X(cuStreamSynchronize, (CUstream))                                                         \
  X(cuStreamQuery, (CUstream))                                                               \
  X(cuStreamBeginCapture, (CUstream, int))                                                   \
  X(cuStreamEndCapture, (CUstream, CUgraph*))                                                \
  X(cuStreamIsCapturing, (CUstream, int*))                                                   \
  X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                    \
  X(cuEventCreate, (CUevent*, unsigned int))                                                 \
  X(cuEventDestroy, (CUevent))                                                               \
  X(cuEventRecord, (CUevent, CUstream))                                                      \
  X(cuEventSynchronize, (CUevent))                                                           \
  X(cuEventQuery, (CUevent))                                                                 \
  X(cuEventElapsedTime, (float*, CUevent, CUevent))                                          \
  X(cuModuleLoadData, (CUmodule*, const void*))                                              \
  X(cuModuleUnload, (CUmodule))                                                              \
  X(cuModuleGetFunction, (CUfunction*, CUmodule, const char*))                               \
  X(cuFuncGetAttribute, (int*, int, CUfunction))                                             \
  X(cuFuncSetAttribute, (CUfunction, int, int))                                              \
  X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
                     unsigned, CUstream, void**, void**))                                    \
  X(cuLaunchKernelEx, (const LaunchConfig*, CUfunction, void**, void**))                     \
  X(cuGraphGetNodes, (CUgraph, CUgraphNode*, size_t*))                                       \
  X(cuGraphNodeGetType, (CUgraphNode, int*))                                                 \
  X(cuGraphKernelNodeGetParams, (CUgraphNode, KernelNodeParams*))                            \
  X(cuGraphExecKernelNodeSetParams, (CUgraphExec, CUgraphNode, const KernelNodeParams*))     \
  X(cuGraphDestroy, (CUgraph))                                                               \
  X(cuGraphInstantiateWithFlags, (CUgraphExec*, CUgraph, unsigned long long))                \
  X(cuGraphLaunch, (CUgraphExec, CUstream))                                                  \
  X(cuGraphExecDestroy, (CUgraphExec))                                                       \
  X(cuTensorMapEncodeTiled, (TensorMap*, int, unsigned, void*, const cuuint64_t*,            \
                             const cuuint64_t*, const unsigned*, const unsigned*, int, int,  \
                             int, int))

// Entry points requested at kApiVersion12030 (their forms with edge annotations, CUDA
// 12.3); optional: null where the driver is older, and what needs them is skipped.
constexpr int kApiVersion12030 = 12030;
#define PGK_DRIVER_ENTRY_POINTS_12030(X)                                                     \
  X(cuGraphGetEdges, (CUgraph, CUgraphNode*, CUgraphNode*, EdgeData*, size_t*))              \
  X(cuGraphAddDependencies,                                                                  \
    (CUgraph, const CUgraphNode*, const CUgraphNode*, const EdgeData*, size_t))              \
  X(cuGraphRemoveDependencies,                                                               \
    (CUgraph, const CUgraphNode*, const CUgraphNode*, const EdgeData*, size_t))              \
  X(cuStreamGetCaptureInfo,                                                                  \
    (CUstream, int*, cuuint64_t*, CUgraph*, const CUgraphNode**, const EdgeData**, size_t*))

struct DriverApi {
#define PGK_DECLARE_ENTRY(name, sig) CUresult(*name) sig = nullptr;
  PGK_DRIVER_ENTRY_POINTS(PGK_DECLARE_ENTRY)
  PGK_DRIVER_ENTRY_POINTS_12030(PGK_DECLARE_ENTRY)
#undef PGK_DECLARE_ENTRY
};

}  // namespace pgk::cu
