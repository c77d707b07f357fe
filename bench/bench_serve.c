/* bench/bench_serve.c — `kvpage bench serve`: a load generator for an OpenAI-compatible completions server,
 * as vLLM's `vllm bench serve`: the requests of a trace or a synthetic workload (the simulator's, so the
 * same prompts, lengths and arrival times can be replayed by `kvpage simulate`) are sent at their arrival
 * times as streamed completions, and the client measures each one:
 *
 *     TTFT  send -> the first streamed chunk with text      TPOT  (e2e - TTFT) / (output tokens - 1)
 *     ITL   gaps between successive chunks with text        E2E   send -> the stream's end
 *
 * Prompts are the workload's token ids hashed into the model's vocabulary (kvp_workload_fit_vocab, as
 * `simulate --executor cpu` feeds them), sent as token arrays with max_tokens = the request's output length
 * and ignore_eos, so every request generates exactly its length; the server's usage event gives the
 * prompt, output and cached (prefix-cache hit) tokens. A chat turn waits for the previous turn's answer
 * (then its think time), as in the simulator.
 *
 * Without --url the command starts `kvpage serve --model PATH --port 0` itself (the options after `--` go to
 * it), reads its address from its --json line, and stops it at the end. Transfers run on one thread over
 * libcurl's multi interface.
 */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/plot.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/stats.h"
#include "common/timer.h"
#include "runtime/planner/simulate.h"
#include "runtime/text/tokenizer.h"
#include "runtime/workload/workload.h"
#include "runtime/workload/workload_synth.h"

static const char *const k_fields[] = {
    "server",          "workload",       "answers",         "rate",            "max_concurrency", "requests",
    "completed",       "failed",         "skipped",         "duration_s",      "input_tokens",    "output_tokens",
    "cached_tokens",   "prefix_hit_rate",
    "request_per_s",   "goodput_req_s",  "output_tok_s",   "total_tok_s",     "peak_in_flight",  "ttft_mean_ms",    "ttft_p50_ms",
    "ttft_p99_ms",     "tpot_mean_ms",   "tpot_p50_ms",     "tpot_p99_ms",     "itl_mean_ms",     "itl_p50_ms",
    "itl_p99_ms",      "e2e_mean_ms",    "e2e_p50_ms",      "e2e_p99_ms",      "chunks_per_token", "running_mean",
    "running_peak",    "waiting_peak",   "kv_usage_mean",   "kv_usage_peak",   "preemptions",     "spec_acceptance",
    "spec_accept_len", "metrics_samples"};
#define NFIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench serve --model PATH (--trace FILE | --workload SPEC) [options] [-- SERVE-OPTIONS]\n\n"
            "Load generator for an OpenAI-compatible server (vLLM's `vllm bench serve`): the requests of a trace\n"
            "or workload are sent at their arrival times as streamed /v1/completions (token-id prompts, hashed\n"
            "into the model's vocabulary; max_tokens = the output length, ignore_eos), and each is timed: TTFT\n"
            "(send to the first chunk with text), TPOT ((end - TTFT) / (tokens - 1)), ITL (gaps between chunks\n"
            "with text), end to end.\n"
            "Without --url it starts `kvpage serve --model PATH --port 0 SERVE-OPTIONS` and stops it after.\n\n"
            "  --model PATH              the model (GGUF file or HF folder): its tokenizer's vocabulary, and what\n"
            "                            the started server loads\n"
            "  --url URL                 a running server instead (e.g. http://127.0.0.1:8000)\n"
            "  --endpoint completions|chat  completions: token-id prompts to /v1/completions (default); chat:\n"
            "                            each prompt decoded to text, one user message to /v1/chat/completions\n"
            "                            (through the server's chat template, so the served prompt is longer)\n"
            "  --answers workload|server  a chat turn's prompt carries the turn before's answer: the workload's\n"
            "                            (default), or the one the server generated, as a real conversation\n"
            "                            does (completions: its token ids, asked with return_token_ids; chat: the\n"
            "                            turns as user messages and the answers as assistant messages)\n"
            "  --trace FILE              Azure LLM trace CSV (*.csv) or Mooncake JSONL\n"
            "  --workload SPEC           sharegpt | alpaca | system:... | chat:... | fewshot:... | branch:...\n"
            "                            (as for simulate; runtime/workload/workload.h)\n"
            "  --rate R[,R...]           requests/s (> 0, or inf: all at once); traces are rescaled to it. A list\n"
            "                            runs the workload once per rate, each on a fresh server (with --url, the\n"
            "                            server's prefix cache is emptied between them: POST /reset_prefix_cache,\n"
            "                            vLLM's, or /flush_cache, SGLang's), one row each\n"
            "  --num-requests N          keep the first N requests\n"
            "  --duration S              keep the requests arriving in the first S seconds\n"
            "  --max-concurrency N       requests in flight at most (default: no limit); the others wait\n"
            "  --timeout S               seconds a request may take (default 600)\n"
            "  --goodput SLOS            service-level objectives in ms, e.g. ttft:200,tpot:50,e2e:2000 (vLLM's\n"
            "                            --goodput): goodput_req_s counts the completed requests that meet\n"
            "                            every one (without it, every completed request)\n"
            "  --metrics-interval S      read the server's /metrics every S seconds (default 0.1; 0: never):\n"
            "                            running and waiting requests, KV cache usage, preemptions (kvpage's\n"
            "                            or vLLM's gauges), summarized as means and peaks; with speculative\n"
            "                            decoding the share of draft tokens kept (spec_acceptance) and vLLM's\n"
            "                            mean acceptance length (1 + kept / drafts), over the readings\n"
            "  --metrics-out FILE        also those readings as CSV: t_s, running, waiting, kv_usage, preemptions\n"
            "  --plot PNG                with a list of rates: the latency-throughput curve, TTFT, TPOT and E2E\n"
            "                            medians against output tokens/s, in rate order (bench/plot.py,\n"
            "                            python3-matplotlib)\n"
            "  --requests-out FILE       also a CSV row per request: id, the id of the turn it waited for (-1:\n"
            "                            none), arrival, send time, lengths asked and served, cached tokens,\n"
            "                            TTFT, TPOT, end to end, chunks, state (completed, failed, skipped)\n"
            "  --format table|csv|json   (default table)\n"
            "  --json                    same as --format json\n"
            "  --wide                    a table with every column (same as --format wide)\n"
            "  -h, --help                this help\n\n"
            "Requests longer than the server's max_model_len (prompt + output) are skipped and counted.\n"
            "Exit status: 0 when every request sent completed, 1 when some failed, 2 on bad input.\n");
}

/* What the client measured of one request (times in seconds; send_s from the run's start). */
typedef struct {
    double send_s, ttft_s, e2e_s, last_s;
    int64_t prompt_tokens, output_tokens, cached_tokens, chunks;
    int state; /* 0 not sent, 1 in flight, 2 completed, 3 failed, 4 skipped (too long) */
    char err[160];
} rec_t;

/* Bytes received, NUL-terminated. */
typedef struct {
    char *p;
    size_t len, cap;
} text_buf;

/* Appends p[0, n); 0 when it would pass 16 MiB (no answer this client reads is that long) or memory ran out. */
static int text_append(text_buf *b, const char *p, size_t n)
{
    if (b->len + n + 1 > ((size_t)1 << 24) || kvp_grow((void **)&b->p, &b->cap, b->len + n + 1, 1) != KVP_OK) return 0;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 1;
}

/* libcurl's write callback of a whole answer kept in a text_buf (returning less than n ends the transfer). */
static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    return text_append(arg, p, size * nmemb) ? size * nmemb : 0;
}

/* An in-flight transfer. */
typedef struct {
    CURL *h;
    struct curl_slist *hdr;
    char *body;
    text_buf in; /* received bytes not yet parsed (SSE events), or the whole body of an error answer */
    int64_t idx;
    int done, usage;
    struct run *run;
} xfer_t;

typedef struct {
    double t;
    int64_t idx;
} ready_t;

/* One reading of the server's /metrics (kvpage's names, or vLLM's: a gauge's values summed over labels). */
typedef struct {
    double t, running, waiting, kv_usage, preemptions;
    double drafts, draft_tokens, accepted; /* speculative decoding's counters */
} msample;

/* The /metrics poller: one GET in flight at most, every interval seconds of the run. */
typedef struct {
    CURL *h; /* NULL: not polling */
    int busy;
    text_buf page;
    double interval, next_s;
    msample *s;
    size_t n, cap_s;
} mpoll;

