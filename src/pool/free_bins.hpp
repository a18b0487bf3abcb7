// The free chunks of an arena, by size class: an intrusive doubly linked list
// per bin (links live in the chunk records, so no allocation per operation)
// and a bitmap of the non-empty bins. Internal.
//
// Fit policy: exact best fit. In an exact-size bin every chunk fits equally
// well and the most recently freed one is taken (LIFO: its memory is the most
// likely to be warm; XLA's BFC takes the lowest address instead). Bins above
// SizeBins::kExactBinLimit are scanned for the smallest chunk that fits, ties
// to the lowest address, as BFC does; such chunks are few.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>

#include "pool/chunk_table.hpp"
#include "pool/size_bins.hpp"

namespace tidepool::pool {

class FreeBins {
 public:
  FreeBins() { heads_.fill(kNoChunk); }

  /// chunk is free and in no bin.
  void insert(ChunkTable& chunks, ChunkId id) noexcept {
    link(chunks, id, SizeBins::bin_of(chunks[id].size));
    free_bytes_ += chunks[id].size;
    ++free_chunks_;
  }

  /// chunk is in a bin (inserted and not removed since).
  void remove(ChunkTable& chunks, ChunkId id) noexcept {
    unlink(chunks, id);
    free_bytes_ -= chunks[id].size;
    --free_chunks_;
  }

  /// Changes the size of a chunk in a bin, moving it only if its bin changes
  /// (so the common split and merge against a large free chunk touch no list).
  void resize(ChunkTable& chunks, ChunkId id, std::size_t size) noexcept {
    Chunk& chunk = chunks[id];
    free_bytes_ = free_bytes_ - chunk.size + size;
    chunk.size = size;
    const std::size_t bin = SizeBins::bin_of(size);
    if (bin != chunk.bin) {
      unlink(chunks, id);
      link(chunks, id, bin);
    }
  }

  /// The best-fitting free chunk of at least `size` bytes (size > 0, a
  /// multiple of kChunkGranule), or kNoChunk. It stays in its bin.
  ChunkId find(const ChunkTable& chunks, std::size_t size) const noexcept {
    std::size_t bin = SizeBins::bin_of(size);
    if (!SizeBins::is_exact(bin) && bitmap_.test(bin)) {
      // A range bin may hold chunks smaller than the request.
      const ChunkId id = smallest_fitting(chunks, bin, size);
      if (id != kNoChunk) return id;
      ++bin;
    }
    bin = bitmap_.first_at_or_after(bin);
    if (bin == BinBitmap::kNone) return kNoChunk;
    if (SizeBins::is_exact(bin)) return heads_[bin];
    return smallest_fitting(chunks, bin, size);
  }

  /// Calls visit(id) for each free chunk of at least `size` bytes, bin by
  /// bin from the smallest that can fit, until visit returns false. visit
  /// must not change the bins.
  template <class Visit>
  void visit_fitting(const ChunkTable& chunks, std::size_t size, Visit&& visit) const {
    for (std::size_t bin = bitmap_.first_at_or_after(SizeBins::bin_of(size)); bin != BinBitmap::kNone;
         bin = bitmap_.first_at_or_after(bin + 1)) {
      for (ChunkId id = heads_[bin]; id != kNoChunk; id = chunks[id].free_next) {
        if (chunks[id].size >= size && !visit(id)) return;
      }
    }
  }

  /// The size of the largest free chunk, or 0.
  std::size_t largest(const ChunkTable& chunks) const noexcept {
    const std::size_t bin = bitmap_.last();
    if (bin == BinBitmap::kNone) return 0;
    std::size_t largest = 0;
    for (ChunkId id = heads_[bin]; id != kNoChunk; id = chunks[id].free_next) {
      largest = std::max(largest, chunks[id].size);
    }
    return largest;
  }

  ChunkId head(std::size_t bin) const noexcept { return heads_[bin]; }
  std::size_t free_bytes() const noexcept { return free_bytes_; }
  std::size_t free_chunks() const noexcept { return free_chunks_; }

 private:
  void link(ChunkTable& chunks, ChunkId id, std::size_t bin) noexcept {
    Chunk& chunk = chunks[id];
    chunk.bin = static_cast<std::uint32_t>(bin);
    chunk.free_prev = kNoChunk;
    chunk.free_next = heads_[bin];
    if (heads_[bin] != kNoChunk) chunks[heads_[bin]].free_prev = id;
    heads_[bin] = id;
    bitmap_.set(bin);
  }
  void unlink(ChunkTable& chunks, ChunkId id) noexcept {
    Chunk& chunk = chunks[id];
    if (chunk.free_prev != kNoChunk) {
      chunks[chunk.free_prev].free_next = chunk.free_next;
    } else {
      heads_[chunk.bin] = chunk.free_next;
      if (chunk.free_next == kNoChunk) bitmap_.clear(chunk.bin);
    }
    if (chunk.free_next != kNoChunk) chunks[chunk.free_next].free_prev = chunk.free_prev;
    chunk.free_prev = chunk.free_next = kNoChunk;
  }

  ChunkId smallest_fitting(const ChunkTable& chunks, std::size_t bin, std::size_t size) const noexcept {
    ChunkId best = kNoChunk;
    for (ChunkId id = heads_[bin]; id != kNoChunk; id = chunks[id].free_next) {
      const Chunk& chunk = chunks[id];
      if (chunk.size < size) continue;
      if (best == kNoChunk || chunk.size < chunks[best].size ||
          (chunk.size == chunks[best].size && chunk.address < chunks[best].address)) {
        best = id;
      }
    }
    return best;
  }

  std::array<ChunkId, SizeBins::kNumBins> heads_;
  BinBitmap bitmap_;
  std::size_t free_bytes_ = 0;
  std::size_t free_chunks_ = 0;
};

}  // namespace tidepool::pool
