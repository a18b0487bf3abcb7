// libtidepool_preload.so: LD_PRELOAD it (tidepool run does) into an
// unmodified program and its CUDA driver allocations are accounted in the
// cross-process ledger under the process's quota (TIDEPOOL_QUOTA):
//
//   cuMemAlloc_v2, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemCreate
//       reserve the bytes in the ledger first; beyond the quota they return
//       CUDA_ERROR_OUT_OF_MEMORY without calling the driver.
//   cuMemFree_v2, cuMemFreeAsync, cuMemRelease   release what they reserved.
//   cuMemGetInfo_v2   reports the quota as total and what this process may
//       still reserve as free, so a framework that preallocates a fraction of
//       the "device" (JAX: 75%) takes that fraction of its quota.
//   cuDeviceTotalMem_v2   reports the quota as the device's size (PyTorch's
//       total_memory, XLA's device description).
//
// Programs reach the driver three ways, and each is intercepted:
//   - linked against libcuda: these exported symbols come first (LD_PRELOAD);
//   - dlopen("libcuda.so.1") + dlsym(handle, "cuMemAlloc_v2") (XLA's stubs):
//     dlsym itself is interposed, the real one found with dlvsym;
//   - cuGetProcAddress (the runtime, cudaGetDriverEntryPoint): its answer for
//     these functions is replaced by a wrapper around the pointer it gave.
// Each real function is kept per way it was obtained ("slots"), so a wrapper
// always forwards to exactly the function the program would have called
// (e.g. the per-thread-default-stream variant the runtime asked for). Slot 0
// is the exported symbol of the next object (or of libcuda.so.1 loaded
// RTLD_LOCAL), never an answer: a per-thread-stream function must not become
// what the legacy export forwards to, nor this library's own export (found by
// dlsym(RTLD_DEFAULT)) what it calls.
//
// Each device's LedgerAccount (registered at its first allocation, as
// resolve_ledger decides) is reserved in before the wrapper's real call and
// given back when the driver refuses it or the memory is freed.
//
// With TIDEPOOL_POOL (tidepool run --pool MODE), cuMemAlloc_v2/cuMemFree_v2
// are served by a tidepool pool that reserves in the same account: the
// stack's LedgerDevice over a DriverDevice, which makes the driver's own
// calls for the pool (virtual memory, or cuMemAlloc regions); a free waits
// for the device first, as cuMemFree does. With
// TIDEPOOL_RECORD (--record FILE), every allocation and free is written to a
// trace (trace_file.hpp). docs/interop.md.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stack/ledger_stack.hpp"
#include "driver_abi.hpp"
#include "pool_summary.hpp"
#include "trace_file.hpp"
#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/device.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"

#define TIDEPOOL_EXPORT extern "C" __attribute__((visibility("default")))

namespace tidepool::preload {
namespace {

// --- the real functions ------------------------------------------------------

using DlsymFn = void* (*)(void*, const char*);

/// glibc's dlsym, found by version so that it is not this library's.
DlsymFn real_dlsym() {
  static const DlsymFn found = [] {
    for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"})
      if (void* symbol = dlvsym(RTLD_NEXT, "dlsym", version)) return reinterpret_cast<DlsymFn>(symbol);
    return static_cast<DlsymFn>(nullptr);
  }();
  return found;
}

/// The intercepted functions, one per symbol the driver exports.
enum Fn : int {
  mem_alloc,
  mem_free,
  mem_get_info,
  mem_alloc_async,
  mem_alloc_async_ptsz,
  mem_free_async,
  mem_free_async_ptsz,
  mem_alloc_from_pool_async,
  mem_alloc_from_pool_async_ptsz,
  mem_create,
  mem_release,
  device_total_mem,
  get_proc_address_v1,
  get_proc_address_v2,
  fn_count
};

struct FnInfo {
  const char* symbol;     // the exported name
  const char* proc_name;  // the name cuGetProcAddress is asked for; null: none of its own
  int min_version;        // the first CUDA version (cudaVersion) with this ABI under proc_name
  int max_version;        // the last one, inclusive; kLatest: none newer up to kKnownCudaVersion
};

constexpr int kLatest = 1 << 30;

// cuGetProcAddress("cuGetProcAddress") returns the 5-argument _v2 from 12.0 on.
// There is no exported cuGetProcAddress_v2_ptsz: cuda.h defines it inline,
// as cuGetProcAddress_v2 with the per-thread flag added (docs/interop.md).
constexpr std::array<FnInfo, fn_count> kFns = {{
    {"cuMemAlloc_v2", "cuMemAlloc", 3020, kLatest},
    {"cuMemFree_v2", "cuMemFree", 3020, kLatest},
    {"cuMemGetInfo_v2", "cuMemGetInfo", 3020, kLatest},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, kLatest},
    {"cuMemAllocAsync_ptsz", nullptr, 0, 0},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, kLatest},
    {"cuMemFreeAsync_ptsz", nullptr, 0, 0},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, kLatest},
    {"cuMemAllocFromPoolAsync_ptsz", nullptr, 0, 0},
    {"cuMemCreate", "cuMemCreate", 10020, kLatest},
    {"cuMemRelease", "cuMemRelease", 10020, kLatest},
    {"cuDeviceTotalMem_v2", "cuDeviceTotalMem", 3020, kLatest},
    {"cuGetProcAddress", "cuGetProcAddress", 11030, 11999},
    {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, kLatest},
}};

/// Whether `address` lies in this library (its exports and wrappers).
bool in_this_library(const void* address) {
  static const void* const self_base = [] {
    Dl_info self{};
    return dladdr(reinterpret_cast<const void*>(&in_this_library), &self) != 0 ? self.dli_fbase : nullptr;
  }();
  Dl_info where{};
  return address != nullptr && dladdr(address, &where) != 0 && where.dli_fbase == self_base;
}

/// The driver's export `symbol`: from the objects after this one, else from
/// libcuda.so.1 loaded RTLD_LOCAL (by a Python extension, say), which is not
/// in the global scope. Never this library's own.
void* next_symbol(const char* symbol) {
  DlsymFn lookup = real_dlsym();
  if (lookup == nullptr) return nullptr;
  void* found = lookup(RTLD_NEXT, symbol);
  if (found == nullptr) {
    if (void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
      found = lookup(cuda, symbol);
      dlclose(cuda);  // only drops the reference NOLOAD took
    }
  }
  return in_this_library(found) ? nullptr : found;
}

