/* `kvpage serve` — an OpenAI-compatible HTTP server over the online generation session (runtime/gen.h).
 *
 *   HTTP threads (libmicrohttpd, one per connection)       engine thread (owns the session)
 *   -----------------------------------------------        -----------------------------------------
 *   parse JSON, tokenize, queue a job, wait on it    --->  add the queued jobs' prompts to the session
 *                                                          step (one batch of every running sequence)
 *   decode, answer                                   <---  hand each finished request to its job
 *
 * so requests from different connections share batches (continuous batching), and a request arriving while
 * others run joins them at the next step. Endpoints: POST /v1/completions, GET /v1/models, GET /health,
 * GET /metrics (Prometheus text). Text to clients; logs to stderr. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/log.h"
#include "common/parse.h"
#include "runtime/commands.h"
#include "runtime/gen.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"

static const char *const CMD = "serve";

enum { MAX_BODY = 1 << 20, MAX_PROMPTS = 256, MAX_STREAM = 64 /* choices of a streamed request */ };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage serve --model PATH [options]\n\n"
            "Serves a Llama-family model (as `kvpage generate` runs it) over HTTP with OpenAI's completions API.\n"
            "Requests from every connection share the engine's batches (continuous batching); the prefix cache\n"
            "is shared across requests.\n\n"
            "  POST /v1/completions  {\"prompt\": TEXT | [TEXT, ...] | [TOKEN_ID, ...], \"max_tokens\": 16,\n"
            "                        \"temperature\": 1, \"top_p\": 1, \"top_k\": -1, \"n\": 1, \"seed\": N,\n"
            "                        \"stream\": false}   (stream: server-sent events, as OpenAI's)\n"
            "  GET  /v1/models       the served model\n"
            "  GET  /health          200 while serving\n"
            "  GET  /metrics         Prometheus counters and gauges (requests, tokens, KV blocks, prefix hits)\n\n"
            "  --model PATH              a GGUF file or a Hugging Face folder\n"
            "  --tokenizer PATH          as for generate\n"
            "  --host ADDR               IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N                  TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --served-model-name NAME  the model's name in the API (default: the file or folder's name)\n"
            "  --kv-mem BYTES            KV cache size (default 512MiB), or --num-blocks N\n"
            "  --num-blocks N            KV blocks (overrides --kv-mem)\n"
            "  --block-size N            tokens per KV block (default 16)\n"
            "  --kv-dtype T              f32 (default), f16, bf16 or fp8\n"
            "  --cache radix|hash|none   prefix cache (default radix)\n"
            "  --max-num-seqs N          running sequences at most (default 256)\n"
            "  --max-batched-tokens N    tokens per step (default 2048)\n"
            "  --threads N               CPU threads (default 1)\n"
            "  --matmul invariant|blas   as for generate (default invariant)\n"
            "  --json                    print the listening address as one JSON object on stdout\n"
            "  -h, --help                this help\n\n"
            "Stops on SIGINT or SIGTERM: requests in flight get 503, then the process exits 0.\n");
}

/* One HTTP completion request: its prompts are session requests. Without streaming the handler waits until
 * all are back; with streaming the engine copies each choice's new tokens after every step and the
 * response's reader sends them as they come. Choice c = prompt i, sample k: c = i * nsamples + k. */
typedef struct job {
    struct job *next;
    int32_t n, nsamples;
    kvp_gen_request reqs[MAX_PROMPTS];
    int32_t *enc[MAX_PROMPTS]; /* tokenized prompts, owned */
    kvp_gen_result res[MAX_PROMPTS];
    int32_t remaining; /* prompts added and not finished */
    int finished;      /* set by the engine thread when the handler may answer */
    int status;        /* 0, or the HTTP error to answer with err */
    char err[512];
    pthread_cond_t done; /* finished, or (stream) new tokens */
    int stream;
    int refs;                    /* stream: the engine's and the response's (under mu; the last one frees) */
    int32_t ids[MAX_PROMPTS];    /* stream: session ids of the prompts added (the first `added`) */
    int32_t added;
    struct job *fail_next;       /* fail_in_flight's list */
    int32_t *toks[MAX_STREAM];   /* stream: tokens generated so far per choice (under mu) */
    int32_t ntok[MAX_STREAM];
    size_t cap_tok[MAX_STREAM];
} job;

typedef struct {
    job *j;
    int32_t i;
} owner;

typedef struct {
    kvp_model *m;
    kvp_tokenizer *tok;
    char name[256];
    kvp_gen_config cfg;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    job *head, *tail; /* queued, not yet added */
    int stop;
    /* engine thread only */
    kvp_gen_session *s;
    job **streams; /* streamed jobs in flight */
    size_t cap_streams;
    int32_t nstreams;
    owner *own; /* session request id -> its job and prompt (job NULL once delivered) */
    size_t cap_own;
    int32_t nown;
    /* under mu */
    kvp_gen_session_stats stats;
    int64_t answered[3]; /* 2xx, 4xx, 5xx */
    int64_t prompt_tokens, completion_tokens;
    uint64_t next_seed, next_id;
    time_t started;
} server;

/* ---------------------------------------------------------------- engine thread */

static void job_free(job *j)
{
    for (int32_t i = 0; i < j->n; i++) {
        kvp_free(j->enc[i]);
        kvp_gen_results_free(&j->res[i], 1);
    }
    for (int c = 0; c < MAX_STREAM; c++) kvp_free(j->toks[c]);
    pthread_cond_destroy(&j->done);
    kvp_free(j);
}

/* Drops one reference to a streamed job (caller holds mu); the last one frees it. */
static void job_release(job *j)
{
    if (--j->refs == 0) job_free(j);
}

