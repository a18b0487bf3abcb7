// What `tidepool replay` and `tidepool compare` share: their options and the
// run that replays traces, prints the tables and writes the reports.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tidepool/workloads.hpp"

namespace tidepool::cli {

struct ReplayCommandOptions {
  std::vector<std::string> traces;     // trace files
  std::vector<std::string> workloads;  // built-in workloads (compare)
  trace::WorkloadOptions workload;     // their seed and size (compare)
  std::string modes;                   // comma-separated; empty: every mode this build runs
  std::string capacity;                // e.g. "80GiB"; empty: the trace's, else 80 GiB
  std::string device = "all";          // a snapshot's device index, or "all"
  bool min_capacity = false;
  bool verify = false;
  std::string json_path;               // "-": standard output (as for the two below)
  std::string html_path;
  std::string perfetto_path;
  bool quiet = false;
  bool stats = false;                  // also print each pool's stats, side by side
  std::uint32_t passes = 1;            // replays of each trace through the same pool
};

/// Declares the options both subcommands share on `app`.
void add_replay_options(CLI::App& app, ReplayCommandOptions& options);

/// Replays every trace (read from its file) and every named workload, prints
/// a table per trace unless quiet, and writes the reports asked for. Returns
/// the exit status: 0, or kExitFailure with the error printed.
int run_replay_command(const ReplayCommandOptions& options);

}  // namespace tidepool::cli
