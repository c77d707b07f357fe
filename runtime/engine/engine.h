/* runtime/engine/engine.h — the serving engine: requests, the scheduler (continuous batching, chunked prefill,
 * FCFS / longest-prefix-match / priority, preemption by recompute or swap), the KV memory (paged block
 * manager with an optional prefix cache, or a contiguous Orca baseline) and an executor, advanced one step
 * at a time in simulated (or measured) time.
 *
 *   arrivals ---> waiting ---admit---> running ---finish---> done (blocks freed at once)
 *                  ^   ^                 |  |
 *                  |   +---recompute-----+  |   preemption when blocks run out: the lowest-ranked running
 *                  |                        |   sequence gives up its blocks (recompute: back to waiting,
 *                  +--- swapped <--swap-----+   prefill again later; swap: its blocks move to host memory)
 *                          |
 *                          +---swap in---> running     (before any new admission)
 *
 * One step (kvp_engine_step):
 *   1. requests whose arrival time has come join `waiting` (in policy order); one that waits for another's
 *      answer (kvp_request.after, through kvp_engine_run) joins at max(its time, that one's finish +
 *      think_s), which is then its arrival for ranks and TTFT; a parallel sample (after_prompt) joins
 *      once that request's prompt has been computed (the step it ended), keeping its own arrival, and with a
 *      prefix cache finds the prompt's full blocks there (computing only the partial last block);
 *   2. token budget B = max_batched_tokens. Running sequences, in rank order, each get
 *      min(tokens still to compute, what is left of B): 1 for a decode, a chunk of the prompt for a
 *      sequence in chunked prefill. Their KV slots are allocated now; when blocks run out, cached prefix
 *      blocks are evicted first, then the lowest-ranked running sequence is preempted (possibly the one
 *      asking);
 *   3. when nothing was preempted in this step: swapped sequences come back first (rank order), then
 *      waiting requests are admitted in policy order while B, max_num_seqs and free memory allow. The first
 *      one that cannot be admitted stops admission (head-of-line: no request is overtaken, so none
 *      starves);
 *   4. the executor runs the batch; time advances by its step time; every sequence that reached the end
 *      of its known tokens samples one; a request that has its output_len tokens finishes and frees its
 *      memory at once; the accounting of the step (memory shares x step time) is accumulated.
 * When nothing runs and nothing waits, time jumps to the next arrival (no busy stepping).
 *
 * Ranking: fcfs = (arrival, id); priority = (higher priority first, then arrival, id); lpm = waiting requests
 * ordered by the longest cached prefix among the first KVP_LPM_WINDOW of them (SGLang's cache-aware policy;
 * the blocks in the prefix cache plus those after them in the host tier, as SGLang counts host hits), ties
 * by arrival; running/preemption order is arrival for lpm.
 *
 * Allocation: paged (block manager + prefix cache; any block size) or contiguous Orca-Max / Orca-Pow2 /
 * Orca-Oracle (one reservation per request, at admission, of a length fixed by the policy; placed by a buddy
 * allocator, as in the paper's emulation of Orca, or first fit, in an arena of the same number of slots;
 * never preempted because the reservation covers the whole request;
 * prefix caching needs paged allocation).
 *
 * Prefix cache: an admission matches the prompt (a readmission after recompute: prompt and generated
 * tokens); the prompt's full blocks are cached when its prefill completes. A sequence preempted by
 * recompute caches the full blocks of all it computed (it finds them again when readmitted), and so does
 * a finishing request whose answer the workload gives (kvp_request.output_tokens: those tokens are
 * generated instead of the executor's samples), so the next turn of a chat, whose prompt contains that
 * answer, finds it cached, as in vLLM v1 and SGLang.
 *
 * Host tier (host_cache_slots > 0, with a prefix cache): a second, LRU cache of full blocks in host memory
 * (prefix_cache/host_cache.h), filled write-through: every block the prefix cache takes in is also stored
 * there (a device -> host move in the next step's batch, kvp_exec_offload.store), unless held already; or,
 * with host_write_policy write_back, each block the prefix cache evicts (offload.sync_stores: the move must
 * end before the block is reused; a store that would take a tier slot a load of the same step still has to
 * read is dropped). An
 * admission that matches n blocks in the prefix cache looks for the blocks after them there; those it finds
 * are loaded (host -> device moves into the sequence's fresh blocks, in the admission's step) and count as
 * computed, not as prompt to compute. Host-tier ids in the executor's host pool follow the swap space's:
 * kvp_engine_host_blocks gives how many host blocks the executor needs.
 *
 * Requests: output_len is clamped to >= 1 (a request always yields a token) and so that prompt + output <=
 * max_model_len; a request whose prompt alone reaches max_model_len, or whose whole length can never fit
 * in the KV memory, is rejected (counted, never run).
 *
 * Ownership: the engine borrows the executor and the requests (their token arrays must outlive it); it owns
 * its block manager / arena, prefix cache and per-request state. Not thread-safe.
 * Errors: KVP_EINVAL for a bad configuration (naming the field), KVP_ENOMEM; an executor failure is returned
 * as is. A failed step leaves the simulation in an undefined but destroyable state.
 */
