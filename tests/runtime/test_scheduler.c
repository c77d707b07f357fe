/* Scheduler behaviour on small hand-made workloads, with a recording executor (1 ms per step) so that
 * every batch can be inspected. Every step also runs the engine's invariant walker (check_every_step). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/engine/engine.h"
#include "runtime/workload/workload.h"
#include "runtime/workload/workload_synth.h"

#include "prefix_testutil.h"

enum { MAXSTEPS = 4096, MAXB = 16 };

typedef struct {
    int64_t id;
    int32_t ctx, nn, sample;
} rec_seq;

typedef struct {
    int nsteps;
    int n[MAXSTEPS];
    rec_seq s[MAXSTEPS][MAXB];
    int swapped_ops;
    int64_t stores, loads; /* host-tier moves */
} recorder;

static recorder R;
/* Workloads from make_wl: prompt token j of request i is i * 10000 + j, and the recorder samples 7, so the
 * recorder can check every token id the engine passes (prefill chunks, decodes, recompute chunks). */
static int check_tokens;
static int32_t PL[64];
/* When set: request 0's generated tokens, fed back from position ANS_AT on, must be these. */
static const int32_t *ANS;
static int32_t ANS_AT;

/* A model of the KV data (when TRACK is set): each device and host block carries a tag, the hash of the token
 * prefix whose KV it holds. The moves of a batch copy tags in the executor's order; every block a sequence
 * reads (its context) must then carry the tag of its own tokens, and the new tokens write theirs. A load
 * from a slot that a store took over, a store run too late, a swap into the wrong block: a wrong tag. */
enum { TRK_REQS = 64, TRK_LEN = 1024, TRK_BLOCKS = 4096 };
static struct {
    int on;
    int32_t tok[TRK_REQS][TRK_LEN]; /* each request's tokens by position, as the batches gave them */
    uint64_t dev[TRK_BLOCKS], host[TRK_BLOCKS];
} TRACK;

static uint64_t prefix_tag(int64_t req, int32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)TRACK.tok[req][i]) * 1099511628211ull;
    return h ^ (uint64_t)n;
}

/* Turns the model on for a run of w (request ids 0..n-1): the prompts' tokens are known before any batch
 * gives them (a prefix hit is never computed); every block starts with no KV. */
static void track_workload(const kvp_workload *w)
{
    memset(&TRACK, 0, sizeof TRACK);
    TRACK.on = 1;
    for (int64_t i = 0; i < w->n; i++) {
        cr_assert(w->reqs[i].id == i && i < TRK_REQS && w->reqs[i].prompt_len <= TRK_LEN);
        memcpy(TRACK.tok[i], w->reqs[i].tokens, (size_t)w->reqs[i].prompt_len * sizeof(int32_t));
    }
}

static void track_moves(const kvp_block_copy *v, int32_t n, uint64_t *from, uint64_t *to)
{
    for (int32_t i = 0; i < n; i++) {
        cr_assert(v[i].src >= 0 && v[i].src < TRK_BLOCKS && v[i].dst >= 0 && v[i].dst < TRK_BLOCKS);
        to[v[i].dst] = from[v[i].src];
    }
}

static void track_step(const kvp_exec_batch *b)
{
    track_moves(b->offload.store, b->offload.n_store, TRACK.dev, TRACK.host);
    track_moves(b->ops.swap_out, b->ops.n_swap_out, TRACK.dev, TRACK.host);
    track_moves(b->ops.swap_in, b->ops.n_swap_in, TRACK.host, TRACK.dev);
    track_moves(b->offload.load, b->offload.n_load, TRACK.host, TRACK.dev);
    track_moves(b->ops.copies, b->ops.n_copies, TRACK.dev, TRACK.dev);
    const int32_t bs = b->block_size;
    for (int i = 0; i < b->n; i++) {
        const kvp_exec_seq *q = &b->seqs[i];
        cr_assert(q->req_id < TRK_REQS && q->context_len + q->num_new <= TRK_LEN && q->tokens != NULL);
        for (int32_t blk = 0; blk * bs < q->context_len; blk++) {
            int32_t end = (blk + 1) * bs < q->context_len ? (blk + 1) * bs : q->context_len;
            cr_assert_eq(TRACK.dev[q->block_table[blk]], prefix_tag(q->req_id, end),
                         "request %lld reads block %d (physical %d) holding another prefix's KV", (long long)q->req_id,
                         blk, q->block_table[blk]);
        }
        for (int32_t k = 0; k < q->num_new; k++) {
            int32_t pos = q->context_len + k;
            TRACK.tok[q->req_id][pos] = q->tokens[k];
            TRACK.dev[q->block_table[pos / bs]] = prefix_tag(q->req_id, pos + 1);
        }
    }
}

static kvp_status rec_step(void *ctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    recorder *r = ctx;
    if (TRACK.on) track_step(b);
    cr_assert_lt(r->nsteps, MAXSTEPS);
    cr_assert_leq(b->n, MAXB);
    for (int i = 0; i < b->n; i++) {
        r->s[r->nsteps][i] = (rec_seq){b->seqs[i].req_id, b->seqs[i].context_len, b->seqs[i].num_new, b->seqs[i].sample};
        cr_assert_geq(b->seqs[i].num_new, 1);
        int64_t id = b->seqs[i].req_id;
        if (check_tokens && id < 64) {
            cr_assert_not_null(b->seqs[i].tokens, "request %lld: no token ids", (long long)id);
            for (int32_t k = 0; k < b->seqs[i].num_new; k++) {
                int32_t pos = b->seqs[i].context_len + k;
                int32_t want = pos < PL[id] ? (int32_t)(id * 10000 + pos) : 7;
                cr_assert_eq(b->seqs[i].tokens[k], want, "request %lld position %d", (long long)id, (int)pos);
            }
        }
        for (int32_t k = 0; ANS && id == 0 && k < b->seqs[i].num_new; k++) {
            int32_t pos = b->seqs[i].context_len + k;
            if (pos >= ANS_AT) cr_assert_eq(b->seqs[i].tokens[k], ANS[pos - ANS_AT], "answer token at %d", (int)pos);
        }
    }
    /* every sequence's logits row says 7 */
    static float rows[MAXB * 8];
    for (int i = 0; i < MAXB * 8; i++) rows[i] = i % 8 == 7 ? 1.0f : 0.0f;
    out->logits = rows;
    out->vocab = 8;
    r->swapped_ops += b->ops.n_swap_out + b->ops.n_swap_in;
    r->stores += b->offload.n_store;
    r->loads += b->offload.n_load;
    r->n[r->nsteps++] = b->n;
    out->time_s = 1e-3;
    return KVP_OK;
}

static kvp_executor rec_executor(void)
{
    memset(&R, 0, sizeof R);
    TRACK.on = 0;
    check_tokens = 0;
    ANS = NULL;
    kvp_executor ex = {.name = "recorder", .ctx = &R, .step = rec_step, .destroy = NULL};
    return ex;
}

/* Finds request id in step s; returns the index in the batch or -1. */
static int in_step(int s, int64_t id)
{
    for (int i = 0; i < R.n[s]; i++)
        if (R.s[s][i].id == id) return i;
    return -1;
}

static int first_step_of(int64_t id)
{
    for (int s = 0; s < R.nsteps; s++)
        if (in_step(s, id) >= 0) return s;
    return -1;
}

static int last_step_of(int64_t id)
{
    for (int s = R.nsteps - 1; s >= 0; s--)
        if (in_step(s, id) >= 0) return s;
    return -1;
}

