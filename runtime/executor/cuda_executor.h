/* runtime/executor/cuda_executor.h — the engine's `cuda` executor (engine/executor.h): the model's weights on
 * an NVIDIA GPU, one device allocation for the paged KV pools, one upload of the step's batch, the forward
 * pass as kernels (runtime/executor/cuda/cuda_dev.h) and GEMMs through cuBLAS, logits rows back to the host
 * for the engine's sampler (the same seeds and draws as on the CPU).
 *
 * Device memory, as vLLM sizes it (kvp_cuda_split):
 *
 *   total x --gpu-memory-utilization (budget)  =  weights + activation peak + KV pools
 *   |<------------------------------- total device memory ------------------------------->|
 *   |<---- weights ---->|<- activations ->|<---------- KV blocks ---------->|  (1 - util)  |
 *                        measured by a profiling pass at the largest batch    left to others
 *   --kv-cache-memory BYTES gives the KV part directly (vLLM's option of the same name).
 *
 * One step: host-tier stores, swap out, swap in, host-tier loads (cudaMemcpyAsync on the copy stream, pinned
 * host pools), copy-on-write (one launch), then the forward pass on the compute stream over the step's pack
 * (kvp_cuda_pack: every array the kernels read, laid out in one pinned buffer and uploaded with one copy).
 * Decode steps are padded to a CUDA-graph bucket (kvp_cuda_graph_bucket; --enforce-eager: none): rows added
 * write no KV (slot -1) and return no logits. The forward pass of every bucket is captured as a CUDA graph when
 * the executor is made (vLLM's start-up capture) and replayed on every step of that bucket: the pack's sections
 * up to the page indices lie
 * at offsets that depend only on the bucket's row count, so one graph serves every batch of the bucket.
 * What runs where, and what has not run on a GPU: docs/cuda-executor.md.
 *
 * Tensor parallelism (a model from kvp_model_load_tp over an nccl communicator, one GPU per rank): each rank
 * holds the shard the loader sliced (parallel/shard.h: column-parallel fused QKV and gate/up, row-parallel
 * o_proj and down, a vocab-parallel embedding and LM head) and a KV pool of its KV heads only, with rank 0's
 * block ids. The forward pass sums (f32 all-reduce) the embedding and each row-parallel GEMM's output, and
 * all-gathers the LM head's slices, through NCCL on the compute stream. Rank 0 runs the engine and its
 * executor broadcasts each step's plan over the communicator's host plane (tp_plan.h); the other ranks run
 * kvp_cuda_follow. Rank 0's step returns the full logits rows.
 *
 * Builds: nvcc (KVPAGE_CUDA=ON with a CUDA toolkit) runs on the GPU; the emulated build runs the same kernels
 * on the project's CPU emulator of CUDA; without either, creating the executor fails with KVP_ENODEVICE.
 * The host-side functions below (parsing, split, buckets, pack) need no device.
 */
#ifndef KVP_RUNTIME_EXECUTOR_CUDA_EXECUTOR_H
#define KVP_RUNTIME_EXECUTOR_CUDA_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/session.h"
#include "runtime/loader/model_config.h"
#include "runtime/model/model.h"

/* Attention on the device: attention/cuda's paged kernels (split-KV decode at a fixed chunk, FlashAttention-2
 * prefill), or the executor's own per-row kernel (one warp per query row and head: a row's result does not
 * depend on the batch, nor on whether the step is a decode or a mixed one). Paged falls back to rowwise for a
 * head dimension attention/cuda has no kernel for (kvp_cudev_paged_supported). */
typedef enum { KVP_CUDA_ATTN_PAGED = 0, KVP_CUDA_ATTN_ROWWISE = 1 } kvp_cuda_attention;
enum { KVP_CUDA_DECODE_CHUNK = 256 }; /* split-KV chunk of decode steps (tokens) */

/* The options of --device cuda (engine_opts.h parses them). */
typedef struct {
    int device;                    /* N of cuda:N */
    double gpu_memory_utilization; /* (0, 1], default 0.9 */
    int64_t kv_cache_memory;       /* bytes of KV pools; -1: from the split */
    int enforce_eager;             /* 1: no CUDA-graph buckets, no graphs */
    kvp_dtype weights;             /* KVP_DTYPE_F32 or KVP_DTYPE_BF16 on the device; KVP_DTYPE_COUNT: auto
                                      (f32 for an f32 checkpoint, else bf16) */
    uint64_t random_seed;          /* --random-weights: the seed */
    kvp_cuda_attention attention;  /* --cuda-attention */
    int deterministic;             /* 1 (--deterministic): GEMMs by the tiled kernel (kvp_cudev_set_invariant_gemm)
                                      and rowwise attention, so a row's logits do not depend on the batch (tp 1;
                                      NCCL's sums may depend on the message size) */
} kvp_cuda_options;

kvp_cuda_options kvp_cuda_options_default(void);

