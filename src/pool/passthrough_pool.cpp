#include "tidepool/passthrough_pool.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pool/usage_counters.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

std::string hex(const void* ptr) {
  char text[2 + 16 + 1];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

// Stats count sizes rounded as the other pools round them, so the modes compare.
constexpr std::size_t kStatsGranule = kMinAlignment;

// How many freed pointers are remembered to tell a double free from a
// pointer never handed out.
constexpr std::size_t kRecentFrees = 1024;

}  // namespace

struct PassthroughPool::State {
  struct Live {
    std::size_t bytes = 0;  // as passed to Device::allocate
    Stream stream = kDefaultStream;
  };
  std::size_t bytes_limit = 0;
  mutable std::mutex mutex;
  std::unordered_map<void*, Live> live;
  std::array<void*, kRecentFrees> recent_frees{};  // a ring of freed pointers
  std::size_t next_recent = 0;
  pool::UsageCounters usage;

  void forget_recent_free(void* ptr) {
    std::replace(recent_frees.begin(), recent_frees.end(), ptr, static_cast<void*>(nullptr));
  }
};

PassthroughPool::PassthroughPool(std::shared_ptr<Device> device, std::size_t bytes_limit)
    : device_(std::move(device)), state_(std::make_unique<State>()) {
  state_->bytes_limit = bytes_limit != 0 ? bytes_limit : device_->mem_info().total_bytes;
}

PassthroughPool::~PassthroughPool() {
  for (const auto& [ptr, live] : state_->live) (void)device_->free(ptr, live.bytes);
}

Expected<void*> PassthroughPool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const std::size_t rounded = bytes > s.bytes_limit ? bytes : round_up(bytes, kStatsGranule);
  const auto in_use = static_cast<std::size_t>(s.usage.bytes_in_use);
  auto out_of_memory = [&](std::string hint) {
    ++s.usage.num_ooms;
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_in_use = in_use;
    report.bytes_reserved = static_cast<std::size_t>(s.usage.pool_bytes);
    report.device_free_bytes = device_->mem_info().free_bytes;
    report.largest_free_block_bytes = 0;  // nothing is cached
    report.hint = std::move(hint);
    return Error::out_of_memory("platform allocator", std::move(report));
  };
  if (rounded > s.bytes_limit || in_use + rounded > s.bytes_limit) {
    return out_of_memory("the allocator's limit is " + format_bytes(s.bytes_limit) + " (bytes_limit) with " +
                         format_bytes(in_use) +
                         " in use; raise TIDEPOOL_MEM_FRACTION (XLA_CLIENT_MEM_FRACTION)");
  }
  Expected<void*> ptr = device_->allocate(bytes);
  if (!ptr) {
    if (ptr.error().code() != Errc::out_of_memory) return ptr;
    return out_of_memory("the device has only " + format_bytes(device_->mem_info().free_bytes) +
                         " free: another process or allocator holds the rest of it");
  }
  s.live.emplace(*ptr, State::Live{bytes, stream});
  s.forget_recent_free(*ptr);
  s.usage.reserved(rounded);
  s.usage.allocated(rounded);
  return ptr;
}

Status PassthroughPool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  const auto found = s.live.find(ptr);
  if (found == s.live.end()) {
    if (std::find(s.recent_frees.begin(), s.recent_frees.end(), ptr) != s.recent_frees.end()) {
      return Error(Errc::double_free, "platform allocator: free of " + hex(ptr) + ": freed already");
    }
    return Error(Errc::invalid_pointer,
                 "platform allocator: free of " + hex(ptr) + ": not a pointer this allocator handed out");
  }
  // The device frees at once (cudaFree waits for the device), so the stream
  // needs no synchronizing here beyond what the device does.
  (void)stream;
  const std::size_t bytes = found->second.bytes;
  Status freed = device_->free(ptr, bytes);
  if (!freed) return freed;
  s.live.erase(found);
  s.recent_frees[s.next_recent] = ptr;
  s.next_recent = (s.next_recent + 1) % kRecentFrees;
  const std::size_t rounded = round_up(bytes, kStatsGranule);
  s.usage.freed(rounded);
  s.usage.released(rounded);
  return {};
}

Stats PassthroughPool::stats() const {
  std::lock_guard lock(state_->mutex);
  Stats stats = state_->usage.to_stats();
  stats.bytes_limit = static_cast<std::int64_t>(state_->bytes_limit);
  return stats;
}

std::string PassthroughPool::dump() const {
  std::lock_guard lock(state_->mutex);
  std::vector<std::pair<void*, State::Live>> blocks(state_->live.begin(), state_->live.end());
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = "platform allocator on " + device_->description() + ": limit " +
                    format_bytes(state_->bytes_limit) + ", " + std::to_string(blocks.size()) + " live blocks, " +
                    format_bytes(static_cast<std::size_t>(state_->usage.bytes_in_use)) + " in use\n";
  for (const auto& [ptr, live] : blocks) {
    out += "  in use " + hex(ptr) + " " + format_bytes(live.bytes) + " stream " + std::to_string(live.stream) + "\n";
  }
  return out;
}

}  // namespace tidepool
