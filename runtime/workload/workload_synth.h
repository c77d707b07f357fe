/* runtime/workload/workload_synth.h — workloads without prefix structure for the serving simulator:
 * the Azure LLM inference trace (2023, CSV) and seeded ShareGPT-like / Alpaca-like generators; plus the
 * workload edits `kvpage simulate` offers (cut to N requests or a duration, rescale to a rate).
 *
 * All return a kvp_workload (runtime/workload/workload.h) owned by the caller (kvp_workload_destroy). Prompts get
 * token ids that are unique per request (token 0 is derived from the request index, so two requests never
 * share even one prefix block): with a prefix cache these workloads have a hit rate of 0 by construction.
 *
 * Azure CSV (../shared/data/traces/azure_llm_2023/ *.csv): header "TIMESTAMP,ContextTokens,GeneratedTokens",
 * then "YYYY-MM-DD HH:MM:SS[.fraction],context,generated" per line (CRLF accepted, blank lines skipped).
 * arrival_s = timestamp - the first row's timestamp. ContextTokens must be >= 1 and GeneratedTokens >= 0;
 * a bad line is KVP_EPARSE naming the file and line; an unreadable file is KVP_EIO naming it.
 *
 * Synthetic length distributions (ASSUMED: the paper reports only means): log-normal, rounded to the
 * nearest integer >= 1, with mu = ln(mean) - sigma^2 / 2 so that the untruncated mean is the target:
 *   sharegpt  input mean 161.31 (sigma 1.0), output mean 337.99 (sigma 0.8)   (PagedAttention paper, ShareGPT)
 *   alpaca    input mean  19.31 (sigma 0.5), output mean  58.45 (sigma 0.8)   (PagedAttention paper, Alpaca)
 * ShareGPT is the higher-variance one, as the paper says. When max_total > 0, a request whose
 * input + output exceeds it is redrawn (so every request fits a max_model_len of max_total; with 2048 this
 * moves the sharegpt means by under 2 %); after 64 draws that all exceed it (a max_total far below the
 * means), the last pair is shrunk in proportion to fit. Arrivals: Poisson process at `rate` req/s (exponential gaps,
 * first request at its first gap); rate = INFINITY puts every arrival at 0. Same seed, same workload.
 */
#ifndef KVP_RUNTIME_WORKLOAD_SYNTH_H
#define KVP_RUNTIME_WORKLOAD_SYNTH_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/workload/workload.h"

typedef enum { KVP_SYNTH_SHAREGPT = 0, KVP_SYNTH_ALPACA } kvp_synth_kind;

typedef struct {
    kvp_synth_kind kind;
    int64_t num_requests; /* >= 1 */
    double rate;          /* requests/s, > 0 (INFINITY: all at t = 0) */
    uint64_t seed;
    int32_t max_total;    /* 0: no limit; else input + output <= max_total (>= 2) */
} kvp_synth_opts;

/* Target means of a kind (the paper's figures). */
void kvp_synth_means(kvp_synth_kind kind, double *input_mean, double *output_mean);

kvp_status kvp_workload_synth(const kvp_synth_opts *opts, kvp_workload **out);

/* Reads an Azure LLM inference CSV trace; max_requests 0 = all. */
kvp_status kvp_workload_read_azure(const char *path, int64_t max_requests, kvp_workload **out);

/* A copy of w holding only its requests arriving before duration_s seconds (<= 0: no limit), at most
 * max_requests of them (0: no limit), in order (`after` renumbered; a request whose awaited one is dropped
 * waits for none); pins are copied. *out owned by the caller. KVP_ENOMEM. */
kvp_status kvp_workload_cut(const kvp_workload *w, int64_t max_requests, double duration_s, kvp_workload **out);

/* A copy of w in which each request is followed by n - 1 parallel samples of it (vLLM's SamplingParams.n):
 * the same prompt, arrival, output length and priority, after = that request, after_prompt set, no known
 * answer (a chat turn's answer stays with its first sample, which the next turn waits for). Ids become the
 * new indices (request i's samples are i * n .. i * n + n - 1); `after` is renumbered to the awaited
 * request's first sample; pins are copied. n = 1 gives a plain copy. KVP_EINVAL for n < 1; KVP_ENOMEM. */
kvp_status kvp_workload_fork(const kvp_workload *w, int32_t n, kvp_workload **out);

/* Rescales arrival times so that the mean arrival rate (requests over the span from the first to the last
 * arrival) becomes `rate` req/s; INFINITY puts every arrival at 0. KVP_EINVAL for rate <= 0 or NaN.
 * A workload of one request or with every arrival equal is left as it is (nothing to rescale). */
kvp_status kvp_workload_set_rate(kvp_workload *w, double rate);

#endif
