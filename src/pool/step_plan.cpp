// StepPlan: learning a repeating step, planning it, and serving it from the
// slab (step_plan.hpp says how, and why two live blocks never overlap).
#include "pool/step_plan.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "pool/lifetime_plan.hpp"
#include "tidepool/units.hpp"

namespace tidepool::pool {
namespace {

constexpr std::uint64_t kBase = 0x9E3779B97F4A7C15ULL;  // odd: the rolling hash's base
constexpr std::uint64_t base_to_window() {
  std::uint64_t power = 1;
  for (std::uint32_t i = 0; i < StepPlan::kWindow; ++i) power *= kBase;
  return power;
}
// Learning pauses after each plan given up or not needed, twice as long each
// time (a program that does not repeat costs the log a fraction of requests).
constexpr std::uint64_t kMaxPause = std::uint64_t{1} << 24;

}  // namespace

// The placement of a step, made on the placer's thread, which holds a
// reference until it is done: the plan may drop its own at any time.
struct StepPlan::Placing {
  Placing(std::vector<Lifetime> blocks, std::uint32_t period)
      : lives(std::move(blocks)), span(period), pid(getpid()) {}
  const std::vector<Lifetime> lives;
  const std::uint32_t span;
  const pid_t pid;  // the process whose thread places
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  std::mutex mutex;
  std::condition_variable finished;
  std::optional<LifetimePlan> plan;  // written before done

  void run() {
    std::optional<LifetimePlan> made = plan_lifetimes(lives, span, kMaxWork, &stop);
    std::lock_guard lock(mutex);
    plan = std::move(made);
    done.store(true, std::memory_order_release);
    finished.notify_all();
  }
  /// The placement, waited for if need be. A child forked while its
  /// parent's thread placed has no such thread (and what it wrote may be
  /// half done, its lock held): the child places here.
  std::optional<LifetimePlan> take() {
    if (done.load(std::memory_order_acquire)) return std::move(plan);
    if (pid != getpid()) return plan_lifetimes(lives, span, kMaxWork);
    std::unique_lock lock(mutex);
    finished.wait(lock, [this] { return done.load(std::memory_order_relaxed); });
    return std::move(plan);
  }
};

// One thread a process places the steps of every pool, in turn. It is
// started when a plan first logs (in a pool's first pass, among its device
// calls), so that a step found later costs the allocating thread no thread
// start (some 50 us here, the whole of a short step's pass). A child forked
// from a process that had one starts its own (the parent's thread, and the
// state of its lock, are not the child's); the parent's placer is left as it
// was copied.
class StepPlan::Placer {
 public:
  /// This process's placer, started if need be.
  static Placer& get() {
    static std::atomic<Placer*> current{nullptr};
    const pid_t pid = getpid();
    Placer* placer = current.load(std::memory_order_acquire);
    if (placer != nullptr && placer->pid_ == pid) return *placer;
    auto* fresh = new Placer(pid, placer);
    if (!current.compare_exchange_strong(placer, fresh, std::memory_order_acq_rel)) {
      delete fresh;  // another thread made this process's placer first
      return *placer;
    }
    try {
      std::thread thread([fresh] { fresh->run(); });
      // Named here, not by the thread itself: the name is there as soon as
      // the placer is (top, gdb, /proc/PID/task/*/comm), however late the
      // thread first runs.
      pthread_setname_np(thread.native_handle(), "tidepool-plan");
      thread.detach();
      fresh->started_.store(true, std::memory_order_release);
    } catch (const std::system_error&) {
      // No thread to be had: each plan places its step itself.
    }
    return *fresh;
  }
  /// Queues `placing`; false when there is no thread (the caller places it).
  bool submit(std::shared_ptr<Placing> placing) {
    if (!started_.load(std::memory_order_acquire)) return false;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(placing));
    }
    wake_.notify_one();
    return true;
  }

 private:
  Placer(pid_t pid, Placer* parents) : pid_(pid), parents_(parents) {}
  [[noreturn]] void run() {
    for (;;) {
      std::shared_ptr<Placing> placing;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return !queue_.empty(); });
        placing = std::move(queue_.front());
        queue_.pop_front();
      }
      placing->run();  // a placing stopped ends at its first block
    }
  }
  const pid_t pid_;
  [[maybe_unused]] Placer* const parents_;  // kept as it was copied (its lock may be held): reachable, never used
  std::atomic<bool> started_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Placing>> queue_;
};

