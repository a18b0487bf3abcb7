// Sleep and wake: a process hands the physical memory under a tag's blocks
// back to the device (to another process, through the ledger) and takes it
// back later at the same addresses, contents kept or not. docs/sleep.md.
//
// Allocations made while a tag scope is open on the calling thread carry the
// tag; a tag's blocks live in granules of their own, so its memory goes back
// without touching any other block. Only ExpandablePool offers it
// (Allocator::sleepable() is null elsewhere).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tidepool/error.hpp"

namespace tidepool {

/// What a sleeping tag keeps: its blocks' bytes (copied to host memory,
/// pinned on a GPU, and back at wake) or nothing (the memory comes back with
/// undefined contents, as vLLM's sleep level 2).
enum class SleepKeep { contents, nothing };

/// "contents" or "nothing"; invalid_argument naming the word otherwise.
Expected<SleepKeep> parse_sleep_keep(std::string_view word);
std::string_view to_string(SleepKeep keep) noexcept;

/// The most bytes of a tag's name.
inline constexpr std::size_t kMaxTagNameBytes = 64;

/// One tag of a pool, as stats report it.
struct TagStats {
  std::string name;
  bool asleep = false;
  std::size_t bytes_in_use = 0;  // its live blocks (rounded), asleep or not
  std::size_t bytes_asleep = 0;  // physical memory given back by its sleep: 0 while awake
  std::size_t host_bytes = 0;    // host copy held: asleep with contents, or kept for the next sleep (trim frees it)
  std::uint64_t sleeps = 0;
  std::uint64_t wakes = 0;
};

/// Tags, sleep and wake. Thread-safe: a sleep and a wake of different tags
/// may run while other threads allocate and free in other tags.
class Sleepable {
 public:
  virtual ~Sleepable() = default;

  /// Opens a tag scope on the calling thread: its allocations through this
  /// pool carry `name` until the matching tag_end(). Scopes nest (the
  /// innermost wins). The tag is made on first use. invalid_argument for an
  /// empty name or one longer than kMaxTagNameBytes.
  virtual Status tag_begin(std::string_view name) = 0;
  /// Closes the calling thread's innermost tag scope on this pool;
  /// invalid_argument when none is open.
  virtual Status tag_end() = 0;

  /// Gives the physical memory of tag `name` back to the device: with
  /// `keep` contents its blocks' bytes are copied to host memory first.
  /// Addresses stay reserved; the blocks may be freed while asleep but not
  /// read or written (on the host device an access faults). Waits first for
  /// the streams the tag's blocks were allocated on. invalid_argument for a
  /// tag that does not exist, is asleep, or is changing in another thread.
  virtual Status sleep(std::string_view name, SleepKeep keep) = 0;
  /// Takes physical memory for tag `name` again (through the ledger, if
  /// any: one reservation, with its bounded wait and trim requests), maps it
  /// at the same addresses and restores the contents kept. out_of_memory
  /// (naming who holds the device) leaves the tag asleep; invalid_argument
  /// for a tag that does not exist or is awake.
  virtual Status wake(std::string_view name) = 0;

  /// Every tag, in the order they were made.
  virtual std::vector<TagStats> tag_stats() const = 0;
};

/// A tag scope for the lifetime of the object (ExpandablePool::tag()).
/// Close it on the thread that opened it.
class TagScope {
 public:
  /// tag_begin(name) on `pool`; its error otherwise.
  static Expected<TagScope> open(Sleepable& pool, std::string_view name);
  ~TagScope();
  TagScope(TagScope&& other) noexcept : pool_(other.pool_) { other.pool_ = nullptr; }
  TagScope& operator=(TagScope&&) = delete;
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  explicit TagScope(Sleepable& pool) : pool_(&pool) {}
  Sleepable* pool_;
};

}  // namespace tidepool
