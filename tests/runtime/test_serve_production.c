/* `kvpage serve` as production meets it (issue "kvpage serve in production"): idle and slow clients cannot
 * lock others out, one request cannot ask for unbounded work, unsupported options are refused by name, every
 * error body is valid UTF-8 JSON whatever the client sent, /metrics has vLLM's names, labels and meanings, the
 * prefix cache's miss classes and block health, KV events are written while serving, and shutdown does not
 * wait for idle connections. */
#include <sys/time.h>

#include "serve_testutil.h"

#include <criterion/parameterized.h>

#define TINY "--served-model-name tiny --num-blocks 256"

/* A connected socket to s (nothing sent). */
static int connect_to(const server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

/* Seconds until the server closes fd (recv gives 0 or an error), at most `limit`; -1 when it stays open. */
static double seconds_until_closed(int fd, double limit)
{
    const double t0 = now_s();
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100 * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[256];
    while (now_s() - t0 < limit) {
        const ssize_t r = recv(fd, b, sizeof b, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return now_s() - t0;
    }
    return -1;
}

/* The error message of an error answer (it must be OpenAI's error object, valid UTF-8 JSON); the caller frees. */
static char *error_of(const char *resp)
{
    cr_assert(kvp_utf8_valid(resp), "the error body is not valid UTF-8: %s", resp);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(resp, strlen(resp), "error body", &j), KVP_OK, "not JSON: %s", resp);
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
    cr_assert(cJSON_IsString(m), "no error.message in %s", resp);
    char *msg = strdup(m->valuestring);
    cJSON_Delete(j);
    return msg;
}

/* POST path with body of blen bytes (any bytes); the status and the answer in *resp. */
static int post_bytes(const server *s, const char *path, const char *body, size_t blen, char **resp)
{
    const int code = tu_http(s->port, "POST", path, body, blen, resp);
    cr_assert_geq(code, 0, "POST %s: no HTTP answer", path);
    return code;
}

/* ---------------------------------------------------------------- connections */

/* More idle connections than --max-connections: the oldest idle ones are closed to make room, and /health
 * answers at once (issue: they used to hold every slot for the 600 s timeout). */
Test(serve_production, idle_connections_past_the_limit_do_not_lock_health_out)
{
    server s = start(TINY " --max-connections 16 --idle-timeout 60 --header-timeout 60");
    enum { NC = 48 };
    int fds[NC];
    for (int i = 0; i < NC; i++) fds[i] = connect_to(&s);
    usleep(100 * 1000);
    for (int round = 0; round < 3; round++) {
        const double t0 = now_s();
        char *resp;
        const int code = http_try(&s, "GET", "/health", NULL, &resp);
        const double took = now_s() - t0;
        cr_assert_eq(code, 200, "round %d: /health -> %d", round, code);
        cr_assert_lt(took, 1.0, "round %d: /health took %.2f s behind %d idle connections", round, took, NC);
        free(resp);
    }
    int closed = 0; /* the first ones opened were closed to make room */
    for (int i = 0; i < NC; i++) closed += seconds_until_closed(fds[i], 0.05) >= 0;
    cr_assert_geq(closed, NC - 16, "%d of %d idle connections closed", closed, NC);
    for (int i = 0; i < NC; i++) close(fds[i]);
    stop(&s);
}

/* Every connection busy (waiting on the engine) at --max-connections: a new one is answered 503 naming the
 * limit, not left waiting; the busy ones are not cut. */
Test(serve_production, a_connection_past_the_limit_of_busy_ones_gets_503)
{
    server s = start("--num-blocks 4096 --max-connections 2");
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2000,\"n\":16,\"ignore_eos\":true,\"seed\":3}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    int busy[2];
    for (int i = 0; i < 2; i++) {
        busy[i] = connect_to(&s);
        cr_assert_eq(send(busy[i], req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    }
    usleep(300 * 1000);
    char *resp;
    const int code = http(&s, "GET", "/health", NULL, &resp);
    cr_assert_eq(code, 503, "%d: %s", code, resp);
    char *m = error_of(resp);
    cr_assert(strstr(m, "--max-connections"), "%s", m);
    free(m);
    free(resp);
    for (int i = 0; i < 2; i++) cr_assert_lt(seconds_until_closed(busy[i], 0.05), 0, "busy connection %d was cut", i);
    for (int i = 0; i < 2; i++) close(busy[i]); /* they cancel their requests */
    for (int i = 0; i < 100; i++) {
        if (http_try(&s, "GET", "/health", NULL, &resp) == 200) break;
        free(resp);
        resp = NULL;
        usleep(50 * 1000);
    }
    cr_assert_not_null(resp, "/health never came back");
    free(resp);
    stop(&s);
}

/* A connection that sends nothing is closed after --idle-timeout; one that sends its head a byte at a time
 * (slow loris) after --header-timeout, although bytes keep coming. */
Test(serve_production, idle_and_slow_connections_time_out)
{
    server s = start(TINY " --idle-timeout 1 --header-timeout 2");
    int idle = connect_to(&s);
    const double t_idle = seconds_until_closed(idle, 10);
    cr_assert(t_idle >= 0, "a silent connection stayed open 10 s with --idle-timeout 1");
    close(idle);
    int slow = connect_to(&s);
    const char *head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const double t0 = now_s();
    int open = 1;
    for (size_t i = 0; head[i] && open && now_s() - t0 < 10; i++) {
        if (send(slow, head + i, 1, MSG_NOSIGNAL) != 1) open = 0;
        if (open && seconds_until_closed(slow, 0.4) >= 0) open = 0;
    }
    cr_assert(!open, "a slow-loris head kept its connection open %.1f s with --header-timeout 2", now_s() - t0);
    close(slow);
    char *resp;
    cr_assert_eq(http(&s, "GET", "/health", NULL, &resp), 200);
    free(resp);
    stop(&s);
}

/* A connection waiting on the engine (here for longer than --idle-timeout) keeps it: the answer comes. */
Test(serve_production, a_request_waiting_on_the_engine_outlives_the_idle_timeout)
{
    server s = start("--num-blocks 4096 --idle-timeout 1 --header-timeout 1");
    /* a probe of 4 x 100 tokens measures this build's speed (a sanitizer build is ~50x slower), then the
       request asks for about 3 s of tokens: well past the 1 s idle timeout, never minutes */
    char *resp, body[256];
    double t0 = now_s();
    cr_assert_eq(http(&s, "POST", "/v1/completions",
                      "{\"prompt\":\"Once\",\"max_tokens\":100,\"n\":4,\"temperature\":1,\"ignore_eos\":true,\"seed\":1}",
                      &resp), 200, "%s", resp);
    free(resp);
    const double rate = 400.0 / (now_s() - t0 + 1e-3); /* tokens per second */
    int per_seq = (int)(rate * 3.0 / 16);
    per_seq = per_seq < 20 ? 20 : per_seq > 2000 ? 2000 : per_seq;
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once\",\"max_tokens\":%d,\"n\":16,\"temperature\":1,\"ignore_eos\":true,\"seed\":1}", per_seq);
    t0 = now_s();
    const int code = http(&s, "POST", "/v1/completions", body, &resp);
    cr_assert_eq(code, 200, "%s", resp);
    free(resp);
    const double took = now_s() - t0;
    if (took < 1.5) cr_log_warn("the request took %.2f s: too short to outlast --idle-timeout 1 on this machine", took);
    stop(&s);
}

/* SIGTERM with idle connections open: they are closed at once (the server used to wait 5 s for them). */
Test(serve_production, shutdown_closes_idle_connections_at_once)
{
    server s = start(TINY " --idle-timeout 60 --header-timeout 60");
    int idle[4];
    for (int i = 0; i < 4; i++) idle[i] = connect_to(&s);
    char *resp; /* and one that has had an answer and is kept alive */
    int ka = connect_to(&s);
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(send(ka, get, strlen(get), MSG_NOSIGNAL), (ssize_t)strlen(get));
    char b[512];
    cr_assert_gt(recv(ka, b, sizeof b, 0), 0);
    usleep(100 * 1000);
    const double t0 = now_s();
    cr_assert_eq(kill(s.serving, SIGTERM), 0);
    for (int i = 0; i < 4; i++) {
        const double t = seconds_until_closed(idle[i], 10);
        cr_assert(t >= 0 && now_s() - t0 < 3.0, "idle connection %d closed after %.2f s", i, now_s() - t0);
        close(idle[i]);
    }
    cr_assert(seconds_until_closed(ka, 10) >= 0 && now_s() - t0 < 3.0, "the kept-alive connection took %.2f s",
              now_s() - t0);
    close(ka);
    int st;
    cr_assert_eq(waitpid(s.pid, &st, 0), s.pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    (void)resp;
    unlink(s.errpath);
    unlink(s.outpath);
}

/* --json: the start object is one line (a script reads it with one readline). */
Test(serve_production, the_json_start_line_is_one_line)
{
    server s = start(TINY);
    size_t len;
    char *out = (char *)tu_read_all(s.outpath, &len);
    out[len] = '\0';
    cr_assert_gt(len, 2);
    cr_assert_eq(strchr(out, '\n'), out + len - 1, "more than one line: %s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "%s", out);
    const cJSON *dev = cJSON_GetObjectItem(j, "device");
    cr_assert(cJSON_IsString(dev) && !strcmp(dev->valuestring, "cpu"), "%s", out);
    cr_assert_null(cJSON_GetObjectItem(j, "cuda"), "a cpu server has no memory split: %s", out);
    cJSON_Delete(j);
    free(out);
    stop(&s);
}

/* ---------------------------------------------------------------- --device cuda */

/* `serve --device cuda`: where kvpage has no device (a build without nvcc links the no-device layer, or no
 * driver) it fails before listening, at once, with the executor's message, exit 2 and no start line; where it
 * has one it serves, and the start line and /metrics give the memory split's KV blocks. Never a crash or a
 * hang (the loop gives it 120 s). */
Test(serve_production, device_cuda_fails_at_start_up_without_a_device)
{
    tu_require_shared();
    server s = {0};
    temp_path(s.errpath, sizeof s.errpath, "err");
    temp_path(s.outpath, sizeof s.outpath, "out");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s serve --model %s --port 0 --json --device cuda --kv-cache-memory 4MiB >%s 2>%s",
             kvp_test_bin(), S260_GGUF, s.outpath, s.errpath);
    const double t0 = now_s();
    s.pid = fork();
    cr_assert_geq(s.pid, 0);
    if (s.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0, exited = 0;
    size_t len;
    char *out = NULL;
    for (int i = 0; i < 1200 && !exited; i++) {
        if (waitpid(s.pid, &st, WNOHANG) == s.pid) {
            exited = 1;
            break;
        }
        free(out);
        out = (char *)tu_read_all(s.outpath, &len);
        out[len] = '\0';
        if (strchr(out, '\n')) break; /* it serves: a device is there */
        usleep(100 * 1000);
    }
    char *err = (char *)tu_read_all(s.errpath, &len);
    err[len] = '\0';
    if (exited) {
        cr_assert(WIFEXITED(st), "kvpage serve --device cuda did not exit normally (status %d): %s", st, err);
        cr_assert_eq(WEXITSTATUS(st), 2, "exit %d: %s", WEXITSTATUS(st), err);
        cr_assert(strstr(err, "kvpage serve: error: cuda executor: no CUDA device"), "%s", err);
        cr_assert(len > 0 && strchr(err, '\n') == err + len - 1, "not one line: %s", err);
        cr_assert_lt(now_s() - t0, 60, "it took %.1f s to fail", now_s() - t0);
        free(out);
        out = (char *)tu_read_all(s.outpath, &len);
        cr_assert_eq(len, 0, "a start line was printed: %.*s", (int)len, out);
        unlink(s.errpath);
        unlink(s.outpath);
    } else {
        cr_assert(out && strchr(out, '\n'), "neither an exit nor a start line in 120 s: %s", err);
        cJSON *j = cJSON_Parse(out);
        cr_assert_not_null(j, "%s", out);
        cr_assert_str_eq(cJSON_GetObjectItem(j, "device")->valuestring, "cuda", "%s", out);
        const cJSON *cu = cJSON_GetObjectItem(j, "cuda");
        cr_assert(cJSON_IsObject(cu), "%s", out);
        const int nb = cJSON_GetObjectItem(j, "num_blocks")->valueint;
        cr_assert_eq(cJSON_GetObjectItem(cu, "num_blocks")->valueint, nb, "%s", out);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cu, "kv_cache_memory_given")), "%s", out);
        cr_assert(sscanf(cJSON_GetObjectItem(j, "url")->valuestring, "http://127.0.0.1:%d", &s.port) == 1, "%s", out);
        s.serving = (pid_t)cJSON_GetObjectItem(j, "pid")->valuedouble;
        cJSON_Delete(j);
        char *resp, want[64];
        cr_assert_eq(http(&s, "GET", "/metrics", NULL, &resp), 200);
        snprintf(want, sizeof want, "num_gpu_blocks=\"%d\"", nb);
        cr_assert(strstr(resp, want), "/metrics has no %s", want);
        free(resp);
        stop(&s);
    }
    free(out);
    free(err);
}

/* The device options are serve's as generate's: refused by name where they do not apply. */
Test(serve_production, device_options_are_checked_before_loading)
{
    char out[1 << 15], err[4096], cmd[1024];
    const struct {
        const char *args, *says;
    } cases[] = {
        {"--enforce-eager", "--enforce-eager applies to --device cuda only"},
        {"--gpu-memory-utilization 0.5", "--gpu-memory-utilization applies to --device cuda only"},
        {"--device tpu", "unknown device 'tpu'"},
        {"--device cuda --gpu-memory-utilization 1.5", "--gpu-memory-utilization"},
        {"--device cuda --kv-mem 64MiB", "--kv-mem sizes the cpu executor's cache"},
        {"--device cuda:1 --tp 2", "each rank takes the GPU of its index on its node"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "serve --model /nonexistent.gguf --port 0 %s", cases[i].args);
        cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2, "%s: %s", cases[i].args, err);
        cr_assert(strstr(err, cases[i].says), "%s: %s", cases[i].args, err);
    }
    cr_assert_eq(kvp_test_cli("serve --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--device D") && strstr(out, "--kv-cache-memory") && strstr(out, "--enforce-eager"), "%s", out);
}

