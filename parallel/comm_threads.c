/* parallel/comm_threads.c — the threads communicator: ranks that are threads of one process.
 *
 * A collective runs in phases separated by a barrier of all ranks: each rank publishes its buffer
 * (ptr[rank]), then reads the others', then waits until all have read before any buffer changes again.
 *
 *   publish ptr[r] --barrier (timed)--> read the others' buffers --barrier--> copy out --barrier-->
 *
 * Only the first barrier of a collective has a deadline: a rank that passed it is inside the same
 * collective as every other rank and only memcpys, so the later ones cannot wait on a rank that stopped;
 * and no rank leaves a collective while another may still read its buffer. A rank whose deadline passes
 * marks the group broken: the ranks waiting with it and every later collective return at once. So does
 * kvp_comm_abort (a rank that gives up), and a broadcast_idle (a follower waiting for its leader's next plan)
 * waits without a deadline.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "common/alloc.h"
#include "common/timer.h"
#include "parallel/comm_internal.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* on CLOCK_MONOTONIC */
    int n, arrived;
    uint64_t gen;          /* barriers completed */
    int broken;            /* a rank timed out or aborted */
    char why[320];         /* "" (timed out), or the aborting rank's error ("rank R gave up: ...") */
    atomic_int refs;       /* communicators still alive */
    const void *ptr[KVP_COMM_MAX_THREADS];
    float *sum;            /* the all-reduce result, grown by rank 0 before the ranks publish */
    size_t sum_cap;        /* floats */
    kvp_status sum_st;     /* rank 0's growth failed: every rank returns it */
} thread_group;

/* The error of a collective on a broken group (g->mu held). */
static kvp_status broken_error(kvp_comm *c, const char *what)
{
    const thread_group *g = c->impl;
    if (!g->why[0]) return KVP_ERR(KVP_ESTATE, "threads %s on rank %d: another rank timed out", what, c->rank);
    return KVP_ERR(KVP_ESTATE, "threads %s on rank %d: %s", what, c->rank, g->why);
}

/* Waits until every rank has arrived. timed: give up at the communicator's deadline (and break the group). */
static kvp_status wait_all(kvp_comm *c, const char *what, int timed)
{
    thread_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        const kvp_status st = broken_error(c, what);
        pthread_mutex_unlock(&g->mu);
        return st;
    }
    const uint64_t gen = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return KVP_OK;
    }
    const double deadline = timed ? kvp_comm_deadline(c) : INFINITY;
    struct timespec ts = {0, 0};
    if (deadline < INFINITY) {
        ts.tv_sec = (time_t)deadline;
        ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    }
    int timed_out = 0;
    while (g->gen == gen && !g->broken) {
        const int rc = deadline < INFINITY ? pthread_cond_timedwait(&g->cv, &g->mu, &ts) : pthread_cond_wait(&g->cv, &g->mu);
        if (rc == ETIMEDOUT && g->gen == gen && !g->broken) {
            timed_out = 1;
            break;
        }
    }
    kvp_status st = KVP_OK;
    if (timed_out) {
        char detail[96];
        snprintf(detail, sizeof detail, "%d of %d ranks arrived", g->arrived, g->n);
        g->broken = 1;
        g->arrived--;
        pthread_cond_broadcast(&g->cv);
        st = kvp_comm_timeout_error(c, what, detail);
    } else if (g->gen == gen) {
        st = broken_error(c, what);
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

static kvp_status threads_all_reduce(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt)
{
    thread_group *g = c->impl;
    if (c->size == 1) return KVP_OK;
    if (c->rank == 0) { /* before the first barrier: nobody reads g->sum yet */
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
    KVP_TRY(wait_all(c, "all_reduce", 1));
    const kvp_status st = g->sum_st;
    if (st == KVP_OK) { /* each rank sums its slice of the elements, over the ranks in rank order */
        const int64_t a = n * c->rank / c->size, b = n * (c->rank + 1) / c->size;
        if (dt == KVP_COMM_F32) {
            for (int64_t i = a; i < b; i++) {
                float x = ((const float *)g->ptr[0])[i];
                for (int r = 1; r < c->size; r++) x += ((const float *)g->ptr[r])[i];
                g->sum[i] = x;
            }
        } else { /* bf16: added in float, rounded once; the result is kept as bf16 in the sum buffer */
            uint16_t *out = (uint16_t *)g->sum;
            for (int64_t i = a; i < b; i++) {
                float x = kvp_comm_bf16_to_f32(((const uint16_t *)g->ptr[0])[i]);
                for (int r = 1; r < c->size; r++) x += kvp_comm_bf16_to_f32(((const uint16_t *)g->ptr[r])[i]);
                out[i] = kvp_comm_f32_to_bf16(x);
            }
        }
    }
    KVP_TRY(wait_all(c, "all_reduce", 0)); /* every slice summed, every input read */
    if (st == KVP_OK && n > 0) memcpy(buf, g->sum, (size_t)n * kvp_comm_dtype_bytes(dt));
    KVP_TRY(wait_all(c, "all_reduce", 0)); /* every rank has its copy: the sum may be reused */
    return st == KVP_OK ? KVP_OK : KVP_ERR(st, "all_reduce: out of memory for %lld elements", (long long)n);
}

static kvp_status threads_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv)
{
    thread_group *g = c->impl;
    g->ptr[c->rank] = send;
    KVP_TRY(wait_all(c, "all_gather", 1));
    for (int r = 0; r < c->size; r++) {
        char *dst = (char *)recv + (size_t)r * (size_t)bytes;
        if (dst != g->ptr[r] && bytes > 0) memcpy(dst, g->ptr[r], (size_t)bytes); /* own slot in place: done */
    }
    return wait_all(c, "all_gather", 0);
}

/* timed: the first barrier has the communicator's deadline (broadcast), or none (broadcast_idle). */
static kvp_status broadcast_of(kvp_comm *c, void *buf, int64_t bytes, int root, int timed)
{
    thread_group *g = c->impl;
    if (c->rank == root) g->ptr[root] = buf;
    KVP_TRY(wait_all(c, "broadcast", timed));
    if (c->rank != root && bytes > 0) memcpy(buf, g->ptr[root], (size_t)bytes);
    return wait_all(c, "broadcast", 0);
}

static kvp_status threads_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    return broadcast_of(c, buf, bytes, root, 1);
}

