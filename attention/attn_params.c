/* attention/attn_params.c — the parameter checks shared by the CPU and CUDA kernels (decode and prefill). */
#include <math.h>

#include "attention/attention.h"

int kvp_attn_supported(kvp_dtype dtype, int32_t head_dim)
{
    return (unsigned)dtype < KVP_DTYPE_COUNT && kvp_paged_kv_head_dim_index(head_dim) >= 0;
}

kvp_status kvp_attn_check_params(const kvp_paged_kv *kv, const kvp_attn_params *p, const char *what)
{
    if (kv == NULL || p == NULL) return KVP_ERR(KVP_EINVAL, "%s: descriptor or params is NULL", what);
    const int32_t D = kv->head_dim, hkv = kv->num_kv_heads, hq = p->num_q_heads;
    if (!kvp_attn_supported(kv->dtype, D))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: head_dim %d with dtype %s is not supported (head_dim 8, 16, 32, 64, "
                       "80, 96, 128 or 256)", what, D, kvp_dtype_name(kv->dtype));
    if (hkv < 1 || hq < 1 || hq % hkv != 0)
        return KVP_ERR(KVP_EINVAL, "%s: num_q_heads %d is not a positive multiple of num_kv_heads %d", what, hq, hkv);
    if (!(p->sm_scale >= 0.0f) || isinf(p->sm_scale))
        return KVP_ERR(KVP_EINVAL, "%s: sm_scale %g must be finite and >= 0", what, (double)p->sm_scale);
    if (p->window_left < -1) return KVP_ERR(KVP_EINVAL, "%s: window_left %d < -1", what, p->window_left);
    if (!(p->logits_soft_cap >= 0.0f) || isinf(p->logits_soft_cap))
        return KVP_ERR(KVP_EINVAL, "%s: logits_soft_cap %g must be finite and >= 0", what, (double)p->logits_soft_cap);
    if (p->kv_chunk_size < 0) return KVP_ERR(KVP_EINVAL, "%s: kv_chunk_size %d < 0", what, p->kv_chunk_size);
    return KVP_OK;
}
