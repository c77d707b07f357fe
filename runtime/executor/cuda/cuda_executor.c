/* runtime/executor/cuda/cuda_executor.c — the engine's cuda executor: the memory split, the step pack, CUDA-graph
 * buckets, device weights and the forward pass driven from the host (contract: cuda_executor.h; kernels:
 * cuda/cuda_dev.h). */
#include "runtime/executor/cuda_executor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/timer.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "runtime/executor/cpu_executor.h" /* kvp_exec_session_config */
#include "runtime/executor/cuda/cuda_dev.h"
#include "runtime/executor/tp_plan.h"
#include "runtime/model/model_export.h"

/* The emulated device's memory unless KVPAGE_EMU_DEVICE_MEM sets the emulator's: its "device" is host memory,
 * which other work shares (the emulator's own default is 8 GiB). */
enum { EMU_DEVICE_BYTES = 256 << 20 };

kvp_cuda_options kvp_cuda_options_default(void)
{
    return (kvp_cuda_options){.device = 0, .gpu_memory_utilization = 0.9, .kv_cache_memory = -1,
                              .enforce_eager = 0, .weights = KVP_DTYPE_COUNT, .random_seed = 0,
                              .attention = KVP_CUDA_ATTN_PAGED};
}

kvp_status kvp_cuda_devices(int *n) { return kvp_cudev_count(n); }

kvp_status kvp_device_parse(const char *s, int *cuda, int *index)
{
    if (!strcmp(s, "cpu")) {
        *cuda = 0;
        *index = 0;
        return KVP_OK;
    }
    if (!strcmp(s, "cuda")) {
        *cuda = 1;
        *index = 0;
        return KVP_OK;
    }
    int32_t n;
    if (!strncmp(s, "cuda:", 5) && kvp_parse_i32(s + 5, 0, 1023, &n) == KVP_OK) {
        *cuda = 1;
        *index = n;
        return KVP_OK;
    }
    return KVP_ERR(KVP_EINVAL, "unknown device '%s' (use cpu, cuda or cuda:N)", s);
}

/* ---------------------------------------------------------------- the memory split */

kvp_status kvp_cuda_split(int64_t total, int64_t free_at_start, double util, int64_t weights, int64_t activations,
                          int64_t block_bytes, int64_t kv_cache_memory, kvp_cuda_mem_split *out)
{
    if (!(util > 0 && util <= 1))
        return KVP_ERR(KVP_EINVAL, "--gpu-memory-utilization %g is outside (0, 1]", util);
    if (total <= 0 || block_bytes <= 0) return KVP_ERR(KVP_EINVAL, "cuda executor: no device memory to split");
    kvp_cuda_mem_split s = {.total = total, .free_at_start = free_at_start, .utilization = util,
                            .budget = (int64_t)floor((double)total * util), .weights = weights,
                            .activations = activations, .block_bytes = block_bytes};
    if (kv_cache_memory >= 0) {
        s.kv = kv_cache_memory;
        s.kv_given = 1;
        if (weights + activations + s.kv > free_at_start)
            return KVP_ERR(KVP_EINVAL, "--kv-cache-memory %lld with %lld bytes of weights and %lld of activations is "
                                       "more than the device's %lld free bytes", (long long)s.kv, (long long)weights,
                           (long long)activations, (long long)free_at_start);
    } else {
        if (s.budget > free_at_start)
            return KVP_ERR(KVP_EINVAL, "--gpu-memory-utilization %g asks for %lld bytes, but the device has %lld free "
                                       "of %lld (another process holds the rest): lower it, or give --kv-cache-memory",
                           util, (long long)s.budget, (long long)free_at_start, (long long)total);
        s.kv = s.budget - weights - activations;
    }
    const int64_t nb = s.kv > 0 ? s.kv / block_bytes : 0;
    if (nb < 1)
        return KVP_ERR(KVP_EINVAL, "no room for a KV block of %lld bytes: %s %lld bytes, weights %lld, activations "
                                   "%lld (raise --gpu-memory-utilization or --kv-cache-memory)",
                       (long long)block_bytes, s.kv_given ? "--kv-cache-memory" : "the budget", (long long)
                       (s.kv_given ? s.kv : s.budget), (long long)weights, (long long)activations);
    s.num_blocks = nb > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)nb;
    *out = s;
    return KVP_OK;
}

/* ---------------------------------------------------------------- graph buckets */

int32_t kvp_cuda_graph_buckets(int32_t max_num_seqs, int32_t *out)
{
    const int32_t cap = max_num_seqs < 512 ? max_num_seqs : 512;
    int32_t n = 0;
    for (int32_t b = 1; b <= 512 && n < KVP_CUDA_MAX_BUCKETS; b = b < 8 ? (b == 4 ? 8 : 2 * b) : b + 8) {
        if (n > 0 && out[n - 1] >= cap) break; /* the largest covers max_num_seqs */
        out[n++] = b;
    }
    return n;
}

int32_t kvp_cuda_graph_bucket(const int32_t *buckets, int32_t n_buckets, int32_t n)
{
    for (int32_t i = 0; i < n_buckets; i++)
        if (buckets[i] >= n) return buckets[i];
    return -1;
}

/* ---------------------------------------------------------------- the step pack */

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

kvp_status kvp_cuda_pack_plan(const kvp_exec_batch *b, const kvp_cuda_pack_model *pm, int32_t T_pad,
                              kvp_cuda_pack_layout *lay)
{
    const kvp_exec_flat *f = &b->flat;
    if (b->n < 1 || !f->qo_indptr || f->num_tokens < 1 || f->qo_indptr[b->n] != f->num_tokens)
        return KVP_ERR(KVP_EINVAL, "cuda executor: the batch has no flat form (%d sequences)", b->n);
    const int64_t slots = (int64_t)pm->num_blocks * pm->block_size;
    for (int32_t t = 0; t < f->num_tokens; t++) {
        if (f->tokens[t] < 0 || f->tokens[t] >= pm->vocab)
            return KVP_ERR(KVP_EINVAL, "cuda executor: token id %d at row %d is outside the vocabulary (%lld)",
                           f->tokens[t], t, (long long)pm->vocab);
        if (f->positions[t] < 0 || f->positions[t] >= pm->max_len)
            return KVP_ERR(KVP_EINVAL, "cuda executor: position %d is past the model's context of %d tokens",
                           f->positions[t], pm->max_len);
        if (f->slot_mapping[t] < 0 || f->slot_mapping[t] >= slots)
            return KVP_ERR(KVP_EINVAL, "cuda executor: slot %lld of row %d is outside the KV cache",
                           (long long)f->slot_mapping[t], t);
    }
    if (f->kv_indptr[0] != 0) return KVP_ERR(KVP_EINVAL, "cuda executor: kv_indptr must start at 0");
    int32_t rows = 0, decode = 1;
    for (int32_t s = 0; s < b->n; s++) {
        const int32_t nqs = f->qo_indptr[s + 1] - f->qo_indptr[s], pages = f->kv_indptr[s + 1] - f->kv_indptr[s];
        if (nqs < 1) return KVP_ERR(KVP_EINVAL, "cuda executor: sequence %d has no new token", s);
        if (pages < 1 || f->kv_last_page_len[s] < 1 || f->kv_last_page_len[s] > pm->block_size)
            return KVP_ERR(KVP_EINVAL, "cuda executor: sequence %d has a bad page table", s);
        const int64_t L = (int64_t)pm->block_size * (pages - 1) + f->kv_last_page_len[s];
        if (L < nqs)
            return KVP_ERR(KVP_EINVAL, "cuda executor: sequence %d has %d new tokens but %lld cached", s, nqs,
                           (long long)L);
        for (int32_t i = f->kv_indptr[s]; i < f->kv_indptr[s + 1]; i++)
            if (f->kv_indices[i] < 0 || f->kv_indices[i] >= pm->num_blocks)
                return KVP_ERR(KVP_EINVAL, "cuda executor: sequence %d uses block %d outside the cache", s,
                               f->kv_indices[i]);
        rows += f->all_logits && f->all_logits[s] ? nqs : 1;
        decode &= nqs == 1;
    }
    if (T_pad != 0 && T_pad < f->num_tokens)
        return KVP_ERR(KVP_EINVAL, "cuda executor: padding to %d rows, below the batch's %d", T_pad, f->num_tokens);
    kvp_cuda_pack_layout l = {.T = T_pad ? T_pad : f->num_tokens, .T_real = f->num_tokens, .S = rows,
                              .P = f->kv_indptr[b->n] + (T_pad > f->num_tokens ? T_pad - f->num_tokens : 1),
                              .C = b->ops.n_copies, .rot = pm->rot,
                              .local = pm->inv_freq_local != NULL, .decode = decode};
    l.N = b->n + (l.T - l.T_real);
    size_t at = 0;
    /* T-sized sections first: their offsets, and kv_indices', depend on T and rot only (a graph's pack) */
    l.off_slots = at, at = align16(at + (size_t)l.T * sizeof(int64_t));
    l.off_tokens = at, at = align16(at + (size_t)l.T * sizeof(int32_t));
    l.off_kv_begin = at, at = align16(at + (size_t)l.T * sizeof(int32_t));
    l.off_len = at, at = align16(at + (size_t)l.T * sizeof(int32_t));
    l.off_rows = at, at = align16(at + (size_t)l.T * sizeof(int32_t));
    l.off_cs = at, at = align16(at + (size_t)l.T * (size_t)l.rot * sizeof(float));
    l.off_csl = at, at = align16(at + (l.local ? (size_t)l.T * (size_t)l.rot * sizeof(float) : 0));
    l.off_seq_indptr = at, at = align16(at + (size_t)(l.T + 1) * sizeof(int32_t)); /* N <= T */
    l.off_seq_last = at, at = align16(at + (size_t)l.T * sizeof(int32_t));
    l.off_seq_qo = at, at = align16(at + (size_t)(l.T + 1) * sizeof(int32_t));
    l.off_indices = at, at = align16(at + (size_t)l.P * sizeof(int32_t));
    l.off_pairs = at, at = align16(at + 2 * (size_t)l.C * sizeof(int32_t));
    l.bytes = at;
    *lay = l;
    return KVP_OK;
}

