/* The engine (runtime/engine/engine.h) with the cpu executor on stories260K: the golden greedy stories come out of
 * the scheduler's continuous batching, with a prefix cache and its host tier, and with swap and recompute
 * preemption. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/json.h"
#include "model_testutil.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/engine/engine.h"
#include "runtime/workload/workload.h"

typedef struct {
    int32_t prompt[64], np, want[512], nwant;
} gcase;

static int load_cases(gcase *cs)
{
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    int n = 0;
    const cJSON *c, *x;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
    {
        gcase *g = &cs[n++];
        g->np = 0;
        int nw = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "prompt_tokens")) g->prompt[g->np++] = x->valueint;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "tokens_after_bos")) g->want[nw++] = x->valueint;
        g->nwant = nw - (g->np - 1);
        memmove(g->want, g->want + g->np - 1, sizeof(int32_t) * (size_t)g->nwant);
    }
    cJSON_Delete(gold);
    return n;
}

/* Request i's tokens (the engine's index: requests arrive in id order here). */
static void tokens_of(const kvp_engine *e, int64_t i, const int32_t **toks, int32_t *nt)
{
    kvp_sample_view v;
    cr_assert_eq(kvp_engine_sample(e, i, 0, &v), KVP_OK);
    *toks = v.tokens;
    *nt = v.n_tokens;
}

/* Runs w through an engine on the cpu executor (KV cache sized from cfg, whose step budget, length limit and
 * watermark are set here, and whose invariants are checked after every step), checks that every request
 * finished with no block leaked, and returns the metrics; *ex and *e are the caller's to destroy. */
static kvp_engine_metrics run_on_cpu(kvp_model *m, kvp_engine_config *cfg, const kvp_workload *w, kvp_executor *ex,
                                     kvp_engine **e)
{
    cfg->max_model_len = 512;
    cfg->max_batched_tokens = 64;
    cfg->watermark_blocks = 0;
    cfg->check_every_step = true;
    cfg->keep_outputs = true; /* the tokens are read after the run */
    cr_assert_eq(kvp_cpu_executor_create(m, (int32_t)(cfg->kv_slots / cfg->block_size), cfg->block_size,
                                         (int32_t)kvp_engine_host_blocks(cfg), KVP_DTYPE_F32, ex),
                 KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_engine_create(cfg, ex, e), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_engine_run(*e, w->reqs, w->n, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    kvp_engine_metrics met;
    cr_assert_eq(kvp_engine_metrics_get(*e, &met), KVP_OK);
    cr_assert_eq(met.finished, w->n);
    cr_assert_eq(met.leaked_blocks, 0);
    return met;
}

/* preempt: the KV memory is meant to force preemption (by swap when host_slots > 0, else by recompute).
 * tier: host tier of the prefix cache in tokens (0: none); it is then meant to serve loads. */
static void run_engine(kvp_model *m, int32_t block_size, int64_t kv_slots, int64_t host_slots, kvp_pc_kind cache,
                       int copies, double gap_s, int preempt, int64_t tier)
{
    gcase cs[8];
    int n = load_cases(cs);
    kvp_workload *w;
    cr_assert_eq(kvp_workload_create("golden", &w), KVP_OK);
    for (int k = 0; k < copies; k++)
        for (int i = 0; i < n; i++) {
            kvp_request r = {.id = k * n + i, .arrival_s = gap_s * k, .prompt_len = cs[i].np, .output_len = cs[i].nwant};
            cr_assert_eq(kvp_workload_add(w, &r, cs[i].prompt), KVP_OK);
        }
    kvp_engine_config cfg;
    kvp_engine_config_default(&cfg);
    cfg.block_size = block_size;
    cfg.kv_slots = kv_slots;
    cfg.host_slots = host_slots;
    cfg.preempt = host_slots > 0 ? KVP_PREEMPT_SWAP : KVP_PREEMPT_RECOMPUTE;
    cfg.cache = cache;
    cfg.host_cache_slots = tier;
    kvp_executor ex;
    kvp_engine *e;
    kvp_engine_metrics met = run_on_cpu(m, &cfg, w, &ex, &e);
    if (preempt) cr_assert_gt(host_slots > 0 ? met.swap_outs : met.recomputes, 0, "the KV memory was meant to force %s",
                              host_slots > 0 ? "swapping" : "recomputation");
    if (cache != KVP_PC_NONE && copies > 1 && tier == 0) cr_assert_gt(met.prefix_hit_tokens, 0);
    if (tier > 0) {
        cr_assert_gt(met.host_loaded_blocks, 0, "the host tier was meant to serve loads");
        cr_assert_gt(met.host_stored_blocks, 0);
    }
    for (int k = 0; k < copies; k++)
        for (int i = 0; i < n; i++) {
            const int32_t *toks;
            int32_t nt;
            tokens_of(e, k * n + i, &toks, &nt);
            cr_assert_eq(nt, cs[i].nwant, "request %d: %d tokens, want %d", k * n + i, nt, cs[i].nwant);
            for (int j = 0; j < nt; j++)
                cr_assert_eq(toks[j], cs[i].want[j], "block %d request %d token %d: %d want %d", block_size, k * n + i,
                             j, toks[j], cs[i].want[j]);
        }
    kvp_engine_destroy(e);
    kvp_executor_destroy(&ex);
    kvp_workload_destroy(w);
}

Test(cpu_executor, engine_reproduces_the_golden_stories)
{
    tu_require_shared();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260_GGUF, &m), KVP_OK, "%s", kvp_error_detail());
    run_engine(m, 16, 4096, 0, KVP_PC_NONE, 1, 0.0, 0, 0);
    run_engine(m, 4, 4096, 0, KVP_PC_RADIX, 2, 0.5, 0, 0); /* the second copies arrive later and hit the cache */
    run_engine(m, 16, 18 * 16, 40 * 16, KVP_PC_NONE, 2, 0.0, 1, 0); /* two 257-token stories in 18 blocks: swap */
    /* the same without host blocks: a preempted story is recomputed, prompt and generated tokens together */
    run_engine(m, 16, 18 * 16, 0, KVP_PC_NONE, 2, 0.0, 1, 0);
    /* the cached blocks leave the small device memory and come back from the host tier: the KV they bring
     * must be exactly what computing them gives, or the stories change (here preempted sequences find
     * their own blocks there when readmitted) */
    run_engine(m, 4, 18 * 16, 0, KVP_PC_RADIX, 3, 0.0, 1, 400 * 4);
    run_engine(m, 4, 18 * 16, 0, KVP_PC_HASH, 3, 0.0, 1, 400 * 4);
    kvp_model_destroy(m);
}

