#include "tidepool/cuda_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/process.hpp"
#include "device/cuda/cuda_api.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using cuda::driver_error;
using cuda::runtime_error;
using cuda::ScopedDevice;

/// 13000 -> "13.0", as CUDA versions are written.
std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Used for the pools' region sizes when the device has no virtual memory
// (every current GPU's minimum granularity).
constexpr std::size_t kFallbackGranularity = 2 * MiB;

}  // namespace

const char* cuda_status_name(CudaStatus status) noexcept {
  switch (status) {
    case CudaStatus::available: return "available";
    case CudaStatus::no_driver: return "no_driver";
    case CudaStatus::stub_driver: return "stub_driver";
    case CudaStatus::driver_too_old: return "driver_too_old";
    case CudaStatus::no_device: return "no_device";
    case CudaStatus::error: return "error";
  }
  return "unknown";
}

CudaAvailability cuda_availability() {
  CudaAvailability found;
  // Neither call needs a driver: they say 0 and succeed when there is none.
  (void)cudaRuntimeGetVersion(&found.runtime_version);
  (void)cudaDriverGetVersion(&found.driver_version);
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  const std::string cuda_said = " (" + cuda::runtime_error_text(error) + ")";
  switch (error) {
    case cudaSuccess:
      found.device_count = count;
      if (count > 0) {
        found.status = CudaStatus::available;
      } else {
        found.status = CudaStatus::no_device;
        found.reason = "the CUDA driver reports no device";
      }
      break;
    case cudaErrorStubLibrary:
      found.status = CudaStatus::stub_driver;
      found.reason = "the CUDA driver libcuda.so.1 is the toolkit's stub library, not an NVIDIA "
                     "driver" + cuda_said;
      break;
    case cudaErrorInsufficientDriver:
      if (found.driver_version == 0) {
        found.status = CudaStatus::no_driver;
        found.reason = "no NVIDIA driver: libcuda.so.1 could not be loaded" + cuda_said;
      } else {
        found.status = CudaStatus::driver_too_old;
        found.reason = "the NVIDIA driver supports CUDA " + version_text(found.driver_version) +
                       ", older than the CUDA runtime " + version_text(found.runtime_version) +
                       " tidepool uses" + cuda_said;
      }
      break;
    case cudaErrorNoDevice: {
      found.status = CudaStatus::no_device;
      found.reason = "the NVIDIA driver finds no CUDA device" + cuda_said;
      if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
        found.reason += "; CUDA_VISIBLE_DEVICES is \"" + std::string(visible) + "\"";
      }
      break;
    }
    default:
      found.status = CudaStatus::error;
      found.reason = "the CUDA runtime could not start" + cuda_said;
      break;
  }
  (void)cudaGetLastError();
  return found;
}

struct CudaDevice::State {
  struct Handle {
    std::size_t bytes = 0;
    std::size_t ranges = 0;  // ranges it is mapped at: cuMemMap maps a handle at several
  };
  struct Mapping {
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
  };

  const cuda::DriverApi* driver = nullptr;
  MakerProcess maker;  // CUDA cannot be used in a forked child (core/process.hpp)
  int ordinal = 0;
  CUdevice cu_device = 0;
  std::string name;
  std::string uuid;
  int compute_major = 0;
  int compute_minor = 0;
  int driver_version = 0;
  std::size_t total_bytes = 0;
  std::size_t granularity = kFallbackGranularity;
  bool virtual_memory = false;

  mutable std::mutex mutex;  // guards the tables below
  std::unordered_map<void*, std::size_t> plain;         // allocate(): pointer -> bytes
  std::map<std::uintptr_t, std::size_t> reservations;   // base -> va_bytes
  std::unordered_map<PhysicalHandle, Handle> handles;   // create()
  std::map<std::uintptr_t, Mapping> mappings;           // map(): va -> range

  std::string who() const { return "cuda:" + std::to_string(ordinal); }

