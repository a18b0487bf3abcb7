// The stack: the one path to memory, device -> ledger -> limit -> pool, built
// from a Config. The command, the bindings, the replay engine and `tidepool
// run --pool` all build theirs here.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tidepool/allocator.hpp"
#include "tidepool/config.hpp"
#include "tidepool/device.hpp"
#include "tidepool/error.hpp"
#include "tidepool/ledger_account.hpp"

namespace tidepool {

/// The device used when TIDEPOOL_DEVICE is unset: cuda when a CUDA device is
/// present in this build, else host. (Config::from_env() passes it.)
DeviceKind default_device_kind();
/// Why default_device_kind() chose its device, for `tidepool info`: "a CUDA
/// device is present", "no CUDA device: <why>" or "this build has no CUDA device".
std::string default_device_reason();

/// The device of the configuration with its decorators: a HostDevice of
/// host_capacity, or the CUDA device; then the ledger when enabled.
Expected<std::shared_ptr<Device>> make_device(const Config& config);

/// What the ledger needs of a device: its id (the default segment's name),
/// its total (what a quota is a share of) and its place among this
/// process's devices (a TIDEPOOL_LEDGER_NAME gets "-N" past the first).
struct LedgerDeviceFacts {
  std::string id;
  std::size_t total_bytes = 0;
  int index = 0;

  /// `device`'s id and total (mem_info).
  static LedgerDeviceFacts of(const Device& device, int index = 0);
};

/// Which ledger a device of the configuration joins, and how: the segment
/// (TIDEPOOL_LEDGER_NAME, else the device's own name for this user, or its
/// group with TIDEPOOL_LEDGER_MODE=group; always set), its mode, the wake
/// wait and the quota resolved against the device's total. The one
/// decision: the stack and `tidepool run`'s interposer register with it;
/// `tidepool ledger`, `tidepool info` and Python's ledger() read its
/// segment_name and register nothing. Errors: a quota of 0 bytes, naming
/// its variable.
Expected<LedgerOptions> resolve_ledger(const Config& config, const LedgerDeviceFacts& device);
/// resolve_ledger for the device the configuration builds, built without
/// the ledger (and not at all when nothing resolved depends on it: a
/// TIDEPOOL_LEDGER_NAME and no quota), so that resolving registers nothing.
/// Errors: those of building the device, and resolve_ledger's.
Expected<LedgerOptions> resolve_ledger(const Config& config);

/// `device` guarded by the cross-process ledger of its id, this process
/// registered with config.quota resolved against the device's total and
/// config.ledger_mode for a new segment; what make_device does when
/// config.ledger is on (resolve_ledger, then LedgerDevice::create). Errors:
/// those of both, the quota's naming its variable.
Expected<std::shared_ptr<Device>> make_ledger_device(const Config& config,
                                                     std::shared_ptr<Device> device);

/// Whether make_allocator(mode, ...) can build its pool over `device` in this
/// build: unsupported, with the reason, when it cannot (e.g. expandable on a
/// device without virtual memory, cuda_async without the CUDA device). The
/// reason names settings in `vocabulary` (make_allocator: the config's).
Status mode_supported(Mode mode, const Device& device, Vocabulary vocabulary = Vocabulary::variables);

/// The pool of `mode` over `device`, with the settings of `config` (bytes
/// limit, release threshold, preallocation). The one way to build a pool: the
/// stack builder and the replay engine both use it. Errors: unsupported when
/// the mode is not available in this build or on this device; out_of_memory
/// when preallocation cannot get its region.
///
/// Over a LedgerDevice (anywhere below `device`), the pool reports its cached
/// free bytes to the ledger and, unless it preallocates (it never gives
/// memory back), answers other processes' trim requests with its trim(): at
/// its next allocate() or from the ledger's background thread. The returned
/// allocator then forwards to the pool and unregisters it before destroying it.
Expected<std::unique_ptr<Allocator>> make_allocator(Mode mode, const Config& config,
                                                    std::shared_ptr<Device> device);

/// The pool of config.mode over `device`.
Expected<std::unique_ptr<Allocator>> make_allocator(const Config& config,
                                                    std::shared_ptr<Device> device);

}  // namespace tidepool
