/* runtime/loader/model_config.h — a model's architecture, read from a Hugging Face config.json (or filled from
 * GGUF metadata by the GGUF loader), in one struct.
 *
 * Every integer is the value after defaults and derivations:
 *   head_dim      = config "head_dim" when present, else hidden_size / num_attention_heads
 *   num_kv_heads  = "num_key_value_heads" when present, else num_attention_heads (MHA)
 *   nested "text_config" (multimodal wrappers) is read in place of the top level.
 * Families: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi3, opt, deepseek_v2,
 * deepseek_v3. Unknown model_type: accepted only when the KV-formula fields
 * (num_hidden_layers, num_attention_heads, hidden_size, and num_key_value_heads or head_dim) are present;
 * such configs get family KVP_FAMILY_GENERIC and a llama-like parameter count.
 */
#ifndef KVP_RUNTIME_MODEL_CONFIG_H
#define KVP_RUNTIME_MODEL_CONFIG_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "common/status.h"

typedef enum {
    KVP_FAMILY_GENERIC = 0,
    KVP_FAMILY_LLAMA,    /* llama, mistral, qwen2, qwen3: RMSNorm, RoPE, GQA, SwiGLU */
    KVP_FAMILY_MIXTRAL,  /* llama-like with MoE FFN (mixtral, qwen3_moe) */
    KVP_FAMILY_GEMMA2,   /* gemma, gemma2, gemma3: post-norms (gemma2, 3), sliding windows on some layers */
    KVP_FAMILY_PHI3,     /* fused qkv and gate_up */
    KVP_FAMILY_OPT,      /* LayerNorm with bias, learned positions, two-matrix ReLU FFN */
    KVP_FAMILY_DEEPSEEK, /* MLA attention (latent KV cache), MoE with shared experts */
} kvp_model_family;

enum { KVP_ACT_SILU = 0, KVP_ACT_GELU_TANH, KVP_ACT_GELU };
enum { KVP_MAX_LAYERS = 1024, KVP_MAX_ROPE_PAIRS = 128 /* head_dim 256 / 2 */ };
/* Largest parameter count a loaded config may have: 2^53, the largest a double (and a JSON number) holds
 * exactly. Every count below it is exact, and every byte size derived from it fits in int64_t. */
#define KVP_MODEL_MAX_PARAMS (1LL << 53)

enum { KVP_MAX_EOS_IDS = 8 };

/* A model's default sampling (generation_config.json); `given` has a KVP_SAMPLING_* bit per field it sets. */
enum {
    KVP_SAMPLING_TEMPERATURE = 1,
    KVP_SAMPLING_TOP_P = 2,
    KVP_SAMPLING_TOP_K = 4,
    KVP_SAMPLING_MIN_P = 8,
    KVP_SAMPLING_REPETITION = 16,
    KVP_SAMPLING_MAX_TOKENS = 32,
};
typedef struct {
    double temperature, top_p, min_p, repetition_penalty;
    int64_t top_k, max_tokens;
    unsigned given;
} kvp_sampling_defaults;

