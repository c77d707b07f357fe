/* parallel/comm_nccl.c — the nccl communicator: one GPU per rank, every NCCL and CUDA call through the
 * table of parallel/nccl_api.h.
 *
 * A rank's communicator holds its ncclComm_t, its CUDA device, the stream collectives go on, a one-float
 * device buffer for the barrier, and the host plane it was bootstrapped over (an mpi or threads
 * communicator, owned). Every call that touches the GPU first makes the rank's device current on the
 * calling thread (cudaSetDevice), so a rank may move between threads.
 *
 * Completion is polled, never blocked on: after enqueuing, the rank loops on cudaStreamQuery and
 * ncclCommGetAsyncError until the stream drains, NCCL reports an error, or the deadline passes. On an
 * error or a timeout it calls ncclCommAbort (which stops NCCL's kernels, so the stream drains) and the
 * communicator is unusable from then on; kvp_comm_destroy calls ncclCommDestroy only on a healthy one.
 *
 * Zero-length collectives make no NCCL call (every rank passes the same sizes, so all skip together).
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/timer.h"
#include "parallel/comm_internal.h"
#include "parallel/nccl_api.h"

typedef struct {
    const kvp_nccl_api *api;
    kvp_nccl_comm nc;   /* NULL once aborted */
    kvp_comm *host;     /* the host plane (owned) */
    void *stream;       /* cudaStream_t; NULL: the legacy default stream */
    int wait;           /* wait for each collective before returning */
    float *scratch;     /* device: one float, for the barrier */
} nccl_state;

static nccl_state *st_of(kvp_comm *c) { return c->impl; }

/* ---- error messages ---------------------------------------------------------------------------------- */

/* "on rank R of N (CUDA device D)": where a failure happened, for the messages below. */
typedef struct {
    char s[64];
} where_buf;
static const char *where(where_buf *w, int rank, int size, int device)
{
    snprintf(w->s, sizeof w->s, "on rank %d of %d (CUDA device %d)", rank, size, device);
    return w->s;
}

/* KVP_ENCCL: "<call> failed <where>: <ncclGetErrorString>; NCCL's last error: <ncclGetLastError>". */
static kvp_status nccl_error(const kvp_nccl_api *api, kvp_nccl_comm nc, int r, const char *call, const char *at)
{
    const char *text = api->ncclGetErrorString(r), *last = api->ncclGetLastError(nc);
    return KVP_ERR(KVP_ENCCL, "%s failed %s: %s%s%s", call, at, text ? text : "unknown NCCL result",
                   last && *last ? "; NCCL's last error: " : "", last && *last ? last : "");
}

/* KVP_ECUDA: "<call> failed <where>: <cudaGetErrorString> (cudaError N)". */
static kvp_status cuda_error(const kvp_nccl_api *api, int e, const char *call, const char *at)
{
    const char *text = api->cudaGetErrorString(e);
    return KVP_ERR(KVP_ECUDA, "%s failed %s: %s (cudaError %d)", call, at, text ? text : "unknown CUDA error", e);
}

static kvp_status comm_nccl_error(kvp_comm *c, int r, const char *call)
{
    where_buf w;
    return nccl_error(st_of(c)->api, st_of(c)->nc, r, call, where(&w, c->rank, c->size, c->device));
}

static kvp_status comm_cuda_error(kvp_comm *c, int e, const char *call)
{
    where_buf w;
    return cuda_error(st_of(c)->api, e, call, where(&w, c->rank, c->size, c->device));
}

#define CUDA_TRY(c, call, what)                                           \
    do {                                                                  \
        const int e_ = (call);                                            \
        if (e_ != KVP_CUDA_SUCCESS) return comm_cuda_error((c), e_, what); \
    } while (0)

/* Ends NCCL's work on this rank after an error or a timeout (the stream can then drain). */
static kvp_status abort_with(kvp_comm *c, kvp_status st)
{
    nccl_state *s = st_of(c);
    if (s->nc) {
        s->api->ncclCommAbort(s->nc);
        s->nc = NULL;
    }
    return st;
}

