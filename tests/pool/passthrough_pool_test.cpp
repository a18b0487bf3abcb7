// PassthroughPool (XLA's `platform`): every request is a device call and every
// free goes back at once. The Allocator contract runs in allocator_contract_test.
#include <gtest/gtest.h>

#include <string>

#include "pool_test_support.hpp"

namespace tidepool::test {
namespace {

TEST(PassthroughPool, EveryRequestAndFreeIsADeviceCall) {
  auto device = host_device(1 * GiB);
  PassthroughPool pool(device);
  EXPECT_EQ(pool.name(), "platform");
  Expected<void*> a = pool.allocate(1000);
  Expected<void*> b = pool.allocate(3 * MiB);
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  Stats stats = pool.stats();
  EXPECT_EQ(stats.num_device_allocs, 2);
  EXPECT_EQ(stats.num_allocs, 2);
  EXPECT_EQ(stats.bytes_in_use, static_cast<std::int64_t>(1024 + 3 * MiB));  // rounded to 256 B
  EXPECT_EQ(stats.bytes_reserved, stats.bytes_in_use);
  EXPECT_EQ(stats.largest_free_block_bytes, 0);  // nothing is cached
  EXPECT_LT(device->mem_info().free_bytes, 1 * GiB);

  ASSERT_TRUE(pool.deallocate(*a));
  ASSERT_TRUE(pool.deallocate(*b));
  stats = pool.stats();
  EXPECT_EQ(stats.num_device_frees, 2);
  EXPECT_EQ(stats.bytes_in_use, 0);
  EXPECT_EQ(stats.bytes_reserved, 0);
  EXPECT_EQ(stats.peak_bytes_reserved, static_cast<std::int64_t>(1024 + 3 * MiB));
  EXPECT_EQ(device->mem_info().free_bytes, 1 * GiB);  // back at once
  EXPECT_EQ(pool.trim(), 0u);
}

TEST(PassthroughPool, LimitDefaultsToTheDeviceTotal) {
  PassthroughPool pool(host_device(2 * GiB));
  EXPECT_EQ(pool.stats().bytes_limit, static_cast<std::int64_t>(2 * GiB));
}

TEST(PassthroughPool, LimitIsEnforcedOnBytesInUse) {
  PassthroughPool pool(limited(host_device(1 * GiB), 1 * MiB));
  Expected<void*> a = pool.allocate(768 * KiB);
  ASSERT_TRUE(a);
  Expected<void*> b = pool.allocate(512 * KiB);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), Errc::out_of_memory);
  EXPECT_NE(b.error().oom()->hint.find("limit is 1.00 MiB"), std::string::npos) << b.error().oom()->hint;
  ASSERT_TRUE(pool.deallocate(*a));
  Expected<void*> c = pool.allocate(512 * KiB);
  ASSERT_TRUE(c);
  ASSERT_TRUE(pool.deallocate(*c));
}

TEST(PassthroughPool, DeviceShortOomSaysSo) {
  auto device = host_device(16 * MiB);
  Expected<void*> theirs = device->allocate(12 * MiB);  // another allocator's
  ASSERT_TRUE(theirs);
  PassthroughPool pool(device);
  Expected<void*> big = pool.allocate(8 * MiB);
  ASSERT_FALSE(big);
  ASSERT_EQ(big.error().code(), Errc::out_of_memory);
  EXPECT_NE(big.error().oom()->hint.find("the device has only 4.00 MiB free"), std::string::npos)
      << big.error().oom()->hint;
  EXPECT_EQ(pool.stats().num_ooms, 1);
  ASSERT_TRUE(device->free(*theirs, 12 * MiB));
}

TEST(PassthroughPool, DumpListsLiveBlocks) {
  PassthroughPool pool(host_device(1 * GiB));
  Expected<void*> a = pool.allocate(5000);
  ASSERT_TRUE(a);
  const std::string dump = pool.dump();
  EXPECT_NE(dump.find("1 live blocks"), std::string::npos) << dump;
  EXPECT_NE(dump.find("4.88 KiB"), std::string::npos) << dump;
  ASSERT_TRUE(pool.deallocate(*a));
  EXPECT_NE(pool.dump().find("0 live blocks"), std::string::npos);
}

}  // namespace
}  // namespace tidepool::test
