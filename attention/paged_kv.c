/* attention/paged_kv.c — the paged-KV descriptor: construction, validation, pool allocation and NaN fill. */
#include "attention/paged_kv.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"

int kvp_paged_kv_head_dim_index(int32_t head_dim)
{
    static const int32_t dims[KVP_NUM_HEAD_DIMS] = {8, 16, 32, 64, 80, 96, 128, 256};
    for (int i = 0; i < KVP_NUM_HEAD_DIMS; i++)
        if (dims[i] == head_dim) return i;
    return -1;
}

kvp_status kvp_paged_kv_init(kvp_paged_kv *kv, kvp_dtype dtype, int32_t num_blocks, int32_t num_kv_heads,
                             int32_t block_size, int32_t head_dim)
{
    if (kv == NULL) return KVP_ERR(KVP_EINVAL, "paged_kv_init: descriptor is NULL");
    if (kvp_dtype_size(dtype) == 0) return KVP_ERR(KVP_EINVAL, "paged_kv_init: invalid dtype %d", (int)dtype);
    if (num_blocks < 1 || num_kv_heads < 1 || block_size < 1 || head_dim < 1)
        return KVP_ERR(KVP_EINVAL,
                       "paged_kv_init: sizes must be >= 1 (num_blocks %d, num_kv_heads %d, block_size %d, "
                       "head_dim %d)",
                       num_blocks, num_kv_heads, block_size, head_dim);
    if (kvp_paged_kv_head_dim_index(head_dim) < 0)
        return KVP_ERR(KVP_EUNSUPPORTED, "paged_kv_init: head_dim %d with dtype %s is not supported", head_dim,
                       kvp_dtype_name(dtype));
    kvp_paged_kv d = {0};
    d.dtype = dtype;
    d.k_scale = d.v_scale = 1.0f;
    d.num_blocks = num_blocks;
    d.num_kv_heads = num_kv_heads;
    d.block_size = block_size;
    d.head_dim = head_dim;
    d.stride_token = head_dim;
    d.stride_head = (int64_t)block_size * head_dim;
    d.stride_block = (int64_t)num_kv_heads * block_size * head_dim;
    *kv = d;
    return KVP_OK;
}

void kvp_paged_kv_set_pages(kvp_paged_kv *kv, int32_t num_seqs, const int32_t *kv_indptr,
                            const int32_t *kv_indices, const int32_t *kv_last_page_len)
{
    kv->num_seqs = num_seqs;
    kv->kv_indptr = kv_indptr;
    kv->kv_indices = kv_indices;
    kv->kv_last_page_len = kv_last_page_len;
}

size_t kvp_paged_kv_pool_bytes(const kvp_paged_kv *kv)
{
    return (size_t)kv->num_blocks * (size_t)kv->stride_block * kvp_dtype_size(kv->dtype);
}

kvp_status kvp_paged_kv_alloc_pools(kvp_paged_kv *kv)
{
    size_t n = kvp_paged_kv_pool_bytes(kv);
    /* Large pools: 2 MiB aligned and backed by transparent huge pages where the kernel allows it, so that
     * pages scattered over the pool do not each cost a TLB miss. */
    const size_t huge = (size_t)2 << 20;
    size_t align = n >= 2 * huge ? huge : 64;
    void *k = kvp_aligned_alloc(align, n), *v = kvp_aligned_alloc(align, n);
    if (k == NULL || v == NULL) {
        kvp_free(k);
        kvp_free(v);
        return KVP_ERR(KVP_ENOMEM, "out of memory allocating two KV pools of %zu bytes", n);
    }
    if (align == huge) { /* advice only: failure (no THP support) changes nothing */
        (void)madvise(k, n & ~(huge - 1), MADV_HUGEPAGE);
        (void)madvise(v, n & ~(huge - 1), MADV_HUGEPAGE);
    }
    kv->k = k;
    kv->v = v;
    return KVP_OK;
}

void kvp_paged_kv_fill_nan(kvp_paged_kv *kv)
{
    const size_t bytes = kvp_paged_kv_pool_bytes(kv);
    for (int pool = 0; pool < 2; pool++) {
        void *p = pool ? kv->v : kv->k;
        if (kv->dtype == KVP_DTYPE_F32) {
            for (size_t i = 0; i < bytes / 4; i++) ((float *)p)[i] = NAN;
        } else if (kv->dtype == KVP_DTYPE_FP8_E4M3) {
            memset(p, kvp_f32_to_fp8e4m3(NAN), bytes);
        } else {
            const uint16_t h = kv->dtype == KVP_DTYPE_F16 ? kvp_f32_to_f16(NAN) : kvp_f32_to_bf16(NAN);
            for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)p)[i] = h;
        }
    }
}

