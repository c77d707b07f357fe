/* tests/runtime/reference_testutil.c — see reference_testutil.h. */
#include "reference_testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_test.h"

void ref_rmsnorm(double *y, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void ref_mv(double *y, const float *w, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        y[r] = 0;
        for (int c = 0; c < cols; c++) y[r] += (double)w[r * cols + c] * x[c];
    }
}

/* y (64) = down(silu(gate x) * up x), the FFN of mf units whose matrices are named pre + gate/up/down. */
void ref_swiglu(double *y, const ck_tensor *t, int nt, const char *const names[3], int mf, const double *x)
{
    double gv[172], uv[172];
    ref_mv(gv, ck_find(t, nt, names[0]), x, mf, 64);
    ref_mv(uv, ck_find(t, nt, names[1]), x, mf, 64);
    for (int r = 0; r < mf; r++) gv[r] = gv[r] / (1 + exp(-gv[r])) * uv[r];
    ref_mv(y, ck_find(t, nt, names[2]), gv, 64, mf);
}

/* logits (P, 512) of prompt tok, every position; *distinct: the experts any token chose, as a bit set */
void ref_moe_logits(const ck_tensor *t, int nt, const moe_spec *sp, const int32_t *tok, int P, double *logits,
                    unsigned *distinct)
{
    enum { PMAX = 8 };
    static double x[PMAX][64], h[PMAX][64], q[PMAX][64], k[PMAX][32], v[PMAX][32], o[64], y[64], ye[64];
    char n[128], names[3][128];
    const char *const names_p[3] = {names[0], names[1], names[2]};
    const char *blk = sp->qwen ? "mlp" : "block_sparse_moe";
    const int E = sp->experts;
    cr_assert(P <= PMAX);
    *distinct = 0;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < 64; i++) x[p][i] = ck_find(t, nt, "model.embed_tokens.weight")[tok[p] * 64 + i];
#define W(fmt, ...) (snprintf(n, sizeof n, "model.layers.%d." fmt, l, ##__VA_ARGS__), ck_find(t, nt, n))
    for (int l = 0; l < 5; l++) {
        for (int p = 0; p < P; p++) {
            ref_rmsnorm(h[p], x[p], W("input_layernorm.weight"), 64);
            ref_mv(q[p], W("self_attn.q_proj.weight"), h[p], 64, 64);
            ref_mv(k[p], W("self_attn.k_proj.weight"), h[p], 32, 64);
            ref_mv(v[p], W("self_attn.v_proj.weight"), h[p], 32, 64);
            for (int hd = 0; hd < 12; hd++) { /* 8 query heads then 4 key heads: q/k norm, rotate-half RoPE */
                double *a = hd < 8 ? q[p] + hd * 8 : k[p] + (hd - 8) * 8;
                if (sp->qwen) ref_rmsnorm(a, a, hd < 8 ? W("self_attn.q_norm.weight") : W("self_attn.k_norm.weight"), 8);
                for (int i = 0; i < 4; i++) {
                    const double th = p * pow(10000.0, -i / 4.0), a1 = a[i], a2 = a[i + 4];
                    a[i] = a1 * cos(th) - a2 * sin(th);
                    a[i + 4] = a2 * cos(th) + a1 * sin(th);
                }
            }
        }
        for (int p = 0; p < P; p++) {
            for (int hq = 0; hq < 8; hq++) { /* causal attention, query head hq on key head hq / 2 */
                double s[PMAX], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= p; j++) {
                    s[j] = 0;
                    for (int i = 0; i < 8; i++) s[j] += q[p][hq * 8 + i] * k[j][hq / 2 * 8 + i];
                    s[j] /= sqrt(8.0);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= p; j++) sum += s[j] = exp(s[j] - mx);
                for (int i = 0; i < 8; i++) {
                    o[hq * 8 + i] = 0;
                    for (int j = 0; j <= p; j++) o[hq * 8 + i] += s[j] / sum * v[j][hq / 2 * 8 + i];
                }
            }
            ref_mv(y, W("self_attn.o_proj.weight"), o, 64, 64);
            for (int i = 0; i < 64; i++) x[p][i] += y[i];
        }
        for (int p = 0; p < P; p++) {
            ref_rmsnorm(h[p], x[p], W("post_attention_layernorm.weight"), 64);
            if (tu_moe_dense_layer(sp, l)) {
                for (int j = 0; j < 3; j++)
                    snprintf(names[j], sizeof names[j], "model.layers.%d.mlp.%s_proj.weight", l,
                             j == 0 ? "gate" : j == 1 ? "up" : "down");
                ref_swiglu(y, t, nt, names_p, 172, h[p]);
                for (int i = 0; i < 64; i++) x[p][i] += y[i];
                continue;
            }
            double r[16], pr[16], mx = -INFINITY, sum = 0, chosen = 0;
            int top[16], taken[16] = {0};
            ref_mv(r, W("%s.gate.weight", blk), h[p], E, 64);
            for (int e = 0; e < E; e++) mx = fmax(mx, r[e]);
            for (int e = 0; e < E; e++) sum += pr[e] = exp(r[e] - mx);
            for (int j = 0; j < sp->k; j++) { /* the likeliest expert not yet taken */
                top[j] = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (top[j] < 0 || pr[e] > pr[top[j]])) top[j] = e;
                taken[top[j]] = 1;
                chosen += pr[top[j]] / sum;
                *distinct |= 1u << top[j];
            }
            memset(y, 0, sizeof y);
            for (int j = 0; j < sp->k; j++) {
                const int e = top[j];
                static const char *const hf[2][3] = {{"w1", "w3", "w2"}, {"gate_proj", "up_proj", "down_proj"}};
                for (int i = 0; i < 3; i++)
                    snprintf(names[i], sizeof names[i], "model.layers.%d.%s.experts.%d.%s.weight", l, blk, e,
                             hf[sp->qwen][i]);
                ref_swiglu(ye, t, nt, names_p, sp->mf, h[p]);
                const double wgt = pr[e] / sum / (sp->qwen && !sp->norm_topk ? 1.0 : chosen);
                for (int i = 0; i < 64; i++) y[i] += wgt * ye[i];
            }
            for (int i = 0; i < 64; i++) x[p][i] += y[i];
        }
    }
