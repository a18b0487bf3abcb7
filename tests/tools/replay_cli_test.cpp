// `tidepool replay` and `tidepool compare`, run as the built command: the
// table and JSON for a real PyTorch snapshot under every mode, the figures the
// modes must agree on, the reports, and clear errors for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tools/run_cli.hpp"
#include "trace/pickle_builder.hpp"

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
  // 222 frees without an alloc and 225 blocks live throughout (the weights) are seeded.
  EXPECT_TRUE(contains(result.out, "4772 events, 2609 blocks (447 live at the start: 2.85 GiB, seeded)"))
      << result.out;

  const json report = read_json(json_path);
  ASSERT_FALSE(report.is_discarded());
  ASSERT_EQ(report["traces"].size(), 1u);
  const json& trace = report["traces"][0];
  EXPECT_EQ(trace["events"], 4772);
  EXPECT_EQ(trace["blocks"], 2609);
  EXPECT_EQ(trace["unmatched_frees"], 222);
  EXPECT_EQ(trace["seeded_blocks"], 447);
  EXPECT_EQ(trace["seeded_bytes"], 3064418304u);
  EXPECT_EQ(trace["peak_live_bytes"], 3849232640u);
  // A plan knowing every lifetime needs 1.006x the peak, in the heading and the JSON.
  EXPECT_EQ(trace["planned_footprint_bytes"], 3872831744u);
  EXPECT_TRUE(contains(result.out, "peak live 3.58 GiB (planned: 3.61 GiB, 1.006x)")) << result.out;
  ASSERT_EQ(trace["modes"].size(), 4u);
  const std::uint64_t peak_live = trace["modes"][0]["peak_live_bytes"];
  EXPECT_EQ(peak_live, 3849232640u);
  for (const json& row : trace["modes"]) {
    EXPECT_EQ(row["peak_live_bytes"], peak_live) << row["mode"];  // the same trace under each
    EXPECT_EQ(row["served_peak_live_bytes"], peak_live) << row["mode"];
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
  // Why: what the peak is made of, where it was allocated, and how PyTorch was set up.
  EXPECT_TRUE(contains(page, "The largest blocks live at the peak (3.58 GiB live")) << "the peak's blocks";
  EXPECT_TRUE(contains(page, "before recording began")) << "seeded blocks are named as such";
  EXPECT_TRUE(contains(page, "cs336_basics/optimizer.py:74 step")) << "Python frames of a block at the peak";
  EXPECT_TRUE(contains(page, "<tr><td>expandable_segments</td><td>False</td></tr>")) << "allocator_settings";
  std::size_t slices = 0;
  for (const json& event : events["traceEvents"]) slices += event.value("ph", "") == "X";
  EXPECT_EQ(slices, 2609u) << "one slice per block lifetime";
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
  // Under the table, each pass of each mode: expandable's first creates and
  // maps its granules, its second makes no call.
  const std::size_t passes_at = result.out.find("train-step: each pass (device calls:");
  ASSERT_NE(passes_at, std::string::npos) << result.out;
  const std::string passes = result.out.substr(passes_at);
  EXPECT_TRUE(std::regex_search(passes, std::regex(R"(\nexpandable +1  c[0-9]+ m[0-9]+)"))) << passes;
  EXPECT_TRUE(std::regex_search(passes, std::regex(R"(\nexpandable +1 [^\n]*\n +2  0  )"))) << passes;
  EXPECT_TRUE(std::regex_search(passes, std::regex(R"(\ngrowth +1  a[0-9]+)"))) << passes;
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

// Other seeds and sizes of the built-in workloads, named apart; a size past
// the bound is refused before anything runs.
TEST(ReplayCommand, CompareTakesTheWorkloadsSeedAndSize) {
  const std::string json_path = temp_path("seeded.json");
  CliResult result = run_cli({"compare", "-q", "--modes", "growth", "--workloads", "train-step", "--seed", "5",
                              "--steps", "2", "--json", json_path});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const json report = read_json(json_path);
  ASSERT_EQ(report["traces"].size(), 1u);
  EXPECT_EQ(report["traces"][0]["name"], "train-step seed 5 steps 2");
  CliResult plain = run_cli({"compare", "-q", "--modes", "growth", "--workloads", "train-step", "--json", json_path});
  ASSERT_EQ(plain.exit_status, 0) << plain.err;
  const json default_report = read_json(json_path);
  EXPECT_EQ(default_report["traces"][0]["name"], "train-step");
  EXPECT_NE(default_report["traces"][0]["events"], report["traces"][0]["events"]);

  CliResult big = run_cli({"compare", "-q", "--workloads", "random-mixed", "--steps", "10001"});
  EXPECT_NE(big.exit_status, 0);
  EXPECT_TRUE(contains(big.err, "workload 'random-mixed': steps 10001 is more than 10 times its default of 1000 "
                                "thousands of operations; allowed: 1 to 10000 (0: the default)"))
      << big.err;
}

TEST(ReplayCommand, StatsSideBySideUnderJaxNames) {
  CliResult result = run_cli({"replay", "--stats", "--modes", "growth,expandable", kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "each pool's stats after the last event")) << result.out;
  EXPECT_FALSE(contains(result.out, "each pass")) << result.out;  // one pass: no table of passes
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

std::string write_temp(const std::string& name, const std::string& data) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  out << data;
  return path;
}

TEST(ReplayCommand, EveryDeviceOfASnapshotOrTheOneAsked) {
  namespace build = test::pickle;
  const std::string snapshot = write_temp(
      "multi.pickle", build::snapshot({{build::entry("alloc", 0x1000, 4 << 20, 0, 1)},
                                       {build::entry("alloc", 0x1000, 8 << 20, 0, 1),
                                        build::entry("free_completed", 0x1000, 8 << 20, 0, 2)}}));
  const std::string json_path = temp_path("multi.json");
  CliResult every = run_cli({"replay", "-q", "--modes", "platform", "--json", json_path, snapshot});
  ASSERT_EQ(every.exit_status, 0) << every.err;
  const json all = read_json(json_path);
  ASSERT_EQ(all["traces"].size(), 2u);
  EXPECT_EQ(all["traces"][0]["name"], "tidepool-replay-cli-" + std::to_string(::getpid()) + "-multi.pickle:dev0");
  EXPECT_EQ(all["traces"][0]["peak_live_bytes"], 4 << 20);
  EXPECT_TRUE(contains(all["traces"][1]["name"].get<std::string>(), "multi.pickle:dev1"));
  EXPECT_EQ(all["traces"][1]["peak_live_bytes"], 8 << 20);

  CliResult one = run_cli({"replay", "-q", "--modes", "platform", "--device", "1", "--json", json_path, snapshot});
  ASSERT_EQ(one.exit_status, 0) << one.err;
  const json second = read_json(json_path);
  ASSERT_EQ(second["traces"].size(), 1u);
  EXPECT_EQ(second["traces"][0]["peak_live_bytes"], 8 << 20);

  CliResult bad = run_cli({"replay", "--device", "one", snapshot});
  EXPECT_EQ(bad.exit_status, 1);
  EXPECT_TRUE(contains(bad.err, "--device 'one': allowed: a device index (0, 1, ...) or 'all'")) << bad.err;
  CliResult missing = run_cli({"replay", "--device", "5", snapshot});
  EXPECT_EQ(missing.exit_status, 1);
  EXPECT_TRUE(contains(missing.err, "device 5 requested, but the snapshot has traces for 2 devices")) << missing.err;
  std::remove(snapshot.c_str());
}

TEST(ReplayCommand, RecordedOomsInTheTableTheJsonAndTheHtml) {
  namespace build = test::pickle;
  const std::string snapshot = write_temp(
      "oom.pickle", build::snapshot({{build::entry("alloc", 0x1000, 4 << 20, 0, 10),
                                      build::entry("oom", 0, std::int64_t{3} << 30, 0, 20),
                                      build::entry("free_completed", 0x1000, 4 << 20, 0, 30)}}));
  const std::string json_path = temp_path("oom.json");
  const std::string html_path = temp_path("oom.html");
  CliResult result =
      run_cli({"replay", "--modes", "platform", "--json", json_path, "--html", html_path, snapshot});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "recorded: 1 allocation failed in the recorded program; the first of 3.00 GiB at time_us 20"))
      << result.out;
  const json report = read_json(json_path);
  const json& trace = report["traces"][0];
  EXPECT_EQ(trace["failed_allocs"], 1);
  ASSERT_EQ(trace["recorded_failures"].size(), 1u);
  EXPECT_EQ(trace["recorded_failures"][0]["x"], 20);
  EXPECT_EQ(trace["recorded_failures"][0]["bytes"], std::uint64_t{3} << 30);
  const std::string page = read_file(html_path);
  std::remove(html_path.c_str());
  EXPECT_TRUE(contains(page, "recorded: 1 allocation failed")) << "the table's note";
  EXPECT_TRUE(contains(page, "\"failures\":[{\"x\":10,\"bytes\":3221225472}]")) << "the chart's marker, at its time";
  std::remove(snapshot.c_str());
}

