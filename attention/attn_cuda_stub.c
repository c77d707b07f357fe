/* attention/attn_cuda_stub.c — the CUDA entry points when the library is built without CUDA. */
#include "attention/attn_cuda.h"

#ifndef KVP_HAVE_CUDA
int kvp_attn_cuda_device_count(void) { return 0; }

kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                   const int64_t *slot_mapping, int32_t num_tokens, void *stream)
{
    (void)kv, (void)k, (void)v, (void)slot_mapping, (void)num_tokens, (void)stream;
    return KVP_ERR(KVP_ENODEVICE, "append_kv_cuda: kvpage was built without CUDA");
}

kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p,
                                void *stream)
{
    (void)kv, (void)q, (void)out, (void)p, (void)stream;
    return KVP_ERR(KVP_ENODEVICE, "decode_cuda: kvpage was built without CUDA");
}
#else
typedef int kvp_attn_cuda_stub_unused; /* the real ones are in attn_cuda.cu */
#endif
