/* runtime/engine/gen.h — text generation on the CPU executor: a continuous-batching loop over the block manager
 * (blockmgr/), the prefix cache (prefix_cache/) and the model's paged KV cache (runtime/model/model.h).
 *
 * Each step: (1) waiting work is admitted in the policy's order (kvp_gen_config.sched; preempted sequences
 * first) while the running set, the token budget and the free + evictable blocks allow it, with a
 * prefix-cache match on its tokens; (2) every running sequence gets its next tokens — decodes first (1 token
 * each, plus its drafts with speculation), then prompt chunks with what is left of the budget (chunked prefill); slots come from
 * kvp_bm_append, evicting cached blocks and then preempting (recompute) the most recently admitted
 * preemptible sequence (under the priority policy the least urgent) when blocks run out;
 * (3) copy-on-write copies are run; (4) one batched forward pass over all of them; (5) sequences that
 * reached the end of their known tokens sample, fork or finish (a speculating one verifies its drafts, then
 * truncates the slots of those rejected); a finished sequence frees its blocks at once.
 *
 *   request (n = 1)       one sequence
 *   request (n > 1)       one sequence prefills the prompt, then forks into n (kvp_bm_fork: the prompt's
 *                         blocks are shared, copy-on-write of the partly filled last block); sample i uses
 *                         generator stream i of the seed, so results do not depend on batching
 *   request (beam W > 1)  the prompt is prefilled once; W beams advance in lockstep; each step keeps the W
 *                         best (cumulative log-probability) of the W x W candidate extensions, forking a
 *                         beam chosen twice and freeing a beam chosen never. Beams run max_tokens steps
 *                         (EOS is an ordinary token for them); results are the n best beams.
 *
 * Greedy results are batch invariant with KVP_MATMUL_INVARIANT: a request gives the same tokens alone or in
 * any batch, with or without a prefix cache, at any block size.
 * Ownership: everything passed in is borrowed for the call; results are owned by the caller
 * (kvp_gen_results_free). Not thread-safe per model.
 */
#ifndef KVP_RUNTIME_GEN_H
#define KVP_RUNTIME_GEN_H

#include <stdint.h>

#include "common/status.h"
#include "prefix_cache/prefix_cache.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/engine/sampler.h"

typedef struct {
    int32_t block_size;         /* >= 1 */
    int32_t num_blocks;         /* KV capacity; 0 = enough for every request at once */
    kvp_pc_kind cache;          /* prefix cache across requests (KVP_PC_NONE: off) */
    int32_t max_num_seqs;       /* running sequences at most, >= 1 */
    int32_t max_batched_tokens; /* token budget of a step, >= 1 (decodes always run) */
    int stop_at_eos;            /* 1: a sampled EOS ends a sample (not part of its tokens) */
    kvp_dtype kv_dtype;         /* element type of the KV cache (kvp_kv_cache_create) */
    int skip_logprob;           /* 1: results' logprob stays 0 (beam search aside): no pass over the vocabulary
                                   per sampled token for it (~200 us a token at a 128k vocabulary) */
    kvp_sched_policy sched;     /* the order waiting requests are admitted in (preempted sequences first, always):
                                   FCFS arrival; PRIORITY each request's priority (lowest first, as vLLM), then
                                   arrival; LPM (SGLang's) the most prompt blocks found in the prefix cache among
                                   the KVP_LPM_WINDOW oldest, then arrival. Admission stops at the first that does
                                   not fit. PRIORITY also preempts the least urgent sequence when blocks run out,
                                   and readmits the most urgent preempted one first. */
    /* n-gram speculative decoding (vLLM's "ngram" method, prompt lookup): each decoding sample (not a beam
     * search) looks for the latest earlier occurrence of its last n tokens (the longest n in spec_ngram_min ..
     * spec_ngram_max that has one) and proposes the tokens that followed it, up to spec_tokens of them, computed
     * in the same step as its next token. Each place's token is drawn as without speculation (the same
     * sampler, rng draw and logits), and drafts are kept while they equal what was drawn: results are those of
     * decoding without it, and a step gains the drafts kept. Rejected drafts' slots are truncated away. Drafts
     * take only free blocks (never evict or preempt) and what is left of the step's token budget. */
    int32_t spec_tokens;     /* drafts per sample and step, 0 (off) .. KVP_GEN_MAX_SPEC */
    int32_t spec_ngram_min;  /* 1 <= min <= max <= KVP_GEN_MAX_NGRAM when spec_tokens > 0 */
    int32_t spec_ngram_max;
    int32_t spec_max_batch;  /* vLLM's disable_by_batch_size: no drafts in a step that starts with more running
                                sequences than this (a large batch is compute-bound: drafts cost more than they
                                save); 0: no limit */
    /* Host tier of the prefix cache (prefix_cache/host_cache.h; needs cache != none): a second KV cache of that
     * many blocks in host memory, LRU, filled write-through with every block the prefix cache takes in (copied
     * at once). An admission that matches n blocks in the prefix cache copies the blocks after them from there
     * when it holds them, instead of computing them. 0: none. With host_write_policy write_back, a block goes
     * there only when the prefix cache evicts it (and no sequence holds it), copied before it is reused. */
    int32_t host_cache_blocks;
    kvp_hc_write_policy host_write_policy;
} kvp_gen_config;

