#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tidepool/trace_io.hpp"
#include "tidepool/workloads.hpp"

namespace tidepool::trace {
namespace {

using ::testing::HasSubstr;

void expect_same(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.num_blocks, b.num_blocks);
  EXPECT_EQ(a.unmatched_frees, b.unmatched_frees);
  EXPECT_EQ(a.seeded_blocks, b.seeded_blocks);
  EXPECT_EQ(a.seeded_bytes, b.seeded_bytes);
  EXPECT_EQ(a.failed_allocs, b.failed_allocs);
  EXPECT_EQ(a.device_capacity, b.device_capacity);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.has_segments, b.has_segments);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const Event& x = a.events[i];
    const Event& y = b.events[i];
    ASSERT_TRUE(x.op == y.op && x.block == y.block && x.bytes == y.bytes && x.stream == y.stream &&
                x.time_us == y.time_us)
        << "event " << i;
  }
}

Trace small_trace() {
  Trace trace;
  trace.name = "small one";
  trace.format = "builtin";
  trace.device_capacity = 80ull << 30;
  trace.device = 3;
  trace.unmatched_frees = 4;
  trace.seeded_blocks = 1;
  trace.seeded_bytes = 1000;
  trace.failed_allocs = 5;
  trace.has_segments = true;
  trace.num_blocks = 2;
  trace.events = {
      {Op::segment_alloc, 0, 2 << 20, 0, 1},
      {Op::alloc, 0, 1000, 0x7f0000001234, 2},
      {Op::alloc, 1, 24, 0, -1},
      {Op::free, 0, 1000, 0x7f0000001234, 9},
      {Op::segment_free, 0, 2 << 20, 0, -1},
  };
  return trace;
}

TEST(TidepoolFormat, WritesAReadableVersionedText) {
  const std::string text = write_tidepool(small_trace());
  EXPECT_EQ(text,
            "tidepool-trace 1\n"
            "# builtin trace, written by tidepool; format: docs/trace-format.md\n"
            "name small one\n"
            "device 3\n"
            "device_capacity 85899345920\n"
            "unmatched_frees 4\n"
            "seeded_blocks 1\n"
            "seeded_bytes 1000\n"
            "failed_allocs 5\n"
            "blocks 2\n"
            "events 5\n"
            "sa 2097152 0 1\n"
            "a 0 1000 139637976732212 2\n"
            "a 1 24 0 -\n"
            "f 0 139637976732212 9\n"
            "sf 2097152 0 -\n");
}

TEST(TidepoolFormat, RoundTripsTracesOfEveryKind) {
  std::vector<Trace> traces{small_trace()};
  for (const WorkloadInfo& info : workloads()) {
    WorkloadOptions options;
    options.steps = info.name == "small-tensors" ? 5 : 2;
    auto workload = make_workload(info.name, options);
    ASSERT_TRUE(workload) << workload.error().message();
    traces.push_back(std::move(workload).value());
  }
  auto snapshot = read_trace(std::string{TIDEPOOL_TEST_DATA} + "/pytorch/cs336-bcrafton.pickle");
  ASSERT_TRUE(snapshot) << snapshot.error().message();
  traces.push_back(std::move(snapshot).value());
  for (const Trace& original : traces) {
    SCOPED_TRACE(original.name);
    auto copy = read_tidepool(write_tidepool(original), "ignored: the header names it");
    ASSERT_TRUE(copy) << copy.error().message();
    EXPECT_EQ(copy->format, "tidepool");
    expect_same(original, *copy);
  }
}

