// The pool layer's one interface: how bytes are handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool {

class Sleepable;

/// Allocator statistics. The first group has JAX's `Device.memory_stats()`
/// names and meanings (XLA's tsl::AllocatorStats); the rest are tidepool's.
struct Stats {
  // --- JAX memory_stats() ---
  std::int64_t bytes_in_use = 0;        // bytes handed out and not yet freed (after rounding)
  std::int64_t peak_bytes_in_use = 0;
  std::int64_t num_allocs = 0;          // successful allocations since creation
  std::int64_t largest_alloc_size = 0;  // largest single allocation (after rounding)
  std::int64_t bytes_limit = 0;         // the most this allocator may take from the device
  std::int64_t bytes_reserved = 0;      // bytes held from the device, in use or cached
  std::int64_t peak_bytes_reserved = 0;
  std::int64_t largest_free_block_bytes = 0;  // largest request served with no device call
  std::int64_t pool_bytes = 0;          // bytes of the pool's regions (= bytes_reserved)
  std::int64_t peak_pool_bytes = 0;

  // --- tidepool ---
  std::int64_t num_device_allocs = 0;   // device allocate()/create() calls that succeeded
  std::int64_t num_device_frees = 0;    // device free()/release() calls
  std::int64_t num_ooms = 0;            // requests refused with out_of_memory

  // --- virtual-memory pools (0 elsewhere) ---
  std::int64_t bytes_mapped = 0;        // physical bytes mapped into the pool's reservation
  std::int64_t granules_free = 0;       // mapped granules with nothing live in them
  std::int64_t num_maps = 0;
  std::int64_t num_unmaps = 0;
  std::int64_t num_stitches = 0;        // large requests served by remapping scattered granules
  std::int64_t num_releases = 0;        // granules handed back to the device
  std::int64_t bytes_asleep = 0;        // physical bytes given back by sleeping tags (sleep.hpp)

  /// 1 - largest_free_block / free bytes in the pool; 0 when nothing is free.
  double fragmentation() const {
    const std::int64_t free_bytes = bytes_reserved - bytes_in_use;
    if (free_bytes <= 0) return 0.0;
    return 1.0 - static_cast<double>(largest_free_block_bytes) / static_cast<double>(free_bytes);
  }

  /// Every counter by name, in declaration order: one list serves the
  /// table, the JSON report and the Python dict.
  std::vector<std::pair<std::string_view, std::int64_t>> items() const {
    return {{"bytes_in_use", bytes_in_use},
            {"peak_bytes_in_use", peak_bytes_in_use},
            {"num_allocs", num_allocs},
            {"largest_alloc_size", largest_alloc_size},
            {"bytes_limit", bytes_limit},
            {"bytes_reserved", bytes_reserved},
            {"peak_bytes_reserved", peak_bytes_reserved},
            {"largest_free_block_bytes", largest_free_block_bytes},
            {"pool_bytes", pool_bytes},
            {"peak_pool_bytes", peak_pool_bytes},
            {"num_device_allocs", num_device_allocs},
            {"num_device_frees", num_device_frees},
            {"num_ooms", num_ooms},
            {"bytes_mapped", bytes_mapped},
            {"granules_free", granules_free},
            {"num_maps", num_maps},
            {"num_unmaps", num_unmaps},
            {"num_stitches", num_stitches},
            {"num_releases", num_releases},
            {"bytes_asleep", bytes_asleep}};
  }
};

/// Hands out device memory. Implementations are thread-safe.
///
/// Stream semantics (as in RMM and PyTorch): memory freed on a stream may be
/// handed out again on that stream at once; on another stream only after the
/// pool has made sure the work queued on the freeing stream has finished
/// (Device::synchronize).
class Allocator {
 public:
  virtual ~Allocator() = default;

  /// "bfc", "growth", "platform", "expandable", ...
  virtual std::string_view name() const = 0;

  /// A kMinAlignment-aligned block of at least `bytes`. bytes == 0 returns
  /// nullptr (as XLA's BFC and RMM do). Errors: out_of_memory with a report.
  virtual Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) = 0;

  /// ptr came from allocate() on this allocator and is not freed yet;
  /// nullptr is a no-op. A pointer never handed out is invalid_pointer, one
  /// freed already is double_free; neither changes the allocator.
  virtual Status deallocate(void* ptr, Stream stream = kDefaultStream) = 0;

  virtual Stats stats() const = 0;

  /// Returns every cached, fully free piece of device memory to the device.
  /// Returns the bytes released.
  virtual std::size_t trim() = 0;

  /// The memory map, for people and OOM reports: regions, chunks in use and
  /// free by size, bins.
  virtual std::string dump() const = 0;

  /// The device this allocator takes memory from.
  virtual Device& device() const = 0;

  /// Tags, sleep and wake (sleep.hpp), where this allocator offers them
  /// (ExpandablePool, and decorators over one); null otherwise.
  virtual Sleepable* sleepable() noexcept { return nullptr; }
};

}  // namespace tidepool
