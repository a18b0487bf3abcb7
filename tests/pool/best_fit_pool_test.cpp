// BestFitPool: what BFC does beyond the Allocator contract (coalescing,
// region growth, trim, OOM hints, streams, the memory map).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pool_test_support.hpp"

namespace tidepool::test {
namespace {

std::unique_ptr<BestFitPool> best_fit(std::shared_ptr<Device> device, bool preallocate, std::size_t bytes_limit) {
  BestFitOptions options;
  options.preallocate = preallocate;
  auto pool = BestFitPool::create(limited(std::move(device), bytes_limit), options);
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

class BestFitBothModes : public ::testing::TestWithParam<bool> {};

// TensorFlow GPUBFCAllocatorTest.ExerciseCoalescing: repeated rounds of
// mixed sizes coalesce back, so the first pointer comes back at the end.
TEST_P(BestFitBothModes, CoalescingReturnsTheFirstPointer) {
  auto a = best_fit(host_device(), GetParam(), 1 * GiB);
  void* first = must_allocate(*a, 4 * KiB);
  ASSERT_TRUE(a->deallocate(first));
  for (int round = 0; round < 1024; ++round) {
    void* t1 = must_allocate(*a, 4 * KiB);
    void* t2 = must_allocate(*a, 8 * MiB);
    void* t3 = must_allocate(*a, 16 * KiB);
    void* t4 = must_allocate(*a, 40 * MiB);
    ASSERT_TRUE(a->deallocate(t1));
    ASSERT_TRUE(a->deallocate(t2));
    ASSERT_TRUE(a->deallocate(t3));
    ASSERT_TRUE(a->deallocate(t4));
  }
  EXPECT_EQ(must_allocate(*a, 4 * KiB), first);
  // No growth after the first round: the cache served every later one.
  EXPECT_LE(a->stats().num_device_allocs, 3);
}

TEST_P(BestFitBothModes, NameSaysTheMode) {
  auto a = best_fit(host_device(), GetParam(), 64 * MiB);
  EXPECT_EQ(a->name(), GetParam() ? "preallocate" : "growth");
}

// A fragmented pool says the memory is free but split, and names the remedy.
TEST_P(BestFitBothModes, FragmentationOomHasTheSplitHint) {
  auto a = best_fit(host_device(), GetParam(), 1 * MiB);
  std::vector<void*> quarter;
  // The growth pool's first region is min(limit, 2 MiB) = the whole 1 MiB.
  for (int i = 0; i < 4; ++i) quarter.push_back(must_allocate(*a, 256 * KiB));
  ASSERT_TRUE(a->deallocate(quarter[0]));
  ASSERT_TRUE(a->deallocate(quarter[2]));

  Expected<void*> half = a->allocate(512 * KiB);
  ASSERT_FALSE(half);
  ASSERT_EQ(half.error().code(), Errc::out_of_memory);
  const OomReport* report = half.error().oom();
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->requested_bytes, 512 * KiB);
  EXPECT_EQ(report->bytes_in_use, 512 * KiB);
  EXPECT_EQ(report->bytes_reserved, 1 * MiB);
  EXPECT_EQ(report->largest_free_block_bytes, 256 * KiB);
  EXPECT_NE(report->hint.find("split into blocks no larger than 256 KiB"), std::string::npos) << report->hint;
  EXPECT_EQ(report->advice, OomAdvice::use_expandable);
  EXPECT_NE(half.error().message().find("ExpandablePool maps free memory into one contiguous range"),
            std::string::npos)
      << half.error().message();
  EXPECT_NE(half.error().message().find("512 KiB"), std::string::npos) << half.error().message();

  const Stats stats = a->stats();
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.largest_free_block_bytes, 256 * 1024);
  EXPECT_DOUBLE_EQ(stats.fragmentation(), 0.5);