/* --answers server: what the server generated for a request, its ids (completions, return_token_ids) or its
 * text (chat), and the prompt it was sent with when that is not the workload's (a completion carrying the
 * server's answer to the turn before). */
typedef struct {
    int32_t *ids, n, *prompt, plen;
    size_t cap;
    text_buf text;
} answer_t;

typedef struct run {
    const kvp_workload *w;
    rec_t *rec;
    double t0;
    double *itl; /* every gap between chunks with text, all requests, in ms */
    size_t n_itl, cap_itl;
    kvp_status st; /* first error that stops the run (out of memory) */
    ready_t *heap; /* requests whose time is known, earliest first */
    int64_t n_heap;
    int64_t *child, *sibling; /* chat turns waiting for request i: child[i], then sibling[...]; -1 ends */
    xfer_t **live;            /* live[i]: request i's transfer while in flight */
    mpoll mp;
    const kvp_tokenizer *chat; /* --endpoint chat: prompts decoded to text with it; NULL: token-id completions */
    answer_t *ans;             /* [n] --answers server: what each request sent and got back; NULL: workload's */
    int64_t spliced;           /* chat turns sent with the server's answer to the turn before */
} run_t;

static double since(const run_t *r) { return kvp_now_s() - r->t0; }

static void heap_push(run_t *r, double t, int64_t idx)
{
    int64_t i = r->n_heap++;
    for (; i > 0 && r->heap[(i - 1) / 2].t > t; i = (i - 1) / 2) r->heap[i] = r->heap[(i - 1) / 2];
    r->heap[i] = (ready_t){t, idx};
}

static ready_t heap_pop(run_t *r)
{
    ready_t top = r->heap[0], last = r->heap[--r->n_heap];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= r->n_heap) break;
        if (c + 1 < r->n_heap && r->heap[c + 1].t < r->heap[c].t) c++;
        if (!(r->heap[c].t < last.t)) break;
        r->heap[i] = r->heap[c];
        i = c;
    }
    if (r->n_heap > 0) r->heap[i] = last;
    return top;
}

/* A completed request's time per output token after the first (0 with fewer than two tokens). */
static double tpot_of(const rec_t *q)
{
    return q->output_tokens >= 2 ? (q->e2e_s - q->ttft_s) / (double)(q->output_tokens - 1) : 0;
}

static void fail(rec_t *q, const char *fmt, const char *detail)
{
    q->state = 3;
    snprintf(q->err, sizeof q->err, fmt, detail);
}

/* *out = v when v is a whole number of tokens (0 .. 2^40). */
static int token_count(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 0x1p40) || v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (int64_t)v->valuedouble;
    return 1;
}

/* One server-sent event's data (a JSON chunk, or [DONE]). */
static void on_event(xfer_t *x, const char *data, size_t n)
{
    run_t *r = x->run;
    rec_t *q = &r->rec[x->idx];
    if (n == 6 && memcmp(data, "[DONE]", 6) == 0) {
        x->done = 1;
        return;
    }
    cJSON *j = cJSON_ParseWithLength(data, n);
    if (!j) return;
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices"), *c;
    int text = 0; /* a chunk counts when it carries text (not the finish reason alone) */
    cJSON_ArrayForEach(c, ch)
    {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta"); /* chat chunks */
        const cJSON *t[3] = {cJSON_GetObjectItemCaseSensitive(c, "text"), cJSON_GetObjectItemCaseSensitive(d, "content"),
                             cJSON_GetObjectItemCaseSensitive(d, "reasoning_content")};
        for (int k = 0; k < 3; k++) text |= cJSON_IsString(t[k]) && t[k]->valuestring[0] != '\0';
        answer_t *a = r->ans ? &r->ans[x->idx] : NULL; /* --answers server: the ids of the text, or a chat's text */
        if (a && r->chat && cJSON_IsString(t[1]) &&
            !text_append(&a->text, t[1]->valuestring, strlen(t[1]->valuestring)) && r->st == KVP_OK)
            r->st = KVP_ERR(KVP_ENOMEM, "out of memory for the answers' text");
        const cJSON *ids = a ? cJSON_GetObjectItemCaseSensitive(c, "token_ids") : NULL, *id;
        cJSON_ArrayForEach(id, ids)
        {
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX) {
                if (q->state == 1) fail(q, "%s", "\"token_ids\" holds something that is not a token id");
            } else if (kvp_grow((void **)&a->ids, &a->cap, (size_t)a->n + 1, sizeof *a->ids) == KVP_OK) {
                a->ids[a->n++] = (int32_t)id->valuedouble;
            } else if (r->st == KVP_OK) {
                r->st = KVP_ERR(KVP_ENOMEM, "out of memory for the answers' token ids");
            }
        }
    }
    if (text) {
        const double now = since(r);
        if (q->chunks == 0) {
            q->ttft_s = now - q->send_s;
        } else if (kvp_grow((void **)&r->itl, &r->cap_itl, r->n_itl + 1, sizeof *r->itl) == KVP_OK) {
            r->itl[r->n_itl++] = (now - q->last_s) * 1e3;
        } else if (r->st == KVP_OK) {
            r->st = KVP_ERR(KVP_ENOMEM, "out of memory for inter-token latencies");
        }
        q->last_s = now;
        q->chunks++;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"),
                    *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens"),
                    *d = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
        const cJSON *cached = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "cached_tokens") : NULL;
        int64_t np, nc, nk = 0;
        if (token_count(pt, &np) && token_count(ct, &nc) && (!cached || token_count(cached, &nk))) {
            q->prompt_tokens = np;
            q->output_tokens = nc;
            q->cached_tokens = nk;
            x->usage = 1;
        } else if (q->state == 1) {
            fail(q, "%s", "the usage event's token counts are not counts");
        }
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e && q->state == 1) {
        const cJSON *msg = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        fail(q, "server error: %s", cJSON_IsString(msg) ? msg->valuestring : "(no message)");
    }
    cJSON_Delete(j);
}

/* libcurl's write callback: buffers the answer and hands each complete event ("data: ...\n\n") on. */
static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    xfer_t *x = arg;
    const size_t n = size * nmemb;
    if (!text_append(&x->in, p, n)) return 0;
    long code = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) return n; /* an error answer: kept whole for the message */
    size_t at = 0;
    for (;;) {
        char *end = strstr(x->in.p + at, "\n\n");
        if (!end) break;
        for (char *line = x->in.p + at; line < end;) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            char *le = nl ? nl : end;
            size_t ll = (size_t)(le - line);
            if (ll > 0 && line[ll - 1] == '\r') ll--;
            if (ll >= 5 && memcmp(line, "data:", 5) == 0) {
                const char *d = line + 5;
                size_t dl = ll - 5;
                if (dl > 0 && *d == ' ') d++, dl--;
                on_event(x, d, dl);
            }
            line = le + 1;
        }
        at = (size_t)(end - x->in.p) + 2;
    }
    memmove(x->in.p, x->in.p + at, x->in.len - at + 1);
    x->in.len -= at;
    return n;
}

static void xfer_free(xfer_t *x)
{
    if (!x) return;
    if (x->h) curl_easy_cleanup(x->h);
    curl_slist_free_all(x->hdr);
    cJSON_free(x->body); /* cJSON_PrintUnformatted's (cJSON's allocator, not kvp_malloc's) */
    kvp_free(x->in.p);
    kvp_free(x);
}

/* 1 when request i's prompt is request p's, then p's answer (output_len tokens), then a new message: a chat
 * turn and the turn before it (returns the new message's offset in *at). */
static int continues(const kvp_workload *w, int64_t i, int64_t p, int32_t *at)
{
    const kvp_request *q = &w->reqs[i], *wp = &w->reqs[p];
    const int32_t fixed = wp->prompt_len + wp->output_len;
    if (q->prompt_len < fixed || memcmp(q->tokens, wp->tokens, (size_t)wp->prompt_len * sizeof *q->tokens) != 0 ||
        (wp->output_tokens &&
         memcmp(q->tokens + wp->prompt_len, wp->output_tokens, (size_t)wp->output_len * sizeof *q->tokens) != 0))
        return 0;
    *at = fixed;
    return 1;
}

