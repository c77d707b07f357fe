#include "common/cpu.h"

#include <stdatomic.h>

int kvp_cpu_max_lanes(void)
{
    static atomic_int lanes; /* 0 until asked once: every attention and matmul call asks */
    int n = atomic_load_explicit(&lanes, memory_order_relaxed);
    if (n == 0) {
        n = 8;
#ifdef KVP_BUILD_AVX512
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            n = 16;
#endif
        atomic_store_explicit(&lanes, n, memory_order_relaxed);
    }
    return n;
}
