// LedgerAccount: registering this process's entry, reserving in it (a
// request that does not fit posts a trim request and waits, bounded, for the
// other processes to give cached memory back), giving back, and clearing the
// entry at the end. Trim answers are trim_answerer.cpp's.
#include "tidepool/ledger_account.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "share/account_slot.hpp"
#include "share/process_identity.hpp"
#include "share/segment.hpp"
#include "share/trim_answerer.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/units.hpp"

namespace tidepool {

using share::Entry;
using share::kEntryActive;
using share::kEntryCount;
using share::kEntryFree;

namespace {

// Another live entry that answers trim requests, and the count of requests
// it had answered when ours was posted.
struct Helper {
  std::uint32_t slot;
  int pid;
  std::uint64_t answered;
};

// Writes a whole new entry for this process into `entry`, locked; the state
// last, so that no reader sees half of it.
void fill_entry_locked(Entry& entry, std::size_t quota_bytes) {
  const share::ProcessIdentity& self = share::self_identity();
  entry.pid.store(self.pid, std::memory_order_relaxed);
  entry.start_time.store(self.start_time, std::memory_order_relaxed);
  entry.reserved_bytes.store(0, std::memory_order_relaxed);
  entry.quota_bytes.store(quota_bytes, std::memory_order_relaxed);
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
  entry.state.store(kEntryActive, std::memory_order_release);
}

// out_of_memory when a quota of `quota_bytes` does not fit beside the live
// processes' commitments, locked.
Status check_quota_fits_locked(const Ledger::Segment& segment, std::size_t quota_bytes) {
  if (quota_bytes == 0) return {};
  const std::size_t limit = segment.limit_bytes();
  const std::size_t committed = segment.committed_locked(kEntryCount);
  if (committed + quota_bytes <= limit) return {};
  OomReport report;
  report.requested_bytes = quota_bytes;
  report.device_free_bytes = committed < limit ? limit - committed : 0;
  report.largest_free_block_bytes = report.device_free_bytes;
  report.hint = "a quota is a guarantee and the live processes already commit " + format_bytes(committed) +
                " of the " + format_bytes(limit) + " limit (" + segment.holders_locked(kEntryCount) + ")";
  report.advice = OomAdvice::lower_quota;
  return Error::out_of_memory("ledger " + segment.name + ": registering the quota", std::move(report));
}

// The free slot this process takes, locked; limit_reached when none is.
Expected<std::uint32_t> free_slot_locked(const Ledger::Segment& segment) {
  for (std::uint32_t i = 0; i < kEntryCount; ++i)
    if (segment.entries[i].state.load(std::memory_order_relaxed) == kEntryFree) return i;
  return Error(Errc::limit_reached, "ledger " + segment.name + " is full: " + std::to_string(kEntryCount) +
                                        " live processes are registered on it");
}

}  // namespace

struct LedgerAccount::State {
  std::unique_ptr<Ledger> ledger;
  LedgerOptions options;
  share::AccountSlot slot;
  std::unique_ptr<share::TrimAnswerer> answerer;  // made once the slot is registered

  Ledger::Segment& segment() const { return *slot.segment; }
  Entry& me() const { return slot.entry(); }

  std::size_t room() const {
    if (!segment().check_intact()) return 0;
    const std::size_t limit = segment().limit_bytes();
    const std::size_t reserved = me().reserved_bytes.load(std::memory_order_relaxed);
    const std::size_t quota = me().quota_bytes.load(std::memory_order_relaxed);
    const std::size_t others = segment().committed_locked(slot.index);
    std::size_t room = others + reserved < limit ? limit - others - reserved : 0;
    if (quota != 0) room = std::min(room, quota > reserved ? quota - reserved : 0);
    return room;
  }

  // --- reserving -----------------------------------------------------------

  // One locked try: reserve `bytes` if they fit (clearing dead entries first
  // when they do not). Returns what was missing.
  Expected<Ledger::Segment::Shortfall> try_reserve(std::size_t bytes) {
    if (Status ours = slot.check_not_forked(); !ours) return std::move(ours).error();
    auto lock = segment().lock_unchecked();  // reserve_locked checks the entries
    if (!lock) return std::move(lock).error();
    auto shortfall = segment().reserve_locked(slot.index, bytes);
    if (shortfall && shortfall->bytes != 0 && !shortfall->by_quota && segment().reclaim_dead_locked() > 0)
      shortfall = segment().reserve_locked(slot.index, bytes);
    return shortfall;
  }

