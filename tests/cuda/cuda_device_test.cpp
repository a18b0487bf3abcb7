// CudaDevice: the Device contract on a real GPU (skipped, with the reason,
// without one), and what it says where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "child_process.hpp"
#include "cuda/cuda_test_support.hpp"
#include "device/cuda/cuda_api.hpp"
#include "tidepool/units.hpp"

namespace tidepool::test {
namespace {

// --- without a GPU: what the absence looks like ------------------------------

TEST(CudaAvailability, SaysWhyNoDeviceIsUsable) {
  const CudaAvailability availability = cuda_availability();
  EXPECT_GT(availability.runtime_version, 0) << "the linked libcudart reports no version";
  if (availability.available()) {
    EXPECT_GT(availability.device_count, 0);
    EXPECT_TRUE(availability.reason.empty()) << availability.reason;
    GTEST_SKIP() << "a CUDA device is present; this checks the report without one";
  }
  EXPECT_NE(availability.status, CudaStatus::available);
  EXPECT_NE(availability.reason.find("(cudaError"), std::string::npos)
      << "the reason names the CUDA error: " << availability.reason;
  if (availability.status == CudaStatus::no_driver) {
    EXPECT_EQ(availability.driver_version, 0);
  }
}

TEST(CudaAvailability, CreateFailsCleanlyWithoutADevice) {
  const CudaAvailability availability = cuda_availability();
  Expected<std::shared_ptr<CudaDevice>> device = CudaDevice::open(0);
  if (availability.available()) {
    ASSERT_TRUE(device) << device.error().message();
    GTEST_SKIP() << "a CUDA device is present; this checks the refusal without one";
  }
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::unsupported);
  EXPECT_EQ(device.error().message(), "no CUDA device: " + availability.reason);
  // Asking again does not change the answer or crash.
  EXPECT_FALSE(CudaDevice::open(0));
  EXPECT_EQ(cuda_availability().status, availability.status);
}

TEST(CudaAvailability, OrdinalOutOfRangeIsRefused) {
  const CudaAvailability availability = cuda_availability();
  for (int ordinal : {-1, availability.device_count, 1 << 20}) {
    Expected<std::shared_ptr<CudaDevice>> device = CudaDevice::open(ordinal);
    ASSERT_FALSE(device) << "ordinal " << ordinal;
    EXPECT_EQ(device.error().code(),
              availability.available() ? Errc::invalid_argument : Errc::unsupported)
        << device.error().message();
  }
}

TEST(CudaAvailability, StatusNamesAreDistinct) {
  const std::vector<CudaStatus> all = {CudaStatus::available,      CudaStatus::no_driver,
                                       CudaStatus::stub_driver,    CudaStatus::driver_too_old,
                                       CudaStatus::no_device,      CudaStatus::error};
  std::vector<std::string> names;
  for (CudaStatus status : all) names.emplace_back(cuda_status_name(status));
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
  EXPECT_STREQ(cuda_status_name(CudaStatus::stub_driver), "stub_driver");
}

TEST(CudaErrors, RuntimeErrorsCarryTheCudaNameAndMessage) {
  const Error oom = cuda::runtime_error("cudaMalloc", cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), Errc::out_of_memory);
  EXPECT_EQ(oom.message(), "cudaMalloc: cudaErrorMemoryAllocation: out of memory");
  const Error invalid = cuda::runtime_error("cudaFree", cudaErrorInvalidValue);
  EXPECT_EQ(invalid.code(), Errc::device_error);
  EXPECT_NE(invalid.message().find("cudaErrorInvalidValue"), std::string::npos) << invalid.message();
  EXPECT_EQ(cuda::runtime_error("x", cudaErrorNotSupported).code(), Errc::unsupported);
}