TEST(ReplayCommand, UsageErrorsExitTwoWithTheUsageLine) {
  CliResult unknown = run_cli({"replya", kBcrafton});
  EXPECT_EQ(unknown.exit_status, 2);
  EXPECT_TRUE(contains(unknown.err, "tidepool: error: unknown subcommand 'replya'; the subcommands are")) << unknown.err;
  EXPECT_TRUE(contains(unknown.err, "replay")) << unknown.err;
  EXPECT_TRUE(contains(unknown.err, "usage: tidepool SUBCOMMAND [OPTIONS]")) << unknown.err;

  CliResult flag = run_cli({"replay", "--bogus", kBcrafton});
  EXPECT_EQ(flag.exit_status, 2);
  EXPECT_TRUE(contains(flag.err, "tidepool: error: ")) << flag.err;
  EXPECT_TRUE(contains(flag.err, "--bogus")) << flag.err;
  EXPECT_TRUE(contains(flag.err, "usage: tidepool replay [OPTIONS] ... (see tidepool replay --help)")) << flag.err;

  CliResult argument = run_cli({"replay"});
  EXPECT_EQ(argument.exit_status, 2);
  EXPECT_TRUE(contains(argument.err, "traces")) << argument.err;
  EXPECT_TRUE(contains(argument.err, "usage: tidepool replay")) << argument.err;

  CliResult value = run_cli({"replay", kBcrafton, "--json"});
  EXPECT_EQ(value.exit_status, 2);
  EXPECT_TRUE(contains(value.err, "--json")) << value.err;

  CliResult none = run_cli({});
  EXPECT_EQ(none.exit_status, 2);
  CliResult help = run_cli({"replay", "--help"});
  EXPECT_EQ(help.exit_status, 0);
}

