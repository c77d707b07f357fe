/* runtime/executor/cuda/cuda_dev.h — the device layer of the cuda executor: the CUDA runtime calls it needs,
 * the small kernels of the forward pass and the GEMM interface, as a C API over one opened device.
 *
 *   cuda_executor.c (C, host)  --calls-->  kvp_cudev_* (this header)
 *                                             |  nvcc build: cuda_dev.cu on the GPU, GEMMs through cuBLAS
 *                                             |  emulated build (KVPAGE_CUDA_EMU): the same cuda_dev.cu on
 *                                             |  the project's CPU emulator of CUDA, GEMMs on a CPU loop
 *                                             +  no CUDA at all: cuda_dev_none.c, every call KVP_ENODEVICE
 *
 * Pointers named d_* are device pointers; h_* host pointers (pinned when from kvp_cudev_host_alloc). Every
 * kernel runs on the device's compute stream, in call order; kvp_cudev_copy_async uses the copy stream (swaps,
 * host-tier moves) and kvp_cudev_sync(d, 1) waits for it. Launch errors come back as KVP_ECUDA with CUDA's
 * own text. Element types of weights and KV pools are kvp_dtype values (attention/paged_kv.h): weights f32 or
 * bf16, KV f32, f16, bf16 or fp8 (e4m3, scale 1, as the CPU cache).
 *
 * Every kernel has a CPU reference: the op of runtime/model/ops.c, rope.c and forward.c it mirrors, named beside
 * each launcher; tests/runtime/test_cuda_kernels.c checks them against it.
 */
#ifndef KVP_RUNTIME_EXECUTOR_CUDA_CUDA_DEV_H
#define KVP_RUNTIME_EXECUTOR_CUDA_CUDA_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "attention/paged_kv.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_cudev kvp_cudev;

typedef struct {
    char name[256];
    int64_t total_bytes; /* device memory */
    int cc_major, cc_minor;
    int emulated;        /* 1: the CPU emulator of CUDA (KVPAGE_CUDA_EMU) */
    int cublas;          /* 1: GEMMs through cuBLAS; 0: the CPU stand-in */
} kvp_cudev_info;

/* Devices usable by this process; KVP_ENODEVICE with cudaGetDeviceCount's error text when there are none
 * (no driver, no GPU) or when built without CUDA. */
kvp_status kvp_cudev_count(int *n);
/* 1 in the emulated build (one device, which every rank of a test shares), else 0. */
int kvp_cudev_emulated(void);
/* Opens device `index`: sets it current, creates the compute and copy streams and the GEMM handle. */
kvp_status kvp_cudev_open(int index, kvp_cudev **out, kvp_cudev_info *info);
void kvp_cudev_close(kvp_cudev *d); /* NULL: no-op; frees nothing allocated with kvp_cudev_malloc */

kvp_status kvp_cudev_mem_info(kvp_cudev *d, int64_t *free_bytes, int64_t *total_bytes);
/* d_p on the device; `what` names it in the KVP_ENOMEM message. */
kvp_status kvp_cudev_malloc(kvp_cudev *d, void **d_p, size_t bytes, const char *what);
void kvp_cudev_free(kvp_cudev *d, void *d_p);
kvp_status kvp_cudev_host_alloc(kvp_cudev *d, void **h_p, size_t bytes, const char *what); /* pinned */
void kvp_cudev_host_free(kvp_cudev *d, void *h_p);
kvp_status kvp_cudev_memset(kvp_cudev *d, void *d_p, int byte, size_t bytes);
/* Copies on the compute stream (kind: 0 host->device, 1 device->host, 2 device->device). */
kvp_status kvp_cudev_copy(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind);
/* The same on the copy stream (swaps and host-tier moves). */
kvp_status kvp_cudev_copy_async(kvp_cudev *d, void *dst, const void *src, size_t bytes, int kind);
kvp_status kvp_cudev_sync(kvp_cudev *d, int copy_stream); /* waits for the compute (0) or copy (1) stream */
/* height rows of width bytes from src (rows spitch bytes apart) to dst (dpitch apart), on the compute stream
 * (kind as kvp_cudev_copy): the gathered slices of a vocab-parallel LM head into the logits rows; q out of the
 * fused QKV rows for the paged kernels. */
kvp_status kvp_cudev_copy_2d(kvp_cudev *d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t height, int kind);
/* The compute stream (a cudaStream_t) for work another library enqueues in order with the kernels: the
 * executor's NCCL collectives (parallel/comm.h kvp_comm_set_stream). Valid while d is open. */
