/* `kvpage bench blockmgr`: exit codes, one-line errors, and a --quick --json run whose rows are complete and
 * validated (no timing is asserted: timings belong to the benchmark itself). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli_testutil.h"

/* Runs kvpage bench blockmgr with args; captures stdout or stderr; returns the exit code. */
static int run(const char *args, int want_stdout, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "bench blockmgr %s", args);
    return want_stdout ? kvp_test_cli(cmd, out, n, NULL, 0) : kvp_test_cli(cmd, NULL, 0, out, n);
}

Test(bench_blockmgr, bad_input_exits_2_with_one_line)
{
    static const kvp_cli_case cases[] = {
        {"--reps 0", "--reps"},           {"--block-size 0", "--block-size"}, {"--block-size 300", "--block-size"},
        {"--format xml", "xml"},          {"--frobnicate", "frobnicate"},     {"--seed -1", "--seed"},
        {"extra", "unexpected argument"}, {"--reps", "--reps"},
    };
    kvp_test_cli_rejects("bench blockmgr", cases, sizeof cases / sizeof cases[0]);
    static char err[8192];
    cr_expect_eq(run("--help", 1, err, sizeof err), 0);
    cr_expect(strstr(err, "--block-size") != NULL);
}

Test(bench_blockmgr, quick_json_rows_are_complete_and_validated)
{
    static char out[1 << 16];
    cr_assert_eq(run("--quick --reps 1 --block-size 8 --json", 1, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "stdout is JSON: %s", out);
    const cJSON *rows = kvp_test_rows(j);
    const char *want[] = {"alloc_free_1", "append_1", "append_1_by_id", "fork_128", "free_128_shared", "allocate_128", "free_128", "mixed"};
    cr_assert_eq(cJSON_GetArraySize(rows), 8);
    for (int i = 0; i < 8; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert_str_eq(cJSON_GetObjectItem(r, "case")->valuestring, want[i]);
        cr_assert_eq(cJSON_GetObjectItem(r, "block_size")->valueint, 8);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(r, "validated")), "%s validated", want[i]);
        cr_assert_gt(cJSON_GetObjectItem(r, "median_ns")->valuedouble, 0);
        cr_assert_gt(cJSON_GetObjectItem(r, "ops_per_s")->valuedouble, 0);
        cr_assert_not_null(cJSON_GetObjectItem(r, "machine"));
        cr_assert_not_null(cJSON_GetObjectItem(r, "commit"));
    }
    cJSON_Delete(j);
}
