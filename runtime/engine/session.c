/* runtime/engine/session.c — the online session over the engine (contract: session.h): owned copies of the
 * requests (the engine borrows them), vocabulary and context checks, results collected from the engine's
 * samples when a request is taken. Session id = the engine's request index. */
#include "runtime/engine/session.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/timer.h"

/* One request's copies, alive from its add to its take. */
typedef struct {
    kvp_request r;
    kvp_output_params p;
    int32_t *prompt, *stop_ids, *bias_ids;
    float *bias;
    void *user;
} owned;

struct kvp_session {
    kvp_session_config cfg;
    int32_t *eos;         /* a copy of cfg.engine.eos_ids */
    kvp_executor ex;
    kvp_engine *e;
    owned **reqs;         /* [n] by id - base (NULL: taken) */
    int64_t n, base;
    size_t cap;
};

/* An owned copy of n elements of src (NULL when n is 0) into *out. */
static kvp_status dup_mem(const void *src, int32_t n, size_t elem, void **out)
{
    *out = NULL;
    if (n <= 0) return KVP_OK;
    if (!(*out = kvp_malloc((size_t)n * elem))) return KVP_ERR(KVP_ENOMEM, "session: out of memory");
    memcpy(*out, src, (size_t)n * elem);
    return KVP_OK;
}

kvp_session_config kvp_session_config_default(void)
{
    kvp_session_config c;
    memset(&c, 0, sizeof c);
    kvp_engine_config_default(&c.engine);
    c.engine.cache = KVP_PC_RADIX;
    c.engine.max_batched_tokens = 2048;
    c.kv_dtype = KVP_DTYPE_F32;
    return c;
}

static int64_t group_of(const kvp_session_request *r) { return r->beam_width > 1 ? r->beam_width : r->n; }

static int32_t clamp_tokens(const kvp_session_request *r, int32_t max_len)
{
    return r->n_prompt + (int64_t)r->max_tokens > max_len ? max_len - r->n_prompt : r->max_tokens;
}

int32_t kvp_session_blocks_for(const kvp_session_request *reqs, int32_t n, int32_t bs, int32_t max_len)
{
    int64_t blocks = 0;
    for (int32_t i = 0; i < n && bs > 0; i++) {
        const int32_t mt = clamp_tokens(&reqs[i], max_len);
        const int64_t len = reqs[i].n_prompt + (mt > 0 ? mt : 0);
        blocks += (len + bs - 1) / bs * (group_of(&reqs[i]) > 0 ? group_of(&reqs[i]) : 1);
    }
    return blocks > INT32_MAX / 2 ? INT32_MAX / 2 : blocks < 1 ? 1 : (int32_t)blocks;
}

kvp_status kvp_session_create(const kvp_session_config *cfg, kvp_executor ex, kvp_session **out)
{
    kvp_status st = KVP_OK;
    if (!cfg || !out) st = KVP_ERR(KVP_EINVAL, "session: NULL argument");
    else if (cfg->num_blocks < 1 || cfg->engine.block_size < 1 || cfg->vocab < 1 || cfg->host_cache_blocks < 0 ||
             cfg->swap_blocks < 0)
        st = KVP_ERR(KVP_EINVAL, "session: num_blocks (%d), block_size (%d) and the vocabulary (%d) must be >= 1, the "
                                 "host blocks >= 0", cfg ? cfg->num_blocks : 0, cfg ? cfg->engine.block_size : 0,
                     cfg ? cfg->vocab : 0);
    kvp_session *s = st == KVP_OK ? kvp_calloc(1, sizeof *s) : NULL;
    if (st == KVP_OK && !s) st = KVP_ERR(KVP_ENOMEM, "session: out of memory");
    if (st != KVP_OK) {
        kvp_executor_destroy(&ex);
        return st;
    }
    s->cfg = *cfg;
    s->ex = ex;
    kvp_engine_config ec = cfg->engine;
    if (ec.n_eos > 0) {
        if ((st = dup_mem(ec.eos_ids, ec.n_eos, sizeof *ec.eos_ids, (void **)&s->eos)) != KVP_OK) {
            kvp_session_destroy(s);
            return st;
        }
        ec.eos_ids = s->eos;
    }
    ec.kv_slots = (int64_t)cfg->num_blocks * ec.block_size;
    ec.host_cache_slots = (int64_t)cfg->host_cache_blocks * ec.block_size;
    ec.host_slots = (int64_t)cfg->swap_blocks * ec.block_size;
    ec.keep_outputs = true;
    ec.wall_clock = true;
    st = kvp_engine_create(&ec, &s->ex, &s->e);
    if (st != KVP_OK) {
        kvp_session_destroy(s);
        return st;
    }
    *out = s;
    return KVP_OK;
}

