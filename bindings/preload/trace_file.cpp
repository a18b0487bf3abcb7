#include "trace_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tidepool/trace_io.hpp"

namespace tidepool::preload {
namespace {

// The buffer's state in one word, so that a signal handler sees the bytes
// and the counts of the same whole lines: bytes | events << 21 | blocks << 42.
constexpr int kFieldBits = 21;
constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << kFieldBits) - 1;
std::uint64_t pack(std::uint64_t bytes, std::uint64_t events, std::uint64_t blocks) {
  return bytes | events << kFieldBits | blocks << (2 * kFieldBits);
}
std::uint64_t bytes_of(std::uint64_t state) { return state & kFieldMask; }
std::uint64_t events_of(std::uint64_t state) { return (state >> kFieldBits) & kFieldMask; }
std::uint64_t blocks_of(std::uint64_t state) { return state >> (2 * kFieldBits); }

std::int64_t now_us() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);  // wall time: a child's trace lines up with its parent's
  return static_cast<std::int64_t>(now.tv_sec) * 1000000 + now.tv_nsec / 1000;
}

/// write(2) of all `bytes` at the file offset; false on an error.
bool write_all(int fd, const char* data, std::size_t bytes) noexcept {
  while (bytes > 0) {
    const ssize_t done = ::write(fd, data, bytes);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    data += done;
    bytes -= static_cast<std::size_t>(done);
  }
  return true;
}

/// Overwrites the `width` digits at `at` with `value`, leading zeros.
void put_digits(char* at, int width, std::uint64_t value) noexcept {
  for (int i = width - 1; i >= 0; --i, value /= 10) at[i] = static_cast<char>('0' + value % 10);
}

// --- SIGTERM and SIGINT: flush, then what the program would have done ------

TraceFile* g_signal_trace = nullptr;
struct sigaction g_previous[2];
constexpr int kSignals[2] = {SIGTERM, SIGINT};

void on_signal(int signal, siginfo_t* info, void* context) {
  const int index = signal == SIGTERM ? 0 : 1;
  if (g_signal_trace != nullptr) g_signal_trace->flush_from_signal();
  const struct sigaction& previous = g_previous[index];
  if ((previous.sa_flags & SA_SIGINFO) != 0 && previous.sa_sigaction != nullptr) {
    previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler == SIG_DFL) {
    ::signal(signal, SIG_DFL);  // terminate as without tidepool
    ::raise(signal);
  } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != nullptr) {
    previous.sa_handler(signal);
  }
}

/// Installed once; a program that installs its own handler later replaces
/// this one (Python's SIGINT: KeyboardInterrupt, then exit flushes).
void install_signal_handlers(TraceFile* trace) {
  g_signal_trace = trace;
  for (int i = 0; i < 2; ++i) {
    struct sigaction action{};
    action.sa_sigaction = on_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(kSignals[i], &action, &g_previous[i]);
  }
}

}  // namespace

TraceFile* TraceFile::from_env() {
  static TraceFile* const trace = []() -> TraceFile* {
    const char* file = std::getenv("TIDEPOOL_RECORD");
    if (file == nullptr || *file == '\0') return nullptr;
    auto* created = new TraceFile(file);
    install_signal_handlers(created);
    return created;
  }();
  return trace;
}

std::string file_of_this_process(const std::string& file) {
  const char* started = std::getenv("TIDEPOOL_RUN_PID");
  if (started != nullptr && std::to_string(::getpid()) == started) return file;
  return file + "." + std::to_string(::getpid());
}

TraceFile::TraceFile(std::string path) : base_path_(std::move(path)), path_(file_of_this_process(base_path_)) {
  line_.reserve(128);
}

void TraceFile::allocated(bool physical, unsigned long long key, std::size_t bytes, CUstream stream,
                          CUdevice device) {
  std::lock_guard lock(mutex_);
  trace::Event event{trace::Op::alloc};
  event.block = static_cast<std::uint32_t>(blocks_.load(std::memory_order_relaxed));
  event.bytes = bytes;
  event.stream = reinterpret_cast<Stream>(stream);
  const trace::EventOrigin origin{physical ? 0 : key, device};
  if (append(event, &origin)) live_[physical][key] = event.block;
}

void TraceFile::failed_allocation() { failed_allocs_.fetch_add(1, std::memory_order_relaxed); }

