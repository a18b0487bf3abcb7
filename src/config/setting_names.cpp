// The list of tidepool's settings, and the config string that sets them by key.
#include "config/setting_names.hpp"

#include <cctype>

#include "tidepool/units.hpp"

namespace tidepool {
namespace config_names {
namespace {

// The keyed settings first, in the order the bindings list their keys.
constexpr std::array<SettingName, 17> kAll = {
    kAllocator,        kDevice,      kHostCapacity, kMemFraction,       kPreallocate,       kReleaseThreshold,
    kIdleRelease,      kAliases,     kWakeWait,     kQuota,             kLedger,            kLedgerMode,
    kLedgerName,
    kInterposerOnly[0], kInterposerOnly[1], kInterposerOnly[2], kInterposerOnly[3]};

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

}  // namespace

std::string key_list() {
  std::string out;
  for (const SettingName& setting : kAll)
    if (!setting.key.empty()) out += (out.empty() ? "" : ", ") + std::string(setting.key);
  return out;
}

const SettingName* find_key(std::string_view key) {
  for (const SettingName& setting : kAll)
    if (!setting.key.empty() && setting.key == key) return &setting;
  return nullptr;
}

}  // namespace config_names

std::span<const SettingName> setting_names() noexcept { return config_names::kAll; }

Expected<KeyValues> parse_config_string(std::string_view text) {
  KeyValues settings;
  if (config_names::trim(text).empty()) return settings;
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    const std::size_t equals = entry.find('=');
    auto bad = [&](const std::string& why) {
      return Error(Errc::invalid_argument, "config string '" + format_excerpt(text) + "': entry '" +
                                               format_excerpt(entry) + "' " + why);
    };
    if (equals == std::string_view::npos) return bad("has no '=' (write key=value)");
    const std::string_view key = config_names::trim(entry.substr(0, equals));
    const std::string_view value = config_names::trim(entry.substr(equals + 1));
    if (key.empty()) return bad("has no key; keys: " + config_names::key_list());
    if (config_names::find_key(key) == nullptr)
      return bad("has an unknown key '" + format_excerpt(key) + "'; keys: " + config_names::key_list());
    for (const auto& [seen, unused] : settings)
      if (seen == key) return bad("sets '" + std::string(key) + "' a second time");
    settings.emplace_back(std::string(key), std::string(value));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return settings;
}

}  // namespace tidepool
