#!/usr/bin/env bash
# The main job of `make run`: the KV memory-utilization benchmark in the PagedAttention paper's setting
# (its Figure 2), then the memory plan of that setting. Results go to build/results/ (results/ beside the
# program); nothing in the source tree changes (`git status` stays clean).
set -eu
bin=${1:-build/kvpage}
out=$(dirname "$bin")/results
cat >&2 <<MSG
== kvpage bench memory: how much of the KV cache holds real tokens ==
OPT-13B on one A100-40G (12 GB left for KV, 800 KB per token), 1000 ShareGPT-like requests, replayed
through the real scheduler and block manager on a cost model. One row per allocation strategy:
Orca-Max / Orca-Pow2 / Orca-Oracle reserve contiguous memory per request (max length, next power of two,
exact final length); paged-B allocates blocks of B tokens on demand. Columns are time-averaged shares of
the KV memory: token_states (holds a token), reserved (reserved, not yet written), internal_frag (unused
tail of a block or reservation), external_frag (free arena holes too small to use), free; mean_running is
the batch size the memory allowed; rejected counts requests that can never fit the KV memory. All columns
(util_in_use = token_states / (1 - free), throughput, ...): --wide, or $out/memory.csv and memory.json;
the plot: $out/memory.png.
MSG
"$bin" bench memory
echo >&2
echo "== kvpage plan: the same model and GPU ==" >&2
"$bin" plan --config ../shared/data/configs/derived/opt-13b.json --gpu A100-40G --seq-len 2048
