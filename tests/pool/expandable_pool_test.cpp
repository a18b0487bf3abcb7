// ExpandablePool: stitching defeats fragmentation, data survives stitching,
// trimming and reuse, trim hands back exactly what was taken, the release
// threshold, idle release, large blocks held back on free, the mapping limit,
// and streams. The Allocator contract it shares
// with every pool is in allocator_contract_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool/expandable_state.hpp"
#include "pool/pool_test_support.hpp"

namespace tidepool::test {
namespace {

std::unique_ptr<ExpandablePool> expandable(std::shared_ptr<Device> device, ExpandableOptions options = {}) {
  auto pool = ExpandablePool::create(std::move(device), options);
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

// A pattern that differs per block and per word, so a block mapped onto
// another's memory, or shifted by a granule, is caught.
std::uint64_t pattern(std::uint64_t seed, std::size_t word) { return seed * 0x9E3779B97F4A7C15ull ^ word; }

void fill(void* ptr, std::size_t bytes, std::uint64_t seed, std::size_t stride_words = 1) {
  auto* words = static_cast<std::uint64_t*>(ptr);
  for (std::size_t i = 0; i < bytes / 8; i += stride_words) words[i] = pattern(seed, i);
}

bool intact(const void* ptr, std::size_t bytes, std::uint64_t seed, std::size_t stride_words = 1) {
  const auto* words = static_cast<const std::uint64_t*>(ptr);
  for (std::size_t i = 0; i < bytes / 8; i += stride_words) {
    if (words[i] != pattern(seed, i)) return false;
  }
  return true;
}

// The deterministic case: a 1 GiB device filled with 16 MiB blocks,
// every other one freed, then one block of half the device.
struct Fragmented {
  std::vector<void*> live;
  std::size_t freed_bytes = 0;
};

Fragmented fill_and_free_every_other(Allocator& pool) {
  std::vector<void*> blocks;
  for (;;) {
    Expected<void*> ptr = pool.allocate(16 * MiB);
    if (!ptr) break;
    blocks.push_back(*ptr);
  }
  Fragmented result;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_TRUE(pool.deallocate(blocks[i]));
      result.freed_bytes += 16 * MiB;
    } else {
      result.live.push_back(blocks[i]);
    }
  }
  return result;
}

TEST(ExpandablePool, StitchingServesWhatBestFitRefusesAsSplit) {
  for (bool preallocate : {true, false}) {
    SCOPED_TRACE(preallocate ? "preallocate" : "growth");
    BestFitOptions options;
    options.preallocate = preallocate;
    auto pool = BestFitPool::create(host_device(1 * GiB), options);
    ASSERT_TRUE(pool) << pool.error().message();
    Fragmented state = fill_and_free_every_other(**pool);
    ASSERT_GE(state.freed_bytes, 512 * MiB);
    Expected<void*> half = (*pool)->allocate(512 * MiB);
    ASSERT_FALSE(half);
    EXPECT_EQ(half.error().code(), Errc::out_of_memory);
    ASSERT_NE(half.error().oom(), nullptr);
    EXPECT_NE(half.error().oom()->hint.find("split into blocks no larger than 16.0 MiB"), std::string::npos)
        << half.error().oom()->hint;
  }

  auto device = host_device(1 * GiB);
  auto pool = expandable(device);
  Fragmented state = fill_and_free_every_other(*pool);
  ASSERT_EQ(state.live.size(), 32u);  // 64 blocks of 16 MiB fill 1 GiB exactly
  for (std::size_t i = 0; i < state.live.size(); ++i) fill(state.live[i], 16 * MiB, i);

  void* half = must_allocate(*pool, 512 * MiB);
  Stats stats = pool->stats();
  EXPECT_EQ(stats.num_stitches, 1);
  EXPECT_EQ(stats.bytes_mapped, static_cast<std::int64_t>(1 * GiB));
  EXPECT_EQ(stats.bytes_in_use, static_cast<std::int64_t>(1 * GiB));
  EXPECT_EQ(stats.granules_free, 0);
  EXPECT_EQ(device->mem_info().free_bytes, 0u);

  fill(half, 512 * MiB, 1000);
  EXPECT_TRUE(intact(half, 512 * MiB, 1000));
  for (std::size_t i = 0; i < state.live.size(); ++i) {
    EXPECT_TRUE(intact(state.live[i], 16 * MiB, i)) << "surviving block " << i;
  }
  // Nothing overlaps: the stitched block lies outside every survivor.
  const auto h = reinterpret_cast<std::uintptr_t>(half);
  for (void* block : state.live) {
    const auto b = reinterpret_cast<std::uintptr_t>(block);
    EXPECT_TRUE(b + 16 * MiB <= h || h + 512 * MiB <= b);
  }
}

// ExpandableOptions::aliases: a stolen granule stays mapped where it was
// too, and serves there again with no device call while its memory is free
// where it went; a live block's memory is never another live block's.
TEST(ExpandablePool, AStolenGranuleServesWhereItWasAgainWithNoCall) {
  auto device = host_device(1 * GiB);
  const std::size_t reserved_only = device->mapping_count();
  ExpandableOptions options;
  options.aliases = true;
  auto pool = expandable(device, options);
  Fragmented state = fill_and_free_every_other(*pool);
  ASSERT_EQ(state.live.size(), 32u);
  for (std::size_t i = 0; i < state.live.size(); ++i) fill(state.live[i], 16 * MiB, i, 512);

  // The holes' 256 granules are stolen for the half, and stay mapped in the holes.
  void* half = must_allocate(*pool, 512 * MiB);
  Stats stats = pool->stats();
  EXPECT_EQ(stats.num_unmaps, 0);
  const std::int64_t maps = stats.num_maps;
  EXPECT_EQ(stats.bytes_mapped, static_cast<std::int64_t>(1 * GiB));  // memory, not mappings
  EXPECT_EQ(device->mem_info().free_bytes, 0u);
  EXPECT_NE(pool->dump().find("256 granules mapped also where they were stolen from"), std::string::npos)
      << pool->dump();
  fill(half, 512 * MiB, 1000, 512);

  // The half freed, the holes take blocks again: their aliases move home, no call.
  ASSERT_TRUE(pool->deallocate(half));
  std::vector<void*> again;
  for (std::size_t i = 0; i < 32; ++i) {
    again.push_back(must_allocate(*pool, 16 * MiB));
    fill(again.back(), 16 * MiB, 2000 + i, 512);
  }
  stats = pool->stats();
  EXPECT_EQ(stats.num_maps, maps);
  EXPECT_EQ(stats.num_unmaps, 0);
  EXPECT_EQ(stats.num_device_allocs, static_cast<std::int64_t>(1 * GiB / (2 * MiB)));
  // The device is full: the half's range holds only aliases of live memory.
  Expected<void*> more = pool->allocate(16 * MiB);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().code(), Errc::out_of_memory);
  for (std::size_t i = 0; i < state.live.size(); ++i) {
    EXPECT_TRUE(intact(state.live[i], 16 * MiB, i, 512)) << "survivor " << i;
  }
  for (std::size_t i = 0; i < again.size(); ++i) {
    EXPECT_TRUE(intact(again[i], 16 * MiB, 2000 + i, 512)) << "block " << i << " in a hole";
  }

