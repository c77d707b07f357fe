/* tests/attention/test_attn_cuda.c — the CUDA attention kernels (attention/cuda/attn_cuda.h) against the CPU
 * kernels and the float64 dense references, on random paged caches: non-identity page tables, partly filled
 * last blocks, block sizes 1, 3, 16 and 256, GQA ratios 1, 2, 3, 4 and 8, sliding windows, soft caps, sm_scale,
 * lse, split-KV against unsplit, padded strides, NaN in every unused slot, unsupported sizes rejected,
 * sm_scale = inf rejected as on the CPU, NaN's sign kept by append_kv, copy_blocks over layers, swap_blocks
 * through pinned host memory.
 *
 * One source, two programs: attention_test_attn_cuda_emu (the CPU emulator of CUDA, Criterion, run by CI) and
 * attention_test_attn_cuda (native, the standalone runner; skips itself without a device; bench/gpu_check.sh
 * runs it on a GPU). Fixed seeds; every failure names its case.
 */
#include "common/kvp_test.h"
#include "common/kvp_cuda_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attn_hd.h"
#include "attention/cuda/attn_cuda.h"
#include "common/alloc.h"

#define CK(call) cr_assert_eq((call), cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))
#define OK(call) cr_assert_eq((call), KVP_OK, "%s: %s", #call, kvp_error_detail())

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float rndf(void) { return (float)(rnd() % 2000001u) / 1000000.0f - 1.0f; } /* [-1, 1] */

static void *dev_copy(const void *h, size_t n)
{
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 16));
    if (h && n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static void to_host(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

/* A random paged cache, on the host (CPU pools) and bit for bit the same on the device. */
typedef struct {
    kvp_paged_kv h, d;
    int32_t nseq, total, *lens, *indptr, *indices, *last;
    int32_t *d_indptr, *d_indices, *d_last;
    char name[160];
} cache_t;

static void cache_make(cache_t *c, kvp_dtype t, int32_t D, int32_t hkv, int32_t bs, int32_t nseq, const int32_t *lens,
                       int padded, uint64_t sd)
{
    memset(c, 0, sizeof *c);
    seed(sd);
    c->nseq = nseq;
    c->lens = kvp_malloc(sizeof(int32_t) * (size_t)nseq);
    c->indptr = kvp_malloc(sizeof(int32_t) * (size_t)(nseq + 1));
    c->last = kvp_malloc(sizeof(int32_t) * (size_t)nseq);
    c->indptr[0] = 0;
    for (int s = 0; s < nseq; s++) {
        const int32_t pages = (lens[s] + bs - 1) / bs;
        c->lens[s] = lens[s];
        c->indptr[s + 1] = c->indptr[s] + pages;
        c->last[s] = pages ? lens[s] - (pages - 1) * bs : 0;
        c->total += lens[s];
    }
    const int32_t nblocks = c->indptr[nseq] + 3; /* spare blocks stay NaN */
    int32_t *perm = kvp_malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int32_t i = 0; i < nblocks; i++) perm[i] = i;
    for (int32_t i = nblocks - 1; i > 0; i--) { /* a random, non-identity page table */
        int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    if (nblocks > 1 && perm[0] == 0) perm[0] = perm[1], perm[1] = 0;
    c->indices = perm;
    OK(kvp_paged_kv_init(&c->h, t, nblocks, hkv, bs, D));
    if (padded) {
        c->h.stride_token = D + 8;
        c->h.stride_head = (int64_t)bs * (D + 8) + 8;
        c->h.stride_block = (int64_t)hkv * c->h.stride_head + 16;
    }
    if (t == KVP_DTYPE_FP8_E4M3) c->h.k_scale = 0.05f, c->h.v_scale = 0.02f;
    OK(kvp_paged_kv_alloc_pools(&c->h));
    kvp_paged_kv_fill_nan(&c->h);
    kvp_paged_kv_set_pages(&c->h, nseq, c->indptr, c->indices, c->last);
    const size_t row = (size_t)hkv * D;
    float *k = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1)), *v = kvp_malloc(sizeof(float) * row * (size_t)(c->total + 1));
    int64_t *slots = kvp_malloc(sizeof(int64_t) * (size_t)(c->total + 1));
    for (size_t i = 0; i < row * (size_t)c->total; i++) k[i] = rndf(), v[i] = rndf();
    for (int s = 0, n = 0; s < nseq; s++)
        for (int32_t j = 0; j < lens[s]; j++, n++) slots[n] = (int64_t)c->indices[c->indptr[s] + j / bs] * bs + j % bs;
    OK(kvp_attn_append_kv_cpu(&c->h, k, v, slots, c->total));
    kvp_free(k), kvp_free(v), kvp_free(slots);
    c->d = c->h;
    const size_t pool = kvp_paged_kv_pool_bytes(&c->h);
    c->d.k = dev_copy(c->h.k, pool);
    c->d.v = dev_copy(c->h.v, pool);
    c->d_indptr = dev_copy(c->indptr, sizeof(int32_t) * (size_t)(nseq + 1));
    c->d_indices = dev_copy(c->indices, sizeof(int32_t) * (size_t)(c->indptr[nseq] + 1));
    c->d_last = dev_copy(c->last, sizeof(int32_t) * (size_t)nseq);
    kvp_paged_kv_set_pages(&c->d, nseq, c->d_indptr, c->d_indices, c->d_last);
    snprintf(c->name, sizeof c->name, "%s D=%d hkv=%d bs=%d seqs=%d%s seed=%llu", kvp_dtype_name(t), D, hkv, bs, nseq,
             padded ? " padded" : "", (unsigned long long)sd);
}

