/* `kvpage bench attention`: exit codes, one-line errors, and a --quick --json run whose rows are complete and
 * validated (paged == contiguous to 1e-5, contiguous vs the float64 reference). No timing is asserted. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    cr_assert_float_eq(cJSON_GetObjectItem(mr, "pct_copy_bw")->valuedouble,
                       100 * cJSON_GetObjectItem(mr, "kv_gbps")->valuedouble / cJSON_GetObjectItem(mc, "kv_gbps")->valuedouble, 0.1);
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

Test(bench_attention, cuda_bad_input_exits_2_before_touching_a_device)
{
    static const kvp_cli_case cases[] = {
        {"--dtype fp8", "fp8"}, {"--block-sizes 4,x", "'x'"}, {"--reps 0", "out of range"}, {"--bogus", "unknown option"},
    };
    kvp_test_cli_rejects("bench attention-cuda", cases, sizeof cases / sizeof cases[0]);
    static char err[4096];
    cr_expect_eq(kvp_test_cli("bench attention-cuda --help", err, sizeof err, NULL, 0), 0);
    cr_expect(strstr(err, "--block-sizes") != NULL);
}
