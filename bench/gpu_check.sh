#!/usr/bin/env bash
# bench/gpu_check.sh — the one prepared command for a machine with an NVIDIA GPU. Needs only what such a
# machine has (nvcc, gcc, the CUDA libraries, the driver; NCCL and PyTorch where present): no apt-get, no
# network, no CMake configure of the whole project (which needs cJSON, Criterion, MPI, ...). It
#   1. builds, for sm_90 only (KVP_GPU_ARCH to change), just what it runs: the CUDA attention kernels, the CPU
#      kernels they are checked against, the two CUDA suites with the standalone test runner (no Criterion),
#      the standalone kernel benchmark (no cJSON), kvp-nccl-smoke, and the kernels' resource report;
#   2. runs the suites natively (tests/cuda/test_emulator.cu: the emulator's semantics on real hardware;
#      tests/attention/test_attn_cuda.c: every kernel against the CPU kernels and float64 references) and fails
#      when a suite fails, skips anything, or runs nothing;
#   3. compute-sanitizer memcheck and racecheck on the attention suite where the tool exists (bounded);
#   4. the kernel benchmark (--quick: the issue's target rows), then the PyTorch SDPA peer (bench/sdpa_peer.py);
#   5. the 1-rank NCCL smoke (kvp-nccl-smoke --json) where NCCL is found;
#   6. prints a short table last.
# Files (at most 6) in OUT_DIR (default $OUT, else bench/results): gpu_check.log, attention_cuda.csv,
# attention_cuda.json, sdpa_peer.csv, nccl_smoke.json, cuda_resources.txt. Exit 0 only when every step that
# could run passed. Aims at under 4 minutes on an H200 machine (16 cores).
# Usage: bench/gpu_check.sh [--build-only] [OUT_DIR]   (from the repository root; --build-only: steps 1's
# compiles and links only, no GPU needed: a check of this script on a machine with nvcc but no device)
set -uo pipefail
T0=$(date +%s)
BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then BUILD_ONLY=1; shift; fi
OUTD=${1:-${OUT:-bench/results}}
B=${KVP_GPU_BUILD:-build-gpu}
ARCH=${KVP_GPU_ARCH:-90}
mkdir -p "$OUTD" "$B/obj"
LOG="$OUTD/gpu_check.log"
: >"$LOG"
say() { echo "gpu_check: $*" | tee -a "$LOG" >&2; }
elapsed() { echo $(($(date +%s) - T0)); }
declare -A RES

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { say "no nvcc"; exit 2; }
CUDA=$(cd "$(dirname "$NVCC")/.." && pwd)
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || [ $BUILD_ONLY = 1 ] || { say "no GPU visible to nvidia-smi"; exit 2; }
CPU=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
MACHINE="$GPU; $(nproc) x $CPU"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo "-dirty")
say "machine: $MACHINE; commit $COMMIT; nvcc $("$NVCC" --version | tail -1)"

# ---- 1. build (objects in parallel)
INC="-I. -Itests -I$CUDA/include"
# Warnings are not errors here (this machine's compilers may differ from CI's, where the -Werror gates run).
MARCH=-march=x86-64-v3
gcc $MARCH -E -x c /dev/null >/dev/null 2>&1 || MARCH="-mavx2 -mfma -mf16c"
CFLAGS="-O2 -std=c11 -D_GNU_SOURCE -fopenmp $MARCH -Wall -Wextra $INC"
NVFLAGS="-O3 -std=c++17 -arch=sm_$ARCH -lineinfo -D_GNU_SOURCE -Xcompiler=-Wall,-Wextra $INC"
NCCL_INC=$(ls -d "$CUDA"/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -1)
pids=()
build() { # out, compiler command...
  local out=$1
  shift
  ("$@" -c -o "$B/obj/$out" >"$B/obj/$out.log" 2>&1 || { echo "FAILED: $*" >>"$B/obj/$out.log"; exit 1; }) &
  pids+=($!)
}
for f in attention/cuda/attn_prefill_tc_{f16,bf16,fp8}.cu attention/cuda/attn_prefill_{f16,bf16,fp8,f32}.cu attention/cuda/attn_decode_{f16,bf16,fp8,f32}.cu \
         attention/cuda/attn_cuda.cu; do
  build "$(basename "$f" .cu).o" "$NVCC" $NVFLAGS -Xptxas -warn-spills "$f" # spills: a warning, in the log
