#include "tidepool/units.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace tidepool {
namespace {

Error bad_size(std::string_view text, std::string_view why) {
  return Error(Errc::invalid_argument,
               "invalid byte size '" + format_excerpt(text) + "': " + std::string(why) +
                   " (expected a non-negative number with an optional unit B, KiB, MiB, GiB "
                   "or TiB, e.g. 80GiB)");
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

std::string format_excerpt(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "... (" + std::to_string(text.size()) + " bytes in all)";
}

Expected<std::size_t> parse_bytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return bad_size(text, "empty");
  if (s.front() == '-' || s.front() == '+') return bad_size(text, "sign not allowed");

  std::size_t digits = 0;
  bool seen_point = false;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) ||
                               (s[digits] == '.' && !seen_point))) {
    seen_point |= s[digits] == '.';
    ++digits;
  }
  std::string_view number = s.substr(0, digits);
  std::string_view unit = s.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (number.empty() || number == ".") return bad_size(text, "no number");

  std::size_t scale = 1;
  if (unit.empty() || iequals(unit, "b")) scale = 1;
  else if (iequals(unit, "k") || iequals(unit, "kb") || iequals(unit, "kib")) scale = KiB;
  else if (iequals(unit, "m") || iequals(unit, "mb") || iequals(unit, "mib")) scale = MiB;
  else if (iequals(unit, "g") || iequals(unit, "gb") || iequals(unit, "gib")) scale = GiB;
  else if (iequals(unit, "t") || iequals(unit, "tb") || iequals(unit, "tib")) scale = TiB;
  else return bad_size(text, "unknown unit '" + std::string(unit) + "'");

  if (!seen_point) {
    std::uint64_t value = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || end != number.data() + number.size())
      return bad_size(text, "number out of range");
    if (value > std::numeric_limits<std::size_t>::max() / scale)
      return bad_size(text, "too large");
    return static_cast<std::size_t>(value * scale);
  }
  // A decimal: exact enough for sizes people type ("1.5GiB").
  double value = std::strtod(std::string(number).c_str(), nullptr);
  long double bytes = static_cast<long double>(value) * static_cast<long double>(scale);
  if (!std::isfinite(static_cast<double>(bytes)) ||
      bytes > static_cast<long double>(std::numeric_limits<std::size_t>::max() / 2))
    return bad_size(text, "too large");
  return static_cast<std::size_t>(std::llround(static_cast<double>(bytes)));
}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < KiB) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  std::snprintf(buffer, sizeof buffer, "%.*f %s", decimals, value, units[unit]);
  return buffer;
}

std::string format_address(std::uintptr_t address) {
  char buffer[2 + 16 + 1];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(address));
  return buffer;
}

std::string format_address(const void* address) {
  return format_address(reinterpret_cast<std::uintptr_t>(address));
}

std::string format_gpu_uuid(const char (&bytes)[16]) {
  std::string out = "GPU-";
  char digits[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(bytes[i]));
    out += digits;
  }
  return out;
}

}  // namespace tidepool
