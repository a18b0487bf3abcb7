#include "pool/best_fit_arena.hpp"

#include <algorithm>
#include <map>

#include "tidepool/units.hpp"

namespace tidepool::pool {
namespace {

std::string stream_name(Stream stream) {
  return stream == kNoStream ? std::string("none") : std::to_string(stream);
}

// How many chunks of each region dump() lists before summarizing the rest.
constexpr std::size_t kDumpChunksPerRegion = 32;

}  // namespace

BestFitArena::BestFitArena(Device& device, ArenaOptions options) : device_(device), options_(options) {}

Status BestFitArena::add_region(void* base, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  if (base == nullptr || !is_aligned(address, kChunkGranule)) {
    return Error(Errc::invalid_argument, "best-fit arena: region base " + format_address(address) + " is not " +
                                             std::to_string(kChunkGranule) + "-byte aligned");
  }
  if (bytes == 0 || bytes % kChunkGranule != 0 || address + bytes < address) {
    return Error(Errc::invalid_argument, "best-fit arena: region size " + std::to_string(bytes) +
                                             " at " + format_address(address) + " is not a positive multiple of " +
                                             std::to_string(kChunkGranule));
  }
  const auto after = std::lower_bound(regions_.begin(), regions_.end(), address,
                                      [](const Region& r, std::uintptr_t a) { return r.base < a; });
  const bool overlaps_next = after != regions_.end() && after->base < address + bytes;
  const bool overlaps_prev = after != regions_.begin() && std::prev(after)->base + std::prev(after)->bytes > address;
  if (overlaps_next || overlaps_prev) {
    return Error(Errc::invalid_argument, "best-fit arena: region [" + format_address(address) + ", " +
                                             format_address(address + bytes) + ") overlaps a region it already has");
  }
  const ChunkId id = chunks_.create();
  chunks_[id] = Chunk{};
  Chunk& chunk = chunks_[id];
  chunk.address = address;
  chunk.size = bytes;
  chunk.stream = kNoStream;
  bins_.insert(chunks_, id);
  const auto index = after - regions_.begin();
  regions_.insert(after, Region{address, bytes, id});
  region_ranges_.insert(region_ranges_.begin() + index, MemoryRange{base, bytes});
  region_bytes_ += bytes;
  return {};
}

bool BestFitArena::should_split(std::size_t chunk_size, std::size_t bytes) const noexcept {
  const std::size_t remainder = chunk_size - bytes;
  return remainder >= bytes || remainder >= options_.max_internal_fragmentation_bytes;
}

ChunkId BestFitArena::split_front(ChunkId id, std::size_t bytes) {
  const ChunkId front_id = chunks_.create();  // may move records: index after it
  Chunk& rest = chunks_[id];
  Chunk& front = chunks_[front_id];
  front.address = rest.address;
  front.size = bytes;
  front.stream = rest.stream;
  front.freed_at = rest.freed_at;
  front.in_use = false;
  front.prev = rest.prev;
  front.next = id;
  relink_below(rest.prev, front.address, front_id);
  rest.prev = front_id;
  rest.address += bytes;
  bins_.resize(chunks_, id, rest.size - bytes);
  return front_id;
}

void BestFitArena::relink_below(ChunkId below, std::uintptr_t address, ChunkId id) noexcept {
  if (below != kNoChunk) {
    chunks_[below].next = id;
    return;
  }
  // `id` now starts its region.
  auto after = std::upper_bound(regions_.begin(), regions_.end(), address,
                                [](std::uintptr_t a, const Region& r) { return a < r.base; });
  std::prev(after)->first = id;
}

void BestFitArena::merge(ChunkId lower, ChunkId upper) {
  Chunk& low = chunks_[lower];
  const Chunk& up = chunks_[upper];
  low.size += up.size;
  low.next = up.next;
  if (up.next != kNoChunk) chunks_[up.next].prev = lower;
  if (low.stream == kNoStream) low.stream = up.stream;
  low.freed_at = std::max(low.freed_at, up.freed_at);
  chunks_.destroy(upper);
}

void BestFitArena::coalesce_and_insert(ChunkId id) {
  Chunk& chunk = chunks_[id];
  const ChunkId prev = chunk.prev;
  const ChunkId next = chunk.next;
  const bool prev_free = prev != kNoChunk && !chunks_[prev].in_use;
  const bool next_free = next != kNoChunk && !chunks_[next].in_use;
  // A neighbour whose stream was synchronized since its free waits for
  // nothing: untagged, it merges with anything.
  if (prev_free && !waits(chunks_[prev])) chunks_[prev].stream = kNoStream;
  if (next_free && !waits(chunks_[next])) chunks_[next].stream = kNoStream;
  const bool with_prev = prev_free && streams_compatible(chunks_[prev].stream, chunk.stream);
  const bool with_next = next_free && streams_compatible(chunk.stream, chunks_[next].stream);
  unmerged_pairs_ += static_cast<std::size_t>(prev_free && !with_prev) + (next_free && !with_next);

  if (with_prev) {
    // The free chunk below grows over this one (and the one above, if free);
    // it stays in its bin unless its size class changes.
    Chunk& low = chunks_[prev];
    std::size_t size = low.size + chunk.size;
    low.next = next;
    if (next != kNoChunk) chunks_[next].prev = prev;
    if (with_next) {
      Chunk& up = chunks_[next];
      bins_.remove(chunks_, next);
      size += up.size;
      low.freed_at = std::max(low.freed_at, up.freed_at);
      low.next = up.next;
      if (up.next != kNoChunk) chunks_[up.next].prev = prev;
      chunks_.destroy(next);
    }
    low.stream = chunk.stream;  // the others are kNoStream or the same stream
    low.freed_at = std::max(low.freed_at, chunk.freed_at);
    chunks_.destroy(id);
    bins_.resize(chunks_, prev, size);
  } else if (with_next) {
    // The free chunk above grows down over this one.
    Chunk& up = chunks_[next];
    up.address = chunk.address;
    up.prev = prev;
    up.stream = chunk.stream;
    up.freed_at = std::max(up.freed_at, chunk.freed_at);
    relink_below(prev, chunk.address, next);
    const std::size_t size = up.size + chunk.size;
    chunks_.destroy(id);
    bins_.resize(chunks_, next, size);
  } else {
    bins_.insert(chunks_, id);
  }
}

ChunkId BestFitArena::split_back(ChunkId id, std::size_t bytes) {
  const ChunkId back_id = chunks_.create();  // may move records: index after it
  Chunk& rest = chunks_[id];
  Chunk& back = chunks_[back_id];
  back.address = rest.end() - bytes;
  back.size = bytes;
  back.stream = rest.stream;
  back.freed_at = rest.freed_at;
  back.in_use = false;
  back.prev = id;
  back.next = rest.next;
  if (rest.next != kNoChunk) chunks_[rest.next].prev = back_id;
  rest.next = back_id;
  bins_.resize(chunks_, id, rest.size - bytes);
  return back_id;
}

Expected<ChunkId> BestFitArena::find_fitting(std::size_t bytes) {
  ChunkId id = bins_.find(chunks_, bytes);
  if (id == kNoChunk && unmerged_pairs_ > 0) {
    // Neighbours kept apart by stream tags may together be large enough.
    Status settled = settle_streams();
    if (!settled) return std::move(settled).error();
    id = bins_.find(chunks_, bytes);
  }
  return id;
}

Expected<MemoryRange> BestFitArena::take(ChunkId id, std::size_t bytes, Stream stream, std::size_t offset) {
  const bool at_end = offset != 0 && offset + bytes == chunks_[id].size;
  if (offset != 0 && !at_end) {
    // In the middle: the piece below stays free, in a bin of its own, with
    // the chunk's stream and neighbours; the block is the rest's front.
    bins_.insert(chunks_, split_front(id, offset));
  }
  Chunk* chunk = &chunks_[id];
  if (must_wait(*chunk, stream)) {
    // Work queued on the freeing stream may still touch this memory.
    Status synced = device_.synchronize(chunk->stream);
    if (!synced) return std::move(synced).error();
    synchronized(chunk->stream);
  }
  if (chunk->stream != stream) chunk->stream = kNoStream;
  if (should_split(chunk->size, bytes)) {
    // The part handed out gets a new record; the rest keeps the old one (and usually its bin).
    id = at_end ? split_back(id, bytes) : split_front(id, bytes);
    chunk = &chunks_[id];
  } else {
    bins_.remove(chunks_, id);
  }
  chunk->in_use = true;
  chunk->stream = stream;
  live_.insert(chunk->address, id);
  return MemoryRange{chunk->pointer(), chunk->size};
}

bool BestFitArena::waits(const Chunk& chunk) const noexcept {
  return chunk.stream != kNoStream && chunk.freed_at > synchronized_.at(chunk.stream);
}

void BestFitArena::synchronized(Stream stream) { synchronized_.set(stream, frees_); }

bool BestFitArena::busy(Stream stream) {
  if (busy_since_.at(stream) == allocations_) return true;  // asked during this allocation
  if (Expected<bool> idle = device_.query(stream); idle && *idle) {
    synchronized(stream);
    return false;
  }
  busy_since_.set(stream, allocations_);  // an error too: the synchronize will report it
  return true;
}

Expected<MemoryRange> BestFitArena::allocate(std::size_t bytes, Stream stream) {
  ++allocations_;
  Expected<ChunkId> id = find_fitting(bytes);
  if (!id) return std::move(id).error();
  if (*id == kNoChunk) return MemoryRange{};
  return take(*id, bytes, stream);
}

Expected<PlacedBlock> BestFitArena::allocate(std::size_t bytes, Stream stream, const PlacementCost& cost) {
  ++allocations_;
  Expected<ChunkId> fit = find_fitting(bytes);
  if (!fit) return std::move(fit).error();
  if (*fit == kNoChunk) return PlacedBlock{};
  // Usually the best fit's front is mapped and waits for no stream.
  if (const Chunk& chunk = chunks_[*fit]; !must_wait(chunk, stream) && cost.costs_nothing(chunk.address, bytes)) {
    return place_at(*fit, bytes, stream, 0, true);
  }
  return place_by_cost(*fit, bytes, stream, cost);
}

Expected<PlacedBlock> BestFitArena::place_at(ChunkId id, std::size_t bytes, Stream stream, std::size_t offset,
                                             bool costs_nothing) {
  Expected<MemoryRange> block = take(id, bytes, stream, offset);
  if (!block) return std::move(block).error();
  return PlacedBlock{block->base, block->bytes, costs_nothing};
}

Expected<PlacedBlock> BestFitArena::place_by_cost(ChunkId fit, std::size_t bytes, Stream stream,
                                                  const PlacementCost& cost) {
  if (cost.mostly_free()) {
    // The scoring below takes the first placement, in its order, that maps
    // nothing and waits for nothing, when there is one: found here without
    // counting any candidate's cost.
    auto free_at = [&](ChunkId id) -> std::size_t {  // an offset into the chunk, or SIZE_MAX
      const Chunk& chunk = chunks_[id];
      if (id == fit ? must_wait(chunk, stream) : may_wait(chunk, stream)) return SIZE_MAX;
      if (id != fit && cost.costs_nothing(chunk.address, bytes)) return 0;  // the fit's front costs (above)
      if (!should_split(chunk.size, bytes)) return SIZE_MAX;
      if (cost.costs_nothing(chunk.end() - bytes, bytes)) return chunk.size - bytes;
      const std::uintptr_t at = cost.free_window(chunk.address, chunk.end(), bytes);
      return at == 0 ? SIZE_MAX : at - chunk.address;
    };
    ChunkId id = fit;
    std::size_t offset = free_at(id);
    if (offset == SIZE_MAX) {
      std::size_t looked = 0;
      bins_.visit_fitting(chunks_, bytes, [&](ChunkId other) {
        if (other == fit) return true;
        id = other;
        offset = free_at(other);
        return offset == SIZE_MAX && ++looked < kPlacementCandidates;
      });
    }
    if (offset != SIZE_MAX) return place_at(id, bytes, stream, offset, true);
  }
  struct Placement {
    ChunkId id;
    std::size_t offset;
    std::size_t score;
  };
  // A candidate's score, or `bound` when it cannot score below it (a sync
  // alone already does not): such a one is never taken, so its granules
  // need not be counted. Only the best fit's stream is asked whether it is
  // busy; the others' count as busy (take() asks for the one taken), so an
  // allocation queries a stream or two, not one per candidate.
  auto place = [&](ChunkId id, std::size_t bound) {
    const Chunk& chunk = chunks_[id];
    const bool wait = id == fit ? must_wait(chunk, stream) : may_wait(chunk, stream);
    const std::size_t sync = wait ? 1 : 0;
    if (sync >= bound) return Placement{id, 0, bound};
    // When one granule to map already reaches the bound, only a placement
    // that maps nothing could be taken: asking whether one does is cheaper
    // than counting.
    const bool only_free = bound <= sync + 2;
    auto score = [&](std::uintptr_t base) {
      if (only_free) return cost.costs_nothing(base, bytes) ? sync : bound;
      return 2 * cost.cost(base, bytes) + sync;
    };
    const std::size_t front = score(chunk.address);
    if (front == sync || !should_split(chunk.size, bytes)) return Placement{id, 0, front};
    const std::size_t back = score(chunk.end() - bytes);
    if (back == sync) return Placement{id, chunk.size - bytes, back};
    if (const std::uintptr_t at = cost.free_window(chunk.address, chunk.end(), bytes); at != 0) {
      return Placement{id, at - chunk.address, sync};
    }
    return back < front ? Placement{id, chunk.size - bytes, back} : Placement{id, 0, front};
  };
  Placement best = place(fit, SIZE_MAX);
  if (best.score != 0) {
    std::size_t looked = 0;
    bins_.visit_fitting(chunks_, bytes, [&](ChunkId id) {
      if (id == fit) return true;
      const Placement here = place(id, best.score);
      if (here.score < best.score) best = here;
      return best.score != 0 && ++looked < kPlacementCandidates;
    });
  }
  return place_at(best.id, bytes, stream, best.offset, best.score <= 1);  // a score is twice the cost, plus 1 for a sync
}

Expected<std::size_t> BestFitArena::free(void* ptr, Stream stream) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const ChunkId id = live_.take(address);
  if (id == AddressMap::kMissing) return bad_free(ptr);
  Chunk& chunk = chunks_[id];
  const std::size_t size = chunk.size;
  chunk.in_use = false;
  chunk.stream = stream;
  chunk.freed_at = ++frees_;
  coalesce_and_insert(id);
  return size;
}

