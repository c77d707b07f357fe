/* `kvpage serve` for real: the server runs as a child process on a free port, the tests talk HTTP to it
 * over loopback (a plain socket client), then stop it with SIGTERM and require exit status 0 (under the
 * sanitizer build that includes LeakSanitizer's check). Answers are checked against golden.json and against
 * the same requests sent one at a time. */
#include "serve_testutil.h"

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
    char body[2048];
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
    /* several prompts of token ids, and a string among them */
    snprintf(body, sizeof body, "{\"prompt\":[[%s],\"%s\",[%s]],\"max_tokens\":%d,\"temperature\":0}", ids, prompt,
             ids, ngen);
    j = complete(&s, body, 200);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(choice_text(j, i), text + strlen(prompt), "prompt %d", i);
    cJSON_Delete(j);
    cJSON_Delete(gold);
    cr_assert_eq(metric(&s, "kvpage:generation_tokens_total"), 5 * ngen);
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

/* The answers of s to the NP prompts (48 greedy tokens), one request at a time. */
static void solo_answers(const server *s, cJSON *solo[NP])
{
    char body[256];
    for (int i = 0; i < NP; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":48,\"temperature\":0}", prompts[i]);
        solo[i] = complete(s, body, 200);
    }
}

/* NP clients at once on s: each must get its answer in solo. */
static void expect_concurrent_answers(const server *s, cJSON *const solo[NP])
{
    client cl[NP];
    pthread_t tid[NP];
    for (int i = 0; i < NP; i++) {
        cl[i] = (client){s, i, NULL};
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
}

/* Six clients at once get what each gets alone; six prompts in one request run in one batch: the steps they
 * take are those of the longest, not the sum. */
Test(serve, concurrent_clients_share_batches_and_get_their_solo_answers)
{
    server s = start("--num-blocks 512");
    cJSON *solo[NP];
    const double t0 = now_s();
    solo_answers(&s, solo);
    expect_concurrent_answers(&s, solo);
    const double steps0 = metric(&s, "kvpage:engine_steps_total");
    char all[1024] = "{\"max_tokens\":48,\"temperature\":0,\"prompt\":[";
    for (int i = 0; i < NP; i++) snprintf(all + strlen(all), sizeof all - strlen(all), "%s\"%s\"", i ? "," : "", prompts[i]);
    strcat(all, "]}");
    cJSON *j = complete(&s, all, 200);
    for (int i = 0; i < NP; i++) cr_assert_str_eq(choice_text(j, i), choice_text(solo[i], 0), "prompt %d of one request", i);
    cJSON_Delete(j);
    const double steps = metric(&s, "kvpage:engine_steps_total") - steps0;
    cr_assert(steps >= 48 && steps <= 50, "6 prompts x 48 tokens in one request took %g steps", steps);
    cr_assert_eq(metric(&s, "kvpage:engine_requests_finished_total"), 3 * NP);
    cr_assert_eq(metric(&s, "kvpage:num_sequences_running"), 0);
    /* every finished prompt observed once in seconds: its first token no later than its last, its last within
     * the test's time; each answered 48 tokens, so each has a time per output token */
    const double wall = now_s() - t0;
    double ttft, tpot, e2e;
    cr_assert_eq(histogram(&s, "kvpage:time_to_first_token_seconds", &ttft), 3 * NP);
    cr_assert_eq(histogram(&s, "kvpage:e2e_request_latency_seconds", &e2e), 3 * NP);
    cr_assert_eq(histogram(&s, "kvpage:request_time_per_output_token_seconds", &tpot), 3 * NP);
    cr_assert(ttft > 0 && ttft <= e2e && e2e <= 3 * NP * wall, "ttft %g s, e2e %g s, %d prompts in %g s", ttft, e2e,
              3 * NP, wall);
    for (int i = 0; i < NP; i++)
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(solo[i], "usage"), "completion_tokens")->valueint, 48);
    cr_assert(tpot > 0 && tpot * 47 <= e2e, "tpot %g s: 47 tokens after the first take at most e2e %g s", tpot, e2e);
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
    cr_assert_gt(metric(&s, "kvpage:prefix_cache_hits_total"), 0, "the second request found the first's prompt");
    /* usage.prompt_tokens_details.cached_tokens: none for the first, the full blocks of 4 the cache served (all
     * the hits) for the second, short of its whole prompt */
    const cJSON *ua = cJSON_GetObjectItem(a, "usage"), *ub = cJSON_GetObjectItem(b, "usage");
    const int ca = cJSON_GetObjectItem(cJSON_GetObjectItem(ua, "prompt_tokens_details"), "cached_tokens")->valueint;
    const int cb = cJSON_GetObjectItem(cJSON_GetObjectItem(ub, "prompt_tokens_details"), "cached_tokens")->valueint;
    const int pt = cJSON_GetObjectItem(ub, "prompt_tokens")->valueint;
    cr_assert_eq(ca, 0);
    cr_assert_eq(cb, metric(&s, "kvpage:prefix_cache_hits_total"));
    cr_assert(cb % 4 == 0 && cb > 0 && cb < pt, "%d of %d prompt tokens cached", cb, pt);
    cJSON_Delete(a);
    cJSON_Delete(b);
    stop(&s);
}

/* Every bad request gets its error code and a message naming the problem; the server keeps serving. */
/* A socket to s that has sent POST /v1/completions with the header lines `head` (CRLF-terminated) and blen
 * bytes of body, as far as the server takes them (the answer not read yet). */
static int post_raw(const server *s, const char *head, const char *body, size_t blen)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s\r\n", head);
    cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    for (size_t at = 0; at < blen;) {
        ssize_t k = send(fd, body + at, blen - at, MSG_NOSIGNAL);
        if (k <= 0) break; /* the server may answer (413) and close before reading it all */
        at += (size_t)k;
    }
    return fd;
}

/* post_raw's answer: its status code, or -1 when none comes within 30 s. */
static int raw_status(const server *s, const char *head, const char *body, size_t blen)
{
    int fd = post_raw(s, head, body, blen);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char ans[64] = "";
    int code = -1;
    if (recv(fd, ans, sizeof ans - 1, 0) > 0 && sscanf(ans, "HTTP/1.1 %d", &code) != 1) code = -1;
    close(fd);
    return code;
}

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
        {"POST", "/v1/completions", "{\"prompt\":[[1,2],[1,99999]]}", 400, "prompt 1: token 1 is not a token id"},
        {"POST", "/v1/completions", "{\"prompt\":[[1,2],[]]}", 400, "prompt 1 is 0 tokens"},
        {"POST", "/v1/completions", "{\"prompt\":[true]}", 400, "item 0 is not a string or an array of token ids"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":-1}", 400, "\"max_tokens\" must be an integer"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":\"hot\"}", 400, "\"temperature\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"n\":0}", 400, "\"n\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"min_p\":1.5}", 400, "\"min_p\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "\"stream\" must be true or false"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":true,\"n\":100}", 400, "at most 64 choices"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":21}", 400, "\"logprobs\" must be an integer in [0, 20]"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"echo\":1}", 400, "\"echo\" must be true or false"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"suffix\":\"x\"}", 400, "\"suffix\" is not supported"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":[1]}", 400, "\"logit_bias\" must be an object"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"x1\":1}}", 400, "key \"x1\" is not a token id"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"512\":1}}", 400, "key \"512\" is not a token id"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logit_bias\":{\"5\":101}}", 400, "of token 5 must be a number in"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"presence_penalty\":2.5}", 400, "\"presence_penalty\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"repetition_penalty\":0}", 400, "\"repetition_penalty\" must be"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":4,\"min_tokens\":5}", 400, "\"min_tokens\" must be an integer in [0, 4]"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"priority\":3}", 400, "\"priority\" needs a server started with --sched priority"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"priority\":0.5}", 400, "\"priority\" must be an integer"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":true}}", 400,
         "\"stream_options\" needs \"stream\": true"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"usage\":true}}", 400,
         "\"stream_options\" has no option \"usage\""},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
         "\"include_usage\" must be true or false"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":5}", 400, "\"stop\" must be a string or an array"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[\"\"]}", 400, "\"stop\" item 0 is not a string of 1 to"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop\":[\"a\",3]}", 400, "\"stop\" item 1"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"stop_token_ids\":[1,99999]}", 400,
         "\"stop_token_ids\" item 1 is not a token id"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"ignore_eos\":\"yes\"}", 400, "\"ignore_eos\" must be true or false"},
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
    /* a body over 1 MiB: announced by Content-Length, answered before it is sent; sent in chunks (no length
     * up front), answered once it is read */
    cr_assert_eq(raw_status(&s, "Content-Length: 3145728\r\n", NULL, 0), 413);
    cr_assert_eq(raw_status(&s, "Content-Length: 1099511627776\r\n", NULL, 0), 413);
    int n = sprintf(body, "%zx\r\n", big);
    strcpy(body + n, "{\"prompt\":\"");
    memset(body + n + 11, 'a', big - 13);
    strcpy(body + n + big - 2, "\"}\r\n0\r\n\r\n");
    cr_assert_eq(raw_status(&s, "Transfer-Encoding: chunked\r\n", body, strlen(body)), 413);
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
    for (int i = 0; i < 500 && metric(&s, "kvpage:engine_requests_total") < 1; i++) usleep(10 * 1000);
    stop(&s);
    pthread_join(tid, NULL);
    cr_assert(c.code == 503 || c.code == 200, "the request in flight got %d: %s", c.code, c.resp);
    if (c.code == 503) cr_assert(strstr(c.resp, "shutting down"), "%s", c.resp);
    free(c.resp);
}

/* The next event of a server-sent event stream at *p, parsed (the caller deletes it), or NULL at its final
 * [DONE]. Fails on a stream that ends without [DONE] or an event that is not JSON. */
static cJSON *sse_next(const char **p)
{
    const char *d = strstr(*p, "data: ");
    cr_assert_not_null(d, "no [DONE] at the end of the stream");
    d += 6;
    const char *e = strstr(d, "\n\n");
    cr_assert_not_null(e, "an event without its blank line: %s", d);
    *p = e + 2;
    if (strncmp(d, "[DONE]", 6) == 0) return NULL;
    cJSON *o;
    cr_assert_eq(kvp_json_parse(d, (size_t)(e - d), "event", &o), KVP_OK, "%.*s", (int)(e - d), d);
    return o;
}

/* The text of each choice of a server-sent event stream, concatenated over its events, and the finish
 * reasons. Fails unless the stream ends with [DONE]. */
static void sse_texts(const char *stream, char texts[][2048], char finish[][16], int nc)
{
    for (int c = 0; c < nc; c++) texts[c][0] = finish[c][0] = '\0';
    cJSON *o;
    for (const char *p = stream; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cr_assert(ch || cJSON_IsObject(cJSON_GetObjectItem(o, "usage")), "an event without a choice or a usage");
        if (!ch) continue; /* stream_options.include_usage: the usage, no choice */
        const int c = cJSON_GetObjectItem(ch, "index")->valueint;
        cr_assert(c >= 0 && c < nc);
        const char *t = cJSON_GetObjectItem(ch, "text")->valuestring;
        strncat(texts[c], t, 2047 - strlen(texts[c]));
        const cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(finish[c], 16, "%s", f->valuestring);
    }
}

