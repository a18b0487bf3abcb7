// The replay engine on small traces whose figures are worked out by hand
// from the pools' documented policies (BFC's doubling regions, the memory
// fraction, page-rounded plain allocations), and on the real PyTorch
// snapshots in tests/data.
#include "tidepool/replay.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tidepool/host_device.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "trace/trace_builder.hpp"

namespace tidepool::trace {
namespace {

ReplayOptions on_capacity(std::size_t capacity) {
  ReplayOptions options;
  options.capacity_bytes = capacity;
  return options;  // Config's defaults: JAX's fraction 0.75
}

ModeReplay replay_one(const Trace& trace, Mode mode, const ReplayOptions& options) {
  auto result = replay_mode(trace, mode, options);
  EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message());
  return result ? *result : ModeReplay{};
}

TEST(Replay, PreallocateReservesTheFractionFromTheFirstEvent) {
  TraceBuilder builder;
  const auto block = builder.alloc(100 * MiB);
  builder.free(block);
  const ModeReplay result = replay_one(builder.trace(), Mode::preallocate, on_capacity(1 * GiB));
  EXPECT_EQ(result.initial_reserved_bytes, 768 * MiB);  // 0.75 x 1 GiB
  EXPECT_EQ(result.peak_reserved_bytes, 768 * MiB);
  EXPECT_EQ(result.final_reserved_bytes, 768 * MiB);
  EXPECT_DOUBLE_EQ(result.average_reserved_bytes, static_cast<double>(768 * MiB));
  ASSERT_FALSE(result.series.empty());
  for (const SeriesPoint& point : result.series) EXPECT_EQ(point.reserved_bytes, 768 * MiB);
  EXPECT_EQ(result.peak_live_bytes, 100 * MiB);
  EXPECT_DOUBLE_EQ(result.fragmentation, 7.68);
  EXPECT_EQ(result.device_calls.allocs, 1u);
  EXPECT_EQ(result.device_calls.frees, 0u);
  EXPECT_EQ(result.events, 2u);
  EXPECT_EQ(result.ooms, 0u);
  ASSERT_TRUE(result.address_high_water_bytes.has_value());
  EXPECT_EQ(*result.address_high_water_bytes, 100 * MiB);  // the one block starts the region
}

TEST(Replay, GrowthTakesDoublingRegions) {
  // BFC's growth: a first region of 2 MiB, then each region twice the last.
  TraceBuilder builder;
  const auto small = builder.alloc(1 * MiB);    // region 1: 2 MiB
  const auto larger = builder.alloc(3 * MiB);   // does not fit the 1 MiB left: region 2, 4 MiB
  builder.free(small);
  builder.free(larger);
  const ModeReplay result = replay_one(builder.trace(), Mode::growth, on_capacity(1 * GiB));
  EXPECT_EQ(result.initial_reserved_bytes, 0u);
  EXPECT_EQ(result.peak_live_bytes, 4 * MiB);
  // BFC splits a free chunk only when it is at least twice the request: the
  // 3 MiB block takes the whole 4 MiB region, so 1 + 4 MiB are in use.
  EXPECT_EQ(result.peak_live_rounded_bytes, 5 * MiB);
  EXPECT_EQ(result.peak_reserved_bytes, 6 * MiB);
  EXPECT_DOUBLE_EQ(result.fragmentation, 1.5);
  EXPECT_EQ(result.device_calls.allocs, 2u);
  EXPECT_FALSE(result.address_high_water_bytes.has_value());
  // Reserved after each event: 2, 6, 6, 6 MiB; every event weighs the same.
  EXPECT_DOUBLE_EQ(result.average_reserved_bytes, static_cast<double>(20 * MiB) / 4);
}

TEST(Replay, TimedTracesWeighTheAverageByTime) {
  TraceBuilder builder;
  const auto first = builder.alloc(1 * MiB, 0);  // 2 MiB held from t=0 ...
  const auto second = builder.alloc(3 * MiB, 10);  // ... then 6 MiB from t=10 to t=40
  builder.free(first, 40);
  builder.free(second, 40);
  const ModeReplay result = replay_one(builder.trace(), Mode::growth, on_capacity(1 * GiB));
  EXPECT_DOUBLE_EQ(result.average_reserved_bytes, static_cast<double>(2 * MiB * 10 + 6 * MiB * 30) / 40);
  ASSERT_FALSE(result.series.empty());
  EXPECT_EQ(result.series.front().x, 0);
  EXPECT_EQ(result.series.back().x, 40);
}

/// 512 MiB, 512 MiB, then 1 MiB, all live at once, on a 1 GiB device.
Trace oom_trace() {
  TraceBuilder builder("oom");
  const auto a = builder.alloc(512 * MiB);
  const auto b = builder.alloc(512 * MiB);
  const auto c = builder.alloc(1 * MiB);
  builder.free(c);
  builder.free(b);
  builder.free(a);
  return builder.trace();
}

TEST(Replay, PreallocateRefusesWhatExceedsItsRegion) {
  // The region is 768 MiB: the second 512 MiB cannot fit; the 1 MiB can.
  const ModeReplay result = replay_one(oom_trace(), Mode::preallocate, on_capacity(1 * GiB));
  EXPECT_EQ(result.ooms, 1u);
  ASSERT_TRUE(result.first_oom.has_value());
  EXPECT_EQ(result.first_oom->event_index, 1u);
  EXPECT_EQ(result.first_oom->block, 1u);
  EXPECT_EQ(result.first_oom->requested_bytes, 512 * MiB);
  EXPECT_EQ(result.first_oom->report.requested_bytes, 512 * MiB);
  EXPECT_FALSE(result.first_oom->message.empty());
  // Peak live is the trace's; what the mode served leaves the refused block out.
  EXPECT_EQ(result.peak_live_bytes, 1025 * MiB);
  EXPECT_EQ(result.served_peak_live_bytes, 513 * MiB);
  EXPECT_DOUBLE_EQ(result.fragmentation, 768.0 / 1025.0);
  EXPECT_EQ(result.peak_reserved_bytes, 768 * MiB);
  EXPECT_EQ(result.stats.bytes_in_use, 0);        // its skipped free changed nothing
}

TEST(Replay, GrowthRefusesPastTheLimitThenGrowsIntoWhatIsLeft) {
  // Region 1 is 512 MiB; 256 MiB of the limit is left, too little for the
  // second 512 MiB; the 1 MiB gets a region of the 256 MiB left.
  const ModeReplay result = replay_one(oom_trace(), Mode::growth, on_capacity(1 * GiB));
  EXPECT_EQ(result.ooms, 1u);
  ASSERT_TRUE(result.first_oom.has_value());
  EXPECT_EQ(result.first_oom->event_index, 1u);
  EXPECT_EQ(result.peak_reserved_bytes, 768 * MiB);
  EXPECT_EQ(result.device_calls.allocs, 2u);
}

TEST(Replay, PlatformHasNoFractionAndFailsOnlyWhenTheDeviceIsFull) {
  const ModeReplay result = replay_one(oom_trace(), Mode::platform, on_capacity(1 * GiB));
  EXPECT_EQ(result.ooms, 1u);
  ASSERT_TRUE(result.first_oom.has_value());
  EXPECT_EQ(result.first_oom->event_index, 2u);
  EXPECT_EQ(result.first_oom->requested_bytes, 1 * MiB);
  EXPECT_EQ(result.peak_live_bytes, 1025 * MiB);
  EXPECT_EQ(result.served_peak_live_bytes, 1 * GiB);
  EXPECT_EQ(result.peak_reserved_bytes, 1 * GiB);
  EXPECT_EQ(result.final_reserved_bytes, 0u);
  EXPECT_EQ(result.device_calls.allocs, 2u);
  EXPECT_EQ(result.device_calls.frees, 2u);
}

Trace one_block(std::uint64_t bytes) {
  TraceBuilder builder("one-block");
  builder.free(builder.alloc(bytes));
  return builder.trace();
}

TEST(Replay, MinCapacityOfPlatformIsThePeak) {
  auto found = find_min_capacity(one_block(100 * MiB), Mode::platform, 1 * GiB, {});
  ASSERT_TRUE(found) << found.error().message();
  ASSERT_TRUE(found->bytes.has_value());
  EXPECT_EQ(*found->bytes, 100 * MiB);
  EXPECT_GT(found->probes, 1u);
}

TEST(Replay, MinCapacityOfTheBfcModesIncludesTheFraction) {
  // 0.75 x 134 MiB = 100.5 MiB holds the block; 0.75 x 132 MiB = 99 MiB does not.
  for (const Mode mode : {Mode::preallocate, Mode::growth}) {
    auto found = find_min_capacity(one_block(100 * MiB), mode, 1 * GiB, {});
    ASSERT_TRUE(found) << found.error().message();
    ASSERT_TRUE(found->bytes.has_value()) << mode_name(mode);
    EXPECT_EQ(*found->bytes, 134 * MiB) << mode_name(mode);
  }
}

TEST(Replay, MinCapacitySearchesAboveTheGivenCapacity) {
  auto found = find_min_capacity(one_block(100 * MiB), Mode::platform, 64 * MiB, {});
  ASSERT_TRUE(found) << found.error().message();
  ASSERT_TRUE(found->bytes.has_value());
  EXPECT_EQ(*found->bytes, 100 * MiB);
}

TEST(Replay, MinCapacityIsReportedAsARatioToPeakLive) {
  ReplayOptions options = on_capacity(1 * GiB);
  options.find_min_capacity = true;
  const ModeReplay result = replay_one(one_block(100 * MiB), Mode::growth, options);
  ASSERT_TRUE(result.min_capacity_bytes.has_value());
  EXPECT_EQ(*result.min_capacity_bytes, 134 * MiB);
  EXPECT_DOUBLE_EQ(result.min_capacity_ratio(), 1.34);
}

TEST(Replay, MinLimitMeasuresThePoolNotTheFraction) {
  // At fraction 0.75 growth needs a 134 MiB device for a 100 MiB block; the
  // limit it needs (the search at fraction 1) is the block itself.
  ReplayOptions options = on_capacity(1 * GiB);
  options.find_min_capacity = true;
  for (const Mode mode : {Mode::preallocate, Mode::growth, Mode::platform}) {
    const ModeReplay result = replay_one(one_block(100 * MiB), mode, options);
    ASSERT_TRUE(result.min_limit_bytes.has_value()) << mode_name(mode);
    EXPECT_EQ(*result.min_limit_bytes, 100 * MiB) << mode_name(mode);
    EXPECT_DOUBLE_EQ(result.min_limit_ratio(), 1.0) << mode_name(mode);
    EXPECT_GT(result.min_limit_probes, 1u) << mode_name(mode);
  }
  ReplayOptions half = options;
  half.config.mem_fraction.value = 0.5;
  const ModeReplay growth = replay_one(one_block(100 * MiB), Mode::growth, half);
  ASSERT_TRUE(growth.min_capacity_bytes.has_value());
  EXPECT_EQ(*growth.min_capacity_bytes, 200 * MiB);
  EXPECT_EQ(*growth.min_limit_bytes, 100 * MiB);
}

TEST(Replay, ACapacityOffTheGranularityIsRoundedUp) {
  EXPECT_EQ(replay_granularity(), 2 * MiB);
  const ModeReplay result = replay_one(one_block(1 * MiB), Mode::platform, on_capacity(100 * MiB + 1));
  EXPECT_EQ(result.capacity_bytes, 102 * MiB);
  EXPECT_EQ(result.ooms, 0u);
}

/// Weights live before recording began (seeded, as the readers do), then a
/// window that allocates and frees activations.
Trace seeded_trace() {
  TraceBuilder builder("seeded");
  builder.segment(Op::segment_alloc, 700 * MiB);  // what PyTorch held at the start
  const auto weights = builder.alloc(400 * MiB);
  const auto freed_weight = builder.alloc(100 * MiB);
  const auto activation = builder.alloc(150 * MiB);
  builder.free(freed_weight);
  builder.free(activation);
  Trace trace = builder.trace();
  trace.seeded_blocks = 2;
  trace.seeded_bytes = 500 * MiB;
  trace.unmatched_frees = 1;
  (void)weights;
  return trace;
}

TEST(Replay, SeededBlocksCountInPeakLiveEveryModeAndTheRecordedRow) {
  const std::vector<Mode> modes = {Mode::preallocate, Mode::growth, Mode::platform, Mode::expandable};
  auto replayed = replay(seeded_trace(), modes, on_capacity(2 * GiB));
  ASSERT_TRUE(replayed) << replayed.error().message();
  EXPECT_EQ(replayed->seeded_blocks, 2u);
  EXPECT_EQ(replayed->seeded_bytes, 500 * MiB);
  EXPECT_EQ(replayed->peak_live_bytes, 650 * MiB);
  for (const ModeReplay& mode : replayed->modes) {
    SCOPED_TRACE(mode_name(mode.mode));
    EXPECT_EQ(mode.ooms, 0u);
    EXPECT_EQ(mode.peak_live_bytes, 650 * MiB);
    EXPECT_EQ(mode.served_peak_live_bytes, 650 * MiB);
    EXPECT_GE(mode.peak_reserved_bytes, 650 * MiB);  // every mode holds the weights
    EXPECT_GE(mode.stats.bytes_in_use, static_cast<std::int64_t>(400 * MiB));  // still live at the end
  }
  ASSERT_TRUE(replayed->recorded.has_value());
  EXPECT_EQ(replayed->recorded->initial_reserved_bytes, 0u);  // the reader's leading segment_alloc holds it
  EXPECT_EQ(replayed->recorded->peak_reserved_bytes, 700 * MiB);
  EXPECT_DOUBLE_EQ(replayed->recorded->fragmentation, 700.0 / 650.0);
}

TEST(Replay, VerifyContentsWritesAndChecksEveryBlock) {
  TraceBuilder builder;
  std::vector<std::uint32_t> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(builder.alloc(1000 + 4096 * static_cast<std::uint64_t>(i)));
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) builder.free(*it);
  ReplayOptions options = on_capacity(256 * MiB);
  options.verify_contents = true;
  for (const Mode mode : {Mode::preallocate, Mode::growth, Mode::platform}) {
    auto result = replay_mode(builder.trace(), mode, options);
    ASSERT_TRUE(result) << mode_name(mode) << ": " << result.error().message();
    EXPECT_EQ(result->ooms, 0u);
  }
}

