// `tidepool ledger`, run as the built command against a ledger this test
// makes: this process registered with a quota, and a child killed with
// SIGKILL whose entry is left dead; the text, the JSON, --reclaim, and a
// missing ledger.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "share/ledger_test_support.hpp"
#include "tools/run_cli.hpp"

namespace tidepool::test {
namespace {

#ifdef TIDEPOOL_CLI

using Result = CliResult;

/// The line of `text` that starts (after padding) with `pid`.
std::string row_of(const std::string& text, int pid) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string first;
    words >> first;
    if (first == std::to_string(pid)) return line;
  }
  return {};
}

constexpr std::size_t kCapacity = 64 * MiB;

// A device of its own name, so that its ledger (named from the device id, as
// in production) is this test's alone; the segment is unlinked at the end.
struct CliLedger {
  CliLedger() {
    static int counter = 0;
    device_name = "cli-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    device_id = "host:" + device_name;
    segment = ledger_segment_name(device_id);
    shm_unlink(segment.c_str());
  }
  ~CliLedger() { shm_unlink(segment.c_str()); }
  CliLedger(const CliLedger&) = delete;
  CliLedger& operator=(const CliLedger&) = delete;

  std::shared_ptr<LedgerDevice> join(std::size_t quota) const {
    LedgerOptions options;
    options.quota_bytes = quota;  // the segment name comes from the device id
    return LedgerDevice::create(make_host(kCapacity, device_name), options).value();
  }

  std::string device_name;
  std::string device_id;
  std::string segment;
};

// This process holds 4 MiB under a 16 MiB quota and reports 1 MiB cached
// and 3 MiB asleep;
// a child held 8 MiB and was killed with SIGKILL.
class LedgerCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    self_ = ledger_.join(16 * MiB);
    handle_ = self_->create(4 * MiB).value();
    Pipe ready;
    child_ = std::make_unique<Child>([&] {
      auto device = ledger_.join(0);
      if (!device->create(8 * MiB)) return 2;
      ready.write_line("holding");
      for (;;) pause();
    });
    ASSERT_EQ(ready.read_line(10s), "holding");
    child_->kill9();
    // Set after the fork: the report runs on the ledger's background thread.
    self_->account().set_trim_hooks(TrimHooks{{}, [] { return std::size_t{1} * MiB; }, [] { return std::size_t{3} * MiB; }});
  }
  void TearDown() override {
    if (self_) {
      self_->account().clear_trim_hooks();
      (void)self_->release(handle_, 4 * MiB);
    }
  }

  CliLedger ledger_;
  std::shared_ptr<LedgerDevice> self_;
  PhysicalHandle handle_ = 0;
  std::unique_ptr<Child> child_;
};

TEST_F(LedgerCommand, TextShowsEachProcessTheDeadOneAndTheTotals) {
  Result result = run_cli({"ledger", "--device", ledger_.device_id});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_TRUE(contains(out, "ledger " + ledger_.segment + " for device " + ledger_.device_id)) << out;
  EXPECT_TRUE(contains(out, "limit " + format_bytes(kCapacity))) << out;
  EXPECT_TRUE(contains(out, "reserved " + format_bytes(12 * MiB))) << out;
  // Committed: our quota (16 MiB); the dead child counts for nothing.
  EXPECT_TRUE(contains(out, "committed " + format_bytes(16 * MiB))) << out;

  const std::string mine = row_of(out, getpid());
  ASSERT_FALSE(mine.empty()) << out;
  EXPECT_TRUE(contains(mine, " yes ")) << mine;
  EXPECT_TRUE(contains(mine, format_bytes(4 * MiB))) << mine;
  EXPECT_TRUE(contains(mine, format_bytes(1 * MiB))) << mine;   // cached-free
  EXPECT_TRUE(contains(mine, format_bytes(16 * MiB))) << mine;  // quota
  EXPECT_TRUE(contains(mine, format_bytes(3 * MiB))) << mine;   // asleep
  EXPECT_TRUE(contains(out, "ASLEEP") && contains(out, "WAKE-WAITS")) << out;

  const std::string dead = row_of(out, child_->pid());
  ASSERT_FALSE(dead.empty()) << out;
  EXPECT_TRUE(contains(dead, "DEAD")) << dead;
  EXPECT_TRUE(contains(dead, format_bytes(8 * MiB))) << dead;
  EXPECT_TRUE(contains(dead, " - ")) << dead;  // its cached-free is unknown
  EXPECT_TRUE(contains(dead, "none")) << dead;  // no quota

  EXPECT_TRUE(contains(out, "1/2")) << out;  // alive/processes in the totals row
  EXPECT_TRUE(contains(out, "1 dead entry")) << out;
  EXPECT_TRUE(contains(out, "--reclaim")) << out;
}

