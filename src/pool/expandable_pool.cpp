// ExpandablePool: creation, placement and backing, stealing and release,
// stats (expandable_state.hpp says how the pool is built; expandable_sleep.cpp
// has tags, sleep and wake).
#include "tidepool/expandable_pool.hpp"

#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "pool/expandable_state.hpp"

namespace tidepool {

using namespace expandable;

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
      if (Status waited = wait_for(*device, stream); !waited) return waited;
    }
  } else if (Status waited = wait_for(*device, tag); !waited) {
    return waited;
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

Expected<PhysicalHandle> ExpandablePool::State::steal_free(GranuleId id) {
  if (!keeps_aliases()) return unmap_free(id);
  if (Status settled = settle(id); !settled) return std::move(settled).error();
  const PhysicalHandle handle = granules.take_free(id);
  aliases[handle].elsewhere.push_back(id);  // its home is set where back() maps it
  alias_at.emplace(id, handle);
  return handle;
}

bool ExpandablePool::State::move_home(GranuleId id) {
  const auto found = alias_at.find(id);
  if (found == alias_at.end()) return false;
  const PhysicalHandle handle = found->second;
  Aliased& aliased = aliases.at(handle);
  const GranuleId home = aliased.home;
  if (!granules.is_free(home) || !settle(home)) {  // in use there (or its stream failed): not here
    drop_alias(id);
    return false;
  }
  (void)granules.take_free(home);
  granules.set_mapped(id, handle);
  std::replace(aliased.elsewhere.begin(), aliased.elsewhere.end(), id, home);
  alias_at.erase(found);
  alias_at.emplace(home, handle);
  aliased.home = id;
  ++alias_moves;
  return true;
}

void ExpandablePool::State::drop_alias(GranuleId id) noexcept {
  const auto found = alias_at.find(id);
  if (found == alias_at.end()) return;
  const PhysicalHandle handle = found->second;
  alias_at.erase(found);
  unmap_untracked(id);
  Aliased& aliased = aliases.at(handle);
  std::erase(aliased.elsewhere, id);
  if (aliased.elsewhere.empty()) aliases.erase(handle);
}

void ExpandablePool::State::drop_aliases_of(PhysicalHandle handle) noexcept {
  const auto found = aliases.find(handle);
  if (found == aliases.end()) return;
  for (const GranuleId id : found->second.elsewhere) {
    unmap_untracked(id);
    alias_at.erase(id);
  }
  aliases.erase(found);
}

void ExpandablePool::State::drop_aliases() noexcept {
  for (const auto& [id, handle] : alias_at) unmap_untracked(id);
  alias_at.clear();
  aliases.clear();
}

void ExpandablePool::State::apply_journal() noexcept {
  for (std::size_t i = 0; i < noted; ++i) {
    const Noted& block = journal[i];
    const auto [first, last] = granules_of(*space_of(block.base), block.base, block.bytes);
    if (block.use) {
      (void)granules.use_range(first, last);  // mapped when noted, and nothing is unmapped before this
    } else {
      granules.unuse_range(first, last, block.stream);
    }
  }
  noted = 0;
}

void ExpandablePool::State::sync_granules(const void* except) noexcept {
  if (exact) return;
  if (!stale) {
    apply_journal();
    return;
  }
  granules.forget();
  for (const Space& space : spaces) {
    arena_of(space).for_each_chunk(space.base, [&](std::uintptr_t address, std::size_t bytes, bool in_use,
                                                    Stream waits_on) {
      if (address == reinterpret_cast<std::uintptr_t>(except)) return;
      const GranuleSpan span = granules_of(space, address, bytes);
      if (in_use) {
        (void)granules.use_range(span.first, span.last);  // mapped: blocks that needed memory were backed
      } else if (waits_on != kNoStream) {
        granules.tag_range(span.first, span.last, waits_on);
      }
    });
  }
  granules.queue_free();
  ++rebuilds;
  stale = false;
  quiet_allocations = 0;
}

std::size_t ExpandablePool::State::release_free(std::size_t keep) {
  std::size_t released = headroom.size() * granule;
  drop_headroom();
  while (free_granule_bytes() > keep) {
    Expected<PhysicalHandle> handle = unmap_free(granules.oldest_free());
    if (!handle) break;  // the device refused: keep the rest cached
    release_handle(*handle);
    released += granule;
  }
  return released;
}

Status ExpandablePool::State::back(const Space& space, std::uintptr_t base, std::size_t bytes,
                                   std::size_t requested, bool for_slab) {
  const GranuleSpan span = granules_of(space, base, bytes);
  const GranuleId first = span.first, last = span.last;  // captured below: not a structured binding (clang 14)
  sync_granules(reinterpret_cast<const void*>(base));  // the table current but for this block
  // Granules already mapped (free or shared with a neighbour) are reused in
  // place; count the rest before changing anything.
  const std::size_t missing = granules.use_range(first, last);
  if (missing == 0) {
    note_quiet();
    return {};
  }
  quiet_allocations = 0;
  // (The journal is empty since the sync above, so the few frees noted
  // below, of held blocks and a slab, stay in it to be applied.)
  // Stealing and growing are decided on every free granule: those of held
  // blocks too.
  complete_held();
  apply_journal();
  // Undoes the uses taken: granules mapped for this block stay mapped, free.
  auto undo = [&] { granules.unuse_range(first, last, kNoStream); };
  if (!headroom.empty() && mapped_bytes() + missing * granule > bytes_limit) drop_headroom();
  const std::size_t room = (bytes_limit - mapped_bytes()) / granule;
  // A step plan that lost its place (the program changed) or whose slab
  // leaves the pool short is retired, its slab freed (now if nothing lives
  // in it, else once its last block goes): the program's new steps get its
  // memory rather than new memory.
  if (slab != nullptr && !for_slab &&
      (plan.phase() == pool::StepPlan::Phase::lost || missing > granules.free_count() + room)) {
    retire_plan();
    apply_journal();
  }
  if (missing > granules.free_count() + room) {
    undo();
    if (for_slab) return Error(Errc::out_of_memory, "expandable pool: no room for the step plan's slab");
    return out_of_memory(requested, bytes, missing);
  }

  // Handles for a run of unmapped granules, mapped together in one call.
  std::vector<PhysicalHandle> run;
  GranuleId run_first = first;
  auto map_run = [&]() -> Status {
    if (run.empty()) return {};
    Status mapped = device->map_many(address_of(run_first), granule, run);
    if (!mapped && mapped.error().code() == Errc::limit_reached && !alias_at.empty()) {
      drop_aliases();  // kernel mappings for what must be mapped
      mapped = device->map_many(address_of(run_first), granule, run);
    }
    if (!mapped) return mapped;
    maps += static_cast<std::int64_t>(run.size());
    for (std::size_t i = 0; i < run.size(); ++i) {
      const GranuleId id = run_first + static_cast<GranuleId>(i);
      granules.set_mapped(id, run[i]);
      if (!aliases.empty()) {
        if (const auto aliased = aliases.find(run[i]); aliased != aliases.end()) aliased->second.home = id;
      }
    }
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

  bool stitched = false, created = false, took = false;
  for (GranuleId id = first; id <= last; ++id) {
    if (granules.is_mapped(id)) {
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      continue;
    }
    if (!alias_at.empty() && alias_at.contains(id)) {
      // Mapped here already, as an alias: moved home with no call when its
      // memory is free where it is, else unmapped to be backed anew.
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      if (move_home(id)) {
        stitched = true;
        continue;
      }
    }
    if (run.empty()) run_first = id;
    // A free granule from elsewhere (footprint stays flat) while more than
    // the slack is free and the pool has moved fewer granules than it has
    // created, or when there is no room to grow; new physical memory
    // otherwise. The slack stops a cascade: each stolen granule leaves a hole
    // in some free range, and the next request landing there would steal
    // again. A warm pool's slack is larger: a step of a repeating program
    // that needs a granule where the last step left none would steal it back
    // from wherever a later step needs it, every step, so it creates it
    // once; only memory left free in bulk (a new phase of the program) is
    // stitched. The move budget bounds what churn costs: a trace that would
    // steal again and again (random sizes) grows instead once its moves have
    // caught up with its creates; below the limit, the pool makes at most
    // three device calls (create, unmap, map) per granule it ever created.
    const bool at_limit = mapped_bytes() + (run.size() + 1) * granule > bytes_limit;
    const bool may_move = moved < usage.num_device_allocs - headroom_made;
    if ((may_move && granules.free_count() > slack_granules()) ||
        ((at_limit || for_slab) && granules.free_count() > 0)) {
      // A stolen granule is mapped here at once, alone: its unmap may split a
      // kernel mapping, and unmaps piling up before one map would pass the
      // mapping budget unchecked.
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      Expected<PhysicalHandle> stolen = steal_free(granules.highest_free());
      if (!stolen) return abandon(std::move(stolen).error());
      if (!for_slab) ++moved;  // the move budget bounds churn; a slab moves once
      stitched = true;
      if (take_headroom(id)) {
        // Headroom maps memory here already: the stolen granule's memory
        // goes back rather than move (the same two calls, the same table).
        release_handle(*stolen);
        continue;
      }
      run_first = id;
      run.push_back(*stolen);
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
    } else if (take_headroom(id)) {
      if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
      took = true;
      --headroom_made;  // what the pool would have created now
      headroom_calls -= 2;  // the create and the map it would have made
    } else {
      Expected<PhysicalHandle> fresh = device->create(granule);
      if (!fresh) {
        if (fresh.error().code() != Errc::out_of_memory) return abandon(std::move(fresh).error());
        (void)abandon(std::move(fresh).error());
        if (for_slab) return Error(Errc::out_of_memory, "expandable pool: no room for the step plan's slab");
        return out_of_memory(requested, bytes, missing);  // reports the device once the run is back
      }
      run.push_back(*fresh);
      usage.reserved(granule);
      created = true;
    }
  }
  if (Status mapped = map_run(); !mapped) return abandon(std::move(mapped).error());
  if (stitched) ++stitches;
  if (!for_slab && (created || (took && !warm))) add_headroom(space, last, !created);
  return {};
}

void ExpandablePool::State::add_headroom(const Space& space, GranuleId last, bool past_kept) noexcept {
  if (space.tag != pool::kUntagged || options.release_threshold != ExpandableOptions::kKeepAll || options.aliases) {
    return;
  }
  const GranuleId first = last + 1, end = space.first + static_cast<GranuleId>(space.bytes / granule);
  // Only past the top of the space's mapped memory, where a pass that
  // outgrows the last one's peak goes; in each space, 1/512 of the pool's
  // mapped granules (the small blocks' space maps few, and drifts as far:
  // 1/512 of its own served small-tensors' draws less well).
  if (first >= end || granules.mapped_run(first, end - 1, 1) != pool::kNoGranule) return;
  const std::size_t want = granules.mapped() / expandable::kHeadroomShare;
  const auto below = std::lower_bound(headroom.begin(), headroom.end(), Kept{space.first, 0});
  const auto in_space = static_cast<std::size_t>(std::lower_bound(below, headroom.end(), Kept{end, 0}) - below);
  if (in_space >= want) return;
  std::vector<PhysicalHandle> run;
  try {  // every allocation before the first device call: none after it can fail
    run.reserve(want - in_space);
    headroom.reserve(headroom.size() + want - in_space);
  } catch (const std::bad_alloc&) {
    return;  // headroom is an optimization
  }
  // Up to the headroom already kept above (stranded there when the top came
  // down); after a take, past what the block left of it right above.
  auto at = std::lower_bound(headroom.begin(), headroom.end(), Kept{first, 0});
  GranuleId start = first;
  while (past_kept && at != headroom.end() && at->id == start) {
    ++start;
    ++at;
  }
  const GranuleId stop = at != headroom.end() ? std::min(end, at->id) : end;
  for (GranuleId id = start; in_space + run.size() < want && id < stop; ++id) {
    if (mapped_bytes() + (run.size() + 1) * granule > bytes_limit) break;
    Expected<PhysicalHandle> fresh = device->create(granule);
    if (!fresh) break;  // the device or the ledger is short: no headroom, nothing fails
    run.push_back(*fresh);
    usage.reserved(granule);
  }
  if (run.empty()) return;
  headroom_made += static_cast<std::int64_t>(run.size());
  headroom_calls += 2 * static_cast<std::int64_t>(run.size());  // the creates, and the maps or releases
  if (!device->map_many(address_of(start), granule, run)) {
    for (PhysicalHandle handle : run) release_handle(handle);
    return;
  }
  maps += static_cast<std::int64_t>(run.size());
  for (std::size_t i = 0; i < run.size(); ++i) at = headroom.insert(at, Kept{start + static_cast<GranuleId>(i), run[i]}) + 1;
}

bool ExpandablePool::State::take_headroom(GranuleId id) noexcept {
  if (headroom.empty()) return false;
  const auto kept = std::lower_bound(headroom.begin(), headroom.end(), Kept{id, 0});
  if (kept == headroom.end() || kept->id != id) return false;
  granules.set_mapped(id, kept->handle);
  headroom.erase(kept);
  return true;
}

void ExpandablePool::State::drop_headroom() noexcept {
  headroom_calls += 2 * static_cast<std::int64_t>(headroom.size());
  for (const Kept& kept : headroom) {
    unmap_untracked(kept.id);
    release_handle(kept.handle);
  }
  headroom.clear();
}

void ExpandablePool::State::unback(const Space& space, std::uintptr_t base, std::size_t bytes,
                                   Stream stream) noexcept {
  if (!exact) return note(base, bytes, stream, false);  // the table learns of it when it needs to
  const auto [first, last] = granules_of(space, base, bytes);
  granules.unuse_range(first, last, stream);
}

void ExpandablePool::State::free_large(const Held& block) noexcept {
  // The block is live in the arena (deallocate checked), so this cannot fail.
  (void)large.free(block.ptr, block.stream);
  const auto base = reinterpret_cast<std::uintptr_t>(block.ptr);
  unback(*space_of(base), base, block.bytes, block.stream);
}

void ExpandablePool::State::note_stream(Stream stream) {
  if (freed_on.at(stream) == 0) {
    freeing_streams.push_back(stream);
    freed_on.set(stream, 1);
  }
  last_freed_on = stream;
}

void ExpandablePool::State::wake_reaper() {
  reaper_parked = false;
  reaper_wake.notify_one();
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
    if (table_current() && held.empty() && granules.free_count() == 0 && headroom.empty() && slab == nullptr) {
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
  sync_granules();
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
  // In a forked child the memory, the lock and the reaper's thread are the
  // parent's: the child joins no thread it does not have and releases nothing.
  if (state_->maker.forked()) {
    (void)state_.release();  // a leak in the child only
    return;
  }
  // As BFC: everything goes back, whatever is still in use. Unlike cudaFree,
  // cuMemUnmap does not wait for work queued on the memory (PyTorch's
  // expandable segments synchronize before unmapping for this reason), so
  // the streams blocks were freed on are waited for first.
  State& s = *state_;
  s.stop_reaper();
  for (Stream stream : s.freeing_streams) (void)wait_for(*s.device, stream);
  for (std::size_t id = 1; id <= s.tags.size(); ++id) s.free_host(s.tags.at(static_cast<pool::TagId>(id)).host);
  s.drop_aliases();
  s.drop_headroom();
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

void* ExpandablePool::State::take_planned(std::size_t rounded, Stream stream) {
  if (plan.phase() == pool::StepPlan::Phase::learning) return nullptr;
  if (!may_be_lazy()) {  // a tag exists, or frees release memory: no plan
    retire_plan();
    return nullptr;
  }
  if (plan.wants_slab(rounded, stream) && !open_slab(stream)) {
    plan.drop();
    return nullptr;
  }
  for (Stream other : plan.pending_streams()) {
    if (Status waited = wait_for(*device, other); !waited) {
      retire_plan();  // the slab cannot be reused safely
      return nullptr;
    }
  }
  plan.pending_streams().clear();
  const std::optional<std::uint64_t> offset = plan.take(rounded, stream);
  if (plan.retired() && plan.empty()) close_slab();
  return offset ? static_cast<char*>(slab) + *offset : nullptr;
}

bool ExpandablePool::State::open_slab(Stream stream) {
  complete_held();  // so that the slab is placed knowing all free space
  const std::size_t bytes = round_up(static_cast<std::size_t>(plan.slab_bytes()), granule);
  // The step's small blocks, and its large ones that outlive a step, need
  // memory beside the slab: what the small arenas map now, and those blocks'
  // bytes. A slab that leaves less is not opened (the pool goes on as it did).
  std::size_t beside = round_up(static_cast<std::size_t>(plan.unplanned_bytes()), granule);
  for (const Space& space : spaces) {
    if (!space.small) continue;
    const auto count = static_cast<GranuleId>(space.bytes / granule);
    beside += (count - granules.unmapped_in(space.first, space.first + count - 1)) * granule;
  }
  if (bytes == 0 || bytes > bytes_limit || beside > bytes_limit - bytes) return false;
  Expected<pool::PlacedBlock> block = large.allocate(bytes, stream, placement_cost);
  if (block && block->base == nullptr) block = place_in_more_space(large, bytes, stream, false, pool::kUntagged);
  if (!block) return false;
  const auto base = reinterpret_cast<std::uintptr_t>(block->base);
  if (Status backed = back(*space_of(base), base, block->bytes, bytes, true); !backed) {
    (void)large.free(block->base, stream);
    return false;
  }
  slab = block->base;
  slab_bytes = block->bytes;
  slab_stream = stream;
  plan.opened();
  return true;
}

void ExpandablePool::State::close_slab() noexcept {
  if (slab == nullptr) return;
  // Blocks freed on other streams are waited for: the slab's granules are
  // then free on its own stream only.
  for (Stream other : plan.pending_streams()) (void)wait_for(*device, other);
  (void)large.free(slab, slab_stream);
  const auto base = reinterpret_cast<std::uintptr_t>(slab);
  unback(*space_of(base), base, slab_bytes, slab_stream);
  slab = nullptr;
  slab_bytes = 0;
  plan.drop();
}

Expected<pool::PlacedBlock> ExpandablePool::State::place_in_more_space(pool::BestFitArena& arena, std::size_t rounded,
                                                                       Stream stream, bool for_small,
                                                                       pool::TagId tag) {
  // The arena's address space is used up or split: reserve more.
  const std::size_t more = std::max(round_up(rounded, granule), bytes_limit);
  if (Status grown = add_space(more, for_small, tag); !grown) return std::move(grown).error();
  Expected<pool::PlacedBlock> block = arena.allocate(rounded, stream, placement_cost);
  if (block && block->base == nullptr) {
    return Error(Errc::invalid_argument, "expandable pool: no " + format_bytes(rounded) +
                                             " range in fresh address space of " + format_bytes(more));
  }
  return block;
}

Expected<void*> ExpandablePool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
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
  const bool large_untagged = !small && tag == nullptr;
  if (large_untagged) {
    if (void* planned = s.take_planned(rounded, stream)) {
      s.usage.allocated(rounded);
      return planned;
    }
  }
  // A large untagged block the arena serves: logged while the plan learns.
  auto record = [&](void* ptr) __attribute__((always_inline)) {
    if (large_untagged && s.may_be_lazy()) s.plan.record_alloc(ptr, rounded, stream, s.plan_calls());
    return ptr;
  };
  if (large_untagged && !s.held.empty()) {
    // Newest first. Chunk sizes are exact (the arena always splits), so a
    // held block of this size is what the arena would carve, already backed.
    for (std::size_t i = s.held.size(); i-- > 0;) {
      if (s.held[i].bytes == rounded && s.held[i].stream == stream) {
        void* ptr = s.held[i].ptr;
        s.held.erase(s.held.begin() + static_cast<std::ptrdiff_t>(i));
        s.hold_back.asked(true);
        s.usage.allocated(rounded);
        return record(ptr);
      }
    }
    s.complete_held();  // so the arena places this block knowing all free space
  }
  if (large_untagged && s.holds_back()) {
    if (s.hold_back.sampling()) s.hold_back.sample(rounded, stream);
    s.hold_back.asked(false);
  }

  auto place = [&]() __attribute__((always_inline)) -> Expected<pool::PlacedBlock> {
    Expected<pool::PlacedBlock> placed = arena.allocate(rounded, stream, s.placement_cost);
    if (placed && placed->base == nullptr) placed = s.place_in_more_space(arena, rounded, stream, small, tag_id);
    return placed;  // one named result: built in place, never copied
  };
  Expected<pool::PlacedBlock> block = place();
  if (!block) return std::move(block).error();
  if (!s.exact) {
    // Already mapped: noted for the granule table. (A placement on aliases
    // costs nothing too, but moves their memory home first: back().)
    if (block->costs_nothing && (s.alias_at.empty() || s.all_mapped(reinterpret_cast<std::uintptr_t>(block->base),
                                                                     block->bytes))) {
      s.note(reinterpret_cast<std::uintptr_t>(block->base), block->bytes, stream, true);
      s.note_quiet();
      s.usage.allocated(block->bytes);
      return record(block->base);
    }
  }
  auto base = reinterpret_cast<std::uintptr_t>(block->base);
  if (large_untagged && s.slab != nullptr && s.plan.phase() == pool::StepPlan::Phase::lost && s.plan.empty()) {
    // The program left its plan and this block needs memory: the plan is
    // retired, and the block placed again knowing the slab's space free.
    const auto [first, last] = s.granules_of(*s.space_of(base), base, block->bytes);
    if (s.granules.unmapped_in(first, last) > 0) {
      (void)arena.free(block->base, stream);
      s.retire_plan();
      block = place();
      if (!block) return std::move(block).error();
      base = reinterpret_cast<std::uintptr_t>(block->base);
    }
  }
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
  return record(block->base);
}

Status ExpandablePool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  if (s.maker.forked()) return {};  // the block is the parent's: the child leaves it alone
  std::lock_guard lock(s.mutex);
  ++s.calls;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const State::Space* space = s.space_of(address);
  if (space == nullptr) {
    return Error(Errc::invalid_pointer, "expandable pool: free of " + format_address(address) +
                                            ": not a pointer this pool handed out (it lies outside its "
                                            "address space)");
  }
  s.granules.add_stream(stream);  // the table's last allocation on this path: none once it notes the free
  if (space->tag != pool::kUntagged) return s.free_tagged(*space, ptr, stream);
  if (s.in_slab(address)) {
    Expected<std::size_t> freed = s.plan.give_back(address - reinterpret_cast<std::uintptr_t>(s.slab), stream, address);
    if (!freed) return std::move(freed).error();
    s.note_free(stream);
    s.usage.freed(*freed);
    if (s.plan.retired() && s.plan.empty()) s.close_slab();
    return {};
  }
  if (!space->small) s.plan.record_free(ptr, stream);
  if (!space->small && s.holds_back()) {
    const bool hold = s.hold_back.hold_next();
    if (s.hold_back.tearing_down()) s.plan.torn_down();
    if (hold) {
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
    }
    // A bad pointer or a second free (the arena below says which), or
    // holding back has stopped: nothing stays held.
    if (!s.held.empty()) s.complete_held();
  }
  Expected<std::size_t> freed = (space->small ? s.small : s.large).free(ptr, stream);
  if (!freed) return std::move(freed).error();
  s.note_free(stream);
  s.usage.freed(*freed);
  if (!space->small && s.hold_back.sampling()) s.hold_back.freed(*freed, stream);
  s.unback(*space, address, *freed, stream);
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
    const auto [first, last] = granules_of(space, base, block.bytes);
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
  State& s = *state_;
  if (s.maker.forked()) return {};  // a forked child holds none of it
  std::lock_guard lock(s.mutex);
  s.sync_granules();
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
  if (state_->maker.forked()) return 0;
  std::lock_guard lock(state_->mutex);
  // Host copies kept by awake tags for their next sleep go too.
  for (std::size_t id = 1; id <= state_->tags.size(); ++id) {
    pool::Tag& tag = state_->tags.at(static_cast<pool::TagId>(id));
    if (tag.phase == pool::TagPhase::awake) state_->free_host(tag.host);
  }
  return state_->release_all();
}

std::string ExpandablePool::dump() const {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child().message() + "\n";
  std::lock_guard lock(s.mutex);
  s.sync_granules();
  std::string out = "expandable pool on " + s.device->description() + ": limit " + format_bytes(s.bytes_limit) +
                    ", in use " + format_bytes(static_cast<std::size_t>(s.usage.bytes_in_use)) + ", mapped " +
                    format_bytes(s.mapped_bytes()) + " (" + std::to_string(s.granules.mapped()) + " granules of " +
                    format_bytes(s.granule) + ", " + std::to_string(s.granules.free_count()) +
                    " free, and " + std::to_string(s.headroom.size()) + " of headroom), maps " +
                    std::to_string(s.maps) + ", unmaps " + std::to_string(s.unmaps) +
                    ", stitches " + std::to_string(s.stitches) + ", releases " +
                    std::to_string(s.usage.num_device_frees) + "; granule table rebuilt from the arenas " +
                    std::to_string(s.rebuilds) + " times (lazy mode); " +
                    (s.warm ? "warm" : "growing") + ": steals while more than 1/" +
                    std::to_string(s.warm ? kWarmSlackShare : kSlackShare) + " of the mapped granules are free; " +
                    std::to_string(s.alias_at.size()) + " granules mapped also where they were stolen from (aliases), " +
                    std::to_string(s.alias_moves) + " moved back there with no device call\n";
  for (const State::Space& space : s.spaces) {
    out += "  address space [" + format_address(space.base) + ", " + format_address(space.base + space.bytes) +
           ") for " +
           (space.small ? "small" : "large") + " blocks" +
           (space.tag == pool::kUntagged ? "" : " of tag '" + s.tags.at(space.tag).name + "'") + "\n";
  }
  out += s.plan.describe() + "\n";
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

}  // namespace tidepool