/// Slot 0: the exported symbol (next_symbol); slots 1-3: further distinct
/// pointers (a dlsym or cuGetProcAddress answer that is not the export, as
/// the per-thread-stream variants and the runtime's entry points are).
constexpr int kSlots = 4;
std::array<std::array<std::atomic<void*>, kSlots>, fn_count> g_real{};

/// The real function of `fn` in `slot`; slot 0 resolves the exported
/// symbol on first use. Null when there is none.
template <class FnPtr>
FnPtr real_of(Fn fn, int slot) {
  void* real = g_real[fn][slot].load(std::memory_order_acquire);
  if (real == nullptr && slot == 0) {
    if (void* next = next_symbol(kFns[fn].symbol); next != nullptr) {
      void* expected = nullptr;
      g_real[fn][0].compare_exchange_strong(expected, next);
      real = g_real[fn][0].load(std::memory_order_acquire);
    }
  }
  return reinterpret_cast<FnPtr>(real);
}

/// The slot holding `real` for `fn`: 0 when it is the export, else one of
/// the others, claiming an empty one; -1 when all hold other functions (the
/// pointer is then handed out unwrapped).
int claim_slot(Fn fn, void* real) {
  if (real_of<void*>(fn, 0) == real) return 0;
  for (int slot = 1; slot < kSlots; ++slot) {
    void* expected = nullptr;
    if (g_real[fn][slot].compare_exchange_strong(expected, real) || expected == real) return slot;
  }
  return -1;
}

template <class FnPtr>
void* as_pointer(FnPtr fn) {
  return reinterpret_cast<void*>(fn);
}

/// A helper driver function this library calls but does not wrap.
template <class FnPtr>
FnPtr driver_helper(const char* symbol) {
  return reinterpret_cast<FnPtr>(next_symbol(symbol));
}

// --- the device of --pool: the driver calls the pool makes for itself --------

/// The driver calls the pool of `tidepool run --pool` makes for itself,
/// past this library: the allocations the program's calls are served from.
struct DriverVmm {
  MemAllocFn alloc = nullptr;
  MemFreeFn free = nullptr;
  MemCreateFn create = nullptr;
  MemReleaseFn release = nullptr;
  MemGetAllocationGranularityFn granularity = nullptr;
  MemAddressReserveFn reserve = nullptr;
  MemAddressFreeFn address_free = nullptr;
  MemMapFn map = nullptr;
  MemSetAccessFn set_access = nullptr;
  MemUnmapFn unmap = nullptr;
  CtxSynchronizeFn synchronize = nullptr;
  CtxGetCurrentFn get_current = nullptr;
  CtxSetCurrentFn set_current = nullptr;

  /// The driver's functions; an error naming the first it lacks.
  static Expected<const DriverVmm*> find();
};

Expected<const DriverVmm*> DriverVmm::find() {
  static const DriverVmm found = [] {
    DriverVmm vmm;
    vmm.alloc = real_of<MemAllocFn>(mem_alloc, 0);
    vmm.free = real_of<MemFreeFn>(mem_free, 0);
    vmm.create = real_of<MemCreateFn>(mem_create, 0);
    vmm.release = real_of<MemReleaseFn>(mem_release, 0);
    vmm.granularity = driver_helper<MemGetAllocationGranularityFn>("cuMemGetAllocationGranularity");
    vmm.reserve = driver_helper<MemAddressReserveFn>("cuMemAddressReserve");
    vmm.address_free = driver_helper<MemAddressFreeFn>("cuMemAddressFree");
    vmm.map = driver_helper<MemMapFn>("cuMemMap");
    vmm.set_access = driver_helper<MemSetAccessFn>("cuMemSetAccess");
    vmm.unmap = driver_helper<MemUnmapFn>("cuMemUnmap");
    vmm.synchronize = driver_helper<CtxSynchronizeFn>("cuCtxSynchronize");
    vmm.get_current = driver_helper<CtxGetCurrentFn>("cuCtxGetCurrent");
    vmm.set_current = driver_helper<CtxSetCurrentFn>("cuCtxSetCurrent");
    return vmm;
  }();
  const std::pair<const char*, void*> needed[] = {
      {"cuMemAlloc_v2", as_pointer(found.alloc)},          {"cuMemFree_v2", as_pointer(found.free)},
      {"cuMemCreate", as_pointer(found.create)},           {"cuMemRelease", as_pointer(found.release)},
      {"cuMemGetAllocationGranularity", as_pointer(found.granularity)},
      {"cuMemAddressReserve", as_pointer(found.reserve)},  {"cuMemAddressFree", as_pointer(found.address_free)},
      {"cuMemMap", as_pointer(found.map)},                 {"cuMemSetAccess", as_pointer(found.set_access)},
      {"cuMemUnmap", as_pointer(found.unmap)},             {"cuCtxSynchronize", as_pointer(found.synchronize)},
      {"cuCtxGetCurrent", as_pointer(found.get_current)},  {"cuCtxSetCurrent", as_pointer(found.set_current)}};
  for (const auto& [name, function] : needed)
    if (function == nullptr) return Error(Errc::unsupported, std::string("the driver has no ") + name);
  return &found;
}

