/* runtime/model/weights.c — a checkpoint's tensors into the model: layouts, tensor-parallel slices, experts, checks at load (the parts: model_internal.h). */
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

/* ---------------------------------------------------------------- loading */


/* The file's name of HF tensor `name` (buf: room for it). */
static const char *src_name(const source *src, const char *name, char *buf, size_t cap)
{
    if (src->g || src->wrap == 0 || (src->wrap == 2 && strncmp(name, "model.", 6) != 0)) return name;
    if (src->wrap == 1) snprintf(buf, cap, "language_model.%s", name);
    else snprintf(buf, cap, "model.language_model.%s", name + 6);
    return buf;
}

/* Whether file tensor `name` belongs to the language model (not a multimodal checkpoint's vision parts). */
static int src_language(const source *src, const char *name)
{
    if (src->g || src->wrap == 0) return 1;
    if (src->wrap == 1) return strncmp(name, "language_model.", 15) == 0;
    return strncmp(name, "model.language_model.", 21) == 0 || strcmp(name, "lm_head.weight") == 0;
}

static int64_t src_count(const source *src)
{
    return src->g ? kvp_gguf_num_tensors(src->g) : kvp_st_num_tensors(src->s);
}

static void src_at(const source *src, int64_t i, kvp_tensor_view *v)
{
    if (src->g) kvp_gguf_tensor_at(src->g, i, v);
    else kvp_st_tensor_at(src->s, i, v);
}

/* Finds tensor `name` and marks it used (see check_all_used). */
static kvp_status src_get(const source *src, const char *hf_name, kvp_tensor_view *v)
{
    char buf[320];
    const char *name = src_name(src, hf_name, buf, sizeof buf);
    KVP_TRY(src->g ? kvp_gguf_tensor(src->g, name, v) : kvp_st_tensor(src->s, name, v));
    if (src->used)
        for (int64_t i = 0, n = src_count(src); i < n; i++) {
            kvp_tensor_view w;
            src_at(src, i, &w);
            if (strcmp(w.name, name) == 0) {
                src->used[i] = 1;
                break;
            }
        }
    return KVP_OK;
}

static int src_has(const source *src, const char *name)
{
    kvp_tensor_view v;
    if (src->g) {
        kvp_status st = kvp_gguf_tensor(src->g, name, &v);
        kvp_error_clear();
        return st == KVP_OK;
    }
    char buf[320];
    return kvp_st_has(src->s, src_name(src, name, buf, sizeof buf));
}

/* Finds tensor `name` (marking it used) and checks it has exactly shape ([e,] d0[, d1]): e > 0 for the
 * experts' matrices GGUF stacks in one tensor, d1 0 for a vector. */
static kvp_status get_shaped(const source *src, const char *name, int64_t e, int64_t d0, int64_t d1,
                             kvp_tensor_view *v)
{
    KVP_TRY(src_get(src, name, v));
    const int64_t all[3] = {e, d0, d1};
    int64_t want[3];
    int nd = 0, ok;
    for (int i = 0; i < 3; i++)
        if (all[i] > 0 || i == 1) want[nd++] = all[i];
    ok = v->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = v->shape[i] == want[i];
    if (ok) return KVP_OK;
    /* A 1-D weight stored as [1, n] or an [n] matrix row is still accepted only when exact; keep strict. */
    char got[96] = "", need[96] = "";
    for (int i = 0, at = 0; i < v->ndim; i++)
        at += snprintf(got + at, sizeof got - (size_t)at, "%s%lld", i ? ", " : "", (long long)v->shape[i]);
    for (int i = 0, at = 0; i < nd; i++)
        at += snprintf(need + at, sizeof need - (size_t)at, "%s%lld", i ? ", " : "", (long long)want[i]);
    return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' has shape [%s], the config needs [%s]", v->file, name, got, need);
}

/* Matrix e of a checked [E, d0, d1] tensor, as a [d0, d1] view (whole blocks: GGUF rows are). */
static kvp_tensor_view expert_slice(const kvp_tensor_view *all, int64_t e)
{
    kvp_tensor_view v = *all;
    const int64_t E = all->shape[0];
    v.ndim = 2;
    v.shape[0] = all->shape[1];
    v.shape[1] = all->shape[2];
    v.numel = all->numel / E;
    v.nbytes = all->nbytes / (size_t)E;
    v.data = (const unsigned char *)all->data + (size_t)e * v.nbytes;
    return v;
}

/* Rows [r0, r0 + nr) of a checked tensor (a vector: elements) as freshly allocated f32. Only those rows are
 * converted (a matrix row is whole blocks in every stored type; a vector of blocks is converted whole). */
