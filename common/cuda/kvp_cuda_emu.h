/* common/cuda/kvp_cuda_emu.h — kvpage's CPU emulator of CUDA: what a .cu file sees when it is compiled by the
 * host C++ compiler with -DKVPAGE_CUDA_EMU (through common/cuda/kvp_cuda.h; never include this directly).
 *
 * How a launch runs (common/cuda/cuda_emu.cpp):
 *
 *   KVP_LAUNCH(k, grid, block, shmem, stream, args...)
 *     -> checks the configuration as CUDA does (threads 1..1024, block.z <= 64, grid.y/z <= 65535,
 *        dynamic shared memory <= the kernel's limit: 48 KiB, or what cudaFuncSetAttribute raised it to,
 *        at most 227 KiB); a bad one sets cudaGetLastError and runs nothing
 *     -> the grid's blocks are taken in order by a pool of OS threads (KVPAGE_EMU_THREADS, default
 *        min(4, CPUs)), one block per OS thread at a time
 *     -> a block's threads are fibers (ucontext, KVPAGE_EMU_STACK bytes each, default 64 KiB) on that OS
 *        thread. Fiber 0 runs until it reaches a synchronization point, then the next live fiber resumes:
 *
 *          fiber:   0     1     2   ...   n-1    0     1  ...
 *                 ----> ----> ---->     ---->  ---->            (each arrow: run to the next barrier,
 *                  __syncthreads: the last fiber to arrive       shuffle, vote or __syncwarp, or to the end)
 *                  releases the barrier and runs on
 *
 *        so the code between two synchronization points of one thread runs without interruption, and a
 *        kernel that omits a needed barrier reads stale or poisoned data, as it would on a GPU.
 *   - __syncthreads: a barrier over the block's live fibers (exited threads count as arrived, as on sm_70+).
 *   - Warp operations are warp-scoped: lanes 32w .. 32w+31 exchange values only among themselves (a partial
 *     last warp has fewer lanes); every participating lane deposits its value, the last to arrive releases
 *     the warp, then each reads its source lane's value (double-buffered, so a fast lane cannot overwrite a
 *     value a slow lane has yet to read).
 *   - Shared memory is per block: KVP_SHARED arrays live in a per-OS-thread arena (48 KiB), reset and
 *     filled with 0xFF bytes (NaN as float) at the start of every block; the dynamic part
 *     (KVP_EXTERN_SHARED) likewise.
 *   - A deadlock (every live fiber waiting, e.g. a __syncthreads inside a branch some threads skip, or a
 *     shuffle whose lanes wait at different points) or __trap() ends the launch with cudaErrorLaunchFailure
 *     and a message on stderr naming the kernel.
 *   - Device memory is host memory (cudaMalloc: 256-byte aligned); cudaMemGetInfo reports
 *     KVPAGE_EMU_DEVICE_MEM bytes (default 8 GiB; suffixes K, M, G) minus what is allocated; cudaMemcpy
 *     checks that its device side lies inside one allocation. Launches, copies and memsets run to completion
 *     before the call returns (every stream is synchronous); events record the host clock.
 *   - Stream capture (CUDA graphs), on streams made by cudaStreamCreate(WithFlags):
 *
 *       cudaStreamBeginCapture(s, mode)        s records instead of running:
 *         KVP_LAUNCH(k, ..., s, args...)  ->   kernel node: grid, block, shared bytes and a copy of args taken
 *         cudaMemcpyAsync / cudaMemsetAsync    now (as CUDA copies kernel parameters); copy and memset nodes
 *         (also cudaMemcpy2DAsync, a graph      keep their pointers: the bytes are read when the node runs
 *          launched into s, cudaEventRecord)
 *       cudaStreamEndCapture(s, &graph)    ->  the nodes in issue order (a chain: one stream, no fork/join)
 *       cudaGraphInstantiate(&exec, graph, flags); cudaGraphLaunch(exec, s2): runs the nodes in order, now
 *
 *     What CUDA refuses during a capture fails here too and invalidates the capture (cudaStreamIsCapturing
 *     says cudaStreamCaptureStatusInvalidated; later work on s fails with cudaErrorStreamCaptureInvalidated,
 *     and cudaStreamEndCapture returns that error and a NULL graph): synchronizing or querying the capturing
 *     stream (cudaErrorStreamCaptureUnsupported, any mode); the "potentially unsafe" calls cudaMemcpy,
 *     cudaMemset, cudaMemcpy2D, cudaDeviceSynchronize, cudaFree, cudaFreeHost while a Global capture is open
 *     in any thread or a ThreadLocal one in this thread (cudaErrorStreamCaptureUnsupported; Relaxed allows
 *     them); work on the legacy stream while a blocking stream captures (cudaErrorStreamCaptureImplicit); a
 *     bad launch configuration or copy on the capturing stream (its own error). cudaMalloc and cudaHostAlloc
 *     are allowed. Beginning a capture on the legacy stream fails with cudaErrorStreamCaptureUnsupported, on a
 *     capturing stream with cudaErrorIllegalState; ending one from another thread (not Relaxed) with
 *     cudaErrorStreamCaptureWrongThread; cudaEventQuery/Synchronize of an event recorded in a capture with
 *     cudaErrorCapturedEvent.
 * Limits: no asm, textures, cooperative groups, clusters or managed memory; graphs only by stream capture on
 * one stream (no cudaGraphAdd*Node, no fork/join across streams through events, no cudaMallocAsync nodes,
 * no capture on cudaStreamPerThread, no graph update); timings are meaningless;
 * floating-point results may differ from a GPU's in the last bits (no fused multiply-add contraction
 * guarantees, host libm instead of CUDA's device math).
 */
