"""libtidepool_torch.so without PyTorch: its entry points through ctypes.
On a machine with no usable GPU the allocation fails with the reason, never a
crash; with one it allocates and the stats follow (scripts/gpu/torch_check.py
runs PyTorch itself on a GPU)."""
import ctypes

import pytest

import tidepool
import tidepool.torch as tidepool_torch


def test_stat_names_follow_the_struct_and_memory_stats():
    pool = tidepool.Allocator(device="host", capacity="64MiB")
    # memory_stats() adds JAX's bytes_reservable_limit, derived, after peak_bytes_reserved.
    names = list(tidepool_torch._STAT_NAMES)
    names.insert(names.index("peak_bytes_reserved") + 1, "bytes_reservable_limit")
    assert tuple(names) == tuple(pool.memory_stats())
    assert ctypes.sizeof(tidepool_torch._Stats) == 8 * len(tidepool_torch._STAT_NAMES)


def test_memory_stats_needs_use():
    with pytest.raises(RuntimeError, match="use"):
        tidepool_torch.memory_stats()


def library():
    try:
        path = tidepool_torch.library_path()
    except FileNotFoundError:
        pytest.skip("this build has no CUDA toolkit, so no libtidepool_torch.so")
    lib = ctypes.CDLL(path)
    lib.tidepool_torch_alloc.restype = ctypes.c_void_p
    lib.tidepool_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.tidepool_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.tidepool_torch_last_error.restype = ctypes.c_char_p
    lib.tidepool_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(tidepool_torch._Stats), ctypes.c_size_t]
    return lib


def test_alloc_and_free_or_the_reason(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    lib = library()
    assert lib.tidepool_torch_alloc(-1, 0, None) is None
    assert "negative" in lib.tidepool_torch_last_error().decode()
    pointer = lib.tidepool_torch_alloc(1 << 20, 0, None)
    stats = tidepool_torch._Stats()
    if pointer is None:  # no GPU here: the reason, and no pool
        assert "CUDA" in lib.tidepool_torch_last_error().decode() or "cuda" in lib.tidepool_torch_last_error().decode()
        assert lib.tidepool_torch_get_stats(0, ctypes.byref(stats), ctypes.sizeof(stats)) == -1
        return
    assert lib.tidepool_torch_get_stats(0, ctypes.byref(stats), ctypes.sizeof(stats)) == 0
    assert stats.bytes_in_use >= 1 << 20 and stats.num_allocs == 1
    lib.tidepool_torch_free(pointer, 1 << 20, 0, None)
    assert lib.tidepool_torch_get_stats(0, ctypes.byref(stats), ctypes.sizeof(stats)) == 0
    assert stats.bytes_in_use == 0
    lib.tidepool_torch_free(pointer, 1 << 20, 0, None)  # a double free is reported, not a crash
    assert "free" in lib.tidepool_torch_last_error().decode()
