#!/usr/bin/env bash
# n-gram speculative decoding against plain decoding, greedy, into one CSV (default
# build/results/generate_spec.csv; bench/results/generate_spec.csv updates the committed one): stories260K
# (256 tokens a sequence, 1 and 64 sequences) off, with 2 and 4
# draft tokens, and with 4 and disable_by_batch_size 8 (the batch of 64 then does not speculate); a synthetic
# 23.5M-parameter model (scripts/synth-model.py, written to /tmp when missing; 64 tokens, 1 and 16 sequences)
# off, and with 4 and 8. Its random weights repeat a token, so nearly every draft is kept: the bound of what
# speculation gives a model whose decode reads its weights. Then serve_spec.csv (below).
# Usage: scripts/bench-spec.sh [KVPAGE_BIN] [OUT_CSV]
set -eu
bin=${1:-build/kvpage}
out=${2:-build/results/generate_spec.csv}; mkdir -p "$(dirname "$out")"
synth=/tmp/kvp-synth-23.5M
[ -f "$synth/model.safetensors" ] || python3 "$(dirname "$0")/synth-model.py" "$synth"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
: >"$out.part"
spec() { echo "{\"method\":\"ngram\",\"num_speculative_tokens\":$1,\"prompt_lookup_max\":3,\"prompt_lookup_min\":2}"; }
run() {
  echo "bench-spec: $*" >&2
  "$bin" bench generate --format csv --temperature 0 "$@" >"$tmp"
  if [ ! -s "$out.part" ]; then head -1 "$tmp" >"$out.part"; fi
  tail -n +2 "$tmp" >>"$out.part"
}
run --reps 5
for k in 2 4; do run --reps 5 --speculative-config "$(spec $k)"; done
run --reps 5 --speculative-config "$(spec 4 | sed 's/}$/,"disable_by_batch_size":8}/')"
run --model "$synth" --max-tokens 64 --batch 16 --reps 3
for k in 4 8; do run --model "$synth" --max-tokens 64 --batch 16 --reps 3 --speculative-config "$(spec $k)"; done
mv "$out.part" "$out"
echo "bench-spec: wrote $out" >&2

# The same through `kvpage serve` under load (bench serve, 2 threads), beside it in serve_spec.csv: 30 requests
# of 96 prompt and 64 output tokens at 4 and 16 requests/s and all at once on the synthetic model, 100 of 128
# output tokens at 50/s and all at once on stories260K; off, and with 4 drafts.
sout="$(dirname "$out")/serve_spec.csv"
: >"$sout.part"
serve() {
  echo "bench-spec: serve $*" >&2
  "$bin" bench serve --format csv "$@" >"$tmp"
  if [ ! -s "$sout.part" ]; then head -1 "$tmp" >"$sout.part"; fi
  tail -n +2 "$tmp" >>"$sout.part"
}
for s in "" "$(spec 4)"; do
  serve --model "$synth" --workload system:n=30,prefix=64,suffix=32,output=64,vocab=512 --rate 4,16,inf -- \
    --threads 2 ${s:+--speculative-config "$s"}
  serve --model ../shared/models/stories260K/stories260K.gguf \
    --workload system:n=100,prefix=64,suffix=32,output=128,vocab=512 --rate 50,inf -- --threads 2 \
    ${s:+--speculative-config "$s"}
done
mv "$sout.part" "$sout"
echo "bench-spec: wrote $sout" >&2
