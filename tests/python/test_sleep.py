"""Tags, sleep and wake from Python: bytes and addresses kept, the errors, the
stats, and two processes taking turns on one host device through the ledger."""

import ctypes
import os
import subprocess
import sys
import textwrap
import time

import pytest

import tidepool
from support import host, ledger_segment  # noqa: F401 (a fixture)

MiB = 1 << 20


def fill(address, size, seed):
    data = bytes((i * 7 + seed) & 0xFF for i in range(256)) * (size // 256)
    ctypes.memmove(address, data, len(data))
    return data


def test_sleep_and_wake_keep_every_byte_and_address():
    pool = host(mode="expandable")
    with pool.tag("weights"):
        blocks = [(pool.allocate(size), size) for size in (4096, 3 * MiB, 700 * 1024, 9 * MiB)]
    plain = pool.allocate(MiB)
    expected = [fill(address, size, seed) for seed, (address, size) in enumerate(blocks)]

    pool.sleep("weights", keep="contents")
    stats = pool.memory_stats()
    tags = pool.tag_stats()
    assert tags["weights"]["asleep"] is True
    assert tags["weights"]["bytes_asleep"] > 0
    assert stats["bytes_asleep"] == tags["weights"]["bytes_asleep"]
    assert "Asleep (bytes_asleep)" in pool.memory_summary()
    ctypes.memset(plain, 1, MiB)  # untagged memory stays usable

    pool.wake("weights")
    for (address, size), data in zip(blocks, expected):
        assert ctypes.string_at(address, len(data)) == data
    assert pool.tag_stats()["weights"] == {"asleep": False, "bytes_in_use": tags["weights"]["bytes_in_use"],
                                           "bytes_asleep": 0, "host_bytes": tags["weights"]["host_bytes"],
                                           "sleeps": 1, "wakes": 1}
    assert pool.memory_stats()["bytes_asleep"] == 0
    for address, _ in blocks:
        pool.free(address)


def test_keep_nothing_and_the_errors():
    pool = host(mode="expandable")
    with pool.tag("kv"):
        address = pool.allocate(2 * MiB)
    with pytest.raises(tidepool.InvalidArgumentError, match=r"no tag of that name \(tags: 'kv'\)"):
        pool.sleep("never")
    with pytest.raises(tidepool.InvalidArgumentError, match="the tag is awake"):
        pool.wake("kv")
    with pytest.raises(tidepool.InvalidArgumentError, match="keep='bogus'"):
        pool.sleep("kv", keep="bogus")
    pool.sleep("kv", keep="nothing")
    assert pool.tag_stats()["kv"]["host_bytes"] == 0
    with pytest.raises(tidepool.InvalidArgumentError, match="the tag is asleep"):
        pool.sleep("kv")
    with pytest.raises(tidepool.InvalidArgumentError, match="the tag is asleep; wake it first"):
        with pool.tag("kv"):
            pool.allocate(MiB)
    pool.wake("kv")
    fill(address, 2 * MiB, 3)  # writable again at the same address
    pool.free(address)


def test_other_modes_say_what_is_needed():
    pool = host(mode="growth")
    with pytest.raises(tidepool.UnsupportedError, match="need mode='expandable'"):
        with pool.tag("weights"):
            pass


HOLDER = textwrap.dedent("""
    import sys, tidepool
    pool = tidepool.Allocator.from_env()
    address = pool.allocate(48 << 20)   # held, in use: nothing to trim
    print("ready", flush=True)
    sys.stdin.readline()
""")


def asleep_beside_a_holder(pool):
    """Puts 32 MiB tagged "model" to sleep, then starts HOLDER, which takes
    48 MiB of the 64 MiB device and holds it in use; returns it, ready."""
    with pool.tag("model"):
        pool.allocate(32 * MiB)
    pool.sleep("model")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    said = holder.stdout.readline().strip()
    if said != "ready":  # not left running when the assertion fails
        holder.kill()
        holder.wait(timeout=30)
    assert said == "ready"
    return holder


def shared_host(monkeypatch, segment, **extra):
    settings = {"TIDEPOOL_ALLOCATOR": "expandable", "TIDEPOOL_DEVICE": "host", "TIDEPOOL_HOST_CAPACITY": "64MiB",
                "TIDEPOOL_MEM_FRACTION": "1", "TIDEPOOL_LEDGER": "true", "TIDEPOOL_LEDGER_NAME": segment, **extra}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)


