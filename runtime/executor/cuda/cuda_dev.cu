/* runtime/executor/cuda/cuda_dev.cu — the cuda executor's device layer: CUDA runtime wrappers, the small
 * kernels of the forward pass and the GEMM interface (contract: cuda_dev.h). Built by kvp_cuda_library: nvcc
 * for sm_80 and sm_90, or the host C++ compiler against the project's CPU emulator of CUDA (KVPAGE_CUDA_EMU),
 * where cuBLAS is replaced by a plain kernel behind the same kvp_cudev_gemm (a kernel, so that a graph
 * capture records it as it records cuBLAS's). No inline PTX.
 *
 * The kernels are plain: one warp per row for reductions (RMSNorm, attention scores), grid-stride loops for
 * element-wise ops. Each mirrors a CPU op named in cuda_dev.h and is checked against it.
 */
extern "C" {
#include "common/status.h"
}
#include "common/cuda/kvp_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef KVPAGE_CUDA_EMU
#include <cublas_v2.h>
#endif

#include "attention/attn_hd.h"
#include "attention/cuda/attn_cuda.h"
#include "runtime/executor/cuda/cuda_dev.h"

/* KVP_ACT_* of runtime/loader/model_config.h (not included: a C header of the loader). */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };

struct kvp_cudev {
    int index;
    int invariant; /* kvp_cudev_set_invariant_gemm */
    cudaStream_t compute, copy;
#ifndef KVPAGE_CUDA_EMU
    cublasHandle_t blas;
    void *blas_ws; /* cuBLAS's workspace, fixed for the device's life: a captured GEMM keeps using it */
#endif
};

struct kvp_cudev_graph {
    cudaGraphExec_t exec;
};

static kvp_status cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* clear the sticky launch error */
    return KVP_ERR(KVP_ECUDA, "cuda executor: %s: %s", what, cudaGetErrorString(e));
}
#define CU_TRY(call, what)                                      \
    do {                                                        \
        cudaError_t e_ = (call);                                \
        if (e_ != cudaSuccess) return cuda_fail(e_, (what));    \
    } while (0)

static kvp_status launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KVP_OK : cuda_fail(e, what);
}

/* Threads of the row kernels (one block a token): wide enough for a GPU's rows of a few thousand, narrow
 * under the emulator, whose cost grows with every thread of a block (each one a fiber). */
#ifdef KVPAGE_CUDA_EMU
enum { ROW_THREADS = 32, FLAT_THREADS = 32 };
#else
enum { ROW_THREADS = 256, FLAT_THREADS = 256 };
#endif

