/* attention/cuda/attn_cuda_internal.h — what the CUDA attention files share (C++, nvcc or the emulator): the
 * kernel argument blocks, the per-dtype launchers (attn_<dtype>.cu) and the 8-element load/store helpers. */
#ifndef KVP_ATTENTION_CUDA_ATTN_CUDA_INTERNAL_H
#define KVP_ATTENTION_CUDA_ATTN_CUDA_INTERNAL_H

#include "common/cuda/kvp_cuda.h"

#include "attention/attention.h"
#include "attention/attn_hd.h"

namespace kvp_attn_cuda {

constexpr int kThreads = 128; /* every attention kernel: 4 warps */
constexpr int kGMax = 8;      /* query heads of one KV head served by one decode CTA (more: grid.y groups) */
/* fp8 codes are loaded as code value * 2^-8 (an exact f16 bit pattern), the 2^8 folded into the scales, as
 * the CPU kernels do (attention/attn_simd.h) */
constexpr float kFp8LoadScale = 256.0f;

/* decode: grid (num_seqs, num_kv_heads * ngroups, splits), kThreads threads. */
struct decode_args {
    kvp_paged_kv kv;  /* pools and page table: device pointers */
    const float *q;   /* (num_seqs, hq, D) */
    float *out;       /* (num_seqs, hq, D) */
    float *lse;       /* (num_seqs, hq) natural log, or NULL */
    float *part_o;    /* splits > 1: (num_seqs, splits, hq, D) normalized partial outputs */
    float *part_lse;  /* splits > 1: (num_seqs, splits, hq) log2-sum-exp of each part (-inf: empty) */
    int hq, group, ngroups, splits, chunk, window_left;
    float qscale;     /* sm_scale * log2(e) (* k_scale * 256 for fp8): scores in log2 units */
    float oscale;     /* 1 (v_scale * 256 for fp8) */
    float cap;        /* logits_soft_cap * log2(e), 0: off */
};

/* prefill: grid (tiles, num_kv_heads), kThreads threads. */
struct prefill_args {
    kvp_paged_kv kv;
    const float *q;           /* (num_q_tokens, hq, D) */
    const int32_t *qo_indptr; /* (num_seqs + 1), device */
    float *out;               /* (num_q_tokens, hq, D) */
    float *lse;               /* (num_q_tokens, hq) or NULL */
    int hq, group, window_left;
    int tensor_cores; /* nvcc builds, f16/bf16/fp8 pools, head_dim a multiple of 16: the wmma kernel */
    float qscale, oscale, cap;
};

/* Launch one kernel for the descriptor's head_dim (the caller checked it is supported). */
cudaError_t launch_decode_f32(const decode_args &a, dim3 grid, cudaStream_t st);
cudaError_t launch_decode_f16(const decode_args &a, dim3 grid, cudaStream_t st);
cudaError_t launch_decode_bf16(const decode_args &a, dim3 grid, cudaStream_t st);
cudaError_t launch_decode_fp8(const decode_args &a, dim3 grid, cudaStream_t st);
cudaError_t launch_prefill_f32(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_f16(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_bf16(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_fp8(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_tc_f16(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_tc_bf16(const prefill_args &a, int tiles_bound, cudaStream_t st);
cudaError_t launch_prefill_tc_fp8(const prefill_args &a, int tiles_bound, cudaStream_t st);
/* Query rows per prefill CTA for head_dim D (the grid bound needs it). */
int prefill_rows_per_cta(int tensor_cores, int D);

/* ---- 8 consecutive elements (offset a multiple of 8: 16-byte loads for 16-bit types, 8 for fp8, 32 for f32) */
template <int DT> __device__ __forceinline__ void load8(const void *pool, int64_t off, float (&x)[8]);

template <> __device__ __forceinline__ void load8<KVP_DTYPE_F32>(const void *pool, int64_t off, float (&x)[8])
{
    const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(pool) + off);
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

template <> __device__ __forceinline__ void load8<KVP_DTYPE_F16>(const void *pool, int64_t off, float (&x)[8])
{
    const uint4 u = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(pool) + off);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2_raw r;
        r.x = (unsigned short)(w[i] & 0xffffu);
        r.y = (unsigned short)(w[i] >> 16);
        const float2 f = __half22float2(__half2(r));
        x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
}

template <> __device__ __forceinline__ void load8<KVP_DTYPE_BF16>(const void *pool, int64_t off, float (&x)[8])
{
    const uint4 u = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(pool) + off);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) x[2 * i] = __uint_as_float(w[i] << 16), x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

/* fp8 code c -> f16 bits (sign << 8 | (c & 0x7f) << 7): exactly value(c) * 2^-8, subnormals included; NaN
 * (S.1111.111) kept as NaN. */
__device__ __forceinline__ float fp8_load_scaled(unsigned c)
{
    __half_raw r;
    r.x = (unsigned short)(((c & 0x80u) << 8) | ((c & 0x7fu) << 7));
    const float f = __half2float(__half(r));
    return (c & 0x7fu) == 0x7fu ? __int_as_float(0x7fc00000 | (int)((c & 0x80u) << 24)) : f;
}

template <> __device__ __forceinline__ void load8<KVP_DTYPE_FP8_E4M3>(const void *pool, int64_t off, float (&x)[8])
{
    const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const uint8_t *>(pool) + off);
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = fp8_load_scaled((u.x >> (8 * i)) & 0xffu), x[4 + i] = fp8_load_scaled((u.y >> (8 * i)) & 0xffu);
}

} // namespace kvp_attn_cuda

#endif
