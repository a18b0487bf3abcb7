// An Allocator decorator that records every allocation and free it passes
// on, as a trace in tidepool's format: run a program on it once, replay the
// trace under every mode afterwards.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tidepool/allocator.hpp"
#include "tidepool/trace.hpp"

namespace tidepool::trace {

class Recorder final : public Allocator {
 public:
  /// Records the calls made through this object and forwards each to
  /// `inner` (not null). `trace_name` names the recorded trace.
  explicit Recorder(std::shared_ptr<Allocator> inner, std::string trace_name = "recorded");

  // Allocator: every call is forwarded to the inner allocator. A successful
  // allocate of bytes > 0 starts a lifetime, a failed one counts in
  // failed_allocs; a successful deallocate ends the lifetime (a pointer the
  // inner allocator handed out before recording began counts in
  // unmatched_frees). Calls are serialized while recording, so the trace
  // holds them in the order they took effect. In a child forked after the
  // recorder was made, calls go to the inner allocator (which refuses the
  // child: docs/ledger.md, fork()) unrecorded, and take no lock.
  std::string_view name() const override { return inner_->name(); }
  Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) override;
  Status deallocate(void* ptr, Stream stream = kDefaultStream) override;
  Stats stats() const override { return inner_->stats(); }
  std::size_t trim() override { return inner_->trim(); }
  std::string dump() const override { return inner_->dump(); }
  Device& device() const override { return inner_->device(); }
  /// The inner allocator's (sleep and wake are not recorded).
  Sleepable* sleepable() noexcept override { return inner_->sleepable(); }

  /// What was recorded so far (times in microseconds since construction);
  /// lifetimes still live stay live in it. In a forked child: nothing (the
  /// recording is the parent's).
  Trace trace() const;

  /// Writes trace() to `path` in tidepool's format (unsupported in a forked child).
  Status save(const std::string& path) const;

  Allocator& inner() const { return *inner_; }

 private:
  std::int64_t now_us() const;
  bool forked() const noexcept;

  std::shared_ptr<Allocator> inner_;
  const std::chrono::steady_clock::time_point start_;
  const int maker_pid_;  // the process that made it: a forked child records nothing
  mutable std::mutex mutex_;
  Trace trace_;
  struct Live {
    std::uint32_t block;
    std::uint64_t bytes;
  };
  std::unordered_map<const void*, Live> live_;  // by pointer
};

}  // namespace tidepool::trace
