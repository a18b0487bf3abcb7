// The ledger segment's layout and the operations on it under its lock.
//
// Layout (version 3), all fields native-endian:
//   offset 0   SegmentHeader: init_state, creator pid, then the checksummed
//              SegmentIdentity (magic, layout version, sizes, limit, device
//              id), then the mutable part (the robust mutex, counters)
//   then       kEntryCount Entry slots of 64-byte multiples
// The magic and the layout version sit at fixed offsets (8 and 16) in every
// version, so any build can tell a segment of another version from garbage.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tidepool/error.hpp"
#include "tidepool/ledger.hpp"

namespace tidepool::share {

inline constexpr std::uint64_t kLedgerMagic = 0x3152'4744'454c'5054;  // "TPLEDGR1" read little-endian
inline constexpr std::uint32_t kLayoutVersion = 3;  // 2: slots_end; 3: asleep_bytes, wake_waits
inline constexpr std::uint32_t kEntryCount = 128;
inline constexpr std::uint32_t kInitReady = 0x59444552;    // "REDY": the creator finished
inline constexpr std::uint32_t kEntryFree = 0;
inline constexpr std::uint32_t kEntryActive = 0x56544341;  // "ACTV"
inline constexpr std::size_t kDeviceIdBytes = 128;
inline constexpr std::size_t kCommandBytes = 16;
/// Entry::cached_free_bytes of a process whose pools do not report it.
inline constexpr std::uint64_t kCachedFreeUnknown = ~std::uint64_t{0};

/// What the creator writes once; guarded by a checksum.
struct SegmentIdentity {
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t header_bytes;
  std::uint32_t entry_bytes;
  std::uint32_t entry_count;
  std::uint32_t mutex_bytes;
  std::uint32_t mode;
  std::uint64_t limit_bytes;
  std::uint64_t device_total_bytes;
  std::uint64_t created_unix_seconds;
  char device_id[kDeviceIdBytes];
};

struct alignas(64) SegmentHeader {
  std::atomic<std::uint32_t> init_state;  // kInitReady once the rest is valid
  std::int32_t creator_pid;
  SegmentIdentity identity;               // starts at offset 8: magic, then version at 16
  std::uint64_t identity_checksum;        // FNV-1a 64 of identity
  // --- mutable, under the mutex (read lock-free by the command) ---
  alignas(64) pthread_mutex_t mutex;      // PTHREAD_PROCESS_SHARED | PTHREAD_MUTEX_ROBUST
  std::atomic<std::int32_t> lock_holder_pid;
  std::atomic<std::uint64_t> trim_generation;  // bumped by every trim request
  std::atomic<std::uint64_t> peak_reserved_bytes;
  std::atomic<std::uint64_t> reclaimed_entries;
  std::atomic<std::uint64_t> lock_recoveries;
  // One past the highest slot ever made active; never lowered. Slots are
  // taken lowest first, so the hot path's scans stop here instead of
  // reading all kEntryCount entries (a cache miss each after a device call).
  std::atomic<std::uint32_t> slots_end;
};

/// One process's entry. A slot becomes active by the store of kEntryActive
/// after its other fields are written, and free by the store of kEntryFree,
/// so a holder dying mid-update never leaves a half-made entry.
struct alignas(64) Entry {
  std::atomic<std::uint32_t> state;
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint64_t> start_time;
  std::atomic<std::uint64_t> reserved_bytes;
  std::atomic<std::uint64_t> quota_bytes;
  std::atomic<std::uint64_t> cached_free_bytes;  // by its owner without the lock; kCachedFreeUnknown: not reported
  std::atomic<std::uint64_t> wanted_bytes;
  std::atomic<std::uint64_t> trim_requests;
  std::atomic<std::uint64_t> trims_answered;
  std::atomic<std::uint64_t> bytes_trimmed;
  std::atomic<std::uint32_t> answers_trim;
  char command[kCommandBytes];
  std::atomic<std::uint64_t> asleep_bytes;  // by its owner: its pools' sleeping tags (reserved no longer)
  std::atomic<std::uint64_t> wake_waits;    // batch reservations (wakes) that waited for others
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the ledger needs lock-free 64-bit atomics in shared memory");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

inline constexpr std::size_t kSegmentBytes = sizeof(SegmentHeader) + kEntryCount * sizeof(Entry);

/// FNV-1a 64 of the identity's bytes.
std::uint64_t identity_checksum(const SegmentIdentity& identity);

}  // namespace tidepool::share

namespace tidepool {

/// The mapped segment. Every method that reads or writes entries takes the
/// lock itself unless its name says it runs locked.
struct Ledger::Segment {
  std::string name;
  share::SegmentHeader* header = nullptr;
  share::Entry* entries = nullptr;  // kEntryCount slots
  std::size_t mapped_bytes = 0;
  std::chrono::milliseconds lock_timeout{5000};
  // Kept open so that check_intact() can fstat it: a segment shrunk under
  // us (ftruncate by a careless process of the same user) would fault with
  // SIGBUS on the next touch of a page past its new end.
  int fd = -1;
  std::size_t identity_limit = 0;  // header->identity.limit_bytes

