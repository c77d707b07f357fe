/* Forward-pass tests on stories260K: golden logits (GGUF pairs RoPE and HF rotate-half), golden greedy
 * continuations through the paged KV cache with a shuffled page table, and load errors on corrupt or
 * incomplete checkpoints made here. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "parallel/comm.h"
#include "model_testutil.h"
#include "runtime/loader/gguf.h"
#include "runtime/model/model.h"
#include "runtime/loader/safetensors.h"
#include "runtime/engine/sampler.h"
#include "runtime/text/tokenizer.h"

static kvp_model *load(const char *path)
{
    tu_require_shared();
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load(path, &m), KVP_OK, "%s: %s", path, kvp_error_detail());
    return m;
}

/* Runs a prompt then greedy decoding on one sequence whose blocks are a shuffled set of the cache's blocks.
 * out[0..steps-np) receives the generated tokens. Prefill in chunks of `chunk` tokens (0: all at once). */
static void greedy_one(kvp_model *m, int32_t bs, const int32_t *prompt, int32_t np, int32_t steps, int32_t chunk,
                       int32_t *out)
{
    int32_t nblocks = (steps + bs - 1) / bs + 3;
    kvp_kv_cache *kv;
    cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, nblocks, bs, &kv), KVP_OK, "%s", kvp_error_detail());
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int32_t i = 0; i < nblocks; i++) perm[i] = i;
    srand(7);
    for (int32_t i = nblocks - 1; i > 0; i--) {
        int32_t j = rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t V = (int32_t)kvp_model_cfg(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)steps), *pos = malloc(sizeof(int32_t) * (size_t)steps);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)steps);
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)np);
    int32_t len = 0, ngen = 0;
    while (len < steps) {
        int32_t n = len < np ? np - len : 1;
        if (len < np && chunk > 0 && n > chunk) n = chunk;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = len + i;
            slots[i] = (int64_t)perm[(len + i) / bs] * bs + (len + i) % bs;
        }
        int32_t total = len + n;
        int32_t qo[2] = {0, n}, kvi[2] = {0, (total + bs - 1) / bs}, last = total - (kvi[1] - 1) * bs;
        kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = n, .tokens = toks + len, .positions = pos,
                           .slot_mapping = slots, .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = perm,
                           .kv_last_page_len = &last};
        cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_OK, "%s", kvp_error_detail());
        len = total;
        if (len >= np) {
            int32_t best = 0;
            for (int32_t i = 1; i < V; i++)
                if (logits[i] > logits[best]) best = i;
            if (len < steps) toks[len] = best;
            out[ngen++] = best;
        }
    }
    free(perm);
    free(logits);
    free(toks);
    free(pos);
    free(slots);
    kvp_kv_cache_destroy(kv);
}

static void check_golden(kvp_model *m, int32_t bs, int32_t chunk)
{
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
    {
        int32_t prompt[64], np = 0, want[512], nw = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "prompt_tokens")) prompt[np++] = x->valueint;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "tokens_after_bos")) want[nw++] = x->valueint;
        int32_t steps = cJSON_GetObjectItem(c, "steps")->valueint;
        cr_assert_eq(nw, steps);
        int32_t got[512];
        greedy_one(m, bs, prompt, np, steps, chunk, got);
        /* got[i] is the token at position np + i; want[j] is the token at position j + 1. */
        for (int32_t i = 0; np + i < steps + 1 && np + i - 1 < nw; i++)
            cr_assert_eq(got[i], want[np - 1 + i], "%s, block %d: position %d: got %d, want %d", kvp_model_path(m),
                         bs, np + i, got[i], want[np - 1 + i]);
    }
    cJSON_Delete(gold);
}

Test(model, golden_logits_both_formats)
{
    cJSON *gl;
    tu_require_shared();
    cr_assert_eq(kvp_json_parse_file(S260_DIR "/golden_logits.json", &gl), KVP_OK);
    const char *paths[2] = {S260_GGUF, S260_HF};
    for (int f = 0; f < 2; f++) {
        kvp_model *m = load(paths[f]);
        cr_assert_eq(kvp_model_rope_style(m), f == 0 ? KVP_ROPE_PAIRS : KVP_ROPE_HALF);
        for (int mm = 0; mm < 2; mm++) {
            kvp_model_set_matmul(m, mm ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
            int32_t toks[5] = {1, 403, 407, 261, 378}, pos[5] = {0, 1, 2, 3, 4}, blocks[2] = {1, 0};
            int64_t slots[5] = {4, 5, 6, 7, 0};
            int32_t qo[2] = {0, 5}, kvi[2] = {0, 2}, last = 1;
            kvp_kv_cache *kv;
            cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, 2, 4, &kv), KVP_OK);
            kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 5, .tokens = toks, .positions = pos, .slot_mapping = slots,
                               .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last,
                               .all_logits = 1};
            float logits[5 * 512];
            cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_OK, "%s", kvp_error_detail());
            const cJSON *rows = cJSON_GetObjectItem(gl, "logits");
            double maxerr = 0;
            for (int r = 0; r < 5; r++)
                for (int i = 0; i < 512; i++) {
                    double want = cJSON_GetArrayItem(cJSON_GetArrayItem(rows, r), i)->valuedouble;
                    double err = fabs(logits[r * 512 + i] - want) / (fabs(want) + 1.0);
                    if (err > maxerr) maxerr = err;
                }
            cr_assert_lt(maxerr, 1e-4, "%s matmul %d: max relative logit error %g", paths[f], mm, maxerr);
            kvp_kv_cache_destroy(kv);
        }
        kvp_model_destroy(m);
    }
    cJSON_Delete(gl);
}

Test(model, golden_greedy_gguf_paged)
{
    kvp_model *m = load(S260_GGUF);
    check_golden(m, 16, 0);
    check_golden(m, 1, 3);
    kvp_model_destroy(m);
}

Test(model, golden_greedy_hf_paged)
{
    kvp_model *m = load(S260_HF);
    check_golden(m, 64, 0);
    check_golden(m, 7, 2);
    kvp_model_set_matmul(m, KVP_MATMUL_BLAS);
    check_golden(m, 16, 0);
    kvp_model_destroy(m);
}

/* Element e of a pool of type t, as a float. */
static float elem(const void *pool, kvp_dtype t, size_t e)
{
    switch (t) {
    case KVP_DTYPE_F32: return ((const float *)pool)[e];
    case KVP_DTYPE_F16: return kvp_f16_to_f32(((const uint16_t *)pool)[e]);
    case KVP_DTYPE_BF16: return kvp_bf16_to_f32(((const uint16_t *)pool)[e]);
    default: return kvp_fp8e4m3_to_f32(((const uint8_t *)pool)[e]);
    }
}

/* Each element type gives pools of its size, every slot NaN until written; a bad dtype is refused. */
Test(model, kv_cache_dtypes)
{
    kvp_model *m = load(S260_GGUF);
    const kvp_dtype dts[4] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};
    for (int i = 0; i < 4; i++) {
        kvp_kv_cache *kv;
        cr_assert_eq(kvp_kv_cache_create(m, dts[i], 3, 16, &kv), KVP_OK, "%s", kvp_error_detail());
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(kv->num_layers, c->num_layers);
        for (int32_t l = 0; l < kv->num_layers; l++) {
            const kvp_paged_kv *p = &kv->layers[l];
            cr_assert_eq(p->dtype, dts[i]);
            const size_t es = kvp_dtype_size(dts[i]), n = kvp_paged_kv_pool_bytes(p);
            cr_assert_eq(n, (size_t)3 * 16 * (size_t)c->num_kv_heads * (size_t)c->head_dim * es);
            for (size_t e = 0; e < n / es; e++)
                cr_assert(isnan(elem(p->k, dts[i], e)) && isnan(elem(p->v, dts[i], e)), "%s layer %d element %zu",
                          kvp_dtype_name(dts[i]), l, e);
        }
        kvp_kv_cache_destroy(kv);
    }
    kvp_kv_cache *kv = NULL;
    cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_COUNT, 3, 16, &kv), KVP_EINVAL);
    cr_assert_null(kv);
    kvp_model_destroy(m);
}

Test(model, forward_rejects_bad_batches)
{
    kvp_model *m = load(S260_GGUF);
    kvp_kv_cache *kv;
    cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, 4, 16, &kv), KVP_OK);
    int32_t toks[1] = {600}, pos[1] = {0}, blocks[1] = {0}, qo[2] = {0, 1}, kvi[2] = {0, 1}, last = 1;
    int64_t slots[1] = {0};
    kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 1, .tokens = toks, .positions = pos, .slot_mapping = slots,
                       .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last};
    float logits[512];
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "600"));
    toks[0] = 5;
    pos[0] = 5000;
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "context"), "%s", kvp_error_message());
    pos[0] = 0;
    slots[0] = 64;
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    kvp_kv_cache_destroy(kv);
    kvp_model_destroy(m);
}

/* Copies the HF folder into a temp dir with an edited config.json or safetensors header. */
static const char *hf_copy(const char *config_from, const char *config_to, const char *tensor_from,
                           const char *tensor_to)
{
    const char *dir = tu_tmpdir();
    size_t n;
    char p[400];
    unsigned char *cfg = tu_read_all(S260_HF "/config.json", &n);
    char *c = malloc(n + (config_to ? strlen(config_to) : 0) + 1);
    memcpy(c, cfg, n);
    c[n] = '\0';
    if (config_from) {
        char *at = strstr(c, config_from);
        cr_assert_not_null(at);
        char rest[2048];
        snprintf(rest, sizeof rest, "%s", at + strlen(config_from));
        sprintf(at, "%s%s", config_to, rest);
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    tu_write_all(p, c, strlen(c));
    unsigned char *st = tu_read_all(S260_HF "/model.safetensors", &n);
    if (tensor_from) {
        cr_assert_eq(strlen(tensor_from), strlen(tensor_to));
        unsigned char *at = memmem(st, 8 + 5000, tensor_from, strlen(tensor_from));
        cr_assert_not_null(at);
        memcpy(at, tensor_to, strlen(tensor_to));
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    tu_write_all(p, st, n);
    free(cfg);
    free(c);
    free(st);
    return dir;
}

Test(model, load_errors_name_the_problem)
{
    tu_require_shared();
    struct {
        const char *cf, *ct, *tf, *tt;
        kvp_status want;
        const char *needle;
    } cases[] = {
        {"\"llama\"", "\"gpt2\"", NULL, NULL, KVP_EUNSUPPORTED, "gpt2"},
        {"\"num_hidden_layers\": 5", "\"num_hidden_layers\": 6", NULL, NULL, KVP_ENOTFOUND, "model.layers.5"},
        {"\"intermediate_size\": 172", "\"intermediate_size\": 173", NULL, NULL, KVP_EPARSE, "gate_proj"},
        {NULL, NULL, "model.layers.3.mlp.up_proj", "model.layers.3.mlp.xx_proj", KVP_ENOTFOUND, "up_proj"},
        {NULL, NULL, "\"F32\",\"shape\":[64]", "\"F32\",\"shape\":[65]", KVP_EPARSE, "bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = hf_copy(cases[i].cf, cases[i].ct, cases[i].tf, cases[i].tt);
        kvp_model *m = NULL;
        kvp_status st = kvp_model_load(dir, &m);
        cr_assert_eq(st, cases[i].want, "case %zu: %s (%s)", i, kvp_status_str(st), kvp_error_message());
        cr_assert(strstr(kvp_error_message(), cases[i].needle), "case %zu: %s", i, kvp_error_message());
        cr_assert_null(m);
    }
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load("/nonexistent/model.gguf", &m), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "/nonexistent/model.gguf"));
    /* a folder without config.json: the error says what --model takes, and names the folder's GGUF file */
    cr_assert_eq(kvp_model_load(S260_DIR "/", &m), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "stories260K.gguf"), "%s", kvp_error_message());
    cr_assert_eq(kvp_model_load(S260_DIR "/llama2c", &m), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "config.json"), "%s", kvp_error_message());
    cr_assert_null(m);
}

static kvp_status load_model(void *path, void **m) { return kvp_model_load(path, (kvp_model **)m); }
static void destroy_model(void *m) { kvp_model_destroy(m); }

Test(model, load_survives_every_allocation_failure)
{
    tu_require_shared();
    tu_every_alloc_failure("model load", load_model, destroy_model, S260_GGUF, 0);
}

/* The logits of every row of the 5-token prompt ids (taken modulo the vocabulary) in out (5 x vocab), from a
 * fresh one-block cache. */
static kvp_status forward_tokens5(kvp_model *m, const int32_t *ids, float *out)
{
    const int64_t V = kvp_model_cfg(m)->vocab_size;
    int32_t toks[5], pos[5] = {0, 1, 2, 3, 4}, blocks[1] = {0};
    for (int i = 0; i < 5; i++) toks[i] = (int32_t)(ids[i] % V);
    int64_t slots[5] = {0, 1, 2, 3, 4};
    int32_t qo[2] = {0, 5}, kvi[2] = {0, 1}, last = 5;
    kvp_kv_cache *kv;
    KVP_TRY(kvp_kv_cache_create(m, KVP_DTYPE_F32, 1, 8, &kv));
    kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 5, .tokens = toks, .positions = pos, .slot_mapping = slots,
                       .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last,
                       .all_logits = 1};
    const kvp_status st = kvp_model_forward(m, kv, &b, out);
    kvp_kv_cache_destroy(kv);
    return st;
}

/* forward_tokens5 on a fixed prompt. */
static kvp_status forward_prompt5(kvp_model *m, float *out)
{
    static const int32_t ids[5] = {1, 403, 407, 261, 378};
    return forward_tokens5(m, ids, out);
}

/* ---- random corruption: every mutant either loads and runs, or fails with an error naming its file ---- */

/* Loads a mutant model (and, from a GGUF, its tokenizer); one that loads runs a 5-token prompt, which may
 * fail only with a clear error. Returns 1 when the model loaded. */
static int fz_try(const char *path, const char *file, int gguf, int trial)
{
    kvp_model *m = NULL;
    kvp_status st = kvp_model_load(path, &m);
    if (st != KVP_OK) {
        FZ_FAILED_CLEANLY(st, m, file, trial);
        return 0;
    }
    const int64_t V = kvp_model_cfg(m)->vocab_size;
    if (gguf) {
        kvp_tokenizer *t = NULL;
        st = kvp_tok_load(path, (int32_t)V, &t);
        if (st != KVP_OK) FZ_FAILED_CLEANLY(st, t, file, trial);
        else {
            int32_t *ids = NULL, n = 0;
            char *text = NULL;
            if (kvp_tok_encode(t, "Once upon a time", 16, 1, &ids, &n) == KVP_OK &&
                kvp_tok_decode(t, -1, ids, n, &text) == KVP_OK)
                cr_assert_not_null(text);
            kvp_free(text);
            kvp_free(ids);
            kvp_tok_destroy(t);
        }
    }
    float *logits = malloc(sizeof(float) * 5 * (size_t)V);
    st = forward_prompt5(m, logits);
    cr_assert(st == KVP_OK || kvp_error_message()[0] != '\0', "trial %d: the forward pass failed without a message",
              trial);
    free(logits);
    kvp_model_destroy(m);
    return 1;
}

