// CudaDevice: real GPU memory. Plain allocation through the runtime
// (cudaMalloc/cudaFree/cudaMemGetInfo), virtual memory through the driver API
// (cuMemAddressReserve, cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap,
// cuMemRelease, cuMemAddressFree), streams through cudaStreamSynchronize.
//
// Built when CMake finds the CUDA toolkit (TIDEPOOL_HAVE_CUDA). Programs link
// only libcudart: the driver (libcuda.so.1) is reached through
// cudaGetDriverEntryPointByVersion, so a program starts, and says why no GPU
// is usable, on a machine with no driver or with only the toolkit's stub.
// No CUDA header is needed to use this one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool {

/// Why a CUDA device can or cannot be used in this process.
enum class CudaStatus {
  available,       // a driver and at least one device
  no_driver,       // libcuda.so.1 could not be loaded (no NVIDIA driver installed)
  stub_driver,     // libcuda.so.1 is the toolkit's stub (cudaErrorStubLibrary): CI, containers
  driver_too_old,  // a driver older than the runtime this was built with
  no_device,       // a driver but no device (none installed, or CUDA_VISIBLE_DEVICES hides them)
  error,           // any other failure of the runtime's initialization
};

/// "available", "no_driver", "stub_driver", "driver_too_old", "no_device", "error".
const char* cuda_status_name(CudaStatus status) noexcept;

struct CudaAvailability {
  CudaStatus status = CudaStatus::error;
  int device_count = 0;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 13000 for 13.0; 0 without a driver
  int runtime_version = 0;  // cudaRuntimeGetVersion of the linked libcudart
  /// Empty when available; otherwise a sentence for people with the CUDA
  /// error's name, e.g. "the CUDA driver is the toolkit's stub library
  /// (cudaErrorStubLibrary: CUDA driver is a stub library)".
  std::string reason;

  bool available() const noexcept { return status == CudaStatus::available; }
};

/// Asks the runtime whether a usable driver and device are present. Never
/// crashes: with no driver or the stub it reports why. Cheap after the first
/// call (the runtime caches its initialization).
CudaAvailability cuda_availability();

class CudaDevice final : public Device {
 public:
  /// The device of runtime ordinal `ordinal` (as cudaSetDevice counts, after
  /// CUDA_VISIBLE_DEVICES). Errors: unsupported "no CUDA device: <why>" when
  /// cuda_availability() says none is usable; invalid_argument for an ordinal
  /// out of range; device_error with the CUDA error's name and message.
  /// (Not named create: that would hide Device::create(bytes), and
  /// `cuda->create(bytes)` would open a device.)
  static Expected<std::shared_ptr<CudaDevice>> open(int ordinal = 0);

  /// Gives back whatever is still mapped, created, reserved or allocated.
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  /// The GPU's UUID as nvidia-smi writes it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
  std::string id() const override;
  /// "cuda:0 NVIDIA H200 (140 GiB, 2.00 MiB granules, sm_90, driver 13.0)".
  std::string description() const override;

  /// bytes > 0. cudaMalloc; out_of_memory (with the CUDA error in the hint)
  /// when the device cannot supply them.
  Expected<void*> allocate(std::size_t bytes) override;
  /// ptr came from allocate(bytes) on this device and is not freed yet
  /// (invalid_pointer / invalid_argument otherwise). cudaFree, which waits
  /// for the device's work.
  Status free(void* ptr, std::size_t bytes) override;

  /// cudaMemGetInfo; when it fails, free 0 and the total read at creation.
  MemInfo mem_info() const override;
  /// cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM) for
  /// pinned memory on this device (2 MiB on current GPUs); 2 MiB when the
  /// device lacks virtual memory.
  std::size_t granularity() const override;
  /// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
  bool supports_virtual_memory() const override;

  /// va_bytes > 0, a multiple of granularity(). cuMemAddressReserve,
  /// aligned to granularity(); costs no physical memory.
  Expected<void*> reserve(std::size_t va_bytes) override;
  /// [va, va + va_bytes) is exactly one reservation with nothing mapped in it. cuMemAddressFree.
  Status unreserve(void* va, std::size_t va_bytes) override;
  /// bytes > 0, a multiple of granularity(). cuMemCreate of pinned device
  /// memory; out_of_memory when the device has too little free.
  Expected<PhysicalHandle> create(std::size_t bytes) override;
  /// handle is live and mapped nowhere, bytes is its size, va is
  /// granularity-aligned and [va, va + bytes) is unmapped inside one
  /// reservation. cuMemMap, then cuMemSetAccess read-write for this device.
  Status map(void* va, std::size_t bytes, PhysicalHandle handle) override;
  /// [va, va + bytes) is exactly one earlier map() call's range. cuMemUnmap;
  /// the physical memory keeps its contents.
  Status unmap(void* va, std::size_t bytes) override;
  /// handle is live, mapped nowhere, and bytes is its size. cuMemRelease.
  Status release(PhysicalHandle handle, std::size_t bytes) override;
  /// stream is 0 (the legacy default stream) or a live cudaStream_t of this
  /// device. cudaStreamSynchronize.
  Status synchronize(Stream stream) override;
  /// As synchronize() for `stream`. cudaStreamQuery: true on cudaSuccess,
  /// false on cudaErrorNotReady (work still queued), an error otherwise.
  Expected<bool> query(Stream stream) override;
  /// bytes > 0. Pinned host memory (cudaHostAlloc): copies to and from it
  /// run at the bus's full speed.
  Expected<void*> allocate_host(std::size_t bytes) override;
  /// ptr came from allocate_host(bytes). cudaFreeHost.
  Status free_host(void* ptr, std::size_t bytes) override;
  /// cudaMemcpy device to host (synchronous).
  Status copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override;
  /// cudaMemcpy host to device (synchronous).
  Status copy_from_host(void* device_dst, const void* host_src, std::size_t bytes) override;

  /// The runtime ordinal this device was created with.
  int ordinal() const;
  /// The GPU's name, e.g. "NVIDIA H200".
  const std::string& name() const;

 private:
  struct State;
  explicit CudaDevice(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// The CudaDevice under `device`'s decorators (DeviceAdaptor::upstream), or
/// null when there is none (e.g. a HostDevice).
CudaDevice* find_cuda_device(Device& device);
const CudaDevice* find_cuda_device(const Device& device);

/// A CUDA stream of one device (cudaStreamNonBlocking), destroyed with the
/// object. For tests, benchmarks and callers that need a second stream.
class CudaStream {
 public:
  /// A new stream on `device`; device_error with the CUDA error otherwise.
  static Expected<CudaStream> create(const CudaDevice& device);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  /// The cudaStream_t as a tidepool Stream, for Allocator calls.
  Stream handle() const noexcept { return stream_; }

 private:
  CudaStream(Stream stream, int ordinal) : stream_(stream), ordinal_(ordinal) {}
  Stream stream_ = kDefaultStream;
  int ordinal_ = 0;
};

}  // namespace tidepool
