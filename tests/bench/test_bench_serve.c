/* Tests of `kvpage bench serve` against kvpage serve on stories260K: every request completes with the
 * lengths it asked for (the server's usage), the per-request CSV and the summary agree, prefix-cache hits
 * come back as cached tokens (and none without a cache), chat turns wait for their predecessors' answers,
 * requests too long for the context are skipped, a running server is reached by --url; bad input exits 2. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"

#include "cli_testutil.h"

#define MODEL "--model ../shared/models/stories260K/stories260K.gguf"
/* Each test's .timeout guards against a hang only: a server run takes up to a minute in the sanitizer
 * build, and two tests share the machine's two cores (--jobs 2). */
#define HANG_S 300

enum { MAXREQ = 64, NCOL = 15 };

/* One row of --requests-out. */
typedef struct {
    long long id, after;
    double arrival, send;
    long long prompt_len, prompt_tokens, output_len, output_tokens, cached;
    double ttft, tpot, e2e;
    long long chunks;
    char state[16];
} req_row;

/* Reads the --requests-out CSV at path (header checked) into rows; returns how many. */
static int read_requests(const char *path, req_row *rows)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s was not written", path);
    char line[1024];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "id,after,arrival_s,send_s,prompt_len,prompt_tokens,output_len,output_tokens,cached_tokens,"
                           "ttft_s,tpot_s,e2e_s,chunks,state,error\n");
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cr_assert_lt(n, MAXREQ);
        req_row *r = &rows[n++];
        int got = sscanf(line, "%lld,%lld,%lf,%lf,%lld,%lld,%lld,%lld,%lld,%lf,%lf,%lf,%lld,%15[a-z_]", &r->id, &r->after,
                         &r->arrival, &r->send, &r->prompt_len, &r->prompt_tokens, &r->output_len, &r->output_tokens,
                         &r->cached, &r->ttft, &r->tpot, &r->e2e, &r->chunks, r->state);
        cr_assert_eq(got, NCOL - 1, "row %d: %s", n, line);
    }
    fclose(f);
    return n;
}

/* Runs bench serve with args (plus --json and --requests-out into a temporary file); returns the summary
 * row (caller deletes *doc) and the request rows. */
static const cJSON *run(const char *args, int want_rc, cJSON **doc, req_row *rows, int *nrows)
{
    static char out[1 << 16], err[1 << 16];
    char path[] = "/tmp/kvp_bs_req_XXXXXX", cmd[2048];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    /* the options after -- go to the server: keep --json and the CSV before them */
    const char *dashes = strstr(args, " -- ");
    snprintf(cmd, sizeof cmd, "bench serve " MODEL " --json --requests-out %s %.*s%s", path,
             dashes ? (int)(dashes - args) : (int)strlen(args), args, dashes ? dashes : "");
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, want_rc, "%s: exit %d: %s", cmd, rc, err);
    *doc = cJSON_Parse(out);
    cr_assert_not_null(*doc, "stdout is not JSON: %.300s (stderr %.300s)", out, err);
    const cJSON *rs = kvp_test_rows(*doc);
    cr_assert_eq(cJSON_GetArraySize(rs), 1);
    *nrows = read_requests(path, rows);
    unlink(path);
    return cJSON_GetArrayItem(rs, 0);
}

/* Sums of the completed rows equal the summary's totals; each completed request got the lengths it asked
 * for (ignore_eos) and was timed consistently. */
