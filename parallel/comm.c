/* parallel/comm.c — the communicator interface (parallel/comm.h): argument checks, the failure state,
 * timeouts, host memory, and the single backend. The other backends are in comm_*.c. */
#include "parallel/comm_internal.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/alloc.h"
#include "common/timer.h"

/* ---- headers, timeouts, failures --------------------------------------------------------------------- */

kvp_status kvp_comm_env_timeout(double *seconds)
{
    *seconds = KVP_COMM_DEFAULT_TIMEOUT_S;
    const char *e = getenv(KVP_COMM_TIMEOUT_ENV);
    if (!e || !*e) return KVP_OK;
    char *end = NULL;
    errno = 0;
    const double v = strtod(e, &end);
    if (errno != 0 || end == e || *end != '\0' || !isfinite(v) || v < 0)
        return KVP_ERR(KVP_EINVAL, "%s='%s': expected a number of seconds (0: no limit)", KVP_COMM_TIMEOUT_ENV, e);
    *seconds = v;
    return KVP_OK;
}

kvp_status kvp_comm_new(const kvp_comm_ops *ops, int rank, int size, kvp_comm **out)
{
    double t;
    KVP_TRY(kvp_comm_env_timeout(&t));
    kvp_comm *c = kvp_calloc(1, sizeof *c);
    if (!c) return KVP_ERR(KVP_ENOMEM, "%s communicator: out of memory", ops->name);
    *c = (kvp_comm){.ops = ops, .rank = rank, .size = size, .device = -1, .timeout_s = t};
    *out = c;
    return KVP_OK;
}

kvp_status kvp_comm_fail(kvp_comm *c, kvp_status st)
{
    if (st != KVP_OK && !c->failed) {
        c->failed = 1;
        snprintf(c->failure, sizeof c->failure, "%s", kvp_error_message());
    }
    return st;
}

double kvp_comm_deadline(const kvp_comm *c)
{
    return c->timeout_s > 0 ? kvp_now_s() + c->timeout_s : INFINITY;
}

void kvp_comm_poll_pause(double t0, double nap_us)
{
    if (kvp_now_s() - t0 < 1e-3) {
        sched_yield(); /* returns at once unless another thread (an oversubscribed rank) wants the core */
        return;
    }
    const struct timespec nap = {0, (long)(nap_us * 1000)};
    nanosleep(&nap, NULL);
}

kvp_status kvp_comm_timeout_error(kvp_comm *c, const char *what, const char *detail)
{
    return KVP_ERR(KVP_ETIMEDOUT,
                   "%s %s on rank %d of %d: not complete after %g s (%s): a rank stopped calling collectives or "
                   "died; %s=SECONDS sets the limit",
                   c->ops->name, what, c->rank, c->size, c->timeout_s, detail, KVP_COMM_TIMEOUT_ENV);
}

/* Refuses a collective on a communicator that failed before. */
static kvp_status usable(const kvp_comm *c, const char *what)
{
    if (!c->failed) return KVP_OK;
    return KVP_ERR(KVP_ESTATE, "%s %s on rank %d: the communicator is unusable after an earlier failure (%s)",
                   c->ops->name, what, c->rank, c->failure);
}

/* ---- single ------------------------------------------------------------------------------------------ */

static kvp_status single_all_reduce(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt)
{
    (void)c, (void)buf, (void)n, (void)dt;
    return KVP_OK;
}

static kvp_status single_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv)
{
    (void)c;
    if (bytes > 0) memmove(recv, send, (size_t)bytes);
    return KVP_OK;
}

static kvp_status single_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    (void)c, (void)buf, (void)bytes, (void)root;
    return KVP_OK;
}

static kvp_status single_barrier(kvp_comm *c)
{
    (void)c;
    return KVP_OK;
}

static void single_destroy(kvp_comm *c) { (void)c; }

static const kvp_comm_ops single_ops = {
    .name = "single",
    .mem = KVP_COMM_MEM_HOST,
    .all_reduce = single_all_reduce,
    .all_gather = single_all_gather,
    .broadcast = single_broadcast,
    .barrier = single_barrier,
    .destroy = single_destroy,
};

