// What the pool tests share: a host device, a decorator that counts
// synchronize and query calls, and the pools by kind.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tidepool/best_fit_pool.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/passthrough_pool.hpp"
#include "tidepool/units.hpp"

namespace tidepool::test {

/// A host device of `capacity` bytes (its memory is touched only where a
/// test writes); max_mappings 0 is the device's default budget.
inline std::shared_ptr<HostDevice> host_device(std::size_t capacity = 16 * GiB, std::size_t max_mappings = 0) {
  HostDeviceOptions options;
  options.capacity = capacity;
  options.max_mappings = max_mappings;
  auto device = HostDevice::create(options);
  if (!device) throw Exception(device.error());
  return std::move(device).value();
}

/// allocate() that must succeed: a failure throws, with its message.
inline void* must_allocate(Allocator& pool, std::size_t bytes, Stream stream = kDefaultStream) {
  Expected<void*> ptr = pool.allocate(bytes, stream);
  if (!ptr) throw Exception(ptr.error());
  return *ptr;
}

/// Counts Device::synchronize calls by stream, and queries. Its streams
/// answer a query as busy (work still queued, as on a GPU that runs behind
/// the host) unless set_idle(true), so a pool must synchronize them.
class SyncCountingDevice final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  Status synchronize(Stream stream) override {
    {
      std::lock_guard lock(mutex_);
      ++calls_[stream];
    }
    return DeviceAdaptor::synchronize(stream);
  }
  Expected<bool> query(Stream) override {
    queries_.fetch_add(1, std::memory_order_relaxed);
    return idle_.load(std::memory_order_relaxed);
  }
  void set_idle(bool idle) { idle_.store(idle, std::memory_order_relaxed); }
  int queries() const { return queries_.load(std::memory_order_relaxed); }
  int calls(Stream stream) const {
    std::lock_guard lock(mutex_);
    auto found = calls_.find(stream);
    return found == calls_.end() ? 0 : found->second;
  }
  int total_calls() const {
    std::lock_guard lock(mutex_);
    int total = 0;
    for (const auto& [stream, count] : calls_) total += count;
    return total;
  }

 private:
  mutable std::mutex mutex_;
  std::map<Stream, int> calls_;
  std::atomic<int> queries_{0};
  std::atomic<bool> idle_{false};
};

/// A device whose description() and allocate() wait at a gate once armed: a
/// thread inside a pool's dump() (which asks the description under the
/// pool's lock) or growing the pool holds the pool's lock until the gate
/// opens (tests of a child forked meanwhile).
class GateDevice final : public DeviceAdaptor {
 public:
  using DeviceAdaptor::DeviceAdaptor;
  std::string description() const override {
    pass();
    return DeviceAdaptor::description();
  }
  Expected<void*> allocate(std::size_t bytes) override {
    pass();
    return DeviceAdaptor::allocate(bytes);
  }
  void arm() {
    std::lock_guard lock(mutex_);
    armed_ = true;
  }
  void wait_inside() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return inside_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  void pass() const {
    std::unique_lock lock(mutex_);
    if (!armed_) return;
    inside_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool armed_ = false;
  mutable bool inside_ = false;
  bool open_ = false;
};

enum class PoolKind { preallocate, growth, platform, expandable };

inline std::string pool_kind_name(PoolKind kind) {
  switch (kind) {
    case PoolKind::preallocate: return "preallocate";
    case PoolKind::growth: return "growth";
    case PoolKind::platform: return "platform";
    case PoolKind::expandable: return "expandable";
  }
  return "unknown";
}

/// A pool of `kind` over `device`, limited to `bytes_limit` (0: the device's total).
/// `device` limited to `bytes_limit` bytes (0: as it is), as the stack
/// limits a pool to its memory fraction.
inline std::shared_ptr<Device> limited(std::shared_ptr<Device> device, std::size_t bytes_limit) {
  if (bytes_limit == 0) return device;
  return std::make_shared<LimitDevice>(std::move(device), bytes_limit);
}

inline std::unique_ptr<Allocator> make_pool(PoolKind kind, std::shared_ptr<Device> device,
                                            std::size_t bytes_limit) {
  device = limited(std::move(device), bytes_limit);
  if (kind == PoolKind::platform) return std::make_unique<PassthroughPool>(std::move(device));
  if (kind == PoolKind::expandable) {
    auto pool = ExpandablePool::create(std::move(device));
    if (!pool) throw Exception(pool.error());
    return std::move(pool).value();
  }
  BestFitOptions options;
  options.preallocate = kind == PoolKind::preallocate;
  auto pool = BestFitPool::create(std::move(device), options);
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

struct PoolKindName {
  std::string operator()(const ::testing::TestParamInfo<PoolKind>& info) const {
    return pool_kind_name(info.param);
  }
};

}  // namespace tidepool::test