  // And back: the holes freed, the half's range serves 512 MiB with no call.
  for (void* block : again) ASSERT_TRUE(pool->deallocate(block));
  half = must_allocate(*pool, 512 * MiB);
  EXPECT_EQ(pool->stats().num_maps, maps);
  fill(half, 512 * MiB, 3000, 512);
  for (std::size_t i = 0; i < state.live.size(); ++i) {
    EXPECT_TRUE(intact(state.live[i], 16 * MiB, i, 512)) << "survivor " << i;
  }
  EXPECT_TRUE(intact(half, 512 * MiB, 3000, 512));

  // trim() gives every free granule back, its aliases unmapped first; the
  // pool's end unmaps the rest.
  ASSERT_TRUE(pool->deallocate(half));
  for (void* block : state.live) ASSERT_TRUE(pool->deallocate(block));
  pool->trim();
  EXPECT_EQ(device->mem_info().free_bytes, 1 * GiB);
  EXPECT_EQ(pool->stats().bytes_mapped, 0);
  pool.reset();
  EXPECT_EQ(device->mapping_count(), reserved_only);
}

// A tag's sleep and wake map its space themselves: the first tag drops every
// alias, and none is kept while a tag exists. Without the option none is kept.
TEST(ExpandablePool, AliasesAreKeptOnlyWhenAskedAndNoTagExists) {
  for (bool aliases : {false, true}) {
    SCOPED_TRACE(aliases ? "aliases" : "no aliases");
    auto device = host_device(1 * GiB);
    ExpandableOptions options;
    options.aliases = aliases;
    auto pool = expandable(device, options);
    Fragmented state = fill_and_free_every_other(*pool);
    void* half = must_allocate(*pool, 512 * MiB);
    EXPECT_EQ(pool->stats().num_unmaps, aliases ? 0 : 256);
    ASSERT_TRUE(pool->tag_begin("weights"));
    ASSERT_TRUE(pool->tag_end());
    EXPECT_EQ(pool->stats().num_unmaps, 256);  // the aliases went
    EXPECT_NE(pool->dump().find(" 0 granules mapped also where"), std::string::npos);
    ASSERT_TRUE(pool->deallocate(half));
    for (std::size_t i = 0; i < 4; ++i) ASSERT_TRUE(pool->deallocate(state.live[i]));
    void* again = must_allocate(*pool, 64 * MiB);  // stitched again, now unmapped where it was
    EXPECT_NE(pool->dump().find(" 0 granules mapped also where"), std::string::npos);
    ASSERT_TRUE(pool->deallocate(again));
  }
}

TEST(ExpandablePool, DataSurvivesStitchingTrimmingAndReuse) {
  // A small device and a small release threshold, so the sequence keeps
  // stitching, releasing and mapping again.
  auto device = host_device(256 * MiB);
  ExpandableOptions options;
  options.release_threshold = 16 * MiB;
  auto pool = expandable(device, options);
  std::mt19937_64 random(7);
  struct Block {
    void* ptr;
    std::size_t bytes;
    std::uint64_t seed;
  };
  std::vector<Block> live;
  std::size_t live_bytes = 0;
  std::uint64_t next_seed = 1;
  for (int step = 0; step < 4000; ++step) {
    const int action = static_cast<int>(random() % 100);
    if (action < 55) {
      // Sizes from 256 B to 24 MiB, log-uniform: small and large both.
      const double exponent = 8.0 + static_cast<double>(random() % 1000) / 1000.0 * 16.6;
      const std::size_t bytes = static_cast<std::size_t>(std::exp2(exponent));
      Expected<void*> ptr = pool->allocate(bytes);
      if (!ptr) {
        ASSERT_EQ(ptr.error().code(), Errc::out_of_memory) << ptr.error().message();
        // Stitching means an OOM only when live memory leaves no room.
        EXPECT_GT(live_bytes + bytes, 256 * MiB - 64 * MiB) << ptr.error().message();
        continue;
      }
      fill(*ptr, bytes, next_seed, 61);
      live.push_back({*ptr, bytes, next_seed++});
      live_bytes += bytes;
    } else if (action < 97 && !live.empty()) {
      const std::size_t k = random() % live.size();
      ASSERT_TRUE(intact(live[k].ptr, live[k].bytes, live[k].seed, 61)) << "block of " << live[k].bytes;
      ASSERT_TRUE(pool->deallocate(live[k].ptr));
      live_bytes -= live[k].bytes;
      live[k] = live.back();
      live.pop_back();
    } else {
      pool->trim();
      EXPECT_EQ(pool->stats().granules_free, 0);
    }
  }
  for (const Block& block : live) {
    ASSERT_TRUE(intact(block.ptr, block.bytes, block.seed, 61));
    ASSERT_TRUE(pool->deallocate(block.ptr));
  }
  Stats stats = pool->stats();
  EXPECT_GT(stats.num_stitches, 0);
  EXPECT_GT(stats.num_releases, 0);
  EXPECT_EQ(stats.bytes_in_use, 0);
  EXPECT_LE(stats.bytes_mapped, static_cast<std::int64_t>(16 * MiB));  // the release threshold held
}

TEST(ExpandablePool, TrimReturnsTheDevicesFreeMemoryExactly) {
  auto device = host_device(1 * GiB);
  const MemInfo before = device->mem_info();
  auto pool = expandable(device);
  std::vector<void*> blocks;
  for (std::size_t bytes : {100 * MiB, 3 * KiB, 7 * MiB, 300 * KiB, 64 * MiB, std::size_t{256}}) {
    blocks.push_back(must_allocate(*pool, bytes));
  }
  EXPECT_LT(device->mem_info().free_bytes, before.free_bytes);
  for (void* block : blocks) ASSERT_TRUE(pool->deallocate(block));
  const Stats cached = pool->stats();
  EXPECT_EQ(cached.bytes_in_use, 0);
  EXPECT_GT(cached.bytes_reserved, 0);  // kept mapped, for reuse in place
  EXPECT_EQ(cached.granules_free * static_cast<std::int64_t>(2 * MiB), cached.bytes_mapped);

  EXPECT_EQ(pool->trim(), static_cast<std::size_t>(cached.bytes_mapped));
  EXPECT_EQ(device->mem_info().free_bytes, before.free_bytes);
  EXPECT_EQ(device->mem_info().total_bytes, before.total_bytes);
  const Stats trimmed = pool->stats();
  EXPECT_EQ(trimmed.bytes_reserved, 0);
  EXPECT_EQ(trimmed.bytes_mapped, 0);
  EXPECT_EQ(trimmed.num_releases, cached.bytes_mapped / static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(pool->trim(), 0u);
}

TEST(ExpandablePool, SmallBlocksShareGranulesAndLargeOnesAreReusedInPlace) {
  auto device = host_device(1 * GiB);
  auto pool = expandable(device);
  std::vector<void*> small;
  for (int i = 0; i < 1000; ++i) small.push_back(must_allocate(*pool, 1 * KiB));
  EXPECT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(2 * MiB));  // 1000 KiB: one granule
  EXPECT_EQ(pool->stats().num_maps, 1);

  void* large = must_allocate(*pool, 64 * MiB);
  const std::int64_t maps = pool->stats().num_maps;
  ASSERT_TRUE(pool->deallocate(large));
  void* again = must_allocate(*pool, 64 * MiB);
  EXPECT_EQ(again, large);
  EXPECT_EQ(pool->stats().num_maps, maps);  // no device call on the cached path
  EXPECT_EQ(pool->stats().num_stitches, 0);
  ASSERT_TRUE(pool->deallocate(again));
  for (void* block : small) ASSERT_TRUE(pool->deallocate(block));
}