static kvp_workload *make_wl(int n, const int32_t *prompt, const int32_t *out, const double *arr, const int32_t *prio)
{
    kvp_workload *w = NULL;
    cr_assert_eq(kvp_workload_create("test", &w), KVP_OK);
    for (int i = 0; i < n; i++) {
        int32_t tok[4096];
        cr_assert_leq(prompt[i], 4096);
        for (int j = 0; j < prompt[i]; j++) tok[j] = (int32_t)(i * 10000 + j); /* unique per request */
        kvp_request r = {.id = i, .arrival_s = arr ? arr[i] : 0, .prompt_len = prompt[i], .output_len = out[i],
                         .priority = prio ? prio[i] : 0};
        cr_assert_eq(kvp_workload_add(w, &r, tok), KVP_OK);
        if (i < 64) PL[i] = prompt[i];
    }
    check_tokens = 1;
    return w;
}

static kvp_engine_config base_cfg(int32_t bs, int64_t slots)
{
    kvp_engine_config c;
    kvp_engine_config_default(&c);
    c.block_size = bs;
    c.kv_slots = slots;
    c.max_model_len = 1024;
    c.max_batched_tokens = 1024;
    c.max_num_seqs = 8;
    c.check_every_step = true;
    return c;
}

static void run_all(kvp_engine *e, const kvp_workload *w)
{
    kvp_status st = kvp_engine_run(e, w->reqs, w->n, NULL, NULL);
    cr_assert_eq(st, KVP_OK, "run: %s", kvp_error_detail());
    double norm = 0;
    int64_t finished = 0;
    for (int64_t i = 0; i < w->n; i++) {
        kvp_req_result rr;
        cr_assert_eq(kvp_engine_request(e, i, &rr), KVP_OK);
        if (rr.state == KVP_REQ_REJECTED) continue;
        cr_assert_eq(rr.state, KVP_REQ_FINISHED, "request %lld not finished", (long long)i);
        cr_assert_eq(rr.num_generated, rr.output_len);
        norm += (rr.finish_s - rr.arrival_s) / rr.num_generated;
        finished++;
    }
    kvp_engine_metrics m;
    cr_assert_eq(kvp_engine_metrics_get(e, &m), KVP_OK);
    norm = finished > 0 ? norm / (double)finished : 0;
    cr_assert_float_eq(m.norm_latency_s, norm, 1e-9 * (1 + norm), "normalized latency %g, per-request mean %g",
                       m.norm_latency_s, norm);
}

/* Runs w to the end on a fresh engine (config c, recording executor) and returns its metrics. */
static kvp_engine_metrics run_metrics_opt(const kvp_engine_config *c, const kvp_workload *w, int track)
{
    kvp_executor ex = rec_executor();
    if (track) track_workload(w);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(c, &ex, &e), KVP_OK);
    run_all(e, w);
    kvp_engine_metrics m;
    kvp_engine_metrics_get(e, &m);
    kvp_engine_destroy(e);
    return m;
}

static kvp_engine_metrics run_metrics(const kvp_engine_config *c, const kvp_workload *w) { return run_metrics_opt(c, w, 0); }
/* With the KV-data model checking every step. */
static kvp_engine_metrics run_tracked(const kvp_engine_config *c, const kvp_workload *w) { return run_metrics_opt(c, w, 1); }

Test(scheduler, admission_respects_max_num_seqs_and_continuous_batching_order)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 1024);
    c.max_num_seqs = 2;
    int32_t p[] = {4, 4, 4}, o[] = {3, 10, 2};
    kvp_workload *w = make_wl(3, p, o, NULL, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    /* step 0: A and B prefill (both sample their first token), C waits */
    cr_assert_eq(R.n[0], 2);
    cr_assert_geq(in_step(0, 0), 0);
    cr_assert_geq(in_step(0, 1), 0);
    cr_assert_eq(in_step(0, 2), -1);
    cr_assert_eq(R.s[0][in_step(0, 0)].nn, 4);
    cr_assert_eq(R.s[0][in_step(0, 0)].sample, 1);
    /* A yields 3 tokens: prefill + 2 decodes -> last step 2; C joins in the very next step, next to B */
    int a_last = last_step_of(0);
    cr_assert_eq(a_last, 2);
    cr_assert_eq(first_step_of(2), a_last + 1, "C must join the step right after A finished");
    cr_assert_geq(in_step(a_last + 1, 1), 0, "B keeps running next to C");
    kvp_req_result ra, rc;
    kvp_engine_request(e, 0, &ra);
    kvp_engine_request(e, 2, &rc);
    cr_assert_float_eq(rc.admit_s, ra.finish_s, 1e-12, "C admitted at A's finish time");
    /* decodes: context grows by one per step */
    int bi = in_step(1, 1);
    cr_assert_eq(R.s[1][bi].ctx, 4);
    cr_assert_eq(R.s[1][bi].nn, 1);
    kvp_engine_metrics m;
    cr_assert_eq(kvp_engine_metrics_get(e, &m), KVP_OK);
    cr_assert_eq(m.finished, 3);
    cr_assert_eq(m.output_tokens, 15);
    cr_assert_eq(m.max_running, 2);
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

Test(scheduler, chunked_prefill_splits_prompts_within_the_token_budget)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 1024);
    c.max_batched_tokens = 32;
    int32_t p[] = {100}, o[] = {2};
    kvp_workload *w = make_wl(1, p, o, NULL, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    int32_t want[][3] = {{0, 32, 0}, {32, 32, 0}, {64, 32, 0}, {96, 4, 1}, {100, 1, 1}};
    cr_assert_eq(R.nsteps, 5);
    for (int s = 0; s < 5; s++) {
        cr_assert_eq(R.s[s][0].ctx, want[s][0], "step %d", s);
        cr_assert_eq(R.s[s][0].nn, want[s][1], "step %d", s);
        cr_assert_eq(R.s[s][0].sample, want[s][2], "step %d", s);
    }
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);

    /* a decode goes first, the chunk takes what is left of the budget */
    ex = rec_executor();
    int32_t p2[] = {4, 100}, o2[] = {10, 1};
    w = make_wl(2, p2, o2, NULL, NULL);
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    cr_assert_eq(R.s[0][in_step(0, 1)].nn, 28); /* 32 - 4 for D's prefill */
    cr_assert_eq(R.s[1][in_step(1, 0)].nn, 1);  /* D decodes */
    cr_assert_eq(R.s[1][in_step(1, 1)].nn, 31);
    cr_assert_eq(R.s[1][in_step(1, 1)].ctx, 28);
    for (int s = 0; s < R.nsteps; s++) {
        int32_t tot = 0;
        for (int i = 0; i < R.n[s]; i++) tot += R.s[s][i].nn;
        cr_assert_leq(tot, 32, "step %d over the budget", s);
    }
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

Test(scheduler, without_chunked_prefill_prompts_run_whole_in_prefill_only_steps)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 1024);
    c.chunked_prefill = false;
    c.max_model_len = 256;
    c.max_batched_tokens = 256;
    int32_t p[] = {4, 200}, o[] = {5, 2};
    double arr[] = {0, 0.0015}; /* B arrives while A decodes */
    kvp_workload *w = make_wl(2, p, o, arr, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    int sb = first_step_of(1);
    cr_assert_geq(sb, 1);
    cr_assert_eq(R.n[sb], 1, "the prefill step runs B alone (vLLM v0)");
    cr_assert_eq(R.s[sb][0].nn, 200);
    cr_assert_eq(R.s[sb][0].sample, 1);
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);

    c.max_batched_tokens = 100; /* < max_model_len without chunking: rejected configuration */
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
}

