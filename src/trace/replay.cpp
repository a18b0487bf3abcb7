// The replay engine. One tight loop per mode: live pointers in a vector
// indexed by lifetime, peaks and the time-weighted sum kept in locals, the
// series sampled by counting events into fixed-size buckets. The only
// virtual calls per event are the Allocator's own.
#include "tidepool/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "tidepool/device_adaptors.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"

namespace tidepool::trace {
namespace {

/// Sits between the pool and the CountingDevice and notes two things the
/// counters do not: the first region a pool takes with allocate() (so a
/// replay can say how far into a single-region pool blocks reached), and a
/// count of the calls that change what is held, which the event loop
/// compares to know when to read the counters again.
class CallProbe final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  Expected<void*> allocate(std::size_t bytes) override {
    ++holding_calls_;
    auto result = DeviceAdaptor::allocate(bytes);
    if (result && first_region_ == nullptr) first_region_ = *result;
    return result;
  }
  Status free(void* ptr, std::size_t bytes) override {
    ++holding_calls_;
    return DeviceAdaptor::free(ptr, bytes);
  }
  Expected<PhysicalHandle> create(std::size_t bytes) override {
    ++holding_calls_;
    return DeviceAdaptor::create(bytes);
  }
  Status release(PhysicalHandle handle, std::size_t bytes) override {
    ++holding_calls_;
    return DeviceAdaptor::release(handle, bytes);
  }
  std::uintptr_t first_region() const noexcept {
    return reinterpret_cast<std::uintptr_t>(first_region_);
  }
  /// allocate, free, create and release calls so far.
  std::uint64_t holding_calls() const noexcept { return holding_calls_; }

 private:
  void* first_region_ = nullptr;
  std::uint64_t holding_calls_ = 0;
};

/// HostDevice -> CountingDevice -> CallProbe -> the mode's pool.
struct Stack {
  std::shared_ptr<CountingDevice> counting;
  std::shared_ptr<CallProbe> probe;
  std::unique_ptr<Allocator> pool;
};

/// The configuration of a replay's device: a host device of `capacity_bytes`,
/// outside the cross-process ledger (a replay must not take part in it).
Config host_config(Mode mode, std::size_t capacity_bytes, const Config& base) {
  Config config = base;
  config.mode.value = mode;
  config.device.value = DeviceKind::host;
  config.host_capacity.value = capacity_bytes;
  config.ledger.value = false;
  return config;
}

Expected<Stack> make_stack(Mode mode, std::size_t capacity_bytes, const ReplayOptions& options) {
  const Config config = host_config(mode, capacity_bytes, options.config);
  auto device = options.device ? options.device() : make_device(config);
  if (!device) return std::move(device).error();
  Stack stack;
  stack.counting = std::make_shared<CountingDevice>(std::move(*device));
  stack.probe = std::make_shared<CallProbe>(stack.counting);
  auto pool = make_allocator(mode, config, stack.probe);
  if (!pool) return std::move(pool).error();
  stack.pool = std::move(*pool);
  return stack;
}

/// The capacity asked for, else the trace's, else the default; rounded up to
/// the granularity (a host device's capacity is a multiple of it).
std::size_t resolve_capacity(const Trace& trace, const ReplayOptions& options) {
  std::size_t capacity = kDefaultReplayCapacity;
  if (options.capacity_bytes != 0) {
    capacity = options.capacity_bytes;
  } else if (trace.device_capacity != 0) {
    capacity = trace.device_capacity;
  }
  return round_up(capacity, replay_granularity());
}

/// Whether every event has a time, so the series and averages can use it.
bool trace_is_timed(const Trace& trace) {
  if (trace.events.empty()) return false;
  return std::all_of(trace.events.begin(), trace.events.end(),
                     [](const Event& event) { return event.time_us >= 0; });
}

/// Keeps the running maxima of consecutive events and emits one point per
/// `bucket` events, so a series has at most about max_points points and no
/// peak is lost.
class SeriesSampler {
 public:
  SeriesSampler(std::vector<SeriesPoint>& out, std::uint64_t events, std::size_t max_points)
      : out_(out) {
    const std::uint64_t points = std::max<std::uint64_t>(max_points, 2) - 1;  // one for the start
    bucket_ = std::max<std::uint64_t>(1, (events + points - 1) / points);
    left_ = bucket_;
    out_.reserve(static_cast<std::size_t>(events / bucket_ + 2));
  }
  void start(std::int64_t x, std::uint64_t live, std::uint64_t reserved) {
    out_.push_back({x, live, reserved});
  }
  void add(std::int64_t x, std::uint64_t live, std::uint64_t reserved) {
    max_live_ = std::max(max_live_, live);
    max_reserved_ = std::max(max_reserved_, reserved);
    last_x_ = x;
    if (--left_ == 0) flush();
  }
  void finish() {
    if (left_ != bucket_) flush();
  }

