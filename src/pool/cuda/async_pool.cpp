#include "tidepool/async_pool.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/process.hpp"
#include "device/cuda/cuda_api.hpp"
#include "pool/live_blocks.hpp"
#include "pool/usage_counters.hpp"
#include "tidepool/cuda_device.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

using cuda::runtime_error;
using cuda::ScopedDevice;

cudaStream_t to_cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream); }

// Stats count sizes rounded as the other pools round them, so the modes compare.
constexpr std::size_t kStatsGranule = kMinAlignment;


}  // namespace

struct AsyncPool::State {
  std::shared_ptr<Device> device;
  MakerProcess maker;  // a forked child leaves the pool alone (core/process.hpp)
  CudaDevice* cuda_device = nullptr;  // under device's decorators
  int ordinal = 0;
  cudaMemPool_t pool = nullptr;
  std::size_t bytes_limit = 0;
  std::size_t release_threshold = 0;

  mutable std::mutex mutex;  // guards the rest, and orders the driver calls with the counts
  pool::LiveBlocks live;  // bytes as requested
  pool::UsageCounters usage;

  std::string who() const { return "cuda_async pool on cuda:" + std::to_string(ordinal); }

  /// A cudaMemPoolAttr* byte count; 0 when the driver does not answer.
  std::size_t attribute(cudaMemPoolAttr which) const {
    std::uint64_t value = 0;
    if (cudaMemPoolGetAttribute(pool, which, &value) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return static_cast<std::size_t>(value);
  }
};

Expected<std::unique_ptr<AsyncPool>> AsyncPool::create(std::shared_ptr<Device> device,
                                                       AsyncPoolOptions options) {
  if (!device) return Error(Errc::invalid_argument, "AsyncPool: no device");
  CudaDevice* cuda_device = find_cuda_device(*device);
  if (cuda_device == nullptr) {
    return Error(Errc::unsupported, "the cuda_async pool needs the CUDA device (TIDEPOOL_DEVICE=cuda); " +
                                        device->description() + " is not one");
  }
  auto state = std::make_unique<State>();
  State& s = *state;
  s.cuda_device = cuda_device;
  s.ordinal = cuda_device->ordinal();
  s.bytes_limit = options.bytes_limit != 0 ? options.bytes_limit : device->mem_info().total_bytes;
  s.release_threshold = options.release_threshold.value_or(s.bytes_limit);
  s.device = std::move(device);

  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  int pools_supported = 0;
  if (cudaError_t error =
          cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, s.ordinal);
      error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaDeviceGetAttribute(MemoryPoolsSupported)", error);
  }
  if (pools_supported == 0) {
    return Error(Errc::unsupported, s.who() + ": " + cuda_device->name() +
                                        " does not support stream-ordered memory pools");
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = s.ordinal;
  if (cudaError_t error = cudaMemPoolCreate(&s.pool, &props); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaMemPoolCreate", error);
  }
  // From here the pool is destroyed with the object on any failure.
  auto pool = std::unique_ptr<AsyncPool>(new AsyncPool(std::move(state)));
  State& made = *pool->state_;
  std::uint64_t threshold = made.release_threshold;
  if (cudaError_t error = cudaMemPoolSetAttribute(made.pool, cudaMemPoolAttrReleaseThreshold, &threshold);
      error != cudaSuccess) {
    return runtime_error(made.who() + ": setting the release threshold to " +
                             std::to_string(made.release_threshold),
                         error);
  }
  if (options.preallocate) {
    // XLA: allocate the pool size once and free it, then clear the counts,
    // so the pool holds the memory (kept while within the release threshold).
    Expected<void*> block = pool->allocate(made.bytes_limit);
    if (!block) return std::move(block).error();
    if (Status freed = pool->deallocate(*block); !freed) return std::move(freed).error();
    if (cudaError_t error = cudaStreamSynchronize(to_cuda(kDefaultStream)); error != cudaSuccess) {
      return runtime_error(made.who() + ": cudaStreamSynchronize after preallocation", error);
    }
    std::lock_guard lock(made.mutex);
    made.usage.num_allocs = 0;
    made.usage.peak_bytes_in_use = made.usage.bytes_in_use;
    made.usage.largest_alloc_size = 0;
  }
  return pool;
}

AsyncPool::AsyncPool(std::unique_ptr<State> state) : state_(std::move(state)) {}

AsyncPool::~AsyncPool() {
  if (state_->maker.forked()) {  // the driver's pool and the lock are the parent's
    (void)state_.release();      // a leak in the child only
    return;
  }
  State& s = *state_;
  ScopedDevice current(s.ordinal);
  if (!s.live.map().empty()) {
    // The streams the live blocks were allocated on may be gone by now: wait
    // for all work, then free them on the default stream.
    (void)cudaDeviceSynchronize();
    for (const auto& [ptr, live] : s.live.map()) (void)cudaFreeAsync(ptr, to_cuda(kDefaultStream));
    (void)cudaStreamSynchronize(to_cuda(kDefaultStream));
  }
  (void)cudaMemPoolDestroy(s.pool);
  (void)cudaGetLastError();
}

Expected<void*> AsyncPool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who());
  std::lock_guard lock(s.mutex);
  // The limit holds as in the other pools (sizes and limit rounded as they
  // round), before the driver is asked: its pool would grow to the whole device.
  const std::size_t counted = round_up(bytes, kStatsGranule);
  if (static_cast<std::size_t>(s.usage.bytes_in_use) + counted > round_up(s.bytes_limit, kStatsGranule)) {
    ++s.usage.num_ooms;
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_in_use = static_cast<std::size_t>(s.usage.bytes_in_use);
    report.bytes_reserved = s.attribute(cudaMemPoolAttrReservedMemCurrent);
    report.device_free_bytes = s.cuda_device->mem_info().free_bytes;
    report.largest_free_block_bytes = round_up(s.bytes_limit, kStatsGranule) - report.bytes_in_use;
    report.hint = "the pool's limit of " + format_bytes(s.bytes_limit) + " is reached";
    report.advice = OomAdvice::free_or_raise_limit;
    return Error::out_of_memory(s.who(), std::move(report));
  }
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  void* ptr = nullptr;
  cudaError_t error = cudaMallocFromPoolAsync(&ptr, bytes, s.pool, to_cuda(stream));
  if (error == cudaErrorMemoryAllocation) {
    // As XLA: waiting for the stream lets the driver reuse the memory of
    // frees still in flight, which can turn an OOM into a success.
    (void)cudaGetLastError();
    (void)cudaStreamSynchronize(to_cuda(stream));
    error = cudaMallocFromPoolAsync(&ptr, bytes, s.pool, to_cuda(stream));
  }
  if (error != cudaSuccess) {
    const Error cuda_said = runtime_error("cudaMallocFromPoolAsync", error);
    if (cuda_said.code() != Errc::out_of_memory) {
      return Error(cuda_said.code(), s.who() + ": " + cuda_said.message() + " (" +
                                         std::to_string(bytes) + " bytes)");
    }
    ++s.usage.num_ooms;
    const std::size_t reserved = s.attribute(cudaMemPoolAttrReservedMemCurrent);
    const std::size_t used = s.attribute(cudaMemPoolAttrUsedMemCurrent);
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_in_use = static_cast<std::size_t>(s.usage.bytes_in_use);
    report.bytes_reserved = reserved;
    report.device_free_bytes = s.cuda_device->mem_info().free_bytes;
    report.largest_free_block_bytes = reserved > used ? reserved - used : 0;
    report.hint = cuda_said.message() + "; the device is full: another process or allocator "
                  "holds the rest of it";
    return Error::out_of_memory(s.who(), std::move(report));
  }
  s.live.add(ptr, {bytes, stream});
  s.usage.allocated(counted);
  return ptr;
}

