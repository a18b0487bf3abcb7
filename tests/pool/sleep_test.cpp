// ExpandablePool's tags, sleep and wake (sleep.hpp) on the host device:
// every byte and pointer kept, the memory really given back, the errors, an
// access while asleep faulting, and sleeps and wakes beside other threads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <cstring>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "pool/pool_test_support.hpp"
#include "tidepool/sleep.hpp"

namespace tidepool::test {
namespace {

std::unique_ptr<ExpandablePool> make_expandable(std::shared_ptr<Device> device) {
  auto pool = ExpandablePool::create(std::move(device));
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

struct Block {
  unsigned char* ptr;
  std::size_t bytes;
  unsigned seed;
};

void fill(const Block& block) {
  for (std::size_t i = 0; i < block.bytes; ++i) block.ptr[i] = static_cast<unsigned char>((i * 131u + block.seed) >> 3);
}

/// The first offset whose byte differs from fill()'s, or bytes when none does.
std::size_t first_difference(const Block& block) {
  for (std::size_t i = 0; i < block.bytes; ++i) {
    if (block.ptr[i] != static_cast<unsigned char>((i * 131u + block.seed) >> 3)) return i;
  }
  return block.bytes;
}

void expect_intact(const std::vector<Block>& blocks, const char* what) {
  for (const Block& block : blocks) {
    EXPECT_EQ(first_difference(block), block.bytes) << what << ": block at " << static_cast<void*>(block.ptr) << " of "
                                                    << block.bytes << " bytes";
  }
}

/// Blocks of many sizes (small ones packed, large ones spanning granules)
/// allocated in tag `tag` ("" untagged), each filled with its own pattern.
std::vector<Block> allocate_filled(ExpandablePool& pool, const std::string& tag, unsigned seed, int count = 24) {
  std::optional<TagScope> scope;
  if (!tag.empty()) scope.emplace(pool.tag(tag).value());
  std::mt19937 random(seed);
  const std::size_t sizes[] = {256, 4 * KiB, 100 * KiB, 1 * MiB, 3 * MiB + 512, 9 * MiB};
  std::vector<Block> blocks;
  for (int i = 0; i < count; ++i) {
    const std::size_t bytes = sizes[random() % std::size(sizes)];
    auto* ptr = static_cast<unsigned char*>(must_allocate(pool, bytes));
    blocks.push_back({ptr, bytes, seed * 1000 + static_cast<unsigned>(i)});
    fill(blocks.back());
  }
  return blocks;
}

TagStats stats_of(const ExpandablePool& pool, const std::string& name) {
  for (const TagStats& tag : pool.tag_stats()) {
    if (tag.name == name) return tag;
  }
  ADD_FAILURE() << "no tag " << name;
  return {};
}

TEST(Sleep, ContentsKeptEveryByteAndPointerAcrossManyBlocksAndTags) {
  auto device = host_device(1 * GiB);
  auto pool = make_expandable(device);
  auto weights = allocate_filled(*pool, "weights", 1);
  auto cache = allocate_filled(*pool, "kv-cache", 2);
  auto plain = allocate_filled(*pool, "", 3);
  const std::size_t free_before = device->mem_info().free_bytes;

  ASSERT_TRUE(pool->sleep("weights", SleepKeep::contents));
  const TagStats asleep = stats_of(*pool, "weights");
  EXPECT_TRUE(asleep.asleep);
  EXPECT_GT(asleep.bytes_asleep, 0u);
  EXPECT_GE(asleep.host_bytes, asleep.bytes_asleep);
  EXPECT_EQ(pool->stats().bytes_asleep, static_cast<std::int64_t>(asleep.bytes_asleep));
  // The device has the tag's granules back (and any free ones of the tag).
  EXPECT_GE(device->mem_info().free_bytes, free_before + asleep.bytes_asleep);
  expect_intact(cache, "another tag while one sleeps");
  expect_intact(plain, "untagged blocks while a tag sleeps");
  // Others allocate beside the sleeping tag, and reuse its memory.
  auto more = allocate_filled(*pool, "kv-cache", 4);
  auto more_plain = allocate_filled(*pool, "", 5);

  ASSERT_TRUE(pool->wake("weights"));
  expect_intact(weights, "the woken tag");
  expect_intact(cache, "another tag after the wake");
  expect_intact(more, "blocks made while the tag slept");
  expect_intact(more_plain, "untagged blocks made while the tag slept");
  const TagStats awake = stats_of(*pool, "weights");
  EXPECT_FALSE(awake.asleep);
  EXPECT_EQ(awake.bytes_asleep, 0u);
  EXPECT_EQ(awake.sleeps, 1u);
  EXPECT_EQ(awake.wakes, 1u);
  EXPECT_EQ(pool->stats().bytes_asleep, 0);

  // A second round, both tags, then every block freed: nothing overlaps.
  ASSERT_TRUE(pool->sleep("weights", SleepKeep::contents));
  ASSERT_TRUE(pool->sleep("kv-cache", SleepKeep::contents));
  expect_intact(plain, "untagged blocks while two tags sleep");
  ASSERT_TRUE(pool->wake("kv-cache"));
  ASSERT_TRUE(pool->wake("weights"));
  expect_intact(weights, "second round");
  expect_intact(cache, "second round");
  expect_intact(more, "second round");
  for (const auto* blocks : {&weights, &cache, &plain, &more, &more_plain}) {
    for (const Block& block : *blocks) ASSERT_TRUE(pool->deallocate(block.ptr));
  }
  EXPECT_EQ(pool->stats().bytes_in_use, 0);
}

TEST(Sleep, BlocksOfOneTagShareNoGranuleWithOthers) {
  auto pool = make_expandable(host_device(1 * GiB));
  const std::size_t granule = pool->device().granularity();
  std::map<std::string, std::set<std::uintptr_t>> granules;
  for (int i = 0; i < 64; ++i) {
    const std::string tag = i % 3 == 0 ? "" : (i % 3 == 1 ? "a" : "b");
    std::optional<TagScope> scope;
    if (!tag.empty()) scope.emplace(pool->tag(tag).value());
    const std::size_t bytes = i % 2 == 0 ? 1000 : 3 * MiB;
    const auto base = reinterpret_cast<std::uintptr_t>(must_allocate(*pool, bytes));
    for (std::uintptr_t g = base / granule; g <= (base + bytes - 1) / granule; ++g) granules[tag].insert(g);
  }
  for (const auto& [tag, mine] : granules) {
    for (const auto& [other, theirs] : granules) {
      if (tag == other) continue;
      for (std::uintptr_t g : mine) {
        ASSERT_EQ(theirs.count(g), 0u) << "tags '" << tag << "' and '" << other << "' share a granule";
      }
    }
  }
}

TEST(Sleep, KeepNothingGivesBackAndWakesAtTheSameAddresses) {
  auto device = host_device(1 * GiB);
  auto pool = make_expandable(device);
  auto blocks = allocate_filled(*pool, "kv", 7);
  ASSERT_TRUE(pool->sleep("kv", SleepKeep::nothing));
  EXPECT_EQ(stats_of(*pool, "kv").host_bytes, 0u);
  EXPECT_GT(stats_of(*pool, "kv").bytes_asleep, 0u);
  ASSERT_TRUE(pool->wake("kv"));
  for (Block& block : blocks) {  // the same pointers, writable again
    block.seed += 99;
    fill(block);
  }
  expect_intact(blocks, "rewritten after a wake that kept nothing");
}

TEST(Sleep, ClearErrors) {
  auto pool = make_expandable(host_device(256 * MiB));
  auto blocks = allocate_filled(*pool, "weights", 1, 4);

  Status unknown = pool->sleep("never", SleepKeep::contents);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), Errc::invalid_argument);
  EXPECT_NE(unknown.error().message().find("no tag of that name (tags: 'weights')"), std::string::npos)
      << unknown.error().message();
  EXPECT_FALSE(pool->wake("never"));

