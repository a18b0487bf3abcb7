// The ledger between real processes (fork, then _exit): preallocation under
// quotas, random alloc/free never exceeding the capacity, kill -9 mid-run and
// while holding the lock, cooperative trim with and without it. Every wait is
// bounded; every child reports through a pipe.
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "share/ledger_test_support.hpp"

namespace tidepool::test {
namespace {

constexpr std::size_t kCapacity = 64 * MiB;

// A child's own tally of what it holds, as "pid bytes".
std::string tally_line(std::size_t bytes) { return std::to_string(getpid()) + " " + std::to_string(bytes); }

std::pair<int, std::size_t> parse_tally(const std::string& line) {
  std::istringstream in(line);
  int pid = 0;
  std::size_t bytes = 0;
  in >> pid >> bytes;
  return {pid, bytes};
}

// --- 4 processes preallocating under quotas that sum to the capacity ------

// Registers with `quota`, preallocates fraction x mem_info().total (the
// quota), reports, and holds it until told to go.
int preallocating_process(const std::string& segment, std::size_t quota, double fraction, Pipe& report, Pipe& go) {
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment, quota));
  if (!device) {
    report.write_line("error " + device.error().message());
    return 3;
  }
  const std::size_t total = (*device)->mem_info().total_bytes;
  const std::size_t bytes = static_cast<std::size_t>(static_cast<double>(total) * fraction) / MiB * MiB;
  auto region = (*device)->create(bytes);
  if (!region) {
    report.write_line("error " + region.error().message());
    return 4;
  }
  report.write_line("ok " + std::to_string(bytes));
  (void)go.read_line(30s);
  return (*device)->release(*region, bytes) ? 0 : 5;
}

void run_preallocation(double fraction, std::size_t expected_each) {
  UniqueSegment segment("prealloc");
  constexpr std::size_t kQuota = kCapacity / 4;
  Pipe report;
  Pipe go;
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(std::make_unique<Child>(
        [&] { return preallocating_process(segment.name(), kQuota, fraction, report, go); }));
    ASSERT_EQ(report.read_line(10s), "ok " + std::to_string(expected_each)) << "process " << i;
  }
  // All four hold their share; the fifth is refused at start with a clear error.
  Child fifth([&] { return preallocating_process(segment.name(), kQuota, fraction, report, go); });
  auto line = report.read_line(10s);
  ASSERT_TRUE(line);
  EXPECT_EQ(line->rfind("error ", 0), 0u) << *line;
  EXPECT_NE(line->find("registering the quota"), std::string::npos) << *line;
  EXPECT_NE(line->find("commit 64.0 MiB"), std::string::npos) << *line;
  for (const auto& child : children)
    EXPECT_NE(line->find("pid " + std::to_string(child->pid())), std::string::npos) << *line;
  EXPECT_EQ(fifth.wait(10s), 3);
  auto snapshot = Ledger::open_existing(segment.name()).value()->snapshot().value();
  EXPECT_EQ(snapshot.entries.size(), 4u);
  EXPECT_EQ(snapshot.reserved_bytes, 4 * expected_each);
  for (int i = 0; i < 4; ++i) go.write_line("go");
  for (const auto& child : children) EXPECT_EQ(child->wait(10s), 0);
}

TEST(LedgerProcesses, FourPreallocatingAllOfTheirQuotasStartAndAFifthIsRefused) {
  run_preallocation(1.0, 16 * MiB);
}

TEST(LedgerProcesses, PreallocationTakesTheFractionOfTheQuota) {
  // JAX's 75%, of the quota: 12 MiB each, and still no fifth.
  run_preallocation(0.75, 12 * MiB);
}

// --- N processes doing random alloc/free ----------------------------------