std::uint64_t StepPlan::key_of(std::size_t bytes, Stream stream) noexcept {
  std::uint64_t key = (bytes ^ (stream * 0xC2B2AE3D27D4EB4FULL)) + 0x165667B19E3779F9ULL;
  key ^= key >> 31;
  key *= 0xBF58476D1CE4E5B9ULL;
  return key ^ (key >> 29);
}

void StepPlan::restart_log() noexcept {
  // The tables go (no allocation here: this runs on paths that cannot fail);
  // the next request logged makes them at their first size, so that a short
  // step logged next stays in cache.
  std::vector<Seen>().swap(seen_);
  seen_bits_ = 0;
  std::vector<LiveSlot>().swap(logged_live_);
  events_size_ = 0;
  appended_requests_ = 0;
  log_.clear();
  scanned_ = 0;
  logged_live_count_ = 0;
  anchors_ = 0;
  hash_ = 0;
  candidate_count_ = 0;
  copy_start_ = 0;
  stream_changed_at_ = 0;
  match_period_ = 0;
}

void StepPlan::back_off() noexcept {
  restart_log();
  paused_for_ = next_pause_;
  next_pause_ = std::min(2 * next_pause_, kMaxPause);
}

namespace {
std::uint32_t home_of(const void* ptr, std::size_t slots) noexcept {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr) * 0x9E3779B97F4A7C15ULL;
  return static_cast<std::uint32_t>(key >> 40) & static_cast<std::uint32_t>(slots - 1);
}
}  // namespace

void StepPlan::grow_live() {
  std::vector<LiveSlot> old = std::move(logged_live_);
  logged_live_.assign(old.empty() ? std::size_t{1} << kFirstTableBits : 2 * old.size(), LiveSlot{});
  logged_live_count_ = 0;
  for (const LiveSlot& slot : old) {
    if (slot.ptr != nullptr) live_insert(slot.ptr, slot.index);
  }
}

void StepPlan::grow_seen() {
  std::vector<Seen> old = std::move(seen_);
  seen_bits_ = old.empty() ? kFirstTableBits : seen_bits_ + 1;
  seen_.assign(std::size_t{1} << seen_bits_, Seen{});
  for (const Seen& seen : old) {
    if (seen.first != kLive) seen_slot(seen.hash) = seen;  // each window once: never a collision of equals
  }
}

void StepPlan::live_insert(const void* ptr, std::uint32_t index) {
  if (2 * (logged_live_count_ + 1) > logged_live_.size()) grow_live();
  const auto mask = static_cast<std::uint32_t>(logged_live_.size() - 1);
  for (std::uint32_t at = home_of(ptr, logged_live_.size());; at = (at + 1) & mask) {
    LiveSlot& slot = logged_live_[at];
    if (slot.ptr == nullptr) ++logged_live_count_;
    if (slot.ptr == nullptr || slot.ptr == ptr) {
      slot = {ptr, index};
      return;
    }
  }
}

std::uint32_t StepPlan::live_take(const void* ptr) noexcept {
  if (logged_live_count_ == 0) return kLive;
  const auto mask = static_cast<std::uint32_t>(logged_live_.size() - 1);
  std::uint32_t at = home_of(ptr, logged_live_.size());
  while (logged_live_[at].ptr != ptr) {
    if (logged_live_[at].ptr == nullptr) return kLive;
    at = (at + 1) & mask;
  }
  const std::uint32_t index = logged_live_[at].index;
  --logged_live_count_;
  // Backward-shift deletion: each later entry of the run whose home does not
  // lie cyclically in (at, next] moves into the hole.
  for (std::uint32_t next = (at + 1) & mask; logged_live_[next].ptr != nullptr; next = (next + 1) & mask) {
    const std::uint32_t home = home_of(logged_live_[next].ptr, logged_live_.size());
    const bool stays = at <= next ? (at < home && home <= next) : (at < home || home <= next);
    if (stays) continue;
    logged_live_[at] = logged_live_[next];
    at = next;
  }
  logged_live_[at] = {};
  return index;
}

