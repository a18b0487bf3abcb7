// The text table, JSON and Perfetto reports of a replay: fields present and
// consistent with the figures they come from.
#include "tidepool/report.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tidepool/units.hpp"

namespace tidepool::report {
namespace {

using nlohmann::json;

/// A small real replay: three modes over a trace with an OOM and segments.
trace::TraceReplay sample_replay(std::uint32_t passes = 1) {
  trace::Trace trace;
  trace.name = "sample <trace>";
  trace.format = "test";
  trace.has_segments = true;
  auto alloc = [&](std::uint64_t bytes) {
    trace.events.push_back({trace::Op::alloc, trace.num_blocks, bytes, kDefaultStream, -1});
    return trace.num_blocks++;
  };
  auto free = [&](std::uint32_t block, std::uint64_t bytes) {
    trace.events.push_back({trace::Op::free, block, bytes, kDefaultStream, -1});
  };
  trace.events.push_back({trace::Op::segment_alloc, 0, 64 * MiB, kDefaultStream, -1});
  const auto a = alloc(40 * MiB);
  const auto b = alloc(200 * MiB);  // more than preallocate's 192 MiB region
  const auto c = alloc(1 * MiB);
  free(c, 1 * MiB);
  free(b, 200 * MiB);
  free(a, 40 * MiB);
  trace.events.push_back({trace::Op::segment_free, 0, 64 * MiB, kDefaultStream, -1});

  trace::ReplayOptions options;
  options.capacity_bytes = 256 * MiB;
  options.find_min_capacity = true;
  options.passes = passes;
  const std::vector<Mode> modes = {Mode::preallocate, Mode::growth, Mode::platform};
  auto replay = trace::replay(trace, modes, options);
  EXPECT_TRUE(replay) << replay.error().message();
  return replay ? *replay : trace::TraceReplay{};
}

TEST(ReplayTable, OneRowPerModeAndTheRecordedRow) {
  const trace::TraceReplay replay = sample_replay();
  const std::string table = replay_table(replay);
  EXPECT_NE(table.find("sample <trace> (test): 8 events, 3 blocks"), std::string::npos) << table;
  EXPECT_NE(table.find("device 256 MiB"), std::string::npos) << table;
  for (const char* row : {"\npreallocate ", "\ngrowth ", "\nplatform ", "\nPyTorch (recorded) "}) {
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  }
  for (const char* header : {"peak reserved", "avg reserved", "reserved/live", "min capacity (x live)",
                             "OOMs", "ns/op"}) {
    EXPECT_NE(table.find(header), std::string::npos) << header;
  }
  EXPECT_NE(table.find("192 MiB"), std::string::npos) << table;  // preallocate's region
  EXPECT_NE(table.find("preallocate: 1 OOM; the first at event 2 (block 1, 200 MiB)"), std::string::npos)
      << table;
}

TEST(ReplayJson, EveryFigureUnderItsDocumentedName) {
  const trace::TraceReplay replay = sample_replay();
  const json document = json::parse(replay_json({&replay, 1}));
  EXPECT_EQ(document.at("tidepool_replay_version"), 1);
  ASSERT_EQ(document.at("traces").size(), 1u);
  const json& one = document["traces"][0];
  EXPECT_EQ(one.at("name"), "sample <trace>");
  EXPECT_EQ(one.at("format"), "test");
  EXPECT_EQ(one.at("events"), 8);
  EXPECT_EQ(one.at("blocks"), 3);
  EXPECT_EQ(one.at("x_unit"), "event");
  EXPECT_DOUBLE_EQ(one.at("mem_fraction").get<double>(), 0.75);
  ASSERT_EQ(one.at("modes").size(), 3u);
  for (std::size_t index = 0; index < 3; ++index) {
    const json& mode = one["modes"][index];
    const trace::ModeReplay& figures = replay.modes[index];
    SCOPED_TRACE(mode.at("mode").get<std::string>());
    EXPECT_EQ(mode.at("mode"), std::string(mode_name(figures.mode)));
    EXPECT_EQ(mode.at("capacity_bytes"), 256 * MiB);
    EXPECT_EQ(mode.at("peak_live_bytes"), figures.peak_live_bytes);
    EXPECT_EQ(mode.at("peak_reserved_bytes"), figures.peak_reserved_bytes);
    EXPECT_EQ(mode.at("initial_reserved_bytes"), figures.initial_reserved_bytes);
    EXPECT_EQ(mode.at("final_reserved_bytes"), figures.final_reserved_bytes);
    EXPECT_DOUBLE_EQ(mode.at("average_reserved_bytes").get<double>(), figures.average_reserved_bytes);
    EXPECT_DOUBLE_EQ(mode.at("fragmentation").get<double>(), figures.fragmentation);
    EXPECT_EQ(mode.at("ooms"), figures.ooms);
    EXPECT_EQ(mode.at("events"), 6);
    EXPECT_TRUE(mode.at("min_capacity_bytes").is_number());
    EXPECT_DOUBLE_EQ(mode.at("min_capacity_ratio").get<double>(), figures.min_capacity_ratio());
    for (const char* call : {"allocs", "frees", "creates", "releases", "maps", "unmaps", "reserves",
                             "total", "device_ns"}) {
      EXPECT_TRUE(mode.at("device_calls").contains(call)) << call;
    }
    EXPECT_EQ(mode["device_calls"]["allocs"], figures.device_calls.allocs);
    for (const char* timing : {"replay_ns", "ns_per_op", "events_per_second"}) {
      EXPECT_TRUE(mode.at(timing).is_number()) << timing;
    }
    EXPECT_EQ(mode.at("stats").at("peak_bytes_in_use"), figures.stats.peak_bytes_in_use);
    const json& series = mode.at("series");
    ASSERT_EQ(series.at("x").size(), series.at("live_bytes").size());
    ASSERT_EQ(series.at("x").size(), series.at("reserved_bytes").size());
    std::uint64_t highest_reserved = 0;
    for (const json& value : series["reserved_bytes"]) highest_reserved = std::max(highest_reserved, value.get<std::uint64_t>());
    EXPECT_EQ(highest_reserved, figures.peak_reserved_bytes);
  }
  // preallocate: a single region, and the OOM of the 200 MiB block.
  const json& preallocate = one["modes"][0];
  EXPECT_EQ(preallocate.at("initial_reserved_bytes"), 192 * MiB);
  EXPECT_TRUE(preallocate.at("address_high_water_bytes").is_number());
  EXPECT_EQ(preallocate.at("first_oom").at("event_index"), 2);
  EXPECT_EQ(preallocate.at("first_oom").at("requested_bytes"), 200 * MiB);
  EXPECT_TRUE(preallocate.at("first_oom").at("message").is_string());
  EXPECT_TRUE(one["modes"][1].at("address_high_water_bytes").is_null());
  EXPECT_TRUE(one["modes"][2].at("first_oom").is_null());
  const json& recorded = one.at("recorded");
  EXPECT_EQ(recorded.at("label"), "PyTorch (recorded)");
  EXPECT_EQ(recorded.at("peak_reserved_bytes"), 64 * MiB);
}

TEST(PerfettoJson, CounterTracksLiveAndReservedPerMode) {
  const trace::TraceReplay replay = sample_replay();
  const json document = json::parse(perfetto_json({&replay, 1}));
  ASSERT_TRUE(document.at("traceEvents").is_array());
  std::map<int, std::string> process_names;
  std::map<int, std::set<std::string>> counters;
  std::map<int, std::uint64_t> highest_reserved;
  std::vector<std::pair<int, std::int64_t>> instants;  // (pid, ts)
  std::vector<json> slices;
  for (const json& event : document["traceEvents"]) {
    const int pid = event.at("pid");
    if (event.at("ph") == "M" && event.at("name") == "process_name") {
      process_names[pid] = event.at("args").at("name");
    } else if (event.at("ph") == "C") {
      const std::string name = event.at("name");
      counters[pid].insert(name);
      EXPECT_TRUE(event.at("ts").is_number_integer());
      EXPECT_GE(event.at("ts").get<std::int64_t>(), 0);
      const std::uint64_t bytes = event.at("args").at("bytes");
      if (name == "reserved") highest_reserved[pid] = std::max(highest_reserved[pid], bytes);
    } else if (event.at("ph") == "i") {
      instants.emplace_back(pid, event.at("ts").get<std::int64_t>());
    } else if (event.at("ph") == "X") {
      slices.push_back(event);
    }
  }
  // Three modes, the recorded row, and the recorded program's blocks.
  ASSERT_EQ(process_names.size(), 5u);
  std::set<std::string> names;
  for (const auto& [pid, name] : process_names) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"sample <trace> / preallocate", "sample <trace> / growth",
                                          "sample <trace> / platform", "sample <trace> / PyTorch (recorded)",
                                          "sample <trace> / recorded program"}));
  // The OOMs of preallocate and growth (the 200 MiB block, event 2) are instants at their place.
  ASSERT_EQ(instants.size(), 2u);
  EXPECT_EQ(process_names[instants[0].first], "sample <trace> / preallocate");
  EXPECT_EQ(process_names[instants[1].first], "sample <trace> / growth");
  EXPECT_EQ(instants[0].second, 2);
  EXPECT_EQ(instants[1].second, 2);
  // One slice per block lifetime; the 200 MiB one runs from event 2 to event 5.
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[1].at("args").at("bytes"), 200 * MiB);
  EXPECT_EQ(slices[1].at("ts"), 2);
  EXPECT_EQ(slices[1].at("dur"), 3);
  EXPECT_NE(slices[0].at("tid"), slices[1].at("tid"));  // overlapping lifetimes on separate lanes
  for (const auto& [pid, name] : process_names) {
    SCOPED_TRACE(name);
    if (name.find("recorded program") != std::string::npos) continue;
    EXPECT_TRUE(counters[pid].count("reserved"));
    if (name.find("PyTorch") == std::string::npos) {
      EXPECT_TRUE(counters[pid].count("live"));
    }
  }
  for (std::size_t index = 0; index < replay.modes.size(); ++index) {
    EXPECT_EQ(highest_reserved[static_cast<int>(index) + 1], replay.modes[index].peak_reserved_bytes);
  }
}

