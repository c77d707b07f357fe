/* `kvpage bench attention`: exit codes, one-line errors, and a --quick --json run whose rows are complete and
 * validated (paged == contiguous to 1e-5, contiguous vs the float64 reference). No timing is asserted. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention/attention.h"
#include "cli_testutil.h"

/* Runs kvpage bench attention with args; captures stdout or stderr; returns the exit code. */
static int run(const char *args, int want_stdout, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "bench attention %s", args);
    return want_stdout ? kvp_test_cli(cmd, out, n, NULL, 0) : kvp_test_cli(cmd, NULL, 0, out, n);
}

Test(bench_attention, bad_input_exits_2_with_one_line)
{
    static const kvp_cli_case cases[] = {
        {"--reps 0", "--reps"},           {"--threads 0", "--threads"},     {"--threads x", "--threads"},
        {"--format xml", "xml"},          {"--frobnicate", "frobnicate"},   {"extra", "unexpected argument"},
        {"--reps", "--reps"},             {"--out-dir /nonexistent/dir", "/nonexistent/dir"},
        {"--lanes 9", "'9'"},             {"--lanes 8,8,8,8", "at most 3"}, {"--lanes ,", "empty list"},
    };
    kvp_test_cli_rejects("bench attention", cases, sizeof cases / sizeof cases[0]);
    static char err[8192];
    cr_expect_eq(run("--help", 1, err, sizeof err), 0);
    cr_expect(strstr(err, "--quick") != NULL);
}

Test(bench_attention, quick_json_rows_complete_validated_and_files_written)
{
    static char out[1 << 17];
    char dir[] = "/tmp/kvp_bench_attn_XXXXXX", args[256], path[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(args, sizeof args, "--quick --reps 1 --threads 2 --json --out-dir %s", dir);
    cr_assert_eq(run(args, 1, out, sizeof out), 0);
    cJSON *rows = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(rows), "stdout is a JSON array: %s", out);
    /* memcpy, memread; decode: contiguous, paged 1, paged 16, dense_ref; prefill: contiguous, paged 1, 16 */
    cr_assert_eq(cJSON_GetArraySize(rows), 9);
    const char *kernels[] = {"memcpy", "memread", "decode", "decode", "decode", "decode", "prefill", "prefill", "prefill"};
    const char *layouts[] = {"64MiB", "64MiB", "contiguous", "paged", "paged", "dense_ref", "contiguous", "paged", "paged"};
    for (int i = 0; i < 9; i++) {
        cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert_str_eq(cJSON_GetObjectItem(r, "kernel")->valuestring, kernels[i]);
        cr_assert_str_eq(cJSON_GetObjectItem(r, "layout")->valuestring, layouts[i]);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "validated")), "row %d validated", i);
        cr_assert_gt(cJSON_GetObjectItem(r, "kv_gbps")->valuedouble, 0.0, "row %d: kv_gbps > 0", i);
        cr_assert_gt(cJSON_GetObjectItem(r, "copy_gbps")->valuedouble, 0.0, "row %d: copy_gbps > 0", i);
        cr_assert_gt(cJSON_GetObjectItem(r, "time_ms")->valuedouble, 0.0, "row %d: time_ms > 0", i);
        cr_assert_not_null(cJSON_GetObjectItem(r, "machine"));
        if (i > 1) cr_assert_not_null(cJSON_GetObjectItem(r, "paged_over_contig"), "row %d: ratio present", i);
        /* decode layouts carry their read floor; the reference and prefill rows do not */
        cJSON *rg = cJSON_GetObjectItem(r, "read_gbps");
        if (i >= 2 && i <= 4) {
            cr_assert(cJSON_IsNumber(rg) && rg->valuedouble > 0.0, "row %d: read_gbps > 0", i);
            cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(r, "pct_read_bw")), "row %d: pct_read_bw", i);
        } else {
            cr_assert(rg == NULL || cJSON_IsNull(rg), "row %d: no read floor", i);
        }
    }
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 3), "block_size")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 4), "block_size")->valueint, 16);
    /* memread counts the bytes read only (memcpy: read + written), against the same copy figure */
    const cJSON *mc = cJSON_GetArrayItem(rows, 0), *mr = cJSON_GetArrayItem(rows, 1);
    cr_assert_float_eq(cJSON_GetObjectItem(mr, "kv_bytes")->valuedouble, cJSON_GetObjectItem(mc, "kv_bytes")->valuedouble / 2, 1);
    /* each figure is printed to 4 significant digits: up to 5e-4 relative error apiece (a fixed 0.1 failed
     * when a concurrent test slowed the copy and the share rose past 400 %) */
    const double pct = cJSON_GetObjectItem(mr, "pct_copy_bw")->valuedouble,
                 want = 100 * cJSON_GetObjectItem(mr, "kv_gbps")->valuedouble / cJSON_GetObjectItem(mc, "kv_gbps")->valuedouble;
    cr_assert(fabs(pct - want) <= 2e-3 * want, "memread pct_copy_bw %g, kv_gbps ratio gives %g", pct, want);
    cJSON_Delete(rows);
    snprintf(path, sizeof path, "%s/attention.csv", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s written", path);
    char line[1024];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert(strncmp(line, "kernel,layout,dtype,block_size", 30) == 0, "CSV header: %s", line);
    int n = 0;
    while (fgets(line, sizeof line, f)) n++;
    fclose(f);
    cr_assert_eq(n, 9, "9 CSV rows");
    unlink(path);
    snprintf(path, sizeof path, "%s/attention.json", dir);
    cr_assert_eq(access(path, R_OK), 0);
    unlink(path);
    rmdir(dir);
}