/* CUDA devices this process sees; KVP_ENODEVICE naming why there are none ("cuda executor: no CUDA device
 * (...)"), as kvp_cuda_executor_create would fail. */
kvp_status kvp_cuda_devices(int *n);

/* "cpu" (*cuda = 0), "cuda" or "cuda:N" (*cuda = 1, *index = N); else KVP_EINVAL naming s. */
kvp_status kvp_device_parse(const char *s, int *cuda, int *index);

/* ---- the memory split */
typedef struct {
    int64_t total;       /* device memory */
    int64_t free_at_start;
    double utilization;
    int64_t budget;      /* total x utilization */
    int64_t weights;
    int64_t activations; /* the profiled peak (workspace, logits, GEMM scratch, step pack) */
    int64_t kv;          /* bytes of KV pools: budget - weights - activations, or --kv-cache-memory */
    int kv_given;        /* 1: kv from --kv-cache-memory */
    int64_t block_bytes; /* one block of every layer's K and V */
    int32_t num_blocks;  /* kv / block_bytes */
} kvp_cuda_mem_split;

/* The split; KVP_EINVAL naming the options when utilization is outside (0, 1], when the budget exceeds the
 * free memory (another process holds some: lower --gpu-memory-utilization), or when no block fits. */
kvp_status kvp_cuda_split(int64_t total, int64_t free_at_start, double utilization, int64_t weights,
                          int64_t activations, int64_t block_bytes, int64_t kv_cache_memory, kvp_cuda_mem_split *out);

/* ---- CUDA-graph buckets for decode (vLLM's capture sizes: 1, 2, 4, then multiples of 8) */
enum { KVP_CUDA_MAX_BUCKETS = 72 };
/* The buckets up to min(max_num_seqs, 512) (the largest always covers max_num_seqs when <= 512) into out
 * (KVP_CUDA_MAX_BUCKETS); returns how many. */
int32_t kvp_cuda_graph_buckets(int32_t max_num_seqs, int32_t *out);
/* The smallest bucket >= n, or -1 (run eagerly: n above every bucket, or no buckets). */
int32_t kvp_cuda_graph_bucket(const int32_t *buckets, int32_t n_buckets, int32_t n);

/* ---- the step pack: every array the kernels read, one buffer, one upload. Sections, 16-byte aligned, in
 * this order: every offset up to kv_indices depends on T (and rot) only, so a graph captured for a T-row
 * pack reads any later T-row pack correctly:
 *
 *   slots      int64 [T]      slot mapping (-1 for padding rows)
 *   tokens     int32 [T]      (0 for padding rows)
 *   kv_begin   int32 [T]      row t's pages start at kv_indices[kv_begin[t]] (its sequence's)
 *   len        int32 [T]      keys row t attends to: its position in the sequence + 1
 *   rows       int32 [T]      token row of each logits row (S of them; rows S.. T-1 hold their own index)
 *   cs, csl    f32 [T, rot]   RoPE cos/sin of each row's position (csl: sliding layers, when they differ)
 *   seq_indptr int32 [T + 1]  per sequence (N + 1 used), for attention/cuda's kernels: where its pages start
 *                             in kv_indices
 *   seq_last   int32 [T]      tokens in its last page (N used)
 *   seq_qo     int32 [T + 1]  its first row (rows qo[s] .. qo[s + 1] are its last tokens; N + 1 used)
 *   kv_indices int32 [P]      the CSR page table's indices, then one page per padding row (or one spare)
 *   pairs      int32 [2 C]    copy-on-write (src, dst) pairs
 * N = the batch's sequences + one one-row sequence per padding row (each on a page of its own).
 */
typedef struct {
    int32_t T;     /* rows computed: the batch's tokens plus padding */
    int32_t T_real;
    int32_t S;     /* logits rows */
    int32_t P;     /* page indices */
    int32_t C;     /* copy-on-write pairs */
    int32_t rot;
    int local;     /* csl present */
    int32_t N;     /* sequences, padding rows included (<= T) */
    int decode;    /* 1: every sequence has one row */
    size_t off_slots, off_tokens, off_kv_begin, off_len, off_rows, off_cs, off_csl, off_seq_indptr, off_seq_last,
        off_seq_qo, off_indices, off_pairs;
    size_t bytes;
} kvp_cuda_pack_layout;

/* What the pack needs of the model. */
typedef struct {
    int64_t vocab;
    int32_t max_len;  /* positions must stay below */
    int32_t num_blocks, block_size;
    const double *inv_freq, *inv_freq_local; /* (rot / 2); local NULL: none */
    double rope_scale;
    int32_t rot;
} kvp_cuda_pack_model;

/* The layout of batch b (its flat form) padded to T_pad rows (0: none; >= the batch's tokens). KVP_EINVAL
 * for a batch the kernels cannot read safely: a token outside the vocabulary, a position past max_len, a
 * slot or block outside the pool, a bad page table (naming the row or sequence; nothing written). */
