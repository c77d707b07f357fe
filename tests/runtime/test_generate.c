/* Generation loop tests (runtime/engine/session.h) on stories260K: golden greedy stories through continuous batching,
 * batch invariance (alone / together / prefix cache radix, hash, none / block sizes 1, 16, 64 / preemption),
 * n > 1 sampling by fork with copy-on-write (accounting), beam search against exhaustive search. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/json.h"
#include "cli_testutil.h"
#include "model_testutil.h"
#include "runtime/text/chat.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/text/tokenizer.h"

static kvp_model *g_model;
static kvp_tokenizer *g_tok;

static void setup(void)
{
    tu_require_shared();
    cr_assert_eq(kvp_model_load(S260_GGUF, &g_model), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &g_tok), KVP_OK, "%s", kvp_error_detail());
}

static void teardown(void)
{
    kvp_model_destroy(g_model);
    kvp_tok_destroy(g_tok);
}

static const char *const prompts[] = {
    "Once upon a time",
    "Once upon a time, there was a little dog",
    "Once upon a time, there was a little girl named Lily. She",
    "The sun was shining",
    "Tom and Sue went to the park. They saw a big",
    "One day, a cat",
    "",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her ball",
};
#define NPROMPTS ((int)(sizeof prompts / sizeof prompts[0]))

typedef struct {
    int32_t *ids;
    int32_t n;
} enc;

static enc encode(const char *text)
{
    enc e;
    cr_assert_eq(kvp_tok_encode(g_tok, text, strlen(text), 1, &e.ids, &e.n), KVP_OK);
    return e;
}

static kvp_session_request greedy_req(enc e, int32_t max_tokens)
{
    kvp_session_request r = {.prompt = e.ids, .n_prompt = e.n, .max_tokens = max_tokens, .sampler = kvp_sampler_default(),
                         .n = 1, .beam_width = 0};
    return r;
}

static void run(const kvp_session_config *cfg, const kvp_session_request *reqs, int32_t n, kvp_session_result *res,
                kvp_run_stats *st)
{
    kvp_status s = kvp_cpu_generate(g_model, cfg, reqs, n, res, st, NULL, NULL);
    cr_assert_eq(s, KVP_OK, "%s", kvp_error_detail());
}

static void expect_same(const kvp_session_result *a, const kvp_session_result *b, const char *what, int i)
{
    cr_assert_eq(a->n_samples, b->n_samples, "%s prompt %d", what, i);
    for (int s = 0; s < a->n_samples; s++) {
        cr_assert_eq(a->n_tokens[s], b->n_tokens[s], "%s prompt %d sample %d: %d vs %d tokens", what, i, s,
                     a->n_tokens[s], b->n_tokens[s]);
        for (int j = 0; j < a->n_tokens[s]; j++)
            cr_assert_eq(a->tokens[s][j], b->tokens[s][j], "%s prompt %d sample %d token %d", what, i, s, j);
    }
}

/* Every golden case together, with a KV cache of type dt: every token must match. Returns the run's stats,
 * whose kv_pool_bytes must be the pools' size at dt's element size. */
static kvp_run_stats golden_stories(kvp_dtype dt)
{
    tu_golden g;
    tu_golden_load(&g);
    kvp_session_request *reqs = g.reqs;
    int32_t(*want)[512] = g.want, *nwant = g.nwant;
    const int nc = g.n;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.kv_dtype = dt;
    kvp_session_result res[8];
    kvp_run_stats st;
    run(&cfg, reqs, nc, res, &st);
    for (int i = 0; i < nc; i++) {
        cr_assert_eq(res[i].n_samples, 1);
        cr_assert_eq(res[i].n_tokens[0], nwant[i], "case %d: %d tokens, want %d", i, res[i].n_tokens[0], nwant[i]);
        for (int j = 0; j < nwant[i]; j++)
            cr_assert_eq(res[i].tokens[0][j], want[i][j], "%s KV, case %d token %d: %d want %d",
                         kvp_dtype_name(dt), i, j, res[i].tokens[0][j], want[i][j]);
        cr_assert_geq(res[i].ttft_s, 0);
    }
    cr_assert_eq(st.generated_tokens, nwant[0] + nwant[1]);
    kvp_session_results_free(res, nc);
    const kvp_model_config *mc = kvp_model_cfg(g_model);
    cr_assert_eq(st.kv_pool_bytes, (int64_t)st.num_blocks * st.block_size * mc->num_layers * 2 * mc->num_kv_heads *
                                       mc->head_dim * (int64_t)kvp_dtype_size(dt),
                 "%s KV: %lld pool bytes", kvp_dtype_name(dt), (long long)st.kv_pool_bytes);
    return st;
}

Test(generate, golden_stories_batched, .init = setup, .fini = teardown) { golden_stories(KVP_DTYPE_F32); }

/* Rounding K and V to 16 bits moves the logits a little; on this model not enough to change a greedy token
 * of the golden cases (checked: fp8's 3-bit mantissa does change the 256-token story after ~120 tokens). */
Test(generate, golden_stories_with_f16_and_bf16_kv, .init = setup, .fini = teardown)
{
    const kvp_run_stats a = golden_stories(KVP_DTYPE_F32), b = golden_stories(KVP_DTYPE_F16);
    golden_stories(KVP_DTYPE_BF16);
    cr_assert_eq(a.num_blocks, b.num_blocks);
    cr_assert_eq(b.kv_pool_bytes * 2, a.kv_pool_bytes, "an f16 cache is half an f32 one");
}

/* An fp8 cache changes the tokens, but the same prompt must still give the same tokens alone or in a batch
 * (rounding is per element), with the prefix cache and at block size 1. */
Test(generate, fp8_kv_is_batch_invariant, .init = setup, .fini = teardown)
{
    enc e[3];
    kvp_session_request reqs[3];
    for (int i = 0; i < 3; i++) {
        e[i] = encode(prompts[i]);
        reqs[i] = greedy_req(e[i], 40);
    }
    kvp_session_config cfg = kvp_session_config_default();
    cfg.kv_dtype = KVP_DTYPE_FP8_E4M3;
    cfg.engine.cache = KVP_PC_NONE;
    kvp_session_result alone[3], all[3];
    for (int i = 0; i < 3; i++) run(&cfg, &reqs[i], 1, &alone[i], NULL);
    cfg.engine.cache = KVP_PC_RADIX;
    cfg.engine.block_size = 1;
    run(&cfg, reqs, 3, all, NULL);
    for (int i = 0; i < 3; i++) {
        expect_same(&alone[i], &all[i], "fp8 KV, block 1, radix", i);
        cr_assert_eq(alone[i].n_tokens[0] > 0, 1);
    }
    kvp_session_results_free(alone, 3);
    kvp_session_results_free(all, 3);
    for (int i = 0; i < 3; i++) kvp_free(e[i].ids);
    /* ... and the cache really is fp8: the 256-token story from BOS changes somewhere. */
    int32_t bos = 1;
    kvp_session_request story = {.prompt = &bos, .n_prompt = 1, .max_tokens = 256, .sampler = kvp_sampler_default(),
                             .n = 1};
    kvp_session_result r32, r8;
    cfg = kvp_session_config_default();
    cfg.engine.stop_at_eos = 0;
    run(&cfg, &story, 1, &r32, NULL);
    cfg.kv_dtype = KVP_DTYPE_FP8_E4M3;
    run(&cfg, &story, 1, &r8, NULL);
    cr_assert_eq(r32.n_tokens[0], 256);
    cr_assert_eq(r8.n_tokens[0], 256);
    int differ = 0;
    for (int j = 0; j < 256; j++) differ += r32.tokens[0][j] != r8.tokens[0][j];
    cr_assert_gt(differ, 0, "fp8 KV gave exactly the f32 story: is kv_dtype ignored?");
    kvp_session_results_free(&r32, 1);
    kvp_session_results_free(&r8, 1);
}

Test(generate, batch_invariance_cache_and_block_sizes, .init = setup, .fini = teardown)
{
    enc e[NPROMPTS];
    kvp_session_request reqs[2 * NPROMPTS];
    for (int i = 0; i < NPROMPTS; i++) {
        e[i] = encode(prompts[i]);
        reqs[i] = greedy_req(e[i], 20);
        reqs[i + NPROMPTS] = reqs[i]; /* each prompt twice: the second copy can hit the prefix cache */
    }
    /* Reference: each prompt alone, block 16, no cache. */
    kvp_session_result alone[NPROMPTS];
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.cache = KVP_PC_NONE;
    for (int i = 0; i < NPROMPTS; i++) run(&cfg, &reqs[i], 1, &alone[i], NULL);
    const int32_t block_sizes[3] = {1, 16, 64};
    const kvp_pc_kind caches[3] = {KVP_PC_NONE, KVP_PC_RADIX, KVP_PC_HASH};
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 3; c++) {
            cfg = kvp_session_config_default();
            cfg.engine.block_size = block_sizes[b];
            cfg.engine.cache = caches[c];
            /* A budget that forces chunked prefill and requests joining while others decode. */
            cfg.engine.max_batched_tokens = 24;
            kvp_session_result all[2 * NPROMPTS];
            kvp_run_stats st;
            run(&cfg, reqs, 2 * NPROMPTS, all, &st);
            char what[64];
            snprintf(what, sizeof what, "block %d cache %s", block_sizes[b], kvp_pc_kind_name(caches[c]));
            for (int i = 0; i < 2 * NPROMPTS; i++) expect_same(&alone[i % NPROMPTS], &all[i], what, i);
            if (caches[c] != KVP_PC_NONE && block_sizes[b] <= 16)
                cr_assert_gt(st.prefix_hit_tokens, 0, "%s: the repeated prompts should hit the cache", what);
            if (caches[c] == KVP_PC_NONE) cr_assert_eq(st.prefix_hit_tokens, 0);
            kvp_session_results_free(all, 2 * NPROMPTS);
        }
    /* Two threads: the batch is split into groups of sequences run in parallel; same tokens. */
    kvp_model_set_threads(g_model, 2);
    cfg = kvp_session_config_default();
    kvp_session_result two[2 * NPROMPTS];
    run(&cfg, reqs, 2 * NPROMPTS, two, NULL);
    kvp_model_set_threads(g_model, 1);
    for (int i = 0; i < 2 * NPROMPTS; i++) expect_same(&alone[i % NPROMPTS], &two[i], "2 threads", i);
    kvp_session_results_free(two, 2 * NPROMPTS);
    /* A KV cache too small for everyone at once: preemption (recompute) must not change any token. */
    cfg = kvp_session_config_default();
    cfg.engine.block_size = 4;
    cfg.num_blocks = 60;
    kvp_session_result small[2 * NPROMPTS];
    kvp_run_stats st;
    run(&cfg, reqs, 2 * NPROMPTS, small, &st);
    cr_assert_gt(st.preemptions, 0, "60 blocks of 4 should force preemption");
    for (int i = 0; i < 2 * NPROMPTS; i++) expect_same(&alone[i % NPROMPTS], &small[i], "preempted", i);
    kvp_session_results_free(small, 2 * NPROMPTS);
    kvp_session_results_free(alone, NPROMPTS);
    for (int i = 0; i < NPROMPTS; i++) kvp_free(e[i].ids);
}

/* Caches just large enough for the longest request, with prefix caching: admission must not count cached
 * blocks that running sequences still hold as free (evicting them frees nothing), which made block
 * allocation fail mid-step. Every size must run and give the tokens of each prompt alone. */
Test(generate, tight_caches_with_prefix_caching, .init = setup, .fini = teardown)
{
    enc e[NPROMPTS];
    kvp_session_request reqs[2 * NPROMPTS];
    int32_t longest = 0;
    for (int i = 0; i < NPROMPTS; i++) {
        e[i] = encode(prompts[i]);
        reqs[i] = greedy_req(e[i], 12);
        reqs[i + NPROMPTS] = reqs[i];
        longest = e[i].n + 12 > longest ? e[i].n + 12 : longest;
    }
    kvp_session_result alone[NPROMPTS];
    kvp_session_config cfg = kvp_session_config_default();
    for (int i = 0; i < NPROMPTS; i++) run(&cfg, &reqs[i], 1, &alone[i], NULL);
    const int32_t block_sizes[2] = {4, 16};
    const kvp_pc_kind caches[2] = {KVP_PC_RADIX, KVP_PC_HASH};
    /* host tiers: none; 64 blocks written through; 64 and 3 blocks written back (3: write-backs that would
     * take a slot the admission under way loads from are dropped); 64 blocks written through selectively */
    static const int32_t tiers[5] = {0, 64, 64, 3, 64};
    static const kvp_hc_write_policy policies[5] = {KVP_HC_WRITE_THROUGH, KVP_HC_WRITE_THROUGH, KVP_HC_WRITE_BACK,
                                                    KVP_HC_WRITE_BACK, KVP_HC_WRITE_THROUGH_SELECTIVE};
    int64_t loaded[5] = {0}; /* the blocks each tier brought back */
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < 10; c++) {
            const int32_t bs = block_sizes[b], min_blocks = (longest + bs - 1) / bs, tier = tiers[c / 2];
            for (int32_t nb = min_blocks; nb < 3 * min_blocks; nb++) {
                cfg = kvp_session_config_default();
                cfg.engine.block_size = bs;
                cfg.engine.cache = caches[c % 2];
                cfg.num_blocks = nb;
                cfg.host_cache_blocks = tier;
                cfg.engine.host_write_policy = policies[c / 2];
                kvp_session_result all[2 * NPROMPTS];
                kvp_run_stats st;
                kvp_status rs = kvp_cpu_generate(g_model, &cfg, reqs, 2 * NPROMPTS, all, &st, NULL, NULL);
                cr_assert_eq(rs, KVP_OK, "block %d, %d blocks, cache %s: %s", bs, nb, kvp_pc_kind_name(caches[c % 2]),
                             kvp_error_detail());
                char what[64];
                snprintf(what, sizeof what, "block %d, %d blocks, %s, host tier %d %s", bs, nb, kvp_pc_kind_name(caches[c % 2]),
                         tier, kvp_hc_write_policy_name(cfg.engine.host_write_policy));
                int64_t cached = 0;
                for (int i = 0; i < 2 * NPROMPTS; i++) {
                    expect_same(&alone[i % NPROMPTS], &all[i], what, i);
                    cached += all[i].prompt_cached_tokens;
                }
                /* the rate is the share of prompt tokens served at first admission, whatever the retries;
                 * a request's cached tokens count those its host tier brought back too */
                cr_assert_eq(st.prefix_hit_tokens + st.host_hit_tokens, cached, "%s", what);
                cr_assert_float_eq(st.prefix_hit_rate, (double)st.prefix_hit_tokens / (double)st.prompt_tokens, 1e-12,
                                   "%s", what);
                cr_assert(tier || st.host_loaded_blocks + st.host_stored_blocks == 0, "%s", what);
                loaded[c / 2] += st.host_loaded_blocks;
                kvp_session_results_free(all, 2 * NPROMPTS);
            }
        }
    for (int t = 1; t < 5; t++)
        cr_assert_gt(loaded[t], 0, "tier %d: the tight caches were meant to lose blocks that the host tier brings back", t);
    kvp_session_results_free(alone, NPROMPTS);
    for (int i = 0; i < NPROMPTS; i++) kvp_free(e[i].ids);
}

