// What the C ABI and Python share: a Config (from a config string, keyword
// arguments or the environment) turned into a pool and its device, with the
// names the caller's OOM advice uses. Settings by key are the config layer's
// (parse_config_string, Config::from_keys), which words every message in keys.
#pragma once

#include <memory>

#include "tidepool/config.hpp"
#include "tidepool/error.hpp"
#include "tidepool/stack.hpp"

namespace tidepool::bindings {

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

/// make_device then make_allocator; the OOM advice names the settings as
/// `config` does (its variables, or its keys: Config::oom_words()).
Expected<Stack> make_stack(const Config& config);

}  // namespace tidepool::bindings
