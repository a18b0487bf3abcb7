// Building the stack from a Config: device -> decorators -> pool. The one
// place in tidepool that turns a mode into a pool.
#include <string>
#include <utility>

#include "config/setting_names.hpp"
#include "stack/ledger_stack.hpp"
#include "tidepool/best_fit_pool.hpp"
#include "tidepool/config.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/expandable_pool.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/passthrough_pool.hpp"
#include "tidepool/stack.hpp"
#include "tidepool/units.hpp"
#ifdef TIDEPOOL_HAVE_CUDA
#include "tidepool/async_pool.hpp"
#include "tidepool/cuda_device.hpp"
#endif

namespace tidepool {
namespace {

Error unavailable(Mode mode, std::string_view why) {
  return Error(Errc::unsupported,
               "mode " + std::string(mode_name(mode)) + " is not available: " + std::string(why));
}

}  // namespace

Expected<std::shared_ptr<Device>> make_device(const Config& config) {
  std::shared_ptr<Device> device;
  switch (config.device.value) {
    case DeviceKind::host: {
      HostDeviceOptions options;
      options.capacity = config.host_capacity.value;
      auto host = HostDevice::create(options);
      if (!host) {
        // Name the variable or key, not only HostDevice's option.
        const auto& capacity = config.host_capacity;
        if (capacity.is_default()) return std::move(host).error();
        return Error(host.error().code(),
                     capacity.quoted() + " cannot make a host device: " + host.error().message());
      }
      device = std::move(*host);
      break;
    }
    case DeviceKind::cuda: {
      // A probed default names itself as such, not as a setting "default".
      const std::string cuda_by =
          config.device.is_default() ? "the default device (cuda)" : config.device.source() + "=cuda";
#ifdef TIDEPOOL_HAVE_CUDA
      auto cuda = CudaDevice::open(0);
      if (!cuda) return Error(cuda.error().code(), cuda_by + ": " + cuda.error().message());
      device = std::move(*cuda);
      break;
#else
      return Error(Errc::unsupported,
                   cuda_by + ": this build of tidepool has no CUDA device "
                   "(it was built without the CUDA toolkit); allowed here: host");
#endif
    }
  }

  // Decorators over the device, innermost first. The cross-process ledger
  // (config.ledger, config.quota) wraps the device here.
  if (config.ledger.value) return make_ledger_device(config, std::move(device));

  return device;
}

Status mode_supported(Mode mode, const Device& device, Vocabulary vocabulary) {
  using config_names::name_in;
  const std::string cuda_device = name_in(vocabulary, config_names::kDevice) + "=cuda";
  switch (mode) {
    case Mode::preallocate:
    case Mode::growth:
    case Mode::platform:
      return {};
    case Mode::expandable:
      if (!device.supports_virtual_memory())
        return unavailable(mode, "it needs a device with virtual memory calls, and " +
                                     device.description() + " has none");
      return {};
    case Mode::cuda_async:
      // The driver's pool takes its memory from the driver itself: a ledger
      // above the device would never see those bytes, nor hold the quota.
      if (find_ledger_device(device) != nullptr)
        return unavailable(mode, "the driver's pool allocates around the cross-process ledger (" +
                                     name_in(vocabulary, config_names::kLedger) + " or " +
                                     name_in(vocabulary, config_names::kQuota) +
                                     " is set), which would neither see nor limit its memory; allowed with the "
                                     "ledger: the bfc, growth, platform and expandable modes, or run the "
                                     "program under `tidepool run --quota`, whose interposer accounts "
                                     "cuMemAllocFromPoolAsync");
#ifdef TIDEPOOL_HAVE_CUDA
      if (find_cuda_device(device) == nullptr)
        return unavailable(mode, "it needs the CUDA device (" + cuda_device + "), not " + device.description());
      return {};
#else
      return unavailable(mode, "it needs the CUDA device (" + cuda_device + "), which this build lacks");
#endif
  }
  return unavailable(mode, "unknown mode");
}

namespace {

Expected<std::unique_ptr<Allocator>> make_pool(Mode mode, const Config& config,
                                               std::shared_ptr<Device> device) {
  if (Status supported = mode_supported(mode, *device, config.vocabulary); !supported)
    return std::move(supported).error();
  // JAX: the fraction is of the device's total memory (not of what is free),
  // and bounds the BFC allocator whether or not it preallocates.
  const std::size_t bytes_limit = config.bytes_limit(device->mem_info().total_bytes);
  // A limit of 0 means "the whole device" to the pools: a fraction so small
  // that it rounds to nothing must not become that.
  if (bytes_limit == 0 && mode != Mode::platform) {
    return Error(Errc::invalid_argument,
                 config.mem_fraction.quoted() + " leaves 0 bytes of the " +
                     format_bytes(device->mem_info().total_bytes) + " device; allowed: a larger fraction");
  }
  // The fraction's limit is a decorator under the pool (not for platform,
  // which XLA does not bound, nor cuda_async, whose memory the driver's own
  // pool takes around the device: it keeps the limit itself).
  if (mode == Mode::preallocate || mode == Mode::growth || mode == Mode::expandable)
    device = std::make_shared<LimitDevice>(std::move(device), bytes_limit);
  switch (mode) {
    case Mode::preallocate:
    case Mode::growth: {
      BestFitOptions options;
      options.preallocate = mode == Mode::preallocate;
      auto pool = BestFitPool::create(std::move(device), options);
      if (!pool) return std::move(pool).error();
      return std::unique_ptr<Allocator>(std::move(*pool));
    }
    case Mode::platform:
      // XLA's platform allocator ignores the memory fraction: it takes what
      // it is asked for until the device says no.
      return std::unique_ptr<Allocator>(std::make_unique<PassthroughPool>(std::move(device)));
    case Mode::cuda_async: {
#ifdef TIDEPOOL_HAVE_CUDA
      // XLA: the pool size (fraction x total) is the release threshold unless
      // one is set, and PREALLOCATE reserves it up front.
      AsyncPoolOptions options;
      options.bytes_limit = bytes_limit;
      options.release_threshold = config.release_threshold.value;
      options.preallocate = config.preallocate.value;
      auto pool = AsyncPool::create(std::move(device), options);
      if (!pool) return std::move(pool).error();
      return std::unique_ptr<Allocator>(std::move(*pool));
#else
      break;  // refused by mode_supported
#endif
    }
    case Mode::expandable: {
      ExpandableOptions options;
      if (config.release_threshold.value) options.release_threshold = *config.release_threshold.value;
      options.idle_release = config.idle_release.value;
      options.aliases = config.aliases.value;
      auto pool = ExpandablePool::create(std::move(device), options);
      if (!pool) return std::move(pool).error();
      return std::unique_ptr<Allocator>(std::move(*pool));
    }
  }
  return unavailable(mode, "unknown mode");
}

}  // namespace

Expected<std::unique_ptr<Allocator>> make_allocator(Mode mode, const Config& config,
                                                    std::shared_ptr<Device> device) {
  if (!device) return Error(Errc::invalid_argument, "make_allocator: no device");
  auto pool = make_pool(mode, config, std::move(device));
  if (!pool) return pool;
  // Over a ledger, the pool answers other processes' trim requests.
  return with_ledger_trim_hooks(mode, std::move(*pool));
}

Expected<std::unique_ptr<Allocator>> make_allocator(const Config& config,
                                                    std::shared_ptr<Device> device) {
  return make_allocator(config.mode.value, config, std::move(device));
}

}  // namespace tidepool
