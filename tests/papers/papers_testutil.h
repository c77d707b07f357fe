/* tests/papers/papers_testutil.h — what every test of a papers/<paper>/reproduce.py does, through $KVPAGE_BIN.
 *
 * kvp_paper_check runs the script once: --check in a fresh --out folder, with --compare against a claims file
 * holding one claim the paper does not make. It must measure every one of the paper's claims within its band
 * (n_claims rows "| ok |", none OUTSIDE), and then fail, for the compare alone: so --compare is wired, and a
 * band left would show. The fresh OUT/claims.csv must then equal the committed results/claims.csv (papers/claims.py,
 * 1 % allowed): the committed results are what the code measures. kvp_paper_missing_kvpage: a kvpage that does not
 * exist is a clear error, exit 1. (The comparison itself is tested in test_claims.c.) */
#ifndef KVP_TESTS_PAPERS_TESTUTIL_H
#define KVP_TESTS_PAPERS_TESTUTIL_H

#include "cli_testutil.h"

static inline void kvp_paper_check(const char *paper, int n_claims)
{
    char dir[] = "/tmp/kvp_papers_XXXXXX", bad[] = "/tmp/kvp_claims_XXXXXX", cmd[2048];
    cr_assert_not_null(mkdtemp(dir));
    int fd = mkstemp(bad);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fputs("claim,figure,published,measured,band_lo,band_hi,within\n\"no such claim\",x,1,1,0,2,True\n", f);
    fclose(f);

    char *out, *err;
    snprintf(cmd, sizeof cmd, "%s papers/%s/reproduce.py --kvpage %s --out %s --check --compare %s", kvp_test_python(),
             paper, kvp_test_bin(), dir, bad);
    int rc = kvp_test_sh(cmd, &out, &err);
    int rows = 0;
    for (const char *p = out; (p = strstr(p, " | ok |")) != NULL; p++) rows++;
    cr_assert_eq(rows, n_claims, "%s: %d claims expected within their bands, %d found (exit %d):\n%s\n%s", paper,
                 n_claims, rows, rc, out, err);
    cr_assert(strstr(out, "OUTSIDE") == NULL, "%s", out);
    cr_assert_eq(rc, 1, "%s: --compare with a stale claims file must fail (exit %d):\n%s", paper, rc, err);
    cr_assert(strstr(err, "no such claim: in ") != NULL && strstr(err, ": not in ") != NULL, "%s", err);
    free(out);
    free(err);
    unlink(bad);

    snprintf(cmd, sizeof cmd, "%s papers/claims.py %s/claims.csv papers/%s/results/claims.csv", kvp_test_python(), dir,
             paper);
    rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 0, "%s: the committed results/claims.csv is not what the code measures (rerun reproduce.py and "
                 "commit results/):\n%s", paper, err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static inline void kvp_paper_missing_kvpage(const char *paper)
{
    char cmd[512], *out, *err;
    snprintf(cmd, sizeof cmd, "%s papers/%s/reproduce.py --kvpage /nonexistent/kvpage --out /tmp", kvp_test_python(),
             paper);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 1, "%s", err);
    cr_assert(strstr(err, "cannot run /nonexistent/kvpage") != NULL, "%s", err);
    free(out);
    free(err);
}

#endif
