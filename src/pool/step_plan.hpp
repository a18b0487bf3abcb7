// StepPlan: the expandable pool's placement for a program that repeats its
// steps (docs/expandable.md, "Step plans"). Internal to the pool.
//
// Best fit places each block knowing only the past, so a program that repeats
// a step may find its blocks where the last step left no memory mapped, and
// the pool steals or creates memory again (a few granules a step, for ever, or
// more near the limit). A planner that knows every lifetime places the step in
// about its peak (plan_lifetimes: 1.00-1.025x of peak live on every trace
// here). So the pool learns the step and then places by the plan:
//
// - learning: the large requests (size, stream) and when each block is freed
//   are logged; a rolling hash of the last kWindow requests finds an earlier
//   spot where the same requests were made, so a candidate period P. Once the
//   last P requests equal the P before, the older copy is the step: accepted
//   if it has at least kWindow requests, every block it allocated was freed
//   since, each as long after its request as its counterpart in the newer
//   copy lives (so far), on the one stream all its requests were made on, and
//   if the pool made device calls during the newer copy (a pool that repeats a
//   step without a call needs no plan). Periods inside a step (a model's
//   layers) are rejected by the freeing rule: what one layer saves for the
//   backward pass outlives the layer. The search runs as requests come only
//   shortly after a device call, and not past a teardown (a step ended);
//   otherwise requests and frees are only appended to a list of events, and
//   the next call logs and searches them (a pool that has gone quiet pays an
//   append a request, then nothing). A teardown also ends a copy: when the
//   pool still made calls just before it, the requests after it are
//   compared with those logged since the last teardown, one by one, and a
//   repeat that made a call is planned at its last request, as the search
//   would plan it, without logging or searching it.
// - armed: the step is planned (rotated to start where the fewest bytes are
//   live across the cut); requests keep being matched against it until the
//   step's start, where the pool maps one block of the plan's footprint, the
//   *slab*. The placement itself (plan_lifetimes, milliseconds for a step of
//   a few thousand requests) is made on a thread of its own meanwhile, and
//   waited for at the step's start if it is not done by then: the allocating
//   thread pays only the matching, and the pool places alike however fast
//   the thread is.
// - following: each request that matches the next one of the plan is served at
//   its offset in the slab; one that does not loses the plan's place (lost)
//   until the step's first request comes again. A block the plan leaves to the
//   arena (it outlives a step) is served there.
//
// Two live blocks never overlap, whatever the program does: a slot is handed
// out only while no block served from the slab is live past the end the plan
// gave it (then every live slab block's planned lifetime holds the present,
// and the plan placed those apart); while one is overdue, matching requests go
// to the arena. A free on another stream than the plan's is waited for before
// the slab serves again (pending_streams()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/lifetime_plan.hpp"
#include "tidepool/device.hpp"
#include "tidepool/error.hpp"

namespace tidepool::pool {

class StepPlan {
 public:
  StepPlan() = default;
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;
  /// A placement still being made is stopped (its thread ends at its next block).
  ~StepPlan();

  /// Requests hashed together to find an earlier spot that repeats.
  static constexpr std::uint32_t kWindow = 16;
  /// The most large requests a planned step may have (planning one takes
  /// milliseconds, off the allocating thread, once).
  static constexpr std::uint32_t kMaxPeriod = 1u << 14;
  /// Requests logged before the log starts again (two copies of the longest step).
  static constexpr std::uint32_t kLogCapacity = 2 * kMaxPeriod;
  /// Planning work bound (plan_lifetimes): well under a second.
  static constexpr std::uint64_t kMaxWork = std::uint64_t{1} << 26;
  /// Steps' worth of requests that miss the plan, with no whole step
  /// followed among them, before it is given up: the program has changed.
  static constexpr std::uint32_t kLostSteps = 4;

  enum class Phase { learning, armed, following, lost, retiring };
  Phase phase() const noexcept { return phase_; }
  /// The slab is in use (following, lost or retiring).
  bool has_slab() const noexcept { return phase_ == Phase::following || phase_ == Phase::lost || phase_ == Phase::retiring; }