void StepPlan::log_alloc(const void* ptr, std::size_t bytes, Stream stream, std::int64_t device_calls) {
  if (phase_ != Phase::learning && phase_ != Phase::armed) return;
  if (device_calls != last_calls_) {
    last_calls_ = device_calls;
    quiet_for_ = 0;
    torn_down_ = false;
  } else if (++quiet_for_ > kQuietLimit) {
    if (!log_.empty() || events_size_ != 0) restart_log();
    return;
  }
  if (paused_for_ > 0) {
    --paused_for_;
    return;
  }
  if (copy_ended_) end_copy();
  if (match_period_ != 0 && match(bytes, stream, device_calls)) return;
  if (events_ == nullptr) {
    // Every page touched now (zeroed), at the first request logged: a quiet
    // pool appending to fresh pages would take a page fault every 128 events.
    events_ = std::make_unique<Event[]>(kMaxEvents);
    (void)Placer::get();  // and the thread that will place its steps started
  }
  // Only a step whose newer copy made a device call is planned, and a copy
  // ends at the latest request: shortly after a call (and before any
  // teardown) each request is logged and searched as it comes; after that
  // the events only pile up, and the next call logs and searches them (a
  // sequential pass).
  if (eager()) {
    fold();  // what piled up before the call
    if (paused_for_ == 0 && log_alloc_now(ptr, bytes, stream, device_calls)) scan();
    return;
  }
  if (events_size_ == kMaxEvents) {
    fold();
    if (paused_for_ > 0) return;  // the log was full: learning pauses
  }
  events_[events_size_++] = {ptr, bytes, stream, device_calls};
  ++appended_requests_;
}

bool StepPlan::log_alloc_now(const void* ptr, std::size_t bytes, Stream stream, std::int64_t device_calls) {
  if (log_.size() == kLogCapacity) {  // no step of at most kMaxPeriod requests repeated in it
    back_off();                       // (the events go too)
    return false;
  }
  if (log_.capacity() == 0) log_.reserve(kLogCapacity);  // pages are touched as the log grows, never copied
  const auto index = static_cast<std::uint32_t>(log_.size());
  if (index > 0 && log_[index - 1].stream != stream) stream_changed_at_ = index;
  log_.push_back({key_of(bytes, stream), bytes, stream, kLive, 0, device_calls});
  live_insert(ptr, index);
  return true;
}

void StepPlan::log_free_now(const void* ptr, Stream stream) noexcept {
  const std::uint32_t index = live_take(ptr);
  if (index == kLive) return;  // made before the log started
  log_[index].freed_at = static_cast<std::uint32_t>(log_.size());
  log_[index].freed_on = stream;
}

void StepPlan::fold() {
  for (std::size_t i = 0; i < events_size_; ++i) {
    const Event& event = events_[i];
    if (event.bytes == 0) {
      log_free_now(event.ptr, event.stream);
    } else if (!log_alloc_now(event.ptr, event.bytes, event.stream, event.calls)) {
      return;  // the log was full: learning pauses (the events went too)
    }
  }
  events_size_ = 0;
  appended_requests_ = 0;
}

