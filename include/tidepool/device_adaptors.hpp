// Decorators over a Device, in the style of RMM's resource adaptors: each
// forwards to its upstream and adds one thing.
//   LimitDevice     a cap on the bytes taken (plain + physical), e.g. a memory fraction.
//   CountingDevice  call counts, failures, bytes held and mapped, time spent upstream.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tidepool/device.hpp"

namespace tidepool {

/// Refuses allocate() and create() that would take more than `limit_bytes`
/// in total (like RMM's limiting_resource_adaptor). A plain allocation counts
/// its bytes rounded up to kMinAlignment. Thread-safe: the check and the
/// count are one atomic step, so concurrent callers never pass the limit.
class LimitDevice final : public DeviceAdaptor {
 public:
  /// upstream is not null; limit_bytes may exceed the upstream's capacity
  /// (the upstream then refuses first).
  LimitDevice(std::shared_ptr<Device> upstream, std::size_t limit_bytes);

  std::string description() const override;
  /// out_of_memory naming the limit when bytes would pass it.
  Expected<void*> allocate(std::size_t bytes) override;
  Status free(void* ptr, std::size_t bytes) override;
  /// out_of_memory naming the limit when bytes would pass it.
  Expected<PhysicalHandle> create(std::size_t bytes) override;
  /// One request upstream, as the caller made it (a ledger below reserves
  /// the whole at once); out_of_memory when the whole would pass the limit.
  Expected<std::vector<PhysicalHandle>> create_many(std::size_t bytes_each, std::size_t count) override;
  Status release(PhysicalHandle handle, std::size_t bytes) override;
  /// total = min(limit, upstream total); free = min(upstream free, limit - held).
  MemInfo mem_info() const override;

  std::size_t limit_bytes() const { return limit_bytes_; }
  /// Bytes taken through this decorator and not given back.
  std::size_t held_bytes() const { return held_bytes_.load(std::memory_order_relaxed); }

 private:
  /// Counts `bytes` as held unless that would pass the limit.
  bool try_take(std::size_t bytes);
  Error over_limit(std::size_t bytes) const;

  std::size_t limit_bytes_;
  std::atomic<std::size_t> held_bytes_{0};
};

/// What CountingDevice knows about one kind of call.
struct CallCounters {
  std::uint64_t calls = 0;        // every call, failed ones included
  std::uint64_t failures = 0;     // calls the upstream answered with an error
  std::uint64_t nanoseconds = 0;  // steady_clock time inside the upstream call
};

struct DeviceCounters {
  CallCounters allocate, free, reserve, unreserve, create, map, unmap, release, synchronize, query;

  std::size_t plain_bytes_held = 0;     // live allocate() bytes (as asked)
  std::size_t physical_bytes_held = 0;  // live create() bytes
  std::size_t bytes_held = 0;           // plain + physical
  std::size_t peak_bytes_held = 0;
  std::size_t bytes_mapped = 0;         // bytes mapped now through map()
  std::size_t peak_bytes_mapped = 0;

  /// Sums over every kind of call.
  std::uint64_t total_calls() const;
  std::uint64_t total_nanoseconds() const;
};

/// Counts every call to its upstream (the replay engine's device-cost meter).
/// Thread-safe and cheap: relaxed atomics, no lock.
class CountingDevice final : public DeviceAdaptor {
 public:
  /// upstream is not null.
  explicit CountingDevice(std::shared_ptr<Device> upstream);

  Expected<void*> allocate(std::size_t bytes) override;
  Status free(void* ptr, std::size_t bytes) override;
  Expected<void*> reserve(std::size_t va_bytes) override;
  Status unreserve(void* va, std::size_t va_bytes) override;
  Expected<PhysicalHandle> create(std::size_t bytes) override;
  Status map(void* va, std::size_t bytes, PhysicalHandle handle) override;
  /// Counted as one map() per handle.
  Status map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) override;
  Status unmap(void* va, std::size_t bytes) override;
  Status release(PhysicalHandle handle, std::size_t bytes) override;
  Status synchronize(Stream stream) override;
  Expected<bool> query(Stream stream) override;

  /// A snapshot. Each field is exact; fields read while other threads call
  /// may be from slightly different moments.
  DeviceCounters counters() const;

 private:
  enum Kind { kAllocate, kFree, kReserve, kUnreserve, kCreate, kMap, kUnmap, kRelease,
              kSynchronize, kQuery, kKinds };
  struct AtomicCall {
    std::atomic<std::uint64_t> calls{0}, failures{0}, nanoseconds{0};
  };

  /// Runs `call` against the upstream, counting it under `kind`.
  template <class Call>
  auto counted(Kind kind, Call&& call);
  static void raise_peak(std::atomic<std::size_t>& peak, std::size_t value);
  void add_held(std::atomic<std::size_t>& kind_bytes, std::size_t bytes);
  void remove_held(std::atomic<std::size_t>& kind_bytes, std::size_t bytes);

  std::array<AtomicCall, kKinds> calls_;
  std::atomic<std::size_t> plain_bytes_{0}, physical_bytes_{0}, held_bytes_{0}, peak_held_{0};
  std::atomic<std::size_t> mapped_bytes_{0}, peak_mapped_{0};
};

}  // namespace tidepool
