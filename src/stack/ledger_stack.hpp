// The ledger's part of the stack: the pool registered as its process's
// answer to other processes' trim requests.
#pragma once

#include <memory>

#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"

namespace tidepool {

/// The LedgerDevice at or below `device` (through DeviceAdaptors), or nullptr.
LedgerDevice* find_ledger_device(Device& device);
const LedgerDevice* find_ledger_device(const Device& device);

/// `pool` as is when no LedgerDevice lies under its device; otherwise an
/// allocator that owns the pool, has registered its trim() (not for mode
/// preallocate) and cached-free report with the device's LedgerAccount,
/// answers pending trim requests at each allocate(), and unregisters before
/// the pool is destroyed.
std::unique_ptr<Allocator> with_ledger_trim_hooks(Mode mode, std::unique_ptr<Allocator> pool);

}  // namespace tidepool
