/* runtime/server/metrics.c — GET /metrics in Prometheus text format 0.0.4, with vLLM's names and meanings
 * (https://docs.vllm.ai/en/stable/usage/metrics/) under the prefix "kvpage:" (default) or "vllm:"
 * (--metrics-names vllm), every sample labelled model_name as vLLM's; kvpage's own metrics beside them under
 * the same prefix. A "request" is one prompt of an HTTP request (a session request) with its n samples;
 * a finished request's histograms are observed when the engine hands it back. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "runtime/server/server_internal.h"

/* Latencies: 100 us (a token of a tiny model on the CPU) to 1000 s. */
const double srv_lat_le[NLAT] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                                 0.5,  1,      2.5,  5,    10,     25,   50,   100,  250,   500,  1000};
static const double k_iter_le[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}; /* vLLM's */
static const double k_n_le[] = {1, 2, 5, 10, 20};                                                   /* vLLM's */
#define NB(a) ((int)(sizeof a / sizeof a[0]))

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void srv_histo_init(histo *h, const double *le, int nb)
{
    memset(h, 0, sizeof *h);
    h->le = le;
    h->nb = nb;
}

void srv_histo_add_n(histo *h, double x, int64_t count)
{
    if (count <= 0) return;
    int i = 0;
    while (i < h->nb && !(x <= h->le[i])) i++;
    h->n[i] += count;
    h->sum += x * (double)count;
}

void srv_histo_add(histo *h, double x) { srv_histo_add_n(h, x, 1); }

void srv_metrics_init(server *sv)
{
    sv->mprefix = sv->o.metrics_vllm ? "vllm:" : "kvpage:";
    /* token counts: vLLM's 1-2-5 buckets up to the context */
    const double ctx = (double)kvp_model_max_len(sv->m);
    sv->tok_nb = 0;
    for (double p = 1; sv->tok_nb < SRV_MAX_BOUNDS; p *= 10) {
        const double step[3] = {1, 2, 5};
        int done = 0;
        for (int k = 0; k < 3 && sv->tok_nb < SRV_MAX_BOUNDS; k++) {
            if (p * step[k] > ctx) {
                done = 1;
                break;
            }
            sv->tok_le[sv->tok_nb++] = p * step[k];
        }
        if (done) break;
    }
    srv_metrics_state *m = &sv->mx;
    histo *lat[] = {&m->ttft, &m->ttft_engine, &m->itl, &m->tpot, &m->e2e, &m->queue, &m->inference, &m->prefill,
                    &m->decode};
    for (size_t i = 0; i < sizeof lat / sizeof lat[0]; i++) srv_histo_init(lat[i], srv_lat_le, NLAT);
    histo *toks[] = {&m->prompt_len, &m->gen_len, &m->max_gen_len, &m->params_max_tokens, &m->prefill_computed};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) srv_histo_init(toks[i], sv->tok_le, sv->tok_nb);
    srv_histo_init(&m->params_n, k_n_le, NB(k_n_le));
    srv_histo_init(&m->preempts, k_n_le, NB(k_n_le));
    srv_histo_init(&m->iteration, k_iter_le, NB(k_iter_le));
}

void srv_metrics_step(server *sv)
{
    srv_metrics_state *m = &sv->mx;
    m->num_blocks = sv->cfg.num_blocks; /* the engine thread's: a new cuda session may get another split */
    kvp_session_stats_get(sv->s, &m->stats);
    const kvp_engine *e = kvp_session_engine(sv->s);
    kvp_kv_accounting a;
    kvp_engine_account(e, &a);
    const int64_t bs = sv->cfg.engine.block_size;
    m->cached_blocks = a.cached / bs;
    m->held_blocks = (a.capacity - a.free - a.cached) / bs;
    m->have_ledger = kvp_engine_ledger_stats(e, &m->ledger) == KVP_OK;
    const int64_t step_tokens = m->stats.computed_tokens - sv->last_computed;
    if (step_tokens > 0) srv_histo_add(&m->iteration, (double)step_tokens);
    sv->last_computed = m->stats.computed_tokens;
}

