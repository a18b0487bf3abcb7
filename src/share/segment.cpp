// The ledger segment: making it exactly once, refusing one that cannot be
// trusted, the robust lock, and the budget arithmetic.
#include "share/segment.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <new>
#include <thread>
#include <vector>

#include "share/process_identity.hpp"
#include "tidepool/units.hpp"

namespace tidepool::share {

std::uint64_t identity_checksum(const SegmentIdentity& identity) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&identity);
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < sizeof identity; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

namespace {

std::string os_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// The remedy for a segment that must not be used, in every such message.
std::string remedy(const std::string& name) {
  return "; if no process uses it, remove it (rm /dev/shm" + name + ") and start again";
}

Error refuse(const std::string& name, const std::string& why) {
  return Error(Errc::corrupt_data, "ledger segment " + name + ": " + why + remedy(name));
}

Status check_name(const std::string& name) {
  if (name.size() < 2 || name.front() != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    return Error(Errc::invalid_argument,
                 "ledger segment name '" + name +
                     "' is invalid: it must be '/' and 1 to 254 characters with no other '/'");
  }
  return {};
}

// "uid 1000 (alice)": a uid and, when it has one, its name.
std::string user_text(uid_t uid) {
  std::string text = "uid " + std::to_string(uid);
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(4096);
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr)
    text += std::string(" (") + found->pw_name + ")";
  return text;
}

bool in_my_groups(gid_t gid) {
  if (gid == getegid()) return true;
  const int count = getgroups(0, nullptr);
  if (count <= 0) return false;
  std::vector<gid_t> groups(static_cast<std::size_t>(count));
  const int filled = getgroups(count, groups.data());
  return filled > 0 && std::find(groups.begin(), groups.begin() + filled, gid) != groups.begin() + filled;
}

std::string mode_text(unsigned mode) {
  char text[16];
  std::snprintf(text, sizeof text, "%04o", mode);
  return text;
}

// Whether an existing segment may be joined: whoever can write a ledger can
// take or free anyone's budget, wedge its lock or truncate it, so only a
// segment this user owns, of mode 0600, or one of this user's groups, of
// mode 0660 asked for with TIDEPOOL_LEDGER_MODE=group, is trusted. Root is
// held to the same rule. `wanted_mode` 0 (a reader such as `tidepool
// ledger`): either mode.
Status check_owner(const struct stat& status, const std::string& name, unsigned wanted_mode) {
  const unsigned mode = static_cast<unsigned>(status.st_mode) & 07777;
  const std::string owner = user_text(status.st_uid);
  const std::string squatted = "; a segment another user made under this name cannot be trusted (it could "
                               "pin the budget, wedge the lock or truncate the segment): remove it as its "
                               "owner or root (rm /dev/shm" + name + "), or choose another name with "
                               "TIDEPOOL_LEDGER_NAME";
  if (mode != 0600 && mode != 0660) {
    return Error(Errc::corrupt_data, "ledger segment " + name + " has mode " + mode_text(mode) + " (owner " +
                                         owner + "); a ledger is 0600 (this user) or 0660 (its group), "
                                         "never writable by others" + squatted);
  }
  const bool group_ok = mode == 0660 && wanted_mode != 0600 && in_my_groups(status.st_gid);
  if (status.st_uid != geteuid() && !group_ok) {
    std::string why = "ledger segment " + name + " belongs to " + owner + ", not to this process's " +
                      user_text(geteuid());
    if (mode == 0660 && wanted_mode == 0600)
      why += " (it is a group ledger, 0660; set TIDEPOOL_LEDGER_MODE=group to share it)";
    return Error(Errc::corrupt_data, why + squatted);
  }
  if (mode == 0660 && wanted_mode == 0600) {
    return Error(Errc::corrupt_data, "ledger segment " + name + " has mode 0660 (group) but this process asked "
                                         "for a user ledger (0600): set TIDEPOOL_LEDGER_MODE=group in every "
                                         "process that shares it" + remedy(name));
  }
  return {};
}

