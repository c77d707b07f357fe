/* attention/cache_ops.c — writing and moving KV: append_kv (through a slot mapping), copy_blocks (a
 * copy-on-write batch), swap_blocks (between two pools), gather (paged -> dense f32). */
#include <string.h>

#include "attention/attention.h"
#include "common/alloc.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* Converts n floats (n a multiple of 8, as every supported head_dim) into the pool's element type. */
static void store_row(void *dst, const float *src, int32_t n, kvp_dtype t, float scale)
{
    switch (t) {
    case KVP_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVP_DTYPE_F16: {
        uint16_t *d = dst;
#if defined(__F16C__)
        for (int32_t i = 0; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        for (int32_t i = n & ~7; i < n; i++) d[i] = kvp_f32_to_f16(src[i]);
#else
        for (int32_t i = 0; i < n; i++) d[i] = kvp_f32_to_f16(src[i]);
#endif
        break;
    }
    case KVP_DTYPE_BF16: {
        uint16_t *d = dst;
        for (int32_t i = 0; i < n; i++) d[i] = kvp_f32_to_bf16(src[i]);
        break;
    }
    default: {
        uint8_t *d = dst;
        for (int32_t i = 0; i < n; i++) d[i] = kvp_f32_to_fp8e4m3(src[i] / scale); /* as the reference: x * (1/s) may round differently */
        break;
    }
    }
}

static kvp_status check_slots(const kvp_paged_kv *kv, const float *k, const float *v, const int64_t *slots,
                              int32_t num_tokens, const char *what)
{
    KVP_TRY(kvp_paged_kv_check(kv, 0));
    if (num_tokens < 0) return KVP_ERR(KVP_EINVAL, "%s: num_tokens %d < 0", what, num_tokens);
    if (num_tokens > 0 && (k == NULL || v == NULL || slots == NULL))
        return KVP_ERR(KVP_EINVAL, "%s: k, v or slot_mapping is NULL", what);
    const int64_t nslots = (int64_t)kv->num_blocks * kv->block_size;
    for (int32_t t = 0; t < num_tokens; t++)
        if (slots[t] < -1 || slots[t] >= nslots)
            return KVP_ERR(KVP_EINVAL, "%s: slot_mapping[%d] = %lld outside -1..%lld", what, t, (long long)slots[t],
                           (long long)nslots - 1);
    return KVP_OK;
}

/* Token t's K and V rows (every head) into its slot (none for slot -1). */
static void append_token(const kvp_paged_kv *kv, const float *k, const float *v, const int64_t *slot_mapping,
                         int32_t t, size_t es, float ks, float vs_)
{
    if (slot_mapping[t] < 0) return;
    const int32_t H = kv->num_kv_heads, D = kv->head_dim;
    for (int32_t h = 0; h < H; h++) {
        int64_t off = kvp_paged_kv_slot_offset(kv, slot_mapping[t], h);
        const float *ksrc = k + ((int64_t)t * H + h) * D, *vsrc = v + ((int64_t)t * H + h) * D;
        store_row((char *)kv->k + off * (int64_t)es, ksrc, D, kv->dtype, ks);
        store_row((char *)kv->v + off * (int64_t)es, vsrc, D, kv->dtype, vs_);
    }
}

kvp_status kvp_attn_append_kv_cpu(const kvp_paged_kv *kv, const float *k, const float *v,
                                  const int64_t *slot_mapping, int32_t num_tokens)
{
    KVP_TRY(check_slots(kv, k, v, slot_mapping, num_tokens, "append_kv"));
    const int32_t H = kv->num_kv_heads, D = kv->head_dim;
    const size_t es = kvp_dtype_size(kv->dtype);
    const int fp8 = kv->dtype == KVP_DTYPE_FP8_E4M3;
    const float ks = fp8 ? kv->k_scale : 1.0f, vs_ = fp8 ? kv->v_scale : 1.0f;
    int nt = kvp_attn_get_threads();
    if ((int64_t)num_tokens * H * D < 65536) nt = 1; /* not worth waking threads */
    if (nt == 1) { /* no OpenMP region at all: even a one-thread team, once a layer, cost single-stream decode
                    * of stories260K 10 % of its time */
        for (int32_t t = 0; t < num_tokens; t++) append_token(kv, k, v, slot_mapping, t, es, ks, vs_);
        return KVP_OK;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int32_t t = 0; t < num_tokens; t++) append_token(kv, k, v, slot_mapping, t, es, ks, vs_);
    return KVP_OK;
}

kvp_status kvp_attn_append_kv_ref(const kvp_paged_kv *kv, const float *k, const float *v,
                                  const int64_t *slot_mapping, int32_t num_tokens)
{
    KVP_TRY(check_slots(kv, k, v, slot_mapping, num_tokens, "append_kv_ref"));
    const int32_t H = kv->num_kv_heads, D = kv->head_dim;
    for (int32_t t = 0; t < num_tokens; t++) {
        if (slot_mapping[t] < 0) continue;
        int64_t block = slot_mapping[t] / kv->block_size, slot = slot_mapping[t] % kv->block_size;
        for (int32_t h = 0; h < H; h++)
            for (int32_t d = 0; d < D; d++) {
                int64_t o = block * kv->stride_block + h * kv->stride_head + slot * kv->stride_token + d;
                float kx = k[((int64_t)t * H + h) * D + d], vx = v[((int64_t)t * H + h) * D + d];
                switch (kv->dtype) {
                case KVP_DTYPE_F32:
                    ((float *)kv->k)[o] = kx;
                    ((float *)kv->v)[o] = vx;
                    break;
                case KVP_DTYPE_F16:
                    ((uint16_t *)kv->k)[o] = kvp_f32_to_f16(kx);
                    ((uint16_t *)kv->v)[o] = kvp_f32_to_f16(vx);
                    break;
                case KVP_DTYPE_BF16:
                    ((uint16_t *)kv->k)[o] = kvp_f32_to_bf16(kx);
                    ((uint16_t *)kv->v)[o] = kvp_f32_to_bf16(vx);
                    break;
                default:
                    ((uint8_t *)kv->k)[o] = kvp_f32_to_fp8e4m3(kx / kv->k_scale);
                    ((uint8_t *)kv->v)[o] = kvp_f32_to_fp8e4m3(vx / kv->v_scale);
                    break;
                }
            }
    }
    return KVP_OK;
}

static kvp_status check_pairs(const int32_t *pairs, int32_t n, int32_t src_blocks, int32_t dst_blocks,
                              const char *what)
{
    if (n < 0) return KVP_ERR(KVP_EINVAL, "%s: %d pairs < 0", what, n);
    if (n > 0 && pairs == NULL) return KVP_ERR(KVP_EINVAL, "%s: block_pairs is NULL", what);
    for (int32_t i = 0; i < n; i++) {
        if (pairs[2 * i] < 0 || pairs[2 * i] >= src_blocks)
            return KVP_ERR(KVP_EINVAL, "%s: pair %d: source block %d outside 0..%d", what, i, pairs[2 * i], src_blocks - 1);
        if (pairs[2 * i + 1] < 0 || pairs[2 * i + 1] >= dst_blocks)
            return KVP_ERR(KVP_EINVAL, "%s: pair %d: destination block %d outside 0..%d", what, i, pairs[2 * i + 1],
                           dst_blocks - 1);
    }
    return KVP_OK;
}

/* Copies block s of src into block d of dst (both pools), head by head so strides may differ. */
static void copy_block(const kvp_paged_kv *dst, const kvp_paged_kv *src, int32_t s, int32_t d)
{
    const size_t es = kvp_dtype_size(src->dtype);
    const int contiguous = src->stride_token == src->head_dim && dst->stride_token == dst->head_dim;
    for (int pool = 0; pool < 2; pool++) {
        const char *sb = (const char *)(pool ? src->v : src->k);
        char *db = (char *)(pool ? dst->v : dst->k);
        for (int32_t h = 0; h < src->num_kv_heads; h++) {
            if (contiguous) {
                memcpy(db + kvp_paged_kv_elem_offset(dst, d, h, 0) * (int64_t)es,
                       sb + kvp_paged_kv_elem_offset(src, s, h, 0) * (int64_t)es,
                       (size_t)src->block_size * (size_t)src->head_dim * es);
                continue;
            }
            for (int32_t t = 0; t < src->block_size; t++)
                memcpy(db + kvp_paged_kv_elem_offset(dst, d, h, t) * (int64_t)es,
                       sb + kvp_paged_kv_elem_offset(src, s, h, t) * (int64_t)es, (size_t)src->head_dim * es);
        }
    }
}

kvp_status kvp_attn_copy_blocks_cpu(const kvp_paged_kv *kv, const int32_t *block_pairs, int32_t n)
{
    KVP_TRY(kvp_paged_kv_check(kv, 0));
    KVP_TRY(check_pairs(block_pairs, n, kv->num_blocks, kv->num_blocks, "copy_blocks"));
    int nt = n >= 8 ? kvp_attn_get_threads() : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int32_t i = 0; i < n; i++)
        if (block_pairs[2 * i] != block_pairs[2 * i + 1]) copy_block(kv, kv, block_pairs[2 * i], block_pairs[2 * i + 1]);
    return KVP_OK;
}

