"""The Python package: Allocator, memory_stats with JAX's names, errors as
exceptions with tidepool's messages, replay rows, and the ledger."""
import json
import os
import subprocess
import threading

import pytest

import tidepool
from support import JAX_MEMORY_STATS_KEYS, host, ledger_segment  # noqa: F401 (a fixture)

GiB = 1 << 30
MiB = 1 << 20


def test_allocate_free_and_stats():
    pool = host(mode="growth")
    a = pool.allocate(1000)
    b = pool.allocate(MiB, stream=3)
    assert isinstance(a, int) and a != 0 and a % 256 == 0
    assert a + 1000 <= b or b + MiB <= a  # live blocks do not overlap
    stats = pool.memory_stats()
    assert set(JAX_MEMORY_STATS_KEYS) <= set(stats)
    assert stats["num_allocs"] == 2
    assert stats["bytes_in_use"] >= 1000 + MiB
    assert stats["largest_alloc_size"] >= MiB
    assert stats["bytes_limit"] == int(0.75 * GiB)  # JAX's default fraction of the device
    pool.free(a)
    pool.free(b, stream=3)
    pool.free(0)
    assert pool.memory_stats()["bytes_in_use"] == 0
    assert pool.memory_stats()["peak_bytes_in_use"] >= 1000 + MiB
    assert pool.allocate(0) == 0


def test_settings_types_and_modes():
    pool = host(mode="preallocate", mem_fraction=0.5, capacity=512 * MiB)
    stats = pool.memory_stats()
    assert stats["bytes_limit"] == 256 * MiB
    assert stats["bytes_reserved"] == 256 * MiB  # preallocated up front
    assert host(mode="bfc", preallocate=False).memory_stats()["bytes_reserved"] == 0
    assert host(mode="platform").name != host(mode="growth").name
    assert "host" in pool.device
    assert tidepool.setting_keys()["mode"] == "TIDEPOOL_ALLOCATOR"


def test_bad_settings_raise_with_the_message():
    with pytest.raises(tidepool.InvalidArgumentError, match="mode='sideways' is invalid"):
        host(mode="sideways")
    with pytest.raises(ValueError, match="capacity='lots'"):  # also a ValueError
        host(capacity="lots")
    with pytest.raises(tidepool.Error, match="unknown setting 'colour'") as raised:
        host(colour="blue")
    assert raised.value.code == "invalid_argument"
    with pytest.raises(tidepool.InvalidArgumentError, match="expected a str, int, float or bool"):
        host(capacity=[1])


def test_idle_release_hands_the_cache_back():
    import time
    pool = host(mode="expandable", idle_release="10ms")
    pool.free(pool.allocate(100 * MiB))
    give_up = time.monotonic() + 20
    while pool.memory_stats()["bytes_reserved"] != 0 and time.monotonic() < give_up:
        time.sleep(0.005)
    assert pool.memory_stats()["bytes_reserved"] == 0
    assert tidepool.setting_keys()["idle_release"] == "TIDEPOOL_IDLE_RELEASE"
    with pytest.raises(tidepool.InvalidArgumentError, match="idle_release='soon' is invalid"):
        host(mode="expandable", idle_release="soon")


def test_aliases_is_a_key():
    pool = host(mode="expandable", aliases=True)
    pool.free(pool.allocate(100 * MiB))
    assert "granules mapped also where they were stolen from" in pool.dump()
    assert tidepool.setting_keys()["aliases"] == "TIDEPOOL_ALIASES"
    with pytest.raises(tidepool.InvalidArgumentError, match="aliases='sometimes' is invalid"):
        host(mode="expandable", aliases="sometimes")


