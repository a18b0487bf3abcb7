// The traces replayed on a GPU: every mode (cuda_async too) over the CUDA
// device, each block written with cudaMemsetAsync when it is handed out, so
// that the replay takes and touches real device memory. The replay engine's
// own loop and figures (docs/replay.md); only the device and the touch differ.
//
//   gpu_replay_bench [--json FILE] [--passes N] [TRACE...]   (default: tests/data/pytorch/*.pickle)
//
// The recorded streams are not this process's: every event runs on the
// default stream. Prints each trace's table (and, with several passes, each
// pass's device calls and ns/op); exits 1 with the reason when
// there is no usable GPU or a replay fails.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#ifdef TIDEPOOL_HAVE_CUDA
#include <cuda_runtime.h>

#include "tidepool/cuda_device.hpp"
#include "tidepool/replay.hpp"
#include "tidepool/report.hpp"
#include "tidepool/trace_io.hpp"

namespace {

using namespace tidepool;

int fail(const std::string& message) {
  std::fprintf(stderr, "gpu_replay_bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  unsigned passes = 1;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(argv[++i], &end, 10);
      if (*end != '\0' || n == 0 || n > trace::kMaxPasses) {
        return fail(std::string("--passes '") + argv[i] + "' is invalid; allowed: 1 to " +
                    std::to_string(trace::kMaxPasses));
      }
      passes = static_cast<unsigned>(n);
    } else if (argv[i][0] == '-') {
      return fail(std::string("unknown option '") + argv[i] + "'; allowed: --json FILE, --passes N, then trace files");
    } else {
      paths.emplace_back(argv[i]);
    }
  }
  if (paths.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(TIDEPOOL_TEST_DATA "/pytorch"))
      if (entry.path().extension() == ".pickle") paths.push_back(entry.path().string());
  }
  const CudaAvailability availability = cuda_availability();
  if (!availability.available()) return fail("no CUDA device: " + availability.reason);

  trace::ReplayOptions options;
  options.passes = passes;
  options.device = []() -> Expected<std::shared_ptr<Device>> {
    auto device = CudaDevice::open(0);
    if (!device) return std::move(device).error();
    return std::shared_ptr<Device>(std::move(*device));
  };
  options.touch = [](void* ptr, std::size_t bytes, Stream) -> Status {
    if (cudaError_t error = cudaMemsetAsync(ptr, 0xA5, bytes, nullptr); error != cudaSuccess)
      return Error(Errc::device_error, std::string("cudaMemsetAsync of ") + std::to_string(bytes) +
                                           " bytes: " + cudaGetErrorName(error));
    return {};
  };
  const std::vector<Mode> modes = {Mode::preallocate, Mode::growth, Mode::platform, Mode::expandable,
                                   Mode::cuda_async};
  std::vector<trace::TraceReplay> replays;
  for (const std::string& path : paths) {
    auto loaded = trace::read_trace(path);
    if (!loaded) return fail(loaded.error().message());
    for (trace::Event& event : loaded->events) event.stream = kDefaultStream;
    // One mode at a time, the device synchronized after each: every memset
    // must have run on memory the driver knows, and a fault names its mode.
    std::optional<trace::TraceReplay> all;
    for (Mode mode : modes) {
      options.plan = !all;  // the trace's own figures are kept from its first replay
      auto replayed = trace::replay(*loaded, std::span<const Mode>(&mode, 1), options);
      if (!replayed) return fail(path + ": " + replayed.error().message());
      if (cudaError_t error = cudaDeviceSynchronize(); error != cudaSuccess) {
        return fail(path + ": after the replay under " + std::string(mode_name(mode)) + ": " +
                    cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
      }
      if (!all) {
        all = std::move(*replayed);
      } else {
        all->modes.push_back(std::move(replayed->modes.front()));
      }
    }
    std::printf("%s\n", report::replay_table(*all).c_str());
    if (const std::string each = report::passes_table(*all); !each.empty()) std::printf("%s\n", each.c_str());
    replays.push_back(std::move(*all));
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << report::replay_json(replays);
    if (!out) return fail("cannot write '" + json_path + "'");
  }
  return 0;
}

#else
int main() {
  std::fprintf(stderr, "gpu_replay_bench: this build has no CUDA device (the CUDA toolkit was not found)\n");
  return 1;
}
#endif
