#include "share/process_identity.hpp"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>

namespace tidepool::share {

std::optional<ProcessIdentity> read_process_identity(int pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  if (!file) return std::nullopt;
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string stat = buffer.str();
  // Field 2 is "(comm)" and comm may hold spaces and parentheses: the fields
  // after it start after the last ')'.
  const std::size_t open = stat.find('(');
  const std::size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcessIdentity identity;
  identity.pid = pid;
  identity.command = stat.substr(open + 1, close - open - 1);
  // Fields 3.. follow: field 3 is the state, field 22 the start time.
  std::string_view rest(stat);
  rest.remove_prefix(close + 1);
  int field = 2;
  std::string_view state;
  while (!rest.empty() && field < 22) {
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const std::size_t end = std::min(rest.find(' '), rest.size());
    ++field;
    const std::string_view value = rest.substr(0, end);
    if (field == 3) state = value;
    if (field == 22) {
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(),
                                             identity.start_time);
      if (ec != std::errc()) return std::nullopt;
      (void)ptr;
    }
    rest.remove_prefix(end);
  }
  if (field != 22) return std::nullopt;
  if (state == "Z" || state == "X") return std::nullopt;  // dead, not yet reaped
  return identity;
}

const ProcessIdentity& self_identity() {
  static std::mutex mutex;
  static ProcessIdentity cached;
  std::lock_guard lock(mutex);
  const int pid = static_cast<int>(getpid());
  if (cached.pid != pid) {
    if (auto identity = read_process_identity(pid)) {
      cached = *identity;
    } else {
      cached = ProcessIdentity{pid, 0, "?"};  // no /proc: pid alone
    }
  }
  return cached;
}

bool process_alive(int pid, std::uint64_t start_time) {
  const auto identity = read_process_identity(pid);
  return identity && identity->start_time == start_time;
}

}  // namespace tidepool::share