  // --- learning -----------------------------------------------------------
  /// A large request served by the arena at `ptr`; `device_calls`: the pool's
  /// maps, unmaps, creates and releases so far. Ignored unless learning or armed.
  void record_alloc(const void* ptr, std::size_t bytes, Stream stream, std::int64_t device_calls) {
    if (device_calls == last_calls_) {
      if (quiet_for_ > kQuietLimit) return;  // a quiet pool's path: nothing logged, one comparison
      if (match_period_ != 0) {  // comparing with a copy: a load and a comparison
        if (copy_expects(bytes, stream) && match_at_ + 1 < match_period_ && quiet_for_ < kQuietLimit &&
            !copy_ended_) {
          ++match_at_;
          ++quiet_for_;
          return;
        }
      } else if (appending() && quiet_for_ < kQuietLimit && events_size_ < kMaxEvents) {  // between searches: a store
        ++quiet_for_;
        events_[events_size_++] = {ptr, bytes, stream, device_calls};
        ++appended_requests_;
        return;
      }
    }
    log_alloc(ptr, bytes, stream, device_calls);
  }
  /// A large arena block freed. Ignored unless learning or armed, and while
  /// requests are compared with a copy a teardown ended.
  void record_free(const void* ptr, Stream stream) {
    if ((logged_live_count_ == 0 && events_size_ == 0) || match_period_ != 0) return;
    if (appending() && events_size_ < kMaxEvents) {
      events_[events_size_++] = {ptr, 0, stream, 0};
      return;
    }
    log_free(ptr, stream);
  }
  /// The program tore down what it held (more large frees in a row, with no
  /// large request between them, than the pool holds back: HoldBack). A step
  /// ended, so the requests after it are the next copy's, and searching them
  /// as they come plans nothing sooner: they are appended until the next
  /// device call. And what was logged since the last teardown is a copy, to
  /// be repeated: the next request checks it (a copy ended by a teardown).
  void torn_down() noexcept {
    torn_down_ = true;
    copy_ended_ = true;
  }

  // --- armed ----------------------------------------------------------------
  /// Armed and this request is the step's first: the pool opens the slab
  /// (slab_bytes()) and calls opened(), or drop() when it cannot.
  bool wants_slab(std::size_t bytes, Stream stream) const noexcept {
    return phase_ == Phase::armed && position_ == 0 && matches(0, bytes, stream);
  }
  /// The plan's footprint, once its placement is made: waits for the
  /// placement's thread if it is not done yet; 0 when no placement was found
  /// (within kMaxWork), and then the pool drop()s the plan.
  std::uint64_t slab_bytes();
  /// The bytes of the step's blocks the arena serves (they outlive a step).
  std::uint64_t unplanned_bytes() const noexcept { return unplanned_; }
  /// The slab of slab_bytes() is open: following from the step's first request.
  void opened() noexcept;
  /// Gives the plan up (no slab, or it has none): learning again, after a pause.
  void drop() noexcept;

  // --- armed, following, lost ----------------------------------------------
  /// A large request: its offset in the slab, or nullopt for the arena (and
  /// the plan follows or loses its place). Call only with pending_streams()
  /// empty.
  std::optional<std::uint64_t> take(std::size_t bytes, Stream stream);
  /// A slab block at `offset` freed on `stream`: its bytes. Errors
  /// (nothing changed): no live slab block starts there.
  Expected<std::size_t> give_back(std::uint64_t offset, Stream stream, std::uintptr_t address);
  /// Streams a slab block was freed on other than the plan's: their work
  /// must be waited for before the slab serves again (then clear them).
  std::vector<Stream>& pending_streams() noexcept { return pending_; }
  /// Stops serving from the slab; the pool closes it once empty().
  void retire() noexcept {
    if (has_slab()) phase_ = Phase::retiring;
    else if (phase_ == Phase::armed) drop();
  }
  /// Retiring and no slab block is live: the pool frees the slab, then drop().
  bool empty() const noexcept { return live_count_ == 0; }
  bool retired() const noexcept { return phase_ == Phase::retiring; }

  /// One line for the pool's dump().
  std::string describe() const;
  /// Requests served from the slab so far; steps planned.
  std::uint64_t served() const noexcept { return served_; }
  std::uint32_t plans() const noexcept { return plans_; }

 private:
  struct Logged {
    std::uint64_t key;  // key_of(bytes, stream): what the window's hash adds and takes away
    std::size_t bytes;
    Stream stream;
    std::uint32_t freed_at;  // requests logged before its free; kLive until freed
    Stream freed_on;
    std::int64_t calls;      // the pool's device calls when it was made
  };
  static constexpr std::uint32_t kLive = ~std::uint32_t{0};
  struct Slot {
    std::size_t bytes;
    std::uint64_t offset;
    std::uint32_t lifetime;  // requests from its alloc to its free
    std::uint32_t group;     // its offset's index among the plan's distinct offsets
    bool planned;            // false: it outlives a step, the arena serves it
  };