void kvp_cuda_pack_fill(const kvp_exec_batch *b, const kvp_cuda_pack_model *pm, const kvp_cuda_pack_layout *l,
                        void *buf)
{
    const kvp_exec_flat *f = &b->flat;
    char *base = buf;
    int64_t *slots = (int64_t *)(base + l->off_slots);
    int32_t *tokens = (int32_t *)(base + l->off_tokens), *kv_begin = (int32_t *)(base + l->off_kv_begin);
    int32_t *len = (int32_t *)(base + l->off_len), *indices = (int32_t *)(base + l->off_indices);
    int32_t *rows = (int32_t *)(base + l->off_rows), *pairs = (int32_t *)(base + l->off_pairs);
    float *cs = (float *)(base + l->off_cs), *csl = (float *)(base + l->off_csl);
    const int32_t P0 = f->kv_indptr[b->n]; /* pages of the batch; then one page per padding row (or one spare) */
    memcpy(indices, f->kv_indices, (size_t)P0 * sizeof(int32_t));
    for (int32_t i = P0; i < l->P; i++) indices[i] = 0; /* the pages padding rows read (results dropped) */
    int32_t r = 0;
    for (int32_t s = 0; s < b->n; s++) {
        const int32_t q0 = f->qo_indptr[s], nqs = f->qo_indptr[s + 1] - q0, pages = f->kv_indptr[s + 1] - f->kv_indptr[s];
        const int32_t L = pm->block_size * (pages - 1) + f->kv_last_page_len[s];
        for (int32_t i = 0; i < nqs; i++) {
            kv_begin[q0 + i] = f->kv_indptr[s];
            len[q0 + i] = L - nqs + i + 1;
        }
        const int every = f->all_logits && f->all_logits[s];
        for (int32_t t = every ? q0 : q0 + nqs - 1; t < q0 + nqs; t++) rows[r++] = t;
    }
    for (; r < l->T; r++) rows[r] = r; /* a bucket's LM head runs over all T rows; these are dropped */
    for (int32_t t = 0; t < l->T; t++) {
        const int real = t < l->T_real;
        slots[t] = real ? f->slot_mapping[t] : -1;
        tokens[t] = real ? f->tokens[t] : 0;
        if (!real) {
            kv_begin[t] = P0 + (t - l->T_real);
            len[t] = 1;
        }
        const int32_t pos = real ? f->positions[t] : 0;
        kvp_model_rope_angles(pm->inv_freq, pm->rot, pm->rope_scale, pos, cs + (size_t)t * l->rot);
        if (l->local) kvp_model_rope_angles(pm->inv_freq_local, pm->rot, 1.0, pos, csl + (size_t)t * l->rot);
    }
    for (int32_t i = 0; i < l->C; i++) {
        pairs[2 * i] = b->ops.copies[i].src;
        pairs[2 * i + 1] = b->ops.copies[i].dst;
    }
    int32_t *sp = (int32_t *)(base + l->off_seq_indptr), *sl = (int32_t *)(base + l->off_seq_last);
    int32_t *sq = (int32_t *)(base + l->off_seq_qo);
    for (int32_t s = 0; s < b->n; s++) {
        sp[s] = f->kv_indptr[s];
        sl[s] = f->kv_last_page_len[s];
        sq[s] = f->qo_indptr[s];
    }
    for (int32_t s = b->n; s < l->N; s++) { /* padding row T_real + (s - n): one key of its own extra page */
        sp[s] = P0 + (s - b->n);
        sl[s] = 1;
        sq[s] = l->T_real + (s - b->n);
    }
    sp[l->N] = P0 + (l->N - b->n);
    sq[l->N] = l->T;
}

/* ---------------------------------------------------------------- the device model */

/* Shapes below are one rank's (parallel/shard.h; the whole model at tp 1): QD = nq hd and KD = nkv hd of its
 * query and KV heads, FF its intermediate units, MF its units of every expert, nv its vocabulary rows. */
typedef struct {
    void *wqkv;   /* (QD + 2 KD, H) of wdt: Q, K and V fused, as one GEMM (column-parallel) */
    void *wo;     /* (H, QD) (row-parallel: the ranks' products are summed) */
    void *wgu;    /* (2 FF, H): gate then up, fused (column-parallel); NULL in an MoE layer */
    void *wdown;  /* (H, FF) (row-parallel) */
    float *router; /* (E, H) f32, replicated: an MoE layer's router; NULL: a dense FFN */
    void *wgu_e;  /* (E, 2 MF, H): expert e's gate then up rows (column-parallel, as wgu) */
    void *wdown_e; /* (E, H, MF) (row-parallel, as wdown) */
    float *bqkv;  /* (QD + 2 KD) or NULL */
    float *bo;    /* (H) or NULL */
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    int32_t window_left;
} cu_layer;

struct kvp_cuda_model {
    kvp_model_config cfg;
    kvp_tp_shard tp;    /* this rank's heads, units and vocabulary rows, as the loader sliced them */
    kvp_cudev *dev;     /* borrowed */
    kvp_dtype wdt;      /* of the matrices and the embedding */
    void *embed;        /* (nv, H): vocabulary rows tp.v0 .. (vocab-parallel) */
    void *lm_head;      /* (nv, H); == embed when tied */
    float *out_norm;    /* (H) */
    cu_layer *layers;   /* (num_layers), host array of device pointers */
    double *inv_freq, *inv_freq_local; /* (rot / 2), host */
    double rope_scale;
    int32_t rot, rope_style, max_len;
    int32_t n_experts;  /* E of the MoE layers; 0: every layer dense */
    int64_t moe_mf;     /* MF */
    int64_t weight_bytes;
};

static void cu_model_free(kvp_cuda_model *cm)
{
    if (!cm) return;
    kvp_cudev *d = cm->dev;
    for (int32_t l = 0; cm->layers && l < cm->cfg.num_layers; l++) {
        cu_layer *w = &cm->layers[l];
        void *ps[] = {w->wqkv,      w->wo,        w->wgu,       w->wdown,         w->router,
                      w->wgu_e,     w->wdown_e,   w->bqkv,      w->bo,            w->attn_norm,
                      w->ffn_norm,  w->q_norm,    w->k_norm,    w->post_attn_norm, w->post_ffn_norm};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(d, ps[i]);
    }
    if (cm->lm_head != cm->embed) kvp_cudev_free(d, cm->lm_head);
    kvp_cudev_free(d, cm->embed);
    kvp_cudev_free(d, cm->out_norm);
    kvp_free(cm->layers);
    kvp_free(cm->inv_freq);
    kvp_free(cm->inv_freq_local);
    kvp_free(cm);
}

/* n elements of dt at device address dst from f32 host values (rounded to nearest even for bf16). */
static kvp_status copy_as(kvp_cuda_model *cm, void *dst, const float *src, int64_t n, kvp_dtype dt, const char *what)
{
    const size_t bytes = (size_t)n * (dt == KVP_DTYPE_F32 ? 4 : 2);
    const void *host = src;
    uint16_t *tmp = NULL;
    if (dt == KVP_DTYPE_BF16) {
        if (!(tmp = kvp_malloc(bytes))) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory converting %s", what);
        for (int64_t i = 0; i < n; i++) tmp[i] = kvp_f32_to_bf16(src[i]);
        host = tmp;
    }
    kvp_status st = kvp_cudev_copy(cm->dev, dst, host, bytes, 0);
    if (st == KVP_OK) st = kvp_cudev_sync(cm->dev, 0); /* tmp is freed next */
    kvp_free(tmp);
    return st;
}

/* A device buffer of n elements of dt (counted as weights) from f32 host values. */
static kvp_status upload_as(kvp_cuda_model *cm, void **dst, const float *src, int64_t n, kvp_dtype dt, const char *what)
{
    const size_t bytes = (size_t)n * (dt == KVP_DTYPE_F32 ? 4 : 2);
    KVP_TRY(kvp_cudev_malloc(cm->dev, dst, bytes, what));
    cm->weight_bytes += (int64_t)bytes;
    return copy_as(cm, *dst, src, n, dt, what);
}

/* An f32 vector, or NULL for none. */
static kvp_status upload_vec(kvp_cuda_model *cm, float **dst, const float *src, int64_t n, const char *what)
{
    *dst = NULL;
    return src ? upload_as(cm, (void **)dst, src, n, KVP_DTYPE_F32, what) : KVP_OK;
}

/* Matrices ids[0..n) of layer l stacked by rows into one device matrix of wdt. */
static kvp_status upload_stacked(kvp_cuda_model *cm, const kvp_model *m, int32_t l, const kvp_mat_id *ids, int n,
                                 void **dst, const char *what)
{
    int64_t rows = 0, K = 0;
    for (int i = 0; i < n; i++) {
        int64_t N, k;
        kvp_model_matrix_shape(m, l, ids[i], &N, &k);
        rows += N;
        K = k;
    }
    float *buf = kvp_malloc((size_t)(rows * K) * sizeof(float));
    if (!buf) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory for %s of layer %d", what, l);
    kvp_status st = KVP_OK;
    for (int i = 0, at = 0; i < n && st == KVP_OK; i++) {
        int64_t N, k;
        kvp_model_matrix_shape(m, l, ids[i], &N, &k);
        st = kvp_model_matrix_f32(m, l, ids[i], buf + (int64_t)at * K);
        at += (int)N;
    }
    if (st == KVP_OK) st = upload_as(cm, dst, buf, rows * K, cm->wdt, what);
    kvp_free(buf);
    return st;
}

/* MoE layer l's E experts stacked as wgu_e and wdown_e, one expert through the host at a time; *mf: MF. */
static kvp_status upload_experts(kvp_cuda_model *cm, const kvp_model *m, int32_t l, int32_t E, cu_layer *w,
                                 int64_t *mf)
{
    int64_t MF, H, n, k;
    kvp_model_expert_matrix_shape(m, l, 0, KVP_MAT_GATE, &MF, &H);
    const size_t es = cm->wdt == KVP_DTYPE_F32 ? 4 : 2, one = (size_t)(MF * H);
    KVP_TRY(kvp_cudev_malloc(cm->dev, &w->wgu_e, (size_t)E * 2 * one * es, "the experts' gate/up"));
    KVP_TRY(kvp_cudev_malloc(cm->dev, &w->wdown_e, (size_t)E * one * es, "the experts' down"));
    cm->weight_bytes += (int64_t)((size_t)E * 3 * one * es);
    float *buf = kvp_malloc(2 * one * sizeof(float));
    if (!buf) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory for the experts of layer %d", l);
    kvp_status st = KVP_OK;
    for (int32_t e = 0; e < E && st == KVP_OK; e++) {
        for (kvp_mat_id id = KVP_MAT_GATE; id <= KVP_MAT_DOWN && st == KVP_OK; id++) {
            kvp_model_expert_matrix_shape(m, l, e, id, &n, &k);
            const int down = id == KVP_MAT_DOWN;
            if (n != (down ? H : MF) || k != (down ? MF : H))
                st = KVP_ERR(KVP_EINVAL, "cuda executor: expert %d of layer %d is %lld x %lld, not %lld x %lld", e, l,
                             (long long)n, (long long)k, (long long)(down ? H : MF), (long long)(down ? MF : H));
        }
        if (st == KVP_OK) st = kvp_model_expert_matrix_f32(m, l, e, KVP_MAT_GATE, buf);
        if (st == KVP_OK) st = kvp_model_expert_matrix_f32(m, l, e, KVP_MAT_UP, buf + one);
        char *gu = (char *)w->wgu_e + (size_t)e * 2 * one * es, *dn = (char *)w->wdown_e + (size_t)e * one * es;
        if (st == KVP_OK) st = copy_as(cm, gu, buf, 2 * (int64_t)one, cm->wdt, "the experts' gate/up");
        if (st == KVP_OK) st = kvp_model_expert_matrix_f32(m, l, e, KVP_MAT_DOWN, buf);
        if (st == KVP_OK) st = copy_as(cm, dn, buf, (int64_t)one, cm->wdt, "the experts' down");
    }
    kvp_free(buf);
    *mf = MF;
    return st;
}