void kvp_paged_kv_free_pools(kvp_paged_kv *kv)
{
    if (kv == NULL) return;
    kvp_free(kv->k);
    kvp_free(kv->v);
    kv->k = kv->v = NULL;
}

kvp_status kvp_paged_kv_check(const kvp_paged_kv *kv, int with_pages)
{
    if (kv == NULL) return KVP_ERR(KVP_EINVAL, "paged KV descriptor is NULL");
    if (kvp_dtype_size(kv->dtype) == 0) return KVP_ERR(KVP_EINVAL, "paged KV: invalid dtype %d", (int)kv->dtype);
    if (kv->k == NULL || kv->v == NULL) return KVP_ERR(KVP_EINVAL, "paged KV: K or V pool is NULL");
    if (kv->num_blocks < 1 || kv->num_kv_heads < 1 || kv->block_size < 1 || kv->head_dim < 1)
        return KVP_ERR(KVP_EINVAL, "paged KV: sizes must be >= 1 (num_blocks %d, num_kv_heads %d, block_size %d, head_dim %d)",
                       kv->num_blocks, kv->num_kv_heads, kv->block_size, kv->head_dim);
    if (kv->stride_token < kv->head_dim || kv->stride_head < (int64_t)(kv->block_size - 1) * kv->stride_token + kv->head_dim ||
        kv->stride_block < (int64_t)(kv->num_kv_heads - 1) * kv->stride_head + (int64_t)(kv->block_size - 1) * kv->stride_token + kv->head_dim)
        return KVP_ERR(KVP_EINVAL, "paged KV: strides (block %lld, head %lld, token %lld) overlap",
                       (long long)kv->stride_block, (long long)kv->stride_head, (long long)kv->stride_token);
    if (kv->dtype == KVP_DTYPE_FP8_E4M3 && !(kv->k_scale > 0.0f && kv->v_scale > 0.0f && kv->k_scale < 1e30f && kv->v_scale < 1e30f))
        return KVP_ERR(KVP_EINVAL, "paged KV: fp8 scales must be finite and > 0 (k_scale %g, v_scale %g)",
                       (double)kv->k_scale, (double)kv->v_scale);
    if (!with_pages) return KVP_OK;
    if (kv->num_seqs < 0) return KVP_ERR(KVP_EINVAL, "page table: num_seqs %d < 0", kv->num_seqs);
    if (kv->num_seqs == 0) return KVP_OK;
    if (kv->kv_indptr == NULL || kv->kv_last_page_len == NULL)
        return KVP_ERR(KVP_EINVAL, "page table: kv_indptr or kv_last_page_len is NULL");
    if (kv->kv_indptr[0] < 0) return KVP_ERR(KVP_EINVAL, "page table: kv_indptr[0] = %d < 0", kv->kv_indptr[0]);
    for (int32_t s = 0; s < kv->num_seqs; s++) {
        int32_t pages = kv->kv_indptr[s + 1] - kv->kv_indptr[s], last = kv->kv_last_page_len[s];
        if (kv->kv_indptr[s + 1] < kv->kv_indptr[s])
            return KVP_ERR(KVP_EINVAL, "page table: kv_indptr decreases at sequence %d (%d -> %d)", s,
                           kv->kv_indptr[s], kv->kv_indptr[s + 1]);
        if (pages > 0 && (last < 1 || last > kv->block_size))
            return KVP_ERR(KVP_EINVAL, "page table: kv_last_page_len[%d] = %d outside 1..%d", s, last, kv->block_size);
        if (pages == 0 && last != 0)
            return KVP_ERR(KVP_EINVAL, "page table: sequence %d has no page but kv_last_page_len %d", s, last);
        if ((int64_t)pages * kv->block_size > INT32_MAX)
            return KVP_ERR(KVP_EINVAL, "page table: sequence %d has %d pages, over the int32 token limit", s, pages);
    }
    int32_t total = kv->kv_indptr[kv->num_seqs];
    if (total > kv->kv_indptr[0] && kv->kv_indices == NULL) return KVP_ERR(KVP_EINVAL, "page table: kv_indices is NULL");
    for (int32_t i = kv->kv_indptr[0]; i < total; i++)
        if (kv->kv_indices[i] < 0 || kv->kv_indices[i] >= kv->num_blocks)
            return KVP_ERR(KVP_EINVAL, "page table: kv_indices[%d] = %d outside 0..%d", i, kv->kv_indices[i],
                           kv->num_blocks - 1);
    return KVP_OK;
}
