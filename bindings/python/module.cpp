// The Python module tidepool._tidepool: Allocator, replay, ledger, and
// exceptions carrying tidepool's messages. The package (tidepool/__init__.py)
// re-exports it. Values cross as Python ints, strs and dicts; no numpy.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "settings.hpp"
#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/replay.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "tidepool/workloads.hpp"

namespace py = pybind11;

namespace tidepool::python {
namespace {

/// The Python exception classes, one per Errc, made at import.
struct Exceptions {
  py::object base;                 // tidepool.Error
  std::vector<py::object> by_code; // indexed by Errc
};
Exceptions& exceptions() {
  static Exceptions* instance = new Exceptions();  // never destroyed: outlives the interpreter's teardown
  return *instance;
}

[[noreturn]] void raise(const Error& error) { throw Exception(error); }

template <class T>
T take(Expected<T> result) {
  if (!result) raise(result.error());
  return std::move(*result);
}
void check(const Status& status) {
  if (!status) raise(status.error());
}

/// A keyword argument as the text a TIDEPOOL_* variable would hold: bools
/// as true/false, numbers as Python writes them, strings as given.
std::string setting_text(const std::string& key, const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value) ||
      py::isinstance<py::str>(value))
    return py::str(value).cast<std::string>();
  raise(Error(Errc::invalid_argument, key + "=" + py::repr(value).cast<std::string>() +
                                          ": expected a str, int, float or bool"));
}

/// The stats with JAX's Device.memory_stats() names, in Stats::items()
/// order, plus XLA's bytes_reservable_limit after peak_bytes_reserved (as
/// AllocatorStats orders them): "the upper limit on the number of bytes of
/// reservable memory". A pool never holds more than bytes_limit from the
/// device, so that is its value here. It is not a Stats item because the C
/// ABI's tidepool_stats mirrors items() field for field.
py::dict stats_dict(const Stats& stats) {
  py::dict out;
  for (const auto& [name, value] : stats.items()) {
    out[py::str(std::string(name))] = value;
    if (name == "peak_bytes_reserved") out["bytes_reservable_limit"] = stats.bytes_limit;
  }
  return out;
}

/// Peaks since reset_peak_memory_stats(). The pools keep their peaks since
/// creation and have no reset, so after a reset the binding tracks the peaks
/// itself: in use and reserved rise only when a block is allocated, so
/// observing the stats after each allocation made through this Allocator
/// gives the exact peaks of the window.
class PeakWindow {
 public:
  void reset(const Stats& now) {
    std::lock_guard lock(mutex_);
    active_ = true;
    peak_in_use_ = now.bytes_in_use;
    peak_reserved_ = now.bytes_reserved;
    peak_pool_ = now.pool_bytes;
  }
  bool active() const {
    std::lock_guard lock(mutex_);
    return active_;
  }
  void observe(const Stats& now) {
    std::lock_guard lock(mutex_);
    peak_in_use_ = std::max(peak_in_use_, now.bytes_in_use);
    peak_reserved_ = std::max(peak_reserved_, now.bytes_reserved);
    peak_pool_ = std::max(peak_pool_, now.pool_bytes);
  }
  /// `stats` with the window's peaks when a reset has happened.
  Stats apply(Stats stats) const {
    std::lock_guard lock(mutex_);
    if (!active_) return stats;
    stats.peak_bytes_in_use = std::max(peak_in_use_, stats.bytes_in_use);
    stats.peak_bytes_reserved = std::max(peak_reserved_, stats.bytes_reserved);
    stats.peak_pool_bytes = std::max(peak_pool_, stats.pool_bytes);
    return stats;
  }

 private:
  mutable std::mutex mutex_;
  bool active_ = false;
  std::int64_t peak_in_use_ = 0;
  std::int64_t peak_reserved_ = 0;
  std::int64_t peak_pool_ = 0;
};

/// One row of memory_summary(): a name and up to two columns.
std::string summary_row(std::string_view name, const std::string& current, const std::string& peak = {}) {
  std::string row = " " + std::string(name);
  row.resize(std::max<std::size_t>(row.size() + 1, 34), ' ');
  std::string value = current;
  if (value.size() < 14) value.insert(0, 14 - value.size(), ' ');
  row += "| " + value;
  if (!peak.empty()) {
    std::string padded = peak;
    if (padded.size() < 14) padded.insert(0, 14 - padded.size(), ' ');
    row += " | " + padded;
  }
  return row + "\n";
}