// The GPU replay's hooks (bench/gpu_replay_bench), here with a host device:
// the replay runs on the device given, and every block handed out is touched.
TEST(Replay, RunsOnTheDeviceGivenAndTouchesEveryBlock) {
  TraceBuilder builder;
  const std::uint32_t a = builder.alloc(3 * MiB);
  const std::uint32_t b = builder.alloc(5000);
  builder.free(a);
  builder.free(b);
  ReplayOptions options = on_capacity(256 * MiB);
  int made = 0;
  options.device = [&made]() -> Expected<std::shared_ptr<Device>> {
    ++made;
    HostDeviceOptions host;
    host.capacity = 64 * MiB;
    auto device = HostDevice::create(host);
    if (!device) return std::move(device).error();
    return std::shared_ptr<Device>(std::move(*device));
  };
  std::vector<std::size_t> touched;
  options.touch = [&touched](void* ptr, std::size_t bytes, Stream) -> Status {
    std::memset(ptr, 0xA5, bytes);  // real memory: the pool handed out at least `bytes`
    touched.push_back(bytes);
    return {};
  };
  auto result = replay_mode(builder.trace(), Mode::growth, options);
  ASSERT_TRUE(result) << result.error().message();
  EXPECT_EQ(made, 1);
  EXPECT_EQ(touched, (std::vector<std::size_t>{3 * MiB, 5000}));
  // The device given, not the 256 MiB host device: 75% of its 64 MiB is the limit.
  EXPECT_EQ(result->stats.bytes_limit, static_cast<std::int64_t>(48 * MiB));

  options.touch = [](void*, std::size_t, Stream) -> Status { return Error(Errc::device_error, "no memset"); };
  auto refused = replay_mode(builder.trace(), Mode::growth, options);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message(), "no memset");
}