/* The MoE shapes the device layer routes (kvp_cudev_moe_ffn), else KVP_EUNSUPPORTED naming the limit. */
static kvp_status moe_supported(const kvp_model_config *c)
{
    if (c->num_experts < 1) return KVP_OK;
    if (c->num_shared_experts > 0 || c->family == KVP_FAMILY_DEEPSEEK)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: shared experts and MLA (deepseek) are not on the device");
    if (c->num_experts > KVP_CUDEV_MOE_MAX_E || c->num_experts_per_tok > KVP_CUDEV_MOE_MAX_K ||
        c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: %d experts, %d per token: the device routes at most %d "
                                         "experts and %d per token", c->num_experts, c->num_experts_per_tok,
                       (int)KVP_CUDEV_MOE_MAX_E, (int)KVP_CUDEV_MOE_MAX_K);
    return KVP_OK;
}

/* Two optional bias vectors concatenated with zeros where one is missing; NULL when all are. */
static kvp_status upload_bqkv(kvp_cuda_model *cm, const kvp_model_layer_vecs *v, int64_t QD, int64_t KD, float **dst)
{
    *dst = NULL;
    if (!v->bq && !v->bk && !v->bv) return KVP_OK;
    float *b = kvp_calloc((size_t)(QD + 2 * KD), sizeof(float));
    if (!b) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    if (v->bq) memcpy(b, v->bq, (size_t)QD * sizeof(float));
    if (v->bk) memcpy(b + QD, v->bk, (size_t)KD * sizeof(float));
    if (v->bv) memcpy(b + QD + KD, v->bv, (size_t)KD * sizeof(float));
    kvp_status st = upload_as(cm, (void **)dst, b, QD + 2 * KD, KVP_DTYPE_F32, "the QKV bias");
    kvp_free(b);
    return st;
}

static kvp_status rope_tables(kvp_cuda_model *cm, const double *inv, const double *local, double scale, int32_t rot)
{
    cm->rot = rot;
    cm->rope_scale = scale;
    const size_t n = (size_t)(rot / 2 > 0 ? rot / 2 : 1);
    if (!(cm->inv_freq = kvp_calloc(n, sizeof(double)))) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    memcpy(cm->inv_freq, inv, (size_t)(rot / 2) * sizeof(double));
    if (local) {
        if (!(cm->inv_freq_local = kvp_calloc(n, sizeof(double)))) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
        memcpy(cm->inv_freq_local, local, (size_t)(rot / 2) * sizeof(double));
    }
    return KVP_OK;
}

/* The weights of a loaded model on the device as wdt. */
static kvp_status cu_model_upload(kvp_cudev *d, kvp_model *m, kvp_dtype wdt, kvp_cuda_model **out)
{
    KVP_TRY(kvp_model_export_check(m));
    KVP_TRY(moe_supported(kvp_model_cfg(m)));
    kvp_cuda_model *cm = kvp_calloc(1, sizeof *cm);
    if (!cm) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    cm->cfg = *kvp_model_cfg(m);
    kvp_model_shard(m, &cm->tp);
    cm->dev = d;
    cm->wdt = wdt;
    cm->rope_style = kvp_model_rope_style(m) == KVP_ROPE_PAIRS ? 0 : 1;
    cm->max_len = kvp_model_max_len(m);
    const kvp_model_config *c = &cm->cfg;
    /* the shard the loader holds (parallel/shard.h): its matrices are already this rank's rows and columns */
    const int64_t H = c->hidden_size, hd = c->head_dim, QD = (int64_t)cm->tp.nq * hd, KD = (int64_t)cm->tp.nkv * hd;
    const int64_t V = cm->tp.nv;
    kvp_model_rope r;
    kvp_model_rope_of(m, &r);
    kvp_status st = rope_tables(cm, r.inv_freq, r.inv_freq_local, r.scale, r.rot);
    if (st == KVP_OK && !(cm->layers = kvp_calloc((size_t)c->num_layers, sizeof *cm->layers)))
        st = KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    if (st == KVP_OK) st = upload_as(cm, &cm->embed, kvp_model_embed_f32(m), V * H, wdt, "the embedding");
    if (st == KVP_OK) st = upload_vec(cm, &cm->out_norm, kvp_model_out_norm_f32(m), H, "the final norm");
    if (st == KVP_OK) {
        const kvp_mat_id lm = KVP_MAT_LM_HEAD;
        st = c->tie_word_embeddings ? KVP_OK : upload_stacked(cm, m, 0, &lm, 1, &cm->lm_head, "the LM head");
        if (c->tie_word_embeddings) cm->lm_head = cm->embed;
    }
    for (int32_t l = 0; st == KVP_OK && l < c->num_layers; l++) {
        cu_layer *w = &cm->layers[l];
        kvp_model_layer_vecs v;
        static const kvp_mat_id qkv[3] = {KVP_MAT_Q, KVP_MAT_K, KVP_MAT_V}, gu[2] = {KVP_MAT_GATE, KVP_MAT_UP};
        static const kvp_mat_id o[1] = {KVP_MAT_O}, dn[1] = {KVP_MAT_DOWN};
        st = kvp_model_layer_vecs_of(m, l, &v);
        if (st == KVP_OK) st = upload_stacked(cm, m, l, qkv, 3, &w->wqkv, "the QKV projection");
        if (st == KVP_OK) st = upload_stacked(cm, m, l, o, 1, &w->wo, "o_proj");
        if (st == KVP_OK && v.n_experts) {
            cm->n_experts = v.n_experts;
            st = upload_vec(cm, &w->router, kvp_model_router_f32(m, l), (int64_t)v.n_experts * H, "the router");
            if (st == KVP_OK) st = upload_experts(cm, m, l, v.n_experts, w, &cm->moe_mf);
        } else {
            if (st == KVP_OK) st = upload_stacked(cm, m, l, gu, 2, &w->wgu, "gate/up");
            if (st == KVP_OK) st = upload_stacked(cm, m, l, dn, 1, &w->wdown, "down");
        }
        if (st == KVP_OK) st = upload_bqkv(cm, &v, QD, KD, &w->bqkv);
        if (st == KVP_OK) st = upload_vec(cm, &w->bo, v.bo, H, "o_proj's bias");
        if (st == KVP_OK) st = upload_vec(cm, &w->attn_norm, v.attn_norm, H, "a norm");
        if (st == KVP_OK) st = upload_vec(cm, &w->ffn_norm, v.ffn_norm, H, "a norm");
        if (st == KVP_OK) st = upload_vec(cm, &w->q_norm, v.q_norm, hd, "q_norm");
        if (st == KVP_OK) st = upload_vec(cm, &w->k_norm, v.k_norm, hd, "k_norm");
        if (st == KVP_OK) st = upload_vec(cm, &w->post_attn_norm, v.post_attn_norm, H, "a norm");
        if (st == KVP_OK) st = upload_vec(cm, &w->post_ffn_norm, v.post_ffn_norm, H, "a norm");
        w->window_left = v.window_left;
    }
    if (st != KVP_OK) {
        cu_model_free(cm);
        return st;
    }
    *out = cm;
    return KVP_OK;
}

/* Seeded random bf16 weights of cfg's shape, made on the device: matrices uniform in +-1/sqrt(inputs) (a
 * variance that keeps activations of order 1 through the layers), norms 1, no biases; an MoE layer's router
 * f32 of the same spread, its experts as its matrices. */
static kvp_status cu_model_random(kvp_cudev *d, const kvp_model_config *cfg, uint64_t seed, kvp_cuda_model **out)
{
    if (cfg->family == KVP_FAMILY_OPT || cfg->kv_lora_rank > 0)
        return KVP_ERR(KVP_EUNSUPPORTED, "--random-weights: %s: learned positions (opt) and MLA (deepseek) are not "
                                         "on the device", cfg->model_type);
    KVP_TRY(moe_supported(cfg));
    kvp_cuda_model *cm = kvp_calloc(1, sizeof *cm);
    if (!cm) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    cm->cfg = *cfg;
    cm->dev = d;
    cm->wdt = KVP_DTYPE_BF16;
    cm->rope_style = 1; /* Hugging Face's rotate-half */
    const kvp_model_config *c = &cm->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim, QD = c->num_q_heads * hd, KD = c->num_kv_heads * hd;
    const int64_t V = c->vocab_size, FF = c->intermediate_size, E = c->num_experts, MF = c->moe_intermediate_size;
    cm->n_experts = c->num_experts;
    cm->moe_mf = MF;
    cm->tp = (kvp_tp_shard){.tp = 1, .nq = c->num_q_heads, .nkv = c->num_kv_heads, .kv_replicas = 1, .nff = FF,
                            .nv = V, .vpad = V}; /* one rank holds everything */
    const int64_t ctx = kvp_model_config_context(c);
    cm->max_len = ctx > 0 && ctx < INT32_MAX ? (int32_t)ctx : 4096;
    const int32_t rot = kvp_rotary_dim(c);
    double inv[1024], scale = 1;
    kvp_status st = rot / 2 <= 1024 ? KVP_OK : KVP_ERR(KVP_EUNSUPPORTED, "--random-weights: rotary_dim %d", rot);
    if (st == KVP_OK) {
        kvp_rope_frequencies(c, cm->max_len, inv, &scale);
        st = rope_tables(cm, inv, NULL, scale, rot);
    }
    if (st == KVP_OK && !(cm->layers = kvp_calloc((size_t)c->num_layers, sizeof *cm->layers)))
        st = KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    uint64_t tensor = 0;
#define RAND_AS(ptr, n, in, dt, what)                                                                                \
    do {                                                                                                             \
        const size_t es_ = (dt) == KVP_DTYPE_F32 ? 4 : 2;                                                            \
        if (st == KVP_OK) st = kvp_cudev_malloc(d, (void **)&(ptr), (size_t)(n) * es_, what);                        \
        if (st == KVP_OK) st = kvp_cudev_random(d, (ptr), (dt), (n), seed * 1000003u + tensor++,                     \
                                                (float)(1.0 / sqrt((double)(in))));                                  \
        cm->weight_bytes += (int64_t)(n) * (int64_t)es_;                                                             \
    } while (0)
#define RAND_MAT(ptr, n, in, what) RAND_AS(ptr, n, in, KVP_DTYPE_BF16, what)
#define ONES(ptr, n)                                                                                                 \
    do {                                                                                                             \
        if (st == KVP_OK) st = kvp_cudev_malloc(d, (void **)&(ptr), (size_t)(n) * 4, "a norm");                      \
        if (st == KVP_OK) st = kvp_cudev_fill(d, (ptr), KVP_DTYPE_F32, (n), 1.0f);                                   \
        cm->weight_bytes += (int64_t)(n) * 4;                                                                        \
    } while (0)
    RAND_MAT(cm->embed, V * H, 1, "the embedding");
    if (c->tie_word_embeddings) cm->lm_head = cm->embed;
    else RAND_MAT(cm->lm_head, V * H, H, "the LM head");
    ONES(cm->out_norm, H);
    for (int32_t l = 0; st == KVP_OK && l < c->num_layers; l++) {
        cu_layer *w = &cm->layers[l];
        w->window_left = -1;
        RAND_MAT(w->wqkv, (QD + 2 * KD) * H, H, "the QKV projection");
        RAND_MAT(w->wo, H * QD, QD, "o_proj");
        if (E > 0 && c->layer_is_moe[l]) {
            RAND_AS(w->router, E * H, H, KVP_DTYPE_F32, "the router");
            RAND_MAT(w->wgu_e, E * 2 * MF * H, H, "the experts' gate/up");
            RAND_MAT(w->wdown_e, E * H * MF, MF, "the experts' down");
        } else {
            RAND_MAT(w->wgu, 2 * FF * H, H, "gate/up");
            RAND_MAT(w->wdown, H * FF, FF, "down");
        }
        ONES(w->attn_norm, H);
        ONES(w->ffn_norm, H);
    }
#undef RAND_MAT
#undef RAND_AS
#undef ONES
    if (st == KVP_OK) st = kvp_cudev_sync(d, 0);
    if (st != KVP_OK) {
        cu_model_free(cm);
        return st;
    }
    *out = cm;
    return KVP_OK;
}