TEST(ExpandablePool, MappedGranulesInsideAFreeRangeAreUsedBeforeAnyIsStolen) {
  // Four 4 MiB blocks side by side, two granules each: A B C D. With 4 MiB
  // of free granules kept, freeing A, C and B releases A's and then C's
  // granules: the free range A+B+C has unmapped ends and B's granules,
  // still mapped, in its middle.
  auto device = host_device(1 * GiB);
  ExpandableOptions options;
  options.release_threshold = 4 * MiB;
  auto pool = expandable(device, options);
  void* a = must_allocate(*pool, 4 * MiB);
  void* b = must_allocate(*pool, 4 * MiB);
  void* c = must_allocate(*pool, 4 * MiB);
  void* d = must_allocate(*pool, 4 * MiB);
  ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 4 * MiB);
  ASSERT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 4 * MiB);
  ASSERT_TRUE(pool->deallocate(a));
  ASSERT_TRUE(pool->deallocate(c));
  ASSERT_TRUE(pool->deallocate(b));
  ASSERT_EQ(pool->stats().bytes_mapped, 8 * MiB);  // B's granules and D's
  const Stats before = pool->stats();
  const std::size_t device_free = device->mem_info().free_bytes;

  // Best fit is the 12 MiB range; both its ends would need granules mapped
  // (stolen from B, there being no other free one), its middle needs none.
  void* again = must_allocate(*pool, 4 * MiB);
  EXPECT_EQ(again, b);
  EXPECT_EQ(pool->stats().num_maps, before.num_maps);
  EXPECT_EQ(pool->stats().num_unmaps, before.num_unmaps);
  EXPECT_EQ(pool->stats().num_stitches, 0);
  EXPECT_EQ(device->mem_info().free_bytes, device_free);
  // The pieces on either side are free address space that still serves.
  void* low = must_allocate(*pool, 4 * MiB);
  EXPECT_EQ(low, a);
  for (void* block : {again, low, d}) ASSERT_TRUE(pool->deallocate(block));
}