  // Still usable: freeing a neighbour coalesces 768 KiB.
  ASSERT_TRUE(a->deallocate(quarter[1]));
  void* merged = must_allocate(*a, 768 * KiB);
  EXPECT_EQ(merged, quarter[0]);
}

// Stream semantics: reuse on the freeing stream is free of charge; another
// stream first waits for the freeing stream's work.
TEST_P(BestFitBothModes, CrossStreamReuseSynchronizesTheFreeingStream) {
  auto counting = std::make_shared<SyncCountingDevice>(host_device());
  auto a = best_fit(counting, GetParam(), 64 * MiB);
  constexpr Stream kS1 = 11;
  constexpr Stream kS2 = 22;

  void* p = must_allocate(*a, 64 * KiB, kS1);
  ASSERT_TRUE(a->deallocate(p, kS1));
  void* q = must_allocate(*a, 64 * KiB, kS1);
  EXPECT_EQ(q, p);
  EXPECT_EQ(counting->total_calls(), 0);

  ASSERT_TRUE(a->deallocate(q, kS1));
  void* r = must_allocate(*a, 64 * KiB, kS2);
  EXPECT_EQ(r, p);
  EXPECT_EQ(counting->calls(kS1), 1);
  EXPECT_EQ(counting->total_calls(), 1);

  // Fresh memory needs no synchronizing.
  void* fresh = must_allocate(*a, 128 * KiB, kS1);
  EXPECT_EQ(counting->total_calls(), 1);
  ASSERT_TRUE(a->deallocate(fresh, kS1));
  ASSERT_TRUE(a->deallocate(r, kS2));
}

// Free neighbours freed on different streams stay apart until a request
// needs them together; then both streams are synchronized and they merge.
TEST(BestFitPool, NeighboursFreedOnTwoStreamsMergeWhenNeeded) {
  auto counting = std::make_shared<SyncCountingDevice>(host_device());
  auto a = best_fit(counting, /*preallocate=*/true, 1 * MiB);
  void* low = must_allocate(*a, 512 * KiB, 1);
  void* high = must_allocate(*a, 512 * KiB, 2);
  ASSERT_TRUE(a->deallocate(low, 1));
  ASSERT_TRUE(a->deallocate(high, 2));
  EXPECT_EQ(a->stats().largest_free_block_bytes, 512 * 1024);

  void* whole = must_allocate(*a, 1 * MiB, 3);
  EXPECT_EQ(whole, low);
  EXPECT_EQ(counting->calls(1), 1);
  EXPECT_EQ(counting->calls(2), 1);
}

// Found by fuzz/pool_ops_fuzz: a region whose free chunks were freed on two
// streams is wholly free, and trim() must hand it back.
TEST(BestFitPool, TrimReturnsARegionFreedOnTwoStreams) {
  auto device = host_device(64 * MiB);
  const std::size_t free_at_start = device->mem_info().free_bytes;
  auto pool = best_fit(device, /*preallocate=*/false, 48 * MiB);
  void* first = must_allocate(*pool, 8, 0);
  ASSERT_TRUE(pool->deallocate(first, 1));
  void* second = must_allocate(*pool, 1, 1);
  ASSERT_TRUE(pool->deallocate(second, 0));
  EXPECT_GT(pool->trim(), 0u);
  EXPECT_EQ(pool->stats().pool_bytes, 0);
  EXPECT_EQ(device->mem_info().free_bytes, free_at_start);
}

TEST_P(BestFitBothModes, InteriorPointerIsInvalidAndChangesNothing) {
  auto a = best_fit(host_device(), GetParam(), 64 * MiB);
  auto* block = static_cast<char*>(must_allocate(*a, 4 * KiB));
  Status interior = a->deallocate(block + 256);
  ASSERT_FALSE(interior);
  EXPECT_EQ(interior.error().code(), Errc::invalid_pointer);
  EXPECT_NE(interior.error().message().find("256 bytes into the live block"), std::string::npos)
      << interior.error().message();
  EXPECT_EQ(a->stats().bytes_in_use, 4096);
  ASSERT_TRUE(a->deallocate(block));
}

TEST_P(BestFitBothModes, DumpShowsRegionsChunksAndBins) {
  auto a = best_fit(host_device(), GetParam(), 64 * MiB);
  void* p = must_allocate(*a, 4 * KiB);
  const std::string dump = a->dump();
  EXPECT_NE(dump.find(GetParam() ? "\"preallocate\"" : "\"growth\""), std::string::npos) << dump;
  EXPECT_NE(dump.find("region 0x"), std::string::npos) << dump;
  EXPECT_NE(dump.find("in use 0x"), std::string::npos) << dump;
  EXPECT_NE(dump.find("1 x 4.00 KiB"), std::string::npos) << dump;
  EXPECT_NE(dump.find("bins: ["), std::string::npos) << dump;
  ASSERT_TRUE(a->deallocate(p));
}

INSTANTIATE_TEST_SUITE_P(Modes, BestFitBothModes, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& mode) {
                           return std::string(mode.param ? "preallocate" : "growth");
                         });

