/* n-gram speculative decoding in the generation loop (kvp_session_config.spec_tokens, runtime/engine/session.h) on stories260K:
 * the golden stories, results equal to decoding without it (greedy, sampled, penalized, biased, n > 1, stop ids,
 * log-probabilities; block sizes, caches, budgets, preemption, threads), rejected drafts' blocks given back,
 * only verified tokens offered to the prefix cache, kvp_session_stop_at, the config parser, allocation
 * failures, and the CLI (`generate --speculative-config`, stop strings). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"
#include "common/alloc.h"
#include "model_testutil.h"
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

/* A prompt that repeats itself (drafts are found from the start) and two that do not. */
static const char *const prompts[] = {
    "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a",
    "Once upon a time, there was a little girl named Lily. She",
    "The sun was shining",
};
enum { NP = 3 };

static int32_t *encode(const char *text, int32_t *n)
{
    int32_t *ids;
    cr_assert_eq(kvp_tok_encode(g_tok, text, strlen(text), 1, &ids, n), KVP_OK);
    return ids;
}

static kvp_session_config spec_cfg(int32_t k, int32_t nmin, int32_t nmax)
{
    kvp_session_config c = kvp_session_config_default();
    c.engine.spec.tokens = k;
    c.engine.spec.ngram_min = nmin;
    c.engine.spec.ngram_max = nmax;
    return c;
}