void StepPlan::scan() {
  static constexpr std::uint64_t kBaseToWindow = base_to_window();
  while (scanned_ < log_.size()) {
    const std::uint32_t index = scanned_++;
    if (phase_ == Phase::armed && index >= armed_at_ && index < armed_until_) {
      // Planned during this catch-up: the requests logged since must follow
      // the plan (those after them take() matches as they come).
      if (!matches(position_, log_[index].bytes, log_[index].stream)) {
        disarm();
      } else {
        position_ = (position_ + 1) % static_cast<std::uint32_t>(slots_.size());
      }
    }
    hash_ = hash_ * kBase + log_[index].key;
    if (index >= kWindow) hash_ -= log_[index - kWindow].key * kBaseToWindow;
    if (index + 1 < kWindow) continue;
    std::uint32_t kept = 0;  // the periods whose request here is the one a period before
    for (std::uint32_t i = 0; i < candidate_count_; ++i) {
      if (same_request(index, index - candidates_[i].period)) candidates_[kept++] = candidates_[i];
    }
    candidate_count_ = kept;
    // Windows are remembered only at anchors, a quarter of them picked by
    // their own hash: a repeat has its anchors where the first copy had
    // them, and the table stays small enough to stay in cache.
    if ((hash_ & kAnchorMask) == 0) {
      if (2 * (anchors_ + 1) > seen_.size()) grow_seen();
      Seen& seen = seen_slot(hash_);
      if (seen.first == kLive) {
        seen = {hash_, index, index};
        ++anchors_;
      } else {
        for (const std::uint32_t before : {seen.latest, seen.first}) {
          const std::uint32_t period = index - before;
          if (period > kMaxPeriod || candidate_count_ == kCandidates) break;
          if (!has_candidate(period)) {
            candidates_[candidate_count_++] = {period, kWindow - 1};  // the window matched (confirm() checks in full)
          }
        }
        seen.latest = index;
      }
    }
    for (std::uint32_t i = 0; i < candidate_count_;) {
      Candidate& candidate = candidates_[i];
      if (++candidate.run < candidate.period || index + 1 < 2 * candidate.period) {
        ++i;
        continue;
      }
      const std::uint32_t period = candidate.period;
      std::copy(candidates_.begin() + i + 1, candidates_.begin() + candidate_count_, candidates_.begin() + i);
      --candidate_count_;
      if (confirm(period, index + 1)) {
        armed_at_ = index + 1;  // planned: the requests logged after `index` are matched above
        armed_until_ = static_cast<std::uint32_t>(log_.size());
        break;
      }
    }
  }
}

void StepPlan::log_free(const void* ptr, Stream stream) {
  if (phase_ != Phase::learning && phase_ != Phase::armed) return;
  if (events_size_ == 0 && eager()) {  // searching as requests come: logged now
    log_free_now(ptr, stream);
    return;
  }
  if (events_size_ == kMaxEvents) {
    fold();
    if (logged_live_count_ == 0) return;  // nothing logged it could free
  }
  events_[events_size_++] = {ptr, 0, stream, 0};
}

void StepPlan::end_copy() {
  copy_ended_ = false;
  if (match_period_ != 0) return;  // the teardown ended a copy being compared
  // A pool quiet for a while before the teardown will most likely serve the
  // next copy quietly too: the events piled up are left as they are (folding
  // them here would cost every teardown of a settled program), and where the
  // next copy starts in the log is not known.
  if (quiet_for_ > kEagerRequests) {
    copy_start_ = kLive;
    return;
  }
  // The copy's requests are all logged; the teardown's frees are logged
  // only if the copy is planned (they are all a quiet repeat would cost).
  if (appended_requests_ != 0) fold();
  const std::uint32_t first = copy_start_;
  const auto end = static_cast<std::uint32_t>(log_.size());
  copy_start_ = end;  // the next copy starts with this request
  if (first == kLive || paused_for_ > 0 || phase_ != Phase::learning) return;
  if (end - first < kWindow || end - first > kMaxPeriod) return;
  if (stream_changed_at_ > first) return;  // on one stream only
  match_first_ = first;
  match_period_ = end - first;
  match_at_ = 0;
  match_wrapped_ = false;
}

bool StepPlan::match(std::size_t bytes, Stream stream, std::int64_t device_calls) {
  const std::uint32_t first = match_first_, period = match_period_;
  if (!copy_expects(bytes, stream)) {
    match_period_ = 0;
    if (match_at_ > 0 || match_wrapped_) restart_log();  // the requests matched were not logged
    return false;
  }
  if (++match_at_ < period) return true;
  // The newer copy is whole. As confirm() does: planned if the pool made a
  // device call since the older copy's last request; else the copy after it
  // is compared in turn.
  match_at_ = 0;
  if (device_calls == log_[first + period - 1].calls) {
    match_wrapped_ = true;
    return true;
  }
  match_period_ = 0;
  // As confirm() asks too: the older copy's blocks were all freed, on its
  // stream (frees after the teardown are not logged: a block freed then
  // counts as live, and the copy is no step).
  fold();
  bool whole = logged_live_count_ == 0;
  for (std::uint32_t k = first; whole && k < first + period; ++k) whole = log_[k].freed_on == log_[first].stream;
  if (!whole) {
    restart_log();
    return true;
  }
  plan_step(first, period);
  // The log goes on after the older copy (the newer one was not logged): the
  // window's hash is the newer copy's end, which is the older copy's.
  scanned_ = static_cast<std::uint32_t>(log_.size());
  armed_at_ = armed_until_ = scanned_;
  hash_ = 0;
  for (std::uint32_t k = scanned_ - kWindow; k < scanned_; ++k) hash_ = hash_ * kBase + log_[k].key;
  candidate_count_ = 0;
  return true;
}

