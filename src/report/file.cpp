// Writing a report to a file, with errors that name the path.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "tidepool/report.hpp"

namespace tidepool::report {

Status write_file(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return Error(Errc::io_error, "cannot write '" + path + "': " + std::strerror(errno));
  }
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return Error(Errc::io_error, "writing '" + path + "' failed: " + std::strerror(errno));
  return {};
}

}  // namespace tidepool::report