static void cache_free(cache_t *c)
{
    kvp_paged_kv_free_pools(&c->h);
    CK(cudaFree(c->d.k));
    CK(cudaFree(c->d.v));
    CK(cudaFree(c->d_indptr));
    CK(cudaFree(c->d_indices));
    CK(cudaFree(c->d_last));
    kvp_free(c->lens), kvp_free(c->indptr), kvp_free(c->indices), kvp_free(c->last);
}

static double max_abs(const float *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* |a - b| <= tol * max(1, max|b|) everywhere, a finite (NaN in a reaches here as a failure). */
static void expect_close(const float *a, const float *b, size_t n, double tol, const char *what, const char *name)
{
    const double scale = max_abs(b, n) > 1.0 ? max_abs(b, n) : 1.0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) || (isinf(a[i]) && a[i] == b[i]), "%s [%s]: element %zu is %g", what, name, i, (double)a[i]);
        if (isinf(b[i]) && a[i] == b[i]) continue;
        cr_assert(fabs((double)a[i] - (double)b[i]) <= tol * scale, "%s [%s]: element %zu: %.7g vs %.7g (tol %g)", what,
                  name, i, (double)a[i], (double)b[i], tol * scale);
    }
}

/* Decode (prefill when nq != NULL: nq[s] query tokens per sequence) on the device vs the CPU kernel vs the
 * float64 reference on the gathered cache. */