TEST(ExpandablePool, StealingNeverOutrunsCreatingBelowTheLimit) {
  // Random sizes from 1 to 64 MiB, at most 24 live, far below the limit: a
  // trace whose blocks never fit the holes the last ones left, so a pool
  // that stole whenever granules were free would steal on and on. It moves
  // at most as many granules as it creates, so its device calls stay within
  // three per granule it holds, and it still steals while it may.
  auto device = host_device(16 * GiB);
  auto pool = expandable(device);
  std::mt19937_64 random(12);
  std::vector<void*> live;
  for (int op = 0; op < 20000; ++op) {
    if (live.size() == 24 || (!live.empty() && random() % 2 == 0)) {
      const std::size_t victim = random() % live.size();
      ASSERT_TRUE(pool->deallocate(live[victim]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    } else {
      const double exponent = std::uniform_real_distribution<double>(20, 26)(random);  // 1 to 64 MiB
      live.push_back(must_allocate(*pool, static_cast<std::size_t>(std::exp2(exponent))));
    }
  }
  const Stats stats = pool->stats();
  const std::int64_t moved = stats.num_unmaps - stats.num_releases;
  EXPECT_GT(moved, 0);
  EXPECT_LE(moved, stats.num_device_allocs);
  EXPECT_LE(stats.num_maps + stats.num_unmaps, 3 * stats.num_device_allocs);
  EXPECT_LT(stats.peak_bytes_reserved, 16 * GiB);  // never at the limit, where stealing is a must
  for (void* block : live) ASSERT_TRUE(pool->deallocate(block));
}

// A pool that repeats its steps (512 allocations in a row from mapped
// memory) keeps up to 1/8 of its granules free rather than steal them: it
// creates the few granules a step drifts onto; memory left free in bulk is
// still stitched, and at the limit any block steals.
TEST(ExpandablePool, AWarmPoolCreatesForDriftAndStitchesWhatLiesFreeInBulk) {
  const auto warm_up = [](Allocator& pool) {
    for (int i = 0; i < 600; ++i) ASSERT_TRUE(pool.deallocate(must_allocate(pool, 4 * KiB)));
  };
  {
    auto device = host_device(4 * GiB);
    auto pool = expandable(device);
    std::vector<void*> blocks;
    for (int i = 0; i < 64; ++i) blocks.push_back(must_allocate(*pool, 16 * MiB));  // 512 granules
    (void)must_allocate(*pool, 4 * KiB);  // the small space's granule, so that warming up maps nothing
    for (int i : {4, 20, 36, 52}) {                                                 // 32 free: under 1/8
      ASSERT_TRUE(pool->deallocate(blocks[i]));
      blocks[i] = nullptr;
    }
    EXPECT_NE(pool->dump().find("growing:"), std::string::npos);
    ASSERT_NO_FATAL_FAILURE(warm_up(*pool));
    EXPECT_NE(pool->dump().find("warm:"), std::string::npos);
    const Stats warm = pool->stats();
    ASSERT_EQ(warm.granules_free, 32);
    // 24 MiB fits no 16 MiB hole: 12 granules, created.
    void* drift = must_allocate(*pool, 24 * MiB);
    const Stats drifted = pool->stats();
    EXPECT_EQ(drifted.num_unmaps, warm.num_unmaps);
    EXPECT_EQ(drifted.num_device_allocs, warm.num_device_allocs + 12);
    EXPECT_EQ(drifted.granules_free, 32);
    // A new phase: half the blocks freed (256 granules free), then 128 MiB
    // blocks. Stitched from the free granules while more than 1/8 is free.
    for (int i = 1; i < 64; i += 2) {
      ASSERT_TRUE(pool->deallocate(blocks[i]));
      blocks[i] = nullptr;
    }
    std::vector<void*> phase;
    for (int i = 0; i < 3; ++i) phase.push_back(must_allocate(*pool, 128 * MiB));
    const Stats after = pool->stats();
    EXPECT_EQ(after.num_device_allocs, drifted.num_device_allocs);  // nothing created
    EXPECT_EQ(after.num_unmaps, drifted.num_unmaps + 3 * 64);
    EXPECT_EQ(after.granules_free, 32 + 256 - 3 * 64);
    fill(drift, 24 * MiB, 8);
    for (std::size_t i = 0; i < phase.size(); ++i) fill(phase[i], 128 * MiB, 100 + i);
    for (int i = 0; i < 64; ++i) {
      if (blocks[i] != nullptr) fill(blocks[i], 16 * MiB, static_cast<std::uint64_t>(i));
    }
    EXPECT_TRUE(intact(drift, 24 * MiB, 8));
    for (std::size_t i = 0; i < phase.size(); ++i) EXPECT_TRUE(intact(phase[i], 128 * MiB, 100 + i));
    for (int i = 0; i < 64; ++i) {
      if (blocks[i] != nullptr) {
        EXPECT_TRUE(intact(blocks[i], 16 * MiB, static_cast<std::uint64_t>(i)));
      }
    }
  }
  {
    // At the limit a warm pool steals for any block: no OOM while free
    // granules can serve it.
    auto device = host_device(1 * GiB);
    auto pool = expandable(device);
    Fragmented state = fill_and_free_every_other(*pool);
    ASSERT_EQ(state.live.size(), 32u);
    ASSERT_NO_FATAL_FAILURE(warm_up(*pool));  // at the limit: the 4 KiB blocks' granule is stolen
    const Stats before = pool->stats();
    void* drift = must_allocate(*pool, 24 * MiB);
    const Stats after = pool->stats();
    EXPECT_EQ(after.num_unmaps, before.num_unmaps + 12);
    EXPECT_EQ(after.num_device_allocs, before.num_device_allocs);
    fill(drift, 24 * MiB, 9);
    for (std::size_t i = 0; i < state.live.size(); ++i) fill(state.live[i], 16 * MiB, i);
    EXPECT_TRUE(intact(drift, 24 * MiB, 9));
    for (std::size_t i = 0; i < state.live.size(); ++i) EXPECT_TRUE(intact(state.live[i], 16 * MiB, i));
  }
}

// Headroom (docs/expandable.md, "Headroom"): growing past the top of its
// mapped memory, the pool maps 1/512 of its granules more there, which the
// granule table does not count: blocks are placed as they would be without
// it, and one placed there maps nothing. While the pool grows, a block that
// takes headroom has it refilled past what it left; once warm, not (that
// pass makes no call). At the limit it gives way; trim gives it back; a
// pool with a release threshold keeps none.
TEST(ExpandablePool, HeadroomPastTheTopServesTheNextBlockAndGivesWayAtTheLimit) {
  {
    auto device = host_device(4 * GiB);
    auto pool = expandable(device);
    void* big = must_allocate(*pool, 2 * GiB);
    const Stats grown = pool->stats();
    EXPECT_EQ(grown.bytes_mapped, static_cast<std::int64_t>(2 * GiB + 4 * MiB));  // 1,024 granules, 2 more
    EXPECT_EQ(grown.bytes_reserved, grown.bytes_mapped);
    EXPECT_EQ(grown.granules_free, 0);
    void* next = must_allocate(*pool, 4 * MiB);  // the top's free range: on the headroom
    EXPECT_EQ(static_cast<char*>(next), static_cast<char*>(big) + 2 * GiB);
    const Stats took = pool->stats();
    EXPECT_EQ(took.num_device_allocs, grown.num_device_allocs + 2);  // growing: the 2 taken are refilled above
    EXPECT_EQ(took.num_maps, grown.num_maps + 2);
    EXPECT_EQ(took.bytes_mapped, grown.bytes_mapped + static_cast<std::int64_t>(4 * MiB));
    std::memset(next, 0x5a, 4 * MiB);
    ASSERT_TRUE(pool->deallocate(next));
    ASSERT_TRUE(pool->deallocate(big));
    // Warm (512 allocations in a row that map nothing, of two sizes: a
    // freed block held back and asked again is not counted): the same two
    // blocks again, the second on the refilled headroom, with no device call.
    for (int i = 0; i < 600; ++i) ASSERT_TRUE(pool->deallocate(must_allocate(*pool, (i % 2 == 0 ? 32 : 64) * MiB)));
    EXPECT_NE(pool->dump().find("; warm:"), std::string::npos);
    void* both = must_allocate(*pool, 2 * GiB + 4 * MiB);
    const Stats warm = pool->stats();
    EXPECT_EQ(warm.num_device_allocs, took.num_device_allocs);
    void* above = must_allocate(*pool, 4 * MiB);
    EXPECT_EQ(static_cast<char*>(above), static_cast<char*>(both) + 2 * GiB + 4 * MiB);
    const Stats quiet = pool->stats();
    EXPECT_EQ(quiet.num_device_allocs, warm.num_device_allocs);
    EXPECT_EQ(quiet.num_maps, warm.num_maps);
    EXPECT_EQ(quiet.bytes_mapped, warm.bytes_mapped);
    std::memset(above, 0x5a, 4 * MiB);
    ASSERT_TRUE(pool->deallocate(above));
    ASSERT_TRUE(pool->deallocate(both));
    const MemInfo before = device->mem_info();
    EXPECT_EQ(pool->trim(), 2 * GiB + 8 * MiB);
    EXPECT_EQ(pool->stats().bytes_mapped, 0);
    EXPECT_EQ(device->mem_info().free_bytes, before.free_bytes + 2 * GiB + 8 * MiB);
  }
  {
    // The headroom fills the pool's limit: a small block, which needs a
    // granule of its own, still fits (the headroom goes back, no OOM; the
    // small blocks' space then has a granule of headroom, in what is left).
    auto device = host_device(2 * GiB + 4 * MiB);
    auto pool = expandable(device);
    void* big = must_allocate(*pool, 2 * GiB);
    ASSERT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(2 * GiB + 4 * MiB));
    void* small = must_allocate(*pool, 64 * KiB);
    const Stats after = pool->stats();
    EXPECT_EQ(after.num_ooms, 0);
    EXPECT_EQ(after.num_releases, 2);
    EXPECT_EQ(after.num_unmaps, 2);
    EXPECT_EQ(after.bytes_mapped, static_cast<std::int64_t>(2 * GiB + 4 * MiB));
    EXPECT_EQ(after.granules_free, 0);
    std::memset(small, 0x5a, 64 * KiB);
    ASSERT_TRUE(pool->deallocate(small));
    ASSERT_TRUE(pool->deallocate(big));
  }
  {
    ExpandableOptions options;
    options.release_threshold = 0;
    auto pool = expandable(host_device(4 * GiB), options);
    void* big = must_allocate(*pool, 2 * GiB);
    EXPECT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(2 * GiB));
    ASSERT_TRUE(pool->deallocate(big));
  }
}

TEST(ExpandablePool, ReleaseThresholdBoundsTheCachedGranules) {
  auto device = host_device(1 * GiB);
  ExpandableOptions options;
  options.release_threshold = 32 * MiB;
  auto pool = expandable(device, options);
  void* a = must_allocate(*pool, 200 * MiB);
  void* b = must_allocate(*pool, 10 * MiB);
  ASSERT_TRUE(pool->deallocate(a));
  EXPECT_EQ(pool->stats().granules_free * static_cast<std::int64_t>(2 * MiB), 32 * MiB);
  EXPECT_EQ(device->mem_info().free_bytes, 1 * GiB - 10 * MiB - 32 * MiB);
  ASSERT_TRUE(pool->deallocate(b));
  EXPECT_EQ(pool->stats().bytes_mapped, 32 * MiB);

  options.release_threshold = 0;  // hand every empty granule back at once
  auto eager = expandable(device, options);
  void* c = must_allocate(*eager, 5 * MiB);
  ASSERT_TRUE(eager->deallocate(c));
  EXPECT_EQ(eager->stats().bytes_mapped, 0);
}

