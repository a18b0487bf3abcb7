// Where the CUDA toolkit is present: the interposer's own declarations
// (driver_abi.hpp) have exactly cuda.h's sizes, values and signatures.
// Compiles to nothing; a mismatch stops the build.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "driver_abi.hpp"

namespace tp = tidepool::preload;

static_assert(sizeof(tp::CUresult) == sizeof(CUresult));
static_assert(std::is_same_v<tp::CUdevice, CUdevice>);
static_assert(std::is_same_v<tp::CUdeviceptr, CUdeviceptr>);
static_assert(std::is_same_v<tp::CUmemGenericAllocationHandle, CUmemGenericAllocationHandle>);
static_assert(std::is_same_v<tp::cuuint64_t, cuuint64_t>);
static_assert(sizeof(tp::CUdriverProcAddressQueryResult) == sizeof(CUdriverProcAddressQueryResult));
static_assert(CUDA_VERSION >= tp::kKnownCudaVersion, "the declarations are checked against an older cuda.h");
static_assert(tp::CUDA_SUCCESS == CUDA_SUCCESS);
static_assert(tp::CUDA_ERROR_INVALID_VALUE == CUDA_ERROR_INVALID_VALUE);
static_assert(tp::CUDA_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(tp::CUDA_ERROR_NOT_FOUND == CUDA_ERROR_NOT_FOUND);
static_assert(tp::CU_MEM_LOCATION_TYPE_DEVICE == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(sizeof(tp::CUuuid) == sizeof(CUuuid));
static_assert(sizeof(tp::CUmemAllocationProp) == sizeof(CUmemAllocationProp));
static_assert(offsetof(tp::CUmemAllocationProp, location) == offsetof(CUmemAllocationProp, location));
static_assert(offsetof(tp::CUmemAllocationProp, allocFlags) == offsetof(CUmemAllocationProp, allocFlags));

// The signatures, with CUDA's enums and handles in place of ours.
static_assert(std::is_same_v<decltype(&cuMemAlloc_v2), CUresult (*)(CUdeviceptr*, size_t)>);
static_assert(std::is_same_v<decltype(&cuMemFree_v2), CUresult (*)(CUdeviceptr)>);
static_assert(std::is_same_v<decltype(&cuMemGetInfo_v2), CUresult (*)(size_t*, size_t*)>);
static_assert(std::is_same_v<decltype(&cuMemAllocAsync), CUresult (*)(CUdeviceptr*, size_t, CUstream)>);
static_assert(std::is_same_v<decltype(&cuMemFreeAsync), CUresult (*)(CUdeviceptr, CUstream)>);
static_assert(std::is_same_v<decltype(&cuMemAllocFromPoolAsync),
                             CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)>);
static_assert(std::is_same_v<decltype(&cuMemCreate), CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                                                   const CUmemAllocationProp*, unsigned long long)>);
static_assert(std::is_same_v<decltype(&cuMemRelease), CUresult (*)(CUmemGenericAllocationHandle)>);
static_assert(std::is_same_v<decltype(&cuGetProcAddress_v2),
                             CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*)>);
static_assert(std::is_same_v<decltype(&cuCtxGetDevice), CUresult (*)(CUdevice*)>);
static_assert(std::is_same_v<decltype(&cuDeviceGetUuid_v2), CUresult (*)(CUuuid*, CUdevice)>);
static_assert(std::is_same_v<decltype(&cuDeviceTotalMem_v2), CUresult (*)(size_t*, CUdevice)>);

// The virtual-memory calls of --pool.
static_assert(tp::CU_MEM_ALLOCATION_TYPE_PINNED == CU_MEM_ALLOCATION_TYPE_PINNED);
static_assert(tp::CU_MEM_ACCESS_FLAGS_PROT_READWRITE == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(tp::CU_MEM_ALLOC_GRANULARITY_MINIMUM == CU_MEM_ALLOC_GRANULARITY_MINIMUM);
static_assert(sizeof(tp::CUmemAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(offsetof(tp::CUmemAccessDesc, flags) == offsetof(CUmemAccessDesc, flags));
static_assert(std::is_same_v<decltype(&cuMemGetAllocationGranularity),
                             CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>);
static_assert(std::is_same_v<decltype(&cuMemAddressReserve),
                             CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>);
static_assert(std::is_same_v<decltype(&cuMemAddressFree), CUresult (*)(CUdeviceptr, size_t)>);
static_assert(std::is_same_v<decltype(&cuMemMap), CUresult (*)(CUdeviceptr, size_t, size_t,
                                                                CUmemGenericAllocationHandle, unsigned long long)>);
static_assert(std::is_same_v<decltype(&cuMemSetAccess), CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*,
                                                                      size_t)>);
static_assert(std::is_same_v<decltype(&cuMemUnmap), CUresult (*)(CUdeviceptr, size_t)>);
static_assert(std::is_same_v<decltype(&cuCtxSynchronize), CUresult (*)()>);
static_assert(std::is_same_v<decltype(&cuCtxGetCurrent), CUresult (*)(CUcontext*)>);
static_assert(std::is_same_v<decltype(&cuCtxSetCurrent), CUresult (*)(CUcontext)>);