/* 16 copies of a 21-token prompt, 200 tokens each, in 40 blocks of 16: sequences are preempted by
 * recompute again and again. A preempted sequence caches the full blocks of all it computed, so when it comes
 * back it recomputes only what was evicted meanwhile: fewer tokens go through the model than without a
 * cache (with the old prompt-only caching, as many: the copies are admitted in the same step, before any
 * prompt block is cached), and the tokens are the same. */
Test(generate, a_preempted_sequence_finds_its_computed_blocks_cached, .init = setup, .fini = teardown)
{
    enc e = encode("Once upon a time there was a little girl named Lily who loved to play outside in the park");
    kvp_session_request reqs[16];
    for (int i = 0; i < 16; i++) reqs[i] = greedy_req(e, 200);
    kvp_session_result res[2][16];
    kvp_run_stats st[2];
    for (int c = 0; c < 2; c++) {
        kvp_session_config cfg = kvp_session_config_default();
        cfg.engine.block_size = 16;
        cfg.num_blocks = 40;
        cfg.engine.cache = c ? KVP_PC_RADIX : KVP_PC_NONE;
        cr_assert_eq(kvp_cpu_generate(g_model, &cfg, reqs, 16, res[c], &st[c], NULL, NULL), KVP_OK, "%s", kvp_error_detail());
        cr_assert_gt(st[c].preemptions, 0, "the cache must be tight enough to preempt");
    }
    cr_assert_lt(st[1].computed_tokens, st[0].computed_tokens * 3 / 4, "%lld tokens computed with the cache, %lld without",
                 (long long)st[1].computed_tokens, (long long)st[0].computed_tokens);
    for (int i = 0; i < 16; i++) expect_same(&res[0][i], &res[1][i], "radix vs none", i);
    kvp_session_results_free(res[0], 16);
    kvp_session_results_free(res[1], 16);
    kvp_free(e.ids);
}

/* Several beam searches in a cache that holds one at its peak but not all of them: beams are never
 * preempted, so admitting more than fit made the running ones fail for want of blocks. Each must give the
 * beams it gives alone. */
Test(generate, beam_searches_share_a_small_cache, .init = setup, .fini = teardown)
{
    enum { NB = 4, W = 4, T = 12, BS = 4 };
    enc e[NB];
    kvp_session_request reqs[NB];
    int32_t peak = 0;
    for (int i = 0; i < NB; i++) {
        e[i] = encode(prompts[i + 1]);
        reqs[i] = greedy_req(e[i], T);
        reqs[i].beam_width = W;
        reqs[i].n = 2;
        const int32_t full = e[i].n / BS, b = full + W * ((e[i].n + T + BS - 1) / BS - full);
        peak = b > peak ? b : peak;
    }
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = BS;
    kvp_session_result alone[NB];
    for (int i = 0; i < NB; i++) run(&cfg, &reqs[i], 1, &alone[i], NULL);
    for (int32_t nb = peak; nb <= 3 * peak; nb += 3) {
        cfg.num_blocks = nb;
        kvp_session_result all[NB];
        kvp_status rs = kvp_cpu_generate(g_model, &cfg, reqs, NB, all, NULL, NULL, NULL);
        cr_assert_eq(rs, KVP_OK, "%d blocks (one search's peak: %d): %s", nb, peak, kvp_error_detail());
        char what[32];
        snprintf(what, sizeof what, "%d blocks", nb);
        for (int i = 0; i < NB; i++) expect_same(&alone[i], &all[i], what, i);
        kvp_session_results_free(all, NB);
    }
    kvp_session_results_free(alone, NB);
    for (int i = 0; i < NB; i++) kvp_free(e[i].ids);
}

Test(generate, n4_shares_the_prompt_blocks, .init = setup, .fini = teardown)
{
    /* A 40-token prompt: blocks 0, 1 full, block 2 holds 8 tokens. */
    int32_t prompt[40];
    char text[512];
    snprintf(text, sizeof text, "%s. %s", prompts[7], prompts[4]);
    enc e = encode(text);
    cr_assert_geq(e.n, 40);
    memcpy(prompt, e.ids, sizeof prompt);
    kvp_session_request r = {.prompt = prompt, .n_prompt = 40, .max_tokens = 8, .n = 4, .beam_width = 0,
                         .sampler = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 11}};
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = 16;
    cfg.engine.cache = KVP_PC_NONE;
    cfg.engine.stop_at_eos = 0;
    kvp_session_result res;
    kvp_run_stats st;
    run(&cfg, &r, 1, &res, &st);
    cr_assert_eq(res.n_samples, 4);
    for (int s = 0; s < 4; s++) cr_assert_eq(res.n_tokens[s], 8);
    /* The prompt was computed once: 40 prefill rows + 4 samples x 7 decode rows. */
    cr_assert_eq(st.computed_tokens, 40 + 4 * 7, "computed %lld", (long long)st.computed_tokens);
    /* Row at position p attends p + 1 keys: prefill 1 + ... + 40, each sample's decode rows 41 + ... + 47. */
    cr_assert_eq(st.attended_positions, 40 * 41 / 2 + 4 * (41 + 42 + 43 + 44 + 45 + 46 + 47), "attended %lld",
                 (long long)st.attended_positions);
    /* Stored once: 2 shared full blocks + one private third block per sample (3 CoW copies, the last
     * sample writes into the original). Without sharing it would be 4 x 3 = 12 blocks. */
    cr_assert_eq(st.cow_copies, 3, "copies %lld", (long long)st.cow_copies);
    cr_assert_eq(st.peak_used_blocks, 6, "peak blocks %lld", (long long)st.peak_used_blocks);
    cr_assert_eq(st.peak_shared_savings, 3 * 32, "savings %lld", (long long)st.peak_shared_savings);
    /* Over the steps: the prefill (40 slots, nothing shared), then 7 decode steps of 4 x (40 + k) slots
     * (k = 1..7), 96 of them shared each time: 7 x 96 / (40 + 4 x 308). */
    cr_assert_float_eq(st.mean_shared_savings, 7.0 * 96 / (40 + 4 * 308), 1e-12, "mean savings %.6f",
                       st.mean_shared_savings);
    /* Samples differ (temperature 1) but are reproducible and independent of the batch. */
    int differ = 0;
    for (int s = 1; s < 4; s++) differ |= memcmp(res.tokens[0], res.tokens[s], 8 * sizeof(int32_t)) != 0;
    cr_assert(differ, "four samples at temperature 1 were identical");
    kvp_session_request both[3] = {greedy_req(encode(prompts[0]), 10), r, greedy_req(encode(prompts[3]), 5)};
    kvp_session_result res2[3];
    run(&cfg, both, 3, res2, NULL);
    expect_same(&res, &res2[1], "n=4 alone vs batched", 0);
    kvp_session_results_free(res2, 3);
    kvp_session_results_free(&res, 1);
    kvp_free(e.ids);
    kvp_free((void *)both[0].prompt);
    kvp_free((void *)both[2].prompt);
}

/* Logits of the next token after each of `n` sequences (rows), via the model directly. */
static void next_logits(const int32_t *const *seqs, const int32_t *lens, int32_t n, float *logits)
{
    int32_t bs = 16, total = 0, pages = 0;
    for (int32_t i = 0; i < n; i++) {
        total += lens[i];
        pages += (lens[i] + bs - 1) / bs;
    }
    kvp_kv_cache *kv;
    cr_assert_eq(kvp_kv_cache_create(g_model, KVP_DTYPE_F32, pages, bs, &kv), KVP_OK);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)total), *pos = malloc(sizeof(int32_t) * (size_t)total);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)total);
    int32_t *qo = malloc(sizeof(int32_t) * (size_t)(n + 1)), *kvi = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int32_t *kvx = malloc(sizeof(int32_t) * (size_t)pages), *last = malloc(sizeof(int32_t) * (size_t)n);
    int32_t t = 0, p = 0;
    for (int32_t i = 0; i < n; i++) {
        qo[i] = t;
        kvi[i] = p;
        for (int32_t j = 0; j < lens[i]; j++) {
            toks[t] = seqs[i][j];
            pos[t] = j;
            slots[t] = (int64_t)(p + j / bs) * bs + j % bs;
            t++;
        }
        int32_t np = (lens[i] + bs - 1) / bs;
        for (int32_t j = 0; j < np; j++) kvx[p + j] = p + j;
        p += np;
        last[i] = lens[i] - (np - 1) * bs;
    }
    qo[n] = t;
    kvi[n] = p;
    kvp_fwd_batch b = {.num_seqs = n, .num_tokens = t, .tokens = toks, .positions = pos, .slot_mapping = slots,
                       .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = kvx, .kv_last_page_len = last};
    cr_assert_eq(kvp_model_forward(g_model, kv, &b, logits), KVP_OK, "%s", kvp_error_detail());
    free(toks), free(pos), free(slots), free(qo), free(kvi), free(kvx), free(last);
    kvp_kv_cache_destroy(kv);
}

/* log-probabilities of the next token after each of `n` sequences (rows), via the model directly. */
static void next_logprobs(const int32_t *const *seqs, const int32_t *lens, int32_t n, float *out)
{
    float *logits = malloc(sizeof(float) * (size_t)n * 512);
    next_logits(seqs, lens, n, logits);
    for (int32_t i = 0; i < n; i++) kvp_log_softmax(logits + (int64_t)i * 512, 512, out + (int64_t)i * 512);
    free(logits);
}

/* Exhaustive search over all 512 x 512 two-token continuations, made exact and cheap by branch and bound:
 * score(t1, t2) = lp1[t1] + lp2[t1][t2] <= lp1[t1], so first tokens are visited by decreasing lp1 and the
 * search stops once lp1[t1] cannot beat the best pair found. */
static double exhaustive2(const enc *e, int *b1, int *b2)
{
    float lp1[512];
    const int32_t *one[1] = {e->ids};
    next_logprobs(one, &e->n, 1, lp1);
    int order[512];
    for (int i = 0; i < 512; i++) order[i] = i;
    for (int i = 0; i < 512; i++)
        for (int j = i + 1; j < 512; j++)
            if (lp1[order[j]] > lp1[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    double best = -INFINITY;
    int32_t *ext = malloc(sizeof(int32_t) * (size_t)(e->n + 1));
    memcpy(ext, e->ids, sizeof(int32_t) * (size_t)e->n);
    int visited = 0;
    for (int i = 0; i < 512 && lp1[order[i]] > best; i++, visited++) {
        int t1 = order[i];
        ext[e->n] = t1;
        float lp2[512];
        const int32_t *seq[1] = {ext};
        int32_t len = e->n + 1;
        next_logprobs(seq, &len, 1, lp2);
        for (int t2 = 0; t2 < 512; t2++) {
            double s = (double)lp1[t1] + lp2[t2];
            if (s > best) best = s, *b1 = t1, *b2 = t2;
        }
    }
    cr_assert_lt(visited, 512, "branch and bound never pruned: the bound is wrong");
    free(ext);
    return best;
}

/* A sample's logprob is the sum of its tokens' log-probabilities under the model, greedy included (it
 * was 0 for greedy samples), checked against the model run directly on each prefix. */
Test(generate, greedy_logprob_is_the_tokens_log_probability, .init = setup, .fini = teardown)
{
    enum { T = 6 };
    enc e = encode("Once upon a time");
    kvp_session_request r = greedy_req(e, T);
    r.n = 2; /* forked greedy samples: both the same tokens and log-probability */
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result res;
    run(&cfg, &r, 1, &res, NULL);
    cr_assert_eq(res.n_samples, 2);
    cr_assert_eq(res.n_tokens[0], T);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(e.n + T));
    memcpy(seq, e.ids, sizeof(int32_t) * (size_t)e.n);
    double want = 0;
    for (int t = 0; t < T; t++) {
        float lp[512];
        const int32_t *one[1] = {seq};
        int32_t len = e.n + t;
        next_logprobs(one, &len, 1, lp);
        want += lp[res.tokens[0][t]];
        seq[e.n + t] = res.tokens[0][t];
    }
    cr_assert_lt(want, 0);
    for (int s = 0; s < 2; s++) cr_assert_float_eq(res.logprob[s], want, 1e-4, "sample %d: %g, want %g", s, res.logprob[s], want);
    kvp_session_results_free(&res, 1);
    free(seq);
    kvp_free(e.ids);
}

/* skip_logprob (serve's, generate's without --json): the same tokens, greedy, sampled at temperature 1 and
 * penalized (the three ways a token is drawn), with every sample's logprob 0 instead of a sum below 0. */
Test(generate, skip_logprob_draws_the_same_tokens, .init = setup, .fini = teardown)
{
    enc e = encode("Once upon a time");
    kvp_session_request r[3] = {greedy_req(e, 12), greedy_req(e, 12), greedy_req(e, 12)};
    r[1].sampler = (kvp_sampler_params){.temperature = 1.0, .top_p = 1.0, .seed = 5};
    r[2].sampler = (kvp_sampler_params){.temperature = 0.7, .top_k = 20, .top_p = 0.9, .seed = 6,
                                        .presence_penalty = 0.5f, .repetition_penalty = 1.2f};
    for (int i = 0; i < 3; i++) r[i].n = 2;
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result with[3], without[3];
    run(&cfg, r, 3, with, NULL);
    cfg.engine.skip_logprob = 1;
    run(&cfg, r, 3, without, NULL);
    for (int i = 0; i < 3; i++) {
        expect_same(&with[i], &without[i], "skip_logprob", i);
        for (int k = 0; k < 2; k++) {
            cr_assert_lt(with[i].logprob[k], 0, "request %d sample %d", i, k);
            cr_assert_eq(without[i].logprob[k], 0, "request %d sample %d", i, k);
        }
    }
    kvp_session_results_free(with, 3);
    kvp_session_results_free(without, 3);
    kvp_free(e.ids);
}

Test(generate, beam_search_matches_exhaustive_search, .init = setup, .fini = teardown)
{
    const char *texts[2] = {"Once upon a time", "The dog was"};
    for (int k = 0; k < 2; k++) {
        enc e = encode(texts[k]);
        int b1 = -1, b2 = -1;
        double best = exhaustive2(&e, &b1, &b2);
        kvp_session_request r = {.prompt = e.ids, .n_prompt = e.n, .max_tokens = 2, .n = 2, .beam_width = 4,
                             .sampler = kvp_sampler_default()};
        kvp_session_config cfg = kvp_session_config_default();
        cfg.engine.block_size = 4;
        kvp_session_result res;
        kvp_run_stats st;
        run(&cfg, &r, 1, &res, &st);
        cr_assert_eq(res.n_samples, 2);
        cr_assert_eq(res.n_tokens[0], 2);
        cr_assert_eq(res.tokens[0][0], b1, "'%s': beam %d %d, exhaustive %d %d", texts[k], res.tokens[0][0],
                     res.tokens[0][1], b1, b2);
        cr_assert_eq(res.tokens[0][1], b2);
        cr_assert_float_eq(res.logprob[0], best, 1e-4);
        cr_assert_geq(res.logprob[0], res.logprob[1]);
        cr_assert_eq(st.computed_tokens, e.n + 4, "beams must not recompute the prompt");
        cr_assert_eq(st.generated_tokens, 2 * 2, "the 2 beams returned, not the 4 searched");
        kvp_session_results_free(&res, 1);
        /* A beam wider than the vocabulary keeps every first token, so its best pair is the exhaustive
         * best whatever the bound (512 beams compute their first token, out of 512 x 512 candidates). */
        r.beam_width = 600;
        r.n = 3;
        cfg.engine.max_num_seqs = 600; /* max_num_seqs bounds the beams too */
        run(&cfg, &r, 1, &res, &st);
        cr_assert_eq(res.n_samples, 3);
        cr_assert(res.tokens[0][0] == b1 && res.tokens[0][1] == b2, "'%s': wide beam %d %d, exhaustive %d %d",
                  texts[k], res.tokens[0][0], res.tokens[0][1], b1, b2);
        cr_assert_float_eq(res.logprob[0], best, 1e-4);
        for (int s = 1; s < 3; s++) cr_assert_geq(res.logprob[s - 1], res.logprob[s]);
        cr_assert_eq(st.computed_tokens, e.n + 512);
        kvp_session_results_free(&res, 1);
        r.beam_width = 4;
        /* A longer beam run: results sorted by score, W beams forked from one prefill. */
        r.max_tokens = 12;
        r.n = 4;
        run(&cfg, &r, 1, &res, &st);
        cr_assert_eq(res.n_samples, 4);
        for (int s = 1; s < 4; s++) cr_assert_geq(res.logprob[s - 1], res.logprob[s]);
        cr_assert_eq(st.computed_tokens, e.n + 4 * 11);
        kvp_session_results_free(&res, 1);
        kvp_free(e.ids);
    }
}

Test(generate, rejects_bad_requests, .init = setup, .fini = teardown)
{
    int32_t *big = malloc(sizeof(int32_t) * 3000);
    for (int i = 0; i < 3000; i++) big[i] = 300;
    kvp_session_request r = greedy_req((enc){big, 3000}, 5);
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result res;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "context"), "%s", kvp_error_message());
    r.n_prompt = 100;
    cfg.num_blocks = 3;
    cfg.engine.block_size = 16;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_ENOBLOCKS);
    cr_assert(strstr(kvp_error_message(), "num-blocks"), "%s", kvp_error_message());
    cfg = kvp_session_config_default();
    r.sampler.top_p = 2;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    r.sampler = kvp_sampler_default();
    big[5] = 512;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    free(big);
}