bool StepPlan::confirm(std::uint32_t period, std::uint32_t end) {
  const std::uint32_t first = end - 2 * period;  // the older copy: [first, first + period)
  // A loop of fewer requests than a window is no step worth a slab; while
  // armed, only a longer step (the one the armed plan is part of) replaces it.
  if (period < kWindow || (phase_ == Phase::armed && period <= slots_.size())) return false;
  // The pool repeated it without a device call: no plan needed (a longer
  // step may still be found).
  if (log_[end - 1].calls == log_[first + period - 1].calls) return false;
  const Stream stream = log_[first].stream;
  for (std::uint32_t k = first; k < end; ++k) {
    const Logged& entry = log_[k];
    if (entry.stream != stream) return false;  // one stream only
    if (k >= first + period && !same_request(k, k - period)) return false;  // the hash matched, the requests did not
    if (k >= first + period) continue;
    // Every block of the older copy freed since, on the plan's stream: a
    // step, not a phase of one (a layer whose saved tensors live on).
    if (entry.freed_at == kLive || entry.freed_on != stream) return false;
    // And the newer copy's blocks live as long (so far): a run of one size
    // repeats at any period, but its blocks are freed as a step frees them.
    const std::uint32_t lifetime = entry.freed_at - k;
    const Logged& again = log_[k + period];
    if (again.freed_at == kLive ? end - (k + period) > lifetime : again.freed_at - (k + period) != lifetime) {
      return false;
    }
  }
  plan_step(first, period);
  return true;
}

std::uint32_t StepPlan::cut_of(std::uint32_t first, std::uint32_t period) const {
  // Bytes live across each position (allocated before it, freed after it),
  // around the step as a circle: the step is cut where that is least, so
  // that few blocks span the cut (they keep their slot the whole step).
  std::vector<std::int64_t> crossing(period + 1, 0);
  auto cover = [&](std::uint32_t from, std::uint32_t to, std::int64_t bytes) {  // [from, to), to <= period
    crossing[from] += bytes;
    crossing[to] -= bytes;
  };
  for (std::uint32_t p = 0; p < period; ++p) {
    const Logged& entry = log_[first + p];
    const std::uint32_t lifetime = entry.freed_at - (first + p);
    if (lifetime > period || lifetime < 2) continue;
    const std::uint32_t from = p + 1, to = p + lifetime;
    const auto bytes = static_cast<std::int64_t>(entry.bytes);
    if (to <= period) {
      cover(from, to, bytes);
    } else if (from >= period) {
      cover(from - period, to - period, bytes);
    } else {
      cover(from, period, bytes);
      cover(0, to - period, bytes);
    }
  }
  std::uint32_t cut = 0;
  std::int64_t live = 0, least = std::numeric_limits<std::int64_t>::max();
  for (std::uint32_t p = 0; p < period; ++p) {
    live += crossing[p];
    if (live < least) {
      least = live;
      cut = p;
    }
  }
  return cut;
}

