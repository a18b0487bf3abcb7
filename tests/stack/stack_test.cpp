// The stack built from a configuration (stack.hpp): the default device the
// machine offers, the device of the configured capacity, every mode built or
// refused with the reason, the fraction as each mode applies it.
#include "tidepool/stack.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "stack/config_vars.hpp"
#include "tidepool/config.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using test::Vars;

Config load_ok(const Vars& vars) {
  auto config = test::config_of(vars);
  EXPECT_TRUE(config) << config.error().message();
  return config ? *config : Config{};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StackDefaults, TheDefaultDeviceIsTheMachines) {
  EXPECT_EQ(load_ok({}).device.value, default_device_kind());
  EXPECT_TRUE(load_ok({}).device.is_default());
}

TEST(StackDefaults, DefaultDeviceIsHostWithoutCuda) {
#ifndef TIDEPOOL_HAVE_CUDA
  EXPECT_EQ(default_device_kind(), DeviceKind::host);
#else
  GTEST_SKIP() << "a CUDA build chooses by what the machine has";
#endif
}

// --- building the stack ------------------------------------------------------

// A small host device so preallocation costs nothing noticeable.
Config small_device(Vars vars) {
  vars.emplace("TIDEPOOL_DEVICE", "host");
  vars.emplace("TIDEPOOL_HOST_CAPACITY", "64MiB");
  return load_ok(vars);
}

TEST(Stack, HostDeviceOfTheConfiguredCapacity) {
  Config config = small_device({});
  auto device = make_device(config);
  ASSERT_TRUE(device) << device.error().message();
  EXPECT_EQ((*device)->mem_info().total_bytes, 64 * MiB);
  EXPECT_EQ((*device)->mem_info().free_bytes, 64 * MiB);
  EXPECT_TRUE((*device)->supports_virtual_memory());
}

TEST(Stack, BadCapacityNamesTheVariable) {
  Config config = load_ok({{"TIDEPOOL_HOST_CAPACITY", "1000000"}});  // not a granule multiple
  auto device = make_device(config);
  ASSERT_FALSE(device);
  EXPECT_TRUE(contains(device.error().message(), "TIDEPOOL_HOST_CAPACITY='1000000'"))
      << device.error().message();
}

TEST(Stack, CudaDeviceNeedsACudaBuild) {
#ifdef TIDEPOOL_HAVE_CUDA
  GTEST_SKIP() << "this build has the CUDA device";
#else
  auto device = make_device(load_ok({{"TIDEPOOL_DEVICE", "cuda"}}));
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::unsupported);
  EXPECT_TRUE(contains(device.error().message(), "TIDEPOOL_DEVICE=cuda"));
#endif
}

TEST(Stack, PreallocateTakesFractionOfTotalAtOnce) {
  Config config = small_device({{"XLA_CLIENT_MEM_FRACTION", "0.5"}});
  ASSERT_EQ(config.mode.value, Mode::preallocate);
  auto device = make_device(config);
  ASSERT_TRUE(device);
  auto pool = make_allocator(config, *device);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->name(), "preallocate");
  EXPECT_EQ((*pool)->stats().bytes_limit, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ((*pool)->stats().bytes_reserved, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ((*device)->mem_info().free_bytes, 32 * MiB);
  auto block = (*pool)->allocate(MiB);
  ASSERT_TRUE(block);
  EXPECT_TRUE((*pool)->deallocate(*block));
}

TEST(Stack, GrowthIsBoundedByTheFractionToo) {
  Config config = small_device({{"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                                {"XLA_CLIENT_MEM_FRACTION", "0.5"}});
  auto device = make_device(config);
  ASSERT_TRUE(device);
  auto pool = make_allocator(config, *device);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->name(), "growth");
  EXPECT_EQ((*pool)->stats().bytes_limit, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ((*pool)->stats().bytes_reserved, 0);
  // Within the limit succeeds; past it is an out-of-memory error although
  // the device has room.
  auto inside = (*pool)->allocate(16 * MiB);
  ASSERT_TRUE(inside) << inside.error().message();
  auto past = (*pool)->allocate(24 * MiB);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), Errc::out_of_memory);
  EXPECT_GE((*device)->mem_info().free_bytes, 32 * MiB);
  EXPECT_TRUE((*pool)->deallocate(*inside));
}

TEST(Stack, PlatformIgnoresTheFractionAsXlaDoes) {
  Config config = small_device({{"XLA_PYTHON_CLIENT_ALLOCATOR", "platform"},
                                {"XLA_CLIENT_MEM_FRACTION", "0.25"}});
  auto device = make_device(config);
  ASSERT_TRUE(device);
  auto pool = make_allocator(config, *device);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->name(), "platform");
  auto block = (*pool)->allocate(40 * MiB);  // more than 0.25 x 64 MiB
  ASSERT_TRUE(block) << block.error().message();
  EXPECT_TRUE((*pool)->deallocate(*block));
}

TEST(Stack, EveryModeBuildsOrSaysWhyNot) {
  Config config = small_device({});
  auto device = make_device(config);
  ASSERT_TRUE(device);
  for (Mode mode : all_modes()) {
    Status supported = mode_supported(mode, **device);
    auto pool = make_allocator(mode, config, *device);
    ASSERT_EQ(static_cast<bool>(pool), static_cast<bool>(supported))
        << mode_name(mode) << ": " << (pool ? "" : pool.error().message());
    if (pool) {
      EXPECT_EQ((*pool)->name(), mode_name(mode));
      pool->reset();  // hand the device back before the next mode
    } else {
      EXPECT_EQ(pool.error().code(), Errc::unsupported);
      EXPECT_TRUE(contains(pool.error().message(), std::string(mode_name(mode))));
    }
  }
  EXPECT_EQ((*device)->mem_info().free_bytes, 64 * MiB);
}

TEST(Stack, NoDeviceIsAnError) {
  auto pool = make_allocator(Mode::growth, Config{}, nullptr);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::invalid_argument);
}

}  // namespace
}  // namespace tidepool
