/* runtime/engine/session.h — the online session API of `generate` and `serve`: the engine (engine.h) over
 * an executor with a model, owning copies of its requests, handing back finished results.
 *
 *   kvp_cpu_session_create(m, &cfg, &s);        // runtime/executor/cpu_executor.h (or kvp_session_create)
 *   kvp_session_add(s, &req, &id);              // any time; the prompt, stop ids and biases are copied
 *   while (kvp_session_pending(s)) {
 *       kvp_session_step(s);                    // one engine step
 *       while (kvp_session_take(s, &id, &res) == KVP_OK) ...   // finished requests, in finishing order
 *   }
 *   kvp_session_run(s, reqs, n, res, &stats, NULL, NULL);   // a batch of requests, to completion
 *
 * Requests: ids count from 0 in the order of adding; priorities are vLLM's (lower is more urgent); n > 1
 * samples fork after the prompt (sample i draws with generator stream i of the seed), beam search keeps the
 * W best. Greedy results are batch invariant with KVP_MATMUL_INVARIANT: a request gives the same tokens alone
 * or in any batch, with or without a prefix cache, at any block size.
 * A session serves any number of requests in bounded memory (a request's records go when it is taken). Times
 * are wall seconds: a result's ttft_s and finish_s count from its request's add (kvp_session_run: from the
 * run's start). One thread at a time. Everything passed in is borrowed for the call; results are the
 * caller's (kvp_session_results_free).
 */
#ifndef KVP_RUNTIME_ENGINE_SESSION_H
#define KVP_RUNTIME_ENGINE_SESSION_H

#include <stdint.h>

#include "attention/paged_kv.h"
#include "common/status.h"
#include "runtime/engine/engine.h"

typedef struct {
    kvp_engine_config engine; /* scheduling, caches, output stage; the session sets the memory sizes (kv_slots,
                                 host_slots, host_cache_slots from the fields below), keep_outputs and
                                 wall_clock; max_model_len and the EOS ids are the model's (the executor's
                                 helper sets them) */
    int32_t num_blocks;       /* KV cache blocks, >= 1 (kvp_session_blocks_for: enough for a batch) */
    int32_t host_cache_blocks; /* host tier of the prefix cache (needs engine.cache != none), 0: none */
    int32_t swap_blocks;      /* host swap space with engine.preempt = swap, 0: none (recompute instead); the
                                 executor helpers take -1 for as many as num_blocks */
    int32_t vocab;            /* the model's vocabulary: token ids are checked against it */
    kvp_dtype kv_dtype;       /* element type of the executor's KV cache */
} kvp_session_config;

/* The engine's defaults with a radix cache, 2048 tokens a step, stop at EOS, f32 KV, num_blocks 0. */
kvp_session_config kvp_session_config_default(void);

typedef struct {
    const int32_t *prompt; /* (n_prompt) token ids, BOS included when wanted */
    int32_t n_prompt;      /* >= 1 */
    int32_t max_tokens;    /* tokens to generate after the prompt, >= 0 (clamped to the context, with a warning) */
    kvp_sampler_params sampler;
    int32_t n;             /* samples (>= 1); with beam search, the number of best beams returned (<= W) */
    int32_t beam_width;    /* 0 or 1: sampling; > 1: beam search (the sampler is not used) */
    const int32_t *stop_ids; /* (n_stop_ids) tokens that end a sample as EOS does (not part of its tokens) */
    int32_t n_stop_ids;
    int ignore_eos;        /* 1: EOS is an ordinary token for this request */
    int32_t min_tokens;    /* EOS and the stop ids cannot be drawn before this many tokens (<= max_tokens) */
    const int32_t *bias_ids; /* (n_bias) OpenAI's logit_bias in [-100, 100], before the penalties and the draw */
    const float *bias;
    int32_t n_bias;        /* 0 .. 1024, sampling only */
    int logprobs;          /* 1: each generated token's log-probability (sampling only) */
    int prompt_logprobs;   /* 1: each prompt token's log-probability (the prompt is then computed whole) */
    int32_t top_logprobs;  /* 0 .. KVP_MAX_TOP_LOGPROBS: with either, the most likely tokens at each place */
    int32_t priority;      /* with KVP_SCHED_PRIORITY: lower values are admitted first (vLLM's), 0 by default */
    void *user;            /* the caller's tag, handed back in the result */
} kvp_session_request;

