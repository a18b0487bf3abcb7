// RMM's logging_resource_adaptor log. It writes the header
// `Thread,Time,Action,Pointer,Size,Stream`, then per call a line in the
// logger pattern `%t,%H:%M:%S.%f,%v` (thread id, wall-clock time with
// microseconds) whose message is `allocate,%p,%zu,STREAM`,
// `allocate failure,%p,%zu,STREAM` or `free,%p,%zu,STREAM`. %p prints
// `0x...` (or `(nil)` for null in glibc); the stream is printed with
// std::hex, so hex with `0x` here, while older versions and RMM's own replay
// parser also take a decimal stream.
#include <map>
#include <string>

#include "tidepool/trace_io.hpp"
#include "tidepool/units.hpp"
#include "trace/live_ranges.hpp"
#include "trace/live_at_start.hpp"
#include "trace/text_lines.hpp"

namespace tidepool::trace {
namespace {

constexpr std::string_view kHeader = "Thread,Time,Action,Pointer,Size,Stream";
constexpr std::int64_t kMicrosecondsPerDay = 86'400'000'000;

// HH:MM:SS.ffffff -> microseconds since midnight.
std::optional<std::int64_t> parse_time(std::string_view field) {
  if (field.size() < 8 || field[2] != ':' || field[5] != ':') return std::nullopt;
  auto hours = text::parse_unsigned(field.substr(0, 2));
  auto minutes = text::parse_unsigned(field.substr(3, 2));
  std::string_view rest = field.substr(6);
  const std::size_t dot = rest.find('.');
  auto seconds = text::parse_unsigned(rest.substr(0, dot));
  if (!hours || !minutes || !seconds || *hours > 23 || *minutes > 59 || *seconds > 60) return std::nullopt;
  std::int64_t micros = 0;
  if (dot != std::string_view::npos) {
    std::string_view fraction = rest.substr(dot + 1);
    if (fraction.empty() || fraction.size() > 9) return std::nullopt;
    auto digits = text::parse_unsigned(fraction);
    if (!digits) return std::nullopt;
    micros = static_cast<std::int64_t>(*digits);
    // Scale to six digits (spdlog's %f): ".5" is 500000 us, ".123456789" 123456 us.
    for (std::size_t i = fraction.size(); i < 6; ++i) micros *= 10;
    for (std::size_t i = 6; i < fraction.size(); ++i) micros /= 10;
  }
  return ((static_cast<std::int64_t>(*hours) * 60 + static_cast<std::int64_t>(*minutes)) * 60 +
          static_cast<std::int64_t>(*seconds)) * 1'000'000 + micros;
}

// A %p pointer: 0x-prefixed hex, bare hex (RMM's parser reads base 16), or (nil).
std::optional<std::uint64_t> parse_pointer(std::string_view field) {
  if (field == "(nil)") return 0;
  if (field.starts_with("0x") || field.starts_with("0X")) field.remove_prefix(2);
  return text::parse_unsigned(field, 16);
}

// A stream: 0x-prefixed hex, else decimal.
std::optional<std::uint64_t> parse_stream(std::string_view field) {
  if (field == "(nil)") return 0;
  if (field.starts_with("0x") || field.starts_with("0X")) return text::parse_unsigned(field.substr(2), 16);
  return text::parse_unsigned(field);
}

}  // namespace

Expected<Trace> read_rmm_csv(std::string_view data, std::string name) {
  text::Lines lines(data);
  std::size_t column = 1;
  auto fail = [&](const std::string& what) {
    return Error(Errc::corrupt_data, name + ": line " + std::to_string(lines.number()) + ", column " +
                                         std::to_string(column) + ": " + what);
  };
  std::optional<std::string_view> line = lines.next();
  if (!line) {
    return Error(Errc::corrupt_data, name + ": the log is empty (expected the header '" + std::string{kHeader} + "')");
  }
  if (line->starts_with("\xEF\xBB\xBF")) line->remove_prefix(3);
  if (*line != kHeader) return fail("the header must be '" + std::string{kHeader} + "'");

  Trace trace;
  trace.name = name;
  trace.format = format_name(Format::rmm_csv);
  struct Live {
    std::uint32_t block;
    std::uint64_t bytes;
    std::size_t line;
  };
  std::map<std::uint64_t, Live> live;  // by pointer, ordered for the overlap rule
  detail::LiveAtStart live_at_start;
  std::int64_t day_offset = 0;
  std::int64_t previous_time = -1;

  while ((line = lines.next())) {
    if (line->empty()) continue;
    // Six comma-separated fields; the column of each for errors.
    std::string_view fields[6];
    std::size_t columns[6];
    std::size_t count = 0;
    for (std::size_t pos = 0;;) {
      const std::size_t comma = line->find(',', pos);
      const std::size_t end = comma == std::string_view::npos ? line->size() : comma;
      if (count == 6) {
        column = pos + 1;
        return fail("more than 6 fields (Thread,Time,Action,Pointer,Size,Stream)");
      }
      columns[count] = pos + 1;
      fields[count++] = line->substr(pos, end - pos);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
    column = 1;
    if (count != 6) return fail("6 fields expected (Thread,Time,Action,Pointer,Size,Stream), found " + std::to_string(count));
    auto bad = [&](std::size_t index, const char* what) {
      column = columns[index];
      return fail(std::string{what} + ", found '" + format_excerpt(fields[index]) + "'");
    };

    if (!text::parse_unsigned(fields[0])) return bad(0, "Thread must be a decimal thread id");
    std::optional<std::int64_t> time = parse_time(fields[1]);
    if (!time) return bad(1, "Time must be HH:MM:SS.ffffff");
    // The log has no date: a time far below the last one is the next day.
    if (previous_time >= 0 && *time + day_offset < previous_time - kMicrosecondsPerDay / 2) {
      day_offset += kMicrosecondsPerDay;
    }
    const std::int64_t time_us = *time + day_offset;
    previous_time = time_us;

    const std::string_view action = fields[2];
    const bool is_alloc = action == "allocate";
    const bool is_failure = action == "allocate failure";
    if (!is_alloc && !is_failure && action != "free") {
      return bad(2, "Action must be 'allocate', 'allocate failure' or 'free'");
    }
    std::optional<std::uint64_t> pointer = parse_pointer(fields[3]);
    if (!pointer) return bad(3, "Pointer must be a hex pointer (0x...) or (nil)");
    std::optional<std::uint64_t> size = text::parse_unsigned(fields[4]);
    if (!size) return bad(4, "Size must be a decimal byte count");
    std::optional<std::uint64_t> stream = parse_stream(fields[5]);
    if (!stream) return bad(5, "Stream must be a hex (0x...) or decimal stream handle");

    if (is_failure) {
      ++trace.failed_allocs;
      trace.failures.push_back({trace.events.size(), *size, time_us});
      continue;
    }
    Event event;
    event.stream = static_cast<Stream>(*stream);
    event.time_us = time_us;
    if (*pointer == 0) {  // allocate(0) may return null, and freeing null does nothing
      if (is_alloc && *size != 0) return bad(3, "allocate of a non-zero size returned a null pointer");
      continue;
    }
    if (is_alloc) {
      column = columns[3];
      if (*size > ~*pointer)
        return fail("allocate of " + std::to_string(*size) + " bytes at " + std::string{fields[3]} + " ends past 2^64");
      if (auto it = overlapping(live, *pointer, *size); it != live.end()) {
        if (it->first == *pointer)
          return fail("allocate returns " + std::string{fields[3]} + ", which is live since line " +
                      std::to_string(it->second.line));
        return fail("allocate of " + std::to_string(*size) + " bytes at " + std::string{fields[3]} +
                    " overlaps the live block of " + std::to_string(it->second.bytes) + " bytes at " +
                    format_address(it->first) + " allocated at line " + std::to_string(it->second.line));
      }
      column = 1;
      live.emplace(*pointer, Live{trace.num_blocks, *size, lines.number()});
      event.op = Op::alloc;
      event.block = trace.num_blocks++;
      event.bytes = *size;
    } else {
      auto it = live.find(*pointer);
      if (it == live.end()) {  // allocated before the log began: live at the start
        ++trace.unmatched_frees;
        trace.events.push_back(live_at_start.free_of_unrecorded(trace, *size, event.stream, time_us));
        continue;
      }
      if (it->second.bytes != *size) {
        column = columns[4];
        return fail("free of " + std::string{fields[3]} + " with " + std::to_string(*size) +
                    " bytes, allocated with " + std::to_string(it->second.bytes) + " at line " +
                    std::to_string(it->second.line));
      }
      event.op = Op::free;
      event.block = it->second.block;
      event.bytes = it->second.bytes;
      live.erase(it);
    }
    trace.events.push_back(event);
  }
  live_at_start.prepend_to(trace);
  return trace;
}

}  // namespace tidepool::trace
