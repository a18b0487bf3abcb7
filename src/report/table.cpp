// The replay table: one row per mode, sizes in binary units, ratios as
// multiples of the trace's peak live bytes, host time in ns/op.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "report/table_rows.hpp"
#include "tidepool/report.hpp"
#include "tidepool/units.hpp"

namespace tidepool::report {
namespace {

std::string bytes_text(std::uint64_t bytes) { return format_bytes(static_cast<std::size_t>(bytes)); }

std::string ratio_text(double ratio) { return ratio > 0 ? fmt::format("{:.2f}x", ratio) : "-"; }

/// The first line of a possibly multi-line message.
std::string_view first_line(std::string_view text) { return text.substr(0, text.find('\n')); }

/// The rows as lines of cells two spaces apart, each column as wide as its
/// widest cell: the columns whose bit is set in `left` left-aligned (names),
/// the others right-aligned (figures).
std::string aligned(const std::vector<std::vector<std::string>>& rows, std::uint32_t left = 1) {
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t column = 0; column < row.size(); ++column) widths[column] = std::max(widths[column], row[column].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (std::size_t column = 0; column < row.size(); ++column) {
      if (column > 0) out += "  ";
      out += (left >> column & 1) != 0 ? fmt::format("{:<{}}", row[column], widths[column])
                                       : fmt::format("{:>{}}", row[column], widths[column]);
    }
    out += "\n";
  }
  return out;
}

/// A pass's device calls as "c12 m14 u2", or "0".
std::string calls_text(const trace::DeviceCalls& calls) {
  std::string text;
  for (const auto& [letter, count] : {std::pair{'a', calls.allocs}, {'f', calls.frees}, {'c', calls.creates},
                                      {'r', calls.releases}, {'m', calls.maps}, {'u', calls.unmaps},
                                      {'s', calls.syncs}, {'q', calls.queries}}) {
    if (count == 0) continue;
    if (!text.empty()) text += ' ';
    text += fmt::format("{}{}", letter, count);
  }
  return text.empty() ? "0" : text;
}

}  // namespace

std::string mode_label(const trace::ModeReplay& mode) { return std::string(mode_name(mode.mode)); }

namespace detail {

TableText table_text(const trace::TraceReplay& replay) {
  TableText table;
  const std::size_t capacity = replay.modes.empty() ? 0 : replay.modes.front().capacity_bytes;
  table.heading = fmt::format("{} ({}): {} events, {} blocks", replay.trace_name,
                              replay.trace_format, replay.events, replay.blocks);
  if (replay.seeded_blocks != 0) {
    table.heading += fmt::format(" ({} live at the start: {}, seeded)", replay.seeded_blocks,
                                 bytes_text(replay.seeded_bytes));
  }
  table.heading += fmt::format("; device {}, fraction {:.2f}; peak live {}", bytes_text(capacity),
                               replay.mem_fraction, bytes_text(replay.peak_live_bytes));
  if (replay.planned_footprint_bytes && replay.peak_live_bytes != 0) {
    table.heading += fmt::format(" (planned: {}, {:.3f}x)", bytes_text(*replay.planned_footprint_bytes),
                                 static_cast<double>(*replay.planned_footprint_bytes) /
                                     static_cast<double>(replay.peak_live_bytes));
  }
  // With several passes, device calls and ns/op are the last pass's: the warm pool.
  const std::size_t passes = replay.modes.empty() ? 1 : replay.modes.front().passes.size();
  if (passes > 1) {
    table.heading += fmt::format("; {} passes, device calls and ns/op of the last", passes);
  }
  table.rows.push_back({"mode", "peak reserved", "avg reserved", "reserved/live", "high-water",
                        "min capacity (x live)", "min limit (x live)", "dev allocs", "dev frees", "maps", "unmaps",
                        "syncs", "queries", "OOMs", "ns/op"});
  for (const trace::ModeReplay& mode : replay.modes) {
    const bool warm = mode.passes.size() > 1;
    const trace::DeviceCalls& calls = warm ? mode.passes.back().device_calls : mode.device_calls;
    const double ns_per_op = warm ? mode.passes.back().ns_per_op() : mode.ns_per_op();
    table.rows.push_back({
        mode_label(mode),
        bytes_text(mode.peak_reserved_bytes),
        bytes_text(static_cast<std::uint64_t>(mode.average_reserved_bytes)),
        ratio_text(mode.fragmentation),
        mode.address_high_water_bytes ? bytes_text(*mode.address_high_water_bytes) : "-",
        mode.min_capacity_bytes ? fmt::format("{} ({:.2f}x)", bytes_text(*mode.min_capacity_bytes),
                                              mode.min_capacity_ratio())
                                : "-",
        mode.min_limit_bytes ? fmt::format("{} ({:.2f}x)", bytes_text(*mode.min_limit_bytes),
                                           mode.min_limit_ratio())
                             : "-",
        std::to_string(calls.allocs + calls.creates),
        std::to_string(calls.frees + calls.releases),
        std::to_string(calls.maps),
        std::to_string(calls.unmaps),
        std::to_string(calls.syncs),
        std::to_string(calls.queries),
        std::to_string(mode.ooms),
        fmt::format("{:.1f}", ns_per_op),
    });
  }
  if (replay.recorded) {
    const trace::RecordedReplay& recorded = *replay.recorded;
    table.rows.push_back({recorded.label, bytes_text(recorded.peak_reserved_bytes),
                          bytes_text(static_cast<std::uint64_t>(recorded.average_reserved_bytes)),
                          ratio_text(recorded.fragmentation), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                          std::to_string(replay.failed_allocs), "-"});
  }
  if (replay.failed_allocs != 0) {
    std::string note = fmt::format("recorded: {} allocation{} failed in the recorded program",
                                   replay.failed_allocs, replay.failed_allocs == 1 ? "" : "s");
    if (!replay.failures.empty()) {
      const trace::OomMark& first = replay.failures.front();
      note += fmt::format("; the first of {} at {} {}", bytes_text(first.bytes),
                          replay.timed ? "time_us" : "event", first.x);
    }
    table.notes.push_back(std::move(note));
  }
  for (const trace::ModeReplay& mode : replay.modes) {
    if (!mode.first_oom) continue;
    const trace::FirstOom& oom = *mode.first_oom;
    table.notes.push_back(fmt::format("{}: {} OOM{}; the first at event {} (block {}, {}): {}",
                                      mode_label(mode), mode.ooms, mode.ooms == 1 ? "" : "s",
                                      oom.event_index, oom.block, bytes_text(oom.requested_bytes),
                                      first_line(oom.message)));
    table.notes.push_back(fmt::format("{}: served a peak live of {} of the trace's {}", mode_label(mode),
                                      bytes_text(mode.served_peak_live_bytes), bytes_text(replay.peak_live_bytes)));
  }
  return table;
}

}  // namespace detail

