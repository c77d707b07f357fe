/* runtime/model/model_export.h — a loaded model's tensors in plain layouts, for executors that keep their
 * own copy of the weights (the cuda executor uploads them; runtime/executor/cuda_executor.h).
 *
 *   matrix W [N = outputs, K = inputs], row-major f32: W[o * K + k] (the model holds packed panels of f32,
 *   f16, bf16 or Q8_0, model_internal.h; this widens them exactly)
 *   vectors (norms, biases): the model's own f32 arrays, borrowed for the model's life
 *
 * Gemma's RMSNorm multiplies by 1 + w: the loader folds the 1 into the weight (weights.c), so an exported norm
 * is applied as out = w * x / rms(x) for every family.
 *
 * A mixture-of-experts layer (mixtral, qwen3_moe: n_experts > 0 in its vectors) has no dense FFN matrices:
 * its router (E, H) is an f32 array (borrowed, replicated over ranks) and expert e's gate and up [MF, H] and
 * down [H, MF] come out one at a time (MF: the rank's units of every expert). MoE with shared experts or a
 * latent KV cache (deepseek) is not exported (KVP_EUNSUPPORTED, naming the layer).
 *
 * A model loaded for tensor parallelism (kvp_model_load_tp) exports the rank's shard as the loader sliced it
 * (parallel/shard.h, kvp_model_shard): Q, K, V, gate and up are its rows, O and down its columns, the
 * embedding and the LM head its vocabulary rows, biases of Q, K and V its part; norms and o_proj's bias whole;
 * each expert's gate and up its rows, its down its columns (the units of parallel/shard split every expert).
 * The shapes below are the shard's.
 */
#ifndef KVP_RUNTIME_MODEL_MODEL_EXPORT_H
#define KVP_RUNTIME_MODEL_MODEL_EXPORT_H

#include <stdint.h>

#include "common/status.h"
#include "parallel/shard.h"
#include "runtime/model/model.h"

typedef enum {
    KVP_MAT_Q = 0, KVP_MAT_K, KVP_MAT_V, KVP_MAT_O, KVP_MAT_GATE, KVP_MAT_UP, KVP_MAT_DOWN, KVP_MAT_LM_HEAD
} kvp_mat_id;

/* Layer l's vectors (borrowed; NULL where the layer has none) and attention window. */
typedef struct {
    const float *attn_norm, *ffn_norm;            /* (hidden) */
    const float *q_norm, *k_norm;                 /* (head_dim) qwen3, or NULL */
    const float *post_attn_norm, *post_ffn_norm;  /* (hidden) gemma2/3, or NULL */
    const float *bq, *bk, *bv;                    /* (nq*hd), (nkv*hd), (nkv*hd) or NULL */
    const float *bo;                              /* (hidden) or NULL */
    int32_t window_left;                          /* -1: full attention */
    int32_t n_experts;                            /* 0: dense FFN */
} kvp_model_layer_vecs;

/* RoPE as the CPU forward pass applies it: cos/sin tables from inv_freq (rot / 2 entries, already divided by
 * GGUF's rope_freqs) times scale; sliding layers of gemma3 use inv_freq_local (NULL: the same as inv_freq). */
typedef struct {
    const double *inv_freq, *inv_freq_local; /* borrowed */
    double scale;
    int32_t rot;          /* rotated dimensions of a head (kvp_rotary_dim) */
    kvp_rope_style style; /* pairs (2i, 2i+1) or halves (i, i + rot/2) */
} kvp_model_rope;

/* KVP_OK when the model can be exported (dense or routed-expert FFNs), else KVP_EUNSUPPORTED naming why. */
kvp_status kvp_model_export_check(const kvp_model *m);
/* The rank's shard: which heads, intermediate units and vocabulary rows it holds (all of them at tp 1). */
void kvp_model_shard(const kvp_model *m, kvp_tp_shard *out);
/* Shape of matrix id (layer ignored for the LM head); *N, *K. */
void kvp_model_matrix_shape(const kvp_model *m, int32_t layer, kvp_mat_id id, int64_t *N, int64_t *K);
/* W into out (N * K floats, row-major). KVP_EINVAL for a layer or id out of range. */
kvp_status kvp_model_matrix_f32(const kvp_model *m, int32_t layer, kvp_mat_id id, float *out);
/* Layer l's router (E, H) f32, borrowed; NULL for a dense layer. */
const float *kvp_model_router_f32(const kvp_model *m, int32_t layer);
/* Shape and values of expert e's id (KVP_MAT_GATE, _UP or _DOWN) in MoE layer l, as the matrices above:
 * 0 x 0 and KVP_EINVAL for a dense layer, an expert or id out of range. */
void kvp_model_expert_matrix_shape(const kvp_model *m, int32_t layer, int32_t e, kvp_mat_id id, int64_t *N,
                                   int64_t *K);
kvp_status kvp_model_expert_matrix_f32(const kvp_model *m, int32_t layer, int32_t e, kvp_mat_id id, float *out);
kvp_status kvp_model_layer_vecs_of(const kvp_model *m, int32_t layer, kvp_model_layer_vecs *out);
const float *kvp_model_embed_f32(const kvp_model *m);    /* (vocab, hidden), borrowed */
const float *kvp_model_out_norm_f32(const kvp_model *m); /* (hidden), borrowed */
void kvp_model_rope_of(const kvp_model *m, kvp_model_rope *out);
/* cs (rot floats): cos and sin of pos * inv_freq[i] times scale, interleaved, exactly as the CPU pass makes
 * them (double, rounded to float); the CPU uses r->scale with inv_freq and 1 with inv_freq_local. */
void kvp_model_rope_angles(const double *inv_freq, int32_t rot, double scale, int32_t pos, float *cs);

#endif
