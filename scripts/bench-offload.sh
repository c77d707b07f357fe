#!/usr/bin/env bash
# The prefix cache's host tier (--kv-offloading-size / --host-capacity), into build/results/ (or OUT_DIR;
# bench/results updates the committed figures):
#   prefix_host_mooncake.csv  bench prefix: the Mooncake synthetic trace, blocks of 512 tokens, device caches of
#                             2,000 / 4,000 / 8,000 blocks with no host tier and host tiers of 8,000 and 32,000,
#                             each written through, written back and written through selectively
#   prefix_host_chat.csv      the same on the default chat workload, blocks of 16, device 209 / 418 / 836 blocks
#                             (836 = the one in the README), host 0 / 836 / 1,672 / 3,344
#   simulate_offload.csv      kvpage simulate, Llama-3.1-8B on one H200 (cost model): a chat of 200
#                             conversations at 20 req/s in 2 GB of KV with 0 / 4 / 16 / 64 GiB of host tier,
#                             and the first 1,000 Mooncake requests in 8 GB of KV with 0 / 32 / 128 GiB, each
#                             tier written through, written back and written through selectively
# Usage: scripts/bench-offload.sh [KVPAGE_BIN] [OUT_DIR]
set -eu
bin=${1:-build/kvpage}
out=${2:-build/results}; mkdir -p "$out"
cfg=../shared/data/configs/Meta-Llama-3.1-8B.json
mooncake=../shared/data/traces/mooncake/synthetic_trace.jsonl

"$bin" bench prefix --trace "mooncake:$mooncake" --block-size 512 --capacity 2000,4000,8000 \
    --host-capacity 0,8000,32000 --host-write-policy write_through,write_back,write_through_selective \
    --out "$out" --name prefix_host_mooncake --format csv >/dev/null
"$bin" bench prefix --workload chat --capacity 209,418,836 --host-capacity 0,836,1672,3344 \
    --host-write-policy write_through,write_back,write_through_selective --out "$out" --name prefix_host_chat --format csv >/dev/null

csv="$out/simulate_offload.csv"
keys="sim_duration_s throughput_tok_s ttft_p50_s ttft_p99_s tpot_p50_s prefix_hit_rate prefix_host_hit_rate host_loaded_blocks host_stored_blocks host_store_backlog_max_s host_store_sync_s preemptions"
echo "workload,kv_mem,offload,policy,${keys// /,}" >"$csv.part"
sim() { # workload-args kv-mem offload label [policy]
  local pol=${5:-write_through} polarg=
  if [ "$3" != 0 ]; then polarg="--kv-offloading-policy $pol"; else pol=none; fi
  echo "bench-offload: simulate $4 --kv-mem $2 --kv-offloading-size $3 $polarg" >&2
  "$bin" simulate --model "$cfg" --gpu H200 $1 --cache radix --kv-mem "$2" --kv-offloading-size "$3" $polarg --json |
    python3 -c 'import json, sys
d = json.load(sys.stdin)
print(",".join(sys.argv[1:5] + ["%.6g" % d[k] for k in sys.argv[5].split()]))' \
      "$4" "$2" "$3" "$pol" "$keys" >>"$csv.part"
}
sim "--workload chat:conversations=200,rate=20" 2GB 0 chat200
for off in 4GiB 16GiB 64GiB; do
  for pol in write_through write_back write_through_selective; do sim "--workload chat:conversations=200,rate=20" 2GB $off chat200 $pol; done
done
sim "--trace $mooncake --num-requests 1000" 8GB 0 mooncake1000
for off in 32GiB 128GiB; do
  for pol in write_through write_back write_through_selective; do sim "--trace $mooncake --num-requests 1000" 8GB $off mooncake1000 $pol; done
done
mv "$csv.part" "$csv"
echo "bench-offload: wrote $out/prefix_host_mooncake.csv, $out/prefix_host_chat.csv, $csv" >&2
