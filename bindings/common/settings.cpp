#include "settings.hpp"

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>

#include "tidepool/units.hpp"

namespace tidepool::bindings {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

std::string key_list() {
  std::string out;
  for (const auto& [key, variable] : setting_keys()) out += (out.empty() ? "" : ", ") + std::string(key);
  return out;
}

std::optional<std::string_view> variable_of(std::string_view key) {
  for (const auto& [name, variable] : setting_keys())
    if (name == key) return variable;
  return std::nullopt;
}

/// The config layer's message with every variable name replaced by its key.
std::string in_keys(std::string message) {
  for (const auto& [key, variable] : setting_keys()) {
    for (std::size_t at = message.find(variable); at != std::string::npos;
         at = message.find(variable, at + key.size()))
      message.replace(at, variable.size(), key);
  }
  return message;
}

}  // namespace

const std::vector<std::pair<std::string_view, std::string_view>>& setting_keys() {
  static const std::vector<std::pair<std::string_view, std::string_view>> keys = {
      {"mode", "TIDEPOOL_ALLOCATOR"},
      {"device", "TIDEPOOL_DEVICE"},
      {"capacity", "TIDEPOOL_HOST_CAPACITY"},
      {"mem_fraction", "TIDEPOOL_MEM_FRACTION"},
      {"preallocate", "TIDEPOOL_PREALLOCATE"},
      {"release_threshold", "TIDEPOOL_RELEASE_THRESHOLD"},
      {"idle_release", "TIDEPOOL_IDLE_RELEASE"},
      {"wake_wait", "TIDEPOOL_WAKE_WAIT"},
      {"quota", "TIDEPOOL_QUOTA"},
      {"ledger", "TIDEPOOL_LEDGER"},
      {"ledger_mode", "TIDEPOOL_LEDGER_MODE"},
  };
  return keys;
}

Expected<Settings> parse_config_string(std::string_view text) {
  Settings settings;
  if (trim(text).empty()) return settings;
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
    const std::string_view key = trim(entry.substr(0, equals));
    const std::string_view value = trim(entry.substr(equals + 1));
    if (key.empty()) return bad("has no key; keys: " + key_list());
    if (!variable_of(key)) return bad("has an unknown key '" + format_excerpt(key) + "'; keys: " + key_list());
    for (const auto& [seen, unused] : settings)
      if (seen == key) return bad("sets '" + std::string(key) + "' a second time");
    settings.emplace_back(std::string(key), std::string(value));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return settings;
}

Expected<Config> config_from_settings(const Settings& settings) {
  for (const auto& [key, value] : settings)
    if (!variable_of(key))
      return Error(Errc::invalid_argument, "unknown setting '" + key + "'; keys: " + key_list());
  const GetEnv lookup = [&settings](const char* name) -> const char* {
    for (const auto& [key, value] : settings)
      if (*variable_of(key) == name) return value.c_str();
    return nullptr;
  };
  auto config = Config::from_env(lookup);
  if (!config) return Error(config.error().code(), in_keys(config.error().message()));
  // Later messages (make_device's, make_allocator's) name a setting by its
  // source: make that the key too.
  for (std::string* source :
       {&config->mode.source, &config->mem_fraction.source, &config->preallocate.source,
        &config->device.source, &config->host_capacity.source, &config->release_threshold.source,
        &config->idle_release.source, &config->wake_wait.source, &config->quota.source, &config->ledger.source, &config->ledger_mode.source})
    *source = in_keys(std::move(*source));
  for (std::string& text : config->warnings) text = in_keys(std::move(text));
  for (std::string& text : config->notes) text = in_keys(std::move(text));
  return config;
}

OomWords key_words(const Config& config) {
  return config.oom_words([](std::string_view variable) {
    for (const auto& [key, name] : setting_keys())
      if (name == variable) return std::string(key);
    return std::string(variable);
  });
}

Expected<Stack> make_stack(const Config& config, OomWords words) {
  auto device = make_device(config);
  if (!device) return std::move(device).error();
  auto allocator = make_allocator(config, *device);
  if (!allocator) return std::move(allocator).error();
  Stack stack;
  stack.device = std::move(*device);
  stack.allocator = std::move(*allocator);
  stack.words = std::move(words);
  return stack;
}

}  // namespace tidepool::bindings
