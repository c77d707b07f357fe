/* tests/papers/test_claims.c — papers/claims.py, the claims table every reproduction shares: the comparison of
 * two claims files (a value moved by more than 1 %, a claim missing on either side, an unreadable file), and
 * Claims.finish's table, claims.csv and exit status under --check, --compare and a --plot that fails. */
#include "cli_testutil.h"

/* A claims.csv holding `rows` (lines after the header) in a fresh temporary file; its path in path[32]. */
static void claims_file(char path[32], const char *rows)
{
    snprintf(path, 32, "/tmp/kvp_claims_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fprintf(f, "claim,figure,published,measured,band_lo,band_hi,within\n%s", rows);
    fclose(f);
}

static int compare(const char *a, const char *b, char **err)
{
    char cmd[256], *out;
    snprintf(cmd, sizeof cmd, "%s papers/claims.py %s %s", kvp_test_python(), a, b);
    int rc = kvp_test_sh(cmd, &out, err);
    free(out);
    return rc;
}

Test(claims, compare_finds_a_moved_value_and_a_missing_claim_and_allows_1_percent)
{
    char now[32], same[32], near[32], moved[32], fewer[32], more[32], *err;
    const char *rows = "\"hit rate (%)\",Fig. 1,50,40.2,0,100,True\n\"gain (x)\",Fig. 2,2,0,0,1,True\n";
    claims_file(now, rows);
    claims_file(same, rows);
    claims_file(near, "\"hit rate (%)\",Fig. 1,50,40.5,0,100,True\n\"gain (x)\",Fig. 2,2,0,0,1,True\n");
    claims_file(moved, "\"hit rate (%)\",Fig. 1,50,41,0,100,True\n\"gain (x)\",Fig. 2,2,1e-10,0,1,True\n");
    claims_file(fewer, "\"hit rate (%)\",Fig. 1,50,40.2,0,100,True\n");
    claims_file(more, "\"hit rate (%)\",Fig. 1,50,40.2,0,100,True\n\"gain (x)\",Fig. 2,2,0,0,1,True\n\"extra\",x,1,1,0,2,True\n");

    cr_assert_eq(compare(now, same, &err), 0, "%s", err);
    cr_assert(strstr(err, "2 claims, 0 differences"), "%s", err);
    free(err);
    cr_assert_eq(compare(now, near, &err), 0, "0.75 %% is within 1 %%: %s", err);
    free(err);
    cr_assert_eq(compare(now, moved, &err), 1);
    cr_assert(strstr(err, "hit rate (%): measured 40.2 here, 41 in ") != NULL, "%s", err);
    cr_assert(strstr(err, "gain (x)") == NULL, "a zero against 1e-10 is no difference: %s", err);
    free(err);
    cr_assert_eq(compare(now, fewer, &err), 1);
    cr_assert(strstr(err, "gain (x): not in ") != NULL, "%s", err);
    free(err);
    cr_assert_eq(compare(now, more, &err), 1);
    cr_assert(strstr(err, "extra: in ") != NULL && strstr(err, ", not measured") != NULL, "%s", err);
    free(err);
    cr_assert_eq(compare(now, "/nonexistent/claims.csv", &err), 2);
    cr_assert(strstr(err, "cannot read") != NULL && strstr(err, "/nonexistent/claims.csv") != NULL, "%s", err);
    free(err);
    const char *files[] = {now, same, near, moved, fewer, more};
    for (int i = 0; i < 6; i++) unlink(files[i]);
}

/* A two-claim reproduction through Claims.finish: the table rows, OUT/claims.csv, and the exit status. */
static int finish(const char *dir, const char *opts, char **out, char **err)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s -c 'import argparse, sys; sys.path.insert(0, \"papers\"); import claims; "
             "ap = argparse.ArgumentParser(); claims.add_arguments(ap, \".\", \"x.png\"); a = ap.parse_args(sys.argv[1:]); "
             "c = claims.Claims(); c(\"inside\", \"Fig. 1\", 3, 2.5, 2, 3); c(\"outside\", \"Fig. 2\", \"> 1\", 0.5, 1, float(\"inf\")); "
             "sys.exit(c.finish(a, 7, note=\" (a note)\", plot=lambda: __import__(\"kvp_no_such_module\")))' --out %s %s",
             kvp_test_python(), dir, opts);
    return kvp_test_sh(cmd, out, err);
}

Test(claims, finish_writes_the_table_and_fails_a_check_outside_its_band)
{
    char dir[] = "/tmp/kvp_claims_dir_XXXXXX", *out, *err;
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(finish(dir, "", &out, &err), 0, "without --check a band left is reported, not fatal: %s", err);
    cr_assert(strstr(out, "| inside | Fig. 1 | 3 | 2.5 | 2-3 | ok |") != NULL, "%s", out);
    cr_assert(strstr(out, "| outside | Fig. 2 | > 1 | 0.5 | 1-inf | OUTSIDE |") != NULL, "%s", out);
    cr_assert(strstr(err, "7 kvpage runs, 1 of 2 claims within their bands (a note)") != NULL, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(finish(dir, "--check", &out, &err), 1, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(finish(dir, "--plot", &out, &err), 2, "a plot that cannot be drawn: %s", err);
    cr_assert(strstr(err, "--plot: No module named 'kvp_no_such_module' (pip install matplotlib)") != NULL, "%s", err);
    free(out);
    free(err);

    char csv[64];
    snprintf(csv, sizeof csv, "%s/claims.csv", dir);
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f, "finish writes OUT/claims.csv");
    char *text = kvp_test_read_all(f);
    fclose(f);
    cr_assert(strstr(text, "inside,Fig. 1,3,2.5,2,3,True\r\n") != NULL, "%s", text);
    cr_assert(strstr(text, "outside,Fig. 2,> 1,0.5,1,inf,False\r\n") != NULL, "%s", text);
    free(text);

    /* --compare against its own claims.csv passes; a claim missing from it fails. */
    char opts[128];
    snprintf(opts, sizeof opts, "--compare %s", csv);
    cr_assert_eq(finish(dir, opts, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    f = fopen(csv, "w");
    cr_assert_not_null(f);
    fputs("claim,figure,published,measured,band_lo,band_hi,within\ninside,Fig. 1,3,2.5,2,3,True\n", f);
    fclose(f);
    cr_assert_eq(finish(dir, opts, &out, &err), 1, "%s", err);
    cr_assert(strstr(err, "outside: not in ") != NULL, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(finish(dir, "--compare /nonexistent/claims.csv", &out, &err), 2);
    cr_assert(strstr(err, "--compare: cannot read /nonexistent/claims.csv") != NULL, "%s", err);
    free(out);
    free(err);
    snprintf(opts, sizeof opts, "rm -rf %s", dir);
    cr_assert_eq(system(opts), 0);
}