void StepPlan::plan_step(std::uint32_t first, std::uint32_t period) {
  // A step no block of which outlives its end (a copy a teardown ended) is
  // cut at its start: nothing is live across it.
  bool wraps = false;
  for (std::uint32_t p = 0; p < period && !wraps; ++p) wraps = log_[first + p].freed_at > first + period;
  const std::uint32_t cut = wraps ? cut_of(first, period) : 0;

  slots_.assign(period, Slot{});
  unplanned_ = 0;
  std::vector<Lifetime> lives;
  std::vector<std::uint32_t> planned;  // slot of each of lives
  lives.reserve(period);
  planned.reserve(period);
  for (std::uint32_t p = 0; p < period; ++p) {
    const std::uint32_t at = p >= cut ? p - cut : p + period - cut;
    const Logged& entry = log_[first + p];
    Slot& slot = slots_[at];
    slot.bytes = entry.bytes;
    slot.lifetime = entry.freed_at - (first + p);
    slot.planned = slot.lifetime <= period;
    if (!slot.planned) {
      unplanned_ += entry.bytes;
      continue;
    }
    // One that spans the cut holds its slot over the whole step.
    lives.push_back(at + slot.lifetime <= period ? Lifetime{at, at + slot.lifetime, entry.bytes}
                                                 : Lifetime{0, period, entry.bytes});
    planned.push_back(at);
  }
  stream_ = log_[first].stream;
  planned_ = std::move(planned);
  start_placing(std::move(lives), period);
  // The next request is the one after the newer copy: position 0 of the
  // older copy, `cut` before the plan's start.
  position_ = (period - cut) % period;
  phase_ = Phase::armed;  // the log goes on: a longer step may still replace this one
  ++plans_;
}

StepPlan::~StepPlan() { abandon_placing(); }

void StepPlan::start_placing(std::vector<Lifetime> lives, std::uint32_t period) {
  abandon_placing();
  auto placing = std::make_shared<Placing>(std::move(lives), period);
  if (!Placer::get().submit(placing)) placing->run();  // no thread: placed now
  placing_ = std::move(placing);
}

void StepPlan::abandon_placing() noexcept {
  if (placing_ == nullptr) return;
  placing_->stop.store(true, std::memory_order_relaxed);
  placing_.reset();
}

std::uint64_t StepPlan::slab_bytes() {
  if (placing_ != nullptr) {
    const std::shared_ptr<Placing> placing = std::move(placing_);
    std::optional<LifetimePlan> plan = placing->take();
    if (!plan) return 0;  // no placement within kMaxWork
    install(*plan);
  }
  return footprint_;
}

void StepPlan::install(const LifetimePlan& plan) {
  const auto period = static_cast<std::uint32_t>(slots_.size());
  footprint_ = plan.footprint_bytes;
  group_of_offset_.clear();
  ends_at_.assign(period, {});
  for (std::size_t i = 0; i < planned_.size(); ++i) {
    Slot& slot = slots_[planned_[i]];
    slot.offset = plan.offsets[i];
    slot.group = group_of_offset_.try_emplace(slot.offset, static_cast<std::uint32_t>(group_of_offset_.size()))
                     .first->second;
    ends_at_[(planned_[i] + slot.lifetime) % period].push_back(planned_[i]);
  }
  live_in_group_.assign(group_of_offset_.size(), kLive);
  handed_at_.assign(period, 0);
  live_.assign(period, 0);
  overdue_.assign(period, 0);
  live_count_ = overdue_count_ = 0;
}

void StepPlan::opened() noexcept {
  restart_log();
  phase_ = Phase::following;
  position_ = 0;
  now_ = 0;
  lost_requests_ = 0;
  next_pause_ = kLogCapacity;
}

void StepPlan::disarm() noexcept {
  abandon_placing();
  planned_.clear();
  phase_ = Phase::learning;
  slots_.clear();
  ends_at_.clear();
  group_of_offset_.clear();
  footprint_ = unplanned_ = 0;
}

void StepPlan::drop() noexcept {
  disarm();
  live_in_group_.clear();
  handed_at_.clear();
  live_.clear();
  overdue_.clear();
  live_count_ = overdue_count_ = 0;
  pending_.clear();
  back_off();
}

void StepPlan::advance() noexcept {
  for (const std::uint32_t slot : ends_at_[position_]) {
    if (live_[slot] && !overdue_[slot] && handed_at_[slot] + slots_[slot].lifetime <= now_) {
      overdue_[slot] = 1;
      ++overdue_count_;
    }
  }
}

