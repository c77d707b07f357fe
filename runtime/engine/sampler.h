/* runtime/engine/sampler.h — next-token choice from logits: greedy, temperature, min-p, top-k, top-p, seeded.
 *
 * Order of operations (as vLLM's): penalties (kvp_apply_penalties, on a copy of the logits made by the
 * caller) -> logits / temperature -> drop the tokens less likely than min_p x the likeliest -> keep the
 * top_k largest -> keep the smallest prefix (by probability, descending) whose mass reaches top_p (of what
 * min-p and top-k left) -> renormalise -> draw one token
 * with the sequence's own generator. temperature 0 means greedy (argmax, lowest id on ties; top_k/top_p
 * ignored). Each sequence owns a kvp_rng, so a sequence's draws do not depend on the rest of the batch.
 */
#ifndef KVP_RUNTIME_SAMPLER_H
#define KVP_RUNTIME_SAMPLER_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    double temperature; /* >= 0; 0 = greedy */
    int32_t top_k;      /* >= 0; 0 = no limit */
    double top_p;       /* (0, 1]; 1 = no limit */
    double min_p;       /* [0, 1]; 0 = no limit */
    uint64_t seed;
    /* penalties on the tokens a sample has seen (OpenAI's and vLLM's): */
    float presence_penalty;   /* [-2, 2]: subtracted once from the logit of each token the sample generated */
    float frequency_penalty;  /* [-2, 2]: subtracted from it as many times as the sample generated it */
    float repetition_penalty; /* 0 or 1: none; else (0, 10]: the logit of a token of the prompt or of the
                               * sample, divided by it when positive, multiplied when not (CTRL's, as vLLM) */
} kvp_sampler_params;

/* temperature 0 (greedy), top_k 0, top_p 1, min_p 0, seed 0, no penalty. */
kvp_sampler_params kvp_sampler_default(void);
/* KVP_EINVAL naming the bad field (temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], min_p
 * outside [0, 1], a penalty outside its range). */
kvp_status kvp_sampler_check(const kvp_sampler_params *p);
/* Nonzero when p has a penalty to apply. */
int kvp_sampler_penalized(const kvp_sampler_params *p);
/* Applies p's penalties to logits[0..vocab) in vLLM's order (repetition, then frequency, then presence) for a
 * sample with prompt[0..n_prompt) and generated out[0..n_out). count: vocab zeros of scratch, zeros again on
 * return. */
void kvp_apply_penalties(const kvp_sampler_params *p, float *logits, int32_t vocab, const int32_t *prompt,
                         int32_t n_prompt, const int32_t *out, int32_t n_out, int32_t *count);

/* splitmix64-seeded xoshiro256** generator. */
typedef struct {
    uint64_t s[4];
} kvp_rng;
void kvp_rng_seed(kvp_rng *r, uint64_t seed, uint64_t stream); /* distinct streams for n > 1 samples */
uint64_t kvp_rng_next(kvp_rng *r);
double kvp_rng_uniform(kvp_rng *r); /* [0, 1), 53 random bits */

/* Workspace for kvp_sample over a vocabulary of `vocab` ids. Owned by the caller (kvp_sampler_ws_destroy). */
typedef struct kvp_sampler_ws kvp_sampler_ws;
kvp_status kvp_sampler_ws_create(int32_t vocab, kvp_sampler_ws **out);
void kvp_sampler_ws_destroy(kvp_sampler_ws *ws);

/* Index of the largest logit (lowest id on ties). */
int32_t kvp_argmax(const float *logits, int32_t vocab);
/* The chosen token for logits[0..vocab) (borrowed, not modified). Draws from rng unless greedy. */
int32_t kvp_sample(const kvp_sampler_params *p, kvp_rng *rng, const float *logits, int32_t vocab,
                   kvp_sampler_ws *ws);
/* kvp_sample, and in *logprob the token's log-probability under the untempered logits, bit-identical to
 * kvp_log_softmax(logits)[token] (one pass of exp instead of two at temperature 1; no vocabulary-long write). */
int32_t kvp_sample_logprob(const kvp_sampler_params *p, kvp_rng *rng, const float *logits, int32_t vocab,
                           kvp_sampler_ws *ws, double *logprob);
/* n <= KVP_SAMPLE_MANY draws at once, draw i with its own params p[i], rng[i] and logits[i]: the tokens,
 * log-probabilities (logprob NULL: none, as kvp_sample) and rng states of n calls of kvp_sample_logprob.
 * The plain-temperature draws (no top-k, no top-p) run their running sums, one chain of dependent adds over
 * the vocabulary each, in one loop, where their latencies overlap. */
enum { KVP_SAMPLE_MANY = 4 };
void kvp_sample_many(int n, const kvp_sampler_params *const *p, kvp_rng *const *rng, const float *const *logits,
                     int32_t vocab, kvp_sampler_ws *ws, int32_t *tok, double *logprob);
/* kvp_log_softmax(logits)[tok], bit for bit, without writing the others. */
double kvp_token_logprob(const float *logits, int32_t vocab, int32_t tok);
/* out[i] = log softmax(logits)[i] (double accumulation); out may alias nothing. */
void kvp_log_softmax(const float *logits, int32_t vocab, float *out);
/* The k largest of lsm[0..vocab) (k <= vocab): ids[i], lps[i] in descending order, lowest id first on ties. */
void kvp_top_logprobs(const float *lsm, int32_t vocab, int32_t k, int32_t *ids, float *lps);

#endif
