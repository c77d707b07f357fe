/* parallel/comm.c — the single and mpi communicators (parallel/comm.h). */
#include "parallel/comm.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

#ifdef KVP_HAVE_MPI
#include <mpi.h>
#endif

struct kvp_comm {
    const char *backend;
    int rank, size;
    int finalize; /* mpi: this communicator initialized MPI and finalizes it */
};

kvp_status kvp_comm_single_create(kvp_comm **out)
{
    kvp_comm *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "communicator: out of memory");
    *c = (kvp_comm){.backend = "single", .rank = 0, .size = 1};
    *out = c;
    return KVP_OK;
}

int kvp_comm_rank(const kvp_comm *c) { return c->rank; }
int kvp_comm_size(const kvp_comm *c) { return c->size; }
const char *kvp_comm_backend(const kvp_comm *c) { return c->backend; }

#ifdef KVP_HAVE_MPI
int kvp_comm_have_mpi(void) { return 1; }

static kvp_status mpi_err(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return KVP_ERR(KVP_EMPI, "%s failed: %s", what, msg);
}
#define MPI_TRY(call, what)                                \
    do {                                                   \
        int rc_ = (call);                                  \
        if (rc_ != MPI_SUCCESS) return mpi_err(rc_, what); \
    } while (0)

kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return KVP_ERR(KVP_ESTATE, "communicator: MPI was already finalized in this process");
    if (!inited) {
        int provided;
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    }
    /* errors come back as return codes (the default handler would abort the whole job) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    kvp_status st = KVP_OK;
    if (expected_size > 0 && size != expected_size)
        st = KVP_ERR(KVP_EINVAL, "tensor parallelism over %d ranks, but this MPI job has %d (start it with "
                                 "`mpirun -np %d ...`)", expected_size, size, expected_size);
    kvp_comm *c = st == KVP_OK ? kvp_calloc(1, sizeof *c) : NULL;
    if (st == KVP_OK && !c) st = KVP_ERR(KVP_ENOMEM, "communicator: out of memory");
    if (st != KVP_OK) {
        if (!inited) MPI_Finalize();
        return st;
    }
    *c = (kvp_comm){.backend = "mpi", .rank = rank, .size = size, .finalize = !inited};
    *out = c;
    return KVP_OK;
}
#else
int kvp_comm_have_mpi(void) { return 0; }

kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out)
{
    (void)expected_size;
    (void)out;
    return KVP_ERR(KVP_EUNSUPPORTED, "this build has no MPI (install libopenmpi-dev and reconfigure)");
}
#define MPI_TRY(call, what) return KVP_ERR(KVP_ESTATE, "%s: no MPI in this build", what)
#endif

void kvp_comm_destroy(kvp_comm *c)
{
    if (!c) return;
#ifdef KVP_HAVE_MPI
    if (c->finalize) MPI_Finalize();
#endif
    kvp_free(c);
}

void kvp_comm_abort(kvp_comm *c, int code)
{
#ifdef KVP_HAVE_MPI
    if (c->size > 1) {
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
#else
    (void)c;
    (void)code;
#endif
}

/* MPI counts are int: sums and broadcasts go in pieces of at most CHUNK elements. A single communicator,
 * or an mpi one of one rank, has nothing to exchange. */
enum { CHUNK = 1 << 28 };

kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n)
{
    if (n < 0 || (n > 0 && !buf)) return KVP_ERR(KVP_EINVAL, "all_reduce: %lld elements at %p", (long long)n, (void *)buf);
    if (c->size == 1) return KVP_OK;
    for (int64_t at = 0; at < n; at += CHUNK) {
        const int cnt = (int)(n - at < CHUNK ? n - at : CHUNK);
        /* reduce then broadcast, not MPI_Allreduce: MPI does not promise every rank the same bits */
        MPI_TRY(MPI_Reduce(c->rank == 0 ? MPI_IN_PLACE : buf + at, buf + at, cnt, MPI_FLOAT, MPI_SUM, 0,
                           MPI_COMM_WORLD), "MPI_Reduce");
        MPI_TRY(MPI_Bcast(buf + at, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD), "MPI_Bcast");
    }
    return KVP_OK;
}

kvp_status kvp_comm_all_gather_f32(kvp_comm *c, const float *send, int64_t n, float *recv)
{
    if (n < 0 || (n > 0 && (!send || !recv)) || n > INT_MAX / c->size)
        return KVP_ERR(KVP_EINVAL, "all_gather: %lld elements per rank (at most %d)", (long long)n, INT_MAX / c->size);
    if (c->size == 1) {
        if (n > 0) memmove(recv, send, (size_t)n * sizeof(float));
        return KVP_OK;
    }
    MPI_TRY(MPI_Allgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgather");
    return KVP_OK;
}

kvp_status kvp_comm_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    if (bytes < 0 || (bytes > 0 && !buf) || root < 0 || root >= c->size)
        return KVP_ERR(KVP_EINVAL, "broadcast: %lld bytes from root %d of %d ranks", (long long)bytes, root, c->size);
    if (c->size == 1) return KVP_OK;
    for (int64_t at = 0; at < bytes; at += CHUNK) {
        const int cnt = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        MPI_TRY(MPI_Bcast((char *)buf + at, cnt, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
    return KVP_OK;
}

kvp_status kvp_comm_barrier(kvp_comm *c)
{
    if (c->size > 1) MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    return KVP_OK;
}