/* ---------------------------------------------------------------- the executor */

typedef struct {
    float *x, *h, *qkv, *o, *gu, *act, *fin, *logits; /* device activations */
    float *qc;                                        /* (T, QD) q packed for the paged kernels, or NULL */
    void *split;                                      /* decode's split-KV workspace (paged), split_bytes */
    size_t split_bytes;
    float *gather;                                    /* tp > 1: (tp, S, vpad) the ranks' logits slices */
    void *scratch;                                    /* bf16 GEMM input */
    void *pack;                                       /* the step pack on the device */
    void *moe;                                        /* kvp_cudev_moe_ffn's workspace, moe_bytes (MoE models) */
    size_t moe_bytes;
    int64_t T, S;                                     /* rows they hold */
    size_t pack_cap;
} cu_ws;

typedef struct {
    kvp_cudev *dev;
    kvp_cudev_info dinfo;
    kvp_cuda_model *cm;
    int owns_model;
    kvp_cuda_info info;
    kvp_dtype kv_dtype;
    int32_t num_blocks, block_size, num_host_blocks;
    void *kv_all;             /* one device allocation: every layer's K then V */
    kvp_cudev_pool *pools;    /* (num_layers) */
    void **d_pool_ptrs;       /* (2 layers) device array of the pools, for copy_blocks */
    void *host_all;           /* pinned host pools (swap and host tier), same layout */
    size_t pool_bytes;        /* one pool (K or V) of one layer */
    size_t block_bytes_pool;  /* one block of one pool */
    cu_ws ws;
    void *h_pack;             /* pinned */
    size_t h_pack_cap;
    float *h_logits;          /* pinned (rows, vocab) */
    size_t h_logits_cap;
    int32_t buckets[KVP_CUDA_MAX_BUCKETS], n_buckets;
    /* CUDA graphs: graphs[i] replays the forward pass of a buckets[i]-row step over the pack at graph_pack
     * (captured with layout graph_lay[i]); all are dropped when the pack's device buffer moves. tp > 1 runs
     * eagerly (its collectives go through the communicator, which a capture here does not record). */
    kvp_cudev_graph *graphs[KVP_CUDA_MAX_BUCKETS];
    kvp_cuda_pack_layout graph_lay[KVP_CUDA_MAX_BUCKETS];
    uint8_t graph_failed[KVP_CUDA_MAX_BUCKETS]; /* 1: its capture failed; the bucket runs eagerly */
    void *graph_pack;
    int profiling;            /* 1: the profiling pass (no KV, no attention, no collectives) */
    int paged;                /* 1: attention/cuda's kernels (kvp_cuda_attention) */
    kvp_comm *comm;           /* tp > 1: the model's nccl communicator (borrowed); else NULL */
    int tp, rank;
} cu_ctx;

static void ws_free(cu_ctx *c)
{
    cu_ws *w = &c->ws;
    void *ps[] = {w->x,       w->h,       w->qkv,  w->o,  w->gu,   w->act, w->fin,
                  w->logits,  w->gather,  w->scratch, w->pack, w->qc, w->split, w->moe};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(c->dev, ps[i]);
    memset(w, 0, sizeof *w);
}

/* Activations for T rows, S logits rows; returns their bytes in *bytes. */
static kvp_status ws_alloc(cu_ctx *c, int64_t T, int64_t S, int64_t *bytes)
{
    const kvp_model_config *m = &c->cm->cfg;
    const kvp_tp_shard *sh = &c->cm->tp;
    const int64_t H = m->hidden_size, hd = m->head_dim, QD = sh->nq * hd, KD = sh->nkv * hd;
    const int64_t FF = sh->nff, V = c->tp > 1 ? sh->vpad : m->vocab_size; /* a logits row's stride */
    int64_t Kmax = H > QD ? H : QD;
    Kmax = Kmax > FF ? Kmax : FF;
    cu_ws *w = &c->ws;
    int64_t total = 0;
    kvp_status st = KVP_OK;
#define WS(ptr, n, es)                                                                                               \
    do {                                                                                                             \
        if (st == KVP_OK) st = kvp_cudev_malloc(c->dev, (void **)&(ptr), (size_t)(n) * (es), "activations");         \
        total += (int64_t)(n) * (es);                                                                                \
    } while (0)
    WS(w->x, T * H, 4);
    WS(w->h, T * H, 4);
    WS(w->qkv, T * (QD + 2 * KD), 4);
    WS(w->o, T * QD, 4);
    WS(w->gu, T * 2 * FF, 4);
    WS(w->act, T * FF, 4);
    WS(w->fin, S * H, 4);
    WS(w->logits, S * V, 4);
    if (c->tp > 1) WS(w->gather, c->tp * S * V, 4);
    WS(w->scratch, T * Kmax, 2);
    if (c->paged) {
        WS(w->qc, T * QD, 4);
        /* a decode step has at most S sequences (max_num_seqs, or the largest graph bucket) */
        w->split_bytes = kvp_cudev_paged_workspace_bytes((int32_t)S, (int32_t)m->num_q_heads, (int32_t)hd);
        WS(w->split, w->split_bytes, 1);
    }
    if (c->cm->n_experts) {
        w->moe_bytes = kvp_cudev_moe_workspace_bytes(T, H, c->cm->n_experts, m->num_experts_per_tok, c->cm->moe_mf);
        WS(w->moe, w->moe_bytes, 1);
    }
#undef WS
    w->T = T;
    w->S = S;
    if (st != KVP_OK) ws_free(c);
    *bytes = total;
    return st;
}

/* Sums the ranks' partial results (T, H) on the compute stream, in order with the kernels: after the embedding
 * and after each row-parallel GEMM. Nothing at tp 1, nor in the profiling pass (each rank profiles alone at
 * start-up, before the others have an executor). */
static kvp_status tp_sum(cu_ctx *c, float *d_x, int64_t n)
{
    return c->tp > 1 && !c->profiling ? kvp_comm_all_reduce_sum_f32(c->comm, d_x, n) : KVP_OK;
}

/* The logits rows r0 .. r0 + n of a vocab-parallel LM head: every rank's (n, vpad) slice is gathered, and
 * rank 0 copies slice k into columns [k vpad, k vpad + nv_k) of the host rows (the last slice may be short). */
static kvp_status tp_logits(cu_ctx *c, int32_t r0, int64_t n)
{
    const int64_t V = c->cm->cfg.vocab_size, vp = c->cm->tp.vpad;
    KVP_TRY(kvp_comm_all_gather_f32(c->comm, c->ws.logits, n * vp, c->ws.gather));
    for (int32_t k = 0; c->rank == 0 && k < c->tp; k++) {
        const int64_t v0 = k * vp, nv = V - v0 < vp ? V - v0 : vp;
        if (nv > 0)
            KVP_TRY(kvp_cudev_copy_2d(c->dev, c->h_logits + (size_t)r0 * (size_t)V + (size_t)v0, (size_t)V * sizeof(float),
                                      c->ws.gather + (size_t)k * (size_t)(n * vp), (size_t)vp * sizeof(float),
                                      (size_t)nv * sizeof(float), (size_t)n, 1));
    }
    return KVP_OK;
}

/* One step's forward pass over the pack on the device (laid out as lay), on this rank's shard. bucket 0: the
 * LM head over the S logits rows (in chunks of ws.S), each chunk copied to h_logits, then the stream is waited
 * for. bucket 1 (a decode step padded to its graph bucket; tp 1 only): the LM head over all T rows at once into
 * ws.logits, nothing copied back, nothing waited for, no host read of a device value: the whole call can be
 * captured. */