std::string bytes_text(std::int64_t bytes) { return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0))); }

/// memory_summary(): the stats as a text table, as torch.cuda.memory_summary()
/// prints PyTorch's: sizes in binary units, current and peak side by side.
std::string memory_summary_text(std::string_view pool_name, const std::string& device, const Stats& s) {
  const std::string rule(66, '=');
  const std::string thin(66, '-');
  std::string out = rule + "\n";
  out += " tidepool memory summary: " + std::string(pool_name) + " pool on " + device + "\n";
  out += thin + "\n";
  out += summary_row("Metric", "Current", "Peak");
  out += thin + "\n";
  out += summary_row("In use (bytes_in_use)", bytes_text(s.bytes_in_use), bytes_text(s.peak_bytes_in_use));
  out += summary_row("Reserved (bytes_reserved)", bytes_text(s.bytes_reserved), bytes_text(s.peak_bytes_reserved));
  out += summary_row("Pool (pool_bytes)", bytes_text(s.pool_bytes), bytes_text(s.peak_pool_bytes));
  out += summary_row("Cached free", bytes_text(s.bytes_reserved - s.bytes_in_use));
  out += thin + "\n";
  out += summary_row("Limit (bytes_limit)", bytes_text(s.bytes_limit));
  out += summary_row("Largest free block", bytes_text(s.largest_free_block_bytes));
  out += summary_row("Largest allocation", bytes_text(s.largest_alloc_size));
  char fragmentation[32];
  std::snprintf(fragmentation, sizeof fragmentation, "%.3f", s.fragmentation());
  out += summary_row("Fragmentation", fragmentation);
  out += thin + "\n";
  out += summary_row("Allocations (num_allocs)", std::to_string(s.num_allocs));
  out += summary_row("Out-of-memory refusals", std::to_string(s.num_ooms));
  out += summary_row("Device allocations", std::to_string(s.num_device_allocs));
  out += summary_row("Device frees", std::to_string(s.num_device_frees));
  if (s.num_maps > 0 || s.bytes_mapped > 0) {
    out += summary_row("Mapped (bytes_mapped)", bytes_text(s.bytes_mapped));
    out += summary_row("Free granules", std::to_string(s.granules_free));
    out += summary_row("Maps / unmaps", std::to_string(s.num_maps) + " / " + std::to_string(s.num_unmaps));
    out += summary_row("Stitches", std::to_string(s.num_stitches));
    out += summary_row("Granules released", std::to_string(s.num_releases));
  }
  if (s.bytes_asleep > 0) out += summary_row("Asleep (bytes_asleep)", bytes_text(s.bytes_asleep));
  out += rule + "\n";
  return out;
}

/// A pool and its device, as the Python object Allocator.
class PyAllocator {
 public:
  explicit PyAllocator(bindings::Stack stack) : stack_(std::move(stack)) {}

  static std::unique_ptr<PyAllocator> from_settings(const py::kwargs& kwargs) {
    KeyValues settings;
    for (const auto& [key, value] : kwargs) {
      if (value.is_none()) continue;  // None: the default
      const std::string name = py::str(key).cast<std::string>();
      settings.emplace_back(name, setting_text(name, value));
    }
    py::gil_scoped_release unlocked;  // preallocation and the ledger's lock can take a while
    return build(Config::from_keys(settings));
  }
  static std::unique_ptr<PyAllocator> from_env() { return build(Config::from_env()); }

