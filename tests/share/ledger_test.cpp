// The ledger in one process (and simple children): segment names, creation
// and permissions, refusing corrupt and wrong-version segments, accounting,
// the budget rule with quotas, dead-entry reclaim, lock recovery.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <thread>
#include <vector>

#include "share/segment.hpp"
#include "share/ledger_test_support.hpp"

namespace tidepool::test {
namespace {

constexpr std::size_t kCapacity = 64 * MiB;

std::shared_ptr<LedgerDevice> ledger_device(const std::string& segment, std::size_t quota = 0,
                                            std::size_t capacity = kCapacity) {
  auto device = LedgerDevice::create(make_host(capacity), ledger_options(segment, quota));
  if (!device) throw Exception(device.error());
  return std::move(device).value();
}

// Maps a segment raw, to damage it as a bug or another program could.
struct RawSegment {
  explicit RawSegment(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) throw std::runtime_error("shm_open " + name);
    struct stat status {};
    fstat(fd, &status);
    bytes = static_cast<std::size_t>(status.st_size);
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  ~RawSegment() { munmap(memory, bytes); }
  share::SegmentHeader& header() const { return *static_cast<share::SegmentHeader*>(memory); }
  share::Entry& entry(std::size_t slot) const {
    return reinterpret_cast<share::Entry*>(static_cast<char*>(memory) + sizeof(share::SegmentHeader))[slot];
  }
  void* memory = nullptr;
  std::size_t bytes = 0;
};

// Creates a segment in a plain file: no LedgerDevice, for the refusal tests.
void create_segment(const std::string& name, std::size_t total = kCapacity) {
  LedgerSegmentOptions options;
  options.name = name;
  options.device_id = "host:ledger-test";
  options.device_total_bytes = total;
  auto ledger = Ledger::open_or_create(options);
  ASSERT_TRUE(ledger) << ledger.error().message();
}

TEST(LedgerSegmentName, SanitizesTheDeviceId) {
  const std::string prefix = "/tidepool-u" + std::to_string(geteuid()) + "-";
  EXPECT_EQ(ledger_segment_name("host:gpu0"), prefix + "host_gpu0");
  EXPECT_EQ(ledger_segment_name("GPU-5f3c1b2a-9d7e"), prefix + "GPU-5f3c1b2a-9d7e");
  EXPECT_EQ(ledger_segment_name("a/b c"), prefix + "a_b_c");
  const std::string long_a = "host:" + std::string(300, 'x') + "a";
  const std::string long_b = "host:" + std::string(300, 'x') + "b";
  EXPECT_LE(ledger_segment_name(long_a).size(), 200u);
  EXPECT_NE(ledger_segment_name(long_a), ledger_segment_name(long_b));
}

TEST(LedgerSegment, IsCreatedOnFirstUseWithMode0600) {
  UniqueSegment segment("mode");
  auto device = ledger_device(segment.name());
  struct stat status {};
  ASSERT_EQ(stat(("/dev/shm" + segment.name()).c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
}

TEST(LedgerSegment, GroupModeIsExact) {
  UniqueSegment segment("group");
  LedgerOptions options = ledger_options(segment.name());
  options.mode = 0660;
  auto device = LedgerDevice::create(make_host(kCapacity), options);
  ASSERT_TRUE(device) << device.error().message();
  struct stat status {};
  ASSERT_EQ(stat(("/dev/shm" + segment.name()).c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0660u);
}

TEST(LedgerSegment, RefusesAWorldReadableMode) {
  UniqueSegment segment("badmode");
  LedgerOptions options = ledger_options(segment.name());
  options.mode = 0644;
  auto device = LedgerDevice::create(make_host(kCapacity), options);
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::invalid_argument);
  EXPECT_NE(device.error().message().find("0644"), std::string::npos) << device.error().message();
}

TEST(LedgerSegment, RefusesAWrongVersion) {
  UniqueSegment segment("version");
  create_segment(segment.name());
  {
    RawSegment raw(segment.name());
    raw.header().identity.layout_version = 7;
  }
  auto ledger = Ledger::open_existing(segment.name());
  ASSERT_FALSE(ledger);
  EXPECT_EQ(ledger.error().code(), Errc::corrupt_data);
  EXPECT_NE(ledger.error().message().find("layout version is 7"), std::string::npos) << ledger.error().message();
  // A LedgerDevice refuses it too, rather than making a new one over it.
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::corrupt_data);
}

TEST(LedgerSegment, RefusesAnOverwrittenHeader) {
  UniqueSegment segment("checksum");
  create_segment(segment.name());
  {
    RawSegment raw(segment.name());
    raw.header().identity.limit_bytes += 1;  // a stray write: the checksum no longer matches
  }
  auto ledger = Ledger::open_existing(segment.name());
  ASSERT_FALSE(ledger);
  EXPECT_EQ(ledger.error().code(), Errc::corrupt_data);
  EXPECT_NE(ledger.error().message().find("checksum"), std::string::npos) << ledger.error().message();
  EXPECT_NE(ledger.error().message().find(segment.name()), std::string::npos);
}

TEST(LedgerSegment, RefusesSomethingThatIsNotALedger) {
  UniqueSegment segment("garbage");
  const int fd = shm_open(segment.name().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> garbage(share::kSegmentBytes, 'G');
  ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  close(fd);
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::corrupt_data);
  EXPECT_NE(device.error().message().find("not a tidepool ledger"), std::string::npos) << device.error().message();
}

TEST(LedgerSegment, RefusesATruncatedSegment) {
  UniqueSegment segment("short");
  const int fd = shm_open(segment.name().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4), 0);
  close(fd);
  auto ledger = Ledger::open_existing(segment.name());
  ASSERT_FALSE(ledger);
  EXPECT_EQ(ledger.error().code(), Errc::corrupt_data);
  EXPECT_NE(ledger.error().message().find("too small"), std::string::npos) << ledger.error().message();
}

TEST(LedgerSegment, RefusesACorruptEntry) {
  UniqueSegment segment("entry");
  create_segment(segment.name());
  {
    RawSegment raw(segment.name());
    raw.entry(3).state.store(0x12345678);
  }
  auto ledger = Ledger::open_existing(segment.name());
  ASSERT_TRUE(ledger) << ledger.error().message();
  auto snapshot = (*ledger)->snapshot();
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().code(), Errc::corrupt_data);
  EXPECT_NE(snapshot.error().message().find("entry 3"), std::string::npos) << snapshot.error().message();
}

TEST(LedgerSegment, ScansStopAtTheHighestSlotEverUsed) {
  UniqueSegment segment("slots");
  auto first = ledger_device(segment.name());
  auto second = ledger_device(segment.name());
  RawSegment raw(segment.name());
  EXPECT_EQ(raw.header().slots_end.load(), 2u);
  second.reset();  // never lowered: a later registration may take slot 1 again
  EXPECT_EQ(raw.header().slots_end.load(), 2u);
  auto third = ledger_device(segment.name());
  EXPECT_EQ(raw.header().slots_end.load(), 2u);
}

TEST(LedgerSegment, RefusesAnEntryInUsePastTheSlotsEnd) {
  UniqueSegment segment("hidden");
  auto device = ledger_device(segment.name());
  {
    RawSegment raw(segment.name());
    // A live-looking entry the hot path would not read: refused, not trusted.
    raw.entry(5).pid.store(getpid());
    raw.entry(5).state.store(share::kEntryActive);
  }
  auto snapshot = Ledger::open_existing(segment.name()).value()->snapshot();
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().code(), Errc::corrupt_data);
  EXPECT_NE(snapshot.error().message().find("entry 5 is in use past slots_end 1"), std::string::npos)
      << snapshot.error().message();
  RawSegment(segment.name()).entry(5).state.store(share::kEntryFree);
  {
    RawSegment raw(segment.name());
    raw.header().slots_end.store(share::kEntryCount + 1);
  }
  snapshot = Ledger::open_existing(segment.name()).value()->snapshot();
  ASSERT_FALSE(snapshot);
  EXPECT_NE(snapshot.error().message().find("slots_end is 129"), std::string::npos) << snapshot.error().message();
  RawSegment(segment.name()).header().slots_end.store(1);  // lets the device's destructor run clean
}