static void preemption_case(kvp_preempt_mode mode)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 32); /* 8 blocks of 4 tokens */
    c.preempt = mode;
    c.host_slots = mode == KVP_PREEMPT_SWAP ? 64 : 0;
    int32_t p[] = {8, 8}, o[] = {16, 16}; /* each grows to 24 tokens = 6 blocks: both cannot fit */
    kvp_workload *w = make_wl(2, p, o, NULL, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    cr_assert_eq(kvp_engine_add_request(e, &w->reqs[0], NULL), KVP_OK);
    cr_assert_eq(kvp_engine_add_request(e, &w->reqs[1], NULL), KVP_OK);
    int saw_swapped = 0, saw_waiting_again = 0;
    int32_t b_ctx_at_preempt = -1;
    for (int guard = 0; guard < 1000; guard++) {
        kvp_req_result before;
        kvp_engine_request(e, 1, &before);
        kvp_step_info inf;
        cr_assert_eq(kvp_engine_step(e, &inf), KVP_OK, "%s", kvp_error_detail());
        if (inf.idle) break;
        kvp_req_result rb;
        kvp_engine_request(e, 1, &rb);
        if (inf.num_preempted > 0 && b_ctx_at_preempt < 0) b_ctx_at_preempt = before.num_computed;
        if (rb.state == KVP_REQ_SWAPPED) {
            saw_swapped = 1;
            cr_assert_eq(kvp_engine_num_swapped(e), 1);
            cr_assert_gt(rb.num_computed, 8, "a swapped sequence keeps its KV");
        }
        if (rb.state == KVP_REQ_WAITING && rb.preemptions > 0) {
            saw_waiting_again = 1;
            cr_assert_eq(rb.num_computed, 0, "recompute drops the KV");
        }
    }
    kvp_req_result ra, rb;
    kvp_engine_request(e, 0, &ra);
    kvp_engine_request(e, 1, &rb);
    cr_assert_eq(ra.state, KVP_REQ_FINISHED);
    cr_assert_eq(rb.state, KVP_REQ_FINISHED);
    cr_assert_eq(ra.preemptions, 0, "FCFS preempts the later request");
    cr_assert_geq(rb.preemptions, 1);
    cr_assert_eq(rb.num_generated, 16);
    kvp_engine_metrics m;
    kvp_engine_metrics_get(e, &m);
    cr_assert_geq(m.preemptions, 1);
    /* the resumed request: recompute re-prefills prompt + generated tokens from context 0;
     * swap resumes exactly where it stopped */
    int resumed = -1;
    for (int s = 1; s < R.nsteps && resumed < 0; s++)
        if (in_step(s, 1) >= 0 && in_step(s - 1, 1) < 0 && first_step_of(1) < s) resumed = s;
    cr_assert_geq(resumed, 0, "B never resumed");
    rec_seq r = R.s[resumed][in_step(resumed, 1)];
    if (mode == KVP_PREEMPT_RECOMPUTE) {
        cr_assert(saw_waiting_again);
        cr_assert_eq(m.recomputes, m.preemptions);
        cr_assert_eq(m.swap_outs, 0);
        cr_assert_eq(r.ctx, 0);
        cr_assert_gt(r.nn, 8, "recompute covers the generated tokens too");
        cr_assert_eq(r.nn, b_ctx_at_preempt + 1);
    } else {
        cr_assert(saw_swapped);
        cr_assert_geq(m.swap_outs, 1);
        cr_assert_eq(m.swap_ins, m.swap_outs);
        cr_assert_eq(m.recomputes, 0);
        cr_assert_gt(R.swapped_ops, 0, "swap moves reach the executor");
        cr_assert_eq(r.nn, 1);
        cr_assert_eq(r.ctx, b_ctx_at_preempt, "swap-in resumes at the context it left with");
    }
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

Test(scheduler, preemption_by_recompute_and_resumption) { preemption_case(KVP_PREEMPT_RECOMPUTE); }
Test(scheduler, preemption_by_swap_and_resumption) { preemption_case(KVP_PREEMPT_SWAP); }

Test(scheduler, swap_without_host_room_falls_back_to_recompute)
{
    kvp_engine_config c = base_cfg(4, 32);
    c.preempt = KVP_PREEMPT_SWAP;
    c.host_slots = 4; /* one host block: too small for the victim */
    int32_t p[] = {8, 8}, o[] = {16, 16};
    kvp_workload *w = make_wl(2, p, o, NULL, NULL);
    kvp_engine_metrics m = run_metrics(&c, w);
    cr_assert_geq(m.preemptions, 1);
    cr_assert_eq(m.swap_outs, 0);
    cr_assert_eq(m.recomputes, m.preemptions);
    kvp_workload_destroy(w);
}

Test(scheduler, fcfs_does_not_starve_a_large_request)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 64); /* 16 blocks */
    enum { N = 40 };
    int32_t p[N], o[N];
    double arr[N];
    for (int i = 0; i < N; i++) {
        p[i] = 4;
        o[i] = 6;
        arr[i] = i * 0.0005;
    }
    p[3] = 48; /* needs 14 of the 16 blocks at the end: only when nearly everything else is gone */
    o[3] = 8;
    kvp_workload *w = make_wl(N, p, o, arr, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    double prev = -1;
    for (int i = 0; i < N; i++) {
        kvp_req_result r;
        kvp_engine_request(e, i, &r);
        cr_assert_geq(r.admit_s, prev, "request %d admitted before an earlier one (FCFS order broken)", i);
        prev = r.admit_s;
    }
    kvp_req_result big, next;
    kvp_engine_request(e, 3, &big);
    kvp_engine_request(e, 4, &next);
    cr_assert_leq(big.admit_s, next.admit_s, "the large request is not overtaken");
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

Test(scheduler, priority_admits_important_requests_first)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 1024);
    c.sched = KVP_SCHED_PRIORITY;
    c.max_num_seqs = 1;
    int32_t p[] = {4, 4, 4, 4}, o[] = {4, 4, 4, 4}, prio[] = {0, 0, 0, 5};
    double arr[] = {0, 0.0001, 0.0002, 0.0003};
    kvp_workload *w = make_wl(4, p, o, arr, prio);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    kvp_req_result r1, r3;
    kvp_engine_request(e, 1, &r1);
    kvp_engine_request(e, 3, &r3);
    cr_assert_lt(r3.admit_s, r1.admit_s, "priority 5 must overtake the waiting priority-0 requests");
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

Test(scheduler, prefix_cache_hits_and_lpm)
{
    for (int pol = 0; pol < 2; pol++) {
        kvp_executor ex = rec_executor();
        kvp_engine_config c = base_cfg(4, 1024);
        c.cache = KVP_PC_RADIX;
        c.sched = pol ? KVP_SCHED_LPM : KVP_SCHED_FCFS;
        kvp_workload *w = NULL;
        cr_assert_eq(kvp_workload_create("shared", &w), KVP_OK);
        for (int i = 0; i < 6; i++) {
            int32_t tok[40];
            for (int j = 0; j < 40; j++) tok[j] = j < 32 ? 1000 + j : i * 100 + j; /* 32 shared tokens */
            kvp_request r = {.id = i, .arrival_s = i * 0.01, .prompt_len = 40, .output_len = 3};
            cr_assert_eq(kvp_workload_add(w, &r, tok), KVP_OK);
        }
        kvp_engine *e;
        cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
        run_all(e, w);
        kvp_engine_metrics m;
        kvp_engine_metrics_get(e, &m);
        /* the first request computes all 40; each later one finds 32 tokens (8 blocks) cached */
        cr_assert_eq(m.prefix_hit_tokens, 5 * 32);
        cr_assert_float_eq(m.prefix_hit_rate, 160.0 / 240.0, 1e-9);
        int s5 = first_step_of(5);
        cr_assert_eq(R.s[s5][in_step(s5, 5)].ctx, 32, "a hit starts the prefill after the cached blocks");
        cr_assert_eq(R.s[s5][in_step(s5, 5)].nn, 8);
        kvp_engine_destroy(e);
        kvp_workload_destroy(w);
    }
    kvp_engine_config c = base_cfg(4, 1024);
    c.cache = KVP_PC_HASH;
    c.alloc = KVP_ALLOC_ORCA_MAX;
    kvp_executor ex = rec_executor();
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL, "prefix caching needs paged allocation");
}