def test_a_wake_fails_within_tidepool_wake_wait(monkeypatch, ledger_segment):
    segment = ledger_segment
    shared_host(monkeypatch, segment, TIDEPOOL_WAKE_WAIT="300ms")
    pool = tidepool.Allocator.from_env()
    holder = None
    try:
        holder = asleep_beside_a_holder(pool)
        started = time.monotonic()
        with pytest.raises(tidepool.OutOfMemoryError, match=r"wake\('model'\).*waiting for the other processes") as refused:
            pool.wake("model")
        waited = time.monotonic() - started
        assert 0.3 <= waited < 5, waited  # the variable's bound, not the 10 s default
        assert f"pid {holder.pid}" in str(refused.value)
        assert pool.tag_stats()["model"]["asleep"] is True
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=30)
        pool.close()


A_TURN = textwrap.dedent("""
    import sys, tidepool
    pool = tidepool.Allocator.from_env()
    address = pool.allocate(30 << 20)   # only possible while the other process sleeps (40 + 30 > 64)
    pool.free(address)                  # kept cached: the other's wake asks for a trim
    print("ready", flush=True)
    sys.stdin.readline()
""")


def test_two_processes_take_turns_through_the_ledger(monkeypatch, ledger_segment):
    segment = ledger_segment
    shared_host(monkeypatch, segment, TIDEPOOL_MEM_FRACTION="0.75")  # the default fraction
    pool = tidepool.Allocator.from_env()
    other = None
    try:
        with pool.tag("model"):
            model = pool.allocate(40 * MiB)
        data = os.urandom(40 * MiB)
        ctypes.memmove(model, data, len(data))
        pool.sleep("model")
        mine = [e for e in tidepool.ledger(segment)["entries"] if e["pid"] == os.getpid()][0]
        assert mine["asleep_bytes"] == 40 * MiB
        assert mine["reserved_bytes"] == 0

        other = subprocess.Popen([sys.executable, "-c", A_TURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        assert other.stdout.readline().strip() == "ready"
        pool.wake("model")
        assert ctypes.string_at(model, len(data)) == data
        # The wake proceeds once the room is there, which may be before the other
        # process's trim has counted what it gave.
        deadline = time.monotonic() + 10
        while True:
            entries = {e["pid"]: e for e in tidepool.ledger(segment)["entries"]}
            if entries[other.pid]["trims_answered"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        assert entries[os.getpid()]["wake_waits"] == 1
        assert entries[os.getpid()]["asleep_bytes"] == 0
        assert entries[other.pid]["bytes_trimmed"] > 0
    finally:
        if other is not None:
            other.stdin.close()
            other.wait(timeout=30)
        pool.close()


def test_a_child_forked_while_a_thread_waits_in_a_call_closes_at_once(monkeypatch, ledger_segment):
    """A thread of the parent waits inside wake() (for the holder to trim, the
    GIL released) when the process forks: the child's copy of the allocator's
    lock is held by a thread the child does not have. close() in the child
    returns at once, and the parent's wait ends as it would have."""
    import threading

    segment = ledger_segment
    shared_host(monkeypatch, segment, TIDEPOOL_WAKE_WAIT="3s")
    pool = tidepool.Allocator.from_env()
    holder = None
    waiter = None
    try:
        holder = asleep_beside_a_holder(pool)
        outcome = []

        def wake():
            try:
                pool.wake("model")
                outcome.append("woken")
            except tidepool.OutOfMemoryError:
                outcome.append("refused")

        waiter = threading.Thread(target=wake)
        waiter.start()
        time.sleep(0.5)  # well inside the 3 s wait
        child = os.fork()
        if child == 0:
            status = 0
            try:
                pool.close()
            except BaseException:  # noqa: BLE001 (reported by the status)
                status = 10
            os._exit(status)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(child, os.WNOHANG)
            if done == child:
                break
            if time.monotonic() > deadline:
                os.kill(child, 9)
                os.waitpid(child, 0)
                pytest.fail("the forked child hung in close()")
            time.sleep(0.01)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        waiter.join(timeout=30)
        assert outcome == ["refused"]  # the holder kept its memory for the whole wait
    finally:
        if waiter is not None:
            waiter.join(timeout=30)
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=30)
        pool.close()
