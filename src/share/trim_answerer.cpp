// TrimAnswerer: when another process posts a trim request (a bump of the
// segment's trim generation) and waits for memory, this process's pool
// gives its cached memory back, and the entry says so.
#include "share/trim_answerer.hpp"

#include <utility>

namespace tidepool::share {

TrimAnswerer::TrimAnswerer(const AccountSlot& slot, std::chrono::milliseconds poll_period)
    : slot_(slot), poll_period_(poll_period) {
  const std::uint64_t now = slot_.segment->header->trim_generation.load(std::memory_order_relaxed);
  answered_generation_.store(now, std::memory_order_relaxed);
  seen_generation_.store(now, std::memory_order_relaxed);
}

TrimAnswerer::~TrimAnswerer() {
  {
    std::lock_guard lock(thread_mutex_);
    stopping_ = true;
  }
  thread_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// In a forked child the mutexes below may be held for ever: a thread of the
// parent may have held one at the fork, and that thread is not in the child.
// So the child takes none of them; it has nothing to do there anyway (the
// entry is the parent's, and so is the thread).

void TrimAnswerer::set_hooks(TrimHooks hooks) {
  if (slot_.forked()) return;
  {
    std::lock_guard lock(hooks_mutex_);
    hooks_ = std::move(hooks);
    if (slot_.may_touch()) {
      Entry& entry = slot_.entry();
      const bool answers = hooks_.trim && entry.quota_bytes.load(std::memory_order_relaxed) == 0;
      entry.answers_trim.store(answers ? 1 : 0, std::memory_order_relaxed);
    }
    refresh_locked();
  }
  std::lock_guard lock(thread_mutex_);
  if (!thread_.joinable() && poll_period_.count() > 0) thread_ = std::thread([this] { background(); });
}

void TrimAnswerer::clear_hooks() {
  if (slot_.forked()) return;
  std::lock_guard lock(hooks_mutex_);
  hooks_ = TrimHooks{};
  if (!slot_.may_touch()) return;
  Entry& entry = slot_.entry();
  entry.answers_trim.store(0, std::memory_order_relaxed);
  entry.cached_free_bytes.store(kCachedFreeUnknown, std::memory_order_relaxed);
  entry.asleep_bytes.store(0, std::memory_order_relaxed);
}

void TrimAnswerer::refresh_reports() {
  if (slot_.forked()) return;
  std::lock_guard lock(hooks_mutex_);
  refresh_locked();
}

void TrimAnswerer::refresh_locked() {
  if (!slot_.may_touch()) return;
  Entry& entry = slot_.entry();
  if (hooks_.cached_free_bytes) entry.cached_free_bytes.store(hooks_.cached_free_bytes(), std::memory_order_relaxed);
  entry.asleep_bytes.store(hooks_.asleep_bytes ? hooks_.asleep_bytes() : 0, std::memory_order_relaxed);
}

void TrimAnswerer::background() {
  std::unique_lock lock(thread_mutex_);
  for (std::uint64_t tick = 1; !stopping_; ++tick) {
    thread_wake_.wait_for(lock, poll_period_, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    answer();
    if (tick % 10 == 0) refresh_reports();
    lock.lock();
  }
}

bool TrimAnswerer::others_want() const {
  const Ledger::Segment& segment = *slot_.segment;
  for (std::uint32_t i = 0; i < kEntryCount; ++i) {
    const Entry& entry = segment.entries[i];
    if (i != slot_.index && entry.state.load(std::memory_order_relaxed) == kEntryActive &&
        entry.wanted_bytes.load(std::memory_order_relaxed) != 0)
      return true;
  }
  return false;
}

std::size_t TrimAnswerer::answer() {
  if (!slot_.may_touch()) return 0;
  const auto& generation_now = slot_.segment->header->trim_generation;
  seen_generation_.store(generation_now.load(std::memory_order_relaxed), std::memory_order_relaxed);
  if (!requested()) return 0;
  std::lock_guard hooks_lock(hooks_mutex_);
  const std::uint64_t generation = generation_now.load(std::memory_order_acquire);
  if (generation == answered_generation_.load(std::memory_order_relaxed)) return 0;
  answered_generation_.store(generation, std::memory_order_relaxed);
  seen_generation_.store(generation, std::memory_order_relaxed);
  Entry& entry = slot_.entry();
  // A process with a quota keeps its commitment: its trim would free no one's budget.
  if (!hooks_.trim || entry.quota_bytes.load(std::memory_order_relaxed) != 0) return 0;
  if (!others_want()) return 0;
  const std::size_t released = hooks_.trim();
  entry.bytes_trimmed.fetch_add(released, std::memory_order_relaxed);
  refresh_locked();
  // Last: the requester reads this as "its trim is done, retry now".
  entry.trims_answered.fetch_add(1, std::memory_order_release);
  return released;
}

}  // namespace tidepool::share
