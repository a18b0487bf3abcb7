#include "tidepool/device_adaptors.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "tidepool/units.hpp"

namespace tidepool {

// --- Device: the host copies a device need not offer ------------------------

namespace {
Error no_host_copies(const Device& device) {
  return Error(Errc::unsupported, device.description() +
                                      " cannot copy to or from host memory (needed to keep a sleeping tag's contents)");
}
}  // namespace

Expected<void*> Device::allocate_host(std::size_t) { return no_host_copies(*this); }
Status Device::free_host(void*, std::size_t) { return no_host_copies(*this); }
Status Device::copy_to_host(void*, const void*, std::size_t) { return no_host_copies(*this); }
Status Device::copy_from_host(void*, const void*, std::size_t) { return no_host_copies(*this); }

// --- LimitDevice -----------------------------------------------------------

namespace {
/// What a plain allocation counts against the limit.
std::size_t limit_charge(std::size_t bytes) { return round_up(bytes, kMinAlignment); }
}  // namespace

LimitDevice::LimitDevice(std::shared_ptr<Device> upstream, std::size_t limit_bytes)
    : DeviceAdaptor(std::move(upstream)), limit_bytes_(limit_bytes) {}

std::string LimitDevice::description() const {
  return upstream().description() + ", limited to " + format_bytes(limit_bytes_);
}

bool LimitDevice::try_take(std::size_t bytes) {
  std::size_t held = held_bytes_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_bytes_ || held > limit_bytes_ - bytes) return false;
  } while (!held_bytes_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  return true;
}

Error LimitDevice::over_limit(std::size_t bytes) const {
  OomReport report;
  report.requested_bytes = bytes;
  report.device_free_bytes = mem_info().free_bytes;
  report.hint = "the device limit is " + format_bytes(limit_bytes_) + " (" +
                std::to_string(limit_bytes_) + " bytes) and " + format_bytes(held_bytes()) +
                " of it are taken";
  return Error::out_of_memory("device limit", std::move(report));
}

Expected<void*> LimitDevice::allocate(std::size_t bytes) {
  const std::size_t charge = limit_charge(bytes);
  if (!try_take(charge)) return over_limit(bytes);
  Expected<void*> ptr = upstream().allocate(bytes);
  if (!ptr) held_bytes_.fetch_sub(charge, std::memory_order_relaxed);
  return ptr;
}

Status LimitDevice::free(void* ptr, std::size_t bytes) {
  Status freed = upstream().free(ptr, bytes);
  if (freed && ptr != nullptr) held_bytes_.fetch_sub(limit_charge(bytes), std::memory_order_relaxed);
  return freed;
}

Expected<PhysicalHandle> LimitDevice::create(std::size_t bytes) {
  if (!try_take(bytes)) return over_limit(bytes);
  Expected<PhysicalHandle> handle = upstream().create(bytes);
  if (!handle) held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return handle;
}

Expected<std::vector<PhysicalHandle>> LimitDevice::create_many(std::size_t bytes_each, std::size_t count) {
  std::size_t total = 0;
  if (__builtin_mul_overflow(bytes_each, count, &total)) total = std::numeric_limits<std::size_t>::max();
  if (!try_take(total)) return over_limit(total);
  Expected<std::vector<PhysicalHandle>> handles = upstream().create_many(bytes_each, count);
  if (!handles) held_bytes_.fetch_sub(total, std::memory_order_relaxed);
  return handles;
}

Status LimitDevice::release(PhysicalHandle handle, std::size_t bytes) {
  Status released = upstream().release(handle, bytes);
  if (released) held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return released;
}

MemInfo LimitDevice::mem_info() const {
  const MemInfo upstream_info = upstream().mem_info();
  const std::size_t held = held_bytes();
  const std::size_t left = held < limit_bytes_ ? limit_bytes_ - held : 0;
  return MemInfo{std::min(upstream_info.free_bytes, left),
                 std::min(upstream_info.total_bytes, limit_bytes_)};
}

// --- CountingDevice --------------------------------------------------------

std::uint64_t DeviceCounters::total_calls() const {
  return allocate.calls + free.calls + reserve.calls + unreserve.calls + create.calls +
         map.calls + unmap.calls + release.calls + synchronize.calls + query.calls;
}
std::uint64_t DeviceCounters::total_nanoseconds() const {
  return allocate.nanoseconds + free.nanoseconds + reserve.nanoseconds + unreserve.nanoseconds +
         create.nanoseconds + map.nanoseconds + unmap.nanoseconds + release.nanoseconds +
         synchronize.nanoseconds + query.nanoseconds;
}

CountingDevice::CountingDevice(std::shared_ptr<Device> upstream)
    : DeviceAdaptor(std::move(upstream)) {}