  std::uintptr_t allocate(std::size_t bytes, Stream stream) {
    const Open held = open();  // stack_.words too, until it returns
    Expected<void*> block = held.pool.allocate(bytes, stream);
    if (!block) raise(block.error().worded(stack_.words));
    return reinterpret_cast<std::uintptr_t>(*block);
  }
  void free(std::uintptr_t address, Stream stream) {
    check(open().pool.deallocate(reinterpret_cast<void*>(address), stream));
  }
  std::size_t trim() { return open().pool.trim(); }
  // Tags, sleep and wake (sleep.hpp): the pool's, or UnsupportedError.
  void tag_begin(const std::string& name) { check(tags_of(open()).tag_begin(name)); }
  void tag_end() { check(tags_of(open()).tag_end()); }
  void sleep(const std::string& name, const std::string& keep) {
    const SleepKeep kept = take(parse_sleep_keep(keep));
    check(tags_of(open()).sleep(name, kept));
  }
  void wake(const std::string& name) {
    const Open held = open();
    Status woken = tags_of(held).wake(name);
    if (!woken) raise(woken.error().worded(stack_.words));
  }
  std::vector<TagStats> tag_stats() const { return tags_of(open()).tag_stats(); }
  std::string dump() const { return open().pool.dump(); }
  std::string name() const { return std::string(open().pool.name()); }
  std::string device() const { return open().pool.device().description(); }
  /// Waits for the calls in flight (other threads, the GIL released), then
  /// destroys the stack; later calls raise.
  void close() {
    // New calls are refused first: a shared_mutex may let a stream of
    // readers (threads allocating with the GIL released) keep it from close.
    closing_.store(true);
    bindings::Stack closed;
    {
      // Not in a forked child: there the lock may be held by a call in
      // flight in a parent thread the child does not have, and no thread of
      // the child's can hold it. The stack's pool and device leave the
      // parent's memory alone in a child (docs/ledger.md, fork()).
      std::unique_lock whole(stack_mutex_, std::defer_lock);
      if (getpid() == maker_pid_) whole.lock();
      closed = std::move(stack_);
      stack_ = {};
    }
  }
  py::dict memory_stats() const {
    Stats stats;
    {
      py::gil_scoped_release unlocked;  // the pool's lock
      stats = peaks_.apply(open().pool.stats());
    }
    return stats_dict(stats);
  }
  std::string memory_summary() const {
    const Open held = open();
    return memory_summary_text(held.pool.name(), held.pool.device().description(), peaks_.apply(held.pool.stats()));
  }
  /// After allocate(): feeds the peak window once a reset has opened one.
  void observe_peaks() {
    if (peaks_.active()) peaks_.observe(open().pool.stats());
  }
  void reset_peak_memory_stats() { peaks_.reset(open().pool.stats()); }
  /// "tidepool.Allocator(mode='growth', device='host (1.00 GiB)', bytes_in_use=0, bytes_reserved=0)".
  std::string repr() const {
    std::shared_lock hold(stack_mutex_);
    if (!stack_.allocator) return "tidepool.Allocator(closed)";
    const Allocator& pool = *stack_.allocator;
    const Stats stats = pool.stats();
    return "tidepool.Allocator(mode='" + std::string(pool.name()) + "', device='" + pool.device().description() +
           "', bytes_in_use=" + std::to_string(stats.bytes_in_use) +
           ", bytes_reserved=" + std::to_string(stats.bytes_reserved) + ")";
  }

 private:
  /// The OOM advice names the settings as the config does: the keyword
  /// arguments, or the variables.
  static std::unique_ptr<PyAllocator> build(Expected<Config> config) {
    return std::make_unique<PyAllocator>(take(bindings::make_stack(take(std::move(config)))));
  }
  /// The pool, held open for one call: the hold lasts to the end of the
  /// caller's full expression, so close() cannot destroy the stack under it.
  struct Open {
    std::shared_lock<std::shared_mutex> hold;
    Allocator& pool;
  };
  Open open() const {
    if (closing_.load()) raise(Error(Errc::invalid_argument, "the allocator is closed"));
    std::shared_lock hold(stack_mutex_);
    if (!stack_.allocator) raise(Error(Errc::invalid_argument, "the allocator is closed"));
    return Open{std::move(hold), *stack_.allocator};
  }
  static Sleepable& tags_of(const Open& held) {
    Sleepable* tags = held.pool.sleepable();
    if (tags == nullptr) {
      raise(Error(Errc::unsupported, "the '" + std::string(held.pool.name()) +
                                         "' pool has no tags; tags, sleep and wake need mode='expandable'"));
    }
    return *tags;
  }
  // Every call shares it; close() takes it whole (issue 14: close() racing
  // calls that released the GIL destroyed the stack under them).
  mutable std::shared_mutex stack_mutex_;
  std::atomic<bool> closing_{false};
  const pid_t maker_pid_ = getpid();  // a forked child closes without the lock
  bindings::Stack stack_;
  PeakWindow peaks_;
};

/// `with pool.tag(name):` (Allocator.tag).
struct TagBlock {
  PyAllocator* pool;
  std::string name;
};

py::dict series_point(const trace::SeriesPoint& point) {
  py::dict out;
  out["x"] = point.x;
  out["live_bytes"] = point.live_bytes;
  out["reserved_bytes"] = point.reserved_bytes;
  return out;
}

template <class Points>
py::list series_list(const Points& points) {
  py::list out;
  for (const auto& point : points) out.append(series_point(point));
  return out;
}

/// The figures of a for_each_figure list as a dict (an absent optional: None).
template <class Figures>
py::dict figures_dict(const Figures& figures) {
  py::dict out;
  figures.for_each_figure([&out](std::string_view name, const auto& value) { out[py::str(std::string(name))] = py::cast(value); });
  return out;
}

py::dict calls_dict(const trace::DeviceCalls& calls) {
  py::dict out;
  for (const auto& [name, value] : calls.items()) out[py::str(std::string(name))] = value;
  return out;
}

/// One row of the replay table (report::replay_table) with every figure:
/// the JSON report's mode object, with the trace's name and seeded blocks.
py::dict mode_row(const trace::TraceReplay& replay, const trace::ModeReplay& mode, bool series) {
  py::dict row;
  row["trace"] = replay.trace_name;
  row["seeded_blocks"] = replay.seeded_blocks;
  row["seeded_bytes"] = replay.seeded_bytes;
  for (const auto& [name, value] : figures_dict(mode)) row[name] = value;
  row["device_calls"] = calls_dict(mode.device_calls);
  py::list passes;
  for (const trace::PassReplay& pass : mode.passes) {
    py::dict entry = figures_dict(pass);
    entry["device_calls"] = calls_dict(pass.device_calls);
    passes.append(entry);
  }
  row["passes"] = passes;
  row["first_oom"] = mode.first_oom ? py::object(figures_dict(*mode.first_oom)) : py::none();
  row["stats"] = stats_dict(mode.stats);
  if (series) row["series"] = series_list(mode.series);
  return row;
}

/// The recorded allocator's row (PyTorch's reserved bytes), mode = its label.
py::dict recorded_row(const trace::TraceReplay& replay, const trace::RecordedReplay& recorded,
                      bool series) {
  py::dict row;
  row["trace"] = replay.trace_name;
  row["mode"] = recorded.label;
  row["initial_reserved_bytes"] = recorded.initial_reserved_bytes;
  row["peak_reserved_bytes"] = recorded.peak_reserved_bytes;
  row["average_reserved_bytes"] = recorded.average_reserved_bytes;
  row["fragmentation"] = recorded.fragmentation;
  if (series) row["series"] = series_list(recorded.series);
  return row;
}

std::size_t bytes_argument(const char* name, const py::handle& value) {
  if (py::isinstance<py::int_>(value)) {
    // Compared as Python ints: any size, however far out of range, is a
    // ValueError naming it (not pybind11's cast error).
    const std::string text = py::str(value).cast<std::string>();
    if (PyObject_RichCompareBool(value.ptr(), py::int_(0).ptr(), Py_LT) == 1)
      raise(Error(Errc::invalid_argument, std::string(name) + "=" + text + ": must not be negative"));
    const unsigned long long bytes = PyLong_AsUnsignedLongLong(value.ptr());
    if (PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      raise(Error(Errc::invalid_argument, std::string(name) + "=" + text + ": more bytes than a size can hold"));
    }
    return static_cast<std::size_t>(bytes);
  }
  if (py::isinstance<py::str>(value)) {
    auto bytes = parse_bytes(value.cast<std::string>());
    if (!bytes)
      raise(Error(Errc::invalid_argument, std::string(name) + ": " + bytes.error().message()));
    return *bytes;
  }
  raise(Error(Errc::invalid_argument, std::string(name) + "=" + py::repr(value).cast<std::string>() +
                                          ": expected bytes as an int or a size like '80GiB'"));
}

/// Whether replay's `source` names a file rather than a built-in workload:
/// a directory separator or an extension ("runs/a.pickle", "log.csv").
/// Workload names are words with dashes.
bool looks_like_a_path(const std::string& source) {
  return source.find('/') != std::string::npos || source.find('.') != std::string::npos;
}

