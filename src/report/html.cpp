// The HTML report: one self-contained page (Chart.js inlined, the data as
// JSON in the page) that works offline. Each trace gets its table and a
// chart of reserved bytes per mode and live bytes over time.
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "report/table_rows.hpp"
#include "tidepool/report.hpp"

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

/// x from the series' start (a trace's times are since the epoch).
Json points(const std::vector<trace::SeriesPoint>& series, bool live) {
  Json xs = Json::array();
  Json ys = Json::array();
  const std::int64_t origin = series.empty() ? 0 : series.front().x;
  for (const trace::SeriesPoint& point : series) {
    xs.push_back(point.x - origin);
    ys.push_back(live ? point.live_bytes : point.reserved_bytes);
  }
  return Json{{"x", std::move(xs)}, {"y", std::move(ys)}};
}

/// What the page script draws: per trace, the x axis label and the lines.
Json chart_data(std::span<const trace::TraceReplay> replays) {
  Json charts = Json::array();
  for (const trace::TraceReplay& replay : replays) {
    Json lines = Json::array();
    for (const trace::ModeReplay& mode : replay.modes) {
      Json line = points(mode.series, false);
      line["label"] = mode_label(mode) + " reserved";
      lines.push_back(std::move(line));
    }
    if (replay.recorded) {
      Json line = points(replay.recorded->series, false);
      line["label"] = replay.recorded->label + " reserved";
      lines.push_back(std::move(line));
    }
    // Live bytes are the trace's, the same under every mode but for OOMs:
    // the first mode's line stands for them.
    if (!replay.modes.empty()) {
      Json line = points(replay.modes.front().series, true);
      line["label"] = "live (requested)";
      line["live"] = true;
      lines.push_back(std::move(line));
    }
    charts.push_back(Json{{"title", replay.trace_name},
                          {"x_label", replay.timed ? "time since the first event (us)" : "event"},
                          {"lines", std::move(lines)}});
  }
  return charts;
}

std::string table_html(const trace::TraceReplay& replay) {
  const detail::TableText table = detail::table_text(replay);
  std::string out = "<p class=\"heading\">" + escape_html(table.heading) + "</p>\n<table>\n";
  for (std::size_t row = 0; row < table.rows.size(); ++row) {
    const char* cell = row == 0 ? "th" : "td";
    out += "<tr>";
    for (const std::string& text : table.rows[row]) {
      out += std::string("<") + cell + ">" + escape_html(text) + "</" + cell + ">";
    }
    out += "</tr>\n";
  }
  out += "</table>\n";
  for (const std::string& note : table.notes) out += "<p class=\"note\">" + escape_html(note) + "</p>\n";
  return out;
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
  var charts = JSON.parse(document.getElementById('tidepool-data').textContent);
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
  charts.forEach(function (chart, index) {
    var datasets = chart.lines.map(function (line, k) {
      var data = line.x.map(function (x, i) { return {x: x, y: line.y[i] / gib}; });
      var colour = line.live ? '#000000' : colours[k % colours.length];
      return {label: line.label, data: data, borderColor: colour, backgroundColor: colour,
              borderWidth: line.live ? 2 : 1.5, borderDash: line.live ? [6, 3] : [],
              pointRadius: 0, stepped: 'after', fill: false};
    });
    new Chart(document.getElementById('chart-' + index), {
      type: 'line',
      data: {datasets: datasets},
      options: {
        animation: false, parsing: false, normalized: true, responsive: true,
        maintainAspectRatio: false, interaction: {mode: 'nearest', intersect: false},
        scales: {x: {type: 'linear', title: {display: true, text: chart.x_label}},
                 y: {beginAtZero: true, title: {display: true, text: 'GiB'}}},
        plugins: {title: {display: true, text: chart.title}, legend: {position: 'bottom'}}
      },
      plugins: [countDrawn]
    });
  });
  document.documentElement.setAttribute('data-charts-expected', String(charts.length));
})();
</script>
)";

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
.heading { font-weight: bold; margin-top: 1.5em; }
.note { color: #a00; font-size: 0.9em; margin: 0.2em 0; }
.chart { position: relative; height: 420px; max-width: 1200px; }
</style>
)";

}  // namespace

Expected<std::string> replay_html(std::span<const trace::TraceReplay> replays, const HtmlOptions& options) {
  std::ifstream in(options.chart_js_path, std::ios::binary);
  if (!in) {
    return Error(Errc::io_error, "cannot read Chart.js from '" + options.chart_js_path +
                                     "': " + std::strerror(errno) +
                                     " (Debian's libjs-chart.js installs it; scripts/install-deps)");
  }
  std::ostringstream chart_js;
  chart_js << in.rdbuf();

  std::string page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                     escape_html(options.title) + "</title>\n";
  page += kStyle;
  page += kErrorCounter;
  page += "<script>\n" + chart_js.str() + "\n</script>\n</head>\n<body>\n";
  page += "<h1>" + escape_html(options.title) + "</h1>\n";
  for (std::size_t index = 0; index < replays.size(); ++index) {
    page += table_html(replays[index]);
    page += "<div class=\"chart\"><canvas id=\"chart-" + std::to_string(index) + "\"></canvas></div>\n";
  }
  page += "<script type=\"application/json\" id=\"tidepool-data\">" + script_safe(chart_data(replays).dump()) +
          "</script>\n";
  page += kPageScript;
  page += "</body>\n</html>\n";
  return page;
}

}  // namespace tidepool::report
