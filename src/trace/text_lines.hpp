// Line-by-line reading for the text formats (RMM CSV, tidepool): lines,
// fields and numbers, each knowing where it stands for error messages.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tidepool::trace::text {

/// Splits text into lines ('\n', with an optional '\r' before it), counting from 1.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}

  /// The next line without its end, or nullopt at the end of the text.
  std::optional<std::string_view> next() {
    if (pos_ >= text_.size()) return std::nullopt;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    std::string_view line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++number_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  }
  /// The number of the line next() returned last (1-based).
  std::size_t number() const { return number_; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t number_ = 0;
};

/// The whole of `field` as an unsigned number in `base`, or nullopt.
inline std::optional<std::uint64_t> parse_unsigned(std::string_view field, int base = 10) {
  if (field.empty()) return std::nullopt;
  std::uint64_t value = 0;
  auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value, base);
  if (error != std::errc{} || end != field.data() + field.size()) return std::nullopt;
  return value;
}

/// The whole of `field` as a signed decimal number, or nullopt.
inline std::optional<std::int64_t> parse_signed(std::string_view field) {
  if (field.empty()) return std::nullopt;
  std::int64_t value = 0;
  auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (error != std::errc{} || end != field.data() + field.size()) return std::nullopt;
  return value;
}

}  // namespace tidepool::trace::text
