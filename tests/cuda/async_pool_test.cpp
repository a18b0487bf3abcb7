// AsyncPool: cudaMallocAsync through the Allocator interface.
#include "tidepool/async_pool.hpp"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/units.hpp"

namespace tidepool::test {
namespace {

TEST(AsyncPoolWithoutCuda, RefusesADeviceThatIsNotCuda) {
  HostDeviceOptions options;
  options.capacity = 1 * GiB;
  Expected<std::shared_ptr<HostDevice>> host = HostDevice::create(options);
  ASSERT_TRUE(host) << host.error().message();
  EXPECT_EQ(find_cuda_device(**host), nullptr);
  Expected<std::unique_ptr<AsyncPool>> pool = AsyncPool::create(*host);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::unsupported);
  EXPECT_NE(pool.error().message().find("TIDEPOOL_DEVICE=cuda"), std::string::npos)
      << pool.error().message();
  EXPECT_EQ(error_code(AsyncPool::create(nullptr)), "invalid_argument");
}

class AsyncPoolTest : public CudaTest {
 protected:
  std::unique_ptr<AsyncPool> pool(AsyncPoolOptions options = {}) {
    Expected<std::unique_ptr<AsyncPool>> made = AsyncPool::create(device_, options);
    if (!made) throw Exception(made.error());
    return std::move(made).value();
  }
};

TEST_F(AsyncPoolTest, AllocatesDisjointBlocksThatHoldData) {
  auto async = pool();
  EXPECT_EQ(async->name(), "cuda_async");
  EXPECT_EQ(&async->device(), device_.get());
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t i = 0; i < 24; ++i) {
    const std::size_t bytes = (i % 6 + 1) * 256 * KiB + 8 * i;
    Expected<void*> ptr = async->allocate(bytes);
    ASSERT_TRUE(ptr) << ptr.error().message();
    EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*ptr), kMinAlignment));
    ASSERT_TRUE(write_pattern(*ptr, bytes, i));
    blocks.emplace_back(*ptr, bytes);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(pattern_intact(blocks[i].first, blocks[i].second, i)) << "block " << i;
  }
  std::set<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const auto& [ptr, bytes] : blocks) {
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    ranges.emplace(begin, begin + bytes);
  }
  for (auto it = ranges.begin(); std::next(it) != ranges.end(); ++it) {
    EXPECT_LE(it->second, std::next(it)->first) << "two live blocks overlap";
  }
  for (const auto& [ptr, bytes] : blocks) EXPECT_TRUE(async->deallocate(ptr));
  EXPECT_EQ(async->stats().bytes_in_use, 0);
}

TEST_F(AsyncPoolTest, StatsFollowTheDriversPool) {
  AsyncPoolOptions options;
  options.bytes_limit = 1 * GiB;
  auto async = pool(options);
  Expected<void*> a = async->allocate(10 * MiB + 1);
  Expected<void*> b = async->allocate(3 * MiB);
  ASSERT_TRUE(a && b);
  Stats stats = async->stats();
  EXPECT_EQ(stats.bytes_limit, static_cast<std::int64_t>(1 * GiB));
  EXPECT_EQ(stats.num_allocs, 2);
  EXPECT_EQ(stats.bytes_in_use, static_cast<std::int64_t>(round_up(10 * MiB + 1, 256) + 3 * MiB));
  EXPECT_EQ(stats.largest_alloc_size, static_cast<std::int64_t>(round_up(10 * MiB + 1, 256)));
  EXPECT_GE(stats.bytes_reserved, stats.bytes_in_use);
  EXPECT_EQ(stats.pool_bytes, stats.bytes_reserved);
  EXPECT_GE(stats.peak_bytes_reserved, stats.bytes_reserved);
  ASSERT_TRUE(async->deallocate(*a));
  ASSERT_TRUE(async->deallocate(*b));
  stats = async->stats();
  EXPECT_EQ(stats.bytes_in_use, 0);
  EXPECT_EQ(stats.peak_bytes_in_use, static_cast<std::int64_t>(round_up(10 * MiB + 1, 256) + 3 * MiB));
  EXPECT_NE(async->dump().find("release threshold 1.00 GiB"), std::string::npos) << async->dump();
}

TEST_F(AsyncPoolTest, ReleaseThresholdDecidesWhatStaysCached) {
  constexpr std::size_t kBytes = 64 * MiB;
  for (std::size_t threshold : {std::size_t{0}, std::size_t{1} * GiB}) {
    AsyncPoolOptions options;
    options.bytes_limit = 1 * GiB;
    options.release_threshold = threshold;
    auto async = pool(options);
    Expected<void*> ptr = async->allocate(kBytes);
    ASSERT_TRUE(ptr) << ptr.error().message();
    ASSERT_TRUE(async->deallocate(*ptr));
    // The driver releases down to the threshold when a synchronization completes.
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    const Stats stats = async->stats();
    if (threshold == 0) {
      EXPECT_LT(stats.bytes_reserved, static_cast<std::int64_t>(kBytes))
          << "a pool with threshold 0 gives the freed block back";
    } else {
      EXPECT_GE(stats.bytes_reserved, static_cast<std::int64_t>(kBytes)) << "cached under the threshold";
      EXPECT_GE(async->trim(), kBytes);
      EXPECT_EQ(async->stats().bytes_reserved, 0);
    }
  }
}

