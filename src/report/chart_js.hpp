// Chart.js (Debian's libjs-chart.js, UMD build), embedded into the report
// layer at build time by cmake/EmbedFile.cmake: the HTML report inlines it,
// so the installed command reads nothing from /usr/share at run time.
#pragma once

#include <cstddef>

namespace tidepool::report::detail {

extern const unsigned char kChartJs[];    // kChartJsSize bytes, then a 0
extern const std::size_t kChartJsSize;

}  // namespace tidepool::report::detail
