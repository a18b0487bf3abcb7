// A placement that knows every lifetime before it places a block: what a
// planner (XLA's buffer assignment, TFLite's GPU delegate) can reach on a
// trace, and so about the least memory that serves it with no block moved.
//
// Greedy by size: blocks in decreasing size (ties: the earlier first), each at
// the lowest address where it overlaps no block already placed whose lifetime
// overlaps its own (TFLite's GreedyBySizeAssignment takes the smallest gap
// instead, which packs looser on these traces: docs/replay.md). Time is the
// caller's (lifetime_plan.hpp).
//
// Finding that address is a query in two dimensions, time and address. A
// segment tree over time keeps, at each node, two sets of address ranges
// (merged: ranges side by side become one): `own`, the blocks of which the
// node is a piece (a lifetime is O(log n) pieces, the nodes whose spans make
// it up), and `below`, the blocks with a piece at or under the node. The
// blocks live at some time in [s, e) are in `below` of the pieces of [s, e) or
// in `own` of the nodes above those pieces, which lie on the paths from leaves
// s and e - 1 to the root: O(log n) sets, and first fit steps over their
// ranges, lowest first. Packed blocks merge, so the sets stay short where the
// plan is dense, which is where a list of the blocks live would be long
// (thousands of small tensors live at once).
#include "pool/lifetime_plan.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace tidepool::pool {
namespace {

/// Disjoint address ranges [start, end), sorted, none touching another.
class RangeSet {
 public:
  /// Adds [start, end), merging what it touches; returns the ranges moved (work).
  std::size_t add(std::uint64_t start, std::uint64_t end) {
    // The first range that ends at or after start (it may touch), and the first that starts after end.
    auto first = std::lower_bound(ranges_.begin(), ranges_.end(), start,
                                  [](const Range& range, std::uint64_t at) { return range.second < at; });
    auto last = first;
    while (last != ranges_.end() && last->first <= end) {
      start = std::min(start, last->first);
      end = std::max(end, last->second);
      ++last;
    }
    if (first == last) {
      const std::size_t moved = static_cast<std::size_t>(ranges_.end() - first);
      ranges_.insert(first, Range{start, end});
      return moved + 1;
    }
    *first = Range{start, end};
    const std::size_t moved = static_cast<std::size_t>(ranges_.end() - last);
    ranges_.erase(first + 1, last);
    return moved + 1;
  }

  /// The first range that ends after `start`: size() when none does.
  std::size_t first_ending_after(std::uint64_t start, std::size_t from = 0) const {
    return static_cast<std::size_t>(
        std::upper_bound(ranges_.begin() + static_cast<std::ptrdiff_t>(from), ranges_.end(), start,
                         [](std::uint64_t at, const Range& range) { return at < range.second; }) -
        ranges_.begin());
  }
  std::size_t size() const { return ranges_.size(); }
  std::uint64_t start(std::size_t at) const { return ranges_[at].first; }
  std::uint64_t end(std::size_t at) const { return ranges_[at].second; }

  bool empty() const { return ranges_.empty(); }

 private:
  using Range = std::pair<std::uint64_t, std::uint64_t>;
  std::vector<Range> ranges_;
};

class LifetimeTree {
 public:
  explicit LifetimeTree(std::uint32_t leaves) : leaves_(std::bit_ceil(std::max<std::uint32_t>(leaves, 1))) {
    own_.resize(2 * static_cast<std::size_t>(leaves_));
    below_.resize(2 * static_cast<std::size_t>(leaves_));
  }

  /// The lowest address from which `bytes` overlap no block placed with a
  /// lifetime overlapping [begin, end). Adds the probes it made to `work`.
  std::uint64_t lowest_fit(std::uint32_t begin, std::uint32_t end, std::uint64_t bytes, std::uint64_t& work) {
    sets_.clear();
    for_each_piece(begin, end, [&](std::size_t node) { add_set(below_[node]); });
    for_each_above(begin, end, [&](std::size_t node) { add_set(own_[node]); });
    // First fit: the sets' ranges, lowest start first (one cursor per set, a
    // heap of them), each either below the candidate (its set's cursor jumps
    // past the candidate), blocking it (the candidate moves past it) or wholly
    // above it, and then so is every other: the candidate fits.
    cursors_.clear();
    for (std::size_t set = 0; set < sets_.size(); ++set) cursors_.push_back({sets_[set]->start(0), set, 0});
    std::make_heap(cursors_.begin(), cursors_.end(), Cursor::later);
    std::uint64_t offset = 0;
    while (!cursors_.empty()) {
      ++work;
      std::pop_heap(cursors_.begin(), cursors_.end(), Cursor::later);
      Cursor& cursor = cursors_.back();
      const RangeSet& set = *sets_[cursor.set];
      if (cursor.start >= offset + bytes) break;                     // the lowest start is above: fits
      if (set.end(cursor.at) > offset) offset = set.end(cursor.at);  // blocks: step past it
      cursor.at = set.first_ending_after(offset, cursor.at);
      if (cursor.at == set.size()) {
        cursors_.pop_back();
        continue;
      }
      cursor.start = set.start(cursor.at);
      std::push_heap(cursors_.begin(), cursors_.end(), Cursor::later);
    }
    return offset;
  }

