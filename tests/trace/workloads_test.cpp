#include "tidepool/workloads.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"

namespace tidepool::trace {
namespace {

using ::testing::HasSubstr;

Trace make(std::string_view name, std::uint64_t seed = 1, std::uint32_t steps = 0) {
  WorkloadOptions options;
  options.seed = seed;
  options.steps = steps;
  auto trace = make_workload(name, options);
  if (!trace) throw Exception(trace.error());
  return std::move(trace).value();
}

bool same_events(const Trace& a, const Trace& b) {
  if (a.events.size() != b.events.size()) return false;
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const Event& x = a.events[i];
    const Event& y = b.events[i];
    if (x.op != y.op || x.block != y.block || x.bytes != y.bytes || x.stream != y.stream) return false;
  }
  return true;
}

TEST(Workloads, ListsTheBuiltIns) {
  std::vector<std::string_view> names;
  for (const WorkloadInfo& info : workloads()) {
    names.push_back(info.name);
    EXPECT_FALSE(info.description.empty());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("train-step", "llm-inference", "small-tensors", "multi-stream-inference",
                                            "near-capacity", "random-mixed"));
  auto unknown = make_workload("bogus");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), Errc::invalid_argument);
  EXPECT_THAT(unknown.error().message(), HasSubstr("unknown workload 'bogus' (known: train-step, llm-inference, small-tensors, "
                                                           "multi-stream-inference, near-capacity, random-mixed)"));
}

TEST(Workloads, AreDeterministicAndSeeded) {
  for (const WorkloadInfo& info : workloads()) {
    SCOPED_TRACE(info.name);
    const Trace first = make(info.name, 7);
    EXPECT_TRUE(same_events(first, make(info.name, 7)));
    EXPECT_FALSE(same_events(first, make(info.name, 8)));
    EXPECT_EQ(first.name, info.name);
    EXPECT_EQ(first.format, "builtin");
    EXPECT_EQ(first.device_capacity, 80 * GiB);
  }
}

