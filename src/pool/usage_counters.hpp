// The counters every pool keeps, with JAX's memory_stats() meanings (XLA's
// tsl::AllocatorStats as BFC fills them), in one place. Internal; the owner
// serializes access.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tidepool/allocator.hpp"

namespace tidepool::pool {

struct UsageCounters {
  std::int64_t bytes_in_use = 0;
  std::int64_t peak_bytes_in_use = 0;
  std::int64_t num_allocs = 0;
  std::int64_t largest_alloc_size = 0;
  std::int64_t pool_bytes = 0;  // held from the device
  std::int64_t peak_pool_bytes = 0;
  std::int64_t num_device_allocs = 0;
  std::int64_t num_device_frees = 0;
  std::int64_t num_ooms = 0;

  /// A block of `bytes` (after rounding) handed out.
  [[gnu::always_inline]] void allocated(std::size_t bytes) noexcept {
    const auto n = static_cast<std::int64_t>(bytes);
    ++num_allocs;
    bytes_in_use += n;
    peak_bytes_in_use = std::max(peak_bytes_in_use, bytes_in_use);
    largest_alloc_size = std::max(largest_alloc_size, n);
  }
  void freed(std::size_t bytes) noexcept { bytes_in_use -= static_cast<std::int64_t>(bytes); }
  /// `bytes` taken from the device by one successful call.
  void reserved(std::size_t bytes) noexcept {
    ++num_device_allocs;
    pool_bytes += static_cast<std::int64_t>(bytes);
    peak_pool_bytes = std::max(peak_pool_bytes, pool_bytes);
  }
  /// `bytes` given back to the device by one call.
  void released(std::size_t bytes) noexcept {
    ++num_device_frees;
    pool_bytes -= static_cast<std::int64_t>(bytes);
  }

  /// The counters as Stats; bytes_reserved is pool_bytes (what is held from
  /// the device). The caller adds bytes_limit and largest_free_block_bytes.
  Stats to_stats() const noexcept {
    Stats stats;
    stats.bytes_in_use = bytes_in_use;
    stats.peak_bytes_in_use = peak_bytes_in_use;
    stats.num_allocs = num_allocs;
    stats.largest_alloc_size = largest_alloc_size;
    stats.bytes_reserved = pool_bytes;
    stats.peak_bytes_reserved = peak_pool_bytes;
    stats.pool_bytes = pool_bytes;
    stats.peak_pool_bytes = peak_pool_bytes;
    stats.num_device_allocs = num_device_allocs;
    stats.num_device_frees = num_device_frees;
    stats.num_ooms = num_ooms;
    return stats;
  }
};

}  // namespace tidepool::pool
