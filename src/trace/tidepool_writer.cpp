// Writing tidepool's trace format, version 1 (docs/trace-format.md): whole
// traces (write_tidepool) and traces written while they are recorded (the
// interposer's `tidepool run --record`), with the same header and event lines.
// Apart from the reader so that the interposer links the writer alone.
#include <charconv>
#include <string>

#include "tidepool/trace_io.hpp"

namespace tidepool::trace {
namespace {

/// `value` in decimal, at least `width` digits (leading zeros).
void append_number(std::string& out, std::uint64_t value, int width = 0) {
  char buffer[24];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  (void)error;  // 24 characters hold any 64-bit number
  for (auto digits = end - buffer; digits < width; ++digits) out += '0';
  out.append(buffer, end);
}

void append_time(std::string& out, std::int64_t time_us) {
  if (time_us < 0) {
    out += '-';
    return;
  }
  append_number(out, static_cast<std::uint64_t>(time_us));
}

void append_count(std::string& out, const char* key, std::uint64_t value, int width) {
  out += key;
  out += ' ';
  append_number(out, value, width);
  out += '\n';
}

}  // namespace

void append_tidepool_header(std::string& out, const Trace& trace, std::size_t events, int count_width) {
  out += "tidepool-trace 1\n# ";
  out += trace.format.empty() ? "unknown" : trace.format;
  out += " trace, written by tidepool; format: docs/trace-format.md\nname ";
  for (char c : trace.name) out += (c == '\n' || c == '\r') ? ' ' : c;
  out += "\ndevice ";
  out += std::to_string(trace.device);
  out += '\n';
  append_count(out, "device_capacity", trace.device_capacity, 0);
  append_count(out, "unmatched_frees", trace.unmatched_frees, count_width);
  append_count(out, "seeded_blocks", trace.seeded_blocks, 0);
  append_count(out, "seeded_bytes", trace.seeded_bytes, 0);
  append_count(out, "failed_allocs", trace.failed_allocs, count_width);
  append_count(out, "blocks", trace.num_blocks, count_width);
  append_count(out, "events", events, count_width);
}

void append_tidepool_event(std::string& out, const Event& event, const EventOrigin* origin) {
  switch (event.op) {
    case Op::alloc:
      out += "a ";
      append_number(out, event.block);
      out += ' ';
      append_number(out, event.bytes);
      break;
    case Op::free:
      out += "f ";
      append_number(out, event.block);
      break;
    case Op::segment_alloc:
      out += "sa ";
      append_number(out, event.bytes);
      break;
    case Op::segment_free:
      out += "sf ";
      append_number(out, event.bytes);
      break;
  }
  out += ' ';
  append_number(out, event.stream);
  out += ' ';
  append_time(out, event.time_us);
  if (origin != nullptr && event.op == Op::alloc) {
    char buffer[20];
    auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, origin->address, 16);
    (void)error;  // 20 characters hold any 64-bit number in hex
    out += " 0x";
    out.append(buffer, end);
    out += ' ';
    append_number(out, static_cast<std::uint64_t>(origin->device));
  }
  out += '\n';
}

std::string write_tidepool(const Trace& trace) {
  std::string out;
  out.reserve(320 + trace.events.size() * 28);
  append_tidepool_header(out, trace, trace.events.size(), 0);
  for (const Event& event : trace.events) append_tidepool_event(out, event);
  return out;
}

}  // namespace tidepool::trace