Status AsyncPool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  if (s.maker.forked()) return {};  // the block is the parent's: the child leaves it alone
  std::lock_guard lock(s.mutex);
  auto found = s.live.find(ptr, s.who());
  if (!found) return std::move(found).error();
  ScopedDevice current(s.ordinal);
  if (!current.status()) return current.status().error();
  if (cudaError_t error = cudaFreeAsync(ptr, to_cuda(stream)); error != cudaSuccess) {
    return runtime_error(s.who() + ": cudaFreeAsync of " + format_address(ptr), error);
  }
  s.usage.freed(round_up((*found)->second.bytes, kStatsGranule));
  s.live.erase(*found);
  return {};
}

Stats AsyncPool::stats() const {
  const State& s = *state_;
  if (s.maker.forked()) return {};  // a forked child holds none of it
  std::lock_guard lock(s.mutex);
  ScopedDevice current(s.ordinal);
  Stats stats = s.usage.to_stats();
  const std::size_t reserved = s.attribute(cudaMemPoolAttrReservedMemCurrent);
  const std::size_t used = s.attribute(cudaMemPoolAttrUsedMemCurrent);
  stats.bytes_limit = static_cast<std::int64_t>(s.bytes_limit);
  stats.bytes_reserved = static_cast<std::int64_t>(reserved);
  stats.pool_bytes = stats.bytes_reserved;
  stats.peak_bytes_reserved = static_cast<std::int64_t>(s.attribute(cudaMemPoolAttrReservedMemHigh));
  stats.peak_pool_bytes = stats.peak_bytes_reserved;
  stats.largest_free_block_bytes = static_cast<std::int64_t>(reserved > used ? reserved - used : 0);
  stats.num_device_allocs = 0;
  stats.num_device_frees = 0;
  return stats;
}

