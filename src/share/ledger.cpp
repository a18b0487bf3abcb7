// Ledger: a handle on a segment for reading it and clearing dead entries.
#include "tidepool/ledger.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "share/segment.hpp"

namespace tidepool {

std::string ledger_segment_name(std::string_view device_id, unsigned mode) {
  // Per user (or group): another user squatting this user's name blocks only
  // the name (open_segment refuses a segment it does not own), never another user.
  std::string name = mode == 0660 ? "/tidepool-g" + std::to_string(getegid()) + "-"
                                  : "/tidepool-u" + std::to_string(geteuid()) + "-";
  for (char c : device_id) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    name += plain ? c : '_';
  }
  constexpr std::size_t kMaxName = 200;  // well inside NAME_MAX with room for the hash
  if (name.size() > kMaxName) {
    // Two long ids sharing a prefix must not share a segment: keep a hash of the whole id.
    std::uint64_t hash = 0xcbf29ce484222325ULL;
    for (char c : device_id) {
      hash ^= static_cast<unsigned char>(c);
      hash *= 0x100000001b3ULL;
    }
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, "-%016llx", static_cast<unsigned long long>(hash));
    name.resize(kMaxName - 17);
    name += suffix;
  }
  return name;
}

Ledger::Ledger(std::unique_ptr<Segment> segment) : segment_(std::move(segment)) {}
Ledger::~Ledger() = default;

Expected<std::unique_ptr<Ledger>> Ledger::open_or_create(const LedgerSegmentOptions& options) {
  auto segment = share::open_segment(options, /*create_if_missing=*/true);
  if (!segment) return std::move(segment).error();
  return std::unique_ptr<Ledger>(new Ledger(std::move(*segment)));
}

Expected<std::unique_ptr<Ledger>> Ledger::open_existing(const std::string& name,
                                                        std::chrono::milliseconds lock_timeout) {
  LedgerSegmentOptions options;
  options.name = name;
  options.lock_timeout = lock_timeout;
  auto segment = share::open_segment(options, /*create_if_missing=*/false);
  if (!segment) return std::move(segment).error();
  return std::unique_ptr<Ledger>(new Ledger(std::move(*segment)));
}

Status Ledger::remove(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0) {
    return Error(Errc::io_error, "ledger segment " + name + ": shm_unlink: " + std::strerror(errno));
  }
  return {};
}

const std::string& Ledger::name() const { return segment_->name; }

Expected<LedgerSnapshot> Ledger::snapshot() const {
  auto lock = segment_->lock();
  if (!lock) return std::move(lock).error();
  return segment_->snapshot_locked();
}

Expected<std::size_t> Ledger::reclaim_dead() {
  auto lock = segment_->lock();
  if (!lock) return std::move(lock).error();
  return segment_->reclaim_dead_locked();
}

Status Ledger::with_lock_held(const std::function<void()>& while_held) {
  auto lock = segment_->lock();
  if (!lock) return std::move(lock).error();
  while_held();
  return {};
}

}  // namespace tidepool