static kvp_status forward(cu_ctx *c, const kvp_cuda_pack_layout *lay, int bucket)
{
    kvp_cudev *d = c->dev;
    const kvp_cuda_model *cm = c->cm;
    const kvp_model_config *m = &cm->cfg;
    const int64_t H = m->hidden_size, hd = m->head_dim, nq = cm->tp.nq, nkv = cm->tp.nkv;
    const int64_t QD = nq * hd, KD = nkv * hd, QKV = QD + 2 * KD, FF = cm->tp.nff, V = m->vocab_size;
    const int64_t NV = cm->tp.nv, LD = c->tp > 1 ? cm->tp.vpad : V; /* LM head rows held; a logits row's stride */
    const int64_t T = lay->T;
    const float eps = (float)m->rms_norm_eps;
    cu_ws *w = &c->ws;
    char *pk = w->pack;
    const int64_t *slots = (const int64_t *)(pk + lay->off_slots);
    const int32_t *tokens = (const int32_t *)(pk + lay->off_tokens), *kv_begin = (const int32_t *)(pk + lay->off_kv_begin);
    const int32_t *len = (const int32_t *)(pk + lay->off_len), *indices = (const int32_t *)(pk + lay->off_indices);
    const int32_t *rows = (const int32_t *)(pk + lay->off_rows);
    const float *cs = (const float *)(pk + lay->off_cs), *csl = lay->local ? (const float *)(pk + lay->off_csl) : cs;
    const kvp_cudev_pages pages = {.nseq = lay->N, .decode = lay->decode, .chunk = KVP_CUDA_DECODE_CHUNK,
                                   .d_indptr = (const int32_t *)(pk + lay->off_seq_indptr), .d_indices = indices,
                                   .d_last = (const int32_t *)(pk + lay->off_seq_last),
                                   .d_qo = (const int32_t *)(pk + lay->off_seq_qo), .d_split_ws = w->split,
                                   .split_ws_bytes = w->split_bytes};
    const float emb_scale = m->family == KVP_FAMILY_GEMMA2 ? sqrtf((float)H) : 1.0f;
    const float sm_scale = m->query_pre_attn_scalar > 0 ? (float)(1.0 / sqrt(m->query_pre_attn_scalar))
                                                        : (float)(1.0 / sqrt((double)hd));
    KVP_TRY(kvp_cudev_embed(d, w->x, cm->embed, cm->wdt, tokens, T, H, emb_scale, cm->tp.v0, NV));
    KVP_TRY(tp_sum(c, w->x, T * H)); /* vocab-parallel embedding: one rank holds each row */
    for (int32_t l = 0; l < m->num_layers; l++) {
        const cu_layer *L = &cm->layers[l];
        float *q = w->qkv, *k = w->qkv + QD, *v = w->qkv + QD + KD;
        KVP_TRY(kvp_cudev_rmsnorm(d, w->h, H, w->x, H, L->attn_norm, T, 1, H, eps, NULL));
        KVP_TRY(kvp_cudev_gemm(d, w->qkv, QKV, w->h, H, L->wqkv, cm->wdt, T, QKV, H, w->scratch));
        if (L->bqkv) KVP_TRY(kvp_cudev_bias(d, w->qkv, QKV, L->bqkv, T, QKV));
        if (L->q_norm) {
            KVP_TRY(kvp_cudev_rmsnorm(d, q, QKV, q, QKV, L->q_norm, T, nq, hd, eps, NULL));
            KVP_TRY(kvp_cudev_rmsnorm(d, k, QKV, k, QKV, L->k_norm, T, nkv, hd, eps, NULL));
        }
        const float *lcs = m->layer_is_sliding[l] ? csl : cs;
        KVP_TRY(kvp_cudev_rope(d, q, QKV, T, nq, hd, cm->rot, cm->rope_style, lcs));
        KVP_TRY(kvp_cudev_rope(d, k, QKV, T, nkv, hd, cm->rot, cm->rope_style, lcs));
        if (!c->profiling) {
            KVP_TRY(kvp_cudev_append_kv(d, &c->pools[l], k, v, QKV, slots, T));
            if (c->paged)
                KVP_TRY(kvp_cudev_paged_attention(d, &c->pools[l], q, QKV, w->qc, w->o, T, nq, &pages, L->window_left,
                                                  sm_scale, (float)m->attn_logit_softcapping));
            else
                KVP_TRY(kvp_cudev_attention(d, &c->pools[l], q, QKV, w->o, T, nq, kv_begin, len, indices,
                                            L->window_left, sm_scale, (float)m->attn_logit_softcapping));
        }
        KVP_TRY(kvp_cudev_gemm(d, w->h, H, w->o, QD, L->wo, cm->wdt, T, H, QD, w->scratch));
        KVP_TRY(tp_sum(c, w->h, T * H));
        if (L->bo) KVP_TRY(kvp_cudev_bias(d, w->h, H, L->bo, T, H));
        if (L->post_attn_norm) KVP_TRY(kvp_cudev_rmsnorm(d, w->h, H, w->h, H, L->post_attn_norm, T, 1, H, eps, NULL));
        KVP_TRY(kvp_cudev_add(d, w->x, w->h, T * H));
        KVP_TRY(kvp_cudev_rmsnorm(d, w->h, H, w->x, H, L->ffn_norm, T, 1, H, eps, NULL));
        if (L->router) {
            KVP_TRY(kvp_cudev_moe_ffn(d, w->h, w->h, L->router, L->wgu_e, L->wdown_e, cm->wdt, T, H, cm->n_experts,
                                      m->num_experts_per_tok, cm->moe_mf, m->moe_norm_topk, w->moe, w->moe_bytes));
        } else {
            KVP_TRY(kvp_cudev_gemm(d, w->gu, 2 * FF, w->h, H, L->wgu, cm->wdt, T, 2 * FF, H, w->scratch));
            KVP_TRY(kvp_cudev_glu(d, m->ffn_act, w->act, w->gu, w->gu + FF, 2 * FF, T, FF));
            KVP_TRY(kvp_cudev_gemm(d, w->h, H, w->act, FF, L->wdown, cm->wdt, T, H, FF, w->scratch));
        }
        KVP_TRY(tp_sum(c, w->h, T * H));
        if (L->post_ffn_norm) KVP_TRY(kvp_cudev_rmsnorm(d, w->h, H, w->h, H, L->post_ffn_norm, T, 1, H, eps, NULL));
        KVP_TRY(kvp_cudev_add(d, w->x, w->h, T * H));
    }
    if (bucket) {
        if (c->tp > 1) return KVP_ERR(KVP_EINVAL, "cuda executor: internal error: a graph bucket at tp %d", c->tp);
        if (lay->T > w->S)
            return KVP_ERR(KVP_EINVAL, "cuda executor: a %d-row bucket above the %lld logits rows sized", lay->T,
                           (long long)w->S);
        KVP_TRY(kvp_cudev_rmsnorm(d, w->fin, H, w->x, H, cm->out_norm, T, 1, H, eps, rows));
        KVP_TRY(kvp_cudev_gemm(d, w->logits, V, w->fin, H, cm->lm_head, cm->wdt, T, V, H, w->scratch));
        return kvp_cudev_softcap(d, w->logits, T * V, (float)m->final_logit_softcapping);
    }
    /* The LM head over the logits rows, w->S at a time, each chunk copied back to the host. */
    for (int32_t r0 = 0; r0 < lay->S; r0 += (int32_t)w->S) {
        const int64_t n = lay->S - r0 < w->S ? lay->S - r0 : w->S;
        KVP_TRY(kvp_cudev_rmsnorm(d, w->fin, H, w->x, H, cm->out_norm, n, 1, H, eps, rows + r0));
        KVP_TRY(kvp_cudev_gemm(d, w->logits, LD, w->fin, H, cm->lm_head, cm->wdt, n, NV, H, w->scratch));
        KVP_TRY(kvp_cudev_softcap(d, w->logits, n * LD, (float)m->final_logit_softcapping));
        if (c->profiling) continue;
        if (c->tp > 1) KVP_TRY(tp_logits(c, r0, n));
        else KVP_TRY(kvp_cudev_copy(d, c->h_logits + (size_t)r0 * (size_t)V, w->logits, (size_t)(n * V) * sizeof(float), 1));
    }
    if (c->tp > 1 && !c->profiling) KVP_TRY(kvp_comm_wait(c->comm)); /* NCCL's errors and deadline first */
    return kvp_cudev_sync(d, 0);
}

static kvp_cuda_pack_model pack_model(const cu_ctx *c)
{
    const kvp_cuda_model *cm = c->cm;
    return (kvp_cuda_pack_model){.vocab = cm->cfg.vocab_size, .max_len = cm->max_len, .num_blocks = c->num_blocks,
                                 .block_size = c->block_size, .inv_freq = cm->inv_freq,
                                 .inv_freq_local = cm->inv_freq_local, .rope_scale = cm->rope_scale, .rot = cm->rot};
}

/* Grows a pinned host buffer. */
static kvp_status host_grow(cu_ctx *c, void **p, size_t *cap, size_t need, const char *what)
{
    if (need <= *cap) return KVP_OK;
    void *n;
    KVP_TRY(kvp_cudev_host_alloc(c->dev, &n, need, what));
    kvp_cudev_host_free(c->dev, *p);
    *p = n;
    *cap = need;
    return KVP_OK;
}

static void graphs_drop(cu_ctx *c)
{
    for (int32_t i = 0; i < KVP_CUDA_MAX_BUCKETS; i++) {
        kvp_cudev_graph_destroy(c->dev, c->graphs[i]);
        c->graphs[i] = NULL;
    }
    c->graph_pack = NULL;
}

/* Whether two packs put every section the forward pass reads at the same place. */
static int same_graph_layout(const kvp_cuda_pack_layout *a, const kvp_cuda_pack_layout *b)
{
    return a->T == b->T && a->rot == b->rot && a->local == b->local && a->off_slots == b->off_slots &&
           a->off_tokens == b->off_tokens && a->off_kv_begin == b->off_kv_begin && a->off_len == b->off_len &&
           a->off_rows == b->off_rows && a->off_cs == b->off_cs && a->off_csl == b->off_csl &&
           a->off_indices == b->off_indices && a->N == b->N && a->decode == b->decode &&
           a->off_seq_indptr == b->off_seq_indptr && a->off_seq_last == b->off_seq_last && a->off_seq_qo == b->off_seq_qo;
}

/* The step pack's device buffer at least `need` bytes: a new buffer of `cap` >= need bytes when it must grow,
 * dropping every captured graph (each points into the old one; bucket_forward captures again). */
static kvp_status pack_reserve(cu_ctx *c, size_t need, size_t cap)
{
    if (need <= c->ws.pack_cap) return KVP_OK;
    graphs_drop(c);
    kvp_cudev_free(c->dev, c->ws.pack);
    c->ws.pack = NULL;
    c->ws.pack_cap = 0;
    KVP_TRY(kvp_cudev_malloc(c->dev, &c->ws.pack, cap, "the step pack"));
    c->ws.pack_cap = cap;
    return KVP_OK;
}

/* Records bucket bi's forward pass over the pack laid out as lay into graphs[bi] (nothing runs). A capture
 * that fails (a call the device refuses to capture) leaves a warning and the bucket eager (graph_failed). */
static void capture_bucket(cu_ctx *c, int32_t bi, const kvp_cuda_pack_layout *lay)
{
    const double t0 = kvp_now_s();
    kvp_status st = kvp_cudev_capture_begin(c->dev);
    if (st == KVP_OK) {
        st = forward(c, lay, 1);
        const kvp_status se = kvp_cudev_capture_end(c->dev, st == KVP_OK ? &c->graphs[bi] : NULL);
        if (st == KVP_OK) st = se;
    }
    if (st != KVP_OK) {
        KVP_LOG_W("cuda executor: the CUDA graph of the %d-row bucket was not captured (%s); its steps run eagerly",
                  lay->T, kvp_error_message());
        kvp_error_clear();
        c->graph_failed[bi] = 1;
        return;
    }
    c->graph_lay[bi] = *lay;
    c->info.graphs_captured++;
    c->info.graph_capture_s += kvp_now_s() - t0;
}

/* The forward pass of a decode step padded to bucket buckets[bi], its pack already uploaded: the bucket's
 * graph (captured at start-up, capture_all; again on first use after the pack's buffer moved, since a graph
 * holds the pack's address), launched. A bucket whose capture failed runs eagerly: the captured work never
 * ran, so the step runs it now. */