TEST(PassesTable, OneRowPerPassOfEachModeInTextAndHtml) {
  EXPECT_EQ(passes_table(sample_replay()), "");  // one pass: nothing to add
  const trace::TraceReplay replay = sample_replay(3);
  const std::string table = passes_table(replay);
  EXPECT_NE(table.find("sample <trace>: each pass (device calls: a allocs"), std::string::npos) << table;
  const auto has = [&](const char* pattern) { return std::regex_search(table, std::regex(pattern)); };
  // platform asks the device for every block, every pass; growth takes its
  // region in the first pass and keeps it; preallocate took it before.
  EXPECT_TRUE(has(R"(\nplatform +1  a3 f3 +[0-9.]+ +241 MiB +0\n +2  a3 f3 .*\n +3  a3 f3 )")) << table;
  EXPECT_TRUE(has(R"(\ngrowth +1  a[0-9]+ .*\n +2  0 .*\n +3  0 )")) << table;
  EXPECT_TRUE(has(R"(\npreallocate +1  0 +[0-9.]+ +192 MiB +1\n)")) << table;  // its OOM, every pass
  auto page = replay_html({&replay, 1});
  if (!page && page.error().code() == Errc::unsupported) GTEST_SKIP() << page.error().message();
  ASSERT_TRUE(page) << page.error().message();
  EXPECT_NE(page->find("<summary>Each pass (tidepool replay --passes; device calls: a allocs"), std::string::npos);
  EXPECT_NE(page->find("<tr><td>platform</td><td>1</td><td>a3 f3</td>"), std::string::npos);
  EXPECT_NE(page->find("<tr><td></td><td>3</td><td>a3 f3</td>"), std::string::npos);
}