static void check_attend(cache_t *c, int32_t G, kvp_attn_params p, const int32_t *nq, const char *label)
{
    const int32_t hkv = c->h.num_kv_heads, D = c->h.head_dim, hq = hkv * G;
    int32_t *qo = kvp_malloc(sizeof(int32_t) * (size_t)(c->nseq + 1)), *kvi = kvp_malloc(sizeof(int32_t) * (size_t)(c->nseq + 1));
    qo[0] = kvi[0] = 0;
    for (int s = 0; s < c->nseq; s++) qo[s + 1] = qo[s] + (nq ? nq[s] : 1), kvi[s + 1] = kvi[s] + c->lens[s];
    const int32_t nrows = qo[c->nseq];
    const size_t qn = (size_t)nrows * hq * D, ln = (size_t)nrows * hq;
    float *q = kvp_malloc(sizeof(float) * (qn + 1)), *o_cpu = kvp_malloc(sizeof(float) * (qn + 1)),
          *o_gpu = kvp_malloc(sizeof(float) * (qn + 1)), *o_ref = kvp_malloc(sizeof(float) * (qn + 1));
    float *l_cpu = kvp_malloc(sizeof(float) * (ln + 1)), *l_gpu = kvp_malloc(sizeof(float) * (ln + 1)),
          *l_ref = kvp_malloc(sizeof(float) * (ln + 1));
    for (size_t i = 0; i < qn; i++) q[i] = rndf();
    p.num_q_heads = hq;
    char name[256];
    snprintf(name, sizeof name, "%s: %s G=%d window=%d cap=%g scale=%g chunk=%d", label, c->name, G, p.window_left,
             (double)p.logits_soft_cap, (double)p.sm_scale, p.kv_chunk_size);
    /* CPU */
    p.lse = l_cpu;
    if (nq) OK(kvp_attn_prefill_cpu(&c->h, q, qo, o_cpu, &p));
    else OK(kvp_attn_decode_cpu(&c->h, q, o_cpu, &p));
    /* reference */
    float *dk = kvp_malloc(sizeof(float) * (size_t)c->total * hkv * D + 4), *dv = kvp_malloc(sizeof(float) * (size_t)c->total * hkv * D + 4);
    OK(kvp_paged_kv_gather(&c->h, dk, dv));
    p.lse = l_ref;
    if (nq) OK(kvp_attn_prefill_ref(dk, dv, kvi, c->nseq, hkv, D, q, qo, o_ref, &p));
    else OK(kvp_attn_decode_ref(dk, dv, kvi, c->nseq, hkv, D, q, o_ref, &p));
    /* device */
    float *d_q = dev_copy(q, sizeof(float) * qn), *d_o = dev_copy(NULL, sizeof(float) * qn), *d_l = dev_copy(NULL, sizeof(float) * ln);
    int32_t *d_qo = dev_copy(qo, sizeof(int32_t) * (size_t)(c->nseq + 1));
    CK(cudaMemset(d_o, 0xff, sizeof(float) * qn)); /* NaN: a row the kernel forgets shows */
    p.lse = d_l;
    if (nq) OK(kvp_attn_prefill_cuda(&c->d, d_q, d_qo, nrows, d_o, &p, NULL));
    else OK(kvp_attn_decode_cuda(&c->d, d_q, d_o, &p, NULL));
    CK(cudaDeviceSynchronize());
    to_host(o_gpu, d_o, sizeof(float) * qn);
    to_host(l_gpu, d_l, sizeof(float) * ln);
    /* tensor-core prefill rounds Q and P to 16 bits (attention/cuda/attn_cuda.h); everything else is f32 */
    const int tc = nq && kvp_attn_cuda_prefill_tensor_cores(c->h.dtype, D);
    const double tol = tc ? (c->h.dtype == KVP_DTYPE_BF16 ? 3e-2 : 4e-3) : 2e-4;
    expect_close(o_gpu, o_cpu, qn, tol, "out vs CPU", name);
    expect_close(o_gpu, o_ref, qn, tol + 3e-4, "out vs float64 reference", name);
    expect_close(l_gpu, l_cpu, ln, tol, "lse vs CPU", name);
    expect_close(l_gpu, l_ref, ln, tol + 3e-4, "lse vs float64 reference", name);
    CK(cudaFree(d_q));
    CK(cudaFree(d_o));
    CK(cudaFree(d_l));
    CK(cudaFree(d_qo));
    kvp_free(q), kvp_free(o_cpu), kvp_free(o_gpu), kvp_free(o_ref), kvp_free(l_cpu), kvp_free(l_gpu), kvp_free(l_ref);
    kvp_free(dk), kvp_free(dv), kvp_free(qo), kvp_free(kvi);
}

static const kvp_dtype k_types[4] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};

/* ---- conversions shared by host and device (attention/attn_hd.h) against attention/dtype.c */
Test(attn_cuda, conversions_match_dtype_c)
{
    KVP_REQUIRE_DEVICE();
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kvp_hd_f16_to_f32((uint16_t)h), b = kvp_f16_to_f32((uint16_t)h);
        cr_assert(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b) && signbit(a) == signbit(b)), "f16 %04x", h);
        a = kvp_hd_bf16_to_f32((uint16_t)h), b = kvp_bf16_to_f32((uint16_t)h);
        cr_assert(memcmp(&a, &b, 4) == 0, "bf16 %04x", h);
    }
    for (uint32_t c = 0; c < 256; c++) {
        float a = kvp_hd_fp8e4m3_to_f32((uint8_t)c), b = kvp_fp8e4m3_to_f32((uint8_t)c);
        cr_assert(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b) && signbit(a) == signbit(b)), "fp8 %02x: %g %g", c, a, b);
    }
    seed(7);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rnd() << 16 ^ rnd();
        if (i < 1024) u = (i & 1 ? 0xff800000u : 0x7f800000u) | (uint32_t)(i >> 1) * 8191u; /* NaNs, both signs */
        float x;
        memcpy(&x, &u, 4);
        cr_assert_eq(kvp_hd_f32_to_f16(x), kvp_f32_to_f16(x), "f32 %08x -> f16", u);
        cr_assert_eq(kvp_hd_f32_to_bf16(x), kvp_f32_to_bf16(x), "f32 %08x -> bf16", u);
        cr_assert_eq(kvp_hd_f32_to_fp8e4m3(x), kvp_f32_to_fp8e4m3(x), "f32 %08x -> fp8", u);
        if (x != x) cr_assert(kvp_hd_f32_to_f16(x) >> 15 == u >> 31, "NaN sign kept in f16 (%08x)", u);
    }
}

