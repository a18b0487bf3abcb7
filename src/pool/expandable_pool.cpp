// ExpandablePool = two best-fit arenas over reserved address space (small
// requests in one, large in the other) + a granule table saying which
// granules of that space have physical memory mapped + the device calls that
// map, steal (stitch), and release granules.
//
// A block is carved from address space first; then every granule under it
// that has no physical memory gets some: a free granule from elsewhere in the
// pool (unmapped there, mapped here: a stitch), or, when no granule is free,
// a new one from the device. Free granules stay mapped where they are, so a
// block freed and asked for again is reused in place with no device call.
//
// The granule bookkeeping costs a counter per granule, which for a large
// block is most of an alloc+free pair (a 64 MiB block spans 33 granules). So
// the last few large blocks freed are held back, still whole: one asked for
// again at the same size on the same stream is handed out as it is, and any
// other request (or stats, trim, a release) first completes their frees.
#include "tidepool/expandable_pool.hpp"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "pool/best_fit_arena.hpp"
#include "pool/granule_table.hpp"
#include "pool/sleep_tags.hpp"
#include "pool/usage_counters.hpp"

namespace tidepool {

namespace {

using pool::GranuleId;
using pool::kNoStream;

// Address space reserved per byte of the pool's limit: one share for small
// blocks, three for large ones. More is reserved only if a part runs out.
constexpr std::size_t kSmallSpaceShares = 1;
constexpr std::size_t kLargeSpaceShares = 3;
// Free granules up to 1/64 of the mapped ones are kept rather than stolen
// (see back()): peak reserved stays within ~1.6% of what the blocks span.
constexpr std::size_t kSlackShare = 64;
// Large blocks whose free is held back (see above). Enough for the large
// blocks of a layer or two freed and asked for again in the same order.
constexpr std::size_t kHeldBlocks = 16;
// A sleep or a wake copies this much at a time, overlapped with the
// unmapping or mapping of the chunk before (a bare copy's speed, not the
// sum of both).
constexpr std::size_t kCopyChunkBytes = 64 << 20;

pool::ArenaOptions arena_options() {
  // Always split: a chunk's unused tail would otherwise hold physical memory
  // for nothing. Sizes are multiples of 256, so the tail is 0 or >= 256.
  pool::ArenaOptions options;
  options.max_internal_fragmentation_bytes = pool::kChunkGranule;
  return options;
}

}  // namespace

struct ExpandablePool::State {
  State(std::shared_ptr<Device> device_in, ExpandableOptions options_in, std::size_t limit)
      : device(std::move(device_in)),
        options(options_in),
        granule(device->granularity()),
        granule_shift(static_cast<unsigned>(std::countr_zero(granule))),
        bytes_limit(limit),
        small(*device, arena_options()),
        large(*device, arena_options()) {
    held.reserve(kHeldBlocks);
  }

  /// A reservation of address space, all of it for one arena.
  struct Space {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    GranuleId first = 0;  // the granule at base
    bool small = false;
    pool::TagId tag = pool::kUntagged;  // whose arena it belongs to
  };

  std::shared_ptr<Device> device;
  const ExpandableOptions options;
  const std::size_t granule;
  const unsigned granule_shift;  // granule is a power of two: a shift, not a division, on the hot path
  const std::size_t bytes_limit;  // a multiple of granule
  mutable std::mutex mutex;
  pool::BestFitArena small;
  pool::BestFitArena large;
  std::vector<Space> spaces;
  pool::GranuleTable granules;
  std::vector<Stream> freeing_streams;  // every stream a block was freed on
  /// A block was freed on `stream`: remembered for settling, and the reaper
  /// woken if it waits for something to release.
  void note_free(Stream stream) {
    if (std::find(freeing_streams.begin(), freeing_streams.end(), stream) == freeing_streams.end()) {
      freeing_streams.push_back(stream);
    }
    if (reaper_parked) {
      reaper_parked = false;
      reaper_wake.notify_one();
    }
  }
  /// Large blocks freed but held back, oldest first: still allocated in the
  /// arena, their granules still used. Only while nothing is released after
  /// each free (release_threshold kKeepAll), so holding back delays nothing.
  struct Held {
    void* ptr;
    std::size_t bytes;
    Stream stream;
  };
  std::vector<Held> held;
  bool holds_back() const noexcept { return options.release_threshold == ExpandableOptions::kKeepAll; }
  pool::UsageCounters usage;
  // Idle release (options.idle_release): allocate and deallocate count their
  // calls; the reaper thread releases once the count stands still for the
  // idle time, and parks, waiting for a free, while nothing is cached.
  std::uint64_t calls = 0;
  bool reaper_parked = false;
  bool stopping = false;
  std::condition_variable reaper_wake;
  std::thread reaper;
  void reap();
  void stop_reaper() {
    if (!reaper.joinable()) return;
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    reaper_wake.notify_one();
    reaper.join();
  }
  std::int64_t maps = 0, unmaps = 0, stitches = 0;  // releases: usage.num_device_frees

  std::size_t mapped_bytes() const noexcept { return granules.mapped() * granule; }
  std::size_t free_granule_bytes() const noexcept { return granules.free_count() * granule; }
  /// Free granules kept before stealing: 1/64 of those mapped.
  std::size_t slack_granules() const noexcept { return granules.mapped() / kSlackShare; }

  /// Reserves `bytes` of address space for one arena.
  Status add_space(std::size_t bytes, bool for_small, pool::TagId tag = pool::kUntagged);
  const Space* space_of(std::uintptr_t address) const noexcept {
    for (const Space& space : spaces) {
      if (address - space.base < space.bytes) return &space;
    }
    return nullptr;
  }
  GranuleId granule_of(const Space& space, std::uintptr_t address) const noexcept {
    return space.first + static_cast<GranuleId>((address - space.base) >> granule_shift);
  }
  void* address_of(GranuleId id) const noexcept {
    for (const Space& space : spaces) {
      if (id - space.first < space.bytes / granule) {
        return reinterpret_cast<void*>(space.base + (id - space.first) * granule);
      }
    }
    return nullptr;
  }