/* The completion of body (a format with one %s for more fields) asked whole, then streamed: the streamed
 * choices' texts (first nc) must add up to the whole ones. Returns the stream (malloc'ed) for more checks. */
static char *expect_stream_adds_up(const server *s, const char *body, int nc)
{
    char b[256], *resp, texts[8][2048], finish[8][16];
    snprintf(b, sizeof b, body, "");
    cJSON *whole = complete(s, b, 200);
    snprintf(b, sizeof b, body, ",\"stream\":true");
    cr_assert_eq(http(s, "POST", "/v1/completions", b, &resp), 200, "%s", resp);
    sse_texts(resp, texts, finish, nc);
    for (int c = 0; c < nc; c++) cr_assert_str_eq(texts[c], choice_text(whole, c), "%s: choice %d", body, c);
    cJSON_Delete(whole);
    return resp;
}

/* Streamed answers arrive in several events and add up to the unstreamed ones: greedy, seeded samples of two
 * prompts (four choices), samples at a high temperature, samples cut by stop strings. */
Test(serve, streamed_answers_add_up_to_the_whole_ones)
{
    server s = start("--num-blocks 256");
    /* the last two draw at temperature 1000: byte tokens, characters split over steps, and a <0x00> */
    const char *bodies[5] = {"{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0%s}",
                             "{\"prompt\":[\"Once upon a time\",\"Tom\"],\"max_tokens\":20,\"n\":2,\"seed\":9%s}",
                             "{\"prompt\":[1,200,300],\"max_tokens\":40,\"temperature\":1000,\"n\":8,\"seed\":1%s}",
                             "{\"prompt\":\"hi\",\"max_tokens\":40,\"temperature\":1000,\"n\":8,\"seed\":0%s}",
                             "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"n\":4,\"seed\":4,\"stop\":[\" the\",\"ed \"]%s}"};
    const int nc[5] = {1, 4, 8, 8, 4};
    const double gen0 = metric(&s, "kvpage:generation_tokens_total");
    double gen = 0;
    for (int k = 0; k < 5; k++) {
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
    cr_assert_eq(metric(&s, "kvpage:generation_tokens_total") - gen0, gen, "streamed tokens are counted too");
    stop(&s);
}

/* --stream-interval 8: a streamed answer of 41 tokens comes in at most 1 + 40 / 8 + 1 events with text (the
 * first token at once, then every 8 steps, the rest with the finish reason), and adds up to the whole one,
 * for each of 4 samples. */
Test(serve, stream_interval_sends_every_n_steps)
{
    server s = start("--stream-interval 8");
    char *resp = expect_stream_adds_up(
        &s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":41,\"n\":4,\"seed\":3,\"ignore_eos\":true%s}", 4);
    int events[4] = {0};
    cJSON *o;
    for (const char *p = resp; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        if (ch && cJSON_GetObjectItem(ch, "text")->valuestring[0]) events[cJSON_GetObjectItem(ch, "index")->valueint]++;
    }
    for (int c = 0; c < 4; c++)
        cr_assert(events[c] >= 1 && events[c] <= 7, "choice %d came in %d events with text", c, events[c]);
    free(resp);
    stop(&s);
}

/* The first tokens of a long streamed answer arrive while it is still being generated; a client that
 * leaves mid-stream cancels its request: the engine stops generating for it, and the server goes on. */
/* A socket to s that has sent POST /v1/completions with body (the answer not read yet). */
static int send_raw(const server *s, const char *body)
{
    char head[64];
    snprintf(head, sizeof head, "Content-Length: %zu\r\n", strlen(body));
    return post_raw(s, head, body, strlen(body));
}

/* A socket with a streamed request of 1000 tokens on s, read up to its first event with a word (in buf). */
/* A request that runs for a while on any machine: 16 samples of 2,000 tokens (32,000 tokens, and more as they
 * preempt each other in a small cache), so that a client that leaves is noticed long before its end. */
#define LONG_REQUEST(more) "{\"prompt\":\"Once\",\"max_tokens\":2000,\"n\":16,\"temperature\":0" more "}"
#define LONG_TOKENS (16 * 2000)

static int stream_first_word(const server *s, char *buf, size_t cap)
{
    int fd = send_raw(s, LONG_REQUEST(",\"stream\":true"));
    buf[0] = '\0';
    for (size_t got = 0; got < cap - 1 && !strstr(buf, "\"text\":\" ");) {
        ssize_t k = recv(fd, buf + got, cap - 1 - got, 0);
        cr_assert_gt(k, 0, "the stream ended before its first word");
        got += (size_t)k;
        buf[got] = '\0';
    }
    return fd;
}

Test(serve, tokens_stream_while_the_request_runs_and_a_client_that_leaves_cancels_it)
{
    server s = start("--num-blocks 256");
    char buf[8192];
    int fd = stream_first_word(&s, buf, sizeof buf);
    cr_assert(strstr(buf, "text/event-stream"), "%s", buf);
    cr_assert_geq(metric(&s, "kvpage:num_sequences_running"), 1, "the first words came only after the whole answer");
    close(fd); /* gone mid-stream */
    for (int i = 0; i < 2400 && metric(&s, "kvpage:engine_requests_finished_total") < 1; i++) usleep(50 * 1000);
    cr_assert_eq(metric(&s, "kvpage:engine_requests_finished_total"), 1);
    cr_assert_eq(metric(&s, "kvpage:requests_cancelled_total"), 1);
    cr_assert_lt(metric(&s, "kvpage:computed_tokens_total"), LONG_TOKENS * 3 / 4, "the engine went on after its client left");
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
        if (i % 2) cr_assert_eq(kill(s.serving, SIGTERM), 0);
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
        {"--model " S260_GGUF " --reasoning-parser qwen9 --port 0", "unknown reasoning parser 'qwen9'"},
        {"--model " S260_GGUF " --stream-interval 0 --port 0", "--stream-interval"},
        {"--model " S260_GGUF " --sched sjf --port 0", "unknown scheduling policy 'sjf'"},
        {"--model " S260_GGUF " --kv-offloading-size 10 --port 0", "--kv-offloading-size of 10 bytes holds no block"},
        {"--model " S260_GGUF " --kv-offloading-size 1MiB --cache none --port 0", "needs a prefix cache"},
        {"--model " S260_GGUF " --kv-offloading-policy write_back --port 0", "needs a host tier"},
        {"--model " S260_GGUF " --kv-offloading-size 1MiB --kv-offloading-policy never --port 0", "'never'"},
        {"--model " S260_GGUF " --max-model-len 4096 --port 0", "max_model_len 4096 exceeds the context of"},
        {"--model " S260_GGUF " --generation-config hf --port 0", "--generation-config: 'hf' is neither auto nor vllm"},
        {"--model " S260_GGUF " --idle-timeout 0 --port 0", "--idle-timeout: '0' is not a number of seconds"},
        {"--model " S260_GGUF " --header-timeout soon --port 0", "--header-timeout: 'soon' is not a number of seconds"},
        {"--model " S260_GGUF " --max-request-tokens 0 --port 0", "--max-request-tokens"},
        {"--model " S260_GGUF " --max-response-bytes lots --port 0", "--max-response-bytes"},
        {"--model " S260_GGUF " --metrics-names prom --port 0", "--metrics-names: 'prom' is neither vllm nor kvpage"},
    };
    kvp_test_cli_rejects("serve", cases, sizeof cases / sizeof cases[0]);
}

/* A client that leaves while waiting for a whole (unstreamed) answer cancels it too. */
Test(serve, a_waiting_client_that_leaves_cancels_its_request)
{
    server s = start("--num-blocks 256");
    int fd = send_raw(&s, LONG_REQUEST(""));
    for (int i = 0; i < 500 && metric(&s, "kvpage:computed_tokens_total") < 20; i++) usleep(10 * 1000);
    close(fd);
    for (int i = 0; i < 2400 && metric(&s, "kvpage:engine_requests_finished_total") < 1; i++) usleep(50 * 1000);
    cr_assert_eq(metric(&s, "kvpage:requests_cancelled_total"), 1);
    cr_assert_lt(metric(&s, "kvpage:computed_tokens_total"), LONG_TOKENS * 3 / 4, "the engine went on after its client left");
    cr_assert_eq(metric(&s, "kvpage:num_sequences_running"), 0);
    cJSON *j = complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0}", 200);
    cJSON_Delete(j);
    stop(&s);
}

/* A choice's finish_reason and stop_reason (a string, a number, or null for "null"). */
static void expect_finish(const cJSON *j, int c, const char *finish, const char *stop_str, double stop_id)
{
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), c);
    cr_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, finish);
    const cJSON *r = cJSON_GetObjectItem(ch, "stop_reason");
    if (stop_str) cr_assert(cJSON_IsString(r) && strcmp(r->valuestring, stop_str) == 0, "stop_reason is not '%s'", stop_str);
    else if (stop_id >= 0) cr_assert(cJSON_IsNumber(r) && r->valuedouble == stop_id, "stop_reason is not %g", stop_id);
    else cr_assert(cJSON_IsNull(r), "stop_reason is not null");
}

/* Stop strings against the golden story (greedy): the text ends where the first one found starts (spanning
 * tokens, among several, kept with include_stop_str_in_output), in whole and streamed answers alike, and
 * the generation stops there; stop_token_ids end it at a token of the story. */