  bool matches(std::uint32_t position, std::size_t bytes, Stream stream) const noexcept {
    return stream == stream_ && slots_[position].bytes == bytes;
  }
  void restart_log() noexcept;
  /// The log goes and learning pauses, twice as long each time (up to kMaxPause).
  void back_off() noexcept;
  /// Comparing with a copy: the request is the copy's next one.
  bool copy_expects(std::size_t bytes, Stream stream) const noexcept {
    const Logged& expected = log_[match_first_ + match_at_];
    return expected.bytes == bytes && expected.stream == stream;
  }
  bool same_request(std::uint32_t a, std::uint32_t b) const noexcept {
    return log_[a].bytes == log_[b].bytes && log_[a].stream == log_[b].stream;
  }
  static std::uint64_t key_of(std::size_t bytes, Stream stream) noexcept;
  void log_alloc(const void* ptr, std::size_t bytes, Stream stream, std::int64_t device_calls);
  void log_free(const void* ptr, Stream stream);
  /// Logs a request; false when the log was full (learning pauses, the log and the events gone).
  bool log_alloc_now(const void* ptr, std::size_t bytes, Stream stream, std::int64_t device_calls);
  /// Logs a free: its block's entry gets its end (nothing when the log never saw the block).
  void log_free_now(const void* ptr, Stream stream) noexcept;
  /// Logs the events not logged yet, in order (or backs off: the log is full).
  void fold();
  /// The search for a repeat over the requests logged and not scanned yet.
  void scan();
  /// The 2P logged requests before `end` are two copies: plan the older one
  /// if it is a step. False: it is not (the search goes on); true: planned
  /// (armed; the placement is being made).
  bool confirm(std::uint32_t period, std::uint32_t end);
  void plan_step(std::uint32_t first, std::uint32_t period);
  /// Where the step [first, first + period) is cut: the position with the
  /// fewest bytes live across it, the step taken as a circle.
  std::uint32_t cut_of(std::uint32_t first, std::uint32_t period) const;
  /// The placement of the step's blocks, made on a thread of its own (or
  /// here, where no thread can be started).
  struct Placing;
  class Placer;
  void start_placing(std::vector<Lifetime> lives, std::uint32_t period);
  /// Stops the placement being made, if any; its result is not wanted.
  void abandon_placing() noexcept;
  /// Takes the placement made: each planned slot's offset, the footprint.
  void install(const LifetimePlan& plan);
  /// An armed plan missed: learning goes on, its log kept.
  void disarm() noexcept;
  /// What describe() adds while learning: whether a teardown ended the search as requests come.
  std::string searching() const;
  /// The slab's time moves to the next request: slots due to end by now become overdue.
  void advance() noexcept;

