/* common/cpu.h — the vector width the CPU kernels may use.
 *
 * A build for x86-64-v3 (AVX2, FMA, F16C: the Release flags) also carries 16-lane AVX-512 kernels, compiled
 * for that target function by function (KVP_BUILD_AVX512); they run only where the CPU has AVX-512F, BW and
 * VL (every AVX-512 CPU since Skylake-SP and Zen 4: the fp8 loads work on 16-bit lanes). */
#ifndef KVP_COMMON_CPU_H
#define KVP_COMMON_CPU_H

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVP_BUILD_AVX512 1
#endif

/* 16 where this build carries the AVX-512 kernels and the CPU has AVX-512F, BW and VL, else 8. */
int kvp_cpu_max_lanes(void);

#endif
