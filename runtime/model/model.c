/* runtime/model/model.c — Llama-family weights and the batched CPU forward pass over the paged KV cache. */
#include "runtime/model/model.h"

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

enum { KVP_MM_PANEL = 16 };

/* A weight matrix W [out = N, in = K] in the layouts the two matmul kinds read:
 *
 *   p: packed panels of 16 outputs, (ceil(N/16), K, 16):  p[(o/16)*K*16 + k*16 + o%16] = W[o][k]
 *      (zero past N), elements of dt: f32, or f16 / bf16 (half the memory and the bytes a decode step
 *      reads; widened to f32 in registers), or Q8_0 (when K is a multiple of 32): a panel is K/32 blocks
 *      of 16 f32 scales (one per output, ggml's f16 scale d) then 32 x 16 int8 quants q, k-major, and
 *      W[o][k] = d[o] * q[k][o] (exact in f32). The invariant kernel streams one panel (contiguous) per
 *      tile: a transposed (K, N) matrix read 16 columns at a time strides by N floats per k, which for
 *      N = 512 (an LM head) lands every row of the tile in the same two L1 sets.
 *   t: (K, N) = W^T in f32 for OpenBLAS, made from p on the first BLAS forward pass (NULL until then).
 */
typedef struct {
    void *p;
    float *t;
    int64_t K, N;
    kvp_weight_type dt;
} mat_w;

enum { KVP_Q8_BLOCK = 32, KVP_Q8_BLOCK_BYTES = KVP_MM_PANEL * 4 + KVP_Q8_BLOCK * KVP_MM_PANEL }; /* per panel */

typedef struct {
    float *attn_norm;     /* (hidden) */
    mat_w wq, wk, wv;     /* [nq*hd, hidden], [nkv*hd, hidden], [nkv*hd, hidden] */
    float *bq, *bk, *bv;  /* (nq*hd), (nkv*hd), (nkv*hd) or NULL */
    float *bo;            /* (hidden) or NULL: llama-style attention_bias also biases o_proj */
    float *q_norm, *k_norm; /* (hd) qwen3, or NULL */
    mat_w wo;             /* [hidden, nq*hd] */
    float *ffn_norm;      /* (hidden) */
    float *post_attn_norm, *post_ffn_norm; /* (hidden): gemma2's and gemma3's norms of the attention's and the
                                            * FFN's outputs, or NULL */
    mat_w w_gate, w_up;   /* [inter, hidden] (empty in an MoE layer) */
    mat_w w_down;         /* [hidden, inter] */
    float *router;        /* (E, hidden): an MoE layer's router (replicated over ranks); NULL: a dense FFN */
    mat_w *experts;       /* (3 E): expert e's gate [moe_inter, hidden], up (the same) and down [hidden, moe_inter]
                           * at 3e, 3e + 1, 3e + 2 */
    int32_t n_experts;    /* E; 0: a dense FFN */
    int32_t window_left;  /* -1: full attention */
} layer_w;

enum { KVP_FWD_MAX_GROUPS = 64 };

/* Worker threads of kvp_model_run, started on first use. Between runs a worker (and the caller waiting for
 * the workers) first polls for up to POOL_SPIN_NS, then sleeps on a condition variable: a decode step runs
 * the pool twice (forward, sampling) a few hundred microseconds apart, and a wake-up through the kernel cost
 * ~7 % of a batched stories260K decode; the bound keeps an idle team from stealing time slices on a shared
 * machine. Worker i runs task i of a run; the caller runs task 0.
 *
 *   caller: lock; fn, arg, ntasks, remaining; epoch++; broadcast(go); unlock; fn(arg, 0); wait(done)
 *   worker i: wait(go) until epoch changes; fn(arg, i) if i < ntasks; last one signals done
 */
enum { POOL_SPIN_NS = 100000 };
typedef struct worker_pool worker_pool;
typedef struct {
    worker_pool *pool;
    int index;
    uint64_t epoch0; /* the epoch when it was made: its first run is the next one */
} worker_arg;
struct worker_pool {
    int inited;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t tid[KVP_FWD_MAX_GROUPS];
    worker_arg args[KVP_FWD_MAX_GROUPS];
    int nworkers; /* started: workers 1 .. nworkers */
    uint64_t epoch;
    int ntasks, remaining, stop;
    void (*fn)(void *arg, int i);
    void *arg;
};

/* Workspace of one forward pass: activations (f) and the expanded page table of the invariant path (i). */
typedef struct {
    float *f;
    size_t cap;
    int32_t *i;
    size_t icap;
} fwd_ws;

struct kvp_model {
    kvp_model_config cfg;
    kvp_rope_style rope;
    kvp_matmul_kind matmul;
    int lanes;             /* of the invariant matmul's vectors: 8, or 16 where the CPU has AVX-512F */
    kvp_weight_type wtype; /* of the matrices' panels */
    int threads;
    int skip_attention; /* kvp_model_set_skip_attention (timing only) */
    int is_gguf;
    char path[1024];
    kvp_comm *comm;   /* borrowed; NULL: one rank */
    kvp_tp_shard tp;  /* this rank's heads, intermediate units and vocabulary rows (all of them at tp 1) */
    int64_t mff0, mnff; /* this rank's units of every expert, [mff0, mff0 + mnff) (MoE) */
    float *embed;     /* (tp.nv, hidden): vocabulary rows tp.v0 .. */
    float *out_norm;  /* (hidden) */
    mat_w lm_head;    /* [tp.nv, hidden]; a copy of embed's rows when tied */
    layer_w *layers; /* (num_layers) */
    double *inv_freq; /* (rotary_dim / 2) */
    double *inv_freq_local; /* (rotary_dim / 2): gemma3's sliding layers' (rope_local_theta, unscaled); NULL: none */
    double rope_scale; /* cos and sin are multiplied by it (yarn's and longrope's attention factor; else 1) */
    float *freq_div;  /* (rotary_dim / 2): GGUF's rope_freqs.weight, dividing inv_freq; NULL: none */
    int32_t rot;      /* kvp_rotary_dim */
    int32_t context;     /* kvp_model_config_context, made at load (INT32_MAX: none given) */
    int32_t max_len_cap; /* kvp_model_set_max_len's (0: none) */
    fwd_ws ws[KVP_FWD_MAX_GROUPS]; /* one per data-parallel group, grown on demand */
    int32_t *sub;                  /* rebased qo/kv indptr of the groups */
    size_t sub_cap;
    worker_pool pool;
};

/* ---------------------------------------------------------------- worker threads */

/* Polls, without the pool's lock, until a worker's next run is posted (epoch past `seen`, or stop), or for
 * the caller until every worker is done (remaining 0), or until POOL_SPIN_NS pass. A hint only: the
 * condition is then checked again under the lock. */
