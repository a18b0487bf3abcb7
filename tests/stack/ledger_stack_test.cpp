// The ledger in the stack: make_ledger_device with the quota, preallocation
// of the quota's fraction, and the pool's trim registered as the answer to
// other stacks' trim requests (two stacks of one process stand for two
// processes here; tests/share has the real multi-process tests).
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "stack/config_vars.hpp"
#include "stack/ledger_stack.hpp"
#include "tidepool/config.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using namespace std::chrono_literals;
using test::Vars;

Config load_ok(const Vars& vars) {
  auto config = test::config_of(vars);
  EXPECT_TRUE(config) << config.error().message();
  return config ? *config : Config{};
}

Expected<Config> load(const Vars& vars) { return test::config_of(vars); }

// A host device with a name no other test uses, so its ledger segment is its
// own; the segment is unlinked at the end.
class UniqueHost {
 public:
  explicit UniqueHost(std::size_t capacity) {
    static std::atomic<int> counter{0};
    name_ = "cfg-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    segment_ = ledger_segment_name("host:" + name_);
    shm_unlink(segment_.c_str());
    capacity_ = capacity;
  }
  ~UniqueHost() { shm_unlink(segment_.c_str()); }
  UniqueHost(const UniqueHost&) = delete;
  UniqueHost& operator=(const UniqueHost&) = delete;

  /// A new HostDevice with this name: another "process's" view of the device.
  std::shared_ptr<Device> device() const {
    HostDeviceOptions options;
    options.capacity = capacity_;
    options.granularity = 1 * MiB;
    options.name = name_;
    return HostDevice::create(options).value();
  }
  const std::string& segment() const { return segment_; }
  LedgerSnapshot snapshot() const { return Ledger::open_existing(segment_).value()->snapshot().value(); }

 private:
  std::string name_;
  std::string segment_;
  std::size_t capacity_ = 0;
};

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// --- the variables -----------------------------------------------------------

TEST(LedgerVariables, AQuotaTurnsTheLedgerOn) {
  Config config = load_ok({{"TIDEPOOL_QUOTA", "25%"}});
  EXPECT_TRUE(config.ledger.value);
  EXPECT_EQ(config.ledger.name, "TIDEPOOL_QUOTA");
  ASSERT_FALSE(config.notes.empty());
  EXPECT_NE(config.notes.back().find("turns the cross-process ledger on"), std::string::npos);
  EXPECT_TRUE(load_ok({{"TIDEPOOL_QUOTA", "25%"}, {"TIDEPOOL_LEDGER", "on"}}).ledger.value);
}

TEST(LedgerVariables, AQuotaWithTheLedgerOffIsAContradiction) {
  auto config = load({{"TIDEPOOL_QUOTA", "25%"}, {"TIDEPOOL_LEDGER", "off"}});
  ASSERT_FALSE(config);
  EXPECT_EQ(config.error().code(), Errc::invalid_argument);
  EXPECT_NE(config.error().message().find("TIDEPOOL_QUOTA='25%' contradicts TIDEPOOL_LEDGER='off'"),
            std::string::npos)
      << config.error().message();
}

