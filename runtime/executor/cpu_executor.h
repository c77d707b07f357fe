/* runtime/executor/cpu_executor.h — the engine's `cpu` executor (engine/executor.h): each step runs the
 * batch's block moves (host-tier stores, swap out, swap in, host-tier loads, copy-on-write) on the model's
 * KV pools, then one batched forward pass (model/model.h) over the engine's page table, and returns the
 * logits rows for the engine to sample on the model's worker threads. Step time is wall time (under tensor
 * parallelism rank 0's, broadcast, so every rank keeps the same clock). Every new token id must be given
 * (else KVP_EUNSUPPORTED). The executor borrows the model, which must outlive it, and owns its KV cache.
 */
#ifndef KVP_RUNTIME_EXECUTOR_CPU_EXECUTOR_H
#define KVP_RUNTIME_EXECUTOR_CPU_EXECUTOR_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/executor/tp_plan.h"

/* num_blocks x block_size = the engine's kv_slots; num_host_blocks (kvp_engine_host_blocks; 0: none);
 * kv_dtype for both. KVP_EINVAL; KVP_ENOMEM, checked against the machine's memory first. */
kvp_status kvp_cpu_executor_create(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                   kvp_dtype kv_dtype, kvp_executor *out);

/* A session (engine/session.h), cfg's max_model_len, EOS ids and vocabulary replaced by the model's. With several ranks it is rank 0's, broadcasting each step's plan (tp_plan.h) while the
 * others run kvp_cpu_follow. */
kvp_status kvp_cpu_session_create(kvp_model *m, const kvp_session_config *cfg, kvp_session **out);

/* What every executor's session takes of its model: *c = *cfg with the model's EOS ids (copied into eos,
 * KVP_MAX_EOS_IDS entries, which must outlive the session's creation), context and vocabulary, swap_blocks < 0
 * made the cache's size under --preempt swap (else 0); *host_blocks the engine's host pool (swap and host
 * tier, kvp_engine_host_blocks). KVP_EINVAL for more host blocks than INT32_MAX / 2. */
kvp_status kvp_exec_session_config(const kvp_model *m, const kvp_session_config *cfg, int32_t *eos,
                                   kvp_session_config *c, int32_t *host_blocks);

/* With several ranks, rank 0's executor broadcasting each step's plan; else kvp_cpu_executor_create's. */
kvp_status kvp_cpu_executor_create_tp(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                      kvp_dtype kv_dtype, kvp_executor *out);

/* Ranks > 0: runs rank 0's plans on an executor of the announced shape until rank 0's is destroyed.
 * *steps (may be NULL): plans run. */
kvp_status kvp_cpu_follow(kvp_model *m, int64_t *steps);

/* kvp_session_run on a fresh session; cfg->num_blocks 0: room for every request (kvp_session_blocks_for). */
kvp_status kvp_cpu_generate(kvp_model *m, const kvp_session_config *cfg, const kvp_session_request *reqs, int32_t n,
                            kvp_session_result *results, kvp_run_stats *stats,
                            void (*on_step)(void *ctx, kvp_session *s), void *ctx);

/* How many blocks of bs tokens of dt `bytes` of this rank's KV hold (--kv-mem, --kv-offloading-size).
 * KVP_EINVAL naming `opt`, *blocks unchanged, for none or more than INT32_MAX / 2. */
kvp_status kvp_kv_blocks_in(const kvp_model *m, kvp_dtype dt, int32_t bs, int64_t bytes, const char *opt, int32_t *blocks);

#endif
