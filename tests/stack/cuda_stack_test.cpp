// The CUDA branch of the stack builder: TIDEPOOL_DEVICE=cuda, the default
// device and its reason, and the cuda_async mode.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "stack/config_vars.hpp"
#include "tidepool/config.hpp"
#ifdef TIDEPOOL_HAVE_CUDA
#include "tidepool/cuda_device.hpp"
#include "tidepool/stack.hpp"
#endif

namespace tidepool {
namespace {

#ifdef TIDEPOOL_HAVE_CUDA

Config load(const test::Vars& variables) {
  Expected<Config> config = test::config_of(variables);
  if (!config) throw Exception(config.error());
  return std::move(config).value();
}

TEST(CudaStack, DefaultDeviceFollowsWhatTheMachineHas) {
  const CudaAvailability cuda = cuda_availability();
  EXPECT_EQ(default_device_kind(), cuda.available() ? DeviceKind::cuda : DeviceKind::host);
  const Config config = load({});
  EXPECT_EQ(config.device.value, default_device_kind());
  if (cuda.available()) {
    EXPECT_EQ(default_device_reason(), "a CUDA device is present");
  } else {
    EXPECT_EQ(default_device_reason(), "no CUDA device: " + cuda.reason);
  }
}

TEST(CudaStack, ExplicitCudaWithoutAGpuNamesTheVariableAndTheReason) {
  const CudaAvailability cuda = cuda_availability();
  if (cuda.available()) GTEST_SKIP() << "a CUDA device is present";
  Expected<std::shared_ptr<Device>> device = make_device(load({{"TIDEPOOL_DEVICE", "cuda"}}));
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::unsupported);
  EXPECT_EQ(device.error().message(), "TIDEPOOL_DEVICE=cuda: no CUDA device: " + cuda.reason);
}

TEST(CudaStack, CudaAsyncNeedsTheCudaDevice) {
  const Config config = load({{"TIDEPOOL_DEVICE", "host"}, {"XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"}});
  EXPECT_EQ(config.mode.value, Mode::cuda_async);
  Expected<std::shared_ptr<Device>> host = make_device(config);
  ASSERT_TRUE(host) << host.error().message();
  Status supported = mode_supported(Mode::cuda_async, **host);
  ASSERT_FALSE(supported);
  EXPECT_EQ(supported.error().code(), Errc::unsupported);
  Expected<std::unique_ptr<Allocator>> pool = make_allocator(config, *host);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), Errc::unsupported);
}

TEST(CudaStack, CudaAsyncOnAGpu) {
  const CudaAvailability cuda = cuda_availability();
  if (!cuda.available()) GTEST_SKIP() << "skipped: no CUDA device: " << cuda.reason;
  const Config config = load({{"TIDEPOOL_DEVICE", "cuda"},
                              {"XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"},
                              {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                              {"XLA_CLIENT_MEM_FRACTION", "0.25"}});
  Expected<std::shared_ptr<Device>> device = make_device(config);
  ASSERT_TRUE(device) << device.error().message();
  EXPECT_NE(find_cuda_device(**device), nullptr);
  EXPECT_TRUE(mode_supported(Mode::cuda_async, **device));
  Expected<std::unique_ptr<Allocator>> pool = make_allocator(config, *device);
  ASSERT_TRUE(pool) << pool.error().message();
  EXPECT_EQ((*pool)->name(), "cuda_async");
  EXPECT_EQ(static_cast<std::size_t>((*pool)->stats().bytes_limit),
            config.bytes_limit((*device)->mem_info().total_bytes));
  Expected<void*> ptr = (*pool)->allocate(1 << 20);
  ASSERT_TRUE(ptr) << ptr.error().message();
  EXPECT_TRUE((*pool)->deallocate(*ptr));
}

#else

TEST(CudaStack, NotInThisBuild) { EXPECT_EQ(default_device_reason(), "this build has no CUDA device"); }

#endif

}  // namespace
}  // namespace tidepool