// The creator's side: the file is new and empty, and only this process has it.
Status initialize(int fd, const LedgerSegmentOptions& options, void** mapping) {
  if (ftruncate(fd, static_cast<off_t>(kSegmentBytes)) != 0) {
    return Error(Errc::io_error, os_error("ledger segment " + options.name + ": ftruncate"));
  }
  void* memory = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) {
    return Error(Errc::io_error, os_error("ledger segment " + options.name + ": mmap"));
  }
  // The file reads as zeros, so init_state is already "not ready".
  auto* header = new (memory) SegmentHeader{};
  header->creator_pid = static_cast<std::int32_t>(getpid());
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&header->mutex, &attributes);
  pthread_mutexattr_destroy(&attributes);
  if (rc != 0) {
    munmap(memory, kSegmentBytes);
    return Error(Errc::io_error, "ledger segment " + options.name +
                                     ": pthread_mutex_init: " + std::strerror(rc));
  }
  auto* entries = reinterpret_cast<Entry*>(static_cast<char*>(memory) + sizeof(SegmentHeader));
  for (std::uint32_t i = 0; i < kEntryCount; ++i) new (&entries[i]) Entry{};

  SegmentIdentity& identity = header->identity;
  std::memset(&identity, 0, sizeof identity);
  identity.magic = kLedgerMagic;
  identity.layout_version = kLayoutVersion;
  identity.header_bytes = sizeof(SegmentHeader);
  identity.entry_bytes = sizeof(Entry);
  identity.entry_count = kEntryCount;
  identity.mutex_bytes = sizeof(pthread_mutex_t);
  identity.mode = options.mode;
  identity.device_total_bytes = options.device_total_bytes;
  identity.limit_bytes =
      options.shared_limit_bytes != 0 ? options.shared_limit_bytes : options.device_total_bytes;
  identity.created_unix_seconds = static_cast<std::uint64_t>(std::time(nullptr));
  const std::size_t id_bytes = std::min(options.device_id.size(), kDeviceIdBytes - 1);
  std::memcpy(identity.device_id, options.device_id.data(), id_bytes);
  header->identity_checksum = identity_checksum(identity);
  header->init_state.store(kInitReady, std::memory_order_release);
  *mapping = memory;
  return {};
}

