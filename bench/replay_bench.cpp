// Replay speed: events per second of the replay engine's event loop, per
// mode, on the built-in workloads and the real PyTorch snapshots in
// tests/data. The time is the engine's own (replay_ns: the loop over the
// events, not building the device and pool or taking them down), reported
// through manual timing, so items_per_second is events per second.
// Goal: at least 5 million events per second on the pool paths.
//
// <trace>/<mode>/warm times passes 2 to 5 of a five-pass replay through one
// pool (ReplayOptions::passes): the pool once warm, which is what a program
// repeating its steps pays (issue 12's goal: expandable at most 1.3x
// growth's time there). Eight replays an iteration: only the warm passes
// are timed, so a time-based count would replay the cold pass thousands of
// times. Compare modes within one run:
//   replay_bench --benchmark_filter='/(growth|expandable)/warm' --benchmark_repetitions=5
//
// <trace>/pass2 times the second pass of a two-pass replay, expandable and
// growth side by side (each iteration replays both, in turn, through fresh
// pools): the first warm pass, where issue 12 states its goals (`--passes
// 2`, expandable at most 1.3x growth), and where a pool still learning or
// drifting pays for it. <trace>/pass2-aliases: the same with
// TIDEPOOL_ALIASES (the expandable pool's aliases; growth has none). The
// time is expandable's; the counters are each mode's ns per event and their
// ratio. A pass is a millisecond or less on
// most traces here, so take the median of many:
//   replay_bench --benchmark_filter=/pass2 --benchmark_repetitions=9
//     --benchmark_report_aggregates_only=true
// <workload>@1/pass2 is the same on a workload of one step (hundreds to a
// few thousand events a pass, as short as real traces of one training step
// are), for the workloads whose second pass makes no device call there:
// what a pool pays once after its last call weighs most in a short pass.
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

void replay_events(benchmark::State& state, const Trace& trace, Mode mode, bool warm) {
  ReplayOptions options;
  options.max_series_points = 0;
  options.plan = false;  // the trace's plan is not timed, and takes seconds on the largest
  if (warm) {
    options.passes = 5;
    options.config.mem_fraction.value = 1.0;  // as `--passes` is measured: no pass-1 OOM
  }
  std::uint64_t events = 0;
  for (auto _ : state) {
    auto result = replay_mode(trace, mode, options);
    if (!result) {
      state.SkipWithError(result.error().message().c_str());
      return;
    }
    std::uint64_t ns = result->replay_ns, timed_events = result->events;
    if (warm) {
      ns -= result->passes.front().replay_ns;
      timed_events -= result->passes.front().events;
    }
    events += timed_events;
    state.SetIterationTime(static_cast<double>(ns) * 1e-9);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events));
}

void second_pass(benchmark::State& state, const Trace& trace, bool aliases) {
  ReplayOptions options;
  options.max_series_points = 0;
  options.plan = false;
  options.passes = 2;
  options.config.mem_fraction.value = 1.0;
  options.config.aliases.value = aliases;
  double ns[2] = {0, 0}, events[2] = {0, 0};
  for (auto _ : state) {
    for (const int at : {0, 1}) {  // growth, then expandable
      auto result = replay_mode(trace, at == 0 ? Mode::growth : Mode::expandable, options);
      if (!result) {
        state.SkipWithError(result.error().message().c_str());
        return;
      }
      const PassReplay& pass = result->passes.back();
      ns[at] += static_cast<double>(pass.replay_ns);
      events[at] += static_cast<double>(pass.events);
      if (at == 1) state.SetIterationTime(static_cast<double>(pass.replay_ns) * 1e-9);
    }
  }
  state.counters["growth_ns"] = ns[0] / events[0];
  state.counters["expandable_ns"] = ns[1] / events[1];
  state.counters["ratio"] = (ns[1] / events[1]) / (ns[0] / events[0]);
}

std::vector<Trace> one_step_traces() {
  std::vector<Trace> out;
  for (const char* name : {"train-step", "llm-inference", "near-capacity"}) {
    WorkloadOptions options;
    options.steps = 1;
    auto trace = make_workload(name, options);
    if (!trace) throw Exception(trace.error());
    trace->name = std::string(name) + "@1";
    out.push_back(std::move(*trace));
  }
  return out;
}

void register_second_pass(const Trace& trace, benchmark::TimeUnit unit, int iterations) {
  for (const bool aliases : {false, true}) {
    benchmark::RegisterBenchmark((trace.name + (aliases ? "/pass2-aliases" : "/pass2")).c_str(),
                                 [&trace, aliases](benchmark::State& state) { second_pass(state, trace, aliases); })
        ->UseManualTime()
        ->Unit(unit)
        ->Iterations(iterations);
  }
}

}  // namespace

int main(int argc, char** argv) {
  static const std::vector<Trace> all = traces();
  static const std::vector<Trace> short_ones = one_step_traces();
  for (const Trace& trace : short_ones) register_second_pass(trace, benchmark::kMicrosecond, 25);
  for (const Trace& trace : all) {
    register_second_pass(trace, benchmark::kMillisecond, 5);
    for (Mode mode : default_replay_modes()) {
      for (bool warm : {false, true}) {
        auto* bench = benchmark::RegisterBenchmark(
            (trace.name + "/" + std::string(mode_name(mode)) + (warm ? "/warm" : "")).c_str(),
            [&trace, mode, warm](benchmark::State& state) { replay_events(state, trace, mode, warm); });
        bench->UseManualTime()->Unit(benchmark::kMillisecond);
        if (warm) bench->Iterations(8);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