std::size_t AsyncPool::trim() {
  State& s = *state_;
  if (s.maker.forked()) return 0;
  std::lock_guard lock(s.mutex);
  ScopedDevice current(s.ordinal);
  if (!current.status()) return 0;
  const std::size_t before = s.attribute(cudaMemPoolAttrReservedMemCurrent);
  // Only memory whose frees have completed can go back: wait for them all.
  (void)cudaDeviceSynchronize();
  (void)cudaMemPoolTrimTo(s.pool, 0);
  (void)cudaGetLastError();
  const std::size_t after = s.attribute(cudaMemPoolAttrReservedMemCurrent);
  return before > after ? before - after : 0;
}

std::string AsyncPool::dump() const {
  const State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal(s.who()).message() + "\n";
  std::lock_guard lock(s.mutex);
  ScopedDevice current(s.ordinal);
  std::vector<std::pair<void*, pool::LiveBlock>> blocks(s.live.map().begin(), s.live.map().end());
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = s.who() + " (" + s.device->description() + "): limit " +
                    format_bytes(s.bytes_limit) + ", release threshold " +
                    format_bytes(s.release_threshold) + ", reserved " +
                    format_bytes(s.attribute(cudaMemPoolAttrReservedMemCurrent)) + " (peak " +
                    format_bytes(s.attribute(cudaMemPoolAttrReservedMemHigh)) + "), driver used " +
                    format_bytes(s.attribute(cudaMemPoolAttrUsedMemCurrent)) + ", " +
                    std::to_string(blocks.size()) + " live blocks, " +
                    format_bytes(static_cast<std::size_t>(s.usage.bytes_in_use)) + " in use\n";
  for (const auto& [ptr, live] : blocks) {
    out += "  in use " + format_address(ptr) + " " + format_bytes(live.bytes) + " stream " +
           std::to_string(live.stream) + "\n";
  }
  return out;
}

Device& AsyncPool::device() const { return *state_->device; }

}  // namespace tidepool
