/* runtime/engine/engine.h — the one serving engine of simulate, generate, serve and the benchmarks:
 * requests, the scheduler, the KV manager and the output stage, over an executor (sim, cpu, ...).
 *
 *   arrivals ---> waiting ---admit---> running ---finish---> done (blocks freed at once)
 *                  ^   ^                 |  |
 *                  |   +---recompute-----+  |   preemption when blocks run out: the lowest-ranked running
 *                  |                        |   sequence gives up its blocks (recompute: back to waiting,
 *                  +--- swapped <--swap-----+   prefill again later; swap: its blocks move to host memory)
 *                          |
 *                          +---swap in---> running     (before any new admission)
 *
 * One step (kvp_engine_step; scheduler.c):
 *   1. requests whose time has come join `waiting` in rank order (one waiting for another's answer joins at
 *      max(its time, that one's finish + think_s); a parallel sample once that request's prompt is computed);
 *   2. token budget B = max_batched_tokens. Running sequences, in rank order, each get min(tokens still to
 *      compute, what is left of B): 1 for a decode (plus its n-gram drafts with speculation), a chunk of the
 *      prompt in chunked prefill. Their KV slots are allocated now; when blocks run out, cached prefix blocks
 *      are evicted first, then the lowest-ranked running sequence is preempted (possibly the one asking;
 *      never a beam: beams advance in lockstep and are admitted only while their reservations fit);
 *   3. when nothing was preempted: swapped sequences come back (rank order), then waiting requests are
 *      admitted in policy order while B, max_num_seqs (a request that will fork counts its n seats),
 *      the watermark and free memory allow; the first that does not fit stops admission (head-of-line);
 *   4. the executor runs the batch and returns the sampling sequences' logits; the output stage (output.c)
 *      samples, forks n > 1 samples after the prompt, steps beam searches, verifies drafts, records
 *      logprobs, ends samples at EOS / stop ids / length; a finished sequence frees its blocks at once.
 * Ranking: fcfs = (arrival, request, sequence); priority = larger priority first, then fcfs; lpm = among the
 * first KVP_LPM_WINDOW waiting, the longest cached prefix (prefix cache + host tier) first, then fcfs.
 * The sequences of one request rank together. With every request present at t = 0 the schedule does not
 * depend on step times: every executor makes the same schedule.
 *
 * Memory (kv_manager.c): paged (block manager + prefix cache + host tier) or one of the contiguous Orca
 * baselines (a reservation per request, never preempted; no prefix cache). A prompt's full blocks are cached
 * when its prefill completes; a sequence preempted by recompute caches all it computed; a finishing one
 * caches its answer when the tokens are real (the workload's output_tokens, or generated for a request with
 * output params), so the next chat turn finds it. Host tier: write-through (or back) of cached blocks; an admission loads the
 * blocks after its prefix hit from there (moves run by the executor).
 *
 * Requests whose prompt reaches max_model_len or whose whole length can never fit the KV memory are rejected
 * (counted, never run); output_len is clamped so that prompt + output <= max_model_len.
 * Ownership: the engine borrows the executor and the requests (tokens, params: they must outlive it). Not
 * thread-safe. Errors: KVP_EINVAL naming the field for a bad configuration, KVP_ENOMEM, KVP_ENOBLOCKS (a beam
 * search that cannot grow), an executor's failure as is; a failed step leaves the engine destroyable only.
 */
#ifndef KVP_RUNTIME_ENGINE_ENGINE_H
#define KVP_RUNTIME_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "blockmgr/accounting.h"
#include "blockmgr/contiguous.h"
#include "common/status.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/ledger.h"
#include "prefix_cache/prefix_cache.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/request.h"

typedef enum { KVP_ALLOC_PAGED = 0, KVP_ALLOC_ORCA_MAX, KVP_ALLOC_ORCA_POW2, KVP_ALLOC_ORCA_ORACLE } kvp_alloc_kind;
typedef enum { KVP_SCHED_FCFS = 0, KVP_SCHED_LPM, KVP_SCHED_PRIORITY } kvp_sched_policy;
typedef enum { KVP_PREEMPT_RECOMPUTE = 0, KVP_PREEMPT_SWAP } kvp_preempt_mode;