  /// Gives every granule under [base, base + bytes) physical memory and one
  /// more use. On failure every granule is as it was, except that granules
  /// stolen for it may have moved here (free, still mapped).
  Status back(const Space& space, std::uintptr_t base, std::size_t bytes, std::size_t requested);
  /// One use less on every granule under the block, freed on `stream`.
  void unback(const Space& space, std::uintptr_t base, std::size_t bytes, Stream stream) noexcept;
  /// Frees a large block in full: in the arena, then its granules.
  void free_large(const Held& block) noexcept;
  /// Completes the frees held back, so that every free granule is counted free.
  void complete_held() noexcept {
    for (const Held& block : held) free_large(block);
    held.clear();
  }
  /// The free granules, counting those the held-back blocks' frees would
  /// free: what stats() reports, observed without completing them.
  std::size_t free_granules_with_held() const;
  bool is_held(const void* ptr) const noexcept {
    return std::any_of(held.begin(), held.end(), [ptr](const Held& block) { return block.ptr == ptr; });
  }
  /// Waits for the work that may still touch free granule `id`.
  Status settle(GranuleId id);
  /// Unmaps free granule `id`; its handle is the caller's to map again or
  /// release. Steals take the free granule at the highest address (see
  /// back()), releases the one that has waited longest.
  Expected<PhysicalHandle> unmap_free(GranuleId id);
  /// Gives an unmapped granule's handle back to the device. A failed release
  /// leaves the memory with the device's accounting; the pool no longer holds
  /// it either way.
  void release_handle(PhysicalHandle handle) {
    (void)device->release(handle, granule);
    usage.released(granule);
  }
  /// Unmaps and releases free granules, oldest first, until at most `keep`
  /// bytes of them remain. Returns the bytes released.
  std::size_t release_free(std::size_t keep);
  /// trim() and idle release: every free granule goes, held blocks' too.
  std::size_t release_all() {
    complete_held();
    return release_free(0);
  }
  Error out_of_memory(std::size_t requested, std::size_t rounded, std::size_t missing_granules);
  /// An OOM of `requested` bytes, counted: the pool's figures now, the hint to add.
  OomReport oom_report(std::size_t requested);

  /// The arenas place a block where it needs the fewest granules mapped, so
  /// that memory already mapped is used before any is stolen or created.
  struct GranulesToMap final : pool::PlacementCost {
    explicit GranulesToMap(const State& state) : s(state) {}
    std::size_t cost(std::uintptr_t base, std::size_t bytes) const noexcept override {
      const Space& space = *s.space_of(base);
      return s.granules.unmapped_in(s.granule_of(space, base), s.granule_of(space, base + bytes - 1));
    }
    const State& s;
  };
  const GranulesToMap placement_cost{*this};

