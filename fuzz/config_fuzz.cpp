// Fuzzes the configuration parser: the input is lines NAME=VALUE; every
// outcome is a Config inside its documented ranges or an error that names
// the variable it refused.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "tidepool/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string> env;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    const std::size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    std::string value(line.substr(eq + 1));
    if (value.find('\0') != std::string::npos) continue;  // an environment cannot hold NUL
    env[std::string(line.substr(0, eq))] = std::move(value);
  }
  auto config = tidepool::Config::from_env(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      tidepool::DeviceKind::host);
  if (!config) {
    const std::string& message = config.error().message();
    bool names_a_variable = false;
    for (const auto& [name, value] : env)
      names_a_variable |= !name.empty() && message.find(name) != std::string::npos;
    if (!names_a_variable) std::abort();
    return 0;
  }
  const double fraction = config->mem_fraction.value;
  if (!(fraction > 0.0 && fraction <= 1.0)) std::abort();
  if (config->host_capacity.value == 0) std::abort();
  if (config->bytes_limit(config->host_capacity.value) > config->host_capacity.value) std::abort();
  return 0;
}
