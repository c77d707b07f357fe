/* bench/cuda/attn_cuda_bench.c — the CUDA attention benchmark's core (bench/cuda/attn_cuda_bench.h). */
#include "bench/cuda/attn_cuda_bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/cuda/attn_cuda.h"
#include "common/alloc.h"

#define F(name, type) {#name, type, offsetof(kvp_acb_row, name)}
const kvp_acb_field kvp_acb_fields[] = {
    F(op, KVP_ACB_STR),          F(layout, KVP_ACB_STR),        F(dtype, KVP_ACB_STR),
    F(block_size, KVP_ACB_I32),  F(batch, KVP_ACB_I32),         F(ctx, KVP_ACB_I32),
    F(new_tokens, KVP_ACB_I32),  F(q_heads, KVP_ACB_I32),       F(kv_heads, KVP_ACB_I32),
    F(head_dim, KVP_ACB_I32),    F(reps, KVP_ACB_I32),          F(time_ms, KVP_ACB_F64),
    F(kv_gbps, KVP_ACB_F64),     F(copy_gbps, KVP_ACB_F64),     F(pct_copy_bw, KVP_ACB_F64),
    F(paged_over_contig, KVP_ACB_F64), F(tflops, KVP_ACB_F64),  F(max_rel_err, KVP_ACB_F64),
    F(validated, KVP_ACB_BOOL),  F(emulated, KVP_ACB_BOOL),
};
#undef F
const int kvp_acb_num_fields = (int)(sizeof kvp_acb_fields / sizeof kvp_acb_fields[0]);

kvp_acb_opts kvp_acb_default_opts(void)
{
    kvp_acb_opts o = {.decode = 1, .prefill = 1, .dtypes = NULL, .q_heads = 32, .kv_heads = 8, .head_dim = 128,
                      .reps = 20, .quick = 0};
    return o;
}

#if defined(KVP_HAVE_CUDA) || defined(KVPAGE_CUDA_EMU)
#include <cuda_runtime_api.h>

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            st = KVP_ERR(KVP_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));                               \
            goto out;                                                                                        \
        }                                                                                                    \
    } while (0)
#define TRY(call)                                                                                            \
    do {                                                                                                     \
        if ((st = (call)) != KVP_OK) goto out;                                                               \
    } while (0)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 20);
}
static float frand(void) { return (float)(rnd() % 2000001u) / 1000000.0f - 1.0f; }

/* Random elements in [-1, 1] in the pool's dtype (fp8: codes of values in [-20, 20], scale 0.05), from a
 * table of 4096 converted values (filling a GiB element by element would cost seconds). */
static void fill_pool(void *pool, size_t bytes, kvp_dtype t)
{
    static uint8_t table[4096 * 4];
    const size_t es = kvp_dtype_size(t);
    for (int i = 0; i < 4096; i++) {
        const float x = frand();
        if (t == KVP_DTYPE_F32) memcpy(table + 4 * i, &x, 4);
        else if (t == KVP_DTYPE_F16) ((uint16_t *)table)[i] = kvp_f32_to_f16(x);
        else if (t == KVP_DTYPE_BF16) ((uint16_t *)table)[i] = kvp_f32_to_bf16(x);
        else table[i] = kvp_f32_to_fp8e4m3(x * 20.0f);
    }
    uint8_t *p = pool;
    for (size_t i = 0; i < bytes / es; i++) memcpy(p + i * es, table + (rnd() & 4095) * es, es);
}

typedef struct {
    kvp_paged_kv h, d;
    int32_t *indptr, *indices, *last, *d_mem;
} bcache;

static void bcache_free(bcache *c)
{
    kvp_paged_kv_free_pools(&c->h);
    kvp_paged_kv_cuda_free(&c->d, 0);
    if (c->d_mem) cudaFree(c->d_mem);
    kvp_free(c->indptr), kvp_free(c->indices), kvp_free(c->last);
    memset(c, 0, sizeof *c);
}

