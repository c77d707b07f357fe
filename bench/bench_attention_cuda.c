/* `kvpage bench attention-cuda` — the CUDA attention sweep of bench/cuda/attn_cuda_bench.h (decode and prefill,
 * paged vs contiguous, per dtype, batch x context, next to the same run's device copy bandwidth; every row
 * validated against the CPU kernel before it is timed) through kvp_report: table, CSV or JSON. Without a
 * device it says so and exits 1; bench/gpu_check.sh runs the same sweep on a GPU machine. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "attention/cuda/attn_cuda.h"
#include "bench/bench.h"
#include "bench/cuda/attn_cuda_bench.h"
#include "common/cli.h"
#include "common/parse.h"
#include "common/report.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage bench attention-cuda [options]\n\n"
               "The CUDA paged attention kernels (attention/cuda/attn_cuda.h) on one GPU: decode (64 sequences x\n"
               "4096 tokens at block sizes 1, 16, 256 and contiguous, per dtype; batch 1/8/64 x context 1024/4096;\n"
               "1 x 65536 with split-KV) and prefill (4096 new tokens), 32 query / 8 KV heads, head_dim 128, each\n"
               "row validated against the CPU kernel before it is timed, next to the device-to-device copy\n"
               "bandwidth of the same run. On kvpage's CPU emulator of CUDA: tiny shapes, timings meaningless.\n\n"
               "  --dtypes LIST  comma list of f32, f16, bf16, fp8 (default bf16,f16,fp8; the first one gets the\n"
               "                 batch / context sweep)\n"
               "  --quick        the target rows only\n"
               "  --no-decode, --no-prefill\n"
               "  --reps N       timed launches per row (default 20)\n"
               "  --format F     table | csv | json (default table); --json: same as --format json\n"
               "  --wide         a table with every column (same as --format wide)\n"
               "  -h, --help     this help\n");
}

typedef struct {
    kvp_report *rep;
} ctx_t;

static kvp_status add_row(const kvp_acb_row *r, void *c)
{
    cJSON *row;
    KVP_TRY(kvp_report_row(((ctx_t *)c)->rep, &row));
    for (int i = 0; i < kvp_acb_num_fields; i++) {
        const kvp_acb_field *f = &kvp_acb_fields[i];
        const char *p = (const char *)r + f->offset;
        switch (f->type) {
        case KVP_ACB_STR: cJSON_AddStringToObject(row, f->name, *(const char *const *)p); break;
        case KVP_ACB_I32: cJSON_AddNumberToObject(row, f->name, *(const int32_t *)p); break;
        case KVP_ACB_F64: cJSON_AddNumberToObject(row, f->name, *(const double *)p); break;
        default: cJSON_AddBoolToObject(row, f->name, *(const int *)p); break;
        }
    }
    fprintf(stderr, "bench attention-cuda: %s %s %s block %d batch %d ctx %d: %.4f ms%s\n", r->op, r->layout, r->dtype,
            r->block_size, r->batch, r->ctx, r->time_ms, r->emulated ? " (emulated, timings meaningless)" : "");
    return KVP_OK;
}

int kvp_bench_attention_cuda(int argc, char **argv)
{
    enum { O_DTYPES = 256, O_QUICK, O_NODEC, O_NOPRE, O_REPS, O_FORMAT, O_JSON, O_WIDE };
    static const struct option opts[] = {
        {"dtypes", required_argument, 0, O_DTYPES}, {"quick", no_argument, 0, O_QUICK},
        {"no-decode", no_argument, 0, O_NODEC},     {"no-prefill", no_argument, 0, O_NOPRE},
        {"reps", required_argument, 0, O_REPS},     {"format", required_argument, 0, O_FORMAT},
        {"json", no_argument, 0, O_JSON},           {"wide", no_argument, 0, O_WIDE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    kvp_acb_opts o = kvp_acb_default_opts();
    kvp_format fmt = KVP_FMT_TABLE;
    kvp_status st = KVP_OK;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_DTYPES: {
            o.dtypes = optarg;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", optarg);
            kvp_dtype t;
            for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok && st == KVP_OK; tok = strtok_r(NULL, ",", &sv))
                st = kvp_dtype_parse(tok, &t);
            break;
        }
        case O_QUICK: o.quick = 1; break;
        case O_NODEC: o.decode = 0; break;
        case O_NOPRE: o.prefill = 0; break;
        case O_REPS: st = kvp_parse_i32(optarg, 1, 100000, &o.reps); break;
        case O_FORMAT: st = kvp_format_parse(optarg, &fmt); break;
        case O_JSON: fmt = KVP_FMT_JSON; break;
        case O_WIDE: fmt = KVP_FMT_WIDE; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error("bench attention-cuda", c, argv);
        }
        if (st != KVP_OK) return kvp_cli_fail("bench attention-cuda", st);
    }
    if (optind < argc) return kvp_cli_usage_error("bench attention-cuda", "unexpected argument '%s'", argv[optind]);
    if (kvp_attn_cuda_device_count() == 0) {
        fprintf(stderr, "kvpage bench attention-cuda: error: no CUDA device (this kvpage has %s)\n",
                kvp_attn_cuda_emulated() ? "the CUDA emulator" : "no GPU, driver or CUDA build");
        return KVP_EXIT_FAIL;
    }
    if (kvp_attn_cuda_emulated()) fprintf(stderr, "bench attention-cuda: emulated, timings meaningless\n");
    ctx_t cx = {NULL};
    const char *fields[64];
    fields[0] = NULL;
    for (int i = 0; i < kvp_acb_num_fields; i++) fields[i] = kvp_acb_fields[i].name;
    static const char *const brief[] = {"op", "layout", "dtype", "block_size", "batch", "ctx", "time_ms", "kv_gbps",
                                        "pct_copy_bw", "paged_over_contig", "tflops", "validated"};
    if ((st = kvp_report_create(fields, kvp_acb_num_fields, &cx.rep)) == KVP_OK &&
        (st = kvp_report_set_brief(cx.rep, brief, (int)(sizeof brief / sizeof brief[0]))) == KVP_OK) {
        kvp_status run = kvp_acb_run(&o, add_row, &cx);
        st = kvp_report_print(cx.rep, stdout, fmt);
        if (run != KVP_OK) st = run;
    }
    kvp_report_destroy(cx.rep);
    return st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail("bench attention-cuda", st);
}