/* Ends job j (caller holds mu): answered with status/err unless 0. The engine lets go of a streamed job
 * here: nothing of the engine refers to it after this. */
static void job_finish(server *sv, job *j, int status, const char *err)
{
    if (status && !j->status) {
        j->status = status;
        snprintf(j->err, sizeof j->err, "%s", err);
    }
    j->finished = 1;
    pthread_cond_signal(&j->done);
    if (j->stream) {
        for (int32_t i = 0; i < sv->nstreams; i++)
            if (sv->streams[i] == j) {
                sv->streams[i] = sv->streams[--sv->nstreams];
                break;
            }
        job_release(j);
    }
}

/* Adds a job's prompts to the session; one that is refused ends the job with 400 once the prompts already
 * added are back. */
static void add_job(server *sv, job *j)
{
    int32_t added = 0;
    char err[512] = "";
    kvp_status st = j->stream ? kvp_grow((void **)&sv->streams, &sv->cap_streams, (size_t)sv->nstreams + 1,
                                         sizeof *sv->streams) : KVP_OK;
    for (int32_t i = 0; st == KVP_OK && i < j->n; i++) {
        int32_t id;
        st = kvp_grow((void **)&sv->own, &sv->cap_own, (size_t)sv->nown + 1, sizeof *sv->own);
        if (st == KVP_OK) st = kvp_gen_session_add(sv->s, &j->reqs[i], &id); /* ids count like nown */
        if (st != KVP_OK) break;
        sv->own[sv->nown++] = (owner){j, i};
        j->ids[i] = id;
        added++;
    }
    if (st != KVP_OK) snprintf(err, sizeof err, "prompt %d: %s", added, kvp_error_message());
    pthread_mutex_lock(&sv->mu);
    j->added = added;
    if (j->stream && added > 0) sv->streams[sv->nstreams++] = j; /* room made above */
    j->remaining = added;
    if (err[0]) {
        j->status = 400;
        snprintf(j->err, sizeof j->err, "%s", err);
    }
    if (added == 0) job_finish(sv, j, 0, NULL);
    pthread_mutex_unlock(&sv->mu);
}

/* Ends every job in flight with status and err, and forgets the session's ids (its jobs may be freed as soon
 * as mu is released). */
static void fail_in_flight(server *sv, int status, const char *err)
{
    pthread_mutex_lock(&sv->mu);
    job *list = NULL; /* each unfinished job once; finishing one may free it, so no id may point to it then */
    for (int32_t id = 0; id < sv->nown; id++) {
        job *j = sv->own[id].j;
        sv->own[id].j = NULL;
        if (!j || j->finished || j->fail_next) continue;
        j->fail_next = list ? list : j; /* non-NULL marks it listed; the last one points to itself */
        list = j;
    }
    while (list) {
        job *next = list->fail_next == list ? NULL : list->fail_next;
        job_finish(sv, list, status, err);
        list = next;
    }
    sv->nown = 0;
    pthread_mutex_unlock(&sv->mu);
}

/* Copies the new tokens of every streamed choice into its job and wakes its reader (caller holds mu). A
 * copy that cannot grow waits for the next step, or for the final result. */
static void stream_progress(server *sv)
{
    for (int32_t x = 0; x < sv->nstreams; x++) {
        job *j = sv->streams[x];
        int woke = 0;
        for (int32_t i = 0; i < j->added; i++)
            for (int32_t k = 0; k < j->nsamples; k++) {
                const int32_t c = i * j->nsamples + k;
                const int32_t *t;
                int32_t n;
                if (kvp_gen_session_partial(sv->s, j->ids[i], k, &t, &n) != KVP_OK || n <= j->ntok[c]) continue;
                if (kvp_grow((void **)&j->toks[c], &j->cap_tok[c], (size_t)n, sizeof *t) != KVP_OK) continue;
                memcpy(j->toks[c] + j->ntok[c], t + j->ntok[c], (size_t)(n - j->ntok[c]) * sizeof *t);
                j->ntok[c] = n;
                woke = 1;
            }
        if (woke) pthread_cond_signal(&j->done);
    }
}

static void *engine_main(void *arg)
{
    server *sv = arg;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        while (!sv->stop && !sv->head && !kvp_gen_session_pending(sv->s)) pthread_cond_wait(&sv->wake, &sv->mu);
        job *q = sv->stop ? NULL : sv->head;
        if (!sv->stop) sv->head = sv->tail = NULL;
        const int stop = sv->stop;
        pthread_mutex_unlock(&sv->mu);
        if (stop) break;
        while (q) {
            job *next = q->next;
            add_job(sv, q);
            q = next;
        }
        kvp_status st = kvp_gen_session_step(sv->s);
        if (st != KVP_OK) { /* the session is unusable: answer what it held, start a new one */
            char err[512];
            snprintf(err, sizeof err, "the engine failed: %s", kvp_error_message());
            KVP_LOG_E("serve: %s", err);
            fail_in_flight(sv, 500, err);
            kvp_gen_session_destroy(sv->s);
            sv->s = NULL;
            if (kvp_gen_session_create(sv->m, &sv->cfg, &sv->s) != KVP_OK) {
                KVP_LOG_E("serve: cannot start a new session: %s", kvp_error_message());
                pthread_mutex_lock(&sv->mu);
                sv->stop = 1;
                pthread_mutex_unlock(&sv->mu);
                break;
            }
            continue;
        }
        pthread_mutex_lock(&sv->mu); /* before any answer: a client that reads /metrics next sees this step */
        kvp_gen_session_stats_get(sv->s, &sv->stats);
        stream_progress(sv);
        pthread_mutex_unlock(&sv->mu);
        int32_t id;
        kvp_gen_result res;
        while ((st = kvp_gen_session_take(sv->s, &id, &res)) == KVP_OK) {
            owner o = sv->own[id];
            sv->own[id].j = NULL;
            pthread_mutex_lock(&sv->mu);
            o.j->res[o.i] = res;
            if (--o.j->remaining == 0) job_finish(sv, o.j, 0, NULL);
            pthread_mutex_unlock(&sv->mu);
        }
        if (st != KVP_ENOTFOUND) KVP_LOG_E("serve: collecting a result: %s", kvp_error_message());
    }
    /* stopping: everything queued or in flight gets 503 */
    if (sv->s) fail_in_flight(sv, 503, "the server is shutting down");
    pthread_mutex_lock(&sv->mu);
    for (job *j = sv->head, *next; j; j = next) {
        next = j->next;
        job_finish(sv, j, 503, "the server is shutting down");
    }
    sv->head = sv->tail = NULL;
    pthread_mutex_unlock(&sv->mu);
    return NULL;
}

