// The JSON report: every figure of every replay. The field names are part of
// the interface (docs/replay.md); ordered_json keeps them in a stable order.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "tidepool/report.hpp"
#include "tidepool/replay.hpp"

namespace tidepool::report {
namespace {

using Json = nlohmann::ordered_json;

Json series_json(const std::vector<trace::SeriesPoint>& series) {
  Json x = Json::array();
  Json live = Json::array();
  Json reserved = Json::array();
  for (const trace::SeriesPoint& point : series) {
    x.push_back(point.x);
    live.push_back(point.live_bytes);
    reserved.push_back(point.reserved_bytes);
  }
  return Json{{"x", std::move(x)}, {"live_bytes", std::move(live)}, {"reserved_bytes", std::move(reserved)}};
}

Json calls_json(const trace::DeviceCalls& calls) {
  Json out;
  for (const auto& [name, value] : calls.items()) out[std::string(name)] = value;
  return out;
}

/// A figure of a for_each_figure list; an absent optional is null.
template <class T>
Json figure_json(const T& value) {
  return Json(value);
}
template <class T>
Json figure_json(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}
inline Json figure_json(std::string_view value) { return Json(std::string(value)); }

template <class Figures>
Json figures_json(const Figures& figures) {
  Json out = Json::object();
  figures.for_each_figure([&out](std::string_view name, const auto& value) { out[std::string(name)] = figure_json(value); });
  return out;
}

Json mode_json(const trace::ModeReplay& mode) {
  Json out = figures_json(mode);
  out["device_calls"] = calls_json(mode.device_calls);
  Json passes = Json::array();
  for (const trace::PassReplay& pass : mode.passes) {
    Json entry{{"device_calls", calls_json(pass.device_calls)}};
    entry.update(figures_json(pass));
    passes.push_back(std::move(entry));
  }
  out["passes"] = std::move(passes);
  out["first_oom"] = mode.first_oom ? figures_json(*mode.first_oom) : Json(nullptr);
  Json marks = Json::array();
  for (const trace::OomMark& mark : mode.oom_marks) marks.push_back(Json{{"x", mark.x}, {"bytes", mark.bytes}});
  out["oom_marks"] = std::move(marks);
  Json stats;
  for (const auto& [name, value] : mode.stats.items()) stats[std::string(name)] = value;
  out["stats"] = std::move(stats);
  out["series"] = series_json(mode.series);
  return out;
}

Json trace_json(const trace::TraceReplay& replay) {
  Json out;
  out["name"] = replay.trace_name;
  out["format"] = replay.trace_format;
  out["events"] = replay.events;
  out["blocks"] = replay.blocks;
  out["unmatched_frees"] = replay.unmatched_frees;
  out["seeded_blocks"] = replay.seeded_blocks;
  out["seeded_bytes"] = replay.seeded_bytes;
  out["peak_live_bytes"] = replay.peak_live_bytes;
  out["planned_footprint_bytes"] = figure_json(replay.planned_footprint_bytes);
  out["failed_allocs"] = replay.failed_allocs;
  Json failures = Json::array();
  for (const trace::OomMark& failure : replay.failures) {
    failures.push_back(Json{{"x", failure.x}, {"bytes", failure.bytes}});
  }
  out["recorded_failures"] = std::move(failures);
  out["peak_x"] = replay.peak_x;
  Json largest = Json::array();
  for (const trace::TraceReplay::PeakBlock& block : replay.largest_at_peak) {
    largest.push_back(Json{{"block", block.block},
                           {"bytes", block.bytes},
                           {"alloc_x", block.alloc_x},
                           {"seeded", block.seeded},
                           {"stack", block.stack}});
  }
  out["largest_at_peak"] = std::move(largest);
  Json settings = Json::object();
  for (const auto& [key, value] : replay.recorder_settings) settings[key] = value;
  out["recorder_settings"] = std::move(settings);
  out["x_unit"] = replay.timed ? "time_us" : "event";
  out["mem_fraction"] = replay.mem_fraction;
  Json modes = Json::array();
  for (const trace::ModeReplay& mode : replay.modes) modes.push_back(mode_json(mode));
  out["modes"] = std::move(modes);
  if (replay.recorded) {
    const trace::RecordedReplay& recorded = *replay.recorded;
    out["recorded"] = Json{{"label", recorded.label},
                           {"initial_reserved_bytes", recorded.initial_reserved_bytes},
                           {"peak_reserved_bytes", recorded.peak_reserved_bytes},
                           {"average_reserved_bytes", recorded.average_reserved_bytes},
                           {"fragmentation", recorded.fragmentation},
                           {"series", series_json(recorded.series)}};
  } else {
    out["recorded"] = nullptr;
  }
  return out;
}

}  // namespace

std::string replay_json(std::span<const trace::TraceReplay> replays) {
  Json traces = Json::array();
  for (const trace::TraceReplay& replay : replays) traces.push_back(trace_json(replay));
  Json document;
  document["tidepool_replay_version"] = 1;
  document["traces"] = std::move(traces);
  return document.dump() + "\n";
}

std::string ledger_json(const LedgerSnapshot& snapshot, std::optional<std::size_t> reclaimed_now) {
  Json out = figures_json(snapshot);
  Json processes = Json::array();
  for (const LedgerEntryInfo& entry : snapshot.entries) processes.push_back(figures_json(entry));
  out["processes"] = std::move(processes);
  out["totals"] = figures_json(snapshot.totals());
  if (reclaimed_now) out["reclaimed_now"] = *reclaimed_now;
  return out.dump(2);
}

}  // namespace tidepool::report
