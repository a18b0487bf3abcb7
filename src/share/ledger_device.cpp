// LedgerDevice: reserve in the ledger, then allocate; free, then release.
// A request that does not fit posts a trim request and waits, bounded, for
// the other processes to give cached memory back.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "share/process_identity.hpp"
#include "share/segment.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

using share::Entry;
using share::kEntryActive;
using share::kEntryCount;
using share::kEntryFree;

struct LedgerDevice::State {
  std::unique_ptr<Ledger> ledger;
  Ledger::Segment* segment = nullptr;
  std::uint32_t slot = 0;
  int registered_pid = 0;  // the process the slot is registered to
  LedgerOptions options;

  std::mutex hooks_mutex;  // held while a hook runs, so clear_trim_hooks waits for it
  TrimHooks hooks;
  std::atomic<std::uint64_t> answered_generation{0};
  // The segment's trim_generation as the background thread last read it:
  // what the allocate path's trim_requested() compares, so that path never
  // touches the mapping (a segment truncated under us cannot fault there).
  std::atomic<std::uint64_t> seen_generation{0};

  std::mutex thread_mutex;
  std::condition_variable thread_wake;
  bool stopping = false;
  std::thread thread;

  Entry& me() const { return segment->entries[slot]; }
  std::string who() const { return "ledger " + segment->name; }

  // A child forked after registration inherits this object but not the
  // slot: the entry is its parent's (or, once the parent exits, a third
  // process's), so a child must never write it.
  bool forked() const noexcept { return share::current_pid() != registered_pid; }
  Status check_not_forked() const {
    if (!forked()) return {};
    return Error(Errc::unsupported,
                 who() + ": this allocator was made by pid " + std::to_string(registered_pid) +
                     " and this process (pid " + std::to_string(share::current_pid()) +
                     ") is a child forked from it; a forked child may not use an allocator made before the "
                     "fork (its ledger entry is the parent's): make a new one in the child");
  }
  // Whether the entry may be written now: ours, and the segment whole.
  bool may_touch() const { return !forked() && segment->check_intact(); }

  // Bytes this process could still reserve, from lock-free reads: an estimate.
  std::size_t room() const {
    if (!segment->check_intact()) return 0;
    const std::size_t limit = segment->limit_bytes();
    const std::size_t reserved = me().reserved_bytes.load(std::memory_order_relaxed);
    const std::size_t quota = me().quota_bytes.load(std::memory_order_relaxed);
    const std::size_t others = segment->committed_locked(slot);
    std::size_t room = others + reserved < limit ? limit - others - reserved : 0;
    if (quota != 0) room = std::min(room, quota > reserved ? quota - reserved : 0);
    return room;
  }

  // A helper: another live entry that answers trim requests, and the count of
  // requests it had answered when ours was posted.
  struct Helper {
    std::uint32_t slot;
    int pid;
    std::uint64_t answered;
  };

  std::vector<Helper> helpers_locked() const {
    std::vector<Helper> helpers;
    for (std::uint32_t i = 0; i < kEntryCount; ++i) {
      const Entry& entry = segment->entries[i];
      if (i == slot || entry.state.load(std::memory_order_relaxed) != kEntryActive) continue;
      // A process with a quota does not answer: its commitment stays its quota.
      if (entry.answers_trim.load(std::memory_order_relaxed) == 0 ||
          entry.quota_bytes.load(std::memory_order_relaxed) != 0)
        continue;
      helpers.push_back({i, entry.pid.load(std::memory_order_relaxed),
                         entry.trims_answered.load(std::memory_order_relaxed)});
    }
    return helpers;
  }

  bool all_answered(const std::vector<Helper>& helpers) const {
    for (const Helper& helper : helpers) {
      const Entry& entry = segment->entries[helper.slot];
      const bool same_process = entry.state.load(std::memory_order_relaxed) == kEntryActive &&
                                entry.pid.load(std::memory_order_relaxed) == helper.pid;
      if (same_process && entry.trims_answered.load(std::memory_order_relaxed) == helper.answered) return false;
    }
    return true;
  }

