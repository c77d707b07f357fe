/* attention/attn_cuda.cu — paged append_kv and decode on NVIDIA GPUs (sm_80, sm_90), reading the same
 * kvp_paged_kv descriptor as the CPU kernels (index helpers from attention/paged_kv.h compile for both).
 * Straightforward kernels, checked against the CPU kernels by tests/attention/test_attention_cuda.c
 * (which skips itself without a device); not tuned. */
extern "C" {
#include "common/status.h"
}
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>

#include "attention/attn_cuda.h"

namespace {

constexpr int kWarps = 4;

template <int DT> __device__ __forceinline__ float load_elem(const void *base, int64_t off);
template <> __device__ __forceinline__ float load_elem<KVP_DTYPE_F32>(const void *b, int64_t off)
{
    return static_cast<const float *>(b)[off];
}
template <> __device__ __forceinline__ float load_elem<KVP_DTYPE_F16>(const void *b, int64_t off)
{
    return __half2float(static_cast<const __half *>(b)[off]);
}
template <> __device__ __forceinline__ float load_elem<KVP_DTYPE_BF16>(const void *b, int64_t off)
{
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(b)[off]);
}
template <> __device__ __forceinline__ float load_elem<KVP_DTYPE_FP8_E4M3>(const void *b, int64_t off)
{
    /* e4m3fn: S EEEE MMM, bias 7, subnormals m * 2^-9, S 1111 111 is NaN (unscaled code value) */
    unsigned c = static_cast<const unsigned char *>(b)[off], e = (c >> 3) & 15u, m = c & 7u;
    float v = (e == 15u && m == 7u) ? __int_as_float(0x7fc00000) : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8u + m), (int)e - 10);
    return (c & 0x80u) ? -v : v;
}

template <int DT> __device__ __forceinline__ void store_elem(void *base, int64_t off, float x, float scale);
template <> __device__ __forceinline__ void store_elem<KVP_DTYPE_F32>(void *b, int64_t off, float x, float)
{
    static_cast<float *>(b)[off] = x;
}
template <> __device__ __forceinline__ void store_elem<KVP_DTYPE_F16>(void *b, int64_t off, float x, float)
{
    static_cast<__half *>(b)[off] = __float2half_rn(x);
}
template <> __device__ __forceinline__ void store_elem<KVP_DTYPE_BF16>(void *b, int64_t off, float x, float)
{
    static_cast<__nv_bfloat16 *>(b)[off] = __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ void store_elem<KVP_DTYPE_FP8_E4M3>(void *b, int64_t off, float x, float scale)
{
    /* saturating, round-to-nearest-even, NaN -> 0x7f: the same as kvp_f32_to_fp8e4m3 */
    static_cast<__nv_fp8_storage_t *>(b)[off] = __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}

/* grid: (num_tokens); block: threads over (kv head, dim). */
template <int DT>
__global__ void append_kv_kernel(kvp_paged_kv kv, const float *k, const float *v, const int64_t *slot_mapping)
{
    const int64_t t = blockIdx.x, slot = slot_mapping[t];
    if (slot < 0) return;
    const int n = kv.num_kv_heads * kv.head_dim;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int h = i / kv.head_dim, d = i % kv.head_dim;
        const int64_t off = kvp_paged_kv_slot_offset(&kv, slot, h) + d;
        store_elem<DT>(kv.k, off, k[t * n + i], kv.k_scale);
        store_elem<DT>(kv.v, off, v[t * n + i], kv.v_scale);
    }
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* grid: (num_seqs, num_q_heads); block: kWarps warps. Warp w takes tokens lo+w, lo+w+kWarps, ...; lane l
 * holds dims l, l+32, ...; each warp keeps its own running max / sum / accumulator (log2 units), merged at
 * the end through shared memory. */
template <int DT, int D>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(kvp_paged_kv kv, const float *q, float *out, float *lse,
                                                             int hq, int group, float qscale, float oscale,
                                                             int window_left, float cap)
{
    constexpr int PER = (D + 31) / 32;
    __shared__ float sm_m[kWarps], sm_l[kWarps], sm_acc[kWarps][D];
    const int s = blockIdx.x, h = blockIdx.y, kvh = h / group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int L = kvp_paged_kv_seq_len(&kv, s), pos = L - 1;
    const int lo = window_left >= 0 && pos - window_left > 0 ? pos - window_left : 0;
    const float *qr = q + ((int64_t)s * hq + h) * D;
    float qv[PER], acc[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < D ? qr[d] * qscale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = lo + warp; j <= pos; j += kWarps) {
        const int64_t off = kvp_paged_kv_token_offset(&kv, s, kvh, j);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int d = lane + 32 * i;
            if (d < D) dot += qv[i] * load_elem<DT>(kv.k, off + d);
        }
        dot = warp_sum(dot);
        if (cap > 0.0f) dot = cap * tanhf(dot / cap); /* logits_soft_cap, in the scores' log2 units */
        const float mn = fmaxf(m, dot), alpha = exp2f(m - mn), p = exp2f(dot - mn);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int d = lane + 32 * i;
            if (d < D) acc[i] = acc[i] * alpha + p * load_elem<DT>(kv.v, off + d);
        }
        m = mn;
    }
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = lane + 32 * i;
        if (d < D) sm_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, sm_m[w]);
    float tot = 0.0f;
    for (int w = 0; w < kWarps; w++) tot += sm_m[w] == -INFINITY ? 0.0f : exp2f(sm_m[w] - M) * sm_l[w];
    float *o = out + ((int64_t)s * hq + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float x = 0.0f;
        for (int w = 0; w < kWarps; w++)
            if (sm_m[w] != -INFINITY) x += exp2f(sm_m[w] - M) * sm_acc[w][d];
        o[d] = tot > 0.0f ? x / tot * oscale : 0.0f;
    }
    if (lse != nullptr && threadIdx.x == 0)
        lse[(int64_t)s * hq + h] = tot > 0.0f ? (M + log2f(tot)) * 0.6931471805599453f : -INFINITY;
}