static void owned_free(owned *o)
{
    if (!o) return;
    kvp_free(o->prompt);
    kvp_free(o->stop_ids);
    kvp_free(o->bias_ids);
    kvp_free(o->bias);
    kvp_free(o);
}

void kvp_session_destroy(kvp_session *s)
{
    if (!s) return;
    kvp_engine_destroy(s->e); /* before the copies it borrows */
    for (int64_t i = 0; i < s->n; i++) owned_free(s->reqs[i]);
    kvp_free(s->reqs);
    kvp_free(s->eos);
    kvp_executor_destroy(&s->ex);
    kvp_free(s);
}

/* The checks the engine cannot make: the vocabulary, the context. i names the request. */
static kvp_status check_request(const kvp_session *s, const kvp_session_request *r, int64_t i)
{
    const int32_t maxlen = s->cfg.engine.max_model_len, V = s->cfg.vocab;
    if (r->n_prompt < 1 || !r->prompt)
        return KVP_ERR(KVP_EINVAL, "generate: prompt %lld is empty (it needs at least a BOS token)", (long long)i);
    if (r->n_prompt >= maxlen)
        return KVP_ERR(KVP_EINVAL, "generate: prompt %lld has %d tokens but the model's context is %d tokens",
                       (long long)i, r->n_prompt, maxlen);
    if (r->max_tokens < 0) return KVP_ERR(KVP_EINVAL, "generate: request %lld: max_tokens %d < 0", (long long)i, r->max_tokens);
    if (r->n_stop_ids < 0 || r->n_stop_ids > KVP_MAX_STOP_IDS || (r->n_stop_ids > 0 && !r->stop_ids))
        return KVP_ERR(KVP_EINVAL, "generate: request %lld: %d stop ids (0 to %d, and an array)", (long long)i,
                       r->n_stop_ids, KVP_MAX_STOP_IDS);
    for (int32_t j = 0; j < r->n_stop_ids; j++)
        if (r->stop_ids[j] < 0 || r->stop_ids[j] >= V)
            return KVP_ERR(KVP_EINVAL, "generate: request %lld stop id %d is %d, outside the vocabulary (%d)",
                           (long long)i, j, r->stop_ids[j], V);
    if (r->n_bias < 0 || r->n_bias > KVP_MAX_BIAS || (r->n_bias > 0 && (!r->bias_ids || !r->bias)))
        return KVP_ERR(KVP_EINVAL, "generate: request %lld: %d logit biases (0 to %d, and their arrays)", (long long)i,
                       r->n_bias, KVP_MAX_BIAS);
    for (int32_t j = 0; j < r->n_bias; j++)
        if (r->bias_ids[j] < 0 || r->bias_ids[j] >= V)
            return KVP_ERR(KVP_EINVAL, "generate: request %lld logit bias %d: token %d outside the vocabulary (%d)",
                           (long long)i, j, r->bias_ids[j], V);
    if (r->top_logprobs > V)
        return KVP_ERR(KVP_EINVAL, "generate: request %lld: top_logprobs %d is more than the vocabulary (%d)",
                       (long long)i, r->top_logprobs, V);
    for (int32_t j = 0; j < r->n_prompt; j++)
        if (r->prompt[j] < 0 || r->prompt[j] >= V)
            return KVP_ERR(KVP_EINVAL, "generate: prompt %lld token %d is %d, outside the vocabulary (%d)", (long long)i,
                           j, r->prompt[j], V);
    return KVP_OK;
}