  CUmemAllocationProp allocation_prop() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cu_device;
    return prop;
  }

  std::size_t free_bytes() const {
    std::size_t free = 0;
    std::size_t total = 0;
    ScopedDevice current(ordinal);
    if (!current.status()) return 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return free;
  }

  Error out_of_memory(std::size_t requested, std::string cuda_said) const {
    OomReport report;
    report.requested_bytes = requested;
    report.device_free_bytes = free_bytes();
    report.hint = std::move(cuda_said);
    return Error::out_of_memory(who(), std::move(report));
  }

  Status check_granular(const char* call, std::size_t bytes) const {
    if (bytes == 0 || bytes % granularity != 0) {
      return Error(Errc::invalid_argument, who() + ": " + call + " of " + std::to_string(bytes) +
                                               " bytes: not a positive multiple of the granularity " +
                                               format_bytes(granularity));
    }
    return {};
  }

  Status check_virtual_memory(const char* call) const {
    if (virtual_memory) return {};
    return Error(Errc::unsupported, who() + ": " + call + ": " + name +
                                        " does not support virtual memory management");
  }

  /// The reservation holding [va, va + bytes), or reservations.end().
  std::map<std::uintptr_t, std::size_t>::const_iterator reservation_of(std::uintptr_t va,
                                                                       std::size_t bytes) const {
    auto after = reservations.upper_bound(va);
    if (after == reservations.begin()) return reservations.end();
    auto found = std::prev(after);
    if (va + bytes > found->first + found->second) return reservations.end();
    return found;
  }

  /// Whether any mapping overlaps [va, va + bytes).
  bool overlaps_mapping(std::uintptr_t va, std::size_t bytes) const {
    auto after = mappings.lower_bound(va + bytes);
    if (after == mappings.begin()) return false;
    auto last = std::prev(after);
    return last->first + last->second.bytes > va;
  }
};

Expected<std::shared_ptr<CudaDevice>> CudaDevice::open(int ordinal) {
  const CudaAvailability availability = cuda_availability();
  if (!availability.available()) {
    return Error(Errc::unsupported, "no CUDA device: " + availability.reason);
  }
  if (ordinal < 0 || ordinal >= availability.device_count) {
    return Error(Errc::invalid_argument,
                 "CUDA device ordinal " + std::to_string(ordinal) + " is out of range: " +
                     std::to_string(availability.device_count) + " device(s) visible (0 to " +
                     std::to_string(availability.device_count - 1) + ")");
  }
  Expected<const cuda::DriverApi*> driver = cuda::driver_api();
  if (!driver) return std::move(driver).error();

  auto state = std::make_unique<State>();
  State& s = *state;
  s.driver = *driver;
  s.ordinal = ordinal;
  s.driver_version = availability.driver_version;
  ScopedDevice current(ordinal);
  if (!current.status()) return current.status().error();

  cudaDeviceProp properties{};
  if (cudaError_t error = cudaGetDeviceProperties(&properties, ordinal); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaGetDeviceProperties", error);
  }
  s.name = properties.name;
  s.compute_major = properties.major;
  s.compute_minor = properties.minor;

  if (CUresult result = s.driver->device_get(&s.cu_device, ordinal); result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuDeviceGet", result);
  }
  CUuuid uuid{};
  if (CUresult result = s.driver->device_get_uuid(&uuid, s.cu_device); result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuDeviceGetUuid", result);
  }
  s.uuid = format_gpu_uuid(uuid.bytes);

  int virtual_memory = 0;
  if (CUresult result = s.driver->device_get_attribute(
          &virtual_memory, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, s.cu_device);
      result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)",
                        result);
  }
  s.virtual_memory = virtual_memory != 0;
  if (s.virtual_memory) {
    const CUmemAllocationProp prop = s.allocation_prop();
    std::size_t granularity = 0;
    if (CUresult result = s.driver->mem_get_allocation_granularity(
            &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        result != CUDA_SUCCESS) {
      return driver_error(s.who() + ": cuMemGetAllocationGranularity", result);
    }
    // The Device contract: a power of two, at least kMinAlignment.
    if (granularity < kMinAlignment || (granularity & (granularity - 1)) != 0) {
      return Error(Errc::device_error, s.who() + ": the driver's allocation granularity " +
                                           std::to_string(granularity) +
                                           " is not a power of two of at least 256 bytes");
    }
    s.granularity = granularity;
  }

  std::size_t free = 0;
  if (cudaError_t error = cudaMemGetInfo(&free, &s.total_bytes); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaMemGetInfo", error);
  }
  return std::shared_ptr<CudaDevice>(new CudaDevice(std::move(state)));
}

CudaDevice::CudaDevice(std::unique_ptr<State> state) : state_(std::move(state)) {}

CudaDevice::~CudaDevice() {
  if (state_->maker.forked()) {  // the context and the lock are the parent's
    (void)state_.release();      // a leak in the child only
    return;
  }
  State& s = *state_;
  // Errors are ignored: at process exit the driver may be shutting down
  // (CUDA_ERROR_DEINITIALIZED), and the process returns the memory anyway.
  ScopedDevice current(s.ordinal);
  for (const auto& [va, mapping] : s.mappings) (void)s.driver->mem_unmap(va, mapping.bytes);
  for (const auto& [handle, info] : s.handles) (void)s.driver->mem_release(handle);
  for (const auto& [base, bytes] : s.reservations) (void)s.driver->mem_address_free(base, bytes);
  for (const auto& [ptr, bytes] : s.plain) (void)cudaFree(ptr);
  (void)cudaGetLastError();
}