typedef struct {
    char model_type[64];
    kvp_model_family family;

    int32_t num_layers;       /* num_hidden_layers */
    int32_t hidden_size;
    int32_t num_q_heads;      /* num_attention_heads */
    int32_t num_kv_heads;     /* num_key_value_heads (after defaults) */
    int32_t head_dim;         /* per-head dim of Q/K (for MLA: qk_nope_head_dim + qk_rope_head_dim) */
    int32_t v_head_dim;       /* per-head dim of V (== head_dim except MLA) */
    int64_t intermediate_size; /* dense FFN width (OPT: ffn_dim) */
    int64_t vocab_size;
    int64_t max_position_embeddings;

    double rms_norm_eps;      /* or layer_norm_eps */
    double rope_theta;
    /* rope_scaling: type "" when absent; llama3 uses factor, low/high_freq_factor, original_max; linear
     * uses factor; yarn uses factor, original_max (0: max_position_embeddings), beta_fast/beta_slow (the
     * correction range, 32 and 1), truncate (round that range to whole dimensions, 1) and the attention
     * factor that scales cos and sin (0: the default, 0.1 ln(factor) + 1, or DeepSeek's ratio of the two
     * with mscale and mscale_all_dim when both are given) */
    char rope_scaling_type[32];
    double rope_scaling_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_original_max_position;
    double rope_beta_fast, rope_beta_slow;
    int rope_truncate;
    double rope_attention_factor, rope_mscale, rope_mscale_all_dim;
    /* longrope (phi3; "su" is read as longrope): per-pair divisors of the frequencies, long_factor when the
     * served context (max_model_len) passes original_max_position_embeddings, else short_factor, chosen once
     * for the whole context as vLLM and llama.cpp do; rope_n_factors pairs each. cos and sin are scaled by
     * attention_factor, else long_mscale or short_mscale (vLLM's), else sqrt(1 + ln(s) / ln(original)) with
     * s = max_position_embeddings / original (1 when s <= 1); 0: not given */
    int32_t rope_n_factors;
    double rope_long_factor[KVP_MAX_ROPE_PAIRS], rope_short_factor[KVP_MAX_ROPE_PAIRS];
    double rope_long_mscale, rope_short_mscale;
    int32_t rotary_dim;       /* the leading dimensions of a head RoPE rotates: head_dim x partial_rotary_factor
                               * (Phi-4-mini: 0.75) or GGUF's rope.dimension_count; 0: head_dim */

    int tie_word_embeddings;  /* 1: LM head shares the embedding matrix */
    int attention_bias;       /* q/k/v projections carry a bias (qwen2: 1) */
    int qk_norm;              /* per-head RMSNorm on q and k (qwen3) */
    /* gemma, gemma2, gemma3 (KVP_FAMILY_GEMMA2) also scale the embedding by sqrt(hidden_size) and normalize by
     * (1 + weight) (the loader adds the 1 to an HF checkpoint's weights; a GGUF stores 1 + weight) */
    int post_norms;                 /* gemma2, gemma3: a norm after the attention and after the FFN */
    double rope_local_theta;        /* gemma3: the sliding layers' RoPE base (rope_local_base_freq), never
                                     * scaled; 0: every layer uses rope_theta (and rope_scaling) */
    int ffn_act;                    /* the gated FFN's activation: KVP_ACT_SILU (SwiGLU), KVP_ACT_GELU_TANH or
                                     * KVP_ACT_GELU (GeGLU: gemma's gelu_pytorch_tanh, or exact gelu) */
    double query_pre_attn_scalar;   /* gemma2: scores scaled by its -1/2 power; 0: head_dim's */
    double attn_logit_softcapping;  /* gemma2: each scaled score x becomes cap tanh(x / cap); 0: off */
    double final_logit_softcapping; /* gemma2: the same on the logits */

    /* Sliding window: sliding_window > 0 applies to the layers with layer_is_sliding[i] = 1.
     * From "layer_types" when present, else every layer (mistral/phi3 style) unless the family
     * alternates (gemma2: even layers slide). 0 = no window. */
    int64_t sliding_window;
    uint8_t layer_is_sliding[KVP_MAX_LAYERS];

    /* MoE: num_experts 0 for dense models. */
    int32_t num_experts;           /* num_local_experts / num_experts / n_routed_experts */
    int32_t num_experts_per_tok;
    int32_t num_shared_experts;    /* deepseek n_shared_experts */
    int moe_norm_topk;             /* the top-k routing weights are renormalized to sum to 1 (mixtral always;
                                    * qwen3_moe's norm_topk_prob, default false as in transformers) */
    int64_t moe_intermediate_size; /* per-expert FFN width (mixtral: intermediate_size) */
    int32_t first_dense_layers;    /* deepseek first_k_dense_replace: leading layers with a dense FFN */
    int32_t moe_layer_step;        /* qwen decoder_sparse_step / deepseek moe_layer_freq (1 = every layer) */
    uint8_t layer_is_moe[KVP_MAX_LAYERS]; /* 1: layer i has the MoE FFN, 0: dense FFN (deepseek
                                           * first_k_dense_replace, qwen mlp_only_layers/decoder_sparse_step) */

    /* MLA (deepseek_v2/v3): kv_lora_rank > 0 means the cache stores kv_lora_rank + qk_rope_head_dim
     * elements per token per layer, shared by all heads. */
    int32_t kv_lora_rank;
    int32_t q_lora_rank;           /* 0: q projected directly */
    int32_t qk_rope_head_dim;
    int32_t qk_nope_head_dim;

    int64_t bos_token_id;          /* -1 when absent */
    int64_t eos_token_id;          /* first one when a list; -1 when absent */
    /* Every id that ends generation as EOS does (eos_token_ids[0] == eos_token_id): config.json's list, plus
     * generation_config.json's beside it, or a GGUF's eot/eom ids (Llama-3-Instruct's <|eot_id|>). */
    int64_t eos_token_ids[KVP_MAX_EOS_IDS];
    int32_t n_eos;
    kvp_sampling_defaults sampling;
} kvp_model_config;

