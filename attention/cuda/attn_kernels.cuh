/* attention/cuda/attn_kernels.cuh — paged decode and prefill kernels, templates over (dtype, head_dim),
 * instantiated once per dtype and op by attention/cuda/attn_{decode,prefill,prefill_tc}_<dtype>.cu.
 * References: kvp_attn_decode_cpu / kvp_attn_prefill_cpu (attention/attn_cpu.c) and the float64 dense
 * references (attention/attn_ref.c); tests/attention/test_attn_cuda.c checks these kernels against both.
 *
 * Before including: KVP_ATTN_DT (a kvp_dtype value), KVP_ATTN_NAME (the dtype's name: f32, f16, ...), and
 * one of KVP_ATTN_DECODE, KVP_ATTN_PREFILL, KVP_ATTN_PREFILL_TC: which launcher the file defines (eleven files
 * that nvcc builds in parallel).
 *
 * Scores are in log2 units (q pre-scaled by sm_scale * log2(e)), softmax is online (attention/attn_hd.h),
 * every K/V element is converted to f32 once, when its tile is staged.
 */
#include "attention/cuda/attn_cuda_internal.h"

#if KVP_CUDA_NATIVE
#include <mma.h>
#endif

namespace kvp_attn_cuda {
namespace {

constexpr int DT = KVP_ATTN_DT;

/* ---------------------------------------------------------------- decode
 *
 * One CTA per (sequence, KV head, group of <= kGMax query heads sharing it, KV split): each K/V byte of the
 * split is read once for all those query heads. Per tile of TT tokens:
 *
 *   off[t]   = page-table walk, one thread per token                         -> smem
 *   Ks[t][:] = K rows, 16-byte loads (chunk-major: a warp reads whole rows)   -> smem, f32
 *   S[g][t]  = Qs[g] . Ks[t] (+ soft cap), one thread per (head, token)       -> smem
 *   softmax  : one warp per head: tile max, rescale alpha, P = 2^(S - m)      -> smem (over S)
 *   acc      : thread (chunk c of 8 dims, token subset) += P[g][t] * V[t][c] for all heads, V read once
 *
 * and at the end the token subsets' accumulators are summed through smem. */
template <int D> struct decode_shape {
    static constexpr int TT = D <= 64 ? 128 : D <= 128 ? 64 : 32; /* tokens per tile */
    static constexpr int NC = D / 8;                              /* 8-element chunks of a row */
    static constexpr int NS = kThreads / NC;                      /* token subsets of the value pass */
    static constexpr int KROW = D + 4;                            /* f32 row stride of Ks: conflict-free */
    static constexpr int BUF = TT * KROW > NS * kGMax * D ? TT * KROW : NS * kGMax * D;
};

template <int D> __global__ void __launch_bounds__(kThreads, 1) decode_kernel(decode_args a)
{
    using S_ = decode_shape<D>;
    constexpr int TT = S_::TT, NC = S_::NC, NS = S_::NS, KROW = S_::KROW;
    KVP_SHARED(float, qs, kGMax * D);
    KVP_SHARED(float, buf, S_::BUF);
    KVP_SHARED(float, sp, kGMax * TT);
    KVP_SHARED(int64_t, off, TT);
    KVP_SHARED(float, sm_m, kGMax);
    KVP_SHARED(float, sm_l, kGMax);
    KVP_SHARED(float, sm_alpha, kGMax);

    const kvp_paged_kv &kv = a.kv;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int s = blockIdx.x, kvh = blockIdx.y / a.ngroups, g0 = (blockIdx.y % a.ngroups) * kGMax;
    const int G = a.group - g0 < kGMax ? a.group - g0 : kGMax;
    const int L = kvp_paged_kv_seq_len(&kv, s), lo = kvp_hd_window_lo(L - 1, a.window_left);
    int c0 = lo, c1 = L;
    if (a.splits > 1) {
        const int span = L - lo, even = (span + a.splits - 1) / a.splits;
        int chunk = a.chunk > 0 ? (a.chunk > even ? a.chunk : even) : (even + TT - 1) / TT * TT;
        if (a.chunk == 0 && chunk < 256) chunk = 256;
        c0 = lo + (int)blockIdx.z * chunk;
        c1 = c0 + chunk < L ? c0 + chunk : L;
    }
    const int head0 = kvh * a.group + g0;
    for (int i = tid; i < kGMax * D; i += kThreads) {
        const int g = i / D;
        qs[i] = g < G ? a.q[((int64_t)s * a.hq + head0 + g) * D + i % D] * a.qscale : 0.0f;
    }
    if (tid < kGMax) sm_m[tid] = -INFINITY, sm_l[tid] = 0.0f;
    float acc[kGMax][8];
#pragma unroll
    for (int g = 0; g < kGMax; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
    const int c = tid % NC, sub = tid / NC;
    __syncthreads();

    for (int t0 = c0; t0 < c1; t0 += TT) {
        const int n = c1 - t0 < TT ? c1 - t0 : TT;
        if (tid < n) off[tid] = kvp_paged_kv_token_offset(&kv, s, kvh, t0 + tid);
        __syncthreads();
        for (int i = tid; i < n * NC; i += kThreads) {
            const int t = i / NC, cc = i % NC;
            float x[8];
            load8<DT>(kv.k, off[t] + 8 * cc, x);
            float4 *dst = reinterpret_cast<float4 *>(buf + t * KROW + 8 * cc);
            dst[0] = make_float4(x[0], x[1], x[2], x[3]);
            dst[1] = make_float4(x[4], x[5], x[6], x[7]);
        }
        __syncthreads();
        for (int i = tid; i < G * TT; i += kThreads) {
            const int g = i / TT, t = i % TT;
            float dot = -INFINITY;
            if (t < n) {
                const float4 *kr = reinterpret_cast<const float4 *>(buf + t * KROW);
                const float4 *qr = reinterpret_cast<const float4 *>(qs + g * D);
                float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 4
                for (int d = 0; d < D / 4; d += 2) {
                    const float4 k0 = kr[d], q0 = qr[d];
                    d0 += q0.x * k0.x + q0.y * k0.y + q0.z * k0.z + q0.w * k0.w;
                    if (d + 1 < D / 4) {
                        const float4 k1 = kr[d + 1], q1 = qr[d + 1];
                        d1 += q1.x * k1.x + q1.y * k1.y + q1.z * k1.z + q1.w * k1.w;
                    }
                }
                dot = d0 + d1;
                if (a.cap > 0.0f) dot = a.cap * tanhf(dot / a.cap);
            }
            sp[g * TT + t] = dot;
        }
        __syncthreads();
        for (int g = warp; g < G; g += kThreads / 32) {
            float mx = -INFINITY;
            for (int t = lane; t < TT; t += 32) mx = fmaxf(mx, sp[g * TT + t]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            kvp_softmax_state st = {sm_m[g], sm_l[g]};
            float mn;
            const float alpha = kvp_hd_softmax_update(&st, mx, &mn);
            float sum = 0.0f;
            for (int t = lane; t < TT; t += 32) {
                const float p = mn == -INFINITY ? 0.0f : exp2f(sp[g * TT + t] - mn);
                sp[g * TT + t] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) sm_m[g] = st.m, sm_l[g] = st.l + sum, sm_alpha[g] = alpha;
        }
        __syncthreads();
        if (sub < NS) {
#pragma unroll
            for (int g = 0; g < kGMax; g++)
                if (g < G) {
                    const float al = sm_alpha[g];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[g][e] *= al;
                }
            for (int t = sub; t < n; t += NS) {
                float v[8];
                load8<DT>(kv.v, off[t] + 8 * c, v);
#pragma unroll
                for (int g = 0; g < kGMax; g++)
                    if (g < G) {
                        const float p = sp[g * TT + t];
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[g][e] += p * v[e];
                    }
            }
        }
        __syncthreads();
    }

    /* sum the token subsets: red[sub][g][d] in buf */
    if (sub < NS)
#pragma unroll
        for (int g = 0; g < kGMax; g++)
            if (g < G)
#pragma unroll
                for (int e = 0; e < 8; e++) buf[(sub * kGMax + g) * D + 8 * c + e] = acc[g][e];
    __syncthreads();
    for (int i = tid; i < G * D; i += kThreads) {
        const int g = i / D, d = i % D;
        float o = 0.0f;
        for (int u = 0; u < NS; u++) o += buf[(u * kGMax + g) * D + d];
        const float l = sm_l[g];
        o = l > 0.0f ? o / l * a.oscale : 0.0f;
        const kvp_softmax_state st = {sm_m[g], l};
        const int64_t row = (int64_t)s * a.hq + head0 + g;
        if (a.splits == 1) {
            a.out[row * D + d] = o;
            if (d == 0 && a.lse) a.lse[row] = kvp_hd_softmax_lse2(st) * 0.6931471805599453f;
        } else {
            const int64_t prow = ((int64_t)s * a.splits + blockIdx.z) * a.hq + head0 + g;
            a.part_o[prow * D + d] = o;
            if (d == 0) a.part_lse[prow] = kvp_hd_softmax_lse2(st);
        }
    }
}

/* ---------------------------------------------------------------- prefill
 *
 * One CTA per (tile of BQ query rows of one sequence, KV head); a row is a (query token, query head of the KV
 * head's group) pair, so the K/V tiles serve the whole group. Per KV tile of BK tokens (the CTA's key range is
 * [window lo of its first token, position of its last token], causal masks inside):
 *
 *   off[j]        page-table walk                                        -> smem
 *   Ks, Vs        the tile's K and V rows, f32                             -> smem
 *   S[r][j]       Qs[r] . Ks[j], masked (causal, window) to -inf           -> smem
 *   softmax       one thread per row: tile max, alpha, P = 2^(S - m)       -> smem (over S)
 *   acc (regs)    thread (row, 8-dim chunk): acc = alpha * acc + P[r] . Vs
 *
 * SIMT (CUDA cores) for every dtype: a scalar FlashAttention-2 schedule. (A tensor-core path for f16/bf16 is
 * the documented next step; see docs/cuda.md.) */
template <int D> struct prefill_shape {
    static constexpr int BQ = D <= 64 ? 64 : D <= 128 ? 32 : 16;
    static constexpr int BK = D <= 64 ? 32 : D <= 128 ? 16 : 8;
    static constexpr int NC = D / 8;
    static constexpr int ROW = D + 4;
    static constexpr int U = (BQ * NC + kThreads - 1) / kThreads; /* (row, chunk) pairs per thread */
};

template <int D> __global__ void __launch_bounds__(kThreads, 1) prefill_kernel(prefill_args a)
{
    using P_ = prefill_shape<D>;
    constexpr int BQ = P_::BQ, BK = P_::BK, NC = P_::NC, ROW = P_::ROW, U = P_::U;
    KVP_SHARED(float, qs, BQ * ROW);
    KVP_SHARED(float, ks, BK * ROW);
    KVP_SHARED(float, vs, BK * ROW);
    KVP_SHARED(float, sp, BQ * BK);
    KVP_SHARED(int64_t, off, BK);
    KVP_SHARED(float, sm_m, BQ);
    KVP_SHARED(float, sm_l, BQ);
    KVP_SHARED(float, sm_alpha, BQ);
    KVP_SHARED(int, where, 3); /* sequence, first row, -1 when this CTA has no tile */

    const kvp_paged_kv &kv = a.kv;
    const int tid = threadIdx.x, kvh = blockIdx.y, G = a.group;
    if (tid == 0) { /* find this CTA's (sequence, tile): tiles of each sequence in order */
        int left = (int)blockIdx.x, seq = -1, r0 = 0;
        for (int s = 0; s < kv.num_seqs; s++) {
            const int rows = (a.qo_indptr[s + 1] - a.qo_indptr[s]) * G, tiles = (rows + BQ - 1) / BQ;
            if (left < tiles) {
                seq = s, r0 = left * BQ;
                break;
            }
            left -= tiles;
        }
        where[0] = seq, where[1] = r0;
    }
    __syncthreads();
    const int s = where[0], r0 = where[1];
    if (s < 0) return; /* uniform: every thread read the same value */
    const int q0 = a.qo_indptr[s], nq = a.qo_indptr[s + 1] - q0, L = kvp_paged_kv_seq_len(&kv, s);
    const int rows = nq * G - r0 < BQ ? nq * G - r0 : BQ;
    /* row r: token i = (r0 + r) / G (position L - nq + i), head kvh * G + (r0 + r) % G */
    for (int i = tid; i < BQ * D; i += kThreads) {
        const int r = i / D, d = i % D, rr = r0 + r;
        qs[r * ROW + d] = r < rows ? a.q[((int64_t)(q0 + rr / G) * a.hq + kvh * G + rr % G) * D + d] * a.qscale : 0.0f;
    }
    if (tid < BQ) sm_m[tid] = -INFINITY, sm_l[tid] = 0.0f;
    const int first_pos = L - nq + r0 / G, last_pos = L - nq + (r0 + rows - 1) / G;
    const int klo = kvp_hd_window_lo(first_pos, a.window_left), khi = last_pos + 1;
    float acc[U][8];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[u][e] = 0.0f;
    __syncthreads();

    for (int j0 = klo; j0 < khi; j0 += BK) {
        const int n = khi - j0 < BK ? khi - j0 : BK;
        if (tid < n) off[tid] = kvp_paged_kv_token_offset(&kv, s, kvh, j0 + tid);
        __syncthreads();
        for (int i = tid; i < 2 * n * NC; i += kThreads) {
            const int which = i / (n * NC), t = i % (n * NC) / NC, cc = i % NC;
            float x[8];
            load8<DT>(which ? kv.v : kv.k, off[t] + 8 * cc, x);
            float4 *dst = reinterpret_cast<float4 *>((which ? vs : ks) + t * ROW + 8 * cc);
            dst[0] = make_float4(x[0], x[1], x[2], x[3]);
            dst[1] = make_float4(x[4], x[5], x[6], x[7]);
        }
        __syncthreads();
        for (int i = tid; i < BQ * BK; i += kThreads) {
            const int r = i / BK, j = i % BK;
            const int pos = L - nq + (r0 + r) / G, lo = kvp_hd_window_lo(pos, a.window_left), key = j0 + j;
            float dot = -INFINITY;
            if (r < rows && j < n && key >= lo && key <= pos) {
                const float4 *kr = reinterpret_cast<const float4 *>(ks + j * ROW);
                const float4 *qr = reinterpret_cast<const float4 *>(qs + r * ROW);
                float d0 = 0.0f;
#pragma unroll 4
                for (int d = 0; d < D / 4; d++) {
                    const float4 k4 = kr[d], q4 = qr[d];
                    d0 += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
                }
                dot = a.cap > 0.0f ? a.cap * tanhf(d0 / a.cap) : d0;
            }
            sp[r * BK + j] = dot;
        }
        __syncthreads();
        if (tid < BQ) {
            float mx = -INFINITY;
            for (int j = 0; j < BK; j++) mx = fmaxf(mx, sp[tid * BK + j]);
            kvp_softmax_state st = {sm_m[tid], sm_l[tid]};
            float mn;
            const float alpha = kvp_hd_softmax_update(&st, mx, &mn);
            float sum = 0.0f;
            for (int j = 0; j < BK; j++) {
                const float p = mn == -INFINITY ? 0.0f : exp2f(sp[tid * BK + j] - mn);
                sp[tid * BK + j] = p;
                sum += p;
            }
            sm_m[tid] = st.m, sm_l[tid] = st.l + sum, sm_alpha[tid] = alpha;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int pr = tid + u * kThreads, r = pr / NC, cc = pr % NC;
            if (pr < BQ * NC && r < rows) {
                const float al = sm_alpha[r];
                float x[8];
#pragma unroll
                for (int e = 0; e < 8; e++) x[e] = acc[u][e] * al;
                for (int j = 0; j < n; j++) {
                    const float p = sp[r * BK + j];
                    const float4 *vr = reinterpret_cast<const float4 *>(vs + j * ROW + 8 * cc);
                    const float4 v0 = vr[0], v1 = vr[1];
                    x[0] += p * v0.x, x[1] += p * v0.y, x[2] += p * v0.z, x[3] += p * v0.w;
                    x[4] += p * v1.x, x[5] += p * v1.y, x[6] += p * v1.z, x[7] += p * v1.w;
                }
#pragma unroll
                for (int e = 0; e < 8; e++) acc[u][e] = x[e];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int pr = tid + u * kThreads, r = pr / NC, cc = pr % NC;
        if (pr < BQ * NC && r < rows) {
            const int rr = r0 + r;
            const int64_t row = (int64_t)(q0 + rr / G) * a.hq + kvh * G + rr % G;
            const float l = sm_l[r], inv = l > 0.0f ? a.oscale / l : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) a.out[row * D + 8 * cc + e] = acc[u][e] * inv;
            if (cc == 0 && a.lse) {
                const kvp_softmax_state st = {sm_m[r], l};
                a.lse[row] = kvp_hd_softmax_lse2(st) * 0.6931471805599453f;
            }
        }
    }
}

#if KVP_CUDA_NATIVE && defined(KVP_ATTN_PREFILL_TC)
/* ---------------------------------------------------------------- prefill on tensor cores (nvcc builds)
 *
 * The same schedule as prefill_kernel, with the two matrix products on tensor cores (nvcuda::wmma 16x16x16,
 * f16 or bf16 inputs, f32 accumulation) and the output accumulator in shared memory:
 *
 *   Qs[BQ][D], Ks[BK][D], Vs[BK][D]   T = half (f16 and fp8 pools: an fp8 code is an exact f16) or bf16
 *   S = Qs Ks^T            warp w: rows 16w..16w+15, all BK columns               -> f32 smem
 *   softmax, masks         one thread per row; it also rescales its row of Oacc by alpha; P -> T smem
 *   Oacc += P Vs           warp w: its 16 rows, all D columns (accumulators loaded from and stored to Oacc)
 *
 * Q and P are rounded to T (the CPU keeps them in f32): results agree with the CPU kernel to about 1e-3 (f16)
 * and 1e-2 (bf16) of the output's scale. The emulator has no wmma: it runs prefill_kernel (SIMT) instead. */
template <int D> struct tc_shape {
    static constexpr int BQ = 64, BK = D <= 128 ? 64 : 32;
    static constexpr int LDT = D + 8;  /* Qs, Ks, Vs row stride (T elements) */
    static constexpr int LDS = BK + 4; /* S row stride (floats) */
    static constexpr int LDP = BK + 8; /* P row stride (T elements) */
    static constexpr int LDO = D + 4;  /* Oacc row stride (floats) */
    static constexpr size_t q_off = 0, k_off = q_off + sizeof(uint16_t) * BQ * LDT, v_off = k_off + sizeof(uint16_t) * BK * LDT,
                            s_off = v_off + sizeof(uint16_t) * BK * LDT, p_off = s_off + sizeof(float) * BQ * LDS,
                            o_off = p_off + sizeof(uint16_t) * BQ * LDP, bytes = o_off + sizeof(float) * BQ * LDO;
};

template <class T> __device__ __forceinline__ T to_t(float x);
template <> __device__ __forceinline__ __half to_t<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* 8 pool elements as T bits (16-bit pools: copied; fp8: code -> the f16 of value * 2^-8) */
__device__ __forceinline__ uint4 load8_bits(const void *pool, int64_t off, int fp8)
{
    if (!fp8) return *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(pool) + off);
    const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const uint8_t *>(pool) + off);
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned word = i < 2 ? u.x : u.y, c0 = (word >> (16 * (i & 1))) & 0xffu, c1 = (word >> (16 * (i & 1) + 8)) & 0xffu;
        const unsigned h0 = ((c0 & 0x80u) << 8) | ((c0 & 0x7fu) << 7) | ((c0 & 0x7fu) == 0x7fu ? 0x7e00u : 0u);
        const unsigned h1 = ((c1 & 0x80u) << 8) | ((c1 & 0x7fu) << 7) | ((c1 & 0x7fu) == 0x7fu ? 0x7e00u : 0u);
        w[i] = h0 | h1 << 16;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int D, class T> __global__ void __launch_bounds__(kThreads, 1) prefill_tc_kernel(prefill_args a)
{
    using namespace nvcuda;
    using S_ = tc_shape<D>;
    constexpr int BQ = S_::BQ, BK = S_::BK, LDT = S_::LDT, LDS = S_::LDS, LDP = S_::LDP, LDO = S_::LDO, NC = D / 8;
    KVP_EXTERN_SHARED(unsigned char, smem);
    T *qs = reinterpret_cast<T *>(smem + S_::q_off), *ks = reinterpret_cast<T *>(smem + S_::k_off);
    T *vs = reinterpret_cast<T *>(smem + S_::v_off), *ps = reinterpret_cast<T *>(smem + S_::p_off);
    float *sc = reinterpret_cast<float *>(smem + S_::s_off), *oacc = reinterpret_cast<float *>(smem + S_::o_off);
    KVP_SHARED(int64_t, off, BK);
    KVP_SHARED(float, sm_m, BQ);
    KVP_SHARED(float, sm_l, BQ);
    KVP_SHARED(int, where, 2);

    const kvp_paged_kv &kv = a.kv;
    const int tid = threadIdx.x, warp = tid / 32, kvh = blockIdx.y, G = a.group, fp8 = kv.dtype == KVP_DTYPE_FP8_E4M3;
    if (tid == 0) {
        int left = (int)blockIdx.x, seq = -1, r0 = 0;
        for (int s = 0; s < kv.num_seqs; s++) {
            const int rows = (a.qo_indptr[s + 1] - a.qo_indptr[s]) * G, tiles = (rows + BQ - 1) / BQ;
            if (left < tiles) {
                seq = s, r0 = left * BQ;
                break;
            }
            left -= tiles;
        }
        where[0] = seq, where[1] = r0;
    }
    __syncthreads();
    const int s = where[0], r0 = where[1];
    if (s < 0) return;
    const int q0 = a.qo_indptr[s], nq = a.qo_indptr[s + 1] - q0, L = kvp_paged_kv_seq_len(&kv, s);
    const int rows = nq * G - r0 < BQ ? nq * G - r0 : BQ;
    for (int i = tid; i < BQ * D; i += kThreads) {
        const int r = i / D, d = i % D, rr = r0 + r;
        qs[r * LDT + d] = to_t<T>(r < rows ? a.q[((int64_t)(q0 + rr / G) * a.hq + kvh * G + rr % G) * D + d] * a.qscale : 0.0f);
    }
    for (int i = tid; i < BQ * D; i += kThreads) oacc[(i / D) * LDO + i % D] = 0.0f;
    if (tid < BQ) sm_m[tid] = -INFINITY, sm_l[tid] = 0.0f;
    const int first_pos = L - nq + r0 / G, last_pos = L - nq + (r0 + rows - 1) / G;
    const int klo = kvp_hd_window_lo(first_pos, a.window_left), khi = last_pos + 1;
    __syncthreads();
    for (int j0 = klo; j0 < khi; j0 += BK) {
        const int n = khi - j0 < BK ? khi - j0 : BK;
        if (tid < n) off[tid] = kvp_paged_kv_token_offset(&kv, s, kvh, j0 + tid);
        __syncthreads();
        for (int i = tid; i < 2 * BK * NC; i += kThreads) {
            const int which = i / (BK * NC), t = i % (BK * NC) / NC, cc = i % NC;
            const uint4 bits = t < n ? load8_bits(which ? kv.v : kv.k, off[t] + 8 * cc, fp8) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>((which ? vs : ks) + t * LDT + 8 * cc) = bits;
        }
        __syncthreads();
        for (int kb = 0; kb < BK / 16; kb++) { /* S = Q K^T, this warp's 16 rows */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kd = 0; kd < D / 16; kd++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, qs + warp * 16 * LDT + kd * 16, LDT);
                wmma::load_matrix_sync(fb, ks + kb * 16 * LDT + kd * 16, LDT);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sc + warp * 16 * LDS + kb * 16, acc, LDS, wmma::mem_row_major);
        }
        __syncthreads();
        if (tid < BQ) { /* row tid: masks, online softmax, P, and Oacc *= alpha */
            const int r = tid, pos = L - nq + (r0 + r) / G, lo = kvp_hd_window_lo(pos, a.window_left);
            float mx = -INFINITY;
            for (int j = 0; j < BK; j++) {
                const int key = j0 + j;
                float x = sc[r * LDS + j];
                if (a.cap > 0.0f) x = a.cap * tanhf(x / a.cap);
                x = r < rows && j < n && key >= lo && key <= pos ? x : -INFINITY;
                sc[r * LDS + j] = x;
                mx = fmaxf(mx, x);
            }
            kvp_softmax_state st = {sm_m[r], sm_l[r]};
            float mn;
            const float alpha = kvp_hd_softmax_update(&st, mx, &mn);
            float sum = 0.0f;
            for (int j = 0; j < BK; j++) {
                const float p = mn == -INFINITY ? 0.0f : exp2f(sc[r * LDS + j] - mn);
                const T pt = to_t<T>(p);
                ps[r * LDP + j] = pt;
                sum += p;
            }
            sm_m[r] = st.m, sm_l[r] = st.l + sum;
            if (alpha != 1.0f)
                for (int d = 0; d < D; d++) oacc[r * LDO + d] *= alpha;
        }
        __syncthreads();
        for (int db = 0; db < D / 16; db++) { /* Oacc += P V, this warp's 16 rows */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, oacc + warp * 16 * LDO + db * 16, LDO, wmma::mem_row_major);
            for (int kb = 0; kb < BK / 16; kb++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, ps + warp * 16 * LDP + kb * 16, LDP);
                wmma::load_matrix_sync(fb, vs + kb * 16 * LDT + db * 16, LDT);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(oacc + warp * 16 * LDO + db * 16, acc, LDO, wmma::mem_row_major);
        }
        __syncthreads();
    }
    for (int i = tid; i < rows * D; i += kThreads) {
        const int r = i / D, d = i % D, rr = r0 + r;
        const int64_t row = (int64_t)(q0 + rr / G) * a.hq + kvh * G + rr % G;
        const float l = sm_l[r];
        a.out[row * D + d] = l > 0.0f ? oacc[r * LDO + d] * a.oscale / l : 0.0f;
        if (d == 0 && a.lse) {
            const kvp_softmax_state st = {sm_m[r], l};
            a.lse[row] = kvp_hd_softmax_lse2(st) * 0.6931471805599453f;
        }
    }
}

template <int D> cudaError_t prefill_tc(const prefill_args &a, int tiles, cudaStream_t st)
{
    constexpr int BQ = tc_shape<D>::BQ;
    const int tc_tiles = tiles; /* the bound was computed for SIMT's BQ <= 64: still an upper bound */
    (void)BQ;
    const size_t bytes = tc_shape<D>::bytes;
    if (DT == KVP_DTYPE_BF16) {
        auto *k = prefill_tc_kernel<D, __nv_bfloat16>;
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) return e;
        KVP_LAUNCH(k, dim3((unsigned)tc_tiles, (unsigned)a.kv.num_kv_heads), kThreads, bytes, st, a);
    } else {
        auto *k = prefill_tc_kernel<D, __half>;
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) return e;
        KVP_LAUNCH(k, dim3((unsigned)tc_tiles, (unsigned)a.kv.num_kv_heads), kThreads, bytes, st, a);
    }
    return cudaGetLastError();
}
#endif

