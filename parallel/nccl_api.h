/* parallel/nccl_api.h — every NCCL and CUDA runtime call of the nccl communicator, as a table of function
 * pointers, so that a test can put another implementation in place of libnccl (tests/parallel/fake_nccl.h:
 * ranks as threads, device memory in host memory) and check the calls, their order and the error mapping
 * without a GPU.
 *
 * The table's types are this header's own, ABI-equal to NCCL's and CUDA's (int for ncclResult_t,
 * ncclDataType_t, ncclRedOp_t, cudaError_t, cudaMemcpyKind; void * for cudaStream_t; a 128-byte id), so
 * the communicator compiles on machines without nccl.h. nccl_api.c fills the table from the linked libnccl
 * and libcudart when the build found them (KVP_HAVE_NCCL), and checks with static assertions that the
 * constants below are the libraries' own.
 *
 * Each member has the signature and meaning of the library function of the same name (NCCL 2.x API, CUDA
 * runtime API): see their documentation. Results are ncclResult_t / cudaError_t values.
 */
#ifndef KVP_PARALLEL_NCCL_API_H
#define KVP_PARALLEL_NCCL_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclResult_t */
enum {
    KVP_NCCL_SUCCESS = 0,
    KVP_NCCL_UNHANDLED_CUDA_ERROR = 1,
    KVP_NCCL_SYSTEM_ERROR = 2,
    KVP_NCCL_INTERNAL_ERROR = 3,
    KVP_NCCL_INVALID_ARGUMENT = 4,
    KVP_NCCL_INVALID_USAGE = 5,
    KVP_NCCL_REMOTE_ERROR = 6,
    KVP_NCCL_IN_PROGRESS = 7,
};
/* ncclDataType_t, ncclRedOp_t: the ones the communicator uses */
enum { KVP_NCCL_UINT8 = 1, KVP_NCCL_FLOAT32 = 7, KVP_NCCL_BFLOAT16 = 9 };
enum { KVP_NCCL_SUM = 0 };
/* cudaError_t: the ones the communicator (and the fake) name */
enum {
    KVP_CUDA_SUCCESS = 0,
    KVP_CUDA_ERROR_INVALID_VALUE = 1,
    KVP_CUDA_ERROR_MEMORY_ALLOCATION = 2,
    KVP_CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    KVP_CUDA_ERROR_NO_DEVICE = 100,
    KVP_CUDA_ERROR_INVALID_DEVICE = 101,
    KVP_CUDA_ERROR_INVALID_RESOURCE_HANDLE = 400,
    KVP_CUDA_ERROR_NOT_READY = 600,
    KVP_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};
/* cudaMemcpyKind */
enum { KVP_CUDA_MEMCPY_HOST_TO_DEVICE = 1, KVP_CUDA_MEMCPY_DEVICE_TO_HOST = 2 };

#define KVP_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[KVP_NCCL_UNIQUE_ID_BYTES];
} kvp_nccl_unique_id;                            /* ncclUniqueId */
typedef struct kvp_nccl_comm_impl *kvp_nccl_comm; /* ncclComm_t */

typedef struct {
    const char *name; /* "libnccl 2.28.9" or the replacement's name, for messages */
    /* NCCL */
    int (*ncclGetUniqueId)(kvp_nccl_unique_id *id);
    int (*ncclCommInitRank)(kvp_nccl_comm *comm, int nranks, kvp_nccl_unique_id id, int rank);
    int (*ncclCommInitAll)(kvp_nccl_comm *comms, int ndev, const int *devlist);
    int (*ncclCommDestroy)(kvp_nccl_comm comm);
    int (*ncclCommAbort)(kvp_nccl_comm comm);
    int (*ncclCommGetAsyncError)(kvp_nccl_comm comm, int *async_error);
    int (*ncclAllReduce)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,
                         kvp_nccl_comm comm, void *stream);
    int (*ncclAllGather)(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, kvp_nccl_comm comm,
                         void *stream);
    int (*ncclBroadcast)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root,
                         kvp_nccl_comm comm, void *stream);
    const char *(*ncclGetErrorString)(int result);
    const char *(*ncclGetLastError)(kvp_nccl_comm comm); /* comm may be NULL */
    /* CUDA runtime */
    int (*cudaGetDeviceCount)(int *count);
    int (*cudaSetDevice)(int device);
    int (*cudaMalloc)(void **ptr, size_t bytes);
    int (*cudaFree)(void *ptr);
    int (*cudaMemcpyAsync)(void *dst, const void *src, size_t bytes, int kind, void *stream);
    int (*cudaStreamQuery)(void *stream); /* KVP_CUDA_SUCCESS: drained; KVP_CUDA_ERROR_NOT_READY: work pending */
    const char *(*cudaGetErrorString)(int error);
} kvp_nccl_api;

/* The table of the libnccl and libcudart this program is linked with; NULL when the build has no NCCL, with
 * *why (if not NULL) naming what was missing at configure time. Static: never freed. */
const kvp_nccl_api *kvp_nccl_api_linked(const char **why);

/* The table nccl communicators created from now on use: api, or the linked one when api is NULL. For
 * tests, before any nccl communicator exists (a communicator keeps the table it was created with). api is
 * borrowed and must stay valid while communicators use it. Not thread-safe. */
void kvp_nccl_api_set(const kvp_nccl_api *api);
/* The table kvp_nccl_api_set chose (NULL, with *why, when there is none). */
const kvp_nccl_api *kvp_nccl_api_current(const char **why);

#ifdef __cplusplus
}
#endif
#endif