#ifndef KVP_COMMON_CUDA_KVP_CUDA_EMU_H
#define KVP_COMMON_CUDA_KVP_CUDA_EMU_H

#ifndef __cplusplus
#error "kvp_cuda_emu.h is C++: compile .cu files with the host C++ compiler"
#endif

#include <cuda_runtime_api.h> /* CUDA's own declarations and types; the emulator defines the functions */
#include <driver_types.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers (host_defines.h already maps __global__, __device__, __host__ to nothing on the host) */
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ kvp_emu_use_KVP_SHARED_instead_of___shared__
#undef __constant__
#define __constant__

namespace kvp_emu {

/* Per fiber (the current CUDA thread). */
struct thread_state {
    uint3 tid;
    int linear; /* threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z) */
};

inline thread_local thread_state *tl_thread = nullptr;
inline thread_local uint3 tl_block_idx;
inline thread_local dim3 tl_block_dim;
inline thread_local dim3 tl_grid_dim;

/* Synchronization points (cuda_emu.cpp). */
void sync_block();
int sync_block_count(int pred); /* __syncthreads_count: live threads with pred != 0 */
void sync_warp(unsigned mask);
unsigned long long warp_exchange(unsigned mask, unsigned long long bits, int src_lane, unsigned *ballot);
int lane_id();
[[noreturn]] void trap(const char *why);

/* Shared memory of the running block: the static array keyed by its declaration, the dynamic part. */
void *shared_static(const void *key, size_t bytes, size_t align);
void *shared_dynamic();

typedef void (*body_fn)(void *);
/* Runs the grid (see the header comment); sets the last error on a bad configuration or a failure. */
void launch(const char *name, const void *func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            body_fn body, void *ctx);

template <class T> inline unsigned long long to_bits(T v)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> inline T from_bits(unsigned long long b)
{
    T v;
    std::memcpy(&v, &b, sizeof v);
    return v;
}

template <class F, class Tuple> struct launch_ctx {
    F func;
    Tuple args;
};

/* Stream capture (cuda_emu.cpp): whether `stream` is capturing, so that a launch on it is recorded. */
bool capturing(cudaStream_t stream);
/* Records a launch into the capture of `stream` (or runs it, when the capture ended meanwhile). ctx is the
 * graph's from here on: free_ctx(ctx) deletes it when the last graph holding it is destroyed, or at once. */
void record_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   body_fn body, void *ctx, void (*free_ctx)(void *));

template <class C> void free_launch_ctx(void *c) { delete static_cast<C *>(c); }

template <class F, class Tuple> void run_body(void *c)
{
    auto *ctx = static_cast<launch_ctx<F, Tuple> *>(c);
    Tuple local = ctx->args; /* each thread gets its own copy of the parameters, as on a GPU */
    std::apply(ctx->func, local);
}

template <class... P, class... A>
void launch_kernel(const char *name, void (*func)(P...), dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   A &&...args)
{
    using tuple_t = std::tuple<typename std::decay<P>::type...>;
    using ctx_t = launch_ctx<void (*)(P...), tuple_t>;
    if (capturing(stream)) { /* the parameters are copied now; the graph's replays read this copy */
        record_launch(name, reinterpret_cast<const void *>(func), grid, block, shmem, stream,
                      &run_body<void (*)(P...), tuple_t>, new ctx_t{func, tuple_t(std::forward<A>(args)...)},
                      &free_launch_ctx<ctx_t>);
        return;
    }
    ctx_t ctx{func, tuple_t(std::forward<A>(args)...)};
    launch(name, reinterpret_cast<const void *>(func), grid, block, shmem, stream, &run_body<void (*)(P...), tuple_t>,
           &ctx);
}

} // namespace kvp_emu

/* ---- built-in variables */
#define threadIdx (::kvp_emu::tl_thread->tid)
#define blockIdx (::kvp_emu::tl_block_idx)
#define blockDim (::kvp_emu::tl_block_dim)
#define gridDim (::kvp_emu::tl_grid_dim)
static constexpr int warpSize = 32; /* a constant, not a macro: cudaDeviceProp has a field of that name */

