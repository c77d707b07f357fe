/* runtime/model/forward.c — one batched forward pass over the paged KV cache (the parts: model_internal.h). */
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


/* ---------------------------------------------------------------- forward */

/* Everything a forward pass can reject, checked before anything is written. */
static kvp_status validate(const kvp_model *m, const kvp_kv_cache *kv, const kvp_fwd_batch *b)
{
    const kvp_model_config *c = &m->cfg;
    const int64_t T = b->num_tokens, V = c->vocab_size;
    if (b->num_seqs < 1 || T < 1 || !b->qo_indptr || b->qo_indptr[0] != 0 || b->qo_indptr[b->num_seqs] != T)
        return KVP_ERR(KVP_EINVAL, "forward: inconsistent batch (%d sequences, %lld tokens)", b->num_seqs,
                       (long long)T);
    if (kv->num_layers != c->num_layers || kv->layers[0].num_kv_heads != m->tp.nkv ||
        kv->layers[0].head_dim != c->head_dim)
        return KVP_ERR(KVP_EINVAL, "forward: the KV cache was made for another model");
    int32_t maxlen = kvp_model_max_len(m);
    for (int64_t t = 0; t < T; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= V)
            return KVP_ERR(KVP_EINVAL, "forward: token id %d at row %lld is outside the vocabulary (%lld)", b->tokens[t],
                           (long long)t, (long long)V);
        if (b->positions[t] < 0 || b->positions[t] >= maxlen)
            return KVP_ERR(KVP_EINVAL, "forward: position %d is past the model's context of %d tokens",
                           b->positions[t], maxlen);
        if (b->slot_mapping[t] < 0 || b->slot_mapping[t] >= (int64_t)kv->num_blocks * kv->block_size)
            return KVP_ERR(KVP_EINVAL, "forward: slot %lld of row %lld is outside the KV cache",
                           (long long)b->slot_mapping[t], (long long)t);
    }
    const int32_t bs = kv->block_size;
    if (!b->kv_indptr || b->kv_indptr[0] != 0)
        return KVP_ERR(KVP_EINVAL, "forward: kv_indptr must start at 0");
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t nqs = b->qo_indptr[s + 1] - b->qo_indptr[s], pages = b->kv_indptr[s + 1] - b->kv_indptr[s];
        if (nqs < 1) return KVP_ERR(KVP_EINVAL, "forward: sequence %d has no new token", s);
        if (pages < 1 || b->kv_last_page_len[s] < 1 || b->kv_last_page_len[s] > bs)
            return KVP_ERR(KVP_EINVAL, "forward: sequence %d has a bad page table", s);
        int64_t L = (int64_t)bs * (pages - 1) + b->kv_last_page_len[s];
        if (L < nqs) return KVP_ERR(KVP_EINVAL, "forward: sequence %d has %d new tokens but %lld cached", s, nqs, (long long)L);
        for (int32_t i = b->kv_indptr[s]; i < b->kv_indptr[s + 1]; i++)
            if (b->kv_indices[i] < 0 || b->kv_indices[i] >= kv->num_blocks)
                return KVP_ERR(KVP_EINVAL, "forward: sequence %d uses block %d outside the cache", s, b->kv_indices[i]);
    }
    return KVP_OK;
}

/* 1 when sequence s of b gets the logits of every new token. */
static int every_logit(const kvp_fwd_batch *b, int32_t s)
{
    return b->all_logits || (b->all_logits_of && b->all_logits_of[s]);
}

/* Logits rows of sequences [s0, s1) of b. */
static int64_t rows_of(const kvp_fwd_batch *b, int32_t s0, int32_t s1)
{
    int64_t n = 0;
    for (int32_t s = s0; s < s1; s++) n += every_logit(b, s) ? b->qo_indptr[s + 1] - b->qo_indptr[s] : 1;
    return n;
}

int64_t kvp_fwd_logit_rows(const kvp_fwd_batch *b)
{
    return rows_of(b, 0, b->num_seqs);
}