TEST(ExpandablePool, ErrorsAreClearAndChangeNothing) {
  auto device = host_device(64 * MiB);
  auto pool = expandable(device);
  Expected<void*> too_large = pool->allocate(65 * MiB);
  ASSERT_FALSE(too_large);
  EXPECT_EQ(too_large.error().code(), Errc::out_of_memory);
  EXPECT_NE(too_large.error().message().find("larger than the pool's limit"), std::string::npos)
      << too_large.error().message();

  void* a = must_allocate(*pool, 40 * MiB);
  Expected<void*> no_room = pool->allocate(30 * MiB);
  ASSERT_FALSE(no_room);
  ASSERT_NE(no_room.error().oom(), nullptr);
  EXPECT_EQ(no_room.error().oom()->bytes_in_use, 40 * MiB);
  EXPECT_NE(no_room.error().oom()->hint.find("at its limit"), std::string::npos) << no_room.error().message();
  EXPECT_EQ(pool->stats().num_ooms, 2);

  int local = 0;
  Status foreign = pool->deallocate(&local);
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().code(), Errc::invalid_pointer);
  Status inside = pool->deallocate(static_cast<char*>(a) + 256);
  ASSERT_FALSE(inside);
  EXPECT_EQ(inside.error().code(), Errc::invalid_pointer);
  ASSERT_TRUE(pool->deallocate(a));
  Status twice = pool->deallocate(a);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), Errc::double_free);
  EXPECT_EQ(pool->stats().bytes_in_use, 0);
  void* whole = must_allocate(*pool, 64 * MiB);  // still usable, all of it
  ASSERT_TRUE(pool->deallocate(whole));
}

class NoVirtualMemory final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  bool supports_virtual_memory() const override { return false; }
};

TEST(ExpandablePool, NeedsVirtualMemory) {
  auto pool = ExpandablePool::create(std::make_shared<NoVirtualMemory>(host_device(64 * MiB)));
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::unsupported);
  EXPECT_NE(pool.error().message().find("no virtual memory"), std::string::npos);

  auto tiny = ExpandablePool::create(limited(host_device(64 * MiB), 1 * MiB));
  ASSERT_FALSE(tiny);
  EXPECT_EQ(tiny.error().code(), Errc::invalid_argument);
  EXPECT_NE(tiny.error().message().find("less than one 2.00 MiB granule"), std::string::npos)
      << tiny.error().message();
}

TEST(ExpandablePool, TheMappingLimitIsAClearErrorAndThePoolRecovers) {
  // Room for the two reservations and a few runs of granules: stitching
  // scattered granules makes a mapping per granule, and the device refuses
  // the one past its budget.
  auto device = host_device(256 * MiB, 12);
  auto pool = expandable(device);
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(must_allocate(*pool, 16 * MiB));  // one run: merges
  for (int i = 0; i < 16; i += 2) ASSERT_TRUE(pool->deallocate(blocks[i]));
  Expected<void*> stitched = pool->allocate(128 * MiB);  // eight scattered runs side by side
  ASSERT_FALSE(stitched);
  EXPECT_EQ(stitched.error().code(), Errc::limit_reached) << stitched.error().message();
  EXPECT_NE(stitched.error().message().find("vm.max_map_count"), std::string::npos) << stitched.error().message();
  // Only map() is refused for the budget; an unmap that splits a mapping may
  // pass it by one (the headroom HostDevice leaves under vm.max_map_count).
  EXPECT_LE(device->mapping_count(), device->max_mappings() + 1);

  // Nothing was lost: the live blocks are intact, and everything can be freed and handed back.
  const Stats after = pool->stats();
  EXPECT_EQ(after.bytes_in_use, static_cast<std::int64_t>(8 * 16 * MiB));
  for (int i = 1; i < 16; i += 2) ASSERT_TRUE(pool->deallocate(blocks[i]));
  pool->trim();
  EXPECT_EQ(device->mem_info().free_bytes, 256 * MiB);
  void* whole = must_allocate(*pool, 256 * MiB);  // fresh granules map as one run again
  ASSERT_TRUE(pool->deallocate(whole));
}

// Records the order of synchronize() and unmap() calls. Its streams are
// always busy: a query never spares a synchronize.
class CallOrderDevice final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  Expected<bool> query(Stream) override { return false; }
  Status synchronize(Stream stream) override {
    calls.push_back("sync " + std::to_string(stream));
    return DeviceAdaptor::synchronize(stream);
  }
  Status unmap(void* va, std::size_t bytes) override {
    calls.push_back("unmap");
    return DeviceAdaptor::unmap(va, bytes);
  }
  std::vector<std::string> calls;
};

// cuMemUnmap, unlike cudaFree, does not wait for work queued on the memory:
// a pool destroyed right after its blocks were freed waits for their streams
// before it unmaps (on a GPU, a memset still running faulted otherwise).
TEST(ExpandablePool, DestroyingThePoolWaitsForTheStreamsBlocksWereFreedOn) {
  auto order = std::make_shared<CallOrderDevice>(host_device(64 * MiB));
  {
    auto pool = expandable(order);
    void* a = must_allocate(*pool, 4 * MiB, 1);
    void* b = must_allocate(*pool, 8 * MiB, 2);
    ASSERT_TRUE(pool->deallocate(a, 1));
    ASSERT_TRUE(pool->deallocate(b, 2));
    order->calls.clear();
  }
  const auto first_unmap = std::find(order->calls.begin(), order->calls.end(), "unmap");
  ASSERT_NE(first_unmap, order->calls.end()) << "the pool unmapped nothing";
  EXPECT_NE(std::find(order->calls.begin(), first_unmap, "sync 1"), first_unmap);
  EXPECT_NE(std::find(order->calls.begin(), first_unmap, "sync 2"), first_unmap);
}

// Streams that freed a stolen granule are waited for: synchronized while
// the device finds them busy, only asked (a query) when it finds them idle.
TEST(ExpandablePool, StealingAGranuleWaitsForTheStreamsThatFreedIt) {
  for (const bool lazy : {false, true}) {
    for (const bool idle : {false, true}) {
      SCOPED_TRACE(std::string(idle ? "streams idle" : "streams busy") + (lazy ? ", freed in lazy mode" : ""));
      auto counting = std::make_shared<SyncCountingDevice>(host_device(66 * MiB));
      counting->set_idle(idle);
      auto pool = expandable(counting);
      constexpr Stream kOne = 1, kTwo = 2, kThree = 3;
      // a and b, each 8 granules, kept apart by live one-granule blocks.
      void* a = must_allocate(*pool, 16 * MiB, kOne);
      void* keep_1 = must_allocate(*pool, 2 * MiB);
      void* b = must_allocate(*pool, 16 * MiB, kTwo);
      void* keep_2 = must_allocate(*pool, 2 * MiB);
      // Lazy: enough allocations served from mapped memory (a granule kept
      // by `pin`) that frees leave the granule table alone.
      void* pin = must_allocate(*pool, 64 * KiB, kThree);
      for (std::uint32_t i = 0; lazy && i <= expandable::kQuietAllocations; ++i) {
        ASSERT_TRUE(pool->deallocate(must_allocate(*pool, 64 * KiB, kThree), kThree));
      }
      ASSERT_TRUE(pool->deallocate(a, kOne));
      ASSERT_TRUE(pool->deallocate(b, kTwo));
      EXPECT_EQ(counting->total_calls(), 0);  // freeing never waits
      EXPECT_EQ(counting->queries(), 0);
      // 60 MiB on a third stream: fresh address space, backed by all 16 free
      // granules (stolen from a and b) and 14 new ones. Work queued on
      // streams 1 and 2 may still touch the stolen ones: both are waited for.
      void* d = must_allocate(*pool, 60 * MiB, kThree);
      EXPECT_GE(counting->queries(), 2);
      EXPECT_EQ(counting->calls(kOne) >= 1, !idle);
      EXPECT_EQ(counting->calls(kTwo) >= 1, !idle);
      EXPECT_EQ(counting->calls(kThree), 0);
      EXPECT_EQ(pool->stats().num_stitches, 1);
      EXPECT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(66 * MiB));
      EXPECT_NE(pool->dump().find(lazy ? "rebuilt from the arenas 1 times" : "rebuilt from the arenas 0 times"),
                std::string::npos);
      for (void* block : {d, keep_1, keep_2, pin}) ASSERT_TRUE(pool->deallocate(block, kThree));
    }
  }
}

