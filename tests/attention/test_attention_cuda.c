/* CUDA kernels (append_kv, decode) against the CPU kernels on the same random paged cache. Skips itself,
 * with a message, when the build has no CUDA or cudaGetDeviceCount reports no device. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attn_cuda.h"
#include "common/alloc.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime_api.h>

static void *dev_copy(const void *h, size_t n)
{
    void *d = NULL;
    cr_assert_eq(cudaMalloc(&d, n ? n : 1), cudaSuccess);
    if (h) cr_assert_eq(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static uint64_t g_s = 0x9e3779b97f4a7c15ull;
static float rndf(void)
{
    g_s ^= g_s << 13, g_s ^= g_s >> 7, g_s ^= g_s << 17;
    return (float)((g_s >> 11) % 2000001) / 1000000.0f - 1.0f;
}

/* Random page table over a pool with spare blocks; K/V appended on the host (CPU) and on the device (CUDA)
 * from the same inputs; pools compared byte for byte, then decode compared. */
static void check(kvp_dtype t, int32_t D, int32_t G, int32_t bs, float cap)
{
    const int32_t nseq = 3, hkv = 2, hq = hkv * G, lens[3] = {1, 77, 300};
    int32_t indptr[4] = {0}, last[3], total = 0;
    for (int s = 0; s < nseq; s++) {
        int32_t pages = (lens[s] + bs - 1) / bs;
        indptr[s + 1] = indptr[s] + pages;
        last[s] = lens[s] - (pages - 1) * bs;
        total += lens[s];
    }
    int32_t nblocks = indptr[nseq] + 4, *idx = kvp_malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int32_t i = 0; i < nblocks; i++) idx[i] = nblocks - 1 - i;       /* a reversed, non-identity table */
    kvp_paged_kv h;
    cr_assert_eq(kvp_paged_kv_init(&h, t, nblocks, hkv, bs, D), KVP_OK);
    if (t == KVP_DTYPE_FP8_E4M3) h.k_scale = 0.01f, h.v_scale = 0.004f;
    cr_assert_eq(kvp_paged_kv_alloc_pools(&h), KVP_OK);
    size_t pool = kvp_paged_kv_pool_bytes(&h);
    memset(h.k, 0, pool), memset(h.v, 0, pool);
    kvp_paged_kv_set_pages(&h, nseq, indptr, idx, last);
    size_t row = (size_t)hkv * D;
    float *k = kvp_malloc(sizeof(float) * row * (size_t)total), *v = kvp_malloc(sizeof(float) * row * (size_t)total);
    int64_t *slots = kvp_malloc(sizeof(int64_t) * (size_t)total);
    for (size_t i = 0; i < row * (size_t)total; i++) k[i] = rndf(), v[i] = rndf();
    for (int s = 0, n = 0; s < nseq; s++)
        for (int32_t j = 0; j < lens[s]; j++, n++) slots[n] = (int64_t)idx[indptr[s] + j / bs] * bs + j % bs;
    slots[5] = -1;
    cr_assert_eq(kvp_attn_append_kv_cpu(&h, k, v, slots, total), KVP_OK);

    kvp_paged_kv d = h;
    d.k = dev_copy(NULL, pool), d.v = dev_copy(NULL, pool);
    cr_assert_eq(cudaMemset(d.k, 0, pool), cudaSuccess);
    cr_assert_eq(cudaMemset(d.v, 0, pool), cudaSuccess);
    d.kv_indptr = dev_copy(indptr, sizeof indptr), d.kv_indices = dev_copy(idx, sizeof(int32_t) * (size_t)nblocks);
    d.kv_last_page_len = dev_copy(last, sizeof last);
    float *dk = dev_copy(k, sizeof(float) * row * (size_t)total), *dv = dev_copy(v, sizeof(float) * row * (size_t)total);
    int64_t *ds = dev_copy(slots, sizeof(int64_t) * (size_t)total);
    cr_assert_eq(kvp_attn_append_kv_cuda(&d, dk, dv, ds, total, NULL), KVP_OK, "%s", kvp_error_detail());
    char *back = kvp_malloc(pool);
    cr_assert_eq(cudaMemcpy(back, d.k, pool, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(memcmp(back, h.k, pool), 0, "K pools differ (%s)", kvp_dtype_name(t));
    cr_assert_eq(cudaMemcpy(back, d.v, pool, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(memcmp(back, h.v, pool), 0, "V pools differ (%s)", kvp_dtype_name(t));

    size_t nout = (size_t)nseq * hq * D;
    float *q = kvp_malloc(sizeof(float) * nout), *o_cpu = kvp_malloc(sizeof(float) * nout), *o_gpu = kvp_malloc(sizeof(float) * nout);
    for (size_t i = 0; i < nout; i++) q[i] = rndf();
    float *dq = dev_copy(q, sizeof(float) * nout), *dout = dev_copy(NULL, sizeof(float) * nout);
    kvp_attn_params p = kvp_attn_default_params(hq);
    p.logits_soft_cap = cap;
    cr_assert_eq(kvp_attn_decode_cpu(&h, q, o_cpu, &p), KVP_OK);
    cr_assert_eq(kvp_attn_decode_cuda(&d, dq, dout, &p, NULL), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(cudaMemcpy(o_gpu, dout, sizeof(float) * nout, cudaMemcpyDeviceToHost), cudaSuccess);
    double num = 0, den = 0;
    for (size_t i = 0; i < nout; i++) {
        double e = fabs((double)o_gpu[i] - o_cpu[i]);
        num = e > num || e != e ? e : num;
        den = fabs((double)o_cpu[i]) > den ? fabs((double)o_cpu[i]) : den;
    }
    cr_assert(num / den < 1e-5, "decode_cuda %s D=%d G=%d bs=%d cap=%g: relative error %g", kvp_dtype_name(t), D, G, bs,
              (double)cap, num / den);

    cudaFree(d.k), cudaFree(d.v), cudaFree((void *)d.kv_indptr), cudaFree((void *)d.kv_indices);
    cudaFree((void *)d.kv_last_page_len), cudaFree(dk), cudaFree(dv), cudaFree(ds), cudaFree(dq), cudaFree(dout);
    kvp_free(back), kvp_free(q), kvp_free(o_cpu), kvp_free(o_gpu), kvp_free(k), kvp_free(v), kvp_free(slots), kvp_free(idx);
    kvp_paged_kv_free_pools(&h);
}
#endif

Test(attention_cuda, append_and_decode_match_cpu)
{
#ifndef KVP_HAVE_CUDA
    cr_skip_test("built without CUDA: the CUDA kernels are not compiled");
#else
    if (kvp_attn_cuda_device_count() == 0) cr_skip_test("no CUDA device (cudaGetDeviceCount reports none)");
    const kvp_dtype types[] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};
    const int32_t dims[] = {8, 16, 32, 64, 80, 96, 128, 256}, groups[] = {1, 2, 4, 8}, bss[] = {1, 16};
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int di = 0; di < 8; di++, n++) check(types[t], dims[di], groups[n % 4], bss[n % 2], 0.0f);
    for (int t = 0; t < 4; t++) /* soft-capped scores (the CPU kernels are checked against float64 with it) */
        for (int di = 0; di < 8; di += 3) check(types[t], dims[di], 2, 16, 0.5f + (float)di);
#endif
}

Test(attention_cuda, rejects_unsupported_head_dim)
{
    kvp_paged_kv kv;
    cr_assert_eq(kvp_paged_kv_init(&kv, KVP_DTYPE_F16, 4, 1, 16, 64), KVP_OK);
    kv.head_dim = 100;
    kv.k = kv.v = &kv; /* never dereferenced: rejected on the host */
    kvp_attn_params p = kvp_attn_default_params(1);
    float x;
    kvp_status st = kvp_attn_decode_cuda(&kv, &x, &x, &p, NULL);
#ifdef KVP_HAVE_CUDA
    cr_assert_eq(st, KVP_EUNSUPPORTED);
#else
    cr_assert_eq(st, KVP_ENODEVICE);
#endif
}
