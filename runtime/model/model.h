/* runtime/model/model.h — Llama-family models on the CPU (llama, mistral, qwen2 with QKV bias, qwen3 with q/k
 * norm): weights (f32, converted at load), the paged KV cache of every layer, and the batched forward pass.
 *
 * Forward pass of one token row (x: [hidden]):
 *   x = embed[token]
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q = h Wq^T (+bq)  [n_q_heads, head_dim]     k, v = h Wk^T, h Wv^T (+b)  [n_kv_heads, head_dim]
 *               (qwen3: per-head rmsnorm of q and k)        RoPE(q, k, position)
 *               append k, v to the paged cache (slot mapping); o = attention(q, cached K/V) (attention/)
 *               x += o Wo^T
 *               h = rmsnorm(x) * ffn_norm;  x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = (rmsnorm(x) * out_norm) Wlm^T         (Wlm = embed when tied)
 *
 * RoPE conventions: KVP_ROPE_PAIRS rotates (2i, 2i+1) (GGUF llama/mistral, Meta, llama2.c), KVP_ROPE_HALF
 * rotates (i, i + head_dim/2) (Hugging Face, and GGUF qwen2/qwen3). Frequencies theta^(-2i/head_dim), with
 * llama3 rope_scaling applied when the config has it; angles are computed in double precision.
 *
 * Matmuls: KVP_MATMUL_BLAS (OpenBLAS sgemm) or KVP_MATMUL_INVARIANT (a fixed-order dot-product kernel whose
 * result for a row does not depend on the other rows of the batch: the same prompt gives bit-identical
 * logits alone, batched, chunked or after a prefix-cache hit). The default is INVARIANT; OpenBLAS's sgemm
 * rounds a row differently depending on the batch size and on its thread split.
 *
 * Ownership: kvp_model_load returns an owned model (kvp_model_destroy; NULL is a no-op); it keeps no file
 * open. The KV cache (kvp_kv_cache) is owned by its creator. A model is immutable during forward passes
 * except for its internal workspace: one forward pass at a time per model.
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
/* "invariant" | "blas" (KVP_EINVAL naming the value and the choices); the name is a static string. */
kvp_status kvp_matmul_kind_parse(const char *s, kvp_matmul_kind *out);
const char *kvp_matmul_kind_name(kvp_matmul_kind k);

typedef struct kvp_model kvp_model;

/* path: a .gguf file, an HF folder (config.json + safetensors), or a .safetensors file (config.json beside
 * it). Errors name the file and the problem: KVP_EIO (unreadable), KVP_EPARSE (corrupt header, a tensor
 * missing or of the wrong shape), KVP_EUNSUPPORTED (architecture, dtype, rope scaling type). */
kvp_status kvp_model_load(const char *path, kvp_model **out);
/* The same, holding only rank kvp_comm_rank(comm)'s shard of a tensor-parallel split over kvp_comm_size(comm)
 * ranks (parallel/shard.h): its query and KV heads, intermediate units and vocabulary rows. Every rank loads
 * the same path and then runs the same forward passes: each pass sums and gathers through comm (borrowed,
 * it must outlive the model) and returns the whole logits on every rank. KV caches made for this model hold
 * the rank's KV heads only. comm NULL: one rank. KVP_EINVAL when the heads do not split over the ranks. */
kvp_status kvp_model_load_tp(const char *path, kvp_comm *comm, kvp_model **out);
/* How the weight matrices (projections, FFN, LM head) are held: f32; f16 / bf16 (rounded to nearest even at
 * load: half the memory and half the bytes a decode step reads); q8_0 (ggml's Q8_0 per 32 inputs: about a
 * quarter; matrices whose inputs are not a multiple of 32 stay f32). All are widened to f32 in registers
 * and summed in f32. Embeddings and norms stay f32.
 * auto: each matrix as its file stores it (F32, F16, BF16, Q8_0: exact, as vLLM's dtype "auto" keeps a
 * checkpoint's dtype), and GGUF's other quantized types (Q4_0 .. Q6_K) as q8_0, the held type closest to
 * their size (its rounding, about 1/254 of a block's largest weight, is small beside theirs).
 * kvp_model_weight_type gives the type asked for, or with auto the matrices' one held type (KVP_WEIGHT_AUTO
 * when they differ). */
