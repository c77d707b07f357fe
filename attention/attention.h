/* attention/attention.h — paged attention kernels on the CPU (`*_cpu`) and their dense references (`*_ref`).
 *
 * Call pattern of a forward pass, per layer (f32 activations):
 *
 *     kvp_paged_kv kv = layer_descriptor;            // this layer's K/V pools + the step's page table
 *     kvp_attn_append_kv_cpu(&kv, k, v, slot_mapping, num_tokens);   // new tokens' K/V into the pools
 *     kvp_attn_params p = kvp_attn_default_params(num_q_heads);
 *     kvp_attn_prefill_cpu(&kv, q, qo_indptr, out, &p);   // or kvp_attn_decode_cpu(&kv, q, out, &p)
 *
 * The page table must already include the new tokens (append first, then attend): sequence s has
 * seq_len(s) tokens in the cache, the last n_q(s) of which are its query tokens.
 *
 * Shapes (all f32, row-major, contiguous, borrowed for the duration of the call):
 *   q, out  decode:  (num_seqs, num_q_heads, head_dim)
 *           prefill: (qo_indptr[num_seqs], num_q_heads, head_dim), tokens of sequence s are rows
 *                    qo_indptr[s] .. qo_indptr[s+1]-1 (qo_indptr[0] == 0, non-decreasing)
 *   k, v for append: (num_tokens, num_kv_heads, head_dim)
 *
 * Masking: query token i of sequence s (0-based among its n_q new tokens) sits at position
 * pos = seq_len(s) - n_q(s) + i and attends to keys j with lo <= j <= pos, where lo = 0, or
 * lo = max(0, pos - window_left) with a sliding window (window_left >= 0; a window of W tokens including
 * the query itself is window_left = W - 1). Decode is the case n_q = 1.
 *
 * GQA: num_q_heads must be a multiple of num_kv_heads; query head h reads KV head h / (num_q_heads/num_kv_heads).
 *
 * Errors: KVP_EINVAL (bad sizes, page table or slot, n_q > seq_len; the detail names the problem),
 * KVP_EUNSUPPORTED (a dtype/head_dim pair no kernel handles), KVP_ENOMEM (workspace). On any error
 * nothing has been written (outputs and pools are unchanged). Thread-safe: calls share no mutable state
 * besides the thread count.
 */
#ifndef KVP_ATTENTION_ATTENTION_H
#define KVP_ATTENTION_ATTENTION_H

#include <stdint.h>

#include "attention/paged_kv.h"
#include "common/cpu.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t num_q_heads;   /* multiple of kv->num_kv_heads */
    float sm_scale;        /* softmax scale applied to q.k; 0 means 1/sqrt(head_dim) */
    int32_t window_left;   /* -1: no sliding window; >= 0: keys [pos - window_left, pos] */
    float logits_soft_cap; /* > 0: each scaled score x becomes cap * tanh(x / cap) before the softmax (Gemma 2,
                              FlashInfer's logits_soft_cap); 0: off */
    int32_t kv_chunk_size; /* split-KV chunk (tokens): 0 automatic (split only when the batch is too small
                              to use every thread), > 0 exactly this chunk size (results equal up to
                              rounding for any value) */
    float *lse;            /* optional output (num_q_tokens, num_q_heads): natural log of sum exp(scaled
                              scores), -inf for a row with no key; borrowed, may be NULL */
    void *split_workspace; /* CUDA decode only: a device buffer of split_workspace_bytes (at least
                              kvp_attn_decode_cuda_workspace_bytes) for the split-KV partials; NULL: allocated
                              with cudaMallocAsync on the stream (a graph capture then records memory nodes) */
    size_t split_workspace_bytes;
} kvp_attn_params;

/* num_q_heads as given, sm_scale 0, window_left -1, logits_soft_cap 0, kv_chunk_size 0, lse and
 * split_workspace NULL. */
kvp_attn_params kvp_attn_default_params(int32_t num_q_heads);

/* Nonzero when the CPU kernels handle this pair. head_dim in {8, 16, 32, 64, 80, 96, 128, 256} and every
 * dtype of kvp_dtype. */
int kvp_attn_supported(kvp_dtype dtype, int32_t head_dim);

/* The checks of decode and prefill parameters that the CPU and CUDA kernels share: dtype/head_dim supported
 * (KVP_EUNSUPPORTED), num_q_heads a positive multiple of num_kv_heads, sm_scale finite and >= 0,
 * window_left >= -1, logits_soft_cap finite and >= 0, kv_chunk_size >= 0 (KVP_EINVAL naming `what`).
 * Reads only kv's scalar fields. */
kvp_status kvp_attn_check_params(const kvp_paged_kv *kv, const kvp_attn_params *p, const char *what);

/* Threads used by the *_cpu kernels: n >= 1, or 0 for the number of online CPUs (the default). Process-wide. */
void kvp_attn_set_threads(int n);
int kvp_attn_get_threads(void);