template <int D> cudaError_t decode_one(const decode_args &a, dim3 grid, cudaStream_t st)
{
    auto *k = decode_kernel<D>;
    KVP_LAUNCH(k, grid, kThreads, 0, st, a);
    return cudaGetLastError();
}

template <int D> cudaError_t prefill_one(const prefill_args &a, int tiles, cudaStream_t st)
{
    auto *k = prefill_kernel<D>;
    KVP_LAUNCH(k, dim3((unsigned)tiles, (unsigned)a.kv.num_kv_heads), kThreads, 0, st, a);
    return cudaGetLastError();
}

} // namespace

#define KVP_CAT2(a, b) a##b
#define KVP_CAT(a, b) KVP_CAT2(a, b)
#define KVP_HEAD_DIM_SWITCH(D, CALL)                                    \
    switch (D) {                                                        \
    case 8: return CALL(8);                                             \
    case 16: return CALL(16);                                           \
    case 32: return CALL(32);                                           \
    case 64: return CALL(64);                                           \
    case 80: return CALL(80);                                           \
    case 96: return CALL(96);                                           \
    case 128: return CALL(128);                                         \
    case 256: return CALL(256);                                         \
    default: return cudaErrorInvalidValue;                              \
    }

#ifdef KVP_ATTN_DECODE
cudaError_t KVP_CAT(launch_decode_, KVP_ATTN_NAME)(const decode_args &a, dim3 grid, cudaStream_t st)
{
#define KVP_CALL(d) decode_one<d>(a, grid, st)
    KVP_HEAD_DIM_SWITCH(a.kv.head_dim, KVP_CALL)
#undef KVP_CALL
}
#endif