// As BFC with allow_growth: 2 MiB first, then each region twice the last.
TEST(BestFitPool, GrowthRegionsDoubleAsBfcDoes) {
  auto a = best_fit(host_device(), /*preallocate=*/false, 1 * GiB);
  void* p = must_allocate(*a, 256);
  EXPECT_EQ(a->stats().pool_bytes, static_cast<std::int64_t>(2 * MiB));
  void* q = must_allocate(*a, 2 * MiB);  // does not fit in the first region
  EXPECT_EQ(a->stats().pool_bytes, static_cast<std::int64_t>(6 * MiB));
  void* r = must_allocate(*a, 20 * MiB);  // next region 8 MiB, doubled to fit: 32 MiB
  Stats stats = a->stats();
  EXPECT_EQ(stats.pool_bytes, static_cast<std::int64_t>(38 * MiB));
  EXPECT_EQ(stats.bytes_reserved, stats.pool_bytes);
  EXPECT_EQ(stats.peak_pool_bytes, static_cast<std::int64_t>(38 * MiB));
  EXPECT_EQ(stats.num_device_allocs, 3);
  for (void* ptr : {p, q, r}) ASSERT_TRUE(a->deallocate(ptr));
}

TEST(BestFitPool, PreallocateTakesTheWholeLimitAtCreation) {
  auto device = host_device(1 * GiB);
  auto a = best_fit(device, /*preallocate=*/true, 768 * MiB);
  const Stats stats = a->stats();
  EXPECT_EQ(stats.pool_bytes, static_cast<std::int64_t>(768 * MiB));
  EXPECT_EQ(stats.bytes_limit, static_cast<std::int64_t>(768 * MiB));
  EXPECT_EQ(stats.num_device_allocs, 1);
  EXPECT_EQ(stats.largest_free_block_bytes, static_cast<std::int64_t>(768 * MiB));
  EXPECT_LE(device->mem_info().free_bytes, 256 * MiB);
}

TEST(BestFitPool, PreallocateFailsCleanlyWhenTheDeviceIsTooSmall) {
  auto device = host_device(1 * GiB);
  Expected<void*> theirs = device->allocate(512 * MiB);  // another allocator's
  ASSERT_TRUE(theirs);
  BestFitOptions options;
  options.preallocate = true;
  auto pool = BestFitPool::create(device, options);  // the device's total: more than is free
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::out_of_memory);
  EXPECT_EQ(pool.error().oom()->advice, OomAdvice::lower_limit);
  EXPECT_EQ(device->mem_info().free_bytes, 512 * MiB);
  ASSERT_TRUE(device->free(*theirs, 512 * MiB));
}

TEST(BestFitPool, LimitDefaultsToTheDeviceTotal) {
  auto a = best_fit(host_device(4 * GiB), /*preallocate=*/false, 0);
  EXPECT_EQ(a->stats().bytes_limit, static_cast<std::int64_t>(4 * GiB));
}