/* ---------------------------------------------------------------- limits of one request */

/* The message of a request that must be refused with 400; it must name needle. */
static void expect_400(const server *s, const char *path, const char *body, const char *needle)
{
    char *resp;
    const int code = http(s, "POST", path, body, &resp);
    cr_assert_eq(code, 400, "%s -> %d: %s", body, code, resp);
    char *m = error_of(resp);
    cr_assert(strstr(m, needle), "%s: '%s' does not name '%s'", body, m, needle);
    free(m);
    free(resp);
}

Test(serve_production, sequences_times_tokens_have_a_ceiling)
{
    server s = start(TINY " --max-request-tokens 1000");
    expect_400(&s, "/v1/completions", "{\"prompt\":[\"a\",\"b\"],\"n\":4,\"max_tokens\":200}", "--max-request-tokens 1000");
    expect_400(&s, "/v1/completions", "{\"prompt\":\"a\",\"n\":2,\"max_tokens\":501}", "2 sequences");
    cJSON_Delete(complete(&s, "{\"prompt\":[\"a\",\"b\"],\"n\":4,\"max_tokens\":125,\"seed\":3}", 200)); /* 1000: at it */
    stop(&s);
}

/* The answer's estimated size has a ceiling; an answer let through is no larger than its estimate. */
Test(serve_production, the_size_of_an_answer_has_a_ceiling)
{
    server s = start(TINY " --max-response-bytes 200000");
    expect_400(&s, "/v1/completions", "{\"prompt\":\"a\",\"n\":8,\"max_tokens\":100,\"logprobs\":20}",
               "--max-response-bytes 200000");
    expect_400(&s, "/v1/completions", "{\"prompt\":\"a\",\"n\":64,\"max_tokens\":200}", "above the ceiling of one answer");
    /* 4 x 40 tokens with 5 logprobs: estimated 4 x 512 + 160 x (16 + 6 x 56) = 58,368 bytes */
    char *resp;
    cr_assert_eq(http(&s, "POST", "/v1/completions",
                      "{\"prompt\":\"a\",\"n\":4,\"max_tokens\":40,\"logprobs\":5,\"temperature\":2,\"ignore_eos\":true,"
                      "\"seed\":7}", &resp), 200, "%s", resp);
    cr_assert_lt(strlen(resp), 58368, "an answer of %zu bytes passed an estimate of 58,368", strlen(resp));
    free(resp);
    stop(&s);
}