/* "paged" | "orca-max" | "orca-pow2" | "orca-oracle"; "fcfs" | "lpm" | "priority"; "recompute" | "swap".
 * KVP_EINVAL naming the value and the choices. _name: static strings. */
kvp_status kvp_alloc_kind_parse(const char *s, kvp_alloc_kind *out);
kvp_status kvp_sched_policy_parse(const char *s, kvp_sched_policy *out);
kvp_status kvp_preempt_mode_parse(const char *s, kvp_preempt_mode *out);
const char *kvp_alloc_kind_name(kvp_alloc_kind k);
const char *kvp_sched_policy_name(kvp_sched_policy p);
const char *kvp_preempt_mode_name(kvp_preempt_mode m);

enum { KVP_LPM_WINDOW = 32, KVP_MAX_SPEC = 16, KVP_MAX_NGRAM = 64 };

typedef struct kvp_engine kvp_engine;
struct kvp_step_info;
/* Called by kvp_engine_run after every step that ran a batch; an error stops the run with it. */
typedef kvp_status (*kvp_step_fn)(void *ctx, const kvp_engine *e, const struct kvp_step_info *info);

/* n-gram speculative decoding (vLLM's "ngram", prompt lookup; spec.c): a decoding sample proposes the tokens
 * that followed the latest earlier occurrence of its last n tokens (the longest n in ngram_min .. ngram_max),
 * computed in the step of its next token; each place is drawn as without speculation and a draft is kept
 * while it equals the draw, so results are unchanged. Drafts take only free blocks and the budget left. */
typedef struct {
    int32_t tokens;     /* drafts per sample and step, 0 (off) .. KVP_MAX_SPEC */
    int32_t ngram_min;  /* 1 <= min <= max <= KVP_MAX_NGRAM when tokens > 0 */
    int32_t ngram_max;
    int32_t max_batch;  /* vLLM's disable_by_batch_size: no drafts in a step that starts with more running
                           sequences than this; 0: no limit */
} kvp_spec_config;

typedef struct {
    kvp_alloc_kind alloc;
    kvp_contig_placement arena; /* where the Orca baselines place reservations (default buddy) */
    int32_t block_size;         /* tokens per block (paged), >= 1 */
    int64_t kv_slots;           /* KV capacity in tokens (per rank); paged: kv_slots / block_size blocks */
    int64_t host_slots;         /* swap space in tokens (paged + swap only); 0 = no swap space */
    int64_t host_cache_slots;   /* host tier of the prefix cache in tokens (needs cache != none); 0 = none */
    kvp_hc_write_policy host_write_policy; /* when blocks go to the host tier (default write_through) */
    int32_t max_num_seqs;       /* running sequences at most, >= 1 */
    int32_t max_batched_tokens; /* token budget per step, >= 1 */
    int32_t max_model_len;      /* prompt + output at most, >= 2 */
    bool chunked_prefill;       /* false: a prompt is computed in one step (needs max_batched_tokens >=
                                   max_model_len) */
    kvp_sched_policy sched;
    kvp_preempt_mode preempt;
    kvp_pc_kind cache;          /* KVP_PC_NONE unless paged */
    kvp_evict_policy evict;
    int32_t watermark_blocks;   /* free blocks admission keeps back (paged), >= 0 */
    /* output stage */
    bool stop_at_eos;           /* a request with output params ends a sample at an EOS id (unless ignore_eos) */
    const int32_t *eos_ids;     /* [n_eos] borrowed */
    int32_t n_eos;
    bool skip_logprob;          /* results' logprob stays 0 (beam search aside): no pass over the vocabulary */
    kvp_spec_config spec;
    bool keep_outputs;          /* keep finished requests' samples until kvp_engine_release (sessions) */
    bool wall_clock;            /* time is wall time since creation (an online session), not the sum of step times */
    const char *kv_events;      /* a file for the prefix cache's KV events in vLLM's schema (JSON lines, one batch
                                   a step; prefix_cache/kv_events.h), or NULL */
    bool check_every_step;      /* run every invariant walker after each step (tests; slow) */
    kvp_step_fn on_step;        /* NULL: none */
    void *on_step_ctx;
} kvp_engine_config;