/* Appends a message of role with tokens[0, n) decoded (text NULL) or text; 0 when out of memory. */
static int add_message(cJSON *msgs, const char *role, const kvp_tokenizer *tok, const int32_t *tokens, int32_t n,
                       const char *text)
{
    char *dec = NULL;
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(msgs, m) || !cJSON_AddStringToObject(m, "role", role)) return 0;
    if (!text && kvp_tok_decode(tok, -1, tokens, n, &dec) != KVP_OK) return 0;
    const int ok = kvp_json_add_text(m, "content", text ? text : dec) == KVP_OK;
    kvp_free(dec);
    return ok;
}

/* --answers server, --endpoint chat: request i as a conversation, its turns' new messages as user messages and
 * the server's answers to them as assistant messages: 1. 0 (msgs unchanged) when some turn before it did not
 * complete or its prompt is not built from the turn before's (see continues): then i goes as one message.
 * -1: out of memory. */
static int conversation(run_t *r, int64_t i, cJSON *msgs)
{
    int64_t n = 1;
    for (int64_t c = i; r->w->reqs[c].after > 0; c = r->w->reqs[c].after - 1, n++) {
        const int64_t p = r->w->reqs[c].after - 1;
        int32_t at;
        if (r->rec[p].state != 2 || !continues(r->w, c, p, &at)) return 0;
    }
    if (n == 1) return 0;
    int64_t *chain = kvp_malloc((size_t)n * sizeof *chain); /* [0]: the first turn, [n-1]: i */
    if (!chain) return -1;
    for (int64_t k = n - 1, c = i; k >= 0; k--, c = r->w->reqs[c].after - 1) chain[k] = c;
    int ok = 1;
    for (int64_t k = 0; k < n && ok; k++) {
        const kvp_request *q = &r->w->reqs[chain[k]];
        int32_t at = 0;
        if (k > 0) continues(r->w, chain[k], chain[k - 1], &at);
        const char *answer = r->ans[chain[k]].text.p ? r->ans[chain[k]].text.p : "";
        ok = add_message(msgs, "user", r->chat, q->tokens + at, q->prompt_len - at, NULL) &&
             (k == n - 1 || add_message(msgs, "assistant", NULL, NULL, 0, answer));
    }
    kvp_free(chain);
    return ok ? 1 : -1;
}

/* The JSON body of request q (request i of the run): a completion of its token ids, or (--endpoint chat) a
 * chat whose one user message is its prompt decoded to text, or with --answers server its conversation. */
static char *request_body(run_t *r, int64_t i, const kvp_request *q, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (model) cJSON_AddStringToObject(o, "model", model);
    if (r->chat) {
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages");
        const int conv = r->ans ? conversation(r, i, msgs) : 0;
        r->spliced += conv > 0;
        if (conv < 0 || (conv == 0 && !add_message(msgs, "user", r->chat, q->tokens, q->prompt_len, NULL))) {
            cJSON_Delete(o);
            return NULL;
        }
    } else {
        cJSON *p = cJSON_AddArrayToObject(o, "prompt");
        for (int32_t j = 0; p && j < q->prompt_len; j++) cJSON_AddItemToArray(p, cJSON_CreateNumber(q->tokens[j]));
    }
    cJSON_AddNumberToObject(o, "max_tokens", q->output_len > 0 ? q->output_len : 1);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddBoolToObject(o, "ignore_eos", 1);
    if (r->ans && !r->chat) cJSON_AddBoolToObject(o, "return_token_ids", 1);
    cJSON_AddBoolToObject(o, "stream", 1);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "stream_options"), "include_usage", 1);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* The chat turns that waited for request i (ended at now) become ready: at their arrival, or after their
 * think time. */
static void release_turns(run_t *r, int64_t i, double now)
{
    const kvp_request *wq = r->w->reqs;
    for (int64_t c = r->child[i]; c >= 0; c = r->sibling[c])
        if (r->rec[c].state == 0) {
            const double t = now + wq[c].think_s;
            heap_push(r, wq[c].arrival_s > t ? wq[c].arrival_s : t, c);
        }
}

/* --answers server, completions: request i's token ids as sent. A chat turn whose previous turn p completed
 * carries p's prompt as sent and the server's answer to it in place of the workload's, then its own new
 * message (see continues). Any other request, or a turn whose prompt is not built that way, goes as the
 * workload has it. */
static kvp_request as_sent(run_t *r, int64_t i)
{
    kvp_request q = r->w->reqs[i];
    answer_t *a = r->ans;
    const int64_t p = q.after - 1;
    int32_t fixed;
    if (!a || r->chat || p < 0 || r->rec[p].state != 2 || a[p].n == 0 || !continues(r->w, i, p, &fixed)) return q;
    const kvp_request *wp = &r->w->reqs[p];
    const int32_t *pp = a[p].prompt ? a[p].prompt : wp->tokens, plen = a[p].prompt ? a[p].plen : wp->prompt_len;
    const int32_t n = plen + a[p].n + (q.prompt_len - fixed);
    int32_t *t = kvp_malloc((size_t)n * sizeof *t);
    if (!t) return q; /* the workload's prompt, then */
    memcpy(t, pp, (size_t)plen * sizeof *t);
    memcpy(t + plen, a[p].ids, (size_t)a[p].n * sizeof *t);
    memcpy(t + plen + a[p].n, q.tokens + fixed, (size_t)(q.prompt_len - fixed) * sizeof *t);
    a[i].prompt = t;
    a[i].plen = n;
    r->spliced++;
    q.tokens = t;
    q.prompt_len = n;
    return q;
}

static kvp_status launch(run_t *r, CURLM *mh, const char *url, const char *model, double timeout_s, int64_t idx)
{
    xfer_t *x = kvp_calloc(1, sizeof *x);
    if (!x) return KVP_ERR(KVP_ENOMEM, "out of memory for a request");
    x->idx = idx;
    x->run = r;
    x->h = curl_easy_init();
    const kvp_request q0 = as_sent(r, idx);
    x->body = request_body(r, idx, &q0, model);
    x->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    if (!x->h || !x->body || !x->hdr) {
        xfer_free(x);
        return KVP_ERR(KVP_ENOMEM, "out of memory for a request");
    }
    curl_easy_setopt(x->h, CURLOPT_URL, url);
    curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->hdr);
    curl_easy_setopt(x->h, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
    curl_easy_setopt(x->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    rec_t *q = &r->rec[idx];
    q->state = 1;
    q->send_s = since(r);
    if (curl_multi_add_handle(mh, x->h) != CURLM_OK) {
        xfer_free(x);
        fail(q, "%s", "libcurl refused the transfer");
        release_turns(r, idx, q->send_s);
        return KVP_OK;
    }
    r->live[idx] = x;
    return KVP_OK;
}

/* A finished transfer: the request's outcome, and the chat turns that waited for it become ready. */
static void finish(run_t *r, CURLM *mh, CURL *h, CURLcode res)
{
    xfer_t *x = NULL;
    curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&x);
    rec_t *q = &r->rec[x->idx];
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    const double now = since(r);
    if (q->state == 1) {
        if (res != CURLE_OK) {
            fail(q, "%s", curl_easy_strerror(res));
        } else if (code != 200) {
            char detail[120];
            snprintf(detail, sizeof detail, "HTTP %ld: %.100s", code, x->in.p ? x->in.p : "");
            fail(q, "%s", detail);
        } else if (!x->done || !x->usage) {
            fail(q, "%s", "the stream ended without its usage and [DONE]");
        } else {
            q->state = 2;
            q->e2e_s = now - q->send_s;
            if (q->chunks == 0) q->ttft_s = q->e2e_s; /* no text at all: the first token came with the end */
        }
    }
    curl_multi_remove_handle(mh, h);
    r->live[x->idx] = NULL;
    xfer_free(x);
    release_turns(r, q - r->rec, now);
}

/* Reads the gauges bench serve follows from a Prometheus text page into *m (missing ones stay 0); the number
 * of lines it recognised. */
