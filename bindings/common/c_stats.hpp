// tidepool::Stats into tidepool.h's C struct: the C ABI and the PyTorch
// library both report stats this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tidepool/allocator.hpp"
#include "tidepool/tidepool.h"

namespace tidepool::bindings {

/// Writes `stats` into *out, of `out_size` bytes as the caller was compiled:
/// fields beyond it are not written, fields beyond the library's are zeroed.
/// Returns false when the struct lacks counters Stats has (a library bug:
/// new counters go at the struct's end).
inline bool copy_stats(const Stats& s, tidepool_stats* out, std::size_t out_size) {
  const tidepool_stats full{s.bytes_in_use,       s.peak_bytes_in_use,  s.num_allocs,
                            s.largest_alloc_size, s.bytes_limit,        s.bytes_reserved,
                            s.peak_bytes_reserved, s.largest_free_block_bytes,
                            s.pool_bytes,         s.peak_pool_bytes,    s.num_device_allocs,
                            s.num_device_frees,   s.num_ooms,           s.bytes_mapped,
                            s.granules_free,      s.num_maps,           s.num_unmaps,
                            s.num_stitches,       s.num_releases,       s.bytes_asleep};
  if (s.items().size() != sizeof(tidepool_stats) / sizeof(std::int64_t)) return false;
  std::memset(out, 0, out_size);
  std::memcpy(out, &full, out_size < sizeof full ? out_size : sizeof full);
  return true;
}

}  // namespace tidepool::bindings
