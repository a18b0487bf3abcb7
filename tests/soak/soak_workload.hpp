// The soak workload: several threads allocate, write a data pattern into every
// block, verify it before freeing, hand blocks to each other to free, trim and
// read stats, for a set time, while a checker pauses them at intervals and
// compares the live set with the allocator's stats and the device's
// accounting. It reports what it did and every violation it saw: two live
// blocks that overlap, a pattern that changed, stats or device accounting that
// do not match the live set, an error the allocator should not have returned,
// memory the pool did not give back.
//
// Used by the soak program (soak.cpp) and its tests; header-only so both build
// from tests/soak without a library of their own.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tidepool/allocator.hpp"
#include "tidepool/device.hpp"
#include "tidepool/error.hpp"
#include "tidepool/units.hpp"

namespace tidepool::soak {

struct SoakOptions {
  /// How long the workers run (the final checks come after).
  double seconds = 10.0;
  unsigned threads = 4;
  /// Largest request; sizes are drawn log-uniformly in three bands: 70% of
  /// 1 B..4 KiB, 25% of 4 KiB..1 MiB, 5% of 1 MiB..max_block_bytes.
  std::size_t max_block_bytes = 16 * MiB;
  /// Each thread keeps about this many blocks live (fewer after an OOM).
  std::size_t live_blocks_per_thread = 256;
  /// How often the checker pauses the workers to verify every live block and
  /// the stats.
  std::chrono::milliseconds check_period{500};
  std::uint64_t seed = 1;
};

enum class ViolationKind {
  overlap,           // a block handed out overlaps a live one
  pattern_mismatch,  // a live block's bytes changed under its owner
  stats_mismatch,    // stats() or the device's accounting disagree with the live set
  unexpected_error,  // an error other than out_of_memory, or a failed free
  leak,              // device memory not returned after everything was freed and the pool destroyed
};

inline const char* violation_kind_name(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::overlap: return "overlap";
    case ViolationKind::pattern_mismatch: return "pattern mismatch";
    case ViolationKind::stats_mismatch: return "stats mismatch";
    case ViolationKind::unexpected_error: return "unexpected error";
    case ViolationKind::leak: return "leak";
  }
  return "?";
}

struct Violation {
  ViolationKind kind;
  std::string detail;
};

struct SoakResult {
  double seconds = 0;             // the workers' running time
  std::uint64_t allocations = 0;  // successful allocate() calls
  std::uint64_t frees = 0;        // deallocate() calls (cross-thread ones included)
  std::uint64_t cross_thread_frees = 0;
  std::uint64_t ooms = 0;         // allocate() refused with out_of_memory
  std::uint64_t trims = 0;
  std::uint64_t checkpoints = 0;
  std::uint64_t bytes_verified = 0;  // pattern bytes compared
  Stats final_stats;                 // after the workers stopped, before the final free
  std::size_t peak_device_bytes = 0;  // most device bytes the pool held at a checkpoint
  std::vector<Violation> violations;  // the first kMaxViolations
  std::uint64_t violation_count = 0;

  static constexpr std::size_t kMaxViolations = 32;

  double ops_per_second() const {
    return seconds > 0 ? static_cast<double>(allocations + frees) / seconds : 0.0;
  }
  bool clean() const { return violation_count == 0; }
  bool has(ViolationKind kind) const {
    return std::any_of(violations.begin(), violations.end(),
                       [&](const Violation& v) { return v.kind == kind; });
  }
};

/// Makes the pool under test over the device the soak watches.
using PoolFactory = std::function<Expected<std::unique_ptr<Allocator>>(std::shared_ptr<Device>)>;

