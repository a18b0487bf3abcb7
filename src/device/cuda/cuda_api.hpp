// The CUDA calls of the cuda layer, in one place: CUDA errors as tidepool
// errors, the driver API's entry points (found through the runtime, so that
// nothing links libcuda.so.1), and a guard that makes a device current.
// Internal to src/device/cuda and src/pool/cuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "tidepool/error.hpp"

namespace tidepool::cuda {

/// "cudaErrorMemoryAllocation: out of memory".
std::string runtime_error_text(cudaError_t error);
/// "CUDA_ERROR_OUT_OF_MEMORY: out of memory", or "CUresult 2" when the
/// driver's names cannot be reached.
std::string driver_error_text(CUresult result);

/// A runtime error as a tidepool Error: "<what>: <name>: <message>".
/// out_of_memory for cudaErrorMemoryAllocation, unsupported for
/// cudaErrorNotSupported, device_error otherwise. Clears the runtime's
/// last-error state, so a refused allocation does not fail the next call.
Error runtime_error(std::string_view what, cudaError_t error);
/// A driver error as a tidepool Error, coded as runtime_error() codes.
Error driver_error(std::string_view what, CUresult result);

/// The driver API functions tidepool uses, as the driver exports them for
/// the ABI versions named (cudaTypedefs.h's PFN_*_v<version>).
struct DriverApi {
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_uuid)(CUuuid*, CUdevice) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*mem_get_allocation_granularity)(size_t*, const CUmemAllocationProp*,
                                             CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                         unsigned long long) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
};

/// The driver's entry points, looked up once. Precondition for a value:
/// cuda_availability() said available (the runtime has loaded the driver).
/// device_error naming the first function the driver lacks, or the runtime's
/// error when the driver cannot be reached.
Expected<const DriverApi*> driver_api();

/// Makes `ordinal` the current device of the calling thread (its primary
/// context current, as the driver calls need) for the guard's lifetime, and
/// restores the previous one after.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  /// Whether the device could be made current; the error otherwise.
  const Status& status() const noexcept { return status_; }

 private:
  int previous_ = -1;  // -1: nothing to restore
  Status status_;
};

}  // namespace tidepool::cuda
