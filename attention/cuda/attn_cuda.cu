/* attention/cuda/attn_cuda.cu — the C entry points of attention/cuda/attn_cuda.h: host-side checks, launch
 * planning (decode splits, prefill tiles), and the small kernels: append_kv, the split-KV merge, copy_blocks.
 * swap_blocks is copies on the stream. References: attention/cache_ops.c (append, copy, swap) and
 * attention/attn_cpu.c's merge_rows. */
#include "attention/cuda/attn_cuda_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/cuda/attn_cuda.h"

using namespace kvp_attn_cuda;

namespace {

constexpr int kMaxSplits = 32;
constexpr int kCopyLayers = 64; /* layers per copy_blocks launch (kernel parameters stay under 4 KiB) */

kvp_status cuda_err(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return KVP_OK;
    return KVP_ERR(KVP_ECUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The host-visible checks of a descriptor: kvp_paged_kv_check(kv, 0) (scalars and non-NULL pools) plus the
 * CUDA layout rule (16-byte aligned pools, strides multiples of 8 elements). */
kvp_status check_pools(const kvp_paged_kv *kv, const char *what)
{
    if (kv == nullptr) return KVP_ERR(KVP_EINVAL, "%s: descriptor is NULL", what);
    KVP_TRY(kvp_paged_kv_check(kv, 0));
    if (!kvp_attn_supported(kv->dtype, kv->head_dim))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: head_dim %d with dtype %s is not supported (head_dim 8, 16, 32, 64, 80, "
                       "96, 128 or 256)", what, kv->head_dim, kvp_dtype_name(kv->dtype));
    if ((kv->stride_token | kv->stride_head | kv->stride_block) % 8 != 0 || ((uintptr_t)kv->k | (uintptr_t)kv->v) % 16 != 0)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: CUDA pools must be 16-byte aligned with strides that are multiples of 8 "
                       "elements (block %lld, head %lld, token %lld)", what, (long long)kv->stride_block,
                       (long long)kv->stride_head, (long long)kv->stride_token);
    return KVP_OK;
}

kvp_status check_pages(const kvp_paged_kv *kv, const char *what)
{
    if (kv->num_seqs < 0) return KVP_ERR(KVP_EINVAL, "%s: num_seqs %d < 0", what, kv->num_seqs);
    if (kv->num_seqs > 0 && (kv->kv_indptr == nullptr || kv->kv_indices == nullptr || kv->kv_last_page_len == nullptr))
        return KVP_ERR(KVP_EINVAL, "%s: the page table (kv_indptr, kv_indices, kv_last_page_len) has a NULL array", what);
    if (kv->num_seqs > 65535 * 32768) return KVP_ERR(KVP_EINVAL, "%s: %d sequences is too many", what, kv->num_seqs);
    return KVP_OK;
}

/* qscale, oscale, cap of the kernels (log2 units; fp8 loads are code * 2^-8) */
void scales(const kvp_paged_kv *kv, const kvp_attn_params *p, float *qs, float *os, float *cap)
{
    const int fp8 = kv->dtype == KVP_DTYPE_FP8_E4M3;
    const float sm = p->sm_scale > 0.0f ? p->sm_scale : 1.0f / sqrtf((float)kv->head_dim);
    *qs = sm * 1.4426950408889634f * (fp8 ? kv->k_scale * kFp8LoadScale : 1.0f);
    *os = fp8 ? kv->v_scale * kFp8LoadScale : 1.0f;
    *cap = p->logits_soft_cap * 1.4426950408889634f;
}

int device_sms()
{
    static int sms = 0;
    if (sms == 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 100;
        }
        sms = v;
    }
    return sms;
}

/* ---- append_kv: grid (num_tokens), threads over (head, 8-element chunk). */
template <int DT> __device__ __forceinline__ void store8(void *pool, int64_t off, const float (&x)[8], float scale);

template <> __device__ __forceinline__ void store8<KVP_DTYPE_F32>(void *pool, int64_t off, const float (&x)[8], float)
{
    float4 *p = reinterpret_cast<float4 *>(static_cast<float *>(pool) + off);
    p[0] = make_float4(x[0], x[1], x[2], x[3]);
    p[1] = make_float4(x[4], x[5], x[6], x[7]);
}

template <> __device__ __forceinline__ void store8<KVP_DTYPE_F16>(void *pool, int64_t off, const float (&x)[8], float)
{
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (unsigned)kvp_hd_f32_to_f16(x[2 * i]) | (unsigned)kvp_hd_f32_to_f16(x[2 * i + 1]) << 16;
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(pool) + off) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <> __device__ __forceinline__ void store8<KVP_DTYPE_BF16>(void *pool, int64_t off, const float (&x)[8], float)
{
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (unsigned)kvp_hd_f32_to_bf16(x[2 * i]) | (unsigned)kvp_hd_f32_to_bf16(x[2 * i + 1]) << 16;
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(pool) + off) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <>
__device__ __forceinline__ void store8<KVP_DTYPE_FP8_E4M3>(void *pool, int64_t off, const float (&x)[8], float scale)
{
    unsigned lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo |= (unsigned)kvp_hd_f32_to_fp8e4m3(x[i] / scale) << (8 * i); /* x / scale, as the CPU (not x * 1/scale) */
        hi |= (unsigned)kvp_hd_f32_to_fp8e4m3(x[4 + i] / scale) << (8 * i);
    }
    *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(pool) + off) = make_uint2(lo, hi);
}

