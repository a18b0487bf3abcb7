// The best-fit arena: XLA's BFC algorithm over regions someone else supplies.
// It cuts regions into chunks, hands out the best-fitting free chunk (split
// when the remainder is worth keeping), and coalesces free neighbours on free.
// It never calls the device for memory: BestFitPool feeds it regions taken
// with Device::allocate, ExpandablePool feeds it mapped granules.
//
// Not thread-safe: the owning pool serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pool/address_map.hpp"
#include "pool/chunk_table.hpp"
#include "pool/free_bins.hpp"
#include "pool/stream_values.hpp"
#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool::pool {

struct ArenaOptions {
  /// BFC's max_internal_fragmentation_bytes: a free chunk larger than the
  /// request is split when the remainder is at least the request, or at least
  /// this many bytes; otherwise it is handed out whole.
  std::size_t max_internal_fragmentation_bytes = std::size_t{128} << 20;
};

/// A range of memory: a region, or a block handed out.
struct MemoryRange {
  void* base = nullptr;
  std::size_t bytes = 0;
};

/// A block placed by BestFitArena::allocate with a PlacementCost.
struct PlacedBlock {
  void* base = nullptr;  // null: no free chunk is large enough
  std::size_t bytes = 0;
  /// The owner's cost() is 0 there: asked during this allocation, so its
  /// owner need not ask again.
  bool costs_nothing = false;
};

/// What placing a block costs the arena's owner beyond the arena's own work
/// (ExpandablePool: the granules it would have to map there).
class PlacementCost {
 public:
  virtual ~PlacementCost() = default;
  /// [base, base + bytes) lies in one free chunk. 0: nothing to do.
  virtual std::size_t cost(std::uintptr_t base, std::size_t bytes) const noexcept = 0;
  /// cost(base, bytes) == 0, which an owner may answer without counting.
  virtual bool costs_nothing(std::uintptr_t base, std::size_t bytes) const noexcept { return cost(base, bytes) == 0; }
  /// A base in free chunk [begin, end) where `bytes` cost nothing, though
  /// both its ends cost something; 0: none. Asked only of chunks whose start
  /// and end both cost.
  virtual std::uintptr_t free_window(std::uintptr_t /*begin*/, std::uintptr_t /*end*/,
                                     std::size_t /*bytes*/) const noexcept {
    return 0;
  }
  /// Whether most placements cost nothing now (a warm owner): the arena
  /// then looks for one that costs nothing before it counts costs. The
  /// block goes to the same place either way.
  virtual bool mostly_free() const noexcept { return false; }
};

class BestFitArena {
 public:
  /// `device` is used only for Device::synchronize, when memory freed on one
  /// stream is handed to another. It must outlive the arena.
  explicit BestFitArena(Device& device, ArenaOptions options = {});
  BestFitArena(const BestFitArena&) = delete;
  BestFitArena& operator=(const BestFitArena&) = delete;

  /// base is kChunkGranule-aligned, bytes > 0 a multiple of kChunkGranule, and
  /// [base, base + bytes) overlaps no region of this arena. The arena uses it
  /// until remove_free_regions() hands it back. Errors: invalid_argument.
  Status add_region(void* base, std::size_t bytes);

  /// bytes > 0, a multiple of kChunkGranule. The best-fitting free chunk,
  /// split if worth it; its `bytes` is the chunk's size (>= bytes), which is
  /// what the pool counts as in use, as BFC does. A null `base` means no free
  /// chunk is large enough. If the chunk was last freed on another stream
  /// that stream is synchronized first; an error is that call's failure.
  Expected<MemoryRange> allocate(std::size_t bytes, Stream stream);

  /// Free chunks looked at beyond the best fit when that one costs anything.
  static constexpr std::size_t kPlacementCandidates = 64;
  /// As allocate(), but places the block where it costs least: its owner's
  /// `cost` twice (a granule to map is an unmap and a map, or a create and a
  /// map) plus one when a stream must be synchronized. The candidates are
  /// the start and the end of the best-fitting free chunk and, unless that
  /// costs nothing, of up to kPlacementCandidates other fitting chunks in
  /// best-fit order, and for each the owner's free window inside it when
  /// both ends cost; ties go to the better fit.
  Expected<PlacedBlock> allocate(std::size_t bytes, Stream stream, const PlacementCost& cost);

  /// ptr was returned by allocate() and not freed since; `stream` is the
  /// stream whose queued work may still use it. Returns the chunk's size.
  /// Errors (the arena unchanged): invalid_pointer for a pointer it never
  /// handed out or one inside a block or a free chunk, double_free for the
  /// start of a free chunk (a block freed already).
  Expected<std::size_t> free(void* ptr, Stream stream);

  /// The size of the live block at ptr; 0 when ptr is no live block's start.
  std::size_t live_size(const void* ptr) const noexcept;

  /// Calls fn(address, bytes, in_use, waits_on) for every chunk of the
  /// region starting at `base`, in address order; waits_on is the stream
  /// whose queued work may still touch a free chunk (not synchronized since
  /// it freed it), else kNoStream.
  template <typename Fn>
  void for_each_chunk(std::uintptr_t base, Fn&& fn) const {
    const Region* region = region_containing(base);
    for (ChunkId id = region == nullptr ? kNoChunk : region->first; id != kNoChunk; id = chunks_[id].next) {
      const Chunk& chunk = chunks_[id];
      fn(chunk.address, chunk.size, chunk.in_use, !chunk.in_use && waits(chunk) ? chunk.stream : kNoStream);
    }
  }

