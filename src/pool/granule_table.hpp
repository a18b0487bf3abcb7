// The physical side of ExpandablePool: one record per granule of reserved
// address space, saying whether a physical handle is mapped there and how many
// live blocks overlap it, and a list of the mapped granules no block uses, in
// the order they emptied (oldest first: the first to steal or release).
//
// Not thread-safe: the owning pool serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "pool/chunk_table.hpp"
#include "tidepool/device.hpp"

namespace tidepool::pool {

using GranuleId = std::uint32_t;
inline constexpr GranuleId kNoGranule = std::numeric_limits<GranuleId>::max();
/// The tag of a free granule whose blocks were freed on more than one stream.
inline constexpr Stream kManyStreams = kNoStream - 1;

struct Granule {
  PhysicalHandle handle = 0;
  bool mapped = false;
  std::uint32_t uses = 0;       // live blocks that overlap it
  Stream freed_on = kNoStream;  // while free: the stream(s) whose queued work may still touch it
  GranuleId prev = kNoGranule;  // the free list, while mapped and unused
  GranuleId next = kNoGranule;
};

class GranuleTable {
 public:
  /// Appends `count` unmapped granules; returns the id of the first.
  GranuleId grow(std::size_t count) {
    const auto first = static_cast<GranuleId>(granules_.size());
    granules_.resize(granules_.size() + count);
    return first;
  }

  Granule& operator[](GranuleId id) noexcept { return granules_[id]; }
  const Granule& operator[](GranuleId id) const noexcept { return granules_[id]; }
  std::size_t size() const noexcept { return granules_.size(); }

  std::size_t mapped() const noexcept { return mapped_; }
  std::size_t free_count() const noexcept { return free_count_; }
  /// The free granule that emptied first, or kNoGranule.
  GranuleId oldest_free() const noexcept { return head_; }

  /// Unmapped granule `id` now has `handle` mapped, for one live block.
  void set_mapped(GranuleId id, PhysicalHandle handle) noexcept {
    granules_[id].handle = handle;
    granules_[id].mapped = true;
    granules_[id].uses = 1;
    ++mapped_;
  }
  /// id is mapped, unused, and not in the free list (taken).
  void set_unmapped(GranuleId id) noexcept {
    granules_[id].mapped = false;
    granules_[id].freed_on = kNoStream;
    --mapped_;
  }

  /// One more live block overlaps mapped granule `id`; takes it off the free list.
  void use(GranuleId id) noexcept {
    Granule& g = granules_[id];
    if (g.uses++ == 0) unlink(id);
  }
  /// A block freed on `stream` overlapped `id`; the last one puts it on the free list.
  void unuse(GranuleId id, Stream stream) noexcept {
    Granule& g = granules_[id];
    if (g.freed_on == kNoStream) {
      g.freed_on = stream;
    } else if (g.freed_on != stream) {
      g.freed_on = kManyStreams;
    }
    if (--g.uses == 0) link_back(id);
  }
  /// Takes free granule `id` off the free list (to steal or release it).
  void take(GranuleId id) noexcept { unlink(id); }

 private:
  void link_back(GranuleId id) noexcept {
    Granule& g = granules_[id];
    g.prev = tail_;
    g.next = kNoGranule;
    (tail_ == kNoGranule ? head_ : granules_[tail_].next) = id;
    tail_ = id;
    ++free_count_;
  }
  /// id is on the free list.
  void unlink(GranuleId id) noexcept {
    Granule& g = granules_[id];
    (g.prev == kNoGranule ? head_ : granules_[g.prev].next) = g.next;
    (g.next == kNoGranule ? tail_ : granules_[g.next].prev) = g.prev;
    g.prev = g.next = kNoGranule;
    --free_count_;
  }

  std::vector<Granule> granules_;
  GranuleId head_ = kNoGranule;
  GranuleId tail_ = kNoGranule;
  std::size_t mapped_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace tidepool::pool
