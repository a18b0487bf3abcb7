// The physical side of ExpandablePool: one record per granule of reserved
// address space, saying whether a physical handle is mapped there and whether
// a live block overlaps it, and the mapped granules no block uses two ways: a
// bitmap, whose highest is the one to steal, and a queue roughly in the order
// they emptied (oldest first: the first to release). The queue is lazy: a
// granule used again stays queued and is skipped when it reaches the front,
// and one freed again while still queued keeps its place.
//
// The cached path costs a few word operations per 64 granules, not work per
// granule, so that a 640 MiB block is about as cheap to hand out and take
// back as a 2 MiB one:
// - only the granules at a block's two ends can be shared with a neighbour,
//   so only those count their live blocks (uses_); a granule strictly inside
//   a live block is its alone and is simply not free;
// - mapped, free and queued granules are bitmaps, changed and counted a
//   word at a time;
// - so are the stream tags: a bitmap per stream of the granules it freed.
//
// Only grow() and add_stream() allocate: every other call is noexcept, so
// that a pool's bookkeeping after a device call cannot fail half-way (the
// queue is a ring of one slot per granule, since a granule is queued at most
// once; a stream's tag bitmap is made by add_stream(), and a stream without
// one is tagged "many", which waits for every stream).
//
// Not thread-safe: the owning pool serializes every call.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "pool/chunk_table.hpp"
#include "pool/stream_values.hpp"
#include "tidepool/device.hpp"

namespace tidepool::pool {

using GranuleId = std::uint32_t;
inline constexpr GranuleId kNoGranule = std::numeric_limits<GranuleId>::max();
/// The tag of a free granule whose blocks were freed on more than one stream.
inline constexpr Stream kManyStreams = kNoStream - 1;

/// The set bits of a word. std::popcount is a library call on x86-64
/// without -mpopcnt (which the build cannot assume): there the bit-parallel
/// sum, inline.
inline std::size_t count_ones(std::uint64_t x) noexcept {
#if defined(__x86_64__) && !defined(__POPCNT__)
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return static_cast<std::size_t>((x * 0x0101010101010101ull) >> 56);
#else
  return static_cast<std::size_t>(std::popcount(x));
#endif
}

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
  bool test(std::size_t id) const noexcept { return (words_[id / 64] & bit(id % 64)) != 0; }
  /// How many bits of [first, last] are set.
  std::size_t count(std::size_t first, std::size_t last) const noexcept {
    std::size_t set = 0;
    for (std::size_t w = first / 64; w <= last / 64; ++w) {
      // Words are mostly all set or all clear (a block's granules): those
      // need no count.
      const std::uint64_t in_range = mask(w, first, last), bits = words_[w] & in_range;
      if (bits == in_range) {
        set += width(w, first, last);
      } else if (bits != 0) {
        set += count_ones(bits);
      }
    }
    return set;
  }
  /// Whether every bit of [first, last] is set.
  bool all(std::size_t first, std::size_t last) const noexcept {
    // Asked for every block placed: the first word's bits from `first` up,
    // the words between whole, the last word's bits up to `last`.
    const std::size_t first_word = first / 64, last_word = last / 64;
    const std::uint64_t from_first = ~std::uint64_t{0} << (first % 64);
    const std::uint64_t to_last = ~std::uint64_t{0} >> (63 - last % 64);
    if (first_word == last_word) return (words_[first_word] | ~(from_first & to_last)) == ~std::uint64_t{0};
    if ((words_[first_word] | ~from_first) != ~std::uint64_t{0}) return false;
    for (std::size_t w = first_word + 1; w < last_word; ++w) {
      if (words_[w] != ~std::uint64_t{0}) return false;
    }
    return (words_[last_word] | ~to_last) == ~std::uint64_t{0};
  }
  // A word at a time (GranuleTable changes several bitmaps per word of a
  // block's granules): word `w`, and setting or clearing `bits` of it.
  std::uint64_t word(std::size_t w) const noexcept { return words_[w]; }
  void set_bits(std::size_t w, std::uint64_t bits) noexcept {
    words_[w] |= bits;
    summary_[w / 64] |= bit(w % 64);
  }
  void clear_bits(std::size_t w, std::uint64_t bits) noexcept {
    words_[w] &= ~bits;
    if (words_[w] == 0) summary_[w / 64] &= ~bit(w % 64);
  }
  static constexpr std::uint64_t bit(std::size_t i) noexcept { return std::uint64_t{1} << i; }
  /// The bits of word w that lie in [first, last].
  static constexpr std::uint64_t mask(std::size_t w, std::size_t first, std::size_t last) noexcept {
    return (~std::uint64_t{0} >> (63 - high(w, last))) & (~std::uint64_t{0} << low(w, first));
  }

