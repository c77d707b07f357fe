/* Element-type conversions against brute-force tables of every code. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/paged_kv.h"

/* e4m3fn value of a code, straight from the format's definition. */
static double fp8_value(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
    return s ? -v : v;
}

/* Brute force: the finite code nearest to x (ties to the even mantissa), saturating at +-448. */
static int fp8_nearest(float x)
{
    if (isnan(x)) return signbit(x) ? 0xff : 0x7f;
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        double v = fp8_value(c);
        if (isnan(v) || (!!signbit(v) != !!signbit(x))) continue;
        double d = fabs(v - (double)x);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return best;
}

Test(attention_dtype, fp8_decode_all_256_codes)
{
    for (int c = 0; c < 256; c++) {
        double want = fp8_value(c);
        float got = kvp_fp8e4m3_to_f32((uint8_t)c);
        if (isnan(want)) cr_assert(isnan(got), "code 0x%02x should be NaN", c);
        else cr_assert_eq((double)got, want, "code 0x%02x: %g != %g", c, (double)got, want);
    }
    cr_assert_eq(kvp_fp8e4m3_to_f32(0x7e), 448.0f);
    cr_assert_eq(kvp_fp8e4m3_to_f32(0x01), ldexpf(1, -9));
}

Test(attention_dtype, fp8_encode_matches_brute_force_nearest)
{
    /* every code, every midpoint between neighbours and points just beside them, plus a sweep */
    for (int c = 0; c < 256; c++) {
        double v = fp8_value(c);
        if (isnan(v)) continue;
        cr_assert_eq(kvp_f32_to_fp8e4m3((float)v) & 0x7f, c & 0x7f, "round trip of code 0x%02x", c);
        if ((c & 0x7f) < 0x7e) {
            double next = fp8_value(c + 1);
            float mid = (float)((v + next) / 2);
            float xs[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY * (v < 0 ? -1 : 1))};
            for (int i = 0; i < 3; i++)
                cr_assert_eq(kvp_f32_to_fp8e4m3(xs[i]), fp8_nearest(xs[i]), "x=%.9g (near code 0x%02x)", (double)xs[i], c);
        }
    }
    uint32_t seed = 12345;
    for (int i = 0; i < 200000; i++) {
        seed = seed * 1664525u + 1013904223u;
        float x = ldexpf((float)(seed >> 8) / (1 << 24) * 2 - 1, (int)(seed % 24) - 12);
        cr_assert_eq(kvp_f32_to_fp8e4m3(x), fp8_nearest(x), "x=%.9g (seed step %d)", (double)x, i);
    }
    cr_assert_eq(kvp_f32_to_fp8e4m3(1e6f), 0x7e, "saturates");
    cr_assert_eq(kvp_f32_to_fp8e4m3(-INFINITY), 0xfe, "saturates -inf");
    cr_assert_eq(kvp_f32_to_fp8e4m3(460.0f), 0x7e);
    cr_assert_eq(kvp_f32_to_fp8e4m3(464.0f), 0x7e, "tie 448|480 goes to the even 448");
    cr_assert_eq(kvp_f32_to_fp8e4m3(NAN) & 0x7f, 0x7f);
    cr_assert_eq(kvp_f32_to_fp8e4m3(ldexpf(1, -10)), 0x00, "half of the smallest subnormal ties to 0");
    cr_assert_eq(kvp_f32_to_fp8e4m3(ldexpf(3, -10)), 0x02, "1.5 subnormal steps ties to the even code 2");
}

static double f16_value(int h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? m * pow(2, -24) : e == 31 ? (m ? NAN : INFINITY) : (1 + m / 1024.0) * pow(2, e - 15);
    return s ? -v : v;
}

Test(attention_dtype, f16_all_codes_and_ties)
{
    for (int h = 0; h < 65536; h++) {
        double want = f16_value(h);
        float got = kvp_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            cr_assert(isnan(got), "code 0x%04x", h);
            cr_assert(isnan(kvp_f16_to_f32(kvp_f32_to_f16(got))), "NaN stays NaN (0x%04x)", h);
            continue;
        }
        cr_assert_eq((double)got, want, "decode 0x%04x", h);
        cr_assert_eq(kvp_f32_to_f16(got), h, "round trip 0x%04x", h);
        if ((h & 0x7fff) < 0x7bff) { /* the tie between h and h+1 goes to the even one */
            float mid = (float)((want + f16_value(h + 1)) / 2);
            int even = (h & 1) ? h + 1 : h;
            cr_assert_eq(kvp_f32_to_f16(mid), even, "tie above 0x%04x", h);
            cr_assert_eq(kvp_f32_to_f16(nextafterf(mid, 0)), h, "just below the tie above 0x%04x", h);
        }
    }
    cr_assert_eq(kvp_f32_to_f16(65520.0f), 0x7c00, "overflow rounds to infinity");
    cr_assert_eq(kvp_f32_to_f16(65519.0f), 0x7bff);
}

Test(attention_dtype, bf16_all_codes_and_ties)
{
    for (int h = 0; h < 65536; h++) {
        float got = kvp_bf16_to_f32((uint16_t)h);
        uint32_t u = (uint32_t)h << 16;
        float want;
        memcpy(&want, &u, 4);
        if (isnan(want)) {
            cr_assert(isnan(got) && isnan(kvp_bf16_to_f32(kvp_f32_to_bf16(got))), "NaN 0x%04x", h);
            continue;
        }
        cr_assert_eq(got, want, "decode 0x%04x", h);
        cr_assert_eq(kvp_f32_to_bf16(got), h, "round trip 0x%04x", h);
        if ((h & 0x7fff) < 0x7f7f) {
            uint32_t mu = u | 0x8000u; /* exactly halfway to the next code */
            float mid;
            memcpy(&mid, &mu, 4);
            cr_assert_eq(kvp_f32_to_bf16(mid), (h & 1) ? h + 1 : h, "tie above 0x%04x", h);
        }
    }
}

Test(attention_dtype, names_and_parse)
{
    kvp_dtype t;
    for (int i = 0; i < KVP_DTYPE_COUNT; i++) {
        cr_assert_eq(kvp_dtype_parse(kvp_dtype_name((kvp_dtype)i), &t), KVP_OK);
        cr_assert_eq(t, i);
    }
    cr_assert_eq(kvp_dtype_parse("int4", &t), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "int4") != NULL);
    cr_assert_eq(kvp_dtype_size(KVP_DTYPE_BF16), 2);
    cr_assert_eq(kvp_dtype_size((kvp_dtype)42), 0);
}
