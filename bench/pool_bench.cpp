// Allocation speed of each pool over the host device, with glibc malloc/free
// of the same sizes as the baseline in the same program.
//
//   fixed/<allocator>/<bytes>    an alloc+free pair of one size per iteration
//   mixed/<allocator>            an alloc+free pair per iteration, sizes uniform
//                                in [256 B, 64 KiB], freed at once
//   window/<allocator>           the same sizes, but each iteration frees the
//                                block allocated 64 iterations earlier, so
//                                blocks of many sizes are live together
//   large/<allocator>            an alloc+free pair per iteration, sizes uniform
//                                in [1 MiB, 64 MiB], freed at once: each size
//                                differs from the last, so ExpandablePool does
//                                its granule bookkeeping on every pair (fixed/
//                                of a large size measures a block asked for
//                                again at the size it was freed)
//
// Every benchmark runs with one and two threads sharing one allocator. The
// pools are warmed up first, so what is measured is the cached path: sizes
// the pool has served before. Goals: BestFitPool within 2x of glibc on
// mixed and window, one thread; ExpandablePool within 1.5x of BestFitPool
// (growth) on every cached benchmark.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tidepool/best_fit_pool.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/passthrough_pool.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;

enum class Kind { glibc, platform, preallocate, growth, expandable };
constexpr Kind kKinds[] = {Kind::glibc, Kind::platform, Kind::preallocate, Kind::growth, Kind::expandable};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::glibc: return "glibc";
    case Kind::platform: return "platform";
    case Kind::preallocate: return "preallocate";
    case Kind::growth: return "growth";
    case Kind::expandable: return "expandable";
  }
  return "unknown";
}

std::shared_ptr<Device> bench_device() {
  static const std::shared_ptr<Device> device = [] {
    HostDeviceOptions options;
    options.capacity = 16 * GiB;  // never touched: the benchmarks write nothing
    auto created = HostDevice::create(options);
    if (!created) throw Exception(created.error());
    return std::shared_ptr<Device>(std::move(created).value());
  }();
  return device;
}

// One allocator of each kind for the whole program, shared by the threads.
Allocator* pool_of(Kind kind) {
  static std::unique_ptr<Allocator> pools[5];
  static const bool made = [] {
    const auto limited = [] { return std::make_shared<LimitDevice>(bench_device(), 4 * GiB); };
    pools[static_cast<int>(Kind::platform)] = std::make_unique<PassthroughPool>(limited());
    for (bool preallocate : {true, false}) {
      BestFitOptions options;
      options.preallocate = preallocate;
      auto pool = BestFitPool::create(limited(), options);
      if (!pool) throw Exception(pool.error());
      pools[static_cast<int>(preallocate ? Kind::preallocate : Kind::growth)] = std::move(pool).value();
    }
    auto pool = ExpandablePool::create(limited());
    if (!pool) throw Exception(pool.error());
    pools[static_cast<int>(Kind::expandable)] = std::move(pool).value();
    return true;
  }();
  (void)made;
  return pools[static_cast<int>(kind)].get();
}

inline void* allocate(Kind kind, Allocator* pool, std::size_t bytes) {
  if (kind == Kind::glibc) return std::malloc(bytes);
  Expected<void*> ptr = pool->allocate(bytes);
  if (!ptr) throw Exception(ptr.error());
  return *ptr;
}
inline void deallocate(Kind kind, Allocator* pool, void* ptr) {
  if (kind == Kind::glibc) return std::free(ptr);
  Status freed = pool->deallocate(ptr);
  if (!freed) throw Exception(freed.error());
}

// Sizes uniform in [256 B, 64 KiB], the same sequence for every allocator.
const std::vector<std::size_t>& mixed_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::mt19937_64 random(1234);
    std::uniform_int_distribution<std::size_t> size_of(256, 64 * KiB);
    std::vector<std::size_t> result(4096);
    for (std::size_t& size : result) size = size_of(random);
    return result;
  }();
  return sizes;
}
constexpr std::size_t kSizeMask = 4095;

