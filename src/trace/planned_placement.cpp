// A placement that knows every lifetime before it places a block: what a
// planner (XLA's buffer assignment, TFLite's greedy-by-size arena) can reach
// on a trace, and so the floor under any online pool's address footprint.
//
// Greedy by size: blocks in decreasing size (ties: the earlier first), each at
// the lowest address where it overlaps no block already placed whose lifetime
// overlaps its own. Time is the allocation ordinal: block b (blocks are
// numbered in alloc order) lives over [b, end), end being the number of
// allocations made before its free (num_blocks when it is never freed), so
// memory freed before an allocation may serve it. Streams are not modelled.
//
// The blocks whose lifetime overlaps [s, e) are those live at s (a segment
// tree over time: each placed lifetime sits in O(log n) nodes, and the nodes
// on the path to leaf s hold exactly the lifetimes covering s) plus those that
// start inside (s, e) (a bitmap of placed starts, scanned a word at a time).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tidepool/replay.hpp"
#include "tidepool/units.hpp"

namespace tidepool::trace {
namespace {

class LifetimeTree {
 public:
  explicit LifetimeTree(std::uint32_t leaves) : leaves_(std::bit_ceil(std::max<std::uint32_t>(leaves, 1))) {
    nodes_.resize(2 * static_cast<std::size_t>(leaves_));
  }

  /// Puts `block`'s lifetime [begin, end) in the canonical nodes covering it.
  void insert(std::uint32_t block, std::uint32_t begin, std::uint32_t end) {
    std::size_t low = begin + static_cast<std::size_t>(leaves_);
    std::size_t high = end + static_cast<std::size_t>(leaves_);
    while (low < high) {
      if (low & 1) nodes_[low++].push_back(block);
      if (high & 1) nodes_[--high].push_back(block);
      low >>= 1;
      high >>= 1;
    }
  }

  /// Calls `visit` with every lifetime covering time `at`.
  template <class Visit>
  void stab(std::uint32_t at, Visit&& visit) const {
    for (std::size_t node = at + static_cast<std::size_t>(leaves_); node != 0; node >>= 1) {
      for (const std::uint32_t block : nodes_[node]) visit(block);
    }
  }

 private:
  std::uint32_t leaves_;
  std::vector<std::vector<std::uint32_t>> nodes_;
};

}  // namespace

std::optional<PlannedPlacement> plan_placement(const Trace& trace, std::uint64_t max_work) {
  const std::uint32_t blocks = trace.num_blocks;
  PlannedPlacement plan;
  plan.offsets.assign(blocks, 0);
  std::vector<std::uint64_t> bytes(blocks, 0);
  std::vector<std::uint32_t> end(blocks, blocks);
  std::uint32_t allocs = 0;
  for (const Event& event : trace.events) {
    if (event.op == Op::alloc && event.block < blocks) {
      bytes[event.block] = std::max<std::uint64_t>(kPlanAlignment, round_up(event.bytes, kPlanAlignment));
      ++allocs;
    } else if (event.op == Op::free && event.block < blocks) {
      end[event.block] = allocs;
    }
  }
  std::vector<std::uint32_t> order(blocks);
  for (std::uint32_t block = 0; block < blocks; ++block) order[block] = block;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return bytes[a] > bytes[b]; });

  LifetimeTree live(blocks);
  std::vector<std::uint64_t> started((static_cast<std::size_t>(blocks) + 63) / 64, 0);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> neighbours;  // (offset, bytes) of overlapping lifetimes
  std::uint64_t work = 0;
  for (const std::uint32_t block : order) {
    const std::uint32_t begin = block;
    const std::uint32_t finish = std::max(end[block], begin + 1);  // a block freed at once still holds its bytes
    neighbours.clear();
    auto add = [&](std::uint32_t other) { neighbours.emplace_back(plan.offsets[other], bytes[other]); };
    live.stab(begin, add);
    // Placed lifetimes starting in (begin, finish): a word of the bitmap at a time.
    for (std::uint32_t at = begin + 1; at < finish;) {
      const std::size_t word = at / 64;
      std::uint64_t bits = started[word] & (~std::uint64_t{0} << (at % 64));
      const std::uint32_t word_end = std::min<std::uint32_t>(finish, static_cast<std::uint32_t>(word * 64 + 64));
      while (bits != 0) {
        const std::uint32_t other = static_cast<std::uint32_t>(word * 64 + std::countr_zero(bits));
        if (other >= word_end) break;
        add(other);
        bits &= bits - 1;
      }
      at = word_end;
      ++work;
    }
    work += neighbours.size();
    if (work > max_work) return std::nullopt;
    std::sort(neighbours.begin(), neighbours.end());
    std::uint64_t offset = 0;
    for (const auto& [other_offset, other_bytes] : neighbours) {
      if (other_offset >= offset + bytes[block]) break;  // the gap below this one fits
      offset = std::max(offset, other_offset + other_bytes);
    }
    plan.offsets[block] = offset;
    plan.footprint_bytes = std::max(plan.footprint_bytes, offset + bytes[block]);
    live.insert(block, begin, finish);
    started[block / 64] |= std::uint64_t{1} << (block % 64);
  }
  plan.bytes = std::move(bytes);
  plan.ends = std::move(end);
  return plan;
}

}  // namespace tidepool::trace
