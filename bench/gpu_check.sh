#!/usr/bin/env bash
# bench/gpu_check.sh — the one prepared command for a machine with an NVIDIA GPU. Needs only what such a
# machine has (nvcc, gcc, the CUDA libraries, the driver; NCCL and PyTorch where present): no apt-get, no
# network. It
#   1. builds, for sm_90 only (KVP_GPU_ARCH to change), just what it runs: the CUDA attention kernels, the CPU
#      kernels they are checked against, the two CUDA suites with the standalone test runner (no Criterion),
#      the standalone kernel benchmark (no cJSON), kvp-nccl-smoke, and the kernels' resource report; then starts
#      building the kvpage program for step 6 in the background (CMake, KVPAGE_CUDA=ON; it needs the project's
#      libraries: cJSON, xxHash, OpenBLAS, libmicrohttpd, PCRE2, libcurl, jemalloc; KVPAGE_BIN=PATH gives a
#      kvpage built elsewhere instead, KVPAGE_BUNDLE=FILE.tar.xz one packed with its libraries by
#      bench/gpu_bundle.sh);
#   2. runs the suites natively (tests/cuda/test_emulator.cu: the emulator's semantics on real hardware;
#      tests/attention/test_attn_cuda.c: every kernel against the CPU kernels and float64 references) and fails
#      when a suite fails, skips anything, or runs nothing;
#   3. compute-sanitizer memcheck and racecheck on the attention suite where the tool exists (bounded);
#   4. the kernel benchmark (--quick: the issue's target rows), then the PyTorch SDPA peer (bench/sdpa_peer.py);
#   5. the 1-rank NCCL smoke (kvp-nccl-smoke --json) where NCCL is found;
#   6. end to end, within E2E_BUDGET seconds (default 240, the build's wait not counted): stories260K's golden
#      story token for token through `kvpage generate --device cuda` (graph buckets and --enforce-eager); the
#      cuda executor's suites natively (runtime_test_cuda_exec, runtime_test_cuda_moe, built beside kvpage);
#      a Llama-3.1-8B-shaped model with random bf16 weights (`kvpage simulate --executor cuda
#      --random-weights`, ../shared/data/configs/Meta-Llama-3.1-8B.json) at batch 1, 16, 64, 256 with
#      1,024-token prompts and 64 new tokens, graphs on and --enforce-eager (and --deterministic at batch 1 and
#      16), a 4,096-token prefill, and a Qwen3-30B-A3B-shaped MoE at batch 1 and 64 (no peer); the same
#      shape through Hugging Face transformers + PyTorch (bench/hf_peer.py) as the peer; then
#      bench/gpu_e2e.py's table (e2e_<machine>.csv) and ratios: the 8B memory split, batch-64 decode over
#      transformers', single-stream decode over its bandwidth bound, the 4,096-token prefill over the bf16 peak
#      (KVP_PEAK_TFLOPS, default 989: H200 dense). A part that cannot run says FAIL and why; the rest go on;
#   7. prints a short table last.
# Files (at most 7) in OUT_DIR (default $OUT, else bench/results): gpu_check.log, attention_cuda.csv,
# attention_cuda.json, sdpa_peer.csv, nccl_smoke.json, cuda_resources.txt, e2e_<machine>.csv (the runs'
# own outputs stay in $KVP_GPU_BUILD/e2e). Exit 0 only when every step that could run passed. Aims at under 8
# minutes on an H200 machine (16 cores). The stories260K model and the configs are read from KVP_SHARED
# (default: shared/ in the checkout if it holds models/stories260K, else ../shared).
# Usage: bench/gpu_check.sh [--build-only | --e2e-only | --e2e-dry-run] [OUT_DIR]   (from the repository root)
#   --build-only   step 1's compiles and links only, no GPU needed: a check of this script on a machine with
#                  nvcc but no device
#   --e2e-only     steps 1 and 6 only (a rerun of the end-to-end part)
#   --e2e-dry-run  no GPU: step 6's plumbing with stand-ins, on any machine with a kvpage build (KVPAGE_BIN,
#                  default build/kvpage): `generate --device cpu` and `simulate --executor sim` (the cost model:
#                  simulated times, labelled kvpage-sim-dry-run, never a measurement); writes e2e_dry_run.csv
set -uo pipefail
T0=$(date +%s)
BUILD_ONLY=0 E2E_ONLY=0 DRY=0
case "${1:-}" in
--build-only) BUILD_ONLY=1; shift ;;
--e2e-only) E2E_ONLY=1; shift ;;
--e2e-dry-run) DRY=1; shift ;;
-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
-*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
OUTD=${1:-${OUT:-bench/results}}
B=${KVP_GPU_BUILD:-build-gpu}
ARCH=${KVP_GPU_ARCH:-90}
mkdir -p "$OUTD" "$B/obj"
LOG="$OUTD/gpu_check.log"
: >"$LOG"
say() { echo "gpu_check: $*" | tee -a "$LOG" >&2; }
elapsed() { echo $(($(date +%s) - T0)); }
declare -A RES
E2E=$B/e2e
SHARED=${KVP_SHARED:-}
if [ -z "$SHARED" ]; then
  if [ -d shared/models/stories260K ]; then SHARED=shared; else SHARED=../shared; fi
