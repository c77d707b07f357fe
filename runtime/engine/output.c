/* runtime/engine/output.c — the output stage: after the forward pass, every scheduled sequence that reached
 * the end of its known tokens gets its next token (contract: engine.h, step 4).
 *
 *   no logits (sim)          the workload's answer token, else a made-up one (request id x position)
 *   logits, no params        greedy, or the workload's answer (teacher forcing); EOS ignored
 *   logits + params          n > 1: the prompt's sequence forks into n after its logits (shared blocks,
 *                            copy-on-write), sample i drawing with generator stream i of the seed; beam
 *                            search: the W best of the W x V extensions, forking a beam chosen twice and
 *                            dropping one chosen never; drafts: each place drawn as without speculation,
 *                            a draft kept while it equals the draw, the rest truncated; logit bias,
 *                            penalties, min_tokens masks, EOS / stop ids, logprobs and prompt logprobs
 * Each sequence owns its generator, so results do not depend on the batch. Plain draws of a step are made
 * on the executor's threads first (the serial part of a batched step), with the same results.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "runtime/engine/engine_internal.h"

enum { SAMPLE_THREADS = 8 };

/* A plain sample drawn ahead of the serial pass from a copy of the sequence's generator: used only if the
 * generator is still `before` when the serial pass reaches the sequence. */
typedef struct {
    int eligible;
    int32_t tok;
    double lp;
    kvp_rng before, after;
} presample;

struct out_ws {
    int32_t vocab;
    float *lsm;                       /* [vocab] log softmax scratch */
    kvp_sampler_ws *ws[SAMPLE_THREADS];
    float *pen[SAMPLE_THREADS];       /* a row's logits with bias and penalties */
    int32_t *cnt[SAMPLE_THREADS];     /* token counts (zeros) for the penalties */
    presample *pre;
    size_t cap_pre;
};

/* ---------------------------------------------------------------- logprobs */

void kvp_logprobs_free(kvp_logprobs *a)
{
    kvp_free(a->lp);
    kvp_free(a->top_ids);
    kvp_free(a->top_lps);
    *a = (kvp_logprobs){0};
}

void lp_acc_free(lp_acc *x)
{
    kvp_logprobs_free(&x->a);
    x->cap_lp = x->cap_ids = x->cap_lps = 0;
}

kvp_status kvp_logprobs_copy(const kvp_logprobs *src, kvp_logprobs *dst)
{
    const size_t n = (size_t)src->n, nk = n * (size_t)src->k;
    *dst = (kvp_logprobs){.n = src->n, .k = src->k, .lp = kvp_malloc((n + 1) * sizeof(float)),
                          .top_ids = kvp_malloc((nk + 1) * sizeof(int32_t)), .top_lps = kvp_malloc((nk + 1) * sizeof(float))};
    if (!dst->lp || !dst->top_ids || !dst->top_lps) {
        kvp_logprobs_free(dst);
        return KVP_ERR(KVP_ENOMEM, "engine: out of memory copying logprobs");
    }
    if (n) memcpy(dst->lp, src->lp, n * sizeof(float));
    if (nk) {
        memcpy(dst->top_ids, src->top_ids, nk * sizeof(int32_t));
        memcpy(dst->top_lps, src->top_lps, nk * sizeof(float));
    }
    return KVP_OK;
}

/* Appends a place to x: the log-probability of tok under logits (V of them) and x's k most likely tokens
 * there; logits NULL: a place with nothing before it (NaN, ids -1). lsm: V floats of scratch. */