 private:
  void flush() {
    out_.push_back({last_x_, max_live_, max_reserved_});
    max_live_ = 0;
    max_reserved_ = 0;
    left_ = bucket_;
  }
  std::vector<SeriesPoint>& out_;
  std::uint64_t bucket_ = 1;
  std::uint64_t left_ = 1;
  std::uint64_t max_live_ = 0;
  std::uint64_t max_reserved_ = 0;
  std::int64_t last_x_ = 0;
};

/// Time-weighted mean of a step function: the value after event i holds
/// until event i + 1. Event-weighted (every event counts 1) when untimed.
class StepAverage {
 public:
  explicit StepAverage(bool timed) : timed_(timed) {}
  void add(std::int64_t x, std::uint64_t value) {
    if (timed_) {
      if (have_previous_ && x > previous_x_) {
        weighted_sum_ += static_cast<long double>(previous_value_) *
                         static_cast<long double>(x - previous_x_);
        span_ += x - previous_x_;
      }
      have_previous_ = true;
      previous_x_ = x;
      previous_value_ = value;
    }
    plain_sum_ += static_cast<long double>(value);
    ++count_;
  }
  double mean() const {
    if (timed_ && span_ > 0) return static_cast<double>(weighted_sum_ / static_cast<long double>(span_));
    if (count_ == 0) return 0.0;
    return static_cast<double>(plain_sum_ / static_cast<long double>(count_));
  }

