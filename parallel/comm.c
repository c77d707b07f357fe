/* parallel/comm.c — the single, threads and mpi communicators (parallel/comm.h). */
#include "parallel/comm.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"

#ifdef KVP_HAVE_MPI
#include <mpi.h>
#endif

/* The state the ranks of a threads communicator share. A collective runs in phases separated by the
 * barrier: each rank publishes its buffer (ptr[rank]), then reads the others', then waits until all have read
 * before any buffer changes again. */
typedef struct {
    pthread_barrier_t bar;
    atomic_int refs;     /* communicators still alive */
    const void *ptr[KVP_COMM_MAX_THREADS];
    float *sum;          /* the all-reduce result, grown by rank 0 before the ranks publish */
    size_t sum_cap;
    kvp_status sum_st;   /* rank 0's growth failed: every rank returns it */
} thread_group;

struct kvp_comm {
    const char *backend;
    int rank, size;
    int finalize;      /* mpi: this communicator initialized MPI and finalizes it */
    thread_group *grp; /* threads */
};

kvp_status kvp_comm_single_create(kvp_comm **out)
{
    kvp_comm *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "communicator: out of memory");
    *c = (kvp_comm){.backend = "single", .rank = 0, .size = 1};
    *out = c;
    return KVP_OK;
}

kvp_status kvp_comm_threads_create(int n, kvp_comm **comms)
{
    if (n < 1 || n > KVP_COMM_MAX_THREADS || !comms)
        return KVP_ERR(KVP_EINVAL, "threads communicator: %d ranks (1 to %d)", n, KVP_COMM_MAX_THREADS);
    thread_group *g = kvp_calloc(1, sizeof *g);
    if (!g) return KVP_ERR(KVP_ENOMEM, "threads communicator: out of memory");
    if (pthread_barrier_init(&g->bar, NULL, (unsigned)n) != 0) {
        kvp_free(g);
        return KVP_ERR(KVP_ENOMEM, "threads communicator: no barrier for %d threads", n);
    }
    atomic_init(&g->refs, n);
    for (int r = 0; r < n; r++) {
        comms[r] = kvp_calloc(1, sizeof **comms);
        if (!comms[r]) {
            for (int k = 0; k < r; k++) kvp_free(comms[k]);
            pthread_barrier_destroy(&g->bar);
            kvp_free(g);
            return KVP_ERR(KVP_ENOMEM, "threads communicator: out of memory");
        }
        *comms[r] = (kvp_comm){.backend = "threads", .rank = r, .size = n, .grp = g};
    }
    return KVP_OK;
}

static void group_release(thread_group *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    pthread_barrier_destroy(&g->bar);
    kvp_free(g->sum);
    kvp_free(g);
}

static void wait_all(kvp_comm *c) { pthread_barrier_wait(&c->grp->bar); }

/* The threads collectives (c->size > 1). */
static kvp_status threads_all_reduce(kvp_comm *c, float *buf, int64_t n)
{
    thread_group *g = c->grp;
    if (c->rank == 0) {
        g->sum_st = KVP_OK;
        if ((size_t)n > g->sum_cap) {
            float *ns = kvp_aligned_alloc(64, (size_t)n * sizeof(float));
            if (ns) {
                kvp_free(g->sum);
                g->sum = ns;
                g->sum_cap = (size_t)n;
            } else {
                g->sum_st = KVP_ENOMEM;
            }
        }
    }
    g->ptr[c->rank] = buf;
    wait_all(c);
    const kvp_status st = g->sum_st;
    if (st == KVP_OK) { /* each rank sums its slice of the elements, over the ranks in rank order */
        const int64_t a = n * c->rank / c->size, b = n * (c->rank + 1) / c->size;
        for (int64_t i = a; i < b; i++) {
            float x = ((const float *)g->ptr[0])[i];
            for (int r = 1; r < c->size; r++) x += ((const float *)g->ptr[r])[i];
            g->sum[i] = x;
        }
    }
    wait_all(c); /* every slice summed, every input read */
    if (st == KVP_OK) memcpy(buf, g->sum, (size_t)n * sizeof(float));
    wait_all(c); /* every rank has its copy: the sum may be reused */
    return st == KVP_OK ? KVP_OK : KVP_ERR(st, "all_reduce: out of memory for %lld elements", (long long)n);
}