/* Defaults: paged (buddy arena for the Orca baselines), block 16, fcfs, recompute, no cache, lru, 256 seqs,
 * 8192 tokens, max_model_len 4096, chunked prefill on, watermark 0, stop at EOS, speculation off (n-gram
 * lengths 5), kv_slots and host_slots 0 (must be set). */
void kvp_engine_config_default(kvp_engine_config *cfg);

/* Result of one step. */
typedef struct kvp_step_info {
    double time_s;          /* engine time at the end of the step */
    double step_s;          /* its duration (0 when the engine only jumped to an arrival or was idle) */
    int32_t num_scheduled;  /* sequences in the batch */
    int32_t num_tokens;     /* tokens computed */
    int32_t num_preempted;  /* preemptions during scheduling */
    int32_t num_finished;   /* requests */
    bool idle;              /* nothing left: every request added so far finished or was rejected */
} kvp_step_info;

typedef struct {
    int64_t requests;       /* added */
    int64_t finished;
    int64_t rejected;       /* never runnable (too long for max_model_len or the KV memory) */
    int64_t clamped;        /* output_len clamped to fit max_model_len (or raised to 1) */
    int64_t aborted;
    int64_t steps;
    double sim_duration_s;  /* engine time at the last finish (time 0 = workload start) */
    int64_t prompt_tokens, output_tokens; /* of finished requests (every sample's tokens) */
    int64_t computed_tokens; /* every token the executor computed (recomputation and drafts included) */
    int64_t attended_positions; /* over those, the key positions each attends (its position + 1), summed */
    double throughput_tok_s; /* output tokens / sim_duration_s */
    double total_tok_s;      /* (prompt + output) tokens / sim_duration_s */
    double req_per_s;
    double ttft_p50_s, ttft_p99_s, ttft_mean_s;
    double tpot_p50_s, tpot_p99_s, tpot_mean_s; /* over requests with >= 2 output tokens */
    double e2e_p50_s, e2e_p99_s;
    double norm_latency_s;   /* the PagedAttention paper's normalized latency: mean over finished requests of
                                end-to-end latency / output tokens (s/token) */
    double mean_running;     /* time-averaged running sequences (over sim_duration_s) */
    double mean_batch_tokens;/* tokens per step */
    int64_t max_running;
    int64_t preemptions, swap_outs, swap_ins, recomputes;
    double prefix_hit_rate;  /* prompt tokens served by the prefix cache / prompt tokens, first admissions */
    int64_t prefix_hit_tokens;
    int64_t admitted_prompt_tokens; /* prompt tokens of first admissions */
    int64_t readmit_hit_tokens; /* tokens found cached when sequences preempted by recompute came back */
    double prefix_host_hit_rate; /* prompt tokens loaded from the host tier / prompt tokens, first admissions */
    int64_t host_hit_tokens;    /* those tokens */
    int64_t host_loaded_blocks, host_stored_blocks; /* host-tier moves, readmissions included */
    int64_t evicted_blocks;
    int64_t cow_copies;         /* copy-on-write block copies */
    /* Why prompt tokens missed the prefix cache (prefix_cache/ledger.h; with a cache): at first admissions
     * prefix hits + host hits + every class but preempted = admitted_prompt_tokens; preempted: what readmissions
     * computed again. And the cache's health in engine seconds. */
    int64_t miss_tokens[KVP_MISS_CLASSES];
    kvp_hist block_lifetime, block_idle_before_evict, block_reuse_gap;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens; /* steps that proposed, proposed, kept */
    /* Time-averaged shares of the KV memory (sum to 1): */
    double kv_token_states, kv_reserved, kv_internal_frag, kv_external_frag, kv_cached, kv_free;
    double kv_shared_savings; /* share of capacity that sharing saved (outside the sum) */
    double kv_util_in_use;    /* token_states / (capacity - free - cached): time-averaged ratio of sums */
    /* Per step, before the forward pass (the PagedAttention paper's Fig. 15 counts): */
    int64_t peak_used_blocks, peak_token_states, peak_logical_tokens, peak_shared_savings;
    double step_kv_utilization;  /* mean over steps of token_states / slots of blocks held by sequences */
    double step_shared_savings;  /* sum over steps of shared_savings / sum of logical_tokens */
    int64_t kv_capacity_slots;
    int32_t num_blocks, free_blocks; /* paged: the pool now; free: neither held nor cached */
    int64_t leaked_blocks;    /* blocks (or slots) not back in the pool at the end: must be 0 */
} kvp_engine_metrics;

