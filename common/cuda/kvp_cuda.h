/* common/cuda/kvp_cuda.h — the one header every .cu file of kvpage includes first.
 *
 * The same kernel source builds two ways:
 *
 *   nvcc (KVPAGE_CUDA=ON, a CUDA compiler found)      host C++ compiler, -DKVPAGE_CUDA_EMU (always, when
 *     CUDA's own headers, kernels for sm_80 and sm_90  CUDA's host headers are found): the CPU emulator of
 *     KVP_LAUNCH = kernel<<<grid, block, shmem, st>>>  common/cuda/kvp_cuda_emu.h, kernels run on fibers
 *
 * What a kernel may use in both forms (and nothing else from CUDA's device side):
 *   - qualifiers __global__ __device__ __host__ __forceinline__ __restrict__ __launch_bounds__(...);
 *   - threadIdx, blockIdx, blockDim, gridDim, warpSize;
 *   - __syncthreads, __syncthreads_count/_and/_or, __syncwarp, __shfl_sync, __shfl_xor_sync, __shfl_down_sync,
 *     __shfl_up_sync, __ballot_sync, __any_sync, __all_sync (the full mask or a subset of live lanes);
 *   - atomicAdd (int, unsigned, unsigned long long, float, double), atomicMax / atomicMin (int, unsigned),
 *     atomicExch, atomicCAS (int, unsigned), kvp_atomic_max_float (CUDA has no float atomicMax);
 *     __threadfence, __threadfence_block;
 *   - KVP_SHARED(type, name, count) for `__shared__ type name[count]` (16-byte aligned; count a constant
 *     expression), KVP_EXTERN_SHARED(type, name) for the dynamic shared memory (`type *name`, once per
 *     kernel), never the bare `__shared__` keyword (the emulator rejects it at compile time);
 *   - __half, __half2, __nv_bfloat16, __nv_bfloat162, __nv_fp8_* and their conversions (CUDA's own headers),
 *     float2/float4/int4/uint4/uint2 and make_* (CUDA's vector_types.h);
 *   - math: the C functions (expf, exp2f, logf, tanhf, fmaxf, ...), __expf, __exp2f (via exp2f), __logf,
 *     __fdividef, rsqrtf, __frcp_rn, __saturatef, __int_as_float, __float_as_int, __uint_as_float,
 *     __float_as_uint, __popc, __clz, __ffs;
 *   - the runtime API declared by cuda_runtime_api.h (a subset is emulated, see kvp_cuda_emu.h);
 *   - launches only through KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...). A template
 *     kernel's name has a comma: take a pointer first (`auto *k = my_kernel<T, 128>; KVP_LAUNCH(k, ...)`).
 *     The grid and block may be dim3 values or integers.
 *
 * No inline PTX (asm) on a path the emulator compiles: guard such code with KVP_CUDA_NATIVE and keep a
 * portable path beside it. KVP_CUDA_NATIVE is 1 under nvcc (host and device passes), 0 under emulation.
 */
#ifndef KVP_COMMON_CUDA_KVP_CUDA_H
#define KVP_COMMON_CUDA_KVP_CUDA_H

#if defined(KVPAGE_CUDA_EMU)

#define KVP_CUDA_NATIVE 0
#include "common/cuda/kvp_cuda_emu.h"

#elif defined(__CUDACC__)

#define KVP_CUDA_NATIVE 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#define KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    (kernel)<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)
#define KVP_SHARED(type, name, count) __shared__ __align__(16) type name[count]
#define KVP_EXTERN_SHARED(type, name)                       \
    extern __shared__ __align__(16) unsigned char kvp_dyn_smem_[]; \
    type *name = reinterpret_cast<type *>(kvp_dyn_smem_)

/* Whether this process runs kernels on the emulator (always 0 in a native build). */
static inline int kvp_cuda_emulated(void) { return 0; }

#else
#error "common/cuda/kvp_cuda.h: compile .cu files with nvcc, or with the host C++ compiler and -DKVPAGE_CUDA_EMU"
#endif

/* float atomicMax by compare-and-swap (CUDA has none); returns the old value. */
static __device__ __forceinline__ float kvp_atomic_max_float(float *addr, float val)
{
    int *a = reinterpret_cast<int *>(addr);
    int old = *a;
    while (__int_as_float(old) < val) {
        const int seen = atomicCAS(a, old, __float_as_int(val));
        if (seen == old) break;
        old = seen;
    }
    return __int_as_float(old);
}

#endif
