/* runtime/executor/sim_executor.h — the `sim` executor: no weights; a step takes the roofline cost model's
 * time (cost_model.h) plus its moves; sampled tokens are deterministic fake ids.
 *
 * Swaps and host-tier loads cross PCIe (blocks x block_size x kv_bytes_per_token_per_rank / pcie_bw) and are
 * added to the step; copy-on-write copies cost twice those bytes over mem_bw. Host-tier stores run in the
 * background across steps, as vLLM's and SGLang's offloading stream does, never delaying a step: optimistic,
 * since a real runtime keeps a block until its store is done (store_backlog_max_s shows how far they fell
 * behind). Write-back stores (offload.sync_stores) copy blocks just evicted, which the step may reuse: they
 * are added to it, before its loads, as SGLang's write_back waits. */
#ifndef KVP_RUNTIME_SIM_EXECUTOR_H
#define KVP_RUNTIME_SIM_EXECUTOR_H

#include "runtime/executor/cost_model.h"
#include "runtime/engine/executor.h"

/* PCIe Gen4 x16, one direction, achievable. */
#define KVP_SIM_DEFAULT_PCIE_BW 25e9

/* Copies *cm; pcie_bw <= 0: the default. KVP_EINVAL (kvp_cost_model_validate), KVP_ENOMEM. */
kvp_status kvp_sim_executor_create(const kvp_cost_model *cm, double pcie_bw, kvp_executor *out);

/* Seconds, summed over the executor's steps. */
typedef struct {
    int64_t steps;
    double total_s;         /* every step's time, all terms */
    double compute_bound_s; /* time of steps where compute dominated */
    double memory_bound_s;
    double comm_s, overhead_s, swap_s;
    double store_backlog_max_s; /* the most store time queued at the end of a step */
    double sync_store_s;        /* step time spent on write-back stores */
} kvp_sim_stats;
void kvp_sim_executor_stats(const kvp_executor *ex, kvp_sim_stats *out);

#endif