kvp_status kvp_engine_create(const kvp_engine_config *cfg, kvp_executor *ex, kvp_engine **out);

/* Host blocks an executor needs for cfg: the swap space's (with swap preemption), then the host tier's. */
int64_t kvp_engine_host_blocks(const kvp_engine_config *cfg);
void kvp_engine_destroy(kvp_engine *e); /* NULL: no-op */

/* Adds a request (borrowed: r and everything it points to must outlive the engine). Requests come in
 * non-decreasing arrival order (KVP_EINVAL otherwise; with wall_clock the arrival is now, whatever r says);
 * ids must be unique (not checked). KVP_EINVAL for bad output params (naming them), KVP_ENOMEM. Its index
 * (order of addition, from 0) into *index (may be NULL). A request that can never run is added as rejected:
 * kvp_engine_fits tells beforehand. */
kvp_status kvp_engine_add_request(kvp_engine *e, const kvp_request *r, int64_t *index);
/* Whether a request of prompt_len + output_len tokens (group: samples or beams) can ever run: KVP_OK, or
 * KVP_ENOBLOCKS / KVP_EINVAL naming why (too long, too many blocks, more samples than max_num_seqs). */
kvp_status kvp_engine_fits(const kvp_engine *e, int32_t prompt_len, int32_t output_len, int32_t group, bool beams);

/* One step (see the top of this file); info may be NULL. */
kvp_status kvp_engine_step(kvp_engine *e, kvp_step_info *info);
/* Nonzero while an added request is not finished or rejected. */
int kvp_engine_pending(const kvp_engine *e);

/* Progress callback for kvp_engine_run: done and total requests, engine time. */
typedef void (*kvp_progress_fn)(void *ctx, int64_t done, int64_t total, double sim_time_s);

/* Adds reqs[0..n) (sorted by arrival internally when they are not; they must outlive the engine; `after`
 * links index into reqs), steps until all finished, then checks that every block / slot is back in the
 * pool (prefix cache emptied first): KVP_ESTATE naming the leak otherwise. progress may be NULL; it is called
 * every 4096 steps. */
kvp_status kvp_engine_run(kvp_engine *e, const kvp_request *reqs, int64_t n, kvp_progress_fn progress, void *pctx);

/* Metrics so far (percentiles over finished requests still held). */
kvp_status kvp_engine_metrics_get(const kvp_engine *e, kvp_engine_metrics *out);

/* Memory accounting right now, in slots (accounting.h). */
void kvp_engine_account(const kvp_engine *e, kvp_kv_accounting *out);

