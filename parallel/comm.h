/* parallel/comm.h — communicators for tensor parallelism: a group of `size` ranks that sum, gather and
 * broadcast buffers together (collectives: every rank calls the same sequence of them, in the same order).
 *
 *   kvp_comm *c;
 *   kvp_comm_mpi_create(2, &c);            // under `mpirun -np 2`: ranks 0 and 1 of MPI_COMM_WORLD
 *   kvp_comm_all_reduce_sum_f32(c, x, n);  // x[i] = sum over ranks of x[i], the same bits on every rank
 *   kvp_comm_destroy(c);
 *
 * Backends:
 *   single   one rank: every collective is a copy or nothing (the default of a model; no MPI needed)
 *   threads  ranks that are threads of one process, meeting at a barrier (tests, one-process runs)
 *   mpi      CPU ranks, one process each (Open MPI), over MPI_COMM_WORLD
 *   nccl     one GPU per rank (NCCL): one process per GPU bootstrapped over MPI, one thread per GPU in one
 *            process (ncclCommInitAll), or over any host communicator (kvp_comm_nccl_create). Built only
 *            when CUDA and NCCL are found at configure time; otherwise its constructors return
 *            KVP_EUNSUPPORTED naming what is missing. docs/parallel.md describes the bootstrap.
 * The all-reduce result is identical, bit for bit, on every rank (single, threads, mpi: a reduction in rank
 * order, then a broadcast; nccl: NCCL's reduce-scatter + all-gather computes each element once), so ranks
 * that run the same scheduler and sampler on it take the same decisions without exchanging them.
 *
 * Memory. The collectives read and write the communicator's memory (kvp_comm_memory): host memory for
 * single, threads and mpi; DEVICE memory of the rank's GPU for nccl (cudaMalloc'd, or kvp_comm_mem_alloc).
 * The contract is otherwise the same on every backend, so code written against kvp_comm_mem_alloc /
 * _upload / _download runs unchanged on all of them (the contract suite, tests/parallel, does). Host-side
 * messages of an nccl communicator (a step plan, a digest) go through its host plane, kvp_comm_host(c):
 * the MPI or threads communicator it was bootstrapped over; kvp_comm_broadcast_idle and
 * kvp_comm_check_same, which only make sense on host values, use it by themselves.
 *
 * Streams (nccl only). Collectives are enqueued on the communicator's CUDA stream (kvp_comm_set_stream: the
 * executor's; the legacy default stream until set), after the work the caller enqueued there before. With
 * wait = 1 (the default) each call then waits for that stream to drain and reports the result; with wait = 0
 * it returns once enqueued and kvp_comm_wait reports completion and errors. The CPU backends are
 * synchronous: kvp_comm_wait returns at once.
 *
 * Timeouts. No collective waits forever: a rank that stops calling collectives (or dies without MPI
 * noticing) makes the others fail with KVP_ETIMEDOUT after the communicator's timeout, naming the
 * collective and the ranks that arrived. The timeout is taken from the environment variable
 * KVPAGE_COMM_TIMEOUT (seconds, decimals allowed, 0 = wait forever) when a communicator is created, else
 * KVP_COMM_DEFAULT_TIMEOUT_S; kvp_comm_set_timeout changes it. kvp_comm_broadcast_idle (a follower waiting
 * for the next request of an idle server) never times out. After a timeout or any failed collective the
 * communicator is unusable: every later collective returns KVP_ESTATE naming the first failure; destroy
 * it (the nccl backend has already called ncclCommAbort). A program then ends every rank with
 * kvp_comm_abort.
 *
 * Errors: KVP_EINVAL for arguments (checked before anything is exchanged); KVP_ENOMEM; KVP_EMPI with MPI's
 * message; KVP_ENCCL with ncclGetErrorString's text and ncclGetLastError's; KVP_ECUDA with
 * cudaGetErrorString's text; KVP_ENODEVICE for a rank whose GPU does not exist; KVP_ETIMEDOUT.
 *
 * A communicator is used by one thread at a time (a threads or nccl-threads rank: by its own thread). Every
 * rank must make the same collective calls with the same sizes. Every pointer argument is borrowed for the
 * call (nccl with wait = 0: until kvp_comm_wait returns).
 */
#ifndef KVP_PARALLEL_COMM_H
#define KVP_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_comm kvp_comm;

/* Element types of the all-reduce. bf16: the upper 16 bits of an IEEE float (uint16_t storage); the CPU
 * backends add in float and round to nearest-even once, NCCL rounds after each step of its ring. */
