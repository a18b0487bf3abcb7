"""What the Python tests share: JAX's memory_stats() keys and a host-device allocator."""

import tidepool

# Every key of JAX's Device.memory_stats() on GPU (XLA's AllocatorStats, as
# PJRT_Device_MemoryStats_Args lists them).
JAX_MEMORY_STATS_KEYS = [
    "num_allocs", "bytes_in_use", "peak_bytes_in_use", "largest_alloc_size", "bytes_limit",
    "bytes_reserved", "peak_bytes_reserved", "bytes_reservable_limit", "largest_free_block_bytes",
    "pool_bytes", "peak_pool_bytes",
]


def host(**settings):
    """An Allocator on a 1 GiB host device unless the settings say otherwise."""
    settings.setdefault("device", "host")
    settings.setdefault("capacity", "1GiB")
    return tidepool.Allocator(**settings)
