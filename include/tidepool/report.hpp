// Replays as people and programs read them: a text table, JSON (every
// figure, names documented in docs/replay.md), Chrome/Perfetto trace events
// (counter tracks of live and reserved bytes per mode, OOM instants, block
// lifetimes) and one self-contained HTML page (Chart.js embedded).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include <cstddef>
#include <optional>

#include "tidepool/error.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/replay.hpp"

namespace tidepool::report {

/// The label of a replay row: the mode's name ("growth", ...).
std::string mode_label(const trace::ModeReplay& mode);

/// One trace's replay as a text table: a heading line naming the trace, its
/// events, the device and the peak live bytes, then one row per mode and the
/// recorded row where there is one. Sizes in binary units, ratios as "1.23x",
/// host time in ns/op. Ends with a newline.
std::string replay_table(const trace::TraceReplay& replay);
/// With several passes (ReplayOptions::passes), one row per pass of each
/// mode: the device calls made during it ("c12 m14 u2", a letter each for
/// allocs, frees, creates, releases, maps, unmaps, syncs and queries; "0" for
/// none), its ns/op, peak reserved and OOMs. Empty for a single pass. Ends
/// with a newline.
std::string passes_table(const trace::TraceReplay& replay);
/// Each mode's pool stats after the last event, side by side: one row per
/// Stats::items() counter (JAX's memory_stats() names first), one column per mode.
std::string stats_table(const trace::TraceReplay& replay);

/// Every figure of every replay as one JSON document (docs/replay.md names
/// each field). Field order is stable.
std::string replay_json(std::span<const trace::TraceReplay> replays);

/// A ledger snapshot as `tidepool ledger --json` prints it: the segment's
/// figures, "processes" (one object per entry) and "totals", from the
/// snapshot's for_each_figure lists; "reclaimed_now" when given. Indented.
std::string ledger_json(const LedgerSnapshot& snapshot, std::optional<std::size_t> reclaimed_now = std::nullopt);

/// Chrome trace-event JSON (the "JSON Object Format": {"traceEvents": [...]})
/// with one process per trace and mode, named "<trace> / <mode>", holding
/// the counter tracks "live" and "reserved" ("ph": "C", args {"bytes": N})
/// from the downsampled series. Timestamps are the trace's microseconds, or
/// one microsecond per event for traces with no times. Opens in
/// ui.perfetto.dev and chrome://tracing.
std::string perfetto_json(std::span<const trace::TraceReplay> replays);

struct HtmlOptions {
  std::string title = "tidepool replay";
};

/// One self-contained HTML page that answers "why", as PyTorch's memory_viz
/// does: per trace the table; reserved bytes per mode and live bytes over
/// time, with each mode's OOMs and the recorded program's failures at their
/// place; reserved / live over time; the largest blocks live at the peak
/// with their stack frames; the recorder's settings; each pool's stats. A
/// logarithmic toggle and drag-to-zoom. Works offline: Chart.js is embedded
/// into the library at build time (libjs-chart.js) and inlined. When every
/// chart has drawn, the page sets data-charts-rendered="N" on <html> (two
/// charts per trace); any script error is counted in data-script-errors
/// (what the headless-browser test reads). Errors: unsupported when this
/// build has no Chart.js.
Expected<std::string> replay_html(std::span<const trace::TraceReplay> replays,
                                  const HtmlOptions& options = {});

/// Writes `text` to `path`, replacing it. io_error naming the path and the reason.
Status write_file(const std::string& path, std::string_view text);

}  // namespace tidepool::report