Test(scheduler, contiguous_reservations_limit_the_batch)
{
    /* Orca-Max reserves max_model_len = 64 slots per request in a 256-slot arena: 4 run at once. */
    kvp_engine_config c = base_cfg(1, 256);
    c.alloc = KVP_ALLOC_ORCA_MAX;
    c.max_model_len = 64;
    c.max_batched_tokens = 64;
    int32_t p[8], o[8];
    for (int i = 0; i < 8; i++) p[i] = 8, o[i] = 8;
    kvp_workload *w = make_wl(8, p, o, NULL, NULL);
    kvp_engine_metrics m = run_metrics(&c, w);
    cr_assert_eq(m.max_running, 4);
    cr_assert_eq(m.preemptions, 0);
    cr_assert_gt(m.kv_internal_frag, 0.5, "most of each 64-slot reservation is never used");

    /* Orca-Oracle reserves exactly 16: 8 fit */
    c.alloc = KVP_ALLOC_ORCA_ORACLE;
    m = run_metrics(&c, w);
    cr_assert_eq(m.max_running, 8);
    cr_assert_float_eq(m.kv_internal_frag, 0, 1e-12);
    cr_assert_gt(m.kv_reserved, 0);
    kvp_workload_destroy(w);
}

Test(scheduler, rejects_and_clamps_impossible_requests)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 64);
    c.max_model_len = 32;
    c.max_batched_tokens = 32;
    int32_t p[] = {40, 20, 4, 4}, o[] = {5, 30, 0, 3};
    kvp_workload *w = make_wl(4, p, o, NULL, NULL);
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    kvp_req_result r;
    kvp_engine_request(e, 0, &r);
    cr_assert_eq(r.state, KVP_REQ_REJECTED, "prompt longer than max_model_len");
    kvp_engine_request(e, 1, &r);
    cr_assert_eq(r.output_len, 12, "output clamped to max_model_len - prompt");
    kvp_engine_request(e, 2, &r);
    cr_assert_eq(r.output_len, 1, "at least one token");
    kvp_engine_metrics m;
    kvp_engine_metrics_get(e, &m);
    cr_assert_eq(m.rejected, 1);
    cr_assert_eq(m.clamped, 2);
    cr_assert_eq(m.finished, 3);
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);

    /* a rejected request arriving while the engine is idle is skipped, not a stall */
    int32_t p2[] = {4, 40, 4}, o2[] = {2, 2, 2};
    double arr2[] = {0, 1.0, 2.0};
    w = make_wl(3, p2, o2, arr2, NULL);
    m = run_metrics(&c, w);
    cr_assert_eq(m.finished, 2);
    cr_assert_eq(m.rejected, 1);
    cr_assert_gt(m.sim_duration_s, 2.0);
    kvp_workload_destroy(w);

    /* out-of-order arrivals through add_request are refused */
    ex = rec_executor();
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    int32_t tok[4] = {1, 2, 3, 4};
    kvp_request a = {.id = 0, .arrival_s = 1.0, .tokens = tok, .prompt_len = 4, .output_len = 1};
    kvp_request b = {.id = 1, .arrival_s = 0.5, .tokens = tok, .prompt_len = 4, .output_len = 1};
    cr_assert_eq(kvp_engine_add_request(e, &a, NULL), KVP_OK);
    cr_assert_eq(kvp_engine_add_request(e, &b, NULL), KVP_EINVAL);
    kvp_engine_destroy(e);
}

Test(scheduler, names_parse_and_bad_configs_are_rejected)
{
    kvp_alloc_kind a;
    kvp_sched_policy s;
    kvp_preempt_mode p;
    cr_assert_eq(kvp_alloc_kind_parse("orca-pow2", &a), KVP_OK);
    cr_assert_eq(a, KVP_ALLOC_ORCA_POW2);
    cr_assert_eq(kvp_alloc_kind_parse("buddy", &a), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "orca-oracle") != NULL);
    cr_assert_eq(kvp_sched_policy_parse("lpm", &s), KVP_OK);
    cr_assert_eq(s, KVP_SCHED_LPM);
    cr_assert_eq(kvp_preempt_mode_parse("swap", &p), KVP_OK);
    cr_assert_eq(kvp_preempt_mode_parse("kill", &p), KVP_EINVAL);
    kvp_executor ex = rec_executor();
    kvp_engine *e = NULL;
    kvp_engine_config c = base_cfg(16, 8); /* 8 slots: no block of 16 */
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    c = base_cfg(16, 1024);
    c.max_num_seqs = 0;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    c = base_cfg(16, 1024);
    c.host_cache_slots = 1024; /* a host tier without a prefix cache */
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "needs a prefix cache"), "%s", kvp_error_message());
    c.cache = KVP_PC_RADIX;
    c.host_cache_slots = 15; /* no block of 16 */
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    c.host_cache_slots = -16;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    c.host_cache_slots = 64;
    c.host_write_policy = (kvp_hc_write_policy)7;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "write policy"), "%s", kvp_error_message());
    cr_assert_null(e);
}

Test(scheduler, allocation_failures_are_reported_not_fatal)
{
    int32_t p[] = {10, 12, 30, 9}, o[] = {5, 7, 9, 3};
    kvp_workload *w = make_wl(4, p, o, NULL, NULL);
    for (int64_t n = 1, tier = 0; tier < 3; n++) { /* then with a host tier (its stores allocate), write-back too */
        kvp_executor ex = rec_executor();
        kvp_engine_config c = base_cfg(4, 48);
        c.cache = KVP_PC_HASH;
        c.host_cache_slots = (tier > 0) * 64;
        c.host_write_policy = tier == 2 ? KVP_HC_WRITE_BACK : KVP_HC_WRITE_THROUGH;
        c.check_every_step = false;
        kvp_alloc_fail_at(n);
        kvp_engine *e = NULL;
        kvp_status st = kvp_engine_create(&c, &ex, &e);
        if (st == KVP_OK) st = kvp_engine_run(e, w->reqs, w->n, NULL, NULL);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        cr_assert(st == KVP_OK || st == KVP_ENOMEM, "allocation %lld failed with %s", (long long)n, kvp_status_str(st));
        kvp_engine_destroy(e);
        if (made < n) {
            cr_assert_eq(st, KVP_OK);
            n = 0;
            tier++;
        }
    }
    kvp_workload_destroy(w);
}

Test(scheduler, lpm_admits_the_longest_cached_prefix_first)
{
    /* max_num_seqs 1: A (prefix P) runs; B (no shared prefix) and C (prefix P) wait. When A leaves,
     * fcfs takes B, lpm takes C (its 32 tokens are cached). */
    for (int lpm = 0; lpm < 2; lpm++) {
        kvp_executor ex = rec_executor();
        kvp_engine_config c = base_cfg(4, 1024);
        c.cache = KVP_PC_RADIX;
        c.sched = lpm ? KVP_SCHED_LPM : KVP_SCHED_FCFS;
        c.max_num_seqs = 1;
        kvp_workload *w = NULL;
        cr_assert_eq(kvp_workload_create("lpm", &w), KVP_OK);
        for (int i = 0; i < 3; i++) {
            int32_t tok[40];
            for (int j = 0; j < 40; j++) tok[j] = (i != 1 && j < 32) ? 500 + j : 9000 + i * 100 + j;
            kvp_request r = {.id = i, .arrival_s = i * 0.0001, .prompt_len = 40, .output_len = 4};
            cr_assert_eq(kvp_workload_add(w, &r, tok), KVP_OK);
        }
        kvp_engine *e;
        cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
        run_all(e, w);
        kvp_req_result rb, rc;
        kvp_engine_request(e, 1, &rb);
        kvp_engine_request(e, 2, &rc);
        if (lpm) cr_assert_lt(rc.admit_s, rb.admit_s, "lpm must take C (cached prefix) before B");
        else cr_assert_lt(rb.admit_s, rc.admit_s, "fcfs keeps arrival order");
        kvp_engine_destroy(e);
        kvp_workload_destroy(w);
    }
}

