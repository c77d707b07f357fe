/* common/alloc.h — host allocation through jemalloc, with a failure-injection hook for tests.
 *
 * kvp_malloc/kvp_calloc/kvp_realloc/kvp_aligned_alloc return NULL on failure (never abort); memory from
 * them is released with kvp_free (NULL is a no-op). Zero-byte requests return a unique non-NULL pointer.
 * In the sanitizer build the C library's allocator (ASan's) is used instead of jemalloc.
 *
 * Failure injection (tests only): kvp_alloc_fail_at(n) makes the n-th allocation from now fail (n >= 1),
 * and only that one; kvp_alloc_fail_at(0) disables it. kvp_alloc_count() counts allocations since the
 * last kvp_alloc_fail_at call, so a test can run an operation once to learn how many allocations it makes,
 * then fail each of them in turn:
 *
 *     for (int64_t n = 1;; n++) { kvp_alloc_fail_at(n); st = op(); if (kvp_alloc_count() < n) break; ... }
 */
#ifndef KVP_COMMON_ALLOC_H
#define KVP_COMMON_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

void *kvp_malloc(size_t n);
void *kvp_calloc(size_t count, size_t size); /* zeroed; NULL when count*size overflows */
void *kvp_realloc(void *p, size_t n);        /* on failure p is untouched and still owned by the caller */
void *kvp_aligned_alloc(size_t align, size_t n); /* align: power of two >= sizeof(void*) */
void kvp_free(void *p);

void kvp_alloc_fail_at(int64_t n);
int64_t kvp_alloc_count(void);
/* Number of injected failures so far (since process start). */
int64_t kvp_alloc_failures(void);

/* KVP_EINVAL naming `what` when `bytes` exceed this machine's physical memory (a size that could only end
 * with the OOM killer); KVP_OK otherwise, or when the machine does not say its memory size. */
kvp_status kvp_check_fits_in_memory(double bytes, const char *what);

/* Grow an array to hold at least `need` elements of `elem` bytes (capacity doubles). KVP_ENOMEM on
 * failure with *arr and *cap unchanged. */
kvp_status kvp_grow(void **arr, size_t *cap, size_t need, size_t elem);

#endif
