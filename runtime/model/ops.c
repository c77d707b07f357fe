/* runtime/model/ops.c — the small kernels: RMSNorm, gated activations, soft caps (the parts: model_internal.h). */
#include "runtime/model/model_internal.h"

#include <cblas.h>
#include <dirent.h>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/cpu.h"
#include "common/json.h"
#include "common/timer.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"

typedef float kvp_v16f __attribute__((vector_size(64)));
typedef int32_t kvp_v16i __attribute__((vector_size(64)));
#define V16_BC(x) ((kvp_v16f){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x)})
#define V16I_BC(x) ((kvp_v16i){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x)})

/* *x = mask ? a : *x, lane by lane (pointers: 64-byte vectors by value change the ABI without AVX-512). */
MM_INLINE void v16_select(kvp_v16f *x, const kvp_v16i *mask, float a)
{
    kvp_v16i xi, ai, r;
    kvp_v16f av = V16_BC(a);
    memcpy(&xi, x, sizeof xi);
    memcpy(&ai, &av, sizeof ai);
    r = (*mask & ai) | (~*mask & xi);
    memcpy(x, &r, sizeof r);
}

MM_INLINE void v16_exp(kvp_v16f *io)
{
    kvp_v16f x = *io;
    kvp_v16i m = x > V16_BC(88.0f);
    v16_select(&x, &m, 88.0f);
    m = x < V16_BC(-87.0f);
    v16_select(&x, &m, -87.0f);
    kvp_v16f t = x * V16_BC(1.44269504088896341f) + V16_BC(0.5f);
    kvp_v16f n = __builtin_convertvector(__builtin_convertvector(t, kvp_v16i), kvp_v16f); /* trunc */
    kvp_v16i up = n > t; /* -1 where truncation rounded up: floor = n - 1 */
    n = n + __builtin_convertvector(up, kvp_v16f);
    kvp_v16f r = x - n * V16_BC(0.693359375f) - n * V16_BC(-2.12194440e-4f);
    kvp_v16f p = V16_BC(1.9875691500e-4f);
    p = p * r + V16_BC(1.3981999507e-3f);
    p = p * r + V16_BC(8.3334519073e-3f);
    p = p * r + V16_BC(4.1665795894e-2f);
    p = p * r + V16_BC(1.6666665459e-1f);
    p = p * r + V16_BC(5.0000001201e-1f);
    p = p * (r * r) + r + V16_BC(1.0f);
    kvp_v16i e = (__builtin_convertvector(n, kvp_v16i) + V16I_BC(127)) << 23;
    kvp_v16f scale;
    memcpy(&scale, &e, sizeof scale);
    *io = p * scale;
}

/* g[0..16) = silu(g) * u = g / (1 + exp(-g)) * u. */
MM_INLINE void silu_mul16(float *g, const float *u)
{
    kvp_v16f a, b, e;
    memcpy(&a, g, sizeof a);
    memcpy(&b, u, sizeof b);
    e = -a;
    v16_exp(&e);
    a = a / (V16_BC(1.0f) + e) * b;
    memcpy(g, &a, sizeof a);
}

/* g[0..16) = gelu(g) * u, gelu's tanh form (gelu_pytorch_tanh): 0.5 g (1 + tanh(z)) = g / (1 + exp(-2z)),
 * z = sqrt(2 / pi) (g + 0.044715 g^3). */
MM_INLINE void gelu_tanh_mul16(float *g, const float *u)
{
    kvp_v16f a, b, e;
    memcpy(&a, g, sizeof a);
    memcpy(&b, u, sizeof b);
    e = a * (V16_BC(-1.5957691216f) - V16_BC(0.0713548163f) * (a * a)); /* -2z */
    v16_exp(&e);
    a = a / (V16_BC(1.0f) + e) * b;
    memcpy(g, &a, sizeof a);
}

MM_INLINE void act_mul16(int act, float *g, const float *u)
{
    if (act == KVP_ACT_SILU) silu_mul16(g, u);
    else gelu_tanh_mul16(g, u);
}

/* g[i] = act(g[i]) * u[i] (act: KVP_ACT_*; SwiGLU or GeGLU), 16 at a time (a short tail through a padded vector,
 * so every element takes the same operations whatever n and its place). Built twice (ifunc): with AVX-512F a
 * vector is one instruction's operand instead of two, and the divisions, which bound this loop, take half the
 * instructions (the same operations, the same bits). Exact gelu (erf) runs element by element. */
__attribute__((target_clones("avx512f", "default"))) void mdl_glu(int act, float *restrict g,
                                                                     const float *restrict u, int64_t n)
{
    if (act == KVP_ACT_GELU) {
        for (int64_t i = 0; i < n; i++) g[i] = 0.5f * g[i] * (1.0f + erff(g[i] * 0.70710678118654752f)) * u[i];
        return;
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) act_mul16(act, g + i, u + i);
    if (i < n) {
        float ta[16] = {0}, tb[16] = {0};
        memcpy(ta, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(tb, u + i, (size_t)(n - i) * sizeof(float));
        act_mul16(act, ta, tb);
        memcpy(g + i, ta, (size_t)(n - i) * sizeof(float));
    }
}

/* x = cap tanh(x / cap) (gemma2's final_logit_softcapping), n values; cap 0: unchanged. */
void mdl_softcap(float *x, int64_t n, double cap)
{
    const float c = (float)cap;
    for (int64_t i = 0; cap > 0 && i < n; i++) x[i] = c * tanhf(x[i] / c);
}

/* The sum of squares runs in eight lanes (element i into lane i % 8, a zero-padded tail), then the lanes are
 * added in a fixed tree: one order for every n and every row. A single scalar chain waited on the add's
 * latency at each element (64 of them a row for stories260K, 11 rows a token). */
void mdl_rmsnorm(float *out, const float *x, const float *w, int64_t n, double eps)
{
    kvp_v8f a = V8_BC(0.0f), b;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V8_LD(b, x + i);
        a = V8_MAC(a, b, b);
    }
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        V8_LD(b, t);
        a = V8_MAC(a, b, b);
    }
    float ss = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    ss = ss / (float)n + (float)eps;
    ss = 1.0f / sqrtf(ss);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (ss * x[i]);
}
