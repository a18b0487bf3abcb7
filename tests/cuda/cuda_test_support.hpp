// What the CUDA tests share: a fixture that skips, with the reason, where no
// usable GPU is present, and device memory written and checked through the
// runtime (cudaMemset runs a kernel on the device; cudaMemcpy moves a host
// pattern), so the checks see what the GPU really holds.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tidepool/cuda_device.hpp"

namespace tidepool::test {

/// Skips the test with "skipped: no CUDA device: <why>" without a usable GPU;
/// otherwise creates device_ (ordinal 0).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaAvailability availability = cuda_availability();
    if (!availability.available()) GTEST_SKIP() << "skipped: no CUDA device: " << availability.reason;
    Expected<std::shared_ptr<CudaDevice>> device = CudaDevice::open(0);
    ASSERT_TRUE(device) << device.error().message();
    device_ = *device;
  }

  std::shared_ptr<CudaDevice> device_;
};

/// "success", or the name of the error's code, e.g. "invalid_argument": a
/// result compared without assuming that it failed.
template <class T>
std::string error_code(const Expected<T>& result) {
  return result ? "success" : errc_name(result.error().code());
}

/// The word at byte offset i of the pattern of `tag`.
inline std::uint64_t pattern_word(std::uint64_t tag, std::size_t i) {
  return tag * 0x9E3779B97F4A7C15ull + i;
}

/// Copies the pattern of `tag` into device memory [ptr, ptr + bytes); bytes is a multiple of 8.
inline ::testing::AssertionResult write_pattern(void* ptr, std::size_t bytes, std::uint64_t tag) {
  std::vector<std::uint64_t> host(bytes / 8);
  for (std::size_t w = 0; w < host.size(); ++w) host[w] = pattern_word(tag, w * 8);
  const cudaError_t error = cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice);
  if (error != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy to " << ptr << ": " << cudaGetErrorName(error);
  }
  return ::testing::AssertionSuccess();
}

/// Whether device memory [ptr, ptr + bytes) holds the pattern of `tag`.
inline ::testing::AssertionResult pattern_intact(const void* ptr, std::size_t bytes, std::uint64_t tag) {
  std::vector<std::uint64_t> host(bytes / 8);
  const cudaError_t error = cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost);
  if (error != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy from " << ptr << ": " << cudaGetErrorName(error);
  }
  for (std::size_t w = 0; w < host.size(); ++w) {
    if (host[w] != pattern_word(tag, w * 8)) {
      return ::testing::AssertionFailure() << "pattern " << tag << " broken at byte " << w * 8 << " of "
                                           << ptr;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Sets every byte of device memory [ptr, ptr + bytes) to `value` on `stream` (a memset kernel).
inline ::testing::AssertionResult fill(void* ptr, std::size_t bytes, unsigned char value,
                                       Stream stream = kDefaultStream) {
  const cudaError_t error =
      cudaMemsetAsync(ptr, value, bytes, reinterpret_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemsetAsync of " << ptr << ": " << cudaGetErrorName(error);
  }
  return ::testing::AssertionSuccess();
}

/// Whether every byte of device memory [ptr, ptr + bytes) is `value` (waits for the device).
inline ::testing::AssertionResult filled_with(const void* ptr, std::size_t bytes, unsigned char value) {
  if (cudaError_t error = cudaDeviceSynchronize(); error != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaDeviceSynchronize: " << cudaGetErrorName(error);
  }
  std::vector<unsigned char> host(bytes);
  if (cudaError_t error = cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost); error != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy from " << ptr << ": " << cudaGetErrorName(error);
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    if (host[i] != value) {
      return ::testing::AssertionFailure() << "byte " << i << " of " << ptr << " is " << int{host[i]}
                                           << ", not " << int{value};
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tidepool::test