  // Reserves `bytes`, asking the others to trim when they do not fit. A
  // `batch` (a wake) waits for wake_wait and counts in the entry.
  Status reserve(std::size_t bytes, bool batch) {
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
    Expected<std::vector<Helper>> helpers = post_trim_request(bytes);
    if (!helpers) return std::move(helpers).error();
    if (helpers->empty() && !batch) {
      return out_of_memory(bytes, format_bytes(first->bytes) + " short and no other process answers trim requests");
    }
    if (batch) {
      // A wake waits its whole bound: the others may free later, not only trim.
      me().wanted_bytes.store(bytes, std::memory_order_relaxed);
      me().wake_waits.fetch_add(1, std::memory_order_relaxed);
    }
    Status waited = wait_for_room(bytes, batch, std::move(*helpers));
    me().wanted_bytes.store(0, std::memory_order_relaxed);
    return waited;
  }

  // Retries the reservation while the helpers trim: until it fits, or (a
  // short request) all have answered and it still does not, or the bound
  // passes.
  Status wait_for_room(std::size_t bytes, bool batch, std::vector<Helper> helpers) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + (batch ? options.wake_wait : options.trim_wait);
    auto pause = std::chrono::microseconds(500);
    const auto longest_pause = std::chrono::duration_cast<std::chrono::microseconds>(
        std::max(options.poll_period, std::chrono::milliseconds(1)));
    for (;;) {
      const bool answered = all_answered(helpers);
      std::this_thread::sleep_for(answered && !batch ? std::chrono::microseconds(0) : pause);
      pause = std::min(pause * 2, longest_pause);
      auto attempt = try_reserve(bytes);
      if (!attempt) return std::move(attempt).error();
      if (attempt->bytes == 0) return {};
      if ((answered && !batch) || Clock::now() >= deadline) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        const std::string short_by = format_bytes(attempt->bytes) + " short after " +
                                     std::to_string(waited.count()) + " ms waiting for ";
        if (batch)
          return out_of_memory(bytes, short_by + "the other processes to free or trim (the wake_wait bound)");
        return out_of_memory(bytes, short_by + std::to_string(helpers.size()) + " process(es) to trim" +
                                        (answered ? " (all answered)" : " (timed out)"));
      }
      if (batch && answered) {
        // They trimmed what they had; ask again for what they freed since.
        auto posted = post_trim_request(bytes);
        if (!posted) return std::move(posted).error();
        helpers = std::move(*posted);
      }
    }
  }

  // Posts a trim request for `bytes` when another process answers them;
  // returns those that do.
  Expected<std::vector<Helper>> post_trim_request(std::size_t bytes) {
    auto lock = segment().lock();
    if (!lock) return std::move(lock).error();
    std::vector<Helper> helpers = helpers_locked();
    if (!helpers.empty()) {
      me().wanted_bytes.store(bytes, std::memory_order_relaxed);
      me().trim_requests.fetch_add(1, std::memory_order_relaxed);
      segment().header->trim_generation.fetch_add(1, std::memory_order_release);
    }
    return helpers;
  }

  std::vector<Helper> helpers_locked() const {
    std::vector<Helper> helpers;
    for (std::uint32_t i = 0; i < kEntryCount; ++i) {
      const Entry& entry = segment().entries[i];
      if (i == slot.index || entry.state.load(std::memory_order_relaxed) != kEntryActive) continue;
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
      const Entry& entry = segment().entries[helper.slot];
      const bool same_process = entry.state.load(std::memory_order_relaxed) == kEntryActive &&
                                entry.pid.load(std::memory_order_relaxed) == helper.pid;
      if (same_process && entry.trims_answered.load(std::memory_order_relaxed) == helper.answered) return false;
    }
    return true;
  }

  Error out_of_memory(std::size_t bytes, const std::string& why) const {
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_reserved = me().reserved_bytes.load(std::memory_order_relaxed);
    report.device_free_bytes = room();
    report.largest_free_block_bytes = report.device_free_bytes;
    std::string holders;
    if (auto lock = segment().lock()) holders = segment().holders_locked(slot.index);
    report.hint = why + "; limit " + format_bytes(segment().limit_bytes()) + ", held by: " + holders;
    return Error::out_of_memory(slot.who() + " (pid " + std::to_string(getpid()) + ")", std::move(report));
  }
};

Expected<std::shared_ptr<LedgerAccount>> LedgerAccount::open(std::string_view device_id,
                                                             std::size_t device_total_bytes, LedgerOptions options) {
  LedgerSegmentOptions segment_options;
  segment_options.device_id = std::string(device_id);
  segment_options.name =
      options.segment_name.empty() ? ledger_segment_name(device_id, options.mode) : options.segment_name;
  segment_options.device_total_bytes = device_total_bytes;
  segment_options.shared_limit_bytes = options.shared_limit_bytes;
  segment_options.mode = options.mode;
  segment_options.lock_timeout = options.lock_timeout;
  auto ledger = Ledger::open_or_create(segment_options);
  if (!ledger) return std::move(ledger).error();
  return create(std::move(*ledger), std::move(options));
}