Test(model, random_corruption_of_gguf_headers_loads_or_fails_cleanly)
{
    tu_require_shared();
    size_t len;
    unsigned char *orig = tu_read_all(S260_GGUF, &len), *c = malloc(len);
    char path[300];
    snprintf(path, sizeof path, "%s/mutant.gguf", tu_tmpdir());
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int loaded = 0;
    const int trials = 3000;
    for (int i = 0; i < trials; i++) {
        tu_write_mutant(path, orig, c, len, 0, S260_GGUF_DATA_START, 1, &rng);
        loaded += fz_try(path, "mutant.gguf", 1, i);
    }
    /* a fifth of the mutants load (their edits hit token strings or scores): both outcomes were tested */
    cr_assert(loaded > 0 && loaded < trials, "%d of %d mutants loaded", loaded, trials);
    free(c);
    free(orig);
}

Test(model, random_corruption_of_safetensors_header_and_config_loads_or_fails_cleanly)
{
    tu_require_shared();
    size_t nst, ncfg;
    unsigned char *st = tu_read_all(S260_HF "/model.safetensors", &nst), *cfg = tu_read_all(S260_HF "/config.json", &ncfg);
    unsigned char *c = malloc(nst > ncfg ? nst : ncfg);
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    cr_assert_lt(hlen, nst);
    const char *dir = tu_tmpdir();
    char stp[300], cfgp[300];
    snprintf(stp, sizeof stp, "%s/model.safetensors", dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    uint64_t rng = 0x2545f4914f6cdd1dull;
    int loaded[2] = {0, 0};
    const int trials = 1500;
    for (int i = 0; i < 2 * trials; i++) {
        const int in_cfg = i % 2; /* alternate: the tensor header, then config.json (the other one intact) */
        if (in_cfg) {
            tu_write_all(stp, st, nst);
            tu_write_mutant(cfgp, cfg, c, ncfg, 0, ncfg, 0, &rng);
        } else {
            tu_write_mutant(stp, st, c, nst, 0, 8 + hlen, 1, &rng);
            tu_write_all(cfgp, cfg, ncfg);
        }
        loaded[in_cfg] += fz_try(dir, dir, 0, i); /* a tensor missing from the folder's files names the folder */
    }
    cr_assert(loaded[0] < trials && loaded[1] < trials, "every mutant loaded: %d, %d", loaded[0], loaded[1]);
    free(c);
    free(cfg);
    free(st);
}

/* ---- the same model stored in other dtypes (converted here), end to end ---- */

static void logits_of(kvp_model *m, float *out /* 5 x 512 */)
{
    cr_assert_eq(forward_prompt5(m, out), KVP_OK, "%s", kvp_error_detail());
}

static double max_rel(const float *a, const float *b, int n)
{
    double e = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs(b[i]) + 1.0);
        if (d > e) e = d;
    }
    return e;
}

enum { QF16, QQ8_0, QQ4_0 };

/* Rewrites stories260K.gguf with 2-D weights in F16, or in Q8_0 / Q4_0 (rows of a multiple of 32; the
 * others in F16), norms in F32. */
static void write_quantized_gguf(const char *path, int mode)
{
    size_t len;
    unsigned char *src = tu_read_all(S260_GGUF, &len);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    /* metadata bytes: from offset 24 to the first tensor info (name length 17 + "token_embd.weight") */
    unsigned char *ti = memmem(src, len, "\x11\0\0\0\0\0\0\0token_embd.weight", 25);
    cr_assert_not_null(ti);
    tu_buf hdr = {0}, data = {0};
    tu_put(&hdr, src, 24);
    tu_put(&hdr, src + 24, (size_t)(ti - src - 24));
    int64_t nt = kvp_gguf_num_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        kvp_tensor_view v;
        kvp_gguf_tensor_at(g, i, &v);
        float *f = malloc(sizeof(float) * (size_t)v.numel);
        kvp_tensor_to_f32(&v, f);
        uint32_t type = 0;
        int64_t ne0 = v.shape[v.ndim - 1];
        if (v.ndim == 2) type = mode != QF16 && ne0 % 32 == 0 ? (mode == QQ8_0 ? 8 : 2) : 1;
        tu_pad(&data, 32);
        tu_str(&hdr, v.name);
        tu_u32(&hdr, (uint32_t)v.ndim);
        for (int d = v.ndim - 1; d >= 0; d--) tu_u64(&hdr, (uint64_t)v.shape[d]);
        tu_u32(&hdr, type);
        tu_u64(&hdr, data.n);
        if (type == 0) tu_put(&data, f, sizeof(float) * (size_t)v.numel);
        if (type == 1)
            for (int64_t j = 0; j < v.numel; j++) {
                uint16_t h = kvp_wt_f32_to_f16(f[j]);
                tu_put(&data, &h, 2);
            }
        if (type == 8)
            for (int64_t b0 = 0; b0 < v.numel; b0 += 32) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fabsf(f[b0 + j]) > amax ? fabsf(f[b0 + j]) : amax;
                float d = amax / 127.0f;
                uint16_t dh = kvp_wt_f32_to_f16(d);
                tu_put(&data, &dh, 2);
                for (int j = 0; j < 32; j++) {
                    int8_t q = (int8_t)(d > 0 ? lrintf(f[b0 + j] / d) : 0);
                    tu_put(&data, &q, 1);
                }
            }
        if (type == 2) /* ggml's quantize_row_q4_0_ref: d = (the weight of largest magnitude) / -8 */
            for (int64_t b0 = 0; b0 < v.numel; b0 += 32) {
                float mx = 0;
                for (int j = 0; j < 32; j++) mx = fabsf(f[b0 + j]) > fabsf(mx) ? f[b0 + j] : mx;
                const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                uint16_t dh = kvp_wt_f32_to_f16(d);
                tu_put(&data, &dh, 2);
                for (int j = 0; j < 16; j++) {
                    int lo = (int)(f[b0 + j] * id + 8.5f), hi = (int)(f[b0 + 16 + j] * id + 8.5f);
                    uint8_t qs = (uint8_t)((lo > 15 ? 15 : lo) | (hi > 15 ? 15 : hi) << 4);
                    tu_put(&data, &qs, 1);
                }
            }
        free(f);
    }
    tu_pad(&hdr, 32);
    tu_buf all = {0};
    tu_put(&all, hdr.p, hdr.n);
    tu_put(&all, data.p, data.n);
    tu_write_all(path, all.p, all.n);
    free(all.p), free(hdr.p), free(data.p), free(src);
    kvp_gguf_close(g);
}

/* The file at path loaded with its matrices held as `wt` (kvp_model_load_ex) gives the logits of m bit for
 * bit, with either matmul: m is its f32 load, and the values held are the file's, widened in registers
 * (Q8_0: d * q, exact in f32, as the f32 load dequantizes them). `want` is the type the load reports. */
static void expect_same_logits(const char *path, kvp_model *m, kvp_weight_type wt, kvp_weight_type want)
{
    kvp_model *h;
    cr_assert_eq(kvp_model_load_ex(path, NULL, wt, &h), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_model_weight_type(h), want, "%s held as %s: reports %s, not %s", path, kvp_weight_type_name(wt),
                 kvp_weight_type_name(kvp_model_weight_type(h)), kvp_weight_type_name(want));
    float a[5 * 512], b[5 * 512];
    for (int blas = 0; blas < 2; blas++) {
        kvp_model_set_matmul(m, blas ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
        kvp_model_set_matmul(h, blas ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
        logits_of(m, a);
        logits_of(h, b);
        for (int i = 0; i < 5 * 512; i++)
            cr_assert_eq(b[i], a[i], "%s held as %s, %s: logit %d: %g vs %g", path, kvp_weight_type_name(wt),
                         blas ? "blas" : "invariant", i, b[i], a[i]);
    }
    kvp_model_set_matmul(m, KVP_MATMUL_INVARIANT);
    kvp_model_destroy(h);
}

/* expect_same_logits held as wt, and held as stored (auto), which reports auto_wt. */
static void expect_held_as_stored(const char *path, kvp_model *m, kvp_weight_type wt, kvp_weight_type auto_wt)
{
    expect_same_logits(path, m, wt, wt);
    expect_same_logits(path, m, KVP_WEIGHT_AUTO, auto_wt);
}

Test(model, gguf_f16_and_q8_0_weights_track_f32)
{
    tu_require_shared();
    kvp_model *ref = load(S260_GGUF);
    float want[5 * 512], got[5 * 512];
    logits_of(ref, want);
    const char *dir = tu_tmpdir();
    for (int q8 = 0; q8 < 2; q8++) {
        char path[400];
        snprintf(path, sizeof path, "%s/s260_%s.gguf", dir, q8 ? "q8_0" : "f16");
        write_quantized_gguf(path, q8 ? QQ8_0 : QF16);
        kvp_model *m = load(path);
        logits_of(m, got);
        double e = max_rel(got, want, 5 * 512);
        /* f16 keeps ~3 decimal digits per weight, q8_0 ~2: the logits move but the argmax does not */
        cr_assert_lt(e, q8 ? 0.25 : 0.03, "%s: max relative logit error %g", path, e);
        cr_assert_gt(e, 0.0, "%s: the conversion changed nothing?", path);
        for (int r = 0; r < 5; r++) cr_assert_eq(kvp_argmax(got + r * 512, 512), kvp_argmax(want + r * 512, 512));
        /* auto: Q8_0 and F16 matrices (inputs not a multiple of 32) held side by side, reported as auto */
        expect_held_as_stored(path, m, q8 ? KVP_WEIGHT_Q8_0 : KVP_WEIGHT_F16, q8 ? KVP_WEIGHT_AUTO : KVP_WEIGHT_F16);
        kvp_model_destroy(m);
    }
    kvp_model_destroy(ref);
}

/* auto holds an f32 file in f32, and GGUF's other quantized types as q8_0: the logits of an explicit q8_0
 * load, bit for bit (the Q4_0 matrices dequantized, then quantized to Q8_0 the same way; the F16 ones, whose
 * inputs are not a multiple of 32, exact in f16 under auto and in f32 under q8_0). */
Test(model, auto_weights_keep_f32_and_hold_other_quant_types_as_q8_0)
{
    tu_require_shared();
    kvp_model *f32 = load(S260_GGUF);
    expect_same_logits(S260_GGUF, f32, KVP_WEIGHT_AUTO, KVP_WEIGHT_F32);
    kvp_model_destroy(f32);
    char path[400];
    snprintf(path, sizeof path, "%s/s260_q4_0.gguf", tu_tmpdir());
    write_quantized_gguf(path, QQ4_0);
    kvp_model *q8;
    cr_assert_eq(kvp_model_load_ex(path, NULL, KVP_WEIGHT_Q8_0, &q8), KVP_OK, "%s", kvp_error_detail());
    expect_same_logits(path, q8, KVP_WEIGHT_AUTO, KVP_WEIGHT_AUTO);
    /* and Q4_0 is really what was read: the f32 load differs from the q8_0 one */
    kvp_model *q4 = load(path);
    float a[5 * 512], b[5 * 512];
    logits_of(q4, a);
    logits_of(q8, b);
    cr_assert_gt(max_rel(a, b, 5 * 512), 0.0);
    kvp_model_destroy(q4);
    kvp_model_destroy(q8);
}

/* Rewrites the HF safetensors in F16 or BF16 (config.json copied); loads each as f32 and with its matrices
 * in 16 bits. */
Test(model, hf_f16_and_bf16_safetensors_track_f32)
{
    tu_require_shared();
    kvp_model *ref = load(S260_HF);
    float want[5 * 512], got[5 * 512];
    logits_of(ref, want);
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    for (int bf = 0; bf < 2; bf++) {
        const char *dir = tu_tmpdir();
        char p[400];
        size_t n;
        unsigned char *cfg = tu_read_all(S260_HF "/config.json", &n);
        snprintf(p, sizeof p, "%s/config.json", dir);
        tu_write_all(p, cfg, n);
        free(cfg);
        tu_buf hdr = {0}, data = {0};
        tu_put(&hdr, "{", 1);
        for (int64_t i = 0; i < kvp_st_num_tensors(s); i++) {
            kvp_tensor_view v;
            kvp_st_tensor_at(s, i, &v);
            float *f = malloc(sizeof(float) * (size_t)v.numel);
            kvp_tensor_to_f32(&v, f);
            char e[400];
            int m = v.ndim == 2 ? snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                           i ? "," : "", v.name, bf ? "BF16" : "F16", (long long)v.shape[0],
                                           (long long)v.shape[1], data.n, data.n + 2 * (size_t)v.numel)
                                : snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                           i ? "," : "", v.name, bf ? "BF16" : "F16", (long long)v.shape[0], data.n,
                                           data.n + 2 * (size_t)v.numel);
            tu_put(&hdr, e, (size_t)m);
            for (int64_t j = 0; j < v.numel; j++) {
                uint16_t h = bf ? kvp_wt_f32_to_bf16(f[j]) : kvp_wt_f32_to_f16(f[j]);
                tu_put(&data, &h, 2);
            }
            free(f);
        }
        tu_put(&hdr, "}", 1);
        tu_buf file = {0};
        tu_u64(&file, hdr.n);
        tu_put(&file, hdr.p, hdr.n);
        tu_put(&file, data.p, data.n);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        tu_write_all(p, file.p, file.n);
        free(file.p), free(hdr.p), free(data.p);
        kvp_model *m = load(dir);
        logits_of(m, got);
        double e = max_rel(got, want, 5 * 512);
        cr_assert_lt(e, bf ? 0.2 : 0.03, "%s: max relative logit error %g", bf ? "bf16" : "f16", e);
        cr_assert_gt(e, 0.0);
        for (int r = 0; r < 5; r++) cr_assert_eq(kvp_argmax(got + r * 512, 512), kvp_argmax(want + r * 512, 512));
        expect_held_as_stored(dir, m, bf ? KVP_WEIGHT_BF16 : KVP_WEIGHT_F16, bf ? KVP_WEIGHT_BF16 : KVP_WEIGHT_F16);
        kvp_model_destroy(m);
    }
    kvp_st_close(s);
    kvp_model_destroy(ref);
}

/* Writes an HF folder: config.json = stories260K's with `from` replaced by `to`, and its safetensors plus
 * zero-filled 1-D tensors extra[i] of lens[i] floats. Returns the folder. */