TEST(ExpandablePool, GranulesFreedByMoreStreamsThanHaveTagsWaitForEveryStream) {
  // 70 one-granule blocks, each freed on a stream of its own: the granule
  // table tags the first 64 streams one by one and the rest together, and a
  // steal of a granule tagged "many" waits for every stream that freed.
  auto counting = std::make_shared<SyncCountingDevice>(host_device(256 * MiB));
  ExpandableOptions options;
  options.release_threshold = 1 * GiB;  // no block held back: each free lands now
  auto pool = expandable(counting, options);
  constexpr Stream kStreams = 70, kOther = 1000;
  std::vector<void*> blocks;
  for (Stream stream = 1; stream <= kStreams; ++stream) blocks.push_back(must_allocate(*pool, 2 * MiB, stream));
  for (Stream stream = 1; stream <= kStreams; ++stream) ASSERT_TRUE(pool->deallocate(blocks[stream - 1], stream));
  EXPECT_EQ(counting->total_calls(), 0);
  // The highest granules, stolen first, are those of streams 65 to 70.
  void* big = must_allocate(*pool, 200 * MiB, kOther);
  EXPECT_GT(pool->stats().num_unmaps, 6);
  for (Stream stream = 1; stream <= kStreams; ++stream) EXPECT_GE(counting->calls(stream), 1) << "stream " << stream;
  EXPECT_EQ(counting->calls(kOther), 0);
  ASSERT_TRUE(pool->deallocate(big, kOther));
}

// Once quiet, the granule table stops following blocks (lazy mode) and is
// rebuilt from the arenas when needed: a block that needs memory, stats(),
// trim(). Checked against the live blocks themselves: the free granules
// stats() reports are the mapped ones that no live block overlaps, and every
// block keeps its data through the steals that follow rebuilds.
TEST(ExpandablePool, TheGranuleTableRebuiltFromTheArenasMatchesTheLiveBlocks) {
  constexpr std::size_t kGranule = 2 * MiB;
  auto pool = expandable(host_device(384 * MiB));
  struct Live {
    void* ptr;
    std::size_t bytes;
    std::uint64_t seed;
    Stream stream;
  };
  std::vector<Live> live;
  std::size_t live_bytes = 0;
  std::mt19937_64 rng(12);
  std::uint64_t seed = 1;
  const auto check_free_granules = [&] {
    std::vector<std::uintptr_t> covered;
    for (const Live& block : live) {
      const auto base = reinterpret_cast<std::uintptr_t>(block.ptr);
      for (std::uintptr_t g = base / kGranule; g <= (base + block.bytes - 1) / kGranule; ++g) covered.push_back(g);
    }
    std::sort(covered.begin(), covered.end());
    covered.erase(std::unique(covered.begin(), covered.end()), covered.end());
    const Stats stats = pool->stats();
    EXPECT_EQ(static_cast<std::size_t>(stats.granules_free),
              static_cast<std::size_t>(stats.bytes_mapped) / kGranule - covered.size());
  };
  const auto free_one = [&](std::size_t index) {
    const Live block = live[index];
    ASSERT_TRUE(intact(block.ptr, block.bytes, block.seed, 512)) << "block " << block.ptr;
    ASSERT_TRUE(pool->deallocate(block.ptr, block.stream));
    live_bytes -= block.bytes;
    live[index] = live.back();
    live.pop_back();
  };
  // Phases of repeated steps (quiet: the pool turns lazy) and of new sizes
  // (blocks that need memory: rebuilt, steals).
  for (int phase = 0; phase < 6; ++phase) {
    const bool repeat = phase % 2 == 1;
    std::vector<std::size_t> step;
    for (int i = 0; i < 40; ++i) {
      const bool large = rng() % 3 == 0;
      step.push_back((large ? MiB + rng() % (12 * MiB) : 256 + rng() % (256 * KiB)) / 256 * 256);
    }
    for (int round = 0; round < 400; ++round) {
      for (std::size_t i = 0; i < step.size(); ++i) {
        const std::size_t bytes = repeat ? step[i] : step[(i + rng()) % step.size()] + (rng() % 64) * 256;
        while (live_bytes + bytes > 200 * MiB) free_one(rng() % live.size());
        const auto stream = static_cast<Stream>(1 + rng() % 3);
        void* ptr = must_allocate(*pool, bytes, stream);
        fill(ptr, bytes, seed, 512);
        live.push_back({ptr, bytes, seed++, stream});
        live_bytes += bytes;
        if (repeat && live.size() > 30) free_one(0);
      }
      if (round % 100 == 99) check_free_granules();
    }
  }
  const std::string dump = pool->dump();
  const std::size_t at = dump.find("rebuilt from the arenas ");
  ASSERT_NE(at, std::string::npos) << dump;
  EXPECT_GT(std::stoll(dump.substr(at + 24)), 3) << dump.substr(0, 400);
  EXPECT_GT(pool->stats().num_stitches, 0);
  while (!live.empty()) free_one(live.size() - 1);
  check_free_granules();
}

// A large block freed is held back whole: asked for again at its size on its
// stream it comes back as it was; to everything else its granules are free.
// stats() and dump() observe: blocks held back stay held (the ledger's
// thread reads stats() every 100 ms), and the figures count their granules
// free as completing the frees would.
TEST(ExpandablePool, StatsAndDumpLeaveHeldBlocksHeld) {
  auto pool = expandable(host_device(64 * MiB));
  // Blocks whose ends share granules: with each other, and with live ones.
  void* before = must_allocate(*pool, 3 * MiB);
  void* a = must_allocate(*pool, 5 * MiB);
  void* b = must_allocate(*pool, 3 * MiB);
  void* c = must_allocate(*pool, 9 * MiB);
  void* after = must_allocate(*pool, 3 * MiB);
  for (void* block : {a, b, c}) ASSERT_TRUE(pool->deallocate(block));
  const Stats seen = pool->stats();
  EXPECT_EQ(pool->stats().granules_free, seen.granules_free);
  const std::string dump = pool->dump();
  EXPECT_NE(dump.find("held back (freed, counted free; live above until the same request or another needs them): 3 "
                      "blocks"),
            std::string::npos)
      << dump;
  // A free that is not a block's completes the held frees (the arena says
  // what the pointer is): the figures are the same.
  ASSERT_FALSE(pool->deallocate(static_cast<char*>(c) + 4096));
  EXPECT_EQ(pool->dump().find("held back"), std::string::npos);
  const Stats completed = pool->stats();
  EXPECT_GT(completed.granules_free, 0);
  EXPECT_EQ(seen.granules_free, completed.granules_free);
  EXPECT_EQ(seen.largest_free_block_bytes, completed.largest_free_block_bytes);
  EXPECT_EQ(seen.bytes_in_use, completed.bytes_in_use);
  ASSERT_TRUE(pool->deallocate(before));
  ASSERT_TRUE(pool->deallocate(after));
}