  // --- tags, sleep and wake (sleep.hpp) ------------------------------------
  pool::TagRegistry tags;
  pool::BestFitArena& arena_for(bool for_small, pool::TagId tag) {
    if (tag == pool::kUntagged) return for_small ? small : large;
    pool::Tag& owner = tags.at(tag);
    return for_small ? owner.small : owner.large;
  }
  pool::BestFitArena& arena_of(const Space& space) { return arena_for(space.small, space.tag); }
  /// The awake tag an allocation of `bytes` on this thread goes to; an
  /// error when it sleeps or changes.
  Expected<pool::Tag*> tag_to_allocate(pool::TagId id, std::size_t bytes);
  /// Frees a block of a tag: at once, or after the tag's phase changes.
  Status free_tagged(const Space& space, void* ptr, Stream stream);
  /// Checks that `name` is in phase `from` and sets `to`, under the lock.
  Expected<pool::Tag*> begin_change(const char* op, std::string_view name, pool::TagPhase from, pool::TagPhase to);
  /// Sets the tag's phase and does the frees deferred while it changed.
  void end_change(pool::Tag& tag, pool::TagPhase phase);
  /// The granules under the tag's live blocks, ascending.
  std::vector<GranuleId> granules_under(const pool::Tag& tag) const;
  /// The mapped granules of the tag's address space, ascending.
  std::vector<GranuleId> mapped_granules(pool::TagId id) const;
  /// Waits for the tag's streams and makes (or grows) its host buffer for
  /// `keep`. Unlocked: the tag's phase keeps others off it.
  Status prepare_host(pool::Tag& tag, SleepKeep keep);
  /// The granules a sleep or a wake copies at a time, while it unmaps or
  /// maps the chunk before.
  std::size_t chunk_granules() const noexcept { return std::max<std::size_t>(1, kCopyChunkBytes / granule); }
  void free_host(pool::HostBuffer& buffer) noexcept {
    if (buffer.ptr != nullptr) (void)device->free_host(buffer.ptr, buffer.bytes);
    buffer = {};
  }
  /// Unmaps and releases the mapped granules of the tag's space that no
  /// live block uses.
  void release_free_of(const pool::Tag& tag);
  /// Unmaps and releases granules `ids`, used by the tag's live blocks
  /// (their contents copied, or not kept), adding them to bytes_asleep. The
  /// first refusal goes to `failed`; that granule stays mapped.
  void release_used(pool::Tag& tag, std::span<const GranuleId> ids, std::optional<Error>& failed);
  /// Maps fresh memory under `ids` (unmapped, used by the tag's live
  /// blocks), taken from the device in one request (one ledger reservation:
  /// never half a wake), and, when `copy`, copies their contents back from
  /// the host buffer, a chunk copied while the next is mapped. An error:
  /// none of ids is mapped. A copy's error goes to `copy_failed`; everything
  /// is mapped.
  Status map_back(pool::Tag& tag, const std::vector<GranuleId>& ids, bool copy, std::optional<Error>& copy_failed);
  /// Room under the limit for `count` more granules (others may have grown
  /// into what a sleeping tag gave up): free granules released if need be;
  /// out_of_memory when live blocks hold the rest.
  Status make_room(const pool::Tag& tag, std::size_t count);
  /// Maps `handles` at granules `ids` (unmapped, used); on failure none is
  /// mapped and every handle is released.
  Status map_woken(std::span<const GranuleId> ids, std::span<const PhysicalHandle> handles);
  std::vector<pool::CopyRun> copy_runs(const std::vector<GranuleId>& ids, const std::vector<GranuleId>& order) const {
    return pool::copy_runs(ids, order, granule, [this](GranuleId id) { return address_of(id); });
  }
};

Status ExpandablePool::State::add_space(std::size_t bytes, bool for_small, pool::TagId tag) {
  Expected<void*> va = device->reserve(bytes);
  if (!va) return std::move(va).error();
  const auto base = reinterpret_cast<std::uintptr_t>(*va);
  Status added = arena_for(for_small, tag).add_region(*va, bytes);
  if (!added) {
    (void)device->unreserve(*va, bytes);
    return added;
  }
  spaces.push_back({base, bytes, granules.grow(bytes / granule), for_small, tag});
  return {};
}

Status ExpandablePool::State::settle(GranuleId id) {
  const Stream tag = granules.freed_on(id);
  if (tag == kNoStream) return {};
  if (tag == pool::kManyStreams) {
    for (Stream stream : freeing_streams) {
      if (Status synced = device->synchronize(stream); !synced) return synced;
    }
  } else if (Status synced = device->synchronize(tag); !synced) {
    return synced;
  }
  granules.settled(id);
  return {};
}

Expected<PhysicalHandle> ExpandablePool::State::unmap_free(GranuleId id) {
  if (Status settled = settle(id); !settled) return std::move(settled).error();
  Status unmapped = device->unmap(address_of(id), granule);
  if (!unmapped) return std::move(unmapped).error();
  ++unmaps;
  return granules.take_free(id);
}

std::size_t ExpandablePool::State::release_free(std::size_t keep) {
  std::size_t released = 0;
  while (free_granule_bytes() > keep) {
    Expected<PhysicalHandle> handle = unmap_free(granules.oldest_free());
    if (!handle) break;  // the device refused: keep the rest cached
    release_handle(*handle);
    released += granule;
  }
  return released;
}

Status ExpandablePool::State::back(const Space& space, std::uintptr_t base, std::size_t bytes,
                                   std::size_t requested) {
  const GranuleId first = granule_of(space, base);
  const GranuleId last = granule_of(space, base + bytes - 1);
  // Granules already mapped (free or shared with a neighbour) are reused in
  // place; count the rest before changing anything.
  const std::size_t missing = granules.use_range(first, last);
  if (missing == 0) return {};
  // Stealing and growing are decided on every free granule: those of held
  // blocks too.
  complete_held();
  // Undoes the uses taken: granules mapped for this block stay mapped, free.
  auto undo = [&] { granules.unuse_range(first, last, kNoStream); };
  const std::size_t room = (bytes_limit - mapped_bytes()) / granule;
  if (missing > granules.free_count() + room) {
    undo();
    return out_of_memory(requested, bytes, missing);
  }

  // Handles for a run of unmapped granules, mapped together in one call.
  std::vector<PhysicalHandle> run;
  GranuleId run_first = first;
  auto map_run = [&]() -> Status {
    if (run.empty()) return {};
    Status mapped = device->map_many(address_of(run_first), granule, run);
    if (!mapped) return mapped;
    maps += static_cast<std::int64_t>(run.size());
    for (std::size_t i = 0; i < run.size(); ++i) granules.set_mapped(run_first + static_cast<GranuleId>(i), run[i]);
    run.clear();
    return {};
  };
  // Every failure: the run's handles are mapped nowhere, so they go back;
  // granules mapped for this block stay mapped, free.
  auto abandon = [&](Error error) -> Error {
    for (PhysicalHandle handle : run) release_handle(handle);
    run.clear();
    undo();
    return error;
  };

  bool stitched = false;
  for (GranuleId id = first; id <= last; ++id) {
    if (granules.is_mapped(id)) {
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      continue;
    }
    if (run.empty()) run_first = id;
    // A free granule from elsewhere (footprint stays flat) while more than
    // the slack is free or there is no room to grow; new physical memory
    // otherwise. The slack stops a cascade: each stolen granule leaves a hole
    // in some free range, and the next request landing there would steal again.
    const bool at_limit = mapped_bytes() + (run.size() + 1) * granule > bytes_limit;
    if (granules.free_count() > slack_granules() || (at_limit && granules.free_count() > 0)) {
      // A stolen granule is mapped here at once, alone: its unmap may split a
      // kernel mapping, and unmaps piling up before one map would pass the
      // mapping budget unchecked.
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      Expected<PhysicalHandle> stolen = unmap_free(granules.highest_free());
      if (!stolen) return abandon(std::move(stolen).error());
      run_first = id;
      run.push_back(*stolen);
      stitched = true;
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
    } else {
      Expected<PhysicalHandle> fresh = device->create(granule);
      if (!fresh) {
        if (fresh.error().code() != Errc::out_of_memory) return abandon(std::move(fresh).error());
        (void)abandon(std::move(fresh).error());
        return out_of_memory(requested, bytes, missing);  // reports the device once the run is back
      }
      run.push_back(*fresh);
      usage.reserved(granule);
    }
  }
  if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
  if (stitched) ++stitches;
  return {};
}

void ExpandablePool::State::unback(const Space& space, std::uintptr_t base, std::size_t bytes,
                                   Stream stream) noexcept {
  const GranuleId last = granule_of(space, base + bytes - 1);
  granules.unuse_range(granule_of(space, base), last, stream);
}

void ExpandablePool::State::free_large(const Held& block) noexcept {
  // The block is live in the arena (deallocate checked), so this cannot fail.
  (void)large.free(block.ptr, block.stream);
  const auto base = reinterpret_cast<std::uintptr_t>(block.ptr);
  unback(*space_of(base), base, block.bytes, block.stream);
}

void ExpandablePool::State::reap() {
  // Idle means no call through four checks a quarter of the idle time apart:
  // released between 1 and 1.25 idle times after the last call.
  constexpr int kChecks = 4;
  const auto step = std::max(options.idle_release / kChecks, std::chrono::milliseconds(1));
  std::unique_lock lock(mutex);
  std::uint64_t seen = calls;
  int quiet = 0;
  while (!stopping) {
    if (held.empty() && granules.free_count() == 0) {
      reaper_parked = true;  // nothing to release: wait for a free
      reaper_wake.wait(lock, [this] { return stopping || !reaper_parked; });
      seen = calls;
      quiet = 0;
      continue;
    }
    reaper_wake.wait_for(lock, step);
    if (calls != seen) {
      seen = calls;
      quiet = 0;
    } else if (++quiet == kChecks) {
      release_all();
      quiet = 0;
    }
  }
}

OomReport ExpandablePool::State::oom_report(std::size_t requested) {
  ++usage.num_ooms;
  OomReport report;
  report.requested_bytes = requested;
  report.bytes_in_use = static_cast<std::size_t>(usage.bytes_in_use);
  report.bytes_reserved = mapped_bytes();
  report.device_free_bytes = device->mem_info().free_bytes;
  report.largest_free_block_bytes = free_granule_bytes();
  return report;
}

Error ExpandablePool::State::out_of_memory(std::size_t requested, std::size_t rounded,
                                           std::size_t missing_granules) {
  OomReport report = oom_report(requested);
  const std::size_t room = bytes_limit - mapped_bytes();
  if (rounded > bytes_limit) {
    report.hint = "the request is larger than the pool's limit of " + format_bytes(bytes_limit);
    report.advice = OomAdvice::raise_limit;
  } else if (missing_granules * granule <= free_granule_bytes() + room) {
    report.hint = "the pool may map " + format_bytes(room) + " more but the device has only " +
                  format_bytes(report.device_free_bytes) +
                  " free: another process or allocator holds the rest of it";
  } else {
    report.hint = "the pool is at its limit of " + format_bytes(bytes_limit) + " with " +
                  format_bytes(report.bytes_in_use) + " in use and " + format_bytes(free_granule_bytes()) +
                  " in free granules (all of it usable by stitching)";
    report.advice = OomAdvice::free_or_raise_limit;
  }
  return Error::out_of_memory("expandable pool", std::move(report));
}

Expected<std::unique_ptr<ExpandablePool>> ExpandablePool::create(std::shared_ptr<Device> device,
                                                                 ExpandableOptions options) {
  if (!device) return Error(Errc::invalid_argument, "ExpandablePool::create: device is null");
  if (!device->supports_virtual_memory()) {
    return Error(Errc::unsupported, "ExpandablePool::create: " + device->description() +
                                        " has no virtual memory calls (reserve/create/map)");
  }
  const std::size_t granule = device->granularity();
  // The most it maps is the device's total: a LimitDevice under the pool sets a smaller one.
  const std::size_t limit = device->mem_info().total_bytes / granule * granule;
  if (limit == 0) {
    return Error(Errc::invalid_argument, "ExpandablePool::create: " + device->description() +
                                             " has less than one " + format_bytes(granule) + " granule");
  }
  if (limit / granule >= pool::kNoGranule / (kSmallSpaceShares + kLargeSpaceShares + 1)) {
    return Error(Errc::invalid_argument, "ExpandablePool::create: bytes_limit " + format_bytes(limit) +
                                             " is more granules than the pool can count");
  }
  if (options.idle_release.count() < 0) {
    return Error(Errc::invalid_argument, "ExpandablePool::create: idle_release " +
                                             std::to_string(options.idle_release.count()) + " ms is negative");
  }
  auto state = std::make_unique<State>(std::move(device), options, limit);
  if (Status s = state->add_space(kSmallSpaceShares * limit, true); !s) return std::move(s).error();
  if (Status s = state->add_space(kLargeSpaceShares * limit, false); !s) {
    (void)state->device->unreserve(reinterpret_cast<void*>(state->spaces[0].base), state->spaces[0].bytes);
    return std::move(s).error();
  }
  if (options.idle_release.count() > 0) {
    State* raw = state.get();
    state->reaper = std::thread([raw] { raw->reap(); });
  }
  return std::unique_ptr<ExpandablePool>(new ExpandablePool(std::move(state)));
}

ExpandablePool::ExpandablePool(std::unique_ptr<State> state) : state_(std::move(state)) {}

ExpandablePool::~ExpandablePool() {
  // As BFC: everything goes back, whatever is still in use. Unlike cudaFree,
  // cuMemUnmap does not wait for work queued on the memory (PyTorch's
  // expandable segments synchronize before unmapping for this reason), so
  // the streams blocks were freed on are waited for first.
  State& s = *state_;
  s.stop_reaper();
  for (Stream stream : s.freeing_streams) (void)s.device->synchronize(stream);
  for (std::size_t id = 1; id <= s.tags.size(); ++id) s.free_host(s.tags.at(static_cast<pool::TagId>(id)).host);
  for (GranuleId id = 0; id < s.granules.size(); ++id) {
    if (!s.granules.is_mapped(id)) continue;
    (void)s.device->unmap(s.address_of(id), s.granule);
    (void)s.device->release(s.granules.handle(id), s.granule);
  }
  for (const State::Space& space : s.spaces) {
    (void)s.device->unreserve(reinterpret_cast<void*>(space.base), space.bytes);
  }
}

std::string_view ExpandablePool::name() const { return "expandable"; }

Device& ExpandablePool::device() const { return *state_->device; }

Expected<void*> ExpandablePool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  ++s.calls;
  if (bytes > s.bytes_limit) return s.out_of_memory(bytes, bytes, bytes / s.granule + 1);
  const std::size_t rounded = round_up(bytes, pool::kChunkGranule);
  const bool small = rounded < s.options.small_threshold;
  const pool::TagId tag_id = pool::ThreadTags::current(this);
  pool::Tag* tag = nullptr;
  if (tag_id != pool::kUntagged) {
    Expected<pool::Tag*> awake = s.tag_to_allocate(tag_id, bytes);
    if (!awake) return std::move(awake).error();
    tag = *awake;
  }
  pool::BestFitArena& arena = s.arena_for(small, tag_id);
  if (!small && tag == nullptr && !s.held.empty()) {
    // Newest first. Chunk sizes are exact (the arena always splits), so a
    // held block of this size is what the arena would carve, already backed.
    for (std::size_t i = s.held.size(); i-- > 0;) {
      if (s.held[i].bytes == rounded && s.held[i].stream == stream) {
        void* ptr = s.held[i].ptr;
        s.held.erase(s.held.begin() + static_cast<std::ptrdiff_t>(i));
        s.usage.allocated(rounded);
        return ptr;
      }
    }
    s.complete_held();  // so the arena places this block knowing all free space
  }