std::string CudaDevice::id() const { return state_->uuid; }

std::string CudaDevice::description() const {
  const State& s = *state_;
  return s.who() + " " + s.name + " (" + format_bytes(s.total_bytes) + ", " +
         format_bytes(s.granularity) + " granules" +
         (s.virtual_memory ? "" : ", no virtual memory") + ", sm_" +
         std::to_string(s.compute_major) + std::to_string(s.compute_minor) + ", driver " +
         version_text(s.driver_version) + ")";
}

int CudaDevice::ordinal() const { return state_->ordinal; }
const std::string& CudaDevice::name() const { return state_->name; }

Expected<void*> CudaDevice::allocate(std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  if (bytes == 0) return Error(Errc::invalid_argument, s.who() + ": allocate of 0 bytes");
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  void* ptr = nullptr;
  if (cudaError_t error = cudaMalloc(&ptr, bytes); error != cudaSuccess) {
    const Error cuda_said = runtime_error("cudaMalloc", error);
    if (cuda_said.code() == Errc::out_of_memory) return s.out_of_memory(bytes, cuda_said.message());
    return Error(cuda_said.code(), s.who() + ": " + cuda_said.message() + " (" +
                                       std::to_string(bytes) + " bytes)");
  }
  std::lock_guard lock(s.mutex);
  s.plain.emplace(ptr, bytes);
  return ptr;
}

Status CudaDevice::free(void* ptr, std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the parent's: left alone
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.plain.find(ptr);
    if (found == s.plain.end()) {
      return Error(Errc::invalid_pointer,
                   s.who() + ": free of " + format_address(ptr) + ": not a live allocation of this device");
    }
    if (found->second != bytes) {
      return Error(Errc::invalid_argument, s.who() + ": free of " + format_address(ptr) + " with " +
                                               std::to_string(bytes) + " bytes; it was allocated with " +
                                               std::to_string(found->second));
    }
    s.plain.erase(found);
  }
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (cudaError_t error = cudaFree(ptr); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaFree of " + format_address(ptr), error);
  }
  return {};
}

MemInfo CudaDevice::mem_info() const {
  if (state_->maker.forked()) return MemInfo{0, state_->total_bytes};  // none of it is the child's
  return MemInfo{state_->free_bytes(), state_->total_bytes};
}

std::size_t CudaDevice::granularity() const { return state_->granularity; }
bool CudaDevice::supports_virtual_memory() const { return state_->virtual_memory; }

Expected<void*> CudaDevice::reserve(std::size_t va_bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  if (Status ok = s.check_virtual_memory("reserve"); !ok) return std::move(ok).error();
  if (Status ok = s.check_granular("reserve", va_bytes); !ok) return std::move(ok).error();
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  CUdeviceptr base = 0;
  if (CUresult result = s.driver->mem_address_reserve(&base, va_bytes, s.granularity, 0, 0);
      result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuMemAddressReserve of " + format_bytes(va_bytes), result);
  }
  std::lock_guard lock(s.mutex);
  s.reservations.emplace(base, va_bytes);
  return reinterpret_cast<void*>(base);
}

Status CudaDevice::unreserve(void* va, std::size_t va_bytes) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the parent's: left alone
  const auto base = reinterpret_cast<std::uintptr_t>(va);
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.reservations.find(base);
    if (found == s.reservations.end()) {
      return Error(Errc::invalid_pointer,
                   s.who() + ": unreserve of " + format_address(va) + ": not the start of a reservation");
    }
    if (found->second != va_bytes) {
      return Error(Errc::invalid_argument,
                   s.who() + ": unreserve of " + format_address(va) + " with " + std::to_string(va_bytes) +
                       " bytes; it was reserved with " + std::to_string(found->second));
    }
    if (s.overlaps_mapping(base, va_bytes)) {
      return Error(Errc::invalid_argument,
                   s.who() + ": unreserve of " + format_address(va) + ": memory is still mapped in it");
    }
    s.reservations.erase(found);
  }
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (CUresult result = s.driver->mem_address_free(base, va_bytes); result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuMemAddressFree of " + format_address(va), result);
  }
  return {};
}

