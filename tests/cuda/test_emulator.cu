// tests/cuda/test_emulator.cu — the CUDA emulator's semantics (common/cuda/kvp_cuda_emu.h), checked by kernels
// whose results are known. The same file runs natively on a GPU (cuda_test_emulator), where it checks that
// the emulator's answers are CUDA's; the tests marked "emulator only" test what a GPU leaves undefined.
#include "common/cuda/kvp_cuda.h"
#include "common/kvp_test.h"
#include "common/kvp_cuda_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <thread>

#define CK(call) cr_assert_eq((call), cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

template <class T> static T *dalloc(size_t n)
{
    void *p = nullptr;
    CK(cudaMalloc(&p, n * sizeof(T)));
    CK(cudaMemset(p, 0, n * sizeof(T)));
    return static_cast<T *>(p);
}

template <class T> static void d2h(T *h, const T *d, size_t n) { CK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost)); }

// ---- barriers

// out[b][t] after `rounds` rotations through shared memory: round r reads the neighbour's value of round r-1.
__global__ void rotate_kernel(int *out, int rounds, int with_barrier)
{
    KVP_SHARED(int, s, 1024);
    const int t = threadIdx.x, n = blockDim.x;
    int v = t + 1000 * (int)blockIdx.x;
    for (int r = 0; r < rounds; r++) {
        s[t] = v;
        if (with_barrier) __syncthreads();
        v = s[(t + 1) % n];
        if (with_barrier) __syncthreads();
    }
    out[blockIdx.x * n + t] = v;
}

static void check_rotate(int blocks, int n, int rounds)
{
    int *d = dalloc<int>((size_t)blocks * n);
    auto *k = rotate_kernel;
    KVP_LAUNCH(k, blocks, n, 0, (cudaStream_t)0, d, rounds, 1);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    int *h = (int *)malloc(sizeof(int) * (size_t)blocks * n);
    d2h(h, d, (size_t)blocks * n);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++)
            cr_assert_eq(h[b * n + t], (t + rounds) % n + 1000 * b, "blocks %d threads %d rounds %d: [%d][%d] = %d", blocks,
                         n, rounds, b, t, h[b * n + t]);
    free(h);
    CK(cudaFree(d));
}

Test(cuda_emu, barrier_rotation)
{
    KVP_REQUIRE_DEVICE();
    check_rotate(1, 256, 1);
    check_rotate(3, 1024, 5);
    check_rotate(7, 33, 40); // a partial last warp
    check_rotate(2, 1, 3);
}

#if !KVP_CUDA_NATIVE
// Emulator only: without the barriers a thread reads its neighbour's slot before the neighbour wrote it (the
// emulator runs each thread to its next synchronization point), so the answer must be wrong. This is what
// makes a missing __syncthreads in a kernel visible to the emulated tests.
Test(cuda_emu, missing_barrier_gives_wrong_answer)
{
    KVP_REQUIRE_DEVICE();
    const int n = 128;
    int *d = dalloc<int>(n);
    auto *k = rotate_kernel;
    KVP_LAUNCH(k, 1, n, 0, (cudaStream_t)0, d, 1, 0);
    CK(cudaGetLastError());
    int h[128], wrong = 0;
    d2h(h, d, n);
    for (int t = 0; t < n; t++) wrong += h[t] != (t + 1) % n;
    cr_assert_geq(wrong, n - 1, "only %d of %d threads read a stale value without __syncthreads", wrong, n);
    CK(cudaFree(d));
}

// Emulator only (a GPU may hang): a barrier that only some threads reach is reported as a launch failure.
__global__ void divergent_barrier_kernel(int *out)
{
    if (threadIdx.x < 16) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1;
}

Test(cuda_emu, deadlock_is_a_launch_failure)
{
    KVP_REQUIRE_DEVICE();
    int *d = dalloc<int>(64);
    auto *k = divergent_barrier_kernel;
    KVP_LAUNCH(k, 1, 64, 0, (cudaStream_t)0, d);
    cr_assert_eq(cudaGetLastError(), cudaErrorLaunchFailure);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "the error is reported once");
    CK(cudaFree(d));
}

