#!/usr/bin/env python3
"""PyTorch's caching allocator against tidepool's pluggable allocator on the
same training loop, each in a process of its own (an allocator is chosen
before the first CUDA allocation). Needs a GPU and PyTorch; tidepool's side
loads libtidepool_torch.so by path (no tidepool Python extension needed):

    scripts/gpu/torch_compare.py LIBTIDEPOOL_TORCH OUT.json

Reports, per allocator: peak reserved bytes (PyTorch: max_memory_reserved;
tidepool: peak_bytes_reserved), the median and p90 step time after warm-up,
and the final loss (the two must train the same model the same way).
Exits 1 when either side fails or writes nothing.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, sys, time
which, library, here = sys.argv[1], sys.argv[2], sys.argv[3]
tidepool_torch = None
if which == "tidepool":
    sys.path.insert(0, here)
    import tidepool_torch_file
    tidepool_torch = tidepool_torch_file.load()
    tidepool_torch.use(library)
import torch
torch.manual_seed(0)
device = torch.device("cuda", 0)
# A model whose activations change size from step to step (sequence lengths
# vary), as in language-model training: what makes allocators differ.
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
lengths = [256 + (step * 977) % 1792 for step in range(160)]
times = []
for step, length in enumerate(lengths):
    torch.cuda.synchronize()
    start = time.perf_counter()
    batch = torch.randn(16, length, 1024, device=device)
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    if step >= 20:
        times.append(time.perf_counter() - start)
times.sort()
if which == "tidepool":
    stats = tidepool_torch.memory_stats(0)
    peak = stats["peak_bytes_reserved"]
    error = tidepool_torch.last_error()
else:
    peak = torch.cuda.max_memory_reserved()
    error = ""
print(json.dumps({"allocator": which, "peak_reserved_bytes": peak,
                  "step_ms_p50": 1000 * times[len(times) // 2], "step_ms_p90": 1000 * times[len(times) * 9 // 10],
                  "steps": len(lengths), "final_loss": float(loss), "error": error}), flush=True)
"""


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    library, out_path = sys.argv[1], sys.argv[2]
    results = []
    failed = False
    for which in ("pytorch", "tidepool"):
        run = subprocess.run([sys.executable, "-c", CHILD, which, library, HERE], capture_output=True,
                             text=True, timeout=150, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode != 0 or not lines:
            print(f"FAIL {which}: exit {run.returncode}\n{run.stderr[-1500:]}")
            failed = True
            continue
        result = json.loads(lines[-1])
        results.append(result)
        print(f"ok   {which}: peak reserved {result['peak_reserved_bytes'] / 2**20:.1f} MiB, step "
              f"p50 {result['step_ms_p50']:.2f} ms p90 {result['step_ms_p90']:.2f} ms, loss {result['final_loss']:.5f}")
        if result["error"]:
            print(f"FAIL {which}: allocator error {result['error']!r}")
            failed = True
    with open(out_path, "w") as out:
        json.dump(results, out, indent=2)
    if len(results) == 2 and abs(results[0]["final_loss"] - results[1]["final_loss"]) > 1e-3 * abs(
            results[0]["final_loss"]) + 1e-6:
        print("FAIL the two runs did not train the same way (final losses differ)")
        failed = True
    return 1 if failed or len(results) != 2 else 0


if __name__ == "__main__":
    sys.exit(main())