static unsigned blocks_for(int64_t n, int per)
{
    int64_t b = (n + per - 1) / per;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---------------------------------------------------------------- runtime */

extern "C" int kvp_cudev_emulated(void)
{
#ifdef KVPAGE_CUDA_EMU
    return 1;
#else
    return 0;
#endif
}

extern "C" kvp_status kvp_cudev_count(int *n)
{
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        *n = 0;
        (void)cudaGetLastError();
        return KVP_ERR(KVP_ENODEVICE, "cuda executor: no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    }
    if (*n < 1) return KVP_ERR(KVP_ENODEVICE, "cuda executor: no CUDA device (cudaGetDeviceCount found none)");
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_open(int index, kvp_cudev **out, kvp_cudev_info *info)
{
    int n;
    KVP_TRY(kvp_cudev_count(&n));
    if (index < 0 || index >= n)
        return KVP_ERR(KVP_ENODEVICE, "cuda executor: no device cuda:%d (this machine has %d)", index, n);
    CU_TRY(cudaSetDevice(index), "cudaSetDevice");
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    kvp_cudev *d = (kvp_cudev *)calloc(1, sizeof *d);
    if (!d) return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    d->index = index;
    cudaError_t e = cudaStreamCreate(&d->compute);
    if (e == cudaSuccess) e = cudaStreamCreate(&d->copy);
    if (e != cudaSuccess) {
        free(d);
        return cuda_fail(e, "cudaStreamCreate");
    }
#ifndef KVPAGE_CUDA_EMU
    /* cuBLAS allocates a workspace of its own on first use unless given one; in a graph capture that would be
     * an allocation outside the graph, so it gets a fixed one (cuBLAS's advice: 32 MiB on Hopper, 4 MiB before). */
    const size_t ws_bytes = prop.major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
    e = cudaMalloc(&d->blas_ws, ws_bytes);
    if (e != cudaSuccess) {
        cudaStreamDestroy(d->compute);
        cudaStreamDestroy(d->copy);
        free(d);
        return cuda_fail(e, "cudaMalloc of cuBLAS's workspace");
    }
    cublasStatus_t bs = cublasCreate(&d->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(d->blas, d->compute);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(d->blas, d->blas_ws, ws_bytes);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cudaFree(d->blas_ws);
        cudaStreamDestroy(d->compute);
        cudaStreamDestroy(d->copy);
        free(d);
        return KVP_ERR(KVP_ECUDA, "cuda executor: cublasCreate/SetStream/SetWorkspace: status %d", (int)bs);
    }
#endif
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->total_bytes = (int64_t)prop.totalGlobalMem;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
#ifdef KVPAGE_CUDA_EMU
    info->emulated = 1;
#else
    info->cublas = 1;
#endif
    *out = d;
    return KVP_OK;
}

extern "C" void kvp_cudev_close(kvp_cudev *d)
{
    if (!d) return;
#ifndef KVPAGE_CUDA_EMU
    cublasDestroy(d->blas);
    cudaFree(d->blas_ws);
#endif
    cudaStreamDestroy(d->compute);
    cudaStreamDestroy(d->copy);
    free(d);
}

extern "C" kvp_status kvp_cudev_mem_info(kvp_cudev *d, int64_t *free_bytes, int64_t *total_bytes)
{
    (void)d;
    size_t f = 0, t = 0;
    CU_TRY(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_malloc(kvp_cudev *d, void **d_p, size_t bytes, const char *what)
{
    (void)d;
    *d_p = NULL;
    if (bytes == 0) return KVP_OK;
    cudaError_t e = cudaMalloc(d_p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *d_p = NULL;
        return KVP_ERR(e == cudaErrorMemoryAllocation ? KVP_ENOMEM : KVP_ECUDA,
                       "cuda executor: cudaMalloc of %zu bytes for %s: %s", bytes, what, cudaGetErrorString(e));
    }
    return KVP_OK;
}

extern "C" void kvp_cudev_free(kvp_cudev *d, void *d_p)
{
    (void)d;
    if (d_p) cudaFree(d_p);
}

extern "C" kvp_status kvp_cudev_host_alloc(kvp_cudev *d, void **h_p, size_t bytes, const char *what)
{
    (void)d;
    *h_p = NULL;
    if (bytes == 0) return KVP_OK;
    cudaError_t e = cudaHostAlloc(h_p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *h_p = NULL;
        return KVP_ERR(KVP_ENOMEM, "cuda executor: cudaHostAlloc of %zu bytes for %s: %s", bytes, what,
                       cudaGetErrorString(e));
    }
    return KVP_OK;
}

extern "C" void kvp_cudev_host_free(kvp_cudev *d, void *h_p)
{
    (void)d;
    if (h_p) cudaFreeHost(h_p);
}

extern "C" kvp_status kvp_cudev_memset(kvp_cudev *d, void *d_p, int byte, size_t bytes)
{
    CU_TRY(cudaMemsetAsync(d_p, byte, bytes, d->compute), "cudaMemsetAsync");
    return KVP_OK;
}

static cudaMemcpyKind kind_of(int kind)
{
    return kind == 0 ? cudaMemcpyHostToDevice : kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

extern "C" kvp_status kvp_cudev_copy(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind)
{
    if (bytes == 0) return KVP_OK;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind_of(kind), d->compute), "cudaMemcpyAsync");
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_copy_async(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind)
{
    if (bytes == 0) return KVP_OK;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind_of(kind), d->copy), "cudaMemcpyAsync (copy stream)");
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_sync(kvp_cudev *d, int copy_stream)
{
    CU_TRY(cudaStreamSynchronize(copy_stream ? d->copy : d->compute), "cudaStreamSynchronize");
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_copy_2d(kvp_cudev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, int kind)
{
    if (width == 0 || height == 0) return KVP_OK;
    CU_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind_of(kind), d->compute), "cudaMemcpy2DAsync");
    return KVP_OK;
}

extern "C" void *kvp_cudev_stream(kvp_cudev *d) { return (void *)d->compute; }

extern "C" int kvp_cudev_is_device(const void *p, size_t bytes)
{
    cudaPointerAttributes a, b;
    const char *last = (const char *)p + (bytes ? bytes - 1 : 0);
    const int ok = p && cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice &&
                   cudaPointerGetAttributes(&b, last) == cudaSuccess && b.type == cudaMemoryTypeDevice;
    (void)cudaGetLastError();
    return ok;
}

/* ---------------------------------------------------------------- element types */

__device__ __forceinline__ float load_el(const void *p, kvp_dtype dt, int64_t i)
{
    if (dt == KVP_DTYPE_F32) return ((const float *)p)[i];
    if (dt == KVP_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    if (dt == KVP_DTYPE_FP8_E4M3) return kvp_hd_fp8e4m3_to_f32(((const uint8_t *)p)[i]); /* scale 1, as the CPU's */
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

__device__ __forceinline__ void store_el(void *p, kvp_dtype dt, int64_t i, float x)
{
    if (dt == KVP_DTYPE_F32) ((float *)p)[i] = x;
    else if (dt == KVP_DTYPE_F16) ((__half *)p)[i] = __float2half_rn(x);
    else if (dt == KVP_DTYPE_FP8_E4M3) ((uint8_t *)p)[i] = kvp_hd_f32_to_fp8e4m3(x); /* attention/dtype.c's rounding */
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* ---------------------------------------------------------------- small kernels */

/* grid: (T), block: 32 threads over H; rows outside [v0, v0 + nv) are another rank's: zeros */
__global__ void embed_kernel(float *x, const void *embed, kvp_dtype wdt, const int32_t *tokens, int64_t H, float scale,
                             int64_t v0, int64_t nv)
{
    const int64_t t = blockIdx.x, row = (int64_t)tokens[t] - v0;
    const bool mine = row >= 0 && row < nv;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) x[t * H + i] = mine ? load_el(embed, wdt, row * H + i) * scale : 0.0f;
}

extern "C" kvp_status kvp_cudev_embed(kvp_cudev *d, float *d_x, const void *d_embed, kvp_dtype wdt,
                                      const int32_t *d_tokens, int64_t T, int64_t H, float scale, int64_t v0, int64_t nv)
{
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(embed_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, d_x, d_embed, wdt, d_tokens, H, scale,
               v0, nv);
    return launched("embed");
}

/* grid: (rows), block: 32 (one warp a row). Each lane sums its elements in order, then the warp's butterfly. */
__global__ void rmsnorm_kernel(float *out, int64_t out_ts, const float *x, int64_t x_ts, const float *w, int64_t group,
                               int64_t n, float eps, const int32_t *src_row)
{
    const int64_t r = blockIdx.x, t = r / group, h = r % group;
    const int64_t st = src_row ? src_row[t] : t;
    const float *xr = x + st * x_ts + h * n;
    float *o = out + t * out_ts + h * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __syncwarp();
    for (int64_t i = threadIdx.x; i < n; i += 32) o[i] = w[i] * (inv * xr[i]);
}

extern "C" kvp_status kvp_cudev_rmsnorm(kvp_cudev *d, float *d_out, int64_t out_tstride, const float *d_x,
                                        int64_t x_tstride, const float *d_w, int64_t T, int64_t group, int64_t n,
                                        float eps, const int32_t *d_src_row)
{
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(rmsnorm_kernel, dim3((unsigned)(T * group)), dim3(32), 0, d->compute, d_out, out_tstride, d_x,
               x_tstride, d_w, group, n, eps, d_src_row);
    return launched("rmsnorm");
}

/* grid: (T), block: ROW_THREADS */
__global__ void bias_kernel(float *x, int64_t ts, const float *b, int64_t n)
{
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[blockIdx.x * ts + i] += b[i];
}

extern "C" kvp_status kvp_cudev_bias(kvp_cudev *d, float *d_x, int64_t tstride, const float *d_b, int64_t T, int64_t n)
{
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(bias_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, d_x, tstride, d_b, n);
    return launched("bias");
}

/* grid-stride over n, 256 threads a block */
__global__ void add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" kvp_status kvp_cudev_add(kvp_cudev *d, float *d_x, const float *d_y, int64_t n)
{
    if (n < 1) return KVP_OK;
    KVP_LAUNCH(add_kernel, dim3(blocks_for(n, FLAT_THREADS)), dim3(FLAT_THREADS), 0, d->compute, d_x, d_y, n);
    return launched("add");
}

/* grid: (T), block: ROW_THREADS over (head, pair) */
__global__ void rope_kernel(float *v, int64_t ts, int64_t nheads, int64_t hd, int64_t rot, int style, const float *cs)
{
    const int64_t t = blockIdx.x, half = rot / 2;
    const float *c = cs + t * rot;
    for (int64_t j = threadIdx.x; j < nheads * half; j += blockDim.x) {
        const int64_t h = j / half, i = j % half;
        float *p = v + t * ts + h * hd;
        const int64_t a = style == 0 ? 2 * i : i, b = style == 0 ? 2 * i + 1 : i + half;
        const float co = c[2 * i], si = c[2 * i + 1], x0 = p[a], x1 = p[b];
        p[a] = x0 * co - x1 * si;
        p[b] = x0 * si + x1 * co;
    }
}

extern "C" kvp_status kvp_cudev_rope(kvp_cudev *d, float *d_v, int64_t tstride, int64_t T, int64_t nheads, int64_t hd,
                                     int64_t rot, int style, const float *d_cs)
{
    if (T < 1 || rot < 2) return KVP_OK;
    KVP_LAUNCH(rope_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, d_v, tstride, nheads, hd, rot, style, d_cs);
    return launched("rope");
}

/* grid: (T), block: ROW_THREADS */
__global__ void glu_kernel(int act, float *out, const float *g, const float *u, int64_t ts, int64_t n)
{
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float a = g[t * ts + i], b = u[t * ts + i];
        float r;
        if (act == ACT_SILU) r = a / (1.0f + expf(-a)) * b;
        else if (act == ACT_GELU_TANH) r = a / (1.0f + expf(a * (-1.5957691216f - 0.0713548163f * (a * a)))) * b;
        else r = 0.5f * a * (1.0f + erff(a * 0.70710678118654752f)) * b;
        out[t * n + i] = r;
    }
}

extern "C" kvp_status kvp_cudev_glu(kvp_cudev *d, int act, float *d_out, const float *d_g, const float *d_u,
                                    int64_t tstride, int64_t T, int64_t n)
{
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(glu_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, act, d_out, d_g, d_u, tstride, n);
    return launched("glu");
}

__global__ void softcap_kernel(float *x, int64_t n, float cap)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

extern "C" kvp_status kvp_cudev_softcap(kvp_cudev *d, float *d_x, int64_t n, float cap)
{
    if (n < 1 || !(cap > 0)) return KVP_OK;
    KVP_LAUNCH(softcap_kernel, dim3(blocks_for(n, FLAT_THREADS)), dim3(FLAT_THREADS), 0, d->compute, d_x, n, cap);
    return launched("softcap");
}

/* ---------------------------------------------------------------- paged KV */

/* grid: (T), block: ROW_THREADS over (kv head, dim). Block ids widened to 64 bits before the strides. */
__global__ void append_kernel(kvp_cudev_pool p, const float *k, const float *v, int64_t ts, const int64_t *slots)
{
    const int64_t t = blockIdx.x, slot = slots[t];
    if (slot < 0) return;
    const int64_t blk = slot / p.block_size, off = slot % p.block_size, hd = p.hd;
    for (int64_t j = threadIdx.x; j < (int64_t)p.nkv * hd; j += blockDim.x) {
        const int64_t h = j / hd, e = j % hd;
        const int64_t at = ((blk * p.nkv + h) * p.block_size + off) * hd + e;
        store_el(p.k, p.dtype, at, k[t * ts + j]);
        store_el(p.v, p.dtype, at, v[t * ts + j]);
    }
}

static kvp_status check_pool(const kvp_cudev_pool *p, const char *what)
{
    if (p->dtype != KVP_DTYPE_F32 && p->dtype != KVP_DTYPE_F16 && p->dtype != KVP_DTYPE_BF16 &&
        p->dtype != KVP_DTYPE_FP8_E4M3)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: %s: KV dtype %d (f32, f16, bf16 and fp8 are supported)", what,
                       (int)p->dtype);
    if (p->hd < 1 || p->hd > 512 || p->block_size < 1)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: %s: head_dim %d, block size %d", what, p->hd, p->block_size);
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_append_kv(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_k, const float *d_v,
                                          int64_t tstride, const int64_t *d_slots, int64_t T)
{
    KVP_TRY(check_pool(p, "append_kv"));
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(append_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, *p, d_k, d_v, tstride, d_slots);
    return launched("append_kv");
}

enum { ATT_MAX_PER_LANE = 16 }; /* head_dim <= 512 */

/* grid: (T, nq), block: 32 (one warp per query row and head). Keys in order with the online softmax (as the CPU
 * decode kernel without split-KV); lane l holds output dims l, l + 32, ... */
__global__ void attention_kernel(kvp_cudev_pool p, const float *q, int64_t q_ts, float *out, int64_t nq,
                                 const int32_t *kv_begin, const int32_t *len, const int32_t *kv_indices,
                                 int32_t window_left, float sm_scale, float cap)
{
    const int64_t t = blockIdx.x, h = blockIdx.y, hd = p.hd, bs = p.block_size;
    const int64_t kvh = h / (nq / p.nkv);
    const float *qr = q + t * q_ts + h * hd;
    const int32_t L = len[t], *pages = kv_indices + kv_begin[t];
    const int32_t lo = window_left >= 0 && L - 1 - window_left > 0 ? L - 1 - window_left : 0;
    float acc[ATT_MAX_PER_LANE];
    const int lane = threadIdx.x;
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) acc[i] = 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    for (int32_t j = lo; j < L; j++) {
        const int64_t base = (((int64_t)pages[j / bs] * p.nkv + kvh) * bs + j % bs) * hd;
        float s = 0.0f;
        for (int64_t e = lane; e < hd; e += 32) s += qr[e] * load_el(p.k, p.dtype, base + e);
        s = warp_sum(s) * sm_scale;
        if (cap > 0) s = cap * tanhf(s / cap);
        const float nm = s > mx ? s : mx, corr = expf(mx - nm), w = expf(s - nm);
        sum = sum * corr + w;
        for (int64_t e = lane, i = 0; e < hd; e += 32, i++) acc[i] = acc[i] * corr + w * load_el(p.v, p.dtype, base + e);
        mx = nm;
    }
    float *o = out + (t * nq + h) * hd;
    for (int64_t e = lane, i = 0; e < hd; e += 32, i++) o[e] = acc[i] / sum;
}

extern "C" kvp_status kvp_cudev_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q, int64_t q_tstride,
                                          float *d_out, int64_t T, int64_t nq, const int32_t *d_kv_begin,
                                          const int32_t *d_len, const int32_t *d_kv_indices, int32_t window_left,
                                          float sm_scale, float cap)
{
    KVP_TRY(check_pool(p, "attention"));
    if (nq < 1 || nq % p->nkv)
        return KVP_ERR(KVP_EINVAL, "cuda executor: attention: %lld query heads over %d KV heads", (long long)nq, p->nkv);
    if (T < 1) return KVP_OK;
    KVP_LAUNCH(attention_kernel, dim3((unsigned)T, (unsigned)nq), dim3(32), 0, d->compute, *p, d_q, q_tstride, d_out,
               nq, d_kv_begin, d_len, d_kv_indices, window_left, sm_scale, cap);
    return launched("attention");
}

extern "C" int kvp_cudev_paged_supported(kvp_dtype dtype, int32_t hd)
{
    return (unsigned)dtype < KVP_DTYPE_COUNT && kvp_attn_supported(dtype, hd);
}

extern "C" size_t kvp_cudev_paged_workspace_bytes(int32_t nseq, int32_t nq, int32_t hd)
{
    return kvp_attn_decode_cuda_workspace_bytes(nseq, nq, hd);
}

extern "C" kvp_status kvp_cudev_paged_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q,
                                                int64_t q_tstride, float *d_qc, float *d_out, int64_t T, int64_t nq,
                                                const kvp_cudev_pages *pg, int32_t window_left, float sm_scale,
                                                float cap)
{
    KVP_TRY(check_pool(p, "paged attention"));
    if (!kvp_cudev_paged_supported(p->dtype, p->hd))
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: paged attention: no attention/cuda kernel for head_dim %d", p->hd);
    if (T < 1 || pg->nseq < 1) return KVP_OK;
    const size_t row = (size_t)(nq * p->hd) * sizeof(float);
    KVP_TRY(kvp_cudev_copy_2d(d, d_qc, row, d_q, (size_t)q_tstride * sizeof(float), row, (size_t)T, 2)); /* q packed */
    kvp_paged_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.k = p->k, kv.v = p->v, kv.dtype = p->dtype, kv.k_scale = 1.0f, kv.v_scale = 1.0f;
    kv.num_blocks = p->num_blocks, kv.num_kv_heads = p->nkv, kv.block_size = p->block_size, kv.head_dim = p->hd;
    kv.stride_token = p->hd;
    kv.stride_head = (int64_t)p->block_size * p->hd;
    kv.stride_block = (int64_t)p->nkv * kv.stride_head;
    kv.num_seqs = pg->nseq, kv.kv_indptr = pg->d_indptr, kv.kv_indices = pg->d_indices, kv.kv_last_page_len = pg->d_last;
    kvp_attn_params ap = kvp_attn_default_params((int32_t)nq);
    ap.sm_scale = sm_scale, ap.window_left = window_left, ap.logits_soft_cap = cap > 0 ? cap : 0.0f;
    if (pg->decode) {
        ap.kv_chunk_size = pg->chunk;
        ap.split_workspace = pg->d_split_ws, ap.split_workspace_bytes = pg->split_ws_bytes;
        return kvp_attn_decode_cuda(&kv, d_qc, d_out, &ap, d->compute);
    }
    return kvp_attn_prefill_cuda(&kv, d_qc, pg->d_qo, (int32_t)T, d_out, &ap, d->compute);
}

/* grid: (n_pairs, n_pools), block: 256 threads over the block's 4-byte words */
__global__ void copy_blocks_kernel(void *const *pools, size_t words, const int32_t *pairs)
{
    uint32_t *pool = (uint32_t *)pools[blockIdx.y];
    const int64_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    for (size_t i = threadIdx.x; i < words; i += blockDim.x) pool[dst * words + i] = pool[src * words + i];
}

extern "C" kvp_status kvp_cudev_copy_blocks(kvp_cudev *d, void *const *d_pools, int32_t n_pools, size_t block_bytes,
                                            const int32_t *d_pairs, int32_t n_pairs)
{
    if (n_pairs < 1 || n_pools < 1) return KVP_OK;
    if (block_bytes % 4) return KVP_ERR(KVP_EINVAL, "cuda executor: copy_blocks: %zu-byte blocks", block_bytes);
    KVP_LAUNCH(copy_blocks_kernel, dim3((unsigned)n_pairs, (unsigned)n_pools), dim3(256), 0, d->compute, d_pools,
               block_bytes / 4, d_pairs);
    return launched("copy_blocks");
}

/* ---------------------------------------------------------------- random weights */

__device__ __forceinline__ uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void random_kernel(void *p, kvp_dtype dt, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t r = splitmix64(seed ^ splitmix64((uint64_t)i));
        const float u = (float)(r >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        store_el(p, dt, i, (2.0f * u - 1.0f) * scale);
    }
}

__global__ void fill_kernel(void *p, kvp_dtype dt, int64_t n, float value)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        store_el(p, dt, i, value);
}