/* Takes the records of the taken requests at the window's front once they are half of it. */
static void compact(kvp_session *s)
{
    int64_t d = 0;
    while (d < s->n && s->reqs[d] == NULL) d++;
    if (d < 64 || 2 * d < s->n) return;
    memmove(s->reqs, s->reqs + d, (size_t)(s->n - d) * sizeof *s->reqs);
    s->n -= d;
    s->base += d;
}

kvp_status kvp_session_add(kvp_session *s, const kvp_session_request *r, int32_t *id)
{
    const int64_t i = s->base + s->n;
    if (i >= INT32_MAX) return KVP_ERR(KVP_ESTATE, "generate: the session has used every request id");
    KVP_TRY(check_request(s, r, i));
    const int32_t maxlen = s->cfg.engine.max_model_len, bs = s->cfg.engine.block_size;
    const int32_t mt = clamp_tokens(r, maxlen);
    const int64_t one = (r->n_prompt + mt + bs - 1) / bs; /* one sequence, whole */
    if (one > s->cfg.num_blocks)
        return KVP_ERR(KVP_ENOBLOCKS, "generate: request %lld needs %lld blocks of %d tokens for one sequence, the KV "
                                      "cache has %d; raise --num-blocks", (long long)i, (long long)one, bs,
                       s->cfg.num_blocks);
    KVP_TRY(kvp_engine_fits(s->e, r->n_prompt, mt, (int32_t)(group_of(r) > 0 ? group_of(r) : 1), r->beam_width > 1));
    KVP_TRY(kvp_grow((void **)&s->reqs, &s->cap, (size_t)s->n + 1, sizeof *s->reqs));
    owned *o = kvp_calloc(1, sizeof *o);
    kvp_status st = o ? KVP_OK : KVP_ERR(KVP_ENOMEM, "session: out of memory");
    if (st == KVP_OK) st = dup_mem(r->prompt, r->n_prompt, sizeof *r->prompt, (void **)&o->prompt);
    if (st == KVP_OK) st = dup_mem(r->stop_ids, r->n_stop_ids, sizeof *r->stop_ids, (void **)&o->stop_ids);
    if (st == KVP_OK) st = dup_mem(r->bias_ids, r->n_bias, sizeof *r->bias_ids, (void **)&o->bias_ids);
    if (st == KVP_OK) st = dup_mem(r->bias, r->n_bias, sizeof *r->bias, (void **)&o->bias);
    if (st != KVP_OK) {
        owned_free(o);
        return st;
    }
    o->p = (kvp_output_params){.sampler = r->sampler, .n = r->n, .beam_width = r->beam_width, .stop_ids = o->stop_ids,
                               .n_stop_ids = o->stop_ids ? r->n_stop_ids : 0, .ignore_eos = r->ignore_eos != 0,
                               .min_tokens = r->min_tokens, .bias_ids = o->bias_ids, .bias = o->bias,
                               .n_bias = o->bias ? r->n_bias : 0, .logprobs = r->logprobs != 0,
                               .prompt_logprobs = r->prompt_logprobs != 0, .top_logprobs = r->top_logprobs};
    /* the engine ranks larger priorities first; requests speak vLLM's (lower is sooner) */
    o->r = (kvp_request){.id = i, .tokens = o->prompt, .prompt_len = r->n_prompt, .output_len = mt,
                         .priority = -r->priority, .out = &o->p};
    o->user = r->user;
    int64_t idx;
    st = kvp_engine_add_request(s->e, &o->r, &idx);
    if (st != KVP_OK) {
        owned_free(o);
        return st;
    }
    if (idx != i) return KVP_ERR(KVP_ESTATE, "session: the engine numbered request %lld as %lld", (long long)i, (long long)idx);
    s->reqs[s->n++] = o;
    if (mt < r->max_tokens)
        KVP_LOG_W("generate: request %lld: max_tokens %d clamped to %d (context %d)", (long long)i, r->max_tokens, mt,
                  maxlen);
    if (id) *id = (int32_t)i;
    return KVP_OK;
}

