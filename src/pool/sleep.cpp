// sleep.hpp's free functions and TagScope; ExpandablePool's sleep and wake
// are in expandable_pool.cpp, its tags in sleep_tags.hpp.
#include "tidepool/sleep.hpp"

#include <string>
#include <utility>

#include "pool/sleep_tags.hpp"

namespace tidepool {

Expected<SleepKeep> parse_sleep_keep(std::string_view word) {
  if (word == "contents") return SleepKeep::contents;
  if (word == "nothing") return SleepKeep::nothing;
  return Error(Errc::invalid_argument, "keep=" + pool::quoted_tag(word) +
                                           ": allowed: 'contents' (copied to host memory and back) or 'nothing' "
                                           "(discarded)");
}

std::string_view to_string(SleepKeep keep) noexcept { return keep == SleepKeep::contents ? "contents" : "nothing"; }

Expected<TagScope> TagScope::open(Sleepable& pool, std::string_view name) {
  if (Status begun = pool.tag_begin(name); !begun) return std::move(begun).error();
  return TagScope(pool);
}

TagScope::~TagScope() {
  if (pool_ != nullptr) (void)pool_->tag_end();
}

}  // namespace tidepool
