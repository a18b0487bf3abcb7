#include "tidepool/recorder.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "tidepool/best_fit_pool.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"

namespace tidepool::trace {
namespace {

std::shared_ptr<Allocator> growth_pool() {
  HostDeviceOptions device_options;
  device_options.capacity = 1 * GiB;
  auto device = HostDevice::create(device_options);
  if (!device) throw Exception(device.error());
  auto pool = BestFitPool::create(std::move(device).value());
  if (!pool) throw Exception(pool.error());
  return std::shared_ptr<Allocator>(std::move(pool).value());
}

TEST(Recorder, RecordsWhatHappenedAndForwardsEverything) {
  auto pool = growth_pool();
  Recorder recorder(pool, "unit");
  EXPECT_EQ(recorder.name(), pool->name());
  EXPECT_EQ(&recorder.device(), &pool->device());

  auto a = recorder.allocate(1000);
  auto b = recorder.allocate(5 * MiB, Stream{7});
  ASSERT_TRUE(a && b);
  auto zero = recorder.allocate(0);
  ASSERT_TRUE(zero);
  EXPECT_EQ(*zero, nullptr);
  auto too_big = recorder.allocate(4 * GiB);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code(), Errc::out_of_memory);
  EXPECT_EQ(recorder.stats().bytes_in_use, pool->stats().bytes_in_use);
  EXPECT_GE(pool->stats().bytes_in_use, static_cast<std::int64_t>(1000 + 5 * MiB));

  ASSERT_TRUE(recorder.deallocate(*a));
  ASSERT_TRUE(recorder.deallocate(nullptr));
  // A pointer the pool handed out before it was wrapped: forwarded, counted.
  auto outside = pool->allocate(64);
  ASSERT_TRUE(outside);
  ASSERT_TRUE(recorder.deallocate(*outside));
  // A bad free is the pool's error, and nothing is recorded.
  Status twice = recorder.deallocate(*a);
  ASSERT_FALSE(twice);

  const Trace trace = recorder.trace();
  EXPECT_EQ(trace.name, "unit");
  EXPECT_EQ(trace.device_capacity, 1 * GiB);
  EXPECT_EQ(trace.num_blocks, 2u);
  EXPECT_EQ(trace.failed_allocs, 1u);
  EXPECT_EQ(trace.unmatched_frees, 1u);
  ASSERT_EQ(trace.events.size(), 3u);
  EXPECT_EQ(trace.events[0].op, Op::alloc);
  EXPECT_EQ(trace.events[0].bytes, 1000u);
  EXPECT_EQ(trace.events[1].bytes, 5 * MiB);
  EXPECT_EQ(trace.events[1].stream, Stream{7});
  EXPECT_EQ(trace.events[2].op, Op::free);
  EXPECT_EQ(trace.events[2].block, 0u);
  EXPECT_EQ(trace.events[2].bytes, 1000u);
  EXPECT_LE(trace.events[0].time_us, trace.events[2].time_us);
  EXPECT_GE(trace.events[0].time_us, 0);
  auto summary = summarize(trace);
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->live_bytes_at_end, 5 * MiB);

  // Saved in tidepool's format, it reads back the same.
  const std::string path = std::string{TIDEPOOL_BINARY_DIR} + "/recorder_test.trace";
  ASSERT_TRUE(recorder.save(path));
  auto copy = read_trace(path);
  std::remove(path.c_str());
  ASSERT_TRUE(copy) << copy.error().message();
  EXPECT_EQ(copy->events.size(), 3u);
  EXPECT_EQ(copy->num_blocks, 2u);
  EXPECT_EQ(copy->events[2].bytes, 1000u);
  ASSERT_TRUE(recorder.deallocate(*b));
}

TEST(Recorder, ThreadsRecordAConsistentTrace) {
  auto pool = growth_pool();
  Recorder recorder(pool);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&recorder, t] {
      for (int i = 0; i < 500; ++i) {
        auto ptr = recorder.allocate(static_cast<std::size_t>(256 * (1 + (i + t) % 17)), Stream(t));
        ASSERT_TRUE(ptr);
        ASSERT_TRUE(recorder.deallocate(*ptr, Stream(t)));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const Trace trace = recorder.trace();
  EXPECT_EQ(trace.num_blocks, 2000u);
  EXPECT_EQ(trace.events.size(), 4000u);
  auto summary = summarize(trace);  // every free ends a live block, even with addresses reused
  ASSERT_TRUE(summary) << summary.error().message();
  EXPECT_EQ(summary->live_blocks_at_end, 0u);
}

}  // namespace
}  // namespace tidepool::trace
