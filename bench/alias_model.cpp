// A model of an expandable pool that maps one physical granule at several
// addresses (aliases), against one that maps each at one address (the pool
// as built). Not a pool: no memory is touched and no device is called; it
// counts the device calls and the physical granules each rule would need.
//
// Blocks are placed by the pool's own arenas (pool::BestFitArena with the
// expandable pool's options; small blocks below 1 MiB in an arena of their
// own), each where the fewest granules need a device call, as the pool's
// PlacementCost does. A granule of address space serves a block with no call
// when it is in use already or mapped to a physical granule that no live
// block uses through another address. Otherwise it needs one:
// - its mapping, if any, is unmapped (its physical granule is live elsewhere);
// - a free physical granule is taken while more than the slack of them is
//   free (1/N of those created; --slack, --warm-slack once warm) and, with
//   --move-budget, while fewer have been taken than created; else one is
//   created. Taken: the free granule last used at the highest address, as the
//   pool steals the highest free granule.
// - Without aliases (--no-alias, the pool as built) a granule taken is
//   unmapped where it was; with aliases it stays mapped there too, and serves
//   that address again with no call whenever no block uses it elsewhere.
// Warm: 512 allocations in a row with no call (the pool's kWarmAllocations).
// Every block still live at the end of a pass is freed before the next one.
// Not modelled: holding large frees back, step plans, streams (every stream
// counts as idle, as on the host device), a limit.
//
//   alias_model [--no-alias] [--slack N] [--warm-slack N] [--move-budget]
//               [--passes N] [--steps N] [--seed N] TRACE|WORKLOAD...
//
// Prints per pass: creates, maps and unmaps; the physical granules created
// over peak live bytes; and how many calls came from an alias live elsewhere.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pool/best_fit_arena.hpp"
#include "pool/expandable_state.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "tidepool/workloads.hpp"

namespace {

using namespace tidepool;

constexpr std::size_t kGranule = 2 * MiB;
constexpr std::size_t kSpaceBytes = std::size_t{1} << 40;  // per arena
constexpr std::uintptr_t kSmallBase = std::uintptr_t{1} << 44;
constexpr std::uintptr_t kLargeBase = std::uintptr_t{2} << 44;
constexpr int kNone = -1;

struct Rules {
  bool alias = true;
  std::size_t slack = 64;       // 0: take a free granule whenever one is free
  std::size_t warm_slack = 8;
  bool move_budget = false;
};

struct Calls {
  long creates = 0, maps = 0, unmaps = 0, conflicts = 0;
};

// Address granules (small arena's, then large arena's) and physical granules.
class Granules {
 public:
  explicit Granules(Rules rules) : rules_(rules), physical_of_(2 * kSpaceBytes / kGranule, kNone),
                                   uses_(2 * kSpaceBytes / kGranule, 0) {}

  static std::size_t index(std::uintptr_t address) {
    return address >= kLargeBase ? kSpaceBytes / kGranule + (address - kLargeBase) / kGranule
                                 : (address - kSmallBase) / kGranule;
  }
  /// Whether address granule x serves a block with no device call.
  bool serves(std::size_t x) const {
    return uses_[x] > 0 || (physical_of_[x] != kNone && owner_[physical_of_[x]] == kNone);
  }

  void use(std::uintptr_t base, std::size_t bytes) {
    bool called = false;
    for (std::size_t x = index(base), last = index(base + bytes - 1); x <= last; ++x) {
      if (uses_[x]++ > 0) continue;
      int p = physical_of_[x];
      if (p == kNone || owner_[p] != kNone) {
        called = true;
        if (p != kNone) {  // an alias whose memory is live elsewhere
          ++calls.unmaps;
          ++calls.conflicts;
          physical_of_[x] = kNone;
        }
        p = take_or_create(x);
        ++calls.maps;
        physical_of_[x] = p;
      } else {
        free_.erase({last_at_[p], p});
      }
      owner_[p] = static_cast<int>(x);
      last_at_[p] = x;
    }
    if (called) {
      quiet_ = 0;
    } else if (++quiet_ >= expandable::kWarmAllocations) {
      warm_ = true;
    }
  }

  void unuse(std::uintptr_t base, std::size_t bytes) {
    for (std::size_t x = index(base), last = index(base + bytes - 1); x <= last; ++x) {
      if (--uses_[x] > 0) continue;
      const int p = physical_of_[x];
      owner_[p] = kNone;
      free_.insert({last_at_[p], p});
    }
  }

  std::size_t physical() const { return owner_.size(); }
  Calls calls;

 private:
  int take_or_create(std::size_t x) {
    const std::size_t share = warm_ ? rules_.warm_slack : rules_.slack;
    const std::size_t slack = share == 0 ? 0 : owner_.size() / share;
    const bool may_move = !rules_.move_budget || moved_ < calls.creates;
    if (may_move && free_.size() > slack) {
      const auto [at, p] = *free_.rbegin();
      free_.erase(std::prev(free_.end()));
      ++moved_;
      if (!rules_.alias) {  // the pool as built: it leaves where it was
        physical_of_[at] = kNone;
        ++calls.unmaps;
      }
      return p;
    }
    ++calls.creates;
    owner_.push_back(kNone);
    last_at_.push_back(x);
    return static_cast<int>(owner_.size() - 1);
  }