/* ---------------------------------------------------------------- HTTP */

typedef struct {
    char *buf;
    size_t len;
    int too_big;
} body;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *ctype, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static void count_answer(server *sv, unsigned code)
{
    pthread_mutex_lock(&sv->mu);
    sv->answered[code >= 500 ? 2 : code >= 400 ? 1 : 0]++;
    pthread_mutex_unlock(&sv->mu);
}

/* Answers cJSON object o (consumed) with code. */
static enum MHD_Result reply_json(server *sv, struct MHD_Connection *c, unsigned code, cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) code = 500;
    count_answer(sv, code);
    enum MHD_Result r = reply(c, code, "application/json", text ? text : "{\"error\":{\"message\":\"out of memory\"}}");
    cJSON_free(text);
    return r;
}

/* OpenAI's error object. */
static enum MHD_Result reply_error(server *sv, struct MHD_Connection *c, unsigned code, const char *msg)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", code == 404 ? "not_found_error" : code < 500 ? "invalid_request_error" : "server_error");
    cJSON_AddNumberToObject(e, "code", code);
    return reply_json(sv, c, code, o);
}

/* Field k of the request: a number in [lo, hi] (integer when integral), or def when absent or null. 0 and
 * err set when it is something else. */
static int get_num(const cJSON *req, const char *k, double def, double lo, double hi, int integral, double *out,
                   char *err, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, k);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 1;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        (integral && v->valuedouble != (double)(int64_t)v->valuedouble)) {
        snprintf(err, cap, integral ? "\"%s\" must be %s in [%.0f, %.0f]" : "\"%s\" must be %s in [%g, %g]", k,
                 integral ? "an integer" : "a number", lo, hi);
        return 0;
    }
    *out = v->valuedouble;
    return 1;
}

/* Rejects an option this server does not implement when it asks for something (rather than ignoring it). */
static int unsupported(const cJSON *req, char *err, size_t cap)
{
    static const char *const keys[] = {"stop", "logprobs", "echo", "suffix", "logit_bias", "presence_penalty",
                                       "frequency_penalty", "stream_options"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, keys[i]);
        if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0) ||
            ((cJSON_IsArray(v) || cJSON_IsObject(v)) && cJSON_GetArraySize(v) == 0) ||
            (cJSON_IsString(v) && v->valuestring[0] == '\0'))
            continue;
        snprintf(err, cap, "\"%s\" is not supported by this server", keys[i]);
        return 1;
    }
    return 0;
}

