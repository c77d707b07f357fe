/* parallel/comm.h — communicators for tensor parallelism: `size` ranks that sum, gather and broadcast
 * buffers (docs/parallel.md). Every rank makes the same collective calls in the same order and sizes; one
 * thread uses a communicator at a time; pointers are borrowed for the call; a failed create frees all.
 * Backends: single; threads (of one process); mpi (a process per rank); nccl (a GPU per rank, bootstrapped
 * over a host communicator); KVP_EUNSUPPORTED, naming what is missing, when not built in. An all-reduce
 * gives the same bits on every rank, so ranks agree without exchanging decisions. Collectives work in the
 * communicator's memory (host; nccl: the rank's GPU, host messages over kvp_comm_host), for nccl on its
 * stream after the work already there.
 *
 * Errors: KVP_EINVAL (arguments, checked before any exchange; a malformed KVPAGE_COMM_TIMEOUT), KVP_ENOMEM,
 * KVP_EMPI / KVP_ENCCL / KVP_ECUDA (the library's message), KVP_ENODEVICE, and KVP_ETIMEDOUT naming the
 * ranks that came, after KVPAGE_COMM_TIMEOUT seconds (read at creation, 0: forever; default
 * KVP_COMM_DEFAULT_TIMEOUT_S). After a failed collective every call returns KVP_ESTATE naming it: destroy,
 * and end the job with kvp_comm_abort. */
#ifndef KVP_PARALLEL_COMM_H
#define KVP_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_comm kvp_comm;

/* bf16: a float's upper 16 bits (uint16_t); CPU backends round the float sum once, NCCL at each ring step. */
typedef enum { KVP_COMM_F32 = 0, KVP_COMM_BF16 = 1 } kvp_comm_dtype;

typedef enum { KVP_COMM_MEM_HOST = 0, KVP_COMM_MEM_DEVICE = 1 } kvp_comm_mem;

enum { KVP_COMM_MAX_THREADS = 64 };
#define KVP_COMM_DEFAULT_TIMEOUT_S 600.0
#define KVP_COMM_TIMEOUT_ENV "KVPAGE_COMM_TIMEOUT"

kvp_status kvp_comm_single_create(kvp_comm **out);
/* n ranks (1 .. KVP_COMM_MAX_THREADS): comms[r] is rank r's, owned by the caller (destroy each). */
kvp_status kvp_comm_threads_create(int n, kvp_comm **comms);
/* MPI_COMM_WORLD, initializing MPI if nobody has (destroy then finalizes it). expected_size > 0: KVP_EINVAL
 * naming both numbers unless the world has that many ranks (one without mpirun). */
kvp_status kvp_comm_mpi_create(int expected_size, kvp_comm **out);

int kvp_comm_have_mpi(void);
/* Nonzero when NCCL and CUDA are built in (or a test's table, nccl_api.h); else *why (may be NULL) says
 * what is missing. Says nothing about GPUs. */
int kvp_comm_have_nccl(const char **why);

/* This rank's nccl communicator on `device` (>= 0); every rank of `host` calls it together. Success: the
 * result owns host; failure: host stays the caller's and usable. KVP_ENODEVICE names the device and how
 * many exist; KVP_ENCCL "Duplicate GPU detected" when two ranks share a GPU. When another rank fails,
 * every rank returns its status naming it (KVP_ESTATE above 64 ranks). */
kvp_status kvp_comm_nccl_create(kvp_comm *host, int device, kvp_comm **out);
/* kvp_comm_mpi_create, then kvp_comm_nccl_create; device < 0: the rank's index on its node. */
kvp_status kvp_comm_nccl_mpi_create(int expected_size, int device, kvp_comm **out);
/* n GPUs devices[0..n) (NULL: 0 .. n-1), a thread each over a threads host plane; comms as above. */
kvp_status kvp_comm_nccl_threads_create(int n, const int *devices, kvp_comm **comms);

void kvp_comm_destroy(kvp_comm *c); /* NULL: no-op */