/* n above --max-num-seqs is 400 naming it; many prompts x n never run more than --max-num-seqs sequences. */
typedef struct {
    const server *s;
    int code;
} bg_call;

static void *many_sequences(void *arg)
{
    bg_call *c = arg;
    char *resp = NULL;
    c->code = http_try(c->s, "POST", "/v1/completions",
                       "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"],\"n\":2,\"max_tokens\":300,"
                       "\"ignore_eos\":true,\"seed\":5}", &resp);
    free(resp);
    return NULL;
}

Test(serve_production, max_num_seqs_bounds_running_sequences)
{
    server s = start(TINY " --max-num-seqs 4");
    expect_400(&s, "/v1/completions", "{\"prompt\":\"a\",\"n\":5}", "--max-num-seqs (4)");
    bg_call c = {&s, 0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, many_sequences, &c), 0);
    double most = 0;
    for (int i = 0; i < 4000; i++) {
        char *page;
        if (http_try(&s, "GET", "/metrics", NULL, &page) != 200) break;
        const double running = metric_in(page, "kvpage:num_sequences_running");
        const double finished = metric_in(page, "kvpage:engine_requests_finished_total");
        free(page);
        cr_assert_leq(running, 4, "%g sequences running with --max-num-seqs 4", running);
        most = running > most ? running : most;
        if (finished >= 8) break;
    }
    pthread_join(t, NULL);
    cr_assert_eq(c.code, 200);
    cr_assert_gt(most, 0, "never saw a sequence running");
    stop(&s);
}

