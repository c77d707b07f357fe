/* runtime/loader/tensor.c — dtype sizes and conversions of weight tensors to f32. */
#include "runtime/loader/tensor.h"

#include <string.h>

static float wt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float wt_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvp_wt_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* NaN stays NaN */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

uint16_t kvp_wt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (ax < 0x38800000u) {                                  /* subnormal or zero in f16 */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1;
    r += 0xfff + lsb;
    return (uint16_t)(sign | (r >> 13));
}

static uint16_t rd16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static float f16_at(const unsigned char *p) { return wt_f16_to_f32(rd16(p)); }

/* A block converter turns one block at x into `block` floats at y; the plain types convert a run of n
 * elements at once instead (a call per element would cost more than the conversion). The arithmetic follows
 * ggml-quants.c's dequantize_row_* operation by operation (products grouped as there, integers converted
 * to float before they meet a float), so the results are the same floats. A compiler that fuses a*b - c
 * cannot change them: every product that meets an addition is exact in f32 (an f16 scale's 11 significant
 * bits times a 6-bit scale times a 5-bit quant at most). */
typedef void (*run_fn)(const unsigned char *p, int64_t n, float *y);
typedef void (*block_fn)(const unsigned char *x, float *y);

static void f32_run(const unsigned char *p, int64_t n, float *y) { memcpy(y, p, (size_t)n * 4); }

static void f16_run(const unsigned char *p, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) y[i] = f16_at(p + 2 * i);
}

static void bf16_run(const unsigned char *p, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) y[i] = wt_bf16_to_f32(rd16(p + 2 * i));
}

static void q8_0_block(const unsigned char *x, float *y) /* d | int8 qs[32] */
{
    float d = f16_at(x);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)x[2 + j] * d;
}

/* The 32-element types: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble; Q5's
 * 5th bit of element j is bit j of the little-endian u32 qh. `off` is 8 or 16 for the symmetric types
 * (d * (q - off)), 0 for the ones with a minimum m (d * q + m). */
static void q4_q5_block(const unsigned char *qs, uint32_t qh, float d, int off, const float *m, float *y)
{
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = m ? (float)lo * d + *m : (float)(lo - off) * d;
        y[j + 16] = m ? (float)hi * d + *m : (float)(hi - off) * d;
    }
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void q4_0_block(const unsigned char *x, float *y) { q4_q5_block(x + 2, 0, f16_at(x), 8, NULL, y); }

static void q4_1_block(const unsigned char *x, float *y)
{
    float m = f16_at(x + 2);
    q4_q5_block(x + 4, 0, f16_at(x), 0, &m, y);
}

static void q5_0_block(const unsigned char *x, float *y) { q4_q5_block(x + 6, rd32(x + 2), f16_at(x), 16, NULL, y); }

static void q5_1_block(const unsigned char *x, float *y)
{
    float m = f16_at(x + 2);
    q4_q5_block(x + 8, rd32(x + 4), f16_at(x), 0, &m, y);
}

/* Q2_K and Q3_K: 16 groups of 16 elements, one scale each. The 2-bit quants of 128 elements share 32 bytes
 * q[0..31]: group g (0..7 within the half) reads q[l + 16 * (g & 1)] >> 2 * (g / 2), l = 0..15.
 *
 *   half 0: elements   0..127 in qs[ 0..31]     half 1: elements 128..255 in qs[32..63]
 *           g:  0  1 | 2  3 | 4  5 | 6  7
 *        bits: 1:0   | 3:2  | 5:4  | 7:6        (g even: q[0..15], g odd: q[16..31])
 *
 * Q3_K's third bit of group G (0..15) element l is bit 4 * (G / 8) + (G % 8) / 2 of hmask[l + 16 * (G & 1)],
 * and its 6-bit scales sit in 12 bytes s[]: low 4 bits in s[G] & 0xf (G < 8) or s[G - 8] >> 4, top 2 bits
 * in s[8 + G % 4] >> 2 * (G / 4). */