/* batch sequences of ctx tokens, random page order, the same bytes on host and device. */
static kvp_status bcache_make(bcache *c, kvp_dtype t, int32_t batch, int32_t ctx, int32_t bs, int32_t hkv, int32_t D)
{
    kvp_status st = KVP_OK;
    memset(c, 0, sizeof *c);
    const int32_t pages = (ctx + bs - 1) / bs, nblocks = pages * batch;
    TRY(kvp_paged_kv_init(&c->h, t, nblocks, hkv, bs, D));
    if (t == KVP_DTYPE_FP8_E4M3) c->h.k_scale = c->h.v_scale = 0.05f;
    c->indptr = kvp_malloc(sizeof(int32_t) * (size_t)(batch + 1));
    c->indices = kvp_malloc(sizeof(int32_t) * (size_t)nblocks);
    c->last = kvp_malloc(sizeof(int32_t) * (size_t)batch);
    if (!c->indptr || !c->indices || !c->last) {
        st = KVP_ERR(KVP_ENOMEM, "out of host memory for a page table of %d blocks", nblocks);
        goto out;
    }
    for (int32_t i = 0; i < nblocks; i++) c->indices[i] = i;
    for (int32_t i = nblocks - 1; i > 0; i--) { /* a random page order */
        int32_t j = (int32_t)(((uint64_t)rnd() << 12 ^ rnd()) % (uint64_t)(i + 1)), x = c->indices[i];
        c->indices[i] = c->indices[j], c->indices[j] = x;
    }
    for (int32_t s = 0; s <= batch; s++) c->indptr[s] = s * pages;
    for (int32_t s = 0; s < batch; s++) c->last[s] = ctx - (pages - 1) * bs;
    TRY(kvp_paged_kv_alloc_pools(&c->h));
    const size_t pool = kvp_paged_kv_pool_bytes(&c->h);
    fill_pool(c->h.k, pool, t);
    fill_pool(c->h.v, pool, t);
    kvp_paged_kv_set_pages(&c->h, batch, c->indptr, c->indices, c->last);
    c->d = c->h;
    c->d.k = c->d.v = NULL;
    TRY(kvp_paged_kv_cuda_alloc(&c->d, 0));
    CK(cudaMemcpy(c->d.k, c->h.k, pool, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c->d.v, c->h.v, pool, cudaMemcpyHostToDevice));
    const size_t tn = (size_t)(batch + 1) + (size_t)nblocks + (size_t)batch;
    CK(cudaMalloc((void **)&c->d_mem, tn * sizeof(int32_t)));
    CK(cudaMemcpy(c->d_mem, c->indptr, sizeof(int32_t) * (size_t)(batch + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c->d_mem + batch + 1, c->indices, sizeof(int32_t) * (size_t)nblocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c->d_mem + batch + 1 + nblocks, c->last, sizeof(int32_t) * (size_t)batch, cudaMemcpyHostToDevice));
    kvp_paged_kv_set_pages(&c->d, batch, c->d_mem, c->d_mem + batch + 1, c->d_mem + batch + 1 + nblocks);
    return KVP_OK;
out:
    bcache_free(c);
    return st;
}

static double rel_err(const float *gpu, const float *cpu, size_t n)
{
    double mx = 0.0, e = 0.0;
    for (size_t i = 0; i < n; i++) mx = fabs(cpu[i]) > mx ? fabs(cpu[i]) : mx;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)gpu[i] - (double)cpu[i]) / (mx + 1e-3);
        if (!(d <= e)) e = d; /* NaN propagates as a failure */
    }
    return e;
}

