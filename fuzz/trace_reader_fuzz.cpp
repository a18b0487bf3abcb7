// Fuzzes every trace reader: none may crash, read out of bounds or hand back
// a trace that breaks the model (summarize() checks every invariant). What a
// reader accepts is then planned (plan_placement): the plan must hold every
// block live at once side by side, or say it cannot.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tidepool/replay.hpp"
#include "tidepool/trace_io.hpp"

namespace tp = tidepool::trace;

static void check(const char* reader, const tidepool::Expected<tp::Trace>& trace) {
  if (!trace) {
    if (!trace.error().message().empty()) return;
    std::fprintf(stderr, "%s refused an input without saying why\n", reader);
    std::abort();
  }
  auto summary = tp::summarize(*trace);
  if (!summary) {
    std::fprintf(stderr, "%s accepted a broken trace: %s\n", reader,
                 summary.error().message().c_str());
    std::abort();
  }
  const auto plan = tp::plan_placement(*trace, {.max_work = std::uint64_t{1} << 20});
  if (!plan || plan->offsets.size() > 2000) return;
  for (std::size_t a = 0; a < plan->offsets.size(); ++a) {
    for (std::size_t b = a + 1; b < plan->offsets.size(); ++b) {
      const bool live_together = b < plan->ends[a];  // a starts first (blocks are numbered as allocated)
      const bool share_bytes = plan->offsets[a] < plan->offsets[b] + plan->bytes[b] &&
                               plan->offsets[b] < plan->offsets[a] + plan->bytes[a];
      if (live_together && share_bytes) {
        std::fprintf(stderr, "%s: the plan overlaps blocks %zu and %zu\n", reader, a, b);
        std::abort();
      }
    }
  }
  if (plan->footprint_bytes < summary->peak_live_bytes) {
    std::fprintf(stderr, "%s: the plan holds less than the peak live\n", reader);
    std::abort();
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  check("read_pytorch_snapshot", tp::read_pytorch_snapshot(input, "fuzz"));
  check("read_rmm_csv", tp::read_rmm_csv(input, "fuzz"));
  check("read_tidepool", tp::read_tidepool(input, "fuzz"));
  check("parse_trace", tp::parse_trace(input, "fuzz"));
  return 0;
}