TEST(LedgerSegment, RefusesAnotherDeviceOrLimit) {
  UniqueSegment segment("mismatch");
  auto first = ledger_device(segment.name());
  auto bigger = LedgerDevice::create(make_host(2 * kCapacity), ledger_options(segment.name()));
  ASSERT_FALSE(bigger);
  EXPECT_EQ(bigger.error().code(), Errc::invalid_argument);
  LedgerOptions options = ledger_options(segment.name());
  options.shared_limit_bytes = 32 * MiB;
  auto other_limit = LedgerDevice::create(make_host(kCapacity), options);
  ASSERT_FALSE(other_limit);
  EXPECT_NE(other_limit.error().message().find("shared limit"), std::string::npos);
  auto other_device = LedgerDevice::create(make_host(kCapacity, "other"), ledger_options(segment.name()));
  ASSERT_FALSE(other_device);
  EXPECT_NE(other_device.error().message().find("host:other"), std::string::npos);
}

TEST(LedgerDevice, ReservesBeforeAllocatingAndReleasesAfterFreeing) {
  UniqueSegment segment("account");
  auto device = ledger_device(segment.name());
  auto ptr = device->allocate(3 * MiB);
  ASSERT_TRUE(ptr) << ptr.error().message();
  auto handle = device->create(5 * MiB);
  ASSERT_TRUE(handle) << handle.error().message();
  EXPECT_EQ(device->account().reserved_bytes(), 8 * MiB);
  auto snapshot = device->account().ledger().snapshot();
  ASSERT_TRUE(snapshot);
  ASSERT_EQ(snapshot->entries.size(), 1u);
  EXPECT_EQ(snapshot->entries[0].pid, getpid());
  EXPECT_TRUE(snapshot->entries[0].alive);
  EXPECT_EQ(snapshot->reserved_bytes, 8 * MiB);
  ASSERT_TRUE(device->free(*ptr, 3 * MiB));
  ASSERT_TRUE(device->release(*handle, 5 * MiB));
  EXPECT_EQ(device->account().reserved_bytes(), 0u);
  EXPECT_EQ(device->account().ledger().snapshot()->peak_reserved_bytes, 8 * MiB);
}