/* ---- the `kvpage generate` command (KVPAGE_BIN is set by CTest) ---- */

Test(generate_cli, golden_story_from_gguf_and_hf_folder)
{
    tu_require_shared();
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 0);
    const cJSON *want = cJSON_GetObjectItem(c0, "tokens_after_bos");
    const char *models[2] = {S260_GGUF, S260_HF};
    for (int k = 0; k < 2; k++) {
        char cmd[1024], *out, *err;
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --max-tokens %d --ignore-eos --json",
                 kvp_test_bin(), models[k], cJSON_GetArraySize(want));
        int rc = kvp_test_sh(cmd, &out, &err);
        cr_assert_eq(rc, 0, "%s: rc %d: %s", models[k], rc, err);
        cJSON *j;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "%s", out);
        const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0);
        const cJSON *toks = cJSON_GetObjectItem(r0, "tokens");
        cr_assert_eq(cJSON_GetArraySize(toks), cJSON_GetArraySize(want));
        for (int i = 0; i < cJSON_GetArraySize(want); i++)
            cr_assert_eq(cJSON_GetArrayItem(toks, i)->valueint, cJSON_GetArrayItem(want, i)->valueint,
                         "%s token %d", models[k], i);
        cr_assert_str_eq(cJSON_GetObjectItem(r0, "text")->valuestring, cJSON_GetObjectItem(c0, "text")->valuestring);
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(r0, "prompt_tokens")), 1);
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(r0, "ttft_s")) && cJSON_IsNumber(cJSON_GetObjectItem(r0, "tpot_s")));
        const cJSON *tot = cJSON_GetObjectItem(j, "totals");
        cr_assert(cJSON_GetObjectItem(tot, "tokens_per_s")->valuedouble > 0);
        cr_assert_not_null(cJSON_GetObjectItem(tot, "prefix_hit_rate"));
        cr_assert_eq(cJSON_GetObjectItem(tot, "kv_token_states")->valueint, 256);
        cr_assert_eq(cJSON_GetObjectItem(tot, "kv_shared_savings_mean")->valuedouble, 0.0, "one sequence shares nothing");
        cr_assert_str_eq(cJSON_GetObjectItem(tot, "kv_dtype")->valuestring, "f32");
        /* the default --weight-dtype auto keeps both f32 files in f32 */
        cr_assert_str_eq(cJSON_GetObjectItem(tot, "weight_dtype")->valuestring, "f32");
        cr_assert_gt(cJSON_GetObjectItem(tot, "kv_pool_bytes")->valuedouble, 0);
        cJSON_Delete(j);
        free(out);
        free(err);
    }
    cJSON_Delete(gold);
}

static const cJSON *golden_case(cJSON **gold, int i)
{
    tu_require_shared();
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, gold), KVP_OK);
    return cJSON_GetArrayItem(cJSON_GetObjectItem(*gold, "cases"), i);
}

/* Runs `cmd` (a `generate --json` command line), which must exit 0; its parsed output (cJSON_Delete). */
static cJSON *run_json(const char *cmd)
{
    char *out, *err;
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 0, "rc %d: %s: %s", rc, cmd, err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "%s", out);
    free(out);
    free(err);
    return j;
}

/* The generated tokens of request i of a `generate --json` output. */
static const cJSON *tokens_of(const cJSON *j, int i)
{
    return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), i), "tokens");
}

/* Runs `cmd` as run_json does and checks its first request's generated tokens are exactly want[from .. from +
 * n). Returns the parsed output (cJSON_Delete). */
static cJSON *expect_generated(const char *cmd, const cJSON *want, int from, int n)
{
    cJSON *j = run_json(cmd);
    const cJSON *toks = tokens_of(j, 0);
    cr_assert_eq(cJSON_GetArraySize(toks), n, "%d tokens, want %d: %s", cJSON_GetArraySize(toks), n, cmd);
    for (int i = 0; i < n; i++)
        cr_assert_eq(cJSON_GetArrayItem(toks, i)->valueint, cJSON_GetArrayItem(want, from + i)->valueint, "token %d", i);
    return j;
}

/* A Hugging Face folder as downloaded carries tokenizer.json, not a llama2.c tokenizer: stories260K's
 * weights beside the Llama-2-style tokenizer.json of its vocabulary (tests/data/tokenizers/spm, made as
 * transformers' converter makes one) encode golden case 1's prompt to its published ids and continue it
 * with the published story. (The folder has no other tokenizer, nor a ../llama2c beside it.) */
Test(generate_cli, hf_folder_with_tokenizer_json)
{
    cJSON *gold;
    const cJSON *c1 = golden_case(&gold, 1);
    const char *dir = tu_tmpdir();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "ln -s \"$PWD/%s/config.json\" \"$PWD/%s/model.safetensors\" %s/ && "
                              "cp tests/data/tokenizers/spm/tokenizer.json %s/",
             S260_HF, S260_HF, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    const cJSON *want = cJSON_GetObjectItem(c1, "tokens_after_bos"), *pt = cJSON_GetObjectItem(c1, "prompt_tokens");
    const int np = cJSON_GetArraySize(pt);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '%s' --max-tokens %d --ignore-eos --json", kvp_test_bin(),
             dir, cJSON_GetObjectItem(c1, "prompt")->valuestring, cJSON_GetArraySize(want) - (np - 1));
    cJSON *j = expect_generated(cmd, want, np - 1, cJSON_GetArraySize(want) - (np - 1));
    const cJSON *got_pt = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0), "prompt_tokens");
    cr_assert_eq(cJSON_GetArraySize(got_pt), np);
    for (int i = 0; i < np; i++)
        cr_assert_eq(cJSON_GetArrayItem(got_pt, i)->valueint, cJSON_GetArrayItem(pt, i)->valueint, "prompt token %d", i);
    cJSON_Delete(j);
    cJSON_Delete(gold);
}

/* --weight-dtype f16 (the matrices held in 16 bits) still reproduces the published 256-token story on
 * stories260K (bf16, with 8 bits of mantissa, leaves it after ~185 tokens); q8_0 its first 100 tokens; fp8
 * weights are refused. */
Test(generate_cli, f16_weights_keep_the_golden_story)
{
    cJSON *gold;
    const cJSON *c0 = golden_case(&gold, 0);
    const cJSON *want = cJSON_GetObjectItem(c0, "tokens_after_bos");
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --max-tokens %d --ignore-eos --weight-dtype f16 --json",
             kvp_test_bin(), S260_GGUF, cJSON_GetArraySize(want));
    cJSON *j = expect_generated(cmd, want, 0, cJSON_GetArraySize(want));
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "totals"), "weight_dtype")->valuestring, "f16");
    cJSON_Delete(j);
    /* q8_0 weights (quantized at load) follow the story for its first 100 tokens (114 measured) */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --max-tokens 100 --ignore-eos --weight-dtype q8_0 --json",
             kvp_test_bin(), S260_GGUF);
    j = expect_generated(cmd, want, 0, 100);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "totals"), "weight_dtype")->valuestring, "q8_0");
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --weight-dtype fp8", kvp_test_bin(), S260_GGUF);
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "fp8") && strstr(err, "auto"), "%s", err);
    free(out);
    free(err);
    cJSON_Delete(gold);
}

/* --kv-dtype auto (the default) is the model's dtype, as vLLM's: f32 for stories260K's f32 weights, bf16 and
 * f16 for weights held so, f16 for q8_0; each run gives the tokens of the same type asked for by name and
 * reports it, and the cache of a 16-bit type is half the f32 one. */
Test(generate_cli, kv_dtype_auto_follows_the_weights)
{
    static const struct {
        const char *weights, *kv;
    } cases[] = {{"f32", "f32"}, {"bf16", "bf16"}, {"f16", "f16"}, {"q8_0", "f16"}};
    double f32_bytes = 0;
    for (int i = 0; i < 4; i++) {
        cJSON *j[2];
        for (int named = 0; named < 2; named++) {
            char cmd[1024], *out, *err;
            snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Lily had a' --max-tokens 40 --weight-dtype %s%s%s "
                     "--json", kvp_test_bin(), S260_GGUF, cases[i].weights, named ? " --kv-dtype " : "", named ? cases[i].kv : "");
            int rc = kvp_test_sh(cmd, &out, &err);
            cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
            cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j[named]), KVP_OK, "%s", out);
            const cJSON *tot = cJSON_GetObjectItem(j[named], "totals");
            cr_assert_str_eq(cJSON_GetObjectItem(tot, "kv_dtype")->valuestring, cases[i].kv, "%s", cmd);
            const double bytes = cJSON_GetObjectItem(tot, "kv_pool_bytes")->valuedouble;
            if (i == 0) f32_bytes = bytes;
            else cr_assert_eq(bytes * 2, f32_bytes, "%s: a 16-bit cache is half the f32 one", cmd);
            free(out);
            free(err);
        }
        const cJSON *a = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j[0], "requests"), 0), "tokens");
        const cJSON *b = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j[1], "requests"), 0), "tokens");
        cr_assert_eq(cJSON_GetArraySize(a), 40);
        cr_assert_eq(cJSON_GetArraySize(b), 40);
        for (int t = 0; t < 40; t++)
            cr_assert_eq(cJSON_GetArrayItem(a, t)->valueint, cJSON_GetArrayItem(b, t)->valueint, "%s weights, token %d",
                         cases[i].weights, t);
        cJSON_Delete(j[0]);
        cJSON_Delete(j[1]);
    }
}

/* --chat-template with --system: each prompt goes through the template as a user message after the system
 * message (the prompt tokens are kvp_chat_render_ids's, which the chat tests check against the models' own
 * templates); --chat on a model without a template, and --system without --chat, are refused. */
Test(generate_cli, chat_prompts_through_the_template)
{
    tu_require_shared();
    kvp_tokenizer *tok;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &tok), KVP_OK, "%s", kvp_error_detail());
    const kvp_chat_msg m[2] = {{"system", "Be brief."}, {"user", "Tell me a story."}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_ZEPHYR, tok, m, 2, 1, &ids, &n), KVP_OK);
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --chat-template zephyr --system 'Be brief.' --prompt "
                              "'Tell me a story.' --max-tokens 4 --json",
             kvp_test_bin(), S260_GGUF);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "%s", out);
    const cJSON *pt = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0), "prompt_tokens");
    cr_assert_eq(cJSON_GetArraySize(pt), n);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(cJSON_GetArrayItem(pt, i)->valueint, ids[i], "prompt token %d", i);
    cJSON_Delete(j);
    free(out);
    free(err);
    kvp_free(ids);
    kvp_tok_destroy(tok);
    const char *bad[2][2] = {{"--chat --prompt hi", "--chat-template"}, {"--system x --prompt hi", "--system needs --chat"}};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s generate --model %s %s", kvp_test_bin(), S260_GGUF, bad[i][0]);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
        cr_assert(strstr(err, bad[i][1]), "%s", err);
        free(out);
        free(err);
    }
}

/* generation_config.json's eos_token_id list ends generation too (as transformers and vLLM read it): with a
 * token of the golden story listed there, the greedy story stops right before that token's first place. */
