// The cells of the replay table, shared by the text table and the HTML page
// so both always show the same figures.
#pragma once

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

}  // namespace tidepool::report::detail