template <class Call>
auto CountingDevice::counted(Kind kind, Call&& call) {
  const auto started = std::chrono::steady_clock::now();
  auto result = std::forward<Call>(call)();
  const auto elapsed = std::chrono::steady_clock::now() - started;
  AtomicCall& counter = calls_[kind];
  counter.calls.fetch_add(1, std::memory_order_relaxed);
  if (!result) counter.failures.fetch_add(1, std::memory_order_relaxed);
  counter.nanoseconds.fetch_add(
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()),
      std::memory_order_relaxed);
  return result;
}

void CountingDevice::raise_peak(std::atomic<std::size_t>& peak, std::size_t value) {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void CountingDevice::add_held(std::atomic<std::size_t>& kind_bytes, std::size_t bytes) {
  kind_bytes.fetch_add(bytes, std::memory_order_relaxed);
  raise_peak(peak_held_, held_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void CountingDevice::remove_held(std::atomic<std::size_t>& kind_bytes, std::size_t bytes) {
  kind_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

Expected<void*> CountingDevice::allocate(std::size_t bytes) {
  auto ptr = counted(kAllocate, [&] { return upstream().allocate(bytes); });
  if (ptr) add_held(plain_bytes_, bytes);
  return ptr;
}

Status CountingDevice::free(void* ptr, std::size_t bytes) {
  auto freed = counted(kFree, [&] { return upstream().free(ptr, bytes); });
  if (freed && ptr != nullptr) remove_held(plain_bytes_, bytes);
  return freed;
}

Expected<void*> CountingDevice::reserve(std::size_t va_bytes) {
  return counted(kReserve, [&] { return upstream().reserve(va_bytes); });
}

Status CountingDevice::unreserve(void* va, std::size_t va_bytes) {
  return counted(kUnreserve, [&] { return upstream().unreserve(va, va_bytes); });
}

Expected<PhysicalHandle> CountingDevice::create(std::size_t bytes) {
  auto handle = counted(kCreate, [&] { return upstream().create(bytes); });
  if (handle) add_held(physical_bytes_, bytes);
  return handle;
}

Status CountingDevice::map(void* va, std::size_t bytes, PhysicalHandle handle) {
  auto mapped = counted(kMap, [&] { return upstream().map(va, bytes, handle); });
  if (mapped) raise_peak(peak_mapped_, mapped_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  return mapped;
}

Status CountingDevice::map_many(void* va, std::size_t bytes_each, std::span<const PhysicalHandle> handles) {
  if (handles.empty()) return {};
  auto mapped = counted(kMap, [&] { return upstream().map_many(va, bytes_each, handles); });
  AtomicCall& counter = calls_[kMap];
  counter.calls.fetch_add(handles.size() - 1, std::memory_order_relaxed);
  if (!mapped) counter.failures.fetch_add(handles.size() - 1, std::memory_order_relaxed);
  const std::size_t bytes = bytes_each * handles.size();
  if (mapped) raise_peak(peak_mapped_, mapped_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  return mapped;
}

Status CountingDevice::unmap(void* va, std::size_t bytes) {
  auto unmapped = counted(kUnmap, [&] { return upstream().unmap(va, bytes); });
  if (unmapped) mapped_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return unmapped;
}

Status CountingDevice::release(PhysicalHandle handle, std::size_t bytes) {
  auto released = counted(kRelease, [&] { return upstream().release(handle, bytes); });
  if (released) remove_held(physical_bytes_, bytes);
  return released;
}

Status CountingDevice::synchronize(Stream stream) {
  return counted(kSynchronize, [&] { return upstream().synchronize(stream); });
}

Expected<bool> CountingDevice::query(Stream stream) {
  return counted(kQuery, [&] { return upstream().query(stream); });
}

DeviceCounters CountingDevice::counters() const {
  auto read = [this](Kind kind) {
    const AtomicCall& counter = calls_[kind];
    return CallCounters{counter.calls.load(std::memory_order_relaxed),
                        counter.failures.load(std::memory_order_relaxed),
                        counter.nanoseconds.load(std::memory_order_relaxed)};
  };
  DeviceCounters out;
  out.allocate = read(kAllocate);
  out.free = read(kFree);
  out.reserve = read(kReserve);
  out.unreserve = read(kUnreserve);
  out.create = read(kCreate);
  out.map = read(kMap);
  out.unmap = read(kUnmap);
  out.release = read(kRelease);
  out.synchronize = read(kSynchronize);
  out.query = read(kQuery);
  out.plain_bytes_held = plain_bytes_.load(std::memory_order_relaxed);
  out.physical_bytes_held = physical_bytes_.load(std::memory_order_relaxed);
  out.bytes_held = held_bytes_.load(std::memory_order_relaxed);
  out.peak_bytes_held = peak_held_.load(std::memory_order_relaxed);
  out.bytes_mapped = mapped_bytes_.load(std::memory_order_relaxed);
  out.peak_bytes_mapped = peak_mapped_.load(std::memory_order_relaxed);
  return out;
}

}  // namespace tidepool
