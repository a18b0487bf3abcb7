// `tidepool exporter`, run as the built command against a ledger this test
// makes: --once's exposition (every family, the labels, the values of the
// ledger), `promtool check metrics` on it where Debian's prometheus package is
// installed, that it never registers, a segment that goes away or is not a
// ledger, and bad --listen values. tests/tools/exporter_prometheus.py scrapes
// it with a real Prometheus server.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "share/ledger_test_support.hpp"
#include "tools/run_cli.hpp"

namespace tidepool::test {
namespace {

#if defined(TIDEPOOL_CLI) && defined(TIDEPOOL_HAVE_EXPORTER)

constexpr std::size_t kCapacity = 64 * MiB;

/// The value of the sample line `name{labels...}` whose labels include every
/// one of `labels`; -1 when there is none.
double sample(const std::string& text, const std::string& name, const std::vector<std::string>& labels) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(name + "{") && !line.starts_with(name + " ")) continue;
    bool all = true;
    for (const std::string& label : labels) all &= line.find(label) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

struct ExporterLedger : ::testing::Test {
  void SetUp() override {
    device_name = "exporter-test-" + std::to_string(getpid());
    segment = ledger_segment_name("host:" + device_name);
    shm_unlink(segment.c_str());
    LedgerOptions options;
    options.quota_bytes = 16 * MiB;
    self = LedgerDevice::create(make_host(kCapacity, device_name), options).value();
    handle = self->create(4 * MiB).value();
  }
  void TearDown() override {
    if (self) (void)self->release(handle, 4 * MiB);
    self.reset();
    shm_unlink(segment.c_str());
  }

  std::string device_name;
  std::string segment;
  std::shared_ptr<LedgerDevice> self;
  PhysicalHandle handle = 0;
};

TEST_F(ExporterLedger, OncePrintsTheLedgerAndEachProcess) {
  CliResult result = run_cli({"exporter", "--once", "--segment", segment});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const std::string& out = result.out;
  const std::string device = "device=\"host:" + device_name + "\"";
  const std::string pid = "pid=\"" + std::to_string(getpid()) + "\"";
  EXPECT_TRUE(contains(out, "# TYPE tidepool_ledger_reserved_bytes gauge")) << out;
  EXPECT_TRUE(contains(out, "# TYPE tidepool_ledger_reclaimed_entries_total counter")) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_limit_bytes", {device}), static_cast<double>(kCapacity)) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_reserved_bytes", {device}), static_cast<double>(4 * MiB)) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_committed_bytes", {device}), static_cast<double>(16 * MiB)) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_peak_reserved_bytes", {device}), static_cast<double>(4 * MiB)) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_processes", {device}), 1.0) << out;
  EXPECT_EQ(sample(out, "tidepool_ledger_lock_recoveries_total", {device}), 0.0) << out;
  EXPECT_EQ(sample(out, "tidepool_process_reserved_bytes", {device, pid}), static_cast<double>(4 * MiB)) << out;
  EXPECT_EQ(sample(out, "tidepool_process_quota_bytes", {device, pid}), static_cast<double>(16 * MiB)) << out;
  EXPECT_EQ(sample(out, "tidepool_process_alive", {device, pid}), 1.0) << out;
  EXPECT_EQ(sample(out, "tidepool_process_wanted_bytes", {device, pid}), 0.0) << out;
  EXPECT_EQ(sample(out, "tidepool_process_trim_requests_total", {device, pid}), 0.0) << out;
  EXPECT_EQ(sample(out, "tidepool_process_trims_answered_total", {device, pid}), 0.0) << out;
  EXPECT_EQ(sample(out, "tidepool_process_trimmed_bytes_total", {device, pid}), 0.0) << out;
  EXPECT_TRUE(contains(out, "command=\"")) << out;
  EXPECT_EQ(sample(out, "tidepool_exporter_ledgers", {}), 1.0) << out;
  EXPECT_EQ(sample(out, "tidepool_exporter_ledger_errors", {}), 0.0) << out;

  // Read-only: the exporter did not register (one entry, ours).
  auto ledger = Ledger::open_existing(segment).value();
  const LedgerSnapshot snapshot = ledger->snapshot().value();
  ASSERT_EQ(snapshot.entries.size(), 1u);
  EXPECT_EQ(snapshot.entries[0].pid, getpid());
}

TEST_F(ExporterLedger, PromtoolAcceptsTheExposition) {
  if (access("/usr/bin/promtool", X_OK) != 0)
    GTEST_SKIP() << "promtool is not installed (Debian's prometheus package; scripts/install-deps --test)";
  CliResult result = run_cli({"exporter", "--once", "--segment", segment});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  char path_template[] = "/tmp/tidepool-exporter-XXXXXX";
  const int fd = mkstemp(path_template);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, result.out.data(), result.out.size()), static_cast<ssize_t>(result.out.size()));
  close(fd);
  const std::string command = "/usr/bin/promtool check metrics < " + std::string(path_template) + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string report;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) report += buffer;
  const int status = pclose(pipe);
  unlink(path_template);
  EXPECT_EQ(status, 0) << report << "\n" << result.out;
}

TEST_F(ExporterLedger, ASegmentThatIsGoneOrNotALedgerIsCountedAndTheRestServed) {
  const std::string junk = "/tidepool-exporter-test-junk-" + std::to_string(getpid());
  const int fd = shm_open(junk.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  CliResult result = run_cli({"exporter", "--once", "--segment", segment, "--segment", junk, "--segment",
                              "/tidepool-exporter-test-missing"});
  shm_unlink(junk.c_str());
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_EQ(sample(result.out, "tidepool_exporter_ledgers", {}), 1.0) << result.out;
  EXPECT_EQ(sample(result.out, "tidepool_exporter_ledger_errors", {}), 2.0) << result.out;
  EXPECT_TRUE(contains(result.err, junk)) << result.err;
  EXPECT_TRUE(contains(result.err, "tidepool-exporter-test-missing")) << result.err;
}

TEST(ExporterCommand, BadListenIsAClearError) {
  for (const char* listen : {"9400", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:http"}) {
    CliResult result = run_cli({"exporter", "--listen", listen});
    EXPECT_EQ(result.exit_status, 1) << listen;
    EXPECT_TRUE(contains(result.err, "--listen '" + std::string(listen) + "' is invalid")) << result.err;
    EXPECT_TRUE(contains(result.err, "127.0.0.1:9400")) << result.err;
  }
}

#else
TEST(ExporterCommand, NotBuilt) { GTEST_SKIP() << "the tidepool command or prometheus-cpp is not part of this build"; }
#endif

}  // namespace
}  // namespace tidepool::test