std::size_t BestFitArena::live_size(const void* ptr) const noexcept {
  const ChunkId id = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return id == AddressMap::kMissing ? 0 : chunks_[id].size;
}

const BestFitArena::Region* BestFitArena::region_containing(std::uintptr_t address) const noexcept {
  auto after = std::upper_bound(regions_.begin(), regions_.end(), address,
                                [](std::uintptr_t a, const Region& r) { return a < r.base; });
  if (after == regions_.begin()) return nullptr;
  const Region& region = *std::prev(after);
  return address < region.base + region.bytes ? &region : nullptr;
}

Error BestFitArena::bad_free(void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const Region* region = region_containing(address);
  if (region == nullptr) {
    return Error(Errc::invalid_pointer,
                 "free of " + format_address(address) + ": not a pointer this pool handed out (it lies in none of its " +
                     std::to_string(regions_.size()) + " regions)");
  }
  // Inside a region: find the chunk that covers it (error path only, so a walk is fine).
  ChunkId id = region->first;
  while (id != kNoChunk && chunks_[id].end() <= address) id = chunks_[id].next;
  const Chunk& chunk = chunks_[id];
  const std::string where = "chunk [" + format_address(chunk.address) + ", " + format_address(chunk.end()) + ")";
  if (chunk.in_use) {
    return Error(Errc::invalid_pointer, "free of " + format_address(address) + ": not the start of a block; it lies " +
                                            std::to_string(address - chunk.address) +
                                            " bytes into the live block at " + format_address(chunk.address));
  }
  // Only a free chunk's start can be a block freed before; a pointer inside
  // one was never a block start of this pool (unless a freed block merged
  // into its neighbour: said, since it may then be a second free).
  if (address != chunk.address) {
    return Error(Errc::invalid_pointer, "free of " + format_address(address) + ": not a block of this pool; it lies " +
                                            std::to_string(address - chunk.address) + " bytes into free " + where +
                                            " (if a block started there it was freed already and merged)");
  }
  return Error(Errc::double_free, "free of " + format_address(address) + ": the memory is free already (in free " +
                                      where + "); was it freed twice?");
}

