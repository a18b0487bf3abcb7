// `tidepool exporter`: the node's ledgers as Prometheus metrics, in the style
// of NVIDIA's DCGM exporter: per device the ledger's limit, reserved,
// committed and peak bytes; per process (labels pid, command, device) its
// reservation, quota, cached-free and wanted bytes and its trim counters;
// the dead entries reclaimed and lock recoveries. Served over HTTP by
// prometheus-cpp's Exposer (bound to loopback unless --listen says
// otherwise), or printed once (--once) for node-exporter's textfile
// collector. It only reads the segments (Ledger::open_existing, snapshot):
// it never registers in a ledger, and each scrape finds the ledgers anew, so
// it answers while they come and go.
#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "command.hpp"
#include "tidepool/ledger.hpp"

namespace tidepool::cli {
namespace {

// Where Linux keeps POSIX shared-memory segments: "/tidepool-x" is the file
// /dev/shm/tidepool-x.
constexpr const char* kShmDirectory = "/dev/shm";
constexpr std::string_view kSegmentPrefix = "tidepool-";
// A scrape must not hang on a wedged ledger: wait this long for each lock.
constexpr std::chrono::milliseconds kLockTimeout{1000};

struct ExporterOptions {
  std::string listen = "127.0.0.1:9400";
  std::vector<std::string> segments;  // empty: every tidepool segment in /dev/shm
  bool once = false;
};

/// The segments to read: those named, else every /dev/shm/tidepool-* file
/// (the names ledger_segment_name gives), sorted.
std::vector<std::string> segments_to_read(const ExporterOptions& options) {
  if (!options.segments.empty()) return options.segments;
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& file : std::filesystem::directory_iterator(kShmDirectory, error)) {
    const std::string name = file.path().filename().string();
    if (name.starts_with(kSegmentPrefix)) names.push_back("/" + name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

using Labels = std::vector<prometheus::ClientMetric::Label>;

/// The metric families of one scrape, by name, in the order first added.
class Families {
 public:
  void add(const std::string& name, prometheus::MetricType type, const std::string& help,
           const Labels& labels, double value) {
    auto [it, inserted] = index_.emplace(name, families_.size());
    if (inserted) families_.push_back({name, help, type, {}});
    prometheus::ClientMetric metric;
    metric.label = labels;
    if (type == prometheus::MetricType::Counter) metric.counter.value = value;
    else metric.gauge.value = value;
    families_[it->second].metric.push_back(std::move(metric));
  }
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double value) {
    add(name, prometheus::MetricType::Gauge, help, labels, value);
  }
  void counter(const std::string& name, const std::string& help, const Labels& labels, double value) {
    add(name, prometheus::MetricType::Counter, help, labels, value);
  }
  std::vector<prometheus::MetricFamily> take() { return std::move(families_); }

 private:
  std::map<std::string, std::size_t> index_;
  std::vector<prometheus::MetricFamily> families_;
};

void add_ledger(Families& out, const LedgerSnapshot& snapshot) {
  const Labels device = {{"device", snapshot.device_id}, {"segment", snapshot.segment_name}};
  std::size_t alive = 0;
  for (const LedgerEntryInfo& entry : snapshot.entries) alive += entry.alive ? 1 : 0;
  out.gauge("tidepool_ledger_limit_bytes", "The most all processes may reserve together on the device.",
            device, static_cast<double>(snapshot.limit_bytes));
  out.gauge("tidepool_ledger_device_total_bytes", "The device's capacity when the ledger was made.", device,
            static_cast<double>(snapshot.device_total_bytes));
  out.gauge("tidepool_ledger_reserved_bytes", "Bytes the processes hold from the device.", device,
            static_cast<double>(snapshot.reserved_bytes));
  out.gauge("tidepool_ledger_committed_bytes",
            "Bytes the live processes commit: the sum of max(reserved, quota).", device,
            static_cast<double>(snapshot.committed_bytes()));
  out.gauge("tidepool_ledger_peak_reserved_bytes", "The largest reserved total since the ledger was made.",
            device, static_cast<double>(snapshot.peak_reserved_bytes));
  out.gauge("tidepool_ledger_processes", "Live processes registered in the ledger.", device,
            static_cast<double>(alive));
  out.gauge("tidepool_ledger_entry_capacity", "The most processes the ledger can hold.", device,
            static_cast<double>(snapshot.entry_capacity));
  out.counter("tidepool_ledger_reclaimed_entries_total", "Entries of dead processes cleared.", device,
              static_cast<double>(snapshot.reclaimed_entries));
  out.counter("tidepool_ledger_lock_recoveries_total", "Times the lock was recovered from a dead holder.",
              device, static_cast<double>(snapshot.lock_recoveries));

  for (const LedgerEntryInfo& entry : snapshot.entries) {
    const Labels process = {{"command", entry.command},
                            {"device", snapshot.device_id},
                            {"pid", std::to_string(entry.pid)},
                            {"segment", snapshot.segment_name}};
    out.gauge("tidepool_process_alive", "1 while the process runs; 0 for an entry not reclaimed yet.",
              process, entry.alive ? 1 : 0);
    out.gauge("tidepool_process_reserved_bytes", "Bytes the process holds from the device.", process,
              static_cast<double>(entry.reserved_bytes));
    out.gauge("tidepool_process_quota_bytes", "The process's quota; 0: none.", process,
              static_cast<double>(entry.quota_bytes));
    if (entry.cached_free_known)
      out.gauge("tidepool_process_cached_free_bytes",
                "Bytes the process holds but does not use, as its pools last reported.", process,
                static_cast<double>(entry.cached_free_bytes));
    out.gauge("tidepool_process_wanted_bytes",
              "The request the process is waiting on other processes' trims for; 0: none.", process,
              static_cast<double>(entry.wanted_bytes));
    out.counter("tidepool_process_trim_requests_total", "Trim requests the process has posted.", process,
                static_cast<double>(entry.trim_requests));
    out.counter("tidepool_process_trims_answered_total", "Other processes' trim requests it has answered.",
                process, static_cast<double>(entry.trims_answered));
    out.counter("tidepool_process_trimmed_bytes_total", "Bytes it released answering trim requests.", process,
                static_cast<double>(entry.bytes_trimmed));
    out.gauge("tidepool_process_asleep_bytes",
              "Bytes of the process's sleeping tags: given back, to be taken again at wake.", process,
              static_cast<double>(entry.asleep_bytes));
    out.counter("tidepool_process_wake_waits_total", "Wakes that waited for other processes to free or trim.",
                process, static_cast<double>(entry.wake_waits));
  }
}

/// Reads every ledger at each scrape: the Collectable the Exposer serves.
class LedgerCollector final : public prometheus::Collectable {
 public:
  explicit LedgerCollector(ExporterOptions options) : options_(std::move(options)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    Families out;
    std::size_t read = 0;
    std::size_t failed = 0;
    for (const std::string& name : segments_to_read(options_)) {
      auto ledger = Ledger::open_existing(name, kLockTimeout);
      auto snapshot = ledger ? (*ledger)->snapshot() : Expected<LedgerSnapshot>(ledger.error());
      if (!snapshot) {
        // A segment that went away, is not a ledger or is wedged: this scrape
        // goes on without it, and says so.
        ++failed;
        std::fprintf(stderr, "tidepool exporter: %s\n", snapshot.error().message().c_str());
        continue;
      }
      ++read;
      add_ledger(out, *snapshot);
    }
    out.gauge("tidepool_exporter_ledgers", "Ledgers read in this scrape.", {}, static_cast<double>(read));
    out.gauge("tidepool_exporter_ledger_errors", "Ledgers that could not be read in this scrape.", {},
              static_cast<double>(failed));
    return out.take();
  }

 private:
  ExporterOptions options_;
};

/// "host:port" with a port in 1..65535; the host as civetweb takes it
/// (an IPv4 address, or an IPv6 one in brackets).
Status check_listen(const std::string& listen) {
  const auto colon = listen.rfind(':');
  const std::string allowed = "host:port, e.g. 127.0.0.1:9400, 0.0.0.0:9400 (every interface) or [::1]:9400";
  if (colon == std::string::npos || colon == 0)
    return Error(Errc::invalid_argument, "--listen '" + listen + "' is invalid: no host:port; allowed: " + allowed);
  const std::string port = listen.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
    return Error(Errc::invalid_argument,
                 "--listen '" + listen + "' is invalid: the port must be 1 to 65535; allowed: " + allowed);
  return {};
}

int run_exporter(const ExporterOptions& options) {
  auto collector = std::make_shared<LedgerCollector>(options);
  if (options.once) {
    const std::string text = prometheus::TextSerializer().Serialize(collector->Collect());
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (Status valid = check_listen(options.listen); !valid) return report_error(valid.error());

  // Block the signals that end it before the server's threads start, so that
  // only sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options.listen, 2);
  } catch (const std::exception& error) {
    return report_error(Error(Errc::io_error, "--listen '" + options.listen + "': cannot listen: " + error.what()));
  }
  exposer->RegisterCollectable(collector);
  fmt::print("tidepool exporter: serving http://{}/metrics\n", options.listen);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  return 0;
}

[[maybe_unused]] const bool registered = register_command(
    "exporter", "Serve the node's ledgers as Prometheus metrics (read-only; docs/cluster.md)",
    [](CLI::App& app) -> Run {
      auto options = std::make_shared<ExporterOptions>();
      app.add_option("--listen", options->listen,
                     "Address and port to serve /metrics on (loopback unless told otherwise)")
          ->capture_default_str();
      app.add_option("--segment", options->segments,
                     "A ledger segment to read ('/name', repeatable); default: every /dev/shm/tidepool-*");
      app.add_flag("--once", options->once,
                   "Print the metrics once to standard output and exit (node-exporter's textfile collector)");
      return [options] { return run_exporter(*options); };
    });

}  // namespace
}  // namespace tidepool::cli