  Status awake = pool->wake("weights");
  ASSERT_FALSE(awake);
  EXPECT_NE(awake.error().message().find("wake('weights'): the tag is awake"), std::string::npos)
      << awake.error().message();

  ASSERT_TRUE(pool->sleep("weights", SleepKeep::contents));
  Status twice = pool->sleep("weights", SleepKeep::nothing);
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message().find("sleep('weights'): the tag is asleep"), std::string::npos)
      << twice.error().message();
  {
    auto scope = pool->tag("weights").value();
    Expected<void*> refused = pool->allocate(1 * MiB);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message().find("in tag 'weights': the tag is asleep; wake it first"), std::string::npos)
        << refused.error().message();
  }
  ASSERT_TRUE(pool->wake("weights"));
  expect_intact(blocks, "after the refused calls");

  EXPECT_FALSE(pool->tag_end());  // no scope open
  EXPECT_FALSE(pool->tag(""));
  EXPECT_FALSE(pool->tag(std::string(kMaxTagNameBytes + 1, 'x')));
  EXPECT_TRUE(pool->tag(std::string(kMaxTagNameBytes, 'x')));
  EXPECT_EQ(parse_sleep_keep("contents").value(), SleepKeep::contents);
  EXPECT_EQ(parse_sleep_keep("nothing").value(), SleepKeep::nothing);
  Expected<SleepKeep> bad = parse_sleep_keep("weights");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("keep='weights'"), std::string::npos) << bad.error().message();
}

