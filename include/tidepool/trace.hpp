// The trace model: a sequence of allocation lifetimes, as the readers of
// every format produce it and the replay engine consumes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool::trace {

enum class Op : std::uint8_t {
  alloc,          // starts lifetime `block` of `bytes`
  free,           // ends lifetime `block`
  segment_alloc,  // the recorded allocator took `bytes` from the device (PyTorch's segment_alloc/map)
  segment_free,   // ... and gave `bytes` back (segment_free/unmap)
};

/// One event. Lifetimes are numbered densely from 0 in the order of their
/// alloc, so a replay keeps live pointers in a vector, not a hash map.
struct Event {
  Op op;
  std::uint32_t block = 0;    // alloc/free: the lifetime; unused for segment events
  std::uint64_t bytes = 0;    // requested bytes (not rounded); a free carries its alloc's bytes;
                              // segment events: segment bytes
  Stream stream = kDefaultStream;
  std::int64_t time_us = -1;  // when recorded; -1 if the format has no time
};

struct Trace {
  std::string name;            // file name or built-in workload name
  std::string format;          // "pytorch-snapshot", "rmm-csv", "tidepool", "builtin"
  std::vector<Event> events;
  std::uint32_t num_blocks = 0;          // lifetimes: alloc events
  std::size_t unmatched_frees = 0;       // frees whose alloc the record lacks (ring buffer), skipped
  std::size_t failed_allocs = 0;         // allocations the recorded program saw fail (kept out of events)
  std::size_t device_capacity = 0;       // the recorded device's memory, 0 if unknown
  std::int32_t device = -1;              // the recorded device's index (PyTorch snapshots), -1 if unknown
  bool has_segments = false;             // segment events present: "what the recorder reserved"
};

}  // namespace tidepool::trace