TEST(ReplayCommand, DashWritesAReportToStandardOutput) {
  CliResult result = run_cli({"replay", "--modes", "platform", "--json", "-", kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  const json report = json::parse(result.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << "the table must stay off standard output: " << result.out.substr(0, 300);
  EXPECT_EQ(report["traces"][0]["seeded_blocks"], 447);

  CliResult perfetto = run_cli({"replay", "--modes", "platform", "--perfetto", "-", kBcrafton});
  ASSERT_EQ(perfetto.exit_status, 0) << perfetto.err;
  EXPECT_TRUE(json::parse(perfetto.out, nullptr, false).contains("traceEvents"));

  CliResult html = run_cli({"replay", "--modes", "platform", "--html", "-", kBcrafton});
  ASSERT_EQ(html.exit_status, 0) << html.err;
  EXPECT_TRUE(html.out.starts_with("<!DOCTYPE html>")) << html.out.substr(0, 100);

  CliResult two = run_cli({"replay", "--json", "-", "--html", "-", kBcrafton});
  EXPECT_EQ(two.exit_status, 1);
  EXPECT_TRUE(contains(two.err, "--json and --html both write to standard output")) << two.err;
}

TEST(ReplayCommand, OutputPathsAreCheckedBeforeTheReplay) {
  // A replay with the capacity search takes a while: the bad path must fail first.
  CliResult result = run_cli({"replay", "--min-capacity", "--json", "/nonexistent-dir/out.json", kBcrafton});
  EXPECT_EQ(result.exit_status, 1);
  EXPECT_TRUE(contains(result.err, "--json /nonexistent-dir/out.json: cannot be written")) << result.err;
  EXPECT_TRUE(result.out.empty()) << "nothing replayed: " << result.out.substr(0, 200);
  CliResult folder = run_cli({"replay", "--html", "/tmp", kBcrafton});
  EXPECT_EQ(folder.exit_status, 1);
  EXPECT_TRUE(contains(folder.err, "--html /tmp: is a folder, not a file")) << folder.err;
}

TEST(ReplayCommand, CapacityIsRoundedUpAndSaysSo) {
  const std::string json_path = temp_path("capacity.json");
  CliResult result = run_cli({"replay", "--modes", "platform", "--capacity", "10001MiB", "--json", json_path, kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.err, "tidepool: warning: --capacity 10001MiB rounded up to 9.77 GiB")) << result.err;
  const json report = read_json(json_path);
  EXPECT_EQ(report["traces"][0]["modes"][0]["capacity_bytes"].get<std::uint64_t>() % (2 << 20), 0u);
  CliResult zero = run_cli({"replay", "--capacity", "0", kBcrafton});
  EXPECT_EQ(zero.exit_status, 1);
  EXPECT_TRUE(contains(zero.err, "--capacity '0': allowed: a positive size")) << zero.err;
}

TEST(ReplayCommand, AnEmptyHistoryWarns) {
  const std::string snapshot = write_temp("empty.pickle", test::pickle::snapshot({{}}));
  CliResult result = run_cli({"replay", "--modes", "platform", snapshot});
  std::remove(snapshot.c_str());
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.err, "tidepool: warning: ")) << result.err;
  EXPECT_TRUE(contains(result.err, "torch.cuda.memory._record_memory_history(max_entries=")) << result.err;
}

TEST(ReplayCommand, MinCapacityReportsTheMinLimit) {
  const std::string json_path = temp_path("limit.json");
  CliResult result = run_cli({"replay", "--modes", "growth", "--min-capacity", "--json", json_path, kBcrafton});
  ASSERT_EQ(result.exit_status, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "min limit (x live)")) << result.out;
  const json report = read_json(json_path);
  const json& growth = report["traces"][0]["modes"][0];
  ASSERT_TRUE(growth["min_limit_bytes"].is_number()) << growth["min_limit_bytes"];
  // The limit is the pool's need; the capacity adds the fraction's headroom (1 / 0.75).
  EXPECT_LT(growth["min_limit_ratio"].get<double>(), growth["min_capacity_ratio"].get<double>());
  EXPECT_GE(growth["min_limit_ratio"].get<double>(), 1.0);
  EXPECT_LT(growth["min_limit_ratio"].get<double>(), 1.3);
}

#else
TEST(ReplayCommand, NotBuilt) { GTEST_SKIP() << "the tidepool command is not part of this build"; }
#endif

}  // namespace
}  // namespace tidepool::test
