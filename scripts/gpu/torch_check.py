#!/usr/bin/env python3
"""GPU check of tidepool's PyTorch allocator (scripts/gpu-check runs it).
Needs a CUDA GPU, PyTorch, and libtidepool_torch.so (built with the CUDA
toolkit), loaded by path with the package's torch.py, so
that no tidepool Python extension is needed:

    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 scripts/gpu/torch_check.py build/libtidepool_torch.so

Checks: tidepool.torch.use() installs the allocator; a small model trains
(the loss falls); tidepool_torch.memory_stats() agrees with the tensors PyTorch
holds (a new tensor of n bytes adds n rounded up to 256 to bytes_in_use, and
freeing it takes them away); everything PyTorch frees goes back to the pool.
Exits non-zero with the failed check.
"""
import gc
import sys

import tidepool_torch_file  # beside this script

tidepool_torch = tidepool_torch_file.load()
tidepool_torch.use(sys.argv[1] if len(sys.argv) > 1 else None)  # before the first CUDA allocation

import torch  # noqa: E402

failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def stats():
    torch.cuda.synchronize()
    return tidepool_torch.memory_stats(0)


def rounded(n):
    return (n + 255) // 256 * 256


torch.manual_seed(0)
device = torch.device("cuda", 0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
inputs = torch.randn(1024, 256, device=device)
targets = torch.randint(0, 10, (1024,), device=device)

losses = []
for step in range(200):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
check(losses[-1] < 0.5 * losses[0], f"the model trains: loss {losses[0]:.3f} -> {losses[-1]:.3f}")

s = stats()
check(bool(s), "tidepool_torch.memory_stats() reports the pool")
check(s.get("num_allocs", 0) > 0, f"PyTorch allocated through tidepool ({s.get('num_allocs')} allocations)")
parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
check(s["bytes_in_use"] >= 3 * parameter_bytes,
      f"bytes_in_use {s['bytes_in_use']} holds parameters, gradients and Adam's two moments "
      f"(at least 3 x {parameter_bytes})")
check(s["peak_bytes_in_use"] >= s["bytes_in_use"], "peak_bytes_in_use >= bytes_in_use")

before = stats()["bytes_in_use"]
n = 10_000_019  # bytes, not a multiple of anything
block = torch.empty(n, dtype=torch.uint8, device=device)
after = stats()["bytes_in_use"]
check(after - before == rounded(n) or after - before >= n,
      f"a tensor of {n} bytes adds {after - before} to bytes_in_use (expected {rounded(n)})")
del block
gc.collect()
check(stats()["bytes_in_use"] == before, "freeing the tensor gives its bytes back")

del model, optimizer, inputs, targets, loss
gc.collect()
torch.cuda.synchronize()
final = stats()
print(f"after freeing everything: bytes_in_use {final['bytes_in_use']} (cuBLAS workspaces may stay), "
      f"bytes_reserved {final['bytes_reserved']}, peak {final['peak_bytes_in_use']}")
check(final["bytes_in_use"] < before, "bytes_in_use falls when the model is freed")
check(tidepool_torch.last_error() == "", f"no allocator errors ({tidepool_torch.last_error()!r})")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