// Emulator only: copies check that their device side is device memory.
Test(cuda_emu, memcpy_checks_device_pointers)
{
    KVP_REQUIRE_DEVICE();
    int host[4] = {1, 2, 3, 4}, other[4];
    int *d = dalloc<int>(4);
    cr_assert_eq(cudaMemcpy(other, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidValue);
    cr_assert_eq(cudaMemcpy(d + 1, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue, "runs past the end");
    CK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
    cr_assert_eq(cudaFree(host), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CK(cudaFree(d));
    cr_assert_eq(kvp_cuda_emulated(), 1);
}
#endif

__global__ void count_kernel(int *out)
{
    const int t = threadIdx.x;
    const int c = __syncthreads_count(t % 3 == 0);
    const int a = __syncthreads_and(t < 1000);
    const int o = __syncthreads_or(t == 5);
    const int none = __syncthreads_or(0);
    out[t] = c * 1000 + a * 100 + o * 10 + none;
}

Test(cuda_emu, syncthreads_count_and_or)
{
    KVP_REQUIRE_DEVICE();
    const int n = 200;
    int *d = dalloc<int>(n), h[200];
    auto *k = count_kernel;
    KVP_LAUNCH(k, 1, n, 0, (cudaStream_t)0, d);
    CK(cudaGetLastError());
    d2h(h, d, n);
    for (int t = 0; t < n; t++) cr_assert_eq(h[t], 67 * 1000 + 100 + 10, "thread %d: %d", t, h[t]);
    CK(cudaFree(d));
}

// ---- warp-scoped shuffles and votes

// Per thread: 8 results of shuffles and votes on v = thread index.
__global__ void shuffle_kernel(int *out)
{
    const unsigned full = 0xffffffffu;
    const int t = threadIdx.x;
    int *o = out + 8 * t;
    o[0] = __shfl_sync(full, t, 0);          // lane 0 of this thread's warp
    o[1] = __shfl_xor_sync(full, t, 1);      // the neighbour
    o[2] = __shfl_down_sync(full, t, 1);     // lane + 1, lane 31 keeps its own
    o[3] = __shfl_up_sync(full, t, 1);       // lane - 1, lane 0 keeps its own
    int s = t;
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(full, s, m);
    o[4] = s;                                // sum over the warp
    o[5] = (int)__ballot_sync(full, t == 31 || t == 32); // lane 31 and lane 32 are in different warps
    o[6] = __any_sync(full, t == 40) * 10 + __all_sync(full, t < 32);
    o[7] = __shfl_xor_sync(full, t, 8, 16);  // within 16-lane segments
}

Test(cuda_emu, shuffles_and_votes_are_warp_scoped)
{
    KVP_REQUIRE_DEVICE();
    const int n = 96;
    int *d = dalloc<int>(8 * n), h[8 * 96];
    auto *k = shuffle_kernel;
    KVP_LAUNCH(k, 1, n, 0, (cudaStream_t)0, d);
    CK(cudaGetLastError());
    d2h(h, d, 8 * n);
    for (int t = 0; t < n; t++) {
        const int w = t / 32, lane = t % 32, *o = h + 8 * t;
        cr_assert_eq(o[0], 32 * w, "thread %d: shfl from lane 0 gave %d", t, o[0]);
        cr_assert_eq(o[1], t ^ 1, "thread %d: shfl_xor 1 gave %d", t, o[1]);
        cr_assert_eq(o[2], lane == 31 ? t : t + 1, "thread %d: shfl_down 1 gave %d", t, o[2]);
        cr_assert_eq(o[3], lane == 0 ? t : t - 1, "thread %d: shfl_up 1 gave %d", t, o[3]);
        cr_assert_eq(o[4], 32 * 32 * w + 496, "thread %d: warp sum %d", t, o[4]);
        cr_assert_eq((unsigned)o[5], w == 0 ? 1u << 31 : w == 1 ? 1u : 0u, "thread %d: ballot %x", t, o[5]);
        cr_assert_eq(o[6], (w == 1 ? 10 : 0) + (w == 0 ? 1 : 0), "thread %d: any/all %d", t, o[6]);
        cr_assert_eq(o[7], t ^ 8, "thread %d: shfl_xor 8 width 16 gave %d", t, o[7]);
    }
    CK(cudaFree(d));
}

// Threads of a 3-D block: warps are formed from the linear index x + X * (y + Y * z).
__global__ void dims_kernel(int *out)
{
    const int lin = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + lin] = __shfl_sync(0xffffffffu, lin, 0) * 1000 + (int)(threadIdx.z * 100 + threadIdx.y * 10 + threadIdx.x);
}

Test(cuda_emu, multidimensional_blocks_and_grids)
{
    KVP_REQUIRE_DEVICE();
    const dim3 grid(2, 3, 2), block(8, 4, 2);
    const int nt = 64, nb = 12;
    int *d = dalloc<int>(nt * nb), h[64 * 12];
    auto *k = dims_kernel;
    KVP_LAUNCH(k, grid, block, 0, (cudaStream_t)0, d);
    CK(cudaGetLastError());
    d2h(h, d, nt * nb);
    for (int b = 0; b < nb; b++)
        for (int lin = 0; lin < nt; lin++) {
            const int x = lin % 8, y = lin / 8 % 4, z = lin / 32;
            cr_assert_eq(h[b * nt + lin], (lin / 32 * 32) * 1000 + z * 100 + y * 10 + x, "block %d thread %d: %d", b, lin,
                         h[b * nt + lin]);
        }
    CK(cudaFree(d));
}

// ---- shared memory

// Static shared memory is per block: every block fills it with its own id, then sums it.
__global__ void block_sum_kernel(long long *out)
{
    KVP_SHARED(long long, s, 256);
    KVP_SHARED(float, f, 3); // a second array: distinct storage
    const int t = threadIdx.x;
    s[t] = (long long)blockIdx.x * 1000000 + t;
    if (t < 3) f[t] = (float)t;
    __syncthreads();
    if (t == 0) {
        long long sum = 0;
        for (int i = 0; i < (int)blockDim.x; i++) sum += s[i];
        out[blockIdx.x] = sum + (long long)(f[0] + f[1] + f[2]);
    }
}

Test(cuda_emu, static_shared_memory_is_per_block)
{
    KVP_REQUIRE_DEVICE();
    const int nb = 64, n = 256;
    long long *d = dalloc<long long>(nb), h[64];
    auto *k = block_sum_kernel;
    KVP_LAUNCH(k, nb, n, 0, (cudaStream_t)0, d);
    CK(cudaGetLastError());
    d2h(h, d, nb);
    for (int b = 0; b < nb; b++)
        cr_assert_eq(h[b], (long long)b * 1000000 * n + n * (n - 1) / 2 + 3, "block %d: %lld", b, h[b]);
    CK(cudaFree(d));
}

// Dynamic shared memory: each block reverses its slice of in through shared memory.
__global__ void reverse_kernel(const float *in, float *out, int n_per_block)
{
    KVP_EXTERN_SHARED(float, buf);
    const float *src = in + (size_t)blockIdx.x * n_per_block;
    for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) buf[i] = src[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) out[(size_t)blockIdx.x * n_per_block + i] = buf[n_per_block - 1 - i];
}

static void check_reverse(int n_per_block, int nb)
{
    const size_t n = (size_t)n_per_block * nb;
    float *h = (float *)malloc(n * sizeof(float)), *r = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    float *din = dalloc<float>(n), *dout = dalloc<float>(n);
    CK(cudaMemcpy(din, h, n * sizeof(float), cudaMemcpyHostToDevice));
    auto *k = reverse_kernel;
    KVP_LAUNCH(k, nb, 128, (size_t)n_per_block * sizeof(float), (cudaStream_t)0, din, dout, n_per_block);
    CK(cudaGetLastError());
    d2h(r, dout, n);
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < n_per_block; i++)
            cr_assert_eq(r[(size_t)b * n_per_block + i], h[(size_t)b * n_per_block + n_per_block - 1 - i], "block %d [%d]", b, i);
    free(h), free(r);
    CK(cudaFree(din));
    CK(cudaFree(dout));
}