kvp_status kvp_comm_single_create(kvp_comm **out)
{
    if (!out) return KVP_ERR(KVP_EINVAL, "single communicator: NULL out");
    return kvp_comm_new(&single_ops, 0, 1, out);
}

/* ---- what every backend shares ----------------------------------------------------------------------- */

void kvp_comm_destroy(kvp_comm *c)
{
    if (!c) return;
    c->ops->destroy(c);
    kvp_free(c);
}

void kvp_comm_abort(kvp_comm *c, int code)
{
    if (c && c->ops->abort) c->ops->abort(c, code);
}

kvp_status kvp_comm_quiet_other_ranks(const kvp_comm *c)
{
    if (c->rank != 0 && !freopen("/dev/null", "w", stdout))
        return KVP_ERR(KVP_EIO, "rank %d: cannot send stdout to /dev/null", c->rank);
    return KVP_OK;
}

int kvp_comm_rank(const kvp_comm *c) { return c->rank; }
int kvp_comm_size(const kvp_comm *c) { return c->size; }
const char *kvp_comm_backend(const kvp_comm *c) { return c->ops->name; }
int kvp_comm_device(const kvp_comm *c) { return c->device; }
kvp_comm *kvp_comm_host(kvp_comm *c) { return c->ops->host ? c->ops->host(c) : c; }
kvp_comm_mem kvp_comm_memory(const kvp_comm *c) { return c->ops->mem; }
void kvp_comm_set_timeout(kvp_comm *c, double seconds) { c->timeout_s = seconds > 0 ? seconds : 0; }
double kvp_comm_timeout(const kvp_comm *c) { return c->timeout_s; }

kvp_status kvp_comm_mem_alloc(kvp_comm *c, size_t bytes, void **out)
{
    if (!out) return KVP_ERR(KVP_EINVAL, "%s mem_alloc: NULL out", c->ops->name);
    *out = NULL;
    if (c->ops->mem_alloc) return c->ops->mem_alloc(c, bytes, out);
    if (bytes > SIZE_MAX - 63) return KVP_ERR(KVP_ENOMEM, "%s mem_alloc: %zu bytes", c->ops->name, bytes);
    *out = kvp_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    return *out ? KVP_OK : KVP_ERR(KVP_ENOMEM, "%s mem_alloc: out of memory for %zu bytes", c->ops->name, bytes);
}

void kvp_comm_mem_free(kvp_comm *c, void *p)
{
    if (!p) return;
    if (c->ops->mem_free) c->ops->mem_free(c, p);
    else kvp_free(p);
}

static kvp_status mem_copy(kvp_comm *c, void *dst, const void *src, size_t bytes, int upload)
{
    const char *what = upload ? "mem_upload" : "mem_download";
    if (bytes > 0 && (!dst || !src)) return KVP_ERR(KVP_EINVAL, "%s %s: %zu bytes from %p to %p", c->ops->name, what, bytes, src, dst);
    if (bytes == 0) return KVP_OK;
    if (c->ops->mem_copy) {
        KVP_TRY(usable(c, what));
        return kvp_comm_fail(c, c->ops->mem_copy(c, dst, src, bytes, upload));
    }
    memcpy(dst, src, bytes);
    return KVP_OK;
}

kvp_status kvp_comm_mem_upload(kvp_comm *c, void *dst, const void *host_src, size_t bytes)
{
    return mem_copy(c, dst, host_src, bytes, 1);
}

kvp_status kvp_comm_mem_download(kvp_comm *c, void *host_dst, const void *src, size_t bytes)
{
    return mem_copy(c, host_dst, src, bytes, 0);
}

kvp_status kvp_comm_set_stream(kvp_comm *c, void *stream, int wait)
{
    if (c->ops->set_stream) return c->ops->set_stream(c, stream, wait);
    if (stream) return KVP_ERR(KVP_EINVAL, "%s communicator: no CUDA stream (it runs on the host)", c->ops->name);
    return KVP_OK;
}

