// Sleep and wake on a GPU (the GPU check runs it; it skips, with the reason,
// where there is none): the tag's memory goes back to the device (cudaMemGetInfo
// sees it), another allocation uses it, and the wake restores every byte at the
// same addresses; with nothing kept, the memory is usable again.
#include <cuda_runtime_api.h>

#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/units.hpp"

namespace tidepool::test {
namespace {

class CudaSleepTest : public CudaTest {};

std::size_t device_free_bytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  (void)cudaMemGetInfo(&free_bytes, &total_bytes);
  return free_bytes;
}

TEST_F(CudaSleepTest, ContentsKeptAtTheSameAddresses) {
  auto pool = ExpandablePool::create(device_).value();
  std::vector<void*> blocks;
  const std::size_t sizes[] = {4 * KiB, 3 * MiB, 64 * MiB, 256 * MiB + 512};
  {
    auto scope = pool->tag("weights").value();
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      blocks.push_back(pool->allocate(sizes[i]).value());
      ASSERT_TRUE(write_pattern(blocks.back(), sizes[i] / 8 * 8, i + 1));
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::size_t free_awake = device_free_bytes();
  ASSERT_TRUE(pool->sleep("weights", SleepKeep::contents));
  const std::size_t asleep = static_cast<std::size_t>(pool->stats().bytes_asleep);
  EXPECT_GE(asleep, 323 * MiB);
  EXPECT_GE(device_free_bytes(), free_awake + asleep - 8 * MiB);  // the driver's own bookkeeping aside

  void* borrowed = pool->allocate(asleep).value();  // untagged, into what the tag gave up
  ASSERT_EQ(cudaMemset(borrowed, 0x5a, asleep), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(pool->deallocate(borrowed));

  ASSERT_TRUE(pool->wake("weights"));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(pattern_intact(blocks[i], sizes[i] / 8 * 8, i + 1)) << "block " << i;
  }
  EXPECT_EQ(pool->stats().bytes_asleep, 0);
}

TEST_F(CudaSleepTest, NothingKeptIsUsableAgain) {
  auto pool = ExpandablePool::create(device_).value();
  void* cache = nullptr;
  {
    auto scope = pool->tag("kv").value();
    cache = pool->allocate(128 * MiB).value();
  }
  ASSERT_TRUE(pool->sleep("kv", SleepKeep::nothing));
  EXPECT_FALSE(pool->sleep("kv", SleepKeep::nothing));
  ASSERT_TRUE(pool->wake("kv"));
  ASSERT_TRUE(write_pattern(cache, 128 * MiB, 9));
  EXPECT_TRUE(pattern_intact(cache, 128 * MiB, 9));
}

}  // namespace
}  // namespace tidepool::test
