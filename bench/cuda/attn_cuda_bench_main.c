/* bench/cuda/attn_cuda_bench_main.c — kvp-attn-cuda-bench: the CUDA attention benchmark (bench/cuda/attn_cuda_bench.h)
 * as a standalone program that needs no cJSON or Criterion (bench/gpu_check.sh builds it on a GPU machine;
 * `kvpage bench attention-cuda` is the same sweep through kvp_report). CSV or JSON to stdout (--csv-out /
 * --json-out FILE write either as well), progress to stderr. Exit 0, 1 on a failure (a row that fails
 * validation included), 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/cuda/attn_cuda_bench.h"

#ifndef KVP_GIT_COMMIT
#define KVP_GIT_COMMIT "unknown"
#endif

typedef struct {
    FILE *out[4]; /* stdout (csv or json), --csv-out, --json-out */
    int json[4];
    int rows;
    const char *machine;
} sink;

static void print_value(FILE *f, const kvp_acb_row *r, const kvp_acb_field *fd, int json)
{
    const char *p = (const char *)r + fd->offset;
    switch (fd->type) {
    case KVP_ACB_STR: fprintf(f, json ? "\"%s\"" : "%s", *(const char *const *)p); break;
    case KVP_ACB_I32: fprintf(f, "%d", *(const int32_t *)p); break;
    case KVP_ACB_F64: fprintf(f, "%.6g", *(const double *)p); break;
    default: fprintf(f, "%s", *(const int *)p ? "true" : "false"); break;
    }
}

static void write_row(FILE *f, int json, int first, const kvp_acb_row *r, const char *machine)
{
    if (!json && first) {
        fprintf(f, "machine,commit");
        for (int i = 0; i < kvp_acb_num_fields; i++) fprintf(f, ",%s", kvp_acb_fields[i].name);
        fputc('\n', f);
    }
    if (json) fprintf(f, "%s{\"machine\": \"%s\", \"commit\": \"%s\"", first ? "[\n  " : ",\n  ", machine, KVP_GIT_COMMIT);
    else fprintf(f, "\"%s\",%s", machine, KVP_GIT_COMMIT);
    for (int i = 0; i < kvp_acb_num_fields; i++) {
        if (json) fprintf(f, ", \"%s\": ", kvp_acb_fields[i].name);
        else fputc(',', f);
        print_value(f, r, &kvp_acb_fields[i], json);
    }
    fputs(json ? "}" : "\n", f);
    fflush(f);
}

/* One row to every stream (the CSV header and the JSON keys from kvp_acb_fields), progress to stderr. */
static kvp_status emit(const kvp_acb_row *r, void *ctx)
{
    sink *s = ctx;
    for (int i = 0; i < 4; i++)
        if (s->out[i]) write_row(s->out[i], s->json[i], s->rows == 0, r, s->machine);
    s->rows++;
    fprintf(stderr, "kvp-attn-cuda-bench: %s %s %s bs %d batch %d ctx %d: %.4f ms, %.0f GB/s (%.0f %% of copy), "
            "%.2f TFLOP/s, err %.2g%s\n", r->op, r->layout, r->dtype, r->block_size, r->batch, r->ctx, r->time_ms,
            r->kv_gbps, r->pct_copy_bw, r->tflops, r->max_rel_err, r->emulated ? " (emulated, timings meaningless)" : "");
    return KVP_OK;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvp-attn-cuda-bench [--quick] [--dtypes LIST] [--reps N] [--no-prefill] [--no-decode]\n"
               "                           [--json] [--csv-out FILE] [--json-out FILE] [--machine TEXT]\n"
               "The CUDA attention sweep of bench/cuda/attn_cuda_bench.h (see `kvpage bench attention-cuda --help`).\n");
}

int main(int argc, char **argv)
{
    kvp_acb_opts o = kvp_acb_default_opts();
    const char *csv_out = NULL, *json_out = NULL, *machine = getenv("KVP_MACHINE");
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) o.quick = 1;
        else if (strcmp(a, "--no-prefill") == 0) o.prefill = 0;
        else if (strcmp(a, "--no-decode") == 0) o.decode = 0;
        else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--dtypes") == 0 && v) o.dtypes = v, i++;
        else if (strcmp(a, "--reps") == 0 && v) o.reps = atoi(v), i++;
        else if (strcmp(a, "--csv-out") == 0 && v) csv_out = v, i++;
        else if (strcmp(a, "--json-out") == 0 && v) json_out = v, i++;
        else if (strcmp(a, "--machine") == 0 && v) machine = v, i++;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
        else return usage(stderr), fprintf(stderr, "kvp-attn-cuda-bench: unknown or incomplete option '%s'\n", a), 2;
    }
    if (o.reps < 1) return fprintf(stderr, "kvp-attn-cuda-bench: --reps must be >= 1\n"), 2;
    sink s = {{stdout, NULL, NULL, NULL}, {json, 0, 1, 0}, 0, machine ? machine : "unknown"};
    if (csv_out && !(s.out[1] = fopen(csv_out, "w"))) return fprintf(stderr, "kvp-attn-cuda-bench: cannot write %s\n", csv_out), 1;
    if (json_out && !(s.out[2] = fopen(json_out, "w"))) return fprintf(stderr, "kvp-attn-cuda-bench: cannot write %s\n", json_out), 1;
    if (s.out[1]) s.json[1] = 0;
    const kvp_status st = kvp_acb_run(&o, emit, &s);
    for (int i = 0; i < 3; i++)
        if (s.out[i] && s.json[i]) fputs(s.rows ? "\n]\n" : "[]\n", s.out[i]);
    if (s.out[1]) fclose(s.out[1]);
    if (s.out[2]) fclose(s.out[2]);
    if (st != KVP_OK) {
        fprintf(stderr, "kvp-attn-cuda-bench: error: %s\n", kvp_error_detail());
        return 1;
    }
    return 0;
}