#define KVP_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    ::kvp_emu::launch_kernel(#kernel, (kernel), dim3(grid), dim3(block), (size_t)(shmem_bytes), (stream), __VA_ARGS__)
#define KVP_SHARED(type, name, count)                                                                  \
    static char kvp_shkey_##name;                                                                      \
    type(&name)[count] = *reinterpret_cast<type(*)[count]>(::kvp_emu::shared_static(                  \
        &kvp_shkey_##name, sizeof(type) * (size_t)(count), alignof(type) > 16 ? alignof(type) : 16))
#define KVP_EXTERN_SHARED(type, name) type *name = reinterpret_cast<type *>(::kvp_emu::shared_dynamic())

/* Whether this process runs kernels on the emulator (1 here). */
static inline int kvp_cuda_emulated(void) { return 1; }

/* ---- synchronization */
static inline void __syncthreads() { ::kvp_emu::sync_block(); }
static inline int __syncthreads_count(int pred) { return ::kvp_emu::sync_block_count(pred); }
static inline int __syncthreads_and(int pred) { return ::kvp_emu::sync_block_count(!pred) == 0; }
static inline int __syncthreads_or(int pred) { return ::kvp_emu::sync_block_count(pred) != 0; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { ::kvp_emu::sync_warp(mask); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] static inline void __trap() { ::kvp_emu::trap("__trap()"); }

/* ---- warp shuffles and votes (width: a power of two <= 32; lanes exchange within their width segment) */
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    const int lane = ::kvp_emu::lane_id(), base = lane & ~(width - 1);
    return ::kvp_emu::from_bits<T>(::kvp_emu::warp_exchange(mask, ::kvp_emu::to_bits(v), base + (src & (width - 1)), nullptr));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    const int lane = ::kvp_emu::lane_id(), src = lane ^ lane_mask;
    const int ok = (src & ~(width - 1)) == (lane & ~(width - 1));
    return ::kvp_emu::from_bits<T>(::kvp_emu::warp_exchange(mask, ::kvp_emu::to_bits(v), ok ? src : lane, nullptr));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = ::kvp_emu::lane_id();
    const int ok = (lane & (width - 1)) + (int)delta < width;
    return ::kvp_emu::from_bits<T>(::kvp_emu::warp_exchange(mask, ::kvp_emu::to_bits(v), ok ? lane + (int)delta : lane, nullptr));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = ::kvp_emu::lane_id();
    const int ok = (lane & (width - 1)) >= (int)delta;
    return ::kvp_emu::from_bits<T>(::kvp_emu::warp_exchange(mask, ::kvp_emu::to_bits(v), ok ? lane - (int)delta : lane, nullptr));
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    unsigned ballot = 0;
    (void)::kvp_emu::warp_exchange(mask, pred != 0, -1, &ballot);
    return ballot;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, !pred) == 0; }
static inline unsigned __activemask() { return __ballot_sync(0xffffffffu, 1); }

/* ---- atomics (blocks run on several OS threads: these are real atomics) */
static inline int atomicAdd(int *a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v)
{
    return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
template <class T> static inline T kvp_emu_atomic_fadd(T *a, T v)
{
    T old, nv;
    __atomic_load(a, &old, __ATOMIC_RELAXED);
    do nv = old + v;
    while (!__atomic_compare_exchange(a, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline float atomicAdd(float *a, float v) { return kvp_emu_atomic_fadd(a, v); }
static inline double atomicAdd(double *a, double v) { return kvp_emu_atomic_fadd(a, v); }
template <class T, class F> static inline T kvp_emu_atomic_update(T *a, F f)
{
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, f(old), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline int atomicMax(int *a, int v) { return kvp_emu_atomic_update(a, [v](int o) { return o > v ? o : v; }); }
static inline unsigned atomicMax(unsigned *a, unsigned v)
{
    return kvp_emu_atomic_update(a, [v](unsigned o) { return o > v ? o : v; });
}
static inline int atomicMin(int *a, int v) { return kvp_emu_atomic_update(a, [v](int o) { return o < v ? o : v; }); }
static inline unsigned atomicMin(unsigned *a, unsigned v)
{
    return kvp_emu_atomic_update(a, [v](unsigned o) { return o < v ? o : v; });
}
static inline int atomicExch(int *a, int v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned *a, unsigned v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
static inline float atomicExch(float *a, float v)
{
    float old;
    __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
    return old;
}
static inline int atomicCAS(int *a, int cmp, int v)
{
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline unsigned atomicCAS(unsigned *a, unsigned cmp, unsigned v)
{
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}

/* ---- math and bit intrinsics that CUDA provides only on the device */
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
/* glibc's math.h declares __expf and friends as its own internal names: macros, so kernels get the C ones */
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf((x), (y))
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __mul24(int a, int b) { return a * b; }
static inline int __float2int_rn(float x) { return (int)rintf(x); }

/* ---- cudaFuncSetAttribute on a kernel (cuda_runtime.h's template form) */
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}

#endif
