// What every Allocator promises, run on each pool kind: ported in meaning
// from TensorFlow's GPU BFC allocator tests and RMM's memory-resource tests,
// with data-integrity and threading tests on top.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "pool_test_support.hpp"

namespace tidepool::test {
namespace {

class AllocatorContract : public ::testing::TestWithParam<PoolKind> {
 protected:
  std::unique_ptr<Allocator> pool(std::size_t bytes_limit, std::size_t capacity = 16 * GiB) {
    device_ = host_device(capacity);
    return make_pool(GetParam(), device_, bytes_limit);
  }
  std::shared_ptr<Device> device_;
};

// Fills a block with a pattern derived from its tag; checks it back.
void write_pattern(void* ptr, std::size_t bytes, std::uint64_t tag) {
  auto* bytes_ptr = static_cast<unsigned char*>(ptr);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = tag * 0x9E3779B97F4A7C15ull + i;
    std::memcpy(bytes_ptr + i, &word, std::min<std::size_t>(8, bytes - i));
  }
}
bool pattern_intact(const void* ptr, std::size_t bytes, std::uint64_t tag) {
  const auto* bytes_ptr = static_cast<const unsigned char*>(ptr);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = tag * 0x9E3779B97F4A7C15ull + i;
    if (std::memcmp(bytes_ptr + i, &word, std::min<std::size_t>(8, bytes - i)) != 0) return false;
  }
  return true;
}

// Live blocks by address; an insert that overlaps a neighbour fails the test.
class LiveSet {
 public:
  void add(void* ptr, std::size_t bytes) {
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    auto after = blocks_.lower_bound(begin);
    if (after != blocks_.end()) {
      ASSERT_LE(begin + bytes, after->first) << "block " << ptr << " overlaps a live block";
    }
    if (after != blocks_.begin()) {
      auto before = std::prev(after);
      ASSERT_LE(before->first + before->second, begin) << "block " << ptr << " overlaps a live block";
    }
    blocks_.emplace(begin, bytes);
  }
  void remove(void* ptr) { blocks_.erase(reinterpret_cast<std::uintptr_t>(ptr)); }

 private:
  std::map<std::uintptr_t, std::size_t> blocks_;
};

// TensorFlow GPUBFCAllocatorTest.NoDups with its exact stats.
TEST_P(AllocatorContract, ThousandSmallAllocationsHaveExactStatsAndNoOverlap) {
  auto a = pool(1 * GiB);
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t size = 1; size < 1024; ++size) blocks.emplace_back(must_allocate(*a, size), size);

  Stats stats = a->stats();
  EXPECT_EQ(stats.bytes_in_use, 654336);
  EXPECT_EQ(stats.peak_bytes_in_use, 654336);
  EXPECT_EQ(stats.num_allocs, 1023);
  EXPECT_EQ(stats.largest_alloc_size, 1024);
  EXPECT_EQ(stats.bytes_limit, static_cast<std::int64_t>(1 * GiB));

  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    const auto end_of_previous = reinterpret_cast<std::uintptr_t>(blocks[i - 1].first) + blocks[i - 1].second;
    EXPECT_LE(end_of_previous, reinterpret_cast<std::uintptr_t>(blocks[i].first)) << "blocks " << i - 1 << " and " << i;
  }
  for (const auto& [ptr, size] : blocks) ASSERT_TRUE(a->deallocate(ptr));

  stats = a->stats();
  EXPECT_EQ(stats.bytes_in_use, 0);
  EXPECT_EQ(stats.peak_bytes_in_use, 654336);
  EXPECT_EQ(stats.num_allocs, 1023);
  EXPECT_EQ(stats.largest_alloc_size, 1024);
}

