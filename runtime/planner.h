/* runtime/planner.h — the memory planner behind `kvpage plan`: the seed article's formulas.
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
 *                          in each layer (sliding layers only the blocks of their window)
 *   train_bytes          = 16 x params (mixed-precision AdamW: 2 weights + 2 grads + 4 master + 4 m + 4 v)
 *   lora_train_bytes     = bytes-per-weight x params + 16 x LoRA params (rank r adapters on q, k, v, o)
 *
 * Tensor parallelism (Megatron): each rank holds 1/tp of the weights (norms replicated) and
 * max(1, kv_heads / tp) KV heads (replicated when tp > kv_heads); an MLA latent cache is replicated on
 * every rank. The activation reserve, unless given, is an estimate documented in planner.c.
 */
#ifndef KVP_RUNTIME_PLANNER_H
#define KVP_RUNTIME_PLANNER_H

#include <stdint.h>

#include "runtime/model_config.h"

/* Bytes per element of "fp32", "bf16", "fp16", "fp8", "int8"; KVP_EINVAL naming the unknown name. */
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

/* Figures for one tensor-parallel rank or for the whole model. */
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
    kvp_plan_figures total;    /* whole model (all ranks together); budget/blocks/seqs as one rank sees them */
    kvp_plan_figures per_rank;
    int64_t train_bytes;
    int64_t lora_params;
    int64_t lora_train_bytes;
} kvp_plan;

/* Fills defaults: util 0.9, bf16 weights and KV, block 16, seq_len = max_position_embeddings (or 4096),
 * 1 sequence, tp 1, no prefix, estimated reserve, 2048 batched tokens, LoRA rank 16. */
void kvp_plan_params_default(const kvp_model_config *cfg, kvp_plan_params *p);

/* KVP_EINVAL for impossible parameters (tp not dividing the heads, prefix longer than a sequence, sizes
 * <= 0, util outside (0,1]); the plan is still computed when the weights do not fit (budget < 0). */
kvp_status kvp_plan_compute(const kvp_model_config *cfg, const kvp_plan_params *p, kvp_plan *out);

/* KV bytes one sequence of n tokens stores (windows honoured), for the whole model. */
int64_t kvp_plan_kv_bytes_for_tokens(const kvp_model_config *cfg, int64_t n, double kv_bytes);

#endif
