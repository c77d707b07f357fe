/* attention/attn_simd.h — private: an 8-lane float vector for the CPU kernels, with loads that convert
 * the pool's element type in registers (f16 by F16C, bf16 by a shift, fp8 by a shift into f16 bits, then F16C).
 * AVX2+FMA+F16C when the build targets them (Release: -march=x86-64-v3), portable C otherwise. */
#ifndef KVP_ATTENTION_ATTN_SIMD_H
#define KVP_ATTENTION_ATTN_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/paged_kv.h"
#include "common/cpu.h"

#define KVP_INLINE static inline __attribute__((always_inline))

/* The fp8 loads give a code's value times 2^-8 (its f16 bits are then a shift away); the kernels' scales
 * take the 2^8 back (exactly: a power of two). */
#define KVP_FP8_LOAD_SCALE 256.0f

/* 2^f on [-0.5, 0.5] (Horner, highest power first; relative error ~2e-7): the exp2 of every width below. */
static const float k_exp2_poly[7] = {1.5403530393381606e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                                     5.5504108664821580e-2f, 2.4022650695910071e-1f, 6.9314718055994531e-1f, 1.0f};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVP_ATTN_SIMD "avx2"
typedef __m256 kvp_v8;
KVP_INLINE kvp_v8 v8_zero(void) { return _mm256_setzero_ps(); }
KVP_INLINE kvp_v8 v8_set1(float x) { return _mm256_set1_ps(x); }
KVP_INLINE kvp_v8 v8_loadf(const float *p) { return _mm256_loadu_ps(p); }
KVP_INLINE void v8_storef(float *p, kvp_v8 a) { _mm256_storeu_ps(p, a); }
KVP_INLINE kvp_v8 v8_fma(kvp_v8 a, kvp_v8 b, kvp_v8 c) { return _mm256_fmadd_ps(a, b, c); }
KVP_INLINE kvp_v8 v8_add(kvp_v8 a, kvp_v8 b) { return _mm256_add_ps(a, b); }
KVP_INLINE kvp_v8 v8_mul(kvp_v8 a, kvp_v8 b) { return _mm256_mul_ps(a, b); }
KVP_INLINE float v8_hsum(kvp_v8 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Lane t of the result = sum of the 8 lanes of p[t], as ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)): eight
 * horizontal sums for the price of about two (the head_dim 8 score pass). */
KVP_INLINE kvp_v8 v8_hsum8(const kvp_v8 *p)
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
KVP_INLINE kvp_v8 v8_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
KVP_INLINE kvp_v8 v8_load_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* e4m3fn -> f32 in registers (no table gather, which cost twice the whole f16 decode), by way of f16: the
 * sign moved to bit 15 and the 7 exponent and mantissa bits shifted up by 7 are the f16 of the code's value
 * times 2^-8 (KVP_FP8_LOAD_SCALE), exactly, subnormal codes included, since f16's exponent has the wider
 * range; S.1111.111 (NaN) gets f16's all-ones exponent. Then F16C widens it. In 16-bit lanes a vector
 * converts twice the codes of a 32-bit shift and multiply. */
