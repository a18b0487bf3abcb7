// What the machine offers by default: the device used when TIDEPOOL_DEVICE
// is unset, probed here (the config layer parses and probes nothing), and
// Config::from_env() and Config::from_keys() with it.
#include "tidepool/config.hpp"
#include "tidepool/stack.hpp"

#ifdef TIDEPOOL_HAVE_CUDA
#include "tidepool/cuda_device.hpp"
#endif

namespace tidepool {

DeviceKind default_device_kind() {
#ifdef TIDEPOOL_HAVE_CUDA
  return cuda_availability().available() ? DeviceKind::cuda : DeviceKind::host;
#else
  return DeviceKind::host;
#endif
}

std::string default_device_reason() {
#ifdef TIDEPOOL_HAVE_CUDA
  const CudaAvailability cuda = cuda_availability();
  if (cuda.available()) return "a CUDA device is present";
  return "no CUDA device: " + cuda.reason;
#else
  return "this build has no CUDA device";
#endif
}

Expected<Config> Config::from_env() { return from_env(default_device_kind()); }

Expected<Config> Config::from_env(const GetEnv& getenv) { return from_env(getenv, default_device_kind()); }

Expected<Config> Config::from_keys(const KeyValues& settings) { return from_keys(settings, default_device_kind()); }

}  // namespace tidepool
