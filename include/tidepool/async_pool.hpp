// AsyncPool: the driver's stream-ordered allocator (cudaMallocFromPoolAsync /
// cudaFreeAsync), XLA's `cuda_async` (XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async).
// CUDA only (TIDEPOOL_HAVE_CUDA).
//
// As XLA's GpuCudaMallocAsyncAllocator: the pool's release threshold is the
// pool size (bytes_limit) unless set; preallocation allocates the pool size
// once and frees it; an out-of-memory is retried once after synchronizing
// the stream. The limit is enforced as the other pools enforce theirs (bytes
// in use, rounded to 256, never above it), before the driver is asked. The
// pool allocates from the driver directly, around any decorator of the
// device: the stack refuses it over the cross-process ledger
// (mode_supported), whose account cannot bound what the driver's pool holds
// (docs/ledger.md, "Why cuda_async is refused"). Unlike XLA it uses a pool of its own
// (cudaMemPoolCreate) rather than the device's default pool, so its reserved
// bytes and trim() concern this allocator only.
//
// The driver orders reuse across streams itself: a block freed on stream A
// is handed to stream B only once the free has completed.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "tidepool/allocator.hpp"

namespace tidepool {

struct AsyncPoolOptions {
  /// XLA's pool size: XLA_CLIENT_MEM_FRACTION x total. Reported as
  /// bytes_limit; 0 means the device's total.
  std::size_t bytes_limit = 0;
  /// Cached free bytes the pool keeps across synchronizations
  /// (cudaMemPoolAttrReleaseThreshold). Unset: bytes_limit, as XLA sets it.
  std::optional<std::size_t> release_threshold;
  /// Allocate bytes_limit once at creation and free it, so the pool holds it
  /// from the start (XLA_PYTHON_CLIENT_PREALLOCATE=true with cuda_async).
  bool preallocate = false;
};

class AsyncPool final : public Allocator {
 public:
  /// A pool over the CudaDevice under `device`'s decorators (find_cuda_device).
  /// Errors: unsupported when there is no CudaDevice or it lacks memory pools
  /// (cudaDevAttrMemoryPoolsSupported); out_of_memory when preallocation
  /// fails; device_error with the CUDA error. Any release threshold is
  /// allowed, as in CUDA (above bytes_limit it simply never releases early).
  static Expected<std::unique_ptr<AsyncPool>> create(std::shared_ptr<Device> device,
                                                     AsyncPoolOptions options = {});
  /// Frees what is still live (on its streams), waits, and destroys the pool.
  ~AsyncPool() override;

  /// "cuda_async".
  std::string_view name() const override { return "cuda_async"; }
  /// cudaMallocFromPoolAsync on `stream` (a cudaStream_t of this device, or
  /// 0): the memory may be used by work queued on that stream at once, by
  /// other streams after synchronizing with it. out_of_memory when it would
  /// take bytes in use above bytes_limit (the driver is not asked), or with
  /// the CUDA error in the hint when the driver refuses twice.
  Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) override;
  /// ptr came from allocate() and is not freed yet; cudaFreeAsync on `stream`
  /// (after work queued there that uses ptr).
  Status deallocate(void* ptr, Stream stream = kDefaultStream) override;
  /// bytes_in_use and the counts are the pool's (sizes rounded to 256 bytes,
  /// as the other pools count); bytes_reserved, pool_bytes and their peaks are
  /// the driver's cudaMemPoolAttrReservedMemCurrent / ReservedMemHigh;
  /// largest_free_block_bytes is reserved minus cudaMemPoolAttrUsedMemCurrent,
  /// an upper bound (the driver does not say how its free memory is split).
  /// num_device_allocs/frees stay 0: the driver's own calls are not visible.
  Stats stats() const override;
  /// Waits for the device, then cudaMemPoolTrimTo(0). Returns the reserved
  /// bytes it gave back.
  std::size_t trim() override;
  std::string dump() const override;
  Device& device() const override;

 private:
  struct State;
  explicit AsyncPool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
