// XLA's BFC allocator, split into its parts: sizes rounded to 256 bytes,
// size-class bins, best fit, split, coalesce on free; over one preallocated
// region or regions grown on demand.
#pragma once

#include <cstddef>
#include <memory>

#include "tidepool/allocator.hpp"

namespace tidepool {

/// The pool takes at most its device's total: a limit below the device's
/// (JAX: XLA_CLIENT_MEM_FRACTION x total) is a LimitDevice under it, as the
/// stack composes it.
struct BestFitOptions {
  /// Take one region of the device's total at creation (JAX's default)
  /// instead of growing region by region (XLA_PYTHON_CLIENT_PREALLOCATE=false).
  bool preallocate = false;
};

class BestFitPool final : public Allocator {
 public:
  /// Fails with out_of_memory when preallocation cannot get its region.
  static Expected<std::unique_ptr<BestFitPool>> create(std::shared_ptr<Device> device,
                                                       BestFitOptions options = {});
  ~BestFitPool() override;
  // Allocator: see allocator.hpp. name() is "preallocate" or "growth".
  std::string_view name() const override;
  Expected<void*> allocate(std::size_t bytes, Stream stream = kDefaultStream) override;
  Status deallocate(void* ptr, Stream stream = kDefaultStream) override;
  Stats stats() const override;
  std::size_t trim() override;
  std::string dump() const override;
  Device& device() const override;

 private:
  struct State;
  explicit BestFitPool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidepool
