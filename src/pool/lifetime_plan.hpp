// Placing blocks whose lifetimes are all known before any is placed: greedy
// by size, first fit (each block, largest first, at the lowest address free
// over its whole lifetime), as planners place a program's temporaries before
// it runs (XLA's buffer assignment; TFLite's GPU delegate, which takes the
// smallest gap instead: docs/replay.md). Used by the replay's `planned`
// figure (trace/planned_placement.cpp) and by the expandable pool's step
// plan (pool/step_plan.hpp). Internal to the library.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tidepool::pool {

/// A block of `bytes` (0: it holds nothing) live over [begin, end), begin < end <= the time
/// span. Time is whatever the caller counts (the replay and the pool: the
/// allocation ordinal, so memory freed before an allocation may serve it).
struct Lifetime {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
  std::uint64_t bytes = 0;
};

struct LifetimePlan {
  std::vector<std::uint64_t> offsets;  // per block, from the plan's base
  std::uint64_t footprint_bytes = 0;   // the highest offset + bytes
};

/// Places `blocks` (sizes already aligned as the caller needs; ties in size
/// go to the earlier block in the span) so that no two whose lifetimes
/// overlap overlap in address. nullopt when it would take more than
/// `max_work` ranges visited or moved, or when the sum of the sizes
/// overflows 64 bits, or once `*stop` is set (checked a block at a time).
/// Time and memory: O(n log n) sets of merged ranges.
std::optional<LifetimePlan> plan_lifetimes(std::span<const Lifetime> blocks, std::uint32_t time_span,
                                           std::uint64_t max_work, const std::atomic<bool>* stop = nullptr);

}  // namespace tidepool::pool
