// Fuzzes every trace reader: none may crash, read out of bounds or hand back
// a trace that breaks the model (summarize() checks every invariant).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tidepool/trace_io.hpp"

namespace tp = tidepool::trace;

static void check(const char* reader, const tidepool::Expected<tp::Trace>& trace) {
  if (!trace) {
    if (!trace.error().message().empty()) return;
    std::fprintf(stderr, "%s refused an input without saying why\n", reader);
    std::abort();
  }
  if (auto summary = tp::summarize(*trace); !summary) {
    std::fprintf(stderr, "%s accepted a broken trace: %s\n", reader,
                 summary.error().message().c_str());
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