  Rules rules_;
  std::vector<int> physical_of_;            // per address granule: its mapping, or kNone
  std::vector<int> uses_;                   // per address granule: live blocks in it
  std::vector<int> owner_;                  // per physical granule: the address using it, or kNone
  std::vector<std::size_t> last_at_;        // per physical granule: where it was last used
  std::set<std::pair<std::size_t, int>> free_;  // (last address, physical) of the free ones
  long moved_ = 0;
  std::uint32_t quiet_ = 0;
  bool warm_ = false;
};

class UsableFirst final : public pool::PlacementCost {
 public:
  explicit UsableFirst(const Granules& granules) : granules_(granules) {}
  std::size_t cost(std::uintptr_t base, std::size_t bytes) const noexcept override {
    std::size_t count = 0;
    for (std::size_t x = Granules::index(base), last = Granules::index(base + bytes - 1); x <= last; ++x) {
      count += granules_.serves(x) ? 0 : 1;
    }
    return count;
  }

 private:
  const Granules& granules_;
};

Expected<trace::Trace> load(const std::string& what, const trace::WorkloadOptions& options) {
  std::ifstream in(what, std::ios::binary);
  if (!in) return trace::make_workload(what, options);
  std::stringstream text;
  text << in.rdbuf();
  if (what.ends_with(".pickle")) return trace::read_pytorch_snapshot(text.str(), what);
  if (what.ends_with(".csv")) return trace::read_rmm_csv(text.str(), what);
  return trace::read_tidepool(text.str(), what);
}

int model(const trace::Trace& trace, const Rules& rules, unsigned passes, Device& device) {
  Granules granules(rules);
  const UsableFirst cost(granules);
  pool::BestFitArena small(device, expandable::arena_options());
  pool::BestFitArena large(device, expandable::arena_options());
  (void)small.add_region(reinterpret_cast<void*>(kSmallBase), kSpaceBytes);
  (void)large.add_region(reinterpret_cast<void*>(kLargeBase), kSpaceBytes);
  auto arena_of = [&](std::uintptr_t address) -> pool::BestFitArena& {
    return address >= kLargeBase ? large : small;
  };
  std::vector<std::uintptr_t> where(trace.num_blocks, 0);
  std::vector<std::size_t> size(trace.num_blocks, 0);
  std::size_t live = 0, peak_live = 0;
  auto free_block = [&](std::uint32_t block, Stream stream) {
    (void)arena_of(where[block]).free(reinterpret_cast<void*>(where[block]), stream);
    granules.unuse(where[block], size[block]);
    live -= size[block];
    where[block] = 0;
  };
  for (unsigned pass = 1; pass <= passes; ++pass) {
    const Calls before = granules.calls;
    for (const trace::Event& event : trace.events) {
      if (event.op == trace::Op::alloc && event.block < where.size()) {
        const std::size_t rounded = std::max(round_up(event.bytes, pool::kChunkGranule), pool::kChunkGranule);
        Expected<pool::PlacedBlock> placed =
            (rounded < MiB ? small : large).allocate(rounded, event.stream, cost);
        if (!placed || placed->base == nullptr) {
          fmt::print(stderr, "alias_model: {}: no place for a block of {} bytes\n", trace.name, rounded);
          return 1;
        }
        where[event.block] = reinterpret_cast<std::uintptr_t>(placed->base);
        size[event.block] = placed->bytes;
        granules.use(where[event.block], placed->bytes);
        live += placed->bytes;
        peak_live = std::max(peak_live, live);
      } else if (event.op == trace::Op::free && event.block < where.size() && where[event.block] != 0) {
        free_block(event.block, event.stream);
      }
    }
    for (std::uint32_t block = 0; block < where.size(); ++block) {
      if (where[block] != 0) free_block(block, kDefaultStream);
    }
    const Calls& now = granules.calls;
    fmt::print("{} pass {}: c{} m{} u{} ({} from an alias live elsewhere); physical / peak live {:.4f}\n", trace.name,
               pass, now.creates - before.creates, now.maps - before.maps, now.unmaps - before.unmaps,
               now.conflicts - before.conflicts,
               static_cast<double>(granules.physical() * kGranule) / static_cast<double>(peak_live));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Device calls and footprint of an expandable pool with and without aliased granules (a model)"};
  Rules rules;
  unsigned passes = 3;
  trace::WorkloadOptions options;
  std::vector<std::string> traces;
  bool no_alias = false;
  app.add_flag("--no-alias", no_alias, "Map each physical granule at one address (the pool as built)");
  app.add_option("--slack", rules.slack, "Free granules kept before taking one: 1/N of those created (0: none)");
  app.add_option("--warm-slack", rules.warm_slack, "The same once warm");
  app.add_flag("--move-budget", rules.move_budget, "Take no more free granules than were created");
  app.add_option("--passes", passes, "Passes over each trace")->check(CLI::Range(1u, 100u));
  app.add_option("--steps", options.steps, "Built-in workloads: their size");
  app.add_option("--seed", options.seed, "Built-in workloads: their draw");
  app.add_option("traces", traces, "Trace files or built-in workload names")->required();
  CLI11_PARSE(app, argc, argv);
  rules.alias = !no_alias;
  Expected<std::shared_ptr<HostDevice>> device = HostDevice::create(HostDeviceOptions{});
  if (!device) {
    fmt::print(stderr, "alias_model: {}\n", device.error().message());
    return 1;
  }
  for (const std::string& what : traces) {
    Expected<trace::Trace> trace = load(what, options);
    if (!trace) {
      fmt::print(stderr, "alias_model: {}: {}\n", what, trace.error().message());
      return 1;
    }
    if (int failed = model(*trace, rules, passes, **device); failed != 0) return failed;
  }
  return 0;
}