static void expect_consistent(const cJSON *s, const req_row *rows, int n)
{
    long long in = 0, out = 0, cached = 0, done = 0;
    for (int i = 0; i < n; i++) {
        const req_row *r = &rows[i];
        if (strcmp(r->state, "completed") != 0) continue;
        done++;
        cr_assert_eq(r->prompt_tokens, r->prompt_len, "request %lld: the server saw another prompt", r->id);
        cr_assert_eq(r->output_tokens, r->output_len > 0 ? r->output_len : 1, "request %lld", r->id);
        cr_assert(r->cached >= 0 && r->cached <= r->prompt_len && r->cached % 16 == 0, "request %lld: cached %lld",
                  r->id, r->cached);
        cr_assert(r->ttft > 0 && r->ttft <= r->e2e, "request %lld: ttft %g, e2e %g", r->id, r->ttft, r->e2e);
        cr_assert(r->chunks >= 1 && r->chunks <= r->output_tokens, "request %lld: %lld chunks", r->id, r->chunks);
        cr_assert_geq(r->send + 1e-6, r->arrival, "request %lld sent before its arrival", r->id);
        if (r->output_tokens >= 2)
            cr_assert_float_eq(r->tpot, (r->e2e - r->ttft) / (double)(r->output_tokens - 1), 1e-5);
        in += r->prompt_tokens;
        out += r->output_tokens;
        cached += r->cached;
    }
    cr_assert_eq(kvp_test_num(s, "completed"), done);
    cr_assert_eq(kvp_test_num(s, "input_tokens"), in);
    cr_assert_eq(kvp_test_num(s, "output_tokens"), out);
    cr_assert_eq(kvp_test_num(s, "cached_tokens"), cached);
    cr_assert_float_eq(kvp_test_num(s, "prefix_hit_rate"), in ? (double)cached / in : 0, 1e-9);
    const double dur = kvp_test_num(s, "duration_s");
    cr_assert_gt(dur, 0);
    cr_assert_float_eq(kvp_test_num(s, "output_tok_s"), out / dur, 1e-6 * (out / dur));
    cr_assert_float_eq(kvp_test_num(s, "request_per_s"), done / dur, 1e-6 * (done / dur));
    cr_assert_leq(kvp_test_num(s, "ttft_p50_ms"), kvp_test_num(s, "ttft_p99_ms"));
    cr_assert_leq(kvp_test_num(s, "ttft_p50_ms"), kvp_test_num(s, "e2e_p99_ms"));
}

/* One request at a time: after the first, every prompt finds the 64-token system prompt (4 blocks) cached. */
Test(bench_serve, sequential_requests_hit_the_shared_prefix, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=12,prefix=64,suffix=16,output=6,vocab=512 --rate 400 "
                         "--max-concurrency 1 --goodput ttft:1e-6,e2e:1e9",
                         0, &doc, rows, &n);
    cr_assert_eq(n, 12);
    cr_assert_eq(kvp_test_num(s, "completed"), 12);
    cr_assert_eq(kvp_test_num(s, "failed"), 0);
    cr_assert_eq(kvp_test_num(s, "peak_in_flight"), 1);
    cr_assert_eq(kvp_test_num(s, "goodput_req_s"), 0, "no request answers within a nanosecond");
    expect_consistent(s, rows, n);
    cr_assert_eq(rows[0].cached, 0, "the first request has nothing to find");
    for (int i = 1; i < n; i++) {
        cr_assert_geq(rows[i].cached, 64, "request %d: %lld cached tokens", i, rows[i].cached);
        cr_assert_geq(rows[i].send, rows[i - 1].send + rows[i - 1].e2e, "request %d overlapped its predecessor", i);
    }
    cJSON_Delete(doc);
}

/* Without a prefix cache nothing is found; all at once, requests overlap. */
Test(bench_serve, cache_none_serves_no_hits, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=12,prefix=64,suffix=16,output=6,vocab=512 --rate inf -- --cache none", 0,
                         &doc, rows, &n);
    expect_consistent(s, rows, n);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(s, "server")->valuestring, "kvpage serve --cache none");
    cr_assert_eq(kvp_test_num(s, "cached_tokens"), 0);
    cr_assert_eq(kvp_test_num(s, "goodput_req_s"), kvp_test_num(s, "request_per_s"), "no objectives: every one counts");
    cr_assert_gt(kvp_test_num(s, "peak_in_flight"), 1);
    cJSON_Delete(doc);
}

/* The server's /metrics read during the run: with a KV cache too small for the 16 requests at once, it fills
 * (usage near 1) and preempts; without one, the readings still show the requests running. */