static void spin_for(worker_pool *wp, int caller, uint64_t seen)
{
    const int64_t t0 = kvp_now_ns();
    for (int i = 1;; i++) {
        if (caller ? __atomic_load_n(&wp->remaining, __ATOMIC_ACQUIRE) == 0
                   : __atomic_load_n(&wp->epoch, __ATOMIC_ACQUIRE) != seen || __atomic_load_n(&wp->stop, __ATOMIC_ACQUIRE))
            return;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        if (i % 64 == 0 && kvp_now_ns() - t0 > POOL_SPIN_NS) return;
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    worker_pool *wp = wa->pool;
    pthread_mutex_lock(&wp->mu);
    uint64_t seen = wa->epoch0;
    for (;;) {
        if (!wp->stop && wp->epoch == seen) {
            pthread_mutex_unlock(&wp->mu);
            spin_for(wp, 0, seen);
            pthread_mutex_lock(&wp->mu);
        }
        while (!wp->stop && wp->epoch == seen) pthread_cond_wait(&wp->go, &wp->mu);
        if (wp->stop) break;
        seen = wp->epoch;
        if (wa->index < wp->ntasks) {
            void (*fn)(void *, int) = wp->fn;
            void *arg = wp->arg;
            pthread_mutex_unlock(&wp->mu);
            fn(arg, wa->index);
            pthread_mutex_lock(&wp->mu);
            if (__atomic_sub_fetch(&wp->remaining, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&wp->done);
        }
    }
    pthread_mutex_unlock(&wp->mu);
    return NULL;
}

static void pool_destroy(worker_pool *wp)
{
    if (!wp->inited) return;
    pthread_mutex_lock(&wp->mu);
    __atomic_store_n(&wp->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&wp->go);
    pthread_mutex_unlock(&wp->mu);
    for (int i = 1; i <= wp->nworkers; i++) pthread_join(wp->tid[i], NULL);
    pthread_cond_destroy(&wp->go);
    pthread_cond_destroy(&wp->done);
    pthread_mutex_destroy(&wp->mu);
    wp->inited = 0;
}

void kvp_model_run(kvp_model *m, int n, void (*fn)(void *arg, int i), void *arg)
{
    worker_pool *wp = &m->pool;
    if (n > KVP_FWD_MAX_GROUPS) n = KVP_FWD_MAX_GROUPS;
    if (n > 1 && !wp->inited) {
        if (pthread_mutex_init(&wp->mu, NULL) == 0) {
            if (pthread_cond_init(&wp->go, NULL) == 0) {
                if (pthread_cond_init(&wp->done, NULL) == 0) wp->inited = 1;
                else pthread_cond_destroy(&wp->go);
            }
            if (!wp->inited) pthread_mutex_destroy(&wp->mu);
        }
    }
    int have = 0; /* tasks 1 .. have run on workers */
    if (n > 1 && wp->inited) {
        pthread_mutex_lock(&wp->mu);
        while (wp->nworkers < n - 1) { /* a worker that cannot start leaves its tasks to the caller */
            int i = wp->nworkers + 1;
            wp->args[i] = (worker_arg){wp, i, wp->epoch};
            if (pthread_create(&wp->tid[i], NULL, worker_main, &wp->args[i]) != 0) break;
            wp->nworkers = i;
        }
        have = wp->nworkers < n - 1 ? wp->nworkers : n - 1;
        wp->fn = fn;
        wp->arg = arg;
        wp->ntasks = have + 1;
        wp->remaining = have;
        __atomic_store_n(&wp->epoch, wp->epoch + 1, __ATOMIC_RELEASE);
        if (have > 0) pthread_cond_broadcast(&wp->go);
        pthread_mutex_unlock(&wp->mu);
    }
    fn(arg, 0);
    for (int i = have + 1; i < n; i++) fn(arg, i);
    if (have > 0) {
        spin_for(wp, 1, 0);
        pthread_mutex_lock(&wp->mu);
        while (wp->remaining > 0) pthread_cond_wait(&wp->done, &wp->mu);
        pthread_mutex_unlock(&wp->mu);
    }
}

/* ---------------------------------------------------------------- loading */

typedef struct {
    const kvp_gguf *g;
    const kvp_st *s;
    const char *what; /* file or folder for messages */
    uint8_t *used;    /* (number of tensors) 1: read by load_weights; NULL outside it */
    int wrap;         /* HF: where a multimodal checkpoint (Gemma 3's layout) keeps its language model: 0 as
                       * named here ("model.X", "lm_head.weight"); 1 under "language_model." (transformers
                       * before 4.52); 2 as "model.language_model.X" (since). Its other tensors (the vision
                       * tower, the projector) are left unread. */
} source;

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
static size_t panel_bytes(kvp_weight_type dt, int64_t K)
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

/* The held type `auto` gives a tensor stored as wt (see kvp_weight_type). */
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
    const size_t pb = panel_bytes(dt, in_f);
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

/* W[o][k] as f32. */
static float mat_at(const mat_w *w, int64_t o, int64_t k)
{
    const unsigned char *pan = (const unsigned char *)w->p + (size_t)(o / KVP_MM_PANEL) * panel_bytes(w->dt, w->K);
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
static kvp_status mat_need_t(mat_w *w)
{
    if (w->t) return KVP_OK;
    float *t = kvp_aligned_alloc(64, (size_t)(w->K * w->N) * sizeof(float));
    if (!t) return KVP_ERR(KVP_ENOMEM, "forward: out of memory for the BLAS copy of a %lld x %lld weight",
                           (long long)w->N, (long long)w->K);
    for (int64_t k = 0; k < w->K; k++)
        for (int64_t o = 0; o < w->N; o++)
            t[k * w->N + o] = mat_at(w, o, k);
    w->t = t;
    return KVP_OK;
}

enum { KVP_LAYER_MATS = 7 };

/* Matrix i < layer_nmats(w) of layer w: the seven of a dense layer (an MoE layer's dense FFN is empty, p
 * NULL), then the experts'. */
static int64_t layer_nmats(const layer_w *w) { return KVP_LAYER_MATS + 3 * (int64_t)w->n_experts; }
static mat_w *layer_mat(layer_w *w, int64_t i)
{
    mat_w *fixed[KVP_LAYER_MATS] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return i < KVP_LAYER_MATS ? fixed[i] : &w->experts[i - KVP_LAYER_MATS];
}

/* The type every matrix is held in, or KVP_WEIGHT_AUTO when they differ. */
static kvp_weight_type held_type(kvp_model *m)
{
    kvp_weight_type t = m->lm_head.dt;
    for (int32_t l = 0; l < m->cfg.num_layers; l++)
        for (int64_t i = 0; i < layer_nmats(&m->layers[l]); i++) {
            const mat_w *w = layer_mat(&m->layers[l], i);
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
            for (int64_t i = 0; i < layer_nmats(w); i++) mat_free(layer_mat(w, i));
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
    pool_destroy(&m->pool);
    free_weights(m);
    kvp_free(m);
}

static void set_rope(kvp_model *m);

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
        set_rope(m);
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
static kvp_status load_weights(kvp_model *m, const source *src)
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
static kvp_status check_config(const kvp_model_config *c, const char *cfg_file, int gguf)
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
static kvp_status generation_config(const char *cfgpath, kvp_model_config *c)
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
static void set_rope(kvp_model *m)
{
    kvp_rope_frequencies(&m->cfg, kvp_model_max_len(m), m->inv_freq, &m->rope_scale);
    for (int32_t i = 0; m->freq_div && i < m->rot / 2; i++) m->inv_freq[i] /= m->freq_div[i];
}

/* The context positions may reach, and RoPE's frequencies and scale. */
static kvp_status init_positions(kvp_model *m)
{
    m->rot = kvp_rotary_dim(&m->cfg);
    m->inv_freq = kvp_malloc((size_t)(m->rot / 2) * sizeof(double));
    if (!m->inv_freq) return KVP_ERR(KVP_ENOMEM, "out of memory");
    if (m->cfg.rope_local_theta > 0) {
        m->inv_freq_local = kvp_malloc((size_t)(m->rot / 2) * sizeof(double));
        if (!m->inv_freq_local) return KVP_ERR(KVP_ENOMEM, "out of memory");
        for (int32_t i = 0; i < m->rot / 2; i++)
            m->inv_freq_local[i] = 1.0 / pow(m->cfg.rope_local_theta, 2.0 * i / m->rot);
    }
    const int64_t ctx = kvp_model_config_context(&m->cfg);
    m->context = ctx > 0 && ctx < INT32_MAX ? (int32_t)ctx : INT32_MAX;
    set_rope(m);
    return KVP_OK;
}

/* This rank's shard of the model (all of it without a communicator). */
static kvp_status shard(kvp_model *m, kvp_comm *comm, const char *what)
{
    const kvp_model_config *c = &m->cfg;
    const int tp = comm ? kvp_comm_size(comm) : 1, rank = comm ? kvp_comm_rank(comm) : 0;
    if (kvp_tp_shard_of(tp, rank, c->num_q_heads, c->num_kv_heads, c->intermediate_size, c->vocab_size, &m->tp) !=
        KVP_OK)
        return KVP_ERR(KVP_EINVAL, "%s: cannot split the model over %d ranks: %s", what, tp, kvp_error_message());
    if (m->tp.nv < 1)
        return KVP_ERR(KVP_EINVAL, "%s: the %lld-token vocabulary leaves rank %d of %d no rows", what,
                       (long long)c->vocab_size, rank, tp);
    m->mff0 = m->tp.ff0, m->mnff = m->tp.nff;
    kvp_tp_shard e;
    if (c->num_experts > 0) { /* each expert's units split as a dense FFN's (vLLM's tensor-parallel experts) */
        if (kvp_tp_shard_of(tp, rank, c->num_q_heads, c->num_kv_heads, c->moe_intermediate_size, c->vocab_size,
                            &e) != KVP_OK)
            return KVP_ERR(KVP_EINVAL, "%s: cannot split the experts over %d ranks: %s", what, tp,
                           kvp_error_message());
        m->mff0 = e.ff0, m->mnff = e.nff;
    }
    m->comm = comm;
    return KVP_OK;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* KVP_EINVAL for a folder without config.json: what --model takes, and the folder's GGUF file if it has one. */
static kvp_status check_hf_folder(const char *dir, const char *cfgpath)
{
    struct stat sb;
    if (stat(cfgpath, &sb) == 0) return KVP_OK;
    char gguf[256] = "";
    DIR *d = opendir(dir);
    for (struct dirent *e; d && !gguf[0] && (e = readdir(d)) != NULL;)
        if (ends_with(e->d_name, ".gguf")) snprintf(gguf, sizeof gguf, "%s", e->d_name);
    if (d) closedir(d);
    if (gguf[0])
        return KVP_ERR(KVP_EINVAL, "%s: a model folder needs config.json beside its *.safetensors; this one holds "
                       "%s, a GGUF file: pass that file", dir, gguf);
    return KVP_ERR(KVP_EINVAL, "%s: no config.json here: a model is a GGUF file, or a Hugging Face folder with "
                   "config.json and *.safetensors", dir);
}

kvp_status kvp_model_load(const char *path, kvp_model **out) { return kvp_model_load_tp(path, NULL, out); }

kvp_status kvp_model_load_tp(const char *path, kvp_comm *comm, kvp_model **out)
{
    return kvp_model_load_ex(path, comm, KVP_WEIGHT_F32, out);
}

static const char *const k_weight_names[] = {"f32", "f16", "bf16", "q8_0", "auto"};

kvp_status kvp_weight_type_parse(const char *s, kvp_weight_type *out)
{
    for (int i = 0; i < (int)(sizeof k_weight_names / sizeof *k_weight_names); i++)
        if (strcmp(s, k_weight_names[i]) == 0) {
            *out = (kvp_weight_type)i;
            return KVP_OK;
        }
    return KVP_ERR(KVP_EINVAL, "unknown weight type '%s' (f32, f16, bf16, q8_0 or auto)", s);
}

const char *kvp_weight_type_name(kvp_weight_type t)
{
    return (unsigned)t < sizeof k_weight_names / sizeof *k_weight_names ? k_weight_names[t] : "?";
}

/* OpenBLAS's pthread build: stops its server threads, which it starts again for its next threaded product
 * (OpenBLAS does the same before a fork). Weak: other builds lack it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

kvp_status kvp_model_load_ex(const char *path, kvp_comm *comm, kvp_weight_type weights, kvp_model **out)
{
    if (!path || !out) return KVP_ERR(KVP_EINVAL, "kvp_model_load: NULL argument");
    if (strlen(path) >= 900) return KVP_ERR(KVP_EINVAL, "model path too long");
    if ((unsigned)weights > KVP_WEIGHT_AUTO) return KVP_ERR(KVP_EINVAL, "kvp_model_load_ex: weight type %d", (int)weights);
    kvp_model *m = kvp_calloc(1, sizeof *m);
    if (!m) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->threads = 1;
    m->lanes = kvp_cpu_max_lanes();
    m->wtype = weights;
    kvp_status st = KVP_OK;
    kvp_gguf *g = NULL;
    kvp_st *s = NULL;
    source src = {0};
    src.what = path;
    char cfgpath[1100] = "";
    if (!is_dir(path) && !ends_with(path, ".safetensors")) {
        m->is_gguf = 1;
        if ((st = kvp_gguf_open(path, &g)) != KVP_OK) goto fail;
        if ((st = kvp_gguf_model_config(g, &m->cfg)) != KVP_OK) goto fail;
        /* llama.cpp permutes llama/mistral Q/K rows for paired RoPE; qwen, phi3 and gemma GGUFs keep HF's
         * rotate-half. */
        const kvp_model_family fam = m->cfg.family;
        m->rope = strncmp(m->cfg.model_type, "qwen", 4) == 0 || fam == KVP_FAMILY_PHI3 || fam == KVP_FAMILY_GEMMA2
                      ? KVP_ROPE_HALF
                      : KVP_ROPE_PAIRS;
        src.g = g;
    } else {
        if (is_dir(path)) {
            size_t n = strlen(path);
            while (n > 1 && path[n - 1] == '/') n--; /* "dir/" names dir/config.json, not dir//config.json */
            snprintf(cfgpath, sizeof cfgpath, "%.*s/config.json", (int)n, path);
            if ((st = check_hf_folder(path, cfgpath)) != KVP_OK) goto fail;
        } else {
            const char *slash = strrchr(path, '/');
            int dl = slash ? (int)(slash - path) : 1;
            snprintf(cfgpath, sizeof cfgpath, "%.*s/config.json", dl, slash ? path : ".");
        }
        if ((st = kvp_model_config_load(cfgpath, &m->cfg)) != KVP_OK) goto fail;
        if ((st = generation_config(cfgpath, &m->cfg)) != KVP_OK) goto fail;
        m->rope = KVP_ROPE_HALF;
        if ((st = kvp_st_open(path, &s)) != KVP_OK) goto fail;
        src.s = s;
        if (!kvp_st_has(s, "model.embed_tokens.weight"))
            src.wrap = kvp_st_has(s, "language_model.model.embed_tokens.weight")   ? 1
                       : kvp_st_has(s, "model.language_model.embed_tokens.weight") ? 2
                                                                                   : 0;
    }
    if ((st = check_config(&m->cfg, m->is_gguf ? path : cfgpath, m->is_gguf)) != KVP_OK) goto fail;
    if ((st = shard(m, comm, path)) != KVP_OK) goto fail;
    if ((st = init_positions(m)) != KVP_OK) goto fail;
    if ((st = load_weights(m, &src)) != KVP_OK) goto fail;
    if (weights == KVP_WEIGHT_AUTO) m->wtype = held_type(m);
    kvp_gguf_close(g);
    kvp_st_close(s);
    kvp_model_set_threads(m, 1);
    /* The invariant matmul (the default) never calls BLAS, but OpenBLAS's threads, started as it loads,
     * spin-yield for ~100 ms: on 2 cores they took one from the forward pass's threads (the first 64-sequence
     * stories260K decode of a process took 137-145 ms instead of 77 in 4 runs of 6; now 77-92). */
    if (blas_thread_shutdown_) blas_thread_shutdown_();
    *out = m;
    return KVP_OK;
fail:
    kvp_gguf_close(g);
    kvp_st_close(s);
    kvp_model_destroy(m);
    return st;
}

const kvp_model_config *kvp_model_cfg(const kvp_model *m) { return &m->cfg; }
kvp_comm *kvp_model_comm(const kvp_model *m) { return m->comm; }
kvp_rope_style kvp_model_rope_style(const kvp_model *m) { return m->rope; }
const char *kvp_model_path(const kvp_model *m) { return m->path; }
int kvp_model_is_gguf(const kvp_model *m) { return m->is_gguf; }
kvp_weight_type kvp_model_weight_type(const kvp_model *m) { return m->wtype; }

kvp_dtype kvp_model_kv_dtype_auto(const kvp_model *m)
{
    switch (m->wtype) {
    case KVP_WEIGHT_F32: return KVP_DTYPE_F32;
    case KVP_WEIGHT_BF16: return KVP_DTYPE_BF16;
    default: return KVP_DTYPE_F16;
    }
}

kvp_status kvp_kv_dtype_parse(const char *s, kvp_dtype *out, int *is_auto)
{
    *is_auto = strcmp(s, "auto") == 0;
    if (*is_auto) return KVP_OK;
    if (kvp_dtype_parse(s, out) == KVP_OK) return KVP_OK;
    return KVP_ERR(KVP_EINVAL, "unknown KV cache dtype '%s' (use auto, f32, f16, bf16 or fp8)", s);
}

int kvp_model_is_eos(const kvp_model *m, int32_t id)
{
    for (int32_t i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_token_ids[i] == id) return 1;
    return 0;
}
int32_t kvp_model_max_len(const kvp_model *m)
{
    return m->max_len_cap > 0 && m->max_len_cap < m->context ? m->max_len_cap : m->context;
}

kvp_status kvp_model_set_max_len(kvp_model *m, int32_t n)
{
    kvp_status st = KVP_OK;
    m->max_len_cap = 0;
    if (n > m->context)
        st = KVP_ERR(KVP_EINVAL, "max_model_len %d exceeds the context of %s (%d tokens)", n, m->path, m->context);
    else m->max_len_cap = n > 0 ? n : 0;
    set_rope(m);
    return st;
}

int kvp_model_get_threads(const kvp_model *m) { return m->threads; }

void kvp_model_set_threads(kvp_model *m, int n)
{
    if (n < 1) n = 1;
    m->threads = n;
    kvp_attn_set_threads(n); /* OpenBLAS's count is set where a BLAS product runs (matmul) */
}

void kvp_model_set_matmul(kvp_model *m, kvp_matmul_kind k) { m->matmul = k; }

void kvp_model_set_skip_attention(kvp_model *m, int on) { m->skip_attention = on != 0; }

kvp_status kvp_model_set_lanes(kvp_model *m, int lanes)
{
    if (lanes != 8 && lanes != 16)
        return KVP_ERR(KVP_EINVAL, "matmul lanes must be 8 or 16, not %d", lanes);
    if (lanes > kvp_cpu_max_lanes())
        return KVP_ERR(KVP_EUNSUPPORTED,
                       "16-lane matmul needs AVX-512 (F, BW and VL), which this CPU (or build) lacks");
    m->lanes = lanes;
    return KVP_OK;
}

int kvp_model_lanes(const kvp_model *m) { return m->lanes; }

kvp_status kvp_matmul_kind_parse(const char *s, kvp_matmul_kind *out)
{
    if (strcmp(s, "invariant") == 0) *out = KVP_MATMUL_INVARIANT;
    else if (strcmp(s, "blas") == 0) *out = KVP_MATMUL_BLAS;
    else return KVP_ERR(KVP_EINVAL, "unknown matmul '%s' (use invariant or blas)", s);
    return KVP_OK;
}

const char *kvp_matmul_kind_name(kvp_matmul_kind k) { return k == KVP_MATMUL_BLAS ? "blas" : "invariant"; }

/* ---------------------------------------------------------------- KV cache */

void kvp_kv_cache_destroy(kvp_kv_cache *kv)
{
    if (!kv) return;
    if (kv->layers)
        for (int32_t l = 0; l < kv->num_layers; l++) kvp_paged_kv_free_pools(&kv->layers[l]);
    kvp_free(kv->layers);
    kvp_free(kv);
}

kvp_status kvp_kv_cache_create(const kvp_model *m, kvp_dtype dtype, int32_t num_blocks, int32_t block_size,
                               kvp_kv_cache **out)
{
    if (num_blocks < 1 || block_size < 1)
        return KVP_ERR(KVP_EINVAL, "KV cache: num_blocks %d and block_size %d must be >= 1", num_blocks, block_size);
    kvp_kv_cache *kv = kvp_calloc(1, sizeof *kv);
    if (!kv) return KVP_ERR(KVP_ENOMEM, "KV cache: out of memory");
    kv->num_layers = m->cfg.num_layers;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->layers = kvp_calloc((size_t)kv->num_layers, sizeof *kv->layers);
    kvp_status st = kv->layers ? KVP_OK : KVP_ERR(KVP_ENOMEM, "KV cache: out of memory");
    for (int32_t l = 0; st == KVP_OK && l < kv->num_layers; l++) {
        st = kvp_paged_kv_init(&kv->layers[l], dtype, num_blocks, m->tp.nkv, block_size, m->cfg.head_dim);
        if (st == KVP_OK) st = kvp_paged_kv_alloc_pools(&kv->layers[l]);
        if (st == KVP_OK) {
            /* Unused slots hold NaN so a kernel that reads past a sequence's length poisons its output. */
            kvp_paged_kv_fill_nan(&kv->layers[l]);
        }
    }
    if (st != KVP_OK) {
        kvp_kv_cache_destroy(kv);
        return st;
    }
    *out = kv;
    return KVP_OK;
}

double kvp_kv_cache_bytes(const kvp_model *m, kvp_dtype dtype, int64_t num_blocks, int32_t block_size)
{
    return 2.0 * (double)m->cfg.num_layers * (double)m->tp.nkv * (double)m->cfg.head_dim *
           (double)kvp_dtype_size(dtype) * (double)block_size * (double)num_blocks;
}

kvp_status kvp_kv_cache_copy_blocks(kvp_kv_cache *kv, const int32_t *pairs, int32_t n)
{
    if (n == 0) return KVP_OK;
    for (int32_t l = 0; l < kv->num_layers; l++) KVP_TRY(kvp_attn_copy_blocks_cpu(&kv->layers[l], pairs, n));
    return KVP_OK;
}

kvp_status kvp_kv_cache_move_blocks(kvp_kv_cache *dst, const kvp_kv_cache *src, const int32_t *pairs, int32_t n)
{
    if (n == 0) return KVP_OK;
    if (dst->num_layers != src->num_layers || dst->block_size != src->block_size)
        return KVP_ERR(KVP_EINVAL, "moving blocks between KV caches of %d and %d layers, blocks of %d and %d tokens",
                       dst->num_layers, src->num_layers, dst->block_size, src->block_size);
    for (int32_t l = 0; l < dst->num_layers; l++) KVP_TRY(kvp_attn_swap_blocks_cpu(&dst->layers[l], &src->layers[l], pairs, n));
    return KVP_OK;
}

/* ---------------------------------------------------------------- kernels */

/* y (T, N) = x (T, K) . W^T   (W is the [out = N, in = K] weight).
 *
 * The invariant kernel computes every y[t][o] as a chain of multiply-adds in k order,
 * y = mac(x[t][k], W[o][k], y) for k = 0, 1, ..., so a row's result does not depend on T, on the tiling or
 * on the thread split. mac is a fused multiply-add where the target has one (x86-64-v3: the Release build),
 * else a multiply then an add; every row of a build takes the same one. Vector lanes run across outputs,
 * over the packed panels of mat_w (16 outputs x K, contiguous): tiles of 4 rows x 16 outputs keep 8
 * accumulators in registers, a single row takes 4 panels at once (8 independent accumulators). The partial
 * last panel is computed on its zero padding and stored only up to N, so every element goes through the
 * same operations. */
typedef float kvp_v8f __attribute__((vector_size(32)));

/* Vector helpers as macros: functions passing 32-byte vectors by value change the ABI without AVX. */
#define V8_LD(dst, p) memcpy(&(dst), (p), sizeof(kvp_v8f))
#define V8_ST(p, v) memcpy((p), &(v), sizeof(kvp_v8f))
#define V8_BC(x) ((kvp_v8f){(x), (x), (x), (x), (x), (x), (x), (x)})
#define MM_INLINE static inline __attribute__((always_inline))
#ifdef __FMA__
#define V8_MAC(a, b, w) ((kvp_v8f)_mm256_fmadd_ps((__m256)(b), (__m256)(w), (__m256)(a)))
#else
#define V8_MAC(a, b, w) ((a) + (b) * (w))
#endif

/* Stores a (16)-wide accumulator pair to y[0..ncols). */
MM_INLINE void mm_store16(float *restrict y, const kvp_v8f *a0, const kvp_v8f *a1, int64_t ncols)
{
    if (ncols == KVP_MM_PANEL) {
        V8_ST(y, *a0);
        V8_ST(y + 8, *a1);
        return;
    }
    float tmp[KVP_MM_PANEL];
    V8_ST(tmp, *a0);
    V8_ST(tmp + 8, *a1);
    memcpy(y, tmp, (size_t)ncols * sizeof(float));
}

/* Row k (W[o][k] of the panel's 16 outputs) of panel pan (of type DT, a constant at every call) as two f32
 * vectors: f16 through F16C's conversion, bf16 by a shift into the high half of each lane, Q8_0 as d * q
 * (all exact). */
MM_INLINE void mm_load16(const void *restrict pan, int64_t k, const kvp_weight_type DT, kvp_v8f *w0, kvp_v8f *w1)
{
    if (DT == KVP_WEIGHT_F32) {
        const float *p = (const float *)pan + k * KVP_MM_PANEL;
        V8_LD(*w0, p);
        V8_LD(*w1, p + 8);
        return;
    }
    if (DT == KVP_WEIGHT_Q8_0) {
        const unsigned char *blk = (const unsigned char *)pan + (k / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
        const int8_t *q = (const int8_t *)(blk + KVP_MM_PANEL * sizeof(float)) + (k % KVP_Q8_BLOCK) * KVP_MM_PANEL;
        kvp_v8f d0, d1;
        V8_LD(d0, blk);
        V8_LD(d1, blk + 8 * sizeof(float));
#if defined(__AVX2__)
        __m128i v;
        memcpy(&v, q, sizeof v);
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
        memcpy(w0, &q0, sizeof q0);
        memcpy(w1, &q1, sizeof q1);
#else
        float f[KVP_MM_PANEL];
        for (int j = 0; j < KVP_MM_PANEL; j++) f[j] = (float)q[j];
        V8_LD(*w0, f);
        V8_LD(*w1, f + 8);
#endif
        *w0 *= d0;
        *w1 *= d1;
        return;
    }
    const uint16_t *h = (const uint16_t *)pan + k * KVP_MM_PANEL;
#if !(defined(__F16C__) && defined(__AVX2__))
    float f[KVP_MM_PANEL]; /* builds without them (the sanitizer build): the same values, one by one */
    for (int j = 0; j < KVP_MM_PANEL; j++) f[j] = DT == KVP_WEIGHT_F16 ? kvp_f16_to_f32(h[j]) : kvp_bf16_to_f32(h[j]);
    V8_LD(*w0, f);
    V8_LD(*w1, f + 8);
#else
    __m128i lo, hi;
    memcpy(&lo, h, sizeof lo);
    memcpy(&hi, h + 8, sizeof hi);
    __m256 f0, f1;
    if (DT == KVP_WEIGHT_F16) {
        f0 = _mm256_cvtph_ps(lo);
        f1 = _mm256_cvtph_ps(hi);
    } else {
        f0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
        f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
    }
    memcpy(w0, &f0, sizeof f0);
    memcpy(w1, &f1, sizeof f1);
#endif
}

/* R rows (1..6) x one panel: y[r][0..ncols) for rows x + r*K. */
MM_INLINE void mm_rows_panel(float *restrict y, int64_t ldy, const float *restrict x, int64_t K,
                             const void *restrict pan, int64_t ncols, const int R, const kvp_weight_type DT)
{
    kvp_v8f a[6][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = (kvp_v8f){0};
    for (int64_t k = 0; k < K; k++) {
        kvp_v8f w0, w1;
        mm_load16(pan, k, DT, &w0, &w1);
        for (int r = 0; r < R; r++) {
            const kvp_v8f b = V8_BC(x[r * K + k]);
            a[r][0] = V8_MAC(a[r][0], b, w0);
            a[r][1] = V8_MAC(a[r][1], b, w1);
        }
    }
    for (int r = 0; r < R; r++) mm_store16(y + r * ldy, &a[r][0], &a[r][1], ncols);
}

/* One row x 4 full panels (64 outputs), panel pan and the 3 after it (pb bytes apart). */
MM_INLINE void mm_row_4panels(float *restrict y, const float *restrict x, int64_t K, const void *restrict pan,
                              size_t pb, const kvp_weight_type DT)
{
    const char *p0 = pan, *p1 = p0 + pb, *p2 = p1 + pb, *p3 = p2 + pb;
    kvp_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int64_t k = 0; k < K; k++) {
        const kvp_v8f b = V8_BC(x[k]);
        kvp_v8f w0, w1, w2, w3, w4, w5, w6, w7; /* row k of panels 0..3 */
        mm_load16(p0, k, DT, &w0, &w1);
        mm_load16(p1, k, DT, &w2, &w3);
        mm_load16(p2, k, DT, &w4, &w5);
        mm_load16(p3, k, DT, &w6, &w7);
        a0 = V8_MAC(a0, b, w0);
        a1 = V8_MAC(a1, b, w1);
        a2 = V8_MAC(a2, b, w2);
        a3 = V8_MAC(a3, b, w3);
        a4 = V8_MAC(a4, b, w4);
        a5 = V8_MAC(a5, b, w5);
        a6 = V8_MAC(a6, b, w6);
        a7 = V8_MAC(a7, b, w7);
    }
    V8_ST(y, a0);
    V8_ST(y + 8, a1);
    V8_ST(y + 16, a2);
    V8_ST(y + 24, a3);
    V8_ST(y + 32, a4);
    V8_ST(y + 40, a5);
    V8_ST(y + 48, a6);
    V8_ST(y + 56, a7);
}

/* Calls CALL with DT the constant of w->dt: every kernel is compiled once per weight type. */
#define MM_BY_DTYPE(w, CALL)                                                                                 \
    do {                                                                                                     \
        if ((w)->dt == KVP_WEIGHT_F16) {                                                                     \
            const kvp_weight_type DT = KVP_WEIGHT_F16;                                                       \
            CALL;                                                                                            \
        } else if ((w)->dt == KVP_WEIGHT_BF16) {                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_BF16;                                                      \
            CALL;                                                                                            \
        } else if ((w)->dt == KVP_WEIGHT_Q8_0) {                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_Q8_0;                                                      \
            CALL;                                                                                            \
        } else {                                                                                             \
            const kvp_weight_type DT = KVP_WEIGHT_F32;                                                       \
            CALL;                                                                                            \
        }                                                                                                    \
    } while (0)

/* Panel p of w. */
static const void *mm_panel(const mat_w *w, int64_t p)
{
    return (const char *)w->p + (size_t)p * panel_bytes(w->dt, w->K);
}

/* Columns of panel p of w (16 but in the last). */
static int64_t panel_cols(const mat_w *w, int64_t p)
{
    return w->N - p * KVP_MM_PANEL < KVP_MM_PANEL ? w->N - p * KVP_MM_PANEL : KVP_MM_PANEL;
}

/* R = 2..6 rows x panel p (6 rows: 12 accumulators, 8 loads per 12 multiply-adds; 4 rows: 6 per 8). */
static void mm_tile(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p, int R)
{
    const void *pan = mm_panel(w, p);
    const int64_t ncols = panel_cols(w, p);
    const int64_t K = w->K;
    switch (R) {
    case 6: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 6, DT)); break;
    case 4: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 4, DT)); break;
    case 3: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 3, DT)); break;
    default: MM_BY_DTYPE(w, mm_rows_panel(y, ldy, x, K, pan, ncols, 2, DT)); break;
    }
}

