// When each stream was last synchronized, in a best-fit arena's count of
// frees: a free chunk waits for its stream while it was freed after that.
// Asked for every candidate a placement weighs (up to 65 per allocation),
// so a lookup is one probe of a small direct-mapped table, not a search
// through every stream. Internal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "pool/chunk_table.hpp"

namespace tidepool::pool {

class SyncClocks {
 public:
  /// The count at `stream`'s last synchronize; 0 if it never was (counts of
  /// frees start at 1, so everything it freed still waits).
  std::uint64_t at(Stream stream) const noexcept {
    const Slot& slot = slots_[index(stream)];
    if (slot.stream == stream) return slot.at;
    for (const auto& [other, at] : overflow_) {
      if (other == stream) return at;
    }
    return 0;
  }
  /// `stream` was synchronized when the count was `at`.
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