  /// The highest set bit, or kNoBit.
  static constexpr std::size_t kNoBit = SIZE_MAX;
  /// The first of `n` (> 0) consecutive set bits in [first, last], or kNoBit.
  std::size_t find_run(std::size_t first, std::size_t last, std::size_t n) const noexcept {
    std::size_t run = 0, start = 0;
    for (std::size_t w = first / 64; w <= last / 64; ++w) {
      const std::uint64_t word = words_[w] & mask(w, first, last);
      if (word == 0) {
        // A free chunk may span the unmapped rest of the address space:
        // skip its empty words through the summary.
        run = 0;
        w = next_nonzero_word(w + 1) - 1;
        continue;
      }
      for (std::size_t b = low(w, first); b <= high(w, last);) {
        const std::uint64_t rest = word >> b;
        if ((rest & 1) == 0) {
          run = 0;
          b += rest == 0 ? 64 : static_cast<std::size_t>(std::countr_zero(rest));
          continue;
        }
        const auto ones = static_cast<std::size_t>(std::countr_one(rest));
        if (run == 0) start = w * 64 + b;
        run += ones;
        if (run >= n) return start;
        b += ones;
      }
    }
    return kNoBit;
  }
  void clear_all() noexcept {
    std::fill(words_.begin(), words_.end(), 0);
    std::fill(summary_.begin(), summary_.end(), 0);
  }
  std::size_t words() const noexcept { return words_.size(); }
  /// The first clear bit in [from, end), or end (end <= the bits resized to).
  std::size_t next_clear(std::size_t from, std::size_t end) const noexcept {
    while (from < end) {
      const std::uint64_t clear = ~words_[from / 64] >> (from % 64);
      if (clear != 0) return std::min(end, from + static_cast<std::size_t>(std::countr_zero(clear)));
      from += 64 - from % 64;
    }
    return end;
  }
  /// The first word at or after `from` with a bit set, or words().
  std::size_t next_nonzero_word(std::size_t from) const noexcept {
    std::size_t s = from / 64;
    if (s >= summary_.size()) return words_.size();
    std::uint64_t candidates = summary_[s] & (~std::uint64_t{0} << (from % 64));
    while (candidates == 0) {
      if (++s == summary_.size()) return words_.size();
      candidates = summary_[s];
    }
    return s * 64 + static_cast<std::size_t>(std::countr_zero(candidates));
  }
  std::size_t highest() const noexcept {
    for (std::size_t s = summary_.size(); s-- > 0;) {
      if (summary_[s] == 0) continue;
      const std::size_t w = s * 64 + 63 - static_cast<std::size_t>(std::countl_zero(summary_[s]));
      return w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(words_[w]));
    }
    return kNoBit;
  }

 private:
  /// The lowest and the highest bit of word w that lie in [first, last].
  static constexpr std::size_t low(std::size_t w, std::size_t first) noexcept { return w == first / 64 ? first % 64 : 0; }
  static constexpr std::size_t high(std::size_t w, std::size_t last) noexcept { return w == last / 64 ? last % 64 : 63; }
  /// How many bits of word w lie in [first, last].
  static constexpr std::size_t width(std::size_t w, std::size_t first, std::size_t last) noexcept {
    return high(w, last) - low(w, first) + 1;
  }
  std::vector<std::uint64_t> words_;
  std::vector<std::uint64_t> summary_;
};

class GranuleTable {
 public:
  /// Appends `count` unmapped granules, a part of their own (parts are
  /// numbered from 0 in the order they were added); returns the id of the
  /// first.
  GranuleId grow(std::size_t count) {
    const auto first = static_cast<GranuleId>(uses_.size());
    const std::size_t size = uses_.size() + count;
    parts_.push_back({static_cast<GranuleId>(size), first});
    handle_.resize(size, 0);
    for (GranuleBits& bits : freed_by_) bits.resize(size);
    freed_by_many_.resize(size);
    uses_.resize(size, 0);
    queued_.resize(size);
    mapped_bits_.resize(size);
    free_bits_.resize(size);
    queue_.resize(size);
    return first;
  }
  /// Gives `stream` a tag bitmap of its own (one of kTaggedStreams; past
  /// them, and for kNoStream, nothing): called before a block freed on it
  /// reaches the table, where no call may allocate.
  void add_stream(Stream stream) {
    if (stream != kNoStream && stream != kManyStreams) (void)find_slot(stream);
  }