  /// The largest block allocate() could hand out now.
  std::size_t largest_free_block() const noexcept { return bins_.largest(chunks_); }
  std::size_t free_bytes() const noexcept { return bins_.free_bytes(); }
  std::size_t region_bytes() const noexcept { return region_bytes_; }
  const std::vector<MemoryRange>& regions() const noexcept { return region_ranges_; }

  /// The total size of the regions with nothing in use.
  std::size_t free_region_bytes() const noexcept;

  /// Removes every region with nothing in use and returns them, so the owner
  /// can give them back to the device.
  std::vector<MemoryRange> remove_free_regions();

  /// The memory map: regions, their chunks (the first few of each), chunks in
  /// use and free by size, and the non-empty bins.
  std::string dump() const;

 private:
  struct Region {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    ChunkId first = kNoChunk;  // the chunk at base: never merged away
  };

  bool should_split(std::size_t chunk_size, std::size_t bytes) const noexcept;
  /// The best-fitting free chunk, merging stream-separated neighbours first
  /// when none fits; kNoChunk when none does even then.
  Expected<ChunkId> find_fitting(std::size_t bytes);
  /// Hands out free chunk `id` (in its bin, at least `bytes`) for `stream`:
  /// `offset` bytes into it (0: its front; size - bytes: its back), split
  /// off if worth it; a free front piece stays free.
  Expected<MemoryRange> take(ChunkId id, std::size_t bytes, Stream stream, std::size_t offset = 0);
  /// take(), as the PlacementCost allocate() answers.
  Expected<PlacedBlock> place_at(ChunkId id, std::size_t bytes, Stream stream, std::size_t offset, bool costs_nothing);
  /// That allocate() where the best fit `fit`'s front costs: the choice by cost.
  Expected<PlacedBlock> place_by_cost(ChunkId fit, std::size_t bytes, Stream stream, const PlacementCost& cost);
  /// Whether work on the stream that freed `chunk` may still touch it: it is
  /// tagged, and that stream was not synchronized since.
  bool waits(const Chunk& chunk) const noexcept;
  /// Whether handing free chunk `chunk` to `stream` must first synchronize
  /// the stream that freed it: the chunk waits, and the device finds that
  /// stream busy.
  bool must_wait(const Chunk& chunk, Stream stream) { return may_wait(chunk, stream) && busy(chunk.stream); }
  /// must_wait() without asking the device: whether the freeing stream has
  /// not been found idle since.
  bool may_wait(const Chunk& chunk, Stream stream) const noexcept {
    return chunk.stream != stream && waits(chunk);
  }
  /// Whether work queued on `stream` may still run: asks the device
  /// (Device::query) at most once an allocation while it stays busy; found
  /// idle, the stream counts as synchronized.
  bool busy(Stream stream);
  /// `stream` was synchronized (or found idle): memory it freed so far waits
  /// for nothing.
  void synchronized(Stream stream);
  /// Cuts `bytes` off the back of free chunk `id` (in its bin) as a new free
  /// chunk in no bin, and returns it; `id` keeps the rest.
  ChunkId split_back(ChunkId id, std::size_t bytes);
  /// Cuts `bytes` off the front of free chunk `id` (in its bin) as a new free
  /// chunk in no bin, and returns it; `id` keeps the rest.
  ChunkId split_front(ChunkId id, std::size_t bytes);
  /// Makes chunk `below` (or, if none, the region starting at `address`)
  /// point up to `id`.
  void relink_below(ChunkId below, std::uintptr_t address, ChunkId id) noexcept;
  /// Merges `upper` into `lower` (neighbours, both free and in no bin).
  void merge(ChunkId lower, ChunkId upper);
  /// Whether two free neighbours may merge: their stream tags agree, or one
  /// is kNoStream. Memory with work pending on two streams is kept apart.
  static bool streams_compatible(Stream a, Stream b) noexcept {
    return a == b || a == kNoStream || b == kNoStream;
  }
  /// Coalesces `id` (just freed, in no bin) with its free neighbours and
  /// puts the result in its bin.
  void coalesce_and_insert(ChunkId id);
  /// Synchronizes every stream that free memory is tagged with, then merges
  /// the free neighbours that stream tags kept apart.
  Status settle_streams();
  const Region* region_containing(std::uintptr_t address) const noexcept;
  Error bad_free(void* ptr) const;

  Device& device_;
  ArenaOptions options_;
  ChunkTable chunks_;
  FreeBins bins_;
  AddressMap live_;                       // start address of each block in use -> chunk id
  std::vector<Region> regions_;           // sorted by base
  std::vector<MemoryRange> region_ranges_;  // the same, for callers
  std::size_t region_bytes_ = 0;
  std::size_t unmerged_pairs_ = 0;  // free neighbours kept apart by stream tags
  std::uint64_t frees_ = 0;         // free() calls so far: Chunk::freed_at
  std::uint64_t allocations_ = 0;   // allocate() calls so far
  /// Per stream: frees_ at its last synchronize, or the last query that
  /// found it idle. One clears every chunk the stream freed before it, so a
  /// stream's memory passing to other streams costs one call, not one per
  /// chunk.
  StreamValues synchronized_;
  /// Per stream: allocations_ when a query last found it busy.
  StreamValues busy_since_;
};

}  // namespace tidepool::pool