py::list replay(const std::string& source, const std::optional<std::vector<std::string>>& mode_names,
                const py::object& capacity, const py::object& mem_fraction, bool find_min_capacity,
                bool verify_contents, bool series) {
  trace::ReplayOptions options;
  if (!capacity.is_none()) options.capacity_bytes = bytes_argument("capacity", capacity);
  if (!mem_fraction.is_none())
    options.config = take(Config::from_keys({{"mem_fraction", setting_text("mem_fraction", mem_fraction)}}));
  options.find_min_capacity = find_min_capacity;
  options.verify_contents = verify_contents;
  std::vector<Mode> modes;
  if (mode_names) {
    for (const std::string& name : *mode_names) modes.push_back(take(parse_mode(name)));
  } else {
    modes = trace::default_replay_modes();
  }

  std::error_code ignored;
  const bool is_file = std::filesystem::exists(source, ignored);
  if (!is_file && looks_like_a_path(source)) {
    // Python's own exception for a missing file: errno, message and filename.
    const py::object error = py::module_::import("builtins").attr("FileNotFoundError")(
        ENOENT, "no such trace file (" + std::string(std::strerror(ENOENT)) + ")", source);
    PyErr_SetObject(PyExc_FileNotFoundError, error.ptr());
    throw py::error_already_set();
  }
  trace::TraceReplay result;
  {
    py::gil_scoped_release unlocked;
    Expected<trace::Trace> trace =
        is_file ? trace::read_trace(source) : [&]() -> Expected<trace::Trace> {
          auto workload = trace::make_workload(source);
          if (workload) return workload;
          return Error(Errc::invalid_argument, "'" + source + "' is neither a trace file nor a built-in workload (" +
                                                   workload.error().message() + ")");
        }();
    result = take(trace::replay(take(std::move(trace)), modes, options));
  }
  py::list rows;
  for (const auto& mode : result.modes) rows.append(mode_row(result, mode, series));
  if (result.recorded) rows.append(recorded_row(result, *result.recorded, series));
  return rows;
}

py::dict ledger_snapshot(const std::optional<std::string>& segment) {
  LedgerSnapshot snapshot = [&] {
    py::gil_scoped_release unlocked;
    std::string name;
    if (segment) {
      name = *segment;
    } else {
      // The ledger the environment configures (as `tidepool ledger`), read without registering.
      name = take(resolve_ledger(take(Config::from_env()))).segment_name;
    }
    auto ledger = take(Ledger::open_existing(name));
    return take(ledger->snapshot());
  }();
  // `tidepool ledger --json`'s object, from the same lists; "segment_name"
  // and "entries" are the names Python had first for "segment" and "processes".
  py::dict out = figures_dict(snapshot);
  py::list processes;
  for (const LedgerEntryInfo& entry : snapshot.entries) processes.append(figures_dict(entry));
  out["processes"] = processes;
  out["totals"] = figures_dict(snapshot.totals());
  out["segment_name"] = snapshot.segment_name;
  out["entries"] = processes;
  return out;
}

void make_exceptions(py::module_& m) {
  Exceptions& ex = exceptions();
  ex.base = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "tidepool.Error", "A tidepool error; .code names it (e.g. 'out_of_memory').", PyExc_RuntimeError, nullptr));
  m.attr("Error") = ex.base;
  // Each code a subclass, also of the built-in exception a Python caller expects.
  struct Kind {
    Errc code;
    const char* name;
    PyObject* builtin;
  };
  const Kind kinds[] = {
      {Errc::out_of_memory, "OutOfMemoryError", PyExc_MemoryError},
      {Errc::invalid_argument, "InvalidArgumentError", PyExc_ValueError},
      {Errc::invalid_pointer, "InvalidPointerError", PyExc_ValueError},
      {Errc::double_free, "DoubleFreeError", PyExc_ValueError},
      {Errc::unsupported, "UnsupportedError", PyExc_NotImplementedError},
      {Errc::device_error, "DeviceError", nullptr},
      {Errc::limit_reached, "LimitReachedError", nullptr},
      {Errc::corrupt_data, "CorruptDataError", PyExc_ValueError},
      {Errc::io_error, "IOError", PyExc_OSError},
  };
  ex.by_code.resize(std::size(kinds));
  for (const Kind& kind : kinds) {
    py::tuple bases = kind.builtin ? py::make_tuple(ex.base, py::handle(kind.builtin)) : py::make_tuple(ex.base);
    const std::string qualified = std::string("tidepool.") + kind.name;
    auto type = py::reinterpret_steal<py::object>(
        PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr));
    m.attr(kind.name) = type;
    ex.by_code[static_cast<std::size_t>(kind.code)] = type;
  }
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const Exception& error) {
      const auto index = static_cast<std::size_t>(error.error().code());
      py::object type = index < exceptions().by_code.size() ? exceptions().by_code[index] : exceptions().base;
      py::object value = type(error.error().message());
      value.attr("code") = errc_name(error.error().code());
      PyErr_SetObject(type.ptr(), value.ptr());
    }
  });
}

}  // namespace
}  // namespace tidepool::python

