// LedgerAccount on its own, without a device: registering, reserving and
// giving back, room and the share it reports, quotas, answering trim
// requests (from its thread and by hand), batch reservations, a forked
// child, and the entry cleared at the end. Two accounts of one process stand
// for two processes (tests/share/ledger_process_test.cpp has real ones).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "share/ledger_test_support.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/ledger_account.hpp"

namespace tidepool::test {
namespace {

constexpr std::size_t kTotal = 64 * MiB;
constexpr const char* kDeviceId = "host:account-test";

std::shared_ptr<LedgerAccount> open_account(const LedgerOptions& options) {
  auto account = LedgerAccount::open(kDeviceId, kTotal, options);
  if (!account) throw Exception(account.error());
  return std::move(account).value();
}

std::shared_ptr<LedgerAccount> open_account(const UniqueSegment& segment, std::size_t quota = 0) {
  return open_account(ledger_options(segment.name(), quota));
}

// This process's entries in the segment (one per account).
std::vector<LedgerEntryInfo> entries_of(const LedgerAccount& account) {
  return account.ledger().snapshot().value().entries;
}

// The entry of the account that reserved `reserved` bytes.
LedgerEntryInfo entry_reserving(const LedgerAccount& account, std::size_t reserved) {
  for (const LedgerEntryInfo& entry : entries_of(account))
    if (entry.reserved_bytes == reserved) return entry;
  ADD_FAILURE() << "no entry reserves " << reserved << " bytes";
  return {};
}

TEST(LedgerAccount, ReservesAndGivesBack) {
  UniqueSegment segment("reserve");
  auto account = open_account(segment);
  EXPECT_EQ(account->limit_bytes(), kTotal);
  ASSERT_TRUE(account->reserve(8 * MiB));
  EXPECT_EQ(account->reserved_bytes(), 8 * MiB);
  ASSERT_EQ(entries_of(*account).size(), 1u);
  EXPECT_EQ(entries_of(*account)[0].reserved_bytes, 8 * MiB);
  EXPECT_EQ(entries_of(*account)[0].pid, getpid());
  EXPECT_TRUE(account->reserve(0));  // nothing to do
  EXPECT_EQ(account->reserved_bytes(), 8 * MiB);
  account->unreserve(3 * MiB);
  EXPECT_EQ(account->reserved_bytes(), 5 * MiB);
  account->unreserve(6 * MiB);  // more than it holds: never below 0
  EXPECT_EQ(account->reserved_bytes(), 0u);
  EXPECT_EQ(account->ledger().snapshot().value().peak_reserved_bytes, 8 * MiB);
}

TEST(LedgerAccount, RoomAndShareFollowTheOthersAndTheQuota) {
  UniqueSegment segment("room");
  auto mine = open_account(segment);
  EXPECT_EQ(mine->room(), kTotal);
  // No quota: the total is the limit, free what it could reserve and the device has.
  MemInfo share = mine->share_of(MemInfo{10 * MiB, kTotal});
  EXPECT_EQ(share.total_bytes, kTotal);
  EXPECT_EQ(share.free_bytes, 10 * MiB);
  // Another's quota is its commitment even before it reserves.
  auto other = open_account(segment, 16 * MiB);
  EXPECT_EQ(mine->room(), 48 * MiB);
  ASSERT_TRUE(mine->reserve(40 * MiB));
  EXPECT_EQ(mine->room(), 8 * MiB);
  EXPECT_EQ(other->room(), 16 * MiB);
  // With a quota: the quota is the total, what is left of it the most free.
  ASSERT_TRUE(other->reserve(2 * MiB));
  share = other->share_of(MemInfo{kTotal, kTotal});
  EXPECT_EQ(share.total_bytes, 16 * MiB);
  EXPECT_EQ(share.free_bytes, 14 * MiB);
  EXPECT_NE(other->description().find("quota 16.0 MiB"), std::string::npos) << other->description();
  EXPECT_NE(mine->description().find("quota none"), std::string::npos) << mine->description();
}

TEST(LedgerAccount, ASharedLimitBelowTheDeviceIsTheTotal) {
  UniqueSegment segment("limit");
  LedgerOptions options = ledger_options(segment.name());
  options.shared_limit_bytes = 32 * MiB;
  auto account = open_account(options);
  EXPECT_EQ(account->limit_bytes(), 32 * MiB);
  EXPECT_EQ(account->share_of(MemInfo{kTotal, kTotal}).total_bytes, 32 * MiB);
  EXPECT_EQ(account->share_of(MemInfo{kTotal, kTotal}).free_bytes, 32 * MiB);
  Status over = account->reserve(33 * MiB);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), Errc::out_of_memory);
}