/* Prompts cut from the golden story continue it greedily. Many of them at once in a small KV memory with
 * swap preemption: their prefix blocks leave the device cache, come back from the host tier at admission,
 * and the continuations stay the story's; the tier's host ids follow the swap space's. Write-back stores a
 * block as it is evicted, in the step that may reuse it: a store run after that step's writes would bring
 * back another block's KV. */
static void host_tier_story(kvp_hc_write_policy policy)
{
    tu_require_shared();
    gcase cs[8];
    load_cases(cs);
    int32_t story[257];
    story[0] = cs[0].prompt[0];
    memcpy(story + 1, cs[0].want, 256 * sizeof *story);
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260_GGUF, &m), KVP_OK, "%s", kvp_error_detail());
    kvp_workload *w;
    cr_assert_eq(kvp_workload_create("story", &w), KVP_OK);
    static const int32_t lens[] = {40, 80, 120, 160, 200};
    enum { COPIES = 4, OUT = 32 };
    for (int k = 0; k < COPIES; k++)
        for (int i = 0; i < 5; i++) {
            kvp_request r = {.id = k * 5 + i, .arrival_s = 0, .prompt_len = lens[i], .output_len = OUT};
            cr_assert_eq(kvp_workload_add(w, &r, story), KVP_OK);
        }
    kvp_engine_config cfg;
    kvp_engine_config_default(&cfg);
    cfg.block_size = 4;
    cfg.kv_slots = 80 * 4;
    cfg.host_slots = 200 * 4;
    cfg.preempt = KVP_PREEMPT_SWAP;
    cfg.cache = KVP_PC_RADIX;
    cfg.host_cache_slots = 400 * 4;
    cfg.host_write_policy = policy;
    kvp_executor ex;
    kvp_engine *e;
    kvp_engine_metrics met = run_on_cpu(m, &cfg, w, &ex, &e);
    cr_assert_gt(met.swap_outs, 0, "the KV memory was meant to force swapping");
    cr_assert_gt(met.host_hit_tokens, 0, "%s: prompts were meant to be found in the host tier",
                 kvp_hc_write_policy_name(policy));
    for (int r = 0; r < COPIES * 5; r++) {
        const int32_t *toks;
        int32_t nt, L = lens[r % 5];
        tokens_of(e, r, &toks, &nt);
        cr_assert_eq(nt, OUT);
        for (int j = 0; j < nt; j++)
            cr_assert_eq(toks[j], story[L + j], "%s: request %d (prompt %d) token %d: %d, the story has %d",
                         kvp_hc_write_policy_name(policy), r, L, j, toks[j], story[L + j]);
    }
    kvp_engine_destroy(e);
    kvp_executor_destroy(&ex);
    kvp_workload_destroy(w);
    kvp_model_destroy(m);
}

Test(cpu_executor, host_tier_loads_exact_kv)
{
    host_tier_story(KVP_HC_WRITE_THROUGH);
    host_tier_story(KVP_HC_WRITE_BACK);
}

Test(cpu_executor, rejects_a_mismatched_block_size)
{
    tu_require_shared();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260_GGUF, &m), KVP_OK);
    kvp_executor ex;
    cr_assert_eq(kvp_cpu_executor_create(m, 64, 8, 0, KVP_DTYPE_F32, &ex), KVP_OK);
    int32_t toks[2] = {1, 403}, table[1] = {0}, pos[2] = {0, 1}, qo[2] = {0, 2}, kvi[2] = {0, 1}, last[1] = {2};
    int64_t slots[2] = {0, 1};
    kvp_exec_seq s = {.req_id = 0, .context_len = 0, .num_new = 2, .sample = 1, .tokens = toks, .block_table = table,
                      .num_blocks = 1};
    kvp_exec_batch b = {.seqs = &s, .n = 1, .block_size = 16,
                        .flat = {.num_tokens = 2, .tokens = toks, .positions = pos, .slot_mapping = slots,
                                 .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = table, .kv_last_page_len = last,
                                 .num_rows = 1}};
    kvp_exec_result r = {0};
    cr_assert_eq(ex.step(ex.ctx, &b, &r), KVP_EINVAL);
    b.block_size = 8;
    cr_assert_eq(ex.step(ex.ctx, &b, &r), KVP_OK, "%s", kvp_error_detail());
    cr_assert_not_null(r.logits);
    cr_assert_eq(kvp_argmax(r.logits, r.vocab), 407); /* "Once" -> " upon" */
    cr_assert_gt(r.time_s, 0);
    s.tokens = NULL;
    cr_assert_eq(ex.step(ex.ctx, &b, &r), KVP_EUNSUPPORTED);
    kvp_executor_destroy(&ex);
    kvp_model_destroy(m);
}