static int parse_metrics(const char *text, msample *m)
{
    static const struct {
        const char *name;
        size_t off;
    } known[] = {
        {"kvpage_sequences_running", offsetof(msample, running)},
        {"kvpage:num_requests_running", offsetof(msample, running)},
        {"kvpage:num_requests_waiting", offsetof(msample, waiting)},
        {"kvpage:kv_cache_usage_perc", offsetof(msample, kv_usage)},
        {"kvpage:num_preemptions_total", offsetof(msample, preemptions)},
        {"kvpage:spec_decode_num_drafts_total", offsetof(msample, drafts)},
        {"kvpage:spec_decode_num_draft_tokens_total", offsetof(msample, draft_tokens)},
        {"kvpage:spec_decode_num_accepted_tokens_total", offsetof(msample, accepted)},
        {"vllm:num_requests_running", offsetof(msample, running)},
        {"kvpage_requests_waiting", offsetof(msample, waiting)},
        {"vllm:num_requests_waiting", offsetof(msample, waiting)},
        {"kvpage_kv_cache_usage_ratio", offsetof(msample, kv_usage)},
        {"vllm:kv_cache_usage_perc", offsetof(msample, kv_usage)},
        {"vllm:gpu_cache_usage_perc", offsetof(msample, kv_usage)},
        {"kvpage_preemptions_total", offsetof(msample, preemptions)},
        {"vllm:num_preemptions_total", offsetof(msample, preemptions)},
        {"kvpage_spec_decode_num_drafts_total", offsetof(msample, drafts)},
        {"vllm:spec_decode_num_drafts_total", offsetof(msample, drafts)},
        {"kvpage_spec_decode_num_draft_tokens_total", offsetof(msample, draft_tokens)},
        {"vllm:spec_decode_num_draft_tokens_total", offsetof(msample, draft_tokens)},
        {"kvpage_spec_decode_num_accepted_tokens_total", offsetof(msample, accepted)},
        {"vllm:spec_decode_num_accepted_tokens_total", offsetof(msample, accepted)},
    };
    int found = 0;
    for (const char *line = text; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        if (*line == '#') continue;
        const size_t nlen = strcspn(line, "{ \n");
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
            if (strlen(known[k].name) != nlen || strncmp(line, known[k].name, nlen) != 0) continue;
            const char *eol = strchr(line, '\n'), *sp = line + nlen;
            if (*sp == '{') sp = strchr(sp, '}'); /* labels */
            if (!sp || (eol && sp > eol)) break;
            char *end;
            const double v = strtod(sp + 1, &end);
            if (end != sp + 1 && (!eol || end <= eol) && isfinite(v)) { /* a value on the name's own line */
                *(double *)((char *)m + known[k].off) += v;
                found++;
            }
            break;
        }
    }
    return found;
}

/* A finished GET /metrics: its reading is kept when the page had any of the gauges. */
static void metrics_done(run_t *r, CURLcode res)
{
    mpoll *mp = &r->mp;
    long code = 0;
    curl_easy_getinfo(mp->h, CURLINFO_RESPONSE_CODE, &code);
    msample m = {.t = since(r)};
    if (res == CURLE_OK && code == 200 && mp->page.p && parse_metrics(mp->page.p, &m) > 0 &&
        kvp_grow((void **)&mp->s, &mp->cap_s, mp->n + 1, sizeof *mp->s) == KVP_OK)
        mp->s[mp->n++] = m;
    mp->page.len = 0;
    mp->busy = 0;
}

static kvp_status metrics_start(mpoll *mp, const char *base, double interval)
{
    if (!(interval > 0)) return KVP_OK;
    char url[1100];
    snprintf(url, sizeof url, "%s/metrics", base);
    if (!(mp->h = curl_easy_init())) return KVP_ERR(KVP_ENOMEM, "libcurl: cannot create a handle");
    curl_easy_setopt(mp->h, CURLOPT_URL, url);
    curl_easy_setopt(mp->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(mp->h, CURLOPT_WRITEDATA, (void *)&mp->page);
    curl_easy_setopt(mp->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(mp->h, CURLOPT_TIMEOUT, 10L);
    mp->interval = interval;
    return KVP_OK;
}

static void metrics_free(mpoll *mp)
{
    if (mp->h) curl_easy_cleanup(mp->h);
    kvp_free(mp->page.p);
    kvp_free(mp->s);
    *mp = (mpoll){0};
}

/* Sends every request of w that is not skipped, at its time, at most max_conc at once. */
static kvp_status run_load(run_t *r, const char *url, const char *model, int64_t max_conc, double timeout_s,
                           int64_t *peak)
{
    const kvp_workload *w = r->w;
    CURLM *mh = curl_multi_init();
    if (!mh) return KVP_ERR(KVP_ENOMEM, "libcurl: cannot create a multi handle");
    for (int64_t i = 0; i < w->n; i++) {
        const int64_t dep = w->reqs[i].after - 1;
        if (r->rec[i].state != 0) continue;
        if (dep >= 0 && dep < i && r->rec[dep].state != 4) { /* a turn waits for its predecessor */
            r->sibling[i] = r->child[dep];
            r->child[dep] = i;
        } else {
            heap_push(r, w->reqs[i].arrival_s, i);
        }
    }
    int64_t left = 0, in_flight = 0;
    for (int64_t i = 0; i < w->n; i++) left += r->rec[i].state == 0;
    r->t0 = kvp_now_s();
    kvp_status st = KVP_OK;
    mpoll *mp = &r->mp;
    while (left > 0 && st == KVP_OK && r->st == KVP_OK) {
        if (mp->h && !mp->busy && since(r) >= mp->next_s && curl_multi_add_handle(mh, mp->h) == CURLM_OK) {
            mp->busy = 1;
            mp->next_s += mp->interval;
        }
        while (r->n_heap > 0 && r->heap[0].t <= since(r) && (max_conc <= 0 || in_flight < max_conc)) {
            const ready_t q = heap_pop(r);
            if ((st = launch(r, mh, url, model, timeout_s, q.idx)) != KVP_OK) break;
            if (r->rec[q.idx].state == 1) in_flight++;
            else left--; /* refused at once */
            if (in_flight > *peak) *peak = in_flight;
        }
        int running = 0;
        curl_multi_perform(mh, &running);
        CURLMsg *msg;
        int nq;
        while ((msg = curl_multi_info_read(mh, &nq)) != NULL)
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == mp->h) {
                const CURLcode res = msg->data.result;
                curl_multi_remove_handle(mh, mp->h);
                metrics_done(r, res);
            } else if (msg->msg == CURLMSG_DONE) {
                finish(r, mh, msg->easy_handle, msg->data.result);
                in_flight--;
                left--;
            }
        if (left == 0 || st != KVP_OK) break;
        double wait = 0.25;
        if (r->n_heap > 0 && (max_conc <= 0 || in_flight < max_conc)) wait = r->heap[0].t - since(r);
        if (mp->h && !mp->busy && mp->next_s - since(r) < wait) wait = mp->next_s - since(r);
        if (wait > 0.25) wait = 0.25;
        if (wait > 0) curl_multi_poll(mh, NULL, 0, (int)ceil(wait * 1000), NULL);
        if (r->n_heap == 0 && in_flight == 0 && left > 0) /* waiting on nothing: cannot happen; do not spin */
            st = KVP_ERR(KVP_EINVAL, "%lld requests wait on a turn that never ran", (long long)left);
    }
    if (mp->busy) curl_multi_remove_handle(mh, mp->h);
    mp->busy = 0;
    if (mp->h && st == KVP_OK) { /* a last reading, after every answer */
        metrics_done(r, curl_easy_perform(mp->h));
    }
    for (int64_t i = 0; i < w->n; i++) /* still in flight after an error: cancelled */
        if (r->live[i]) {
            fail(&r->rec[i], "%s", "cancelled");
            curl_multi_remove_handle(mh, r->live[i]->h);
            xfer_free(r->live[i]);
            r->live[i] = NULL;
        }
    curl_multi_cleanup(mh);
    return st != KVP_OK ? st : r->st;
}

/* ---------------------------------------------------------------- the server */

typedef struct {
    pid_t pid; /* 0: none started */
    int out;   /* its stdout, kept open (a closed pipe would kill it on a later write) */
} server_t;

/* Starts `kvpage serve --model model --port 0 --json extra...` (this program) and reads its address into
 * url from the JSON object it prints once it listens. Its stderr is ours. */
static kvp_status start_server(const char *model, char **extra, int nextra, server_t *sv, char *url, size_t cap)
{
    char **av = kvp_calloc((size_t)nextra + 8, sizeof *av);
    int fd[2];
    if (!av) return KVP_ERR(KVP_ENOMEM, "out of memory");
    if (pipe(fd) != 0) {
        kvp_free(av);
        return KVP_ERR(KVP_EIO, "cannot make a pipe for the server: %s", strerror(errno));
    }
    const char *fixed[] = {"kvpage", "serve", "--model", model, "--port", "0", "--json"};
    for (int i = 0; i < 7; i++) av[i] = (char *)fixed[i];
    for (int i = 0; i < nextra; i++) av[7 + i] = extra[i];
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* it goes when this process does, however that ends */
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execv("/proc/self/exe", av);
        _exit(127);
    }
    kvp_free(av);
    close(fd[1]);
    if (pid < 0) {
        close(fd[0]);
        return KVP_ERR(KVP_EIO, "cannot start kvpage serve: %s", strerror(errno));
    }
    *sv = (server_t){.pid = pid, .out = fd[0]};
    char buf[4096];
    size_t len = 0;
    const double deadline = kvp_now_s() + 600;
    for (;;) {
        struct pollfd pf = {.fd = fd[0], .events = POLLIN};
        if (poll(&pf, 1, 1000) > 0) {
            const ssize_t n = read(fd[0], buf + len, sizeof buf - 1 - len);
            if (n <= 0 || len + (size_t)n >= sizeof buf - 1) break;
            len += (size_t)n;
            buf[len] = '\0';
            cJSON *j = cJSON_Parse(buf);
            const cJSON *u = j ? cJSON_GetObjectItemCaseSensitive(j, "url") : NULL;
            if (cJSON_IsString(u)) {
                snprintf(url, cap, "%s", u->valuestring);
                cJSON_Delete(j);
                return KVP_OK;
            }
            cJSON_Delete(j);
        }
        if (kvp_now_s() > deadline) {
            kill(pid, SIGKILL);
            break;
        }
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    close(fd[0]);
    sv->pid = 0;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == KVP_EXIT_USAGE) /* its own error is on stderr already */
        return KVP_ERR(KVP_EINVAL, "kvpage serve refused its options (exit 2; its error is above)");
    return KVP_ERR(KVP_EIO, "kvpage serve did not start listening (%s %d)", WIFEXITED(ws) ? "exit" : "signal",
                   WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? WTERMSIG(ws) : -1);
}

