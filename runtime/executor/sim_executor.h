/* runtime/executor/sim_executor.h — the `sim` executor: no weights, the step time comes from the roofline cost
 * model (runtime/executor/cost_model.h), plus the time of swap moves over PCIe. Sampled tokens are deterministic
 * fake ids (never a real model's output).
 *
 * Swap moves: (n_swap_out + n_swap_in) x block_size x kv_bytes_per_token_per_rank / pcie_bw, added to the
 * step (no overlap with compute). Copy-on-write copies: 2 x the same bytes / mem_bw (read + write).
 * Host-tier moves of the prefix cache (kvp_exec_offload), over the same PCIe link: loads (host -> device)
 * are added to the step (the batch reads what they bring); stores (device -> host, the link's other
 * direction) run in the background across steps, as vLLM's and SGLang's offloading do on their own stream,
 * and never delay a step. That is optimistic in one way: a real runtime keeps a block from being reused
 * until its store is done, and this model does not; store_backlog_max_s says how far behind the stores
 * fell (a backlog that keeps growing means the link cannot keep up with write-through). Write-back stores
 * (offload.sync_stores) copy blocks just evicted, which this step may reuse: they are added to the step,
 * before its loads, as SGLang's write_back waits for them (sync_store_s sums them).
 */
#ifndef KVP_RUNTIME_SIM_EXECUTOR_H
#define KVP_RUNTIME_SIM_EXECUTOR_H

#include "runtime/executor/cost_model.h"
#include "runtime/engine/executor.h"

/* PCIe Gen4 x16, one direction, achievable (about 25 GB/s). */
#define KVP_SIM_DEFAULT_PCIE_BW 25e9

/* Copies *cm; pcie_bw <= 0 takes the default. KVP_EINVAL when the model fails kvp_cost_model_validate,
 * KVP_ENOMEM. The executor owns its context: release with kvp_executor_destroy. */
kvp_status kvp_sim_executor_create(const kvp_cost_model *cm, double pcie_bw, kvp_executor *out);

/* Steps and accumulated time parts (seconds) of a sim executor, for reports. */
typedef struct {
    int64_t steps;
    double compute_bound_s; /* time of steps where compute dominated */
    double memory_bound_s;
    double comm_s, overhead_s, swap_s;
    double store_backlog_max_s; /* the most store time queued at the end of a step */
    double sync_store_s;        /* step time spent on write-back stores */
} kvp_sim_stats;
void kvp_sim_executor_stats(const kvp_executor *ex, kvp_sim_stats *out);

#endif
