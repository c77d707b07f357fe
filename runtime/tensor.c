/* runtime/tensor.c — dtype sizes and conversions of weight tensors to f32. */
#include "runtime/tensor.h"

#include <string.h>

const char *kvp_wtype_name(kvp_wtype dt)
{
    switch (dt) {
    case KVP_WT_F32: return "F32";
    case KVP_WT_F16: return "F16";
    case KVP_WT_BF16: return "BF16";
    case KVP_WT_Q8_0: return "Q8_0";
    default: return "?";
    }
}

size_t kvp_wtype_nbytes(kvp_wtype dt, int64_t numel)
{
    if (numel < 0) return 0;
    uint64_t n = (uint64_t)numel;
    if (n > (UINT64_MAX >> 3)) return 0;
    switch (dt) {
    case KVP_WT_F32: return (size_t)(n * 4);
    case KVP_WT_F16:
    case KVP_WT_BF16: return (size_t)(n * 2);
    case KVP_WT_Q8_0:
        if (n % KVP_Q8_0_BLOCK) return 0;
        return (size_t)(n / KVP_Q8_0_BLOCK * KVP_Q8_0_BYTES);
    default: return 0;
    }
}

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

void kvp_tensor_to_f32(const kvp_tensor_view *t, float *out)
{
    const unsigned char *p = t->data;
    int64_t n = t->numel;
    switch (t->dtype) {
    case KVP_WT_F32: memcpy(out, p, (size_t)n * 4); break;
    case KVP_WT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = wt_f16_to_f32(rd16(p + 2 * i));
        break;
    case KVP_WT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = wt_bf16_to_f32(rd16(p + 2 * i));
        break;
    case KVP_WT_Q8_0:
        for (int64_t b = 0; b < n / KVP_Q8_0_BLOCK; b++) {
            const unsigned char *blk = p + b * KVP_Q8_0_BYTES;
            float d = wt_f16_to_f32(rd16(blk));
            for (int j = 0; j < KVP_Q8_0_BLOCK; j++) out[b * KVP_Q8_0_BLOCK + j] = d * (float)(int8_t)blk[2 + j];
        }
        break;
    default: break;
    }
}