TEST(CudaErrors, DriverErrorsAreNamedOrNumbered) {
  const Error oom = cuda::driver_error("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(oom.code(), Errc::out_of_memory);
  // With a driver the name comes from cuGetErrorName; without one, the number.
  const bool named = oom.message() == "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY: out of memory";
  const bool numbered = oom.message() == "cuMemCreate: CUresult 2";
  EXPECT_TRUE(named || numbered) << oom.message();
  if (!cuda_availability().available()) {
    EXPECT_TRUE(numbered) << oom.message();
  }
  EXPECT_EQ(cuda::driver_error("x", CUDA_ERROR_NOT_SUPPORTED).code(), Errc::unsupported);
  EXPECT_EQ(cuda::driver_error("x", CUDA_ERROR_INVALID_VALUE).code(), Errc::device_error);
}

TEST(CudaErrors, DriverApiIsRefusedWithoutADriver) {
  if (cuda_availability().available()) GTEST_SKIP() << "a CUDA device is present";
  Expected<const cuda::DriverApi*> api = cuda::driver_api();
  ASSERT_FALSE(api);
  EXPECT_NE(api.error().message().find("cudaError"), std::string::npos) << api.error().message();
}

// The toolkit's stub libcuda.so, found where toolkits install it.
std::string toolkit_stub_driver() {
  std::vector<std::string> roots;
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* root = std::getenv(variable); root != nullptr && *root != '\0') roots.emplace_back(root);
  }
  roots.emplace_back("/usr/local/cuda");
  for (const std::string& root : roots) {
    for (const char* under : {"/lib64/stubs/libcuda.so", "/targets/x86_64-linux/lib/stubs/libcuda.so",
                              "/lib/stubs/libcuda.so"}) {
      if (std::filesystem::exists(root + under)) return root + under;
    }
  }
  return {};
}

// Runs as a child of StubDriverIsReportedAsStub, with the stub first on the
// library path; skipped otherwise.
TEST(CudaAvailabilityChild, MatchesTheExpectedStatus) {
  const char* expected = std::getenv("TIDEPOOL_TEST_EXPECTED_CUDA_STATUS");
  if (expected == nullptr) GTEST_SKIP() << "runs only as the child of StubDriverIsReportedAsStub";
  const CudaAvailability availability = cuda_availability();
  EXPECT_STREQ(cuda_status_name(availability.status), expected) << availability.reason;
  EXPECT_NE(availability.reason.find("stub"), std::string::npos) << availability.reason;
  Expected<std::shared_ptr<CudaDevice>> device = CudaDevice::open(0);
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), Errc::unsupported);
  std::printf("child reason: %s\n", availability.reason.c_str());
}

// The case of CI and of containers without a GPU: libcuda.so.1 is the
// toolkit's stub. The test program runs itself again with the stub first on
// LD_LIBRARY_PATH (the loader reads it only at start-up).
TEST(CudaAvailability, StubDriverIsReportedAsStub) {
  if (std::getenv("TIDEPOOL_TEST_EXPECTED_CUDA_STATUS") != nullptr) GTEST_SKIP() << "in the child";
  const std::string stub = toolkit_stub_driver();
  if (stub.empty()) GTEST_SKIP() << "the CUDA toolkit's stub libcuda.so is not installed here";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tidepool-stub-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "libcuda.so.1");
  std::filesystem::create_symlink(stub, dir / "libcuda.so.1");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string library_path = dir.string();
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
    library_path += std::string(":") + old;
  }
  const std::string command = "env LD_LIBRARY_PATH='" + library_path +
                              "' TIDEPOOL_TEST_EXPECTED_CUDA_STATUS=stub_driver '" + self +
                              "' --gtest_filter=CudaAvailabilityChild.MatchesTheExpectedStatus 2>&1";
  FILE* child = ::popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr) << command;
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, child) != nullptr) output += buffer;
  const int status = ::pclose(child);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("[  PASSED  ] 1 test"), std::string::npos) << output;
  EXPECT_NE(output.find("child reason: the CUDA driver libcuda.so.1 is the toolkit's stub"),
            std::string::npos)
      << output;
}

// --- with a GPU: the Device contract ----------------------------------------

using CudaDeviceTest = CudaTest;