KVP_INLINE kvp_v8 v8_load_fp8(const uint8_t *p)
{
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i h = _mm_slli_epi16(_mm_add_epi16(x, _mm_and_si128(x, _mm_set1_epi16(0x80))), 7);
    const __m128i nan = _mm_cmpeq_epi16(_mm_or_si128(x, _mm_set1_epi16(0x80)), _mm_set1_epi16(0xff));
    return _mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7c00))));
}
/* 2^x for x <= 0 (-inf and anything below -126 give 0), relative error ~2e-7. */
KVP_INLINE kvp_v8 v8_exp2(kvp_v8 x)
{
    __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_set1_ps(k_exp2_poly[0]);
    for (int i = 1; i < 7; i++) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(k_exp2_poly[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
KVP_INLINE kvp_v8 v8_max(kvp_v8 a, kvp_v8 b) { return _mm256_max_ps(a, b); }
/* Keeps a loaded vector in a register: without it gcc folds a reused load into every multiply-add as a
 * memory operand (two loads where one is enough), and the score loop becomes load-port bound. */
#define v8_pin(a) __asm__("" : "+x"(a))
KVP_INLINE float v8_hmax(kvp_v8 a)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define KVP_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define KVP_PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#else
#define KVP_ATTN_SIMD "portable"
typedef struct {
    float x[8];
} kvp_v8;
KVP_INLINE kvp_v8 v8_zero(void)
{
    kvp_v8 r;
    for (int i = 0; i < 8; i++) r.x[i] = 0.0f;
    return r;
}
KVP_INLINE kvp_v8 v8_set1(float x)
{
    kvp_v8 r;
    for (int i = 0; i < 8; i++) r.x[i] = x;
    return r;
}
KVP_INLINE kvp_v8 v8_loadf(const float *p)
{
    kvp_v8 r;
    memcpy(r.x, p, sizeof r.x);
    return r;
}
KVP_INLINE void v8_storef(float *p, kvp_v8 a) { memcpy(p, a.x, sizeof a.x); }
KVP_INLINE kvp_v8 v8_fma(kvp_v8 a, kvp_v8 b, kvp_v8 c)
{
    for (int i = 0; i < 8; i++) c.x[i] += a.x[i] * b.x[i];
    return c;
}
KVP_INLINE kvp_v8 v8_add(kvp_v8 a, kvp_v8 b)
{
    for (int i = 0; i < 8; i++) a.x[i] += b.x[i];
    return a;
}
KVP_INLINE kvp_v8 v8_mul(kvp_v8 a, kvp_v8 b)
{
    for (int i = 0; i < 8; i++) a.x[i] *= b.x[i];
    return a;
}
KVP_INLINE float v8_hsum(kvp_v8 a)
{
    return ((a.x[0] + a.x[4]) + (a.x[2] + a.x[6])) + ((a.x[1] + a.x[5]) + (a.x[3] + a.x[7]));
}
KVP_INLINE kvp_v8 v8_hsum8(const kvp_v8 *p)
{
    kvp_v8 r;
    for (int t = 0; t < 8; t++) {
        const float *x = p[t].x;
        r.x[t] = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
    }
    return r;
}
KVP_INLINE kvp_v8 v8_load_f16(const uint16_t *p)
{
    kvp_v8 r;
    for (int i = 0; i < 8; i++) r.x[i] = kvp_f16_to_f32(p[i]);
    return r;
}
KVP_INLINE kvp_v8 v8_load_bf16(const uint16_t *p)
{
    kvp_v8 r;
    for (int i = 0; i < 8; i++) {
        uint32_t u = (uint32_t)p[i] << 16;
        memcpy(&r.x[i], &u, 4);
    }
    return r;
}
KVP_INLINE kvp_v8 v8_load_fp8(const uint8_t *p) /* the code's value times 2^-8, as the AVX2 version */
{
    kvp_v8 r;
    for (int i = 0; i < 8; i++) r.x[i] = kvp_fp8e4m3_to_f32(p[i]) / KVP_FP8_LOAD_SCALE;
    return r;
}
/* As the AVX2 version: NaN reads as -126 (maxps returns its second operand), and the exponent stays in
 * range whatever the input (NaN or huge scores from corrupt weights: no undefined conversion). */
KVP_INLINE kvp_v8 v8_exp2(kvp_v8 x)
{
    for (int i = 0; i < 8; i++) {
        float xc = x.x[i] > -126.0f ? (x.x[i] < 127.0f ? x.x[i] : 127.0f) : -126.0f;
        float n = rintf(xc), f = xc - n;
        float p = k_exp2_poly[0];
        for (int k = 1; k < 7; k++) p = p * f + k_exp2_poly[k];
        int32_t bits = ((int32_t)n + 127) * (1 << 23);
        float sc;
        memcpy(&sc, &bits, sizeof sc);
        x.x[i] = x.x[i] < -126.0f ? 0.0f : p * sc;
    }
    return x;
}
KVP_INLINE kvp_v8 v8_max(kvp_v8 a, kvp_v8 b)
{
    for (int i = 0; i < 8; i++) a.x[i] = b.x[i] > a.x[i] ? b.x[i] : a.x[i];
    return a;
}
#define v8_pin(a) ((void)0)
KVP_INLINE float v8_hmax(kvp_v8 a)
{
    float m = a.x[0];
    for (int i = 1; i < 8; i++) m = a.x[i] > m ? a.x[i] : m;
    return m;
}
#define KVP_PREFETCH(p) __builtin_prefetch((const void *)(p))
#define KVP_PREFETCH_L2(p) __builtin_prefetch((const void *)(p), 0, 2)
#endif

/* 16 lanes (AVX-512F, BW, VL): an x86-64-v3 build also carries them (common/cpu.h), for the CPUs that have
 * them. Functions using them must be compiled for that target too (the pragma below, or the same pragma
 * around their own definitions). */
#ifdef KVP_BUILD_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
typedef __m512 kvp_v16;
KVP_INLINE kvp_v16 v16_zero(void) { return _mm512_setzero_ps(); }
KVP_INLINE kvp_v16 v16_set1(float x) { return _mm512_set1_ps(x); }
KVP_INLINE kvp_v16 v16_loadf(const float *p) { return _mm512_loadu_ps(p); }
KVP_INLINE void v16_storef(float *p, kvp_v16 a) { _mm512_storeu_ps(p, a); }
KVP_INLINE kvp_v16 v16_fma(kvp_v16 a, kvp_v16 b, kvp_v16 c) { return _mm512_fmadd_ps(a, b, c); }
KVP_INLINE kvp_v16 v16_add(kvp_v16 a, kvp_v16 b) { return _mm512_add_ps(a, b); }
/* Lane i = a[i] + a[i + 8]: the two halves folded into 8 lanes. */
KVP_INLINE kvp_v8 v16_fold(kvp_v16 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#define v16_pin(a) __asm__("" : "+v"(a))
KVP_INLINE kvp_v16 v16_max(kvp_v16 a, kvp_v16 b) { return _mm512_max_ps(a, b); }
/* The first `left` lanes (all 16 when left >= 16): a vector's live lanes at the end of a row. */
KVP_INLINE __mmask16 v16_live(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }
/* v8_exp2 on 16 lanes (the same polynomial: the same value per lane). */
KVP_INLINE kvp_v16 v16_exp2(kvp_v16 x)
{
    const __m512 lo = _mm512_set1_ps(-126.0f);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x < -126 (and -inf) give 0 */
    const __m512 xc = _mm512_max_ps(x, lo);
    const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(xc, n);
    __m512 p = _mm512_set1_ps(k_exp2_poly[0]);
    for (int i = 1; i < 7; i++) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(k_exp2_poly[i]));
    return _mm512_maskz_scalef_ps(ok, p, n); /* p * 2^n, one rounding as p * (float)2^n */
}
/* 16 elements of raw bits as floats: f16 and bf16 from 16 uint16 (__m256i), fp8 from 16 bytes (__m128i). */
KVP_INLINE kvp_v16 v16_from_f16(__m256i x) { return _mm512_cvtph_ps(x); }
KVP_INLINE kvp_v16 v16_from_bf16(__m256i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)); }
/* f16 bits of 32 e4m3fn codes (as v8_load_fp8: the codes' values times 2^-8, NaN kept). */
KVP_INLINE __m512i v32_fp8_to_f16(__m256i raw)
{
    const __m512i x = _mm512_cvtepu8_epi16(raw);
    const __m512i h = _mm512_slli_epi16(_mm512_add_epi16(x, _mm512_and_si512(x, _mm512_set1_epi16(0x80))), 7);
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_or_si512(x, _mm512_set1_epi16(0x80)), _mm512_set1_epi16(0xff));
    return _mm512_mask_blend_epi16(nan, h, _mm512_or_si512(h, _mm512_set1_epi16(0x7c00)));
}
KVP_INLINE kvp_v16 v16_from_fp8(__m128i raw) /* 16 codes (the upper 16 lanes of the conversion go unused) */
{
    return _mm512_cvtph_ps(_mm512_castsi512_si256(v32_fp8_to_f16(_mm256_zextsi128_si256(raw))));
}
/* 16 elements of type T at element offset off of pool base, as floats; the conversions of the 8-lane
 * loaders above, twice as wide. */
