/* tests/runtime/serve_testutil.h — `kvpage serve` as a child process for the serve tests: start it on a free
 * port (its --json line gives the port and the pid to signal), talk HTTP/1.1 over loopback with a plain socket
 * client, read /metrics, stop it with SIGTERM and require exit status 0 (under the sanitizer build, with
 * LeakSanitizer's check). Static functions: one copy per test file. */
#ifndef KVP_TESTS_SERVE_TESTUTIL_H
#define KVP_TESTS_SERVE_TESTUTIL_H

#pragma GCC diagnostic ignored "-Wunused-function" /* each file uses some of the helpers */

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_testutil.h"
#include "http_testutil.h"
#include "common/json.h"
#include "model_testutil.h"
#include "prefix_cache/host_cache.h"
#include "runtime/text/chat.h"
#include "runtime/text/tokenizer.h"

typedef struct {
    pid_t pid;      /* the child: kvpage, or mpirun */
    pid_t serving;  /* the process that serves (rank 0 under mpirun): the one to signal */
    int port;
    int num_blocks;  /* of its --json line */
    char kv_dtype[8];
    char errpath[64], outpath[64];
} server;

/* Every process that starts MPI runs without LeakSanitizer's exit check (as in test_tp_mpi.c). */
#define MPIRUN "env ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe"

static void temp_path(char *path, size_t cap, const char *what)
{
    snprintf(path, cap, "/tmp/kvp_serve_%s_XXXXXX", what);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
}

/* Starts `PREFIX kvpage serve --model GGUF --port 0 --json EXTRA` (PREFIX: "", or mpirun) and waits (up to
 * 120 s) for its --json line: the port, and the pid to signal. */
static server start_with(const char *prefix, const char *extra)
{
    tu_require_shared();
    server s = {0};
    temp_path(s.errpath, sizeof s.errpath, "err");
    temp_path(s.outpath, sizeof s.outpath, "out");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s %s serve --model %s --port 0 --json %s >%s 2>%s", prefix, kvp_test_bin(),
             S260_GGUF, extra, s.outpath, s.errpath);
    s.pid = fork();
    cr_assert_geq(s.pid, 0);
    if (s.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a test killed by its timeout takes its server with it */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1200 && s.port == 0; i++) {
        size_t len;
        char *out = (char *)tu_read_all(s.outpath, &len);
        out[len] = '\0';
        cJSON *j = strchr(out, '\n') ? cJSON_Parse(out) : NULL;
        if (j) {
            cr_assert_eq(sscanf(cJSON_GetObjectItem(j, "url")->valuestring, "http://127.0.0.1:%d", &s.port), 1, "%s", out);
            s.serving = (pid_t)cJSON_GetObjectItem(j, "pid")->valuedouble;
            s.num_blocks = cJSON_GetObjectItem(j, "num_blocks")->valueint;
            snprintf(s.kv_dtype, sizeof s.kv_dtype, "%s", cJSON_GetObjectItem(j, "kv_dtype")->valuestring);
            if (!strstr(extra, "--weight-dtype")) /* the default, auto, holds stories260K's f32 matrices in f32 */
                cr_assert_str_eq(cJSON_GetObjectItem(j, "weight_dtype")->valuestring, "f32", "%s", out);
            cJSON_Delete(j);
        }
        free(out);
        int st;
        if (s.port == 0 && waitpid(s.pid, &st, WNOHANG) == s.pid) {
            char *err = (char *)tu_read_all(s.errpath, &len);
            err[len] = '\0';
            cr_assert_fail("the server exited: %s", err);
        }
        if (s.port == 0) usleep(100 * 1000);
    }
    cr_assert_gt(s.port, 0, "the server did not start listening");
    return s;
}

static server start(const char *extra) { return start_with("", extra); }

/* SIGTERM to the serving process, then the child's exit status must be 0. */
static void stop(server *s)
{
    cr_assert_eq(kill(s->serving, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(s->pid, &st, 0), s->pid);
    size_t len;
    char *err = (char *)tu_read_all(s->errpath, &len);
    err[len] = '\0';
    const int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok) fprintf(stderr, "server ended with status %d: %s\n", st, err);
    free(err);
    cr_assert(ok, "the server did not exit 0");
    unlink(s->errpath);
    unlink(s->outpath);
}

/* One HTTP/1.1 exchange (http_testutil.h); no asserts: client threads call it too. */
static int http_try(const server *s, const char *method, const char *path, const char *body, char **resp)
{
    return tu_http(s->port, method, path, body, body ? strlen(body) : 0, resp);
}