def test_pointer_errors():
    pool = host(mode="growth")
    address = pool.allocate(4096)
    pool.free(address)
    with pytest.raises(tidepool.DoubleFreeError) as raised:
        pool.free(address)
    assert raised.value.code == "double_free"
    assert hex(address)[2:] in str(raised.value).lower()  # the message names the pointer
    with pytest.raises(tidepool.InvalidPointerError):
        pool.free(address + 64)
    other = host(mode="platform")
    theirs = other.allocate(512)
    with pytest.raises(tidepool.InvalidPointerError):
        pool.free(theirs)
    other.free(theirs)
    # The allocator is unchanged by the refused frees.
    assert pool.memory_stats()["bytes_in_use"] == 0


def test_out_of_memory():
    pool = host(mode="growth", capacity="256MiB")
    with pytest.raises(tidepool.OutOfMemoryError) as raised:
        pool.allocate(GiB)
    assert isinstance(raised.value, MemoryError)
    assert str(raised.value)  # carries the pool's report
    # Its hint names the keyword this caller has, not an environment variable.
    assert "raise mem_fraction" in str(raised.value)
    assert "TIDEPOOL_" not in str(raised.value)
    assert pool.memory_stats()["num_ooms"] == 1
    pool.free(pool.allocate(MiB))  # still works


def test_close():
    pool = host()
    pool.close()
    with pytest.raises(tidepool.Error, match="closed"):
        pool.allocate(16)


@pytest.mark.parametrize("mode", ["expandable", "growth", "platform"])
def test_a_forked_child_is_refused_and_leaves_the_parents_memory_alone(mode):
    """The host device's memory is shared with a forked child (a memfd): a
    child that allocated from, or released, the parent's pool would change the
    parent's blocks. It raises UnsupportedError instead, as CUDA refuses a
    forked child, and its frees and close leave the parent's memory alone."""
    import ctypes

    pool = host(mode=mode)
    kept = pool.allocate(4 * MiB)
    ctypes.memset(kept, 0x5A, 4 * MiB)
    cached = pool.allocate(4 * MiB)
    pool.free(cached)
    child = os.fork()
    if child == 0:  # no pytest here: an exit status says what went wrong
        status = 0
        try:
            try:
                pool.allocate(MiB)
                status = 10
            except tidepool.UnsupportedError as error:
                if "forked" not in str(error):
                    status = 11
            pool.free(kept)
            pool.close()
        except BaseException:  # noqa: BLE001 (reported by the status)
            status = 12
        os._exit(status)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert ctypes.string_at(kept, 4 * MiB) == b"\x5a" * (4 * MiB)
    again = pool.allocate(4 * MiB)
    ctypes.memset(again, 0x11, 4 * MiB)
    assert ctypes.string_at(kept, 4 * MiB) == b"\x5a" * (4 * MiB)
    pool.free(again)
    pool.free(kept)
    pool.close()


@pytest.mark.parametrize("mode", ["growth", "preallocate"])
def test_trim_and_grow_again_many_times(mode):
    # Each trim gives the region back and the next allocate grows the pool
    # again. The close test's threads do this in a loop: after about 40
    # rounds the BFC region size doubled past 2**64 to 0 and allocate()
    # spun forever holding the pool's lock (the hang in that test).
    pool = host(mode=mode)
    for _ in range(100):
        pool.free(pool.allocate(4096))
        assert pool.trim() > 0
    stats = pool.memory_stats()
    assert stats["num_device_allocs"] == 100
    assert stats["bytes_reserved"] == 0


@pytest.mark.parametrize("mode", ["growth", "expandable", "preallocate", "platform"])
def test_close_while_eight_threads_allocate(mode):
    # Before issue 14, close() destroyed the stack under calls that had
    # released the GIL: a segfault in every mode.
    for _ in range(5):
        pool = host(mode=mode)
        started = threading.Barrier(9)
        unexpected = []

        def work():
            started.wait()
            try:
                while True:
                    pool.free(pool.allocate(4096))
                    pool.trim()
            except tidepool.InvalidArgumentError as error:
                if "closed" not in str(error):
                    unexpected.append(error)
            except Exception as error:  # pragma: no cover - reported below
                unexpected.append(error)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        started.wait()
        pool.close()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert not unexpected
        with pytest.raises(tidepool.InvalidArgumentError, match="closed"):
            pool.memory_stats()