enum { KVP_GEN_MAX_SPEC = 16, KVP_GEN_MAX_NGRAM = 64 };

/* block 16, auto blocks, radix cache, 256 seqs, 2048 tokens, stop at EOS, f32 KV cache, FCFS, no speculation. */
kvp_gen_config kvp_gen_config_default(void);

/* Sets cfg's speculation from vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": K,
 * "prompt_lookup_max": N, "prompt_lookup_min": M, "disable_by_batch_size": B} (N and M default to each other,
 * both to 5 as vLLM's; B to none).
 * KVP_EPARSE for malformed JSON; KVP_EINVAL naming the key for an unknown key, a method other than ngram (the
 * others need a draft model) or a value out of range. On error cfg is unchanged. */
kvp_status kvp_gen_spec_parse(const char *json, kvp_gen_config *cfg);

typedef struct {
    const int32_t *prompt; /* (n_prompt) token ids, BOS included when wanted; borrowed */
    int32_t n_prompt;      /* >= 1 */
    int32_t max_tokens;    /* tokens to generate after the prompt, >= 0 */
    kvp_sampler_params sampler;
    int32_t n;             /* samples (>= 1); with beam search, the number of best beams returned (<= W) */
    int32_t beam_width;    /* 0 or 1: sampling; > 1: beam search (the sampler is not used) */
    const int32_t *stop_ids; /* (n_stop_ids) tokens that end a sample as EOS does (not part of its tokens);
                              * borrowed (a session copies them); not used by beam search */
    int32_t n_stop_ids;
    int ignore_eos;        /* 1: EOS is an ordinary token for this request (whatever stop_at_eos says) */
    int32_t min_tokens;    /* vLLM's: EOS and the stop ids cannot be drawn before this many tokens (<= max_tokens) */
    const int32_t *bias_ids; /* (n_bias) OpenAI's logit_bias: bias[i] in [-100, 100] is added to the logit of
                              * token bias_ids[i] before the penalties and the draw (the reported
                              * log-probabilities are the model's); borrowed (a session copies them) */
    const float *bias;
    int32_t n_bias;        /* 0 .. 1024; with the sampler's penalties, sampling only (not beam search) */
    int logprobs;          /* 1: each generated token's log-probability (sampling only, not beam search) */
    int prompt_logprobs;   /* 1: each prompt token's log-probability given the tokens before it; the prompt is
                            * then computed whole at its first admission (no prefix-cache hit) */
    int32_t top_logprobs;  /* 0 .. KVP_GEN_MAX_TOP_LOGPROBS: with either, the most likely tokens at each place */
    int32_t priority;      /* with KVP_SCHED_PRIORITY: lower values are admitted first (vLLM's), 0 by default */
    void *user;            /* the caller's tag, handed back in the result; not used by the session */
} kvp_gen_request;

enum { KVP_GEN_MAX_TOP_LOGPROBS = 20 };

/* Log-probabilities at n places of a token list: log softmax of the model's logits (untempered, as
 * kvp_log_softmax) at the place before, for the token there and the k most likely tokens. */