Test(serve, stop_strings_and_stop_token_ids)
{
    server s = start("--num-blocks 256");
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 1);
    const char *prompt = cJSON_GetObjectItem(c1, "prompt")->valuestring;
    const char *story = cJSON_GetObjectItem(c1, "text")->valuestring + strlen(prompt);
    const cJSON *toks = cJSON_GetObjectItem(c1, "tokens_after_bos");
    const int np = cJSON_GetArraySize(cJSON_GetObjectItem(c1, "prompt_tokens"));
    const int ngen = cJSON_GetArraySize(toks) - (np - 1);
    cr_assert_gt(strlen(story), 100);
    char stop1[8], stop2[8], want[1024], body[1024], *resp;
    snprintf(stop1, sizeof stop1, "%.5s", story + 60); /* 5 bytes from the middle: most likely two tokens */
    snprintf(stop2, sizeof stop2, "%.4s", story + 90);
    const char *at = strstr(story, stop1);
    snprintf(want, sizeof want, "%.*s", (int)(at - story), story);
    const char *fmt = "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stop\":%s%s}";
    char stops[64];
    snprintf(stops, sizeof stops, "[\"qqqz\",\"%s\",\"%s\"]", stop2, stop1);
    snprintf(body, sizeof body, fmt, prompt, ngen, stops, "");
    cJSON *j = complete(&s, body, 200);
    cr_assert_str_eq(choice_text(j, 0), want);
    expect_finish(j, 0, "stop", stop1, -1);
    const int used = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint;
    cr_assert_lt(used, ngen, "the generation went on past the stop string");
    cJSON_Delete(j);
    snprintf(body, sizeof body, fmt, prompt, ngen, stops, ",\"include_stop_str_in_output\":true");
    j = complete(&s, body, 200);
    char kept[1040];
    snprintf(kept, sizeof kept, "%s%s", want, stop1);
    cr_assert_str_eq(choice_text(j, 0), kept);
    cJSON_Delete(j);
    snprintf(body, sizeof body, fmt, prompt, ngen, stops, ",\"stream\":true");
    cr_assert_eq(http(&s, "POST", "/v1/completions", body, &resp), 200, "%s", resp);
    char texts[1][2048], finish[1][16];
    sse_texts(resp, texts, finish, 1);
    cr_assert_str_eq(texts[0], want, "streamed with stop strings");
    cr_assert_str_eq(finish[0], "stop");
    cr_assert(strstr(resp, "\"stop_reason\""), "%s", resp);
    free(resp);
    snprintf(body, sizeof body, fmt, prompt, ngen, "\"never in it\"", ""); /* found nowhere: the whole answer */
    j = complete(&s, body, 200);
    cr_assert(strncmp(story, choice_text(j, 0), strlen(choice_text(j, 0))) == 0);
    expect_finish(j, 0, "length", NULL, -1);
    cJSON_Delete(j);
    /* the 12th generated token as a stop token: the answer ends before its first appearance */
    const int tok = cJSON_GetArrayItem(toks, np - 1 + 11)->valueint;
    int first = 0;
    while (cJSON_GetArrayItem(toks, np - 1 + first)->valueint != tok) first++;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stop_token_ids\":[%d]}",
             prompt, ngen, tok);
    j = complete(&s, body, 200);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, first);
    cr_assert(strncmp(story, choice_text(j, 0), strlen(choice_text(j, 0))) == 0);
    expect_finish(j, 0, "stop", NULL, tok);
    cJSON_Delete(j);
    cJSON_Delete(gold);
    stop(&s);
}

/* More open connections than select() can watch (FD_SETSIZE, 1024): the server still answers. */
Test(serve, many_idle_connections_do_not_lock_clients_out)
{
    server s = start("--num-blocks 16");
    enum { NC = 1100 };
    static int fds[NC];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    for (int i = 0; i < NC; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(fds[i], 0, "socket %d: %s", i, strerror(errno));
        cr_assert_eq(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0, "connect %d: %s", i, strerror(errno));
    }
    usleep(200 * 1000);
    char *resp;
    cr_assert_eq(http(&s, "GET", "/health", NULL, &resp), 200);
    free(resp);
    for (int i = 0; i < NC; i++) close(fds[i]);
    stop(&s);
}

/* golden.json's second story, greedy, through s. */
static void expect_golden_story(server *s)
{
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 1);
    const char *prompt = cJSON_GetObjectItem(c1, "prompt")->valuestring, *text = cJSON_GetObjectItem(c1, "text")->valuestring;
    const int np = cJSON_GetArraySize(cJSON_GetObjectItem(c1, "prompt_tokens"));
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompt,
             cJSON_GetArraySize(cJSON_GetObjectItem(c1, "tokens_after_bos")) - (np - 1));
    cJSON *j = complete(s, body, 200);
    cr_assert_str_eq(choice_text(j, 0), text + strlen(prompt));
    cJSON_Delete(j);
    cJSON_Delete(gold);
}

/* --tp 2 without mpirun: rank 1 is a thread of the server's process (runtime/executor/tp_threads.h). The golden
 * story, six concurrent clients answered as by one process, and SIGTERM stops both ranks (exit 0). */
Test(serve_tp, two_rank_threads_answer_as_one_process)
{
    server one = start("--num-blocks 512"), two = start("--tp 2 --num-blocks 512");
    expect_golden_story(&two);
    cJSON *solo[NP];
    solo_answers(&one, solo);
    expect_concurrent_answers(&two, solo);
    for (int i = 0; i < NP; i++) cJSON_Delete(solo[i]);
    stop(&two);
    stop(&one);
}

/* --tp 2 under mpirun: rank 0 serves and schedules, rank 1 follows its operations step for step. The golden
 * story; six concurrent clients get the answers one process gives; samples cut by stop strings stream as
 * they answer whole; a client that leaves cancels its stream. SIGTERM to rank 0 stops both ranks, which
 * check that they made the same steps (else the job does not exit 0). */
Test(serve_tp, two_ranks_answer_as_one_process)
{
    server one = start("--num-blocks 512");
    /* speculating too: its stops (cut inside a step) and drafts must keep the ranks together */
    server two = start_with(MPIRUN " -np 2", "--tp 2 --num-blocks 512 --speculative-config "
                            "'{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":3,\"prompt_lookup_min\":1}'");
    expect_golden_story(&two);
    char body[512];
    cJSON *j;
    cJSON *solo[NP];
    solo_answers(&one, solo);
    expect_concurrent_answers(&two, solo);
    for (int i = 0; i < NP; i++) cJSON_Delete(solo[i]);
    /* a logit bias and penalties reach the other rank too (with the prompt's logprobs) */
    const char *lb = "{\"prompt\":\"Tom\",\"max_tokens\":20,\"n\":2,\"seed\":8,\"logit_bias\":{\"300\":4,\"29\":-3},"
                     "\"frequency_penalty\":0.5,\"repetition_penalty\":1.2,\"logprobs\":2,\"echo\":true}";
    cJSON *a = complete(&one, lb, 200), *b = complete(&two, lb, 200);
    for (int c = 0; c < 2; c++) cr_assert_str_eq(choice_text(a, c), choice_text(b, c), "choice %d", c);
    cJSON_Delete(a);
    cJSON_Delete(b);
    const char *fmt = "{\"prompt\":[\"Once upon a time\",\"Tom\"],\"max_tokens\":40,\"n\":3,\"seed\":4,"
                      "\"stop\":[\" the\",\"ed \"]%s}";
    snprintf(body, sizeof body, fmt, "");
    cJSON *whole = complete(&two, body, 200);
    snprintf(body, sizeof body, fmt, ",\"stream\":true");
    char *resp, texts[6][2048], finish[6][16];
    cr_assert_eq(http(&two, "POST", "/v1/completions", body, &resp), 200, "%s", resp);
    sse_texts(resp, texts, finish, 6);
    for (int c = 0; c < 6; c++) cr_assert_str_eq(texts[c], choice_text(whole, c), "choice %d", c);
    free(resp);
    cJSON_Delete(whole);
    char buf[8192];
    close(stream_first_word(&two, buf, sizeof buf));
    for (int i = 0; i < 2400 && metric(&two, "kvpage:requests_cancelled_total") < 1; i++) usleep(50 * 1000);
    for (int i = 0; i < 2400 && metric(&two, "kvpage:num_sequences_running") > 0; i++) usleep(50 * 1000);
    cr_assert_eq(metric(&two, "kvpage:requests_cancelled_total"), 1);
    cr_assert_eq(metric(&two, "kvpage:num_sequences_running"), 0);
    /* a reset of the prefix cache reaches the other rank: a 40-token prompt found cached is computed again on
     * both (the ranks' final check compares the tokens they computed) */
    strcpy(body, "{\"prompt\":[1");
    for (int i = 2; i <= 40; i++) snprintf(body + strlen(body), sizeof body - strlen(body), ",%d", 100 + i);
    strcat(body, "],\"max_tokens\":3,\"temperature\":0}");
    for (int k = 0; k < 3; k++) {
        if (k == 2) cJSON_Delete(post_json(&two, "/reset_prefix_cache", "", 200));
        j = complete(&two, body, 200);
        cr_assert_eq(cached_of(j), k == 1 ? 32 : 0, "request %d", k);
        cJSON_Delete(j);
    }
    j = complete(&two, "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0}", 200);
    cJSON_Delete(j);
    cr_assert_gt(metric(&two, "kvpage:spec_decode_num_accepted_tokens_total"), 0);
    stop(&two);
    stop(&one);
}

/* The logprobs object of choice 0: its arrays. */
static void lp_arrays(const cJSON *j, const cJSON **toks, const cJSON **lps, const cJSON **tops, const cJSON **offs)
{
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    cr_assert(cJSON_IsObject(lp), "no logprobs object");
    *toks = cJSON_GetObjectItem(lp, "tokens");
    *lps = cJSON_GetObjectItem(lp, "token_logprobs");
    *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    *offs = cJSON_GetObjectItem(lp, "text_offset");
    const int n = cJSON_GetArraySize(*toks);
    cr_assert(n == cJSON_GetArraySize(*lps) && n == cJSON_GetArraySize(*tops) && n == cJSON_GetArraySize(*offs));
}

/* echo + logprobs over the published greedy story (golden case 0) as a prompt of token ids: the text is the
 * story's, each place's likeliest token is the story's own token (it is the greedy story), and the tokens'
 * texts add up to the text at their offsets. Then the logprobs of 8 generated tokens equal, number for
 * number, those of the same tokens sent back as a prompt (decode and prefill give the same logits). */