/* Device copy bandwidth: bytes read + written per second of a device-to-device cudaMemcpy. */
static kvp_status copy_bandwidth(size_t bytes, double *gbps)
{
    kvp_status st = KVP_OK;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    const int reps = kvp_attn_cuda_emulated() ? 1 : 10;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    *gbps = 2.0 * (double)bytes * reps / ((ms > 0 ? ms : 1e-3) * 1e-3) / 1e9;
out:
    cudaFree(a), cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

typedef struct {
    const kvp_acb_opts *o;
    kvp_status (*emit)(const kvp_acb_row *, void *);
    void *ctx;
    double copy_gbps;
    int emulated;
} runner;

/* One row: build the cache, run the CUDA kernel once and compare with the CPU kernel, then time reps launches. */
static kvp_status run_row(runner *r, const char *op, kvp_dtype t, int32_t batch, int32_t ctx, int32_t bs,
                          double contig_ms, double *ms_out)
{
    const kvp_acb_opts *o = r->o;
    const int prefill = strcmp(op, "prefill") == 0;
    const int32_t hq = o->q_heads, hkv = o->kv_heads, D = o->head_dim, nq = prefill ? ctx : 1;
    const int32_t vq = prefill ? (ctx < 64 ? ctx : 64) : 1; /* prefill rows validated: the last vq tokens of seq 0 */
    kvp_status st = KVP_OK;
    bcache c;
    float *q = NULL, *o_gpu = NULL, *o_cpu = NULL, *dq = NULL, *dout = NULL;
    int32_t *dqo = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    KVP_TRY(bcache_make(&c, t, batch, ctx, bs, hkv, D));
    const size_t rows = (size_t)batch * nq, qn = rows * hq * D;
    q = kvp_malloc(sizeof(float) * qn), o_gpu = kvp_malloc(sizeof(float) * qn), o_cpu = kvp_malloc(sizeof(float) * qn);
    int32_t *qo = kvp_malloc(sizeof(int32_t) * (size_t)(batch + 1));
    if (!q || !o_gpu || !o_cpu || !qo) {
        kvp_free(qo);
        st = KVP_ERR(KVP_ENOMEM, "out of host memory for %zu query rows", rows);
        goto out;
    }
    for (int32_t s = 0; s <= batch; s++) qo[s] = s * nq;
    for (size_t i = 0; i < qn; i++) q[i] = frand();
    CK(cudaMalloc((void **)&dq, sizeof(float) * qn));
    CK(cudaMalloc((void **)&dout, sizeof(float) * qn));
    CK(cudaMalloc((void **)&dqo, sizeof(int32_t) * (size_t)(batch + 1)));
    CK(cudaMemcpy(dq, q, sizeof(float) * qn, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dqo, qo, sizeof(int32_t) * (size_t)(batch + 1), cudaMemcpyHostToDevice));
    kvp_attn_params p = kvp_attn_default_params(hq);
    double err;
    if (prefill) {
        TRY(kvp_attn_prefill_cuda(&c.d, dq, dqo, (int32_t)rows, dout, &p, NULL));
        CK(cudaMemcpy(o_gpu, dout, sizeof(float) * qn, cudaMemcpyDeviceToHost));
        /* the CPU's chunked prefill of sequence 0's last vq tokens over its whole cache */
        kvp_paged_kv h1 = c.h;
        h1.num_seqs = 1;
        const int32_t qo1[2] = {0, vq};
        const size_t off = (size_t)(nq - vq) * hq * D;
        TRY(kvp_attn_prefill_cpu(&h1, q + off, qo1, o_cpu, &p));
        err = rel_err(o_gpu + off, o_cpu, (size_t)vq * hq * D);
    } else {
        TRY(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL));
        CK(cudaMemcpy(o_gpu, dout, sizeof(float) * qn, cudaMemcpyDeviceToHost));
        TRY(kvp_attn_decode_cpu(&c.h, q, o_cpu, &p));
        err = rel_err(o_gpu, o_cpu, qn);
    }
    const double tol = prefill && t != KVP_DTYPE_F32 ? (t == KVP_DTYPE_BF16 ? 4e-2 : 1e-2) : 1e-3; /* tensor cores: Q, P in 16 bits */
    const int reps = r->emulated ? 1 : o->reps;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++) {
        if (prefill) TRY(kvp_attn_prefill_cuda(&c.d, dq, dqo, (int32_t)rows, dout, &p, NULL));
        else TRY(kvp_attn_decode_cuda(&c.d, dq, dout, &p, NULL));
    }
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double t_ms = ms / reps, kv_bytes = 2.0 * batch * ctx * hkv * D * (double)kvp_dtype_size(t);
    kvp_acb_row row = {.op = op, .layout = bs == ctx ? "contiguous" : "paged", .dtype = kvp_dtype_name(t),
                       .block_size = bs, .batch = batch, .ctx = ctx, .new_tokens = nq, .q_heads = hq, .kv_heads = hkv,
                       .head_dim = D, .reps = reps, .time_ms = t_ms};
    row.kv_gbps = kv_bytes / (t_ms * 1e-3) / 1e9;
    row.copy_gbps = r->copy_gbps;
    row.pct_copy_bw = 100.0 * row.kv_gbps / r->copy_gbps;
    row.paged_over_contig = contig_ms > 0 ? t_ms / contig_ms : 1.0;
    row.tflops = prefill ? 4.0 * batch * ((double)nq * (nq + 1) / 2) * D * hq / (t_ms * 1e-3) / 1e12 : 0.0;
    row.max_rel_err = err;
    row.validated = err <= tol;
    row.emulated = r->emulated;
    *ms_out = t_ms;
    TRY(r->emit(&row, r->ctx));
    if (!row.validated)
        st = KVP_ERR(KVP_EINVAL, "CUDA %s (%s, block size %d) differs from the CPU kernel: max relative error %g > %g",
                     op, row.dtype, bs, err, tol);
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(dq), cudaFree(dout), cudaFree(dqo);
    kvp_free(q), kvp_free(o_gpu), kvp_free(o_cpu), kvp_free(qo);
    bcache_free(&c);
    return st;
}