TEST_F(CudaDeviceTest, IdentityIsTheGpuUuid) {
  const std::string id = device_->id();
  ASSERT_EQ(id.size(), 40u) << id;  // GPU- and 36 characters of UUID
  EXPECT_EQ(id.rfind("GPU-", 0), 0u) << id;
  for (std::size_t dash : {12u, 17u, 22u, 27u}) EXPECT_EQ(id[dash], '-') << id;
  EXPECT_NE(device_->description().find(device_->name()), std::string::npos) << device_->description();
  EXPECT_EQ(device_->ordinal(), 0);
  // The same GPU has the same identity.
  Expected<std::shared_ptr<CudaDevice>> again = CudaDevice::open(0);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ((*again)->id(), id);
}

TEST_F(CudaDeviceTest, MemInfoAndGranularity) {
  const MemInfo info = device_->mem_info();
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  const std::size_t granularity = device_->granularity();
  EXPECT_GE(granularity, kMinAlignment);
  EXPECT_EQ(granularity & (granularity - 1), 0u) << granularity;
}

TEST_F(CudaDeviceTest, PlainAllocationHoldsData) {
  constexpr std::size_t kBytes = 3 * MiB + 4096;
  Expected<void*> ptr = device_->allocate(kBytes);
  ASSERT_TRUE(ptr) << ptr.error().message();
  EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*ptr), kMinAlignment));
  ASSERT_TRUE(write_pattern(*ptr, kBytes, 7));
  EXPECT_TRUE(pattern_intact(*ptr, kBytes, 7));
  ASSERT_TRUE(fill(*ptr, kBytes, 0xA5));
  EXPECT_TRUE(filled_with(*ptr, kBytes, 0xA5));

  Status wrong_size = device_->free(*ptr, kBytes + 1);
  ASSERT_FALSE(wrong_size);
  EXPECT_EQ(wrong_size.error().code(), Errc::invalid_argument);
  ASSERT_TRUE(device_->free(*ptr, kBytes));
  Status twice = device_->free(*ptr, kBytes);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), Errc::invalid_pointer);

  Expected<void*> none = device_->allocate(0);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), Errc::invalid_argument);
}

// A child forked after the device was opened cannot use CUDA (the context is
// the parent's): the device refuses it before any CUDA call or lock, leaves
// the parent's memory alone on free, and its destructor makes no driver call.
TEST_F(CudaDeviceTest, AForkedChildIsRefusedBeforeAnyCudaCall) {
  constexpr std::size_t kBytes = 4 * MiB;
  Expected<void*> ptr = device_->allocate(kBytes);
  ASSERT_TRUE(ptr) << ptr.error().message();
  ASSERT_TRUE(write_pattern(*ptr, kBytes, 11));
  Child child([&]() -> int {
    auto refused = [](const Error& error) {
      return error.code() == Errc::unsupported && error.message().find("forked") != std::string::npos;
    };
    if (auto more = device_->allocate(kBytes); more || !refused(more.error())) return 10;
    if (device_->supports_virtual_memory()) {
      if (auto handle = device_->create(device_->granularity()); handle || !refused(handle.error())) return 11;
    }
    if (Status synced = device_->synchronize(kDefaultStream); synced || !refused(synced.error())) return 12;
    if (!device_->free(*ptr, kBytes)) return 13;  // the parent's: left alone
    device_.reset();
    return 0;
  });
  ASSERT_EQ(child.wait(std::chrono::seconds(30)), 0);
  EXPECT_TRUE(pattern_intact(*ptr, kBytes, 11));
  ASSERT_TRUE(device_->free(*ptr, kBytes));
}

TEST_F(CudaDeviceTest, AllocationBeyondTheDeviceIsOutOfMemoryAndRecoverable) {
  const std::size_t too_much = device_->mem_info().total_bytes * 2;
  Expected<void*> ptr = device_->allocate(too_much);
  ASSERT_FALSE(ptr);
  EXPECT_EQ(ptr.error().code(), Errc::out_of_memory);
  ASSERT_NE(ptr.error().oom(), nullptr);
  EXPECT_EQ(ptr.error().oom()->requested_bytes, too_much);
  EXPECT_NE(ptr.error().message().find("cudaErrorMemoryAllocation"), std::string::npos)
      << ptr.error().message();
  // The refusal leaves no error behind for the next call.
  Expected<void*> small = device_->allocate(MiB);
  ASSERT_TRUE(small) << small.error().message();
  EXPECT_TRUE(device_->free(*small, MiB));

  if (device_->supports_virtual_memory()) {
    Expected<PhysicalHandle> handle = device_->create(round_up(too_much, device_->granularity()));
    ASSERT_FALSE(handle);
    EXPECT_EQ(handle.error().code(), Errc::out_of_memory) << handle.error().message();
  }
}