Test(serve, logprobs_and_echo_follow_the_golden_story)
{
    server s = start("--num-blocks 256");
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 0);
    const cJSON *story = cJSON_GetObjectItem(c0, "tokens_after_bos");
    const char *text = cJSON_GetObjectItem(c0, "text")->valuestring;
    enum { N = 120 };
    char ids[4096] = "1", body[8192];
    for (int i = 0; i < N; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", cJSON_GetArrayItem(story, i)->valueint);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":0,\"echo\":true,\"logprobs\":1}", ids);
    cJSON *j = complete(&s, body, 200);
    const char *echoed = choice_text(j, 0);
    cr_assert_gt(strlen(echoed), 200);
    cr_assert_eq(strncmp(echoed, text, strlen(echoed)), 0, "echo: %s", echoed);
    const cJSON *toks, *lps, *tops, *offs;
    lp_arrays(j, &toks, &lps, &tops, &offs);
    cr_assert_eq(cJSON_GetArraySize(toks), N + 1);
    cr_assert(cJSON_IsNull(cJSON_GetArrayItem(lps, 0)) && cJSON_IsNull(cJSON_GetArrayItem(tops, 0)), "BOS has no logprob");
    char joined[4096] = "";
    for (int p = 1; p <= N; p++) {
        const char *t = cJSON_GetArrayItem(toks, p)->valuestring;
        const double lp = cJSON_GetArrayItem(lps, p)->valuedouble;
        const cJSON *d = cJSON_GetArrayItem(tops, p);
        cr_assert_eq(cJSON_GetArraySize(d), 1, "place %d: the story's token is the likeliest", p);
        cr_assert_str_eq(d->child->string, t, "place %d", p);
        cr_assert_eq(d->child->valuedouble, lp);
        cr_assert(lp <= 0 && lp > -20, "place %d: %g", p, lp);
        cr_assert_eq(cJSON_GetArrayItem(offs, p)->valueint, (int)strlen(joined), "place %d", p);
        strcat(joined, t);
    }
    cr_assert_str_eq(joined, echoed);
    cJSON_Delete(j);
    /* 8 greedy tokens after 20 of the story, with their top 3; then the same 28 tokens echoed */
    snprintf(ids, sizeof ids, "1");
    for (int i = 0; i < 20; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", cJSON_GetArrayItem(story, i)->valueint);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":8,\"temperature\":0,\"logprobs\":3}", ids);
    cJSON *gen = complete(&s, body, 200);
    for (int i = 20; i < 28; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", cJSON_GetArrayItem(story, i)->valueint);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":0,\"echo\":true,\"logprobs\":3}", ids);
    cJSON *echo = complete(&s, body, 200);
    const cJSON *gt, *gl, *gtop, *go, *et, *el, *etop, *eo;
    lp_arrays(gen, &gt, &gl, &gtop, &go);
    lp_arrays(echo, &et, &el, &etop, &eo);
    cr_assert_eq(cJSON_GetArraySize(gt), 8);
    cr_assert_eq(cJSON_GetArraySize(et), 29);
    for (int i = 0; i < 8; i++) {
        cr_assert_str_eq(cJSON_GetArrayItem(gt, i)->valuestring, cJSON_GetArrayItem(et, 21 + i)->valuestring);
        cr_assert_eq(cJSON_GetArrayItem(gl, i)->valuedouble, cJSON_GetArrayItem(el, 21 + i)->valuedouble, "token %d", i);
        const cJSON *a = cJSON_GetArrayItem(gtop, i), *b = cJSON_GetArrayItem(etop, 21 + i);
        cr_assert_eq(cJSON_GetArraySize(a), 3, "token %d: 3 likeliest, the chosen one among them", i);
        cr_assert(cJSON_Compare(a, b, 1), "token %d: the top 3 differ", i);
    }
    cr_assert_eq(cJSON_GetArrayItem(go, 0)->valueint, 0, "offsets count from the returned text");
    cJSON_Delete(gen);
    cJSON_Delete(echo);
    cJSON_Delete(gold);
    stop(&s);
}

/* stream_options: with include_usage the last event before [DONE] has no choice and the usage of the whole
 * answer (as the unstreamed answer's); with continuous_usage_stats every event carries the usage so far, its
 * completion tokens never going down; without them no event has a usage. */
Test(serve, stream_options_give_the_usage)
{
    server s = start("--num-blocks 256");
    const char *fmt = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"n\":2,\"seed\":3%s}";
    char body[512], *resp;
    snprintf(body, sizeof body, fmt, "");
    cJSON *whole = complete(&s, body, 200);
    const cJSON *wu = cJSON_GetObjectItem(whole, "usage");
    const char *opts[3] = {",\"stream\":true",
                           ",\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                           ",\"stream\":true,\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}"};
    for (int k = 0; k < 3; k++) {
        snprintf(body, sizeof body, fmt, opts[k]);
        cr_assert_eq(http(&s, "POST", "/v1/completions", body, &resp), 200, "%s", resp);
        int events = 0, with_usage = 0, last_empty = 0;
        double prev = -1;
        cJSON *o;
        for (const char *p = resp; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
            const cJSON *u = cJSON_GetObjectItem(o, "usage");
            events++;
            last_empty = cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")) == 0;
            if (u) {
                with_usage++;
                const double ct = cJSON_GetObjectItem(u, "completion_tokens")->valuedouble;
                cr_assert_geq(ct, prev, "option set %d: completion tokens went down", k);
                prev = ct;
                cr_assert_eq(cJSON_GetObjectItem(u, "prompt_tokens")->valuedouble,
                             cJSON_GetObjectItem(wu, "prompt_tokens")->valuedouble);
            }
            if (last_empty) {
                cr_assert(k > 0 && u, "option set %d: an event without choices", k);
                cr_assert(cJSON_Compare(u, wu, 1), "option set %d: the final usage differs from the whole answer's", k);
            }
        }
        cr_assert_eq(last_empty, k > 0, "option set %d: the last event", k);
        cr_assert_eq(with_usage, k == 0 ? 0 : k == 1 ? 1 : events, "option set %d: %d of %d events with a usage", k,
                     with_usage, events);
        free(resp);
    }
    cJSON_Delete(whole);
    stop(&s);
}

/* The contents of a chat stream's choice 0, joined; *role: its first delta named the assistant (and no
 * later one did); finish: the last finish reason. */
static void chat_stream(const char *stream, char *content, size_t cap, int *role, char *finish)
{
    content[0] = finish[0] = '\0';
    *role = 0;
    int first = 1;
    cJSON *o;
    for (const char *p = stream; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
        cr_assert_str_eq(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItem(ch, "delta"), *r = cJSON_GetObjectItem(d, "role"), *c = cJSON_GetObjectItem(d, "content");
        if (first) *role = cJSON_IsString(r) && strcmp(r->valuestring, "assistant") == 0;
        else cr_assert_null(r, "the role comes in the first delta only");
        first = 0;
        if (cJSON_IsString(c)) strncat(content, c->valuestring, cap - 1 - strlen(content));
        const cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(finish, 16, "%s", f->valuestring);
    }
}

/* --reasoning-parser deepseek_r1: stories260K never writes </think>, so its whole answer is reasoning_content
 * (the completion of the rendered prompt) and content is null; streamed, the reasoning_content deltas join to
 * it and no content comes. (The split at </think>, and streams cut anywhere, are tests/runtime/test_reasoning.c's.) */
Test(serve, reasoning_parser_keeps_an_unclosed_thought_apart)
{
    server s = start("--num-blocks 256 --chat-template llama2 --reasoning-parser deepseek_r1");
    kvp_tokenizer *tok;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &tok), KVP_OK, "%s", kvp_error_detail());
    const kvp_chat_msg m[1] = {{"user", "Tell me a story about Lily."}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_LLAMA2, tok, m, 1, 1, &ids, &n), KVP_OK);
    char body[4096] = "{\"max_tokens\":24,\"temperature\":0,\"prompt\":[", *resp;
    for (int32_t i = 0; i < n; i++) snprintf(body + strlen(body), sizeof body - strlen(body), "%s%d", i ? "," : "", ids[i]);
    strcat(body, "]}");
    cJSON *plain = complete(&s, body, 200);
    const char *chat_body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story about Lily.\"}],"
                            "\"max_tokens\":24,\"temperature\":0";
    snprintf(body, sizeof body, "%s}", chat_body);
    cJSON *ans = chat(&s, body, 200);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ans, "choices"), 0), "message");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")), "no </think>: no content");
    cr_assert_str_eq(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, choice_text(plain, 0));
    cr_assert_gt(strlen(choice_text(plain, 0)), 0);
    snprintf(body, sizeof body, "%s,\"stream\":true}", chat_body);
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, &resp), 200, "%s", resp);
    char reasoning[2048] = "", finish[16] = "";
    cJSON *o;
    int events = 0;
    for (const char *p = resp; (o = sse_next(&p)) != NULL; cJSON_Delete(o), events++) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *d = cJSON_GetObjectItem(ch, "delta");
        const cJSON *r = cJSON_GetObjectItem(d, "reasoning_content"), *c = cJSON_GetObjectItem(d, "content");
        if (events == 0) cr_assert_str_eq(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
        if (cJSON_IsString(r)) strncat(reasoning, r->valuestring, sizeof reasoning - 1 - strlen(reasoning));
        cr_assert(!cJSON_IsString(c) || c->valuestring[0] == '\0', "content delta [%s] before any </think>",
                  c->valuestring);
        const cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(finish, sizeof finish, "%s", f->valuestring);
    }
    cr_assert_gt(events, 0);
    cr_assert_str_eq(reasoning, choice_text(plain, 0));
    cr_assert_str_eq(finish, "length");
    free(resp);
    cJSON_Delete(ans);
    cJSON_Delete(plain);
    kvp_free(ids);
    kvp_tok_destroy(tok);
    stop(&s);
}

/* --chat-template llama2: a chat request's answer is the completion of the prompt the template renders
 * (token ids from kvp_chat_render_ids, whose renderings the chat tests check against the models' own
 * templates), whole, streamed and sampled; its usage counts that prompt; bad chats are named. */
Test(serve, chat_completions_answer_the_rendered_prompt)
{
    server s = start("--num-blocks 256 --chat-template llama2");
    kvp_tokenizer *tok;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &tok), KVP_OK, "%s", kvp_error_detail());
    const kvp_chat_msg m[4] = {{"system", "Be nice."}, {"user", "Tell me a story about Lily."},
                               {"assistant", "Lily was a girl."}, {"user", "What did she do?"}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_LLAMA2, tok, m, 4, 1, &ids, &n), KVP_OK);
    char idtext[4096] = "", body[8192], *resp;
    for (int32_t i = 0; i < n; i++) snprintf(idtext + strlen(idtext), sizeof idtext - strlen(idtext), "%s%d", i ? "," : "", ids[i]);
    const char *msgs = "[{\"role\":\"system\",\"content\":\"Be nice.\"},{\"role\":\"user\",\"content\":\"Tell me a story "
                       "about Lily.\"},{\"role\":\"assistant\",\"content\":\"Lily was a girl.\"},{\"role\":\"user\","
                       "\"content\":[{\"type\":\"text\",\"text\":\"What did \"},{\"type\":\"text\",\"text\":\"she do?\"}]}]";
    const char *tails[2] = {"\"temperature\":0", "\"n\":3,\"seed\":11"};
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"messages\":%s,\"max_completion_tokens\":24,%s}", msgs, tails[k]);
        cJSON *ans = chat(&s, body, 200);
        snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":24,%s}", idtext, tails[k]);
        cJSON *plain = complete(&s, body, 200);
        cr_assert_str_eq(cJSON_GetObjectItem(ans, "object")->valuestring, "chat.completion");
        cr_assert_eq(strncmp(cJSON_GetObjectItem(ans, "id")->valuestring, "chatcmpl-", 9), 0);
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ans, "usage"), "prompt_tokens")->valueint, n);
        const int nc = k ? 3 : 1;
        cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(ans, "choices")), nc);
        for (int c = 0; c < nc; c++) {
            const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ans, "choices"), c), "message");
            cr_assert_str_eq(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
            cr_assert_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, choice_text(plain, c), "chat %d choice %d", k, c);
        }
        if (k == 0) { /* streamed */
            snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":24,\"temperature\":0,\"stream\":true}", msgs);
            cr_assert_eq(http(&s, "POST", "/v1/chat/completions", body, &resp), 200, "%s", resp);
            char content[2048], finish[16];
            int role;
            chat_stream(resp, content, sizeof content, &role, finish);
            cr_assert(role, "the first delta names the assistant");
            cr_assert_str_eq(content, choice_text(plain, 0));
            cr_assert_str_eq(finish, "length");
            free(resp);
        }
        cJSON_Delete(ans);
        cJSON_Delete(plain);
    }
    /* logprobs: OpenAI's chat form, the completion's numbers; the tokens' bytes add up to the content */
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":10,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}", msgs);
    cJSON *ans = chat(&s, body, 200);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":10,\"temperature\":0,\"logprobs\":2}", idtext);
    cJSON *plain = complete(&s, body, 200);
    const cJSON *ch0 = cJSON_GetArrayItem(cJSON_GetObjectItem(ans, "choices"), 0);
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(ch0, "logprobs"), "content");
    const cJSON *plps = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(plain, "choices"), 0),
                                                                "logprobs"), "token_logprobs");
    cr_assert_eq(cJSON_GetArraySize(content), 10);
    char bytes[1024] = "";
    for (int t = 0; t < 10; t++) {
        const cJSON *e = cJSON_GetArrayItem(content, t), *tops = cJSON_GetObjectItem(e, "top_logprobs");
        cr_assert_eq(cJSON_GetObjectItem(e, "logprob")->valuedouble, cJSON_GetArrayItem(plps, t)->valuedouble, "token %d", t);
        cr_assert_eq(cJSON_GetArraySize(tops), 2);
        cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(tops, 0), "token")->valuestring,
                         cJSON_GetObjectItem(e, "token")->valuestring, "token %d is the greedy one", t);
        const cJSON *b;
        cJSON_ArrayForEach(b, cJSON_GetObjectItem(e, "bytes")) bytes[strlen(bytes)] = (char)b->valueint;
    }
    cr_assert_str_eq(bytes, cJSON_GetObjectItem(cJSON_GetObjectItem(ch0, "message"), "content")->valuestring);
    cJSON_Delete(ans);
    cJSON_Delete(plain);
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"{\"messages\":[]}", "\"messages\" must be an array of 1 to"},
        {"{\"max_tokens\":3}", "\"messages\" must be"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]}", "roles must alternate"},
        {"{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}", "role \"robot\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", "only text content parts"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "\"content\" must be a string or an array"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"prompt\":\"a\"}", "\"prompt\" is for /v1/completions"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", "needs \"logprobs\": true"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"echo\":true}", "\"echo\" is not supported on"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}", "\"logprobs\" must be true or false"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"add_generation_prompt\":3}", "\"add_generation_prompt\" must be"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *e = chat(&s, bad[i].body, 400);
        const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
        cr_assert(strstr(msg, bad[i].needle), "%s: %s", bad[i].body, msg);
        cJSON_Delete(e);
    }
    cJSON *e = complete(&s, "{\"messages\":[]}", 400);
    cr_assert(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring,
                     "\"messages\" is for /v1/chat/completions"));
    cJSON_Delete(e);
    cr_assert_eq(http(&s, "GET", "/v1/chat/completions", NULL, &resp), 405);
    free(resp);
    kvp_free(ids);
    kvp_tok_destroy(tok);
    stop(&s);
}