/// Makes `context` current for the scope (the pool's calls from a thread
/// of the program that has another, or none), then restores the previous.
class ScopedContext {
 public:
  ScopedContext(const DriverVmm& vmm, CUcontext context) : vmm_(vmm) {
    if (context == nullptr || vmm.get_current(&previous_) != CUDA_SUCCESS || previous_ == context) return;
    restore_ = vmm.set_current(context) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (restore_) vmm_.set_current(previous_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const DriverVmm& vmm_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

/// One CUDA device as the pool of `tidepool run --pool` sees it: the
/// driver's calls made for the pool, past this library's wrappers, with the
/// device's context current. The ledger decorates it (LedgerDevice) with
/// the process's account, the one the program's own calls reserve in.
class DriverDevice final : public Device {
 public:
  DriverDevice(CUdevice ordinal, std::string id, std::size_t total_bytes, const DriverVmm& vmm, CUcontext context)
      : ordinal_(ordinal), id_(std::move(id)), total_bytes_(total_bytes), vmm_(vmm), context_(context),
        granularity_(query_granularity()) {}

  std::string id() const override { return id_; }
  std::string description() const override {
    return "CUDA device " + std::to_string(ordinal_) + " (" + id_ + ") through the driver's calls";
  }
  Expected<void*> allocate(std::size_t bytes) override {
    CUdeviceptr ptr = 0;
    if (Status done = own("cuMemAlloc", bytes, [&] { return vmm_.alloc(&ptr, bytes); }); !done)
      return std::move(done).error();
    remember(ptr, bytes);
    return reinterpret_cast<void*>(ptr);
  }
  Status free(void* ptr, std::size_t bytes) override {
    const auto address = reinterpret_cast<CUdeviceptr>(ptr);
    Status done = own("cuMemFree", bytes, [&] { return vmm_.free(address); });
    if (done) forget(address);
    return done;
  }
  /// The device's size (cuDeviceTotalMem_v2, which needs no context); free
  /// is the driver's (cuMemGetInfo_v2) while this device's context is
  /// current, else unknown and reported as the size.
  MemInfo mem_info() const override {
    static const auto get_info = driver_helper<MemGetInfoFn>("cuMemGetInfo_v2");
    static const auto get_device = driver_helper<CtxGetDeviceFn>("cuCtxGetDevice");
    CUdevice current = -1;
    std::size_t free_bytes = 0, total_bytes = 0;
    if (get_info != nullptr && get_device != nullptr && get_device(&current) == CUDA_SUCCESS &&
        current == ordinal_ && get_info(&free_bytes, &total_bytes) == CUDA_SUCCESS)
      return {std::min(free_bytes, total_bytes_), total_bytes_};
    return {total_bytes_, total_bytes_};
  }
  std::size_t granularity() const override { return granularity_; }
  bool supports_virtual_memory() const override { return true; }
  Expected<void*> reserve(std::size_t va_bytes) override {
    CUdeviceptr base = 0;
    if (Status done = own("cuMemAddressReserve", va_bytes,
                          [&] { return vmm_.reserve(&base, va_bytes, granularity_, 0, 0); });
        !done)
      return std::move(done).error();
    remember(base, va_bytes);
    return reinterpret_cast<void*>(base);
  }
  Status unreserve(void* va, std::size_t va_bytes) override {
    const auto base = reinterpret_cast<CUdeviceptr>(va);
    Status done = own("cuMemAddressFree", va_bytes, [&] { return vmm_.address_free(base, va_bytes); });
    if (done) forget(base);
    return done;
  }
  Expected<PhysicalHandle> create(std::size_t bytes) override {
    const CUmemAllocationProp prop = device_prop();
    CUmemGenericAllocationHandle handle = 0;
    if (Status done = own("cuMemCreate", bytes, [&] { return vmm_.create(&handle, bytes, &prop, 0); }); !done)
      return std::move(done).error();
    return PhysicalHandle{handle};
  }
  Status map(void* va, std::size_t bytes, PhysicalHandle handle) override {
    const auto address = reinterpret_cast<CUdeviceptr>(va);
    if (Status done = own("cuMemMap", bytes, [&] { return vmm_.map(address, bytes, 0, handle, 0); }); !done)
      return done;
    const CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, ordinal_}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    Status done = own("cuMemSetAccess", bytes, [&] { return vmm_.set_access(address, bytes, &access, 1); });
    if (!done) (void)own("cuMemUnmap", bytes, [&] { return vmm_.unmap(address, bytes); });
    return done;
  }
  Status unmap(void* va, std::size_t bytes) override {
    const auto address = reinterpret_cast<CUdeviceptr>(va);
    return own("cuMemUnmap", bytes, [&] { return vmm_.unmap(address, bytes); });
  }
  Status release(PhysicalHandle handle, std::size_t bytes) override {
    return own("cuMemRelease", bytes, [&] { return vmm_.release(handle); });
  }
  /// The whole device: what cuMemFree waits for (docs/interop.md).
  Status synchronize(Stream) override {
    return own("cuCtxSynchronize", 0, [&] { return vmm_.synchronize(); });
  }

  /// Whether `address` lies in memory the pool took from the driver (a
  /// reservation or a cuMemAlloc region): the pool's, never the driver's to free.
  bool owns(CUdeviceptr address) const {
    std::lock_guard lock(ranges_mutex_);
    auto it = ranges_.upper_bound(address);
    if (it == ranges_.begin()) return false;
    --it;
    return address < it->first + it->second;
  }

 private:
  CUmemAllocationProp device_prop() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal_;
    return prop;
  }
  std::size_t query_granularity() const {
    const CUmemAllocationProp prop = device_prop();
    std::size_t granularity = 0;
    if (vmm_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || granularity == 0)
      return 2 * MiB;
    return granularity;
  }

  template <class Call>
  Status own(const char* what, std::size_t bytes, Call&& call) const {
    ScopedContext current(vmm_, context_);
    const CUresult result = call();
    if (result == CUDA_SUCCESS) return {};
    const std::string message = description() + ": " + what + " of " + format_bytes(bytes) + " failed (CUresult " +
                                std::to_string(result) + ")";
    return Error(result == CUDA_ERROR_OUT_OF_MEMORY ? Errc::out_of_memory : Errc::device_error, message);
  }
  void remember(CUdeviceptr base, std::size_t bytes) {
    std::lock_guard lock(ranges_mutex_);
    ranges_[base] = bytes;
  }
  void forget(CUdeviceptr base) {
    std::lock_guard lock(ranges_mutex_);
    ranges_.erase(base);
  }

  CUdevice ordinal_;
  std::string id_;
  std::size_t total_bytes_;
  const DriverVmm& vmm_;
  CUcontext context_;  // the pool's calls are made in it; null: the caller's
  std::size_t granularity_;
  mutable std::mutex ranges_mutex_;
  std::map<CUdeviceptr, std::size_t> ranges_;  // the pool's reservations and regions
};

// --- accounting ---------------------------------------------------------------

struct Allocation {
  std::size_t bytes = 0;
  CUdevice device = 0;
};

/// A device's ledger account and what it was registered with.
struct DeviceAccount {
  std::shared_ptr<LedgerAccount> account;
  LedgerDeviceFacts facts;
};

/// --pool: a device's pool, the device under it, and what it served.
struct ServingPool {
  std::unique_ptr<Allocator> pool;
  std::shared_ptr<DriverDevice> driver;
  std::int64_t live_bytes = 0;       // as the program asked for them
  std::int64_t peak_live_bytes = 0;

