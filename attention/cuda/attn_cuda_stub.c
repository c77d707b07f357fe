/* attention/cuda/attn_cuda_stub.c — the CUDA entry points of attention/cuda/attn_cuda.h in a build with neither
 * nvcc nor CUDA's headers (so no emulator either): each reports KVP_ENODEVICE. */
#include "attention/cuda/attn_cuda.h"

#define KVP_NO_CUDA(what) KVP_ERR(KVP_ENODEVICE, "%s: kvpage was built without CUDA (no nvcc, no CUDA headers)", what)

int kvp_attn_cuda_device_count(void) { return 0; }
int kvp_attn_cuda_emulated(void) { return 0; }
size_t kvp_attn_decode_cuda_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim)
{
    (void)num_seqs, (void)num_q_heads, (void)head_dim;
    return 0;
}
int kvp_attn_cuda_prefill_tensor_cores(kvp_dtype dtype, int32_t head_dim) { return (void)dtype, (void)head_dim, 0; }

kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                   const int64_t *slot_mapping, int32_t num_tokens, void *stream)
{
    (void)kv, (void)k, (void)v, (void)slot_mapping, (void)num_tokens, (void)stream;
    return KVP_NO_CUDA("append_kv_cuda");
}

kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p,
                                void *stream)
{
    (void)kv, (void)q, (void)out, (void)p, (void)stream;
    return KVP_NO_CUDA("decode_cuda");
}

kvp_status kvp_attn_prefill_cuda(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr,
                                 int32_t num_q_tokens, float *out, const kvp_attn_params *p, void *stream)
{
    (void)kv, (void)q, (void)qo_indptr, (void)num_q_tokens, (void)out, (void)p, (void)stream;
    return KVP_NO_CUDA("prefill_cuda");
}

kvp_status kvp_attn_copy_blocks_cuda(const kvp_paged_kv *layers, int32_t num_layers, const int32_t *block_pairs,
                                     int32_t n, void *stream)
{
    (void)layers, (void)num_layers, (void)block_pairs, (void)n, (void)stream;
    return KVP_NO_CUDA("copy_blocks_cuda");
}

kvp_status kvp_attn_swap_blocks_cuda(const kvp_paged_kv *dst, const kvp_paged_kv *src, const int32_t *block_pairs,
                                     int32_t n, void *stream)
{
    (void)dst, (void)src, (void)block_pairs, (void)n, (void)stream;
    return KVP_NO_CUDA("swap_blocks_cuda");
}

kvp_status kvp_paged_kv_cuda_alloc(kvp_paged_kv *kv, int host)
{
    (void)kv, (void)host;
    return KVP_NO_CUDA("paged_kv_cuda_alloc");
}

void kvp_paged_kv_cuda_free(kvp_paged_kv *kv, int host) { (void)kv, (void)host; }
