// Writes small protocol-4 pickles for the reader tests, opcode by opcode, so
// a test can build any snapshot shape (and any malformed one) by hand.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tidepool::test::pickle {

inline std::string le(std::uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

/// An int: BININT when it fits in 32 bits, else LONG1 with 8 bytes.
inline std::string integer(std::int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) return "J" + le(static_cast<std::uint64_t>(value), 4);
  return "\x8a\x08" + le(static_cast<std::uint64_t>(value), 8);
}
inline std::string str(const std::string& text) {
  return "\x8c" + le(text.size(), 1) + text;  // SHORT_BINUNICODE
}
inline std::string none() { return "N"; }
inline std::string list(const std::vector<std::string>& items) {
  std::string out = "](";
  for (const auto& item : items) out += item;
  return out + "e";  // EMPTY_LIST MARK ... APPENDS
}
inline std::string dict(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out = "}(";
  for (const auto& [key, value] : items) out += str(key) + value;
  return out + "u";  // EMPTY_DICT MARK ... SETITEMS
}
/// A whole pickle: PROTO 4, the value, STOP.
inline std::string pickle(const std::string& value) { return std::string{"\x80\x04"} + value + "."; }

/// A snapshot trace entry.
inline std::string entry(const std::string& action, std::int64_t addr, std::int64_t size,
                         std::int64_t stream = 0, std::int64_t time_us = -1) {
  std::vector<std::pair<std::string, std::string>> items{
      {"action", str(action)}, {"addr", integer(addr)}, {"size", integer(size)}, {"stream", integer(stream)}};
  if (time_us >= 0) items.emplace_back("time_us", integer(time_us));
  items.emplace_back("frames", list({}));
  return dict(items);
}
/// A snapshot: one trace list per device and the segments at dump time.
inline std::string snapshot(const std::vector<std::vector<std::string>>& devices,
                            const std::vector<std::string>& segments = {}) {
  std::vector<std::string> traces;
  for (const auto& entries : devices) traces.push_back(list(entries));
  return pickle(dict({{"segments", list(segments)}, {"device_traces", list(traces)}}));
}
inline std::string segment(std::int64_t device, std::int64_t address, std::int64_t total_size) {
  return dict({{"device", integer(device)}, {"address", integer(address)}, {"total_size", integer(total_size)}});
}
/// A block of a segment at dump time ("active_allocated", "inactive", ...).
inline std::string block(std::int64_t address, std::int64_t size, std::int64_t requested_size,
                         const std::string& state) {
  return dict({{"address", integer(address)}, {"size", integer(size)}, {"requested_size", integer(requested_size)},
               {"state", str(state)}, {"frames", list({})}});
}
/// A segment at dump time with its blocks.
inline std::string segment(std::int64_t device, std::int64_t address, std::int64_t total_size,
                           const std::vector<std::string>& blocks) {
  return dict({{"device", integer(device)}, {"address", integer(address)}, {"total_size", integer(total_size)},
               {"stream", integer(0)}, {"blocks", list(blocks)}});
}

}  // namespace tidepool::test::pickle
