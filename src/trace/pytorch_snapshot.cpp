// PyTorch memory snapshot -> Trace. The snapshot's layout (torch/cuda/memory.py,
// `_snapshot`): a dict with `segments` (allocator state at dump time) and
// `device_traces`, one list of trace entries per device, each a dict with
// `action`, `addr`, `size`, `stream`, `frames` and, in newer versions, `time_us`.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tidepool/trace_io.hpp"
#include "trace/live_at_start.hpp"
#include "trace/live_ranges.hpp"
#include "trace/pickle_reader.hpp"

namespace tidepool::trace {
namespace {

using pickle::Document;
using pickle::Kind;
using pickle::Node;

class SnapshotReader {
 public:
  SnapshotReader(const Document& doc, std::string name) : doc_(doc), name_(std::move(name)) {}

  /// The device's trace: `device` >= 0 names one; -1 picks the only device
  /// with entries (an error names the candidates when there are several).
  Expected<Trace> read(int device) {
    Expected<const Node*> traces = device_traces();
    if (!traces) return std::move(traces).error();
    Expected<int> chosen = choose_device(**traces, device);
    if (!chosen) return std::move(chosen).error();
    return read_device(**traces, *chosen, name_);
  }

  /// One trace per device with entries, named "NAME:devN" when there are
  /// several; the device-less empty trace when none has any.
  Expected<std::vector<Trace>> read_every_device() {
    Expected<const Node*> traces = device_traces();
    if (!traces) return std::move(traces).error();
    std::vector<int> devices;
    for (std::size_t d = 0; d < (*traces)->items.size(); ++d) {
      const Node& list = doc_.node((*traces)->items[d]);
      if (list.kind != Kind::list) {
        return fail(type_error("device_traces[" + std::to_string(d) + "]", list, "list"));
      }
      if (!list.items.empty()) devices.push_back(static_cast<int>(d));
    }
    std::vector<Trace> out;
    if (devices.empty()) devices.push_back(-1);
    for (const int device : devices) {
      std::string name = devices.size() > 1 ? name_ + ":dev" + std::to_string(device) : name_;
      auto trace = SnapshotReader(doc_, name_).read_device(**traces, device, std::move(name));
      if (!trace) return std::move(trace).error();
      out.push_back(std::move(*trace));
    }
    return out;
  }

 private:
  Expected<const Node*> device_traces() const {
    const Node& root = doc_.node(doc_.root());
    if (root.kind != Kind::dict) {
      return fail(std::string{"the pickle holds a "} + pickle::kind_name(root.kind) +
                  ", not a snapshot dict");
    }
    const Node* traces = doc_.find(root, "device_traces");
    if (traces == nullptr) {
      return fail("no 'device_traces': the snapshot was dumped without "
                  "torch.cuda.memory._record_memory_history() enabled");
    }
    if (traces->kind != Kind::list) return fail(type_error("device_traces", *traces, "list"));
    return traces;
  }

  /// `device` -1: no device has an entry.
  Expected<Trace> read_device(const Node& traces, int device, std::string trace_name) {
    Trace trace;
    trace.name = std::move(trace_name);
    trace.format = format_name(Format::pytorch_snapshot);
    trace.device = device;
    if (device < 0) {
      trace.warnings.push_back(empty_history_warning());
      return trace;
    }
    const Node& root = doc_.node(doc_.root());
    const Node& entries = doc_.node(traces.items[static_cast<std::size_t>(device)]);
    path_ = "device_traces[" + std::to_string(device) + "]";
    if (entries.kind != Kind::list) return fail(type_error(path_, entries, "list"));
    trace.events.reserve(entries.items.size());
    for (std::size_t i = 0; i < entries.items.size(); ++i) {
      if (Status s = read_entry(doc_.node(entries.items[i]), i, trace); !s) return std::move(s).error();
    }
    if (Status s = seed_live_at_dump(root, device, trace); !s) return std::move(s).error();
    if (!trace.block_stacks.empty()) trace.block_stacks.resize(trace.num_blocks, 0);
    read_settings(root, trace);
    live_at_start_.prepend_to(trace);
    if (Status s = add_reserved_before(root, device, trace); !s) return std::move(s).error();
    if (trace.num_blocks == 0) trace.warnings.push_back(empty_history_warning());
    return trace;
  }