static void run(const kvp_session_config *cfg, const kvp_session_request *reqs, int32_t n, kvp_session_result *res,
                kvp_run_stats *st)
{
    cr_assert_eq(kvp_cpu_generate(g_model, cfg, reqs, n, res, st, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
}

static void expect_same_lp(const kvp_logprobs *a, const kvp_logprobs *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: %d vs %d places", what, a->n, b->n);
    cr_assert_eq(a->k, b->k, "%s", what);
    for (int32_t i = 0; i < a->n; i++) {
        cr_assert(a->lp[i] == b->lp[i] || (isnan(a->lp[i]) && isnan(b->lp[i])), "%s: place %d", what, i);
        for (int32_t j = 0; j < a->k; j++) {
            cr_assert_eq(a->top_ids[i * a->k + j], b->top_ids[i * a->k + j], "%s: place %d top %d", what, i, j);
            cr_assert_eq(a->top_lps[i * a->k + j], b->top_lps[i * a->k + j], "%s: place %d top %d", what, i, j);
        }
    }
}

/* Everything a caller sees of a result, bit for bit (times aside). */
static void expect_same(const kvp_session_result *a, const kvp_session_result *b, const char *what, int i)
{
    cr_assert_eq(a->n_samples, b->n_samples, "%s request %d", what, i);
    for (int s = 0; s < a->n_samples; s++) {
        cr_assert_eq(a->n_tokens[s], b->n_tokens[s], "%s request %d sample %d: %d vs %d tokens", what, i, s,
                     a->n_tokens[s], b->n_tokens[s]);
        for (int j = 0; j < a->n_tokens[s]; j++)
            cr_assert_eq(a->tokens[s][j], b->tokens[s][j], "%s request %d sample %d token %d", what, i, s, j);
        cr_assert_eq(a->finish[s], b->finish[s], "%s request %d sample %d finish", what, i, s);
        cr_assert_eq(a->stop_token[s], b->stop_token[s], "%s request %d sample %d", what, i, s);
        cr_assert_eq(a->logprob[s], b->logprob[s], "%s request %d sample %d: logprob %.17g vs %.17g", what, i, s,
                     a->logprob[s], b->logprob[s]);
        cr_assert_eq(!a->logprobs, !b->logprobs, "%s", what);
        if (a->logprobs) expect_same_lp(&a->logprobs[s], &b->logprobs[s], what);
    }
}

/* The n-gram lookup against a brute-force search over every (n, start) pair, on random token lists over 2 to 4
 * ids (so that matches are many and overlap). */
static int32_t brute_propose(const int32_t *t, int32_t len, int32_t nmin, int32_t nmax, int32_t max_out, int32_t *out)
{
    for (int32_t n = nmax; n >= nmin && n >= 1; n--) {
        int32_t earliest = -1, latest_enough = -1;
        for (int32_t j = 0; j + n <= len - 1; j++) { /* t[j, j + n) with a token after it */
            int same = 1;
            for (int32_t i = 0; i < n; i++) same &= t[j + i] == t[len - n + i];
            if (!same) continue;
            if (earliest < 0) earliest = j;
            if (len - (j + n) >= max_out) latest_enough = j;
        }
        const int32_t j = latest_enough >= 0 ? latest_enough : earliest;
        if (j < 0) continue;
        int32_t c = 0;
        for (; c < max_out && j + n + c < len; c++) out[c] = t[j + n + c];
        return c;
    }
    return 0;
}

Test(spec, ngram_lookup_matches_brute_force)
{
    kvp_rng rng;
    kvp_rng_seed(&rng, 42, 0);
    int found = 0;
    for (int it = 0; it < 20000; it++) {
        int32_t t[64], a[16], b[16];
        const int32_t len = 1 + (int32_t)(kvp_rng_next(&rng) % 60), ids = 2 + (int32_t)(kvp_rng_next(&rng) % 3);
        for (int32_t i = 0; i < len; i++) t[i] = (int32_t)(kvp_rng_next(&rng) % (uint64_t)ids);
        const int32_t nmin = 1 + (int32_t)(kvp_rng_next(&rng) % 5), nmax = nmin + (int32_t)(kvp_rng_next(&rng) % 4);
        const int32_t k = 1 + (int32_t)(kvp_rng_next(&rng) % 10);
        const int32_t na = kvp_ngram_propose(t, len, nmin, nmax, k, a), nb = brute_propose(t, len, nmin, nmax, k, b);
        cr_assert_eq(na, nb, "case %d (len %d, n %d..%d, k %d): %d vs %d drafts", it, len, nmin, nmax, k, na, nb);
        for (int32_t i = 0; i < na; i++) cr_assert_eq(a[i], b[i], "case %d draft %d", it, i);
        found += na > 0;
    }
    cr_assert_gt(found, 10000, "most lists should find a match");
    int32_t run[6] = {7, 7, 7, 7, 7, 7}, d[4];
    cr_assert_eq(kvp_ngram_propose(run, 6, 2, 3, 4, d), 3, "a run of 6: no 3-gram has 4 tokens after it, the earliest 3");
    cr_assert_eq(kvp_ngram_propose(run, 6, 1, 1, 4, d), 4, "the latest 1-gram with 4 after it");
    cr_assert_eq(kvp_ngram_propose(run, 1, 1, 3, 4, d), 0, "nothing before the last token");
}

/* The golden greedy stories, token for token, with drafts kept often enough that a step gains tokens. */
Test(spec, golden_stories, .init = setup, .fini = teardown)
{
    tu_golden g;
    tu_golden_load(&g);
    const int32_t conf[3][3] = {{4, 1, 3}, {16, 1, 64}, {1, 2, 2}};
    for (int c = 0; c < 3; c++) {
        kvp_session_config cfg = spec_cfg(conf[c][0], conf[c][1], conf[c][2]);
        kvp_session_result res[8];
        kvp_run_stats st;
        run(&cfg, g.reqs, g.n, res, &st);
        for (int i = 0; i < g.n; i++) {
            cr_assert_eq(res[i].n_tokens[0], g.nwant[i], "config %d case %d", c, i);
            for (int j = 0; j < g.nwant[i]; j++)
                cr_assert_eq(res[i].tokens[0][j], g.want[i][j], "config %d case %d token %d", c, i, j);
        }
        cr_assert_gt(st.spec_accepted_tokens, 0, "config %d: no draft kept", c);
        cr_assert_lt(st.spec_accepted_tokens, st.spec_draft_tokens, "config %d: every draft kept (none verified?)", c);
        cr_assert_lt(st.steps, g.nwant[0], "config %d: %lld steps for a %d-token story", c, (long long)st.steps, g.nwant[0]);
        cr_assert_eq(st.computed_tokens, st.prompt_tokens + st.generated_tokens - g.n + st.spec_draft_tokens -
                                             st.spec_accepted_tokens,
                     "config %d: rows = prompts + tokens fed back + rejected drafts", c);
        kvp_session_results_free(res, g.n);
    }
}

/* A batch of every kind of sampling request gives the same results, log-probabilities included, with and
 * without speculation, whatever the block size, cache, budget, cache size (preemption) and threads. */
Test(spec, results_equal_decoding_without_it, .init = setup, .fini = teardown)
{
    int32_t *ids[NP], n[NP];
    for (int i = 0; i < NP; i++) ids[i] = encode(prompts[i], &n[i]);
    const float bias[2] = {3.0f, -100.0f};
    int32_t bias_ids[2] = {ids[0][3], ids[0][5]}, stop_id = ids[0][4];
    enum { NR = 9 };
    kvp_session_request r[NR];
    for (int i = 0; i < NR; i++)
        r[i] = (kvp_session_request){.prompt = ids[i % NP], .n_prompt = n[i % NP], .max_tokens = 40 + 7 * i, .n = 1,
                                 .sampler = kvp_sampler_default()};
    r[1].sampler = (kvp_sampler_params){.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 7};
    r[2].sampler = (kvp_sampler_params){.temperature = 0.7, .top_k = 40, .top_p = 0.9, .seed = 3};
    r[2].n = 3;
    r[3].sampler.presence_penalty = 0.5f;
    r[3].sampler.frequency_penalty = 0.3f;
    r[4].sampler = (kvp_sampler_params){.temperature = 0.8, .top_p = 1.0, .seed = 11, .repetition_penalty = 1.3f};
    r[5].bias_ids = bias_ids, r[5].bias = bias, r[5].n_bias = 2;
    r[6].stop_ids = &stop_id, r[6].n_stop_ids = 1; /* a token the repeating prompt comes back to */
    r[7].logprobs = 1, r[7].top_logprobs = 3;
    r[7].sampler = (kvp_sampler_params){.temperature = 1.0, .top_p = 0.95, .seed = 2};
    r[8].min_tokens = 30;
    r[8].max_tokens = 120;
    kvp_session_config base = kvp_session_config_default();
    kvp_session_result ref[NR];
    run(&base, r, NR, ref, NULL);
    struct {
        int32_t k, nmin, nmax, bs, budget, blocks, threads;
        kvp_pc_kind cache;
    } v[] = {
        {4, 1, 3, 16, 2048, 0, 1, KVP_PC_RADIX}, {16, 1, 64, 1, 2048, 0, 1, KVP_PC_HASH},
        {2, 2, 4, 4, 12, 0, 1, KVP_PC_NONE},    {8, 1, 2, 4, 2048, 60, 1, KVP_PC_RADIX},
        {5, 1, 5, 16, 2048, 0, 2, KVP_PC_RADIX},
    };
    int64_t kept = 0, preempted = 0;
    for (size_t c = 0; c < sizeof v / sizeof v[0]; c++) {
        kvp_session_config cfg = spec_cfg(v[c].k, v[c].nmin, v[c].nmax);
        cfg.engine.block_size = v[c].bs;
        cfg.engine.max_batched_tokens = v[c].budget;
        cfg.num_blocks = v[c].blocks;
        cfg.engine.cache = v[c].cache;
        kvp_model_set_threads(g_model, v[c].threads);
        kvp_session_result got[NR];
        kvp_run_stats st;
        run(&cfg, r, NR, got, &st);
        kvp_model_set_threads(g_model, 1);
        char what[96];
        snprintf(what, sizeof what, "k %d n-gram %d..%d block %d budget %d", v[c].k, v[c].nmin, v[c].nmax, v[c].bs,
                 v[c].budget);
        for (int i = 0; i < NR; i++) expect_same(&ref[i], &got[i], what, i);
        cr_assert_gt(st.spec_draft_tokens, 0, "%s: nothing proposed", what);
        kept += st.spec_accepted_tokens;
        preempted += st.preemptions;
        kvp_session_results_free(got, NR);
    }
    cr_assert_gt(kept, 0);
    cr_assert_gt(preempted, 0, "60 blocks of 4 should preempt");
    kvp_session_results_free(ref, NR);
    for (int i = 0; i < NP; i++) free(ids[i]);
}

/* The slots of rejected drafts are truncated away after each step: a lone sequence (no prefix cache) holds
 * exactly the blocks of its computed tokens, and every block comes back at the end. */
Test(spec, rejected_drafts_give_their_blocks_back, .init = setup, .fini = teardown)
{
    int32_t n, *ids = encode(prompts[0], &n);
    for (int32_t bs = 1; bs <= 4; bs += 3) {
        kvp_session_config cfg = spec_cfg(6, 1, 3);
        cfg.engine.block_size = bs;
        cfg.num_blocks = 512 / bs;
        cfg.engine.cache = KVP_PC_NONE;
        kvp_session *s;
        cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK, "%s", kvp_error_detail());
        kvp_session_request r = {.prompt = ids, .n_prompt = n, .max_tokens = 150, .n = 1, .ignore_eos = 1,
                             .sampler = kvp_sampler_default()};
        int32_t id;
        cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK);
        int multi = 0;
        for (int32_t prev = 0; kvp_session_pending(s);) {
            cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
            const int32_t *t;
            int32_t ng;
            kvp_session_partial(s, id, 0, &t, &ng);
            kvp_session_stats st;
            kvp_session_stats_get(s, &st);
            multi += ng - prev > 1;
            prev = ng;
            if (st.running_seqs == 0) break;
            const int32_t held = st.num_blocks - st.free_blocks, computed = n + ng - 1;
            cr_assert_eq(held, (computed + bs - 1) / bs, "block %d: %d blocks held for %d computed tokens", bs, held,
                         computed);
        }
        cr_assert_gt(multi, 0, "block %d: no step gained several tokens", bs);
        kvp_session_stats st;
        kvp_session_stats_get(s, &st);
        cr_assert_gt(st.spec_draft_tokens, st.spec_accepted_tokens, "block %d: no draft rejected", bs);
        cr_assert_eq(st.free_blocks, st.num_blocks);
        kvp_session_result res;
        cr_assert_eq(kvp_session_take(s, &id, &res), KVP_OK);
        cr_assert_eq(res.n_tokens[0], 150);
        kvp_session_results_free(&res, 1);
        kvp_session_destroy(s);
    }
    free(ids);
}