/* Builds the job of a completion request: its prompts tokenized, its sampling parameters checked. */
static int build_job(server *sv, const cJSON *req, job *j, char *err, size_t cap)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, sv->name) != 0)) {
        snprintf(err, cap, "The model `%s` does not exist (this server serves `%s`).",
                 cJSON_IsString(model) ? model->valuestring : "?", sv->name);
        return 404;
    }
    if (unsupported(req, err, cap)) return 400;
    double max_tokens, temperature, top_p, top_k, n, seed, best_of;
    if (!get_num(req, "max_tokens", 16, 0, 1 << 24, 1, &max_tokens, err, cap) ||
        !get_num(req, "temperature", 1.0, 0, 1e6, 0, &temperature, err, cap) ||
        !get_num(req, "top_p", 1.0, 1e-9, 1, 0, &top_p, err, cap) ||
        !get_num(req, "top_k", -1, -1, INT32_MAX, 1, &top_k, err, cap) ||
        !get_num(req, "n", 1, 1, 1000, 1, &n, err, cap) || !get_num(req, "seed", -1, 0, 9007199254740991.0, 1, &seed, err, cap) ||
        !get_num(req, "best_of", n, n, n, 1, &best_of, err, cap))
        return 400;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(req, "stream");
    if (stream && !cJSON_IsNull(stream) && !cJSON_IsBool(stream))
        return snprintf(err, cap, "\"stream\" must be true or false"), 400;
    j->stream = cJSON_IsTrue(stream);
    j->nsamples = (int32_t)n;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    const int ids = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(p, 0));
    const int32_t np = cJSON_IsString(p) || ids ? 1 : cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (np < 1 || np > MAX_PROMPTS) {
        snprintf(err, cap, "\"prompt\" must be a string, an array of 1 to %d strings, or an array of token ids",
                 MAX_PROMPTS);
        return 400;
    }
    if (j->stream && np * (int32_t)n > MAX_STREAM)
        return snprintf(err, cap, "a streamed request has at most %d choices (prompts x n)", MAX_STREAM), 400;
    uint64_t base_seed;
    pthread_mutex_lock(&sv->mu);
    base_seed = seed >= 0 ? (uint64_t)seed : sv->next_seed++ * 1000003u; /* no seed: a new one per request */
    pthread_mutex_unlock(&sv->mu);
    const int32_t V = (int32_t)kvp_model_cfg(sv->m)->vocab_size, maxlen = kvp_model_max_len(sv->m);
    for (int32_t i = 0; i < np; i++) {
        int32_t len = 0;
        if (ids) {
            len = cJSON_GetArraySize(p);
            if (len >= maxlen) return snprintf(err, cap, "prompt %d is %d tokens, the model's context is %d", i, len, maxlen), 400;
            j->enc[i] = kvp_malloc((size_t)len * sizeof(int32_t));
            if (!j->enc[i]) return snprintf(err, cap, "out of memory"), 500;
            j->n = i + 1;
            int32_t t = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, p) { /* linear: cJSON_GetArrayItem walks the list from its head */
                const double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
                if (!(v >= 0 && v < V && v == (double)(int32_t)v))
                    return snprintf(err, cap, "\"prompt\" token %d is not a token id in [0, %d)", t, V), 400;
                j->enc[i][t++] = (int32_t)v;
            }
        } else {
            const cJSON *x = cJSON_IsString(p) ? p : cJSON_GetArrayItem(p, i);
            if (!cJSON_IsString(x)) return snprintf(err, cap, "\"prompt\" item %d is not a string", i), 400;
            if (kvp_tok_encode(sv->tok, x->valuestring, strlen(x->valuestring), 1, &j->enc[i], &len) != KVP_OK)
                return snprintf(err, cap, "prompt %d: %s", i, kvp_error_message()), 400;
            j->n = i + 1;
            if (len >= maxlen) return snprintf(err, cap, "prompt %d is %d tokens, the model's context is %d", i, len, maxlen), 400;
        }
        j->reqs[i] = (kvp_gen_request){.prompt = j->enc[i], .n_prompt = len, .max_tokens = (int32_t)max_tokens,
                                       .n = (int32_t)n,
                                       .sampler = {.temperature = temperature, .top_k = top_k < 0 ? 0 : (int32_t)top_k,
                                                   .top_p = top_p, .seed = base_seed + (uint64_t)i}};
    }
    return 0;
}

/* Adds an answered job's prompt and generated tokens to the metrics. */
static void count_tokens(server *sv, const job *j)
{
    int64_t p = 0, g = 0;
    for (int32_t i = 0; i < j->n; i++) {
        p += j->reqs[i].n_prompt;
        for (int32_t k = 0; k < j->res[i].n_samples; k++) g += j->res[i].n_tokens[k];
    }
    pthread_mutex_lock(&sv->mu);
    sv->prompt_tokens += p;
    sv->completion_tokens += g;
    pthread_mutex_unlock(&sv->mu);
}

/* A completion object's head (the whole answer's, or a streamed event's): id, object, created, model. */
static cJSON *completion_head(const server *sv, uint64_t id, time_t created)
{
    cJSON *o = cJSON_CreateObject();
    char idbuf[40];
    snprintf(idbuf, sizeof idbuf, "cmpl-%llu", (unsigned long long)id);
    cJSON_AddStringToObject(o, "id", idbuf);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", sv->name);
    return o;
}

/* The response of a finished job. */
static cJSON *completion_json(server *sv, const job *j, uint64_t id)
{
    cJSON *o = completion_head(sv, id, time(NULL));
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    int64_t ptoks = 0, ctoks = 0, index = 0;
    for (int32_t i = 0; i < j->n; i++) {
        const kvp_gen_result *r = &j->res[i];
        ptoks += j->reqs[i].n_prompt;
        for (int32_t s = 0; s < r->n_samples; s++) {
            char *text = NULL;
            if (kvp_tok_decode(sv->tok, j->reqs[i].prompt[j->reqs[i].n_prompt - 1], r->tokens[s], r->n_tokens[s],
                               &text) != KVP_OK) {
                cJSON_Delete(o);
                return NULL;
            }
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddItemToArray(choices, ch);
            cJSON_AddNumberToObject(ch, "index", (double)index++);
            kvp_json_add_text(ch, "text", text);
            kvp_free(text);
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddStringToObject(ch, "finish_reason", r->finish[s] != KVP_FINISH_LENGTH ? "stop" : "length");
            ctoks += r->n_tokens[s];
        }
    }
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)ptoks);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ctoks);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(ptoks + ctoks));
    count_tokens(sv, j);
    return o;
}

/* ---------------------------------------------------------------- streaming (server-sent events) */

/* A streamed response: what the reader has sent per choice, and the bytes it has ready to send. */
typedef struct {
    server *sv;
    job *j;
    uint64_t id;
    time_t created;
    int32_t sent[MAX_STREAM];
    char tail[MAX_STREAM][4]; /* the start of a UTF-8 character whose last bytes have not come yet */
    int ntail[MAX_STREAM];
    char *out;
    size_t len, at, cap;
    int done; /* [DONE] is in out */
    int oom;
} stream_ctx;

static void out_add(stream_ctx *x, const char *text)
{
    const size_t n = strlen(text);
    if (x->oom || kvp_grow((void **)&x->out, &x->cap, x->len + n + 1, 1) != KVP_OK) {
        x->oom = 1;
        return;
    }
    memcpy(x->out + x->len, text, n + 1);
    x->len += n;
}

/* Bytes of s[0, n) that end on a whole UTF-8 character: an incomplete last character (its lead byte
 * announces more bytes than follow) is left out. */
