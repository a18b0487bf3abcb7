// Who a process is, in a way that survives pid reuse: its pid and its start
// time from /proc/<pid>/stat (field 22, clock ticks after boot). A pid that
// runs again with another start time is another process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/process.hpp"

namespace tidepool::share {

struct ProcessIdentity {
  int pid = 0;
  std::uint64_t start_time = 0;
  std::string command;  // comm, at most 15 characters
};

/// The identity of `pid` as /proc shows it now; nullopt when it does not run
/// or is a zombie (killed, not yet reaped: its memory is gone already).
std::optional<ProcessIdentity> read_process_identity(int pid);

/// This process's identity (read once, then cached; fork-safe: re-read when
/// the pid changes).
const ProcessIdentity& self_identity();

/// This process's pid without a system call (the ledger's lock records its
/// holder every time): core's, kept right in a forked child.
using tidepool::current_pid;

/// Whether `pid` runs and started at `start_time`.
bool process_alive(int pid, std::uint64_t start_time);

}  // namespace tidepool::share