  std::string empty_history_warning() const {
    return name_ +
           ": the snapshot's history has no allocation: it was dumped without recording, or "
           "before any; record one with torch.cuda.memory._record_memory_history(max_entries=100000) "
           "before the code to study, then torch.cuda.memory._dump_snapshot(\"FILE.pickle\")";
  }

  Error fail(const std::string& what) const {
    return Error(Errc::corrupt_data, name_ + ": " + what);
  }
  static std::string type_error(const std::string& where, const Node& node, const char* expected) {
    return where + " is a " + pickle::kind_name(node.kind) + ", expected a " + expected;
  }

  Expected<int> choose_device(const Node& traces, int requested) const {
    const std::size_t devices = traces.items.size();
    if (requested >= 0) {
      if (static_cast<std::size_t>(requested) >= devices) {
        return Error(Errc::invalid_argument, name_ + ": device " + std::to_string(requested) +
                                                 " requested, but the snapshot has traces for " +
                                                 std::to_string(devices) + " devices");
      }
      return requested;
    }
    int chosen = -1;
    std::string candidates;
    for (std::size_t d = 0; d < devices; ++d) {
      const Node& list = doc_.node(traces.items[d]);
      if (list.kind != Kind::list) {
        return fail(type_error("device_traces[" + std::to_string(d) + "]", list, "list"));
      }
      if (list.items.empty()) continue;
      if (!candidates.empty()) candidates += ", ";
      candidates += "device " + std::to_string(d) + " (" + std::to_string(list.items.size()) + " entries)";
      if (chosen >= 0) {
        chosen = -2;
      } else if (chosen == -1) {
        chosen = static_cast<int>(d);
      }
    }
    if (chosen == -2) {
      return Error(Errc::invalid_argument,
                   name_ + ": the snapshot has events on several devices: " + candidates +
                       "; choose one (tidepool replay --device N, or SnapshotOptions::device)");
    }
    return chosen;
  }

  // An int field of an entry; `fallback` when absent and optional.
  Expected<std::int64_t> field(const Node& entry, std::string_view key, const std::string& where,
                               bool required, std::int64_t fallback = 0) const {
    const Node* value = doc_.find(entry, key);
    if (value == nullptr) {
      if (!required) return fallback;
      return fail(where + " has no '" + std::string{key} + "'");
    }
    if (value->kind != Kind::integer) {
      return fail(type_error(where + "['" + std::string{key} + "']", *value, "64-bit int"));
    }
    return value->integer;
  }

