/* parallel/comm.h — communicators for tensor parallelism: a group of `size` ranks that sum, gather and
 * broadcast buffers together (collectives: every rank calls the same sequence of them, in the same order).
 *
 *   kvp_comm *c;
 *   kvp_comm_mpi_create(2, &c);            // under `mpirun -np 2`: ranks 0 and 1 of MPI_COMM_WORLD
 *   kvp_comm_all_reduce_sum_f32(c, x, n);  // x[i] = sum over ranks of x[i], the same bits on every rank
 *   kvp_comm_destroy(c);
 *
 * Backends:
 *   single   one rank: every collective is a copy or nothing (the default of a model; no MPI needed)
 *   threads  ranks that are threads of one process, meeting at a barrier (tests, one-process runs)
 *   mpi      CPU ranks, one process each (Open MPI), over MPI_COMM_WORLD
 * The all-reduce result is identical, bit for bit, on every rank (a reduction to rank 0, then a broadcast),
 * so ranks that run the same scheduler and sampler on it take the same decisions without exchanging them.
 *
 * A communicator is used by one thread at a time (a threads rank: by its own thread). Every rank must make
 * the same collective calls with the same sizes; a rank that stops calling leaves the others waiting.
 * Every pointer argument is borrowed for the call.
 */
#ifndef KVP_PARALLEL_COMM_H
#define KVP_PARALLEL_COMM_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_comm kvp_comm;

/* One rank (rank 0 of 1). KVP_ENOMEM only. */
kvp_status kvp_comm_single_create(kvp_comm **out);

enum { KVP_COMM_MAX_THREADS = 64 };

/* n ranks (1 .. KVP_COMM_MAX_THREADS) that are threads of this process: comms[r] is rank r's communicator,
 * owned by the caller (kvp_comm_destroy each; the shared state goes with the last). KVP_ENOMEM leaves
 * nothing allocated. */
kvp_status kvp_comm_threads_create(int n, kvp_comm **comms);

/* The ranks of MPI_COMM_WORLD, initializing MPI when nobody has (and finalizing it in kvp_comm_destroy then).
 * expected_size > 0: KVP_EINVAL naming both numbers unless the world has exactly that many ranks (e.g. a
 * program started without mpirun has one). KVP_EUNSUPPORTED when the build has no MPI; KVP_EMPI when MPI
 * fails to start. */
kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out);

/* Nonzero when this build has the mpi backend. */
int kvp_comm_have_mpi(void);

void kvp_comm_destroy(kvp_comm *c); /* NULL: no-op */

/* For a program's main path only (never library code): ends every rank of an mpi job with exit status
 * code, so that ranks waiting in a collective for one that failed do not wait forever. Returns at once for
 * a single or threads communicator. */
void kvp_comm_abort(kvp_comm *c, int code);

/* For a program's main path only: on every rank but 0, stdout goes to /dev/null (rank 0 alone prints the
 * answer all ranks computed). KVP_EIO when it cannot. */
kvp_status kvp_comm_quiet_other_ranks(const kvp_comm *c);

int kvp_comm_rank(const kvp_comm *c);
int kvp_comm_size(const kvp_comm *c);
const char *kvp_comm_backend(const kvp_comm *c); /* "single", "threads" or "mpi" */

/* buf (n) = the element-wise sum of every rank's buf, the same bits on every rank. */
kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n);
/* recv (size * n) = rank 0's send (n), then rank 1's, ... on every rank. send and recv do not overlap. */
kvp_status kvp_comm_all_gather_f32(kvp_comm *c, const float *send, int64_t n, float *recv);
/* buf (bytes) on every rank = root's. */
kvp_status kvp_comm_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root);
/* The same, for a message that may come after a long idle time: a waiting MPI rank looks without a pause
 * for 2 ms, then sleeps between looks (200 us) instead of spinning a core as MPI's blocking collectives do. Every rank must call this one for
 * the message (MPI does not match a blocking broadcast with a nonblocking one). */
kvp_status kvp_comm_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root);
kvp_status kvp_comm_barrier(kvp_comm *c);

/* Checks that every rank holds the same value (a digest of what the ranks computed, say): KVP_EMPI on every
 * rank, naming what and how many ranks differ from rank 0, when they do not. */
kvp_status kvp_comm_check_same(kvp_comm *c, uint64_t value, const char *what);

#ifdef __cplusplus
}
#endif
#endif
