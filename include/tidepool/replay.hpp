// The replay engine: runs one Trace against a fresh stack per mode
// (HostDevice -> CountingDevice -> the mode's pool, built by config's
// make_allocator) and measures what the workload costs under that mode:
// footprint, fragmentation, device calls, OOMs and host time. docs/replay.md
// explains every figure; the report layer prints them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/device.hpp"
#include "tidepool/error.hpp"
#include "tidepool/trace.hpp"

namespace tidepool::trace {

/// Default capacity of the replay device: an 80 GiB card (A100/H100 80GB).
inline constexpr std::size_t kDefaultReplayCapacity = std::size_t{80} << 30;

/// Called every 65,536 events with the events replayed so far and the
/// events the whole call will replay (every mode's replay at full capacity;
/// the probes of the capacity search are not counted).
using ProgressFn = std::function<void(std::uint64_t events_done, std::uint64_t events_total)>;

/// The granularity of the host devices replays run on (2 MiB): a capacity is
/// rounded up to a multiple of it.
std::size_t replay_granularity() noexcept;

struct ReplayOptions {
  /// Capacity of the HostDevice each mode replays on. 0 means the trace's
  /// recorded device capacity if it has one, else kDefaultReplayCapacity.
  /// Rounded up to replay_granularity().
  std::size_t capacity_bytes = 0;
  /// The settings given to make_allocator (memory fraction, release
  /// threshold, ...). Its mode is ignored: each replay names its own.
  Config config{};
  /// Also find, per mode, the smallest capacity with no OOM at the config's
  /// fraction, and the smallest limit (capacity at fraction 1) with none
  /// (bisection each).
  bool find_min_capacity = false;
  /// Write a pattern derived from the lifetime into each block when it is
  /// handed out and check it when it is freed: finds overlapping live blocks.
  /// Touches memory: needs real memory for the trace's peak live bytes.
  bool verify_contents = false;
  /// The most points of the downsampled (event or time, live, reserved) series.
  std::size_t max_series_points = 2000;
  /// Also plan the trace (plan_placement: TraceReplay::planned_footprint_bytes).
  /// A caller replaying one trace mode by mode plans it once.
  bool plan = true;
  /// Times the trace is replayed through the same pool (1 to kMaxPasses).
  /// Blocks still live at the end of a pass are freed before the next (not
  /// timed; their device calls count in the pass they end), so later passes
  /// show the pool warm: ModeReplay::passes has one entry each.
  std::uint32_t passes = 1;
  /// Optional progress callback (see ProgressFn); may be empty.
  ProgressFn progress;
  /// The device each replay runs on in place of the host device of the
  /// capacity (a GPU: bench/gpu_replay_bench), made fresh per replay; empty:
  /// the host device. The capacity is then the device's, whatever it is set to.
  std::function<Expected<std::shared_ptr<Device>>()> device;
  /// Called with every block handed out, before the next event: touches its
  /// memory where the host cannot (cudaMemsetAsync on a GPU). An error stops
  /// the replay. May be empty.
  std::function<Status(void* ptr, std::size_t bytes, Stream stream)> touch;
};

/// One point of a downsampled series: over a run of consecutive events, the
/// highest live and reserved bytes (so peaks are never lost).
struct SeriesPoint {
  std::int64_t x = 0;                 // event index, or time_us when the trace has times
  std::uint64_t live_bytes = 0;       // requested bytes live
  std::uint64_t reserved_bytes = 0;   // bytes held from the device
};

/// The most passes a replay makes (ReplayOptions::passes).
inline constexpr std::uint32_t kMaxPasses = 1000;

/// Device calls the pool made during the replay (CountingDevice), set-up
/// included (preallocate's one region is one alloc).
struct DeviceCalls {
  std::uint64_t allocs = 0;    // allocate()
  std::uint64_t frees = 0;     // free()
  std::uint64_t creates = 0;   // create(): physical memory for virtual-memory pools
  std::uint64_t releases = 0;  // release()
  std::uint64_t maps = 0;      // map()
  std::uint64_t unmaps = 0;    // unmap()
  std::uint64_t reserves = 0;  // reserve(): address space only
  /// synchronize(): a stream waited for before memory it freed serves
  /// another stream (on a GPU, the expensive part of a cross-stream reuse).
  std::uint64_t syncs = 0;
  /// query(): a stream asked, without waiting, whether its work is done;
  /// one found idle needs no sync.
  std::uint64_t queries = 0;
  /// Host time spent inside device calls, nanoseconds.
  std::uint64_t device_ns = 0;

