// Sleep and wake of a tag (ExpandablePool::sleep/wake) per GiB, against the
// bare copy of the same bytes between device and host memory, on the host
// device and, where there is one, on CUDA device 0 (the GPU check runs it).
//
//   sleep_wake/<device>/contents   sleep keeping contents, then wake: the
//                                  tag's bytes go to host memory and back
//   sleep_wake/<device>/nothing    the same, discarding them: only device calls
//   copy/<device>/to_host          one copy of the tag's bytes to host memory
//                                  (pinned on a GPU), the baseline of a sleep
//   copy/<device>/from_host        and back, the baseline of a wake
//
// Counters: sleep_ms_per_GiB and wake_ms_per_GiB (the mean of the timed
// rounds; the first sleep, which makes the host buffer, is reported apart as
// first_sleep_ms_per_GiB), ms_per_GiB for a copy. Goal: a sleep keeping
// contents within 1.2x of copy/to_host, a wake within 1.2x of copy/from_host.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tidepool/device_adaptors.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/units.hpp"
#ifdef TIDEPOOL_HAVE_CUDA
#include "tidepool/cuda_device.hpp"
#endif

namespace {

using namespace tidepool;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlockBytes = 64 * MiB;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double ms_per_gib(double seconds, std::size_t bytes) {
  return seconds * 1e3 * static_cast<double>(GiB) / static_cast<double>(bytes);
}

/// A pool with `bytes` in tag "bench", written through the device's copy
/// (so that a GPU's memory holds real bytes).
struct Tagged {
  std::shared_ptr<Device> device;
  std::unique_ptr<ExpandablePool> pool;
  std::vector<void*> blocks;

  Tagged(std::shared_ptr<Device> device_in, std::size_t bytes) : device(std::move(device_in)) {
    pool = ExpandablePool::create(std::make_shared<LimitDevice>(device, bytes + 16 * MiB)).value();
    std::vector<unsigned char> pattern(kBlockBytes);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 131 >> 4);
    auto scope = pool->tag("bench").value();
    for (std::size_t done = 0; done < bytes; done += kBlockBytes) {
      blocks.push_back(pool->allocate(kBlockBytes).value());
      device->copy_from_host(blocks.back(), pattern.data(), kBlockBytes).value();
    }
  }
};

void sleep_wake(benchmark::State& state, const std::shared_ptr<Device>& device, std::size_t bytes, SleepKeep keep) {
  Tagged tagged(device, bytes);
  const auto first = Clock::now();
  tagged.pool->sleep("bench", keep).value();  // makes the host buffer: not a round
  const double first_sleep = seconds_since(first);
  tagged.pool->wake("bench").value();
  double slept = 0;
  double woke = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    tagged.pool->sleep("bench", keep).value();
    const auto asleep = Clock::now();
    tagged.pool->wake("bench").value();
    slept += std::chrono::duration<double>(asleep - start).count();
    woke += seconds_since(asleep);
    state.SetIterationTime(seconds_since(start));
  }
  const double rounds = static_cast<double>(state.iterations());
  state.counters["sleep_ms_per_GiB"] = ms_per_gib(slept / rounds, bytes);
  state.counters["wake_ms_per_GiB"] = ms_per_gib(woke / rounds, bytes);
  state.counters["first_sleep_ms_per_GiB"] = ms_per_gib(first_sleep, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

void bare_copy(benchmark::State& state, const std::shared_ptr<Device>& device, std::size_t bytes, bool to_host) {
  Tagged tagged(device, bytes);
  void* host = device->allocate_host(bytes).value();
  double copied = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    auto* cursor = static_cast<char*>(host);
    for (void* block : tagged.blocks) {  // one copy per block, as a sleep copies runs of granules
      Status done = to_host ? device->copy_to_host(cursor, block, kBlockBytes)
                            : device->copy_from_host(block, cursor, kBlockBytes);
      done.value();
      cursor += kBlockBytes;
    }
    const double seconds = seconds_since(start);
    copied += seconds;
    state.SetIterationTime(seconds);
  }
  (void)device->free_host(host, bytes);
  state.counters["ms_per_GiB"] = ms_per_gib(copied / static_cast<double>(state.iterations()), bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

void register_device(const std::string& name, const std::shared_ptr<Device>& device, std::size_t bytes) {
  const std::string prefix = "/" + name + "/";
  benchmark::RegisterBenchmark(("sleep_wake" + prefix + "contents").c_str(), [=](benchmark::State& state) {
    sleep_wake(state, device, bytes, SleepKeep::contents);
  })->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("sleep_wake" + prefix + "nothing").c_str(), [=](benchmark::State& state) {
    sleep_wake(state, device, bytes, SleepKeep::nothing);
  })->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("copy" + prefix + "to_host").c_str(), [=](benchmark::State& state) {
    bare_copy(state, device, bytes, true);
  })->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("copy" + prefix + "from_host").c_str(), [=](benchmark::State& state) {
    bare_copy(state, device, bytes, false);
  })->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  // The host device: 512 MiB tagged (and as much host copy), touched.
  HostDeviceOptions host_options;
  host_options.capacity = 2 * GiB;
  register_device("host", HostDevice::create(host_options).value(), 512 * MiB);
#ifdef TIDEPOOL_HAVE_CUDA
  std::shared_ptr<Device> gpu;  // outlives the benchmarks
  if (cuda_availability().available()) {
    auto made = CudaDevice::open(0);
    if (made) {
      gpu = std::move(*made);
      register_device("cuda", gpu, 4 * GiB);
    } else {
      std::printf("sleep_bench: CUDA device 0: %s\n", made.error().message().c_str());
    }
  } else {
    std::printf("sleep_bench: no CUDA device: %s (host device only)\n", cuda_availability().reason.c_str());
  }
#else
  std::printf("sleep_bench: built without the CUDA toolkit (host device only)\n");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