void srv_metrics_finished(server *sv, const job *j, int32_t i, const kvp_session_result *r)
{
    srv_metrics_state *m = &sv->mx;
    const kvp_session_request *q = &j->reqs[i];
    int64_t gen = 0;
    int32_t most = 0; /* tokens of the longest sample: inter-token times need two or more */
    for (int32_t k = 0; k < r->n_samples; k++) {
        gen += r->n_tokens[k];
        most = r->n_tokens[k] > most ? r->n_tokens[k] : most;
        const int32_t c = i * j->nsamples + k;
        const int stop_text = j->ch && j->ch[c].t.stop;
        const kvp_finish_reason f = r->finish[k];
        m->success[stop_text || (f != KVP_FINISH_LENGTH && f != KVP_FINISH_ABORTED) ? 0 : f == KVP_FINISH_LENGTH ? 1 : 2]++;
    }
    if (r->n_samples == 0) m->success[2] += q->n; /* aborted before it ran */
    m->prompt_tokens += q->n_prompt;
    m->generation_tokens += gen;
    /* HTTP arrival -> added to the session: parsing, tokenizing, waiting for the engine thread */
    const double before = j->t_arrival > 0 && j->t_added > j->t_arrival ? j->t_added - j->t_arrival : 0;
    const double waited = j->t_queued > 0 && j->t_added > j->t_queued ? j->t_added - j->t_queued : 0;
    srv_histo_add(&m->ttft, before + r->ttft_s);
    srv_histo_add(&m->ttft_engine, r->ttft_s);
    srv_histo_add(&m->e2e, before + r->finish_s);
    srv_histo_add(&m->queue, waited + r->queue_s);
    srv_histo_add(&m->inference, r->finish_s - r->queue_s);
    srv_histo_add(&m->prefill, r->ttft_s - r->queue_s);
    srv_histo_add(&m->decode, r->finish_s - r->ttft_s);
    if (most > 1) {
        srv_histo_add(&m->tpot, r->tpot_s);
        srv_histo_add_n(&m->itl, r->tpot_s, most - 1); /* each interval of the longest sample, as its mean */
    }
    srv_histo_add(&m->prompt_len, q->n_prompt);
    srv_histo_add(&m->gen_len, (double)gen);
    srv_histo_add(&m->max_gen_len, most);
    srv_histo_add(&m->params_n, q->n);
    srv_histo_add(&m->params_max_tokens, q->max_tokens);
    srv_histo_add(&m->prefill_computed, q->n_prompt - r->prompt_cached_tokens);
    srv_histo_add(&m->preempts, r->preemptions);
}

/* ---------------------------------------------------------------- text */

typedef struct {
    char *t;
    size_t len, cap;
    int oom;
    const server *sv;
    char label[600]; /* model_name="..." escaped */
} page;

static void put(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(page *p, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !p->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(p->t + p->len, p->cap - p->len, fmt, ap);
        va_end(ap);
        if (n < 0) break;
        if ((size_t)n < p->cap - p->len) {
            p->len += (size_t)n;
            return;
        }
        if (kvp_grow((void **)&p->t, &p->cap, p->len + (size_t)n + 1, 1) != KVP_OK) p->oom = 1;
    }
}

static void head(page *p, const char *name, const char *type, const char *help)
{
    put(p, "# HELP %s%s %s\n# TYPE %s%s %s\n", p->sv->mprefix, name, help, p->sv->mprefix, name, type);
}

/* One sample: name{labels,model_name="..."} v (labels: "" or 'k="v"'). */
static void sample(page *p, const char *name, const char *labels, double v)
{
    put(p, "%s%s{%s%s%s} %.17g\n", p->sv->mprefix, name, labels, labels[0] ? "," : "", p->label, v);
}