/* max_tokens past the context is 400 with vLLM's message (it used to be cut with a 200). */
Test(serve_production, max_tokens_past_the_context_is_refused)
{
    server s = start(TINY);
    expect_400(&s, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":2044}",
               "maximum context length is 2048 tokens. However, you requested 2049 tokens (5 in the prompt, 2044 in the "
               "completion)");
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", 200));
    stop(&s);
}

/* ---------------------------------------------------------------- refused options */

typedef struct {
    char body[160];
    char needle[40];
} refusal;

ParameterizedTestParameters(serve_production, unsupported_options_are_refused_by_name)
{
    static refusal r[] = {
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", "\"tools\""},
        {"\"tool_choice\":\"required\"", "\"tool_choice\""},
        {"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", "\"tool_choice\""},
        {"\"response_format\":{\"type\":\"json_object\"}", "\"response_format\""},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}", "\"response_format\""},
        {"\"functions\":[{\"name\":\"f\"}]", "\"functions\""},
        {"\"function_call\":\"auto\"", "\"function_call\""},
        {"\"guided_json\":{\"type\":\"object\"}", "\"guided_json\""},
        {"\"guided_regex\":\"a+\"", "\"guided_regex\""},
        {"\"guided_choice\":[\"a\",\"b\"]", "\"guided_choice\""},
        {"\"structured_outputs\":{\"json\":{}}", "\"structured_outputs\""},
        {"\"prompt_logprobs\":1", "\"prompt_logprobs\""},
        {"\"use_beam_search\":true", "\"use_beam_search\""},
        {"\"bad_words\":[\"x\"]", "\"bad_words\""},
        {"\"allowed_token_ids\":[1,2]", "\"allowed_token_ids\""},
        {"\"suffix\":\"x\"", "\"suffix\""},
        {"\"modalities\":[\"text\",\"audio\"]", "\"modalities\""},
        {"\"prediction\":{\"type\":\"content\",\"content\":\"x\"}", "\"prediction\""},
    };
    return cr_make_param_array(refusal, r, sizeof r / sizeof r[0]);
}

ParameterizedTest(refusal *r, serve_production, unsupported_options_are_refused_by_name)
{
    server s = start(TINY);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":2,%s}", r->body);
    expect_400(&s, "/v1/completions", body, r->needle);
    stop(&s);
}

/* What asks for nothing more is accepted: no tools, plain text, text only. */
Test(serve_production, options_that_ask_for_nothing_are_accepted)
{
    server s = start(TINY);
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":2,\"tool_choice\":\"none\",\"tools\":[],"
                              "\"response_format\":{\"type\":\"text\"},\"modalities\":[\"text\"],\"suffix\":\"\"}", 200));
    stop(&s);
}

/* ---------------------------------------------------------------- bytes */

/* Invalid UTF-8 anywhere (body, path, a name that gets quoted): every answer is an error object that is valid
 * UTF-8 JSON; raw control bytes in a string are 400 as a strict JSON reader (vLLM's) says; an escaped NUL
 * stays in a prompt (it used to cut it). */
