// `tidepool compare`: the README's main command. With no trace it replays
// every built-in workload under every mode; it also takes trace files and
// named workloads. The run is replay's (replay_command.cpp).
#include <memory>
#include <string>

#include "command.hpp"
#include "replay_command.hpp"
#include "tidepool/workloads.hpp"

namespace tidepool::cli {
namespace {

const bool registered = register_command(
    "compare", "Compare every allocation mode on the built-in workloads (or on traces)",
    [](CLI::App& app) -> Run {
      auto options = std::make_shared<ReplayCommandOptions>();
      app.add_option("traces", options->traces, "Trace files to compare as well");
      std::string workload_names;
      for (const trace::WorkloadInfo& workload : trace::workloads()) {
        if (!workload_names.empty()) workload_names += ",";
        workload_names += std::string(workload.name);
      }
      app.add_option("--workloads", options->workloads,
                     "Built-in workloads to replay (" + workload_names +
                         "); default: all of them when no trace is given")
          ->delimiter(',');
      app.add_option("--seed", options->workload.seed,
                     "Seed of the built-in workloads' random choices (sizes, lengths, lifetimes); default 1");
      std::string sizes;
      for (const trace::WorkloadInfo& workload : trace::workloads()) {
        sizes += (sizes.empty() ? "" : ", ") + std::string(workload.name) + " " +
                 std::to_string(workload.default_steps) + " " + std::string(workload.steps_are);
      }
      app.add_option("--steps", options->workload.steps,
                     "Size of each built-in workload, in its own steps, at most " +
                         std::to_string(trace::kMaxStepsFactor) + " times its default (" + sizes + ")");
      add_replay_options(app, *options);
      return [options] {
        ReplayCommandOptions run = *options;
        if (run.traces.empty() && run.workloads.empty()) {
          for (const trace::WorkloadInfo& workload : trace::workloads())
            run.workloads.emplace_back(workload.name);
        }
        return run_replay_command(run);
      };
    });

}  // namespace
}  // namespace tidepool::cli