static void threads_all_gather(kvp_comm *c, const float *send, int64_t n, float *recv)
{
    c->grp->ptr[c->rank] = send;
    wait_all(c);
    for (int r = 0; r < c->size; r++) memcpy(recv + r * n, c->grp->ptr[r], (size_t)n * sizeof(float));
    wait_all(c);
}

static void threads_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    if (c->rank == root) c->grp->ptr[root] = buf;
    wait_all(c);
    if (c->rank != root) memcpy(buf, c->grp->ptr[root], (size_t)bytes);
    wait_all(c);
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
    if (c->grp) group_release(c->grp);
#ifdef KVP_HAVE_MPI
    if (c->finalize) MPI_Finalize();
#endif
    kvp_free(c);
}

void kvp_comm_abort(kvp_comm *c, int code)
{
#ifdef KVP_HAVE_MPI
    if (c->size > 1 && !c->grp) {
        fflush(NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
#else
    (void)c;
    (void)code;
#endif
}

kvp_status kvp_comm_quiet_other_ranks(const kvp_comm *c)
{
    if (c->rank != 0 && !freopen("/dev/null", "w", stdout))
        return KVP_ERR(KVP_EIO, "rank %d: cannot send stdout to /dev/null", c->rank);
    return KVP_OK;
}

/* MPI counts are int: sums and broadcasts go in pieces of at most CHUNK elements. A single communicator,
 * or an mpi one of one rank, has nothing to exchange. */
enum { CHUNK = 1 << 28 };

kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n)
{
    if (n < 0 || (n > 0 && !buf)) return KVP_ERR(KVP_EINVAL, "all_reduce: %lld elements at %p", (long long)n, (void *)buf);
    if (c->size == 1) return KVP_OK;
    if (c->grp) return threads_all_reduce(c, buf, n);
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
    if (c->grp) {
        threads_all_gather(c, send, n, recv);
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
    if (c->grp) {
        threads_broadcast(c, buf, bytes, root);
        return KVP_OK;
    }
    for (int64_t at = 0; at < bytes; at += CHUNK) {
        const int cnt = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        MPI_TRY(MPI_Bcast((char *)buf + at, cnt, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
    return KVP_OK;
}

kvp_status kvp_comm_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root)
{
#ifdef KVP_HAVE_MPI
    if (!c->grp && c->size > 1 && bytes > 0 && bytes <= CHUNK && buf && root >= 0 && root < c->size) {
        MPI_Request rq;
        MPI_TRY(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &rq), "MPI_Ibcast");
        /* looks without a pause for 2 ms (a busy sender's next message comes within microseconds), then
         * every 200 us */
        const double t0 = MPI_Wtime();
        for (int done = 0;;) {
            MPI_TRY(MPI_Test(&rq, &done, MPI_STATUS_IGNORE), "MPI_Test");
            if (done) return KVP_OK;
            if (MPI_Wtime() - t0 < 2e-3) continue;
            const struct timespec nap = {0, 200 * 1000};
            nanosleep(&nap, NULL);
        }
    }
#endif
    return kvp_comm_broadcast(c, buf, bytes, root);
}

kvp_status kvp_comm_check_same(kvp_comm *c, uint64_t value, const char *what)
{
    uint64_t root = value;
    KVP_TRY(kvp_comm_broadcast(c, &root, sizeof root, 0));
    float differ = root != value;
    KVP_TRY(kvp_comm_all_reduce_sum_f32(c, &differ, 1)); /* so that every rank fails, not only those that differ */
    if (differ > 0) return KVP_ERR(KVP_EMPI, "%s: %.0f of the %d ranks differ from rank 0", what, differ, c->size);
    return KVP_OK;
}

kvp_status kvp_comm_barrier(kvp_comm *c)
{
    if (c->grp) wait_all(c);
    else if (c->size > 1) MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    return KVP_OK;
}