TEST_F(AsyncPoolTest, PreallocationReservesTheLimitUpFront) {
  AsyncPoolOptions options;
  options.bytes_limit = 256 * MiB;
  options.preallocate = true;
  auto async = pool(options);
  const Stats stats = async->stats();
  EXPECT_GE(stats.bytes_reserved, static_cast<std::int64_t>(256 * MiB));
  EXPECT_EQ(stats.num_allocs, 0) << "XLA clears the counts after preallocating";
  EXPECT_EQ(stats.bytes_in_use, 0);
}

TEST_F(AsyncPoolTest, BadFreesAreErrorsThatChangeNothing) {
  auto async = pool();
  Expected<void*> ptr = async->allocate(MiB);
  ASSERT_TRUE(ptr) << ptr.error().message();
  int on_stack = 0;
  EXPECT_EQ(error_code(async->deallocate(&on_stack)), "invalid_pointer");
  ASSERT_TRUE(async->deallocate(*ptr));
  EXPECT_EQ(error_code(async->deallocate(*ptr)), "double_free");
  EXPECT_TRUE(async->deallocate(nullptr));
  Expected<void*> none = async->allocate(0);
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, nullptr);
  EXPECT_EQ(async->stats().bytes_in_use, 0);
}

TEST_F(AsyncPoolTest, TooLargeARequestIsOutOfMemoryWithTheCudaError) {
  // A limit above the device, so that the driver is the one that refuses.
  AsyncPoolOptions options;
  options.bytes_limit = device_->mem_info().total_bytes * 4;
  auto async = pool(options);
  const std::size_t too_much = device_->mem_info().total_bytes * 2;
  Expected<void*> ptr = async->allocate(too_much);
  ASSERT_FALSE(ptr);
  EXPECT_EQ(ptr.error().code(), Errc::out_of_memory);
  EXPECT_NE(ptr.error().message().find("cudaErrorMemoryAllocation"), std::string::npos)
      << ptr.error().message();
  EXPECT_EQ(async->stats().num_ooms, 1);
  Expected<void*> small = async->allocate(MiB);
  ASSERT_TRUE(small) << small.error().message();
  EXPECT_TRUE(async->deallocate(*small));
}

// The limit holds before the driver is asked (it used to be only reported).
TEST_F(AsyncPoolTest, TheLimitIsEnforced) {
  AsyncPoolOptions options;
  options.bytes_limit = 64 * MiB;
  auto async = pool(options);
  Expected<void*> most = async->allocate(48 * MiB);
  ASSERT_TRUE(most) << most.error().message();
  Expected<void*> past = async->allocate(32 * MiB);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), Errc::out_of_memory);
  EXPECT_NE(past.error().message().find("limit of 64.0 MiB"), std::string::npos) << past.error().message();
  EXPECT_EQ(async->stats().num_ooms, 1);
  Expected<void*> rest = async->allocate(16 * MiB);  // exactly up to the limit
  ASSERT_TRUE(rest) << rest.error().message();
  EXPECT_TRUE(async->deallocate(*most));
  EXPECT_TRUE(async->deallocate(*rest));
  EXPECT_LE(async->stats().peak_bytes_in_use, static_cast<std::int64_t>(64 * MiB));
}

TEST_F(AsyncPoolTest, StreamOrderedUseAcrossStreams) {
  Expected<CudaStream> a = CudaStream::create(*device_);
  Expected<CudaStream> b = CudaStream::create(*device_);
  ASSERT_TRUE(a && b);
  auto async = pool();
  constexpr std::size_t kBytes = 32 * MiB;
  Expected<void*> first = async->allocate(kBytes, a->handle());
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_TRUE(fill(*first, kBytes, 0x11, a->handle()));
  ASSERT_TRUE(async->deallocate(*first, a->handle()));
  // Whatever the driver hands stream b, b's work sees its own writes only.
  Expected<void*> second = async->allocate(kBytes, b->handle());
  ASSERT_TRUE(second) << second.error().message();
  ASSERT_TRUE(fill(*second, kBytes, 0x22, b->handle()));
  ASSERT_TRUE(device_->synchronize(b->handle()));
  EXPECT_TRUE(filled_with(*second, kBytes, 0x22));
  ASSERT_TRUE(async->deallocate(*second, b->handle()));
  ASSERT_TRUE(device_->synchronize(b->handle()));
}

}  // namespace
}  // namespace tidepool::test