  void served(std::int64_t delta) {
    live_bytes += delta;
    peak_live_bytes = std::max(peak_live_bytes, live_bytes);
  }
  PoolSummary summary(CUdevice device, Mode mode) const {
    return PoolSummary::of(device, std::string(mode_name(mode)), pool->stats(), peak_live_bytes);
  }
};

/// The process's ledger entries (one per device it allocates on) and what
/// each live allocation reserved. Never destroyed: shut_down() at exit
/// clears the entries, and calls after it pass straight to the driver.
class Interposer {
 public:
  static Interposer& instance() {
    static Interposer* const interposer = [] {
      auto* created = new Interposer();
      created->trace_ = TraceFile::from_env();
      created->pool_mode_ = pool_mode_from_env();
      std::atexit([] { instance().shut_down(); });
      pthread_atfork(nullptr, nullptr, [] { instance().forget_after_fork(); });
      return created;
    }();
    return *interposer;
  }

  /// Reserves `bytes` on `device` in the ledger, then makes `call` (on
  /// `stream`); records `key` (an address or a handle) when both succeed.
  CUresult allocate(CUdevice device, std::size_t bytes, bool physical, CUstream stream,
                    const std::function<CUresult()>& call, const std::function<unsigned long long()>& key) {
    const CUresult result = allocate_accounted(device, bytes, physical, call, key);
    if (trace_ == nullptr) return result;
    if (result != CUDA_SUCCESS)
      trace_->failed_allocation();
    else
      trace_->allocated(physical, key(), bytes, stream, device);
    return result;
  }

  /// Makes `call` (a free or release of `key`, on `stream`) and releases
  /// what the allocation reserved.
  CUresult free(bool physical, unsigned long long key, CUstream stream, const std::function<CUresult()>& call) {
    const CUresult result = free_accounted(physical, key, call);
    if (trace_ != nullptr && result == CUDA_SUCCESS) trace_->freed(physical, key, stream);
    return result;
  }

 private:
  CUresult allocate_accounted(CUdevice device, std::size_t bytes, bool physical,
                              const std::function<CUresult()>& call, const std::function<unsigned long long()>& key) {
    std::shared_ptr<const DeviceAccount> entry = account_for(device);
    if (entry == nullptr) return refused_without_ledger(call);
    LedgerAccount& account = *entry->account;
    if (Status reserved = account.reserve(bytes); !reserved) {
      report_refusal(bytes, reserved.error());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (const CUresult result = call(); result != CUDA_SUCCESS) {
      account.unreserve(bytes);
      return result;  // the driver's own failure
    }
    std::lock_guard lock(mutex_);
    (physical ? handles_ : addresses_)[key()] = Allocation{bytes, device};
    return CUDA_SUCCESS;
  }

  /// Keys this library did not record (allocated before it was loaded, or
  /// passed through) are only forwarded.
  CUresult free_accounted(bool physical, unsigned long long key, const std::function<CUresult()>& call) {
    std::optional<Allocation> allocation;
    {
      std::lock_guard lock(mutex_);
      auto& table = physical ? handles_ : addresses_;
      if (auto it = table.find(key); it != table.end() && !stopped_) {
        allocation = it->second;
        table.erase(it);
      }
    }
    if (!allocation) return call();
    std::shared_ptr<const DeviceAccount> entry = account_for(allocation->device);
    if (entry == nullptr) return call();
    const CUresult result = call();
    if (result == CUDA_SUCCESS) {
      entry->account->unreserve(allocation->bytes);
    } else {  // still allocated: keep the record
      std::lock_guard lock(mutex_);
      (physical ? handles_ : addresses_)[key] = *allocation;
    }
    return result;
  }

 public:
  /// --pool: cuMemAlloc_v2 of `bytes` on `device` served by its pool.
  /// nullopt when the device has no pool (the caller accounts the driver's).
  std::optional<CUresult> serve(CUdevice device, std::size_t bytes, CUdeviceptr* dptr) {
    Allocator* pool = pool_for(device);
    if (pool == nullptr) return std::nullopt;
    Expected<void*> block = pool->allocate(bytes, kDefaultStream);
    if (!block) {
      if (trace_ != nullptr) trace_->failed_allocation();
      report_refusal(bytes, block.error());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = reinterpret_cast<CUdeviceptr>(*block);
    {
      std::lock_guard lock(mutex_);
      served_[*dptr] = Allocation{bytes, device};
      if (auto it = pools_.find(device); it != pools_.end()) it->second.served(static_cast<std::int64_t>(bytes));
    }
    if (trace_ != nullptr) trace_->allocated(false, *dptr, bytes, nullptr, device);
    return CUDA_SUCCESS;
  }

  /// --pool: cuMemFree_v2 of a block the pool served. nullopt when `dptr`
  /// is not the pool's (the driver's own: passed on untouched).
  std::optional<CUresult> free_served(CUdeviceptr dptr) {
    Allocation block;
    ServingPool* serving = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!pool_mode_ || stopped_) return std::nullopt;
      auto it = served_.find(dptr);
      if (it == served_.end()) {
        // Freed already, or inside a block: the driver would refuse it too.
        for (auto& [device, pool] : pools_)
          if (pool.driver->owns(dptr)) return CUDA_ERROR_INVALID_VALUE;
        return std::nullopt;
      }
      block = it->second;
      served_.erase(it);
      serving = &pools_[block.device];
    }
    // cuMemFree waits for the device: a caller may reuse the memory (or let
    // another stream reuse it) as soon as it returns (docs/interop.md).
    if (Status done = serving->driver->synchronize(kDefaultStream); !done) report_free_problem(done.error());
    if (Status done = serving->pool->deallocate(reinterpret_cast<void*>(dptr), kDefaultStream); !done) {
      report_free_problem(done.error());
      return CUDA_ERROR_INVALID_VALUE;
    }
    {
      std::lock_guard lock(mutex_);
      serving->served(-static_cast<std::int64_t>(block.bytes));
    }
    if (trace_ != nullptr) trace_->freed(false, dptr, nullptr);
    return CUDA_SUCCESS;
  }