int kvp_session_pending(const kvp_session *s) { return kvp_engine_pending(s->e); }

kvp_status kvp_session_step(kvp_session *s) { return kvp_engine_pending(s->e) ? kvp_engine_step(s->e, NULL) : KVP_OK; }

void kvp_session_results_free(kvp_session_result *res, int32_t n)
{
    if (!res) return;
    for (int32_t i = 0; i < n; i++) {
        if (res[i].tokens)
            for (int32_t j = 0; j < res[i].n_samples; j++) kvp_free(res[i].tokens[j]);
        kvp_free(res[i].tokens);
        kvp_free(res[i].n_tokens);
        kvp_free(res[i].logprob);
        kvp_free(res[i].finish);
        kvp_free(res[i].stop_token);
        for (int32_t j = 0; res[i].logprobs && j < res[i].n_samples; j++) kvp_logprobs_free(&res[i].logprobs[j]);
        kvp_free(res[i].logprobs);
        kvp_logprobs_free(&res[i].prompt_logprobs);
        memset(&res[i], 0, sizeof res[i]);
    }
}

static owned *owned_at(const kvp_session *s, int32_t id)
{
    const int64_t k = (int64_t)id - s->base;
    return k >= 0 && k < s->n ? s->reqs[k] : NULL;
}

/* The result of finished request id from the engine's samples. */
static kvp_status collect(const kvp_session *s, int32_t id, kvp_session_result *out)
{
    const owned *o = owned_at(s, id);
    kvp_req_result rr;
    KVP_TRY(kvp_engine_request(s->e, id, &rr));
    const int32_t ns = rr.n_samples;
    memset(out, 0, sizeof *out);
    out->n_samples = ns;
    out->user = o->user;
    out->tokens = kvp_calloc((size_t)ns + 1, sizeof *out->tokens);
    out->n_tokens = kvp_calloc((size_t)ns + 1, sizeof *out->n_tokens);
    out->logprob = kvp_calloc((size_t)ns + 1, sizeof *out->logprob);
    out->finish = kvp_calloc((size_t)ns + 1, sizeof *out->finish);
    out->stop_token = kvp_calloc((size_t)ns + 1, sizeof *out->stop_token);
    if (o->p.logprobs) out->logprobs = kvp_calloc((size_t)ns + 1, sizeof *out->logprobs);
    kvp_status st = out->tokens && out->n_tokens && out->logprob && out->finish && out->stop_token &&
                            (out->logprobs || !o->p.logprobs)
                        ? KVP_OK
                        : KVP_ERR(KVP_ENOMEM, "session: out of memory");
    const kvp_logprobs *plp;
    if (st == KVP_OK && o->p.prompt_logprobs && kvp_engine_prompt_logprobs(s->e, id, &plp) == KVP_OK)
        st = kvp_logprobs_copy(plp, &out->prompt_logprobs);
    int32_t maxgen = 0;
    for (int32_t k = 0; st == KVP_OK && k < ns; k++) {
        kvp_sample_view v;
        st = kvp_engine_sample(s->e, id, k, &v);
        if (st != KVP_OK) break;
        if (!(out->tokens[k] = kvp_malloc((size_t)(v.n_tokens + 1) * sizeof(int32_t)))) {
            st = KVP_ERR(KVP_ENOMEM, "session: out of memory");
            break;
        }
        if (v.n_tokens) memcpy(out->tokens[k], v.tokens, (size_t)v.n_tokens * sizeof(int32_t));
        out->n_tokens[k] = v.n_tokens;
        out->logprob[k] = v.logprob;
        out->finish[k] = v.finish;
        out->stop_token[k] = v.stop_token;
        maxgen = v.n_tokens > maxgen ? v.n_tokens : maxgen;
        if (o->p.logprobs) {
            static const kvp_logprobs none = {0};
            st = kvp_logprobs_copy(v.logprobs ? v.logprobs : &none, &out->logprobs[k]);
            out->logprobs[k].k = v.logprobs ? v.logprobs->k : o->p.top_logprobs;
        }
    }
    if (st != KVP_OK) {
        kvp_session_results_free(out, 1);
        return st;
    }
    out->prompt_cached_tokens = rr.cached_tokens;
    const double first = rr.first_token_s >= 0 ? rr.first_token_s : rr.finish_s;
    out->ttft_s = first - rr.arrival_s;
    out->tpot_s = maxgen > 1 ? (rr.finish_s - first) / (maxgen - 1) : 0.0;
    out->finish_s = rr.finish_s - rr.arrival_s;
    out->queue_s = (rr.admit_s >= 0 ? rr.admit_s : rr.finish_s) - rr.arrival_s;
    out->preemptions = rr.preemptions;
    return KVP_OK;
}