KVP_INLINE kvp_v16 v16_load_elem(const void *base, int64_t off, const kvp_dtype T)
{
    switch (T) {
    case KVP_DTYPE_F16: return v16_from_f16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    case KVP_DTYPE_BF16: return v16_from_bf16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    case KVP_DTYPE_FP8_E4M3: return v16_from_fp8(_mm_loadu_si128((const __m128i *)((const uint8_t *)base + off)));
    default: return _mm512_loadu_ps((const float *)base + off);
    }
}
/* 32 elements of type T at element offset off: 0-15 in *lo, 16-31 in *hi (fp8 converts the 32 codes in one
 * pass over 16-bit lanes). */
KVP_INLINE void v16_load_elem2(const void *base, int64_t off, const kvp_dtype T, kvp_v16 *lo, kvp_v16 *hi)
{
    if (T == KVP_DTYPE_FP8_E4M3) {
        const __m512i h = v32_fp8_to_f16(_mm256_loadu_si256((const __m256i *)((const uint8_t *)base + off)));
        *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
        return;
    }
    *lo = v16_load_elem(base, off, T);
    *hi = v16_load_elem(base, off + 16, T);
}
/* Two rows of 8 elements (head_dim 8) at element offsets o0 and o1 as one vector, row o0 in lanes 0-7. */
KVP_INLINE kvp_v16 v16_load_pair(const void *base, int64_t o0, int64_t o1, const kvp_dtype T)
{
    if (T == KVP_DTYPE_F16 || T == KVP_DTYPE_BF16) {
        const uint16_t *b = base;
        const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + o0))),
                                                  _mm_loadu_si128((const __m128i *)(b + o1)), 1);
        return T == KVP_DTYPE_F16 ? v16_from_f16(x) : v16_from_bf16(x);
    }
    if (T == KVP_DTYPE_FP8_E4M3) {
        const uint8_t *b = base;
        return v16_from_fp8(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b + o0)),
                                               _mm_loadl_epi64((const __m128i *)(b + o1))));
    }
    const float *b = base;
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(b + o0))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b + o1)), 1));
}
#pragma GCC pop_options
#endif

/* 8 elements of type T at element offset off of pool base, as floats (fp8: the code values times 2^-8). */
KVP_INLINE kvp_v8 v8_load_elem(const void *base, int64_t off, const kvp_dtype T)
{
    switch (T) {
    case KVP_DTYPE_F16: return v8_load_f16((const uint16_t *)base + off);
    case KVP_DTYPE_BF16: return v8_load_bf16((const uint16_t *)base + off);
    case KVP_DTYPE_FP8_E4M3: return v8_load_fp8((const uint8_t *)base + off);
    default: return v8_loadf((const float *)base + off);
    }
}

#endif
