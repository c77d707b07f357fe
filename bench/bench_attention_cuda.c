/* `kvpage bench attention-cuda` — the CUDA decode kernel on the decode case, paged and contiguous,
 * next to the device's measured copy bandwidth. Every row is first validated against the CPU kernel (itself
 * checked against the float64 reference by the tests). Built without CUDA, or run without a GPU, it says so
 * and exits 1. bench/gpu_check.sh runs it on a GPU machine. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/cuda/attn_cuda.h"
#include "bench/bench.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/parse.h"
#include "common/report.h"

#ifdef KVP_HAVE_CUDA
#include <cuda_runtime_api.h>

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            st = KVP_ERR(KVP_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));                               \
            goto out;                                                                                        \
        }                                                                                                    \
    } while (0)

typedef struct {
    int32_t batch, ctx, q_heads, kv_heads, head_dim, reps;
    kvp_dtype dtype;
} cuda_case;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* Device copy bandwidth: bytes read + written per second of a device-to-device cudaMemcpy of `bytes`. */
static kvp_status copy_bandwidth(size_t bytes, double *gbps)
{
    kvp_status st = KVP_OK;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < 10; i++) CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    *gbps = 2.0 * (double)bytes * 10 / (ms * 1e-3) / 1e9;
out:
    cudaFree(a), cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

/* One row: pools of `block_size` tokens in a random page order, decode on the CPU and on the GPU, compare,
 * then time the GPU kernel. */