  /// cuMemGetInfo_v2 as the ledger reports it for the current device: the
  /// account's share of what the driver says.
  CUresult mem_info(std::size_t* free_bytes, std::size_t* total_bytes, const std::function<CUresult()>& call) {
    CUdevice device = 0;
    if (free_bytes == nullptr || total_bytes == nullptr || !current_device(&device)) return call();
    std::shared_ptr<const DeviceAccount> entry = account_for(device);
    if (entry == nullptr) return call();
    const CUresult result = call();  // the driver's own checks (a context) first
    if (result != CUDA_SUCCESS) return result;
    const std::size_t total = entry->facts.total_bytes;
    const MemInfo share = entry->account->share_of(MemInfo{std::min(*free_bytes, total), total});
    // --pool: what the pool holds unused is free to the program too.
    *free_bytes = std::min(share.total_bytes, share.free_bytes + pool_cached_bytes(device));
    *total_bytes = share.total_bytes;
    return CUDA_SUCCESS;
  }

  /// The device of the current context; false when there is none.
  bool current_device(CUdevice* device) {
    static const auto get_device = driver_helper<CtxGetDeviceFn>("cuCtxGetDevice");
    return get_device != nullptr && get_device(device) == CUDA_SUCCESS;
  }

  bool stopped() {
    std::lock_guard lock(mutex_);
    return stopped_;
  }

  /// --pool: cuMemAlloc_v2 is served by a pool (serve()).
  bool serves_pool() const { return pool_mode_.has_value(); }

