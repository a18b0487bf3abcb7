// A number per stream, found in one probe of a small direct-mapped table
// (with overflow), not by a search through every stream: a best-fit arena's
// clock of each stream's last synchronize, asked for every candidate a
// placement weighs, and the granule table's bitmap slot of each stream,
// asked at every free. 0 for a stream never set. Internal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "pool/chunk_table.hpp"

namespace tidepool::pool {

class StreamValues {
 public:
  /// `stream`'s number; 0 if it was never set.
  std::uint64_t at(Stream stream) const noexcept {
    const Slot& slot = slots_[index(stream)];
    if (slot.stream == stream) return slot.at;
    for (const auto& [other, at] : overflow_) {
      if (other == stream) return at;
    }
    return 0;
  }
  /// Sets `stream`'s number to `at`.
  void set(Stream stream, std::uint64_t at) {
    Slot& slot = slots_[index(stream)];
    if (slot.stream == stream || slot.stream == kNoStream) {
      slot = {stream, at};
      return;
    }
    for (auto& [other, other_at] : overflow_) {
      if (other == stream) {
        other_at = at;
        return;
      }
    }
    overflow_.emplace_back(stream, at);  // two streams on one slot: rare
  }

 private:
  static constexpr std::size_t kSlotBits = 6;
  /// Fibonacci hashing: stream ids are small integers or aligned pointers.
  static std::size_t index(Stream stream) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(stream) * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  struct Slot {
    Stream stream = kNoStream;
    std::uint64_t at = 0;
  };
  std::array<Slot, std::size_t{1} << kSlotBits> slots_{};
  std::vector<std::pair<Stream, std::uint64_t>> overflow_;
};

}  // namespace tidepool::pool
