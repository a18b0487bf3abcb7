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

std::string oom_advice(OomAdvice advice, const OomWords& words) {
  switch (advice) {
    case OomAdvice::none: return {};
    case OomAdvice::raise_limit: return words.limit.empty() ? std::string() : "raise " + words.limit;
    case OomAdvice::free_or_raise_limit:
      return words.limit.empty() ? "free memory" : "free memory, or raise " + words.limit;
    case OomAdvice::lower_limit:
      return (words.limit.empty() ? std::string() : "lower " + words.limit + " or ") + "set " + words.grow_on_demand;
    case OomAdvice::use_expandable: return words.expandable + " maps free memory into one contiguous range";
    case OomAdvice::lower_quota: return "lower " + words.quota + ", or wait for one of them to exit";
  }
  return {};
}

std::string OomReport::worded_hint(const OomWords& words) const {
  const std::string advised = oom_advice(advice, words);
  if (advised.empty()) return hint;
  return hint.empty() ? advised : hint + "; " + advised;
}

Error Error::out_of_memory(std::string_view who, OomReport report, const OomWords& words) {
  std::string message = std::string(who) + ": out of memory allocating " +
                        format_bytes(report.requested_bytes) + " (" +
                        std::to_string(report.requested_bytes) + " bytes); in use " +
                        format_bytes(report.bytes_in_use) + ", reserved " +
                        format_bytes(report.bytes_reserved) + ", device free " +
                        format_bytes(report.device_free_bytes) + ", largest free block " +
                        format_bytes(report.largest_free_block_bytes);
  if (const std::string hint = report.worded_hint(words); !hint.empty()) message += ". Hint: " + hint;
  Error error(Errc::out_of_memory, std::move(message));
  error.oom_ = std::move(report);
  error.oom_who_ = who;
  return error;
}

Error Error::worded(const OomWords& words) const {
  if (!oom_ || oom_->advice == OomAdvice::none) return *this;
  return out_of_memory(oom_who_, *oom_, words);
}

}  // namespace tidepool