typedef enum { KVP_COMM_F32 = 0, KVP_COMM_BF16 = 1 } kvp_comm_dtype;

/* Where a communicator's collectives read and write. */
typedef enum { KVP_COMM_MEM_HOST = 0, KVP_COMM_MEM_DEVICE = 1 } kvp_comm_mem;

enum { KVP_COMM_MAX_THREADS = 64 };
#define KVP_COMM_DEFAULT_TIMEOUT_S 600.0
#define KVP_COMM_TIMEOUT_ENV "KVPAGE_COMM_TIMEOUT"

/* One rank (rank 0 of 1). KVP_ENOMEM; KVP_EINVAL for a malformed KVPAGE_COMM_TIMEOUT. */
kvp_status kvp_comm_single_create(kvp_comm **out);

/* n ranks (1 .. KVP_COMM_MAX_THREADS) that are threads of this process: comms[r] is rank r's communicator,
 * owned by the caller (kvp_comm_destroy each; the shared state goes with the last). KVP_ENOMEM leaves
 * nothing allocated. */
kvp_status kvp_comm_threads_create(int n, kvp_comm **comms);

/* The ranks of MPI_COMM_WORLD, initializing MPI when nobody has (and finalizing it in kvp_comm_destroy then).
 * expected_size > 0: KVP_EINVAL naming both numbers unless the world has exactly that many ranks (e.g. a
 * program started without mpirun has one). KVP_EUNSUPPORTED when the build has no MPI; KVP_EMPI when MPI
 * fails to start. */
kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out);

/* Nonzero when this build has the mpi backend. */
int kvp_comm_have_mpi(void);

/* Nonzero when the nccl backend can run: the build found NCCL and CUDA (or a test installed an NCCL table,
 * parallel/nccl_api.h). Otherwise *why (if not NULL) says what is missing. Says nothing about GPUs. */
int kvp_comm_have_nccl(const char **why);

/* The nccl communicator of this rank of `host` (any communicator; every rank of it calls this together),
 * on CUDA device `device` (>= 0). The bootstrap, over host: each rank checks its device
 * (cudaGetDeviceCount, cudaSetDevice), rank 0 calls ncclGetUniqueId, the ranks agree that all of them
 * are ready (a rank that failed says why, and the others fail naming it instead of waiting in NCCL), rank 0's
 * id is broadcast, every rank calls ncclCommInitRank(size, id, rank), and the ranks agree again. On success
 * the communicator owns host (its host plane, destroyed with it) and has host's rank and size; on failure
 * host stays the caller's and is still usable. Errors: KVP_ENODEVICE (no such device: the message names the
 * device and how many the process sees), KVP_ECUDA, KVP_ENCCL (e.g. "Duplicate GPU detected" when two ranks
 * name one GPU: NCCL allows one rank per GPU), KVP_EUNSUPPORTED (no NCCL in this build), and host's errors
 * (KVP_ETIMEDOUT, ...). When another rank failed, this one returns that rank's status with a message naming
 * it and its error (KVP_ESTATE when more than 64 ranks only count the failures). */
kvp_status kvp_comm_nccl_create(kvp_comm *host, int device, kvp_comm **out);

/* One process per GPU under mpirun: kvp_comm_mpi_create(expected_size) as the host plane, then
 * kvp_comm_nccl_create on `device`, or when device < 0 on the rank's index among the ranks of its node
 * (MPI_COMM_TYPE_SHARED), so that `mpirun -np 4` on a 4-GPU machine gives each rank its own GPU. Errors as
 * kvp_comm_mpi_create and kvp_comm_nccl_create. */
kvp_status kvp_comm_nccl_mpi_create(int expected_size, int device, kvp_comm **out);

/* One process driving n GPUs (1 .. KVP_COMM_MAX_THREADS) with one thread each: ncclCommInitAll on
 * devices[0..n) (NULL: 0 .. n-1), a threads host plane. comms[r] is rank r's communicator, used by one
 * thread at a time (normally rank r's own). Errors as kvp_comm_nccl_create; nothing is left allocated. */
kvp_status kvp_comm_nccl_threads_create(int n, const int *devices, kvp_comm **comms);

void kvp_comm_destroy(kvp_comm *c); /* NULL: no-op */

/* For a program's main path only (never library code): ends every rank of an mpi job (and of an nccl one
 * bootstrapped over MPI, after ncclCommAbort) with exit status code, so that ranks waiting in a collective
 * for one that failed do not wait forever. Returns at once for single and threads communicators. */
