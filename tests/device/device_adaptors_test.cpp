// LimitDevice and CountingDevice over a HostDevice.
#include "tidepool/device_adaptors.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "tidepool/host_device.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

std::shared_ptr<HostDevice> host(std::size_t capacity) {
  HostDeviceOptions options;
  options.capacity = capacity;
  options.name = "adaptors";
  return HostDevice::create(options).value();
}

TEST(LimitDevice, RefusesPastTheLimitAndReportsIt) {
  auto upstream = host(64 * MiB);
  LimitDevice limited(upstream, 8 * MiB);
  EXPECT_EQ(limited.mem_info().total_bytes, 8 * MiB);
  EXPECT_EQ(limited.mem_info().free_bytes, 8 * MiB);
  auto a = limited.create(6 * MiB);
  ASSERT_TRUE(a);
  EXPECT_EQ(limited.mem_info().free_bytes, 2 * MiB);
  auto refused = limited.create(4 * MiB);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("8.00 MiB"), std::string::npos) << refused.error().message();
  EXPECT_EQ(upstream->mem_info().free_bytes, 58 * MiB);  // the refused call never reached upstream
  auto p = limited.allocate(1 * MiB + 1);  // counts 1 MiB + 256
  ASSERT_TRUE(p);
  EXPECT_EQ(limited.held_bytes(), 7 * MiB + 256);
  EXPECT_EQ(limited.allocate(1 * MiB).error().code(), Errc::out_of_memory);
  ASSERT_TRUE(limited.free(*p, 1 * MiB + 1));
  ASSERT_TRUE(limited.release(*a, 6 * MiB));
  EXPECT_EQ(limited.held_bytes(), 0u);
  EXPECT_EQ(limited.mem_info().free_bytes, 8 * MiB);
  // A failed upstream call is not counted; a bad release leaves the count alone.
  EXPECT_FALSE(limited.release(12345, 2 * MiB));
  EXPECT_EQ(limited.held_bytes(), 0u);
}

TEST(LimitDevice, FreeIsTheSmallerOfUpstreamAndLimit) {
  auto upstream = host(16 * MiB);
  LimitDevice limited(upstream, 64 * MiB);
  EXPECT_EQ(limited.mem_info().total_bytes, 16 * MiB);
  auto other = upstream->create(12 * MiB);  // someone else takes upstream memory
  ASSERT_TRUE(other);
  EXPECT_EQ(limited.mem_info().free_bytes, 4 * MiB);
  EXPECT_EQ(limited.create(6 * MiB).error().code(), Errc::out_of_memory);
  EXPECT_EQ(limited.held_bytes(), 0u);
}

TEST(LimitDevice, ConcurrentCallersNeverPassTheLimit) {
  auto upstream = host(256 * MiB);
  LimitDevice limited(upstream, 32 * MiB);
  std::vector<std::thread> threads;
  std::vector<std::vector<PhysicalHandle>> got(4);
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 16; ++i) {
        auto h = limited.create(2 * MiB);
        if (h) got[t].push_back(*h);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::size_t total = 0;
  for (auto& list : got) total += list.size();
  EXPECT_EQ(total, 16u);
  EXPECT_EQ(upstream->mem_info().free_bytes, 224 * MiB);
  for (auto& list : got) for (PhysicalHandle h : list) ASSERT_TRUE(limited.release(h, 2 * MiB));
  EXPECT_EQ(limited.held_bytes(), 0u);
}

TEST(CountingDevice, CountsCallsFailuresBytesAndTime) {
  auto counting = std::make_shared<CountingDevice>(host(32 * MiB));
  const std::size_t g = counting->granularity();
  auto va = counting->reserve(4 * g);
  ASSERT_TRUE(va);
  auto h1 = counting->create(2 * g);
  auto h2 = counting->create(g);
  ASSERT_TRUE(h1 && h2);
  ASSERT_TRUE(counting->map(*va, 2 * g, *h1));
  ASSERT_TRUE(counting->map(static_cast<char*>(*va) + 2 * g, g, *h2));
  auto p = counting->allocate(1000);
  ASSERT_TRUE(p);
  DeviceCounters c = counting->counters();
  EXPECT_EQ(c.bytes_held, 3 * g + 1000);
  EXPECT_EQ(c.physical_bytes_held, 3 * g);
  EXPECT_EQ(c.plain_bytes_held, 1000u);
  EXPECT_EQ(c.bytes_mapped, 3 * g);
  EXPECT_FALSE(counting->create(64 * MiB));       // too big: a failure
  EXPECT_FALSE(counting->unmap(*va, g));          // not one map: a failure
  ASSERT_TRUE(counting->unmap(*va, 2 * g));
  ASSERT_TRUE(counting->unmap(static_cast<char*>(*va) + 2 * g, g));
  ASSERT_TRUE(counting->release(*h1, 2 * g));
  ASSERT_TRUE(counting->release(*h2, g));
  ASSERT_TRUE(counting->free(*p, 1000));
  ASSERT_TRUE(counting->unreserve(*va, 4 * g));
  ASSERT_TRUE(counting->synchronize(kDefaultStream));
  Expected<bool> idle = counting->query(Stream{3});
  ASSERT_TRUE(idle);
  EXPECT_TRUE(*idle);  // the host device's streams never have work queued

  c = counting->counters();
  EXPECT_EQ(c.reserve.calls, 1u);
  EXPECT_EQ(c.unreserve.calls, 1u);
  EXPECT_EQ(c.create.calls, 3u);
  EXPECT_EQ(c.create.failures, 1u);
  EXPECT_EQ(c.map.calls, 2u);
  EXPECT_EQ(c.unmap.calls, 3u);
  EXPECT_EQ(c.unmap.failures, 1u);
  EXPECT_EQ(c.release.calls, 2u);
  EXPECT_EQ(c.allocate.calls, 1u);
  EXPECT_EQ(c.free.calls, 1u);
  EXPECT_EQ(c.synchronize.calls, 1u);
  EXPECT_EQ(c.query.calls, 1u);
  EXPECT_EQ(c.total_calls(), 16u);
  EXPECT_GT(c.total_nanoseconds(), 0u);
  EXPECT_EQ(c.bytes_held, 0u);
  EXPECT_EQ(c.peak_bytes_held, 3 * g + 1000);
  EXPECT_EQ(c.bytes_mapped, 0u);
  EXPECT_EQ(c.peak_bytes_mapped, 3 * g);

}

TEST(CountingDevice, StacksOverALimit) {
  auto counting = std::make_shared<CountingDevice>(
      std::make_shared<LimitDevice>(host(64 * MiB), 4 * MiB));
  EXPECT_EQ(counting->mem_info().total_bytes, 4 * MiB);
  auto h = counting->create(4 * MiB);
  ASSERT_TRUE(h);
  EXPECT_EQ(counting->create(2 * MiB).error().code(), Errc::out_of_memory);
  EXPECT_EQ(counting->counters().create.failures, 1u);
  EXPECT_EQ(counting->counters().bytes_held, 4 * MiB);
  ASSERT_TRUE(counting->release(*h, 4 * MiB));
}

}  // namespace
}  // namespace tidepool