  std::uint64_t total() const noexcept {
    return allocs + frees + creates + releases + maps + unmaps + reserves + syncs + queries;
  }
  /// Every field by its report name, total() included: what JSON, Python
  /// and the tables serialize.
  std::array<std::pair<std::string_view, std::uint64_t>, 11> items() const noexcept {
    return {{{"allocs", allocs}, {"frees", frees}, {"creates", creates}, {"releases", releases},
             {"maps", maps}, {"unmaps", unmaps}, {"reserves", reserves}, {"syncs", syncs},
             {"queries", queries}, {"total", total()}, {"device_ns", device_ns}}};
  }
  /// The calls made between two readings: later minus earlier.
  DeviceCalls since(const DeviceCalls& earlier) const noexcept;
};

/// One pass of a replay (ReplayOptions::passes).
struct PassReplay {
  DeviceCalls device_calls;            // made during this pass's events
  std::uint64_t events = 0;            // alloc and free events replayed
  std::uint64_t replay_ns = 0;         // host time of this pass's event loop
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t ooms = 0;

  double ns_per_op() const noexcept {
    return events == 0 ? 0.0 : static_cast<double>(replay_ns) / static_cast<double>(events);
  }
  /// The scalar figures by report name (device_calls aside): the one list
  /// JSON and Python serialize. visit(name, value).
  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("ns_per_op", ns_per_op());
    visit("peak_reserved_bytes", peak_reserved_bytes);
    visit("ooms", ooms);
  }
};

/// An allocation refused, by a replayed mode or in the recorded program: x as
/// in the series (time_us when timed, else the event index) and the request.
struct OomMark {
  std::int64_t x = 0;
  std::uint64_t bytes = 0;
};

/// The most OOM marks a mode keeps for the reports (every OOM still counts).
inline constexpr std::size_t kMaxOomMarks = 1000;
/// Traces of at most this many blocks get every lifetime in TraceReplay.
inline constexpr std::size_t kMaxLifetimes = 20000;

/// The first allocation a mode refused.
struct FirstOom {
  std::uint64_t event_index = 0;
  std::uint32_t block = 0;
  std::uint64_t requested_bytes = 0;
  std::string message;   // the pool's error message
  OomReport report;      // zero where the pool gave no report

  /// Every figure by report name: the one list JSON and Python serialize.
  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("event_index", event_index);
    visit("block", std::uint64_t{block});
    visit("requested_bytes", requested_bytes);
    visit("bytes_in_use", std::uint64_t{report.bytes_in_use});
    visit("bytes_reserved", std::uint64_t{report.bytes_reserved});
    visit("device_free_bytes", std::uint64_t{report.device_free_bytes});
    visit("largest_free_block_bytes", std::uint64_t{report.largest_free_block_bytes});
    visit("hint", std::string_view(report.hint));
    visit("message", std::string_view(message));
  }
};