/* One row, panels p0 .. p1-1 (4 full panels at a time, then one by one). */
static void mm_row_panels(float *restrict y, const float *restrict x, const mat_w *w, int64_t p0, int64_t p1)
{
    const int64_t K = w->K, N = w->N, full = N / KVP_MM_PANEL;
    int64_t p = p0;
    const size_t pb = panel_bytes(w->dt, K);
    for (; p + 4 <= p1 && p + 4 <= full; p += 4)
        MM_BY_DTYPE(w, mm_row_4panels(y + p * KVP_MM_PANEL, x, K, mm_panel(w, p), pb, DT));
    for (; p < p1; p++) {
        int64_t o = p * KVP_MM_PANEL, nc = N - o < KVP_MM_PANEL ? N - o : KVP_MM_PANEL;
        MM_BY_DTYPE(w, mm_rows_panel(y + o, 0, x, K, mm_panel(w, p), nc, 1, DT));
    }
}

/* The row tiles on 16-lane vectors (AVX-512F, chosen at run time where the CPU has it): one panel row is one
 * vector, so a tile of R rows over two panels keeps 2R accumulators (R up to 12). Every output goes through the
 * same fused multiply-add chain in k order as on 8 lanes: the results are the same bits
 * (tests/runtime/test_model.c compares the two). Single rows keep the 8-lane kernel: a row's chains wait on the
 * multiply-add latency, and two 8-lane chains per panel keep twice as many going as one 16-lane chain. */
