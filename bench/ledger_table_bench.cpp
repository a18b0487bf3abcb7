// The multi-process table of docs/ledger.md: N real processes (fork) share
// one device's capacity, each running the same job in turn, for each way of
// sharing it:
//
//   preallocate 75%            JAX's default, no ledger
//   growth                     XLA_PYTHON_CLIENT_PREALLOCATE=false, no ledger
//   growth + ledger            TIDEPOOL_LEDGER=on
//   expandable + ledger        TIDEPOOL_ALLOCATOR=expandable TIDEPOOL_LEDGER=on
//   preallocate 75% + quota    TIDEPOOL_QUOTA=1/N: 75% of each one's quota
//
// The job: start (build the stack; a preallocating pool takes its region
// now), wait until every process has started, then in turn take a burst of
// 40% of the device in 64 MiB blocks, free it all (the pool keeps it cached,
// as pools do), and stay alive, idle, until every process has had its turn.
// In use at any moment: one burst, 40%; the sum of the bursts: N x 40%.
//
// One shared capacity, modelled honestly. Every process has its own
// HostDevice (a HostDevice is per process), so on its own each would think
// it had the whole device. Below the pool, and below the ledger where there
// is one, every process's HostDevice is wrapped in SharedCapacityDevice:
// each physical allocation (allocate, create) first takes its bytes from one
// counter in memory shared by all the processes (a MAP_SHARED mapping made
// before fork), and fails with out_of_memory when the device's capacity is
// used up, as cudaMalloc does when the GPU's memory is taken by any process;
// mem_info reports that counter, as cudaMemGetInfo reports the whole GPU's.
// The ledger (when on) is above it and knows nothing of it.
//
//   build-*/bench/ledger_table_bench [processes=4] [capacity GiB=8]
//
// Prints a Markdown table: processes, quota, started, succeeded (finished
// the burst), OOMs (requests refused: at start or in the burst), peak sum of
// what the processes held from the shared capacity.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tidepool/config.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace {

using namespace tidepool;
using namespace std::chrono_literals;

/// What the processes share: the capacity's use, and the job's turns.
struct Shared {
  std::atomic<std::uint64_t> used_bytes{0};
  std::atomic<std::uint64_t> peak_bytes{0};
  std::atomic<int> started{0};  // processes past start-up (succeeded or not)
  std::atomic<int> turn{0};     // whose burst it is; N: all done
};

/// A device whose physical allocations take from one capacity shared by all
/// processes (see the file comment).
class SharedCapacityDevice final : public DeviceAdaptor {
 public:
  SharedCapacityDevice(std::shared_ptr<Device> upstream, Shared& shared, std::size_t capacity)
      : DeviceAdaptor(std::move(upstream)), shared_(shared), capacity_(capacity) {}

  Expected<void*> allocate(std::size_t bytes) override {
    if (!take(bytes)) return out_of_memory(bytes);
    auto ptr = upstream().allocate(bytes);
    if (!ptr) give(bytes);
    return ptr;
  }
  Status free(void* ptr, std::size_t bytes) override {
    Status freed = upstream().free(ptr, bytes);
    if (freed) give(bytes);
    return freed;
  }
  Expected<PhysicalHandle> create(std::size_t bytes) override {
    if (!take(bytes)) return out_of_memory(bytes);
    auto handle = upstream().create(bytes);
    if (!handle) give(bytes);
    return handle;
  }
  Status release(PhysicalHandle handle, std::size_t bytes) override {
    Status released = upstream().release(handle, bytes);
    if (released) give(bytes);
    return released;
  }
  MemInfo mem_info() const override {
    const std::size_t used = shared_.used_bytes.load();
    return {used < capacity_ ? capacity_ - used : 0, capacity_};
  }