PYBIND11_MODULE(_tidepool, m) {
  using namespace tidepool;
  using namespace tidepool::python;
  m.doc() = "tidepool: GPU device memory allocation (docs/interop.md)";
  make_exceptions(m);

  py::class_<TagBlock>(m, "TagScope", "What Allocator.tag() returns: a with-block in which allocations carry the tag.")
      .def("__enter__",
           [](py::object self) {
             TagBlock& block = self.cast<TagBlock&>();
             block.pool->tag_begin(block.name);
             return self;
           })
      .def("__exit__", [](TagBlock& block, const py::object&, const py::object&, const py::object&) {
        block.pool->tag_end();
        return false;
      });

  py::class_<PyAllocator>(m, "Allocator", R"doc(
A tidepool allocator: a pool over a device, built as the config layer builds it.

Allocator(mode=..., device=..., capacity=..., mem_fraction=..., preallocate=...,
          release_threshold=..., idle_release=..., aliases=..., quota=..., ledger=...)
Each keyword is the TIDEPOOL_* variable of the same meaning (mode is
TIDEPOOL_ALLOCATOR, capacity TIDEPOOL_HOST_CAPACITY); values are strs
("16GiB"), ints (bytes), floats or bools. Omitted keywords take their
defaults; the environment is not read (Allocator.from_env() reads it).)doc")
      .def(py::init(&PyAllocator::from_settings))
      .def_static("from_env", &PyAllocator::from_env, py::call_guard<py::gil_scoped_release>(),
                  "An allocator configured by the environment (XLA_PYTHON_CLIENT_*, TIDEPOOL_*).")
      .def(
          "allocate",
          [](PyAllocator& self, const py::handle& bytes, Stream stream) {
            // An int (or a size like "1MiB"); a negative one is a ValueError
            // (InvalidArgumentError) naming it, not pybind11's TypeError.
            const std::size_t size = bytes_argument("bytes", bytes);
            py::gil_scoped_release unlocked;
            const std::uintptr_t address = self.allocate(size, stream);
            self.observe_peaks();
            return address;
          },
          py::arg("bytes"), py::arg("stream") = 0,
          "The address (an int) of a 256-byte-aligned block of at least `bytes` usable on "
          "`stream`; 0 for 0 bytes. Raises OutOfMemoryError, InvalidArgumentError (a "
          "ValueError) for a negative size.")
      .def("free", &PyAllocator::free, py::arg("address"), py::arg("stream") = 0,
           py::call_guard<py::gil_scoped_release>(),
           "Frees a block from allocate(); 0 is a no-op. Raises InvalidPointerError for an "
           "address never handed out, DoubleFreeError for one freed already.")
      .def("memory_stats", &PyAllocator::memory_stats,
           "The counters as a dict with every key of JAX's Device.memory_stats() (bytes_in_use, "
           "peak_bytes_in_use, num_allocs, largest_alloc_size, bytes_limit, bytes_reserved, "
           "peak_bytes_reserved, bytes_reservable_limit, largest_free_block_bytes, pool_bytes, "
           "peak_pool_bytes) and tidepool's own.")
      .def("memory_summary", &PyAllocator::memory_summary, py::call_guard<py::gil_scoped_release>(),
           "The stats as a text table, as torch.cuda.memory_summary() prints PyTorch's.")
      .def("reset_peak_memory_stats", &PyAllocator::reset_peak_memory_stats,
           py::call_guard<py::gil_scoped_release>(),
           "Starts the peaks (peak_bytes_in_use, peak_bytes_reserved, peak_pool_bytes) again "
           "from the current values, as torch.cuda.reset_peak_memory_stats() does.")
      .def("trim", &PyAllocator::trim, py::call_guard<py::gil_scoped_release>(),
           "Returns cached free memory to the device; returns the bytes released.")
      .def("dump", &PyAllocator::dump, py::call_guard<py::gil_scoped_release>(), "The memory map as text.")
      .def(
          "tag", [](PyAllocator& self, std::string name) { return TagBlock{&self, std::move(name)}; },
          py::arg("name"), py::keep_alive<0, 1>(),
          "A context manager: allocations of this thread inside `with pool.tag(name):` carry the "
          "tag (scopes nest, the innermost wins). A tag's blocks live in memory of their own, so "
          "the tag can sleep alone. mode='expandable' only (UnsupportedError elsewhere).")
      .def("sleep", &PyAllocator::sleep, py::arg("tag"), py::arg("keep") = "contents",
           py::call_guard<py::gil_scoped_release>(),
           "Gives the physical memory under the tag's blocks back to the device (and to other "
           "processes, through the ledger). keep='contents' copies their bytes to host memory "
           "first; keep='nothing' discards them. Addresses stay reserved: the blocks may be freed "
           "while asleep, not read or written. InvalidArgumentError for a tag that does not exist "
           "or is asleep.")
      .def("wake", &PyAllocator::wake, py::arg("tag"), py::call_guard<py::gil_scoped_release>(),
           "Takes memory for the tag again (waiting, bounded, for other processes to free or "
           "trim), at the same addresses, with the contents kept. OutOfMemoryError (naming who "
           "holds the device) leaves it asleep; InvalidArgumentError for a tag that does not "
           "exist or is awake.")
      .def(
          "tag_stats",
          [](const PyAllocator& self) {
            std::vector<TagStats> tags;
            {
              py::gil_scoped_release unlocked;
              tags = self.tag_stats();
            }
            py::dict out;
            for (const TagStats& tag : tags) {
              py::dict row;
              row["asleep"] = tag.asleep;
              row["bytes_in_use"] = tag.bytes_in_use;
              row["bytes_asleep"] = tag.bytes_asleep;
              row["host_bytes"] = tag.host_bytes;
              row["sleeps"] = tag.sleeps;
              row["wakes"] = tag.wakes;
              out[py::str(tag.name)] = row;
            }
            return out;
          },
          "Each tag's counters, by name: asleep, bytes_in_use, bytes_asleep, host_bytes, sleeps, wakes.")
      .def("close", &PyAllocator::close, py::call_guard<py::gil_scoped_release>(),
           "Gives all memory back once the calls in flight in other threads have returned; "
           "later calls raise tidepool.InvalidArgumentError ('the allocator is closed').")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyAllocator& self, const py::object&, const py::object&, const py::object&) {
            py::gil_scoped_release unlocked;
            self.close();
            return false;  // an exception from the with-block goes on
          },
          "Closes the allocator (close()) at the end of a with-block.")
      .def("__repr__", &PyAllocator::repr, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("name", &PyAllocator::name, "The pool's name.")
      .def_property_readonly("device", &PyAllocator::device, "The device's description.");

  m.def("replay", &replay, py::arg("trace"), py::arg("modes") = py::none(),
        py::arg("capacity") = py::none(), py::arg("mem_fraction") = py::none(),
        py::arg("find_min_capacity") = false, py::arg("verify_contents") = false,
        py::arg("series") = false,
        R"doc(Replays a trace file (PyTorch snapshot, RMM CSV, tidepool) or a built-in
workload ('train-step', 'llm-inference', 'small-tensors') under each mode, as
`tidepool replay` does; returns the table's rows as dicts (one per mode, then
the recorded allocator's row when the trace has segment events).)doc");
  m.def("ledger", &ledger_snapshot, py::arg("segment") = py::none(),
        "The cross-process ledger's state as a dict: the segment's totals and one dict per "
        "registered process. segment: its name ('/tidepool-...'); default: the ledger of the "
        "device the environment configures. Raises IOError when there is no such segment.");
  m.def("setting_keys", [] {
    py::dict out;
    for (const SettingName& setting : setting_names())
      if (!setting.key.empty()) out[py::str(std::string(setting.key))] = std::string(setting.variable);
    return out;
  }, "The Allocator keywords and the TIDEPOOL_* variables they stand for.");
  m.attr("__version__") = TIDEPOOL_VERSION;
}