/* Invariant walker: block manager / arena, prefix cache and host tier walkers; every sequence in exactly one
 * state; running sequences hold exactly their computed tokens; the accounting identity; queue orders; seats.
 * KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_engine_check(const kvp_engine *e);

/* Counts for tests and reports. */
int32_t kvp_engine_num_running(const kvp_engine *e); /* sequences */
int64_t kvp_engine_steps(const kvp_engine *e);       /* steps that ran a batch so far */
int32_t kvp_engine_num_waiting(const kvp_engine *e); /* sequences */
int32_t kvp_engine_num_swapped(const kvp_engine *e);
double kvp_engine_now(const kvp_engine *e);
/* Counters that cost O(1) to read (a server's every step; kvp_engine_metrics_get sorts latencies). */
typedef struct {
    int64_t requests, finished, rejected, aborted;
    int64_t waiting_requests;      /* added, not admitted yet (nor aborted, nor rejected) */
    int64_t running_seqs, waiting_seqs, swapped_seqs, readmit_seqs; /* readmit: waiting after a preemption */
    int64_t running_requests;      /* requests with a running sequence */
    int64_t request_records, seq_records; /* records held now: requests not released, and their sequences */
    int64_t steps, computed_tokens, prefix_hit_tokens, admitted_prompt_tokens, preemptions;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int64_t host_hit_tokens, host_loaded_blocks, host_stored_blocks;
    int64_t evicted_blocks;        /* by the prefix cache under pressure (not resets or the end-of-run flush) */
    int32_t num_blocks, free_blocks;
} kvp_engine_counts;
void kvp_engine_counts_get(const kvp_engine *e, kvp_engine_counts *out);
/* The prefix cache's miss ledger so far (miss classes, block lifetimes; prefix_cache/ledger.h), O(1): a server's
 * every step. KVP_ENOTFOUND, with no message, without a prefix cache. */
kvp_status kvp_engine_ledger_stats(const kvp_engine *e, kvp_ledger_stats *out);

/* Per-request results (tests, reports): request index i (order of addition). */
typedef enum { KVP_REQ_PENDING = 0, KVP_REQ_WAITING, KVP_REQ_RUNNING, KVP_REQ_SWAPPED, KVP_REQ_FINISHED, KVP_REQ_REJECTED } kvp_req_state;
typedef struct {
    int64_t id;             /* the request's id */
    double arrival_s;
    int32_t prompt_len;
    int32_t cached_tokens;  /* prompt tokens found in the prefix cache or its host tier at the first admission */
    kvp_req_state state;    /* of its first sequence while it has one, finished once all are */
    int32_t num_computed;   /* tokens in the KV cache (first sequence) */
    int32_t num_generated;  /* the most any sample generated */
    int32_t output_len;     /* after clamping */
    int32_t preemptions;    /* of all its sequences */
    int32_t n_samples;      /* samples to report: n (beam search: the best n beams) */
    bool aborted;
    double admit_s;         /* first admission (-1 before) */
    double first_token_s;   /* -1 before */
    double finish_s;        /* -1 before */
} kvp_req_result;
kvp_status kvp_engine_request(const kvp_engine *e, int64_t index, kvp_req_result *out);

/* ---- outputs (real executors; what a session reads) */

/* Why a sample ended. */
typedef enum {
    KVP_FINISH_LENGTH = 0, /* max tokens (or the model's context) reached */
    KVP_FINISH_EOS,        /* sampled EOS */
    KVP_FINISH_STOP_TOKEN, /* sampled one of the request's stop_ids */
    KVP_FINISH_STOPPED,    /* kvp_engine_stop */
    KVP_FINISH_ABORTED,    /* kvp_engine_abort */
} kvp_finish_reason;
/* "length", "eos", "stop_token", "stopped", "aborted". */
const char *kvp_finish_name(kvp_finish_reason f);

/* Log-probabilities at n places of a token list: log softmax of the model's logits (untempered) at the
 * place before, for the token there and the k most likely tokens. */
typedef struct {
    int32_t n, k;
    float *lp;        /* (n) the token's log-probability */
    int32_t *top_ids; /* (n, k) the k most likely tokens, descending (kvp_top_logprobs) */
    float *top_lps;   /* (n, k) their log-probabilities */
} kvp_logprobs;
/* *dst := an owned copy of src (KVP_ENOMEM: *dst empty). */
kvp_status kvp_logprobs_copy(const kvp_logprobs *src, kvp_logprobs *dst);
/* Frees a's arrays; a is zeroed. */
void kvp_logprobs_free(kvp_logprobs *a);

