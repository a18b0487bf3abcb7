// `tidepool replay TRACE...`: replays traces under every mode and prints a
// table per trace; --json, --html and --perfetto write the reports. The run
// itself is shared with `tidepool compare` (compare_command.cpp).
#include "replay_command.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "command.hpp"
#include "tidepool/replay.hpp"
#include "tidepool/report.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "tidepool/workloads.hpp"

namespace tidepool::cli {
namespace {

/// A one-line progress bar on stderr, drawn only on a terminal and only once
/// a replay has run for a moment, so short replays and pipes stay quiet.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO) == 1) {}
  ~ProgressBar() { clear(); }

  /// Starts the bar for the next trace.
  void begin(std::string label) {
    clear();
    label_ = std::move(label);
    started_ = std::chrono::steady_clock::now();
  }
  void update(std::uint64_t done, std::uint64_t total) {
    if (!enabled_ || total == 0) return;
    if (std::chrono::steady_clock::now() - started_ < std::chrono::milliseconds(300)) return;
    constexpr int kWidth = 30;
    const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<int>(fraction * 100));
    std::fflush(stderr);
    drawn_ = true;
  }
  void clear() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string label_;
  std::chrono::steady_clock::time_point started_;
};

Expected<std::vector<Mode>> parse_modes(const std::string& text) {
  if (text.empty()) return trace::default_replay_modes();
  std::vector<Mode> modes;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    auto mode = parse_mode(name);
    if (!mode) {
      return Error(Errc::invalid_argument, "--modes: " + mode.error().message());
    }
    modes.push_back(*mode);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return modes;
}

/// --device: "all" (every device of a snapshot: -1) or a device index.
Expected<int> parse_device(const std::string& text) {
  if (text == "all") return -1;
  int device = 0;
  const auto [end, failed] = std::from_chars(text.data(), text.data() + text.size(), device);
  if (failed != std::errc{} || end != text.data() + text.size() || device < 0 || text.empty()) {
    return Error(Errc::invalid_argument,
                 "--device '" + text + "': allowed: a device index (0, 1, ...) or 'all'");
  }
  return device;
}

/// The traces to replay, in order: the files (a snapshot gives one trace per
/// device asked for), then the built-in workloads.
Expected<std::vector<trace::Trace>> load_traces(const ReplayCommandOptions& options, int device) {
  trace::ReadOptions read_options;
  read_options.snapshot.device = device;
  std::vector<trace::Trace> traces;
  for (const std::string& path : options.traces) {
    auto loaded = trace::read_traces(path, read_options);
    if (!loaded) {
      const std::string& message = loaded.error().message();
      // Readers name the file; say which argument it was when one does not.
      if (message.find(path) != std::string::npos) return std::move(loaded).error();
      return Error(loaded.error().code(), "cannot read trace '" + path + "': " + message);
    }
    for (trace::Trace& one : *loaded) traces.push_back(std::move(one));
  }
  for (const std::string& name : options.workloads) {
    auto made = trace::make_workload(name, options.workload);
    if (!made) return std::move(made).error();
    // Named apart from the default one (a table, a report, a JSON key).
    if (options.workload.seed != trace::WorkloadOptions{}.seed) made->name += " seed " + std::to_string(options.workload.seed);
    if (options.workload.steps != 0) made->name += " steps " + std::to_string(options.workload.steps);
    traces.push_back(std::move(*made));
  }
  return traces;
}

/// A report's destination: a file, or standard output for "-".
struct Output {
  const char* flag;
  const std::string& path;
};

/// Fails before any replay when a report could not be written: two reports
/// to standard output, a folder, a file that cannot be created.
Status check_outputs(std::span<const Output> outputs) {
  const char* to_stdout = nullptr;
  for (const Output& output : outputs) {
    if (output.path.empty()) continue;
    if (output.path == "-") {
      if (to_stdout != nullptr) {
        return Error(Errc::invalid_argument, std::string(to_stdout) + " and " + output.flag +
                                                 " both write to standard output ('-'); allowed: one of them");
      }
      to_stdout = output.flag;
      continue;
    }
    std::error_code error;
    if (std::filesystem::is_directory(output.path, error)) {
      return Error(Errc::io_error, std::string(output.flag) + " " + output.path + ": is a folder, not a file");
    }
    const bool existed = std::filesystem::exists(output.path, error);
    std::FILE* file = std::fopen(output.path.c_str(), "a");
    if (file == nullptr) {
      return Error(Errc::io_error, std::string(output.flag) + " " + output.path + ": cannot be written: " +
                                       std::strerror(errno));
    }
    std::fclose(file);
    if (!existed) std::filesystem::remove(output.path, error);
  }
  return {};
}

/// Writes a report to its file, or to standard output for "-".
Status write_output(const std::string& path, std::string_view text) {
  if (path != "-") return report::write_file(path, text);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (std::fflush(stdout) != 0) return Error(Errc::io_error, "cannot write to standard output");
  return {};
}

}  // namespace