/* Floats and ints of moe_ffn's workspace over T rows (none for a dense model). */
static void moe_ws(const kvp_model *m, int64_t T, int64_t *nf, int64_t *ni)
{
    const int64_t E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok, H = m->cfg.hidden_size;
    *nf = E ? T * E + T * k + 3 * T * H : 0;
    *ni = E ? 2 * T * k + 2 * E + 1 : 0;
}

/* The mixture-of-experts FFN of layer w over the T normalized rows h (T, H), as transformers' Mixtral and
 * Qwen3-MoE blocks compute it: a row's router logits, their softmax (float64), its k likeliest experts (a tie:
 * the lower index), their probabilities as weights (renormalized to sum 1 with moe_norm_topk), and the sum of
 * the weighted experts' SwiGLU outputs. Expert by expert, the rows routed to it are gathered and go through
 * its matrices as one batch; a row's outputs add up in expert order, so a row's result does not depend on
 * the batch. g, u: (T, mnff); f, i: moe_ws's. Returns the result, (T, H) in f (this rank's partial sums). */
static float *moe_ffn(const kvp_model *m, int nt, const layer_w *w, const float *h, int64_t T, float *g, float *u,
                      float *f, int32_t *i)
{
    const kvp_model_config *c = &m->cfg;
    const int64_t E = w->n_experts, k = c->num_experts_per_tok, H = c->hidden_size;
    float *logit = f /* (T, E) */, *wt = logit + T * E /* (T, k) */, *xe = wt + T * k /* (T, H) */;
    float *ye = xe + T * H /* (T, H) */, *out = ye + T * H /* (T, H) */;
    int32_t *pick = i /* (T, k): row t's experts */, *order = pick + T * k /* (T k): pick's entries by expert */;
    int32_t *start = order + T * k /* (E + 1): expert e's entries in order */, *seen = start + E + 1 /* (E) */;
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (int64_t t = 0; t < T; t++) {
        const float *x = h + t * H;
        float *r = logit + t * E;
        double mx = -INFINITY, sum = 0, chosen = 0;
        for (int64_t e = 0; e < E; e++) {
            double d = 0;
            for (int64_t j = 0; j < H; j++) d += (double)w->router[e * H + j] * x[j];
            r[e] = (float)d;
            mx = r[e] > mx ? r[e] : mx;
            seen[e] = 0;
        }
        for (int64_t e = 0; e < E; e++) sum += exp((double)r[e] - mx);
        for (int64_t j = 0; j < k; j++) { /* the j-th likeliest: the largest logit not yet taken */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (!seen[e] && (best < 0 || r[e] > r[best])) best = e;
            seen[best] = 1;
            pick[t * k + j] = (int32_t)best;
            wt[t * k + j] = (float)(exp((double)r[best] - mx) / sum);
            chosen += wt[t * k + j];
            start[best + 1]++;
        }
        for (int64_t j = 0; c->moe_norm_topk && j < k; j++) wt[t * k + j] = (float)(wt[t * k + j] / chosen);
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    memcpy(seen, start, (size_t)E * sizeof *seen); /* now each expert's next free entry */
    for (int64_t q = 0; q < T * k; q++) order[seen[pick[q]]++] = (int32_t)q;
    memset(out, 0, (size_t)(T * H) * sizeof *out);
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = start[e + 1] - start[e];
        const int32_t *ent = order + start[e];
        if (n == 0) continue;
        for (int64_t r = 0; r < n; r++) memcpy(xe + r * H, h + ent[r] / k * H, (size_t)H * sizeof *xe);
        mdl_matmul(m, nt, g, xe, &w->experts[3 * e], n);
        mdl_matmul(m, nt, u, xe, &w->experts[3 * e + 1], n);
        mdl_glu(KVP_ACT_SILU, g, u, n * m->mnff);
        mdl_matmul(m, nt, ye, g, &w->experts[3 * e + 2], n);
        for (int64_t r = 0; r < n; r++) {
            const float a = wt[ent[r]], *y = ye + r * H;
            float *o = out + ent[r] / k * H;
            for (int64_t j = 0; j < H; j++) o[j] += a * y[j];
        }
    }
    return out;
}

