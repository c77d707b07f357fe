/* attention/cuda/attn_cuda.h — the CUDA forms of the attention kernels: the same descriptor
 * (attention/paged_kv.h), parameters (kvp_attn_params) and results as the *_cpu kernels of
 * attention/attention.h, on one GPU (or on kvpage's CPU emulator of CUDA: the kvp_attn_cuda_emu library).
 *
 * Every pointer handed to these functions is a DEVICE pointer (pools kv->k / kv->v, the page table
 * kv_indptr / kv_indices / kv_last_page_len, q, out, k, v, slot_mapping, qo_indptr, p->lse, block_pairs of
 * copy_blocks), except swap_blocks' block_pairs (host) and its host-side pool (pinned host memory from
 * kvp_paged_kv_cuda_alloc(.., 1) or cudaHostAlloc). Only the descriptor's scalar fields are read on the
 * host, so the page table and slot mapping are NOT validated: the caller guarantees what kvp_paged_kv_check(kv, 1)
 * would check (block ids in range, last_page_len in 1..block_size, seq_len >= 1 for decode, n_q <= seq_len);
 * the kernels skip slots and block pairs outside the pool rather than write out of bounds.
 * `stream` is a cudaStream_t (NULL: the default stream); calls are asynchronous; launch errors come back as
 * KVP_ECUDA with CUDA's error text.
 *
 * Parameter checks are those of the CPU (kvp_attn_check_params: sm_scale = inf -> KVP_EINVAL, unsupported
 * dtype / head_dim -> KVP_EUNSUPPORTED, ...), plus a CUDA layout rule: the pools must be 16-byte aligned and
 * every stride a multiple of 8 elements (16-byte vector loads), else KVP_EUNSUPPORTED.
 *
 * Built without CUDA (no nvcc and no CUDA headers), every function returns KVP_ENODEVICE and
 * kvp_attn_cuda_device_count() returns 0.
 */
#ifndef KVP_ATTENTION_CUDA_ATTN_CUDA_H
#define KVP_ATTENTION_CUDA_ATTN_CUDA_H

#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable by this process (0 without CUDA, without a driver or without a GPU; 1 on the
 * emulator). */
int kvp_attn_cuda_device_count(void);
/* 1 when these kernels run on kvpage's CPU emulator of CUDA (timings meaningless), 0 on a GPU. */
int kvp_attn_cuda_emulated(void);

/* ---- append_kv: pools[slot_mapping[t]] = k[t], v[t], converted as kvp_attn_append_kv_cpu does (bit for bit;
 * NaN keeps its sign); slot -1 skipped. k, v (num_tokens, num_kv_heads, head_dim) f32, 16-byte aligned.
 * Grid: one CTA per token, threads over (kv head, 8-element chunk). */
kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                   const int64_t *slot_mapping, int32_t num_tokens, void *stream);

/* ---- decode: one query token per sequence. Grid: (num_seqs, num_kv_heads * ceil(G / 8), splits), 128 threads:
 * one CTA per (sequence, KV head, up to 8 of its G query heads, KV split), so each K/V byte is read once per
 * split for all those heads. splits: p->kv_chunk_size > 0 -> up to 32 splits of at least that many tokens;
 * 0 -> automatic (more than one only when the grid would not fill the GPU: flash-decoding), merged by
 * log-sum-exp in a second kernel. Workspace: p->split_workspace when given (KVP_EINVAL when smaller than
 * kvp_attn_decode_cuda_workspace_bytes), else cudaMallocAsync on the stream. */
kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p,
                                void *stream);
/* Bytes of the split-KV workspace decode of num_seqs sequences may need (p->split_workspace): the partial
 * outputs and log-sum-exps of up to 32 splits per (sequence, query head). A host function; 0 without CUDA. */
size_t kvp_attn_decode_cuda_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim);

/* ---- prefill: as kvp_attn_prefill_cpu; num_q_tokens = qo_indptr[num_seqs] (the rows of q and out; the host
 * cannot read the device's qo_indptr). Grid: (query-row tiles, num_kv_heads), 128 threads; a row is a (query
 * token, query head) pair of one KV head's group. */
kvp_status kvp_attn_prefill_cuda(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr,
                                 int32_t num_q_tokens, float *out, const kvp_attn_params *p, void *stream);

/* 1 when kvp_attn_prefill_cuda runs on tensor cores for this pair (nvcc builds; f16, bf16 and fp8 pools with
 * head_dim a multiple of 16: wmma with Q and P rounded to 16 bits, about 1e-3 (f16, fp8) or 1e-2 (bf16) of the
 * output's scale from the CPU kernel); 0 for the CUDA-core kernel (f32 pools, head_dim 8, the emulator, or the
 * environment variable KVPAGE_CUDA_PREFILL=simt), which agrees with the CPU to f32 rounding. */
int kvp_attn_cuda_prefill_tensor_cores(kvp_dtype dtype, int32_t head_dim);

/* ---- copy_blocks: block_pairs (n, 2) int32 {src, dst} on the device, every pair in every one of num_layers
 * layers (descriptors with the same dtype, sizes and strides; their pools differ) in ONE launch: grid
 * (n, num_layers), threads over (head, token, 16- or 8-byte chunk). Same rules on pairs as the CPU. */
kvp_status kvp_attn_copy_blocks_cuda(const kvp_paged_kv *layers, int32_t num_layers, const int32_t *block_pairs,
                                     int32_t n, void *stream);

/* ---- swap_blocks: dst block block_pairs[2i+1] := src block block_pairs[2i] (block_pairs on the HOST,
 * validated: KVP_EINVAL before anything is copied) between a device pool and a pinned host pool, either way
 * (cudaMemcpyAsync / cudaMemcpy2DAsync on the stream, direction from unified addressing). */
kvp_status kvp_attn_swap_blocks_cuda(const kvp_paged_kv *dst, const kvp_paged_kv *src, const int32_t *block_pairs,
                                     int32_t n, void *stream);

/* Allocates kv's two pools (kvp_paged_kv_pool_bytes each) in device memory (host == 0) or pinned host memory
 * (host != 0, cudaHostAlloc); KVP_ENOMEM / KVP_ECUDA leave kv unchanged. Free with kvp_paged_kv_cuda_free
 * and the same `host`. */
kvp_status kvp_paged_kv_cuda_alloc(kvp_paged_kv *kv, int host);
void kvp_paged_kv_cuda_free(kvp_paged_kv *kv, int host);

#ifdef __cplusplus
}
#endif

#endif
