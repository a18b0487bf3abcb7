// ExpandablePool::State, its constants and helpers: what expandable_pool.cpp
// (placement, backing, stealing, release) and expandable_sleep.cpp (tags,
// sleep, wake) both work on. Internal; the pool's public face is
// tidepool/expandable_pool.hpp.
//
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
// other request (or trim, a release) first completes their frees; stats and
// dump count them free without completing them.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/process.hpp"
#include "pool/best_fit_arena.hpp"
#include "pool/granule_table.hpp"
#include "pool/sleep_tags.hpp"
#include "pool/step_plan.hpp"
#include "pool/usage_counters.hpp"
#include "tidepool/expandable_pool.hpp"

namespace tidepool {

namespace expandable {

using pool::GranuleId;
using pool::kNoStream;

// Address space reserved per byte of the pool's limit: one share for small
// blocks, three for large ones. More is reserved only if a part runs out.
inline constexpr std::size_t kSmallSpaceShares = 1;
inline constexpr std::size_t kLargeSpaceShares = 3;
// Free granules up to 1/64 of the mapped ones are kept rather than stolen
// (see back()): peak reserved stays within ~1.6% of what the blocks span,
// unless the pool has moved as many granules as it created (back() again).
// A warm pool keeps up to 1/8: what a repeating program's steps drift onto
// is created once rather than stolen back every step, and memory left free
// in bulk (a new phase with other sizes) is still stitched.
inline constexpr std::size_t kSlackShare = 64;
inline constexpr std::size_t kWarmSlackShare = 8;
// Headroom (ExpandablePool::State::headroom): granules mapped past the top of
// each space, up to 1/512 of the pool's mapped granules there (0.2%; two
// spaces, 0.4% at most), for the next pass's drift.
inline constexpr std::size_t kHeadroomShare = 512;
// Large blocks whose free is held back (see above). Enough for the large
// blocks of a layer or two freed and asked for again in the same order.
inline constexpr std::size_t kHeldBlocks = 16;

/// Whether large frees are held back now. A hit (the same size asked for
/// again on the same stream) saves a whole free and allocation; a miss costs
/// a lookup and a list entry, about a tenth of that, and blocks held back
/// change where other blocks go. So the pool holds back while at least 1/8
/// of the blocks it holds are asked for again, judged every kWindow large
/// frees. Once it stops, it samples a window every kRetry large frees: it
/// notes the sizes freed, without holding them, and holds again if enough
/// of them were asked for again (a sample changes no placement).
///
/// Where a block goes must depend on what the program did, never on the
/// pool's own state, or a program repeating itself is placed elsewhere than
/// the last time and maps what it did not need then. So blocks are held
/// back alike whether the granule table is exact or lazy, and more than
/// kHeldBlocks large frees in a row with no large request between them are
/// a teardown (the end of a step or a phase, a model freed): the blocks
/// held are freed in full, nothing more is held until the next request, and
/// those frees count in no window. A teardown neither leaves blocks held
/// for the next phase nor turns holding off.
class HoldBack {
 public:
  static constexpr std::uint32_t kWindow = 256;
  static constexpr std::uint32_t kRetry = 16 * kWindow;
  /// A large block is freed: whether to hold it back.
  bool hold_next() noexcept {
    if (++frees_in_row_ > kHeldBlocks) return false;
    if (++frees_ == (mode_ == Mode::skip ? kRetry : kWindow)) next_window();
    return mode_ == Mode::hold;
  }
  /// More large frees in a row than blocks are held: a teardown.
  bool tearing_down() const noexcept { return frees_in_row_ > kHeldBlocks; }
  /// A large block is asked for; `hit`: a held block served it.
  void asked(bool hit) noexcept {
    frees_in_row_ = 0;
    if (hit) ++hits_;
  }
  /// While sampling: a large block of `bytes` was freed on `stream`, and one
  /// of `bytes` is asked for on `stream`.
  bool sampling() const noexcept { return mode_ == Mode::sample; }
  void freed(std::size_t bytes, Stream stream) noexcept { recent_[next_++ % recent_.size()] = {bytes, stream}; }
  void sample(std::size_t bytes, Stream stream) noexcept {
    for (Freed& block : recent_) {
      if (block.bytes == bytes && block.stream == stream) {
        block.bytes = 0;
        ++hits_;
        return;
      }
    }
  }