#ifndef KVP_RUNTIME_ENGINE_H
#define KVP_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "blockmgr/accounting.h"
#include "blockmgr/contiguous.h"
#include "common/status.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/prefix_cache.h"
#include "runtime/engine/executor.h"
#include "runtime/workload/workload.h"

typedef enum { KVP_ALLOC_PAGED = 0, KVP_ALLOC_ORCA_MAX, KVP_ALLOC_ORCA_POW2, KVP_ALLOC_ORCA_ORACLE } kvp_alloc_kind;
typedef enum { KVP_SCHED_FCFS = 0, KVP_SCHED_LPM, KVP_SCHED_PRIORITY } kvp_sched_policy;
typedef enum { KVP_PREEMPT_RECOMPUTE = 0, KVP_PREEMPT_SWAP } kvp_preempt_mode;

typedef struct kvp_engine kvp_engine;
struct kvp_step_info;
/* Called by kvp_engine_run after every step that ran a batch; an error stops the run with it. */
typedef kvp_status (*kvp_step_fn)(void *ctx, const kvp_engine *e, const struct kvp_step_info *info);

/* "paged" | "orca-max" | "orca-pow2" | "orca-oracle"; "fcfs" | "lpm" | "priority"; "recompute" | "swap".
 * KVP_EINVAL naming the value and the choices. _name: static strings. */
kvp_status kvp_alloc_kind_parse(const char *s, kvp_alloc_kind *out);
kvp_status kvp_sched_policy_parse(const char *s, kvp_sched_policy *out);
kvp_status kvp_preempt_mode_parse(const char *s, kvp_preempt_mode *out);
const char *kvp_alloc_kind_name(kvp_alloc_kind k);
const char *kvp_sched_policy_name(kvp_sched_policy p);
const char *kvp_preempt_mode_name(kvp_preempt_mode m);

enum { KVP_LPM_WINDOW = 32 };

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
    bool check_every_step;      /* run every invariant walker after each step (tests; slow) */
    kvp_step_fn on_step;        /* NULL: none */
    void *on_step_ctx;
} kvp_engine_config;

/* Defaults: paged (buddy arena for the Orca baselines), block 16, fcfs, recompute, no cache, lru, 256 seqs, 8192 tokens, max_model_len 4096,
 * chunked prefill on, watermark 0, kv_slots and host_slots 0 (must be set). */
void kvp_engine_config_default(kvp_engine_config *cfg);

/* Result of one step. */
typedef struct kvp_step_info {
    double time_s;          /* simulated time at the end of the step */
    double step_s;          /* its duration (0 when the engine only jumped to an arrival or was idle) */
    int32_t num_scheduled;  /* sequences in the batch */
    int32_t num_tokens;     /* tokens computed */
    int32_t num_preempted;  /* preemptions during scheduling */
    int32_t num_finished;
    bool idle;              /* nothing left: every request added so far finished or was rejected */
} kvp_step_info;

