#!/usr/bin/env bash
# bench/gpu_check.sh — on a machine with an NVIDIA GPU: build with CUDA, run the CUDA tests (ctest -L cuda)
# and print a short table. Usage: bench/gpu_check.sh [BUILD_DIR]   (default build-gpu; run from the repo root)
set -euo pipefail
BUILD=${1:-build-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "gpu_check: no GPU visible" >&2; exit 1; }
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_CUDA=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target attention_test_attention_cuda attention_test_attention kvpage >/dev/null
# the CUDA kernels against the CPU kernels (which are themselves checked against the float64 references)
ctest --test-dir "$BUILD" -L cuda --output-on-failure
"$BUILD"/tests/attention_test_attention_cuda --verbose 2>&1 | grep -E '^\[(PASS|FAIL|SKIP)' | sed 's/^/  /'
if "$BUILD"/tests/attention_test_attention_cuda 2>&1 | grep -q SKIP; then
  echo "gpu_check: the CUDA test skipped itself (no device seen by the CUDA runtime)" >&2
  exit 1
fi
echo "gpu_check: CUDA append_kv and decode match the CPU kernels"
