/* runtime/model/model_export.c — a loaded model's tensors in plain layouts (contract: model_export.h). */
#include "runtime/model/model_export.h"

#include <math.h>

#include "runtime/model/model_internal.h"

kvp_status kvp_model_export_check(const kvp_model *m)
{
    for (int32_t l = 0; l < m->cfg.num_layers; l++) {
        const layer_w *w = &m->layers[l];
        if (w->n_experts && (m->cfg.num_shared_experts > 0 || !w->router || !w->experts))
            return KVP_ERR(KVP_EUNSUPPORTED, "%s: layer %d is a mixture of experts with shared experts: only routed "
                                             "experts (mixtral, qwen3_moe) are exported", m->path, l);
    }
    return KVP_OK;
}

void kvp_model_shard(const kvp_model *m, kvp_tp_shard *out) { *out = m->tp; }

/* The panel matrix of (layer, id), or NULL. */
static const mat_w *mat_of(const kvp_model *m, int32_t layer, kvp_mat_id id)
{
    if (id == KVP_MAT_LM_HEAD) return &m->lm_head;
    if (layer < 0 || layer >= m->cfg.num_layers || id < KVP_MAT_Q || id > KVP_MAT_DOWN) return NULL;
    const layer_w *w = &m->layers[layer];
    const mat_w *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return all[id];
}

/* w's values, row-major f32 (N, K). */
static kvp_status widen(const mat_w *w, float *out)
{
    for (int64_t o = 0; o < w->N; o++)
        for (int64_t k = 0; k < w->K; k++) out[o * w->K + k] = mdl_mat_at(w, o, k);
    return KVP_OK;
}

void kvp_model_matrix_shape(const kvp_model *m, int32_t layer, kvp_mat_id id, int64_t *N, int64_t *K)
{
    const mat_w *w = mat_of(m, layer, id);
    *N = w ? w->N : 0;
    *K = w ? w->K : 0;
}

kvp_status kvp_model_matrix_f32(const kvp_model *m, int32_t layer, kvp_mat_id id, float *out)
{
    const mat_w *w = mat_of(m, layer, id);
    if (!w || !w->p) return KVP_ERR(KVP_EINVAL, "model export: no matrix %d in layer %d", (int)id, layer);
    return widen(w, out);
}

const float *kvp_model_router_f32(const kvp_model *m, int32_t layer)
{
    return layer >= 0 && layer < m->cfg.num_layers ? m->layers[layer].router : NULL;
}

/* Expert e's panel matrix id of MoE layer `layer`, or NULL. */
static const mat_w *expert_of(const kvp_model *m, int32_t layer, int32_t e, kvp_mat_id id)
{
    if (layer < 0 || layer >= m->cfg.num_layers || id < KVP_MAT_GATE || id > KVP_MAT_DOWN) return NULL;
    const layer_w *w = &m->layers[layer];
    return e >= 0 && e < w->n_experts && w->experts ? &w->experts[3 * e + (id - KVP_MAT_GATE)] : NULL;
}

void kvp_model_expert_matrix_shape(const kvp_model *m, int32_t layer, int32_t e, kvp_mat_id id, int64_t *N,
                                   int64_t *K)
{
    const mat_w *w = expert_of(m, layer, e, id);
    *N = w ? w->N : 0;
    *K = w ? w->K : 0;
}

kvp_status kvp_model_expert_matrix_f32(const kvp_model *m, int32_t layer, int32_t e, kvp_mat_id id, float *out)
{
    const mat_w *w = expert_of(m, layer, e, id);
    if (!w || !w->p) return KVP_ERR(KVP_EINVAL, "model export: no expert %d matrix %d in layer %d", e, (int)id, layer);
    return widen(w, out);
}

kvp_status kvp_model_layer_vecs_of(const kvp_model *m, int32_t layer, kvp_model_layer_vecs *out)
{
    if (layer < 0 || layer >= m->cfg.num_layers) return KVP_ERR(KVP_EINVAL, "model export: no layer %d", layer);
    const layer_w *w = &m->layers[layer];
    *out = (kvp_model_layer_vecs){.attn_norm = w->attn_norm, .ffn_norm = w->ffn_norm, .q_norm = w->q_norm,
                                  .k_norm = w->k_norm, .post_attn_norm = w->post_attn_norm,
                                  .post_ffn_norm = w->post_ffn_norm, .bq = w->bq, .bk = w->bk, .bv = w->bv,
                                  .bo = w->bo, .window_left = w->window_left, .n_experts = w->n_experts};
    return KVP_OK;
}

const float *kvp_model_embed_f32(const kvp_model *m) { return m->embed; }
const float *kvp_model_out_norm_f32(const kvp_model *m) { return m->out_norm; }

void kvp_model_rope_of(const kvp_model *m, kvp_model_rope *out)
{
    *out = (kvp_model_rope){.inv_freq = m->inv_freq, .inv_freq_local = m->inv_freq_local, .scale = m->rope_scale,
                            .rot = m->rot, .style = m->rope};
}

void kvp_model_rope_angles(const double *inv_freq, int32_t rot, double scale, int32_t pos, float *cs)
{
    for (int32_t i = 0; i < rot / 2; i++) { /* as mdl_rope_angles (rope.c) */
        const double a = (double)pos * inv_freq[i];
        cs[2 * i] = (float)(cos(a) * scale);
        cs[2 * i + 1] = (float)(sin(a) * scale);
    }
}