  Phase phase_ = Phase::learning;
  // learning
  // Requests (bytes > 0) and frees (bytes 0) not logged yet: appending one
  // is all a request costs between the eager searches after device calls.
  struct Event {
    const void* ptr;
    std::size_t bytes;
    Stream stream;  // the request's, or the free's
    std::int64_t calls;
  };
  /// Events kept before they are logged anyway (the log is bounded the same).
  static constexpr std::size_t kMaxEvents = std::size_t{1} << 14;
  std::unique_ptr<Event[]> events_;  // kMaxEvents, made at the first request logged
  std::size_t events_size_ = 0;
  std::size_t appended_requests_ = 0;  // requests among the events
  /// Requests and frees are only appended now: learning, not paused, past
  /// the requests searched as they come after a device call.
  bool appending() const noexcept {
    return (phase_ == Phase::learning || phase_ == Phase::armed) && paused_for_ == 0 && events_ != nullptr &&
           !eager() && !copy_ended_ && match_period_ == 0;
  }
  /// Requests are logged and searched as they come: shortly after a device call, unless a teardown came since.
  bool eager() const noexcept { return quiet_for_ <= kEagerRequests && !torn_down_; }
  std::vector<Logged> log_;
  // Two flat tables, each at least twice what it holds (from 1,024 slots to
  // 2^16): logging a request costs a few probes in memory that stays in cache
  // for a short step, and no allocation.
  static constexpr unsigned kFirstTableBits = 10;
  static constexpr unsigned kMaxTableBits = 16;
  static_assert((std::size_t{1} << kMaxTableBits) >= 2 * kLogCapacity);
  struct LiveSlot {
    const void* ptr = nullptr;  // an arena block logged and not freed yet; null: empty
    std::uint32_t index = 0;    // its log index
  };
  std::vector<LiveSlot> logged_live_;  // open addressing, linear probing, by pointer
  std::uint32_t logged_live_count_ = 0;
  void live_insert(const void* ptr, std::uint32_t index);
  /// The log index of `ptr`, taken out of the table; kLive when it is not there.
  std::uint32_t live_take(const void* ptr) noexcept;
  struct Seen {
    std::uint64_t hash = 0;
    std::uint32_t first = kLive, latest = kLive;  // where the window first and last ended; kLive: empty
  };
  std::vector<Seen> seen_;  // open addressing by the window's hash, linear probing; never erased but all at once
  static constexpr std::uint64_t kAnchorMask = 3;  // a window whose hash has these bits clear is an anchor
  std::uint32_t anchors_ = 0;                      // windows in seen_
  unsigned seen_bits_ = 0;
  /// The window's entry, or the empty slot where it goes.
  Seen& seen_slot(std::uint64_t hash) noexcept {
    const std::size_t mask = seen_.size() - 1;
    std::size_t at = hash >> (64 - seen_bits_);
    while (seen_[at].first != kLive && seen_[at].hash != hash) at = (at + 1) & mask;
    return seen_[at];
  }
  /// Makes the tables (first use) or doubles them (reinserting what they hold).
  void grow_live();
  void grow_seen();
  std::uint64_t hash_ = 0;
  // Device calls: a step is worth planning only if its newer copy made one,
  // so a pool quiet for kQuietLimit requests logs nothing until its next
  // call: a warm pool pays one comparison a request. A step whose calls come
  // further apart than that is learnt only where two of its copies fit
  // between such gaps.
  static constexpr std::uint64_t kQuietLimit = 4096;
  /// Requests after a device call that are searched as they come; past that
  /// the log only grows until the next call.
  static constexpr std::uint64_t kEagerRequests = 64;
  std::uint32_t scanned_ = 0;   // log entries the search has seen
  // Planned in a catch-up at log index armed_at_: the entries logged then,
  // up to armed_until_, are matched to the plan as the scan reaches them.
  std::uint32_t armed_at_ = 0, armed_until_ = 0;
  std::int64_t last_calls_ = -1;
  std::uint64_t quiet_for_ = 0;
  bool torn_down_ = false;  // since the last device call (eager() is over)
  // A copy ended by a teardown: the requests logged since the last one
  // (from copy_start_), every block of them freed, on one stream, while the
  // pool still made device calls (within kEagerRequests of the teardown).
  // The requests after it are compared with it one by one (a load and a
  // comparison each) rather than logged and searched: a program that runs
  // the same thing again after freeing everything (a pass, a request served)
  // is planned at the end of the repeat, as the search would, without its
  // cost. The first request that differs ends the comparison, and the log
  // starts again at it when requests were matched before it (they were not
  // logged, so the log no longer says what came when).
  bool copy_ended_ = false;       // a teardown since the last request
  std::uint32_t copy_start_ = 0;  // the log index where the present copy began; kLive: not known
  std::uint32_t stream_changed_at_ = 0;  // the last log index whose stream is not its predecessor's
  std::uint32_t match_first_ = 0, match_period_ = 0;  // the copy compared with; 0: none
  std::uint32_t match_at_ = 0;    // requests matched in the newer copy
  bool match_wrapped_ = false;    // a whole copy matched (and made no call) since the comparison began
  /// The first request after a teardown: whether the log since copy_start_
  /// is a copy the requests are compared with from now on.
  void end_copy();
  /// A request while comparing: true when it matched (the newer copy goes
  /// on, or ends and is planned); false when it differs (the comparison is
  /// over, and the request is logged as any other).
  bool match(std::size_t bytes, Stream stream, std::int64_t device_calls);
  struct Candidate {
    std::uint32_t period;
    std::uint32_t run;  // requests in a row equal to the one a period before
  };
  /// Periods being checked: the nearest repeat of the window (a step, or a
  /// layer inside one) and the first (a step whose first copy differed).
  static constexpr std::uint32_t kCandidates = 4;
  std::array<Candidate, kCandidates> candidates_{};  // the first candidate_count_, in the order found
  std::uint32_t candidate_count_ = 0;
  bool has_candidate(std::uint32_t period) const noexcept {
    for (std::uint32_t i = 0; i < candidate_count_; ++i) {
      if (candidates_[i].period == period) return true;
    }
    return false;
  }
  std::uint64_t paused_for_ = 0;  // requests not logged before learning again
  std::uint64_t next_pause_ = kLogCapacity;
  // the plan
  Stream stream_ = 0;
  std::shared_ptr<Placing> placing_;            // armed, and the offsets not taken yet
  std::vector<std::uint32_t> planned_;          // the slot of each block given to the placement
  std::vector<Slot> slots_;                     // by position in the step
  std::vector<std::vector<std::uint32_t>> ends_at_;  // position -> slots whose lifetime ends there
  std::unordered_map<std::uint64_t, std::uint32_t> group_of_offset_;
  std::vector<std::uint32_t> live_in_group_;    // slot live at the offset, or kLive
  std::vector<std::uint64_t> handed_at_;        // per slot, when it was last served
  std::vector<char> live_, overdue_;
  std::uint64_t footprint_ = 0;
  std::uint64_t unplanned_ = 0;
  std::uint32_t position_ = 0;   // the next request's position in the step
  std::uint64_t now_ = 0;        // requests matched since the slab opened (time at position_)
  std::uint32_t live_count_ = 0, overdue_count_ = 0;
  std::uint64_t lost_requests_ = 0;
  std::vector<Stream> pending_;
  std::uint64_t served_ = 0;
  std::uint32_t plans_ = 0;
};

}  // namespace tidepool::pool