TEST(Replay, InconsistentTracesAreErrorsNamingTheEvent) {
  Trace trace = one_block(1 * MiB);
  trace.events.push_back(trace.events.back());  // the block freed twice
  auto result = replay_mode(trace, Mode::growth, on_capacity(1 * GiB));
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code(), Errc::corrupt_data);
  EXPECT_NE(result.error().message().find("event 2"), std::string::npos) << result.error().message();

  Trace beyond = one_block(1 * MiB);
  beyond.events[1].block = 7;
  result = replay_mode(beyond, Mode::growth, on_capacity(1 * GiB));
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message().find("block 7"), std::string::npos) << result.error().message();
}

TEST(Replay, SeriesIsDownsampledAndKeepsThePeak) {
  TraceBuilder builder;
  std::vector<std::uint32_t> blocks;
  for (int i = 0; i < 5000; ++i) blocks.push_back(builder.alloc(4096));
  for (const auto block : blocks) builder.free(block);
  ReplayOptions options = on_capacity(1 * GiB);
  options.max_series_points = 100;
  const ModeReplay result = replay_one(builder.trace(), Mode::growth, options);
  EXPECT_LE(result.series.size(), 101u);
  EXPECT_GE(result.series.size(), 50u);
  std::uint64_t highest = 0;
  for (const SeriesPoint& point : result.series) highest = std::max(highest, point.live_bytes);
  EXPECT_EQ(highest, 5000u * 4096u);
  EXPECT_EQ(highest, result.peak_live_bytes);
}

