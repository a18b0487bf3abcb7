// libtidepool_torch.so: the two entry points of PyTorch's pluggable
// allocator (torch.cuda.memory.CUDAPluggableAllocator) over tidepool's CUDA
// stack, one pool per device, configured by the environment like every
// tidepool process (XLA_PYTHON_CLIENT_*, TIDEPOOL_*; the device is cuda).
// tidepool.torch.use() installs it. Also: the last error and each device's
// stats, for tidepool.torch.memory_stats().
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "c_stats.hpp"
#include "settings.hpp"
#include "tidepool/config.hpp"
#include "tidepool/cuda_device.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/tidepool.h"

namespace {

using tidepool::Error;
using tidepool::Errc;
using tidepool::Expected;

std::mutex g_mutex;
std::map<int, tidepool::bindings::Stack>* g_stacks = new std::map<int, tidepool::bindings::Stack>();
thread_local std::string t_last_error;

/// The stack of CUDA device `device` (a runtime ordinal), built on first use.
Expected<tidepool::Allocator*> allocator_for(int device) {
  std::lock_guard lock(g_mutex);
  if (auto it = g_stacks->find(device); it != g_stacks->end()) return it->second.allocator.get();
  auto config = tidepool::Config::from_env();
  if (!config) return std::move(config).error();
  config->device = {tidepool::DeviceKind::cuda, {tidepool::Origin::program, "tidepool.torch device", "cuda"}};
  for (const std::string& warning : config->warnings) std::fprintf(stderr, "tidepool: warning: %s\n", warning.c_str());
  std::shared_ptr<tidepool::Device> cuda;
  if (device == 0) {
    auto made = tidepool::make_device(*config);
    if (!made) return std::move(made).error();
    cuda = std::move(*made);
  } else {
    auto made = tidepool::CudaDevice::open(device);
    if (!made) return std::move(made).error();
    cuda = std::move(*made);
    if (config->ledger.value) {
      auto guarded = tidepool::make_ledger_device(*config, std::move(cuda));
      if (!guarded) return std::move(guarded).error();
      cuda = std::move(*guarded);
    }
  }
  auto pool = tidepool::make_allocator(*config, cuda);
  if (!pool) return std::move(pool).error();
  tidepool::bindings::Stack stack;
  stack.device = std::move(cuda);
  stack.allocator = std::move(*pool);
  return g_stacks->emplace(device, std::move(stack)).first->second.allocator.get();
}

/// The environment's names for the settings an OOM's advice is about.
const tidepool::OomWords& env_words() {
  static const tidepool::OomWords words = [] {
    auto config = tidepool::Config::from_env();
    return config ? config->oom_words() : tidepool::OomWords{};
  }();
  return words;
}

void record(const Error& error, const char* function) {
  t_last_error = error.worded(env_words()).message();
  std::fprintf(stderr, "tidepool: %s: %s\n", function, t_last_error.c_str());
}

/// Runs `body(tags)` on device `device`'s pool. Returns 0, or tidepool.h's
/// status code of the error (then in tidepool_torch_last_error; not printed:
/// the Python caller raises it).
template <class Body>
int with_tags(const char* function, int device, const char* tag, bool tag_argument, Body&& body) {
  try {
    t_last_error.clear();
    if (tag_argument && tag == nullptr) {
      t_last_error = std::string(function) + ": tag is NULL";
      return TIDEPOOL_ERROR_INVALID_ARGUMENT;
    }
    auto allocator = allocator_for(device);
    if (!allocator) {
      t_last_error = allocator.error().message();
      return static_cast<int>(allocator.error().code()) + 1;
    }
    tidepool::Sleepable* tags = (*allocator)->sleepable();
    if (tags == nullptr) {
      t_last_error = std::string(function) + ": the '" + std::string((*allocator)->name()) +
                     "' pool has no tags; tags, sleep and wake need TIDEPOOL_ALLOCATOR=expandable";
      return TIDEPOOL_ERROR_UNSUPPORTED;
    }
    tidepool::Status status = body(*tags);
    if (status) return TIDEPOOL_OK;
    t_last_error = status.error().worded(env_words()).message();
    return static_cast<int>(status.error().code()) + 1;  // tidepool_status_name's mapping
  } catch (const std::exception& error) {
    t_last_error = std::string(function) + ": " + error.what();
    return TIDEPOOL_ERROR_INTERNAL;
  }
}

}  // namespace