static kvp_status lp_push(lp_acc *x, const float *logits, int32_t V, int32_t tok, float *lsm)
{
    kvp_logprobs *a = &x->a;
    const size_t n = (size_t)a->n, k = (size_t)a->k;
    KVP_TRY(kvp_grow((void **)&a->lp, &x->cap_lp, n + 1, sizeof *a->lp));
    if (k) {
        KVP_TRY(kvp_grow((void **)&a->top_ids, &x->cap_ids, (n + 1) * k, sizeof *a->top_ids));
        KVP_TRY(kvp_grow((void **)&a->top_lps, &x->cap_lps, (n + 1) * k, sizeof *a->top_lps));
    }
    if (logits) kvp_log_softmax(logits, V, lsm);
    a->lp[n] = logits ? lsm[tok] : NAN;
    if (k && logits) kvp_top_logprobs(lsm, V, (int32_t)k, a->top_ids + n * k, a->top_lps + n * k);
    for (size_t i = 0; k && !logits && i < k; i++) {
        a->top_ids[n * k + i] = -1;
        a->top_lps[n * k + i] = NAN;
    }
    a->n++;
    return KVP_OK;
}

/* ---------------------------------------------------------------- workspace */

static kvp_status scratch(struct out_ws *w, int k)
{
    if (!w->ws[k]) KVP_TRY(kvp_sampler_ws_create(w->vocab, &w->ws[k]));
    if (!w->pen[k] && !(w->pen[k] = kvp_malloc((size_t)w->vocab * sizeof(float))))
        return KVP_ERR(KVP_ENOMEM, "engine: out of memory for the sampler");
    if (!w->cnt[k] && !(w->cnt[k] = kvp_calloc((size_t)w->vocab, sizeof(int32_t))))
        return KVP_ERR(KVP_ENOMEM, "engine: out of memory for the sampler");
    return KVP_OK;
}

static void ws_free(struct out_ws *w)
{
    if (!w) return;
    kvp_free(w->lsm);
    for (int k = 0; k < SAMPLE_THREADS; k++) {
        kvp_sampler_ws_destroy(w->ws[k]);
        kvp_free(w->pen[k]);
        kvp_free(w->cnt[k]);
    }
    kvp_free(w->pre);
    kvp_free(w);
}

kvp_status out_create(kvp_engine *e)
{
    e->ows = NULL; /* made at the first logits, when the vocabulary is known */
    return KVP_OK;
}

void out_destroy(kvp_engine *e)
{
    ws_free(e->ows);
    e->ows = NULL;
}

/* The workspace for a vocabulary of V (an executor's vocabulary never changes). */
static kvp_status ws_for(kvp_engine *e, int32_t V)
{
    if (e->ows && e->ows->vocab == V) return KVP_OK;
    if (e->ows) return KVP_ERR(KVP_ESTATE, "executor %s changed its vocabulary from %d to %d", e->ex->name,
                               e->ows->vocab, V);
    struct out_ws *w = kvp_calloc(1, sizeof *w);
    if (!w) return KVP_ERR(KVP_ENOMEM, "engine: out of memory for the sampler");
    w->vocab = V;
    kvp_status st = (w->lsm = kvp_malloc((size_t)V * sizeof *w->lsm)) ? scratch(w, 0)
                                                                       : KVP_ERR(KVP_ENOMEM, "engine: out of memory");
    if (st != KVP_OK) {
        ws_free(w);
        return st;
    }
    e->ows = w;
    return KVP_OK;
}

/* ---------------------------------------------------------------- drawing */

static const float *row_of(const kvp_engine *e, int32_t row) { return e->logits + (int64_t)row * e->vocab; }

static bool is_eos(const kvp_engine *e, int32_t tok)
{
    for (int32_t i = 0; i < e->cfg.n_eos; i++)
        if (e->cfg.eos_ids[i] == tok) return true;
    return false;
}

/* Whether s draws from its logits as they are: no logit bias, no penalties, no masks before min_tokens. */
static bool draws_unchanged(const kvp_engine *e, const seq_t *s)
{
    const kvp_output_params *q = RQ_(e, s)->req->out;
    return q->n_bias == 0 && !kvp_sampler_penalized(&q->sampler) && s->num_generated >= q->min_tokens;
}

