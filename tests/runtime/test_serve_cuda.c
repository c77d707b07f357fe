/* `kvpage serve --device cuda` in process: the server's own sources (runtime/server/, cli/serve_cmd.c) linked
 * with the cuda executor, so that the same engine loop runs over the device executor. Built twice by
 * kvp_cuda_test: runtime_test_serve_cuda_emu on the CPU emulator of CUDA (label cuda_emu), and
 * runtime_test_serve_cuda natively (skipped without a device). Each server is a fork of this process running
 * kvp_cmd_serve (its start line in a file, SIGTERM to stop it): one greedy completion of stories260K over HTTP
 * from the cuda server must be the cpu server's, token for token, and golden.json's; the cuda server's start
 * line and /metrics carry the memory split's KV blocks. A few tokens only: the emulator is slow. */
#include "common/kvp_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"
#include "http_testutil.h"
#include "runtime/cli/commands.h"
#include "runtime/executor/cuda/cuda_dev.h"

#define S260 "../shared/models/stories260K"
enum { NGEN = 5 }; /* tokens generated: enough to differ, few enough for the emulator */

typedef struct {
    pid_t pid;
    int port, num_blocks;
    char out[64], err[64];
    cJSON *start; /* the --json start line */
} child;

static char *slurp(const char *path)
{
    char *d = NULL;
    size_t n;
    if (kvp_read_file(path, 1 << 20, &d, &n) != KVP_OK) {
        kvp_error_clear();
        return NULL;
    }
    return d;
}

/* Forks a server: kvp_cmd_serve with `extra` (space-separated, no quoting), stdout and stderr into files;
 * waits (up to 300 s) for its start line. */
static child serve_start(const char *extra)
{
    child c = {0};
    snprintf(c.out, sizeof c.out, "/tmp/kvp_serve_cuda_out_XXXXXX");
    snprintf(c.err, sizeof c.err, "/tmp/kvp_serve_cuda_err_XXXXXX");
    int fo = mkstemp(c.out), fe = mkstemp(c.err);
    cr_assert(fo >= 0 && fe >= 0, "mkstemp: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    c.pid = fork();
    cr_assert_geq(c.pid, 0);
    if (c.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fo, 1);
        dup2(fe, 2);
        char buf[512], *argv[40];
        int argc = 0;
        argv[argc++] = "serve";
        char base[] = "--model " S260 "/stories260K.gguf --port 0 --json --max-num-seqs 4 --max-batched-tokens 32 "
                      "--num-blocks 64";
        for (char *t = strtok(base, " "); t; t = strtok(NULL, " ")) argv[argc++] = t;
        snprintf(buf, sizeof buf, "%s", extra);
        for (char *t = strtok(buf, " "); t && argc < 39; t = strtok(NULL, " ")) argv[argc++] = t;
        argv[argc] = NULL;
        _exit(kvp_cmd_serve(argc, argv));
    }
    close(fo);
    close(fe);
    for (int i = 0; i < 3000 && !c.start; i++) {
        char *o = slurp(c.out);
        if (o && strchr(o, '\n')) c.start = cJSON_Parse(o);
        free(o);
        int st;
        if (!c.start && waitpid(c.pid, &st, WNOHANG) == c.pid) {
            char *e = slurp(c.err);
            cr_assert(0, "the server (%s) exited with status %d: %s", extra, st, e ? e : "");
        }
        if (!c.start) usleep(100 * 1000);
    }
    cr_assert_not_null(c.start, "no start line from the server (%s) in 300 s", extra);
    cr_assert_eq(sscanf(cJSON_GetObjectItem(c.start, "url")->valuestring, "http://127.0.0.1:%d", &c.port), 1);
    c.num_blocks = cJSON_GetObjectItem(c.start, "num_blocks")->valueint;
    return c;
}

