/* Forward-pass tests on stories260K: golden logits (GGUF pairs RoPE and HF rotate-half), golden greedy
 * continuations through the paged KV cache with a shuffled page table, and load errors on corrupt or
 * incomplete checkpoints made here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "model_testutil.h"
#include "runtime/model.h"

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
    cr_assert_eq(kvp_kv_cache_create(m, nblocks, bs, &kv), KVP_OK, "%s", kvp_error_detail());
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
            cr_assert_eq(kvp_kv_cache_create(m, 2, 4, &kv), KVP_OK);
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

Test(model, forward_rejects_bad_batches)
{
    kvp_model *m = load(S260_GGUF);
    kvp_kv_cache *kv;
    cr_assert_eq(kvp_kv_cache_create(m, 4, 16, &kv), KVP_OK);
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
    char *c = malloc(n + 200);
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
}

Test(model, load_survives_every_allocation_failure)
{
    tu_require_shared();
    for (int64_t n = 1;; n++) {
        kvp_alloc_fail_at(n);
        kvp_model *m = NULL;
        kvp_status st = kvp_model_load(S260_GGUF, &m);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (made < n) {
            cr_assert_eq(st, KVP_OK);
            kvp_model_destroy(m);
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM, "allocation %lld: %s", (long long)n, kvp_status_str(st));
        cr_assert_null(m);
    }
}