TEST(LedgerVariables, Mode) {
  EXPECT_EQ(load_ok({}).ledger_mode.value, 0600u);
  EXPECT_EQ(load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_LEDGER_MODE", "group"}}).ledger_mode.value, 0660u);
  EXPECT_EQ(load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_LEDGER_MODE", "0660"}}).ledger_mode.value, 0660u);
  EXPECT_EQ(load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_LEDGER_MODE", "User"}}).ledger_mode.value, 0600u);
  Config off = load_ok({{"TIDEPOOL_LEDGER_MODE", "group"}});
  ASSERT_FALSE(off.notes.empty());
  EXPECT_NE(off.notes.back().find("no effect while the ledger is off"), std::string::npos);
  for (const char* bad : {"0777", "world", ""}) {
    auto config = load({{"TIDEPOOL_LEDGER_MODE", bad}});
    ASSERT_FALSE(config) << bad;
    EXPECT_NE(config.error().message().find("TIDEPOOL_LEDGER_MODE='" + std::string(bad) + "'"), std::string::npos);
    EXPECT_NE(config.error().message().find("user (0600"), std::string::npos);
  }
}

// --- which ledger: resolve_ledger ----------------------------------------------

TEST(ResolveLedger, TheDevicesOwnSegmentAndTheQuotaOfItsTotal) {
  const LedgerDeviceFacts device{"host:resolve-test", 64 * MiB, 0};
  Config config = load_ok({{"TIDEPOOL_QUOTA", "25%"}, {"TIDEPOOL_WAKE_WAIT", "3s"}});
  auto options = resolve_ledger(config, device);
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->segment_name, ledger_segment_name("host:resolve-test"));
  EXPECT_EQ(options->mode, 0600u);
  EXPECT_EQ(options->quota_bytes, 16 * MiB);
  EXPECT_EQ(options->wake_wait, 3s);
  Config group = load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_LEDGER_MODE", "group"}});
  auto grouped = resolve_ledger(group, device);
  ASSERT_TRUE(grouped) << grouped.error().message();
  EXPECT_EQ(grouped->segment_name, ledger_segment_name("host:resolve-test", 0660));
  EXPECT_EQ(grouped->mode, 0660u);
  EXPECT_EQ(grouped->quota_bytes, 0u);
}

TEST(ResolveLedger, AConfiguredNameIsKeptAndNumberedPastTheFirstDevice) {
  Config config = load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_LEDGER_NAME", "/resolve-test"}});
  EXPECT_EQ(resolve_ledger(config, {"host:a", 64 * MiB, 0}).value().segment_name, "/resolve-test");
  EXPECT_EQ(resolve_ledger(config, {"host:b", 64 * MiB, 2}).value().segment_name, "/resolve-test-2");
}

TEST(ResolveLedger, AQuotaOfNoBytesNamesItsVariable) {
  Config config = load_ok({{"TIDEPOOL_QUOTA", "0.0000000001"}});
  auto options = resolve_ledger(config, {"host:resolve-test", 64 * MiB, 0});
  ASSERT_FALSE(options);
  EXPECT_EQ(options.error().code(), Errc::invalid_argument);
  EXPECT_NE(options.error().message().find("TIDEPOOL_QUOTA='0.0000000001' is 0 bytes of the 64.0 MiB device"),
            std::string::npos)
      << options.error().message();
}

TEST(ResolveLedger, ResolvingForTheConfiguredDeviceRegistersNothing) {
  const std::string segment = "/tidepool-resolve-test-" + std::to_string(getpid());
  shm_unlink(segment.c_str());
  // With a quota the device is built (bare) to resolve it against its total.
  Config config = load_ok({{"TIDEPOOL_DEVICE", "host"}, {"TIDEPOOL_HOST_CAPACITY", "64MiB"},
                           {"TIDEPOOL_QUOTA", "50%"}, {"TIDEPOOL_LEDGER_NAME", segment}});
  auto options = resolve_ledger(config);
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->segment_name, segment);
  EXPECT_EQ(options->quota_bytes, 32 * MiB);
  EXPECT_FALSE(Ledger::open_existing(segment)) << "resolving created " << segment;
  // Without a name, the device's own segment; the device is built without the ledger.
  Config unnamed = load_ok({{"TIDEPOOL_DEVICE", "host"}, {"TIDEPOOL_HOST_CAPACITY", "64MiB"},
                            {"TIDEPOOL_LEDGER", "on"}});
  Config bare = unnamed;
  bare.ledger.value = false;
  const std::string own = ledger_segment_name(make_device(bare).value()->id());
  const bool existed = static_cast<bool>(Ledger::open_existing(own));
  EXPECT_EQ(resolve_ledger(unnamed).value().segment_name, own);
  auto after = Ledger::open_existing(own);
  EXPECT_EQ(static_cast<bool>(after), existed) << "resolving created " << own;
  if (!after) return;
  const LedgerSnapshot snapshot = after.value()->snapshot().value();
  for (const LedgerEntryInfo& entry : snapshot.entries)
    EXPECT_NE(entry.pid, getpid()) << "resolving registered this process in " << own;
}

// --- the device --------------------------------------------------------------

TEST(LedgerStack, TheQuotaIsResolvedAgainstTheDeviceAndIsTheTotalThePoolSees) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_QUOTA", "0.25"}});
  auto device = make_ledger_device(config, host.device());
  ASSERT_TRUE(device) << device.error().message();
  EXPECT_EQ((*device)->mem_info().total_bytes, 16 * MiB);
  LedgerSnapshot snapshot = host.snapshot();
  ASSERT_EQ(snapshot.entries.size(), 1u);
  EXPECT_EQ(snapshot.entries[0].pid, getpid());
  EXPECT_EQ(snapshot.entries[0].quota_bytes, 16 * MiB);
  EXPECT_EQ(snapshot.limit_bytes, 64 * MiB);
}