  // One locked try: reserve `bytes` if they fit (clearing dead entries first
  // when they do not). Returns what was missing.
  Expected<Ledger::Segment::Shortfall> try_reserve(std::size_t bytes) {
    if (Status ours = check_not_forked(); !ours) return std::move(ours).error();
    auto lock = segment->lock_unchecked();  // reserve_locked checks the entries
    if (!lock) return std::move(lock).error();
    auto shortfall = segment->reserve_locked(slot, bytes);
    if (shortfall && shortfall->bytes != 0 && !shortfall->by_quota && segment->reclaim_dead_locked() > 0)
      shortfall = segment->reserve_locked(slot, bytes);
    return shortfall;
  }

  Error out_of_memory(std::size_t bytes, const std::string& why) {
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_reserved = me().reserved_bytes.load(std::memory_order_relaxed);
    report.device_free_bytes = room();
    report.largest_free_block_bytes = report.device_free_bytes;
    std::string holders;
    if (auto lock = segment->lock()) holders = segment->holders_locked(slot);
    report.hint = why + "; limit " + format_bytes(segment->limit_bytes()) + ", held by: " + holders;
    return Error::out_of_memory(who() + " (pid " + std::to_string(getpid()) + ")", std::move(report));
  }

  // Reserves `bytes`, asking the others to trim when they do not fit. A
  // wait for a `batch` (a wake) is counted in the entry.
  Status reserve(std::size_t bytes, bool batch = false) {
    auto first = try_reserve(bytes);
    if (!first) return std::move(first).error();
    if (first->bytes == 0) return {};
    if (first->by_quota) {
      return out_of_memory(bytes, "this process's quota of " +
                                      format_bytes(me().quota_bytes.load(std::memory_order_relaxed)) +
                                      " would be exceeded by " + format_bytes(first->bytes));
    }
    if (!options.cooperative_trim) {
      return out_of_memory(bytes, format_bytes(first->bytes) + " short; cooperative trim is off");
    }
    Expected<std::vector<Helper>> posted = post_trim_request(bytes);
    if (!posted) return std::move(posted).error();
    std::vector<Helper> helpers = std::move(*posted);
    if (helpers.empty() && !batch) {
      return out_of_memory(bytes, format_bytes(first->bytes) +
                                      " short and no other process answers trim requests");
    }
    if (batch) {
      // A wake waits its whole bound: the others may free later, not only trim.
      me().wanted_bytes.store(bytes, std::memory_order_relaxed);
      me().wake_waits.fetch_add(1, std::memory_order_relaxed);
    }
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + (batch ? options.wake_wait : options.trim_wait);
    auto pause = std::chrono::microseconds(500);
    const auto longest_pause = std::chrono::duration_cast<std::chrono::microseconds>(
        std::max(options.poll_period, std::chrono::milliseconds(1)));
    std::size_t missing = first->bytes;
    for (;;) {
      const bool answered = all_answered(helpers);
      std::this_thread::sleep_for(answered && !batch ? std::chrono::microseconds(0) : pause);
      pause = std::min(pause * 2, longest_pause);
      auto attempt = try_reserve(bytes);
      if (!attempt) {
        me().wanted_bytes.store(0, std::memory_order_relaxed);
        return std::move(attempt).error();
      }
      if (attempt->bytes == 0) break;
      missing = attempt->bytes;
      if ((answered && !batch) || Clock::now() >= deadline) {
        me().wanted_bytes.store(0, std::memory_order_relaxed);
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        if (batch) {
          return out_of_memory(bytes, format_bytes(missing) + " short after " + std::to_string(waited.count()) +
                                          " ms waiting for the other processes to free or trim (the wake_wait bound)");
        }
        return out_of_memory(bytes, format_bytes(missing) + " short after " + std::to_string(waited.count()) +
                                        " ms waiting for " + std::to_string(helpers.size()) +
                                        " process(es) to trim" + (answered ? " (all answered)" : " (timed out)"));
      }
      if (batch && answered) {
        // They trimmed what they had; ask again for what they freed since.
        posted = post_trim_request(bytes);
        if (!posted) {
          me().wanted_bytes.store(0, std::memory_order_relaxed);
          return std::move(posted).error();
        }
        helpers = std::move(*posted);
      }
    }
    me().wanted_bytes.store(0, std::memory_order_relaxed);
    return {};
  }

