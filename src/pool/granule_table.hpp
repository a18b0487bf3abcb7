// The physical side of ExpandablePool: one record per granule of reserved
// address space, saying whether a physical handle is mapped there and how many
// live blocks overlap it, and the mapped granules no block uses two ways: a
// bitmap, whose highest is the one to steal, and a queue roughly in the order
// they emptied (oldest first: the first to release). The queue is lazy, so that the cached path costs a counter per
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
#include <bit>
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

/// One bit per granule, with a summary bit per word, so that the highest set
/// bit is found in a few word reads however many granules there are.
class GranuleBits {
 public:
  void resize(std::size_t count) {
    words_.resize((count + 63) / 64, 0);
    summary_.resize((words_.size() + 63) / 64, 0);
  }
  void set(std::size_t id) noexcept {
    words_[id / 64] |= bit(id % 64);
    summary_[id / 4096] |= bit(id / 64 % 64);
  }
  void clear(std::size_t id) noexcept {
    std::uint64_t& word = words_[id / 64];
    word &= ~bit(id % 64);
    if (word == 0) summary_[id / 4096] &= ~bit(id / 64 % 64);
  }
  /// Clears every bit of [first, last].
  void clear_range(std::size_t first, std::size_t last) noexcept {
    for (std::size_t w = first / 64; w <= last / 64; ++w) {
      const std::size_t low = w == first / 64 ? first % 64 : 0;
      const std::size_t high = w == last / 64 ? last % 64 : 63;
      const std::uint64_t mask = (~std::uint64_t{0} >> (63 - high)) & (~std::uint64_t{0} << low);
      if ((words_[w] & mask) == 0) continue;
      words_[w] &= ~mask;
      if (words_[w] == 0) summary_[w / 64] &= ~bit(w % 64);
    }
  }
  /// The highest set bit, or kNoBit.
  static constexpr std::size_t kNoBit = SIZE_MAX;
  std::size_t highest() const noexcept {
    for (std::size_t s = summary_.size(); s-- > 0;) {
      if (summary_[s] == 0) continue;
      const std::size_t w = s * 64 + 63 - static_cast<std::size_t>(std::countl_zero(summary_[s]));
      return w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(words_[w]));
    }
    return kNoBit;
  }

 private:
  static constexpr std::uint64_t bit(std::size_t i) noexcept { return std::uint64_t{1} << i; }
  std::vector<std::uint64_t> words_;
  std::vector<std::uint64_t> summary_;
};

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
    free_bits_.resize(size);
    // The counts cover the granules by index: rebuilt for the new size (rare:
    // once per reservation of address space).
    mapped_counts_.assign(size + 1, 0);
    for (std::size_t id = 0; id < size; ++id) {
      if (mapped_flag_[id] != 0) count_mapped(id, 1);
    }
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

  /// How many granules of [first, last] have no physical memory mapped: a
  /// lookup in the mapped counts, not a walk over a large block's granules.
  std::size_t unmapped_in(GranuleId first, GranuleId last) const noexcept {
    if (first == last) return mapped_flag_[first] ^ 1u;
    return last - first + 1 - (mapped_before(last + 1) - mapped_before(first));
  }

  /// One more live block overlaps every granule of [first, last]. Returns how
  /// many of them are unmapped: the caller maps each (set_mapped) or gives the
  /// uses back (unuse_range).
  std::size_t use_range(GranuleId first, GranuleId last) noexcept {
    if (first == last) {  // most small blocks
      if (mapped_flag_[first] == 0) {
        ++uses_[first];
        return 1;
      }
      if (uses_[first]++ == 0) {
        --free_count_;
        free_bits_.clear(first);
      }
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
    if (taken != 0) {
      free_count_ -= taken;
      free_bits_.clear_range(first, last);
    }
    return unmapped;
  }

  /// Unmapped granule `id`, already used by the block being backed
  /// (use_range), now has `handle` mapped.
  void set_mapped(GranuleId id, PhysicalHandle handle) noexcept {
    handle_[id] = handle;
    mapped_flag_[id] = 1;
    count_mapped(id, 1);
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
    for (std::size_t id = first; id <= last; ++id) {
      emptied += static_cast<std::uint32_t>(--uses_[id] == 0) & mapped_flag_[id];
    }
    if (emptied == 0) return;
    free_count_ += emptied;
    for (std::size_t id = first; id <= last; ++id) {
      if (uses_[id] != 0 || mapped_flag_[id] == 0) continue;
      free_bits_.set(id);
      if (queued_[id] == 0) enqueue(static_cast<GranuleId>(id));
    }
  }

  void unuse_one(GranuleId id, Stream stream) {
    if (stream != kNoStream && freed_on_[id] != stream) freed_on_[id] = merged(freed_on_[id], stream);
    if (--uses_[id] != 0 || mapped_flag_[id] == 0) return;
    ++free_count_;
    free_bits_.set(id);
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
  /// The free granule at the highest address, or kNoGranule when none is
  /// free: the one to steal (see ExpandablePool's placement).
  GranuleId highest_free() const noexcept {
    const std::size_t id = free_bits_.highest();
    return id == GranuleBits::kNoBit ? kNoGranule : static_cast<GranuleId>(id);
  }
  /// Unmaps free granule `id` in the table (the caller has unmapped it on the
  /// device); its handle is returned for the caller to map again or release.
  /// A queue entry for it goes stale, to be skipped.
  PhysicalHandle take_free(GranuleId id) noexcept {
    mapped_flag_[id] = 0;
    count_mapped(id, -1);
    freed_on_[id] = kNoStream;
    free_bits_.clear(id);
    --free_count_;
    --mapped_;
    return handle_[id];
  }

  /// Unmaps mapped granule `id` that live blocks still use (a sleeping tag;
  /// the caller has unmapped it on the device), keeping its uses: it is
  /// unmapped and used, as while a block is backed, until set_mapped().
  PhysicalHandle take_used(GranuleId id) noexcept {
    mapped_flag_[id] = 0;
    count_mapped(id, -1);
    --mapped_;
    return handle_[id];
  }

 private:
  /// The mapped counts are a Fenwick tree over mapped_flag_: a change and a
  /// prefix sum each cost log2(granules) steps.
  void count_mapped(std::size_t id, int change) noexcept {
    for (std::size_t i = id + 1; i < mapped_counts_.size(); i += i & (~i + 1)) {
      mapped_counts_[i] += static_cast<std::uint32_t>(change);
    }
  }
  /// Mapped granules with an index below `end`.
  std::size_t mapped_before(std::size_t end) const noexcept {
    std::size_t sum = 0;
    for (std::size_t i = end; i > 0; i &= i - 1) sum += mapped_counts_[i];
    return sum;
  }
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
  GranuleBits free_bits_;                   // mapped granules no block uses
  std::vector<std::uint32_t> mapped_counts_;  // Fenwick tree of mapped_flag_ (count_mapped)
  std::deque<GranuleId> queue_;
  std::size_t mapped_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace tidepool::pool
