#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tidepool/trace_io.hpp"
#include "trace/pickle_builder.hpp"

namespace tidepool::trace {
namespace {

using ::testing::HasSubstr;
namespace build = test::pickle;

std::string read_data(const std::string& name) {
  std::ifstream file(std::string{TIDEPOOL_TEST_DATA} + "/pytorch/" + name, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  if (!file || contents.str().empty()) throw std::runtime_error("cannot read test data " + name);
  return contents.str();
}

// The figures tests/data/pytorch/expected.py prints, computed with Python's
// own pickle module (see tests/data/pytorch/README.md).
struct Figures {
  const char* file;
  std::size_t events, blocks, frees, unmatched_frees, segment_events, seeded_blocks;
  std::uint64_t seeded_bytes, total_alloc_bytes, peak_live_bytes;
  std::size_t live_blocks_at_end;
  std::uint64_t live_bytes_at_end, peak_segment_bytes, segment_bytes_at_end;
};
const Figures kExpected[] = {
    {"cs336-magma27.pickle", 3672, 1950, 1721, 2, 1, 229, 1373919236, 60264219843, 13923997700, 229, 1373919236,
     14180941824, 14180941824},
    {"cs336-bcrafton.pickle", 4772, 2609, 2162, 222, 1, 447, 3064418304, 14745388552, 3849232640, 447, 3064418304,
     4238344192, 4238344192},
};

TEST(PytorchSnapshot, RealSnapshotsGiveTheIndependentlyComputedFigures) {
  for (const Figures& expected : kExpected) {
    SCOPED_TRACE(expected.file);
    const std::string data = read_data(expected.file);
    auto trace = read_pytorch_snapshot(data, expected.file);
    ASSERT_TRUE(trace) << trace.error().message();
    EXPECT_EQ(trace->format, "pytorch-snapshot");
    EXPECT_EQ(trace->device, 0);
    EXPECT_EQ(trace->events.size(), expected.events);
    EXPECT_EQ(trace->num_blocks, expected.blocks);
    EXPECT_EQ(trace->unmatched_frees, expected.unmatched_frees);
    EXPECT_EQ(trace->seeded_blocks, expected.seeded_blocks);
    EXPECT_EQ(trace->seeded_bytes, expected.seeded_bytes);
    EXPECT_EQ(trace->failed_allocs, 0u);
    EXPECT_TRUE(trace->warnings.empty());
    EXPECT_TRUE(trace->has_segments);
    auto summary = summarize(*trace);
    ASSERT_TRUE(summary) << summary.error().message();
    EXPECT_EQ(summary->allocs, expected.blocks);
    EXPECT_EQ(summary->frees, expected.frees);
    EXPECT_EQ(summary->segment_events, expected.segment_events);
    EXPECT_EQ(summary->total_alloc_bytes, expected.total_alloc_bytes);
    EXPECT_EQ(summary->peak_live_bytes, expected.peak_live_bytes);
    EXPECT_EQ(summary->live_blocks_at_end, expected.live_blocks_at_end);
    EXPECT_EQ(summary->live_bytes_at_end, expected.live_bytes_at_end);
    EXPECT_EQ(summary->peak_segment_bytes, expected.peak_segment_bytes);
    EXPECT_EQ(summary->segment_bytes_at_end, expected.segment_bytes_at_end);
    // The reserved bytes before the window lead, at the first entry's time.
    ASSERT_FALSE(trace->events.empty());
    EXPECT_EQ(trace->events[0].op, Op::segment_alloc);
    EXPECT_EQ(trace->events[0].bytes, expected.peak_segment_bytes);
    EXPECT_GT(trace->events[0].time_us, 0);
    EXPECT_EQ(trace->events[0].time_us, trace->events[1].time_us);
  }
}

TEST(PytorchSnapshot, ReadTraceTellsTheFormatByContent) {
  auto trace = read_trace(std::string{TIDEPOOL_TEST_DATA} + "/pytorch/cs336-magma27.pickle");
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->name, "cs336-magma27.pickle");
  EXPECT_EQ(trace->events.size(), kExpected[0].events);
}

TEST(PytorchSnapshot, SampledPrefixesOfARealSnapshotAreErrors) {
  const std::string data = read_data("cs336-bcrafton.pickle");
  for (std::size_t i = 0; i < 400; ++i) {
    const std::size_t length = data.size() * i / 400 + i % 7;
    auto trace = read_pytorch_snapshot(std::string_view(data).substr(0, length), "prefix");
    ASSERT_FALSE(trace) << length;
    EXPECT_EQ(trace.error().code(), Errc::corrupt_data);
    EXPECT_THAT(trace.error().message(), HasSubstr("prefix: pickle: "));
  }
  // The last byte (STOP) missing.
  auto trace = read_pytorch_snapshot(std::string_view(data).substr(0, data.size() - 1), "prefix");
  ASSERT_FALSE(trace);
  EXPECT_THAT(trace.error().message(), HasSubstr("at byte offset"));
}

TEST(PytorchSnapshot, FlippedBytesOfARealSnapshotNeverCrash) {
  const std::string original = read_data("cs336-magma27.pickle");
  std::size_t errors = 0;
  for (std::size_t i = 0; i < 300; ++i) {
    std::string data = original;
    const std::size_t at = (i * 7919 * 613) % data.size();
    data[at] = static_cast<char>(static_cast<unsigned char>(data[at]) ^ (1u << (i % 8)));
    auto trace = read_pytorch_snapshot(data, "flipped");
    if (!trace) {
      ++errors;
      EXPECT_FALSE(trace.error().message().empty());
    } else {
      EXPECT_TRUE(summarize(*trace)) << "byte " << at;  // whatever it read is a consistent trace
    }
  }
  EXPECT_GT(errors, 0u);
}

TEST(PytorchSnapshot, ASnapshotWithAGlobalIsRefused) {
  // A snapshot dict whose frames hold a class lookup and call.
  const std::string data = build::pickle(build::dict(
      {{"segments", build::list({})}, {"device_traces", "cos\nsystem\n" + build::str("true") + "\x85R"}}));
  auto trace = read_pytorch_snapshot(data, "evil.pickle");
  ASSERT_FALSE(trace);
  EXPECT_EQ(trace.error().code(), Errc::corrupt_data);
  EXPECT_THAT(trace.error().message(), HasSubstr("evil.pickle: pickle: opcode GLOBAL (0x63) refused"));
}

TEST(PytorchSnapshot, AllocAndFreeCompletedMakeLifetimes) {
  const std::string data = build::snapshot({{
      build::entry("alloc", 0x1000, 100, 7, 10),
      build::entry("alloc", 0x2000, 200, 0, 11),
      build::entry("free_requested", 0x1000, 100, 7, 12),
      build::entry("free_completed", 0x9000, 50, 0, 13),  // its alloc fell out of the ring buffer
      build::entry("free_completed", 0x1000, 100, 7, 14),
      build::entry("oom", 0, 1 << 30, 0, 15),
      build::entry("snapshot", 0, 0, 0, 16),
      build::entry("alloc", 0x1000, 300, 7, 17),  // the address again, after its free
  }});
  auto trace = read_pytorch_snapshot(data, "small");
  ASSERT_TRUE(trace) << trace.error().message();
  // The free without its alloc seeds block 0, allocated before event 0.
  EXPECT_EQ(trace->num_blocks, 4u);
  EXPECT_EQ(trace->seeded_blocks, 1u);
  EXPECT_EQ(trace->seeded_bytes, 50u);
  EXPECT_EQ(trace->unmatched_frees, 1u);
  EXPECT_EQ(trace->failed_allocs, 1u);
  EXPECT_FALSE(trace->has_segments);  // no segments at dump, none in the window
  ASSERT_EQ(trace->events.size(), 6u);
  EXPECT_EQ(trace->events[0].op, Op::alloc);  // the seeded block, at the first entry's time
  EXPECT_EQ(trace->events[0].block, 0u);
  EXPECT_EQ(trace->events[0].bytes, 50u);
  EXPECT_EQ(trace->events[0].time_us, 10);
  EXPECT_EQ(trace->events[1].op, Op::alloc);
  EXPECT_EQ(trace->events[1].block, 1u);
  EXPECT_EQ(trace->events[1].stream, Stream{7});
  EXPECT_EQ(trace->events[1].time_us, 10);
  EXPECT_EQ(trace->events[3].op, Op::free);  // the seeded block's free
  EXPECT_EQ(trace->events[3].block, 0u);
  EXPECT_EQ(trace->events[3].time_us, 13);
  EXPECT_EQ(trace->events[4].op, Op::free);
  EXPECT_EQ(trace->events[4].block, 1u);
  EXPECT_EQ(trace->events[4].bytes, 100u);
  EXPECT_EQ(trace->events[4].time_us, 14);  // free_completed, not free_requested
  EXPECT_EQ(trace->events[5].block, 3u);
  EXPECT_EQ(trace->events[5].bytes, 300u);
  // The oom is kept with its place (before the last alloc), size and time.
  ASSERT_EQ(trace->failures.size(), 1u);
  EXPECT_EQ(trace->failures[0].before_event, 5u);
  EXPECT_EQ(trace->failures[0].bytes, std::uint64_t{1} << 30);
  EXPECT_EQ(trace->failures[0].time_us, 15);
  auto summary = summarize(*trace);
  ASSERT_TRUE(summary);
  EXPECT_EQ(summary->peak_live_bytes, 50u + 100u + 200u + 300u - 100u - 50u);
}

// The weights of a model loaded before recording began: one freed in the
// window (a free without alloc), two live at dump and never named by an
// event (active blocks of `segments`). All three are seeded; a block the
// window allocates and a free block at dump are not.
TEST(PytorchSnapshot, BlocksLiveBeforeRecordingAreSeeded) {
  constexpr std::int64_t M = 1 << 20;
  const std::string data = build::snapshot(
      {{build::entry("alloc", 0x3000000, 4 * M, 0, 100), build::entry("free_completed", 0x1000000, 2 * M, 0, 101),
        build::entry("alloc", 0x4000000, 1 * M, 0, 102), build::entry("free_completed", 0x4000000, 1 * M, 0, 103)}},
      {build::segment(0, 0x2000000, 20 * M,
                      {build::block(0x2000000, 8 * M, 8 * M - 3, "active_allocated"),
                       build::block(0x2800000, 6 * M, 6 * M, "inactive"),
                       build::block(0x2e00000, 6 * M, 5 * M, "active_allocated")}),
       build::segment(0, 0x3000000, 4 * M, {build::block(0x3000000, 4 * M, 4 * M, "active_allocated")})});
  auto trace = read_pytorch_snapshot(data, "weights");
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->seeded_blocks, 3u);
  EXPECT_EQ(trace->seeded_bytes, static_cast<std::uint64_t>(2 * M + 8 * M - 3 + 5 * M));
  EXPECT_EQ(trace->num_blocks, 5u);
  // A leading segment_alloc (reserved before the window), then the seeded
  // allocs in their documented order: the free's block, then the dump's.
  ASSERT_EQ(trace->events.size(), 1u + 3u + 4u);
  EXPECT_EQ(trace->events[0].op, Op::segment_alloc);
  EXPECT_EQ(trace->events[1].bytes, static_cast<std::uint64_t>(2 * M));
  EXPECT_EQ(trace->events[2].bytes, static_cast<std::uint64_t>(8 * M - 3));
  EXPECT_EQ(trace->events[3].bytes, static_cast<std::uint64_t>(5 * M));
  for (std::size_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(trace->events[i].op, Op::alloc);
    EXPECT_EQ(trace->events[i].block, i - 1);
    EXPECT_EQ(trace->events[i].time_us, 100);
  }
  EXPECT_EQ(trace->events[4].block, 3u);  // the window's first alloc comes after the seeded
  EXPECT_EQ(trace->events[5].op, Op::free);
  EXPECT_EQ(trace->events[5].block, 0u);
  auto summary = summarize(*trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->peak_live_bytes, static_cast<std::uint64_t>(2 * M + 8 * M - 3 + 5 * M + 4 * M));
  EXPECT_EQ(summary->live_blocks_at_end, 3u);
}

TEST(PytorchSnapshot, EveryDeviceBecomesItsOwnTrace) {
  const std::string data = build::snapshot({{build::entry("alloc", 0x1000, 100, 0, 1)},
                                            {},
                                            {build::entry("alloc", 0x1000, 300, 0, 1),
                                             build::entry("free_completed", 0x1000, 300, 0, 2)}});
  auto one = read_pytorch_snapshot(data, "multi.pickle");
  ASSERT_FALSE(one);
  EXPECT_THAT(one.error().message(), HasSubstr("device 0 (1 entries), device 2 (2 entries)"));
  EXPECT_THAT(one.error().message(), HasSubstr("--device"));
  auto every = read_pytorch_snapshot_devices(data, "multi.pickle");
  ASSERT_TRUE(every) << every.error().message();
  ASSERT_EQ(every->size(), 2u);
  EXPECT_EQ((*every)[0].name, "multi.pickle:dev0");
  EXPECT_EQ((*every)[0].device, 0);
  EXPECT_EQ((*every)[0].events.size(), 1u);
  EXPECT_EQ((*every)[1].name, "multi.pickle:dev2");
  EXPECT_EQ((*every)[1].device, 2);
  EXPECT_EQ((*every)[1].events.size(), 2u);
  auto second = read_pytorch_snapshot(data, "multi.pickle", SnapshotOptions{2});
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_EQ(second->name, "multi.pickle");
  EXPECT_EQ(second->events.size(), 2u);
}

TEST(PytorchSnapshot, AnEmptyHistoryWarnsWithTheCallThatRecordsOne) {
  for (const std::string& data : {build::snapshot({{}}), build::snapshot({{build::entry("snapshot", 0, 0, 0, 1)}})}) {
    auto trace = read_pytorch_snapshot(data, "empty.pickle");
    ASSERT_TRUE(trace) << trace.error().message();
    ASSERT_EQ(trace->warnings.size(), 1u);
    EXPECT_THAT(trace->warnings[0], HasSubstr("empty.pickle: the snapshot's history has no allocation"));
    EXPECT_THAT(trace->warnings[0], HasSubstr("torch.cuda.memory._record_memory_history(max_entries="));
  }
}

TEST(PytorchSnapshot, SegmentEventsAndTheReservedBytesBeforeTheWindow) {
  // At dump: segments of 2 MiB and 20 MiB on device 0, one on device 1. The
  // window allocates the 20 MiB one, maps 2 MiB more then unmaps it, and frees
  // a 4 MiB one made before the window: so 2 + 4 MiB were held before it.
  constexpr std::int64_t M = 1 << 20;
  const std::string data = build::snapshot(
      {{build::entry("segment_alloc", 0x100000, 20 * M, 0, 5), build::entry("alloc", 0x100000, 1000, 0, 6),
        build::entry("segment_map", 0x900000, 2 * M, 0, 7), build::entry("segment_unmap", 0x900000, 2 * M, 0, 8),
        build::entry("segment_free", 0x500000, 4 * M, 0, 9)}},
      {build::segment(0, 0x200000, 2 * M), build::segment(0, 0x100000, 20 * M), build::segment(1, 0x0, 64 * M)});
  auto trace = read_pytorch_snapshot(data, "segments");
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_TRUE(trace->has_segments);
  ASSERT_EQ(trace->events.size(), 6u);
  EXPECT_EQ(trace->events[0].op, Op::segment_alloc);
  EXPECT_EQ(trace->events[0].bytes, static_cast<std::uint64_t>(6 * M));
  EXPECT_EQ(trace->events[0].time_us, 5);
  EXPECT_EQ(trace->events[3].op, Op::segment_alloc);  // segment_map
  EXPECT_EQ(trace->events[4].op, Op::segment_free);   // segment_unmap
  auto summary = summarize(*trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->peak_segment_bytes, static_cast<std::uint64_t>(28 * M));
  EXPECT_EQ(summary->segment_bytes_at_end, static_cast<std::uint64_t>(22 * M));
}

TEST(PytorchSnapshot, AWindowThatReturnsMoreThanTheDumpHeldStillBalances) {
  // Found by the trace_reader fuzzer: the dump lists no segment on this
  // device, yet the window unmaps 2 MiB before mapping any. The window itself
  // proves 2 MiB were held before it, so the trace starts with them.
  constexpr std::int64_t M = 1 << 20;
  const std::string data = build::snapshot(
      {{build::entry("segment_unmap", 0x100000, 2 * M, 0, 1), build::entry("alloc", 0x100000, 512, 0, 2),
        build::entry("segment_free", 0x300000, 4 * M, 0, 3), build::entry("segment_alloc", 0x300000, 8 * M, 0, 4)}},
      {build::segment(1, 0x0, 64 * M)});
  auto trace = read_pytorch_snapshot(data, "inconsistent");
  ASSERT_TRUE(trace) << trace.error().message();
  ASSERT_EQ(trace->events.size(), 5u);
  EXPECT_EQ(trace->events[0].op, Op::segment_alloc);
  EXPECT_EQ(trace->events[0].bytes, static_cast<std::uint64_t>(6 * M));
  auto summary = summarize(*trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->peak_segment_bytes, static_cast<std::uint64_t>(8 * M));
  EXPECT_EQ(summary->segment_bytes_at_end, static_cast<std::uint64_t>(8 * M));
}

TEST(PytorchSnapshot, ChoosesTheDeviceWithEventsOrTheOneAskedFor) {
  const std::string data = build::snapshot({{}, {build::entry("alloc", 0x10, 64)}});
  auto chosen = read_pytorch_snapshot(data, "two");
  ASSERT_TRUE(chosen) << chosen.error().message();
  EXPECT_EQ(chosen->device, 1);
  EXPECT_EQ(chosen->num_blocks, 1u);

  SnapshotOptions first;
  first.device = 0;
  auto empty = read_pytorch_snapshot(data, "two", first);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->device, 0);
  EXPECT_TRUE(empty->events.empty());

