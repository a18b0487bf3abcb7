#!/usr/bin/env python3
"""GPU check of sleep and wake through tidepool's PyTorch allocator
(scripts/gpu-check runs it). Needs a CUDA GPU, PyTorch
and libtidepool_torch.so, loaded by path with the package's torch.py:

    python3 scripts/gpu/torch_sleep_check.py build/libtidepool_torch.so

A model's weights are made in tag "weights" and a cache in tag "kv"; the
weights sleep keeping their contents, the cache keeping nothing. Checks: the
GPU's free memory rises by the slept bytes; an untagged tensor of that size
is made and freed while they sleep; after the wakes every parameter has its
old address and the model's output is bit-identical; the errors are raised
(ValueError for an unknown tag or a tag awake). Prints the times per GiB.
Exits non-zero with the failed check.
"""
import os
import sys

import tidepool_torch_file  # beside this script
import time

os.environ["TIDEPOOL_ALLOCATOR"] = "expandable"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
tidepool_torch = tidepool_torch_file.load()
tidepool_torch.use(sys.argv[1] if len(sys.argv) > 1 else None)  # before the first CUDA allocation

import torch  # noqa: E402

GiB = 1 << 30
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def raises(kind, call):
    try:
        call()
    except kind as error:
        return str(error)
    return None


torch.manual_seed(0)
device = torch.device("cuda", 0)
with tidepool_torch.tag("weights"):
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).to(device)  # 1 GiB
with tidepool_torch.tag("kv"):
    cache = torch.ones(2 * GiB // 4, device=device)  # 2 GiB of float32
inputs = torch.randn(64, 4096, device=device)
with torch.no_grad():
    before = model(inputs)
addresses = [p.data_ptr() for p in model.parameters()]
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
torch.cuda.synchronize()
free_awake = torch.cuda.mem_get_info(0)[0]

start = time.perf_counter()
tidepool_torch.sleep("weights", keep="contents")
slept_weights = time.perf_counter() - start
start = time.perf_counter()
tidepool_torch.sleep("kv", keep="nothing")
slept_cache = time.perf_counter() - start
stats = tidepool_torch.memory_stats(0)
check(stats["bytes_asleep"] >= weight_bytes + 2 * GiB,
      f"bytes_asleep {stats['bytes_asleep']} covers the weights ({weight_bytes}) and the cache (2 GiB)")
free_asleep = torch.cuda.mem_get_info(0)[0]
check(free_asleep - free_awake >= 0.95 * (weight_bytes + 2 * GiB),
      f"the GPU's free memory rose by {free_asleep - free_awake} bytes")
check(raises(ValueError, lambda: tidepool_torch.sleep("weights")) is not None, "sleeping twice is a ValueError")
check(raises(ValueError, lambda: tidepool_torch.wake("never")) is not None, "waking an unknown tag is a ValueError")

borrowed = torch.empty(2 * GiB, dtype=torch.uint8, device=device)  # untagged, while they sleep
borrowed.fill_(7)
torch.cuda.synchronize()
del borrowed

start = time.perf_counter()
tidepool_torch.wake("weights")
woke_weights = time.perf_counter() - start
start = time.perf_counter()
tidepool_torch.wake("kv")
woke_cache = time.perf_counter() - start
check([p.data_ptr() for p in model.parameters()] == addresses, "every parameter keeps its address")
with torch.no_grad():
    after = model(inputs)
check(torch.equal(before, after), "the model's output is bit-identical after sleep and wake")
cache.fill_(2.0)
torch.cuda.synchronize()
check(float(cache[-1]) == 2.0, "the cache is usable after a wake that kept nothing")
check(raises(ValueError, lambda: tidepool_torch.wake("weights")) is not None, "waking an awake tag is a ValueError")
check(tidepool_torch.memory_stats(0)["bytes_asleep"] == 0, "bytes_asleep is 0 once awake")

pinned = torch.empty(weight_bytes, dtype=torch.uint8, pin_memory=True)
flat = torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in model.parameters()])
torch.cuda.synchronize()
start = time.perf_counter()
pinned.copy_(flat)
torch.cuda.synchronize()
bare = time.perf_counter() - start
per_gib = GiB / weight_bytes * 1e3
print(f"weights {weight_bytes / GiB:.2f} GiB: sleep (contents, first: pins its host buffer) "
      f"{slept_weights * per_gib:.0f} ms/GiB, wake {woke_weights * per_gib:.0f} ms/GiB; "
      f"a bare device-to-host copy into pinned memory {bare * per_gib:.0f} ms/GiB")
print(f"cache 2 GiB (nothing kept): sleep {slept_cache * 500:.1f} ms/GiB, wake {woke_cache * 500:.1f} ms/GiB")
check(tidepool_torch.memory_stats(0)["num_ooms"] == 0, "no allocation was refused")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
