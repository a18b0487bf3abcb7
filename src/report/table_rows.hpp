// The cells of the replay table, shared by the text table and the HTML page
// so both always show the same figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tidepool/replay.hpp"

namespace tidepool::report::detail {

struct TableText {
  std::string heading;                          // trace, events, device, peak live
  std::vector<std::vector<std::string>> rows;   // rows[0] is the column headers
  std::vector<std::string> notes;               // one per mode with OOMs: the first one
};

TableText table_text(const trace::TraceReplay& replay);

/// The x of the trace's first event, where every series starts: reports
/// draw x relative to it (a trace's times are since the epoch).
std::int64_t series_origin(const trace::TraceReplay& replay);

/// Each mode's pool stats after the last event: rows[0] is "stat" and the
/// modes, then one row per Stats::items() counter. Empty without modes.
std::vector<std::vector<std::string>> stats_rows(const trace::TraceReplay& replay);

/// With several passes, one row per pass of each mode (rows[0]: "mode",
/// "pass", "device calls", "ns/op", "peak reserved", "OOMs"); empty for one.
std::vector<std::vector<std::string>> passes_rows(const trace::TraceReplay& replay);
/// What the letters of a pass's device calls stand for.
inline constexpr const char* kCallLetters =
    "device calls: a allocs, f frees, c creates, r releases, m maps, u unmaps, s syncs, q queries";

}  // namespace tidepool::report::detail