#define TIDEPOOL_TORCH_API extern "C" __attribute__((visibility("default")))

/// CUDAPluggableAllocator's alloc: a block of `size` bytes on `device`,
/// usable on `stream`; nullptr (with the reason on stderr and in
/// tidepool_torch_last_error) when it cannot be had.
TIDEPOOL_TORCH_API void* tidepool_torch_alloc(ssize_t size, int device, cudaStream_t stream) {
  try {
    if (size < 0) {
      record(Error(Errc::invalid_argument, "size " + std::to_string(size) + " is negative"), "tidepool_torch_alloc");
      return nullptr;
    }
    auto allocator = allocator_for(device);
    if (!allocator) {
      record(allocator.error(), "tidepool_torch_alloc");
      return nullptr;
    }
    auto block = (*allocator)->allocate(static_cast<std::size_t>(size), reinterpret_cast<tidepool::Stream>(stream));
    if (!block) {
      record(block.error(), "tidepool_torch_alloc");
      return nullptr;
    }
    return *block;
  } catch (const std::exception& error) {
    record(Error(Errc::device_error, error.what()), "tidepool_torch_alloc");
    return nullptr;
  }
}

/// CUDAPluggableAllocator's free: `ptr` came from tidepool_torch_alloc on
/// `device`; freed on `stream` (reusable there at once, elsewhere after the
/// stream's work). A bad pointer is reported on stderr, never a crash.
TIDEPOOL_TORCH_API void tidepool_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size;  // the pool knows each block's size
  try {
    auto allocator = allocator_for(device);
    if (!allocator) return record(allocator.error(), "tidepool_torch_free");
    if (auto freed = (*allocator)->deallocate(ptr, reinterpret_cast<tidepool::Stream>(stream)); !freed)
      record(freed.error(), "tidepool_torch_free");
  } catch (const std::exception& error) {
    record(Error(Errc::device_error, error.what()), "tidepool_torch_free");
  }
}

/// The last error on this thread ("" when none).
TIDEPOOL_TORCH_API const char* tidepool_torch_last_error(void) { return t_last_error.c_str(); }

/// Copies device `device`'s stats into *out (tidepool.h's struct, out_size
/// = sizeof as the caller knows it). Returns 0, or -1 when the device has no
/// pool yet or out is NULL.
TIDEPOOL_TORCH_API int tidepool_torch_get_stats(int device, tidepool_stats* out, size_t out_size) {
  if (out == nullptr) return -1;
  std::lock_guard lock(g_mutex);
  auto it = g_stacks->find(device);
  if (it == g_stacks->end()) return -1;
  return tidepool::bindings::copy_stats(it->second.allocator->stats(), out, out_size) ? 0 : -1;
}

// --- tags, sleep and wake (tidepool.torch.tag/sleep/wake): each returns 0 or
// tidepool.h's status code, the message in tidepool_torch_last_error.

/// Tensors allocated on `device` by this thread carry `tag` until tag_end.
TIDEPOOL_TORCH_API int tidepool_torch_tag_begin(int device, const char* tag) {
  return with_tags("tidepool_torch_tag_begin", device, tag, true,
                   [&](tidepool::Sleepable& tags) { return tags.tag_begin(tag); });
}

TIDEPOOL_TORCH_API int tidepool_torch_tag_end(int device) {
  return with_tags("tidepool_torch_tag_end", device, nullptr, false,
                   [&](tidepool::Sleepable& tags) { return tags.tag_end(); });
}

/// keep: 0 contents (copied to pinned host memory), 1 nothing.
TIDEPOOL_TORCH_API int tidepool_torch_sleep(int device, const char* tag, int keep) {
  return with_tags("tidepool_torch_sleep", device, tag, true, [&](tidepool::Sleepable& tags) -> tidepool::Status {
    if (keep != 0 && keep != 1) {
      return Error(Errc::invalid_argument, "tidepool_torch_sleep: keep " + std::to_string(keep) +
                                               ": allowed: 0 (contents) or 1 (nothing)");
    }
    return tags.sleep(tag, keep == 0 ? tidepool::SleepKeep::contents : tidepool::SleepKeep::nothing);
  });
}

TIDEPOOL_TORCH_API int tidepool_torch_wake(int device, const char* tag) {
  return with_tags("tidepool_torch_wake", device, tag, true,
                   [&](tidepool::Sleepable& tags) { return tags.wake(tag); });
}