Test(bench_serve, metrics_follow_the_server, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    char mpath[] = "/tmp/kvp_bs_metrics_XXXXXX", args[512];
    int fd = mkstemp(mpath);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(args, sizeof args, "--workload system:n=16,prefix=64,suffix=64,output=300,vocab=512 --rate inf "
                                "--metrics-interval 0.005 --metrics-out %s -- --num-blocks 48 --cache none", mpath);
    const cJSON *s = run(args, 0, &doc, rows, &n);
    expect_consistent(s, rows, n);
    const double samples = kvp_test_num(s, "metrics_samples");
    cr_assert_geq(samples, 3);
    /* A reading every 5 ms need not land on the very step that took the last block (47 of 48 was seen), so
     * "filled" is at least 44 of them; the preemptions say it ran out. */
    cr_assert_geq(kvp_test_num(s, "kv_usage_peak"), 44.0 / 48, "48 blocks for 16 requests of ~400 tokens");
    cr_assert_gt(kvp_test_num(s, "preemptions"), 0);
    cr_assert_geq(kvp_test_num(s, "running_peak"), 2);
    cr_assert_leq(kvp_test_num(s, "running_peak"), 16);
    cr_assert(kvp_test_num(s, "kv_usage_mean") > 0 && kvp_test_num(s, "kv_usage_mean") <= 1);
    FILE *f = fopen(mpath, "r");
    cr_assert_not_null(f);
    char line[256];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "t_s,running,waiting,kv_usage,preemptions\n");
    double prev_t = -1, prev_p = 0, t, run_, wait_, kv, pre;
    int lines = 0;
    while (fscanf(f, "%lf,%lf,%lf,%lf,%lf\n", &t, &run_, &wait_, &kv, &pre) == 5) {
        cr_assert_gt(t, prev_t, "readings in time order");
        cr_assert_geq(pre, prev_p, "preemptions only grow");
        cr_assert(kv >= 0 && kv <= 1 && run_ >= 0 && run_ <= 16);
        prev_t = t, prev_p = pre;
        lines++;
    }
    fclose(f);
    unlink(mpath);
    cr_assert_eq(lines, samples);
    cr_assert_eq(kvp_test_num(s, "spec_acceptance"), 0, "the server does not speculate");
    cr_assert_eq(kvp_test_num(s, "spec_accept_len"), 0);
    cJSON_Delete(doc);
}

/* A speculating server's draft counters, read from /metrics during the run: a share of drafts kept and vLLM's
 * mean acceptance length (1 + kept tokens per step that proposed). */
Test(bench_serve, spec_acceptance_from_the_server, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=8,prefix=64,suffix=16,output=200,vocab=512 --rate inf --metrics-interval 0.002 "
                         "-- --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":4,"
                         "\"prompt_lookup_max\":3,\"prompt_lookup_min\":1}'", 0, &doc, rows, &n);
    expect_consistent(s, rows, n);
    cr_assert_geq(kvp_test_num(s, "metrics_samples"), 3);
    const double acc = kvp_test_num(s, "spec_acceptance"), len = kvp_test_num(s, "spec_accept_len");
    cr_assert(acc > 0 && acc <= 1, "spec_acceptance %g", acc);
    cr_assert(len > 1 && len <= 5, "spec_accept_len %g (1 + at most 4 kept a step)", len);
    cJSON_Delete(doc);
}

/* A chat turn is sent only after the answer of the turn before it (and it finds that turn's prompt cached). */
Test(bench_serve, chat_turns_wait_for_their_answers, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload chat:conversations=4,turns=3,system=32,user=16,assistant=8,vocab=512 --rate inf", 0,
                         &doc, rows, &n);
    cr_assert_eq(n, 12);
    expect_consistent(s, rows, n);
    int waited = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].after < 0) continue;
        const req_row *p = NULL;
        for (int k = 0; k < n; k++)
            if (rows[k].id == rows[i].after) p = &rows[k];
        cr_assert_not_null(p, "request %lld waits for an unknown id %lld", rows[i].id, rows[i].after);
        cr_assert_geq(rows[i].send, p->send + p->e2e, "turn %lld was sent before turn %lld's answer ended", rows[i].id,
                      p->id);
        cr_assert_geq(rows[i].cached, 32, "turn %lld repeats an earlier prompt", rows[i].id);
        waited++;
    }
    cr_assert_eq(waited, 8, "4 conversations of 3 turns: 8 turns wait");
    cJSON_Delete(doc);
}

/* --answers server: each turn after the first is sent with the server's answer to the turn before (same
 * lengths), and finds that turn's prompt and answer cached (the full blocks of its computed tokens: the
 * server caches generated tokens too); with the workload's answers a turn finds at most the turn before's
 * prompt, so fewer tokens in all. The same through /v1/chat/completions. */