TEST(Replay, ReplayRunsEachModeAndAddsTheRecordedRow) {
  TraceBuilder builder;
  builder.segment(Op::segment_alloc, 20 * MiB);
  const auto block = builder.alloc(10 * MiB);
  builder.segment(Op::segment_alloc, 20 * MiB);
  builder.free(block);
  builder.segment(Op::segment_free, 40 * MiB);
  const std::vector<Mode> modes = {Mode::preallocate, Mode::growth, Mode::platform};
  auto result = replay(builder.trace(), modes, on_capacity(1 * GiB));
  ASSERT_TRUE(result) << result.error().message();
  ASSERT_EQ(result->modes.size(), 3u);
  EXPECT_EQ(result->modes[0].mode, Mode::preallocate);
  EXPECT_EQ(result->modes[2].mode, Mode::platform);
  EXPECT_EQ(result->events, 5u);
  EXPECT_DOUBLE_EQ(result->mem_fraction, 0.75);
  ASSERT_TRUE(result->recorded.has_value());
  EXPECT_EQ(result->recorded->peak_reserved_bytes, 40 * MiB);
  EXPECT_EQ(result->recorded->initial_reserved_bytes, 0u);
  // Reserved after each event: 20, 20, 40, 40, 0 MiB.
  EXPECT_DOUBLE_EQ(result->recorded->average_reserved_bytes, static_cast<double>(120 * MiB) / 5);
  EXPECT_DOUBLE_EQ(result->recorded->fragmentation, 4.0);
  EXPECT_EQ(result->planned_footprint_bytes, 10 * MiB);  // the one block

  // A caller replaying mode by mode plans the trace once.
  ReplayOptions unplanned = on_capacity(1 * GiB);
  unplanned.plan = false;
  auto again = replay(builder.trace(), modes, unplanned);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_FALSE(again->planned_footprint_bytes);
}

