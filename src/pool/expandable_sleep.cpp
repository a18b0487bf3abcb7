// ExpandablePool's tags, sleep and wake (tidepool/sleep.hpp): the state
// they work on is expandable_state.hpp's.
#include "tidepool/expandable_pool.hpp"

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pool/expandable_state.hpp"

namespace tidepool {

using namespace expandable;

// --- tags, sleep and wake --------------------------------------------------
// A sleep copies (unless keep is nothing) and unmaps; a wake creates, maps
// and copies back. The copies and the ledger's wait run without the pool's
// lock: the tag's phase keeps allocations out of it and defers its frees, so
// none of its granules can be freed, stolen or mapped meanwhile.

Expected<pool::Tag*> ExpandablePool::State::tag_to_allocate(pool::TagId id, std::size_t bytes) {
  if (!tags.exists(id)) {
    return Error(Errc::invalid_argument, "expandable pool: allocate of " + format_bytes(bytes) +
                                             ": this thread's tag scope is of another pool (one destroyed)");
  }
  pool::Tag& tag = tags.at(id);
  if (tag.phase != pool::TagPhase::awake) {
    return Error(Errc::invalid_argument, "expandable pool: allocate of " + format_bytes(bytes) + " in tag " +
                                             pool::quoted_tag(tag.name) + ": the tag is " + pool::to_string(tag.phase) +
                                             "; wake it first");
  }
  return &tag;
}

Status ExpandablePool::State::free_tagged(const Space& space, void* ptr, Stream stream) {
  pool::Tag& tag = tags.at(space.tag);
  pool::BestFitArena& arena = arena_of(space);
  if (tag.changing()) {
    const std::size_t bytes = arena.live_size(ptr);
    if (bytes == 0 || tag.free_deferred(ptr)) {
      return Error(tag.free_deferred(ptr) ? Errc::double_free : Errc::invalid_pointer,
                   "expandable pool: free of " + format_address(ptr) + " in tag " + pool::quoted_tag(tag.name) +
                       ": not a live block of the tag (freed already, or not a block's start)");
    }
    tag.deferred_frees.emplace_back(ptr, stream);
    usage.freed(bytes);
    tag.bytes_in_use -= bytes;
    return {};
  }
  Expected<std::size_t> freed = arena.free(ptr, stream);
  if (!freed) return std::move(freed).error();
  note_free(stream);
  unback(space, reinterpret_cast<std::uintptr_t>(ptr), *freed, stream);  // asleep: unmapped granules stay so
  tag.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
  usage.freed(*freed);
  tag.bytes_in_use -= *freed;
  if (free_granule_bytes() > options.release_threshold) release_free(options.release_threshold);
  return {};
}

Expected<pool::Tag*> ExpandablePool::State::begin_change(const char* op, std::string_view name, pool::TagPhase from,
                                                         pool::TagPhase to) {
  std::lock_guard lock(mutex);
  const pool::TagId id = tags.find(name);
  if (id == pool::kUntagged) {
    return Error(Errc::invalid_argument, std::string("expandable pool: ") + op + "(" + pool::quoted_tag(name) +
                                             "): no tag of that name (tags: " + tags.names() + ")");
  }
  pool::Tag& tag = tags.at(id);
  if (tag.phase != from) {
    return Error(Errc::invalid_argument, std::string("expandable pool: ") + op + "(" + pool::quoted_tag(name) +
                                             "): the tag is " + pool::to_string(tag.phase));
  }
  tag.phase = to;
  return &tag;
}

void ExpandablePool::State::end_change(pool::Tag& tag, pool::TagPhase phase) {
  tag.phase = phase;
  for (const auto& [ptr, stream] : tag.deferred_frees) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    const Space& space = *space_of(address);
    Expected<std::size_t> freed = arena_of(space).free(ptr, stream);  // checked when deferred
    if (!freed) continue;
    note_free(stream);
    unback(space, address, *freed, stream);
    tag.live.erase(address);
  }
  tag.deferred_frees.clear();
}

