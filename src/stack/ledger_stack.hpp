// The ledger's part of the stack: the pool registered as its process's
// answer to other processes' trim requests.
#pragma once

#include <memory>

#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/ledger.hpp"
#include "tidepool/stack.hpp"

namespace tidepool {

/// What the configuration registers with in the ledger of a device of
/// `device_total` bytes, the `device_index`th of its process (a
/// TIDEPOOL_LEDGER_NAME gets "-N" past the first): permissions, segment
/// name, wake wait and the quota resolved. Errors: a quota of 0 bytes,
/// naming its variable. The one resolution make_ledger_device and `tidepool
/// run`'s interposer both use.
Expected<LedgerOptions> ledger_options(const Config& config, std::size_t device_total, int device_index = 0);

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