/* lpm counts the host tier's blocks as SGLang does (device + host hits). One request at a time, 12 blocks of 4:
 * A (prefix P, 40 tokens) runs and is cached, written through to the tier; X (40 new tokens) then evicts all
 * of A's cached blocks but the first. D shares X's first 2 blocks (cached); C shares A's first 8 (1 cached,
 * 7 in the tier). When X leaves, lpm with the tier takes C (8 blocks) before D (2); without the tier, or with
 * fcfs, D comes first. */
Test(scheduler, lpm_counts_the_host_tiers_blocks)
{
    for (int run = 0; run < 3; run++) { /* lpm + tier, lpm without tier, fcfs + tier */
        kvp_executor ex = rec_executor();
        kvp_engine_config c = base_cfg(4, 48);
        c.cache = KVP_PC_RADIX;
        c.sched = run == 2 ? KVP_SCHED_FCFS : KVP_SCHED_LPM;
        c.host_cache_slots = run == 1 ? 0 : 1024;
        c.max_num_seqs = 1;
        kvp_workload *w = NULL;
        cr_assert_eq(kvp_workload_create("lpm-host", &w), KVP_OK);
        for (int i = 0; i < 4; i++) { /* A, X, D, C */
            int32_t tok[40];
            for (int j = 0; j < 40; j++)
                tok[j] = (i == 0 || (i == 3 && j < 32)) ? 500 + j : (i == 2 && j < 8) ? 7000 + j : 9000 + i * 100 + j;
            if (i == 1)
                for (int j = 0; j < 8; j++) tok[j] = 7000 + j;
            /* 1 ms steps: A runs 0-4 ms, X 4-8 ms; D and C arrive while X runs */
            kvp_request r = {.id = i, .arrival_s = i < 2 ? i * 0.0001 : 0.005 + i * 0.0001, .prompt_len = 40,
                             .output_len = 4};
            cr_assert_eq(kvp_workload_add(w, &r, tok), KVP_OK);
        }
        kvp_engine *e;
        cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
        run_all(e, w);
        kvp_req_result rx, rd, rc;
        kvp_engine_request(e, 1, &rx);
        cr_assert_float_eq(rx.admit_s, 0.004, 1e-9, "X runs right after A");
        kvp_engine_request(e, 2, &rd);
        kvp_engine_request(e, 3, &rc);
        if (run == 0) {
            cr_assert_lt(rc.admit_s, rd.admit_s, "lpm counting the tier takes C (8 blocks) before D (2)");
            cr_assert_eq(rc.cached_tokens, 32, "C: 1 block cached + 7 loaded from the tier");
        } else {
            cr_assert_lt(rd.admit_s, rc.admit_s, "run %d: D (2 cached blocks) first: D %d cached at %g, C %d at %g", run,
                         rd.cached_tokens, rd.admit_s, rc.cached_tokens, rc.admit_s);
        }
        kvp_engine_destroy(e);
        kvp_workload_destroy(w);
    }
}

Test(scheduler, time_averaged_accounting_by_hand)
{
    /* One request, prompt 6, output 3, 16 slots, 1 ms steps:
     *   step 0: prefill 6 tokens in 2 blocks of 4 -> 6 token slots, 2 internal
     *   step 1: decode, 7 tokens -> 1 internal;  step 2: decode, 8 tokens -> 0 internal, third token: done
     * token share = (6 + 7 + 8) / (3 x 16), internal = (2 + 1 + 0) / 48, free = 1 - 24 / 48. */
    kvp_engine_config c = base_cfg(4, 16);
    int32_t p[] = {6}, o[] = {3};
    kvp_workload *w = make_wl(1, p, o, NULL, NULL);
    kvp_engine_metrics m = run_metrics(&c, w);
    cr_assert_eq(m.steps, 3);
    cr_assert_float_eq(m.sim_duration_s, 3e-3, 1e-15);
    cr_assert_float_eq(m.kv_token_states, 21.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_internal_frag, 3.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_free, 24.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_util_in_use, 21.0 / 24, 1e-12);
    cr_assert_float_eq(m.mean_running, 1.0, 1e-12);
    cr_assert_float_eq(m.ttft_p50_s, 1e-3, 1e-15);
    cr_assert_float_eq(m.tpot_p50_s, 1e-3, 1e-15);

    /* Orca-Oracle: one reservation of exactly 9 slots; the unfilled part of it is "reserved"; first fit */
    c.alloc = KVP_ALLOC_ORCA_ORACLE;
    c.arena = KVP_CONTIG_FIRST_FIT;
    m = run_metrics(&c, w);
    cr_assert_float_eq(m.kv_token_states, 21.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_reserved, (3.0 + 2 + 1) / 48, 1e-12);
    cr_assert_float_eq(m.kv_internal_frag, 0, 1e-12);
    cr_assert_float_eq(m.kv_external_frag, 0, 1e-12);
    cr_assert_float_eq(m.kv_free, 21.0 / 48, 1e-12);

    /* the same in a buddy arena: the 9 slots take a 16-slot block, 7 slots of allocator fragmentation */
    c.arena = KVP_CONTIG_BUDDY;
    m = run_metrics(&c, w);
    cr_assert_float_eq(m.kv_token_states, 21.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_reserved, (3.0 + 2 + 1) / 48, 1e-12);
    cr_assert_float_eq(m.kv_external_frag, 3 * 7.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_free, 0, 1e-12);

    /* Orca-Max (max_model_len 12 here): 12 slots reserved, 3 of them beyond the final length */
    c.alloc = KVP_ALLOC_ORCA_MAX;
    c.arena = KVP_CONTIG_FIRST_FIT;
    c.max_model_len = 12;
    c.max_batched_tokens = 12;
    m = run_metrics(&c, w);
    cr_assert_float_eq(m.kv_internal_frag, 9.0 / 48, 1e-12);
    cr_assert_float_eq(m.kv_free, 12.0 / 48, 1e-12);
    kvp_workload_destroy(w);
}

/* Request 0 answers 16 known tokens; request 1, arriving after it finished, is the next chat turn: its
 * prompt is request 0's prompt, that answer, and 8 new tokens. Request 0 computed its prompt and 15 of its
 * answer's tokens (the last one is sampled, never fed back): 47 tokens, 11 full blocks of 4, so request 1
 * finds 44 tokens cached; without a known answer only the 32 prompt tokens. */
Test(scheduler, a_known_answer_is_generated_and_cached_for_the_next_turn)
{
    for (int kind = 0; kind < 2; kind++)
        for (int known = 0; known < 2; known++) {
            kvp_executor ex = rec_executor();
            kvp_engine_config c = base_cfg(4, 1024);
            c.cache = kind ? KVP_PC_HASH : KVP_PC_RADIX;
            kvp_workload *w = NULL;
            cr_assert_eq(kvp_workload_create("chat", &w), KVP_OK);
            int32_t tok[56], answer[16];
            for (int j = 0; j < 16; j++) answer[j] = 5000 + j;
            for (int j = 0; j < 56; j++) tok[j] = j < 32 ? 1000 + j : j < 48 ? answer[j - 32] : 9000 + j;
            kvp_request a = {.id = 0, .prompt_len = 32, .output_len = 16, .output_tokens = known ? answer : NULL};
            kvp_request b = {.id = 1, .arrival_s = 1.0, .prompt_len = 56, .output_len = 2};
            cr_assert_eq(kvp_workload_add(w, &a, tok), KVP_OK);
            cr_assert_eq(kvp_workload_add(w, &b, tok), KVP_OK);
            cr_assert_eq(w->reqs[0].output_tokens == NULL, !known);
            cr_assert(w->reqs[0].output_tokens != answer, "the workload keeps its own copy");
            ANS = known ? answer : NULL; /* the executor samples 7: a known answer replaces it */
            ANS_AT = 32;
            kvp_engine *e;
            cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
            run_all(e, w);
            kvp_engine_metrics m;
            kvp_engine_metrics_get(e, &m);
            const int want = known ? 44 : 32;
            cr_assert_eq(m.prefix_hit_tokens, want, "cache %d known %d: %lld hit tokens", kind, known,
                         (long long)m.prefix_hit_tokens);
            int s1 = first_step_of(1);
            cr_assert_gt(s1, last_step_of(0), "the next turn arrives after the answer");
            cr_assert_eq(R.s[s1][in_step(s1, 1)].ctx, want);
            cr_assert_eq(R.s[s1][in_step(s1, 1)].nn, 56 - want);
            kvp_engine_destroy(e);
            kvp_workload_destroy(w);
        }
}