namespace detail {

struct Block {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  std::uint64_t tag = 0;  // seeds the pattern; unique per allocation
  Stream stream = kDefaultStream;
};

// Word i of a block holds tag ^ (i * golden ratio): no two blocks and no two
// offsets hold the same word, so a block written by anyone else is caught.
inline std::uint64_t pattern_word(std::uint64_t tag, std::size_t index) {
  return tag ^ (static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull);
}

inline void write_pattern(const Block& block) {
  auto* words = reinterpret_cast<std::uint64_t*>(block.address);  // kMinAlignment-aligned
  const std::size_t count = block.bytes / 8;
  for (std::size_t i = 0; i < count; ++i) words[i] = pattern_word(block.tag, i);
  const std::uint64_t last = pattern_word(block.tag, count);
  std::memcpy(words + count, &last, block.bytes % 8);
}

/// The first offset where the block differs from its pattern, or -1.
inline std::int64_t find_mismatch(const Block& block) {
  const auto* words = reinterpret_cast<const std::uint64_t*>(block.address);
  const std::size_t count = block.bytes / 8;
  for (std::size_t i = 0; i < count; ++i) {
    if (words[i] != pattern_word(block.tag, i)) {
      for (std::size_t b = 0; b < 8; ++b) {
        const std::uint64_t expected = pattern_word(block.tag, i);
        if (reinterpret_cast<const unsigned char*>(words + i)[b] !=
            reinterpret_cast<const unsigned char*>(&expected)[b])
          return static_cast<std::int64_t>(i * 8 + b);
      }
    }
  }
  const std::uint64_t last = pattern_word(block.tag, count);
  const auto* tail = reinterpret_cast<const unsigned char*>(words + count);
  for (std::size_t b = 0; b < block.bytes % 8; ++b) {
    if (tail[b] != reinterpret_cast<const unsigned char*>(&last)[b])
      return static_cast<std::int64_t>(count * 8 + b);
  }
  return -1;
}

inline std::string describe(const Block& block) {
  return "block " + format_address(block.address) + " of " + std::to_string(block.bytes) + " bytes (stream " +
         std::to_string(block.stream) + ")";
}

/// Lets the checker stop every worker between two operations.
class PauseGate {
 public:
  /// A worker, before an operation: waits while the checker holds the gate.
  void enter() {
    std::unique_lock lock(mutex_);
    resume_.wait(lock, [&] { return !paused_; });
    ++active_;
  }
  void leave() {
    std::lock_guard lock(mutex_);
    if (--active_ == 0 && paused_) idle_.notify_all();
  }
  /// The checker: returns once no worker is inside an operation.
  void pause() {
    std::unique_lock lock(mutex_);
    paused_ = true;
    idle_.wait(lock, [&] { return active_ == 0; });
  }
  void resume() {
    {
      std::lock_guard lock(mutex_);
      paused_ = false;
    }
    resume_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable resume_, idle_;
  bool paused_ = false;
  int active_ = 0;
};

class Soak {
 public:
  /// `device`: the one the pool was built over (decorators the stack put
  /// under the pool, such as its limit, may report free bytes of their own).
  Soak(Allocator& allocator, const Device& device, std::size_t device_free_before, const SoakOptions& options)
      : allocator_(allocator), device_(device), device_free_before_(device_free_before), options_(options),
        threads_(std::max(1u, options.threads)) {}

  void violation(ViolationKind kind, std::string detail) {
    std::lock_guard lock(violations_mutex_);
    ++result_.violation_count;
    if (result_.violations.size() < SoakResult::kMaxViolations)
      result_.violations.push_back({kind, std::move(detail)});
    stop_.store(true);  // the first violation ends the run: what follows would be noise
  }

  SoakResult run() {
    std::vector<std::thread> workers;
    const auto start = std::chrono::steady_clock::now();
    const auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(options_.seconds));
    for (unsigned t = 0; t < threads_.size(); ++t) workers.emplace_back([this, t] { work(t); });
    auto next_check = start + options_.check_period;
    while (!stop_.load() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_until(std::min(next_check, end));
      if (std::chrono::steady_clock::now() >= next_check && !stop_.load()) {
        gate_.pause();
        checkpoint("checkpoint");
        gate_.resume();
        next_check = std::chrono::steady_clock::now() + options_.check_period;
      }
    }
    stop_.store(true);
    for (auto& worker : workers) worker.join();
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const Worker& w : threads_) {
      result_.allocations += w.allocations;
      result_.frees += w.frees;
      result_.cross_thread_frees += w.cross_thread_frees;
      result_.ooms += w.ooms;
      result_.trims += w.trims;
    }
    checkpoint("after the run");
    result_.final_stats = allocator_.stats();
    free_everything();
    return result_;
  }