#ifdef KVP_BUILD_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f")
/* Row k of panel pan (type DT) as one 16-lane f32 vector. */
MM_INLINE __m512 mm512_load16(const void *restrict pan, int64_t k, const kvp_weight_type DT)
{
    if (DT == KVP_WEIGHT_F32) return _mm512_loadu_ps((const float *)pan + k * KVP_MM_PANEL);
    if (DT == KVP_WEIGHT_Q8_0) {
        const unsigned char *blk = (const unsigned char *)pan + (k / KVP_Q8_BLOCK) * KVP_Q8_BLOCK_BYTES;
        const int8_t *q = (const int8_t *)(blk + KVP_MM_PANEL * sizeof(float)) + (k % KVP_Q8_BLOCK) * KVP_MM_PANEL;
        const __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
        return _mm512_mul_ps(qf, _mm512_loadu_ps((const float *)blk));
    }
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pan + k * KVP_MM_PANEL));
    if (DT == KVP_WEIGHT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* R rows (up to 12) x NP panels (1 or 2): pan, then (NP 2) the one pb bytes after it, a full panel first;
 * y[r][0..ncols) of the last panel, for rows x + r*K. With two panels each broadcast x element feeds two
 * multiply-adds: 14 loads per 24, against 13 per 12 with one. */
MM_INLINE void mm512_rows_panels(float *restrict y, int64_t ldy, const float *restrict x, int64_t K,
                                 const void *restrict pan, size_t pb, int64_t ncols, const int R, const int NP,
                                 const kvp_weight_type DT)
{
    __m512 a[2][12];
    const void *pan1 = (const char *)pan + pb;
    for (int r = 0; r < R; r++) a[0][r] = a[1][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 w0 = mm512_load16(pan, k, DT), w1 = NP == 2 ? mm512_load16(pan1, k, DT) : w0;
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[r * K + k]);
            a[0][r] = _mm512_fmadd_ps(xb, w0, a[0][r]);
            if (NP == 2) a[1][r] = _mm512_fmadd_ps(xb, w1, a[1][r]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << ncols) - 1u);
    for (int r = 0; r < R; r++) {
        if (NP == 2) _mm512_storeu_ps(y + r * ldy, a[0][r]);
        _mm512_mask_storeu_ps(y + r * ldy + (NP - 1) * KVP_MM_PANEL, keep, a[NP - 1][r]);
    }
}

