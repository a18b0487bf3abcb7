// The soak workload's own checks: every pool the config layer builds runs it
// clean for a moment, and pools broken on purpose (overlapping blocks, a
// scribbled byte, stats that lie, a free that is dropped) are each caught as
// the violation they are.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "soak/soak_workload.hpp"
#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"

namespace tidepool::soak {
namespace {

SoakOptions short_run(unsigned threads = 2) {
  SoakOptions options;
  options.seconds = 0.4;
  options.threads = threads;
  options.max_block_bytes = 2 * MiB;
  options.live_blocks_per_thread = 64;
  options.check_period = std::chrono::milliseconds(50);
  return options;
}

Config host_config(std::size_t capacity = 256 * MiB) {
  Config config;
  config.host_capacity.value = capacity;
  config.device.value = DeviceKind::host;
  return config;
}

std::string violations_text(const SoakResult& r) {
  std::string text;
  for (const Violation& v : r.violations) text += std::string(violation_kind_name(v.kind)) + ": " + v.detail + "\n";
  return text;
}

TEST(SoakWorkload, EveryModeOnTheHostDeviceRunsClean) {
  const Config config = host_config();
  int ran = 0;
  for (Mode mode : all_modes()) {
    auto device = make_device(config);
    ASSERT_TRUE(device) << device.error().message();
    if (!mode_supported(mode, **device)) continue;
    const SoakResult r = run_soak(
        *device, [&](std::shared_ptr<Device> d) { return make_allocator(mode, config, std::move(d)); }, short_run());
    ++ran;
    EXPECT_TRUE(r.clean()) << mode_name(mode) << "\n" << violations_text(r);
    EXPECT_GT(r.allocations, 100u) << mode_name(mode);
    EXPECT_EQ(r.final_stats.num_allocs, static_cast<std::int64_t>(r.allocations)) << mode_name(mode);
    EXPECT_GT(r.checkpoints, 1u) << mode_name(mode);
    EXPECT_GT(r.bytes_verified, 0u) << mode_name(mode);
  }
  EXPECT_GE(ran, 3);  // preallocate, growth, platform at least
}

TEST(SoakWorkload, NearCapacityOomsAreCountedNotViolations) {
  // 4 MiB at 0.75: a 3 MiB limit with 2 MiB granules, while 1 request in 20
  // asks for 1 to 4 MiB: refusals come within the first few hundred
  // requests, however slowly the run goes (TSan).
  const Config config = host_config(4 * MiB);
  auto device = make_device(config);
  ASSERT_TRUE(device);
  SoakOptions options = short_run();
  options.seconds = 1.0;
  options.max_block_bytes = 4 * MiB;
  options.live_blocks_per_thread = 512;
  const SoakResult r = run_soak(
      *device, [&](std::shared_ptr<Device> d) { return make_allocator(Mode::growth, config, std::move(d)); },
      options);
  EXPECT_TRUE(r.clean()) << violations_text(r);
  EXPECT_GT(r.ooms, 0u);
  EXPECT_EQ(r.final_stats.num_ooms, static_cast<std::int64_t>(r.ooms));
}

// Forwards everything to a real pool; the tests below break one thing each.
class PoolDecorator : public Allocator {
 public:
  explicit PoolDecorator(std::unique_ptr<Allocator> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Expected<void*> allocate(std::size_t bytes, Stream stream) override { return inner_->allocate(bytes, stream); }
  Status deallocate(void* ptr, Stream stream) override { return inner_->deallocate(ptr, stream); }
  Stats stats() const override { return inner_->stats(); }
  std::size_t trim() override { return inner_->trim(); }
  std::string dump() const override { return inner_->dump(); }
  Device& device() const override { return inner_->device(); }

 protected:
  std::unique_ptr<Allocator> inner_;
};

template <class Broken>
SoakResult soak_broken(unsigned threads = 2) {
  const Config config = host_config();
  auto device = make_device(config);
  if (!device) throw Exception(device.error());
  return run_soak(
      *device,
      [&](std::shared_ptr<Device> d) -> Expected<std::unique_ptr<Allocator>> {
        auto inner = make_allocator(Mode::growth, config, std::move(d));
        if (!inner) return std::move(inner).error();
        return std::unique_ptr<Allocator>(std::make_unique<Broken>(std::move(*inner)));
      },
      short_run(threads));
}

// The 200th allocation (or the first after it with a live block of 512
// bytes or more to point into) returns a pointer 256 bytes into that block.
class OverlappingPool final : public PoolDecorator {
 public:
  using PoolDecorator::PoolDecorator;
  Expected<void*> allocate(std::size_t bytes, Stream stream) override {
    Expected<void*> ptr = inner_->allocate(bytes, stream);
    if (ptr && ++count_ >= 200 && !overlapped_ && last_big_ != nullptr) {
      overlapped_ = true;  // the real block stays with the pool until it is destroyed
      return static_cast<void*>(static_cast<char*>(last_big_) + kMinAlignment);
    }
    if (ptr && bytes >= 2 * kMinAlignment && last_big_ == nullptr) last_big_ = *ptr;
    return ptr;
  }
  Status deallocate(void* ptr, Stream stream) override {
    if (ptr == last_big_) last_big_ = nullptr;
    return inner_->deallocate(ptr, stream);
  }