std::string replay_table(const trace::TraceReplay& replay) {
  const detail::TableText table = detail::table_text(replay);
  std::string out = table.heading + "\n" + aligned(table.rows);  // the mode's name left, figures right
  for (const std::string& note : table.notes) out += "  " + note + "\n";
  return out;
}

namespace detail {

std::int64_t series_origin(const trace::TraceReplay& replay) {
  for (const trace::ModeReplay& mode : replay.modes) {
    if (!mode.series.empty()) return mode.series.front().x;
  }
  if (replay.recorded && !replay.recorded->series.empty()) return replay.recorded->series.front().x;
  return 0;
}

std::vector<std::vector<std::string>> stats_rows(const trace::TraceReplay& replay) {
  if (replay.modes.empty()) return {};
  // One row per counter (JAX's memory_stats() names first), one column per mode.
  std::vector<std::vector<std::string>> rows = {{"stat"}};
  for (const trace::ModeReplay& mode : replay.modes) rows.front().push_back(mode_label(mode));
  const auto names = replay.modes.front().stats.items();
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::vector<std::string> row = {std::string(names[i].first)};
    for (const trace::ModeReplay& mode : replay.modes) row.push_back(std::to_string(mode.stats.items()[i].second));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::vector<std::string>> passes_rows(const trace::TraceReplay& replay) {
  const std::size_t passes = replay.modes.empty() ? 0 : replay.modes.front().passes.size();
  if (passes < 2) return {};
  std::vector<std::vector<std::string>> rows = {{"mode", "pass", "device calls", "ns/op", "peak reserved", "OOMs"}};
  for (const trace::ModeReplay& mode : replay.modes) {
    for (std::size_t pass = 0; pass < mode.passes.size(); ++pass) {
      const trace::PassReplay& one = mode.passes[pass];
      rows.push_back({pass == 0 ? mode_label(mode) : "", std::to_string(pass + 1), calls_text(one.device_calls),
                      fmt::format("{:.1f}", one.ns_per_op()), bytes_text(one.peak_reserved_bytes),
                      std::to_string(one.ooms)});
    }
  }
  return rows;
}

}  // namespace detail

std::string passes_table(const trace::TraceReplay& replay) {
  const std::vector<std::vector<std::string>> rows = detail::passes_rows(replay);
  if (rows.empty()) return {};
  return replay.trace_name + ": each pass (" + detail::kCallLetters + ")\n" + aligned(rows, 0b101);  // mode, calls
}

std::string stats_table(const trace::TraceReplay& replay) {
  const std::vector<std::vector<std::string>> rows = detail::stats_rows(replay);
  if (rows.empty()) return {};
  return replay.trace_name + ": each pool's stats after the last event (memory_stats() names)\n" + aligned(rows);
}

}  // namespace tidepool::report