static kvp_status bucket_forward(cu_ctx *c, int32_t bi, const kvp_cuda_pack_layout *lay)
{
    if (c->graph_pack != c->ws.pack) { /* the pack's buffer grew: every graph points into the old one */
        graphs_drop(c);
        c->graph_pack = c->ws.pack;
    }
    if (!c->graphs[bi] && !c->graph_failed[bi]) capture_bucket(c, bi, lay);
    if (c->graph_failed[bi]) return forward(c, lay, 1);
    if (!same_graph_layout(&c->graph_lay[bi], lay))
        return KVP_ERR(KVP_EINVAL, "cuda executor: internal error: a %d-row pack laid out unlike its graph's", lay->T);
    KVP_TRY(kvp_cudev_graph_launch(c->dev, c->graphs[bi]));
    c->info.graph_replays++;
    return KVP_OK;
}

/* Every bucket's graph at start-up, as vLLM captures them (none at tp > 1): bucket i's over a pack laid out as
 * a decode step of buckets[i] sequences lays it out (the offsets a graph reads depend on the row count only;
 * nothing runs, so the pack's contents do not matter), in a pack buffer sized for the largest bucket with every
 * block and max_seqs copies in it, so that steps rarely move it (a move drops the graphs; each is captured again
 * on its bucket's next step). A failed capture leaves its bucket eager; only allocations fail the call. */
static kvp_status capture_all(cu_ctx *c, int32_t max_seqs)
{
    if (!c->n_buckets || c->tp > 1) return KVP_OK;
    const int32_t Tm = c->buckets[c->n_buckets - 1];
    kvp_exec_seq *seqs = kvp_calloc((size_t)Tm, sizeof *seqs);
    int32_t *ints = kvp_calloc((size_t)Tm * 6 + 2, sizeof(int32_t)); /* tok, pos, idx, last, qo, kvi */
    int64_t *slot = kvp_calloc((size_t)Tm, sizeof(int64_t));
    kvp_status st = seqs && ints && slot ? KVP_OK : KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    int32_t *tok = ints, *pos = tok + Tm, *idx = pos + Tm, *last = idx + Tm, *qo = last + Tm, *kvi = qo + Tm + 1;
    for (int32_t s = 0; st == KVP_OK && s <= Tm; s++) qo[s] = kvi[s] = s;
    for (int32_t s = 0; st == KVP_OK && s < Tm; s++) { /* sequence s: token 0 at position 0 in block 0 */
        last[s] = 1;
        seqs[s] = (kvp_exec_seq){.req_id = s, .num_new = 1, .sample = 1, .tokens = tok + s, .block_table = idx + s,
                                 .num_blocks = 1};
    }
    const kvp_cuda_pack_model pm = pack_model(c);
    for (int32_t bi = c->n_buckets - 1; st == KVP_OK && bi >= 0; bi--) { /* the largest first: it sizes the pack */
        const int32_t n = c->buckets[bi];
        kvp_exec_batch b = {.seqs = seqs, .n = n, .block_size = c->block_size,
                            .flat = {.num_tokens = n, .tokens = tok, .positions = pos, .slot_mapping = slot,
                                     .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last,
                                     .num_rows = n}};
        kvp_cuda_pack_layout lay;
        st = kvp_cuda_pack_plan(&b, &pm, n, &lay);
        const size_t cap = lay.bytes + align16((size_t)c->num_blocks * 4) + align16((size_t)max_seqs * 8);
        if (st == KVP_OK && bi == c->n_buckets - 1) st = pack_reserve(c, cap, cap);
        c->graph_pack = c->ws.pack;
        if (st == KVP_OK) capture_bucket(c, bi, &lay);
    }
    kvp_free(seqs);
    kvp_free(ints);
    kvp_free(slot);
    return st;
}

/* Block moves between device pools and host pools, on the copy stream, layer by layer. */
static kvp_status move_blocks(void *ctx, const kvp_block_copy *mv, int32_t n, int to_host)
{
    cu_ctx *c = ctx;
    if (n == 0) return KVP_OK;
    if (!c->host_all)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: a move to or from the host, but no host blocks were given");
    const int32_t layers = c->cm->cfg.num_layers;
    const size_t bb = c->block_bytes_pool;
    for (int32_t i = 0; i < n; i++) {
        const int32_t dev_b = to_host ? mv[i].src : mv[i].dst, host_b = to_host ? mv[i].dst : mv[i].src;
        if (dev_b < 0 || dev_b >= c->num_blocks || host_b < 0 || host_b >= c->num_host_blocks)
            return KVP_ERR(KVP_EINVAL, "cuda executor: a move of block %d <-> host block %d outside the pools", dev_b,
                           host_b);
        for (int32_t p = 0; p < 2 * layers; p++) {
            char *dv = (char *)c->kv_all + (size_t)p * c->pool_bytes + (size_t)dev_b * bb;
            char *hv = (char *)c->host_all + (size_t)p * ((size_t)c->num_host_blocks * bb) + (size_t)host_b * bb;
            KVP_TRY(to_host ? kvp_cudev_copy_async(c->dev, hv, dv, bb, 1) : kvp_cudev_copy_async(c->dev, dv, hv, bb, 0));
        }
    }
    return KVP_OK;
}

static kvp_status step(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    cu_ctx *c = ctx;
    const double t0 = kvp_now_s();
    if (b->n > 0 && b->block_size != c->block_size)
        return KVP_ERR(KVP_EINVAL, "cuda executor: block size %d, the engine uses %d (or contiguous allocation)",
                       c->block_size, b->block_size);
    KVP_TRY(kvp_exec_batch_moves(b, c, move_blocks));
    KVP_TRY(kvp_cudev_sync(c->dev, 1)); /* loads fill blocks this step reads; stores finish before reuse */
    out->logits = NULL;
    out->vocab = (int32_t)c->cm->cfg.vocab_size;
    for (int32_t i = 0; i < b->n; i++)
        if (!b->seqs[i].tokens)
            return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: request %lld has no token ids (a %d-token chunk at %d)",
                           (long long)b->seqs[i].req_id, b->seqs[i].num_new, b->seqs[i].context_len);
    for (int32_t i = 0; i < b->ops.n_copies; i++)
        if (b->ops.copies[i].src < 0 || b->ops.copies[i].src >= c->num_blocks || b->ops.copies[i].dst < 0 ||
            b->ops.copies[i].dst >= c->num_blocks)
            return KVP_ERR(KVP_EINVAL, "cuda executor: a copy of block %d to %d outside the pool", b->ops.copies[i].src,
                           b->ops.copies[i].dst);
    /* A pure decode step runs at its CUDA-graph bucket's size. */
    int decode = b->n > 0;
    for (int32_t i = 0; i < b->n && decode; i++) decode = b->seqs[i].num_new == 1 && !b->seqs[i].all_logits;
    int32_t T_pad = 0, bi = -1;
    if (decode && c->n_buckets) {
        const int32_t bk = kvp_cuda_graph_bucket(c->buckets, c->n_buckets, b->flat.num_tokens);
        T_pad = bk > 0 && bk <= c->ws.T && bk <= c->ws.S ? bk : 0;
        for (int32_t i = 0; T_pad && c->tp == 1 && i < c->n_buckets; i++) /* tp > 1: padded, eager */
            if (c->buckets[i] == T_pad) bi = i;
    }
    if (b->n == 0 && b->ops.n_copies == 0) goto done;
    const kvp_cuda_pack_model pm = pack_model(c);
    kvp_cuda_pack_layout lay;
    if (b->n > 0) {
        KVP_TRY(kvp_cuda_pack_plan(b, &pm, T_pad, &lay));
        if (lay.T > c->ws.T)
            return KVP_ERR(KVP_EINVAL, "cuda executor: a step of %d tokens, above the %lld it was sized for", lay.T,
                           (long long)c->ws.T);
    } else { /* copies alone: a pack of pairs only */
        memset(&lay, 0, sizeof lay);
        lay.C = b->ops.n_copies;
        lay.off_pairs = 0;
        lay.bytes = align16(2 * (size_t)lay.C * sizeof(int32_t));
    }
    KVP_TRY(host_grow(c, &c->h_pack, &c->h_pack_cap, lay.bytes, "the step pack"));
    /* doubling: each move costs the captured graphs */
    KVP_TRY(pack_reserve(c, lay.bytes, lay.bytes > 2 * c->ws.pack_cap ? lay.bytes : 2 * c->ws.pack_cap));
    if (b->n > 0) {
        kvp_cuda_pack_fill(b, &pm, &lay, c->h_pack);
    } else {
        int32_t *pairs = c->h_pack;
        for (int32_t i = 0; i < lay.C; i++) {
            pairs[2 * i] = b->ops.copies[i].src;
            pairs[2 * i + 1] = b->ops.copies[i].dst;
        }
    }
    KVP_TRY(kvp_cudev_copy(c->dev, c->ws.pack, c->h_pack, lay.bytes, 0)); /* the step's one upload */
    if (lay.C > 0)
        KVP_TRY(kvp_cudev_copy_blocks(c->dev, c->d_pool_ptrs, 2 * c->cm->cfg.num_layers, c->block_bytes_pool,
                                      (const int32_t *)((char *)c->ws.pack + lay.off_pairs), lay.C));
    if (b->n == 0) {
        KVP_TRY(kvp_cudev_sync(c->dev, 0));
        goto done;
    }
    KVP_TRY(host_grow(c, (void **)&c->h_logits, &c->h_logits_cap,
                      (size_t)lay.S * (size_t)c->cm->cfg.vocab_size * sizeof(float), "the logits"));
    if (bi >= 0) { /* the bucket's graph; the real rows' logits come back */
        const int64_t V = c->cm->cfg.vocab_size;
        KVP_TRY(bucket_forward(c, bi, &lay));
        KVP_TRY(kvp_cudev_copy(c->dev, c->h_logits, c->ws.logits, (size_t)lay.S * (size_t)V * sizeof(float), 1));
        KVP_TRY(kvp_cudev_sync(c->dev, 0));
    } else {
        KVP_TRY(forward(c, &lay, 0));
    }
    out->logits = c->h_logits;
done:
    out->time_s = kvp_now_s() - t0 + 1e-9;
    return KVP_OK;
}

static void destroy(void *ctx)
{
    cu_ctx *c = ctx;
    if (!c) return;
    graphs_drop(c);
    if (c->comm && kvp_comm_set_stream(c->comm, NULL, 1) != KVP_OK) kvp_error_clear(); /* the stream goes next */
    ws_free(c);
    kvp_cudev_free(c->dev, c->kv_all);
    kvp_cudev_free(c->dev, c->d_pool_ptrs);
    kvp_cudev_host_free(c->dev, c->host_all);
    kvp_cudev_host_free(c->dev, c->h_pack);
    kvp_cudev_host_free(c->dev, c->h_logits);
    kvp_free(c->pools);
    if (c->cm) cu_model_free(c->cm);
    kvp_cudev_close(c->dev);
    kvp_free(c);
}

