// `tidepool info`: the device, the configuration and where each setting came
// from, how JAX's variables map onto tidepool, and the warnings.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace tidepool::cli {
namespace {

struct InfoOptions {
  bool json = false;
};

// One row of the configuration table.
struct Row {
  std::string name;
  std::string value;
  std::string source;  // "default" or the variable's name (SettingSource::source)
  std::string text;  // the text given, empty for a default
};

template <class T>
Row row(std::string name, const Setting<T>& setting, std::string value) {
  return {std::move(name), std::move(value), setting.source(), setting.text};
}

std::string fraction_text(double fraction) { return fmt::format("{:g}", fraction); }

// The ledger row's value: the segment a pool of this configuration would
// join (resolve_ledger, which registers nothing), or why there is none.
std::string ledger_text(const Config& config, const Device& device) {
  if (!config.ledger.value) return "off";
  Expected<LedgerOptions> resolved = resolve_ledger(config, LedgerDeviceFacts::of(device));
  if (!resolved) return "on (but " + resolved.error().message() + ")";
  return "on (segment " + resolved->segment_name + ")";
}

std::vector<Row> configuration_rows(const Config& config, const Device& device) {
  const std::size_t total = device.mem_info().total_bytes;
  std::vector<Row> rows;
  rows.push_back(row("mode", config.mode, std::string(mode_name(config.mode.value))));
  rows.push_back(row("mem_fraction", config.mem_fraction, fraction_text(config.mem_fraction.value)));
  rows.push_back({"bytes_limit",
                  config.mode.value == Mode::platform
                      ? "none (platform takes up to the device's capacity)"
                      : format_bytes(config.bytes_limit(total)),
                  "mem_fraction x device total", ""});
  rows.push_back(row("preallocate", config.preallocate, config.preallocate.value ? "true" : "false"));
  Row device_row = row("device", config.device, std::string(device_kind_name(config.device.value)));
  if (config.device.is_default()) device_row.source += " (" + default_device_reason() + ")";
  rows.push_back(std::move(device_row));
  rows.push_back(row("host_capacity", config.host_capacity, format_bytes(config.host_capacity.value)));
  rows.push_back(row("release_threshold", config.release_threshold,
                     config.release_threshold.value ? format_bytes(*config.release_threshold.value)
                                                    : config.mode.value == Mode::expandable
                                                          ? "keep all, until trim()"
                                                          : "the pool's default"));
  rows.push_back(row("idle_release", config.idle_release,
                     config.idle_release.value.count() > 0
                         ? std::to_string(config.idle_release.value.count()) + " ms"
                         : "never"));
  rows.push_back(row("aliases", config.aliases, config.aliases.value ? "true" : "false"));
  rows.push_back(row("wake_wait", config.wake_wait, std::to_string(config.wake_wait.value.count()) + " ms"));
  rows.push_back(row("quota", config.quota,
                     config.quota.value ? config.quota.value->to_string() : "none"));
  rows.push_back(row("ledger", config.ledger, ledger_text(config, device)));
  rows.push_back(row("ledger_mode", config.ledger_mode,
                     config.ledger_mode.value == 0660 ? "group (0660)" : "user (0600)"));
  return rows;
}

// How JAX's XLA_PYTHON_CLIENT_ALLOCATOR values run here; always shown, so a
// JAX user sees what each of their settings becomes.
const std::vector<std::pair<std::string, std::string>>& jax_mapping() {
  static const std::vector<std::pair<std::string, std::string>> mapping = {
      {"XLA_PYTHON_CLIENT_ALLOCATOR=default|bfc",
       "preallocate (growth with XLA_PYTHON_CLIENT_PREALLOCATE=false)"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR=platform", "platform"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async", "cuda_async"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR=vmm", "expandable (XLA's virtual-memory allocator)"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR=address", "platform (pass-through)"},
      {"XLA_CLIENT_MEM_FRACTION (old name XLA_PYTHON_CLIENT_MEM_FRACTION)", "mem_fraction"},
      {"XLA_PYTHON_CLIENT_PREALLOCATE", "preallocate (only false, False or 0 turn it off)"},
  };
  return mapping;
}

nlohmann::json to_json(const Config& config, const Device& device) {
  const MemInfo memory = device.mem_info();
  nlohmann::json out;
  out["version"] = TIDEPOOL_VERSION;
  out["device"] = {{"id", device.id()},
                   {"description", device.description()},
                   {"total_bytes", memory.total_bytes},
                   {"free_bytes", memory.free_bytes},
                   {"granularity", device.granularity()},
                   {"virtual_memory", device.supports_virtual_memory()}};
  nlohmann::json settings = nlohmann::json::object();
  for (const Row& r : configuration_rows(config, device))
    settings[r.name] = {{"value", r.value}, {"source", r.source}, {"text", r.text}};
  // Machine-readable values next to the table's text.
  settings["mem_fraction"]["number"] = config.mem_fraction.value;
  settings["bytes_limit"]["bytes"] =
      config.mode.value == Mode::platform ? 0 : config.bytes_limit(memory.total_bytes);
  settings["host_capacity"]["bytes"] = config.host_capacity.value;
  out["configuration"] = settings;
  nlohmann::json modes = nlohmann::json::object();
  for (Mode mode : all_modes()) {
    Status supported = mode_supported(mode, device);
    modes[std::string(mode_name(mode))] =
        supported ? nlohmann::json{{"available", true}}
                  : nlohmann::json{{"available", false}, {"reason", supported.error().message()}};
  }
  out["modes"] = modes;
  nlohmann::json mapping = nlohmann::json::array();
  for (const auto& [jax, tidepool] : jax_mapping()) mapping.push_back({{"jax", jax}, {"tidepool", tidepool}});
  out["jax_mapping"] = mapping;
  out["notes"] = config.notes;
  out["warnings"] = config.warnings;
  return out;
}

void print_text(const Config& config, const Device& device) {
  const MemInfo memory = device.mem_info();
  fmt::print("tidepool {}\n\n", TIDEPOOL_VERSION);
  fmt::print("Device\n");
  fmt::print("  {:<16} {}\n", "description", device.description());
  fmt::print("  {:<16} {}\n", "id", device.id());
  fmt::print("  {:<16} {} ({} bytes)\n", "capacity", format_bytes(memory.total_bytes),
             memory.total_bytes);
  fmt::print("  {:<16} {}\n", "free", format_bytes(memory.free_bytes));
  fmt::print("  {:<16} {}\n", "granularity", format_bytes(device.granularity()));
  fmt::print("  {:<16} {}\n\n", "virtual memory", device.supports_virtual_memory() ? "yes" : "no");

  fmt::print("Configuration\n");
  fmt::print("  {:<18} {:<30} {}\n", "setting", "value", "from");
  for (const Row& r : configuration_rows(config, device)) {
    const std::string from = r.text.empty() ? r.source : fmt::format("{}={}", r.source, r.text);
    fmt::print("  {:<18} {:<30} {}\n", r.name, r.value, from);
  }

  fmt::print("\nModes on this device\n");
  for (Mode mode : all_modes()) {
    Status supported = mode_supported(mode, device);
    fmt::print("  {:<12} {}\n", mode_name(mode),
               supported ? std::string("available") : supported.error().message());
  }

  fmt::print("\nJAX's variables in tidepool\n");
  for (const auto& [jax, tidepool] : jax_mapping()) fmt::print("  {} -> {}\n", jax, tidepool);

  if (!config.notes.empty()) {
    fmt::print("\nNotes\n");
    for (const auto& note : config.notes) fmt::print("  {}\n", note);
  }
  if (!config.warnings.empty()) {
    fmt::print("\nWarnings\n");
    for (const auto& warning : config.warnings) fmt::print("  warning: {}\n", warning);
  }
}

int run_info(const InfoOptions& options) {
  auto config = load_config(/*print_warnings=*/false);  // shown in the output instead
  if (!config) return report_error(config.error());
  // The device alone: info reads the configuration, it does not join the
  // ledger (the ledger row names the segment a pool would join).
  Config bare = *config;
  bare.ledger.value = false;
  auto device = make_device(bare);
  if (!device) return report_error(device.error());
  if (options.json) {
    fmt::print("{}\n", to_json(*config, **device).dump(2));
  } else {
    print_text(*config, **device);
  }
  return 0;
}

[[maybe_unused]] const bool registered = register_command(
    "info", "Show the device, the configuration and where each setting came from",
    [](CLI::App& app) -> Run {
      auto options = std::make_shared<InfoOptions>();
      app.add_flag("--json", options->json, "Print the same as JSON");
      return [options] { return run_info(*options); };
    });

}  // namespace
}  // namespace tidepool::cli