/* A finished speculating sequence offers only verified tokens to the prefix cache: the next turn (its prompt
 * and answer) finds them and generates what it generates with no cache. */
Test(spec, the_next_turn_finds_the_verified_answer_cached, .init = setup, .fini = teardown)
{
    int32_t n, *ids = encode(prompts[0], &n);
    kvp_session_config cfg = spec_cfg(8, 1, 4);
    cfg.num_blocks = 128;
    cfg.engine.block_size = 4;
    kvp_session_stats st;
    tu_next_turn(g_model, &cfg, ids, n, 61, NULL, 0, &st);
    cr_assert_gt(st.spec_draft_tokens, st.spec_accepted_tokens, "drafts were rejected (their K/V must not be cached)");
    cr_assert_gt(st.spec_accepted_tokens, 0);
    free(ids);
}

/* kvp_session_stop_at inside a step that added several tokens: the sample keeps n_keep of them, with the
 * log-probabilities and cumulative logprob of a run without speculation stopped there; a sample that finished
 * in that step is cut too (and becomes STOPPED); an earlier step's tokens are kept. */
Test(spec, stop_at_cuts_inside_a_step, .init = setup, .fini = teardown)
{
    int32_t n, *ids = encode(prompts[0], &n);
    kvp_session_request r = {.prompt = ids, .n_prompt = n, .max_tokens = 60, .n = 1, .logprobs = 1, .top_logprobs = 2,
                         .sampler = {.temperature = 0.5, .top_p = 1.0, .seed = 9}};
    kvp_session_config cfg = spec_cfg(8, 1, 4);
    cfg.num_blocks = 64;
    kvp_session *s;
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK);
    int32_t id, before = 0, after = 0;
    cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK);
    const int32_t *t;
    while (after - before < 3) { /* a step that adds 3 tokens or more */
        before = after;
        cr_assert(kvp_session_pending(s), "no step added 3 tokens");
        cr_assert_eq(kvp_session_step(s), KVP_OK);
        kvp_session_partial(s, id, 0, &t, &after);
    }
    cr_assert_eq(kvp_session_stop_at(s, id, 0, before + 1), KVP_OK);
    cr_assert_eq(kvp_session_stop_at(s, id, 0, before + 1), KVP_ENOTFOUND, "stopped already");
    kvp_session_result got, ref;
    cr_assert_eq(kvp_session_take(s, &id, &got), KVP_OK);
    kvp_session_destroy(s);
    /* the reference: no speculation, stopped when it had before + 1 tokens */
    kvp_session_config plain = kvp_session_config_default();
    plain.num_blocks = 64;
    cr_assert_eq(kvp_cpu_session_create(g_model, &plain, &s), KVP_OK);
    cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK);
    for (int32_t k = 0; k < before + 1;) {
        cr_assert_eq(kvp_session_step(s), KVP_OK);
        kvp_session_partial(s, id, 0, &t, &k);
    }
    cr_assert_eq(kvp_session_stop(s, id, 0), KVP_OK);
    cr_assert_eq(kvp_session_take(s, &id, &ref), KVP_OK);
    kvp_session_destroy(s);
    cr_assert_eq(ref.n_tokens[0], before + 1);
    expect_same(&ref, &got, "stopped inside a speculative step", 0);
    cr_assert_eq(got.finish[0], KVP_FINISH_STOPPED);
    kvp_session_results_free(&got, 1);
    kvp_session_results_free(&ref, 1);

    /* a last step (max_tokens reached) that adds several tokens: the finished sample is cut to one of them */
    cr_assert_eq(kvp_cpu_session_create(g_model, &cfg, &s), KVP_OK);
    r.sampler = kvp_sampler_default();
    for (r.max_tokens = 16; r.max_tokens < 60; r.max_tokens++) {
        cr_assert_eq(kvp_session_add(s, &r, &id), KVP_OK);
        after = 0;
        while (kvp_session_pending(s)) {
            before = after;
            cr_assert_eq(kvp_session_step(s), KVP_OK);
            kvp_session_partial(s, id, 0, &t, &after);
        }
        if (after - before >= 2) break;
        cr_assert_eq(kvp_session_take(s, &id, &got), KVP_OK);
        kvp_session_results_free(&got, 1);
    }
    cr_assert_lt(r.max_tokens, 60, "no run ended with a step of several tokens");
    cr_assert_eq(after, r.max_tokens);
    cr_assert_eq(kvp_session_stop_at(s, id, 0, before + 1), KVP_OK);
    cr_assert_eq(kvp_session_take(s, &id, &got), KVP_OK);
    cr_assert_eq(got.n_tokens[0], before + 1);
    cr_assert_eq(got.finish[0], KVP_FINISH_STOPPED);
    cr_assert_eq(got.logprobs[0].n, before + 1);
    kvp_session_results_free(&got, 1);
    /* and one whose cut would reach an earlier step's tokens stops keeping them all */
    int32_t next;
    cr_assert_eq(kvp_session_add(s, &r, &next), KVP_OK);
    after = 0;
    while (after < 8) {
        before = after;
        cr_assert_eq(kvp_session_step(s), KVP_OK);
        kvp_session_partial(s, next, 0, &t, &after);
    }
    cr_assert_eq(kvp_session_stop_at(s, next, 0, before - 1), KVP_OK);
    cr_assert_eq(kvp_session_take(s, &id, &got), KVP_OK);
    cr_assert_eq(id, next);
    cr_assert_eq(got.n_tokens[0], after, "an earlier step's tokens are kept");
    cr_assert_eq(got.finish[0], KVP_FINISH_STOPPED);
    kvp_session_results_free(&got, 1);
    kvp_session_destroy(s);
    free(ids);
}

