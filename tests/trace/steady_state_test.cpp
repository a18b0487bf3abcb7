// The expandable pool once warm (docs/expandable.md, "Once warm"): a trace
// replayed several times through the same pool, and what each pass costs in
// device calls. Counts, never times.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tidepool/replay.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "tidepool/workloads.hpp"

namespace tidepool::trace {
namespace {

struct Case {
  std::string name;
  Trace trace;
  std::size_t capacity = 0;      // 0: the trace's own
  std::size_t quiet_from = 0;    // the first pass that creates, maps, unmaps and syncs nothing
  double footprint = 1.07;       // peak reserved / peak live at most
  std::size_t passes = 5;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const auto workload = [&](const char* name, std::uint32_t steps, std::size_t capacity, std::size_t quiet,
                            double footprint = 1.07) {
    WorkloadOptions options;
    options.steps = steps;
    auto trace = make_workload(name, options);
    if (!trace) throw Exception(trace.error());
    out.push_back({name, std::move(*trace), capacity, quiet, footprint});
  };
  // The pathologies, at a size a test can afford; near-capacity on the 60
  // GiB its live bytes were sized for, so that they reach 95-99% of the limit.
  workload("multi-stream-inference", 4, 0, 4);
  workload("near-capacity", 4, 60 * GiB, 2);
  workload("random-mixed", 100, 0, 2);
  workload("train-step", 2, 0, 2);
  workload("llm-inference", 8, 0, 2);
  // 20,000 tensors: its warm passes create 76 granules (6% of its peak) where
  // the steps drift, instead of stealing 70-90 a pass on and on.
  workload("small-tensors", 20, 0, 5, 1.15);
  // bcrafton's warm passes put its second burst of 147 MiB tensors 9
  // granules lower each time, into the hole its first pass's stitch left, and
  // created them (it settled in pass 9 at 1.06x): its pass 2 repeats pass 1
  // with device calls, so the pool plans the pass (step_plan.hpp), lays the
  // plan in pass 3 and is quiet from pass 4, within 3% of its peak
  // (docs/expandable.md, "Step plans").
  for (const auto& [file, quiet, passes, footprint] :
       {std::tuple{"cs336-magma27.pickle", 2, 5, 1.07}, std::tuple{"cs336-bcrafton.pickle", 4, 8, 1.03}}) {
    auto trace = read_trace(std::string(TIDEPOOL_TEST_DATA) + "/pytorch/" + file);
    if (!trace) throw Exception(trace.error());
    out.push_back({file, std::move(*trace), 0, static_cast<std::size_t>(quiet), footprint,
                   static_cast<std::size_t>(passes)});
  }
  return out;
}

std::uint64_t maps_and_unmaps(const PassReplay& pass) { return pass.device_calls.maps + pass.device_calls.unmaps; }
/// The calls that give or take physical memory, or wait for a stream: what a
/// quiet pass makes none of (queries only ask whether a stream is busy).
std::uint64_t memory_calls(const DeviceCalls& calls) {
  return calls.creates + calls.maps + calls.unmaps + calls.syncs + calls.releases;
}
std::string memory_calls_text(const DeviceCalls& calls) {
  return "creates " + std::to_string(calls.creates) + ", maps " + std::to_string(calls.maps) + ", unmaps " +
         std::to_string(calls.unmaps) + ", syncs " + std::to_string(calls.syncs) + ", releases " +
         std::to_string(calls.releases);
}
/// Built-in workload `name` (seed, steps) replayed `passes` times through one
/// expandable pool at the device's capacity (mem_fraction 1).
Expected<ModeReplay> warm_replay(const std::string& name, std::uint64_t seed, std::uint32_t steps,
                                 std::uint32_t passes) {
  WorkloadOptions workload;
  workload.seed = seed;
  workload.steps = steps;
  auto trace = make_workload(name, workload);
  if (!trace) return std::move(trace).error();
  ReplayOptions options;
  options.config.mem_fraction.value = 1.0;
  options.passes = passes;
  return replay_mode(*trace, Mode::expandable, options);
}

// What holds today (docs/expandable.md, "Once warm"): every trace settles
// within a few passes (bcrafton from pass 4): from then on a pass creates, maps, unmaps and syncs
// nothing (a warm pool creates the granules its steps drift onto rather
// than steal them back every pass); multi-stream-inference still asks its
// streams whether they are busy. The first pass maps and unmaps at most 3
// times its peak granules. No OOM, and the footprint stays within 7% of the
// peak of live bytes (15% for small-tensors at this size).
TEST(SteadyState, TheExpandablePoolSettlesOnceWarm) {
  for (Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ReplayOptions options;
    options.capacity_bytes = c.capacity;
    options.config.mem_fraction.value = 1.0;
    options.passes = static_cast<std::uint32_t>(c.passes);
    auto result = replay_mode(c.trace, Mode::expandable, options);
    ASSERT_TRUE(result) << result.error().message();
    ASSERT_EQ(result->passes.size(), c.passes);
    EXPECT_EQ(result->ooms, 0u);
    EXPECT_LE(result->fragmentation, c.footprint);

    const std::vector<PassReplay>& passes = result->passes;
    // The first pass maps and unmaps at most three times its peak granules
    // (the pool moves no more granules than it creates; 2 MiB granules).
    EXPECT_LE(maps_and_unmaps(passes[0]), 3 * (passes[0].peak_reserved_bytes / (2 * MiB)));
    for (std::size_t pass = 2; pass <= c.passes; ++pass) {
      const DeviceCalls& calls = passes[pass - 1].device_calls;
      EXPECT_LE(maps_and_unmaps(passes[pass - 1]) * 5, maps_and_unmaps(passes[0])) << "pass " << pass;
      if (pass >= c.quiet_from) {
        EXPECT_EQ(memory_calls(calls), 0u) << "pass " << pass << ": " << memory_calls_text(calls);
      }
    }
    // The host device's streams are always idle: memory passes from stream
    // to stream for a query, never a synchronize (multi-stream-inference
    // synchronized 1,185 times a warm pass before the pools asked).
    for (const PassReplay& pass : passes) EXPECT_EQ(pass.device_calls.syncs, 0u);
  }
}

// The test (issue 12), at each pathology workload's default size
// (the cases above are smaller, and multi-stream-inference at four requests
// per worker still creates in passes 2 and 3): pass 2 creates, maps, unmaps,
// syncs and releases nothing, and pass 1 maps and unmaps at most three times
// its peak granules. near-capacity on the 60 GiB its live bytes were sized
// for (95-99% of the limit).
TEST(SteadyState, EachPathologyWorkloadAtItsDefaultSizeMakesNoCallInItsSecondPass) {
  for (const auto& [name, capacity] : {std::pair{"multi-stream-inference", std::size_t{0}},
                                       std::pair{"near-capacity", 60 * GiB}, std::pair{"random-mixed", std::size_t{0}}}) {
    SCOPED_TRACE(name);
    auto trace = make_workload(name, WorkloadOptions{});
    ASSERT_TRUE(trace) << trace.error().message();
    ReplayOptions options;
    options.capacity_bytes = capacity;
    options.config.mem_fraction.value = 1.0;
    options.passes = 2;
    auto result = replay_mode(*trace, Mode::expandable, options);
    ASSERT_TRUE(result) << result.error().message();
    EXPECT_EQ(result->ooms, 0u);
    const PassReplay& first = result->passes[0];
    EXPECT_GT(first.device_calls.creates, 0u);
    EXPECT_LE(maps_and_unmaps(first), 3 * (first.peak_reserved_bytes / (2 * MiB)));
    const DeviceCalls& calls = result->passes[1].device_calls;
    EXPECT_EQ(memory_calls(calls), 0u) << memory_calls_text(calls);
  }
}

// TIDEPOOL_ALIASES (docs/expandable.md, "Aliases"): a granule stolen stays
// mapped where it was too. bcrafton's pass 1 steals 67 granules at its peak
// from places its next pass needs first: without aliases pass 2 creates or
// steals them again (c11 m13 u2) until the step plan is laid; with them it
// makes no device call from pass 2, within 3% of its peak, and pass 1
// unmaps nothing.
TEST(SteadyState, WithAliasesBcraftonsSecondPassMakesNoCall) {
  auto trace = read_trace(std::string(TIDEPOOL_TEST_DATA) + "/pytorch/cs336-bcrafton.pickle");
  ASSERT_TRUE(trace) << trace.error().message();
  for (bool aliases : {false, true}) {
    SCOPED_TRACE(aliases ? "aliases" : "no aliases");
    ReplayOptions options;
    options.config.mem_fraction.value = 1.0;
    options.config.aliases.value = aliases;
    options.passes = 3;
    auto result = replay_mode(*trace, Mode::expandable, options);
    ASSERT_TRUE(result) << result.error().message();
    EXPECT_EQ(result->ooms, 0u);
    const DeviceCalls& second = result->passes[1].device_calls;
    if (!aliases) {
      EXPECT_GT(memory_calls(second), 0u);
      continue;
    }
    EXPECT_LE(result->fragmentation, 1.03);
    EXPECT_EQ(result->passes[0].device_calls.unmaps, 0u);
    EXPECT_LE(maps_and_unmaps(result->passes[0]), 3 * (result->passes[0].peak_reserved_bytes / (2 * MiB)));
    for (std::size_t pass = 2; pass <= 3; ++pass) {
      const DeviceCalls& calls = result->passes[pass - 1].device_calls;
      EXPECT_EQ(memory_calls(calls), 0u) << "pass " << pass << ": " << memory_calls_text(calls);
    }
  }
}

// With aliases every block keeps its contents (each written whole at its
// allocation and checked at its free) through passes that steal, move
// granules home through aliases, and unmap aliases whose memory is in use
// elsewhere; and at a limit 4% over the peak, where the pool steals to serve.
TEST(SteadyState, WithAliasesEveryBlockKeepsItsContents) {
  WorkloadOptions workload;
  workload.steps = 2;
  auto trace = make_workload("random-mixed", workload);
  ASSERT_TRUE(trace) << trace.error().message();
  ReplayOptions options;
  options.config.mem_fraction.value = 1.0;
  options.config.aliases.value = true;
  options.verify_contents = true;
  options.passes = 3;
  auto result = replay_mode(*trace, Mode::expandable, options);
  ASSERT_TRUE(result) << result.error().message();
  EXPECT_EQ(result->ooms, 0u);
  EXPECT_GT(result->passes[0].device_calls.maps, result->passes[0].device_calls.creates);  // it stole
  options.capacity_bytes = (result->peak_live_bytes * 104 / 100 + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
  options.passes = 2;
  auto tight = replay_mode(*trace, Mode::expandable, options);
  ASSERT_TRUE(tight) << tight.error().message();
  EXPECT_EQ(tight->ooms, 0u);
}

// A training program repeated is placed as it was the last time
// (docs/expandable.md, "Large blocks held back"): its pass 1 steals
// nothing, so a pass 2 that puts every block where pass 1 did finds every
// granule mapped. These seeds of train-step are those where a pass placed
// blocks elsewhere because of the pool's own state, not the program's: large
// frees were held back in pass 1, while the pool grew and its granule table
// was exact, and not in pass 2, once lazy; or a pass's last frees (its
// weights, asked for by nobody) turned holding back off. Their second pass
// made 16 to 46 device calls; now none.
// Headroom past the top (docs/expandable.md, How it works): multi-stream-
// inference at one step steals nothing in its first pass, yet its second,
// placed on a full pool rather than an empty one, peaks a few granules past
// the first's top. Without headroom (a release threshold turns it off; this
// one is never reached) the pool creates them there in pass 2; with it, pass
// 2 makes no device call, and the first pass's peak is at most 1/256 of its
// granules higher (1/512 in each of the two spaces).
TEST(SteadyState, HeadroomServesASecondPassThatPeaksPastTheFirst) {
  WorkloadOptions workload;
  workload.steps = 1;
  auto trace = make_workload("multi-stream-inference", workload);
  ASSERT_TRUE(trace) << trace.error().message();
  std::size_t peak[2] = {0, 0};
  for (const bool headroom : {false, true}) {
    SCOPED_TRACE(headroom ? "with headroom" : "without");
    ReplayOptions options;
    options.config.mem_fraction.value = 1.0;
    if (!headroom) options.config.release_threshold.value = std::optional<std::size_t>(1024 * GiB);
    options.passes = 2;
    auto result = replay_mode(*trace, Mode::expandable, options);
    ASSERT_TRUE(result) << result.error().message();
    const DeviceCalls& calls = result->passes[1].device_calls;
    if (headroom) {
      EXPECT_EQ(memory_calls(calls), 0u) << memory_calls_text(calls);
    } else {
      EXPECT_GT(calls.creates, 0u) << memory_calls_text(calls);
    }
    peak[headroom] = result->passes[0].peak_reserved_bytes;
  }
  EXPECT_GE(peak[1], peak[0]);
  EXPECT_LE(peak[1] - peak[0], peak[0] / 256 + 2 * (2 * MiB));
}

// Pass 1's last growth may end on the headroom and take it all (a take made
// no call, and only a create refilled it): pass 2's drift past the top then
// created again (multi-stream-inference at one step, seed 10: c10 m10).
// While the pool grows, a take refills the headroom past what it left.
TEST(SteadyState, HeadroomTakenWhileGrowingIsRefilledForTheNextPass) {
  auto result = warm_replay("multi-stream-inference", 10, 1, 3);
  ASSERT_TRUE(result) << result.error().message();
  for (std::size_t pass = 1; pass < 3; ++pass) {
    const DeviceCalls& calls = result->passes[pass].device_calls;
    EXPECT_EQ(memory_calls(calls), 0u) << "pass " << pass + 1 << ": " << memory_calls_text(calls);
  }
  EXPECT_LE(static_cast<double>(result->peak_reserved_bytes), 1.03 * static_cast<double>(result->peak_live_bytes));
}

TEST(SteadyState, ATrainingProgramIsPlacedAsItWasTheLastTime) {
  for (const auto& [seed, steps] : {std::pair{5, 0}, std::pair{7, 1}, std::pair{6, 2}, std::pair{8, 2}}) {
    SCOPED_TRACE("train-step, seed " + std::to_string(seed) + ", steps " + std::to_string(steps));
    auto result = warm_replay("train-step", static_cast<std::uint64_t>(seed), static_cast<std::uint32_t>(steps), 2);
    ASSERT_TRUE(result) << result.error().message();
    const DeviceCalls& first = result->passes[0].device_calls;
    EXPECT_EQ(first.unmaps, 0u);  // pass 1 steals nothing
    const DeviceCalls& calls = result->passes[1].device_calls;
    EXPECT_EQ(memory_calls(calls), 0u) << memory_calls_text(calls);
  }
}

// A program in two phases (docs/expandable.md, "Once warm, its slack is
// 1/8"): 100 blocks of 8 MiB live throughout, with steps
// of 8 MiB temporaries between them (the pool goes warm), then steps of
// 20 MiB temporaries that fit none of the 8 MiB holes. The second phase's
// granules come from the first phase's holes, so the footprint stays near
// the peak of live bytes: 1.125x at most (the warm slack), where a pool
// that never stole once warm grew to 1.50x, and BFC holds 2.56x.
TEST(SteadyState, ANewPhaseIsStitchedFromWhatTheLastLeftFree) {
  Trace trace;
  trace.name = "phase-change";
  trace.format = "test";
  std::vector<std::uint64_t> sizes;  // per block
  std::vector<std::uint32_t> temporaries;
  const auto alloc = [&](std::uint64_t bytes) {
    trace.events.push_back(Event{Op::alloc, trace.num_blocks, bytes, kDefaultStream, -1});
    sizes.push_back(bytes);
    return trace.num_blocks++;
  };
  const auto free_all = [&] {
    for (std::uint32_t block : temporaries) {
      trace.events.push_back(Event{Op::free, block, sizes[block], kDefaultStream, -1});
    }
    temporaries.clear();
  };
  for (int i = 0; i < 100; ++i) {
    (void)alloc(8 * MiB);  // lives throughout
    temporaries.push_back(alloc(8 * MiB));
  }
  free_all();
  const auto steps = [&](int count, int blocks, std::uint64_t bytes) {
    for (int step = 0; step < count; ++step) {
      for (int i = 0; i < blocks; ++i) temporaries.push_back(alloc(bytes));
      free_all();
    }
  };
  steps(20, 100, 8 * MiB);
  steps(20, 40, 20 * MiB);
  ReplayOptions options;
  options.config.mem_fraction.value = 1.0;
  auto result = replay_mode(trace, Mode::expandable, options);
  ASSERT_TRUE(result) << result.error().message();
  EXPECT_EQ(result->ooms, 0u);
  EXPECT_EQ(result->peak_live_bytes, 1600 * MiB);
  EXPECT_LE(result->fragmentation, 1.13);
  EXPECT_GT(result->device_calls.unmaps, 0u);  // stitched
}

TEST(SteadyState, PassesReplayTheTraceThroughOnePool) {
  // A block live at the end of the trace is freed before the next pass, so
  // a device that fits one copy of it replays any number of passes.
  Trace trace;
  trace.name = "passes";
  trace.format = "test";
  trace.num_blocks = 2;
  trace.events = {Event{Op::alloc, 0, 300 * MiB, kDefaultStream, -1},
                  Event{Op::alloc, 1, 100 * MiB, kDefaultStream, -1},
                  Event{Op::free, 1, 100 * MiB, kDefaultStream, -1}};
  ReplayOptions options;
  options.capacity_bytes = 1 * GiB;
  options.passes = 3;
  auto result = replay_mode(trace, Mode::growth, options);
  ASSERT_TRUE(result) << result.error().message();
  ASSERT_EQ(result->passes.size(), 3u);
  EXPECT_EQ(result->ooms, 0u);
  EXPECT_EQ(result->events, 9u);
  EXPECT_GT(result->passes[0].device_calls.allocs, 0u);
  for (std::size_t pass = 1; pass < 3; ++pass) {
    EXPECT_EQ(result->passes[pass].events, 3u);
    EXPECT_EQ(result->passes[pass].device_calls.total(), 0u) << "pass " << pass;
    EXPECT_EQ(result->passes[pass].peak_reserved_bytes, result->passes[0].peak_reserved_bytes);
  }
  EXPECT_EQ(result->device_calls.allocs, result->passes[0].device_calls.allocs);
  EXPECT_EQ(result->peak_live_bytes, 400 * MiB);

  // Blocks freed between passes count their device calls in the pass they
  // end: with a release threshold of 0 the pool releases the 300 MiB block's
  // granules at that free, and every call is in some pass.
  options.passes = 3;
  options.config.release_threshold.value = 0;
  auto releasing = replay_mode(trace, Mode::expandable, options);
  ASSERT_TRUE(releasing) << releasing.error().message();
  DeviceCalls summed;
  for (const PassReplay& pass : releasing->passes) {
    summed.creates += pass.device_calls.creates;
    summed.releases += pass.device_calls.releases;
    summed.maps += pass.device_calls.maps;
    summed.unmaps += pass.device_calls.unmaps;
  }
  EXPECT_EQ(summed.creates, releasing->device_calls.creates);
  EXPECT_EQ(summed.releases, releasing->device_calls.releases);
  EXPECT_EQ(summed.maps, releasing->device_calls.maps);
  EXPECT_EQ(summed.unmaps, releasing->device_calls.unmaps);
  for (std::size_t pass = 0; pass < 2; ++pass) {  // ended by a teardown: all it created goes back
    EXPECT_EQ(releasing->passes[pass].device_calls.releases, releasing->passes[pass].device_calls.creates)
        << "pass " << pass;
  }
  EXPECT_LT(releasing->passes[2].device_calls.releases, releasing->passes[2].device_calls.creates);

  options.passes = 0;
  auto none = replay_mode(trace, Mode::growth, options);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), Errc::invalid_argument);
  EXPECT_NE(none.error().message().find("passes 0"), std::string::npos);
}

}  // namespace
}  // namespace tidepool::trace