extern "C" kvp_status kvp_cudev_random(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, uint64_t seed, float scale)
{
    if (n < 1) return KVP_OK;
    KVP_LAUNCH(random_kernel, dim3(blocks_for(n, FLAT_THREADS)), dim3(FLAT_THREADS), 0, d->compute, d_p, dt, n, seed, scale);
    return launched("random weights");
}

extern "C" kvp_status kvp_cudev_fill(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, float value)
{
    if (n < 1) return KVP_OK;
    KVP_LAUNCH(fill_kernel, dim3(blocks_for(n, FLAT_THREADS)), dim3(FLAT_THREADS), 0, d->compute, d_p, dt, n, value);
    return launched("fill");
}

/* ---------------------------------------------------------------- GEMM */

/* grid: (T), block: ROW_THREADS: x rows rounded to bf16, packed (T, K) */
__global__ void to_bf16_kernel(__nv_bfloat16 *out, const float *x, int64_t ldx, int64_t K)
{
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) out[blockIdx.x * K + i] = __float2bfloat16_rn(x[blockIdx.x * ldx + i]);
}

/* The tiled GEMM (group_gemm_kernel): columns of a block, rows of a tile, the K chunk staged in shared memory;
 * the emulator sums in double (as its stand-in for cuBLAS does), a GPU in f32. */
