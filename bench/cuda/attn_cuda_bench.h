/* bench/cuda/attn_cuda_bench.h — the CUDA attention benchmark's core, shared by `kvpage bench attention-cuda`
 * (bench/bench_attention_cuda.c: kvp_report tables, CSV, JSON) and the standalone kvp-attn-cuda-bench
 * (bench/cuda/attn_cuda_bench_main.c: CSV and JSON without cJSON, for bench/gpu_check.sh on a GPU machine).
 *
 * Rows: decode and prefill, paged (block sizes) and contiguous (one block per sequence), per dtype, over a
 * batch x context sweep, next to the device-to-device copy bandwidth measured in the same run. Each row is
 * validated against the CPU kernel (attention/attention.h) on the same cache before it is timed (prefill: the
 * last query tokens of the first sequence, recomputed by the CPU as a chunked prefill); a row that fails
 * validation stops the run with KVP_EINVAL after it is emitted. On the CPU emulator of CUDA the shapes are
 * tiny and the times meaningless (the rows say emulated = 1).
 *
 * Built against kvp_attn_cuda (nvcc), kvp_attn_cuda_emu (the emulator) or neither (run: KVP_ENODEVICE).
 */
#ifndef KVP_BENCH_ATTN_CUDA_BENCH_H
#define KVP_BENCH_ATTN_CUDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "attention/paged_kv.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *op;     /* "decode" or "prefill" */
    const char *layout; /* "paged" or "contiguous" */
    const char *dtype;
    int32_t block_size, batch, ctx, new_tokens, q_heads, kv_heads, head_dim, reps;
    double time_ms;           /* per launch (decode: splits and merge included) */
    double kv_gbps;           /* K/V bytes read / time */
    double copy_gbps;         /* the run's device-to-device cudaMemcpy, read + write bytes / time */
    double pct_copy_bw;       /* 100 * kv_gbps / copy_gbps */
    double paged_over_contig; /* time / the same case's contiguous time (1 for the contiguous row) */
    double tflops;            /* prefill: 4 * causal pairs * head_dim * q_heads / time; decode: 0 */
    double max_rel_err;       /* vs the CPU kernel: max |gpu - cpu| / (max |cpu| + 1e-3) */
    int validated, emulated;
} kvp_acb_row;

/* One field per column: the CSV header and the JSON keys both come from this list. */
typedef enum { KVP_ACB_STR, KVP_ACB_I32, KVP_ACB_F64, KVP_ACB_BOOL } kvp_acb_type;
typedef struct {
    const char *name;
    kvp_acb_type type;
    size_t offset;
} kvp_acb_field;
extern const kvp_acb_field kvp_acb_fields[];
extern const int kvp_acb_num_fields;

typedef struct {
    int decode, prefill;      /* which ops */
    const char *dtypes;       /* comma list (f32,f16,bf16,fp8); NULL: bf16,f16,fp8 */
    int32_t q_heads, kv_heads, head_dim, reps;
    int quick;                /* the target rows only (a bounded run for gpu_check.sh) */
} kvp_acb_opts;

/* Defaults: decode and prefill, 32 / 8 heads, head_dim 128, 20 reps (the emulator: tiny shapes). */
kvp_acb_opts kvp_acb_default_opts(void);

/* Runs the sweep, calling emit for every row (emit's nonzero status stops it). */
kvp_status kvp_acb_run(const kvp_acb_opts *o, kvp_status (*emit)(const kvp_acb_row *row, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif

#endif