void *kvp_cudev_stream(kvp_cudev *d);
/* 1 when [p, p + bytes) lies in this CUDA runtime's device memory (cudaPointerGetAttributes at both ends);
 * tests use it to tell another emulation of the runtime which memory is the device's. */
int kvp_cudev_is_device(const void *p, size_t bytes);

/* ---- kernels (reference beside each) */

/* x[t, :] = embed[tokens[t] - v0, :] * scale for the vocabulary rows [v0, v0 + nv) that embed (nv, H) of wdt
 * holds, zeros for the others (a vocab-parallel rank's part of the sum over ranks; v0 0, nv V: all of them).
 * Ref: forward.c's gather (the same rule per rank) and gemma's sqrt(H). */
kvp_status kvp_cudev_embed(kvp_cudev *d, float *d_x, const void *d_embed, kvp_dtype wdt, const int32_t *d_tokens,
                           int64_t T, int64_t H, float scale, int64_t v0, int64_t nv);
/* Row r of rows: t = r / group, h = r % group; x_r = x + t * tstride + h * n (the same for out; src_row
 * non-NULL reads x's token src_row[t] instead of t). out_r = w * x_r / sqrt(mean(x_r^2) + eps).
 * Ref: ops.c mdl_rmsnorm (per token, or per head of a token with group = heads). */
kvp_status kvp_cudev_rmsnorm(kvp_cudev *d, float *d_out, int64_t out_tstride, const float *d_x, int64_t x_tstride,
                             const float *d_w, int64_t T, int64_t group, int64_t n, float eps,
                             const int32_t *d_src_row);
/* x[t, i] += b[i] for i < n, rows at tstride. Ref: forward.c's bias loops. */
kvp_status kvp_cudev_bias(kvp_cudev *d, float *d_x, int64_t tstride, const float *d_b, int64_t T, int64_t n);
/* x[i] += y[i], n values. Ref: forward.c's residual adds. */
kvp_status kvp_cudev_add(kvp_cudev *d, float *d_x, const float *d_y, int64_t n);
/* RoPE of nheads heads of hd at v + t * tstride: pairs (style 0, (2i, 2i+1)) or halves (style 1, (i, i + rot/2))
 * of the first rot dimensions by cs (T, rot): cos, sin interleaved. Ref: rope.c mdl_rope. */
kvp_status kvp_cudev_rope(kvp_cudev *d, float *d_v, int64_t tstride, int64_t T, int64_t nheads, int64_t hd,
                          int64_t rot, int style, const float *d_cs);
/* out[t, i] = act(g[t, i]) * u[t, i], g and u rows at tstride, out (T, n). act: KVP_ACT_* (loader/model_config.h).
 * Ref: ops.c mdl_glu. */
kvp_status kvp_cudev_glu(kvp_cudev *d, int act, float *d_out, const float *d_g, const float *d_u, int64_t tstride,
                         int64_t T, int64_t n);
/* x = cap * tanh(x / cap), n values (cap > 0). Ref: ops.c mdl_softcap. */
kvp_status kvp_cudev_softcap(kvp_cudev *d, float *d_x, int64_t n, float cap);

/* The paged pools of one layer: (num_blocks, nkv, block_size, hd) of dtype each. */
typedef struct {
    void *k, *v;
    kvp_dtype dtype;
    int32_t num_blocks, nkv, block_size, hd;
} kvp_cudev_pool;

/* Writes k, v rows (T tokens, nkv * hd each, at tstride) to slot_mapping[t] (-1: skipped), rounded to the
 * pool's dtype. Ref: attention/ kvp_attn_append_kv_cpu. */
kvp_status kvp_cudev_append_kv(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_k, const float *d_v,
                               int64_t tstride, const int64_t *d_slots, int64_t T);
/* Attention of T query rows (nq heads of hd at q + t * q_tstride) over the pool: row t attends to its
 * sequence's first len[t] tokens, pages kv_indices[kv_begin[t] ..] (the batch-invariant per-row form of
 * forward.c: a row's result does not depend on the batch), keys [len - 1 - window_left, len) with a window
 * (window_left >= 0), scores scaled by sm_scale, soft-capped by cap (> 0). out (T, nq * hd).
 * Ref: attention/ kvp_attn_decode_cpu over forward.c's expanded page table. */
kvp_status kvp_cudev_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q, int64_t q_tstride,
                               float *d_out, int64_t T, int64_t nq, const int32_t *d_kv_begin, const int32_t *d_len,
                               const int32_t *d_kv_indices, int32_t window_left, float sm_scale, float cap);
