// Replay speed: events per second of the replay engine's event loop, per
// mode, on the built-in workloads and the real PyTorch snapshots in
// tests/data. The time is the engine's own (replay_ns: the loop over the
// events, not building the device and pool or taking them down), reported
// through manual timing, so items_per_second is events per second.
// Goal: at least 5 million events per second on the pool paths.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "tidepool/replay.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/workloads.hpp"

namespace {

using namespace tidepool;
using namespace tidepool::trace;

std::vector<Trace> traces() {
  std::vector<Trace> out;
  for (const WorkloadInfo& info : workloads()) {
    auto trace = make_workload(info.name);
    if (!trace) throw Exception(trace.error());
    out.push_back(std::move(*trace));
  }
  for (const char* name : {"cs336-magma27.pickle", "cs336-bcrafton.pickle"}) {
    auto trace = read_trace(std::string(TIDEPOOL_TEST_DATA) + "/pytorch/" + name);
    if (!trace) throw Exception(trace.error());
    out.push_back(std::move(*trace));
  }
  return out;
}

void replay_events(benchmark::State& state, const Trace& trace, Mode mode) {
  ReplayOptions options;
  options.max_series_points = 0;
  std::uint64_t events = 0;
  for (auto _ : state) {
    auto result = replay_mode(trace, mode, options);
    if (!result) {
      state.SkipWithError(result.error().message().c_str());
      return;
    }
    events += result->events;
    state.SetIterationTime(static_cast<double>(result->replay_ns) * 1e-9);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events));
}

}  // namespace

int main(int argc, char** argv) {
  static const std::vector<Trace> all = traces();
  for (const Trace& trace : all) {
    for (Mode mode : default_replay_modes()) {
      benchmark::RegisterBenchmark((trace.name + "/" + std::string(mode_name(mode))).c_str(),
                                   [&trace, mode](benchmark::State& state) { replay_events(state, trace, mode); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