Test(generate_cli, generation_config_eos_ids_end_the_story)
{
    cJSON *gold;
    const cJSON *c0 = golden_case(&gold, 0);
    const cJSON *want = cJSON_GetObjectItem(c0, "tokens_after_bos");
    int at = 8; /* the first place from 8 on whose token has not come before */
    for (;; at++) {
        int seen = 0;
        for (int i = 0; i < at; i++) seen |= cJSON_GetArrayItem(want, i)->valueint == cJSON_GetArrayItem(want, at)->valueint;
        if (!seen) break;
    }
    const char *dir = tu_tmpdir();
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd, "ln -s \"$PWD/%s/config.json\" \"$PWD/%s/model.safetensors\" %s/ && "
                              "printf '{\"eos_token_id\": [2, %d]}' > %s/generation_config.json",
             S260_HF, S260_HF, dir, cJSON_GetArrayItem(want, at)->valueint, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokenizer %s --prompt '' --max-tokens 100 --json", kvp_test_bin(),
             dir, S260_TOKBIN);
    cJSON_Delete(expect_generated(cmd, want, 0, at)); /* it stops before place `at` */
    /* an id outside the vocabulary there is named */
    snprintf(cmd, sizeof cmd, "printf '{\"eos_token_id\": [2, 512]}' > %s/generation_config.json && %s generate --model %s "
                              "--tokenizer %s --prompt ''",
             dir, kvp_test_bin(), dir, S260_TOKBIN);
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "eos_token_id") && strstr(err, "512"), "%s", err);
    free(out);
    free(err);
    cJSON_Delete(gold);
}

/* A small token budget admits the second prompt after the first one's prefill: it hits the cache. */
Test(generate_cli, prompts_file_batches_and_hits_the_cache)
{
    tu_require_shared();
    char path[300];
    snprintf(path, sizeof path, "%s/prompts.txt", tu_tmpdir());
    const char *text = "Once upon a time, there was a little girl named Lily. She\n"
                       "Once upon a time, there was a little girl named Lily. He\n"
                       "The sun was shining\n";
    tu_write_all(path, text, strlen(text));
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s --max-tokens 12 --block-size 4 --max-batched-tokens 16 --json",
             kvp_test_bin(), S260_GGUF, path);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK);
    const cJSON *reqs = cJSON_GetObjectItem(j, "requests");
    cr_assert_eq(cJSON_GetArraySize(reqs), 3);
    cr_assert_gt(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "totals"), "prefix_hit_rate")->valuedouble, 0.0);
    /* Each prompt alone gives the same tokens. */
    const char *lines[3] = {"Once upon a time, there was a little girl named Lily. She",
                            "Once upon a time, there was a little girl named Lily. He", "The sun was shining"};
    for (int i = 0; i < 3; i++) {
        char c1[1024], *o1, *e1;
        snprintf(c1, sizeof c1, "%s generate --model %s --prompt '%s' --max-tokens 12 --cache none --json", kvp_test_bin(),
                 S260_GGUF, lines[i]);
        cr_assert_eq(kvp_test_sh(c1, &o1, &e1), 0, "%s", e1);
        cJSON *j1;
        cr_assert_eq(kvp_json_parse(o1, strlen(o1), "generate output", &j1), KVP_OK);
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(reqs, i), "tokens"));
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j1, "requests"), 0), "tokens"));
        cr_assert_str_eq(a, b, "prompt %d", i);
        free(a);
        free(b);
        cJSON_Delete(j1);
        free(o1);
        free(e1);
    }
    /* The same file on standard input (--prompts-file -): the same tokens. */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file - --max-tokens 12 --block-size 4 --max-batched-tokens 16 "
             "--json < %s", kvp_test_bin(), S260_GGUF, path);
    char *out2, *err2;
    cr_assert_eq(kvp_test_sh(cmd, &out2, &err2), 0, "%s", err2);
    cJSON *j2;
    cr_assert_eq(kvp_json_parse(out2, strlen(out2), "generate output", &j2), KVP_OK);
    for (int i = 0; i < 3; i++) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(reqs, i), "tokens"));
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j2, "requests"), i), "tokens"));
        cr_assert_str_eq(a, b, "prompt %d from stdin", i);
        free(a);
        free(b);
    }
    cJSON_Delete(j2);
    free(out2);
    free(err2);
    cJSON_Delete(j);
    free(out);
    free(err);
    /* Two long prompts taking turns (one at a time) in a KV cache that holds one: each return loads its prompt
     * from a host tier, and the tokens stay those computed without any cache. */
    const char *a = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.",
               *b = "Tom had a small dog named Max. Max liked to run and jump in the garden every morning.";
    char turns[1024];
    snprintf(turns, sizeof turns, "%s\n%s\n%s Lily\n%s Tom\n", a, b, a, b);
    tu_write_all(path, turns, strlen(turns));
    char *tok[3] = {NULL, NULL, NULL};
    static const char *const tier_args[3] = {"--cache none", "--num-blocks 5 --max-num-seqs 1 --kv-offloading-size 1MiB",
                                             "--num-blocks 5 --max-num-seqs 1 --kv-offloading-size 1MiB --kv-offloading-policy write_back"};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s --max-tokens 24 --json %s", kvp_test_bin(),
                 S260_GGUF, path, tier_args[k]);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
        cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK);
        cJSON *all = cJSON_CreateArray(), *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "requests"))
            cJSON_AddItemToArray(all, cJSON_Duplicate(cJSON_GetObjectItem(r, "tokens"), 1));
        tok[k] = cJSON_PrintUnformatted(all);
        cJSON_Delete(all);
        if (k) {
            const cJSON *t = cJSON_GetObjectItem(j, "totals");
            cr_assert_gt(cJSON_GetObjectItem(t, "host_loaded_blocks")->valuedouble, 0, "%s", out);
            cr_assert_gt(cJSON_GetObjectItem(t, "host_hit_tokens")->valuedouble, 0, "%s", out);
        }
        cJSON_Delete(j);
        free(out);
        free(err);
    }
    cr_assert_str_eq(tok[0], tok[1]);
    cr_assert_str_eq(tok[0], tok[2], "written back");
    for (int k = 0; k < 3; k++) free(tok[k]);
    /* Raw bytes in a prompt stay valid UTF-8 in the JSON (U+FFFD each); a NUL byte is refused. */
    tu_write_all(path, "x\xff\xfey\nok \xc3\xa9\n", 11);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s --max-tokens 2 --json", kvp_test_bin(), S260_GGUF, path);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "\"x\xef\xbf\xbd\xef\xbf\xbdy\"") && strstr(out, "\"ok \xc3\xa9\""), "%s", out);
    cr_assert_null(strchr(out, 0xff));
    free(out);
    free(err);
    tu_write_all(path, "abc\ndef\0ghi\n", 12);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s", kvp_test_bin(), S260_GGUF, path);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "prompts.txt:2: a NUL byte"), "%s", err);
    free(out);
    free(err);
    /* Plain text output: prompt + continuation. */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Once upon a time' --max-tokens 8", kvp_test_bin(), S260_GGUF);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
    cr_assert_str_eq(out, "Once upon a time, there was a little girl\n");
    free(out);
    free(err);
}

/* A .jsonl prompts file: one {"prompt", "max_tokens"} object a line, blank lines skipped, max_tokens per prompt
 * (default --max-tokens, 0 allowed); the tokens are those of the same prompts given with --prompt. A line that is
 * not such an object is an error naming the file and line (exit 2). */
Test(generate_cli, jsonl_prompts_file_takes_max_tokens_per_prompt)
{
    tu_require_shared();
    const char *dir = tu_tmpdir();
    char path[512], cmd[1024], *out, *err;
    snprintf(path, sizeof path, "%s/prompts.jsonl", dir);
    const char *good = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 3}\n\n{\"prompt\": \"The sun\"}\r\n"
                       "{\"max_tokens\": 0, \"prompt\": \"Lily\"}\n";
    tu_write_all(path, good, strlen(good));
    /* alone, then after a --prompt (which keeps --max-tokens): the tokens each request generated */
    static const char *const texts[3] = {"Once upon a time", "The sun", "Lily"};
    static const int alone[3] = {3, 7, 0}, mixed[4] = {5, 3, 5, 0};
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s --max-tokens 7 --json", kvp_test_bin(), S260_GGUF, path);
    cJSON *j = run_json(cmd);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "requests")), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), i), "prompt")->valuestring,
                         texts[i]);
        cr_assert_eq(cJSON_GetArraySize(tokens_of(j, i)), alone[i], "prompt %d", i);
    }
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Once upon a time' --max-tokens 3 --json", kvp_test_bin(),
             S260_GGUF);
    cJSON *a = run_json(cmd);
    char *t0 = cJSON_PrintUnformatted(tokens_of(j, 0)), *t1 = cJSON_PrintUnformatted(tokens_of(a, 0));
    cr_assert_str_eq(t0, t1, "the same tokens as from --prompt");
    cJSON_free(t0);
    cJSON_free(t1);
    cJSON_Delete(a);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Once --prompts-file %s --max-tokens 5 --json",
             kvp_test_bin(), S260_GGUF, path);
    j = run_json(cmd);
    for (int i = 0; i < 4; i++) cr_assert_eq(cJSON_GetArraySize(tokens_of(j, i)), mixed[i], "prompt %d", i);
    cJSON_Delete(j);
    /* a file of blank lines adds nothing after a --prompt, and alone is an error */
    tu_write_all(path, "\n\n", 2);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt Once --prompts-file %s --max-tokens 2 --json",
             kvp_test_bin(), S260_GGUF, path);
    j = run_json(cmd);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "requests")), 1);
    cr_assert_eq(cJSON_GetArraySize(tokens_of(j, 0)), 2);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s", kvp_test_bin(), S260_GGUF, path);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "prompts.jsonl: no prompt in it"), "%s", err);
    free(out);
    free(err);
    static const struct {
        const char *line, *needle;
    } bad[] = {
        {"{\"prompt\": 1}", "prompts.jsonl:2: \"prompt\" must be a string"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1.5}", "prompts.jsonl:2: \"max_tokens\" must be an integer"},
        {"{\"prompt\": \"a\", \"max_tokens\": -1}", "prompts.jsonl:2: max_tokens -1 is out of"},
        {"{\"prompt\": \"a\", \"temperature\": 1}", "prompts.jsonl:2: unknown key 'temperature'"},
        {"{\"max_tokens\": 3}", "prompts.jsonl:2: no \"prompt\""},
        {"[\"a\"]", "prompts.jsonl:2: a line is a JSON object"},
        {"{\"prompt\": \"a\",", "prompts.jsonl:2: malformed JSON"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1}", "prompt 2: max_tokens 1 is below --min-tokens 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"prompt\": \"ok\"}\n%s\n", bad[i].line);
        tu_write_all(path, text, strlen(text));
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts-file %s --min-tokens 2", kvp_test_bin(), S260_GGUF, path);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s: %s", bad[i].line, err);
        cr_assert(strstr(err, bad[i].needle) != NULL, "%s: stderr '%s' lacks '%s'", bad[i].line, err, bad[i].needle);
        cr_assert_eq(out[0], '\0', "nothing on stdout");
        free(out);
        free(err);
    }
}

Test(generate_cli, bad_input_exits_2_with_a_clear_error)
{
    tu_require_shared();
    const char *dir = tu_tmpdir();
    size_t len;
    unsigned char *g = tu_read_all(S260_GGUF, &len);
    char trunc[400], arch[400], longp[400];
    snprintf(trunc, sizeof trunc, "%s/truncated.gguf", dir);
    tu_write_all(trunc, g, len / 2);
    /* general.architecture = "llama" -> "falcn" */
    unsigned char *at = memmem(g, S260_GGUF_DATA_START, "general.architecture", 20);
    cr_assert_not_null(at);
    cr_assert(memcmp(at + 20 + 4 + 8, "llama", 5) == 0);
    memcpy(at + 20 + 4 + 8, "falcn", 5);
    snprintf(arch, sizeof arch, "%s/arch.gguf", dir);
    tu_write_all(arch, g, len);
    free(g);
    /* A prompt longer than the HF model's 512-token context. */
    snprintf(longp, sizeof longp, "%s/long.txt", dir);
    FILE *f = fopen(longp, "w");
    for (int i = 0; i < 200; i++) fputs("Lily and Tom ", f);
    fputc('\n', f);
    fclose(f);
    struct {
        char args[600];
        const char *needle;
    } cases[3];
    snprintf(cases[0].args, sizeof cases[0].args, "--model %s --prompt hi", trunc);
    cases[0].needle = "truncated.gguf";
    snprintf(cases[1].args, sizeof cases[1].args, "--model %s --prompt hi", arch);
    cases[1].needle = "falcn";
    snprintf(cases[2].args, sizeof cases[2].args, "--model %s --prompts-file %s", S260_HF, longp);
    cases[2].needle = "context";
    for (int i = 0; i < 3; i++) {
        char cmd[8192], *out, *err;
        snprintf(cmd, sizeof cmd, "%s generate %s", kvp_test_bin(), cases[i].args);
        int rc = kvp_test_sh(cmd, &out, &err);
        cr_assert_eq(rc, 2, "case %d: exit %d, stderr: %s", i, rc, err);
        cr_assert(strstr(err, cases[i].needle), "case %d: stderr lacks '%s': %s", i, cases[i].needle, err);
        cr_assert(strstr(err, "kvpage generate: error:"), "case %d: %s", i, err);
        cr_assert_str_eq(out, "");
        free(out);
        free(err);
    }
    static const kvp_cli_case options[] = {
        {"--top-p 3", "--top-p"},
        {"--bogus", "--bogus"},
        {"--kv-dtype f17", "--kv-dtype: unknown KV cache dtype 'f17' (use auto"},
        /* 1.9 TiB of KV cache: refused before anything is allocated (it used to run into the OOM killer) */
        {"--num-blocks 100000000", "more than this machine's"},
        {"--matmul fast", "error: --matmul: unknown matmul 'fast'"},
        {"--sched priority", "'priority' needs each request's priority"},
        {"--beam-width 2 --temperature 0.5", "do not apply to --beam-width"},
        {"--logprobs 2", "--logprobs needs --json"},
        {"--json --prompt-logprobs", "--prompt-logprobs needs --logprobs"},
        {"--json --logprobs 21", "--logprobs: 21 is out of range"},
        {"--json --logprobs 1 --beam-width 2", "--logprobs does not apply to --beam-width"},
        {"--stop x --beam-width 2", "--stop does not apply to --beam-width"},
        {"--stop ''", "1 to 256 bytes"},
        {"--kv-offloading-size 100", "--kv-offloading-size of 100 bytes holds no block of 16 tokens"},
        {"--kv-offloading-size 1MiB --cache none", "needs a prefix cache"},
        {"--kv-offloading-size 7X", "--kv-offloading-size: "},
        {"--kv-offloading-size 1MiB --kv-offloading-policy sometimes", "'sometimes'"},
        {"--kv-offloading-policy write_back", "needs a host tier"},
        {"--max-model-len 4096", "max_model_len 4096 exceeds the context of " S260_GGUF " (2048 tokens)"},
        {"--max-model-len 1", "--max-model-len: 1 is out of range"},
    };
    kvp_test_cli_rejects("generate --model " S260_GGUF " --prompt hi", options, sizeof options / sizeof options[0]);
    char cmd[512], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --help", kvp_test_bin());
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0);
    cr_assert(strstr(out, "--beam-width") && strstr(out, "--prompts-file"));
    free(out);
    free(err);
}