static const char *hf_variant(const char *from, const char *to, const char *const *extra, const int64_t *lens,
                              int n_extra)
{
    const char *dir = hf_copy(from, to, NULL, NULL);
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    tu_buf hdr = {0}, data = {0};
    tu_put(&hdr, "{", 1);
    char e[400];
    for (int64_t i = 0; i < kvp_st_num_tensors(s); i++) {
        kvp_tensor_view v;
        kvp_st_tensor_at(s, i, &v);
        int m = v.ndim == 2 ? snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                       i ? "," : "", v.name, (long long)v.shape[0], (long long)v.shape[1], data.n,
                                       data.n + v.nbytes)
                            : snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                       i ? "," : "", v.name, (long long)v.shape[0], data.n, data.n + v.nbytes);
        tu_put(&hdr, e, (size_t)m);
        tu_put(&data, v.data, v.nbytes);
    }
    for (int i = 0; i < n_extra; i++) {
        float *z = calloc((size_t)lens[i], sizeof(float));
        int m = snprintf(e, sizeof e, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}", extra[i],
                         (long long)lens[i], data.n, data.n + (size_t)lens[i] * 4);
        tu_put(&hdr, e, (size_t)m);
        tu_put(&data, z, (size_t)lens[i] * 4);
        free(z);
    }
    tu_put(&hdr, "}", 1);
    tu_buf file = {0};
    tu_u64(&file, hdr.n);
    tu_put(&file, hdr.p, hdr.n);
    tu_put(&file, data.p, data.n);
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    tu_write_all(p, file.p, file.n);
    free(file.p), free(hdr.p), free(data.p);
    kvp_st_close(s);
    /* qwen variants: this config says "attention_bias": false explicitly; say true (same length) */
    if (strstr(to, "qwen")) {
        size_t n;
        snprintf(p, sizeof p, "%s/config.json", dir);
        char *cfg = (char *)tu_read_all(p, &n);
        char *at = memmem(cfg, n, "\"attention_bias\": false", 23);
        cr_assert_not_null(at);
        memcpy(at, "\"attention_bias\": true ", 23);
        tu_write_all(p, cfg, n);
        free(cfg);
    }
    return dir;
}

Test(model, qwen2_bias_and_mistral_window_paths)
{
    tu_require_shared();
    kvp_model *ref = load(S260_HF);
    float want[5 * 512], got[5 * 512];
    logits_of(ref, want);
    kvp_model_destroy(ref);
    /* qwen2 with zero q/k/v biases (q: 64 entries, k/v: 32 under GQA) computes exactly the llama logits */
    char buf[15][96];
    const char *names[15];
    int64_t lens[15];
    for (int l = 0, k = 0; l < 5; l++)
        for (int j = 0; j < 3; j++, k++) {
            snprintf(buf[k], sizeof buf[k], "model.layers.%d.self_attn.%c_proj.bias", l, "qkv"[j]);
            names[k] = buf[k];
            lens[k] = j == 0 ? 64 : 32;
        }
    const char *qwen = "\"model_type\": \"qwen2\", \"use_sliding_window\": false";
    const char *dir = hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 15);
    kvp_model *m = load(dir);
    cr_assert(kvp_model_cfg(m)->attention_bias);
    logits_of(m, got);
    cr_assert_lt(max_rel(got, want, 5 * 512), 1e-6, "qwen2 with zero biases must equal llama");
    kvp_model_destroy(m);
    /* a k bias of the q size is a shape error naming the tensor */
    lens[1] = 64;
    dir = hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 15);
    m = NULL;
    cr_assert_eq(kvp_model_load(dir, &m), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "model.layers.0.self_attn.k_proj.bias"), "%s", kvp_error_message());
    /* a missing bias is named too */
    lens[1] = 32;
    dir = hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 14);
    cr_assert_eq(kvp_model_load(dir, &m), KVP_ENOTFOUND);
    cr_assert(strstr(kvp_error_message(), "model.layers.4.self_attn.v_proj.bias"), "%s", kvp_error_message());
    /* mistral with a 3-token sliding window: positions 0..2 see every key (same logits), 3 and 4 do not */
    dir = hf_variant("\"model_type\": \"llama\"", "\"model_type\": \"mistral\", \"sliding_window\": 3", NULL, NULL, 0);
    m = load(dir);
    cr_assert_eq(kvp_model_cfg(m)->sliding_window, 3);
    logits_of(m, got);
    cr_assert_lt(max_rel(got, want, 3 * 512), 1e-6);
    cr_assert_gt(max_rel(got + 3 * 512, want + 3 * 512, 2 * 512), 1e-3, "the window changed nothing at position 3+");
    kvp_model_destroy(m);
}

/* kvp_model_run: every task of every run runs exactly once, with the run's own argument, for task counts
 * going up and down (workers made during a run, workers left without a task, the cap at 64). */
typedef struct {
    int count[80];
    int run_id;
    int wrong_run;
} run_probe;

static void probe_task(void *arg, int i)
{
    run_probe *p = arg;
    __atomic_add_fetch(&p->count[i], 1, __ATOMIC_RELAXED);
    if (p->run_id < 0) __atomic_add_fetch(&p->wrong_run, 1, __ATOMIC_RELAXED);
}

Test(model, run_runs_every_task_once)
{
    kvp_model *m = load(S260_GGUF);
    const int ns[] = {1, 2, 3, 2, 8, 1, 5, 64, 70, 4, 2};
    for (int rep = 0; rep < 50; rep++)
        for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
            run_probe p;
            memset(&p, 0, sizeof p);
            p.run_id = (int)c;
            kvp_model_run(m, ns[c], probe_task, &p);
            const int n = ns[c] < 64 ? ns[c] : 64;
            for (int i = 0; i < 80; i++)
                cr_assert_eq(p.count[i], i < n ? 1 : 0, "rep %d run of %d tasks: task %d ran %d times", rep, ns[c], i,
                             p.count[i]);
            cr_assert_eq(p.wrong_run, 0);
        }
    kvp_model_destroy(m);
}

/* Invariant matmul tiling (every row tile of the lane count, single rows, every panel including the partial
 * one of the 172-wide FFN; on 16 lanes tiles of two panels, and that FFN's eleventh panel alone; from 8 rows on,
 * the LM head's tiles and left-over rows split over the threads): one token a step, then prompts of n = 1..40
 * tokens in one forward pass; every row equals the same token alone, bit for bit, on 1 and 2 threads. ref
 * (40 x V): with *have_ref, the tokens alone must give it too (another lane count's results); else it gets
 * them. */
static void expect_batch_invariant(kvp_model *m, const char *what, float *ref, int *have_ref)
{
    enum { NMAX = 40, V = 512 };
    int32_t toks[NMAX], pos[NMAX], blocks[2] = {0, 1};
    int64_t slots[NMAX];
    kvp_rng g;
    kvp_rng_seed(&g, 99, 0);
    for (int i = 0; i < NMAX; i++) {
        toks[i] = i == 0 ? 1 : (int32_t)(kvp_rng_next(&g) % V);
        pos[i] = i;
        slots[i] = i;
    }
    static float one[NMAX * V], all[NMAX * V];
    for (int threads = 1; threads <= 2; threads++) {
        kvp_model_set_threads(m, threads);
        kvp_kv_cache *kv;
        cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, 2, 32, &kv), KVP_OK);
        for (int i = 0; i < NMAX; i++) { /* one token a step */
            int32_t qo[2] = {0, 1}, kvi[2] = {0, i / 32 + 1}, last = i % 32 + 1;
            kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 1, .tokens = toks + i, .positions = pos + i,
                               .slot_mapping = slots + i, .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks,
                               .kv_last_page_len = &last};
            cr_assert_eq(kvp_model_forward(m, kv, &b, one + i * V), KVP_OK, "%s", kvp_error_detail());
        }
        if (*have_ref)
            for (int r = 0; r < NMAX; r++)
                cr_assert(memcmp(ref + r * V, one + r * V, sizeof(float) * V) == 0,
                          "%s, %d threads: token %d alone differs from the 8-lane matmul's result", what,
                          threads, r);
        memcpy(ref, one, sizeof one);
        *have_ref = 1;
        for (int n = 1; n <= NMAX; n++) {
            int32_t qo[2] = {0, n}, kvi[2] = {0, (n - 1) / 32 + 1}, last = (n - 1) % 32 + 1;
            kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = n, .tokens = toks, .positions = pos, .slot_mapping = slots,
                               .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last,
                               .all_logits = 1};
            memset(all, 0xff, sizeof all); /* NaN: a logit left unwritten cannot match */
            cr_assert_eq(kvp_model_forward(m, kv, &b, all), KVP_OK, "%s", kvp_error_detail());
            for (int r = 0; r < n; r++)
                cr_assert(memcmp(all + r * V, one + r * V, sizeof(float) * V) == 0,
                          "%s, %d threads, batch of %d: row %d differs from the same token alone", what, threads,
                          n, r);
        }
        kvp_kv_cache_destroy(kv);
    }
}

/* Every weight type, on 8 lanes then 16 where the CPU has AVX-512F: batches go through the row tiles (8
 * lanes: 6, 4, 2..3 rows; 16: 12, 8, 4, 1..3), a single row through several panels at once, each widening
 * 16-bit and Q8_0 panels in registers (w_down, whose 172 inputs are not a multiple of 32, stays f32 under
 * q8_0); the two lane counts give the same bits. */
Test(model, invariant_rows_bit_identical_for_every_batch_size)
{
    tu_require_shared();
    static float ref[40 * 512];
    for (kvp_weight_type wt = KVP_WEIGHT_F32; wt <= KVP_WEIGHT_Q8_0; wt++) {
        kvp_model *m;
        cr_assert_eq(kvp_model_load_ex(S260_GGUF, NULL, wt, &m), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_model_lanes(m), kvp_cpu_max_lanes(), "a load takes the widest matmul the CPU has");
        cr_assert_eq(kvp_model_set_lanes(m, 4), KVP_EINVAL);
        int have_ref = 0;
        for (int lanes = 8; lanes <= 16; lanes *= 2) {
            if (lanes > kvp_cpu_max_lanes()) {
                cr_assert_eq(kvp_model_set_lanes(m, lanes), KVP_EUNSUPPORTED);
                cr_log_info("this CPU lacks AVX-512F: the 16-lane matmul is not compared with the 8-lane one");
                continue;
            }
            cr_assert_eq(kvp_model_set_lanes(m, lanes), KVP_OK);
            char what[64];
            snprintf(what, sizeof what, "%s weights, %d lanes", kvp_weight_type_name(wt), lanes);
            expect_batch_invariant(m, what, ref, &have_ref);
        }
        kvp_model_destroy(m);
    }
}

/* kvp_model_set_skip_attention (bench generate's --skip-attention): the same token at the same position
 * after two different histories gives different logits through attention, the same ones with it skipped
 * (nothing but the token and its position reaches the row); off again, attention is back. */
