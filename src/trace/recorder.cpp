#include "tidepool/recorder.hpp"

#include "core/process.hpp"
#include "tidepool/trace_io.hpp"

namespace tidepool::trace {

Recorder::Recorder(std::shared_ptr<Allocator> inner, std::string trace_name)
    : inner_(std::move(inner)), start_(std::chrono::steady_clock::now()), maker_pid_(current_pid()) {
  trace_.name = std::move(trace_name);
  trace_.format = format_name(Format::tidepool);
  trace_.device_capacity = inner_->device().mem_info().total_bytes;
}

std::int64_t Recorder::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_)
      .count();
}

bool Recorder::forked() const noexcept { return current_pid() != maker_pid_; }

Expected<void*> Recorder::allocate(std::size_t bytes, Stream stream) {
  if (forked()) return inner_->allocate(bytes, stream);  // the lock may be a parent thread's
  std::lock_guard lock(mutex_);
  Expected<void*> ptr = inner_->allocate(bytes, stream);
  if (!ptr) {
    ++trace_.failed_allocs;
    return ptr;
  }
  if (*ptr == nullptr) return ptr;  // bytes == 0: no lifetime
  Event event;
  event.op = Op::alloc;
  event.block = trace_.num_blocks++;
  event.bytes = bytes;
  event.stream = stream;
  event.time_us = now_us();
  trace_.events.push_back(event);
  live_[*ptr] = Live{event.block, event.bytes};
  return ptr;
}

Status Recorder::deallocate(void* ptr, Stream stream) {
  if (forked()) return inner_->deallocate(ptr, stream);
  std::lock_guard lock(mutex_);
  Status status = inner_->deallocate(ptr, stream);
  if (!status || ptr == nullptr) return status;
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    ++trace_.unmatched_frees;
    return status;
  }
  Event event;
  event.op = Op::free;
  event.block = it->second.block;
  event.bytes = it->second.bytes;
  event.stream = stream;
  event.time_us = now_us();
  live_.erase(it);
  trace_.events.push_back(event);
  return status;
}

Trace Recorder::trace() const {
  if (forked()) {
    Trace none;
    none.name = trace_.name;  // set before the fork, never changed
    none.format = trace_.format;
    return none;
  }
  std::lock_guard lock(mutex_);
  return trace_;
}

Status Recorder::save(const std::string& path) const {
  if (forked()) {
    return Error(Errc::unsupported, "recorder of '" + trace_.name + "' was made by pid " + std::to_string(maker_pid_) +
                                        " and this process (pid " + std::to_string(current_pid()) +
                                        ") is a child forked from it: the recording is the parent's");
  }
  return write_tidepool_file(trace(), path);
}

}  // namespace tidepool::trace
