// An account's slot: which entry of the segment is this process's, and
// whether this process may touch it now. Shared by the account's
// reservations (ledger_account.cpp) and its trim answers (trim_answerer.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "share/process_identity.hpp"
#include "share/segment.hpp"

namespace tidepool::share {

struct AccountSlot {
  Ledger::Segment* segment = nullptr;
  std::uint32_t index = 0;
  int registered_pid = 0;  // the process the slot is registered to

  Entry& entry() const { return segment->entries[index]; }
  /// "ledger /name": how errors name the account.
  std::string who() const { return "ledger " + segment->name; }

  /// A child forked after registration inherits the account but not the
  /// slot: the entry is its parent's (or, once the parent exits, a third
  /// process's), so a child must never write it.
  bool forked() const noexcept { return current_pid() != registered_pid; }
  /// unsupported, saying what to do, in a forked child.
  Status check_not_forked() const {
    if (!forked()) return {};
    return Error(Errc::unsupported,
                 who() + ": this allocator was made by pid " + std::to_string(registered_pid) +
                     " and this process (pid " + std::to_string(current_pid()) +
                     ") is a child forked from it; a forked child may not use an allocator made before the "
                     "fork (its ledger entry is the parent's): make a new one in the child");
  }
  /// Whether the entry may be written now: ours, and the segment whole.
  bool may_touch() const { return !forked() && segment->check_intact(); }
};

}  // namespace tidepool::share