TEST(LedgerDevice, AFailedDeviceCallLeavesNoReservation) {
  UniqueSegment segment("devfail");
  auto device = ledger_device(segment.name());
  // Not a multiple of the granularity: the host device refuses it.
  auto handle = device->create(MiB + 1);
  ASSERT_FALSE(handle);
  EXPECT_EQ(device->account().reserved_bytes(), 0u);
  EXPECT_FALSE(device->free(reinterpret_cast<void*>(0x1000), 4096));
  EXPECT_EQ(device->account().reserved_bytes(), 0u);
}

TEST(LedgerDevice, TwoEntriesNeverReserveMoreThanTheLimit) {
  UniqueSegment segment("limit");
  LedgerOptions options = ledger_options(segment.name());
  options.cooperative_trim = false;
  auto a = LedgerDevice::create(make_host(kCapacity), options).value();
  auto b = LedgerDevice::create(make_host(kCapacity), options).value();
  auto held = a->create(48 * MiB);
  ASSERT_TRUE(held);
  EXPECT_EQ(b->mem_info().free_bytes, 16 * MiB);
  EXPECT_EQ(b->mem_info().total_bytes, kCapacity);
  auto refused = b->create(32 * MiB);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  // The report names who holds the device.
  EXPECT_NE(refused.error().message().find("pid " + std::to_string(getpid())), std::string::npos)
      << refused.error().message();
  EXPECT_NE(refused.error().message().find("48.0 MiB"), std::string::npos) << refused.error().message();
  auto fits = b->create(16 * MiB);
  ASSERT_TRUE(fits);
  ASSERT_TRUE(a->release(*held, 48 * MiB));
  ASSERT_TRUE(b->release(*fits, 16 * MiB));
}

