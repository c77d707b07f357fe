#!/usr/bin/env bash
# The main job of `make run`. Until the memory benchmark lands it runs the memory planner on a real
# model config and explains what it shows.
set -eu
bin=${1:-build/kvpage}
cfg=../shared/data/configs/Meta-Llama-3.1-8B.json
cat >&2 <<MSG
== kvpage plan: Llama-3.1-8B on one H200, BF16 weights and KV cache, 8192-token sequences ==
The planner reads the model's Hugging Face config.json, counts its parameters, and reports the bytes of
weights, the KV bytes per token (2 x layers x kv_heads x head_dim x bytes per element), how many KV blocks of
16 tokens fit in 90 % of the GPU after weights and an activation reserve, and how many 8192-token sequences
can be resident at once.
MSG
"$bin" plan --config "$cfg" --gpu H200 --seq-len 8192
