#include "tidepool/error.hpp"

#include "tidepool/units.hpp"

namespace tidepool {

const char* errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::invalid_pointer: return "invalid_pointer";
    case Errc::double_free: return "double_free";
    case Errc::unsupported: return "unsupported";
    case Errc::device_error: return "device_error";
    case Errc::limit_reached: return "limit_reached";
    case Errc::corrupt_data: return "corrupt_data";
    case Errc::io_error: return "io_error";
  }
  return "unknown";
}

Error Error::out_of_memory(std::string_view who, OomReport report) {
  std::string message = std::string(who) + ": out of memory allocating " +
                        format_bytes(report.requested_bytes) + " (" +
                        std::to_string(report.requested_bytes) + " bytes); in use " +
                        format_bytes(report.bytes_in_use) + ", reserved " +
                        format_bytes(report.bytes_reserved) + ", device free " +
                        format_bytes(report.device_free_bytes) + ", largest free block " +
                        format_bytes(report.largest_free_block_bytes);
  if (!report.hint.empty()) message += ". Hint: " + report.hint;
  Error error(Errc::out_of_memory, std::move(message));
  error.oom_ = std::move(report);
  return error;
}

}  // namespace tidepool