static void serve_stop(child *c)
{
    cr_assert_eq(kill(c->pid, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(c->pid, &st, 0), c->pid);
    char *e = slurp(c->err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server ended with status %d: %s", st, e ? e : "");
    free(e);
    cJSON_Delete(c->start);
    unlink(c->out);
    unlink(c->err);
}

/* One HTTP/1.1 exchange with c: the status; the body in *resp (malloc'ed). */
static int http(const child *c, const char *method, const char *path, const char *body, char **resp)
{
    const int code = tu_http(c->port, method, path, body, body ? strlen(body) : 0, resp);
    cr_assert_geq(code, 0, "%s %s: no HTTP answer from port %d", method, path, c->port);
    return code;
}

/* The greedy completion of golden.json's "Once upon a time" prompt (as token ids) on server c: its tokens. */
static void complete(const child *c, const cJSON *prompt, int32_t *toks)
{
    char *p = cJSON_PrintUnformatted(prompt), body[1024], *resp;
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true, "
             "\"return_token_ids\": true}", p, NGEN);
    cJSON_free(p);
    const int code = http(c, "POST", "/v1/completions", body, &resp);
    cr_assert_eq(code, 200, "%d: %s", code, resp);
    cJSON *j = cJSON_Parse(resp);
    cr_assert_not_null(j, "%s", resp);
    const cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "token_ids");
    cr_assert(cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == NGEN, "%s", resp);
    for (int i = 0; i < NGEN; i++) toks[i] = cJSON_GetArrayItem(ids, i)->valueint;
    cJSON_Delete(j);
    free(resp);
}

Test(serve_cuda, greedy_completion_equals_the_cpu_executors)
{
    int n;
    if (kvp_cudev_count(&n) != KVP_OK) cr_skip_test("%s", kvp_error_message());
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260 "/golden.json", &gold), KVP_OK, "%s (../shared must be present)",
                 kvp_error_detail());
    const cJSON *gc = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 1); /* "Once upon a time" */
    const cJSON *prompt = cJSON_GetObjectItem(gc, "prompt_tokens");
    const int np = cJSON_GetArraySize(prompt);
    int32_t want[NGEN], cpu[NGEN], cuda[NGEN];
    for (int i = 0; i < NGEN; i++) /* tokens_after_bos holds the prompt's tokens after BOS first */
        want[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(gc, "tokens_after_bos"), np - 1 + i)->valueint;

    child cs = serve_start("--device cpu");
    complete(&cs, prompt, cpu);
    serve_stop(&cs);

    child gs = serve_start("--device cuda --kv-cache-memory 2MiB");
    const cJSON *dev = cJSON_GetObjectItem(gs.start, "device"), *cu = cJSON_GetObjectItem(gs.start, "cuda");
    cr_assert(cJSON_IsString(dev) && !strcmp(dev->valuestring, "cuda"), "start line without device cuda");
    cr_assert(cJSON_IsObject(cu), "start line without the memory split");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cu, "emulated")) ||
              !strcmp(cJSON_GetObjectItem(cu, "gemm")->valuestring, "cublas"), "neither the emulator nor a GPU");
    cr_assert_gt(cJSON_GetObjectItem(cu, "graph_buckets")->valueint, 0, "decode steps padded to buckets");
    cr_assert_eq(cJSON_GetObjectItem(cu, "num_blocks")->valueint, gs.num_blocks);
    cr_assert_eq(gs.num_blocks, 64, "--num-blocks 64 asked (the 2 MiB split holds more)");
    cr_assert_eq(cJSON_GetObjectItem(cu, "kv_bytes")->valuedouble, 2 << 20);
    cr_assert_gt(cJSON_GetObjectItem(cu, "weights_bytes")->valuedouble, 0);
    complete(&gs, prompt, cuda);
    char *m;
    cr_assert_eq(http(&gs, "GET", "/metrics", NULL, &m), 200);
    cr_assert(strstr(m, "num_gpu_blocks=\"64\""), "/metrics' cache_config_info lacks the device's blocks");
    free(m);
    serve_stop(&gs);

    for (int i = 0; i < NGEN; i++) {
        cr_assert_eq(cpu[i], want[i], "cpu token %d: %d, golden %d", i, cpu[i], want[i]);
        cr_assert_eq(cuda[i], cpu[i], "cuda token %d: %d, cpu %d", i, cuda[i], cpu[i]);
    }
    cJSON_Delete(gold);
}
