"""What the Python tests share: JAX's memory_stats() keys, a host-device allocator and a
ledger segment of a test's own."""

import itertools
import os

import pytest

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


_segments = itertools.count()


@pytest.fixture
def ledger_segment():
    """A ledger segment name of this test's own (TIDEPOOL_LEDGER_NAME), removed after it."""
    name = f"/tidepool-pytest-{os.getpid()}-{next(_segments)}"
    yield name
    try:
        os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass
