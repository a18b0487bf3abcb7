"""tidepool: GPU device memory allocation from Python.

    import tidepool
    with tidepool.Allocator(mode="growth", device="host", capacity="16GiB") as pool:
        address = pool.allocate(1 << 20)
        pool.free(address)
        pool.memory_stats()["peak_bytes_in_use"]   # JAX's Device.memory_stats() keys
        print(pool.memory_summary())

    tidepool.replay("train-step", modes=["growth", "platform"])  # the replay table as dicts
    tidepool.ledger()                                             # the cross-process ledger

    pool = tidepool.Allocator(mode="expandable", device="host")
    with pool.tag("weights"):
        weights = pool.allocate("1GiB")
    pool.sleep("weights", keep="contents")   # its memory back to the device; addresses kept
    pool.wake("weights")                      # the same addresses, the same bytes (docs/sleep.md)

tidepool.torch.use() makes PyTorch allocate through tidepool. docs/interop.md.
"""
from ._tidepool import (  # noqa: F401
    Allocator,
    CorruptDataError,
    DeviceError,
    DoubleFreeError,
    Error,
    InvalidArgumentError,
    InvalidPointerError,
    IOError,
    LimitReachedError,
    OutOfMemoryError,
    TagScope,
    UnsupportedError,
    __version__,
    ledger,
    replay,
    setting_keys,
)