static kvp_status rows_f32(const kvp_tensor_view *v, const char *name, int64_t r0, int64_t nr, float **out)
{
    const int whole = v->ndim == 1 && kvp_wtype_block(v->dtype) > 1 && nr != v->shape[0];
    const int64_t cols = v->ndim == 2 ? v->shape[1] : 1;
    kvp_tensor_view part = *v;
    if (!whole) {
        part.data = (const unsigned char *)v->data + (size_t)r0 * (v->nbytes / (size_t)v->shape[0]);
        part.numel = nr * cols;
    }
    float *p = kvp_aligned_alloc(64, (size_t)(part.numel > 0 ? part.numel : 1) * sizeof(float));
    if (!p) return KVP_ERR(KVP_ENOMEM, "%s: out of memory for tensor '%s'", v->file, name);
    kvp_tensor_to_f32(&part, p);
    if (whole) memmove(p, p + r0, (size_t)nr * sizeof(float));
    *out = p;
    return KVP_OK;
}

/* Loads tensor `name` of exactly shape (d0[, d1]) as freshly allocated f32. */
static kvp_status load_t(const source *src, const char *name, int64_t d0, int64_t d1, float **out)
{
    kvp_tensor_view v;
    KVP_TRY(get_shaped(src, name, 0, d0, d1, &v));
    return rows_f32(&v, name, 0, d0, out);
}

/* An RMSNorm weight vector (n): as stored, or 1 + weight for an HF gemma checkpoint (its norms multiply by 1 +
 * weight; a GGUF stores the sum already), so every norm multiplies by the vector it holds. */
