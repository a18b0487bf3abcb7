// The subcommands of the `tidepool` command. Each lives in its own
// tools/<name>_command.cpp and registers itself from a static initializer:
//
//   [[maybe_unused]] static const bool registered = tidepool::cli::register_command(
//       "info", "Show the device and the configuration",
//       [](CLI::App& app) {
//         auto options = std::make_shared<Options>();
//         app.add_flag("--json", options->json, "...");
//         return [options] { return run(*options); };
//       });
//
// main.cpp adds one CLI11 subcommand per registration, lets `setup` declare
// its options on it, and runs the function `setup` returned for the one the
// user chose; its result is the exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "tidepool/config.hpp"
#include "tidepool/error.hpp"

namespace tidepool::cli {

/// Runs a parsed subcommand; returns the process's exit status.
using Run = std::function<int()>;
/// Declares a subcommand's options on `app` and returns what runs it.
using Setup = std::function<Run(CLI::App& app)>;

struct Command {
  std::string name;
  std::string help;
  Setup setup;
};

/// Adds a subcommand. Call from a static initializer; names are unique.
/// Returns true, so that it can initialize a static.
bool register_command(std::string name, std::string help, Setup setup);

/// Every registered subcommand, sorted by name.
std::vector<Command> commands();

/// Exit status of a command that failed on bad input (settings, files).
inline constexpr int kExitFailure = 1;
/// Exit status of a command line that cannot be parsed (unknown subcommand or
/// flag, a missing argument), as getopt-style tools use.
inline constexpr int kExitUsage = 2;

/// Prints "tidepool: error: <message>" to stderr; returns kExitFailure.
int report_error(const Error& error);

/// The configuration from the environment, its warnings printed to stderr
/// as "tidepool: warning: ..."; the error when a variable is invalid.
Expected<Config> load_config(bool print_warnings = true);

}  // namespace tidepool::cli