kvp_status kvp_attn_swap_blocks_cpu(const kvp_paged_kv *dst, const kvp_paged_kv *src, const int32_t *block_pairs,
                                    int32_t n)
{
    KVP_TRY(kvp_paged_kv_check(dst, 0));
    KVP_TRY(kvp_paged_kv_check(src, 0));
    if (dst->dtype != src->dtype || dst->num_kv_heads != src->num_kv_heads || dst->block_size != src->block_size ||
        dst->head_dim != src->head_dim)
        return KVP_ERR(KVP_EINVAL, "swap_blocks: pools differ (dtype %s/%s, heads %d/%d, block_size %d/%d, head_dim %d/%d)",
                       kvp_dtype_name(dst->dtype), kvp_dtype_name(src->dtype), dst->num_kv_heads, src->num_kv_heads,
                       dst->block_size, src->block_size, dst->head_dim, src->head_dim);
    KVP_TRY(check_pairs(block_pairs, n, src->num_blocks, dst->num_blocks, "swap_blocks"));
    int nt = n >= 8 ? kvp_attn_get_threads() : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int32_t i = 0; i < n; i++) copy_block(dst, src, block_pairs[2 * i], block_pairs[2 * i + 1]);
    return KVP_OK;
}

static float load_one(const void *pool, int64_t off, kvp_dtype t, float scale)
{
    switch (t) {
    case KVP_DTYPE_F32: return ((const float *)pool)[off];
    case KVP_DTYPE_F16: return kvp_f16_to_f32(((const uint16_t *)pool)[off]);
    case KVP_DTYPE_BF16: return kvp_bf16_to_f32(((const uint16_t *)pool)[off]);
    default: return kvp_fp8e4m3_to_f32(((const uint8_t *)pool)[off]) * scale;
    }
}

kvp_status kvp_paged_kv_gather(const kvp_paged_kv *kv, float *k, float *v)
{
    KVP_TRY(kvp_paged_kv_check(kv, 1));
    if (k == NULL || v == NULL) return KVP_ERR(KVP_EINVAL, "gather: k or v is NULL");
    const int32_t H = kv->num_kv_heads, D = kv->head_dim;
    int64_t row = 0;
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        int32_t L = kvp_paged_kv_seq_len(kv, s);
        for (int32_t j = 0; j < L; j++, row++)
            for (int32_t h = 0; h < H; h++) {
                int64_t off = kvp_paged_kv_token_offset(kv, s, h, j);
                for (int32_t d = 0; d < D; d++) {
                    k[(row * H + h) * D + d] = load_one(kv->k, off + d, kv->dtype, kv->k_scale);
                    v[(row * H + h) * D + d] = load_one(kv->v, off + d, kv->dtype, kv->v_scale);
                }
            }
    }
    return KVP_OK;
}