 private:
  bool take(std::size_t bytes) {
    std::uint64_t used = shared_.used_bytes.load();
    do {
      if (used + bytes > capacity_) return false;
    } while (!shared_.used_bytes.compare_exchange_weak(used, used + bytes));
    std::uint64_t peak = shared_.peak_bytes.load();
    while (used + bytes > peak && !shared_.peak_bytes.compare_exchange_weak(peak, used + bytes)) {
    }
    return true;
  }
  void give(std::size_t bytes) { shared_.used_bytes.fetch_sub(bytes); }
  Error out_of_memory(std::size_t bytes) const {
    OomReport report;
    report.requested_bytes = bytes;
    report.device_free_bytes = mem_info().free_bytes;
    report.largest_free_block_bytes = report.device_free_bytes;
    report.hint = "the shared device is full: other processes hold the rest";
    return Error::out_of_memory("shared device", std::move(report));
  }

  Shared& shared_;
  std::size_t capacity_;
};

struct Scenario {
  std::string name;
  std::map<std::string, std::string> variables;  // the environment it runs with
  std::string quota;                             // as the table shows it
};

struct Outcome {
  bool started = false;
  bool succeeded = false;
  int ooms = 0;
  std::string first_error;
};

constexpr std::size_t kBlock = 64 * MiB;