  Expected<pool::MemoryRange> block = arena.allocate(rounded, stream, s.placement_cost);
  if (!block) return std::move(block).error();
  if (block->base == nullptr) {
    // This part of the address space is used up or split: reserve more.
    const std::size_t more = std::max(round_up(rounded, s.granule), s.bytes_limit);
    if (Status grown = s.add_space(more, small, tag_id); !grown) return std::move(grown).error();
    block = arena.allocate(rounded, stream, s.placement_cost);
    if (!block) return std::move(block).error();
    if (block->base == nullptr) {
      return Error(Errc::invalid_argument, "expandable pool: no " + format_bytes(rounded) +
                                               " range in fresh address space of " + format_bytes(more));
    }
  }
  const auto base = reinterpret_cast<std::uintptr_t>(block->base);
  const State::Space& space = *s.space_of(base);
  if (Status backed = s.back(space, base, block->bytes, bytes); !backed) {
    (void)arena.free(block->base, stream);
    return std::move(backed).error();
  }
  s.usage.allocated(block->bytes);
  if (tag != nullptr) {
    tag->bytes_in_use += block->bytes;
    tag->live.emplace(base, block->bytes);
    tag->note_stream(stream);
  }
  return block->base;
}

Status ExpandablePool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  ++s.calls;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const State::Space* space = s.space_of(address);
  if (space == nullptr) {
    return Error(Errc::invalid_pointer, "expandable pool: free of " + format_address(address) +
                                            ": not a pointer this pool handed out (it lies outside its "
                                            "address space)");
  }
  if (space->tag != pool::kUntagged) return s.free_tagged(*space, ptr, stream);
  if (!space->small && s.holds_back()) {
    const std::size_t bytes = s.large.live_size(ptr);
    if (bytes != 0 && !s.is_held(ptr)) {
      if (s.held.size() == kHeldBlocks) {
        s.free_large(s.held.front());
        s.held.erase(s.held.begin());
      }
      s.held.push_back({ptr, bytes, stream});
      s.note_free(stream);
      s.usage.freed(bytes);
      return {};
    }
    s.complete_held();  // a bad pointer or a second free: the arena below says which
  }
  Expected<std::size_t> freed = (space->small ? s.small : s.large).free(ptr, stream);
  if (!freed) return std::move(freed).error();
  s.note_free(stream);
  s.unback(*space, address, *freed, stream);
  s.usage.freed(*freed);
  if (s.free_granule_bytes() > s.options.release_threshold) s.release_free(s.options.release_threshold);
  return {};
}