/* The chat template comes from the model: none in stories260K's GGUF (chat answers 400 naming
 * --chat-template), TinyLlama's zephyr template in an HF folder's tokenizer_config.json (found: the --json line
 * names it and a chat is answered), and a tokenizer_config.json that is no JSON stops the server (exit 2, the
 * file named). */
Test(serve, chat_template_of_the_model)
{
    server s = start("--num-blocks 64");
    char *resp;
    cr_assert_eq(http(&s, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &resp), 400);
    cr_assert(strstr(resp, "--chat-template"), "%s", resp);
    free(resp);
    stop(&s);
    char dir[256], cmd[8192], path[512], *out, *err;
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char cwd[512];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "mkdir %s/hf && ln -s %s/%s/config.json %s/%s/model.safetensors %s/hf/ && ln -s %s/%s/llama2c %s/",
             dir, cwd, S260_HF, cwd, S260_HF, dir, cwd, S260_DIR, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/hf/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"chat_template\": \"{% for message in messages %}\\n{% if message['role'] == 'user' %}\\n{{ '<|user|>\\\\n' + "
          "message['content'] + eos_token }}\\n{% endif %}\\n{% if loop.last and add_generation_prompt %}\\n"
          "{{ '<|assistant|>' }}\\n{% endif %}\\n{% endfor %}\", \"bos_token\": \"<s>\"}", f);
    fclose(f);
    char extra[600];
    snprintf(extra, sizeof extra, "--num-blocks 64 --model %s/hf", dir);
    s = start(extra);
    out = (char *)tu_read_all(s.outpath, &(size_t){0});
    cr_assert(strstr(out, "\"chat_template\":\"zephyr\""), "%s", out);
    free(out);
    cJSON *j = chat(&s, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}", 200);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 1);
    cJSON_Delete(j);
    stop(&s);
    f = fopen(path, "w");
    fputs("{\"chat_template\": ", f);
    fclose(f);
    char run[1024];
    snprintf(run, sizeof run, "%s serve --model %s/hf --port 0", kvp_test_bin(), dir);
    cr_assert_eq(kvp_test_sh(run, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "tokenizer_config.json"), "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Penalties and logit_bias over HTTP: the penalized greedy answer is `kvpage generate`'s with the same
 * penalties (whose effect the generation tests check against a reference loop) and differs from the plain
 * one; a +100 bias makes one token every token. */
Test(serve, penalties_and_logit_bias)
{
    server s = start("--num-blocks 256");
    const char *prompt = "Once upon a time, there was a little dog";
    char body[1024], cmd[1024], *out, *err;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true%s}", prompt,
             ",\"frequency_penalty\":0.7,\"presence_penalty\":0.4,\"repetition_penalty\":1.3");
    cJSON *pen = complete(&s, body, 200);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}", prompt);
    cJSON *plain = complete(&s, body, 200);
    cr_assert_str_neq(choice_text(pen, 0), choice_text(plain, 0), "the penalties changed nothing");
    /* min_p 1 keeps only the likeliest token: sampling at temperature 1 gives the greedy answer */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":24,\"temperature\":1,\"seed\":3,\"min_p\":1,"
             "\"ignore_eos\":true}", prompt);
    cJSON *minp = complete(&s, body, 200);
    cr_assert_str_eq(choice_text(minp, 0), choice_text(plain, 0));
    cJSON_Delete(minp);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '%s' --max-tokens 24 --ignore-eos --json "
             "--frequency-penalty 0.7 --presence-penalty 0.4 --repetition-penalty 1.3", kvp_test_bin(), S260_GGUF, prompt);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
    cJSON *g;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate", &g), KVP_OK);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(g, "requests"), 0), "text")->valuestring,
                     choice_text(pen, 0));
    cJSON_Delete(g);
    free(out);
    free(err);
    cJSON *forced = complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":0,"
                                 "\"logit_bias\":{\"77\":100,\"78\":-5}}", 200);
    const cJSON *toks = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(forced, "choices"), 0),
                                                                "logprobs"), "tokens");
    cr_assert_eq(cJSON_GetArraySize(toks), 5);
    for (int i = 1; i < 5; i++)
        cr_assert_str_eq(cJSON_GetArrayItem(toks, i)->valuestring, cJSON_GetArrayItem(toks, 1)->valuestring);
    cJSON_Delete(forced);
    cJSON_Delete(pen);
    cJSON_Delete(plain);
    stop(&s);
}

/* Streamed logprobs add up to the whole answer's: each event carries the places decoded since the last one,
 * for completions (four arrays, offsets running on) and chats (content), sampled, with a stop string; with
 * echo the prompt's text and places lead each choice's first event (the texts add up too). */
Test(serve, streamed_logprobs_add_up_to_the_whole_ones)
{
    server s = start("--num-blocks 256 --chat-template zephyr");
    const char *bodies[3] = {"{\"prompt\":[\"Once upon a time\",\"Tom\"],\"max_tokens\":30,\"n\":2,\"seed\":5,\"logprobs\":3,"
                             "\"stop\":\" the\"%s}",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Tom\"}],\"max_tokens\":30,\"n\":2,\"seed\":5,"
                             "\"logprobs\":true,\"top_logprobs\":2%s}",
                             "{\"prompt\":[\"Once upon a time\",[1,403,407]],\"max_tokens\":12,\"n\":2,\"seed\":6,"
                             "\"logprobs\":2,\"echo\":true%s}"};
    const char *paths[3] = {"/v1/completions", "/v1/chat/completions", "/v1/completions"};
    for (int k = 0; k < 3; k++) {
        char body[512], *resp;
        snprintf(body, sizeof body, bodies[k], "");
        cJSON *whole = post_json(&s, paths[k], body, 200);
        snprintf(body, sizeof body, bodies[k], ",\"stream\":true");
        cr_assert_eq(http(&s, "POST", paths[k], body, &resp), 200, "%s", resp);
        const int chat = k == 1, nc = chat ? 2 : 4, nkeys = chat ? 1 : 4;
        const char *keys[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        if (!chat) {
            char texts[4][2048], finish[4][16];
            sse_texts(resp, texts, finish, nc);
            for (int c = 0; c < nc; c++) cr_assert_str_eq(texts[c], choice_text(whole, c), "request %d choice %d", k, c);
        }
        cJSON *joined[4][4]; /* [choice][key] */
        for (int c = 0; c < nc; c++)
            for (int i = 0; i < nkeys; i++) joined[c][i] = cJSON_CreateArray();
        int events = 0;
        cJSON *o;
        for (const char *p = resp; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            const int c = cJSON_GetObjectItem(ch, "index")->valueint;
            const cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
            cr_assert(cJSON_IsObject(lp), "request %d: an event without logprobs", k);
            events++;
            for (int i = 0; i < nkeys; i++) {
                const cJSON *x;
                cJSON_ArrayForEach(x, cJSON_GetObjectItem(lp, chat ? "content" : keys[i]))
                    cJSON_AddItemToArray(joined[c][i], cJSON_Duplicate(x, 1));
            }
        }
        cr_assert_geq(events, nc, "request %d: %d events", k, events); /* more when the reader keeps up */
        for (int c = 0; c < nc; c++) {
            const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), c), "logprobs");
            cr_assert_gt(cJSON_GetArraySize(joined[c][0]), 0);
            for (int i = 0; i < nkeys; i++) {
                cr_assert(cJSON_Compare(joined[c][i], cJSON_GetObjectItem(lp, chat ? "content" : keys[i]), 1),
                          "request %d choice %d: streamed %s differ", k, c, chat ? "content" : keys[i]);
                cJSON_Delete(joined[c][i]);
            }
        }
        free(resp);
        cJSON_Delete(whole);
    }
    stop(&s);
}

/* An array of ints as a comma-separated list into out (for a JSON body). */
static void ids_list(const cJSON *a, char *out, size_t cap)
{
    out[0] = '\0';
    const cJSON *x;
    cJSON_ArrayForEach(x, a) snprintf(out + strlen(out), cap - strlen(out), "%s%d", out[0] ? "," : "", x->valueint);
}

/* vLLM's return_token_ids: each choice gives its prompt's ids and its generated ids, which /detokenize turns
 * back into the prompt and the text; streamed, the first event of a choice has the prompt's ids and the
 * events' ids add up to the whole answer's (greedy, seeded samples, a stop string); a chat's prompt ids are
 * the rendered template's. */