/* s's next token from its logits lg, drawn with rng by sampling thread k: with its request's logit bias and
 * penalties applied to a copy first, and before min_tokens, EOS and the stop ids masked. *lp: the token's
 * log-probability under lg (0 with skip_logprob). */
static int32_t draw(const kvp_engine *e, const seq_t *s, kvp_rng *rng, const float *lg, int k, double *lp)
{
    const req_t *r = RQ_(e, s);
    const kvp_output_params *q = r->req->out;
    const struct out_ws *w = e->ows;
    const int32_t V = e->vocab;
    const bool early = s->num_generated < q->min_tokens, skip = e->cfg.skip_logprob;
    *lp = 0.0;
    if (draws_unchanged(e, s))
        return skip ? kvp_sample(&q->sampler, rng, lg, V, w->ws[k]) : kvp_sample_logprob(&q->sampler, rng, lg, V, w->ws[k], lp);
    float *x = w->pen[k];
    memcpy(x, lg, (size_t)V * sizeof *x);
    for (int32_t i = 0; i < q->n_bias; i++) x[q->bias_ids[i]] += q->bias[i];
    for (int32_t i = 0; early && e->cfg.stop_at_eos && !q->ignore_eos && i < e->cfg.n_eos; i++)
        if (e->cfg.eos_ids[i] >= 0 && e->cfg.eos_ids[i] < V) x[e->cfg.eos_ids[i]] = -INFINITY;
    for (int32_t i = 0; early && i < q->n_stop_ids; i++) x[q->stop_ids[i]] = -INFINITY;
    if (kvp_sampler_penalized(&q->sampler))
        kvp_apply_penalties(&q->sampler, x, V, r->req->tokens, r->prompt_len, s->gen, s->num_generated, w->cnt[k]);
    const int32_t tok = kvp_sample(&q->sampler, rng, x, V, w->ws[k]);
    if (!skip) *lp = kvp_token_logprob(lg, V, tok);
    return tok;
}

typedef struct {
    kvp_engine *e;
    int32_t i0, i1;
    int k;
} sample_job;

/* Draws the eligible presamples of batch rows i0 .. i1-1 (reads logits and sequences, writes only pre[]).
 * Draws from unchanged logits go KVP_SAMPLE_MANY at a time through kvp_sample_many (the same tokens). */
static void sample_main(void *arg, int k)
{
    sample_job *j = (sample_job *)arg + k;
    kvp_engine *e = j->e;
    struct out_ws *w = e->ows;
    const bool skip = e->cfg.skip_logprob;
    const kvp_sampler_params *gp[KVP_SAMPLE_MANY];
    kvp_rng *gr[KVP_SAMPLE_MANY];
    const float *gl[KVP_SAMPLE_MANY];
    presample *gps[KVP_SAMPLE_MANY];
    int32_t gt[KVP_SAMPLE_MANY];
    double glp[KVP_SAMPLE_MANY];
    int ng = 0;
    for (int32_t i = j->i0; i < j->i1; i++) {
        presample *ps = &w->pre[i];
        if (ps->eligible) {
            const seq_t *s = S_(e, e->sched[i]);
            const float *lg = row_of(e, s->lrow);
            ps->before = ps->after = s->rng;
            if (!draws_unchanged(e, s)) {
                ps->tok = draw(e, s, &ps->after, lg, j->k, &ps->lp);
            } else {
                gp[ng] = &RQ_(e, s)->req->out->sampler, gr[ng] = &ps->after, gl[ng] = lg, gps[ng] = ps;
                ng++;
            }
        }
        if (ng == KVP_SAMPLE_MANY || (ng > 0 && i + 1 == j->i1)) {
            kvp_sample_many(ng, gp, gr, gl, e->vocab, w->ws[j->k], gt, skip ? NULL : glp);
            for (int q = 0; q < ng; q++) gps[q]->tok = gt[q], gps[q]->lp = skip ? 0.0 : glp[q];
            ng = 0;
        }
    }
}