/* Vector lanes of the *_cpu score and value passes (and the softmax between them, which follows the value
 * pass): 8 (AVX2, or portable C) or 16 (AVX-512 F, BW and VL, where the CPU and the build have it:
 * kvp_cpu_max_lanes; head_dim 8 puts two rows in a vector). Results agree to rounding, not bit for bit (the
 * dot products are summed in another order). kvp_attn_set_lanes: 0 (automatic, the default: prefill, bound
 * by arithmetic, on 16 lanes where available; decode, mostly bound by memory, with its score pass on 8, which
 * measured faster than 16 on a busy memory bus, and its value pass on 16, but f32 decode on 8 for both;
 * head_dim 8 and fp8, bound by arithmetic, on 16 for both), 8 or 16 (both passes); KVP_EINVAL for other
 * counts, KVP_EUNSUPPORTED for 16 without AVX-512. Process-wide, like the thread count. kvp_attn_lanes_for:
 * the lanes of each pass of a decode (decode != 0) or a prefill over kv now. */
kvp_status kvp_attn_set_lanes(int lanes);
int kvp_attn_get_lanes(void);
void kvp_attn_lanes_for(const kvp_paged_kv *kv, int decode, int *score_lanes, int *value_lanes);
/* "auto" -> 0, "8" -> 8, "16" -> 16 (the CLI's --lanes / --attn-lanes); KVP_EINVAL naming the text otherwise. */
kvp_status kvp_attn_lanes_parse(const char *s, int *lanes);

/* ---- append_kv: pools[slot_mapping[t]] = k[t], v[t] (converted to kv->dtype, fp8 divided by its scale).
 * slot_mapping (num_tokens): block * block_size + offset, or -1 to skip the token. Page table not read. */
kvp_status kvp_attn_append_kv_cpu(const kvp_paged_kv *kv, const float *k, const float *v,
                                  const int64_t *slot_mapping, int32_t num_tokens);
kvp_status kvp_attn_append_kv_ref(const kvp_paged_kv *kv, const float *k, const float *v,
                                  const int64_t *slot_mapping, int32_t num_tokens);

/* ---- decode: one query token per sequence (kv->num_seqs sequences, each seq_len >= 1). */
kvp_status kvp_attn_decode_cpu(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p);

/* ---- prefill: n_q(s) = qo_indptr[s+1] - qo_indptr[s] query tokens per sequence (0 <= n_q <= seq_len),
 * causal over the cached prefix and the new tokens; a chunk of a longer prompt is just a call whose page
 * table holds the earlier chunks too (chunked prefill). */
kvp_status kvp_attn_prefill_cpu(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr, float *out,
                                const kvp_attn_params *p);

/* ---- copy_blocks: for i < n, block block_pairs[2i+1] := block block_pairs[2i] in both pools (a CoW batch,
 * block_pairs is (n, 2) int32 {src, dst}). Pairs run in parallel: no block may be the destination of one
 * pair and the source or destination of another (a CoW batch never is). A block id out of range ->
 * KVP_EINVAL, nothing copied. Page table not read. */
kvp_status kvp_attn_copy_blocks_cpu(const kvp_paged_kv *kv, const int32_t *block_pairs, int32_t n);
/* ---- swap_blocks: dst block block_pairs[2i+1] := src block block_pairs[2i], between two pools of the same
 * dtype, num_kv_heads, block_size and head_dim (e.g. device-side -> host-side pool, or back); strides and
 * num_blocks may differ. Same rules on pairs as copy_blocks. */
kvp_status kvp_attn_swap_blocks_cpu(const kvp_paged_kv *dst, const kvp_paged_kv *src, const int32_t *block_pairs,
                                    int32_t n);

/* ---- dense references: contiguous f32 K/V, float64 accumulation, single thread.
 * k, v: (kv_seq_indptr[num_seqs], num_kv_heads, head_dim); sequence s owns rows
 * kv_seq_indptr[s] .. kv_seq_indptr[s+1]-1 (its seq_len is their count). Same masking and params. */
kvp_status kvp_attn_prefill_ref(const float *k, const float *v, const int32_t *kv_seq_indptr, int32_t num_seqs,
                                int32_t num_kv_heads, int32_t head_dim, const float *q, const int32_t *qo_indptr,
                                float *out, const kvp_attn_params *p);
kvp_status kvp_attn_decode_ref(const float *k, const float *v, const int32_t *kv_seq_indptr, int32_t num_seqs,
                               int32_t num_kv_heads, int32_t head_dim, const float *q, float *out,
                               const kvp_attn_params *p);

/* Gathers the paged K/V of every sequence into dense f32 (kv_seq_indptr layout above, computed from the
 * page table: k and v must hold sum(seq_len) * num_kv_heads * head_dim floats), scales applied. */
kvp_status kvp_paged_kv_gather(const kvp_paged_kv *kv, float *k, float *v);

#ifdef __cplusplus
}
#endif

#endif