Status BestFitArena::settle_streams() {
  std::vector<Stream> pending;
  for (const Region& region : regions_) {
    for (ChunkId id = region.first; id != kNoChunk; id = chunks_[id].next) {
      const Chunk& chunk = chunks_[id];
      if (!chunk.in_use && chunk.stream != kNoStream &&
          std::find(pending.begin(), pending.end(), chunk.stream) == pending.end()) {
        pending.push_back(chunk.stream);
      }
    }
  }
  for (Stream stream : pending) {
    Status waited = wait_for(device_, stream);
    if (!waited) return waited;
    synchronized(stream);
  }
  for (const Region& region : regions_) {
    for (ChunkId id = region.first; id != kNoChunk; id = chunks_[id].next) {
      if (chunks_[id].in_use) continue;
      chunks_[id].stream = kNoStream;
      // Absorb every free chunk above this one.
      while (chunks_[id].next != kNoChunk && !chunks_[chunks_[id].next].in_use) {
        const ChunkId next = chunks_[id].next;
        bins_.remove(chunks_, id);
        bins_.remove(chunks_, next);
        merge(id, next);
        chunks_[id].stream = kNoStream;
        bins_.insert(chunks_, id);
      }
    }
  }
  unmerged_pairs_ = 0;
  return {};
}

