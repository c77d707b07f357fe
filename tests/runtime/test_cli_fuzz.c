/* Random command lines: a quick working command line of plan, simulate, generate and tokenize, plus one to
 * three of the command's own options (read from its --help) with values drawn from a pool of odd ones
 * (zero, negative, huge, NaN, empty, words, missing files). Every run must exit 0, or 2 with one error line
 * that says "error"; never a crash, a hang (60 s) or a sanitizer report. Runs in a temp dir, so an output
 * option given a random name writes there; the files drawn as values are copies in it (an output option
 * given one writes over the copy, never over ../shared). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"
#include "fuzz_testutil.h"
#include "model_testutil.h"

/* The --options of `kvpage cmd --help` (up to cap), each malloc'ed; returns how many. */
static int help_options(const char *cmd, char **opts, int cap)
{
    char line[256], *out, *err;
    snprintf(line, sizeof line, "%s %s --help", kvp_test_bin(), cmd);
    cr_assert_eq(kvp_test_sh(line, &out, &err), 0, "%s: %s", line, err);
    int n = 0;
    for (char *p = out; (p = strstr(p, "\n  --")) != NULL && n < cap;) {
        p += 3;
        size_t len = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
        opts[n] = strndup(p, len);
        int dup = strcmp(opts[n], "--help") == 0;
        for (int i = 0; i < n && !dup; i++) dup = strcmp(opts[i], opts[n]) == 0;
        if (dup) free(opts[n]);
        else n++;
    }
    free(out);
    free(err);
    return n;
}

Test(cli_fuzz, random_options_exit_0_or_2_with_one_error_line, .timeout = 900)
{
    tu_require_shared();
    char root[PATH_MAX], gguf[512], config[512], base[4][1200];
    cr_assert_not_null(realpath("..", root));
    cr_assert_lt(strlen(root), 400, "the project's parent path is too long for this test: %s", root);
    snprintf(gguf, sizeof gguf, "%.400s/shared/models/stories260K/stories260K.gguf", root);
    snprintf(config, sizeof config, "%.400s/shared/data/configs/Meta-Llama-3.1-8B.json", root);
    static const char *const cmds[] = {"plan", "simulate", "generate", "tokenize"};
    snprintf(base[0], sizeof base[0], "--config %s", config);
    snprintf(base[1], sizeof base[1], "--model %s --workload system:n=20,prefix=48,suffix=8,output=16", config);
    snprintf(base[2], sizeof base[2], "--model %s --prompt Once --max-tokens 4", gguf);
    snprintf(base[3], sizeof base[3], "--tokenizer %s --text 'Once upon a time'", gguf);
    const char *dir = tu_tmpdir();
    char gguf_copy[600], config_copy[600];
    snprintf(gguf_copy, sizeof gguf_copy, "%s/model.gguf", dir);
    snprintf(config_copy, sizeof config_copy, "%s/config.json", dir);
    const char *const src[2] = {gguf, config}, *const dst[2] = {gguf_copy, config_copy};
    for (int i = 0; i < 2; i++) {
        size_t len;
        unsigned char *data = tu_read_all(src[i], &len);
        tu_write_all(dst[i], data, len);
        free(data);
    }
    const char *values[] = {"0", "1", "-1", "2", "16", "3.5", "0.5", "1e999", "nan", "-0", "abc", "''", "99999999999",
                            "256", "-", "/nonexistent/x", gguf_copy, config_copy};
    const int nv = (int)(sizeof values / sizeof *values);
    uint64_t rng = 0x510e527fade682d1ull;
    for (int c = 0; c < 4; c++) {
        char *opts[96];
        const int no = help_options(cmds[c], opts, 96);
        cr_assert_gt(no, 3, "%s --help lists %d options", cmds[c], no);
        int ok = 0;
        const int runs = 120; /* at 60, one option more once left simulate with no line that ran */
        for (int r = 0; r < runs; r++) {
            char args[1024], line[7000];
            int at = 0;
            for (int k = 0, nk = 1 + (int)(fz_next(&rng) % 3); k < nk; k++) {
                at += snprintf(args + at, sizeof args - (size_t)at, " %s", opts[fz_next(&rng) % (uint64_t)no]);
                if (fz_next(&rng) % 5) /* mostly with a value; flags given one see it as a stray argument */
                    at += snprintf(args + at, sizeof args - (size_t)at, " %s", values[fz_next(&rng) % (uint64_t)nv]);
            }
            /* --tp starts MPI, whose libraries leak at exit in frames no suppression can name (as in
             * test_tp_mpi.c): those runs go without LeakSanitizer's exit check */
            snprintf(line, sizeof line, "cd %s && %s timeout 60 %s %s %s%s </dev/null", dir,
                     strstr(args, "--tp ") ? "ASAN_OPTIONS=detect_leaks=0" : "", kvp_test_bin(), cmds[c], base[c], args);
            char *out, *err;
            const int code = kvp_test_sh(line, &out, &err);
            cr_assert(code == 0 || code == 2, "%s\nexit %d: %s", line, code, err);
            cr_assert(!strstr(err, "Sanitizer") && !strstr(err, "runtime error:"), "%s\n%s", line, err);
            if (code == 2) {
                const char *nl = strchr(err, '\n');
                cr_assert(strstr(err, "error") && nl && nl[1] == '\0', "%s\nnot one error line: %s", line, err);
            } else {
                ok++;
            }
            free(out);
            free(err);
        }
        cr_assert(ok > 0 && ok < runs, "%s: %d of %d random command lines ran", cmds[c], ok, runs);
        for (int i = 0; i < no; i++) free(opts[i]);
    }
}