TEST(LedgerDevice, ASharedLimitBelowTheCapacityBinds) {
  UniqueSegment segment("shared");
  LedgerOptions options = ledger_options(segment.name());
  options.shared_limit_bytes = 16 * MiB;
  auto device = LedgerDevice::create(make_host(kCapacity), options).value();
  EXPECT_EQ(device->mem_info().total_bytes, 16 * MiB);
  EXPECT_FALSE(device->create(17 * MiB));
  auto handle = device->create(16 * MiB);
  ASSERT_TRUE(handle);
  ASSERT_TRUE(device->release(*handle, 16 * MiB));
}

TEST(LedgerQuota, CapsTheProcessAndIsItsTotal) {
  UniqueSegment segment("quota");
  auto device = ledger_device(segment.name(), 16 * MiB);
  // mem_info's total is the quota, so a pool's fraction is of the quota.
  EXPECT_EQ(device->mem_info().total_bytes, 16 * MiB);
  EXPECT_EQ(device->mem_info().free_bytes, 16 * MiB);
  auto over = device->create(17 * MiB);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), Errc::out_of_memory);
  EXPECT_NE(over.error().message().find("quota"), std::string::npos) << over.error().message();
  auto handle = device->create(16 * MiB);
  ASSERT_TRUE(handle);
  ASSERT_TRUE(device->release(*handle, 16 * MiB));
}

TEST(LedgerQuota, IsAGuaranteeOthersCannotTake) {
  UniqueSegment segment("guarantee");
  auto with_quota = ledger_device(segment.name(), 40 * MiB);
  LedgerOptions options = ledger_options(segment.name());
  options.cooperative_trim = false;
  auto without = LedgerDevice::create(make_host(kCapacity), options).value();
  // 40 MiB are promised though none is reserved: 24 MiB remain for the other.
  EXPECT_EQ(without->mem_info().free_bytes, 24 * MiB);
  EXPECT_FALSE(without->create(25 * MiB));
  auto mine = with_quota->create(40 * MiB);
  ASSERT_TRUE(mine) << mine.error().message();
  ASSERT_TRUE(with_quota->release(*mine, 40 * MiB));
}

TEST(LedgerQuota, RegistrationIsRefusedWhenQuotasDoNotFit) {
  UniqueSegment segment("admission");
  auto first = ledger_device(segment.name(), 40 * MiB);
  auto second = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name(), 40 * MiB));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Errc::out_of_memory);
  EXPECT_NE(second.error().message().find("commit 40.0 MiB"), std::string::npos) << second.error().message();
  auto too_big = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name(), 65 * MiB));
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code(), Errc::invalid_argument);
}

TEST(LedgerDevice, DestructionClearsTheEntry) {
  UniqueSegment segment("unregister");
  auto observer = Ledger::open_or_create({segment.name(), "host:ledger-test", kCapacity}).value();
  {
    auto device = ledger_device(segment.name());
    EXPECT_EQ(observer->snapshot()->entries.size(), 1u);
  }
  EXPECT_EQ(observer->snapshot()->entries.size(), 0u);
}

