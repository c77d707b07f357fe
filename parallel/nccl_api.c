/* parallel/nccl_api.c — the NCCL/CUDA table (nccl_api.h): the linked libnccl and libcudart when the build
 * found them, and the table tests put in their place. */
#include "parallel/nccl_api.h"

#include <stdint.h>
#include <string.h>

#ifdef KVP_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

/* The table's constants and types are NCCL's and CUDA's own. */
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(sizeof(ncclUniqueId) == sizeof(kvp_nccl_unique_id), "ncclUniqueId size");
_Static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
                   sizeof(ncclRedOp_t) == sizeof(int) && sizeof(cudaError_t) == sizeof(int),
               "enum sizes");
_Static_assert(SAME(ncclSuccess, KVP_NCCL_SUCCESS) && SAME(ncclUnhandledCudaError, KVP_NCCL_UNHANDLED_CUDA_ERROR) &&
                   SAME(ncclSystemError, KVP_NCCL_SYSTEM_ERROR) && SAME(ncclInternalError, KVP_NCCL_INTERNAL_ERROR) &&
                   SAME(ncclInvalidArgument, KVP_NCCL_INVALID_ARGUMENT) && SAME(ncclInvalidUsage, KVP_NCCL_INVALID_USAGE) &&
                   SAME(ncclRemoteError, KVP_NCCL_REMOTE_ERROR) && SAME(ncclInProgress, KVP_NCCL_IN_PROGRESS),
               "ncclResult_t values");
_Static_assert(SAME(ncclUint8, KVP_NCCL_UINT8) && SAME(ncclFloat32, KVP_NCCL_FLOAT32) && SAME(ncclBfloat16, KVP_NCCL_BFLOAT16) &&
                   SAME(ncclSum, KVP_NCCL_SUM),
               "ncclDataType_t / ncclRedOp_t values");
_Static_assert(SAME(cudaSuccess, KVP_CUDA_SUCCESS) && SAME(cudaErrorInvalidValue, KVP_CUDA_ERROR_INVALID_VALUE) &&
                   SAME(cudaErrorMemoryAllocation, KVP_CUDA_ERROR_MEMORY_ALLOCATION) &&
                   SAME(cudaErrorInsufficientDriver, KVP_CUDA_ERROR_INSUFFICIENT_DRIVER) &&
                   SAME(cudaErrorNoDevice, KVP_CUDA_ERROR_NO_DEVICE) && SAME(cudaErrorInvalidDevice, KVP_CUDA_ERROR_INVALID_DEVICE) &&
                   SAME(cudaErrorInvalidResourceHandle, KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE) &&
                   SAME(cudaErrorNotReady, KVP_CUDA_ERROR_NOT_READY) && SAME(cudaErrorIllegalAddress, KVP_CUDA_ERROR_ILLEGAL_ADDRESS),
               "cudaError_t values");
_Static_assert(SAME(cudaMemcpyHostToDevice, KVP_CUDA_MEMCPY_HOST_TO_DEVICE) &&
                   SAME(cudaMemcpyDeviceToHost, KVP_CUDA_MEMCPY_DEVICE_TO_HOST),
               "cudaMemcpyKind values");

/* The library calls with the table's types. */
#define COMM(c) ((ncclComm_t)(void *)(c))
#define STREAM(s) ((cudaStream_t)(s))

static int get_unique_id(kvp_nccl_unique_id *id)
{
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    if (r == ncclSuccess) memcpy(id->internal, u.internal, sizeof u.internal);
    return (int)r;
}

static int comm_init_rank(kvp_nccl_comm *comm, int nranks, kvp_nccl_unique_id id, int rank)
{
    ncclUniqueId u;
    memcpy(u.internal, id.internal, sizeof u.internal);
    ncclComm_t c = NULL;
    const ncclResult_t r = ncclCommInitRank(&c, nranks, u, rank);
    *comm = (kvp_nccl_comm)(void *)c;
    return (int)r;
}