  // Posts a trim request for `bytes` when another process answers them;
  // returns those that do.
  Expected<std::vector<Helper>> post_trim_request(std::size_t bytes) {
    auto lock = segment->lock();
    if (!lock) return std::move(lock).error();
    std::vector<Helper> helpers = helpers_locked();
    if (!helpers.empty()) {
      me().wanted_bytes.store(bytes, std::memory_order_relaxed);
      me().trim_requests.fetch_add(1, std::memory_order_relaxed);
      segment->header->trim_generation.fetch_add(1, std::memory_order_release);
    }
    return helpers;
  }

  // Lock-free: only lowers the sum, which no check can be hurt by. Not in a
  // forked child (the entry is not its own) nor on a shrunk segment.
  void unreserve(std::size_t bytes) {
    if (!may_touch()) return;
    std::atomic<std::uint64_t>& reserved = me().reserved_bytes;
    std::uint64_t current = reserved.load(std::memory_order_relaxed);
    while (!reserved.compare_exchange_weak(current, current - std::min<std::uint64_t>(current, bytes),
                                           std::memory_order_relaxed)) {
    }
  }

  void refresh_cached_free_locked_hooks() {
    if (!may_touch()) return;
    if (hooks.cached_free_bytes) me().cached_free_bytes.store(hooks.cached_free_bytes(), std::memory_order_relaxed);
    me().asleep_bytes.store(hooks.asleep_bytes ? hooks.asleep_bytes() : 0, std::memory_order_relaxed);
  }

  void background() {
    std::unique_lock lock(thread_mutex);
    for (std::uint64_t tick = 1; !stopping; ++tick) {
      thread_wake.wait_for(lock, options.poll_period, [&] { return stopping; });
      if (stopping) break;
      lock.unlock();
      answer();
      if (tick % 10 == 0) {
        std::lock_guard hooks_lock(hooks_mutex);
        refresh_cached_free_locked_hooks();
      }
      lock.lock();
    }
  }

  bool requested() const noexcept {
    return seen_generation.load(std::memory_order_relaxed) != answered_generation.load(std::memory_order_relaxed);
  }

