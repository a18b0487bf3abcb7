// Allocation latency on a GPU: cudaMalloc/cudaFree against raw
// cudaMallocAsync/cudaFreeAsync (the driver's default pool) and every tidepool
// pool over CudaDevice (cuda_async: the driver's pool through AsyncPool), by size. Each
// benchmark times alloc+free pairs one by one and reports the median and the
// 99th percentile (p50_ns, p99_ns) beside Google Benchmark's mean. The pools
// are warmed first, so theirs is the cached path; cudaMalloc always calls the
// driver. Without a usable GPU (or in a build without CUDA) it says why and
// runs nothing.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#ifdef TIDEPOOL_HAVE_CUDA
#include <cuda_runtime.h>

#include "tidepool/async_pool.hpp"
#include "tidepool/best_fit_pool.hpp"
#include "tidepool/cuda_device.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/passthrough_pool.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;
using Clock = std::chrono::steady_clock;

void report_percentiles(benchmark::State& state, std::vector<double>& samples) {
  if (samples.empty()) return;
  std::sort(samples.begin(), samples.end());
  state.counters["p50_ns"] = samples[samples.size() / 2];
  state.counters["p99_ns"] = samples[std::min(samples.size() - 1, samples.size() * 99 / 100)];
}

// cudaMalloc/cudaFree, the baseline: every pair is two driver calls.
void runtime_pairs(benchmark::State& state, std::size_t bytes) {
  std::vector<double> samples;
  for (auto _ : state) {
    const auto started = Clock::now();
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
    cudaFree(ptr);
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - started).count());
  }
  report_percentiles(state, samples);
}

// cudaMallocAsync/cudaFreeAsync on the default stream and the device's default
// pool, raw (no tidepool in between): the driver's cached path.
void runtime_async_pairs(benchmark::State& state, std::size_t bytes) {
  for (int i = 0; i < 4; ++i) {  // warm, as the pools are
    void* ptr = nullptr;
    if (cudaMallocAsync(&ptr, bytes, nullptr) == cudaSuccess) cudaFreeAsync(ptr, nullptr);
  }
  std::vector<double> samples;
  for (auto _ : state) {
    const auto started = Clock::now();
    void* ptr = nullptr;
    if (cudaMallocAsync(&ptr, bytes, nullptr) != cudaSuccess) {
      state.SkipWithError("cudaMallocAsync failed");
      return;
    }
    cudaFreeAsync(ptr, nullptr);
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - started).count());
  }
  cudaStreamSynchronize(nullptr);
  report_percentiles(state, samples);
}

void pool_pairs(benchmark::State& state, Allocator* pool, std::size_t bytes) {
  for (int i = 0; i < 4; ++i) {  // warm: the size is cached before timing
    Expected<void*> ptr = pool->allocate(bytes);
    if (ptr) (void)pool->deallocate(*ptr);
  }
  std::vector<double> samples;
  for (auto _ : state) {
    const auto started = Clock::now();
    Expected<void*> ptr = pool->allocate(bytes);
    if (!ptr) {
      state.SkipWithError(ptr.error().message().c_str());
      return;
    }
    (void)pool->deallocate(*ptr);
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - started).count());
  }
  report_percentiles(state, samples);
}

std::vector<std::pair<std::string, std::unique_ptr<Allocator>>> make_pools(std::shared_ptr<CudaDevice> device) {
  const std::size_t limit = device->mem_info().total_bytes / 4;
  std::vector<std::pair<std::string, std::unique_ptr<Allocator>>> pools;
  // Each pool over the device limited as the stack limits it (cuda_async keeps its own limit).
  const auto limited = [&] { return std::make_shared<LimitDevice>(device, limit); };
  pools.emplace_back("platform", std::make_unique<PassthroughPool>(limited()));
  for (bool preallocate : {true, false}) {
    auto pool = BestFitPool::create(limited(), {.preallocate = preallocate});
    if (pool) pools.emplace_back(preallocate ? "preallocate" : "growth", std::move(*pool));
  }
  if (auto pool = ExpandablePool::create(limited())) pools.emplace_back("expandable", std::move(*pool));
  AsyncPoolOptions async;
  async.bytes_limit = limit;
  if (auto pool = AsyncPool::create(device, async)) pools.emplace_back("cuda_async", std::move(*pool));
  return pools;
}

}  // namespace

int main(int argc, char** argv) {
  const CudaAvailability availability = cuda_availability();
  if (!availability.available()) {
    std::printf("cuda_bench: no CUDA device: %s\n", availability.reason.c_str());
    return 0;
  }
  auto device = CudaDevice::open(0);
  if (!device) {
    std::printf("cuda_bench: %s\n", device.error().message().c_str());
    return 1;
  }
  auto pools = make_pools(*device);  // outlives the benchmarks; freed before the CUDA runtime goes
  for (std::size_t bytes : {std::size_t{256}, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}) {
    benchmark::RegisterBenchmark(("cudaMalloc/" + std::to_string(bytes)).c_str(),
                                 [bytes](benchmark::State& state) { runtime_pairs(state, bytes); });
    benchmark::RegisterBenchmark(("cudaMallocAsync/" + std::to_string(bytes)).c_str(),
                                 [bytes](benchmark::State& state) { runtime_async_pairs(state, bytes); });
    for (auto& [name, pool] : pools) {
      Allocator* raw = pool.get();
      benchmark::RegisterBenchmark((name + "/" + std::to_string(bytes)).c_str(),
                                   [raw, bytes](benchmark::State& state) { pool_pairs(state, raw, bytes); });
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

#else
int main() {
  std::printf("cuda_bench: this build has no CUDA device (the CUDA toolkit was not found)\n");
  return 0;
}
#endif
