/* `kvpage serve` for real: the server runs as a child process on a free port, the tests talk HTTP to it
 * over loopback (a plain socket client), then stop it with SIGTERM and require exit status 0 (under the
 * sanitizer build that includes LeakSanitizer's check). Answers are checked against golden.json and against
 * the same requests sent one at a time. */
#include <arpa/inet.h>
#include <errno.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_testutil.h"
#include "common/json.h"
#include "model_testutil.h"

typedef struct {
    pid_t pid;
    int port;
    char errpath[64];
} server;

/* Starts `kvpage serve --model GGUF --port 0 EXTRA` and waits (up to 120 s) for its listening line. */
static server start(const char *extra)
{
    tu_require_shared();
    server s = {0};
    snprintf(s.errpath, sizeof s.errpath, "/tmp/kvp_serve_err_XXXXXX");
    int fd = mkstemp(s.errpath);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s serve --model %s --port 0 %s >/dev/null 2>%s", kvp_test_bin(), S260_GGUF, extra,
             s.errpath);
    s.pid = fork();
    cr_assert_geq(s.pid, 0);
    if (s.pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1200 && s.port == 0; i++) {
        FILE *f = fopen(s.errpath, "r");
        char line[512] = "";
        if (f) {
            while (fgets(line, sizeof line, f))
                if (sscanf(line, "kvpage serve: listening on http://127.0.0.1:%d", &s.port) == 1) break;
            fclose(f);
        }
        int st;
        if (s.port == 0 && waitpid(s.pid, &st, WNOHANG) == s.pid) cr_assert_fail("the server exited: %s", line);
        if (s.port == 0) usleep(100 * 1000);
    }
    cr_assert_gt(s.port, 0, "the server did not start listening");
    return s;
}

/* SIGTERM, then the exit status must be 0. */
static void stop(server *s)
{
    cr_assert_eq(kill(s->pid, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(s->pid, &st, 0), s->pid);
    size_t len;
    char *err = (char *)tu_read_all(s->errpath, &len);
    err[len] = '\0';
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server ended with status %d: %s", st, err);
    free(err);
    unlink(s->errpath);
}

/* One HTTP/1.1 exchange: the status code and the body in *resp (malloc'ed), or -1 and *resp NULL when the
 * exchange fails. No asserts: client threads call it too. */
static int http_try(const server *s, const char *method, const char *path, const char *body, char **resp)
{
    *resp = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, sizeof a)) != 0 && errno == EINTR) {}
    size_t blen = body ? strlen(body) : 0;
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n", method, path, blen);
    if (rc != 0 || send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl) {
        close(fd);
        return -1;
    }
    for (size_t at = 0; at < blen;) {
        ssize_t k = send(fd, body + at, blen - at, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server may answer (413) and close before reading it all */
        at += (size_t)k;
    }
    char *all = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096 && !(all = realloc(all, cap = cap ? 2 * cap : 1 << 16))) break;
        ssize_t k = recv(fd, all + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    int code = -1;
    if (all) {
        all[len] = '\0';
        char *b = strstr(all, "\r\n\r\n");
        if (sscanf(all, "HTTP/1.1 %d", &code) == 1 && b) {
            *b = '\0';
            int chunked = strcasestr(all, "\r\nTransfer-Encoding: chunked") != NULL;
            b += 4;
            if (chunked) { /* size in hex, CRLF, data, CRLF; size 0 ends */
                char *w = b;
                for (const char *r = b;;) {
                    char *end;
                    unsigned long n = strtoul(r, &end, 16);
                    if (end == r || strncmp(end, "\r\n", 2) != 0 || n == 0) break;
                    memmove(w, end + 2, n);
                    w += n;
                    r = end + 2 + n + 2;
                }
                *w = '\0';
            }
            *resp = strdup(b);
        } else {
            code = -1;
        }
    }
    free(all);
    return *resp ? code : -1;
}

static int http(const server *s, const char *method, const char *path, const char *body, char **resp)
{
    int code = http_try(s, method, path, body, resp);
    cr_assert_geq(code, 0, "%s %s: no HTTP answer from port %d", method, path, s->port);
    return code;
}