/* R = 4, 8 or 12 rows x NP panels from p. */
MM_INLINE void mm512_tile_np(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p,
                             int R, const int NP)
{
    const void *pan = mm_panel(w, p);
    const int64_t K = w->K, nc = panel_cols(w, p + NP - 1);
    const size_t pb = panel_bytes(w->dt, K);
    switch (R) {
    case 12: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 12, NP, DT)); break;
    case 8: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 8, NP, DT)); break;
    default: MM_BY_DTYPE(w, mm512_rows_panels(y, ldy, x, K, pan, pb, nc, 4, NP, DT)); break;
    }
}

/* R = 4, 8 or 12 rows x panels p and p + 1, or p alone when it is the last. */
static void mm512_tile(float *restrict y, int64_t ldy, const float *restrict x, const mat_w *w, int64_t p, int R)
{
    if (p + 1 < (w->N + KVP_MM_PANEL - 1) / KVP_MM_PANEL) mm512_tile_np(y, ldy, x, w, p, R, 2);
    else mm512_tile_np(y, ldy, x, w, p, R, 1);
}

#pragma GCC pop_options
#endif

typedef void (*mm_tile_fn)(float *restrict, int64_t, const float *restrict, const mat_w *, int64_t, int);

/* Threads for a product of T rows with w: all of them from 1 MiB of weights for one row (worth a fork/join),
 * else one. */