static kvp_status load_norm(const kvp_model *m, const source *src, const char *name, int64_t n, float **out)
{
    KVP_TRY(load_t(src, name, n, 0, out));
    for (int64_t j = 0; m->cfg.family == KVP_FAMILY_GEMMA2 && !src->g && j < n; j++) (*out)[j] += 1.0f;
    return KVP_OK;
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of checked tensor v (a vector: nc ignored): this rank's
 * shard (or one part of a fused matrix), freshly allocated. */
static kvp_status part_f32(const kvp_tensor_view *v, const char *name, int64_t r0, int64_t nr, int64_t c0,
                           int64_t nc, float **out)
{
    float *w;
    KVP_TRY(rows_f32(v, name, r0, nr, &w));
    const int64_t cols = v->ndim == 2 ? v->shape[1] : 1;
    if (v->ndim == 1 || nc == cols) {
        *out = w;
        return KVP_OK;
    }
    float *p = kvp_aligned_alloc(64, (size_t)(nr * nc) * sizeof(float));
    if (!p) {
        kvp_free(w);
        return KVP_ERR(KVP_ENOMEM, "out of memory for tensor '%s'", name);
    }
    for (int64_t r = 0; r < nr; r++) memcpy(p + r * nc, w + r * cols + c0, (size_t)nc * sizeof(float));
    kvp_free(w);
    *out = p;
    return KVP_OK;
}

/* part_f32 of tensor `name` of shape (d0, d1) (d1 = 0: a vector). */
static kvp_status load_part(const source *src, const char *name, int64_t d0, int64_t d1, int64_t r0, int64_t nr,
                            int64_t c0, int64_t nc, float **out)
{
    kvp_tensor_view v;
    KVP_TRY(get_shaped(src, name, 0, d0, d1, &v));
    return part_f32(&v, name, r0, nr, c0, nc, out);
}

/* Bytes of one panel of a K-input matrix in type dt. */
size_t mdl_panel_bytes(kvp_weight_type dt, int64_t K)
{
    if (dt == KVP_WEIGHT_Q8_0) return (size_t)(K / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
    return (size_t)(K * KVP_MM_PANEL) * (dt == KVP_WEIGHT_F32 ? sizeof(float) : sizeof(uint16_t));
}

/* Quantizes w[o][k0 .. k0 + 32) of the panel's 16 outputs (rows past out_f: zero) into one Q8_0 block, as
 * ggml's quantize_row_q8_0_ref does: d = amax / 127 kept as f16, q = round(x / d). */
static void q8_block(const float *w, int64_t in_f, int64_t o0, int64_t out_f, int64_t k0, unsigned char *blk)
{
    float *d = (float *)blk;
    int8_t *q = (int8_t *)(blk + KVP_MM_PANEL * sizeof(float));
    for (int j = 0; j < KVP_MM_PANEL; j++) {
        const float *x = o0 + j < out_f ? w + (o0 + j) * in_f + k0 : NULL;
        float amax = 0.0f;
        for (int k = 0; x && k < KVP_Q8_BLOCK; k++) amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        const float dj = amax / 127.0f, id = dj != 0.0f ? 1.0f / dj : 0.0f;
        d[j] = kvp_f16_to_f32(kvp_f32_to_f16(dj));
        for (int k = 0; k < KVP_Q8_BLOCK; k++) q[k * KVP_MM_PANEL + j] = x ? (int8_t)roundf(x[k] * id) : 0;
    }
}

/* The held type `auto` gives a tensor stored as wt (see kvp_weight_type). GGUF's other quantized types
 * (Q4_0 .. Q6_K) are held as q8_0, the held type closest to their size: its rounding, about 1/254 of a
 * block's largest weight, is small beside theirs. */
static kvp_weight_type held_as_stored(kvp_wtype wt)
{
    switch (wt) {
    case KVP_WT_F32: return KVP_WEIGHT_F32;
    case KVP_WT_F16: return KVP_WEIGHT_F16;
    case KVP_WT_BF16: return KVP_WEIGHT_BF16;
    default: return KVP_WEIGHT_Q8_0;
    }
}

/* Packs outputs [o0, o0 + no) and inputs [i0, i0 + ni) of checked [out, in] matrix v into panels (mat_w) of
 * type dt (f16 / bf16 rounded to nearest even; Q8_0 only when the inputs are a multiple of 32, else f32). */
static kvp_status mat_of(const kvp_tensor_view *v, const char *name, int64_t o0, int64_t no, int64_t i0, int64_t ni,
                         kvp_weight_type dt, mat_w *out)
{
    if (dt == KVP_WEIGHT_AUTO) dt = held_as_stored(v->dtype);
    float *w;
    KVP_TRY(part_f32(v, name, o0, no, i0, ni, &w));
    const int64_t out_f = no, in_f = ni;
    const int64_t np = (out_f + KVP_MM_PANEL - 1) / KVP_MM_PANEL;
    if (dt == KVP_WEIGHT_Q8_0 && in_f % KVP_Q8_BLOCK != 0) dt = KVP_WEIGHT_F32;
    const size_t pb = mdl_panel_bytes(dt, in_f);
    unsigned char *p = kvp_aligned_alloc(64, (size_t)np * pb);
    if (!p) {
        kvp_free(w);
        return KVP_ERR(KVP_ENOMEM, "out of memory for tensor '%s'", name);
    }
    for (int64_t pi = 0; pi < np; pi++) {
        if (dt == KVP_WEIGHT_Q8_0) {
            for (int64_t kb = 0; kb < in_f / KVP_Q8_BLOCK; kb++)
                q8_block(w, in_f, pi * KVP_MM_PANEL, out_f, kb * KVP_Q8_BLOCK, p + pi * pb + kb * KVP_Q8_BLOCK_BYTES);
            continue;
        }
        for (int64_t k = 0; k < in_f; k++)
            for (int64_t j = 0; j < KVP_MM_PANEL; j++) {
                const int64_t o = pi * KVP_MM_PANEL + j, at = (pi * in_f + k) * KVP_MM_PANEL + j;
                const float x = o < out_f ? w[o * in_f + k] : 0.0f;
                if (dt == KVP_WEIGHT_F32) ((float *)p)[at] = x;
                else ((uint16_t *)p)[at] = dt == KVP_WEIGHT_F16 ? kvp_f32_to_f16(x) : kvp_f32_to_bf16(x);
            }
    }
    kvp_free(w);
    *out = (mat_w){.p = p, .t = NULL, .K = in_f, .N = out_f, .dt = dt};
    return KVP_OK;
}

/* mat_of of tensor `name`, an [out_full, in_full] matrix. */
static kvp_status load_mat(const source *src, const char *name, int64_t out_full, int64_t in_full, int64_t o0,
                           int64_t no, int64_t i0, int64_t ni, kvp_weight_type dt, mat_w *out)
{
    kvp_tensor_view v;
    KVP_TRY(get_shaped(src, name, 0, out_full, in_full, &v));
    return mat_of(&v, name, o0, no, i0, ni, dt, out);
}

/* W[o][k] as f32, read from the panels (the layouts above). */
float mdl_mat_at(const mat_w *w, int64_t o, int64_t k)
{
    const unsigned char *pan = (const unsigned char *)w->p + (size_t)(o / KVP_MM_PANEL) * mdl_panel_bytes(w->dt, w->K);
    const int64_t j = o % KVP_MM_PANEL;
    if (w->dt == KVP_WEIGHT_Q8_0) {
        const unsigned char *blk = pan + (k / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
        const int8_t q = ((const int8_t *)(blk + KVP_MM_PANEL * sizeof(float)))[(k % KVP_Q8_BLOCK) * KVP_MM_PANEL + j];
        return ((const float *)blk)[j] * (float)q;
    }
    if (w->dt == KVP_WEIGHT_F32) return ((const float *)pan)[k * KVP_MM_PANEL + j];
    const uint16_t h = ((const uint16_t *)pan)[k * KVP_MM_PANEL + j];
    return w->dt == KVP_WEIGHT_F16 ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
}

static void mat_free(mat_w *w)
{
    kvp_free(w->p);
    kvp_free(w->t);
    w->p = w->t = NULL;
}

/* Makes w->t (K, N) from the panels when it is missing (first BLAS use). */
kvp_status mdl_mat_need_t(mat_w *w)
{
    if (w->t) return KVP_OK;
    float *t = kvp_aligned_alloc(64, (size_t)(w->K * w->N) * sizeof(float));
    if (!t) return KVP_ERR(KVP_ENOMEM, "forward: out of memory for the BLAS copy of a %lld x %lld weight",
                           (long long)w->N, (long long)w->K);
    for (int64_t k = 0; k < w->K; k++)
        for (int64_t o = 0; o < w->N; o++)
            t[k * w->N + o] = mdl_mat_at(w, o, k);
    w->t = t;
    return KVP_OK;
}

enum { KVP_LAYER_MATS = 7 };

/* Matrix i < mdl_layer_nmats(w) of layer w: the seven of a dense layer (an MoE layer's dense FFN is empty, p
 * NULL), then the experts'. */
int64_t mdl_layer_nmats(const layer_w *w) { return KVP_LAYER_MATS + 3 * (int64_t)w->n_experts; }
mat_w *mdl_layer_mat(layer_w *w, int64_t i)
{
    mat_w *fixed[KVP_LAYER_MATS] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return i < KVP_LAYER_MATS ? fixed[i] : &w->experts[i - KVP_LAYER_MATS];
}

/* The type every matrix is held in, or KVP_WEIGHT_AUTO when they differ. */
kvp_weight_type mdl_held_type(kvp_model *m)
{
    kvp_weight_type t = m->lm_head.dt;
    for (int32_t l = 0; l < m->cfg.num_layers; l++)
        for (int64_t i = 0; i < mdl_layer_nmats(&m->layers[l]); i++) {
            const mat_w *w = mdl_layer_mat(&m->layers[l], i);
            if (w->p && w->dt != t) return KVP_WEIGHT_AUTO;
        }
    return t;
}

static void free_weights(kvp_model *m)
{
    if (m->layers)
        for (int32_t l = 0; l < m->cfg.num_layers; l++) {
            layer_w *w = &m->layers[l];
            float *ps[] = {w->attn_norm, w->bq,       w->bk,           w->bv,           w->bo,
                           w->q_norm,    w->k_norm, w->ffn_norm, w->post_attn_norm, w->post_ffn_norm, w->router};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_free(ps[i]);
            for (int64_t i = 0; i < mdl_layer_nmats(w); i++) mat_free(mdl_layer_mat(w, i));
            kvp_free(w->experts);
        }
    kvp_free(m->layers);
    mat_free(&m->lm_head);
    kvp_free(m->embed);
    kvp_free(m->out_norm);
    kvp_free(m->inv_freq);
    kvp_free(m->inv_freq_local);
    kvp_free(m->freq_div);
    for (int g = 0; g < KVP_FWD_MAX_GROUPS; g++) {
        kvp_free(m->ws[g].f);
        kvp_free(m->ws[g].i);
    }
    kvp_free(m->sub);
}

void kvp_model_destroy(kvp_model *m)
{
    if (!m) return;
    mdl_pool_destroy(&m->pool);
    free_weights(m);
    kvp_free(m);
}


/* Layer l's router and experts: HF's one matrix per expert (mixtral's block_sparse_moe.experts.e.w1 = gate,
 * w3 = up, w2 = down; qwen3_moe's mlp.experts.e.gate_proj, up_proj, down_proj) or GGUF's ffn_gate_exps,
 * ffn_up_exps, ffn_down_exps, each [E, rows, cols] with every expert's matrix. This rank keeps its rows of
 * every gate and up, its columns of every down. */
static kvp_status load_experts(kvp_model *m, const source *src, int32_t l, layer_w *w)
{
    const kvp_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, E = c->num_experts, MF = c->moe_intermediate_size;
    const int g = src->g != NULL, mixtral = !strcmp(c->model_type, "mixtral");
    const char *blk = mixtral ? "block_sparse_moe" : "mlp";
    char n[256];
    if (g) snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", l);
    else snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", l, blk);
    KVP_TRY(load_t(src, n, E, H, &w->router));
    w->experts = kvp_calloc((size_t)(3 * E), sizeof *w->experts);
    if (!w->experts) return KVP_ERR(KVP_ENOMEM, "%s: out of memory for %lld experts", src->what, (long long)E);
    w->n_experts = (int32_t)E;
    static const char *const gg[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    static const char *const hf[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    for (int j = 0; j < 3; j++) {
        const int down = j == 2;
        const int64_t rows = down ? H : MF, cols = down ? MF : H;
        kvp_tensor_view all, v;
        if (g) {
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, gg[j]);
            KVP_TRY(get_shaped(src, n, E, rows, cols, &all));
        }
        for (int64_t e = 0; e < E; e++) {
            if (g) {
                v = expert_slice(&all, e);
            } else {
                snprintf(n, sizeof n, "model.layers.%d.%s.experts.%lld.%s.weight", l, blk, (long long)e, hf[mixtral][j]);
                KVP_TRY(get_shaped(src, n, 0, rows, cols, &v));
            }
            KVP_TRY(mat_of(&v, n, down ? 0 : m->mff0, down ? H : m->mnff, down ? m->mff0 : 0, down ? m->mnff : H,
                           m->wtype, &w->experts[3 * e + j]));
        }
    }
    return KVP_OK;
}

static kvp_status load_tensors(kvp_model *m, const source *src)
{
    const kvp_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim, nq = c->num_q_heads, nkv = c->num_kv_heads;
    const int64_t FF = c->intermediate_size, V = c->vocab_size;
    /* this rank's shard (parallel/shard.h): rows of the column-parallel matrices, columns of the
     * row-parallel ones, vocabulary rows of the embedding and LM head */
    const kvp_tp_shard *t = &m->tp;
    const int64_t q0 = t->q0 * hd, nqd = t->nq * hd, k0 = t->kv0 * hd, nkd = t->nkv * hd;
    const int g = src->g != NULL;
    const kvp_weight_type wd = m->wtype;
    char n[256];
    const char *emb = g ? "token_embd.weight" : "model.embed_tokens.weight";
    KVP_TRY(load_part(src, emb, V, H, t->v0, t->nv, 0, H, &m->embed));
    KVP_TRY(load_norm(m, src, g ? "output_norm.weight" : "model.norm.weight", H, &m->out_norm));
    const char *lm = g ? "output.weight" : "lm_head.weight";
    if (c->tie_word_embeddings && !src_has(src, lm)) lm = emb;
    KVP_TRY(load_mat(src, lm, V, H, t->v0, t->nv, 0, H, wd, &m->lm_head));
    if (g && src_has(src, "rope_freqs.weight")) {
        /* llama.cpp's form of llama3 rope scaling: one divisor per frequency, theta_i = pos * inv_freq_i /
         * factor_i (what a llama3 rope_scaling computes from config.json in an HF folder; GGUF's rope.scaling
         * keys have no llama3 type, and linear or yarn scaling composes with these divisors as in llama.cpp) */
        KVP_TRY(load_t(src, "rope_freqs.weight", m->rot / 2, 0, &m->freq_div));
        for (int64_t i = 0; i < m->rot / 2; i++)
            if (!(m->freq_div[i] > 0 && isfinite(m->freq_div[i])))
                return KVP_ERR(KVP_EPARSE, "%s: rope_freqs.weight[%lld] = %g is not a positive factor", src->what,
                               (long long)i, m->freq_div[i]);
        mdl_set_rope(m);
    }
    /* LongRoPE's factors: the GGUF reader took them into the config (kvp_gguf_model_config); used here */
    for (int i = 0; g && i < 2 && !strcmp(c->rope_scaling_type, "longrope"); i++) {
        kvp_tensor_view v;
        KVP_TRY(src_get(src, i ? "rope_factors_short.weight" : "rope_factors_long.weight", &v));
    }
    m->layers = kvp_calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", src->what);
    for (int32_t l = 0; l < c->num_layers; l++) {
        layer_w *w = &m->layers[l];
#define NAME(gg, hf) (snprintf(n, sizeof n, g ? "blk.%d." gg : "model.layers.%d." hf, l), n)
        KVP_TRY(load_norm(m, src, NAME("attn_norm.weight", "input_layernorm.weight"), H, &w->attn_norm));
        if (c->family == KVP_FAMILY_PHI3 && src_has(src, NAME("attn_qkv.weight", "self_attn.qkv_proj.weight"))) {
            /* phi3's fused projection: the q rows, then k's, then v's */
            const int64_t rows = (nq + 2 * nkv) * hd;
            KVP_TRY(load_mat(src, n, rows, H, q0, nqd, 0, H, wd, &w->wq));
            KVP_TRY(load_mat(src, n, rows, H, nq * hd + k0, nkd, 0, H, wd, &w->wk));
            KVP_TRY(load_mat(src, n, rows, H, (nq + nkv) * hd + k0, nkd, 0, H, wd, &w->wv));
        } else {
            KVP_TRY(load_mat(src, NAME("attn_q.weight", "self_attn.q_proj.weight"), nq * hd, H, q0, nqd, 0, H, wd,
                             &w->wq));
            KVP_TRY(load_mat(src, NAME("attn_k.weight", "self_attn.k_proj.weight"), nkv * hd, H, k0, nkd, 0, H, wd,
                             &w->wk));
            KVP_TRY(load_mat(src, NAME("attn_v.weight", "self_attn.v_proj.weight"), nkv * hd, H, k0, nkd, 0, H, wd,
                             &w->wv));
        }
        KVP_TRY(load_mat(src, NAME("attn_output.weight", "self_attn.o_proj.weight"), H, nq * hd, 0, H, q0, nqd, wd,
                         &w->wo));
        if (c->attention_bias) {
            KVP_TRY(load_part(src, NAME("attn_q.bias", "self_attn.q_proj.bias"), nq * hd, 0, q0, nqd, 0, 0, &w->bq));
            KVP_TRY(load_part(src, NAME("attn_k.bias", "self_attn.k_proj.bias"), nkv * hd, 0, k0, nkd, 0, 0, &w->bk));
            KVP_TRY(load_part(src, NAME("attn_v.bias", "self_attn.v_proj.bias"), nkv * hd, 0, k0, nkd, 0, 0, &w->bv));
            if (src_has(src, NAME("attn_output.bias", "self_attn.o_proj.bias")))
                KVP_TRY(load_t(src, NAME("attn_output.bias", "self_attn.o_proj.bias"), H, 0, &w->bo));
        }
        if (c->qk_norm) {
            KVP_TRY(load_norm(m, src, NAME("attn_q_norm.weight", "self_attn.q_norm.weight"), hd, &w->q_norm));
            KVP_TRY(load_norm(m, src, NAME("attn_k_norm.weight", "self_attn.k_norm.weight"), hd, &w->k_norm));
        }
        if (c->post_norms) { /* four norms: around the attention, and around the FFN (HF: pre_feedforward_layernorm) */
            KVP_TRY(load_norm(m, src, NAME("post_attention_norm.weight", "post_attention_layernorm.weight"), H,
                              &w->post_attn_norm));
            KVP_TRY(load_norm(m, src, NAME("ffn_norm.weight", "pre_feedforward_layernorm.weight"), H, &w->ffn_norm));
            KVP_TRY(load_norm(m, src, NAME("post_ffw_norm.weight", "post_feedforward_layernorm.weight"), H,
                              &w->post_ffn_norm));
        } else {
            KVP_TRY(load_norm(m, src, NAME("ffn_norm.weight", "post_attention_layernorm.weight"), H, &w->ffn_norm));
        }
        if (c->family == KVP_FAMILY_MIXTRAL && c->layer_is_moe[l]) {
            KVP_TRY(load_experts(m, src, l, w));
        } else if (c->family == KVP_FAMILY_PHI3) { /* gate and up fused: the gate rows, then up's */
            NAME("ffn_up.weight", "mlp.gate_up_proj.weight");
            KVP_TRY(load_mat(src, n, 2 * FF, H, t->ff0, t->nff, 0, H, wd, &w->w_gate));
            KVP_TRY(load_mat(src, n, 2 * FF, H, FF + t->ff0, t->nff, 0, H, wd, &w->w_up));
        } else {
            KVP_TRY(load_mat(src, NAME("ffn_gate.weight", "mlp.gate_proj.weight"), FF, H, t->ff0, t->nff, 0, H, wd,
                             &w->w_gate));
            KVP_TRY(load_mat(src, NAME("ffn_up.weight", "mlp.up_proj.weight"), FF, H, t->ff0, t->nff, 0, H, wd,
                             &w->w_up));
        }
        if (!w->n_experts)
            KVP_TRY(load_mat(src, NAME("ffn_down.weight", "mlp.down_proj.weight"), H, FF, 0, H, t->ff0, t->nff, wd,
                             &w->w_down));
#undef NAME
        w->window_left = -1;
        if (c->sliding_window > 0 && c->layer_is_sliding[l])
            w->window_left = (int32_t)(c->sliding_window > INT32_MAX ? INT32_MAX : c->sliding_window - 1);
    }
    return KVP_OK;
}

/* A tensor the loader did not read means the config and the weights disagree (a checkpoint with more
 * layers than num_hidden_layers / block_count, biases the config does not ask for, ...): running would
 * silently compute another model. HF's rotary_emb.inv_freq buffers are recomputed from rope_theta. */
static kvp_status check_all_used(const kvp_model *m, const source *src)
{
    static const char inv_freq[] = ".rotary_emb.inv_freq";
    const size_t nif = sizeof inv_freq - 1;
    int64_t first = -1, unused = 0;
    for (int64_t i = 0, n = src_count(src); i < n; i++) {
        if (src->used[i]) continue;
        kvp_tensor_view v;
        src_at(src, i, &v);
        if (!src_language(src, v.name)) continue;
        size_t len = strlen(v.name);
        if (!src->g && len > nif && strcmp(v.name + len - nif, inv_freq) == 0) continue;
        if (first < 0) first = i;
        unused++;
    }
    if (first < 0) return KVP_OK;
    kvp_tensor_view v;
    src_at(src, first, &v);
    return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' is not used by a %d-layer %s (%lld unused tensors: %s and the "
                               "weights disagree)",
                   v.file, v.name, m->cfg.num_layers, m->cfg.model_type, (long long)unused,
                   src->g ? "GGUF metadata" : "config.json");
}

/* Loads every weight the config names, then checks that no tensor of the file was left over. */
kvp_status mdl_load_weights(kvp_model *m, const source *src)
{
    source s = *src;
    int64_t n = src_count(src);
    s.used = kvp_calloc((size_t)(n > 0 ? n : 1), 1);
    if (!s.used) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", src->what);
    kvp_status st = load_tensors(m, &s);
    if (st == KVP_OK) st = check_all_used(m, &s);
    kvp_free(s.used);
    return st;
}

/* Checks the config describes a model this forward pass computes. cfg_file: the file holding the config
 * (config.json, or the GGUF when gguf), named in every error (with the field, for a single field). */
kvp_status mdl_check_config(const kvp_model_config *c, const char *cfg_file, int gguf)
{
    const char *mt = c->model_type;
    if (!mt[0])
        return KVP_ERR(KVP_EPARSE, "%s: no model type (\"model_type\": llama, mistral, qwen2, qwen3, phi3, mixtral, "
                                   "qwen3_moe, gemma, gemma2 or gemma3_text)", cfg_file);
    const int llama_like = !strcmp(mt, "llama") || !strcmp(mt, "mistral"); /* GGUF's Mixtral is arch llama */
    const int dense = llama_like || !strcmp(mt, "qwen2") || !strcmp(mt, "qwen3");
    const int moe = (gguf && llama_like) || !strcmp(mt, "mixtral") || !strcmp(mt, "qwen3_moe") ||
                    !strcmp(mt, "qwen3moe");
    const int gemma = !strcmp(mt, "gemma") || !strcmp(mt, "gemma2") || !strcmp(mt, "gemma3_text") ||
                      !strcmp(mt, "gemma3"); /* GGUF's arch */
    if (!(c->family == KVP_FAMILY_PHI3 && !strcmp(mt, "phi3")) && !(c->family == KVP_FAMILY_LLAMA && dense) &&
        !(c->family == KVP_FAMILY_MIXTRAL && moe) && !(c->family == KVP_FAMILY_GEMMA2 && gemma))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: model type '%s' is not supported by the CPU forward pass "
                                         "(llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3_moe, gemma, gemma2, "
                                         "gemma3_text are)",
                       cfg_file, mt);
    if (c->num_layers < 1 || c->hidden_size < 1 || c->num_q_heads < 1 || c->num_kv_heads < 1 || c->head_dim < 2 ||
        c->head_dim % 2 || c->intermediate_size < 1 || c->vocab_size < 1 || c->num_q_heads % c->num_kv_heads ||
        c->vocab_size > INT32_MAX)
        return KVP_ERR(KVP_EPARSE, "%s: inconsistent sizes (layers %d, hidden %d, heads %d/%d, head_dim %d, "
                                   "intermediate %lld, vocab %lld)",
                       cfg_file, c->num_layers, c->hidden_size, c->num_q_heads, c->num_kv_heads, c->head_dim,
                       (long long)c->intermediate_size, (long long)c->vocab_size);
    if (!kvp_attn_supported(KVP_DTYPE_F32, c->head_dim))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: head_dim %d is not supported by the attention kernels", cfg_file,
                       c->head_dim);
    const int32_t rot = kvp_rotary_dim(c);
    if (rot < 2 || rot % 2 || rot > c->head_dim)
        return KVP_ERR(KVP_EPARSE, "%s: %s gives %d rotary dimensions of %d: they must be even and at least 2",
                       cfg_file, gguf ? "rope.dimension_count" : "\"partial_rotary_factor\"", rot, c->head_dim);
    const char *rt = c->rope_scaling_type;
    if (rt[0] && strcmp(rt, "llama3") && strcmp(rt, "default") && strcmp(rt, "linear") && strcmp(rt, "dynamic") &&
        strcmp(rt, "yarn") && strcmp(rt, "longrope"))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: rope_scaling type '%s' is not supported (linear, dynamic, llama3, "
                       "yarn and longrope are)", cfg_file, rt);
    if (!strcmp(rt, "longrope")) {
        /* as the file spells the fields: config.json's rope_scaling, or GGUF's factor tensors and keys */
        const char *names[2] = {gguf ? "tensor rope_factors_long.weight" : "rope_scaling \"long_factor\"",
                                gguf ? "tensor rope_factors_short.weight" : "rope_scaling \"short_factor\""};
        if (c->rope_n_factors != rot / 2)
            return KVP_ERR(KVP_EPARSE, "%s: %s has %d factors; %d rotary dimensions need %d", cfg_file, names[0],
                           c->rope_n_factors, rot, rot / 2);
        for (int sh = 0; sh < 2; sh++)
            for (int32_t i = 0; i < c->rope_n_factors; i++) {
                const double f = (sh ? c->rope_short_factor : c->rope_long_factor)[i];
                if (!(f > 0 && isfinite(f)))
                    return KVP_ERR(KVP_EPARSE, "%s: %s[%d] = %g is not a positive factor", cfg_file, names[sh], i, f);
            }
        if (c->rope_original_max_position < 1)
            return KVP_ERR(KVP_EPARSE, "%s: longrope needs the original context (%s)", cfg_file,
                           gguf ? "rope.scaling.original_context_length" : "\"original_max_position_embeddings\"");
        if (!(c->rope_attention_factor >= 0 && c->rope_long_mscale >= 0 && c->rope_short_mscale >= 0 &&
              isfinite(c->rope_attention_factor + c->rope_long_mscale + c->rope_short_mscale)))
            return KVP_ERR(KVP_EPARSE, "%s: rope_scaling: attention_factor %g, long_mscale %g and short_mscale %g "
                           "must be finite and >= 0", cfg_file, c->rope_attention_factor, c->rope_long_mscale,
                           c->rope_short_mscale);
    }
    if (!strcmp(rt, "linear") || !strcmp(rt, "dynamic") || !strcmp(rt, "yarn")) {
        /* as the file spells the fields: config.json's rope_scaling object, or GGUF's rope.scaling keys */
        char key[160];
        snprintf(key, sizeof key, gguf ? "%s.rope.scaling.factor" : "rope_scaling.factor", mt);
        if (!(c->rope_scaling_factor >= 1 && isfinite(c->rope_scaling_factor)))
            return KVP_ERR(KVP_EPARSE, "%s: \"%s\": %g is out of range (a finite number >= 1)", cfg_file, key,
                           c->rope_scaling_factor);
        if (!(c->rope_beta_fast > 0 && c->rope_beta_slow > 0 && c->rope_attention_factor >= 0 &&
              c->rope_mscale >= 0 && c->rope_mscale_all_dim >= 0))
            return KVP_ERR(KVP_EPARSE, "%s: rope_scaling: beta_fast %g and beta_slow %g must be > 0, attention_factor "
                           "%g, mscale %g and mscale_all_dim %g >= 0", cfg_file, c->rope_beta_fast, c->rope_beta_slow,
                           c->rope_attention_factor, c->rope_mscale, c->rope_mscale_all_dim);
    }
    if (c->num_experts > 0 && c->family != KVP_FAMILY_MIXTRAL)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: %s with experts is not supported (mixtral and qwen3_moe are)",
                       cfg_file, mt);
    if (c->family == KVP_FAMILY_MIXTRAL) {
        if (c->num_experts < 1 || c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts ||
            c->moe_intermediate_size < 1)
            return KVP_ERR(KVP_EPARSE, "%s: %d experts, %d a token and %lld units an expert do not make a "
                           "mixture of experts", cfg_file, c->num_experts, c->num_experts_per_tok,
                           (long long)c->moe_intermediate_size);
        if (c->num_shared_experts > 0)
            return KVP_ERR(KVP_EUNSUPPORTED, "%s: shared experts are not supported", cfg_file);
    }
    /* Field names as the file spells them (the GGUF reader checks these too, under the same names). */
    char eps_key[128] = "rms_norm_eps", theta_key[128] = "rope_theta";
    if (gguf) {
        snprintf(eps_key, sizeof eps_key, "%s.attention.layer_norm_rms_epsilon", mt);
        snprintf(theta_key, sizeof theta_key, "%s.rope.freq_base", mt);
    }
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps <= 1)) /* NaN fails too */
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\": %g is out of range (0, 1]", cfg_file, eps_key, c->rms_norm_eps);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\": %g is out of range (a positive finite number)", cfg_file, theta_key,
                       c->rope_theta);
    for (int i = 0; i <= c->n_eos; i++) {
        const int64_t id = i == 0 ? c->bos_token_id : c->eos_token_ids[i - 1];
        if (id >= c->vocab_size)
            return KVP_ERR(KVP_EPARSE, "%s: \"%s%s_token_id\": %lld is outside the vocabulary (%lld tokens)", cfg_file,
                           gguf ? "tokenizer.ggml." : "", i ? "eos" : "bos", (long long)id, (long long)c->vocab_size);
    }
    return KVP_OK;
}

/* generation_config.json beside config.json (when there is one): its eos_token_id ids end generation too, as
 * in transformers and vLLM (Llama-3-Instruct lists <|eot_id|> there), and its sampling defaults. */
kvp_status mdl_generation_config(const char *cfgpath, kvp_model_config *c)
{
    char path[1200];
    const char *slash = strrchr(cfgpath, '/');
    snprintf(path, sizeof path, "%.*sgeneration_config.json", slash ? (int)(slash - cfgpath + 1) : 0, cfgpath);
    struct stat sb;
    if (stat(path, &sb) != 0) return KVP_OK;
    cJSON *j;
    KVP_TRY(kvp_json_parse_file(path, &j));
    kvp_status st = kvp_model_config_eos(j, path, c);
    if (st == KVP_OK) st = kvp_model_config_sampling(j, path, c);
    cJSON_Delete(j);
    return st;
}

