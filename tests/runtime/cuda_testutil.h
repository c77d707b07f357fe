/* tests/runtime/cuda_testutil.h — the opened device of a suite over cuda_dev.h (the tests/runtime suites named
 * _cuda.c) and its host copies: open_dev (or a skip where there is no device: a native build without a GPU), up,
 * down, frand. One test file includes it (its statics are the file's). Asserts through common/kvp_test.h. */
#ifndef KVP_TESTS_RUNTIME_CUDA_TESTUTIL_H
#define KVP_TESTS_RUNTIME_CUDA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvp_test.h"
#include "runtime/executor/cuda/cuda_dev.h"

static kvp_cudev *dev;
static kvp_cudev_info dev_info; /* of the last open_dev */

/* Opens device 0 into dev, or skips the test where there is none. */
static inline void open_dev(void)
{
    int n;
    if (kvp_cudev_count(&n) != KVP_OK) cr_skip_test("%s", kvp_error_message());
    cr_assert_eq(kvp_cudev_open(0, &dev, &dev_info), KVP_OK, "%s", kvp_error_detail());
}

static inline void close_dev(void)
{
    kvp_cudev_close(dev);
    dev = NULL;
}

/* A device copy of h (bytes), the test's to free. */
static inline void *up(const void *h, size_t bytes)
{
    void *d;
    cr_assert_eq(kvp_cudev_malloc(dev, &d, bytes, "test"), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_cudev_copy(dev, d, h, bytes, 0), KVP_OK);
    return d;
}

/* h = the device's d (bytes), after the compute stream's work. */
static inline void down(void *h, const void *d, size_t bytes)
{
    cr_assert_eq(kvp_cudev_copy(dev, h, d, bytes, 1), KVP_OK);
    cr_assert_eq(kvp_cudev_sync(dev, 0), KVP_OK, "%s", kvp_error_detail());
}

/* Uniform in [-1, 1) from a fixed xorshift sequence. */
static inline float frand(void)
{
    static uint64_t rng = 88172645463325252ull;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

#endif