/* 10 blocks of 4; both requests grow in step to 24 tokens (6 blocks each). At 20 tokens each (5 blocks
 * each) request 0 needs a sixth block: request 1 is preempted by recompute having computed 20 tokens, 5
 * full blocks (8 prompt and 12 generated tokens) that stay cached; request 0 then evicts one of them (the
 * deepest, least recently used), so request 1, readmitted, matches prompt + generated tokens and finds 4
 * blocks: it recomputes from token 16 (without a cache: from 0; caching only the prompt: from 4). */
Test(scheduler, recompute_finds_its_own_computed_blocks_cached)
{
    for (int cache = 0; cache < 3; cache++) {
        kvp_executor ex = rec_executor();
        kvp_engine_config c = base_cfg(4, 40);
        c.cache = cache == 0 ? KVP_PC_NONE : cache == 1 ? KVP_PC_RADIX : KVP_PC_HASH;
        int32_t p[] = {8, 8}, o[] = {16, 16};
        kvp_workload *w = make_wl(2, p, o, NULL, NULL);
        kvp_engine *e;
        cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
        run_all(e, w);
        kvp_engine_metrics m;
        kvp_engine_metrics_get(e, &m);
        cr_assert_eq(m.recomputes, 1);
        cr_assert_eq(m.prefix_hit_tokens, 0, "readmissions are not first admissions");
        cr_assert_eq(m.readmit_hit_tokens, cache ? 16 : 0, "counted apart");
        int s1 = last_step_of(0) + 1;
        cr_assert_eq(R.n[s1], 1);
        cr_assert_eq(R.s[s1][0].id, 1, "request 1 resumes after request 0 finished");
        cr_assert_eq(R.s[s1][0].ctx, cache ? 16 : 0, "cache %d", cache);
        cr_assert_eq(R.s[s1][0].ctx + R.s[s1][0].nn, 21, "prompt + 13 generated tokens known");
        kvp_engine_destroy(e);
        kvp_workload_destroy(w);
    }
}

/* 4 conversations of 4 turns (system prompt 40 tokens, user 16, assistant 32), each request arriving 10 s
 * after the one before, when it has long finished. */
static kvp_workload *spaced_chat(void)
{
    kvp_workload *w = NULL;
    cr_assert_eq(kvp_workload_generate("chat:conversations=4,turns=4,system=40,user=16,assistant=32", &w), KVP_OK);
    for (int64_t i = 0; i < w->n; i++) w->reqs[i].arrival_s = 10.0 * (double)i;
    return w;
}

/* A chat workload with every turn arriving after the previous one finished, in a cache that never evicts:
 * the hit tokens must be those of a brute-force search. Request i finds the longest prefix it shares with
 * the tokens some earlier request computed (its prompt, and its answer but the last token when the
 * workload gives the answer), in whole blocks, never covering its own last prompt token. */
Test(scheduler, chat_hits_equal_a_brute_force_search_over_earlier_turns)
{
    const int32_t sizes[] = {4, 16};
    for (int kind = 0; kind < 2; kind++)
        for (int bi = 0; bi < 2; bi++) {
            kvp_workload *w = spaced_chat();
            const int32_t bs = sizes[bi];
            const int64_t want = kvp_test_bruteforce_hits(w, bs);
            kvp_engine_config c = base_cfg(bs, 1 << 20);
            c.cache = kind ? KVP_PC_HASH : KVP_PC_RADIX;
            c.max_model_len = 4096;
            kvp_engine_metrics m = run_metrics(&c, w);
            cr_assert_eq(m.finished, w->n);
            cr_assert_eq(m.evicted_blocks, 0);
            cr_assert_eq(m.prefix_hit_tokens, want, "cache %d block %d: %lld hit tokens, brute force %lld", kind, bs,
                         (long long)m.prefix_hit_tokens, (long long)want);
            kvp_workload_destroy(w);
        }
}

/* The same chat through a device cache too small to keep the history, with a host tier that keeps all of
 * it: device hits plus host loads must be the brute-force hits, the device alone must find fewer, and the
 * executor must be handed one move per loaded or stored block. */
Test(scheduler, a_host_tier_finds_what_the_device_cache_evicted)
{
    for (int kind = 0; kind < 2; kind++)
        for (int32_t bs = 4; bs <= 16; bs += 12) {
            kvp_workload *w = spaced_chat();
            const int64_t want = kvp_test_bruteforce_hits(w, bs);
            kvp_engine_config c = base_cfg(bs, 256);
            c.cache = kind ? KVP_PC_HASH : KVP_PC_RADIX;
            kvp_engine_metrics dev = run_metrics(&c, w);
            cr_assert_gt(dev.evicted_blocks, 0);
            cr_assert_lt(dev.prefix_hit_tokens, want, "256 slots were meant to lose hits");
            cr_assert_eq(dev.host_hit_tokens + dev.host_loaded_blocks + dev.host_stored_blocks + R.loads + R.stores, 0);
            c.host_cache_slots = 1 << 16;
            kvp_engine_metrics two = run_tracked(&c, w);
            cr_assert_eq(two.finished, w->n);
            cr_assert_gt(two.host_hit_tokens, 0);
            cr_assert_eq(two.prefix_hit_tokens + two.host_hit_tokens, want,
                         "cache %d block %d: %lld device + %lld host hit tokens, brute force %lld", kind, bs,
                         (long long)two.prefix_hit_tokens, (long long)two.host_hit_tokens, (long long)want);
            cr_assert_eq(R.loads, two.host_loaded_blocks);
            cr_assert_eq(R.stores, two.host_stored_blocks);
            cr_assert_eq(two.host_loaded_blocks * bs, two.host_hit_tokens, "nothing was preempted: loads are first admissions");
            /* write_back: the tier gets only what the device cache evicts. Radix keeps a prefix-closed set on the
             * device, so the unbounded tier again completes every hit; hash may lose a middle block's successors. */
            c.host_write_policy = KVP_HC_WRITE_BACK;
            kvp_engine_metrics wb = run_tracked(&c, w);
            cr_assert_eq(wb.finished, w->n);
            cr_assert_gt(wb.host_hit_tokens, 0);
            if (kind == 0)
                cr_assert_eq(wb.prefix_hit_tokens + wb.host_hit_tokens, want, "write-back block %d: %lld + %lld, brute force %lld",
                             bs, (long long)wb.prefix_hit_tokens, (long long)wb.host_hit_tokens, (long long)want);
            else
                cr_assert_leq(wb.prefix_hit_tokens + wb.host_hit_tokens, want);
            cr_assert_eq(R.stores, wb.host_stored_blocks);
            cr_assert_leq(wb.host_stored_blocks, wb.evicted_blocks, "a write-back store without an eviction");
            cr_assert_lt(wb.host_stored_blocks, two.host_stored_blocks, "write-back stores fewer blocks than write-through");
            kvp_workload_destroy(w);
        }
}