Test(cuda_emu, dynamic_shared_memory)
{
    KVP_REQUIRE_DEVICE();
    check_reverse(1000, 5);
    // over 48 KiB: refused until the kernel's limit is raised, as on a GPU
    const int big = 100 << 10;
    float *d = dalloc<float>(4);
    auto *k = reverse_kernel;
    KVP_LAUNCH(k, 1, 128, (size_t)big, (cudaStream_t)0, d, d, 0);
    cr_assert_neq(cudaGetLastError(), cudaSuccess, "100 KiB of dynamic shared memory without cudaFuncSetAttribute");
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    check_reverse(big / 4, 3);
    CK(cudaFree(d));
}

// ---- launch errors

__global__ void mark_kernel(int *out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 7; }

Test(cuda_emu, bad_launch_configurations_are_reported)
{
    KVP_REQUIRE_DEVICE();
    int *d = dalloc<int>(4096), h[4];
    auto *k = mark_kernel;
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    KVP_LAUNCH(k, 1, 1025, 0, (cudaStream_t)0, d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "1025 threads per block");
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "cudaGetLastError resets the error");
    KVP_LAUNCH(k, 1, dim3(32, 32, 2), 0, (cudaStream_t)0, d);
    cr_assert_eq(cudaPeekAtLastError(), cudaErrorInvalidConfiguration, "2048 threads in 3-D");
    cr_assert_eq(cudaPeekAtLastError(), cudaErrorInvalidConfiguration, "peek leaves the error");
    (void)cudaGetLastError();
    KVP_LAUNCH(k, dim3(1, 65536), 1, 0, (cudaStream_t)0, d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "grid.y 65536");
    KVP_LAUNCH(k, 0, 32, 0, (cudaStream_t)0, d);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "empty grid");
    d2h(h, d, 4);
    cr_assert_eq(h[0], 0, "a refused launch ran");
    KVP_LAUNCH(k, 4, 1024, 0, (cudaStream_t)0, d);
    CK(cudaGetLastError());
    d2h(h, d, 4);
    cr_assert_eq(h[3], 7);
    CK(cudaFree(d));
}