fi
CFG8B=$SHARED/data/configs/Meta-Llama-3.1-8B.json
CFGMOE=$SHARED/data/configs/Qwen3-30B-A3B.json
S260=$SHARED/models/stories260K
E2E_BATCHES="1 16 64 256"
SUITES="runtime_test_cuda_exec runtime_test_cuda_moe" # the cuda executor's suites, natively in step 6
E2E_PROMPT=1024
E2E_NEW=64

# ---- 6. end to end: functions (run after step 5, alone with --e2e-only, or with stand-ins by --e2e-dry-run)
KV=${KVPAGE_BIN:-}
KV_PID=
# kvpage with nvcc, in the background (nice: the GPU steps meanwhile time the device, not the host); the build
# is bounded, and timeout ends the whole tree of make and nvcc with it.
kvpage_build_start() {
  if [ -z "$KV" ] && [ -n "${KVPAGE_BUNDLE:-}" ]; then # bench/gpu_bundle.sh's: kvpage with its libraries
    rm -rf "$B/bundle" && mkdir -p "$B/bundle" && tar -C "$B/bundle" -xJf "$KVPAGE_BUNDLE" >>"$LOG" 2>&1 ||
      say "cannot unpack KVPAGE_BUNDLE=$KVPAGE_BUNDLE"
    KV=$B/bundle/kvpage/kvpage
  fi
  [ -n "$KV" ] && return
  KV=$B/kvpage/kvpage
  (
    command -v cmake >/dev/null || { echo "no cmake on this machine"; exit 1; }
    timeout 90 nice -n 10 cmake -S . -B "$B/kvpage" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_CUDA=ON -DKVPAGE_WERROR=OFF &&
      timeout 420 nice -n 10 cmake --build "$B/kvpage" --target kvpage -j "$(nproc)" || exit
    # the executor's native suites (standalone runner), for step 6; kvpage stands without them
    timeout 240 nice -n 10 cmake --build "$B/kvpage" --target $SUITES -j "$(nproc)" >"$B/suites_build.log" 2>&1 || true
  ) >"$B/kvpage_build.log" 2>&1 &
  KV_PID=$!
}
# Waits for that build (in this shell: the build is its child); WHY="" when $KV is a kvpage that can run the
# cuda executor, else why not.
kvpage_ready() {
  WHY=
  if [ -n "$KV_PID" ]; then
    say "waiting for the kvpage build ($(elapsed) s)"
    wait "$KV_PID"
    local rc=$?
    KV_PID=
    if [ $rc != 0 ]; then
      WHY="kvpage did not build (rc $rc): $(grep -m1 -E "No package '|Could NOT find|CMake Error|error:|no cmake" \
        "$B/kvpage_build.log" | cut -c1-160) (see $B/kvpage_build.log; or give KVPAGE_BIN)"
      return
    fi
  fi
  # the program itself: a bundle's wrapper (bench/gpu_bundle.sh) runs bin/kvpage with lib/ first
  local elf=$KV libs=${LD_LIBRARY_PATH:-}
  if [ -x "$(dirname "$KV")/bin/kvpage" ]; then
    elf=$(dirname "$KV")/bin/kvpage libs=$(dirname "$KV")/lib:${CUDA:-/usr/local/cuda}/lib64:$libs
  fi
  if [ ! -x "$KV" ]; then
    WHY="no kvpage at $KV"
  elif [ $DRY = 0 ] && ! LD_LIBRARY_PATH=$libs ldd "$elf" 2>/dev/null | grep -q libcublas; then
    WHY="$KV was built without nvcc (it links the no-device layer: no cuBLAS)"
  elif LD_LIBRARY_PATH=$libs ldd "$elf" 2>/dev/null | grep -q 'not found'; then
    WHY="$KV misses libraries here: $(LD_LIBRARY_PATH=$libs ldd "$elf" | grep 'not found' | tr -s ' \t\n' ' ' | cut -c1-160)"
  fi
}
E2E_END=0
left() { echo $((E2E_END - $(date +%s))); }
# run_bounded NAME CAP CMD...: stdout to $E2E/NAME.json, stderr to $E2E/NAME.err, at most CAP seconds and what
# is left of E2E_BUDGET; returns the command's status (124: timed out or no time left).
run_bounded() {
  local name=$1 cap=$2 t
  shift 2
  t=$(left)
  [ "$t" -lt "$cap" ] && cap=$t
  if [ "$cap" -lt 10 ]; then
    echo "not run: no time left of E2E_BUDGET=${E2E_BUDGET:-240} s" >"$E2E/$name.err"
    return 124
  fi
  timeout "$cap" "$@" >"$E2E/$name.json" 2>"$E2E/$name.err"
  local rc=$?
  [ $rc = 124 ] && echo "timed out after $cap s" >>"$E2E/$name.err"
  return $rc
}
last_err() { grep -v '^$' "$E2E/$1.err" 2>/dev/null | tail -1 | cut -c1-200; }
e2e() {
  rm -rf "$E2E" && mkdir -p "$E2E"
  local dev_gen eager_gen exec_sim engine slug
  kvpage_ready
  E2E_END=$(($(date +%s) + ${E2E_BUDGET:-240}))
  if [ $DRY = 1 ]; then
    dev_gen="--device cpu" exec_sim="--executor sim --gpu H200" engine=kvpage-sim-dry-run slug=dry_run
  else
    dev_gen="--device cuda --kv-cache-memory 64MiB" exec_sim="--executor cuda --random-weights" engine=kvpage
    slug=$(echo "${GPU%%,*}" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
  fi
  RES[e2e_csv]="$OUTD/e2e_${slug:-gpu}.csv"
  if [ -n "$WHY" ]; then
    RES[kvpage]="FAIL: $WHY"
    status=1
  else
    RES[kvpage]="$KV"
    # the golden story, token for token, with graph buckets and eagerly
    for mode in graphs eager; do
      eager_gen=
      [ $mode = eager ] && [ $DRY = 0 ] && eager_gen=--enforce-eager
      # shellcheck disable=SC2086 # the option lists split on purpose
      if run_bounded "golden_$mode" 60 "$KV" generate --model "$S260/stories260K.gguf" $dev_gen $eager_gen \
        --prompt "Once upon a time" --max-tokens 60 --ignore-eos --json; then
        if out=$(python3 bench/gpu_e2e.py golden "$E2E/golden_$mode.json" "$S260/golden.json" 2>&1); then
          RES[golden_$mode]="ok: $out equal to golden.json"
        else
          RES[golden_$mode]="FAIL: $out"
          status=1
        fi
      else
        RES[golden_$mode]="FAIL: $(last_err "golden_$mode")"
        status=1
      fi
    done
    say "golden stories done ($(elapsed) s)"
    # the executor's suites on the device (kernels against the CPU ops, MoE against float64, --deterministic's
    # invariance, graphs against eager), from a folder whose ../shared is $SHARED (they read ../shared/...)
    local s bin
    mkdir -p "$B/suites/root" && ln -sfn "$(cd "$SHARED" && pwd)" "$B/suites/shared"
    for s in $SUITES; do
      bin=$(cd "$(dirname "$KV")" 2>/dev/null && pwd)/tests/$s
      if [ $DRY = 1 ]; then
        RES[$s]="not run (dry run: no device)"
      elif [ ! -x "$bin" ] && [ "$KV" != "$B/kvpage/kvpage" ]; then
        RES[$s]="not run (no suites beside $KV: they are built with kvpage here only)"
      elif [ ! -x "$bin" ]; then
        RES[$s]="FAIL: not built ($(grep -m1 -E 'error|Error' "$B/suites_build.log" 2>/dev/null | cut -c1-120))"
        status=1
      else
        run_bounded "$s" 90 sh -c "cd '$B/suites/root' && exec '$bin'"
        local rc=$? syn
        syn=$(grep -m1 'Synthesis' "$E2E/$s.json" | sed 's/.*Synthesis: //')
        if [ $rc = 0 ] && echo "$syn" | grep -q 'Failing: 0 | Skipped: 0'; then
          RES[$s]="ok: $syn"
        else
          RES[$s]="FAIL (rc $rc): ${syn:-$(last_err "$s")}; $(grep -m1 '^\[----\]' "$E2E/$s.json" | cut -c1-160)"
          status=1
        fi
      fi
    done
    say "native executor suites done ($(elapsed) s)"
    # the 8B shape: most telling runs first, so that a short budget still gives the ratios
    # (--deterministic at batch 16, not 64: its tiled GEMMs have no tensor cores, and 64 prompts of 1,024 tokens
    # would take minutes to prefill)
    local runs="1:graphs 64:graphs prefill hf 1:eager 64:eager 16:graphs 1:det 16:det moe1:graphs moe64:graphs
                256:graphs 16:eager 256:eager" r b mode cfg name
    for r in $runs; do
      if [ "$r" = hf ]; then
        run_bounded hf_peer 200 python3 bench/hf_peer.py --config "$CFG8B" --batch "${E2E_BATCHES// /,}" \
          --prompt-len $E2E_PROMPT --new-tokens $E2E_NEW --machine "$MACHINE" --commit "$COMMIT"
        # exit 3: no torch, transformers or device (its one line says which); a batch that failed is its own row
        if [ $? = 0 ]; then RES[hf]="ok (rows per batch in the table)"; else RES[hf]="FAIL: $(last_err hf_peer)"; fi
        say "transformers peer done ($(elapsed) s)"
        continue
      fi
      if [ "$r" = prefill ]; then
        python3 bench/gpu_e2e.py trace "$E2E/trace_p4096.jsonl" --requests 2 --prompt-len 4096 --new-tokens 2
        # shellcheck disable=SC2086
        run_bounded prefill4096 60 "$KV" simulate $exec_sim --model "$CFG8B" --trace "$E2E/trace_p4096.jsonl" \
          --rate inf --cache none --max-num-seqs 1 --max-batched-tokens 4096 --max-model-len 8192 --json \
          --steps-out "$E2E/prefill4096.steps.csv" || { [ $? = 124 ] || status=1; }
        continue
      fi
      # no chunked prefill: every prompt computed (8 a step) before the batch decodes together, so that N - 1
      # steps decode all B sequences (chunked, the first ones would finish before the last ones start)
      # det: --deterministic (tiled GEMMs, rowwise attention); moe<B>: the Qwen3-30B-A3B shape
      b=${r%%:*} mode=${r##*:} cfg=$CFG8B name=
      case $b in moe*) b=${b#moe} cfg=$CFGMOE name=sim_moe_b${b}_$mode ;; esac
      name=${name:-sim_b${b}_$mode}
      [ -f "$E2E/trace_b$b.jsonl" ] ||
        python3 bench/gpu_e2e.py trace "$E2E/trace_b$b.jsonl" --requests "$b" --prompt-len $E2E_PROMPT --new-tokens $E2E_NEW
      eager_gen=
      [ "$mode" = eager ] && [ $DRY = 0 ] && eager_gen=--enforce-eager
      [ "$mode" = det ] && [ $DRY = 0 ] && eager_gen=--deterministic
      # shellcheck disable=SC2086
      run_bounded "$name" 120 "$KV" simulate $exec_sim $eager_gen --model "$cfg" \
        --trace "$E2E/trace_b$b.jsonl" --rate inf --cache none --max-num-seqs "$b" --max-batched-tokens 8192 \
        --no-chunked-prefill --max-model-len 8192 --json \
        --steps-out "$E2E/$name.steps.csv" || { [ $? = 124 ] || status=1; }
      say "$(basename "$cfg" .json)-shaped batch $b ($mode) done ($(elapsed) s)"
    done
  fi
  local copy=
  [ -s "$OUTD/attention_cuda.csv" ] && copy=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "copy_gbps") c = i; next }
                                                    c && $c + 0 > 0 { print $c; exit }' "$OUTD/attention_cuda.csv")
  python3 bench/gpu_e2e.py report --dir "$E2E" --out "${RES[e2e_csv]}" --config "$CFG8B" --batches "${E2E_BATCHES// /,}" \
    --moe-config "$CFGMOE" \
    --prompt-len $E2E_PROMPT --new-tokens $E2E_NEW --engine $engine --machine "$MACHINE" --commit "$COMMIT" \
    --peak-tflops "${KVP_PEAK_TFLOPS:-989}" ${copy:+--copy-gbps "$copy"} >"$E2E/report.txt" 2>&1 ||
    echo "FAIL: bench/gpu_e2e.py report failed" >>"$E2E/report.txt"
  say "end to end done ($(elapsed) s)"
}
e2e_table() {
  printf '%-16s %s\n' "kvpage" "${RES[kvpage]:-not run}" "golden (graphs)" "${RES[golden_graphs]:-not run}" \
    "golden (eager)" "${RES[golden_eager]:-not run}" "cuda_exec suite" "${RES[runtime_test_cuda_exec]:-not run}" \
    "cuda_moe suite" "${RES[runtime_test_cuda_moe]:-not run}" "transformers" "${RES[hf]:-not run}" \
    "e2e table" "${RES[e2e_csv]}"
  echo
  cat "$E2E/report.txt" 2>/dev/null
}

