/* tests/parallel/fake_nccl.h — a fake libnccl and CUDA runtime for CPU machines: the entry points of
 * parallel/nccl_api.h with NCCL's and CUDA's signatures, results and messages, emulated on host memory,
 * with the ranks of a communicator being threads of this process.
 *
 *   fake_nccl_reset(2);                    // two fake GPUs, nothing allocated, empty log
 *   kvp_nccl_api_set(fake_nccl_api());     // nccl communicators created from now on call the fake
 *   ... kvp_comm_nccl_threads_create(2, NULL, comms) ...
 *   kvp_nccl_api_set(NULL);
 *
 * What is emulated (and checked):
 *   devices   cudaSetDevice sets the calling thread's current device (0 by default, as CUDA); ordinals past
 *             the device count fail with cudaErrorInvalidDevice.
 *   memory    cudaMalloc returns host memory tagged with the current device; cudaFree of anything else
 *             fails; collectives and cudaMemcpyAsync check that their device pointers lie inside an
 *             allocation of the communicator's device (NCCL's "... is not a valid pointer" otherwise).
 *   streams   each device has a legacy default stream (NULL), fake_nccl_stream_create makes others. Work is
 *             queued per stream in order: a copy runs when it reaches the head; a collective runs when every
 *             rank has enqueued it and it is at the head of every rank's stream (NCCL's kernels wait for
 *             their peers). cudaStreamQuery reports cudaErrorNotReady while anything is queued: a rank that
 *             never calls leaves its peers' streams busy forever, as on a GPU.
 *   init      ncclCommInitRank waits (up to 20 s, a guard for the test suite) until every rank of the id has
 *             joined, then refuses two ranks on one device with NCCL's "Duplicate GPU detected : rank R and
 *             rank Q both on CUDA device B" (ncclInvalidUsage); ncclCommInitAll likewise.
 *   matching  the k-th collective of every rank of a communicator is one operation; ranks that disagree on
 *             its kind, size, type or root get an asynchronous ncclInvalidUsage naming both calls.
 *   results   all-reduce sums in rank order (bf16: rounded after each addition, as NCCL's ring does), the
 *             same bits on every rank; all-gather and broadcast copy.
 *   abort     ncclCommAbort drops the rank's queued work; ncclCommDestroy of a communicator with queued
 *             work is counted as a misuse (it would wait forever).
 *
 * Failures are injected by call name; the log records every call with the device it ran for. All state is
 * process-wide and guarded by one mutex; reset between tests. Not thread-safe against reset itself.
 */
#ifndef KVP_TESTS_FAKE_NCCL_H
#define KVP_TESTS_FAKE_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/nccl_api.h"

/* The table (static). */
const kvp_nccl_api *fake_nccl_api(void);

/* Frees every fake allocation, communicator, stream and fault; device_count fake GPUs (0 .. 64). */
void fake_nccl_reset(int device_count);

/* The next `times` calls (-1: every call) of entry point `call` ("ncclAllReduce", "cudaMalloc", ...) for
 * `device` (-1: any; a communicator's calls are for its device, the others for the thread's current one)
 * return `result`. last_error (may be NULL) becomes what ncclGetLastError says. async: for a collective,
 * the call succeeds but its communicator's ncclCommGetAsyncError turns to `result` and the work never runs;
 * for ncclCommInitRank the failure comes after every rank joined (as NCCL's own checks do). */
void fake_nccl_fail(const char *call, int device, int result, int async, const char *last_error, int times);

/* Calls of `call` for device (-1: any) since the reset. */
int fake_nccl_count(const char *call, int device);
/* Every call since the reset, "name@device" separated by spaces. Valid until the next call into the fake. */
const char *fake_nccl_log(void);
/* Position in the log of the first "call@device" at or after character `from`, -1 when absent. */
long fake_nccl_find(const char *call, int device, long from);

int64_t fake_nccl_live_allocs(void); /* cudaMalloc'd blocks not yet freed */
int fake_nccl_live_comms(void);      /* communicators neither destroyed nor aborted */
int fake_nccl_misuses(void);         /* destroy with queued work, free/destroy of unknown handles */
const char *fake_nccl_last_misuse(void);

/* Lets the fake's collectives and copies work on another CUDA runtime's memory and streams: the project's CPU
 * emulator of CUDA (common/cuda/), whose device memory is host memory and whose streams run each call to
 * completion before it returns. is_device(p, n) says whether [p, p + n) is that runtime's device memory; the
 * fake accepts it on every fake device (the emulator has one device for every rank). A stream handle the fake
 * did not make becomes, the first time a call names it, a fake stream of that call's device: its collectives
 * queue there as on the fake's own streams, after the emulator's work, which has already run. NULL (and
 * fake_nccl_reset) turns it off. */
void fake_nccl_foreign(int (*is_device)(const void *p, size_t n));

/* A non-default stream on device (the fake's cudaStream_t); destroyed by reset or fake_nccl_stream_destroy. */
void *fake_nccl_stream_create(int device);
void fake_nccl_stream_destroy(void *stream);

#endif