Expected<PhysicalHandle> CudaDevice::create(std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  if (Status ok = s.check_virtual_memory("create"); !ok) return std::move(ok).error();
  if (Status ok = s.check_granular("create", bytes); !ok) return std::move(ok).error();
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  const CUmemAllocationProp prop = s.allocation_prop();
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult result = s.driver->mem_create(&handle, bytes, &prop, 0); result != CUDA_SUCCESS) {
    const Error cuda_said = driver_error("cuMemCreate", result);
    if (cuda_said.code() == Errc::out_of_memory) return s.out_of_memory(bytes, cuda_said.message());
    return Error(cuda_said.code(), s.who() + ": " + cuda_said.message() + " (" +
                                       format_bytes(bytes) + ")");
  }
  std::lock_guard lock(s.mutex);
  s.handles.emplace(handle, State::Handle{bytes, 0});
  return PhysicalHandle{handle};
}

Status CudaDevice::map(void* va, std::size_t bytes, PhysicalHandle handle) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  const auto address = reinterpret_cast<std::uintptr_t>(va);
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.handles.find(handle);
    if (found == s.handles.end()) {
      return Error(Errc::invalid_argument,
                   s.who() + ": map of handle " + std::to_string(handle) + ": not a live handle");
    }
    if (found->second.bytes != bytes) {
      return Error(Errc::invalid_argument,
                   s.who() + ": map of handle " + std::to_string(handle) + " with " +
                       std::to_string(bytes) + " bytes; it was created with " +
                       std::to_string(found->second.bytes));
    }
    if (!is_aligned(address, s.granularity) || s.reservation_of(address, bytes) == s.reservations.end()) {
      return Error(Errc::invalid_argument,
                   s.who() + ": map at " + format_address(va) + " of " + format_bytes(bytes) +
                       ": not a granularity-aligned range inside one reservation");
    }
    if (s.overlaps_mapping(address, bytes)) {
      return Error(Errc::invalid_argument, s.who() + ": map at " + format_address(va) + " of " +
                                               format_bytes(bytes) + ": part of it is mapped already");
    }
    // Claimed before the driver calls, so a concurrent map() of the same range
    // is refused, and a release of the handle; undone below if the driver says no.
    ++found->second.ranges;
    s.mappings.emplace(address, State::Mapping{bytes, handle});
  }
  auto undo = [&] {
    std::lock_guard lock(s.mutex);
    s.mappings.erase(address);
    --s.handles[handle].ranges;
  };
  ScopedDevice current(s.ordinal);
  if (!current.status()) {
    undo();
    return current.status().error();
  }
  if (CUresult result = s.driver->mem_map(address, bytes, 0, handle, 0); result != CUDA_SUCCESS) {
    undo();
    return driver_error(s.who() + ": cuMemMap at " + format_address(va) + " of " + format_bytes(bytes), result);
  }
  CUmemAccessDesc access{};
  access.location = s.allocation_prop().location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult result = s.driver->mem_set_access(address, bytes, &access, 1);
      result != CUDA_SUCCESS) {
    (void)s.driver->mem_unmap(address, bytes);
    undo();
    return driver_error(s.who() + ": cuMemSetAccess at " + format_address(va) + " of " + format_bytes(bytes),
                        result);
  }
  return {};
}

Status CudaDevice::unmap(void* va, std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the parent's: left alone
  const auto address = reinterpret_cast<std::uintptr_t>(va);
  PhysicalHandle handle = 0;
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.mappings.find(address);
    if (found == s.mappings.end() || found->second.bytes != bytes) {
      return Error(Errc::invalid_argument, s.who() + ": unmap at " + format_address(va) + " of " +
                                               format_bytes(bytes) + ": not one earlier map()'s range");
    }
    handle = found->second.handle;
  }
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (CUresult result = s.driver->mem_unmap(address, bytes); result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuMemUnmap at " + format_address(va) + " of " + format_bytes(bytes), result);
  }
  std::lock_guard lock(s.mutex);
  s.mappings.erase(address);
  --s.handles[handle].ranges;
  return {};
}