std::size_t BestFitArena::free_region_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const Region& region : regions_) {
    const Chunk& first = chunks_[region.first];
    if (!first.in_use && first.size == region.bytes) bytes += region.bytes;
  }
  return bytes;
}

std::vector<MemoryRange> BestFitArena::remove_free_regions() {
  // Free neighbours freed on different streams are kept apart until their
  // streams are synchronized; merge them first, or a region that is wholly
  // free would look split and stay (found by fuzz/pool_ops_fuzz). A failed
  // synchronize leaves them apart: only the regions already whole go back.
  if (unmerged_pairs_ > 0) (void)settle_streams();
  std::vector<MemoryRange> removed;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const Region region = regions_[i];
    const Chunk& first = chunks_[region.first];
    if (!first.in_use && first.size == region.bytes) {
      bins_.remove(chunks_, region.first);
      chunks_.destroy(region.first);
      region_bytes_ -= region.bytes;
      removed.push_back(region_ranges_[i]);
    } else {
      regions_[kept] = region;
      region_ranges_[kept] = region_ranges_[i];
      ++kept;
    }
  }
  regions_.resize(kept);
  region_ranges_.resize(kept);
  return removed;
}

std::string BestFitArena::dump() const {
  std::string out;
  std::map<std::size_t, std::size_t> in_use_by_size;
  std::map<std::size_t, std::size_t> free_by_size;
  std::size_t in_use_bytes = 0;
  out += std::to_string(regions_.size()) + " regions, " + format_bytes(region_bytes_) + "; " +
         format_bytes(bins_.free_bytes()) + " free in " + std::to_string(bins_.free_chunks()) +
         " chunks, largest free chunk " + format_bytes(largest_free_block()) + "\n";
  for (const Region& region : regions_) {
    std::size_t count = 0;
    std::size_t listed = 0;
    std::string lines;
    for (ChunkId id = region.first; id != kNoChunk; id = chunks_[id].next) {
      const Chunk& chunk = chunks_[id];
      ++count;
      if (chunk.in_use) {
        ++in_use_by_size[chunk.size];
        in_use_bytes += chunk.size;
      } else {
        ++free_by_size[chunk.size];
      }
      if (listed < kDumpChunksPerRegion) {
        ++listed;
        lines += std::string("    ") + (chunk.in_use ? "in use " : "free   ") + format_address(chunk.address) + " " +
                 format_bytes(chunk.size) + " stream " + stream_name(chunk.stream) + "\n";
      }
    }
    out += "  region " + format_address(region.base) + " " + format_bytes(region.bytes) + ": " + std::to_string(count) +
           " chunks\n" + lines;
    if (count > listed) out += "    ... " + std::to_string(count - listed) + " more chunks\n";
  }
  out += "  in use by size (" + format_bytes(in_use_bytes) + "):";
  if (in_use_by_size.empty()) out += " none";
  for (const auto& [size, count] : in_use_by_size) out += " " + std::to_string(count) + " x " + format_bytes(size) + ";";
  out += "\n  free by size:";
  if (free_by_size.empty()) out += " none";
  for (const auto& [size, count] : free_by_size) out += " " + std::to_string(count) + " x " + format_bytes(size) + ";";
  out += "\n  bins:";
  bool any_bin = false;
  for (std::size_t bin = 0; bin < SizeBins::kNumBins; ++bin) {
    if (bins_.head(bin) == kNoChunk) continue;
    any_bin = true;
    std::size_t count = 0;
    std::size_t bytes = 0;
    for (ChunkId id = bins_.head(bin); id != kNoChunk; id = chunks_[id].free_next) {
      ++count;
      bytes += chunks_[id].size;
    }
    out += " [" + std::to_string(bin) + ": from " + format_bytes(SizeBins::lower_bound(bin)) + ", " +
           std::to_string(count) + " free, " + format_bytes(bytes) + "]";
  }
  if (!any_bin) out += " all empty";
  out += "\n";
  return out;
}

}  // namespace tidepool::pool
