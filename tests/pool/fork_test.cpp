// A child forked after a pool was made: it is refused memory, leaves the
// parent's blocks and memory alone, and never waits for a lock or a thread
// it inherited from the parent (core/process.hpp). On the host device the
// pool's memory is a MAP_SHARED memfd, so a child that handed out or released
// it would overwrite or zero the parent's live blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "child_process.hpp"
#include "pool/pool_test_support.hpp"

namespace tidepool::test {
namespace {

bool says_forked(const Error& error) {
  return error.code() == Errc::unsupported && error.message().find("forked") != std::string::npos;
}

void fill(void* ptr, std::size_t bytes, unsigned char seed) { std::memset(ptr, seed, bytes); }

bool intact(const void* ptr, std::size_t bytes, unsigned char seed) {
  const auto* bytes_at = static_cast<const unsigned char*>(ptr);
  for (std::size_t i = 0; i < bytes; i += 4096) {
    if (bytes_at[i] != seed) return false;
  }
  return bytes_at[bytes - 1] == seed;
}

/// What a forked child does with the pool it inherited: each step must go as
/// the fork rules say, and nothing may block. Returns the exit status (0: all
/// as expected; otherwise the number of the first step that was not).
int use_in_child(std::unique_ptr<Allocator>& pool, Device& device, void* parents_block) {
  Expected<void*> refused = pool->allocate(8 * MiB);
  if (refused || !says_forked(refused.error())) return 10;
  if (!pool->deallocate(parents_block)) return 11;  // left alone, not an error
  if (pool->trim() != 0) return 12;
  if (pool->stats().bytes_in_use != 0) return 13;  // none of it is the child's
  if (pool->dump().find("forked") == std::string::npos) return 14;
  if (Expected<void*> plain = device.allocate(1 * MiB); plain || !says_forked(plain.error())) return 15;
  if (device.supports_virtual_memory()) {
    if (auto handle = device.create(device.granularity()); handle || !says_forked(handle.error())) return 16;
  }
  pool.reset();  // releases nothing, joins no thread of the parent's
  return 0;
}

class ForkedChild : public ::testing::TestWithParam<PoolKind> {};

TEST_P(ForkedChild, IsRefusedAndLeavesItsParentsMemoryAlone) {
  std::shared_ptr<HostDevice> device = host_device(1 * GiB);
  std::unique_ptr<Allocator> pool = make_pool(GetParam(), device, 0);
  void* kept = must_allocate(*pool, 8 * MiB);
  fill(kept, 8 * MiB, 0x5a);
  void* cached = must_allocate(*pool, 8 * MiB);  // freed: the pool keeps its memory (not platform)
  fill(cached, 8 * MiB, 0x33);
  ASSERT_TRUE(pool->deallocate(cached));

  Child child([&] { return use_in_child(pool, *device, kept); });
  ASSERT_EQ(child.wait(20s), 0);

  // Nothing the child did reached the parent: its block is intact, and the
  // pool serves and frees as before.
  EXPECT_TRUE(intact(kept, 8 * MiB, 0x5a));
  void* again = must_allocate(*pool, 8 * MiB);
  fill(again, 8 * MiB, 0x77);
  EXPECT_TRUE(intact(kept, 8 * MiB, 0x5a));
  EXPECT_TRUE(pool->deallocate(again));
  EXPECT_TRUE(pool->deallocate(kept));
  EXPECT_EQ(pool->stats().bytes_in_use, 0);
}

TEST_P(ForkedChild, ForkedWhileAThreadHoldsThePoolsLockTakesNoLock) {
  std::shared_ptr<HostDevice> device = host_device(1 * GiB);
  auto gate = std::make_shared<GateDevice>(device);
  std::unique_ptr<Allocator> pool = make_pool(GetParam(), gate, 0);
  void* kept = must_allocate(*pool, 8 * MiB);
  fill(kept, 8 * MiB, 0x5a);
  gate->arm();
  std::thread holder([&] { (void)pool->dump(); });
  gate->wait_inside();  // the holder is in dump(), the pool's lock held

  Child child([&] { return use_in_child(pool, *device, kept); });  // not the gate: it stays shut there
  const int status = child.wait(10s);  // -1: it hung on the lock
  gate->open();
  holder.join();
  ASSERT_EQ(status, 0);
  EXPECT_TRUE(intact(kept, 8 * MiB, 0x5a));
  EXPECT_TRUE(pool->deallocate(kept));
}

INSTANTIATE_TEST_SUITE_P(Pools, ForkedChild,
                         ::testing::Values(PoolKind::preallocate, PoolKind::growth, PoolKind::platform,
                                           PoolKind::expandable),
                         PoolKindName());

TEST(ForkedChildOfExpandable, LeavesTheReaperThreadAndATaggedSpaceAlone) {
  std::shared_ptr<HostDevice> device = host_device(1 * GiB);
  ExpandableOptions options;
  options.idle_release = std::chrono::milliseconds(60'000);  // a reaper thread, idle for the test
  auto made = ExpandablePool::create(device, options);
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<ExpandablePool> pool = std::move(made).value();
  void* weights = nullptr;
  {
    auto scope = pool->tag("weights");
    ASSERT_TRUE(scope);
    weights = must_allocate(*pool, 16 * MiB);
  }
  fill(weights, 16 * MiB, 0x42);

  Child child([&]() -> int {
    if (Status slept = pool->sleep("weights", SleepKeep::contents); slept || !says_forked(slept.error())) return 20;
    if (Status woken = pool->wake("weights"); woken || !says_forked(woken.error())) return 21;
    if (Status tagged = pool->tag_begin("other"); tagged || !says_forked(tagged.error())) return 22;
    if (!pool->tag_stats().empty()) return 23;
    pool.reset();  // before: joined the parent's reaper, a thread the child does not have
    return 0;
  });
  ASSERT_EQ(child.wait(20s), 0);
  EXPECT_TRUE(intact(weights, 16 * MiB, 0x42));
  ASSERT_TRUE(pool->sleep("weights", SleepKeep::contents));
  ASSERT_TRUE(pool->wake("weights"));
  EXPECT_TRUE(intact(weights, 16 * MiB, 0x42));
  EXPECT_TRUE(pool->deallocate(weights));
}

}  // namespace
}  // namespace tidepool::test
