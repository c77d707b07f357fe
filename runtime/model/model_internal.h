/* runtime/model/model_internal.h — what the parts of the CPU model share (not a public header):
 *
 *   model.c     load entry points, configuration checks at load, getters and setters
 *   weights.c   the tensors of a checkpoint into the model's layouts (packed panels, Q8_0), tensor-parallel
 *               slices, MoE experts; freeing them
 *   rope.c      RoPE frequencies (every scaling: linear, dynamic, llama3, YaRN, LongRoPE, partial) and rotation
 *   threads.c   the model's worker pool (kvp_model_run)
 *   matmul.c    the batch-invariant matmul (8- and 16-lane tiles) and the OpenBLAS path
 *   ops.c       the small kernels: RMSNorm, gated activations (SwiGLU, GeGLU), soft caps
 *   kv_cache.c  the paged KV pools of every layer, copies and moves of blocks
 *   forward.c   one batched forward pass over the paged KV cache (attention through attention/)
 */
#ifndef KVP_RUNTIME_MODEL_MODEL_INTERNAL_H
#define KVP_RUNTIME_MODEL_MODEL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "parallel/shard.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"
#include "runtime/model/model.h"

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


/* 8-lane vectors of the matmul and the norms. */
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

/* Where the tensors of a load come from (weights.c): a GGUF file or a safetensors folder. */
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

/* ---- functions one part defines for another (the file that defines each says what it does) */
void mdl_pool_destroy(worker_pool *wp);
size_t mdl_panel_bytes(kvp_weight_type dt, int64_t K);
float mdl_mat_at(const mat_w *w, int64_t o, int64_t k);
kvp_status mdl_mat_need_t(mat_w *w);
int64_t mdl_layer_nmats(const layer_w *w);
mat_w *mdl_layer_mat(layer_w *w, int64_t i);
kvp_weight_type mdl_held_type(kvp_model *m);
void mdl_set_rope(kvp_model *m);
kvp_status mdl_load_weights(kvp_model *m, const source *src);
kvp_status mdl_check_config(const kvp_model_config *c, const char *cfg_file, int gguf);
kvp_status mdl_generation_config(const char *cfgpath, kvp_model_config *c);
void mdl_rope_angles(const kvp_model *m, const double *inv_freq, double scale, int32_t pos, float *cs);
void mdl_rope(const kvp_model *m, float *v, int32_t nheads, const float *cs);
kvp_status mdl_shard(kvp_model *m, kvp_comm *comm, const char *what);
void mdl_matmul(const kvp_model *m, int threads, float *y, const float *x, const mat_w *w, int64_t T);
void mdl_softcap(float *x, int64_t n, double cap);
void mdl_rmsnorm(float *out, const float *x, const float *w, int64_t n, double eps);
void mdl_glu(int act, float *restrict g, const float *restrict u, int64_t n);

#endif
