// BestFitPool = a best-fit arena + BFC's region policy (one preallocated
// region, or regions that double in size as the pool grows) + the device
// calls + stats and OOM reports.
#include "tidepool/best_fit_pool.hpp"

#include <mutex>

#include "core/process.hpp"
#include "pool/best_fit_arena.hpp"
#include "pool/usage_counters.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

namespace {
// BFC's first region when growing: 2 MiB, or the limit if smaller.
constexpr std::size_t kFirstGrowthRegion = 2 * MiB;
}  // namespace

struct BestFitPool::State {
  State(std::shared_ptr<Device> device_in, bool preallocate_in, std::size_t limit)
      : device(std::move(device_in)), preallocate(preallocate_in), bytes_limit(limit), arena(*device) {}

  std::shared_ptr<Device> device;
  MakerProcess maker;  // a forked child leaves the pool alone (core/process.hpp)
  const bool preallocate;
  const std::size_t bytes_limit;  // a multiple of kChunkGranule
  mutable std::mutex mutex;
  pool::BestFitArena arena;
  std::size_t next_region_bytes = 0;  // BFC's curr_region_allocation_bytes_, at most bytes_limit
  pool::UsageCounters usage;

  /// BFC's Extend: takes a region large enough for `bytes` from the device.
  /// Returns false when the limit or the device refuses; an error for a
  /// device failure other than out of memory.
  Expected<bool> grow(std::size_t bytes);
  /// Doubles next_region_bytes, stopping at bytes_limit: no region is ever
  /// larger, and unbounded, a pool that trims and grows again and again
  /// doubled it past 2^64 to 0, and grow() then looped forever holding the
  /// pool's lock.
  void double_next_region() {
    next_region_bytes = next_region_bytes > bytes_limit / 2 ? bytes_limit : next_region_bytes * 2;
  }
  /// Gives every fully free region back to the device; returns the bytes.
  std::size_t release_free_regions();
  Error out_of_memory(std::size_t requested, std::size_t rounded);
};

Expected<bool> BestFitPool::State::grow(std::size_t bytes) {
  const std::size_t available = (bytes_limit - arena.region_bytes()) / pool::kChunkGranule * pool::kChunkGranule;
  if (bytes > available) return false;
  bool increased = false;
  while (bytes > next_region_bytes) {  // ends: bytes <= available <= bytes_limit
    double_next_region();
    increased = true;
  }
  std::size_t region_bytes = std::min(next_region_bytes, available);
  Expected<void*> region = device->allocate(region_bytes);
  while (!region) {
    if (region.error().code() != Errc::out_of_memory) return std::move(region).error();
    // Back off by 10% until the request no longer fits, as BFC does.
    std::size_t smaller = round_up(region_bytes / 10 * 9, pool::kChunkGranule);
    if (smaller >= region_bytes) smaller = region_bytes - pool::kChunkGranule;
    region_bytes = smaller;
    if (region_bytes < bytes) return false;
    region = device->allocate(region_bytes);
  }
  if (!increased) double_next_region();
  Status added = arena.add_region(*region, region_bytes);
  if (!added) {
    (void)device->free(*region, region_bytes);
    return std::move(added).error();
  }
  usage.reserved(region_bytes);
  return true;
}

std::size_t BestFitPool::State::release_free_regions() {
  std::size_t released = 0;
  for (const pool::MemoryRange& region : arena.remove_free_regions()) {
    // A failed free leaves the memory with the device's accounting; the pool
    // no longer uses it either way.
    (void)device->free(region.base, region.bytes);
    usage.released(region.bytes);
    released += region.bytes;
  }
  return released;
}

Error BestFitPool::State::out_of_memory(std::size_t requested, std::size_t rounded) {
  ++usage.num_ooms;
  OomReport report;
  report.requested_bytes = requested;
  report.bytes_in_use = static_cast<std::size_t>(usage.bytes_in_use);
  report.bytes_reserved = arena.region_bytes();
  report.device_free_bytes = device->mem_info().free_bytes;
  report.largest_free_block_bytes = arena.largest_free_block();
  const std::size_t pool_free = arena.free_bytes();
  const std::size_t growth_room = bytes_limit - arena.region_bytes();
  if (rounded > bytes_limit) {
    report.hint = "the request is larger than the pool's limit of " + format_bytes(bytes_limit);
    report.advice = OomAdvice::raise_limit;
  } else if (pool_free >= rounded) {
    report.hint = format_bytes(pool_free) + " is free in the pool but split into blocks no larger than " +
                  format_bytes(report.largest_free_block_bytes);
    report.advice = OomAdvice::use_expandable;
  } else if (pool_free + growth_room >= rounded) {
    report.hint = "the pool may grow by " + format_bytes(growth_room) + " but the device has only " +
                  format_bytes(report.device_free_bytes) +
                  " free: another process or allocator holds the rest of it";
  } else {
    report.hint = "the pool is at its limit of " + format_bytes(bytes_limit) + " with " +
                  format_bytes(report.bytes_in_use) + " in use";
    report.advice = OomAdvice::free_or_raise_limit;
  }
  return Error::out_of_memory(preallocate ? "preallocate pool" : "growth pool", std::move(report));
}

