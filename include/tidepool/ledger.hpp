// The cross-process ledger: one POSIX shared-memory segment per device that
// records, for every process using the device, the bytes it has taken from
// it, its quota and its pressure. Every physical allocation is reserved in the
// ledger first, under a robust process-shared mutex, so the sum of
// reservations never exceeds the device's capacity (or the configured shared
// limit) whatever the interleaving, and two processes never both count on
// the same free memory. docs/ledger.md describes the layout and the protocol.
//
// Budget rule. A process's *commitment* is max(reserved, quota): a quota is
// both a cap and a guarantee. A reservation of n bytes by process P succeeds
// when P.reserved + n <= P.quota (if P has one) and
//   sum over other live processes of commitment + max(P.reserved + n, P.quota) <= limit.
// A process registers with a quota only while the commitments of the live
// processes leave room for it, so a registered quota can always be reserved.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"
#include "tidepool/ledger_account.hpp"

namespace tidepool {

/// The segment name of a device's ledger for this user (`mode` 0600) or this
/// group (0660): "/tidepool-u<euid>-" (or "/tidepool-g<egid>-") and the device
/// id with every character other than a letter, digit, '.', '_' or '-'
/// replaced by '_' ("host:gpu0" as uid 1000 -> "/tidepool-u1000-host_gpu0");
/// ids too long for a name are shortened and suffixed with a hash of the
/// whole id.
std::string ledger_segment_name(std::string_view device_id, unsigned mode = 0600);

/// One process's entry, as read from the segment.
struct LedgerEntryInfo {
  std::uint32_t slot = 0;             // index of the entry in the segment
  int pid = 0;
  std::uint64_t start_time = 0;       // clock ticks after boot (/proc/<pid>/stat field 22)
  std::string command;                // /proc/<pid>/comm at registration
  std::size_t reserved_bytes = 0;     // bytes it holds from the device
  std::size_t quota_bytes = 0;        // 0: no quota
  std::size_t cached_free_bytes = 0;  // reserved but not in use, as its pools last reported
  bool cached_free_known = false;     // whether its pools report it (trim hooks are set)
  std::size_t wanted_bytes = 0;       // the request it is waiting for, 0 when none
  std::uint64_t trim_requests = 0;    // trim requests it has posted
  std::uint64_t trims_answered = 0;   // trim requests of others it has answered
  std::size_t bytes_trimmed = 0;      // bytes it released answering them
  bool answers_trim = false;          // whether it releases cached memory when asked
  std::size_t asleep_bytes = 0;       // bytes of its pools' sleeping tags, as its pools last reported
  std::uint64_t wake_waits = 0;       // wakes (batch reservations) that waited for others to free or trim
  bool alive = false;                 // the pid runs and has the recorded start time

  /// Every field by report name: the one list `tidepool ledger --json` and
  /// Python's ledger() serialize. visit(name, value); cached_free_bytes is
  /// a std::optional, absent when the process's pools do not report it.
  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("slot", std::uint64_t{slot});
    visit("pid", std::int64_t{pid});
    visit("command", std::string_view(command));
    visit("alive", alive);
    visit("start_time", start_time);
    visit("reserved_bytes", std::uint64_t{reserved_bytes});
    visit("cached_free_bytes", cached_free_known ? std::optional<std::uint64_t>(cached_free_bytes) : std::nullopt);
    visit("quota_bytes", std::uint64_t{quota_bytes});
    visit("wanted_bytes", std::uint64_t{wanted_bytes});
    visit("trim_requests", trim_requests);
    visit("trims_answered", trims_answered);
    visit("bytes_trimmed", std::uint64_t{bytes_trimmed});
    visit("answers_trim", answers_trim);
    visit("asleep_bytes", std::uint64_t{asleep_bytes});
    visit("wake_waits", wake_waits);
  }
};

