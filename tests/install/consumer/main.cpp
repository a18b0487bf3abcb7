// Allocates from a BestFitPool over a HostDevice through the installed
// headers and library, writes into the block, checks the stats, and frees it.
#include <cstdio>
#include <cstring>
#include <memory>

#include "tidepool/best_fit_pool.hpp"
#include "tidepool/device_adaptors.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/units.hpp"

int main() {
  using namespace tidepool;
  HostDeviceOptions device_options;
  device_options.capacity = 1 * GiB;
  auto device = HostDevice::create(device_options);
  if (!device) {
    std::fprintf(stderr, "consumer: %s\n", device.error().message().c_str());
    return 1;
  }
  // A limit below the device's: the pool over a LimitDevice.
  auto pool = BestFitPool::create(std::make_shared<LimitDevice>(*device, 256 * MiB), BestFitOptions{});
  if (!pool) {
    std::fprintf(stderr, "consumer: %s\n", pool.error().message().c_str());
    return 1;
  }
  Expected<void*> block = (*pool)->allocate(3 * MiB);
  if (!block) {
    std::fprintf(stderr, "consumer: %s\n", block.error().message().c_str());
    return 1;
  }
  std::memset(*block, 0x5a, 3 * MiB);
  const Stats in_use = (*pool)->stats();
  if (Status freed = (*pool)->deallocate(*block); !freed) {
    std::fprintf(stderr, "consumer: %s\n", freed.error().message().c_str());
    return 1;
  }
  const Stats after = (*pool)->stats();
  // At least what was asked (a pool may hand out a little more), then nothing.
  if (in_use.bytes_in_use < static_cast<std::int64_t>(3 * MiB) || after.bytes_in_use != 0) {
    std::fprintf(stderr, "consumer: bytes_in_use %lld then %lld, expected at least 3 MiB then 0\n",
                 static_cast<long long>(in_use.bytes_in_use), static_cast<long long>(after.bytes_in_use));
    return 1;
  }
  std::printf("consumer: %s pool served %s at %s and took it back\n", std::string((*pool)->name()).c_str(),
              format_bytes(3 * MiB).c_str(), format_address(*block).c_str());
  return 0;
}
