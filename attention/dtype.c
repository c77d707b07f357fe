/* attention/dtype.c — element types of the KV pools and their scalar conversions (round-to-nearest-even).
 * The F16C instructions are used when the build targets them (Release: -march=x86-64-v3); the portable
 * bit-level versions below serve every other build and are tested against the same exhaustive tables. */
#include <math.h>
#include <string.h>

#include "attention/paged_kv.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

size_t kvp_dtype_size(kvp_dtype t)
{
    switch (t) {
    case KVP_DTYPE_F32: return 4;
    case KVP_DTYPE_F16:
    case KVP_DTYPE_BF16: return 2;
    case KVP_DTYPE_FP8_E4M3: return 1;
    default: return 0;
    }
}

const char *kvp_dtype_name(kvp_dtype t)
{
    static const char *const names[KVP_DTYPE_COUNT] = {"f32", "f16", "bf16", "fp8"};
    return (unsigned)t < KVP_DTYPE_COUNT ? names[t] : "?";
}

kvp_status kvp_dtype_parse(const char *s, kvp_dtype *out)
{
    static const struct {
        const char *name;
        kvp_dtype t;
    } names[] = {{"f32", KVP_DTYPE_F32},        {"fp32", KVP_DTYPE_F32},  {"float32", KVP_DTYPE_F32},
                 {"f16", KVP_DTYPE_F16},        {"fp16", KVP_DTYPE_F16},  {"float16", KVP_DTYPE_F16},
                 {"bf16", KVP_DTYPE_BF16},      {"bfloat16", KVP_DTYPE_BF16}, {"fp8", KVP_DTYPE_FP8_E4M3},
                 {"fp8_e4m3", KVP_DTYPE_FP8_E4M3}};
    for (size_t i = 0; s != NULL && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return KVP_OK;
        }
    return KVP_ERR(KVP_EINVAL, "unknown dtype '%s' (use f32, f16, bf16 or fp8; fp32 and fp16 also)", s ? s : "(null)");
}

uint16_t kvp_f32_to_f16(float x)
{
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    uint32_t b = f2u(x);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    b &= 0x7fffffffu;
    if (b > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((b >> 13) & 0x3ffu)); /* quiet NaN */
    if (b >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds (to even) to infinity */
    if (b < 0x38800000u) {
        /* below 2^-14: a subnormal half, mantissa = x * 2^24 rounded (exact scaling by a power of two) */
        return (uint16_t)(sign | (uint16_t)(int)rintf(u2f(b) * 16777216.0f));
    }
    b += 0xfffu + ((b >> 13) & 1u); /* round the 13 dropped bits to nearest even; carries into the exponent */
    return (uint16_t)(sign | ((b - (112u << 23)) >> 13));
#endif
}

float kvp_f16_to_f32(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

uint16_t kvp_f32_to_bf16(float x)
{
    uint32_t b = f2u(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u); /* keep NaN a quiet NaN */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

float kvp_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* e4m3fn: S EEEE MMM, bias 7; exponent 0 holds subnormals m * 2^-9; S 1111 111 is NaN; no infinity. */
uint8_t kvp_f32_to_fp8e4m3(float x)
{
    uint8_t sign = (uint8_t)((f2u(x) >> 24) & 0x80u);
    float a = fabsf(x);
    if (isnan(x)) return (uint8_t)(sign | 0x7fu);
    if (!(a < 464.0f)) return (uint8_t)(sign | 0x7eu); /* saturate (464 is the tie 448|480, goes to 448) */
    if (a < 0.015625f) {                               /* below 2^-6: subnormal, code = round(a * 2^9) */
        return (uint8_t)(sign | (uint8_t)(int)rintf(a * 512.0f)); /* 8 becomes 0x08 = 2^-6, correct */
    }
    /* normal: round the f32 mantissa to 3 bits (to nearest even; a carry steps the exponent), then rebias
     * 127 -> 7 (bit arithmetic: frexpf/ldexpf calls took ~10 % of an fp8-cache decode step) */
    uint32_t b = f2u(a);
    b += 0x7ffffu + ((b >> 20) & 1u);
    uint32_t code = (b >> 20) - ((127u - 7u) << 3);
    if (code > 0x7eu) code = 0x7eu; /* a guard: below 464 the rounding stops at 448 (0x7e) */
    return (uint8_t)(sign | (uint8_t)code);
}

float kvp_fp8e4m3_to_f32(uint8_t c)
{
    int e = (c >> 3) & 0xf, m = c & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return (c & 0x80u) ? -v : v;
}
