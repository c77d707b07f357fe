/* runtime/workload/workload_synth.h — workloads without prefix structure for the serving simulator: the
 * Azure LLM inference trace (2023, CSV), seeded ShareGPT-like and Alpaca-like generators, and the edits of
 * `kvpage simulate` (cut, fork, rescale). Every workload returned is the caller's (kvp_workload_destroy).
 * Prompt ids are unique per request (token 0 encodes its index): a prefix cache's hit rate is 0.
 *
 * Azure CSV (../shared/data/traces/azure_llm_2023/ *.csv): "TIMESTAMP,ContextTokens,GeneratedTokens", then
 * "YYYY-MM-DD HH:MM:SS[.fraction],context,generated" lines (CRLF accepted, blank lines skipped); arrival_s
 * counts from the first row. context >= 1 and generated >= 0, else KVP_EPARSE naming file and line; an
 * unreadable file is KVP_EIO.
 *
 * Generators: log-normal lengths (rounded, >= 1) with the PagedAttention paper's means, Poisson arrivals
 * (the first at its first gap); the same seed gives the same workload.
 */
#ifndef KVP_RUNTIME_WORKLOAD_SYNTH_H
#define KVP_RUNTIME_WORKLOAD_SYNTH_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/workload/workload.h"

typedef enum {
    KVP_SYNTH_SHAREGPT = 0, /* input mean 161.31 (sigma 1.0), output mean 337.99 (sigma 0.8) */
    KVP_SYNTH_ALPACA        /* input mean 19.31 (sigma 0.5), output mean 58.45 (sigma 0.8) */
} kvp_synth_kind;

typedef struct {
    kvp_synth_kind kind;
    int64_t num_requests; /* >= 1 */
    double rate;          /* requests/s, > 0 (INFINITY: all at t = 0) */
    uint64_t seed;
    int32_t max_total;    /* 0: no limit; else (>= 2) a longer input + output is redrawn, after 64 tries
                           * shrunk in proportion to fit */
} kvp_synth_opts;

void kvp_synth_means(kvp_synth_kind kind, double *input_mean, double *output_mean); /* the targets above */

kvp_status kvp_workload_synth(const kvp_synth_opts *opts, kvp_workload **out);

kvp_status kvp_workload_read_azure(const char *path, int64_t max_requests, kvp_workload **out); /* 0: all */

/* A copy of w with the requests arriving before duration_s (<= 0: all), at most max_requests (0: all);
 * `after` renumbered (to none when the awaited one is cut), pins copied. KVP_ENOMEM. */
kvp_status kvp_workload_cut(const kvp_workload *w, int64_t max_requests, double duration_s, kvp_workload **out);

/* A copy of w with n - 1 parallel samples after each request (vLLM's SamplingParams.n): its prompt,
 * arrival, output length and priority, after = it, after_prompt set, no known answer (the first sample keeps
 * a chat turn's). Ids become indices (request i: i*n .. i*n + n-1); `after` points to the awaited request's
 * first sample; pins copied. KVP_EINVAL for n < 1; KVP_ENOMEM. */
kvp_status kvp_workload_fork(const kvp_workload *w, int32_t n, kvp_workload **out);

/* Rescales arrivals so that requests / (last - first arrival) = rate req/s (INFINITY: all at 0); one request
 * or equal arrivals are left as they are. KVP_EINVAL for rate <= 0 or NaN. */
kvp_status kvp_workload_set_rate(kvp_workload *w, double rate);

#endif