typedef struct {
    int32_t n, k;
    float *lp;        /* (n) the token's log-probability */
    int32_t *top_ids; /* (n, k) the k most likely tokens, descending (kvp_top_logprobs) */
    float *top_lps;   /* (n, k) their log-probabilities */
} kvp_gen_logprobs;
/* *dst := an owned copy of src (KVP_ENOMEM: *dst empty). */
kvp_status kvp_gen_logprobs_copy(const kvp_gen_logprobs *src, kvp_gen_logprobs *dst);
/* Frees a's arrays; a is zeroed. */
void kvp_gen_logprobs_free(kvp_gen_logprobs *a);

/* Why a sample ended. */
typedef enum {
    KVP_FINISH_LENGTH = 0, /* max_tokens (or the model's context) reached */
    KVP_FINISH_EOS,        /* sampled EOS */
    KVP_FINISH_STOP_TOKEN, /* sampled one of the request's stop_ids */
    KVP_FINISH_STOPPED,    /* kvp_gen_session_stop */
    KVP_FINISH_ABORTED,    /* kvp_gen_session_abort */
} kvp_gen_finish;
/* "length", "eos", "stop_token", "stopped", "aborted". */
const char *kvp_gen_finish_name(kvp_gen_finish f);

typedef struct {
    int32_t n_samples;
    int32_t **tokens;     /* [n_samples] generated ids (EOS excluded), owned */
    int32_t *n_tokens;    /* [n_samples] */
    double *logprob;      /* [n_samples] cumulative log-probability of the generated tokens (0 with skip_logprob,
                             but for a beam search) */
    kvp_gen_finish *finish; /* [n_samples] why each sample ended */
    int32_t *stop_token;  /* [n_samples] the EOS or stop id that ended it (KVP_FINISH_EOS/STOP_TOKEN), else -1 */
    void *user;           /* the request's tag */
    kvp_gen_logprobs *logprobs;      /* [n_samples] with request.logprobs (place i: tokens[i]), else NULL */
    kvp_gen_logprobs prompt_logprobs; /* with request.prompt_logprobs: n_prompt places; place 0 (nothing comes
                                       * before it) has lp NaN and top ids -1; else n = 0 */
    int32_t prompt_cached_tokens; /* prompt tokens served by the prefix cache at first admission */
    double ttft_s;        /* from the start of the run to the first generated token */
    double tpot_s;        /* mean time per generated token after the first (0 when <= 1 token) */
    double finish_s;
} kvp_gen_result;

typedef struct {
    double wall_s;
    int64_t steps;
    int64_t prompt_tokens;     /* sum of prompt lengths */
    int64_t generated_tokens;  /* tokens of the returned samples (beam search: of the n best beams) */
    int64_t computed_tokens;   /* rows through the forward pass (recomputation included) */
    int64_t attended_positions; /* over those rows, the key positions each attends (its position + 1),
                                 * summed: times kvp_kv_cache_bytes(m, kv_dtype, 1, 1), the K/V bytes the
                                 * attention reads (layers with a sliding window read fewer) */
    double tokens_per_s;       /* generated_tokens / wall_s */
    double prefix_hit_rate;    /* prefix_hit_tokens / prompt_tokens (as the engine's) */
    int64_t prefix_hit_tokens; /* prompt tokens the prefix cache served at each request's first admission */
    int64_t host_hit_tokens;   /* prompt tokens its host tier served then (not in prefix_hit_tokens) */
    int64_t host_loaded_blocks, host_stored_blocks; /* copies from and to the host tier, readmissions included */
    int64_t preemptions;
    int64_t spec_drafts;       /* speculation: steps of a sample that proposed drafts */
    int64_t spec_draft_tokens; /* tokens proposed */
    int64_t spec_accepted_tokens; /* of them, kept */
    int64_t cow_copies;        /* copy-on-write block copies */
    int64_t peak_used_blocks;  /* blocks held by sequences (not counting cache-only blocks) */
    int64_t peak_token_states; /* slots holding a token (shared ones once) */
    int64_t peak_logical_tokens;
    int64_t peak_shared_savings;
    double mean_kv_utilization; /* over steps: token_states / slots of used blocks */
    double mean_shared_savings; /* over steps: sum of shared_savings / sum of logical_tokens, the share of the
                                 * sequences' token slots that sharing (forks, beams, prefix hits) kept from
                                 * being stored twice (the PagedAttention paper's Fig. 15 "memory saving") */
    int32_t num_blocks, block_size;
    int64_t kv_pool_bytes;     /* the KV cache's pools, every layer, K and V (num_blocks of kv_dtype) */
} kvp_gen_stats;