/* The profiling pass: the forward of a max_tokens-token batch (one sequence) without KV or attention; the
 * device's free memory before and after gives the activation peak (at least what was allocated). */
static kvp_status profile(cu_ctx *c, int32_t max_tokens, int32_t max_seqs, int64_t *peak)
{
    int64_t f0, f1, total, ws_bytes;
    KVP_TRY(kvp_cudev_mem_info(c->dev, &f0, &total));
    int64_t S = max_seqs < max_tokens ? max_seqs : max_tokens;
    if (c->n_buckets && S < c->buckets[c->n_buckets - 1]) S = c->buckets[c->n_buckets - 1]; /* a bucket's LM head */
    KVP_TRY(ws_alloc(c, max_tokens, S < 1 ? 1 : S, &ws_bytes));
    kvp_exec_seq seq = {.num_new = max_tokens, .sample = 1, .all_logits = 1};
    int32_t *tok = kvp_calloc((size_t)max_tokens * 4 + 8, sizeof(int32_t));
    int64_t *slot = kvp_calloc((size_t)max_tokens, sizeof(int64_t));
    if (!tok || !slot) {
        kvp_free(tok);
        kvp_free(slot);
        return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    }
    int32_t *pos = tok + max_tokens, *qo = pos + max_tokens, *kvi = qo + 2, *idx = kvi + 2, *last = idx + 1;
    uint8_t every = 1; /* every row's logits: the LM head at its largest */
    for (int32_t t = 0; t < max_tokens; t++) pos[t] = t % c->cm->max_len;
    qo[1] = max_tokens;
    kvi[1] = 1;
    last[0] = max_tokens;
    kvp_exec_batch b = {.seqs = &seq, .n = 1, .block_size = c->block_size,
                        .flat = {.num_tokens = max_tokens, .tokens = tok, .positions = pos, .slot_mapping = slot,
                                 .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last,
                                 .all_logits = &every, .num_rows = max_tokens}};
    /* no pool yet: the plan checks slots and pages against a one-block pool of max_tokens slots */
    kvp_cuda_pack_model pm = pack_model(c);
    pm.num_blocks = 1;
    pm.block_size = max_tokens;
    pm.max_len = c->cm->max_len > max_tokens ? c->cm->max_len : max_tokens + 1;
    kvp_cuda_pack_layout lay;
    kvp_status st = kvp_cuda_pack_plan(&b, &pm, 0, &lay);
    if (st == KVP_OK) st = host_grow(c, &c->h_pack, &c->h_pack_cap, lay.bytes, "the step pack");
    if (st == KVP_OK) st = pack_reserve(c, lay.bytes, lay.bytes);
    if (st == KVP_OK) {
        kvp_cuda_pack_fill(&b, &pm, &lay, c->h_pack);
        st = kvp_cudev_copy(c->dev, c->ws.pack, c->h_pack, lay.bytes, 0);
    }
    c->profiling = 1;
    if (st == KVP_OK) st = forward(c, &lay, 0);
    c->profiling = 0;
    kvp_free(tok);
    kvp_free(slot);
    KVP_TRY(st);
    KVP_TRY(kvp_cudev_mem_info(c->dev, &f1, &total));
    const int64_t measured = f0 - f1;
    *peak = measured > ws_bytes + (int64_t)lay.bytes ? measured : ws_bytes + (int64_t)lay.bytes;
    return KVP_OK;
}

kvp_status kvp_cuda_executor_create(kvp_model *m, const kvp_model_config *cfg, const kvp_cuda_options *opts,
                                    int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                    kvp_dtype kv_dtype, int32_t max_tokens, int32_t max_seqs, kvp_executor *out,
                                    kvp_cuda_info *info)
{
    if (!m && !cfg) return KVP_ERR(KVP_EINVAL, "cuda executor: no model and no config");
    if (block_size < 1 || num_blocks < 0 || num_host_blocks < 0 || max_tokens < 1 || max_seqs < 1)
        return KVP_ERR(KVP_EINVAL, "cuda executor: block size %d, %d blocks, %d host blocks, %d tokens, %d sequences",
                       block_size, num_blocks, num_host_blocks, max_tokens, max_seqs);
    if ((unsigned)kv_dtype >= KVP_DTYPE_COUNT)
        return KVP_ERR(KVP_EINVAL, "cuda executor: KV dtype %d", (int)kv_dtype);
    /* Tensor parallelism: the model's shard and communicator (kvp_model_load_tp); every rank runs the same
     * forward pass on its heads and sums through NCCL on the compute stream. */
    kvp_comm *comm = m ? kvp_model_comm(m) : NULL;
    const int tp = comm ? kvp_comm_size(comm) : 1;
    if (tp > 1) {
        kvp_tp_shard sh;
        kvp_model_shard(m, &sh);
        if (sh.tp != tp)
            return KVP_ERR(KVP_EINVAL, "cuda executor: the model was split over %d ranks, its communicator has %d", sh.tp, tp);
        if (kvp_comm_memory(comm) != KVP_COMM_MEM_DEVICE)
            return KVP_ERR(KVP_EINVAL, "cuda executor: tensor parallelism over %d ranks needs an nccl communicator (its "
                                       "collectives work in device memory), not a '%s' one", tp, kvp_comm_backend(comm));
    }
    cu_ctx *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    c->tp = tp;
    c->rank = comm ? kvp_comm_rank(comm) : 0;
    kvp_status st = kvp_cudev_open(opts->device, &c->dev, &c->dinfo);
    /* a GPU's NCCL rank and its executor share the device; the emulator has one device for every rank */
    if (st == KVP_OK && tp > 1 && !c->dinfo.emulated && kvp_comm_device(comm) != opts->device)
        st = KVP_ERR(KVP_EINVAL, "cuda executor: rank %d's communicator is on CUDA device %d, the executor on %d",
                     c->rank, kvp_comm_device(comm), opts->device);
    /* Collectives go on the compute stream after the kernels before them. On a GPU they return once enqueued
     * (kvp_comm_wait at the end of the pass reports them); the emulator runs kernels on the host as they are
     * launched, so there each collective must have completed before the next kernel reads its result. */
    if (st == KVP_OK && tp > 1) st = kvp_comm_set_stream(comm, kvp_cudev_stream(c->dev), c->dinfo.emulated);
    if (st == KVP_OK && tp > 1) c->comm = comm;
    int64_t free0 = 0, total = 0;
    if (st == KVP_OK) st = kvp_cudev_mem_info(c->dev, &free0, &total);
    if (st == KVP_OK && c->dinfo.emulated && !getenv("KVPAGE_EMU_DEVICE_MEM") && total > EMU_DEVICE_BYTES) {
        free0 -= total - EMU_DEVICE_BYTES;
        total = EMU_DEVICE_BYTES;
    }
    kvp_dtype wdt = opts->weights;
    if (wdt == KVP_DTYPE_COUNT) wdt = m && kvp_model_weight_type(m) == KVP_WEIGHT_F32 ? KVP_DTYPE_F32 : KVP_DTYPE_BF16;
    if (st == KVP_OK && wdt != KVP_DTYPE_F32 && wdt != KVP_DTYPE_BF16)
        st = KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: weights as %s (f32 or bf16)", kvp_dtype_name(wdt));
    if (st == KVP_OK) {
        c->owns_model = 1;
        st = m ? cu_model_upload(c->dev, m, wdt, &c->cm) : cu_model_random(c->dev, cfg, opts->random_seed, &c->cm);
    }
    c->kv_dtype = kv_dtype;
    c->block_size = block_size;
    c->num_host_blocks = num_host_blocks;
    int64_t peak = 0;
    if (st == KVP_OK) {
        c->paged = opts->attention == KVP_CUDA_ATTN_PAGED && kvp_cudev_paged_supported(kv_dtype, c->cm->cfg.head_dim) &&
                   !opts->deterministic;
        kvp_cudev_set_invariant_gemm(c->dev, opts->deterministic);
        if (opts->deterministic)
            KVP_LOG_I("cuda executor: --deterministic: tiled batch-invariant GEMMs, rowwise attention");
        else if (opts->attention == KVP_CUDA_ATTN_PAGED && !c->paged)
            KVP_LOG_I("cuda executor: no attention/cuda kernel for head_dim %d: attention runs rowwise",
                      c->cm->cfg.head_dim);
        c->n_buckets = opts->enforce_eager ? 0 : kvp_cuda_graph_buckets(max_seqs, c->buckets);
        const int32_t need = c->n_buckets ? c->buckets[c->n_buckets - 1] : 1;
        st = profile(c, max_tokens > need ? max_tokens : need, max_seqs, &peak);
    }
    if (st != KVP_OK) {
        destroy(c);
        return st;
    }
    const kvp_model_config *mc = &c->cm->cfg;
    const int64_t layers = mc->num_layers;
    /* this rank's KV heads only (replicated when tp exceeds the KV heads); rank 0's block ids on every rank */
    c->block_bytes_pool = (size_t)c->cm->tp.nkv * (size_t)block_size * (size_t)mc->head_dim * kvp_dtype_size(kv_dtype);
    kvp_cuda_mem_split split;
    st = kvp_cuda_split(total, free0, opts->gpu_memory_utilization, c->cm->weight_bytes, peak,
                            (int64_t)c->block_bytes_pool * 2 * layers, opts->kv_cache_memory, &split);
    if (st == KVP_OK && num_blocks > split.num_blocks)
        st = KVP_ERR(KVP_EINVAL, "cuda executor: %d KV blocks asked, the device's split holds %d (%lld bytes)",
                     num_blocks, split.num_blocks, (long long)split.kv);
    if (st == KVP_OK) {
        if (num_blocks > 0) split.num_blocks = num_blocks;
        c->num_blocks = split.num_blocks;
        c->pool_bytes = c->block_bytes_pool * (size_t)c->num_blocks;
        st = kvp_cudev_malloc(c->dev, &c->kv_all, c->pool_bytes * 2 * (size_t)layers, "the KV pools");
    }
    if (st == KVP_OK && !(c->pools = kvp_calloc((size_t)layers, sizeof *c->pools)))
        st = KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    void **ptrs = st == KVP_OK ? kvp_calloc(2 * (size_t)layers, sizeof *ptrs) : NULL;
    if (st == KVP_OK && !ptrs) st = KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    if (st == KVP_OK) {
        for (int64_t l = 0; l < layers; l++) {
            c->pools[l] = (kvp_cudev_pool){.k = (char *)c->kv_all + (size_t)(2 * l) * c->pool_bytes,
                                           .v = (char *)c->kv_all + (size_t)(2 * l + 1) * c->pool_bytes,
                                           .dtype = kv_dtype, .num_blocks = c->num_blocks,
                                           .nkv = c->cm->tp.nkv, .block_size = block_size, .hd = mc->head_dim};
            ptrs[2 * l] = c->pools[l].k;
            ptrs[2 * l + 1] = c->pools[l].v;
        }
        /* NaN in every unused slot (0xFF bytes), as the CPU pools: a kernel that reads one shows */
        st = kvp_cudev_memset(c->dev, c->kv_all, 0xFF, c->pool_bytes * 2 * (size_t)layers);
    }
    if (st == KVP_OK) st = kvp_cudev_malloc(c->dev, (void **)&c->d_pool_ptrs, 2 * (size_t)layers * sizeof(void *), "pools");
    if (st == KVP_OK) st = kvp_cudev_copy(c->dev, c->d_pool_ptrs, ptrs, 2 * (size_t)layers * sizeof(void *), 0);
    if (st == KVP_OK) st = kvp_cudev_sync(c->dev, 0);
    kvp_free(ptrs);
    if (st == KVP_OK && num_host_blocks > 0)
        st = kvp_cudev_host_alloc(c->dev, &c->host_all, c->block_bytes_pool * (size_t)num_host_blocks * 2 * (size_t)layers,
                                  "the host KV pools");
    if (st != KVP_OK) {
        destroy(c);
        return st;
    }
    c->info = (kvp_cuda_info){.emulated = c->dinfo.emulated, .cublas = c->dinfo.cublas, .split = split,
                              .weights = wdt, .graph_buckets = c->n_buckets,
                              .attention = c->paged ? KVP_CUDA_ATTN_PAGED : KVP_CUDA_ATTN_ROWWISE,
                              .deterministic = opts->deterministic != 0};
    snprintf(c->info.device_name, sizeof c->info.device_name, "%s", c->dinfo.name);
    if ((st = capture_all(c, max_seqs)) != KVP_OK) {
        destroy(c);
        return st;
    }
    if (info) *info = c->info;
    *out = (kvp_executor){.name = "cuda", .ctx = c, .flat = 1, .step = step, .destroy = destroy};
    return KVP_OK;
}

