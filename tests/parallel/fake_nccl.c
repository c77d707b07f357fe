/* tests/parallel/fake_nccl.c — the fake NCCL and CUDA runtime (fake_nccl.h). Plain malloc throughout, so
 * that the allocation-failure injection of common/alloc.h counts only the communicator's own allocations. */
#include "fake_nccl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm_internal.h" /* the bf16 rounding the ring emulation uses */

enum { MAXR = 64, MAXDEV = 64 };
enum { K_ALLREDUCE, K_ALLGATHER, K_BROADCAST };
static const char *const kind_name[] = {"AllReduce", "AllGather", "Broadcast"};

typedef struct item item;
typedef struct stream stream;
typedef struct group group;

typedef struct op { /* one collective of a group: the seq-th call of every rank */
    group *g;
    int kind, dtype, root;
    size_t count;
    uint64_t seq;
    int arrived, done, popped;
    const void *send[MAXR];
    void *recv[MAXR];
    stream *st[MAXR];
    struct op *next;
} op;

struct item { /* queued on a stream */
    op *coll;     /* a collective, or NULL for a copy */
    void *dst;
    const void *src;
    size_t n;
    item *next;
};

struct stream {
    int dev;
    item *head, *tail;
    void *foreign; /* the other runtime's stream this one stands for (fake_nccl_foreign), or NULL */
    stream *next;  /* user streams */
};

struct kvp_nccl_comm_impl {
    group *g;
    int rank, dev, async_error;
    uint64_t seq;
    struct kvp_nccl_comm_impl *next; /* live comms */
};
typedef struct kvp_nccl_comm_impl fcomm;

struct group {
    kvp_nccl_unique_id id;
    int nranks, joined, ready, from_init_all;
    int dev[MAXR];
    op *ops;
    group *next;
};

typedef struct fault {
    char call[48];
    int device, result, async, times;
    char last[256];
    struct fault *next;
} fault;

typedef struct alloc_rec {
    char *p;
    size_t n;
    int dev;
    struct alloc_rec *next;
} alloc_rec;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ndev = 8;
static stream dflt[MAXDEV];
static stream *user_streams;
static fcomm *comms;
static group *groups;
static fault *faults;
static alloc_rec *allocs;
static int64_t nallocs;
static int misuses;
static char misuse_msg[256];
static char *logbuf;
static size_t loglen, logcap;
static uint64_t id_counter;
static _Thread_local int cur_dev = 0;
static int (*foreign_is_device)(const void *p, size_t n); /* fake_nccl_foreign's */
static alloc_rec foreign_rec;                            /* what find_alloc returns for its memory */
static _Thread_local char last_error[512];

/* ---- bookkeeping ------------------------------------------------------------------------------------- */

static void log_call(const char *call, int dev)
{
    char e[80];
    const int k = snprintf(e, sizeof e, "%s%s@%d", loglen ? " " : "", call, dev);
    if (loglen + (size_t)k + 1 > logcap) {
        size_t cap = logcap ? logcap * 2 : 4096;
        while (cap < loglen + (size_t)k + 1) cap *= 2;
        char *nb = realloc(logbuf, cap);
        if (!nb) return;
        logbuf = nb;
        logcap = cap;
    }
    memcpy(logbuf + loglen, e, (size_t)k + 1);
    loglen += (size_t)k;
}

static void set_last(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

static void misuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(misuse_msg, sizeof misuse_msg, fmt, ap);
    va_end(ap);
    misuses++;
}

/* The fault for call on dev, consumed; NULL when none. */
static fault *take_fault(const char *call, int dev, int *async)
{
    for (fault *f = faults; f; f = f->next) {
        if (strcmp(f->call, call) != 0 || (f->device >= 0 && f->device != dev) || f->times == 0) continue;
        if (f->times > 0) f->times--;
        if (f->last[0]) snprintf(last_error, sizeof last_error, "%s", f->last);
        if (async) *async = f->async;
        return f;
    }
    return NULL;
}

static fcomm *live_comm(kvp_nccl_comm c)
{
    for (fcomm *k = comms; k; k = k->next)
        if (k == c) return k;
    return NULL;
}