// Sizes uniform in [1 MiB, 64 MiB], the same sequence for every allocator.
const std::vector<std::size_t>& large_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::mt19937_64 random(5678);
    std::uniform_int_distribution<std::size_t> size_of(1 * MiB, 64 * MiB);
    std::vector<std::size_t> result(256);
    for (std::size_t& size : result) size = size_of(random);
    return result;
  }();
  return sizes;
}

// Serves every mixed size once with a window's worth live, so later
// iterations run on the cached path.
void warm_up(Kind kind, Allocator* pool) {
  if (kind == Kind::glibc) return;
  std::vector<void*> live;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t size : mixed_sizes()) live.push_back(allocate(kind, pool, size));
    for (void* ptr : live) deallocate(kind, pool, ptr);
    live.clear();
  }
  for (std::size_t size : large_sizes()) deallocate(kind, pool, allocate(kind, pool, size));
}

void fixed_pairs(benchmark::State& state, Kind kind, std::size_t bytes) {
  Allocator* pool = kind == Kind::glibc ? nullptr : pool_of(kind);
  if (state.thread_index() == 0) warm_up(kind, pool);
  for (auto _ : state) {
    void* ptr = allocate(kind, pool, bytes);
    benchmark::DoNotOptimize(ptr);
    deallocate(kind, pool, ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

// An alloc+free pair per iteration, the sizes taken in turn (their count is a
// power of two); each thread starts at its own place in them.
void sized_pairs(benchmark::State& state, Kind kind, const std::vector<std::size_t>& sizes,
                 std::size_t thread_offset) {
  Allocator* pool = kind == Kind::glibc ? nullptr : pool_of(kind);
  if (state.thread_index() == 0) warm_up(kind, pool);
  const std::size_t mask = sizes.size() - 1;
  std::size_t next = static_cast<std::size_t>(state.thread_index()) * thread_offset;
  for (auto _ : state) {
    void* ptr = allocate(kind, pool, sizes[next++ & mask]);
    benchmark::DoNotOptimize(ptr);
    deallocate(kind, pool, ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

void window_pairs(benchmark::State& state, Kind kind) {
  constexpr std::size_t kWindow = 64;
  Allocator* pool = kind == Kind::glibc ? nullptr : pool_of(kind);
  if (state.thread_index() == 0) warm_up(kind, pool);
  const std::vector<std::size_t>& sizes = mixed_sizes();
  std::size_t next = static_cast<std::size_t>(state.thread_index()) * 997;
  void* live[kWindow];
  for (void*& ptr : live) ptr = allocate(kind, pool, sizes[next++ & kSizeMask]);
  std::size_t slot = 0;
  for (auto _ : state) {
    deallocate(kind, pool, live[slot]);
    // DoNotOptimize on a local, never on the array element: GCC 12 with
    // Google Benchmark 1.7's "+m,r" constraint dropped the malloc() here and
    // kept the freed pointer (a double free that ASan showed).
    void* fresh = allocate(kind, pool, sizes[next++ & kSizeMask]);
    benchmark::DoNotOptimize(fresh);
    live[slot] = fresh;
    slot = (slot + 1) % kWindow;
  }
  for (void* ptr : live) deallocate(kind, pool, ptr);
  state.SetItemsProcessed(state.iterations());
}

void register_all() {
  for (Kind kind : kKinds) {
    const std::string name = kind_name(kind);
    for (std::size_t bytes : {std::size_t{256}, 4 * KiB, 64 * KiB, 1 * MiB, 64 * MiB}) {
      benchmark::RegisterBenchmark(("fixed/" + name + "/" + std::to_string(bytes)).c_str(),
                                   [kind, bytes](benchmark::State& state) { fixed_pairs(state, kind, bytes); })
          ->Threads(1)
          ->Threads(2)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("mixed/" + name).c_str(),
                                 [kind](benchmark::State& state) { sized_pairs(state, kind, mixed_sizes(), 997); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("large/" + name).c_str(),
                                 [kind](benchmark::State& state) { sized_pairs(state, kind, large_sizes(), 97); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("window/" + name).c_str(),
                                 [kind](benchmark::State& state) { window_pairs(state, kind); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