// ---- atomics across blocks (the emulator runs blocks on several OS threads)

__global__ void atomic_kernel(float *fsum, int *isum, int *imax, unsigned long long *usum)
{
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(fsum, 0.5f);
    atomicAdd(isum, 1);
    atomicMax(imax, g);
    atomicAdd(usum, (unsigned long long)g);
}

Test(cuda_emu, atomics)
{
    KVP_REQUIRE_DEVICE();
    float *f = dalloc<float>(1);
    int *i = dalloc<int>(2);
    unsigned long long *u = dalloc<unsigned long long>(1);
    auto *k = atomic_kernel;
    KVP_LAUNCH(k, 16, 256, 0, (cudaStream_t)0, f, i, i + 1, u);
    CK(cudaGetLastError());
    float hf;
    int hi[2];
    unsigned long long hu;
    d2h(&hf, f, 1), d2h(hi, i, 2), d2h(&hu, u, 1);
    cr_assert_eq(hf, 2048.0f);
    cr_assert_eq(hi[0], 4096);
    cr_assert_eq(hi[1], 4095);
    cr_assert_eq(hu, 4095ull * 4096 / 2);
    CK(cudaFree(f));
    CK(cudaFree(i));
    CK(cudaFree(u));
}

// ---- the fp16 / bf16 / fp8 types of CUDA's headers, in a kernel

__global__ void convert_kernel(const float *in, float *out, int n)
{
    const int t = threadIdx.x;
    if (t >= n) return;
    const float x = in[t];
    out[4 * t + 0] = __half2float(__float2half_rn(x));
    out[4 * t + 1] = __bfloat162float(__float2bfloat16_rn(x));
    __half_raw r = __nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), __NV_E4M3);
    out[4 * t + 2] = __half2float(__half(r));
    const __half2 h2 = __floats2half2_rn(x, 2.0f * x);
    out[4 * t + 3] = __low2float(__hmul2(h2, h2)) + __high2float(h2);
}