Test(bench_serve, server_answers_are_found_cached_by_the_next_turn, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    long long cached[2] = {0, 0};
    for (int mode = 0; mode < 2; mode++) {
        cJSON *doc;
        char args[256];
        snprintf(args, sizeof args, "--workload chat:conversations=4,turns=3,system=64,user=16,assistant=40,vocab=512 "
                                    "--rate 100 --answers %s", mode ? "server" : "workload");
        const cJSON *s = run(args, 0, &doc, rows, &n);
        cr_assert_eq(n, 12);
        expect_consistent(s, rows, n);
        for (int i = 0; i < n; i++) {
            if (rows[i].after < 0) continue;
            const req_row *p = NULL;
            for (int k = 0; k < n; k++)
                if (rows[k].id == rows[i].after) p = &rows[k];
            cr_assert_not_null(p);
            const long long prompt_blocks = p->prompt_len / 16 * 16,
                            all_blocks = (p->prompt_len + p->output_tokens - 1) / 16 * 16;
            if (mode) cr_assert_geq(rows[i].cached, all_blocks, "turn %lld: %lld cached, the turn before computed %lld",
                                    rows[i].id, rows[i].cached, all_blocks);
            else cr_assert_leq(rows[i].cached, prompt_blocks, "turn %lld: the workload's answer was found", rows[i].id);
        }
        cached[mode] = (long long)kvp_test_num(s, "cached_tokens");
        cJSON_Delete(doc);
    }
    cr_assert_gt(cached[1], cached[0] + 8 * 16, "server answers: %lld cached, workload answers: %lld", cached[1], cached[0]);
    /* --endpoint chat: each turn goes as the conversation so far (its answers as assistant messages), which the
     * server renders through its template; zephyr's puts an answer right after the generation prompt, so the
     * answer's tokens are found again (as far as its text tokenizes back to them) */
    static char out[1 << 16], err[1 << 16];
    for (int mode = 0; mode < 2; mode++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "bench serve " MODEL " --workload chat:conversations=4,turns=3,system=64,user=16,"
                                  "assistant=40,vocab=512 --rate 100 --endpoint chat --answers %s --json -- "
                                  "--chat-template zephyr", mode ? "server" : "workload");
        int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
        cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
        if (mode) cr_assert(strstr(err, "8 of 8 chat turns carried") != NULL, "%s", err);
        cJSON *doc = cJSON_Parse(out);
        cr_assert_not_null(doc, "%.300s", out);
        const cJSON *row = cJSON_GetArrayItem(kvp_test_rows(doc), 0);
        cr_assert_eq(kvp_test_num(row, "completed"), 12);
        cached[mode] = (long long)kvp_test_num(row, "cached_tokens");
        cJSON_Delete(doc);
    }
    cr_assert_gt(cached[1], cached[0] + 4 * 16, "chat, server answers: %lld cached, workload answers: %lld", cached[1],
                 cached[0]);
}

/* Prompt + output over the model's 2048 positions: skipped, the others served. */
Test(bench_serve, requests_too_long_are_skipped, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=16,prefix=1900,suffix=200,output=40,vocab=512 --rate inf", 0, &doc, rows, &n);
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        const int too_long = rows[i].prompt_len + (rows[i].output_len > 0 ? rows[i].output_len : 1) > 2048;
        cr_assert_str_eq(rows[i].state, too_long ? "skipped" : "completed", "request %d", i);
        skipped += too_long;
    }
    cr_assert(skipped > 0 && skipped < n, "%d of %d skipped: the case tests nothing", skipped, n);
    cr_assert_eq(kvp_test_num(s, "skipped"), skipped);
    cr_assert_eq(kvp_test_num(s, "requests"), n - skipped);
    expect_consistent(s, rows, n);
    cJSON_Delete(doc);
}

/* --url: a server started here (as a user would), a rate list against it (its prefix cache reset between the
 * runs), then the same server gone. */
