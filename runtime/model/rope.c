/* runtime/model/rope.c — RoPE: frequencies for every scaling, angles and rotation (the parts: model_internal.h). */
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

/* yarn: the dimension whose frequency turns n_rot times over the original context (fractional). */
static double yarn_corr_dim(double n_rot, int32_t dim, double base, double orig)
{
    return dim * log(orig / (n_rot * 2 * M_PI)) / (2 * log(base));
}

int32_t kvp_rotary_dim(const kvp_model_config *c) { return c->rotary_dim > 0 ? c->rotary_dim : c->head_dim; }

void kvp_rope_frequencies(const kvp_model_config *c, int64_t max_len, double *inv_freq, double *scale)
{
    const int32_t dim = kvp_rotary_dim(c), half = dim / 2;
    const double factor = c->rope_scaling_factor;
    const char *type = c->rope_scaling_type;
    double theta = c->rope_theta > 0 ? c->rope_theta : 10000.0;
    /* dynamic NTK as vLLM runs it: one larger base for the whole stretched context (factor x the original;
     * transformers' base grows with the sequence's length, which K/V already cached cannot follow) */
    if (!strcmp(type, "dynamic")) theta *= pow(factor * factor - (factor - 1), dim / (dim - 2.0));
    /* yarn: dimensions below lo keep their frequency (they turn beta_fast times or more over the original
     * context), above hi are interpolated (divided by factor), and a linear ramp mixes the two between */
    double lo = 0, hi = 0;
    if (!strcmp(type, "yarn")) {
        const double orig = (double)(c->rope_original_max_position > 0 ? c->rope_original_max_position
                                                                        : c->max_position_embeddings);
        lo = yarn_corr_dim(c->rope_beta_fast, dim, theta, orig);
        hi = yarn_corr_dim(c->rope_beta_slow, dim, theta, orig);
        if (c->rope_truncate) lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0;
        hi = hi < dim - 1 ? hi : dim - 1;
        if (hi == lo) hi += 0.001;
    }
    *scale = 1.0;
    if (!strcmp(type, "yarn"))
        *scale = c->rope_attention_factor > 0 ? c->rope_attention_factor
                 : c->rope_mscale > 0 && c->rope_mscale_all_dim > 0
                     ? kvp_yarn_mscale(factor, c->rope_mscale) / kvp_yarn_mscale(factor, c->rope_mscale_all_dim)
                     : kvp_yarn_mscale(factor, 1.0);
    /* longrope: one set of factors for the whole served context (vLLM's and llama.cpp's choice: switching at
     * the original length would leave K/V cached under the other set) */
    const int longrope = !strcmp(type, "longrope"), use_long = max_len > c->rope_original_max_position;
    if (longrope) {
        const double s = (double)c->max_position_embeddings / (double)c->rope_original_max_position;
        const double ms = use_long ? c->rope_long_mscale : c->rope_short_mscale;
        *scale = c->rope_attention_factor > 0 ? c->rope_attention_factor
                 : ms > 0                     ? ms
                 : s > 1                      ? sqrt(1 + log(s) / log((double)c->rope_original_max_position))
                                              : 1.0;
    }
    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow(theta, (2.0 * i) / dim);
        if (longrope) {
            f /= use_long ? c->rope_long_factor[i] : c->rope_short_factor[i];
        } else if (!strcmp(type, "linear")) {
            f /= factor;
        } else if (!strcmp(type, "yarn")) {
            double ramp = (i - lo) / (hi - lo); /* 0: keep, 1: interpolate */
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            f = f / factor * ramp + f * (1 - ramp);
        } else if (!strcmp(type, "llama3") && factor > 0) {
            double old = (double)c->rope_original_max_position, lo_f = c->rope_low_freq_factor,
                   hi_f = c->rope_high_freq_factor;
            double low_wl = old / lo_f, high_wl = old / hi_f, wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / factor;
            } else if (wl >= high_wl && hi_f != lo_f) {
                double smooth = (old / wl - lo_f) / (hi_f - lo_f);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* RoPE's frequencies and scale for the context served (the cap, else the model's), divided by GGUF's
 * rope_freqs.weight when it has one. */
void mdl_set_rope(kvp_model *m)
{
    kvp_rope_frequencies(&m->cfg, kvp_model_max_len(m), m->inv_freq, &m->rope_scale);
    for (int32_t i = 0; m->freq_div && i < m->rot / 2; i++) m->inv_freq[i] /= m->freq_div[i];
}

/* The context positions may reach, and RoPE's frequencies and scale. */

/* cs (2 * head_dim/2): cos, sin of pos * inv_freq[i] times rope_scale, interleaved (computed in double, rounded
 * to float). */
void mdl_rope_angles(const kvp_model *m, const double *inv_freq, double scale, int32_t pos, float *cs)
{
    const int32_t half = m->rot / 2;
    for (int32_t i = 0; i < half; i++) {
        double a = (double)pos * inv_freq[i];
        cs[2 * i] = (float)(cos(a) * scale);
        cs[2 * i + 1] = (float)(sin(a) * scale);
    }
}

/* Rotates each head's pairs (2i, 2i+1) (paired style) or (i, i + half) (rotate-half) of its leading rot
 * dimensions (half = rot / 2; the others pass unrotated) by the angles cs; a head at a time, its pairs in one
 * loop the compiler vectorizes (the same operations per element). */
void mdl_rope(const kvp_model *m, float *v, int32_t nheads, const float *cs)
{
    const int32_t hd = m->cfg.head_dim, half = m->rot / 2;
    for (int32_t h = 0; h < nheads; h++) {
        float *restrict p = v + (int64_t)h * hd;
        if (m->rope == KVP_ROPE_PAIRS) {
            for (int32_t i = 0; i < half; i++) {
                const float c = cs[2 * i], s = cs[2 * i + 1], x0 = p[2 * i], x1 = p[2 * i + 1];
                p[2 * i] = x0 * c - x1 * s;
                p[2 * i + 1] = x0 * s + x1 * c;
            }
        } else {
            for (int32_t i = 0; i < half; i++) {
                const float c = cs[2 * i], s = cs[2 * i + 1], x0 = p[i], x1 = p[i + half];
                p[i] = x0 * c - x1 * s;
                p[i + half] = x0 * s + x1 * c;
            }
        }
    }
}
