/* runtime/model/model.h — Llama-family models on the CPU (llama, mistral, qwen2 with QKV bias, qwen3 with
 * q/k norm): weights, the paged KV cache of every layer, and the batched forward pass of a token row x:
 *
 *   x = embed[token]
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q = h Wq^T (+bq)  [n_q_heads, head_dim]     k, v = h Wk^T, h Wv^T (+b)  [n_kv_heads, head_dim]
 *               (qwen3: per-head rmsnorm of q and k)        RoPE(q, k, position)
 *               append k, v to the paged cache (slot mapping); o = attention(q, cached K/V) (attention/)
 *               x += o Wo^T
 *               h = rmsnorm(x) * ffn_norm;  x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = (rmsnorm(x) * out_norm) Wlm^T         (Wlm = embed when tied)
 *
 * RoPE: KVP_ROPE_PAIRS rotates (2i, 2i+1) (GGUF llama/mistral, Meta, llama2.c), KVP_ROPE_HALF (i, i +
 * head_dim/2) (Hugging Face, GGUF qwen2/qwen3); angles in double. KVP_MATMUL_INVARIANT, the default, gives a
 * row the same bits whatever else is in the batch (alone, batched, chunked, after a cache hit); BLAS is
 * OpenBLAS's sgemm. A model keeps no file open; one forward pass (or kvp_model_run) at a time per model.
 */
#ifndef KVP_RUNTIME_MODEL_H
#define KVP_RUNTIME_MODEL_H

#include <stdint.h>

#include "attention/paged_kv.h"
#include "common/cpu.h"
#include "common/status.h"
#include "parallel/comm.h"
#include "runtime/loader/model_config.h"

typedef enum { KVP_ROPE_PAIRS = 0, KVP_ROPE_HALF } kvp_rope_style;
typedef enum { KVP_MATMUL_INVARIANT = 0, KVP_MATMUL_BLAS } kvp_matmul_kind;
/* "invariant" | "blas" (else KVP_EINVAL naming the choices), and back (a static string). */
kvp_status kvp_matmul_kind_parse(const char *s, kvp_matmul_kind *out);
const char *kvp_matmul_kind_name(kvp_matmul_kind k);

typedef struct kvp_model kvp_model;

/* A .gguf file, an HF folder (config.json + safetensors) or a .safetensors file (config.json beside it);
 * *out is the caller's. Errors name the file: KVP_EIO, KVP_EPARSE (a corrupt header, a tensor missing or
 * misshapen), KVP_EUNSUPPORTED (architecture, dtype, rope scaling). */
kvp_status kvp_model_load(const char *path, kvp_model **out);
/* Only this rank's shard (parallel/shard.h: heads, intermediate units, vocabulary rows). Every rank loads
 * the same path and runs the same passes, which sum and gather through comm (borrowed, outliving the model;
 * NULL: one rank) and return the whole logits everywhere; its KV caches hold the rank's KV heads. KVP_EINVAL
 * when the heads do not split over the ranks. */
kvp_status kvp_model_load_tp(const char *path, kvp_comm *comm, kvp_model **out);
/* How the matrices (projections, FFN, LM head) are held, widened and summed in f32: f16 / bf16 rounded to
 * nearest even (half the bytes); q8_0, ggml's per 32 inputs (a quarter; f32 unless in % 32 == 0); auto:
 * as stored (F32, F16, BF16, Q8_0 exactly, as vLLM's dtype "auto"), other GGUF quantizations as q8_0.
 * Embeddings and norms stay f32. kvp_model_weight_type: the type asked, or auto's if one (else AUTO). */
typedef enum { KVP_WEIGHT_F32 = 0, KVP_WEIGHT_F16, KVP_WEIGHT_BF16, KVP_WEIGHT_Q8_0, KVP_WEIGHT_AUTO } kvp_weight_type;
/* "f32" | "f16" | "bf16" | "q8_0" | "auto", or the aliases "fp32", "fp16", "float32", "float16", "bfloat16" (else
 * KVP_EINVAL naming the choices); kvp_weight_type_name gives the canonical spelling. */
kvp_status kvp_weight_type_parse(const char *s, kvp_weight_type *out);
const char *kvp_weight_type_name(kvp_weight_type t);
/* kvp_model_load_tp with the matrices held as `weights`. */
kvp_status kvp_model_load_ex(const char *path, kvp_comm *comm, kvp_weight_type weights, kvp_model **out);
kvp_weight_type kvp_model_weight_type(const kvp_model *m);
/* `--kv-dtype auto` (vLLM's): the matrices' held type if f32, f16 or bf16, else f16 (llama.cpp's). */
kvp_dtype kvp_model_kv_dtype_auto(const kvp_model *m);
/* "auto" (*is_auto = 1, *out untouched) or kvp_dtype_parse's names (*is_auto = 0). */
kvp_status kvp_kv_dtype_parse(const char *s, kvp_dtype *out, int *is_auto);
kvp_comm *kvp_model_comm(const kvp_model *m); /* as given to load (NULL: one rank) */
void kvp_model_destroy(kvp_model *m);         /* NULL: no-op */

const kvp_model_config *kvp_model_cfg(const kvp_model *m);
/* inv_freq[rotary_dim / 2], the angle per position of each pair, for contexts up to max_len, after c's
 * rope_scaling as Hugging Face and vLLM compute it (dynamic: the stretched context's base; longrope: its long
 * factors past the original context); *scale multiplies cos and sin (yarn, longrope; else 1). GGUF's
 * rope_freqs.weight divides further. */