/* --max-model-len caps prompt + generated tokens as vLLM's does: the golden story stops at the cap, and a
 * prompt that fits the model but not the cap is refused. */
Test(generate_cli, max_model_len_caps_the_context)
{
    cJSON *gold;
    const cJSON *c = golden_case(&gold, 0); /* the published story, from BOS alone */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --max-tokens 200 --max-model-len 40 --json",
             kvp_test_bin(), S260_GGUF);
    cJSON *j = expect_generated(cmd, cJSON_GetObjectItem(c, "tokens_after_bos"), 0, 39);
    cJSON_Delete(j);
    cJSON_Delete(gold);
    char *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt \"$(printf 'Lily %%.0s' $(seq 60))\" --max-model-len 50",
             kvp_test_bin(), S260_GGUF);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "the model's context is 50 tokens"), "%s", err);
    free(out);
    free(err);
}

Test(generate, sampled_batch_same_on_1_2_3_threads, .init = setup, .fini = teardown)
{
    /* Temperature-1 draws of a batch big enough for the threaded sampling pass (>= 16 plain samples), one
     * request forking (n = 2), a third of them with penalties and a logit bias: the tokens and
     * log-probabilities do not depend on the thread count. */
    enum { NR = 24 };
    enc e[NPROMPTS];
    kvp_session_request reqs[NR];
    for (int i = 0; i < NPROMPTS; i++) e[i] = encode(prompts[i]);
    for (int i = 0; i < NR; i++)
        reqs[i] = (kvp_session_request){.prompt = e[i % NPROMPTS].ids, .n_prompt = e[i % NPROMPTS].n, .max_tokens = 12,
                                    .n = i == 5 ? 2 : 1, .beam_width = 0,
                                    .sampler = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 500 + (uint64_t)i}};
    const int32_t bias_id = 300;
    const float bias = 2.0f;
    for (int i = 0; i < NR; i += 3) { /* every third with penalties and a logit bias: each thread's own scratch */
        reqs[i].sampler.frequency_penalty = 0.5f;
        reqs[i].sampler.repetition_penalty = 1.2f;
        reqs[i].bias_ids = &bias_id;
        reqs[i].bias = &bias;
        reqs[i].n_bias = 1;
    }
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.stop_at_eos = 0;
    kvp_session_result one[NR], many[NR];
    run(&cfg, reqs, NR, one, NULL);
    int differ = 0;
    for (int i = 1; i < NR; i++)
        differ |= one[i].n_tokens[0] != one[0].n_tokens[0] ||
                  memcmp(one[i].tokens[0], one[0].tokens[0], (size_t)one[0].n_tokens[0] * sizeof(int32_t)) != 0;
    cr_assert(differ, "24 seeded samples at temperature 1 were all identical");
    for (int nt = 2; nt <= 3; nt++) {
        kvp_model_set_threads(g_model, nt);
        run(&cfg, reqs, NR, many, NULL);
        kvp_model_set_threads(g_model, 1);
        char what[32];
        snprintf(what, sizeof what, "%d threads", nt);
        for (int i = 0; i < NR; i++) {
            expect_same(&one[i], &many[i], what, i);
            for (int s = 0; s < one[i].n_samples; s++)
                cr_assert_eq(one[i].logprob[s], many[i].logprob[s], "%s request %d sample %d: logprob %.17g vs %.17g",
                             what, i, s, one[i].logprob[s], many[i].logprob[s]);
        }
        kvp_session_results_free(many, NR);
    }
    kvp_session_results_free(one, NR);
    for (int i = 0; i < NPROMPTS; i++) kvp_free(e[i].ids);
}

/* ---- the online session (kvp_gen_session_*): requests joining a running loop ---- */

/* Requests added at different steps (two first, two more after 5 steps, one more after 12, with sampling
 * and n = 2 among them): each one's tokens are those of kvp_gen_run on it alone; take hands out every
 * request once, in finishing order, then KVP_ENOTFOUND; the stats count what happened. */
Test(generate_session, requests_join_a_running_loop_and_match_their_solo_runs, .init = setup, .fini = teardown)
{
    kvp_session_request reqs[5];
    enc e[5];
    for (int i = 0; i < 5; i++) {
        e[i] = encode(prompts[i]);
        reqs[i] = greedy_req(e[i], 20 + 7 * i);
    }
    reqs[3].sampler = (kvp_sampler_params){.temperature = 0.8, .top_k = 40, .top_p = 0.9, .seed = 11};
    reqs[3].n = 2;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 64;
    cfg.engine.block_size = 4;
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
    int32_t id;
    kvp_session_result got[5], res;
    int seen[5] = {0}, order = 0, add_at[5] = {0, 0, 5, 5, 12}, added = 0;
    for (int stepno = 0; added < 5 || kvp_session_pending(s); stepno++) {
        while (added < 5 && add_at[added] <= stepno) {
            cr_assert_eq(kvp_session_add(s, &reqs[added], &id), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(id, added);
            added++;
        }
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        while (kvp_session_take(s, &id, &res) == KVP_OK) {
            cr_assert(id >= 0 && id < 5 && !seen[id], "request %d handed out twice or unknown", id);
            seen[id] = ++order;
            got[id] = res;
            cr_assert_geq(res.ttft_s, 0);
            cr_assert_geq(res.finish_s, res.ttft_s);
        }
    }
    cr_assert_eq(kvp_session_take(s, &id, &res), KVP_ENOTFOUND);
    cr_assert_eq(order, 5);
    kvp_session_stats st;
    kvp_session_stats_get(s, &st);
    cr_assert_eq(st.requests, 5);
    cr_assert_eq(st.finished, 5);
    cr_assert_eq(st.waiting, 0);
    cr_assert_eq(st.running_seqs, 0);
    cr_assert_gt(st.steps, 0);
    int64_t ptoks = 0;
    for (int i = 0; i < 5; i++) ptoks += reqs[i].n_prompt;
    cr_assert_eq(st.admitted_prompt_tokens, ptoks);
    kvp_session_destroy(s);
    for (int i = 0; i < 5; i++) {
        kvp_session_result solo;
        run(&cfg, &reqs[i], 1, &solo, NULL);
        cr_assert_eq(got[i].n_samples, solo.n_samples, "request %d", i);
        expect_same(&got[i], &solo, "joined a running loop vs alone", i);
        kvp_session_results_free(&solo, 1);
        kvp_session_results_free(&got[i], 1);
        free(e[i].ids);
    }
}

/* A finished request's generated tokens stay cached with its prompt: the next turn of a chat, whose prompt is
 * that prompt, the answer and a new message, finds the full blocks of every computed token (prompt + answer
 * - 1), and generates what it generates without the cache. */
Test(generate_session, the_next_turn_finds_the_answer_cached, .init = setup, .fini = teardown)
{
    enc e = encode(prompts[0]), more = encode(" Then Tom came.");
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 64;
    cfg.engine.block_size = 16;
    kvp_session_stats st;
    tu_next_turn(g_model, &cfg, e.ids, e.n, 40, more.ids + 1, more.n - 1, &st); /* the second text without BOS */
    free(e.ids);
    free(more.ids);
}

/* The scheduling policies, one request running at a time (so requests finish in the order they are admitted):
 * after a first request cached prompt P, three wait: A (another prompt), B (P and more), C (another). FCFS
 * admits A, B, C; LPM B first (its P is cached), then A, C; PRIORITY (A 5, B 1, C -2) C, B, A. */
Test(generate_session, lpm_and_priority_pick_the_next_request, .init = setup, .fini = teardown)
{
    int32_t p[40], a[40], b[44], c[40];
    for (int i = 0; i < 40; i++) p[i] = b[i] = 100 + i, a[i] = 200 + i, c[i] = 300 + i;
    for (int i = 40; i < 44; i++) b[i] = 50 + i;
    p[0] = a[0] = b[0] = c[0] = 1;
    const enc pe = {p, 40}, ae = {a, 40}, be = {b, 44}, ce = {c, 40};
    const kvp_sched_policy pol[3] = {KVP_SCHED_FCFS, KVP_SCHED_LPM, KVP_SCHED_PRIORITY};
    const int32_t want[3][3] = {{0, 1, 2}, {1, 0, 2}, {2, 1, 0}}; /* indices into {A, B, C} */
    for (int k = 0; k < 3; k++) {
        kvp_session_config cfg = kvp_session_config_default();
        cfg.num_blocks = 64;
        cfg.engine.max_num_seqs = 1;
        cfg.engine.sched = pol[k];
        kvp_session *s;
        cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_request first = greedy_req(pe, 2), w[3] = {greedy_req(ae, 2), greedy_req(be, 2), greedy_req(ce, 2)};
        w[0].priority = 5, w[1].priority = 1, w[2].priority = -2;
        kvp_session_result res;
        tu_run_one(s, &first, &res);
        kvp_session_results_free(&res, 1);
        int32_t ids[3], id, order = 0;
        for (int i = 0; i < 3; i++) cr_assert_eq(kvp_session_add(s, &w[i], &ids[i]), KVP_OK);
        while (kvp_session_pending(s)) {
            cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
            while (kvp_session_take(s, &id, &res) == KVP_OK) {
                cr_assert_lt(order, 3);
                cr_assert_eq(id, ids[want[k][order]], "%s: finished %d-th: request %d, want %d",
                             kvp_sched_policy_name(pol[k]), order, id, ids[want[k][order]]);
                if (id == ids[1]) cr_assert_eq(res.prompt_cached_tokens, 32, "B finds P's two full blocks");
                order++;
                kvp_session_results_free(&res, 1);
            }
        }
        cr_assert_eq(order, 3);
        kvp_session_stats st;
        kvp_session_stats_get(s, &st);
        cr_assert_eq(st.waiting, 0);
        kvp_session_destroy(s);
    }
}

/* LPM counts the host tier's blocks (SGLang's device + host hits). One request at a time, 8 blocks of 16: P
 * (64 tokens) is cached and written through to the tier; X (100 new tokens) evicts P's blocks but the first.
 * Then D (X's first 32 tokens and more: 2 cached blocks) and C (P's first 48 and more: 1 cached, 2 in the
 * tier) wait. With the tier LPM takes C first and loads its 2 blocks; without it, D (2 > 1). */
Test(generate_session, lpm_counts_the_host_tiers_blocks, .init = setup, .fini = teardown)
{
    int32_t p[64], x[100], d[40], c[56];
    for (int i = 0; i < 64; i++) p[i] = 100 + i;
    for (int i = 0; i < 100; i++) x[i] = 300 + i;
    for (int i = 0; i < 40; i++) d[i] = i < 32 ? x[i] : 450 + i;
    for (int i = 0; i < 56; i++) c[i] = i < 48 ? p[i] : 400 + i;
    p[0] = x[0] = d[0] = c[0] = 1;
    for (int tier = 0; tier < 2; tier++) {
        kvp_session_config cfg = kvp_session_config_default();
        cfg.num_blocks = 8;
        cfg.engine.max_num_seqs = 1;
        cfg.engine.sched = KVP_SCHED_LPM;
        cfg.host_cache_blocks = tier ? 64 : 0;
        kvp_session *s;
        cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_request rp = greedy_req((enc){p, 64}, 2), rx = greedy_req((enc){x, 100}, 2);
        kvp_session_request w[2] = {greedy_req((enc){d, 40}, 2), greedy_req((enc){c, 56}, 2)};
        kvp_session_result res;
        tu_run_one(s, &rp, &res);
        kvp_session_results_free(&res, 1);
        tu_run_one(s, &rx, &res);
        kvp_session_results_free(&res, 1);
        int32_t ids[2], id, first = -1;
        for (int i = 0; i < 2; i++) cr_assert_eq(kvp_session_add(s, &w[i], &ids[i]), KVP_OK);
        while (kvp_session_pending(s)) {
            cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
            while (kvp_session_take(s, &id, &res) == KVP_OK) {
                if (first < 0) first = id;
                if (id == ids[1])
                    cr_assert_eq(res.prompt_cached_tokens, tier ? 48 : 16, "C: 1 block cached (+ 2 loaded)");
                kvp_session_results_free(&res, 1);
            }
        }
        cr_assert_eq(first, ids[tier ? 1 : 0], "tier %d: request %d finished first", tier, first);
        kvp_session_destroy(s);
    }
}

/* Under the priority policy a cache too small for two sequences preempts the less urgent one, even when it was
 * admitted first: B (priority 5) runs alone for a step, then A (priority 0) joins; A never waits, so it ends
 * first, and B is the one preempted. Under FCFS the most recent, A, is preempted and B ends first. */
Test(generate_session, priority_preempts_the_least_urgent, .init = setup, .fini = teardown)
{
    int32_t a[17], b[17];
    for (int i = 0; i < 17; i++) a[i] = 200 + i, b[i] = 300 + i;
    a[0] = b[0] = 1;
    const kvp_sched_policy pol[2] = {KVP_SCHED_FCFS, KVP_SCHED_PRIORITY};
    for (int k = 0; k < 2; k++) {
        kvp_session_config cfg = kvp_session_config_default();
        cfg.num_blocks = 12; /* one sequence of 117 tokens takes 8 */
        cfg.engine.sched = pol[k];
        kvp_session *s;
        cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_request rb = greedy_req((enc){b, 17}, 100), ra = greedy_req((enc){a, 17}, 100);
        rb.priority = 5, ra.priority = 0;
        rb.ignore_eos = ra.ignore_eos = 1;
        int32_t idb, ida, id, first = -1;
        cr_assert_eq(kvp_session_add(s, &rb, &idb), KVP_OK);
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_session_add(s, &ra, &ida), KVP_OK);
        kvp_session_result res;
        while (kvp_session_pending(s)) {
            cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
            while (kvp_session_take(s, &id, &res) == KVP_OK) {
                if (first < 0) first = id;
                cr_assert_eq(res.n_tokens[0], 100);
                kvp_session_results_free(&res, 1);
            }
        }
        kvp_session_stats st;
        kvp_session_stats_get(s, &st);
        cr_assert_gt(st.preemptions, 0, "%s: the cache must be tight enough to preempt", kvp_sched_policy_name(pol[k]));
        cr_assert_eq(first, k ? ida : idb, "%s: request %d ended first", kvp_sched_policy_name(pol[k]), first);
        kvp_session_destroy(s);
    }
}