  ~Segment();

  /// Whether the segment still has its full size (one fstat); corrupt_data
  /// naming the size when it shrank. Every path that touches the
  /// mapping calls it first (lock_unchecked, the lock-free release, the
  /// background thread), so a truncated segment is an error for the call at
  /// hand, never a SIGBUS (a truncation racing the few instructions between
  /// the check and the access is the one window left; docs/ledger.md).
  Status check_intact() const;

  /// Holds the lock: acquired with a timeout; a dead holder's lock is made
  /// consistent and its entry reclaimed.
  class Lock {
   public:
    explicit Lock(Segment* segment) : segment_(segment) {}
    Lock(Lock&& other) noexcept : segment_(other.segment_) { other.segment_ = nullptr; }
    Lock& operator=(Lock&&) = delete;
    ~Lock();

   private:
    Segment* segment_;
  };
  /// The lock, with the header's checksum and the entries checked
  /// (validate_entries_locked).
  Expected<Lock> lock();
  /// The lock, entries not checked: for a caller whose own pass over the
  /// entries checks them (reserve_locked), so the hot path reads them once.
  Expected<Lock> lock_unchecked();

  /// What a reservation lacks: 0 bytes when it fits.
  struct Shortfall {
    std::size_t bytes = 0;
    bool by_quota = false;  // the process's own quota refuses it: no trim can help
  };
  /// The budget check of ledger.hpp for `bytes` more in `slot` and, when they
  /// fit, the reservation (raising the peak); locked. One pass over the
  /// entries, which also checks their invariants (corrupt_data).
  Expected<Shortfall> reserve_locked(std::uint32_t slot, std::size_t bytes);
  /// Bytes the active entries commit, sum of max(reserved, quota), leaving out
  /// `except_slot` (kEntryCount: none), locked.
  std::size_t committed_locked(std::uint32_t except_slot) const;
  /// Clears the entries of dead processes, locked. Returns how many.
  std::size_t reclaim_dead_locked();
  /// Checks the entries' invariants, locked: corrupt_data naming the entry.
  Status validate_entries_locked() const;

  /// What one checked pass over the entries sums.
  struct Sums {
    std::size_t reserved = 0;          // over the active entries
    std::size_t committed_others = 0;  // max(reserved, quota) over the active entries but one
  };
  /// Checks the entries' invariants and sums them, leaving `except_slot`
  /// (kEntryCount: none) out of committed_others; locked.
  Expected<Sums> scan_locked(std::uint32_t except_slot) const;

  /// The snapshot, locked (liveness read from /proc).
  LedgerSnapshot snapshot_locked() const;
  /// "pid 12 (python) reserves 40.0 MiB (30.0 MiB cached-free, quota none); ..."
  std::string holders_locked(std::uint32_t except_slot) const;

  /// The identity's limit, read once at open (it never changes), so reading
  /// it touches no page of the mapping.
  std::size_t limit_bytes() const { return identity_limit; }
  /// One past the highest slot ever active, at most kEntryCount: scans of
  /// the entries stop here.
  std::uint32_t slots_end() const {
    return std::min(header->slots_end.load(std::memory_order_acquire), share::kEntryCount);
  }
  /// Records that `slot` is about to become active, locked.
  void note_slot_used_locked(std::uint32_t slot) {
    if (slot + 1 > header->slots_end.load(std::memory_order_relaxed))
      header->slots_end.store(slot + 1, std::memory_order_release);
  }

 private:
  /// The lock, waited for up to lock_timeout in short slices; the
  /// pthread_mutex_clocklock result.
  int timed_lock();
  /// The Lock, or the error, for a lock call's result (EOWNERDEAD recovered).
  Expected<Lock> locked(int rc);
};

namespace share {
/// Opens options.name, making and initializing it first when
/// create_if_missing and it does not exist; see Ledger::open_or_create.
Expected<std::unique_ptr<Ledger::Segment>> open_segment(const LedgerSegmentOptions& options,
                                                        bool create_if_missing);
}  // namespace share

}  // namespace tidepool