Test(serve_production, error_bodies_are_valid_json_whatever_the_client_sent)
{
    server s = start(TINY);
    static const struct {
        const char *path, *body;
        const char *needle;
    } cases[] = {
        {"/v1/completions", "{\"prompt\":\"x\",\"model\":\"\xff\xfe gpt\"}", "not valid UTF-8"},
        {"/v1/completions", "{\"prompt\":\"\xc3\x28\"}", "not valid UTF-8"},
        {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"\xe2\x82\":1}}", "not valid UTF-8"},
        {"/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"\xed\xa0\x80\"]}", "not valid UTF-8"}, /* a surrogate */
        {"/v1/completions", "{\"prompt\":\"x\",\"model\":\"\xc0\x80\"}", "not valid UTF-8"},     /* overlong NUL */
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"\xf8\x88\x80\x80\x80\",\"content\":\"x\"}]}", "not valid UTF-8"},
        {"/tokenize", "{\"prompt\":\"a\xff\"}", "not valid UTF-8"},
        {"/v1/completions", "{\"prompt\":\"a\x01z\"}", "control character 0x01"},
        {"/v1/completions", "{\"prompt\":\"a\nz\"}", "control character 0x0a"},
        {"/v1/completions", "{\"prompt\":\"x\",\"model\":\"\\ud800\"}", ""}, /* a lone surrogate: 400 or 404 */
        {"/v1/completions", "{\"prompt\":\"x\",\"model\":\"\\u00e9\\u0000\"}", "does not exist"},
        {"/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"a\\u0000\"]}", "NUL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *resp;
        const int code = post_bytes(&s, cases[i].path, cases[i].body, strlen(cases[i].body), &resp);
        cr_assert(code == 400 || code == 404, "case %zu -> %d: %s", i, code, resp);
        char *m = error_of(resp);
        cr_assert(strstr(m, cases[i].needle), "case %zu: '%s' lacks '%s'", i, m, cases[i].needle);
        free(m);
        free(resp);
    }
    /* a raw NUL byte in the body, and invalid UTF-8 in the path the 404 quotes */
    char *resp;
    cr_assert_eq(post_bytes(&s, "/v1/completions", "{\"prompt\":\"a\0b\"}", 16, &resp), 400);
    free(error_of(resp));
    free(resp);
    int fd = connect_to(&s);
    const char *get = "GET /v1/\xff\xfe\xc0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    cr_assert_eq(send(fd, get, strlen(get), MSG_NOSIGNAL), (ssize_t)strlen(get));
    char all[4096];
    size_t len = 0;
    for (ssize_t k; (k = recv(fd, all + len, sizeof all - 1 - len, 0)) > 0;) len += (size_t)k;
    all[len] = '\0';
    close(fd);
    int code = 0;
    cr_assert_eq(sscanf(all, "HTTP/1.1 %d", &code), 1, "%s", all);
    if (code == 404) free(error_of(strstr(all, "\r\n\r\n") + 4)); /* (libmicrohttpd may refuse the line itself: 400) */
    else cr_assert_eq(code, 400, "%s", all);
    /* an escaped NUL is part of the prompt: one more token than without it, and it still completes */
    cJSON *with = post_json(&s, "/tokenize", "{\"prompt\":\"Once\\u0000\"}", 200);
    cJSON *without = post_json(&s, "/tokenize", "{\"prompt\":\"Once\"}", 200);
    cr_assert_gt(cJSON_GetObjectItem(with, "count")->valueint, cJSON_GetObjectItem(without, "count")->valueint);
    cJSON_Delete(with);
    cJSON_Delete(without);
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once\\u0000upon\",\"max_tokens\":3}", 200));
    stop(&s);
}

/* ---------------------------------------------------------------- metrics */

/* One /metrics page, parsed: every sample's name has a TYPE, carries model_name="tiny", starts with prefix. */
typedef struct {
    char name[128], type[16];
} mtype;

typedef struct {
    mtype t[256];
    int n;
} mpage;

static const char *type_of(const mpage *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->t[i].name, name)) return p->t[i].type;
    return NULL;
}

static void parse_page(const char *page, const char *prefix, mpage *p)
{
    p->n = 0;
    char line[2048];
    for (const char *l = page; *l;) {
        const char *e = strchr(l, '\n');
        cr_assert_not_null(e, "the page does not end with a newline");
        const size_t n = (size_t)(e - l);
        cr_assert_lt(n, sizeof line);
        memcpy(line, l, n);
        line[n] = '\0';
        l = e + 1;
        if (!strncmp(line, "# HELP ", 7)) continue;
        if (!strncmp(line, "# TYPE ", 7)) {
            cr_assert_lt(p->n, 256);
            cr_assert_eq(sscanf(line + 7, "%127s %15s", p->t[p->n].name, p->t[p->n].type), 2, "%s", line);
            cr_assert_null(type_of(p, p->t[p->n].name), "%s has two TYPE lines", p->t[p->n].name);
            p->n++;
            continue;
        }
        cr_assert_neq(line[0], '#', "an unknown comment: %s", line);
        cr_assert_eq(strncmp(line, prefix, strlen(prefix)), 0, "%s lacks the prefix %s", line, prefix);
        char name[128];
        const size_t nl = strcspn(line, "{ ");
        cr_assert_lt(nl, sizeof name);
        memcpy(name, line, nl);
        name[nl] = '\0';
        cr_assert_eq(line[nl], '{', "%s has no labels", line);
        cr_assert(strstr(line, "model_name=\"tiny\"}") || strstr(line, ",model_name=\"tiny\""), "%s: no model_name", line);
        const char *v = strstr(line, "} ");
        cr_assert_not_null(v, "%s", line);
        char *end;
        strtod(v + 2, &end);
        cr_assert(end != v + 2 && *end == '\0', "%s: no value", line);
        const char *ty = type_of(p, name);
        if (!ty) { /* a histogram's series */
            static const char *const sfx[] = {"_bucket", "_sum", "_count"};
            for (int k = 0; k < 3 && !ty; k++) {
                const size_t sl = strlen(sfx[k]);
                if (nl > sl && !strcmp(name + nl - sl, sfx[k])) {
                    name[nl - sl] = '\0';
                    ty = type_of(p, name);
                    cr_assert(ty && !strcmp(ty, "histogram"), "%s: %s is no histogram", line, name);
                }
            }
        }
        cr_assert_not_null(ty, "%s: no TYPE for %s", line, name);
    }
}