/* Under the priority policy preempted sequences come back most urgent first: B (priority 5) and C (3) run, then A
 * (0) arrives; as blocks run out B, then C are preempted (least urgent first), and when A's end frees blocks, C
 * (preempted after B) is readmitted before B. The step they come back in is seen as the first one their
 * tokens grow again. */
Test(generate_session, priority_readmits_the_most_urgent_first, .init = setup, .fini = teardown)
{
    int32_t p[3][17];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 17; i++) p[r][i] = i ? 100 * (r + 2) + i : 1;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 12;          /* one sequence of 117 tokens takes 8 */
    cfg.engine.max_batched_tokens = 64;  /* a readmission's recompute takes the step's budget: one comes back a step */
    cfg.engine.sched = KVP_SCHED_PRIORITY;
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
    kvp_session_request rb = greedy_req((enc){p[0], 17}, 100), rc = greedy_req((enc){p[1], 17}, 100),
                    ra = greedy_req((enc){p[2], 17}, 100);
    rb.priority = 5, rc.priority = 3, ra.priority = 0;
    rb.ignore_eos = rc.ignore_eos = ra.ignore_eos = 1;
    int32_t id[3]; /* B, C, A */
    cr_assert_eq(kvp_session_add(s, &rb, &id[0]), KVP_OK);
    cr_assert_eq(kvp_session_add(s, &rc, &id[1]), KVP_OK);
    cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_session_add(s, &ra, &id[2]), KVP_OK);
    int32_t n[3] = {0, 0, 0};
    int both_out = 0, back = -1; /* back: which of B (0) and C (1) grew first after A's end */
    while (kvp_session_pending(s)) {
        const int a_done = n[2] == 100;
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_stats st;
        kvp_session_stats_get(s, &st);
        both_out |= st.preempted_seqs == 2 && n[2] < 100;
        int grew[3];
        for (int r = 0; r < 3; r++) {
            const int32_t *t;
            int32_t m = 0;
            kvp_session_partial(s, id[r], 0, &t, &m);
            grew[r] = m > n[r];
            n[r] = m;
        }
        if (a_done && back < 0 && (grew[0] || grew[1])) {
            cr_assert(!(grew[0] && grew[1]), "B and C came back in the same step");
            back = grew[1];
        }
    }
    cr_assert(both_out, "B and C were never preempted together while A ran");
    cr_assert_eq(back, 1, "B (priority 5) came back before C (3)");
    cr_assert(n[0] == 100 && n[1] == 100 && n[2] == 100);
    kvp_session_destroy(s);
}

/* A bad request or one that can never fit is refused and leaves the session as it was; a step with
 * nothing pending does nothing; the session's creation fails cleanly at every allocation. */
static kvp_status make_session(void *cfg, void **s) { return kvp_cpu_session_create(g_model, cfg, (kvp_session **)s); }
static void destroy_session(void *s) { kvp_session_destroy(s); }

Test(generate_session, refusals_and_allocation_failures, .init = setup, .fini = teardown)
{
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_EINVAL); /* num_blocks 0: no size for the cache */
    cfg.num_blocks = 4;
    cfg.engine.block_size = 16;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK);
    cr_assert_eq(kvp_session_step(s), KVP_OK);
    enc e = encode(prompts[2]);
    kvp_session_request r = greedy_req(e, 100); /* ~116 tokens: 8 blocks of 16 > 4 */
    cr_assert_eq(kvp_session_add(s, &r, NULL), KVP_ENOBLOCKS);
    cr_assert(strstr(kvp_error_message(), "raise --num-blocks"), "%s", kvp_error_message());
    r.max_tokens = -1;
    cr_assert_eq(kvp_session_add(s, &r, NULL), KVP_EINVAL);
    r.max_tokens = 10;
    const int32_t bad_stop = 100000;
    r.stop_ids = &bad_stop;
    r.n_stop_ids = 1;
    cr_assert_eq(kvp_session_add(s, &r, NULL), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "stop id 0 is 100000"), "%s", kvp_error_message());
    r.stop_ids = NULL;
    cr_assert_eq(kvp_session_add(s, &r, NULL), KVP_EINVAL, "stop ids without their array");
    r.n_stop_ids = 0;
    cr_assert_eq(kvp_session_pending(s), 0);
    r.max_tokens = 10;
    int32_t id = -1;
    cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK);
    cr_assert_eq(id, 0, "refused requests take no id");
    while (kvp_session_pending(s)) cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
    kvp_session_result res;
    cr_assert_eq(kvp_session_take(s, &id, &res), KVP_OK);
    cr_assert_eq(res.n_tokens[0], 10);
    kvp_session_results_free(&res, 1);
    kvp_session_destroy(s);
    kvp_session_destroy(NULL);
    free(e.ids);
    tu_every_alloc_failure("session", make_session, destroy_session, &cfg, 0);
}

/* Steps s until request id's sample k has at least `want` tokens (or the session is idle). */
static void step_until(kvp_session *s, int32_t id, int32_t k, int32_t want)
{
    const int32_t *t;
    int32_t n = 0;
    while (kvp_session_pending(s) && (kvp_session_partial(s, id, k, &t, &n), n < want))
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
}

static void drain(kvp_session *s)
{
    while (kvp_session_pending(s)) cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
}

/* The first n tokens of sample k of got equal those of ref's. */
static void expect_prefix(const kvp_session_result *got, int k, const kvp_session_result *ref, int kr, int32_t n, const char *what)
{
    cr_assert_leq(n, ref->n_tokens[kr], "%s: %d tokens, the full run has %d", what, n, ref->n_tokens[kr]);
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(got->tokens[k][i], ref->tokens[kr][i], "%s: token %d", what, i);
}

/* kvp_session_stop ends one sample of an n = 3 request where it is: that sample keeps exactly the
 * tokens it had (a prefix of its solo run), the other two finish as they would alone. kvp_session_abort
 * ends a running request (a prefix, KVP_FINISH_ABORTED) and one not admitted yet (no sample); both are
 * taken like any other, and every block comes back. Unknown, finished and taken ids are KVP_ENOTFOUND. */
Test(generate_session, stop_a_sample_and_abort_requests, .init = setup, .fini = teardown)
{
    enc e[3] = {encode(prompts[1]), encode(prompts[3]), encode(prompts[5])};
    kvp_session_request rq[3] = {greedy_req(e[0], 40), greedy_req(e[1], 60), greedy_req(e[2], 30)};
    rq[0].sampler = (kvp_sampler_params){.temperature = 0.9, .top_k = 0, .top_p = 0.95, .seed = 5};
    rq[0].n = 3;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 64;
    cfg.engine.block_size = 4;
    cfg.engine.max_num_seqs = 4; /* request 2 waits behind 0's three samples and 1 */
    cfg.engine.cache = KVP_PC_NONE;
    kvp_session_result solo[3];
    for (int i = 0; i < 3; i++) run(&cfg, &rq[i], 1, &solo[i], NULL);
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
    int32_t id[3];
    for (int i = 0; i < 3; i++) cr_assert_eq(kvp_session_add(s, &rq[i], &id[i]), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_session_stop(s, id[0], 1), KVP_ENOTFOUND, "not forked yet");
    step_until(s, id[0], 1, 7);
    const int32_t *t;
    int32_t n1, n_abort;
    kvp_session_partial(s, id[0], 1, &t, &n1);
    cr_assert_geq(n1, 7);
    cr_assert_eq(kvp_session_stop(s, id[0], 1), KVP_OK);
    cr_assert_eq(kvp_session_stop(s, id[0], 1), KVP_ENOTFOUND, "already stopped");
    kvp_session_stats st;
    kvp_session_stats_get(s, &st);
    cr_assert_eq(st.waiting, 1, "request 2 waits");
    cr_assert_eq(kvp_session_abort(s, id[2]), KVP_OK);
    cr_assert_eq(kvp_session_abort(s, id[2]), KVP_ENOTFOUND, "already aborted");
    kvp_session_stats_get(s, &st);
    cr_assert_eq(st.waiting, 0);
    step_until(s, id[1], 0, 12);
    kvp_session_partial(s, id[1], 0, &t, &n_abort);
    cr_assert_eq(kvp_session_abort(s, id[1]), KVP_OK);
    drain(s);
    kvp_session_result got[3] = {{0}}, res;
    int32_t rid;
    int taken = 0;
    while (kvp_session_take(s, &rid, &res) == KVP_OK) {
        cr_assert(rid >= 0 && rid < 3 && got[rid].n_samples == 0 && !got[rid].tokens, "request %d twice", rid);
        got[rid] = res;
        taken++;
    }
    cr_assert_eq(taken, 3);
    cr_assert_eq(got[0].n_samples, 3);
    cr_assert_eq(got[0].finish[1], KVP_FINISH_STOPPED);
    cr_assert_eq(got[0].n_tokens[1], n1, "the stopped sample keeps the %d tokens it had", n1);
    expect_prefix(&got[0], 1, &solo[0], 1, n1, "stopped sample");
    for (int k = 0; k < 3; k += 2) {
        cr_assert_eq(got[0].n_tokens[k], solo[0].n_tokens[k], "sample %d", k);
        expect_prefix(&got[0], k, &solo[0], k, solo[0].n_tokens[k], "sample next to a stopped one");
        cr_assert_eq(got[0].finish[k], solo[0].finish[k]);
    }
    cr_assert_eq(got[1].n_samples, 1);
    cr_assert_eq(got[1].finish[0], KVP_FINISH_ABORTED);
    cr_assert_eq(got[1].n_tokens[0], n_abort);
    expect_prefix(&got[1], 0, &solo[1], 0, n_abort, "aborted request");
    cr_assert_eq(got[2].n_samples, 0, "aborted before admission: no sample");
    kvp_session_stats_get(s, &st);
    cr_assert_eq(st.free_blocks, cfg.num_blocks, "every block is back");
    cr_assert_eq(st.aborted, 2);
    cr_assert_eq(st.finished, 3);
    cr_assert_eq(st.seq_records, 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvp_session_stop(s, id[i], 0), KVP_ENOTFOUND);
        cr_assert_eq(kvp_session_abort(s, id[i]), KVP_ENOTFOUND);
    }
    cr_assert_eq(kvp_session_abort(s, 99), KVP_ENOTFOUND);
    cr_assert_eq(kvp_session_abort(s, -1), KVP_ENOTFOUND);
    kvp_session_destroy(s);
    kvp_session_results_free(got, 3);
    kvp_session_results_free(solo, 3);
    for (int i = 0; i < 3; i++) free(e[i].ids);
}

/* Aborting every request at a step where some sequences are preempted (a cache too small for all) leaves
 * nothing pending and every block free. */
Test(generate_session, abort_with_preempted_sequences, .init = setup, .fini = teardown)
{
    enc e[NPROMPTS];
    kvp_session_request rq[NPROMPTS];
    for (int i = 0; i < NPROMPTS; i++) {
        e[i] = encode(prompts[i]);
        rq[i] = greedy_req(e[i], 80);
    }
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 40;
    cfg.engine.block_size = 4;
    cfg.engine.cache = KVP_PC_NONE; /* free_blocks then counts every block not held */
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
    for (int i = 0; i < NPROMPTS; i++) cr_assert_eq(kvp_session_add(s, &rq[i], NULL), KVP_OK, "%s", kvp_error_detail());
    kvp_session_stats st;
    do {
        cr_assert(kvp_session_pending(s), "no preemption happened");
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_stats_get(s, &st);
    } while (st.preempted_seqs == 0);
    for (int i = 0; i < NPROMPTS; i++) kvp_session_abort(s, i); /* finished ones: KVP_ENOTFOUND */
    cr_assert_eq(kvp_session_pending(s), 0);
    kvp_session_result res;
    int32_t id;
    int taken = 0;
    while (kvp_session_take(s, &id, &res) == KVP_OK) {
        taken++;
        kvp_session_results_free(&res, 1);
    }
    cr_assert_eq(taken, NPROMPTS);
    kvp_session_stats_get(s, &st);
    cr_assert_eq(st.running_seqs + st.preempted_seqs, 0);
    cr_assert_eq(st.free_blocks, cfg.num_blocks);
    cr_assert_eq(st.seq_records, 0);
    kvp_session_destroy(s);
    for (int i = 0; i < NPROMPTS; i++) free(e[i].ids);
}

/* stop_ids end a sample at the first of them (not part of its tokens, KVP_FINISH_STOP_TOKEN, stop_token
 * says which); with ignore_eos a request runs past the EOS that ends it otherwise. */
