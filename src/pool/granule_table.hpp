// The physical side of ExpandablePool: one record per granule of reserved
// address space, saying whether a physical handle is mapped there and how many
// live blocks overlap it, and a queue of the mapped granules no block uses,
// roughly in the order they emptied (oldest first: the first to steal or
// release). The queue is lazy, so that the cached path costs a counter per
// granule: a granule used again stays queued and is skipped when it reaches
// the front, and one freed again while still queued keeps its place.
//
// Not thread-safe: the owning pool serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
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
  std::uint32_t uses = 0;       // live blocks that overlap it
  bool mapped = false;
  bool queued = false;          // in the free queue (perhaps stale: used again since)
  Stream freed_on = kNoStream;  // while free: the stream(s) whose queued work may still touch it
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
  /// Mapped granules no live block overlaps.
  std::size_t free_count() const noexcept { return free_count_; }

  /// Unmapped granule `id` now has `handle` mapped, for one live block.
  void set_mapped(GranuleId id, PhysicalHandle handle) noexcept {
    Granule& g = granules_[id];
    g.handle = handle;
    g.mapped = true;
    g.uses = 1;
    ++mapped_;
  }

  /// One more live block overlaps mapped granule `id`.
  void use(GranuleId id) noexcept {
    if (granules_[id].uses++ == 0) --free_count_;
  }
  /// A block freed on `stream` overlapped `id`; the last one makes it free.
  void unuse(GranuleId id, Stream stream) {
    Granule& g = granules_[id];
    if (g.freed_on == kNoStream) {
      g.freed_on = stream;
    } else if (g.freed_on != stream) {
      g.freed_on = kManyStreams;
    }
    if (--g.uses != 0) return;
    ++free_count_;
    if (!g.queued) {
      g.queued = true;
      queue_.push_back(id);
    }
  }

  /// The free granule that has waited longest, or kNoGranule when none is free.
  GranuleId oldest_free() noexcept {
    while (!queue_.empty()) {
      const GranuleId id = queue_.front();
      if (granules_[id].mapped && granules_[id].uses == 0) return id;
      granules_[id].queued = false;  // stale: used again, or unmapped
      queue_.pop_front();
    }
    return kNoGranule;
  }
  /// Unmaps oldest_free() in the table (the caller has unmapped it on the
  /// device); its handle is returned for the caller to map again or release.
  PhysicalHandle take_oldest_free() noexcept {
    const GranuleId id = oldest_free();
    queue_.pop_front();
    Granule& g = granules_[id];
    g.queued = false;
    g.mapped = false;
    g.freed_on = kNoStream;
    --free_count_;
    --mapped_;
    return g.handle;
  }

 private:
  std::vector<Granule> granules_;
  std::deque<GranuleId> queue_;
  std::size_t mapped_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace tidepool::pool