Status CudaDevice::release(PhysicalHandle handle, std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.handles.find(handle);
    if (found == s.handles.end()) {
      return Error(Errc::double_free, s.who() + ": release of handle " + std::to_string(handle) +
                                          ": not a live handle (released already?)");
    }
    if (found->second.bytes != bytes) {
      return Error(Errc::invalid_argument,
                   s.who() + ": release of handle " + std::to_string(handle) + " with " +
                       std::to_string(bytes) + " bytes; it was created with " +
                       std::to_string(found->second.bytes));
    }
    if (found->second.ranges != 0) {
      const auto mapped = std::find_if(s.mappings.begin(), s.mappings.end(),
                                       [handle](const auto& range) { return range.second.handle == handle; });
      return Error(Errc::invalid_argument, s.who() + ": release of handle " + std::to_string(handle) +
                                               ": still mapped at " + format_address(mapped->first) +
                                               (found->second.ranges > 1
                                                    ? " and " + std::to_string(found->second.ranges - 1) +
                                                          " other ranges"
                                                    : std::string()));
    }
    s.handles.erase(found);
  }
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (CUresult result = s.driver->mem_release(handle); result != CUDA_SUCCESS) {
    return driver_error(s.who() + ": cuMemRelease of handle " + std::to_string(handle), result);
  }
  return {};
}

Status CudaDevice::synchronize(Stream stream) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (cudaError_t error = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
      error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaStreamSynchronize of stream " + format_address(stream), error);
  }
  return {};
}

Expected<bool> CudaDevice::query(Stream stream) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  const cudaError_t error = cudaStreamQuery(reinterpret_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it, as PyTorch does after cudaEventQuery
    return false;
  }
  return runtime_error(s.who() + ": cudaStreamQuery of stream " + format_address(stream), error);
}

Expected<void*> CudaDevice::allocate_host(std::size_t bytes) {
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  if (bytes == 0) return Error(Errc::invalid_argument, s.who() + ": allocate_host of 0 bytes");
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  void* ptr = nullptr;
  if (cudaError_t error = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaHostAlloc of " + format_bytes(bytes) + " of pinned host memory", error);
  }
  return ptr;
}

Status CudaDevice::free_host(void* ptr, std::size_t) {
  State& s = *state_;
  if (s.maker.forked()) return {};  // the parent's: left alone
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (cudaError_t error = cudaFreeHost(ptr); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaFreeHost of " + format_address(ptr), error);
  }
  return {};
}

namespace {
Status copy(const CudaDevice& device, int ordinal, void* dst, const void* src, std::size_t bytes,
            cudaMemcpyKind kind, const char* what) {
  ScopedDevice current(ordinal);
  if (!current.status()) return current.status().error();
  if (cudaError_t error = cudaMemcpy(dst, src, bytes, kind); error != cudaSuccess) {
    return runtime_error(device.description() + ": cudaMemcpy " + what + " of " + format_bytes(bytes) + " at " +
                             format_address(kind == cudaMemcpyDeviceToHost ? src : dst),
                         error);
  }
  return {};
}
}  // namespace

Status CudaDevice::copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (state_->maker.forked()) return state_->maker.refusal(state_->who());
  return copy(*this, state_->ordinal, host_dst, device_src, bytes, cudaMemcpyDeviceToHost, "device to host");
}

Status CudaDevice::copy_from_host(void* device_dst, const void* host_src, std::size_t bytes) {
  if (state_->maker.forked()) return state_->maker.refusal(state_->who());
  return copy(*this, state_->ordinal, device_dst, host_src, bytes, cudaMemcpyHostToDevice, "host to device");
}

const CudaDevice* find_cuda_device(const Device& device) {
  const Device* current = &device;
  while (current != nullptr) {
    if (const auto* cuda_device = dynamic_cast<const CudaDevice*>(current)) return cuda_device;
    const auto* adaptor = dynamic_cast<const DeviceAdaptor*>(current);
    current = adaptor != nullptr ? &adaptor->upstream() : nullptr;
  }
  return nullptr;
}

CudaDevice* find_cuda_device(Device& device) {
  return const_cast<CudaDevice*>(find_cuda_device(std::as_const(device)));
}

Expected<CudaStream> CudaStream::create(const CudaDevice& device) {
  ScopedDevice current(device.ordinal());
  if (!current.status()) return current.status().error();
  cudaStream_t stream = nullptr;
  if (cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      error != cudaSuccess) {
    return runtime_error("cuda:" + std::to_string(device.ordinal()) + ": cudaStreamCreate", error);
  }
  return CudaStream(reinterpret_cast<Stream>(stream), device.ordinal());
}

CudaStream::~CudaStream() {
  if (stream_ == kDefaultStream) return;
  ScopedDevice current(ordinal_);
  (void)cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_));
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, kDefaultStream)), ordinal_(other.ordinal_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    CudaStream old(std::move(*this));
    stream_ = std::exchange(other.stream_, kDefaultStream);
    ordinal_ = other.ordinal_;
  }
  return *this;
}

}  // namespace tidepool
