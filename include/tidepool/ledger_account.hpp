// LedgerAccount: this process's entry in one device's cross-process ledger
// (tidepool/ledger.hpp), and the one owner of every access to it. Whatever
// takes memory from the device for this process reserves it here first:
// LedgerDevice (the stack's device decorator) for the pools, and `tidepool
// run`'s interposer directly for the program's own driver calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool {

class Ledger;

/// What an account calls to make the process's pools give cached memory
/// back. The stack registers them for the pool it builds over the ledger;
/// they are called from the account's background thread or from
/// LedgerAccount::answer_trim_requests, never from inside a reservation.
struct TrimHooks {
  /// Returns every cached, fully free piece of memory to the device
  /// (Allocator::trim); returns the bytes released.
  std::function<std::size_t()> trim;
  /// Bytes held from the device and not in use (reserved - in use).
  std::function<std::size_t()> cached_free_bytes;
  /// Bytes of sleeping tags (ExpandablePool::sleep): given back, to be taken
  /// again at wake. Unset: 0.
  std::function<std::size_t()> asleep_bytes;
};

/// How a process takes part in a device's ledger.
struct LedgerOptions {
  /// The segment; empty: ledger_segment_name(device id).
  std::string segment_name;
  /// The most all processes may reserve together; 0: the device's total.
  std::size_t shared_limit_bytes = 0;
  /// This process's quota (TIDEPOOL_QUOTA), at most the limit; 0: none.
  std::size_t quota_bytes = 0;
  /// Permissions of a new segment: 0600 or 0660.
  unsigned mode = 0600;
  /// When a reservation does not fit, post a trim request and wait for other
  /// processes to release cached memory before reporting out_of_memory.
  bool cooperative_trim = true;
  /// The longest a short request waits for others' trims before out_of_memory.
  std::chrono::milliseconds trim_wait{2000};
  /// The longest a wake (a batch reservation, reserve_many) waits for the
  /// others to free or trim before out_of_memory. It asks them to trim again
  /// each time they have answered.
  std::chrono::milliseconds wake_wait{10000};
  /// Period of the background thread that answers others' trim requests and
  /// refreshes this process's cached-free report (every 10 periods); it runs
  /// while trim hooks are set. 0: no thread (answer_trim_requests only).
  std::chrono::milliseconds poll_period{10};
  /// How long to wait for the ledger's lock before reporting a wedged ledger.
  std::chrono::milliseconds lock_timeout{5000};
};

/// This process's entry in a ledger segment: registered at creation,
/// cleared at destruction (releasing whatever is still reserved in it).
/// Thread-safe. The budget rule is ledger.hpp's.
///
/// A child forked after registration inherits the object but not the entry
/// (it is the parent's): there reserve fails with unsupported, and
/// unreserve, the hooks, the reports, trim answers and the destructor leave
/// the entry alone, taking no lock the parent's thread may have held at the
/// fork.
class LedgerAccount {
 public:
  /// Registers this process in `ledger`, clearing dead entries first.
  /// Errors: invalid_argument for a quota above the limit; out_of_memory
  /// when the quota does not fit beside the commitments of the live
  /// processes (the message names them); limit_reached when the segment has
  /// no free entry; the lock's errors (corrupt_data, device_error).
  static Expected<std::shared_ptr<LedgerAccount>> create(std::unique_ptr<Ledger> ledger,
                                                         LedgerOptions options = {});
  /// Opens the ledger of the device `device_id` of `device_total_bytes`
  /// (options.segment_name, else ledger_segment_name(device_id,
  /// options.mode)), making it when it does not exist, then registers as
  /// create. Errors: those of Ledger::open_or_create and of create.
  static Expected<std::shared_ptr<LedgerAccount>> open(std::string_view device_id,
                                                       std::size_t device_total_bytes,
                                                       LedgerOptions options = {});
  /// Stops the background thread and clears the entry.
  ~LedgerAccount();
  LedgerAccount(const LedgerAccount&) = delete;
  LedgerAccount& operator=(const LedgerAccount&) = delete;

  /// Reserves `bytes` (0: nothing to do). When they do not fit, asks the
  /// other processes to trim and waits up to trim_wait; then out_of_memory
  /// naming the processes that hold the device. Before taking memory from
  /// the device; unreserve when the device then refuses.
  Status reserve(std::size_t bytes);
  /// Reserves `count` x `bytes_each` as one reservation (never part of it),
  /// waiting up to wake_wait for the others to free or trim, and asking
  /// again each time they have answered: how a pool's wake takes its memory
  /// back. A wait counts in the entry's wake_waits. invalid_argument when
  /// the product overflows.
  Status reserve_many(std::size_t bytes_each, std::size_t count);
  /// Gives back `bytes` reserved before, once the device has them back.
  /// Lock-free: it only lowers the sum.
  void unreserve(std::size_t bytes) noexcept;

  /// Bytes this process could reserve now (from lock-free reads: an estimate).
  std::size_t room() const;
  /// This process's share of a device whose own figures are `device`, as
  /// CUDA MPS reports a pinned memory limit: total is the quota (or the
  /// shared limit, at most the device's total, when there is none), free
  /// what this process could reserve now, at most the device's free.
  MemInfo share_of(const MemInfo& device) const;

  /// Sets what answers other processes' trim requests and reports cached
  /// memory, and starts the background thread (options.poll_period). A
  /// process with a quota never answers (its trim would give no one else
  /// budget); it still reports.
  void set_trim_hooks(TrimHooks hooks);
  /// Removes the hooks, waiting for a call in progress to return. Call
  /// before the pool the hooks refer to is destroyed.
  void clear_trim_hooks();
  /// Writes the hooks' reports (cached free, asleep bytes) into the entry
  /// now, rather than at the background thread's next turn.
  void refresh_reports();
  /// Whether another process has posted a trim request this process has
  /// not answered yet: one relaxed load of a process-local copy, cheap
  /// enough for every allocator call (the mapping is not touched).
  bool trim_requested() const noexcept;
  /// Answers pending trim requests now through the hooks (not from inside a
  /// device call: the pool's trim takes the pool's lock). Returns the bytes
  /// released.
  std::size_t answer_trim_requests();

  /// Bytes this process has reserved.
  std::size_t reserved_bytes() const;
  /// This process's quota; 0: none.
  std::size_t quota_bytes() const;
  /// The most all processes may reserve together.
  std::size_t limit_bytes() const;
  /// "ledger /name (limit 16.0 GiB, quota none)".
  std::string description() const;
  /// The ledger the entry is in.
  Ledger& ledger() const;

 private:
  struct State;
  explicit LedgerAccount(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