Test(serve, return_token_ids_give_the_answers_tokens)
{
    server s = start("--num-blocks 256 --chat-template zephyr");
    const char *bodies[3] = {"{\"prompt\":[1,403,407],\"max_tokens\":24,\"temperature\":0,\"return_token_ids\":true%s}",
                             "{\"prompt\":[\"Once upon a time\",\"Tom\"],\"max_tokens\":30,\"n\":2,\"seed\":3,"
                             "\"stop\":\" the\",\"return_token_ids\":true%s}",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Tom\"}],\"max_tokens\":20,\"n\":2,"
                             "\"seed\":5,\"return_token_ids\":true%s}"};
    const int nc[3] = {1, 4, 2};
    for (int k = 0; k < 3; k++) {
        const char *path = k == 2 ? "/v1/chat/completions" : "/v1/completions";
        char body[512], *resp, list[8192], more[4096], b2[12400];
        snprintf(body, sizeof body, bodies[k], "");
        cJSON *whole = post_json(&s, path, body, 200);
        const cJSON *usage = cJSON_GetObjectItem(whole, "usage");
        int gen = 0;
        for (int c = 0; c < nc[k]; c++) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), c);
            const cJSON *pids = cJSON_GetObjectItem(ch, "prompt_token_ids"), *ids = cJSON_GetObjectItem(ch, "token_ids");
            cr_assert(cJSON_IsArray(pids) && cJSON_IsArray(ids), "request %d choice %d: no token ids", k, c);
            cr_assert_gt(cJSON_GetArraySize(ids), 0, "request %d choice %d", k, c);
            gen += cJSON_GetArraySize(ids);
            if (k == 0) cr_assert_eq(cJSON_GetArraySize(pids), 3);
            if (k == 2) cr_assert_eq(cJSON_GetArraySize(pids), cJSON_GetObjectItem(usage, "prompt_tokens")->valueint);
            if (k == 1) continue; /* a stop string cuts the text, not the tokens */
            /* the prompt's ids and the answer's, detokenized: the prompt's text and the answer */
            ids_list(pids, list, sizeof list);
            ids_list(ids, more, sizeof more);
            snprintf(b2, sizeof b2, "{\"tokens\":[%s]}", list);
            cJSON *pt = post_json(&s, "/detokenize", b2, 200);
            snprintf(b2, sizeof b2, "{\"tokens\":[%s,%s]}", list, more);
            cJSON *all = post_json(&s, "/detokenize", b2, 200);
            const char *ptext = cJSON_GetObjectItem(pt, "prompt")->valuestring,
                       *atext = cJSON_GetObjectItem(all, "prompt")->valuestring;
            cr_assert_eq(strncmp(atext, ptext, strlen(ptext)), 0, "request %d: %s / %s", k, ptext, atext);
            const char *text = k == 2 ? cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring
                                      : cJSON_GetObjectItem(ch, "text")->valuestring;
            cr_assert_str_eq(atext + strlen(ptext), text, "request %d choice %d", k, c);
            cJSON_Delete(pt);
            cJSON_Delete(all);
        }
        cr_assert_eq(gen, cJSON_GetObjectItem(usage, "completion_tokens")->valueint, "request %d", k);
        /* streamed: the same ids */
        snprintf(body, sizeof body, bodies[k], ",\"stream\":true");
        cr_assert_eq(http(&s, "POST", path, body, &resp), 200, "%s", resp);
        cJSON *joined[4], *o;
        int firsts[4] = {0};
        for (int c = 0; c < nc[k]; c++) joined[c] = cJSON_CreateArray();
        for (const char *p = resp; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            const int c = cJSON_GetObjectItem(ch, "index")->valueint;
            const cJSON *ids = cJSON_GetObjectItem(ch, "token_ids"), *x;
            cr_assert(cJSON_IsArray(ids), "request %d: an event without token_ids", k);
            const cJSON *pids = cJSON_GetObjectItem(ch, "prompt_token_ids");
            cr_assert_eq(pids != NULL, firsts[c] == 0, "request %d choice %d: prompt ids in the first event only", k, c);
            firsts[c]++;
            cJSON_ArrayForEach(x, ids) cJSON_AddItemToArray(joined[c], cJSON_Duplicate(x, 1));
        }
        for (int c = 0; c < nc[k]; c++) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), c);
            cr_assert(cJSON_Compare(joined[c], cJSON_GetObjectItem(ch, "token_ids"), 1), "request %d choice %d", k, c);
            cJSON_Delete(joined[c]);
        }
        free(resp);
        cJSON_Delete(whole);
    }
    cJSON *e = complete(&s, "{\"prompt\":\"Tom\",\"return_token_ids\":\"yes\"}", 400);
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
    cr_assert(strstr(msg, "return_token_ids") != NULL, "%s", msg);
    cJSON_Delete(e);
    stop(&s);
}

/* POST /reset_prefix_cache (and SGLang's /flush_cache) empties the prefix cache: a prompt found cached is
 * not found after it, and is found again after it ran once more; other methods are refused. */
Test(serve, reset_prefix_cache_empties_it)
{
    server s = start("--num-blocks 64");
    char body[1024] = "{\"prompt\":[1";
    for (int i = 2; i <= 70; i++) snprintf(body + strlen(body), sizeof body - strlen(body), ",%d", 100 + i);
    strcat(body, "],\"max_tokens\":3,\"temperature\":0}");
    cJSON *j = complete(&s, body, 200);
    cJSON_Delete(j);
    j = complete(&s, body, 200);
    cr_assert_eq(cached_of(j), 64, "the 70-token prompt's 4 full blocks");
    cJSON_Delete(j);
    const char *paths[2] = {"/reset_prefix_cache", "/flush_cache"};
    for (int k = 0; k < 2; k++) {
        j = post_json(&s, paths[k], "", 200);
        cr_assert_geq(cJSON_GetObjectItem(j, "evicted_blocks")->valuedouble, 4, "%s", paths[k]);
        cJSON_Delete(j);
        j = complete(&s, body, 200);
        cr_assert_eq(cached_of(j), 0, "after %s", paths[k]);
        cJSON_Delete(j);
        j = complete(&s, body, 200);
        cr_assert_eq(cached_of(j), 64, "cached again after %s", paths[k]);
        cJSON_Delete(j);
    }
    char *resp;
    cr_assert_eq(http(&s, "GET", "/reset_prefix_cache", NULL, &resp), 405, "%s", resp);
    free(resp);
    stop(&s);
}

/* A KV cache of 8 blocks cannot hold two 70-token prompts: B's blocks take some of A's cached ones, and when A
 * comes back the host tier gives those (its 4 full blocks are reported as cached tokens, device and host hits
 * counted apart in /metrics), with the same answer; reset_prefix_cache empties the host tier too. Written
 * through, the tier got A's and B's full blocks; written back, only the evicted ones. Written through
 * selectively, it got nothing until A came back: then the blocks A found in the device cache, and A's evicted
 * ones are recomputed. */
static void host_tier_brings_a_prompt_back(kvp_hc_write_policy policy)
{
    char args[256];
    snprintf(args, sizeof args, "--num-blocks 8 --kv-offloading-size 1MiB --kv-offloading-policy %s",
             kvp_hc_write_policy_name(policy));
    server s = start(args);
    char a[1024] = "{\"prompt\":[1", b[1024] = "{\"prompt\":[1";
    for (int i = 2; i <= 70; i++) {
        snprintf(a + strlen(a), sizeof a - strlen(a), ",%d", 100 + i);
        snprintf(b + strlen(b), sizeof b - strlen(b), ",%d", 300 + i);
    }
    strcat(a, "],\"max_tokens\":3,\"temperature\":0}");
    strcat(b, "],\"max_tokens\":3,\"temperature\":0}");
    cJSON *first = complete(&s, a, 200), *j = complete(&s, b, 200);
    cr_assert_eq(cached_of(j), 0);
    cJSON_Delete(j);
    j = complete(&s, a, 200);
    const double host = metric(&s, "kvpage:host_cache_hits_total"), dev = metric(&s, "kvpage:prefix_cache_hits_total");
    const double stored = metric(&s, "kvpage:host_cache_stored_blocks_total");
    cr_assert_str_eq(choice_text(j, 0), choice_text(first, 0));
    if (policy == KVP_HC_WRITE_THROUGH_SELECTIVE) {
        cr_assert_eq(host, 0, "A's evicted blocks were never reused: not in the tier");
        cr_assert(dev > 0 && dev < 64, "the device kept some of A's blocks: %g", dev);
        cr_assert_eq(cached_of(j), dev);
        cr_assert_eq(stored, dev / 16, "the blocks A found in the device cache, once reused");
    } else {
        cr_assert_eq(cached_of(j), 64, "A's 4 full blocks, from the host tier");
        cr_assert_geq(host, 16, "B's blocks took some of A's");
        cr_assert_eq(dev + host, 64, "the device kept the rest");
        cr_assert_eq(metric(&s, "kvpage:host_cache_loaded_blocks_total"), host / 16);
        if (policy == KVP_HC_WRITE_BACK) cr_assert(stored >= host / 16 && stored < 8, "the evicted blocks only: %g", stored);
        else cr_assert_eq(stored, 8, "A's 4 full blocks and B's");
    }
    cJSON_Delete(j);
    j = post_json(&s, "/reset_prefix_cache", "", 200);
    cJSON_Delete(j);
    j = complete(&s, b, 200);
    cr_assert_eq(cached_of(j), 0, "reset emptied the host tier too");
    cJSON_Delete(j);
    cJSON_Delete(first);
    stop(&s);
}

Test(serve, a_host_tier_brings_a_prompt_back)
{
    for (int p = 0; p < KVP_HC_WRITE_POLICIES; p++) host_tier_brings_a_prompt_back((kvp_hc_write_policy)p);
}

/* --sched priority takes each request's "priority" (the order it implies is tested on the session, in
 * test_generate.c); --sched lpm serves as fcfs does, with the same greedy answers. */
Test(serve, sched_policies_take_requests)
{
    server p = start("--num-blocks 64 --sched priority"), l = start("--num-blocks 64 --sched lpm");
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"priority\":-3}";
    cJSON *a = complete(&p, body, 200), *b = complete(&l, "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                                                          "\"temperature\":0}", 200);
    cr_assert_str_eq(choice_text(a, 0), choice_text(b, 0));
    cJSON_Delete(a);
    cJSON_Delete(b);
    stop(&p);
    stop(&l);
}

/* --kv-dtype auto (the default) is the model's dtype: f32 for stories260K's f32 weights, bf16 for weights
 * held in bf16, whose --kv-mem then holds twice the blocks; a type named is kept. */