/* Whether s samples plainly this step: the end of its known tokens, one sample, no drafts, params. */
static bool plain_draw(const kvp_engine *e, const seq_t *s)
{
    const req_t *r = RQ_(e, s);
    return s->state == SEQ_RUNNING && s->row >= 0 && s->num_computed >= total_known(e, s) && r->output_len > 0 &&
           r->req->out && !r->beams && !s->fork_pending && s->ndraft == 0;
}

/* The plain samples of the step drawn on the executor's threads first. Returns false (the serial pass draws
 * them) when there is too little to share or a helper cannot be set up. */
static bool presample_step(kvp_engine *e)
{
    const int32_t ns = e->sched_n;
    int nt = e->ex->threads && e->ex->parallel ? e->ex->threads(e->ex->ctx) : 1;
    if (nt > SAMPLE_THREADS) nt = SAMPLE_THREADS;
    struct out_ws *w = e->ows;
    if (nt < 2 || ns < 16 || kvp_grow((void **)&w->pre, &w->cap_pre, (size_t)ns, sizeof *w->pre) != KVP_OK) return false;
    for (int k = 1; k < nt; k++)
        if (scratch(w, k) != KVP_OK) {
            kvp_error_clear();
            return false;
        }
    int32_t n_el = 0;
    for (int32_t i = 0; i < ns; i++) n_el += (w->pre[i].eligible = plain_draw(e, S_(e, e->sched[i])));
    if (n_el < 16) return false;
    sample_job jobs[SAMPLE_THREADS];
    for (int k = 0; k < nt; k++)
        jobs[k] = (sample_job){.e = e, .i0 = (int32_t)((int64_t)ns * k / nt), .i1 = (int32_t)((int64_t)ns * (k + 1) / nt), .k = k};
    e->ex->parallel(e->ex->ctx, nt, sample_main, jobs);
    return true;
}

/* ---------------------------------------------------------------- finishing */

/* Request a finished (its last sequence ended). */
kvp_status out_finish_req(kvp_engine *e, int64_t a)
{
    req_t *r = R_(e, a);
    r->state = KVP_REQ_FINISHED;
    r->finish_s = e->now;
    e->beam_reserved -= r->reserved;
    r->reserved = 0;
    e->finished++;
    e->step_finished++;
    e->last_finish_s = e->now;
    KVP_TRY(sch_release_children(e, a, false));
    if (e->cfg.keep_outputs) {
        KVP_TRY(kvp_grow((void **)&e->fin, &e->fin_cap, (size_t)e->fin_n + 1, sizeof *e->fin));
        e->fin[e->fin_n++] = a;
    } else {
        for (int64_t q = r->first_seq; q >= 0; q = S_(e, q)->next) { /* nobody reads them: keep memory flat */
            seq_t *s = S_(e, q);
            kvp_free(s->gen);
            s->gen = NULL;
            s->gen_cap = 0;
            lp_acc_free(&s->glp);
        }
    }
    return KVP_OK;
}

kvp_status out_finish_seq(kvp_engine *e, int64_t slot, kvp_finish_reason why)
{
    seq_t *s = S_(e, slot);
    req_t *r = RQ_(e, s);
    s->finish = why;
    /* its answer is reusable when its tokens are real (the workload's, or generated for a client: a request
     * with output params), so the next turn of a chat finds it; a trace's made-up tokens are not (the rule
     * does not depend on the executor); a failure there only loses those hits */
    const bool real = r->req->output_tokens != NULL || r->req->out != NULL;
    if (real && !s->dropped && (s->state == SEQ_RUNNING) && kvm_cache_computed(e, s) != KVP_OK) kvp_error_clear();
    if (s->state == SEQ_RUNNING || s->state == SEQ_SWAPPED) {
        if (s->state == SEQ_RUNNING) e->seats -= seats_of(e, s);
        KVP_TRY(kvm_release(e, s));
    }
    s->state = SEQ_DONE;
    s->fork_pending = false;
    if (--r->n_live == 0) return out_finish_req(e, s->req);
    return KVP_OK;
}

