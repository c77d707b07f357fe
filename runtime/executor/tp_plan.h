/* runtime/executor/tp_plan.h — one scheduler for every rank of a tensor-parallel run: rank 0 runs the engine
 * and its executor broadcasts each step's plan (sequences, token ids, positions, slot mapping, page table,
 * block moves) to the other ranks, which execute it on their share of the heads. Every rank's KV pool holds
 * rank 0's block ids, so no rank decides differently. Messages: INIT (the KV cache shape), STEP (one
 * kvp_exec_batch), QUIT (rank 0's step count, which each follower checks). The forward pass's all-reduces use
 * the model's communicator; logits stay on each rank, rank 0 samples. Errors: the communicator's, KVP_EPARSE
 * for a malformed plan, the executor's. */
#ifndef KVP_RUNTIME_EXECUTOR_TP_PLAN_H
#define KVP_RUNTIME_EXECUTOR_TP_PLAN_H

#include <stdint.h>

#include "common/status.h"
#include "parallel/comm.h"
#include "runtime/engine/executor.h"

/* The leader's KV cache shape, which a follower's executor holds, and the step limits its buffers were sized
 * for (the cuda executor pads decode steps to buckets that depend on them, and every rank must pad alike so
 * that its collectives have the leader's sizes; 0: not given, the cpu executor's). */
typedef struct {
    int32_t num_blocks, block_size, num_host_blocks;
    int32_t kv_dtype; /* a kvp_dtype */
    int32_t max_tokens, max_seqs;
} kvp_tp_shape;

/* Rank 0's executor over inner (owned from now, even on failure): INIT now, STEP before each of inner's
 * steps, QUIT when destroyed. comm is borrowed and must outlive it. */
kvp_status kvp_tp_leader_create(kvp_comm *comm, const kvp_tp_shape *shape, kvp_executor inner, kvp_executor *out);

/* Ranks > 0: on INIT make(ctx, shape, &ex), every STEP on ex until QUIT, then destroys ex. *steps (may be
 * NULL): plans run. */
kvp_status kvp_tp_follow(kvp_comm *comm, kvp_status (*make)(void *ctx, const kvp_tp_shape *shape, kvp_executor *ex),
                         void *ctx, int64_t *steps);

#endif