template <int DT>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(kvp_paged_kv kv, const float *k, const float *v,
                                                            const int64_t *slot_mapping)
{
    const int64_t t = blockIdx.x, slot = slot_mapping[t];
    if (slot < 0 || slot >= (int64_t)kv.num_blocks * kv.block_size) return; /* -1: padding; out of range: skipped */
    const int nc = kv.head_dim / 8, n = kv.num_kv_heads * nc;
    const float ks = DT == KVP_DTYPE_FP8_E4M3 ? kv.k_scale : 1.0f, vs = DT == KVP_DTYPE_FP8_E4M3 ? kv.v_scale : 1.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int h = i / nc, c = i % nc;
        const int64_t src = (t * kv.num_kv_heads + h) * kv.head_dim + 8 * c;
        const int64_t dst = kvp_paged_kv_slot_offset(&kv, slot, h) + 8 * c;
        float x[8];
        const float4 *kp = reinterpret_cast<const float4 *>(k + src), *vp = reinterpret_cast<const float4 *>(v + src);
        float4 a = kp[0], b = kp[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        store8<DT>(kv.k, dst, x, ks);
        a = vp[0], b = vp[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        store8<DT>(kv.v, dst, x, vs);
    }
}

/* ---- split-KV merge: grid (num_seqs, hq), threads over head_dim. out = sum_c w_c o_c / sum_c w_c,
 * w_c = 2^(lse_c - max lse) (attention/attn_hd.h), lse = (max + log2 sum w) * ln 2. */
__global__ void __launch_bounds__(kThreads) merge_kernel(const float *part_o, const float *part_lse, float *out,
                                                        float *lse, int hq, int splits, int D)
{
    const int s = blockIdx.x, h = blockIdx.y;
    float M = -INFINITY;
    for (int z = 0; z < splits; z++) M = fmaxf(M, part_lse[((int64_t)s * splits + z) * hq + h]);
    float wsum = 0.0f;
    for (int z = 0; z < splits; z++) wsum += kvp_hd_merge_weight(part_lse[((int64_t)s * splits + z) * hq + h], M);
    const int64_t row = (int64_t)s * hq + h;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int z = 0; z < splits; z++) {
            const int64_t pr = ((int64_t)s * splits + z) * hq + h;
            const float w = kvp_hd_merge_weight(part_lse[pr], M);
            if (w > 0.0f) o += w * part_o[pr * D + d];
        }
        out[row * D + d] = wsum > 0.0f ? o / wsum : 0.0f;
    }
    if (threadIdx.x == 0 && lse) lse[row] = M == -INFINITY ? -INFINITY : (M + log2f(wsum)) * 0.6931471805599453f;
}

/* ---- copy_blocks: grid (pairs, layers of this batch); per pool, rows (head, token) of head_dim elements in
 * W-byte words (W = 16 when a row is a multiple of 16 bytes, else 8). */
struct copy_layers {
    void *k[kCopyLayers];
    void *v[kCopyLayers];
};