TEST(TidepoolFormat, WritesAndReadsFiles) {
  const std::string path = std::string{TIDEPOOL_BINARY_DIR} + "/tidepool_format_test.trace";
  ASSERT_TRUE(write_tidepool_file(small_trace(), path));
  auto copy = read_trace(path);
  std::remove(path.c_str());
  ASSERT_TRUE(copy) << copy.error().message();
  expect_same(small_trace(), *copy);

  auto missing = read_trace("/nonexistent/dir/x.trace");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Errc::io_error);
  EXPECT_THAT(missing.error().message(), HasSubstr("/nonexistent/dir/x.trace"));
  Status unwritable = write_tidepool_file(small_trace(), "/nonexistent/dir/x.trace");
  ASSERT_FALSE(unwritable);
  EXPECT_EQ(unwritable.error().code(), Errc::io_error);
}

TEST(TidepoolFormat, BadFilesNameTheLine) {
  const std::string head = "tidepool-trace 1\nblocks 1\nevents 2\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "the file is empty"},
      {"tidepool-trace 2\n", "line 1: not a tidepool trace of version 1"},
      {"tidepool-trace 1\nblocks 1\n", "line 2: the header ends before its 'events' line"},
      {"tidepool-trace 1\ncolour blue\nevents 0\n", "line 2: 'colour' needs a number"},
      {"tidepool-trace 1\ncolour 1\nevents 0\n", "line 2: unknown header key 'colour'"},
      {"tidepool-trace 1\nevents 0\n", "line 2: the header has no 'blocks' line"},
      {"tidepool-trace 1\nblocks 0\nblocks 0\nevents 0\n", "line 3: 'blocks' appears twice"},
      {"tidepool-trace 1\nblocks 1\nevents 99999999\n", "line 3: the header announces 99999999 events and 1 blocks, more than the file holds"},
      {head + "a 0 10 0 -\nx 0 0 -\n", "line 5: unknown event 'x'"},
      {head + "a 0 10 0\n", "line 4: event 'a' needs 5 (or 7, with ADDRESS and DEVICE) fields, found 4"},
      {head + "a 0 10 0 - 0x1f\n", "line 4: event 'a' needs 5 (or 7, with ADDRESS and DEVICE) fields, found 6"},
      {head + "a 0 10 0 - 1f 0\n", "line 4: address '1f' is not 0x and a hexadecimal number"},
      {head + "a 0 10 0 - 0xzz 0\n", "line 4: address '0xzz' is not 0x and a hexadecimal number"},
      {head + "a 0 10 0 - 0x1f gpu\n", "line 4: device 'gpu' is not a device index"},
      {head + "f 0 0 - 0x1f 0\n", "line 4: event 'f' needs 4 fields, found 6"},
      {head + "a 1 10 0 -\n", "line 4: allocates block 1, expected block 0"},
      {head + "a 0 ten 0 -\n", "line 4: bytes 'ten' is not a number"},
      {head + "a 0 10 0 -\nf 1 0 -\n", "line 5: frees block 1, which is not live"},
      {head + "a 0 10 0 -\nf 0 0 -\nsa 5 0 -\n", "line 6: more events than the 2 announced"},
      {head + "a 0 10 0 -\nf 0 0 soon\n", "line 5: time 'soon' is not a number"},
      {head + "a 0 10 0 -\n", "line 4: the file ends after 1 events and 1 blocks; the header announces 2 and 1"},
      {"tidepool-trace 1\nblocks 0\nevents 1\nsf 10 0 -\n", "event 0 returns a segment of 10 bytes while only 0"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(message);
    auto trace = read_tidepool(text, "bad.trace");
    ASSERT_FALSE(trace);
    EXPECT_EQ(trace.error().code(), Errc::corrupt_data);
    EXPECT_THAT(trace.error().message(), HasSubstr("bad.trace: " + message));
  }
}

