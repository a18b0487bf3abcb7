#include "settings.hpp"

#include <utility>

namespace tidepool::bindings {

Expected<Stack> make_stack(const Config& config) {
  auto device = make_device(config);
  if (!device) return std::move(device).error();
  auto allocator = make_allocator(config, *device);
  if (!allocator) return std::move(allocator).error();
  Stack stack;
  stack.device = std::move(*device);
  stack.allocator = std::move(*allocator);
  stack.words = config.oom_words();
  return stack;
}

}  // namespace tidepool::bindings