std::optional<std::uint64_t> StepPlan::take(std::size_t bytes, Stream stream) {
  const auto period = static_cast<std::uint32_t>(slots_.size());
  switch (phase_) {
    case Phase::learning:
    case Phase::retiring:
      return std::nullopt;
    case Phase::armed:
      if (!matches(position_, bytes, stream)) {
        disarm();  // not the step after all (or it changed): learning goes on
      } else {
        position_ = (position_ + 1) % period;
      }
      return std::nullopt;
    case Phase::lost:
      if (!matches(0, bytes, stream)) {
        if (++lost_requests_ > std::uint64_t{kLostSteps} * period) retire();
        return std::nullopt;
      }
      // The step's first request: follow again. Where the blocks still live
      // would be in the plan is unknown, so each counts overdue until freed.
      position_ = 0;
      now_ += 2 * period;
      for (std::uint32_t slot = 0; slot < period; ++slot) {
        if (live_[slot] && !overdue_[slot]) {
          overdue_[slot] = 1;
          ++overdue_count_;
        }
      }
      phase_ = Phase::following;
      break;
    case Phase::following:
      if (!matches(position_, bytes, stream)) {
        phase_ = Phase::lost;
        ++lost_requests_;
        return std::nullopt;
      }
      break;
  }
  advance();
  const std::uint32_t at = position_;
  const Slot& slot = slots_[at];
  std::optional<std::uint64_t> offset;
  if (slot.planned && overdue_count_ == 0 && !live_[at] && live_in_group_[slot.group] == kLive) {
    live_[at] = 1;
    handed_at_[at] = now_;
    ++live_count_;
    live_in_group_[slot.group] = at;
    offset = slot.offset;
    ++served_;
  }
  position_ = (position_ + 1) % period;
  ++now_;
  if (position_ == 0) lost_requests_ = 0;  // a whole step followed
  return offset;
}

Expected<std::size_t> StepPlan::give_back(std::uint64_t offset, Stream stream, std::uintptr_t address) {
  auto group = group_of_offset_.find(offset);
  if (group == group_of_offset_.end()) {
    return Error(Errc::invalid_pointer, "free of " + format_address(address) +
                                            ": not a block of this pool; it lies " + std::to_string(offset) +
                                            " bytes into the step plan's slab, where no block starts");
  }
  const std::uint32_t slot = live_in_group_[group->second];
  if (slot == kLive) {
    return Error(Errc::double_free, "free of " + format_address(address) +
                                        ": the memory is free already (a block of the step plan's slab, " +
                                        std::to_string(offset) + " bytes in); was it freed twice?");
  }
  live_in_group_[group->second] = kLive;
  live_[slot] = 0;
  --live_count_;
  if (overdue_[slot]) {
    overdue_[slot] = 0;
    --overdue_count_;
  }
  if (stream != stream_ && std::find(pending_.begin(), pending_.end(), stream) == pending_.end()) {
    pending_.push_back(stream);
  }
  return slots_[slot].bytes;
}

std::string StepPlan::searching() const {
  if (match_period_ != 0) {
    return "; comparing requests with the copy a teardown ended: " + std::to_string(match_at_) + " of " +
           std::to_string(match_period_) + " matched";
  }
  if (torn_down_) return "; a teardown since the last device call: requests appended until the next";
  return "";
}

std::string StepPlan::describe() const {
  switch (phase_) {
    case Phase::learning:
      return "step plan: learning (" + std::to_string(plans_) + " planned so far)" + searching();
    case Phase::armed:
      return "step plan: " + std::to_string(slots_.size()) + " large requests planned" +
             (placing_ != nullptr ? " (being placed)" : " in " + format_bytes(footprint_)) +
             ", waiting for the step's start" + searching();
    case Phase::following:
    case Phase::lost:
    case Phase::retiring:
      return std::string("step plan: ") +
             (phase_ == Phase::following ? "following" : phase_ == Phase::lost ? "lost its place in" : "retiring") +
             " a step of " + std::to_string(slots_.size()) + " large requests, slab of " + format_bytes(footprint_) +
             ", " + std::to_string(live_count_) + " blocks live in it, " + std::to_string(served_) +
             " served from it";
  }
  return {};
}

}  // namespace tidepool::pool