  Status read_entry(const Node& entry, std::size_t index, Trace& trace) {
    const std::string where = path_ + "[" + std::to_string(index) + "]";
    if (entry.kind != Kind::dict) return fail(type_error(where, entry, "dict"));
    const Node* action_node = doc_.find(entry, "action");
    if (action_node == nullptr) return fail(where + " has no 'action'");
    if (action_node->kind != Kind::string) return fail(type_error(where + "['action']", *action_node, "str"));
    const std::string_view action = action_node->text;

    if (action == "free_requested" || action == "snapshot") return {};  // no lifetime change
    if (action == "oom") {
      // The entry's size is the request that failed (its addr: the device's free bytes).
      Expected<std::int64_t> size = field(entry, "size", where, false, 0);
      if (!size) return std::move(size).error();
      Expected<std::int64_t> time_us = field(entry, "time_us", where, false, -1);
      if (!time_us) return std::move(time_us).error();
      ++trace.failed_allocs;
      trace.failures.push_back({trace.events.size(), static_cast<std::uint64_t>(std::max<std::int64_t>(*size, 0)),
                                *time_us});
      return {};
    }
    const bool is_alloc = action == "alloc";
    const bool is_free = action == "free_completed";
    const bool is_segment_alloc = action == "segment_alloc" || action == "segment_map";
    const bool is_segment_free = action == "segment_free" || action == "segment_unmap";
    if (!is_alloc && !is_free && !is_segment_alloc && !is_segment_free) {
      return fail(where + " has the unknown action '" + std::string{action} + "'");
    }

    Expected<std::int64_t> addr = field(entry, "addr", where, true);
    if (!addr) return std::move(addr).error();
    if (*addr < 0) return fail(where + "['addr'] is negative: " + std::to_string(*addr));
    Expected<std::int64_t> size = field(entry, "size", where, true);
    if (!size) return std::move(size).error();
    if (*size < 0) return fail(where + "['size'] is negative: " + std::to_string(*size));
    Expected<std::int64_t> stream = field(entry, "stream", where, false, 0);
    if (!stream) return std::move(stream).error();
    Expected<std::int64_t> time_us = field(entry, "time_us", where, false, -1);
    if (!time_us) return std::move(time_us).error();

    Event event;
    event.bytes = static_cast<std::uint64_t>(*size);
    event.stream = static_cast<Stream>(*stream);
    event.time_us = *time_us;
    const auto address = static_cast<std::uint64_t>(*addr);

    if (is_alloc || is_free) touched_.insert(address);
    if (is_alloc) {
      if (Status apart = check_apart(address, event.bytes, where); !apart) return apart;
      live_.emplace(address, Live{trace.num_blocks, event.bytes, index});
      event.op = Op::alloc;
      event.block = trace.num_blocks++;
      if (const std::uint32_t stack = stack_of(entry, trace); stack != 0 || !trace.block_stacks.empty()) {
        trace.block_stacks.resize(trace.num_blocks, 0);
        trace.block_stacks.back() = stack;
      }
    } else if (is_free) {
      auto it = live_.find(address);
      if (it == live_.end()) {  // its alloc fell out of the ring buffer: live at the start
        ++trace.unmatched_frees;
        trace.events.push_back(live_at_start_.free_of_unrecorded(trace, event.bytes, event.stream, event.time_us));
        return {};
      }
      event.op = Op::free;
      event.block = it->second.block;
      event.bytes = it->second.bytes;
      live_.erase(it);
    } else {
      event.op = is_segment_alloc ? Op::segment_alloc : Op::segment_free;
      // Checked: a crafted snapshot must not wrap the sum (signed overflow).
      if (__builtin_add_overflow(net_segment_bytes_, is_segment_alloc ? *size : -*size, &net_segment_bytes_)) {
        return fail(where + ": the segments' net size overflows 64 bits after adding " + std::to_string(*size) +
                    " bytes");
      }
      lowest_net_segment_bytes_ = std::min(lowest_net_segment_bytes_, net_segment_bytes_);
      trace.has_segments = true;
    }
    trace.events.push_back(event);
    return {};
  }

  // Segments existed before the window when the bytes reserved at dump time
  // exceed what the window's segment events added, or when the window returns
  // more than it took; the larger of the two becomes one segment_alloc at the
  // start.
  Status add_reserved_before(const Node& root, int device, Trace& trace) const {
    std::int64_t reserved_at_dump = 0;
    Status summed = for_each_segment(root, device, [&](const Node& segment, const std::string& where) -> Status {
      Expected<std::int64_t> total = field(segment, "total_size", where, true);
      if (!total) return std::move(total).error();
      if (*total < 0) return fail(where + "['total_size'] is negative");
      if (__builtin_add_overflow(reserved_at_dump, *total, &reserved_at_dump)) {
        return fail(where + ": the segments' total size overflows 64 bits after adding " +
                    std::to_string(*total) + " bytes");
      }
      return {};
    });
    if (!summed) return summed;
    // The window's own events prove at least -lowest was held before it, even
    // when the dump's segment list is inconsistent with them.
    if (lowest_net_segment_bytes_ == INT64_MIN) return fail("the window's segment frees sum to -2^63 bytes");
    std::int64_t dump_minus_window = 0;
    if (__builtin_sub_overflow(reserved_at_dump, net_segment_bytes_, &dump_minus_window)) {
      return fail("segments: the bytes reserved at the dump minus the window's segment events overflow 64 bits");
    }
    const std::int64_t before = std::max(dump_minus_window, -lowest_net_segment_bytes_);
    if (before <= 0) return {};
    Event event;
    event.op = Op::segment_alloc;
    event.bytes = static_cast<std::uint64_t>(before);
    event.time_us = trace.events.empty() ? -1 : trace.events.front().time_us;
    trace.events.insert(trace.events.begin(), event);
    for (RecordedFailure& failure : trace.failures) ++failure.before_event;
    trace.has_segments = true;
    return {};
  }