/* ---- append_kv: the device pools equal the CPU's byte for byte (NaN signs included), slot -1 skipped */
Test(attn_cuda, append_kv_matches_cpu_bitwise)
{
    KVP_REQUIRE_DEVICE();
    const int32_t dims[4] = {8, 64, 80, 128}, bss[3] = {1, 3, 16};
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 4; di++) {
            const kvp_dtype t = k_types[ti];
            const int32_t D = dims[di], bs = bss[(ti + di) % 3], hkv = 2, lens[2] = {5, 2 * bs + 1};
            cache_t c;
            cache_make(&c, t, D, hkv, bs, 2, lens, di == 2, 100 + ti * 10 + di);
            /* new tokens: every slot of the pool, in random order, some skipped (-1), with +-NaN, +-inf, huge */
            const int32_t nslots = c.h.num_blocks * bs, n = nslots + 4;
            float *k = kvp_malloc(sizeof(float) * (size_t)n * hkv * D), *v = kvp_malloc(sizeof(float) * (size_t)n * hkv * D);
            int64_t *slots = kvp_malloc(sizeof(int64_t) * (size_t)n);
            for (int32_t i = 0; i < n; i++) slots[i] = i < nslots ? i : -1;
            for (int32_t i = n - 1; i > 0; i--) {
                int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1));
                int64_t x = slots[i];
                slots[i] = slots[j], slots[j] = x;
            }
            for (int32_t i = 0; i < nslots / 5; i++) slots[rnd() % (uint32_t)n] = -1;
            for (size_t i = 0; i < (size_t)n * hkv * D; i++) {
                k[i] = rndf() * 30.0f, v[i] = rndf();
                if (i % 97 == 0) k[i] = -NAN;
                if (i % 101 == 0) v[i] = NAN;
                if (i % 103 == 0) k[i] = -INFINITY;
                if (i % 107 == 0) v[i] = 1e6f;
            }
            float *dk = dev_copy(k, sizeof(float) * (size_t)n * hkv * D), *dv = dev_copy(v, sizeof(float) * (size_t)n * hkv * D);
            int64_t *ds = dev_copy(slots, sizeof(int64_t) * (size_t)n);
            OK(kvp_attn_append_kv_cpu(&c.h, k, v, slots, n));
            OK(kvp_attn_append_kv_cuda(&c.d, dk, dv, ds, n, NULL));
            const size_t pool = kvp_paged_kv_pool_bytes(&c.h);
            unsigned char *hk = kvp_malloc(pool), *hv = kvp_malloc(pool);
            to_host(hk, c.d.k, pool);
            to_host(hv, c.d.v, pool);
            for (size_t i = 0; i < pool; i++) {
                cr_assert_eq(hk[i], ((unsigned char *)c.h.k)[i], "K byte %zu [%s]", i, c.name);
                cr_assert_eq(hv[i], ((unsigned char *)c.h.v)[i], "V byte %zu [%s]", i, c.name);
            }
            kvp_free(hk), kvp_free(hv), kvp_free(k), kvp_free(v), kvp_free(slots);
            CK(cudaFree(dk));
            CK(cudaFree(dv));
            CK(cudaFree(ds));
            cache_free(&c);
        }
}

