// `tidepool run [--quota 40%] [--ledger NAME] [--record FILE] [--pool MODE]
// -- COMMAND...`: runs an unmodified program with the interposer
// (libtidepool_preload.so) preloaded, so that its CUDA driver allocations are
// accounted in the cross-process ledger under its quota, cuMemGetInfo reports
// the quota as the device, --record writes them to a trace and --pool serves
// cuMemAlloc_v2 from a tidepool pool. docs/interop.md.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "command.hpp"
#include "tidepool/config.hpp"
#include "tidepool/trace_io.hpp"

namespace tidepool::cli {
namespace {

constexpr const char* kPreloadName = "libtidepool_preload.so";

struct RunOptions {
  std::string quota;
  std::string ledger;
  std::string preload;
  std::string record;
  std::string pool;
  std::vector<std::string> command;
};

/// The interposer: --preload, else next to the command once installed
/// (<prefix>/bin/tidepool -> <prefix>/lib/), else the build tree's.
Expected<std::string> find_preload(const std::string& given) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (!given.empty()) {
    candidates.push_back(given);
  } else {
    std::error_code error;
    const fs::path self = fs::read_symlink("/proc/self/exe", error);
    if (!error) {
      candidates.push_back(self.parent_path().parent_path() / "lib" / kPreloadName);
      candidates.push_back(self.parent_path() / kPreloadName);
    }
#ifdef TIDEPOOL_PRELOAD_BUILD_PATH
    candidates.push_back(TIDEPOOL_PRELOAD_BUILD_PATH);
#endif
  }
  std::string tried;
  for (const fs::path& candidate : candidates) {
    if (::access(candidate.c_str(), R_OK) == 0) return fs::absolute(candidate).string();
    tried += (tried.empty() ? "" : ", ") + candidate.string();
  }
  return Error(Errc::io_error, std::string("the interposer ") + kPreloadName + " was not found (tried " +
                                   (tried.empty() ? std::string("nothing") : tried) +
                                   "); pass its path with --preload");
}

Status set_variable(const char* name, const std::string& value) {
  if (::setenv(name, value.c_str(), 1) != 0)
    return Error(Errc::io_error, std::string("setenv ") + name + ": " + std::strerror(errno));
  return {};
}

/// `name=value` unless the user set `name`; says which on stderr (once
/// per name: --pool and --record both ask for the platform allocator).
Status set_unless_given(const char* name, const char* value, const char* why) {
  static std::set<std::string> done;
  if (!done.insert(name).second) return {};
  if (const char* given = std::getenv(name); given != nullptr) {
    std::fprintf(stderr, "tidepool: %s=%s is kept as you set it (tidepool would set %s: %s)\n", name, given, value,
                 why);
    return {};
  }
  std::fprintf(stderr, "tidepool: setting %s=%s (%s)\n", name, value, why);
  return set_variable(name, value);
}

/// --record FILE: the interposer writes FILE in the program (this process
/// becomes it: TIDEPOOL_RUN_PID) and FILE.PID in the processes it starts.
/// The frameworks are asked to allocate each buffer from the driver.
Status prepare_record(const std::string& file) {
  const std::string path = std::filesystem::absolute(file).string();  // the program may change directory
  // An empty trace until the program writes its own: a program that
  // allocates nothing (or a launcher whose children do) still leaves one.
  trace::Trace empty;
  empty.name = path;
  empty.format = "cuda-driver";
  if (Status written = trace::write_tidepool_file(empty, file); !written)
    return Error(Errc::io_error, "--record '" + file + "': cannot write it: " + written.error().message());
  if (Status set = set_variable("TIDEPOOL_RECORD", path); !set) return set;
  const char* per_buffer = "so that the trace holds each buffer, not the framework's pool";
  if (Status set = set_unless_given("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", per_buffer); !set) return set;
  return set_unless_given("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", per_buffer);
}

/// --pool MODE: the interposer serves cuMemAlloc_v2 from a pool of MODE;
/// JAX is asked to send it each buffer.
Status prepare_pool(const std::string& name) {
  auto mode = parse_mode(name);
  if (!mode) return Error(Errc::invalid_argument, "--pool: " + mode.error().message());
  if (*mode == Mode::cuda_async)
    return Error(Errc::invalid_argument, "--pool cuda_async: the driver's own pool cannot serve cuMemAlloc_v2; "
                                         "allowed: preallocate, growth, platform, expandable");
  if (Status set = set_variable("TIDEPOOL_POOL", name); !set) return set;
  return set_unless_given("XLA_PYTHON_CLIENT_ALLOCATOR", "platform",
                          "so that JAX asks the driver, and so the pool, for each buffer");
}

int run(const RunOptions& options) {
  if (!options.quota.empty()) {
    if (Status set = set_variable("TIDEPOOL_QUOTA", options.quota); !set) return report_error(set.error());
  }
  if (!options.ledger.empty()) {
    if (Status set = set_variable("TIDEPOOL_LEDGER_NAME", options.ledger); !set) return report_error(set.error());
  }
  // The interposer reads the configuration (the quota, the ledger's name and
  // mode) with the one parser: check it here, before the program starts, and
  // say which option a refusal is about.
  if (auto config = Config::from_env(); !config) {
    const std::string& message = config.error().message();
    std::string option;
    if (!options.quota.empty() && message.find("TIDEPOOL_QUOTA") != std::string::npos) option = "--quota: ";
    if (!options.ledger.empty() && message.find("TIDEPOOL_LEDGER_NAME") != std::string::npos)
      option = "--ledger '" + options.ledger + "': ";
    return report_error(Error(config.error().code(), option + message));
  }
  auto preload = find_preload(options.preload);
  if (!preload) return report_error(preload.error());
  // The program is this process once it execs: its files are FILE, not FILE.PID.
  if (Status set = set_variable("TIDEPOOL_RUN_PID", std::to_string(::getpid())); !set)
    return report_error(set.error());
  if (!options.pool.empty()) {
    if (Status prepared = prepare_pool(options.pool); !prepared) return report_error(prepared.error());
  }
  if (!options.record.empty()) {
    if (Status prepared = prepare_record(options.record); !prepared) return report_error(prepared.error());
  }
  std::string preloads = *preload;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing != nullptr && *existing != '\0')
    preloads += std::string(":") + existing;
  if (Status set = set_variable("LD_PRELOAD", preloads); !set) return report_error(set.error());

