// Which process made an object, so that a child forked from it can tell.
//
// A child forked after an allocator or a device was made inherits a copy of
// it: its memory, its mutexes as they were at the fork (perhaps held by a
// thread the child does not have) and none of its threads. The device memory
// behind it is not the child's: on a GPU the child cannot use the parent's
// CUDA context at all, and on the host device that memory is a MAP_SHARED
// memfd, so a block the child handed out, wrote or released would be the
// parent's too. Each device and pool keeps a MakerProcess, asks it before it
// takes a lock, refuses to hand out memory in a child and leaves the
// parent's memory alone there (docs/bad-inputs.md, "fork").
#pragma once

#include <atomic>
#include <string_view>

#include "tidepool/error.hpp"

namespace tidepool {

namespace detail {
inline std::atomic<int> cached_pid{0};  // 0 until first asked
int register_pid() noexcept;             // sets it and its pthread_atfork handler, once
}  // namespace detail

/// This process's pid without a system call (getpid() is one, ~200 ns with
/// today's mitigations); kept right in a forked child by a pthread_atfork
/// handler. Inline, a relaxed load once set: the pools ask it on every call.
inline int current_pid() noexcept {
  const int pid = detail::cached_pid.load(std::memory_order_relaxed);
  return pid != 0 ? pid : detail::register_pid();
}

class MakerProcess {
 public:
  MakerProcess() noexcept : pid_(current_pid()) {}

  /// Whether the caller is a child forked from the process that made it.
  bool forked() const noexcept { return current_pid() != pid_; }

  /// unsupported: "<what> was made by pid P and this process (pid C) is a
  /// child forked from it: ...".
  Error refusal(std::string_view what) const;

  int pid() const noexcept { return pid_; }

 private:
  int pid_;
};

}  // namespace tidepool
