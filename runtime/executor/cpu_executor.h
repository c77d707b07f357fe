/* runtime/executor/cpu_executor.h — the `cpu` executor of the engine (runtime/engine/engine.h): each step runs the batch's
 * block moves (swap out / swap in / copy-on-write) on the model's KV pools, one batched forward pass of the
 * Llama-family model (runtime/model/model.h) over the engine's block tables, and samples a token for every
 * sequence that asks for one. Step time is measured wall time (rank 0's, broadcast, for a model loaded with
 * a communicator of several ranks: every rank's engine then keeps the same clock and decides alike).
 *
 * Sampling: greedy, or the given sampler with a generator seeded from (seed + position, stream = req_id),
 * so a request's tokens do not depend on the batch or on recomputation.
 * Tokens: the engine must provide every new token id (kvp_exec_seq.tokens, prompt and generated tokens
 * alike, recompute chunks included): a request without token ids is KVP_EUNSUPPORTED.
 *
 * Every sampled token is also logged per request (kvp_cpu_executor_tokens) so callers can read the text
 * the engine produced. Ownership: the executor borrows the model (it must outlive the executor) and owns
 * its KV cache (device pools and host pools for swap); kvp_executor_destroy releases them.
 */
#ifndef KVP_RUNTIME_CPU_EXECUTOR_H
#define KVP_RUNTIME_CPU_EXECUTOR_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/executor.h"
#include "runtime/model/model.h"
#include "runtime/engine/sampler.h"

/* num_blocks / block_size must match the engine's paged configuration (kv_slots / block_size blocks);
 * num_host_blocks: host pools for swap (0: none); kv_dtype: element type of both (kvp_kv_cache_create).
 * sampler NULL means greedy. KVP_EINVAL, KVP_ENOMEM. */
kvp_status kvp_cpu_executor_create(kvp_model *m, int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                   kvp_dtype kv_dtype, const kvp_sampler_params *sampler, kvp_executor *out);

/* Tokens sampled so far for request req_id (borrowed; valid until the next step or destroy); n = 0 when
 * none. ex must come from kvp_cpu_executor_create. */
void kvp_cpu_executor_tokens(const kvp_executor *ex, int64_t req_id, const int32_t **tokens, int32_t *n);

#endif