/// The entries of a snapshot added up.
struct LedgerTotals {
  std::uint64_t processes = 0;
  std::uint64_t alive = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t cached_free_bytes = 0;  // over the entries that report it
  std::uint64_t quota_bytes = 0;
  std::uint64_t wanted_bytes = 0;
  std::uint64_t trim_requests = 0;
  std::uint64_t trims_answered = 0;
  std::uint64_t bytes_trimmed = 0;
  std::uint64_t asleep_bytes = 0;
  std::uint64_t wake_waits = 0;

  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("processes", processes);
    visit("alive", alive);
    visit("reserved_bytes", reserved_bytes);
    visit("cached_free_bytes", cached_free_bytes);
    visit("quota_bytes", quota_bytes);
    visit("wanted_bytes", wanted_bytes);
    visit("trim_requests", trim_requests);
    visit("trims_answered", trims_answered);
    visit("bytes_trimmed", bytes_trimmed);
    visit("asleep_bytes", asleep_bytes);
    visit("wake_waits", wake_waits);
  }
};

/// The whole segment at one moment.
struct LedgerSnapshot {
  std::string segment_name;
  std::string device_id;
  std::size_t limit_bytes = 0;          // the sum of reservations never exceeds it
  std::size_t device_total_bytes = 0;   // the device's capacity when the segment was made
  std::size_t reserved_bytes = 0;       // sum over the entries
  std::size_t peak_reserved_bytes = 0;  // the largest sum since the segment was made
  std::uint64_t reclaimed_entries = 0;  // entries of dead processes cleared so far
  std::uint64_t lock_recoveries = 0;    // times the lock was recovered from a dead holder
  std::uint32_t entry_capacity = 0;     // most processes the segment can hold
  std::vector<LedgerEntryInfo> entries; // registered entries, by slot

  /// Bytes the live entries commit: sum of max(reserved, quota).
  std::size_t committed_bytes() const;
  LedgerTotals totals() const;

  /// The segment's own figures by report name (entries and totals aside):
  /// the one list `tidepool ledger --json` and Python's ledger() serialize.
  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("segment", std::string_view(segment_name));
    visit("device_id", std::string_view(device_id));
    visit("limit_bytes", std::uint64_t{limit_bytes});
    visit("device_total_bytes", std::uint64_t{device_total_bytes});
    visit("reserved_bytes", std::uint64_t{reserved_bytes});
    visit("committed_bytes", std::uint64_t{committed_bytes()});
    visit("peak_reserved_bytes", std::uint64_t{peak_reserved_bytes});
    visit("reclaimed_entries", reclaimed_entries);
    visit("lock_recoveries", lock_recoveries);
    visit("entry_capacity", std::uint64_t{entry_capacity});
  }
};

/// How a segment is opened or made.
struct LedgerSegmentOptions {
  /// The segment's name: "/name" with no other '/'.
  std::string name;
  /// The device the segment is for (Device::id()); recorded by the creator
  /// and checked by later processes.
  std::string device_id;
  /// The device's capacity. Must match what the creator recorded.
  std::size_t device_total_bytes = 0;
  /// The most all processes may reserve together; 0: device_total_bytes. Set
  /// by the creator; a later process asking for a different non-zero limit is
  /// refused (invalid_argument).
  std::size_t shared_limit_bytes = 0;
  /// Permissions of a new segment: 0600 (this user only) or 0660 (also the
  /// group); TIDEPOOL_LEDGER_MODE in the configuration.
  unsigned mode = 0600;
  /// How long to wait for the lock before reporting a wedged ledger.
  std::chrono::milliseconds lock_timeout{5000};
};

