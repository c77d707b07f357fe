/* runtime/executor/tp_plan.h — one scheduler for every rank of a tensor-parallel run: rank 0 runs the engine,
 * and its executor broadcasts each step's plan (the batch: sequences, token ids, positions, slot mapping, CSR
 * page table, copy-on-write copies, swap and host-tier moves) to the other ranks, which only execute it on
 * their share of the heads. Every rank's KV pool holds the same block ids (rank 0's block manager is the only
 * one), so no rank can decide differently from rank 0.
 *
 *   rank 0:  kvp_tp_leader_create(comm, cpu_executor, &ex)  -> the engine steps on ex -> kvp_executor_destroy
 *   others:  kvp_tp_follow(comm, make_executor, ctx, &steps)  (returns when rank 0's executor is destroyed)
 *
 * Messages (kvp_comm_broadcast from rank 0; the follower waits for each with kvp_comm_broadcast_idle):
 *   INIT  the KV cache the followers make: blocks, block size, host blocks, element type
 *   STEP  one kvp_exec_batch, flattened into one buffer
 *   QUIT  the number of steps rank 0 ran (each follower checks it ran as many)
 * The forward pass's all-reduces go through the model's own communicator, inside each rank's executor step,
 * in the same order on every rank. Logits stay on each rank; rank 0's engine samples.
 * Errors: the communicator's (KVP_EMPI, KVP_ENCCL, ...), KVP_EPARSE for a malformed plan, the executor's own.
 */
#ifndef KVP_RUNTIME_EXECUTOR_TP_PLAN_H
#define KVP_RUNTIME_EXECUTOR_TP_PLAN_H

#include <stdint.h>

#include "common/status.h"
#include "parallel/comm.h"
#include "runtime/engine/executor.h"

/* What a follower's executor holds: the leader's KV cache shape. */
typedef struct {
    int32_t num_blocks, block_size, num_host_blocks;
    int32_t kv_dtype; /* a kvp_dtype */
} kvp_tp_shape;

/* Rank 0's executor over inner (owned from now on, even on failure): sends INIT with shape at once, STEP before
 * each of inner's steps, QUIT when destroyed. comm is borrowed (it must outlive the executor). */
kvp_status kvp_tp_leader_create(kvp_comm *comm, const kvp_tp_shape *shape, kvp_executor inner, kvp_executor *out);

/* Another rank: waits for INIT, makes its executor with make(ctx, shape, &ex), runs every STEP on it until
 * QUIT, checks the step count, destroys it. *steps (may be NULL): the plans executed. */
kvp_status kvp_tp_follow(kvp_comm *comm, kvp_status (*make)(void *ctx, const kvp_tp_shape *shape, kvp_executor *ex),
                         void *ctx, int64_t *steps);

#endif
