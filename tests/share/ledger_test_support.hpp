// What the ledger tests share: unique segment names that are removed at the
// end, and real child processes (child_process.hpp).
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "child_process.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/units.hpp"

namespace tidepool::test {

/// A segment name no other test (or test run) uses; unlinked on destruction.
class UniqueSegment {
 public:
  explicit UniqueSegment(const std::string& tag) {
    static std::atomic<int> counter{0};
    name_ = "/tidepool-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + tag;
    shm_unlink(name_.c_str());
  }
  ~UniqueSegment() { shm_unlink(name_.c_str()); }
  UniqueSegment(const UniqueSegment&) = delete;
  UniqueSegment& operator=(const UniqueSegment&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

/// A host device named `name` of `capacity` bytes with 1 MiB granules.
inline std::shared_ptr<Device> make_host(std::size_t capacity, const std::string& name = "ledger-test") {
  HostDeviceOptions options;
  options.capacity = capacity;
  options.granularity = 1 * MiB;
  options.name = name;
  auto device = HostDevice::create(options);
  if (!device) throw Exception(device.error());
  return std::move(device).value();
}

/// Ledger options for a test segment.
inline LedgerOptions ledger_options(const std::string& segment, std::size_t quota = 0) {
  LedgerOptions options;
  options.segment_name = segment;
  options.quota_bytes = quota;
  options.trim_wait = 3000ms;
  options.lock_timeout = 5000ms;
  return options;
}

}  // namespace tidepool::test