if [ $DRY = 1 ]; then # no GPU, no nvcc: step 6 with stand-ins
  [ -z "$KV" ] && [ -n "${KVPAGE_BUNDLE:-}" ] && kvpage_build_start # unpacks the bundle
  KV=${KV:-build/kvpage}
  MACHINE="dry run (no GPU): $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo "-dirty")
  GPU=
  status=0
  say "dry run of the end-to-end part with $KV: cost-model times, not measurements"
  e2e
  { echo; echo "== gpu_check --e2e-dry-run on $MACHINE, commit $COMMIT, $(elapsed) s (simulated times) =="; e2e_table; } | tee -a "$LOG"
  exit $status
fi

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { say "no nvcc"; exit 2; }
CUDA=$(cd "$(dirname "$NVCC")/.." && pwd)
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || [ $BUILD_ONLY = 1 ] || {
  say "no GPU visible to nvidia-smi: nothing to run here (--build-only checks the build, --e2e-dry-run the end-to-end plumbing)"
  exit 2
}
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
kvpage_build_start # for step 6, while the GPU steps run
status=0
if [ $E2E_ONLY = 0 ]; then
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
fi # E2E_ONLY

# ---- 6. end to end
e2e

# ---- 7. the table
col() { awk -F, -v want="$1" 'NR == 1 { for (i = 1; i <= NF; i++) h[$i] = i; next } { print $h[want] }'; }
{
  echo
  echo "== gpu_check on $MACHINE, commit $COMMIT, $(elapsed) s =="
  printf '%-16s %s\n' "emulator suite" "${RES[emulator_suite]:-not run}" "attention suite" "${RES[attention_suite]:-not run}" \
    "memcheck" "${RES[memcheck]:-not run}" "racecheck" "${RES[racecheck]:-not run}" "spills" "${RES[spills]:-not run}" \
    "kernel bench" "${RES[bench]:-not run}" "sdpa peer" "${RES[sdpa]:-not run}" "nccl smoke" "${RES[nccl]:-not run}"
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
  echo
  echo "-- end to end"
  e2e_table
} | tee -a "$LOG"
exit $status