TEST(Replay, RecordedRowCountsSegmentsHeldBeforeTheRecordBegan) {
  TraceBuilder builder;
  builder.segment(Op::segment_free, 8 * MiB);  // a segment allocated before the ring buffer's start
  builder.segment(Op::segment_alloc, 2 * MiB);
  auto recorded = recorded_reserved(builder.trace(), 100);
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(recorded->initial_reserved_bytes, 8 * MiB);
  EXPECT_EQ(recorded->peak_reserved_bytes, 8 * MiB);
}

TEST(Replay, NoRecordedRowWithoutSegments) {
  EXPECT_FALSE(recorded_reserved(one_block(1 * MiB), 100).has_value());
}

TEST(Replay, UnsupportedModesAreErrors) {
  auto result = replay_mode(one_block(1 * MiB), Mode::cuda_async, on_capacity(1 * GiB));
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code(), Errc::unsupported);
}

TEST(Replay, DefaultModesAllRunOnTheHost) {
  const std::vector<Mode> modes = default_replay_modes();
  ASSERT_FALSE(modes.empty());
  auto result = replay(one_block(1 * MiB), modes, on_capacity(1 * GiB));
  ASSERT_TRUE(result) << result.error().message();
  EXPECT_EQ(result->modes.size(), modes.size());
}

