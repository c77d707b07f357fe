/* runtime/executor/cpu_executor.h — the `cpu` executor of the engine (runtime/engine/executor.h): each step
 * runs the batch's block moves (host-tier stores, swap out, swap in, host-tier loads, copy-on-write) on the
 * model's KV pools, then one batched forward pass of the Llama-family model (runtime/model/model.h) over the
 * engine's page table, and returns the logits rows; the engine samples. Step time is measured wall time
 * (rank 0's, broadcast, for a model loaded with a communicator of several ranks: every rank's engine then
 * keeps the same clock and decides alike). The sampling threads of the engine are the model's workers.
 *
 * Tokens: every new token id must be given (prompt and generated alike): a request without token ids is
 * KVP_EUNSUPPORTED. Ownership: the executor borrows the model (it must outlive the executor) and owns its KV
 * cache (device pools, and host pools for swap and the host tier); kvp_executor_destroy releases them.
 */
#ifndef KVP_RUNTIME_EXECUTOR_CPU_EXECUTOR_H
#define KVP_RUNTIME_EXECUTOR_CPU_EXECUTOR_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/executor/tp_plan.h"

/* num_blocks / block_size must match the engine's paged configuration (kv_slots / block_size blocks);
 * num_host_blocks: host pools for swap and the host tier (kvp_engine_host_blocks; 0: none); kv_dtype:
 * element type of both (kvp_kv_cache_create). KVP_EINVAL, KVP_ENOMEM (the pools are checked against the
 * machine's memory first). */
kvp_status kvp_cpu_executor_create(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                   kvp_dtype kv_dtype, kvp_executor *out);

/* A session (runtime/engine/session.h) on a cpu executor of m: cfg's max_model_len, EOS ids and vocabulary
 * become the model's; the KV cache has cfg->num_blocks blocks of cfg->kv_dtype. Under tensor parallelism (m
 * loaded with a communicator of several ranks) this is rank 0's: its executor broadcasts every step's plan
 * (runtime/executor/tp_plan.h), and every other rank runs kvp_cpu_follow meanwhile. The errors of both. */
kvp_status kvp_cpu_session_create(kvp_model *m, const kvp_session_config *cfg, kvp_session **out);

/* A cpu executor of m for a tensor-parallel engine: rank 0's (inner wrapped to broadcast each step's plan)
 * when m's communicator has several ranks, else the plain executor. */
kvp_status kvp_cpu_executor_create_tp(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                      kvp_dtype kv_dtype, kvp_executor *out);

/* Every rank but 0 of a tensor-parallel run: executes rank 0's plans on its own cpu executor of m (a KV cache
 * of the shape rank 0 announces) until rank 0's executor is destroyed. *steps (may be NULL): plans run. */
kvp_status kvp_cpu_follow(kvp_model *m, int64_t *steps);

/* kvp_session_run on a fresh cpu session: cfg->num_blocks 0 means enough for every request at once
 * (kvp_session_blocks_for); stats->kv_pool_bytes is the cache's. */
kvp_status kvp_cpu_generate(kvp_model *m, const kvp_session_config *cfg, const kvp_session_request *reqs, int32_t n,
                            kvp_session_result *results, kvp_run_stats *stats,
                            void (*on_step)(void *ctx, kvp_session *s), void *ctx);

/* The KV blocks that `bytes` of m's KV hold (element type dt, blocks of bs tokens; this rank's share under
 * tensor parallelism) into *blocks: --kv-mem's cache, --kv-offloading-size's host tier. KVP_EINVAL naming
 * `opt` when they hold no block or more than INT32_MAX / 2 (*blocks unchanged then). */
kvp_status kvp_kv_blocks_in(const kvp_model *m, kvp_dtype dt, int32_t bs, int64_t bytes, const char *opt, int32_t *blocks);

#endif