Test(serve, kv_dtype_auto_follows_the_weights)
{
    static const struct {
        const char *extra, *kv;
        int blocks_x; /* blocks of 1 MiB, in units of the f32 cache's */
    } cases[] = {{"", "f32", 1}, {"--weight-dtype bf16", "bf16", 2}, {"--weight-dtype bf16 --kv-dtype f32", "f32", 1},
                 {"--kv-dtype auto --weight-dtype q8_0", "f16", 2}};
    int f32_blocks = 0;
    for (int i = 0; i < 4; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, "--kv-mem 1MiB %s", cases[i].extra);
        server s = start(extra);
        cr_assert_str_eq(s.kv_dtype, cases[i].kv, "%s", extra);
        if (i == 0) f32_blocks = s.num_blocks;
        cr_assert_eq(s.num_blocks, cases[i].blocks_x * f32_blocks, "%s: %d blocks (f32: %d)", extra, s.num_blocks, f32_blocks);
        cJSON *j = complete(&s, "{\"prompt\":\"Lily\",\"max_tokens\":4,\"temperature\":0}", 200);
        cJSON_Delete(j);
        stop(&s);
    }
}

/* vLLM's /tokenize and /detokenize against the published tokens of golden.json (with and without BOS, and
 * the 256-token story back to its text), a conversation through the chat template, bad input. */
Test(serve, tokenize_and_detokenize)
{
    server s = start("--num-blocks 64 --chat-template zephyr --max-model-len 300");
    /* --max-model-len: what /tokenize reports, and prompts of that length get 400 */
    cJSON *capped = post_json(&s, "/tokenize", "{\"prompt\":\"Lily\"}", 200);
    cr_assert_eq(cJSON_GetObjectItem(capped, "max_model_len")->valueint, 300);
    cJSON_Delete(capped);
    char longp[4096] = "{\"prompt\":[1";
    for (int i = 1; i < 300; i++) strcat(longp, ",5");
    strcat(longp, "],\"max_tokens\":1}");
    capped = complete(&s, longp, 400);
    char *msg = cJSON_PrintUnformatted(capped);
    cr_assert(strstr(msg, "prompt 0 is 300 tokens, the model's context is 300"), "%s", msg);
    free(msg);
    cJSON_Delete(capped);
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 0);
    const cJSON *c1 = cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 1);
    const cJSON *want = cJSON_GetObjectItem(c1, "prompt_tokens");
    char body[8192];
    for (int bos = 0; bos < 2; bos++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"add_special_tokens\":%s}",
                 cJSON_GetObjectItem(c1, "prompt")->valuestring, bos ? "true" : "false");
        cJSON *j = post_json(&s, "/tokenize", body, 200);
        const cJSON *t = cJSON_GetObjectItem(j, "tokens");
        cr_assert_eq(cJSON_GetArraySize(t), cJSON_GetArraySize(want) - !bos);
        cr_assert_eq(cJSON_GetObjectItem(j, "count")->valueint, cJSON_GetArraySize(t));
        for (int i = 0; i < cJSON_GetArraySize(t); i++)
            cr_assert_eq(cJSON_GetArrayItem(t, i)->valueint, cJSON_GetArrayItem(want, i + !bos)->valueint, "token %d", i);
        cJSON_Delete(j);
    }
    snprintf(body, sizeof body, "{\"tokens\":[1");
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(c0, "tokens_after_bos"))
        snprintf(body + strlen(body), sizeof body - strlen(body), ",%d", x->valueint);
    strcat(body, "]}");
    cJSON *j = post_json(&s, "/detokenize", body, 200);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "prompt")->valuestring, cJSON_GetObjectItem(c0, "text")->valuestring);
    cJSON_Delete(j);
    /* a conversation: the template's tokens */
    kvp_tokenizer *tok;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &tok), KVP_OK, "%s", kvp_error_detail());
    const kvp_chat_msg m[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_ZEPHYR, tok, m, 2, 1, &ids, &n), KVP_OK);
    j = post_json(&s, "/tokenize", "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                                   "\"content\":\"Hi\"}]}", 200);
    const cJSON *t = cJSON_GetObjectItem(j, "tokens");
    cr_assert_eq(cJSON_GetArraySize(t), n);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(cJSON_GetArrayItem(t, i)->valueint, ids[i]);
    cJSON_Delete(j);
    kvp_free(ids);
    kvp_tok_destroy(tok);
    static const struct {
        const char *path, *body, *needle;
    } bad[] = {
        {"/tokenize", "{\"prompt\":5}", "\"prompt\" must be a string"},
        {"/tokenize", "{\"prompt\":\"a\",\"add_special_tokens\":1}", "\"add_special_tokens\" must be true or false"},
        {"/tokenize", "{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}", "role \"robot\""},
        {"/detokenize", "{\"tokens\":\"1 2\"}", "\"tokens\" must be an array"},
        {"/detokenize", "{\"tokens\":[1,512]}", "\"tokens\" item 1 is not a token id"},
        {"/detokenize", "[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *e = post_json(&s, bad[i].path, bad[i].body, 400);
        const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
        cr_assert(strstr(msg, bad[i].needle), "%s %s: %s", bad[i].path, bad[i].body, msg);
        cJSON_Delete(e);
    }
    char *resp;
    cr_assert_eq(http(&s, "GET", "/tokenize", NULL, &resp), 405);
    free(resp);
    cJSON_Delete(gold);
    stop(&s);
}

/* A byte-level (Qwen2-style) tokenizer and its ChatML template end to end: stories260K's weights beside the
 * 512-token tokenizer.json of tests/data/tokenizers/qwen2 and a tokenizer_config.json holding (an abridged)
 * Qwen2.5 chat_template. Control tokens written in a prompt are parsed (as vLLM does), a conversation is the
 * template's ids, samples at a high temperature (byte pieces of CJK and emoji split over steps) stream to
 * their whole text, and a reply ends at <|im_end|>, the template's end of turn, not in the content. */
Test(serve, byte_level_tokenizer_and_chatml)
{
    char dir[256], cmd[4096], path[512];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char cwd[512];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(cmd, sizeof cmd, "ln -s %s/%s/config.json %s/%s/model.safetensors %s/ && cp tests/data/tokenizers/qwen2/tokenizer.json %s/",
             cwd, S260_HF, cwd, S260_HF, dir, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"eos_token\": \"<|im_end|>\", \"bos_token\": null, \"chat_template\": \"{%- if messages[0]['role'] == "
          "'system' %}...{%- else %}{{- '<|im_start|>system\\\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\\\\n' }}{%- endif %}...{{- '<|im_start|>' + message.role + '\\\\n' + message.content + "
          "'<|im_end|>' + '\\\\n' }}...\"}", f);
    fclose(f);
    char extra[600];
    snprintf(extra, sizeof extra, "--num-blocks 256 --model %s", dir);
    server s = start(extra);
    char *out = (char *)tu_read_all(s.outpath, &(size_t){0});
    cr_assert(strstr(out, "\"chat_template\":\"qwen2.5\""), "%s", out);
    free(out);
    kvp_tokenizer *tok;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(kvp_tok_from_hf_json(path, &tok), KVP_OK, "%s", kvp_error_detail());
    const int32_t im_start = kvp_tok_special_id(tok, "<|im_start|>"), im_end = kvp_tok_special_id(tok, "<|im_end|>");
    cr_assert(im_start >= 0 && im_end >= 0);
    /* control tokens in a prompt */
    cJSON *j = post_json(&s, "/tokenize", "{\"prompt\":\"a<|im_start|>b\"}", 200);
    const cJSON *t = cJSON_GetObjectItem(j, "tokens");
    cr_assert_eq(cJSON_GetArraySize(t), 3, "no BOS for this tokenizer; a, the control token, b");
    cr_assert_eq(cJSON_GetArrayItem(t, 1)->valueint, im_start);
    cJSON_Delete(j);
    /* a conversation: the template's ids, the default system message included */
    const kvp_chat_msg m[1] = {{"user", "Hi \xe6\x97\xa5\xe6\x9c\xac!"}};
    int32_t *ids, n;
    cr_assert_eq(kvp_chat_render_ids(KVP_CHAT_QWEN25, tok, m, 1, 1, &ids, &n), KVP_OK);
    j = post_json(&s, "/tokenize", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi \xe6\x97\xa5\xe6\x9c\xac!\"}]}", 200);
    t = cJSON_GetObjectItem(j, "tokens");
    cr_assert_eq(cJSON_GetArraySize(t), n);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(cJSON_GetArrayItem(t, i)->valueint, ids[i], "token %d", i);
    cr_assert_eq(ids[0], im_start);
    cJSON_Delete(j);
    kvp_free(ids);
    /* streamed samples add up to the whole ones */
    free(expect_stream_adds_up(
        &s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1000,\"n\":4,\"seed\":3%s}", 4));
    char b[256];
    /* <|im_end|> made certain by a bias: the reply ends there, with no content */
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,\"logit_bias\":{\"%d\":100}}",
             im_end);
    j = chat(&s, b, 200);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring, "");
    cr_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, 0);
    cJSON_Delete(j);
    kvp_tok_destroy(tok);
    stop(&s);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* min_tokens (vLLM's): a stop string that the greedy story makes at its 3rd word does not end it before
 * min_tokens tokens (without min_tokens it does), and the text runs on past it. */
Test(serve, min_tokens_hold_stop_strings_back)
{
    server s = start("--num-blocks 256");
    cJSON *cut = complete(&s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop\":\" was\"}", 200);
    cJSON *held = complete(&s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop\":\" was\","
                               "\"min_tokens\":20}", 200);
    const char *a = choice_text(cut, 0), *b = choice_text(held, 0);
    cr_assert_lt(strlen(a), 20, "the stop string comes early: %s", a);
    cr_assert_gt(strlen(b), strlen(a) + strlen(" was"), "min_tokens did not hold the stop string back: %s", b);
    cr_assert_eq(strncmp(b, a, strlen(a)), 0);
    cr_assert_eq(strncmp(b + strlen(a), " was", 4), 0, "%s", b);
    const cJSON *u = cJSON_GetObjectItem(held, "usage");
    cr_assert_geq(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 20);
    cJSON_Delete(cut);
    cJSON_Delete(held);
    stop(&s);
}

/* --speculative-config (n-gram speculative decoding) changes no answer: greedy with logprobs, seeded samples
 * cut by stop strings (inside a step's tokens), a chat; whole and streamed, with token ids; the server counts
 * the drafts in /metrics. */
Test(serve, speculation_changes_no_answer)
{
    server plain = start("--num-blocks 256 --chat-template zephyr");
    server spec = start("--num-blocks 256 --chat-template zephyr --speculative-config "
                        "'{\"method\":\"ngram\",\"num_speculative_tokens\":6,\"prompt_lookup_max\":3,\"prompt_lookup_min\":1}'");
    const char *rep = "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a";
    char bodies[3][512];
    snprintf(bodies[0], sizeof bodies[0], "{\"prompt\":\"%s\",\"max_tokens\":60,\"temperature\":0,\"logprobs\":2,"
             "\"return_token_ids\":true%%s}", rep);
    /* greedy, "her ball" is found inside a step's kept drafts: the tokens after it must not stay */
    snprintf(bodies[1], sizeof bodies[1], "{\"prompt\":[\"%s\",\"One day\"],\"max_tokens\":50,\"temperature\":0,"
             "\"stop\":[\"her ball\",\"park\"],\"return_token_ids\":true%%s}", rep);
    snprintf(bodies[2], sizeof bodies[2], "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":40,"
             "\"n\":2,\"seed\":2,\"stop\":\"play\",\"return_token_ids\":true%%s}", rep);
    const int nc[3] = {1, 2, 2};
    int stopped = 0;
    for (int k = 0; k < 3; k++) {
        const char *path = k == 2 ? "/v1/chat/completions" : "/v1/completions";
        char body[600], *resp[2];
        snprintf(body, sizeof body, bodies[k], "");
        cJSON *a = post_json(&plain, path, body, 200), *b = post_json(&spec, path, body, 200);
        cr_assert(cJSON_Compare(cJSON_GetObjectItem(a, "choices"), cJSON_GetObjectItem(b, "choices"), 1),
                  "request %d: the choices differ", k);
        cr_assert(cJSON_Compare(cJSON_GetObjectItem(a, "usage"), cJSON_GetObjectItem(b, "usage"), 1), "request %d", k);
        for (int c = 0; c < nc[k]; c++) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), c);
            stopped += strcmp(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop") == 0;
        }
        /* streamed: the same texts (completions) and token ids */
        snprintf(body, sizeof body, bodies[k], ",\"stream\":true");
        for (int w = 0; w < 2; w++)
            cr_assert_eq(http(w ? &spec : &plain, "POST", path, body, &resp[w]), 200, "%s", resp[w]);
        for (int w = 0; w < 2; w++) {
            cJSON *ids[4], *o;
            char text[4][2048] = {{0}};
            for (int c = 0; c < nc[k]; c++) ids[c] = cJSON_CreateArray();
            for (const char *p = resp[w]; (o = sse_next(&p)) != NULL; cJSON_Delete(o)) {
                const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *x;
                const int c = cJSON_GetObjectItem(ch, "index")->valueint;
                cJSON_ArrayForEach(x, cJSON_GetObjectItem(ch, "token_ids")) cJSON_AddItemToArray(ids[c], cJSON_Duplicate(x, 1));
                const cJSON *t = k == 2 ? cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content")
                                        : cJSON_GetObjectItem(ch, "text");
                if (cJSON_IsString(t)) strncat(text[c], t->valuestring, sizeof text[c] - 1 - strlen(text[c]));
            }
            for (int c = 0; c < nc[k]; c++) {
                const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), c);
                cr_assert(cJSON_Compare(ids[c], cJSON_GetObjectItem(ch, "token_ids"), 1), "request %d choice %d, %s: "
                          "streamed token ids", k, c, w ? "speculating" : "plain");
                const char *want = k == 2 ? cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content")->valuestring
                                          : cJSON_GetObjectItem(ch, "text")->valuestring;
                cr_assert_str_eq(text[c], want, "request %d choice %d, %s: streamed text", k, c, w ? "speculating" : "plain");
                cJSON_Delete(ids[c]);
            }
            free(resp[w]);
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
    cr_assert_gt(stopped, 0, "a stop string should end a choice");
    const double kept = metric(&spec, "kvpage:spec_decode_num_accepted_tokens_total");
    cr_assert_gt(kept, 0);
    cr_assert_gt(metric(&spec, "kvpage:spec_decode_num_draft_tokens_total"), kept);
    cr_assert_gt(metric(&spec, "kvpage:spec_decode_num_drafts_total"), 0);
    cr_assert_eq(metric(&plain, "kvpage:spec_decode_num_draft_tokens_total"), 0);
    stop(&spec);
    stop(&plain);
}