static void gauge(page *p, const char *name, const char *help, double v)
{
    head(p, name, "gauge", help);
    sample(p, name, "", v);
}

static void counter(page *p, const char *name, const char *help, double v)
{
    head(p, name, "counter", help);
    sample(p, name, "", v);
}

/* Cumulative buckets (le, then +Inf), _sum and _count. bounds(i) and counts n[0 .. nb] (n[nb]: above all). */
static void histogram_raw(page *p, const char *name, const char *help, int nb, double (*bound)(const void *, int),
                          const void *ctx, const int64_t *n, double sum)
{
    head(p, name, "histogram", help);
    int64_t cum = 0;
    char le[64];
    for (int i = 0; i < nb; i++) {
        cum += n[i];
        snprintf(le, sizeof le, "le=\"%g\"", bound(ctx, i));
        put(p, "%s%s_bucket{%s,%s} %lld\n", p->sv->mprefix, name, le, p->label, (long long)cum);
    }
    cum += n[nb];
    put(p, "%s%s_bucket{le=\"+Inf\",%s} %lld\n", p->sv->mprefix, name, p->label, (long long)cum);
    put(p, "%s%s_sum{%s} %.9g\n%s%s_count{%s} %lld\n", p->sv->mprefix, name, p->label, sum, p->sv->mprefix, name,
        p->label, (long long)cum);
}

static double histo_bound(const void *h, int i) { return ((const histo *)h)->le[i]; }
static double ledger_bound(const void *h, int i) { return (void)h, kvp_hist_bound(i); }

static void histogram(page *p, const char *name, const char *help, const histo *h)
{
    histogram_raw(p, name, help, h->nb, histo_bound, h, h->n, h->sum);
}

/* A ledger histogram (prefix_cache/ledger.h: 1-2-5 bounds, the last +Inf). */
static void histogram_ledger(page *p, const char *name, const char *help, const kvp_hist *h)
{
    histogram_raw(p, name, help, KVP_HIST_BUCKETS - 1, ledger_bound, NULL, h->counts, h->sum);
}

/* A label value as Prometheus escapes it (backslash, double quote, newline). */
static void label_value(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') out[o++] = '\\', out[o++] = *s;
        else if (*s == '\n') out[o++] = '\\', out[o++] = 'n';
        else out[o++] = *s;
    }
    out[o] = '\0';
}

enum MHD_Result srv_metrics(server *sv, struct MHD_Connection *c)
{
    page p = {.sv = sv, .cap = 1 << 16};
    if (!(p.t = kvp_malloc(p.cap))) return srv_reply_error(sv, c, 503, "out of memory: no room for the metrics page");
    char name[520];
    label_value(name, sizeof name, sv->name);
    snprintf(p.label, sizeof p.label, "model_name=\"%s\"", name);
    srv_metrics_state *m = kvp_malloc(sizeof *m);
    if (!m) {
        kvp_free(p.t);
        return srv_reply_error(sv, c, 503, "out of memory: no room for the metrics page");
    }
    pthread_mutex_lock(&sv->mu);
    *m = sv->mx;
    pthread_mutex_unlock(&sv->mu);
    const kvp_session_stats *s = &m->stats;
    char lab[160];

