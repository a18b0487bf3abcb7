#!/usr/bin/env python3
"""`tidepool run --quota` around the frameworks on a GPU (scripts/gpu-check
runs it; first run on an H200 on 2026-12-04):

    scripts/gpu/quota_check.py CLI jax|torch|torch-expandable|cupy

jax: memory_stats()['bytes_limit'] follows the quota (75% of it by default);
     the ledger shows the process's entry with its quota while it runs; an
     allocation past the quota fails (the platform allocator, which asks the
     driver for each one, so that the interposer is what refuses); two JAX
     processes under 45% quotas both run where, without tidepool, two
     preallocating ones do not fit.
torch, torch-expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
     cuMemCreate): total_memory and mem_get_info's total are the quota, half of
     it can be allocated, more than the rest fails with OutOfMemoryError.
cupy: memGetInfo's total is the quota, half of it can be allocated, more than
     the rest fails with OutOfMemoryError.
Prints "ok"/"FAIL" per check and one JSON line of figures; exits 1 on a failure.
"""
import ctypes
import json
import os
import subprocess
import sys

QUOTA = "20%"
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def run_child(cli, code, quota=QUOTA, ledger=None, env=None, wait=False):
    """`tidepool run --quota` around `python3 -c code`; with wait, returns the
    running process once it printed "ready"."""
    command = [cli, "run", "--quota", quota]
    if ledger:
        command += ["--ledger", ledger]
    command += ["--", sys.executable, "-c", code]
    child_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    if not wait:
        return subprocess.run(command, capture_output=True, text=True, env=child_env, timeout=150)
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=child_env)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.strip() == "ready":
            break
    return process, lines


def figures(output):
    """The JSON line a child printed."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def device_total():
    """Device 0's size as the driver says it (cuDeviceTotalMem_v2), without tidepool."""
    cuda = ctypes.CDLL("libcuda.so.1")
    total = ctypes.c_size_t()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceTotalMem_v2(ctypes.byref(total), 0) != 0:
        raise SystemExit("FAIL the driver does not answer cuInit/cuDeviceTotalMem_v2")
    return total.value


def is_quota(seen, quota):
    """Whether a size reported under tidepool is the quota (tidepool resolves
    the percentage in long double; this is a double: a few bytes apart)."""
    return isinstance(seen, int) and abs(seen - quota) <= (1 << 20)


JAX_CHILD = """
import json, sys
import jax, jax.numpy as jnp
stats = jax.devices()[0].memory_stats()
x = jnp.ones((1 << 20,), jnp.float32).block_until_ready()
print(json.dumps({"bytes_limit": stats.get("bytes_limit", 0)}), flush=True)
print("ready", flush=True)
sys.stdin.readline()
"""

JAX_PAST_QUOTA = """
import json
import jax, jax.numpy as jnp
quota = int(QUOTA_BYTES)
try:
    big = jnp.ones((quota // 4 + (1 << 20),), jnp.float32).block_until_ready()
    result = "allocated"
except Exception as error:  # XlaRuntimeError: RESOURCE_EXHAUSTED
    result = type(error).__name__ + ": " + str(error).splitlines()[0][:200]
print(json.dumps({"past_quota": result}), flush=True)
"""

JAX_MATMUL = """
import time
import jax.numpy as jnp
x = jnp.ones((2048, 2048))
print(float((x @ x).sum()), flush=True)
time.sleep(8)
"""