done
build test_emulator.o "$NVCC" $NVFLAGS -DKVP_TEST_STANDALONE=1 tests/cuda/test_emulator.cu
for f in common/status.c common/alloc.c common/cpu.c common/timer.c attention/attn_cpu.c attention/attn_ref.c \
         attention/attn_params.c attention/cache_ops.c attention/dtype.c attention/paged_kv.c bench/cuda/attn_cuda_bench.c; do
  build "$(basename "$f" .c).o" gcc $CFLAGS -DKVP_HAVE_CUDA=1 "$f"
done
build test_attn_cuda.o gcc $CFLAGS -DKVP_HAVE_CUDA=1 -DKVP_TEST_STANDALONE=1 tests/attention/test_attn_cuda.c
build attn_cuda_bench_main.o gcc $CFLAGS "-DKVP_GIT_COMMIT=\"$COMMIT\"" bench/cuda/attn_cuda_bench_main.c
if [ -n "$NCCL_INC" ]; then
  for f in parallel/*.c parallel/tools/nccl_smoke.c; do
    build "par_$(basename "$f" .c).o" gcc $CFLAGS -DKVP_HAVE_NCCL=1 "$f"
  done
fi
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ $fail = 1 ]; then
  cat "$B"/obj/*.log | grep -v '^$' | tail -40 | tee -a "$LOG" >&2
  say "build FAILED ($(elapsed) s)"
  exit 1
fi
grep -h -i "spill" "$B"/obj/attn_*.o.log >>"$LOG" 2>/dev/null || true
O=$B/obj
KOBJ=$(ls "$O"/attn_cuda.o "$O"/attn_decode_*.o "$O"/attn_prefill_*.o)
COBJ="$O/status.o $O/alloc.o $O/cpu.o $O/timer.o $O/attn_cpu.o $O/attn_ref.o $O/attn_params.o $O/cache_ops.o $O/dtype.o $O/paged_kv.o"
LIBS="-L$CUDA/lib64 -L$CUDA/lib -lcudart -fopenmp -lm -lpthread -ldl"
rm -f "$B/libkvp_attn_cuda.a" && ar rcs "$B/libkvp_attn_cuda.a" $KOBJ
"$NVCC" -arch=sm_$ARCH -o "$B/test_emulator" "$O/test_emulator.o" >>"$LOG" 2>&1 &&
  g++ -o "$B/test_attn_cuda" "$O/test_attn_cuda.o" $KOBJ $COBJ $LIBS >>"$LOG" 2>&1 &&
  g++ -o "$B/kvp-attn-cuda-bench" "$O/attn_cuda_bench_main.o" "$O/attn_cuda_bench.o" $KOBJ $COBJ $LIBS >>"$LOG" 2>&1 ||
  { say "link FAILED"; tail -20 "$LOG" >&2; exit 1; }
if [ -n "$NCCL_INC" ]; then
  mkdir -p build/parallel
  gcc -o build/parallel/kvp-nccl-smoke "$O"/par_*.o "$O/status.o" "$O/alloc.o" "$O/timer.o" -L"$CUDA/lib64" -L"$CUDA/lib" \
    -lnccl -lcudart -lpthread -lm >>"$LOG" 2>&1 || say "kvp-nccl-smoke did not link (see the log)"
fi
say "built in $(elapsed) s"
[ $BUILD_ONLY = 1 ] && exit 0
tests/attention/cuda_resources.sh "$B/libkvp_attn_cuda.a" >"$OUTD/cuda_resources.txt" 2>&1
RES[spills]=$([ $? = 0 ] && echo "none (head_dim >= 64)" || echo "SPILLS (see cuda_resources.txt)")

# ---- 2. the suites, natively
suite() { # name, binary, args...
  local name=$1 bin=$2 out
  shift 2
  out=$(timeout 120 "$bin" "$@" 2>&1)
  local rc=$?
  echo "$out" >>"$LOG"
  local syn
  syn=$(grep -E '^\[====\] Synthesis' <<<"$out" | tail -1)
  local t p f s
  t=$(sed -nE 's/.*Tested: ([0-9]+).*/\1/p' <<<"$syn"); p=$(sed -nE 's/.*Passing: ([0-9]+).*/\1/p' <<<"$syn")
  f=$(sed -nE 's/.*Failing: ([0-9]+).*/\1/p' <<<"$syn"); s=$(sed -nE 's/.*Skipped: ([0-9]+).*/\1/p' <<<"$syn")
  if [ -z "$syn" ]; then RES[$name]="CRASHED or timed out (rc $rc)"; return 1; fi
  if [ "$rc" != 0 ] || [ "${f:-1}" != 0 ] || [ "${s:-1}" != 0 ] || [ "${t:-0}" = 0 ]; then
    RES[$name]="FAILED: $t tested, $p passed, $f failed, $s skipped (rc $rc)"
    grep -E '^\[(FAIL|SKIP)\]|^\[----\]' <<<"$out" | head -20 >&2
    return 1
  fi
  RES[$name]="$p/$t passed"
}
status=0
suite emulator_suite "$B/test_emulator" || status=1
suite attention_suite "$B/test_attn_cuda" || status=1
say "suites done ($(elapsed) s)"