/* The paged-attention kernels of attention/cuda/ (attn_cuda.h) over one layer's pool, for nseq sequences:
 * sequence s owns query rows qo[s] .. qo[s + 1] (its last qo[s + 1] - qo[s] tokens, causal), pages
 * indices[indptr[s] .. indptr[s + 1]], the last holding last[s] tokens (all device arrays). q rows (T of
 * nq * hd floats at q_tstride, the fused QKV output) are first packed into d_qc (T, nq * hd) with one 2-D copy;
 * out (T, nq * hd). decode != 0 (every sequence one row): kvp_attn_decode_cuda, split-KV at a fixed chunk of
 * chunk tokens (a row's result then depends on its own sequence only, not on the batch); else
 * kvp_attn_prefill_cuda (FlashAttention-2 tiles, tensor cores for 16-bit pools on a GPU).
 * KVP_EUNSUPPORTED when attention/cuda has no kernel for the pool's dtype and head_dim (kvp_attn_supported).
 * Ref: attention/ kvp_attn_decode_cpu, kvp_attn_prefill_cpu (the kernels' own tests), and
 * kvp_cudev_attention above (the executor's tests compare the two). */
typedef struct {
    int32_t nseq, decode, chunk;
    const int32_t *d_indptr, *d_indices, *d_last, *d_qo; /* (nseq + 1), (indptr[nseq]), (nseq), (nseq + 1) */
    void *d_split_ws;      /* decode's split-KV workspace (kvp_cudev_paged_workspace_bytes; NULL: stream-ordered */
    size_t split_ws_bytes; /* allocation, which a graph capture cannot hold on the emulator) */
} kvp_cudev_pages;
kvp_status kvp_cudev_paged_attention(kvp_cudev *d, const kvp_cudev_pool *p, const float *d_q, int64_t q_tstride,
                                     float *d_qc, float *d_out, int64_t T, int64_t nq, const kvp_cudev_pages *pg,
                                     int32_t window_left, float sm_scale, float cap);
/* 1 when kvp_cudev_paged_attention has kernels for this pool dtype and head dimension. */
int kvp_cudev_paged_supported(kvp_dtype dtype, int32_t hd);
/* Bytes of decode's split-KV workspace for nseq sequences of nq heads of hd. */
size_t kvp_cudev_paged_workspace_bytes(int32_t nseq, int32_t nq, int32_t hd);
/* Copy-on-write: block pairs[2i + 1] := pairs[2i] in every layer's K and V, all in one launch.
 * d_pools: (2 * layers) device pointers (K then V of each layer) of pool bytes block_bytes per block. */
kvp_status kvp_cudev_copy_blocks(kvp_cudev *d, void *const *d_pools, int32_t n_pools, size_t block_bytes,
                                 const int32_t *d_pairs, int32_t n_pairs);
/* n values of dt at d_p, uniform in [-scale, scale) from a counter hash of (seed, index): the same values on
 * every device and in the emulator. */
kvp_status kvp_cudev_random(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, uint64_t seed, float scale);
/* n values of dt at d_p set to value (norm weights of a random model). */
kvp_status kvp_cudev_fill(kvp_cudev *d, void *d_p, kvp_dtype dt, int64_t n, float value);

/* ---- GEMM: y (T, N) at ldy = x (T, K) at ldx times W^T, W (N, K) row-major of wdt (f32 or bf16), f32
 * accumulation. With bf16 weights x is first rounded to bf16 into d_scratch (T * K * 2 bytes; the caller's).
 * nvcc: cublasGemmEx (CUBLAS_COMPUTE_32F) with the fixed workspace given at open (cublasSetWorkspace), so it
 * can be captured; emulated: a kernel of one thread per output summing k in order in double, rounded once.
 * Ref: matmul.c. */
kvp_status kvp_cudev_gemm(kvp_cudev *d, float *d_y, int64_t ldy, const float *d_x, int64_t ldx, const void *d_w,
                          kvp_dtype wdt, int64_t T, int64_t N, int64_t K, void *d_scratch);
/* From now on d's GEMMs (on: 1) run the project's tiled kernel instead (the MoE layer's grouped GEMM with one
 * expert: tiles of KVP_CUDEV_MOE_TILE rows, each output summed over k in order by one thread), whose result for
 * a row does not depend on T nor on the row's place in the batch: batch-invariant, as the CPU's matmul (the
 * executor's --deterministic). No tensor cores; f32 FMA on a GPU; under the emulator the sum in double, equal
 * to the stand-in's bit for bit. d_scratch is then unused. */