Test(generate_session, stop_ids_and_ignore_eos, .init = setup, .fini = teardown)
{
    enc e = encode(prompts[0]);
    kvp_session_request r = greedy_req(e, 60);
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result full, cut;
    run(&cfg, &r, 1, &full, NULL);
    cr_assert_eq(full.n_tokens[0], 60);
    const int32_t stop[2] = {full.tokens[0][25], full.tokens[0][40]};
    int32_t first = 0;
    while (full.tokens[0][first] != stop[0] && full.tokens[0][first] != stop[1]) first++;
    r.stop_ids = stop;
    r.n_stop_ids = 2;
    run(&cfg, &r, 1, &cut, NULL);
    cr_assert_eq(cut.n_tokens[0], first);
    expect_prefix(&cut, 0, &full, 0, first, "stop ids");
    cr_assert_eq(cut.finish[0], KVP_FINISH_STOP_TOKEN);
    cr_assert_eq(cut.stop_token[0], full.tokens[0][first]);
    cr_assert_eq(full.stop_token[0], -1);
    /* min_tokens past the first stop: the stop ids cannot be drawn before it, so the greedy story turns
     * elsewhere at that place (the next likeliest token), and nothing ends before min_tokens */
    kvp_session_result held;
    r.min_tokens = first + 5;
    run(&cfg, &r, 1, &held, NULL);
    cr_assert_geq(held.n_tokens[0], first + 5);
    expect_prefix(&held, 0, &full, 0, first, "min_tokens");
    for (int32_t t = 0; t < first + 5; t++) cr_assert(held.tokens[0][t] != stop[0] && held.tokens[0][t] != stop[1]);
    kvp_session_results_free(&held, 1);
    r.min_tokens = 61;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &held, NULL, NULL, NULL), KVP_EINVAL, "min_tokens above max_tokens");
    r.min_tokens = 0;
    kvp_session_results_free(&cut, 1);
    kvp_session_results_free(&full, 1);
    /* ignore_eos: the same model with EOS set to a token its greedy story makes (stories260K never makes
     * its own EOS) */
    r.stop_ids = NULL;
    r.n_stop_ids = 0;
    run(&cfg, &r, 1, &full, NULL);
    const uint32_t eos = (uint32_t)full.tokens[0][30];
    first = 0;
    while (full.tokens[0][first] != (int32_t)eos) first++;
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    tu_gguf_set_kv4(buf, len, "tokenizer.ggml.eos_token_id", 4, &eos);
    char path[512];
    const char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/eos.gguf", dir);
    tu_write_all(path, buf, len);
    free(buf);
    kvp_model *m;
    cr_assert_eq(kvp_model_load(path, &m), KVP_OK, "%s", kvp_error_detail());
    for (int ignore = 0; ignore < 2; ignore++) {
        r.ignore_eos = ignore;
        cr_assert_eq(kvp_cpu_generate(m, &cfg, &r, 1, &cut, NULL, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(cut.n_tokens[0], ignore ? 60 : first, "ignore_eos %d", ignore);
        cr_assert_eq(cut.finish[0], ignore ? KVP_FINISH_LENGTH : KVP_FINISH_EOS);
        cr_assert_eq(cut.stop_token[0], ignore ? -1 : (int32_t)eos);
        expect_prefix(&cut, 0, &full, 0, cut.n_tokens[0], "ignore_eos");
        kvp_session_results_free(&cut, 1);
    }
    r.ignore_eos = 0; /* min_tokens holds EOS back too */
    r.min_tokens = first + 3;
    cr_assert_eq(kvp_cpu_generate(m, &cfg, &r, 1, &cut, NULL, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    cr_assert_geq(cut.n_tokens[0], first + 3);
    for (int32_t t = 0; t < first + 3; t++) cr_assert_neq(cut.tokens[0][t], (int32_t)eos);
    kvp_session_results_free(&cut, 1);
    kvp_model_destroy(m);
    unlink(path);
    rmdir(dir);
    kvp_session_results_free(&full, 1);
    free(e.ids);
}

/* A long-running session holds records only for what is not taken: 3000 short requests, added a few per
 * step and taken as they finish, keep the session's request and sequence records bounded, and ids run
 * 0..2999, each handed out once. */
Test(generate_session, many_requests_in_bounded_records, .init = setup, .fini = teardown)
{
    enum { NR = 3000 };
    enc e = encode(prompts[5]);
    kvp_session_request r = greedy_req(e, 3);
    r.n = 2;
    r.sampler = (kvp_sampler_params){.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 1};
    kvp_session_config cfg = kvp_session_config_default();
    cfg.num_blocks = 256;
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
    static unsigned char seen[NR];
    memset(seen, 0, sizeof seen);
    int32_t added = 0, taken = 0, max_req = 0, max_seq = 0;
    while (taken < NR) {
        for (int k = 0; k < 7 && added < NR; k++) {
            int32_t id;
            cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(id, added++);
        }
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_result res;
        int32_t id;
        while (kvp_session_take(s, &id, &res) == KVP_OK) {
            cr_assert(id >= 0 && id < NR && !seen[id], "id %d", id);
            seen[id] = 1;
            cr_assert_eq(res.n_samples, 2);
            cr_assert_eq(res.n_tokens[0], 3);
            kvp_session_results_free(&res, 1);
            taken++;
        }
        kvp_session_stats st;
        kvp_session_stats_get(s, &st);
        max_req = st.request_records > max_req ? st.request_records : max_req;
        max_seq = st.seq_records > max_seq ? st.seq_records : max_seq;
    }
    cr_assert_leq(max_req, 200, "request records grew to %d", max_req);
    cr_assert_leq(max_seq, 100, "sequence records grew to %d", max_seq);
    kvp_session_destroy(s);
    free(e.ids);
}

/* Log-probabilities of request r's result res against the model run directly on each prefix
 * (next_logprobs): every prompt place (place 0 has nothing before it) and every generated token of sample 0,
 * the top-k lists sorted and equal to the reference at their ids; each sample's token log-probabilities
 * add up to its logprob. */
static void expect_logprobs(const kvp_session_request *r, const kvp_session_result *res, const char *what)
{
    const int32_t K = r->top_logprobs;
    const kvp_logprobs *pl = &res->prompt_logprobs;
    cr_assert_eq(pl->n, r->n_prompt, "%s: %d prompt places, want %d", what, pl->n, r->n_prompt);
    cr_assert_eq(pl->k, K, "%s", what);
    cr_assert(isnan(pl->lp[0]), "%s: place 0 has nothing before it", what);
    for (int32_t i = 0; i < K; i++) cr_assert_eq(pl->top_ids[i], -1, "%s", what);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(r->n_prompt + res->n_tokens[0]));
    memcpy(seq, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    memcpy(seq + r->n_prompt, res->tokens[0], sizeof(int32_t) * (size_t)res->n_tokens[0]);
    const int32_t total = r->n_prompt + res->n_tokens[0];
    for (int32_t p = 1; p < total; p++) {
        float ref[512];
        const int32_t *one[1] = {seq};
        int32_t len = p;
        next_logprobs(one, &len, 1, ref);
        const kvp_logprobs *a = p < r->n_prompt ? pl : &res->logprobs[0];
        const int32_t place = p < r->n_prompt ? p : p - r->n_prompt;
        cr_assert_float_eq(a->lp[place], ref[seq[p]], 1e-4, "%s: position %d: %g, want %g", what, p, a->lp[place],
                           ref[seq[p]]);
        for (int32_t i = 0; i < K; i++) {
            const int32_t id = a->top_ids[place * K + i];
            cr_assert(id >= 0 && id < 512, "%s", what);
            cr_assert_float_eq(a->top_lps[place * K + i], ref[id], 1e-4, "%s: position %d top %d", what, p, i);
            if (i > 0) cr_assert_geq(a->top_lps[place * K + i - 1], a->top_lps[place * K + i], "%s", what);
        }
        int32_t better = 0; /* tokens the reference ranks above the k-th listed one */
        for (int32_t t = 0; t < 512; t++) better += ref[t] > a->top_lps[place * K + K - 1] + 1e-4f;
        cr_assert_leq(better, K - 1, "%s: position %d: the top %d misses a likelier token", what, p, K);
    }
    for (int32_t s = 0; s < res->n_samples; s++) {
        cr_assert_eq(res->logprobs[s].n, res->n_tokens[s], "%s sample %d", what, s);
        double sum = 0;
        for (int32_t t = 0; t < res->n_tokens[s]; t++) sum += res->logprobs[s].lp[t];
        cr_assert_float_eq(sum, res->logprob[s], 1e-3, "%s sample %d: %g vs %g", what, s, sum, res->logprob[s]);
    }
    free(seq);
}

/* expect bit-identical log-probabilities (batch invariance) */
static void expect_same_logprobs(const kvp_logprobs *a, const kvp_logprobs *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s", what);
    cr_assert_eq(a->k, b->k, "%s", what);
    for (int32_t i = 0; i < a->n; i++) {
        cr_assert(a->lp[i] == b->lp[i] || (isnan(a->lp[i]) && isnan(b->lp[i])), "%s: place %d", what, i);
        for (int32_t j = 0; j < a->k; j++) cr_assert_eq(a->top_ids[i * a->k + j], b->top_ids[i * a->k + j], "%s", what);
    }
}

/* Prompt and token log-probabilities (with their top 5) against the model run on each prefix; the same,
 * bit for bit, with a chunked prompt at block size 1, in a batch, and in a cache so small that sequences are
 * preempted; a prompt whose blocks are cached is computed whole when its request wants prompt
 * log-probabilities (and the next one without them hits the cache). */
Test(generate, prompt_and_token_logprobs_match_the_model, .init = setup, .fini = teardown)
{
    enc e = encode(prompts[2]);
    kvp_session_request r = greedy_req(e, 8);
    r.sampler.temperature = 0.8;
    r.sampler.seed = 7;
    r.n = 2;
    r.logprobs = r.prompt_logprobs = 1;
    r.top_logprobs = 5;
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result alone;
    run(&cfg, &r, 1, &alone, NULL);
    expect_logprobs(&r, &alone, "alone");
    /* chunks of 5 tokens, block size 1, with 5 other requests; then a cache that preempts */
    kvp_session_request reqs[6];
    for (int i = 0; i < 6; i++) reqs[i] = r;
    for (int c = 0; c < 2; c++) {
        cfg = kvp_session_config_default();
        cfg.engine.max_batched_tokens = c ? 2048 : 5;
        cfg.engine.block_size = c ? 4 : 1;
        cfg.num_blocks = c ? 3 * (e.n + 8 + 3) / 4 : 0;
        kvp_session_result all[6];
        kvp_run_stats st;
        run(&cfg, reqs, 6, all, &st);
        if (c) cr_assert_gt(st.preemptions, 0, "the cache must be tight enough to preempt");
        for (int i = 0; i < 6; i++) {
            expect_same(&alone, &all[i], c ? "preempted" : "chunked", i);
            expect_same_logprobs(&alone.prompt_logprobs, &all[i].prompt_logprobs, c ? "preempted" : "chunked");
            for (int s = 0; s < 2; s++) expect_same_logprobs(&alone.logprobs[s], &all[i].logprobs[s], "samples");
        }
        kvp_session_results_free(all, 6);
    }
    /* a session: the prompt's blocks cached by a first request; the second wants prompt logprobs */
    cfg = kvp_session_config_default();
    cfg.num_blocks = 64;
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK);
    kvp_session_request plain = greedy_req(e, 8);
    int32_t id;
    kvp_session_result got[3];
    const kvp_session_request *seq3[3] = {&plain, &r, &plain};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(kvp_session_add(s, seq3[k], NULL), KVP_OK);
        while (kvp_session_pending(s)) cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_session_take(s, &id, &got[k]), KVP_OK);
    }
    cr_assert_eq(got[1].prompt_cached_tokens, 0, "prompt logprobs need every prompt token computed");
    cr_assert_gt(got[2].prompt_cached_tokens, 0, "the cache still serves the others");
    cr_assert_null(got[0].logprobs);
    cr_assert_eq(got[0].prompt_logprobs.n, 0);
    expect_same(&alone, &got[1], "after a cached prompt", 0);
    expect_same_logprobs(&alone.prompt_logprobs, &got[1].prompt_logprobs, "after a cached prompt");
    kvp_session_results_free(got, 3);
    kvp_session_destroy(s);
    /* refused: too many top logprobs, token logprobs with beam search */
    kvp_session_request bad = r;
    bad.top_logprobs = KVP_MAX_TOP_LOGPROBS + 1;
    kvp_session_result none;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &bad, 1, &none, NULL, NULL, NULL), KVP_EINVAL);
    bad = r;
    bad.beam_width = 2;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &bad, 1, &none, NULL, NULL, NULL), KVP_EINVAL);
    kvp_session_results_free(&alone, 1);
    kvp_free(e.ids);
}

/* golden.json (the caller deletes *gold) and its case i. */
/* --logprobs and --prompt-logprobs on golden case 1, greedy: every prompt place but the first and every
 * generated token has a log-probability; the generated token is its place's likeliest (greedy), the top
 * pairs come likeliest first, and a sample's token log-probabilities add up to its logprob. */
Test(generate_cli, logprobs_in_the_json_output)
{
    cJSON *gold;
    const cJSON *c1 = golden_case(&gold, 1);
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '%s' --max-tokens 12 --json --logprobs 3 --prompt-logprobs",
             kvp_test_bin(), S260_GGUF, cJSON_GetObjectItem(c1, "prompt")->valuestring);
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "%s", out);
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0);
    const cJSON *pl = cJSON_GetObjectItem(r0, "prompt_token_logprobs"), *pt = cJSON_GetObjectItem(r0, "prompt_top_logprobs");
    const cJSON *ptoks = cJSON_GetObjectItem(r0, "prompt_tokens");
    cr_assert_eq(cJSON_GetArraySize(pl), cJSON_GetArraySize(ptoks));
    cr_assert(cJSON_IsNull(cJSON_GetArrayItem(pl, 0)) && cJSON_IsNull(cJSON_GetArrayItem(pt, 0)));
    for (int i = 1; i < cJSON_GetArraySize(pl); i++) {
        const cJSON *tops = cJSON_GetArrayItem(pt, i);
        cr_assert_eq(cJSON_GetArraySize(tops), 3);
        const double lp = cJSON_GetArrayItem(pl, i)->valuedouble;
        cr_assert(lp < 0 && lp <= cJSON_GetArrayItem(cJSON_GetArrayItem(tops, 0), 1)->valuedouble, "prompt place %d", i);
    }
    const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItem(r0, "samples"), 0);
    const cJSON *toks = cJSON_GetObjectItem(s0, "tokens"), *lps = cJSON_GetObjectItem(s0, "token_logprobs");
    const cJSON *tops = cJSON_GetObjectItem(s0, "top_logprobs");
    cr_assert_eq(cJSON_GetArraySize(toks), 12);
    cr_assert_eq(cJSON_GetArraySize(lps), 12);
    double sum = 0;
    for (int i = 0; i < 12; i++) {
        const cJSON *t = cJSON_GetArrayItem(tops, i);
        cr_assert_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(t, 0), 0)->valueint, cJSON_GetArrayItem(toks, i)->valueint,
                     "token %d is the greedy choice", i);
        cr_assert_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(t, 0), 1)->valuedouble, cJSON_GetArrayItem(lps, i)->valuedouble);
        for (int k = 1; k < 3; k++)
            cr_assert_geq(cJSON_GetArrayItem(cJSON_GetArrayItem(t, k - 1), 1)->valuedouble,
                          cJSON_GetArrayItem(cJSON_GetArrayItem(t, k), 1)->valuedouble);
        sum += cJSON_GetArrayItem(lps, i)->valuedouble;
    }
    cr_assert_float_eq(sum, cJSON_GetObjectItem(s0, "logprob")->valuedouble, 1e-4);
    cJSON_Delete(j);
    cJSON_Delete(gold);
    free(out);
    free(err);
}

/* A run with token and prompt log-probabilities fails cleanly at every allocation (the sanitizer build
 * checks that nothing leaks on the way out). */
typedef struct {
    kvp_session_request r;
    kvp_session_config cfg;
} lp_run;

static kvp_status make_lp_run(void *ctx, void **obj)
{
    lp_run *x = ctx;
    kvp_session_result *res = malloc(sizeof *res);
    kvp_status st = kvp_cpu_generate(g_model, &x->cfg, &x->r, 1, res, NULL, NULL, NULL);
    if (st != KVP_OK) {
        free(res);
        return st;
    }
    cr_assert_eq(res->prompt_logprobs.n, x->r.n_prompt);
    cr_assert_eq(res->logprobs[1].n, res->n_tokens[1]);
    *obj = res;
    return KVP_OK;
}

static void destroy_lp_run(void *obj)
{
    kvp_session_results_free(obj, 1);
    free(obj);
}

