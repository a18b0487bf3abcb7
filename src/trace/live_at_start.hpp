// Seeding (trace.hpp): the blocks live when recording began, collected while
// a reader walks its input and put in front of the events when it is done.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tidepool/trace.hpp"

namespace tidepool::trace::detail {

class LiveAtStart {
 public:
  /// The free of a block whose alloc the record lacks. Returns the free event
  /// to append to trace.events (call before appending it).
  Event free_of_unrecorded(const Trace& trace, std::uint64_t bytes, Stream stream, std::int64_t time_us) {
    seeded_frees_.push_back(trace.events.size());
    return Event{Op::free, add(bytes, stream, 0), bytes, stream, time_us};
  }

  /// A block live at the start and never freed in the record; `stack`
  /// indexes trace.stacks (0: unknown).
  void live_throughout(std::uint64_t bytes, Stream stream, std::uint32_t stack) { add(bytes, stream, stack); }

  /// Prepends the seeded allocs (trace.hpp gives the order), renumbers the
  /// recorded blocks after them and moves the failures' places along. Call
  /// once, after the last event was appended.
  void prepend_to(Trace& trace) const {
    const auto seeded = static_cast<std::uint32_t>(seeds_.size());
    if (seeded == 0) return;
    std::size_t next_seeded_free = 0;
    for (std::size_t index = 0; index < trace.events.size(); ++index) {
      Event& event = trace.events[index];
      if (event.op != Op::alloc && event.op != Op::free) continue;
      if (next_seeded_free < seeded_frees_.size() && seeded_frees_[next_seeded_free] == index) {
        ++next_seeded_free;  // already numbered among the seeded
        continue;
      }
      event.block += seeded;
    }
    const std::int64_t start_us = trace.events.empty() ? -1 : trace.events.front().time_us;
    std::vector<Event> allocs;
    allocs.reserve(seeds_.size());
    for (std::uint32_t block = 0; block < seeded; ++block) {
      allocs.push_back(Event{Op::alloc, block, seeds_[block].bytes, seeds_[block].stream, start_us});
    }
    trace.events.insert(trace.events.begin(), allocs.begin(), allocs.end());
    for (RecordedFailure& failure : trace.failures) failure.before_event += seeded;
    const bool any_stack = std::any_of(seeds_.begin(), seeds_.end(), [](const Seed& seed) { return seed.stack != 0; });
    if (any_stack || !trace.block_stacks.empty()) {
      trace.block_stacks.resize(trace.num_blocks, 0);
      std::vector<std::uint32_t> stacks;
      stacks.reserve(seeds_.size() + trace.block_stacks.size());
      for (const Seed& seed : seeds_) stacks.push_back(seed.stack);
      stacks.insert(stacks.end(), trace.block_stacks.begin(), trace.block_stacks.end());
      trace.block_stacks = std::move(stacks);
    }
    trace.num_blocks += seeded;
    trace.seeded_blocks = seeded;
    trace.seeded_bytes = 0;
    for (const Seed& seed : seeds_) trace.seeded_bytes += seed.bytes;
  }

 private:
  struct Seed {
    std::uint64_t bytes;
    Stream stream;
    std::uint32_t stack;
  };
  std::uint32_t add(std::uint64_t bytes, Stream stream, std::uint32_t stack) {
    seeds_.push_back({bytes, stream, stack});
    return static_cast<std::uint32_t>(seeds_.size() - 1);
  }
  std::vector<Seed> seeds_;
  std::vector<std::size_t> seeded_frees_;  // indexes in trace.events, ascending
};

}  // namespace tidepool::trace::detail
