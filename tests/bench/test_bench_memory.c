/* Tests of `kvpage bench memory` end to end (the main job of `make run`): every row's shares sum to 1 and
 * the run is validated; the orderings the PagedAttention paper's Figure 2 shows hold (Orca-Max < Orca-Pow2 <
 * Orca-Oracle < paged, a buddy arena below first fit); the files are written; bad input exits 2. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"

#include "cli_testutil.h"

static const cJSON *row_of(const cJSON *rows, const char *label)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, rows)
    {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, "label");
        if (cJSON_IsString(l) && strcmp(l->valuestring, label) == 0) return r;
    }
    cr_assert_fail("no row '%s'", label);
    return NULL;
}

Test(bench_memory, shares_orderings_and_files, .timeout = 120)
{
    char dir[] = "/tmp/kvp_bench_memory_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char args[512];
    snprintf(args, sizeof args, "bench memory --num-requests 300 --block-sizes 1,16,256 --format json --no-plot --out %s", dir);
    static char out[1 << 17], err[1 << 14];
    int rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "stdout is not JSON: %.200s", out);
    const cJSON *rows = kvp_test_rows(o);
    cr_assert_eq(cJSON_GetArraySize(rows), 3 * 2 + 3, "three orca strategies in two arenas, three block sizes");
    const cJSON *r;
    cJSON_ArrayForEach(r, rows)
    {
        double sum = kvp_test_num(r, "token_states") + kvp_test_num(r, "reserved") + kvp_test_num(r, "internal_frag") +
                     kvp_test_num(r, "external_frag") + kvp_test_num(r, "cached") + kvp_test_num(r, "free");
        cr_assert_float_eq(sum, 1.0, 1e-3, "shares sum to %f", sum);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")));
        cr_assert_eq(kvp_test_num(r, "requests"), 300);
        cr_assert_eq(kvp_test_num(r, "finished") + kvp_test_num(r, "rejected"), 300);
    }
    double mx = kvp_test_num(row_of(rows, "orca-max"), "token_states"),
           p2 = kvp_test_num(row_of(rows, "orca-pow2"), "token_states"),
           orc = kvp_test_num(row_of(rows, "orca-oracle"), "token_states"),
           orc_ff = kvp_test_num(row_of(rows, "orca-oracle-ff"), "token_states"),
           pg16 = kvp_test_num(row_of(rows, "paged-16"), "token_states");
    cr_assert(mx < p2 && p2 < orc && orc < orc_ff && orc_ff < pg16, "%f %f %f %f %f", mx, p2, orc, orc_ff, pg16);
    cr_assert_eq(kvp_test_num(row_of(rows, "orca-oracle"), "internal_frag"), 0, "the oracle reserves exactly");
    cr_assert_gt(kvp_test_num(row_of(rows, "paged-16"), "util_in_use"), 0.9);
    cr_assert_gt(kvp_test_num(row_of(rows, "paged-1"), "util_in_use"),
                 kvp_test_num(row_of(rows, "paged-256"), "util_in_use"));
    cr_assert_gt(kvp_test_num(row_of(rows, "paged-16"), "mean_running"),
                 1.5 * kvp_test_num(row_of(rows, "orca-oracle"), "mean_running"));
    cJSON_Delete(o);
    char path[600];
    snprintf(path, sizeof path, "%s/memory.csv", dir);
    cr_assert_eq(access(path, R_OK), 0, "%s not written", path);
    unlink(path);
    snprintf(path, sizeof path, "%s/memory.json", dir);
    cr_assert_eq(access(path, R_OK), 0, "%s not written", path);
    unlink(path);
    rmdir(dir);
}

Test(bench_memory, bad_input_exits_2)
{
    static const kvp_cli_case cases[] = {
        {"--arena best-fit", "best-fit"},
        {"--allocs paged,orca-min", "orca-min"},
        {"--block-sizes 0", "block-sizes"},
        {"--rate 0", "rate"},
        {"--model ../shared/data/configs/nope.json", "nope.json"},
        {"--bogus", "bogus"},
        {"--out /dev/null/x", "--out: cannot create '/dev/null/x'"}, /* before the run, not after it */
    };
    kvp_test_cli_rejects("bench memory --no-plot --out /tmp", cases, sizeof cases / sizeof cases[0]);
}