/// A handle on one ledger segment, mapped into this process. Thread-safe.
/// Entries are registered by a LedgerAccount, which owns its Ledger; a
/// Ledger on its own reads the segment and clears dead entries (the
/// `tidepool ledger` command), registering nothing.
class Ledger {
 public:
  /// Opens the segment `options.name`, making it when it does not exist
  /// (O_CREAT | O_EXCL, so exactly one process initializes it; the others
  /// wait a bounded time for its ready flag). Errors: corrupt_data for a
  /// segment that is not a tidepool ledger of this layout version or whose
  /// header checksum fails; invalid_argument when it was made for another
  /// device or limit; io_error when the OS refuses.
  static Expected<std::unique_ptr<Ledger>> open_or_create(const LedgerSegmentOptions& options);
  /// Opens an existing segment; io_error naming it when there is none, and
  /// the checks of open_or_create.
  static Expected<std::unique_ptr<Ledger>> open_existing(const std::string& name,
                                                         std::chrono::milliseconds lock_timeout =
                                                             std::chrono::milliseconds(5000));
  /// Removes the segment's name (shm_unlink); processes that have it mapped
  /// keep using it. io_error when it does not exist.
  static Status remove(const std::string& name);

  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  const std::string& name() const;

  /// Every registered entry, with whether its process is alive. Takes the lock.
  Expected<LedgerSnapshot> snapshot() const;
  /// Clears the entries of processes that died (a pid that no longer runs,
  /// or runs with another start time). Returns how many were cleared.
  Expected<std::size_t> reclaim_dead();

  /// For tests of lock recovery: runs `while_held` holding the ledger's lock.
  Status with_lock_held(const std::function<void()>& while_held);

  struct Segment;  // the mapping and its operations (src/share/)
  /// The mapping, for LedgerAccount.
  Segment& segment() const { return *segment_; }

 private:
  explicit Ledger(std::unique_ptr<Segment> segment);
  std::unique_ptr<Segment> segment_;
};

/// A device decorator over this process's LedgerAccount: every physical
/// allocation (allocate, create, create_many) is reserved in the account
/// before the device is asked, and given back when the memory goes back
/// (free, release) or the device refuses. Only these calls and mem_info
/// touch the ledger; a pool serving a request from its cache never does.
///
/// mem_info() is the account's share_of the device (the quota as total), so
/// a pool sized as a fraction of the total (XLA_CLIENT_MEM_FRACTION) takes
/// that fraction of the quota.
class LedgerDevice final : public DeviceAdaptor {
 public:
  /// Registers this process in the ledger of `upstream`
  /// (LedgerAccount::open with its id and total) and decorates it. Errors:
  /// those of LedgerAccount::open.
  static Expected<std::shared_ptr<LedgerDevice>> create(std::shared_ptr<Device> upstream,
                                                        LedgerOptions options = {});
  /// `upstream` reserving in `account` (not null), registered already and
  /// perhaps shared: the interposer's pool and the program's own calls
  /// reserve in one account.
  LedgerDevice(std::shared_ptr<Device> upstream, std::shared_ptr<LedgerAccount> account);

  /// The upstream's, and the ledger it is shared through.
  std::string description() const override;
  /// Reserves `bytes`, then allocates. out_of_memory (naming the processes
  /// that hold the device) when the reservation does not fit after the
  /// trim wait.
  Expected<void*> allocate(std::size_t bytes) override;
  /// Frees, then gives the reservation back.
  Status free(void* ptr, std::size_t bytes) override;
  /// The account's share of the upstream's figures.
  MemInfo mem_info() const override;
  /// As allocate, for physical memory.
  Expected<PhysicalHandle> create(std::size_t bytes) override;
  /// As create, `count` times, with one reservation of the whole
  /// (LedgerAccount::reserve_many: one bounded wait at most).
  Expected<std::vector<PhysicalHandle>> create_many(std::size_t bytes_each, std::size_t count) override;
  /// As free, for physical memory.
  Status release(PhysicalHandle handle, std::size_t bytes) override;

  /// The account this device reserves in: trim hooks, reports, figures.
  LedgerAccount& account() const { return *account_; }

 private:
  std::shared_ptr<LedgerAccount> account_;
};

}  // namespace tidepool