TEST(Sleep, ScopesNestAndBelongToTheirThread) {
  auto pool = make_expandable(host_device(256 * MiB));
  void* outer = nullptr;
  void* inner = nullptr;
  void* other_thread = nullptr;
  {
    auto a = pool->tag("a").value();
    outer = must_allocate(*pool, 4 * KiB);
    {
      auto b = pool->tag("b").value();
      inner = must_allocate(*pool, 4 * KiB);
      std::thread([&] { other_thread = must_allocate(*pool, 4 * KiB); }).join();  // untagged there
    }
  }
  ASSERT_TRUE(pool->sleep("b", SleepKeep::contents));
  // Only b's block is asleep: the others stay readable.
  std::memset(outer, 1, 4 * KiB);
  std::memset(other_thread, 2, 4 * KiB);
  EXPECT_EQ(stats_of(*pool, "a").bytes_asleep, 0u);
  EXPECT_EQ(stats_of(*pool, "b").bytes_in_use, 4 * KiB);
  ASSERT_TRUE(pool->wake("b"));
  std::memset(inner, 3, 4 * KiB);
}

TEST(Sleep, BlocksFreedWhileAsleepAreNotWoken) {
  auto device = host_device(1 * GiB);
  auto pool = make_expandable(device);
  auto blocks = allocate_filled(*pool, "kv", 11, 16);
  ASSERT_TRUE(pool->sleep("kv", SleepKeep::contents));
  const std::size_t free_asleep = device->mem_info().free_bytes;
  std::vector<Block> kept;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 0) {
      ASSERT_TRUE(pool->deallocate(blocks[i].ptr));
    } else {
      kept.push_back(blocks[i]);
    }
  }
  Status twice = pool->deallocate(blocks[0].ptr);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), Errc::double_free);
  std::size_t kept_bytes = 0;
  for (const Block& block : kept) kept_bytes += block.bytes;
  EXPECT_EQ(stats_of(*pool, "kv").bytes_in_use, kept_bytes);  // 256-byte multiples already

  ASSERT_TRUE(pool->wake("kv"));
  expect_intact(kept, "blocks kept while others were freed asleep");
  // The wake took no more than the kept blocks' granules.
  const std::size_t granule = device->granularity();
  std::set<std::uintptr_t> spanned;
  for (const Block& block : kept) {
    const auto base = reinterpret_cast<std::uintptr_t>(block.ptr);
    for (std::uintptr_t g = base / granule; g <= (base + block.bytes - 1) / granule; ++g) spanned.insert(g);
  }
  EXPECT_EQ(free_asleep - device->mem_info().free_bytes, spanned.size() * granule);
}

TEST(Sleep, AWakeStaysUnderThePoolsLimit) {
  auto device = host_device(1 * GiB);
  auto pool = ExpandablePool::create(limited(device, 64 * MiB)).value();
  std::vector<Block> model;
  {
    auto scope = pool->tag("model").value();
    for (unsigned i = 0; i < 10; ++i) {
      model.push_back({static_cast<unsigned char*>(must_allocate(*pool, 4 * MiB)), 4 * MiB, i});
    }
  }
  for (const Block& block : model) fill(block);
  ASSERT_TRUE(pool->sleep("model", SleepKeep::contents));
  void* other = must_allocate(*pool, 40 * MiB);  // into the room the model gave up
  Status refused = pool->wake("model");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("while tag 'model' slept"), std::string::npos) << refused.error().message();
  EXPECT_LE(pool->stats().bytes_mapped, 64 * static_cast<std::int64_t>(MiB));
  ASSERT_TRUE(pool->deallocate(other));  // cached free: the wake releases it to make room
  ASSERT_TRUE(pool->wake("model"));
  EXPECT_LE(pool->stats().bytes_mapped, 64 * static_cast<std::int64_t>(MiB));
  expect_intact(model, "after a wake that had to make room");
}