TEST(LedgerAccount, AQuotaIsACapWithoutWaiting) {
  UniqueSegment segment("cap");
  auto account = open_account(segment, 8 * MiB);
  ASSERT_TRUE(account->reserve(6 * MiB));
  const auto start = std::chrono::steady_clock::now();
  Status refused = account->reserve(4 * MiB);
  ASSERT_FALSE(refused);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);  // no trim can help: no wait
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("quota of 8.00 MiB would be exceeded by 2.00 MiB"), std::string::npos)
      << refused.error().message();
  EXPECT_EQ(account->reserved_bytes(), 6 * MiB);
}

TEST(LedgerAccount, RegisteringRefusesWhatCannotBeGuaranteed) {
  UniqueSegment segment("register");
  EXPECT_EQ(LedgerAccount::create(nullptr).error().code(), Errc::invalid_argument);
  auto above = LedgerAccount::open(kDeviceId, kTotal, ledger_options(segment.name(), kTotal + 1));
  ASSERT_FALSE(above);
  EXPECT_EQ(above.error().code(), Errc::invalid_argument);
  EXPECT_NE(above.error().message().find("above the shared limit"), std::string::npos) << above.error().message();
  auto first = open_account(segment, 40 * MiB);
  auto second = LedgerAccount::open(kDeviceId, kTotal, ledger_options(segment.name(), 40 * MiB));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Errc::out_of_memory);
  EXPECT_NE(second.error().message().find("a quota is a guarantee"), std::string::npos)
      << second.error().message();
  ASSERT_NE(second.error().oom(), nullptr);
  EXPECT_EQ(second.error().oom()->advice, OomAdvice::lower_quota);  // worded by the caller
  EXPECT_EQ(second.error().message().find("TIDEPOOL_"), std::string::npos) << second.error().message();
  EXPECT_NE(second.error().message().find("pid " + std::to_string(getpid())), std::string::npos)
      << second.error().message();
  EXPECT_EQ(entries_of(*first).size(), 1u);  // the refused one left nothing
}

TEST(LedgerAccount, AFullSegmentIsLimitReached) {
  UniqueSegment segment("full");
  std::vector<std::shared_ptr<LedgerAccount>> accounts;
  for (;;) {
    auto account = LedgerAccount::open(kDeviceId, kTotal, ledger_options(segment.name()));
    if (!account) {
      EXPECT_EQ(account.error().code(), Errc::limit_reached) << account.error().message();
      EXPECT_NE(account.error().message().find("is full"), std::string::npos) << account.error().message();
      break;
    }
    accounts.push_back(std::move(*account));
    ASSERT_LE(accounts.size(), 1000u) << "the segment never filled";
  }
  EXPECT_EQ(accounts.size(), accounts.front()->ledger().snapshot().value().entry_capacity);
  accounts.pop_back();  // its entry is cleared: the next one registers
  EXPECT_TRUE(LedgerAccount::open(kDeviceId, kTotal, ledger_options(segment.name())));
}

TEST(LedgerAccount, DestructionClearsTheEntryAndWhatItReserved) {
  UniqueSegment segment("destroy");
  auto watcher = open_account(segment);
  auto account = open_account(segment);
  ASSERT_TRUE(account->reserve(20 * MiB));
  EXPECT_EQ(watcher->room(), kTotal - 20 * MiB);
  account.reset();
  EXPECT_EQ(entries_of(*watcher).size(), 1u);
  EXPECT_EQ(watcher->room(), kTotal);
}