Test(bench_serve, url_of_a_running_server, .timeout = HANG_S)
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    const pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* not left running when an assertion ends this test */
        dup2(fd[1], 1);
        close(fd[0]);
        execl(kvp_test_bin(), "kvpage", "serve", "--model", "../shared/models/stories260K/stories260K.gguf", "--port",
              "0", "--json", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[2048] = "";
    size_t len = 0;
    cJSON *j = NULL;
    while (!j && len < sizeof buf - 1) {
        ssize_t got = read(fd[0], buf + len, sizeof buf - 1 - len);
        cr_assert_gt(got, 0, "the server ended before printing its address");
        len += (size_t)got;
        buf[len] = '\0';
        j = cJSON_Parse(buf);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "url");
    cr_assert(cJSON_IsString(u));
    char args[512];
    snprintf(args, sizeof args, "--url %s/ --workload system:n=6,prefix=32,suffix=8,output=4,vocab=512 --rate inf",
             u->valuestring);
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run(args, 0, &doc, rows, &n);
    cr_assert_eq(kvp_test_num(s, "completed"), 6);
    expect_consistent(s, rows, n);
    cJSON_Delete(doc);
    /* a list of rates, one request at a time: the first run finds the 32-token prefix the run above cached
     * (6 x 32 tokens), the second comes after the server's prefix cache was reset (its first request misses) */
    static char out[1 << 16], err[1 << 16];
    snprintf(args, sizeof args, "bench serve " MODEL " --url %s --workload system:n=6,prefix=32,suffix=8,output=4,"
                                "vocab=512 --rate 50,inf --max-concurrency 1 --json", u->valuestring);
    int rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert_not_null(doc = cJSON_Parse(out));
    const cJSON *rs = kvp_test_rows(doc);
    cr_assert_eq(kvp_test_num(cJSON_GetArrayItem(rs, 0), "cached_tokens"), 6 * 32);
    cr_assert_eq(kvp_test_num(cJSON_GetArrayItem(rs, 1), "cached_tokens"), 5 * 32, "the cache was not reset");
    cJSON_Delete(doc);
    kill(pid, SIGTERM);
    int ws;
    waitpid(pid, &ws, 0);
    close(fd[0]);
    /* the same address with nobody listening: an error naming it (the URL is bad input) */
    snprintf(args, sizeof args, "bench serve " MODEL " --url %s --workload system:n=2,vocab=512 --rate inf", u->valuestring);
    rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "/v1/models") != NULL && strstr(err, "connect") != NULL, "%s", err);
    cJSON_Delete(j);
}

/* Requests that fail (here: each allowed a millisecond for 64 tokens after a 1,000-token prompt) are
 * counted, the first one named, and the exit status is 1. */
Test(bench_serve, failed_requests_exit_1, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=3,output=64,vocab=512 --rate inf --timeout 0.001", 1, &doc, rows, &n);
    cr_assert_eq(kvp_test_num(s, "failed"), 3);
    cr_assert_eq(kvp_test_num(s, "completed"), 0);
    for (int i = 0; i < n; i++) cr_assert_str_eq(rows[i].state, "failed");
    cJSON_Delete(doc);
}

/* A list of rates: one run, on a fresh server, and one row each (the second run finds nothing the first one
 * cached). */
Test(bench_serve, rate_sweep_rows, .timeout = HANG_S)
{
    static char out[1 << 16], err[1 << 16];
    int rc = kvp_test_cli("bench serve " MODEL " --workload system:n=6,prefix=64,suffix=8,output=4,vocab=512 "
                          "--rate 50,inf --max-concurrency 1 --json",
                          out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%.300s", out);
    const cJSON *rs = kvp_test_rows(doc);
    cr_assert_eq(cJSON_GetArraySize(rs), 2);
    const cJSON *a = cJSON_GetArrayItem(rs, 0), *b = cJSON_GetArrayItem(rs, 1);
    cr_assert_eq(kvp_test_num(a, "rate"), 50);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(b, "rate")->valuestring, "inf");
    for (int k = 0; k < 2; k++) {
        const cJSON *r = cJSON_GetArrayItem(rs, k);
        cr_assert_eq(kvp_test_num(r, "completed"), 6);
        /* one at a time: the 5 requests after the first find the 64-token prefix, never the first one */
        cr_assert_geq(kvp_test_num(r, "cached_tokens"), 5 * 64, "run %d", k);
        cr_assert_lt(kvp_test_num(r, "cached_tokens"), 6 * 64, "run %d: the first request found a cache warmed", k);
    }
    cJSON_Delete(doc);
    /* the same requests at every rate, all at once too (a synthetic workload draws its lengths itself: Alpaca's,
     * whose short answers keep the sanitizer build quick); --plot draws the curve */
    char png[] = "/tmp/kvp_bs_curve_XXXXXX.png", cmd[256];
    int fd = mkstemps(png, 4);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "bench serve " MODEL " --workload alpaca:n=8 --rate 40,inf --json --plot %s", png);
    rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    FILE *f = fopen(png, "rb");
    unsigned char magic[8] = {0};
    cr_assert_not_null(f);
    cr_assert_eq(fread(magic, 1, 8, f), 8, "%s is shorter than a PNG header", png);
    fclose(f);
    unlink(png);
    cr_assert_eq(memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0, "%s is not a PNG", png);
    cr_assert_not_null(doc = cJSON_Parse(out));
    rs = kvp_test_rows(doc);
    a = cJSON_GetArrayItem(rs, 0), b = cJSON_GetArrayItem(rs, 1);
    cr_assert_eq(kvp_test_num(a, "input_tokens"), kvp_test_num(b, "input_tokens"));
    cr_assert_eq(kvp_test_num(a, "output_tokens"), kvp_test_num(b, "output_tokens"));
    cJSON_Delete(doc);
}

