/* parallel/comm_internal.h — what the communicator backends share (not part of the public API).
 *
 * A kvp_comm is a header (rank, size, timeout, failure state) plus a backend's ops and state. comm.c checks
 * the arguments and the failure state, then calls the ops; each backend lives in its own file so that a
 * program linking the static library pulls in only the backends it creates (a program that never calls
 * kvp_comm_mpi_create or kvp_comm_nccl_mpi_create needs no MPI library at run time).
 *
 *   comm.c          dispatch, single, host memory, timeouts, bf16 rounding
 *   comm_threads.c  threads (a barrier with a deadline)
 *   comm_mpi.c      mpi (nonblocking collectives polled against a deadline)
 *   comm_nccl.c     nccl over any host plane, and over threads (ncclCommInitAll)
 *   comm_nccl_mpi.c nccl bootstrapped over MPI
 *   nccl_api.c      the table of NCCL and CUDA entry points (nccl_api.h)
 */
#ifndef KVP_PARALLEL_COMM_INTERNAL_H
#define KVP_PARALLEL_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parallel/comm.h"

/* A backend. Arguments are checked by comm.c before these are called (sizes >= 0, pointers set, root in
 * range, the communicator not failed); NULL entries take comm.c's host defaults. */
typedef struct {
    const char *name;
    kvp_comm_mem mem;
    kvp_status (*all_reduce)(kvp_comm *c, void *buf, int64_t n, kvp_comm_dtype dt);
    kvp_status (*all_gather)(kvp_comm *c, const void *send, int64_t bytes, void *recv);
    kvp_status (*broadcast)(kvp_comm *c, void *buf, int64_t bytes, int root);
    kvp_status (*broadcast_idle)(kvp_comm *c, void *buf, int64_t bytes, int root); /* NULL: broadcast */
    kvp_status (*barrier)(kvp_comm *c);
    kvp_status (*wait)(kvp_comm *c);                           /* NULL: nothing is ever pending */
    kvp_status (*set_stream)(kvp_comm *c, void *stream, int wait); /* NULL: only stream NULL is valid */
    kvp_status (*mem_alloc)(kvp_comm *c, size_t bytes, void **out); /* NULL: host memory */
    void (*mem_free)(kvp_comm *c, void *p);
    kvp_status (*mem_copy)(kvp_comm *c, void *dst, const void *src, size_t bytes, int upload);
    kvp_comm *(*host)(kvp_comm *c);                            /* NULL: c itself */
    void (*abort)(kvp_comm *c, int code);                      /* NULL: nothing to end */
    void (*destroy)(kvp_comm *c);                              /* frees the backend's state, not c */
} kvp_comm_ops;

struct kvp_comm {
    const kvp_comm_ops *ops;
    int rank, size;
    int device;           /* nccl: the rank's CUDA device; -1 otherwise */
    double timeout_s;     /* <= 0: no limit */
    int failed;           /* a collective failed or timed out: the communicator is unusable */
    char failure[320];    /* what failed first */
    void *impl;           /* the backend's state */
};

/* A header for a new communicator of the given backend (timeout from KVPAGE_COMM_TIMEOUT). KVP_ENOMEM;
 * KVP_EINVAL naming the variable when it does not hold a number of seconds. */
kvp_status kvp_comm_new(const kvp_comm_ops *ops, int rank, int size, kvp_comm **out);
/* The timeout KVPAGE_COMM_TIMEOUT asks for (the default when unset). */
kvp_status kvp_comm_env_timeout(double *seconds);

/* Records the first failure of c (the current error message) so that later collectives refuse to run,
 * and returns st. */
kvp_status kvp_comm_fail(kvp_comm *c, kvp_status st);

/* Deadline arithmetic on CLOCK_MONOTONIC: kvp_comm_deadline(c) is now + timeout (or +inf without one). */
double kvp_comm_deadline(const kvp_comm *c);
/* One step of a polling loop that started at t0 (seconds): returns at once for the first ~1 ms (a busy
 * peer answers within microseconds), then yields the core, then naps nap_us between looks. */
void kvp_comm_poll_pause(double t0, double nap_us);

/* The message a rank that timed out reports: "<backend> <what> on rank R of N: no completion after S s
 * (...); KVPAGE_COMM_TIMEOUT sets the limit". Returns KVP_ETIMEDOUT. */
kvp_status kvp_comm_timeout_error(kvp_comm *c, const char *what, const char *detail);

static inline size_t kvp_comm_dtype_bytes(kvp_comm_dtype dt) { return dt == KVP_COMM_BF16 ? 2 : 4; }

/* bf16 <-> f32 (bf16 = the upper half of the float, rounded to nearest-even; NaN stays NaN). */
static inline float kvp_comm_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t kvp_comm_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* mpi: this rank's index and the number of ranks on its node (MPI_COMM_TYPE_SHARED). */
kvp_status kvp_comm_mpi_local_rank(kvp_comm *mpi, int *local_rank, int *local_size);

#endif