/* The n-gram lookup of speculation: for the longest n in nmin .. nmax such that the last n tokens of t[0, len)
 * occurred before (ending before its last token; overlaps allowed), the tokens that followed the latest such
 * occurrence with max_out tokens after it, else the earliest (the most after it: a run of one token proposes
 * more of it); at most max_out of them into out. Returns how many (0: no occurrence). */
int32_t kvp_ngram_propose(const int32_t *t, int32_t len, int32_t nmin, int32_t nmax, int32_t max_out, int32_t *out);

/* The KV blocks that `bytes` of this model's KV hold (element type dt, blocks of bs tokens; this rank's share
 * under tensor parallelism) into *blocks: --kv-mem's cache, --kv-offloading-size's host tier. KVP_EINVAL naming
 * `opt` when they hold no block or more than INT32_MAX / 2 (*blocks unchanged then). */
kvp_status kvp_gen_blocks_in(const kvp_model *m, kvp_dtype dt, int32_t bs, int64_t bytes, const char *opt, int32_t *blocks);

/* spec_accepted_tokens / spec_draft_tokens (0 with no draft). */
double kvp_gen_spec_acceptance(const kvp_gen_stats *st);

/* Runs every request to completion. KVP_EINVAL naming the request for bad parameters or a prompt that
 * does not fit the model's context (max_tokens is clamped so that prompt + max_tokens <= context, with a
 * warning); KVP_ENOBLOCKS when num_blocks is too small for one request even after preempting others;
 * KVP_ENOMEM. results[0..n) are written on success only. */
kvp_status kvp_gen_run(kvp_model *m, const kvp_gen_config *cfg, const kvp_gen_request *reqs, int32_t n,
                       kvp_gen_result *results, kvp_gen_stats *stats);
void kvp_gen_results_free(kvp_gen_result *results, int32_t n);

/* ---- the same loop, online: requests join a running session at any step (a server's engine loop).
 *
 *   kvp_gen_session_create(m, &cfg, &s);          // cfg.num_blocks >= 1: the cache is made now
 *   kvp_gen_session_add(s, &req, &id);            // any time; the prompt is copied
 *   while (kvp_gen_session_pending(s)) {
 *       kvp_gen_session_step(s);                  // one batched step of every running sequence
 *       while (kvp_gen_session_take(s, &id, &res) == KVP_OK) ...   // finished requests, in finishing order
 *   }
 *
 * A session is used by one thread at a time. Request ids count from 0 in the order of adding; a result's
 * ttft_s and finish_s count from its request's add. A session serves any number of requests in bounded memory:
 * a request's records (prompt, sequences, tokens) are freed when it is taken. */
typedef struct kvp_gen_session kvp_gen_session;

/* KVP_EINVAL for a bad cfg (num_blocks 0 included), KVP_ENOMEM. */
kvp_status kvp_gen_session_create(kvp_model *m, const kvp_gen_config *cfg, kvp_gen_session **out);
void kvp_gen_session_destroy(kvp_gen_session *s); /* NULL: no-op; unfinished requests are dropped */
/* The checks of kvp_gen_run (KVP_EINVAL), and KVP_ENOBLOCKS when one sequence of the request at its full
 * length cannot fit the cache. On failure nothing is added. */
kvp_status kvp_gen_session_add(kvp_gen_session *s, const kvp_gen_request *r, int32_t *id);
/* Nonzero while some added request is not finished. */
int kvp_gen_session_pending(const kvp_gen_session *s);
/* One step (nothing when nothing is pending). An error (KVP_ENOMEM, KVP_ENOBLOCKS) leaves the session
 * unusable: destroy it. */
kvp_status kvp_gen_session_step(kvp_gen_session *s);
/* The oldest finished request not taken yet: its id and result (the caller frees it with
 * kvp_gen_results_free(res, 1)). KVP_ENOTFOUND, with no message, when there is none. */
kvp_status kvp_gen_session_take(kvp_gen_session *s, int32_t *id, kvp_gen_result *res);

/* The tokens sample k (0 .. n-1) of request id has generated so far (borrowed: valid until the next step
 * or take); none before its prompt is computed. Sampling requests only (not beam search, whose beams
 * change). KVP_ENOTFOUND, with no message, for an unknown id or sample, a beam search, or a request
 * already taken. */
