// HostDevice: a real virtual-memory device on the CPU, so that every pool and
// every test runs the same code path as on a GPU without one.
//
// Physical memory is one memfd, sized to the capacity (sparse: it costs
// nothing until written). A physical handle is a set of memfd ranges; map()
// puts them into a reserved address range with mmap(MAP_SHARED|MAP_FIXED), so
// the same physical memory can be unmapped and mapped again elsewhere with its
// contents intact, as with cuMemMap. release() punches the ranges out of the
// memfd, so the memory really goes back to the OS. The device itself never
// touches memory: an 80 GiB device works on a machine with far less.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tidepool/device.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

struct HostDeviceOptions {
  /// Bytes of physical memory the device offers: a positive multiple of granularity.
  std::size_t capacity = 16 * GiB;
  /// Unit of physical memory and mapping: a power of two, at least the page
  /// size and at least kMinAlignment.
  std::size_t granularity = 2 * MiB;
  /// Names the device: id() is "host:<name>". Letters, digits, '.', '_' and '-'.
  std::string name = "host";
  /// Most kernel mappings (VMAs) the device may hold at once. 0: derived from
  /// /proc/sys/vm/max_map_count, leaving headroom for the rest of the process.
  std::size_t max_mappings = 0;
};

class HostDevice final : public Device {
 public:
  /// A device with `options`; invalid_argument naming the option when one is
  /// out of range, device_error when the OS refuses the memfd.
  static Expected<std::shared_ptr<HostDevice>> create(HostDeviceOptions options = {});

  /// Unmaps whatever is still mapped or allocated and closes the memfd.
  ~HostDevice() override;
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  std::string id() const override;
  std::string description() const override;

  /// bytes > 0. An anonymous mapping (page-aligned), accounted at its
  /// page-rounded size.
  Expected<void*> allocate(std::size_t bytes) override;
  /// ptr came from allocate(bytes) and is not freed yet (invalid_pointer otherwise).
  Status free(void* ptr, std::size_t bytes) override;

  /// free = capacity - (physical bytes created + plain bytes allocated).
  MemInfo mem_info() const override;
  std::size_t granularity() const override;
  bool supports_virtual_memory() const override { return true; }

  /// va_bytes > 0, a multiple of granularity(). PROT_NONE address space,
  /// granularity-aligned; costs no memory.
  Expected<void*> reserve(std::size_t va_bytes) override;
  /// [va, va + va_bytes) is exactly one reservation with nothing mapped in it.
  Status unreserve(void* va, std::size_t va_bytes) override;
  /// bytes > 0, a multiple of granularity(); out_of_memory when fewer are free.
  Expected<PhysicalHandle> create(std::size_t bytes) override;
  /// handle is live and mapped nowhere, bytes is its size, va is
  /// granularity-aligned and [va, va + bytes) is unmapped inside one
  /// reservation. limit_reached when the mapping would take the device past
  /// max_mappings kernel mappings.
  Status map(void* va, std::size_t bytes, PhysicalHandle handle) override;
  /// map() of each handle side by side, with one mmap per run of handles
  /// whose memfd ranges are adjacent too.
  Status map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) override;
  /// [va, va + bytes) is exactly one earlier map() call's range. The range
  /// goes back to PROT_NONE reserved space; the physical memory keeps its data.
  /// Never refused for the mapping budget (its headroom absorbs a split).
  Status unmap(void* va, std::size_t bytes) override;
  /// handle is live, mapped nowhere, and bytes is its size. Punches its memory
  /// out of the memfd (double_free when it was released already).
  Status release(PhysicalHandle handle, std::size_t bytes) override;
  /// The host has no asynchronous work: always succeeds.
  Status synchronize(Stream stream) override;
  /// The host has no asynchronous work: every stream is idle (true).
  Expected<bool> query(Stream stream) override;
  /// bytes > 0. An anonymous mapping of its own (page-aligned), outside
  /// the device's capacity: the host copy of a sleeping tag.
  Expected<void*> allocate_host(std::size_t bytes) override;
  /// ptr came from allocate_host(bytes).
  Status free_host(void* ptr, std::size_t bytes) override;
  /// memcpy: device memory is host memory here.
  Status copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override;
  Status copy_from_host(void* device_dst, const void* host_src, std::size_t bytes) override;

  /// Kernel mappings (VMAs) the device holds now, counted as the kernel merges
  /// them: an upper bound of what /proc/self/maps shows for its ranges.
  std::size_t mapping_count() const;
  /// The most mapping_count() may reach through map(), reserve() and allocate().
  std::size_t max_mappings() const;
  /// Bytes of the memfd actually backed by memory (from fstat's st_blocks).
  std::size_t resident_bytes() const;

 private:
  struct State;
  explicit HostDevice(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