#ifdef KVP_ATTN_PREFILL
cudaError_t KVP_CAT(launch_prefill_, KVP_ATTN_NAME)(const prefill_args &a, int tiles, cudaStream_t st)
{
#if KVP_ATTN_DT != KVP_DTYPE_F32
    if (a.tensor_cores) return KVP_CAT(launch_prefill_tc_, KVP_ATTN_NAME)(a, tiles, st);
#endif
#define KVP_CALL(d) prefill_one<d>(a, tiles, st)
    KVP_HEAD_DIM_SWITCH(a.kv.head_dim, KVP_CALL)
#undef KVP_CALL
}
#endif

#ifdef KVP_ATTN_PREFILL_TC
/* head_dim a multiple of 16 (the caller checked: kvp_attn_cuda_prefill_tensor_cores) */
cudaError_t KVP_CAT(launch_prefill_tc_, KVP_ATTN_NAME)(const prefill_args &a, int tiles, cudaStream_t st)
{
#if KVP_CUDA_NATIVE
    switch (a.kv.head_dim) {
    case 16: return prefill_tc<16>(a, tiles, st);
    case 32: return prefill_tc<32>(a, tiles, st);
    case 64: return prefill_tc<64>(a, tiles, st);
    case 80: return prefill_tc<80>(a, tiles, st);
    case 96: return prefill_tc<96>(a, tiles, st);
    case 128: return prefill_tc<128>(a, tiles, st);
    case 256: return prefill_tc<256>(a, tiles, st);
    default: return cudaErrorInvalidValue;
    }
#else
    (void)a, (void)tiles, (void)st;
    return cudaErrorNotSupported; /* the emulator has no wmma: tensor_cores is never set there */
#endif
}
#endif

} // namespace kvp_attn_cuda