std::vector<GranuleId> ExpandablePool::State::granules_under(const pool::Tag& tag) const {
  std::vector<GranuleId> ids;
  for (const auto& [base, bytes] : tag.live) {
    const Space& space = *space_of(base);
    const GranuleId last = granule_of(space, base + bytes - 1);
    GranuleId g = granule_of(space, base);
    if (!ids.empty() && ids.back() == g) ++g;  // shared with the block below
    for (; g <= last; ++g) ids.push_back(g);
  }
  // Ids follow the order spaces were reserved in, not their addresses.
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<GranuleId> ExpandablePool::State::mapped_granules(pool::TagId id) const {
  std::vector<GranuleId> ids;
  for (const Space& space : spaces) {
    if (space.tag != id) continue;
    const auto end = static_cast<GranuleId>(space.first + space.bytes / granule);
    for (GranuleId g = space.first; g < end; ++g) {
      if (granules.is_mapped(g)) ids.push_back(g);
    }
  }
  return ids;
}

Status ExpandablePool::State::prepare_host(pool::Tag& tag, SleepKeep keep) {
  for (Stream stream : tag.streams) {
    if (Status waited = wait_for(*device, stream); !waited) return waited;
  }
  const std::size_t bytes = tag.sleeping.size() * granule;
  if (keep == SleepKeep::nothing || bytes == 0) {
    free_host(tag.host);
    return {};
  }
  if (tag.host.bytes < bytes) {
    free_host(tag.host);
    Expected<void*> host = device->allocate_host(bytes);
    if (!host) return std::move(host).error();
    tag.host = {*host, bytes};
  }
  return {};
}

void ExpandablePool::State::release_free_of(const pool::Tag& tag) {
  const std::vector<GranuleId> used = granules_under(tag);
  for (GranuleId id : mapped_granules(tag.id)) {
    if (std::binary_search(used.begin(), used.end(), id)) continue;
    Expected<PhysicalHandle> handle = unmap_free(id);
    if (handle) release_handle(*handle);
  }
}

void ExpandablePool::State::release_used(pool::Tag& tag, std::span<const GranuleId> ids, std::optional<Error>& failed) {
  for (GranuleId id : ids) {
    if (Status unmapped = device->unmap(address_of(id), granule); !unmapped) {
      if (!failed) failed = std::move(unmapped).error();
      continue;
    }
    ++unmaps;
    release_handle(granules.take_used(id));
    tag.bytes_asleep += granule;
  }
}

Status ExpandablePool::State::map_back(pool::Tag& tag, const std::vector<GranuleId>& ids, bool copy,
                                       std::optional<Error>& copy_failed) {
  if (ids.empty()) return {};
  const auto failed = [&](const Error& error) {  // the wake's words around the device's
    return Error(error.code(), "of " + format_bytes(ids.size() * granule) + ": " + error.message());
  };
  Expected<std::vector<PhysicalHandle>> handles = device->create_many(granule, ids.size());
  {
    std::lock_guard lock(mutex);
    if (!handles) {
      if (handles.error().code() == Errc::out_of_memory) ++usage.num_ooms;
      return failed(handles.error());
    }
    for (std::size_t k = 0; k < handles->size(); ++k) usage.reserved(granule);
    if (Status room = make_room(tag, ids.size()); !room) {  // again: others may have allocated meanwhile
      for (PhysicalHandle handle : *handles) release_handle(handle);
      return room;
    }
  }
  const std::size_t chunk = chunk_granules();
  const std::vector<std::vector<pool::CopyRun>> copies =
      copy ? pool::chunk_runs(copy_runs(ids, tag.sleeping), chunk, granule) : std::vector<std::vector<pool::CopyRun>>{};
  const auto* host = static_cast<const char*>(tag.host.ptr);
  pool::PipelineEnd end = pool::pipeline(
      pool::chunk_count(ids.size(), chunk),
      [&](std::size_t i) -> Status {  // a helper thread maps chunk i
        const std::span<const GranuleId> part = pool::chunk_of(ids, chunk, i);
        std::lock_guard lock(mutex);
        Status mapped = map_woken(part, std::span<const PhysicalHandle>(*handles).subspan(i * chunk, part.size()));
        if (!mapped) return failed(mapped.error());
        return {};
      },
      [&](std::size_t i) {  // while this thread copies chunk i back
        if (i >= copies.size() || copy_failed) return;
        for (const pool::CopyRun& run : copies[i]) {
          Status copied = device->copy_from_host(run.device, host + run.host_offset * granule, run.granules * granule);
          if (!copied) {
            copy_failed = std::move(copied).error();
            return;
          }
        }
      });
  if (end.status) return {};
  // What was mapped goes again, and what was not mapped is released (the
  // failed chunk's own handles went with it): the tag stays as it was.
  std::lock_guard lock(mutex);
  for (std::size_t k = 0; k < end.done * chunk; ++k) {
    (void)device->unmap(address_of(ids[k]), granule);
    ++unmaps;
    release_handle(granules.take_used(ids[k]));
  }
  for (std::size_t k = (end.done + 1) * chunk; k < ids.size(); ++k) release_handle((*handles)[k]);
  return end.status;
}

Status ExpandablePool::State::make_room(const pool::Tag& tag, std::size_t count) {
  const std::size_t wanted = count * granule;
  if (mapped_bytes() + wanted <= bytes_limit) return {};
  const std::size_t excess = mapped_bytes() + wanted - bytes_limit;
  complete_held();
  release_free(free_granule_bytes() > excess ? free_granule_bytes() - excess : 0);
  if (mapped_bytes() + wanted <= bytes_limit) return {};
  OomReport report = oom_report(wanted);
  report.hint = "the pool's limit is " + format_bytes(bytes_limit) + " and its other blocks took " +
                format_bytes(mapped_bytes()) + " while tag " + pool::quoted_tag(tag.name) +
                " slept, which stays asleep; sleep another tag";
  report.advice = OomAdvice::free_or_raise_limit;
  return Error::out_of_memory("expandable pool: wake(" + pool::quoted_tag(tag.name) + ")", std::move(report));
}

Status ExpandablePool::State::map_woken(std::span<const GranuleId> ids, std::span<const PhysicalHandle> handles) {
  for (std::size_t i = 0; i < ids.size();) {
    auto* first = static_cast<char*>(address_of(ids[i]));
    std::size_t count = 1;
    while (i + count < ids.size() && address_of(ids[i + count]) == first + count * granule) ++count;
    Status mapped = device->map_many(first, granule, handles.subspan(i, count));
    if (!mapped) {
      for (std::size_t j = 0; j < i; ++j) {
        (void)device->unmap(address_of(ids[j]), granule);
        (void)granules.take_used(ids[j]);
      }
      for (PhysicalHandle handle : handles) release_handle(handle);
      return mapped;
    }
    for (std::size_t j = i; j < i + count; ++j) granules.set_mapped(ids[j], handles[j]);
    maps += static_cast<std::int64_t>(count);
    i += count;
  }
  return {};
}

Status ExpandablePool::tag_begin(std::string_view name) {
  if (name.empty() || name.size() > kMaxTagNameBytes) {
    return Error(Errc::invalid_argument, "expandable pool: tag " + pool::quoted_tag(name) + " (" +
                                             std::to_string(name.size()) +
                                             " bytes): a tag's name is 1 to " + std::to_string(kMaxTagNameBytes) +
                                             " bytes");
  }
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  pool::TagId id = pool::kUntagged;
  {
    std::lock_guard lock(s.mutex);
    id = s.tags.find(name);
    if (id == pool::kUntagged) {
      s.sync_granules();  // a tag's bookkeeping needs the granule table: it follows every block from now on
      s.exact = true;
      s.drop_aliases();  // a tag's sleep and wake map its space themselves
      id = s.tags.add(name, *s.device, arena_options());
    }
  }
  pool::ThreadTags::push(this, id);
  return {};
}

Status ExpandablePool::tag_end() {
  if (pool::ThreadTags::pop(this)) return {};
  return Error(Errc::invalid_argument, "expandable pool: tag_end: no tag scope is open on this thread");
}

Status ExpandablePool::sleep(std::string_view name, SleepKeep keep) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  Expected<pool::Tag*> found = s.begin_change("sleep", name, pool::TagPhase::awake, pool::TagPhase::falling_asleep);
  if (!found) return std::move(found).error();
  pool::Tag& tag = **found;
  const auto failure = [&](const Error& error, const std::string& outcome) {
    return Error(error.code(), "expandable pool: sleep(" + pool::quoted_tag(name) + "): " + error.message() + outcome);
  };
  std::vector<pool::CopyRun> runs;
  {
    std::lock_guard lock(s.mutex);
    tag.sleeping = s.granules_under(tag);  // all mapped: the tag was awake
    tag.kept = keep;
    if (keep == SleepKeep::contents) runs = s.copy_runs(tag.sleeping, tag.sleeping);
  }
  if (Status ready = s.prepare_host(tag, keep); !ready) {
    std::lock_guard lock(s.mutex);
    tag.sleeping.clear();
    s.end_change(tag, pool::TagPhase::awake);
    return failure(ready.error(), " (the tag stays awake)");
  }
  {
    std::lock_guard lock(s.mutex);
    tag.bytes_asleep = 0;
    s.release_free_of(tag);
  }
  // Chunk by chunk: a chunk is copied while the one before is unmapped.
  const std::vector<GranuleId>& ids = tag.sleeping;
  const std::size_t chunk = keep == SleepKeep::contents ? s.chunk_granules() : std::max<std::size_t>(1, ids.size());
  const std::vector<std::vector<pool::CopyRun>> copies = pool::chunk_runs(runs, chunk, s.granule);
  auto* host = static_cast<char*>(tag.host.ptr);
  std::optional<Error> refused;  // an unmap the device refused: that granule stays mapped
  pool::PipelineEnd end = pool::pipeline(
      pool::chunk_count(ids.size(), chunk),
      [&](std::size_t i) -> Status {  // a helper thread copies chunk i
        if (i >= copies.size()) return {};
        for (const pool::CopyRun& run : copies[i]) {
          Status copied = s.device->copy_to_host(host + run.host_offset * s.granule, run.device, run.granules * s.granule);
          if (!copied) return copied;
        }
        return {};
      },
      [&](std::size_t i) {  // while this thread unmaps chunk i
        std::lock_guard lock(s.mutex);
        s.release_used(tag, pool::chunk_of(ids, chunk, i), refused);
      });
  if (!end.status) {
    // A copy failed: what was unmapped is mapped back from the host copy.
    std::vector<GranuleId> released;
    {
      std::lock_guard lock(s.mutex);
      for (GranuleId id : ids) {
        if (!s.granules.is_mapped(id)) released.push_back(id);
      }
    }
    std::optional<Error> copy_failed;
    Status back = s.map_back(tag, released, true, copy_failed);
    std::lock_guard lock(s.mutex);
    if (back && !copy_failed) {
      tag.sleeping.clear();
      tag.bytes_asleep = 0;
      s.end_change(tag, pool::TagPhase::awake);
      return failure(end.status.error(), " (the tag stays awake)");
    }
    ++tag.sleeps;
    s.end_change(tag, pool::TagPhase::asleep);
    return failure(end.status.error(), "; mapping back what it had unmapped failed too (" +
                                           (back ? copy_failed->message() : back.error().message()) +
                                           "): the tag is asleep, wake it to retry");
  }
  std::lock_guard lock(s.mutex);
  ++tag.sleeps;
  s.end_change(tag, pool::TagPhase::asleep);
  if (refused) return *refused;
  return {};
}

