// Settings given by key instead of by environment variable: the C ABI's
// config string ("mode=growth,device=host,capacity=16GiB") and the Python
// keyword arguments. Each key stands for one TIDEPOOL_* variable, and the
// values go through the config layer's one parser (Config::from_env with a
// lookup that answers from the keys), so every rule and message is the same.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidepool/config.hpp"
#include "tidepool/error.hpp"
#include "tidepool/stack.hpp"

namespace tidepool::bindings {

/// key -> value, in the order given.
using Settings = std::vector<std::pair<std::string, std::string>>;

/// The keys and the variables they stand for, e.g. {"mode", "TIDEPOOL_ALLOCATOR"}.
const std::vector<std::pair<std::string_view, std::string_view>>& setting_keys();

/// Parses "key=value,key=value" (spaces around keys and values ignored; an
/// empty text is no settings). Errors (invalid_argument) name the text and
/// the entry: a missing '=', an empty or unknown key (listing the keys), a
/// key given twice.
Expected<Settings> parse_config_string(std::string_view text);

/// The configuration of `settings` alone (the process environment is not
/// read): defaults for every key not given. Errors are the config layer's,
/// with each variable's name replaced by its key ("mode='x' is invalid: ...").
Expected<Config> config_from_settings(const Settings& settings);

/// The names an out-of-memory error's advice gives the settings of a
/// config_from_settings() configuration: its keys ("raise mem_fraction").
OomWords key_words(const Config& config);

/// An allocator and the device it takes memory from, built from a Config by
/// make_device and make_allocator. Destroys the pool before the device.
struct Stack {
  std::shared_ptr<Device> device;
  std::unique_ptr<Allocator> allocator;
  OomWords words;  // the caller's names, for Error::worded

  Stack() = default;
  Stack(Stack&&) = default;
  Stack& operator=(Stack&&) = default;
  ~Stack() { allocator.reset(); }
};

/// make_device then make_allocator; `words` are the caller's names for the
/// settings (key_words() or Config::oom_words()).
Expected<Stack> make_stack(const Config& config, OomWords words);

}  // namespace tidepool::bindings