void kvp_comm_abort(kvp_comm *c, int code);

/* For a program's main path only: on every rank but 0, stdout goes to /dev/null (rank 0 alone prints the
 * answer all ranks computed). KVP_EIO when it cannot. */
kvp_status kvp_comm_quiet_other_ranks(const kvp_comm *c);

int kvp_comm_rank(const kvp_comm *c);
int kvp_comm_size(const kvp_comm *c);
const char *kvp_comm_backend(const kvp_comm *c); /* "single", "threads", "mpi" or "nccl" */
/* nccl: the CUDA device of this rank; -1 for the CPU backends. */
int kvp_comm_device(const kvp_comm *c);

/* The communicator for host-memory messages: the host plane of an nccl communicator, c itself otherwise.
 * Borrowed: valid while c is. */
kvp_comm *kvp_comm_host(kvp_comm *c);

/* ---- the communicator's memory ----------------------------------------------------------------------- */

kvp_comm_mem kvp_comm_memory(const kvp_comm *c);
/* bytes of the communicator's memory (64-byte aligned host memory; device memory on the rank's GPU for
 * nccl), released with kvp_comm_mem_free on the same communicator. bytes 0 gives a valid, unique pointer.
 * KVP_ENOMEM / KVP_ECUDA (cudaMalloc's message). */
kvp_status kvp_comm_mem_alloc(kvp_comm *c, size_t bytes, void **out);
void kvp_comm_mem_free(kvp_comm *c, void *p); /* NULL: no-op */
/* Copies between host memory and the communicator's memory; return when the copy is done (nccl: a
 * cudaMemcpyAsync on the communicator's stream, ordered after the collectives enqueued there, then a wait
 * with the timeout). */
kvp_status kvp_comm_mem_upload(kvp_comm *c, void *dst, const void *host_src, size_t bytes);
kvp_status kvp_comm_mem_download(kvp_comm *c, void *host_dst, const void *src, size_t bytes);

/* ---- streams and time limits ------------------------------------------------------------------------- */

/* nccl: later collectives go on `stream` (a cudaStream_t on the rank's device; NULL: the legacy default
 * stream) and wait for completion before returning when wait != 0. CPU backends: KVP_EINVAL unless stream
 * is NULL (they have no stream; wait is ignored). */
kvp_status kvp_comm_set_stream(kvp_comm *c, void *stream, int wait);
/* nccl: waits, up to the timeout, until the communicator's stream has drained; KVP_ENCCL for an
 * asynchronous NCCL error (ncclCommGetAsyncError), KVP_ECUDA, KVP_ETIMEDOUT. CPU backends: KVP_OK at once. */
kvp_status kvp_comm_wait(kvp_comm *c);
/* Seconds a collective may wait for the other ranks (<= 0: forever). */
void kvp_comm_set_timeout(kvp_comm *c, double seconds);
double kvp_comm_timeout(const kvp_comm *c);

/* ---- collectives (in the communicator's memory) ------------------------------------------------------ */

/* buf (n elements of dt) = the element-wise sum of every rank's buf, the same bits on every rank. */
kvp_status kvp_comm_all_reduce_sum(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt);
kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n);
/* recv (size * bytes) = rank 0's send (bytes), then rank 1's, ... on every rank. send and recv do not
 * overlap, except in place: send == recv + rank * bytes (NCCL's convention). */
kvp_status kvp_comm_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv);
/* The same in floats: send (n), recv (size * n). */
kvp_status kvp_comm_all_gather_f32(kvp_comm *c, const float *send, int64_t n, float *recv);
/* buf (bytes) on every rank = root's. */
kvp_status kvp_comm_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root);
/* The same in host memory (nccl: over the host plane), for a message that may come after a long idle
 * time: it never times out, and a waiting MPI rank looks without a pause for 2 ms, then sleeps between looks
 * (200 us) instead of spinning a core. Every rank must call this one for the message (MPI does not match
 * broadcasts of different kinds). */
kvp_status kvp_comm_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root);
/* Returns when every rank has called it (nccl: an all-reduce of one float on the stream, waited for). */
kvp_status kvp_comm_barrier(kvp_comm *c);

/* Checks that every rank holds the same value (a digest of what the ranks computed, say), over the host
 * plane: KVP_EMPI on every rank, naming what and how many ranks differ from rank 0, when they do not. */
kvp_status kvp_comm_check_same(kvp_comm *c, uint64_t value, const char *what);

#ifdef __cplusplus
}
#endif
#endif