// TensorFlow GPUBFCAllocatorTest.ZeroSizeAllocation / RMM AllocateZero.
TEST_P(AllocatorContract, ZeroByteRequestReturnsNullAndCountsNothing) {
  auto a = pool(1 * GiB);
  Expected<void*> ptr = a->allocate(0);
  ASSERT_TRUE(ptr);
  EXPECT_EQ(*ptr, nullptr);
  EXPECT_EQ(a->stats().num_allocs, 0);
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

// TensorFlow GPUBFCAllocatorTest.AllocatorReceivesZeroMemory-style custom limit.
// TF's BFC test: a 1 MiB limit (2 MiB for expandable: one granule of the
// host device is the least it maps).
TEST_P(AllocatorContract, OneMebibyteLimitServesSmallAndRefusesLargeCleanly) {
  auto a = pool(GetParam() == PoolKind::expandable ? 2 * MiB : 1 * MiB);
  void* small = must_allocate(*a, 256);
  EXPECT_NE(small, nullptr);

  Expected<void*> large = a->allocate(4 * MiB);
  ASSERT_FALSE(large);
  EXPECT_EQ(large.error().code(), Errc::out_of_memory);
  ASSERT_NE(large.error().oom(), nullptr);
  EXPECT_EQ(large.error().oom()->requested_bytes, 4 * MiB);
  EXPECT_EQ(large.error().oom()->bytes_in_use, 256u);
  EXPECT_FALSE(large.error().oom()->hint.empty());
  EXPECT_EQ(a->stats().num_ooms, 1);
  EXPECT_EQ(a->stats().bytes_in_use, 256);

  // Still usable.
  void* again = must_allocate(*a, 256);
  EXPECT_NE(again, small);
  ASSERT_TRUE(a->deallocate(again));
  ASSERT_TRUE(a->deallocate(small));
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

// RMM: every allocation is 256-byte aligned.
TEST_P(AllocatorContract, EveryPointerIs256ByteAligned) {
  auto a = pool(1 * GiB);
  std::vector<void*> ptrs;
  for (std::size_t size : {1u, 7u, 255u, 256u, 257u, 1000u, 4096u, 65537u, 1048577u, 3000000u}) {
    void* ptr = must_allocate(*a, size);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 256, 0u) << "size " << size;
    ptrs.push_back(ptr);
  }
  for (void* ptr : ptrs) ASSERT_TRUE(a->deallocate(ptr));
}

// RMM: live allocations get distinct pointers.
TEST_P(AllocatorContract, LiveAllocationsHaveDistinctPointers) {
  auto a = pool(1 * GiB);
  std::set<void*> seen;
  for (int i = 0; i < 500; ++i) {
    void* ptr = must_allocate(*a, 256 + static_cast<std::size_t>(i % 7) * 100);
    EXPECT_TRUE(seen.insert(ptr).second) << "pointer " << ptr << " handed out twice";
  }
  for (void* ptr : seen) ASSERT_TRUE(a->deallocate(ptr));
}

// RMM: deallocating nullptr is a no-op.
TEST_P(AllocatorContract, FreeingNullIsANoOp) {
  auto a = pool(1 * GiB);
  void* ptr = must_allocate(*a, 512);
  const Stats before = a->stats();
  EXPECT_TRUE(a->deallocate(nullptr));
  EXPECT_EQ(a->stats().bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(a->stats().num_allocs, before.num_allocs);
  ASSERT_TRUE(a->deallocate(ptr));
}

// RMM AllocateTooMuch: a 1 PiB request fails with out_of_memory and leaks nothing.
TEST_P(AllocatorContract, OnePebibyteFailsAndLeaksNothing) {
  auto a = pool(0);
  void* keep = must_allocate(*a, 4096);
  const Stats before = a->stats();
  const std::size_t device_free_before = device_->mem_info().free_bytes;

  Expected<void*> huge = a->allocate(std::size_t{1} << 50);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code(), Errc::out_of_memory);
  ASSERT_NE(huge.error().oom(), nullptr);
  EXPECT_EQ(huge.error().oom()->requested_bytes, std::size_t{1} << 50);

  const Stats after = a->stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.pool_bytes, before.pool_bytes);
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(device_->mem_info().free_bytes, device_free_before);
  ASSERT_TRUE(a->deallocate(keep));
}

// RMM RandomAllocations / MixedRandomAllocationFree: sizes 1 B to 5 MiB.
TEST_P(AllocatorContract, RandomSizesMixedAllocAndFree) {
  auto a = pool(2 * GiB);
  std::mt19937_64 random(42);
  std::uniform_int_distribution<std::size_t> size_of(1, 5 * MiB);
  std::vector<std::pair<void*, std::size_t>> live;
  LiveSet live_set;
  for (int op = 0; op < 4000; ++op) {
    const bool do_free = !live.empty() && (random() % 2 == 0 || live.size() > 200);
    if (do_free) {
      const std::size_t index = random() % live.size();
      live_set.remove(live[index].first);
      ASSERT_TRUE(a->deallocate(live[index].first));
      live[index] = live.back();
      live.pop_back();
    } else {
      const std::size_t size = size_of(random);
      void* ptr = must_allocate(*a, size);
      ASSERT_NO_FATAL_FAILURE(live_set.add(ptr, size));
      live.emplace_back(ptr, size);
    }
  }
  for (const auto& [ptr, size] : live) ASSERT_TRUE(a->deallocate(ptr));
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

// RMM: allocate on one thread, free on another.
TEST_P(AllocatorContract, AllocateOnOneThreadFreeOnAnother) {
  auto a = pool(1 * GiB);
  std::vector<void*> ptrs;
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) ptrs.push_back(must_allocate(*a, 256 * static_cast<std::size_t>(1 + i % 64)));
  });
  producer.join();
  std::thread consumer([&] {
    for (void* ptr : ptrs) EXPECT_TRUE(a->deallocate(ptr));
  });
  consumer.join();
  EXPECT_EQ(a->stats().bytes_in_use, 0);
  EXPECT_EQ(a->stats().num_allocs, 1000);
}