TEST(LedgerStack, PreallocationTakesTheFractionOfTheQuota) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_QUOTA", "16MiB"}, {"TIDEPOOL_ALLOCATOR", "preallocate"}});
  auto device = make_ledger_device(config, host.device());
  ASSERT_TRUE(device) << device.error().message();
  auto pool = make_allocator(config, *device);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->name(), "preallocate");
  EXPECT_EQ((*pool)->stats().bytes_reserved, static_cast<std::int64_t>(12 * MiB));  // 0.75 x 16 MiB
  LedgerSnapshot snapshot = host.snapshot();
  ASSERT_EQ(snapshot.entries.size(), 1u);
  EXPECT_EQ(snapshot.entries[0].reserved_bytes, 12 * MiB);
  EXPECT_FALSE(snapshot.entries[0].answers_trim);  // a preallocated pool never gives back
  EXPECT_EQ(snapshot.entries[0].cached_free_bytes, 12 * MiB);  // all of it cached, none in use
}

TEST(LedgerStack, AQuotaThatDoesNotFitIsRefusedNamingTheHolders) {
  UniqueHost host(64 * MiB);
  Config half = load_ok({{"TIDEPOOL_QUOTA", "50%"}});
  auto first = make_ledger_device(half, host.device());
  ASSERT_TRUE(first) << first.error().message();
  Config most = load_ok({{"TIDEPOOL_QUOTA", "0.75"}});
  auto second = make_ledger_device(most, host.device());
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Errc::out_of_memory);
  EXPECT_NE(second.error().message().find("pid " + std::to_string(getpid())), std::string::npos)
      << second.error().message();
  EXPECT_NE(second.error().message().find("lower TIDEPOOL_QUOTA"), std::string::npos) << second.error().message();

  // From a config string, the advice names its key.
  auto keyed = Config::from_keys({{"quota", "0.75"}});
  ASSERT_TRUE(keyed) << keyed.error().message();
  auto refused = make_ledger_device(*keyed, host.device());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), Errc::out_of_memory);
  EXPECT_NE(refused.error().message().find("lower quota, or wait"), std::string::npos) << refused.error().message();
  EXPECT_EQ(refused.error().message().find("TIDEPOOL_"), std::string::npos) << refused.error().message();
}

TEST(LedgerStack, AQuotaAboveTheLimitNamesTheVariable) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_QUOTA", "1GiB"}});
  auto device = make_ledger_device(config, host.device());
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::invalid_argument);
  EXPECT_EQ(device.error().message().rfind("TIDEPOOL_QUOTA='1GiB' (", 0), 0u) << device.error().message();
  EXPECT_NE(device.error().message().find("above the shared limit"), std::string::npos) << device.error().message();
}

// --- cooperative trim through the stack -------------------------------------