template <class W>
__global__ void __launch_bounds__(kThreads) copy_blocks_kernel(copy_layers pools, kvp_paged_kv shape, const int32_t *pairs)
{
    const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    if (src < 0 || dst < 0 || src >= shape.num_blocks || dst >= shape.num_blocks || src == dst) return;
    const int es = (int)(shape.dtype == KVP_DTYPE_F32 ? 4 : shape.dtype == KVP_DTYPE_FP8_E4M3 ? 1 : 2);
    const int words = shape.head_dim * es / (int)sizeof(W), rows = shape.num_kv_heads * shape.block_size;
    for (int pool = 0; pool < 2; pool++) {
        char *base = static_cast<char *>(pool ? pools.v[blockIdx.y] : pools.k[blockIdx.y]);
        for (int i = threadIdx.x; i < rows * words; i += blockDim.x) {
            const int r = i / words, w = i % words, h = r / shape.block_size, t = r % shape.block_size;
            const W *from = reinterpret_cast<const W *>(base + kvp_paged_kv_elem_offset(&shape, src, h, t) * es) + w;
            W *to = reinterpret_cast<W *>(base + kvp_paged_kv_elem_offset(&shape, dst, h, t) * es) + w;
            *to = *from;
        }
    }
}

template <int DT> void launch_append(const kvp_paged_kv *kv, const float *k, const float *v, const int64_t *s, int32_t n,
                                     cudaStream_t st)
{
    auto *kern = append_kv_kernel<DT>;
    KVP_LAUNCH(kern, n, kThreads, 0, st, *kv, k, v, s);
}

} // namespace

extern "C" int kvp_attn_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: not an error for the caller */
        return 0;
    }
    return n;
}

extern "C" int kvp_attn_cuda_emulated(void) { return kvp_cuda_emulated(); }

extern "C" size_t kvp_attn_decode_cuda_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim)
{
    if (num_seqs < 0 || num_q_heads < 0 || head_dim < 0) return 0;
    return (size_t)num_seqs * kMaxSplits * (size_t)num_q_heads * (size_t)(head_dim + 1) * sizeof(float);
}

extern "C" kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                              const int64_t *slot_mapping, int32_t num_tokens, void *stream)
{
    KVP_TRY(check_pools(kv, "append_kv_cuda"));
    if (num_tokens < 0) return KVP_ERR(KVP_EINVAL, "append_kv_cuda: num_tokens %d < 0", num_tokens);
    if (num_tokens == 0) return KVP_OK;
    if (k == nullptr || v == nullptr || slot_mapping == nullptr)
        return KVP_ERR(KVP_EINVAL, "append_kv_cuda: k, v or slot_mapping is NULL");
    if (((uintptr_t)k | (uintptr_t)v) % 16 != 0) return KVP_ERR(KVP_EINVAL, "append_kv_cuda: k and v must be 16-byte aligned");
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    (void)cudaGetLastError();
    switch (kv->dtype) {
    case KVP_DTYPE_F32: launch_append<KVP_DTYPE_F32>(kv, k, v, slot_mapping, num_tokens, st); break;
    case KVP_DTYPE_F16: launch_append<KVP_DTYPE_F16>(kv, k, v, slot_mapping, num_tokens, st); break;
    case KVP_DTYPE_BF16: launch_append<KVP_DTYPE_BF16>(kv, k, v, slot_mapping, num_tokens, st); break;
    default: launch_append<KVP_DTYPE_FP8_E4M3>(kv, k, v, slot_mapping, num_tokens, st); break;
    }
    return cuda_err(cudaGetLastError(), "append_kv_cuda");
}