/// Waits for `condition`, at most `timeout`; whether it held.
template <class Condition>
bool wait_for(Condition condition, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// One process's job; see the file comment.
Outcome run_process(const Scenario& scenario, int index, int processes, std::size_t capacity,
                    const std::string& device_name, Shared& shared) {
  Outcome outcome;
  auto note = [&](const Error& error) {
    if (error.code() == Errc::out_of_memory) ++outcome.ooms;
    if (outcome.first_error.empty()) outcome.first_error = error.message();
  };
  auto config = Config::from_env([&](const char* name) -> const char* {
    auto it = scenario.variables.find(name);
    return it == scenario.variables.end() ? nullptr : it->second.c_str();
  });
  std::shared_ptr<Device> device;
  std::unique_ptr<Allocator> pool;
  if (!config) {
    note(config.error());
  } else {
    HostDeviceOptions options;
    options.capacity = capacity;
    options.name = device_name;
    device = std::make_shared<SharedCapacityDevice>(HostDevice::create(options).value(), shared, capacity);
    if (config->ledger.value) {
      auto ledger = make_ledger_device(*config, device);
      if (ledger) device = std::move(*ledger);
      else note(ledger.error()), device.reset();
    }
    if (device) {
      auto made = make_allocator(*config, device);
      if (made) pool = std::move(*made);
      else note(made.error());
    }
  }
  outcome.started = pool != nullptr;
  shared.started.fetch_add(1);
  if (!wait_for([&] { return shared.started.load() == processes && shared.turn.load() == index; }, 120s))
    return outcome;
  if (pool) {
    const std::size_t burst = capacity / 10 * 4;
    std::vector<void*> held;
    for (std::size_t taken = 0; taken < burst; taken += kBlock) {
      auto block = pool->allocate(kBlock);
      if (!block) {
        note(block.error());
        break;
      }
      held.push_back(*block);
    }
    outcome.succeeded = held.size() * kBlock >= burst;
    for (void* block : held) (void)pool->deallocate(block);  // cached by the pool
  }
  shared.turn.fetch_add(1);
  (void)wait_for([&] { return shared.turn.load() == processes; }, 120s);  // idle, cache held
  pool.reset();
  device.reset();
  return outcome;
}

struct Row {
  int processes = 0;
  int started = 0;
  int succeeded = 0;
  int ooms = 0;
  std::size_t peak_bytes = 0;
  std::string first_error;
};

Row run_scenario(const Scenario& scenario, int processes, std::size_t capacity) {
  static int run = 0;
  const std::string device_name = "table-" + std::to_string(getpid()) + "-" + std::to_string(run++);
  const std::string segment = ledger_segment_name("host:" + device_name);
  void* memory = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* shared = new (memory) Shared{};
  std::vector<std::pair<pid_t, int>> children;  // pid, read end of its report pipe
  for (int i = 0; i < processes; ++i) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      std::exit(1);
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      alarm(300);  // never outlive a stuck run
      const Outcome outcome = run_process(scenario, i, processes, capacity, device_name, *shared);
      const std::string line = std::to_string(outcome.started) + " " + std::to_string(outcome.succeeded) + " " +
                               std::to_string(outcome.ooms) + " " + outcome.first_error + "\n";
      (void)!write(fds[1], line.data(), line.size());
      _exit(0);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  Row row;
  row.processes = processes;
  for (auto [pid, fd] : children) {
    std::string text;
    char buffer[512];
    for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
    close(fd);
    waitpid(pid, nullptr, 0);
    int started = 0, succeeded = 0, ooms = 0, consumed = 0;
    if (std::sscanf(text.c_str(), "%d %d %d %n", &started, &succeeded, &ooms, &consumed) < 3) {
      row.first_error = row.first_error.empty() ? "a process reported nothing" : row.first_error;
      continue;
    }
    row.started += started;
    row.succeeded += succeeded;
    row.ooms += ooms;
    std::string error = text.substr(static_cast<std::size_t>(consumed));
    while (!error.empty() && error.back() == '\n') error.pop_back();
    if (row.first_error.empty() && !error.empty()) row.first_error = error;
  }
  row.peak_bytes = shared->peak_bytes.load();
  munmap(memory, sizeof(Shared));
  shm_unlink(segment.c_str());
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const int processes = argc > 1 ? std::atoi(argv[1]) : 4;
  const std::size_t capacity = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8) * GiB;
  if (processes < 1 || processes > 64 || capacity == 0) {
    std::fprintf(stderr, "usage: %s [processes 1..64] [capacity GiB]\n", argv[0]);
    return 1;
  }
  const std::string quota = std::to_string(100.0 / processes).substr(0, 5) + "%";
  const std::vector<Scenario> scenarios = {
      {"preallocate 75%, no ledger (JAX default)", {{"TIDEPOOL_ALLOCATOR", "preallocate"}}, "none"},
      {"growth, no ledger (PREALLOCATE=false)", {{"TIDEPOOL_ALLOCATOR", "growth"}}, "none"},
      {"growth + ledger", {{"TIDEPOOL_ALLOCATOR", "growth"}, {"TIDEPOOL_LEDGER", "on"}}, "none"},
      {"expandable + ledger", {{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_LEDGER", "on"}}, "none"},
      {"preallocate 75% of quota + ledger",
       {{"TIDEPOOL_ALLOCATOR", "preallocate"}, {"TIDEPOOL_QUOTA", quota}},
       quota},
  };
  std::printf("%d processes on one %s device; each bursts to 40%% of it in turn (in use at once: 40%%, "
              "sum of bursts: %d%%)\n\n",
              processes, format_bytes(capacity).c_str(), processes * 40);
  std::printf("| sharing | processes | quota | started | succeeded | OOMs | peak sum |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  std::vector<std::pair<std::string, std::string>> errors;
  for (const Scenario& scenario : scenarios) {
    const Row row = run_scenario(scenario, processes, capacity);
    std::printf("| %s | %d | %s | %d | %d | %d | %s (%.0f%%) |\n", scenario.name.c_str(), row.processes,
                scenario.quota.c_str(), row.started, row.succeeded, row.ooms, format_bytes(row.peak_bytes).c_str(),
                100.0 * static_cast<double>(row.peak_bytes) / static_cast<double>(capacity));
    std::fflush(stdout);
    if (!row.first_error.empty()) errors.emplace_back(scenario.name, row.first_error);
  }
  if (!errors.empty()) std::printf("\nFirst error of each row:\n");
  for (const auto& [name, error] : errors) std::printf("- %s: %s\n", name.c_str(), error.c_str());
  return 0;
}