/* The contiguous row of a case first, then its paged rows. */
static kvp_status run_case(runner *r, const char *op, kvp_dtype t, int32_t batch, int32_t ctx, const int32_t *bss, int nbs)
{
    double contig = 0, ms;
    KVP_TRY(run_row(r, op, t, batch, ctx, ctx, 0, &contig));
    for (int i = 0; i < nbs; i++)
        if (bss[i] != ctx) KVP_TRY(run_row(r, op, t, batch, ctx, bss[i], contig, &ms));
    return KVP_OK;
}

kvp_status kvp_acb_run(const kvp_acb_opts *o, kvp_status (*emit)(const kvp_acb_row *, void *), void *ctx)
{
    if (kvp_attn_cuda_device_count() == 0) return KVP_ERR(KVP_ENODEVICE, "bench attention-cuda: no CUDA device");
    runner r = {.o = o, .emit = emit, .ctx = ctx, .emulated = kvp_attn_cuda_emulated()};
    kvp_dtype types[4];
    int nt = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", o->dtypes ? o->dtypes : "bf16,f16,fp8");
    for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok && nt < 4; tok = strtok_r(NULL, ",", &sv))
        KVP_TRY(kvp_dtype_parse(tok, &types[nt++]));
    KVP_TRY(copy_bandwidth(r.emulated ? (size_t)1 << 20 : (size_t)1 << 30, &r.copy_gbps));
    if (r.emulated) { /* a smoke run: tiny shapes */
        kvp_acb_opts small = *o;
        small.q_heads = 4, small.kv_heads = 2, small.head_dim = 64;
        r.o = &small;
        const int32_t bss[2] = {1, 16};
        for (int i = 0; i < nt; i++) {
            if (o->decode) KVP_TRY(run_case(&r, "decode", types[i], 2, 100, bss, 2));
            if (o->prefill) KVP_TRY(run_case(&r, "prefill", types[i], 1, 48, bss + 1, 1));
        }
        return KVP_OK;
    }
    const int32_t all_bs[3] = {1, 16, 256}, bs16[1] = {16};
    for (int i = 0; i < nt && o->decode; i++) /* the target case, every block size */
        KVP_TRY(run_case(&r, "decode", types[i], 64, 4096, o->quick && i > 0 ? bs16 : all_bs, o->quick && i > 0 ? 1 : 3));
    if (o->decode) {
        KVP_TRY(run_case(&r, "decode", types[0], 1, 65536, bs16, 1)); /* split-KV */
        if (!o->quick) {
            const int32_t batches[3] = {1, 8, 64}, ctxs[2] = {1024, 4096};
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 2; c++)
                    if (!(batches[b] == 64 && ctxs[c] == 4096)) KVP_TRY(run_case(&r, "decode", types[0], batches[b], ctxs[c], bs16, 1));
        }
    }
    for (int i = 0; i < nt && o->prefill; i++)
        if (types[i] != KVP_DTYPE_FP8_E4M3 && (!o->quick || i == 0)) KVP_TRY(run_case(&r, "prefill", types[i], 1, 4096, bs16, 1));
    return KVP_OK;
}

#else /* built without CUDA and without the emulator */

kvp_status kvp_acb_run(const kvp_acb_opts *o, kvp_status (*emit)(const kvp_acb_row *, void *), void *ctx)
{
    (void)o, (void)emit, (void)ctx;
    return KVP_ERR(KVP_ENODEVICE, "bench attention-cuda: kvpage was built without CUDA");
}

#endif