  /// The size cuDeviceTotalMem_v2 reports for `device` (of `total` bytes):
  /// its ledger entry's total where it has one, else the quota it would
  /// get, so that asking registers nothing (a program that lists its
  /// devices commits no quota on those it never allocates on).
  std::size_t reported_total(CUdevice device, std::size_t total) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return total;
      if (auto it = accounts_.find(device); it != accounts_.end()) {
        const std::size_t registered = it->second->facts.total_bytes;
        return it->second->account->share_of(MemInfo{registered, registered}).total_bytes;
      }
    }
    auto config = Config::from_env();
    if (!config) return total;
    // Only the quota is read: the device's id (the segment's name) is not needed.
    auto options = resolve_ledger(*config, LedgerDeviceFacts{std::string(), total, device});
    if (!options || options->quota_bytes == 0) return total;
    return std::min(options->quota_bytes, total);
  }

 private:
  Interposer() = default;

  static std::optional<Mode> pool_mode_from_env() {
    const char* name = std::getenv("TIDEPOOL_POOL");
    if (name == nullptr || *name == '\0') return std::nullopt;
    auto mode = parse_mode(name);
    if (mode && *mode != Mode::cuda_async) return *mode;
    std::fprintf(stderr, "tidepool: error: TIDEPOOL_POOL='%s': %s; the program's allocations go to the driver\n",
                 name, mode ? "the driver's own pool (cuda_async) cannot serve it" : mode.error().message().c_str());
    return std::nullopt;
  }

  /// The pool serving `device`, registering its ledger entry on first use;
  /// null when it has none.
  Allocator* pool_for(CUdevice device) {
    if (account_for(device) == nullptr) return nullptr;
    std::lock_guard lock(mutex_);
    auto it = pools_.find(device);
    return it == pools_.end() ? nullptr : it->second.pool.get();
  }

  std::size_t pool_cached_bytes(CUdevice device) {
    std::lock_guard lock(mutex_);
    auto it = pools_.find(device);
    if (it == pools_.end()) return 0;
    const Stats stats = it->second.pool->stats();
    return static_cast<std::size_t>(std::max<std::int64_t>(0, stats.bytes_reserved - stats.bytes_in_use));
  }

  void report_free_problem(const Error& error) {
    std::lock_guard lock(mutex_);
    if (free_problems_++ == 0)
      std::fprintf(stderr, "tidepool: error: a free through the pool failed: %s (further are not printed)\n",
                   error.message().c_str());
  }

  /// At exit: each pool's figures on stderr, and in TIDEPOOL_REPORT's file.
  void report_pools(const std::map<CUdevice, ServingPool>& pools) {
    for (const auto& [device, serving] : pools) {
      const PoolSummary summary = serving.summary(device, *pool_mode_);
      std::fprintf(stderr, "tidepool: %s\n", summary.text().c_str());
      if (const char* file = std::getenv("TIDEPOOL_REPORT"); file != nullptr && *file != '\0')
        if (Status written = summary.write(file_of_this_process(file)); !written)
          std::fprintf(stderr, "tidepool: error: TIDEPOOL_REPORT: %s\n", written.error().message().c_str());
    }
  }

  /// The ledger account of `device`, registering on first use. Null after
  /// shut_down or when registering failed; a failure is said once per
  /// device on stderr and not kept: the next allocation tries again (the
  /// driver may not have been initialized yet, or another process may have
  /// left room in the ledger since).
  std::shared_ptr<const DeviceAccount> account_for(CUdevice device) {
    std::lock_guard lock(mutex_);
    if (stopped_) return nullptr;
    if (auto it = accounts_.find(device); it != accounts_.end()) return it->second;
    auto registered = register_device(device);
    if (!registered) {
      if (said_failed_.insert(device).second)
        std::fprintf(stderr,
                     "tidepool: error: device %d is not accounted in the ledger: %s; its allocations fail "
                     "with CUDA_ERROR_OUT_OF_MEMORY until it is (further failures are not printed)\n",
                     device, registered.error().message().c_str());
      return nullptr;
    }
    auto entry = std::make_shared<const DeviceAccount>(std::move(*registered));
    accounts_[device] = entry;
    if (pool_mode_) make_pool_locked(device, *entry);
    return entry;
  }

  /// Under the lock: the pool of `tidepool run --pool` on `device`, over a
  /// DriverDevice decorated with its account (the one the program's own
  /// calls reserve in). A pool that cannot be made is said, and the
  /// device's allocations go to the driver, accounted, as without --pool.
  void make_pool_locked(CUdevice device, const DeviceAccount& entry) {
    auto config = Config::from_env();  // read once already by register_device: valid
    auto vmm = DriverVmm::find();      // found already by register_device
    if (!config || !vmm) return;
    // An OOM names what the user can change: the fraction they set, else the
    // quota (the pool has all of it), else nothing (it has the whole device).
    pool_words_ = config->oom_words();
    if (config->mem_fraction.is_default()) pool_words_.limit = config->quota.value ? "--quota" : "";
    // The pool may take the whole device (or quota) unless a fraction is set:
    // the program under it asked for no preallocation of its own.
    if (config->mem_fraction.is_default()) config->mem_fraction = Setting<double>(1.0, {Origin::program, "tidepool run --pool", "1"});
    CUcontext context = nullptr;
    (*vmm)->get_current(&context);  // the pool's calls are made in the context current now
    auto driver = std::make_shared<DriverDevice>(device, entry.facts.id, entry.facts.total_bytes, **vmm, context);
    auto pool = make_allocator(*pool_mode_, *config, std::make_shared<LedgerDevice>(driver, entry.account));
    if (!pool) {
      std::fprintf(stderr,
                   "tidepool: error: --pool %s on device %d: %s; its allocations go to the driver, accounted in "
                   "the ledger\n",
                   std::string(mode_name(*pool_mode_)).c_str(), device, pool.error().message().c_str());
      return;
    }
    pools_[device] = ServingPool{std::move(*pool), std::move(driver)};
  }

  /// What the ledger needs of `device`, from the driver: its size (from the
  /// device itself, not the current context's: cuMemCreate names its device
  /// in prop->location and needs no current context) and its UUID.
  static Expected<LedgerDeviceFacts> device_facts(CUdevice device) {
    const auto total_mem = driver_helper<DeviceTotalMemFn>("cuDeviceTotalMem_v2");  // not kept: retried
    if (total_mem == nullptr) return Error(Errc::device_error, "the driver has no cuDeviceTotalMem_v2");
    std::size_t total = 0;
    if (const CUresult result = total_mem(&total, device); result != CUDA_SUCCESS || total == 0)
      return Error(Errc::device_error, "cuDeviceTotalMem_v2 of device " + std::to_string(device) +
                                           " failed (CUresult " + std::to_string(result) + ")");
    std::string id = "cuda-device-" + std::to_string(device);
    if (auto get_uuid = driver_helper<DeviceGetUuidFn>("cuDeviceGetUuid_v2")) {
      CUuuid uuid{};
      if (get_uuid(&uuid, device) == CUDA_SUCCESS) id = format_gpu_uuid(uuid.bytes);
    }
    return LedgerDeviceFacts{std::move(id), total, device};
  }

  /// Registers this process in `device`'s ledger, as resolve_ledger decides.
  Expected<DeviceAccount> register_device(CUdevice device) {
    auto config = Config::from_env();
    if (!config) return std::move(config).error();
    if (pool_mode_) {
      if (auto found = DriverVmm::find(); !found)
        return Error(found.error().code(), "--pool " + std::string(mode_name(*pool_mode_)) + ": " +
                                               found.error().message());
    }
    Expected<LedgerDeviceFacts> facts = device_facts(device);
    if (!facts) return std::move(facts).error();
    Expected<LedgerOptions> options = resolve_ledger(*config, *facts);
    if (!options) return std::move(options).error();
    // An unmodified program cannot give cached memory back when asked. The
    // pool of --pool can: the account's thread answers for it (its trim, with
    // the device's context made current) and reports what it holds unused.
    if (!pool_mode_) options->poll_period = std::chrono::milliseconds(0);
    auto account = LedgerAccount::open(facts->id, facts->total_bytes, std::move(*options));
    if (!account) return std::move(account).error();
    return DeviceAccount{std::move(*account), std::move(*facts)};
  }

  /// A device whose ledger entry could not be registered gets nothing (its
  /// quota could not be guaranteed); after shut_down, the driver decides.
  CUresult refused_without_ledger(const std::function<CUresult()>& call) {
    std::lock_guard lock(mutex_);
    if (stopped_) return call();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }

  void report_refusal(std::size_t bytes, const Error& error) {
    std::lock_guard lock(mutex_);
    if (refusals_++ == 0)
      std::fprintf(stderr, "tidepool: an allocation of %s was refused: %s (further refusals are not printed)\n",
                   format_bytes(bytes).c_str(), error.worded(pool_words_).message().c_str());
  }

  void shut_down() {
    if (trace_ != nullptr) trace_->flush(/*last=*/true);
    std::map<CUdevice, std::shared_ptr<const DeviceAccount>> accounts;
    std::map<CUdevice, ServingPool> pools;
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
      accounts.swap(accounts_);
      pools.swap(pools_);
      addresses_.clear();
      handles_.clear();
      served_.clear();
    }
    report_pools(pools);
    pools.clear();    // each gives its memory back to the driver
    accounts.clear();  // each clears its entry in the segment (a call in flight holds its own)
  }

  /// A forked child is not the process registered: forget the entries
  /// without clearing them (the parent still holds them).
  void forget_after_fork() {
    static auto* parents = new std::vector<std::shared_ptr<const DeviceAccount>>();
    for (auto& [device, entry] : accounts_) parents->push_back(std::move(entry));
    accounts_.clear();
    for (auto& [device, serving] : pools_) (void)serving.pool.release();  // the parent's memory: not freed here
    pools_.clear();
    served_.clear();
    addresses_.clear();
    handles_.clear();
    said_failed_.clear();
    new (&mutex_) std::mutex();  // another thread may have held it at fork
    if (trace_ != nullptr) trace_->restart_after_fork();
  }

  std::mutex mutex_;
  bool stopped_ = false;
  std::map<CUdevice, std::shared_ptr<const DeviceAccount>> accounts_;
  std::set<CUdevice> said_failed_;
  std::map<CUdeviceptr, Allocation> addresses_;
  std::map<CUmemGenericAllocationHandle, Allocation> handles_;
  std::size_t refusals_ = 0;
  OomWords pool_words_;  // --pool: the names an OOM's advice uses (make_pool_locked)
  std::size_t free_problems_ = 0;
  TraceFile* trace_ = nullptr;  // --record: null when not recording
  std::optional<Mode> pool_mode_;              // --pool: the mode cuMemAlloc_v2 is served by
  std::map<CUdevice, ServingPool> pools_;      // --pool: one per device
  std::map<CUdeviceptr, Allocation> served_;   // --pool: the blocks it handed out
};