std::size_t ExpandablePool::State::free_granules_with_held() const {
  std::size_t count = granules.free_count();
  std::vector<std::pair<GranuleId, std::uint32_t>> ends;  // end granule, held blocks ending in it
  const auto ends_in = [&ends](GranuleId id) {
    auto found = std::find_if(ends.begin(), ends.end(), [id](const auto& end) { return end.first == id; });
    if (found == ends.end()) {
      ends.emplace_back(id, 1);
    } else {
      ++found->second;
    }
  };
  for (const Held& block : held) {
    const auto base = reinterpret_cast<std::uintptr_t>(block.ptr);
    const Space& space = *space_of(base);
    const GranuleId first = granule_of(space, base);
    const GranuleId last = granule_of(space, base + block.bytes - 1);
    if (last - first >= 2) count += last - first - 1 - granules.unmapped_in(first + 1, last - 1);  // the block's alone
    ends_in(first);  // a block's ends count one use each (one in all when they are one granule)
    if (last != first) ends_in(last);
  }
  for (const auto& [id, freed] : ends) {
    if (granules.is_mapped(id) && granules.uses(id) == freed) ++count;
  }
  return count;
}

Stats ExpandablePool::stats() const {
  const State& s = *state_;
  std::lock_guard lock(s.mutex);
  Stats stats = s.usage.to_stats();
  const std::size_t free_granules = s.free_granules_with_held();
  stats.bytes_limit = static_cast<std::int64_t>(s.bytes_limit);
  stats.largest_free_block_bytes = static_cast<std::int64_t>(free_granules * s.granule);
  stats.bytes_mapped = static_cast<std::int64_t>(s.mapped_bytes());
  stats.granules_free = static_cast<std::int64_t>(free_granules);
  stats.num_maps = s.maps;
  stats.num_unmaps = s.unmaps;
  stats.num_stitches = s.stitches;
  stats.num_releases = s.usage.num_device_frees;
  for (std::size_t id = 1; id <= s.tags.size(); ++id) {
    stats.bytes_asleep += static_cast<std::int64_t>(s.tags.at(static_cast<pool::TagId>(id)).bytes_asleep);
  }
  return stats;
}

std::size_t ExpandablePool::trim() {
  std::lock_guard lock(state_->mutex);
  // Host copies kept by awake tags for their next sleep go too.
  for (std::size_t id = 1; id <= state_->tags.size(); ++id) {
    pool::Tag& tag = state_->tags.at(static_cast<pool::TagId>(id));
    if (tag.phase == pool::TagPhase::awake) state_->free_host(tag.host);
  }
  return state_->release_all();
}

std::string ExpandablePool::dump() const {
  const State& s = *state_;
  std::lock_guard lock(s.mutex);
  std::string out = "expandable pool on " + s.device->description() + ": limit " + format_bytes(s.bytes_limit) +
                    ", in use " + format_bytes(static_cast<std::size_t>(s.usage.bytes_in_use)) + ", mapped " +
                    format_bytes(s.mapped_bytes()) + " (" + std::to_string(s.granules.mapped()) + " granules of " +
                    format_bytes(s.granule) + ", " + std::to_string(s.granules.free_count()) +
                    " free), maps " + std::to_string(s.maps) + ", unmaps " + std::to_string(s.unmaps) +
                    ", stitches " + std::to_string(s.stitches) + ", releases " +
                    std::to_string(s.usage.num_device_frees) + "\n";
  for (const State::Space& space : s.spaces) {
    out += "  address space [" + format_address(space.base) + ", " + format_address(space.base + space.bytes) +
           ") for " +
           (space.small ? "small" : "large") + " blocks" +
           (space.tag == pool::kUntagged ? "" : " of tag '" + s.tags.at(space.tag).name + "'") + "\n";
  }
  out += "small blocks (below " + format_bytes(s.options.small_threshold) + "):\n" + s.small.dump();
  out += "large blocks:\n" + s.large.dump();
  if (!s.held.empty()) {
    out += "held back (freed, counted free; live above until the same request or another needs them): " +
           std::to_string(s.held.size()) + " block" + (s.held.size() == 1 ? "" : "s") + "\n";
    for (const State::Held& block : s.held) {
      out += "  " + format_address(block.ptr) + " " + format_bytes(block.bytes) + "\n";
    }
  }
  for (std::size_t id = 1; id <= s.tags.size(); ++id) {
    const pool::Tag& tag = s.tags.at(static_cast<pool::TagId>(id));
    out += "tag '" + tag.name + "' (" + pool::to_string(tag.phase) + ", in use " + format_bytes(tag.bytes_in_use) +
           ", asleep " + format_bytes(tag.bytes_asleep) + "):\n" + tag.small.dump() + tag.large.dump();
  }
  return out;
}

