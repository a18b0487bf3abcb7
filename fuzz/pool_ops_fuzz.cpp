// Fuzzes every pool with decoded operation sequences over a small host device:
// allocate(size, stream), free(k), trim(), stats(); where the pool has tags
// (expandable), allocations in two tags and sleep/wake of either, contents
// kept or not (a sleeping tag's blocks are freed but never touched; a wake
// that kept contents must give every byte back); and a step of requests run
// again and again, sometimes freeing late or stopping early (what the
// expandable pool's step plan learns and follows). After each operation:
// no two live blocks overlap, every live block is writable memory holding the
// bytes written into it, and the stats agree with the live set. At the end,
// freeing everything brings bytes_in_use to 0 and trim() gives the device
// back every byte.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tidepool/config.hpp"
#include "tidepool/host_device.hpp"
#include "tidepool/sleep.hpp"
#include "tidepool/stack.hpp"

namespace {

using namespace tidepool;

Mode fuzzed_mode = Mode::preallocate;  // named when an invariant fails

// An invariant that failed names itself, then aborts for libFuzzer to record the input.
#define require(condition)                                                          \
  do {                                                                              \
    if (!(condition)) {                                                             \
      std::fprintf(stderr, "pool_ops_fuzz: %s broke %s (line %d)\n",                \
                   std::string(mode_name(fuzzed_mode)).c_str(), #condition, __LINE__);     \
      std::abort();                                                                 \
    }                                                                               \
  } while (false)

struct Block {
  std::size_t bytes;
  std::uint8_t mark;
  int tag = 0;  // 0: untagged; 1, 2: kTagNames[tag]
};

constexpr const char* kTagNames[] = {"", "a", "b"};

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::uint8_t next() { return size ? (--size, *data++) : 0; }
  bool done() const { return size == 0; }
};

// Sizes across the regimes that matter: tiny, sub-granule, multi-granule.
std::size_t decode_size(Reader& in) {
  const std::uint8_t kind = in.next();
  const std::size_t raw = (std::size_t{in.next()} << 8) | in.next();
  switch (kind % 4) {
    case 0: return raw % 1024;              // 0..1 KiB, zero included
    case 1: return 1 + raw * 16;            // up to 1 MiB
    case 2: return (1 + raw % 64) * 64 * KiB;  // 64 KiB .. 4 MiB
    default: return (1 + raw % 8) * MiB + raw;  // 1 .. 9 MiB, odd sizes
  }
}

void write_marks(void* ptr, const Block& block) {
  auto* bytes = static_cast<std::uint8_t*>(ptr);
  bytes[block.bytes - 1] = static_cast<std::uint8_t>(~block.mark);
  bytes[0] = block.mark;  // after: a 1-byte block holds the mark alone
}

void check_marks(void* ptr, const Block& block) {
  const auto* bytes = static_cast<const std::uint8_t*>(ptr);
  require(bytes[0] == block.mark);
  if (block.bytes > 1) require(bytes[block.bytes - 1] == static_cast<std::uint8_t>(~block.mark));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in{data, size};
  const auto modes = all_modes();
  const Mode mode = modes[in.next() % modes.size()];
  fuzzed_mode = mode;

  // The release threshold (expandable, cuda_async): keep all, none, or 8 MiB;
  // whether an expandable pool keeps stolen granules mapped (aliases); and
  // the device's granularity: 2 MiB, or 64 KiB, where 64 MiB is 1,024
  // granules and the expandable pool keeps headroom past its top once it
  // maps 512 of them.
  const std::uint8_t settings = in.next();
  const std::size_t granule = settings / 6 % 2 == 1 ? 64 * KiB : 2 * MiB;
  auto device = HostDevice::create({.capacity = 64 * MiB, .granularity = granule, .name = "fuzz"});
  require(device.has_value());
  const std::size_t device_free_at_start = (*device)->mem_info().free_bytes;
  Config config;
  const std::uint8_t release = settings % 3;
  if (release != 0) config.release_threshold = {std::optional<std::size_t>(release == 1 ? 0 : 8 * MiB)};
  config.aliases.value = settings / 3 % 2 == 1;
  if (!mode_supported(mode, **device)) return 0;
  auto pool = make_allocator(mode, config, *device);
  require(pool.has_value());
  Allocator& allocator = **pool;

  std::map<std::uintptr_t, Block> live;  // by address: neighbours are the overlap check
  std::vector<std::uintptr_t> order;     // by allocation, for free(k)
  std::int64_t successes = 0;
  std::uint8_t mark = 1;
  Sleepable* tags = allocator.sleepable();
  bool asleep[3] = {false, false, false};
  // Wakes tag t; its blocks hold their marks again (kept) or are rewritten.
  auto wake = [&](int t, bool kept) -> bool {
    Status woken = tags->wake(kTagNames[t]);
    if (!woken) {
      require(woken.error().code() == Errc::out_of_memory);  // others grew into its room
      return false;
    }
    asleep[t] = false;
    for (const auto& [address, block] : live) {
      if (block.tag != t) continue;
      if (kept) {
        check_marks(reinterpret_cast<void*>(address), block);
      } else {
        write_marks(reinterpret_cast<void*>(address), block);
      }
    }
    return true;
  };
  bool kept[3] = {true, true, true};

  // One allocation, checked: an OOM only where it must be, no overlap with
  // any live block, its marks written.
  auto allocate_one = [&](std::size_t bytes, Stream stream, int tag) {
    const Stats before = allocator.stats();
    if (tag != 0) require(tags->tag_begin(kTagNames[tag]).has_value());
    auto ptr = allocator.allocate(bytes, stream);
    if (tag != 0) require(tags->tag_end().has_value());
    if (tag != 0 && asleep[tag]) {  // refused, whatever the size
      require(bytes == 0 || bytes > static_cast<std::size_t>(before.bytes_limit) ||
              (!ptr && ptr.error().code() == Errc::invalid_argument));
      return;
    }
    if (!ptr) {
      require(ptr.error().code() == Errc::out_of_memory);
      if (mode == Mode::expandable) {
        // Stitching: an OOM only when free granules and room to map more
        // cannot cover the granules the block spans (at most one more
        // than its size in granules).
        const auto G = static_cast<std::int64_t>(granule);
        const std::int64_t room = (before.bytes_limit - before.bytes_mapped) / G;
        const auto spans = static_cast<std::int64_t>((bytes + G - 1) / G) + 1;
        require(bytes > static_cast<std::size_t>(before.bytes_limit) || spans > before.granules_free + room);
      }
      return;
    }
    if (bytes == 0) {
      require(*ptr == nullptr);
      return;
    }
    ++successes;
    const auto address = reinterpret_cast<std::uintptr_t>(*ptr);
    require(address % kMinAlignment == 0);
    auto next = live.lower_bound(address);
    require(next == live.end() || next->first >= address + bytes);
    if (next != live.begin()) {
      auto previous = std::prev(next);
      require(previous->first + previous->second.bytes <= address);
    }
    Block block{bytes, mark++, tag};
    write_marks(*ptr, block);
    live.emplace(address, block);
    order.push_back(address);
  };
  // Frees the k-th live block by allocation order (swapped with the last).
  auto free_one = [&](std::size_t k, Stream stream, bool twice) {
    const std::uintptr_t address = order[k];
    order[k] = order.back();
    order.pop_back();
    auto it = live.find(address);
    if (!asleep[it->second.tag]) check_marks(reinterpret_cast<void*>(address), it->second);
    require(allocator.deallocate(reinterpret_cast<void*>(address), stream).has_value());
    live.erase(it);
    // The same pointer again is a double free, refused without harm.
    if (twice) require(!allocator.deallocate(reinterpret_cast<void*>(address)).has_value());
  };

  for (int steps = 0; !in.done() && steps < 4096; ++steps) {
    const std::uint8_t op = in.next();
    if (op % 8 < 4) {
      const std::size_t bytes = decode_size(in);
      const Stream stream = (op & 0x10) ? 1 : kDefaultStream;
      const int tag = tags != nullptr && (op & 0x40) ? 1 + (op >> 7) : 0;
      allocate_one(bytes, stream, tag);
    } else if (op % 8 < 6 && !order.empty()) {
      free_one(in.next() % order.size(), (op & 0x10) ? 1 : 0, (op & 0x20) != 0);
    } else if (op % 8 == 7 && (op & 0x40) == 0 && (op & 0x20) != 0) {
      // A step repeated (the expandable pool's step plan, step_plan.hpp):
      // up to 40 large blocks (a plan takes steps of 16 requests or more),
      // each freed a number of requests after its own, the whole step run 3
      // to 10 times; every 4th run a block is freed late, past the next
      // run's start, and a run may stop early.
      const std::size_t count = 1 + in.next() % 40;
      const std::size_t runs = 3 + in.next() % 8;
      std::vector<std::size_t> sizes, after;
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t raw = (std::size_t{in.next()} << 8) | in.next();
        sizes.push_back((1 + raw % 4) * MiB + raw % 4096);  // 1 .. 5 MiB
        after.push_back(1 + in.next() % (count - i));
      }
      std::size_t stop_at = in.next() % (count * runs + 1);  // a run stops there, once
      std::vector<std::pair<std::size_t, std::uintptr_t>> due;  // request index it is freed before, address
      std::size_t request = 0;
      for (std::size_t run = 0; run < runs; ++run) {
        for (std::size_t i = 0; i <= count; ++i, ++request) {
          for (auto it = due.begin(); it != due.end();) {
            if (it->first > request) {
              ++it;
              continue;
            }
            auto found = std::find(order.begin(), order.end(), it->second);
            if (found != order.end()) free_one(static_cast<std::size_t>(found - order.begin()), kDefaultStream, false);
            it = due.erase(it);
          }
          if (i == count) break;
          if (request == stop_at) {
            stop_at = SIZE_MAX;
            break;
          }
          const std::size_t before = order.size();
          allocate_one(sizes[i], kDefaultStream, 0);
          if (order.size() > before) {
            const std::size_t late = (run % 4 == 3 && i == 0) ? count : 0;
            due.emplace_back(request + after[i] + late, order.back());
          }
        }
      }
    } else if (op % 8 == 6) {
      allocator.trim();
    } else if (tags != nullptr && (op & 0x40)) {
      // Sleep or wake tag a or b; sleeping twice and waking an awake tag are refused.
      const int t = 1 + (op >> 7);
      if (asleep[t]) {
        require(!tags->sleep(kTagNames[t], SleepKeep::nothing).has_value());
        (void)wake(t, kept[t]);
      } else {
        require(!tags->wake(kTagNames[t]).has_value());  // awake, or not made yet
        Status slept = tags->sleep(kTagNames[t], (op & 0x20) ? SleepKeep::nothing : SleepKeep::contents);
        if (slept) {
          asleep[t] = true;
          kept[t] = (op & 0x20) == 0;
        } else {
          require(slept.error().code() == Errc::invalid_argument);  // no scope made the tag yet
        }
      }
    } else {
      // A pointer no pool handed out is refused.
      static std::uint8_t foreign[512];
      require(!allocator.deallocate(foreign + 256).has_value());
    }

    const Stats stats = allocator.stats();
    std::size_t requested = 0;
    for (const auto& [address, block] : live) requested += block.bytes;
    require(stats.num_allocs == successes);
    require(stats.bytes_in_use >= static_cast<std::int64_t>(requested));
    require(stats.peak_bytes_in_use >= stats.bytes_in_use);
    require(stats.bytes_reserved + stats.bytes_asleep >= stats.bytes_in_use);
    require(stats.peak_bytes_reserved >= stats.bytes_reserved);
    require(live.empty() == (stats.bytes_in_use == 0));
    if (mode == Mode::expandable) {
      require(stats.bytes_mapped == stats.bytes_reserved);
      require(stats.bytes_mapped <= stats.bytes_limit);
      require(stats.granules_free * static_cast<std::int64_t>(granule) <=
              stats.bytes_mapped + stats.bytes_asleep - stats.bytes_in_use);
      require(static_cast<std::size_t>(stats.bytes_mapped) == (*device)->mem_info().total_bytes -
                                                                 (*device)->mem_info().free_bytes);
    }
  }

  // The blocks of the awake, then each sleeping tag woken in turn: the two
  // may not fit together (one grew while the other slept).
  auto free_awake = [&] {
    for (auto it = live.begin(); it != live.end();) {
      if (asleep[it->second.tag]) {
        ++it;
        continue;
      }
      check_marks(reinterpret_cast<void*>(it->first), it->second);
      require(allocator.deallocate(reinterpret_cast<void*>(it->first)).has_value());
      it = live.erase(it);
    }
  };
  free_awake();
  for (int t = 1; t <= 2; ++t) {
    if (!asleep[t]) continue;
    require(wake(t, kept[t]));
    free_awake();
  }
  require(allocator.stats().bytes_in_use == 0);
  allocator.trim();
  // trim() hands back every fully free region, a preallocated one included
  // (the pool grows again if asked): the device is back where it started.
  require((*device)->mem_info().free_bytes == device_free_at_start);
  return 0;
}