Test(spec, config_parse_and_refusals, .init = setup, .fini = teardown)
{
    kvp_session_config c = kvp_session_config_default();
    cr_assert_eq(kvp_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}", &c.engine.spec),
                 KVP_OK, "%s", kvp_error_detail());
    cr_assert(c.engine.spec.tokens == 5 && c.engine.spec.ngram_max == 4 && c.engine.spec.ngram_min == 4, "min follows max");
    cr_assert_eq(kvp_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, \"prompt_lookup_min\": 2, "
                                    "\"prompt_lookup_max\": 3}", &c.engine.spec), KVP_OK);
    cr_assert(c.engine.spec.tokens == 2 && c.engine.spec.ngram_min == 2 && c.engine.spec.ngram_max == 3);
    cr_assert_eq(kvp_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"disable_by_batch_size\": 8}",
                                    &c.engine.spec), KVP_OK);
    cr_assert(c.engine.spec.ngram_min == 5 && c.engine.spec.ngram_max == 5, "vLLM's defaults");
    cr_assert_eq(c.engine.spec.max_batch, 8);
    cr_assert_eq(kvp_spec_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 3}", &c.engine.spec), KVP_OK);
    cr_assert_eq(c.engine.spec.max_batch, 0, "no batch limit unless given");
    const struct {
        const char *json, *says;
    } bad[] = {
        {"{\"method\": \"ngram\", ", "speculative config"},
        {"[1]", "not a JSON object"},
        {"{\"method\": \"eagle\", \"num_speculative_tokens\": 3}", "\"eagle\", not \"ngram\""},
        {"{\"num_speculative_tokens\": 3}", "missing"},
        {"{\"method\": \"ngram\"}", "num_speculative_tokens\" is required"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "is 0, not in 1..16"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 17}", "is 17, not in 1..16"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 2.5}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 4, \"prompt_lookup_max\": 2}",
         "prompt_lookup_min 4 is above prompt_lookup_max 2"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"model\": \"x\"}", "unknown key \"model\""},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 65}", "is 65, not in 1..64"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"disable_by_batch_size\": 0}", "disable_by_batch_size\" is 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_session_config before = c;
        cr_assert_neq(kvp_spec_parse(bad[i].json, &c.engine.spec), KVP_OK, "%s was taken", bad[i].json);
        cr_assert(strstr(kvp_error_message(), bad[i].says), "%s: %s", bad[i].json, kvp_error_message());
        cr_assert(memcmp(&before, &c, sizeof c) == 0, "%s changed the config", bad[i].json);
    }
    kvp_session *s;
    c = spec_cfg(17, 1, 3);
    c.num_blocks = 8;
    cr_assert_eq(kvp_cpu_session_create(g_model, &c, &s), KVP_EINVAL);
    c = spec_cfg(3, 4, 2);
    c.num_blocks = 8;
    cr_assert_eq(kvp_cpu_session_create(g_model, &c, &s), KVP_EINVAL);
}

