/* parallel/comm_check.h — the communicator contract, as a check any rank group can run on itself: every
 * collective of parallel/comm.h on the communicator's own memory (kvp_comm_mem_alloc / _upload /
 * _download), over sizes 0, 1, odd and larger lengths, f32 and bf16, in place and not, from every root,
 * against references computed on the host, plus the argument errors, which must leave the communicator
 * usable.
 *
 *   kvp_comm_check_report rep;
 *   kvp_status st = kvp_comm_check_contract(c, &rep);   // every rank of c, together
 *
 * The same code runs over every backend: the tests (tests/parallel) run it on single, threads, mpi and the
 * fake NCCL; kvp-nccl-smoke (parallel/tools) runs it on a real GPU.
 *
 * What is checked (n elements per rank, n in 0, 1, 2, 3, 7, 31, 64, 255, 1000, 4099):
 *   all_reduce f32   values whose sums are exact in any order: the exact sum, bit for bit; random values:
 *                    within 1e-6 x size of the float64 sum; the same bits on every rank (a digest compared
 *                    over the host plane)
 *   all_reduce bf16  small integers (exact sums); random bf16 values within size^2 x 2^-8 of the float64
 *                    sum of the bf16 inputs; the same bits on every rank
 *   all_gather       byte counts 0, 1, 3, 5, 4n: out of place and in place (send = recv + rank x bytes)
 *   broadcast        from every root, odd byte counts, over a destination filled with another pattern
 *   sequences        all_reduce, all_gather, broadcast enqueued back to back, then all downloaded
 *   barrier, wait, broadcast_idle, check_same (equal values pass; unequal ones fail on every rank)
 *   errors           negative sizes, NULL buffers, an unknown dtype, roots out of range, overlapping
 *                    all_gather buffers: KVP_EINVAL on every rank, and a collective after them still works
 *   memory           upload/download round trips of 0 and odd byte counts
 *
 * Returns KVP_OK when every check passed; KVP_ESTATE (the detail is the first failed check) when one did;
 * the communicator's own status when a call failed outright (KVP_ENCCL, KVP_ETIMEDOUT, ...). rep counts the
 * checks and failures either way. Allocates host memory (KVP_ENOMEM) and communicator memory.
 */
#ifndef KVP_PARALLEL_COMM_CHECK_H
#define KVP_PARALLEL_COMM_CHECK_H

#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int checks;       /* checks made on this rank */
    int failures;     /* of which failed */
    char first[480];  /* the first failure, "" when none */
} kvp_comm_check_report;

kvp_status kvp_comm_check_contract(kvp_comm *c, kvp_comm_check_report *rep);

#ifdef __cplusplus
}
#endif
#endif