kvp_status kvp_cuda_pack_plan(const kvp_exec_batch *b, const kvp_cuda_pack_model *pm, int32_t T_pad,
                              kvp_cuda_pack_layout *lay);
/* Fills buf (lay->bytes) with the sections of lay. */
void kvp_cuda_pack_fill(const kvp_exec_batch *b, const kvp_cuda_pack_model *pm, const kvp_cuda_pack_layout *lay,
                        void *buf);

/* ---- the executor */

/* A model on the device: the loaded CPU model's weights converted (kvp_cuda_model_upload), or seeded random
 * bf16 weights of a config's shape made on the device (kvp_cuda_model_random). */
typedef struct kvp_cuda_model kvp_cuda_model;

typedef struct {
    char device_name[256];
    int emulated, cublas;
    kvp_cuda_mem_split split;
    kvp_dtype weights;
    int32_t graph_buckets; /* 0 with --enforce-eager */
    kvp_cuda_attention attention; /* what runs (paged falls back to rowwise for an unsupported head_dim) */
    int deterministic;            /* --deterministic: tiled batch-invariant GEMMs, rowwise attention */
    /* CUDA graphs so far (kvp_cuda_executor_info; 0 at creation): */
    int32_t graphs_captured; /* captures (every bucket at creation; again after the step pack's buffer moved) */
    int64_t graph_replays;   /* decode steps run by launching a captured graph (a capture's own step too) */
    double graph_capture_s;  /* host time spent capturing and instantiating */
} kvp_cuda_info;

/* The executor over model m (borrowed; NULL with random weights: cfg then gives the shape and it owns its
 * random model), opts, the engine's block size, KV dtype, steps of at most max_tokens tokens and max_seqs
 * sequences, num_host_blocks for swap and the host tier. num_blocks: 0 from the split, else that many (at
 * most the split's). info (may be NULL) receives the split. A model split over tp > 1 ranks makes this
 * rank's executor (every rank must then step together): its communicator (kvp_model_comm, borrowed, outliving
 * the executor) must be an nccl one on opts->device, and its stream becomes the executor's compute stream
 * until the executor is destroyed. KVP_ENODEVICE ("cuda executor: no CUDA device (cudaGetDeviceCount:
 * ...)"), KVP_EUNSUPPORTED (more than 1,024 experts or 32 a token, shared experts, MLA, learned
 * positions), KVP_EINVAL (also: a host communicator, a model split for another rank count,
 * another device than the communicator's, not a KV dtype), KVP_ENOMEM. */
kvp_status kvp_cuda_executor_create(kvp_model *m, const kvp_model_config *cfg, const kvp_cuda_options *opts,
                                    int32_t num_blocks, int32_t block_size, int32_t num_host_blocks,
                                    kvp_dtype kv_dtype, int32_t max_tokens, int32_t max_seqs, kvp_executor *out,
                                    kvp_cuda_info *info);

/* The info of a cuda executor now (its graph counts included); KVP_EINVAL for another executor. */
kvp_status kvp_cuda_executor_info(const kvp_executor *ex, kvp_cuda_info *out);

/* kvp_cpu_session_create's twin: a session on a new cuda executor over m; cfg->num_blocks 0: the split's. With
 * a model split over several ranks, rank 0's (the others: KVP_ESTATE), whose executor sends each step's plan
 * to the followers (kvp_tp_leader_create over kvp_comm_host of the model's communicator). */
kvp_status kvp_cuda_session_create(kvp_model *m, const kvp_cuda_options *opts, const kvp_session_config *cfg,
                                   kvp_session **out, kvp_cuda_info *info);

/* Ranks > 0 of a model split over several ranks: a cuda executor over m with opts (borrowed) and rank 0's KV
 * shape and step limits, running rank 0's plans until it quits (kvp_tp_follow). *steps (may be NULL): plans
 * run. KVP_EINVAL on rank 0 or without a communicator; the executor's and the communicator's errors. */
kvp_status kvp_cuda_follow(kvp_model *m, const kvp_cuda_options *opts, int64_t *steps);

/* kvp_cpu_generate's twin; info receives the executor's info after the run (graph counts included). */
kvp_status kvp_cuda_generate(kvp_model *m, const kvp_cuda_options *opts, const kvp_session_config *cfg,
                             const kvp_session_request *reqs, int32_t n, kvp_session_result *results,
                             kvp_run_stats *stats, void (*on_step)(void *ctx, kvp_session *s), void *ctx,
                             kvp_cuda_info *info);

/* Prints the split and the graph counts (stderr lines "cuda executor: ...") and adds them to a JSON object as
 * "cuda" (obj may be NULL). */
struct cJSON;
void kvp_cuda_info_log(const kvp_cuda_info *info);
void kvp_cuda_info_json(const kvp_cuda_info *info, struct cJSON *obj);

#endif