/* Bytes of float and int workspace one forward pass over b needs. */
static void ws_need(const kvp_model *m, const kvp_kv_cache *kv, const kvp_fwd_batch *b, size_t *fneed, size_t *ineed)
{
    const kvp_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, QD = (int64_t)m->tp.nq * c->head_dim, KD = (int64_t)m->tp.nkv * c->head_dim,
                  FF = m->tp.nff > m->mnff ? m->tp.nff : m->mnff, T = b->num_tokens;
    const int64_t S = kvp_fwd_logit_rows(b), lg = m->tp.tp > 1 ? (1 + m->tp.tp) * S * m->tp.vpad : 0;
    int64_t mf, mi;
    moe_ws(m, T, &mf, &mi);
    /* x, h (T,H); q, o (T,QD); k, v (T,KD); g, u (T,FF); final (S,H); RoPE cos/sin (ncs,T,head_dim); moe_ffn's;
     * with tp > 1 the rank's logits (S,vpad) and the gathered ones (tp,S,vpad). Shapes of this rank's shard. */
    const int64_t ncs = m->inv_freq_local ? 2 : 1; /* gemma3: the sliding layers' cos/sin too */
    *fneed = (size_t)(2 * T * H + 2 * T * QD + 2 * T * KD + 2 * T * FF + S * H + ncs * T * c->head_dim + mf + lg) *
             sizeof(float);
    int64_t total = 0;
    const int32_t bs = kv->block_size;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t pages = b->kv_indptr[s + 1] - b->kv_indptr[s], nqs = b->qo_indptr[s + 1] - b->qo_indptr[s];
        int64_t L = (int64_t)bs * (pages - 1) + b->kv_last_page_len[s];
        for (int32_t i = 0; i < nqs; i++) total += (L - nqs + i) / bs + 1;
    }
    *ineed = (size_t)(mi + (m->matmul == KVP_MATMUL_INVARIANT ? 2 * T + 1 + total : 0)) * sizeof(int32_t);
}

static kvp_status ws_reserve(fwd_ws *w, size_t fneed, size_t ineed)
{
    if (fneed > w->cap) {
        float *nw = kvp_aligned_alloc(64, fneed);
        if (!nw) return KVP_ERR(KVP_ENOMEM, "forward: out of memory for a %zu-byte workspace", fneed);
        kvp_free(w->f);
        w->f = nw;
        w->cap = fneed;
    }
    if (ineed > w->icap) {
        int32_t *ni = kvp_malloc(ineed);
        if (!ni) return KVP_ERR(KVP_ENOMEM, "forward: out of memory for the page table");
        kvp_free(w->i);
        w->i = ni;
        w->icap = ineed;
    }
    return KVP_OK;
}

/* Sums the ranks' partial results (a no-op at tp 1). */
static kvp_status all_reduce(const kvp_model *m, float *x, int64_t n)
{
    return m->tp.tp > 1 ? kvp_comm_all_reduce_sum_f32(m->comm, x, n) : KVP_OK;
}