/* Reads the sampling defaults of a generation_config.json object (what vLLM's --generation-config auto takes
 * from it: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens; do_sample is ignored, as
 * vLLM ignores it) into cfg->sampling; `what` names the file in errors (a non-number, or a value out of
 * range: temperature [0, 1e6], top_p (0, 1], top_k >= -1 (0 and -1: all), min_p [0, 1], repetition_penalty
 * (0, 10], max_new_tokens >= 1). */
kvp_status kvp_model_config_sampling(const cJSON *obj, const char *what, kvp_model_config *cfg);
/* Sets one field of d (bit: its KVP_SAMPLING_* bit) to v, in the range above; else KVP_EPARSE naming `what`
 * (the file) and `key` (the field as the file spells it). */
kvp_status kvp_sampling_set(kvp_sampling_defaults *d, unsigned bit, double v, const char *what, const char *key);

/* The context length vLLM derives (max_model_len's default): max_position_embeddings, times rope_scaling's
 * factor for linear and dynamic scaling; for yarn, original_max_position_embeddings (else
 * max_position_embeddings) times the factor. 0 when the config gives no length. */
int64_t kvp_model_config_context(const kvp_model_config *cfg);
/* YaRN's attention factor for a context stretched s times: 0.1 mscale ln(s) + 1 (1 for s <= 1; mscale is
 * DeepSeek's coefficient, 1 elsewhere). */
double kvp_yarn_mscale(double s, double mscale);

/* Adds id to cfg's EOS ids (a no-op for -1, an id already there, or a full list). */
void kvp_model_config_add_eos(kvp_model_config *cfg, int64_t id);
/* The "eos_token_id" of a config.json or generation_config.json object (a token id or a list of them), added
 * to cfg's EOS ids; `what` names the file in errors. */
kvp_status kvp_model_config_eos(const cJSON *obj, const char *what, kvp_model_config *cfg);

/* Reads `path` (a config.json). Errors (KVP_EIO, KVP_EPARSE, KVP_EUNSUPPORTED, KVP_EINVAL) name the file
 * and the field. *cfg is written only on success.
 * Limits (KVP_EINVAL "\"field\": VALUE is out of range [MIN, MAX]", also for numbers too large to be
 * integers, 2^62 or 1e999): num_hidden_layers <= KVP_MAX_LAYERS, hidden_size <= 2^20, heads, head dims and
 * MLA ranks <= 2^16, intermediate/ffn/moe_intermediate_size and vocab_size <= 2^24, experts <= 2^16,
 * max_position_embeddings and windows <= 2^40; and a parameter count <= KVP_MODEL_MAX_PARAMS (the error
 * names the field behind the largest part of the count). */
kvp_status kvp_model_config_load(const char *path, kvp_model_config *cfg);
/* The same from a parsed object; `what` names the source in errors. */
kvp_status kvp_model_config_from_json(const cJSON *root, const char *what, kvp_model_config *cfg);

/* KV-cache elements stored per token for layer `layer` (K and V together): 2*kv_heads*head_dim, or for
 * MLA kv_lora_rank + qk_rope_head_dim. */
int64_t kvp_model_kv_elems_per_token_layer(const kvp_model_config *cfg, int32_t layer);
/* The sum over all layers (full attention; the seed article's formula without the element size). */
int64_t kvp_model_kv_elems_per_token(const kvp_model_config *cfg);
/* Total parameter count (embeddings, LM head unless tied, attention, FFN incl. every MoE expert, norms).
 * Exact for a loaded config; a config filled otherwise saturates at INT64_MAX instead of wrapping. */
int64_t kvp_model_num_params(const kvp_model_config *cfg);
/* Parameters touched per token (MoE: only the routed top-k + shared experts). For the cost model. Same
 * saturation. */
int64_t kvp_model_active_params(const kvp_model_config *cfg);

#endif
