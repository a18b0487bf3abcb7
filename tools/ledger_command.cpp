// `tidepool ledger`: like nvidia-smi for pools. Reads a device's cross-process
// ledger and prints each process (pid, alive, reserved, cached-free, quota,
// wanted, trim requests, bytes asleep, wake waits) and the totals; --reclaim
// clears dead entries first.
// It registers nothing itself: it only reads the segment (and, with
// --reclaim, clears the entries of processes that died).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "tidepool/config.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/report.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace tidepool::cli {
namespace {

struct LedgerCommandOptions {
  std::string device;  // a device id, or a segment name ("/...")
  bool json = false;
  bool reclaim = false;
};

/// The segment the options name: --device as a segment name when it starts
/// with '/', else as a device id; without --device, the configured one.
Expected<std::string> segment_name(const LedgerCommandOptions& options) {
  if (!options.device.empty() && options.device.front() == '/') return options.device;
  auto config = load_config();
  if (!config) return std::move(config).error();
  // The name is this user's (or, with TIDEPOOL_LEDGER_MODE=group, this group's).
  if (!options.device.empty()) return ledger_segment_name(options.device, config->ledger_mode.value);
  auto resolved = resolve_ledger(*config);
  if (!resolved) return std::move(resolved).error();
  return resolved->segment_name;
}

std::string bytes_or_none(std::size_t bytes) { return bytes != 0 ? format_bytes(bytes) : "none"; }

void print_text(const LedgerSnapshot& snapshot, const LedgerCommandOptions& options, std::size_t reclaimed) {
  if (options.reclaim) fmt::print("reclaimed {} dead entr{}\n\n", reclaimed, reclaimed == 1 ? "y" : "ies");
  fmt::print("ledger {} for device {}\n", snapshot.segment_name, snapshot.device_id);
  fmt::print("  limit {} (device {}), reserved {}, committed {}, peak {}\n", format_bytes(snapshot.limit_bytes),
             format_bytes(snapshot.device_total_bytes), format_bytes(snapshot.reserved_bytes),
             format_bytes(snapshot.committed_bytes()), format_bytes(snapshot.peak_reserved_bytes));
  fmt::print("  {} of {} entries used; {} dead entries reclaimed so far, {} lock recoveries\n\n",
             snapshot.entries.size(), snapshot.entry_capacity, snapshot.reclaimed_entries,
             snapshot.lock_recoveries);
  constexpr const char* kRow =
      "{:>8}  {:<5}  {:<15}  {:>10}  {:>11}  {:>10}  {:>10}  {:>9}  {:>8}  {:>10}  {:>10}  {:>10}\n";
  fmt::print(kRow, "PID", "ALIVE", "COMMAND", "RESERVED", "CACHED-FREE", "QUOTA", "WANTED", "TRIM-REQS",
             "ANSWERED", "TRIMMED", "ASLEEP", "WAKE-WAITS");
  for (const LedgerEntryInfo& entry : snapshot.entries) {
    fmt::print(kRow, entry.pid, entry.alive ? "yes" : "DEAD", entry.command, format_bytes(entry.reserved_bytes),
               entry.cached_free_known ? format_bytes(entry.cached_free_bytes) : "-",
               bytes_or_none(entry.quota_bytes), entry.wanted_bytes ? format_bytes(entry.wanted_bytes) : "-",
               entry.trim_requests, entry.trims_answered, format_bytes(entry.bytes_trimmed),
               entry.asleep_bytes ? format_bytes(entry.asleep_bytes) : "-", entry.wake_waits);
  }
  const LedgerTotals totals = snapshot.totals();
  fmt::print(kRow, "total", fmt::format("{}/{}", totals.alive, totals.processes), "alive/processes",
             format_bytes(totals.reserved_bytes), format_bytes(totals.cached_free_bytes),
             bytes_or_none(totals.quota_bytes), totals.wanted_bytes ? format_bytes(totals.wanted_bytes) : "-",
             totals.trim_requests, totals.trims_answered, format_bytes(totals.bytes_trimmed),
             totals.asleep_bytes ? format_bytes(totals.asleep_bytes) : "-", totals.wake_waits);
  if (totals.alive < totals.processes && !options.reclaim)
    fmt::print("\n{} dead entr{}: cleared by the next process that registers or runs short, or by `tidepool ledger --reclaim`\n",
               totals.processes - totals.alive, totals.processes - totals.alive == 1 ? "y" : "ies");
}

int run_ledger(const LedgerCommandOptions& options) {
  auto name = segment_name(options);
  if (!name) return report_error(name.error());
  // No segment: no process uses this device's ledger. Like nvidia-smi with no
  // processes, that is an answer, not an error.
  if (const int fd = shm_open(name->c_str(), O_RDONLY, 0); fd >= 0) {
    close(fd);
  } else if (errno == ENOENT) {
    if (options.json) {
      fmt::print("{}\n", nlohmann::json{{"segment", *name}, {"processes", nlohmann::json::array()}}.dump(2));
    } else {
      fmt::print("No process uses a ledger for this device (segment {} does not exist).\n", *name);
    }
    return 0;
  }
  auto ledger = Ledger::open_existing(*name);
  if (!ledger) return report_error(ledger.error());
  std::size_t reclaimed = 0;
  if (options.reclaim) {
    auto cleared = (*ledger)->reclaim_dead();
    if (!cleared) return report_error(cleared.error());
    reclaimed = *cleared;
  }
  auto snapshot = (*ledger)->snapshot();
  if (!snapshot) return report_error(snapshot.error());
  if (options.json) {
    fmt::print("{}\n", report::ledger_json(*snapshot, options.reclaim ? std::optional<std::size_t>(reclaimed) : std::nullopt));
  } else {
    print_text(*snapshot, options, reclaimed);
  }
  return 0;
}

[[maybe_unused]] const bool registered = register_command(
    "ledger", "Show the processes sharing a device through its ledger (like nvidia-smi for pools)",
    [](CLI::App& app) -> Run {
      auto options = std::make_shared<LedgerCommandOptions>();
      app.add_option("--device", options->device,
                     "The device: its id (e.g. host:host, a GPU's UUID), or the ledger's segment name "
                     "(/tidepool-...); default: the configured device (TIDEPOOL_DEVICE)");
      app.add_flag("--json", options->json, "Print the same as JSON");
      app.add_flag("--reclaim", options->reclaim,
                   "Clear the entries of processes that died first, and say how many");
      return [options] { return run_ledger(*options); };
    });

}  // namespace
}  // namespace tidepool::cli