Expected<std::unique_ptr<BestFitPool>> BestFitPool::create(std::shared_ptr<Device> device, BestFitOptions options) {
  if (!device) return Error(Errc::invalid_argument, "BestFitPool::create: device is null");
  // The limit is the device's: a LimitDevice under the pool sets a smaller one.
  const std::size_t limit = device->mem_info().total_bytes / pool::kChunkGranule * pool::kChunkGranule;
  if (limit == 0) {
    return Error(Errc::invalid_argument, "BestFitPool::create: " + device->description() +
                                             " leaves no room for a 256-byte block");
  }
  auto state = std::make_unique<State>(std::move(device), options.preallocate, limit);
  if (options.preallocate) {
    state->next_region_bytes = limit;
    Expected<void*> region = state->device->allocate(limit);
    if (!region) {
      if (region.error().code() != Errc::out_of_memory) return std::move(region).error();
      OomReport report;
      report.requested_bytes = limit;
      report.device_free_bytes = state->device->mem_info().free_bytes;
      report.hint = "preallocation takes the pool's limit of " + format_bytes(limit) + " at once";
      report.advice = OomAdvice::lower_limit;
      return Error::out_of_memory("preallocate pool: preallocating", std::move(report));
    }
    Status added = state->arena.add_region(*region, limit);
    if (!added) {
      (void)state->device->free(*region, limit);
      return std::move(added).error();
    }
    state->usage.reserved(limit);
  } else {
    state->next_region_bytes = std::min(limit, kFirstGrowthRegion);
  }
  return std::unique_ptr<BestFitPool>(new BestFitPool(std::move(state)));
}

BestFitPool::BestFitPool(std::unique_ptr<State> state) : state_(std::move(state)) {}

BestFitPool::~BestFitPool() {
  // In a forked child the regions and the lock are the parent's: nothing to give back.
  if (state_->maker.forked()) {
    (void)state_.release();  // a leak in the child only
    return;
  }
  // As BFC: every region goes back, whatever is still in use in it.
  for (const pool::MemoryRange& region : state_->arena.regions()) {
    (void)state_->device->free(region.base, region.bytes);
  }
}

std::string_view BestFitPool::name() const { return state_->preallocate ? "preallocate" : "growth"; }

Device& BestFitPool::device() const { return *state_->device; }

Expected<void*> BestFitPool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal("the " + std::string(name()) + " pool");
  std::lock_guard lock(s.mutex);
  if (bytes > s.bytes_limit) return s.out_of_memory(bytes, bytes);
  const std::size_t rounded = round_up(bytes, pool::kChunkGranule);

  auto from_arena = [&]() -> Expected<void*> {
    Expected<pool::MemoryRange> block = s.arena.allocate(rounded, stream);
    if (!block) return std::move(block).error();
    if (block->base != nullptr) s.usage.allocated(block->bytes);
    return block->base;
  };
  Expected<void*> ptr = from_arena();
  if (!ptr || *ptr != nullptr) return ptr;

  // The cache cannot serve it: grow (BFC's Extend), and failing that give
  // fully free regions back so one larger region may fit, then grow again.
  Expected<bool> grown = s.grow(rounded);
  if (!grown) return std::move(grown).error();
  const std::size_t room_after_release = s.bytes_limit - s.arena.region_bytes() + s.arena.free_region_bytes();
  if (!*grown && rounded <= room_after_release && s.release_free_regions() > 0) {
    grown = s.grow(rounded);
    if (!grown) return std::move(grown).error();
  }
  if (*grown) {
    ptr = from_arena();
    if (!ptr || *ptr != nullptr) return ptr;
  }
  return s.out_of_memory(bytes, rounded);
}

Status BestFitPool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  if (s.maker.forked()) return {};  // the block is the parent's: the child leaves it alone
  std::lock_guard lock(s.mutex);
  Expected<std::size_t> freed = s.arena.free(ptr, stream);
  if (!freed) return std::move(freed).error();
  s.usage.freed(*freed);
  return {};
}

Stats BestFitPool::stats() const {
  const State& s = *state_;
  if (s.maker.forked()) return {};  // a forked child holds none of it
  std::lock_guard lock(s.mutex);
  Stats stats = s.usage.to_stats();
  stats.bytes_limit = static_cast<std::int64_t>(s.bytes_limit);
  stats.largest_free_block_bytes = static_cast<std::int64_t>(s.arena.largest_free_block());
  return stats;
}

std::size_t BestFitPool::trim() {
  if (state_->maker.forked()) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->release_free_regions();
}

std::string BestFitPool::dump() const {
  const State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal("the " + std::string(name()) + " pool").message() + "\n";
  std::lock_guard lock(s.mutex);
  std::string out = "best-fit pool \"" + std::string(name()) + "\" on " + s.device->description() + ": limit " +
                    format_bytes(s.bytes_limit) + ", in use " +
                    format_bytes(static_cast<std::size_t>(s.usage.bytes_in_use)) + ", next region " +
                    format_bytes(std::min(s.next_region_bytes, s.bytes_limit)) + "\n";
  return out + s.arena.dump();
}

}  // namespace tidepool