/* Records the first token time and appends tok (and its log-probabilities under lg, the logits it was drawn
 * from, when its request wants them); ends the sample at EOS, a stop id or its length. */
static kvp_status emit(kvp_engine *e, int64_t slot, int32_t tok, double lp, const float *lg)
{
    seq_t *s = S_(e, slot);
    req_t *r = RQ_(e, s);
    const kvp_output_params *q = r->req->out;
    if (r->first_token_s < 0) r->first_token_s = e->now;
    kvp_finish_reason why = KVP_FINISH_LENGTH;
    if (q && !r->beams && e->cfg.stop_at_eos && !q->ignore_eos && is_eos(e, tok)) why = KVP_FINISH_EOS;
    for (int32_t i = 0; q && why == KVP_FINISH_LENGTH && !r->beams && i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) why = KVP_FINISH_STOP_TOKEN;
    if (why != KVP_FINISH_LENGTH) {
        s->stop_token = tok;
        return out_finish_seq(e, slot, why);
    }
    if (q && q->logprobs && lg) KVP_TRY(lp_push(&s->glp, lg, e->vocab, tok, e->ows->lsm));
    KVP_TRY(kvp_grow((void **)&s->gen, &s->gen_cap, (size_t)s->num_generated + 1 + KVP_MAX_SPEC, sizeof *s->gen));
    s->gen[s->num_generated++] = tok;
    s->logprob += lp;
    if (s->num_generated > r->max_generated) r->max_generated = s->num_generated;
    return s->num_generated >= r->output_len ? out_finish_seq(e, slot, KVP_FINISH_LENGTH) : KVP_OK;
}

/* A token for s without params: the workload's answer (teacher forcing: a later prompt contains exactly
 * these tokens), else greedy from its logits, else (no model) a deterministic stand-in. */
static int32_t plain_token(const kvp_engine *e, const seq_t *s)
{
    const req_t *r = RQ_(e, s);
    if (r->req->output_tokens && s->num_generated < r->output_len) return r->req->output_tokens[s->num_generated];
    if (e->logits) return kvp_argmax(row_of(e, s->lrow), e->vocab);
    return (int32_t)(((uint64_t)r->req->id * 2654435761u + (uint64_t)total_known(e, s)) & 0x7fff);
}

/* ---------------------------------------------------------------- forks, beams, drafts */

/* Forks sequence slot into a new running sequence (shared blocks, copied tokens); it joins the running
 * queue at the end of the step. */
static kvp_status fork_seq(kvp_engine *e, int64_t slot, int32_t sample, int64_t *child)
{
    int64_t c;
    KVP_TRY(eng_new_seq(e, S_(e, slot)->req, sample, &c)); /* may move e->seqs */
    seq_t *p = S_(e, slot), *s = S_(e, c);
    if (p->num_generated > 0) {
        KVP_TRY(kvp_grow((void **)&s->gen, &s->gen_cap, (size_t)p->num_generated + 1 + KVP_MAX_SPEC, sizeof *s->gen));
        memcpy(s->gen, p->gen, (size_t)p->num_generated * sizeof *s->gen);
    }
    s->num_generated = p->num_generated;
    s->num_computed = p->num_computed;
    s->seen_hit = p->seen_hit;
    s->logprob = p->logprob;
    s->inserted = true;
    KVP_TRY(kvm_fork(e, p, s));
    s->state = SEQ_RUNNING;
    e->seats++;
    KVP_TRY(kvp_grow((void **)&e->admitted, &e->admitted_cap, (size_t)e->admitted_n + 1, sizeof *e->admitted));
    e->admitted[e->admitted_n++] = c;
    *child = c;
    return KVP_OK;
}