/* write_through_selective stores a block once a request found it in the device cache (SGLang: a node's hit
 * count reaching 2). In a device cache that never evicts, the tier then holds exactly the distinct blocks
 * ever hit (a brute-force count), and the hits are those of the device alone. Through the 256-slot device
 * cache, it stores fewer blocks than write-through, and the chat's reused history still comes back from it. */
Test(scheduler, write_through_selective_stores_the_reused_blocks)
{
    for (int kind = 0; kind < 2; kind++)
        for (int32_t bs = 4; bs <= 16; bs += 12) {
            kvp_workload *w = spaced_chat();
            const int64_t want = kvp_test_bruteforce_hits(w, bs), reused = kvp_test_bruteforce_hit_blocks(w, bs);
            kvp_engine_config c = base_cfg(bs, 1 << 20);
            c.cache = kind ? KVP_PC_HASH : KVP_PC_RADIX;
            c.max_model_len = 4096;
            c.host_cache_slots = 1 << 16;
            c.host_write_policy = KVP_HC_WRITE_THROUGH_SELECTIVE;
            kvp_engine_metrics big = run_tracked(&c, w);
            cr_assert_eq(big.evicted_blocks, 0);
            cr_assert_eq(big.prefix_hit_tokens, want);
            cr_assert_eq(big.host_hit_tokens, 0, "the device cache found everything");
            cr_assert_gt(reused, 0);
            cr_assert_eq(big.host_stored_blocks, reused, "cache %d block %d: %lld stored, %lld distinct blocks hit", kind,
                         bs, (long long)big.host_stored_blocks, (long long)reused);
            cr_assert_eq(R.stores, big.host_stored_blocks);
            c.host_write_policy = KVP_HC_WRITE_THROUGH;
            kvp_engine_metrics all = run_metrics(&c, w);
            cr_assert_gt(all.host_stored_blocks, reused, "write-through stores the blocks used once too");

            kvp_engine_config t = base_cfg(bs, 256);
            t.cache = c.cache;
            t.host_cache_slots = 1 << 16;
            kvp_engine_metrics wt = run_metrics(&t, w);
            t.host_write_policy = KVP_HC_WRITE_THROUGH_SELECTIVE;
            kvp_engine_metrics sel = run_tracked(&t, w);
            cr_assert_eq(sel.finished, w->n);
            cr_assert_gt(sel.evicted_blocks, 0);
            cr_assert_gt(sel.host_hit_tokens, 0, "reused history evicted from the device comes back from the tier");
            cr_assert_leq(sel.prefix_hit_tokens + sel.host_hit_tokens, want);
            cr_assert_lt(sel.host_stored_blocks, wt.host_stored_blocks);
            cr_assert_eq(R.stores, sel.host_stored_blocks);
            cr_assert_eq(R.loads, sel.host_loaded_blocks);
            kvp_workload_destroy(w);
        }
}

/* Write-back under load: many conversations at once through a small device cache and a tier of a few
 * blocks, so evictions (and their stores) happen in steps whose admissions loaded from the tier: a store
 * must never take a slot such a load still reads (the recorder checks every step), and the engine's
 * walkers pass after every step. */
Test(scheduler, write_back_never_overwrites_a_pending_load)
{
    for (int kind = 0; kind < 2; kind++)
        for (int64_t tier = 2; tier <= 12; tier += 2) {
            kvp_workload *w = NULL;
            cr_assert_eq(kvp_workload_generate("chat:conversations=12,turns=3,system=24,user=8,assistant=8", &w), KVP_OK);
            kvp_engine_config c = base_cfg(4, 160);
            c.cache = kind ? KVP_PC_HASH : KVP_PC_RADIX;
            c.host_cache_slots = tier * 4;
            c.host_write_policy = KVP_HC_WRITE_BACK;
            kvp_engine_metrics m = run_tracked(&c, w);
            cr_assert_eq(m.finished, w->n);
            cr_assert_gt(m.host_loaded_blocks, 0, "tier %lld was meant to serve loads", (long long)tier);
            cr_assert_eq(R.loads, m.host_loaded_blocks);
            cr_assert_eq(R.stores, m.host_stored_blocks);
            kvp_workload_destroy(w);
        }
}

/* Requests that wait for an earlier one's answer (kvp_request.after): request 1 arrives (its own time,
 * 1 ms) while request 0 is still generating, so it arrives when request 0 finishes plus think_s; request 2
 * waits for request 1 with no think time; request 3 waits for request 0 but its own time comes later, so it
 * keeps it. The recorder's steps are 1 ms. */
Test(scheduler, a_request_waiting_for_an_answer_arrives_after_it)
{
    kvp_executor ex = rec_executor();
    kvp_engine_config c = base_cfg(4, 1024);
    int32_t p[] = {8, 8, 8, 8}, o[] = {16, 4, 4, 2};
    double arr[] = {0, 0.001, 0.002, 5.0};
    kvp_workload *w = make_wl(4, p, o, arr, NULL);
    w->reqs[1].after = 1;
    w->reqs[1].think_s = 0.5;
    w->reqs[2].after = 2;
    w->reqs[3].after = 1;
    w->reqs[3].think_s = 0.5;
    kvp_engine *e;
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    run_all(e, w);
    kvp_req_result r[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(kvp_engine_request(e, i, &r[i]), KVP_OK);
    cr_assert_float_eq(r[0].finish_s, 0.016, 1e-9, "16 steps of 1 ms");
    cr_assert_float_eq(r[1].arrival_s, r[0].finish_s + 0.5, 1e-9);
    cr_assert_float_eq(r[1].admit_s, r[1].arrival_s, 1e-9, "admitted as it arrives (memory is ample)");
    cr_assert_float_eq(r[2].arrival_s, r[1].finish_s, 1e-9);
    cr_assert_float_eq(r[3].arrival_s, 5.0, 1e-9, "its own time is later than the answer + think time");
    cr_assert_gt(first_step_of(1), last_step_of(0));
    cr_assert_gt(first_step_of(2), last_step_of(1));
    kvp_engine_metrics m;
    kvp_engine_metrics_get(e, &m);
    /* TTFT counts from the time the request was sent: one step for each */
    cr_assert_float_eq(m.ttft_p99_s, 0.001, 1e-9);
    kvp_engine_destroy(e);

    /* a request may only wait for one that arrives before it */
    w->reqs[1].after = 3;
    ex = rec_executor();
    cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
    cr_assert_eq(kvp_engine_run(e, w->reqs, w->n, NULL, NULL), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "after 3"), "%s", kvp_error_message());
    kvp_engine_destroy(e);
    kvp_workload_destroy(w);
}

/* Parallel samples (kvp_workload_fork: after_prompt): a sample joins the step after its request's prompt was
 * computed, keeps the request's arrival, and with a prefix cache computes only the prompt tokens the
 * brute-force reference does not find cached for it (an earlier sample's full blocks, never the last token),
 * reading its request's blocks (the KV model checks every block it reads); without a cache, or with an Orca
 * reservation, every sample computes the whole prompt. Random prompts, outputs, sample counts, arrivals and
 * block sizes; memory never runs short. */
