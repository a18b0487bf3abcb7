// The tags of an ExpandablePool (sleep.hpp). Each tag has arenas of its own
// over address space of its own, so its blocks share no granule with another
// tag's (or the untagged blocks') and its physical memory can go back to the
// device alone. Also here: the calling thread's open tag scopes, the copy
// runs of a sleep or a wake, and the pipeline that overlaps their copies
// with the unmapping (sleep) or mapping (wake) of the chunks around them.
//
// Not thread-safe: the owning pool serializes every call, except that a tag
// whose phase is changing is touched only by the thread changing it.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "pool/best_fit_arena.hpp"
#include "pool/granule_table.hpp"
#include "tidepool/sleep.hpp"

namespace tidepool::pool {

using TagId = std::uint32_t;
/// The tag of blocks allocated outside any tag scope.
inline constexpr TagId kUntagged = 0;

enum class TagPhase : std::uint8_t { awake, falling_asleep, asleep, waking };

inline const char* to_string(TagPhase phase) noexcept {
  switch (phase) {
    case TagPhase::awake: return "awake";
    case TagPhase::falling_asleep: return "falling asleep in another thread";
    case TagPhase::asleep: return "asleep";
    case TagPhase::waking: return "waking in another thread";
  }
  return "?";
}

/// 'name' as messages quote a tag (or a word given for one), cut to a tag's
/// longest name.
inline std::string quoted_tag(std::string_view name) {
  return "'" + std::string(name.substr(0, kMaxTagNameBytes)) + "'";
}

/// Host memory from Device::allocate_host.
struct HostBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

struct Tag {
  Tag(std::string name_in, Device& device, const ArenaOptions& options)
      : name(std::move(name_in)), small(device, options), large(device, options) {}

  TagId id = kUntagged;
  std::string name;
  BestFitArena small;
  BestFitArena large;
  TagPhase phase = TagPhase::awake;
  /// Streams blocks of the tag were allocated on: synchronized before a sleep copies or unmaps.
  std::vector<Stream> streams;
  /// While asleep: the granules that held live blocks at sleep, ascending;
  /// granule i's bytes are at host.ptr + i * granule when contents are kept.
  std::vector<GranuleId> sleeping;
  SleepKeep kept = SleepKeep::contents;
  std::size_t bytes_asleep = 0;  // granules sleep unmapped and released
  HostBuffer host;               // kept after wake for the next sleep, until trim
  /// Frees while the phase changes, done when it has changed: the granules
  /// under the tag's blocks must not be freed (and stolen) mid-copy.
  std::vector<std::pair<void*, Stream>> deferred_frees;
  /// The tag's live blocks (address -> chunk bytes): the granules under them
  /// are what a sleep copies and a wake brings back. A deferred free leaves
  /// its block here until it is done.
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t bytes_in_use = 0;
  std::uint64_t sleeps = 0;
  std::uint64_t wakes = 0;

  bool changing() const noexcept { return phase == TagPhase::falling_asleep || phase == TagPhase::waking; }
  void note_stream(Stream stream) {
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }
  bool free_deferred(const void* ptr) const noexcept {
    return std::any_of(deferred_frees.begin(), deferred_frees.end(),
                       [ptr](const auto& deferred) { return deferred.first == ptr; });
  }
};

class TagRegistry {
 public:
  /// The tag named `name`, or kUntagged when there is none.
  TagId find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < tags_.size(); ++i) {
      if (tags_[i]->name == name) return static_cast<TagId>(i + 1);
    }
    return kUntagged;
  }
  TagId add(std::string_view name, Device& device, const ArenaOptions& options) {
    tags_.push_back(std::make_unique<Tag>(std::string(name), device, options));
    tags_.back()->id = static_cast<TagId>(tags_.size());
    return tags_.back()->id;
  }
  bool exists(TagId id) const noexcept { return id != kUntagged && id <= tags_.size(); }
  /// exists(id). Tags never move: a reference outlives the pool's lock.
  Tag& at(TagId id) const noexcept { return *tags_[id - 1]; }
  std::size_t size() const noexcept { return tags_.size(); }
  /// "'a', 'b'", or "none".
  std::string names() const {
    std::string out;
    for (const auto& tag : tags_) out += (out.empty() ? "'" : ", '") + tag->name + "'";
    return out.empty() ? "none" : out;
  }

 private:
  std::vector<std::unique_ptr<Tag>> tags_;  // id - 1
};

/// The calling thread's open tag scopes, innermost last, for every pool
/// (`owner`) it has opened one on.
class ThreadTags {
 public:
  static void push(const void* owner, TagId tag) {
    scopes().emplace_back(owner, tag);
    ++open_count;
  }
  /// Closes the innermost scope on `owner`; false when none is open.
  static bool pop(const void* owner) {
    auto& open = scopes();
    for (std::size_t i = open.size(); i-- > 0;) {
      if (open[i].first != owner) continue;
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      --open_count;
      return true;
    }
    return false;
  }
  /// The innermost open tag on `owner`, or kUntagged: a thread with no
  /// scope open pays one load of a plain thread-local count.
  static TagId current(const void* owner) noexcept {
    if (open_count == 0) return kUntagged;
    const auto& open = scopes();
    for (std::size_t i = open.size(); i-- > 0;) {
      if (open[i].first == owner) return open[i].second;
    }
    return kUntagged;
  }