extern "C" kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out, const kvp_attn_params *p,
                                           void *stream)
{
    const char *what = "decode_cuda";
    KVP_TRY(check_pools(kv, what));
    KVP_TRY(kvp_attn_check_params(kv, p, what));
    KVP_TRY(check_pages(kv, what));
    if (q == nullptr || out == nullptr) return KVP_ERR(KVP_EINVAL, "%s: q or out is NULL", what);
    if (kv->num_seqs == 0) return KVP_OK;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    decode_args a = {};
    a.kv = *kv;
    a.q = q, a.out = out, a.lse = p->lse;
    a.hq = p->num_q_heads;
    a.group = a.hq / kv->num_kv_heads;
    a.ngroups = (a.group + kGMax - 1) / kGMax;
    a.window_left = p->window_left;
    scales(kv, p, &a.qscale, &a.oscale, &a.cap);
    const long ctas = (long)kv->num_seqs * kv->num_kv_heads * a.ngroups;
    if ((long)kv->num_kv_heads * a.ngroups > 65535)
        return KVP_ERR(KVP_EINVAL, "%s: %d KV heads x %d head groups is over the grid's 65535", what, kv->num_kv_heads,
                       a.ngroups);
    int splits = 1;
    if (p->kv_chunk_size > 0) splits = kMaxSplits, a.chunk = p->kv_chunk_size;
    else if (ctas < 2L * device_sms()) splits = (int)((2L * device_sms() + ctas - 1) / ctas), a.chunk = 0;
    if (splits > kMaxSplits) splits = kMaxSplits;
    a.splits = splits;
    void *ws = nullptr;
    (void)cudaGetLastError();
    if (splits > 1) {
        const size_t rows = (size_t)kv->num_seqs * splits * a.hq, need = rows * (size_t)(kv->head_dim + 1) * sizeof(float);
        float *part = nullptr;
        if (p->split_workspace != nullptr) {
            if (p->split_workspace_bytes < need)
                return KVP_ERR(KVP_EINVAL, "%s: split_workspace of %zu bytes, %zu needed", what, p->split_workspace_bytes,
                               need);
            part = static_cast<float *>(p->split_workspace);
        } else {
            cudaError_t e = cudaMallocAsync(&ws, need, st);
            if (e != cudaSuccess) return cuda_err(e, "decode_cuda: split-KV workspace");
            part = static_cast<float *>(ws);
        }
        a.part_o = part;
        a.part_lse = a.part_o + rows * kv->head_dim;
    }
    const dim3 grid((unsigned)kv->num_seqs, (unsigned)(kv->num_kv_heads * a.ngroups), (unsigned)splits);
    cudaError_t e;
    switch (kv->dtype) {
    case KVP_DTYPE_F32: e = launch_decode_f32(a, grid, st); break;
    case KVP_DTYPE_F16: e = launch_decode_f16(a, grid, st); break;
    case KVP_DTYPE_BF16: e = launch_decode_bf16(a, grid, st); break;
    default: e = launch_decode_fp8(a, grid, st); break;
    }
    if (e == cudaSuccess && splits > 1) {
        auto *mk = merge_kernel;
        KVP_LAUNCH(mk, dim3((unsigned)kv->num_seqs, (unsigned)a.hq), kThreads, 0, st, a.part_o, a.part_lse, out, p->lse,
                   a.hq, splits, kv->head_dim);
        e = cudaGetLastError();
    }
    if (ws) (void)cudaFreeAsync(ws, st);
    return cuda_err(e, what);
}

int kvp_attn_cuda::prefill_rows_per_cta(int tensor_cores, int D) { return tensor_cores || D <= 64 ? 64 : D <= 128 ? 32 : 16; }

extern "C" int kvp_attn_cuda_prefill_tensor_cores(kvp_dtype dtype, int32_t head_dim)
{
    static int simt = -1; /* KVPAGE_CUDA_PREFILL=simt: the CUDA-core kernel everywhere (a comparison, or a fallback) */
    if (simt < 0) {
        const char *e = getenv("KVPAGE_CUDA_PREFILL");
        simt = e != nullptr && strcmp(e, "simt") == 0;
    }
    return KVP_CUDA_NATIVE && !simt && dtype != KVP_DTYPE_F32 && (unsigned)dtype < KVP_DTYPE_COUNT && head_dim % 16 == 0 &&
           kvp_attn_supported(dtype, head_dim);
}

extern "C" kvp_status kvp_attn_prefill_cuda(const kvp_paged_kv *kv, const float *q, const int32_t *qo_indptr,
                                            int32_t num_q_tokens, float *out, const kvp_attn_params *p, void *stream)
{
    const char *what = "prefill_cuda";
    KVP_TRY(check_pools(kv, what));
    KVP_TRY(kvp_attn_check_params(kv, p, what));
    KVP_TRY(check_pages(kv, what));
    if (num_q_tokens < 0) return KVP_ERR(KVP_EINVAL, "%s: num_q_tokens %d < 0", what, num_q_tokens);
    if (kv->num_seqs == 0 || num_q_tokens == 0) return KVP_OK;
    if (q == nullptr || out == nullptr || qo_indptr == nullptr)
        return KVP_ERR(KVP_EINVAL, "%s: q, out or qo_indptr is NULL", what);
    prefill_args a = {};
    a.kv = *kv;
    a.q = q, a.qo_indptr = qo_indptr, a.out = out, a.lse = p->lse;
    a.hq = p->num_q_heads;
    a.group = a.hq / kv->num_kv_heads;
    a.window_left = p->window_left;
    scales(kv, p, &a.qscale, &a.oscale, &a.cap);
    a.tensor_cores = kvp_attn_cuda_prefill_tensor_cores(kv->dtype, kv->head_dim);
    /* each sequence has ceil(n_q * G / BQ) tiles <= n_q * G / BQ + 1 */
    const int bq = prefill_rows_per_cta(a.tensor_cores, kv->head_dim);
    const long tiles = ((long)num_q_tokens * a.group + bq - 1) / bq + kv->num_seqs;
    if (tiles > 2147483647L || kv->num_kv_heads > 65535)
        return KVP_ERR(KVP_EINVAL, "%s: %ld query tiles x %d KV heads is over the grid's limits", what, tiles,
                       kv->num_kv_heads);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    (void)cudaGetLastError();
    cudaError_t e;
    switch (kv->dtype) {
    case KVP_DTYPE_F32: e = launch_prefill_f32(a, (int)tiles, st); break;
    case KVP_DTYPE_F16: e = launch_prefill_f16(a, (int)tiles, st); break;
    case KVP_DTYPE_BF16: e = launch_prefill_bf16(a, (int)tiles, st); break;
    default: e = launch_prefill_fp8(a, (int)tiles, st); break;
    }
    return cuda_err(e, what);
}

