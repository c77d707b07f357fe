#!/usr/bin/env bash
# tests/attention/cuda_resources.sh — the compile gate on the CUDA attention kernels' resources: prints, per
# architecture and kernel, registers, stack, shared and local memory (cuobjdump --dump-resource-usage of the
# nvcc-built library), then fails if any decode or prefill kernel for head_dim >= 64 uses local memory or a
# stack (register spills). Exit 77 (CTest: skipped) without cuobjdump or without the library (no nvcc).
# Usage: tests/attention/cuda_resources.sh LIBRARY [CUOBJDUMP]
set -uo pipefail
LIB=${1:-}
OBJDUMP=${2:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
if [ -z "$LIB" ] || [ ! -f "$LIB" ]; then echo "cuda_resources: no nvcc-built library ($LIB): skipped"; exit 77; fi
if [ ! -x "$OBJDUMP" ]; then echo "cuda_resources: cuobjdump not found: skipped"; exit 77; fi
FILT=$(command -v c++filt || echo cat)
report=$("$OBJDUMP" --dump-resource-usage "$LIB" 2>&1) || { echo "$report"; exit 1; }
rows=$(awk '
  /^arch = / { arch = $3 }
  /Function / { f = $2; sub(/:$/, "", f) }
  /REG:/ { reg = stk = shm = loc = "?"
           for (i = 1; i <= NF; i++) { split($i, kv, ":"); if (kv[1] == "REG") reg = kv[2]; if (kv[1] == "STACK") stk = kv[2];
                                       if (kv[1] == "SHARED") shm = kv[2]; if (kv[1] == "LOCAL") loc = kv[2] }
           print arch, f, reg, stk, shm, loc }' <<<"$report")
[ -n "$rows" ] || { echo "cuda_resources: no kernels found in $LIB"; exit 1; }
printf '%-7s %-44s %5s %6s %7s %6s\n' arch kernel regs stack shared local
bad=0
while read -r arch f reg stk shm loc; do
  name=$("$FILT" <<<"$f" | sed -E 's/\(.*//; s/kvp_attn_cuda::\(anonymous namespace\):://; s/\(anonymous namespace\):://')
  printf '%-7s %-44s %5s %6s %7s %6s\n' "$arch" "${name:0:44}" "$reg" "$stk" "$shm" "$loc"
  if [[ $f =~ (decode|prefill|prefill_tc)_kernelILi(64|80|96|128|256)E ]] && { [ "$loc" != 0 ] || [ "$stk" != 0 ]; }; then
    echo "  ^ spills: a decode/prefill kernel for head_dim >= 64 uses local memory or a stack"
    bad=1
  fi
done <<<"$rows"
n=$(grep -cE '(decode|prefill|prefill_tc)_kernelILi(64|80|96|128|256)E' <<<"$rows")
echo "cuda_resources: $n decode/prefill kernels for head_dim >= 64 checked, $( [ $bad = 0 ] && echo none spills || echo SOME SPILL )"
[ "$n" -gt 0 ] || { echo "cuda_resources: no decode/prefill kernel found"; exit 1; }
exit $bad
