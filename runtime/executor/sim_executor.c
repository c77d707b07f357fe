/* runtime/executor/sim_executor.c — cost-model executor (see sim_executor.h). */
#include "runtime/executor/sim_executor.h"

#include <string.h>

#include "common/alloc.h"

typedef struct {
    kvp_cost_model cm;
    double pcie_bw;
    double store_backlog_s; /* host-tier stores queued, in seconds of the link */
    kvp_sim_stats stats;
} sim_ctx;

static kvp_status sim_step(void *vctx, const kvp_exec_batch *b, kvp_exec_result *out)
{
    sim_ctx *c = vctx;
    kvp_step_shape shape = {.window = c->cm.window};
    for (int32_t i = 0; i < b->n; i++) {
        const kvp_exec_seq *s = &b->seqs[i];
        kvp_step_shape_add(&shape, s->context_len, s->num_new, s->sample);
    }
    kvp_step_cost cost;
    double t = kvp_cost_step_time(&c->cm, &shape, &cost);
    double block_bytes = (double)b->block_size * kvp_cost_kv_bytes_per_token_per_rank(&c->cm);
    double swap = (double)(b->ops.n_swap_out + b->ops.n_swap_in) * block_bytes / c->pcie_bw;
    double cow = 2.0 * b->ops.n_copies * block_bytes / (c->cm.mem_bw * c->cm.bw_efficiency);
    double load = (double)b->offload.n_load * block_bytes / c->pcie_bw;
    double store = (double)b->offload.n_store * block_bytes / c->pcie_bw;
    t += swap + cow + load;
    if (b->offload.sync_stores) { /* write-back: the evicted blocks may be reused by this step */
        t += store;
        c->stats.sync_store_s += store;
    } else {
        c->store_backlog_s += store; /* write-through: in the background */
    }
    c->store_backlog_s = c->store_backlog_s > t ? c->store_backlog_s - t : 0; /* drained while the step runs */
    if (c->store_backlog_s > c->stats.store_backlog_max_s) c->stats.store_backlog_max_s = c->store_backlog_s;
    c->stats.steps++;
    c->stats.total_s += t;
    if (cost.compute_s >= cost.memory_s) c->stats.compute_bound_s += cost.compute_s;
    else c->stats.memory_bound_s += cost.memory_s;
    c->stats.comm_s += cost.comm_s;
    c->stats.overhead_s += cost.overhead_s;
    c->stats.swap_s += swap;
    out->time_s = t;
    return KVP_OK;
}

static void sim_destroy(void *ctx) { kvp_free(ctx); }

kvp_status kvp_sim_executor_create(const kvp_cost_model *cm, double pcie_bw, kvp_executor *out)
{
    if (cm == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "sim executor: NULL argument");
    KVP_TRY(kvp_cost_model_validate(cm));
    sim_ctx *c = kvp_calloc(1, sizeof *c);
    if (c == NULL) return KVP_ERR(KVP_ENOMEM, "sim executor: out of memory");
    c->cm = *cm;
    c->pcie_bw = pcie_bw > 0 ? pcie_bw : KVP_SIM_DEFAULT_PCIE_BW;
    out->name = "sim";
    out->ctx = c;
    out->step = sim_step;
    out->destroy = sim_destroy;
    return KVP_OK;
}

void kvp_sim_executor_stats(const kvp_executor *ex, kvp_sim_stats *out)
{
    memset(out, 0, sizeof *out);
    if (ex && ex->ctx && ex->step == sim_step) *out = ((const sim_ctx *)ex->ctx)->stats;
}