// --- tags, sleep and wake --------------------------------------------------
// A sleep copies (unless keep is nothing) and unmaps; a wake creates, maps
// and copies back. The copies and the ledger's wait run without the pool's
// lock: the tag's phase keeps allocations out of it and defers its frees, so
// none of its granules can be freed, stolen or mapped meanwhile.

Expected<pool::Tag*> ExpandablePool::State::tag_to_allocate(pool::TagId id, std::size_t bytes) {
  if (!tags.exists(id)) {
    return Error(Errc::invalid_argument, "expandable pool: allocate of " + format_bytes(bytes) +
                                             ": this thread's tag scope is of another pool (one destroyed)");
  }
  pool::Tag& tag = tags.at(id);
  if (tag.phase != pool::TagPhase::awake) {
    return Error(Errc::invalid_argument, "expandable pool: allocate of " + format_bytes(bytes) + " in tag " +
                                             pool::quoted_tag(tag.name) + ": the tag is " + pool::to_string(tag.phase) +
                                             "; wake it first");
  }
  return &tag;
}

Status ExpandablePool::State::free_tagged(const Space& space, void* ptr, Stream stream) {
  pool::Tag& tag = tags.at(space.tag);
  pool::BestFitArena& arena = arena_of(space);
  if (tag.changing()) {
    const std::size_t bytes = arena.live_size(ptr);
    if (bytes == 0 || tag.free_deferred(ptr)) {
      return Error(tag.free_deferred(ptr) ? Errc::double_free : Errc::invalid_pointer,
                   "expandable pool: free of " + format_address(ptr) + " in tag " + pool::quoted_tag(tag.name) +
                       ": not a live block of the tag (freed already, or not a block's start)");
    }
    tag.deferred_frees.emplace_back(ptr, stream);
    usage.freed(bytes);
    tag.bytes_in_use -= bytes;
    return {};
  }
  Expected<std::size_t> freed = arena.free(ptr, stream);
  if (!freed) return std::move(freed).error();
  note_free(stream);
  unback(space, reinterpret_cast<std::uintptr_t>(ptr), *freed, stream);  // asleep: unmapped granules stay so
  tag.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
  usage.freed(*freed);
  tag.bytes_in_use -= *freed;
  if (free_granule_bytes() > options.release_threshold) release_free(options.release_threshold);
  return {};
}

Expected<pool::Tag*> ExpandablePool::State::begin_change(const char* op, std::string_view name, pool::TagPhase from,
                                                         pool::TagPhase to) {
  std::lock_guard lock(mutex);
  const pool::TagId id = tags.find(name);
  if (id == pool::kUntagged) {
    return Error(Errc::invalid_argument, std::string("expandable pool: ") + op + "(" + pool::quoted_tag(name) +
                                             "): no tag of that name (tags: " + tags.names() + ")");
  }
  pool::Tag& tag = tags.at(id);
  if (tag.phase != from) {
    return Error(Errc::invalid_argument, std::string("expandable pool: ") + op + "(" + pool::quoted_tag(name) +
                                             "): the tag is " + pool::to_string(tag.phase));
  }
  tag.phase = to;
  return &tag;
}

void ExpandablePool::State::end_change(pool::Tag& tag, pool::TagPhase phase) {
  tag.phase = phase;
  for (const auto& [ptr, stream] : tag.deferred_frees) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    const Space& space = *space_of(address);
    Expected<std::size_t> freed = arena_of(space).free(ptr, stream);  // checked when deferred
    if (!freed) continue;
    note_free(stream);
    unback(space, address, *freed, stream);
    tag.live.erase(address);
  }
  tag.deferred_frees.clear();
}