static size_t utf8_whole(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char b = (unsigned char)s[n - back];
        if ((b & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* One event of choice c: the text of tokens[from, to) and, at the end, its finish reason. A character
 * whose bytes come from tokens of two steps is sent whole with the second (the tail waits). */
static void stream_event(stream_ctx *x, int32_t c, const int32_t *tokens, int32_t from, int32_t to, const char *finish)
{
    const job *j = x->j;
    const kvp_gen_request *r = &j->reqs[c / j->nsamples];
    char *dec = NULL, *text = NULL;
    if (to > from &&
        kvp_tok_decode(x->sv->tok, from > 0 ? tokens[from - 1] : r->prompt[r->n_prompt - 1], tokens + from, to - from,
                       &dec) != KVP_OK) {
        x->oom = 1;
        return;
    }
    const size_t nd = dec ? strlen(dec) : 0, nt = (size_t)x->ntail[c];
    text = kvp_malloc(nt + nd + 1);
    if (!text) {
        kvp_free(dec);
        x->oom = 1;
        return;
    }
    memcpy(text, x->tail[c], nt);
    memcpy(text + nt, dec ? dec : "", nd + 1);
    kvp_free(dec);
    const size_t whole = finish ? nt + nd : utf8_whole(text, nt + nd);
    x->ntail[c] = (int)(nt + nd - whole);
    memcpy(x->tail[c], text + whole, (size_t)x->ntail[c]);
    text[whole] = '\0';
    cJSON *o = completion_head(x->sv, x->id, x->created);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", c);
    kvp_json_add_text(ch, "text", text ? text : "");
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    kvp_free(text);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) {
        x->oom = 1;
        return;
    }
    out_add(x, "data: ");
    out_add(x, js);
    out_add(x, "\n\n");
    cJSON_free(js);
}

/* Waits for something to send (new tokens, or the end) and formats it into x->out. */
static void stream_fill(stream_ctx *x)
{
    server *sv = x->sv;
    job *j = x->j;
    const int32_t nc = j->n * j->nsamples;
    pthread_mutex_lock(&sv->mu);
    for (;;) {
        for (int32_t c = 0; c < nc; c++)
            if (j->ntok[c] > x->sent[c]) {
                stream_event(x, c, j->toks[c], x->sent[c], j->ntok[c], NULL);
                x->sent[c] = j->ntok[c];
            }
        if (x->len > 0) break;
        if (j->finished) {
            if (j->status) { /* OpenAI's error object as the last event */
                cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
                cJSON_AddStringToObject(e, "message", j->err);
                cJSON_AddNumberToObject(e, "code", j->status);
                char *js = cJSON_PrintUnformatted(o);
                cJSON_Delete(o);
                out_add(x, "data: ");
                out_add(x, js ? js : "{}");
                out_add(x, "\n\n");
                cJSON_free(js);
            } else {
                for (int32_t c = 0; c < nc; c++) { /* what no step showed, then the finish reason */
                    const kvp_gen_result *r = &j->res[c / j->nsamples];
                    const int32_t k = c % j->nsamples, n = k < r->n_samples ? r->n_tokens[k] : 0;
                    stream_event(x, c, n ? r->tokens[k] : NULL, x->sent[c] < n ? x->sent[c] : n, n,
                                 k < r->n_samples && r->finish[k] != KVP_FINISH_LENGTH ? "stop" : "length");
                }
            }
            out_add(x, "data: [DONE]\n\n");
            x->done = 1;
            break;
        }
        pthread_cond_wait(&j->done, &sv->mu);
    }
    pthread_mutex_unlock(&sv->mu);
    if (x->done) { /* counted when it ends: an error event makes it an error */
        count_answer(sv, j->status ? (unsigned)j->status : 200);
        if (!j->status) count_tokens(sv, j);
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *x = cls;
    if (x->at == x->len) {
        x->at = x->len = 0;
        if (x->done || x->oom) return MHD_CONTENT_READER_END_OF_STREAM; /* out of memory: cut short */
        stream_fill(x);
    }
    size_t n = x->len - x->at < max ? x->len - x->at : max;
    memcpy(buf, x->out + x->at, n);
    x->at += n;
    return (ssize_t)n;
}

static void stream_done(void *cls)
{
    stream_ctx *x = cls;
    pthread_mutex_lock(&x->sv->mu);
    job_release(x->j);
    pthread_mutex_unlock(&x->sv->mu);
    kvp_free(x->out);
    kvp_free(x);
}

static enum MHD_Result stream_reply(struct MHD_Connection *c, stream_ctx *x)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, x, stream_done);
    if (!r) {
        stream_done(x);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result completions(server *sv, struct MHD_Connection *c, const body *b)
{
    if (b->too_big) return reply_error(sv, c, 413, "the request body is larger than 1 MiB");
    cJSON *req = b->len ? cJSON_ParseWithLength(b->buf, b->len) : NULL;
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return reply_error(sv, c, 400, "the request body is not a JSON object");
    }
    job *j = kvp_calloc(1, sizeof *j);
    if (!j || pthread_cond_init(&j->done, NULL) != 0) {
        kvp_free(j);
        cJSON_Delete(req);
        return reply_error(sv, c, 500, "out of memory");
    }
    char err[512] = "";
    int code = build_job(sv, req, j, err, sizeof err);
    cJSON_Delete(req);
    if (code) {
        job_free(j);
        return reply_error(sv, c, (unsigned)code, err);
    }
    uint64_t id;
    stream_ctx *x = j->stream ? kvp_calloc(1, sizeof *x) : NULL;
    if (j->stream && !x) {
        job_free(j);
        return reply_error(sv, c, 500, "out of memory");
    }
    pthread_mutex_lock(&sv->mu);
    id = sv->next_id++;
    j->refs = j->stream ? 2 : 1; /* the engine's (released by job_finish) and the response's */
    if (sv->stop) {
        job_finish(sv, j, 503, "the server is shutting down");
    } else {
        if (sv->tail) sv->tail->next = j;
        else sv->head = j;
        sv->tail = j;
        pthread_cond_signal(&sv->wake);
    }
    if (x) {
        pthread_mutex_unlock(&sv->mu);
        *x = (stream_ctx){.sv = sv, .j = j, .id = id, .created = time(NULL)};
        return stream_reply(c, x);
    }
    while (!j->finished) pthread_cond_wait(&j->done, &sv->mu);
    pthread_mutex_unlock(&sv->mu);
    enum MHD_Result ret;
    if (j->status) {
        ret = reply_error(sv, c, (unsigned)j->status, j->err);
    } else {
        cJSON *o = completion_json(sv, j, id);
        ret = o ? reply_json(sv, c, 200, o) : reply_error(sv, c, 500, "cannot decode the generated tokens");
    }
    job_free(j);
    return ret;
}

static enum MHD_Result models(server *sv, struct MHD_Connection *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
    cJSON_AddStringToObject(m, "id", sv->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)sv->started);
    cJSON_AddStringToObject(m, "owned_by", "kvpage");
    cJSON_AddNumberToObject(m, "max_model_len", kvp_model_max_len(sv->m));
    return reply_json(sv, c, 200, o);
}

/* Prometheus text format 0.0.4. */
static enum MHD_Result metrics(server *sv, struct MHD_Connection *c)
{
    char *t = kvp_malloc(8192);
    if (!t) return reply_error(sv, c, 500, "out of memory");
    pthread_mutex_lock(&sv->mu);
    const kvp_gen_session_stats s = sv->stats;
    const int64_t a[3] = {sv->answered[0], sv->answered[1], sv->answered[2]};
    const int64_t pt = sv->prompt_tokens, ct = sv->completion_tokens;
    pthread_mutex_unlock(&sv->mu);
    const double used = s.num_blocks > 0 ? 1.0 - (double)s.free_blocks / s.num_blocks : 0.0;
    snprintf(t, 8192,
             "# HELP kvpage_http_responses_total HTTP responses (completions, models, errors) by status class.\n"
             "# TYPE kvpage_http_responses_total counter\n"
             "kvpage_http_responses_total{code=\"200\"} %lld\n"
             "kvpage_http_responses_total{code=\"4xx\"} %lld\n"
             "kvpage_http_responses_total{code=\"5xx\"} %lld\n"
             "# HELP kvpage_prompt_tokens_total Prompt tokens of answered completions.\n"
             "# TYPE kvpage_prompt_tokens_total counter\n"
             "kvpage_prompt_tokens_total %lld\n"
             "# HELP kvpage_generation_tokens_total Tokens generated for answered completions.\n"
             "# TYPE kvpage_generation_tokens_total counter\n"
             "kvpage_generation_tokens_total %lld\n"
             "# HELP kvpage_engine_requests_total Prompts the engine has taken (each prompt of a request is one).\n"
             "# TYPE kvpage_engine_requests_total counter\n"
             "kvpage_engine_requests_total %lld\n"
             "# HELP kvpage_engine_requests_finished_total Prompts the engine has finished.\n"
             "# TYPE kvpage_engine_requests_finished_total counter\n"
             "kvpage_engine_requests_finished_total %lld\n"
             "# HELP kvpage_requests_waiting Prompts not admitted yet.\n"
             "# TYPE kvpage_requests_waiting gauge\n"
             "kvpage_requests_waiting %lld\n"
             "# HELP kvpage_sequences_running Sequences in the running batch.\n"
             "# TYPE kvpage_sequences_running gauge\n"
             "kvpage_sequences_running %lld\n"
             "# HELP kvpage_sequences_preempted Sequences preempted, waiting to be recomputed.\n"
             "# TYPE kvpage_sequences_preempted gauge\n"
             "kvpage_sequences_preempted %lld\n"
             "# HELP kvpage_engine_steps_total Batched steps run.\n"
             "# TYPE kvpage_engine_steps_total counter\n"
             "kvpage_engine_steps_total %lld\n"
             "# HELP kvpage_computed_tokens_total Tokens through the forward pass (recomputation included).\n"
             "# TYPE kvpage_computed_tokens_total counter\n"
             "kvpage_computed_tokens_total %lld\n"
             "# HELP kvpage_preemptions_total Sequences preempted.\n"
             "# TYPE kvpage_preemptions_total counter\n"
             "kvpage_preemptions_total %lld\n"
             "# HELP kvpage_prefix_cache_queries_total Prompt tokens looked up in the prefix cache at admission.\n"
             "# TYPE kvpage_prefix_cache_queries_total counter\n"
             "kvpage_prefix_cache_queries_total %lld\n"
             "# HELP kvpage_prefix_cache_hits_total Prompt tokens the prefix cache served.\n"
             "# TYPE kvpage_prefix_cache_hits_total counter\n"
             "kvpage_prefix_cache_hits_total %lld\n"
             "# HELP kvpage_kv_blocks KV cache blocks.\n"
             "# TYPE kvpage_kv_blocks gauge\n"
             "kvpage_kv_blocks %d\n"
             "# HELP kvpage_kv_blocks_free KV blocks neither held by a sequence nor cached.\n"
             "# TYPE kvpage_kv_blocks_free gauge\n"
             "kvpage_kv_blocks_free %d\n"
             "# HELP kvpage_kv_cache_usage_ratio Share of the KV blocks in use (held or cached).\n"
             "# TYPE kvpage_kv_cache_usage_ratio gauge\n"
             "kvpage_kv_cache_usage_ratio %.6f\n",
             (long long)a[0], (long long)a[1], (long long)a[2], (long long)pt, (long long)ct, (long long)s.requests,
             (long long)s.finished, (long long)s.waiting, (long long)s.running_seqs, (long long)s.preempted_seqs,
             (long long)s.steps, (long long)s.computed_tokens, (long long)s.preemptions,
             (long long)s.admitted_prompt_tokens, (long long)s.prefix_hit_tokens, s.num_blocks, s.free_blocks, used);
    count_answer(sv, 200);
    enum MHD_Result r = reply(c, 200, "text/plain; version=0.0.4", t);
    kvp_free(t);
    return r;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    server *sv = cls;
    body *b = *con_cls;
    if (!b) { /* first call: headers only */
        b = kvp_calloc(1, sizeof *b);
        if (!b) return MHD_NO;
        *con_cls = b;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!b->too_big && b->len + *upload_size <= MAX_BODY) {
            char *nb = kvp_realloc(b->buf, b->len + *upload_size + 1);
            if (nb) {
                b->buf = nb;
                memcpy(b->buf + b->len, upload, *upload_size);
                b->len += *upload_size;
            } else {
                b->too_big = 1;
            }
        } else {
            b->too_big = 1;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    const int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0)
        return post ? completions(sv, c, b) : reply_error(sv, c, 405, "use POST for /v1/completions");
    if (strcmp(url, "/v1/models") == 0) return get ? models(sv, c) : reply_error(sv, c, 405, "use GET for /v1/models");
    if (strcmp(url, "/metrics") == 0) return get ? metrics(sv, c) : reply_error(sv, c, 405, "use GET for /metrics");
    if (strcmp(url, "/health") == 0) {
        if (!get) return reply_error(sv, c, 405, "use GET for /health");
        count_answer(sv, 200);
        return reply(c, 200, "text/plain", "");
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no such endpoint: %s %.200s", method, url);
    return reply_error(sv, c, 404, msg);
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)cls, (void)c, (void)why;
    body *b = *con_cls;
    if (b) kvp_free(b->buf);
    kvp_free(b);
    *con_cls = NULL;
}

/* ---------------------------------------------------------------- command */

typedef struct {
    const char *model, *tokenizer, *host, *name;
    int32_t port, num_blocks, threads;
    int64_t kv_mem;
    int json;
    kvp_matmul_kind matmul;
} serve_opts;

/* SIGINT/SIGTERM write a byte to this pipe, whichever thread they reach (OpenBLAS starts threads before
 * main, so blocking them in the threads serve() makes would not cover every thread); serve() waits on it. */
static int g_sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    const unsigned char b = (unsigned char)sig;
    const int saved = errno;
    ssize_t r = write(g_sig_pipe[1], &b, 1);
    (void)r;
    errno = saved;
}