// Random create/release and allocate/free for `iterations`, then reports its
// tally and waits; then frees everything. OOMs are expected and counted.
int random_worker(const std::string& segment, unsigned seed, int iterations, Pipe& report, Pipe& go) {
  LedgerOptions options = ledger_options(segment);
  options.cooperative_trim = false;
  auto device = LedgerDevice::create(make_host(kCapacity), options);
  if (!device) {
    report.write_line("error " + device.error().message());
    return 3;
  }
  std::mt19937 random(seed);
  struct Held {
    bool physical;
    PhysicalHandle handle;
    void* ptr;
    std::size_t bytes;
  };
  std::vector<Held> held;
  std::size_t tally = 0;
  int ooms = 0;
  // An error exit says why on the report pipe, where the parent prints it.
  const auto fail = [&](int code, const std::string& why) {
    report.write_line("error (pid " + std::to_string(getpid()) + ") " + why);
    return code;
  };
  for (int i = 0; i < iterations; ++i) {
    if (!held.empty() && random() % 2 == 0) {
      const std::size_t index = random() % held.size();
      const Held h = held[index];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(index));
      const Status done = h.physical ? (*device)->release(h.handle, h.bytes) : (*device)->free(h.ptr, h.bytes);
      if (!done) return fail(6, "giving back " + std::to_string(h.bytes) + " bytes: " + done.error().message());
      tally -= h.bytes;
    } else {
      const std::size_t bytes = (1 + random() % 12) * MiB;
      if (random() % 2 == 0) {
        auto handle = (*device)->create(bytes);
        if (handle) held.push_back({true, *handle, nullptr, bytes}), tally += bytes;
        else if (handle.error().code() == Errc::out_of_memory) ++ooms;
        else return fail(7, "create: " + handle.error().message());
      } else {
        auto ptr = (*device)->allocate(bytes);
        if (ptr) held.push_back({false, 0, *ptr, bytes}), tally += bytes;
        else if (ptr.error().code() == Errc::out_of_memory) ++ooms;
        else return fail(7, "allocate: " + ptr.error().message());
      }
    }
    if ((*device)->account().reserved_bytes() != tally) {  // the ledger agrees with us at every step
      return fail(8, "the ledger says " + std::to_string((*device)->account().reserved_bytes()) + " bytes reserved, the worker " +
                         std::to_string(tally));
    }
  }
  report.write_line(tally_line(tally));
  (void)go.read_line(60s);
  for (const Held& h : held) (void)(h.physical ? (*device)->release(h.handle, h.bytes) : (*device)->free(h.ptr, h.bytes));
  return 0;
}

struct Sampler {
  std::size_t samples = 0;
  std::size_t most = 0;
  bool over = false;
  void sample(Ledger& ledger) {
    auto snapshot = ledger.snapshot();
    if (!snapshot) return;
    ++samples;
    most = std::max(most, snapshot->reserved_bytes);
    if (snapshot->reserved_bytes > snapshot->limit_bytes) over = true;
  }
};

TEST(LedgerProcesses, RandomAllocFreeNeverExceedsTheCapacity) {
  UniqueSegment segment("random");
  constexpr int kProcesses = 6;
  auto observer = Ledger::open_or_create({segment.name(), "host:ledger-test", kCapacity}).value();
  Pipe report;
  Pipe go;
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < kProcesses; ++i) {
    children.push_back(std::make_unique<Child>(
        [&, i] { return random_worker(segment.name(), 1000u + static_cast<unsigned>(i), 3000, report, go); }));
  }
  // Sample while they run, until every one has reported quiescence.
  Sampler sampler;
  std::size_t reported = 0;
  std::map<int, std::size_t> tallies;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (tallies.size() < kProcesses && std::chrono::steady_clock::now() < deadline) {
    sampler.sample(*observer);
    if (auto line = report.read_line(1ms)) {
      auto [pid, bytes] = parse_tally(*line);
      ASSERT_GT(pid, 0) << *line;
      tallies[pid] = bytes;
      reported += bytes;
    }
  }
  ASSERT_EQ(tallies.size(), static_cast<std::size_t>(kProcesses));
  EXPECT_GT(sampler.samples, 10u);
  EXPECT_FALSE(sampler.over);
  // At quiescence the ledger's sum is exactly what the processes hold.
  auto snapshot = observer->snapshot().value();
  EXPECT_EQ(snapshot.reserved_bytes, reported);
  for (const LedgerEntryInfo& entry : snapshot.entries) EXPECT_EQ(entry.reserved_bytes, tallies[entry.pid]);
  EXPECT_LE(snapshot.peak_reserved_bytes, kCapacity);
  EXPECT_GT(snapshot.peak_reserved_bytes, kCapacity / 2);  // they did press on the capacity
  for (int i = 0; i < kProcesses; ++i) go.write_line("go");
  for (const auto& child : children) EXPECT_EQ(child->wait(30s), 0);
  EXPECT_EQ(observer->snapshot()->reserved_bytes, 0u);
}

