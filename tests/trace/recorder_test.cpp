#include "tidepool/recorder.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "child_process.hpp"
#include "pool/pool_test_support.hpp"
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

// A child forked while a thread of the parent records an allocation (the
// recorder's lock and the pool's held, the device slow to answer) takes
// neither lock: its calls reach the pool, which refuses the child, and it
// records nothing of its own.
TEST(Recorder, AChildForkedWhileAThreadRecordsTakesNoLockAndRecordsNothing) {
  HostDeviceOptions device_options;
  device_options.capacity = 1 * GiB;
  auto host = HostDevice::create(device_options);
  ASSERT_TRUE(host);
  auto gate = std::make_shared<test::GateDevice>(std::move(host).value());
  auto pool = BestFitPool::create(gate);
  ASSERT_TRUE(pool);
  Recorder recorder(std::shared_ptr<Allocator>(std::move(pool).value()), "forked");
  Expected<void*> allocated = recorder.allocate(1 * MiB);
  ASSERT_TRUE(allocated);
  void* const first = *allocated;
  gate->arm();
  std::thread holder([&] { (void)recorder.allocate(64 * MiB); });  // grows: the gate holds it
  gate->wait_inside();

  test::Child child([&]() -> int {
    Expected<void*> refused = recorder.allocate(1 * MiB);
    if (refused || refused.error().code() != Errc::unsupported) return 10;
    if (!recorder.deallocate(first)) return 11;  // the parent's block: left alone
    if (!recorder.trace().events.empty() || recorder.trace().name != "forked") return 12;
    if (Status saved = recorder.save("/nonexistent/forked.tidepool"); saved || saved.error().code() != Errc::unsupported)
      return 13;
    return 0;
  });
  const int status = child.wait(std::chrono::seconds(10));  // -1: it hung on a lock
  gate->open();
  holder.join();
  ASSERT_EQ(status, 0);
  EXPECT_EQ(recorder.trace().events.size(), 2u);  // the parent's two allocations, nothing of the child's
  EXPECT_TRUE(recorder.deallocate(first));
}

}  // namespace
}  // namespace tidepool::trace