Test(model, skip_attention_cuts_the_history_out)
{
    tu_require_shared();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260_GGUF, &m), KVP_OK, "%s", kvp_error_detail());
    static const int32_t h1[5] = {1, 403, 407, 261, 300}, h2[5] = {1, 378, 286, 376, 300};
    static float a[5 * 512], b[5 * 512], c[5 * 512];
    const float *la = a + 4 * 512, *lb = b + 4 * 512, *lc = c + 4 * 512; /* the last rows */
    const size_t row = sizeof(float) * 512;
    cr_assert_eq(forward_tokens5(m, h1, a), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(forward_tokens5(m, h2, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(la, lb, row) != 0, "attention: the history moves the last row's logits");
    kvp_model_set_skip_attention(m, 1);
    cr_assert_eq(forward_tokens5(m, h1, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(forward_tokens5(m, h2, c), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(lb, lc, row) == 0, "skipped: the history does not reach the last row");
    cr_assert(memcmp(la, lb, row) != 0, "skipped: the logits are not the model's");
    kvp_model_set_skip_attention(m, 0);
    cr_assert_eq(forward_tokens5(m, h1, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(la, lb, row) == 0, "attention back on: the model's logits again");
    kvp_model_destroy(m);
}

/* ---- configs that disagree with the weights or hold numbers out of range: errors name file and field ---- */

static void expect_load_error(const char *path, kvp_status want, const char *n1, const char *n2, const char *n3,
                              const char *what)
{
    kvp_model *m = NULL;
    kvp_status st = kvp_model_load(path, &m);
    cr_assert_eq(st, want, "%s: %s (%s)", what, kvp_status_str(st), kvp_error_message());
    const char *msg = kvp_error_message();
    cr_assert(strstr(msg, n1) && strstr(msg, n2) && (!n3 || strstr(msg, n3)), "%s: '%s' lacks '%s' / '%s' / '%s'",
              what, msg, n1, n2, n3 ? n3 : "");
    cr_assert_null(m, "%s", what);
}

/* Writes dir/name: stories260K.gguf with 4-byte metadata `key` set to *v (GGUF type `type`), or, when key is
 * NULL, tensor `tensor`'s data offset set to `offset`. Returns the path (static). */
static const char *gguf_variant(const char *name, const char *key, uint32_t type, const void *v, const char *tensor,
                                uint64_t offset)
{
    static char path[400];
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    if (key) tu_gguf_set_kv4(buf, len, key, type, v);
    else tu_gguf_set_offset(buf, len, tensor, offset);
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    tu_write_all(path, buf, len);
    free(buf);
    return path;
}

Test(model, hf_config_numbers_out_of_range_are_rejected)
{
    tu_require_shared();
    /* NaN has no JSON spelling (the GGUF test below pours one in); 1e999 parses as infinity. */
    struct {
        const char *from, *to, *field;
    } cases[] = {
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 2", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e999", "rms_norm_eps"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 0", "rope_theta"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": -10000.0", "rope_theta"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 1e999", "rope_theta"},
        {"\"bos_token_id\": 1", "\"bos_token_id\": 512", "bos_token_id"},
        {"\"eos_token_id\": 2", "\"eos_token_id\": 100000", "eos_token_id"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 1.5", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.1", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.1", "partial_rotary_factor"},
        /* 8 x 0.375: 3 rotary dimensions, which do not pair */
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.375", "partial_rotary_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = hf_copy(cases[i].from, cases[i].to, NULL, NULL);
        char cfg[400];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        expect_load_error(dir, KVP_EPARSE, cfg, cases[i].field, NULL, cases[i].to);
    }
}

Test(model, gguf_metadata_out_of_range_is_rejected)
{
    tu_require_shared();
    const float neg = -1.0f, nan = NAN, inf = INFINITY;
    const uint32_t far = 100000, vocab = 512, five = 5, sixteen = 16;
    const char *p = gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &neg, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps -1");
    p = gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &nan, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps NaN");
    p = gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &inf, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps inf");
    p = gguf_variant("bos.gguf", "tokenizer.ggml.bos_token_id", 4, &far, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "tokenizer.ggml.bos_token_id", "100000", "bos 100000");
    p = gguf_variant("eos.gguf", "tokenizer.ggml.eos_token_id", 4, &vocab, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "tokenizer.ggml.eos_token_id", "512", "eos 512");
    /* rotary dimensions: an odd count, or more than a head has */
    p = gguf_variant("rope.gguf", "llama.rope.dimension_count", 4, &five, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "llama.rope.dimension_count", "even", "rope dims 5");
    p = gguf_variant("rope.gguf", "llama.rope.dimension_count", 4, &sixteen, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "llama.rope.dimension_count", "at most the head dimension", "rope dims 16");
    /* 0xFFFFFFFF is "no BOS": loads, without one. */
    const uint32_t none = UINT32_MAX;
    p = gguf_variant("nobos.gguf", "tokenizer.ggml.bos_token_id", 4, &none, NULL, 0);
    kvp_model *m = load(p);
    cr_assert_eq(kvp_model_cfg(m)->bos_token_id, -1);
    cr_assert_eq(kvp_model_cfg(m)->eos_token_id, 2);
    kvp_model_destroy(m);
}

Test(model, tensors_the_config_does_not_use_are_rejected)
{
    tu_require_shared();
    /* Five layers' weights under a four-layer config (HF and GGUF). */
    const char *dir = hf_copy("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 4", NULL, NULL);
    expect_load_error(dir, KVP_EPARSE, "model.layers.4.", "is not used by a 4-layer llama", "model.safetensors",
                      "HF num_hidden_layers 4");
    const uint32_t four = 4;
    const char *p = gguf_variant("four.gguf", "llama.block_count", 4, &four, NULL, 0);
    expect_load_error(p, KVP_EPARSE, p, "'blk.4.", "is not used by a 4-layer llama", "GGUF block_count 4");
    /* A bias the llama config does not ask for (attention_bias false). */
    const char *bias[1] = {"model.layers.2.self_attn.q_proj.bias"};
    const int64_t blen[1] = {64};
    const char *llama = "\"model_type\": \"llama\"";
    dir = hf_variant(llama, llama, bias, blen, 1);
    expect_load_error(dir, KVP_EPARSE, "'model.layers.2.self_attn.q_proj.bias' is not used", "model.safetensors",
                      "(1 unused", "stray bias");
    /* Tied embeddings: no lm_head, the embedding is the classifier (used); untied, lm_head is missing. */
    kvp_model *m = load(S260_HF);
    cr_assert(kvp_model_cfg(m)->tie_word_embeddings);
    kvp_model_destroy(m);
    dir = hf_copy("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", NULL, NULL);
    expect_load_error(dir, KVP_ENOTFOUND, "lm_head.weight", dir, NULL, "untied without lm_head");
    /* HF rotary inv_freq buffers are recomputed from rope_theta: ignored. */
    const char *inv[2] = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                          "model.layers.4.self_attn.rotary_emb.inv_freq"};
    const int64_t ilen[2] = {4, 4};
    dir = hf_variant(llama, llama, inv, ilen, 2);
    m = load(dir);
    kvp_model_destroy(m);
}

Test(model, overlapping_gguf_tensors_are_rejected)
{
    tu_require_shared();
    /* output_norm.weight's 256 bytes moved inside token_embd.weight's 131072. */
    const char *p = gguf_variant("overlap.gguf", NULL, 0, NULL, "output_norm.weight", 128);
    expect_load_error(p, KVP_EPARSE, p, "overlap", "'output_norm.weight'", "overlap");
    cr_assert(strstr(kvp_error_message(), "'token_embd.weight'"), "%s", kvp_error_message());
}

/* Where stories260K.gguf's tensor infos end (buf, len: the file) and how many tensors it has. */
static size_t gguf_info_end(const unsigned char *buf, size_t len, int64_t *num_tensors)
{
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    const int64_t nt = kvp_gguf_num_tensors(g);
    kvp_tensor_view last;
    kvp_gguf_tensor_at(g, nt - 1, &last);
    /* the last tensor info: name (u64 length, bytes), u32 n_dims, u64 dims, u32 type, u64 offset */
    const size_t end = tu_gguf_find_str(buf, len, last.name) + 8 + strlen(last.name) + 4 + 8 * (size_t)last.ndim + 4 + 8;
    kvp_gguf_close(g);
    if (num_tensors) *num_tensors = nt;
    return end;
}

/* stories260K.gguf with one more tensor, rope_freqs.weight = ff[0..4) (llama.cpp's llama3 rope factors):
 * its tensor info goes after the others, its data after theirs (offsets stay relative to the data). */
static const char *gguf_with_rope_freqs(const float ff[4])
{
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    int64_t nt;
    const size_t info_end = gguf_info_end(buf, len, &nt);
    const size_t data_start = (info_end + 31) / 32 * 32, data_len = len - data_start;
    tu_buf out = {0};
    tu_put(&out, buf, info_end);
    tu_str(&out, "rope_freqs.weight");
    tu_u32(&out, 1);
    tu_u64(&out, 4);
    tu_u32(&out, 0); /* F32 */
    tu_u64(&out, (data_len + 31) / 32 * 32);
    tu_pad(&out, 32);
    tu_put(&out, buf + data_start, data_len);
    tu_pad(&out, 32);
    for (int i = 0; i < 4; i++) tu_f32(&out, ff[i]);
    const uint64_t n1 = (uint64_t)nt + 1;
    memcpy(out.p + 8, &n1, 8); /* header: magic, version, tensor count */
    static char path[400];
    snprintf(path, sizeof path, "%s/rope_freqs.gguf", tu_tmpdir());
    tu_write_all(path, out.p, out.n);
    free(out.p);
    free(buf);
    return path;
}

/* llama3 rope scaling in its two forms agree: an HF folder whose config.json has rope_scaling (factor 8,
 * original context 2000: of stories260K's 4 frequencies, wavelengths 6.3, 63, 628 and 6283 tokens, two
 * are untouched, one is in the smoothed band and one is divided by 8) and the GGUF with llama.cpp's
 * rope_freqs.weight, the factors computed here as llama.cpp's converter does. Factors of 1 change nothing;
 * these change the 256-token story. */
Test(model, gguf_rope_freqs_match_hf_llama3_rope_scaling)
{
    const double factor = 8, lo = 1, hi = 4, orig = 2000;
    float ff[4], ones[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; i++) {
        const double wl = 2 * M_PI * pow(10000.0, i / 4.0);
        if (wl < orig / hi) ff[i] = 1;
        else if (wl > orig / lo) ff[i] = (float)factor;
        else {
            const double smooth = (orig / wl - lo) / (hi - lo);
            ff[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    cr_assert(ff[0] == 1 && ff[1] == 1 && ff[2] > 1 && ff[2] < 8 && ff[3] == 8, "%g %g %g %g", ff[0], ff[1], ff[2],
              ff[3]);
    const char *hf = hf_copy("\"rope_scaling\": null",
                             "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 2000}",
                             NULL, NULL);
    const int32_t bos = 1, steps = 256;
    int32_t want[256], got[256], plain[256];
    kvp_model *m = load(hf);
    greedy_one(m, 16, &bos, 1, steps, 0, want);
    kvp_model_destroy(m);
    m = load(gguf_with_rope_freqs(ff));
    greedy_one(m, 16, &bos, 1, steps, 0, got);
    kvp_model_destroy(m);
    for (int i = 0; i < steps; i++)
        cr_assert_eq(got[i], want[i], "token %d: GGUF rope_freqs %d, HF rope_scaling %d", i, got[i], want[i]);
    m = load(gguf_with_rope_freqs(ones));
    check_golden(m, 16, 0);
    greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += plain[i] != want[i];
    cr_assert_gt(differ, 0, "llama3 scaling must change the story");
    float bad[4] = {1, 0, 1, 1};
    kvp_model *none = NULL;
    cr_assert_eq(kvp_model_load(gguf_with_rope_freqs(bad), &none), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "rope_freqs.weight[1]"), "%s", kvp_error_message());
}

/* dir/name: stories260K.gguf with n more metadata pairs, kvs (as tu_kv_* write them), first after the header.
 * Everything after them moves by their length, the tensor data to the next multiple of 32 (tensor offsets
 * are relative to it). */
static const char *gguf_with_kvs(const char *name, const tu_buf *kvs, uint64_t n)
{
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    const size_t info_end = gguf_info_end(buf, len, NULL), data_start = (info_end + 31) / 32 * 32;
    uint64_t nkv;
    memcpy(&nkv, buf + 16, 8); /* header: magic, version, tensor count, metadata count */
    nkv += n;
    tu_buf out = {0};
    tu_put(&out, buf, 16);
    tu_u64(&out, nkv);
    tu_put(&out, kvs->p, kvs->n);
    tu_put(&out, buf + 24, info_end - 24);
    tu_pad(&out, 32);
    tu_put(&out, buf + data_start, len - data_start);
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    tu_write_all(path, out.p, out.n);
    free(out.p);
    free(buf);
    return path;
}

/* kvp_rope_frequencies against scripts/rope-reference.py, which computes YaRN, linear and dynamic scaling from
 * their published definitions (the YaRN paper, Hugging Face's _compute_yarn_parameters), not from this code.
 * The configs are parsed from JSON (Qwen3-8B's with rope_scaling replaced, and head_dim and theta replaced when
 * given), so the rope_scaling fields' defaults (beta_fast 32, beta_slow 1, truncate) are the parser's. */
static void rope_of(const char *rope_scaling, int32_t head_dim, double theta, kvp_model_config *c, double *inv,
                    double *scale)
{
    cJSON *root;
    cr_assert_eq(kvp_json_parse_file("../shared/data/configs/Qwen3-8B.json", &root), KVP_OK, "%s",
                 kvp_error_detail());
    cJSON_ReplaceItemInObject(root, "rope_scaling", cJSON_Parse(rope_scaling));
    cr_assert_eq(kvp_model_config_from_json(root, "Qwen3-8B.json", c), KVP_OK, "%s", kvp_error_detail());
    cJSON_Delete(root);
    if (head_dim) c->head_dim = c->rotary_dim = head_dim, c->rope_theta = theta;
    kvp_rope_frequencies(c, kvp_model_config_context(c), inv, scale);
}

static void expect_rel(double got, double want, const char *what, int i)
{
    cr_assert(fabs(got - want) <= 1e-12 * fabs(want), "%s[%d]: %.17g, the reference %.17g", what, i, got, want);
}

Test(model, rope_frequencies_match_the_reference)
{
    kvp_model_config c;
    double inv[128], scale;
    /* Qwen3-8B (head_dim 128, theta 1e6) with its model card's YaRN: dimensions 0-23 keep their frequency,
     * 24-39 are on the ramp, 40 and up are divided by 4 */
    rope_of("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}", 0, 0, &c,
            inv, &scale);
    const int at[] = {0, 20, 23, 24, 30, 35, 39, 40, 63};
    const double want[] = {1.0, 0.01333521432163324, 0.006978305848598663, 0.005375321490790102,
                           0.001064360981247002, 0.0002462584069089387, 6.490394320837029e-05,
                           4.445698525097307e-05, 3.102344401879299e-07};
    for (int k = 0; k < 9; k++) expect_rel(inv[at[k]], want[k], "qwen3 yarn", at[k]);
    expect_rel(scale, 1.138629436111989, "qwen3 yarn scale", 0);
    /* stories260K's shape (head_dim 8, theta 1e4), 128 original positions: pair 1 is half-way up the ramp;
     * without truncation the ramp starts at dimension -0.196 and ends at 1.309 */
    rope_of("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}", 8, 10000, &c,
            inv, &scale);
    const double yarn8[] = {1.0, 0.0625, 0.0025, 0.00025}, untrunc8[] = {1.0, 0.04270567198866974, 0.0025, 0.00025};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], yarn8[i], "yarn 8", i);
    c.rope_truncate = 0;
    kvp_rope_frequencies(&c, kvp_model_config_context(&c), inv, &scale);
    for (int i = 0; i < 4; i++) expect_rel(inv[i], untrunc8[i], "yarn 8 untruncated", i);
    /* attention_factor replaces the default scale; DeepSeek's mscale / mscale_all_dim make it their ratio */
    rope_of("{\"type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 0.75}", 0, 0, &c, inv, &scale);
    cr_assert_eq(scale, 0.75);
    rope_of("{\"type\": \"yarn\", \"factor\": 40.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}", 0, 0, &c, inv,
            &scale);
    expect_rel(scale, (0.1 * log(40.0) + 1) / (0.05 * log(40.0) + 1), "mscale ratio", 0);
    rope_of("{\"rope_type\": \"linear\", \"factor\": 2.0}", 8, 10000, &c, inv, &scale);
    const double lin8[] = {0.5, 0.05, 0.005, 0.0005};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], lin8[i], "linear 8", i);
    cr_assert_eq(scale, 1.0);
    /* dynamic NTK at twice the context: the base grows 3^(8/6) times */
    rope_of("{\"rope_type\": \"dynamic\", \"factor\": 2.0}", 8, 10000, &c, inv, &scale);
    const double dyn8[] = {1.0, 0.06933612743506347, 0.004807498567691361, 0.0003333333333333334};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], dyn8[i], "dynamic 8", i);
    cr_assert_eq(scale, 1.0);
}

/* Linear and YaRN scaling give the same 256-token story from config.json's rope_scaling and from GGUF's
 * rope.scaling keys (each with its own RoPE convention), another story than the model's own, and the
 * longer context vLLM derives (linear, dynamic: context x factor; yarn: original context x factor). */
