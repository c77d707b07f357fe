/* tests/cli_testutil.h — run the kvpage binary that CTest points at ($KVPAGE_BIN) and capture its output.
 * For the command-line tests of every module (exit codes, one-line errors, --json output). */
#ifndef KVP_TESTS_CLI_TESTUTIL_H
#define KVP_TESTS_CLI_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"

/* Numeric field k of a JSON row (--json output); fails the test when it is missing or not a number. */
static inline double kvp_test_num(const cJSON *row, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, k);
    cr_assert(cJSON_IsNumber(v), "field %s", k);
    return v->valuedouble;
}

/* The rows of a benchmark's --json output (an array, or an object's "rows"); fails the test when there are none. */
static inline const cJSON *kvp_test_rows(const cJSON *doc)
{
    const cJSON *rows = cJSON_IsArray(doc) ? doc : cJSON_GetObjectItemCaseSensitive(doc, "rows");
    cr_assert(cJSON_IsArray(rows), "the --json output holds no rows");
    return rows;
}

/* Reads f to its end, keeping at most cap-1 bytes in buf (NUL-terminated; the rest is read and dropped, so
 * a writer into a pipe never dies of SIGPIPE); buf may be NULL to discard everything. */
static inline void kvp_test_slurp(FILE *f, char *buf, size_t cap)
{
    char sink[4096];
    size_t n = 0, got;
    for (;;) {
        const int keep = buf && n + 1 < cap;
        got = fread(keep ? buf + n : sink, 1, keep ? cap - 1 - n : sizeof sink, f);
        if (got == 0) break;
        if (keep) n += got;
    }
    if (buf) buf[n] = '\0';
}

/* Runs `$KVPAGE_BIN ARGS` (ARGS go through the shell); stdout into out, stderr into err (either may be
 * NULL). Returns the exit code, or -1 when the program did not exit normally (a crash). */
static inline int kvp_test_cli(const char *args, char *out, size_t out_cap, char *err, size_t err_cap)
{
    const char *bin = getenv("KVPAGE_BIN");
    cr_assert_not_null(bin, "KVPAGE_BIN must point at the kvpage binary (set by CTest)");
    char errpath[] = "/tmp/kvp_cli_err_XXXXXX";
    int fd = mkstemp(errpath);
    cr_assert_geq(fd, 0, "cannot create a temporary file");
    close(fd);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", bin, args, errpath);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "cannot run %s", cmd);
    kvp_test_slurp(p, out, out_cap);
    int st = pclose(p);
    FILE *e = fopen(errpath, "r");
    cr_assert_not_null(e);
    kvp_test_slurp(e, err, err_cap);
    fclose(e);
    unlink(errpath);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* $KVPAGE_BIN, the binary under test. */
static inline const char *kvp_test_bin(void)
{
    const char *b = getenv("KVPAGE_BIN");
    cr_assert_not_null(b, "KVPAGE_BIN is not set (run the tests through ctest)");
    return b;
}

/* $KVPAGE_PYTHON, the interpreter the project's Python scripts run on (CMake's KVPAGE_PYTHON, default
 * /usr/bin/python3: scripts/install-deps.sh installs python3-matplotlib for it). */
static inline const char *kvp_test_python(void)
{
    const char *p = getenv("KVPAGE_PYTHON");
    return p && p[0] ? p : "/usr/bin/python3";
}

/* All of f, malloc'ed and NUL-terminated. */
static inline char *kvp_test_read_all(FILE *f)
{
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0)
        if (cap - (n += got) < 4096) cr_assert_not_null(buf = realloc(buf, cap *= 2));
    buf[n] = '\0';
    return buf;
}

/* Runs a shell command line (any program, any output size); returns its exit code (-1: it did not exit
 * normally), stdout in *out and stderr in *err (both malloc'ed). */
static inline int kvp_test_sh(const char *cmdline, char **out, char **err)
{
    char errpath[] = "/tmp/kvp_sh_err_XXXXXX";
    int fd = mkstemp(errpath);
    cr_assert_geq(fd, 0);
    close(fd);
    char full[8192];
    snprintf(full, sizeof full, "%s 2>%s", cmdline, errpath);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    *out = kvp_test_read_all(p);
    int status = pclose(p);
    FILE *e = fopen(errpath, "r");
    cr_assert_not_null(e);
    *err = kvp_test_read_all(e);
    fclose(e);
    unlink(errpath);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* One bad command line and a piece of its expected error message. */
typedef struct {
    const char *args, *needle;
} kvp_cli_case;

/* Each `PREFIX ARGS` must exit 2 with exactly one line on stderr that contains the needle. */
static inline void kvp_test_cli_rejects(const char *prefix, const kvp_cli_case *cases, size_t n)
{
    static char err[8192];
    for (size_t i = 0; i < n; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s %s", prefix, cases[i].args);
        int code = kvp_test_cli(cmd, NULL, 0, err, sizeof err);
        cr_expect_eq(code, 2, "'%s' exited %d", cmd, code);
        cr_expect(strstr(err, cases[i].needle) != NULL, "'%s': '%s' lacks '%s'", cmd, err, cases[i].needle);
        cr_expect(strchr(err, '\n') == err + strlen(err) - 1, "'%s': one line expected, got '%s'", cmd, err);
    }
}

#endif