static kvp_status run_case(const cuda_case *c, int32_t block_size, double *ms_out, double *max_err)
{
    kvp_status st = KVP_OK;
    int32_t pages_per_seq = (c->ctx + block_size - 1) / block_size;
    int32_t num_blocks = pages_per_seq * c->batch;
    kvp_paged_kv kv;
    KVP_TRY(kvp_paged_kv_init(&kv, c->dtype, num_blocks, c->kv_heads, block_size, c->head_dim));
    int32_t *indptr = kvp_malloc(sizeof(int32_t) * (size_t)(c->batch + 1));
    int32_t *indices = kvp_malloc(sizeof(int32_t) * (size_t)num_blocks);
    int32_t *last = kvp_malloc(sizeof(int32_t) * (size_t)c->batch);
    size_t qn = (size_t)c->batch * c->q_heads * c->head_dim;
    float *q = kvp_malloc(qn * sizeof(float)), *out_cpu = kvp_malloc(qn * sizeof(float)),
          *out_gpu = kvp_malloc(qn * sizeof(float));
    void *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL, *dptr = NULL, *dind = NULL, *dlast = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (!indptr || !indices || !last || !q || !out_cpu || !out_gpu) {
        st = KVP_ERR(KVP_ENOMEM, "out of host memory");
        goto out;
    }
    if ((st = kvp_paged_kv_alloc_pools(&kv)) != KVP_OK) goto out;
    size_t pool = kvp_paged_kv_pool_bytes(&kv), esz = kvp_dtype_size(c->dtype);
    for (size_t i = 0; i < pool / esz; i++) { /* random K and V in the pool's element type */
        float x = frand(), y = frand();
        if (c->dtype == KVP_DTYPE_F32) ((float *)kv.k)[i] = x, ((float *)kv.v)[i] = y;
        else if (c->dtype == KVP_DTYPE_F16) ((uint16_t *)kv.k)[i] = kvp_f32_to_f16(x), ((uint16_t *)kv.v)[i] = kvp_f32_to_f16(y);
        else ((uint16_t *)kv.k)[i] = kvp_f32_to_bf16(x), ((uint16_t *)kv.v)[i] = kvp_f32_to_bf16(y);
    }
    for (int32_t i = 0; i < num_blocks; i++) indices[i] = i;
    for (int32_t i = num_blocks - 1; i > 0; i--) { /* non-identity page table */
        int32_t j = (int32_t)((rng_state = rng_state * 6364136223846793005ull + 1) >> 33) % (i + 1), t = indices[i];
        indices[i] = indices[j], indices[j] = t;
    }
    for (int32_t s = 0; s <= c->batch; s++) indptr[s] = s * pages_per_seq;
    for (int32_t s = 0; s < c->batch; s++) last[s] = c->ctx - (pages_per_seq - 1) * block_size;
    for (size_t i = 0; i < qn; i++) q[i] = frand();
    kvp_paged_kv_set_pages(&kv, c->batch, indptr, indices, last);
    kvp_attn_params p = kvp_attn_default_params(c->q_heads);
    if ((st = kvp_attn_decode_cpu(&kv, q, out_cpu, &p)) != KVP_OK) goto out;

    CK(cudaMalloc(&dk, pool));
    CK(cudaMalloc(&dv, pool));
    CK(cudaMalloc(&dq, qn * sizeof(float)));
    CK(cudaMalloc(&dout, qn * sizeof(float)));
    CK(cudaMalloc(&dptr, sizeof(int32_t) * (size_t)(c->batch + 1)));
    CK(cudaMalloc(&dind, sizeof(int32_t) * (size_t)num_blocks));
    CK(cudaMalloc(&dlast, sizeof(int32_t) * (size_t)c->batch));
    CK(cudaMemcpy(dk, kv.k, pool, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, kv.v, pool, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, q, qn * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dptr, indptr, sizeof(int32_t) * (size_t)(c->batch + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dind, indices, sizeof(int32_t) * (size_t)num_blocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlast, last, sizeof(int32_t) * (size_t)c->batch, cudaMemcpyHostToDevice));
    kvp_paged_kv dkv = kv;
    dkv.k = dk, dkv.v = dv;
    kvp_paged_kv_set_pages(&dkv, c->batch, dptr, dind, dlast);
    if ((st = kvp_attn_decode_cuda(&dkv, dq, dout, &p, NULL)) != KVP_OK) goto out;
    CK(cudaMemcpy(out_gpu, dout, qn * sizeof(float), cudaMemcpyDeviceToHost));
    double err = 0;
    for (size_t i = 0; i < qn; i++) {
        double d = fabs((double)out_gpu[i] - out_cpu[i]) / (fabs(out_cpu[i]) + 1e-3);
        if (!(d <= err)) err = d; /* NaN propagates as a failure */
    }
    *max_err = err;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, 0));
    for (int r = 0; r < c->reps; r++)
        if ((st = kvp_attn_decode_cuda(&dkv, dq, dout, &p, NULL)) != KVP_OK) goto out;
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    *ms_out = ms / c->reps;
out:
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dptr), cudaFree(dind), cudaFree(dlast);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    kvp_paged_kv_free_pools(&kv);
    kvp_free(indptr), kvp_free(indices), kvp_free(last), kvp_free(q), kvp_free(out_cpu), kvp_free(out_gpu);
    return st;
}
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage bench attention-cuda [options]\n\n"
               "Times the CUDA paged decode kernel (attention/attn_cuda.h) on one GPU: 32 sequences x 4096\n"
               "tokens, 32 query / 8 KV heads, head_dim 128 by default, paged (random page order) and contiguous\n"
               "(one block per sequence), next to the device-to-device copy bandwidth. Each row is validated\n"
               "against the CPU kernel (relative error <= 1e-3) before it is timed. Needs a CUDA build and a GPU.\n\n"
               "  --batch N           sequences (default 32)\n"
               "  --ctx N             tokens per sequence (default 4096)\n"
               "  --dtype T           f32 | f16 | bf16 (default f16)\n"
               "  --block-sizes LIST  paged block sizes (default 1,16,64); the contiguous row is always added\n"
               "  --reps N            timed launches per row (default 20)\n"
               "  --format F          table | csv | json (default table)\n"
               "  --json              same as --format json\n"
               "  -h, --help          this help\n");
}