/* Sample k of request i, borrowed until the next step, stop, abort or release. Sampling: k = the sample's
 * index (0 .. n-1); beam search: k-th best of the finished beams (only once the request finished). */
typedef struct {
    const int32_t *tokens; /* [n_tokens] generated ids (EOS and stop ids excluded) */
    int32_t n_tokens;
    double logprob;        /* cumulative log-probability (0 with skip_logprob, but for a beam search) */
    kvp_finish_reason finish;
    int32_t stop_token;    /* the EOS or stop id that ended it, else -1 */
    const kvp_logprobs *logprobs; /* with the request's logprobs (place j: tokens[j]), else NULL */
    bool done;
} kvp_sample_view;
/* KVP_ENOTFOUND, with no message, for an unknown or released request, a sample not forked yet, or a beam
 * search not finished. */
kvp_status kvp_engine_sample(const kvp_engine *e, int64_t i, int32_t k, kvp_sample_view *out);
/* The prompt log-probabilities recorded so far (complete when n is the prompt's length; place 0 has lp NaN
 * and ids -1); borrowed until the next step or release. KVP_ENOTFOUND without prompt_logprobs. */
kvp_status kvp_engine_prompt_logprobs(const kvp_engine *e, int64_t i, const kvp_logprobs **lp);

/* The oldest finished request not yet taken, into *i (each is taken once), in finishing order.
 * KVP_ENOTFOUND, with no message, when there is none. Needs keep_outputs. */
kvp_status kvp_engine_take_finished(kvp_engine *e, int64_t *i);
/* Forgets finished request i (its samples, logprobs, records): bounded memory for a server. */
void kvp_engine_release(kvp_engine *e, int64_t i);

/* Ends sample k of sampling request i now, keeping its first n_keep generated tokens (INT32_MAX: all; a cut
 * reaches only tokens of the last step: a stop string found inside what one speculative step added): it
 * finishes with KVP_FINISH_STOPPED and frees its blocks. A sample that finished in the last step is cut as
 * well. KVP_ENOTFOUND, with no message, when that sample is not running (unknown, finished, not forked yet,
 * a beam search). */
kvp_status kvp_engine_stop(kvp_engine *e, int64_t i, int32_t k, int32_t n_keep);
/* Ends request i now, whatever its stage: running samples keep what they have and finish with
 * KVP_FINISH_ABORTED; one not admitted yet finishes with no sample. KVP_ENOTFOUND (no message) when i is
 * unknown or finished. */
kvp_status kvp_engine_abort(kvp_engine *e, int64_t i);
/* Empties the prefix cache and its host tier (vLLM's reset_prefix_cache): blocks a sequence holds stay its
 * own. *evicted (may be NULL): device blocks dropped. */
kvp_status kvp_engine_reset_prefix_cache(kvp_engine *e, int64_t *evicted);

/* The n-gram lookup of speculation (spec.c): for the longest n in nmin .. nmax such that the last n tokens of
 * t[0, len) occurred before (ending before its last token; overlaps allowed), the tokens that followed the
 * latest such occurrence with max_out tokens after it, else the earliest; at most max_out of them into out.
 * Returns how many (0: no occurrence). */
int32_t kvp_ngram_propose(const int32_t *t, int32_t len, int32_t nmin, int32_t nmax, int32_t max_out, int32_t *out);
/* cfg from vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": K,
 * "prompt_lookup_max": N, "prompt_lookup_min": M, "disable_by_batch_size": B} (N and M default to each
 * other, both to 5). KVP_EPARSE for malformed JSON; KVP_EINVAL naming the key for an unknown key, another
 * method or a value out of range; cfg unchanged on error. */
kvp_status kvp_spec_parse(const char *json, kvp_spec_config *cfg);

#endif
