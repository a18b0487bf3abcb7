// Chrome trace-event JSON (the format chrome://tracing and ui.perfetto.dev
// both import): per trace and mode one process holding the counter tracks
// "live" and "reserved".
#include <nlohmann/json.hpp>

#include <string>

#include "tidepool/report.hpp"

namespace tidepool::report {
namespace {

using Json = nlohmann::ordered_json;

Json process_name(int pid, const std::string& name) {
  return Json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
              {"args", Json{{"name", name}}}};
}

Json process_order(int pid) {
  return Json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
              {"args", Json{{"sort_index", pid}}}};
}

Json counter(int pid, const char* name, std::int64_t ts, std::uint64_t bytes) {
  return Json{{"name", name}, {"ph", "C"}, {"ts", ts}, {"pid", pid}, {"tid", 0},
              {"args", Json{{"bytes", bytes}}}};
}

/// The counters of one series. Timestamps start at 0: the trace's first
/// microsecond, or event 0 at one microsecond per event.
void add_series(Json& events, int pid, const std::vector<trace::SeriesPoint>& series, bool with_live) {
  if (series.empty()) return;
  const std::int64_t origin = series.front().x;
  for (const trace::SeriesPoint& point : series) {
    const std::int64_t ts = point.x - origin;
    if (with_live) events.push_back(counter(pid, "live", ts, point.live_bytes));
    events.push_back(counter(pid, "reserved", ts, point.reserved_bytes));
  }
}

}  // namespace

std::string perfetto_json(std::span<const trace::TraceReplay> replays) {
  Json events = Json::array();
  int pid = 0;
  for (const trace::TraceReplay& replay : replays) {
    for (const trace::ModeReplay& mode : replay.modes) {
      ++pid;
      events.push_back(process_name(pid, replay.trace_name + " / " + mode_label(mode)));
      events.push_back(process_order(pid));
      add_series(events, pid, mode.series, true);
    }
    if (replay.recorded) {
      ++pid;
      events.push_back(process_name(pid, replay.trace_name + " / " + replay.recorded->label));
      events.push_back(process_order(pid));
      add_series(events, pid, replay.recorded->series, false);
    }
  }
  Json document;
  document["traceEvents"] = std::move(events);
  document["displayTimeUnit"] = "ms";
  return document.dump() + "\n";
}

}  // namespace tidepool::report