// --- the wrappers, one instance per function and slot ------------------------

CUresult not_found() { return CUDA_ERROR_NOT_FOUND; }

template <Fn F, int S>
CUresult alloc_wrapper(CUdeviceptr* dptr, std::size_t bytes) {
  auto real = real_of<MemAllocFn>(F, S);
  if (real == nullptr) return not_found();
  Interposer& interposer = Interposer::instance();
  CUdevice device = 0;
  if (dptr == nullptr || bytes == 0 || interposer.stopped() || !interposer.current_device(&device))
    return real(dptr, bytes);  // the driver's own answer
  if (interposer.serves_pool())
    if (std::optional<CUresult> served = interposer.serve(device, bytes, dptr)) return *served;
  return interposer.allocate(
      device, bytes, false, nullptr, [&] { return real(dptr, bytes); }, [&] { return *dptr; });
}

template <Fn F, int S>
CUresult free_wrapper(CUdeviceptr dptr) {
  auto real = real_of<MemFreeFn>(F, S);
  if (real == nullptr) return not_found();
  Interposer& interposer = Interposer::instance();
  if (std::optional<CUresult> served = interposer.free_served(dptr)) return *served;
  return interposer.free(false, dptr, nullptr, [&] { return real(dptr); });
}

template <Fn F, int S>
CUresult get_info_wrapper(std::size_t* free_bytes, std::size_t* total_bytes) {
  auto real = real_of<MemGetInfoFn>(F, S);
  if (real == nullptr) return not_found();
  return Interposer::instance().mem_info(free_bytes, total_bytes, [&] { return real(free_bytes, total_bytes); });
}

template <Fn F, int S>
CUresult alloc_async_wrapper(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  auto real = real_of<MemAllocAsyncFn>(F, S);
  if (real == nullptr) return not_found();
  Interposer& interposer = Interposer::instance();
  CUdevice device = 0;
  if (dptr == nullptr || bytes == 0 || interposer.stopped() || !interposer.current_device(&device))
    return real(dptr, bytes, stream);
  return interposer.allocate(
      device, bytes, false, stream, [&] { return real(dptr, bytes, stream); }, [&] { return *dptr; });
}

template <Fn F, int S>
CUresult alloc_from_pool_wrapper(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool, CUstream stream) {
  auto real = real_of<MemAllocFromPoolAsyncFn>(F, S);
  if (real == nullptr) return not_found();
  Interposer& interposer = Interposer::instance();
  CUdevice device = 0;
  if (dptr == nullptr || bytes == 0 || interposer.stopped() || !interposer.current_device(&device))
    return real(dptr, bytes, pool, stream);
  return interposer.allocate(
      device, bytes, false, stream, [&] { return real(dptr, bytes, pool, stream); }, [&] { return *dptr; });
}

template <Fn F, int S>
CUresult free_async_wrapper(CUdeviceptr dptr, CUstream stream) {
  auto real = real_of<MemFreeAsyncFn>(F, S);
  if (real == nullptr) return not_found();
  return Interposer::instance().free(false, dptr, stream, [&] { return real(dptr, stream); });
}

template <Fn F, int S>
CUresult create_wrapper(CUmemGenericAllocationHandle* handle, std::size_t bytes, const CUmemAllocationProp* prop,
                        unsigned long long flags) {
  auto real = real_of<MemCreateFn>(F, S);
  if (real == nullptr) return not_found();
  Interposer& interposer = Interposer::instance();
  // Only device memory counts against a GPU's quota (not host or NUMA locations).
  if (handle == nullptr || prop == nullptr || bytes == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      interposer.stopped())
    return real(handle, bytes, prop, flags);
  return interposer.allocate(
      prop->location.id, bytes, true, nullptr, [&] { return real(handle, bytes, prop, flags); },
      [&] { return *handle; });
}

template <Fn F, int S>
CUresult release_wrapper(CUmemGenericAllocationHandle handle) {
  auto real = real_of<MemReleaseFn>(F, S);
  if (real == nullptr) return not_found();
  return Interposer::instance().free(true, handle, nullptr, [&] { return real(handle); });
}

template <Fn F, int S>
CUresult device_total_mem_wrapper(std::size_t* bytes, CUdevice device) {
  auto real = real_of<DeviceTotalMemFn>(F, S);
  if (real == nullptr) return not_found();
  const CUresult result = real(bytes, device);  // the driver's own checks first
  if (result != CUDA_SUCCESS || bytes == nullptr) return result;
  *bytes = Interposer::instance().reported_total(device, *bytes);
  return CUDA_SUCCESS;
}

/// What cuGetProcAddress asked at `cuda_version` hands out for `symbol`:
/// `real` wrapped when it is an intercepted function in an ABI the wrappers
/// have, else `real`. `known` asks the driver again at kKnownCudaVersion.
void* substitute_proc(const char* symbol, void* real, int cuda_version, const std::function<void*()>& known);

template <Fn F, int S>
CUresult get_proc_address_v1_wrapper(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  auto real = real_of<GetProcAddressV1Fn>(F, S);
  if (real == nullptr) return not_found();
  const CUresult result = real(symbol, pfn, cuda_version, flags);
  if (result == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr)
    *pfn = substitute_proc(symbol, *pfn, cuda_version, [&]() -> void* {
      void* known = nullptr;
      return real(symbol, &known, kKnownCudaVersion, flags) == CUDA_SUCCESS ? known : nullptr;
    });
  return result;
}

template <Fn F, int S>
CUresult get_proc_address_v2_wrapper(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  auto real = real_of<GetProcAddressV2Fn>(F, S);
  if (real == nullptr) return not_found();
  const CUresult result = real(symbol, pfn, cuda_version, flags, status);
  if (result == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr)
    *pfn = substitute_proc(symbol, *pfn, cuda_version, [&]() -> void* {
      void* known = nullptr;
      return real(symbol, &known, kKnownCudaVersion, flags, nullptr) == CUDA_SUCCESS ? known : nullptr;
    });
  return result;
}