  std::size_t answer() {
    if (!may_touch()) return 0;
    seen_generation.store(segment->header->trim_generation.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
    if (!requested()) return 0;
    std::lock_guard hooks_lock(hooks_mutex);
    const std::uint64_t generation = segment->header->trim_generation.load(std::memory_order_acquire);
    if (generation == answered_generation.load(std::memory_order_relaxed)) return 0;
    answered_generation.store(generation, std::memory_order_relaxed);
    seen_generation.store(generation, std::memory_order_relaxed);
    if (!hooks.trim || me().quota_bytes.load(std::memory_order_relaxed) != 0) return 0;
    bool others_want = false;
    for (std::uint32_t i = 0; i < kEntryCount; ++i) {
      const Entry& entry = segment->entries[i];
      if (i != slot && entry.state.load(std::memory_order_relaxed) == kEntryActive &&
          entry.wanted_bytes.load(std::memory_order_relaxed) != 0)
        others_want = true;
    }
    if (!others_want) return 0;
    const std::size_t released = hooks.trim();
    me().bytes_trimmed.fetch_add(released, std::memory_order_relaxed);
    refresh_cached_free_locked_hooks();
    // Last: the requester reads this as "its trim is done, retry now".
    me().trims_answered.fetch_add(1, std::memory_order_release);
    return released;
  }
};

Expected<std::shared_ptr<LedgerDevice>> LedgerDevice::create(std::shared_ptr<Device> upstream,
                                                             LedgerOptions options) {
  if (!upstream) return Error(Errc::invalid_argument, "LedgerDevice::create: upstream device is null");
  const std::string device_id = upstream->id();
  LedgerSegmentOptions segment_options;
  segment_options.name =
      options.segment_name.empty() ? ledger_segment_name(device_id, options.mode) : options.segment_name;
  segment_options.device_id = device_id;
  segment_options.device_total_bytes = upstream->mem_info().total_bytes;
  segment_options.shared_limit_bytes = options.shared_limit_bytes;
  segment_options.mode = options.mode;
  segment_options.lock_timeout = options.lock_timeout;
  auto ledger = Ledger::open_or_create(segment_options);
  if (!ledger) return std::move(ledger).error();

  auto state = std::make_unique<State>();
  state->segment = &(*ledger)->segment();
  state->ledger = std::move(*ledger);
  state->options = options;
  Ledger::Segment& segment = *state->segment;
  const std::size_t limit = segment.limit_bytes();
  if (options.quota_bytes > limit) {
    return Error(Errc::invalid_argument, "ledger " + segment.name + ": quota " + format_bytes(options.quota_bytes) +
                                             " is above the shared limit of " + format_bytes(limit));
  }
  const share::ProcessIdentity& self = share::self_identity();
  {
    auto lock = segment.lock();
    if (!lock) return std::move(lock).error();
    segment.reclaim_dead_locked();
    if (options.quota_bytes != 0) {
      const std::size_t committed = segment.committed_locked(kEntryCount);
      if (committed + options.quota_bytes > limit) {
        OomReport report;
        report.requested_bytes = options.quota_bytes;
        report.device_free_bytes = committed < limit ? limit - committed : 0;
        report.largest_free_block_bytes = report.device_free_bytes;
        report.hint = "a quota is a guarantee and the live processes already commit " + format_bytes(committed) +
                      " of the " + format_bytes(limit) + " limit (" + segment.holders_locked(kEntryCount) +
                      "); lower TIDEPOOL_QUOTA or wait for one to exit";
        return Error::out_of_memory("ledger " + segment.name + ": registering the quota", std::move(report));
      }
    }
    std::uint32_t slot = kEntryCount;
    for (std::uint32_t i = 0; i < kEntryCount && slot == kEntryCount; ++i)
      if (segment.entries[i].state.load(std::memory_order_relaxed) == kEntryFree) slot = i;
    if (slot == kEntryCount) {
      return Error(Errc::limit_reached, "ledger " + segment.name + " is full: " + std::to_string(kEntryCount) +
                                            " live processes are registered on it");
    }
    segment.note_slot_used_locked(slot);
    Entry& entry = segment.entries[slot];
    entry.pid.store(self.pid, std::memory_order_relaxed);
    entry.start_time.store(self.start_time, std::memory_order_relaxed);
    entry.reserved_bytes.store(0, std::memory_order_relaxed);
    entry.quota_bytes.store(options.quota_bytes, std::memory_order_relaxed);
    entry.cached_free_bytes.store(share::kCachedFreeUnknown, std::memory_order_relaxed);
    entry.wanted_bytes.store(0, std::memory_order_relaxed);
    entry.trim_requests.store(0, std::memory_order_relaxed);
    entry.trims_answered.store(0, std::memory_order_relaxed);
    entry.bytes_trimmed.store(0, std::memory_order_relaxed);
    entry.asleep_bytes.store(0, std::memory_order_relaxed);
    entry.wake_waits.store(0, std::memory_order_relaxed);
    entry.answers_trim.store(0, std::memory_order_relaxed);
    std::memset(entry.command, 0, sizeof entry.command);
    std::memcpy(entry.command, self.command.data(), std::min(self.command.size(), sizeof entry.command - 1));
    entry.state.store(kEntryActive, std::memory_order_release);  // last: the entry is whole
    state->slot = slot;
    state->registered_pid = share::current_pid();
  }
  state->answered_generation.store(segment.header->trim_generation.load(std::memory_order_relaxed));
  state->seen_generation.store(state->answered_generation.load());
  return std::shared_ptr<LedgerDevice>(new LedgerDevice(std::move(upstream), std::move(state)));
}

LedgerDevice::LedgerDevice(std::shared_ptr<Device> upstream, std::unique_ptr<State> state)
    : DeviceAdaptor(std::move(upstream)), state_(std::move(state)) {}

LedgerDevice::~LedgerDevice() {
  if (state_->forked()) {
    // The thread is the parent's (a child has none) and so is the entry: leave both.
    if (state_->thread.joinable()) state_->thread.detach();
    return;
  }
  {
    std::lock_guard lock(state_->thread_mutex);
    state_->stopping = true;
  }
  state_->thread_wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  // One store frees the entry; under the lock when it can be had, so that no
  // scan sees it half-way, and without it rather than leak the entry.
  if (!state_->segment->check_intact()) return;
  auto lock = state_->segment->lock();
  state_->me().state.store(kEntryFree, std::memory_order_release);
}

std::string LedgerDevice::description() const {
  const std::size_t quota = quota_bytes();
  return upstream().description() + ", shared through ledger " + state_->segment->name + " (limit " +
         format_bytes(state_->segment->limit_bytes()) + ", quota " +
         (quota ? format_bytes(quota) : std::string("none")) + ")";
}

Expected<void*> LedgerDevice::allocate(std::size_t bytes) {
  if (bytes == 0) return upstream().allocate(bytes);  // the device's own error
  if (Status reserved = state_->reserve(bytes); !reserved) return std::move(reserved).error();
  Expected<void*> ptr = upstream().allocate(bytes);
  if (!ptr) state_->unreserve(bytes);
  return ptr;
}

Status LedgerDevice::free(void* ptr, std::size_t bytes) {
  Status freed = upstream().free(ptr, bytes);
  if (freed && ptr != nullptr) state_->unreserve(bytes);
  return freed;
}

MemInfo LedgerDevice::mem_info() const {
  const MemInfo device = upstream().mem_info();
  const std::size_t quota = quota_bytes();
  const std::size_t total = quota != 0 ? quota : std::min(state_->segment->limit_bytes(), device.total_bytes);
  return MemInfo{std::min(state_->room(), device.free_bytes), total};
}

Expected<PhysicalHandle> LedgerDevice::create(std::size_t bytes) {
  if (bytes == 0) return upstream().create(bytes);  // the device's own error
  if (Status reserved = state_->reserve(bytes); !reserved) return std::move(reserved).error();
  Expected<PhysicalHandle> handle = upstream().create(bytes);
  if (!handle) state_->unreserve(bytes);
  return handle;
}

Expected<std::vector<PhysicalHandle>> LedgerDevice::create_many(std::size_t bytes_each, std::size_t count) {
  if (bytes_each == 0 || count == 0) return DeviceAdaptor::create_many(bytes_each, count);  // the device's own error
  if (count > SIZE_MAX / bytes_each) {
    return Error(Errc::invalid_argument, state_->who() + ": create_many of " + std::to_string(count) + " x " +
                                             format_bytes(bytes_each) + " overflows");
  }
  const std::size_t total = bytes_each * count;
  if (Status reserved = state_->reserve(total, true); !reserved) return std::move(reserved).error();
  std::vector<PhysicalHandle> handles;
  handles.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    Expected<PhysicalHandle> handle = upstream().create(bytes_each);
    if (handle) {
      handles.push_back(*handle);
      continue;
    }
    for (PhysicalHandle made : handles) (void)upstream().release(made, bytes_each);
    state_->unreserve(total);
    return std::move(handle).error();
  }
  return handles;
}