Test(model, rope_scaling_linear_and_yarn_from_both_formats)
{
    tu_require_shared();
    const int32_t bos = 1, steps = 256;
    int32_t plain[256], hf[256], gg[256];
    kvp_model *m = load(S260_GGUF);
    greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    const struct {
        const char *json, *type;
        float factor, attn;
        uint32_t orig;
        int32_t max_hf, max_gguf;
        int legacy; /* the factor as rope.scale_linear, no type */
    } cases[] = {
        {"{\"rope_type\": \"linear\", \"factor\": 2.0}", "linear", 2, 0, 0, 1024, 4096, 0},
        {"{\"rope_type\": \"linear\", \"factor\": 2.0}", NULL, 2, 0, 0, 1024, 4096, 1},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}", "yarn", 4, 0, 128,
         512, 512, 0},
        /* GGUF's attn_factor multiplies the default 0.1 ln 4 + 1; HF's attention_factor replaces it */
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128, "
         "\"attention_factor\": 1.5}", "yarn", 4, (float)(1.5 / (0.1 * log(4.0) + 1)), 128, 512, 512, 0},
    };
    int32_t first_yarn[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char to[300];
        snprintf(to, sizeof to, "\"rope_scaling\": %s", cases[k].json);
        m = load(hf_copy("\"rope_scaling\": null", to, NULL, NULL));
        cr_assert_eq(kvp_model_max_len(m), cases[k].max_hf, "case %zu", k);
        greedy_one(m, 16, &bos, 1, steps, 0, hf);
        kvp_model_destroy(m);
        tu_buf kvs = {0};
        uint64_t n = 0;
        if (cases[k].legacy) {
            tu_kv_f32(&kvs, "llama.rope.scale_linear", cases[k].factor), n++;
        } else {
            tu_kv_str(&kvs, "llama.rope.scaling.type", cases[k].type), n++;
            tu_kv_f32(&kvs, "llama.rope.scaling.factor", cases[k].factor), n++;
        }
        if (cases[k].orig) tu_kv_u32(&kvs, "llama.rope.scaling.original_context_length", cases[k].orig), n++;
        if (cases[k].attn > 0) tu_kv_f32(&kvs, "llama.rope.scaling.attn_factor", cases[k].attn), n++;
        m = load(gguf_with_kvs("scaled.gguf", &kvs, n));
        free(kvs.p);
        cr_assert_eq(kvp_model_max_len(m), cases[k].max_gguf, "case %zu", k);
        greedy_one(m, 16, &bos, 1, steps, 0, gg);
        kvp_model_destroy(m);
        int differ = 0, differ_yarn = 0;
        for (int i = 0; i < steps; i++) {
            cr_assert_eq(gg[i], hf[i], "case %zu, token %d: GGUF %d, HF %d", k, i, gg[i], hf[i]);
            differ += plain[i] != hf[i];
            differ_yarn += k == 3 && first_yarn[i] != hf[i];
        }
        cr_assert_gt(differ, 0, "case %zu: the scaling must change the story", k);
        if (k == 2) memcpy(first_yarn, hf, sizeof hf);
        if (k == 3) cr_assert_gt(differ_yarn, 0, "the attention factor must change the story");
    }
    /* dynamic (config.json only: GGUF has no such type): twice the context, another story */
    m = load(hf_copy("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}", NULL,
                     NULL));
    cr_assert_eq(kvp_model_max_len(m), 1024);
    greedy_one(m, 16, &bos, 1, steps, 0, hf);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += plain[i] != hf[i];
    cr_assert_gt(differ, 0, "dynamic scaling must change the story");
}

Test(model, unsupported_or_impossible_rope_scaling_is_rejected)
{
    tu_require_shared();
    const struct {
        const char *json, *names;
        kvp_status st;
    } hf_cases[] = {
        {"{\"rope_type\": \"mrope\", \"factor\": 2.0}", "'mrope' is not supported", KVP_EUNSUPPORTED},
        {"{\"rope_type\": \"longrope\", \"factor\": 2.0}", "\"long_factor\" must be an array", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1], \"short_factor\": [1, 1, 1], "
         "\"original_max_position_embeddings\": 128}", "\"long_factor\" has 3 factors", KVP_EPARSE},
        {"{\"type\": \"su\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 0, 1, 1], "
         "\"original_max_position_embeddings\": 128}", "\"short_factor\"[1] = 0", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 1, 1]}",
         "\"long_factor\" has 4 entries and \"short_factor\" 3", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 1, 1, 1]}",
         "\"original_max_position_embeddings\"", KVP_EPARSE},
        {"{\"rope_type\": \"linear\", \"factor\": 0.5}", "rope_scaling.factor", KVP_EPARSE},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": -32}", "beta_fast -32", KVP_EPARSE},
        {"{\"rope_type\": \"yarn\", \"factor\": \"4\"}", "\"factor\" must be a number", KVP_EPARSE},
    };
    for (size_t k = 0; k < sizeof hf_cases / sizeof hf_cases[0]; k++) {
        char to[300], cfg[400];
        snprintf(to, sizeof to, "\"rope_scaling\": %s", hf_cases[k].json);
        const char *dir = hf_copy("\"rope_scaling\": null", to, NULL, NULL);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        expect_load_error(dir, hf_cases[k].st, cfg, hf_cases[k].names, NULL, hf_cases[k].json);
    }
    const struct {
        const char *type; /* NULL: no type key */
        float factor;     /* 0: no factor key */
        const char *n1, *n2;
        kvp_status st;
    } gguf_cases[] = {
        {"longrope", 0, "rope_factors_long.weight", "0 factors", KVP_EPARSE}, /* the type without its factors */
        {"yarn", -2, "llama.rope.scaling.factor", "-2", KVP_EPARSE},
        {NULL, NAN, "llama.rope.scaling.factor", "nan", KVP_EPARSE},
    };
    tu_buf kvs = {0};
    for (size_t k = 0; k < sizeof gguf_cases / sizeof gguf_cases[0]; k++) {
        kvs.n = 0;
        uint64_t n = 0;
        if (gguf_cases[k].type) tu_kv_str(&kvs, "llama.rope.scaling.type", gguf_cases[k].type), n++;
        if (gguf_cases[k].factor != 0) tu_kv_f32(&kvs, "llama.rope.scaling.factor", gguf_cases[k].factor), n++;
        const char *p = gguf_with_kvs("bad_rope.gguf", &kvs, n);
        expect_load_error(p, gguf_cases[k].st, p, gguf_cases[k].n1, gguf_cases[k].n2, gguf_cases[k].n1);
    }
    /* type "none" with no factor: the model's own story */
    kvs.n = 0;
    tu_kv_str(&kvs, "llama.rope.scaling.type", "none");
    kvp_model *m = load(gguf_with_kvs("none.gguf", &kvs, 1));
    check_golden(m, 16, 0);
    kvp_model_destroy(m);
    free(kvs.p);
}

/* GGUF's general.sampling.* keys (llama.cpp's converter writes them from generation_config.json) become the
 * model's default sampling, as an HF folder's generation_config.json does; an impossible value is refused. */
Test(model, gguf_sampling_metadata_gives_the_default_sampling)
{
    tu_require_shared();
    tu_buf kvs = {0};
    tu_kv_f32(&kvs, "general.sampling.temp", 0.5f);
    tu_kv_u32(&kvs, "general.sampling.top_k", 20);
    tu_kv_f32(&kvs, "general.sampling.top_p", 0.75f);
    tu_kv_f32(&kvs, "general.sampling.penalty_repeat", 1.25f);
    kvp_model *m = load(gguf_with_kvs("sampling.gguf", &kvs, 4));
    const kvp_sampling_defaults *d = &kvp_model_cfg(m)->sampling;
    cr_assert_eq(d->given, KVP_SAMPLING_TEMPERATURE | KVP_SAMPLING_TOP_K | KVP_SAMPLING_TOP_P | KVP_SAMPLING_REPETITION);
    cr_assert(d->temperature == 0.5 && d->top_k == 20 && d->top_p == 0.75 && d->repetition_penalty == 1.25);
    kvp_model_destroy(m);
    m = load(S260_GGUF);
    cr_assert_eq(kvp_model_cfg(m)->sampling.given, 0u);
    kvp_model_destroy(m);
    kvs.n = 0;
    tu_kv_f32(&kvs, "general.sampling.top_p", 1.5f);
    const char *p = gguf_with_kvs("bad_sampling.gguf", &kvs, 1);
    expect_load_error(p, KVP_EPARSE, p, "\"general.sampling.top_p\": 1.5 is out of range (0, 1]", NULL, "top_p 1.5");
    free(kvs.p);
}

/* ---- phi3: fused weights, partial rotary embeddings, LongRoPE ---- */

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

static size_t ck_numel(const ck_tensor *t)
{
    return (size_t)((t->experts ? t->experts : 1) * t->rows * (t->cols ? t->cols : 1));
}

static float *st_f32(kvp_st *s, const char *name, int64_t *numel)
{
    kvp_tensor_view v;
    cr_assert_eq(kvp_st_tensor(s, name, &v), KVP_OK, "%s", name);
    float *f = malloc(sizeof(float) * (size_t)v.numel);
    kvp_tensor_to_f32(&v, f);
    if (numel) *numel = v.numel;
    return f;
}

/* Rows of the heads of one projection, [heads x 8, 64], each head's dimensions reordered by perm. */
static void permute_heads(float *w, int heads, const int *perm)
{
    float tmp[8 * 64];
    for (int h = 0; perm && h < heads; h++) {
        memcpy(tmp, w + h * 8 * 64, sizeof tmp);
        for (int j = 0; j < 8; j++) memcpy(w + (h * 8 + j) * 64, tmp + perm[j] * 64, 64 * sizeof(float));
    }
}

/* Appends tensor f (rows x cols; cols 0: a vector) named gg in a GGUF, else hf; layer l's names get
 * "blk.l." / "model.layers.l." in front (l < 0: a model-level tensor). The checkpoint frees f. */
static void ck_add(ck_tensor *t, int *nt, int g, int l, const char *gg, const char *hf, int64_t rows,
                     int64_t cols, float *f)
{
    ck_tensor *x = &t[(*nt)++];
    *x = (ck_tensor){"", rows, cols, f, 0};
    if (l < 0) snprintf(x->name, sizeof x->name, "%s", g ? gg : hf);
    else snprintf(x->name, sizeof x->name, g ? "blk.%d.%s" : "model.layers.%d.%s", l, g ? gg : hf);
}

/* How write_checkpoint writes stories260K's sizes: a GGUF file of architecture `arch` (rope.dimension_count
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
static const char *write_checkpoint(ck_tensor *t, int nt, const ck_format *fm)
{
    const int g = fm->gguf;
    char dir[300];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* hf_copy makes another */
    static char path[400];
    tu_buf hdr = {0}, data = {0}, file = {0};
    if (g) {
        tu_buf kv = {0};
        tu_kv_str(&kv, "general.architecture", fm->arch);
        const char *keys[] = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                              "attention.head_count_kv", "context_length", "rope.dimension_count"};
        const uint32_t vals[] = {5, 64, 172, 8, 4, 512, fm->rot};
        char key[128];
        for (int i = 0; i < 7; i++) {
            snprintf(key, sizeof key, "%s.%s", fm->arch, keys[i]);
            tu_kv_u32(&kv, key, vals[i]);
        }
        tu_kv_u32(&kv, "tokenizer.ggml.bos_token_id", 1);
        tu_kv_u32(&kv, "tokenizer.ggml.eos_token_id", 2);
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", fm->arch);
        tu_kv_f32(&kv, key, 1e-5f);
        if (fm->kvs) tu_put(&kv, fm->kvs->p, fm->kvs->n);
        tu_put(&file, "GGUF", 4);
        tu_u32(&file, 3);
        tu_u64(&file, (uint64_t)nt);
        tu_u64(&file, 11 + fm->nkv);
        tu_put(&file, kv.p, kv.n);
        free(kv.p);
        for (int i = 0; i < nt; i++) {
            tu_str(&file, t[i].name);
            tu_u32(&file, 1 + (t[i].cols > 0) + (t[i].experts > 0));
            if (t[i].cols) tu_u64(&file, (uint64_t)t[i].cols); /* GGUF lists the fastest dimension first */
            tu_u64(&file, (uint64_t)t[i].rows);
            if (t[i].experts) tu_u64(&file, (uint64_t)t[i].experts);
            tu_u32(&file, 0); /* F32 */
            tu_u64(&file, data.n);
            tu_put(&data, t[i].f, sizeof(float) * ck_numel(&t[i]));
            tu_pad(&data, 32);
        }
        tu_pad(&file, 32);
        tu_put(&file, data.p, data.n);
        snprintf(path, sizeof path, "%s/%s.gguf", dir, fm->arch);
        tu_write_all(path, file.p, file.n);
    } else {
        tu_put(&hdr, "{", 1);
        for (int i = 0; i < nt; i++) {
            cr_assert_eq(t[i].experts, 0, "%s: HF keeps one matrix per expert", t[i].name);
            const size_t bytes = sizeof(float) * ck_numel(&t[i]);
            char e[300], shape[48];
            snprintf(shape, sizeof shape, t[i].cols ? "%lld,%lld" : "%lld", (long long)t[i].rows, (long long)t[i].cols);
            int m = snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", t[i].name, shape, data.n, data.n + bytes);
            tu_put(&hdr, e, (size_t)m);
            tu_put(&data, t[i].f, bytes);
        }
        tu_put(&hdr, "}", 1);
        tu_u64(&file, hdr.n);
        tu_put(&file, hdr.p, hdr.n);
        tu_put(&file, data.p, data.n);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        tu_write_all(path, file.p, file.n);
        char to[4096];
        snprintf(to, sizeof to, "\"model_type\": \"%s\"%s", fm->arch, fm->cfg_add ? fm->cfg_add : "");
        const char *cfgdir = hf_copy("\"model_type\": \"llama\"", to, NULL, NULL);
        size_t len;
        char cp[400];
        snprintf(cp, sizeof cp, "%s/config.json", cfgdir);
        unsigned char *cfg = tu_read_all(cp, &len);
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        tu_write_all(cp, cfg, len);
        free(cfg);
        snprintf(path, sizeof path, "%s", dir);
    }
    for (int i = 0; i < nt; i++) free(t[i].f);
    free(hdr.p), free(data.p), free(file.p);
    return path;
}