static const unsigned char *k2_quants(const unsigned char *qs, int group, int *shift)
{
    *shift = 2 * ((group % 8) / 2);
    return qs + 32 * (group / 8) + 16 * (group & 1);
}

static void q2_k_block(const unsigned char *x, float *y)
{
    float d = f16_at(x + 80), dmin = f16_at(x + 82);
    for (int g = 0; g < 16; g++, y += 16) {
        float dl = d * (float)(x[g] & 0xf), ml = dmin * (float)(x[g] >> 4);
        int shift;
        const unsigned char *q = k2_quants(x + 16, g, &shift);
        for (int l = 0; l < 16; l++) y[l] = dl * (float)((q[l] >> shift) & 3) - ml;
    }
}

static void q3_k_block(const unsigned char *x, float *y)
{
    const unsigned char *s = x + 96;
    float d = f16_at(x + 108);
    for (int g = 0; g < 16; g++, y += 16) {
        int sc = (g < 8 ? s[g] & 0xf : s[g - 8] >> 4) | ((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
        float dl = d * (float)(sc - 32);
        int shift, hbit = 4 * (g / 8) + (g % 8) / 2;
        const unsigned char *q = k2_quants(x + 32, g, &shift), *hm = x + 16 * (g & 1);
        for (int l = 0; l < 16; l++) y[l] = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] >> hbit) & 1 ? 0 : 4));
    }
}

/* Q4_K and Q5_K: 8 groups of 32 elements. Group g's 6-bit scale and min in the 12 bytes s[]:
 *   g < 4:  sc = s[g] & 63,                                mn = s[g + 4] & 63
 *   g >= 4: sc = (s[g + 4] & 0xf) | (s[g - 4] >> 6) << 4,  mn = (s[g + 4] >> 4) | (s[g] >> 6) << 4
 * Its low 4 quant bits: qs[32 * (g / 2) + l] low nibble (g even) or high nibble (g odd); Q5_K's 5th bit is
 * bit g of qh[l]. */
static void k4_scale_min(const unsigned char *s, int g, float d, float dmin, float *dl, float *ml)
{
    int sc = g < 4 ? s[g] & 63 : (s[g + 4] & 0xf) | (s[g - 4] >> 6) << 4;
    int mn = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
    *dl = d * (float)sc;
    *ml = dmin * (float)mn;
}

static void q4_q5_k_block(const unsigned char *x, const unsigned char *qh, const unsigned char *qs, float *y)
{
    float d = f16_at(x), dmin = f16_at(x + 2);
    for (int g = 0; g < 8; g++, y += 32) {
        float dl, ml;
        k4_scale_min(x + 4, g, d, dmin, &dl, &ml);
        const unsigned char *q = qs + 32 * (g / 2);
        int shift = 4 * (g & 1);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0xf) + (qh ? ((qh[l] >> g) & 1) * 16 : 0);
            y[l] = dl * (float)v - ml;
        }
    }
}

static void q4_k_block(const unsigned char *x, float *y) { q4_q5_k_block(x, NULL, x + 16, y); }

static void q5_k_block(const unsigned char *x, float *y) { q4_q5_k_block(x, x + 16, x + 48, y); }

/* Q6_K: 16 groups of 16 elements, one int8 scale each. Per half h (128 elements) ql[64 h ..] and
 * qh[32 h ..]; quarter k (0..3, 32 elements, groups 2k and 2k + 1) takes its low 4 bits from
 * ql[64 h + 32 (k & 1) + l] (low nibble for k < 2, high for k >= 2) and its top 2 bits from
 * qh[32 h + l] >> 2k, l = 0..31. */