/* Loads everything, serves until SIGINT or SIGTERM. */
static int serve(const serve_opts *o, kvp_gen_config cfg)
{
    server sv;
    memset(&sv, 0, sizeof sv);
    sv.started = time(NULL);
    kvp_status st = kvp_model_load(o->model, &sv.m);
    if (st == KVP_OK) {
        kvp_model_set_threads(sv.m, o->threads);
        kvp_model_set_matmul(sv.m, o->matmul);
        st = kvp_tok_for_model(sv.m, o->model, o->tokenizer, &sv.tok);
    }
    if (st == KVP_OK && cfg.num_blocks == 0) {
        const double per_block = kvp_kv_cache_bytes(sv.m, cfg.kv_dtype, 1, cfg.block_size);
        const double nb = (double)o->kv_mem / per_block;
        if (nb < 1) st = KVP_ERR(KVP_EINVAL, "--kv-mem %lld holds no block of %d tokens (%.0f bytes)",
                                 (long long)o->kv_mem, cfg.block_size, per_block);
        cfg.num_blocks = nb > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)nb;
    }
    sv.cfg = cfg;
    if (st == KVP_OK) st = kvp_gen_session_create(sv.m, &sv.cfg, &sv.s);
    if (o->name) {
        snprintf(sv.name, sizeof sv.name, "%s", o->name);
    } else {
        size_t n = strlen(o->model);
        while (n > 1 && o->model[n - 1] == '/') n--;
        const char *e = o->model + n, *b = e;
        while (b > o->model && b[-1] != '/') b--;
        snprintf(sv.name, sizeof sv.name, "%.*s", (int)(e - b), b);
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (st == KVP_OK && inet_pton(AF_INET, o->host, &addr.sin_addr) != 1)
        st = KVP_ERR(KVP_EINVAL, "--host %s is not an IPv4 address", o->host);
    if (st != KVP_OK) {
        kvp_gen_session_destroy(sv.s);
        kvp_tok_destroy(sv.tok);
        kvp_model_destroy(sv.m);
        return kvp_cli_fail(CMD, st);
    }
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.wake, NULL);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    pthread_t engine;
    int rc = KVP_EXIT_OK;
    struct MHD_Daemon *d = NULL;
    const int piped = pipe(g_sig_pipe) == 0;
    if (piped) {
        sigaction(SIGINT, &sa, &old_int);
        sigaction(SIGTERM, &sa, &old_term);
    }
    if (!piped) {
        rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EIO, "cannot make a pipe for signals"));
    } else if (pthread_create(&engine, NULL, engine_main, &sv) != 0) {
        rc = kvp_cli_fail(CMD, KVP_ERR(KVP_ENOMEM, "cannot start the engine thread"));
    } else {
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC, 0, NULL,
                             NULL, handle,
                             &sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED,
                             request_done, NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
        if (!d) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EIO, "cannot listen on %s:%d (in use, or not an address of this "
                                                    "machine)", o->host, o->port));
        } else {
            const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
            const int port = info ? info->port : o->port;
            fprintf(stderr, "kvpage serve: listening on http://%s:%d (model %s, %d KV blocks of %d tokens)\n", o->host,
                    port, sv.name, sv.cfg.num_blocks, sv.cfg.block_size);
            if (o->json) {
                char url[64];
                snprintf(url, sizeof url, "http://%s:%d", o->host, port);
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "url", url);
                cJSON_AddStringToObject(j, "model", sv.name);
                cJSON_AddNumberToObject(j, "num_blocks", sv.cfg.num_blocks);
                cJSON_AddNumberToObject(j, "block_size", sv.cfg.block_size);
                if (kvp_json_print(stdout, j) != KVP_OK) KVP_LOG_W("serve: cannot print the --json line");
                cJSON_Delete(j);
                fflush(stdout);
            }
            unsigned char sig = 0;
            while (read(g_sig_pipe[0], &sig, 1) < 0 && errno == EINTR) {}
            fprintf(stderr, "kvpage serve: signal %d, stopping\n", sig);
            MHD_quiesce_daemon(d); /* no new connections */
        }
        pthread_mutex_lock(&sv.mu);
        sv.stop = 1;
        pthread_cond_broadcast(&sv.wake);
        pthread_mutex_unlock(&sv.mu);
        pthread_join(engine, NULL); /* every request in flight has its answer (503) now */
        /* let the connections send those answers (stopping the daemon closes them mid-way), 5 s at most */
        for (int i = 0; d && i < 500; i++) {
            const union MHD_DaemonInfo *ci = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
            if (!ci || ci->num_connections == 0) break;
            usleep(10 * 1000);
        }
        if (d) MHD_stop_daemon(d);
    }
    if (piped) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        close(g_sig_pipe[0]);
        close(g_sig_pipe[1]);
        g_sig_pipe[0] = g_sig_pipe[1] = -1;
    }
    kvp_gen_session_destroy(sv.s);
    kvp_free(sv.own);
    kvp_free(sv.streams);
    pthread_cond_destroy(&sv.wake);
    pthread_mutex_destroy(&sv.mu);
    kvp_tok_destroy(sv.tok);
    kvp_model_destroy(sv.m);
    return rc;
}