static const char *phi3_model(const phi3_spec *sp)
{
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    ck_tensor t[64];
    int nt = 0;
    const int g = sp->gguf;
    char n[96];
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
             st_f32(s, "model.embed_tokens.weight", NULL));
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, st_f32(s, "model.norm.weight", NULL));
    for (int l = 0; l < 5; l++) {
#define HF(x) (snprintf(n, sizeof n, "model.layers.%d.%s", l, x), n)
        float *q = st_f32(s, HF("self_attn.q_proj.weight"), NULL), *k = st_f32(s, HF("self_attn.k_proj.weight"), NULL);
        float *v = st_f32(s, HF("self_attn.v_proj.weight"), NULL), *qkv = malloc(sizeof(float) * 128 * 64);
        permute_heads(q, 8, sp->perm);
        permute_heads(k, 4, sp->perm);
        memcpy(qkv, q, sizeof(float) * 64 * 64);
        memcpy(qkv + 64 * 64, k, sizeof(float) * 32 * 64);
        memcpy(qkv + 96 * 64, v, sizeof(float) * 32 * 64);
        free(q), free(k), free(v);
        float *gate = st_f32(s, HF("mlp.gate_proj.weight"), NULL), *up = st_f32(s, HF("mlp.up_proj.weight"), NULL);
        float *gu = malloc(sizeof(float) * 344 * 64);
        memcpy(gu, gate, sizeof(float) * 172 * 64);
        memcpy(gu + 172 * 64, up, sizeof(float) * 172 * 64);
        free(gate), free(up);
        ck_add(t, &nt, g, l, "attn_norm.weight", "input_layernorm.weight", 64, 0,
                 st_f32(s, HF("input_layernorm.weight"), NULL));
        ck_add(t, &nt, g, l, "attn_qkv.weight", "self_attn.qkv_proj.weight", 128, 64, qkv);
        ck_add(t, &nt, g, l, "attn_output.weight", "self_attn.o_proj.weight", 64, 64,
                 st_f32(s, HF("self_attn.o_proj.weight"), NULL));
        ck_add(t, &nt, g, l, "ffn_norm.weight", "post_attention_layernorm.weight", 64, 0,
                 st_f32(s, HF("post_attention_layernorm.weight"), NULL));
        ck_add(t, &nt, g, l, "ffn_up.weight", "mlp.gate_up_proj.weight", 344, 64, gu);
        ck_add(t, &nt, g, l, "ffn_down.weight", "mlp.down_proj.weight", 64, 172,
                 st_f32(s, HF("mlp.down_proj.weight"), NULL));
#undef HF
    }
    kvp_st_close(s);
    const float *vec[3] = {sp->longf, sp->shortf, sp->freqs};
    const char *vname[3] = {"rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight"};
    for (int i = 0; g && i < 3; i++)
        if (vec[i]) {
            float *f = malloc(sizeof(float) * (size_t)(sp->rot / 2));
            memcpy(f, vec[i], sizeof(float) * (size_t)(sp->rot / 2));
            ck_add(t, &nt, g, -1, vname[i], vname[i], sp->rot / 2, 0, f);
        }
    return write_checkpoint(t, nt, &(ck_format){.gguf = g, .arch = "phi3", .rot = (uint32_t)sp->rot,
                                                .cfg_add = sp->cfg_add, .kvs = sp->kvs, .nkv = sp->nkv});
}

/* Both formats of the fused phi3 layout compute stories260K: the golden story, token for token. */
Test(model, phi3_fused_weights_in_both_formats_give_the_golden_story)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++) {
        kvp_model *m = load(phi3_model(&(phi3_spec){.gguf = g, .rot = 8}));
        cr_assert_eq(kvp_model_cfg(m)->family, KVP_FAMILY_PHI3);
        cr_assert_eq(kvp_model_rope_style(m), KVP_ROPE_HALF);
        check_golden(m, 16, 0);
        kvp_model_destroy(m);
    }
}

/* Partial rotary embeddings (Phi-4-mini's partial_rotary_factor, GGUF's rope.dimension_count): with 4 of 8
 * dimensions rotated, pairs (0, 2) and (1, 3) turn at 1 and 10000^(-1/2) radians a position and dimensions 4-7
 * do not turn. That is the full-rotary model whose pairs (0, 4) and (1, 5) turn at those rates (GGUF's
 * rope_freqs.weight divides 10000^(-1/4) by 10) and (2, 6), (3, 7) not at all (divided by 1e30), once each
 * head's dimensions are reordered so that the pairs line up: the same scores, the same 256-token story.
 * config.json's partial_rotary_factor 0.5 gives the same story as the GGUF key. */
Test(model, partial_rotary_matches_full_rotary_with_still_pairs)
{
    tu_require_shared();
    const float freqs[4] = {1, 10, 1e30f, 1e30f};
    const int perm[8] = {0, 1, 4, 5, 2, 3, 6, 7};
    const int32_t bos = 1, steps = 256;
    int32_t full[256], part[256], hf[256], plain[256];
    kvp_model *m = load(phi3_model(&(phi3_spec){.gguf = 1, .rot = 8, .freqs = freqs}));
    greedy_one(m, 16, &bos, 1, steps, 0, full);
    kvp_model_destroy(m);
    m = load(phi3_model(&(phi3_spec){.gguf = 1, .rot = 4, .perm = perm}));
    cr_assert_eq(kvp_model_cfg(m)->rotary_dim, 4);
    greedy_one(m, 16, &bos, 1, steps, 0, part);
    kvp_model_destroy(m);
    m = load(phi3_model(&(phi3_spec){.gguf = 0, .perm = perm, .cfg_add = ", \"partial_rotary_factor\": 0.5"}));
    cr_assert_eq(kvp_model_cfg(m)->rotary_dim, 4);
    greedy_one(m, 16, &bos, 1, steps, 0, hf);
    kvp_model_destroy(m);
    m = load(S260_GGUF);
    greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) {
        cr_assert_eq(part[i], full[i], "token %d: partial rotary %d, full rotary with still pairs %d", i, part[i],
                     full[i]);
        cr_assert_eq(hf[i], part[i], "token %d: config.json %d, GGUF %d", i, hf[i], part[i]);
        differ += part[i] != plain[i];
    }
    cr_assert_gt(differ, 0, "rotating half the dimensions must change the story");
}

/* LongRoPE against the reference script on Phi-3.5-mini's own config.json: its 48 long factors served past
 * the original 4,096 tokens, its short ones within them, and the attention factor sqrt(1 + ln 32 / ln 4096). */
Test(model, longrope_frequencies_match_the_reference)
{
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/derived/phi-3_5.json", &c), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_str_eq(c.rope_scaling_type, "longrope");
    cr_assert_eq(c.rope_n_factors, 48);
    cr_assert_eq(c.rope_original_max_position, 4096);
    double inv[48], scale;
    const int at[] = {0, 1, 2, 10, 20, 30, 47};
    const double lng[] = {0.9259258891329368, 0.7436073645320989, 0.5976246294798686, 0.030642991217357887,
                          0.0006610722392653191, 5.0507545706277315e-05, 1.8684881663397117e-06};
    const double shrt[] = {1.0, 0.8092198046104523, 0.6614486291088916, 0.13343630862516817,
                           0.011645594269833658, 0.0015654841897367014, 4.2659433051390916e-05};
    kvp_rope_frequencies(&c, kvp_model_config_context(&c), inv, &scale);
    cr_assert_eq(kvp_model_config_context(&c), 131072);
    for (int k = 0; k < 7; k++) expect_rel(inv[at[k]], lng[k], "phi3.5 long", at[k]);
    expect_rel(scale, 1.1902380714238083, "phi3.5 scale", 0);
    kvp_rope_frequencies(&c, 4096, inv, &scale);
    for (int k = 0; k < 7; k++) expect_rel(inv[at[k]], shrt[k], "phi3.5 short", at[k]);
    expect_rel(scale, 1.1902380714238083, "phi3.5 short scale", 0);
}

/* LongRoPE in a model: with the attention factor 1, long factors (1, 2, 4, 8) are llama.cpp's rope_freqs
 * divisors (1, 2, 4, 8) on the same weights, so the phi3 story is that GGUF's; served within the original 128
 * tokens (--max-model-len 128) the short factors (all 1) give the model's own story. config.json's
 * rope_scaling and GGUF's factor tensors and keys agree, with the attention factor given and by default. */
Test(model, longrope_follows_the_served_context_in_both_formats)
{
    tu_require_shared();
    const int32_t bos = 1, steps = 256;
    const float lf[4] = {1, 2, 4, 8}, sf[4] = {1, 1, 1, 1};
    int32_t want[256], plain[128], got[256], dflt[256];
    kvp_model *m = load(gguf_with_rope_freqs(lf));
    greedy_one(m, 16, &bos, 1, steps, 0, want);
    kvp_model_destroy(m);
    m = load(S260_GGUF);
    greedy_one(m, 16, &bos, 1, 128, 0, plain);
    kvp_model_destroy(m);
    tu_buf kvs = {0};
    for (int attn = 0; attn < 2; attn++)
        for (int g = 0; g < 2; g++) {
            char cfg[300];
            snprintf(cfg, sizeof cfg, ", \"original_max_position_embeddings\": 128, \"rope_scaling\": {\"type\": "
                     "\"longrope\", \"long_factor\": [1, 2, 4, 8], \"short_factor\": [1, 1, 1, 1]%s}",
                     attn ? ", \"attention_factor\": 1.0" : "");
            kvs.n = 0;
            tu_kv_u32(&kvs, "phi3.rope.scaling.original_context_length", 128);
            if (attn) tu_kv_f32(&kvs, "phi3.rope.scaling.attn_factor", 1.0f);
            const char *p = phi3_model(&(phi3_spec){.gguf = g, .rot = 8, .cfg_add = cfg, .kvs = &kvs,
                                                    .nkv = 1u + (unsigned)attn, .longf = lf, .shortf = sf});
            if (!g) { /* the rope_scaling added replaces stories260K's null one */
                char cp[400];
                size_t len;
                snprintf(cp, sizeof cp, "%s/config.json", p);
                unsigned char *raw = tu_read_all(cp, &len);
                char *text = calloc(len + 1, 1);
                memcpy(text, raw, len);
                free(raw);
                char *null_rs = strstr(text, "\"rope_scaling\": null,");
                cr_assert_not_null(null_rs);
                memmove(null_rs, null_rs + 21, strlen(null_rs + 21) + 1);
                tu_write_all(cp, text, strlen(text));
                free(text);
            }
            m = load(p);
            cr_assert_str_eq(kvp_model_cfg(m)->rope_scaling_type, "longrope");
            greedy_one(m, 16, &bos, 1, steps, 0, got);
            for (int i = 0; i < steps; i++)
                if (attn) cr_assert_eq(got[i], want[i], "%s token %d: %d, rope_freqs %d", p, i, got[i], want[i]);
                else if (g) cr_assert_eq(got[i], dflt[i], "token %d: GGUF %d, config.json %d", i, got[i], dflt[i]);
            if (!attn && !g) memcpy(dflt, got, sizeof got);
            if (attn) { /* served within the original context: the short factors, all 1 */
                cr_assert_eq(kvp_model_set_max_len(m, 128), KVP_OK);
                greedy_one(m, 16, &bos, 1, 128, 0, got);
                for (int i = 0; i < 127; i++)
                    cr_assert_eq(got[i], plain[i], "%s within 128 tokens, token %d: %d, the model's own %d", p, i,
                                 got[i], plain[i]);
            }
            kvp_model_destroy(m);
        }
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += dflt[i] != want[i];
    cr_assert_gt(differ, 0, "the default attention factor, sqrt(1 + ln 4 / ln 128), must change the story");
    /* one factor tensor without the other */
    kvs.n = 0;
    tu_kv_u32(&kvs, "phi3.rope.scaling.original_context_length", 128);
    const char *p = phi3_model(&(phi3_spec){.gguf = 1, .rot = 8, .kvs = &kvs, .nkv = 1, .longf = lf});
    expect_load_error(p, KVP_EPARSE, p, "rope_factors_long.weight", "rope_factors_short.weight", "one factor tensor");
    free(kvs.p);
}

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
static int moe_dense_layer(const moe_spec *sp, int l) { return (sp->dense2 && l == 2) || sp->experts == 0; }

/* The tensors of the model sp describes, as its format names and lays them out, into t; returns the count. */
static int moe_tensors(const moe_spec *sp, ck_tensor *t)
{
    static const int pairs[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* GGUF row 2i + j <- HF row 4 j + i */
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    int nt = 0;
    const int g = sp->gguf, E = sp->experts, mf = sp->mf;
    const char *blk = sp->qwen ? "mlp" : "block_sparse_moe";
    char n[96], hn[64], gn[64];
    kvp_rng rng;
    kvp_rng_seed(&rng, 20261201, 0);
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
           st_f32(s, "model.embed_tokens.weight", NULL));
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, st_f32(s, "model.norm.weight", NULL));
    for (int l = 0; l < 5; l++) {
#define HF(x) (snprintf(n, sizeof n, "model.layers.%d.%s", l, x), n)
        static const char *const att[5][2] = {{"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"},
                                              {"attn_k", "self_attn.k_proj"},   {"attn_v", "self_attn.v_proj"},
                                              {"attn_output", "self_attn.o_proj"}};
        const int64_t rows[5] = {64, 64, 32, 32, 64}, cols[5] = {0, 64, 64, 64, 64};
        for (int i = 0; i < 5; i++) {
            snprintf(gn, sizeof gn, "%s.weight", att[i][0]);
            snprintf(hn, sizeof hn, "%s.weight", att[i][1]);
            float *f = st_f32(s, HF(hn), NULL);
            if (g && !sp->qwen && (i == 1 || i == 2)) permute_heads(f, (int)rows[i] / 8, pairs);
            ck_add(t, &nt, g, l, gn, hn, rows[i], cols[i], f);
        }
        for (int i = 0; sp->qwen && i < 2; i++) {
            float *f = malloc(sizeof(float) * 8);
            for (int j = 0; j < 8; j++) f[j] = i ? 1.0f - 0.05f * (float)j : 1.0f + 0.1f * (float)j;
            ck_add(t, &nt, g, l, i ? "attn_k_norm.weight" : "attn_q_norm.weight",
                   i ? "self_attn.k_norm.weight" : "self_attn.q_norm.weight", 8, 0, f);
        }
        ck_add(t, &nt, g, l, "ffn_norm.weight", "post_attention_layernorm.weight", 64, 0,
               st_f32(s, HF("post_attention_layernorm.weight"), NULL));
        float *gate = st_f32(s, HF("mlp.gate_proj.weight"), NULL), *up = st_f32(s, HF("mlp.up_proj.weight"), NULL);
        float *down = st_f32(s, HF("mlp.down_proj.weight"), NULL);
        if (moe_dense_layer(sp, l)) {
            ck_add(t, &nt, g, l, "ffn_gate.weight", "mlp.gate_proj.weight", 172, 64, gate);
            ck_add(t, &nt, g, l, "ffn_up.weight", "mlp.up_proj.weight", 172, 64, up);
            ck_add(t, &nt, g, l, "ffn_down.weight", "mlp.down_proj.weight", 64, 172, down);
            continue;
        }
        float *router = malloc(sizeof(float) * (size_t)(E * 64));
        for (int i = 0; i < E * 64; i++) router[i] = (float)(kvp_rng_uniform(&rng) - 0.5);
        snprintf(hn, sizeof hn, "%s.gate.weight", blk);
        ck_add(t, &nt, g, l, "ffn_gate_inp.weight", hn, E, 64, router);
        /* expert e's gate, up, down: all experts in one stacked tensor each (GGUF) or one matrix each (HF) */
        float *ex[3];
        for (int j = 0; j < 3; j++) ex[j] = malloc(sizeof(float) * (size_t)(E * mf * 64));
        for (int e = 0; e < E; e++) {
            float *eg = ex[0] + e * mf * 64, *eu = ex[1] + e * mf * 64, *ed = ex[2] + e * 64 * mf;
            for (int r = 0; r < mf; r++) {
                const int gr = sp->same ? r : (r + 13 * e) % 172;
                memcpy(eg + r * 64, gate + gr * 64, sizeof(float) * 64);
                memcpy(eu + r * 64, up + r * 64, sizeof(float) * 64);
                for (int o = 0; o < 64; o++) ed[o * mf + r] = down[o * 172 + r] * (sp->same ? 1.0f : 1.0f - 0.15f * (float)e);
            }
        }
        free(gate), free(up), free(down);
        static const char *const gg[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
        static const char *const hf[2][3] = {{"w1", "w3", "w2"}, {"gate_proj", "up_proj", "down_proj"}};
        for (int j = 0; j < 3; j++) {
            const int64_t r = j < 2 ? mf : 64, c = j < 2 ? 64 : mf;
            if (g) {
                ck_add(t, &nt, g, l, gg[j], "", r, c, ex[j]);
                t[nt - 1].experts = E;
                continue;
            }
            for (int e = 0; e < E; e++) {
                float *f = malloc(sizeof(float) * (size_t)(r * c));
                memcpy(f, ex[j] + e * r * c, sizeof(float) * (size_t)(r * c));
                snprintf(hn, sizeof hn, "%s.experts.%d.%s.weight", blk, e, hf[sp->qwen][j]);
                ck_add(t, &nt, g, l, "", hn, r, c, f);
            }
            free(ex[j]);
        }
#undef HF
    }
    kvp_st_close(s);
    return nt;
}

