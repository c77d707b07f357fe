/* runtime/executor/tp_threads.h — tensor parallelism inside one process: `kvpage generate|serve --tp N`
 * without mpirun, as vLLM runs --tensor-parallel-size on one machine.
 *
 *   main thread (rank 0)                          follower threads (ranks 1 .. N-1)
 *   kvp_tp_threads_start(N, &spec, &comm0, &t) -> each: kvp_model_load_ex(spec.path, its comm), then
 *   load its shard over comm0, run the engine        kvp_cuda_follow on GPU r (spec.cuda) or kvp_cpu_follow:
 *   (its executor broadcasts every plan;             rank 0's plans until its executor is destroyed
 *    destroying it ends the followers' loops)
 *   on a failure: kvp_comm_abort(comm0)           -> their waits end (KVP_ESTATE); a follower that fails
 *                                                    aborts its own communicator, ending rank 0's next
 *                                                    collective the same way
 *   kvp_tp_threads_join(t): the first follower's failure, else KVP_OK; then kvp_comm_destroy(comm0)
 *
 * Communicators: kvp_comm_nccl_threads_create over GPUs 0 .. N-1 (spec.cuda; ncclCommInitAll), else
 * kvp_comm_threads_create (the CPU). Under the CPU emulator of CUDA (the tests) every rank's executor is on its
 * one device. Under an MPI launcher (kvp_tp_under_launcher) the commands keep one
 * process a rank instead. */
#ifndef KVP_RUNTIME_EXECUTOR_TP_THREADS_H
#define KVP_RUNTIME_EXECUTOR_TP_THREADS_H

#include <stdint.h>

#include "common/status.h"
#include "parallel/comm.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/model/model.h"

/* What every follower does to its shard, as the command does to rank 0's. */
typedef struct {
    const char *path;         /* the model (GGUF file or HF folder) */
    kvp_weight_type weights;  /* kvp_model_load_ex's */
    int32_t max_len;          /* kvp_model_set_max_len's (0: the model's context) */
    int threads;              /* kvp_model_set_threads's; 0: the default */
    kvp_matmul_kind matmul;   /* kvp_model_set_matmul's */
    int cuda;                 /* 1: kvp_cuda_follow with cu, rank r on GPU r; 0: kvp_cpu_follow */
    kvp_cuda_options cu;
} kvp_tp_threads_spec;

typedef struct kvp_tp_threads kvp_tp_threads;

/* n ranks (2 .. KVP_COMM_MAX_THREADS; with spec->cuda at most the GPUs there are, KVP_EINVAL naming both):
 * *comm0 is rank 0's communicator (the caller's to destroy after kvp_tp_threads_join), *out the followers,
 * already started. On failure nothing is left running. */
kvp_status kvp_tp_threads_start(int n, const kvp_tp_threads_spec *spec, kvp_comm **comm0, kvp_tp_threads **out);

/* Waits for every follower and frees t (NULL: KVP_OK): KVP_OK, or the first follower's failure with its
 * message ("rank R: ..."). Call once rank 0's executor is gone or comm0 was aborted. */
kvp_status kvp_tp_threads_join(kvp_tp_threads *t);

/* 1 when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set): --tp then
 * means one process a rank. */
int kvp_tp_under_launcher(void);

/* The communicator of a command's --tp n, what generate and serve share: n 1, single; under a launcher the MPI
 * world (spec->cuda: nccl over it, each rank its node's GPU of its index), *followers NULL; else rank 0's of
 * kvp_tp_threads_start, its followers in *followers. With spec->cuda and n > 1 a missing device is said first,
 * before any rank waits for another. */
kvp_status kvp_tp_comm_create(int n, const kvp_tp_threads_spec *spec, kvp_comm **comm, kvp_tp_threads **followers);

#endif