  // Blocks allocated at dump time (`active_allocated` in `segments`) that no
  // event allocates or frees were live throughout the window: the model's
  // weights, allocated before recording began.
  Status seed_live_at_dump(const Node& root, int device, Trace& trace) {
    return for_each_segment(root, device, [&](const Node& segment, const std::string& where) -> Status {
      Expected<std::int64_t> stream = field(segment, "stream", where, false, 0);
      if (!stream) return std::move(stream).error();
      const Node* blocks = doc_.find(segment, "blocks");
      if (blocks == nullptr) return {};
      if (blocks->kind != Kind::list) return fail(type_error(where + "['blocks']", *blocks, "list"));
      for (std::size_t b = 0; b < blocks->items.size(); ++b) {
        const Node& block = doc_.node(blocks->items[b]);
        const std::string block_where = where + "['blocks'][" + std::to_string(b) + "]";
        if (block.kind != Kind::dict) return fail(type_error(block_where, block, "dict"));
        const Node* state = doc_.find(block, "state");
        if (state == nullptr || state->kind != Kind::string || state->text != "active_allocated") continue;
        Expected<std::int64_t> address = field(block, "address", block_where, true);
        if (!address) return std::move(address).error();
        Expected<std::int64_t> size = field(block, "size", block_where, true);
        if (!size) return std::move(size).error();
        Expected<std::int64_t> requested = field(block, "requested_size", block_where, false, *size);
        if (!requested) return std::move(requested).error();
        if (*requested < 0) return fail(block_where + "['requested_size'] is negative: " + std::to_string(*requested));
        if (touched_.contains(static_cast<std::uint64_t>(*address))) continue;
        live_at_start_.live_throughout(static_cast<std::uint64_t>(*requested), static_cast<Stream>(*stream),
                                       stack_of(block, trace));
      }
      return {};
    });
  }

  /// Calls visit(segment, where) for each entry of the snapshot's `segments`
  /// on `device`, once its shape is checked; the first error ends the walk.
  template <class Visit>
  Status for_each_segment(const Node& root, int device, Visit&& visit) const {
    const Node* segments = doc_.find(root, "segments");
    if (segments == nullptr) return {};
    if (segments->kind != Kind::list) return fail(type_error("segments", *segments, "list"));
    for (std::size_t i = 0; i < segments->items.size(); ++i) {
      const Node& segment = doc_.node(segments->items[i]);
      const std::string where = "segments[" + std::to_string(i) + "]";
      if (segment.kind != Kind::dict) return fail(type_error(where, segment, "dict"));
      Expected<std::int64_t> on_device = field(segment, "device", where, false, device);
      if (!on_device) return std::move(on_device).error();
      if (*on_device != device) continue;
      if (Status visited = visit(segment, where); !visited) return visited;
    }
    return {};
  }

  // Where a block was allocated: its `frames` as one "file:line name" a
  // line, at most kMaxFrames: the Python frames (file *.py) when there are
  // any, as memory_viz shows them, else the C++ frames with a file, else all.
  // Returns the index in trace.stacks (identical stacks shared), 0 when
  // there are no frames.
  std::uint32_t stack_of(const Node& entry, Trace& trace) {
    const Node* frames = doc_.find(entry, "frames");
    if (frames == nullptr || frames->kind != Kind::list || frames->items.empty()) return 0;
    constexpr std::size_t kMaxFrames = 16;
    enum Pass { python, with_file, any };
    std::string text;
    for (const Pass pass : {python, with_file, any}) {
      std::size_t kept = 0;
      for (const pickle::NodeId id : frames->items) {
        const Node& frame = doc_.node(id);
        if (frame.kind != Kind::dict) continue;
        const Node* file = doc_.find(frame, "filename");
        const Node* name = doc_.find(frame, "name");
        const Node* line = doc_.find(frame, "line");
        const std::string_view file_name = file != nullptr && file->kind == Kind::string ? file->text : "";
        if (pass == python && !file_name.ends_with(".py")) continue;
        if (pass == with_file && (file_name.empty() || file_name == "??")) continue;
        if (kept++ == kMaxFrames) break;
        if (!text.empty()) text += '\n';
        text += file_name;
        if (line != nullptr && line->kind == Kind::integer) text += ":" + std::to_string(line->integer);
        if (name != nullptr && name->kind == Kind::string) text += std::string(" ") += name->text;
      }
      if (!text.empty()) break;
    }
    if (text.empty()) return 0;
    if (trace.stacks.empty()) trace.stacks.emplace_back();
    auto [it, inserted] = stack_index_.try_emplace(text, static_cast<std::uint32_t>(trace.stacks.size()));
    if (inserted) trace.stacks.push_back(std::move(text));
    return it->second;
  }

