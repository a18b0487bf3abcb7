#!/usr/bin/env python3
"""Unmodified JAX on tidepool, on a GPU (scripts/gpu-check runs it):

    scripts/gpu/jax_interop.py CLI OUT_JSON

One short jitted training loop (an MLP whose batch size varies, so buffers
come and go in several sizes), run four ways:
  default        JAX as installed: its BFC allocator preallocates 75%
  no-prealloc    XLA_PYTHON_CLIENT_PREALLOCATE=false: BFC growing on demand
  pool           `tidepool run --pool expandable`: JAX's platform allocator,
                 each buffer served by tidepool's expandable pool
                 (peak reserved from TIDEPOOL_REPORT)
  record         `tidepool run --record TRACE`, then `tidepool replay TRACE`
For each: peak reserved, step time p50/p90 (after the compiling steps), the
final loss. Checks: every run finishes, the losses agree, the pool's summary
and the trace are written, the trace replays and its peak live is at most
what the pool served. Prints "ok"/"FAIL" per check and the figures; writes
them to OUT_JSON; exits 1 on a failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

STEPS = 60
WARMUP = 10

# The loop the four runs share; prints one JSON line of its figures.
LOOP = r"""
import json, time
import jax, jax.numpy as jnp

def init(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) / fan_in ** 0.5, jnp.zeros(fan_out)))
    return params

def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)

@jax.jit
def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return [(w - 1e-3 * gw, b - 1e-3 * gb) for (w, b), (gw, gb) in zip(params, grads)], loss

params = init(jax.random.PRNGKey(0), [1024, 4096, 4096, 4096, 256])
batches = [256, 1024, 4096, 512]
times, loss = [], None
for i in range(STEPS):
    n = batches[i % len(batches)]
    x = jax.random.normal(jax.random.PRNGKey(i), (n, 1024))
    y = jax.random.normal(jax.random.PRNGKey(10000 + i), (n, 256))
    start = time.perf_counter()
    params, loss = step(params, x, y)
    loss.block_until_ready()
    times.append(time.perf_counter() - start)
stats = jax.devices()[0].memory_stats() or {}
peak = stats.get("peak_pool_bytes") or stats.get("peak_bytes_reserved") or 0
steady = sorted(times[WARMUP:])
print(json.dumps({"loss": float(loss), "peak_reserved_bytes": int(peak),
                  "step_ms_p50": 1e3 * steady[len(steady) // 2],
                  "step_ms_p90": 1e3 * steady[int(len(steady) * 0.9)]}))
""".replace("STEPS", str(STEPS)).replace("WARMUP", str(WARMUP))

failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)


def run(command, env_extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR"):
        if name not in env_extra:
            env.pop(name, None)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=170)
    print(f"--- {' '.join(command[:6])} ...: exit {done.returncode}\n{done.stderr[-3000:]}", flush=True)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return done, json.loads(line)
    return done, None


def main():
    cli, out_json = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="tidepool-jax-")
    python = [sys.executable, "-c", LOOP]
    report = os.path.join(work, "pool.json")
    trace = os.path.join(work, "jax.trace")
    runs = {
        "default": ([*python], {}),
        "no-prealloc": ([*python], {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
        "pool": ([cli, "run", "--pool", "expandable", "--", *python], {"TIDEPOOL_REPORT": report}),
        "record": ([cli, "run", "--record", trace, "--", *python], {}),
    }
    figures = {}
    for name, (command, env_extra) in runs.items():
        done, result = run(command, env_extra)
        check(done.returncode == 0 and result is not None, f"{name}: the loop runs")
        figures[name] = result or {}

    if os.path.exists(report):
        with open(report) as file:
            pool = json.load(file)
        figures["pool"]["peak_reserved_bytes"] = pool["peak_reserved_bytes"]
        figures["pool"]["pool_summary"] = pool
        check(pool["allocations"] > 0 and pool["ooms"] == 0, "pool: it served JAX's buffers, with no OOM")
    else:
        check(False, "pool: TIDEPOOL_REPORT was written")

    losses = [f["loss"] for f in figures.values() if "loss" in f]
    check(len(losses) == 4 and max(losses) - min(losses) <= 1e-3 * max(1.0, abs(losses[0])),
          f"the four runs end with the same loss: {losses}")

    replay = subprocess.run([cli, "replay", trace], capture_output=True, text=True, timeout=120)
    print(replay.stdout[-4000:], replay.stderr[-2000:], flush=True)
    peak = re.search(r"peak live ([0-9.]+ [KMGT]?i?B)", replay.stdout)
    check(replay.returncode == 0 and peak is not None, "record: the trace replays in every mode")
    figures["record"]["replay_peak_live"] = peak.group(1) if peak else None
    figures["record"]["replay_table"] = replay.stdout

    print(f"{'run':12} {'peak reserved':>14} {'step p50 ms':>12} {'step p90 ms':>12} {'loss':>10}")
    for name, f in figures.items():
        print(f"{name:12} {f.get('peak_reserved_bytes', 0) / 2**20:11.1f} MiB {f.get('step_ms_p50', 0):12.2f} "
              f"{f.get('step_ms_p90', 0):12.2f} {f.get('loss', float('nan')):10.5f}")
    with open(out_json, "w") as file:
        json.dump(figures, file, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