int kvp_bench_attention_cuda(int argc, char **argv)
{
    enum { O_BATCH = 256, O_CTX, O_DTYPE, O_BS, O_REPS, O_FORMAT, O_JSON };
    static const struct option opts[] = {
        {"batch", required_argument, 0, O_BATCH}, {"ctx", required_argument, 0, O_CTX},
        {"dtype", required_argument, 0, O_DTYPE}, {"block-sizes", required_argument, 0, O_BS},
        {"reps", required_argument, 0, O_REPS},   {"format", required_argument, 0, O_FORMAT},
        {"json", no_argument, 0, O_JSON},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int32_t batch = 32, ctx = 4096, reps = 20, bs[16] = {1, 16, 64};
    int nbs = 3;
    kvp_dtype dtype = KVP_DTYPE_F16;
    kvp_format fmt = KVP_FMT_TABLE;
    kvp_status st = KVP_OK;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_BATCH: st = kvp_parse_i32(optarg, 1, 4096, &batch); break;
        case O_CTX: st = kvp_parse_i32(optarg, 1, 1 << 20, &ctx); break;
        case O_DTYPE:
            st = kvp_dtype_parse(optarg, &dtype);
            if (st == KVP_OK && dtype == KVP_DTYPE_FP8_E4M3) st = KVP_ERR(KVP_EINVAL, "--dtype fp8 is not benchmarked");
            break;
        case O_BS: st = kvp_parse_i32_list(optarg, 1, 1 << 16, bs, 16, &nbs); break;
        case O_REPS: st = kvp_parse_i32(optarg, 1, 100000, &reps); break;
        case O_FORMAT: st = kvp_format_parse(optarg, &fmt); break;
        case O_JSON: fmt = KVP_FMT_JSON; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error("bench attention-cuda", c, argv);
        }
        if (st != KVP_OK) return kvp_cli_fail("bench attention-cuda", st);
    }
    if (optind < argc) return kvp_cli_usage_error("bench attention-cuda", "unexpected argument '%s'", argv[optind]);
    if (kvp_attn_cuda_device_count() == 0) {
        fprintf(stderr, "kvpage bench attention-cuda: error: no CUDA device (built %s CUDA)\n",
#ifdef KVP_HAVE_CUDA
                "with"
#else
                "without"
#endif
        );
        return KVP_EXIT_FAIL;
    }
#ifdef KVP_HAVE_CUDA
    static const char *const fields[] = {"layout", "dtype", "block_size", "batch", "ctx", "q_heads", "kv_heads",
                                         "head_dim", "reps", "time_ms", "kv_gbps", "copy_gbps", "pct_copy_bw",
                                         "paged_over_contig", "max_rel_err", "validated"};
    cuda_case cc = {batch, ctx, 32, 8, 128, reps, dtype};
    kvp_report *rep = NULL;
    double copy = 0, contig_ms = 0;
    if ((st = kvp_report_create(fields, (int)(sizeof fields / sizeof fields[0]), &rep)) != KVP_OK ||
        (st = copy_bandwidth((size_t)1 << 30, &copy)) != KVP_OK)
        goto done;
    double kv_bytes = 2.0 * batch * ctx * cc.kv_heads * cc.head_dim * (double)kvp_dtype_size(dtype);
    for (int i = -1; i < nbs; i++) { /* -1: contiguous, one block per sequence */
        int32_t b = i < 0 ? ctx : bs[i];
        double ms = 0, err = 0;
        if ((st = run_case(&cc, b, &ms, &err)) != KVP_OK) goto done;
        if (i < 0) contig_ms = ms;
        cJSON *row;
        if ((st = kvp_report_row(rep, &row)) != KVP_OK) goto done;
        cJSON_AddStringToObject(row, "layout", i < 0 ? "contiguous" : "paged");
        cJSON_AddStringToObject(row, "dtype", kvp_dtype_name(dtype));
        cJSON_AddNumberToObject(row, "block_size", b);
        cJSON_AddNumberToObject(row, "batch", batch);
        cJSON_AddNumberToObject(row, "ctx", ctx);
        cJSON_AddNumberToObject(row, "q_heads", cc.q_heads);
        cJSON_AddNumberToObject(row, "kv_heads", cc.kv_heads);
        cJSON_AddNumberToObject(row, "head_dim", cc.head_dim);
        cJSON_AddNumberToObject(row, "reps", reps);
        cJSON_AddNumberToObject(row, "time_ms", ms);
        cJSON_AddNumberToObject(row, "kv_gbps", kv_bytes / (ms * 1e-3) / 1e9);
        cJSON_AddNumberToObject(row, "copy_gbps", copy);
        cJSON_AddNumberToObject(row, "pct_copy_bw", 100.0 * kv_bytes / (ms * 1e-3) / 1e9 / copy);
        cJSON_AddNumberToObject(row, "paged_over_contig", ms / contig_ms);
        cJSON_AddNumberToObject(row, "max_rel_err", err);
        cJSON_AddBoolToObject(row, "validated", err <= 1e-3);
        if (!(err <= 1e-3)) {
            st = KVP_ERR(KVP_EINVAL, "CUDA decode differs from the CPU kernel at block size %d (max relative error %g)", b, err);
            kvp_report_print(rep, stdout, fmt);
            goto done;
        }
    }
    st = kvp_report_print(rep, stdout, fmt);
done:
    kvp_report_destroy(rep);
    return st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail("bench attention-cuda", st);
#else
    return KVP_EXIT_FAIL;
#endif
}