#ifdef KVPAGE_CUDA_EMU
enum { GEMM_BN = 32 };
typedef double tiled_acc;
#else
enum { GEMM_BN = 128 };
typedef float tiled_acc;
#endif
enum { GEMM_TILE = KVP_CUDEV_MOE_TILE, GEMM_KC = 32 };

/* grid: (tiles, N / GEMM_BN), block: GEMM_BN. The tiled GEMM of the MoE layer and of --deterministic: tile i
 * (< *n_tiles when given) is rows [i TILE, (i + 1) TILE) of y (rows past M skipped), all of expert
 * tile_expert[i] (NULL: 0); thread j computes column blockIdx.y GEMM_BN + j of them over W = w + e N K (N, K),
 * K in chunks of GEMM_KC staged in shared memory (x rows and W rows, loaded along K). The x row of row s:
 * gather non-NULL: row gather[s] (-1: zeros), else row s. Each output sums k in order in one thread, the same
 * arithmetic in any tile and for any M: a row's result does not depend on the batch (and the emulator's sum in
 * double equals its kvp_cudev_gemm stand-in's). */
__global__ void group_gemm_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *gather,
                                  int64_t M, const void *w, kvp_dtype wdt, const int32_t *tile_expert,
                                  const int32_t *n_tiles, int64_t N, int64_t K)
{
    const int64_t tile = blockIdx.x;
    if (n_tiles && tile >= *n_tiles) return;
    const int64_t e = tile_expert ? tile_expert[tile] : 0, n0 = (int64_t)blockIdx.y * GEMM_BN, col = n0 + threadIdx.x;
    const int bf = wdt == KVP_DTYPE_BF16;
    KVP_SHARED(float, xs, GEMM_TILE * GEMM_KC);
    KVP_SHARED(float, ws, GEMM_BN * (GEMM_KC + 1)); /* padded: a column of threads reads rows a bank apart */
    tiled_acc acc[GEMM_TILE];
    for (int r = 0; r < GEMM_TILE; r++) acc[r] = 0;
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
        const int64_t kc = K - k0 < (int64_t)GEMM_KC ? K - k0 : (int64_t)GEMM_KC;
        for (int i = threadIdx.x; i < GEMM_TILE * GEMM_KC; i += blockDim.x) {
            const int r = i / GEMM_KC, kk = i % GEMM_KC;
            const int64_t s = tile * GEMM_TILE + r, src = s >= M ? -1 : gather ? gather[s] : s;
            float v = kk < kc && src >= 0 ? x[src * ldx + k0 + kk] : 0.0f;
            if (bf) v = __bfloat162float(__float2bfloat16_rn(v));
            xs[i] = v;
        }
        for (int i = threadIdx.x; i < GEMM_BN * GEMM_KC; i += blockDim.x) {
            const int r = i / GEMM_KC, kk = i % GEMM_KC;
            const int64_t nrow = n0 + r;
            ws[r * (GEMM_KC + 1) + kk] = nrow < N && kk < kc ? load_el(w, wdt, (e * N + nrow) * K + k0 + kk) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < kc; kk++) {
            const tiled_acc wv = ws[threadIdx.x * (GEMM_KC + 1) + kk];
            for (int r = 0; r < GEMM_TILE; r++) acc[r] += (tiled_acc)xs[r * GEMM_KC + kk] * wv;
        }
        __syncthreads();
    }
    for (int r = 0; col < N && r < GEMM_TILE && tile * GEMM_TILE + r < M; r++)
        y[(tile * GEMM_TILE + r) * ldy + col] = (float)acc[r];
}

