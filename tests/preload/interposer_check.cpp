// The interposer end to end: preload_app, linked against the fake driver,
// runs under `tidepool run --quota ... --ledger ...`; its output shows what
// the driver calls returned and the fake's call counts, and the ledger shows
// its entry while it runs and none after it exits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tidepool/ledger.hpp"
#include "tidepool/trace_io.hpp"

namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kFakeTotal = 16 * GiB;  // fake_cuda.c's device
constexpr int kOutOfMemory = 2;               // CUDA_ERROR_OUT_OF_MEMORY

/// A child process with pipes on its stdin, stdout and stderr.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int in[2], out[2], err[2];
    if (pipe(in) != 0 || pipe(out) != 0 || pipe(err) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
      std::vector<char*> args;
      for (auto& word : argv) args.push_back(word.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(126);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    stdin_ = fdopen(in[1], "w");
    stdout_ = fdopen(out[0], "r");
    stderr_fd_ = err[0];
  }
  ~Child() {
    if (pid_ > 0 && !finished_) finish();
  }

  /// Reads output lines until one equals `line` (true) or the output ends.
  bool read_until(const std::string& line) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, stdout_) != nullptr) {
      std::string text(buffer);
      if (!text.empty() && text.back() == '\n') text.pop_back();
      add(text);
      if (text == line) return true;
    }
    return false;
  }
  void send_line() {
    std::fputs("go\n", stdin_);
    std::fflush(stdin_);
  }
  /// Reads the rest, waits; returns the exit status (-1 on a signal).
  int finish() {
    finished_ = true;  // once: a status of -1 (killed by a signal) is finished too
    read_until("\x01never");
    std::fclose(stdin_);
    std::fclose(stdout_);
    char buffer[4096];
    for (ssize_t n; (n = read(stderr_fd_, buffer, sizeof buffer)) > 0;) errors_.append(buffer, n);
    close(stderr_fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return status_;
  }

  /// The numbers of an output line "name a b c".
  std::vector<long long> numbers(const std::string& name) const {
    auto it = lines_.find(name);
    if (it == lines_.end()) return {};
    return it->second;
  }
  long long number(const std::string& name, std::size_t index = 0) const {
    auto values = numbers(name);
    return index < values.size() ? values[index] : -999;
  }
  const std::string& text(const std::string& name) const { return texts_.at(name); }
  bool has(const std::string& name) const { return texts_.count(name) != 0; }
  const std::string& errors() const { return errors_; }

 private:
  void add(const std::string& line) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    std::string rest;
    std::getline(words, rest);
    texts_[name] = rest;
    std::istringstream values(rest);
    std::vector<long long> parsed;
    for (long long value; values >> value;) parsed.push_back(value);
    lines_[name] = parsed;
  }

  pid_t pid_ = -1;
  int status_ = -1;
  bool finished_ = false;
  FILE* stdin_ = nullptr;
  FILE* stdout_ = nullptr;
  int stderr_fd_ = -1;
  std::string errors_;
  std::map<std::string, std::vector<long long>> lines_;
  std::map<std::string, std::string> texts_;
};

std::string segment_name(const char* what) {
  return "/tidepool-interposer-" + std::string(what) + "-" + std::to_string(getpid());
}

struct RemoveSegment {
  std::string name;
  ~RemoveSegment() { (void)tidepool::Ledger::remove(name); }
};

const tidepool::LedgerEntryInfo* entry_of(const tidepool::LedgerSnapshot& snapshot, long long pid) {
  for (const auto& entry : snapshot.entries)
    if (entry.pid == pid) return &entry;
  return nullptr;
}