static void unlink_comm(fcomm *c)
{
    for (fcomm **pp = &comms; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return;
        }
}

static stream *find_stream(void *s, int dev)
{
    if (!s) return dev >= 0 && dev < MAXDEV ? &dflt[dev] : NULL;
    for (stream *u = user_streams; u; u = u->next)
        if (u == s || (u->foreign && u->foreign == s)) return u;
    if (!foreign_is_device || dev < 0 || dev >= MAXDEV) return NULL;
    /* another runtime's stream: from now on a queue of its own on this device */
    stream *f = calloc(1, sizeof *f);
    if (!f) abort();
    *f = (stream){.dev = dev, .foreign = s, .next = user_streams};
    user_streams = f;
    return f;
}

/* The allocation holding [p, p + n) on dev. */
static alloc_rec *find_alloc(const void *p, size_t n, int dev)
{
    for (alloc_rec *a = allocs; a; a = a->next)
        if ((const char *)p >= a->p && (const char *)p + n <= a->p + a->n && (n > 0 || (const char *)p < a->p + a->n))
            return a->dev == dev ? a : NULL;
    if (foreign_is_device && foreign_is_device(p, n ? n : 1)) return &foreign_rec;
    return NULL;
}

static size_t type_size(int dt) { return dt == KVP_NCCL_FLOAT32 ? 4 : dt == KVP_NCCL_BFLOAT16 ? 2 : 1; }

/* ---- streams and the execution of collectives -------------------------------------------------------- */

static void push(stream *s, item *it)
{
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
}

static void pop(stream *s)
{
    item *it = s->head;
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    free(it);
}

static int ready_everywhere(const op *o, int nranks)
{
    if (o->arrived < nranks) return 0;
    for (int r = 0; r < nranks; r++)
        if (!o->st[r]->head || o->st[r]->head->coll != o) return 0;
    return 1;
}

static void run(op *o, int nranks)
{
    const size_t es = type_size(o->dtype), n = o->count;
    const size_t total = o->kind == K_ALLGATHER ? n * (size_t)nranks : n;
    char *tmp = malloc(total * es + 1);
    if (!tmp) abort(); /* a test machine out of memory: nothing sensible to emulate */
    if (o->kind == K_ALLREDUCE && o->dtype == KVP_NCCL_FLOAT32) {
        float *t = (float *)(void *)tmp;
        for (size_t i = 0; i < n; i++) {
            float x = ((const float *)o->send[0])[i];
            for (int r = 1; r < nranks; r++) x += ((const float *)o->send[r])[i];
            t[i] = x;
        }
    } else if (o->kind == K_ALLREDUCE) { /* bf16: every step of the ring rounds */
        uint16_t *t = (uint16_t *)(void *)tmp;
        for (size_t i = 0; i < n; i++) {
            uint16_t acc = ((const uint16_t *)o->send[0])[i];
            for (int r = 1; r < nranks; r++)
                acc = kvp_comm_f32_to_bf16(kvp_comm_bf16_to_f32(acc) + kvp_comm_bf16_to_f32(((const uint16_t *)o->send[r])[i]));
            t[i] = acc;
        }
    } else if (o->kind == K_ALLGATHER) {
        for (int r = 0; r < nranks; r++) memcpy(tmp + (size_t)r * n * es, o->send[r], n * es);
    } else {
        memcpy(tmp, o->send[o->root], n * es);
    }
    for (int r = 0; r < nranks; r++) memcpy(o->recv[r], tmp, total * es);
    free(tmp);
    o->done = 1;
}

/* Runs the copies at the head of s, up to its first collective. */
static int progress_one(stream *s)
{
    int moved = 0;
    while (s->head && !s->head->coll) {
        memcpy(s->head->dst, s->head->src, s->head->n);
        pop(s);
        moved = 1;
    }
    return moved;
}

/* Every stream: the default one of each device, then the user ones. */
static int all_streams(stream **all, int cap)
{
    int ns = 0;
    for (int d = 0; d < MAXDEV && ns < cap; d++) all[ns++] = &dflt[d];
    for (stream *u = user_streams; u && ns < cap; u = u->next) all[ns++] = u;
    return ns;
}