/* Seeded random edits of valid request bodies, on every POST endpoint: each one is answered, 200 with a
 * JSON answer (or an event stream) or 4xx with an error object, never 5xx; the server then still answers
 * a plain request and, under the sanitizer build, exits 0 without a leak. */
Test(serve, random_request_corruption_is_answered_and_the_server_goes_on)
{
    server s = start("--num-blocks 64 --chat-template zephyr");
    static const struct {
        const char *path, *body;
    } base[] = {
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0.8,\"top_k\":20,"
                            "\"top_p\":0.9,\"seed\":7,\"n\":2,\"stop\":[\"park\"],\"logprobs\":2}"},
        {"/v1/completions", "{\"prompt\":[[1,403,407],[1,261]],\"max_tokens\":3,\"echo\":true,"
                            "\"logit_bias\":{\"5\":-100},\"presence_penalty\":0.5,\"min_tokens\":1}"},
        {"/v1/completions", "{\"prompt\":\"Lily\",\"max_tokens\":3,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true},\"return_token_ids\":true}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                 "{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"stop_token_ids\":[2]}"},
        {"/tokenize", "{\"prompt\":\"Once upon a time\",\"add_special_tokens\":true}"},
        {"/detokenize", "{\"tokens\":[1,403,407,261]}"},
    };
    const int nb = (int)(sizeof base / sizeof base[0]);
    uint64_t rng = 0x0ddba11cafef00dull;
    char body[512];
    int ok = 0;
    const int trials = 600;
    for (int i = 0; i < trials; i++) {
        const int k = i % nb;
        const size_t len = strlen(base[k].body);
        memcpy(body, base[k].body, len + 1);
        fz_mutate((unsigned char *)body, 0, len, 0, &rng);
        char *resp;
        const int code = http(&s, "POST", base[k].path, body, &resp);
        cr_assert(code == 200 || code == 400 || code == 404 || code == 405 || code == 413,
                  "trial %d: %s %.*s -> %d: %s", i, base[k].path, (int)len, body, code, resp);
        if (code == 200) ok++;
        if (strncmp(resp, "data:", 5) != 0) { /* an event stream is checked elsewhere */
            cJSON *j;
            cr_assert_eq(kvp_json_parse(resp, strlen(resp), "response", &j), KVP_OK, "trial %d: %s", i, resp);
            if (code != 200)
                cr_assert(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")),
                          "trial %d: %s", i, resp);
            cJSON_Delete(j);
        }
        free(resp);
    }
    cr_assert(ok > 0 && ok < trials, "%d of %d mutants were answered 200", ok, trials);
    cJSON *j = complete(&s, "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0}", 200);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, 5);
    cJSON_Delete(j);
    stop(&s);
}

/* The generated ids of choice 0 of a completion (return_token_ids) into ids; their count. */
static int answer_ids(const server *s, const char *body, int32_t *ids, int cap)
{
    cJSON *j = complete(s, body, 200);
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "token_ids");
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, t) if (n < cap) ids[n++] = x->valueint;
    cJSON_Delete(j);
    return n;
}

/* --generation-config (vLLM's): what a request leaves out comes from the model's generation_config.json
 * (auto, the default: here temperature 0 and max_new_tokens 40, so the published story's first 40 tokens),
 * or from vLLM's defaults (vllm: temperature 1 and 16 tokens, the answer of a request that asks for them
 * with the same seed). A request's own values win either way. */
Test(serve, generation_config_gives_the_default_sampling)
{
    tu_require_shared();
    const char *dir = tu_tmpdir();
    char p[400], extra[1000];
    size_t n;
    unsigned char *b = tu_read_all(S260_HF "/config.json", &n);
    snprintf(p, sizeof p, "%s/config.json", dir);
    tu_write_all(p, b, n);
    free(b);
    b = tu_read_all(S260_HF "/model.safetensors", &n);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    tu_write_all(p, b, n);
    free(b);
    static const char gen[] = "{\"do_sample\": true, \"temperature\": 0.0, \"top_p\": 0.9, \"max_new_tokens\": 40}";
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    tu_write_all(p, gen, strlen(gen));
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *story = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "cases"), 0), "tokens_after_bos");
    int32_t got[64], want[64];
    const char *sampled = "{\"prompt\":[1],\"seed\":3,\"return_token_ids\":true,\"temperature\":1,\"top_p\":1,"
                          "\"max_tokens\":16}";
    for (int vllm = 0; vllm < 2; vllm++) {
        snprintf(extra, sizeof extra, "--model %s --tokenizer %s%s", dir, S260_TOKBIN,
                 vllm ? " --generation-config vllm" : "");
        server s = start(extra);
        int k = answer_ids(&s, "{\"prompt\":[1],\"seed\":3,\"return_token_ids\":true}", got, 64);
        const int nw = answer_ids(&s, sampled, want, 64);
        if (!vllm) {
            cr_assert_eq(k, 40, "max_new_tokens: %d tokens", k);
            for (int i = 0; i < k; i++)
                cr_assert_eq(got[i], cJSON_GetArrayItem(story, i)->valueint, "greedy from the file: token %d", i);
            int differ = 0;
            for (int i = 0; i < nw; i++) differ += want[i] != cJSON_GetArrayItem(story, i)->valueint;
            cr_assert_gt(differ, 0, "an explicit temperature 1 must win over the file's 0");
        } else {
            cr_assert_eq(k, 16);
            cr_assert_eq(nw, 16);
            for (int i = 0; i < k; i++) cr_assert_eq(got[i], want[i], "vLLM's defaults: token %d", i);
        }
        stop(&s);
    }
    cJSON_Delete(gold);
    /* an impossible value in the file: the server does not start, and says where */
    static const char bad[] = "{\"top_p\": 0}";
    tu_write_all(p, bad, strlen(bad));
    char cmd[1200], *out, *err;
    snprintf(cmd, sizeof cmd, "%s serve --model %s --tokenizer %s --port 0", kvp_test_bin(), dir, S260_TOKBIN);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "generation_config.json: \"top_p\": 0 is out of range (0, 1]"), "%s", err);
    free(out);
    free(err);
}

/* A chat request with no max_tokens answers up to the end of the room one sequence has (vLLM's and OpenAI's
 * default): here the 8 x 16 tokens of the KV cache, below the model's context; a completion keeps OpenAI's 16.
 * With --max-model-len lower still, that is the end. */
Test(serve, a_chat_answer_without_max_tokens_runs_to_the_end_of_the_room)
{
    for (int capped = 0; capped < 2; capped++) {
        server s = start(capped ? "--num-blocks 8 --chat-template zephyr --max-model-len 100"
                                : "--num-blocks 8 --chat-template zephyr");
        const int room = capped ? 100 : 128;
        cJSON *ans = chat(&s, "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],\"temperature\":0,"
                              "\"ignore_eos\":true}", 200);
        const cJSON *u = cJSON_GetObjectItem(ans, "usage");
        const int p = cJSON_GetObjectItem(u, "prompt_tokens")->valueint, c = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        cr_assert_eq(p + c, room, "prompt %d + answer %d", p, c);
        cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ans, "choices"), 0), "finish_reason")
                             ->valuestring, "length");
        cJSON_Delete(ans);
        ans = complete(&s, "{\"prompt\":\"Lily\",\"temperature\":0,\"ignore_eos\":true}", 200);
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ans, "usage"), "completion_tokens")->valueint, 16);
        cJSON_Delete(ans);
        /* a min_tokens the room cannot hold */
        ans = chat(&s, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"min_tokens\":200}", 400);
        cJSON_Delete(ans);
        stop(&s);
    }
}