/* SIGTERM (serve answers 503 to what is left and exits), SIGKILL after 30 s. */
static void stop_server(server_t *sv)
{
    if (sv->pid <= 0) return;
    kill(sv->pid, SIGTERM);
    int ws;
    for (int i = 0; i < 3000 && waitpid(sv->pid, &ws, WNOHANG) == 0; i++) usleep(10000);
    if (waitpid(sv->pid, &ws, WNOHANG) == 0) {
        kill(sv->pid, SIGKILL);
        waitpid(sv->pid, &ws, 0);
    }
    close(sv->out);
    sv->pid = 0;
}

/* GET base/v1/models: the first model's id (into id) and max_model_len (0 when the server does not say, or says
 * something that is not a length). */
/* One blocking request to url: a GET, or a POST of post; the answer into body (the caller frees body->p), its
 * status into *code (0 without an answer). */
static CURLcode fetch(const char *url, const char *post, long timeout_s, text_buf *body, long *code)
{
    *code = 0;
    CURL *h = curl_easy_init();
    if (!h) return CURLE_FAILED_INIT;
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (post) curl_easy_setopt(h, CURLOPT_POSTFIELDS, post);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
    const CURLcode res = curl_easy_perform(h);
    if (res == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, code);
    curl_easy_cleanup(h);
    return res;
}

static kvp_status server_model(const char *base, char *id, size_t cap, int64_t *max_len)
{
    char url[1100];
    text_buf body = {0};
    snprintf(url, sizeof url, "%s/v1/models", base);
    long code;
    const CURLcode res = fetch(url, NULL, 30, &body, &code);
    cJSON *j = res == CURLE_OK && code == 200 && body.p ? cJSON_Parse(body.p) : NULL;
    const cJSON *d = j ? cJSON_GetObjectItemCaseSensitive(j, "data") : NULL, *m0 = cJSON_GetArrayItem(d, 0);
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(m0, "id"), *ml = cJSON_GetObjectItemCaseSensitive(m0, "max_model_len");
    kvp_status st = KVP_OK;
    if (res != CURLE_OK) st = KVP_ERR(KVP_EIO, "GET %s: %s", url, curl_easy_strerror(res));
    else if (code != 200) st = KVP_ERR(KVP_EIO, "GET %s: HTTP %ld", url, code);
    else if (!cJSON_IsString(mid)) st = KVP_ERR(KVP_EIO, "GET %s: no model in the answer (%.80s)", url, body.p ? body.p : "");
    if (st == KVP_OK) {
        snprintf(id, cap, "%s", mid->valuestring);
        *max_len = cJSON_IsNumber(ml) && ml->valuedouble >= 2 && ml->valuedouble <= INT32_MAX ? (int64_t)ml->valuedouble : 0;
    }
    cJSON_Delete(j);
    kvp_free(body.p);
    return st;
}

/* POST base/reset_prefix_cache (vLLM's; kvpage serve's), else base/flush_cache (SGLang's): 1 when either
 * answered 200. */
