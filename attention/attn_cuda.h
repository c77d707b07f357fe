/* attention/attn_cuda.h — CUDA forms of append_kv and decode: the same descriptor (attention/paged_kv.h),
 * parameters and results as the *_cpu kernels of attention/attention.h.
 *
 * Every pointer handed to these functions is a DEVICE pointer: the pools kv->k / kv->v, the page table
 * (kv_indptr, kv_indices, kv_last_page_len), q, out, k, v, slot_mapping and p->lse. Only the scalar fields
 * of the descriptor are read on the host, so the page table is NOT validated here: the caller guarantees
 * what kvp_paged_kv_check(kv, 1) would check on the host (block ids in range, last_page_len in
 * 1..block_size, seq_len >= 1 for decode). `stream` is a cudaStream_t (NULL: the default stream); the
 * calls are asynchronous, launch errors are reported as KVP_ECUDA with the CUDA error text.
 *
 * Built without CUDA, every function returns KVP_ENODEVICE and kvp_attn_cuda_device_count() returns 0.
 */
#ifndef KVP_ATTENTION_ATTN_CUDA_H
#define KVP_ATTENTION_ATTN_CUDA_H

#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable by this process (0 without CUDA, without a driver or without a GPU). */
int kvp_attn_cuda_device_count(void);

/* Launch grid: one block per token (num_tokens), threads over (kv head, dim). */
kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                   const int64_t *slot_mapping, int32_t num_tokens, void *stream);

/* Launch grid: (num_seqs, num_q_heads), 4 warps per block splitting the sequence's tokens, merged in shared
 * memory. p->kv_chunk_size is ignored (no split across blocks yet). */
kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p,
                                void *stream);

#ifdef __cplusplus
}
#endif

#endif