/* POST /v1/completions with body; the code must be want; returns the parsed answer. */
static cJSON *complete(const server *s, const char *body, int want)
{
    char *resp;
    int code = http(s, "POST", "/v1/completions", body, &resp);
    cr_assert_eq(code, want, "%s -> %d: %s", body, code, resp);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(resp, strlen(resp), "response", &j), KVP_OK, "%s", resp);
    free(resp);
    return j;
}

static const char *choice_text(const cJSON *j, int i)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), i);
    cr_assert_not_null(c, "no choice %d", i);
    return cJSON_GetObjectItem(c, "text")->valuestring;
}

/* A metric's value from /metrics. */
static double metric(const server *s, const char *name)
{
    char *resp;
    cr_assert_eq(http(s, "GET", "/metrics", NULL, &resp), 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(resp, key);
    cr_assert_not_null(p, "no metric %s in %s", name, resp);
    double v = atof(p + strlen(key));
    free(resp);
    return v;
}

Test(serve, endpoints_and_the_golden_story)
{
    server s = start("--num-blocks 256 --served-model-name tiny");
    char *resp;
    cr_assert_eq(http(&s, "GET", "/health", NULL, &resp), 200);
    free(resp);
    cr_assert_eq(http(&s, "GET", "/v1/models", NULL, &resp), 200);
    cr_assert(strstr(resp, "\"id\":\"tiny\"") && strstr(resp, "\"max_model_len\":2048"), "%s", resp);
    free(resp);
    /* golden case 1: "Once upon a time" and what follows it, greedy */
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 1);
    const char *prompt = cJSON_GetObjectItem(c1, "prompt")->valuestring, *text = cJSON_GetObjectItem(c1, "text")->valuestring;
    const int np = cJSON_GetArraySize(cJSON_GetObjectItem(c1, "prompt_tokens"));
    const int ngen = cJSON_GetArraySize(cJSON_GetObjectItem(c1, "tokens_after_bos")) - (np - 1);
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"tiny\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompt, ngen);
    cJSON *j = complete(&s, body, 200);
    cr_assert_str_eq(choice_text(j, 0), text + strlen(prompt));
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    cr_assert_eq(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, np);
    cr_assert_eq(cJSON_GetObjectItem(u, "completion_tokens")->valueint, ngen);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "finish_reason")->valuestring,
                     "length");
    cJSON_Delete(j);
    /* the same prompt as token ids (no BOS added) */
    char ids[256] = "";
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(c1, "prompt_tokens"))
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", ids[0] ? "," : "", t->valueint);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0}", ids, ngen);
    j = complete(&s, body, 200);
    cr_assert_str_eq(choice_text(j, 0), text + strlen(prompt));
    cJSON_Delete(j);
    cJSON_Delete(gold);
    cr_assert_eq(metric(&s, "kvpage_generation_tokens_total"), 2 * ngen);
    stop(&s);
}

static const char *const prompts[] = {"Once upon a time", "The sun was shining", "Tom and Sue went to the park",
                                      "One day, a cat", "Lily wanted", "The little dog"};
#define NP 6

typedef struct {
    const server *s;
    int i;
    char *text;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    char body[256], *resp;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":48,\"temperature\":0}", prompts[c->i]);
    /* no asserts off the main thread: keep the raw answer */
    http_try(c->s, "POST", "/v1/completions", body, &resp);
    c->text = resp;
    return NULL;
}

/* Six clients at once get what each gets alone; six prompts in one request run in one batch: the steps they
 * take are those of the longest, not the sum. */
