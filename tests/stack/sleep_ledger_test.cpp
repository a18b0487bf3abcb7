// Sleep and wake between real processes (fork, then _exit) sharing a host
// device through the ledger: A sleeps, B uses the memory, A wakes with every
// byte back; A killed asleep; B killed while A's wake waits; a wake that
// cannot be served fails within its bound, naming who holds the device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "stack/ledger_stack.hpp"
#include "share/ledger_test_support.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/stack.hpp"

namespace tidepool::test {
namespace {

constexpr std::size_t kCapacity = 64 * MiB;  // 1 MiB granules
constexpr std::size_t kModelBlocks = 10;      // 10 x 4 MiB in tag "model"
constexpr std::size_t kModelBlockBytes = 4 * MiB;

/// This process's pool on the shared device: expandable, over the ledger,
/// answering trim requests, as make_allocator builds it.
std::unique_ptr<Allocator> shared_pool(const std::string& segment, std::chrono::milliseconds wake_wait = 10s) {
  LedgerOptions options = ledger_options(segment);
  options.wake_wait = wake_wait;
  auto ledger = LedgerDevice::create(make_host(kCapacity, "sleep-test"), options).value();
  auto pool = ExpandablePool::create(std::move(ledger)).value();
  return with_ledger_trim_hooks(Mode::expandable, std::move(pool));
}

unsigned char pattern(std::size_t block, std::size_t i) {
  return static_cast<unsigned char>(i * 7 + block * 13 + (i >> 12));
}

/// Process A's model: kModelBlocks blocks in tag "model", each with its pattern.
std::vector<unsigned char*> allocate_model(Allocator& pool) {
  auto scope = TagScope::open(*pool.sleepable(), "model").value();
  std::vector<unsigned char*> blocks;
  for (std::size_t b = 0; b < kModelBlocks; ++b) {
    auto* block = static_cast<unsigned char*>(pool.allocate(kModelBlockBytes).value());
    for (std::size_t i = 0; i < kModelBlockBytes; ++i) block[i] = pattern(b, i);
    blocks.push_back(block);
  }
  return blocks;
}

bool model_intact(const std::vector<unsigned char*>& blocks) {
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (std::size_t i = 0; i < kModelBlockBytes; ++i) {
      if (blocks[b][i] != pattern(b, i)) return false;
    }
  }
  return true;
}

/// Process A: the model (and `plain_bytes` untagged), asleep; then, told
/// "wake", wakes and says "ok" with the model intact, or what went wrong.
int sleeper(const std::string& segment, Pipe& says, Pipe& told, std::size_t plain_bytes = 0,
            std::chrono::milliseconds wake_wait = 10s) {
  auto pool = shared_pool(segment, wake_wait);
  auto model = allocate_model(*pool);
  if (plain_bytes != 0 && !pool->allocate(plain_bytes)) return 2;
  if (!pool->sleepable()->sleep("model", SleepKeep::contents)) return 3;
  says.write_line("asleep");
  for (;;) {
    auto line = told.read_line(60s);
    if (!line || *line == "exit") return 0;
    says.write_line("waking");
    const auto start = std::chrono::steady_clock::now();
    Status woken = pool->sleepable()->wake("model");
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (!woken) {
      says.write_line("error " + std::to_string(waited.count()) + " ms: " + woken.error().message());
      continue;  // still asleep: may be told to try again
    }
    says.write_line(model_intact(model) ? "ok " + std::to_string(waited.count()) + " ms" : std::string("corrupt"));
  }
}

/// Process B: takes `bytes`, writes them, frees them (kept cached by its
/// pool) unless `hold`; says "ready"; exits when told.
int user(const std::string& segment, std::size_t bytes, bool hold, Pipe& says, Pipe& told) {
  auto pool = shared_pool(segment);
  Expected<void*> block = pool->allocate(bytes);
  if (!block) {
    says.write_line("error " + block.error().message());
    return 2;
  }
  std::memset(*block, 0x5a, bytes);
  if (!hold && !pool->deallocate(*block)) return 3;
  says.write_line("ready");
  (void)told.read_line(60s);
  return 0;
}

const LedgerEntryInfo* entry_of(const LedgerSnapshot& snapshot, int pid) {
  for (const LedgerEntryInfo& entry : snapshot.entries) {
    if (entry.pid == pid) return &entry;
  }
  return nullptr;
}

LedgerSnapshot snapshot_of(const UniqueSegment& segment) {
  return Ledger::open_existing(segment.name()).value()->snapshot().value();
}

TEST(SleepLedger, TwoProcessesTakeTurns) {
  UniqueSegment segment("sleep-turns");
  Pipe a_says, a_told, b_says, b_told;
  Child a([&] { return sleeper(segment.name(), a_says, a_told); });
  ASSERT_EQ(a_says.read_line(20s), "asleep");
  LedgerSnapshot asleep = snapshot_of(segment);
  const LedgerEntryInfo* a_entry = entry_of(asleep, a.pid());
  ASSERT_NE(a_entry, nullptr);
  EXPECT_EQ(a_entry->reserved_bytes, 0u);  // the model's 40 MiB went back at once
  EXPECT_EQ(a_entry->asleep_bytes, kModelBlocks * kModelBlockBytes);

  // B takes 50 of the 64 MiB, only possible while A sleeps, and frees them
  // into its cache: A's wake must ask B to trim.
  Child b([&] { return user(segment.name(), 50 * MiB, false, b_says, b_told); });
  ASSERT_EQ(b_says.read_line(20s), "ready");
  a_told.write_line("wake");
  ASSERT_EQ(a_says.read_line(20s), "waking");
  auto woken = a_says.read_line(30s);
  ASSERT_TRUE(woken);
  EXPECT_EQ(woken->rfind("ok", 0), 0u) << *woken;

  // A's wake proceeds once the room is there, which may be before B's trim has
  // released the rest and counted what it gave.
  LedgerSnapshot after;
  EXPECT_TRUE(wait_until([&] {
    after = snapshot_of(segment);
    const LedgerEntryInfo* entry = entry_of(after, b.pid());
    return entry != nullptr && entry->trims_answered != 0;
  }, 10s));
  a_entry = entry_of(after, a.pid());
  const LedgerEntryInfo* b_entry = entry_of(after, b.pid());
  ASSERT_NE(a_entry, nullptr);
  ASSERT_NE(b_entry, nullptr);
  EXPECT_EQ(a_entry->reserved_bytes, kModelBlocks * kModelBlockBytes);
  EXPECT_EQ(a_entry->asleep_bytes, 0u);
  EXPECT_EQ(a_entry->wake_waits, 1u);
  EXPECT_GE(b_entry->bytes_trimmed, 26 * MiB);  // what A lacked
  EXPECT_LE(after.peak_reserved_bytes, kCapacity);
  a_told.write_line("exit");
  b_told.write_line("exit");
  EXPECT_EQ(a.wait(10s), 0);
  EXPECT_EQ(b.wait(10s), 0);
}

TEST(SleepLedger, AKilledAsleepReturnsItsBytes) {
  UniqueSegment segment("sleep-killed");
  Pipe a_says, a_told, b_says, b_told;
  Child a([&] { return sleeper(segment.name(), a_says, a_told, 8 * MiB); });
  ASSERT_EQ(a_says.read_line(20s), "asleep");
  EXPECT_EQ(entry_of(snapshot_of(segment), a.pid())->reserved_bytes, 8 * MiB);
  a.kill9();
  // B takes the whole device: A's untagged 8 MiB came back with its entry.
  Child b([&] { return user(segment.name(), kCapacity, true, b_says, b_told); });
  ASSERT_EQ(b_says.read_line(20s), "ready");
  LedgerSnapshot after = snapshot_of(segment);
  EXPECT_EQ(entry_of(after, a.pid()), nullptr);
  EXPECT_EQ(after.reserved_bytes, kCapacity);
  b_told.write_line("exit");
  EXPECT_EQ(b.wait(10s), 0);
}

TEST(SleepLedger, BKilledWhileAWaitsLetsTheWakeProceed) {
  UniqueSegment segment("sleep-waits");
  Pipe a_says, a_told, b_says, b_told;
  Child a([&] { return sleeper(segment.name(), a_says, a_told); });
  ASSERT_EQ(a_says.read_line(20s), "asleep");
  // B holds 50 MiB in use: nothing to trim.
  Child b([&] { return user(segment.name(), 50 * MiB, true, b_says, b_told); });
  ASSERT_EQ(b_says.read_line(20s), "ready");
  a_told.write_line("wake");
  ASSERT_EQ(a_says.read_line(20s), "waking");
  ASSERT_TRUE(wait_until(
      [&] {
        const LedgerSnapshot now = snapshot_of(segment);
        const LedgerEntryInfo* entry = entry_of(now, a.pid());
        return entry != nullptr && entry->wanted_bytes != 0;
      },
      10s))
      << "A's wake never waited";
  b.kill9();
  auto woken = a_says.read_line(30s);
  ASSERT_TRUE(woken);
  EXPECT_EQ(woken->rfind("ok", 0), 0u) << *woken;
  a_told.write_line("exit");
  EXPECT_EQ(a.wait(10s), 0);
}

TEST(SleepLedger, AWakeThatCannotBeServedFailsWithinItsBoundNamingTheHolder) {
  UniqueSegment segment("sleep-fails");
  Pipe a_says, a_told, b_says, b_told;
  Child a([&] { return sleeper(segment.name(), a_says, a_told, 0, 500ms); });
  ASSERT_EQ(a_says.read_line(20s), "asleep");
  Child b([&] { return user(segment.name(), 50 * MiB, true, b_says, b_told); });
  ASSERT_EQ(b_says.read_line(20s), "ready");
  a_told.write_line("wake");
  ASSERT_EQ(a_says.read_line(20s), "waking");
  auto failed = a_says.read_line(20s);
  ASSERT_TRUE(failed);
  ASSERT_EQ(failed->rfind("error ", 0), 0u) << *failed;
  std::printf("the refused wake said: %s\n", failed->c_str());  // docs/bad-inputs.md quotes it
  const long waited_ms = std::stol(failed->substr(6));
  EXPECT_GE(waited_ms, 500) << *failed;
  EXPECT_LT(waited_ms, 5000) << *failed;
  EXPECT_NE(failed->find("wake('model')"), std::string::npos) << *failed;
  EXPECT_NE(failed->find("pid " + std::to_string(b.pid())), std::string::npos) << *failed;
  EXPECT_NE(failed->find("the tag stays asleep"), std::string::npos) << *failed;

  // Once B is gone, the same wake succeeds with every byte.
  b_told.write_line("exit");
  EXPECT_EQ(b.wait(10s), 0);
  a_told.write_line("wake");
  ASSERT_EQ(a_says.read_line(20s), "waking");
  auto woken = a_says.read_line(20s);
  ASSERT_TRUE(woken);
  EXPECT_EQ(woken->rfind("ok", 0), 0u) << *woken;
  a_told.write_line("exit");
  EXPECT_EQ(a.wait(10s), 0);
}

}  // namespace
}  // namespace tidepool::test