static int reset_server_cache(const char *base)
{
    static const char *const paths[] = {"/reset_prefix_cache", "/flush_cache"};
    for (int k = 0; k < 2; k++) {
        char url[1100];
        text_buf body = {0};
        snprintf(url, sizeof url, "%s%s", base, paths[k]);
        long code;
        fetch(url, "", 60, &body, &code);
        kvp_free(body.p);
        if (code == 200) return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the command */

static const char *const k_states[] = {"unsent", "in_flight", "completed", "failed", "skipped"};

static kvp_status write_requests(const char *path, const kvp_workload *w, const rec_t *rec, const answer_t *ans)
{
    FILE *f = fopen(path, "w");
    if (!f) return KVP_ERR(KVP_EIO, "--requests-out: cannot write '%s': %s", path, strerror(errno));
    fprintf(f, "id,after,arrival_s,send_s,prompt_len,prompt_tokens,output_len,output_tokens,cached_tokens,ttft_s,"
               "tpot_s,e2e_s,chunks,state,error\n");
    for (int64_t i = 0; i < w->n; i++) {
        const rec_t *q = &rec[i];
        const kvp_request *r = &w->reqs[i];
        const int ok = q->state == 2;
        const double tpot = ok ? tpot_of(q) : 0;
        char err[sizeof q->err];
        snprintf(err, sizeof err, "%s", q->err);
        for (char *c = err; *c; c++)
            if (*c == ',' || *c == '"' || *c == '\n' || *c == '\r') *c = ' ';
        const long long after = r->after > 0 ? (long long)w->reqs[r->after - 1].id : -1;
        fprintf(f, "%lld,%lld,%.6f,%.6f,%d,%lld,%d,%lld,%lld,%.6f,%.6f,%.6f,%lld,%s,%s\n", (long long)r->id, after,
                r->arrival_s,
                q->state >= 1 && q->state <= 3 ? q->send_s : 0.0, ans && ans[i].prompt ? ans[i].plen : r->prompt_len,
                (long long)q->prompt_tokens,
                r->output_len, (long long)q->output_tokens, (long long)q->cached_tokens, ok ? q->ttft_s : 0.0, tpot,
                ok ? q->e2e_s : 0.0, (long long)q->chunks, k_states[q->state], err);
    }
    if (fclose(f) != 0) return KVP_ERR(KVP_EIO, "--requests-out: cannot write '%s': %s", path, strerror(errno));
    return KVP_OK;
}

static kvp_status write_metrics(const char *path, const mpoll *mp)
{
    FILE *f = fopen(path, "w");
    if (!f) return KVP_ERR(KVP_EIO, "--metrics-out: cannot write '%s': %s", path, strerror(errno));
    fprintf(f, "t_s,running,waiting,kv_usage,preemptions\n");
    for (size_t i = 0; i < mp->n; i++)
        fprintf(f, "%.6f,%g,%g,%.6f,%g\n", mp->s[i].t, mp->s[i].running, mp->s[i].waiting, mp->s[i].kv_usage,
                mp->s[i].preemptions);
    if (fclose(f) != 0) return KVP_ERR(KVP_EIO, "--metrics-out: cannot write '%s': %s", path, strerror(errno));
    return KVP_OK;
}

/* Service-level objectives in seconds (0: none). */
typedef struct {
    double ttft, tpot, e2e;
} slo_t;

/* "ttft:MS,tpot:MS,e2e:MS", any subset, each once, each > 0. */
static kvp_status parse_slos(const char *arg, slo_t *slo)
{
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", arg) >= (int)sizeof buf) return KVP_ERR(KVP_EINVAL, "too long");
    *slo = (slo_t){0};
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        if (!colon) return KVP_ERR(KVP_EINVAL, "'%s' is not NAME:MS", item);
        *colon = '\0';
        double *v = strcmp(item, "ttft") == 0 ? &slo->ttft : strcmp(item, "tpot") == 0 ? &slo->tpot
                                                         : strcmp(item, "e2e") == 0  ? &slo->e2e
                                                                                     : NULL;
        if (!v) return KVP_ERR(KVP_EINVAL, "unknown objective '%s' (ttft, tpot or e2e)", item);
        if (*v > 0) return KVP_ERR(KVP_EINVAL, "'%s' given twice", item);
        double ms;
        KVP_TRY(kvp_parse_f64(colon + 1, 1e-9, 1e12, &ms));
        *v = ms / 1e3;
    }
    return KVP_OK;
}

static int meets(const rec_t *q, const slo_t *slo)
{
    const double tpot = tpot_of(q);
    return (!slo->ttft || q->ttft_s <= slo->ttft) && (!slo->tpot || tpot <= slo->tpot) && (!slo->e2e || q->e2e_s <= slo->e2e);
}

/* The run's row: counts, throughputs and latency statistics of the completed requests (ITL: every gap
 * between streamed chunks). */
static kvp_status summarize(const run_t *r, const char *server, const slo_t *slo, double wall, double rate,
                            int64_t max_conc, int64_t peak, cJSON *row)
{
    const kvp_workload *w = r->w;
    const int64_t n = w->n;
    double *ttft = kvp_malloc((size_t)(n + 1) * sizeof(double)), *tpot = kvp_malloc((size_t)(n + 1) * sizeof(double)),
           *e2e = kvp_malloc((size_t)(n + 1) * sizeof(double));
    if (!ttft || !tpot || !e2e) {
        kvp_free(ttft), kvp_free(tpot), kvp_free(e2e);
        return KVP_ERR(KVP_ENOMEM, "out of memory for the latency statistics");
    }
    int64_t count[5] = {0}, nt = 0, np = 0, in = 0, out = 0, cached = 0, chunks = 0, good = 0;
    for (int64_t i = 0; i < n; i++) {
        const rec_t *q = &r->rec[i];
        count[q->state]++;
        if (q->state != 2) continue;
        ttft[nt] = q->ttft_s * 1e3;
        e2e[nt++] = q->e2e_s * 1e3;
        if (q->output_tokens >= 2) tpot[np++] = tpot_of(q) * 1e3;
        in += q->prompt_tokens;
        out += q->output_tokens;
        cached += q->cached_tokens;
        chunks += q->chunks;
        good += meets(q, slo);
    }
    kvp_sort_doubles(ttft, nt);
    kvp_sort_doubles(tpot, np);
    kvp_sort_doubles(e2e, nt);
    kvp_sort_doubles(r->itl, (int64_t)r->n_itl);
    cJSON_AddStringToObject(row, "server", server);
    cJSON_AddStringToObject(row, "workload", w->name);
    cJSON_AddStringToObject(row, "answers", r->ans ? "server" : "workload");
    if (isinf(rate)) cJSON_AddStringToObject(row, "rate", "inf");
    else if (rate > 0) cJSON_AddNumberToObject(row, "rate", rate);
    else cJSON_AddStringToObject(row, "rate", "trace");
    cJSON_AddNumberToObject(row, "max_concurrency", (double)max_conc);
    cJSON_AddNumberToObject(row, "requests", (double)(n - count[4]));
    cJSON_AddNumberToObject(row, "completed", (double)count[2]);
    cJSON_AddNumberToObject(row, "failed", (double)count[3]);
    cJSON_AddNumberToObject(row, "skipped", (double)count[4]);
    cJSON_AddNumberToObject(row, "duration_s", wall);
    cJSON_AddNumberToObject(row, "input_tokens", (double)in);
    cJSON_AddNumberToObject(row, "output_tokens", (double)out);
    cJSON_AddNumberToObject(row, "cached_tokens", (double)cached);
    cJSON_AddNumberToObject(row, "prefix_hit_rate", in > 0 ? (double)cached / (double)in : 0);
    cJSON_AddNumberToObject(row, "request_per_s", wall > 0 ? (double)count[2] / wall : 0);
    cJSON_AddNumberToObject(row, "goodput_req_s", wall > 0 ? (double)good / wall : 0);
    cJSON_AddNumberToObject(row, "output_tok_s", wall > 0 ? (double)out / wall : 0);
    cJSON_AddNumberToObject(row, "total_tok_s", wall > 0 ? (double)(in + out) / wall : 0);
    cJSON_AddNumberToObject(row, "peak_in_flight", (double)peak);
    const struct {
        const char *name;
        const double *v;
        int64_t n;
    } sets[] = {{"ttft", ttft, nt}, {"tpot", tpot, np}, {"itl", r->itl, (int64_t)r->n_itl}, {"e2e", e2e, nt}};
    for (int k = 0; k < 4; k++) {
        char key[32];
        const double *v = sets[k].v;
        snprintf(key, sizeof key, "%s_mean_ms", sets[k].name);
        cJSON_AddNumberToObject(row, key, kvp_mean(v, sets[k].n));
        snprintf(key, sizeof key, "%s_p50_ms", sets[k].name);
        cJSON_AddNumberToObject(row, key, kvp_percentile(v, sets[k].n, 50));
        snprintf(key, sizeof key, "%s_p99_ms", sets[k].name);
        cJSON_AddNumberToObject(row, key, kvp_percentile(v, sets[k].n, 99));
    }
    cJSON_AddNumberToObject(row, "chunks_per_token", out > 0 ? (double)chunks / (double)out : 0);
    /* the server's gauges over the readings (means: every reading counts the same, they are evenly spaced) */
    const mpoll *mp = &r->mp;
    double run_sum = 0, run_peak = 0, wait_peak = 0, kv_sum = 0, kv_peak = 0;
    for (size_t i = 0; i < mp->n; i++) {
        const msample *m = &mp->s[i];
        run_sum += m->running;
        kv_sum += m->kv_usage;
        run_peak = m->running > run_peak ? m->running : run_peak;
        wait_peak = m->waiting > wait_peak ? m->waiting : wait_peak;
        kv_peak = m->kv_usage > kv_peak ? m->kv_usage : kv_peak;
    }
    cJSON_AddNumberToObject(row, "running_mean", mp->n ? run_sum / (double)mp->n : 0);
    cJSON_AddNumberToObject(row, "running_peak", run_peak);
    cJSON_AddNumberToObject(row, "waiting_peak", wait_peak);
    cJSON_AddNumberToObject(row, "kv_usage_mean", mp->n ? kv_sum / (double)mp->n : 0);
    cJSON_AddNumberToObject(row, "kv_usage_peak", kv_peak);
    const msample *m0 = mp->n ? &mp->s[0] : NULL, *m1 = mp->n ? &mp->s[mp->n - 1] : NULL; /* counters: last - first */
    cJSON_AddNumberToObject(row, "preemptions", mp->n ? m1->preemptions - m0->preemptions : 0);
    const double drafts = mp->n ? m1->drafts - m0->drafts : 0, dtok = mp->n ? m1->draft_tokens - m0->draft_tokens : 0,
                 kept = mp->n ? m1->accepted - m0->accepted : 0;
    cJSON_AddNumberToObject(row, "spec_acceptance", dtok > 0 ? kept / dtok : 0);
    cJSON_AddNumberToObject(row, "spec_accept_len", drafts > 0 ? 1 + kept / drafts : 0);
    cJSON_AddNumberToObject(row, "metrics_samples", (double)mp->n);
    kvp_free(ttft), kvp_free(tpot), kvp_free(e2e);
    return KVP_OK;
}

/* Table format: one field a line (a run is one row of many fields), as vLLM's summary. */
static void print_vertical(const cJSON *row)
{
    for (int i = 0; i < NFIELDS; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, k_fields[i]);
        if (cJSON_IsString(v)) printf("%-18s %s\n", k_fields[i], v->valuestring);
        else if (cJSON_IsNumber(v)) printf("%-18s %.6g\n", k_fields[i], v->valuedouble);
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(row, "machine"), *c = cJSON_GetObjectItemCaseSensitive(row, "commit");
    printf("# machine: %s; commit: %s\n", cJSON_IsString(m) ? m->valuestring : "?", cJSON_IsString(c) ? c->valuestring : "?");
}

/* The options of one `bench serve` command. */
typedef struct {
    const char *model, *url, *trace, *spec, *req_out, *m_out;
    double duration, timeout_s, m_interval;
    int64_t num_req, max_conc;
    slo_t slo;
    char **extra; /* the started server's options (after --) */
    int nextra;
    int64_t vocab;
    const kvp_tokenizer *chat; /* --endpoint chat: the model's tokenizer (prompts sent as text); else NULL */
    int server_answers;        /* --answers server */
    char server[1024]; /* the URL given, or the options of the server started */
} bs_opts;

/* The workload at rate (0: the trace's times), prompt + output drawn within max_total where the generator
 * draws lengths. The same requests at every rate: an infinite rate takes the workload drawn at 1 req/s with
 * every arrival put at 0 (a ShareGPT/Alpaca one drawn at an infinite rate would have other lengths). */
static kvp_status load_workload(const bs_opts *o, double rate, int32_t max_total, kvp_workload **w)
{
    const int all_at_once = isinf(rate);
    KVP_TRY(kvp_sim_load_workload(o->trace, o->spec, o->num_req, all_at_once ? 0 : o->duration, all_at_once ? 1.0 : rate,
                                  max_total, 1, w));
    if (!all_at_once) return KVP_OK;
    kvp_status st = kvp_workload_set_rate(*w, INFINITY);
    if (st != KVP_OK) {
        kvp_workload_destroy(*w);
        *w = NULL;
    }
    return st;
}

/* One run at rate (0: the trace's times): a fresh server unless --url (then, with reset, its prefix cache is
 * emptied first), the workload at that rate, its row in rep. *failed: requests that failed (the first is named
 * on stderr). */
static kvp_status one_rate(const bs_opts *o, double rate, int reset, kvp_report *rep, int64_t *failed)
{
    server_t sv = {0};
    char base[1024] = "", mid[256] = "", compl[1100];
    int64_t max_len = 0, peak = 0;
    double wall = 0;
    kvp_workload *w = NULL;
    run_t r = {0};
    kvp_status st = KVP_OK;
    if (o->url) snprintf(base, sizeof base, "%s", o->url);
    else st = start_server(o->model, o->extra, o->nextra, &sv, base, sizeof base);
    for (size_t n = strlen(base); st == KVP_OK && n > 0 && base[n - 1] == '/'; n--) base[n - 1] = '\0';
    if (st == KVP_OK) st = server_model(base, mid, sizeof mid, &max_len);
    if (st == KVP_OK && o->url && reset && !reset_server_cache(base))
        fprintf(stderr, "kvpage bench serve: warning: %s has no /reset_prefix_cache or /flush_cache: this run finds "
                        "what the run before cached\n", base);
    snprintf(compl, sizeof compl, "%s/v1/%s", base, o->chat ? "chat/completions" : "completions");
    if (st == KVP_OK) /* lengths drawn within the server's context (as simulate draws them in the model's) */
        st = load_workload(o, rate, max_len > 0 ? (int32_t)max_len : 32768, &w);
    if (st == KVP_OK) {
        kvp_workload_fit_vocab(w, o->vocab);
        r.w = w;
        r.chat = o->chat;
        r.rec = kvp_calloc((size_t)w->n + 1, sizeof *r.rec);
        r.heap = kvp_calloc((size_t)w->n + 1, sizeof *r.heap);
        r.child = kvp_malloc(((size_t)w->n + 1) * sizeof *r.child);
        r.sibling = kvp_malloc(((size_t)w->n + 1) * sizeof *r.sibling);
        r.live = kvp_calloc((size_t)w->n + 1, sizeof *r.live);
        r.ans = o->server_answers ? kvp_calloc((size_t)w->n + 1, sizeof *r.ans) : NULL;
        if (!r.rec || !r.heap || !r.child || !r.sibling || !r.live || (o->server_answers && !r.ans))
            st = KVP_ERR(KVP_ENOMEM, "out of memory for %lld requests", (long long)w->n);
    }
    if (st == KVP_OK) {
        int64_t sendable = 0;
        for (int64_t i = 0; i < w->n; i++) {
            const kvp_request *q = &w->reqs[i];
            r.child[i] = r.sibling[i] = -1;
            if (max_len > 0 && (int64_t)q->prompt_len + (q->output_len > 0 ? q->output_len : 1) > max_len) {
                r.rec[i].state = 4;
                snprintf(r.rec[i].err, sizeof r.rec[i].err, "prompt + output > max_model_len %lld", (long long)max_len);
            }
            sendable += r.rec[i].state == 0;
        }
        if (sendable == 0)
            st = KVP_ERR(KVP_EINVAL, "every request of the workload is longer than the server's max_model_len %lld",
                         (long long)max_len);
    }
    if (st == KVP_OK) {
        fprintf(stderr, "kvpage bench serve: %lld requests of %s to %s (model %s, vocabulary %lld)\n",
                (long long)w->n, w->name, compl, mid, (long long)o->vocab);
        const double t = kvp_now_s();
        st = metrics_start(&r.mp, base, o->m_interval);
        if (st == KVP_OK) st = run_load(&r, compl, mid, o->max_conc, o->timeout_s, &peak);
        wall = kvp_now_s() - t;
    }
    stop_server(&sv);
    cJSON *row = NULL;
    if (st == KVP_OK && o->req_out) st = write_requests(o->req_out, w, r.rec, r.ans);
    if (st == KVP_OK && r.ans) {
        int64_t turns = 0;
        for (int64_t i = 0; i < w->n; i++) turns += w->reqs[i].after > 0;
        fprintf(stderr, "kvpage bench serve: %lld of %lld chat turns carried the server's answer to the turn before\n",
                (long long)r.spliced, (long long)turns);
    }
    if (st == KVP_OK && o->m_out) st = write_metrics(o->m_out, &r.mp);
    if (st == KVP_OK) st = kvp_report_row(rep, &row);
    if (st == KVP_OK) st = summarize(&r, o->server, &o->slo, wall, rate, o->max_conc, peak, row);
    *failed = 0;
    for (int64_t i = 0; st == KVP_OK && i < w->n; i++)
        if (r.rec[i].state == 3 && (*failed)++ == 0)
            fprintf(stderr, "kvpage bench serve: error: request %lld failed: %s\n", (long long)w->reqs[i].id, r.rec[i].err);
    metrics_free(&r.mp);
    for (int64_t i = 0; r.ans && i < w->n; i++)
        kvp_free(r.ans[i].ids), kvp_free(r.ans[i].prompt), kvp_free(r.ans[i].text.p);
    kvp_free(r.rec), kvp_free(r.heap), kvp_free(r.child), kvp_free(r.sibling), kvp_free(r.live), kvp_free(r.itl);
    kvp_free(r.ans);
    kvp_workload_destroy(w);
    return st;
}

static kvp_status parse_rate_item(const char *s, void *out) { return kvp_parse_rate(s, out); }

enum {
    O_MODEL = 256, O_URL, O_TRACE, O_WORKLOAD, O_RATE, O_NUMREQ, O_DURATION, O_MAXCONC, O_TIMEOUT, O_REQOUT, O_FORMAT,
    O_JSON, O_MINTERVAL, O_MOUT, O_GOODPUT, O_ENDPOINT, O_PLOT, O_ANSWERS, O_WIDE
};

/* The rows of rep (one per rate) as the latency-throughput curve in PNG png. */
static kvp_status plot_curve(const kvp_report *rep, const char *png, const char *title)
{
    char csv[] = "/tmp/kvpage-bench-serve-XXXXXX.csv";
    const int fd = mkstemps(csv, 4);
    if (fd < 0) return KVP_ERR(KVP_EIO, "--plot: cannot create a temporary CSV: %s", strerror(errno));
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        unlink(csv);
        return KVP_ERR(KVP_EIO, "--plot: cannot write a temporary CSV: %s", strerror(errno));
    }
    kvp_status st = kvp_report_print(rep, f, KVP_FMT_CSV);
    if (fclose(f) != 0 && st == KVP_OK) st = KVP_ERR(KVP_EIO, "--plot: cannot write a temporary CSV: %s", strerror(errno));
    const char *args[] = {"lines",    csv,         png,      "--x",       "output_tok_s", "--y",
                          "ttft_p50_ms,tpot_p50_ms,e2e_p50_ms", "--logy", "--in-order", "--annotate", "rate",
                          "--title",  title,       "--xlabel", "output tokens/s", "--ylabel", "median latency (ms)", NULL};
    if (st == KVP_OK && (st = kvp_bench_plot(args)) != KVP_OK) st = KVP_ERR(st, "--plot: %s", kvp_error_message());
    unlink(csv);
    return st;
}

