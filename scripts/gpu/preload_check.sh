#!/usr/bin/env bash
# GPU check of `tidepool run` on the real driver (UNTESTED: written on a
# machine with no GPU). Needs nvcc and a GPU; run from the repository root
# after building (BUILD_DIR, default build):
#   scripts/gpu/preload_check.sh
# 1. A CUDA runtime program (the runtime reaches the driver through
#    cuGetProcAddress) under --quota 40%: cudaMemGetInfo's total is the quota,
#    75% of it can be cudaMalloc'd, more fails with cudaErrorMemoryAllocation,
#    cudaMallocAsync is accounted too.
# 2. With JAX installed: two JAX processes with default preallocation (75% of
#    the "device") share the GPU under --quota 45%, and the second fails
#    without tidepool.
set -euo pipefail
build=${BUILD_DIR:-build}
cli=$build/tools/tidepool
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }

cat > "$work/runtime_app.cu" <<'CU'
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  std::printf("total %zu\nfree %zu\n", total, free_bytes);
  void* big = nullptr;
  std::printf("alloc75 %d\n", (int)cudaMalloc(&big, total / 4 * 3));
  void* beyond = nullptr;
  std::printf("beyond %d\n", (int)cudaMalloc(&beyond, total / 2));
  cudaGetLastError();
  void* async_block = nullptr;
  std::printf("async_beyond %d\n", (int)cudaMallocAsync(&async_block, total / 2, 0));
  cudaGetLastError();
  std::printf("async %d\n", (int)cudaMallocAsync(&async_block, 1 << 20, 0));
  cudaFreeAsync(async_block, 0);
  cudaStreamSynchronize(0);
  std::printf("free %d\n", (int)cudaFree(big));
  return 0;
}
CU
nvcc -o "$work/runtime_app" "$work/runtime_app.cu"
device_total=$("$work/runtime_app" | awk '$1 == "total" {print $2}')
out=$("$cli" run --quota 40% --ledger "/tidepool-gpu-check-$$" -- "$work/runtime_app")
echo "$out"
value() { echo "$out" | awk -v k="$1" '$1 == k {print $2}'; }
quota=$(python3 -c "print(int($device_total * 0.4))")
check "cudaMemGetInfo total is the quota ($quota of $device_total)" '[[ $(value total) == "$quota" ]]'
check "75% of the quota can be allocated" '[[ $(value alloc75) == 0 ]]'
check "beyond the quota: cudaErrorMemoryAllocation (2)" '[[ $(value beyond) == 2 ]]'
check "cudaMallocAsync beyond the quota fails too" '[[ $(value async_beyond) == 2 ]]'
check "cudaMallocAsync within it works" '[[ $(value async) == 0 ]]'
rm -f "/dev/shm/tidepool-gpu-check-$$"

if python3 -c "import jax" 2>/dev/null; then
  jax_program='import jax, jax.numpy as jnp, time; x = jnp.ones((1024, 1024)); print((x @ x).sum()); time.sleep(5)'
  "$cli" run --quota 45% -- python3 -c "$jax_program" > "$work/jax1.log" 2>&1 &
  first=$!
  sleep 2
  check "a second JAX process runs beside the first under --quota 45%" \
    '"$cli" run --quota 45% -- python3 -c "$jax_program" > "$work/jax2.log" 2>&1'
  check "the first one too" 'wait $first'
  python3 -c "$jax_program" > "$work/plain1.log" 2>&1 &
  first=$!
  sleep 2
  check "without tidepool the second preallocating JAX process fails" \
    '! python3 -c "$jax_program" > "$work/plain2.log" 2>&1'
  wait $first || true
else
  echo "skip JAX: not installed"
fi
echo "$failures failure(s)"
exit $((failures > 0))