typedef enum { KVP_WEIGHT_F32 = 0, KVP_WEIGHT_F16, KVP_WEIGHT_BF16, KVP_WEIGHT_Q8_0, KVP_WEIGHT_AUTO } kvp_weight_type;
/* "f32" | "f16" | "bf16" | "q8_0" | "auto" (KVP_EINVAL naming the value and the choices). */
kvp_status kvp_weight_type_parse(const char *s, kvp_weight_type *out);
const char *kvp_weight_type_name(kvp_weight_type t);
/* kvp_model_load_tp with the matrices held as `weights`. */
kvp_status kvp_model_load_ex(const char *path, kvp_comm *comm, kvp_weight_type weights, kvp_model **out);
kvp_weight_type kvp_model_weight_type(const kvp_model *m);
/* The KV cache element type of `--kv-dtype auto`, vLLM's kv_cache_dtype "auto" (the model's dtype): the
 * matrices' held type when it is f32, f16 or bf16; f16 when they are q8_0 or of several types (llama.cpp's
 * default cache type for quantized models). */
kvp_dtype kvp_model_kv_dtype_auto(const kvp_model *m);
/* "auto" (*is_auto = 1, *out untouched) or a KV element type's name (kvp_dtype_parse; *is_auto = 0). */
kvp_status kvp_kv_dtype_parse(const char *s, kvp_dtype *out, int *is_auto);
/* The communicator given to kvp_model_load_tp (NULL: one rank). */
kvp_comm *kvp_model_comm(const kvp_model *m);
void kvp_model_destroy(kvp_model *m);

const kvp_model_config *kvp_model_cfg(const kvp_model *m);
/* RoPE of config c served with contexts of up to max_len tokens: inv_freq[i] (rotary_dim / 2 of them, the
 * pairs of the leading rotary_dim dimensions of a head), the angle per position of pair i, after c's
 * rope_scaling (none, linear, llama3, yarn or longrope as Hugging Face and vLLM compute them; dynamic as vLLM
 * does, with the base of the whole stretched context; longrope's long factors when max_len passes the
 * original context), and *scale, what cos and sin are multiplied by (yarn's and longrope's attention factor;
 * else 1). GGUF's rope_freqs.weight divides them further. */
void kvp_rope_frequencies(const kvp_model_config *c, int64_t max_len, double *inv_freq, double *scale);
/* The dimensions of a head RoPE rotates (config's rotary_dim, or head_dim). */
int32_t kvp_rotary_dim(const kvp_model_config *c);
kvp_rope_style kvp_model_rope_style(const kvp_model *m);
const char *kvp_model_path(const kvp_model *m); /* as given to load */
int kvp_model_is_gguf(const kvp_model *m);
/* 1 when id ends generation as EOS does (any of the config's eos_token_ids). */
int kvp_model_is_eos(const kvp_model *m, int32_t id);
/* Maximum positions: kvp_model_config_context (max_position_embeddings or GGUF context_length, stretched by
 * rope scaling as vLLM derives max_model_len), capped by kvp_model_set_max_len. */
int32_t kvp_model_max_len(const kvp_model *m);
/* Caps kvp_model_max_len at n (vLLM's --max-model-len; n <= 0: no cap). KVP_EINVAL when n exceeds the
 * model's context (no cap is kept then). LongRoPE's factors follow the cap (short ones when it is within the
 * original context), so call it before the first forward pass. */
kvp_status kvp_model_set_max_len(kvp_model *m, int32_t n);

/* Threads for matmuls and attention (>= 1). Process-wide for attention and OpenBLAS. kvp_model_load sets
 * 1 (OpenMP threads spinning on an oversubscribed machine cost far more than they bring to small batches). */
