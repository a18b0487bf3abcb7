// The device layer: where bytes come from. The only code that talks to a
// driver or the OS. Every call states its preconditions; callers (the pools)
// keep them, and implementations check the cheap ones and return an error
// rather than corrupt state when one is broken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tidepool/error.hpp"

namespace tidepool {

/// An opaque stream handle (a cudaStream_t on CUDA). 0 is the default stream.
using Stream = std::uintptr_t;
inline constexpr Stream kDefaultStream = 0;

/// A physical memory handle from `Device::create` (a CUmemGenericAllocationHandle on CUDA).
using PhysicalHandle = std::uint64_t;

struct MemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

/// Every pointer a device or pool returns is aligned to at least this.
inline constexpr std::size_t kMinAlignment = 256;

class Device {
 public:
  virtual ~Device() = default;

  /// A stable identity: "host:<name>" or a GPU's UUID. Names the ledger segment.
  virtual std::string id() const = 0;
  /// What a person reads, e.g. "host device (16.0 GiB, 2 MiB granules)".
  virtual std::string description() const = 0;

  // --- plain allocation (cudaMalloc / cudaFree) ---------------------------

  /// bytes > 0. Returns a kMinAlignment-aligned pointer to `bytes` usable bytes,
  /// or out_of_memory when the device cannot supply them.
  virtual Expected<void*> allocate(std::size_t bytes) = 0;
  /// ptr came from allocate(bytes) on this device and is not freed yet.
  virtual Status free(void* ptr, std::size_t bytes) = 0;

  /// Free and total bytes, as cudaMemGetInfo reports them.
  virtual MemInfo mem_info() const = 0;
  /// The unit of physical memory and mapping (cuMemGetAllocationGranularity).
  /// A power of two, at least kMinAlignment.
  virtual std::size_t granularity() const = 0;

  // --- virtual memory (cuMemAddressReserve / cuMemCreate / cuMemMap) -----

  virtual bool supports_virtual_memory() const = 0;
  /// va_bytes > 0, a multiple of granularity(). Reserves address space only:
  /// costs no physical memory. Returns a granularity-aligned address.
  virtual Expected<void*> reserve(std::size_t va_bytes) = 0;
  /// va and va_bytes are exactly a reservation from reserve(), with nothing mapped in it.
  virtual Status unreserve(void* va, std::size_t va_bytes) = 0;
  /// bytes > 0, a multiple of granularity(). Takes physical memory from the
  /// device; out_of_memory when there is not enough free.
  virtual Expected<PhysicalHandle> create(std::size_t bytes) = 0;
  /// va lies in a reservation, is granularity-aligned, and [va, va + bytes)
  /// is unmapped; bytes is the size the handle was created with. After it the
  /// range is readable and writable (cuMemMap + cuMemSetAccess). A handle
  /// may be mapped at several ranges at once: each is a view of the same
  /// memory (cuMemMap maps a handle wherever it is asked to).
  virtual Status map(void* va, std::size_t bytes, PhysicalHandle handle) = 0;
  /// map() of each of `handles` (each created with bytes_each) side by side:
  /// handles[i] at va + i * bytes_each. One call where a device can do better
  /// than one map() each (the host device makes one system call for handles
  /// whose memory is adjacent). Each handle is still its own mapping: unmap()
  /// takes them back one by one. On failure none of them is mapped.
  virtual Status map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) {
    for (std::size_t i = 0; i < handles.size(); ++i) {
      Status mapped = map(static_cast<char*>(va) + i * bytes_each, bytes_each, handles[i]);
      if (mapped) continue;
      while (i-- > 0) (void)unmap(static_cast<char*>(va) + i * bytes_each, bytes_each);
      return mapped;
    }
    return {};
  }
  /// [va, va + bytes) is exactly one earlier map() call's range. The physical
  /// memory keeps its contents, and its other ranges if it has any, and may
  /// be mapped again elsewhere.
  virtual Status unmap(void* va, std::size_t bytes) = 0;
  /// handle came from create(bytes) and is mapped nowhere (each of its ranges
  /// unmapped). Returns its memory to the device.
  virtual Status release(PhysicalHandle handle, std::size_t bytes) = 0;