/* ---- decode over block sizes, GQA ratios, head dims and dtypes */
Test(attn_cuda, decode_matches_cpu_and_reference)
{
    KVP_REQUIRE_DEVICE();
    const int32_t bss[4] = {1, 3, 16, 256}, gs[5] = {1, 2, 3, 4, 8}, dims[8] = {64, 128, 80, 96, 256, 8, 16, 32};
    int k = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int bi = 0; bi < 4; bi++)
            for (int gi = 0; gi < 5; gi += (bi == 3 ? 2 : 1), k++) {
                const int32_t bs = bss[bi], D = dims[k % 8], lens[3] = {1, 37, bs == 256 ? 300 : 150};
                cache_t c;
                cache_make(&c, k_types[ti], D, 2, bs, 3, lens, 0, 1000 + (uint64_t)k);
                check_attend(&c, gs[gi], kvp_attn_default_params(1), NULL, "decode");
                cache_free(&c);
            }
}

/* ---- window, soft cap, sm_scale, lse; padded strides; GQA 12 (two CTAs of query heads per KV head) */
Test(attn_cuda, decode_window_cap_scale_strides)
{
    KVP_REQUIRE_DEVICE();
    const int32_t lens[4] = {200, 1, 64, 129};
    for (int ti = 0; ti < 4; ti++) {
        cache_t c;
        cache_make(&c, k_types[ti], 128, 2, 16, 4, lens, 1, 2000 + (uint64_t)ti);
        kvp_attn_params p = kvp_attn_default_params(1);
        const int32_t wins[3] = {0, 5, 100};
        for (int w = 0; w < 3; w++) {
            p.window_left = wins[w];
            check_attend(&c, 2, p, NULL, "decode window");
        }
        p = kvp_attn_default_params(1);
        p.logits_soft_cap = 0.7f, p.sm_scale = 0.3f;
        check_attend(&c, 4, p, NULL, "decode cap+scale");
        check_attend(&c, 12, kvp_attn_default_params(1), NULL, "decode G=12");
        cache_free(&c);
    }
}

/* ---- split-KV (flash-decoding) against unsplit and the CPU, one long sequence and a short one */
Test(attn_cuda, decode_split_kv)
{
    KVP_REQUIRE_DEVICE();
    const int32_t lens[2] = {700, 3};
    const int32_t chunks[4] = {16, 64, 100, 0};
    for (int ti = 0; ti < 4; ti += 1) {
        cache_t c;
        cache_make(&c, k_types[ti], 64, 1, 16, 2, lens, 0, 3000 + (uint64_t)ti);
        for (int i = 0; i < 4; i++) {
            kvp_attn_params p = kvp_attn_default_params(1);
            p.kv_chunk_size = chunks[i];
            p.window_left = i == 2 ? 300 : -1;
            check_attend(&c, 4, p, NULL, "decode split");
        }
        cache_free(&c);
    }
}

/* ---- prefill: ragged batches, cached prefix + new tokens (chunked prefill), causal, window, GQA */
Test(attn_cuda, prefill_matches_cpu_and_reference)
{
    KVP_REQUIRE_DEVICE();
    const int32_t lens[3] = {5, 70, 130}, nq[3] = {5, 23, 1};
    const int32_t dims[8] = {64, 128, 80, 96, 256, 8, 16, 32}, bss[4] = {1, 3, 16, 256}, gs[5] = {1, 2, 3, 4, 8};
    for (int ti = 0; ti < 4; ti++)
        for (int i = 0; i < 4; i++) {
            const int k = ti * 4 + i;
            cache_t c;
            cache_make(&c, k_types[ti], dims[k % 8], 2, bss[i], 3, lens, k % 3 == 0, 4000 + (uint64_t)k);
            kvp_attn_params p = kvp_attn_default_params(1);
            check_attend(&c, gs[k % 5], p, nq, "prefill");
            p.window_left = 9, p.logits_soft_cap = 0.5f, p.sm_scale = 0.2f;
            check_attend(&c, gs[(k + 2) % 5], p, nq, "prefill window+cap+scale");
            cache_free(&c);
        }
}

