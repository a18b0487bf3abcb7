#include "pool_summary.hpp"

#include <fstream>
#include <utility>

#include "tidepool/units.hpp"

namespace tidepool::preload {

PoolSummary PoolSummary::of(int device, std::string mode, const Stats& stats, std::int64_t peak_live_bytes) {
  PoolSummary summary;
  summary.device = device;
  summary.mode = std::move(mode);
  summary.allocations = stats.num_allocs;
  summary.peak_live_bytes = peak_live_bytes;
  summary.peak_reserved_bytes = stats.peak_bytes_reserved;
  summary.device_calls = stats.num_device_allocs + stats.num_device_frees + stats.num_maps + stats.num_unmaps;
  summary.ooms = stats.num_ooms;
  summary.stats = stats;
  return summary;
}

std::string PoolSummary::text() const {
  return "pool " + mode + " on device " + std::to_string(device) + ": " + std::to_string(allocations) +
         " allocations, peak live " + format_bytes(static_cast<std::size_t>(peak_live_bytes)) + ", peak reserved " +
         format_bytes(static_cast<std::size_t>(peak_reserved_bytes)) + ", " + std::to_string(device_calls) +
         " device calls, " + std::to_string(ooms) + " OOMs";
}

Status PoolSummary::write(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  out << "{\"device\": " << device << ", \"mode\": \"" << mode << "\", \"allocations\": " << allocations
      << ", \"peak_live_bytes\": " << peak_live_bytes << ", \"peak_reserved_bytes\": " << peak_reserved_bytes
      << ", \"device_calls\": " << device_calls << ", \"ooms\": " << ooms << ", \"stats\": {";
  const char* separator = "";
  for (const auto& [name, value] : stats.items()) {
    out << separator << '"' << name << "\": " << value;
    separator = ", ";
  }
  out << "}}\n";
  out.close();
  if (!out) return Error(Errc::io_error, "cannot write '" + path + "'");
  return {};
}

}  // namespace tidepool::preload