static const char *moe_model(const moe_spec *sp)
{
    static ck_tensor t[512];
    const int nt = moe_tensors(sp, t);
    char add[256];
    tu_buf kvs = {0};
    uint64_t nkv = 0;
    const char *arch = sp->gguf ? (sp->qwen ? "qwen3moe" : "llama") : (sp->qwen ? "qwen3_moe" : "mixtral");
    if (sp->gguf) {
        char key[96];
        const uint32_t vals[3] = {(uint32_t)sp->experts, (uint32_t)sp->k, (uint32_t)sp->mf};
        const char *keys[3] = {"expert_count", "expert_used_count", "expert_feed_forward_length"};
        for (nkv = 0; nkv < (sp->qwen ? 3u : 2u); nkv++) {
            snprintf(key, sizeof key, "%s.%s", arch, keys[nkv]);
            tu_kv_u32(&kvs, key, vals[nkv]);
        }
    } else if (sp->qwen) {
        snprintf(add, sizeof add, ", \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
                 "\"norm_topk_prob\": %s, \"mlp_only_layers\": [%s]", sp->experts, sp->k, sp->mf,
                 sp->norm_topk ? "true" : "false", sp->dense2 ? "2" : "");
    } else {
        snprintf(add, sizeof add, ", \"num_local_experts\": %d, \"num_experts_per_tok\": %d", sp->experts, sp->k);
    }
    const char *p = write_checkpoint(t, nt, &(ck_format){.gguf = sp->gguf, .arch = arch, .rot = 8,
                                                          .cfg_add = sp->gguf ? NULL : add, .kvs = &kvs, .nkv = nkv});
    free(kvs.p);
    return p;
}

/* Top-1 routing among experts that are all stories260K's FFN weighs the one chosen by exactly 1: the golden
 * story, token for token, from an HF mixtral folder and a GGUF (arch llama, stacked experts). */
Test(model, moe_top1_of_equal_experts_gives_the_golden_story_in_both_formats)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++) {
        kvp_model *m = load(moe_model(&(moe_spec){.gguf = g, .same = 1, .experts = 4, .k = 1, .mf = 172}));
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(c->family, KVP_FAMILY_MIXTRAL);
        cr_assert(c->num_experts == 4 && c->num_experts_per_tok == 1 && c->moe_norm_topk);
        cr_assert_eq(kvp_model_rope_style(m), g ? KVP_ROPE_PAIRS : KVP_ROPE_HALF);
        check_golden(m, 16, 0);
        kvp_model_destroy(m);
    }
}

/* ---- a float64 reference of the HF model moe_tensors describes (no code shared with runtime/model/model.c) ---- */

static const float *ck_find(const ck_tensor *t, int nt, const char *name)
{
    for (int i = 0; i < nt; i++)
        if (!strcmp(t[i].name, name)) return t[i].f;
    cr_assert_fail("no tensor %s", name);
    return NULL;
}

static void ref_rmsnorm(double *y, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void ref_mv(double *y, const float *w, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        y[r] = 0;
        for (int c = 0; c < cols; c++) y[r] += (double)w[r * cols + c] * x[c];
    }
}

/* y (64) = down(silu(gate x) * up x), the FFN of mf units whose matrices are named pre + gate/up/down. */
static void ref_swiglu(double *y, const ck_tensor *t, int nt, const char *const names[3], int mf, const double *x)
{
    double gv[172], uv[172];
    ref_mv(gv, ck_find(t, nt, names[0]), x, mf, 64);
    ref_mv(uv, ck_find(t, nt, names[1]), x, mf, 64);
    for (int r = 0; r < mf; r++) gv[r] = gv[r] / (1 + exp(-gv[r])) * uv[r];
    ref_mv(y, ck_find(t, nt, names[2]), gv, 64, mf);
}

/* logits (P, 512) of prompt tok, every position; *distinct: the experts any token chose, as a bit set */
static void moe_reference(const ck_tensor *t, int nt, const moe_spec *sp, const int32_t *tok, int P, double *logits,
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
            if (moe_dense_layer(sp, l)) {
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

/* forward_prompt5's logits of m against a float64 reference: max |got - want| / (|want| + 1) under 1e-4 */
static void expect_logits_near(kvp_model *m, const double *want, size_t i)
{
    static float got[5 * 512];
    cr_assert_eq(forward_prompt5(m, got), KVP_OK, "%s", kvp_error_detail());
    double maxerr = 0;
    for (int j = 0; j < 5 * 512; j++) maxerr = fmax(maxerr, fabs(got[j] - want[j]) / (fabs(want[j]) + 1.0));
    cr_assert_lt(maxerr, 1e-4, "case %zu: max relative logit error %g", i, maxerr);
}

/* The MoE forward pass against the float64 reference above, on distinct experts and a router that spreads the
 * tokens: mixtral (top 2 of 4, renormalized), qwen3_moe (top 3 of 6 experts of 96 units, with and without
 * norm_topk_prob, q/k norms, a dense layer 2), each from an HF folder and a GGUF (llama with expert keys,
 * qwen3moe; GGUF has no dense layers in an MoE model). */
Test(model, moe_logits_match_a_float64_reference)
{
    tu_require_shared();
    const moe_spec specs[] = {
        {.experts = 4, .k = 2, .mf = 172},
        {.gguf = 1, .experts = 4, .k = 2, .mf = 172},
        {.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1},
        {.qwen = 1, .norm_topk = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1},
        {.gguf = 1, .qwen = 1, .norm_topk = 1, .experts = 6, .k = 3, .mf = 96},
    };
    static ck_tensor t[512];
    const int32_t toks[5] = {1, 403, 407, 261, 378};
    static double want[5 * 512];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        moe_spec hf = specs[i];
        hf.gguf = 0;
        const int nt = moe_tensors(&hf, t);
        unsigned distinct;
        moe_reference(t, nt, &hf, toks, 5, want, &distinct);
        for (int j = 0; j < nt; j++) free(t[j].f);
        cr_assert_eq(__builtin_popcount(distinct), specs[i].experts, "case %zu: every expert should be chosen", i);
        kvp_model *m = load(moe_model(&specs[i]));
        cr_assert_eq(kvp_model_cfg(m)->moe_norm_topk, !specs[i].qwen || specs[i].norm_topk, "case %zu", i);
        expect_logits_near(m, want, i);
        kvp_model_destroy(m);
    }
}

/* An MoE model row for row: the same logits alone as in any batch, on 1 and 2 threads. */
Test(model, moe_rows_bit_identical_for_every_batch_size)
{
    kvp_model *m = load(moe_model(&(moe_spec){.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1}));
    static float ref[40 * 512];
    int have_ref = 0;
    expect_batch_invariant(m, "qwen3_moe", ref, &have_ref);
    kvp_model_destroy(m);
}

typedef struct {
    kvp_comm *comm;
    const char *path;
    float logits[5 * 512];
    kvp_status st;
    char err[512];
} moe_rank;

static void *moe_rank_main(void *arg)
{
    moe_rank *j = arg;
    kvp_model *m = NULL;
    j->st = kvp_model_load_tp(j->path, j->comm, &m);
    if (j->st == KVP_OK) j->st = forward_prompt5(m, j->logits);
    if (j->st != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    return NULL;
}

/* Tensor parallelism splits every expert's units over the ranks as a dense FFN's (the router on every rank):
 * at 2 and 4 rank threads every rank's logits are one rank's, up to the order of the sums. */
Test(model, moe_experts_split_over_ranks_give_one_ranks_logits)
{
    const char *path = moe_model(&(moe_spec){.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1});
    static moe_rank jobs[4];
    static float one[5 * 512];
    for (int tp = 1; tp <= 4; tp *= 2) {
        kvp_comm *comms[4];
        pthread_t tid[4];
        cr_assert_eq(kvp_comm_threads_create(tp, comms), KVP_OK);
        for (int r = 0; r < tp; r++) {
            jobs[r].comm = comms[r], jobs[r].path = path;
            cr_assert_eq(pthread_create(&tid[r], NULL, moe_rank_main, &jobs[r]), 0);
        }
        for (int r = 0; r < tp; r++) pthread_join(tid[r], NULL);
        for (int r = 0; r < tp; r++) kvp_comm_destroy(comms[r]);
        for (int r = 0; r < tp; r++) {
            cr_assert_eq(jobs[r].st, KVP_OK, "tp %d rank %d: %s", tp, r, jobs[r].err);
            if (tp == 1) memcpy(one, jobs[0].logits, sizeof one);
            double e = max_rel(jobs[r].logits, one, 5 * 512);
            cr_assert_lt(e, 1e-5, "tp %d rank %d: max relative logit error %g", tp, r, e);
        }
    }
}

/* Experts that disagree with the config, and expert counts out of range: an error naming file and problem. */
Test(model, moe_checkpoints_that_disagree_with_the_config_are_rejected)
{
    tu_require_shared();
    const moe_spec mix = {.experts = 4, .k = 2, .mf = 172};
    /* config.json names 5 experts, the folder holds 4 */
    char dir[400], cfg[500];
    snprintf(dir, sizeof dir, "%s", moe_model(&mix));
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    size_t n;
    char *c = (char *)tu_read_all(cfg, &n);
    char *at = strstr(c, "\"num_local_experts\": 4");
    cr_assert_not_null(at);
    at[strlen("\"num_local_experts\": ")] = '5';
    tu_write_all(cfg, c, n);
    expect_load_error(dir, KVP_EPARSE, "model.layers.0.block_sparse_moe.gate.weight", "[4, 64]", "[5, 64]",
                      "5 experts in config.json, 4 in the weights");
    at[strlen("\"num_local_experts\": ")] = '3';
    tu_write_all(cfg, c, n);
    expect_load_error(dir, KVP_EPARSE, "model.layers.0.block_sparse_moe.gate.weight", "[4, 64]", "[3, 64]",
                      "3 experts in config.json, 4 in the weights");
    free(c);
    /* GGUF: more experts a token than experts; a stacked tensor of the wrong shape */
    const char *g = moe_model(&(moe_spec){.gguf = 1, .experts = 4, .k = 2, .mf = 172});
    size_t len;
    unsigned char *buf = tu_read_all(g, &len);
    const uint32_t five = 5;
    tu_gguf_set_kv4(buf, len, "llama.expert_used_count", 4 /* UINT32 */, &five);
    char p[400];
    snprintf(p, sizeof p, "%s/used.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    expect_load_error(p, KVP_EPARSE, "llama.expert_used_count", "5 is out of range (1..4)", NULL, "top 5 of 4");
    tu_gguf_set_kv4(buf, len, "llama.expert_used_count", 4, &(uint32_t){2});
    tu_gguf_set_kv4(buf, len, "llama.expert_count", 4, &(uint32_t){3});
    snprintf(p, sizeof p, "%s/count.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    expect_load_error(p, KVP_EPARSE, "blk.0.ffn_gate_inp.weight", "[4, 64]", "[3, 64]", "3 experts, 4 stored");
    free(buf);
}

/* A dense llama GGUF whose converter wrote expert_count 0 and expert_used_count 0 is the dense model: the
 * golden story. qwen3moe with no experts is refused, naming the key. */
Test(model, moe_gguf_expert_count_zero_is_a_dense_llama)
{
    tu_require_shared();
    kvp_model *m = load(moe_model(&(moe_spec){.gguf = 1}));
    const kvp_model_config *c = kvp_model_cfg(m);
    cr_assert_eq(c->family, KVP_FAMILY_LLAMA);
    cr_assert_eq(c->num_experts, 0);
    check_golden(m, 16, 0);
    kvp_model_destroy(m);
    const char *q = moe_model(&(moe_spec){.gguf = 1, .qwen = 1, .experts = 4, .k = 2, .mf = 172});
    size_t len;
    unsigned char *buf = tu_read_all(q, &len);
    tu_gguf_set_kv4(buf, len, "qwen3moe.expert_count", 4 /* UINT32 */, &(uint32_t){0});
    char p[400];
    snprintf(p, sizeof p, "%s/none.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    free(buf);
    expect_load_error(p, KVP_EPARSE, "qwen3moe.expert_count", "0 is out of range (1..65536)", NULL, "qwen3moe, 0");
}

/* Every allocation of an MoE checkpoint's load (router, experts) failing in turn: a clean ENOMEM, no leak
 * (the sanitizer build). */
Test(model, moe_load_survives_every_allocation_failure)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++)
        tu_every_alloc_failure("MoE model load", load_model, destroy_model,
                               (void *)moe_model(&(moe_spec){.gguf = g, .experts = 4, .k = 2, .mf = 172}), 0);
}

/* ---- gemma, gemma2, gemma3: scaled embedding, (1 + w) norms, GeGLU, post-norms, soft caps, windows ---- */

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

static int gemma_tensors(const gemma_spec *sp, ck_tensor *t)
{
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    int nt = 0;
    const int g = sp->gguf, post = sp->v >= 2;
    const float one = g ? 0.0f : 1.0f; /* subtracted from the norm weights HF stores */
    char n[96];
    kvp_rng rng;
    kvp_rng_seed(&rng, 7, 0);
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
           st_f32(s, "model.embed_tokens.weight", NULL));
    float *on = st_f32(s, "model.norm.weight", NULL);
    for (int i = 0; i < 64; i++) on[i] -= one;
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, on);
    for (int l = 0; l < 5; l++) {
        /* {GGUF name, HF name, stories260K's tensor ("-": noise around 1), rows, cols, in this model} */
        const struct {
            const char *gg, *hf, *from;
            int64_t rows, cols;
            int here;
        } w[] = {{"attn_norm", "input_layernorm", "input_layernorm", 64, 0, 1},
                 {"attn_q", "self_attn.q_proj", "self_attn.q_proj", 64, 64, 1},
                 {"attn_k", "self_attn.k_proj", "self_attn.k_proj", 32, 64, 1},
                 {"attn_v", "self_attn.v_proj", "self_attn.v_proj", 32, 64, 1},
                 {"attn_q_norm", "self_attn.q_norm", "-", 8, 0, sp->v == 3},
                 {"attn_k_norm", "self_attn.k_norm", "-", 8, 0, sp->v == 3},
                 {"attn_output", "self_attn.o_proj", "self_attn.o_proj", 64, 64, 1},
                 {"post_attention_norm", "post_attention_layernorm", "-", 64, 0, post},
                 {"ffn_norm", post ? "pre_feedforward_layernorm" : "post_attention_layernorm",
                  "post_attention_layernorm", 64, 0, 1},
                 {"post_ffw_norm", "post_feedforward_layernorm", "-", 64, 0, post},
                 {"ffn_gate", "mlp.gate_proj", "mlp.gate_proj", 172, 64, 1},
                 {"ffn_up", "mlp.up_proj", "mlp.up_proj", 172, 64, 1},
                 {"ffn_down", "mlp.down_proj", "mlp.down_proj", 64, 172, 1}};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            if (!w[i].here) continue;
            char gn[64], hn[64];
            snprintf(gn, sizeof gn, "%s.weight", w[i].gg);
            snprintf(hn, sizeof hn, "%s.weight", w[i].hf);
            float *f;
            if (strcmp(w[i].from, "-") != 0) {
                snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, w[i].from);
                f = st_f32(s, n, NULL);
            } else {
                f = malloc(sizeof(float) * (size_t)w[i].rows);
                for (int j = 0; j < w[i].rows; j++) f[j] = 1.0f + 0.2f * (float)(kvp_rng_uniform(&rng) - 0.5);
            }
            if (!w[i].cols)
                for (int j = 0; j < w[i].rows; j++) f[j] -= one;
            ck_add(t, &nt, g, l, gn, hn, w[i].rows, w[i].cols, f);
        }
    }
    kvp_st_close(s);
    return nt;
}