TEST(LedgerReclaim, ADeadProcessEntryIsClearedByTheNextThatLooks) {
  UniqueSegment segment("dead");
  Pipe done;
  Child child([&] {
    auto device = ledger_device(segment.name());
    auto handle = device->create(40 * MiB);
    if (!handle) return 2;
    done.write_line("held");
    _exit(0);  // no destructors: the entry stays, as after a crash
  });
  ASSERT_EQ(done.read_line(10s), "held");
  ASSERT_EQ(child.wait(10s), 0);
  auto observer = Ledger::open_existing(segment.name()).value();
  auto before = observer->snapshot().value();
  ASSERT_EQ(before.entries.size(), 1u);
  EXPECT_FALSE(before.entries[0].alive);
  EXPECT_EQ(before.reserved_bytes, 40 * MiB);
  // A process that needs the budget reclaims the dead entry itself.
  LedgerOptions options = ledger_options(segment.name());
  options.cooperative_trim = false;
  auto device = LedgerDevice::create(make_host(kCapacity), options).value();
  auto handle = device->create(64 * MiB);
  ASSERT_TRUE(handle) << handle.error().message();
  auto after = observer->snapshot().value();
  ASSERT_EQ(after.entries.size(), 1u);
  EXPECT_EQ(after.entries[0].pid, getpid());
  EXPECT_GE(after.reclaimed_entries, 1u);
  ASSERT_TRUE(device->release(*handle, 64 * MiB));
}

TEST(LedgerReclaim, AReusedPidIsNotTheOldProcess) {
  UniqueSegment segment("reuse");
  auto device = ledger_device(segment.name());
  {
    RawSegment raw(segment.name());
    // Same pid, another start time: what a recycled pid looks like.
    raw.entry(0).start_time.fetch_add(1);
  }
  auto observer = Ledger::open_existing(segment.name()).value();
  auto snapshot = observer->snapshot().value();
  ASSERT_EQ(snapshot.entries.size(), 1u);
  EXPECT_FALSE(snapshot.entries[0].alive);
  EXPECT_EQ(observer->reclaim_dead().value(), 1u);
  EXPECT_TRUE(observer->snapshot()->entries.empty());
}

TEST(LedgerLock, AHolderKilledWhileHoldingItDoesNotWedgeTheOthers) {
  UniqueSegment segment("holder");
  auto device = ledger_device(segment.name());
  Pipe held;
  Child holder([&] {
    auto ledger = Ledger::open_existing(segment.name()).value();
    (void)ledger->with_lock_held([&] {
      held.write_line("locked");
      for (;;) pause();  // until kill -9
    });
    return 3;
  });
  ASSERT_EQ(held.read_line(10s), "locked");
  holder.kill9();
  // The next locker gets EOWNERDEAD, makes the lock consistent and goes on.
  auto handle = device->create(8 * MiB);
  ASSERT_TRUE(handle) << handle.error().message();
  auto snapshot = device->account().ledger().snapshot().value();
  EXPECT_EQ(snapshot.lock_recoveries, 1u);
  EXPECT_EQ(snapshot.reserved_bytes, 8 * MiB);
  ASSERT_TRUE(device->release(*handle, 8 * MiB));
}

TEST(LedgerLock, ALiveHolderTimesOutWithItsPid) {
  UniqueSegment segment("timeout");
  create_segment(segment.name());
  Pipe held;
  Child holder([&] {
    auto ledger = Ledger::open_existing(segment.name()).value();
    (void)ledger->with_lock_held([&] {
      held.write_line("locked");
      for (;;) pause();
    });
    return 3;
  });
  ASSERT_EQ(held.read_line(10s), "locked");
  auto ledger = Ledger::open_existing(segment.name(), 200ms).value();
  auto snapshot = ledger->snapshot();
  ASSERT_FALSE(snapshot);
  EXPECT_EQ(snapshot.error().code(), Errc::device_error);
  EXPECT_NE(snapshot.error().message().find("held by pid " + std::to_string(holder.pid())), std::string::npos)
      << snapshot.error().message();
  holder.kill9();
  EXPECT_TRUE(ledger->snapshot());
}