static int matmul_threads(int threads, int64_t T, const mat_w *w)
{
    return T * w->N * w->K >= (1 << 18) ? threads : 1;
}

/* The invariant matmul over T rows, on 8 lanes or (wide) 16, in column units of one panel (8 lanes) or two
 * (16 lanes: each broadcast input feeds two panels' multiply-adds; the last unit may hold one). When large
 * enough, tiles of 4 (wide: 8) rows per unit split over `threads`, then the remaining rows with their panels
 * split over the threads in runs of 4 (a single row of a model whose weights do not fit in cache is bound by
 * reading them: one core alone does not reach the machine's bandwidth); on one thread tiles of 6 then 4 rows
 * (wide: 12, 8, 4) per unit, then 2 or 3 rows, a single row across several panels at once (8 lanes). Every
 * output goes through the same multiply-add chain whatever the split, the unit and the lanes. */
static void matmul_inv(int threads, int wide, float *y, const float *x, const mat_w *w, int64_t T)
{
    const int64_t K = w->K, N = w->N, np = (N + KVP_MM_PANEL - 1) / KVP_MM_PANEL;
    mm_tile_fn tile = mm_tile;
    int ps = 1; /* panels a unit */
#ifdef KVP_BUILD_AVX512
    if (wide) tile = mm512_tile, ps = 2;
#endif
    const int64_t nu = (np + ps - 1) / ps, uw = ps * KVP_MM_PANEL; /* units, a unit's columns */
    const int RT = wide ? 8 : 4; /* rows of a tile in the threaded split */
    const int64_t ntb = T / RT;
    const int nt = matmul_threads(threads, T, w);
    if (nt > 1) {
        if (ntb > 0) {
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2)
            for (int64_t u = 0; u < nu; u++)
                for (int64_t tb = 0; tb < ntb; tb++) tile(y + tb * RT * N + u * uw, N, x + tb * RT * K, w, u * ps, RT);
        }
        if (ntb * RT < T) {
            const int64_t runs = (np + 3) / 4; /* runs of 4 panels, split evenly */
#pragma omp parallel for num_threads(nt) schedule(static)
            for (int c = 0; c < nt; c++) {
                int64_t p0 = 4 * (runs * c / nt), p1 = 4 * (runs * (c + 1) / nt);
                if (p1 > np) p1 = np;
                for (int64_t t = ntb * RT; t < T; t++) mm_row_panels(y + t * N, x + t * K, w, p0, p1);
            }
        }
        return;
    }
    /* one thread: row tiles per unit. 8 lanes: 6 rows (12 accumulators), then 4 (twice rather than
     * leave 2 or 3 behind 6s: 32 = 4 x 6 + 2 x 4); 16 lanes: 12 rows, then 8, then 4 (2R accumulators each);
     * then a pair or a triple on 8 lanes. A single row left takes several panels at once. */
    const int big = wide ? 12 : 6;
    int64_t n_big = T / big, n8 = 0, n4 = 0, left = T % big;
    if (wide) {
        n8 = left >= 8;
        left -= 8 * n8;
        n4 = left >= 4;
        left -= 4 * n4;
    } else if ((left == 2 || left == 3) && n_big > 0) {
        n_big--;
        n4 = 2;
        left -= 2;
    } else if (left >= 4) {
        n4 = 1;
        left -= 4;
    }
    const int64_t t8 = n_big * big, t4 = t8 + n8 * 8, tl = t4 + n4 * 4;
    for (int64_t u = 0; u < nu; u++) {
        const int64_t o = u * uw, p = u * ps;
        for (int64_t tb = 0; tb < n_big; tb++) tile(y + tb * big * N + o, N, x + tb * big * K, w, p, big);
        if (n8) tile(y + t8 * N + o, N, x + t8 * K, w, p, 8);
        for (int64_t tb = 0; tb < n4; tb++) tile(y + (t4 + tb * 4) * N + o, N, x + (t4 + tb * 4) * K, w, p, 4);
        for (int64_t q = p; left >= 2 && q < p + ps && q < np; q++) /* 8 lanes: 2 chains a row */
            mm_tile(y + tl * N + q * KVP_MM_PANEL, N, x + tl * K, w, q, (int)left);
    }
    if (left == 1) mm_row_panels(y + tl * N, x + tl * K, w, 0, np);
}