static int http(const server *s, const char *method, const char *path, const char *body, char **resp)
{
    int code = http_try(s, method, path, body, resp);
    cr_assert_geq(code, 0, "%s %s: no HTTP answer from port %d", method, path, s->port);
    return code;
}

/* POST path with body; the code must be want; returns the parsed answer. */
static cJSON *post_json(const server *s, const char *path, const char *body, int want)
{
    char *resp;
    int code = http(s, "POST", path, body, &resp);
    cr_assert_eq(code, want, "%s -> %d: %s", body, code, resp);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(resp, strlen(resp), "response", &j), KVP_OK, "%s", resp);
    free(resp);
    return j;
}

static cJSON *complete(const server *s, const char *body, int want) { return post_json(s, "/v1/completions", body, want); }
static cJSON *chat(const server *s, const char *body, int want) { return post_json(s, "/v1/chat/completions", body, want); }

static const char *choice_text(const cJSON *j, int i)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), i);
    cr_assert_not_null(c, "no choice %d", i);
    return cJSON_GetObjectItem(c, "text")->valuestring;
}

/* The prompt tokens the prefix cache served (usage.prompt_tokens_details.cached_tokens). */
static double cached_of(const cJSON *j)
{
    return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens_details"),
                               "cached_tokens")->valuedouble;
}

/* The value of sample `name` in a /metrics page: a metric whose only label is model_name, or with `name`
 * ending in its labels ('x{finished_reason="stop"'); NAN when absent. */
static double metric_in(const char *page, const char *name)
{
    const size_t n = strlen(name);
    const int labelled = strchr(name, '{') != NULL;
    for (const char *p = strstr(page, name); p; p = strstr(p + 1, name)) {
        if (p != page && p[-1] != '\n') continue;
        const char *q = p + n, *eol = strchr(q, '\n');
        if (!labelled) {
            if (*q == ' ') return atof(q + 1);
            if (strncmp(q, "{model_name=", 12) != 0) continue;
        }
        const char *close = strchr(q, '}');
        if (close && (!eol || close < eol)) return atof(close + 2);
    }
    return NAN;
}

/* A metric's value from /metrics (it must be there). */
static double metric(const server *s, const char *name)
{
    char *resp;
    cr_assert_eq(http(s, "GET", "/metrics", NULL, &resp), 200);
    const double v = metric_in(resp, name);
    cr_assert(!isnan(v), "no metric %s in %s", name, resp);
    free(resp);
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Histogram `name` of /metrics, checked: 23 buckets (le 1e-4 .. 1000, then +Inf), cumulative counts that never
 * decrease, +Inf equal to _count. Returns _count; *sum gets _sum. */
static double histogram(const server *s, const char *name, double *sum)
{
    char *resp, key[160];
    cr_assert_eq(http(s, "GET", "/metrics", NULL, &resp), 200);
    snprintf(key, sizeof key, "# TYPE %s histogram\n", name);
    cr_assert_not_null(strstr(resp, key), "no histogram %s in %s", name, resp);
    snprintf(key, sizeof key, "\n%s_bucket{le=\"", name);
    double prev = 0, le_prev = 0, inf = -1;
    int nb = 0;
    for (const char *p = strstr(resp, key); p; p = strstr(p + 1, key), nb++) {
        const char *le = p + strlen(key), *end = strchr(le, '"'), *close = strchr(le, '}');
        cr_assert_not_null(end);
        cr_assert_not_null(close);
        const double v = atof(close + 2); /* past "} " */
        cr_assert_geq(v, prev, "%s: bucket %d has %g, fewer than the one before (%g)", name, nb, v, prev);
        prev = v;
        if (strncmp(le, "+Inf", 4) == 0) {
            inf = v;
        } else {
            cr_assert_gt(atof(le), le_prev, "%s: bucket bounds must rise", name);
            le_prev = atof(le);
        }
    }
    cr_assert_eq(nb, 23, "%s: %d buckets", name, nb);
    snprintf(key, sizeof key, "\n%s_sum{", name);
    const char *ps = strstr(resp, key);
    cr_assert_not_null(ps, "%s: no _sum", name);
    *sum = atof(strchr(ps, '}') + 2);
    snprintf(key, sizeof key, "\n%s_count{", name);
    const char *pc = strstr(resp, key);
    cr_assert_not_null(pc, "%s: no _count", name);
    const double count = atof(strchr(pc, '}') + 2);
    cr_assert_eq(inf, count, "%s: +Inf bucket %g vs count %g", name, inf, count);
    free(resp);
    return count;
}

#endif