def check_jax(cli, total):
    quota = int(total * 0.2)
    ledger = f"/tidepool-gpu-check-jax-{os.getpid()}"
    process, lines = run_child(cli, JAX_CHILD, ledger=ledger, wait=True)
    try:
        limit = figures("".join(lines)).get("bytes_limit", 0)
        check(0.70 * quota <= limit <= quota,
              f"JAX's bytes_limit {limit} follows the quota {quota} (75% of it by default)")
        shown = subprocess.run([cli, "ledger", "--device", ledger, "--json"], capture_output=True, text=True)
        entries = json.loads(shown.stdout).get("processes", []) if shown.returncode == 0 else []
        check(any(is_quota(entry.get("quota_bytes"), quota) for entry in entries),
              f"the ledger shows the JAX process's entry with its quota ({len(entries)} entries)")
    finally:
        process.communicate("go\n", timeout=60)
    past = run_child(cli, JAX_PAST_QUOTA.replace("QUOTA_BYTES", str(quota)),
                     env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
    result = figures(past.stdout).get("past_quota", past.stderr[-300:])
    check(past.returncode == 0 and result not in ("allocated", ""),
          f"a JAX allocation past the quota fails (platform allocator): {result}")
    # The second starts once the first holds its preallocation (it has printed
    # its result and sleeps): 2 x 75% of the device would not fit.
    first = subprocess.Popen([cli, "run", "--quota", "45%", "--", sys.executable, "-c", JAX_MATMUL],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
    first_out = first.stdout.readline()
    second = run_child(cli, JAX_MATMUL, quota="45%")
    first_out += first.communicate(timeout=150)[0]
    check(second.returncode == 0, "a second preallocating JAX process runs beside the first under 45% quotas"
          + ("" if second.returncode == 0 else ": " + second.stderr[-300:]))
    check(first.returncode == 0, "the first one too" + ("" if first.returncode == 0 else ": " + first_out[-300:]))
    print(json.dumps({"jax": {"quota": quota, "bytes_limit": limit, "past_quota": result}}))


TORCH_CHILD = """
import json
import torch
total_memory = torch.cuda.get_device_properties(0).total_memory
free, total = torch.cuda.mem_get_info()
half = torch.empty(total // 2, dtype=torch.uint8, device="cuda")
try:
    more = torch.empty(total // 2 + (64 << 20), dtype=torch.uint8, device="cuda")
    past = "allocated"
except torch.OutOfMemoryError as error:
    past = "OutOfMemoryError"
print(json.dumps({"total_memory": total_memory, "mem_get_info_total": total, "past_quota": past,
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
"""

CUPY_CHILD = """
import json
import cupy
free, total = cupy.cuda.runtime.memGetInfo()
properties_total = cupy.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"]
half = cupy.empty(total // 2, dtype=cupy.uint8)
try:
    more = cupy.empty(total // 2 + (64 << 20), dtype=cupy.uint8)
    past = "allocated"
except cupy.cuda.memory.OutOfMemoryError:
    past = "OutOfMemoryError"
print(json.dumps({"mem_get_info_total": total, "properties_total": properties_total, "past_quota": past}),
      flush=True)
"""


def check_array_framework(cli, total, name, code, env=None):
    quota = int(total * 0.2)
    result = run_child(cli, code, env=env)
    seen = figures(result.stdout)
    check(result.returncode == 0, f"{name} runs under the quota" + ("" if result.returncode == 0 else
                                                                    ": " + result.stderr[-400:]))
    for key in ("total_memory", "mem_get_info_total"):
        if key in seen:
            check(is_quota(seen[key], quota), f"{name}: {key} {seen[key]} is the quota {quota}")
    check(seen.get("past_quota") == "OutOfMemoryError", f"{name}: past the quota: {seen.get('past_quota')}")
    print(json.dumps({name: dict(seen, quota=quota)}))


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("jax", "torch", "torch-expandable", "cupy"):
        print(__doc__, file=sys.stderr)
        return 2
    cli, framework = sys.argv[1], sys.argv[2]
    total = device_total()
    if framework == "jax":
        check_jax(cli, total)
    elif framework == "torch":
        check_array_framework(cli, total, "torch", TORCH_CHILD)
    elif framework == "torch-expandable":
        check_array_framework(cli, total, "torch-expandable", TORCH_CHILD,
                              env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    else:
        check_array_framework(cli, total, "cupy", CUPY_CHILD)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