Test(cuda_emu, half_bfloat_fp8_types)
{
    KVP_REQUIRE_DEVICE();
    const float in[5] = {1.0f, -2.5f, 0.1f, 448.0f, 1000.0f};
    float *din = dalloc<float>(5), *dout = dalloc<float>(20), h[20];
    CK(cudaMemcpy(din, in, sizeof in, cudaMemcpyHostToDevice));
    auto *k = convert_kernel;
    KVP_LAUNCH(k, 1, 32, 0, (cudaStream_t)0, din, dout, 5);
    CK(cudaGetLastError());
    d2h(h, dout, 20);
    cr_assert_eq(h[0], 1.0f);
    cr_assert_eq(h[1], 1.0f);
    cr_assert_eq(h[2], 1.0f);
    cr_assert_eq(h[3], 1.0f + 2.0f);
    cr_assert_eq(h[4], -2.5f);
    cr_assert_float_eq(h[8], 0.1f, 1e-4, "half(0.1) = %g", h[8]);
    cr_assert_float_eq(h[9], 0.1f, 1e-3, "bf16(0.1) = %g", h[9]);
    cr_assert_eq(h[14], 448.0f, "fp8 448");
    cr_assert_eq(h[18], 448.0f, "fp8 saturates 1000 to 448");
    CK(cudaFree(din));
    CK(cudaFree(dout));
}

// ---- runtime API: memory info, streams, events, pinned memory

Test(cuda_emu, memory_streams_events)
{
    KVP_REQUIRE_DEVICE();
    size_t free0, total0, free1, total1;
    CK(cudaMemGetInfo(&free0, &total0));
    cr_assert_gt(total0, 0u);
    void *d = nullptr;
    const size_t n = 64u << 20;
    CK(cudaMalloc(&d, n));
    CK(cudaMemGetInfo(&free1, &total1));
    cr_assert_eq(total1, total0);
    cr_assert_leq(free1 + n, free0, "free %zu -> %zu after a %zu-byte allocation", free0, free1, n);
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    cr_assert_geq(count, 1);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cr_assert_eq(prop.warpSize, 32);
    cr_assert_geq(prop.maxThreadsPerBlock, 1024);

    cudaStream_t st;
    cudaEvent_t a, b;
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    unsigned char *pinned = nullptr, *back = nullptr;
    CK(cudaHostAlloc((void **)&pinned, 4096, cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&back, 4096, cudaHostAllocDefault));
    for (int i = 0; i < 4096; i++) pinned[i] = (unsigned char)(i * 7);
    CK(cudaEventRecord(a, st));
    CK(cudaMemcpyAsync(d, pinned, 4096, cudaMemcpyHostToDevice, st));
    CK(cudaMemsetAsync((char *)d + 100, 0xab, 10, st));
    CK(cudaMemcpyAsync(back, d, 4096, cudaMemcpyDeviceToHost, st));
    CK(cudaEventRecord(b, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaEventSynchronize(b));
    float ms = -1.0f;
    CK(cudaEventElapsedTime(&ms, a, b));
    cr_assert_geq(ms, 0.0f);
    for (int i = 0; i < 4096; i++)
        cr_assert_eq(back[i], i >= 100 && i < 110 ? 0xab : (unsigned char)(i * 7), "byte %d", i);
    CK(cudaFreeHost(pinned));
    CK(cudaFreeHost(back));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(st));
    CK(cudaFree(d));
    cr_assert_str_eq(cudaGetErrorString(cudaSuccess), "no error");
}

// ---- CUDA graphs by stream capture

// out[i] = a * in[i] + b
__global__ void axpb_kernel(int *out, const int *in, int a, int b, int n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = a * in[i] + b;
}

__global__ void add_kernel(int *x, int v, int n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] += v;
}

__global__ void mul_kernel(int *x, int v, int n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] *= v;
}