/* ---- rejected inputs: unsupported head_dim and strides, bad heads, sm_scale = inf (as the CPU), ... */
Test(attn_cuda, rejects_what_the_cpu_rejects)
{
    KVP_REQUIRE_DEVICE();
    const int32_t lens[1] = {20};
    cache_t c;
    cache_make(&c, KVP_DTYPE_F16, 64, 2, 16, 1, lens, 0, 5000);
    float *dq = dev_copy(NULL, 4096 * sizeof(float)), *dout = dev_copy(NULL, 4096 * sizeof(float));
    kvp_attn_params p = kvp_attn_default_params(4);
    p.sm_scale = INFINITY;
    float hq[4 * 64] = {0}, hout[4 * 64];
    cr_assert_eq(kvp_attn_decode_cpu(&c.h, hq, hout, &p), KVP_EINVAL);
    cr_assert_eq(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL), KVP_EINVAL, "sm_scale = inf: %s", kvp_error_detail());
    cr_assert(strstr(kvp_error_detail(), "sm_scale") != NULL, "%s", kvp_error_detail());
    p.sm_scale = NAN;
    cr_assert_eq(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL), KVP_EINVAL);
    p = kvp_attn_default_params(3); /* not a multiple of 2 KV heads */
    cr_assert_eq(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL), KVP_EINVAL);
    p = kvp_attn_default_params(4);
    p.logits_soft_cap = -1.0f;
    cr_assert_eq(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL), KVP_EINVAL);
    p = kvp_attn_default_params(4);
    p.window_left = -2;
    cr_assert_eq(kvp_attn_prefill_cuda(&c.d, dq, c.d_indptr, 1, dout, &p, NULL), KVP_EINVAL);
    kvp_paged_kv bad = c.d;
    bad.head_dim = 48;
    bad.stride_token = 48;
    p = kvp_attn_default_params(4);
    cr_assert_eq(kvp_attn_decode_cuda(&bad, dq, dout, &p, NULL), KVP_EUNSUPPORTED, "head_dim 48");
    cr_assert_eq(kvp_attn_prefill_cuda(&bad, dq, c.d_indptr, 1, dout, &p, NULL), KVP_EUNSUPPORTED, "head_dim 48");
    bad = c.d;
    bad.stride_token = 68; /* not a multiple of 8 elements */
    bad.stride_head = 68 * 16, bad.stride_block = 68 * 32;
    cr_assert_eq(kvp_attn_decode_cuda(&bad, dq, dout, &p, NULL), KVP_EUNSUPPORTED, "odd stride");
    bad = c.d;
    bad.dtype = (kvp_dtype)9;
    cr_assert_eq(kvp_attn_append_kv_cuda(&bad, dq, dq, (const int64_t *)dout, 1, NULL), KVP_EINVAL, "bad dtype");
    bad = c.d;
    bad.k_scale = 0.0f;
    bad.dtype = KVP_DTYPE_FP8_E4M3;
    cr_assert_eq(kvp_attn_decode_cuda(&bad, dq, dout, &p, NULL), KVP_EINVAL, "fp8 scale 0");
    const int32_t pairs[2] = {0, 99};
    cr_assert_eq(kvp_attn_swap_blocks_cuda(&c.d, &c.d, pairs, 1, NULL), KVP_EINVAL, "block 99");
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    cache_free(&c);
}

