/* tests/runtime/checkpoint_testutil.h — checkpoints the model tests write: copies of stories260K's HF folder and
 * GGUF file with an edited config, metadata or tensor info, the same weights in other dtypes, and whole models
 * of other families built from stories260K's weights (phi3's fused layout, mixtral / qwen3_moe experts, gemma
 * 1-3), each as an HF folder or a GGUF file. Paths returned live in a fresh temp dir under the test binary's
 * (model_testutil.h) and, where said, in a static buffer that the next call overwrites. Every call asserts
 * (Criterion). Built into the kvp_model_testutil library (tests/CMakeLists.txt). */
#ifndef KVP_TESTS_RUNTIME_CHECKPOINT_TESTUTIL_H
#define KVP_TESTS_RUNTIME_CHECKPOINT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "model_testutil.h"
#include "runtime/loader/safetensors.h"

/* ---- copies of stories260K with edits ---- */

/* Copies the HF folder into a temp dir with config.json's first config_from replaced by config_to and the
 * safetensors header's tensor_from by tensor_to (the same length); NULL: no edit. Returns the folder (static). */
const char *tu_hf_copy(const char *config_from, const char *config_to, const char *tensor_from,
                       const char *tensor_to);

/* tu_write_quantized_gguf's modes */
enum { TU_QF16, TU_QQ8_0, TU_QQ4_0 };

/* Rewrites stories260K.gguf with 2-D weights in F16, or in Q8_0 / Q4_0 (rows of a multiple of 32; the
 * others in F16), norms in F32. */
void tu_write_quantized_gguf(const char *path, int mode);

/* Writes an HF folder: config.json = stories260K's with `from` replaced by `to`, and its safetensors plus
 * zero-filled 1-D tensors extra[i] of lens[i] floats. Returns the folder. */
const char *tu_hf_variant(const char *from, const char *to, const char *const *extra, const int64_t *lens,
                          int n_extra);

/* Writes dir/name: stories260K.gguf with 4-byte metadata `key` set to *v (GGUF type `type`), or, when key is
 * NULL, tensor `tensor`'s data offset set to `offset`. Returns the path (static). */
const char *tu_gguf_variant(const char *name, const char *key, uint32_t type, const void *v, const char *tensor,
                            uint64_t offset);

/* Where stories260K.gguf's tensor infos end (buf, len: the file) and how many tensors it has. */
size_t tu_gguf_info_end(const unsigned char *buf, size_t len, int64_t *num_tensors);

/* stories260K.gguf with one more tensor, rope_freqs.weight = ff[0..4) (llama.cpp's llama3 rope factors):
 * its tensor info goes after the others, its data after theirs (offsets stay relative to the data). */
const char *tu_gguf_with_rope_freqs(const float ff[4]);

/* dir/name: stories260K.gguf with n more metadata pairs, kvs (as tu_kv_* write them), first after the header.
 * Everything after them moves by their length, the tensor data to the next multiple of 32 (tensor offsets
 * are relative to it). */
const char *tu_gguf_with_kvs(const char *name, const tu_buf *kvs, uint64_t n);

/* ---- whole checkpoints of other families, from stories260K's weights ---- */

/* stories260K as a phi3 checkpoint, from its HF weights in the fused layout Hugging Face and llama.cpp's
 * converter give phi3 (per layer one QKV matrix, the q rows then k's then v's, and one gate/up matrix, the gate
 * rows then up's; rotate-half RoPE in both formats). perm (NULL: none) reorders the dimensions of every Q and K
 * head alike, which leaves every score unchanged. */
typedef struct {
    int gguf;            /* 1: a GGUF file; 0: an HF folder */
    int32_t rot;         /* GGUF: rope.dimension_count */
    const int *perm;     /* row j of a head <- row perm[j] */
    const char *cfg_add; /* HF: added to config.json after "model_type": "phi3" (starts with ", ") */
    const tu_buf *kvs;   /* GGUF: more metadata (as tu_kv_* write it), nkv pairs */
    uint64_t nkv;
    const float *longf, *shortf; /* GGUF: rope_factors_long/short.weight (rot / 2 each), or NULL */
    const float *freqs;          /* GGUF: rope_freqs.weight (rot / 2), or NULL */
} phi3_spec;

/* A tensor of a checkpoint the tests write (f32): experts x rows x cols; cols 0: a vector; experts 0: not
 * GGUF's stack of every expert's matrix. */
typedef struct {
    char name[128];
    int64_t rows, cols;
    float *f;
    int64_t experts;
} ck_tensor;

/* Its element count. */
size_t ck_numel(const ck_tensor *t);