Expected<std::shared_ptr<LedgerAccount>> LedgerAccount::create(std::unique_ptr<Ledger> ledger,
                                                               LedgerOptions options) {
  if (!ledger) return Error(Errc::invalid_argument, "LedgerAccount::create: no ledger");
  Ledger::Segment& segment = ledger->segment();
  if (options.quota_bytes > segment.limit_bytes()) {
    return Error(Errc::invalid_argument, "ledger " + segment.name + ": quota " + format_bytes(options.quota_bytes) +
                                             " is above the shared limit of " + format_bytes(segment.limit_bytes()));
  }
  auto state = std::make_unique<State>();
  {
    auto lock = segment.lock();
    if (!lock) return std::move(lock).error();
    segment.reclaim_dead_locked();
    if (Status fits = check_quota_fits_locked(segment, options.quota_bytes); !fits) return std::move(fits).error();
    Expected<std::uint32_t> slot = free_slot_locked(segment);
    if (!slot) return std::move(slot).error();
    segment.note_slot_used_locked(*slot);
    fill_entry_locked(segment.entries[*slot], options.quota_bytes);
    state->slot = share::AccountSlot{&segment, *slot, share::current_pid()};
  }
  state->ledger = std::move(ledger);
  state->options = std::move(options);
  state->answerer = std::make_unique<share::TrimAnswerer>(state->slot, state->options.poll_period);
  return std::shared_ptr<LedgerAccount>(new LedgerAccount(std::move(state)));
}

LedgerAccount::LedgerAccount(std::unique_ptr<State> state) : state_(std::move(state)) {}

LedgerAccount::~LedgerAccount() {
  if (state_->slot.forked()) {
    // The entry is the parent's, and so is the answerer's thread: a child
    // has no such thread, so it may neither join nor detach it (detaching a
    // thread of another process is undefined; TSan aborts on it). The
    // answerer is left behind: a leak in the child only.
    (void)state_->answerer.release();
    return;
  }
  state_->answerer.reset();  // no answer runs past here
  // One store frees the entry; under the lock when it can be had, so that no
  // scan sees it half-way, and without it rather than leak the entry.
  if (!state_->segment().check_intact()) return;
  auto lock = state_->segment().lock();
  state_->me().state.store(kEntryFree, std::memory_order_release);
}

Status LedgerAccount::reserve(std::size_t bytes) {
  if (bytes == 0) return {};
  return state_->reserve(bytes, /*batch=*/false);
}

Status LedgerAccount::reserve_many(std::size_t bytes_each, std::size_t count) {
  if (bytes_each == 0 || count == 0) return {};
  if (count > SIZE_MAX / bytes_each) {
    return Error(Errc::invalid_argument, state_->slot.who() + ": a reservation of " + std::to_string(count) +
                                             " x " + format_bytes(bytes_each) + " overflows");
  }
  return state_->reserve(bytes_each * count, /*batch=*/true);
}

void LedgerAccount::unreserve(std::size_t bytes) noexcept {
  // Not in a forked child (the entry is not its own) nor on a shrunk segment.
  if (!state_->slot.may_touch()) return;
  std::atomic<std::uint64_t>& reserved = state_->me().reserved_bytes;
  std::uint64_t current = reserved.load(std::memory_order_relaxed);
  while (!reserved.compare_exchange_weak(current, current - std::min<std::uint64_t>(current, bytes),
                                         std::memory_order_relaxed)) {
  }
}

std::size_t LedgerAccount::room() const { return state_->room(); }

MemInfo LedgerAccount::share_of(const MemInfo& device) const {
  const std::size_t quota = quota_bytes();
  const std::size_t total = quota != 0 ? quota : std::min(limit_bytes(), device.total_bytes);
  return MemInfo{std::min(room(), device.free_bytes), total};
}

void LedgerAccount::set_trim_hooks(TrimHooks hooks) { state_->answerer->set_hooks(std::move(hooks)); }
void LedgerAccount::clear_trim_hooks() { state_->answerer->clear_hooks(); }
void LedgerAccount::refresh_reports() { state_->answerer->refresh_reports(); }
bool LedgerAccount::trim_requested() const noexcept { return state_->answerer->requested(); }
std::size_t LedgerAccount::answer_trim_requests() { return state_->answerer->answer(); }

std::size_t LedgerAccount::reserved_bytes() const {
  if (!state_->segment().check_intact()) return 0;
  return state_->me().reserved_bytes.load(std::memory_order_relaxed);
}

std::size_t LedgerAccount::quota_bytes() const { return state_->options.quota_bytes; }

std::size_t LedgerAccount::limit_bytes() const { return state_->segment().limit_bytes(); }

std::string LedgerAccount::description() const {
  const std::size_t quota = quota_bytes();
  return "ledger " + state_->segment().name + " (limit " + format_bytes(limit_bytes()) + ", quota " +
         (quota ? format_bytes(quota) : std::string("none")) + ")";
}

Ledger& LedgerAccount::ledger() const { return *state_->ledger; }

}  // namespace tidepool
