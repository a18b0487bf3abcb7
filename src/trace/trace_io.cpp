// What the readers share: format detection, files, and the one walk that
// checks a trace's invariants and sums it up.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "tidepool/trace_io.hpp"

namespace tidepool::trace {

const char* format_name(Format format) noexcept {
  switch (format) {
    case Format::pytorch_snapshot: return "pytorch-snapshot";
    case Format::rmm_csv: return "rmm-csv";
    case Format::tidepool: return "tidepool";
  }
  return "?";
}

Expected<Format> detect_format(std::string_view data) {
  if (data.empty()) return Error(Errc::corrupt_data, "the trace is empty (0 bytes)");
  if (data.size() >= 2 && static_cast<std::uint8_t>(data[0]) == 0x80 &&
      static_cast<std::uint8_t>(data[1]) >= 2 && static_cast<std::uint8_t>(data[1]) <= 5) {
    return Format::pytorch_snapshot;
  }
  if (data.starts_with("tidepool-trace")) return Format::tidepool;
  std::string_view text = data;
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
  if (text.starts_with("Thread,Time,Action")) return Format::rmm_csv;
  return Error(Errc::corrupt_data,
               "unknown trace format: not a PyTorch snapshot (a pickle of protocol 2 to 5), "
               "not an RMM log (header Thread,Time,Action,Pointer,Size,Stream), not a "
               "tidepool trace (first line 'tidepool-trace 1')");
}

Expected<Trace> parse_trace(std::string_view data, std::string name, const ReadOptions& options) {
  Expected<Format> format = detect_format(data);
  if (!format) return Error(Errc::corrupt_data, name + ": " + format.error().message());
  switch (*format) {
    case Format::pytorch_snapshot: return read_pytorch_snapshot(data, std::move(name), options.snapshot);
    case Format::rmm_csv: return read_rmm_csv(data, std::move(name));
    case Format::tidepool: return read_tidepool(data, std::move(name));
  }
  return Error(Errc::corrupt_data, name + ": unknown format");
}

namespace {

/// The file's bytes and the name a trace read from it takes (its file name).
struct TraceFile {
  std::string data;
  std::string name;
};

Expected<TraceFile> read_trace_file(const std::string& path) {
  std::error_code kind_error;
  if (std::filesystem::is_directory(path, kind_error))
    return Error(Errc::io_error, "cannot read trace " + path + ": it is a directory, not a trace file");
  std::ifstream file(path, std::ios::binary);
  if (!file) return Error(Errc::io_error, "cannot open trace " + path + ": " + std::strerror(errno));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return Error(Errc::io_error, "cannot read trace " + path + ": " + std::strerror(errno));
  const std::size_t slash = path.find_last_of('/');
  return TraceFile{std::move(contents).str(), slash == std::string::npos ? path : path.substr(slash + 1)};
}

}  // namespace

Expected<Trace> read_trace(const std::string& path, const ReadOptions& options) {
  auto file = read_trace_file(path);
  if (!file) return std::move(file).error();
  return parse_trace(file->data, std::move(file->name), options);
}

Expected<std::vector<Trace>> read_traces(const std::string& path, const ReadOptions& options) {
  auto file = read_trace_file(path);
  if (!file) return std::move(file).error();
  Expected<Format> format = detect_format(file->data);
  if (format && *format == Format::pytorch_snapshot && options.snapshot.device < 0) {
    return read_pytorch_snapshot_devices(file->data, std::move(file->name));
  }
  auto trace = parse_trace(file->data, std::move(file->name), options);
  if (!trace) return std::move(trace).error();
  std::vector<Trace> traces;
  traces.push_back(std::move(*trace));
  return traces;
}

Status write_tidepool_file(const Trace& trace, const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return Error(Errc::io_error, "cannot create " + path + ": " + std::strerror(errno));
  const std::string text = write_tidepool(trace);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  if (!file) return Error(Errc::io_error, "cannot write " + path + ": " + std::strerror(errno));
  return {};
}

Expected<TraceSummary> summarize(const Trace& trace) {
  TraceSummary summary;
  constexpr std::uint64_t kNotLive = ~std::uint64_t{0};
  std::vector<std::uint64_t> live_bytes(trace.num_blocks, kNotLive);  // by block
  std::uint64_t live = 0;
  std::uint64_t segments = 0;
  bool saw_segments = false;
  auto fail = [&](std::size_t index, const std::string& what) {
    return Error(Errc::corrupt_data, trace.name + ": event " + std::to_string(index) + " " + what);
  };
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const Event& event = trace.events[i];
    switch (event.op) {
      case Op::alloc:
        if (event.block != summary.allocs || event.block >= trace.num_blocks) {
          return fail(i, "allocates block " + std::to_string(event.block) + ", expected block " +
                             std::to_string(summary.allocs) + " of " + std::to_string(trace.num_blocks));
        }
        live_bytes[event.block] = event.bytes;
        ++summary.allocs;
        if (__builtin_add_overflow(summary.total_alloc_bytes, event.bytes, &summary.total_alloc_bytes) ||
            __builtin_add_overflow(live, event.bytes, &live)) {
          return fail(i, "allocates " + std::to_string(event.bytes) + " bytes: the sum of sizes overflows 64 bits");
        }
        ++summary.live_blocks_at_end;
        if (live > summary.peak_live_bytes) summary.peak_live_bytes = live;
        break;
      case Op::free:
        if (event.block >= summary.allocs || live_bytes[event.block] == kNotLive) {
          return fail(i, "frees block " + std::to_string(event.block) + ", which is not live");
        }
        if (live_bytes[event.block] != event.bytes) {
          return fail(i, "frees block " + std::to_string(event.block) + " with " + std::to_string(event.bytes) +
                             " bytes, allocated with " + std::to_string(live_bytes[event.block]));
        }
        live -= event.bytes;
        live_bytes[event.block] = kNotLive;
        ++summary.frees;
        --summary.live_blocks_at_end;
        break;
      case Op::segment_alloc:
        if (__builtin_add_overflow(segments, event.bytes, &segments)) {
          return fail(i, "adds a segment of " + std::to_string(event.bytes) +
                             " bytes: the sum of segment sizes overflows 64 bits");
        }
        if (segments > summary.peak_segment_bytes) summary.peak_segment_bytes = segments;
        ++summary.segment_events;
        saw_segments = true;
        break;
      case Op::segment_free:
        if (event.bytes > segments) {
          return fail(i, "returns a segment of " + std::to_string(event.bytes) + " bytes while only " +
                             std::to_string(segments) + " are held");
        }
        segments -= event.bytes;
        ++summary.segment_events;
        saw_segments = true;
        break;
      default:
        return fail(i, "has an unknown op " + std::to_string(static_cast<int>(event.op)));
    }
  }
  if (summary.allocs != trace.num_blocks) {
    return Error(Errc::corrupt_data, trace.name + ": num_blocks is " + std::to_string(trace.num_blocks) +
                                         " but the events allocate " + std::to_string(summary.allocs));
  }
  if (saw_segments != trace.has_segments) {
    return Error(Errc::corrupt_data, trace.name + ": has_segments is " +
                                         (trace.has_segments ? "true" : "false") + " but the events " +
                                         (saw_segments ? "have" : "have no") + " segment events");
  }
  summary.live_bytes_at_end = live;
  summary.segment_bytes_at_end = segments;
  return summary;
}

}  // namespace tidepool::trace