Test(serve, concurrent_clients_share_batches_and_get_their_solo_answers)
{
    server s = start("--num-blocks 512");
    char body[256];
    cJSON *solo[NP];
    for (int i = 0; i < NP; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":48,\"temperature\":0}", prompts[i]);
        solo[i] = complete(&s, body, 200);
    }
    client cl[NP];
    pthread_t tid[NP];
    for (int i = 0; i < NP; i++) {
        cl[i] = (client){&s, i, NULL};
        cr_assert_eq(pthread_create(&tid[i], NULL, client_main, &cl[i]), 0);
    }
    for (int i = 0; i < NP; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < NP; i++) {
        cJSON *j;
        cr_assert_not_null(cl[i].text, "client %d got no answer", i);
        cr_assert_eq(kvp_json_parse(cl[i].text, strlen(cl[i].text), "response", &j), KVP_OK, "%s", cl[i].text);
        cr_assert_str_eq(choice_text(j, 0), choice_text(solo[i], 0), "client %d", i);
        cJSON_Delete(j);
        free(cl[i].text);
    }
    const double steps0 = metric(&s, "kvpage_engine_steps_total");
    char all[1024] = "{\"max_tokens\":48,\"temperature\":0,\"prompt\":[";
    for (int i = 0; i < NP; i++) snprintf(all + strlen(all), sizeof all - strlen(all), "%s\"%s\"", i ? "," : "", prompts[i]);
    strcat(all, "]}");
    cJSON *j = complete(&s, all, 200);
    for (int i = 0; i < NP; i++) cr_assert_str_eq(choice_text(j, i), choice_text(solo[i], 0), "prompt %d of one request", i);
    cJSON_Delete(j);
    const double steps = metric(&s, "kvpage_engine_steps_total") - steps0;
    cr_assert(steps >= 48 && steps <= 50, "6 prompts x 48 tokens in one request took %g steps", steps);
    cr_assert_eq(metric(&s, "kvpage_engine_requests_finished_total"), 3 * NP);
    cr_assert_eq(metric(&s, "kvpage_sequences_running"), 0);
    for (int i = 0; i < NP; i++) cJSON_Delete(solo[i]);
    stop(&s);
}

/* n samples, seeded: the same request twice gives the same choices; the prompt's blocks are shared. */
Test(serve, seeded_samples_repeat)
{
    server s = start("--num-blocks 256 --block-size 4");
    const char *body = "{\"prompt\":\"Once upon a time, there was a little girl\",\"max_tokens\":24,\"n\":3,"
                       "\"temperature\":0.9,\"top_p\":0.95,\"top_k\":50,\"seed\":5}";
    cJSON *a = complete(&s, body, 200), *b = complete(&s, body, 200);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(a, "choices")), 3);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(choice_text(a, i), choice_text(b, i), "choice %d", i);
    cr_assert_gt(metric(&s, "kvpage_prefix_cache_hits_total"), 0, "the second request found the first's prompt");
    cJSON_Delete(a);
    cJSON_Delete(b);
    stop(&s);
}

/* Every bad request gets its error code and a message naming the problem; the server keeps serving. */
Test(serve, bad_requests_are_named_and_the_server_goes_on)
{
    server s = start("--num-blocks 64");
    static const struct {
        const char *method, *path, *body;
        int code;
        const char *needle;
    } cases[] = {
        {"POST", "/v1/completions", "{not json", 400, "not a JSON object"},
        {"POST", "/v1/completions", "{\"max_tokens\":4}", 400, "\"prompt\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":[1,2,99999]}", 400, "token 2 is not a token id"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400, "\"max_tokens\" must be an integer"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "\"temperature\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"n\":0}", 400, "\"n\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "\"stream\" must be true or false"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":true,\"n\":100}", 400, "at most 64 choices"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[\"x\"]}", 400, "\"stop\" is not supported"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"best_of\":3}", 400, "\"best_of\""},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"model\":\"gpt-4\"}", 404, "`gpt-4` does not exist"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2000}", 400, "raise --num-blocks"},
        {"GET", "/v1/completions", NULL, 405, "use POST"},
        {"POST", "/health", "{}", 405, "use GET"},
        {"GET", "/v2/chat", NULL, 404, "no such endpoint"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *resp;
        int code = http(&s, cases[i].method, cases[i].path, cases[i].body, &resp);
        cr_expect_eq(code, cases[i].code, "%s %s %s -> %d: %s", cases[i].method, cases[i].path, cases[i].body, code, resp);
        cJSON *j;
        cr_assert_eq(kvp_json_parse(resp, strlen(resp), "response", &j), KVP_OK, "%s", resp);
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        cr_assert(cJSON_IsString(m), "%s", resp);
        cr_expect(strstr(m->valuestring, cases[i].needle) != NULL, "%s: '%s' lacks '%s'", cases[i].body, m->valuestring,
                  cases[i].needle);
        cJSON_Delete(j);
        free(resp);
    }
    /* a prompt longer than the context, and a body over 1 MiB */
    size_t big = 3 << 20;
    char *body = malloc(big + 64);
    strcpy(body, "{\"prompt\":\"");
    size_t at = strlen(body);
    for (int k = 0; k < 3000; k++, at += 4) memcpy(body + at, "cat ", 4);
    strcpy(body + at, "\"}");
    cJSON *j = complete(&s, body, 400);
    cr_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring, "context"));
    cJSON_Delete(j);
    strcpy(body, "{\"prompt\":[1"); /* 200,000 token ids: refused (and parsed in linear time) */
    at = strlen(body);
    for (int k = 0; k < 200000; k++, at += 2) memcpy(body + at, ",5", 2);
    strcpy(body + at, "]}");
    j = complete(&s, body, 400);
    cr_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring, "context"));
    cJSON_Delete(j);
    memset(body + 11, 'a', big - 20);
    strcpy(body + big - 9, "\"}");
    j = complete(&s, body, 413);
    cJSON_Delete(j);
    free(body);
    j = complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0}", 200);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, 5);
    cJSON_Delete(j);
    stop(&s);
}