#ifdef KVPAGE_CUDA_EMU
/* grid: (T), block: 32; thread j computes outputs j, j + 32, ... of row t, summing k in order (the CPU loop the
 * emulated build always had). x is f32 or, with bf16 weights, the bf16 copy. */
__global__ void gemm_emu_kernel(float *y, int64_t ldy, const void *x, int64_t ldx, const void *w, kvp_dtype wdt,
                                int64_t N, int64_t K)
{
    const int64_t t = blockIdx.x;
    for (int64_t o = threadIdx.x; o < N; o += blockDim.x) {
        /* k in order in double, rounded once: cuBLAS's f32 accumulation order is its own, so the stand-in
         * models none, and a sum this close to exact lets a test that splits K (the row-parallel GEMMs of
         * tensor parallelism) see the split, not the stand-in's rounding */
        double s = 0.0;
        if (wdt == KVP_DTYPE_F32) {
            const float *wr = (const float *)w + o * K, *xr = (const float *)x + t * ldx;
            for (int64_t k = 0; k < K; k++) s += (double)xr[k] * wr[k];
        } else {
            const __nv_bfloat16 *wr = (const __nv_bfloat16 *)w + o * K, *xr = (const __nv_bfloat16 *)x + t * ldx;
            for (int64_t k = 0; k < K; k++) s += (double)__bfloat162float(xr[k]) * __bfloat162float(wr[k]);
        }
        y[t * ldy + o] = (float)s;
    }
}
#endif