static void matmul(const kvp_model *m, int threads, float *y, const float *x, const mat_w *w, int64_t T)
{
    if (m->matmul == KVP_MATMUL_BLAS) {
        /* OpenBLAS's threads as the invariant kernel's: on a smaller product they cost more than they bring
         * (stories260K single-stream on 2 threads: 25,300 - 36,900 tok/s, against 48,700 on one). Inside the
         * data-parallel groups threads is 1 and so is OpenBLAS's count already, so the groups never set it. */
        const int nt = matmul_threads(threads, T, w);
        if (openblas_get_num_threads() != nt) openblas_set_num_threads(nt);
        if (T == 1) { /* y = Wt^T x: a matrix-vector product (sgemm with one row is ~3x slower) */
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)w->K, (int)w->N, 1.0f, w->t, (int)w->N, x, 1, 0.0f, y, 1);
            return;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)w->N, (int)w->K, 1.0f, x, (int)w->K, w->t,
                    (int)w->N, 0.0f, y, (int)w->N);
        return;
    }
    matmul_inv(threads, m->lanes == 16, y, x, w, T);
}

/* exp(x) on 16 lanes (Cephes expf: 2^n * p(r), |r| <= ln2/2, about 1 ulp), x clamped to [-87, 88] so 2^n
 * stays a normal float; NaN lanes stay NaN. Plain vector operations, no FMA: the same bits in every build. */
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
__attribute__((target_clones("avx512f", "default"))) static void glu(int act, float *restrict g,
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
static void softcap(float *x, int64_t n, double cap)
{
    const float c = (float)cap;
    for (int64_t i = 0; cap > 0 && i < n; i++) x[i] = c * tanhf(x[i] / c);
}

/* The sum of squares runs in eight lanes (element i into lane i % 8, a zero-padded tail), then the lanes are
 * added in a fixed tree: one order for every n and every row. A single scalar chain waited on the add's
 * latency at each element (64 of them a row for stories260K, 11 rows a token). */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n, double eps)
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

