/* tests/runtime/forward_testutil.c — see forward_testutil.h. */
#include "forward_testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/kvp_test.h"
#include "model_testutil.h"

kvp_model *tu_load(const char *path)
{
    tu_require_shared();
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load(path, &m), KVP_OK, "%s: %s", path, kvp_error_detail());
    return m;
}

/* Runs a prompt then greedy decoding on one sequence whose blocks are a shuffled set of the cache's blocks.
 * out[0..steps-np) receives the generated tokens. Prefill in chunks of `chunk` tokens (0: all at once). */
void tu_greedy_one(kvp_model *m, int32_t bs, const int32_t *prompt, int32_t np, int32_t steps, int32_t chunk,
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

void tu_check_golden(kvp_model *m, int32_t bs, int32_t chunk)
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
        tu_greedy_one(m, bs, prompt, np, steps, chunk, got);
        /* got[i] is the token at position np + i; want[j] is the token at position j + 1. */
        for (int32_t i = 0; np + i < steps + 1 && np + i - 1 < nw; i++)
            cr_assert_eq(got[i], want[np - 1 + i], "%s, block %d: position %d: got %d, want %d", kvp_model_path(m),
                         bs, np + i, got[i], want[np - 1 + i]);
    }
    cJSON_Delete(gold);
}

kvp_status tu_load_model(void *path, void **m) { return kvp_model_load(path, (kvp_model **)m); }
void tu_destroy_model(void *m) { kvp_model_destroy(m); }

/* The logits of every row of the 5-token prompt ids (taken modulo the vocabulary) in out (5 x vocab), from a
 * fresh one-block cache. */
kvp_status tu_forward_tokens5(kvp_model *m, const int32_t *ids, float *out)
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

/* tu_forward_tokens5 on a fixed prompt. */
kvp_status tu_forward_prompt5(kvp_model *m, float *out)
{
    static const int32_t ids[5] = {1, 403, 407, 261, 378};
    return tu_forward_tokens5(m, ids, out);
}

void tu_logits_of(kvp_model *m, float *out /* 5 x 512 */)
{
    cr_assert_eq(tu_forward_prompt5(m, out), KVP_OK, "%s", kvp_error_detail());
}

double tu_max_rel(const float *a, const float *b, int n)
{
    double e = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs(b[i]) + 1.0);
        if (d > e) e = d;
    }
    return e;
}

/* Invariant matmul tiling (every row tile of the lane count, single rows, every panel including the partial
 * one of the 172-wide FFN; on 16 lanes tiles of two panels, and that FFN's eleventh panel alone; from 8 rows on,
 * the LM head's tiles and left-over rows split over the threads): one token a step, then prompts of n = 1..40
 * tokens in one forward pass; every row equals the same token alone, bit for bit, on 1 and 2 threads. ref
 * (40 x V): with *have_ref, the tokens alone must give it too (another lane count's results); else it gets
 * them. */
void tu_expect_batch_invariant(kvp_model *m, const char *what, float *ref, int *have_ref)
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

void tu_expect_load_error(const char *path, kvp_status want, const char *n1, const char *n2, const char *n3,
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

/* tu_forward_prompt5's logits of m against a float64 reference: max |got - want| / (|want| + 1) under 1e-4 */
void tu_expect_logits_near(kvp_model *m, const double *want, size_t i)
{
    static float got[5 * 512];
    cr_assert_eq(tu_forward_prompt5(m, got), KVP_OK, "%s", kvp_error_detail());
    double maxerr = 0;
    for (int j = 0; j < 5 * 512; j++) maxerr = fmax(maxerr, fabs(got[j] - want[j]) / (fabs(want[j]) + 1.0));
    cr_assert_lt(maxerr, 1e-4, "case %zu: max relative logit error %g", i, maxerr);
}
