// `tidepool run --pool`: the figures of a pool that served a program, said
// at exit on stderr and written to TIDEPOOL_REPORT's file (docs/interop.md).
#pragma once

#include <cstdint>
#include <string>

#include "tidepool/allocator.hpp"
#include "tidepool/error.hpp"

namespace tidepool::preload {

struct PoolSummary {
  int device = 0;
  std::string mode;
  std::int64_t allocations = 0;          // cuMemAlloc_v2 calls it served
  std::int64_t peak_live_bytes = 0;      // most bytes the program held at once, as it asked for them
  std::int64_t peak_reserved_bytes = 0;  // most bytes the pool held from the device
  std::int64_t device_calls = 0;         // the pool's driver calls: allocations, frees, maps, unmaps
  std::int64_t ooms = 0;                 // requests refused
  Stats stats;                           // the pool's own counters, all of them

  static PoolSummary of(int device, std::string mode, const Stats& stats, std::int64_t peak_live_bytes);
  /// One line: "pool expandable on device 0: peak reserved 64.0 MiB, ...".
  std::string text() const;
  /// As JSON to `path` (io_error naming it).
  Status write(const std::string& path) const;
};

}  // namespace tidepool::preload