typedef struct {
    double score;
    int64_t parent; /* slot */
    int32_t pos;    /* parent's order among the beams */
    int32_t tok;
    float lp;
} cand;

/* Candidate order: score desc, then parent order, then token id (a total order: (pos, tok) is unique). */
static int cand_before(const cand *a, const cand *b)
{
    if (a->score != b->score) return a->score > b->score;
    return a->pos != b->pos ? a->pos < b->pos : a->tok < b->tok;
}

static int cand_cmp(const void *a, const void *b) { return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0; }

/* Restores the heap below i: h[0] is the worst of the kept candidates (the one any better one replaces). */
static void cand_sift_down(cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cand_before(&h[w], &h[l])) w = l;
        if (r < n && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Beam step of the request of beams[0..nb) (every live beam, logits in their rows): the W best extensions
 * over every (beam, token) pair are kept in a heap of W (nb x V x log W), then sorted; forks first (from
 * parents still alive), then drops, then appends. */
static kvp_status beam_step(kvp_engine *e, const int64_t *beams, int32_t nb)
{
    const int32_t W = RQ_(e, S_(e, beams[0]))->group, V = e->vocab;
    cand *c = kvp_malloc((size_t)W * sizeof *c);
    int32_t *sel = kvp_calloc((size_t)nb, sizeof *sel);
    int64_t *target = kvp_malloc((size_t)W * sizeof *target);
    kvp_status st = c && sel && target ? KVP_OK : KVP_ERR(KVP_ENOMEM, "engine: out of memory in a beam step");
    int32_t nc = 0;
    for (int32_t b = 0; st == KVP_OK && b < nb; b++) {
        const seq_t *s = S_(e, beams[b]);
        kvp_log_softmax(row_of(e, s->lrow), V, e->ows->lsm);
        for (int32_t t = 0; t < V; t++) {
            const cand x = {s->logprob + e->ows->lsm[t], beams[b], b, t, e->ows->lsm[t]};
            if (nc < W) { /* fill, then heapify once full */
                c[nc++] = x;
                if (nc == W)
                    for (int32_t i = W / 2; i-- > 0;) cand_sift_down(c, W, i);
            } else if (cand_before(&x, &c[0])) {
                c[0] = x;
                cand_sift_down(c, W, 0);
            }
        }
    }
    if (st == KVP_OK) qsort(c, (size_t)nc, sizeof *c, cand_cmp);
    const int32_t keep = nc < W ? nc : W;
    for (int32_t i = 0; st == KVP_OK && i < keep; i++) {
        if (sel[c[i].pos]++ == 0) target[i] = c[i].parent;
        else st = fork_seq(e, c[i].parent, 0, &target[i]);
    }
    for (int32_t b = 0; st == KVP_OK && b < nb; b++)
        if (sel[b] == 0) { /* a dropped beam is no result: its slot goes at the end of the step */
            S_(e, beams[b])->dropped = true;
            st = out_finish_seq(e, beams[b], KVP_FINISH_LENGTH);
        }
    for (int32_t i = 0; st == KVP_OK && i < keep; i++) {
        S_(e, target[i])->logprob = c[i].score - c[i].lp; /* emit adds lp back */
        st = emit(e, target[i], c[i].tok, c[i].lp, NULL);
    }
    kvp_free(target);
    kvp_free(c);
    kvp_free(sel);
    return st;
}

/* A speculating sequence after the forward pass: its last token and its drafts were computed (rows row ..
 * row + ndraft). Each place's token is drawn as without speculation and emitted; a draft equal to it is kept
 * (its K/V stays valid) and the next place is drawn, else the drawing stops there. Then the slots past the
 * kept tokens are truncated away. */
static kvp_status verify_drafts(kvp_engine *e, int64_t slot)
{
    seq_t *s = S_(e, slot);
    const int32_t k = s->ndraft, row0 = s->row;
    int32_t d[KVP_MAX_SPEC];
    memcpy(d, s->gen + s->num_generated, (size_t)k * sizeof *d);
    s->ndraft = 0;
    s->step_gen0 = s->num_generated;
    for (int32_t i = 0; i <= k; i++) {
        const float *lg = row_of(e, row0 + i);
        double lp;
        s->step_lp[i] = s->logprob;
        const int32_t t = draw(e, s, &s->rng, lg, 0, &lp);
        KVP_TRY(emit(e, slot, t, lp, lg));
        if (s->state == SEQ_DONE || i == k || t != d[i]) break;
        s->num_computed++;
        e->spec_accepted_tokens++;
    }
    if (s->state == SEQ_DONE) return KVP_OK; /* its blocks are freed */
    return kvm_truncate(e, s, s->num_computed);
}

/* The prompt places s's step predicts (a chunk of its prompt, every token's logits from s->row), recorded
 * once each: the logits at position p are those of token p + 1. */
static kvp_status record_prompt_logprobs(kvp_engine *e, seq_t *s)
{
    req_t *r = RQ_(e, s);
    lp_acc *x = &r->plp;
    if (x->a.n == 0) KVP_TRY(lp_push(x, NULL, e->vocab, 0, e->ows->lsm));
    for (int32_t j = 0; j < s->sched_new; j++) {
        const int32_t place = s->num_computed + j + 1;
        if (place == x->a.n && place < r->prompt_len)
            KVP_TRY(lp_push(x, row_of(e, s->row + j), e->vocab, r->req->tokens[place], e->ows->lsm));
    }
    return KVP_OK;
}

/* The first sample of request slot's group: the prompt's logits are drawn by n sequences. */
static kvp_status fork_samples(kvp_engine *e, int64_t slot)
{
    const int32_t n = RQ_(e, S_(e, slot))->group;
    S_(e, slot)->fork_pending = false;
    e->seats -= n - 1; /* the group's seats now belong to its sequences */
    int64_t *kids = kvp_malloc((size_t)n * sizeof *kids);
    if (!kids) return KVP_ERR(KVP_ENOMEM, "engine: out of memory forking %d samples", n);
    kvp_status st = KVP_OK;
    int32_t nk = 0;
    for (; st == KVP_OK && nk < n - 1; nk++) st = fork_seq(e, slot, nk + 1, &kids[nk]);
    if (st == KVP_OK) {
        seq_t *s = S_(e, slot);
        const float *lg = row_of(e, s->lrow);
        double lp0, lp;
        const int32_t t0 = draw(e, s, &s->rng, lg, 0, &lp0);
        for (int32_t k = 0; st == KVP_OK && k < nk; k++) {
            seq_t *c = S_(e, kids[k]);
            const int32_t t = draw(e, c, &c->rng, lg, 0, &lp);
            st = emit(e, kids[k], t, lp, lg);
        }
        if (st == KVP_OK) st = emit(e, slot, t0, lp0, lg);
    }
    kvp_free(kids);
    return st;
}

/* ---------------------------------------------------------------- the stage */

kvp_status out_step(kvp_engine *e, const kvp_exec_result *res)
{
    e->logits = res->logits;
    e->vocab = res->logits ? res->vocab : 0;
    if (e->logits) KVP_TRY(ws_for(e, e->vocab));
    e->admitted_n = 0; /* forks of this step */
    /* computed counts, prompt logprobs, prompt caching */
    for (int32_t i = 0; i < e->sched_n; i++) {
        seq_t *s = S_(e, e->sched[i]);
        req_t *r = RQ_(e, s);
        const bool was_prefill = s->num_computed < r->prompt_len;
        if (e->logits && s->row >= 0 && s->ndraft == 0 && r->req->out && r->req->out->prompt_logprobs &&
            r->plp.a.n < r->prompt_len)
            KVP_TRY(record_prompt_logprobs(e, s));
        s->num_computed += s->sched_new - s->ndraft; /* drafts count once kept */
        const int32_t bs = e->cfg.block_size;
        if (was_prefill && s->num_computed < r->prompt_len && e->pc &&
            s->num_computed / bs > (s->num_computed - s->sched_new) / bs)
            KVP_TRY(kvm_cache_computed(e, s)); /* a chunk filled blocks: cached at once, as vLLM v1 does */
        if (was_prefill && s->num_computed >= r->prompt_len && !s->inserted) {
            KVP_TRY(kvm_cache_computed(e, s));
            s->inserted = true;
            if (!r->prompt_done) { /* its parallel samples find the prompt cached */
                r->prompt_done = true;
                KVP_TRY(sch_release_children(e, s->req, true));
            }
        }
    }
    const bool pre = e->logits && presample_step(e);
    for (int32_t i = 0; i < e->sched_n; i++) {
        const int64_t slot = e->sched[i];
        seq_t *s = S_(e, slot);
        req_t *r = RQ_(e, s);
        if (s->state != SEQ_RUNNING || s->num_computed < total_known(e, s)) continue;
        if (r->output_len == 0) { /* prompt only: nothing to generate */
            KVP_TRY(out_finish_seq(e, slot, KVP_FINISH_LENGTH));
            continue;
        }
        if (!e->logits || !r->req->out) {
            KVP_TRY(emit(e, slot, plain_token(e, s), 0.0, NULL));
            continue;
        }
        if (r->beams) {
            if (s->row < 0) continue; /* handled with its group */
            int64_t *beams = kvp_malloc((size_t)(r->group > 1 ? r->group : 1) * 2 * sizeof *beams);
            if (!beams) return KVP_ERR(KVP_ENOMEM, "engine: out of memory in a beam step");
            int32_t nb = 0;
            for (int32_t j = i; j < e->sched_n; j++) {
                seq_t *o = S_(e, e->sched[j]);
                if (o->req == s->req && o->state == SEQ_RUNNING && o->row >= 0 && o->num_computed == total_known(e, o)) {
                    beams[nb++] = e->sched[j];
                    if (o->fork_pending) { /* the search begins: its seats belong to its beams from now on */
                        o->fork_pending = false;
                        e->seats -= r->group - 1;
                    }
                }
            }
            kvp_status st = beam_step(e, beams, nb);
            for (int32_t j = 0; j < nb; j++) S_(e, beams[j])->row = -1; /* handled */
            kvp_free(beams);
            KVP_TRY(st);
            continue;
        }
        if (s->ndraft > 0) {
            KVP_TRY(verify_drafts(e, slot));
            continue;
        }
        if (s->fork_pending) {
            KVP_TRY(fork_samples(e, slot));
            continue;
        }
        const presample *ps = pre ? &e->ows->pre[i] : NULL;
        if (ps && ps->eligible && memcmp(&ps->before, &s->rng, sizeof s->rng) == 0) {
            s->rng = ps->after;
            KVP_TRY(emit(e, slot, ps->tok, ps->lp, row_of(e, s->lrow)));
            continue;
        }
        double lp;
        const int32_t t = draw(e, s, &s->rng, row_of(e, s->lrow), 0, &lp);
        KVP_TRY(emit(e, slot, t, lp, row_of(e, s->lrow)));
    }
    sch_compact_running(e);
    for (int32_t i = 0; i < e->admitted_n; i++) /* forks still running (one may have finished at once) */
        if (S_(e, e->admitted[i])->state == SEQ_RUNNING) sch_running_insert(e, e->admitted[i]);
    for (int32_t i = 0; i < e->sched_n; i++)
        if (S_(e, e->sched[i])->dropped) eng_free_seq(e, e->sched[i]);
    e->admitted_n = 0;
    e->logits = NULL;
    return KVP_OK;
}
