/* common/cpu.h — the vector width the CPU kernels may use. An x86-64-v3 build (the Release flags) also
 * carries 16-lane AVX-512 kernels, compiled per function (KVP_BUILD_AVX512), run only where the CPU has
 * AVX-512F, BW and VL (every AVX-512 CPU since Skylake-SP and Zen 4). */
#ifndef KVP_COMMON_CPU_H
#define KVP_COMMON_CPU_H

#ifdef __cplusplus
extern "C" { /* C++: the CUDA files (attention/cuda/, the CUDA emulator) */
#endif

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVP_BUILD_AVX512 1
#endif

int kvp_cpu_max_lanes(void); /* 16 where those kernels can run, else 8 */

#ifdef __cplusplus
}
#endif

#endif