static uint64_t rnd(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

Test(scheduler, parallel_samples_compute_the_prompt_once_and_share_its_full_blocks)
{
    uint64_t seed = 20261201;
    for (int trial = 0; trial < 24; trial++) {
        static const int32_t bss[] = {1, 4, 16};
        const int32_t bs = bss[trial % 3];
        const int nreq = 1 + (int)(rnd(&seed) % 4), n = 1 + (int)(rnd(&seed) % 4);
        int32_t p[4], o[4];
        double arr[4];
        for (int i = 0; i < nreq; i++) {
            p[i] = 1 + (int32_t)(rnd(&seed) % 80);
            o[i] = 1 + (int32_t)(rnd(&seed) % 20);
            arr[i] = (i > 0 ? arr[i - 1] : 0) + (double)(rnd(&seed) % 8) * 1e-3;
        }
        kvp_workload *base = make_wl(nreq, p, o, arr, NULL), *w = NULL;
        cr_assert_eq(kvp_workload_fork(base, n, &w), KVP_OK);
        cr_assert_eq(w->n, (int64_t)nreq * n);
        for (int mode = 0; mode < 3; mode++) { /* paged with a radix cache, paged without, orca-oracle */
            kvp_engine_config c = base_cfg(bs, 4096);
            c.max_num_seqs = 64;
            if (mode == 0) c.cache = KVP_PC_RADIX;
            if (mode == 2) c.alloc = KVP_ALLOC_ORCA_ORACLE;
            kvp_executor ex = rec_executor();
            if (mode < 2) track_workload(w);
            kvp_engine *e;
            cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
            run_all(e, w);
            int64_t want = 0;
            for (int64_t i = 0; i < w->n; i++) {
                const kvp_request *q = &w->reqs[i];
                const int32_t hit = mode == 0 ? kvp_test_bruteforce_hit(w, i, bs) : 0;
                want += q->prompt_len - hit + q->output_len - 1;
                kvp_req_result rr, rp;
                cr_assert_eq(kvp_engine_request(e, i, &rr), KVP_OK);
                cr_assert_eq(rr.cached_tokens, hit, "trial %d mode %d sample %lld", trial, mode, (long long)i);
                if (!q->after_prompt) continue;
                cr_assert_eq(kvp_engine_request(e, q->after - 1, &rp), KVP_OK);
                cr_assert_float_eq(rr.arrival_s, rp.arrival_s, 1e-12, "a sample keeps its request's arrival");
                cr_assert_eq(first_step_of(i), first_step_of(q->after - 1) + 1,
                             "trial %d mode %d: sample %lld joins the step after the prompt", trial, mode, (long long)i);
            }
            kvp_engine_metrics m;
            cr_assert_eq(kvp_engine_metrics_get(e, &m), KVP_OK);
            cr_assert_eq(m.computed_tokens, want, "trial %d mode %d: %lld tokens computed, %lld expected", trial, mode,
                         (long long)m.computed_tokens, (long long)want);
            cr_assert_eq(m.preemptions, 0);
            kvp_engine_destroy(e);
        }
        kvp_workload_destroy(w);
        kvp_workload_destroy(base);
    }
}

/* A parallel sample must name the request it samples, one arriving with it. */
Test(scheduler, a_parallel_sample_without_its_request_is_refused)
{
    int32_t p[] = {8, 8}, o[] = {2, 2};
    double arr[] = {0, 0.5};
    kvp_workload *w = make_wl(2, p, o, arr, NULL);
    kvp_engine_config c = base_cfg(4, 1024);
    const int64_t after[] = {0, 1};
    const char *needle[] = {"needs the request it samples", "does not arrive with it"};
    for (int k = 0; k < 2; k++) {
        w->reqs[1].after = after[k];
        w->reqs[1].after_prompt = true;
        kvp_executor ex = rec_executor();
        kvp_engine *e;
        cr_assert_eq(kvp_engine_create(&c, &ex, &e), KVP_OK);
        cr_assert_eq(kvp_engine_run(e, w->reqs, w->n, NULL, NULL), KVP_EINVAL);
        cr_assert(strstr(kvp_error_message(), needle[k]), "%s", kvp_error_message());
        kvp_engine_destroy(e);
    }
    kvp_workload_destroy(w);
}

/* kvp_exec_batch_check, which a follower rank runs on every plan it receives (and the engine on every
 * batch in debug builds): a well-formed batch over 8 device and 4 host blocks of 4 tokens passes; each
 * field put out of range, one at a time, is refused. */
Test(exec_check, a_batch_out_of_its_pools_is_refused)
{
    enum { NB = 8, NH = 4, BS = 4 };
    int32_t t0[2] = {5, 6}, t1[1] = {7};
    int32_t bt0[2] = {3, 1}, bt1[2] = {0, 7};
    kvp_exec_seq seqs[2] = {{.req_id = 1, .context_len = 3, .num_new = 2, .sample = 1, .tokens = t0, .block_table = bt0, .num_blocks = 2},
                            {.req_id = 2, .context_len = 5, .num_new = 1, .sample = 1, .tokens = t1, .block_table = bt1, .num_blocks = 2}};
    int32_t pos[3] = {3, 4, 5}, qo[3] = {0, 2, 3}, kvi[3] = {0, 2, 4}, kvx[4] = {3, 1, 0, 7}, last[2] = {1, 2};
    int64_t slots[3] = {3 * BS + 3, 1 * BS + 0, 7 * BS + 1};
    uint8_t all[2] = {0, 0};
    kvp_block_copy so[1] = {{2, 3}}, si[1] = {{1, 4}}, cp[1] = {{5, 6}}, st[1] = {{6, 0}}, ld[1] = {{2, 2}};
    const kvp_exec_batch good = {
        .seqs = seqs, .n = 2, .block_size = BS,
        .ops = {.swap_out = so, .n_swap_out = 1, .swap_in = si, .n_swap_in = 1, .copies = cp, .n_copies = 1},
        .offload = {.store = st, .n_store = 1, .load = ld, .n_load = 1},
        .flat = {.num_tokens = 3, .tokens = (int32_t[]){5, 6, 7}, .positions = pos, .slot_mapping = slots,
                 .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = kvx, .kv_last_page_len = last, .all_logits = all,
                 .num_rows = 2}};
    cr_assert_eq(kvp_exec_batch_check(&good, NB, NH), KVP_OK, "%s", kvp_error_detail());
    /* a smaller pool than the plan's block ids */
    cr_assert_eq(kvp_exec_batch_check(&good, 7, NH), KVP_EPARSE);
    cr_assert_eq(kvp_exec_batch_check(&good, NB, 2), KVP_EPARSE); /* the load reads host block 2 */

    kvp_exec_batch b;
#define REFUSED(mutate, restore)                                                                                    \
    do {                                                                                                            \
        b = good;                                                                                                   \
        mutate;                                                                                                     \
        cr_assert_eq(kvp_exec_batch_check(&b, NB, NH), KVP_EPARSE, "accepted: %s", #mutate);                        \
        restore;                                                                                                    \
        cr_assert_eq(kvp_exec_batch_check(&good, NB, NH), KVP_OK, "not restored: %s", #restore);                    \
    } while (0)
    REFUSED(bt1[1] = NB, bt1[1] = 7);                         /* a block-table entry past the pool */
    REFUSED(bt0[0] = -1, bt0[0] = 3);
    REFUSED(seqs[1].num_blocks = 1, seqs[1].num_blocks = 2); /* 6 tokens in one block of 4 */
    REFUSED(seqs[0].num_new = 0, seqs[0].num_new = 2);
    REFUSED(so[0].dst = NH, so[0].dst = 3);                  /* swap-out into a host block that is not there */
    REFUSED(si[0].src = NH, si[0].src = 1);
    REFUSED(cp[0].dst = NB, cp[0].dst = 6);
    REFUSED(st[0].dst = -1, st[0].dst = 0);
    REFUSED(ld[0].dst = NB, ld[0].dst = 2);
    REFUSED(slots[2] = NB * BS, slots[2] = 7 * BS + 1);     /* a token written past the pool */
    REFUSED(kvx[3] = NB, kvx[3] = 7);
    REFUSED(last[0] = 2, last[0] = 1);                       /* pages that do not cover the tokens */
    REFUSED(qo[1] = 1, qo[1] = 2);
#undef REFUSED
}