/// What one mode did with one trace.
struct ModeReplay {
  Mode mode = Mode::growth;
  std::size_t capacity_bytes = 0;          // the replay device's capacity
  std::uint64_t events = 0;                // alloc and free events replayed
  /// The trace's peak of requested live bytes (TraceReplay::peak_live_bytes):
  /// the same for every mode, the base of every ratio.
  std::uint64_t peak_live_bytes = 0;
  /// Requested bytes this mode held at once, at most: below peak_live_bytes
  /// when OOMs refused blocks.
  std::uint64_t served_peak_live_bytes = 0;
  std::uint64_t peak_live_rounded_bytes = 0;  // the pool's peak_bytes_in_use (after rounding)
  std::uint64_t initial_reserved_bytes = 0;   // held after creating the pool, before event 0
  std::uint64_t peak_reserved_bytes = 0;   // bytes held from the device at once, at most
  std::uint64_t final_reserved_bytes = 0;  // held after the last event
  double average_reserved_bytes = 0;       // time-weighted (or event-weighted) mean
  /// peak_reserved / peak_live (requested); 0 when nothing was live.
  double fragmentation = 0;
  /// Single-region pools (preallocate): the highest end offset of a block
  /// from the region's start. Absent for other pools.
  std::optional<std::uint64_t> address_high_water_bytes;
  /// With ReplayOptions::find_min_capacity: the smallest device capacity (at
  /// granularity resolution) at which the trace replays with no OOM. Absent
  /// when not asked or when none up to 16 x capacity_bytes sufficed.
  std::optional<std::uint64_t> min_capacity_bytes;
  std::uint32_t min_capacity_probes = 0;   // replays the search made
  /// With find_min_capacity: the smallest pool limit (the bytes the mode may
  /// take from the device, whatever the fraction: the capacity search at
  /// fraction 1) with no OOM. What the pool needs, not the fraction.
  std::optional<std::uint64_t> min_limit_bytes;
  std::uint32_t min_limit_probes = 0;
  DeviceCalls device_calls;
  /// Each pass's own figures, in order; the fields above cover all of them.
  std::vector<PassReplay> passes;
  std::uint64_t ooms = 0;                  // allocations refused (their frees skipped)
  std::optional<FirstOom> first_oom;
  std::vector<OomMark> oom_marks;          // the first kMaxOomMarks refusals
  std::uint64_t replay_ns = 0;             // host time of the event loop (set-up excluded)
  Stats stats;                             // the pool's stats after the last event
  std::vector<SeriesPoint> series;

  /// Host nanoseconds per replayed event; 0 for an empty trace.
  double ns_per_op() const noexcept {
    return events == 0 ? 0.0 : static_cast<double>(replay_ns) / static_cast<double>(events);
  }
  /// Replayed events per second; 0 when not measurable.
  double events_per_second() const noexcept {
    return replay_ns == 0 ? 0.0 : static_cast<double>(events) * 1e9 / static_cast<double>(replay_ns);
  }
  /// min_capacity_bytes / peak_live_bytes; 0 when either is missing.
  double min_capacity_ratio() const noexcept {
    if (!min_capacity_bytes || peak_live_bytes == 0) return 0.0;
    return static_cast<double>(*min_capacity_bytes) / static_cast<double>(peak_live_bytes);
  }
  /// min_limit_bytes / peak_live_bytes; 0 when either is missing.
  double min_limit_ratio() const noexcept {
    if (!min_limit_bytes || peak_live_bytes == 0) return 0.0;
    return static_cast<double>(*min_limit_bytes) / static_cast<double>(peak_live_bytes);
  }