kvp_status kvp_session_take(kvp_session *s, int32_t *id, kvp_session_result *res)
{
    int64_t i;
    if (kvp_engine_take_finished(s->e, &i) != KVP_OK) return KVP_ENOTFOUND;
    KVP_TRY(collect(s, (int32_t)i, res));
    kvp_engine_release(s->e, i);
    owned_free(s->reqs[i - s->base]);
    s->reqs[i - s->base] = NULL;
    if (id) *id = (int32_t)i;
    compact(s);
    return KVP_OK;
}

kvp_status kvp_session_partial(const kvp_session *s, int32_t id, int32_t k, const int32_t **tokens, int32_t *n)
{
    *tokens = NULL;
    *n = 0;
    const owned *o = owned_at(s, id);
    if (!o || o->p.beam_width > 1) return KVP_ENOTFOUND;
    kvp_sample_view v;
    if (kvp_engine_sample(s->e, id, k, &v) != KVP_OK) return KVP_ENOTFOUND;
    *tokens = v.tokens;
    *n = v.n_tokens;
    return KVP_OK;
}

kvp_status kvp_session_partial_logprobs(const kvp_session *s, int32_t id, int32_t k, const kvp_logprobs **lp)
{
    static const kvp_logprobs none = {0};
    *lp = &none;
    const owned *o = owned_at(s, id);
    if (!o || !o->p.logprobs) return KVP_ENOTFOUND;
    kvp_sample_view v;
    if (kvp_engine_sample(s->e, id, k, &v) != KVP_OK) return KVP_ENOTFOUND;
    if (v.logprobs) *lp = v.logprobs;
    return KVP_OK;
}

kvp_status kvp_session_prompt_logprobs(const kvp_session *s, int32_t id, const kvp_logprobs **lp)
{
    return owned_at(s, id) ? kvp_engine_prompt_logprobs(s->e, id, lp) : KVP_ENOTFOUND;
}

kvp_status kvp_session_stop_at(kvp_session *s, int32_t id, int32_t k, int32_t n_keep)
{
    return owned_at(s, id) ? kvp_engine_stop(s->e, id, k, n_keep) : KVP_ENOTFOUND;
}

kvp_status kvp_session_stop(kvp_session *s, int32_t id, int32_t k) { return kvp_session_stop_at(s, id, k, INT32_MAX); }

kvp_status kvp_session_abort(kvp_session *s, int32_t id)
{
    return owned_at(s, id) ? kvp_engine_abort(s->e, id) : KVP_ENOTFOUND;
}

kvp_status kvp_session_reset_prefix_cache(kvp_session *s, int64_t *evicted)
{
    return kvp_engine_reset_prefix_cache(s->e, evicted);
}

void kvp_session_stats_get(const kvp_session *s, kvp_session_stats *out)
{
    kvp_engine_counts c;
    kvp_engine_counts_get(s->e, &c);
    *out = (kvp_session_stats){.requests = c.requests, .finished = c.finished, .waiting = c.waiting_requests,
                               .aborted = c.aborted, .request_records = (int32_t)c.request_records,
                               .seq_records = (int32_t)c.seq_records, .running_seqs = c.running_seqs,
                               .running_requests = c.running_requests, .preempted_seqs = c.readmit_seqs + c.swapped_seqs, .steps = c.steps,
                               .computed_tokens = c.computed_tokens, .prefix_hit_tokens = c.prefix_hit_tokens,
                               .preemptions = c.preemptions, .admitted_prompt_tokens = c.admitted_prompt_tokens,
                               .spec_drafts = c.spec_drafts, .spec_draft_tokens = c.spec_draft_tokens,
                               .spec_accepted_tokens = c.spec_accepted_tokens, .num_blocks = c.num_blocks,
                               .free_blocks = c.free_blocks, .host_hit_tokens = c.host_hit_tokens,
                               .host_loaded_blocks = c.host_loaded_blocks, .host_stored_blocks = c.host_stored_blocks};
}