TEST(Interposer, WithoutItTheProgramSeesTheWholeFakeDevice) {
  Child app({PRELOAD_APP});
  ASSERT_EQ(app.finish(), 0) << app.errors();
  EXPECT_EQ(app.number("info0", 2), static_cast<long long>(kFakeTotal));
  // Every request reaches the driver, including those beyond the device.
  EXPECT_EQ(app.text("driver_calls"),
            " mem_alloc=7 mem_free=4 mem_alloc_async=2 mem_free_async=1 mem_create=2 mem_release=1 per_thread=3");
}

TEST(Interposer, QuotaLimitsWhatTheProgramSeesAndGets) {
  const std::string name = segment_name("quota");
  RemoveSegment cleanup{name};
  Child app({TIDEPOOL_CLI, "run", "--quota", "40%", "--ledger", name, "--", PRELOAD_APP, "--wait"});
  ASSERT_TRUE(app.read_until("ready")) << app.errors();

  const long long quota = static_cast<long long>(static_cast<long double>(kFakeTotal) * 0.4L);
  EXPECT_EQ(app.number("cudart_loaded"), 0);  // the interposer brings no CUDA runtime
  // cuMemGetInfo_v2 reports the quota as the device, through every way in.
  EXPECT_EQ(app.number("info0", 0), 0);
  EXPECT_EQ(app.number("info0", 2), quota);
  EXPECT_EQ(app.number("info0", 1), quota);
  EXPECT_EQ(app.number("dlsym_info", 2), quota);
  // JAX's 75% preallocation takes 75% of the quota, and what is left is free.
  const long long preallocation = app.number("alloc75", 1);
  EXPECT_EQ(preallocation, quota / 4 * 3);
  EXPECT_EQ(app.number("alloc75", 0), 0);
  EXPECT_EQ(app.number("info1", 1), quota - preallocation);
  // Beyond the quota: out of memory, by each way in.
  EXPECT_EQ(app.number("beyond"), kOutOfMemory);
  EXPECT_EQ(app.number("proc_beyond"), kOutOfMemory);
  EXPECT_EQ(app.number("async_beyond"), kOutOfMemory);
  EXPECT_EQ(app.number("dlsym_beyond"), kOutOfMemory);
  EXPECT_EQ(app.number("create_beyond"), kOutOfMemory);
  // Within it, every way works.
  EXPECT_EQ(app.numbers("proc_alloc"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(app.numbers("proc_free"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(app.number("lookup_async"), 0);
  EXPECT_EQ(app.numbers("async"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(app.numbers("dlsym_alloc"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(app.numbers("create"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(app.number("double_free"), 1);  // the driver's own CUDA_ERROR_INVALID_VALUE
  EXPECT_EQ(app.number("leak"), 0);

  // The ledger holds the entry: the quota, and the preallocation + the 1 MiB still live.
  {
    auto ledger = tidepool::Ledger::open_existing(name);
    ASSERT_TRUE(ledger) << ledger.error().message();
    auto snapshot = (*ledger)->snapshot();
    ASSERT_TRUE(snapshot) << snapshot.error().message();
    const auto* entry = entry_of(*snapshot, app.number("pid"));
    ASSERT_NE(entry, nullptr);
    EXPECT_TRUE(entry->alive);
    EXPECT_EQ(entry->quota_bytes, static_cast<std::size_t>(quota));
    EXPECT_EQ(entry->reserved_bytes, static_cast<std::size_t>(preallocation) + MiB);
    EXPECT_EQ(snapshot->device_total_bytes, kFakeTotal);
    EXPECT_EQ(snapshot->device_id, "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff");
  }

  app.send_line();
  ASSERT_EQ(app.finish(), 0) << app.errors();
  EXPECT_EQ(app.number("free75"), 0);
  EXPECT_EQ(app.number("info2", 1), quota - static_cast<long long>(MiB));
  // Refused requests never reached the driver.
  EXPECT_EQ(app.text("driver_calls"),
            " mem_alloc=4 mem_free=4 mem_alloc_async=1 mem_free_async=1 mem_create=1 mem_release=1 per_thread=2");
  EXPECT_NE(app.errors().find("was refused"), std::string::npos) << app.errors();

  // At exit the entry is gone, with what the program never freed.
  auto ledger = tidepool::Ledger::open_existing(name);
  ASSERT_TRUE(ledger) << ledger.error().message();
  auto snapshot = (*ledger)->snapshot();
  ASSERT_TRUE(snapshot);
  EXPECT_EQ(entry_of(*snapshot, app.number("pid")), nullptr);
  EXPECT_EQ(snapshot->reserved_bytes, 0u);
  EXPECT_GE(snapshot->peak_reserved_bytes, static_cast<std::size_t>(preallocation) + MiB);
}

TEST(Interposer, QuotasAreGuaranteesBetweenProcesses) {
  const std::string name = segment_name("share");
  RemoveSegment cleanup{name};
  Child first({TIDEPOOL_CLI, "run", "--quota", "60%", "--ledger", name, "--", PRELOAD_APP, "--wait"});
  ASSERT_TRUE(first.read_until("ready")) << first.errors();
  EXPECT_EQ(first.number("alloc75", 0), 0);

  // 60% + 60% does not fit on one device: the second is refused, with the reason.
  Child second({TIDEPOOL_CLI, "run", "--quota", "60%", "--ledger", name, "--", PRELOAD_APP});
  ASSERT_EQ(second.finish(), 0) << second.errors();
  EXPECT_EQ(second.number("alloc75", 0), kOutOfMemory);
  EXPECT_NE(second.errors().find("not accounted in the ledger"), std::string::npos) << second.errors();

  // 30% fits beside the first's 60%.
  Child third({TIDEPOOL_CLI, "run", "--quota", "30%", "--ledger", name, "--", PRELOAD_APP});
  ASSERT_EQ(third.finish(), 0) << third.errors();
  EXPECT_EQ(third.number("alloc75", 0), 0);
  first.send_line();
  EXPECT_EQ(first.finish(), 0);
}

/// preload_cases CASE under `tidepool run --quota QUOTA`, finished.
struct CaseRun {
  explicit CaseRun(const char* name, const char* quota)
      : segment(segment_name(name)),
        cleanup{segment},
        app({TIDEPOOL_CLI, "run", "--quota", quota, "--ledger", segment, "--", PRELOAD_CASES, name}) {
    status = app.finish();
  }
  std::string segment;
  RemoveSegment cleanup;
  Child app;
  int status = -1;
};

// Bug: dlsym(RTLD_DEFAULT) found the interposer's own export, which was then
// stored as the real function: the wrapper called itself (out of memory with
// a 1 GiB quota, a stack overflow with a larger one).
TEST(Interposer, DlsymOfTheDefaultScopeFindsTheDriverOnce) {
  CaseRun run("default-dlsym", "1GiB");
  ASSERT_EQ(run.status, 0) << run.app.errors();
  EXPECT_EQ(run.app.numbers("default_alloc"), (std::vector<long long>{0, 0})) << run.app.errors();
  // Both are accounted once: the quota less 64 MiB + 4 KiB is free.
  EXPECT_EQ(run.app.number("default_info", 1), static_cast<long long>(GiB));
  EXPECT_EQ(run.app.number("default_info", 0), static_cast<long long>(GiB - 64 * MiB - 4096));
  EXPECT_EQ(run.app.numbers("default_free"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(run.app.numbers("direct"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(run.app.text("driver_calls"),
            " mem_alloc=3 mem_free=3 mem_alloc_async=0 mem_free_async=0 mem_create=0 mem_release=0 per_thread=0");
}

// Bug: the per-thread-stream function asked first took slot 0, and the
// exported (legacy) cuMemAllocAsync then forwarded to it.
TEST(Interposer, LegacyStreamCallersKeepTheLegacyFunction) {
  CaseRun run("ptds-first", "1GiB");
  ASSERT_EQ(run.status, 0) << run.app.errors();
  EXPECT_EQ(run.app.numbers("ptsz"), (std::vector<long long>{0, 0, 0}));
  EXPECT_EQ(run.app.numbers("legacy"), (std::vector<long long>{0, 0}));
  // Two per-thread calls (the alloc and free asked for), then two legacy ones.
  EXPECT_EQ(run.app.text("driver_calls"),
            " mem_alloc=0 mem_free=0 mem_alloc_async=2 mem_free_async=2 mem_create=0 mem_release=0 per_thread=2");
}

// Bug: slot 0 came from RTLD_NEXT only, so a library that loaded the driver
// RTLD_LOCAL (a Python extension) got CUDA_ERROR_NOT_FOUND from every call.
TEST(Interposer, DriverLoadedLocallyIsFound) {
  const std::string name = segment_name("local");
  RemoveSegment cleanup{name};
  Child app({TIDEPOOL_CLI, "run", "--quota", "1GiB", "--ledger", name, "--", LOCAL_APP, LOCAL_EXTENSION});
  ASSERT_EQ(app.finish(), 0) << app.errors();
  EXPECT_EQ(app.numbers("local"), (std::vector<long long>{0, 0})) << app.errors();
  // The ledger saw it: the peak holds the 64 MiB.
  auto ledger = tidepool::Ledger::open_existing(name);
  ASSERT_TRUE(ledger) << ledger.error().message();
  auto snapshot = (*ledger)->snapshot();
  ASSERT_TRUE(snapshot);
  EXPECT_EQ(snapshot->peak_reserved_bytes, 64 * MiB);
}

// Bug: cuMemCreate's registration sized the quota from the current context
// (none here) rather than prop->location.id, and one failure was kept for good.
TEST(Interposer, CreateIsAccountedOnTheDeviceItNames) {
  RemoveSegment device1{segment_name("create") + "-1"};  // device 1's ledger
  CaseRun run("create", "50%");
  ASSERT_EQ(run.status, 0) << run.app.errors();
  // Before cuInit the device cannot be sized: refused, and said.
  EXPECT_EQ(run.app.number("create_uninitialized"), kOutOfMemory);
  EXPECT_NE(run.app.errors().find("device 0 is not accounted in the ledger"), std::string::npos)
      << run.app.errors();
  // Device 1 (8 GiB) with no current context: its quota is 4 GiB, so 3 GiB
  // fits and 2 GiB more does not (50% of device 0's 16 GiB would have let it).
  EXPECT_EQ(run.app.numbers("create_device1"), (std::vector<long long>{0, kOutOfMemory}));
  EXPECT_EQ(run.app.number("release_device1"), 0);
  // Device 0 is registered once the driver can answer.
  EXPECT_EQ(run.app.numbers("create_device0"), (std::vector<long long>{0, 0}));
  EXPECT_EQ(run.app.text("driver_calls"),
            " mem_alloc=0 mem_free=0 mem_alloc_async=0 mem_free_async=0 mem_create=2 mem_release=2 per_thread=0");
}

TEST(Interposer, DeviceTotalMemoryIsTheQuota) {
  CaseRun run("total-mem", "25%");
  ASSERT_EQ(run.status, 0) << run.app.errors();
  EXPECT_EQ(run.app.numbers("total"), (std::vector<long long>{0, static_cast<long long>(4 * GiB), 0,
                                                              static_cast<long long>(2 * GiB)}));
  EXPECT_EQ(run.app.numbers("proc_total"), (std::vector<long long>{0, 0, static_cast<long long>(4 * GiB)}));
  EXPECT_EQ(run.app.number("bad_device"), 101);  // the driver's CUDA_ERROR_INVALID_DEVICE
  EXPECT_EQ(run.app.numbers("total_after_alloc"), (std::vector<long long>{0, static_cast<long long>(4 * GiB), 0}));

  Child plain({PRELOAD_CASES, "total-mem"});
  ASSERT_EQ(plain.finish(), 0) << plain.errors();
  EXPECT_EQ(plain.number("total", 1), static_cast<long long>(kFakeTotal));
}

// A cuGetProcAddress answer newer than the signatures the interposer knows
// is handed out unwrapped, and said; the same function at a newer version is
// wrapped as at the known one.
TEST(Interposer, NewerRevisionsAreNotWrappedBlindly) {
  CaseRun run("future", "1GiB");
  ASSERT_EQ(run.status, 0) << run.app.errors();
  EXPECT_EQ(run.app.number("future_lookup"), 0);
  EXPECT_EQ(run.app.number("future_same_free"), 1);
  EXPECT_EQ(run.app.number("future_same_alloc"), 0);
  EXPECT_EQ(run.app.number("future_alloc"), 0);  // 2 GiB past the 1 GiB quota: not accounted
  EXPECT_NE(run.app.errors().find("cuGetProcAddress(\"cuMemAlloc\", cudaVersion=99000)"), std::string::npos)
      << run.app.errors();
}

/// A file name for a recorded trace, removed (with FILE.PID files) at the end.
struct TraceFiles {
  explicit TraceFiles(const char* what) : path("/tmp/tidepool-record-" + std::string(what) + "-" + std::to_string(getpid())) {}
  ~TraceFiles() {
    std::remove(path.c_str());
    for (const auto& child : children) std::remove(child.c_str());
  }
  std::string child(long long pid) { return children.emplace_back(path + "." + std::to_string(pid)); }
  std::string path;
  std::vector<std::string> children;
};

tidepool::trace::TraceSummary summary_of(const std::string& path) {
  auto trace = tidepool::trace::read_trace(path);
  EXPECT_TRUE(trace) << trace.error().message();
  if (!trace) return {};
  auto summary = tidepool::trace::summarize(*trace);
  EXPECT_TRUE(summary) << summary.error().message();
  return summary ? *summary : tidepool::trace::TraceSummary{};
}

TEST(Record, APatternReplaysToItsPeakLive) {
  TraceFiles files("pattern");
  const std::string ledger = segment_name("record");
  RemoveSegment cleanup{ledger};
  unsetenv("XLA_PYTHON_CLIENT_ALLOCATOR");
  setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0", 1);  // the user's own setting is kept
  Child app({TIDEPOOL_CLI, "run", "--ledger", ledger, "--record", files.path, "--", RECORD_APP, "pattern"});
  unsetenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  ASSERT_EQ(app.finish(), 0) << app.errors();
  for (const char* step : {"streams", "segment", "small", "child_status", "kept"})
    EXPECT_EQ(app.number(step), 0) << step;
  EXPECT_NE(app.errors().find("setting XLA_PYTHON_CLIENT_ALLOCATOR=platform"), std::string::npos) << app.errors();
  EXPECT_NE(app.errors().find("PYTORCH_NO_CUDA_MEMORY_CACHING=0 is kept as you set it"), std::string::npos)
      << app.errors();

  auto trace = tidepool::trace::read_trace(files.path);
  ASSERT_TRUE(trace) << trace.error().message();
  // 4 on two streams, the cuMemCreate, 3000 small ones (past the 64 KiB
  // buffer), and the 1 MiB kept; all but that one freed.
  EXPECT_EQ(trace->num_blocks, 4u + 1 + 3000 + 1);
  EXPECT_EQ(trace->events.size(), 2 * trace->num_blocks - 1);
  ASSERT_GE(trace->events.size(), 8u);
  const std::vector<std::pair<tidepool::trace::Op, tidepool::Stream>> first = {
      {tidepool::trace::Op::alloc, 0},      {tidepool::trace::Op::alloc, 0x1000}, {tidepool::trace::Op::alloc, 0x2000},
      {tidepool::trace::Op::free, 0x1000},  {tidepool::trace::Op::alloc, 0x2000}, {tidepool::trace::Op::free, 0},
      {tidepool::trace::Op::free, 0x2000},  {tidepool::trace::Op::free, 0x1000}};
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(trace->events[i].op, first[i].first) << i;
    EXPECT_EQ(trace->events[i].stream, first[i].second) << i;
    EXPECT_GT(trace->events[i].time_us, 0) << i;
  }
  const auto summary = summary_of(files.path);
  EXPECT_EQ(summary.peak_live_bytes, 8 * MiB);
  EXPECT_EQ(summary.live_bytes_at_end, MiB);

  // The child wrote its own trace, FILE.PID.
  const auto child = summary_of(files.child(app.number("child_pid")));
  EXPECT_EQ(child.allocs, 2u);
  EXPECT_EQ(child.peak_live_bytes, 11 * MiB);

  // tidepool replay compares the modes on it, to the same peak live.
  Child replay({TIDEPOOL_CLI, "replay", files.path});
  ASSERT_EQ(replay.finish(), 0) << replay.errors();
  EXPECT_TRUE(replay.has(files.path)) << replay.errors();
  EXPECT_NE(replay.text(files.path).find("peak live 8.00 MiB"), std::string::npos) << replay.text(files.path);
}

TEST(Record, TheTraceSurvivesSigterm) {
  TraceFiles files("sigterm");
  const std::string ledger = segment_name("record-term");
  RemoveSegment cleanup{ledger};
  Child app({TIDEPOOL_CLI, "run", "--ledger", ledger, "--record", files.path, "--", RECORD_APP, "sigterm"});
  EXPECT_EQ(app.finish(), -1) << app.errors();  // killed by SIGTERM, as without tidepool
  EXPECT_TRUE(app.has("terminating"));
  EXPECT_FALSE(app.has("survived"));
  const auto summary = summary_of(files.path);
  EXPECT_EQ(summary.allocs, 10u);
  EXPECT_EQ(summary.peak_live_bytes, 10 * MiB);
}

TEST(Record, AProgramThatAllocatesNothingLeavesAnEmptyTrace) {
  TraceFiles files("nothing");
  Child app({TIDEPOOL_CLI, "run", "--record", files.path, "--", "/bin/true"});
  ASSERT_EQ(app.finish(), 0) << app.errors();
  auto trace = tidepool::trace::read_trace(files.path);
  ASSERT_TRUE(trace) << trace.error().message();
  EXPECT_EQ(trace->events.size(), 0u);
}

TEST(Record, AnUnwritableFileIsRefusedBeforeTheProgramStarts) {
  Child app({TIDEPOOL_CLI, "run", "--record", "/nonexistent/dir/trace", "--", RECORD_APP, "pattern"});
  EXPECT_EQ(app.finish(), 1);
  EXPECT_NE(app.errors().find("--record '/nonexistent/dir/trace': cannot write it"), std::string::npos)
      << app.errors();
  EXPECT_FALSE(app.has("pid"));
}

// --pool expandable: cuMemAlloc_v2 served from the pool over the fake
// driver's virtual-memory calls (real memory: data written is read back).
TEST(Pool, ServesTheProgramsAllocationsFromThePool) {
  const std::string ledger = segment_name("pool");
  RemoveSegment cleanup{ledger};
  TraceFiles report("pool-report");
  setenv("TIDEPOOL_REPORT", report.path.c_str(), 1);
  Child app({TIDEPOOL_CLI, "run", "--pool", "expandable", "--quota", "4GiB", "--ledger", ledger, "--", POOL_APP,
             "--wait"});
  unsetenv("TIDEPOOL_REPORT");
  ASSERT_TRUE(app.read_until("ready")) << app.errors();
  EXPECT_EQ(app.number("alloc"), 0);
  EXPECT_EQ(app.number("intact"), 1);
  EXPECT_EQ(app.number("realloc"), 0);
  EXPECT_EQ(app.number("intact_after"), 1);
  // A double free and a pointer inside a block are refused as the driver
  // refuses them (CUDA_ERROR_INVALID_VALUE); memory the driver gave past
  // the pool is freed by the driver.
  EXPECT_EQ(app.numbers("double_free"), (std::vector<long long>{0, 0, 1}));
  EXPECT_EQ(app.number("inside_free"), 1);
  EXPECT_EQ(app.numbers("foreign"), (std::vector<long long>{0, 0}));
  // Beyond the quota: out of memory; the quota is the device it sees.
  EXPECT_EQ(app.number("beyond"), kOutOfMemory);
  EXPECT_EQ(app.number("info", 2), static_cast<long long>(4 * GiB));

  // The footprint is the pool's: 2 MiB granules the driver created, just
  // above what is live, and the ledger holds exactly them.
  const long long live = app.number("live");
  const long long physical = app.number("physical");
  EXPECT_EQ(physical % static_cast<long long>(2 * MiB), 0);
  EXPECT_GE(physical, live);
  EXPECT_LT(physical, live + static_cast<long long>(12 * 2 * MiB));
  {
    auto opened = tidepool::Ledger::open_existing(ledger);
    ASSERT_TRUE(opened) << opened.error().message();
    auto snapshot = (*opened)->snapshot();
    ASSERT_TRUE(snapshot);
    const auto* entry = entry_of(*snapshot, app.number("pid"));
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->reserved_bytes, static_cast<std::size_t>(physical));
  }
  // What the pool holds unused (its blocks are the sizes asked, 512-byte
  // multiples here) is free to the program: the quota less what is live.
  EXPECT_EQ(app.number("info", 1), static_cast<long long>(4 * GiB) - live);

  app.send_line();
  ASSERT_EQ(app.finish(), 0) << app.errors();
  EXPECT_EQ(app.number("free"), 0);
  // The refusal beyond the quota names --quota: the pool has all of it, and
  // no fraction was set that could be raised.
  EXPECT_NE(app.errors().find("raise --quota"), std::string::npos) << app.errors();
  EXPECT_EQ(app.errors().find("MEM_FRACTION"), std::string::npos) << app.errors();
  // The pool made no cuMemAlloc (the one is the program's own, past it), and
  // each of the program's 19 frees of a pool block waited for the device.
  EXPECT_EQ(app.text("driver_calls").substr(0, 24), " mem_alloc=1 mem_free=1 ");
  EXPECT_NE(app.text("vmm_calls").find("ctx_synchronize=19"), std::string::npos) << app.text("vmm_calls");
  EXPECT_NE(app.errors().find("tidepool: pool expandable on device 0: 19 allocations"), std::string::npos)
      << app.errors();
  std::ifstream json(report.path);
  const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"mode\": \"expandable\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"ooms\": 1"), std::string::npos) << text;
}

// A pool holding cached memory gives it back when another process needs it.
TEST(Pool, CachedMemoryIsTrimmedForAnotherProcess) {
  const std::string ledger = segment_name("pool-trim");
  RemoveSegment cleanup{ledger};
  Child holder({TIDEPOOL_CLI, "run", "--pool", "expandable", "--ledger", ledger, "--", POOL_APP, "hold-cached",
                "10"});
  ASSERT_TRUE(holder.read_until("cached 0")) << holder.errors();
  // 10 of the 16 GiB are cached by the holder: 8 GiB fit only once it trims.
  Child taker({TIDEPOOL_CLI, "run", "--ledger", ledger, "--", POOL_APP, "take", "8"});
  ASSERT_EQ(taker.finish(), 0) << taker.errors();
  EXPECT_EQ(taker.number("take"), 0) << taker.errors();
  holder.send_line();
  ASSERT_EQ(holder.finish(), 0) << holder.errors();
  EXPECT_EQ(holder.text("vmm_calls").find("mem_unmap=0 "), std::string::npos) << holder.text("vmm_calls");
}

// The Python way in: ctypes loads the driver and allocates through it.
TEST(Pool, ServesAPythonProgram) {
  if (std::system("command -v python3 > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 on PATH";
  const std::string ledger = segment_name("pool-python");
  RemoveSegment cleanup{ledger};
  setenv("LD_LIBRARY_PATH", FAKE_DRIVER_DIR, 1);
  Child app({TIDEPOOL_CLI, "run", "--pool", "expandable", "--ledger", ledger, "--", "/usr/bin/env", "python3",
             POOL_APP_PY});
  unsetenv("LD_LIBRARY_PATH");
  ASSERT_EQ(app.finish(), 0) << app.errors();
  EXPECT_EQ(app.number("alloc"), 0) << app.errors();
  EXPECT_EQ(app.number("intact"), 1);
  EXPECT_EQ(app.numbers("double_free"), (std::vector<long long>{0, 1}));
  EXPECT_EQ(app.number("physical") % static_cast<long long>(2 * MiB), 0);
  EXPECT_GE(app.number("physical"), app.number("live"));
  EXPECT_NE(app.errors().find("tidepool: pool expandable on device 0"), std::string::npos) << app.errors();
}

TEST(Pool, RefusesModesThatCannotServe) {
  Child bad({TIDEPOOL_CLI, "run", "--pool", "bogus", "--", POOL_APP});
  EXPECT_EQ(bad.finish(), 1);
  EXPECT_NE(bad.errors().find("--pool: "), std::string::npos) << bad.errors();
  EXPECT_FALSE(bad.has("pid"));
  Child driver_pool({TIDEPOOL_CLI, "run", "--pool", "cuda_async", "--", POOL_APP});
  EXPECT_EQ(driver_pool.finish(), 1);
  EXPECT_NE(driver_pool.errors().find("--pool cuda_async"), std::string::npos) << driver_pool.errors();
}

TEST(RunCommand, RefusesBadArguments) {
  Child bad_quota({TIDEPOOL_CLI, "run", "--quota", "150%", "--", PRELOAD_APP});
  EXPECT_EQ(bad_quota.finish(), 1);
  EXPECT_NE(bad_quota.errors().find("--quota: TIDEPOOL_QUOTA='150%' is invalid"), std::string::npos)
      << bad_quota.errors();

  Child bad_ledger({TIDEPOOL_CLI, "run", "--ledger", "a/b", "--", PRELOAD_APP});
  EXPECT_EQ(bad_ledger.finish(), 1);
  EXPECT_NE(bad_ledger.errors().find("--ledger 'a/b'"), std::string::npos) << bad_ledger.errors();

  // The interposer would read the same configuration: a bad one stops the program before it starts.
  setenv("TIDEPOOL_ALLOCATOR", "bogus", 1);
  Child bad_environment({TIDEPOOL_CLI, "run", "--", PRELOAD_APP});
  unsetenv("TIDEPOOL_ALLOCATOR");
  EXPECT_EQ(bad_environment.finish(), 1);
  EXPECT_NE(bad_environment.errors().find("TIDEPOOL_ALLOCATOR='bogus'"), std::string::npos) << bad_environment.errors();
  EXPECT_FALSE(bad_environment.has("pid"));

  Child missing({TIDEPOOL_CLI, "run", "--", "/nonexistent/program"});
  EXPECT_EQ(missing.finish(), 127);
  EXPECT_NE(missing.errors().find("cannot run '/nonexistent/program'"), std::string::npos) << missing.errors();

  Child no_library({TIDEPOOL_CLI, "run", "--preload", "/nonexistent/lib.so", "--", PRELOAD_APP});
  EXPECT_EQ(no_library.finish(), 1);
  EXPECT_NE(no_library.errors().find("--preload"), std::string::npos) << no_library.errors();
}

}  // namespace
