// The live blocks of a pool that hands out whole device allocations
// (PassthroughPool, AsyncPool), with a ring of recent frees so that a double
// free is told from a pointer never handed out.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tidepool/device.hpp"
#include "tidepool/error.hpp"
#include "tidepool/units.hpp"

namespace tidepool::pool {

struct LiveBlock {
  std::size_t bytes = 0;
  Stream stream = kDefaultStream;
};

class LiveBlocks {
 public:
  using Map = std::unordered_map<void*, LiveBlock>;

  /// ptr is not live.
  void add(void* ptr, LiveBlock block) {
    live_.emplace(ptr, block);
    std::replace(recent_frees_.begin(), recent_frees_.end(), ptr, static_cast<void*>(nullptr));
  }

  /// The live block at ptr; double_free for one freed lately, invalid_pointer
  /// otherwise, each naming `who` and the pointer.
  Expected<Map::iterator> find(void* ptr, std::string_view who) {
    const auto found = live_.find(ptr);
    if (found != live_.end()) return found;
    const std::string address = format_address(ptr);
    if (std::find(recent_frees_.begin(), recent_frees_.end(), ptr) != recent_frees_.end())
      return Error(Errc::double_free, std::string(who) + ": free of " + address + ": freed already");
    return Error(Errc::invalid_pointer, std::string(who) + ": free of " + address +
                                            ": not a pointer this allocator handed out");
  }

  /// found came from find() and is still live.
  void erase(Map::iterator found) {
    recent_frees_[next_recent_] = found->first;
    next_recent_ = (next_recent_ + 1) % recent_frees_.size();
    live_.erase(found);
  }

  const Map& map() const noexcept { return live_; }

 private:
  Map live_;
  std::array<void*, 1024> recent_frees_{};  // a ring of freed pointers
  std::size_t next_recent_ = 0;
};

}  // namespace tidepool::pool
