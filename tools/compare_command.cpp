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
