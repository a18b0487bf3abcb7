// The few CUDA driver API types the interposer needs, declared here with the
// driver's exact ABI (cuda.h, CUDA 12/13, 64-bit Linux) so that the library
// builds without the toolkit. abi_check.cpp compares them with cuda.h where
// the toolkit is present.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tidepool::preload {

using CUresult = int;                              // enum cudaError_enum
using CUdevice = int;                              // CUdevice_v1
using CUdeviceptr = unsigned long long;            // CUdeviceptr_v2
using CUmemGenericAllocationHandle = unsigned long long;
using cuuint64_t = std::uint64_t;
using CUstream = struct CUstream_st*;
using CUmemoryPool = struct CUmemPoolHandle_st*;
using CUcontext = struct CUctx_st*;
using CUdriverProcAddressQueryResult = int;        // enum CUdriverProcAddressQueryResult_enum

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;

inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 1;
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 1;
inline constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0;

/// The newest CUDA version (cuGetProcAddress's cudaVersion) whose signatures
/// these declarations are known to have: abi_check.cpp compares them with a
/// cuda.h at least this new. A newer version may bring a new revision (_v3)
/// under the same name; the interposer asks the driver whether it does.
inline constexpr int kKnownCudaVersion = 13000;

struct CUuuid {
  char bytes[16];
};

/// CUmemAllocationProp: only the leading fields are read (location), the
/// rest is declared so that the size matches.
struct CUmemAllocationProp {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType
  struct {
    int type;                // CUmemLocationType
    int id;
  } location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

/// CUmemLocation and CUmemAccessDesc (cuMemSetAccess).
struct CUmemLocation {
  int type;  // CUmemLocationType
  int id;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CUmemAccess_flags
};

// The driver functions, by the symbol the library exports.
using MemAllocFn = CUresult (*)(CUdeviceptr* dptr, std::size_t bytesize);           // cuMemAlloc_v2
using MemFreeFn = CUresult (*)(CUdeviceptr dptr);                                    // cuMemFree_v2
using MemGetInfoFn = CUresult (*)(std::size_t* free, std::size_t* total);           // cuMemGetInfo_v2
using MemAllocAsyncFn = CUresult (*)(CUdeviceptr* dptr, std::size_t bytesize, CUstream stream);
using MemAllocFromPoolAsyncFn = CUresult (*)(CUdeviceptr* dptr, std::size_t bytesize, CUmemoryPool pool,
                                             CUstream stream);
using MemFreeAsyncFn = CUresult (*)(CUdeviceptr dptr, CUstream stream);
using MemCreateFn = CUresult (*)(CUmemGenericAllocationHandle* handle, std::size_t size,
                                 const CUmemAllocationProp* prop, unsigned long long flags);
using MemReleaseFn = CUresult (*)(CUmemGenericAllocationHandle handle);
using GetProcAddressV1Fn = CUresult (*)(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
using GetProcAddressV2Fn = CUresult (*)(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* symbolStatus);
using CtxGetDeviceFn = CUresult (*)(CUdevice* device);
using DeviceTotalMemFn = CUresult (*)(std::size_t* bytes, CUdevice dev);             // cuDeviceTotalMem_v2
using DeviceGetUuidFn = CUresult (*)(CUuuid* uuid, CUdevice dev);                   // cuDeviceGetUuid_v2

// The virtual-memory calls the pool of `tidepool run --pool` makes (not wrapped).
using MemGetAllocationGranularityFn = CUresult (*)(std::size_t* granularity, const CUmemAllocationProp* prop,
                                                   int option);
using MemAddressReserveFn = CUresult (*)(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                         CUdeviceptr addr, unsigned long long flags);
using MemAddressFreeFn = CUresult (*)(CUdeviceptr ptr, std::size_t size);
using MemMapFn = CUresult (*)(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags);
using MemSetAccessFn = CUresult (*)(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                                    std::size_t count);
using MemUnmapFn = CUresult (*)(CUdeviceptr ptr, std::size_t size);
using CtxSynchronizeFn = CUresult (*)();
using CtxGetCurrentFn = CUresult (*)(CUcontext* context);
using CtxSetCurrentFn = CUresult (*)(CUcontext context);

}  // namespace tidepool::preload