// A later process's side: wait (bounded) for the creator to finish, then
// believe nothing the checks below have not confirmed.
Expected<void*> attach(int fd, const std::string& name, std::size_t* mapped_bytes) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  struct stat status {};
  for (;;) {
    if (fstat(fd, &status) != 0) return Error(Errc::io_error, os_error("ledger segment " + name + ": fstat"));
    if (static_cast<std::size_t>(status.st_size) >= offsetof(SegmentHeader, identity_checksum)) break;
    if (Clock::now() > deadline) {
      return refuse(name, "it is " + std::to_string(status.st_size) +
                              " bytes, too small for a ledger header, and did not grow in 2 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Mapped at its size now, to read a header of any version; what is kept
  // is checked below to hold a whole segment of this one.
  const std::size_t size = static_cast<std::size_t>(status.st_size);
  void* memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) return Error(Errc::io_error, os_error("ledger segment " + name + ": mmap"));
  auto fail = [&](Error error) -> Expected<void*> {
    munmap(memory, size);
    return error;
  };
  auto* header = static_cast<SegmentHeader*>(memory);
  while (header->init_state.load(std::memory_order_acquire) != kInitReady) {
    // A pid of 0 is a creator that has sized the file but not yet written
    // its pid (between its ftruncate and its header): it is waited for as
    // one that is alive, up to the deadline.
    const int creator = header->creator_pid;
    const bool creator_gone = creator < 0 || (creator > 0 && kill(creator, 0) != 0 && errno == ESRCH);
    if (creator_gone || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const SegmentIdentity& identity = header->identity;
  char magic_text[32];
  std::snprintf(magic_text, sizeof magic_text, "0x%016llx",
                static_cast<unsigned long long>(identity.magic));
  if (identity.magic != kLedgerMagic) {
    return fail(refuse(name, std::string("it is not a tidepool ledger (magic ") + magic_text +
                                 " at offset 8, expected 0x" + [] {
                                   char text[20];
                                   std::snprintf(text, sizeof text, "%016llx",
                                                 static_cast<unsigned long long>(kLedgerMagic));
                                   return std::string(text);
                                 }() + ")"));
  }
  if (identity.layout_version != kLayoutVersion) {
    return fail(refuse(name, "its layout version is " + std::to_string(identity.layout_version) +
                                 " and this build reads version " + std::to_string(kLayoutVersion) +
                                 " only: processes of different tidepool versions cannot share a ledger"));
  }
  if (header->init_state.load(std::memory_order_acquire) != kInitReady) {
    return fail(refuse(name, "it was never initialized: its creator (pid " +
                                 std::to_string(header->creator_pid) + ") stopped before finishing"));
  }
  if (size < kSegmentBytes) {
    return fail(refuse(name, "it is " + std::to_string(size) + " bytes; layout version " +
                                 std::to_string(kLayoutVersion) + " needs " + std::to_string(kSegmentBytes)));
  }
  const std::uint64_t checksum = identity_checksum(identity);
  if (checksum != header->identity_checksum) {
    char text[80];
    std::snprintf(text, sizeof text, "0x%016llx, computed 0x%016llx",
                  static_cast<unsigned long long>(header->identity_checksum),
                  static_cast<unsigned long long>(checksum));
    return fail(refuse(name, std::string("its header checksum does not match (stored ") + text +
                                 "): the header was overwritten"));
  }
  if (identity.header_bytes != sizeof(SegmentHeader) || identity.entry_bytes != sizeof(Entry) ||
      identity.entry_count != kEntryCount || identity.mutex_bytes != sizeof(pthread_mutex_t)) {
    return fail(refuse(name, "its sizes (header " + std::to_string(identity.header_bytes) + ", entry " +
                                 std::to_string(identity.entry_bytes) + " x " +
                                 std::to_string(identity.entry_count) + ", mutex " +
                                 std::to_string(identity.mutex_bytes) +
                                 ") are not this build's: it was made by an incompatible build"));
  }
  if (identity.limit_bytes == 0 || identity.limit_bytes > identity.device_total_bytes ||
      identity.device_id[kDeviceIdBytes - 1] != '\0') {
    return fail(refuse(name, "its limit (" + std::to_string(identity.limit_bytes) +
                                 " bytes) or device id is out of range"));
  }
  *mapped_bytes = size;
  return memory;
}

}  // namespace

Expected<std::unique_ptr<Ledger::Segment>> open_segment(const LedgerSegmentOptions& options,
                                                        bool create_if_missing) {
  if (Status valid = check_name(options.name); !valid) return std::move(valid).error();
  const std::string& name = options.name;
  if (create_if_missing) {
    if (options.mode != 0600 && options.mode != 0660) {
      return Error(Errc::invalid_argument, "ledger segment mode " + mode_text(options.mode) +
                                               " is invalid; allowed: 0600 (this user) or 0660 (and the group)");
    }
    if (options.device_total_bytes == 0) {
      return Error(Errc::invalid_argument, "ledger segment " + name + ": the device's total is 0 bytes");
    }
    if (options.shared_limit_bytes > options.device_total_bytes) {
      return Error(Errc::invalid_argument,
                   "ledger segment " + name + ": shared limit " + format_bytes(options.shared_limit_bytes) +
                       " is above the device's total " + format_bytes(options.device_total_bytes));
    }
  }
  auto segment = std::make_unique<Ledger::Segment>();
  segment->name = name;
  segment->lock_timeout = options.lock_timeout;
  void* memory = nullptr;
  std::size_t mapped = kSegmentBytes;
  // Two rounds: a segment removed between our O_EXCL failing and our open is
  // made again by us.
  for (int round = 0; round < 2 && memory == nullptr; ++round) {
    if (create_if_missing) {
      const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, static_cast<mode_t>(options.mode));
      if (fd >= 0) {
        // shm_open applies the umask; the mode asked for is the mode meant.
        Status made = fchmod(fd, static_cast<mode_t>(options.mode)) == 0
                          ? initialize(fd, options, &memory)
                          : Status(Error(Errc::io_error, os_error("ledger segment " + name + ": fchmod")));
        if (!made) {
          close(fd);
          shm_unlink(name.c_str());
          return std::move(made).error();
        }
        segment->fd = fd;
        break;
      }
      if (errno != EEXIST) return Error(Errc::io_error, os_error("ledger segment " + name + ": shm_open"));
    }
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      if (errno == ENOENT && create_if_missing) continue;
      if (errno == ENOENT) {
        return Error(Errc::io_error, "ledger segment " + name +
                                         " does not exist: no process has used this device's ledger");
      }
      if (errno == EACCES) {
        struct stat status {};
        const std::string owner = stat(("/dev/shm" + name).c_str(), &status) == 0
                                      ? user_text(status.st_uid) + ", mode " +
                                            mode_text(static_cast<unsigned>(status.st_mode) & 07777)
                                      : std::string("another user");
        return Error(Errc::io_error, "ledger segment " + name + ": permission denied: it belongs to " + owner +
                                         " (a group shares one when every process sets "
                                         "TIDEPOOL_LEDGER_MODE=group); remove it as its owner or root "
                                         "(rm /dev/shm" + name + ") or choose another name with "
                                         "TIDEPOOL_LEDGER_NAME");
      }
      return Error(Errc::io_error, os_error("ledger segment " + name + ": shm_open"));
    }
    struct stat status {};
    Status trusted = fstat(fd, &status) == 0
                         ? check_owner(status, name, create_if_missing ? options.mode : 0)
                         : Status(Error(Errc::io_error, os_error("ledger segment " + name + ": fstat")));
    if (!trusted) {
      close(fd);
      return std::move(trusted).error();
    }
    Expected<void*> attached = attach(fd, name, &mapped);
    if (!attached) {
      close(fd);
      return std::move(attached).error();
    }
    memory = *attached;
    segment->fd = fd;
  }
  if (memory == nullptr) {
    return Error(Errc::io_error, "ledger segment " + name + " kept disappearing while being opened");
  }
  segment->header = static_cast<share::SegmentHeader*>(memory);
  segment->entries =
      reinterpret_cast<share::Entry*>(static_cast<char*>(memory) + sizeof(share::SegmentHeader));
  segment->mapped_bytes = mapped;
  segment->identity_limit = segment->header->identity.limit_bytes;
  if (create_if_missing) {
    const SegmentIdentity& identity = segment->header->identity;
    const std::string recorded_id(identity.device_id);
    if (recorded_id != options.device_id) {
      return Error(Errc::invalid_argument, "ledger segment " + name + " belongs to device '" + recorded_id +
                                               "', not '" + options.device_id + "'");
    }
    if (identity.device_total_bytes != options.device_total_bytes) {
      return Error(Errc::invalid_argument,
                   "ledger segment " + name + " was made for a device of " +
                       format_bytes(identity.device_total_bytes) + " but this device '" + options.device_id +
                       "' has " + format_bytes(options.device_total_bytes));
    }
    if (options.shared_limit_bytes != 0 && options.shared_limit_bytes != identity.limit_bytes) {
      return Error(Errc::invalid_argument,
                   "ledger segment " + name + " has a shared limit of " + format_bytes(identity.limit_bytes) +
                       " (set by the process that made it), not the " +
                       format_bytes(options.shared_limit_bytes) + " asked for");
    }
  }
  return segment;
}

}  // namespace tidepool::share