    /* ---- vLLM's */
    gauge(&p, "num_requests_running", "Requests with a sequence in the running batch.", (double)s->running_requests);
    gauge(&p, "num_requests_waiting", "Requests waiting to be admitted (queued for the engine or not admitted yet).",
          (double)(s->waiting + m->queued_prompts));
    gauge(&p, "kv_cache_usage_perc",
          "Fraction of the KV cache blocks held by requests (0-1); blocks only the prefix cache holds count as free.",
          s->num_blocks > 0 ? (double)m->held_blocks / s->num_blocks : 0.0);
    counter(&p, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache at first admission.",
            (double)s->admitted_prompt_tokens);
    counter(&p, "prefix_cache_hits_total", "Prompt tokens the prefix cache served at first admission.",
            (double)s->prefix_hit_tokens);
    counter(&p, "num_preemptions_total", "Sequences preempted (recompute or swap).", (double)s->preemptions);
    counter(&p, "prompt_tokens_total", "Prompt tokens of finished requests.", (double)m->prompt_tokens);
    counter(&p, "generation_tokens_total", "Tokens generated for finished requests.", (double)m->generation_tokens);
    head(&p, "request_success_total", "counter", "Finished samples by finish reason.");
    static const char *const reasons[3] = {"stop", "length", "abort"};
    for (int k = 0; k < 3; k++) {
        snprintf(lab, sizeof lab, "finished_reason=\"%s\"", reasons[k]);
        sample(&p, "request_success_total", lab, (double)m->success[k]);
    }
    histogram(&p, "iteration_tokens_total", "Tokens computed per engine step.", &m->iteration);
    histogram(&p, "time_to_first_token_seconds", "Time from the HTTP request's arrival to its first token.", &m->ttft);
    histogram(&p, "inter_token_latency_seconds",
              "Time between two tokens of a request (each interval of its longest sample, as their mean).", &m->itl);
    histogram(&p, "request_time_per_output_token_seconds",
              "Requests of two tokens or more: mean time per token after the first.", &m->tpot);
    histogram(&p, "e2e_request_latency_seconds", "Time from the HTTP request's arrival to its last token.", &m->e2e);
    histogram(&p, "request_queue_time_seconds", "Time from queueing for the engine to the first admission.", &m->queue);
    histogram(&p, "request_inference_time_seconds", "Time from the first admission to the last token.", &m->inference);
    histogram(&p, "request_prefill_time_seconds", "Time from the first admission to the first token.", &m->prefill);
    histogram(&p, "request_decode_time_seconds", "Time from the first token to the last.", &m->decode);
    histogram(&p, "request_prompt_tokens", "Prompt tokens per finished request.", &m->prompt_len);
    histogram(&p, "request_generation_tokens", "Tokens generated per finished request (all its samples).", &m->gen_len);
    histogram(&p, "request_max_num_generation_tokens", "Tokens of a finished request's longest sample.", &m->max_gen_len);
    histogram(&p, "request_params_n", "The n (samples) of finished requests.", &m->params_n);
    histogram(&p, "request_params_max_tokens", "The max_tokens of finished requests.", &m->params_max_tokens);
    histogram(&p, "request_prefill_kv_computed_tokens",
              "Prompt tokens a finished request computed (not served by the prefix cache).", &m->prefill_computed);
    histogram(&p, "request_num_preemptions", "Preemptions of a finished request's sequences.", &m->preempts);
    const kvp_ledger_stats *lg = &m->ledger;
    static const kvp_ledger_stats none;
    if (!m->have_ledger) lg = &none;
    histogram_ledger(&p, "kv_block_lifetime_seconds", "Cached KV blocks: from caching to eviction.", &lg->lifetime);
    histogram_ledger(&p, "kv_block_idle_before_evict_seconds", "Evicted KV blocks: from their last use to eviction.",
                     &lg->idle_before_evict);
    histogram_ledger(&p, "kv_block_reuse_gap_seconds", "Prefix-cache hits: time since the block's previous use.",
                     &lg->reuse_gap);
    head(&p, "cache_config_info", "gauge", "The KV cache's configuration (labels; the value is 1).");
    const kvp_engine_config *ec = &sv->cfg.engine;
    snprintf(lab, sizeof lab,
             "block_size=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\",num_gpu_blocks=\"%d\","
             "num_cpu_blocks=\"%d\",prefix_cache=\"%s\",eviction=\"%s\"",
             (int)ec->block_size, kvp_dtype_name(sv->cfg.kv_dtype), ec->cache != KVP_PC_NONE ? "True" : "False",
             (int)m->num_blocks, (int)(sv->cfg.host_cache_blocks + sv->cfg.swap_blocks), kvp_pc_kind_name(ec->cache),
             kvp_evict_policy_name(ec->evict));
    sample(&p, "cache_config_info", lab, 1);
    counter(&p, "spec_decode_num_drafts_total", "Speculation: steps of a sample that proposed drafts.",
            (double)s->spec_drafts);
    counter(&p, "spec_decode_num_draft_tokens_total", "Speculation: draft tokens proposed.", (double)s->spec_draft_tokens);
    counter(&p, "spec_decode_num_accepted_tokens_total", "Speculation: draft tokens kept.",
            (double)s->spec_accepted_tokens);

