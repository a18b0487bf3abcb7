// Chrome trace-event JSON (the format chrome://tracing and ui.perfetto.dev
// both import): per trace and mode one process holding the counter tracks
// "live" and "reserved" and an instant per OOM; per trace one more process
// with the recorded program's failures and, for traces of at most
// kMaxLifetimes blocks, one slice per block lifetime.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "report/table_rows.hpp"
#include "tidepool/report.hpp"
#include "tidepool/units.hpp"

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

Json oom_instant(int pid, const char* name, std::int64_t ts, std::uint64_t bytes) {
  return Json{{"name", name}, {"ph", "i"}, {"s", "p"}, {"ts", ts}, {"pid", pid}, {"tid", 0},
              {"args", Json{{"requested_bytes", bytes}}}};
}

/// One slice per lifetime, on lanes (threads) reused as blocks end, so no
/// two slices of a lane overlap. A block live at the end runs to `end_ts`.
void add_lifetimes(Json& events, int pid, const trace::TraceReplay& replay, std::int64_t origin, std::int64_t end_ts) {
  using Ending = std::pair<std::int64_t, int>;  // (end ts, lane)
  std::priority_queue<Ending, std::vector<Ending>, std::greater<>> busy;
  std::priority_queue<int, std::vector<int>, std::greater<>> free_lanes;
  int lanes = 0;
  for (const trace::TraceReplay::Lifetime& lifetime : replay.lifetimes) {
    const std::int64_t start = lifetime.start_x - origin;
    const std::int64_t end = lifetime.end_x < 0 ? end_ts : lifetime.end_x - origin;
    while (!busy.empty() && busy.top().first <= start) {
      free_lanes.push(busy.top().second);
      busy.pop();
    }
    int lane = lanes;
    if (free_lanes.empty()) {
      ++lanes;
    } else {
      lane = free_lanes.top();
      free_lanes.pop();
    }
    busy.push({end, lane});
    events.push_back(Json{{"name", format_bytes(static_cast<std::size_t>(lifetime.bytes))},
                          {"ph", "X"},
                          {"ts", start},
                          {"dur", end - start},
                          {"pid", pid},
                          {"tid", lane},
                          {"args", Json{{"block", lifetime.block}, {"bytes", lifetime.bytes}}}});
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
      const std::int64_t origin = detail::series_origin(replay);
      for (const trace::OomMark& mark : mode.oom_marks) {
        events.push_back(oom_instant(pid, "OOM", mark.x - origin, mark.bytes));
      }
    }
    if (replay.recorded) {
      ++pid;
      events.push_back(process_name(pid, replay.trace_name + " / " + replay.recorded->label));
      events.push_back(process_order(pid));
      add_series(events, pid, replay.recorded->series, false);
    }
    if (!replay.failures.empty() || !replay.lifetimes.empty()) {
      ++pid;
      events.push_back(process_name(pid, replay.trace_name + " / recorded program"));
      events.push_back(process_order(pid));
      const std::int64_t origin = detail::series_origin(replay);
      for (const trace::OomMark& failure : replay.failures) {
        events.push_back(oom_instant(pid, "recorded OOM", failure.x - origin, failure.bytes));
      }
      std::int64_t end_ts = 0;
      for (const trace::ModeReplay& mode : replay.modes) {
        if (!mode.series.empty()) end_ts = std::max(end_ts, mode.series.back().x - origin);
      }
      add_lifetimes(events, pid, replay, origin, end_ts);
    }
  }
  Json document;
  document["traceEvents"] = std::move(events);
  document["displayTimeUnit"] = "ms";
  return document.dump() + "\n";
}

}  // namespace tidepool::report
