/* runtime/executor/cost_model.h — the roofline cost model behind the `sim` executor: how long one engine
 * step of a model takes on a GPU, without running the model. Per step, whole model:
 *
 *   FLOPs  = matmul_flops_per_token x new_tokens        (2 x active non-embedding parameters per token)
 *          + lm_head_flops_per_seq  x sampled_seqs      (logits only where a token is sampled)
 *          + attn_flops_per_pair    x attn_pairs        (QK^T and PV per (query, key) pair, causal; the
 *                                                        window_share of it counts the last `window` keys)
 *   bytes  = weight_bytes                               (each read once; MoE: the experts the batch touches)
 *          + kv_bytes_per_token x (kv_read_tokens + new_tokens)   (read the context, write the new tokens;
 *                                                        window_share of it reads at most `window` tokens)
 *
 *   t_compute = FLOPs / tp / (peak_flops x flops_efficiency)
 *   t_memory  = bytes / tp / (mem_bw x bw_efficiency)      (KV heads replicated when tp > kv_heads: the
 *                                                           KV term uses ceil(kv_heads/tp)/kv_heads)
 *   t_comm    = 2 x layers x (2 (tp-1)/tp x new_tokens x hidden x act_bytes / link_bw + allreduce_latency)
 *                                                          (ring all-reduces after attention, MLP; 0 at tp 1)
 *   step time = max(t_compute, t_memory) + t_comm + step_overhead
 *
 * Assumptions: a step is compute- or memory-bound as a whole; peaks are the datasheet's, scaled by the
 * efficiencies; attention reads every sequence's context once a step (no reuse across sequences), sliding
 * layers only their window, though the KV memory keeps every token; T tokens with top-k routing touch
 * min(E, T x k) of a layer's E experts (an upper bound); no pipeline parallelism, speculation or CPU/GPU
 * overlap: step_overhead (scheduler, launches, sampling) is added to every step.
 */
#ifndef KVP_RUNTIME_COST_MODEL_H
#define KVP_RUNTIME_COST_MODEL_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/executor/gpu_profile.h"
#include "runtime/loader/model_config.h"

/* The formula's numbers, whole model before tensor parallelism: from kvp_cost_model_from_config, or tests. */
typedef struct {
    int32_t num_layers;
    int32_t hidden_size;
    int32_t num_kv_heads;
    double matmul_flops_per_token; /* 2 x active parameters outside the embedding and LM head */
    double lm_head_flops_per_seq;  /* 2 x vocab x hidden */
    double attn_flops_per_pair;    /* 2 x layers x q_heads x (head_dim + v_head_dim) */
    double dense_weight_bytes;     /* weights every step reads (attention, dense FFN, norms, LM head) */
    double expert_weight_bytes;    /* bytes of ONE expert summed over all MoE layers (0: dense model) */
    int32_t num_experts;           /* per MoE layer (0: dense) */
    int32_t experts_per_tok;
    double kv_bytes_per_token;     /* K and V, all layers, whole model */
    int64_t window;                /* sliding window in tokens (0: none) */
    double window_share;           /* share of the layers (of KV bytes, of attention FLOPs) that slide, [0, 1] */
    double act_bytes;              /* bytes per activation element (2 for bf16) */

    /* hardware (per GPU) */
    double peak_flops;
    double mem_bw;
    double link_bw;                /* one direction, per GPU */
    int32_t tp;

    double flops_efficiency;       /* (0, 1], default 1 */
    double bw_efficiency;          /* (0, 1], default 1 */
    double step_overhead_s;        /* default 0.5 ms (KVP_COST_DEFAULT_OVERHEAD_S) */
    double allreduce_latency_s;    /* default 10 us per all-reduce */
} kvp_cost_model;

#define KVP_COST_DEFAULT_OVERHEAD_S 0.5e-3
#define KVP_COST_DEFAULT_ALLREDUCE_LATENCY_S 10e-6

/* One step's batch: set window (the model's, or 0), then kvp_step_shape_add each scheduled sequence. */
typedef struct {
    int64_t window;         /* sliding window the _win sums cap at (0: they equal the full sums) */
    int64_t new_tokens;     /* tokens computed this step (prefill chunk lengths + 1 per decode) */
    int64_t kv_read_tokens; /* context tokens already in the cache, summed over sequences */
    double attn_pairs;      /* sum over new tokens of the keys they attend to (causal) */
    int64_t kv_read_win;    /* the same two sums in layers with the window: at most window keys each */
    double attn_pairs_win;
    int32_t num_seqs;
    int32_t sampled_seqs;   /* sequences that produce a token this step */
} kvp_step_shape;

/* Seconds. */
typedef struct {
    double compute_s, memory_s, comm_s, overhead_s, total_s;
    double flops, bytes; /* whole model, all ranks */
} kvp_step_cost;

/* dtype_bytes per weight and KV element; default efficiencies and overheads. KVP_EINVAL for tp < 1,
 * dtype_bytes < 1, a config without layers or heads; *out only written on success. */
kvp_status kvp_cost_model_from_config(const kvp_model_config *cfg, const kvp_gpu_profile *gpu, int32_t tp,
                                      int32_t dtype_bytes, kvp_cost_model *out);

/* A hand-filled model: positive, efficiencies in (0, 1]; else KVP_EINVAL naming the field. */
kvp_status kvp_cost_model_validate(const kvp_cost_model *cm);

/* sum of min(v, w) for v = lo .. hi (1 <= lo, w <= 0: no cap) */
static inline double kvp_sum_capped(int64_t lo, int64_t hi, int64_t w)
{
    if (hi < lo) return 0;
    if (w <= 0 || hi <= w) return 0.5 * (double)(lo + hi) * (double)(hi - lo + 1);
    if (lo > w) return (double)w * (double)(hi - lo + 1);
    return 0.5 * (double)(lo + w) * (double)(w - lo + 1) + (double)w * (double)(hi - w);
}

/* One sequence: `context` tokens cached, `new_tokens` computed now, `sampled` 1 when it yields a token. */
static inline void kvp_step_shape_add(kvp_step_shape *s, int64_t context, int64_t new_tokens, int sampled)
{
    s->new_tokens += new_tokens;
    s->kv_read_tokens += context;
    s->kv_read_win += s->window > 0 && context > s->window ? s->window : context;
    /* query j (0-based within the chunk) attends to context + j + 1 keys */
    s->attn_pairs += (double)new_tokens * (double)context + 0.5 * (double)new_tokens * (double)(new_tokens + 1);
    s->attn_pairs_win += kvp_sum_capped(context + 1, context + new_tokens, s->window);
    s->num_seqs += 1;
    s->sampled_seqs += sampled ? 1 : 0;
}

/* Seconds (> 0; only the overhead for an empty batch), a pure function; detail may be NULL. A shape whose
 * window differs from the model's (0, say) counts whole contexts in every layer. */
double kvp_cost_step_time(const kvp_cost_model *cm, const kvp_step_shape *shape, kvp_step_cost *detail);

/* Weight bytes ONE rank streams in a step touching every expert, the untied embedding table not counted
 * (only looked-up rows are read); the memory a rank holds is the planner's (planner/planner.h). */
double kvp_cost_weight_bytes_per_rank(const kvp_cost_model *cm);
double kvp_cost_kv_bytes_per_token_per_rank(const kvp_cost_model *cm); /* held by ONE rank */

#endif
