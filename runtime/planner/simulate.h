/* runtime/planner/simulate.h — one serving simulation: model config + GPU profile -> cost model and KV capacity,
 * then a workload through the engine (runtime/engine/engine.h) on the `sim` executor. Shared by
 * `kvpage simulate` (runtime/cli/simulate_cmd.c) and `kvpage bench memory` (bench/bench_memory.c).
 *
 * KV capacity (per tensor-parallel rank) comes from the memory planner (runtime/planner/planner.h), so that
 * `kvpage plan` and `kvpage simulate` agree:
 *   kv_budget = gpu_mem x gpu_util - weights / tp - activation reserve (estimate, or given)
 *   kv_slots  = kv_budget / KV bytes per token of one rank      (or kv_mem_bytes / that, when given)
 * A model whose weights do not fit is KVP_EINVAL with a message saying by how much.
 */
#ifndef KVP_RUNTIME_SIMULATE_H
#define KVP_RUNTIME_SIMULATE_H

#include <stdint.h>

#include "runtime/executor/cost_model.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/gpu_profile.h"
#include "runtime/loader/model_config.h"
#include "runtime/workload/workload.h"

typedef struct {
    int32_t tp;                /* >= 1 */
    double gpu_util;           /* (0, 1], default 0.9 */
    int32_t dtype_bytes;       /* weights and KV elements, default 2 (bf16) */
    int64_t kv_mem_bytes;      /* > 0: KV memory per rank given directly (skips the planner's budget) */
    int64_t swap_bytes;        /* host swap space per rank (used with preempt = swap); default -1: as much as
                                  the KV memory, as generate, serve and --executor cpu size it */
    int64_t offload_bytes;     /* host tier of the prefix cache per rank (engine host_cache_slots), default 0 */
    int64_t activation_bytes;  /* < 0: the planner's estimate */
} kvp_sim_hw;

void kvp_sim_hw_default(kvp_sim_hw *hw);

/* What the preparation derived (per rank). */
typedef struct {
    double usable_bytes;       /* gpu_mem x gpu_util */
    double weight_bytes;
    double activation_bytes;
    double kv_bytes;           /* KV memory */
    double kv_bytes_per_token;
    int64_t kv_slots;
    int64_t host_slots;
    int64_t host_cache_slots;
} kvp_sim_memory;

/* The max_model_len a simulation uses when none is given: the model's max_position_embeddings (4096 when
 * absent), at most 32768. */
int32_t kvp_sim_default_max_model_len(const kvp_model_config *cfg);

/* Builds the cost model and fills ecfg->kv_slots / host_slots / host_cache_slots (other ecfg fields
 * untouched). */
kvp_status kvp_sim_prepare(const kvp_model_config *cfg, const kvp_gpu_profile *gpu, const kvp_sim_hw *hw,
                           kvp_engine_config *ecfg, kvp_cost_model *cm, kvp_sim_memory *mem);

/* Why the requests of a run were rejected (the engine rejects a request that can never run:
 * kvp_engine_fits), by reason. */
typedef struct {
    int64_t n;                 /* rejected requests (kvp_engine_metrics.rejected) */
    int64_t context;           /* a prompt of max_model_len tokens or more: no room to generate */
    int64_t kv;                /* prompt + max_tokens (clamped to max_model_len) more than the KV cache holds */
    int64_t other;             /* more samples or beams than max_num_seqs, or than a step's tokens */
    int32_t max_model_len;
    int64_t longest_prompt;    /* the longest prompt among the `context` ones (tokens) */
    int64_t longest_tokens;    /* the longest prompt + max_tokens among the `kv` ones (tokens) */
    int64_t kv_tokens;         /* paged: what one sequence may hold, (KV blocks - watermark) x block size; 0 for
                                  the contiguous baselines, whose reason is in kv_reason */
    char kv_reason[160];       /* the engine's words for the first `kv` one */
    char other_reason[160];    /* and for the first `other` one */
} kvp_sim_rejections;

/* One line for a summary, e.g. "3: prompt + max_tokens exceed the KV cache (12,345 tokens > 8,192)", the
 * reasons separated by "; "; "none" when nothing was rejected. Into buf[0, cap), always terminated. */
void kvp_sim_rejections_summary(const kvp_sim_rejections *r, char *buf, size_t cap);

/* Runs w through a fresh engine on executor ex (borrowed); *m receives the metrics, per_req (NULL: not
 * wanted) w->n per-request results in arrival order (kvp_engine_request), and *rej (NULL: not wanted) why the
 * rejected ones were. progress may be NULL. The end-of-run leak check of kvp_engine_run applies (KVP_ESTATE on
 * a leak). */
kvp_status kvp_simulate_run(const kvp_engine_config *ecfg, kvp_executor *ex, const kvp_workload *w,
                            kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req,
                            kvp_sim_rejections *rej);
/* kvp_simulate_run without the rejections. */
kvp_status kvp_simulate_on(const kvp_engine_config *ecfg, kvp_executor *ex, const kvp_workload *w,
                           kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req);
/* The same on a sim executor made from cm. */
kvp_status kvp_simulate(const kvp_engine_config *ecfg, const kvp_cost_model *cm, const kvp_workload *w,
                        kvp_progress_fn progress, void *pctx, kvp_engine_metrics *m, kvp_req_result *per_req);

/* A progress bar on stderr, drawn only once a run has lasted over a second; pass &bar as pctx. */
typedef struct {
    double start_s;
    double last_draw_s;
    int drawn;
    const char *label;
} kvp_progress_bar;
void kvp_progress_bar_init(kvp_progress_bar *bar, const char *label);
void kvp_progress_bar_fn(void *bar, int64_t done, int64_t total, double sim_time_s);
void kvp_progress_bar_end(kvp_progress_bar *bar); /* ends the line when something was drawn */

#endif

/* Loads a workload for a simulation:
 *   trace != NULL: an Azure CSV (*.csv) or a Mooncake JSONL (anything else) file;
 *   else spec: "sharegpt[:n=N,seed=S]" / "alpaca[:n=N,seed=S]" (workload_synth.h; n defaults to
 *   num_requests or 1000, arrivals at `rate`, lengths redrawn to fit max_total when > 0), or any
 *   generator spec of runtime/workload/workload.h ("system:...", "chat:...", ...).
 * Then cut to its first num_requests (> 0); then, when rate > 0 and the workload is not a sharegpt/alpaca
 * one (those are generated at that rate), rescaled to `rate` req/s; then cut to the requests arriving in
 * the first duration_s seconds (> 0) of the rescaled times. rate may be INFINITY
 * (everything at t = 0); rate <= 0 means "keep the workload's own times" (KVP_EINVAL for a synthetic
 * sharegpt/alpaca spec, which needs a rate). Last, each request fans out into n parallel samples
 * (kvp_workload_fork; n = 1: none), so num_requests and rate count requests, not samples. */
kvp_status kvp_sim_load_workload(const char *trace, const char *spec, int64_t num_requests, double duration_s,
                                 double rate, int32_t max_total, int32_t n, kvp_workload **out);
