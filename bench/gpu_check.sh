#!/usr/bin/env bash
# bench/gpu_check.sh — the one prepared script for a machine with an NVIDIA GPU: build with CUDA (sm_80 and
# sm_90), run the CUDA tests (ctest -L cuda: the CUDA kernels against the CPU kernels, which the CPU tests
# check against float64 references), then the CUDA kernel benchmark, and print a short table last.
# Usage: bench/gpu_check.sh [BUILD_DIR]   (default build-gpu; run from the repository root)
# Results: bench/results/attention_cuda.csv.
set -euo pipefail
BUILD=${1:-build-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "gpu_check: no GPU visible" >&2; exit 1; }
./scripts/install-deps.sh
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_CUDA=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target attention_test_attention_cuda attention_test_attention kvpage >/dev/null
ctest --test-dir "$BUILD" -L cuda --output-on-failure
if "$BUILD"/tests/attention_test_attention_cuda 2>&1 | grep -q SKIP; then
  echo "gpu_check: the CUDA test skipped itself (no device seen by the CUDA runtime)" >&2
  exit 1
fi
mkdir -p bench/results
"$BUILD"/kvpage bench attention-cuda --format csv > bench/results/attention_cuda.csv
echo
echo "== CUDA decode, 32 seqs x 4096 tokens, 32/8 heads, head_dim 128, f16 (bench/results/attention_cuda.csv) =="
cut -d, -f1,3,10-16 bench/results/attention_cuda.csv | column -t -s,
