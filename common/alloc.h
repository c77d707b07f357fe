/* common/alloc.h — host allocation through jemalloc (the C library's, ASan's, in the sanitizer build). The
 * allocators return NULL on failure, never abort; kvp_free releases (NULL: no-op); 0 bytes give a unique
 * pointer. Tests inject failures: kvp_alloc_fail_at(n >= 1) fails the n-th allocation from now, only it
 * (0: off), and kvp_alloc_count() counts allocations since, so a test can fail each one in turn:
 *
 *     for (int64_t n = 1;; n++) { kvp_alloc_fail_at(n); st = op(); if (kvp_alloc_count() < n) break; ... }
 */
#ifndef KVP_COMMON_ALLOC_H
#define KVP_COMMON_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" { /* C++: the CUDA files (attention/cuda/, the CUDA emulator) */
#endif

void *kvp_malloc(size_t n);
void *kvp_calloc(size_t count, size_t size); /* zeroed; NULL when count*size overflows */
void *kvp_realloc(void *p, size_t n);        /* on failure p is untouched and still owned by the caller */
void *kvp_aligned_alloc(size_t align, size_t n); /* align: power of two >= sizeof(void*) */
void kvp_free(void *p);

void kvp_alloc_fail_at(int64_t n);
int64_t kvp_alloc_count(void);
int64_t kvp_alloc_failures(void); /* injected since the process started */

/* KVP_EINVAL naming `what` when bytes exceed physical memory (the OOM killer's size); KVP_OK if unknown. */
kvp_status kvp_check_fits_in_memory(double bytes, const char *what);

/* *arr holds >= need elements of elem bytes (capacity doubles). KVP_ENOMEM: *arr, *cap unchanged. */
kvp_status kvp_grow(void **arr, size_t *cap, size_t need, size_t elem);

#ifdef __cplusplus
}
#endif

#endif