# ---- 3. compute-sanitizer (bounded: what fits the time)
CS=$(command -v compute-sanitizer || ls "$CUDA"/bin/compute-sanitizer "$CUDA"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
sanit() { # tool, filter, seconds
  local out rc
  out=$(timeout "$3" "$CS" --tool "$1" --error-exitcode 9 "$B/test_attn_cuda" --filter "$2" 2>&1)
  rc=$?
  echo "$out" | tail -30 >>"$LOG"
  case $rc in
  0) RES[$1]="clean ($2)" ;;
  124) RES[$1]="timed out after $3 s ($2): not checked" ;;
  *) RES[$1]="ERRORS (rc $rc, $2; see the log)"; status=1 ;;
  esac
}
if [ -n "$CS" ]; then
  sanit memcheck 'attn_cuda/[acdp]*' 45
  sanit racecheck 'attn_cuda/decode_split_kv' 35
else
  RES[memcheck]="compute-sanitizer not found"
  RES[racecheck]="compute-sanitizer not found"
fi
say "sanitizers done ($(elapsed) s)"

# ---- 4. kernel benchmark, then the PyTorch peer
if timeout 100 "$B/kvp-attn-cuda-bench" --quick --machine "$MACHINE" --csv-out "$OUTD/attention_cuda.csv" \
  --json-out "$OUTD/attention_cuda.json" >/dev/null 2>>"$LOG"; then RES[bench]="ok"; else RES[bench]="FAILED (see the log)"; status=1; fi
timeout 60 python3 bench/sdpa_peer.py --machine "$MACHINE" --commit "$COMMIT" >"$OUTD/sdpa_peer.csv" 2>>"$LOG"
case $? in 0) RES[sdpa]="ok" ;; 3) RES[sdpa]="no torch with CUDA here" ;; *) RES[sdpa]="FAILED (see the log)" ;; esac
say "bench done ($(elapsed) s)"

# ---- 5. NCCL smoke
if [ -x build/parallel/kvp-nccl-smoke ]; then
  timeout 300 build/parallel/kvp-nccl-smoke --json >"$OUTD/nccl_smoke.json" 2>>"$LOG"
  rc=$?
  RES[nccl]=$([ $rc = 0 ] && echo "passed" || echo "FAILED (rc $rc)")
  [ $rc = 0 ] || status=1
else
  RES[nccl]="not built (no nccl.h next to the toolkit)"
fi

# ---- 6. the table
col() { awk -F, -v want="$1" 'NR == 1 { for (i = 1; i <= NF; i++) h[$i] = i; next } { print $h[want] }'; }
{
  echo
  echo "== gpu_check on $MACHINE, commit $COMMIT, $(elapsed) s =="
  printf '%-16s %s\n' "emulator suite" "${RES[emulator_suite]}" "attention suite" "${RES[attention_suite]}" \
    "memcheck" "${RES[memcheck]}" "racecheck" "${RES[racecheck]}" "spills" "${RES[spills]}" "kernel bench" "${RES[bench]}" \
    "sdpa peer" "${RES[sdpa]}" "nccl smoke" "${RES[nccl]}"
  if [ -s "$OUTD/attention_cuda.csv" ]; then
    echo
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) h[$i] = i
                       printf "%-8s %-10s %-5s %5s %6s %6s %9s %8s %6s %7s %7s %5s\n", "op", "layout", "dtype", "bs", "batch", "ctx",
                              "ms", "GB/s", "%copy", "p/contig", "TFLOP/s", "valid"; next }
             { printf "%-8s %-10s %-5s %5s %6s %6s %9.4f %8.0f %6.1f %7.3f %7.1f %5s\n", $h["op"], $h["layout"], $h["dtype"],
                      $h["block_size"], $h["batch"], $h["ctx"], $h["time_ms"], $h["kv_gbps"], $h["pct_copy_bw"],
                      $h["paged_over_contig"], $h["tflops"], $h["validated"] }' "$OUTD/attention_cuda.csv"
    echo "copy bandwidth (device to device, read + write): $(col copy_gbps <"$OUTD/attention_cuda.csv" | head -1) GB/s"
  fi
  if [ -s "$OUTD/sdpa_peer.csv" ]; then echo; column -t -s, "$OUTD/sdpa_peer.csv" 2>/dev/null || cat "$OUTD/sdpa_peer.csv"; fi
} | tee -a "$LOG"
exit $status