void kvp_model_set_threads(kvp_model *m, int n);
int kvp_model_get_threads(const kvp_model *m);
void kvp_model_set_matmul(kvp_model *m, kvp_matmul_kind k);
/* Vector lanes of the invariant matmul: 8 (AVX2), or 16 (AVX-512F) where the CPU has it, the default
 * kvp_model_load picks. Both give the same bits (one fused multiply-add chain per output in k order);
 * 16 lanes do twice the multiply-adds a cycle when the weights are reused across rows (batches, prefill).
 * The widest a CPU allows: kvp_cpu_max_lanes (common/cpu.h). */
kvp_status kvp_model_set_lanes(kvp_model *m, int lanes); /* KVP_EUNSUPPORTED: 16 without AVX-512F */
int kvp_model_lanes(const kvp_model *m);
/* Timing only (on: nonzero): every layer's attention output becomes a copy of its queries, so the logits
 * are wrong. K/V are still appended. `kvpage bench generate --skip-attention` times the rest of a step with
 * it: the ceiling that no attention kernel, however fast, could pass. */
void kvp_model_set_skip_attention(kvp_model *m, int on);

/* Runs fn(arg, i) for every i in [0, n) and returns when all are done: task 0 on the calling thread, the
 * others on the model's worker threads (started on first use, asleep between runs, joined by
 * kvp_model_destroy); a worker that cannot be started leaves its task to the caller. n is capped at 64.
 * One run at a time per model; the forward pass uses it for its data-parallel groups, generation for
 * sampling. */
void kvp_model_run(kvp_model *m, int n, void (*fn)(void *arg, int i), void *arg);

/* ---- paged KV cache: one pool pair per layer, [num_blocks, num_kv_heads, block_size, head_dim], of one
 * element type (f32, or f16/bf16/fp8-e4m3 to halve or quarter it: new K/V rows are rounded on append,
 * attention converts them back in registers; fp8 uses scale 1, as vLLM does without calibration). */
typedef struct {
    int32_t num_layers;
    int32_t num_blocks;
    int32_t block_size;
    kvp_paged_kv *layers; /* [num_layers], pools owned by the cache */
} kvp_kv_cache;

/* Unused slots hold NaN. KVP_EINVAL for sizes < 1 or an invalid dtype, KVP_EUNSUPPORTED for a head_dim
 * attention/ does not handle, KVP_ENOMEM. */
kvp_status kvp_kv_cache_create(const kvp_model *m, kvp_dtype dtype, int32_t num_blocks, int32_t block_size,
                               kvp_kv_cache **out);
/* Bytes of such a cache's pools (every layer, K and V); kvp_kv_cache_bytes(m, dt, 1, 1) is a token's. */
double kvp_kv_cache_bytes(const kvp_model *m, kvp_dtype dtype, int64_t num_blocks, int32_t block_size);
void kvp_kv_cache_destroy(kvp_kv_cache *kv);
/* Copy-on-write batch: block pairs[i].dst := pairs[i].src in every layer. */
kvp_status kvp_kv_cache_copy_blocks(kvp_kv_cache *kv, const int32_t *src_dst_pairs, int32_t n);
/* Between two caches of one model and element type (device <-> host pools: swap, the prefix cache's host
 * tier): block pairs[i].dst of dst := block pairs[i].src of src in every layer. */
kvp_status kvp_kv_cache_move_blocks(kvp_kv_cache *dst, const kvp_kv_cache *src, const int32_t *src_dst_pairs, int32_t n);

/* One batched step: num_seqs sequences, each with n_q(s) = qo_indptr[s+1] - qo_indptr[s] >= 1 new tokens.
 * The page table (CSR, attention/paged_kv.h) already covers the new tokens; slot_mapping gives each new
 * token's slot. All arrays borrowed for the call. */
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

/* Logits rows a forward pass over b writes (vocab floats each). */
int64_t kvp_fwd_logit_rows(const kvp_fwd_batch *b);

/* Runs the batch; writes logits. KVP_EINVAL naming the problem for a token id out of the vocabulary, a
 * position past the model's maximum, or an inconsistent batch (nothing written to logits then; the K/V of
 * the batch's tokens may have been appended). KVP_ENOMEM for the workspace. */
kvp_status kvp_model_forward(kvp_model *m, kvp_kv_cache *kv, const kvp_fwd_batch *b, float *logits);

#endif
