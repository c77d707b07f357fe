/* parallel/comm_mpi.c — the mpi communicator: CPU ranks, one process each, over MPI_COMM_WORLD.
 *
 * Every collective is MPI's nonblocking form (MPI_Ireduce, MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) polled
 * with MPI_Test against the communicator's deadline, so that a rank that stops calling collectives (or one
 * that hangs) makes the others fail with KVP_ETIMEDOUT instead of waiting forever; a rank that dies is
 * noticed by mpirun, which ends the job. All ranks use the nonblocking forms, as MPI requires (blocking and
 * nonblocking collectives do not match each other). After a timeout the request is still pending and MPI
 * offers no way to cancel it: the communicator is unusable, kvp_comm_destroy skips MPI_Finalize (which
 * could wait on it), and the program ends the job with kvp_comm_abort.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

#include "common/alloc.h"
#include "common/timer.h"
#include "parallel/comm_internal.h"

#ifdef KVP_HAVE_MPI
#include <mpi.h>

int kvp_comm_have_mpi(void) { return 1; }

typedef struct {
    int finalize; /* this communicator initialized MPI and finalizes it */
} mpi_state;

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

/* Polls rq until it completes or the deadline passes. idle: no deadline; looks without a pause for 2 ms
 * (a busy sender's next message comes within microseconds), then every 200 us. */
static kvp_status mpi_wait(kvp_comm *c, MPI_Request *rq, const char *what, int idle)
{
    const double t0 = kvp_now_s(), deadline = idle ? INFINITY : kvp_comm_deadline(c);
    for (;;) {
        int done = 0;
        MPI_TRY(MPI_Test(rq, &done, MPI_STATUS_IGNORE), what);
        if (done) return KVP_OK;
        const double now = kvp_now_s();
        if (now > deadline) return kvp_comm_timeout_error(c, what, "its MPI request is still pending");
        if (!idle) {
            kvp_comm_poll_pause(t0, 50);
        } else if (now - t0 >= 2e-3) {
            const struct timespec nap = {0, 200 * 1000};
            nanosleep(&nap, NULL);
        }
    }
}

/* MPI counts are int: sums and broadcasts go in pieces of at most CHUNK elements. */
enum { CHUNK = 1 << 28 };

static kvp_status reduce_f32(kvp_comm *c, float *buf, int64_t n)
{
    for (int64_t at = 0; at < n; at += CHUNK) {
        const int cnt = (int)(n - at < CHUNK ? n - at : CHUNK);
        MPI_Request rq;
        /* reduce then broadcast, not MPI_Allreduce: MPI does not promise every rank the same bits */
        MPI_TRY(MPI_Ireduce(c->rank == 0 ? MPI_IN_PLACE : buf + at, buf + at, cnt, MPI_FLOAT, MPI_SUM, 0,
                            MPI_COMM_WORLD, &rq), "MPI_Ireduce");
        KVP_TRY(mpi_wait(c, &rq, "all_reduce (MPI_Ireduce)", 0));
        MPI_TRY(MPI_Ibcast(buf + at, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD, &rq), "MPI_Ibcast");
        KVP_TRY(mpi_wait(c, &rq, "all_reduce (MPI_Ibcast)", 0));
    }
    return KVP_OK;
}

static kvp_status mpi_all_reduce(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt)
{
    if (c->size == 1 || n == 0) return KVP_OK;
    if (dt == KVP_COMM_F32) return reduce_f32(c, buf, n);
    /* bf16: MPI has no such type; summed in float (the same bits on every rank), rounded once */
    float *w = kvp_malloc((size_t)n * sizeof(float));
    if (!w) return KVP_ERR(KVP_ENOMEM, "mpi all_reduce: out of memory for %lld bf16 elements", (long long)n);
    uint16_t *h = buf;
    for (int64_t i = 0; i < n; i++) w[i] = kvp_comm_bf16_to_f32(h[i]);
    const kvp_status st = reduce_f32(c, w, n);
    if (st == KVP_OK)
        for (int64_t i = 0; i < n; i++) h[i] = kvp_comm_f32_to_bf16(w[i]);
    kvp_free(w);
    return st;
}