// A launch on a capturing stream runs nothing; replays use the parameters as they were at capture (the host
// variable changed after it does not matter) and device memory as it is at replay.
Test(cuda_emu, graph_replays_captured_parameters)
{
    KVP_REQUIRE_DEVICE();
    const int n = 100;
    int *in = dalloc<int>(n), *out = dalloc<int>(n), h[100], back[100];
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusNone);
    int a = 3;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusActive);
    auto *k = axpb_kernel;
    KVP_LAUNCH(k, 2, 64, 0, st, out, (const int *)in, a, 7, n);
    CK(cudaGetLastError());
    a = 100; // after the capture: the graph keeps 3
    cudaGraph_t g = nullptr;
    CK(cudaStreamEndCapture(st, &g));
    cr_assert_not_null(g);
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusNone);
    d2h(back, out, n);
    for (int i = 0; i < n; i++) cr_assert_eq(back[i], 0, "the captured launch ran at capture: out[%d] = %d", i, back[i]);
    cudaGraphExec_t x = nullptr;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphDestroy(g)); // the executable graph stands alone
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++) h[i] = round == 0 ? i : 1000 - 7 * i;
        CK(cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice));
        CK(cudaGraphLaunch(x, st));
        CK(cudaStreamSynchronize(st));
        d2h(back, out, n);
        for (int i = 0; i < n; i++)
            cr_assert_eq(back[i], 3 * h[i] + 7, "round %d: out[%d] = %d, want %d (a = %d at capture)", round, i, back[i],
                         3 * h[i] + 7, 3);
    }
    CK(cudaGraphExecDestroy(x));
    CK(cudaStreamDestroy(st));
    CK(cudaFree(in));
    CK(cudaFree(out));
}

// Nodes run in issue order: a copy from pinned host memory (read at replay), +1, x2, a memset, copies back.
Test(cuda_emu, graph_runs_copies_memsets_kernels_in_order)
{
    KVP_REQUIRE_DEVICE();
    const int n = 50;
    int *hin, *hout, *d = dalloc<int>(n);
    unsigned char *hbytes, *dbytes;
    CK(cudaHostAlloc((void **)&hin, n * sizeof(int), cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&hout, n * sizeof(int), cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&hbytes, 64, cudaHostAllocDefault));
    CK(cudaMalloc((void **)&dbytes, 64));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemcpyAsync(d, hin, n * sizeof(int), cudaMemcpyHostToDevice, st));
    auto *add = add_kernel;
    auto *mul = mul_kernel;
    KVP_LAUNCH(add, 1, 64, 0, st, d, 1, n);
    KVP_LAUNCH(mul, 1, 64, 0, st, d, 2, n);
    CK(cudaMemsetAsync(dbytes + 8, 0x5a, 40, st));
    CK(cudaMemcpyAsync(hout, d, n * sizeof(int), cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(hbytes, dbytes, 64, cudaMemcpyDeviceToHost, st));
    CK(cudaGetLastError());
    cudaGraph_t g;
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++) hin[i] = 5 * i - 40 + round, hout[i] = -1;
        memset(hbytes, 0, 64);
        CK(cudaMemset(dbytes, 0x11, 64));
        CK(cudaGraphLaunch(x, st));
        CK(cudaStreamSynchronize(st));
        for (int i = 0; i < n; i++)
            cr_assert_eq(hout[i], (hin[i] + 1) * 2, "round %d: [%d] = %d, want (x + 1) * 2 = %d", round, i, hout[i],
                         (hin[i] + 1) * 2);
        for (int i = 0; i < 64; i++)
            cr_assert_eq(hbytes[i], i >= 8 && i < 48 ? 0x5a : 0x11, "round %d: byte %d = %#x", round, i, hbytes[i]);
    }
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    CK(cudaFreeHost(hin));
    CK(cudaFreeHost(hout));
    CK(cudaFreeHost(hbytes));
    CK(cudaFree(dbytes));
    CK(cudaFree(d));
}

// Ends a capture that must have been invalidated: the error, no graph, and the stream usable again.
static void end_invalidated(cudaStream_t st, const char *what)
{
    cudaStreamCaptureStatus cs;
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusInvalidated, "%s: the capture is not invalidated (%d)", what, (int)cs);
    cudaGraph_t g = (cudaGraph_t)&cs;
    cr_assert_eq(cudaStreamEndCapture(st, &g), cudaErrorStreamCaptureInvalidated, "%s", what);
    cr_assert_null(g, "%s: a graph from an invalidated capture", what);
    (void)cudaGetLastError();
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusNone);
}