 private:
  enum class Mode { hold, skip, sample };
  void next_window() noexcept {
    mode_ = mode_ == Mode::skip ? Mode::sample : hits_ * 8 >= frees_ ? Mode::hold : Mode::skip;
    frees_ = hits_ = 0;
    recent_ = {};
  }
  struct Freed {
    std::size_t bytes = 0;
    Stream stream = 0;
  };
  Mode mode_ = Mode::hold;
  std::uint32_t frees_ = 0;         // large frees in this window, a teardown's not counted
  std::uint32_t hits_ = 0;
  std::uint32_t frees_in_row_ = 0;  // large frees since the last large request
  std::array<Freed, kHeldBlocks> recent_{};  // while sampling: the last large blocks freed
  std::size_t next_ = 0;
};
// Allocations in a row served from mapped memory before the pool counts as
// warm (State::warm), and quiet (PlacementCost::mostly_free). Warm at 512
// rather than 1,024: small-tensors' second pass makes no device call (9
// creates at 1,024) and its footprint is 1.077x, not 1.09x; at 256, bcrafton
// goes warm within its first pass and creates where it stole, 1.055x
// instead of 1.024x.
inline constexpr std::uint32_t kWarmAllocations = 512;
inline constexpr std::uint32_t kQuietAllocations = 1024;
// Notes the granule table's journal holds (State::journal): 1,024 blocks
// allocated and freed. A pool that needs its table less often than that
// rebuilds it when it does (a walk of the arenas' chunks, which a steal's
// device calls dwarf).
inline constexpr std::size_t kJournalNotes = 2 * kQuietAllocations;
// A sleep or a wake copies this much at a time, overlapped with the
// unmapping or mapping of the chunk before (a bare copy's speed, not the
// sum of both).
inline constexpr std::size_t kCopyChunkBytes = 64 << 20;

inline pool::ArenaOptions arena_options() {
  // Always split: a chunk's unused tail would otherwise hold physical memory
  // for nothing. Sizes are multiples of 256, so the tail is 0 or >= 256.
  pool::ArenaOptions options;
  options.max_internal_fragmentation_bytes = pool::kChunkGranule;
  return options;
}


}  // namespace expandable

using expandable::arena_options;
using pool::GranuleId;
using pool::kNoStream;

struct ExpandablePool::State {
  State(std::shared_ptr<Device> device_in, ExpandableOptions options_in, std::size_t limit)
      : device(std::move(device_in)),
        options(options_in),
        granule(device->granularity()),
        granule_shift(static_cast<unsigned>(std::countr_zero(granule))),
        bytes_limit(limit),
        small(*device, arena_options()),
        large(*device, arena_options()) {
    held.reserve(expandable::kHeldBlocks);
    exact = !may_be_lazy();
    if (!exact) journal.resize(expandable::kJournalNotes);  // its pages touched once, now
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
  MakerProcess maker;  // a forked child leaves the pool alone (core/process.hpp)
  Error refused_in_child() const { return maker.refusal("the expandable pool"); }
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
  pool::StreamValues freed_on;          // 1 for each stream in freeing_streams
  Stream last_freed_on = kNoStream;     // in freeing_streams, unless it is empty
  /// A block was freed on `stream`: remembered for settling, and the reaper
  /// woken if it waits for something to release.
  void note_free(Stream stream) {
    if (stream != last_freed_on || freeing_streams.empty()) note_stream(stream);  // most repeat the last
    if (reaper_parked) wake_reaper();
  }
  void note_stream(Stream stream);
  void wake_reaper();
  /// Large blocks freed but held back, oldest first: still allocated in the
  /// arena, their granules still used. Only while nothing is released after
  /// each free (release_threshold kKeepAll), so holding back delays nothing.
  struct Held {
    void* ptr;
    std::size_t bytes;
    Stream stream;
  };
  std::vector<Held> held;
  expandable::HoldBack hold_back;
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
  // Lazy bookkeeping. While large frees may be held back and no tag exists
  // (may_be_lazy()), an allocation served from mapped memory and a free
  // leave the granule table alone: each is noted in a journal, and whatever
  // needs the table (a block that needs memory, a release, stats) first
  // applies the notes in order (sync_granules), so that the table is what
  // it would be had it followed every block. Once kJournalNotes are noted
  // with nothing needing the table, the journal is dropped (stale): the
  // table is rebuilt from the arenas' chunks when needed (lazy mode), and
  // the pool notes again. Otherwise (tags, or frees that release memory)
  // the table follows every block (exact).
  bool exact = true;
  struct Noted {
    std::uintptr_t base;
    std::size_t bytes;
    Stream stream;  // the free's
    bool use;       // an allocation (else a free)
  };
  std::vector<Noted> journal;  // kJournalNotes, made once: the first `noted` hold notes
  std::size_t noted = 0;
  bool stale = false;          // the journal was dropped: the table is rebuilt when needed
  std::uint32_t quiet_allocations = 0;  // in a row, that mapped nothing (at most kQuietAllocations)
  std::int64_t rebuilds = 0;             // sync_granules() calls that rebuilt the table
  bool may_be_lazy() const noexcept { return holds_back() && tags.size() == 0; }
  /// kQuietAllocations in a row served from mapped memory: most blocks now land there.
  bool quiet() const noexcept { return quiet_allocations == expandable::kQuietAllocations; }
  /// Warm: the pool has served kWarmAllocations in a row from mapped
  /// memory, so the program repeats its steps: its slack is larger
  /// (slack_granules(), back()).
  bool warm = false;
  /// An allocation found every granule mapped.
  void note_quiet() noexcept {
    if (quiet_allocations == expandable::kQuietAllocations) return;
    if (++quiet_allocations >= expandable::kWarmAllocations) warm = true;
  }
  /// Notes a block's use of its granules (`use`) or its free on `stream`
  /// for the table (not exact).
  void note(std::uintptr_t base, std::size_t bytes, Stream stream, bool use) noexcept {
    if (stale) return;
    if (noted == journal.size()) {  // nothing needed the table for that long: rebuilt when it does
      noted = 0;
      stale = true;
      return;
    }
    journal[noted++] = {base, bytes, stream, use};
  }
  /// Applies the notes to the table, in order, and empties the journal.
  void apply_journal() noexcept;
  /// Brings the granule table up to date with every block: the journal
  /// applied, or the table rebuilt from the arenas' chunks (stale; the block
  /// at `except`, carved but not backed yet, left out). Then every mapped
  /// granule's uses, free bit and stream tags are current.
  void sync_granules(const void* except = nullptr) noexcept;
  /// The table is current (nothing to apply or rebuild).
  bool table_current() const noexcept { return exact || (!stale && noted == 0); }
  std::int64_t maps = 0, unmaps = 0, stitches = 0;  // releases: usage.num_device_frees
  std::int64_t moved = 0;  // granules stolen: at most the granules created (usage.num_device_allocs) below the limit

  /// Physical memory mapped: the table's granules and the headroom.
  std::size_t mapped_bytes() const noexcept { return (granules.mapped() + headroom.size()) * granule; }
  std::size_t free_granule_bytes() const noexcept { return granules.free_count() * granule; }
  /// Free granules kept before stealing: 1/64 of those mapped, 1/8 once warm.
  std::size_t slack_granules() const noexcept {
    return granules.mapped() / (warm ? expandable::kWarmSlackShare : expandable::kSlackShare);
  }

  /// Reserves `bytes` of address space for one arena.
  Status add_space(std::size_t bytes, bool for_small, pool::TagId tag = pool::kUntagged);
  /// A block of `rounded` bytes placed in address space reserved for it
  /// (`arena` had no free chunk large enough).
  [[gnu::noinline]] Expected<pool::PlacedBlock> place_in_more_space(pool::BestFitArena& arena, std::size_t rounded,
                                                                    Stream stream, bool for_small, pool::TagId tag);
  const Space* space_of(std::uintptr_t address) const noexcept {
    for (const Space& space : spaces) {
      if (address - space.base < space.bytes) return &space;
    }
    return nullptr;
  }
  /// The granule table's part for `space` (each space is one grow()).
  std::size_t part_of(const Space& space) const noexcept { return static_cast<std::size_t>(&space - spaces.data()); }
  GranuleId granule_of(const Space& space, std::uintptr_t address) const noexcept {
    return space.first + static_cast<GranuleId>((address - space.base) >> granule_shift);
  }
  /// The first and the last granule under [base, base + bytes) (bytes > 0).
  struct GranuleSpan {
    GranuleId first, last;
  };
  GranuleSpan granules_of(const Space& space, std::uintptr_t base, std::size_t bytes) const noexcept {
    return {granule_of(space, base), granule_of(space, base + bytes - 1)};
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
  /// stolen for it may have moved here (free, still mapped). `for_slab`:
  /// every free granule is stolen before one is created, and no room is an
  /// error, not an OOM counted (the plan is given up, nothing fails).
  Status back(const Space& space, std::uintptr_t base, std::size_t bytes, std::size_t requested,
              bool for_slab = false);
  /// One use less on every granule under the block, freed on `stream`
  /// (noted, while the table is not exact).
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
  /// Gives an unmapped granule's handle back to the device, its aliases
  /// unmapped first. A failed release leaves the memory with the device's
  /// accounting; the pool no longer holds it either way.
  void release_handle(PhysicalHandle handle) {
    if (!aliases.empty()) drop_aliases_of(handle);
    (void)device->release(handle, granule);
    usage.released(granule);
  }

  // --- headroom --------------------------------------------------------------
  // A program's second pass is placed on a warm pool, not an empty one, and
  // its peak may reach a few granules past the first pass's top: there it
  // would create them. So when back() creates memory at the top of an
  // untagged space, granules just above the block are created and mapped
  // too, in each space up to 1/512 of the table's granules. The table does not
  // know them: placement, stealing and the slack see the pool as without
  // them, so blocks are placed as they would be, and a block that lands on
  // one takes it with no device call. They count as mapped against the
  // limit; back() drops them all when a block would not fit otherwise, as
  // release_free() (trim, idle release) does. None with a release threshold.
  struct Kept {
    GranuleId id;
    PhysicalHandle handle;
    bool operator<(const Kept& other) const noexcept { return id < other.id; }
  };
  std::vector<Kept> headroom;  // by granule; a few per space
  // The pool decides as it would without headroom: a granule back() would
  // create, or steal, is taken from the headroom when it maps one there
  // (the stolen granule's memory then goes back instead of moving). The
  // move budget leaves out the creates the pool would not have made
  // (headroom_made: created for headroom, less those taken instead of a
  // create), and
  // the step plan (which watches when the pool calls the device) sees the
  // calls it would have made: headroom changes how many calls are made,
  // never what the pool does.
  std::int64_t headroom_made = 0;
  std::int64_t headroom_calls = 0;  // made for the headroom, less those it saved
  /// Maps back()'s granule `id` from the headroom, if it holds one there.
  bool take_headroom(GranuleId id) noexcept;
  /// After back() created memory for a block ending at `last`, or, while
  /// the pool is not warm, took headroom for it (`past_kept`: the new
  /// headroom goes past what the block left right above).
  void add_headroom(const Space& space, GranuleId last, bool past_kept) noexcept;
  void drop_headroom() noexcept;

  // --- aliases (ExpandableOptions::aliases) ---------------------------------
  // A granule stolen stays mapped where it was too (Device::map maps a handle
  // at several ranges: an alias), while no tag exists. The table counts that
  // address unmapped; back() maps nothing there when the granule's memory is
  // free where the table has it (its home): it moves the home with no device
  // call. A program whose steps take turns with a granule between two places
  // (one freed before the other is needed) then moves it once, not every
  // step. An alias whose memory a live block uses elsewhere is unmapped
  // before anything else is mapped there. Two live blocks never share memory:
  // only a granule the table counts free moves.
  struct Aliased {
    GranuleId home = 0;                // where the table has the handle
    std::vector<GranuleId> elsewhere;  // where it is mapped besides
  };
  std::unordered_map<PhysicalHandle, Aliased> aliases;  // handles with an alias
  std::unordered_map<GranuleId, PhysicalHandle> alias_at;
  std::int64_t alias_moves = 0;  // granules moved home with no device call
  /// Whether a steal keeps the granule's old mapping: asked for
  /// (ExpandableOptions::aliases), no tag exists (a tag's sleep and wake map
  /// its space themselves), and aliases stay fewer than the granules mapped
  /// (each is a kernel mapping on the host device).
  bool keeps_aliases() const noexcept {
    return options.aliases && tags.size() == 0 && alias_at.size() < granules.mapped();
  }
  /// Whether the table has every granule under [base, base + bytes) mapped.
  bool all_mapped(std::uintptr_t base, std::size_t bytes) const noexcept {
    const Space& space = *space_of(base);
    const auto [first, last] = granules_of(space, base, bytes);
    return granules.all_mapped(part_of(space), first, last);
  }
  /// Granules of [first, last] that a block there would need mapped: those
  /// the table has unmapped, but for aliases whose memory is free at a home
  /// outside the range, each handle once (back() moves those home with no
  /// call). The table is brought up to date first: the arenas are consistent
  /// while they ask (before they carve), and the journal or a rebuild
  /// changes only the table.
  std::size_t unserved(GranuleId first, GranuleId last) noexcept {
    // Up to the first alias, every unmapped granule counts, and the table
    // need not be current: a range with no alias costs what it does without.
    GranuleId id = first;
    while (id <= last && (granules.is_mapped(id) || !alias_at.contains(id))) ++id;
    if (id > last) return granules.unmapped_in(first, last);
    std::size_t count = id == first ? 0 : granules.unmapped_in(first, id - 1);
    if (!table_current()) sync_granules();
    const auto inside = [&](GranuleId other) { return other >= first && other <= last; };
    for (; id <= last; ++id) {
      if (granules.is_mapped(id)) continue;
      const auto found = alias_at.find(id);
      if (found == alias_at.end()) {
        ++count;
        continue;
      }
      const Aliased& aliased = aliases.at(found->second);
      const bool serves = granules.is_free(aliased.home) && !inside(aliased.home) &&
                          std::none_of(aliased.elsewhere.begin(), aliased.elsewhere.end(),
                                       [&](GranuleId other) { return other != id && inside(other) && other < id; });
      count += serves ? 0 : 1;  // an earlier alias of the same memory in the range took it
    }
    return count;
  }
  /// Unmaps the alias at `id` (not a granule the table has mapped).
  void drop_alias(GranuleId id) noexcept;
  /// The device call of every drop of a mapping the table does not count
  /// (an alias, or headroom): the mapping at `id` goes.
  void unmap_untracked(GranuleId id) noexcept {
    (void)device->unmap(address_of(id), granule);
    ++unmaps;
  }
  void drop_aliases_of(PhysicalHandle handle) noexcept;
  void drop_aliases() noexcept;
  /// Steals free granule `id`: its handle, for the caller to map; mapped
  /// there still (an alias) when keeps_aliases().
  Expected<PhysicalHandle> steal_free(GranuleId id);
  /// Unmapped granule `id` of the block being backed has an alias whose
  /// memory is free at its home: the home moves to `id`, no device call.
  /// False (the alias unmapped if its memory is in use) otherwise.
  bool move_home(GranuleId id);
  // --- the step plan (step_plan.hpp) --------------------------------------
  // A program that repeats a step is served from a plan of it: its large
  // untagged requests at offsets in one arena block, the slab. Only while
  // large frees may be held back and no tag exists (may_be_lazy()).
  pool::StepPlan plan;
  void* slab = nullptr;  // the slab, a live block of `large`, while the plan has one
  std::size_t slab_bytes = 0;
  Stream slab_stream = 0;
  std::int64_t device_calls() const noexcept { return maps + unmaps + usage.num_device_allocs + usage.num_device_frees; }
  /// device_calls() as a pool without headroom would have made them (the step plan's signal).
  std::int64_t plan_calls() const noexcept { return device_calls() - headroom_calls; }
  bool in_slab(std::uintptr_t address) const noexcept {
    return slab != nullptr && address - reinterpret_cast<std::uintptr_t>(slab) < slab_bytes;
  }
  /// A large untagged request served from the plan's slab; null: the arena
  /// serves it (the plan follows along, or opens its slab here first).
  void* take_planned(std::size_t rounded, Stream stream);
  /// Places and backs the slab (stealing every free granule before it
  /// creates one); false, with nothing changed, when it does not fit.
  bool open_slab(Stream stream);
  /// Frees the slab (no block lives in it) and gives the plan up.
  void close_slab() noexcept;
  /// The plan stops serving; its slab goes once empty.
  void retire_plan() noexcept {
    plan.retire();
    if (plan.retired() && plan.empty()) close_slab();
  }

  /// Unmaps and releases free granules, oldest first, until at most `keep`
  /// bytes of them remain. Returns the bytes released.
  std::size_t release_free(std::size_t keep);
  /// trim() and idle release: every free granule goes, held blocks' too.
  std::size_t release_all() {
    complete_held();
    retire_plan();
    sync_granules();
    return release_free(0);
  }
  Error out_of_memory(std::size_t requested, std::size_t rounded, std::size_t missing_granules);
  /// An OOM of `requested` bytes, counted: the pool's figures now, the hint to add.
  OomReport oom_report(std::size_t requested);

  /// The arenas place a block where it needs the fewest granules mapped, so
  /// that memory already mapped is used before any is stolen or created.
  struct GranulesToMap final : pool::PlacementCost {
    explicit GranulesToMap(State& state) : s(state) {}
    std::size_t cost(std::uintptr_t base, std::size_t bytes) const noexcept override {
      const auto [first, last] = s.granules_of(*s.space_of(base), base, bytes);
      const std::size_t unmapped = s.granules.unmapped_in(first, last);
      if (unmapped == 0 || s.alias_at.empty()) return unmapped;
      return s.unserved(first, last);
    }
    // Aliases are weighed on the table's free granules: brought up to date
    // first (the journal applied), or a placement repeating the last step's
    // would see the granules that step freed as still in use.
    bool costs_nothing(std::uintptr_t base, std::size_t bytes) const noexcept override {
      if (s.all_mapped(base, bytes)) return true;
      if (s.alias_at.empty()) return false;
      const auto [first, last] = s.granules_of(*s.space_of(base), base, bytes);
      return s.unserved(first, last) == 0;  // aliases serve the rest
    }
    // Free chunks coalesce over granules stolen from their middle, so mapped
    // granules may lie inside one whose ends are not: a block starting at
    // the first run of them long enough needs nothing mapped.
    std::uintptr_t free_window(std::uintptr_t begin, std::uintptr_t end, std::size_t bytes) const noexcept override {
      const std::uintptr_t first = round_up(begin, s.granule), stop = end / s.granule * s.granule;
      if (stop <= first || stop - first < bytes) return 0;
      const Space& space = *s.space_of(begin);
      const GranuleId run = s.granules.mapped_run(s.granule_of(space, first), s.granule_of(space, stop - 1),
                                                  (bytes + s.granule - 1) >> s.granule_shift);
      return run == pool::kNoGranule ? 0 : reinterpret_cast<std::uintptr_t>(s.address_of(run));
    }
    // Once quiet (1,024 allocations in a row served from mapped memory),
    // most blocks land on mapped memory.
    bool mostly_free() const noexcept override { return s.quiet(); }
    State& s;
  };
  GranulesToMap placement_cost{*this};

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
  std::size_t chunk_granules() const noexcept { return std::max<std::size_t>(1, expandable::kCopyChunkBytes / granule); }
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


}  // namespace tidepool