/* Histogram `name` of page: buckets rise and never decrease, +Inf equals _count; returns _count, *sum. */
static double histo_of(const char *page, const char *name, double *sum)
{
    char key[200];
    snprintf(key, sizeof key, "%s_bucket{le=\"", name);
    double prev = 0, inf = -1, le_prev = -INFINITY;
    int nb = 0;
    for (const char *p = strstr(page, key); p; p = strstr(p + 1, key)) {
        if (p[-1] != '\n') continue;
        const char *le = p + strlen(key), *close = strchr(le, '}');
        const double v = atof(close + 2);
        cr_assert_geq(v, prev, "%s: a bucket below the one before", name);
        prev = v;
        if (!strncmp(le, "+Inf", 4)) inf = v;
        else {
            cr_assert_gt(atof(le), le_prev, "%s: bounds must rise", name);
            le_prev = atof(le);
        }
        nb++;
    }
    cr_assert_gt(nb, 1, "%s: no buckets", name);
    snprintf(key, sizeof key, "%s_count", name);
    const double count = metric_in(page, key);
    snprintf(key, sizeof key, "%s_sum", name);
    *sum = metric_in(page, key);
    cr_assert_eq(inf, count, "%s: +Inf %g, count %g", name, inf, count);
    return count;
}

static char *metrics_page(const server *s)
{
    char *page;
    cr_assert_eq(http(s, "GET", "/metrics", NULL, &page), 200);
    return page;
}

/* Every name and label of vLLM's that the issue lists, with vLLM's meanings, on requests whose counts are known. */
Test(serve_production, metrics_have_vllms_names_labels_and_meanings)
{
    server s = start(TINY " --num-blocks 64");
    char *page = metrics_page(&s);
    mpage pg;
    parse_page(page, "kvpage:", &pg);
    free(page);
    /* two requests of 33 prompt tokens: 4 samples of 8 tokens (length), then one of 2 tokens that the prefix cache
     * serves */
    const char *body = "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"
                       "\"n\":4,\"max_tokens\":8,\"ignore_eos\":true,\"seed\":1}";
    cJSON_Delete(complete(&s, body, 200));
    cJSON_Delete(complete(&s, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,"
                              "30,31,32,33],\"max_tokens\":2,\"ignore_eos\":true}", 200));
    page = metrics_page(&s);
    parse_page(page, "kvpage:", &pg);
    static const char *const counters[] = {"prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
                                           "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total"};
    char name[200];
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        snprintf(name, sizeof name, "kvpage:%s", counters[i]);
        cr_assert_str_eq(type_of(&pg, name) ? type_of(&pg, name) : "-", "counter", "%s", name);
    }
    static const char *const histos[] = {"request_queue_time_seconds", "request_prefill_time_seconds",
                                         "request_decode_time_seconds", "request_inference_time_seconds",
                                         "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
                                         "time_to_first_token_seconds", "e2e_request_latency_seconds",
                                         "inter_token_latency_seconds", "request_params_n", "kv_block_lifetime_seconds"};
    for (size_t i = 0; i < sizeof histos / sizeof histos[0]; i++) {
        snprintf(name, sizeof name, "kvpage:%s", histos[i]);
        cr_assert_str_eq(type_of(&pg, name) ? type_of(&pg, name) : "-", "histogram", "%s", name);
    }
    cr_assert_str_eq(type_of(&pg, "kvpage:cache_config_info"), "gauge");
    cr_assert(strstr(page, "kvpage:cache_config_info{block_size=\"16\",cache_dtype=\"f32\",enable_prefix_caching=\"True\","
                           "num_gpu_blocks=\"64\""), "%s", page);
    /* meanings */
    cr_assert_eq(metric_in(page, "kvpage:request_success_total{finished_reason=\"length\""), 5);
    cr_assert_eq(metric_in(page, "kvpage:request_success_total{finished_reason=\"stop\""), 0);
    cr_assert_eq(metric_in(page, "kvpage:prompt_tokens_total"), 2 * 33);
    cr_assert_eq(metric_in(page, "kvpage:generation_tokens_total"), 4 * 8 + 2);
    double sum;
    cr_assert_eq(histo_of(page, "kvpage:request_prompt_tokens", &sum), 2);
    cr_assert_eq(sum, 2 * 33);
    cr_assert_eq(histo_of(page, "kvpage:request_generation_tokens", &sum), 2);
    cr_assert_eq(sum, 34);
    cr_assert_eq(histo_of(page, "kvpage:request_max_num_generation_tokens", &sum), 2);
    cr_assert_eq(sum, 8 + 2);
    cr_assert_eq(histo_of(page, "kvpage:request_params_n", &sum), 2);
    cr_assert_eq(sum, 5);
    cr_assert_eq(histo_of(page, "kvpage:request_prefill_kv_computed_tokens", &sum), 2);
    cr_assert_eq(sum, 33 + (33 - metric_in(page, "kvpage:prefix_cache_hits_total")));
    cr_assert_eq(metric_in(page, "kvpage:prefix_cache_hits_total"), 32, "the second prompt's two full blocks");
    cr_assert_eq(histo_of(page, "kvpage:iteration_tokens_total", &sum), metric_in(page, "kvpage:engine_steps_total"));
    cr_assert_eq(sum, metric_in(page, "kvpage:computed_tokens_total"));
    double queue, prefill, decode, inference, e2e, ttft, ttft_engine;
    cr_assert_eq(histo_of(page, "kvpage:request_queue_time_seconds", &queue), 2);
    cr_assert_eq(histo_of(page, "kvpage:request_prefill_time_seconds", &prefill), 2);
    cr_assert_eq(histo_of(page, "kvpage:request_decode_time_seconds", &decode), 2);
    cr_assert_eq(histo_of(page, "kvpage:request_inference_time_seconds", &inference), 2);
    cr_assert_eq(histo_of(page, "kvpage:e2e_request_latency_seconds", &e2e), 2);
    cr_assert_eq(histo_of(page, "kvpage:time_to_first_token_seconds", &ttft), 2);
    cr_assert_eq(histo_of(page, "kvpage:engine_time_to_first_token_seconds", &ttft_engine), 2);
    cr_assert_float_eq(prefill + decode, inference, 1e-6);
    cr_assert_geq(ttft, ttft_engine, "TTFT from the HTTP arrival is at least the engine's");
    cr_assert_geq(e2e, inference, "end to end includes the inference");
    cr_assert_eq(histo_of(page, "kvpage:inter_token_latency_seconds", &sum), 7 + 1, "the intervals of the longest samples");
    /* KV usage counts blocks requests hold: none now, although the prefix cache keeps some */
    cr_assert_eq(metric_in(page, "kvpage:kv_cache_usage_perc"), 0);
    cr_assert_gt(metric_in(page, "kvpage:kv_blocks_cached"), 0);
    cr_assert_eq(metric_in(page, "kvpage:num_requests_running"), 0);
    free(page);
    stop(&s);
}