static kvp_status mpi_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv)
{
    if (bytes > INT_MAX)
        return KVP_ERR(KVP_EINVAL, "mpi all_gather: %lld bytes per rank (at most %d)", (long long)bytes, INT_MAX);
    if (c->size == 1) {
        if (bytes > 0) memmove(recv, send, (size_t)bytes);
        return KVP_OK;
    }
    const int in_place = send == (const char *)recv + bytes * c->rank;
    MPI_Request rq;
    MPI_TRY(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                           MPI_COMM_WORLD, &rq), "MPI_Iallgather");
    return mpi_wait(c, &rq, "all_gather (MPI_Iallgather)", 0);
}

static kvp_status bcast(kvp_comm *c, void *buf, int64_t bytes, int root, int idle)
{
    if (c->size == 1) return KVP_OK;
    for (int64_t at = 0; at < bytes; at += CHUNK) {
        const int cnt = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        MPI_Request rq;
        MPI_TRY(MPI_Ibcast((char *)buf + at, cnt, MPI_BYTE, root, MPI_COMM_WORLD, &rq), "MPI_Ibcast");
        KVP_TRY(mpi_wait(c, &rq, idle ? "broadcast_idle (MPI_Ibcast)" : "broadcast (MPI_Ibcast)", idle));
    }
    return KVP_OK;
}

static kvp_status mpi_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root) { return bcast(c, buf, bytes, root, 0); }
static kvp_status mpi_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root) { return bcast(c, buf, bytes, root, 1); }

static kvp_status mpi_barrier(kvp_comm *c)
{
    if (c->size == 1) return KVP_OK;
    MPI_Request rq;
    MPI_TRY(MPI_Ibarrier(MPI_COMM_WORLD, &rq), "MPI_Ibarrier");
    return mpi_wait(c, &rq, "barrier (MPI_Ibarrier)", 0);
}

static void mpi_abort(kvp_comm *c, int code)
{
    if (c->size > 1) {
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
}

static void mpi_destroy(kvp_comm *c)
{
    mpi_state *s = c->impl;
    /* after a failure a request may still be pending, and MPI_Finalize could wait on it */
    if (s && s->finalize && !c->failed) MPI_Finalize();
    kvp_free(s);
}

static const kvp_comm_ops mpi_ops = {
    .name = "mpi",
    .mem = KVP_COMM_MEM_HOST,
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .broadcast_idle = mpi_broadcast_idle,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out)
{
    if (!out) return KVP_ERR(KVP_EINVAL, "mpi communicator: NULL out");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return KVP_ERR(KVP_ESTATE, "communicator: MPI was already finalized in this process");
    if (!inited) {
        int provided;
        /* serialized: one thread at a time, not always the main one (serve's engine thread runs the model) */
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
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
    kvp_comm *c = NULL;
    mpi_state *s = NULL;
    if (st == KVP_OK) st = kvp_comm_new(&mpi_ops, rank, size, &c);
    if (st == KVP_OK && !(s = kvp_calloc(1, sizeof *s))) st = KVP_ERR(KVP_ENOMEM, "mpi communicator: out of memory");
    if (st != KVP_OK) {
        kvp_free(c);
        if (!inited) MPI_Finalize();
        return st;
    }
    s->finalize = !inited;
    c->impl = s;
    *out = c;
    return KVP_OK;
}

kvp_status kvp_comm_mpi_local_rank(kvp_comm *c, int *local_rank, int *local_size)
{
    if (c->ops != &mpi_ops) return KVP_ERR(KVP_EINVAL, "local rank: a %s communicator, not mpi", c->ops->name);
    MPI_Comm node;
    MPI_TRY(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
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

kvp_status kvp_comm_mpi_local_rank(kvp_comm *c, int *local_rank, int *local_size)
{
    (void)c, (void)local_rank, (void)local_size;
    return KVP_ERR(KVP_EUNSUPPORTED, "this build has no MPI");
}
#endif