// tidepool run --record's lines: counts with leading zeros (rewritten in
// place as the file grows), allocations with their address and device.
TEST(TidepoolFormat, ReadsRecordedTracesWithAddressesAndPaddedCounts) {
  Trace header;
  header.name = "recorded";
  header.format = "cuda-driver";
  header.num_blocks = 1;
  std::string text;
  append_tidepool_header(text, header, 2, 20);
  EXPECT_THAT(text, HasSubstr("\nblocks 00000000000000000001\nevents 00000000000000000002\n"));
  Event alloc{Op::alloc, 0, 4096, 0x1000, 7};
  const EventOrigin origin{0x7f00deadbe00, 1};
  append_tidepool_event(text, alloc, &origin);
  append_tidepool_event(text, Event{Op::free, 0, 4096, 0x2000, 9}, &origin);  // origin: alloc lines only
  EXPECT_THAT(text, HasSubstr("\na 0 4096 4096 7 0x7f00deadbe00 1\nf 0 8192 9\n"));
  auto trace = read_tidepool(text, "recorded.trace");
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->num_blocks, 1u);
  ASSERT_EQ(trace->events.size(), 2u);
  EXPECT_EQ(trace->events[0].bytes, 4096u);
  EXPECT_EQ(trace->events[0].stream, 0x1000u);
  EXPECT_EQ(trace->events[1].stream, 0x2000u);
  EXPECT_EQ(trace->events[1].time_us, 9);
}

TEST(TidepoolFormat, EveryPrefixReadsOrFailsCleanly) {
  const std::string text = write_tidepool(small_trace());
  std::size_t read = 0;
  for (std::size_t length = 0; length < text.size(); ++length) {
    auto trace = read_tidepool(std::string_view(text).substr(0, length), "prefix");
    if (trace) ++read;  // only a prefix cut inside the last time stamp can still hold 5 events
  }
  EXPECT_EQ(read, 1u);
}

TEST(TraceFormats, DetectsEachFormatByContent) {
  EXPECT_EQ(*detect_format("\x80\x04\x95"), Format::pytorch_snapshot);
  EXPECT_EQ(*detect_format("tidepool-trace 1\n"), Format::tidepool);
  EXPECT_EQ(*detect_format("Thread,Time,Action,Pointer,Size,Stream\n"), Format::rmm_csv);
  EXPECT_EQ(*detect_format("\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream\n"), Format::rmm_csv);
  auto unknown = parse_trace("hello", "mystery.bin");
  ASSERT_FALSE(unknown);
  EXPECT_THAT(unknown.error().message(), HasSubstr("mystery.bin: unknown trace format"));
  auto empty = parse_trace("", "empty.bin");
  ASSERT_FALSE(empty);
  EXPECT_THAT(empty.error().message(), HasSubstr("empty.bin: the trace is empty"));
}

TEST(TraceSummary, ChecksTheModelsInvariants) {
  Trace trace = small_trace();
  auto summary = summarize(trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->allocs, 2u);
  EXPECT_EQ(summary->frees, 1u);
  EXPECT_EQ(summary->segment_events, 2u);
  EXPECT_EQ(summary->peak_live_bytes, 1024u);
  EXPECT_EQ(summary->live_bytes_at_end, 24u);
  EXPECT_EQ(summary->peak_segment_bytes, 2u << 20);

  Trace wrong_bytes = small_trace();
  wrong_bytes.events[3].bytes = 999;
  EXPECT_THAT(summarize(wrong_bytes).error().message(), HasSubstr("event 3 frees block 0 with 999 bytes, allocated with 1000"));
  Trace wrong_count = small_trace();
  wrong_count.num_blocks = 3;
  EXPECT_THAT(summarize(wrong_count).error().message(), HasSubstr("num_blocks is 3 but the events allocate 2"));
  Trace wrong_flag = small_trace();
  wrong_flag.has_segments = false;
  EXPECT_THAT(summarize(wrong_flag).error().message(), HasSubstr("has_segments is false"));
  Trace out_of_order = small_trace();
  out_of_order.events[1].block = 1;
  EXPECT_THAT(summarize(out_of_order).error().message(), HasSubstr("event 1 allocates block 1, expected block 0"));
}

}  // namespace
}  // namespace tidepool::trace
