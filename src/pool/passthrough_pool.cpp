#include "tidepool/passthrough_pool.hpp"

#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/process.hpp"
#include "pool/live_blocks.hpp"
#include "pool/usage_counters.hpp"
#include "tidepool/units.hpp"

namespace tidepool {
namespace {

// Stats count sizes rounded as the other pools round them, so the modes compare.
constexpr std::size_t kStatsGranule = kMinAlignment;

}  // namespace

struct PassthroughPool::State {
  MakerProcess maker;  // a forked child leaves the pool alone (core/process.hpp)
  std::size_t bytes_limit = 0;
  mutable std::mutex mutex;
  pool::LiveBlocks live;  // bytes as passed to Device::allocate
  pool::UsageCounters usage;
};

PassthroughPool::PassthroughPool(std::shared_ptr<Device> device)
    : device_(std::move(device)), state_(std::make_unique<State>()) {
  state_->bytes_limit = device_->mem_info().total_bytes;
}

PassthroughPool::~PassthroughPool() {
  if (state_->maker.forked()) {  // the blocks and the lock are the parent's
    (void)state_.release();      // a leak in the child only
    return;
  }
  for (const auto& [ptr, live] : state_->live.map()) (void)device_->free(ptr, live.bytes);
}

Expected<void*> PassthroughPool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  State& s = *state_;
  if (s.maker.forked()) return s.maker.refusal("the platform allocator");
  std::lock_guard lock(s.mutex);
  const std::size_t rounded = bytes > s.bytes_limit ? bytes : round_up(bytes, kStatsGranule);
  const auto in_use = static_cast<std::size_t>(s.usage.bytes_in_use);
  auto out_of_memory = [&](std::string hint, OomAdvice advice) {
    ++s.usage.num_ooms;
    OomReport report;
    report.requested_bytes = bytes;
    report.bytes_in_use = in_use;
    report.bytes_reserved = static_cast<std::size_t>(s.usage.pool_bytes);
    report.device_free_bytes = device_->mem_info().free_bytes;
    report.largest_free_block_bytes = 0;  // nothing is cached
    report.hint = std::move(hint);
    report.advice = advice;
    return Error::out_of_memory("platform allocator", std::move(report));
  };
  if (rounded > s.bytes_limit || in_use + rounded > s.bytes_limit) {
    // The limit is the device's (or the one it was made with): the memory
    // fraction, which the advice would name, does not apply to platform.
    return out_of_memory("the allocator's limit is " + format_bytes(s.bytes_limit) + " with " + format_bytes(in_use) +
                             " in use; free memory (the memory fraction does not apply to platform)",
                         OomAdvice::none);
  }
  Expected<void*> ptr = device_->allocate(bytes);
  if (!ptr) {
    if (ptr.error().code() != Errc::out_of_memory) return ptr;
    return out_of_memory("the device has only " + format_bytes(device_->mem_info().free_bytes) +
                         " free: another process or allocator holds the rest of it", OomAdvice::none);
  }
  s.live.add(*ptr, {bytes, stream});
  s.usage.reserved(rounded);
  s.usage.allocated(rounded);
  return ptr;
}

Status PassthroughPool::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return {};
  State& s = *state_;
  if (s.maker.forked()) return {};  // the block is the parent's: the child leaves it alone
  std::lock_guard lock(s.mutex);
  auto found = s.live.find(ptr, "platform allocator");
  if (!found) return std::move(found).error();
  // The device frees at once (cudaFree waits for the device), so the stream
  // needs no synchronizing here beyond what the device does.
  (void)stream;
  const std::size_t bytes = (*found)->second.bytes;
  Status freed = device_->free(ptr, bytes);
  if (!freed) return freed;
  s.live.erase(*found);
  const std::size_t rounded = round_up(bytes, kStatsGranule);
  s.usage.freed(rounded);
  s.usage.released(rounded);
  return {};
}

Stats PassthroughPool::stats() const {
  if (state_->maker.forked()) return {};  // a forked child holds none of it
  std::lock_guard lock(state_->mutex);
  Stats stats = state_->usage.to_stats();
  stats.bytes_limit = static_cast<std::int64_t>(state_->bytes_limit);
  return stats;
}

std::string PassthroughPool::dump() const {
  if (state_->maker.forked()) return state_->maker.refusal("the platform allocator").message() + "\n";
  std::lock_guard lock(state_->mutex);
  std::vector<std::pair<void*, pool::LiveBlock>> blocks(state_->live.map().begin(), state_->live.map().end());
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = "platform allocator on " + device_->description() + ": limit " +
                    format_bytes(state_->bytes_limit) + ", " + std::to_string(blocks.size()) + " live blocks, " +
                    format_bytes(static_cast<std::size_t>(state_->usage.bytes_in_use)) + " in use\n";
  for (const auto& [ptr, live] : blocks) {
    out += "  in use " + format_address(ptr) + " " + format_bytes(live.bytes) + " stream " + std::to_string(live.stream) + "\n";
  }
  return out;
}

}  // namespace tidepool
