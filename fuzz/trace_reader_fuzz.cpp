// Fuzzes every trace reader: none may crash, read out of bounds or hand back
// a trace that breaks the model (summarize() checks every invariant).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tidepool/trace_io.hpp"

namespace tp = tidepool::trace;

static void check(const tidepool::Expected<tp::Trace>& trace) {
  if (!trace) {
    if (trace.error().message().empty()) std::abort();  // every refusal says why
    return;
  }
  if (!tp::summarize(*trace)) std::abort();  // a reader accepted a broken trace
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  check(tp::read_pytorch_snapshot(input, "fuzz"));
  check(tp::read_rmm_csv(input, "fuzz"));
  check(tp::read_tidepool(input, "fuzz"));
  check(tp::parse_trace(input, "fuzz"));
  return 0;
}