/* disable_by_batch_size B: a step that starts with more than B running sequences proposes nothing. Six
 * greedy requests of one prompt run together to the end: with B = 5 never a draft, with B = 6 drafts. */
Test(spec, no_drafts_above_the_batch_limit, .init = setup, .fini = teardown)
{
    int32_t n, *ids = encode(prompts[0], &n);
    kvp_session_request r[6];
    for (int i = 0; i < 6; i++)
        r[i] = (kvp_session_request){.prompt = ids, .n_prompt = n, .max_tokens = 40, .n = 1, .ignore_eos = 1,
                                 .sampler = kvp_sampler_default()};
    kvp_session_result ref[6], got[6];
    kvp_run_stats st;
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.cache = KVP_PC_NONE; /* all six prefill in the first step */
    run(&cfg, r, 6, ref, NULL);
    for (int32_t b = 5; b <= 6; b++) {
        cfg = spec_cfg(4, 1, 3);
        cfg.engine.cache = KVP_PC_NONE;
        cfg.engine.spec.max_batch = b;
        run(&cfg, r, 6, got, &st);
        for (int i = 0; i < 6; i++) expect_same(&ref[i], &got[i], "batch limit", i);
        if (b == 5) cr_assert_eq(st.spec_draft_tokens, 0, "6 running > 5: no draft");
        else cr_assert_gt(st.spec_accepted_tokens, 0, "6 running <= 6: drafts kept");
        kvp_session_results_free(got, 6);
    }
    kvp_session_results_free(ref, 6);
    free(ids);
}