// Holding back pays only where sizes repeat: after a window of large frees
// that nobody asks for again, blocks are freed at once; sampled later, a
// program that asks for the sizes it frees gets them held again. Each free
// here follows a request, as in a running program (see the teardown below).
TEST(HoldBack, StopsWhereSizesDoNotRepeatAndResumesWhereTheyDo) {
  using expandable::HoldBack;
  HoldBack hold;
  constexpr Stream kStream = 3;
  const auto free_after_a_miss = [&hold] {
    hold.asked(false);
    return hold.hold_next();
  };
  // A window of frees that nobody asks for again (its last free is the
  // first judged).
  for (std::uint32_t i = 1; i < HoldBack::kWindow; ++i) ASSERT_TRUE(free_after_a_miss()) << i;
  EXPECT_FALSE(free_after_a_miss());
  // Skipped until the next sample, which holds nothing either.
  for (std::uint32_t i = 1; i < HoldBack::kRetry; ++i) ASSERT_FALSE(free_after_a_miss()) << i;
  EXPECT_FALSE(hold.sampling());
  EXPECT_FALSE(free_after_a_miss());
  EXPECT_TRUE(hold.sampling());
  // A sample is judged as holding would be: a hit is a size freed on a
  // stream and asked for again on it, once. 31 hits in 256: skipped again.
  const auto sample = [&hold](std::uint32_t hits) {
    for (std::uint32_t i = 1; i < HoldBack::kWindow; ++i) {
      if (hold.hold_next()) return false;
      hold.freed(i * MiB, kStream);
      hold.sample(i * MiB, kStream + 1);
      hold.sample(i * MiB + 256, kStream);
      for (int twice = 0; twice < 2 && i <= hits; ++twice) hold.sample(i * MiB, kStream);
      hold.asked(false);
    }
    return true;
  };
  ASSERT_TRUE(sample(HoldBack::kWindow / 8 - 1));
  EXPECT_FALSE(hold.hold_next());
  EXPECT_FALSE(hold.sampling());
  for (std::uint32_t i = 1; i < HoldBack::kRetry; ++i) ASSERT_FALSE(free_after_a_miss()) << i;
  EXPECT_FALSE(free_after_a_miss());
  EXPECT_TRUE(hold.sampling());
  ASSERT_TRUE(sample(HoldBack::kWindow / 8));
  EXPECT_TRUE(hold.hold_next());  // 1/8 of the sample was asked for again
  EXPECT_FALSE(hold.sampling());
  // Holding, with fewer hits than 1/8: skipped again.
  for (std::uint32_t i = 1; i < HoldBack::kWindow; ++i) {
    hold.asked(i % 9 == 0);
    ASSERT_TRUE(hold.hold_next()) << i;
  }
  hold.asked(false);
  EXPECT_FALSE(hold.hold_next());
}

// More than kHeldBlocks large frees in a row with no request between them
// are a teardown (the end of a step or of a program's pass over its data):
// nothing more is held, and those frees count in no window, so a long
// teardown (here 16 windows of frees nobody asks for again) leaves holding
// on for the next phase. A pool that went on judging them would stop
// holding there, and place the next phase's blocks elsewhere than the last.
TEST(HoldBack, ATeardownHoldsNothingAndCountsInNoWindow) {
  using expandable::HoldBack;
  HoldBack hold;
  for (std::uint32_t i = 0; i < expandable::kHeldBlocks; ++i) ASSERT_TRUE(hold.hold_next()) << i;
  for (std::uint32_t i = 0; i < 16 * HoldBack::kWindow; ++i) ASSERT_FALSE(hold.hold_next()) << i;
  // The next phase finds holding on. Its first window is the 16 frees
  // above and those after them, each after a request, 1 in 7 of them asked
  // for again: enough to go on holding.
  hold.asked(false);
  ASSERT_TRUE(hold.hold_next());
  for (std::uint32_t i = 1; i < HoldBack::kWindow - expandable::kHeldBlocks - 1; ++i) {
    hold.asked(i % 7 == 0);
    ASSERT_TRUE(hold.hold_next()) << i;
  }
  hold.asked(false);
  EXPECT_TRUE(hold.hold_next());  // judged: 34 hits in 256 frees
}

// At the pool: a teardown (every block of a step freed, here 24) leaves
// nothing held, so the next step starts as this one did; and blocks are
// held back whether or not the granule table follows every block (lazy
// mode), so where a block goes does not depend on it.
TEST(ExpandablePool, ATeardownLeavesNothingHeldAndLazyModeHoldsAsExactModeDoes) {
  auto counting = std::make_shared<SyncCountingDevice>(host_device(512 * MiB));
  auto pool = expandable(counting);
  std::vector<void*> step;
  for (int i = 0; i < 24; ++i) step.push_back(must_allocate(*pool, (4 + i % 3) * MiB));
  for (void* block : step) ASSERT_TRUE(pool->deallocate(block));
  EXPECT_EQ(pool->dump().find("held back"), std::string::npos) << pool->dump();
  // The step plan hears of it: what comes next is only appended, not searched.
  EXPECT_NE(pool->dump().find("a teardown since the last device call"), std::string::npos) << pool->dump();
  // The same step again lands where it did, on mapped memory.
  const std::int64_t maps = pool->stats().num_maps;
  for (int i = 0; i < 24; ++i) {
    void* block = must_allocate(*pool, (4 + i % 3) * MiB);
    EXPECT_EQ(block, step[i]) << i;
  }
  EXPECT_EQ(pool->stats().num_maps, maps);
  // Lazy: enough allocations served from mapped memory (a granule of small
  // blocks, mapped once) that frees leave the granule table alone (dump()
  // below makes it exact again, so it comes last).
  void* small = must_allocate(*pool, 64 * KiB);
  for (std::uint32_t i = 0; i <= expandable::kQuietAllocations; ++i) {
    ASSERT_TRUE(pool->deallocate(must_allocate(*pool, 64 * KiB)));
  }
  void* held = step[6];
  ASSERT_TRUE(pool->deallocate(held));
  EXPECT_NE(pool->dump().find("held back (freed, counted free; live above until the same request or another "
                              "needs them): 1 block"),
            std::string::npos)
      << pool->dump();
  EXPECT_EQ(must_allocate(*pool, 4 * MiB), held);
  EXPECT_EQ(pool->stats().num_maps, maps + 1);
  for (void* block : step) ASSERT_TRUE(pool->deallocate(block));
  ASSERT_TRUE(pool->deallocate(small));
  EXPECT_EQ(counting->total_calls(), 0);
}