/* While one request of n = 4 runs, running counts one request and four sequences. */
Test(serve_production, running_counts_requests_not_sequences)
{
    server s = start(TINY " --num-blocks 1024");
    int fd = connect_to(&s);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":1500,\"n\":4,\"ignore_eos\":true,\"seed\":2}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    int seen = 0;
    for (int i = 0; i < 2000 && !seen; i++) {
        char *page = metrics_page(&s);
        const double reqs = metric_in(page, "kvpage:num_requests_running");
        const double seqs = metric_in(page, "kvpage:num_sequences_running");
        if (seqs == 4) {
            cr_assert_eq(reqs, 1, "%g requests running for 4 sequences", reqs);
            seen = 1;
        }
        free(page);
        if (metric(&s, "kvpage:engine_requests_finished_total") >= 1) break;
    }
    close(fd);
    if (!seen) cr_log_warn("the request ended before its four samples were seen running");
    stop(&s);
}

/* --metrics-names vllm: every metric vLLM documents (tests/data/serve/vllm_metrics.txt) is there, with its
 * type; every name has the vllm: prefix. */
Test(serve_production, vllms_documented_metrics_are_all_there)
{
    size_t len;
    char *fix = (char *)tu_read_all("tests/data/serve/vllm_metrics.txt", &len);
    fix[len] = '\0';
    server s = start(TINY " --metrics-names vllm");
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":4}", 200));
    char *page = metrics_page(&s);
    mpage pg;
    parse_page(page, "vllm:", &pg);
    int n = 0;
    for (char *l = strtok(fix, "\n"); l; l = strtok(NULL, "\n")) {
        if (l[0] == '#' || !l[0]) continue;
        char name[128], type[16];
        cr_assert_eq(sscanf(l, "%127s %15s", name, type), 2, "%s", l);
        const char *have = type_of(&pg, name);
        cr_assert_not_null(have, "vLLM's %s is not in /metrics", name);
        cr_assert_str_eq(have, type, "%s", name);
        n++;
    }
    cr_assert_geq(n, 30, "the fixture lists %d metrics", n);
    free(page);
    free(fix);
    stop(&s);
}

/* The prefix cache's miss classes (prefix_cache/ledger.h) as counters, adding up with the hits to the prompt
 * tokens of first admissions; evictions show in the block-health histograms. */
Test(serve_production, miss_classes_add_up_and_blocks_have_lifetimes)
{
    server s = start(TINY " --num-blocks 24");
    char body[1024];
    for (int k = 0; k < 6; k++) { /* distinct 100-token prompts through a 24-block cache: evictions */
        strcpy(body, "{\"prompt\":[1");
        for (int i = 1; i < 100; i++) snprintf(body + strlen(body), sizeof body - strlen(body), ",%d", 3 + (k * 37 + i) % 500);
        strcat(body, "],\"max_tokens\":4,\"ignore_eos\":true}");
        cJSON_Delete(complete(&s, body, 200));
        if (k == 0) cJSON_Delete(complete(&s, body, 200)); /* a hit */
    }
    char *page = metrics_page(&s);
    static const char *const classes[] = {"cold", "evicted", "last_token", "partial", "host"};
    double missed = 0;
    char key[160];
    for (size_t c = 0; c < sizeof classes / sizeof classes[0]; c++) {
        snprintf(key, sizeof key, "kvpage:prefix_cache_miss_tokens_total{class=\"%s\"", classes[c]);
        const double v = metric_in(page, key);
        cr_assert(!isnan(v), "no %s", key);
        missed += v;
    }
    const double hits = metric_in(page, "kvpage:prefix_cache_hits_total");
    cr_assert_gt(hits, 0);
    cr_assert_eq(missed + hits + metric_in(page, "kvpage:host_cache_hits_total"),
                 metric_in(page, "kvpage:prefix_cache_queries_total"), "classes + hits = prompt tokens");
    cr_assert_gt(metric_in(page, "kvpage:prefix_cache_miss_tokens_total{class=\"cold\""), 0);
    double sum;
    cr_assert_gt(histo_of(page, "kvpage:kv_block_lifetime_seconds", &sum), 0, "no block was evicted");
    cr_assert_gt(histo_of(page, "kvpage:kv_block_idle_before_evict_seconds", &sum), 0);
    cr_assert_gt(histo_of(page, "kvpage:kv_block_reuse_gap_seconds", &sum), 0, "the hit has a reuse gap");
    free(page);
    stop(&s);
}