/* An op every rank has popped is forgotten. */
static void retire(op *o)
{
    if (o->popped < o->g->nranks) return;
    for (op **pp = &o->g->ops; *pp; pp = &(*pp)->next)
        if (*pp == o) {
            *pp = o->next;
            free(o);
            return;
        }
}

/* Runs whatever can run, on every stream, until nothing moves. */
static void progress_all(void)
{
    stream *all[MAXDEV + 256];
    const int ns = all_streams(all, (int)(sizeof all / sizeof all[0]));
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < ns; i++) {
            stream *s = all[i];
            moved |= progress_one(s);
            if (!s->head) continue;
            op *o = s->head->coll;
            if (!o->done && ready_everywhere(o, o->g->nranks)) run(o, o->g->nranks);
            if (o->done) {
                pop(s);
                o->popped++;
                retire(o);
                moved = 1;
            }
        }
    }
}

/* ---- CUDA runtime ------------------------------------------------------------------------------------ */

static const char *cuda_text(int e)
{
    switch (e) {
    case KVP_CUDA_SUCCESS: return "no error";
    case KVP_CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case KVP_CUDA_ERROR_MEMORY_ALLOCATION: return "out of memory";
    case KVP_CUDA_ERROR_INSUFFICIENT_DRIVER: return "CUDA driver version is insufficient for CUDA runtime version";
    case KVP_CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case KVP_CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE: return "invalid resource handle";
    case KVP_CUDA_ERROR_NOT_READY: return "device not ready";
    case KVP_CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    default: return "unrecognized error code";
    }
}

static const char *f_cudaGetErrorString(int e) { return cuda_text(e); }