TEST(ReplayHtml, IsSelfContained) {
  const trace::TraceReplay replay = sample_replay();
  auto page = replay_html({&replay, 1});
  if (!page && page.error().code() == Errc::unsupported) {
    GTEST_SKIP() << page.error().message();
  }
  ASSERT_TRUE(page) << page.error().message();
  EXPECT_NE(page->find("Chart.js v"), std::string::npos);   // embedded at build time, inlined
  EXPECT_EQ(page->find("<script src"), std::string::npos);
  EXPECT_EQ(page->find("http://"), std::string::npos);
  EXPECT_NE(page->find("sample &lt;trace&gt;"), std::string::npos);  // names are escaped
  EXPECT_NE(page->find("<td>PyTorch (recorded)</td>"), std::string::npos);
  EXPECT_NE(page->find("id=\"chart-0\""), std::string::npos);
  EXPECT_NE(page->find("id=\"chart-1\""), std::string::npos);  // reserved / live over time
  EXPECT_NE(page->find("id=\"log-scale\""), std::string::npos);
  EXPECT_NE(page->find("id=\"reset-zoom\""), std::string::npos);
  EXPECT_NE(page->find("Each pool's stats after the last event"), std::string::npos);
  EXPECT_NE(page->find("<td>num_allocs</td>"), std::string::npos) << "the --stats table";
  EXPECT_EQ(page->find("Each pass"), std::string::npos) << "one pass: no table of passes";
  // The plan's footprint: in the heading and a level on the chart.
  ASSERT_TRUE(replay.planned_footprint_bytes);
  EXPECT_NE(page->find("(planned: "), std::string::npos);
  EXPECT_NE(page->find("\"planned\":" + std::to_string(*replay.planned_footprint_bytes)), std::string::npos);
}

TEST(WriteFile, ErrorsNameThePath) {
  Status written = write_file("/nonexistent-dir/report.json", "{}");
  ASSERT_FALSE(written);
  EXPECT_EQ(written.error().code(), Errc::io_error);
  EXPECT_NE(written.error().message().find("/nonexistent-dir/report.json"), std::string::npos);
}

}  // namespace
}  // namespace tidepool::report