/* The forward pass proper over a validated batch, with a reserved workspace, `nt` matmul threads. */
static kvp_status forward_one(const kvp_model *m, kvp_kv_cache *kv, const kvp_fwd_batch *b, float *logits,
                              fwd_ws *ws, int nt)
{
    const kvp_model_config *c = &m->cfg;
    /* this rank's heads and intermediate units (all of them at tp 1) */
    const int64_t H = c->hidden_size, hd = c->head_dim, nq = m->tp.nq, nkv = m->tp.nkv;
    const int64_t FF = m->tp.nff, T = b->num_tokens;
    const int64_t QD = nq * hd, KD = nkv * hd;
    const int64_t S = kvp_fwd_logit_rows(b);
    float *x = ws->f, *h = x + T * H, *q = h + T * H, *o = q + T * QD, *k = o + T * QD, *v = k + T * KD;
    int64_t mf, mi;
    moe_ws(m, T, &mf, &mi);
    const int64_t FFW = FF > m->mnff ? FF : m->mnff; /* g, u: a dense layer's or an expert's units */
    /* cs: RoPE's cos/sin, (T, hd); csl: the sliding layers' (gemma3), or cs again */
    float *gt = v + T * KD, *up = gt + T * FFW, *fin = up + T * FFW, *cs = fin + S * H;
    float *csl = m->inv_freq_local ? cs + T * hd : cs, *mfs = csl + T * hd;
    float *lg = mfs + mf;
    int32_t *mis = ws->i;
    /* Batch-invariant attention: every query token becomes its own one-token "sequence" whose pages end at
     * its position, and all of them go through the decode kernel. A row then takes the same path whatever
     * the batch, the chunking of its prompt or its place in a tile (the tiled prefill kernel groups rows
     * differently and rounds them differently). Costs K/V reloads per query row during prefill. */
    const int inv = m->matmul == KVP_MATMUL_INVARIANT;
    int32_t *x_indptr = NULL, *x_indices = NULL, *x_last = NULL;
    if (inv) {
        const int32_t bs = kv->block_size;
        x_indptr = ws->i + mi;
        x_last = x_indptr + T + 1;
        x_indices = x_last + T;
        int64_t at = 0, row = 0;
        for (int32_t s = 0; s < b->num_seqs; s++) {
            int32_t pages = b->kv_indptr[s + 1] - b->kv_indptr[s], nqs = b->qo_indptr[s + 1] - b->qo_indptr[s];
            int32_t L = bs * (pages - 1) + b->kv_last_page_len[s];
            const int32_t *src = b->kv_indices + b->kv_indptr[s];
            for (int32_t i = 0; i < nqs; i++, row++) {
                int32_t pos = L - nqs + i, np = pos / bs + 1;
                x_indptr[row] = (int32_t)at;
                memcpy(x_indices + at, src, (size_t)np * sizeof(int32_t));
                at += np;
                x_last[row] = pos % bs + 1;
            }
        }
        x_indptr[T] = (int32_t)at;
    }
    /* vocab-parallel embedding: each rank copies the rows it holds, zeros elsewhere, and the sum over ranks
     * is the embedding */
    for (int64_t t = 0; t < T; t++) {
        const int64_t r = b->tokens[t] - m->tp.v0;
        if (r >= 0 && r < m->tp.nv) memcpy(x + t * H, m->embed + r * H, (size_t)H * sizeof(float));
        else memset(x + t * H, 0, (size_t)H * sizeof(float));
    }
    if (c->family == KVP_FAMILY_GEMMA2) { /* gemma scales the embedding by sqrt(hidden_size), rounded to f32 */
        const float norm = sqrtf((float)H);
        for (int64_t i = 0; i < T * H; i++) x[i] *= norm;
    }
    KVP_TRY(all_reduce(m, x, T * H));
    for (int64_t t = 0; t < T; t++) { /* once for every layer */
        mdl_rope_angles(m, m->inv_freq, m->rope_scale, b->positions[t], cs + t * hd);
        if (m->inv_freq_local) mdl_rope_angles(m, m->inv_freq_local, 1.0, b->positions[t], csl + t * hd);
    }
    for (int32_t l = 0; l < c->num_layers; l++) {
        const layer_w *w = &m->layers[l];
        for (int64_t t = 0; t < T; t++) mdl_rmsnorm(h + t * H, x + t * H, w->attn_norm, H, c->rms_norm_eps);
        mdl_matmul(m, nt, q, h, &w->wq, T);
        mdl_matmul(m, nt, k, h, &w->wk, T);
        mdl_matmul(m, nt, v, h, &w->wv, T);
        for (int64_t t = 0; t < T; t++) {
            if (w->bq)
                for (int64_t i = 0; i < QD; i++) q[t * QD + i] += w->bq[i];
            if (w->bk)
                for (int64_t i = 0; i < KD; i++) k[t * KD + i] += w->bk[i];
            if (w->bv)
                for (int64_t i = 0; i < KD; i++) v[t * KD + i] += w->bv[i];
            if (w->q_norm) {
                for (int64_t i = 0; i < nq; i++) mdl_rmsnorm(q + t * QD + i * hd, q + t * QD + i * hd, w->q_norm, hd, c->rms_norm_eps);
                for (int64_t i = 0; i < nkv; i++) mdl_rmsnorm(k + t * KD + i * hd, k + t * KD + i * hd, w->k_norm, hd, c->rms_norm_eps);
            }
            const float *lcs = (c->layer_is_sliding[l] ? csl : cs) + t * hd;
            mdl_rope(m, q + t * QD, (int32_t)nq, lcs);
            mdl_rope(m, k + t * KD, (int32_t)nkv, lcs);
        }
        kvp_paged_kv lkv = kv->layers[l];
        KVP_TRY(kvp_attn_append_kv_cpu(&lkv, k, v, b->slot_mapping, (int32_t)T));
        kvp_attn_params p = kvp_attn_default_params((int32_t)nq);
        p.window_left = w->window_left;
        p.logits_soft_cap = (float)c->attn_logit_softcapping;
        if (c->query_pre_attn_scalar > 0) p.sm_scale = (float)(1.0 / sqrt(c->query_pre_attn_scalar));
        if (m->skip_attention) {
            memcpy(o, q, (size_t)(T * QD) * sizeof(float)); /* o and q: (T, QD) */
        } else if (inv) {
            p.kv_chunk_size = 1 << 30; /* no split-KV: a row's result must not depend on the batch */
            kvp_paged_kv_set_pages(&lkv, (int32_t)T, x_indptr, x_indices, x_last);
            KVP_TRY(kvp_attn_decode_cpu(&lkv, q, o, &p));
        } else {
            kvp_paged_kv_set_pages(&lkv, b->num_seqs, b->kv_indptr, b->kv_indices, b->kv_last_page_len);
            KVP_TRY(kvp_attn_prefill_cpu(&lkv, q, b->qo_indptr, o, &p));
        }
        mdl_matmul(m, nt, h, o, &w->wo, T); /* row-parallel: the ranks' partial sums */
        KVP_TRY(all_reduce(m, h, T * H));
        if (w->bo)
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < H; i++) h[t * H + i] += w->bo[i];
        for (int64_t t = 0; w->post_attn_norm && t < T; t++)
            mdl_rmsnorm(h + t * H, h + t * H, w->post_attn_norm, H, c->rms_norm_eps);
        for (int64_t i = 0; i < T * H; i++) x[i] += h[i];
        for (int64_t t = 0; t < T; t++) mdl_rmsnorm(h + t * H, x + t * H, w->ffn_norm, H, c->rms_norm_eps);
        float *ffn = h;
        if (w->n_experts) {
            ffn = moe_ffn(m, nt, w, h, T, gt, up, mfs, mis);
        } else {
            mdl_matmul(m, nt, gt, h, &w->w_gate, T);
            mdl_matmul(m, nt, up, h, &w->w_up, T);
            mdl_glu(c->ffn_act, gt, up, T * FF);
            mdl_matmul(m, nt, h, gt, &w->w_down, T);
        }
        KVP_TRY(all_reduce(m, ffn, T * H));
        for (int64_t t = 0; w->post_ffn_norm && t < T; t++)
            mdl_rmsnorm(ffn + t * H, ffn + t * H, w->post_ffn_norm, H, c->rms_norm_eps);
        for (int64_t i = 0; i < T * H; i++) x[i] += ffn[i];
    }
    for (int32_t s = 0, r = 0; s < b->num_seqs; s++)
        for (int64_t t = every_logit(b, s) ? b->qo_indptr[s] : b->qo_indptr[s + 1] - 1; t < b->qo_indptr[s + 1]; t++)
            mdl_rmsnorm(fin + r++ * H, x + t * H, m->out_norm, H, c->rms_norm_eps);
    if (m->tp.tp == 1) {
        mdl_matmul(m, nt, logits, fin, &m->lm_head, S);
        mdl_softcap(logits, S * c->vocab_size, c->final_logit_softcapping);
        return KVP_OK;
    }
    /* vocab-parallel LM head: this rank's columns of the logits, gathered as tp slices of vpad, then
     * reassembled row by row (the last slice may be short) */
    const int64_t vp = m->tp.vpad, V = m->cfg.vocab_size;
    float *all = lg + S * vp;
    mdl_matmul(m, nt, lg, fin, &m->lm_head, S); /* (S, nv) at stride nv */
    for (int64_t r = S - 1; r >= 0; r--) memmove(lg + r * vp, lg + r * m->tp.nv, (size_t)m->tp.nv * sizeof(float));
    KVP_TRY(kvp_comm_all_gather_f32(m->comm, lg, S * vp, all));
    for (int32_t k = 0; k < m->tp.tp; k++) {
        const int64_t v0 = k * vp, nv = V - v0 < vp ? V - v0 : vp;
        for (int64_t r = 0; nv > 0 && r < S; r++)
            memcpy(logits + r * V + v0, all + (k * S + r) * vp, (size_t)nv * sizeof(float));
    }
    mdl_softcap(logits, S * V, c->final_logit_softcapping);
    return KVP_OK;
}