static kvp_status lost(kvp_comm *c, const char *what)
{
    return KVP_ERR(KVP_ESTATE, "nccl %s on rank %d: the NCCL communicator was aborted", what, c->rank);
}

/* ---- completion -------------------------------------------------------------------------------------- */

/* Polls until the stream has drained (KVP_OK), NCCL reports an asynchronous error, or the deadline. */
static kvp_status wait_stream(kvp_comm *c, const char *what)
{
    nccl_state *s = st_of(c);
    if (!s->nc) return lost(c, what);
    const double t0 = kvp_now_s(), deadline = kvp_comm_deadline(c);
    for (;;) {
        const int e = s->api->cudaStreamQuery(s->stream);
        if (e != KVP_CUDA_SUCCESS && e != KVP_CUDA_ERROR_NOT_READY)
            return abort_with(c, comm_cuda_error(c, e, "cudaStreamQuery"));
        int async = KVP_NCCL_SUCCESS;
        const int r = s->api->ncclCommGetAsyncError(s->nc, &async);
        if (r != KVP_NCCL_SUCCESS)
            return abort_with(c, comm_nccl_error(c, r, "ncclCommGetAsyncError"));
        if (async != KVP_NCCL_SUCCESS && async != KVP_NCCL_IN_PROGRESS) {
            char call[96];
            snprintf(call, sizeof call, "%s (asynchronously)", what);
            return abort_with(c, comm_nccl_error(c, async, call));
        }
        if (e == KVP_CUDA_SUCCESS) return KVP_OK;
        if (kvp_now_s() > deadline) {
            char detail[128];
            snprintf(detail, sizeof detail, "CUDA device %d, its stream still busy; ncclCommAbort called", c->device);
            return abort_with(c, kvp_comm_timeout_error(c, what, detail));
        }
        kvp_comm_poll_pause(t0, 20);
    }
}

/* After ncclXxx returned r: the error, or the wait the communicator's mode asks for. */
static kvp_status enqueued(kvp_comm *c, int r, const char *call, int always_wait)
{
    if (r != KVP_NCCL_SUCCESS) return abort_with(c, comm_nccl_error(c, r, call));
    return st_of(c)->wait || always_wait ? wait_stream(c, call) : KVP_OK;
}

/* ---- the backend ------------------------------------------------------------------------------------- */

static kvp_status nccl_all_reduce(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt)
{
    nccl_state *s = st_of(c);
    if (!s->nc) return lost(c, "all_reduce");
    if (n == 0) return KVP_OK;
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    const int r = s->api->ncclAllReduce(buf, buf, (size_t)n, dt == KVP_COMM_BF16 ? KVP_NCCL_BFLOAT16 : KVP_NCCL_FLOAT32,
                                        KVP_NCCL_SUM, s->nc, s->stream);
    return enqueued(c, r, "ncclAllReduce", 0);
}

static kvp_status nccl_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv)
{
    nccl_state *s = st_of(c);
    if (!s->nc) return lost(c, "all_gather");
    if (bytes == 0) return KVP_OK;
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    const int r = s->api->ncclAllGather(send, recv, (size_t)bytes, KVP_NCCL_UINT8, s->nc, s->stream);
    return enqueued(c, r, "ncclAllGather", 0);
}

static kvp_status nccl_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root)
{
    nccl_state *s = st_of(c);
    if (!s->nc) return lost(c, "broadcast");
    if (bytes == 0) return KVP_OK;
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    const int r = s->api->ncclBroadcast(buf, buf, (size_t)bytes, KVP_NCCL_UINT8, root, s->nc, s->stream);
    return enqueued(c, r, "ncclBroadcast", 0);
}

static kvp_status nccl_barrier(kvp_comm *c)
{
    nccl_state *s = st_of(c);
    if (!s->nc) return lost(c, "barrier");
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    const int r = s->api->ncclAllReduce(s->scratch, s->scratch, 1, KVP_NCCL_FLOAT32, KVP_NCCL_SUM, s->nc, s->stream);
    return enqueued(c, r, "barrier (ncclAllReduce of one float)", 1);
}

static kvp_status nccl_wait(kvp_comm *c) { return wait_stream(c, "wait"); }