// The hooks of an account that holds `cached` bytes it can give back.
TrimHooks giving_back(LedgerAccount& account, std::atomic<std::size_t>& cached) {
  TrimHooks hooks;
  hooks.trim = [&account, &cached] {
    const std::size_t released = cached.exchange(0);
    account.unreserve(released);
    return released;
  };
  hooks.cached_free_bytes = [&cached] { return cached.load(); };
  hooks.asleep_bytes = [] { return std::size_t{3} * MiB; };
  return hooks;
}

TEST(LedgerAccount, ItsThreadAnswersAnothersTrimRequest) {
  UniqueSegment segment("answer");
  auto holder = open_account(segment);
  ASSERT_TRUE(holder->reserve(48 * MiB));
  std::atomic<std::size_t> cached{40 * MiB};
  holder->set_trim_hooks(giving_back(*holder, cached));
  const LedgerEntryInfo reported = entry_reserving(*holder, 48 * MiB);
  EXPECT_TRUE(reported.answers_trim);
  EXPECT_TRUE(reported.cached_free_known);
  EXPECT_EQ(reported.cached_free_bytes, 40 * MiB);
  EXPECT_EQ(reported.asleep_bytes, 3 * MiB);

  auto wanting = open_account(segment);
  ASSERT_TRUE(wanting->reserve(32 * MiB));  // 48 + 32 > 64: it waits for the holder's trim
  EXPECT_EQ(wanting->reserved_bytes(), 32 * MiB);
  EXPECT_EQ(holder->reserved_bytes(), 8 * MiB);
  // The wanting account proceeds once the room is there, which may be just
  // before the holder's thread counts its answer.
  EXPECT_TRUE(wait_until([&] { return entry_reserving(*holder, 8 * MiB).trims_answered != 0; }, 10s));
  const LedgerEntryInfo answered = entry_reserving(*holder, 8 * MiB);
  EXPECT_EQ(answered.trims_answered, 1u);
  EXPECT_EQ(answered.bytes_trimmed, 40 * MiB);
  EXPECT_EQ(answered.cached_free_bytes, 0u);
  const LedgerEntryInfo asked = entry_reserving(*wanting, 32 * MiB);
  EXPECT_EQ(asked.trim_requests, 1u);
  EXPECT_EQ(asked.wanted_bytes, 0u);  // no longer waiting

  holder->clear_trim_hooks();
  const LedgerEntryInfo cleared = entry_reserving(*holder, 8 * MiB);
  EXPECT_FALSE(cleared.answers_trim);
  EXPECT_FALSE(cleared.cached_free_known);
  EXPECT_EQ(cleared.asleep_bytes, 0u);
}

TEST(LedgerAccount, WithoutAThreadTrimRequestsAreAnsweredByHand) {
  UniqueSegment segment("by-hand");
  LedgerOptions options = ledger_options(segment.name());
  options.poll_period = 0ms;
  auto holder = open_account(options);
  ASSERT_TRUE(holder->reserve(48 * MiB));
  std::atomic<std::size_t> cached{40 * MiB};
  holder->set_trim_hooks(giving_back(*holder, cached));
  EXPECT_FALSE(holder->trim_requested());
  EXPECT_EQ(holder->answer_trim_requests(), 0u);  // no one asked

  auto wanting = open_account(segment);
  Status reserved = Error(Errc::device_error, "not yet");
  std::thread waiter([&] { reserved = wanting->reserve(32 * MiB); });
  std::size_t released = 0;
  EXPECT_TRUE(wait_until([&] { return (released = holder->answer_trim_requests()) != 0; }, 2s));
  waiter.join();
  EXPECT_EQ(released, 40 * MiB);
  EXPECT_TRUE(reserved) << reserved.error().message();
  EXPECT_FALSE(holder->trim_requested());
  EXPECT_EQ(holder->answer_trim_requests(), 0u);  // answered once
  holder->clear_trim_hooks();
}

TEST(LedgerAccount, AProcessWithAQuotaNeverAnswers) {
  UniqueSegment segment("quota-answer");
  auto holder = open_account(segment, 48 * MiB);
  ASSERT_TRUE(holder->reserve(48 * MiB));
  std::atomic<std::size_t> cached{40 * MiB};
  holder->set_trim_hooks(giving_back(*holder, cached));
  EXPECT_FALSE(entry_reserving(*holder, 48 * MiB).answers_trim);
  auto wanting = open_account(segment);
  Status refused = wanting->reserve(32 * MiB);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("no other process answers trim requests"), std::string::npos)
      << refused.error().message();
  EXPECT_EQ(cached.load(), 40 * MiB);  // never asked to trim
  holder->clear_trim_hooks();
}