// Patterns written into every live block survive a long seeded random sequence.
TEST_P(AllocatorContract, DataIntegrityAcrossLongRandomSequence) {
  auto a = pool(512 * MiB, 1 * GiB);
  std::mt19937_64 random(20240611);
  struct Block {
    void* ptr;
    std::size_t bytes;
    std::uint64_t tag;
  };
  std::vector<Block> live;
  std::size_t live_bytes = 0;
  std::uint64_t next_tag = 1;
  auto verify_all = [&] {
    for (const Block& block : live) {
      ASSERT_TRUE(pattern_intact(block.ptr, block.bytes, block.tag))
          << "block " << block.ptr << " of " << block.bytes << " bytes was overwritten";
    }
  };
  for (int op = 0; op < 20000; ++op) {
    const bool do_free = !live.empty() && (random() % 3 == 0 || live_bytes > 64 * MiB);
    if (do_free) {
      const std::size_t index = random() % live.size();
      ASSERT_TRUE(pattern_intact(live[index].ptr, live[index].bytes, live[index].tag));
      ASSERT_TRUE(a->deallocate(live[index].ptr));
      live_bytes -= live[index].bytes;
      live[index] = live.back();
      live.pop_back();
    } else {
      // Mostly small blocks, some up to 1 MiB.
      const std::size_t size = random() % 8 == 0 ? 1 + random() % MiB : 1 + random() % (16 * KiB);
      void* ptr = must_allocate(*a, size);
      write_pattern(ptr, size, next_tag);
      live.push_back(Block{ptr, size, next_tag++});
      live_bytes += size;
    }
    if (op % 2000 == 0) {
      ASSERT_NO_FATAL_FAILURE(verify_all());
    }
  }
  ASSERT_NO_FATAL_FAILURE(verify_all());
  for (const Block& block : live) ASSERT_TRUE(a->deallocate(block.ptr));
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

// A double free and a foreign pointer are clear errors that change nothing.
TEST_P(AllocatorContract, DoubleFreeAndForeignPointerAreErrorsThatChangeNothing) {
  auto a = pool(1 * GiB);
  void* keep = must_allocate(*a, 1024);
  void* freed = must_allocate(*a, 2048);
  void* guard = must_allocate(*a, 1024);
  ASSERT_TRUE(a->deallocate(freed));
  const Stats before = a->stats();

  Status twice = a->deallocate(freed);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), Errc::double_free) << twice.error().message();

  int on_the_stack = 0;
  Status foreign = a->deallocate(&on_the_stack);
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().code(), Errc::invalid_pointer) << foreign.error().message();

  const Stats after = a->stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.num_allocs, before.num_allocs);

  // Unharmed: new blocks do not overlap the live ones and everything frees.
  LiveSet live_set;
  live_set.add(keep, 1024);
  live_set.add(guard, 1024);
  std::vector<void*> more;
  for (int i = 0; i < 16; ++i) {
    void* ptr = must_allocate(*a, 2048);
    ASSERT_NO_FATAL_FAILURE(live_set.add(ptr, 2048));
    more.push_back(ptr);
  }
  for (void* ptr : more) ASSERT_TRUE(a->deallocate(ptr));
  ASSERT_TRUE(a->deallocate(keep));
  ASSERT_TRUE(a->deallocate(guard));
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

// Several threads allocating, writing, checking and freeing at once.
TEST_P(AllocatorContract, MultiThreadedHammering) {
  auto a = pool(1 * GiB);
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(static_cast<std::uint64_t>(t) + 7);
      struct Block {
        void* ptr;
        std::size_t checked_bytes;  // the first bytes carry the pattern
        std::uint64_t tag;
      };
      std::vector<Block> live;
      for (int op = 0; op < 3000; ++op) {
        if (!live.empty() && (random() % 2 == 0 || live.size() > 64)) {
          const std::size_t index = random() % live.size();
          if (!pattern_intact(live[index].ptr, live[index].checked_bytes, live[index].tag)) ++failures;
          if (!a->deallocate(live[index].ptr)) ++failures;
          live[index] = live.back();
          live.pop_back();
        } else {
          const std::size_t size = 1 + random() % (64 * KiB);
          Expected<void*> ptr = a->allocate(size);
          if (!ptr) {
            ++failures;
            continue;
          }
          const std::uint64_t tag = (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(op);
          const std::size_t checked = std::min<std::size_t>(size, 512);
          write_pattern(*ptr, checked, tag);
          live.push_back(Block{*ptr, checked, tag});
        }
      }
      for (const Block& block : live) {
        if (!a->deallocate(block.ptr)) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(a->stats().bytes_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(Pools, AllocatorContract,
                         ::testing::Values(PoolKind::preallocate, PoolKind::growth, PoolKind::platform,
                                           PoolKind::expandable),
                         PoolKindName());

}  // namespace
}  // namespace tidepool::test