  // `allocator_settings` (PyTorch 2.5 and later): each scalar as text, a
  // nested dict as "k: v, ..." on one line. Absent or odd values are left out.
  void read_settings(const Node& root, Trace& trace) const {
    const Node* settings = doc_.find(root, "allocator_settings");
    if (settings == nullptr || settings->kind != Kind::dict) return;
    for (std::size_t i = 0; i + 1 < settings->items.size(); i += 2) {
      const Node& key = doc_.node(settings->items[i]);
      if (key.kind != Kind::string) continue;
      const Node& value = doc_.node(settings->items[i + 1]);
      std::string text;
      if (value.kind == Kind::dict) {
        for (std::size_t j = 0; j + 1 < value.items.size(); j += 2) {
          if (!text.empty()) text += ", ";
          text += scalar_text(doc_.node(value.items[j])) + ": " + scalar_text(doc_.node(value.items[j + 1]));
        }
      } else {
        text = scalar_text(value);
      }
      trace.recorder_settings.emplace_back(std::string(key.text), std::move(text));
    }
  }

  static std::string scalar_text(const Node& node) {
    switch (node.kind) {
      case Kind::none: return "None";
      case Kind::boolean: return node.integer != 0 ? "True" : "False";
      case Kind::integer: return std::to_string(node.integer);
      case Kind::floating: {
        std::string text = std::to_string(node.floating);
        while (text.size() > 1 && text.back() == '0' && text[text.size() - 2] != '.') text.pop_back();
        return text;
      }
      case Kind::string: return node.text.empty() ? "''" : std::string(node.text);
      default: return std::string("(") + pickle::kind_name(node.kind) + ")";
    }
  }

  struct Live {
    std::uint32_t block;
    std::uint64_t bytes;
    std::size_t entry;
  };

  // The address rule (live_ranges.hpp), and no block past 2^64.
  Status check_apart(std::uint64_t address, std::uint64_t bytes, const std::string& where) const {
    if (bytes > ~address) {
      return fail(where + ": a block of " + std::to_string(bytes) + " bytes at address " + std::to_string(address) +
                  " ends past 2^64");
    }
    auto other = overlapping(live_, address, bytes);
    if (other == live_.end()) return {};
    return fail(where + ": alloc of " + std::to_string(bytes) + " bytes at address " + std::to_string(address) +
                (other->first == address ? std::string(" that is live since ")
                                         : " overlaps the live block of " + std::to_string(other->second.bytes) +
                                               " bytes at address " + std::to_string(other->first) + " allocated at ") +
                path_ + "[" + std::to_string(other->second.entry) + "]");
  }

  const Document& doc_;
  std::string name_;
  std::string path_;
  std::map<std::uint64_t, Live> live_;  // by address, ordered: check_apart looks at the neighbours
  std::unordered_set<std::uint64_t> touched_;  // addresses of every alloc and free
  std::unordered_map<std::string, std::uint32_t> stack_index_;  // trace.stacks, by text
  detail::LiveAtStart live_at_start_;
  std::int64_t net_segment_bytes_ = 0;
  std::int64_t lowest_net_segment_bytes_ = 0;  // the running sum's minimum
};

}  // namespace

Expected<Trace> read_pytorch_snapshot(std::string_view data, std::string name,
                                      const SnapshotOptions& options) {
  Expected<pickle::Document> doc = pickle::parse(data);
  if (!doc) return Error(doc.error().code(), name + ": " + doc.error().message());
  return SnapshotReader(*doc, std::move(name)).read(options.device);
}

Expected<std::vector<Trace>> read_pytorch_snapshot_devices(std::string_view data, std::string name) {
  Expected<pickle::Document> doc = pickle::parse(data);
  if (!doc) return Error(doc.error().code(), name + ": " + doc.error().message());
  return SnapshotReader(*doc, std::move(name)).read_every_device();
}

}  // namespace tidepool::trace