kvp_status kvp_cuda_executor_info(const kvp_executor *ex, kvp_cuda_info *out)
{
    if (!ex || !ex->ctx || ex->step != step) return KVP_ERR(KVP_EINVAL, "not a cuda executor");
    *out = ((const cu_ctx *)ex->ctx)->info;
    return KVP_OK;
}

/* kvp_cuda_session_create, also giving the executor's context (for its info after a run). */
static kvp_status cuda_session_create(kvp_model *m, const kvp_cuda_options *opts, const kvp_session_config *cfg,
                                      kvp_session **out, kvp_cuda_info *info, cu_ctx **ctx)
{
    if (!m || !opts || !cfg || !out) return KVP_ERR(KVP_EINVAL, "generate: NULL argument");
    if (cfg->num_blocks < 0 || cfg->engine.block_size < 1)
        return KVP_ERR(KVP_EINVAL, "generate: num_blocks (%d) must be >= 0 and block_size (%d) >= 1", cfg->num_blocks,
                       cfg->engine.block_size);
    if (cfg->swap_blocks < 0 && cfg->engine.preempt == KVP_PREEMPT_SWAP && cfg->num_blocks == 0)
        return KVP_ERR(KVP_EINVAL, "--preempt swap on the cuda executor: give --swap-space (the KV cache's size is "
                                   "known only after the memory split)");
    kvp_session_config c;
    int32_t eos[KVP_MAX_EOS_IDS], host = 0;
    KVP_TRY(kvp_exec_session_config(m, cfg, eos, &c, &host));
    kvp_executor ex;
    kvp_cuda_info ci;
    int32_t max_tokens = c.engine.max_batched_tokens > 0 ? c.engine.max_batched_tokens : 2048;
    if (!c.engine.chunked_prefill && max_tokens < c.engine.max_model_len) max_tokens = c.engine.max_model_len;
    const int32_t max_seqs = c.engine.max_num_seqs > 0 ? c.engine.max_num_seqs : 256;
    kvp_comm *comm = kvp_model_comm(m);
    const int tp = comm ? kvp_comm_size(comm) : 1;
    if (tp > 1 && kvp_comm_rank(comm) != 0)
        return KVP_ERR(KVP_ESTATE, "tensor parallelism: rank %d executes rank 0's plans (kvp_cuda_follow)",
                       kvp_comm_rank(comm));
    KVP_TRY(kvp_cuda_executor_create(m, NULL, opts, c.num_blocks, c.engine.block_size, host, c.kv_dtype,
                                     max_tokens, max_seqs, &ex, &ci));
    if (ctx) *ctx = ex.ctx; /* the cuda executor's own, before a leader wraps it */
    c.num_blocks = ci.split.num_blocks;
    if (tp > 1) { /* rank 0 schedules; its plans go over the host plane to the followers' executors */
        const kvp_tp_shape shape = {c.num_blocks, c.engine.block_size, host, (int32_t)c.kv_dtype, max_tokens,
                                    max_seqs};
        KVP_TRY(kvp_tp_leader_create(kvp_comm_host(comm), &shape, ex, &ex));
    }
    if (info) *info = ci;
    kvp_status st = kvp_session_create(&c, ex, out);
    if (st != KVP_OK) kvp_executor_destroy(&ex);
    return st;
}

kvp_status kvp_cuda_session_create(kvp_model *m, const kvp_cuda_options *opts, const kvp_session_config *cfg,
                                   kvp_session **out, kvp_cuda_info *info)
{
    return cuda_session_create(m, opts, cfg, out, info, NULL);
}

typedef struct {
    kvp_model *m;
    const kvp_cuda_options *opts;
} follow_ctx;

static kvp_status make_follower(void *ctx, const kvp_tp_shape *sh, kvp_executor *ex)
{
    const follow_ctx *f = ctx;
    if (sh->max_tokens < 1 || sh->max_seqs < 1)
        return KVP_ERR(KVP_EPARSE, "tensor parallelism: rank 0's plan gives no step limits (is its executor the cuda one?)");
    return kvp_cuda_executor_create(f->m, NULL, f->opts, sh->num_blocks, sh->block_size, sh->num_host_blocks,
                                    (kvp_dtype)sh->kv_dtype, sh->max_tokens, sh->max_seqs, ex, NULL);
}

kvp_status kvp_cuda_follow(kvp_model *m, const kvp_cuda_options *opts, int64_t *steps)
{
    kvp_comm *comm = m ? kvp_model_comm(m) : NULL;
    if (!opts || !comm || kvp_comm_size(comm) < 2 || kvp_comm_rank(comm) == 0)
        return KVP_ERR(KVP_EINVAL, "tensor parallelism: only ranks but 0 of several follow rank 0's plans");
    follow_ctx f = {m, opts};
    return kvp_tp_follow(kvp_comm_host(comm), make_follower, &f, steps);
}

kvp_status kvp_cuda_generate(kvp_model *m, const kvp_cuda_options *opts, const kvp_session_config *cfg,
                             const kvp_session_request *reqs, int32_t n, kvp_session_result *results,
                             kvp_run_stats *stats, void (*on_step)(void *ctx, kvp_session *s), void *ctx,
                             kvp_cuda_info *info)
{
    if (!m || !cfg || n < 1 || !reqs || !results) return KVP_ERR(KVP_EINVAL, "generate: NULL argument or no request");
    kvp_session *s;
    kvp_cuda_info ci;
    cu_ctx *c;
    KVP_TRY(cuda_session_create(m, opts, cfg, &s, &ci, &c));
    kvp_status st = kvp_session_run(s, reqs, n, results, stats, on_step, ctx);
    if (st == KVP_OK && stats) stats->kv_pool_bytes = ci.split.block_bytes * ci.split.num_blocks;
    if (info) *info = c->info; /* the session still holds the executor */
    kvp_session_destroy(s);
    return st;
}

void kvp_cuda_info_log(const kvp_cuda_info *i)
{
    const kvp_cuda_mem_split *s = &i->split;
    const double G = 1024.0 * 1024 * 1024;
    KVP_LOG_I("cuda executor: %s%s, GEMMs %s, weights %s, attention %s, CUDA-graph buckets %d", i->device_name,
                 i->emulated ? " (the CPU emulator of CUDA)" : "",
                 i->deterministic ? "tiled (batch-invariant)" : i->cublas ? "cuBLAS" : "the CPU stand-in",
                 kvp_dtype_name(i->weights), i->attention == KVP_CUDA_ATTN_PAGED ? "paged" : "rowwise",
                 i->graph_buckets);
    KVP_LOG_I("cuda executor: memory %.2f GiB total, %.2f free; budget %.2f (utilization %.2f); weights %.3f GiB, "
                 "activations %.3f GiB, KV %.3f GiB%s = %d blocks of %lld bytes",
                 s->total / G, s->free_at_start / G, s->budget / G, s->utilization, s->weights / G, s->activations / G,
                 s->kv / G, s->kv_given ? " (--kv-cache-memory)" : "", s->num_blocks, (long long)s->block_bytes);
    if (i->graph_buckets > 0)
        KVP_LOG_I("cuda executor: CUDA graphs: %d captured in %.3f s, %lld decode steps replayed", i->graphs_captured,
                  i->graph_capture_s, (long long)i->graph_replays);
}

void kvp_cuda_info_json(const kvp_cuda_info *i, struct cJSON *obj)
{
    if (!obj) return;
    cJSON *o = cJSON_AddObjectToObject(obj, "cuda");
    const kvp_cuda_mem_split *s = &i->split;
    cJSON_AddStringToObject(o, "device", i->device_name);
    cJSON_AddBoolToObject(o, "emulated", i->emulated);
    cJSON_AddStringToObject(o, "gemm", i->deterministic ? "tiled" : i->cublas ? "cublas" : "cpu_stand_in");
    cJSON_AddBoolToObject(o, "deterministic", i->deterministic);
    cJSON_AddStringToObject(o, "weights_dtype", kvp_dtype_name(i->weights));
    cJSON_AddNumberToObject(o, "graph_buckets", i->graph_buckets);
    cJSON_AddStringToObject(o, "attention", i->attention == KVP_CUDA_ATTN_PAGED ? "paged" : "rowwise");
    cJSON_AddNumberToObject(o, "graphs_captured", i->graphs_captured);
    cJSON_AddNumberToObject(o, "graph_replays", (double)i->graph_replays);
    cJSON_AddNumberToObject(o, "graph_capture_s", i->graph_capture_s);
    cJSON_AddNumberToObject(o, "total_bytes", (double)s->total);
    cJSON_AddNumberToObject(o, "free_at_start_bytes", (double)s->free_at_start);
    cJSON_AddNumberToObject(o, "gpu_memory_utilization", s->utilization);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)s->budget);
    cJSON_AddNumberToObject(o, "weights_bytes", (double)s->weights);
    cJSON_AddNumberToObject(o, "activations_bytes", (double)s->activations);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)s->kv);
    cJSON_AddBoolToObject(o, "kv_cache_memory_given", s->kv_given);
    cJSON_AddNumberToObject(o, "kv_block_bytes", (double)s->block_bytes);
    cJSON_AddNumberToObject(o, "num_blocks", s->num_blocks);
}