TEST(Replay, RealPytorchSnapshotsReplayUnderEveryMode) {
  for (const char* file : {"cs336-magma27.pickle", "cs336-bcrafton.pickle"}) {
    const std::string path = std::string(TIDEPOOL_TEST_DATA) + "/pytorch/" + file;
    auto loaded = read_trace(path);
    ASSERT_TRUE(loaded) << loaded.error().message();
    auto summary = summarize(*loaded);
    ASSERT_TRUE(summary) << summary.error().message();
    const std::vector<Mode> modes = default_replay_modes();
    auto result = replay(*loaded, modes, on_capacity(80 * GiB));
    ASSERT_TRUE(result) << file << ": " << result.error().message();
    ASSERT_EQ(result->modes.size(), modes.size());
    for (const ModeReplay& mode : result->modes) {
      SCOPED_TRACE(std::string(file) + " " + std::string(mode_name(mode.mode)));
      EXPECT_EQ(mode.ooms, 0u);
      EXPECT_EQ(mode.peak_live_bytes, summary->peak_live_bytes);
      EXPECT_GE(mode.peak_reserved_bytes, mode.peak_live_bytes);
      EXPECT_GE(mode.peak_live_rounded_bytes, mode.peak_live_bytes);
      EXPECT_EQ(mode.events, summary->allocs + summary->frees);
    }
    ASSERT_TRUE(result->recorded.has_value()) << file;
    EXPECT_EQ(result->recorded->label, "PyTorch (recorded)");
    EXPECT_EQ(result->recorded->peak_reserved_bytes, summary->peak_segment_bytes);
    // The weights live before recording began are seeded: the recorded row's
    // ratio is over the same peak live as the modes', and honest (near 1x).
    EXPECT_EQ(result->seeded_blocks, loaded->seeded_blocks);
    EXPECT_GT(result->seeded_blocks, 200u);
    EXPECT_EQ(result->peak_live_bytes, summary->peak_live_bytes);
    EXPECT_DOUBLE_EQ(result->recorded->fragmentation, static_cast<double>(summary->peak_segment_bytes) /
                                                          static_cast<double>(summary->peak_live_bytes));
    EXPECT_LT(result->recorded->fragmentation, 1.2);
  }
}

}  // namespace
}  // namespace tidepool::trace
