#include "device/cuda/cuda_api.hpp"

#include <mutex>
#include <optional>

namespace tidepool::cuda {
namespace {

Errc errc_of_runtime(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation: return Errc::out_of_memory;
    case cudaErrorNotSupported: return Errc::unsupported;
    default: return Errc::device_error;
  }
}

Errc errc_of_driver(CUresult result) {
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY: return Errc::out_of_memory;
    case CUDA_ERROR_NOT_SUPPORTED: return Errc::unsupported;
    default: return Errc::device_error;
  }
}

/// One entry point at the ABI version `version` (the CUDA version that
/// introduced the PFN typedef the caller casts it to).
template <class Function>
Status find_entry_point(const char* symbol, unsigned version, Function& function) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
#elif CUDART_VERSION >= 12000
  // Before 12.5 the runtime picks the ABI version it was built for, which for
  // these functions is the one cudaTypedefs.h describes.
  (void)version;
  const cudaError_t error = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
#else
#error "tidepool's CUDA device needs CUDA 12.0 or newer"
#endif
  if (error != cudaSuccess) {
    return runtime_error(std::string("finding the driver function ") + symbol, error);
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return Error(Errc::device_error,
                 std::string("the CUDA driver lacks ") + symbol + " (ABI version " +
                     std::to_string(version) + "): the driver is older than this build needs");
  }
  function = reinterpret_cast<Function>(address);
  return {};
}

Expected<DriverApi> load_driver_api() {
  DriverApi api;
  Status found;
  auto find = [&](const char* symbol, unsigned version, auto& function) {
    if (found) found = find_entry_point(symbol, version, function);
  };
  find("cuGetErrorName", 6000, api.get_error_name);
  find("cuGetErrorString", 6000, api.get_error_string);
  find("cuDeviceGet", 2000, api.device_get);
  find("cuDeviceGetUuid", 11040, api.device_get_uuid);
  find("cuDeviceGetAttribute", 2000, api.device_get_attribute);
  find("cuMemGetAllocationGranularity", 10020, api.mem_get_allocation_granularity);
  find("cuMemAddressReserve", 10020, api.mem_address_reserve);
  find("cuMemAddressFree", 10020, api.mem_address_free);
  find("cuMemCreate", 10020, api.mem_create);
  find("cuMemMap", 10020, api.mem_map);
  find("cuMemSetAccess", 10020, api.mem_set_access);
  find("cuMemUnmap", 10020, api.mem_unmap);
  find("cuMemRelease", 10020, api.mem_release);
  if (!found) return std::move(found).error();
  return api;
}

/// The loaded table once it loaded; a failure is retried on the next call
/// (the caller may have been early, before a driver was usable).
std::mutex api_mutex;
std::optional<DriverApi> loaded_api;

const DriverApi* loaded_driver_api_or_null() {
  std::lock_guard lock(api_mutex);
  return loaded_api ? &*loaded_api : nullptr;
}

}  // namespace

std::string runtime_error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

std::string driver_error_text(CUresult result) {
  const DriverApi* api = loaded_driver_api_or_null();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api != nullptr && api->get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    std::string out = name;
    if (api->get_error_string(result, &text) == CUDA_SUCCESS && text != nullptr) {
      out += std::string(": ") + text;
    }
    return out;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

Error runtime_error(std::string_view what, cudaError_t error) {
  (void)cudaGetLastError();  // a non-sticky error must not fail the next call
  return Error(errc_of_runtime(error), std::string(what) + ": " + runtime_error_text(error));
}

Error driver_error(std::string_view what, CUresult result) {
  return Error(errc_of_driver(result), std::string(what) + ": " + driver_error_text(result));
}

Expected<const DriverApi*> driver_api() {
  std::lock_guard lock(api_mutex);
  if (!loaded_api) {
    Expected<DriverApi> api = load_driver_api();
    if (!api) return std::move(api).error();
    loaded_api = *api;
  }
  return &*loaded_api;
}

ScopedDevice::ScopedDevice(int ordinal) {
  int current = -1;
  if (cudaError_t error = cudaGetDevice(&current); error != cudaSuccess) {
    status_ = runtime_error("cudaGetDevice", error);
    return;
  }
  // Called even when `ordinal` is current already: on a thread that has not
  // used CUDA yet, cudaGetDevice says 0 with no context current, and
  // cudaSetDevice (CUDA 12+) is what makes the primary context current for
  // the driver calls.
  if (cudaError_t error = cudaSetDevice(ordinal); error != cudaSuccess) {
    status_ = runtime_error("cudaSetDevice(" + std::to_string(ordinal) + ")", error);
    return;
  }
  if (current != ordinal) previous_ = current;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace tidepool::cuda