extern "C" kvp_status kvp_attn_copy_blocks_cuda(const kvp_paged_kv *layers, int32_t num_layers, const int32_t *block_pairs,
                                                int32_t n, void *stream)
{
    const char *what = "copy_blocks_cuda";
    if (layers == nullptr || num_layers < 1) return KVP_ERR(KVP_EINVAL, "%s: no layers (%d)", what, num_layers);
    if (n < 0) return KVP_ERR(KVP_EINVAL, "%s: %d pairs < 0", what, n);
    for (int32_t l = 0; l < num_layers; l++) {
        KVP_TRY(check_pools(&layers[l], what));
        const kvp_paged_kv *a = &layers[0], *b = &layers[l];
        if (a->dtype != b->dtype || a->num_blocks != b->num_blocks || a->num_kv_heads != b->num_kv_heads ||
            a->block_size != b->block_size || a->head_dim != b->head_dim || a->stride_block != b->stride_block ||
            a->stride_head != b->stride_head || a->stride_token != b->stride_token)
            return KVP_ERR(KVP_EINVAL, "%s: layer %d's pools differ in dtype, sizes or strides from layer 0's", what, l);
    }
    if (n == 0) return KVP_OK;
    if (block_pairs == nullptr) return KVP_ERR(KVP_EINVAL, "%s: block_pairs is NULL", what);
    if (n > 2147483647 / 2) return KVP_ERR(KVP_EINVAL, "%s: %d pairs is too many", what, n);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const size_t row_bytes = (size_t)layers[0].head_dim * kvp_dtype_size(layers[0].dtype);
    (void)cudaGetLastError();
    for (int32_t l0 = 0; l0 < num_layers; l0 += kCopyLayers) {
        copy_layers pools = {};
        const int nl = num_layers - l0 < kCopyLayers ? num_layers - l0 : kCopyLayers;
        for (int i = 0; i < nl; i++) pools.k[i] = layers[l0 + i].k, pools.v[i] = layers[l0 + i].v;
        const dim3 grid((unsigned)n, (unsigned)nl);
        if (row_bytes % 16 == 0) {
            auto *k = copy_blocks_kernel<uint4>;
            KVP_LAUNCH(k, grid, kThreads, 0, st, pools, layers[0], block_pairs);
        } else {
            auto *k = copy_blocks_kernel<uint2>;
            KVP_LAUNCH(k, grid, kThreads, 0, st, pools, layers[0], block_pairs);
        }
        KVP_TRY(cuda_err(cudaGetLastError(), what));
    }
    return KVP_OK;
}