int kvp_bench_serve(int argc, char **argv)
{
    const char *cmd = "bench serve";
    static const struct option opts[] = {
        {"model", required_argument, NULL, O_MODEL},       {"url", required_argument, NULL, O_URL},
        {"trace", required_argument, NULL, O_TRACE},       {"workload", required_argument, NULL, O_WORKLOAD},
        {"rate", required_argument, NULL, O_RATE},         {"num-requests", required_argument, NULL, O_NUMREQ},
        {"duration", required_argument, NULL, O_DURATION}, {"max-concurrency", required_argument, NULL, O_MAXCONC},
        {"timeout", required_argument, NULL, O_TIMEOUT},   {"requests-out", required_argument, NULL, O_REQOUT},
        {"format", required_argument, NULL, O_FORMAT},     {"json", no_argument, NULL, O_JSON}, {"wide", no_argument, NULL, O_WIDE},
        {"metrics-interval", required_argument, NULL, O_MINTERVAL}, {"metrics-out", required_argument, NULL, O_MOUT},
        {"goodput", required_argument, NULL, O_GOODPUT},   {"endpoint", required_argument, NULL, O_ENDPOINT},
        {"plot", required_argument, NULL, O_PLOT},         {"answers", required_argument, NULL, O_ANSWERS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bs_opts o = {.timeout_s = 600, .m_interval = 0.1};
    double rates[32] = {0};
    int nrates = 1, chat = 0;
    const char *plot = NULL;
    kvp_format fmt = KVP_FMT_TABLE;
    kvp_status st = KVP_OK;
    int c, li = -1;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        switch (c) {
        case O_MODEL: o.model = optarg; break;
        case O_URL: o.url = optarg; break;
        case O_TRACE: o.trace = optarg; break;
        case O_WORKLOAD: o.spec = optarg; break;
        case O_RATE: st = kvp_parse_list(optarg, parse_rate_item, rates, sizeof rates[0], 32, &nrates); break;
        case O_NUMREQ: st = kvp_parse_i64(optarg, 1, INT32_MAX, &o.num_req); break;
        case O_DURATION: st = kvp_parse_f64(optarg, 1e-9, 1e9, &o.duration); break;
        case O_MAXCONC: st = kvp_parse_i64(optarg, 1, 1 << 20, &o.max_conc); break;
        case O_TIMEOUT: st = kvp_parse_f64(optarg, 1e-3, 1e6, &o.timeout_s); break;
        case O_REQOUT: o.req_out = optarg; break;
        case O_MINTERVAL: st = kvp_parse_f64(optarg, 0, 3600, &o.m_interval); break;
        case O_MOUT: o.m_out = optarg; break;
        case O_PLOT: plot = optarg; break;
        case O_ANSWERS:
            o.server_answers = strcmp(optarg, "server") == 0;
            if (!o.server_answers && strcmp(optarg, "workload") != 0)
                st = KVP_ERR(KVP_EINVAL, "unknown answers '%s' (workload or server)", optarg);
            break;
        case O_GOODPUT: st = parse_slos(optarg, &o.slo); break;
        case O_ENDPOINT:
            chat = strcmp(optarg, "chat") == 0;
            if (!chat && strcmp(optarg, "completions") != 0)
                st = KVP_ERR(KVP_EINVAL, "unknown endpoint '%s' (completions or chat)", optarg);
            break;
        case O_FORMAT: st = kvp_format_parse(optarg, &fmt); break;
        case O_JSON: fmt = KVP_FMT_JSON; break;
        case O_WIDE: fmt = KVP_FMT_WIDE; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
        if (st != KVP_OK) return kvp_cli_usage_error(cmd, "--%s: %s", opts[li].name, kvp_error_message());
    }
    const int has_dashes = optind > 0 && optind <= argc && strcmp(argv[optind - 1], "--") == 0;
    if (optind < argc && !has_dashes) return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (o.model == NULL) return kvp_cli_usage_error(cmd, "--model PATH is required (the tokenizer's vocabulary)");
    if ((o.trace == NULL) == (o.spec == NULL))
        return kvp_cli_usage_error(cmd, "give exactly one of --trace and --workload");
    if (o.url && optind < argc)
        return kvp_cli_usage_error(cmd, "options after -- go to the server this command starts, not to --url's");
    if (o.m_out && !(o.m_interval > 0)) return kvp_cli_usage_error(cmd, "--metrics-out needs --metrics-interval > 0");
    if ((o.m_out || o.req_out) && nrates > 1)
        return kvp_cli_usage_error(cmd, "--requests-out and --metrics-out take a single --rate");
    if (plot && nrates < 2) return kvp_cli_usage_error(cmd, "--plot draws a curve: give a list of at least two --rate");
    if (plot) { /* refused now, not after the runs */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", plot);
        char *slash = strrchr(dir, '/');
        if (slash) slash[slash == dir] = '\0';
        if (access(slash ? dir : ".", W_OK) != 0)
            return kvp_cli_usage_error(cmd, "--plot: cannot write into the folder of '%s': %s", plot, strerror(errno));
    }
    if (o.url && strncmp(o.url, "http://", 7) != 0 && strncmp(o.url, "https://", 8) != 0)
        return kvp_cli_usage_error(cmd, "--url: '%s' is not an http:// or https:// URL", o.url);
    o.extra = argv + optind;
    o.nextra = argc - optind;
    if (o.url) {
        snprintf(o.server, sizeof o.server, "%s", o.url);
    } else {
        size_t at = (size_t)snprintf(o.server, sizeof o.server, "kvpage serve");
        for (int i = 0; i < o.nextra && at < sizeof o.server; i++)
            at += (size_t)snprintf(o.server + at, sizeof o.server - at, " %s", o.extra[i]);
    }
    kvp_workload *w = NULL; /* read before any server starts, so that a bad workload is refused at once */
    if ((st = load_workload(&o, rates[0], 32768, &w)) != KVP_OK) return kvp_cli_fail(cmd, st);
    kvp_workload_destroy(w);
    kvp_tokenizer *tok = NULL;
    if ((st = kvp_tok_load(o.model, 0, &tok)) != KVP_OK) return kvp_cli_fail(cmd, st);
    o.vocab = kvp_tok_vocab_size(tok);
    o.chat = chat ? tok : NULL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        kvp_tok_destroy(tok);
        return kvp_cli_fail(cmd, KVP_ERR(KVP_EIO, "libcurl: global initialisation failed"));
    }
    kvp_report *rep = NULL;
    int64_t failed = 0;
    static const char *const brief[] = {"rate", "completed", "failed", "output_tok_s", "ttft_p50_ms", "tpot_p50_ms",
                                        "e2e_p50_ms", "prefix_hit_rate"};
    st = kvp_report_create(k_fields, NFIELDS, &rep);
    if (st == KVP_OK) st = kvp_report_set_brief(rep, brief, (int)(sizeof brief / sizeof brief[0]));
    for (int k = 0; k < nrates && st == KVP_OK; k++) { /* each rate on a fresh server (unless --url) */
        int64_t f = 0;
        st = one_rate(&o, rates[k], k > 0, rep, &f);
        failed += f;
    }
    if (st == KVP_OK) {
        if ((fmt == KVP_FMT_TABLE || fmt == KVP_FMT_WIDE) && nrates == 1) print_vertical(cJSON_GetArrayItem(kvp_report_rows(rep), 0));
        else st = kvp_report_print(rep, stdout, fmt);
    }
    if (st == KVP_OK && plot) {
        char title[320];
        snprintf(title, sizeof title, "%.120s: %.190s", o.trace ? o.trace : o.spec, o.server);
        st = plot_curve(rep, plot, title);
    }
    kvp_report_destroy(rep);
    kvp_tok_destroy(tok);
    curl_global_cleanup();
    if (st != KVP_OK) return kvp_cli_fail(cmd, st);
    return failed > 0 ? KVP_EXIT_FAIL : KVP_EXIT_OK;
}