void LedgerDevice::refresh_reports() {
  std::lock_guard lock(state_->hooks_mutex);
  state_->refresh_cached_free_locked_hooks();
}

Status LedgerDevice::release(PhysicalHandle handle, std::size_t bytes) {
  Status released = upstream().release(handle, bytes);
  if (released) state_->unreserve(bytes);
  return released;
}

void LedgerDevice::set_trim_hooks(TrimHooks hooks) {
  {
    std::lock_guard lock(state_->hooks_mutex);
    state_->hooks = std::move(hooks);
    if (state_->may_touch())
      state_->me().answers_trim.store(state_->hooks.trim && quota_bytes() == 0 ? 1 : 0, std::memory_order_relaxed);
    state_->refresh_cached_free_locked_hooks();
  }
  std::lock_guard lock(state_->thread_mutex);
  if (!state_->thread.joinable() && state_->options.poll_period.count() > 0)
    state_->thread = std::thread([state = state_.get()] { state->background(); });
}

void LedgerDevice::clear_trim_hooks() {
  std::lock_guard lock(state_->hooks_mutex);
  state_->hooks = TrimHooks{};
  if (!state_->may_touch()) return;
  state_->me().answers_trim.store(0, std::memory_order_relaxed);
  state_->me().cached_free_bytes.store(share::kCachedFreeUnknown, std::memory_order_relaxed);
  state_->me().asleep_bytes.store(0, std::memory_order_relaxed);
}

bool LedgerDevice::trim_requested() const noexcept { return state_->requested(); }

std::size_t LedgerDevice::answer_trim_requests() { return state_->answer(); }

std::size_t LedgerDevice::reserved_bytes() const {
  if (!state_->segment->check_intact()) return 0;
  return state_->me().reserved_bytes.load(std::memory_order_relaxed);
}

std::size_t LedgerDevice::quota_bytes() const { return state_->options.quota_bytes; }

Ledger& LedgerDevice::ledger() const { return *state_->ledger; }

}  // namespace tidepool
