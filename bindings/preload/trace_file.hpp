// `tidepool run --record FILE`: the program's allocations and frees written
// to FILE in tidepool's trace format (docs/trace-format.md) as they happen,
// buffered: a syscall only when the buffer fills, at exit and at SIGTERM or
// SIGINT. After each flush the file is a whole trace (the header's counts are
// rewritten in place). docs/interop.md says what is recorded, and where
// child processes write (FILE.PID).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "driver_abi.hpp"
#include "tidepool/trace_io.hpp"

namespace tidepool::preload {

/// Where this process writes what `tidepool run` names FILE (--record,
/// TIDEPOOL_REPORT): FILE in the process it started (TIDEPOOL_RUN_PID), FILE.PID
/// in any other (its children), so that no two processes write one file.
std::string file_of_this_process(const std::string& file);

class TraceFile {
 public:
  /// The recording this process makes: TIDEPOOL_RECORD names the file;
  /// null when it is unset. Written to file_of_this_process(FILE).
  static TraceFile* from_env();

  /// A lifetime starts: cuMemAlloc* gave `key` (an address), or cuMemCreate
  /// (`physical`) gave `key` (a handle; written with address 0x0: physical
  /// memory has none until it is mapped).
  void allocated(bool physical, unsigned long long key, std::size_t bytes, CUstream stream, CUdevice device);
  /// An allocation failed (the driver's refusal or the quota's): counted.
  void failed_allocation();
  /// cuMemFree* / cuMemRelease of `key`: ends its lifetime; one this
  /// recording did not see start is counted as an unmatched free.
  void freed(bool physical, unsigned long long key, CUstream stream);

  /// Writes what is buffered and the header's counts; at exit (`last`) it
  /// closes the file and says on stderr what was recorded.
  void flush(bool last = false);
  /// flush() from a signal handler: async-signal-safe, takes no lock.
  void flush_from_signal() noexcept;
  /// In a forked child: the parent's buffer and file are the parent's; the
  /// child records into FILE.PID from here on.
  void restart_after_fork();

 private:
  explicit TraceFile(std::string path);
  bool append(const trace::Event& event, const trace::EventOrigin* origin);
  bool open_locked();
  void write_buffer() noexcept;
  void write_counts() noexcept;

  static constexpr std::size_t kBufferBytes = 64 * 1024;
  static constexpr int kCountWidth = 20;

  std::mutex mutex_;
  std::string base_path_;  // FILE as given
  std::string path_;       // FILE or FILE.PID
  std::atomic<int> fd_{-1};
  bool failed_ = false;    // could not open or write: said once, records nothing more
  bool closed_ = false;    // flushed at exit
  char buffer_[kBufferBytes];
  std::atomic<std::size_t> buffered_{0};  // bytes of buffer_ holding whole event lines
  std::string line_;                      // scratch: one event line
  // The header as first written and where its counts' digits are.
  std::string header_;
  std::size_t blocks_at_ = 0, events_at_ = 0, unmatched_at_ = 0, failed_at_ = 0;
  // Counts of what was appended (read by the signal handler).
  std::atomic<std::uint64_t> blocks_{0}, events_{0}, unmatched_frees_{0}, failed_allocs_{0};
  std::atomic<std::uint64_t> written_events_{0}, written_blocks_{0};  // what the file holds
  std::unordered_map<unsigned long long, std::uint32_t> live_[2];  // [physical]: address or handle -> block
};

}  // namespace tidepool::preload