const kvp_engine *kvp_session_engine(const kvp_session *s) { return s->e; }

double kvp_spec_acceptance(const kvp_run_stats *st)
{
    return st->spec_draft_tokens > 0 ? (double)st->spec_accepted_tokens / (double)st->spec_draft_tokens : 0.0;
}

kvp_status kvp_session_run(kvp_session *s, const kvp_session_request *reqs, int32_t n, kvp_session_result *results,
                           kvp_run_stats *stats, void (*on_step)(void *ctx, kvp_session *s), void *ctx)
{
    if (!s || (n > 0 && (!reqs || !results))) return KVP_ERR(KVP_EINVAL, "generate: NULL argument");
    if (n < 1) return KVP_ERR(KVP_EINVAL, "generate: no request");
    if (s->n != 0 || s->base != 0) return KVP_ERR(KVP_ESTATE, "generate: a run needs a fresh session");
    const double t0 = kvp_now_s();
    for (int32_t i = 0; i < n; i++) KVP_TRY(kvp_session_add(s, &reqs[i], NULL));
    kvp_status st = KVP_OK;
    while (st == KVP_OK && kvp_session_pending(s))
        if ((st = kvp_session_step(s)) == KVP_OK && on_step) on_step(ctx, s);
    const double wall = kvp_now_s() - t0;
    int32_t done = 0;
    while (st == KVP_OK && done < n) /* a failing collect leaves nothing behind in its result */
        if ((st = collect(s, done, &results[done])) == KVP_OK) done++;
    if (st != KVP_OK) {
        kvp_session_results_free(results, done);
        return st;
    }
    if (!stats) return KVP_OK;
    kvp_engine_metrics m;
    KVP_TRY(kvp_engine_metrics_get(s->e, &m));
    *stats = (kvp_run_stats){.wall_s = wall, .steps = m.steps, .computed_tokens = m.computed_tokens,
                             .attended_positions = m.attended_positions, .prefix_hit_tokens = m.prefix_hit_tokens,
                             .host_hit_tokens = m.host_hit_tokens, .host_loaded_blocks = m.host_loaded_blocks,
                             .host_stored_blocks = m.host_stored_blocks, .preemptions = m.preemptions,
                             .spec_drafts = m.spec_drafts, .spec_draft_tokens = m.spec_draft_tokens,
                             .spec_accepted_tokens = m.spec_accepted_tokens, .cow_copies = m.cow_copies,
                             .peak_used_blocks = m.peak_used_blocks, .peak_token_states = m.peak_token_states,
                             .peak_logical_tokens = m.peak_logical_tokens, .peak_shared_savings = m.peak_shared_savings,
                             .mean_kv_utilization = m.step_kv_utilization, .mean_shared_savings = m.step_shared_savings,
                             .num_blocks = s->cfg.num_blocks, .block_size = s->cfg.engine.block_size};
    for (int32_t i = 0; i < n; i++) { /* what the results hold: a beam search's dropped beams do not count */
        stats->prompt_tokens += reqs[i].n_prompt;
        for (int32_t k = 0; k < results[i].n_samples; k++) stats->generated_tokens += results[i].n_tokens[k];
    }
    stats->tokens_per_s = wall > 0 ? (double)stats->generated_tokens / wall : 0.0;
    stats->prefix_hit_rate = stats->prompt_tokens > 0 ? (double)stats->prefix_hit_tokens / (double)stats->prompt_tokens : 0;
    return KVP_OK;
}