/* Blocks of bs tokens for every request of reqs[0..n) at once at its full length (max_tokens clamped to a
 * context of max_len), each of its samples or beams a whole sequence: the "enough" of a batch run. */
int32_t kvp_session_blocks_for(const kvp_session_request *reqs, int32_t n, int32_t bs, int32_t max_len);

typedef struct {
    int32_t n_samples;
    int32_t **tokens;     /* [n_samples] generated ids (EOS excluded), owned */
    int32_t *n_tokens;    /* [n_samples] */
    double *logprob;      /* [n_samples] cumulative log-probability (0 with skip_logprob, but for beam search) */
    kvp_finish_reason *finish; /* [n_samples] */
    int32_t *stop_token;  /* [n_samples] the EOS or stop id that ended it, else -1 */
    void *user;           /* the request's tag */
    kvp_logprobs *logprobs;      /* [n_samples] with request.logprobs, else NULL */
    kvp_logprobs prompt_logprobs; /* with request.prompt_logprobs: n_prompt places (place 0: lp NaN, ids -1) */
    int32_t prompt_cached_tokens; /* prompt tokens served by the prefix cache (and its host tier) at admission */
    double ttft_s;        /* from its add to the first generated token */
    double tpot_s;        /* mean time per generated token after the first (0 when <= 1 token) */
    double finish_s;
    double queue_s;       /* from its add to its first admission (finish_s when it never ran) */
    int32_t preemptions;  /* of all its sequences */
} kvp_session_result;
void kvp_session_results_free(kvp_session_result *results, int32_t n);

typedef struct kvp_session kvp_session;

/* A session on executor ex (owned from now on, even on failure: destroyed with the session); its KV cache must
 * hold cfg->num_blocks blocks of cfg->engine.block_size tokens (and the host blocks kvp_engine_host_blocks
 * says). KVP_EINVAL for a bad cfg (num_blocks 0 included, naming the field), KVP_ENOMEM. */
kvp_status kvp_session_create(const kvp_session_config *cfg, kvp_executor ex, kvp_session **out);
void kvp_session_destroy(kvp_session *s); /* NULL: no-op; unfinished requests are dropped */
/* KVP_EINVAL naming the request's bad field (a token outside the vocabulary, a prompt that fills the context,
 * ...), KVP_ENOBLOCKS when one sequence of it at its full length cannot fit the cache. On failure nothing is
 * added and no id is used. */
kvp_status kvp_session_add(kvp_session *s, const kvp_session_request *r, int32_t *id);
int kvp_session_pending(const kvp_session *s); /* nonzero while an added request is not finished */
/* One step (nothing when nothing is pending). An error leaves the session unusable: destroy it. */
kvp_status kvp_session_step(kvp_session *s);
/* The oldest finished request not taken yet: its id and result (free it with kvp_session_results_free(res,
 * 1)). KVP_ENOTFOUND, with no message, when there is none. */
kvp_status kvp_session_take(kvp_session *s, int32_t *id, kvp_session_result *res);

/* The tokens sample k of request id has generated so far (borrowed until the next step or take); none
 * before its prompt is computed. Sampling requests only. KVP_ENOTFOUND, with no message, for an unknown id
 * or sample, a beam search, or a request already taken. */
