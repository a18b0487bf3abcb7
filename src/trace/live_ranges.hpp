// The one address rule of the readers whose formats record addresses (the
// PyTorch snapshot, the RMM log): live blocks never overlap. A trace that
// says otherwise is corrupt, not replayable.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>

namespace tidepool::trace {

/// The live block that [address, address + bytes) overlaps, or live.end()
/// when it overlaps none. `live` maps each live block's start address to a
/// value with a `bytes` member. Precondition: address + bytes does not wrap
/// (the caller refuses that first). O(log n): only the neighbours can overlap.
template <class Live>
typename std::map<std::uint64_t, Live>::const_iterator overlapping(const std::map<std::uint64_t, Live>& live,
                                                                   std::uint64_t address, std::uint64_t bytes) {
  auto next = live.lower_bound(address);
  if (next != live.end() && (next->first == address || next->first - address < bytes)) return next;
  if (next != live.begin()) {
    auto previous = std::prev(next);
    if (address - previous->first < previous->second.bytes) return previous;
  }
  return live.end();
}

}  // namespace tidepool::trace
