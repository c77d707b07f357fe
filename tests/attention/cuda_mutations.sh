#!/usr/bin/env bash
# tests/attention/cuda_mutations.sh — planted bugs: applies each of five deliberate mutations of the CUDA kernels
# in turn, rebuilds the emulated suite (attention_test_attn_cuda_emu), runs it, records which tests fail, and
# restores the file. A mutation the suite does not catch makes the script fail.
# Usage: tests/attention/cuda_mutations.sh [BUILD_DIR]   (default build; run from the repository root with a
# clean working tree for attention/cuda/). Prints one line per mutation: name, then the failing tests.
set -euo pipefail
BUILD=${1:-build}
K=attention/cuda/attn_kernels.cuh
A=attention/cuda/attn_cuda.cu
if ! git diff --quiet -- "$K" "$A"; then
  echo "cuda_mutations: $K or $A has local changes; commit or stash them first" >&2
  exit 2
fi
restore() { git checkout -- "$K" "$A"; }
trap restore EXIT

# name | file | text | replacement (python literal strings; the text must occur exactly once)
mutations=(
  "gqa-mapping|$K|const int head0 = kvh * a.group + g0;|const int head0 = kvh + g0;"
  "last-page-length|$K|const int L = kvp_paged_kv_seq_len(&kv, s), lo = kvp_hd_window_lo(L - 1, a.window_left);|const int L = kv.block_size * kvp_paged_kv_num_pages(&kv, s), lo = kvp_hd_window_lo(L - 1, a.window_left);"
  "missing-barrier|$K|            dst[1] = make_float4(x[4], x[5], x[6], x[7]);\n        }\n        __syncthreads();\n        for (int i = tid; i < G * TT; i += kThreads) {|            dst[1] = make_float4(x[4], x[5], x[6], x[7]);\n        }\n        for (int i = tid; i < G * TT; i += kThreads) {"
  "softmax-rescale|$K|for (int e = 0; e < 8; e++) acc[g][e] *= al;|for (int e = 0; e < 8; e++) acc[g][e] *= 1.0f;"
  "fp8-scale|$A|*os = fp8 ? kv->v_scale * kFp8LoadScale : 1.0f;|*os = fp8 ? kFp8LoadScale : 1.0f;"
)
status=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file text repl <<<"$m"
  python3 - "$file" "$text" "$repl" <<'EOF'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace('\\n', '\n'), sys.argv[3].replace('\\n', '\n')
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"cuda_mutations: the text to mutate occurs {s.count(old)} times in {path}")
open(path, 'w').write(s.replace(old, new))
EOF
  cmake --build "$BUILD" --target attention_test_attn_cuda_emu -j2 >/dev/null
  out=$("$BUILD"/tests/attention_test_attn_cuda_emu --jobs 2 2>&1 || true)
  failed=$(grep -oE '\[FAIL\] attn_cuda::[a-z_0-9]+' <<<"$out" | sed 's/\[FAIL\] attn_cuda:://' | sort -u | paste -sd, - || true)
  restore
  if [ -z "$failed" ]; then
    echo "$name: NOT CAUGHT"
    status=1
  else
    echo "$name: caught by $failed"
  fi
done
cmake --build "$BUILD" --target attention_test_attn_cuda_emu -j2 >/dev/null
exit $status