 private:
  bool timed_;
  bool have_previous_ = false;
  std::int64_t previous_x_ = 0;
  std::uint64_t previous_value_ = 0;
  long double weighted_sum_ = 0;
  std::int64_t span_ = 0;
  long double plain_sum_ = 0;
  std::uint64_t count_ = 0;
};

/// The 64-bit word a verified block is filled with (splitmix64 of its lifetime).
std::uint64_t block_pattern(std::uint32_t block) noexcept {
  std::uint64_t z = static_cast<std::uint64_t>(block) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_pattern(void* ptr, std::size_t bytes, std::uint32_t block) noexcept {
  const std::uint64_t word = block_pattern(block);
  auto* out = static_cast<unsigned char*>(ptr);
  for (std::size_t offset = 0; offset < bytes; offset += sizeof word) {
    std::memcpy(out + offset, &word, std::min(sizeof word, bytes - offset));
  }
}

/// The offset of the first byte that differs from the block's pattern, or bytes.
std::size_t check_pattern(const void* ptr, std::size_t bytes, std::uint32_t block) noexcept {
  const std::uint64_t word = block_pattern(block);
  const auto* in = static_cast<const unsigned char*>(ptr);
  for (std::size_t offset = 0; offset < bytes; offset += sizeof word) {
    const std::size_t n = std::min(sizeof word, bytes - offset);
    if (std::memcmp(in + offset, &word, n) != 0) {
      for (std::size_t i = 0; i < n; ++i) {
        if (in[offset + i] != reinterpret_cast<const unsigned char*>(&word)[i]) return offset + i;
      }
    }
  }
  return bytes;
}

struct RunFlags {
  bool stop_at_first_oom = false;  // the capacity search only needs to know whether one happens
  bool collect_series = true;
  std::uint64_t progress_base = 0;  // events replayed by earlier runs of this replay() call
  std::uint64_t progress_total = 0;
};

constexpr std::uint64_t kProgressEvery = std::uint64_t{1} << 16;

DeviceCalls calls_of(const DeviceCounters& counts) {
  DeviceCalls calls;
  calls.allocs = counts.allocate.calls;
  calls.frees = counts.free.calls;
  calls.creates = counts.create.calls;
  calls.releases = counts.release.calls;
  calls.maps = counts.map.calls;
  calls.unmaps = counts.unmap.calls;
  calls.reserves = counts.reserve.calls;
  calls.syncs = counts.synchronize.calls;
  calls.queries = counts.query.calls;
  calls.device_ns = counts.total_nanoseconds();
  return calls;
}

/// One replay of `trace` under `mode` on a device of `capacity_bytes`:
/// options.passes passes through the same pool. Precondition: summarize(trace)
/// succeeded (the trace's rules live there, checked once: every block number
/// below num_blocks, each block allocated once, and freed only while live).
Expected<ModeReplay> run(const Trace& trace, Mode mode, std::size_t capacity_bytes,
                         const ReplayOptions& options, const RunFlags& flags) {
  if (options.passes == 0 || options.passes > kMaxPasses) {
    return Error(Errc::invalid_argument, "replay passes " + std::to_string(options.passes) +
                                             " is out of range; allowed: 1 to " + std::to_string(kMaxPasses));
  }
  auto made = make_stack(mode, capacity_bytes, options);
  if (!made) return std::move(made).error();
  Stack& stack = *made;
  Allocator& pool = *stack.pool;
  const CountingDevice& counting = *stack.counting;
  const CallProbe& probe = *stack.probe;

  ModeReplay result;
  result.mode = mode;
  result.capacity_bytes = capacity_bytes;

  const std::vector<Event>& events = trace.events;
  const bool timed = trace_is_timed(trace);
  std::vector<void*> pointers(trace.num_blocks, nullptr);
  std::vector<Stream> streams(trace.num_blocks, kDefaultStream);  // each live block's alloc stream
  // Per lifetime: where it is. A refused one's free is skipped.
  enum BlockState : std::uint8_t { kNotStarted, kLive, kFreed, kRefused };
  std::vector<std::uint8_t> state(trace.num_blocks, kNotStarted);

  SeriesSampler sampler(result.series, flags.collect_series ? events.size() * options.passes : 0,
                        options.max_series_points);
  StepAverage average(timed);
  const std::int64_t first_x = events.empty() ? 0 : (timed ? events.front().time_us : 0);
  // Pass p's x values follow pass p - 1's: the series reads as one run.
  const std::int64_t pass_span =
      events.empty() ? 0 : (timed ? events.back().time_us - first_x + 1 : static_cast<std::int64_t>(events.size()));
  // What the pool holds: the device's count, except under cuda_async, whose
  // memory the driver's pool takes past the Device (cudaMallocAsync); its
  // stats read the driver's pool. Reading them after every event is not
  // counted in the replay's time.
  const bool held_past_device = mode == Mode::cuda_async;
  auto held = [&]() -> std::uint64_t {
    return held_past_device ? static_cast<std::uint64_t>(pool.stats().bytes_reserved) : counting.counters().bytes_held;
  };
  const std::uint64_t initial_reserved = held();
  result.initial_reserved_bytes = initial_reserved;
  if (flags.collect_series) sampler.start(first_x, 0, initial_reserved);

  std::uint64_t live = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_reserved = initial_reserved;
  std::uint64_t reserved = initial_reserved;
  std::uint64_t seen_calls = probe.holding_calls();
  std::uintptr_t highest_end = 0;
  std::uint64_t done = 0;  // events of earlier passes, for progress

  for (std::uint32_t pass_index = 0; pass_index < options.passes; ++pass_index) {
    PassReplay pass;
    pass.peak_reserved_bytes = reserved;
    const DeviceCalls calls_before = calls_of(counting.counters());
    const std::int64_t x_offset = pass_span * pass_index;
    std::fill(state.begin(), state.end(), kNotStarted);

    std::chrono::steady_clock::duration reading{};  // held() past the device: not replay time
    const auto started = std::chrono::steady_clock::now();
    for (std::size_t index = 0; index < events.size(); ++index) {
      const Event& event = events[index];
      if (event.op == Op::alloc || event.op == Op::free) ++pass.events;
      switch (event.op) {
        case Op::alloc: {
          auto allocated = pool.allocate(static_cast<std::size_t>(event.bytes), event.stream);
          if (!allocated) {
            if (allocated.error().code() != Errc::out_of_memory) return std::move(allocated).error();
            ++pass.ooms;
            state[event.block] = kRefused;
            if (result.oom_marks.size() < kMaxOomMarks) {
              result.oom_marks.push_back(
                  {x_offset + (timed ? event.time_us : static_cast<std::int64_t>(index)), event.bytes});
            }
            if (!result.first_oom) {
              FirstOom oom;
              oom.event_index = index;
              oom.block = event.block;
              oom.requested_bytes = event.bytes;
              // In the configuration's names (its variables for the CLI, its keys for Python).
              const OomWords words = options.config.oom_words();
              oom.message = allocated.error().worded(words).message();
              if (const OomReport* report = allocated.error().oom()) {
                oom.report = *report;
                oom.report.hint = report->worded_hint(words);
              }
              result.first_oom = std::move(oom);
            }
            if (flags.stop_at_first_oom) {
              result.ooms = pass.ooms;
              return result;
            }
            break;
          }
          void* ptr = *allocated;
          pointers[event.block] = ptr;
          streams[event.block] = event.stream;
          state[event.block] = kLive;
          live += event.bytes;
          const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(ptr) + event.bytes;
          if (ptr != nullptr && end > highest_end) highest_end = end;
          if (options.verify_contents && ptr != nullptr) {
            fill_pattern(ptr, static_cast<std::size_t>(event.bytes), event.block);
          }
          if (options.touch && ptr != nullptr) {
            if (Status touched = options.touch(ptr, static_cast<std::size_t>(event.bytes), event.stream); !touched)
              return std::move(touched).error();
          }
          break;
        }
        case Op::free: {
          if (state[event.block] == kRefused) break;  // an OOM refused it: nothing to free
          void* ptr = pointers[event.block];
          if (options.verify_contents && ptr != nullptr) {
            const std::size_t bad = check_pattern(ptr, static_cast<std::size_t>(event.bytes), event.block);
            if (bad != event.bytes) {
              return Error(Errc::corrupt_data,
                           std::string("replay of '") + trace.name + "' under " +
                               std::string(mode_name(mode)) + ": block " + std::to_string(event.block) +
                               " was overwritten at byte " + std::to_string(bad) +
                               " before its free (event " + std::to_string(index) +
                               "): two live blocks overlap");
            }
          }
          Status freed = pool.deallocate(ptr, event.stream);
          if (!freed) return std::move(freed).error();
          pointers[event.block] = nullptr;
          state[event.block] = kFreed;
          live -= event.bytes;
          break;
        }
        case Op::segment_alloc:
        case Op::segment_free:
          break;  // the recorded allocator's own reservations: see recorded_reserved()
      }
      if (held_past_device) {
        const auto before = std::chrono::steady_clock::now();
        reserved = held();
        reading += std::chrono::steady_clock::now() - before;
      } else if (probe.holding_calls() != seen_calls) {  // what is held changes only through the device
        seen_calls = probe.holding_calls();
        reserved = counting.counters().bytes_held;
      }
      peak_live = std::max(peak_live, live);
      pass.peak_reserved_bytes = std::max(pass.peak_reserved_bytes, reserved);
      const std::int64_t x = x_offset + (timed ? event.time_us : static_cast<std::int64_t>(index));
      average.add(x, reserved);
      if (flags.collect_series) sampler.add(x, live, reserved);
      if (options.progress && (done + index + 1) % kProgressEvery == 0) {
        options.progress(flags.progress_base + done + index + 1, flags.progress_total);
      }
    }
    const auto finished = std::chrono::steady_clock::now();
    pass.replay_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(finished - started - reading).count());
    const bool last_pass = pass_index + 1 == options.passes;
    if (!last_pass) {
      // The next pass starts from an empty program: what is still live goes
      // back to the pool, untimed; its device calls (a pool that releases
      // on free) are this pass's, so that every call is in some pass.
      for (std::uint32_t block = 0; block < trace.num_blocks; ++block) {
        if (state[block] != kLive) continue;
        if (Status freed = pool.deallocate(pointers[block], streams[block]); !freed) return std::move(freed).error();
        pointers[block] = nullptr;
      }
      live = 0;
      seen_calls = probe.holding_calls();
      reserved = held();
    }
    pass.device_calls = calls_of(counting.counters()).since(calls_before);
    done += events.size();

    result.events += pass.events;
    result.replay_ns += pass.replay_ns;
    result.ooms += pass.ooms;
    peak_reserved = std::max(peak_reserved, pass.peak_reserved_bytes);
    result.passes.push_back(pass);
    if (last_pass) break;
  }
  if (flags.collect_series) sampler.finish();

  result.served_peak_live_bytes = peak_live;
  result.peak_live_bytes = peak_live;  // replay_with_search puts the trace's in
  result.peak_reserved_bytes = peak_reserved;
  const DeviceCounters counts = counting.counters();
  result.final_reserved_bytes = held();
  result.average_reserved_bytes = events.empty() ? static_cast<double>(initial_reserved) : average.mean();
  result.stats = pool.stats();
  result.peak_live_rounded_bytes = static_cast<std::uint64_t>(result.stats.peak_bytes_in_use);
  result.device_calls = calls_of(counts);

  // A single-region pool took exactly one region from the device, at creation.
  if (mode == Mode::preallocate && probe.first_region() != 0) {
    const std::uintptr_t base = probe.first_region();
    result.address_high_water_bytes = highest_end > base ? highest_end - base : 0;
  }
  return result;
}

/// The capacity search. Every capacity below the peak of requested live
/// bytes must fail, so the search starts there.
Expected<MinCapacity> search_min_capacity(const Trace& trace, Mode mode, std::size_t upper_bytes,
                                          std::uint64_t peak_live_bytes, const ReplayOptions& options) {
  const std::size_t granule = replay_granularity();

  MinCapacity found;
  RunFlags flags;
  flags.stop_at_first_oom = true;
  flags.collect_series = false;
  ReplayOptions quiet = options;
  quiet.progress = nullptr;
  quiet.verify_contents = false;
  quiet.passes = 1;  // whether the trace fits: a first pass decides

  // Succeeds when the replay runs with no OOM. A pool that cannot even be
  // created at this capacity (preallocation too large) counts as a failure.
  auto succeeds = [&](std::size_t capacity) -> Expected<bool> {
    ++found.probes;
    auto probe = run(trace, mode, capacity, quiet, flags);
    if (!probe) {
      if (probe.error().code() == Errc::out_of_memory) return false;
      return std::move(probe).error();
    }
    return probe->ooms == 0;
  };

  constexpr int kMaxDoublings = 4;  // up to 16 x upper_bytes
  std::size_t high = round_up(std::max(upper_bytes, granule), granule);
  for (int doublings = 0;; ++doublings) {
    auto ok = succeeds(high);
    if (!ok) return std::move(ok).error();
    if (*ok) break;
    if (doublings == kMaxDoublings) return found;
    high *= 2;
  }
  // `low` is known to fail: the largest multiple of the granule below the peak.
  std::size_t low = round_up(static_cast<std::size_t>(peak_live_bytes), granule);
  low = low >= granule ? low - granule : 0;
  if (low >= high) low = 0;
  while (high - low > granule) {
    const std::size_t middle = low + (high - low) / 2 / granule * granule;
    auto ok = succeeds(middle);
    if (!ok) return std::move(ok).error();
    if (*ok) {
      high = middle;
    } else {
      low = middle;
    }
  }
  found.bytes = high;
  return found;
}

/// peak_reserved / peak_live: the footprint in multiples of what the trace needs.
double reserved_per_live(std::uint64_t peak_reserved, std::uint64_t peak_live) {
  return peak_live == 0 ? 0.0 : static_cast<double>(peak_reserved) / static_cast<double>(peak_live);
}

/// One mode's replay at the options' capacity, and its capacity and limit
/// searches when asked. `peak_live_bytes` is the trace's (summarize()).
Expected<ModeReplay> replay_with_search(const Trace& trace, std::uint64_t peak_live_bytes, Mode mode,
                                        const ReplayOptions& options, const RunFlags& flags) {
  const std::size_t capacity = resolve_capacity(trace, options);
  auto result = run(trace, mode, capacity, options, flags);
  if (!result) return result;
  result->peak_live_bytes = peak_live_bytes;
  result->fragmentation = reserved_per_live(result->peak_reserved_bytes, peak_live_bytes);
  if (options.find_min_capacity) {
    auto found = search_min_capacity(trace, mode, capacity, peak_live_bytes, options);
    if (!found) return std::move(found).error();
    result->min_capacity_bytes = found->bytes;
    result->min_capacity_probes = found->probes;
    // The limit is the capacity the mode may take all of: the search at fraction 1.
    ReplayOptions whole_device = options;
    whole_device.config.mem_fraction.value = 1.0;
    auto limit = search_min_capacity(trace, mode, capacity, peak_live_bytes, whole_device);
    if (!limit) return std::move(limit).error();
    result->min_limit_bytes = limit->bytes;
    result->min_limit_probes = limit->probes;
  }
  return result;
}

/// What the reports show of the blocks themselves: the largest live at the
/// peak and, for small traces, every lifetime. Precondition: summarize(trace)
/// succeeded and out.peak_live_bytes is its peak.
void describe_blocks(const Trace& trace, TraceReplay& out) {
  const std::vector<Event>& events = trace.events;
  const bool timed = out.timed;
  auto x_of = [&](std::size_t index) { return timed ? events[index].time_us : static_cast<std::int64_t>(index); };
  const bool keep_lifetimes = trace.num_blocks <= kMaxLifetimes;
  std::vector<std::size_t> alloc_index(trace.num_blocks, 0);
  std::vector<bool> live(trace.num_blocks, false);
  std::vector<std::uint32_t> live_at_peak;
  bool peak_seen = false;
  std::uint64_t live_bytes = 0;
  if (keep_lifetimes) out.lifetimes.resize(trace.num_blocks);
  for (std::size_t index = 0; index < events.size(); ++index) {
    const Event& event = events[index];
    if (event.op == Op::alloc) {
      alloc_index[event.block] = index;
      live[event.block] = true;
      live_bytes += event.bytes;
      if (keep_lifetimes) out.lifetimes[event.block] = {event.block, event.bytes, x_of(index), -1};
    } else if (event.op == Op::free) {
      live[event.block] = false;
      live_bytes -= event.bytes;
      if (keep_lifetimes) out.lifetimes[event.block].end_x = x_of(index);
    }
    if (!peak_seen && live_bytes == out.peak_live_bytes && out.peak_live_bytes != 0) {
      peak_seen = true;
      out.peak_x = x_of(index);
      for (std::uint32_t block = 0; block < trace.num_blocks; ++block) {
        if (live[block]) live_at_peak.push_back(block);
      }
    }
  }
  constexpr std::size_t kLargest = 10;
  auto bytes_of = [&](std::uint32_t block) { return events[alloc_index[block]].bytes; };
  const std::size_t kept = std::min(kLargest, live_at_peak.size());
  std::partial_sort(live_at_peak.begin(), live_at_peak.begin() + static_cast<std::ptrdiff_t>(kept), live_at_peak.end(),
                    [&](std::uint32_t a, std::uint32_t b) { return bytes_of(a) > bytes_of(b); });
  for (std::size_t i = 0; i < kept; ++i) {
    const std::uint32_t block = live_at_peak[i];
    TraceReplay::PeakBlock peak;
    peak.block = block;
    peak.bytes = bytes_of(block);
    peak.alloc_x = x_of(alloc_index[block]);
    peak.seeded = block < trace.seeded_blocks;
    if (block < trace.block_stacks.size() && trace.block_stacks[block] < trace.stacks.size()) {
      peak.stack = trace.stacks[trace.block_stacks[block]];
    }
    out.largest_at_peak.push_back(std::move(peak));
  }
}

}  // namespace