def test_threads_share_one_allocator():
    pool = host(mode="growth")
    errors = []

    def work(stream):
        try:
            for size in range(1, 200):
                pool.free(pool.allocate(size * 256, stream=stream), stream=stream)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = pool.memory_stats()
    assert stats["num_allocs"] == 4 * 199 and stats["bytes_in_use"] == 0


def test_from_env(monkeypatch):
    monkeypatch.setenv("TIDEPOOL_DEVICE", "host")
    monkeypatch.setenv("TIDEPOOL_HOST_CAPACITY", "2GiB")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.5")
    stats = tidepool.Allocator.from_env().memory_stats()
    assert stats["bytes_limit"] == GiB and stats["bytes_reserved"] == 0
    monkeypatch.setenv("TIDEPOOL_ALLOCATOR", "nonsense")
    with pytest.raises(tidepool.InvalidArgumentError, match="TIDEPOOL_ALLOCATOR='nonsense'"):
        tidepool.Allocator.from_env()
    host()  # keywords do not read the environment


def test_replay_workload_rows():
    rows = tidepool.replay("small-tensors", modes=["growth", "platform"], capacity="16GiB")
    assert [row["mode"] for row in rows] == ["growth", "platform"]
    growth, platform = rows
    for row in rows:
        assert row["trace"] == "small-tensors"
        assert row["capacity_bytes"] == 16 * GiB
        assert row["events"] > 0
        assert row["peak_reserved_bytes"] >= row["peak_live_bytes"] > 0
        assert row["served_peak_live_bytes"] == row["peak_live_bytes"]
        assert row["seeded_blocks"] == 0 and row["seeded_bytes"] == 0  # a built-in workload starts empty
        assert row["min_limit_bytes"] is None
        assert row["ooms"] == 0 and row["first_oom"] is None
        assert set(JAX_MEMORY_STATS_KEYS) <= set(row["stats"])
        assert "series" not in row
        # The JSON report's mode object, from the same list: passes, probes, times.
        assert row["min_capacity_ratio"] is None and row["min_capacity_probes"] == 0
        assert row["replay_ns"] > 0 and row["ns_per_op"] > 0
        [only] = row["passes"]
        assert only["device_calls"] == row["device_calls"]
        assert only["peak_reserved_bytes"] == row["peak_reserved_bytes"] and only["ooms"] == 0
    # platform calls the device for every allocation; the pool caches.
    assert platform["device_calls"]["allocs"] > growth["device_calls"]["allocs"]
    assert platform["device_calls"]["allocs"] >= platform["stats"]["num_allocs"]
    with_series = tidepool.replay("small-tensors", modes=["growth"], capacity=16 * GiB, series=True)
    assert with_series[0]["series"] and "reserved_bytes" in with_series[0]["series"][0]


def test_replay_trace_file_has_the_recorded_row():
    path = os.path.join(os.environ.get("TRACE_DATA", os.path.join(os.path.dirname(__file__), "..", "data")),
                        "pytorch", "cs336-magma27.pickle")
    rows = tidepool.replay(path, modes=["growth"])
    assert rows[0]["mode"] == "growth"
    assert rows[-1]["mode"] == "PyTorch (recorded)"
    assert rows[-1]["peak_reserved_bytes"] > 0


def test_replay_errors():
    with pytest.raises(tidepool.InvalidArgumentError, match="neither a trace file nor a built-in workload"):
        tidepool.replay("no-such-workload")
    with pytest.raises(tidepool.InvalidArgumentError, match="unknown mode 'fastest'"):
        tidepool.replay("small-tensors", modes=["fastest"])
    with pytest.raises(tidepool.InvalidArgumentError, match="capacity"):
        tidepool.replay("small-tensors", capacity="huge")


