// The physical side of ExpandablePool: one record per granule of reserved
// address space, saying whether a physical handle is mapped there and how many
// live blocks overlap it, and a queue of the mapped granules no block uses,
// roughly in the order they emptied (oldest first: the first to steal or
// release). The queue is lazy, so that the cached path costs a counter per
// granule: a granule used again stays queued and is skipped when it reaches
// the front, and one freed again while still queued keeps its place.
//
// A block's granules are a range, and the cached path works on ranges: the
// records are kept field by field (one array each), so that taking or giving
// back a use on every granule of a large block is a few tight loops the
// compiler vectorizes, not a branch per granule.
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

class GranuleTable {
 public:
  /// Appends `count` unmapped granules; returns the id of the first.
  GranuleId grow(std::size_t count) {
    const auto first = static_cast<GranuleId>(uses_.size());
    const std::size_t size = uses_.size() + count;
    handle_.resize(size, 0);
    freed_on_.resize(size, kNoStream);
    uses_.resize(size, 0);
    mapped_flag_.resize(size, 0);
    queued_.resize(size, 0);
    return first;
  }

  std::size_t size() const noexcept { return uses_.size(); }
  bool is_mapped(GranuleId id) const noexcept { return mapped_flag_[id] != 0; }
  PhysicalHandle handle(GranuleId id) const noexcept { return handle_[id]; }
  /// While free: the stream(s) whose queued work may still touch it, or kNoStream.
  Stream freed_on(GranuleId id) const noexcept { return freed_on_[id]; }
  void settled(GranuleId id) noexcept { freed_on_[id] = kNoStream; }

  std::size_t mapped() const noexcept { return mapped_; }
  /// Mapped granules no live block overlaps.
  std::size_t free_count() const noexcept { return free_count_; }

  /// One more live block overlaps every granule of [first, last]. Returns how
  /// many of them are unmapped: the caller maps each (set_mapped) or gives the
  /// uses back (unuse_range).
  std::size_t use_range(GranuleId first, GranuleId last) noexcept {
    if (first == last) {  // most small blocks
      if (mapped_flag_[first] == 0) {
        ++uses_[first];
        return 1;
      }
      if (uses_[first]++ == 0) --free_count_;
      return 0;
    }
    std::size_t unmapped = 0;
    std::size_t taken = 0;  // free granules that now hold a block
    for (std::size_t id = first; id <= last; ++id) {
      const std::uint32_t mapped = mapped_flag_[id];
      unmapped += mapped ^ 1u;
      taken += mapped & static_cast<std::uint32_t>(uses_[id] == 0);
      ++uses_[id];
    }
    free_count_ -= taken;
    return unmapped;
  }

  /// Unmapped granule `id`, already used by the block being backed
  /// (use_range), now has `handle` mapped.
  void set_mapped(GranuleId id, PhysicalHandle handle) noexcept {
    handle_[id] = handle;
    mapped_flag_[id] = 1;
    ++mapped_;
  }

  /// A block freed on `stream` overlapped every granule of [first, last]
  /// (kNoStream: a block that never held memory, whose backing failed); the
  /// granules it was the last use of become free.
  void unuse_range(GranuleId first, GranuleId last, Stream stream) {
    if (first == last) {  // most small blocks
      unuse_one(first, stream);
      return;
    }
    if (stream != kNoStream) {
      // Mostly every tag is this stream already (blocks freed where they were
      // used, again and again): then reading them is all there is to do.
      bool same = true;
      for (std::size_t id = first; id <= last; ++id) same &= freed_on_[id] == stream;
      if (!same) {
        for (std::size_t id = first; id <= last; ++id) freed_on_[id] = merged(freed_on_[id], stream);
      }
    }
    std::size_t emptied = 0;
    std::uint32_t unqueued = 0;  // emptied granules not in the queue yet
    for (std::size_t id = first; id <= last; ++id) {
      const std::uint32_t empty = static_cast<std::uint32_t>(--uses_[id] == 0) & mapped_flag_[id];
      emptied += empty;
      unqueued |= empty & (queued_[id] ^ 1u);
    }
    free_count_ += emptied;
    if (unqueued == 0) return;
    for (std::size_t id = first; id <= last; ++id) {
      if (uses_[id] == 0 && mapped_flag_[id] != 0 && queued_[id] == 0) enqueue(static_cast<GranuleId>(id));
    }
  }

  void unuse_one(GranuleId id, Stream stream) {
    if (stream != kNoStream && freed_on_[id] != stream) freed_on_[id] = merged(freed_on_[id], stream);
    if (--uses_[id] != 0 || mapped_flag_[id] == 0) return;
    ++free_count_;
    if (queued_[id] == 0) enqueue(id);
  }

  /// The free granule that has waited longest, or kNoGranule when none is free.
  GranuleId oldest_free() noexcept {
    while (!queue_.empty()) {
      const GranuleId id = queue_.front();
      if (mapped_flag_[id] != 0 && uses_[id] == 0) return id;
      queued_[id] = 0;  // stale: used again, or unmapped
      queue_.pop_front();
    }
    return kNoGranule;
  }
  /// Unmaps oldest_free() in the table (the caller has unmapped it on the
  /// device); its handle is returned for the caller to map again or release.
  PhysicalHandle take_oldest_free() noexcept {
    const GranuleId id = oldest_free();
    queue_.pop_front();
    queued_[id] = 0;
    mapped_flag_[id] = 0;
    freed_on_[id] = kNoStream;
    --free_count_;
    --mapped_;
    return handle_[id];
  }

 private:
  /// A free granule's tag once a block freed on `stream` overlapped it too.
  static Stream merged(Stream tag, Stream stream) noexcept {
    return tag == kNoStream || tag == stream ? stream : kManyStreams;
  }
  void enqueue(GranuleId id) {
    queued_[id] = 1;
    queue_.push_back(id);
  }

  // One entry per granule in each.
  std::vector<PhysicalHandle> handle_;
  std::vector<Stream> freed_on_;
  std::vector<std::uint32_t> uses_;         // live blocks that overlap it
  std::vector<std::uint8_t> mapped_flag_;   // a handle is mapped there
  std::vector<std::uint8_t> queued_;        // in queue_ (perhaps stale: used again since)
  std::deque<GranuleId> queue_;
  std::size_t mapped_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace tidepool::pool