/* Automatic lanes: decode scores on 8 and values on the widest, prefill on the widest. A lane list times every layout with each
 * setting (rows in layout order, settings inside), and each paged row's ratio is against the contiguous
 * row of its own setting. */
Test(bench_attention, lane_list_rows_per_setting_and_ratios_within_setting)
{
    static char out[1 << 17];
    const int max = kvp_cpu_max_lanes();
    cr_assert_eq(run("--quick --reps 1 --threads 2 --json --no-write", 1, out, sizeof out), 0);
    cJSON *rows = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(rows));
    int seen = 0;
    for (cJSON *r = rows->child; r; r = r->next) {
        const char *k = cJSON_GetObjectItem(r, "kernel")->valuestring, *l = cJSON_GetObjectItem(r, "layout")->valuestring;
        if (strcmp(l, "dense_ref") == 0 || strncmp(k, "mem", 3) == 0) continue;
        cr_assert_eq(cJSON_GetObjectItem(r, "score_lanes")->valueint, strcmp(k, "decode") == 0 ? 8 : max, "%s %s", k, l);
        cr_assert_eq(cJSON_GetObjectItem(r, "value_lanes")->valueint, max, "%s %s", k, l);
        seen++;
    }
    cr_assert_eq(seen, 6);
    cJSON_Delete(rows);
    char args[128];
    snprintf(args, sizeof args, "--quick --reps 1 --threads 2 --json --no-write --lanes %s", max == 16 ? "8,16" : "8,8");
    cr_assert_eq(run(args, 1, out, sizeof out), 0);
    rows = cJSON_Parse(out);
    cr_assert(cJSON_IsArray(rows));
    /* memcpy, memread, decode 3 layouts x 2 + dense_ref, prefill 3 layouts x 2 */
    cr_assert_eq(cJSON_GetArraySize(rows), 2 + 7 + 6);
    double contig[2] = {0, 0};
    int i = 0;
    for (cJSON *r = rows->child; r; r = r->next, i++) {
        const char *l = cJSON_GetObjectItem(r, "layout")->valuestring;
        if (i < 2 || strcmp(l, "dense_ref") == 0) continue;
        const int pos = (i < 9 ? i - 2 : i - 9), li = pos % 2;
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "validated")), "row %d validated", i);
        cr_assert_eq(cJSON_GetObjectItem(r, "score_lanes")->valueint, max == 16 && li ? 16 : 8, "row %d", i);
        cr_assert_eq(cJSON_GetObjectItem(r, "value_lanes")->valueint, max == 16 && li ? 16 : 8, "row %d", i);
        const double t = cJSON_GetObjectItem(r, "time_ms")->valuedouble;
        if (pos < 2) {
            cr_assert_str_eq(l, "contiguous");
            contig[li] = t;
            continue;
        }
        const double ratio = cJSON_GetObjectItem(r, "paged_over_contig")->valuedouble;
        cr_assert(fabs(ratio - t / contig[li]) <= 2e-3 * ratio, "row %d: ratio %g vs %g / %g", i, ratio, t, contig[li]);
    }
    cJSON_Delete(rows);
}

Test(bench_attention, cuda_bad_input_exits_2_before_touching_a_device)
{
    static const kvp_cli_case cases[] = {
        {"--dtypes f64", "unknown dtype 'f64'"}, {"--dtypes f16,int4", "int4"}, {"--reps 0", "out of range"},
        {"--bogus", "unknown option"},
    };
    kvp_test_cli_rejects("bench attention-cuda", cases, sizeof cases / sizeof cases[0]);
    static char err[4096];
    cr_expect_eq(kvp_test_cli("bench attention-cuda --help", err, sizeof err, NULL, 0), 0);
    cr_expect(strstr(err, "--dtypes") != NULL);
}