  /// Every scalar figure by report name, in order: the one list JSON and
  /// Python serialize (each adds the nested ones: device_calls, passes,
  /// first_oom, oom_marks, stats, series). visit(name, value), the value a
  /// std::string_view, a number, or a std::optional of one (absent: null).
  template <class Visit>
  void for_each_figure(Visit&& visit) const {
    visit("mode", mode_name(mode));
    visit("capacity_bytes", std::uint64_t{capacity_bytes});
    visit("events", events);
    visit("peak_live_bytes", peak_live_bytes);
    visit("served_peak_live_bytes", served_peak_live_bytes);
    visit("peak_live_rounded_bytes", peak_live_rounded_bytes);
    visit("initial_reserved_bytes", initial_reserved_bytes);
    visit("peak_reserved_bytes", peak_reserved_bytes);
    visit("final_reserved_bytes", final_reserved_bytes);
    visit("average_reserved_bytes", average_reserved_bytes);
    visit("fragmentation", fragmentation);
    visit("address_high_water_bytes", address_high_water_bytes);
    visit("min_capacity_bytes", min_capacity_bytes);
    visit("min_capacity_ratio", min_capacity_bytes ? std::optional<double>(min_capacity_ratio()) : std::nullopt);
    visit("min_capacity_probes", std::uint64_t{min_capacity_probes});
    visit("min_limit_bytes", min_limit_bytes);
    visit("min_limit_ratio", min_limit_bytes ? std::optional<double>(min_limit_ratio()) : std::nullopt);
    visit("min_limit_probes", std::uint64_t{min_limit_probes});
    visit("ooms", ooms);
    visit("replay_ns", replay_ns);
    visit("ns_per_op", ns_per_op());
    visit("events_per_second", events_per_second());
  }
};

/// What the recorded allocator (PyTorch) reserved, from the trace's segment
/// events. A ring-buffer trace can begin with segments already held: the
/// bytes freed before being allocated in the record are taken as held from
/// the start (initial_reserved_bytes).
struct RecordedReplay {
  std::string label = "PyTorch (recorded)";
  std::uint64_t initial_reserved_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  double average_reserved_bytes = 0;
  double fragmentation = 0;   // peak_reserved / the trace's peak live
  std::vector<SeriesPoint> series;
};

/// Every mode's replay of one trace.
struct TraceReplay {
  std::string trace_name;
  std::string trace_format;
  std::uint64_t events = 0;           // every event of the trace, segment events included
  std::uint32_t blocks = 0;           // lifetimes
  std::size_t unmatched_frees = 0;    // from the reader: frees with no recorded alloc (seeded)
  std::uint32_t seeded_blocks = 0;    // blocks live at the start (Trace::seeded_blocks)
  std::uint64_t seeded_bytes = 0;
  /// The trace's peak of requested live bytes, seeded blocks included
  /// (summarize()): what every mode must serve at once.
  std::uint64_t peak_live_bytes = 0;
  std::size_t failed_allocs = 0;      // from the reader: allocations the recorded program saw fail
  /// Those the reader placed, with x on the series' axis (time_us when
  /// timed, else the index of the event they preceded).
  std::vector<OomMark> failures;
  std::vector<std::pair<std::string, std::string>> recorder_settings;  // Trace::recorder_settings
  /// A block live when the trace's live bytes peak.
  struct PeakBlock {
    std::uint32_t block = 0;
    std::uint64_t bytes = 0;
    std::int64_t alloc_x = 0;   // when it was allocated (x as in the series)
    bool seeded = false;        // live before recording began
    std::string stack;          // where it was allocated, one frame a line; empty if unknown
  };
  /// The largest blocks live at the peak (the first time it is reached),
  /// largest first, at most 10: what the peak is made of.
  std::vector<PeakBlock> largest_at_peak;
  std::int64_t peak_x = 0;      // where the peak is first reached
  /// One block's lifetime; end_x -1 when it is still live at the end.
  struct Lifetime {
    std::uint32_t block = 0;
    std::uint64_t bytes = 0;
    std::int64_t start_x = 0;
    std::int64_t end_x = -1;
  };
  /// Every block's lifetime, for traces of at most kMaxLifetimes blocks
  /// (empty above): the Perfetto report draws one slice each.
  std::vector<Lifetime> lifetimes;
  /// The address footprint of plan_placement(): about the least memory that
  /// serves the trace with no block moved; nullopt when it gave up (PlanLimits).
  std::optional<std::uint64_t> planned_footprint_bytes;
  bool timed = false;                 // series x and averages use time_us (else event index)
  double mem_fraction = 0;            // the Config's fraction the pools were built with
  std::vector<ModeReplay> modes;
  std::optional<RecordedReplay> recorded;  // when the trace has segment events
};