TEST(LedgerProcesses, KillNineMidRunAndWhileHoldingTheLock) {
  UniqueSegment segment("kill");
  constexpr int kWorkers = 4;
  auto observer = Ledger::open_or_create({segment.name(), "host:ledger-test", kCapacity}).value();
  // A victim that reserves, then spins taking and dropping the lock.
  Pipe victim_ready;
  Child victim([&] {
    LedgerOptions options = ledger_options(segment.name());
    options.cooperative_trim = false;
    auto device = LedgerDevice::create(make_host(kCapacity), options).value();
    auto handle = device->create(4 * MiB);
    if (!handle) return 2;
    victim_ready.write_line("running");
    for (;;) {
      auto extra = device->create(MiB);
      if (extra) (void)device->release(*extra, MiB);
    }
  });
  ASSERT_EQ(victim_ready.read_line(10s), "running");
  Pipe report;
  Pipe go;
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<Child>(
        [&, i] { return random_worker(segment.name(), 7u + static_cast<unsigned>(i), 4000, report, go); }));
  }
  // A holder that takes the lock and keeps it until killed.
  Pipe holder_ready;
  Child holder([&] {
    auto ledger = Ledger::open_existing(segment.name()).value();
    (void)ledger->with_lock_held([&] {
      holder_ready.write_line("locked");
      for (;;) pause();
    });
    return 3;
  });
  ASSERT_EQ(holder_ready.read_line(10s), "locked");
  std::this_thread::sleep_for(50ms);  // everyone is blocked on the held lock now
  holder.kill9();
  std::this_thread::sleep_for(20ms);  // the victim is mid-run again
  victim.kill9();

  std::map<int, std::size_t> tallies;
  std::size_t reported = 0;
  for (int i = 0; i < kWorkers; ++i) {
    auto line = report.read_line(60s);
    ASSERT_TRUE(line) << "a worker did not finish: deadlock?";
    auto [pid, bytes] = parse_tally(*line);
    ASSERT_GT(pid, 0) << *line;
    tallies[pid] = bytes;
    reported += bytes;
  }
  // The victim's reservation is reclaimed by whoever looks; make sure someone has.
  ASSERT_TRUE(observer->reclaim_dead());
  auto snapshot = observer->snapshot().value();
  EXPECT_GE(snapshot.lock_recoveries, 1u);
  EXPECT_EQ(snapshot.entries.size(), static_cast<std::size_t>(kWorkers));
  for (const LedgerEntryInfo& entry : snapshot.entries) {
    EXPECT_NE(entry.pid, victim.pid());
    EXPECT_EQ(entry.reserved_bytes, tallies[entry.pid]);
  }
  EXPECT_EQ(snapshot.reserved_bytes, reported);
  for (int i = 0; i < kWorkers; ++i) go.write_line("go");
  for (const auto& worker : workers) EXPECT_EQ(worker->wait(30s), 0);
}

// --- cooperative trim --------------------------------------------------------

// Process A: takes 60% of the device, frees it into its own cache (as a pool
// does), and idles. With `answer`, its trim hook gives the cache back.
int caching_process(const std::string& segment, bool answer, Pipe& report, Pipe& go) {
  auto device = LedgerDevice::create(make_host(kCapacity), ledger_options(segment)).value();
  std::mutex cache_mutex;
  std::vector<PhysicalHandle> cache;  // "freed" granules kept for reuse
  for (int i = 0; i < 38; ++i) {      // 38 MiB: 60% of 64 MiB
    auto handle = device->create(MiB);
    if (!handle) return 2;
    cache.push_back(*handle);
  }
  if (answer) {
    device->account().set_trim_hooks(TrimHooks{
        [&] {
          std::lock_guard lock(cache_mutex);
          std::size_t released = 0;
          for (PhysicalHandle handle : cache) {
            if (device->release(handle, MiB)) released += MiB;
            std::this_thread::sleep_for(200us);  // a device's release takes time
          }
          cache.clear();
          return released;
        },
        [&] {
          std::lock_guard lock(cache_mutex);
          return cache.size() * MiB;
        },
        {}});
  }
  report.write_line("cached");
  (void)go.read_line(30s);
  device->account().clear_trim_hooks();
  for (PhysicalHandle handle : cache) (void)device->release(handle, MiB);
  return 0;
}

