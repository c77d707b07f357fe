/* runtime/server/metrics.c — GET /metrics: the server's and the engine's counters, gauges and latency
 * histograms in Prometheus text format 0.0.4. */
#include <stdarg.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "runtime/server/server_internal.h"

const double srv_lat_le[NLAT] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                                 0.5,  1,      2.5,  5,    10,     25,   50,   100,  250,   500,  1000};

void srv_histo_add(histo *h, double x)
{
    int i = 0;
    while (i < NLAT && !(x <= srv_lat_le[i])) i++;
    h->n[i]++;
    h->sum += x;
}

/* Appends printf-style text at t + *len, cut to the cap bytes of t (*len stays < cap). */
static void appendf(char *t, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void appendf(char *t, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(t + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Appends histogram h as Prometheus text: cumulative buckets, +Inf, sum, count. */
static void histo_print(char *t, size_t cap, size_t *len, const char *name, const char *help, const histo *h)
{
    appendf(t, cap, len, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < NLAT; i++) {
        cum += h->n[i];
        appendf(t, cap, len, "%s_bucket{le=\"%g\"} %lld\n", name, srv_lat_le[i], (long long)cum);
    }
    cum += h->n[NLAT];
    appendf(t, cap, len, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.9g\n%s_count %lld\n", name, (long long)cum, name,
            h->sum, name, (long long)cum);
}

/* Prometheus text format 0.0.4. */
enum MHD_Result srv_metrics(server *sv, struct MHD_Connection *c)
{
    const size_t cap = 16384;
    char *t = kvp_malloc(cap);
    if (!t) return srv_reply_error(sv, c, 500, "out of memory");
    pthread_mutex_lock(&sv->mu);
    const kvp_session_stats s = sv->stats;
    const int64_t a[3] = {sv->answered[0], sv->answered[1], sv->answered[2]};
    const int64_t pt = sv->prompt_tokens, ct = sv->completion_tokens, cancelled = sv->cancelled;
    const histo ttft = sv->ttft, tpot = sv->tpot, e2e = sv->e2e;
    pthread_mutex_unlock(&sv->mu);
    const double used = s.num_blocks > 0 ? 1.0 - (double)s.free_blocks / s.num_blocks : 0.0;
    size_t len = 0;
    appendf(t, cap, &len,
             "# HELP kvpage_http_responses_total HTTP responses (completions, models, errors) by status class.\n"
             "# TYPE kvpage_http_responses_total counter\n"
             "kvpage_http_responses_total{code=\"200\"} %lld\n"
             "kvpage_http_responses_total{code=\"4xx\"} %lld\n"
             "kvpage_http_responses_total{code=\"5xx\"} %lld\n"
             "# HELP kvpage_requests_cancelled_total Completions whose client left before the answer (their generation stops).\n"
             "# TYPE kvpage_requests_cancelled_total counter\n"
             "kvpage_requests_cancelled_total %lld\n"
             "# HELP kvpage_prompt_tokens_total Prompt tokens of answered completions.\n"
             "# TYPE kvpage_prompt_tokens_total counter\n"
             "kvpage_prompt_tokens_total %lld\n"
             "# HELP kvpage_generation_tokens_total Tokens generated for answered completions.\n"
             "# TYPE kvpage_generation_tokens_total counter\n"
             "kvpage_generation_tokens_total %lld\n"
             "# HELP kvpage_engine_requests_total Prompts the engine has taken (each prompt of a request is one).\n"
             "# TYPE kvpage_engine_requests_total counter\n"
             "kvpage_engine_requests_total %lld\n"
             "# HELP kvpage_engine_requests_finished_total Prompts the engine has finished.\n"
             "# TYPE kvpage_engine_requests_finished_total counter\n"
             "kvpage_engine_requests_finished_total %lld\n"
             "# HELP kvpage_requests_waiting Prompts not admitted yet.\n"
             "# TYPE kvpage_requests_waiting gauge\n"
             "kvpage_requests_waiting %lld\n"
             "# HELP kvpage_sequences_running Sequences in the running batch.\n"
             "# TYPE kvpage_sequences_running gauge\n"
             "kvpage_sequences_running %lld\n"
             "# HELP kvpage_sequences_preempted Sequences preempted, waiting to be recomputed.\n"
             "# TYPE kvpage_sequences_preempted gauge\n"
             "kvpage_sequences_preempted %lld\n"
             "# HELP kvpage_engine_steps_total Batched steps run.\n"
             "# TYPE kvpage_engine_steps_total counter\n"
             "kvpage_engine_steps_total %lld\n"
             "# HELP kvpage_computed_tokens_total Tokens through the forward pass (recomputation included).\n"
             "# TYPE kvpage_computed_tokens_total counter\n"
             "kvpage_computed_tokens_total %lld\n"
             "# HELP kvpage_preemptions_total Sequences preempted.\n"
             "# TYPE kvpage_preemptions_total counter\n"
             "kvpage_preemptions_total %lld\n"
             "# HELP kvpage_spec_decode_num_drafts_total Speculation: steps of a sample that proposed drafts.\n"
             "# TYPE kvpage_spec_decode_num_drafts_total counter\n"
             "kvpage_spec_decode_num_drafts_total %lld\n"
             "# HELP kvpage_spec_decode_num_draft_tokens_total Speculation: draft tokens proposed.\n"
             "# TYPE kvpage_spec_decode_num_draft_tokens_total counter\n"
             "kvpage_spec_decode_num_draft_tokens_total %lld\n"
             "# HELP kvpage_spec_decode_num_accepted_tokens_total Speculation: draft tokens kept.\n"
             "# TYPE kvpage_spec_decode_num_accepted_tokens_total counter\n"
             "kvpage_spec_decode_num_accepted_tokens_total %lld\n"
             "# HELP kvpage_prefix_cache_queries_total Prompt tokens looked up in the prefix cache at admission.\n"
             "# TYPE kvpage_prefix_cache_queries_total counter\n"
             "kvpage_prefix_cache_queries_total %lld\n"
             "# HELP kvpage_prefix_cache_hits_total Prompt tokens the prefix cache served.\n"
             "# TYPE kvpage_prefix_cache_hits_total counter\n"
             "kvpage_prefix_cache_hits_total %lld\n"
             "# HELP kvpage_host_cache_hits_total Prompt tokens the prefix cache's host tier served (loaded).\n"
             "# TYPE kvpage_host_cache_hits_total counter\n"
             "kvpage_host_cache_hits_total %lld\n"
             "# HELP kvpage_host_cache_loaded_blocks_total Blocks copied from the host tier.\n"
             "# TYPE kvpage_host_cache_loaded_blocks_total counter\n"
             "kvpage_host_cache_loaded_blocks_total %lld\n"
             "# HELP kvpage_host_cache_stored_blocks_total Blocks copied to the host tier.\n"
             "# TYPE kvpage_host_cache_stored_blocks_total counter\n"
             "kvpage_host_cache_stored_blocks_total %lld\n"
             "# HELP kvpage_kv_blocks KV cache blocks.\n"
             "# TYPE kvpage_kv_blocks gauge\n"
             "kvpage_kv_blocks %d\n"
             "# HELP kvpage_kv_blocks_free KV blocks neither held by a sequence nor cached.\n"
             "# TYPE kvpage_kv_blocks_free gauge\n"
             "kvpage_kv_blocks_free %d\n"
             "# HELP kvpage_kv_cache_usage_ratio Share of the KV blocks in use (held or cached).\n"
             "# TYPE kvpage_kv_cache_usage_ratio gauge\n"
             "kvpage_kv_cache_usage_ratio %.6f\n",
             (long long)a[0], (long long)a[1], (long long)a[2], (long long)cancelled, (long long)pt, (long long)ct, (long long)s.requests,
             (long long)s.finished, (long long)s.waiting, (long long)s.running_seqs, (long long)s.preempted_seqs,
             (long long)s.steps, (long long)s.computed_tokens, (long long)s.preemptions, (long long)s.spec_drafts,
             (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens,
             (long long)s.admitted_prompt_tokens, (long long)s.prefix_hit_tokens, (long long)s.host_hit_tokens,
             (long long)s.host_loaded_blocks, (long long)s.host_stored_blocks, s.num_blocks, s.free_blocks, used);
    histo_print(t, cap, &len, "kvpage_time_to_first_token_seconds",
                "Finished prompts: time from the engine taking the prompt to its first token.", &ttft);
    histo_print(t, cap, &len, "kvpage_time_per_output_token_seconds",
                "Finished prompts of two tokens or more: mean time per token after the first.", &tpot);
    histo_print(t, cap, &len, "kvpage_e2e_request_latency_seconds",
                "Finished prompts: time from the engine taking the prompt to its last token.", &e2e);
    srv_count_answer(sv, 200);
    enum MHD_Result r = srv_reply(c, 200, "text/plain; version=0.0.4", t);
    kvp_free(t);
    return r;
}