    /* ---- kvpage's own */
    head(&p, "http_responses_total", "counter", "HTTP answers by status class.");
    static const char *const codes[3] = {"200", "4xx", "5xx"};
    for (int k = 0; k < 3; k++) {
        snprintf(lab, sizeof lab, "code=\"%s\"", codes[k]);
        sample(&p, "http_responses_total", lab, (double)m->answered[k]);
    }
    counter(&p, "requests_cancelled_total", "HTTP requests whose client left before the answer (their generation stops).",
            (double)m->cancelled);
    counter(&p, "engine_requests_total", "Requests the engine has taken (each prompt of an HTTP request is one).",
            (double)s->requests);
    counter(&p, "engine_requests_finished_total", "Requests the engine has finished.", (double)s->finished);
    gauge(&p, "num_sequences_running", "Sequences in the running batch.", (double)s->running_seqs);
    gauge(&p, "num_sequences_preempted", "Sequences preempted, waiting to be recomputed or swapped in.",
          (double)s->preempted_seqs);
    counter(&p, "engine_steps_total", "Batched steps run.", (double)s->steps);
    counter(&p, "computed_tokens_total", "Tokens through the forward pass (recomputation included).",
            (double)s->computed_tokens);
    counter(&p, "host_cache_hits_total", "Prompt tokens the prefix cache's host tier served (loaded).",
            (double)s->host_hit_tokens);
    counter(&p, "host_cache_loaded_blocks_total", "Blocks copied from the host tier.", (double)s->host_loaded_blocks);
    counter(&p, "host_cache_stored_blocks_total", "Blocks copied to the host tier.", (double)s->host_stored_blocks);
    gauge(&p, "kv_blocks", "KV cache blocks.", s->num_blocks);
    gauge(&p, "kv_blocks_free", "KV blocks neither held by a sequence nor cached.", s->free_blocks);
    gauge(&p, "kv_blocks_cached", "KV blocks only the prefix cache holds (evictable, reusable).",
          (double)m->cached_blocks);
    head(&p, "prefix_cache_miss_tokens_total", "counter",
         "Prompt tokens that missed the prefix cache, by why (prefix_cache/ledger.h); with the hits they add up to the "
         "prompt tokens of first admissions (preempted: tokens recomputed after a preemption).");
    for (int k = 0; k < KVP_MISS_CLASSES; k++) {
        snprintf(lab, sizeof lab, "class=\"%s\"", kvp_miss_class_name((kvp_miss_class)k));
        sample(&p, "prefix_cache_miss_tokens_total", lab, (double)lg->miss_tokens[k]);
    }
    histogram_ledger(&p, "prefix_cache_miss_evicted_age_seconds",
                     "Missed blocks that had been evicted: their idle time when evicted.", &lg->miss_evicted_age);
    histogram(&p, "engine_time_to_first_token_seconds", "Time from the engine taking a request to its first token.",
              &m->ttft_engine);
    kvp_free(m);
    if (p.oom) {
        kvp_free(p.t);
        return srv_reply_error(sv, c, 503, "out of memory: no room for the metrics page");
    }
    srv_count_answer(sv, 200);
    enum MHD_Result r = srv_reply(c, 200, "text/plain; version=0.0.4", p.t);
    kvp_free(p.t);
    return r;
}