/* Tensor `name` of s as a malloc'd f32 copy (the caller frees it); *numel its size when numel is not NULL. */
float *tu_st_f32(kvp_st *s, const char *name, int64_t *numel);

/* Rows of the heads of one projection, [heads x 8, 64], each head's dimensions reordered by perm. */
void tu_permute_heads(float *w, int heads, const int *perm);

/* Appends tensor f (rows x cols; cols 0: a vector) named gg in a GGUF, else hf; layer l's names get
 * "blk.l." / "model.layers.l." in front (l < 0: a model-level tensor). The checkpoint frees f. */
void ck_add(ck_tensor *t, int *nt, int g, int l, const char *gg, const char *hf, int64_t rows,
                     int64_t cols, float *f);

/* How tu_write_checkpoint writes stories260K's sizes: a GGUF file of architecture `arch` (rope.dimension_count
 * rot, more metadata kvs as tu_kv_* write them, nkv pairs) or an HF folder whose config.json is stories260K's
 * with model_type `arch` and cfg_add after it (starting with ", "). */
typedef struct {
    int gguf;
    const char *arch;
    uint32_t rot;
    const char *cfg_add;
    const tu_buf *kvs;
    uint64_t nkv;
} ck_format;

/* Writes tensors t (and frees their data); returns the GGUF file or HF folder. */
const char *tu_write_checkpoint(ck_tensor *t, int nt, const ck_format *fm);

/* Writes the phi3 checkpoint sp describes; returns its GGUF file or HF folder (static). */
const char *tu_phi3_model(const phi3_spec *sp);

/* ---- mixture of experts: mixtral, qwen3_moe ---- */

/* stories260K with a mixture-of-experts FFN: expert e's gate rows are stories260K's gate rows (r + 13 e) mod
 * 172, its up rows and down columns stories260K's rows r (down scaled by 1 - 0.15 e), r < mf; with `same`,
 * every expert is stories260K's FFN unchanged. The router is seeded noise. qwen: qwen3_moe (GGUF: qwen3moe)
 * with q/k norms, mf units an expert; else mixtral (mf 172; GGUF: arch
 * llama with expert keys, Q/K rows in llama.cpp's pair order). */
typedef struct {
    int gguf, qwen, same, norm_topk;
    int experts, k, mf;
    int dense2; /* qwen, HF: layer 2 has a dense FFN (mlp_only_layers [2]) */
} moe_spec;

/* experts 0: every layer dense (a GGUF that says expert_count 0) */
int tu_moe_dense_layer(const moe_spec *sp, int l);

/* The tensors of the model sp describes, as its format names and lays them out, into t; returns the count. */
int tu_moe_tensors(const moe_spec *sp, ck_tensor *t); /* t: 512 at most */

/* Writes the checkpoint sp describes (tu_moe_tensors in its format, with the expert config); returns its GGUF
 * file or HF folder (static). */
const char *tu_moe_model(const moe_spec *sp);

/* The data of tensor `name` among t[0, nt), asserting it is there. */
const float *ck_find(const ck_tensor *t, int nt, const char *name);

/* stories260K as a gemma (v 1), gemma2 (v 2) or gemma3 (v 3, HF gemma3_text) checkpoint: its weights, norms that
 * give stories260K's norm weights as 1 + w (HF stores w, GGUF 1 + w, as llama.cpp's converter writes them), the
 * post-norms and gemma3's q/k norms seeded noise around 1; rotate-half RoPE in both formats. HF config:
 * query_pre_attn_scalar qpas (GGUF: llama.cpp's 1/sqrt(head_dim)); both: the soft caps, the window, gemma3's
 * local RoPE base (0: each key left out of the file, for its default). */
typedef struct {
    int gguf, v;
    double qpas, attn_cap, final_cap;
    int window;
    int gelu;              /* HF: "hidden_activation": "gelu" (exact) */
    int pattern;           /* HF gemma3: sliding_window_pattern (0: absent, 6) */
    double local_theta;    /* gemma3: rope_local_base_freq (GGUF rope.freq_base_swa); 0: absent, 10,000 */
    double linear;         /* HF: rope_scaling linear with this factor (gemma3: the full layers' only); 0: none */
    const char *cfg_extra; /* HF: more config.json fields (", ...") */
} gemma_spec;

/* The tensors of the model sp describes, as its format names them, into t (128 at most); returns the count. */
int tu_gemma_tensors(const gemma_spec *sp, ck_tensor *t);

/* Writes the checkpoint sp describes; returns its GGUF file or HF folder (static). */
const char *tu_gemma_model(const gemma_spec *sp);

/* Whether layer l of the model sp describes slides (gemma3: also its RoPE base) */
int tu_gemma_sliding(const gemma_spec *sp, int l);

#endif