namespace tidepool {

using share::Entry;
using share::kEntryActive;
using share::kEntryCount;
using share::kEntryFree;

Ledger::Segment::~Segment() {
  if (header != nullptr) munmap(header, mapped_bytes);
  if (fd >= 0) close(fd);
}

Status Ledger::Segment::check_intact() const {
  struct stat status {};
  if (fstat(fd, &status) != 0) return Error(Errc::io_error, share::os_error("ledger segment " + name + ": fstat"));
  if (static_cast<std::size_t>(status.st_size) < share::kSegmentBytes) {
    return share::refuse(name, "it shrank to " + std::to_string(status.st_size) + " bytes under this process (" +
                                   std::to_string(share::kSegmentBytes) +
                                   " needed): something truncated it; the ledger cannot be used");
  }
  return {};
}

Ledger::Segment::Lock::~Lock() {
  if (segment_ == nullptr) return;
  segment_->header->lock_holder_pid.store(0, std::memory_order_relaxed);
  pthread_mutex_unlock(&segment_->header->mutex);
}

Expected<Ledger::Segment::Lock> Ledger::Segment::lock() {
  auto held = lock_unchecked();
  if (!held) return held;
  if (share::identity_checksum(header->identity) != header->identity_checksum)
    return share::refuse(name, "its header was overwritten under this process (checksum mismatch)");
  if (Status valid = validate_entries_locked(); !valid) return std::move(valid).error();
  return held;
}

Expected<Ledger::Segment::Lock> Ledger::Segment::lock_unchecked() {
  // The mutex lives in the segment: check it is still there before touching it.
  if (Status intact = check_intact(); !intact) return std::move(intact).error();
  // Uncontended, no clock read: the common case on every device call.
  int rc = pthread_mutex_trylock(&header->mutex);
  if (rc == EBUSY) rc = timed_lock();
  return locked(rc);
}

int Ledger::Segment::timed_lock() {
  // The wait is cut into short slices, each a fresh pthread_mutex_clocklock.
  // An unlock wakes one sleeper and clears FUTEX_WAITERS; the woken one sets
  // it again when it takes the lock. When that one is killed (kill -9)
  // between its wake-up and taking the lock, and another process takes the
  // free lock meanwhile with a trylock (which sets no FUTEX_WAITERS), the
  // wake-up is lost: the kernel's robust-list cleanup of the dead waiter
  // wakes a successor only when the lock is free at the death, and the new
  // holder's unlock wakes no one. The other sleepers would sleep through
  // their whole lock_timeout and fail with the lock free. A slice's end
  // makes a sleeper look again, so a lost wake-up costs one slice.
  constexpr auto kSlice = std::chrono::milliseconds(10);
  const auto deadline = std::chrono::steady_clock::now() + lock_timeout;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const auto wait = std::min<std::chrono::nanoseconds>(kSlice, std::max<std::chrono::nanoseconds>(deadline - now, {}));
    timespec slice_end{};
    clock_gettime(CLOCK_MONOTONIC, &slice_end);
    const auto end_ns = static_cast<long long>(slice_end.tv_nsec) + wait.count();
    slice_end.tv_sec += static_cast<time_t>(end_ns / 1'000'000'000);
    slice_end.tv_nsec = static_cast<long>(end_ns % 1'000'000'000);
    const int rc = pthread_mutex_clocklock(&header->mutex, CLOCK_MONOTONIC, &slice_end);
    if (rc != ETIMEDOUT || std::chrono::steady_clock::now() >= deadline) return rc;
  }
}

Expected<Ledger::Segment::Lock> Ledger::Segment::locked(int rc) {
  if (rc == ETIMEDOUT) {
    const int holder = header->lock_holder_pid.load(std::memory_order_relaxed);
    return Error(Errc::device_error,
                 "ledger segment " + name + ": lock not acquired within " +
                     std::to_string(lock_timeout.count()) + " ms; held by pid " + std::to_string(holder));
  }
  if (rc == ENOTRECOVERABLE) {
    return Error(Errc::corrupt_data, "ledger segment " + name +
                                         ": its lock is unrecoverable (a process recovered it without "
                                         "marking it consistent)" +
                                         share::remedy(name));
  }
  if (rc != 0 && rc != EOWNERDEAD) {
    return Error(Errc::device_error, "ledger segment " + name + ": pthread_mutex_clocklock: " + std::strerror(rc));
  }
  Lock held(this);
  header->lock_holder_pid.store(static_cast<std::int32_t>(share::current_pid()), std::memory_order_relaxed);
  if (rc == EOWNERDEAD) {
    // The holder died inside a critical section. Every update is one store
    // (see Entry), so the entries are whole; the dead holder's entry goes.
    pthread_mutex_consistent(&header->mutex);
    header->lock_recoveries.fetch_add(1, std::memory_order_relaxed);
    reclaim_dead_locked();
  }
  return held;
}

Status Ledger::Segment::validate_entries_locked() const {
  const std::uint32_t recorded_end = header->slots_end.load(std::memory_order_relaxed);
  if (recorded_end > kEntryCount)
    return share::refuse(name, "its slots_end is " + std::to_string(recorded_end) + ", above its " +
                                   std::to_string(kEntryCount) + " entries");
  // The hot path reads only the entries below slots_end: none past it may be active.
  for (std::uint32_t i = recorded_end; i < kEntryCount; ++i) {
    if (entries[i].state.load(std::memory_order_relaxed) != kEntryFree)
      return share::refuse(name, "entry " + std::to_string(i) + " is in use past slots_end " +
                                     std::to_string(recorded_end));
  }
  auto sums = scan_locked(kEntryCount);
  if (!sums) return std::move(sums).error();
  return {};
}

Expected<Ledger::Segment::Sums> Ledger::Segment::scan_locked(std::uint32_t except_slot) const {
  const std::size_t limit = limit_bytes();
  Sums sums;
  const std::uint32_t end = slots_end();
  for (std::uint32_t i = 0; i < end; ++i) {
    const Entry& entry = entries[i];
    const std::uint32_t state = entry.state.load(std::memory_order_relaxed);
    if (state == kEntryFree) continue;
    auto corrupt = [&](const std::string& why) {
      return share::refuse(name, "entry " + std::to_string(i) + " " + why);
    };
    if (state != kEntryActive) {
      char text[16];
      std::snprintf(text, sizeof text, "0x%08x", state);
      return corrupt(std::string("has state ") + text + ", which is neither free nor active");
    }
    if (entry.pid.load(std::memory_order_relaxed) <= 0) {
      return corrupt("has pid " + std::to_string(entry.pid.load(std::memory_order_relaxed)));
    }
    const std::uint64_t reserved = entry.reserved_bytes.load(std::memory_order_relaxed);
    const std::uint64_t quota = entry.quota_bytes.load(std::memory_order_relaxed);
    if (reserved > limit || quota > limit) {
      return corrupt("reserves " + std::to_string(reserved) + " bytes with quota " + std::to_string(quota) +
                     ", above the limit of " + std::to_string(limit));
    }
    sums.reserved += reserved;
    if (i != except_slot) sums.committed_others += std::max(reserved, quota);
  }
  if (sums.reserved > limit) {
    return share::refuse(name, "its entries reserve " + std::to_string(sums.reserved) +
                                   " bytes, above its limit of " + std::to_string(limit));
  }
  return sums;
}

std::size_t Ledger::Segment::committed_locked(std::uint32_t except_slot) const {
  std::size_t committed = 0;
  const std::uint32_t end = slots_end();
  for (std::uint32_t i = 0; i < end; ++i) {
    if (i == except_slot || entries[i].state.load(std::memory_order_relaxed) != kEntryActive) continue;
    committed += std::max(entries[i].reserved_bytes.load(std::memory_order_relaxed),
                          entries[i].quota_bytes.load(std::memory_order_relaxed));
  }
  return committed;
}

Expected<Ledger::Segment::Shortfall> Ledger::Segment::reserve_locked(std::uint32_t slot, std::size_t bytes) {
  const std::size_t limit = limit_bytes();
  Entry& me = entries[slot];
  const std::size_t reserved = me.reserved_bytes.load(std::memory_order_relaxed);
  const std::size_t quota = me.quota_bytes.load(std::memory_order_relaxed);
  if (bytes > limit) return Shortfall{bytes - limit, false};
  if (quota != 0 && reserved + bytes > quota) return Shortfall{reserved + bytes - quota, true};
  auto sums = scan_locked(slot);
  if (!sums) return std::move(sums).error();
  const std::size_t needed = sums->committed_others + std::max(reserved + bytes, quota);
  if (needed > limit) return Shortfall{needed - limit, false};
  me.reserved_bytes.store(reserved + bytes, std::memory_order_relaxed);
  // Our own entry's releases are lock-free and only lower the sum, so this
  // is at least the true sum: the peak never misses a high.
  const std::size_t sum = sums->reserved + bytes;
  if (sum > header->peak_reserved_bytes.load(std::memory_order_relaxed))
    header->peak_reserved_bytes.store(sum, std::memory_order_relaxed);
  return Shortfall{};
}

std::size_t Ledger::Segment::reclaim_dead_locked() {
  std::size_t reclaimed = 0;
  for (std::uint32_t i = 0; i < kEntryCount; ++i) {
    Entry& entry = entries[i];
    if (entry.state.load(std::memory_order_relaxed) != kEntryActive) continue;
    if (share::process_alive(entry.pid.load(std::memory_order_relaxed),
                             entry.start_time.load(std::memory_order_relaxed)))
      continue;
    entry.state.store(kEntryFree, std::memory_order_release);
    ++reclaimed;
  }
  header->reclaimed_entries.fetch_add(reclaimed, std::memory_order_relaxed);
  return reclaimed;
}

LedgerSnapshot Ledger::Segment::snapshot_locked() const {
  LedgerSnapshot snapshot;
  const share::SegmentIdentity& identity = header->identity;
  snapshot.segment_name = name;
  snapshot.device_id = identity.device_id;
  snapshot.limit_bytes = identity.limit_bytes;
  snapshot.device_total_bytes = identity.device_total_bytes;
  snapshot.peak_reserved_bytes = header->peak_reserved_bytes.load(std::memory_order_relaxed);
  snapshot.reclaimed_entries = header->reclaimed_entries.load(std::memory_order_relaxed);
  snapshot.lock_recoveries = header->lock_recoveries.load(std::memory_order_relaxed);
  snapshot.entry_capacity = kEntryCount;
  for (std::uint32_t i = 0; i < kEntryCount; ++i) {
    const Entry& entry = entries[i];
    if (entry.state.load(std::memory_order_relaxed) != kEntryActive) continue;
    LedgerEntryInfo info;
    info.slot = i;
    info.pid = entry.pid.load(std::memory_order_relaxed);
    info.start_time = entry.start_time.load(std::memory_order_relaxed);
    info.command.assign(entry.command, strnlen(entry.command, share::kCommandBytes));
    info.reserved_bytes = entry.reserved_bytes.load(std::memory_order_relaxed);
    info.quota_bytes = entry.quota_bytes.load(std::memory_order_relaxed);
    const std::uint64_t cached_free = entry.cached_free_bytes.load(std::memory_order_relaxed);
    info.cached_free_known = cached_free != share::kCachedFreeUnknown;
    info.cached_free_bytes = info.cached_free_known ? cached_free : 0;
    info.wanted_bytes = entry.wanted_bytes.load(std::memory_order_relaxed);
    info.trim_requests = entry.trim_requests.load(std::memory_order_relaxed);
    info.trims_answered = entry.trims_answered.load(std::memory_order_relaxed);
    info.bytes_trimmed = entry.bytes_trimmed.load(std::memory_order_relaxed);
    info.asleep_bytes = entry.asleep_bytes.load(std::memory_order_relaxed);
    info.wake_waits = entry.wake_waits.load(std::memory_order_relaxed);
    info.answers_trim = entry.answers_trim.load(std::memory_order_relaxed) != 0;
    info.alive = share::process_alive(info.pid, info.start_time);
    snapshot.reserved_bytes += info.reserved_bytes;
    snapshot.entries.push_back(std::move(info));
  }
  return snapshot;
}

std::string Ledger::Segment::holders_locked(std::uint32_t except_slot) const {
  LedgerSnapshot snapshot = snapshot_locked();
  std::sort(snapshot.entries.begin(), snapshot.entries.end(),
            [](const LedgerEntryInfo& a, const LedgerEntryInfo& b) { return a.reserved_bytes > b.reserved_bytes; });
  std::string out;
  for (const LedgerEntryInfo& entry : snapshot.entries) {
    if (entry.slot == except_slot) continue;
    if (!out.empty()) out += "; ";
    out += "pid " + std::to_string(entry.pid) + " (" + entry.command + ") reserves " +
           format_bytes(entry.reserved_bytes) + " (" +
           (entry.cached_free_known ? format_bytes(entry.cached_free_bytes) : std::string("unknown")) +
           " cached-free, quota " + (entry.quota_bytes ? format_bytes(entry.quota_bytes) : std::string("none")) +
           (entry.alive ? "" : ", dead") + ")";
  }
  return out.empty() ? "no other process" : out;
}

std::size_t LedgerSnapshot::committed_bytes() const {
  std::size_t committed = 0;
  for (const LedgerEntryInfo& entry : entries)
    if (entry.alive) committed += std::max(entry.reserved_bytes, entry.quota_bytes);
  return committed;
}

LedgerTotals LedgerSnapshot::totals() const {
  LedgerTotals totals;
  for (const LedgerEntryInfo& entry : entries) {
    ++totals.processes;
    totals.alive += entry.alive ? 1 : 0;
    totals.reserved_bytes += entry.reserved_bytes;
    totals.cached_free_bytes += entry.cached_free_bytes;
    totals.quota_bytes += entry.quota_bytes;
    totals.wanted_bytes += entry.wanted_bytes;
    totals.trim_requests += entry.trim_requests;
    totals.trims_answered += entry.trims_answered;
    totals.bytes_trimmed += entry.bytes_trimmed;
    totals.asleep_bytes += entry.asleep_bytes;
    totals.wake_waits += entry.wake_waits;
  }
  return totals;
}

}  // namespace tidepool
