"""PyTorch allocates through tidepool: tidepool.torch.use() before the first CUDA tensor.

    import tidepool.torch
    tidepool.torch.use()          # configured by XLA_PYTHON_CLIENT_* / TIDEPOOL_* as any tidepool process
    x = torch.empty(1 << 20, device="cuda")
    tidepool.torch.memory_stats()  # JAX's names: bytes_in_use, peak_bytes_in_use, ...

    # With TIDEPOOL_ALLOCATOR=expandable: tensors made in a tag can sleep (docs/sleep.md).
    with tidepool.torch.tag("weights"):
        w = torch.randn(4096, 4096, device="cuda")
    tidepool.torch.sleep("weights")   # memory back to the GPU (and other processes); w's address kept
    tidepool.torch.wake("weights")    # w holds the same values again

PyTorch's own torch.cuda.memory_stats() does not work with a pluggable allocator;
tidepool.torch.memory_stats() reports the pool instead. Needs libtidepool_torch.so,
built when CMake finds the CUDA toolkit.
"""
import contextlib
import ctypes
import os

_LIBRARY_NAME = "libtidepool_torch.so"
_STAT_NAMES = (
    "bytes_in_use", "peak_bytes_in_use", "num_allocs", "largest_alloc_size", "bytes_limit",
    "bytes_reserved", "peak_bytes_reserved", "largest_free_block_bytes", "pool_bytes",
    "peak_pool_bytes", "num_device_allocs", "num_device_frees", "num_ooms", "bytes_mapped",
    "granules_free", "num_maps", "num_unmaps", "num_stitches", "num_releases",
    "bytes_asleep",
)  # tidepool_stats in tidepool.h, in order

_installed = None  # (path, ctypes library) once use() has run


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in _STAT_NAMES]


def library_path():
    """Where libtidepool_torch.so is: beside this package (build tree or install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, _LIBRARY_NAME),
                      os.path.join(here, "..", "..", _LIBRARY_NAME)):
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    raise FileNotFoundError(
        f"{_LIBRARY_NAME} was not found beside {here}: tidepool was built without the CUDA toolkit, "
        "or the library was not installed with the package")


def use(path=None):
    """Makes tidepool PyTorch's CUDA allocator (CUDAPluggableAllocator +
    change_current_allocator). Call before any CUDA memory is allocated: PyTorch
    refuses to change an allocator it has used. Returns the library's path."""
    global _installed
    import torch  # only here: `import tidepool` must not need torch

    path = path or library_path()
    if _installed is not None:
        if _installed[0] != path:
            raise RuntimeError(f"tidepool.torch.use() already installed {_installed[0]}")
        return path
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "tidepool_torch_alloc", "tidepool_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    _installed = (path, ctypes.CDLL(path))
    return path


def memory_stats(device=0):
    """The pool's counters on `device` (JAX's names); {} before the first allocation there."""
    if _installed is None:
        raise RuntimeError("tidepool.torch.use() has not been called")
    library = _installed[1]
    library.tidepool_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats), ctypes.c_size_t]
    stats = _Stats()
    if library.tidepool_torch_get_stats(device, ctypes.byref(stats), ctypes.sizeof(stats)) != 0:
        return {}
    out = {}
    for name in _STAT_NAMES:
        out[name] = getattr(stats, name)
        if name == "peak_bytes_reserved":
            # JAX's key, as Allocator.memory_stats() has it: a pool never holds more than its limit.
            out["bytes_reservable_limit"] = stats.bytes_limit
    return out


def last_error():
    """The last error message of tidepool_torch_alloc/free on this thread."""
    if _installed is None:
        return ""
    library = _installed[1]
    library.tidepool_torch_last_error.restype = ctypes.c_char_p
    return library.tidepool_torch_last_error().decode()


# tidepool.h's status codes, as the builtin exceptions tidepool's own classes
# derive from (this module must work without the extension module).
_RAISES = {1: MemoryError, 2: ValueError, 3: ValueError, 4: ValueError, 5: NotImplementedError}


def _tags_call(function, *args):
    if _installed is None:
        raise RuntimeError("tidepool.torch.use() has not been called")
    library = _installed[1]
    library.tidepool_torch_last_error.restype = ctypes.c_char_p
    status = getattr(library, function)(*args)
    if status != 0:
        raise _RAISES.get(status, RuntimeError)(library.tidepool_torch_last_error().decode())


@contextlib.contextmanager
def tag(name, device=0):
    """Tensors this thread allocates on `device` inside the with-block carry the tag
    (needs TIDEPOOL_ALLOCATOR=expandable)."""
    _tags_call("tidepool_torch_tag_begin", ctypes.c_int(device), name.encode())
    try:
        yield
    finally:
        _tags_call("tidepool_torch_tag_end", ctypes.c_int(device))


def sleep(tag, keep="contents", device=0):
    """Gives the GPU memory under the tag's tensors back (to other processes too, through the
    ledger). keep="contents" copies their bytes to pinned host memory first; "nothing" discards
    them. The tensors keep their addresses; do not touch them until wake()."""
    if keep not in ("contents", "nothing"):
        raise ValueError(f"keep={keep!r}: allowed: 'contents' or 'nothing'")
    torch_module = __import__("torch")
    torch_module.cuda.synchronize(device)
    _tags_call("tidepool_torch_sleep", ctypes.c_int(device), tag.encode(), ctypes.c_int(0 if keep == "contents" else 1))


def wake(tag, device=0):
    """Takes GPU memory for the tag again at the same addresses, restoring the bytes kept.
    MemoryError (naming who holds the GPU) leaves it asleep."""
    _tags_call("tidepool_torch_wake", ctypes.c_int(device), tag.encode())