extern "C" kvp_status kvp_attn_swap_blocks_cuda(const kvp_paged_kv *dst, const kvp_paged_kv *src, const int32_t *block_pairs,
                                                int32_t n, void *stream)
{
    const char *what = "swap_blocks_cuda";
    if (dst == nullptr || src == nullptr) return KVP_ERR(KVP_EINVAL, "%s: a descriptor is NULL", what);
    KVP_TRY(kvp_paged_kv_check(dst, 0));
    KVP_TRY(kvp_paged_kv_check(src, 0));
    if (dst->dtype != src->dtype || dst->num_kv_heads != src->num_kv_heads || dst->block_size != src->block_size ||
        dst->head_dim != src->head_dim)
        return KVP_ERR(KVP_EINVAL, "%s: pools differ (dtype %s/%s, heads %d/%d, block_size %d/%d, head_dim %d/%d)", what,
                       kvp_dtype_name(dst->dtype), kvp_dtype_name(src->dtype), dst->num_kv_heads, src->num_kv_heads,
                       dst->block_size, src->block_size, dst->head_dim, src->head_dim);
    if (n < 0) return KVP_ERR(KVP_EINVAL, "%s: %d pairs < 0", what, n);
    if (n > 0 && block_pairs == nullptr) return KVP_ERR(KVP_EINVAL, "%s: block_pairs is NULL", what);
    for (int32_t i = 0; i < n; i++) {
        if (block_pairs[2 * i] < 0 || block_pairs[2 * i] >= src->num_blocks)
            return KVP_ERR(KVP_EINVAL, "%s: pair %d: source block %d outside 0..%d", what, i, block_pairs[2 * i],
                           src->num_blocks - 1);
        if (block_pairs[2 * i + 1] < 0 || block_pairs[2 * i + 1] >= dst->num_blocks)
            return KVP_ERR(KVP_EINVAL, "%s: pair %d: destination block %d outside 0..%d", what, i, block_pairs[2 * i + 1],
                           dst->num_blocks - 1);
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const size_t es = kvp_dtype_size(src->dtype), row = (size_t)src->head_dim * es;
    const int same = src->stride_token == dst->stride_token && src->stride_head == dst->stride_head;
    const int dense = same && src->stride_token == src->head_dim &&
                      src->stride_head == (int64_t)src->block_size * src->head_dim;
    (void)cudaGetLastError();
    for (int32_t i = 0; i < n; i++) {
        const int32_t sb = block_pairs[2 * i], db = block_pairs[2 * i + 1];
        for (int pool = 0; pool < 2; pool++) {
            const char *sp = static_cast<const char *>(pool ? src->v : src->k);
            char *dp = static_cast<char *>(pool ? dst->v : dst->k);
            cudaError_t e;
            if (dense) { /* the block's heads are one run of bytes in both pools */
                e = cudaMemcpyAsync(dp + kvp_paged_kv_elem_offset(dst, db, 0, 0) * es,
                                    sp + kvp_paged_kv_elem_offset(src, sb, 0, 0) * es,
                                    (size_t)src->num_kv_heads * src->block_size * row, cudaMemcpyDefault, st);
                KVP_TRY(cuda_err(e, what));
                continue;
            }
            for (int32_t h = 0; h < src->num_kv_heads; h++) { /* one 2-D copy per head: block_size rows */
                e = cudaMemcpy2DAsync(dp + kvp_paged_kv_elem_offset(dst, db, h, 0) * es, (size_t)dst->stride_token * es,
                                      sp + kvp_paged_kv_elem_offset(src, sb, h, 0) * es, (size_t)src->stride_token * es,
                                      row, (size_t)src->block_size, cudaMemcpyDefault, st);
                KVP_TRY(cuda_err(e, what));
            }
        }
    }
    return KVP_OK;
}

extern "C" kvp_status kvp_paged_kv_cuda_alloc(kvp_paged_kv *kv, int host)
{
    if (kv == nullptr) return KVP_ERR(KVP_EINVAL, "paged_kv_cuda_alloc: descriptor is NULL");
    const size_t n = kvp_paged_kv_pool_bytes(kv);
    void *k = nullptr, *v = nullptr;
    cudaError_t e = host ? cudaHostAlloc(&k, n, cudaHostAllocDefault) : cudaMalloc(&k, n);
    if (e == cudaSuccess) e = host ? cudaHostAlloc(&v, n, cudaHostAllocDefault) : cudaMalloc(&v, n);
    if (e != cudaSuccess) {
        if (k) (void)(host ? cudaFreeHost(k) : cudaFree(k));
        (void)cudaGetLastError();
        return KVP_ERR(e == cudaErrorMemoryAllocation ? KVP_ENOMEM : KVP_ECUDA,
                       "paged_kv_cuda_alloc: two %s pools of %zu bytes: %s", host ? "pinned host" : "device", n,
                       cudaGetErrorString(e));
    }
    kv->k = k, kv->v = v;
    return KVP_OK;
}

extern "C" void kvp_paged_kv_cuda_free(kvp_paged_kv *kv, int host)
{
    if (kv == nullptr) return;
    if (kv->k) (void)(host ? cudaFreeHost(kv->k) : cudaFree(kv->k));
    if (kv->v) (void)(host ? cudaFreeHost(kv->v) : cudaFree(kv->v));
    kv->k = kv->v = nullptr;
}