/// The wrapper of `fn` that forwards to slot `slot`.
template <Fn F>
void* wrapper_in_slot(int slot) {
  static_assert(kSlots == 4, "one wrapper per slot below");
  auto pick = [slot](auto w0, auto w1, auto w2, auto w3) {
    return as_pointer(slot == 0 ? w0 : slot == 1 ? w1 : slot == 2 ? w2 : w3);
  };
#define TIDEPOOL_SLOTS(wrapper) pick(wrapper<F, 0>, wrapper<F, 1>, wrapper<F, 2>, wrapper<F, 3>)
  if constexpr (F == mem_alloc) return TIDEPOOL_SLOTS(alloc_wrapper);
  if constexpr (F == mem_free) return TIDEPOOL_SLOTS(free_wrapper);
  if constexpr (F == mem_get_info) return TIDEPOOL_SLOTS(get_info_wrapper);
  if constexpr (F == mem_alloc_async || F == mem_alloc_async_ptsz) return TIDEPOOL_SLOTS(alloc_async_wrapper);
  if constexpr (F == mem_free_async || F == mem_free_async_ptsz) return TIDEPOOL_SLOTS(free_async_wrapper);
  if constexpr (F == mem_alloc_from_pool_async || F == mem_alloc_from_pool_async_ptsz)
    return TIDEPOOL_SLOTS(alloc_from_pool_wrapper);
  if constexpr (F == mem_create) return TIDEPOOL_SLOTS(create_wrapper);
  if constexpr (F == mem_release) return TIDEPOOL_SLOTS(release_wrapper);
  if constexpr (F == device_total_mem) return TIDEPOOL_SLOTS(device_total_mem_wrapper);
  if constexpr (F == get_proc_address_v1) return TIDEPOOL_SLOTS(get_proc_address_v1_wrapper);
  if constexpr (F == get_proc_address_v2) return TIDEPOOL_SLOTS(get_proc_address_v2_wrapper);
#undef TIDEPOOL_SLOTS
  return nullptr;
}

template <int... I>
void* wrapper_of(Fn fn, int slot, std::integer_sequence<int, I...>) {
  void* out = nullptr;
  [[maybe_unused]] const bool found =
      ((fn == I ? (out = wrapper_in_slot<static_cast<Fn>(I)>(slot), true) : false) || ...);
  return out;
}
void* wrapper_of(Fn fn, int slot) { return wrapper_of(fn, slot, std::make_integer_sequence<int, fn_count>{}); }

/// `real` wrapped, when it is one of the intercepted functions in an ABI
/// the wrappers have; else `real` itself.
void* wrap(Fn fn, void* real) {
  const int slot = claim_slot(fn, real);
  return slot < 0 ? real : wrapper_of(fn, slot);
}

void* substitute_proc(const char* symbol, void* real, int cuda_version, const std::function<void*()>& known) {
  for (int fn = 0; fn < fn_count; ++fn) {
    const FnInfo& info = kFns[fn];
    if (info.proc_name == nullptr || std::strcmp(symbol, info.proc_name) != 0) continue;
    if (cuda_version < info.min_version || cuda_version > info.max_version) continue;
    // Beyond the versions whose signatures are known, the ABI is the known
    // one only if the driver gives the same function at the known version.
    if (cuda_version > kKnownCudaVersion && known() != real) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        std::fprintf(stderr,
                     "tidepool: warning: cuGetProcAddress(\"%s\", cudaVersion=%d) gives a function newer than "
                     "CUDA %d, whose signature this interposer does not know; it is handed out unwrapped, "
                     "so what it allocates is not accounted (further such are not printed)\n",
                     symbol, cuda_version, kKnownCudaVersion);
      return real;
    }
    return wrap(static_cast<Fn>(fn), real);
  }
  return real;
}

}  // namespace
}  // namespace tidepool::preload

using namespace tidepool::preload;

// --- the exported symbols: the driver's names, slot 0 ------------------------

TIDEPOOL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytesize) {
  return alloc_wrapper<mem_alloc, 0>(dptr, bytesize);
}
TIDEPOOL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return free_wrapper<mem_free, 0>(dptr); }
TIDEPOOL_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  return get_info_wrapper<mem_get_info, 0>(free, total);
}
TIDEPOOL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytesize, CUstream stream) {
  return alloc_async_wrapper<mem_alloc_async, 0>(dptr, bytesize, stream);
}
TIDEPOOL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytesize, CUstream stream) {
  return alloc_async_wrapper<mem_alloc_async_ptsz, 0>(dptr, bytesize, stream);
}
TIDEPOOL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return free_async_wrapper<mem_free_async, 0>(dptr, stream);
}
TIDEPOOL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return free_async_wrapper<mem_free_async_ptsz, 0>(dptr, stream);
}
TIDEPOOL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytesize, CUmemoryPool pool,
                                                 CUstream stream) {
  return alloc_from_pool_wrapper<mem_alloc_from_pool_async, 0>(dptr, bytesize, pool, stream);
}
TIDEPOOL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytesize, CUmemoryPool pool,
                                                      CUstream stream) {
  return alloc_from_pool_wrapper<mem_alloc_from_pool_async_ptsz, 0>(dptr, bytesize, pool, stream);
}
TIDEPOOL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  return create_wrapper<mem_create, 0>(handle, size, prop, flags);
}
TIDEPOOL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return release_wrapper<mem_release, 0>(handle);
}
TIDEPOOL_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice dev) {
  return device_total_mem_wrapper<device_total_mem, 0>(bytes, dev);
}
TIDEPOOL_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return get_proc_address_v1_wrapper<get_proc_address_v1, 0>(symbol, pfn, cudaVersion, flags);
}
TIDEPOOL_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  return get_proc_address_v2_wrapper<get_proc_address_v2, 0>(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/// dlsym as glibc's, except that the driver's allocation functions found in
/// a library (XLA's and others' dlopen'ed libcuda) come back wrapped.
TIDEPOOL_EXPORT void* dlsym(void* handle, const char* symbol) {
  DlsymFn real = real_dlsym();
  if (real == nullptr) return nullptr;
  void* found = real(handle, symbol);
  if (found == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return found;
  for (int fn = 0; fn < fn_count; ++fn) {
    if (std::strcmp(symbol, kFns[fn].symbol) != 0) continue;
    // This library's own export (dlsym(RTLD_DEFAULT) finds it first): it
    // already forwards to the driver's.
    if (in_this_library(found)) return found;
    return wrap(static_cast<Fn>(fn), found);
  }
  return found;
}
