/* runtime/engine/request.h — what the engine serves: a request (prompt, length, arrival, priority) and, for a
 * real model, how its tokens are drawn and when its samples end (kvp_output_params).
 *
 *   kvp_request { id, arrival_s, tokens -> [prompt_len], prompt_len, output_len, priority,
 *                 output_tokens -> [output_len] or NULL, after, think_s, after_prompt, out -> params or NULL }
 *
 * A request of a trace (runtime/workload/) has no output params: it yields exactly output_len tokens, the
 * answer the trace gives (output_tokens) or, without one, whatever the executor samples greedily (the sim
 * executor samples nothing: the engine then makes up a deterministic token per request and position). A
 * request of `generate` or `serve` carries params: n samples or a beam search, a sampler, stop ids, EOS,
 * penalties, logprobs (runtime/engine/session.h builds them).
 * Ownership: everything a request points to is borrowed by the engine and must outlive it (the session
 * keeps its own copies).
 */
#ifndef KVP_RUNTIME_ENGINE_REQUEST_H
#define KVP_RUNTIME_ENGINE_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/sampler.h"

enum { KVP_MAX_TOP_LOGPROBS = 20, KVP_MAX_SAMPLES = 1000, KVP_MAX_STOP_IDS = 1024, KVP_MAX_BIAS = 1024 };

/* The output stage's parameters of one request (runtime/engine/output.c). */
typedef struct {
    kvp_sampler_params sampler;
    int32_t n;              /* samples, >= 1; with beam search the number of best beams returned (<= beam_width) */
    int32_t beam_width;     /* 0 or 1: sampling; > 1: beam search (the sampler, stop ids and EOS are not used) */
    const int32_t *stop_ids; /* [n_stop_ids] tokens that end a sample as EOS does (not part of its tokens) */
    int32_t n_stop_ids;
    bool ignore_eos;        /* EOS is an ordinary token for this request */
    int32_t min_tokens;     /* EOS and the stop ids cannot be drawn before this many tokens (vLLM's) */
    const int32_t *bias_ids; /* [n_bias] OpenAI's logit_bias: bias[i] in [-100, 100] added to the logit of
                              * bias_ids[i] before the penalties and the draw (logprobs stay the model's) */
    const float *bias;
    int32_t n_bias;
    bool logprobs;          /* each generated token's log-probability (sampling only) */
    bool prompt_logprobs;   /* each prompt token's log-probability given the ones before (no prefix-cache hit
                               at the first admission: every prompt token's logits are computed) */
    int32_t top_logprobs;   /* 0 .. KVP_MAX_TOP_LOGPROBS most likely tokens at each place, with either */
} kvp_output_params;

/* n = 1, greedy, nothing else. */
kvp_output_params kvp_output_params_default(void);

typedef struct {
    int64_t id;         /* unique among the engine's requests */
    double arrival_s;   /* arrival time in seconds from the start */
    int32_t *tokens;    /* [prompt_len] token ids, or NULL (a trace without ids: no prefix cache then) */
    int32_t prompt_len; /* >= 1 */
    int32_t output_len; /* tokens to generate, >= 0 (at most: a sample may end earlier at EOS or a stop id) */
    int32_t priority;   /* larger = more important (scheduler and priority eviction); 0 by default */
    int32_t *output_tokens; /* [output_len] the answer, when the workload knows it (a chat turn whose answer
                               a later turn's prompt contains), else NULL. The engine then generates exactly
                               these tokens and caches their blocks. */
    int64_t after;      /* 1 + the workload index of an earlier request whose answer this one waits for
                           (the previous chat turn), 0: none. It then arrives at max(arrival_s, that request's
                           finish + think_s) (kvp_engine_run). */
    double think_s;     /* >= 0, with after */
    bool after_prompt;  /* with after: a parallel sample of that request (kvp_workload_fork), arriving with it;
                           it waits only for that request's prompt to be computed, then joins as a request of
                           the same arrival and finds the prompt in the prefix cache (vLLM v1's fan-out of n > 1:
                           one prefill, the samples share its blocks). think_s is ignored. */
    const kvp_output_params *out; /* NULL: one greedy sample of exactly output_len tokens, EOS ignored */
} kvp_request;

#endif