/* Main path only, never library code: exits every rank of an MPI job (after ncclCommAbort) with `code`,
 * so none waits on a failed one. Returns at once for single and threads; threads (and nccl over threads)
 * breaks the group first: every rank's pending and later collective returns KVP_ESTATE, so the other
 * threads do not wait on a rank that gave up. */
void kvp_comm_abort(kvp_comm *c, int code);
kvp_status kvp_comm_quiet_other_ranks(const kvp_comm *c); /* main path: stdout of ranks > 0 to /dev/null */

int kvp_comm_rank(const kvp_comm *c);
int kvp_comm_size(const kvp_comm *c);
const char *kvp_comm_backend(const kvp_comm *c); /* "single", "threads", "mpi" or "nccl" */
int kvp_comm_device(const kvp_comm *c);          /* nccl: the rank's CUDA device; else -1 */
kvp_comm *kvp_comm_host(kvp_comm *c);            /* nccl: the host plane; else c. Valid while c is */

/* ---- the communicator's memory ----------------------------------------------------------------------- */

kvp_comm_mem kvp_comm_memory(const kvp_comm *c);
/* 64-byte aligned host memory, or the rank's GPU memory; bytes 0 gives a unique pointer. KVP_ECUDA. */
kvp_status kvp_comm_mem_alloc(kvp_comm *c, size_t bytes, void **out);
void kvp_comm_mem_free(kvp_comm *c, void *p); /* NULL: no-op */
/* Return when copied (nccl: on the stream, after its collectives, within the timeout). */
kvp_status kvp_comm_mem_upload(kvp_comm *c, void *dst, const void *host_src, size_t bytes);
kvp_status kvp_comm_mem_download(kvp_comm *c, void *host_dst, const void *src, size_t bytes);

/* ---- streams and time limits ------------------------------------------------------------------------- */

/* nccl: later collectives go on `stream` (cudaStream_t; NULL, the start: the legacy default stream); with
 * wait 0 they return once enqueued, pointers borrowed until kvp_comm_wait. CPU: KVP_EINVAL unless NULL. */
kvp_status kvp_comm_set_stream(kvp_comm *c, void *stream, int wait);
/* nccl: waits for the stream to drain; KVP_ENCCL (asynchronous error), KVP_ECUDA, KVP_ETIMEDOUT. CPU: OK. */
kvp_status kvp_comm_wait(kvp_comm *c);
void kvp_comm_set_timeout(kvp_comm *c, double seconds); /* <= 0: wait forever */
double kvp_comm_timeout(const kvp_comm *c);

/* ---- collectives (in the communicator's memory) ------------------------------------------------------ */

/* buf (n elements of dt) = the element-wise sum over ranks, the same bits on every rank. */
kvp_status kvp_comm_all_reduce_sum(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt);
kvp_status kvp_comm_all_reduce_sum_f32(kvp_comm *c, float *buf, int64_t n);
/* recv (size * bytes) = rank 0's send (bytes), rank 1's, ...; no overlap except send == recv + rank*bytes. */
kvp_status kvp_comm_all_gather(kvp_comm *c, const void *send, int64_t bytes, void *recv);
kvp_status kvp_comm_all_gather_f32(kvp_comm *c, const float *send, int64_t n, float *recv); /* recv: size*n */
kvp_status kvp_comm_broadcast(kvp_comm *c, void *buf, int64_t bytes, int root); /* buf = root's */
/* In host memory (nccl: the host plane), for a message after an idle wait: never times out, does not spin
 * a core. Every rank must use this call for the message. */
kvp_status kvp_comm_broadcast_idle(kvp_comm *c, void *buf, int64_t bytes, int root);
kvp_status kvp_comm_barrier(kvp_comm *c); /* returns once every rank has called it */
/* Over the host plane: KVP_EMPI on every rank, naming `what` and how many ranks differ from rank 0, unless
 * all hold the same value (a digest, say). */
kvp_status kvp_comm_check_same(kvp_comm *c, uint64_t value, const char *what);

#ifdef __cplusplus
}
#endif
#endif