static void q6_k_block(const unsigned char *x, float *y)
{
    float d = f16_at(x + 208);
    for (int g = 0; g < 16; g++, y += 16) {
        int h = g / 8, k = (g % 8) / 2, l0 = 16 * (g & 1);
        const unsigned char *ql = x + 64 * h + 32 * (k & 1) + l0, *qh = x + 128 + 32 * h + l0;
        float ds = d * (float)(int8_t)x[192 + g];
        for (int l = 0; l < 16; l++) {
            int q = ((ql[l] >> (4 * (k >> 1))) & 0xf) | ((qh[l] >> (2 * k)) & 3) << 4;
            y[l] = ds * (float)(q - 32);
        }
    }
}

/* Every type's facts in one place (the layouts are in tensor.h): the loaders' size checks, the names and
 * the conversions all read this. */
static const struct {
    const char *name;
    uint32_t ggml;       /* GGUF's type id */
    int32_t block;       /* elements a block */
    int32_t bytes;       /* bytes a block */
    run_fn run;          /* the plain types */
    block_fn dequant;    /* the quantized ones */
} WT[KVP_WT_COUNT] = {
    [KVP_WT_F32] = {"F32", 0, 1, 4, f32_run, NULL},
    [KVP_WT_F16] = {"F16", 1, 1, 2, f16_run, NULL},
    [KVP_WT_BF16] = {"BF16", 30, 1, 2, bf16_run, NULL},
    [KVP_WT_Q4_0] = {"Q4_0", 2, 32, 18, NULL, q4_0_block},
    [KVP_WT_Q4_1] = {"Q4_1", 3, 32, 20, NULL, q4_1_block},
    [KVP_WT_Q5_0] = {"Q5_0", 6, 32, 22, NULL, q5_0_block},
    [KVP_WT_Q5_1] = {"Q5_1", 7, 32, 24, NULL, q5_1_block},
    [KVP_WT_Q8_0] = {"Q8_0", 8, 32, 34, NULL, q8_0_block},
    [KVP_WT_Q2_K] = {"Q2_K", 10, 256, 84, NULL, q2_k_block},
    [KVP_WT_Q3_K] = {"Q3_K", 11, 256, 110, NULL, q3_k_block},
    [KVP_WT_Q4_K] = {"Q4_K", 12, 256, 144, NULL, q4_k_block},
    [KVP_WT_Q5_K] = {"Q5_K", 13, 256, 176, NULL, q5_k_block},
    [KVP_WT_Q6_K] = {"Q6_K", 14, 256, 210, NULL, q6_k_block},
};

static int valid(kvp_wtype dt) { return (unsigned)dt < KVP_WT_COUNT; }

const char *kvp_wtype_name(kvp_wtype dt) { return valid(dt) ? WT[dt].name : "?"; }

int32_t kvp_wtype_block(kvp_wtype dt) { return valid(dt) ? WT[dt].block : 0; }

int kvp_wtype_from_ggml(uint32_t ggml_type, kvp_wtype *dt)
{
    for (int i = 0; i < KVP_WT_COUNT; i++)
        if (WT[i].ggml == ggml_type) {
            *dt = (kvp_wtype)i;
            return 1;
        }
    return 0;
}

size_t kvp_wtype_nbytes(kvp_wtype dt, int64_t numel)
{
    if (!valid(dt) || numel < 0 || numel % WT[dt].block) return 0;
    uint64_t blocks = (uint64_t)numel / (uint64_t)WT[dt].block;
    if (blocks > (UINT64_MAX >> 3) / (uint64_t)WT[dt].bytes) return 0;
    return (size_t)(blocks * (uint64_t)WT[dt].bytes);
}

void kvp_tensor_to_f32(const kvp_tensor_view *t, float *out)
{
    if (!valid(t->dtype)) return;
    const unsigned char *p = t->data;
    int64_t block = WT[t->dtype].block, bytes = WT[t->dtype].bytes, nb = t->numel / block;
    if (WT[t->dtype].run) {
        WT[t->dtype].run(p, t->numel, out);
        return;
    }
    for (int64_t b = 0; b < nb; b++) WT[t->dtype].dequant(p + b * bytes, out + b * block);
}
