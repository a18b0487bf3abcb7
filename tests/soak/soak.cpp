// The soak program: the soak workload (soak_workload.hpp) on each pool mode
// the config layer can build over a host device, for a set time, with a line
// of figures per mode and every violation it saw. Not a unit test: CI runs it
// for a bounded time (.ci/run), people run it for longer.
//
//   tidepool_soak [--seconds S] [--threads N] [--mode M[,M...]|all]
//                 [--capacity BYTES] [--max-block BYTES] [--live-blocks N] [--seed N]
//
// Exit status: 0 when every mode ran clean, 1 on any violation, 2 on bad arguments.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "soak/soak_workload.hpp"
#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;
using soak::SoakOptions;

struct Arguments {
  SoakOptions soak;
  std::vector<Mode> modes;  // empty: every mode the device supports
  std::size_t capacity = 512 * MiB;
};

constexpr const char* kUsage =
    "usage: tidepool_soak [--seconds S] [--threads N] [--mode M[,M...]|all] [--capacity BYTES]\n"
    "                     [--max-block BYTES] [--live-blocks N] [--seed N]\n"
    "  --seconds      how long each mode runs (default 10)\n"
    "  --threads      worker threads (default 4)\n"
    "  --mode         modes to run, comma-separated, or all (default): every mode the host\n"
    "                 device supports in this build\n"
    "  --capacity     the host device's capacity (default 512MiB; the pool gets 0.75 of it)\n"
    "  --max-block    the largest request (default 16MiB)\n"
    "  --live-blocks  blocks each thread keeps live (default 256)\n"
    "  --seed         the random seed (default 1)\n";

Expected<std::uint64_t> parse_count(std::string_view flag, std::string_view text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    return Error(Errc::invalid_argument, std::string(flag) + ": '" + std::string(text) + "' is not a whole number");
  return value;
}

Expected<Arguments> parse_arguments(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") return Error(Errc::invalid_argument, "");
    if (i + 1 >= argc) return Error(Errc::invalid_argument, std::string(flag) + ": needs a value");
    const std::string_view value = argv[++i];
    if (flag == "--seconds") {
      char* end = nullptr;
      const std::string text(value);
      args.soak.seconds = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size() || !(args.soak.seconds > 0) || args.soak.seconds > 1e7)
        return Error(Errc::invalid_argument, "--seconds: '" + text + "' is not a positive number of seconds");
    } else if (flag == "--threads") {
      auto n = parse_count(flag, value);
      if (!n) return std::move(n).error();
      if (*n < 1 || *n > 256) return Error(Errc::invalid_argument, "--threads: " + std::string(value) + " is not in 1..256");
      args.soak.threads = static_cast<unsigned>(*n);
    } else if (flag == "--mode") {
      if (value == "all") continue;
      std::string_view rest = value;
      while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        auto mode = parse_mode(rest.substr(0, comma));
        if (!mode) return Error(Errc::invalid_argument, "--mode: " + mode.error().message());
        args.modes.push_back(*mode);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (flag == "--capacity" || flag == "--max-block") {
      auto bytes = parse_bytes(value);
      if (!bytes) return Error(Errc::invalid_argument, std::string(flag) + ": " + bytes.error().message());
      if (*bytes == 0) return Error(Errc::invalid_argument, std::string(flag) + ": must be more than 0");
      (flag == "--capacity" ? args.capacity : args.soak.max_block_bytes) = *bytes;
    } else if (flag == "--live-blocks") {
      auto n = parse_count(flag, value);
      if (!n) return std::move(n).error();
      if (*n < 1) return Error(Errc::invalid_argument, "--live-blocks: must be at least 1");
      args.soak.live_blocks_per_thread = *n;
    } else if (flag == "--seed") {
      auto n = parse_count(flag, value);
      if (!n) return std::move(n).error();
      args.soak.seed = *n;
    } else {
      return Error(Errc::invalid_argument, "unknown option '" + std::string(flag) + "'");
    }
  }
  return args;
}

std::string mib(std::int64_t bytes) { return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(0, bytes))); }

}  // namespace

int main(int argc, char** argv) {
  Expected<Arguments> parsed = parse_arguments(argc, argv);
  if (!parsed) {
    if (!parsed.error().message().empty()) std::fprintf(stderr, "tidepool_soak: %s\n", parsed.error().message().c_str());
    std::fputs(kUsage, stderr);
    return 2;
  }
  Arguments& args = *parsed;
  Config config;
  config.host_capacity = Setting<std::size_t>(args.capacity, {Origin::program, "--capacity", {}});
  config.device = Setting<DeviceKind>(DeviceKind::host, {Origin::program, "soak", {}});  // the workload writes into every block
  const bool every_mode = args.modes.empty();
  if (every_mode) args.modes.assign(all_modes().begin(), all_modes().end());

  std::printf("soak: %u threads, %.1f s per mode, host device of %s, blocks up to %s, %zu live per thread, seed %llu\n",
              args.soak.threads, args.soak.seconds, format_bytes(args.capacity).c_str(),
              format_bytes(args.soak.max_block_bytes).c_str(), args.soak.live_blocks_per_thread,
              static_cast<unsigned long long>(args.soak.seed));
  int status = 0;
  int ran = 0;
  for (Mode mode : args.modes) {
    const std::string name(mode_name(mode));
    Expected<std::shared_ptr<Device>> device = make_device(config);
    if (!device) {
      std::printf("soak: %s: FAILED: the device: %s\n", name.c_str(), device.error().message().c_str());
      status = 1;
      continue;
    }
    if (Status supported = mode_supported(mode, **device); !supported) {
      // Asked for by name, an unsupported mode is an error; under "all" it is skipped.
      std::printf("soak: %s: %s: %s\n", name.c_str(), every_mode ? "skipped" : "FAILED",
                  supported.error().message().c_str());
      if (!every_mode) status = 1;
      continue;
    }
    config.mode = Setting<Mode>(mode, {Origin::program, "--mode", {}});
    config.preallocate = Setting<bool>(mode == Mode::preallocate, {Origin::program, "--mode", {}});
    const soak::SoakResult r = soak::run_soak(
        *device, [&](std::shared_ptr<Device> d) { return make_allocator(mode, config, std::move(d)); }, args.soak);
    ++ran;
    std::printf(
        "soak: %-11s %9.0f ops/s  %llu allocs, %llu frees (%llu on another thread), %llu ooms, %llu trims, "
        "%llu checkpoints, %s verified; peak in use %s, peak reserved %s, peak device at checkpoints %s: %s\n",
        name.c_str(), r.ops_per_second(), static_cast<unsigned long long>(r.allocations),
        static_cast<unsigned long long>(r.frees), static_cast<unsigned long long>(r.cross_thread_frees),
        static_cast<unsigned long long>(r.ooms), static_cast<unsigned long long>(r.trims),
        static_cast<unsigned long long>(r.checkpoints), format_bytes(r.bytes_verified).c_str(),
        mib(r.final_stats.peak_bytes_in_use).c_str(), mib(r.final_stats.peak_bytes_reserved).c_str(),
        format_bytes(r.peak_device_bytes).c_str(),
        r.clean() ? "clean" : (std::to_string(r.violation_count) + " VIOLATIONS").c_str());
    for (const soak::Violation& v : r.violations)
      std::printf("soak: %s: %s: %s\n", name.c_str(), soak::violation_kind_name(v.kind), v.detail.c_str());
    if (!r.clean()) status = 1;
    std::fflush(stdout);
  }
  if (ran == 0 && status == 0) {
    std::printf("soak: no mode ran\n");
    status = 1;
  }
  return status;
}
