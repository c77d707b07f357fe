/* One engine, three paths: with every request present at t = 0, the schedule does not depend on step times,
 * so `simulate` (the sim executor, a cost model), `simulate --executor cpu` (the model on the CPU, through
 * kvp_engine_run) and the session path of `generate` and `serve` (kvp_session over the cpu executor) must
 * make the same schedule step for step: which sequences run, from where and how many tokens each, the
 * preemptions, the prefix hits and the evictions. The workload is a stories260K one whose answers are the
 * model's own greedy tokens (computed first), so the three paths see the same token ids: the trace paths
 * replay them as known answers, the session generates them. The KV memory is tight enough to preempt and
 * evict. A recording executor wraps each path's executor; the test fails on the first step that differs. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model_testutil.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/session.h"
#include "runtime/executor/cost_model.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/gpu_profile.h"
#include "runtime/executor/sim_executor.h"

enum { NREQ = 10, OUT = 24, MAXSTEPS = 2048, MAXB = 16, BS = 4, NBLOCKS = 40 };

typedef struct {
    int64_t id;
    int32_t ctx, nn;
} rec_seq;

typedef struct {
    int n;
    rec_seq s[MAXB];
    int32_t n_copies, n_swap; /* the step's block moves */
    int64_t preemptions, hit_tokens, evicted; /* the engine's counts after the step */
} rec_step;

typedef struct {
    kvp_executor inner;
    const kvp_engine *e; /* set once the engine exists */
    int nsteps;
    rec_step *steps;     /* [MAXSTEPS] */
} recorder;

static kvp_status rec_run(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    recorder *r = ctx;
    cr_assert_lt(r->nsteps, MAXSTEPS);
    cr_assert_leq(b->n, MAXB);
    rec_step *st = &r->steps[r->nsteps++];
    memset(st, 0, sizeof *st);
    st->n = b->n;
    for (int i = 0; i < b->n; i++) st->s[i] = (rec_seq){b->seqs[i].req_id, b->seqs[i].context_len, b->seqs[i].num_new};
    st->n_copies = b->ops.n_copies;
    st->n_swap = b->ops.n_swap_out + b->ops.n_swap_in;
    return r->inner.step(r->inner.ctx, b, out);
}

static void rec_destroy(void *ctx)
{
    recorder *r = ctx;
    kvp_executor_destroy(&r->inner);
}

static void rec_parallel(void *ctx, int n, void (*fn)(void *, int), void *arg)
{
    recorder *r = ctx;
    r->inner.parallel(r->inner.ctx, n, fn, arg);
}

static int rec_threads(void *ctx)
{
    recorder *r = ctx;
    return r->inner.threads ? r->inner.threads(r->inner.ctx) : 1;
}

/* An executor that records every batch and runs it on inner (owned). */
static kvp_executor recording(recorder *r, kvp_executor inner)
{
    r->inner = inner;
    r->nsteps = 0;
    r->steps = calloc(MAXSTEPS, sizeof *r->steps);
    cr_assert_not_null(r->steps);
    return (kvp_executor){.name = "recorder", .ctx = r, .flat = inner.flat, .step = rec_run, .destroy = rec_destroy,
                          .parallel = inner.parallel ? rec_parallel : NULL, .threads = inner.threads ? rec_threads : NULL};
}

/* After each step: the engine's counts, into the step just recorded. */
static void note_counts(recorder *r)
{
    if (r->nsteps == 0) return;
    kvp_engine_counts c;
    kvp_engine_counts_get(r->e, &c);
    rec_step *st = &r->steps[r->nsteps - 1];
    st->preemptions = c.preemptions;
    st->hit_tokens = c.prefix_hit_tokens;
    st->evicted = c.evicted_blocks;
}

static kvp_status on_step(void *ctx, const kvp_engine *e, const kvp_step_info *info)
{
    (void)e, (void)info;
    note_counts(ctx);
    return KVP_OK;
}

static kvp_model *g_model;
static int32_t g_prompt[NREQ][64], g_np[NREQ], g_answer[NREQ][OUT];

/* Ten prompts cut from the golden story, two pairs sharing long prefixes (prefix hits), and each one's
 * greedy answer of OUT tokens. */
