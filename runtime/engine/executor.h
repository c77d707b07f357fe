/* runtime/engine/executor.h — what the engine asks of a model executor, one step at a time.
 *
 * The engine (runtime/engine/engine.h) decides each step which sequences run and how many tokens each computes;
 * the executor runs that batch and says how long it took (simulated seconds for `sim`, measured for real
 * executors) and which token each sampling sequence produced. Executors: `sim` (runtime/executor/sim_executor.h,
 * the roofline cost model, no weights), later `cpu` and `cuda`.
 *
 *   kvp_exec_batch
 *     seqs[0..n)   kvp_exec_seq { req_id, context_len, num_new, sample, tokens -> [num_new] or NULL,
 *                                 block_table -> [num_blocks] or NULL, num_blocks }
 *     ops          block moves to run before the forward pass (swap out, swap in, copy-on-write)
 *     offload      the host tier of the prefix cache (prefix_cache/host_cache.h): stores (device -> host)
 *                  and loads (host -> device), host ids after the swap space's
 *     block_size
 *
 * Order of the moves: offload.store, ops.swap_out, ops.swap_in, offload.load, ops.copies, then the forward
 * pass. A store copies a block computed in an earlier step before anything of this step can overwrite it; a
 * load fills a block allocated in this step (it may be one that a swap-out just emptied).
 *
 * Token ids of the new tokens: prompt tokens for prefill chunks; for a decode the token sampled in the
 * previous step (kvp_exec_result.sampled); for a recompute chunk after preemption the prompt tail followed
 * by the tokens generated so far. NULL only when the request has no token ids. Everything in the batch is
 * borrowed for the call only.
 */
#ifndef KVP_RUNTIME_EXECUTOR_H
#define KVP_RUNTIME_EXECUTOR_H

#include <stdint.h>

#include "blockmgr/block_mgr.h"
#include "common/status.h"

typedef struct {
    int64_t req_id;
    int32_t context_len;        /* tokens of this sequence already in the KV cache */
    int32_t num_new;            /* tokens computed now (>= 1); their KV is written at context_len.. */
    int32_t sample;             /* 1: produce a token after the last new one */
    const int32_t *tokens;      /* [num_new] token ids (NULL when the request carries none) */
    const int32_t *block_table; /* [num_blocks] physical blocks (paged allocation), NULL for contiguous */
    int32_t num_blocks;
} kvp_exec_seq;

typedef struct {
    const kvp_block_copy *store; /* [n_store] device block -> host block */
    int32_t n_store;
    const kvp_block_copy *load;  /* [n_load] host block -> device block */
    int32_t n_load;
    int32_t sync_stores;         /* 1: the stores are write-backs of evicted blocks that this step may reuse:
                                    they finish before the step goes on (0: write-through, in the background) */
} kvp_exec_offload;

typedef struct {
    const kvp_exec_seq *seqs; /* [n] */
    int32_t n;
    int32_t block_size;       /* 0 for contiguous allocation */
    kvp_bm_step_ops ops;      /* zeroed when there are none */
    kvp_exec_offload offload; /* zeroed when there are none */
} kvp_exec_batch;

typedef struct {
    double time_s;    /* duration of the step in seconds (> 0) */
    int32_t *sampled; /* [n] provided by the engine: the token of each seq with sample = 1 */
} kvp_exec_result;

typedef struct {
    const char *name;
    void *ctx;        /* owned by the executor; released by destroy */
    kvp_status (*step)(void *ctx, const kvp_exec_batch *batch, kvp_exec_result *out);
    void (*destroy)(void *ctx);
} kvp_executor;

/* Releases the executor's context (NULL-safe; a zeroed executor is a no-op). */
static inline void kvp_executor_destroy(kvp_executor *ex)
{
    if (ex && ex->destroy) ex->destroy(ex->ctx);
    if (ex) ex->ctx = 0;
}

#endif
