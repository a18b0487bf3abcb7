// The trace model: a sequence of allocation lifetimes, as the readers of
// every format produce it and the replay engine consumes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
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

/// An allocation the recorded program saw fail (PyTorch's `oom` entry, RMM's
/// `allocate failure` line), kept out of the events: where and when it was.
struct RecordedFailure {
  std::size_t before_event = 0;  // index of the event it preceded (events.size(): after the last)
  std::uint64_t bytes = 0;       // the request that failed
  std::int64_t time_us = -1;     // when, -1 if the format has no time
};

/// A trace begins with the blocks that were live when recording began (their
/// alloc is not in the record: a ring buffer that dropped it, a log started
/// mid-run). Readers seed them as the first `seeded_blocks` alloc events,
/// after any leading segment_alloc and before the first recorded event, in
/// this order: the frees whose alloc is missing, in the order of those frees;
/// then blocks live at dump time that no event touches (PyTorch `segments`),
/// in the snapshot's order. They are ordinary blocks: every rule of the model
/// holds for them and every replay allocates them.
struct Trace {
  std::string name;            // file name or built-in workload name
  std::string format;          // "pytorch-snapshot", "rmm-csv", "tidepool", "builtin"
  std::vector<Event> events;
  std::uint32_t num_blocks = 0;          // lifetimes: alloc events
  std::size_t unmatched_frees = 0;       // frees whose alloc the record lacks (ring buffer): seeded
  std::uint32_t seeded_blocks = 0;       // blocks live at the start: the first seeded_blocks allocs
  std::uint64_t seeded_bytes = 0;        // their requested bytes
  std::size_t failed_allocs = 0;         // allocations the recorded program saw fail (kept out of events)
  std::vector<RecordedFailure> failures; // those whose place the format records (<= failed_allocs)
  std::vector<std::string> warnings;     // what the reader wants the user to know (an empty history, ...)
  /// The recorder's settings as (key, value) text: PyTorch's allocator_settings.
  std::vector<std::pair<std::string, std::string>> recorder_settings;
  /// Where each block was allocated, where the format records it (PyTorch's
  /// frames): stacks[block_stacks[block]], one frame a line; index 0 is the
  /// empty stack. block_stacks is empty when no block has one.
  std::vector<std::uint32_t> block_stacks;
  std::vector<std::string> stacks;
  std::size_t device_capacity = 0;       // the recorded device's memory, 0 if unknown
  std::int32_t device = -1;              // the recorded device's index (PyTorch snapshots), -1 if unknown
  bool has_segments = false;             // segment events present: "what the recorder reserved"
};

}  // namespace tidepool::trace
