// A placement that knows every lifetime before it places a block: what a
// planner (XLA's buffer assignment, TFLite's GPU delegate) can reach on a
// trace, and so about the least memory that serves it with no block moved.
//
// Greedy by size: blocks in decreasing size (ties: the earlier first), each at
// the lowest address where it overlaps no block already placed whose lifetime
// overlaps its own (TFLite's GreedyBySizeAssignment takes the smallest gap
// instead, which packs looser on these traces: docs/replay.md). Time is the
// allocation ordinal: block b (blocks are numbered in alloc order) lives over
// [b, end), end being the number of allocations made before its free
// (num_blocks when it is never freed), so memory freed before an allocation
// may serve it. Streams are not modelled.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "pool/lifetime_plan.hpp"
#include "tidepool/replay.hpp"
#include "tidepool/units.hpp"

namespace tidepool::trace {

std::optional<PlannedPlacement> plan_placement(const Trace& trace, const PlanLimits& limits) {
  const std::uint32_t blocks = trace.num_blocks;
  if (blocks > limits.max_blocks) return std::nullopt;
  std::vector<pool::Lifetime> lives(blocks);
  std::vector<std::uint32_t> end(blocks, blocks);
  std::uint32_t allocs = 0;
  for (const Event& event : trace.events) {
    if (event.op == Op::alloc && event.block < blocks) {
      if (event.bytes > std::numeric_limits<std::uint64_t>::max() - kPlanAlignment) return std::nullopt;
      lives[event.block].bytes = std::max<std::uint64_t>(kPlanAlignment, round_up(event.bytes, kPlanAlignment));
      ++allocs;
    } else if (event.op == Op::free && event.block < blocks) {
      end[event.block] = allocs;
    }
  }
  for (std::uint32_t block = 0; block < blocks; ++block) {
    lives[block].begin = block;
    lives[block].end = std::max(end[block], block + 1);  // a block freed at once still holds its bytes
  }
  std::optional<pool::LifetimePlan> placed = pool::plan_lifetimes(lives, blocks, limits.max_work);
  if (!placed) return std::nullopt;
  PlannedPlacement plan;
  plan.offsets = std::move(placed->offsets);
  plan.footprint_bytes = placed->footprint_bytes;
  plan.bytes.resize(blocks);
  for (std::uint32_t block = 0; block < blocks; ++block) plan.bytes[block] = lives[block].bytes;
  plan.ends = std::move(end);
  return plan;
}

}  // namespace tidepool::trace