std::vector<GranuleId> ExpandablePool::State::granules_under(const pool::Tag& tag) const {
  std::vector<GranuleId> ids;
  for (const auto& [base, bytes] : tag.live) {
    const Space& space = *space_of(base);
    const GranuleId last = granule_of(space, base + bytes - 1);
    GranuleId g = granule_of(space, base);
    if (!ids.empty() && ids.back() == g) ++g;  // shared with the block below
    for (; g <= last; ++g) ids.push_back(g);
  }
  // Ids follow the order spaces were reserved in, not their addresses.
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<GranuleId> ExpandablePool::State::mapped_granules(pool::TagId id) const {
  std::vector<GranuleId> ids;
  for (const Space& space : spaces) {
    if (space.tag != id) continue;
    const auto end = static_cast<GranuleId>(space.first + space.bytes / granule);
    for (GranuleId g = space.first; g < end; ++g) {
      if (granules.is_mapped(g)) ids.push_back(g);
    }
  }
  return ids;
}

Status ExpandablePool::State::prepare_host(pool::Tag& tag, SleepKeep keep) {
  for (Stream stream : tag.streams) {
    if (Status synced = device->synchronize(stream); !synced) return synced;
  }
  const std::size_t bytes = tag.sleeping.size() * granule;
  if (keep == SleepKeep::nothing || bytes == 0) {
    free_host(tag.host);
    return {};
  }
  if (tag.host.bytes < bytes) {
    free_host(tag.host);
    Expected<void*> host = device->allocate_host(bytes);
    if (!host) return std::move(host).error();
    tag.host = {*host, bytes};
  }
  return {};
}

void ExpandablePool::State::release_free_of(const pool::Tag& tag) {
  const std::vector<GranuleId> used = granules_under(tag);
  for (GranuleId id : mapped_granules(tag.id)) {
    if (std::binary_search(used.begin(), used.end(), id)) continue;
    Expected<PhysicalHandle> handle = unmap_free(id);
    if (handle) release_handle(*handle);
  }
}

void ExpandablePool::State::release_used(pool::Tag& tag, std::span<const GranuleId> ids, std::optional<Error>& failed) {
  for (GranuleId id : ids) {
    if (Status unmapped = device->unmap(address_of(id), granule); !unmapped) {
      if (!failed) failed = std::move(unmapped).error();
      continue;
    }
    ++unmaps;
    release_handle(granules.take_used(id));
    tag.bytes_asleep += granule;
  }
}

Status ExpandablePool::State::map_back(pool::Tag& tag, const std::vector<GranuleId>& ids, bool copy,
                                       std::optional<Error>& copy_failed) {
  if (ids.empty()) return {};
  Expected<std::vector<PhysicalHandle>> handles = device->create_many(granule, ids.size());
  {
    std::lock_guard lock(mutex);
    if (!handles) {
      if (handles.error().code() == Errc::out_of_memory) ++usage.num_ooms;
      return Error(handles.error().code(), "of " + format_bytes(ids.size() * granule) + ": " + handles.error().message());
    }
    for (std::size_t k = 0; k < handles->size(); ++k) usage.reserved(granule);
    if (Status room = make_room(tag, ids.size()); !room) {  // again: others may have allocated meanwhile
      for (PhysicalHandle handle : *handles) release_handle(handle);
      return room;
    }
  }
  const std::size_t chunk = chunk_granules();
  const std::size_t chunks = (ids.size() + chunk - 1) / chunk;
  const auto part = [&](std::size_t i) { return std::min(chunk, ids.size() - i * chunk); };
  const std::vector<std::vector<pool::CopyRun>> copies =
      copy ? pool::chunk_runs(copy_runs(ids, tag.sleeping), chunk, granule) : std::vector<std::vector<pool::CopyRun>>{};
  const auto* host = static_cast<const char*>(tag.host.ptr);
  pool::PipelineEnd end = pool::pipeline(
      chunks,
      [&](std::size_t i) -> Status {  // a helper thread maps chunk i
        std::lock_guard lock(mutex);
        Status mapped = map_woken(std::span(ids).subspan(i * chunk, part(i)),
                                  std::span<const PhysicalHandle>(*handles).subspan(i * chunk, part(i)));
        if (!mapped) return Error(mapped.error().code(), "of " + format_bytes(ids.size() * granule) + ": " + mapped.error().message());
        return {};
      },
      [&](std::size_t i) {  // while this thread copies chunk i back
        if (i >= copies.size() || copy_failed) return;
        for (const pool::CopyRun& run : copies[i]) {
          Status copied = device->copy_from_host(run.device, host + run.host_offset * granule, run.granules * granule);
          if (!copied) {
            copy_failed = std::move(copied).error();
            return;
          }
        }
      });
  if (end.status) return {};
  // What was mapped goes again, and what was not mapped is released (the
  // failed chunk's own handles went with it): the tag stays as it was.
  std::lock_guard lock(mutex);
  for (std::size_t k = 0; k < end.done * chunk; ++k) {
    (void)device->unmap(address_of(ids[k]), granule);
    ++unmaps;
    release_handle(granules.take_used(ids[k]));
  }
  for (std::size_t k = (end.done + 1) * chunk; k < ids.size(); ++k) release_handle((*handles)[k]);
  return end.status;
}

Status ExpandablePool::State::make_room(const pool::Tag& tag, std::size_t count) {
  const std::size_t wanted = count * granule;
  if (mapped_bytes() + wanted <= bytes_limit) return {};
  const std::size_t excess = mapped_bytes() + wanted - bytes_limit;
  complete_held();
  release_free(free_granule_bytes() > excess ? free_granule_bytes() - excess : 0);
  if (mapped_bytes() + wanted <= bytes_limit) return {};
  OomReport report = oom_report(wanted);
  report.hint = "the pool's limit is " + format_bytes(bytes_limit) + " and its other blocks took " +
                format_bytes(mapped_bytes()) + " while tag " + pool::quoted_tag(tag.name) +
                " slept, which stays asleep; sleep another tag";
  report.advice = OomAdvice::free_or_raise_limit;
  return Error::out_of_memory("expandable pool: wake(" + pool::quoted_tag(tag.name) + ")", std::move(report));
}

Status ExpandablePool::State::map_woken(std::span<const GranuleId> ids, std::span<const PhysicalHandle> handles) {
  for (std::size_t i = 0; i < ids.size();) {
    auto* first = static_cast<char*>(address_of(ids[i]));
    std::size_t count = 1;
    while (i + count < ids.size() && address_of(ids[i + count]) == first + count * granule) ++count;
    Status mapped = device->map_many(first, granule, handles.subspan(i, count));
    if (!mapped) {
      for (std::size_t j = 0; j < i; ++j) {
        (void)device->unmap(address_of(ids[j]), granule);
        (void)granules.take_used(ids[j]);
      }
      for (PhysicalHandle handle : handles) release_handle(handle);
      return mapped;
    }
    for (std::size_t j = i; j < i + count; ++j) granules.set_mapped(ids[j], handles[j]);
    maps += static_cast<std::int64_t>(count);
    i += count;
  }
  return {};
}

Status ExpandablePool::tag_begin(std::string_view name) {
  if (name.empty() || name.size() > kMaxTagNameBytes) {
    return Error(Errc::invalid_argument, "expandable pool: tag " + pool::quoted_tag(name) + " (" +
                                             std::to_string(name.size()) +
                                             " bytes): a tag's name is 1 to " + std::to_string(kMaxTagNameBytes) +
                                             " bytes");
  }
  State& s = *state_;
  pool::TagId id = pool::kUntagged;
  {
    std::lock_guard lock(s.mutex);
    id = s.tags.find(name);
    if (id == pool::kUntagged) id = s.tags.add(name, *s.device, arena_options());
  }
  pool::ThreadTags::push(this, id);
  return {};
}

Status ExpandablePool::tag_end() {
  if (pool::ThreadTags::pop(this)) return {};
  return Error(Errc::invalid_argument, "expandable pool: tag_end: no tag scope is open on this thread");
}

Status ExpandablePool::sleep(std::string_view name, SleepKeep keep) {
  State& s = *state_;
  Expected<pool::Tag*> found = s.begin_change("sleep", name, pool::TagPhase::awake, pool::TagPhase::falling_asleep);
  if (!found) return std::move(found).error();
  pool::Tag& tag = **found;
  const auto failure = [&](const Error& error, const std::string& outcome) {
    return Error(error.code(), "expandable pool: sleep(" + pool::quoted_tag(name) + "): " + error.message() + outcome);
  };
  std::vector<pool::CopyRun> runs;
  {
    std::lock_guard lock(s.mutex);
    tag.sleeping = s.granules_under(tag);  // all mapped: the tag was awake
    tag.kept = keep;
    if (keep == SleepKeep::contents) runs = s.copy_runs(tag.sleeping, tag.sleeping);
  }
  if (Status ready = s.prepare_host(tag, keep); !ready) {
    std::lock_guard lock(s.mutex);
    tag.sleeping.clear();
    s.end_change(tag, pool::TagPhase::awake);
    return failure(ready.error(), " (the tag stays awake)");
  }
  {
    std::lock_guard lock(s.mutex);
    tag.bytes_asleep = 0;
    s.release_free_of(tag);
  }
  // Chunk by chunk: a chunk is copied while the one before is unmapped.
  const std::vector<GranuleId>& ids = tag.sleeping;
  const std::size_t chunk = keep == SleepKeep::contents ? s.chunk_granules() : std::max<std::size_t>(1, ids.size());
  const std::vector<std::vector<pool::CopyRun>> copies = pool::chunk_runs(runs, chunk, s.granule);
  auto* host = static_cast<char*>(tag.host.ptr);
  std::optional<Error> refused;  // an unmap the device refused: that granule stays mapped
  pool::PipelineEnd end = pool::pipeline(
      (ids.size() + chunk - 1) / chunk,
      [&](std::size_t i) -> Status {  // a helper thread copies chunk i
        if (i >= copies.size()) return {};
        for (const pool::CopyRun& run : copies[i]) {
          Status copied = s.device->copy_to_host(host + run.host_offset * s.granule, run.device, run.granules * s.granule);
          if (!copied) return copied;
        }
        return {};
      },
      [&](std::size_t i) {  // while this thread unmaps chunk i
        std::lock_guard lock(s.mutex);
        s.release_used(tag, std::span(ids).subspan(i * chunk, std::min(chunk, ids.size() - i * chunk)), refused);
      });
  if (!end.status) {
    // A copy failed: what was unmapped is mapped back from the host copy.
    std::vector<GranuleId> released;
    {
      std::lock_guard lock(s.mutex);
      for (GranuleId id : ids) {
        if (!s.granules.is_mapped(id)) released.push_back(id);
      }
    }
    std::optional<Error> copy_failed;
    Status back = s.map_back(tag, released, true, copy_failed);
    std::lock_guard lock(s.mutex);
    if (back && !copy_failed) {
      tag.sleeping.clear();
      tag.bytes_asleep = 0;
      s.end_change(tag, pool::TagPhase::awake);
      return failure(end.status.error(), " (the tag stays awake)");
    }
    ++tag.sleeps;
    s.end_change(tag, pool::TagPhase::asleep);
    return failure(end.status.error(), "; mapping back what it had unmapped failed too (" +
                                           (back ? copy_failed->message() : back.error().message()) +
                                           "): the tag is asleep, wake it to retry");
  }
  std::lock_guard lock(s.mutex);
  ++tag.sleeps;
  s.end_change(tag, pool::TagPhase::asleep);
  if (refused) return *refused;
  return {};
}

Status ExpandablePool::wake(std::string_view name) {
  State& s = *state_;
  Expected<pool::Tag*> found = s.begin_change("wake", name, pool::TagPhase::asleep, pool::TagPhase::waking);
  if (!found) return std::move(found).error();
  pool::Tag& tag = **found;
  std::vector<GranuleId> needed;  // slept under live blocks, not freed since
  {
    std::lock_guard lock(s.mutex);
    for (GranuleId id : s.granules_under(tag)) {  // a subset of tag.sleeping: frees only since
      if (!s.granules.is_mapped(id)) needed.push_back(id);
    }
    if (Status room = s.make_room(tag, needed.size()); !room) {
      s.end_change(tag, pool::TagPhase::asleep);
      return room;
    }
  }
  std::optional<Error> copy_failed;
  Status mapped = s.map_back(tag, needed, tag.kept == SleepKeep::contents, copy_failed);
  std::lock_guard lock(s.mutex);
  if (!mapped) {
    s.end_change(tag, pool::TagPhase::asleep);
    if (mapped.error().code() == Errc::out_of_memory && mapped.error().oom() != nullptr) return mapped;
    return Error(mapped.error().code(), "expandable pool: wake(" + pool::quoted_tag(name) + ") " +
                                            mapped.error().message() + " (the tag stays asleep)");
  }
  tag.sleeping.clear();
  tag.bytes_asleep = 0;
  ++tag.wakes;
  s.end_change(tag, pool::TagPhase::awake);
  if (copy_failed) return *copy_failed;
  return {};
}

std::vector<TagStats> ExpandablePool::tag_stats() const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  std::vector<TagStats> out;
  for (std::size_t id = 1; id <= s.tags.size(); ++id) {
    const pool::Tag& tag = s.tags.at(static_cast<pool::TagId>(id));
    const bool asleep = tag.phase == pool::TagPhase::asleep || tag.phase == pool::TagPhase::waking;
    // The host buffer is the changing thread's while the phase changes.
    const std::size_t host_bytes = tag.changing() ? 0 : tag.host.bytes;
    out.push_back({tag.name, asleep, tag.bytes_in_use, tag.bytes_asleep, host_bytes, tag.sleeps, tag.wakes});
  }
  return out;
}

}  // namespace tidepool
