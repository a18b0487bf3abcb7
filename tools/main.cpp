// The tidepool command: one subcommand per tools/<name>_command.cpp.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <utility>

#include "command.hpp"

namespace tidepool::cli {
namespace {

// A function-local static: registrations run from other files' static
// initializers, in no particular order.
std::map<std::string, Command>& registry() {
  static std::map<std::string, Command> commands;
  return commands;
}

}  // namespace

bool register_command(std::string name, std::string help, Setup setup) {
  auto [it, inserted] =
      registry().emplace(name, Command{name, std::move(help), std::move(setup)});
  if (!inserted) {
    std::fprintf(stderr, "tidepool: internal error: subcommand '%s' registered twice\n",
                 name.c_str());
    std::exit(kExitFailure);
  }
  return true;
}

std::vector<Command> commands() {
  std::vector<Command> out;
  for (const auto& [name, command] : registry()) out.push_back(command);
  return out;
}

int report_error(const Error& error) {
  std::fprintf(stderr, "tidepool: error: %s\n", error.message().c_str());
  return kExitFailure;
}

Expected<Config> load_config(bool print_warnings) {
  auto config = Config::from_env();
  if (config && print_warnings)
    for (const auto& warning : config->warnings)
      std::fprintf(stderr, "tidepool: warning: %s\n", warning.c_str());
  return config;
}

namespace {

/// A command line that cannot be parsed: the error, the usage line, exit status 2.
int usage_error(CLI::App& app, const std::string& message) {
  std::string command = "tidepool SUBCOMMAND";
  std::string help = "tidepool --help";
  for (const CLI::App* sub : app.get_subcommands()) {
    command = "tidepool " + sub->get_name();
    help = command + " --help";
  }
  std::fprintf(stderr, "tidepool: error: %s\nusage: %s [OPTIONS] ... (see %s)\n", message.c_str(),
               command.c_str(), help.c_str());
  return kExitUsage;
}

}  // namespace
}  // namespace tidepool::cli

int main(int argc, char** argv) {
  using namespace tidepool::cli;
  CLI::App app{
      "tidepool: GPU device memory allocation. Every JAX allocator mode, a pool that grows, "
      "shrinks and does not fragment, and a ledger that shares one device between processes.\n"
      "Configured by the environment (XLA_PYTHON_CLIENT_* and TIDEPOOL_*): see `tidepool info`.",
      "tidepool"};
  app.set_version_flag("--version", "tidepool " TIDEPOOL_VERSION);
  app.require_subcommand(1);

  std::vector<std::pair<CLI::App*, Run>> runs;
  for (const Command& command : commands()) {
    CLI::App* sub = app.add_subcommand(command.name, command.help);
    runs.emplace_back(sub, command.setup(*sub));
  }

  // An unknown subcommand is named (CLI11 would only say an argument was not expected).
  if (argc > 1 && argv[1][0] != '-') {
    const std::string name = argv[1];
    bool known = false;
    std::string names;
    for (const Command& command : commands()) {
      known = known || command.name == name;
      names += (names.empty() ? "" : ", ") + command.name;
    }
    if (!known) {
      return usage_error(app, "unknown subcommand '" + name + "'; the subcommands are " + names);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return app.exit(CLI::CallForHelp());
  } catch (const CLI::CallForAllHelp&) {
    return app.exit(CLI::CallForAllHelp());
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    return usage_error(app, error.what());
  }
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const tidepool::Exception& error) {
      return report_error(error.error());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "tidepool: error: %s\n", error.what());
      return kExitFailure;
    }
  }
  return kExitFailure;  // require_subcommand(1) makes this unreachable
}