  std::size_t size() const noexcept { return uses_.size(); }
  bool is_mapped(GranuleId id) const noexcept { return mapped_bits_.test(id); }
  /// Mapped, and no live block overlaps it.
  bool is_free(GranuleId id) const noexcept { return free_bits_.test(id); }
  PhysicalHandle handle(GranuleId id) const noexcept { return handle_[id]; }
  /// While free: the stream(s) whose queued work may still touch it, or kNoStream.
  Stream freed_on(GranuleId id) const noexcept {
    if (freed_by_many_.test(id)) return kManyStreams;
    Stream found = kNoStream;
    for (std::size_t slot = 0; slot < freed_by_.size(); ++slot) {
      if (!freed_by_[slot].test(id)) continue;
      if (found != kNoStream) return kManyStreams;
      found = streams_[slot];
    }
    return found;
  }
  void settled(GranuleId id) noexcept {
    freed_by_many_.clear(id);
    for (GranuleBits& bits : freed_by_) bits.clear(id);
  }

  std::size_t mapped() const noexcept { return mapped_; }
  /// Mapped granules no live block overlaps.
  std::size_t free_count() const noexcept { return free_count_; }
  /// Live blocks that end in granule `id` (0 inside one).
  std::uint32_t uses(GranuleId id) const noexcept { return uses_[id]; }

  /// How many granules of [first, last] have no physical memory mapped.
  std::size_t unmapped_in(GranuleId first, GranuleId last) const noexcept {
    return last - first + 1 - mapped_bits_.count(first, last);
  }

  /// Whether every granule of [first, last] has physical memory mapped.
  bool all_mapped(GranuleId first, GranuleId last) const noexcept {
    return mapped_bits_.all(first, last);
  }
  /// The same for granules of part `part`: one comparison while the range
  /// lies in the part's mapped prefix (where most blocks lie: the pool
  /// places blocks low and moves few granules).
  bool all_mapped(std::size_t part, GranuleId first, GranuleId last) const noexcept {
    return last < parts_[part].mapped_end || mapped_bits_.all(first, last);
  }

  /// The first of `n` consecutive mapped granules in [first, last], or kNoGranule.
  GranuleId mapped_run(GranuleId first, GranuleId last, std::size_t n) const noexcept {
    const std::size_t id = mapped_bits_.find_run(first, last, n);
    return id == GranuleBits::kNoBit ? kNoGranule : static_cast<GranuleId>(id);
  }

  /// One more live block overlaps every granule of [first, last]. Returns how
  /// many of them are unmapped: the caller maps each (set_mapped) or gives the
  /// uses back (unuse_range).
  std::size_t use_range(GranuleId first, GranuleId last) noexcept {
    if (first == last) {  // most small blocks
      if (uses_[first]++ == 0 && free_bits_.test(first)) {
        --free_count_;
        free_bits_.clear(first);
      }
      return mapped_bits_.test(first) ? 0 : 1;
    }
    // A word at a time, every bitmap at once: a block's granules span one
    // word (most) to a few.
    ++uses_[first];
    ++uses_[last];
    std::size_t unmapped = 0;
    for (std::size_t w = first / 64; w <= last / 64; ++w) {
      const std::uint64_t range = GranuleBits::mask(w, first, last);
      if (const std::uint64_t taken = free_bits_.word(w) & range; taken != 0) {  // free granules that now hold a block
        free_count_ -= count_ones(taken);
        free_bits_.clear_bits(w, taken);
      }
      unmapped += count_ones(range & ~mapped_bits_.word(w));
    }
    return unmapped;
  }

  /// Unmapped granule `id`, already used by the block being backed
  /// (use_range), now has `handle` mapped.
  void set_mapped(GranuleId id, PhysicalHandle handle) noexcept {
    handle_[id] = handle;
    mapped_bits_.set(id);
    ++mapped_;
    Part& part = part_of(id);
    if (id == part.mapped_end) {  // the prefix grows up to the next unmapped granule
      part.mapped_end = static_cast<GranuleId>(mapped_bits_.next_clear(id + 1, part.end));
    }
  }

