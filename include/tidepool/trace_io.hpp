// Reading and writing traces: PyTorch memory snapshots, RMM's logging
// adaptor CSV, and tidepool's own text format (docs/trace-format.md). Every
// reader produces the model of trace.hpp and checks it: lifetimes numbered
// densely in alloc order, every free ending a live lifetime and carrying its
// alloc's bytes. Bad input is an error naming the file and the place (byte
// offset, entry index, or line and column), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tidepool/error.hpp"
#include "tidepool/trace.hpp"

namespace tidepool::trace {

struct SnapshotOptions {
  /// Which entry of `device_traces` to read; -1 picks the only device with
  /// events (an error names the candidates when there are several).
  int device = -1;
};

/// Reads a PyTorch memory snapshot (the pickle `torch.cuda.memory._dump_snapshot`
/// writes) with a restricted pickle reader that refuses any class lookup or
/// code opcode. Per device: `alloc` starts a lifetime, `free_completed` ends it
/// (`free_requested` is ignored); a free whose alloc the ring buffer dropped is
/// counted in `unmatched_frees` and its block seeded (trace.hpp), as is every
/// `active_allocated` block of `segments` whose address no alloc or free
/// names (live throughout); `oom` entries count in `failed_allocs` and are
/// listed in `failures` (their `size`, time and place); a history with no
/// allocation gives a warning naming the PyTorch call that records one;
/// `segment_alloc`/`segment_map` and `segment_free`/
/// `segment_unmap` become segment events. When the snapshot's `segments`
/// (state at dump time) show that PyTorch held memory before the first
/// event, a leading segment_alloc of those bytes (reserved at dump minus the
/// net segment change in the window) is added, so the segment events give
/// PyTorch's reserved bytes over the whole window. `name` names the trace in
/// errors and reports.
Expected<Trace> read_pytorch_snapshot(std::string_view data, std::string name,
                                      const SnapshotOptions& options = {});

/// Every device of a snapshot, as read_pytorch_snapshot reads one: a trace
/// per device with entries, named "NAME:devN" when there are several (the
/// empty trace of device -1 when none has any).
Expected<std::vector<Trace>> read_pytorch_snapshot_devices(std::string_view data, std::string name);

/// Reads the CSV of RMM's logging_resource_adaptor: the header
/// `Thread,Time,Action,Pointer,Size,Stream`, then one line per call with the
/// time as HH:MM:SS.ffffff and the action `allocate`, `allocate failure` or
/// `free`. A free of a pointer allocated before the log began counts in
/// `unmatched_frees` and its block is seeded (trace.hpp); an `allocate
/// failure` counts in `failed_allocs` and is listed in `failures`.
/// Errors give the line and column.
Expected<Trace> read_rmm_csv(std::string_view text, std::string name);

/// Reads tidepool's own format (docs/trace-format.md). Errors give the line.
Expected<Trace> read_tidepool(std::string_view text, std::string name);

/// The trace in tidepool's format. Precondition: summarize(trace) succeeds.
std::string write_tidepool(const Trace& trace);

/// Where an allocation was made: an `a` line's optional ADDRESS and DEVICE
/// (docs/trace-format.md; read and checked, not kept: replay needs neither).
struct EventOrigin {
  std::uint64_t address = 0;
  std::int32_t device = 0;
};

/// The header lines of a trace of `events` events, ending with `events N`;
/// the counts (unmatched_frees, failed_allocs, blocks, events) have at least
/// `count_width` digits, so that a trace written while it is recorded can
/// rewrite them in place (0: as few as needed).
void append_tidepool_header(std::string& out, const Trace& trace, std::size_t events, int count_width);

/// One event line, with its '\n'; `origin` (alloc events only) adds ADDRESS and DEVICE.
void append_tidepool_event(std::string& out, const Event& event, const EventOrigin* origin = nullptr);

/// Writes write_tidepool(trace) to `path` (io_error naming the path).
Status write_tidepool_file(const Trace& trace, const std::string& path);

enum class Format { pytorch_snapshot, rmm_csv, tidepool };

/// "pytorch-snapshot", "rmm-csv", "tidepool": the value of Trace::format.
const char* format_name(Format format) noexcept;

/// Tells the format by content: a pickle of protocol 2 to 5, the RMM CSV
/// header, or tidepool's magic line. corrupt_data when it is none of them.
Expected<Format> detect_format(std::string_view data);

struct ReadOptions {
  SnapshotOptions snapshot;
};

/// Reads a trace in any supported format, told by its content.
Expected<Trace> parse_trace(std::string_view data, std::string name, const ReadOptions& options = {});

/// Reads the file at `path` in any supported format; the trace is named by the
/// file's name. io_error when it cannot be read.
Expected<Trace> read_trace(const std::string& path, const ReadOptions& options = {});

/// As read_trace, but a snapshot read with options.snapshot.device -1 gives
/// every device with entries (read_pytorch_snapshot_devices); one trace for
/// the other formats, which record one device.
Expected<std::vector<Trace>> read_traces(const std::string& path, const ReadOptions& options = {});

/// Figures of the trace itself, before any replay.
struct TraceSummary {
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::size_t segment_events = 0;
  std::uint64_t total_alloc_bytes = 0;  // sum of all requested bytes
  std::uint64_t peak_live_bytes = 0;    // most requested bytes live at once
  std::uint64_t live_bytes_at_end = 0;
  std::size_t live_blocks_at_end = 0;   // lifetimes never freed in the trace
  std::uint64_t peak_segment_bytes = 0; // most bytes the recorder held (segment events)
  std::uint64_t segment_bytes_at_end = 0;
};

/// Walks the events once, checking the model's invariants: alloc blocks are
/// 0, 1, 2... in order and number num_blocks; a free ends a live block and
/// carries its bytes; segment frees never take more than is held;
/// has_segments says whether segment events are present. corrupt_data naming
/// the first event that breaks one.
Expected<TraceSummary> summarize(const Trace& trace);

}  // namespace tidepool::trace
