// LedgerDevice: reserve in the account, then ask the device; the device's
// memory back, then the reservation.
#include <utility>

#include "tidepool/ledger.hpp"

namespace tidepool {

Expected<std::shared_ptr<LedgerDevice>> LedgerDevice::create(std::shared_ptr<Device> upstream,
                                                             LedgerOptions options) {
  if (!upstream) return Error(Errc::invalid_argument, "LedgerDevice::create: upstream device is null");
  auto account = LedgerAccount::open(upstream->id(), upstream->mem_info().total_bytes, std::move(options));
  if (!account) return std::move(account).error();
  return std::make_shared<LedgerDevice>(std::move(upstream), std::move(*account));
}

LedgerDevice::LedgerDevice(std::shared_ptr<Device> upstream, std::shared_ptr<LedgerAccount> account)
    : DeviceAdaptor(std::move(upstream)), account_(std::move(account)) {}

std::string LedgerDevice::description() const {
  return upstream().description() + ", shared through " + account_->description();
}

Expected<void*> LedgerDevice::allocate(std::size_t bytes) {
  if (bytes == 0) return upstream().allocate(bytes);  // the device's own error
  if (Status reserved = account_->reserve(bytes); !reserved) return std::move(reserved).error();
  Expected<void*> ptr = upstream().allocate(bytes);
  if (!ptr) account_->unreserve(bytes);
  return ptr;
}

Status LedgerDevice::free(void* ptr, std::size_t bytes) {
  Status freed = upstream().free(ptr, bytes);
  if (freed && ptr != nullptr) account_->unreserve(bytes);
  return freed;
}

MemInfo LedgerDevice::mem_info() const { return account_->share_of(upstream().mem_info()); }

Expected<PhysicalHandle> LedgerDevice::create(std::size_t bytes) {
  if (bytes == 0) return upstream().create(bytes);  // the device's own error
  if (Status reserved = account_->reserve(bytes); !reserved) return std::move(reserved).error();
  Expected<PhysicalHandle> handle = upstream().create(bytes);
  if (!handle) account_->unreserve(bytes);
  return handle;
}

Expected<std::vector<PhysicalHandle>> LedgerDevice::create_many(std::size_t bytes_each, std::size_t count) {
  if (bytes_each == 0 || count == 0) return DeviceAdaptor::create_many(bytes_each, count);  // the device's own error
  if (Status reserved = account_->reserve_many(bytes_each, count); !reserved) return std::move(reserved).error();
  std::vector<PhysicalHandle> handles;
  handles.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    Expected<PhysicalHandle> handle = upstream().create(bytes_each);
    if (handle) {
      handles.push_back(*handle);
      continue;
    }
    for (PhysicalHandle made : handles) (void)upstream().release(made, bytes_each);
    account_->unreserve(bytes_each * count);
    return std::move(handle).error();
  }
  return handles;
}

Status LedgerDevice::release(PhysicalHandle handle, std::size_t bytes) {
  Status released = upstream().release(handle, bytes);
  if (released) account_->unreserve(bytes);
  return released;
}

}  // namespace tidepool