void TraceFile::freed(bool physical, unsigned long long key, CUstream stream) {
  std::lock_guard lock(mutex_);
  auto& live = live_[physical];
  auto it = live.find(key);
  if (it == live.end()) {
    unmatched_frees_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  trace::Event event{trace::Op::free};
  event.block = it->second;
  event.stream = reinterpret_cast<Stream>(stream);
  live.erase(it);
  append(event, nullptr);
}

/// Under the lock: one line into the buffer, which is written first when it
/// has no room for it. False when nothing is recorded (the file failed, or
/// after exit).
bool TraceFile::append(const trace::Event& event, const trace::EventOrigin* origin) {
  if (failed_ || closed_ || !open_locked()) return false;
  trace::Event timed = event;
  timed.time_us = now_us();
  line_.clear();
  trace::append_tidepool_event(line_, timed, origin);
  std::uint64_t state = buffered_.load(std::memory_order_relaxed);
  if (bytes_of(state) + line_.size() > kBufferBytes) {
    write_buffer();
    write_counts();
    state = buffered_.load(std::memory_order_relaxed);
  }
  std::memcpy(buffer_ + bytes_of(state), line_.data(), line_.size());
  const bool alloc = event.op == trace::Op::alloc;
  if (alloc) blocks_.fetch_add(1, std::memory_order_relaxed);
  events_.fetch_add(1, std::memory_order_relaxed);
  buffered_.store(pack(bytes_of(state) + line_.size(), events_of(state) + 1, blocks_of(state) + (alloc ? 1 : 0)),
                  std::memory_order_release);
  return true;
}

/// Under the lock: opens the file and writes an empty trace's header.
bool TraceFile::open_locked() {
  if (fd_.load(std::memory_order_relaxed) >= 0) return true;
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "tidepool: error: --record: cannot write '%s': %s; nothing is recorded\n", path_.c_str(),
                 std::strerror(errno));
    failed_ = true;
    return false;
  }
  trace::Trace header;
  header.name = path_;
  header.format = "cuda-driver";
  header_.clear();
  trace::append_tidepool_header(header_, header, 0, kCountWidth);
  auto digits_of = [&](const char* key) { return header_.find(std::string("\n") + key + ' ') + std::strlen(key) + 2; };
  unmatched_at_ = digits_of("unmatched_frees");
  failed_at_ = digits_of("failed_allocs");
  blocks_at_ = digits_of("blocks");
  events_at_ = digits_of("events");
  if (!write_all(fd, header_.data(), header_.size())) {
    std::fprintf(stderr, "tidepool: error: --record: cannot write '%s': %s\n", path_.c_str(), std::strerror(errno));
    ::close(fd);
    failed_ = true;
    return false;
  }
  fd_.store(fd, std::memory_order_release);
  return true;
}

void TraceFile::write_buffer() noexcept {
  const std::uint64_t state = buffered_.load(std::memory_order_acquire);
  const int fd = fd_.load(std::memory_order_acquire);
  if (fd < 0 || bytes_of(state) == 0) return;
  if (!write_all(fd, buffer_, bytes_of(state))) return;  // the header keeps the last whole count
  written_events_.fetch_add(events_of(state), std::memory_order_relaxed);
  written_blocks_.fetch_add(blocks_of(state), std::memory_order_relaxed);
  buffered_.store(0, std::memory_order_release);
}

/// Rewrites the header's counts to say what the file holds.
void TraceFile::write_counts() noexcept {
  const int fd = fd_.load(std::memory_order_acquire);
  if (fd < 0 || header_.empty()) return;
  char* header = header_.data();
  put_digits(header + unmatched_at_, kCountWidth, unmatched_frees_.load(std::memory_order_relaxed));
  put_digits(header + failed_at_, kCountWidth, failed_allocs_.load(std::memory_order_relaxed));
  put_digits(header + blocks_at_, kCountWidth, written_blocks_.load(std::memory_order_relaxed));
  put_digits(header + events_at_, kCountWidth, written_events_.load(std::memory_order_relaxed));
  (void)!::pwrite(fd, header, header_.size(), 0);
}

void TraceFile::flush(bool last) {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  const bool started_by_run = path_ == base_path_;
  // The process `tidepool run` started always leaves FILE, if empty.
  if (last && !failed_ && started_by_run) open_locked();
  write_buffer();
  write_counts();
  if (!last) return;
  closed_ = true;
  if (const int fd = fd_.exchange(-1); fd >= 0) {
    ::close(fd);
    std::fprintf(stderr, "tidepool: recorded %llu allocations (%llu events, %llu frees of memory allocated "
                 "before or elsewhere) to %s\n",
                 static_cast<unsigned long long>(written_blocks_.load()),
                 static_cast<unsigned long long>(written_events_.load()),
                 static_cast<unsigned long long>(unmatched_frees_.load()), path_.c_str());
  }
}

void TraceFile::flush_from_signal() noexcept {
  // Another thread holding the lock finishes its line in a moment; this
  // thread's own held lock never frees: then only whole lines are written.
  bool locked = false;
  for (int tries = 0; tries < 50 && !(locked = mutex_.try_lock()); ++tries) {
    timespec pause{0, 1000000};
    nanosleep(&pause, nullptr);
  }
  write_buffer();
  write_counts();
  if (locked) mutex_.unlock();
}

void TraceFile::restart_after_fork() {
  new (&mutex_) std::mutex();  // another thread may have held it at fork
  if (const int fd = fd_.exchange(-1); fd >= 0) ::close(fd);  // the parent's file
  path_ = base_path_ + "." + std::to_string(::getpid());
  failed_ = closed_ = false;
  header_.clear();
  buffered_.store(0);
  for (auto* count : {&blocks_, &events_, &unmatched_frees_, &failed_allocs_, &written_events_, &written_blocks_})
    count->store(0);
  for (auto& live : live_) live.clear();  // the parent's lifetimes: their frees here are unmatched
}

}  // namespace tidepool::preload
