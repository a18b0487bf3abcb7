// An account's answers to the other processes' trim requests: the pool's
// hooks, called from a background thread (and from the allocate path), and
// the reports they give written into the entry.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "share/account_slot.hpp"
#include "tidepool/ledger_account.hpp"

namespace tidepool::share {

class TrimAnswerer {
 public:
  /// For `slot`, registered just now: requests posted before count as seen.
  TrimAnswerer(const AccountSlot& slot, std::chrono::milliseconds poll_period);
  /// Stops the thread. Not in a forked child: the thread is the parent's
  /// (~LedgerAccount leaves the answerer there).
  ~TrimAnswerer();
  TrimAnswerer(const TrimAnswerer&) = delete;
  TrimAnswerer& operator=(const TrimAnswerer&) = delete;

  /// See LedgerAccount::set_trim_hooks.
  void set_hooks(TrimHooks hooks);
  /// See LedgerAccount::clear_trim_hooks.
  void clear_hooks();
  /// See LedgerAccount::refresh_reports.
  void refresh_reports();
  /// See LedgerAccount::trim_requested.
  bool requested() const noexcept {
    return seen_generation_.load(std::memory_order_relaxed) != answered_generation_.load(std::memory_order_relaxed);
  }
  /// See LedgerAccount::answer_trim_requests.
  std::size_t answer();

 private:
  void background();
  /// The hooks' reports into the entry; hooks_mutex_ held.
  void refresh_locked();
  /// Whether another live entry waits for memory; hooks_mutex_ held.
  bool others_want() const;

  const AccountSlot& slot_;
  const std::chrono::milliseconds poll_period_;

  std::mutex hooks_mutex_;  // held while a hook runs, so clear_hooks waits for it
  TrimHooks hooks_;
  std::atomic<std::uint64_t> answered_generation_{0};
  // The segment's trim_generation as the background thread last read it:
  // what the allocate path's requested() compares, so that path never
  // touches the mapping (a segment truncated under us cannot fault there).
  std::atomic<std::uint64_t> seen_generation_{0};

  std::mutex thread_mutex_;
  std::condition_variable thread_wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tidepool::share