TEST_F(LedgerCommand, JsonHasTheSameFacts) {
  Result result = run_cli({"ledger", "--device", ledger_.device_id, "--json"});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  auto report = nlohmann::json::parse(result.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << result.out;
  EXPECT_EQ(report["segment"], ledger_.segment);
  EXPECT_EQ(report["device_id"], ledger_.device_id);
  EXPECT_EQ(report["limit_bytes"], kCapacity);
  EXPECT_EQ(report["reserved_bytes"], 12 * MiB);
  EXPECT_EQ(report["committed_bytes"], 16 * MiB);
  EXPECT_FALSE(report.contains("reclaimed_now"));
  ASSERT_EQ(report["processes"].size(), 2u);
  for (const auto& process : report["processes"]) {
    if (process["pid"] == getpid()) {
      EXPECT_EQ(process["alive"], true);
      EXPECT_EQ(process["reserved_bytes"], 4 * MiB);
      EXPECT_EQ(process["quota_bytes"], 16 * MiB);
      EXPECT_EQ(process["cached_free_bytes"], 1 * MiB);
      EXPECT_EQ(process["answers_trim"], false);
      EXPECT_EQ(process["asleep_bytes"], 3 * MiB);
      EXPECT_EQ(process["wake_waits"], 0u);
    } else {
      EXPECT_EQ(process["pid"], child_->pid());
      EXPECT_EQ(process["alive"], false);
      EXPECT_EQ(process["reserved_bytes"], 8 * MiB);
      EXPECT_EQ(process["quota_bytes"], 0u);
      EXPECT_TRUE(process["cached_free_bytes"].is_null());
    }
  }
  EXPECT_EQ(report["totals"]["processes"], 2u);
  EXPECT_EQ(report["totals"]["alive"], 1u);
  EXPECT_EQ(report["totals"]["reserved_bytes"], 12 * MiB);
  EXPECT_EQ(report["totals"]["asleep_bytes"], 3 * MiB);
}

TEST_F(LedgerCommand, ReclaimClearsTheDeadEntryAndSaysHowMany) {
  Result first = run_cli({"ledger", "--device", ledger_.segment, "--reclaim"});
  ASSERT_EQ(first.exit_status, 0) << first.err;
  EXPECT_TRUE(contains(first.out, "reclaimed 1 dead entry")) << first.out;
  EXPECT_TRUE(row_of(first.out, child_->pid()).empty()) << first.out;
  EXPECT_FALSE(row_of(first.out, getpid()).empty()) << first.out;
  EXPECT_TRUE(contains(first.out, "reserved " + format_bytes(4 * MiB))) << first.out;

  Result again = run_cli({"ledger", "--device", ledger_.segment, "--reclaim", "--json"});
  ASSERT_EQ(again.exit_status, 0) << again.err;
  auto report = nlohmann::json::parse(again.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << again.out;
  EXPECT_EQ(report["reclaimed_now"], 0u);
  EXPECT_EQ(report["reclaimed_entries"], 1u);  // the segment's count since it was made
  ASSERT_EQ(report["processes"].size(), 1u);
  EXPECT_EQ(report["processes"][0]["pid"], getpid());
}

// As nvidia-smi with no processes: no ledger is an answer (exit 0), not an error.
TEST_F(LedgerCommand, TheConfiguredNameIsReadAndReadingNeverRegisters) {
  // TIDEPOOL_LEDGER_NAME names the segment the stack joins: the command reads
  // that one. Neither it nor `tidepool info` joins the ledger they look at.
  const std::vector<std::string> env = {"TIDEPOOL_LEDGER=on", "TIDEPOOL_LEDGER_NAME=" + ledger_.segment,
                                        "TIDEPOOL_HOST_CAPACITY=64MiB"};
  Result json_result = run_cli({"ledger", "--json"}, env);
  ASSERT_EQ(json_result.exit_status, 0) << json_result.err;
  const auto report = nlohmann::json::parse(json_result.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << json_result.out;
  EXPECT_EQ(report["segment"], ledger_.segment);
  Result info = run_cli({"info"}, env);
  ASSERT_EQ(info.exit_status, 0) << info.err;
  EXPECT_TRUE(contains(info.out, "on (segment " + ledger_.segment + ")")) << info.out;
  // Only this process (and the dead child) ever registered.
  auto ledger = Ledger::open_existing(ledger_.segment).value();
  const LedgerSnapshot snapshot = ledger->snapshot().value();
  for (const LedgerEntryInfo& entry : snapshot.entries) {
    EXPECT_TRUE(entry.pid == getpid() || entry.pid == child_->pid()) << "pid " << entry.pid << " registered";
  }
  // A name no process uses: nothing is created by looking.
  const std::string unused = "/tidepool-test-unused-" + std::to_string(getpid());
  shm_unlink(unused.c_str());
  const std::vector<std::string> unused_env = {"TIDEPOOL_LEDGER=on", "TIDEPOOL_LEDGER_NAME=" + unused};
  Result missing = run_cli({"ledger"}, unused_env);
  EXPECT_EQ(missing.exit_status, 0) << missing.err;
  EXPECT_TRUE(contains(missing.out, "segment " + unused + " does not exist")) << missing.out;
  EXPECT_EQ(run_cli({"info"}, unused_env).exit_status, 0);
  EXPECT_FALSE(Ledger::open_existing(unused)) << "tidepool info created " << unused;
  shm_unlink(unused.c_str());
}

TEST(LedgerCommandMissing, AMissingLedgerSaysNoProcessUsesOne) {
  const std::string segment = "/tidepool-test-missing-" + std::to_string(getpid());
  shm_unlink(segment.c_str());
  Result text = run_cli({"ledger", "--device", segment});
  EXPECT_EQ(text.exit_status, 0) << text.err;
  EXPECT_TRUE(text.err.empty()) << text.err;
  EXPECT_TRUE(contains(text.out, "No process uses a ledger for this device (segment " + segment + " does not exist)"))
      << text.out;
  Result json_result = run_cli({"ledger", "--device", segment, "--json"});
  EXPECT_EQ(json_result.exit_status, 0) << json_result.err;
  const auto report = nlohmann::json::parse(json_result.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << json_result.out;
  EXPECT_EQ(report["segment"], segment);
  EXPECT_TRUE(report["processes"].empty());
  // A device id is turned into its segment's name.
  Result by_id = run_cli({"ledger", "--device", "host:missing-" + std::to_string(getpid())});
  EXPECT_EQ(by_id.exit_status, 0) << by_id.err;
  EXPECT_TRUE(contains(by_id.out, "/tidepool-u" + std::to_string(geteuid()) + "-host_missing-" + std::to_string(getpid())))
      << by_id.out;
}

#else

TEST(LedgerCommand, NotBuilt) { GTEST_SKIP() << "the tidepool command is not part of this build"; }

#endif

}  // namespace
}  // namespace tidepool::test