kvp_status kvp_comm_wait(kvp_comm *c)
{
    KVP_TRY(usable(c, "wait"));
    return c->ops->wait ? kvp_comm_fail(c, c->ops->wait(c)) : KVP_OK;
}

/* ---- collectives ------------------------------------------------------------------------------------- */

kvp_status kvp_comm_all_reduce_sum(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt)
{
    if (n < 0 || (n > 0 && !buf) || (dt != KVP_COMM_F32 && dt != KVP_COMM_BF16) || n > INT64_MAX / 4)
        return KVP_ERR(KVP_EINVAL, "all_reduce: %lld elements of type %d at %p", (long long)n, (int)dt, buf);
    KVP_TRY(usable(c, "all_reduce"));
    return kvp_comm_fail(c, c->ops->all_reduce(c, buf, n, dt));
}

kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n)
{
    return kvp_comm_all_reduce_sum(c, buf, n, KVP_COMM_F32);
}

kvp_status kvp_comm_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv)
{
    if (bytes < 0 || (bytes > 0 && (!send || !recv)) || bytes > INT64_MAX / c->size)
        return KVP_ERR(KVP_EINVAL, "all_gather: %lld bytes per rank from %p to %p", (long long)bytes, send, recv);
    if (bytes > 0) { /* in place is send == recv + rank * bytes; any other overlap is refused */
        const uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv, all = (uintptr_t)(bytes * c->size);
        if (s < r + all && r < s + (uintptr_t)bytes && s != r + (uintptr_t)(bytes * c->rank))
            return KVP_ERR(KVP_EINVAL, "all_gather: send (%p) overlaps recv (%p) other than in place (recv + rank x %lld)",
                           send, recv, (long long)bytes);
    }
    KVP_TRY(usable(c, "all_gather"));
    return kvp_comm_fail(c, c->ops->all_gather(c, send, bytes, recv));
}

kvp_status kvp_comm_all_gather_f32(kvp_comm *c, const float *send, int64_t n, float *recv)
{
    if (n < 0 || n > INT64_MAX / 4) return KVP_ERR(KVP_EINVAL, "all_gather: %lld elements per rank", (long long)n);
    return kvp_comm_all_gather(c, send, n * (int64_t)sizeof(float), recv);
}

static kvp_status check_broadcast(const kvp_comm *c, const void *buf, int64_t bytes, int root)
{
    if (bytes < 0 || (bytes > 0 && !buf) || root < 0 || root >= c->size)
        return KVP_ERR(KVP_EINVAL, "broadcast: %lld bytes from root %d of %d ranks", (long long)bytes, root, c->size);
    return KVP_OK;
}

kvp_status kvp_comm_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    KVP_TRY(check_broadcast(c, buf, bytes, root));
    KVP_TRY(usable(c, "broadcast"));
    return kvp_comm_fail(c, c->ops->broadcast(c, buf, bytes, root));
}

kvp_status kvp_comm_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    kvp_comm *h = kvp_comm_host(c);
    KVP_TRY(check_broadcast(h, buf, bytes, root));
    KVP_TRY(usable(h, "broadcast_idle"));
    kvp_status (*f)(kvp_comm *, void *, int64_t, int) = h->ops->broadcast_idle ? h->ops->broadcast_idle : h->ops->broadcast;
    return kvp_comm_fail(h, f(h, buf, bytes, root));
}

kvp_status kvp_comm_barrier(kvp_comm *c)
{
    KVP_TRY(usable(c, "barrier"));
    return kvp_comm_fail(c, c->ops->barrier(c));
}

kvp_status kvp_comm_check_same(kvp_comm *c, uint64_t value, const char *what)
{
    kvp_comm *h = kvp_comm_host(c);
    uint64_t root = value;
    KVP_TRY(kvp_comm_broadcast(h, &root, sizeof root, 0));
    float differ = root != value;
    KVP_TRY(kvp_comm_all_reduce_sum_f32(h, &differ, 1)); /* so that every rank fails, not only those that differ */
    if (differ > 0) return KVP_ERR(KVP_EMPI, "%s: %.0f of the %d ranks differ from rank 0", what, differ, c->size);
    return KVP_OK;
}
