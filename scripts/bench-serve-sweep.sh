#!/usr/bin/env bash
# The `kvpage bench serve` runs the README quotes, on stories260K with 2 threads, into one CSV
# (default build/results/serve.csv; bench/results/serve.csv updates the committed one): 300 ShareGPT-like
# requests at 50 and 100 requests/s and all at once,
# all at once again with --stream-interval 4 and 16; 40 four-turn chats with the prefix cache and without, and
# with the cache and the server's own answers in the next turns (--answers server); the same chats through
# /v1/chat/completions and zephyr's template, with the workload's answers and the server's.
# Then the latency-throughput curve beside it (OUT_CSV's folder): serve_curve.csv and serve_curve.png, the
# same 300 requests at 25, 50, 75, 100 and 150 requests/s and all at once; and serve_sched.csv, admission
# orders under cache pressure.
# Usage: scripts/bench-serve-sweep.sh [KVPAGE_BIN] [OUT_CSV]
set -eu
bin=${1:-build/kvpage}
out=${2:-build/results/serve.csv}; mkdir -p "$(dirname "$out")"
model=../shared/models/stories260K/stories260K.gguf
sharegpt="--workload sharegpt:n=300"
chat="--workload chat:conversations=40,turns=4,system=256,user=64,assistant=96,vocab=512 --rate 40"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
: >"$out.part"
run() {
  echo "bench-serve-sweep: $*" >&2
  "$bin" bench serve --model "$model" --format csv "$@" >"$tmp"
  if [ ! -s "$out.part" ]; then head -1 "$tmp" >"$out.part"; fi
  tail -n +2 "$tmp" >>"$out.part"
}
run $sharegpt --rate 50,100,inf -- --threads 2
for iv in 4 16; do run $sharegpt --rate inf -- --threads 2 --stream-interval "$iv"; done
for cache in radix none; do run $chat -- --threads 2 --cache "$cache"; done
run $chat --answers server -- --threads 2 --cache radix
for answers in workload server; do # the chats as conversations through a chat template
  run $chat --endpoint chat --answers "$answers" -- --threads 2 --cache radix --chat-template zephyr
done
mv "$out.part" "$out"
echo "bench-serve-sweep: wrote $out" >&2
curve=$(dirname "$out")/serve_curve
echo "bench-serve-sweep: the curve" >&2
"$bin" bench serve --model "$model" --format csv $sharegpt --rate 25,50,75,100,150,inf --plot "$curve.png" \
  -- --threads 2 >"$tmp"
mv "$tmp" "$curve.csv"
echo "bench-serve-sweep: wrote $curve.csv and $curve.png" >&2
# admission order under cache pressure: 200 few-shot requests (8 tasks of 4 x 64-token examples) all at once, 160
# KV blocks, 16 running at most, FCFS against SGLang's longest-prefix-match
sched=$(dirname "$out")/serve_sched.csv
: >"$sched.part"
for pol in fcfs lpm; do
  echo "bench-serve-sweep: --sched $pol" >&2
  "$bin" bench serve --model "$model" --format csv \
    --workload fewshot:n=200,tasks=8,examples=4,example=64,question=32,output=32,vocab=512 --rate inf \
    -- --threads 2 --num-blocks 160 --max-num-seqs 16 --sched "$pol" >"$tmp"
  if [ ! -s "$sched.part" ]; then head -1 "$tmp" >"$sched.part"; fi
  tail -n +2 "$tmp" >>"$sched.part"
done
mv "$sched.part" "$sched"
echo "bench-serve-sweep: wrote $sched" >&2
