// Traces written by hand for the trace layer's tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tidepool/trace.hpp"

namespace tidepool::trace {

/// Builds a trace from allocs and frees in order; lifetimes are numbered as allocated.
class TraceBuilder {
 public:
  explicit TraceBuilder(std::string name = "test") { trace_.name = std::move(name); trace_.format = "test"; }
  /// Starts a lifetime of `bytes`; returns its number.
  std::uint32_t alloc(std::uint64_t bytes, std::int64_t time_us = -1) {
    const std::uint32_t block = trace_.num_blocks++;
    bytes_.push_back(bytes);
    trace_.events.push_back(Event{Op::alloc, block, bytes, kDefaultStream, time_us});
    return block;
  }
  void free(std::uint32_t block, std::int64_t time_us = -1) {
    trace_.events.push_back(Event{Op::free, block, bytes_[block], kDefaultStream, time_us});
  }
  void segment(Op op, std::uint64_t bytes) {
    trace_.events.push_back(Event{op, 0, bytes, kDefaultStream, -1});
    trace_.has_segments = true;
  }
  const Trace& trace() const { return trace_; }

 private:
  Trace trace_;
  std::vector<std::uint64_t> bytes_;
};

}  // namespace tidepool::trace