/* --endpoint chat: each prompt decoded to text goes through the server's chat template (llama2's here), so
 * the server counts more prompt tokens than the workload's; the lengths asked for still come back, and after
 * the first request the template's opening and the 64-token system prompt are found cached. Without a
 * template the server refuses every request (exit 1, the reason named). */
Test(bench_serve, chat_endpoint, .timeout = HANG_S)
{
    static req_row rows[MAXREQ];
    int n;
    cJSON *doc;
    const cJSON *s = run("--workload system:n=6,prefix=64,suffix=16,output=8,vocab=512 --rate 200 --max-concurrency 1 "
                         "--endpoint chat -- --chat-template llama2",
                         0, &doc, rows, &n);
    cr_assert_eq(kvp_test_num(s, "completed"), 6);
    for (int i = 0; i < n; i++) {
        cr_assert_gt(rows[i].prompt_tokens, rows[i].prompt_len, "request %d: the template adds tokens", i);
        cr_assert_eq(rows[i].output_tokens, rows[i].output_len > 0 ? rows[i].output_len : 1, "request %d", i);
        cr_assert(rows[i].ttft > 0 && rows[i].ttft <= rows[i].e2e && rows[i].chunks >= 1, "request %d", i);
        if (i > 0) cr_assert_geq(rows[i].cached, 64, "request %d: %lld cached", i, rows[i].cached);
    }
    cJSON_Delete(doc);
    static char out[1 << 14], err[1 << 14];
    int rc = kvp_test_cli("bench serve " MODEL " --workload system:n=2,vocab=512 --rate inf --endpoint chat", out,
                          sizeof out, err, sizeof err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "HTTP 400") != NULL && strstr(err, "--chat-template") != NULL, "%s", err);
}

Test(bench_serve, bad_input_exits_2, .timeout = HANG_S)
{
    static const kvp_cli_case cases[] = {
        {"--rate 0", "--rate"},
        {"--max-concurrency 0", "--max-concurrency"},
        {"--timeout -1", "--timeout"},
        {"--bogus", "bogus"},
        {"--format xml", "--format"},
        {"--trace x.csv", "exactly one of --trace and --workload"},
        {"--url ftp://x", "not an http"},
        {"--url http://127.0.0.1:9 -- --cache none", "options after --"},
        {"--num-requests 2 --workload nope", "unknown workload 'nope'"},
        {"--metrics-interval -1", "--metrics-interval"},
        {"--goodput foo:1", "unknown objective 'foo'"},
        {"--rate 1,2 --requests-out /tmp/x.csv", "take a single --rate"},
        {"--rate 1,,2", "--rate"},
        {"--endpoint embeddings", "unknown endpoint 'embeddings'"},
        {"--goodput ttft:5,ttft:6", "'ttft' given twice"},
        {"--goodput ttft", "not NAME:MS"},
        {"--answers model", "unknown answers 'model'"},
        {"--goodput tpot:-3", "--goodput"},
        {"--metrics-interval 0 --metrics-out /tmp/x.csv", "--metrics-out needs"},
        {"--plot /tmp/x.png", "at least two --rate"},
        {"--rate 1,2 --plot /nonexistent-kvp-dir/x.png", "--plot: cannot write into the folder"},
    };
    kvp_test_cli_rejects("bench serve " MODEL " --workload system:n=2,vocab=512 --rate inf", cases,
                         sizeof cases / sizeof cases[0]);
    static char out[1 << 12], err[1 << 12];
    int rc = kvp_test_cli("bench serve --workload system:n=2 --rate inf", out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "--model") != NULL, "%s", err);
    rc = kvp_test_cli("bench serve --model ../shared/models/nope.gguf --workload system:n=2 --rate inf", out, sizeof out,
                      err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "nope.gguf") != NULL, "%s", err);
    /* found once the server runs (its own lines are on stderr too): options it refuses, a workload whose
     * every request is longer than the model's 2048 positions */
    rc = kvp_test_cli("bench serve " MODEL " --workload system:n=2,vocab=512 --rate inf -- --block-size 0", out,
                      sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "--block-size") != NULL && strstr(err, "refused its options") != NULL, "%s", err);
    rc = kvp_test_cli("bench serve " MODEL " --workload system:n=3,prefix=3000,suffix=10,vocab=512 --rate inf", out,
                      sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "longer than the server's max_model_len 2048") != NULL, "%s", err);
}
