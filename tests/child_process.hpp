// Real child processes for tests (fork, then _exit) with pipes to talk to
// them, and bounded waits, so that no failure can hang the test.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace tidepool::test {

using namespace std::chrono_literals;

/// A pipe; each end closed once.
class Pipe {
 public:
  Pipe() {
    if (pipe(fds_) != 0) throw std::runtime_error("pipe failed");
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void close_read() {
    if (fds_[0] >= 0) close(fds_[0]);
    fds_[0] = -1;
  }
  void close_write() {
    if (fds_[1] >= 0) close(fds_[1]);
    fds_[1] = -1;
  }
  /// Writes a line (text + '\n').
  void write_line(const std::string& text) const {
    const std::string line = text + "\n";
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fds_[1], line.data() + done, line.size() - done);
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }
  /// Reads one line, waiting at most `timeout`; nullopt on timeout or end of file.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const std::size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd descriptor{fds_[0], POLLIN, 0};
      if (poll(&descriptor, 1, static_cast<int>(left.count())) <= 0) continue;
      // One byte at a time: several readers share a pipe, and none may take
      // another's line.
      char chunk[1];
      const ssize_t n = ::read(fds_[0], chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }
 private:
  int fds_[2] = {-1, -1};
  std::string buffer_;
};

/// A child process running `body`; its return value is the exit status. The
/// child never returns into the test framework: it leaves with _exit.
class Child {
 public:
  explicit Child(const std::function<int()>& body) {
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      int status = 111;
      try {
        status = body();
      } catch (const std::exception& error) {
        std::fprintf(stderr, "child %d: %s\n", static_cast<int>(getpid()), error.what());
      }
      std::fflush(nullptr);
      _exit(status);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int pid() const { return pid_; }
  /// Kills it with SIGKILL (kill -9) and reaps it.
  void kill9() {
    kill(pid_, SIGKILL);
    wait(5s);
  }
  /// Its exit status, waiting at most `timeout`; -1 when it did not exit in
  /// time (it is then killed), -2 when it died of a signal.
  int wait(std::chrono::milliseconds timeout) {
    if (reaped_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        reaped_ = true;
        status_ = -1;
        return status_;
      }
      std::this_thread::sleep_for(2ms);
    }
    reaped_ = true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
inline bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

}  // namespace tidepool::test
