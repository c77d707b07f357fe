#include "common/cpu.h"

int kvp_cpu_max_lanes(void)
{
#ifdef KVP_BUILD_AVX512
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 16;
#endif
    return 8;
}