static void setup(void)
{
    tu_require_shared();
    cr_assert_eq(kvp_model_load(S260_GGUF, &g_model), KVP_OK, "%s", kvp_error_detail());
    tu_golden g;
    tu_golden_load(&g);
    int32_t story[300];
    story[0] = g.reqs[0].prompt[0];
    memcpy(story + 1, g.want[0], 256 * sizeof *story);
    static const int32_t from[NREQ] = {0, 0, 30, 30, 60, 90, 120, 10, 150, 45};
    static const int32_t len[NREQ] = {40, 44, 30, 36, 25, 33, 28, 41, 22, 37};
    kvp_session_request reqs[NREQ];
    for (int i = 0; i < NREQ; i++) {
        g_np[i] = len[i];
        g_prompt[i][0] = story[0];
        memcpy(g_prompt[i] + 1, story + 1 + from[i], (size_t)(len[i] - 1) * sizeof(int32_t));
        reqs[i] = (kvp_session_request){.prompt = g_prompt[i], .n_prompt = len[i], .max_tokens = OUT, .n = 1,
                                        .ignore_eos = 1, .sampler = kvp_sampler_default()};
    }
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session_result res[NREQ];
    cr_assert_eq(kvp_cpu_generate(g_model, &cfg, reqs, NREQ, res, NULL, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    for (int i = 0; i < NREQ; i++) {
        cr_assert_eq(res[i].n_tokens[0], OUT);
        memcpy(g_answer[i], res[i].tokens[0], OUT * sizeof(int32_t));
    }
    kvp_session_results_free(res, NREQ);
}

static void teardown(void) { kvp_model_destroy(g_model); }

/* The engine configuration of all three paths: tight memory, small steps, a radix cache. */
static kvp_engine_config engine_cfg(void)
{
    kvp_engine_config c;
    kvp_engine_config_default(&c);
    c.block_size = BS;
    c.kv_slots = NBLOCKS * BS;
    c.cache = KVP_PC_RADIX;
    c.max_batched_tokens = 48;
    c.max_num_seqs = 8;
    c.max_model_len = kvp_model_max_len(g_model);
    c.check_every_step = true;
    return c;
}

/* A trace path: the requests with their known answers through kvp_engine_run on executor ex (owned). */
static void trace_run(recorder *r, kvp_executor ex)
{
    kvp_request reqs[NREQ];
    for (int i = 0; i < NREQ; i++)
        reqs[i] = (kvp_request){.id = i, .tokens = g_prompt[i], .prompt_len = g_np[i], .output_len = OUT,
                                .output_tokens = g_answer[i]};
    kvp_engine_config c = engine_cfg();
    c.on_step = on_step;
    c.on_step_ctx = r;
    kvp_executor rx = recording(r, ex);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &rx, &e), KVP_OK, "%s", kvp_error_detail());
    r->e = e;
    cr_assert_eq(kvp_engine_run(e, reqs, NREQ, NULL, NULL), KVP_OK, "%s", kvp_error_detail());
    kvp_engine_destroy(e);
    kvp_executor_destroy(&rx);
}

/* The session path: the same requests generated for a client (greedy, EOS ignored). */
static void session_run(recorder *r)
{
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine = engine_cfg();
    cfg.num_blocks = NBLOCKS;
    const kvp_model_config *mc = kvp_model_cfg(g_model);
    int32_t eos[KVP_MAX_EOS_IDS];
    for (int32_t i = 0; i < mc->n_eos; i++) eos[i] = (int32_t)mc->eos_token_ids[i];
    cfg.engine.eos_ids = eos;
    cfg.engine.n_eos = mc->n_eos;
    cfg.vocab = (int32_t)mc->vocab_size;
    kvp_executor cpu;
    cr_assert_eq(kvp_cpu_executor_create(g_model, NBLOCKS, BS, 0, cfg.kv_dtype, &cpu), KVP_OK, "%s", kvp_error_detail());
    kvp_session *s;
    cr_assert_eq(kvp_session_create(&cfg, recording(r, cpu), &s), KVP_OK, "%s", kvp_error_detail());
    r->e = kvp_session_engine(s);
    for (int i = 0; i < NREQ; i++) {
        const kvp_session_request q = {.prompt = g_prompt[i], .n_prompt = g_np[i], .max_tokens = OUT, .n = 1,
                                       .ignore_eos = 1, .sampler = kvp_sampler_default()};
        cr_assert_eq(kvp_session_add(s, &q, NULL), KVP_OK, "%s", kvp_error_detail());
    }
    int32_t done = 0, id;
    while (kvp_session_pending(s)) {
        cr_assert_eq(kvp_session_step(s), KVP_OK, "%s", kvp_error_detail());
        note_counts(r);
        kvp_session_result res;
        while (kvp_session_take(s, &id, &res) == KVP_OK) {
            cr_assert_eq(res.n_tokens[0], OUT);
            for (int j = 0; j < OUT; j++) cr_assert_eq(res.tokens[0][j], g_answer[id][j], "request %d token %d", id, j);
            kvp_session_results_free(&res, 1);
            done++;
        }
    }
    cr_assert_eq(done, NREQ);
    kvp_session_destroy(s); /* the recorder (and its executor) with it */
}