typedef struct {
    kvp_session_request r;
    kvp_session_config cfg;
} spec_run;

static kvp_status make_run(void *ctx, void **obj)
{
    spec_run *x = ctx;
    kvp_session_result *res = malloc(sizeof *res);
    kvp_run_stats st;
    kvp_status s = kvp_cpu_generate(g_model, &x->cfg, &x->r, 1, res, &st, NULL, NULL);
    if (s != KVP_OK) {
        free(res);
        return s;
    }
    cr_assert_gt(st.spec_accepted_tokens, 0);
    *obj = res;
    return KVP_OK;
}

static void destroy_run(void *obj)
{
    kvp_session_results_free(obj, 1);
    free(obj);
}

/* A speculating run with n = 2 samples and log-probabilities fails cleanly at every allocation. */
Test(spec, fails_cleanly_at_every_allocation, .init = setup, .fini = teardown)
{
    int32_t n, *ids = encode(prompts[0], &n);
    spec_run x = {.r = {.prompt = ids, .n_prompt = n, .max_tokens = 12, .n = 2, .logprobs = 1, .top_logprobs = 1,
                        .sampler = {.temperature = 0.3, .top_p = 1.0, .seed = 4}},
                  .cfg = spec_cfg(4, 1, 3)};
    x.cfg.engine.block_size = 2;
    x.cfg.engine.cache = KVP_PC_NONE; /* a finished sequence's blocks offered to a cache may fail quietly (lost hits) */
    tu_every_alloc_failure("speculating run", make_run, destroy_run, &x, 0);
    free(ids);
}