/// Replays `trace` under one mode on a fresh stack. Errors: corrupt_data when
/// the trace is inconsistent (a free of a lifetime that is not live, a block
/// number >= num_blocks), or when verify_contents finds a block overwritten;
/// unsupported when the mode cannot be built here (cuda_async on the host);
/// out_of_memory only when the pool cannot even be created (preallocation
/// larger than the device). OOMs during the replay are counted, not errors.
Expected<ModeReplay> replay_mode(const Trace& trace, Mode mode, const ReplayOptions& options);

/// The smallest capacity (a multiple of the host device's granularity) at
/// which `trace` replays under `mode` with no OOM, by bisection between the
/// trace's peak live bytes and `upper_bytes` (doubled up to 16 times while it
/// still fails). Assumes that a replay that succeeds at some capacity also
/// succeeds at any larger one. Returns nullopt when none was found.
struct MinCapacity {
  std::optional<std::uint64_t> bytes;
  std::uint32_t probes = 0;
};
Expected<MinCapacity> find_min_capacity(const Trace& trace, Mode mode, std::size_t upper_bytes,
                                        const ReplayOptions& options);

/// Addresses that `plan_placement` aligns blocks to (and rounds their sizes
/// up to), as the pools do.
inline constexpr std::uint64_t kPlanAlignment = 256;
/// What `plan_placement` may take, so that it is bounded on any trace.
struct PlanLimits {
  /// Address ranges visited or moved (a few to tens of nanoseconds each):
  /// seconds at worst. The built-in workloads take up to 2^28.4
  /// (small-tensors, 2 s here).
  std::uint64_t max_work = std::uint64_t{1} << 29;
  /// Blocks: planning holds two sets of ranges per node of a tree with two
  /// nodes per block, 100 to 600 bytes a block (random-mixed: 270 MB for
  /// 500,055 blocks), so at most about 600 MB at this bound.
  std::uint32_t max_blocks = std::uint32_t{1} << 20;
};

/// Where a placement that knows every lifetime ahead puts each block.
struct PlannedPlacement {
  std::vector<std::uint64_t> offsets;  // per block, from the plan's base
  std::vector<std::uint64_t> bytes;    // per block, rounded up to kPlanAlignment
  std::vector<std::uint32_t> ends;     // per block: the allocations made before its free (num_blocks: never freed)
  std::uint64_t footprint_bytes = 0;   // the highest offset + bytes: the address span the plan needs
};

/// Plans `trace` offline, greedy by size (largest first, each at the lowest
/// address free over its whole lifetime): the address footprint a planner
/// reaches, and so about the least memory that serves the trace with no block
/// ever moved (docs/replay.md, the heading's "planned"). Streams are not
/// modelled. nullopt when the trace has more blocks than `limits` allow, when
/// planning would take more work (bounded time and memory on any trace), or
/// when the sizes, rounded up, add up past 64 bits. Precondition:
/// summarize(trace) succeeds.
std::optional<PlannedPlacement> plan_placement(const Trace& trace, const PlanLimits& limits = {});

/// Replays `trace` under each of `modes` and, where it has segment events,
/// adds the recorded row.
Expected<TraceReplay> replay(const Trace& trace, std::span<const Mode> modes,
                             const ReplayOptions& options);

/// The recorded allocator's reserved bytes, from the segment events; nullopt
/// when the trace has none.
std::optional<RecordedReplay> recorded_reserved(const Trace& trace, std::size_t max_series_points);

/// The modes a replay uses when none are named: every mode this build can
/// run on the host device (cuda_async only with CUDA).
std::vector<Mode> default_replay_modes();

}  // namespace tidepool::trace