// What CUDA refuses during a capture, refused with CUDA's errors; what it allows, allowed.
Test(cuda_emu, capture_refuses_what_cuda_refuses)
{
    KVP_REQUIRE_DEVICE();
    int *d = dalloc<int>(64), h[64] = {0};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cr_assert_eq(cudaStreamEndCapture(st, &g), cudaErrorIllegalState, "ending a capture never begun");
    (void)cudaGetLastError();
    cr_assert_eq(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();

    // allowed: cudaMalloc; refused: a second begin, synchronizing the capturing stream (any mode)
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cr_assert_eq(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    (void)cudaGetLastError();
    void *p = nullptr;
    CK(cudaMalloc(&p, 256));
    cudaStreamCaptureStatus cs;
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusActive, "cudaMalloc invalidated the capture");
    cr_assert_eq(cudaStreamSynchronize(st), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    auto *add = add_kernel;
    KVP_LAUNCH(add, 1, 64, 0, st, d, 1, 64);
    cr_assert_eq(cudaGetLastError(), cudaErrorStreamCaptureInvalidated, "work on an invalidated capture");
    end_invalidated(st, "cudaStreamSynchronize");
    CK(cudaFree(p));

    // Global: a synchronous copy and cudaDeviceSynchronize are refused
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    end_invalidated(st, "cudaMemcpy in a Global capture");
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cr_assert_eq(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    end_invalidated(st, "cudaDeviceSynchronize in a Global capture");

    // Relaxed: the synchronous copy is allowed (a non-blocking stream captures: the legacy stream does not wait for it)
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusActive);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphDestroy(g));

    // a bad launch configuration on the capturing stream fails and invalidates the capture
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    KVP_LAUNCH(add, 1, 2048, 0, st, d, 1, 64);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    end_invalidated(st, "a bad launch configuration");

    // a blocking stream capturing: work on the legacy stream would depend on it
    cudaStream_t blocking;
    CK(cudaStreamCreate(&blocking));
    CK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
    cr_assert_eq(cudaMemsetAsync(d, 0, sizeof h, (cudaStream_t)0), cudaErrorStreamCaptureImplicit);
    (void)cudaGetLastError();
    end_invalidated(blocking, "legacy-stream work during a blocking stream's capture");
    CK(cudaStreamDestroy(blocking));

    // the graph of a valid capture after all that still runs
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    KVP_LAUNCH(add, 1, 64, 0, st, d, 5, 64);
    CK(cudaGetLastError());
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaMemset(d, 0, sizeof h));
    CK(cudaGraphLaunch(x, st));
    CK(cudaStreamSynchronize(st));
    d2h(h, d, 64);
    for (int i = 0; i < 64; i++) cr_assert_eq(h[i], 5);
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    CK(cudaFree(d));
}

// The capture mode decides whose unsafe calls are refused: ThreadLocal only the capturing thread's, Global
// every thread's; a capture not begun Relaxed ends only in the thread that began it.
Test(cuda_emu, capture_modes_scope_unsafe_calls)
{
    KVP_REQUIRE_DEVICE();
    int *d = dalloc<int>(64), h[64];
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaStreamCaptureStatus cs;
    cudaError_t other = cudaErrorUnknown;

    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    std::thread([&] { other = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost); }).join();
    cr_assert_eq(other, cudaSuccess, "ThreadLocal refused another thread's copy: %s", cudaGetErrorName(other));
    CK(cudaStreamIsCapturing(st, &cs));
    cr_assert_eq(cs, cudaStreamCaptureStatusActive);
    cudaGraph_t g = nullptr;
    std::thread([&] { other = cudaStreamEndCapture(st, &g); }).join();
    cr_assert_eq(other, cudaErrorStreamCaptureWrongThread, "%s", cudaGetErrorName(other));
    cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    end_invalidated(st, "cudaMemcpy in the ThreadLocal capture's thread");

    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    std::thread([&] {
        other = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        (void)cudaGetLastError();
    }).join();
    cr_assert_eq(other, cudaErrorStreamCaptureUnsupported, "%s", cudaGetErrorName(other));
    end_invalidated(st, "another thread's cudaMemcpy during a Global capture");

    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    std::thread([&] { other = cudaStreamEndCapture(st, &g); }).join();
    cr_assert_eq(other, cudaSuccess, "a Relaxed capture ends in any thread: %s", cudaGetErrorName(other));
    cr_assert_not_null(g);
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    CK(cudaFree(d));
}