  /// Records a block at [offset, offset + bytes) over the lifetime [begin,
  /// end); returns the work it took (ranges moved).
  std::uint64_t insert(std::uint32_t begin, std::uint32_t end, std::uint64_t offset, std::uint64_t bytes) {
    std::uint64_t work = 0;
    for_each_piece(begin, end, [&](std::size_t node) {
      work += own_[node].add(offset, offset + bytes);
      work += below_[node].add(offset, offset + bytes);
    });
    for_each_above(begin, end, [&](std::size_t node) { work += below_[node].add(offset, offset + bytes); });
    return work;
  }

 private:
  /// The O(log n) nodes whose spans make up [begin, end) exactly.
  template <class Visit>
  void for_each_piece(std::uint32_t begin, std::uint32_t end, Visit&& visit) const {
    std::size_t low = begin + static_cast<std::size_t>(leaves_);
    std::size_t high = end + static_cast<std::size_t>(leaves_);
    while (low < high) {
      if (low & 1) visit(low++);
      if (high & 1) visit(--high);
      low >>= 1;
      high >>= 1;
    }
  }
  /// The nodes above leaves begin and end - 1, each once: every ancestor of a
  /// piece of [begin, end) is one (a piece's parent spans past the lifetime on
  /// one side, so it holds leaf begin or leaf end - 1).
  template <class Visit>
  void for_each_above(std::uint32_t begin, std::uint32_t end, Visit&& visit) const {
    std::size_t left = (begin + static_cast<std::size_t>(leaves_)) >> 1;
    std::size_t right = (end - 1 + static_cast<std::size_t>(leaves_)) >> 1;
    for (; left != right; left >>= 1, right >>= 1) {
      visit(left);
      visit(right);
    }
    for (; left != 0; left >>= 1) visit(left);
  }
  void add_set(const RangeSet& set) {
    if (!set.empty()) sets_.push_back(&set);
  }

  // A block is in own_ of its lifetime's pieces, and in below_ of those and of
  // every node above them. The blocks live at some time in [s, e) are then in
  // below_ of the pieces of [s, e) (blocks whose pieces are at or under them)
  // or in own_ of the nodes above those pieces (blocks with a piece above).
  std::uint32_t leaves_;
  std::vector<RangeSet> own_;
  std::vector<RangeSet> below_;
  std::vector<const RangeSet*> sets_;
  struct Cursor {
    std::uint64_t start;  // of the range it is at
    std::size_t set;
    std::size_t at;
    /// The heap's order: lowest start first (which of two equal starts comes
    /// first changes nothing: the fit found is the lowest either way).
    static bool later(const Cursor& a, const Cursor& b) noexcept { return a.start > b.start; }
  };
  std::vector<Cursor> cursors_;
};

}  // namespace

std::optional<LifetimePlan> plan_lifetimes(std::span<const Lifetime> blocks, std::uint32_t time_span,
                                           std::uint64_t max_work, const std::atomic<bool>* stop) {
  std::uint64_t total = 0;  // every offset + bytes is at most this: none overflows when it does not
  for (const Lifetime& block : blocks) {
    if (__builtin_add_overflow(total, block.bytes, &total)) return std::nullopt;
  }
  std::vector<std::uint32_t> order(blocks.size());
  for (std::uint32_t block = 0; block < order.size(); ++block) order[block] = block;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return blocks[a].bytes > blocks[b].bytes; });

  LifetimePlan plan;
  plan.offsets.assign(blocks.size(), 0);
  LifetimeTree live(time_span);
  std::uint64_t work = 0;
  for (const std::uint32_t block : order) {
    const Lifetime& life = blocks[block];
    const std::uint64_t offset = live.lowest_fit(life.begin, life.end, life.bytes, work);
    work += live.insert(life.begin, life.end, offset, life.bytes);
    if (work > max_work || (stop != nullptr && stop->load(std::memory_order_relaxed))) return std::nullopt;
    plan.offsets[block] = offset;
    plan.footprint_bytes = std::max(plan.footprint_bytes, offset + life.bytes);
  }
  return plan;
}

}  // namespace tidepool::pool