  /// A block freed on `stream` overlapped every granule of [first, last]
  /// (kNoStream: a block that never held memory, whose backing failed); the
  /// granules it was the last use of become free.
  void unuse_range(GranuleId first, GranuleId last, Stream stream) noexcept {
    if (first == last) {  // most small blocks
      if (stream != kNoStream) tags_of(stream).set(first);
      unuse(first);
      return;
    }
    // A word at a time, every bitmap at once, as in use_range(). The
    // granules freed: every mapped one between the ends (the block's alone)
    // and each end that this was the last use of.
    GranuleBits* tags = stream == kNoStream ? nullptr : &tags_of(stream);
    const bool first_freed = --uses_[first] == 0, last_freed = --uses_[last] == 0;
    bool unqueued = false;
    for (std::size_t w = first / 64; w <= last / 64; ++w) {
      const std::uint64_t range = GranuleBits::mask(w, first, last);
      if (tags != nullptr) tags->set_bits(w, range);
      std::uint64_t freed = range & mapped_bits_.word(w);
      if (w == first / 64 && !first_freed) freed &= ~GranuleBits::bit(first % 64);
      if (w == last / 64 && !last_freed) freed &= ~GranuleBits::bit(last % 64);
      if (freed == 0) continue;
      free_count_ += count_ones(freed);
      free_bits_.set_bits(w, freed);
      unqueued = unqueued || (freed & ~queued_.word(w)) != 0;
    }
    if (unqueued) enqueue_free(first, last);  // rare once warm: the lazy queue holds them still
  }

  // Rebuilding the uses from the live blocks (ExpandablePool's lazy mode,
  // where frees and cached allocations leave the table alone): forget()
  // makes every mapped granule free, with no use, tag or queue entry; then
  // use_range() for each live block, tag_range() for each free range whose
  // stream may still run, and queue_free().
  void forget() noexcept {
    std::fill(uses_.begin(), uses_.end(), 0);
    for (std::size_t w = 0; w < mapped_bits_.words(); ++w) {
      free_bits_.clear_bits(w, ~std::uint64_t{0});
      if (const std::uint64_t mapped = mapped_bits_.word(w); mapped != 0) free_bits_.set_bits(w, mapped);
    }
    free_count_ = mapped_;
    for (GranuleBits& bits : freed_by_) bits.clear_all();
    freed_by_many_.clear_all();
    queued_.clear_all();
    queue_.clear();
  }
  /// Work on `stream` may still touch [first, last].
  void tag_range(GranuleId first, GranuleId last, Stream stream) noexcept {
    GranuleBits& tags = tags_of(stream);
    for (std::size_t w = first / 64; w <= last / 64; ++w) tags.set_bits(w, GranuleBits::mask(w, first, last));
  }
  /// Queues every free granule, in address order.
  void queue_free() noexcept {
    if (free_count_ != 0) enqueue_free(0, static_cast<GranuleId>(size() - 1));
  }