static int f_cudaGetDeviceCount(int *count)
{
    pthread_mutex_lock(&mu);
    log_call("cudaGetDeviceCount", cur_dev);
    fault *f = take_fault("cudaGetDeviceCount", cur_dev, NULL);
    const int r = f ? f->result : KVP_CUDA_SUCCESS;
    if (!f) *count = ndev;
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_cudaSetDevice(int d)
{
    pthread_mutex_lock(&mu);
    log_call("cudaSetDevice", d);
    fault *f = take_fault("cudaSetDevice", d, NULL);
    int r = f ? f->result : KVP_CUDA_SUCCESS;
    if (r == KVP_CUDA_SUCCESS && (d < 0 || d >= ndev)) r = KVP_CUDA_ERROR_INVALID_DEVICE;
    if (r == KVP_CUDA_SUCCESS) cur_dev = d;
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_cudaMalloc(void **p, size_t n)
{
    pthread_mutex_lock(&mu);
    log_call("cudaMalloc", cur_dev);
    fault *f = take_fault("cudaMalloc", cur_dev, NULL);
    int r = f ? f->result : KVP_CUDA_SUCCESS;
    alloc_rec *a = NULL;
    if (r == KVP_CUDA_SUCCESS) {
        a = calloc(1, sizeof *a);
        if (a) a->p = malloc(n ? n : 1);
        if (!a || !a->p) {
            free(a);
            r = KVP_CUDA_ERROR_MEMORY_ALLOCATION;
        }
    }
    if (r == KVP_CUDA_SUCCESS) {
        a->n = n;
        a->dev = cur_dev;
        a->next = allocs;
        allocs = a;
        nallocs++;
        memset(a->p, 0xa5, n); /* device memory is not zeroed: a test that relies on it fails */
        *p = a->p;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_cudaFree(void *p)
{
    pthread_mutex_lock(&mu);
    log_call("cudaFree", cur_dev);
    int r = KVP_CUDA_SUCCESS;
    if (p) {
        alloc_rec **pp = &allocs;
        while (*pp && (*pp)->p != p) pp = &(*pp)->next;
        if (!*pp) {
            misuse("cudaFree(%p): not a fake device allocation", p);
            r = KVP_CUDA_ERROR_INVALID_VALUE;
        } else {
            alloc_rec *a = *pp;
            *pp = a->next;
            free(a->p);
            free(a);
            nallocs--;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *st)
{
    pthread_mutex_lock(&mu);
    log_call("cudaMemcpyAsync", cur_dev);
    fault *f = take_fault("cudaMemcpyAsync", cur_dev, NULL);
    int r = f ? f->result : KVP_CUDA_SUCCESS;
    stream *s = find_stream(st, cur_dev);
    if (r == KVP_CUDA_SUCCESS && !s) r = KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    if (r == KVP_CUDA_SUCCESS) {
        const void *dev_side = kind == KVP_CUDA_MEMCPY_HOST_TO_DEVICE ? dst : kind == KVP_CUDA_MEMCPY_DEVICE_TO_HOST ? src : NULL;
        if (!dev_side || !find_alloc(dev_side, n, cur_dev)) r = KVP_CUDA_ERROR_INVALID_VALUE;
    }
    if (r == KVP_CUDA_SUCCESS) {
        item *it = calloc(1, sizeof *it);
        if (!it) r = KVP_CUDA_ERROR_MEMORY_ALLOCATION;
        else {
            *it = (item){.dst = dst, .src = src, .n = n};
            push(s, it);
            progress_all();
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_cudaStreamQuery(void *st)
{
    pthread_mutex_lock(&mu);
    log_call("cudaStreamQuery", cur_dev);
    fault *f = take_fault("cudaStreamQuery", cur_dev, NULL);
    int r = f ? f->result : KVP_CUDA_SUCCESS;
    stream *s = find_stream(st, cur_dev);
    if (r == KVP_CUDA_SUCCESS && !s) r = KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    if (r == KVP_CUDA_SUCCESS) {
        progress_all();
        if (s->head) r = KVP_CUDA_ERROR_NOT_READY;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- NCCL -------------------------------------------------------------------------------------------- */

static const char *f_ncclGetErrorString(int r)
{
    switch (r) {
    case KVP_NCCL_SUCCESS: return "no error";
    case KVP_NCCL_UNHANDLED_CUDA_ERROR: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case KVP_NCCL_SYSTEM_ERROR: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case KVP_NCCL_INTERNAL_ERROR: return "internal error - please report this issue to the NCCL developers";
    case KVP_NCCL_INVALID_ARGUMENT: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case KVP_NCCL_INVALID_USAGE: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case KVP_NCCL_REMOTE_ERROR: return "remote process exited or there was a network error";
    case KVP_NCCL_IN_PROGRESS: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

static const char *f_ncclGetLastError(kvp_nccl_comm c)
{
    (void)c;
    return last_error;
}

static int f_ncclGetUniqueId(kvp_nccl_unique_id *id)
{
    pthread_mutex_lock(&mu);
    log_call("ncclGetUniqueId", cur_dev);
    fault *f = take_fault("ncclGetUniqueId", cur_dev, NULL);
    const int r = f ? f->result : KVP_NCCL_SUCCESS;
    if (!f) {
        memset(id, 0, sizeof *id);
        snprintf(id->internal, sizeof id->internal, "fake-nccl-%ld-%llu", (long)getpid(), (unsigned long long)++id_counter);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static fcomm *new_comm(group *g, int rank, int dev)
{
    fcomm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (fcomm){.g = g, .rank = rank, .dev = dev, .next = comms};
    comms = c;
    return c;
}

/* NCCL's check: no two ranks of a communicator on one device. */
static int duplicate_gpu(const group *g, int rank)
{
    for (int k = 0; k < g->nranks; k++)
        if (k != rank && g->dev[k] == g->dev[rank]) {
            set_last("Duplicate GPU detected : rank %d and rank %d both on CUDA device %x", rank, k, 0x1000 * (g->dev[rank] + 1));
            return 1;
        }
    return 0;
}

static int f_ncclCommInitRank(kvp_nccl_comm *out, int nranks, kvp_nccl_unique_id id, int rank)
{
    pthread_mutex_lock(&mu);
    const int dev = cur_dev;
    log_call("ncclCommInitRank", dev);
    *out = NULL;
    int async = 0;
    fault *f = take_fault("ncclCommInitRank", dev, &async);
    if (f && !async) {
        pthread_mutex_unlock(&mu);
        return f->result;
    }
    if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) {
        set_last("Invalid rank requested : %d/%d", rank, nranks);
        pthread_mutex_unlock(&mu);
        return KVP_NCCL_INVALID_ARGUMENT;
    }
    group *g = groups;
    while (g && (g->from_init_all || memcmp(g->id.internal, id.internal, sizeof id.internal) != 0)) g = g->next;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g) {
            pthread_mutex_unlock(&mu);
            return KVP_NCCL_SYSTEM_ERROR;
        }
        g->id = id;
        g->nranks = nranks;
        for (int k = 0; k < MAXR; k++) g->dev[k] = -1;
        g->next = groups;
        groups = g;
    }
    if (g->nranks != nranks || g->dev[rank] != -1 || g->ready) {
        set_last("fake NCCL: rank %d of %d joined a communicator of %d ranks twice or late", rank, nranks, g->nranks);
        pthread_mutex_unlock(&mu);
        return KVP_NCCL_INVALID_USAGE;
    }
    g->dev[rank] = dev;
    g->joined++;
    pthread_cond_broadcast(&cv);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    while (g->joined < g->nranks) {
        if (pthread_cond_timedwait(&cv, &mu, &ts) == ETIMEDOUT && g->joined < g->nranks) {
            set_last("fake NCCL bootstrap: %d of %d ranks joined in 20 s", g->joined, g->nranks);
            pthread_mutex_unlock(&mu);
            return KVP_NCCL_SYSTEM_ERROR;
        }
    }
    g->ready = 1;
    int r = KVP_NCCL_SUCCESS;
    if (duplicate_gpu(g, rank)) r = KVP_NCCL_INVALID_USAGE;
    else if (f) r = f->result; /* an injected failure found after the rendezvous */
    if (r == KVP_NCCL_SUCCESS) {
        fcomm *c = new_comm(g, rank, dev);
        if (!c) r = KVP_NCCL_SYSTEM_ERROR;
        *out = c;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_ncclCommInitAll(kvp_nccl_comm *out, int n, const int *devlist)
{
    pthread_mutex_lock(&mu);
    log_call("ncclCommInitAll", cur_dev);
    fault *f = take_fault("ncclCommInitAll", -1, NULL);
    int r = f ? f->result : KVP_NCCL_SUCCESS;
    group *g = NULL;
    if (r == KVP_NCCL_SUCCESS && (n < 1 || n > MAXR)) {
        set_last("Invalid number of devices: %d", n);
        r = KVP_NCCL_INVALID_ARGUMENT;
    }
    if (r == KVP_NCCL_SUCCESS && !(g = calloc(1, sizeof *g))) r = KVP_NCCL_SYSTEM_ERROR;
    if (r == KVP_NCCL_SUCCESS) {
        g->nranks = g->joined = n;
        g->ready = g->from_init_all = 1;
        for (int k = 0; k < n; k++) {
            g->dev[k] = devlist ? devlist[k] : k;
            if (g->dev[k] < 0 || g->dev[k] >= ndev) {
                set_last("Cuda failure %d '%s'", KVP_CUDA_ERROR_INVALID_DEVICE, cuda_text(KVP_CUDA_ERROR_INVALID_DEVICE));
                r = KVP_NCCL_UNHANDLED_CUDA_ERROR;
            }
        }
        for (int k = 0; k < n && r == KVP_NCCL_SUCCESS; k++)
            if (duplicate_gpu(g, k)) r = KVP_NCCL_INVALID_USAGE;
        g->next = groups;
        groups = g;
    }
    int made = 0;
    for (; made < n && r == KVP_NCCL_SUCCESS; made++) {
        out[made] = new_comm(g, made, g->dev[made]);
        if (!out[made]) r = KVP_NCCL_SYSTEM_ERROR;
    }
    if (r != KVP_NCCL_SUCCESS)
        for (int k = 0; k < made; k++)
            if (out[k]) {
                unlink_comm(out[k]);
                free(out[k]);
                out[k] = NULL;
            }
    pthread_mutex_unlock(&mu);
    return r;
}

/* Drops the queued work of c on every stream (NCCL's abort ends its kernels). */
static void drop_work(fcomm *c)
{
    stream *all[MAXDEV + 256];
    const int ns = all_streams(all, (int)(sizeof all / sizeof all[0]));
    for (int i = 0; i < ns; i++) {
        item **pp = &all[i]->head, *prev = NULL;
        while (*pp) {
            item *it = *pp;
            if (it->coll && it->coll->g == c->g && it->coll->st[c->rank] == all[i]) {
                *pp = it->next;
                if (all[i]->tail == it) all[i]->tail = prev;
                free(it);
            } else {
                prev = it;
                pp = &it->next;
            }
        }
    }
}

static int has_work(const fcomm *c)
{
    for (op *o = c->g->ops; o; o = o->next)
        if (o->st[c->rank] && !o->done && o->st[c->rank]->head) {
            for (item *it = o->st[c->rank]->head; it; it = it->next)
                if (it->coll == o) return 1;
        }
    return 0;
}

static int end_comm(kvp_nccl_comm cc, const char *call)
{
    pthread_mutex_lock(&mu);
    fcomm *c = live_comm(cc);
    log_call(call, c ? c->dev : -1);
    int r = KVP_NCCL_SUCCESS;
    if (!c) {
        misuse("%s(%p): not a live communicator", call, (void *)cc);
        r = KVP_NCCL_INVALID_ARGUMENT;
    } else {
        if (strcmp(call, "ncclCommDestroy") == 0) {
            progress_all();
            if (has_work(c)) misuse("ncclCommDestroy on rank %d with queued collectives (it would wait forever)", c->rank);
        }
        drop_work(c);
        unlink_comm(c);
        free(c);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_ncclCommDestroy(kvp_nccl_comm c) { return end_comm(c, "ncclCommDestroy"); }
static int f_ncclCommAbort(kvp_nccl_comm c) { return end_comm(c, "ncclCommAbort"); }

static int f_ncclCommGetAsyncError(kvp_nccl_comm cc, int *async_error)
{
    pthread_mutex_lock(&mu);
    fcomm *c = live_comm(cc);
    log_call("ncclCommGetAsyncError", c ? c->dev : -1);
    int r = KVP_NCCL_SUCCESS;
    if (!c) r = KVP_NCCL_INVALID_ARGUMENT;
    else *async_error = c->async_error;
    pthread_mutex_unlock(&mu);
    return r;
}

/* The three collectives: checks as NCCL's ArgsCheck, then the rank's part of operation number c->seq. */
static int collective(int kind, const char *call, const void *send, void *recv, size_t count, int dtype, int root,
                      kvp_nccl_comm cc, void *st)
{
    pthread_mutex_lock(&mu);
    fcomm *c = live_comm(cc);
    log_call(call, c ? c->dev : -1);
    int async = 0, r = KVP_NCCL_SUCCESS;
    fault *f = c ? take_fault(call, c->dev, &async) : NULL;
    if (!c) {
        set_last("%s : invalid communicator", kind_name[kind]);
        r = KVP_NCCL_INVALID_ARGUMENT;
    } else if (f && !async) {
        r = f->result;
    } else if (f) {
        c->async_error = f->result; /* the work never runs; the error shows asynchronously */
    }
    const size_t es = type_size(dtype);
    const size_t in_bytes = count * es, out_bytes = kind == K_ALLGATHER && c ? count * es * (size_t)c->g->nranks : count * es;
    if (r == KVP_NCCL_SUCCESS && !async) {
        if (dtype != KVP_NCCL_FLOAT32 && dtype != KVP_NCCL_BFLOAT16 && dtype != KVP_NCCL_UINT8) {
            set_last("%s : invalid type %d", kind_name[kind], dtype);
            r = KVP_NCCL_INVALID_ARGUMENT;
        } else if (kind == K_BROADCAST && (root < 0 || root >= c->g->nranks)) {
            set_last("%s : invalid root %d (root should be in the 0..%d range)", kind_name[kind], root, c->g->nranks);
            r = KVP_NCCL_INVALID_ARGUMENT;
        } else if ((kind != K_BROADCAST || c->rank == root) && !find_alloc(send, in_bytes, c->dev)) {
            set_last("%s : sendbuff %p is not a valid pointer", kind_name[kind], send);
            r = KVP_NCCL_INVALID_ARGUMENT;
        } else if (!find_alloc(recv, out_bytes, c->dev)) {
            set_last("%s : recvbuff %p is not a valid pointer", kind_name[kind], recv);
            r = KVP_NCCL_INVALID_ARGUMENT;
        }
    }
    stream *s = r == KVP_NCCL_SUCCESS && !async ? find_stream(st, c->dev) : NULL;
    if (r == KVP_NCCL_SUCCESS && !async && !s) {
        set_last("Cuda failure %d '%s'", KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE, cuda_text(KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE));
        r = KVP_NCCL_UNHANDLED_CUDA_ERROR;
    }
    if (r == KVP_NCCL_SUCCESS && !async) {
        group *g = c->g;
        const uint64_t seq = c->seq++;
        op *o = g->ops;
        while (o && o->seq != seq) o = o->next;
        if (!o) {
            o = calloc(1, sizeof *o);
            if (!o) abort();
            *o = (op){.g = g, .kind = kind, .dtype = dtype, .root = root, .count = count, .seq = seq, .next = g->ops};
            g->ops = o;
        }
        if (o->kind != kind || o->count != count || o->dtype != dtype || o->root != root) {
            char what[200];
            snprintf(what, sizeof what, "fake NCCL: collective #%llu: rank %d called %s(count %zu, type %d, root %d), "
                     "another rank %s(count %zu, type %d, root %d)", (unsigned long long)seq, c->rank, kind_name[kind],
                     count, dtype, root, kind_name[o->kind], o->count, o->dtype, o->root);
            set_last("%s", what);
            for (fcomm *k = comms; k; k = k->next)
                if (k->g == g) k->async_error = KVP_NCCL_INVALID_USAGE;
        } else {
            o->send[c->rank] = send;
            o->recv[c->rank] = recv;
            o->st[c->rank] = s;
            o->arrived++;
            item *it = calloc(1, sizeof *it);
            if (!it) abort();
            it->coll = o;
            push(s, it);
            progress_all();
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int f_ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, kvp_nccl_comm c, void *st)
{
    if (op != KVP_NCCL_SUM) {
        set_last("AllReduce : reduction operation %d is not emulated", op);
        return KVP_NCCL_INVALID_ARGUMENT;
    }
    return collective(K_ALLREDUCE, "ncclAllReduce", send, recv, count, dtype, 0, c, st);
}

static int f_ncclAllGather(const void *send, void *recv, size_t count, int dtype, kvp_nccl_comm c, void *st)
{
    return collective(K_ALLGATHER, "ncclAllGather", send, recv, count, dtype, 0, c, st);
}

static int f_ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, kvp_nccl_comm c, void *st)
{
    return collective(K_BROADCAST, "ncclBroadcast", send, recv, count, dtype, root, c, st);
}

static const kvp_nccl_api fake = {
    .name = "fake NCCL (tests/parallel/fake_nccl.c)",
    .ncclGetUniqueId = f_ncclGetUniqueId,
    .ncclCommInitRank = f_ncclCommInitRank,
    .ncclCommInitAll = f_ncclCommInitAll,
    .ncclCommDestroy = f_ncclCommDestroy,
    .ncclCommAbort = f_ncclCommAbort,
    .ncclCommGetAsyncError = f_ncclCommGetAsyncError,
    .ncclAllReduce = f_ncclAllReduce,
    .ncclAllGather = f_ncclAllGather,
    .ncclBroadcast = f_ncclBroadcast,
    .ncclGetErrorString = f_ncclGetErrorString,
    .ncclGetLastError = f_ncclGetLastError,
    .cudaGetDeviceCount = f_cudaGetDeviceCount,
    .cudaSetDevice = f_cudaSetDevice,
    .cudaMalloc = f_cudaMalloc,
    .cudaFree = f_cudaFree,
    .cudaMemcpyAsync = f_cudaMemcpyAsync,
    .cudaStreamQuery = f_cudaStreamQuery,
    .cudaGetErrorString = f_cudaGetErrorString,
};

const kvp_nccl_api *fake_nccl_api(void) { return &fake; }

/* ---- control ----------------------------------------------------------------------------------------- */

static void clear_stream(stream *s)
{
    while (s->head) pop(s);
}

void fake_nccl_reset(int device_count)
{
    pthread_mutex_lock(&mu);
    ndev = device_count < 0 ? 0 : device_count > MAXDEV ? MAXDEV : device_count;
    for (int d = 0; d < MAXDEV; d++) clear_stream(&dflt[d]), dflt[d].dev = d;
    while (user_streams) {
        stream *s = user_streams;
        user_streams = s->next;
        clear_stream(s);
        free(s);
    }
    while (comms) {
        fcomm *c = comms;
        comms = c->next;
        free(c);
    }
    while (groups) {
        group *g = groups;
        groups = g->next;
        while (g->ops) {
            op *o = g->ops;
            g->ops = o->next;
            free(o);
        }
        free(g);
    }
    while (faults) {
        fault *f = faults;
        faults = f->next;
        free(f);
    }
    while (allocs) {
        alloc_rec *a = allocs;
        allocs = a->next;
        free(a->p);
        free(a);
    }
    nallocs = 0;
    foreign_is_device = NULL;
    misuses = 0;
    misuse_msg[0] = '\0';
    free(logbuf);
    logbuf = NULL;
    loglen = logcap = 0;
    pthread_mutex_unlock(&mu);
    cur_dev = 0;
    last_error[0] = '\0';
}

void fake_nccl_fail(const char *call, int device, int result, int async, const char *last, int times)
{
    fault *f = calloc(1, sizeof *f);
    if (!f) abort();
    snprintf(f->call, sizeof f->call, "%s", call);
    f->device = device;
    f->result = result;
    f->async = async;
    f->times = times;
    snprintf(f->last, sizeof f->last, "%s", last ? last : "");
    pthread_mutex_lock(&mu);
    fault **pp = &faults; /* in the order given */
    while (*pp) pp = &(*pp)->next;
    *pp = f;
    pthread_mutex_unlock(&mu);
}

long fake_nccl_find(const char *call, int device, long from)
{
    char want[80];
    snprintf(want, sizeof want, "%s@%d", call, device);
    const size_t wl = strlen(want);
    pthread_mutex_lock(&mu);
    long at = -1;
    for (size_t i = from < 0 ? 0 : (size_t)from; logbuf && i + wl <= loglen; i++)
        if ((i == 0 || logbuf[i - 1] == ' ') && strncmp(logbuf + i, want, wl) == 0 &&
            (logbuf[i + wl] == ' ' || logbuf[i + wl] == '\0')) {
            at = (long)i;
            break;
        }
    pthread_mutex_unlock(&mu);
    return at;
}

int fake_nccl_count(const char *call, int device)
{
    char want[64];
    snprintf(want, sizeof want, "%s@", call);
    const size_t wl = strlen(want);
    int n = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; logbuf && i + wl <= loglen; i++)
        if ((i == 0 || logbuf[i - 1] == ' ') && strncmp(logbuf + i, want, wl) == 0 &&
            (device < 0 || atoi(logbuf + i + wl) == device))
            n++;
    pthread_mutex_unlock(&mu);
    return n;
}

const char *fake_nccl_log(void) { return logbuf ? logbuf : ""; }

int64_t fake_nccl_live_allocs(void)
{
    pthread_mutex_lock(&mu);
    const int64_t n = nallocs;
    pthread_mutex_unlock(&mu);
    return n;
}

int fake_nccl_live_comms(void)
{
    pthread_mutex_lock(&mu);
    int n = 0;
    for (fcomm *c = comms; c; c = c->next) n++;
    pthread_mutex_unlock(&mu);
    return n;
}

int fake_nccl_misuses(void) { return misuses; }
const char *fake_nccl_last_misuse(void) { return misuse_msg; }

void fake_nccl_foreign(int (*is_device)(const void *p, size_t n))
{
    pthread_mutex_lock(&mu);
    foreign_is_device = is_device;
    pthread_mutex_unlock(&mu);
}

void *fake_nccl_stream_create(int device)
{
    stream *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->dev = device;
    pthread_mutex_lock(&mu);
    s->next = user_streams;
    user_streams = s;
    pthread_mutex_unlock(&mu);
    return s;
}

void fake_nccl_stream_destroy(void *p)
{
    pthread_mutex_lock(&mu);
    for (stream **pp = &user_streams; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            stream *s = *pp;
            *pp = s->next;
            clear_stream(s);
            free(s);
            break;
        }
    pthread_mutex_unlock(&mu);
}