Status ExpandablePool::wake(std::string_view name) {
  State& s = *state_;
  if (s.maker.forked()) return s.refused_in_child();
  Expected<pool::Tag*> found = s.begin_change("wake", name, pool::TagPhase::asleep, pool::TagPhase::waking);
  if (!found) return std::move(found).error();
  pool::Tag& tag = **found;
  std::vector<GranuleId> needed;  // slept under live blocks, not freed since
  {
    std::lock_guard lock(s.mutex);
    for (GranuleId id : s.granules_under(tag)) {  // a subset of tag.sleeping: frees only since
      if (!s.granules.is_mapped(id)) needed.push_back(id);
    }
    if (Status room = s.make_room(tag, needed.size()); !room) {
      s.end_change(tag, pool::TagPhase::asleep);
      return room;
    }
  }
  std::optional<Error> copy_failed;
  Status mapped = s.map_back(tag, needed, tag.kept == SleepKeep::contents, copy_failed);
  std::lock_guard lock(s.mutex);
  if (!mapped) {
    s.end_change(tag, pool::TagPhase::asleep);
    if (mapped.error().code() == Errc::out_of_memory && mapped.error().oom() != nullptr) return mapped;
    return Error(mapped.error().code(), "expandable pool: wake(" + pool::quoted_tag(name) + ") " +
                                            mapped.error().message() + " (the tag stays asleep)");
  }
  tag.sleeping.clear();
  tag.bytes_asleep = 0;
  ++tag.wakes;
  s.end_change(tag, pool::TagPhase::awake);
  if (copy_failed) return *copy_failed;
  return {};
}

std::vector<TagStats> ExpandablePool::tag_stats() const {
  State& s = *state_;
  if (s.maker.forked()) return {};
  std::lock_guard lock(s.mutex);
  std::vector<TagStats> out;
  for (std::size_t id = 1; id <= s.tags.size(); ++id) {
    const pool::Tag& tag = s.tags.at(static_cast<pool::TagId>(id));
    const bool asleep = tag.phase == pool::TagPhase::asleep || tag.phase == pool::TagPhase::waking;
    // The host buffer is the changing thread's while the phase changes.
    const std::size_t host_bytes = tag.changing() ? 0 : tag.host.bytes;
    out.push_back({tag.name, asleep, tag.bytes_in_use, tag.bytes_asleep, host_bytes, tag.sleeps, tag.wakes});
  }
  return out;
}

}  // namespace tidepool
