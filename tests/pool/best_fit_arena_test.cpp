// The pool layer's internal pieces: size bins, the bin bitmap, the address
// map, the granule bitmap and the best-fit arena over regions the test
// supplies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <unordered_map>
#include <vector>

#include "pool/address_map.hpp"
#include "pool/best_fit_arena.hpp"
#include "pool/granule_table.hpp"
#include "pool/size_bins.hpp"
#include "pool/stream_values.hpp"
#include "pool_test_support.hpp"

namespace tidepool::test {
namespace {

using pool::AddressMap;
using pool::BestFitArena;
using pool::BinBitmap;
using pool::GranuleBits;
using pool::GranuleId;
using pool::GranuleTable;
using pool::MemoryRange;
using pool::PlacedBlock;
using pool::PlacementCost;
using pool::SizeBins;
using pool::StreamValues;

TEST(SizeBins, EachBinStartsWhereThePreviousEnds) {
  for (std::size_t bin = 0; bin + 1 < SizeBins::kNumBins && SizeBins::lower_bound(bin + 1) < (std::size_t{1} << 62);
       ++bin) {
    const std::size_t low = SizeBins::lower_bound(bin);
    const std::size_t next = SizeBins::lower_bound(bin + 1);
    ASSERT_LT(low, next) << "bin " << bin;
    EXPECT_EQ(SizeBins::bin_of(low), bin) << "bin " << bin;
    EXPECT_EQ(SizeBins::bin_of(next - pool::kChunkGranule), bin) << "bin " << bin;
    EXPECT_EQ(SizeBins::bin_of(next), bin + 1) << "bin " << bin;
  }
  EXPECT_TRUE(SizeBins::is_exact(SizeBins::bin_of(1 * MiB)));
  EXPECT_FALSE(SizeBins::is_exact(SizeBins::bin_of(1 * MiB + 256)));
  EXPECT_LT(SizeBins::bin_of(std::size_t{1} << 63), SizeBins::kNumBins);
}

TEST(BinBitmap, FindsTheNextAndLastSetBin) {
  BinBitmap bitmap;
  EXPECT_EQ(bitmap.first_at_or_after(0), BinBitmap::kNone);
  EXPECT_EQ(bitmap.last(), BinBitmap::kNone);
  for (std::size_t bin : {3u, 64u, 4095u, 4200u}) bitmap.set(bin);
  EXPECT_EQ(bitmap.first_at_or_after(0), 3u);
  EXPECT_EQ(bitmap.first_at_or_after(4), 64u);
  EXPECT_EQ(bitmap.first_at_or_after(65), 4095u);
  EXPECT_EQ(bitmap.first_at_or_after(4096), 4200u);
  EXPECT_EQ(bitmap.first_at_or_after(4201), BinBitmap::kNone);
  EXPECT_EQ(bitmap.last(), 4200u);
  bitmap.clear(4200);
  EXPECT_EQ(bitmap.last(), 4095u);
  EXPECT_EQ(bitmap.first_at_or_after(4096), BinBitmap::kNone);
}

TEST(AddressMap, AgreesWithAnUnorderedMapUnderRandomInsertsAndErases) {
  AddressMap map;
  std::unordered_map<std::uintptr_t, AddressMap::Value> expected;
  std::mt19937_64 random(5);
  std::vector<std::uintptr_t> keys;
  for (int op = 0; op < 200000; ++op) {
    if (!keys.empty() && random() % 3 == 0) {
      const std::size_t index = random() % keys.size();
      ASSERT_EQ(map.take(keys[index]), expected[keys[index]]);
      expected.erase(keys[index]);
      keys[index] = keys.back();
      keys.pop_back();
    } else {
      const std::uintptr_t key = (1 + random() % 100000) * 256;
      if (expected.count(key) != 0) continue;
      const auto value = static_cast<AddressMap::Value>(op);
      map.insert(key, value);
      expected[key] = value;
      keys.push_back(key);
    }
    if (op % 10000 == 0) {
      for (const auto& [key, value] : expected) ASSERT_EQ(map.find(key), value);
    }
  }
  EXPECT_EQ(map.size(), expected.size());
  for (const auto& [key, value] : expected) ASSERT_EQ(map.find(key), value);
  EXPECT_EQ(map.find(256 * 200001), AddressMap::kMissing);
  EXPECT_EQ(map.take(256 * 200001), AddressMap::kMissing);
  EXPECT_EQ(map.size(), expected.size());
}

TEST(GranuleBits, FindRunAgreesWithABitByBitSearch) {
  std::mt19937_64 random(7);
  for (int round = 0; round < 200; ++round) {
    const std::size_t size = 1 + random() % 600;
    const unsigned density = static_cast<unsigned>(random() % 4);  // sparse to nearly full
    GranuleBits bits;
    bits.resize(size);
    std::vector<bool> model(size);
    for (std::size_t i = 0; i < size; ++i) {
      if (random() % 4 < density + (density == 3 ? 1 : 0)) {
        bits.set(i);
        model[i] = true;
      }
    }
    for (int query = 0; query < 20; ++query) {
      const std::size_t first = random() % size, last = first + random() % (size - first);
      const std::size_t n = 1 + random() % (last - first + 1);
      std::size_t expected = GranuleBits::kNoBit;
      for (std::size_t start = first, run = 0; start + run <= last;) {
        if (!model[start + run]) {
          start += run + 1;
          run = 0;
        } else if (++run == n) {
          expected = start;
          break;
        }
      }
      ASSERT_EQ(bits.find_run(first, last, n), expected) << "size " << size << " [" << first << ", " << last
                                                          << "] n " << n;
    }
  }
}

TEST(GranuleBits, AllAndCountAgreeWithABitByBitCheck) {
  // Ranges within one word, across two, and across several; bitmaps from
  // nearly empty to nearly full, so that some ranges are all set.
  std::mt19937_64 random(13);
  for (int round = 0; round < 200; ++round) {
    const std::size_t size = 1 + random() % 600;
    const unsigned unset_in = 2 + static_cast<unsigned>(random() % 400);  // 1 bit in unset_in is clear
    GranuleBits bits;
    bits.resize(size);
    std::vector<bool> model(size);
    for (std::size_t i = 0; i < size; ++i) {
      if (random() % unset_in != 0) {
        bits.set(i);
        model[i] = true;
      }
    }
    for (int query = 0; query < 40; ++query) {
      const std::size_t first = random() % size;
      const std::size_t last = first + random() % std::min<std::size_t>(size - first, query % 2 ? 200 : 64);
      std::size_t set = 0;
      for (std::size_t i = first; i <= last; ++i) set += model[i] ? 1 : 0;
      ASSERT_EQ(bits.all(first, last), set == last - first + 1) << "size " << size << " [" << first << ", " << last
                                                                  << "]";
      ASSERT_EQ(bits.count(first, last), set);
    }
  }
}

TEST(StreamValues, AgreesWithAMapForManyStreamsSharingSlots) {
  // 300 streams on 64 slots (most share one), small integers and aligned
  // pointers alike: every stream reads back its own last synchronize.
  std::mt19937_64 random(11);
  std::vector<Stream> streams;
  for (Stream s = 0; s < 150; ++s) streams.push_back(s);
  for (int i = 0; i < 150; ++i) streams.push_back(0x7f0000000000 + (random() % 4096) * 0x40);
  StreamValues clocks;
  std::unordered_map<Stream, std::uint64_t> model;
  for (std::uint64_t now = 1; now <= 20000; ++now) {
    const Stream stream = streams[random() % streams.size()];
    if (random() % 2 == 0) {
      clocks.set(stream, now);
      model[stream] = now;
    }
    const auto found = model.find(stream);
    ASSERT_EQ(clocks.at(stream), found == model.end() ? 0 : found->second) << "stream " << stream;
  }
  for (Stream stream : streams) {
    const auto found = model.find(stream);
    EXPECT_EQ(clocks.at(stream), found == model.end() ? 0 : found->second) << "stream " << stream;
  }
}

TEST(GranuleTable, APartsMappedPrefixAnswersAsTheBitmapDoes) {
  // Three parts; granules mapped and unmapped at random, mostly low in each
  // part (as the pool places blocks), so prefixes grow, break and heal.
  std::mt19937_64 random(23);
  GranuleTable table;
  const std::vector<std::size_t> sizes = {70, 200, 130};
  std::vector<GranuleId> firsts;
  for (std::size_t size : sizes) firsts.push_back(table.grow(size));
  std::size_t prefix_hits = 0;
  for (int op = 0; op < 20000; ++op) {
    const std::size_t part = random() % sizes.size();
    const std::size_t reach = random() % 4 == 0 ? sizes[part] : std::min<std::size_t>(sizes[part], 40);
    const GranuleId id = firsts[part] + static_cast<GranuleId>(random() % reach);
    if (table.is_mapped(id)) {
      if (random() % 3 == 0) (void)table.take_used(id);  // used: unmapped and still used, as a sleeping tag's
    } else {
      (void)table.use_range(id, id);
      table.set_mapped(id, 1);
    }
    for (int query = 0; query < 4; ++query) {
      const GranuleId first = firsts[part] + static_cast<GranuleId>(random() % sizes[part]);
      const GranuleId last = first + static_cast<GranuleId>(random() % (firsts[part] + sizes[part] - first));
      const bool expected = table.all_mapped(first, last);
      ASSERT_EQ(table.all_mapped(part, first, last), expected) << "op " << op << " part " << part << " [" << first
                                                               << ", " << last << "]";
      prefix_hits += expected ? 1 : 0;
    }
  }
  EXPECT_GT(prefix_hits, 1000u);
}

TEST(GranuleTable, AgreesWithACounterPerGranule) {
  // Blocks of 1 to 150 granules (within one bitmap word or across several)
  // sharing end granules with their neighbours, as the arena places them,
  // freed on four streams, with free granules stolen now and then: the
  // table's word-at-a-time bookkeeping says what a counter per granule would.
  constexpr std::size_t kGranules = 300, kUnits = 8;  // address units per granule
  std::mt19937_64 random(5);
  GranuleTable table;
  table.grow(kGranules);
  for (Stream stream = 0; stream < 4; ++stream) table.add_stream(stream);  // as the pool does at a free
  std::vector<unsigned> uses(kGranules, 0);             // live blocks over each granule
  std::vector<std::vector<Stream>> freed_by(kGranules);  // streams that freed a block over it
  std::vector<bool> unit_live(kGranules * kUnits, false);
  struct Block {
    std::size_t begin, end;  // units
  };
  std::vector<Block> live;
  const auto granules_of = [](const Block& b) {
    return std::pair<GranuleId, GranuleId>(static_cast<GranuleId>(b.begin / kUnits),
                                           static_cast<GranuleId>((b.end - 1) / kUnits));
  };
  for (int op = 0; op < 20000; ++op) {
    if (live.empty() || random() % 2 == 0) {
      const std::size_t begin = random() % (kGranules * kUnits);
      const std::size_t length = 1 + random() % (random() % 4 == 0 ? 150 * kUnits : 3 * kUnits);
      const std::size_t end = std::min(begin + length, kGranules * kUnits);
      if (std::any_of(unit_live.begin() + begin, unit_live.begin() + end, [](bool b) { return b; })) continue;
      std::fill(unit_live.begin() + begin, unit_live.begin() + end, true);
      live.push_back({begin, end});
      const auto [first, last] = granules_of(live.back());
      std::size_t unmapped = 0;
      for (GranuleId g = first; g <= last; ++g) {
        ++uses[g];
        if (!table.is_mapped(g)) ++unmapped;
      }
      ASSERT_EQ(table.use_range(first, last), unmapped) << "op " << op;
      for (GranuleId g = first; g <= last; ++g) {  // backed, as the pool does
        if (!table.is_mapped(g)) table.set_mapped(g, g + 1);
      }
    } else {
      const std::size_t i = random() % live.size();
      const Block block = live[i];
      live[i] = live.back();
      live.pop_back();
      std::fill(unit_live.begin() + block.begin, unit_live.begin() + block.end, false);
      const auto [first, last] = granules_of(block);
      const Stream stream = random() % 4;
      table.unuse_range(first, last, stream);
      for (GranuleId g = first; g <= last; ++g) {
        --uses[g];
        if (std::find(freed_by[g].begin(), freed_by[g].end(), stream) == freed_by[g].end()) {
          freed_by[g].push_back(stream);
        }
      }
    }
    if (op % 7 == 0 && table.free_count() > 0) {  // a steal: the highest free granule is unmapped
      const GranuleId id = table.highest_free();
      table.take_free(id);
      freed_by[id].clear();
    }
    std::size_t free = 0;
    GranuleId highest = pool::kNoGranule;
    for (GranuleId g = 0; g < kGranules; ++g) {
      const bool is_free = table.is_mapped(g) && uses[g] == 0;
      free += is_free ? 1 : 0;
      if (is_free) highest = g;
      if (is_free) {
        const Stream expected = freed_by[g].empty()      ? pool::kNoStream
                                : freed_by[g].size() == 1 ? freed_by[g][0]
                                                          : pool::kManyStreams;
        ASSERT_EQ(table.freed_on(g), expected) << "op " << op << " granule " << g;
      }
    }
    ASSERT_EQ(table.free_count(), free) << "op " << op;
    ASSERT_EQ(table.highest_free(), highest) << "op " << op;
  }
  // The release queue holds every free granule, each once.
  std::vector<GranuleId> released;
  while (table.free_count() > 0) {
    const GranuleId id = table.oldest_free();
    ASSERT_NE(id, pool::kNoGranule);
    ASSERT_TRUE(table.is_mapped(id) && uses[id] == 0);
    table.take_free(id);
    released.push_back(id);
  }
  EXPECT_EQ(table.oldest_free(), pool::kNoGranule);
}

class BestFitArenaTest : public ::testing::Test {
 protected:
  void* region(std::size_t bytes) {
    void* memory = std::aligned_alloc(4096, bytes);  // never touched by the arena
    buffers_.push_back(memory);
    return memory;
  }
  ~BestFitArenaTest() override {
    for (void* buffer : buffers_) std::free(buffer);
  }
  std::shared_ptr<SyncCountingDevice> device_ = std::make_shared<SyncCountingDevice>(host_device(64 * MiB));
  std::vector<void*> buffers_;
};

TEST_F(BestFitArenaTest, RejectsBadRegions) {
  BestFitArena arena(*device_);
  auto* base = static_cast<char*>(region(64 * KiB));
  EXPECT_EQ(arena.add_region(base + 16, 4096).error().code(), Errc::invalid_argument);
  EXPECT_EQ(arena.add_region(base, 1000).error().code(), Errc::invalid_argument);
  EXPECT_EQ(arena.add_region(nullptr, 4096).error().code(), Errc::invalid_argument);
  ASSERT_TRUE(arena.add_region(base + 16 * KiB, 16 * KiB));
  Status overlap = arena.add_region(base + 8 * KiB, 16 * KiB);
  ASSERT_FALSE(overlap);
  EXPECT_NE(overlap.error().message().find("overlaps"), std::string::npos);
  EXPECT_TRUE(arena.add_region(base, 16 * KiB));  // adjacent is fine
  EXPECT_EQ(arena.region_bytes(), 32 * KiB);
}

TEST_F(BestFitArenaTest, TakesTheSmallestFittingHole) {
  BestFitArena arena(*device_);
  ASSERT_TRUE(arena.add_region(region(1 * MiB), 1 * MiB));
  std::vector<void*> blocks;
  for (std::size_t size : {4 * KiB, 256 * std::size_t{1}, 2 * KiB, 256 * std::size_t{1}, 3 * KiB, 256 * std::size_t{1}}) blocks.push_back(arena.allocate(size, 0)->base);
  ASSERT_TRUE(arena.free(blocks[0], 0));  // 4 KiB hole
  ASSERT_TRUE(arena.free(blocks[2], 0));  // 2 KiB hole
  ASSERT_TRUE(arena.free(blocks[4], 0));  // 3 KiB hole
  EXPECT_EQ(arena.allocate(2560, 0)->base, blocks[4]);  // 3 KiB is the best fit for 2.5 KiB
  EXPECT_EQ(arena.allocate(2 * KiB, 0)->base, blocks[2]);
  EXPECT_EQ(arena.allocate(1 * KiB, 0)->base, blocks[0]);  // split from the 4 KiB hole
}

TEST_F(BestFitArenaTest, BestFitAmongLargeChunksInOneBin) {
  BestFitArena arena(*device_);
  // Three regions whose sizes share a range bin: 9 MiB, 8.5 MiB, 8.75 MiB.
  void* nine = region(9 * MiB);
  void* eight_half = region(8 * MiB + 512 * KiB);
  void* eight_three_quarters = region(8 * MiB + 768 * KiB);
  ASSERT_TRUE(arena.add_region(nine, 9 * MiB));
  ASSERT_TRUE(arena.add_region(eight_half, 8 * MiB + 512 * KiB));
  ASSERT_TRUE(arena.add_region(eight_three_quarters, 8 * MiB + 768 * KiB));
  EXPECT_EQ(arena.allocate(8 * MiB + 600 * KiB, 0)->base, eight_three_quarters);
  EXPECT_EQ(arena.allocate(8 * MiB, 0)->base, eight_half);
  EXPECT_EQ(arena.largest_free_block(), 9 * MiB);
}

TEST_F(BestFitArenaTest, FreeReportsTheChunkSizeAndLiveSizeTracksLiveBlocks) {
  BestFitArena arena(*device_);
  ASSERT_TRUE(arena.add_region(region(64 * KiB), 64 * KiB));
  Expected<MemoryRange> block = arena.allocate(1 * KiB, 0);
  ASSERT_TRUE(block);
  EXPECT_EQ(arena.live_size(block->base), 1 * KiB);
  EXPECT_EQ(block->bytes, 1 * KiB);
  Expected<std::size_t> freed = arena.free(block->base, 0);
  ASSERT_TRUE(freed);
  EXPECT_EQ(*freed, 1 * KiB);
  EXPECT_EQ(arena.live_size(block->base), 0u);
  EXPECT_EQ(arena.free(block->base, 0).error().code(), Errc::double_free);
  // Issue 14: a pointer inside a free chunk was never handed out: it is not a
  // block of this pool, not a double free.
  Expected<std::size_t> interior = arena.free(static_cast<char*>(block->base) + 4 * KiB, 0);
  ASSERT_FALSE(interior);
  EXPECT_EQ(interior.error().code(), Errc::invalid_pointer) << interior.error().message();
  EXPECT_NE(interior.error().message().find("not a block of this pool"), std::string::npos);
  EXPECT_EQ(arena.free_bytes(), 64 * KiB);
  // Nothing big enough: a null block, not an error.
  Expected<MemoryRange> too_big = arena.allocate(128 * KiB, 0);
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->base, nullptr);
}

TEST_F(BestFitArenaTest, RemovesOnlyFullyFreeRegions) {
  BestFitArena arena(*device_);
  void* busy = region(64 * KiB);
  void* idle = region(128 * KiB);
  ASSERT_TRUE(arena.add_region(busy, 64 * KiB));
  ASSERT_TRUE(arena.add_region(idle, 128 * KiB));
  void* live = arena.allocate(64 * KiB, 0)->base;  // best fit: the whole 64 KiB region
  EXPECT_EQ(live, busy);
  EXPECT_EQ(arena.free_region_bytes(), 128 * KiB);
  std::vector<MemoryRange> removed = arena.remove_free_regions();
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].base, idle);
  EXPECT_EQ(removed[0].bytes, 128 * KiB);
  EXPECT_EQ(arena.region_bytes(), 64 * KiB);
  EXPECT_EQ(arena.free(idle, 0).error().code(), Errc::invalid_pointer);  // no longer its memory
  ASSERT_TRUE(arena.free(live, 0));
  EXPECT_EQ(arena.remove_free_regions().size(), 1u);
  EXPECT_EQ(arena.region_bytes(), 0u);
  EXPECT_EQ(arena.largest_free_block(), 0u);
}