void run_trim_scenario(bool a_answers, bool b_cooperates, const std::function<void(const Status&, const LedgerSnapshot&, int)>& check) {
  UniqueSegment segment("trim");
  Pipe report;
  Pipe go;
  Child a([&] { return caching_process(segment.name(), a_answers, report, go); });
  ASSERT_EQ(report.read_line(10s), "cached");
  Pipe b_report;
  Child b([&] {
    LedgerOptions options = ledger_options(segment.name());
    options.cooperative_trim = b_cooperates;
    auto device = LedgerDevice::create(make_host(kCapacity), options).value();
    auto handle = device->create(38 * MiB);  // B asks for 60%
    b_report.write_line(handle ? std::string("ok") : "error " + handle.error().message());
    return 0;
  });
  auto line = b_report.read_line(20s);
  ASSERT_TRUE(line);
  ASSERT_EQ(b.wait(10s), 0);
  // B can only have succeeded through A's trim, and B proceeds as soon as the trim
  // has released enough, which may be before A's hook has released the rest and
  // counted its answer: A is read once its answer is counted.
  auto ledger = Ledger::open_existing(segment.name()).value();
  LedgerSnapshot snapshot;
  (void)wait_until([&] {
    snapshot = ledger->snapshot().value();
    return *line != "ok" || (snapshot.entries.size() == 1 && snapshot.entries[0].trims_answered != 0);
  }, 10s);
  check(*line == "ok" ? Status() : Status(Error(Errc::out_of_memory, *line)), snapshot, a.pid());
  go.write_line("go");
  EXPECT_EQ(a.wait(10s), 0);
}

TEST(LedgerCooperativeTrim, BSucceedsAfterTheIdleCacheOfAIsReleased) {
  run_trim_scenario(true, true, [](const Status& b, const LedgerSnapshot& after, int a_pid) {
    EXPECT_TRUE(b) << b.error().message();
    ASSERT_EQ(after.entries.size(), 1u);  // B has exited; A remains
    EXPECT_EQ(after.entries[0].pid, a_pid);
    EXPECT_EQ(after.entries[0].reserved_bytes, 0u);
    EXPECT_EQ(after.entries[0].trims_answered, 1u);
    EXPECT_EQ(after.entries[0].bytes_trimmed, 38 * MiB);
    EXPECT_LE(after.peak_reserved_bytes, kCapacity);
  });
}

TEST(LedgerCooperativeTrim, WithoutTrimBFailsAndTheReportNamesA) {
  // A caches the same 60% but never answers: the state of plain growth pools.
  run_trim_scenario(false, true, [](const Status& b, const LedgerSnapshot& after, int a_pid) {
    ASSERT_FALSE(b);
    const std::string& message = b.error().message();
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("pid " + std::to_string(a_pid)), std::string::npos) << message;
    EXPECT_NE(message.find("reserves 38.0 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("no other process answers"), std::string::npos) << message;
    EXPECT_EQ(after.entries[0].reserved_bytes, 38 * MiB);
  });
}

TEST(LedgerCooperativeTrim, ARequesterWithTrimOffDoesNotAsk) {
  run_trim_scenario(true, false, [](const Status& b, const LedgerSnapshot& after, int) {
    ASSERT_FALSE(b);
    EXPECT_NE(b.error().message().find("cooperative trim is off"), std::string::npos) << b.error().message();
    EXPECT_EQ(after.entries[0].trims_answered, 0u);
  });
}

}  // namespace
}  // namespace tidepool::test
