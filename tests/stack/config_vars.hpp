// The configuration of a map of variables, the process environment unread:
// how the stack's tests make theirs.
#pragma once

#include <map>
#include <string>

#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"

namespace tidepool::test {

using Vars = std::map<std::string, std::string>;

/// Config::from_env over `vars`, the default device probed as the stack does.
inline Expected<Config> config_of(const Vars& vars) {
  return Config::from_env([&vars](const char* name) -> const char* {
    auto found = vars.find(name);
    return found == vars.end() ? nullptr : found->second.c_str();
  });
}

}  // namespace tidepool::test