#undef W
    for (int p = 0; p < P; p++) {
        ref_rmsnorm(h[p], x[p], ck_find(t, nt, "model.norm.weight"), 64);
        ref_mv(logits + p * 512, ck_find(t, nt, "model.embed_tokens.weight"), h[p], 512, 64);
    }
}

void ref_moe_spec_logits(const moe_spec *sp, const int32_t *tok, int P, double *logits)
{
    static ck_tensor t[512];
    moe_spec hf = *sp;
    hf.gguf = 0;
    const int nt = tu_moe_tensors(&hf, t);
    unsigned distinct;
    ref_moe_logits(t, nt, &hf, tok, P, logits, &distinct);
    for (int j = 0; j < nt; j++) free(t[j].f);
    cr_assert_eq(__builtin_popcount(distinct), sp->experts, "every one of the %d experts should be chosen", sp->experts);
}

/* x (n) normalized and scaled by 1 + w, as gemma's RMSNorm (w as HF stores it) */
void ref_gemma_norm(double *y, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (1.0 + w[i]);
}

/* logits (P, 512) of the HF model in t that sp describes, as transformers computes it (sp->qpas 0: 1/sqrt(8);
 * caps 0: off; a window of sp->window keys on the sliding layers, 0: none) */
void ref_gemma_logits(const ck_tensor *t, int nt, const gemma_spec *sp, const int32_t *tok, int P,
                      double *logits)
{
    enum { PMAX = 8 };
    static double x[PMAX][64], h[PMAX][64], q[PMAX][64], k[PMAX][32], v[PMAX][32], o[64], y[64], gv[172], uv[172];
    char n[128];
    const float *emb = ck_find(t, nt, "model.embed_tokens.weight");
    const int post = sp->v >= 2;
    cr_assert(P <= PMAX);
    for (int p = 0; p < P; p++)
        for (int i = 0; i < 64; i++) x[p][i] = emb[tok[p] * 64 + i] * 8.0; /* sqrt(hidden_size) */
#define W(name) (snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, name), ck_find(t, nt, n))
    for (int l = 0; l < 5; l++) {
        const int slide = tu_gemma_sliding(sp, l);
        const int local = sp->v == 3 && slide;
        const double theta = local ? (sp->local_theta ? sp->local_theta : 1e4) : 1e4;
        const double div = !local && sp->linear > 0 ? sp->linear : 1.0; /* linear scaling */
        for (int p = 0; p < P; p++) {
            ref_gemma_norm(h[p], x[p], W("input_layernorm"), 64);
            ref_mv(q[p], W("self_attn.q_proj"), h[p], 64, 64);
            ref_mv(k[p], W("self_attn.k_proj"), h[p], 32, 64);
            ref_mv(v[p], W("self_attn.v_proj"), h[p], 32, 64);
            for (int hd = 0; hd < 12; hd++) { /* gemma3's q/k norms, then rotate-half RoPE */
                double *a = hd < 8 ? q[p] + hd * 8 : k[p] + (hd - 8) * 8;
                if (sp->v == 3) ref_gemma_norm(a, a, hd < 8 ? W("self_attn.q_norm") : W("self_attn.k_norm"), 8);
                for (int i = 0; i < 4; i++) {
                    const double th = p * pow(theta, -i / 4.0) / div, a1 = a[i], a2 = a[i + 4];
                    a[i] = a1 * cos(th) - a2 * sin(th);
                    a[i + 4] = a2 * cos(th) + a1 * sin(th);
                }
            }
        }
        const int lo_off = slide && sp->window > 0 ? sp->window - 1 : PMAX; /* keys p - lo_off .. p */
        for (int p = 0; p < P; p++) {
            for (int hq = 0; hq < 8; hq++) {
                double s[PMAX], mx = -INFINITY, sum = 0;
                const int j0 = p - lo_off > 0 ? p - lo_off : 0;
                for (int j = j0; j <= p; j++) {
                    s[j] = 0;
                    for (int i = 0; i < 8; i++) s[j] += q[p][hq * 8 + i] * k[j][hq / 2 * 8 + i];
                    s[j] /= sqrt(sp->qpas > 0 ? sp->qpas : 8.0);
                    if (sp->attn_cap > 0) s[j] = sp->attn_cap * tanh(s[j] / sp->attn_cap);
                    mx = fmax(mx, s[j]);
                }
                for (int j = j0; j <= p; j++) sum += s[j] = exp(s[j] - mx);
                for (int i = 0; i < 8; i++) {
                    o[hq * 8 + i] = 0;
                    for (int j = j0; j <= p; j++) o[hq * 8 + i] += s[j] / sum * v[j][hq / 2 * 8 + i];
                }
            }
            ref_mv(y, W("self_attn.o_proj"), o, 64, 64);
            if (post) ref_gemma_norm(y, y, W("post_attention_layernorm"), 64);
            for (int i = 0; i < 64; i++) x[p][i] += y[i];
        }
        for (int p = 0; p < P; p++) {
            ref_gemma_norm(h[p], x[p], W(post ? "pre_feedforward_layernorm" : "post_attention_layernorm"), 64);
            ref_mv(gv, W("mlp.gate_proj"), h[p], 172, 64);
            ref_mv(uv, W("mlp.up_proj"), h[p], 172, 64);
            for (int r = 0; r < 172; r++) {
                const double a = gv[r];
                const double phi = sp->gelu ? erf(a / sqrt(2.0)) : tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a));
                gv[r] = 0.5 * a * (1 + phi) * uv[r];
            }
            ref_mv(y, W("mlp.down_proj"), gv, 64, 172);
            if (post) ref_gemma_norm(y, y, W("post_feedforward_layernorm"), 64);
            for (int i = 0; i < 64; i++) x[p][i] += y[i];
        }
    }
#undef W
    for (int p = 0; p < P; p++) {
        ref_gemma_norm(h[p], x[p], ck_find(t, nt, "model.norm.weight"), 64);
        ref_mv(logits + p * 512, emb, h[p], 512, 64);
        for (int i = 0; sp->final_cap > 0 && i < 512; i++)
            logits[p * 512 + i] = sp->final_cap * tanh(logits[p * 512 + i] / sp->final_cap);
    }
}