TEST(LedgerLock, AWaiterWhoseWakeUpIsLostStillGetsTheFreedLock) {
  // What a waiter killed between its wake-up and taking the lock leaves when
  // another process takes the free lock by trylock meanwhile: a sleeper, and
  // a lock word without FUTEX_WAITERS, so the next unlock wakes no one. The
  // sleeper must look again by itself, long before its lock_timeout.
  UniqueSegment segment("lostwake");
  create_segment(segment.name());
  RawSegment raw(segment.name());
  std::atomic_ref<int> word(raw.header().mutex.__data.__lock);
  constexpr int kFutexWaiters = static_cast<int>(0x80000000u);
  auto holder = Ledger::open_existing(segment.name()).value();
  auto waiter = Ledger::open_existing(segment.name(), 3s).value();
  std::atomic<bool> locked{false};
  std::atomic<bool> release{false};
  std::thread holding([&] {
    (void)holder->with_lock_held([&] {
      locked = true;
      while (!release) std::this_thread::sleep_for(1ms);
    });
  });
  while (!locked) std::this_thread::sleep_for(1ms);
  std::string waited;  // "ok" or the error
  std::thread waiting([&] {
    auto snapshot = waiter->snapshot();
    waited = snapshot ? std::string("ok") : snapshot.error().message();
  });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((word.load() & kFutexWaiters) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_NE(word.load() & kFutexWaiters, 0) << "the waiter never waited";
  std::this_thread::sleep_for(50ms);  // it sleeps in the kernel now
  word.fetch_and(~kFutexWaiters);     // the wake-up is lost
  release = true;
  holding.join();
  const auto released = std::chrono::steady_clock::now();
  waiting.join();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - released);
  EXPECT_EQ(waited, "ok");
  EXPECT_LT(took.count(), 1000) << "the waiter slept on a free lock";
}

// Between a creator's ftruncate and its header, the segment is all zeros, its
// creator pid too: a process opening it then waits, as for a creator that is
// alive, rather than calling it "not a tidepool ledger" (which
// ConcurrentCreatorsMakeOneSegment hit under load). Here the "creator" writes
// a real header (a finished ledger's bytes) 200 ms after sizing the file, the
// ready flag last.
TEST(LedgerSegment, OpeningWaitsForACreatorThatHasNotWrittenItsPidYet) {
  UniqueSegment model("model");
  auto made = LedgerDevice::create(make_host(kCapacity), ledger_options(model.name()));
  ASSERT_TRUE(made) << made.error().message();
  std::vector<char> bytes(share::kSegmentBytes);
  const int model_fd = shm_open(model.name().c_str(), O_RDONLY, 0);
  ASSERT_GE(model_fd, 0);
  ASSERT_EQ(pread(model_fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  close(model_fd);

  UniqueSegment segment("slow-creator");
  const int fd = shm_open(segment.name().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0600), 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes.size())), 0);
  std::thread creator([&] {
    std::this_thread::sleep_for(200ms);
    constexpr std::size_t kReady = sizeof(std::uint32_t);  // init_state, at offset 0
    (void)!pwrite(fd, bytes.data() + kReady, bytes.size() - kReady, kReady);
    (void)!pwrite(fd, bytes.data(), kReady, 0);
  });
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
  creator.join();
  close(fd);
  EXPECT_TRUE(device) << device.error().message();
}

TEST(LedgerSegment, ConcurrentCreatorsMakeOneSegment) {
  UniqueSegment segment("race");
  constexpr int kProcesses = 8;
  Pipe results;
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < kProcesses; ++i) {
    children.push_back(std::make_unique<Child>([&] {
      auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment.name()));
      if (!device) {
        results.write_line("error " + device.error().message());
        return 1;
      }
      results.write_line("ok");
      std::this_thread::sleep_for(300ms);  // stay registered while the others arrive
      return 0;
    }));
  }
  for (int i = 0; i < kProcesses; ++i) EXPECT_EQ(results.read_line(10s), "ok");
  for (auto& child : children) EXPECT_EQ(child->wait(10s), 0);
  EXPECT_TRUE(Ledger::open_existing(segment.name()));
}

}  // namespace
}  // namespace tidepool::test
