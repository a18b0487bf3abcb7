// `tidepool replay` and `tidepool compare`, run as the built command: the
// table and JSON for a real PyTorch snapshot under every mode, the figures the
// modes must agree on, the reports, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/run_cli.hpp"

namespace tidepool::test {
namespace {

#ifdef TIDEPOOL_CLI

using nlohmann::json;

const std::string kBcrafton = std::string(TIDEPOOL_TEST_DATA) + "/pytorch/cs336-bcrafton.pickle";

std::string temp_path(const std::string& name) {
  return std::string("/tmp/tidepool-replay-cli-") + std::to_string(::getpid()) + "-" + name;
}

json read_json(const std::string& path) {
  json parsed = json::parse(read_file(path), nullptr, false);
  std::remove(path.c_str());
  return parsed;
}

const json* mode_row(const json& trace, const std::string& mode) {
  for (const json& row : trace["modes"]) {
    if (row["mode"] == mode) return &row;
  }
  return nullptr;
}

TEST(ReplayCommand, EveryModeOnARealSnapshot) {
  const std::string json_path = temp_path("all.json");
  CliResult result = run_cli({"replay", "--json", json_path, kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  for (const char* row : {"preallocate", "growth", "platform", "expandable", "PyTorch (recorded)"}) {
    EXPECT_TRUE(contains(result.out, std::string("\n") + row)) << row << "\n" << result.out;
  }
  EXPECT_TRUE(contains(result.out, "4103 events, 2162 blocks, 222 unmatched frees skipped")) << result.out;

  const json report = read_json(json_path);
  ASSERT_FALSE(report.is_discarded());
  ASSERT_EQ(report["traces"].size(), 1u);
  const json& trace = report["traces"][0];
  EXPECT_EQ(trace["events"], 4103);
  EXPECT_EQ(trace["blocks"], 2162);
  EXPECT_EQ(trace["unmatched_frees"], 222);
  ASSERT_EQ(trace["modes"].size(), 4u);
  const std::uint64_t peak_live = trace["modes"][0]["peak_live_bytes"];
  for (const json& row : trace["modes"]) {
    EXPECT_EQ(row["peak_live_bytes"], peak_live) << row["mode"];  // the same trace under each
    EXPECT_EQ(row["ooms"], 0) << row["mode"];
    EXPECT_GT(row["events_per_second"].get<double>(), 0.0) << row["mode"];
  }

  // preallocate holds fraction x capacity from the first event.
  const json* preallocate = mode_row(trace, "preallocate");
  ASSERT_NE(preallocate, nullptr);
  const double capacity = (*preallocate)["capacity_bytes"].get<double>();
  EXPECT_EQ((*preallocate)["initial_reserved_bytes"].get<double>(), 0.75 * capacity);
  // platform takes what is live; expandable stays within 3% of it, by stitching.
  const json* platform = mode_row(trace, "platform");
  const json* expandable = mode_row(trace, "expandable");
  ASSERT_NE(platform, nullptr);
  ASSERT_NE(expandable, nullptr);
  const double platform_peak = (*platform)["peak_reserved_bytes"].get<double>();
  EXPECT_LE(platform_peak, 1.01 * static_cast<double>((*platform)["peak_live_rounded_bytes"].get<double>()));
  EXPECT_LE((*expandable)["peak_reserved_bytes"].get<double>(), 1.03 * static_cast<double>(peak_live));
  EXPECT_GT((*expandable)["stats"]["num_maps"].get<double>(), 0.0);
  // PyTorch's own reservations, from the snapshot's segment events.
  ASSERT_TRUE(trace["recorded"].is_object()) << trace["recorded"];
  EXPECT_GT(trace["recorded"]["peak_reserved_bytes"].get<double>(), static_cast<double>(peak_live));
}

TEST(ReplayCommand, ModesAndReports) {
  const std::string perfetto = temp_path("trace.json");
  const std::string html = temp_path("report.html");
  CliResult result = run_cli({"replay", "-q", "--modes", "growth,expandable", "--perfetto", perfetto, "--html",
                              html, kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;  // -q: no table

  const json events = read_json(perfetto);
  ASSERT_TRUE(events.contains("traceEvents")) << "not Chrome trace-event JSON";
  std::size_t counters = 0;
  for (const json& event : events["traceEvents"]) counters += event.value("ph", "") == "C";
  EXPECT_GT(counters, 10u);

  const std::string page = read_file(html);
  std::remove(html.c_str());
  EXPECT_TRUE(contains(page, "<html")) << page.substr(0, 200);
  EXPECT_TRUE(contains(page, "expandable"));
  EXPECT_FALSE(contains(page, "<script src=")) << "the page must be self-contained";
}

TEST(ReplayCommand, CompareReplaysTheBuiltInWorkloads) {
  const std::string json_path = temp_path("compare.json");
  CliResult result = run_cli({"compare", "-q", "--json", json_path});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const json report = read_json(json_path);
  std::vector<std::string> names;
  for (const json& trace : report["traces"]) names.push_back(trace["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"train-step", "llm-inference", "small-tensors",
                                             "multi-stream-inference", "near-capacity", "random-mixed"}));
  for (const json& trace : report["traces"]) {
    const json* growth = mode_row(trace, "growth");
    const json* expandable = mode_row(trace, "expandable");
    ASSERT_NE(growth, nullptr);
    ASSERT_NE(expandable, nullptr);
    // The point of the expandable pool, on every built-in workload.
    EXPECT_LT((*expandable)["peak_reserved_bytes"].get<double>(), (*growth)["peak_reserved_bytes"].get<double>())
        << trace["name"];
  }
}

TEST(ReplayCommand, PassesShowTheWarmPool) {
  const std::string json_path = temp_path("passes.json");
  CliResult result =
      run_cli({"compare", "--passes", "2", "--modes", "growth,expandable", "--workloads", "train-step", "--json", json_path});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "2 passes, device calls and ns/op of the last")) << result.out;
  EXPECT_TRUE(contains(result.out, "syncs")) << result.out;
  const json report = read_json(json_path);
  const json& trace = report["traces"][0];
  for (const char* mode : {"growth", "expandable"}) {
    const json* row = mode_row(trace, mode);
    ASSERT_NE(row, nullptr);
    ASSERT_EQ((*row)["passes"].size(), 2u) << mode;
    const json& first = (*row)["passes"][0];
    const json& warm = (*row)["passes"][1];
    for (const char* field : {"device_calls", "ns_per_op", "peak_reserved_bytes", "ooms"}) {
      EXPECT_TRUE(warm.contains(field)) << field;
    }
    EXPECT_GT(first["device_calls"]["total"].get<std::uint64_t>(), 0u) << mode;
    EXPECT_EQ(warm["device_calls"]["total"].get<std::uint64_t>(), 0u) << mode;  // train-step repeats: warm is quiet
    EXPECT_EQ((*row)["events"].get<std::uint64_t>(), 2 * trace["events"].get<std::uint64_t>()) << mode;
  }

  CliResult zero = run_cli({"compare", "--passes", "0", "--workloads", "train-step"});
  EXPECT_NE(zero.exit_status, 0);
  EXPECT_TRUE(contains(zero.err, "--passes")) << zero.err;
}

TEST(ReplayCommand, StatsSideBySideUnderJaxNames) {
  CliResult result = run_cli({"replay", "--stats", "--modes", "growth,expandable", kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "each pool's stats after the last event")) << result.out;
  EXPECT_TRUE(contains(result.out, "stat                           growth   expandable")) << result.out;
  for (const char* name : {"\nbytes_in_use ", "\npeak_bytes_in_use ", "\nlargest_free_block_bytes ",
                           "\nnum_stitches ", "\nnum_releases "}) {
    EXPECT_TRUE(contains(result.out, name)) << name << "\n" << result.out;
  }
}

TEST(ReplayCommand, BadInputIsAClearErrorAndExitStatusOne) {
  CliResult missing = run_cli({"replay", "/nonexistent/trace.pickle"});
  EXPECT_EQ(missing.exit_status, 1);
  EXPECT_TRUE(contains(missing.err, "cannot open trace /nonexistent/trace.pickle")) << missing.err;

  const std::string junk = temp_path("junk.bin");
  {
    std::ofstream out(junk, std::ios::binary);
    out << "\x80\x04 definitely not a snapshot";
  }
  CliResult corrupt = run_cli({"replay", junk});
  std::remove(junk.c_str());
  EXPECT_EQ(corrupt.exit_status, 1);
  EXPECT_TRUE(contains(corrupt.err, "tidepool: error:")) << corrupt.err;
  EXPECT_TRUE(contains(corrupt.err, "junk.bin")) << corrupt.err;

  CliResult bad_mode = run_cli({"replay", "--modes", "bogus", kBcrafton});
  EXPECT_EQ(bad_mode.exit_status, 1);
  EXPECT_TRUE(contains(bad_mode.err, "unknown mode 'bogus'; allowed: preallocate")) << bad_mode.err;

  CliResult bad_capacity = run_cli({"replay", "--capacity", "lots", kBcrafton});
  EXPECT_NE(bad_capacity.exit_status, 0);
  EXPECT_TRUE(contains(bad_capacity.err, "lots")) << bad_capacity.err;
}

#else
TEST(ReplayCommand, NotBuilt) { GTEST_SKIP() << "the tidepool command is not part of this build"; }
#endif

}  // namespace
}  // namespace tidepool::test