  /// create(bytes_each) `count` times, as one request: a device that
  /// accounts for memory (the ledger) reserves the whole at once, so a
  /// request that must wait for others waits once. count > 0. On failure
  /// none of them is held.
  virtual Expected<std::vector<PhysicalHandle>> create_many(std::size_t bytes_each, std::size_t count) {
    std::vector<PhysicalHandle> handles;
    handles.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      Expected<PhysicalHandle> handle = create(bytes_each);
      if (handle) {
        handles.push_back(*handle);
        continue;
      }
      for (PhysicalHandle made : handles) (void)release(made, bytes_each);
      return std::move(handle).error();
    }
    return handles;
  }

  // --- host copies (a pool's sleep and wake) ------------------------------
  // Unsupported unless a device says otherwise.

  /// bytes > 0. Host memory the device copies to and from at full speed
  /// (pinned on a GPU). Not device memory: no ledger reserves it.
  virtual Expected<void*> allocate_host(std::size_t bytes);
  /// ptr came from allocate_host(bytes) and is not freed yet.
  virtual Status free_host(void* ptr, std::size_t bytes);
  /// [device_src, + bytes) is mapped device memory, host_dst holds bytes.
  /// Returns once the bytes are copied; the caller has synchronized the
  /// streams whose work may still write device_src.
  virtual Status copy_to_host(void* host_dst, const void* device_src, std::size_t bytes);
  /// [device_dst, + bytes) is mapped device memory, host_src holds bytes.
  /// Returns once the bytes are copied.
  virtual Status copy_from_host(void* device_dst, const void* host_src, std::size_t bytes);

  // --- streams -------------------------------------------------------------

  /// Waits until all work queued on `stream` so far has finished. Pools call
  /// it before handing memory freed on one stream to another.
  virtual Status synchronize(Stream stream) = 0;
  /// Whether all work queued on `stream` so far has finished, without
  /// waiting (cudaStreamQuery). Pools ask before they would synchronize: a
  /// stream found idle needs none. A device that cannot tell answers false
  /// (busy), and the pool synchronizes.
  virtual Expected<bool> query(Stream stream) {
    (void)stream;
    return false;
  }
};

/// Waits for the work queued on `stream`: nothing when the device finds it
/// idle, else a synchronize.
inline Status wait_for(Device& device, Stream stream) {
  if (Expected<bool> idle = device.query(stream); idle && *idle) return {};
  return device.synchronize(stream);
}

/// A device that forwards every call to another: the base of the decorators
/// (limit, ledger, counting), in the style of RMM's resource adaptors.
class DeviceAdaptor : public Device {
 public:
  explicit DeviceAdaptor(std::shared_ptr<Device> upstream) : upstream_(std::move(upstream)) {}

  std::string id() const override { return upstream_->id(); }
  std::string description() const override { return upstream_->description(); }
  Expected<void*> allocate(std::size_t bytes) override { return upstream_->allocate(bytes); }
  Status free(void* ptr, std::size_t bytes) override { return upstream_->free(ptr, bytes); }
  MemInfo mem_info() const override { return upstream_->mem_info(); }
  std::size_t granularity() const override { return upstream_->granularity(); }
  bool supports_virtual_memory() const override { return upstream_->supports_virtual_memory(); }
  Expected<void*> reserve(std::size_t va_bytes) override { return upstream_->reserve(va_bytes); }
  Status unreserve(void* va, std::size_t va_bytes) override {
    return upstream_->unreserve(va, va_bytes);
  }
  Expected<PhysicalHandle> create(std::size_t bytes) override { return upstream_->create(bytes); }
  Status map(void* va, std::size_t bytes, PhysicalHandle handle) override {
    return upstream_->map(va, bytes, handle);
  }
  Status map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) override {
    return upstream_->map_many(va, bytes_each, handles);
  }
  Status unmap(void* va, std::size_t bytes) override { return upstream_->unmap(va, bytes); }
  Status release(PhysicalHandle handle, std::size_t bytes) override {
    return upstream_->release(handle, bytes);
  }
  Status synchronize(Stream stream) override { return upstream_->synchronize(stream); }
  Expected<bool> query(Stream stream) override { return upstream_->query(stream); }
  // create_many is not forwarded: the default calls this adaptor's create().
  Expected<void*> allocate_host(std::size_t bytes) override { return upstream_->allocate_host(bytes); }
  Status free_host(void* ptr, std::size_t bytes) override { return upstream_->free_host(ptr, bytes); }
  Status copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override {
    return upstream_->copy_to_host(host_dst, device_src, bytes);
  }
  Status copy_from_host(void* device_dst, const void* host_src, std::size_t bytes) override {
    return upstream_->copy_from_host(device_dst, host_src, bytes);
  }

  Device& upstream() const { return *upstream_; }

 private:
  std::shared_ptr<Device> upstream_;
};

}  // namespace tidepool