TEST(LedgerAccount, ABatchIsOneReservationThatWaitsItsBound) {
  UniqueSegment segment("batch");
  LedgerOptions options = ledger_options(segment.name());
  options.wake_wait = 100ms;
  auto account = open_account(options);
  Status overflow = account->reserve_many(SIZE_MAX / 2, 3);
  ASSERT_FALSE(overflow);
  EXPECT_EQ(overflow.error().code(), Errc::invalid_argument);
  EXPECT_NE(overflow.error().message().find("overflows"), std::string::npos) << overflow.error().message();
  ASSERT_TRUE(account->reserve_many(4 * MiB, 4));
  EXPECT_EQ(account->reserved_bytes(), 16 * MiB);
  // 16 x 4 MiB more does not fit: nothing of it is taken, after the wake's wait.
  const auto start = std::chrono::steady_clock::now();
  Status refused = account->reserve_many(4 * MiB, 16);
  ASSERT_FALSE(refused);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("wake_wait"), std::string::npos) << refused.error().message();
  EXPECT_EQ(account->reserved_bytes(), 16 * MiB);
  const LedgerEntryInfo entry = entries_of(*account)[0];
  EXPECT_EQ(entry.wake_waits, 1u);
  EXPECT_EQ(entry.wanted_bytes, 0u);
}

TEST(LedgerAccount, AForkedChildLeavesItsParentsEntryAlone) {
  UniqueSegment segment("fork");
  auto account = open_account(segment);
  ASSERT_TRUE(account->reserve(4 * MiB));
  std::atomic<std::size_t> cached{0};
  account->set_trim_hooks(giving_back(*account, cached));  // its thread runs: a child has none
  Child child([&]() -> int {
    Status refused = account->reserve(1 * MiB);
    if (refused || refused.error().code() != Errc::unsupported) return 10;
    if (refused.error().message().find("forked") == std::string::npos) return 11;
    account->unreserve(4 * MiB);
    account->refresh_reports();
    if (account->answer_trim_requests() != 0) return 12;
    account.reset();  // neither the entry nor the parent's thread is touched
    return 0;
  });
  EXPECT_EQ(child.wait(10s), 0);
  EXPECT_EQ(account->reserved_bytes(), 4 * MiB);
  ASSERT_EQ(entries_of(*account).size(), 1u);
  EXPECT_EQ(entries_of(*account)[0].pid, getpid());
  account->clear_trim_hooks();
}

// The parent's thread holds the hooks' lock at the fork (it is inside a
// report): the child must not wait on that lock, which no thread of its own
// will ever release.
TEST(LedgerAccount, AChildForkedWhileItsParentsThreadIsInAHookTakesNoLockOfIt) {
  UniqueSegment segment("fork-in-hook");
  LedgerOptions options = ledger_options(segment.name());
  options.poll_period = 1ms;  // a report every 10 ms
  auto account = open_account(options);
  std::atomic<bool> armed{false}, inside{false}, release{false};
  TrimHooks hooks;
  hooks.cached_free_bytes = [&]() -> std::size_t {
    if (!armed.load()) return 0;
    inside.store(true);
    for (int i = 0; i < 10000 && !release.load(); ++i) std::this_thread::sleep_for(1ms);
    return 0;
  };
  account->set_trim_hooks(hooks);
  armed.store(true);
  for (int i = 0; i < 5000 && !inside.load(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(inside.load()) << "the background thread never reported";
  Child child([&]() -> int {
    account->refresh_reports();
    account->set_trim_hooks(TrimHooks{});
    account->clear_trim_hooks();
    if (account->answer_trim_requests() != 0) return 10;
    account.reset();
    return 0;
  });
  const int status = child.wait(5s);
  release.store(true);
  EXPECT_EQ(status, 0) << "-1: the child waited on a lock its parent's thread held at the fork";
  account->clear_trim_hooks();
}

}  // namespace
}  // namespace tidepool::test