kvp_status kvp_session_partial(const kvp_session *s, int32_t id, int32_t k, const int32_t **tokens, int32_t *n);
/* Their log-probabilities (a request with logprobs). KVP_ENOTFOUND as above, and without logprobs. */
kvp_status kvp_session_partial_logprobs(const kvp_session *s, int32_t id, int32_t k, const kvp_logprobs **lp);
/* The prompt log-probabilities recorded so far; KVP_ENOTFOUND without prompt_logprobs. */
kvp_status kvp_session_prompt_logprobs(const kvp_session *s, int32_t id, const kvp_logprobs **lp);
/* Ends sample k of request id now, keeping its first n_keep generated tokens (kvp_engine_stop; INT32_MAX:
 * all of them). KVP_ENOTFOUND, with no message, when that sample is not running. */
kvp_status kvp_session_stop_at(kvp_session *s, int32_t id, int32_t k, int32_t n_keep);
kvp_status kvp_session_stop(kvp_session *s, int32_t id, int32_t k); /* keeps every token */
/* Ends request id now, whatever its stage (kvp_engine_abort); it is then taken like any other. */
kvp_status kvp_session_abort(kvp_session *s, int32_t id);
/* Empties the prefix cache and its host tier (kvp_engine_reset_prefix_cache). */
kvp_status kvp_session_reset_prefix_cache(kvp_session *s, int64_t *evicted);

typedef struct {
    int64_t requests, finished, waiting;   /* added, finished (taken or not), not admitted yet */
    int64_t aborted;
    int32_t request_records, seq_records;  /* records held now (bounded for a server) */
    int64_t running_seqs, preempted_seqs;  /* now: running, and waiting again after a preemption or swapped */
    int64_t running_requests;              /* now: requests with a running sequence */
    int64_t steps, computed_tokens, prefix_hit_tokens, preemptions, admitted_prompt_tokens;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int32_t num_blocks, free_blocks;       /* free: neither held by a sequence nor cached */
    int64_t host_hit_tokens, host_loaded_blocks, host_stored_blocks;
} kvp_session_stats;
void kvp_session_stats_get(const kvp_session *s, kvp_session_stats *out);
/* The session's engine (borrowed): metrics, checks. */
const kvp_engine *kvp_session_engine(const kvp_session *s);

/* What kvp_session_run measured. */
typedef struct {
    double wall_s;
    int64_t steps;
    int64_t prompt_tokens;     /* sum of prompt lengths */
    int64_t generated_tokens;  /* tokens of the returned samples (beam search: of the n best beams) */
    int64_t computed_tokens;   /* rows through the forward pass (recomputation and drafts included) */
    int64_t attended_positions; /* over those rows, the key positions each attends (its position + 1) */
    double tokens_per_s;       /* generated_tokens / wall_s */
    double prefix_hit_rate;    /* prefix_hit_tokens / prompt_tokens */
    int64_t prefix_hit_tokens, host_hit_tokens, host_loaded_blocks, host_stored_blocks;
    int64_t preemptions;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int64_t cow_copies;
    int64_t peak_used_blocks, peak_token_states, peak_logical_tokens, peak_shared_savings;
    double mean_kv_utilization; /* over steps: token_states / slots of used blocks */
    double mean_shared_savings; /* sum of shared_savings / sum of logical_tokens over steps (the PagedAttention
                                 * paper's Fig. 15 "memory saving") */
    int32_t num_blocks, block_size;
    int64_t kv_pool_bytes;     /* the KV cache's pools, every layer, K and V */
} kvp_run_stats;
double kvp_spec_acceptance(const kvp_run_stats *st); /* accepted / proposed draft tokens (0 with none) */

/* Runs reqs[0..n) to completion on session s (fresh: request i gets id i): results[i] is request i's
 * (written on success only; every result is taken). on_step (may be NULL) is called after every step: it may
 * read kvp_session_partial and end samples with kvp_session_stop_at (stop strings). stats (may be NULL):
 * kv_pool_bytes is left 0 (the executor's). The checks of kvp_session_add; KVP_ENOMEM. */
kvp_status kvp_session_run(kvp_session *s, const kvp_session_request *reqs, int32_t n, kvp_session_result *results,
                           kvp_run_stats *stats, void (*on_step)(void *ctx, kvp_session *s), void *ctx);

#endif