/* `generate --speculative-config` prints what it prints without (tokens, text, finish reasons, stop strings
 * that land inside a step's tokens), plus the drafts' totals; a bad config exits 2 naming the problem. */
Test(spec_cli, generate_with_and_without)
{
    tu_require_shared();
    static char out[2][1 << 18], err[1 << 16];
    /* greedy: "her ball" comes inside a step's kept drafts (the tokens after it must not stay) */
    const char *common = "generate --model " S260_GGUF " --json --max-tokens 60 --n 2 "
                         "--prompt 'Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a' "
                         "--prompt 'One day, a cat' --stop 'her ball' --stop 'park'";
    char cmd[1024];
    for (int w = 0; w < 2; w++) {
        snprintf(cmd, sizeof cmd, "%s%s", common,
                 w ? " --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 6, "
                     "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}'" : "");
        cr_assert_eq(kvp_test_cli(cmd, out[w], sizeof out[w], err, sizeof err), 0, "%s\n%s", cmd, err);
    }
    cJSON *a = cJSON_Parse(out[0]), *b = cJSON_Parse(out[1]);
    cr_assert(a && b);
    const cJSON *ra = cJSON_GetObjectItem(a, "requests"), *rb = cJSON_GetObjectItem(b, "requests");
    /* per request: the same samples; the timings differ */
    cr_assert_eq(cJSON_GetArraySize(ra), 2);
    int stopped = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(ra, i), *y = cJSON_GetArrayItem(rb, i);
        const cJSON *xs = cJSON_GetObjectItem(x, "samples"), *ys = cJSON_GetObjectItem(y, "samples");
        cr_assert_eq(cJSON_GetArraySize(xs), 2);
        for (int k = 0; k < 2; k++) {
            const cJSON *p = cJSON_GetArrayItem(xs, k), *q = cJSON_GetArrayItem(ys, k);
            static const char *const keys[] = {"tokens", "text", "finish_reason", "logprob", "stop_str"};
            for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++) {
                const cJSON *u = cJSON_GetObjectItem(p, keys[j]), *v = cJSON_GetObjectItem(q, keys[j]);
                cr_assert((!u && !v) || (u && v && cJSON_Compare(u, v, 1)), "request %d sample %d: %s differs", i, k,
                          keys[j]);
            }
            const cJSON *f = cJSON_GetObjectItem(p, "finish_reason");
            stopped += cJSON_IsString(f) && strcmp(f->valuestring, "stopped") == 0;
        }
    }
    cr_assert_gt(stopped, 0, "a stop string should end a sample");
    const cJSON *t = cJSON_GetObjectItem(b, "totals");
    cr_assert_gt(kvp_test_num(t, "spec_accepted_tokens"), 0);
    cr_assert_gt(kvp_test_num(t, "spec_draft_tokens"), kvp_test_num(t, "spec_accepted_tokens"));
    cr_assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(a, "totals"), "spec_draft_tokens"));
    cJSON_Delete(a);
    cJSON_Delete(b);
    int rc = kvp_test_cli("generate --model " S260_GGUF " --prompt x --speculative-config '{\"method\": \"medusa\", "
                          "\"num_speculative_tokens\": 2}'", out[0], sizeof out[0], err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "\"medusa\", not \"ngram\""), "%s", err);
    rc = kvp_test_cli("generate --model " S260_GGUF " --prompt x --speculative-config '{\"method\": \"ngram\"'",
                      out[0], sizeof out[0], err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "speculative config"), "%s", err);
}
