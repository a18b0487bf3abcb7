// Fuzzes every pool with decoded operation sequences over a small host device:
// allocate(size, stream), free(k), trim(), stats(). After each operation:
// no two live blocks overlap, every live block is writable memory holding the
// bytes written into it, and the stats agree with the live set. At the end,
// freeing everything brings bytes_in_use to 0 and trim() gives the device
// back every byte.
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
};

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

  auto device = HostDevice::create({.capacity = 64 * MiB, .granularity = 2 * MiB, .name = "fuzz"});
  require(device.has_value());
  const std::size_t device_free_at_start = (*device)->mem_info().free_bytes;
  Config config;
  // The release threshold (expandable, cuda_async): keep all, none, or 8 MiB.
  const std::uint8_t release = in.next() % 3;
  if (release != 0) config.release_threshold = {std::optional<std::size_t>(release == 1 ? 0 : 8 * MiB)};
  if (!mode_supported(mode, **device)) return 0;
  auto pool = make_allocator(mode, config, *device);
  require(pool.has_value());
  Allocator& allocator = **pool;

  std::map<std::uintptr_t, Block> live;  // by address: neighbours are the overlap check
  std::vector<std::uintptr_t> order;     // by allocation, for free(k)
  std::int64_t successes = 0;
  std::uint8_t mark = 1;

  for (int steps = 0; !in.done() && steps < 4096; ++steps) {
    const std::uint8_t op = in.next();
    if (op % 8 < 4) {
      const std::size_t bytes = decode_size(in);
      const Stream stream = (op & 0x10) ? 1 : kDefaultStream;
      const Stats before = allocator.stats();
      auto ptr = allocator.allocate(bytes, stream);
      if (!ptr) {
        require(ptr.error().code() == Errc::out_of_memory);
        if (mode == Mode::expandable) {
          // Stitching: an OOM only when free granules and room to map more
          // cannot cover the granules the block spans (at most one more
          // than its size in granules).
          constexpr std::int64_t G = 2 * MiB;
          const std::int64_t room = (before.bytes_limit - before.bytes_mapped) / G;
          const auto spans = static_cast<std::int64_t>((bytes + G - 1) / G) + 1;
          require(bytes > static_cast<std::size_t>(before.bytes_limit) || spans > before.granules_free + room);
        }
        continue;
      }
      if (bytes == 0) {
        require(*ptr == nullptr);
        continue;
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
      Block block{bytes, mark++};
      write_marks(*ptr, block);
      live.emplace(address, block);
      order.push_back(address);
    } else if (op % 8 < 6 && !order.empty()) {
      const std::size_t k = in.next() % order.size();
      const std::uintptr_t address = order[k];
      order[k] = order.back();
      order.pop_back();
      auto it = live.find(address);
      check_marks(reinterpret_cast<void*>(address), it->second);
      require(allocator.deallocate(reinterpret_cast<void*>(address), (op & 0x10) ? 1 : 0).has_value());
      live.erase(it);
      // The same pointer again is a double free, refused without harm.
      if (op & 0x20) require(!allocator.deallocate(reinterpret_cast<void*>(address)).has_value());
    } else if (op % 8 == 6) {
      allocator.trim();
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
    require(stats.bytes_reserved >= stats.bytes_in_use);
    require(stats.peak_bytes_reserved >= stats.bytes_reserved);
    require(live.empty() == (stats.bytes_in_use == 0));
    if (mode == Mode::expandable) {
      require(stats.bytes_mapped == stats.bytes_reserved);
      require(stats.bytes_mapped <= stats.bytes_limit);
      require(stats.granules_free * static_cast<std::int64_t>(2 * MiB) <= stats.bytes_mapped - stats.bytes_in_use);
      require(static_cast<std::size_t>(stats.bytes_mapped) == (*device)->mem_info().total_bytes -
                                                                 (*device)->mem_info().free_bytes);
    }
  }

  for (const auto& [address, block] : live) {
    check_marks(reinterpret_cast<void*>(address), block);
    require(allocator.deallocate(reinterpret_cast<void*>(address)).has_value());
  }
  require(allocator.stats().bytes_in_use == 0);
  allocator.trim();
  // trim() hands back every fully free region, a preallocated one included
  // (the pool grows again if asked): the device is back where it started.
  require((*device)->mem_info().free_bytes == device_free_at_start);
  return 0;
}