DeviceCalls DeviceCalls::since(const DeviceCalls& earlier) const noexcept {
  DeviceCalls delta;
  delta.allocs = allocs - earlier.allocs;
  delta.frees = frees - earlier.frees;
  delta.creates = creates - earlier.creates;
  delta.releases = releases - earlier.releases;
  delta.maps = maps - earlier.maps;
  delta.unmaps = unmaps - earlier.unmaps;
  delta.reserves = reserves - earlier.reserves;
  delta.syncs = syncs - earlier.syncs;
  delta.queries = queries - earlier.queries;
  delta.device_ns = device_ns - earlier.device_ns;
  return delta;
}

std::size_t replay_granularity() noexcept { return HostDeviceOptions{}.granularity; }

Expected<ModeReplay> replay_mode(const Trace& trace, Mode mode, const ReplayOptions& options) {
  auto summary = summarize(trace);
  if (!summary) return std::move(summary).error();
  RunFlags flags;
  flags.progress_total = trace.events.size() * options.passes;
  return replay_with_search(trace, summary->peak_live_bytes, mode, options, flags);
}

Expected<MinCapacity> find_min_capacity(const Trace& trace, Mode mode, std::size_t upper_bytes,
                                        const ReplayOptions& options) {
  auto summary = summarize(trace);
  if (!summary) return std::move(summary).error();
  return search_min_capacity(trace, mode, upper_bytes, summary->peak_live_bytes, options);
}