TEST(BestFitPool, TrimGivesFullyFreeRegionsBack) {
  auto device = host_device(1 * GiB);
  auto a = best_fit(device, /*preallocate=*/false, 1 * GiB);
  void* small = must_allocate(*a, 4 * KiB);    // region 1 (2 MiB)
  void* large = must_allocate(*a, 16 * MiB);   // region 2 (16 MiB)
  ASSERT_TRUE(a->deallocate(large));
  EXPECT_EQ(a->trim(), 16 * MiB);  // region 1 still has a live block
  Stats stats = a->stats();
  EXPECT_EQ(stats.pool_bytes, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(stats.num_device_frees, 1);
  ASSERT_TRUE(a->deallocate(small));
  EXPECT_EQ(a->trim(), 2 * MiB);
  EXPECT_EQ(a->stats().pool_bytes, 0);
  EXPECT_EQ(device->mem_info().free_bytes, 1 * GiB);
  // And it grows again afterwards.
  void* again = must_allocate(*a, 4 * KiB);
  EXPECT_GT(a->stats().pool_bytes, 0);
  ASSERT_TRUE(a->deallocate(again));
}

// Each trim gives the region back and the next allocate grows again, which
// doubles the next region's size. Unbounded, that size passed 2^64 after
// about 40 rounds, wrapped to 0, and grow() looped forever holding the
// pool's lock (the Python close test hung with 8 threads waiting on it).
// The size stops at the limit; the regions taken are the same.
TEST_P(BestFitBothModes, TrimmingAndGrowingAgainNeverEnds) {
  const bool preallocate = GetParam();
  auto device = host_device(1 * GiB);
  auto a = best_fit(device, preallocate, 1 * GiB);
  for (int round = 0; round < 200; ++round) {
    ASSERT_TRUE(a->deallocate(must_allocate(*a, 4 * KiB))) << "round " << round;
    const std::size_t region = preallocate || round >= 9 ? 1 * GiB : (2 * MiB) << round;
    ASSERT_EQ(a->trim(), region) << "round " << round;
  }
  const Stats stats = a->stats();
  EXPECT_EQ(stats.num_device_allocs, 200);
  EXPECT_EQ(stats.num_device_frees, 200);
  EXPECT_EQ(stats.pool_bytes, 0);
  EXPECT_EQ(device->mem_info().free_bytes, 1 * GiB);
}

// BFC's garbage collection: when growing fails, fully free regions go back
// so that one larger region can be taken.
TEST(BestFitPool, GrowthReleasesFreeRegionsToFitALargerOne) {
  auto device = host_device(64 * MiB);
  auto a = best_fit(device, /*preallocate=*/false, 64 * MiB);
  ASSERT_TRUE(a->deallocate(must_allocate(*a, 256)));  // leaves a free 2 MiB region
  EXPECT_EQ(a->stats().pool_bytes, static_cast<std::int64_t>(2 * MiB));
  // 63 MiB fits neither the 2 MiB region nor the 62 MiB left under the limit.
  void* large = must_allocate(*a, 63 * MiB);
  const Stats stats = a->stats();
  EXPECT_EQ(stats.num_device_frees, 1);
  EXPECT_EQ(stats.pool_bytes, static_cast<std::int64_t>(64 * MiB));
  ASSERT_TRUE(a->deallocate(large));
}

// When the device, not the pool's limit, is short, the hint says so.
TEST(BestFitPool, DeviceShortOomSaysTheDeviceIsShort) {
  auto device = host_device(64 * MiB);
  auto other = device->allocate(40 * MiB);  // another user of the device
  ASSERT_TRUE(other);
  auto a = best_fit(device, /*preallocate=*/false, 1 * GiB);
  Expected<void*> big = a->allocate(32 * MiB);
  ASSERT_FALSE(big);
  ASSERT_EQ(big.error().code(), Errc::out_of_memory);
  const OomReport* report = big.error().oom();
  ASSERT_NE(report, nullptr);
  EXPECT_NE(report->hint.find("the device has only"), std::string::npos) << report->hint;
  EXPECT_LE(report->device_free_bytes, 24 * MiB);
  EXPECT_NE(must_allocate(*a, 1 * MiB), nullptr);  // still usable
  ASSERT_TRUE(device->free(*other, 40 * MiB));
}

TEST(BestFitPool, LimitReachedOomSaysSo) {
  auto a = best_fit(host_device(), /*preallocate=*/false, 4 * MiB);
  void* p = must_allocate(*a, 3 * MiB);
  Expected<void*> more = a->allocate(2 * MiB);
  ASSERT_FALSE(more);
  EXPECT_NE(more.error().oom()->hint.find("at its limit of 4.00 MiB"), std::string::npos)
      << more.error().oom()->hint;
  ASSERT_TRUE(a->deallocate(p));
}

// BFC's split rule: a chunk is split only when the remainder is at least the request.
TEST(BestFitPool, SmallRemaindersStayWithTheBlockAsBfcDoes) {
  auto a = best_fit(host_device(), /*preallocate=*/true, 1 * MiB);
  void* p768 = must_allocate(*a, 768);
  void* guard = must_allocate(*a, 256);
  ASSERT_TRUE(a->deallocate(p768));
  void* p512 = must_allocate(*a, 512);  // the 768-byte hole is the best fit; 256 left is not worth a split
  EXPECT_EQ(p512, p768);
  EXPECT_EQ(a->stats().bytes_in_use, 768 + 256);
  ASSERT_TRUE(a->deallocate(p512));
  ASSERT_TRUE(a->deallocate(guard));
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

}  // namespace
}  // namespace tidepool::test