// Where a block goes depends on what the program did, never on whether the
// granule table follows every block (exact) or, once the pool is quiet, not
// (lazy): the same program is placed the same way in both. Three 8 MiB
// blocks are freed: E between live blocks, then B and A, side by side; 8
// MiB asked for again gets A, held back, in either mode. (A pool that held
// large frees back only while exact gave A there and E, the arena's best
// fit, once lazy, and a repeated program drifted.)
TEST(ExpandablePool, WhereABlockGoesDoesNotDependOnTheGranuleTablesMode) {
  struct Placed {
    std::ptrdiff_t again;  // the block asked for again, from the first block
    std::string dump;
  };
  const auto run = [](bool lazy) {
    auto pool = expandable(host_device(256 * MiB));
    std::vector<void*> blocks;  // keep, E, keep, A, B, keep
    for (int i = 0; i < 6; ++i) blocks.push_back(must_allocate(*pool, 8 * MiB));
    void* small = must_allocate(*pool, 64 * KiB);
    for (std::uint32_t i = 0; lazy && i <= expandable::kQuietAllocations; ++i) {
      EXPECT_TRUE(pool->deallocate(must_allocate(*pool, 64 * KiB)));
    }
    for (int i : {1, 4, 3}) EXPECT_TRUE(pool->deallocate(blocks[i]));
    void* again = must_allocate(*pool, 8 * MiB);
    Placed placed{static_cast<char*>(again) - static_cast<char*>(blocks[0]), pool->dump()};
    for (void* block : {blocks[0], blocks[2], blocks[5], again, small}) EXPECT_TRUE(pool->deallocate(block));
    return placed;
  };
  const Placed exact = run(false), lazy = run(true);
  EXPECT_NE(exact.dump.find("rebuilt from the arenas 0 times"), std::string::npos) << exact.dump;
  EXPECT_NE(lazy.dump.find("rebuilt from the arenas 1 times"), std::string::npos) << lazy.dump;
  EXPECT_EQ(exact.again, static_cast<std::ptrdiff_t>(24 * MiB));  // A
  EXPECT_EQ(lazy.again, exact.again);
}

TEST(ExpandablePool, LargeBlocksHeldBackOnFreeAreFreeToEveryoneElse) {
  auto counting = std::make_shared<SyncCountingDevice>(host_device(32 * MiB));
  auto pool = expandable(counting);
  void* whole = must_allocate(*pool, 32 * MiB);
  fill(whole, 32 * MiB, 7, 4096);
  const std::int64_t maps = pool->stats().num_maps;
  ASSERT_TRUE(pool->deallocate(whole));
  void* again = must_allocate(*pool, 32 * MiB);
  EXPECT_EQ(again, whole);
  EXPECT_TRUE(intact(again, 32 * MiB, 7, 4096));
  EXPECT_EQ(pool->stats().num_maps, maps);
  ASSERT_TRUE(pool->deallocate(again));

  // Counted free at once: stats see every granule free, nothing in use.
  const Stats freed = pool->stats();
  EXPECT_EQ(freed.bytes_in_use, 0);
  EXPECT_EQ(freed.granules_free, 16);

  ASSERT_TRUE(pool->deallocate(must_allocate(*pool, 32 * MiB)));  // held again
  // A small block at the limit: the held block's granules are stolen for it.
  void* small = must_allocate(*pool, 512 * KiB);
  EXPECT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ(pool->stats().num_stitches, 1);
  ASSERT_TRUE(pool->deallocate(small));

  // Errors name what the pointer really is, held or not.
  void* large = must_allocate(*pool, 16 * MiB);
  ASSERT_TRUE(pool->deallocate(large));
  Status twice = pool->deallocate(large);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), Errc::double_free) << twice.error().message();
  large = must_allocate(*pool, 16 * MiB);
  ASSERT_TRUE(pool->deallocate(large));
  Status inside = pool->deallocate(static_cast<char*>(large) + 4096);
  ASSERT_FALSE(inside);
  EXPECT_EQ(inside.error().message().find("live block"), std::string::npos) << inside.error().message();

  // Freed on one stream, asked for on another: not handed over unsynchronized.
  void* on_one = must_allocate(*pool, 8 * MiB, 1);
  ASSERT_TRUE(pool->deallocate(on_one, 1));
  EXPECT_EQ(counting->calls(1), 0);
  void* on_two = must_allocate(*pool, 8 * MiB, 2);
  if (on_two == on_one) {
    EXPECT_GE(counting->calls(1), 1);
  }
  ASSERT_TRUE(pool->deallocate(on_two, 2));
  EXPECT_EQ(pool->stats().bytes_in_use, 0);
}

// Polls `done` for up to 20 s: long enough for a loaded machine, and the
// test ends as soon as the pool has acted.
template <class Done>
bool eventually(Done done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ExpandablePool, AnIdlePoolHandsItsCacheBack) {
  auto device = host_device(256 * MiB);
  ExpandableOptions options;
  options.idle_release = std::chrono::milliseconds(20);
  auto pool = expandable(device, options);
  void* keep = must_allocate(*pool, 10 * MiB);
  void* a = must_allocate(*pool, 100 * MiB);
  void* b = must_allocate(*pool, 4 * KiB);
  ASSERT_TRUE(pool->deallocate(a));
  ASSERT_TRUE(pool->deallocate(b));
  // Every free granule goes back; the live block keeps its own.
  ASSERT_TRUE(eventually([&] { return device->mem_info().free_bytes == 256 * MiB - 10 * MiB; }))
      << pool->dump();
  const Stats idle = pool->stats();
  EXPECT_EQ(idle.bytes_mapped, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(idle.granules_free, 0);
  EXPECT_EQ(idle.num_releases, 51);  // 100 MiB + 4 KiB took 50 + 1 granules

  // It works on afterwards, and releases again once idle again.
  void* c = must_allocate(*pool, 50 * MiB);
  fill(c, 50 * MiB, 3, 4096);
  EXPECT_TRUE(intact(c, 50 * MiB, 3, 4096));
  ASSERT_TRUE(pool->deallocate(c));
  ASSERT_TRUE(eventually([&] { return device->mem_info().free_bytes == 256 * MiB - 10 * MiB; }));
  ASSERT_TRUE(pool->deallocate(keep));
  ASSERT_TRUE(eventually([&] { return device->mem_info().free_bytes == 256 * MiB; }));
}

TEST(ExpandablePool, ABusyPoolKeepsItsCache) {
  auto device = host_device(256 * MiB);
  ExpandableOptions options;
  options.idle_release = std::chrono::seconds(3);  // far more than the gaps below
  auto pool = expandable(device, options);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(pool->deallocate(must_allocate(*pool, 64 * MiB)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool->stats().bytes_mapped, static_cast<std::int64_t>(64 * MiB));
  EXPECT_EQ(pool->stats().num_releases, 0);
  // Destroyed while its thread waits: that thread stops, all goes back.
  pool.reset();
  EXPECT_EQ(device->mem_info().free_bytes, 256 * MiB);

  options.idle_release = std::chrono::milliseconds(-1);
  auto negative = ExpandablePool::create(device, options);
  ASSERT_FALSE(negative);
  EXPECT_EQ(negative.error().code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace tidepool::test