typedef struct {
    const kvp_model *m;
    kvp_kv_cache *kv;
    const kvp_fwd_batch *b;
    float *logits;
    fwd_ws *ws;
    kvp_status st;
    char err[256];
} group_job;

static void group_main(void *arg, int g)
{
    group_job *j = (group_job *)arg + g;
    j->st = forward_one(j->m, j->kv, j->b, j->logits, j->ws, 1);
    if (j->st != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_message());
}

/* Data parallelism over sequences: with several threads and several sequences, the batch is cut into
 * contiguous groups of sequences (balanced by token count) and each thread runs the whole forward pass of
 * its group (sequences are independent: each reads only its own pages, and appends go to distinct slots).
 * One fork/join per step instead of several per layer: fine-grained parallel regions stall for whole
 * scheduler time slices on a busy machine. Matmuls and attention inside a group run on one thread. */
/* The BLAS layout of every matrix (made once, on the first BLAS forward pass). */
static kvp_status need_blas_layout(kvp_model *m)
{
    if (m->lm_head.t) return KVP_OK; /* made last: everything before it exists */
    for (int32_t l = 0; l < m->cfg.num_layers; l++)
        for (int64_t i = 0; i < mdl_layer_nmats(&m->layers[l]); i++)
            if (mdl_layer_mat(&m->layers[l], i)->p) KVP_TRY(mdl_mat_need_t(mdl_layer_mat(&m->layers[l], i)));
    return mdl_mat_need_t(&m->lm_head);
}

