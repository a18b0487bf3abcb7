#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tidepool/trace_io.hpp"

namespace tidepool::trace {
namespace {

using ::testing::HasSubstr;

// What logging_resource_adaptor writes: thread, HH:MM:SS.ffffff, message.
const std::string kLog =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "140573312345856,10:15:30.000100,allocate,0x7f8a40000000,1024,0x0\n"
    "140573312345856,10:15:30.000250,allocate,0x7f8a40000400,2048,0x7f8a38001020\n"
    "140573312345856,10:15:30.000300,allocate failure,(nil),99999999999,0x0\n"
    "140573312345857,10:15:30.000400,free,0x7f8a40000000,1024,0x0\n"
    "140573312345857,10:15:30.000500,free,0x7f8a4ffff000,512,0x0\n"  // allocated before the log
    "140573312345856,10:15:31.5,allocate,0x7f8a40001000,4096,0\n"    // decimal stream, short fraction
    "140573312345856,10:15:32.000000,free,0x7f8a40000400,2048,0x7f8a38001020\n";

TEST(RmmCsv, ReadsTheLoggingAdaptorsLog) {
  auto trace = read_rmm_csv(kLog, "rmm.csv");
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->format, "rmm-csv");
  // The free of a pointer allocated before the log began seeds block 0.
  EXPECT_EQ(trace->num_blocks, 4u);
  EXPECT_EQ(trace->seeded_blocks, 1u);
  EXPECT_EQ(trace->seeded_bytes, 512u);
  EXPECT_EQ(trace->failed_allocs, 1u);
  EXPECT_EQ(trace->unmatched_frees, 1u);
  EXPECT_FALSE(trace->has_segments);
  ASSERT_EQ(trace->events.size(), 7u);
  const std::int64_t base = (10 * 3600 + 15 * 60 + 30) * std::int64_t{1'000'000};
  EXPECT_EQ(trace->events[0].op, Op::alloc);  // seeded, at the first line's time
  EXPECT_EQ(trace->events[0].block, 0u);
  EXPECT_EQ(trace->events[0].bytes, 512u);
  EXPECT_EQ(trace->events[0].time_us, base + 100);
  EXPECT_EQ(trace->events[1].op, Op::alloc);
  EXPECT_EQ(trace->events[1].bytes, 1024u);
  EXPECT_EQ(trace->events[1].time_us, base + 100);
  EXPECT_EQ(trace->events[2].stream, Stream{0x7f8a38001020});
  EXPECT_EQ(trace->events[3].op, Op::free);
  EXPECT_EQ(trace->events[3].block, 1u);
  EXPECT_EQ(trace->events[3].bytes, 1024u);
  EXPECT_EQ(trace->events[4].op, Op::free);  // the seeded block's
  EXPECT_EQ(trace->events[4].block, 0u);
  EXPECT_EQ(trace->events[4].bytes, 512u);
  EXPECT_EQ(trace->events[5].block, 3u);
  EXPECT_EQ(trace->events[5].time_us, base + 1'500'000);
  EXPECT_EQ(trace->events[6].block, 2u);
  // The failure keeps its place, request and time.
  ASSERT_EQ(trace->failures.size(), 1u);
  EXPECT_EQ(trace->failures[0].before_event, 3u);
  EXPECT_EQ(trace->failures[0].bytes, 99999999999u);
  EXPECT_EQ(trace->failures[0].time_us, base + 300);
  auto summary = summarize(*trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->peak_live_bytes, 2048u + 4096u);  // above the start's 512 + 1024 + 2048
  EXPECT_EQ(summary->live_blocks_at_end, 1u);
  EXPECT_EQ(summary->live_bytes_at_end, 4096u);
}

TEST(RmmCsv, TimePastMidnightKeepsGoingForward) {
  auto trace = read_rmm_csv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,23:59:59.999990,allocate,0x1000,8,0x0\n"
      "1,00:00:00.000010,free,0x1000,8,0x0\n",
      "midnight");
  ASSERT_TRUE(trace) << trace.error().message();
  ASSERT_EQ(trace->events.size(), 2u);
  EXPECT_EQ(trace->events[1].time_us - trace->events[0].time_us, 20);
}