  /// After the pool is destroyed: every byte it took must be back.
  void check_device_after_destruction(const Device& device) {
    const std::size_t free_now = device.mem_info().free_bytes;
    if (free_now != device_free_before_) {
      violation(ViolationKind::leak, "after the pool was destroyed the device has " + std::to_string(free_now) +
                                         " bytes free; before it was created, " +
                                         std::to_string(device_free_before_));
    }
  }

  SoakResult result() const { return result_; }

 private:
  struct Worker {
    std::vector<Block> live;
    std::uint64_t allocations = 0, frees = 0, cross_thread_frees = 0, ooms = 0, trims = 0;
  };

  std::size_t draw_size(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double band = unit(rng);
    const double low = band < 0.70 ? 1.0 : band < 0.95 ? 4096.0 : 1048576.0;
    double high = band < 0.70 ? 4096.0 : band < 0.95 ? 1048576.0 : static_cast<double>(options_.max_block_bytes);
    high = std::min(high, static_cast<double>(options_.max_block_bytes));
    if (high <= low) return static_cast<std::size_t>(high);
    const double bytes = std::exp(std::log(low) + unit(rng) * (std::log(high) - std::log(low)));
    return std::max<std::size_t>(1, static_cast<std::size_t>(bytes));
  }

  // Enters the block into the overlap map; false (and a violation) when it
  // overlaps a live block.
  bool claim(const Block& block) {
    std::lock_guard lock(live_mutex_);
    const std::uintptr_t end = block.address + block.bytes;
    auto next = live_.lower_bound(block.address);
    if (next != live_.end() && next->first < end) {
      overlap(block, next->second);
      return false;
    }
    if (next != live_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second.bytes > block.address) {
        overlap(block, previous->second);
        return false;
      }
    }
    live_.emplace(block.address, block);
    return true;
  }
  void overlap(const Block& block, const Block& other) {
    violation(ViolationKind::overlap, "allocate(" + std::to_string(block.bytes) + ") returned " +
                                          format_address(block.address) + ", which overlaps the live " +
                                          describe(other));
  }
  void unclaim(const Block& block) {
    std::lock_guard lock(live_mutex_);
    live_.erase(block.address);
  }

  bool verify(const Block& block, const char* when) {
    const std::int64_t offset = find_mismatch(block);
    bytes_verified_.fetch_add(block.bytes, std::memory_order_relaxed);
    if (offset < 0) return true;
    violation(ViolationKind::pattern_mismatch,
              describe(block) + " " + when + ": byte " + std::to_string(offset) + " changed");
    return false;
  }

  // Verifies, forgets and frees one block.
  void release(Worker& w, const Block& block, bool cross_thread) {
    verify(block, "before its free");
    unclaim(block);  // before the free: afterwards the pool may hand it out again
    Status freed = allocator_.deallocate(reinterpret_cast<void*>(block.address), block.stream);
    if (!freed) {
      violation(ViolationKind::unexpected_error, "free of " + describe(block) + ": " + freed.error().message());
    }
    ++w.frees;
    if (cross_thread) ++w.cross_thread_frees;
  }

  void allocate(Worker& w, unsigned thread, std::mt19937_64& rng) {
    Block block;
    block.bytes = draw_size(rng);
    block.stream = (rng() & 1) ? kDefaultStream : Stream{thread + 1};
    Expected<void*> ptr = allocator_.allocate(block.bytes, block.stream);
    if (!ptr) {
      if (ptr.error().code() != Errc::out_of_memory) {
        violation(ViolationKind::unexpected_error,
                  "allocate(" + std::to_string(block.bytes) + "): " + ptr.error().message());
        return;
      }
      ++w.ooms;
      // Near capacity: let a quarter of this thread's blocks go.
      for (std::size_t n = w.live.size() / 4; n > 0 && !w.live.empty(); --n) free_random(w, rng);
      return;
    }
    ++w.allocations;
    block.address = reinterpret_cast<std::uintptr_t>(*ptr);
    block.tag = next_tag_.fetch_add(1, std::memory_order_relaxed) * 0xD1B54A32D192ED03ull + 1;
    if (block.address == 0 || !is_aligned(block.address, kMinAlignment)) {
      violation(ViolationKind::unexpected_error, "allocate(" + std::to_string(block.bytes) + ") returned " +
                                                     format_address(block.address) + ", not " +
                                                     std::to_string(kMinAlignment) + "-byte aligned");
      return;
    }
    if (!claim(block)) return;  // not written: it would corrupt the block it overlaps
    write_pattern(block);
    w.live.push_back(block);
  }

  void free_random(Worker& w, std::mt19937_64& rng) {
    const std::size_t i = std::uniform_int_distribution<std::size_t>(0, w.live.size() - 1)(rng);
    const Block block = w.live[i];
    w.live[i] = w.live.back();
    w.live.pop_back();
    if (rng() % 20 == 0) {  // 5%: another thread verifies and frees it
      std::lock_guard lock(handoff_mutex_);
      handoff_.push_back(block);
      return;
    }
    release(w, block, false);
  }

  void free_handed_off(Worker& w) {
    Block block;
    {
      std::lock_guard lock(handoff_mutex_);
      if (handoff_.empty()) return;
      block = handoff_.back();
      handoff_.pop_back();
    }
    release(w, block, true);
  }

  // Stats read while others allocate must still be consistent in themselves.
  void check_stats_snapshot() {
    const Stats s = allocator_.stats();
    if (s.bytes_in_use < 0 || s.bytes_in_use > s.bytes_reserved || s.bytes_in_use > s.peak_bytes_in_use ||
        s.bytes_reserved > s.peak_bytes_reserved) {
      violation(ViolationKind::stats_mismatch,
                "concurrent stats(): bytes_in_use " + std::to_string(s.bytes_in_use) + ", peak " +
                    std::to_string(s.peak_bytes_in_use) + ", bytes_reserved " + std::to_string(s.bytes_reserved) +
                    ", peak " + std::to_string(s.peak_bytes_reserved));
    }
  }

  void work(unsigned thread) {
    Worker& w = threads_[thread];
    std::mt19937_64 rng(options_.seed * 1000003 + thread);
    std::uniform_int_distribution<int> percent(0, 9999);
    while (!stop_.load(std::memory_order_relaxed)) {
      gate_.enter();
      for (int op = 0; op < 16 && !stop_.load(std::memory_order_relaxed); ++op) {
        const int r = percent(rng);
        if (r < 5) {
          allocator_.trim();
          ++w.trims;
        } else if (r < 60) {
          check_stats_snapshot();
        } else if (r < 300) {
          free_handed_off(w);
        } else if (w.live.empty() || (w.live.size() < options_.live_blocks_per_thread && r < 5500)) {
          allocate(w, thread, rng);
        } else {
          free_random(w, rng);
        }
      }
      gate_.leave();
    }
  }

  // With every worker paused: every live block still holds its pattern, and
  // the stats and the device's accounting match the live set.
  void checkpoint(const char* when) {
    ++result_.checkpoints;
    std::uint64_t allocations = 0, ooms = 0;
    std::int64_t rounded_bytes = 0;
    std::size_t blocks = 0;
    auto visit = [&](const Block& block) {
      verify(block, (std::string("at the ") + when).c_str());
      rounded_bytes += static_cast<std::int64_t>(round_up(block.bytes, kMinAlignment));
      ++blocks;
    };
    for (const Worker& w : threads_) {
      allocations += w.allocations;
      ooms += w.ooms;
      for (const Block& block : w.live) visit(block);
    }
    for (const Block& block : handoff_) visit(block);
    result_.bytes_verified = bytes_verified_.load();

    const Stats s = allocator_.stats();
    auto mismatch = [&](const std::string& what) {
      violation(ViolationKind::stats_mismatch, std::string(when) + ": " + what);
    };
    if (blocks != live_.size())
      mismatch(std::to_string(blocks) + " blocks held but " + std::to_string(live_.size()) + " in the overlap map");
    if (s.num_allocs != static_cast<std::int64_t>(allocations))
      mismatch("stats num_allocs " + std::to_string(s.num_allocs) + ", but " + std::to_string(allocations) +
               " allocations succeeded");
    if (s.num_ooms != static_cast<std::int64_t>(ooms))
      mismatch("stats num_ooms " + std::to_string(s.num_ooms) + ", but " + std::to_string(ooms) +
               " allocations were refused");
    // Pools may hand out a little more than asked (an unsplit remainder), never less.
    if (s.bytes_in_use < rounded_bytes)
      mismatch("stats bytes_in_use " + std::to_string(s.bytes_in_use) + ", less than the " +
               std::to_string(rounded_bytes) + " bytes (rounded to " + std::to_string(kMinAlignment) + ") of " +
               std::to_string(blocks) + " live blocks");
    if (blocks == 0 && s.bytes_in_use != 0)
      mismatch("stats bytes_in_use " + std::to_string(s.bytes_in_use) + " with no block live");
    if (s.bytes_in_use > s.bytes_reserved)
      mismatch("bytes_in_use " + std::to_string(s.bytes_in_use) + " above bytes_reserved " +
               std::to_string(s.bytes_reserved));
    if (s.bytes_limit > 0 && s.bytes_reserved > s.bytes_limit)
      mismatch("bytes_reserved " + std::to_string(s.bytes_reserved) + " above bytes_limit " +
               std::to_string(s.bytes_limit));
    if (s.peak_bytes_in_use < s.bytes_in_use || s.peak_bytes_reserved < s.bytes_reserved)
      mismatch("a peak below its current value");
    check_device(s, when, blocks == 0);
  }

  // What the device lost since before the pool was made is at least what the
  // pool says it holds; exactly that once nothing is live. (With blocks live
  // it may be more: the pass-through pool counts each block rounded to 256
  // bytes, as the other pools do, while the device rounds it to a page.)
  void check_device(const Stats& s, const char* when, bool exact) {
    const std::size_t free_now = device_.mem_info().free_bytes;
    const auto held = static_cast<std::int64_t>(device_free_before_) - static_cast<std::int64_t>(free_now);
    result_.peak_device_bytes = std::max(result_.peak_device_bytes, static_cast<std::size_t>(std::max<std::int64_t>(held, 0)));
    if (exact ? held != s.bytes_reserved : held < s.bytes_reserved) {
      violation(ViolationKind::stats_mismatch,
                std::string(when) + ": the pool holds " + std::to_string(held) +
                    " bytes of the device but its stats say bytes_reserved " + std::to_string(s.bytes_reserved));
    }
  }

  void free_everything() {
    Worker& w = threads_.front();
    for (Worker& other : threads_) {
      for (const Block& block : other.live) release(w, block, false);
      other.live.clear();
    }
    for (const Block& block : handoff_) release(w, block, false);
    handoff_.clear();
    const Stats s = allocator_.stats();
    if (s.bytes_in_use != 0)
      violation(ViolationKind::stats_mismatch, "after every block was freed, bytes_in_use is " +
                                                   std::to_string(s.bytes_in_use));
    allocator_.trim();
    check_device(allocator_.stats(), "after freeing everything and trim()", true);
    result_.bytes_verified = bytes_verified_.load();
  }

  Allocator& allocator_;
  const Device& device_;
  const std::size_t device_free_before_;
  const SoakOptions options_;
  std::vector<Worker> threads_;
  PauseGate gate_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> next_tag_{1};
  std::atomic<std::uint64_t> bytes_verified_{0};

  std::mutex live_mutex_;
  std::map<std::uintptr_t, Block> live_;  // every live block by address: the overlap check
  std::mutex handoff_mutex_;
  std::vector<Block> handoff_;  // blocks waiting for another thread to free them

  std::mutex violations_mutex_;
  SoakResult result_;
};

}  // namespace detail

/// Runs the soak on a pool `make_pool` builds over `device`, then frees
/// everything, trims, destroys the pool and checks that the device got every
/// byte back. A pool that cannot be built is one unexpected_error violation.
inline SoakResult run_soak(const std::shared_ptr<Device>& device, const PoolFactory& make_pool,
                           const SoakOptions& options) {
  const std::size_t free_before = device->mem_info().free_bytes;
  Expected<std::unique_ptr<Allocator>> pool = make_pool(device);
  if (!pool) {
    SoakResult result;
    result.violation_count = 1;
    result.violations.push_back({ViolationKind::unexpected_error, "the pool: " + pool.error().message()});
    return result;
  }
  detail::Soak soak(**pool, *device, free_before, options);
  soak.run();
  pool->reset();
  soak.check_device_after_destruction(*device);
  return soak.result();
}

}  // namespace tidepool::soak