static int comm_init_all(kvp_nccl_comm *comms, int ndev, const int *devlist)
{
    return (int)ncclCommInitAll((ncclComm_t *)(void *)comms, ndev, devlist);
}

static int comm_destroy(kvp_nccl_comm c) { return (int)ncclCommDestroy(COMM(c)); }
static int comm_abort(kvp_nccl_comm c) { return (int)ncclCommAbort(COMM(c)); }

static int comm_get_async_error(kvp_nccl_comm c, int *async_error)
{
    ncclResult_t a = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(COMM(c), &a);
    *async_error = (int)a;
    return (int)r;
}

static int all_reduce(const void *s, void *r, size_t n, int dt, int op, kvp_nccl_comm c, void *st)
{
    return (int)ncclAllReduce(s, r, n, (ncclDataType_t)dt, (ncclRedOp_t)op, COMM(c), STREAM(st));
}

static int all_gather(const void *s, void *r, size_t n, int dt, kvp_nccl_comm c, void *st)
{
    return (int)ncclAllGather(s, r, n, (ncclDataType_t)dt, COMM(c), STREAM(st));
}

static int broadcast(const void *s, void *r, size_t n, int dt, int root, kvp_nccl_comm c, void *st)
{
    return (int)ncclBroadcast(s, r, n, (ncclDataType_t)dt, root, COMM(c), STREAM(st));
}

static const char *error_string(int r) { return ncclGetErrorString((ncclResult_t)r); }
static const char *last_error(kvp_nccl_comm c) { return ncclGetLastError(COMM(c)); }
static int device_count(int *n) { return (int)cudaGetDeviceCount(n); }
static int set_device(int d) { return (int)cudaSetDevice(d); }
static int dev_malloc(void **p, size_t n) { return (int)cudaMalloc(p, n); }
static int dev_free(void *p) { return (int)cudaFree(p); }

static int memcpy_async(void *dst, const void *src, size_t n, int kind, void *st)
{
    return (int)cudaMemcpyAsync(dst, src, n, (enum cudaMemcpyKind)kind, STREAM(st));
}

static int stream_query(void *st) { return (int)cudaStreamQuery(STREAM(st)); }
static const char *cuda_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }

#define STR2(x) #x
#define STR(x) STR2(x)
static const kvp_nccl_api linked = {
    .name = "libnccl (built against " STR(NCCL_MAJOR) "." STR(NCCL_MINOR) "." STR(NCCL_PATCH) ")",
    .ncclGetUniqueId = get_unique_id,
    .ncclCommInitRank = comm_init_rank,
    .ncclCommInitAll = comm_init_all,
    .ncclCommDestroy = comm_destroy,
    .ncclCommAbort = comm_abort,
    .ncclCommGetAsyncError = comm_get_async_error,
    .ncclAllReduce = all_reduce,
    .ncclAllGather = all_gather,
    .ncclBroadcast = broadcast,
    .ncclGetErrorString = error_string,
    .ncclGetLastError = last_error,
    .cudaGetDeviceCount = device_count,
    .cudaSetDevice = set_device,
    .cudaMalloc = dev_malloc,
    .cudaFree = dev_free,
    .cudaMemcpyAsync = memcpy_async,
    .cudaStreamQuery = stream_query,
    .cudaGetErrorString = cuda_error_string,
};

const kvp_nccl_api *kvp_nccl_api_linked(const char **why)
{
    if (why) *why = "";
    return &linked;
}
#else
#ifndef KVP_NO_NCCL_REASON
#define KVP_NO_NCCL_REASON "NCCL was not looked for"
#endif
const kvp_nccl_api *kvp_nccl_api_linked(const char **why)
{
    if (why) *why = "this build has no NCCL (" KVP_NO_NCCL_REASON " at configure time)";
    return NULL;
}
#endif

static const kvp_nccl_api *chosen;

void kvp_nccl_api_set(const kvp_nccl_api *api) { chosen = api; }

const kvp_nccl_api *kvp_nccl_api_current(const char **why)
{
    if (chosen) {
        if (why) *why = "";
        return chosen;
    }
    return kvp_nccl_api_linked(why);
}