kvp_status kvp_model_forward(kvp_model *m, kvp_kv_cache *kv, const kvp_fwd_batch *b, float *logits)
{
    KVP_TRY(validate(m, kv, b));
    if (m->matmul == KVP_MATMUL_BLAS) KVP_TRY(need_blas_layout(m));
    const int64_t V = m->cfg.vocab_size, T = b->num_tokens;
    /* one group under tensor parallelism: the ranks' collectives must come in one order */
    int G = m->tp.tp > 1 ? 1 : m->threads < b->num_seqs ? m->threads : b->num_seqs;
    if (G > KVP_FWD_MAX_GROUPS) G = KVP_FWD_MAX_GROUPS;
    if (G < 2 || T < 8) {
        size_t fn, in;
        ws_need(m, kv, b, &fn, &in);
        KVP_TRY(ws_reserve(&m->ws[0], fn, in));
        /* Attention threads only pay off with enough key rows to read (a decode step of one short
         * sequence takes microseconds; a fork/join costs as much, far more on a busy machine). */
        int64_t rows = 0;
        for (int32_t s = 0; s < b->num_seqs; s++)
            rows += (int64_t)(b->qo_indptr[s + 1] - b->qo_indptr[s]) *
                    ((int64_t)kv->block_size * (b->kv_indptr[s + 1] - b->kv_indptr[s]));
        const int attn_threads = rows * m->cfg.num_q_heads * m->cfg.head_dim >= (1 << 22) ? m->threads : 1;
        kvp_attn_set_threads(attn_threads);
        kvp_status st = forward_one(m, kv, b, logits, &m->ws[0], m->threads);
        kvp_attn_set_threads(m->threads);
        return st;
    }
    /* Group boundaries by token count. */
    int32_t bounds[KVP_FWD_MAX_GROUPS + 1];
    bounds[0] = 0;
    for (int g = 1; g < G; g++) {
        int64_t target = T * g / G;
        int32_t s = bounds[g - 1] + 1;
        while (s < b->num_seqs - (G - g) && b->qo_indptr[s] < target) s++;
        bounds[g] = s;
    }
    bounds[G] = b->num_seqs;
    size_t need_idx = (size_t)(b->num_seqs + G) * 2 * sizeof(int32_t);
    if (need_idx > m->sub_cap) {
        int32_t *ni = kvp_malloc(need_idx);
        if (!ni) return KVP_ERR(KVP_ENOMEM, "forward: out of memory");
        kvp_free(m->sub);
        m->sub = ni;
        m->sub_cap = need_idx;
    }
    kvp_fwd_batch sub[KVP_FWD_MAX_GROUPS];
    int32_t *qo = m->sub, *kvi = m->sub + b->num_seqs + G;
    for (int g = 0; g < G; g++) {
        int32_t s0 = bounds[g], s1 = bounds[g + 1], n = s1 - s0, t0 = b->qo_indptr[s0], p0 = b->kv_indptr[s0];
        int32_t *sq = qo + s0 + g, *sk = kvi + s0 + g;
        for (int32_t i = 0; i <= n; i++) {
            sq[i] = b->qo_indptr[s0 + i] - t0;
            sk[i] = b->kv_indptr[s0 + i] - p0;
        }
        sub[g] = (kvp_fwd_batch){.num_seqs = n, .num_tokens = sq[n], .tokens = b->tokens + t0,
                                 .positions = b->positions + t0, .slot_mapping = b->slot_mapping + t0,
                                 .qo_indptr = sq, .kv_indptr = sk, .kv_indices = b->kv_indices + p0,
                                 .kv_last_page_len = b->kv_last_page_len + s0, .all_logits = b->all_logits,
                                 .all_logits_of = b->all_logits_of ? b->all_logits_of + s0 : NULL};
        size_t fn, in;
        ws_need(m, kv, &sub[g], &fn, &in);
        KVP_TRY(ws_reserve(&m->ws[g], fn, in));
    }
    group_job jobs[KVP_FWD_MAX_GROUPS];
    kvp_attn_set_threads(1);
    if (m->matmul == KVP_MATMUL_BLAS) openblas_set_num_threads(1); /* no nested BLAS threads in the groups */
    for (int g = 0; g < G; g++) {
        const int64_t row0 = rows_of(b, 0, bounds[g]);
        jobs[g] = (group_job){.m = m, .kv = kv, .b = &sub[g], .logits = logits + row0 * V, .ws = &m->ws[g],
                              .st = KVP_OK};
    }
    /* The model's sleeping workers, one run per step: no OpenMP spin-waiting between steps on a shared
     * machine, no thread creation per step. */
    kvp_model_run(m, G, group_main, jobs);
    kvp_attn_set_threads(m->threads);
    if (m->matmul == KVP_MATMUL_BLAS) openblas_set_num_threads(m->threads);
    kvp_status st[KVP_FWD_MAX_GROUPS];
    char err[KVP_FWD_MAX_GROUPS][256];
    for (int g = 0; g < G; g++) {
        st[g] = jobs[g].st;
        memcpy(err[g], jobs[g].err, sizeof err[g]);
    }
    for (int g = 0; g < G; g++)
        if (st[g] != KVP_OK) return KVP_ERR(st[g], "%s", err[g]);
    return KVP_OK;
}