extern "C" void kvp_cudev_set_invariant_gemm(kvp_cudev *d, int on) { d->invariant = on != 0; }

extern "C" kvp_status kvp_cudev_gemm(kvp_cudev *d, float *d_y, int64_t ldy, const float *d_x, int64_t ldx,
                                     const void *d_w, kvp_dtype wdt, int64_t T, int64_t N, int64_t K, void *d_scratch)
{
    if (T < 1 || N < 1) return KVP_OK;
    if (wdt != KVP_DTYPE_F32 && wdt != KVP_DTYPE_BF16)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: gemm: weights of dtype %d (f32 or bf16)", (int)wdt);
    if (d->invariant) { /* the tiled kernel rounds x to bf16 as it loads it */
        const int64_t tiles = (T + GEMM_TILE - 1) / GEMM_TILE;
        KVP_LAUNCH(group_gemm_kernel, dim3((unsigned)tiles, blocks_for(N, GEMM_BN)), dim3(GEMM_BN), 0, d->compute, d_y,
                   ldy, d_x, ldx, (const int32_t *)NULL, T, d_w, wdt, (const int32_t *)NULL, (const int32_t *)NULL, N, K);
        return launched("gemm (tiled)");
    }
    const void *x = d_x;
    int64_t lx = ldx;
    if (wdt == KVP_DTYPE_BF16) {
        KVP_LAUNCH(to_bf16_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, (__nv_bfloat16 *)d_scratch, d_x, ldx, K);
        KVP_TRY(launched("gemm: x to bf16"));
        x = d_scratch;
        lx = K;
    }
#ifdef KVPAGE_CUDA_EMU
    /* The stand-in for cuBLAS: a kernel on the compute stream (in order after the kernels that wrote x, and
     * recorded by a capture like any launch). */
    KVP_LAUNCH(gemm_emu_kernel, dim3((unsigned)T), dim3(32), 0, d->compute, d_y, ldy, x, lx, d_w, wdt, N, K);
    return launched("gemm");
#else
    /* Row-major y (T, N) is column-major y^T (N, T) = W (N, K) x^T: W's row-major storage is W^T column-major
     * (K, N), taken transposed. */
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t ab = wdt == KVP_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t s = cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &alpha, d_w, ab, (int)K,
                                    x, ab, (int)lx, &beta, d_y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return KVP_ERR(KVP_ECUDA, "cuda executor: cublasGemmEx (%lld x %lld x %lld): status %d", (long long)T,
                       (long long)N, (long long)K, (int)s);
    return KVP_OK;
#endif
}

/* ---------------------------------------------------------------- mixture of experts */

#ifdef KVPAGE_CUDA_EMU
enum { ALIGN_THREADS = 32 };
#else
enum { ALIGN_THREADS = 256 };
#endif
enum { MOE_TILE = GEMM_TILE };

/* Tiles T rows of k picks can need at most: every expert in use may leave one tile part-full. */
static int64_t moe_max_tiles(int64_t T, int64_t E, int64_t k)
{
    const int64_t n = T * k, used = E < n ? E : n;
    return (n + used * (MOE_TILE - 1) + MOE_TILE - 1) / MOE_TILE;
}

/* The workspace's sections, 256-byte aligned, in this order. */
typedef struct {
    size_t logits, pick, wt, slot, tile_expert, n_tiles, counts, sorted, gu, act, y, scratch, bytes;
} moe_layout;

static moe_layout moe_layout_of(int64_t T, int64_t H, int64_t E, int64_t k, int64_t MF)
{
    const int64_t tiles = moe_max_tiles(T, E, k), slots = tiles * MOE_TILE;
    moe_layout l;
    size_t at = 0;
#define SECTION(f, bytes) l.f = at, at = (at + (size_t)(bytes) + 255) & ~(size_t)255
    SECTION(logits, T * E * 4);
    SECTION(pick, T * k * 4);
    SECTION(wt, T * k * 4);
    SECTION(slot, T * k * 4);
    SECTION(tile_expert, tiles * 4);
    SECTION(n_tiles, 4);
    SECTION(counts, E * 4);
    SECTION(sorted, slots * 4);
    SECTION(gu, slots * 2 * MF * 4);
    SECTION(act, slots * MF * 4);
    SECTION(y, slots * H * 4); /* also the gathered x of the per-expert GEMMs (read before y is written) */
    SECTION(scratch, slots * (H > MF ? H : MF) * 2); /* their bf16 inputs */
#undef SECTION
    l.bytes = at;
    return l;
}

extern "C" size_t kvp_cudev_moe_workspace_bytes(int64_t T, int64_t H, int64_t E, int64_t k, int64_t MF)
{
    return T < 1 ? 0 : moe_layout_of(T, H, E, k, MF).bytes;
}

/* grid: (T / 32), block: 32, a thread a row. The CPU's routing (forward.c moe_ffn) step by step: the softmax's
 * max and sum in double over the f32 logits, the j-th pick the largest logit not yet taken, weights rounded to
 * f32 and renormalized by their double sum; then the picks sorted by expert (the order the CPU adds them). */
__global__ void moe_route_kernel(const float *logits, int64_t T, int E, int k, int norm, int32_t *pick, float *wt)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *r = logits + t * E;
    double mx = -INFINITY, sum = 0, chosen = 0;
    for (int e = 0; e < E; e++) mx = r[e] > mx ? r[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((double)r[e] - mx);
    uint32_t taken[KVP_CUDEV_MOE_MAX_E / 32] = {0};
    int32_t p[KVP_CUDEV_MOE_MAX_K];
    float w[KVP_CUDEV_MOE_MAX_K];
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!(taken[e >> 5] >> (e & 31) & 1u) && (best < 0 || r[e] > r[best])) best = e;
        taken[best >> 5] |= 1u << (best & 31);
        p[j] = best;
        w[j] = (float)(exp((double)r[best] - mx) / sum);
        chosen += w[j];
    }
    for (int j = 0; norm && j < k; j++) w[j] = (float)(w[j] / chosen);
    for (int j = 1; j < k; j++) /* insertion sort by expert: k is small */
        for (int i = j; i > 0 && p[i - 1] > p[i]; i--) {
            const int32_t tp = p[i];
            const float tw = w[i];
            p[i] = p[i - 1], w[i] = w[i - 1];
            p[i - 1] = tp, w[i - 1] = tw;
        }
    for (int j = 0; j < k; j++) {
        pick[t * k + j] = p[j];
        wt[t * k + j] = w[j];
    }
}

