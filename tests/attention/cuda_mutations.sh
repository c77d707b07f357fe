#!/usr/bin/env bash
# tests/attention/cuda_mutations.sh — planted bugs: five deliberate mutations of the CUDA kernels, each applied
# to a copy of attention/cuda/ (the working tree is never modified), compiled for the CPU emulator of CUDA,
# linked into the emulated attention suite with the build's other objects, and run; records which tests fail.
# A mutation the suite does not catch makes the script fail.
# Usage: tests/attention/cuda_mutations.sh [BUILD_DIR]   (default build; needs attention_test_attn_cuda_emu built
# there; run from the repository root). Prints one line per mutation: its name and the failing tests.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ROOT=$(pwd)
OBJ=$BUILD/attention/CMakeFiles/kvp_attn_cuda_emu.dir/kvp_attn_cuda_emu_src
TDIR=$BUILD/tests
[ -x "$TDIR/attention_test_attn_cuda_emu" ] || { echo "cuda_mutations: build attention_test_attn_cuda_emu in $BUILD first" >&2; exit 2; }
CUDA_INC=$(grep -oE '\-I[^ ]*cuda[^ ]*include' "$BUILD/attention/CMakeFiles/kvp_attn_cuda_emu.dir/flags.make" | head -1)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
K=attention/cuda/attn_kernels.cuh
A=attention/cuda/attn_cuda.cu
DECODE="attn_decode_f32 attn_decode_f16 attn_decode_bf16 attn_decode_fp8"

# name | file | files to recompile | text | replacement (the text must occur exactly once; \n is a newline)
mutations=(
  "gqa-mapping|$K|$DECODE|const int head0 = kvh * a.group + g0;|const int head0 = kvh + g0;"
  "last-page-length|$K|$DECODE|const int L = kvp_paged_kv_seq_len(&kv, s), lo = kvp_hd_window_lo(L - 1, a.window_left);|const int L = kv.block_size * kvp_paged_kv_num_pages(&kv, s), lo = kvp_hd_window_lo(L - 1, a.window_left);"
  "missing-barrier|$K|$DECODE|            dst[1] = make_float4(x[4], x[5], x[6], x[7]);\n        }\n        __syncthreads();\n        for (int i = tid; i < G * TT; i += kThreads) {|            dst[1] = make_float4(x[4], x[5], x[6], x[7]);\n        }\n        for (int i = tid; i < G * TT; i += kThreads) {"
  "softmax-rescale|$K|$DECODE|for (int e = 0; e < 8; e++) acc[g][e] *= al;|for (int e = 0; e < 8; e++) acc[g][e] *= 1.0f;"
  "fp8-scale|$A|attn_cuda|*os = fp8 ? kv->v_scale * kFp8LoadScale : 1.0f;|*os = fp8 ? kFp8LoadScale : 1.0f;"
)
status=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file units text repl <<<"$m"
  rm -rf "$T/src" "$T/obj" && mkdir -p "$T/src/attention" "$T/obj"
  cp -r attention/cuda "$T/src/attention/"
  python3 - "$T/src/$file" "$text" "$repl" <<'EOF'
import sys
path, old, new = sys.argv[1], sys.argv[2].replace('\\n', '\n'), sys.argv[3].replace('\\n', '\n')
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"cuda_mutations: the text to mutate occurs {s.count(old)} times in {path}")
open(path, 'w').write(s.replace(old, new))
EOF
  objs=()
  for src in attention/cuda/*.cu; do
    u=$(basename "$src" .cu)
    if [[ " $units " == *" $u "* ]]; then
      g++ -std=c++17 -O2 -D_GNU_SOURCE -DKVPAGE_CUDA_EMU=1 -DKVP_HAVE_CUDA=1 -Wno-unknown-pragmas -I"$T/src" -I"$ROOT" $CUDA_INC \
        -x c++ -c "$T/src/$src" -o "$T/obj/$u.o" &
      objs+=("$T/obj/$u.o")
    else
      objs+=("$OBJ/$u.cpp.o")
    fi
  done
  wait
  link=$(sed -E "s#\.\./attention/libkvp_attn_cuda_emu\.a#${objs[*]}#; s#-o attention_test_attn_cuda_emu#-o $T/mutant#" \
    "$TDIR/CMakeFiles/attention_test_attn_cuda_emu.dir/link.txt")
  (cd "$TDIR" && eval "$link")
  out=$("$T/mutant" --jobs 2 2>&1 || true)
  failed=$(grep -oE '\[FAIL\] attn_cuda::[a-z_0-9]+' <<<"$out" | sed 's/\[FAIL\] attn_cuda:://' | sort -u | paste -sd, - || true)
  if [ -z "$failed" ]; then
    echo "$name: NOT CAUGHT"
    status=1
  else
    echo "$name: caught by $failed"
  fi
done
exit $status