TEST_F(BestFitArenaTest, SameStreamReuseNeedsNoSynchronize) {
  BestFitArena arena(*device_);
  ASSERT_TRUE(arena.add_region(region(1 * MiB), 1 * MiB));
  for (int i = 0; i < 100; ++i) {
    void* ptr = arena.allocate(4 * KiB, 7)->base;
    ASSERT_TRUE(arena.free(ptr, 7));
  }
  EXPECT_EQ(device_->total_calls(), 0);
  void* other = arena.allocate(4 * KiB, 8)->base;
  EXPECT_NE(other, nullptr);
  EXPECT_EQ(device_->calls(7), 1);
}

// One synchronize of a stream serves every chunk it freed before: memory
// passing from one stream to another costs one sync, not one per chunk.
TEST_F(BestFitArenaTest, OneSynchronizeServesEverythingTheStreamFreedBefore) {
  BestFitArena arena(*device_);
  ASSERT_TRUE(arena.add_region(region(1 * MiB), 1 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(arena.allocate(4 * KiB, 7)->base);
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(arena.free(blocks[i], 7));  // four holes, apart
  for (int i = 0; i < 4; ++i) ASSERT_NE(arena.allocate(4 * KiB, 8)->base, nullptr);
  EXPECT_EQ(device_->calls(7), 1);
  // A free after the sync waits again.
  ASSERT_TRUE(arena.free(blocks[1], 7));
  ASSERT_NE(arena.allocate(4 * KiB, 8)->base, nullptr);
  EXPECT_EQ(device_->calls(7), 2);
}

// A stream the device finds idle (nothing queued: Device::query) needs no
// synchronize: its memory passes to another stream for one query, which
// also serves every chunk it freed before. A busy one is asked once per
// allocation, then synchronized.
TEST_F(BestFitArenaTest, AStreamFoundIdleIsNotSynchronized) {
  BestFitArena arena(*device_);
  ASSERT_TRUE(arena.add_region(region(1 * MiB), 1 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(arena.allocate(4 * KiB, 7)->base);
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(arena.free(blocks[i], 7));  // four holes, apart
  device_->set_idle(true);
  std::vector<void*> reused;
  for (int i = 0; i < 4; ++i) reused.push_back(arena.allocate(4 * KiB, 8)->base);
  std::sort(reused.begin(), reused.end());
  EXPECT_EQ(reused, (std::vector<void*>{blocks[0], blocks[2], blocks[4], blocks[6]}));  // the holes
  EXPECT_EQ(device_->total_calls(), 0);
  EXPECT_EQ(device_->queries(), 1);
  // Busy now: the next hand-over asks once and then synchronizes.
  device_->set_idle(false);
  ASSERT_TRUE(arena.free(blocks[1], 7));
  EXPECT_EQ(arena.allocate(4 * KiB, 8)->base, blocks[1]);
  EXPECT_EQ(device_->calls(7), 1);
  EXPECT_EQ(device_->queries(), 2);
}

// The owner's cost decides where a block goes: the start or the end of a
// chunk, or another chunk that fits, before the best fit when that costs more.
TEST_F(BestFitArenaTest, PlacementGoesWhereItCostsLeast) {
  struct CostlyBelow final : PlacementCost {
    std::uintptr_t cheap_from = 0;
    std::size_t cost(std::uintptr_t base, std::size_t) const noexcept override { return base < cheap_from ? 1 : 0; }
  };
  BestFitArena arena(*device_);
  char* base = static_cast<char*>(region(1 * MiB));
  ASSERT_TRUE(arena.add_region(base, 1 * MiB));
  CostlyBelow costly;
  costly.cheap_from = reinterpret_cast<std::uintptr_t>(base) + 512 * KiB;
  // One free chunk: the block goes to its end, where it costs nothing.
  Expected<PlacedBlock> block = arena.allocate(64 * KiB, 0, costly);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->base, base + 1 * MiB - 64 * KiB);
  EXPECT_TRUE(block->costs_nothing);  // so the owner need not ask again
  // Without a cost, best fit at the start as ever.
  Expected<MemoryRange> plain = arena.allocate(64 * KiB, 0);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->base, base);
  // Both costly everywhere: the best fit, at its start.
  costly.cheap_from = ~std::uintptr_t{0};
  Expected<PlacedBlock> anywhere = arena.allocate(64 * KiB, 0, costly);
  ASSERT_TRUE(anywhere);
  EXPECT_EQ(anywhere->base, base + 64 * KiB);
  EXPECT_FALSE(anywhere->costs_nothing);
  // Cheap everywhere: the best fit's front at once.
  costly.cheap_from = 0;
  Expected<PlacedBlock> cheap = arena.allocate(64 * KiB, 0, costly);
  ASSERT_TRUE(cheap);
  EXPECT_EQ(cheap->base, base + 128 * KiB);
  EXPECT_TRUE(cheap->costs_nothing);
  EXPECT_TRUE(arena.free(cheap->base, 0));
  EXPECT_TRUE(arena.free(block->base, 0));
  EXPECT_TRUE(arena.free(plain->base, 0));
  EXPECT_TRUE(arena.free(anywhere->base, 0));
  EXPECT_EQ(arena.free_region_bytes(), 1 * MiB);
}

// A warm owner (mostly_free) lets the arena look for a placement that costs
// nothing before it counts costs: the block must land where the scoring puts
// it. Two arenas given the same requests, one warm and one not, with costs
// from the same "mapped" map of 16 KiB pages (changed as blocks come and go,
// so that both outcomes, found and not found, happen), place every block alike.
TEST_F(BestFitArenaTest, AWarmOwnersPlacementsAreTheScoringsPlacements) {
  constexpr std::size_t kPage = 16 * KiB, kBytes = 4 * MiB;
  struct PageCost final : PlacementCost {
    std::uintptr_t base = 0;
    const std::vector<bool>* mapped = nullptr;
    bool warm = false;
    std::size_t cost(std::uintptr_t at, std::size_t bytes) const noexcept override {
      std::size_t unmapped = 0;
      for (std::size_t page = (at - base) / kPage; page <= (at - base + bytes - 1) / kPage; ++page) {
        unmapped += (*mapped)[page] ? 0 : 1;
      }
      return unmapped;
    }
    std::uintptr_t free_window(std::uintptr_t begin, std::uintptr_t end, std::size_t bytes) const noexcept override {
      for (std::uintptr_t at = base + round_up(begin - base, kPage); at + bytes <= end; at += kPage) {
        if (cost(at, bytes) == 0) return at;
      }
      return 0;
    }
    bool mostly_free() const noexcept override { return warm; }
  };
  std::vector<bool> mapped(kBytes / kPage);
  char* cold_base = static_cast<char*>(region(kBytes));
  char* warm_base = static_cast<char*>(region(kBytes));
  BestFitArena cold(*device_), warm(*device_);
  ASSERT_TRUE(cold.add_region(cold_base, kBytes));
  ASSERT_TRUE(warm.add_region(warm_base, kBytes));
  PageCost cold_cost, warm_cost;
  cold_cost.base = reinterpret_cast<std::uintptr_t>(cold_base);
  warm_cost.base = reinterpret_cast<std::uintptr_t>(warm_base);
  cold_cost.mapped = warm_cost.mapped = &mapped;
  warm_cost.warm = true;
  std::mt19937_64 random(17);
  std::vector<std::pair<std::size_t, Stream>> live;  // offset, stream
  std::size_t found_free = 0, costly = 0;
  for (int step = 0; step < 4000; ++step) {
    if (random() % 8 == 0) mapped[random() % mapped.size()] = random() % 2 == 0;  // a page mapped or stolen
    if (!live.empty() && (random() % 2 == 0 || live.size() > 40)) {
      const std::size_t i = random() % live.size();
      const auto [offset, stream] = live[i];
      ASSERT_TRUE(cold.free(cold_base + offset, stream));
      ASSERT_TRUE(warm.free(warm_base + offset, stream));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const std::size_t bytes = (1 + random() % 256) * 256;
    const Stream stream = random() % 3;
    Expected<PlacedBlock> a = cold.allocate(bytes, stream, cold_cost);
    Expected<PlacedBlock> b = warm.allocate(bytes, stream, warm_cost);
    ASSERT_TRUE(a && b);
    if (a->base == nullptr) {
      ASSERT_EQ(b->base, nullptr);
      continue;
    }
    const std::size_t offset = static_cast<std::size_t>(static_cast<char*>(a->base) - cold_base);
    ASSERT_EQ(static_cast<char*>(b->base) - warm_base, static_cast<std::ptrdiff_t>(offset)) << "step " << step;
    ASSERT_EQ(a->costs_nothing, b->costs_nothing);
    (a->costs_nothing ? found_free : costly) += 1;
    // Placed where it was mapped: the pages are the block's now (as a pool maps them).
    for (std::size_t page = offset / kPage; page <= (offset + bytes - 1) / kPage; ++page) mapped[page] = true;
    live.emplace_back(offset, stream);
  }
  EXPECT_GT(found_free, 100u);
  EXPECT_GT(costly, 10u);
}

TEST_F(BestFitArenaTest, AFreeWindowInsideAChunkServesTheBlockAndLeavesBothSidesFree) {
  // Costly everywhere but [window, window + 128 KiB), which the owner names.
  struct CheapWindow final : PlacementCost {
    std::uintptr_t window = 0;
    std::size_t cost(std::uintptr_t base, std::size_t bytes) const noexcept override {
      return base >= window && base + bytes <= window + 128 * KiB ? 0 : 1;
    }
    std::uintptr_t free_window(std::uintptr_t begin, std::uintptr_t end, std::size_t bytes) const noexcept override {
      return window >= begin && window + bytes <= end && bytes <= 128 * KiB ? window : 0;
    }
  };
  BestFitArena arena(*device_);
  char* base = static_cast<char*>(region(1 * MiB));
  ASSERT_TRUE(arena.add_region(base, 1 * MiB));
  CheapWindow cheap;
  cheap.window = reinterpret_cast<std::uintptr_t>(base) + 320 * KiB;
  Expected<PlacedBlock> block = arena.allocate(96 * KiB, 0, cheap);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->base, base + 320 * KiB);
  EXPECT_EQ(block->bytes, 96 * KiB);
  EXPECT_TRUE(block->costs_nothing);
  EXPECT_EQ(arena.free_bytes(), 1 * MiB - 96 * KiB);
  // The pieces below and above are free chunks of their own: best fit takes
  // the one below (320 KiB) for a block that fits it, from its start.
  Expected<MemoryRange> below = arena.allocate(320 * KiB, 0);
  ASSERT_TRUE(below);
  EXPECT_EQ(below->base, base);
  EXPECT_EQ(arena.largest_free_block(), 1 * MiB - 416 * KiB);
  EXPECT_EQ(arena.free(block->base, 0).value(), 96 * KiB);
  EXPECT_EQ(arena.free(below->base, 0).value(), 320 * KiB);
  EXPECT_EQ(arena.largest_free_block(), 1 * MiB);  // all of it merged again
  EXPECT_EQ(arena.free_region_bytes(), 1 * MiB);
}

}  // namespace
}  // namespace tidepool::test