std::optional<RecordedReplay> recorded_reserved(const Trace& trace, std::size_t max_series_points) {
  if (!trace.has_segments) return std::nullopt;
  // First pass: how far the running sum dips below zero is what was already
  // held when the record began.
  std::int64_t running = 0;
  std::int64_t lowest = 0;
  std::uint64_t live = 0;
  std::uint64_t peak_live = 0;
  for (const Event& event : trace.events) {
    switch (event.op) {
      case Op::segment_alloc: running += static_cast<std::int64_t>(event.bytes); break;
      case Op::segment_free:
        running -= static_cast<std::int64_t>(event.bytes);
        lowest = std::min(lowest, running);
        break;
      case Op::alloc:
        live += event.bytes;
        peak_live = std::max(peak_live, live);
        break;
      case Op::free: live -= std::min(live, event.bytes); break;
    }
  }
  RecordedReplay recorded;
  recorded.initial_reserved_bytes = static_cast<std::uint64_t>(-lowest);
  const bool timed = trace_is_timed(trace);
  SeriesSampler sampler(recorded.series, trace.events.size(), max_series_points);
  StepAverage average(timed);
  std::uint64_t reserved = recorded.initial_reserved_bytes;
  live = 0;
  recorded.peak_reserved_bytes = reserved;
  sampler.start(trace.events.empty() ? 0 : (timed ? trace.events.front().time_us : 0), 0, reserved);
  for (std::size_t index = 0; index < trace.events.size(); ++index) {
    const Event& event = trace.events[index];
    switch (event.op) {
      case Op::segment_alloc: reserved += event.bytes; break;
      case Op::segment_free: reserved -= std::min(reserved, event.bytes); break;
      case Op::alloc: live += event.bytes; break;
      case Op::free: live -= std::min(live, event.bytes); break;
    }
    recorded.peak_reserved_bytes = std::max(recorded.peak_reserved_bytes, reserved);
    const std::int64_t x = timed ? event.time_us : static_cast<std::int64_t>(index);
    average.add(x, reserved);
    sampler.add(x, live, reserved);
  }
  sampler.finish();
  recorded.average_reserved_bytes = average.mean();
  recorded.fragmentation = reserved_per_live(recorded.peak_reserved_bytes, peak_live);
  return recorded;
}