/* SIGTERM while a long request runs: it is answered (503, or 200 if it finished first) and the server
 * exits 0. */
typedef struct {
    const server *s;
    char *resp;
    int code;
} long_call;

static void *long_main(void *arg)
{
    long_call *c = arg;
    c->code = http_try(c->s, "POST", "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2000,\"temperature\":0}",
                   &c->resp);
    return NULL;
}

Test(serve, stops_cleanly_with_a_request_in_flight)
{
    server s = start("--num-blocks 256");
    long_call c = {&s, NULL, 0};
    pthread_t tid;
    cr_assert_eq(pthread_create(&tid, NULL, long_main, &c), 0);
    for (int i = 0; i < 500 && metric(&s, "kvpage_engine_requests_total") < 1; i++) usleep(10 * 1000);
    stop(&s);
    pthread_join(tid, NULL);
    cr_assert(c.code == 503 || c.code == 200, "the request in flight got %d: %s", c.code, c.resp);
    if (c.code == 503) cr_assert(strstr(c.resp, "shutting down"), "%s", c.resp);
    free(c.resp);
}

/* The text of each choice of a server-sent event stream, concatenated over its events, and the finish
 * reasons. Fails unless the stream ends with [DONE]. */
static void sse_texts(const char *stream, char texts[][2048], char finish[][16], int nc)
{
    for (int c = 0; c < nc; c++) texts[c][0] = finish[c][0] = '\0';
    const char *p = stream, *last = NULL;
    while ((p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert_not_null(e, "an event without its blank line: %s", p);
        last = p;
        if (strncmp(p, "[DONE]", 6) == 0) break;
        cJSON *o;
        cr_assert_eq(kvp_json_parse(p, (size_t)(e - p), "event", &o), KVP_OK, "%.*s", (int)(e - p), p);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cr_assert_not_null(ch, "%.*s", (int)(e - p), p);
        const int c = cJSON_GetObjectItem(ch, "index")->valueint;
        cr_assert(c >= 0 && c < nc);
        const char *t = cJSON_GetObjectItem(ch, "text")->valuestring;
        strncat(texts[c], t, 2047 - strlen(texts[c]));
        const cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(finish[c], 16, "%s", f->valuestring);
        cJSON_Delete(o);
        p = e + 2;
    }
    cr_assert(last && strncmp(last, "[DONE]", 6) == 0, "no [DONE] at the end: %s", stream);
}

/* Streamed answers arrive in several events and add up to the unstreamed ones: greedy, and seeded samples
 * of two prompts (four choices). */
Test(serve, streamed_answers_add_up_to_the_whole_ones)
{
    server s = start("--num-blocks 256");
    /* the last two draw at temperature 1000: byte tokens, characters split over steps, and a <0x00> */
    const char *bodies[4] = {"{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0%s}",
                             "{\"prompt\":[\"Once upon a time\",\"Tom\"],\"max_tokens\":20,\"n\":2,\"seed\":9%s}",
                             "{\"prompt\":[1,200,300],\"max_tokens\":40,\"temperature\":1000,\"n\":8,\"seed\":1%s}",
                             "{\"prompt\":\"hi\",\"max_tokens\":40,\"temperature\":1000,\"n\":8,\"seed\":0%s}"};
    const int nc[4] = {1, 4, 8, 8};
    const double gen0 = metric(&s, "kvpage_generation_tokens_total");
    double gen = 0;
    for (int k = 0; k < 4; k++) {
        char body[256], *resp;
        snprintf(body, sizeof body, bodies[k], "");
        cJSON *whole = complete(&s, body, 200);
        gen += 2 * cJSON_GetObjectItem(cJSON_GetObjectItem(whole, "usage"), "completion_tokens")->valuedouble;
        snprintf(body, sizeof body, bodies[k], ",\"stream\":true");
        cr_assert_eq(http(&s, "POST", "/v1/completions", body, &resp), 200, "%s", resp);
        char texts[8][2048], finish[8][16];
        sse_texts(resp, texts, finish, nc[k]);
        for (int c = 0; c < nc[k]; c++) {
            cr_assert_str_eq(texts[c], choice_text(whole, c), "request %d choice %d", k, c);
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), c);
            cr_assert_str_eq(finish[c], cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "request %d choice %d", k, c);
        }
        free(resp);
        cJSON_Delete(whole);
    }
    cr_assert_eq(metric(&s, "kvpage_generation_tokens_total") - gen0, gen, "streamed tokens are counted too");
    stop(&s);
}