TEST(LedgerStack, AGrowthPoolAnswersTrimRequestsAndUnregistersWhenDestroyed) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_LEDGER", "on"}, {"TIDEPOOL_ALLOCATOR", "growth"},
                           {"TIDEPOOL_MEM_FRACTION", "1"}});
  auto device_a = make_ledger_device(config, host.device()).value();
  auto pool_a = make_allocator(config, device_a).value();
  EXPECT_EQ(pool_a->name(), "growth");
  // A takes 40 MiB, frees it: cached in its pool, idle.
  void* a = pool_a->allocate(40 * MiB).value();
  ASSERT_TRUE(pool_a->deallocate(a));
  const auto a_reserved = static_cast<std::size_t>(pool_a->stats().bytes_reserved);
  ASSERT_GE(a_reserved, 40 * MiB);
  // The ledger learns of A's cache from the background thread.
  ASSERT_TRUE(wait_until([&] { return host.snapshot().entries.at(0).cached_free_bytes == a_reserved; }, 5s));
  EXPECT_TRUE(host.snapshot().entries.at(0).answers_trim);

  // B asks for 40 MiB: only A's cache can give it.
  auto device_b = make_ledger_device(config, host.device()).value();
  auto pool_b = make_allocator(config, device_b).value();
  auto b = pool_b->allocate(40 * MiB);
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(pool_a->stats().bytes_reserved, 0);
  // B proceeds once the room is there, which may be before A's thread counts its answer.
  EXPECT_TRUE(wait_until([&] { return host.snapshot().entries.at(0).trims_answered != 0; }, 10s));
  LedgerSnapshot snapshot = host.snapshot();
  ASSERT_EQ(snapshot.entries.size(), 2u);
  EXPECT_EQ(snapshot.entries[0].trims_answered, 1u);
  EXPECT_EQ(snapshot.entries[0].bytes_trimmed, a_reserved);
  EXPECT_GE(snapshot.entries[1].trim_requests, 1u);
  EXPECT_LE(snapshot.peak_reserved_bytes, 64 * MiB);
  ASSERT_TRUE(pool_b->deallocate(*b));

  // Destroying A's pool unregisters it before the pool goes; A's device
  // (still held here) no longer answers.
  pool_a.reset();
  EXPECT_FALSE(host.snapshot().entries.at(0).answers_trim);
}

// The driver's stream-ordered pool allocates around the ledger: the stack
// refuses the combination, naming the variables, rather than let it bypass
// the quota (any build: the ledger is checked before the CUDA device).
TEST(LedgerStack, TheCudaAsyncPoolIsRefusedOverTheLedger) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_QUOTA", "0.5"}});
  auto device = make_ledger_device(config, host.device());
  ASSERT_TRUE(device) << device.error().message();
  Status supported = mode_supported(Mode::cuda_async, **device);
  ASSERT_FALSE(supported);
  EXPECT_EQ(supported.error().code(), Errc::unsupported);
  EXPECT_NE(supported.error().message().find("mode cuda_async is not available: the driver's pool allocates "
                                             "around the cross-process ledger (TIDEPOOL_LEDGER or TIDEPOOL_QUOTA"),
            std::string::npos)
      << supported.error().message();
  auto pool = make_allocator(Mode::cuda_async, config, *device);
  ASSERT_FALSE(pool);
  EXPECT_NE(pool.error().message().find("tidepool run --quota"), std::string::npos) << pool.error().message();

  // From a config string, the reason names its keys.
  auto keyed = Config::from_keys({{"mode", "cuda_async"}, {"quota", "0.5"}});
  ASSERT_TRUE(keyed) << keyed.error().message();
  auto keyed_device = make_ledger_device(*keyed, host.device());
  ASSERT_TRUE(keyed_device) << keyed_device.error().message();
  auto refused = make_allocator(Mode::cuda_async, *keyed, *keyed_device);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("(ledger or quota is set)"), std::string::npos)
      << refused.error().message();
  EXPECT_EQ(refused.error().message().find("TIDEPOOL_"), std::string::npos) << refused.error().message();
}

TEST(LedgerStack, WithoutTheLedgerNoDecoratorAndNoWrapper) {
  UniqueHost host(64 * MiB);
  Config config = load_ok({{"TIDEPOOL_ALLOCATOR", "growth"}});
  auto pool = make_allocator(config, host.device()).value();
  EXPECT_EQ(pool->name(), "growth");
  // The pool's device is the host device limited to the fraction: no ledger under it.
  auto* limit = dynamic_cast<LimitDevice*>(&pool->device());
  ASSERT_NE(limit, nullptr);
  EXPECT_NE(dynamic_cast<HostDevice*>(&limit->upstream()), nullptr);
  EXPECT_EQ(find_ledger_device(pool->device()), nullptr);
  EXPECT_EQ(Ledger::open_existing(host.segment()).error().code(), Errc::io_error);
}

}  // namespace
}  // namespace tidepool