TEST_F(CudaDeviceTest, PhysicalMemoryKeepsItsDataWhenRemappedElsewhere) {
  if (!device_->supports_virtual_memory()) GTEST_SKIP() << device_->name() << " has no virtual memory";
  const std::size_t g = device_->granularity();
  Expected<void*> va = device_->reserve(4 * g);
  ASSERT_TRUE(va) << va.error().message();
  EXPECT_TRUE(is_aligned(reinterpret_cast<std::uintptr_t>(*va), g));
  auto* base = static_cast<char*>(*va);
  Expected<PhysicalHandle> first = device_->create(g);
  Expected<PhysicalHandle> second = device_->create(g);
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_TRUE(second) << second.error().message();

  // Side by side they are one contiguous range: written in one copy.
  ASSERT_TRUE(device_->map(base, g, *first));
  ASSERT_TRUE(device_->map(base + g, g, *second));
  ASSERT_TRUE(write_pattern(base, 2 * g, 11));
  ASSERT_TRUE(fill(base + g, g, 0x3C));  // a memset kernel over the second granule
  ASSERT_TRUE(filled_with(base + g, g, 0x3C));

  // Unmapped and mapped again in the other order, elsewhere in the reservation.
  ASSERT_TRUE(device_->unmap(base, g));
  ASSERT_TRUE(device_->unmap(base + g, g));
  ASSERT_TRUE(device_->map(base + 2 * g, g, *second));
  ASSERT_TRUE(device_->map(base + 3 * g, g, *first));
  EXPECT_TRUE(filled_with(base + 2 * g, g, 0x3C));
  // The first granule's part of the pattern starts at byte 0 of the pattern.
  std::vector<std::uint64_t> host(g / 8);
  ASSERT_EQ(cudaMemcpy(host.data(), base + 3 * g, g, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t w = 0; w < host.size(); ++w) ASSERT_EQ(host[w], pattern_word(11, w * 8)) << w;

  // A handle mapped at a second range too (an alias, TIDEPOOL_ALIASES): one
  // memory, written through one range and read through the other.
  ASSERT_TRUE(device_->map(base, g, *second));
  EXPECT_TRUE(filled_with(base, g, 0x3C));
  ASSERT_TRUE(fill(base, g, 0x5A));
  EXPECT_TRUE(filled_with(base + 2 * g, g, 0x5A));
  EXPECT_EQ(error_code(device_->release(*second, g)), "invalid_argument");  // mapped at two ranges
  ASSERT_TRUE(device_->unmap(base, g));
  EXPECT_TRUE(filled_with(base + 2 * g, g, 0x5A));  // the other range keeps it

  ASSERT_TRUE(device_->unmap(base + 2 * g, g));
  ASSERT_TRUE(device_->unmap(base + 3 * g, g));
  EXPECT_TRUE(device_->release(*first, g));
  EXPECT_TRUE(device_->release(*second, g));
  EXPECT_TRUE(device_->unreserve(*va, 4 * g));
}

TEST_F(CudaDeviceTest, VirtualMemoryPreconditionsAreErrors) {
  if (!device_->supports_virtual_memory()) GTEST_SKIP() << device_->name() << " has no virtual memory";
  const std::size_t g = device_->granularity();
  EXPECT_EQ(error_code(device_->reserve(g + 1)), "invalid_argument");
  EXPECT_EQ(error_code(device_->create(0)), "invalid_argument");
  Expected<void*> va = device_->reserve(2 * g);
  ASSERT_TRUE(va) << va.error().message();
  auto* base = static_cast<char*>(*va);
  Expected<PhysicalHandle> handle = device_->create(g);
  ASSERT_TRUE(handle) << handle.error().message();

  EXPECT_EQ(error_code(device_->map(base + kMinAlignment, g, *handle)), "invalid_argument");  // misaligned
  EXPECT_EQ(error_code(device_->map(base + 2 * g, g, *handle)), "invalid_argument");  // outside
  EXPECT_EQ(error_code(device_->map(base, 2 * g, *handle)), "invalid_argument");  // wrong size
  ASSERT_TRUE(device_->map(base, g, *handle));
  ASSERT_TRUE(device_->map(base + g, g, *handle));  // an alias: the same memory at a second range
  EXPECT_EQ(error_code(device_->map(base + g, g, *handle)), "invalid_argument");  // that range is mapped
  ASSERT_TRUE(device_->unmap(base + g, g));
  EXPECT_EQ(error_code(device_->release(*handle, g)), "invalid_argument");  // still mapped at base
  EXPECT_EQ(error_code(device_->unreserve(*va, 2 * g)), "invalid_argument");  // something mapped
  EXPECT_EQ(error_code(device_->unmap(base, 2 * g)), "invalid_argument");  // not one map()'s range
  ASSERT_TRUE(device_->unmap(base, g));
  ASSERT_TRUE(device_->release(*handle, g));
  EXPECT_EQ(error_code(device_->release(*handle, g)), "double_free");
  EXPECT_EQ(error_code(device_->unreserve(base + g, g)), "invalid_pointer");
  EXPECT_TRUE(device_->unreserve(*va, 2 * g));
}

TEST_F(CudaDeviceTest, SynchronizeWaitsForTheStream) {
  Expected<CudaStream> stream = CudaStream::create(*device_);
  ASSERT_TRUE(stream) << stream.error().message();
  constexpr std::size_t kBytes = 64 * MiB;
  Expected<void*> ptr = device_->allocate(kBytes);
  ASSERT_TRUE(ptr) << ptr.error().message();
  ASSERT_TRUE(fill(*ptr, kBytes, 0x5A, stream->handle()));
  ASSERT_TRUE(device_->synchronize(stream->handle()));
  EXPECT_EQ(cudaStreamQuery(reinterpret_cast<cudaStream_t>(stream->handle())), cudaSuccess);
  EXPECT_TRUE(filled_with(*ptr, kBytes, 0x5A));
  EXPECT_TRUE(device_->synchronize(kDefaultStream));
  EXPECT_TRUE(device_->free(*ptr, kBytes));
}

// query() tells a stream with work queued (a host function held until the
// test lets it go) from an idle one, without waiting.
TEST_F(CudaDeviceTest, QueryTellsABusyStreamFromAnIdleOne) {
  Expected<CudaStream> stream = CudaStream::create(*device_);
  ASSERT_TRUE(stream) << stream.error().message();
  Expected<bool> idle = device_->query(stream->handle());
  ASSERT_TRUE(idle) << idle.error().message();
  EXPECT_TRUE(*idle);
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  ASSERT_EQ(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream->handle()), hold, &release), cudaSuccess);
  idle = device_->query(stream->handle());
  ASSERT_TRUE(idle) << idle.error().message();
  EXPECT_FALSE(*idle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // a busy answer leaves no error behind
  release = true;
  ASSERT_TRUE(device_->synchronize(stream->handle()));
  idle = device_->query(stream->handle());
  ASSERT_TRUE(idle) << idle.error().message();
  EXPECT_TRUE(*idle);
}

TEST_F(CudaDeviceTest, FindCudaDeviceSeesThroughDecorators) {
  EXPECT_EQ(find_cuda_device(*device_), device_.get());
  DeviceAdaptor wrapped(device_);
  DeviceAdaptor twice(std::make_shared<DeviceAdaptor>(device_));
  EXPECT_EQ(find_cuda_device(wrapped), device_.get());
  EXPECT_EQ(find_cuda_device(twice), device_.get());
}

}  // namespace
}  // namespace tidepool::test