kvp_status kvp_gen_session_partial(const kvp_gen_session *s, int32_t id, int32_t k, const int32_t **tokens,
                                   int32_t *n);

/* The log-probabilities of those tokens (a request with logprobs): borrowed as they are; n = 0 before the
 * prompt is computed. KVP_ENOTFOUND as kvp_gen_session_partial, and for a request without logprobs. */
kvp_status kvp_gen_session_partial_logprobs(const kvp_gen_session *s, int32_t id, int32_t k, const kvp_gen_logprobs **lp);

/* The prompt log-probabilities recorded so far for request id (a request with prompt_logprobs: complete when
 * lp->n is its prompt's length); borrowed until the next step or take. KVP_ENOTFOUND, with no message, for an
 * unknown or taken id or a request without prompt_logprobs. */
kvp_status kvp_gen_session_prompt_logprobs(const kvp_gen_session *s, int32_t id, const kvp_gen_logprobs **lp);

/* Ends sample k of sampling request id now (a stop string found by the caller, say): it keeps the tokens it
 * has, finishes with KVP_FINISH_STOPPED, and its blocks are freed. KVP_ENOTFOUND, with no message, when that
 * sample is not running (unknown, already finished, not forked yet, a beam search). */
kvp_status kvp_gen_session_stop(kvp_gen_session *s, int32_t id, int32_t k);
/* kvp_gen_session_stop, keeping the first n_keep generated tokens of the sample (a stop string found inside
 * the several tokens a speculative step adds): the tokens after them, their log-probabilities and their share
 * of the cumulative one are dropped. n_keep >= the tokens it has: as kvp_gen_session_stop. A sample that
 * finished in the last step (not taken yet) is cut as well, and its finish becomes KVP_FINISH_STOPPED.
 * Tokens of an earlier step are never cut (it is stopped keeping them). KVP_ENOTFOUND as kvp_gen_session_stop. */
kvp_status kvp_gen_session_stop_at(kvp_gen_session *s, int32_t id, int32_t k, int32_t n_keep);
/* Ends request id now, whatever its stage (its client left, say): running samples keep what they have and
 * finish with KVP_FINISH_ABORTED; a request not admitted yet finishes with no sample. It is then taken like
 * any other. KVP_ENOTFOUND, with no message, when id is unknown, finished or taken. */
kvp_status kvp_gen_session_abort(kvp_gen_session *s, int32_t id);
/* Empties the prefix cache (vLLM's reset_prefix_cache, SGLang's flush_cache): every cached block is dropped;
 * those a running sequence holds stay its own, the others are free again; its host tier is emptied too.
 * *evicted (may be NULL): blocks dropped from the device. Requests added later find nothing cached. */
kvp_status kvp_gen_session_reset_prefix_cache(kvp_gen_session *s, int64_t *evicted);

typedef struct {
    int64_t requests, finished, waiting;   /* added, finished (taken or not), not admitted yet */
    int64_t aborted;                       /* requests ended by kvp_gen_session_abort */
    int32_t request_records, seq_records;  /* records held now: the request window (the requests not taken, and
                                            * at most as many taken ones before its next compaction), and the
                                            * sequences of requests not taken */
    int64_t running_seqs, preempted_seqs;  /* now */
    int64_t steps, computed_tokens, prefix_hit_tokens, preemptions, admitted_prompt_tokens;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens; /* as kvp_gen_stats */
    int32_t num_blocks, free_blocks;       /* free: neither held by a sequence nor cached */
    int64_t host_hit_tokens, host_loaded_blocks, host_stored_blocks; /* the prefix cache's host tier (kvp_gen_stats) */
} kvp_gen_session_stats;
void kvp_gen_session_stats_get(const kvp_gen_session *s, kvp_gen_session_stats *out);

/* kvp_gen_run, calling on_step(ctx, s) after every step with the run's session, where request i has id i:
 * the caller may read kvp_gen_session_partial and end samples with kvp_gen_session_stop (stop strings). */
kvp_status kvp_gen_run_stepped(kvp_model *m, const kvp_gen_config *cfg, const kvp_gen_request *reqs, int32_t n,
                               kvp_gen_result *results, kvp_gen_stats *stats,
                               void (*on_step)(void *ctx, kvp_gen_session *s), void *ctx);

#endif