 private:
  int count_ = 0;
  bool overlapped_ = false;
  void* last_big_ = nullptr;  // a live block of at least 512 bytes
};

TEST(SoakWorkload, CatchesOverlappingBlocks) {
  const SoakResult r = soak_broken<OverlappingPool>(1);
  EXPECT_TRUE(r.has(ViolationKind::overlap)) << violations_text(r);
  ASSERT_FALSE(r.violations.empty());
  EXPECT_EQ(r.violations.front().kind, ViolationKind::overlap) << violations_text(r);
  EXPECT_NE(r.violations.front().detail.find("overlaps the live block"), std::string::npos);
}

// Every 100th allocation also flips a byte of the previous block handed out.
class ScribblingPool final : public PoolDecorator {
 public:
  using PoolDecorator::PoolDecorator;
  Expected<void*> allocate(std::size_t bytes, Stream stream) override {
    Expected<void*> ptr = inner_->allocate(bytes, stream);
    if (!ptr) return ptr;
    std::lock_guard lock(mutex_);
    if (++count_ % 100 == 0 && previous_ != nullptr) static_cast<unsigned char*>(previous_)[0] ^= 0x5a;
    previous_ = *ptr;
    return ptr;
  }
  Status deallocate(void* ptr, Stream stream) override {
    {
      std::lock_guard lock(mutex_);
      if (ptr == previous_) previous_ = nullptr;
    }
    return inner_->deallocate(ptr, stream);
  }

 private:
  std::mutex mutex_;
  int count_ = 0;
  void* previous_ = nullptr;
};

TEST(SoakWorkload, CatchesAChangedPattern) {
  const SoakResult r = soak_broken<ScribblingPool>(1);
  ASSERT_FALSE(r.violations.empty());
  EXPECT_EQ(r.violations.front().kind, ViolationKind::pattern_mismatch) << violations_text(r);
  EXPECT_NE(r.violations.front().detail.find("byte 0 changed"), std::string::npos) << violations_text(r);
}

// Counts one allocation too many.
class MiscountingPool final : public PoolDecorator {
 public:
  using PoolDecorator::PoolDecorator;
  Stats stats() const override {
    Stats s = inner_->stats();
    if (s.num_allocs > 0) ++s.num_allocs;
    return s;
  }
};

TEST(SoakWorkload, CatchesStatsThatDisagreeWithTheLiveSet) {
  const SoakResult r = soak_broken<MiscountingPool>();
  ASSERT_FALSE(r.violations.empty());
  EXPECT_EQ(r.violations.front().kind, ViolationKind::stats_mismatch) << violations_text(r);
  EXPECT_NE(r.violations.front().detail.find("num_allocs"), std::string::npos) << violations_text(r);
}

// Says every 50th free succeeded without passing it on: the pool never gets
// those blocks back.
class DroppingPool final : public PoolDecorator {
 public:
  using PoolDecorator::PoolDecorator;
  Status deallocate(void* ptr, Stream stream) override {
    if (++count_ % 50 == 0) return {};
    return inner_->deallocate(ptr, stream);
  }

 private:
  std::atomic<int> count_{0};
};

TEST(SoakWorkload, CatchesFreesThatNeverReachThePool) {
  const SoakResult r = soak_broken<DroppingPool>();
  ASSERT_FALSE(r.violations.empty());
  EXPECT_EQ(r.violations.front().kind, ViolationKind::stats_mismatch) << violations_text(r);
  EXPECT_NE(r.violations.front().detail.find("bytes_in_use"), std::string::npos) << violations_text(r);
}

// A free the pool refuses is reported with the pool's message.
class RefusingPool final : public PoolDecorator {
 public:
  using PoolDecorator::PoolDecorator;
  Status deallocate(void* ptr, Stream stream) override {
    if (++count_ == 30) return Error(Errc::invalid_pointer, "refused on purpose");
    return inner_->deallocate(ptr, stream);
  }

 private:
  std::atomic<int> count_{0};
};

TEST(SoakWorkload, CatchesAFailedFree) {
  const SoakResult r = soak_broken<RefusingPool>();
  EXPECT_TRUE(r.has(ViolationKind::unexpected_error)) << violations_text(r);
  EXPECT_NE(violations_text(r).find("refused on purpose"), std::string::npos) << violations_text(r);
}

TEST(SoakWorkload, APoolThatCannotBeBuiltIsAViolation) {
  const Config config = host_config();
  auto device = make_device(config);
  ASSERT_TRUE(device);
  const SoakResult r = run_soak(
      *device,
      [](std::shared_ptr<Device>) -> Expected<std::unique_ptr<Allocator>> {
        return Error(Errc::out_of_memory, "no room on purpose");
      },
      short_run());
  EXPECT_FALSE(r.clean());
  EXPECT_NE(violations_text(r).find("no room on purpose"), std::string::npos);
}

}  // namespace
}  // namespace tidepool::soak
