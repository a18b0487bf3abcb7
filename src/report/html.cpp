// The HTML report: one self-contained page (Chart.js embedded at build time
// and inlined, the data as JSON in the page) that works offline. It answers
// "why", as PyTorch's memory_viz does: per trace the table, reserved and live
// bytes over time with the OOMs at their place, reserved / live over time,
// the largest blocks live at the peak with where they were allocated, the
// recorder's settings and each pool's stats; a log scale and drag-to-zoom.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "report/chart_js.hpp"
#include "report/table_rows.hpp"
#include "tidepool/report.hpp"
#include "tidepool/units.hpp"

namespace tidepool::report {
namespace {

using Json = nlohmann::ordered_json;

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

/// JSON safe inside a <script> element: "</" would end it early.
std::string script_safe(std::string json) {
  for (std::size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) {
    json.replace(at, 2, "<\\/");
  }
  return json;
}

/// x relative to the trace's first event (a trace's times are since the epoch).
Json points(const std::vector<trace::SeriesPoint>& series, std::int64_t origin, bool live) {
  Json xs = Json::array();
  Json ys = Json::array();
  for (const trace::SeriesPoint& point : series) {
    xs.push_back(point.x - origin);
    ys.push_back(live ? point.live_bytes : point.reserved_bytes);
  }
  return Json{{"x", std::move(xs)}, {"y", std::move(ys)}};
}

/// reserved / live at each point where something is live (null elsewhere).
Json ratios(const std::vector<trace::SeriesPoint>& series, std::int64_t origin) {
  Json xs = Json::array();
  Json ys = Json::array();
  for (const trace::SeriesPoint& point : series) {
    xs.push_back(point.x - origin);
    if (point.live_bytes == 0) {
      ys.push_back(nullptr);
    } else {
      ys.push_back(static_cast<double>(point.reserved_bytes) / static_cast<double>(point.live_bytes));
    }
  }
  return Json{{"x", std::move(xs)}, {"y", std::move(ys)}};
}

Json marks(const std::vector<trace::OomMark>& oom_marks, std::int64_t origin) {
  Json out = Json::array();
  for (const trace::OomMark& mark : oom_marks) out.push_back(Json{{"x", mark.x - origin}, {"bytes", mark.bytes}});
  return out;
}

/// What the page script draws: per trace, the lines of both charts and the
/// OOM marks (each mode's refusals, the recorded program's failures).
Json chart_data(std::span<const trace::TraceReplay> replays) {
  Json charts = Json::array();
  for (const trace::TraceReplay& replay : replays) {
    const std::int64_t origin = detail::series_origin(replay);
    Json lines = Json::array();
    Json ratio_lines = Json::array();
    Json mode_marks = Json::array();
    for (const trace::ModeReplay& mode : replay.modes) {
      Json line = points(mode.series, origin, false);
      line["label"] = mode_label(mode) + " reserved";
      lines.push_back(std::move(line));
      Json ratio = ratios(mode.series, origin);
      ratio["label"] = mode_label(mode);
      ratio_lines.push_back(std::move(ratio));
      mode_marks.push_back(marks(mode.oom_marks, origin));
    }
    if (replay.recorded) {
      Json line = points(replay.recorded->series, origin, false);
      line["label"] = replay.recorded->label + " reserved";
      lines.push_back(std::move(line));
      Json ratio = ratios(replay.recorded->series, origin);
      ratio["label"] = replay.recorded->label;
      ratio_lines.push_back(std::move(ratio));
    }
    // Live bytes are the trace's, the same under every mode but for OOMs
    // (a refused block is never live): a mode that served everything, else
    // the one that served most, stands for them.
    const trace::ModeReplay* live_from = nullptr;
    for (const trace::ModeReplay& mode : replay.modes) {
      if (live_from == nullptr || (live_from->ooms != 0 && mode.ooms == 0) ||
          (live_from->ooms != 0 && mode.served_peak_live_bytes > live_from->served_peak_live_bytes)) {
        live_from = &mode;
      }
    }
    if (live_from != nullptr) {
      Json line = points(live_from->series, origin, true);
      line["label"] = "live (requested)";
      line["live"] = true;
      lines.push_back(std::move(line));
    }
    charts.push_back(Json{{"title", replay.trace_name},
                          {"timed", replay.timed},
                          {"lines", std::move(lines)},
                          {"ratios", std::move(ratio_lines)},
                          {"mode_marks", std::move(mode_marks)},
                          {"failures", marks(replay.failures, origin)},
                          {"planned", replay.planned_footprint_bytes ? Json(*replay.planned_footprint_bytes)
                                                                     : Json(nullptr)}});
  }
  return charts;
}

std::string rows_html(const std::vector<std::vector<std::string>>& rows) {
  std::string out = "<table>\n";
  for (std::size_t row = 0; row < rows.size(); ++row) {
    const char* cell = row == 0 ? "th" : "td";
    out += "<tr>";
    for (const std::string& text : rows[row]) {
      out += std::string("<") + cell + ">" + escape_html(text) + "</" + cell + ">";
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

std::string table_html(const trace::TraceReplay& replay) {
  const detail::TableText table = detail::table_text(replay);
  std::string out = "<p class=\"heading\">" + escape_html(table.heading) + "</p>\n" + rows_html(table.rows);
  for (const std::string& note : table.notes) out += "<p class=\"note\">" + escape_html(note) + "</p>\n";
  return out;
}

/// The time of x for the page's text: ms or s when timed, else the event index.
std::string x_text(const trace::TraceReplay& replay, std::int64_t x) {
  if (!replay.timed) return "event " + std::to_string(x);
  const double us = static_cast<double>(x - detail::series_origin(replay));
  if (us < 1e3) return fmt::format("{:.0f} µs", us);
  if (us < 1e6) return fmt::format("{:.1f} ms", us / 1e3);
  return fmt::format("{:.2f} s", us / 1e6);
}

/// The peak's largest blocks, each with where it was allocated.
std::string peak_html(const trace::TraceReplay& replay) {
  if (replay.largest_at_peak.empty()) return {};
  std::string out = "<h3>The largest blocks live at the peak (" + escape_html(format_bytes(replay.peak_live_bytes)) +
                    " live, at " + escape_html(x_text(replay, replay.peak_x)) + ")</h3>\n<table class=\"blocks\">\n"
                    "<tr><th>block</th><th>size</th><th>allocated</th><th>where (stack frames from the trace)</th></tr>\n";
  for (const trace::TraceReplay::PeakBlock& block : replay.largest_at_peak) {
    const std::string when = block.seeded ? "before recording began" : x_text(replay, block.alloc_x);
    std::string where = "<span class=\"muted\">not recorded</span>";
    if (!block.stack.empty()) {
      const std::string_view first = std::string_view(block.stack).substr(0, block.stack.find('\n'));
      where = "<details><summary>" + escape_html(first) + "</summary><pre>" + escape_html(block.stack) +
              "</pre></details>";
    }
    out += "<tr><td>" + std::to_string(block.block) + "</td><td>" + escape_html(format_bytes(block.bytes)) +
           "</td><td>" + escape_html(when) + "</td><td class=\"stack\">" + where + "</td></tr>\n";
  }
  return out + "</table>\n";
}

std::string settings_html(const trace::TraceReplay& replay) {
  if (replay.recorder_settings.empty()) return {};
  std::vector<std::vector<std::string>> rows = {{"setting", "value"}};
  for (const auto& [key, value] : replay.recorder_settings) rows.push_back({key, value});
  return "<details><summary>The recorded allocator's settings (allocator_settings)</summary>\n" +
         rows_html(rows) + "</details>\n";
}

std::string passes_html(const trace::TraceReplay& replay) {
  const auto rows = detail::passes_rows(replay);
  if (rows.empty()) return {};
  return "<details open><summary>Each pass (tidepool replay --passes; " + escape_html(detail::kCallLetters) +
         ")</summary>\n" + rows_html(rows) + "</details>\n";
}

std::string stats_html(const trace::TraceReplay& replay) {
  const auto rows = detail::stats_rows(replay);
  if (rows.empty()) return {};
  return "<details><summary>Each pool's stats after the last event (memory_stats() names; tidepool replay "
         "--stats)</summary>\n" +
         rows_html(rows) + "</details>\n";
}

// Counts script errors before anything else runs, so a failure inside
// Chart.js is seen too. The result lives on <html> as data attributes.
constexpr const char* kErrorCounter = R"(<script>
window.tidepoolErrors = 0;
function tidepoolCountError() {
  window.tidepoolErrors += 1;
  document.documentElement.setAttribute('data-script-errors', String(window.tidepoolErrors));
}
window.addEventListener('error', tidepoolCountError);
window.addEventListener('unhandledrejection', tidepoolCountError);
(function () {
  var original = console.error;
  console.error = function () { tidepoolCountError(); original.apply(console, arguments); };
})();
</script>
)";

constexpr const char* kPageScript = R"(<script>
(function () {
  var traces = JSON.parse(document.getElementById('tidepool-data').textContent);
  var colours = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2'];
  var drawn = 0;
  var countDrawn = {
    id: 'tidepoolDrawn',
    afterRender: function (chart) {
      if (chart.tidepoolCounted) return;
      chart.tidepoolCounted = true;
      drawn += 1;
      document.documentElement.setAttribute('data-charts-rendered', String(drawn));
    }
  };
  var gib = 1024 * 1024 * 1024;
  function timeText(us) {
    var a = Math.abs(us);
    if (a < 1e3) return us.toFixed(0) + ' \u00b5s';
    if (a < 1e6) return (us / 1e3).toFixed(a < 1e4 ? 2 : 1) + ' ms';
    return (us / 1e6).toFixed(a < 1e7 ? 2 : 1) + ' s';
  }
  function xAxis(trace) {
    return {type: 'linear',
            title: {display: true, text: trace.timed ? 'time since the first event' : 'event'},
            ticks: {callback: function (value) { return trace.timed ? timeText(value) : String(value); }}};
  }
  // The value of a step series at x: the last point at or before it.
  function valueAt(line, x) {
    var low = 0, high = line.x.length - 1, found = 0;
    while (low <= high) {
      var middle = (low + high) >> 1;
      if (line.x[middle] <= x) { found = middle; low = middle + 1; } else { high = middle - 1; }
    }
    return line.y[found];
  }
  var memoryCharts = [];
  var allCharts = [];
  var byTrace = [];
  traces.forEach(function (trace, index) {
    var datasets = trace.lines.map(function (line, k) {
      var data = line.x.map(function (x, i) { return {x: x, y: line.y[i] / gib}; });
      var colour = line.live ? '#000000' : colours[k % colours.length];
      return {label: line.label, data: data, borderColor: colour, backgroundColor: colour,
              borderWidth: line.live ? 2 : 1.5, borderDash: line.live ? [6, 3] : [],
              pointRadius: 0, stepped: 'after', fill: false};
    });
    // OOMs at their place: a mode's on its reserved line, the recorded
    // program's on the live line.
    trace.mode_marks.forEach(function (marks, k) {
      if (marks.length === 0) return;
      var line = trace.lines[k];
      datasets.push({label: line.label.replace(' reserved', '') + ' OOM', showLine: false,
                     pointStyle: 'triangle', pointRadius: 7, borderColor: colours[k % colours.length],
                     backgroundColor: colours[k % colours.length],
                     data: marks.map(function (m) { return {x: m.x, y: valueAt(line, m.x) / gib, bytes: m.bytes}; })});
    });
    if (trace.failures.length > 0) {
      var live = trace.lines[trace.lines.length - 1];
      datasets.push({label: 'recorded OOM (the program saw it fail)', showLine: false, pointStyle: 'crossRot',
                     pointRadius: 9, borderWidth: 3, borderColor: '#e00000', backgroundColor: '#e00000',
                     data: trace.failures.map(function (f) {
                       return {x: f.x, y: valueAt(live, f.x) / gib, bytes: f.bytes};
                     })});
    }
    // The plan's footprint (knowing every lifetime, nothing moved): a level
    // across the live line's span.
    var last = trace.lines[trace.lines.length - 1];
    if (trace.planned !== null && last && last.live && last.x.length > 0) {
      datasets.push({label: 'planned (every lifetime known)', stepped: false, pointRadius: 0, fill: false,
                     borderColor: '#7f7f7f', backgroundColor: '#7f7f7f', borderWidth: 1.5, borderDash: [2, 4],
                     data: [{x: last.x[0], y: trace.planned / gib},
                            {x: last.x[last.x.length - 1], y: trace.planned / gib}]});
    }
    var tooltip = {callbacks: {
      title: function (items) { return items.length ? (trace.timed ? timeText(items[0].parsed.x) : 'event ' + items[0].parsed.x) : ''; },
      label: function (item) {
        var raw = item.raw || {};
        var text = item.dataset.label + ': ' + item.parsed.y.toFixed(3) + ' GiB';
        if (raw.bytes !== undefined) text += ' (request of ' + (raw.bytes / gib).toFixed(3) + ' GiB)';
        return text;
      }}};
    var memory = new Chart(document.getElementById('chart-' + (2 * index)), {
      type: 'line',
      data: {datasets: datasets},
      options: {
        animation: false, parsing: false, normalized: true, responsive: true,
        maintainAspectRatio: false, interaction: {mode: 'nearest', intersect: false},
        scales: {x: xAxis(trace), y: {type: 'linear', beginAtZero: true, title: {display: true, text: 'GiB'}}},
        plugins: {title: {display: true, text: trace.title + ': reserved and live bytes over time'},
                  legend: {position: 'bottom'}, tooltip: tooltip}
      },
      plugins: [countDrawn]
    });
    var ratioSets = trace.ratios.map(function (line, k) {
      var colour = colours[k % colours.length];
      return {label: line.label, data: line.x.map(function (x, i) { return {x: x, y: line.y[i]}; }),
              borderColor: colour, backgroundColor: colour, borderWidth: 1.5, pointRadius: 0,
              stepped: 'after', fill: false, spanGaps: false};
    });
    var ratio = new Chart(document.getElementById('chart-' + (2 * index + 1)), {
      type: 'line',
      data: {datasets: ratioSets},
      options: {
        animation: false, parsing: false, normalized: true, responsive: true,
        maintainAspectRatio: false, interaction: {mode: 'nearest', intersect: false},
        scales: {x: xAxis(trace), y: {type: 'linear', min: 1, max: 3,
                                      title: {display: true, text: 'reserved / live'}}},
        plugins: {title: {display: true, text: trace.title +
                                               ': fragmentation (reserved / live) over time, axis cut at 3x'},
                  legend: {position: 'bottom'}}
      },
      plugins: [countDrawn]
    });
    memoryCharts.push(memory);
    allCharts.push(memory, ratio);
    byTrace.push([memory, ratio]);
  });

  // A logarithmic y axis for the byte charts.
  document.getElementById('log-scale').addEventListener('change', function (event) {
    memoryCharts.forEach(function (chart) {
      chart.options.scales.y.type = event.target.checked ? 'logarithmic' : 'linear';
      chart.update();
    });
  });
  // Zoom: drag across a chart to show that range of time in both of its trace's charts.
  function zoom(charts, low, high) {
    charts.forEach(function (chart) {
      chart.options.scales.x.min = low;
      chart.options.scales.x.max = high;
      chart.update();
    });
  }
  byTrace.forEach(function (charts) {
    charts.forEach(function (chart) {
      var canvas = chart.canvas;
      var band = document.createElement('div');
      band.className = 'band';
      canvas.parentNode.appendChild(band);
      var start = null;
      canvas.addEventListener('mousedown', function (event) {
        start = event.offsetX;
        band.style.left = start + 'px';
        band.style.width = '0px';
        band.style.display = 'block';
      });
      canvas.addEventListener('mousemove', function (event) {
        if (start === null) return;
        band.style.left = Math.min(start, event.offsetX) + 'px';
        band.style.width = Math.abs(event.offsetX - start) + 'px';
      });
      window.addEventListener('mouseup', function (event) {
        if (start === null) return;
        var end = event.target === canvas ? event.offsetX : start;
        band.style.display = 'none';
        if (Math.abs(end - start) > 4) {
          var a = chart.scales.x.getValueForPixel(Math.min(start, end));
          var b = chart.scales.x.getValueForPixel(Math.max(start, end));
          zoom(charts, a, b);
        }
        start = null;
      });
    });
  });
  document.getElementById('reset-zoom').addEventListener('click', function () {
    byTrace.forEach(function (charts) { zoom(charts, undefined, undefined); });
  });
  document.documentElement.setAttribute('data-charts-expected', String(allCharts.length));
})();
</script>
)";

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
td.stack { text-align: left; max-width: 60em; }
td.stack pre { font-size: 0.85em; white-space: pre-wrap; margin: 0.3em 0; }
.heading { font-weight: bold; margin-top: 1.5em; }
.note { color: #a00; font-size: 0.9em; margin: 0.2em 0; }
.muted { color: #888; }
.controls { position: sticky; top: 0; background: #fff; padding: 0.4em 0; border-bottom: 1px solid #ddd; z-index: 2; }
.chart { position: relative; height: 420px; max-width: 1200px; user-select: none; }
.chart.ratio { height: 240px; }
.band { position: absolute; top: 0; bottom: 0; background: rgba(31, 119, 180, 0.15); display: none; pointer-events: none; }
section { margin-bottom: 2.5em; }
h3 { font-size: 1em; margin: 1em 0 0.3em; }
details { margin: 0.5em 0; }
summary { cursor: pointer; }
</style>
)";

}  // namespace

Expected<std::string> replay_html(std::span<const trace::TraceReplay> replays, const HtmlOptions& options) {
#ifdef TIDEPOOL_HAVE_CHART_JS
  const std::string_view chart_js(reinterpret_cast<const char*>(detail::kChartJs), detail::kChartJsSize);
#else
  const std::string_view chart_js;
#endif
  if (chart_js.empty()) {
    return Error(Errc::unsupported,
                 "this tidepool was built without Chart.js, which the HTML report embeds: install "
                 "libjs-chart.js (scripts/install-deps) and build again");
  }
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                     escape_html(options.title) + "</title>\n";
  page += kStyle;
  page += kErrorCounter;
  page += "<script>\n";
  page += chart_js;
  page += "\n</script>\n</head>\n<body>\n";
  page += "<h1>" + escape_html(options.title) + "</h1>\n";
  page += "<div class=\"controls\"><label><input type=\"checkbox\" id=\"log-scale\"> logarithmic bytes axis</label>"
          " &nbsp;&middot;&nbsp; drag across a chart to zoom into a time range "
          "<button id=\"reset-zoom\" type=\"button\">reset zoom</button></div>\n";
  for (std::size_t index = 0; index < replays.size(); ++index) {
    const trace::TraceReplay& replay = replays[index];
    page += "<section>\n" + table_html(replay) + passes_html(replay);
    page += "<div class=\"chart\"><canvas id=\"chart-" + std::to_string(2 * index) + "\"></canvas></div>\n";
    page += "<div class=\"chart ratio\"><canvas id=\"chart-" + std::to_string(2 * index + 1) + "\"></canvas></div>\n";
    page += peak_html(replay);
    page += settings_html(replay);
    page += stats_html(replay);
    page += "</section>\n";
  }
  page += "<script type=\"application/json\" id=\"tidepool-data\">" + script_safe(chart_data(replays).dump()) +
          "</script>\n";
  page += kPageScript;
  page += "</body>\n</html>\n";
  return page;
}

}  // namespace tidepool::report
