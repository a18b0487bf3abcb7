// XLA's `platform` allocator: every request goes straight to the device and
// every free straight back. Smallest footprint, a device call per operation.
#pragma once

#include <memory>

#include "tidepool/allocator.hpp"

namespace tidepool {

class PassthroughPool final : public Allocator {
 public:
  /// It holds at most the device's total (a LimitDevice under it sets less).
  explicit PassthroughPool(std::shared_ptr<Device> device);
  ~PassthroughPool() override;
  // Allocator: see allocator.hpp.
  std::string_view name() const override { return "platform"; }
  Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) override;
  Status deallocate(void* ptr, Stream stream = kDefaultStream) override;
  Stats stats() const override;
  std::size_t trim() override { return 0; }
  std::string dump() const override;
  Device& device() const override { return *device_; }

 private:
  struct State;
  std::shared_ptr<Device> device_;
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