  /// The free granule that has waited longest, or kNoGranule when none is free.
  GranuleId oldest_free() noexcept {
    while (!queue_.empty()) {
      const GranuleId id = queue_.front();
      if (free_bits_.test(id)) return id;
      queued_.clear(id);  // stale: used again, or unmapped
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
    unmapped(id);
    settled(id);
    free_bits_.clear(id);
    --free_count_;
    --mapped_;
    return handle_[id];
  }

  /// Unmaps mapped granule `id` that a live block still uses, not free (a
  /// sleeping tag; the caller has unmapped it on the device), keeping its
  /// uses: it is unmapped and used, as while a block is backed, until
  /// set_mapped().
  PhysicalHandle take_used(GranuleId id) noexcept {
    unmapped(id);
    --mapped_;
    return handle_[id];
  }

 private:
  /// The granules added by one grow(), [start, end), and how far from its
  /// start every granule is mapped: [start, mapped_end).
  struct Part {
    GranuleId end;
    GranuleId mapped_end;
  };
  Part& part_of(GranuleId id) noexcept {
    return *std::find_if(parts_.begin(), parts_.end(), [id](const Part& part) { return id < part.end; });
  }
  void unmapped(GranuleId id) noexcept {
    mapped_bits_.clear(id);
    Part& part = part_of(id);
    part.mapped_end = std::min(part.mapped_end, id);
  }
  /// Queues the free granules of [first, last] not queued yet: the ends
  /// first, then the rest in address order.
  void enqueue_free(GranuleId first, GranuleId last) noexcept {
    for (const GranuleId end : {first, last}) {
      if (free_bits_.test(end) && !queued_.test(end)) enqueue(end);
    }
    for (std::size_t w = (first + 1) / 64; last > first + 1 && w <= (last - 1) / 64; ++w) {
      std::uint64_t unqueued = free_bits_.word(w) & ~queued_.word(w) & GranuleBits::mask(w, first + 1, last - 1);
      if (unqueued == 0) continue;
      queued_.set_bits(w, unqueued);
      for (; unqueued != 0; unqueued &= unqueued - 1) {
        queue_.push(static_cast<GranuleId>(w * 64 + static_cast<std::size_t>(std::countr_zero(unqueued))));
      }
    }
  }
  /// One use less on granule `id` (a block's end); free if it was the last
  /// and it is mapped.
  void unuse(GranuleId id) noexcept {
    if (--uses_[id] != 0 || !mapped_bits_.test(id)) return;
    ++free_count_;
    free_bits_.set(id);
    if (!queued_.test(id)) enqueue(id);
  }
  // Streams with a tag bitmap of their own; the granules freed by any
  // stream past these are tagged "many".
  static constexpr std::size_t kTaggedStreams = 64;
  static constexpr std::size_t kManySlot = kTaggedStreams;

  /// The bitmap of granules that work on `stream` may still touch: its own
  /// once add_stream() made it, else the "many" one.
  GranuleBits& tags_of(Stream stream) noexcept {
    const std::uint64_t slot = slot_of_.at(stream);
    return slot == 0 ? freed_by_many_ : freed_by_[slot - 1];
  }
  std::size_t find_slot(Stream stream) {
    if (const std::uint64_t slot = slot_of_.at(stream); slot != 0) return slot - 1;
    if (streams_.size() == kTaggedStreams) return kManySlot;
    streams_.push_back(stream);
    freed_by_.emplace_back().resize(size());
    slot_of_.set(stream, streams_.size());
    return streams_.size() - 1;
  }
  void enqueue(GranuleId id) noexcept {
    queued_.set(id);
    queue_.push(id);
  }

  /// The free granules in the order they emptied: a ring of one slot per
  /// granule (each is in it at most once: queued_).
  class Queue {
   public:
    /// To `size` slots, keeping the order (grow(): may allocate).
    void resize(std::size_t size) {
      std::vector<GranuleId> ring(size);
      for (std::size_t i = 0; i < count_; ++i) ring[i] = ring_[(head_ + i) % ring_.size()];
      ring_ = std::move(ring);
      head_ = 0;
    }
    bool empty() const noexcept { return count_ == 0; }
    GranuleId front() const noexcept { return ring_[head_]; }
    void pop_front() noexcept {
      head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
      --count_;
    }
    void push(GranuleId id) noexcept {  // count_ < size(): queued_ keeps each granule in once
      const std::size_t at = head_ + count_;
      ring_[at < ring_.size() ? at : at - ring_.size()] = id;
      ++count_;
    }
    void clear() noexcept { head_ = count_ = 0; }

   private:
    std::vector<GranuleId> ring_;
    std::size_t head_ = 0;
    std::size_t count_ = 0;
  };

  // One entry per granule in each.
  std::vector<PhysicalHandle> handle_;
  std::vector<std::uint32_t> uses_;         // live blocks that end in it (0 inside a live block)
  GranuleBits queued_;                      // in queue_ (perhaps stale: used again since)
  GranuleBits mapped_bits_;                 // a handle is mapped there
  GranuleBits free_bits_;                   // mapped granules no block overlaps
  // Stream tags: a bitmap per stream (freed_by_[slot] for streams_[slot])
  // of the granules under blocks it freed since they were last settled, so
  // that tagging a block's granules is a few word operations.
  std::vector<GranuleBits> freed_by_;
  GranuleBits freed_by_many_;               // freed by streams past kTaggedStreams
  std::vector<Stream> streams_;
  StreamValues slot_of_;                    // per stream in streams_: its slot + 1
  Queue queue_;
  std::vector<Part> parts_;
  std::size_t mapped_ = 0;
  std::size_t free_count_ = 0;
};

}  // namespace tidepool::pool