kvp_status launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return KVP_ERR(KVP_ECUDA, "%s: %s", what, cudaGetErrorString(e));
    return KVP_OK;
}

template <int DT>
void launch_append(const kvp_paged_kv *kv, const float *k, const float *v, const int64_t *slots, int32_t n,
                   cudaStream_t st)
{
    int threads = kv->num_kv_heads * kv->head_dim < 256 ? kv->num_kv_heads * kv->head_dim : 256;
    append_kv_kernel<DT><<<n, threads, 0, st>>>(*kv, k, v, slots);
}

template <int DT, int D>
void launch_decode(const kvp_paged_kv *kv, const float *q, float *out, float *lse, int hq, float qs, float os, int wl,
                   float cap, cudaStream_t st)
{
    dim3 grid(kv->num_seqs, hq);
    decode_kernel<DT, D><<<grid, kWarps * 32, 0, st>>>(*kv, q, out, lse, hq, hq / kv->num_kv_heads, qs, os, wl, cap);
}

template <int DT>
bool dispatch_dim(const kvp_paged_kv *kv, const float *q, float *out, float *lse, int hq, float qs, float os, int wl,
                  float cap, cudaStream_t st)
{
    switch (kv->head_dim) {
    case 8: launch_decode<DT, 8>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 16: launch_decode<DT, 16>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 32: launch_decode<DT, 32>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 64: launch_decode<DT, 64>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 80: launch_decode<DT, 80>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 96: launch_decode<DT, 96>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 128: launch_decode<DT, 128>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    case 256: launch_decode<DT, 256>(kv, q, out, lse, hq, qs, os, wl, cap, st); return true;
    default: return false;
    }
}

/* Host-side checks of what the host can see (scalars); the page table lives on the device. */
kvp_status check_desc(const kvp_paged_kv *kv, const char *what)
{
    if (kv == nullptr || kv->k == nullptr || kv->v == nullptr)
        return KVP_ERR(KVP_EINVAL, "%s: descriptor or pool is NULL", what);
    if ((unsigned)kv->dtype >= KVP_DTYPE_COUNT) return KVP_ERR(KVP_EINVAL, "%s: invalid dtype %d", what, (int)kv->dtype);
    if (!kvp_attn_supported(kv->dtype, kv->head_dim))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: head_dim %d with dtype %s is not supported", what, kv->head_dim,
                       kvp_dtype_name(kv->dtype));
    if (kv->num_blocks < 1 || kv->num_kv_heads < 1 || kv->block_size < 1 || kv->stride_token < kv->head_dim)
        return KVP_ERR(KVP_EINVAL, "%s: bad pool sizes or strides", what);
    if (kv->dtype == KVP_DTYPE_FP8_E4M3 && !(kv->k_scale > 0.0f && kv->v_scale > 0.0f))
        return KVP_ERR(KVP_EINVAL, "%s: fp8 scales must be > 0", what);
    return KVP_OK;
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