TEST(Workloads, AreBalancedAndSizedForAnEightyGigabyteDevice) {
  for (const WorkloadInfo& info : workloads()) {
    SCOPED_TRACE(info.name);
    const Trace trace = make(info.name);
    auto summary = summarize(trace);  // every free ends a live block of its bytes
    ASSERT_TRUE(summary) << summary.error().message();
    EXPECT_FALSE(trace.has_segments);
    EXPECT_GT(summary->peak_live_bytes, 2 * GiB);
    EXPECT_LT(summary->peak_live_bytes, 60 * GiB);
    EXPECT_GT(summary->allocs, 1'000u);
    EXPECT_LT(summary->live_bytes_at_end, summary->peak_live_bytes);
  }
}

// What stays live is the model's state only: it neither grows with more
// steps nor depends on the seed, so nothing transient leaks.
TEST(Workloads, OnlyLongLivedStateStaysLive) {
  const auto live_at_end = [](std::string_view name, std::uint64_t seed, std::uint32_t steps) {
    auto summary = summarize(make(name, seed, steps));
    if (!summary) throw Exception(summary.error());
    return std::pair{summary->live_blocks_at_end, summary->live_bytes_at_end};
  };
  // train-step: the fp32 weights and two Adam moments of ~0.9 B parameters.
  const auto train = live_at_end("train-step", 1, 2);
  EXPECT_EQ(train, live_at_end("train-step", 1, 4));
  EXPECT_EQ(train, live_at_end("train-step", 9, 2));
  EXPECT_EQ(train.first % 3, 0u);
  EXPECT_GT(train.second, 10 * GiB);
  EXPECT_LT(train.second, 12 * GiB);
  // llm-inference: the bf16 weights of the 7B-class model.
  const auto inference = live_at_end("llm-inference", 1, 8);
  EXPECT_EQ(inference, live_at_end("llm-inference", 3, 16));
  EXPECT_GT(inference.second, 12 * GiB);
  EXPECT_LT(inference.second, 14 * GiB);
  // small-tensors: everything freed.
  EXPECT_EQ(live_at_end("small-tensors", 5, 20), std::pair(std::size_t{0}, std::uint64_t{0}));
}

// The three that stress a pool: what each promises in its description.
TEST(Workloads, PathologiesHaveTheirShape) {
  // multi-stream-inference: 13 streams (12 workers and the default), and
  // frees on another stream than the block's alloc.
  const Trace streams = make("multi-stream-inference", 1, 3);
  std::vector<Stream> alloc_stream(streams.num_blocks);
  std::set<Stream> seen;
  std::size_t cross_stream_frees = 0;
  for (const Event& event : streams.events) {
    if (event.op == Op::alloc) {
      alloc_stream[event.block] = event.stream;
      seen.insert(event.stream);
    } else if (event.op == Op::free && event.stream != alloc_stream[event.block]) {
      ++cross_stream_frees;
    }
  }
  EXPECT_EQ(seen.size(), 13u);
  EXPECT_GT(cross_stream_frees, 100u);

  // near-capacity: each step's peak is 95-99% of the default limit (60 GiB).
  auto near = summarize(make("near-capacity", 1, 3));
  ASSERT_TRUE(near) << near.error().message();
  EXPECT_GE(near->peak_live_bytes, 60 * GiB / 100 * 95);
  EXPECT_LE(near->peak_live_bytes, 60 * GiB / 100 * 99);

  // random-mixed: a million operations, at most 512 blocks live, sizes from
  // 256 B to 64 MiB.
  const Trace mixed = make("random-mixed");
  std::size_t live = 0;
  std::size_t most_live = 0;
  std::uint64_t smallest = ~std::uint64_t{0};
  std::uint64_t largest = 0;
  for (const Event& event : mixed.events) {
    if (event.op == Op::alloc) {
      most_live = std::max(most_live, ++live);
      smallest = std::min(smallest, event.bytes);
      largest = std::max(largest, event.bytes);
    } else {
      --live;
    }
  }
  EXPECT_EQ(most_live, 512u);
  EXPECT_GE(smallest, 256u);
  EXPECT_LT(smallest, 1 * KiB);
  EXPECT_LE(largest, 64 * MiB);
  EXPECT_GT(largest, 32 * MiB);
  EXPECT_GE(mixed.events.size(), 1'000'000u);  // and the blocks still live are freed at the end
}

TEST(Workloads, StepsScaleTheWork) {
  EXPECT_LT(make("train-step", 1, 1).events.size(), make("train-step", 1, 3).events.size());
  EXPECT_LT(make("llm-inference", 1, 4).events.size(), make("llm-inference", 1, 8).events.size());
  EXPECT_EQ(make("small-tensors", 1, 3).num_blocks, 3000u);
}

// 0 steps is the default size; at most kMaxStepsFactor times it, so that no
// option makes a trace (and its replay) unbounded.
TEST(Workloads, StepsDefaultAndBound) {
  for (const WorkloadInfo& info : workloads()) {
    SCOPED_TRACE(info.name);
    EXPECT_GT(info.default_steps, 0u);
    EXPECT_FALSE(info.steps_are.empty());
    EXPECT_TRUE(same_events(make(info.name, 3, 0), make(info.name, 3, info.default_steps)));
    WorkloadOptions options;
    options.steps = kMaxStepsFactor * info.default_steps + 1;
    auto refused = make_workload(info.name, options);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), Errc::invalid_argument);
    EXPECT_THAT(refused.error().message(),
                HasSubstr("steps " + std::to_string(options.steps) + " is more than 10 times its default of " +
                          std::to_string(info.default_steps) + " " + std::string(info.steps_are) +
                          "; allowed: 1 to " + std::to_string(options.steps - 1)));
  }
}

}  // namespace
}  // namespace tidepool::trace
