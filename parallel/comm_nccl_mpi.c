/* parallel/comm_nccl_mpi.c — the nccl communicator bootstrapped over MPI (one process per GPU). Apart from
 * comm_nccl.c so that programs creating nccl communicators without MPI do not link it. */
#include "parallel/comm_internal.h"

kvp_status kvp_comm_nccl_mpi_create(int expected_size, int device, kvp_comm **out)
{
    if (!out) return KVP_ERR(KVP_EINVAL, "nccl communicator: NULL out");
    const char *why = "";
    if (!kvp_comm_have_nccl(&why)) return KVP_ERR(KVP_EUNSUPPORTED, "nccl communicator: %s", why);
    kvp_comm *host = NULL;
    KVP_TRY(kvp_comm_mpi_create(expected_size, &host));
    kvp_status st = KVP_OK;
    if (device < 0) { /* the rank's index among the ranks of its node: one GPU each */
        int local = 0, local_size = 1;
        st = kvp_comm_mpi_local_rank(host, &local, &local_size);
        device = local;
    }
    if (st == KVP_OK) st = kvp_comm_nccl_create(host, device, out);
    if (st != KVP_OK) kvp_comm_destroy(host);
    return st;
}