/* ---- copy_blocks over three layers in one launch; swap_blocks device -> pinned host -> device */
Test(attn_cuda, copy_and_swap_blocks)
{
    KVP_REQUIRE_DEVICE();
    const int32_t lens[2] = {40, 9};
    for (int ti = 0; ti < 4; ti++) {
        cache_t c[3];
        kvp_paged_kv layers[3];
        for (int l = 0; l < 3; l++) {
            cache_make(&c[l], k_types[ti], ti == 3 ? 8 : 64, 2, 4, 2, lens, ti == 1, 6000 + (uint64_t)(ti * 3 + l));
            layers[l] = c[l].d;
        }
        const int32_t nb = c[0].h.num_blocks, pairs[6] = {c[0].indices[0], nb - 1, c[0].indices[3], nb - 2, 5 % nb, 5 % nb};
        int32_t *dp = dev_copy(pairs, sizeof pairs);
        OK(kvp_attn_copy_blocks_cuda(layers, 3, dp, 3, NULL));
        const size_t pool = kvp_paged_kv_pool_bytes(&c[0].h);
        unsigned char *hk = kvp_malloc(pool), *hv = kvp_malloc(pool);
        for (int l = 0; l < 3; l++) {
            OK(kvp_attn_copy_blocks_cpu(&c[l].h, pairs, 3));
            to_host(hk, c[l].d.k, pool);
            to_host(hv, c[l].d.v, pool);
            for (size_t i = 0; i < pool; i++) {
                cr_assert_eq(hk[i], ((unsigned char *)c[l].h.k)[i], "copy K byte %zu layer %d [%s]", i, l, c[l].name);
                cr_assert_eq(hv[i], ((unsigned char *)c[l].h.v)[i], "copy V byte %zu layer %d [%s]", i, l, c[l].name);
            }
        }
        /* swap out blocks of layer 0 to a pinned host pool (other strides), then back into other device blocks */
        kvp_paged_kv host = c[0].h, hcpu = c[0].h;
        host.num_blocks = hcpu.num_blocks = 4;
        OK(kvp_paged_kv_cuda_alloc(&host, 1));
        OK(kvp_paged_kv_alloc_pools(&hcpu));
        memset(host.k, 0, kvp_paged_kv_pool_bytes(&host)), memset(host.v, 0, kvp_paged_kv_pool_bytes(&host));
        memset(hcpu.k, 0, kvp_paged_kv_pool_bytes(&hcpu)), memset(hcpu.v, 0, kvp_paged_kv_pool_bytes(&hcpu));
        const int32_t out_pairs[4] = {c[0].indices[1], 2, c[0].indices[2], 0}, in_pairs[4] = {2, 0, 0, 1};
        OK(kvp_attn_swap_blocks_cuda(&host, &c[0].d, out_pairs, 2, NULL));
        OK(kvp_attn_swap_blocks_cpu(&hcpu, &c[0].h, out_pairs, 2));
        CK(cudaDeviceSynchronize());
        cr_assert(memcmp(host.k, hcpu.k, kvp_paged_kv_pool_bytes(&host)) == 0, "swap out K [%s]", c[0].name);
        cr_assert(memcmp(host.v, hcpu.v, kvp_paged_kv_pool_bytes(&host)) == 0, "swap out V [%s]", c[0].name);
        OK(kvp_attn_swap_blocks_cuda(&c[0].d, &host, in_pairs, 2, NULL));
        OK(kvp_attn_swap_blocks_cpu(&c[0].h, &hcpu, in_pairs, 2));
        CK(cudaDeviceSynchronize());
        to_host(hk, c[0].d.k, pool);
        cr_assert(memcmp(hk, c[0].h.k, pool) == 0, "swap in K [%s]", c[0].name);
        kvp_paged_kv_cuda_free(&host, 1);
        kvp_paged_kv_free_pools(&hcpu);
        kvp_free(hk), kvp_free(hv);
        CK(cudaFree(dp));
        for (int l = 0; l < 3; l++) cache_free(&c[l]);
    }
}

/* ---- the merge helper: parts merged by log-sum-exp equal one pass over the whole row */
Test(attn_cuda, lse_merge_equals_one_pass)
{
    KVP_REQUIRE_DEVICE();
    seed(11);
    float s[100];
    for (int i = 0; i < 100; i++) s[i] = rndf() * 8.0f;
    kvp_softmax_state whole = {-INFINITY, 0.0f};
    float mn, lse_parts[4], M = -INFINITY;
    (void)kvp_hd_softmax_update(&whole, -INFINITY, &mn);
    for (int i = 0; i < 100; i++) {
        kvp_hd_softmax_update(&whole, s[i], &mn);
        whole.l += exp2f(s[i] - mn);
    }
    for (int c = 0; c < 4; c++) {
        kvp_softmax_state st = {-INFINITY, 0.0f};
        for (int i = c * 25; i < c * 25 + 25; i++) {
            kvp_hd_softmax_update(&st, s[i], &mn);
            st.l += exp2f(s[i] - mn);
        }
        lse_parts[c] = kvp_hd_softmax_lse2(st);
        M = lse_parts[c] > M ? lse_parts[c] : M;
    }
    float w = 0.0f;
    for (int c = 0; c < 4; c++) w += kvp_hd_merge_weight(lse_parts[c], M);
    cr_assert_float_eq(M + log2f(w), kvp_hd_softmax_lse2(whole), 1e-4);
    cr_assert_eq(kvp_hd_merge_weight(-INFINITY, M), 0.0f);
}
