// The config layer builds the expandable pool from the environment:
// TIDEPOOL_ALLOCATOR=expandable (or XLA's "vmm"), its bytes_limit from the
// memory fraction, its release threshold from TIDEPOOL_RELEASE_THRESHOLD,
// its idle release from TIDEPOOL_IDLE_RELEASE.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "stack/config_vars.hpp"
#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

Config load(std::map<std::string, std::string> vars) {
  vars.emplace("TIDEPOOL_DEVICE", "host");
  vars.emplace("TIDEPOOL_HOST_CAPACITY", "1GiB");
  auto config = test::config_of(vars);
  if (!config) throw Exception(config.error());
  return *config;
}

std::unique_ptr<Allocator> build(const Config& config) {
  auto device = make_device(config);
  if (!device) throw Exception(device.error());
  auto pool = make_allocator(config.mode.value, config, *device);
  if (!pool) throw Exception(pool.error());
  return std::move(pool).value();
}

TEST(ExpandableStack, TheEnvironmentChoosesAndShapesIt) {
  for (const char* name : {"TIDEPOOL_ALLOCATOR", "XLA_PYTHON_CLIENT_ALLOCATOR"}) {
    const Config config = load({{name, name[0] == 'T' ? "expandable" : "vmm"}});
    auto pool = build(config);
    EXPECT_EQ(pool->name(), "expandable") << name;
    EXPECT_EQ(pool->stats().bytes_limit, static_cast<std::int64_t>(768 * MiB)) << name;  // 0.75 x 1 GiB
    EXPECT_EQ(pool->stats().bytes_reserved, 0) << name;  // nothing taken until asked
  }

  // By default freed granules stay cached; with a threshold of 0 they go back at once.
  auto keeps = build(load({{"TIDEPOOL_ALLOCATOR", "expandable"}}));
  auto gives_back = build(load({{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_RELEASE_THRESHOLD", "0"}}));
  auto limited = build(load({{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_RELEASE_THRESHOLD", "8MiB"}}));
  for (Allocator* pool : {keeps.get(), gives_back.get(), limited.get()}) {
    Expected<void*> block = pool->allocate(100 * MiB);
    ASSERT_TRUE(block) << block.error().message();
    ASSERT_TRUE(pool->deallocate(*block));
  }
  EXPECT_EQ(keeps->stats().bytes_reserved, static_cast<std::int64_t>(100 * MiB));
  EXPECT_EQ(gives_back->stats().bytes_reserved, 0);
  EXPECT_EQ(limited->stats().bytes_reserved, static_cast<std::int64_t>(8 * MiB));
}

TEST(ExpandableStack, IdleReleaseReachesThePool) {
  auto pool = build(load({{"TIDEPOOL_ALLOCATOR", "expandable"}, {"TIDEPOOL_IDLE_RELEASE", "10ms"}}));
  Expected<void*> block = pool->allocate(100 * MiB);
  ASSERT_TRUE(block) << block.error().message();
  ASSERT_TRUE(pool->deallocate(*block));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pool->stats().bytes_reserved != 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pool->stats().bytes_reserved, 0);
}

TEST(Stack, AFractionThatLeavesNothingIsAnErrorNotTheWholeDevice) {
  // Found by the reliability work: 1e-300 x 1 GiB rounds to 0, which the
  // pools read as "no limit".
  const Config config = load({{"TIDEPOOL_MEM_FRACTION", "1e-300"}, {"TIDEPOOL_ALLOCATOR", "growth"}});
  auto device = make_device(config);
  ASSERT_TRUE(device);
  auto pool = make_allocator(config.mode.value, config, *device);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::invalid_argument);
  EXPECT_NE(pool.error().message().find("TIDEPOOL_MEM_FRACTION='1e-300' leaves 0 bytes"), std::string::npos)
      << pool.error().message();
}

}  // namespace
}  // namespace tidepool
