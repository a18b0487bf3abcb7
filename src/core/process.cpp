#include "core/process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <string>

namespace tidepool {
namespace {
void refresh_cached_pid() noexcept { detail::cached_pid.store(static_cast<int>(getpid()), std::memory_order_relaxed); }
}  // namespace

int detail::register_pid() noexcept {
  static const bool registered = [] {
    refresh_cached_pid();
    pthread_atfork(nullptr, nullptr, refresh_cached_pid);
    return true;
  }();
  (void)registered;
  return cached_pid.load(std::memory_order_relaxed);
}

Error MakerProcess::refusal(std::string_view what) const {
  return Error(Errc::unsupported,
               std::string(what) + " was made by pid " + std::to_string(pid_) + " and this process (pid " +
                   std::to_string(current_pid()) +
                   ") is a child forked from it: its memory is the parent's (CUDA cannot be used after "
                   "fork either), so a forked child may not use a pool or device made before the fork: "
                   "make a new one in the child");
}

}  // namespace tidepool
