#!/usr/bin/env bash
# GPU check of `tidepool run` on the real driver (scripts/gpu-check runs it).
# Needs nvcc and a GPU; CLI is the tidepool command (default:
# BUILD_DIR/tools/tidepool, BUILD_DIR default build):
#   CLI=build/tools/tidepool scripts/gpu/preload_check.sh
# 1. A CUDA runtime program (the runtime reaches the driver through
#    cuGetProcAddress) under --quota 40%: cudaMemGetInfo's total is the quota,
#    75% of it can be cudaMalloc'd, more fails with cudaErrorMemoryAllocation,
#    cudaMallocAsync is accounted too.
# The frameworks (JAX, PyTorch, CuPy) under --quota: scripts/gpu/quota_check.py.
set -euo pipefail
build=${BUILD_DIR:-build}
cli=${CLI:-$build/tools/tidepool}
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
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  std::printf("properties_total %zu\n", properties.totalGlobalMem);
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
# tidepool resolves 40% in long double, Python in double: a few bytes apart.
near_quota() { python3 -c "import sys; sys.exit(abs(int('${1:-0}') - $quota) > (1 << 20))"; }
check "cudaMemGetInfo total is the quota ($quota of $device_total)" 'near_quota "$(value total)"'
check "cudaGetDeviceProperties' totalGlobalMem is the quota (cuDeviceTotalMem_v2)" \
  'near_quota "$(value properties_total)"'
check "75% of the quota can be allocated" '[[ $(value alloc75) == 0 ]]'
check "beyond the quota: cudaErrorMemoryAllocation (2)" '[[ $(value beyond) == 2 ]]'
check "cudaMallocAsync beyond the quota fails too" '[[ $(value async_beyond) == 2 ]]'
check "cudaMallocAsync within it works" '[[ $(value async) == 0 ]]'
rm -f "/dev/shm/tidepool-gpu-check-$$"

echo "$failures failure(s)"
exit $((failures > 0))
