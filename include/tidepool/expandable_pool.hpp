// ExpandablePool: a pool that grows and shrinks with demand and does not
// fragment. It reserves address space once (several times its limit: address
// space is cheap) and backs it with physical granules only where blocks live.
// Blocks are carved from that address space by best fit, so a block is always
// contiguous; the physical granules under it come from wherever free ones are,
// so free memory split across the pool still serves a large request
// ("stitching": free granules are unmapped and mapped again side by side; no
// data moves). A request fails only when free physical memory is really short.
#pragma once

#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>

#include "tidepool/allocator.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

struct ExpandableOptions {
  /// Never release automatically: only trim() (or a ledger's trim request) does.
  static constexpr std::size_t kKeepAll = std::numeric_limits<std::size_t>::max();

  /// Requests below this are packed side by side in a part of the address
  /// space of their own, so that small long-lived blocks never pin granules in
  /// the middle of large freed ones. PyTorch's small/large pool split is also
  /// 1 MiB.
  std::size_t small_threshold = 1 * MiB;
  /// After a free, fully free granules beyond this many bytes are unmapped and
  /// handed back to the device, oldest first (TIDEPOOL_RELEASE_THRESHOLD).
  /// kKeepAll keeps them cached until trim(); 0 hands each back as soon as it
  /// empties. With a threshold the pool also keeps no headroom (granules
  /// mapped past the top of what it uses, for a pass that outgrows the last
  /// one's peak: docs/expandable.md, "Headroom past the top").
  std::size_t release_threshold = kKeepAll;
  /// Once the pool has had no allocate or free for this long, it releases
  /// every free granule, as trim() does (TIDEPOOL_IDLE_RELEASE): an idle
  /// process hands its cache back. A thread of the pool's own waits for
  /// that; it sleeps while nothing is cached. Zero: never.
  std::chrono::milliseconds idle_release{0};
  /// A granule stolen stays mapped where it was too (an alias), and serves
  /// there again with no device call while its memory is free where the
  /// pool moved it (TIDEPOOL_ALIASES). A program whose steps take turns with
  /// a granule between two places then moves it once, not every step: the
  /// second pass of cs336-bcrafton makes no device call (c11 m13 u2 without),
  /// at a smaller footprint. Off by default: on the built-in random
  /// workloads it moves device calls between draws rather than removing
  /// them (docs/expandable.md). Each alias is one more mapping.
  bool aliases = false;
};

class ExpandablePool final : public Allocator, public Sleepable {
 public:
  /// The device must support virtual memory (unsupported otherwise).
  static Expected<std::unique_ptr<ExpandablePool>> create(std::shared_ptr<Device> device,
                                                          ExpandableOptions options = {});
  ~ExpandablePool() override;
  ExpandablePool(const ExpandablePool&) = delete;
  ExpandablePool& operator=(const ExpandablePool&) = delete;

  // Allocator: see allocator.hpp. name() is "expandable". In stats(),
  // largest_free_block_bytes is the free granule bytes: the largest request
  // served without new physical memory (by stitching if need be), so
  // fragmentation() is the share of free pool memory stuck in granules that
  // hold live blocks too.
  std::string_view name() const override;
  Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) override;
  Status deallocate(void* ptr, Stream stream = kDefaultStream) override;
  Stats stats() const override;
  /// Unmaps and releases every fully free granule (after the streams that
  /// freed into them have finished their work).
  std::size_t trim() override;
  std::string dump() const override;
  Device& device() const override;
  Sleepable* sleepable() noexcept override { return this; }

  // Sleepable: see sleep.hpp. A tag's blocks are carved from address space
  // of its own; large blocks of a tag are never held back after a free.
  /// A tag scope on the calling thread until the object goes: `auto scope = pool.tag("weights")`.
  Expected<TagScope> tag(std::string_view name) { return TagScope::open(*this, name); }
  Status tag_begin(std::string_view name) override;
  Status tag_end() override;
  Status sleep(std::string_view name, SleepKeep keep) override;
  Status wake(std::string_view name) override;
  std::vector<TagStats> tag_stats() const override;

 private:
  struct State;
  explicit ExpandablePool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