typedef struct {
    int64_t requests;       /* added */
    int64_t finished;
    int64_t rejected;       /* never runnable (too long for max_model_len or the KV memory) */
    int64_t clamped;        /* output_len clamped to fit max_model_len (or raised to 1) */
    int64_t steps;
    double sim_duration_s;  /* simulated time at the last finish (time 0 = workload start) */
    int64_t prompt_tokens, output_tokens; /* of finished requests */
    int64_t computed_tokens; /* every token the executor computed (recomputation included) */
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
    int64_t readmit_hit_tokens; /* tokens found cached when requests preempted by recompute came back */
    double prefix_host_hit_rate; /* prompt tokens loaded from the host tier / prompt tokens, first admissions */
    int64_t host_hit_tokens;    /* those tokens */
    int64_t host_loaded_blocks, host_stored_blocks; /* host-tier moves, readmissions included */
    int64_t evicted_blocks;
    /* Time-averaged shares of the KV memory (sum to 1): */
    double kv_token_states, kv_reserved, kv_internal_frag, kv_external_frag, kv_cached, kv_free;
    double kv_shared_savings; /* share of capacity that sharing saved (outside the sum) */
    double kv_util_in_use;    /* token_states / (capacity - free - cached): time-averaged ratio of sums */
    int64_t kv_capacity_slots;
    int64_t leaked_blocks;    /* blocks (or slots) not back in the pool at the end: must be 0 */
} kvp_engine_metrics;

kvp_status kvp_engine_create(const kvp_engine_config *cfg, kvp_executor *ex, kvp_engine **out);

/* Host blocks an executor needs for cfg: the swap space's (with swap preemption), then the host tier's. */
int64_t kvp_engine_host_blocks(const kvp_engine_config *cfg);
void kvp_engine_destroy(kvp_engine *e); /* NULL: no-op */

/* Adds a request (borrowed: r and r->tokens must outlive the engine). Requests must be added in
 * non-decreasing arrival order (KVP_EINVAL otherwise) and ids must be unique (not checked).
 * A request arriving before the current time joins at the next step. KVP_ENOMEM. */
kvp_status kvp_engine_add_request(kvp_engine *e, const kvp_request *r);

/* One step (see the top of this file). */
kvp_status kvp_engine_step(kvp_engine *e, kvp_step_info *info);

/* Progress callback for kvp_engine_run: done and total requests, simulated time. */
typedef void (*kvp_progress_fn)(void *ctx, int64_t done, int64_t total, double sim_time_s);

/* Adds every request of w (sorted by arrival internally when it is not; w must outlive the engine), then
 * steps until all finished, then checks that every block / slot is back in the pool (prefix cache
 * emptied first): KVP_ESTATE naming the leak otherwise. progress may be NULL; it is called every 4096
 * steps. */
kvp_status kvp_engine_run(kvp_engine *e, const kvp_workload *w, kvp_progress_fn progress, void *pctx);

/* Metrics so far (percentiles over finished requests). */
kvp_status kvp_engine_metrics_get(const kvp_engine *e, kvp_engine_metrics *out);

/* Memory accounting right now, in slots (accounting.h). */
void kvp_engine_account(const kvp_engine *e, kvp_kv_accounting *out);

/* Invariant walker: block manager / arena and prefix cache walkers; every request in exactly one state;
 * running sequences hold exactly their computed tokens (block table token count / contiguous used);
 * the accounting identity; queue orders. KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_engine_check(const kvp_engine *e);

/* Counts for tests. */
int32_t kvp_engine_num_running(const kvp_engine *e);
int64_t kvp_engine_steps(const kvp_engine *e); /* steps that ran a batch so far */
int32_t kvp_engine_num_waiting(const kvp_engine *e);
int32_t kvp_engine_num_swapped(const kvp_engine *e);
double kvp_engine_now(const kvp_engine *e);

/* Per-request results (tests, reports): state and times of request index i (in order of addition). */
typedef enum { KVP_REQ_PENDING = 0, KVP_REQ_WAITING, KVP_REQ_RUNNING, KVP_REQ_SWAPPED, KVP_REQ_FINISHED, KVP_REQ_REJECTED } kvp_req_state;
typedef struct {
    int64_t id;             /* the request's id */
    double arrival_s;
    int32_t prompt_len;
    int32_t cached_tokens;  /* prompt tokens found in the prefix cache or its host tier at the first admission */
    kvp_req_state state;
    int32_t num_computed;   /* tokens in the KV cache */
    int32_t num_generated;
    int32_t output_len;     /* after clamping */
    int32_t preemptions;
    double admit_s;         /* first admission (-1 before) */
    double first_token_s;   /* -1 before */
    double finish_s;        /* -1 before */
} kvp_req_result;
kvp_status kvp_engine_request(const kvp_engine *e, int64_t index, kvp_req_result *out);

#endif