TEST(Sleep, TrimFreesTheHostCopyKeptAfterAWake) {
  auto pool = make_expandable(host_device(256 * MiB));
  auto blocks = allocate_filled(*pool, "w", 3, 8);
  ASSERT_TRUE(pool->sleep("w", SleepKeep::contents));
  ASSERT_TRUE(pool->wake("w"));
  EXPECT_GT(stats_of(*pool, "w").host_bytes, 0u);  // for the next sleep
  (void)pool->trim();
  EXPECT_EQ(stats_of(*pool, "w").host_bytes, 0u);
  ASSERT_TRUE(pool->sleep("w", SleepKeep::contents));  // a fresh copy
  ASSERT_TRUE(pool->wake("w"));
  expect_intact(blocks, "after trim and another round");
}

// Fails the Nth copy to the host or map, or every create() once
// `creates_left` reaches 0 (each counts down), as a device whose context
// broke or whose memory ran out in the middle of a sleep or a wake.
class FailingDevice final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  Status copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override {
    if (copies_left >= 0 && copies_left-- == 0) return Error(Errc::device_error, "copy refused for the test");
    return DeviceAdaptor::copy_to_host(host_dst, device_src, bytes);
  }
  Expected<PhysicalHandle> create(std::size_t bytes) override {
    if (creates_left >= 0 && creates_left-- == 0) {
      creates_left = 0;  // and every one after
      return Error(Errc::out_of_memory, "create refused for the test");
    }
    return DeviceAdaptor::create(bytes);
  }
  Status map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) override {
    if (maps_left >= 0 && maps_left-- == 0) return Error(Errc::device_error, "map refused for the test");
    return DeviceAdaptor::map_many(va, bytes_each, handles);
  }
  std::atomic<int> copies_left{-1};   // -1: never fail
  std::atomic<int> maps_left{-1};
  std::atomic<int> creates_left{-1};
};

std::vector<Block> allocate_large(ExpandablePool& pool, const std::string& tag, std::size_t count) {
  auto scope = pool.tag(tag).value();
  std::vector<Block> blocks;
  for (std::size_t i = 0; i < count; ++i) {
    blocks.push_back({static_cast<unsigned char*>(must_allocate(pool, 4 * MiB)), 4 * MiB, static_cast<unsigned>(i)});
    fill(blocks.back());
  }
  return blocks;
}

// 300 MiB: a sleep and a wake of several chunks, each copied while the one
// before is unmapped (sleep) or the next one mapped (wake).
TEST(Sleep, ALargeTagSleepsAndWakesChunkByChunk) {
  auto device = host_device(1 * GiB);
  auto pool = make_expandable(device);
  auto model = allocate_large(*pool, "model", 75);
  const std::size_t free_awake = device->mem_info().free_bytes;
  ASSERT_TRUE(pool->sleep("model", SleepKeep::contents));
  EXPECT_EQ(stats_of(*pool, "model").bytes_asleep, 300 * MiB);
  EXPECT_GE(device->mem_info().free_bytes, free_awake + 300 * MiB);
  ASSERT_TRUE(pool->wake("model"));
  expect_intact(model, "a tag of many chunks");
  EXPECT_EQ(device->mem_info().free_bytes, free_awake);
}

TEST(Sleep, ACopyFailingMidwayLeavesTheTagAwakeAndIntact) {
  auto failing = std::make_shared<FailingDevice>(host_device(1 * GiB));
  auto pool = make_expandable(failing);
  auto model = allocate_large(*pool, "model", 75);
  const std::int64_t mapped = pool->stats().bytes_mapped;
  failing->copies_left = 2;  // chunks 0 and 1 are copied, and unmapped meanwhile
  Status refused = pool->sleep("model", SleepKeep::contents);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("copy refused for the test"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("(the tag stays awake)"), std::string::npos) << refused.error().message();
  EXPECT_FALSE(stats_of(*pool, "model").asleep);
  EXPECT_EQ(pool->stats().bytes_mapped, mapped);
  expect_intact(model, "after a sleep that failed midway");
  failing->copies_left = -1;
  ASSERT_TRUE(pool->sleep("model", SleepKeep::contents));
  ASSERT_TRUE(pool->wake("model"));
  expect_intact(model, "a sleep and wake after the failed one");
}