/* --kv-events FILE while serving: vLLM's KV event batches, numbered without gaps; replayed into a set of block
 * hashes they hold as many blocks as the cache before a reset, and none after it. */
Test(serve_production, kv_events_are_written_while_serving)
{
    char path[64];
    temp_path(path, sizeof path, "kvev");
    char extra[200];
    snprintf(extra, sizeof extra, TINY " --kv-events %s", path);
    server s = start(extra);
    cJSON_Delete(complete(&s, "{\"prompt\":[1,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,"
                              "32,33,34,35,36,37,38,39,40,41,42,43],\"max_tokens\":3,\"ignore_eos\":true}", 200));
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once upon a time there was a\",\"max_tokens\":20,\"ignore_eos\":true}", 200));
    const double cached = metric(&s, "kvpage:kv_blocks_cached");
    cr_assert_gt(cached, 0);
    cJSON *r = post_json(&s, "/reset_prefix_cache", "", 200);
    cr_assert_eq(cJSON_GetObjectItem(r, "evicted_blocks")->valuedouble, cached);
    cJSON_Delete(r);
    cJSON_Delete(complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":2}", 200)); /* a step after the reset */
    stop(&s);
    size_t len;
    char *text = (char *)tu_read_all(path, &len);
    text[len] = '\0';
    enum { MAXH = 4096 };
    static double held[MAXH];
    int nh = 0, stored = 0, cleared = 0;
    double at_clear = -1;
    long seq = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *b = cJSON_Parse(l);
        cr_assert_not_null(b, "not JSON: %s", l);
        cr_assert_eq((long)cJSON_GetObjectItem(b, "seq")->valuedouble, seq, "batch numbers: %s", l);
        seq++;
        const cJSON *ev;
        cJSON_ArrayForEach(ev, cJSON_GetObjectItem(b, "events")) {
            const char *type = cJSON_GetObjectItem(ev, "type")->valuestring;
            const cJSON *hs = cJSON_GetObjectItem(ev, "block_hashes"), *h;
            if (!strcmp(type, "BlockStored")) {
                stored++;
                cr_assert_eq(cJSON_GetObjectItem(ev, "block_size")->valueint, 16);
                cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(ev, "token_ids")), 16 * cJSON_GetArraySize(hs));
                cJSON_ArrayForEach(h, hs) {
                    cr_assert_lt(nh, MAXH);
                    held[nh++] = h->valuedouble;
                }
            } else if (!strcmp(type, "BlockRemoved")) {
                cJSON_ArrayForEach(h, hs) {
                    int k = 0;
                    while (k < nh && held[k] != h->valuedouble) k++;
                    cr_assert_lt(k, nh, "a removed block was not stored");
                    held[k] = held[--nh];
                }
            } else {
                cr_assert_str_eq(type, "AllBlocksCleared");
                cleared++;
                at_clear = nh;
                nh = 0;
            }
        }
        cJSON_Delete(b);
    }
    cr_assert_gt(stored, 0);
    cr_assert_geq(cleared, 1, "no AllBlocksCleared for the reset");
    cr_assert_eq(at_clear, cached, "the events held %g blocks at the reset, the cache %g", at_clear, cached);
    free(text);
    unlink(path);
}

/* ---------------------------------------------------------------- out of memory */

/* VmPeak of process pid in kB. */
static long vm_peak_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

/* An answer the server has no memory for (its address space capped 100 MB above what it needs to serve small
 * requests) is 503 saying so, and the next request is answered. */
Test(serve_production, out_of_memory_is_503_and_the_server_goes_on)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("an address-space limit and AddressSanitizer's shadow memory do not mix");
#endif
    const char *opts = "--num-blocks 4096 --max-response-bytes 100GB --max-request-tokens 100000000";
    const char *small = "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0}";
    server s = start(opts);
    cJSON_Delete(complete(&s, small, 200));
    const long peak = vm_peak_kb(s.serving);
    stop(&s);
    char prefix[160];
    snprintf(prefix, sizeof prefix, "sh -c 'ulimit -v %ld && exec \"$0\" \"$@\"'", peak + 100 * 1024);
    s = start_with(prefix, opts);
    char *resp;
    const int code = http(&s, "POST", "/v1/completions",
                          "{\"prompt\":\"Once\",\"max_tokens\":200,\"n\":256,\"logprobs\":20,\"ignore_eos\":true}", &resp);
    cr_assert_eq(code, 503, "an answer of ~27 MB under a limit of %ld kB: %d", peak + 100 * 1024, code);
    char *m = error_of(resp);
    cr_assert(strstr(m, "out of memory"), "%s", m);
    free(m);
    free(resp);
    cJSON_Delete(complete(&s, small, 200));
    stop(&s);
}