  SnapshotOptions missing;
  missing.device = 5;
  auto refused = read_pytorch_snapshot(data, "two", missing);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::invalid_argument);
  EXPECT_THAT(refused.error().message(), HasSubstr("device 5 requested, but the snapshot has traces for 2 devices"));

  const std::string both = build::snapshot({{build::entry("alloc", 0x10, 64)}, {build::entry("alloc", 0x10, 64)}});
  auto ambiguous = read_pytorch_snapshot(both, "both");
  ASSERT_FALSE(ambiguous);
  EXPECT_THAT(ambiguous.error().message(), HasSubstr("device 0 (1 entries), device 1 (1 entries)"));
}

TEST(PytorchSnapshot, BadEntriesNameWhereTheyAre) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {build::pickle(build::list({})), "the pickle holds a list, not a snapshot dict"},
      {build::pickle(build::dict({{"segments", build::list({})}})), "no 'device_traces'"},
      {build::snapshot({{build::none()}}), "device_traces[0][0] is a None, expected a dict"},
      {build::snapshot({{build::dict({{"addr", build::integer(1)}})}}), "device_traces[0][0] has no 'action'"},
      {build::snapshot({{build::dict({{"action", build::str("alloc")}, {"addr", build::str("x")}})}}),
       "device_traces[0][0]['addr'] is a str, expected a 64-bit int"},
      {build::snapshot({{build::entry("alloc", 0x10, -5)}}), "device_traces[0][0]['size'] is negative"},
      {build::snapshot({{build::entry("teleport", 0x10, 5)}}), "unknown action 'teleport'"},
      {build::snapshot({{build::entry("alloc", 0x10, 5), build::entry("alloc", 0x10, 5)}}),
       "device_traces[0][1]: alloc of 5 bytes at address 16 that is live since device_traces[0][0]"},
      // Issue 14: overlapping live blocks and negative addresses were replayed.
      {build::snapshot({{build::entry("alloc", 0x100, 0x100), build::entry("alloc", 0x180, 0x10)}}),
       "device_traces[0][1]: alloc of 16 bytes at address 384 overlaps the live block of 256 bytes at address 256"},
      {build::snapshot({{build::entry("alloc", 0x180, 0x10), build::entry("alloc", 0x100, 0x100)}}),
       "overlaps the live block of 16 bytes at address 384"},
      {build::snapshot({{build::entry("alloc", -4096, 16)}}), "device_traces[0][0]['addr'] is negative: -4096"},
      // Issue 14: sums of sizes read from the file are checked, never wrapped.
      {build::snapshot({{build::entry("segment_alloc", 0, INT64_MAX), build::entry("segment_alloc", 0, INT64_MAX)}}),
       "device_traces[0][1]: the segments' net size overflows 64 bits"},
      {build::snapshot({{build::entry("free_requested", 0, 0)}}, {build::segment(0, 0, INT64_MAX), build::segment(0, 0, 1)}),
       "segments[1]: the segments' total size overflows 64 bits"},
  };
  for (const auto& [data, message] : cases) {
    SCOPED_TRACE(message);
    auto trace = read_pytorch_snapshot(data, "bad");
    ASSERT_FALSE(trace);
    EXPECT_EQ(trace.error().code(), Errc::corrupt_data);
    EXPECT_THAT(trace.error().message(), HasSubstr(message));
  }
}

TEST(TraceSummary, ASumOfSizesThatOverflowsIsRefused) {
  Trace trace;
  trace.name = "overflow";
  const std::uint64_t half = (std::uint64_t{1} << 63) + 1;
  trace.events = {Event{Op::alloc, 0, half}, Event{Op::alloc, 1, half}};
  trace.num_blocks = 2;
  auto summary = summarize(trace);
  ASSERT_FALSE(summary);
  EXPECT_THAT(summary.error().message(), HasSubstr("event 1 allocates 9223372036854775809 bytes: the sum of sizes overflows"));
  trace.events = {Event{Op::segment_alloc, 0, half}, Event{Op::segment_alloc, 0, half}};
  trace.num_blocks = 0;
  trace.has_segments = true;
  auto segments = summarize(trace);
  ASSERT_FALSE(segments);
  EXPECT_THAT(segments.error().message(), HasSubstr("the sum of segment sizes overflows"));
}

}  // namespace
}  // namespace tidepool::trace
