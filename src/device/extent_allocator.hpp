// Hands out ranges of [0, size): the memfd offsets behind HostDevice's
// physical handles. Lowest offset first, so granules created one after another
// get neighbouring offsets and their mappings merge into one kernel mapping.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <vector>

namespace tidepool::detail {

struct Extent {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

class ExtentAllocator {
 public:
  explicit ExtentAllocator(std::size_t size) : free_bytes_(size) {
    if (size > 0) free_.emplace(0, size);
  }
  ExtentAllocator(const ExtentAllocator&) = delete;
  ExtentAllocator& operator=(const ExtentAllocator&) = delete;

  /// bytes > 0 and bytes <= free_bytes(). The lowest free range that holds
  /// `bytes` whole; when free space is split so that none does, the lowest
  /// free ranges that together hold it, in increasing offset. Empty when
  /// fewer than `bytes` are free.
  std::vector<Extent> allocate(std::size_t bytes) {
    std::vector<Extent> taken;
    if (bytes == 0 || bytes > free_bytes_) return taken;
    for (auto range = free_.begin(); range != free_.end(); ++range) {
      if (range->second >= bytes) {
        taken.push_back({range->first, bytes});
        take_front(range, bytes);
        return taken;
      }
    }
    std::size_t needed = bytes;
    while (needed > 0) {
      auto range = free_.begin();
      const std::size_t piece = range->second < needed ? range->second : needed;
      taken.push_back({range->first, piece});
      take_front(range, piece);
      needed -= piece;
    }
    return taken;
  }

  /// extent came from allocate() and is not freed yet. Merges with its neighbours.
  void free(Extent extent) {
    free_bytes_ += extent.bytes;
    auto next = free_.lower_bound(extent.offset);
    if (next != free_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == extent.offset) {
        extent.offset = previous->first;
        extent.bytes += previous->second;
        free_.erase(previous);
      }
    }
    if (next != free_.end() && extent.offset + extent.bytes == next->first) {
      extent.bytes += next->second;
      free_.erase(next);
    }
    free_.emplace(extent.offset, extent.bytes);
  }

  std::size_t free_bytes() const { return free_bytes_; }
  /// Number of separate free ranges (1 when nothing is taken).
  std::size_t free_ranges() const { return free_.size(); }

 private:
  using Ranges = std::map<std::size_t, std::size_t>;  // offset -> bytes, disjoint, never adjacent

  void take_front(Ranges::iterator range, std::size_t bytes) {
    const std::size_t offset = range->first + bytes;
    const std::size_t left = range->second - bytes;
    free_.erase(range);
    if (left > 0) free_.emplace(offset, left);
    free_bytes_ -= bytes;
  }

  Ranges free_;
  std::size_t free_bytes_ = 0;
};

}  // namespace tidepool::detail