 private:
  static std::vector<std::pair<const void*, TagId>>& scopes() noexcept {
    thread_local std::vector<std::pair<const void*, TagId>> open;
    return open;
  }
  // scopes().size(), in a variable with no constructor: reading it needs no
  // thread-local initialization check.
  static inline thread_local constinit std::size_t open_count = 0;
};

/// One copy between device and host memory: `granules` granules at device
/// address `device`, host offset `host_offset` (in granules).
struct CopyRun {
  void* device = nullptr;
  std::size_t host_offset = 0;
  std::size_t granules = 0;
};

/// The copies for `ids` (ascending, a subset of `order`, which is the host
/// layout), merged where both the addresses and the host offsets run on.
template <class AddressOf>
std::vector<CopyRun> copy_runs(const std::vector<GranuleId>& ids, const std::vector<GranuleId>& order,
                               std::size_t granule, AddressOf address_of) {
  std::vector<CopyRun> runs;
  std::size_t position = 0;
  for (GranuleId id : ids) {
    while (position < order.size() && order[position] != id) ++position;
    if (position == order.size()) break;  // not in the host layout (the caller keeps ids a subset)
    auto* address = static_cast<char*>(address_of(id));
    if (!runs.empty()) {
      CopyRun& last = runs.back();
      if (static_cast<char*>(last.device) + last.granules * granule == address &&
          last.host_offset + last.granules == position) {
        ++last.granules;
        continue;
      }
    }
    runs.push_back({address, position, 1});
  }
  return runs;
}

/// `runs` (copy_runs of some ids, in their order) cut where the index into
/// those ids crosses a multiple of `chunk`: element i holds the copies of
/// ids [i * chunk, (i + 1) * chunk).
inline std::vector<std::vector<CopyRun>> chunk_runs(const std::vector<CopyRun>& runs, std::size_t chunk,
                                                    std::size_t granule) {
  std::vector<std::vector<CopyRun>> chunks;
  std::size_t index = 0;  // of the run's first granule among the ids
  for (CopyRun run : runs) {
    while (run.granules > 0) {
      const std::size_t i = index / chunk;
      const std::size_t take = std::min(run.granules, (i + 1) * chunk - index);
      if (chunks.size() <= i) chunks.resize(i + 1);
      chunks[i].push_back({run.device, run.host_offset, take});
      run.device = static_cast<char*>(run.device) + take * granule;
      run.host_offset += take;
      run.granules -= take;
      index += take;
    }
  }
  return chunks;
}

/// How many chunks of `chunk` ids `count` ids make.
inline std::size_t chunk_count(std::size_t count, std::size_t chunk) { return (count + chunk - 1) / chunk; }
/// The ids of chunk i: [i * chunk, (i + 1) * chunk) of `ids`, the last one shorter.
inline std::span<const GranuleId> chunk_of(std::span<const GranuleId> ids, std::size_t chunk, std::size_t i) {
  return ids.subspan(i * chunk, std::min(chunk, ids.size() - i * chunk));
}

/// How a pipeline ended: the chunks `first` completed (`second` ran on
/// each), and first's error if it stopped early.
struct PipelineEnd {
  std::size_t done = 0;
  Status status;
};

/// Overlaps two stages over chunks 0..count-1: first(i), in order, on a
/// helper thread; second(i) on the calling thread as soon as first(i) is
/// done (a sleep copies a chunk while the one before is unmapped; a wake
/// maps a chunk while the one before is copied). Stops at first's first
/// error; second reports its own failures through its captures. One chunk
/// runs without a thread.
inline PipelineEnd pipeline(std::size_t count, const std::function<Status(std::size_t)>& first,
                            const std::function<void(std::size_t)>& second) {
  if (count <= 1) {
    if (count == 0) return {};
    if (Status status = first(0); !status) return {0, std::move(status)};
    second(0);
    return {1, {}};
  }
  std::mutex mutex;
  std::condition_variable progress;
  std::size_t done = 0;
  bool stopped = false;
  Status failed;
  std::thread helper([&] {
    for (std::size_t i = 0; i < count; ++i) {
      Status status = first(i);
      std::lock_guard lock(mutex);
      if (!status) {
        failed = std::move(status);
        stopped = true;
      } else {
        done = i + 1;
      }
      progress.notify_one();
      if (stopped) return;
    }
  });
  for (std::size_t i = 0; i < count; ++i) {
    {
      std::unique_lock lock(mutex);
      progress.wait(lock, [&] { return done > i || stopped; });
      if (done <= i) break;
    }
    second(i);
  }
  helper.join();
  return {done, std::move(failed)};
}

}  // namespace tidepool::pool
