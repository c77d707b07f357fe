#include "common/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"

#ifdef KVP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

static _Atomic int64_t alloc_count;
static _Atomic int64_t fail_at;
static _Atomic int64_t failures;

void kvp_alloc_fail_at(int64_t n)
{
    atomic_store(&alloc_count, 0);
    atomic_store(&fail_at, n < 0 ? 0 : n);
}

int64_t kvp_alloc_count(void) { return atomic_load(&alloc_count); }
int64_t kvp_alloc_failures(void) { return atomic_load(&failures); }

/* True when this allocation must fail by injection. */
static int injected_failure(void)
{
    int64_t k = atomic_fetch_add(&alloc_count, 1) + 1;
    int64_t f = atomic_load(&fail_at);
    if (f != 0 && k == f) {
        atomic_fetch_add(&failures, 1);
        return 1;
    }
    return 0;
}

void *kvp_malloc(size_t n)
{
    if (injected_failure()) return NULL;
    if (n == 0) n = 1;
#ifdef KVP_HAVE_JEMALLOC
    return mallocx(n, 0);
#else
    return malloc(n);
#endif
}

void *kvp_calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) return NULL;
    if (injected_failure()) return NULL;
    size_t n = count * size;
    if (n == 0) n = 1;
#ifdef KVP_HAVE_JEMALLOC
    return mallocx(n, MALLOCX_ZERO);
#else
    return calloc(1, n);
#endif
}

void *kvp_realloc(void *p, size_t n)
{
    if (p == NULL) return kvp_malloc(n);
    if (injected_failure()) return NULL;
    if (n == 0) n = 1;
#ifdef KVP_HAVE_JEMALLOC
    return rallocx(p, n, 0);
#else
    return realloc(p, n);
#endif
}

void *kvp_aligned_alloc(size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0) return NULL;
    if (injected_failure()) return NULL;
    if (n == 0) n = 1;
#ifdef KVP_HAVE_JEMALLOC
    return mallocx(n, MALLOCX_ALIGN(align));
#else
    void *p = NULL;
    return posix_memalign(&p, align, n) == 0 ? p : NULL;
#endif
}

void kvp_free(void *p)
{
    if (p == NULL) return;
#ifdef KVP_HAVE_JEMALLOC
    dallocx(p, 0);
#else
    free(p);
#endif
}

kvp_status kvp_check_fits_in_memory(double bytes, const char *what)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return KVP_OK;
    const double have = (double)pages * (double)page;
    if (bytes > have)
        return KVP_ERR(KVP_EINVAL, "%s needs %.1f GiB, more than this machine's %.1f GiB of memory", what,
                       bytes / (1 << 30), have / (1 << 30));
    return KVP_OK;
}

kvp_status kvp_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return KVP_OK;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem) return KVP_ENOMEM;
        ncap *= 2;
    }
    void *p = kvp_realloc(*arr, ncap * elem);
    if (p == NULL) return KVP_ENOMEM;
    *arr = p;
    *cap = ncap;
    return KVP_OK;
}