static kvp_status nccl_set_stream(kvp_comm *c, void *stream, int wait)
{
    nccl_state *s = st_of(c);
    s->stream = stream;
    s->wait = wait != 0;
    return KVP_OK;
}

static kvp_status nccl_mem_alloc(kvp_comm *c, size_t bytes, void **out)
{
    nccl_state *s = st_of(c);
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    void *p = NULL;
    CUDA_TRY(c, s->api->cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    *out = p;
    return KVP_OK;
}

static void nccl_mem_free(kvp_comm *c, void *p)
{
    nccl_state *s = st_of(c);
    s->api->cudaSetDevice(c->device);
    s->api->cudaFree(p);
}

static kvp_status nccl_mem_copy(kvp_comm *c, void *dst, const void *src, size_t bytes, int upload)
{
    nccl_state *s = st_of(c);
    const char *what = upload ? "mem_upload (cudaMemcpyAsync)" : "mem_download (cudaMemcpyAsync)";
    if (!s->nc) return lost(c, what);
    CUDA_TRY(c, s->api->cudaSetDevice(c->device), "cudaSetDevice");
    CUDA_TRY(c, s->api->cudaMemcpyAsync(dst, src, bytes, upload ? KVP_CUDA_MEMCPY_HOST_TO_DEVICE : KVP_CUDA_MEMCPY_DEVICE_TO_HOST,
                                        s->stream), "cudaMemcpyAsync");
    return wait_stream(c, what);
}

static kvp_comm *nccl_host(kvp_comm *c) { return st_of(c)->host; }

static void nccl_abort(kvp_comm *c, int code)
{
    abort_with(c, KVP_OK);
    kvp_comm_abort(st_of(c)->host, code);
}

/* Releases a rank's NCCL state: ncclCommDestroy when healthy, ncclCommAbort after a failure (destroying
 * would wait for the work of ranks that are gone). */
static void release(nccl_state *s, int device, int failed)
{
    if (!s || (!s->nc && !s->scratch)) return;
    s->api->cudaSetDevice(device);
    if (s->nc) {
        if (failed) s->api->ncclCommAbort(s->nc);
        else s->api->ncclCommDestroy(s->nc);
        s->nc = NULL;
    }
    if (s->scratch) s->api->cudaFree(s->scratch);
    s->scratch = NULL;
}

static void nccl_destroy(kvp_comm *c)
{
    nccl_state *s = st_of(c);
    if (!s) return;
    release(s, c->device, c->failed);
    kvp_comm_destroy(s->host);
    kvp_free(s);
}

static const kvp_comm_ops nccl_ops = {
    .name = "nccl",
    .mem = KVP_COMM_MEM_DEVICE,
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .wait = nccl_wait,
    .set_stream = nccl_set_stream,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_copy = nccl_mem_copy,
    .host = nccl_host,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

int kvp_comm_have_nccl(const char **why) { return kvp_nccl_api_current(why) != NULL; }

/* ---- creation ---------------------------------------------------------------------------------------- */

/* A communicator header and state for rank/size on device, NCCL not started yet. */
static kvp_status new_rank(const kvp_nccl_api *api, int rank, int size, int device, kvp_comm **out)
{
    kvp_comm *c = NULL;
    KVP_TRY(kvp_comm_new(&nccl_ops, rank, size, &c));
    nccl_state *s = kvp_calloc(1, sizeof *s);
    if (!s) {
        kvp_free(c);
        return KVP_ERR(KVP_ENOMEM, "nccl communicator: out of memory");
    }
    *s = (nccl_state){.api = api, .wait = 1};
    c->impl = s;
    c->device = device;
    *out = c;
    return KVP_OK;
}

/* Frees what new_rank made (after release). */
static void drop_rank(kvp_comm *c)
{
    if (!c) return;
    kvp_free(c->impl);
    kvp_free(c);
}

/* KVP_ENODEVICE unless device < the number of devices this process sees (KVP_ECUDA when CUDA cannot say). */
static kvp_status check_device(const kvp_nccl_api *api, int device, int rank, int size)
{
    int count = 0;
    where_buf w;
    const int e = api->cudaGetDeviceCount(&count);
    if (e != KVP_CUDA_SUCCESS) return cuda_error(api, e, "cudaGetDeviceCount", where(&w, rank, size, device));
    if (device >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return KVP_ERR(KVP_ENODEVICE, "rank %d of %d: CUDA device %d does not exist (this process sees %d device%s%s%s)",
                       rank, size, device, count, count == 1 ? "" : "s", vis ? ", CUDA_VISIBLE_DEVICES=" : "",
                       vis ? vis : "");
    }
    return KVP_OK;
}

/* What one rank says in an agreement: its status and message. */
typedef struct {
    int32_t status;
    char msg[220];
} rank_report;

/* Every rank of host learns whether every rank succeeded at `step`: the first failing rank's status, naming
 * it and its message, on the ranks that did not fail themselves (those keep their own error). */
static kvp_status agree(kvp_comm *host, kvp_status mine, const char *step)
{
    const int n = kvp_comm_size(host), me = kvp_comm_rank(host);
    rank_report r = {(int32_t)mine, ""};
    if (mine != KVP_OK) snprintf(r.msg, sizeof r.msg, "%s", kvp_error_message());
    char saved[sizeof r.msg];
    memcpy(saved, r.msg, sizeof saved);
    kvp_status st;
    if (n <= KVP_COMM_MAX_THREADS) {
        rank_report all[KVP_COMM_MAX_THREADS];
        st = kvp_comm_all_gather(host, &r, sizeof r, all);
        if (st != KVP_OK) return st;
        if (mine != KVP_OK) return KVP_ERR(mine, "%s", saved);
        for (int k = 0; k < n; k++)
            if (all[k].status != KVP_OK)
                return KVP_ERR((kvp_status)all[k].status, "%s: rank %d of %d failed: %s", step, k, n, all[k].msg);
        return KVP_OK;
    }
    float failed = mine != KVP_OK; /* too many ranks to gather every message: count them */
    st = kvp_comm_all_reduce_sum_f32(host, &failed, 1);
    if (st != KVP_OK) return st;
    if (mine != KVP_OK) return KVP_ERR(mine, "%s", saved);
    if (failed > 0) return KVP_ERR(KVP_ESTATE, "%s: %.0f of the %d ranks failed (rank %d did not)", step, failed, n, me);
    return KVP_OK;
}

kvp_status kvp_comm_nccl_create(kvp_comm *host, int device, kvp_comm **out)
{
    if (!host || !out || device < 0 || kvp_comm_memory(host) != KVP_COMM_MEM_HOST)
        return KVP_ERR(KVP_EINVAL, "nccl communicator: needs a host communicator and a device >= 0 (got %d)", device);
    const char *why = "";
    const kvp_nccl_api *api = kvp_nccl_api_current(&why);
    if (!api) return KVP_ERR(KVP_EUNSUPPORTED, "nccl communicator: %s", why);
    const int rank = kvp_comm_rank(host), size = kvp_comm_size(host);

    /* 1. this rank alone: its header, its device, and on rank 0 the id */
    kvp_comm *c = NULL;
    where_buf w;
    where(&w, rank, size, device);
    kvp_nccl_unique_id id;
    memset(&id, 0, sizeof id);
    kvp_status st = new_rank(api, rank, size, device, &c);
    if (st == KVP_OK) st = check_device(api, device, rank, size);
    if (st == KVP_OK) {
        const int e = api->cudaSetDevice(device);
        if (e != KVP_CUDA_SUCCESS) st = cuda_error(api, e, "cudaSetDevice", w.s);
    }
    if (st == KVP_OK && rank == 0) {
        const int r = api->ncclGetUniqueId(&id);
        if (r != KVP_NCCL_SUCCESS) st = nccl_error(api, NULL, r, "ncclGetUniqueId", w.s);
    }
    /* 2. nobody enters ncclCommInitRank (which waits for every rank) unless all are ready */
    st = agree(host, st, "nccl bootstrap");
    if (st == KVP_OK) st = kvp_comm_broadcast(host, &id, sizeof id, 0);
    /* 3. NCCL, then the barrier's float */
    nccl_state *s = c ? c->impl : NULL;
    if (st == KVP_OK) {
        const int r = api->ncclCommInitRank(&s->nc, size, id, rank);
        if (r != KVP_NCCL_SUCCESS) {
            st = nccl_error(api, s->nc, r, "ncclCommInitRank", w.s);
            s->nc = NULL;
        }
        if (st == KVP_OK) {
            void *p = NULL;
            const int e = api->cudaMalloc(&p, sizeof(float));
            if (e != KVP_CUDA_SUCCESS) st = cuda_error(api, e, "cudaMalloc", w.s);
            s->scratch = p;
        }
        st = agree(host, st, "ncclCommInitRank");
    }
    if (st != KVP_OK) {
        release(s, device, 1);
        drop_rank(c);
        return st;
    }
    s->host = host;
    *out = c;
    return KVP_OK;
}

kvp_status kvp_comm_nccl_threads_create(int n, const int *devices, kvp_comm **comms)
{
    if (n < 1 || n > KVP_COMM_MAX_THREADS || !comms)
        return KVP_ERR(KVP_EINVAL, "nccl threads communicator: %d ranks (1 to %d)", n, KVP_COMM_MAX_THREADS);
    const char *why = "";
    const kvp_nccl_api *api = kvp_nccl_api_current(&why);
    if (!api) return KVP_ERR(KVP_EUNSUPPORTED, "nccl communicator: %s", why);
    int devs[KVP_COMM_MAX_THREADS];
    char list[KVP_COMM_MAX_THREADS * 4 + 8] = "";
    for (int r = 0, at = 0; r < n; r++) {
        devs[r] = devices ? devices[r] : r;
        if (devs[r] < 0) return KVP_ERR(KVP_EINVAL, "nccl threads communicator: rank %d on device %d", r, devs[r]);
        at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", r ? "," : "", devs[r]);
    }
    kvp_comm *hosts[KVP_COMM_MAX_THREADS] = {0}, *cs[KVP_COMM_MAX_THREADS] = {0};
    kvp_nccl_comm ncs[KVP_COMM_MAX_THREADS] = {0};
    where_buf w;
    kvp_status st = kvp_comm_threads_create(n, hosts);
    const int have_hosts = st == KVP_OK;
    for (int r = 0; r < n && st == KVP_OK; r++) st = new_rank(api, r, n, devs[r], &cs[r]);
    for (int r = 0; r < n && st == KVP_OK; r++) st = check_device(api, devs[r], r, n);
    if (st == KVP_OK) {
        const int r = api->ncclCommInitAll(ncs, n, devs);
        if (r != KVP_NCCL_SUCCESS) {
            char at[sizeof list + 64];
            snprintf(at, sizeof at, "for %d ranks on CUDA devices %s", n, list);
            st = nccl_error(api, NULL, r, "ncclCommInitAll", at);
            memset(ncs, 0, sizeof ncs);
        }
    }
    for (int r = 0; r < n && st == KVP_OK; r++) {
        nccl_state *s = cs[r]->impl;
        s->nc = ncs[r];
        ncs[r] = NULL;
        int e = api->cudaSetDevice(devs[r]);
        void *p = NULL;
        if (e == KVP_CUDA_SUCCESS) e = api->cudaMalloc(&p, sizeof(float));
        s->scratch = p;
        if (e != KVP_CUDA_SUCCESS) st = cuda_error(api, e, "cudaMalloc", where(&w, r, n, devs[r]));
    }
    if (st != KVP_OK) {
        for (int r = 0; r < n; r++) {
            if (ncs[r]) api->ncclCommAbort(ncs[r]);
            if (cs[r]) release(cs[r]->impl, devs[r], 1);
            drop_rank(cs[r]);
            if (have_hosts) kvp_comm_destroy(hosts[r]);
        }
        return st;
    }
    for (int r = 0; r < n; r++) {
        ((nccl_state *)cs[r]->impl)->host = hosts[r];
        comms[r] = cs[r];
    }
    return KVP_OK;
}
