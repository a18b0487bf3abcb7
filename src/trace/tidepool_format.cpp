// tidepool's own trace format, version 1: a magic line, a header of
// `key value` lines ending with `events N`, then one event per line.
// docs/trace-format.md is its specification.
#include <charconv>
#include <string>
#include <vector>

#include "tidepool/trace_io.hpp"
#include "trace/text_lines.hpp"

namespace tidepool::trace {
namespace {

constexpr std::string_view kMagic = "tidepool-trace 1";

// Splits a line into at most `N` space-separated fields; returns how many.
template <std::size_t N>
std::size_t split(std::string_view line, std::string_view (&fields)[N]) {
  std::size_t count = 0;
  std::size_t pos = 0;
  while (pos < line.size()) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    if (pos >= line.size()) break;
    std::size_t end = line.find(' ', pos);
    if (end == std::string_view::npos) end = line.size();
    if (count == N) return N + 1;  // too many
    fields[count++] = line.substr(pos, end - pos);
    pos = end;
  }
  return count;
}

}  // namespace

Expected<Trace> read_tidepool(std::string_view data, std::string name) {
  text::Lines lines(data);
  const std::string source = name;  // errors name the file, whatever the header calls the trace
  auto fail = [&](const std::string& what) {
    return Error(Errc::corrupt_data, source + ": line " + std::to_string(lines.number()) + ": " + what);
  };
  std::optional<std::string_view> line = lines.next();
  if (!line) return Error(Errc::corrupt_data, name + ": the file is empty (expected '" + std::string{kMagic} + "')");
  if (*line != kMagic) {
    return fail("not a tidepool trace of version 1 (the first line must be '" + std::string{kMagic} + "')");
  }

  Trace trace;
  trace.name = std::move(name);
  trace.format = format_name(Format::tidepool);
  std::optional<std::uint64_t> blocks;
  std::optional<std::uint64_t> events;
  std::vector<std::string> seen;
  // The header: `key value` lines up to and including `events N`.
  while (!events) {
    line = lines.next();
    if (!line) return fail("the header ends before its 'events' line");
    if (line->empty() || line->front() == '#') continue;
    const std::size_t space = line->find(' ');
    const std::string_view key = line->substr(0, space);
    const std::string_view value = space == std::string_view::npos ? std::string_view{} : line->substr(space + 1);
    for (const std::string& earlier : seen) {
      if (earlier == key) return fail("'" + std::string{key} + "' appears twice");
    }
    seen.emplace_back(key);
    if (key == "name") {
      if (!value.empty()) trace.name = std::string{value};
      continue;
    }
    if (key == "device") {
      std::optional<std::int64_t> device = text::parse_signed(value);
      if (!device || *device < -1 || *device > 1 << 20) return fail("device '" + std::string{value} + "' is not -1 or a device index");
      trace.device = static_cast<std::int32_t>(*device);
      continue;
    }
    std::optional<std::uint64_t> number = text::parse_unsigned(value);
    if (!number) return fail("'" + std::string{key} + "' needs a number, found '" + std::string{value} + "'");
    if (key == "device_capacity") {
      trace.device_capacity = *number;
    } else if (key == "unmatched_frees") {
      trace.unmatched_frees = *number;
    } else if (key == "seeded_blocks") {
      if (*number > 0xffffffffu) return fail("seeded_blocks " + std::to_string(*number) + " exceeds 2^32 - 1");
      trace.seeded_blocks = static_cast<std::uint32_t>(*number);
    } else if (key == "seeded_bytes") {
      trace.seeded_bytes = *number;
    } else if (key == "failed_allocs") {
      trace.failed_allocs = *number;
    } else if (key == "blocks") {
      if (*number > 0xffffffffu) return fail("blocks " + std::to_string(*number) + " exceeds 2^32 - 1");
      blocks = number;
    } else if (key == "events") {
      events = number;
    } else {
      return fail("unknown header key '" + std::string{key} + "' (version 1 knows name, device, "
                  "device_capacity, unmatched_frees, seeded_blocks, seeded_bytes, failed_allocs, blocks, events)");
    }
  }
  if (!blocks) return fail("the header has no 'blocks' line before 'events'");
  if (trace.seeded_blocks > *blocks) {
    return fail("seeded_blocks " + std::to_string(trace.seeded_blocks) + " exceeds blocks " + std::to_string(*blocks));
  }
  // Reserve no more than the text can hold (a line is at least 8 bytes).
  if (*events > data.size() / 8 + 1 || *blocks > *events) {
    return fail("the header announces " + std::to_string(*events) + " events and " + std::to_string(*blocks) +
                " blocks, more than the file holds");
  }
  trace.events.reserve(*events);
  constexpr std::uint64_t kNotLive = ~std::uint64_t{0};
  std::vector<std::uint64_t> live_bytes;  // by block
  live_bytes.reserve(*blocks);

  while ((line = lines.next())) {
    if (line->empty() || line->front() == '#') continue;
    std::string_view fields[7];
    const std::size_t count = split(*line, fields);
    Event event;
    const std::string_view kind = count > 0 ? fields[0] : std::string_view{};
    const std::size_t expected = kind == "a" ? 5 : (kind == "f" || kind == "sa" || kind == "sf") ? 4 : 0;
    if (expected == 0) return fail("unknown event '" + std::string{kind} + "' (expected a, f, sa or sf)");
    const bool with_origin = kind == "a" && count == 7;  // a BLOCK BYTES STREAM TIME ADDRESS DEVICE
    if (count != expected && !with_origin) {
      return fail("event '" + std::string{kind} + "' needs " + std::to_string(expected) +
                  (kind == "a" ? " (or 7, with ADDRESS and DEVICE)" : "") + " fields, found " +
                  (count > 7 ? std::string{"more"} : std::to_string(count)));
    }
    if (with_origin) {
      const bool hex = fields[5].size() > 2 && fields[5].substr(0, 2) == "0x";
      if (!hex || !text::parse_unsigned(fields[5].substr(2), 16))
        return fail("address '" + std::string{fields[5]} + "' is not 0x and a hexadecimal number");
      if (!text::parse_unsigned(fields[6])) return fail("device '" + std::string{fields[6]} + "' is not a device index");
    }
    std::optional<std::uint64_t> first = text::parse_unsigned(fields[1]);
    if (!first) return fail("'" + std::string{fields[1]} + "' is not a number");
    std::size_t next = 2;
    if (kind == "a") {
      std::optional<std::uint64_t> bytes = text::parse_unsigned(fields[2]);
      if (!bytes) return fail("bytes '" + std::string{fields[2]} + "' is not a number");
      if (*first != live_bytes.size() || *first >= *blocks) {
        return fail("allocates block " + std::string{fields[1]} + ", expected block " +
                    std::to_string(live_bytes.size()) + " (blocks are numbered in alloc order, fewer than " +
                    std::to_string(*blocks) + ")");
      }
      event.op = Op::alloc;
      event.block = static_cast<std::uint32_t>(*first);
      event.bytes = *bytes;
      live_bytes.push_back(*bytes);
      next = 3;
    } else if (kind == "f") {
      if (*first >= live_bytes.size() || live_bytes[*first] == kNotLive) {
        return fail("frees block " + std::string{fields[1]} + ", which is not live");
      }
      event.op = Op::free;
      event.block = static_cast<std::uint32_t>(*first);
      event.bytes = live_bytes[*first];
      live_bytes[*first] = kNotLive;
    } else {
      event.op = kind == "sa" ? Op::segment_alloc : Op::segment_free;
      event.bytes = *first;
      trace.has_segments = true;
    }
    std::optional<std::uint64_t> stream = text::parse_unsigned(fields[next]);
    if (!stream) return fail("stream '" + std::string{fields[next]} + "' is not a number");
    event.stream = static_cast<Stream>(*stream);
    if (fields[next + 1] != "-") {
      std::optional<std::uint64_t> time_us = text::parse_unsigned(fields[next + 1]);
      if (!time_us || *time_us > static_cast<std::uint64_t>(INT64_MAX)) {
        return fail("time '" + std::string{fields[next + 1]} + "' is not a number of microseconds or '-'");
      }
      event.time_us = static_cast<std::int64_t>(*time_us);
    }
    if (trace.events.size() == *events) return fail("more events than the " + std::to_string(*events) + " announced");
    trace.events.push_back(event);
  }
  if (trace.events.size() != *events || live_bytes.size() != *blocks) {
    return fail("the file ends after " + std::to_string(trace.events.size()) + " events and " +
                std::to_string(live_bytes.size()) + " blocks; the header announces " + std::to_string(*events) +
                " and " + std::to_string(*blocks));
  }
  trace.num_blocks = static_cast<std::uint32_t>(*blocks);
  // What the line checks above do not cover (segment frees within what is held).
  if (Expected<TraceSummary> summary = summarize(trace); !summary) return std::move(summary).error();
  return trace;
}

}  // namespace tidepool::trace
