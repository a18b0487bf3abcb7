// Chunks: the pieces a best-fit arena cuts its regions into, and the table
// that holds their host-side records (device memory is never written by the
// pool: on a GPU it is not even readable from the host). Internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tidepool/device.hpp"

namespace tidepool::pool {

using ChunkId = std::uint32_t;
inline constexpr ChunkId kNoChunk = std::numeric_limits<ChunkId>::max();

/// A free chunk's stream tag when no queued work on any stream can still
/// touch it (fresh region memory, or memory whose stream was synchronized).
inline constexpr Stream kNoStream = std::numeric_limits<Stream>::max();

struct Chunk {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  ChunkId prev = kNoChunk;       // neighbour below, in the same region
  ChunkId next = kNoChunk;       // neighbour above, in the same region
  ChunkId free_prev = kNoChunk;  // links in the bin's free list (or the table's unused list)
  ChunkId free_next = kNoChunk;
  // Free: the stream whose queued work may still use the memory (kNoStream:
  // none). In use: the stream it was allocated on.
  Stream stream = kNoStream;
  /// Free: the arena's count of frees when it was freed (the latest, for a
  /// chunk merged from several), to tell whether a synchronize came after.
  std::uint64_t freed_at = 0;
  std::uint32_t bin = 0;  // valid while free
  bool in_use = false;

  void* pointer() const noexcept { return reinterpret_cast<void*>(address); }
  std::uintptr_t end() const noexcept { return address + size; }
};

/// Chunk records by id, with ids of deleted chunks reused (as BFC does), so
/// the table grows only to the most chunks ever alive at once.
class ChunkTable {
 public:
  /// A chunk id; the record's fields are stale until the caller sets them all.
  ChunkId create() {
    if (unused_head_ != kNoChunk) {
      const ChunkId id = unused_head_;
      unused_head_ = chunks_[id].free_next;
      return id;
    }
    chunks_.emplace_back();
    return static_cast<ChunkId>(chunks_.size() - 1);
  }
  /// id came from create() and is not deleted yet.
  void destroy(ChunkId id) noexcept {
    chunks_[id].free_next = unused_head_;
    unused_head_ = id;
  }

  Chunk& operator[](ChunkId id) noexcept { return chunks_[id]; }
  const Chunk& operator[](ChunkId id) const noexcept { return chunks_[id]; }

 private:
  std::vector<Chunk> chunks_;
  ChunkId unused_head_ = kNoChunk;
};

}  // namespace tidepool::pool
