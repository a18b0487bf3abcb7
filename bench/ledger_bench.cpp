// What the cross-process ledger costs.
//
//   cached/<plain|ledger>/<bytes>   an alloc+free pair served from a warm growth
//                                   pool's cache, built by make_allocator over a
//                                   HostDevice, or over LedgerDevice(HostDevice)
//                                   (so through the stack's trim-hook wrapper)
//   reserve/<plain|ledger>/<bytes>  a device-level physical allocation and its
//                                   release (create + release), on HostDevice or
//                                   through LedgerDevice
//
// Goals (docs/ledger.md): cached/ledger equal to cached/plain, since the ledger
// is touched only on device calls (the wrapper adds one relaxed atomic load);
// reserve/ledger within 2x of reserve/plain.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "tidepool/config.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;

// This run's own segment, unlinked at exit.
const std::string& segment_name() {
  static const std::string name = [] {
    std::string made = "/tidepool-bench-" + std::to_string(getpid());
    shm_unlink(made.c_str());
    std::atexit([] { shm_unlink(segment_name().c_str()); });
    return made;
  }();
  return name;
}

std::shared_ptr<Device> host_device() {
  HostDeviceOptions options;
  options.capacity = 16 * GiB;  // never touched: nothing is written
  options.name = "bench";
  auto device = HostDevice::create(options);
  if (!device) throw Exception(device.error());
  return std::move(device).value();
}

// One plain and one ledger device for the program.
std::shared_ptr<Device> device(bool ledger) {
  static const std::shared_ptr<Device> plain = host_device();
  static const std::shared_ptr<Device> shared = [] {
    LedgerOptions options;
    options.segment_name = segment_name();
    auto made = LedgerDevice::create(host_device(), options);
    if (!made) throw Exception(made.error());
    return std::shared_ptr<Device>(std::move(made).value());
  }();
  return ledger ? shared : plain;
}

std::unique_ptr<Allocator> growth_pool(bool ledger) {
  auto config = Config::from_env([](const char*) -> const char* { return nullptr; });
  if (!config) throw Exception(config.error());
  config->mode.value = Mode::growth;
  auto pool = make_allocator(*config, device(ledger));
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

void cached(benchmark::State& state, bool ledger) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::unique_ptr<Allocator> pool = growth_pool(ledger);
  // Warm: the pool holds a region that serves the size from now on.
  void* warm = pool->allocate(bytes).value();
  (void)pool->deallocate(warm);
  for (auto _ : state) {
    Expected<void*> ptr = pool->allocate(bytes);
    if (!ptr) {
      state.SkipWithError(ptr.error().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(*ptr);
    (void)pool->deallocate(*ptr);
  }
  const Stats stats = pool->stats();
  state.counters["device_allocs"] = static_cast<double>(stats.num_device_allocs);
}

void reserve(benchmark::State& state, bool ledger) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Device& target = *device(ledger);
  for (auto _ : state) {
    Expected<PhysicalHandle> handle = target.create(bytes);
    if (!handle) {
      state.SkipWithError(handle.error().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(*handle);
    (void)target.release(*handle, bytes);
  }
}

void cached_plain(benchmark::State& state) { cached(state, false); }
void cached_ledger(benchmark::State& state) { cached(state, true); }
void reserve_plain(benchmark::State& state) { reserve(state, false); }
void reserve_ledger(benchmark::State& state) { reserve(state, true); }

BENCHMARK(cached_plain)->Name("cached/plain")->Arg(4096)->Arg(1 << 20);
BENCHMARK(cached_ledger)->Name("cached/ledger")->Arg(4096)->Arg(1 << 20);
BENCHMARK(reserve_plain)->Name("reserve/plain")->Arg(2 << 20)->Arg(64 << 20);
BENCHMARK(reserve_ledger)->Name("reserve/ledger")->Arg(2 << 20)->Arg(64 << 20);

}  // namespace

BENCHMARK_MAIN();