Test(generate, logprobs_run_fails_cleanly_at_every_allocation, .init = setup, .fini = teardown)
{
    enc e = encode("Once upon");
    lp_run x = {.r = greedy_req(e, 3), .cfg = kvp_session_config_default()};
    x.r.n = 2;
    x.r.logprobs = x.r.prompt_logprobs = 1;
    x.r.top_logprobs = 2;
    x.cfg.engine.max_batched_tokens = 2; /* the prompt in chunks */
    tu_every_alloc_failure("generate with logprobs", make_lp_run, destroy_lp_run, &x, 0);
    kvp_free(e.ids);
}

/* Two turns through a host tier in block size 1 (the second loads what the tiny device cache evicted), with
 * each allocation failing in turn: the run fails with KVP_ENOMEM, or succeeds with the same tokens when the
 * failure only cost a cache insert (offered blocks at a sequence's end are best effort); nothing leaks (the
 * sanitizer build checks). */
Test(generate, a_host_tier_run_fails_cleanly_at_every_allocation, .init = setup, .fini = teardown)
{
    enc a = encode("Once upon a time"), b = encode("The sun was shining");
    kvp_session_request reqs[3] = {greedy_req(a, 4), greedy_req(b, 4), greedy_req(a, 4)};
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = 1;
    cfg.num_blocks = 14;
    cfg.engine.max_num_seqs = 1;
    cfg.host_cache_blocks = 32;
    kvp_session_result want[3], got[3];
    kvp_run_stats st;
    run(&cfg, reqs, 3, want, &st);
    cr_assert_gt(st.host_loaded_blocks, 0, "the third request was meant to load its prompt from the host tier");
    for (int64_t n = 1, wb = 0; wb < KVP_HC_WRITE_POLICIES; n++) { /* then written back, then selectively */
        cfg.engine.host_write_policy = (kvp_hc_write_policy)wb;
        kvp_alloc_fail_at(n);
        kvp_status s = kvp_cpu_generate(g_model, &cfg, reqs, 3, got, NULL, NULL, NULL);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        cr_assert(s == KVP_OK || s == KVP_ENOMEM, "allocation %lld: %s", (long long)n, kvp_status_str(s));
        if (s == KVP_OK) {
            for (int i = 0; i < 3; i++) expect_same(&want[i], &got[i], "after a failed allocation", i);
            kvp_session_results_free(got, 3);
        }
        if (made < n) {
            cr_assert_eq(s, KVP_OK);
            n = 0;
            wb++;
        }
    }
    cfg.engine.cache = KVP_PC_NONE; /* a host tier behind no cache */
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, reqs, 3, got, NULL, NULL, NULL), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "needs a prefix cache"), "%s", kvp_error_message());
    kvp_session_results_free(want, 3);
    kvp_free(a.ids);
    kvp_free(b.ids);
}

/* write_through_selective on the real model: a prompt run once never reaches the host tier; run again, its
 * blocks found in the prefix cache are stored (exactly those: the second run's hit), while write-through
 * stores every full block the first run cached. Forked samples (n = 3) inherit the hit and store nothing
 * more. The tokens do not depend on the policy. */
Test(generate, write_through_selective_stores_reused_blocks_only, .init = setup, .fini = teardown)
{
    enc a = encode("Once upon a time there was a little girl named Lily"), b = encode("The sun was shining");
    kvp_session_request reqs[3] = {greedy_req(a, 6), greedy_req(b, 6), greedy_req(a, 6)};
    reqs[2].n = 3;
    reqs[2].sampler.temperature = 1.0;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = 4;
    cfg.engine.max_num_seqs = 3; /* the third request's group waits for seats: the first two are done by then */
    cfg.host_cache_blocks = 64;
    kvp_session_result wt[3], sel[3];
    kvp_run_stats swt, ssel;
    run(&cfg, reqs, 3, wt, &swt);
    cfg.engine.host_write_policy = KVP_HC_WRITE_THROUGH_SELECTIVE;
    run(&cfg, reqs, 3, sel, &ssel);
    const int32_t hit_blocks = (a.n - 1) / 4;
    cr_assert_eq(ssel.prefix_hit_tokens, hit_blocks * 4, "the third request finds the first one's prompt blocks");
    cr_assert_eq(ssel.host_stored_blocks, hit_blocks, "%lld stored", (long long)ssel.host_stored_blocks);
    cr_assert_gt(swt.host_stored_blocks, a.n / 4 + b.n / 4, "write-through stores what the first two computed");
    for (int i = 0; i < 3; i++) expect_same(&wt[i], &sel[i], "write_through_selective", i);
    kvp_session_results_free(wt, 3);
    kvp_session_results_free(sel, 3);
    kvp_free(a.ids);
    kvp_free(b.ids);
}

/* Greedy decoding with a logit bias and penalties against a reference loop: the model run on each prefix,
 * the bias added, then each token's penalty by vLLM's formulas (written out per token here), then the
 * argmax. The penalties change the story (the test would prove nothing otherwise); a bias of +100 makes a
 * token every token; the reported logprob stays the model's own. */
Test(generate, logit_bias_and_penalties_match_a_reference_loop, .init = setup, .fini = teardown)
{
    enum { T = 24 };
    enc e = encode("Once upon a time, there was a little dog");
    const int32_t bias_ids[2] = {29, 410};
    const float bias[2] = {3.5f, -2.0f};
    const kvp_sampler_params sp[2] = {
        {.top_p = 1, .frequency_penalty = 0.7f, .presence_penalty = 0.4f, .repetition_penalty = 1.3f},
        {.top_p = 1, .frequency_penalty = -0.5f, .repetition_penalty = 0.8f}};
    for (int k = 0; k < 2; k++) {
        kvp_session_request r = greedy_req(e, T);
        r.sampler = sp[k];
        r.bias_ids = bias_ids;
        r.bias = bias;
        r.n_bias = 2;
        r.ignore_eos = 1;
        kvp_session_config cfg = kvp_session_config_default();
        kvp_session_result res, plain;
        run(&cfg, &r, 1, &res, NULL);
        kvp_session_request pr = greedy_req(e, T);
        pr.ignore_eos = 1;
        run(&cfg, &pr, 1, &plain, NULL);
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)(e.n + T));
        memcpy(seq, e.ids, sizeof(int32_t) * (size_t)e.n);
        int differs = 0;
        double lp_sum = 0;
        for (int t = 0; t < T; t++) {
            float l[512], raw[512];
            const int32_t *one[1] = {seq};
            int32_t len = e.n + t;
            next_logits(one, &len, 1, l);
            kvp_log_softmax(l, 512, raw);
            for (int i = 0; i < 2; i++) l[bias_ids[i]] += bias[i];
            const float rep = sp[k].repetition_penalty;
            for (int32_t v = 0; v < 512; v++) {
                int c = 0, seen = 0;
                for (int32_t i = e.n; i < len; i++) c += seq[i] == v;
                for (int32_t i = 0; i < len; i++) seen |= seq[i] == v;
                if (seen) l[v] = l[v] > 0.0f ? l[v] / rep : l[v] * rep;
                l[v] = l[v] - sp[k].frequency_penalty * (float)c;
                l[v] = l[v] - sp[k].presence_penalty * (c > 0 ? 1.0f : 0.0f);
            }
            int32_t best = 0;
            for (int32_t v = 1; v < 512; v++) best = l[v] > l[best] ? v : best;
            cr_assert_eq(res.tokens[0][t], best, "penalties %d token %d: %d, want %d", k, t, res.tokens[0][t], best);
            lp_sum += raw[best];
            seq[e.n + t] = best;
            differs |= best != plain.tokens[0][t];
        }
        cr_assert(differs, "penalties %d did not change the greedy story", k);
        cr_assert_float_eq(res.logprob[0], lp_sum, 1e-3, "the logprob is the model's, before bias and penalties");
        kvp_session_results_free(&res, 1);
        kvp_session_results_free(&plain, 1);
        free(seq);
    }
    /* +100 on one token: it is every token */
    kvp_session_request r = greedy_req(e, 6);
    const int32_t forced = 77;
    const float plus = 100.0f;
    r.bias_ids = &forced;
    r.bias = &plus;
    r.n_bias = 1;
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result res;
    run(&cfg, &r, 1, &res, NULL);
    for (int t = 0; t < 6; t++) cr_assert_eq(res.tokens[0][t], forced);
    kvp_session_results_free(&res, 1);
    /* refused: a bias out of range or vocabulary, penalties with beam search */
    const float huge = 101.0f;
    r.bias = &huge;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    r.bias = &plus;
    const int32_t outside = 512;
    r.bias_ids = &outside;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    r = greedy_req(e, 4);
    r.beam_width = 2;
    r.sampler.presence_penalty = 1.0f;
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, &r, 1, &res, NULL, NULL, NULL), KVP_EINVAL);
    kvp_free(e.ids);
}

/* --stop on the golden story (case 1): the text ends where the first stop string starts (a 5-byte string
 * from the middle of the story, most likely over two tokens, among two), the sample ends there (fewer tokens
 * computed than without), and seeded samples cut by stop strings are prefixes of their uncut runs. */
Test(generate_cli, stop_strings_end_the_samples)
{
    cJSON *gold;
    const cJSON *c1 = golden_case(&gold, 1);
    const char *prompt = cJSON_GetObjectItem(c1, "prompt")->valuestring;
    const char *story = cJSON_GetObjectItem(c1, "text")->valuestring + strlen(prompt);
    char stop[8], cmd[1024], *out, *err;
    snprintf(stop, sizeof stop, "%.5s", story + 60);
    const int cut = (int)(strstr(story, stop) - story);
    const char *runs[2][2] = {{"--max-tokens 64", "--stop 'qqqz' --stop '%s' --max-tokens 64"},
                              {"--max-tokens 40 --temperature 1 --n 3 --seed 2", "--stop ' the' --stop 'ed ' --max-tokens 40 --temperature 1 --n 3 --seed 2"}};
    for (int k = 0; k < 2; k++) {
        cJSON *j[2];
        for (int w = 0; w < 2; w++) {
            char opts[256];
            snprintf(opts, sizeof opts, runs[k][w], stop);
            snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '%s' --json %s", kvp_test_bin(), S260_GGUF, prompt, opts);
            cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
            cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j[w]), KVP_OK, "%s", out);
            free(out);
            free(err);
        }
        const cJSON *samples[2] = {cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j[0], "requests"), 0), "samples"),
                                   cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j[1], "requests"), 0), "samples")};
        int stopped = 0;
        for (int sm = 0; sm < cJSON_GetArraySize(samples[0]); sm++) {
            const cJSON *a = cJSON_GetArrayItem(samples[0], sm), *b = cJSON_GetArrayItem(samples[1], sm);
            const char *full = cJSON_GetObjectItem(a, "text")->valuestring, *text = cJSON_GetObjectItem(b, "text")->valuestring;
            cr_assert_eq(strncmp(full, text, strlen(text)), 0, "run %d sample %d: %s is no prefix of %s", k, sm, text, full);
            const cJSON *ss = cJSON_GetObjectItem(b, "stop_str");
            if (!ss) continue;
            stopped++;
            cr_assert_str_eq(cJSON_GetObjectItem(b, "finish_reason")->valuestring, "stopped");
            cr_assert_eq(strncmp(full + strlen(text), ss->valuestring, strlen(ss->valuestring)), 0, "run %d sample %d", k, sm);
            cr_assert_lt(cJSON_GetArraySize(cJSON_GetObjectItem(b, "tokens")), cJSON_GetArraySize(cJSON_GetObjectItem(a, "tokens")));
        }
        cr_assert_gt(stopped, 0, "run %d: no sample met a stop string", k);
        if (k == 0) {
            cr_assert_eq((int)strlen(cJSON_GetObjectItem(cJSON_GetArrayItem(samples[1], 0), "text")->valuestring), cut);
            cr_assert_lt(cJSON_GetObjectItem(cJSON_GetObjectItem(j[1], "totals"), "computed_tokens")->valueint,
                         cJSON_GetObjectItem(cJSON_GetObjectItem(j[0], "totals"), "computed_tokens")->valueint,
                         "the stop string ended the generation");
        }
        cJSON_Delete(j[0]);
        cJSON_Delete(j[1]);
    }
    cJSON_Delete(gold);
}

/* One prompt, one sample, plain text: the text is printed as it comes (streamed), and what ends on stdout is
 * the prompt, the text --json gives, and a newline, with stop strings (held back while they could still
 * cut the text), sampling, and bytes that split a character between steps. */
Test(generate_cli, streamed_text_equals_the_json_text)
{
    const char *runs[] = {"--max-tokens 64", "--max-tokens 200 --temperature 1 --seed 1",
                          "--max-tokens 200 --temperature 1.5 --seed 7",
                          "--max-tokens 120 --temperature 1 --seed 3 --stop ' the' --stop 'ed '",
                          "--max-tokens 80 --temperature 1 --seed 4 --stop 'e'"};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        char cmd[1024], *out[2], *err;
        for (int js = 0; js < 2; js++) {
            snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Once upon' %s %s", kvp_test_bin(), S260_GGUF,
                     runs[k], js ? "--json" : "");
            cr_assert_eq(kvp_test_sh(cmd, &out[js], &err), 0, "%s", err);
            free(err);
        }
        cJSON *j;
        cr_assert_eq(kvp_json_parse(out[1], strlen(out[1]), "generate output", &j), KVP_OK, "%s", out[1]);
        const char *text = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0), "text")->valuestring;
        cr_assert_gt(strlen(text), 0, "run %zu", k);
        char *want = NULL;
        cr_assert_gt(asprintf(&want, "Once upon%s\n", text), 0);
        cr_assert_str_eq(out[0], want, "run %zu", k);
        free(want);
        cJSON_Delete(j);
        free(out[0]);
        free(out[1]);
    }
}

/* --min-p 1 keeps only the likeliest token at each step: sampled at temperature 1 (any seed), the story is the
 * greedy one; --min-p outside [0, 1] is a usage error. */
Test(generate_cli, min_p_one_samples_the_greedy_story)
{
    char cmd[1024], *out[2], *err;
    const char *opts[2] = {"", "--temperature 1 --seed 11 --min-p 1"};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Once upon' --max-tokens 60 %s", kvp_test_bin(),
                 S260_GGUF, opts[k]);
        cr_assert_eq(kvp_test_sh(cmd, &out[k], &err), 0, "%s", err);
        free(err);
    }
    cr_assert_str_eq(out[1], out[0]);
    free(out[0]);
    free(out[1]);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt x --min-p 1.5", kvp_test_bin(), S260_GGUF);
    char *o, *e;
    cr_assert_eq(kvp_test_sh(cmd, &o, &e), 2);
    cr_assert(strstr(e, "--min-p"), "%s", e);
    free(o);
    free(e);
}