/* cs (2 * head_dim/2): cos, sin of pos * inv_freq[i] times rope_scale, interleaved (computed in double, rounded
 * to float). */
static void rope_angles(const kvp_model *m, const double *inv_freq, double scale, int32_t pos, float *cs)
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
static void rope(const kvp_model *m, float *v, int32_t nheads, const float *cs)
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
        matmul(m, nt, g, xe, &w->experts[3 * e], n);
        matmul(m, nt, u, xe, &w->experts[3 * e + 1], n);
        glu(KVP_ACT_SILU, g, u, n * m->mnff);
        matmul(m, nt, ye, g, &w->experts[3 * e + 2], n);
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
        rope_angles(m, m->inv_freq, m->rope_scale, b->positions[t], cs + t * hd);
        if (m->inv_freq_local) rope_angles(m, m->inv_freq_local, 1.0, b->positions[t], csl + t * hd);
    }
    for (int32_t l = 0; l < c->num_layers; l++) {
        const layer_w *w = &m->layers[l];
        for (int64_t t = 0; t < T; t++) rmsnorm(h + t * H, x + t * H, w->attn_norm, H, c->rms_norm_eps);
        matmul(m, nt, q, h, &w->wq, T);
        matmul(m, nt, k, h, &w->wk, T);
        matmul(m, nt, v, h, &w->wv, T);
        for (int64_t t = 0; t < T; t++) {
            if (w->bq)
                for (int64_t i = 0; i < QD; i++) q[t * QD + i] += w->bq[i];
            if (w->bk)
                for (int64_t i = 0; i < KD; i++) k[t * KD + i] += w->bk[i];
            if (w->bv)
                for (int64_t i = 0; i < KD; i++) v[t * KD + i] += w->bv[i];
            if (w->q_norm) {
                for (int64_t i = 0; i < nq; i++) rmsnorm(q + t * QD + i * hd, q + t * QD + i * hd, w->q_norm, hd, c->rms_norm_eps);
                for (int64_t i = 0; i < nkv; i++) rmsnorm(k + t * KD + i * hd, k + t * KD + i * hd, w->k_norm, hd, c->rms_norm_eps);
            }
            const float *lcs = (c->layer_is_sliding[l] ? csl : cs) + t * hd;
            rope(m, q + t * QD, (int32_t)nq, lcs);
            rope(m, k + t * KD, (int32_t)nkv, lcs);
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
        matmul(m, nt, h, o, &w->wo, T); /* row-parallel: the ranks' partial sums */
        KVP_TRY(all_reduce(m, h, T * H));
        if (w->bo)
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < H; i++) h[t * H + i] += w->bo[i];
        for (int64_t t = 0; w->post_attn_norm && t < T; t++)
            rmsnorm(h + t * H, h + t * H, w->post_attn_norm, H, c->rms_norm_eps);
        for (int64_t i = 0; i < T * H; i++) x[i] += h[i];
        for (int64_t t = 0; t < T; t++) rmsnorm(h + t * H, x + t * H, w->ffn_norm, H, c->rms_norm_eps);
        float *ffn = h;
        if (w->n_experts) {
            ffn = moe_ffn(m, nt, w, h, T, gt, up, mfs, mis);
        } else {
            matmul(m, nt, gt, h, &w->w_gate, T);
            matmul(m, nt, up, h, &w->w_up, T);
            glu(c->ffn_act, gt, up, T * FF);
            matmul(m, nt, h, gt, &w->w_down, T);
        }
        KVP_TRY(all_reduce(m, ffn, T * H));
        for (int64_t t = 0; w->post_ffn_norm && t < T; t++)
            rmsnorm(ffn + t * H, ffn + t * H, w->post_ffn_norm, H, c->rms_norm_eps);
        for (int64_t i = 0; i < T * H; i++) x[i] += ffn[i];
    }
    for (int32_t s = 0, r = 0; s < b->num_seqs; s++)
        for (int64_t t = every_logit(b, s) ? b->qo_indptr[s] : b->qo_indptr[s + 1] - 1; t < b->qo_indptr[s + 1]; t++)
            rmsnorm(fin + r++ * H, x + t * H, m->out_norm, H, c->rms_norm_eps);
    if (m->tp.tp == 1) {
        matmul(m, nt, logits, fin, &m->lm_head, S);
        softcap(logits, S * c->vocab_size, c->final_logit_softcapping);
        return KVP_OK;
    }
    /* vocab-parallel LM head: this rank's columns of the logits, gathered as tp slices of vpad, then
     * reassembled row by row (the last slice may be short) */
    const int64_t vp = m->tp.vpad, V = m->cfg.vocab_size;
    float *all = lg + S * vp;
    matmul(m, nt, lg, fin, &m->lm_head, S); /* (S, nv) at stride nv */
    for (int64_t r = S - 1; r >= 0; r--) memmove(lg + r * vp, lg + r * m->tp.nv, (size_t)m->tp.nv * sizeof(float));
    KVP_TRY(kvp_comm_all_gather_f32(m->comm, lg, S * vp, all));
    for (int32_t k = 0; k < m->tp.tp; k++) {
        const int64_t v0 = k * vp, nv = V - v0 < vp ? V - v0 : vp;
        for (int64_t r = 0; nv > 0 && r < S; r++)
            memcpy(logits + r * V + v0, all + (k * S + r) * vp, (size_t)nv * sizeof(float));
    }
    softcap(logits, S * V, c->final_logit_softcapping);
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
        for (int64_t i = 0; i < layer_nmats(&m->layers[l]); i++)
            if (layer_mat(&m->layers[l], i)->p) KVP_TRY(mat_need_t(layer_mat(&m->layers[l], i)));
    return mat_need_t(&m->lm_head);
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