static void expect_same_schedule(const recorder *a, const recorder *b, const char *what)
{
    for (int t = 0; t < a->nsteps && t < b->nsteps; t++) {
        const rec_step *x = &a->steps[t], *y = &b->steps[t];
        cr_assert_eq(x->n, y->n, "%s: step %d runs %d sequences, the simulator's %d", what, t, y->n, x->n);
        for (int i = 0; i < x->n; i++)
            cr_assert(x->s[i].id == y->s[i].id && x->s[i].ctx == y->s[i].ctx && x->s[i].nn == y->s[i].nn,
                      "%s: step %d entry %d is request %lld at %d + %d, the simulator's request %lld at %d + %d", what,
                      t, i, (long long)y->s[i].id, y->s[i].ctx, y->s[i].nn, (long long)x->s[i].id, x->s[i].ctx,
                      x->s[i].nn);
        cr_assert(x->n_copies == y->n_copies && x->n_swap == y->n_swap, "%s: step %d moves differ", what, t);
        cr_assert_eq(x->preemptions, y->preemptions, "%s: %lld preemptions after step %d, the simulator's %lld", what,
                     (long long)y->preemptions, t, (long long)x->preemptions);
        cr_assert_eq(x->hit_tokens, y->hit_tokens, "%s: %lld prefix-hit tokens after step %d, the simulator's %lld",
                     what, (long long)y->hit_tokens, t, (long long)x->hit_tokens);
        cr_assert_eq(x->evicted, y->evicted, "%s: %lld evicted blocks after step %d, the simulator's %lld", what,
                     (long long)y->evicted, t, (long long)x->evicted);
    }
    cr_assert_eq(a->nsteps, b->nsteps, "%s: %d steps, the simulator's %d", what, b->nsteps, a->nsteps);
}

Test(engine_equivalence, sim_cpu_and_session_make_the_same_schedule, .init = setup, .fini = teardown)
{
    const kvp_gpu_profile *gpu;
    cr_assert_eq(kvp_gpu_profile_find("H200", &gpu), KVP_OK);
    kvp_cost_model cm;
    cr_assert_eq(kvp_cost_model_from_config(kvp_model_cfg(g_model), gpu, 1, 2, &cm), KVP_OK, "%s", kvp_error_detail());
    kvp_executor sim, cpu;
    cr_assert_eq(kvp_sim_executor_create(&cm, 0, &sim), KVP_OK);
    cr_assert_eq(kvp_cpu_executor_create(g_model, NBLOCKS, BS, 0, KVP_DTYPE_F32, &cpu), KVP_OK);
    recorder rs, rc, rss;
    trace_run(&rs, sim);
    trace_run(&rc, cpu);
    session_run(&rss);
    const rec_step *last = &rs.steps[rs.nsteps - 1];
    cr_assert_gt(last->preemptions, 0, "the memory was meant to preempt");
    cr_assert_gt(last->hit_tokens, 0, "the shared prefixes were meant to hit the cache");
    cr_assert_gt(last->evicted, 0, "the memory was meant to evict cached blocks");
    expect_same_schedule(&rs, &rc, "simulate --executor cpu");
    expect_same_schedule(&rs, &rss, "the session (generate, serve)");
    free(rs.steps);
    free(rc.steps);
    free(rss.steps);
}
