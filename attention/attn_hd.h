/* attention/attn_hd.h — the small pieces every attention backend needs, as inline functions that compile for
 * the host (C or C++) and the device (nvcc, or the CUDA emulator): element conversions bit for bit equal to
 * attention/dtype.c's (round to nearest even; NaN keeps its sign; f32 -> fp8 saturates to +-448), the
 * sliding-window bounds, and the online-softmax state with its update and merge (log2 units, as the kernels
 * score in log2 units: scores are q.k * sm_scale * log2(e)).
 *
 * tests/attention/test_attn_cuda.c checks the conversions against dtype.c exhaustively (every f16, bf16 and
 * fp8 code; f32 -> narrow over all exponents, ties and NaN payloads of both signs) and the merge against
 * one pass over the whole row.
 */
#ifndef KVP_ATTENTION_ATTN_HD_H
#define KVP_ATTENTION_ATTN_HD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/paged_kv.h" /* KVP_HD */

#ifdef __cplusplus
extern "C" {
#endif

KVP_HD uint32_t kvp_hd_f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

KVP_HD float kvp_hd_u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- conversions (the portable forms of dtype.c; same results as its F16C path) */

KVP_HD uint16_t kvp_hd_f32_to_f16(float x)
{
    uint32_t b = kvp_hd_f2u(x);
    const uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    b &= 0x7fffffffu;
    if (b > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((b >> 13) & 0x3ffu)); /* quiet NaN, sign kept */
    if (b >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                      /* rounds to infinity */
    if (b < 0x38800000u) /* subnormal half: x * 2^24 rounded to nearest even (exact scaling) */
        return (uint16_t)(sign | (uint16_t)(int)rintf(kvp_hd_u2f(b) * 16777216.0f));
    b += 0xfffu + ((b >> 13) & 1u);
    return (uint16_t)(sign | ((b - (112u << 23)) >> 13));
}

KVP_HD float kvp_hd_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return kvp_hd_u2f(kvp_hd_f2u((float)m * (1.0f / 16777216.0f)) | sign);
    if (e == 31) return kvp_hd_u2f(sign | 0x7f800000u | (m << 13));
    return kvp_hd_u2f(sign | ((e + 112u) << 23) | (m << 13));
}

KVP_HD uint16_t kvp_hd_f32_to_bf16(float x)
{
    uint32_t b = kvp_hd_f2u(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u); /* quiet NaN, sign kept */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

KVP_HD float kvp_hd_bf16_to_f32(uint16_t h) { return kvp_hd_u2f((uint32_t)h << 16); }

/* e4m3fn: S EEEE MMM, bias 7, subnormals m * 2^-9, S.1111.111 NaN, no infinity. */
KVP_HD uint8_t kvp_hd_f32_to_fp8e4m3(float x)
{
    const uint32_t bits = kvp_hd_f2u(x);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    const uint32_t ab = bits & 0x7fffffffu;
    if (ab > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    const float a = kvp_hd_u2f(ab);
    if (!(a < 464.0f)) return (uint8_t)(sign | 0x7eu); /* saturate (464, the 448|480 tie, goes to 448) */
    if (a < 0.015625f) return (uint8_t)(sign | (uint8_t)(int)rintf(a * 512.0f));
    uint32_t b = ab + 0x7ffffu + ((ab >> 20) & 1u);
    uint32_t code = (b >> 20) - ((127u - 7u) << 3);
    if (code > 0x7eu) code = 0x7eu;
    return (uint8_t)(sign | (uint8_t)code);
}

/* The code's value (unscaled), by bit arithmetic: normal codes rebias 7 -> 127, subnormals m * 2^-9. */
KVP_HD float kvp_hd_fp8e4m3_to_f32(uint8_t c)
{
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    if (e == 15u && m == 7u) return kvp_hd_u2f(sign | 0x7fc00000u);
    if (e == 0u) return kvp_hd_u2f(kvp_hd_f2u((float)m * 0.001953125f) | sign);
    return kvp_hd_u2f(sign | ((e + 120u) << 23) | (m << 20));
}

/* ---- masking: query at position pos (0-based in its sequence) sees keys lo .. pos */
KVP_HD int32_t kvp_hd_window_lo(int32_t pos, int32_t window_left)
{
    return window_left >= 0 && pos - window_left > 0 ? pos - window_left : 0;
}

/* ---- online softmax in log2 units: m the running max (-inf: no key yet), l the sum of 2^(s - m) */
typedef struct {
    float m, l;
} kvp_softmax_state;

/* Folds a tile whose max is tile_max into st; returns alpha, the factor that rescales what was accumulated
 * so far (0 when nothing was, 1 when the max did not move); *m_new is the max to exponentiate the tile with
 * (-inf when every score so far is masked: then the tile's weights are 0). The caller then adds the tile's
 * sum of 2^(s - m_new) to st->l. */
KVP_HD float kvp_hd_softmax_update(kvp_softmax_state *st, float tile_max, float *m_new)
{
    const float mn = st->m > tile_max ? st->m : tile_max;
    const float alpha = st->m == -INFINITY ? 0.0f : mn == st->m ? 1.0f : exp2f(st->m - mn);
    st->l *= alpha;
    st->m = mn;
    *m_new = mn;
    return alpha;
}

/* The log2-sum-exp of a state (-inf when empty). */
KVP_HD float kvp_hd_softmax_lse2(kvp_softmax_state st) { return st.l > 0.0f ? st.m + log2f(st.l) : -INFINITY; }

/* Merge weight of a partial result with log2-sum-exp lse2 against the running max M of all parts: 2^(lse2 - M)
 * (0 for an empty part). out = sum_c w_c o_c / sum_c w_c, lse = M + log2(sum_c w_c). */
KVP_HD float kvp_hd_merge_weight(float lse2, float M) { return lse2 == -INFINITY ? 0.0f : exp2f(lse2 - M); }

#ifdef __cplusplus
}
#endif

#endif