static kvp_status threads_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    return broadcast_of(c, buf, bytes, root, 0);
}

/* Breaks the group: the ranks waiting in a collective, and every later one, return KVP_ESTATE naming this
 * rank's last error (kvp_error_message: why it gives up). */
static void threads_abort(kvp_comm *c, int code)
{
    (void)code;
    thread_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    if (!g->broken) snprintf(g->why, sizeof g->why, "rank %d gave up: %s", c->rank, kvp_error_message());
    g->broken = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static kvp_status threads_barrier(kvp_comm *c) { return wait_all(c, "barrier", 1); }

static void group_release(thread_group *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    kvp_free(g->sum);
    kvp_free(g);
}

static void threads_destroy(kvp_comm *c) { group_release(c->impl); }

static const kvp_comm_ops threads_ops = {
    .name = "threads",
    .mem = KVP_COMM_MEM_HOST,
    .all_reduce = threads_all_reduce,
    .all_gather = threads_all_gather,
    .broadcast = threads_broadcast,
    .broadcast_idle = threads_broadcast_idle,
    .barrier = threads_barrier,
    .abort = threads_abort,
    .destroy = threads_destroy,
};

kvp_status kvp_comm_threads_create(int n, kvp_comm **comms)
{
    if (n < 1 || n > KVP_COMM_MAX_THREADS || !comms)
        return KVP_ERR(KVP_EINVAL, "threads communicator: %d ranks (1 to %d)", n, KVP_COMM_MAX_THREADS);
    thread_group *g = kvp_calloc(1, sizeof *g);
    if (!g) return KVP_ERR(KVP_ENOMEM, "threads communicator: out of memory");
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&g->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (ok && pthread_mutex_init(&g->mu, NULL) != 0) {
        pthread_cond_destroy(&g->cv);
        ok = 0;
    }
    if (!ok) {
        kvp_free(g);
        return KVP_ERR(KVP_ENOMEM, "threads communicator: no condition variable for %d threads", n);
    }
    g->n = n;
    atomic_init(&g->refs, n);
    for (int r = 0; r < n; r++) {
        const kvp_status st = kvp_comm_new(&threads_ops, r, n, &comms[r]);
        if (st != KVP_OK) {
            for (int k = 0; k < r; k++) kvp_free(comms[k]), comms[k] = NULL;
            atomic_init(&g->refs, 1);
            group_release(g);
            return st;
        }
        comms[r]->impl = g;
    }
    return KVP_OK;
}