TEST(RmmCsv, ReadTraceDetectsItFromAFile) {
  const std::string path = std::string{TIDEPOOL_BINARY_DIR} + "/rmm_csv_test.csv";
  {
    std::ofstream file(path, std::ios::binary);
    file << kLog;
  }
  auto trace = read_trace(path);
  std::remove(path.c_str());
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->name, "rmm_csv_test.csv");
  EXPECT_EQ(trace->format, "rmm-csv");
  EXPECT_EQ(trace->num_blocks, 4u);  // one seeded
}

TEST(RmmCsv, BadLinesNameTheLineAndColumn) {
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "the log is empty (expected the header 'Thread,Time,Action,Pointer,Size,Stream')"},
      {"Thread,Time,Action\n", "line 1, column 1: the header must be"},
      {header + "1,10:00:00.0,allocate,0x10,8\n", "line 2, column 1: 6 fields expected"},
      {header + "1,10:00:00.0,allocate,0x10,8,0,7\n", "line 2, column 32: more than 6 fields"},
      {header + "x,10:00:00.0,allocate,0x10,8,0\n", "line 2, column 1: Thread must be a decimal thread id, found 'x'"},
      {header + "1,10:00:00.000001,allocate,0x10,8,0\n1,25:00:00.0,free,0x10,8,0\n",
       "line 3, column 3: Time must be HH:MM:SS.ffffff, found '25:00:00.0'"},
      {header + "1,10:00:00.0,deallocate,0x10,8,0\n",
       "line 2, column 14: Action must be 'allocate', 'allocate failure' or 'free', found 'deallocate'"},
      {header + "1,10:00:00.0,allocate,0xZZ,8,0\n", "line 2, column 23: Pointer must be a hex pointer"},
      {header + "1,10:00:00.0,allocate,0x10,-8,0\n", "line 2, column 28: Size must be a decimal byte count"},
      {header + "1,10:00:00.0,allocate,0x10,8,s1\n", "line 2, column 30: Stream must be a hex"},
      {header + "1,10:00:00.0,allocate,(nil),8,0\n", "line 2, column 23: allocate of a non-zero size returned a null"},
      {header + "1,10:00:00.0,allocate,0x10,8,0\n1,10:00:00.1,allocate,0x10,8,0\n",
       "line 3, column 23: allocate returns 0x10, which is live since line 2"},
      {header + "1,10:00:00.0,allocate,0x10,8,0\n1,10:00:00.1,free,0x10,16,0\n",
       "line 3, column 24: free of 0x10 with 16 bytes, allocated with 8 at line 2"},
      // Issue 14: overlapping live blocks were replayed; long fields were echoed whole.
      {header + "1,10:00:00.0,allocate,0x100,256,0\n1,10:00:00.1,allocate,0x180,16,0\n",
       "line 3, column 23: allocate of 16 bytes at 0x180 overlaps the live block of 256 bytes at 0x100 allocated at line 2"},
      {header + "1,10:00:00.0,allocate,0x180,16,0\n1,10:00:00.1,allocate,0x100,256,0\n",
       "line 3, column 23: allocate of 256 bytes at 0x100 overlaps the live block of 16 bytes at 0x180"},
      {header + std::string(5000, 'x') + ",10:00:00.0,allocate,0x10,8,0\n",
       "line 2, column 1: Thread must be a decimal thread id, found '" + std::string(80, 'x') + "... (5000 bytes in all)'"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(message);
    auto trace = read_rmm_csv(text, "bad.csv");
    ASSERT_FALSE(trace);
    EXPECT_EQ(trace.error().code(), Errc::corrupt_data);
    EXPECT_THAT(trace.error().message(), HasSubstr("bad.csv: " + message));
  }
}

TEST(RmmCsv, EveryPrefixOfALogReadsOrFailsCleanly) {
  for (std::size_t length = 0; length <= kLog.size(); ++length) {
    auto trace = read_rmm_csv(std::string_view(kLog).substr(0, length), "prefix");
    if (trace) {
      EXPECT_TRUE(summarize(*trace)) << length;
    } else {
      EXPECT_THAT(trace.error().message(), HasSubstr("prefix: ")) << length;
    }
  }
}

}  // namespace
}  // namespace tidepool::trace