void kvp_cudev_set_invariant_gemm(kvp_cudev *d, int on);

/* ---- mixture of experts (mixtral, qwen3_moe): one MoE FFN over T rows.
 *
 *   logits (T, E) = x (T, H) router^T            router (E, H) f32, through kvp_cudev_gemm
 *   route     per row: softmax in double, the k largest (ties: the lower expert), weights renormalized to
 *             sum 1 when norm_topk; the k picks kept in expert order
 *   align     one block counts the picks per expert and lays them out in tiles of KVP_CUDEV_MOE_TILE rows,
 *             each tile one expert's (its last tile padded); tile_expert and the tile count stay on the device
 *   gate/up   grouped GEMM over the tiles: gu (slots, 2 MF) = x[row of slot] wgu[e]^T, then SiLU(g) * u
 *   down      grouped GEMM: y (slots, MF -> H) = act wdown[e]^T
 *   combine   out[t] = sum over t's picks, in expert order, of weight * y[slot]
 *
 * wgu (E, 2 MF, H): expert e's gate rows, then its up rows; wdown (E, H, MF); of wdt (f32 or bf16: x is
 * rounded to bf16 on load, as kvp_cudev_gemm does). The grouped GEMMs are launched over the worst case of
 * tiles for T rows (blocks past the count in use return at once), so nothing is read back to the host and
 * a decode step's graph captures the layer whole. A step of many rows an expert (T k >= 16 E, a prefill),
 * outside a capture and without kvp_cudev_set_invariant_gemm, instead reads the counts back (one small copy
 * and a wait), gathers x into expert order and runs each expert's gate/up and down through kvp_cudev_gemm
 * (cuBLAS's tensor cores on a GPU; under the emulator the same sums as the tiled kernel, bit for bit). d_out may be d_x. d_ws: kvp_cudev_moe_workspace_bytes(T, H,
 * E, k, MF) bytes.
 * KVP_EUNSUPPORTED for E > KVP_CUDEV_MOE_MAX_E, k > KVP_CUDEV_MOE_MAX_K or k > E.
 * Ref: forward.c moe_ffn (the same routing in the same arithmetic, experts added from expert 0 up). */
enum { KVP_CUDEV_MOE_TILE = 16, KVP_CUDEV_MOE_MAX_E = 1024, KVP_CUDEV_MOE_MAX_K = 32 };
kvp_status kvp_cudev_moe_ffn(kvp_cudev *d, float *d_out, const float *d_x, const float *d_router, const void *d_wgu,
                             const void *d_wdown, kvp_dtype wdt, int64_t T, int64_t H, int64_t E, int64_t k,
                             int64_t MF, int norm_topk, void *d_ws, size_t ws_bytes);
size_t kvp_cudev_moe_workspace_bytes(int64_t T, int64_t H, int64_t E, int64_t k, int64_t MF);

/* ---- CUDA graphs of the compute stream.
 *
 *   kvp_cudev_capture_begin(d)          the compute stream records instead of running (ThreadLocal mode:
 *     kernels, copies, memsets, GEMMs     a synchronizing call of this thread fails and spoils the capture)
 *   kvp_cudev_capture_end(d, &g)        the recorded work as an executable graph (g NULL: dropped)
 *   kvp_cudev_graph_launch(d, g) ...    runs it on the compute stream, as often as wanted
 *
 * A graph replays the kernels with the arguments they had at capture (pointers, sizes, scalars) and reads
 * device memory as it is at replay: what varies from one launch to the next must be in device buffers
 * written before the launch. Between begin and end nothing may wait for the device (kvp_cudev_sync) or
 * read a device value on the host. The graph is the caller's until kvp_cudev_graph_destroy (NULL: no-op). */
typedef struct kvp_cudev_graph kvp_cudev_graph;
kvp_status kvp_cudev_capture_begin(kvp_cudev *d);
/* Always ends the capture (the stream records no more, also when capture failed); g non-NULL receives the
 * instantiated graph. KVP_ECUDA naming the refused call's error when the capture was invalidated. */
kvp_status kvp_cudev_capture_end(kvp_cudev *d, kvp_cudev_graph **g);
kvp_status kvp_cudev_graph_launch(kvp_cudev *d, kvp_cudev_graph *g);
void kvp_cudev_graph_destroy(kvp_cudev *d, kvp_cudev_graph *g);

#ifdef __cplusplus
}
#endif

#endif
