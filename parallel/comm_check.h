/* parallel/comm_check.h — the communicator contract as a check a rank group runs on itself, over any
 * backend (tests/parallel: single, threads, mpi, fake NCCL; parallel/tools/kvp-nccl-smoke: a real GPU).
 * Every collective of comm.h in the communicator's own memory, sizes 0, 1, odd and large, f32 and bf16, in
 * place and not, from every root, against host references (the list: comm_check.c); and the argument
 * errors, which must leave the communicator usable.
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

/* Every rank of c calls it together. KVP_OK when every check passed; KVP_ESTATE (detail: the first failed
 * check) when one did; the communicator's status when a call failed (KVP_ENCCL, KVP_ETIMEDOUT, ...), and
 * KVP_ENOMEM (it allocates host and communicator memory). rep is filled either way. */
kvp_status kvp_comm_check_contract(kvp_comm *c, kvp_comm_check_report *rep);

#ifdef __cplusplus
}
#endif
#endif