extern "C" kvp_status kvp_attn_append_kv_cuda(const kvp_paged_kv *kv, const float *k, const float *v,
                                              const int64_t *slot_mapping, int32_t num_tokens, void *stream)
{
    KVP_TRY(check_desc(kv, "append_kv_cuda"));
    if (num_tokens < 0) return KVP_ERR(KVP_EINVAL, "append_kv_cuda: num_tokens %d < 0", num_tokens);
    if (num_tokens == 0) return KVP_OK;
    if (k == nullptr || v == nullptr || slot_mapping == nullptr)
        return KVP_ERR(KVP_EINVAL, "append_kv_cuda: k, v or slot_mapping is NULL");
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (kv->dtype) {
    case KVP_DTYPE_F32: launch_append<KVP_DTYPE_F32>(kv, k, v, slot_mapping, num_tokens, st); break;
    case KVP_DTYPE_F16: launch_append<KVP_DTYPE_F16>(kv, k, v, slot_mapping, num_tokens, st); break;
    case KVP_DTYPE_BF16: launch_append<KVP_DTYPE_BF16>(kv, k, v, slot_mapping, num_tokens, st); break;
    default: launch_append<KVP_DTYPE_FP8_E4M3>(kv, k, v, slot_mapping, num_tokens, st); break;
    }
    return launched("append_kv_cuda");
}

extern "C" kvp_status kvp_attn_decode_cuda(const kvp_paged_kv *kv, const float *q, float *out,
                                           const kvp_attn_params *p, void *stream)
{
    KVP_TRY(check_desc(kv, "decode_cuda"));
    if (q == nullptr || out == nullptr || p == nullptr) return KVP_ERR(KVP_EINVAL, "decode_cuda: q, out or params is NULL");
    const int hq = p->num_q_heads;
    if (hq < 1 || hq % kv->num_kv_heads != 0)
        return KVP_ERR(KVP_EINVAL, "decode_cuda: num_q_heads %d is not a positive multiple of num_kv_heads %d", hq,
                       kv->num_kv_heads);
    if (kv->num_seqs < 0 || (kv->num_seqs > 0 && (kv->kv_indptr == nullptr || kv->kv_indices == nullptr ||
                                                  kv->kv_last_page_len == nullptr)))
        return KVP_ERR(KVP_EINVAL, "decode_cuda: page table missing");
    if (p->window_left < -1 || !(p->sm_scale >= 0.0f))
        return KVP_ERR(KVP_EINVAL, "decode_cuda: window_left %d or sm_scale %g out of range", p->window_left,
                       (double)p->sm_scale);
    if (!(p->logits_soft_cap >= 0.0f) || isinf(p->logits_soft_cap))
        return KVP_ERR(KVP_EINVAL, "decode_cuda: logits_soft_cap %g must be finite and >= 0",
                       (double)p->logits_soft_cap);
    if (kv->num_seqs == 0) return KVP_OK;
    const int fp8 = kv->dtype == KVP_DTYPE_FP8_E4M3;
    const float sm = p->sm_scale > 0.0f ? p->sm_scale : 1.0f / sqrtf((float)kv->head_dim);
    const float qs = sm * 1.4426950408889634f * (fp8 ? kv->k_scale : 1.0f), os = fp8 ? kv->v_scale : 1.0f;
    const float cap = p->logits_soft_cap * 1.4426950408889634f;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (kv->dtype) {
    case KVP_DTYPE_F32: dispatch_dim<KVP_DTYPE_F32>(kv, q, out, p->lse, hq, qs, os, p->window_left, cap, st); break;
    case KVP_DTYPE_F16: dispatch_dim<KVP_DTYPE_F16>(kv, q, out, p->lse, hq, qs, os, p->window_left, cap, st); break;
    case KVP_DTYPE_BF16: dispatch_dim<KVP_DTYPE_BF16>(kv, q, out, p->lse, hq, qs, os, p->window_left, cap, st); break;
    default: dispatch_dim<KVP_DTYPE_FP8_E4M3>(kv, q, out, p->lse, hq, qs, os, p->window_left, cap, st); break;
    }
    return launched("decode_cuda");
}