void add_replay_options(CLI::App& app, ReplayCommandOptions& options) {
  app.add_option("--modes", options.modes,
                 "Comma-separated modes (preallocate,growth,platform,expandable,cuda_async); "
                 "default: every mode this build can replay on the host device");
  app.add_option("--capacity", options.capacity,
                 "Device capacity to replay on, e.g. 80GiB (default: the trace's recorded device, "
                 "else 80GiB)");
  app.add_option("--device", options.device,
                 "A snapshot's device to replay: its index, or 'all' (each device with events "
                 "becomes a trace named FILE:devN)")
      ->default_str("all");
  app.add_flag("--min-capacity", options.min_capacity,
               "Also find, per mode, the smallest capacity and the smallest limit (at fraction 1) "
               "with no OOM (bisection)");
  app.add_flag("--verify", options.verify,
               "Write a pattern into every block and check it at its free (uses real memory)");
  app.add_option("--json", options.json_path, "Write every figure as JSON to FILE ('-': standard output)");
  app.add_option("--html", options.html_path,
                 "Write a self-contained HTML report to FILE ('-': standard output)");
  app.add_option("--perfetto", options.perfetto_path,
                 "Write Chrome/Perfetto trace events (live and reserved counters, OOMs) to FILE "
                 "('-': standard output)");
  app.add_option("--passes", options.passes,
                 "Replay each trace N times through the same pool, freeing what is still live between "
                 "passes; the table shows the last pass's device calls and ns/op (the warm pool)")
      ->check(CLI::Range(std::uint32_t{1}, trace::kMaxPasses));
  app.add_flag("-q,--quiet", options.quiet, "Print no table and no progress, only errors");
  app.add_flag("--stats", options.stats,
               "Also print each pool's stats after the last event, side by side (memory_stats() names)");
}

int run_replay_command(const ReplayCommandOptions& options) {
  auto config = load_config(!options.quiet);
  if (!config) return report_error(config.error());
  auto modes = parse_modes(options.modes);
  if (!modes) return report_error(modes.error());

  auto device = parse_device(options.device);
  if (!device) return report_error(device.error());
  const Output outputs[] = {{"--json", options.json_path},
                            {"--perfetto", options.perfetto_path},
                            {"--html", options.html_path}};
  if (Status checked = check_outputs(outputs); !checked) return report_error(checked.error());
  // A report on standard output leaves no room for the tables.
  const bool tables = !options.quiet && std::none_of(std::begin(outputs), std::end(outputs),
                                                     [](const Output& output) { return output.path == "-"; });

  trace::ReplayOptions replay_options;
  replay_options.config = *config;
  replay_options.find_min_capacity = options.min_capacity;
  replay_options.verify_contents = options.verify;
  replay_options.passes = options.passes;
  if (!options.capacity.empty()) {
    auto capacity = parse_bytes(options.capacity);
    if (!capacity) return report_error(Error(Errc::invalid_argument, "--capacity: " + capacity.error().message()));
    if (*capacity == 0) {
      return report_error(Error(Errc::invalid_argument,
                                "--capacity '" + options.capacity + "': allowed: a positive size, e.g. 80GiB"));
    }
    const std::size_t rounded = round_up(*capacity, trace::replay_granularity());
    if (rounded != *capacity && !options.quiet) {
      std::fprintf(stderr, "tidepool: warning: --capacity %s rounded up to %s (a multiple of the %s granularity)\n",
                   options.capacity.c_str(), format_bytes(rounded).c_str(),
                   format_bytes(trace::replay_granularity()).c_str());
    }
    replay_options.capacity_bytes = rounded;
  }

  auto traces = load_traces(options, *device);
  if (!traces) return report_error(traces.error());
  if (!options.quiet) {
    for (const trace::Trace& one : *traces)
      for (const std::string& warning : one.warnings) std::fprintf(stderr, "tidepool: warning: %s\n", warning.c_str());
  }

  ProgressBar progress(!options.quiet);
  replay_options.progress = [&progress](std::uint64_t done, std::uint64_t total) {
    progress.update(done, total);
  };
  std::vector<trace::TraceReplay> replays;
  for (const trace::Trace& one : *traces) {
    progress.begin(one.name);
    auto replayed = trace::replay(one, *modes, replay_options);
    progress.clear();
    if (!replayed) return report_error(replayed.error());
    if (tables) {
      if (!replays.empty()) fmt::print("\n");
      fmt::print("{}", report::replay_table(*replayed));
      if (const std::string passes = report::passes_table(*replayed); !passes.empty()) fmt::print("\n{}", passes);
      if (options.stats) fmt::print("\n{}", report::stats_table(*replayed));
      std::fflush(stdout);
    }
    replays.push_back(std::move(*replayed));
  }

  if (!options.json_path.empty()) {
    if (Status written = write_output(options.json_path, report::replay_json(replays)); !written)
      return report_error(written.error());
  }
  if (!options.perfetto_path.empty()) {
    if (Status written = write_output(options.perfetto_path, report::perfetto_json(replays)); !written)
      return report_error(written.error());
  }
  if (!options.html_path.empty()) {
    auto page = report::replay_html(replays);
    if (!page) return report_error(page.error());
    if (Status written = write_output(options.html_path, *page); !written) return report_error(written.error());
  }
  return 0;
}

namespace {

const bool registered = register_command(
    "replay", "Replay allocation traces under every mode and compare them",
    [](CLI::App& app) -> Run {
      auto options = std::make_shared<ReplayCommandOptions>();
      app.add_option("traces", options->traces,
                     "Trace files: PyTorch snapshots (.pickle), RMM logging CSV, tidepool traces")
          ->required();
      add_replay_options(app, *options);
      return [options] { return run_replay_command(*options); };
    });

}  // namespace
}  // namespace tidepool::cli
