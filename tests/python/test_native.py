"""The package as Python users expect it: a context manager, a repr, type
stubs, Python's own exceptions, JAX's memory_stats() keys, a summary table,
resettable peaks, and build requirements that pip can satisfy by itself."""
import ast
import errno
import os
import sys

import pytest

import tidepool
from support import JAX_MEMORY_STATS_KEYS, host

MiB = 1 << 20
GiB = 1 << 30
PACKAGE_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "bindings", "python")

def test_with_block_closes_the_allocator():
    with host(mode="growth") as pool:
        assert isinstance(pool, tidepool.Allocator)
        address = pool.allocate(MiB)
        assert address != 0
    with pytest.raises(tidepool.Error, match="closed"):
        pool.allocate(16)
    # An exception in the block goes on, and the allocator is closed.
    with pytest.raises(KeyError):
        with host() as failing:
            raise KeyError("from the block")
    assert "closed" in repr(failing)


def test_repr_names_mode_device_and_bytes():
    pool = host(mode="growth")
    address = pool.allocate(MiB)
    text = repr(pool)
    assert text.startswith("tidepool.Allocator(mode='growth'")
    assert "device='host" in text
    assert f"bytes_in_use={pool.memory_stats()['bytes_in_use']}" in text
    assert "bytes_reserved=" in text
    pool.free(address)
    pool.close()
    assert repr(pool) == "tidepool.Allocator(closed)"


def test_negative_size_is_a_value_error():
    pool = host()
    with pytest.raises(ValueError, match="bytes=-1: must not be negative"):
        pool.allocate(-1)
    with pytest.raises(tidepool.InvalidArgumentError):
        pool.allocate(-(1 << 70))
    assert pool.allocate("1MiB") != 0  # a size as text, as every other size argument takes
    assert pool.memory_stats()["num_allocs"] == 1


def test_missing_trace_is_file_not_found():
    missing = os.path.join(os.path.dirname(__file__), "no-such-trace.pickle")
    with pytest.raises(FileNotFoundError) as raised:
        tidepool.replay(missing)
    assert raised.value.errno == errno.ENOENT
    assert raised.value.filename == missing
    # A word that is no workload is still a bad argument, listing the workloads.
    with pytest.raises(tidepool.InvalidArgumentError, match="neither a trace file nor a built-in workload"):
        tidepool.replay("no-such-workload")


def test_memory_stats_has_every_jax_key():
    pool = host(mode="growth", mem_fraction=0.5)
    stats = pool.memory_stats()
    assert set(JAX_MEMORY_STATS_KEYS) <= set(stats)
    assert all(isinstance(stats[key], int) for key in JAX_MEMORY_STATS_KEYS)
    # The most the pool can hold from the device: its limit.
    assert stats["bytes_reservable_limit"] == stats["bytes_limit"] == 512 * MiB
    keys = list(stats)
    assert keys.index("bytes_reservable_limit") == keys.index("peak_bytes_reserved") + 1  # XLA's order
    row = tidepool.replay("small-tensors", modes=["growth"], capacity="16GiB")[0]
    assert row["stats"]["bytes_reservable_limit"] == row["stats"]["bytes_limit"]


def test_memory_summary_is_a_table_of_the_stats():
    pool = host(mode="growth")
    address = pool.allocate(4 * MiB)
    summary = pool.memory_summary()
    lines = summary.splitlines()
    assert "growth pool on host" in lines[1]
    in_use = next(line for line in lines if line.startswith(" In use"))
    assert in_use.count("4.00 MiB") == 2  # current and peak
    assert any(line.startswith(" Allocations (num_allocs)") and line.rstrip().endswith("1") for line in lines)
    assert any(line.startswith(" Limit (bytes_limit)") and "768 MiB" in line for line in lines)
    pool.free(address)
    assert "0 B" in next(line for line in pool.memory_summary().splitlines() if line.startswith(" In use"))


def test_reset_peak_memory_stats():
    pool = host(mode="expandable")
    big = pool.allocate(64 * MiB)
    pool.free(big)
    pool.trim()
    before = pool.memory_stats()
    assert before["peak_bytes_in_use"] >= 64 * MiB
    pool.reset_peak_memory_stats()
    after = pool.memory_stats()
    assert after["peak_bytes_in_use"] == after["bytes_in_use"] == 0
    assert after["peak_bytes_reserved"] == after["bytes_reserved"]
    small = pool.allocate(MiB)
    stats = pool.memory_stats()
    assert MiB <= stats["peak_bytes_in_use"] < 64 * MiB
    pool.free(small)
    assert pool.memory_stats()["peak_bytes_in_use"] == stats["peak_bytes_in_use"]  # a peak stays
    assert pool.memory_stats()["num_allocs"] == 2  # counters other than peaks go on


def stub_tree():
    path = os.path.join(os.path.dirname(tidepool.__file__), "_tidepool.pyi")
    with open(path) as stub:
        return ast.parse(stub.read())


def test_package_is_typed_and_the_stubs_match_the_module():
    package = os.path.dirname(tidepool.__file__)
    assert os.path.isfile(os.path.join(package, "py.typed"))
    tree = stub_tree()
    declared = set()
    classes = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
        if isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
    module = tidepool._tidepool
    public = {name for name in dir(module) if not name.startswith("_")} | {"__version__"}
    assert public <= declared, f"not in _tidepool.pyi: {sorted(public - declared)}"
    assert {name for name in declared if hasattr(module, name)} >= public
    # Allocator's methods and properties, both ways.
    stub_members = {node.name for node in classes["Allocator"].body if isinstance(node, ast.FunctionDef)}
    real_members = {name for name in vars(tidepool.Allocator) if not name.startswith("_")}
    real_members |= {"__init__", "__enter__", "__exit__"}
    assert stub_members == real_members
    # The keywords the stub declares are exactly the settings the constructor takes.
    init = next(node for node in classes["Allocator"].body
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    assert {arg.arg for arg in init.args.kwonlyargs} == set(tidepool.setting_keys())
    # TagScope is a context manager, both ways.
    assert {node.name for node in classes["TagScope"].body if isinstance(node, ast.FunctionDef)} == {
        "__enter__", "__exit__"} <= set(vars(tidepool.TagScope))
    # Every exception class in the stub has the module's bases.
    for name, node in classes.items():
        if name in ("Allocator", "TagScope"):
            continue
        real = getattr(module, name)
        stub_bases = [base.id for base in node.bases]
        assert [base.__name__ for base in real.__bases__] == stub_bases, name


def read_build_requires():
    path = os.path.join(PACKAGE_SOURCE, "pyproject.toml")
    if sys.version_info >= (3, 11):
        import tomllib
        with open(path, "rb") as toml:
            return tomllib.load(toml)["build-system"]["requires"]
    tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as toml:
        return tomllib.load(toml)["build-system"]["requires"]


def test_build_requires_everything_pip_must_bring():
    """pip install ./bindings/python must work where Debian's pybind11-dev is
    absent: every Python package the CMake build looks for is a build requirement."""
    requires = read_build_requires()
    names = {requirement.split(">")[0].split("=")[0].split("<")[0].strip().lower() for requirement in requires}
    assert {"scikit-build-core", "pybind11"} <= names
    with open(os.path.join(PACKAGE_SOURCE, "..", "CMakeLists.txt")) as cmake:
        text = cmake.read()
    # The Python packages bindings/CMakeLists.txt finds: each must be required.
    assert "find_package(pybind11 CONFIG" in text
    for package in ("pybind11",):
        assert package in names