/* grid: 1, block: ALIGN_THREADS. Counts the n = T k picks per expert (counts[e]), gives expert e the tiles after
 * those of experts below it, and each pick q a slot of its expert's tiles: sorted[slot] = its row, slot_of[q] = slot.
 * Slots past an expert's picks hold -1. Which slot a pick gets within its expert varies from run to run; no
 * result depends on it (a GEMM row is computed alone, and combine reads by pick). */
__global__ void moe_align_kernel(const int32_t *pick, int64_t n, int k, int E, int64_t slots, int32_t *tile_expert,
                                 int32_t *n_tiles, int32_t *counts, int32_t *sorted, int32_t *slot_of)
{
    KVP_SHARED(int, cnt, KVP_CUDEV_MOE_MAX_E);
    KVP_SHARED(int, cur, KVP_CUDEV_MOE_MAX_E);
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) sorted[s] = -1;
    __syncthreads();
    for (int64_t q = threadIdx.x; q < n; q += blockDim.x) atomicAdd(&cnt[pick[q]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int tiles = 0;
        for (int e = 0; e < E; e++) {
            cur[e] = tiles * MOE_TILE;
            counts[e] = cnt[e];
            for (int i = 0; i < (cnt[e] + MOE_TILE - 1) / MOE_TILE; i++) tile_expert[tiles++] = e;
        }
        *n_tiles = tiles;
    }
    __syncthreads();
    for (int64_t q = threadIdx.x; q < n; q += blockDim.x) {
        const int s = atomicAdd(&cur[pick[q]], 1);
        sorted[s] = (int32_t)(q / k);
        slot_of[q] = s;
    }
}

/* grid: (max tiles), block: ROW_THREADS: xs[s] = x[sorted[s]] over the tiles in use (zeros for -1). */
__global__ void moe_gather_kernel(float *xs, const float *x, const int32_t *sorted, const int32_t *n_tiles, int64_t H)
{
    if ((int64_t)blockIdx.x >= *n_tiles) return;
    for (int64_t s = (int64_t)blockIdx.x * MOE_TILE; s < ((int64_t)blockIdx.x + 1) * MOE_TILE; s++)
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) xs[s * H + i] = sorted[s] >= 0 ? x[sorted[s] * H + i] : 0.0f;
}

/* grid: (max tiles), block: ROW_THREADS over the tile's rows: act = SiLU(gate) * up (glu_kernel's SiLU). */
__global__ void moe_glu_kernel(float *act, const float *gu, const int32_t *n_tiles, int64_t MF)
{
    if ((int64_t)blockIdx.x >= *n_tiles) return;
    for (int64_t s = (int64_t)blockIdx.x * MOE_TILE; s < ((int64_t)blockIdx.x + 1) * MOE_TILE; s++)
        for (int64_t i = threadIdx.x; i < MF; i += blockDim.x) {
            const float a = gu[s * 2 * MF + i], b = gu[s * 2 * MF + MF + i];
            act[s * MF + i] = a / (1.0f + expf(-a)) * b;
        }
}

/* grid: (T), block: ROW_THREADS: out[t] = sum over t's picks (in expert order) of weight * y[slot]. */
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *slot_of, const float *wt, int k,
                                   int64_t H)
{
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < k; j++) o += wt[t * k + j] * y[(int64_t)slot_of[t * k + j] * H + i];
        out[t * H + i] = o;
    }
}

/* How a step's MoE rows lie in tiles, and which way its expert GEMMs run. */
typedef struct {
    int per_expert;                        /* 1: each expert's rows through kvp_cudev_gemm; 0: the grouped kernel */
    const int32_t *cnt;                    /* per_expert: the rows of each expert (host) */
    int64_t E, tiles;                      /* experts; the worst-case tile count (the grouped kernel's grid) */
    const int32_t *tile_expert, *n_tiles;  /* device */
    void *scratch;                         /* per_expert: kvp_cudev_gemm's bf16 input */
} moe_tiles;

/* y (slots, N) = x[row of slot] W_e^T for every slot of expert e's tiles, W (E, N, K) of wdt. gather: the grouped
 * kernel's row of x per slot (NULL: x is in slot order, as per-expert GEMMs need it). */
static kvp_status moe_project(kvp_cudev *d, const moe_tiles *t, float *y, int64_t N, const float *x, int64_t K,
                              const int32_t *gather, const void *w, kvp_dtype wdt)
{
    const size_t wbytes = (size_t)(N * K) * (wdt == KVP_DTYPE_F32 ? 4 : 2); /* one expert's */
    if (t->per_expert) {
        for (int64_t e = 0, row = 0; e < t->E; row += (t->cnt[e] + MOE_TILE - 1) / MOE_TILE * MOE_TILE, e++)
            KVP_TRY(kvp_cudev_gemm(d, y + row * N, N, x + row * K, K, (const char *)w + (size_t)e * wbytes, wdt,
                                   t->cnt[e], N, K, t->scratch));
        return KVP_OK;
    }
    KVP_LAUNCH(group_gemm_kernel, dim3((unsigned)t->tiles, blocks_for(N, GEMM_BN)), dim3(GEMM_BN), 0, d->compute, y,
               N, x, K, gather, t->tiles * MOE_TILE, w, wdt, t->tile_expert, t->n_tiles, N, K);
    return launched("moe expert GEMM");
}