void kvp_rope_frequencies(const kvp_model_config *c, int64_t max_len, double *inv_freq, double *scale);
int32_t kvp_rotary_dim(const kvp_model_config *c); /* rotary_dim, or head_dim */
kvp_rope_style kvp_model_rope_style(const kvp_model *m);
const char *kvp_model_path(const kvp_model *m); /* as given to load */
int kvp_model_is_gguf(const kvp_model *m);
int kvp_model_is_eos(const kvp_model *m, int32_t id); /* any of the config's eos_token_ids */
/* kvp_model_config_context (stretched by rope scaling, as vLLM's max_model_len), capped by set_max_len. */
int32_t kvp_model_max_len(const kvp_model *m);
/* vLLM's --max-model-len (n <= 0: none); KVP_EINVAL, no cap kept, past the context. Call it before the
 * first forward pass: LongRoPE's factors follow it. */
kvp_status kvp_model_set_max_len(kvp_model *m, int32_t n);

/* Threads (>= 1) for matmuls and attention, process-wide for attention and OpenBLAS; load sets 1. */
void kvp_model_set_threads(kvp_model *m, int n);
int kvp_model_get_threads(const kvp_model *m);
void kvp_model_set_matmul(kvp_model *m, kvp_matmul_kind k);
/* Invariant matmul lanes: 8 (AVX2) or 16 (AVX-512F, load's default where kvp_cpu_max_lanes allows). */
kvp_status kvp_model_set_lanes(kvp_model *m, int lanes); /* KVP_EUNSUPPORTED: 16 without AVX-512F */
int kvp_model_lanes(const kvp_model *m);
/* Timing only: attention outputs become their queries (K/V still appended; logits wrong), the ceiling
 * of `kvpage bench generate --skip-attention`. */
void kvp_model_set_skip_attention(kvp_model *m, int on);

/* fn(arg, i) for i in [0, min(n, 64)), returning when all are done: task 0 on the caller, the rest on the
 * model's workers (started on first use, joined by destroy; one that cannot start leaves its task to the
 * caller). The forward pass's data-parallel groups and sampling use it. */
void kvp_model_run(kvp_model *m, int n, void (*fn)(void *arg, int i), void *arg);

/* ---- paged KV cache: a K and a V pool per layer, [num_blocks, num_kv_heads, block_size, head_dim] of f32,
 * or f16 / bf16 / fp8-e4m3 rounded on append (fp8 scale 1, as vLLM's without calibration). */
typedef struct {
    int32_t num_layers;
    int32_t num_blocks;
    int32_t block_size;
    kvp_paged_kv *layers; /* [num_layers], pools owned by the cache */
} kvp_kv_cache;

/* Unused slots hold NaN; *out is the caller's. KVP_EINVAL, KVP_EUNSUPPORTED (head_dim), KVP_ENOMEM. */
kvp_status kvp_kv_cache_create(const kvp_model *m, kvp_dtype dtype, int32_t num_blocks, int32_t block_size,
                               kvp_kv_cache **out);
/* Bytes of every layer's K and V; (m, dt, 1, 1) is a token's. */
double kvp_kv_cache_bytes(const kvp_model *m, kvp_dtype dtype, int64_t num_blocks, int32_t block_size);
void kvp_kv_cache_destroy(kvp_kv_cache *kv);
/* Copy-on-write: block pairs[2i+1] := block pairs[2i] in every layer. */
kvp_status kvp_kv_cache_copy_blocks(kvp_kv_cache *kv, const int32_t *src_dst_pairs, int32_t n);
/* Swap and host tier, between caches of one model and dtype: dst's block pairs[2i+1] := src's pairs[2i]. */
kvp_status kvp_kv_cache_move_blocks(kvp_kv_cache *dst, const kvp_kv_cache *src, const int32_t *src_dst_pairs, int32_t n);

/* A step of num_seqs sequences, qo_indptr[s+1] - qo_indptr[s] >= 1 new tokens each, the page table (CSR,
 * attention/paged_kv.h) already covering them. Arrays are borrowed for the call. */
typedef struct {
    int32_t num_seqs;
    int32_t num_tokens;              /* qo_indptr[num_seqs] */
    const int32_t *tokens;           /* (num_tokens) */
    const int32_t *positions;        /* (num_tokens) RoPE positions (= index in the sequence) */
    const int64_t *slot_mapping;     /* (num_tokens) */
    const int32_t *qo_indptr;        /* (num_seqs + 1) */
    const int32_t *kv_indptr;        /* (num_seqs + 1) */
    const int32_t *kv_indices;       /* (kv_indptr[num_seqs]) */
    const int32_t *kv_last_page_len; /* (num_seqs) */
    int all_logits; /* 0: logits of each sequence's last new token, (num_seqs, vocab); 1: (num_tokens, vocab) */
    const uint8_t *all_logits_of; /* (num_seqs) or NULL: with all_logits 0, a sequence whose entry is nonzero
                                   * gets the logits of every new token; rows stay in sequence order */
} kvp_fwd_batch;

int64_t kvp_fwd_logit_rows(const kvp_fwd_batch *b); /* rows of vocab floats a pass over b writes */

/* logits: (kvp_fwd_logit_rows(b), vocab). KVP_EINVAL naming a token outside the vocabulary, a position past
 * the maximum or an inconsistent batch (logits untouched; K/V may be appended); KVP_ENOMEM (workspace). */
kvp_status kvp_model_forward(kvp_model *m, kvp_kv_cache *kv, const kvp_fwd_batch *b, float *logits);

#endif