/* The first tokens of a long streamed answer arrive while it is still being generated; a client that
 * leaves mid-stream costs nothing more: the engine finishes the request, and the server goes on. */
Test(serve, tokens_stream_while_the_request_runs_and_a_client_may_leave)
{
    server s = start("--num-blocks 256");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":1000,\"temperature\":0,\"stream\":true}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    char buf[8192];
    size_t got = 0;
    while (got < sizeof buf - 1 && !strstr(buf, "\"text\":\" ")) { /* the first event with a word */
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        cr_assert_gt(k, 0, "the stream ended before its first word");
        got += (size_t)k;
        buf[got] = '\0';
    }
    cr_assert(strstr(buf, "text/event-stream"), "%s", buf);
    cr_assert_geq(metric(&s, "kvpage_sequences_running"), 1, "the first words came only after the whole answer");
    close(fd); /* gone mid-stream */
    for (int i = 0; i < 2400 && metric(&s, "kvpage_engine_requests_finished_total") < 1; i++) usleep(50 * 1000);
    cr_assert_eq(metric(&s, "kvpage_engine_requests_finished_total"), 1);
    cJSON *j = complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0}", 200);
    cJSON_Delete(j);
    stop(&s);
}

/* SIGTERM the moment the server listens, or twice in a row: exit 0 every time, whichever of its threads
 * (OpenBLAS's included) the signal lands on. */
Test(serve, signals_at_any_moment_stop_it_cleanly)
{
    for (int i = 0; i < 4; i++) {
        server s = start("--num-blocks 16");
        if (i % 2) cr_assert_eq(kill(s.pid, SIGTERM), 0);
        stop(&s);
    }
}

Test(serve_cli, bad_command_lines)
{
    static const kvp_cli_case cases[] = {
        {"", "--model is required"},
        {"--model " S260_GGUF " --port 70000", "--port"},
        {"--model " S260_GGUF " --host not-an-address --port 0", "--host not-an-address is not an IPv4 address"},
        {"--model /nonexistent.gguf --port 0", "/nonexistent.gguf"},
        {"--model " S260_GGUF " --kv-mem 100 --port 0", "holds no block"},
        {"--model " S260_GGUF " --bogus", "--bogus"},
    };
    kvp_test_cli_rejects("serve", cases, sizeof cases / sizeof cases[0]);
}