  std::vector<char*> argv;
  for (const std::string& word : options.command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "tidepool: error: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  return 127;  // as a shell says for a command it cannot run
}

[[maybe_unused]] const bool registered = register_command(
    "run",
    "Run a program with its CUDA allocations accounted in the ledger under a quota, recorded to a trace "
    "(--record) or served by a tidepool pool (--pool)",
    [](CLI::App& app) {
      auto options = std::make_shared<RunOptions>();
      app.add_option("--quota", options->quota,
                     "This process's share of the device: 40%, 0.4 or 20GiB (TIDEPOOL_QUOTA). The program "
                     "sees it as the device's total memory, and allocations beyond it fail with "
                     "CUDA_ERROR_OUT_OF_MEMORY");
      app.add_option("--ledger", options->ledger,
                     "The ledger segment's name (default: one per GPU, shared with every tidepool "
                     "process); processes share memory only within one ledger");
      app.add_option("--record", options->record,
                     "Write every device allocation and free the program makes to FILE, in tidepool's trace "
                     "format (tidepool replay FILE compares the modes on it); other processes it starts write "
                     "FILE.PID. Sets XLA_PYTHON_CLIENT_ALLOCATOR=platform and PYTORCH_NO_CUDA_MEMORY_CACHING=1 "
                     "unless set")
          ->type_name("FILE");
      app.add_option("--pool", options->pool,
                     "Serve the program's cuMemAlloc_v2/cuMemFree_v2 from a tidepool pool of MODE (expandable, "
                     "growth, preallocate, platform) over the driver's calls, in the ledger under the quota; "
                     "at exit it says the pool's figures (TIDEPOOL_REPORT=FILE writes them as JSON). Sets "
                     "XLA_PYTHON_CLIENT_ALLOCATOR=platform unless set")
          ->type_name("MODE");
      app.add_option("--preload", options->preload, "The interposer library (default: found beside tidepool)");
      app.add_option("command", options->command, "The program and its arguments, after --")->required();
      app.footer("Examples: tidepool run --quota 45% -- python train.py\n"
                 "          tidepool run --record train.trace -- python train.py; tidepool replay train.trace\n"
                 "          tidepool run --pool expandable --quota 40% -- python train.py");
      return [options] { return run(*options); };
    });

}  // namespace
}  // namespace tidepool::cli