static const char *gemma_model(const gemma_spec *sp)
{
    static ck_tensor t[128];
    const int nt = gemma_tensors(sp, t);
    const char *arch = sp->v == 3 ? (sp->gguf ? "gemma3" : "gemma3_text") : sp->v == 2 ? "gemma2" : "gemma";
    char add[1024] = "", part[160];
    tu_buf kvs = {0};
    uint64_t nkv = 0;
    /* {config.json key, GGUF key after "arch.", value (0: left out), GGUF u32} */
    const struct {
        const char *hf, *gg;
        double v;
        int u32;
    } f[] = {{"attn_logit_softcapping", "attn_logit_softcapping", sp->attn_cap, 0},
             {"final_logit_softcapping", "final_logit_softcapping", sp->final_cap, 0},
             {"sliding_window", "attention.sliding_window", sp->window, 1},
             {"rope_local_base_freq", "rope.freq_base_swa", sp->local_theta, 0},
             {"query_pre_attn_scalar", NULL, sp->qpas, 0},
             {"sliding_window_pattern", NULL, sp->pattern, 0}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].v == 0) continue;
        if (!sp->gguf) {
            snprintf(part, sizeof part, ", \"%s\": %g", f[i].hf, f[i].v);
            strcat(add, part);
        } else if (f[i].gg) {
            snprintf(part, sizeof part, "%s.%s", arch, f[i].gg);
            if (f[i].u32) tu_kv_u32(&kvs, part, (uint32_t)f[i].v);
            else tu_kv_f32(&kvs, part, (float)f[i].v);
            nkv++;
        }
    }
    if (sp->gelu) strcat(add, ", \"hidden_activation\": \"gelu\"");
    if (sp->linear > 0) { /* read before the file's own "rope_scaling": null, which comes later */
        snprintf(part, sizeof part, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %g}", sp->linear);
        strcat(add, part);
    }
    if (sp->cfg_extra) strcat(add, sp->cfg_extra);
    const char *p = write_checkpoint(t, nt, &(ck_format){.gguf = sp->gguf, .arch = arch, .rot = 8, .cfg_add = add,
                                                          .kvs = &kvs, .nkv = nkv});
    free(kvs.p);
    return p;
}

/* x (n) normalized and scaled by 1 + w, as gemma's RMSNorm (w as HF stores it) */
static void ref_gemma_norm(double *y, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (1.0 + w[i]);
}

/* Whether layer l of the model sp describes slides (gemma3: also its RoPE base) */
static int gemma_sliding(const gemma_spec *sp, int l)
{
    if (sp->v == 3) return sp->gguf ? sp->window > 0 && l % 6 < 5 : (l + 1) % (sp->pattern ? sp->pattern : 6) != 0;
    return sp->v == 2 && sp->window > 0 && l % 2 == 0;
}

/* logits (P, 512) of the HF model in t that sp describes, as transformers computes it (sp->qpas 0: 1/sqrt(8);
 * caps 0: off; a window of sp->window keys on the sliding layers, 0: none) */
static void gemma_reference(const ck_tensor *t, int nt, const gemma_spec *sp, const int32_t *tok, int P,
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
        const int slide = gemma_sliding(sp, l);
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

static double max_rel_d(const double *a, const double *b, int n)
{
    double e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i]) / (fabs(b[i]) + 1.0));
    return e;
}

/* gemma, gemma2 and gemma3 from an HF folder and a GGUF against the float64 reference above. In the HF gemma2
 * and gemma3 cases each feature is set where it changes the logits (checked on the reference: the reference
 * without it differs), so a forward pass that skipped it would fail. */
Test(model, gemma_logits_match_a_float64_reference)
{
    tu_require_shared();
    const gemma_spec specs[] = {
        {.v = 2, .qpas = 32, .attn_cap = 1.5, .final_cap = 8, .window = 3},
        {.gguf = 1, .v = 2, .attn_cap = 1.5, .final_cap = 8, .window = 3},
        {.v = 1},
        {.gguf = 1, .v = 1},
        {.v = 1, .gelu = 1},
        {.v = 3, .qpas = 32, .window = 3, .pattern = 2, .local_theta = 100, .linear = 4},
        {.gguf = 1, .v = 3, .window = 3, .local_theta = 100},
        {.v = 3}, /* Gemma3TextConfig's defaults: window 4096, pattern 6, local base 10,000 */
    };
    static ck_tensor t[128];
    const int32_t toks[5] = {1, 403, 407, 261, 378};
    static double want[5 * 512], other[5 * 512];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        gemma_spec r = specs[i]; /* the model as the reference computes it: r.gguf only picks the sliding layers */
        if (r.gguf) r.qpas = 8;                  /* llama.cpp's 1/sqrt(head_dim) */
        else if (r.v >= 2 && !r.qpas) r.qpas = 256; /* transformers' default */
        r.gguf = 0;
        const int nt = gemma_tensors(&r, t); /* the HF tensors */
        r.gguf = specs[i].gguf;
        gemma_reference(t, nt, &r, toks, 5, want);
        for (int j = 0; j < 5 && r.v >= 2 && !r.gguf && r.window > 0; j++) {
            gemma_spec x = r;
            if (j == 0) x.qpas = 8;
            if (j == 1) x.attn_cap = x.attn_cap > 0 ? 0 : 1.5, x.final_cap = 0;
            if (j == 2) x.window = 0;
            if (j == 3) x.local_theta = 1e4;
            if (j == 4) x.linear = 0;
            if ((j == 3 && r.v != 3) || (j == 4 && !r.linear)) continue;
            gemma_reference(t, nt, &x, toks, 5, other);
            cr_assert_gt(max_rel_d(other, want, 5 * 512), 1e-3, "case %zu: variant %d leaves the logits as they are", i,
                         j);
        }
        for (int j = 0; j < nt; j++) free(t[j].f);
        kvp_model *m = load(gemma_model(&specs[i]));
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(c->family, KVP_FAMILY_GEMMA2, "case %zu", i);
        cr_assert_eq(c->ffn_act, r.gelu ? KVP_ACT_GELU : KVP_ACT_GELU_TANH, "case %zu", i);
        cr_assert_eq(kvp_model_rope_style(m), KVP_ROPE_HALF, "case %zu", i);
        cr_assert_eq(c->qk_norm, r.v == 3, "case %zu", i);
        for (int l = 0; l < 5; l++)
            cr_assert_eq(c->layer_is_sliding[l] && c->sliding_window > 0, gemma_sliding(&r, l), "case %zu layer %d", i,
                         l);
        expect_logits_near(m, want, i);
        kvp_model_destroy(m);
    }
}

/* gemma2 and gemma3 row for row: the same logits alone as in any batch, on 1 and 2 threads. */
Test(model, gemma_rows_bit_identical_for_every_batch_size)
{
    const gemma_spec specs[2] = {{.v = 2, .qpas = 32, .attn_cap = 1.5, .final_cap = 8, .window = 3},
                                 {.v = 3, .window = 3, .pattern = 2, .local_theta = 100}};
    for (int i = 0; i < 2; i++) {
        kvp_model *m = load(gemma_model(&specs[i]));
        static float ref[40 * 512];
        int have_ref = 0;
        expect_batch_invariant(m, i ? "gemma3" : "gemma2", ref, &have_ref);
        kvp_model_destroy(m);
    }
}

/* Defaults as transformers' configs (Gemma2Config: query_pre_attn_scalar 256, caps 50 and 30, null: off;
 * Gemma3TextConfig: no caps, rope_theta 1e6, local base 1e4), and errors that name the field: an activation not
 * computed, a negative cap, in either format. */
Test(model, gemma_config_defaults_and_bad_fields)
{
    kvp_model *m = load(gemma_model(&(gemma_spec){.v = 2}));
    const kvp_model_config *c = kvp_model_cfg(m);
    cr_assert(c->query_pre_attn_scalar == 256 && c->attn_logit_softcapping == 50 && c->final_logit_softcapping == 30);
    cr_assert(c->post_norms && c->rope_local_theta == 0);
    kvp_model_destroy(m);
    m = load(gemma_model(&(gemma_spec){.v = 2, .cfg_extra = ", \"attn_logit_softcapping\": null"}));
    cr_assert(kvp_model_cfg(m)->attn_logit_softcapping == 0 && kvp_model_cfg(m)->final_logit_softcapping == 30);
    kvp_model_destroy(m);
    m = load(gemma_model(&(gemma_spec){.v = 3}));
    c = kvp_model_cfg(m);
    cr_assert(c->attn_logit_softcapping == 0 && c->final_logit_softcapping == 0 && c->rope_local_theta == 1e4);
    cr_assert(c->query_pre_attn_scalar == 256 && c->sliding_window == 4096 && c->post_norms && c->qk_norm);
    kvp_model_destroy(m);
    m = load(gemma_model(&(gemma_spec){.gguf = 1, .v = 3, .window = 7}));
    c = kvp_model_cfg(m);
    cr_assert(c->rope_local_theta == 1e4 && c->query_pre_attn_scalar == 8 && c->sliding_window == 7);
    kvp_model_destroy(m);
    const char *p = gemma_model(&(gemma_spec){.v = 2, .cfg_extra = ", \"hidden_activation\": \"relu\""});
    expect_load_error(p, KVP_EUNSUPPORTED, "config.json", "\"hidden_activation\": \"relu\"", NULL, "relu");
    p = gemma_model(&(gemma_spec){.v = 2, .attn_cap = -2});
    expect_load_error(p, KVP_EINVAL, "config.json", "\"attn_logit_softcapping\": -2", NULL, "negative cap");
    p = gemma_model(&(gemma_spec){.gguf = 1, .v = 2, .final_cap = -3});
    expect_load_error(p, KVP_EPARSE, p, "'gemma2.final_logit_softcapping' = -3", NULL, "negative GGUF cap");
    p = gemma_model(&(gemma_spec){.gguf = 1, .v = 3, .local_theta = -5});
    expect_load_error(p, KVP_EPARSE, p, "'gemma3.rope.freq_base_swa' = -5", NULL, "negative local base");
}

/* A multimodal Gemma 3 folder (Gemma3ForConditionalGeneration): config.json's text_config holds the language
 * model, whose tensors sit under language_model. (transformers before 4.52) or model.language_model. (since),
 * beside a vision tower and a projector. It runs the language model alone: the logits of the same weights as
 * a gemma3_text folder, bit for bit. */
Test(model, gemma3_multimodal_folders_run_their_language_model)
{
    tu_require_shared();
    const gemma_spec sp = {.v = 3, .window = 3, .pattern = 2, .local_theta = 100};
    static float plain[5 * 512], got[5 * 512];
    kvp_model *m = load(gemma_model(&sp));
    cr_assert_eq(forward_prompt5(m, plain), KVP_OK, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    for (int wrap = 1; wrap <= 2; wrap++) {
        static ck_tensor t[128];
        int nt = gemma_tensors(&sp, t);
        for (int i = 0; i < nt; i++) {
            const char *pre = wrap == 1 ? "language_model." : "model.language_model.";
            const char *rest = wrap == 1 ? t[i].name : t[i].name + strlen("model.");
            const size_t a = strlen(pre), b = strlen(rest);
            cr_assert_lt(a + b, sizeof t[i].name);
            memmove(t[i].name + a, rest, b + 1);
            memcpy(t[i].name, pre, a);
        }
        const char *vis[2] = {"vision_tower.vision_model.post_layernorm.weight",
                              "multi_modal_projector.mm_soft_emb_norm.weight"};
        for (int i = 0; i < 2; i++) {
            char n[128];
            snprintf(n, sizeof n, "%s%s", wrap == 2 ? "model." : "", vis[i]);
            ck_add(t, &nt, 0, -1, "", n, 64, 0, calloc(64, sizeof(float)));
        }
        const char *dir = write_checkpoint(
            t, nt,
            &(ck_format){.arch = "gemma3_text",
                         .cfg_add = ", \"sliding_window\": 3, \"sliding_window_pattern\": 2, "
                                    "\"rope_local_base_freq\": 100"});
        char cp[512];
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        size_t len;
        unsigned char *flat = tu_read_all(cp, &len);
        tu_buf wrapped = {0};
        const char head[] = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                            "\"text_config\": ";
        tu_put(&wrapped, head, strlen(head));
        tu_put(&wrapped, flat, len);
        tu_put(&wrapped, "}", 1);
        tu_write_all(cp, wrapped.p, wrapped.n);
        free(flat), free(wrapped.p);
        m = load(dir);
        cr_assert_str_eq(kvp_model_cfg(m)->model_type, "gemma3_text");
        cr_assert_eq(forward_prompt5(m, got), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(memcmp(got, plain, sizeof got), 0, "wrap %d: other logits than the gemma3_text folder's", wrap);
        kvp_model_destroy(m);
    }
}