extern "C" kvp_status kvp_cudev_moe_ffn(kvp_cudev *d, float *d_out, const float *d_x, const float *d_router,
                                        const void *d_wgu, const void *d_wdown, kvp_dtype wdt, int64_t T, int64_t H,
                                        int64_t E, int64_t k, int64_t MF, int norm_topk, void *d_ws, size_t ws_bytes)
{
    if (T < 1) return KVP_OK;
    if (E > KVP_CUDEV_MOE_MAX_E || k > KVP_CUDEV_MOE_MAX_K || k < 1 || k > E)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: %lld experts, %lld per token (at most %d and %d, k <= E)",
                       (long long)E, (long long)k, (int)KVP_CUDEV_MOE_MAX_E, (int)KVP_CUDEV_MOE_MAX_K);
    if (wdt != KVP_DTYPE_F32 && wdt != KVP_DTYPE_BF16)
        return KVP_ERR(KVP_EUNSUPPORTED, "cuda executor: experts of dtype %d (f32 or bf16)", (int)wdt);
    const moe_layout l = moe_layout_of(T, H, E, k, MF);
    if (ws_bytes < l.bytes)
        return KVP_ERR(KVP_EINVAL, "cuda executor: MoE workspace of %zu bytes, %zu needed", ws_bytes, l.bytes);
    char *b = (char *)d_ws;
    float *logits = (float *)(b + l.logits), *wt = (float *)(b + l.wt), *gu = (float *)(b + l.gu);
    float *act = (float *)(b + l.act), *y = (float *)(b + l.y);
    int32_t *pick = (int32_t *)(b + l.pick), *slot = (int32_t *)(b + l.slot), *sorted = (int32_t *)(b + l.sorted);
    int32_t *tile_expert = (int32_t *)(b + l.tile_expert), *n_tiles = (int32_t *)(b + l.n_tiles);
    int32_t *counts = (int32_t *)(b + l.counts);
    const int64_t tiles = moe_max_tiles(T, E, k);
    /* Many rows an expert (a prefill) and no capture: the experts' GEMMs one by one through kvp_cudev_gemm
     * (cuBLAS's tensor cores on a GPU), after reading the counts back; else the grouped tiled kernel, which reads
     * them on the device (decode steps, graphs, --deterministic). */
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CU_TRY(cudaStreamIsCapturing(d->compute, &cap), "cudaStreamIsCapturing");
    const int per_expert = !d->invariant && cap == cudaStreamCaptureStatusNone && T * k >= (int64_t)MOE_TILE * E;
    KVP_TRY(kvp_cudev_gemm(d, logits, E, d_x, H, d_router, KVP_DTYPE_F32, T, E, H, NULL));
    KVP_LAUNCH(moe_route_kernel, dim3(blocks_for(T, 32)), dim3(32), 0, d->compute, logits, T, (int)E, (int)k,
               norm_topk, pick, wt);
    KVP_TRY(launched("moe route"));
    KVP_LAUNCH(moe_align_kernel, dim3(1), dim3(ALIGN_THREADS), 0, d->compute, pick, T * k, (int)k, (int)E,
               tiles * MOE_TILE, tile_expert, n_tiles, counts, sorted, slot);
    KVP_TRY(launched("moe align"));
    int32_t cnt[KVP_CUDEV_MOE_MAX_E];
    float *xs = y; /* per expert: x in expert order, consumed by gate/up before down writes y */
    if (per_expert) {
        KVP_TRY(kvp_cudev_copy(d, cnt, counts, (size_t)E * sizeof(int32_t), 1));
        KVP_TRY(kvp_cudev_sync(d, 0));
        KVP_LAUNCH(moe_gather_kernel, dim3((unsigned)tiles), dim3(ROW_THREADS), 0, d->compute, xs, d_x, sorted, n_tiles, H);
        KVP_TRY(launched("moe gather"));
    }
    const moe_tiles mt = {.per_expert = per_expert, .cnt = cnt, .E = E, .tiles = tiles, .tile_expert = tile_expert,
                          .n_tiles = n_tiles, .scratch = b + l.scratch};
    KVP_TRY(moe_project(d, &mt, gu, 2 * MF, per_expert ? xs : d_x, H, per_expert ? NULL : sorted, d_wgu, wdt));
    KVP_LAUNCH(moe_glu_kernel, dim3((unsigned)tiles), dim3(ROW_THREADS), 0, d->compute, act, gu, n_tiles, MF);
    KVP_TRY(launched("moe glu"));
    KVP_TRY(moe_project(d, &mt, y, H, act, MF, NULL, d_wdown, wdt));
    KVP_LAUNCH(moe_combine_kernel, dim3((unsigned)T), dim3(ROW_THREADS), 0, d->compute, d_out, y, slot, wt, (int)k, H);
    return launched("moe combine");
}

/* ---------------------------------------------------------------- CUDA graphs */

extern "C" kvp_status kvp_cudev_capture_begin(kvp_cudev *d)
{
    CU_TRY(cudaStreamBeginCapture(d->compute, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_capture_end(kvp_cudev *d, kvp_cudev_graph **out)
{
    if (out) *out = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(d->compute, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cuda_fail(e, "cudaStreamEndCapture (a call in the forward pass cannot be captured)");
    }
    if (!out) {
        cudaGraphDestroy(g);
        return KVP_OK;
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g); /* the executable graph does not need it */
    if (e != cudaSuccess) return cuda_fail(e, "cudaGraphInstantiate");
    kvp_cudev_graph *r = (kvp_cudev_graph *)calloc(1, sizeof *r);
    if (!r) {
        cudaGraphExecDestroy(x);
        return KVP_ERR(KVP_ENOMEM, "cuda executor: out of memory");
    }
    r->exec = x;
    *out = r;
    return KVP_OK;
}

extern "C" kvp_status kvp_cudev_graph_launch(kvp_cudev *d, kvp_cudev_graph *g)
{
    CU_TRY(cudaGraphLaunch(g->exec, d->compute), "cudaGraphLaunch");
    return KVP_OK;
}

extern "C" void kvp_cudev_graph_destroy(kvp_cudev *d, kvp_cudev_graph *g)
{
    (void)d;
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    free(g);
}