Expected<TraceReplay> replay(const Trace& trace, std::span<const Mode> modes,
                             const ReplayOptions& options) {
  TraceReplay out;
  out.trace_name = trace.name;
  out.trace_format = trace.format;
  out.events = trace.events.size();
  out.blocks = trace.num_blocks;
  out.unmatched_frees = trace.unmatched_frees;
  out.seeded_blocks = trace.seeded_blocks;
  out.seeded_bytes = trace.seeded_bytes;
  out.failed_allocs = trace.failed_allocs;
  out.timed = trace_is_timed(trace);
  out.mem_fraction = options.config.mem_fraction.value;
  out.recorder_settings = trace.recorder_settings;
  for (const RecordedFailure& failure : trace.failures) {
    // On the series' axis: its time, or the index of the event it preceded.
    std::int64_t x = static_cast<std::int64_t>(failure.before_event);
    if (out.timed) {
      x = failure.time_us >= 0 ? failure.time_us
          : failure.before_event < trace.events.size() ? trace.events[failure.before_event].time_us
                                                        : trace.events.back().time_us;
    }
    out.failures.push_back({x, failure.bytes});
  }
  auto summary = summarize(trace);
  if (!summary) return std::move(summary).error();
  out.peak_live_bytes = summary->peak_live_bytes;
  describe_blocks(trace, out);
  if (options.plan) {
    if (auto plan = plan_placement(trace)) out.planned_footprint_bytes = plan->footprint_bytes;
  }

  RunFlags flags;
  flags.progress_total = static_cast<std::uint64_t>(trace.events.size()) * modes.size() * options.passes;
  for (const Mode mode : modes) {
    auto result = replay_with_search(trace, out.peak_live_bytes, mode, options, flags);
    if (!result) {
      return Error(result.error().code(), "replay of '" + trace.name + "' under " +
                                              std::string(mode_name(mode)) + ": " +
                                              result.error().message());
    }
    flags.progress_base += trace.events.size() * options.passes;
    out.modes.push_back(std::move(*result));
  }
  out.recorded = recorded_reserved(trace, options.max_series_points);
  return out;
}

std::vector<Mode> default_replay_modes() {
  // Only the modes config can build over a host device in this build
  // (expandable once its pool is in; never cuda_async, which needs CUDA).
  std::vector<Mode> modes;
  auto device = make_device(host_config(Mode::growth, 64 * MiB, Config{}));
  for (const Mode mode : {Mode::preallocate, Mode::growth, Mode::platform, Mode::expandable}) {
    if (device && mode_supported(mode, **device)) modes.push_back(mode);
  }
  return modes;
}

}  // namespace tidepool::trace