TEST(Sleep, AWakeFailingMidwayLeavesTheTagAsleepAndMapsNothing) {
  auto failing = std::make_shared<FailingDevice>(host_device(1 * GiB));
  auto pool = make_expandable(failing);
  auto model = allocate_large(*pool, "model", 75);
  ASSERT_TRUE(pool->sleep("model", SleepKeep::contents));
  const std::int64_t mapped_asleep = pool->stats().bytes_mapped;
  const std::size_t free_asleep = failing->mem_info().free_bytes;
  failing->creates_left = 100;  // the wake takes its 150 granules in one request: none of them is kept
  Status refused = pool->wake("model");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("(the tag stays asleep)"), std::string::npos) << refused.error().message();
  EXPECT_TRUE(stats_of(*pool, "model").asleep);
  EXPECT_EQ(pool->stats().bytes_mapped, mapped_asleep);
  EXPECT_EQ(failing->mem_info().free_bytes, free_asleep);
  failing->creates_left = -1;
  failing->maps_left = 2;  // chunks 0 and 1 are mapped (and copied meanwhile), chunk 2 is refused
  refused = pool->wake("model");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("map refused for the test"), std::string::npos) << refused.error().message();
  EXPECT_TRUE(stats_of(*pool, "model").asleep);
  EXPECT_EQ(pool->stats().bytes_mapped, mapped_asleep);
  EXPECT_EQ(failing->mem_info().free_bytes, free_asleep);  // every handle went back
  failing->maps_left = -1;
  ASSERT_TRUE(pool->wake("model"));
  expect_intact(model, "a wake after a failed one");
}

TEST(SleepDeathTest, AnAccessWhileAsleepFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pool = make_expandable(host_device(256 * MiB));
  auto blocks = allocate_filled(*pool, "w", 5, 4);
  ASSERT_TRUE(pool->sleep("w", SleepKeep::contents));
  volatile unsigned char* asleep = blocks[0].ptr;
  // Killed by SIGSEGV; under a sanitizer, its SEGV report and a failed exit.
  auto faulted = [](int status) {
    return (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  };
  EXPECT_EXIT((void)asleep[0], faulted, "SEGV|^$");
  ASSERT_TRUE(pool->wake("w"));
  EXPECT_EQ(first_difference(blocks[0]), blocks[0].bytes);
}

TEST(Sleep, SleepAndWakeRunBesideAllocationsOfOtherTags) {
  auto pool = make_expandable(host_device(1 * GiB));
  auto sleeper_blocks = allocate_filled(*pool, "sleeper", 21, 12);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      const std::string tag = w == 0 ? "" : "busy";
      unsigned round = 0;
      while (!stop.load()) {
        auto blocks = allocate_filled(*pool, tag, 100 + static_cast<unsigned>(w) * 1000 + round++ % 500, 6);
        for (const Block& block : blocks) {
          if (first_difference(block) != block.bytes) ++failures;
          if (!pool->deallocate(block.ptr)) ++failures;
        }
      }
    });
  }
  // The sleeper's odd blocks are freed by another thread meanwhile: asleep,
  // awake or mid-change (then the free waits for the change).
  std::vector<Block> kept;
  std::vector<Block> freed;
  for (std::size_t i = 0; i < sleeper_blocks.size(); ++i) (i % 2 == 0 ? kept : freed).push_back(sleeper_blocks[i]);
  workers.emplace_back([&] {
    for (const Block& block : freed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (!pool->deallocate(block.ptr)) ++failures;
    }
  });
  // A second tag sleeps and wakes on its own thread at the same time.
  auto second = allocate_filled(*pool, "second", 31, 8);
  workers.emplace_back([&] {
    for (int round = 0; round < 20; ++round) {
      if (!pool->sleep("second", SleepKeep::contents) || !pool->wake("second")) ++failures;
      for (const Block& block : second) {
        if (first_difference(block) != block.bytes) ++failures;
      }
    }
  });
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(pool->sleep("sleeper", SleepKeep::contents));
    ASSERT_TRUE(pool->wake("sleeper"));
    expect_intact(kept, "the sleeper between rounds");
  }
  stop = true;
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(failures.load(), 0);
  std::size_t kept_bytes = 0;
  for (const Block& block : kept) kept_bytes += block.bytes;
  EXPECT_EQ(stats_of(*pool, "sleeper").bytes_in_use, kept_bytes);
}

}  // namespace
}  // namespace tidepool::test