def test_ledger_missing_segment():
    with pytest.raises(tidepool.IOError, match="tidepool-pytest-no-such-segment"):
        tidepool.ledger("/tidepool-pytest-no-such-segment")


def test_ledger_reads_the_configured_name_without_registering(monkeypatch, ledger_segment):
    name = ledger_segment
    monkeypatch.setenv("TIDEPOOL_DEVICE", "host")
    monkeypatch.setenv("TIDEPOOL_HOST_CAPACITY", "1GiB")
    monkeypatch.setenv("TIDEPOOL_LEDGER", "on")
    monkeypatch.setenv("TIDEPOOL_LEDGER_NAME", name)
    # Nobody uses it yet: reading it neither creates nor joins it.
    with pytest.raises(tidepool.IOError, match=name):
        tidepool.ledger()
    with tidepool.Allocator.from_env() as pool:  # joins the named ledger
        block = pool.allocate("4MiB")
        snapshot = tidepool.ledger()
        assert snapshot["segment_name"] == name
        assert [e["pid"] for e in snapshot["entries"]] == [os.getpid()]  # one entry: the pool's
        pool.free(block)


def test_ledger_with_a_quota_builds_the_device_but_registers_nothing(monkeypatch, ledger_segment):
    # The quota is resolved against the device (built without the ledger); the
    # named segment is only read, so it is still missing afterwards.
    monkeypatch.setenv("TIDEPOOL_DEVICE", "host")
    monkeypatch.setenv("TIDEPOOL_HOST_CAPACITY", "1GiB")
    monkeypatch.setenv("TIDEPOOL_QUOTA", "25%")
    monkeypatch.setenv("TIDEPOOL_LEDGER_NAME", ledger_segment)
    with pytest.raises(tidepool.IOError, match=ledger_segment):
        tidepool.ledger()
    assert not os.path.exists("/dev/shm" + ledger_segment)


def test_ledger_shows_a_running_process():
    cli, app = os.environ.get("CLI_PATH"), os.environ.get("PRELOAD_APP")
    if not cli or not app:
        pytest.skip("needs the tidepool command and tests/preload's program (CLI_PATH, PRELOAD_APP)")
    name = f"/tidepool-pytest-{os.getpid()}"
    fake_total = 16 * GiB  # tests/preload/fake_cuda.c's device
    process = subprocess.Popen([cli, "run", "--quota", "25%", "--ledger", name, "--", app, "--wait"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = {}
        for line in process.stdout:
            word, _, rest = line.strip().partition(" ")
            lines[word] = rest
            if word == "ready":
                break
        pid = int(lines["pid"])
        snapshot = tidepool.ledger(name)
        assert snapshot["segment_name"] == name
        assert snapshot["device_total_bytes"] == fake_total
        entry = next(e for e in snapshot["entries"] if e["pid"] == pid)
        quota = int(fake_total * 0.25)
        assert entry["alive"] and entry["quota_bytes"] == quota
        assert entry["reserved_bytes"] == quota // 4 * 3 + MiB  # 75% preallocated + 1 MiB held
        assert snapshot["committed_bytes"] >= quota
        # The command's JSON and this dict come from one list per type.
        command = json.loads(subprocess.run([cli, "ledger", "--json", "--device", name], check=True,
                                            stdout=subprocess.PIPE, text=True).stdout)
        assert set(command) <= set(snapshot)
        assert set(command["processes"][0]) == set(snapshot["processes"][0])
        assert set(command["totals"]) == set(snapshot["totals"])
        assert command["totals"]["processes"] == snapshot["totals"]["processes"] == 1
        process.stdin.write("go\n")
        process.stdin.close()
        assert process.wait(timeout=30) == 0
        assert all(e["pid"] != pid for e in tidepool.ledger(name)["entries"])
    finally:
        process.kill()
        process.wait()
        if os.path.exists("/dev/shm" + name):
            os.unlink("/dev/shm" + name)
