/* tests/papers/test_sglang_neurips24.c — papers/sglang-neurips24/reproduce.py run end to end through $KVPAGE_BIN: every claim within
 * its band, and the committed results/claims.csv still what the code measures (1 % allowed). */
#include "cli_testutil.h"

static const char *k_script = "papers/sglang-neurips24/reproduce.py";

/* Runs the script with ARGS and a fresh --out folder; returns its exit code, output in *out / *err. */
static int reproduce(const char *args, char **out, char **err)
{
    char dir[] = "/tmp/kvp_papers_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 %s --kvpage %s --out %s %s", k_script, kvp_test_bin(), dir, args);
    int rc = kvp_test_sh(cmd, out, err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    return rc;
}

Test(sglang_neurips24, every_claim_is_within_its_band_and_the_committed_results_are_current)
{
    char *out, *err;
    int rc = reproduce("--check --compare papers/sglang-neurips24/results/claims.csv", &out, &err);
    cr_assert_eq(rc, 0, "reproduce.py exited %d (a claim outside its band, or results/claims.csv stale: rerun "
                 "it and commit results/):\n%s\n%s", rc, out, err);
    int rows = 0;
    for (const char *p = out; (p = strstr(p, " | ok |")) != NULL; p++) rows++;
    cr_assert_eq(rows, 14, "14 claims expected within their bands, %d found:\n%s", rows, out);
    cr_assert(strstr(out, "OUTSIDE") == NULL, "%s", out);
    free(out);
    free(err);
}

/* A stale claims file fails; a missing kvpage is a clear error. */
Test(sglang_neurips24, a_stale_claims_file_and_a_missing_kvpage_fail_loudly)
{
    char bad[] = "/tmp/kvp_claims_XXXXXX";
    int fd = mkstemp(bad);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("claim,figure,published,measured,band_lo,band_hi,within\n\"no such claim\",x,1,1,0,2,True\n", f);
    fclose(f);
    char args[256], *out, *err;
    snprintf(args, sizeof args, "--compare %s", bad);
    cr_assert_eq(reproduce(args, &out, &err), 1, "%s", err);
    cr_assert(strstr(err, "no such claim: in ") != NULL && strstr(err, ": not in ") != NULL, "%s", err);
    unlink(bad);
    free(out);
    free(err);
    cr_assert_eq(kvp_test_sh("python3 papers/sglang-neurips24/reproduce.py --kvpage /nonexistent/kvpage --out /tmp", &out, &err), 1);
    cr_assert(strstr(err, "cannot run /nonexistent/kvpage") != NULL, "%s", err);
    free(out);
    free(err);
}
