/* runtime/planner/planner.h — the memory planner behind `kvpage plan`: the seed article's formulas.
 *
 *   weights_bytes        = params x bytes per weight                      (7B in BF16 -> 14 GB)
 *   kv_bytes_per_token   = 2 x layers x kv_heads x head_dim x bytes       (all layers, full attention;
 *                          MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes)
 *   kv_bytes_per_seq     = sum over layers of min(seq_len, window of that layer) x per-layer bytes
 *   kv_bytes_total       = num_seqs x kv(seq_len) - (num_seqs - 1) x kv(shared_prefix)  (prefix stored once)
 *   block_bytes          = block_size x kv_bytes_per_token
 *   kv_budget            = gpu_mem x gpu_util - weights - activation reserve   (per tensor-parallel rank)
 *   num_blocks           = floor(kv_budget / block_bytes of one rank)
 *   max_concurrent_seqs  = floor(kv_budget / paged bytes of one sequence), a sequence taking whole blocks
 *                          in each layer (sliding layers only the blocks of their window); with a shared
 *                          prefix 1 + floor((kv_budget - paged) / (paged - the prefix's full blocks)), as
 *                          kv_bytes_total stores the prefix once
 *   train_bytes          = 16 x params (mixed-precision AdamW: 2 weights + 2 grads + 4 master + 4 m + 4 v)
 *   lora_train_bytes     = bytes-per-weight x params + 16 x LoRA params (rank r adapters on q, k, v, o)
 *
 * Tensor parallelism (Megatron): a rank holds 1/tp of the weights (norms replicated) and max(1, kv_heads /
 * tp) KV heads; with tp > kv_heads each KV head is on tp / kv_heads ranks (as vLLM does), and an MLA latent
 * cache on all (kv_replicas = tp). The whole-model column's KV figures are tp x the per-rank ones, every
 * replica counted (planner.c says why); one copy is kv_bytes_per_token / kv_replicas. The activation reserve,
 * unless given, is an estimate (planner.c). Sizes past int64_t are KVP_EINVAL naming the option, never
 * wrapped; the config loader bounds the model's fields (loader/model_config.h).
 */
#ifndef KVP_RUNTIME_PLANNER_H
#define KVP_RUNTIME_PLANNER_H

#include <stdint.h>

#include "runtime/loader/model_config.h"

/* Bytes per element of a dtype named as everywhere else in kvpage: "f32", "f16", "bf16", "fp8", "int8", or the
 * aliases "fp32", "fp16", "float32", "float16", "bfloat16", "fp8_e4m3"; *canonical (may be NULL) the first
 * spelling (a static string). KVP_EINVAL naming it otherwise, nothing written. */
kvp_status kvp_plan_dtype_parse(const char *name, const char **canonical, double *bytes);
/* kvp_plan_dtype_parse without the name. */
kvp_status kvp_dtype_bytes(const char *name, double *bytes);

typedef struct {
    int64_t gpu_mem_bytes;      /* memory of one GPU */
    double gpu_util;            /* fraction the runtime may use, (0, 1] */
    double weight_bytes;        /* bytes per weight element */
    double kv_bytes;            /* bytes per KV element */
    int32_t block_size;         /* tokens per KV block */
    int64_t seq_len;            /* tokens cached per sequence */
    int64_t num_seqs;           /* sequences for kv_bytes_total */
    int32_t tp;                 /* tensor-parallel ranks */
    int64_t shared_prefix;      /* tokens shared by all sequences, stored once; <= seq_len */
    int64_t activation_reserve; /* bytes per rank; < 0: estimate */
    int32_t max_batched_tokens; /* tokens per step, for the activation estimate */
    int32_t lora_rank;          /* for lora_train_bytes */
} kvp_plan_params;

typedef struct {
    int64_t weights_bytes;
    int64_t kv_bytes_per_token;
    int64_t kv_bytes_per_seq;
    int64_t kv_bytes_total;
    int64_t block_bytes;
    int64_t activation_bytes;
    int64_t kv_budget_bytes;   /* may be negative when the weights do not fit */
    int64_t num_blocks;        /* 0 when the budget is negative */
    int64_t max_concurrent_seqs;
} kvp_plan_figures;

typedef struct {
    int64_t params;
    kvp_plan_figures total;    /* all ranks, KV replicas included; blocks and seqs as one rank sees them */
    kvp_plan_figures per_rank;
    int32_t kv_replicas;       /* ranks holding a copy of each KV head (MLA: tp); 1 when tp <= kv_heads */
    int64_t train_bytes;
    int64_t lora_params;
    int64_t lora_train_bytes;
} kvp_plan;

/* util 0.9, bf16 weights and KV, block 16, seq_len the model's context (or 4096), 1 sequence, tp 1, no
 * prefix, estimated reserve, 2048 batched tokens, LoRA rank 16. */
void kvp_plan_params_default(const kvp_model_config *cfg, kvp_plan_params *p);

/* KVP_EINVAL naming the option for impossible parameters (tp not dividing the heads, a prefix longer than
 * a sequence, sizes <= 0, util outside (0,1], element bytes outside (0, 8]) or figures over 2^63 bytes;
 * *out only written on success. Weights that do not fit give a plan with a negative budget. */
kvp_status kvp_plan_compute(const kvp_model_config *cfg, const kvp_plan_params *p, kvp_plan *out);

/* One copy's (tp 1) KV bytes for a sequence of n tokens, windows honoured; INT64_MAX past 2^63. */
int64_t kvp_plan_kv_bytes_for_tokens(const kvp_model_config *cfg, int64_t n, double kv_bytes);

#endif