int kvp_cmd_serve(int argc, char **argv)
{
    enum { O_TOK = 256, O_HOST, O_PORT, O_NAME, O_KVMEM, O_NB, O_BS, O_DT, O_CACHE, O_SEQS, O_BATCH, O_THREADS,
           O_MATMUL, O_JSON };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},        {"tokenizer", required_argument, 0, O_TOK},
        {"host", required_argument, 0, O_HOST},      {"port", required_argument, 0, O_PORT},
        {"served-model-name", required_argument, 0, O_NAME}, {"kv-mem", required_argument, 0, O_KVMEM},
        {"num-blocks", required_argument, 0, O_NB},  {"block-size", required_argument, 0, O_BS},
        {"kv-dtype", required_argument, 0, O_DT},    {"cache", required_argument, 0, O_CACHE},
        {"max-num-seqs", required_argument, 0, O_SEQS}, {"max-batched-tokens", required_argument, 0, O_BATCH},
        {"threads", required_argument, 0, O_THREADS}, {"matmul", required_argument, 0, O_MATMUL},
        {"json", no_argument, 0, O_JSON},            {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    serve_opts o = {.host = "127.0.0.1", .port = 8000, .threads = 1, .kv_mem = (int64_t)512 << 20,
                    .matmul = KVP_MATMUL_INVARIANT};
    kvp_gen_config cfg = kvp_gen_config_default();
    int c, li = -1;
    kvp_status st = KVP_OK;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":m:h", opts, &li)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_HOST: o.host = optarg; break;
        case O_PORT: st = kvp_parse_i32(optarg, 0, 65535, &o.port); break;
        case O_NAME: o.name = optarg; break;
        case O_KVMEM: st = kvp_parse_bytes(optarg, &o.kv_mem); break;
        case O_NB: st = kvp_parse_i32(optarg, 1, INT32_MAX / 2, &cfg.num_blocks); break;
        case O_BS: st = kvp_parse_i32(optarg, 1, 65536, &cfg.block_size); break;
        case O_DT: st = kvp_dtype_parse(optarg, &cfg.kv_dtype); break;
        case O_CACHE: st = kvp_pc_kind_parse(optarg, &cfg.cache); break;
        case O_SEQS: st = kvp_parse_i32(optarg, 1, 1 << 20, &cfg.max_num_seqs); break;
        case O_BATCH: st = kvp_parse_i32(optarg, 1, 1 << 24, &cfg.max_batched_tokens); break;
        case O_THREADS: st = kvp_parse_i32(optarg, 1, 1024, &o.threads); break;
        case O_MATMUL: st = kvp_matmul_kind_parse(optarg, &o.matmul); break;
        case O_JSON: o.json = 1; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(CMD, c, argv);
        }
        if (st != KVP_OK)
            return kvp_cli_usage_error(CMD, "--%s: %s", li >= 0 ? opts[li].name : "model", kvp_error_message());
        li = -1;
    }
    if (optind < argc) return kvp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!o.model) return kvp_cli_usage_error(CMD, "--model is required");
    if (o.name && (!o.name[0] || strlen(o.name) >= 256))
        return kvp_cli_usage_error(CMD, "--served-model-name must have 1 to 255 characters");
    return serve(&o, cfg);
}
