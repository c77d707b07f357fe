/* `kvpage serve` — an OpenAI-compatible HTTP server over the online generation session (runtime/engine/session.h).
 *
 *   HTTP thread (libmicrohttpd, event-driven)              engine thread (owns the session)
 *   -----------------------------------------------        -----------------------------------------
 *   parse JSON, tokenize, queue a job, suspend the   --->  add the queued jobs' prompts to the session
 *   connection                                             step (one batch of every running sequence)
 *   (resumed) decode, answer or send the new text    <---  hand each finished request (or a stream's new
 *                                                          text) to its job, resume its connection
 *
 * so requests from different connections share batches (continuous batching), and a request arriving while
 * others run joins them at the next step. One thread serves every connection: a connection waiting on the
 * engine is suspended (it costs nothing until resumed), not a blocked thread of its own. Endpoints: POST
 * /v1/completions, GET /v1/models, GET /health, GET /metrics (Prometheus text). Text to clients; logs to
 * stderr. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/log.h"
#include "common/parse.h"
#include "parallel/comm.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/engine_opts.h"
#include "runtime/text/chat.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/text/stop_text.h"
#include "runtime/model/model.h"
#include "runtime/text/reasoning.h"
#include "runtime/text/tokenizer.h"

static const char *const CMD = "serve";

enum {
    MAX_BODY = 1 << 20,
    MAX_PROMPTS = 256,
    MAX_STREAM = 64, /* choices of a streamed request */
    MAX_STOP = 16,   /* stop strings of a request */
    MAX_STOP_LEN = 256,
    MAX_STOP_IDS = 64,
    MAX_BIAS = 1024, /* logit_bias entries */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage serve --model PATH [options]\n\n"
            "Serves a Llama-family model (as `kvpage generate` runs it) over HTTP with OpenAI's completions API.\n"
            "Requests from every connection share the engine's batches (continuous batching); the prefix cache\n"
            "is shared across requests.\n\n"
            "  POST /v1/completions  {\"prompt\": TEXT | [TOKEN_ID, ...] | an array of either, \"max_tokens\": 16,\n"
            "                        \"temperature\": 1, \"top_p\": 1, \"top_k\": -1, \"min_p\": 0, \"n\": 1,\n"
            "                        \"seed\": N, \"stop\": TEXT | [TEXT, ...], \"stream\": false, \"logprobs\": K,\n"
            "                        \"echo\": false, ...}\n"
            "                        stream: server-sent events, as OpenAI's (stream_options: include_usage, vLLM's\n"
            "                        continuous_usage_stats); logprobs: each token's log-probability and the K\n"
            "                        (0..20) likeliest tokens; echo: the prompt's text first, with\n"
            "                        logprobs its tokens' too; also presence_penalty, frequency_penalty, logit_bias\n"
            "                        and vLLM's repetition_penalty, min_tokens, stop_token_ids, ignore_eos,\n"
            "                        include_stop_str_in_output, return_token_ids (prompt_token_ids and\n"
            "                        token_ids in each choice; streamed, the ids since the last event), priority\n"
            "                        (with --sched priority: lower first)\n"
            "  POST /v1/chat/completions  {\"messages\": [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": TEXT},\n"
            "                        ...], the fields above but prompt and echo; \"logprobs\": true, \"top_logprobs\": K}\n"
            "                        through the model's chat template, or --chat-template; max_tokens\n"
            "                        (default: to the end of the context, or of the KV cache if smaller)\n"
            "  GET  /v1/models       the served model\n"
            "  POST /tokenize        vLLM's: {\"prompt\": TEXT, \"add_special_tokens\": true} or {\"messages\": [...]}\n"
            "                        -> {\"count\", \"max_model_len\", \"tokens\"}\n"
            "  POST /detokenize      vLLM's: {\"tokens\": [TOKEN_ID, ...]} -> {\"prompt\": TEXT}\n"
            "  POST /reset_prefix_cache  vLLM's (SGLang's /flush_cache too): empties the prefix cache, before\n"
            "                        the requests that come after it -> {\"evicted_blocks\"}\n"
            "  GET  /health          200 while serving\n"
            "  GET  /metrics         Prometheus counters and gauges (requests, tokens, KV blocks, prefix hits)\n"
            "                        and latency histograms (time to first token, per output token, end to end)\n\n"
            "  --model PATH              a GGUF file or a Hugging Face folder\n"
            "  --tokenizer PATH          as for generate\n"
            "  --host ADDR               IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N                  TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --served-model-name NAME  the model's name in the API (default: the file or folder's name)\n"
            "  --chat-template NAME      llama2, mistral, zephyr, llama3, llama3.1, llama3.2, chatml, qwen2,\n"
            "                            qwen2.5, smollm2, mistral-v3, mistral-v3-tekken, mistral-v7,\n"
            "                            mistral-small-3, qwen3-thinking, deepseek-r1, gemma or gemma3\n"
            "                            (default: the one the model's own template is (GGUF\n"
            "                            tokenizer.chat_template, HF tokenizer_config.json); without one, chat\n"
            "                            requests get 400)\n"
            "  --reasoning-parser NAME   deepseek_r1 (vLLM's): a chat answer's text up to the first </think> (a\n"
            "                            leading <think> left out) is its message's reasoning_content, the rest its\n"
            "                            content (null while no </think> came); streamed as such deltas. For\n"
            "                            DeepSeek-R1 distills and Qwen3-Thinking-2507, whose prompts open the thought\n"
            "  --kv-mem BYTES            KV cache size (default 512MiB), or --num-blocks N\n"
            "  --num-blocks N            KV blocks (overrides --kv-mem)\n"
            "  --kv-dtype T              auto (default: the model's dtype, as for generate), f32, f16, bf16\n"
            "                            or fp8\n"
            "  --max-model-len N         prompt + generated tokens at most (vLLM's; default: the model's\n"
            "                            context, at most that); longer prompts get 400\n"
            "  --generation-config auto|vllm  auto (default): what a request leaves out of temperature, top_p,\n"
            "                            top_k, min_p, repetition_penalty and max_tokens is taken from the\n"
            "                            model's generation_config.json (max_new_tokens) or GGUF\n"
            "                            general.sampling.* keys, as vLLM's; vllm:\n"
            "                            from vLLM's defaults (1, 1, -1, 0, 1, 16) whatever the model says\n"
            "  --threads N               CPU threads (default 1)\n"
            "  --matmul invariant|blas   as for generate (default invariant)\n"
            "  --weight-dtype T          as for generate: auto (default), f32, f16, bf16 or q8_0\n"
            "  --max-connections N       open connections at most (default 4096)\n"
            "  --stream-interval N       a stream's new text is sent every N engine steps (its first at once,\n"
            "                            its last at the end; SGLang's): fewer events and wake-ups, higher\n"
            "                            throughput, burstier tokens (default 1)\n"
            "  --tp N                    tensor parallelism over N MPI ranks (default 1): run it as\n"
            "                            `mpirun -np N kvpage serve --tp N ...`; rank 0 serves HTTP and schedules,\n"
            "                            every rank holds 1/N of the heads and of the KV cache (--kv-mem is per rank)\n"
            "  --json                    print the listening address, the model, the KV blocks, the chat template,\n"
            "                            the held weight type and the pid (with --tp: rank 0's, the one to signal)\n"
            "                            as one JSON object on stdout\n"
            "  -h, --help                this help\n\n"
            "Stops on SIGINT or SIGTERM: requests in flight get 503, then the process exits 0.\n\n");
    kvp_session_config d = kvp_session_config_default();
    kvp_engine_opts_usage(f, &d.engine);
}

/* What the engine keeps of one choice of a streamed job or of a job with stop strings (under mu): its text,
 * decoded as its tokens come, cut where a stop string starts (or ends, when it is kept); streamed with
 * logprobs or return_token_ids, its tokens so far (n_toks), and with logprobs their log-probabilities (lp.n
 * of them, <= n_toks). */
typedef struct {
    kvp_stop_text t;
    size_t released; /* stream: bytes of t's text its reader may send (t.ready when last released) */
    int32_t *toks, n_toks;
    kvp_logprobs lp;
    size_t cap_toks, cap_lp, cap_ids, cap_lps;
} choice;

struct job;
typedef struct {
    struct job *j;
    int32_t i;
} prompt_ref; /* a session request's tag: its job and prompt */

/* One HTTP completion request: its prompts are session requests. Without streaming the handler waits until
 * all are back; with streaming the engine adds each choice's new text after every step and the response's
 * reader sends it as it comes. Choice c = prompt i, sample k: c = i * nsamples + k. */
typedef struct job {
    struct job *next; /* the queue */
    int32_t n, nsamples;
    kvp_session_request reqs[MAX_PROMPTS];
    int32_t *enc[MAX_PROMPTS]; /* tokenized prompts, owned */
    kvp_session_result res[MAX_PROMPTS];
    prompt_ref ref[MAX_PROMPTS];
    int32_t ids[MAX_PROMPTS]; /* session ids of the prompts added (the first `added`) */
    int32_t added;
    int32_t remaining; /* prompts added and not finished */
    int finished;      /* set by the engine thread when the handler may answer */
    int status;        /* 0, or the HTTP error to answer with err */
    char err[512];
    struct MHD_Connection *conn; /* its client's connection, suspended while it waits on the engine */
    int suspended;               /* (under mu) resumed by the engine when finished or (stream) new text */
    int stream;
    int refs;      /* the engine's and the handler's or response's (under mu; the last one frees) */
    int cancelled; /* the client left (under mu): the engine aborts the job's requests */
    int aborted;   /* engine thread: it did */
    char *stop[MAX_STOP]; /* stop strings, owned */
    size_t stop_len[MAX_STOP], stop_max;
    int nstop, include_stop, ignore_eos;
    kvp_stop_set stops; /* over stop[] */
    int32_t stop_ids[MAX_STOP_IDS + 1], n_stop_ids; /* + the chat template's end of turn */
    int32_t bias_ids[MAX_BIAS], n_bias; /* logit_bias */
    float bias[MAX_BIAS];
    int32_t logprobs; /* -1: none; else the top tokens listed at each place */
    int echo;
    int return_ids; /* vLLM's return_token_ids: each choice gives its prompt's and its own token ids */
    int include_usage, continuous_usage; /* stream_options: usage in a last event / in every event */
    int chat; /* /v1/chat/completions: messages in, chat.completion objects out */
    int reset_cache;       /* POST /reset_prefix_cache: no prompts; the engine empties the prefix cache */
    int64_t evicted;       /* and the blocks it dropped */
    char *ptext[MAX_PROMPTS]; /* echo: the prompts' text, owned */
    kvp_logprobs *eplp; /* [n] a streamed echo with logprobs: each prompt's log-probabilities once known */
    choice *ch; /* [n * nsamples] for a streamed job or one with stop strings, else NULL */
    int woken;    /* stream: its first text was released (engine thread, under mu) */
    int32_t held; /* stream: steps with new text since then (resumed every --stream-interval of them) */
} job;

/* A Prometheus histogram of seconds over the bounds k_lat_le (then +Inf): n[i] observations in bucket i
 * (not cumulative), their sum. Bounds from 100 us (a token of a tiny model on the CPU) to 1000 s. */
static const double k_lat_le[] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,  1,      2.5,  5,    10,     25,   50,   100,  250,   500,  1000};
#define NLAT ((int)(sizeof k_lat_le / sizeof k_lat_le[0]))
typedef struct {
    int64_t n[NLAT + 1];
    double sum;
} histo;

static void histo_add(histo *h, double x)
{
    int i = 0;
    while (i < NLAT && !(x <= k_lat_le[i])) i++;
    h->n[i]++;
    h->sum += x;
}

typedef struct {
    kvp_model *m;
    kvp_tokenizer *tok;
    kvp_chat_template chat;
    int reasoning; /* --reasoning-parser deepseek_r1: chat answers split at </think> (runtime/text/reasoning.h) */
    int32_t stream_interval; /* --stream-interval: a stream is resumed every N steps that extend it */
    char name[256];
    kvp_session_config cfg;
    kvp_sampling_defaults dflt; /* what a request leaves out: the model's generation_config.json, else vLLM's */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    job *head, *tail; /* queued, not yet added */
    int stop;
    int cancels; /* jobs cancelled since the engine last looked */
    /* engine thread only */
    kvp_session *s;
    kvp_comm *comm; /* the model's ranks (tp > 1: this is rank 0) */
    int tp;
    job **live; /* jobs added to the session and not finished (under mu too) */
    size_t cap_live;
    int32_t nlive;
    struct MHD_Connection **wake_list; /* streams this step resumes, once the lock is released (room for nlive) */
    size_t cap_wake;
    int32_t nwake;
    double last_scan; /* engine thread: when it last looked for clients gone (monotonic seconds) */
    /* under mu */
    kvp_session_stats stats;
    int64_t answered[3]; /* 2xx, 4xx, 5xx */
    int64_t cancelled;   /* requests whose client left before the answer */
    int64_t prompt_tokens, completion_tokens;
    histo ttft, tpot, e2e; /* per finished prompt, from the engine's taking it (kvp_session_result's times) */
    uint64_t next_seed, next_id;
    time_t started;
} server;

/* ---------------------------------------------------------------- tensor parallelism
 *
 * With --tp N, rank 0 runs the server and its engine; its executor broadcasts every step's plan and the other
 * ranks only execute it (kvp_cpu_follow; runtime/executor/tp_plan.h) until rank 0's session ends. */

static kvp_status sess_add(server *sv, const kvp_session_request *r, int32_t *id) { return kvp_session_add(sv->s, r, id); }

static void sess_stop(server *sv, int32_t id, int32_t k, int32_t n_keep) { (void)kvp_session_stop_at(sv->s, id, k, n_keep); }

static void sess_abort(server *sv, int32_t id) { (void)kvp_session_abort(sv->s, id); }

static kvp_status sess_reset_cache(server *sv, int64_t *evicted) { return kvp_session_reset_prefix_cache(sv->s, evicted); }

/* ---------------------------------------------------------------- engine thread */

static void job_free(job *j)
{
    for (int32_t i = 0; i < j->n; i++) {
        kvp_free(j->enc[i]);
        kvp_free(j->ptext[i]);
        if (j->eplp) kvp_logprobs_free(&j->eplp[i]);
        kvp_session_results_free(&j->res[i], 1);
    }
    for (int i = 0; i < j->nstop; i++) kvp_free(j->stop[i]);
    if (j->ch)
        for (int32_t c = 0; c < j->n * j->nsamples; c++) {
            choice *h = &j->ch[c];
            kvp_stop_text_free(&h->t);
            kvp_free(h->toks);
            kvp_logprobs_free(&h->lp);
        }
    kvp_free(j->ch);
    kvp_free(j->eplp);
    kvp_free(j);
}

/* Drops one reference to a job (caller holds mu); the last one frees it. */
static void job_release(job *j)
{
    if (--j->refs == 0) job_free(j);
}

/* Job j's connection if it waits suspended (caller holds mu), now no longer marked so: the caller resumes
 * it, at once or after unlocking. Only the engine resumes, and only a connection it saw suspended: MHD
 * forbids resuming one that is not, or one twice. */
static struct MHD_Connection *job_unsuspend(job *j)
{
    if (!j->suspended) return NULL;
    j->suspended = 0;
    return j->conn;
}

static void job_resume(job *j)
{
    struct MHD_Connection *c = job_unsuspend(j);
    if (c) MHD_resume_connection(c);
}

/* Job j waits on the engine (caller holds mu): its connection is suspended until job_resume. */
static void job_suspend(job *j, struct MHD_Connection *c)
{
    j->conn = c;
    j->suspended = 1;
    MHD_suspend_connection(c);
}

/* Ends job j (caller holds mu): answered with status/err unless 0. The engine lets go of the job here:
 * nothing of the engine refers to it after this. */
static void job_finish(server *sv, job *j, int status, const char *err)
{
    if (status && !j->status) {
        j->status = status;
        snprintf(j->err, sizeof j->err, "%s", err);
    }
    j->finished = 1;
    job_resume(j);
    for (int32_t i = 0; i < sv->nlive; i++)
        if (sv->live[i] == j) {
            sv->live[i] = sv->live[--sv->nlive];
            break;
        }
    job_release(j);
}

/* Adds a job's prompts to the session; one that is refused ends the job with 400 once the prompts already
 * added are back. A job whose client already left is not added. */
static void add_job(server *sv, job *j)
{
    int32_t added = 0;
    char err[512] = "";
    pthread_mutex_lock(&sv->mu);
    const int gone = j->cancelled;
    pthread_mutex_unlock(&sv->mu);
    kvp_status st = gone ? KVP_OK : kvp_grow((void **)&sv->live, &sv->cap_live, (size_t)sv->nlive + 1, sizeof *sv->live);
    if (!gone && st == KVP_OK && j->reset_cache) st = sess_reset_cache(sv, &j->evicted);
    if (!gone && st == KVP_OK)
        st = kvp_grow((void **)&sv->wake_list, &sv->cap_wake, (size_t)sv->nlive + 1, sizeof *sv->wake_list);
    for (int32_t i = 0; !gone && st == KVP_OK && i < j->n; i++) {
        j->ref[i] = (prompt_ref){j, i};
        j->reqs[i].user = &j->ref[i];
        if ((st = sess_add(sv, &j->reqs[i], &j->ids[i])) != KVP_OK) break;
        added++;
    }
    if (st != KVP_OK && j->reset_cache) snprintf(err, sizeof err, "resetting the prefix cache: %s", kvp_error_message());
    else if (st != KVP_OK) snprintf(err, sizeof err, "prompt %d: %s", added, kvp_error_message());
    pthread_mutex_lock(&sv->mu);
    j->added = added;
    if (added > 0) sv->live[sv->nlive++] = j; /* room made above */
    j->remaining = added;
    if (err[0]) {
        j->status = j->reset_cache ? 500 : 400;
        snprintf(j->err, sizeof j->err, "%s", err);
    }
    if (added == 0) job_finish(sv, j, 0, NULL);
    pthread_mutex_unlock(&sv->mu);
}

/* Ends every job in flight with status and err. */
static void fail_in_flight(server *sv, int status, const char *err)
{
    pthread_mutex_lock(&sv->mu);
    while (sv->nlive > 0) job_finish(sv, sv->live[sv->nlive - 1], status, err);
    pthread_mutex_unlock(&sv->mu);
}

/* Aborts the session requests of every job whose client left (their results still come back through take,
 * which ends the job). */
static void abort_cancelled(server *sv)
{
    pthread_mutex_lock(&sv->mu);
    for (int32_t x = 0; x < sv->nlive; x++) {
        job *j = sv->live[x];
        if (!j->cancelled || j->aborted) continue;
        j->aborted = 1;
        for (int32_t i = 0; i < j->added; i++) sess_abort(sv, j->ids[i]); /* finished ones: nothing */
    }
    pthread_mutex_unlock(&sv->mu);
}

/* A streamed choice's tokens (with logprobs or return_token_ids) up to the n known; an allocation that fails
 * is tried again with the next tokens. */
static void keep_tokens(choice *h, const int32_t *tokens, int32_t n)
{
    if (n <= h->n_toks || kvp_grow((void **)&h->toks, &h->cap_toks, (size_t)n, sizeof *h->toks) != KVP_OK) return;
    memcpy(h->toks + h->n_toks, tokens + h->n_toks, (size_t)(n - h->n_toks) * sizeof *tokens);
    h->n_toks = n;
}

/* And the log-probabilities lp of its kept tokens (a streamed job with logprobs), as keep_tokens. */
static void keep_logprobs(choice *h, const kvp_logprobs *lp)
{
    kvp_logprobs *a = &h->lp;
    const int32_t to = h->n_toks < lp->n ? h->n_toks : lp->n; /* places whose token is kept */
    const size_t k = (size_t)lp->k;
    if (to <= a->n || kvp_grow((void **)&a->lp, &h->cap_lp, (size_t)to, sizeof *a->lp) != KVP_OK ||
        kvp_grow((void **)&a->top_ids, &h->cap_ids, (size_t)to * k + 1, sizeof *a->top_ids) != KVP_OK ||
        kvp_grow((void **)&a->top_lps, &h->cap_lps, (size_t)to * k + 1, sizeof *a->top_lps) != KVP_OK)
        return;
    const size_t from = (size_t)a->n, cnt = (size_t)to - from;
    memcpy(a->lp + from, lp->lp + from, cnt * sizeof *a->lp);
    if (k) {
        memcpy(a->top_ids + from * k, lp->top_ids + from * k, cnt * k * sizeof *a->top_ids);
        memcpy(a->top_lps + from * k, lp->top_lps + from * k, cnt * k * sizeof *a->top_lps);
    }
    a->k = lp->k;
    a->n = to;
}

/* Adds tokens[.., n) of choice c of job j (caller holds mu) to its text (stop_text.h); a stop string found
 * ends the sample (kvp_session_stop). lp (NULL: none): the tokens' log-probabilities, kept for a stream.
 * Returns 1 when the text changed. */
static int track_choice(server *sv, job *j, int32_t c, const int32_t *tokens, int32_t n, const kvp_logprobs *lp)
{
    choice *h = &j->ch[c];
    const kvp_session_request *r = &j->reqs[c / j->nsamples];
    const int had = h->t.stop;
    const int grew = kvp_stop_text_add(&h->t, &j->stops, sv->tok, r->prompt[r->n_prompt - 1], tokens, n);
    if (h->t.stop && !had) /* after the final tokens: nothing; a speculative step may have added tokens after it */
        sess_stop(sv, j->ids[c / j->nsamples], c % j->nsamples, h->t.ntok);
    if (h->t.stop && n > h->t.ntok) n = h->t.ntok;
    if (j->stream && (lp || j->return_ids)) keep_tokens(h, tokens, n);
    if (j->stream && lp) keep_logprobs(h, lp);
    return grew;
}

/* A streamed echo with logprobs (caller holds mu): prompt i's log-probabilities, kept once they are all known
 * (lp NULL or incomplete: not yet); an allocation that fails is tried again later. */
static void keep_prompt_logprobs(job *j, int32_t i, const kvp_logprobs *lp)
{
    if (j->eplp[i].n == 0 && lp && lp->n >= j->reqs[i].n_prompt && kvp_logprobs_copy(lp, &j->eplp[i]) != KVP_OK)
        kvp_error_clear();
}

/* After a step: the new tokens of every tracked choice go into its text (caller holds mu), and readers that
 * have something new to send are woken. */
static void track_progress(server *sv)
{
    for (int32_t x = 0; x < sv->nlive; x++) {
        job *j = sv->live[x];
        if (!j->ch) continue;
        int grew = 0;
        for (int32_t i = 0; i < j->added; i++) {
            const kvp_logprobs *plp = NULL;
            if (j->eplp && kvp_session_prompt_logprobs(sv->s, j->ids[i], &plp) == KVP_OK) keep_prompt_logprobs(j, i, plp);
            for (int32_t k = 0; k < j->nsamples; k++) {
                const int32_t *t;
                int32_t n;
                const kvp_logprobs *lp = NULL;
                if (j->logprobs >= 0 && kvp_session_partial_logprobs(sv->s, j->ids[i], k, &lp) != KVP_OK) lp = NULL;
                if (kvp_session_partial(sv->s, j->ids[i], k, &t, &n) == KVP_OK)
                    grew |= track_choice(sv, j, i * j->nsamples + k, t, n, lp);
            }
        }
        if (grew && j->stream && (!j->woken || ++j->held >= sv->stream_interval)) {
            /* its first text at once (time to first token), then every stream_interval steps: each event
             * costs the HTTP thread the lock, a JSON object and a write, with hundreds of streams per step */
            for (int32_t c = 0; c < j->n * j->nsamples; c++) j->ch[c].released = j->ch[c].t.ready;
            struct MHD_Connection *c = job_unsuspend(j);
            if (c) sv->wake_list[sv->nwake++] = c;
            j->woken = 1;
            j->held = 0;
        }
    }
}

static int client_gone(struct MHD_Connection *c);
static void cancel_job(server *sv, job *j);

/* Every quarter of a second: a job waiting suspended whose client has closed its connection is cancelled
 * (its connection is resumed when the engine has aborted it, and then closed). MHD does not watch a
 * suspended connection, so the engine looks. */
static void look_for_gone_clients(server *sv)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double t = (double)now.tv_sec + now.tv_nsec * 1e-9;
    if (t - sv->last_scan < 0.25) return;
    sv->last_scan = t;
    pthread_mutex_lock(&sv->mu);
    for (int32_t x = 0; x < sv->nlive; x++)
        if (sv->live[x]->suspended && client_gone(sv->live[x]->conn)) cancel_job(sv, sv->live[x]);
    pthread_mutex_unlock(&sv->mu);
}

static void *engine_main(void *arg)
{
    server *sv = arg;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        while (!sv->stop && !sv->head && !sv->cancels && !kvp_session_pending(sv->s))
            pthread_cond_wait(&sv->wake, &sv->mu);
        job *q = sv->stop ? NULL : sv->head;
        if (!sv->stop) sv->head = sv->tail = NULL;
        const int stop = sv->stop, cancels = sv->cancels;
        sv->cancels = 0;
        pthread_mutex_unlock(&sv->mu);
        if (stop) break;
        if (cancels) abort_cancelled(sv);
        while (q) {
            job *next = q->next;
            add_job(sv, q);
            q = next;
        }
        kvp_status st = kvp_session_step(sv->s);
        if (st != KVP_OK && sv->tp > 1) { /* the ranks' sessions cannot start again together */
            KVP_LOG_E("serve: the engine failed on rank 0: %s; ending the job", kvp_error_message());
            kvp_comm_abort(sv->comm, KVP_EXIT_FAIL);
        }
        if (st != KVP_OK) { /* the session is unusable: answer what it held, start a new one */
            char err[512];
            snprintf(err, sizeof err, "the engine failed: %s", kvp_error_message());
            KVP_LOG_E("serve: %s", err);
            fail_in_flight(sv, 500, err);
            kvp_session_destroy(sv->s);
            sv->s = NULL;
            if (kvp_cpu_session_create(sv->m, &sv->cfg, &sv->s) != KVP_OK) {
                KVP_LOG_E("serve: cannot start a new session: %s", kvp_error_message());
                pthread_mutex_lock(&sv->mu);
                sv->stop = 1;
                pthread_mutex_unlock(&sv->mu);
                break;
            }
            continue;
        }
        pthread_mutex_lock(&sv->mu); /* before any answer: a client that reads /metrics next sees this step */
        sv->nwake = 0;
        track_progress(sv);
        kvp_session_stats_get(sv->s, &sv->stats);
        pthread_mutex_unlock(&sv->mu);
        /* resumed after the unlock, not into a lock the engine still holds; a suspended connection stays
         * open, and no one else resumes these (their jobs' flags are cleared) */
        for (int32_t i = 0; i < sv->nwake; i++) MHD_resume_connection(sv->wake_list[i]);
        look_for_gone_clients(sv);
        int32_t id;
        kvp_session_result res;
        while ((st = kvp_session_take(sv->s, &id, &res)) == KVP_OK) {
            const prompt_ref *o = res.user;
            job *j = o->j;
            pthread_mutex_lock(&sv->mu);
            histo_add(&sv->ttft, res.ttft_s);
            histo_add(&sv->e2e, res.finish_s);
            int32_t most = 0; /* tokens of the prompt's longest sample: tpot needs two or more */
            for (int32_t k = 0; k < res.n_samples; k++) most = res.n_tokens[k] > most ? res.n_tokens[k] : most;
            if (most > 1) histo_add(&sv->tpot, res.tpot_s);
            j->res[o->i] = res;
            if (j->eplp) keep_prompt_logprobs(j, o->i, &res.prompt_logprobs);
            for (int32_t k = 0; j->ch && k < res.n_samples; k++) /* what no step showed (a failed decode) */
                track_choice(sv, j, o->i * j->nsamples + k, res.tokens[k], res.n_tokens[k],
                             res.logprobs ? &res.logprobs[k] : NULL);
            if (--j->remaining == 0) job_finish(sv, j, 0, NULL);
            pthread_mutex_unlock(&sv->mu);
        }
        if (st != KVP_ENOTFOUND) KVP_LOG_E("serve: collecting a result: %s", kvp_error_message());
    }
    /* stopping: everything queued or in flight gets 503; the other ranks stop too */
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
    struct job *j; /* a completion waiting (suspended) for its answer: the handler's reference */
    uint64_t id;
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
    static const char *const keys[] = {"suffix"};
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

/* A boolean field, 0 when absent or null; -1 and err set when it is something else. */
static int get_bool(const cJSON *req, const char *k, char *err, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, k);
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) return snprintf(err, cap, "\"%s\" must be true or false", k), -1;
    return cJSON_IsTrue(v);
}

/* The stop conditions: "stop" (a string or an array of strings; the text ends before the first one found,
 * or after it with "include_stop_str_in_output"), "stop_token_ids" (vLLM's: tokens that end a sample as
 * EOS does), "ignore_eos". 0, or 400 with err. */
static int get_stop(const cJSON *req, int32_t vocab, job *j, char *err, size_t cap)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (st && !cJSON_IsNull(st)) {
        const int one = cJSON_IsString(st);
        if (!one && !(cJSON_IsArray(st) && cJSON_GetArraySize(st) <= MAX_STOP))
            return snprintf(err, cap, "\"stop\" must be a string or an array of at most %d strings", MAX_STOP), 400;
        for (const cJSON *x = one ? st : st->child; x; x = one ? NULL : x->next) {
            const size_t len = cJSON_IsString(x) ? strlen(x->valuestring) : 0;
            if (len < 1 || len > MAX_STOP_LEN)
                return snprintf(err, cap, "\"stop\" item %d is not a string of 1 to %d bytes", j->nstop, MAX_STOP_LEN), 400;
            if (!(j->stop[j->nstop] = kvp_malloc(len + 1))) return snprintf(err, cap, "out of memory"), 500;
            memcpy(j->stop[j->nstop], x->valuestring, len + 1);
            j->stop_len[j->nstop++] = len;
            j->stop_max = len > j->stop_max ? len : j->stop_max;
        }
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(req, "stop_token_ids");
    if (ids && !cJSON_IsNull(ids)) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) > MAX_STOP_IDS)
            return snprintf(err, cap, "\"stop_token_ids\" must be an array of at most %d token ids", MAX_STOP_IDS), 400;
        const cJSON *x;
        cJSON_ArrayForEach(x, ids) {
            const double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (!(v >= 0 && v < vocab && v == (double)(int32_t)v))
                return snprintf(err, cap, "\"stop_token_ids\" item %d is not a token id in [0, %d)", j->n_stop_ids,
                                vocab), 400;
            j->stop_ids[j->n_stop_ids++] = (int32_t)v;
        }
    }
    j->ignore_eos = get_bool(req, "ignore_eos", err, cap);
    j->include_stop = get_bool(req, "include_stop_str_in_output", err, cap);
    return j->ignore_eos < 0 || j->include_stop < 0 ? 400 : 0;
}

static char *dup_str(const char *t)
{
    char *d = kvp_malloc(strlen(t) + 1);
    return d ? strcpy(d, t) : NULL;
}

/* OpenAI's "logit_bias": {"token id": bias in [-100, 100], ...}. 0, or 400 with err. */
static int get_logit_bias(const cJSON *req, int32_t vocab, job *j, char *err, size_t cap)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(req, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb) || cJSON_GetArraySize(lb) > MAX_BIAS)
        return snprintf(err, cap, "\"logit_bias\" must be an object of at most %d token ids", MAX_BIAS), 400;
    for (const cJSON *x = lb->child; x; x = x->next) {
        char *end;
        const long id = strtol(x->string, &end, 10);
        if (end == x->string || *end || id < 0 || id >= vocab)
            return snprintf(err, cap, "\"logit_bias\" key \"%.40s\" is not a token id in [0, %d)", x->string, vocab), 400;
        if (!cJSON_IsNumber(x) || !(fabs(x->valuedouble) <= 100))
            return snprintf(err, cap, "\"logit_bias\" of token %ld must be a number in [-100, 100]", id), 400;
        j->bias_ids[j->n_bias] = (int32_t)id;
        j->bias[j->n_bias++] = (float)x->valuedouble;
    }
    return 0;
}

/* OpenAI's "stream_options" (with "stream" only): "include_usage" (a last event with the usage and no
 * choices) and vLLM's "continuous_usage_stats" (the usage so far in every event). 0, or 400 with err. */
static int get_stream_options(const cJSON *req, job *j, char *err, size_t cap)
{
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
    if (!so || cJSON_IsNull(so)) return 0;
    if (!j->stream) return snprintf(err, cap, "\"stream_options\" needs \"stream\": true"), 400;
    if (!cJSON_IsObject(so)) return snprintf(err, cap, "\"stream_options\" must be an object"), 400;
    for (const cJSON *x = so->child; x; x = x->next)
        if (strcmp(x->string, "include_usage") != 0 && strcmp(x->string, "continuous_usage_stats") != 0)
            return snprintf(err, cap, "\"stream_options\" has no option \"%s\"", x->string), 400;
    j->include_usage = get_bool(so, "include_usage", err, cap);
    j->continuous_usage = get_bool(so, "continuous_usage_stats", err, cap);
    return j->include_usage < 0 || j->continuous_usage < 0 ? 400 : 0;
}

/* The prompts of a completion request ("prompt": a string, an array of token ids, or an array of either),
 * tokenized into j->enc[], j->reqs[].prompt / n_prompt and j->n; with echo their text too. 0, or the HTTP
 * error with err. */
static int read_prompts(server *sv, const cJSON *req, job *j, char *err, size_t cap)
{
    const int32_t V = (int32_t)kvp_model_cfg(sv->m)->vocab_size, maxlen = kvp_model_max_len(sv->m);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    const int one = cJSON_IsString(p) || (cJSON_IsArray(p) && cJSON_IsNumber(p->child));
    const int32_t np = one ? 1 : cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (np < 1 || np > MAX_PROMPTS) {
        snprintf(err, cap, "\"prompt\" must be a string, an array of token ids, or an array of 1 to %d of either",
                 MAX_PROMPTS);
        return 400;
    }
    const cJSON *x = one ? p : p->child;
    for (int32_t i = 0; i < np; i++, x = one ? NULL : x->next) {
        int32_t len = 0;
        if (cJSON_IsArray(x)) {
            len = cJSON_GetArraySize(x);
            if (len < 1 || len >= maxlen)
                return snprintf(err, cap, "prompt %d is %d tokens, the model's context is %d", i, len, maxlen), 400;
            j->enc[i] = kvp_malloc((size_t)len * sizeof(int32_t));
            if (!j->enc[i]) return snprintf(err, cap, "out of memory"), 500;
            j->n = i + 1;
            int32_t t = 0;
            const cJSON *y;
            cJSON_ArrayForEach(y, x) { /* linear: cJSON_GetArrayItem walks the list from its head */
                const double v = cJSON_IsNumber(y) ? y->valuedouble : -1;
                if (!(v >= 0 && v < V && v == (double)(int32_t)v))
                    return snprintf(err, cap, "prompt %d: token %d is not a token id in [0, %d)", i, t, V), 400;
                j->enc[i][t++] = (int32_t)v;
            }
        } else if (cJSON_IsString(x)) {
            if (kvp_tok_encode_ex(sv->tok, x->valuestring, strlen(x->valuestring), KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL,
                                  &j->enc[i], &len) != KVP_OK)
                return snprintf(err, cap, "prompt %d: %s", i, kvp_error_message()), 400;
            j->n = i + 1;
            if (len >= maxlen) return snprintf(err, cap, "prompt %d is %d tokens, the model's context is %d", i, len, maxlen), 400;
        } else {
            return snprintf(err, cap, "\"prompt\" item %d is not a string or an array of token ids", i), 400;
        }
        if (j->echo && (cJSON_IsArray(x) ? kvp_tok_decode(sv->tok, -1, j->enc[i], len, &j->ptext[i]) != KVP_OK
                                         : !(j->ptext[i] = dup_str(x->valuestring))))
            return snprintf(err, cap, "out of memory"), 500;
        j->reqs[i].prompt = j->enc[i];
        j->reqs[i].n_prompt = len;
    }
    return 0;
}

/* The "messages" of req rendered by the server's chat template (a content is a string or an array of
 * {"type": "text", "text": ...} parts, joined) into token ids *ids (owned) and *len. 0, or 400/500 with err. */
static int render_messages(server *sv, const cJSON *req, int32_t **ids, int32_t *len, char *err, size_t cap)
{
    if (sv->chat == KVP_CHAT_NONE) {
        char names[256];
        kvp_chat_template_list(names, sizeof names);
        return snprintf(err, cap, "the model has no chat template this server knows: start it with --chat-template "
                                  "NAME (%s), or use /v1/completions", names), 400;
    }
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(req, "messages");
    const int32_t n = cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : 0;
    if (n < 1 || n > 1024) return snprintf(err, cap, "\"messages\" must be an array of 1 to 1024 messages"), 400;
    kvp_chat_msg *m = kvp_calloc((size_t)n, sizeof *m);
    char **joined = kvp_calloc((size_t)n, sizeof *joined);
    int code = m && joined ? 0 : (snprintf(err, cap, "out of memory"), 500);
    int32_t i = 0;
    for (const cJSON *x = ms->child; !code && x; x = x->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role"), *content = cJSON_GetObjectItemCaseSensitive(x, "content");
        m[i].role = cJSON_IsString(role) ? role->valuestring : NULL;
        if (cJSON_IsString(content)) {
            m[i].content = content->valuestring;
            continue;
        }
        size_t len = 0; /* text parts */
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(t)) {
                code = (snprintf(err, cap, "message %d: only text content parts are supported", i), 400);
                break;
            }
            len += strlen(t->valuestring);
        }
        if (code) break;
        if (!cJSON_IsArray(content)) {
            code = (snprintf(err, cap, "message %d: \"content\" must be a string or an array of text parts", i), 400);
            break;
        }
        if (!(joined[i] = kvp_malloc(len + 1))) {
            code = (snprintf(err, cap, "out of memory"), 500);
            break;
        }
        joined[i][0] = '\0';
        cJSON_ArrayForEach(part, content) strcat(joined[i], cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
        m[i].content = joined[i];
    }
    const cJSON *ag = cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt"); /* vLLM's, default true */
    const int agp = !ag || cJSON_IsNull(ag) ? 1 : get_bool(req, "add_generation_prompt", err, cap);
    if (!code && agp < 0) code = 400;
    if (!code && kvp_chat_render_ids(sv->chat, sv->tok, m, n, agp, ids, len) != KVP_OK)
        code = (snprintf(err, cap, "%s", kvp_error_message()), 400);
    for (i = 0; joined && i < n; i++) kvp_free(joined[i]);
    kvp_free(joined);
    kvp_free(m);
    return code;
}

/* The prompt of a chat request (render_messages) in j->enc[0]. 0, or the HTTP error with err. */
static int read_messages(server *sv, const cJSON *req, job *j, char *err, size_t cap)
{
    int32_t len = 0;
    const int code = render_messages(sv, req, &j->enc[0], &len, err, cap);
    if (code) return code;
    j->n = 1;
    const int32_t maxlen = kvp_model_max_len(sv->m);
    if (len >= maxlen) return snprintf(err, cap, "the conversation is %d tokens, the model's context is %d", len, maxlen), 400;
    j->reqs[0].prompt = j->enc[0];
    j->reqs[0].n_prompt = len;
    return 0;
}

/* Builds the job of a completion request (or of a chat request, j->chat): its prompts tokenized, its
 * sampling parameters checked. */
static int build_job(server *sv, const cJSON *req, job *j, char *err, size_t cap)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, sv->name) != 0)) {
        snprintf(err, cap, "The model `%s` does not exist (this server serves `%s`).",
                 cJSON_IsString(model) ? model->valuestring : "?", sv->name);
        return 404;
    }
    if (unsupported(req, err, cap)) return 400;
    if (cJSON_GetObjectItemCaseSensitive(req, j->chat ? "prompt" : "messages"))
        return snprintf(err, cap, j->chat ? "\"prompt\" is for /v1/completions: a chat request has \"messages\""
                                          : "\"messages\" is for /v1/chat/completions: a completion has a \"prompt\""), 400;
    double max_tokens, temperature, top_p, min_p, top_k, n, seed, best_of, logprobs = -1, presence, frequency, repetition,
        min_tokens, priority;
    const kvp_sampling_defaults *d = &sv->dflt;
    /* A chat answer with no max_tokens runs to the end of the context (vLLM's, OpenAI's), or to the model's
     * max_new_tokens if sooner: -1 until the prompt's length is known. A completion's default is 16 (OpenAI's),
     * or the model's max_new_tokens. */
    const double max_dflt = j->chat ? -1 : (double)d->max_tokens;
    if (!get_num(req, "max_tokens", max_dflt, 0, 1 << 24, 1, &max_tokens, err, cap) ||
        (j->chat && !get_num(req, "max_completion_tokens", max_tokens, 0, 1 << 24, 1, &max_tokens, err, cap)) ||
        !get_num(req, "temperature", d->temperature, 0, 1e6, 0, &temperature, err, cap) ||
        !get_num(req, "top_p", d->top_p, 1e-9, 1, 0, &top_p, err, cap) ||
        !get_num(req, "min_p", d->min_p, 0, 1, 0, &min_p, err, cap) ||
        !get_num(req, "top_k", (double)d->top_k, -1, INT32_MAX, 1, &top_k, err, cap) ||
        !get_num(req, "n", 1, 1, 1000, 1, &n, err, cap) || !get_num(req, "seed", -1, 0, 9007199254740991.0, 1, &seed, err, cap) ||
        !get_num(req, "best_of", n, n, n, 1, &best_of, err, cap) ||
        !get_num(req, "presence_penalty", 0, -2, 2, 0, &presence, err, cap) ||
        !get_num(req, "frequency_penalty", 0, -2, 2, 0, &frequency, err, cap) ||
        !get_num(req, "repetition_penalty", d->repetition_penalty, 1e-6, 10, 0, &repetition, err, cap) ||
        !get_num(req, "min_tokens", 0, 0, max_tokens < 0 ? 1 << 24 : max_tokens, 1, &min_tokens, err, cap) ||
        !get_num(req, "priority", 0, INT32_MIN, INT32_MAX, 1, &priority, err, cap) ||
        (!j->chat && !get_num(req, "logprobs", -1, 0, KVP_MAX_TOP_LOGPROBS, 1, &logprobs, err, cap)))
        return 400;
    j->logprobs = (int32_t)logprobs;
    if (priority != 0 && sv->cfg.engine.sched != KVP_SCHED_PRIORITY)
        return snprintf(err, cap, "\"priority\" needs a server started with --sched priority"), 400;
    int code;
    if ((j->stream = get_bool(req, "stream", err, cap)) < 0 || (j->echo = get_bool(req, "echo", err, cap)) < 0 ||
        (j->return_ids = get_bool(req, "return_token_ids", err, cap)) < 0)
        return 400;
    if (j->chat) { /* a chat's logprobs is a flag, with top_logprobs; echo is no chat field */
        const int lp = get_bool(req, "logprobs", err, cap);
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(req, "top_logprobs");
        if (lp < 0 || !get_num(req, "top_logprobs", 0, 0, KVP_MAX_TOP_LOGPROBS, 1, &logprobs, err, cap)) return 400;
        if (!lp && top && !cJSON_IsNull(top)) return snprintf(err, cap, "\"top_logprobs\" needs \"logprobs\": true"), 400;
        if (j->echo) return snprintf(err, cap, "\"echo\" is not supported on /v1/chat/completions"), 400;
        j->logprobs = lp ? (int32_t)logprobs : -1;
    }

    if ((code = get_stream_options(req, j, err, cap))) return code;
    const int32_t V = (int32_t)kvp_model_cfg(sv->m)->vocab_size;
    if ((code = get_stop(req, V, j, err, cap)) || (code = get_logit_bias(req, V, j, err, cap))) return code;
    if (j->chat && !j->ignore_eos) { /* a reply ends at the template's end of turn (<|eot_id|>, <|im_end|>) */
        const int32_t eot = kvp_chat_end_of_turn(sv->chat, sv->tok);
        int have = eot < 0 || kvp_model_is_eos(sv->m, eot);
        for (int32_t i = 0; i < j->n_stop_ids; i++) have |= j->stop_ids[i] == eot;
        if (!have) j->stop_ids[j->n_stop_ids++] = eot;
    }
    j->stops = (kvp_stop_set){.stop = j->stop, .stop_len = j->stop_len, .nstop = j->nstop, .stop_max = j->stop_max,
                              .include = j->include_stop, .min_tokens = (int32_t)min_tokens};
    j->nsamples = (int32_t)n;
    if ((code = j->chat ? read_messages(sv, req, j, err, cap) : read_prompts(sv, req, j, err, cap))) return code;
    if (max_tokens < 0) { /* the room one sequence has: the context, or the whole KV cache when that is smaller */
        const int64_t cache = (int64_t)sv->cfg.num_blocks * sv->cfg.engine.block_size, ctx = kvp_model_max_len(sv->m);
        max_tokens = (double)((cache < ctx ? cache : ctx) - j->reqs[0].n_prompt);
        if (d->given & KVP_SAMPLING_MAX_TOKENS && (double)d->max_tokens < max_tokens) max_tokens = (double)d->max_tokens;
        if (max_tokens < 1 || min_tokens > max_tokens)
            return snprintf(err, cap, "the conversation is %d tokens, which leaves %.0f for the answer (min_tokens %.0f)",
                            j->reqs[0].n_prompt, max_tokens, min_tokens), 400;
    }
    if (j->stream && j->n * (int32_t)n > MAX_STREAM)
        return snprintf(err, cap, "a streamed request has at most %d choices (prompts x n)", MAX_STREAM), 400;
    uint64_t base_seed;
    pthread_mutex_lock(&sv->mu);
    base_seed = seed >= 0 ? (uint64_t)seed : sv->next_seed++ * 1000003u; /* no seed: a new one per request */
    pthread_mutex_unlock(&sv->mu);
    for (int32_t i = 0; i < j->n; i++) {
        kvp_session_request *r = &j->reqs[i];
        r->max_tokens = (int32_t)max_tokens;
        r->min_tokens = (int32_t)min_tokens;
        r->n = (int32_t)n;
        r->sampler = (kvp_sampler_params){.temperature = temperature, .top_k = top_k < 0 ? 0 : (int32_t)top_k,
                                          .top_p = top_p, .min_p = min_p, .seed = base_seed + (uint64_t)i,
                                          .presence_penalty = (float)presence, .frequency_penalty = (float)frequency,
                                          .repetition_penalty = (float)repetition};
        r->bias_ids = j->n_bias ? j->bias_ids : NULL;
        r->bias = j->n_bias ? j->bias : NULL;
        r->n_bias = j->n_bias;
        r->stop_ids = j->n_stop_ids ? j->stop_ids : NULL;
        r->n_stop_ids = j->n_stop_ids;
        r->ignore_eos = j->ignore_eos;
        r->logprobs = j->logprobs >= 0;
        r->prompt_logprobs = j->logprobs >= 0 && j->echo;
        r->priority = (int32_t)priority;
        r->top_logprobs = j->logprobs >= 0 ? j->logprobs : 0;
    }
    if (j->stream || j->nstop > 0) { /* the engine keeps these choices' text */
        j->ch = kvp_calloc((size_t)j->n * (size_t)j->nsamples, sizeof *j->ch);
        if (!j->ch) return snprintf(err, cap, "out of memory"), 500;
    }
    if (j->stream && j->echo && j->logprobs >= 0 && !(j->eplp = kvp_calloc((size_t)j->n, sizeof *j->eplp)))
        return snprintf(err, cap, "out of memory"), 500;
    return 0;
}

/* Job j's prompt tokens and the tokens it generated so far: its results' once it is finished, else its
 * streamed choices' (caller holds mu then). */
static void job_tokens(const job *j, int64_t *p, int64_t *g)
{
    *p = *g = 0;
    for (int32_t i = 0; i < j->n; i++) {
        *p += j->reqs[i].n_prompt;
        for (int32_t k = 0; k < j->nsamples; k++)
            *g += j->finished ? (k < j->res[i].n_samples ? j->res[i].n_tokens[k] : 0)
                              : j->ch ? j->ch[i * j->nsamples + k].t.ntok : 0;
    }
}

/* Adds an answered job's prompt and generated tokens to the metrics. */
static void count_tokens(server *sv, const job *j)
{
    int64_t p, g;
    job_tokens(j, &p, &g);
    pthread_mutex_lock(&sv->mu);
    sv->prompt_tokens += p;
    sv->completion_tokens += g;
    pthread_mutex_unlock(&sv->mu);
}

/* A completion object's head (the whole answer's, or a streamed event's): id, object, created, model. */
static cJSON *completion_head(const server *sv, const job *j, uint64_t id, time_t created)
{
    cJSON *o = cJSON_CreateObject();
    char idbuf[40];
    snprintf(idbuf, sizeof idbuf, "%s-%llu", j->chat ? "chatcmpl" : "cmpl", (unsigned long long)id);
    cJSON_AddStringToObject(o, "id", idbuf);
    cJSON_AddStringToObject(o, "object", !j->chat ? "text_completion" : j->stream ? "chat.completion.chunk"
                                                                                    : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", sv->name);
    return o;
}

/* Choice c's finish_reason, and vLLM's stop_reason: the stop string or stop token id that ended it, else
 * null. */
static void add_finish(cJSON *o, const job *j, int32_t c)
{
    const kvp_session_result *r = &j->res[c / j->nsamples];
    const int32_t k = c % j->nsamples;
    const int stop = j->ch ? j->ch[c].t.stop : 0;
    const kvp_finish_reason f = k < r->n_samples ? r->finish[k] : KVP_FINISH_LENGTH;
    cJSON_AddStringToObject(o, "finish_reason", stop || f != KVP_FINISH_LENGTH ? "stop" : "length");
    if (stop) kvp_json_add_text(o, "stop_reason", j->stop[stop - 1]);
    else if (f == KVP_FINISH_STOP_TOKEN) cJSON_AddNumberToObject(o, "stop_reason", r->stop_token[k]);
    else cJSON_AddNullToObject(o, "stop_reason");
}

/* The text of token id after token prev for a logprobs object: its bytes when they are valid UTF-8, else
 * "bytes:\xNN..." (OpenAI's form for a part of a character); a control token (BOS) is its piece. *chars: the
 * characters (code points) it adds to the decoded text. */
static void token_text(const server *sv, int32_t prev, int32_t id, char *out, size_t cap, long *chars)
{
    char b[512];
    int n = kvp_tok_decode_piece(sv->tok, prev, id, b, sizeof b - 1);
    n = n < 0 ? 0 : n;
    b[n] = '\0';
    *chars = 0;
    for (int i = 0; i < n; i++) *chars += ((unsigned char)b[i] & 0xC0) != 0x80;
    size_t plen = 0;
    const char *piece = kvp_tok_type_of(sv->tok, id) == KVP_TOK_CONTROL ? kvp_tok_piece(sv->tok, id, &plen) : NULL;
    if (piece && n == 0 && plen < cap) {
        memcpy(out, piece, plen);
        out[plen] = '\0';
    } else if (kvp_utf8_valid(b) && (size_t)n == strlen(b)) {
        snprintf(out, cap, "%s", b);
    } else {
        size_t o = (size_t)snprintf(out, cap, "bytes:");
        for (int i = 0; i < n && o + 5 <= cap; i++) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", (unsigned char)b[i]);
    }
}

/* A log-probability as JSON: null for none (NaN), -9999 for -inf (as vLLM). */
static cJSON *lp_number(float lp)
{
    return isnan(lp) ? cJSON_CreateNull() : cJSON_CreateNumber(isinf(lp) ? -9999.0 : (double)lp);
}

/* One token of a chat logprobs list: its text (as in token_text), log-probability and bytes. */
static cJSON *chat_token(const server *sv, int32_t prev, int32_t id, float lp)
{
    char s[2048], b[512];
    long chars;
    token_text(sv, prev, id, s, sizeof s, &chars);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", s);
    cJSON_AddItemToObject(o, "logprob", lp_number(lp));
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    const int n = kvp_tok_decode_piece(sv->tok, prev, id, b, sizeof b);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    return o;
}

/* An empty logprobs object: OpenAI's completion form (tokens, token_logprobs, top_logprobs, text_offset) or
 * chat form (content). */
static cJSON *lp_new(int chat)
{
    cJSON *o = cJSON_CreateObject();
    if (chat) {
        cJSON_AddArrayToObject(o, "content");
        return o;
    }
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

/* Appends places [from, to) of token list seq, with their log-probabilities a, to logprobs object o (lp_new);
 * the token before seq[0] is prev0 (-1: none). Completion form: each token's text, log-probability (null for
 * a place with nothing before it), the top tokens and the chosen one, and text offset (*off: the characters
 * before place from, advanced); chat form: token, logprob, bytes and top_logprobs. */
static void lp_append(const server *sv, int chat, cJSON *o, const int32_t *seq, int32_t from, int32_t to, int32_t prev0,
                      const kvp_logprobs *a, long *off)
{
    char s[2048], alt[2048];
    long chars, ignored;
    for (int32_t at = from; at < to; at++) {
        const int32_t prev = at > 0 ? seq[at - 1] : prev0, k = a->k;
        const int none = at >= a->n || isnan(a->lp[at]);
        if (chat) {
            if (none) continue;
            cJSON *e = chat_token(sv, prev, seq[at], a->lp[at]), *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int32_t x = 0; x < k; x++)
                cJSON_AddItemToArray(tops, chat_token(sv, prev, a->top_ids[at * k + x], a->top_lps[at * k + x]));
            cJSON_AddItemToArray(cJSON_GetObjectItem(o, "content"), e);
            continue;
        }
        token_text(sv, prev, seq[at], s, sizeof s, &chars);
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "tokens"), cJSON_CreateString(s));
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "text_offset"), cJSON_CreateNumber((double)*off));
        *off += chars;
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "token_logprobs"), lp_number(none ? NAN : a->lp[at]));
        cJSON *d = none ? cJSON_CreateNull() : cJSON_CreateObject();
        for (int32_t x = 0; !none && x < k; x++) {
            token_text(sv, prev, a->top_ids[at * k + x], alt, sizeof alt, &ignored);
            if (!cJSON_HasObjectItem(d, alt)) cJSON_AddItemToObject(d, alt, lp_number(a->top_lps[at * k + x]));
        }
        if (!none && !cJSON_HasObjectItem(d, s)) cJSON_AddItemToObject(d, s, lp_number(a->lp[at]));
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "top_logprobs"), d);
    }
}

/* OpenAI's usage object of job j (see job_tokens); once j is finished, with prompt_tokens_details.cached_tokens:
 * its prompts' tokens the prefix cache served at admission (OpenAI's field, vLLM's with
 * --enable-prompt-tokens-details). */
static cJSON *usage_json(const job *j)
{
    int64_t ptoks, ctoks, cached = 0;
    job_tokens(j, &ptoks, &ctoks);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)ptoks);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ctoks);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(ptoks + ctoks));
    if (j->finished) {
        for (int32_t i = 0; i < j->n; i++) cached += j->res[i].prompt_cached_tokens;
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)cached);
    }
    return u;
}

/* obj[key] = the text s[0, n) (kvp_json_add_text's checks). */
static void add_text_n(cJSON *obj, const char *key, const char *s, size_t n)
{
    char *t = kvp_malloc(n + 1);
    if (!t) return;
    memcpy(t, s, n);
    t[n] = '\0';
    kvp_json_add_text(obj, key, t);
    kvp_free(t);
}

/* An answer's message under --reasoning-parser (runtime/text/reasoning.h): reasoning_content, and content or null
 * when no </think> came (the whole answer is reasoning). */
static void add_reasoning_message(cJSON *msg, const char *gen)
{
    const kvp_reasoning_parts p = kvp_reasoning_split(gen, strlen(gen));
    add_text_n(msg, "reasoning_content", p.reasoning, p.reasoning_len);
    if (p.content) kvp_json_add_text(msg, "content", p.content);
    else cJSON_AddNullToObject(msg, "content");
}

/* The response of a finished job. */
static cJSON *completion_json(server *sv, const job *j, uint64_t id)
{
    cJSON *o = completion_head(sv, j, id, time(NULL));
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int32_t i = 0; i < j->n; i++) {
        const kvp_session_result *r = &j->res[i];
        for (int32_t s = 0; s < r->n_samples; s++) {
            const int32_t c = i * j->nsamples + s;
            char *text = NULL;
            if (!j->ch && kvp_tok_decode(sv->tok, j->reqs[i].prompt[j->reqs[i].n_prompt - 1], r->tokens[s],
                                         r->n_tokens[s], &text) != KVP_OK) {
                cJSON_Delete(o);
                return NULL;
            }
            const char *gen = j->ch ? (j->ch[c].t.text ? j->ch[c].t.text : "") : text;
            char *echoed = j->echo ? kvp_malloc(strlen(j->ptext[i]) + strlen(gen) + 1) : NULL;
            if (echoed) {
                strcpy(echoed, j->ptext[i]);
                strcat(echoed, gen);
            }
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddItemToArray(choices, ch);
            cJSON_AddNumberToObject(ch, "index", (double)c);
            if (j->chat) {
                cJSON *msg = cJSON_AddObjectToObject(ch, "message");
                cJSON_AddStringToObject(msg, "role", "assistant");
                if (sv->reasoning) add_reasoning_message(msg, gen);
                else kvp_json_add_text(msg, "content", gen);
            } else {
                kvp_json_add_text(ch, "text", echoed ? echoed : gen);
            }
            kvp_free(text);
            kvp_free(echoed);
            if (j->echo && !echoed) {
                cJSON_Delete(o);
                return NULL;
            }
            if (j->logprobs >= 0) { /* with echo the prompt's places first (its first has none) */
                const kvp_session_request *q = &j->reqs[i];
                cJSON *lp = lp_new(j->chat);
                long off = 0;
                if (j->echo) lp_append(sv, 0, lp, q->prompt, 0, q->n_prompt, -1, &r->prompt_logprobs, &off);
                if (r->logprobs)
                    lp_append(sv, j->chat, lp, r->tokens[s], 0, r->n_tokens[s], q->prompt[q->n_prompt - 1],
                              &r->logprobs[s], &off);
                cJSON_AddItemToObject(ch, "logprobs", lp);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
            if (j->return_ids) {
                const kvp_session_request *q = &j->reqs[i];
                cJSON_AddItemToObject(ch, "prompt_token_ids", cJSON_CreateIntArray(q->prompt, q->n_prompt));
                cJSON_AddItemToObject(ch, "token_ids", cJSON_CreateIntArray(r->tokens[s], r->n_tokens[s]));
            }
            add_finish(ch, j, c);
        }
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    count_tokens(sv, j);
    return o;
}

/* ---------------------------------------------------------------- streaming (server-sent events) */

/* 1 when the client of connection c has closed it (or it broke): a peek, without waiting. */
static int client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    const ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The client of job j left before its answer (caller holds mu): the engine aborts its requests. */
static void cancel_job(server *sv, job *j)
{
    if (j->cancelled || j->finished) return;
    j->cancelled = 1;
    sv->cancels++;
    sv->cancelled++;
    pthread_cond_signal(&sv->wake);
}

/* A streamed response: what the reader has sent per choice, and the bytes it has ready to send. */
typedef struct {
    server *sv;
    job *j;
    struct MHD_Connection *c;
    uint64_t id;
    time_t created;
    size_t sent[MAX_STREAM]; /* bytes of each choice's text sent */
    unsigned char began[MAX_STREAM]; /* chat: the choice's first delta (with the role) was sent */
    kvp_reasoning_stream thought[MAX_STREAM]; /* --reasoning-parser: where each choice's text stands */
    int32_t lp_sent[MAX_STREAM];     /* logprobs: places of each choice sent */
    unsigned char echoed[MAX_STREAM]; /* echo: the prompt went out in the choice's first event */
    long lp_off[MAX_STREAM];         /* and the text offset of the next one */
    int32_t ids_sent[MAX_STREAM];    /* return_token_ids: tokens of each choice sent */
    unsigned char ids_began[MAX_STREAM]; /* and its prompt's ids */
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

static void out_event(stream_ctx *x, cJSON *o);

/* One event of choice c: text[0, n) (chat with --reasoning-parser: reasoning[0, rn) too) and, with last, its
 * finish reason (and with continuous_usage_stats, the usage so far). */
static void stream_event(stream_ctx *x, int32_t c, const char *reasoning, size_t rn, const char *text, size_t n, int last)
{
    const job *j = x->j;
    const int32_t i = c / j->nsamples;
    const char *echo = j->echo && !x->echoed[c] ? j->ptext[i] : ""; /* echo: the prompt leads the first event */
    const size_t ne = strlen(echo);
    char *t = kvp_malloc(ne + n + 1);
    if (!t) {
        x->oom = 1;
        return;
    }
    memcpy(t, echo, ne);
    memcpy(t + ne, text, n);
    t[ne + n] = '\0';
    cJSON *o = completion_head(x->sv, x->j, x->id, x->created);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", c);
    if (x->j->chat) { /* OpenAI's chunks: the role in a choice's first delta, then its new content */
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (!x->began[c]) cJSON_AddStringToObject(d, "role", "assistant");
        if (rn > 0) add_text_n(d, "reasoning_content", reasoning, rn);
        if (n > 0 || (!x->began[c] && rn == 0)) kvp_json_add_text(d, "content", t);
        x->began[c] = 1;
    } else {
        kvp_json_add_text(ch, "text", t);
    }
    kvp_free(t);
    if (j->logprobs >= 0) { /* the places decoded since the last event (echo: the prompt's first) */
        const choice *h = &j->ch[c];
        const kvp_session_request *q = &j->reqs[i];
        cJSON *lp = lp_new(j->chat);
        if (j->echo && !x->echoed[c]) lp_append(x->sv, 0, lp, q->prompt, 0, q->n_prompt, -1, &j->eplp[i], &x->lp_off[c]);
        lp_append(x->sv, j->chat, lp, h->toks, x->lp_sent[c], h->lp.n, q->prompt[q->n_prompt - 1], &h->lp, &x->lp_off[c]);
        x->lp_sent[c] = h->lp.n;
        cJSON_AddItemToObject(ch, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (j->return_ids) { /* the prompt's ids in the choice's first event, then the tokens since the last one */
        const kvp_session_request *q = &j->reqs[i];
        if (!x->ids_began[c]) cJSON_AddItemToObject(ch, "prompt_token_ids", cJSON_CreateIntArray(q->prompt, q->n_prompt));
        x->ids_began[c] = 1;
        cJSON_AddItemToObject(ch, "token_ids", cJSON_CreateIntArray(j->ch[c].toks + x->ids_sent[c],
                                                                    j->ch[c].n_toks - x->ids_sent[c]));
        x->ids_sent[c] = j->ch[c].n_toks;
    }
    x->echoed[c] = 1;
    if (last) add_finish(ch, x->j, c);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (x->j->continuous_usage) cJSON_AddItemToObject(o, "usage", usage_json(x->j));
    out_event(x, o);
}

/* Sends choice c's text[sent, len) (whole UTF-8 characters), or with last what is left and the finish reason;
 * chat with --reasoning-parser: as reasoning_content and content (runtime/text/reasoning.h). */
static void stream_text(stream_ctx *x, int32_t c, const char *text, size_t len, int last)
{
    if (!x->sv->reasoning || !x->j->chat) {
        stream_event(x, c, NULL, 0, text + x->sent[c], len - x->sent[c], last);
        x->sent[c] = len;
        return;
    }
    const kvp_reasoning_parts p = kvp_reasoning_next(&x->thought[c], text, len, last);
    if (p.reasoning_len > 0 || p.content || last)
        stream_event(x, c, p.reasoning, p.reasoning_len, p.content ? p.content : "", p.content_len, last);
    x->sent[c] = x->thought[c].sent;
}

/* Event o (deleted here) as "data: JSON". */
static void out_event(stream_ctx *x, cJSON *o)
{
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

/* Waits for something to send (new text, or the end) and formats it into x->out. Text that could still
 * become a stop string waits, and so does a UTF-8 character whose last bytes have not come. Returns 0 when
 * the client has left. */
static int stream_fill(stream_ctx *x)
{
    server *sv = x->sv;
    job *j = x->j;
    const int32_t nc = j->n * j->nsamples;
    /* A plain stream's new text is copied under the lock and its events made after it: the engine and every
     * other stream wait on the lock, and a step resumes every stream at once. Logprobs, echo, running usage
     * and reasoning read more of the job: those events are made under the lock. */
    const int plain = j->logprobs < 0 && !j->echo && !j->continuous_usage && !j->return_ids && !(sv->reasoning && j->chat);
    char *slice[MAX_STREAM] = {0};
    size_t slen[MAX_STREAM] = {0};
    int sliced = 0, gone = 0;
    pthread_mutex_lock(&sv->mu);
    for (int32_t c = 0; c < nc && !j->finished; c++) {
        const kvp_stop_text *h = &j->ch[c].t;
        const size_t rel = j->ch[c].released; /* <= h->ready */
        const size_t n = rel > x->sent[c] ? utf8_whole(h->text + x->sent[c], rel - x->sent[c]) : 0;
        if (n == 0) continue;
        if (!plain) {
            stream_text(x, c, h->text, x->sent[c] + n, 0);
        } else if ((slice[c] = kvp_malloc(n)) != NULL) {
            memcpy(slice[c], h->text + x->sent[c], n);
            slen[c] = n;
            x->sent[c] += n;
            sliced = 1;
        } else {
            x->oom = 1;
        }
    }
    if (x->len > 0 || sliced || x->oom) {
        /* new text to send */
    } else if (j->finished) {
        if (j->status) { /* OpenAI's error object as the last event */
            cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(e, "message", j->err);
            cJSON_AddNumberToObject(e, "code", j->status);
            out_event(x, o);
        } else {
            for (int32_t c = 0; c < nc; c++) /* the rest of the text, then the finish reason */
                stream_text(x, c, j->ch[c].t.text, j->ch[c].t.len, 1);
            if (j->include_usage) { /* OpenAI's last event: no choices, the usage */
                cJSON *o = completion_head(sv, j, x->id, x->created);
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", usage_json(j));
                out_event(x, o);
            }
        }
        out_add(x, "data: [DONE]\n\n");
        x->done = 1;
    } else if (j->cancelled) {
        gone = 1; /* its client left (the engine found it gone) */
    } else {
        job_suspend(j, x->c); /* nothing new: resumed by the engine when there is */
    }
    pthread_mutex_unlock(&sv->mu);
    for (int32_t c = 0; c < nc; c++)
        if (slice[c]) {
            stream_event(x, c, NULL, 0, slice[c], slen[c], 0);
            kvp_free(slice[c]);
        }
    if (x->done) { /* counted when it ends: an error event makes it an error */
        count_answer(sv, j->status ? (unsigned)j->status : 200);
        if (!j->status) count_tokens(sv, j);
    }
    return !gone;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *x = cls;
    if (x->at == x->len) {
        x->at = x->len = 0;
        if (x->done || x->oom) return MHD_CONTENT_READER_END_OF_STREAM; /* out of memory: cut short */
        if (!stream_fill(x)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (x->len == 0) return 0; /* suspended until the engine has more */
    }
    size_t n = x->len - x->at < max ? x->len - x->at : max;
    memcpy(buf, x->out + x->at, n);
    x->at += n;
    return (ssize_t)n;
}

/* The response is done with (sent, or its connection closed): a job not finished then lost its client. */
static void stream_done(void *cls)
{
    stream_ctx *x = cls;
    pthread_mutex_lock(&x->sv->mu);
    x->j->suspended = 0; /* the connection is going: no one may resume it */
    cancel_job(x->sv, x->j);
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

static enum MHD_Result reply_too_big(server *sv, struct MHD_Connection *c)
{
    return reply_error(sv, c, 413, "the request body is larger than 1 MiB");
}

/* The request body as a JSON object, or NULL with the 4xx answer queued in *ret. */
static cJSON *body_object(server *sv, struct MHD_Connection *c, const body *b, enum MHD_Result *ret)
{
    if (b->too_big) {
        *ret = reply_too_big(sv, c);
        return NULL;
    }
    cJSON *req = b->len ? cJSON_ParseWithLength(b->buf, b->len) : NULL;
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        *ret = reply_error(sv, c, 400, "the request body is not a JSON object");
        return NULL;
    }
    return req;
}

/* Queues job j for the engine and answers when it is done: a stream through x, else (x NULL) by
 * completion_answer once the engine has finished the job and resumed the connection (a client that leaves
 * meanwhile cancels its job, and gets no answer). */
static enum MHD_Result enqueue(server *sv, struct MHD_Connection *c, body *b, job *j, stream_ctx *x)
{
    pthread_mutex_lock(&sv->mu);
    const uint64_t id = sv->next_id++;
    j->refs = 2; /* the engine's (released by job_finish) and the handler's or the response's */
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
        *x = (stream_ctx){.sv = sv, .j = j, .c = c, .id = id, .created = time(NULL)};
        return stream_reply(c, x);
    }
    b->j = j;
    b->id = id;
    if (!j->finished) job_suspend(j, c);
    pthread_mutex_unlock(&sv->mu);
    return MHD_YES;
}

/* vLLM's POST /reset_prefix_cache (SGLang's /flush_cache): done by the engine between two steps, before the
 * requests that came after it are added. */
static enum MHD_Result reset_cache(server *sv, struct MHD_Connection *c, body *b)
{
    job *j = kvp_calloc(1, sizeof *j);
    if (!j) return reply_error(sv, c, 500, "out of memory");
    j->reset_cache = 1;
    return enqueue(sv, c, b, j, NULL);
}

/* POST /v1/completions (chat 0) or /v1/chat/completions (chat 1). */
static enum MHD_Result completions(server *sv, struct MHD_Connection *c, body *b, int chat)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = body_object(sv, c, b, &ret);
    if (!req) return ret;
    job *j = kvp_calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(req);
        return reply_error(sv, c, 500, "out of memory");
    }
    char err[512] = "";
    j->chat = chat;
    int code = build_job(sv, req, j, err, sizeof err);
    cJSON_Delete(req);
    if (code) {
        job_free(j);
        return reply_error(sv, c, (unsigned)code, err);
    }
    stream_ctx *x = j->stream ? kvp_calloc(1, sizeof *x) : NULL;
    if (j->stream && !x) {
        job_free(j);
        return reply_error(sv, c, 500, "out of memory");
    }
    return enqueue(sv, c, b, j, x);
}

/* The answer of b's completion, called again by MHD until the job is finished (then the handler lets go
 * of it). */
static enum MHD_Result completion_answer(server *sv, struct MHD_Connection *c, body *b)
{
    job *j = b->j;
    enum MHD_Result ret;
    pthread_mutex_lock(&sv->mu);
    if (!j->finished) { /* not for us yet */
        if (!j->suspended) job_suspend(j, c);
        pthread_mutex_unlock(&sv->mu);
        return MHD_YES;
    }
    const int gone = j->cancelled;
    pthread_mutex_unlock(&sv->mu);
    if (gone) {
        ret = MHD_NO;
    } else if (j->status) {
        ret = reply_error(sv, c, (unsigned)j->status, j->err);
    } else if (j->reset_cache) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "evicted_blocks", (double)j->evicted);
        ret = reply_json(sv, c, 200, o);
    } else {
        cJSON *o = completion_json(sv, j, b->id);
        ret = o ? reply_json(sv, c, 200, o) : reply_error(sv, c, 500, "cannot decode the generated tokens");
    }
    pthread_mutex_lock(&sv->mu);
    job_release(j);
    pthread_mutex_unlock(&sv->mu);
    b->j = NULL;
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

/* vLLM's POST /tokenize: {"prompt": TEXT, "add_special_tokens": true} or {"messages": [...],
 * "add_generation_prompt": true} (the chat template's prompt) -> {"count", "max_model_len", "tokens"}. */
static enum MHD_Result tokenize(server *sv, struct MHD_Connection *c, const body *b)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = body_object(sv, c, b, &ret);
    if (!req) return ret;
    char err[512] = "";
    int code = 0;
    int32_t *ids = NULL, n = 0;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_GetObjectItemCaseSensitive(req, "messages")) {
        code = render_messages(sv, req, &ids, &n, err, sizeof err);
    } else if (!cJSON_IsString(p)) {
        code = (snprintf(err, sizeof err, "\"prompt\" must be a string (or give \"messages\")"), 400);
    } else {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(req, "add_special_tokens"); /* default true */
        const int bos = !sp || cJSON_IsNull(sp) ? 1 : get_bool(req, "add_special_tokens", err, sizeof err);
        if (bos < 0) code = 400;
        else if (kvp_tok_encode_ex(sv->tok, p->valuestring, strlen(p->valuestring),
                                   (bos ? KVP_TOK_ADD_BOS : 0) | KVP_TOK_PARSE_SPECIAL, &ids, &n) != KVP_OK)
            code = (snprintf(err, sizeof err, "%s", kvp_error_message()), 400);
    }
    cJSON_Delete(req);
    if (code) {
        kvp_free(ids);
        return reply_error(sv, c, (unsigned)code, err);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", n);
    cJSON_AddNumberToObject(o, "max_model_len", kvp_model_max_len(sv->m));
    cJSON *t = cJSON_AddArrayToObject(o, "tokens");
    for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[i]));
    kvp_free(ids);
    return reply_json(sv, c, 200, o);
}

/* vLLM's POST /detokenize: {"tokens": [TOKEN_ID, ...]} -> {"prompt": TEXT}. */
static enum MHD_Result detokenize(server *sv, struct MHD_Connection *c, const body *b)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = body_object(sv, c, b, &ret);
    if (!req) return ret;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens"), *x;
    const int32_t n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1, V = (int32_t)kvp_model_cfg(sv->m)->vocab_size;
    int32_t *ids = n > 0 ? kvp_malloc((size_t)n * sizeof *ids) : NULL, i = 0;
    char err[128] = "", *text = NULL;
    if (n < 0) snprintf(err, sizeof err, "\"tokens\" must be an array of token ids");
    cJSON_ArrayForEach(x, t) {
        const double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
        if (!(v >= 0 && v < V && v == (double)(int32_t)v)) {
            snprintf(err, sizeof err, "\"tokens\" item %d is not a token id in [0, %d)", i, V);
            break;
        }
        if (ids) ids[i++] = (int32_t)v;
    }
    cJSON_Delete(req);
    const int oom = !err[0] && ((n > 0 && !ids) || kvp_tok_decode(sv->tok, -1, ids, n, &text) != KVP_OK);
    kvp_free(ids);
    if (err[0] || oom) return reply_error(sv, c, err[0] ? 400 : 500, err[0] ? err : "out of memory");
    cJSON *o = cJSON_CreateObject();
    kvp_json_add_text(o, "prompt", text);
    kvp_free(text);
    return reply_json(sv, c, 200, o);
}

/* Appends printf-style text at t + *len, cut to the cap bytes of t (*len stays < cap). */
static void appendf(char *t, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void appendf(char *t, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(t + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* Appends histogram h as Prometheus text: cumulative buckets, +Inf, sum, count. */
static void histo_print(char *t, size_t cap, size_t *len, const char *name, const char *help, const histo *h)
{
    appendf(t, cap, len, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < NLAT; i++) {
        cum += h->n[i];
        appendf(t, cap, len, "%s_bucket{le=\"%g\"} %lld\n", name, k_lat_le[i], (long long)cum);
    }
    cum += h->n[NLAT];
    appendf(t, cap, len, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.9g\n%s_count %lld\n", name, (long long)cum, name,
            h->sum, name, (long long)cum);
}

/* Prometheus text format 0.0.4. */
static enum MHD_Result metrics(server *sv, struct MHD_Connection *c)
{
    const size_t cap = 16384;
    char *t = kvp_malloc(cap);
    if (!t) return reply_error(sv, c, 500, "out of memory");
    pthread_mutex_lock(&sv->mu);
    const kvp_session_stats s = sv->stats;
    const int64_t a[3] = {sv->answered[0], sv->answered[1], sv->answered[2]};
    const int64_t pt = sv->prompt_tokens, ct = sv->completion_tokens, cancelled = sv->cancelled;
    const histo ttft = sv->ttft, tpot = sv->tpot, e2e = sv->e2e;
    pthread_mutex_unlock(&sv->mu);
    const double used = s.num_blocks > 0 ? 1.0 - (double)s.free_blocks / s.num_blocks : 0.0;
    size_t len = 0;
    appendf(t, cap, &len,
             "# HELP kvpage_http_responses_total HTTP responses (completions, models, errors) by status class.\n"
             "# TYPE kvpage_http_responses_total counter\n"
             "kvpage_http_responses_total{code=\"200\"} %lld\n"
             "kvpage_http_responses_total{code=\"4xx\"} %lld\n"
             "kvpage_http_responses_total{code=\"5xx\"} %lld\n"
             "# HELP kvpage_requests_cancelled_total Completions whose client left before the answer (their generation stops).\n"
             "# TYPE kvpage_requests_cancelled_total counter\n"
             "kvpage_requests_cancelled_total %lld\n"
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
             "# HELP kvpage_spec_decode_num_drafts_total Speculation: steps of a sample that proposed drafts.\n"
             "# TYPE kvpage_spec_decode_num_drafts_total counter\n"
             "kvpage_spec_decode_num_drafts_total %lld\n"
             "# HELP kvpage_spec_decode_num_draft_tokens_total Speculation: draft tokens proposed.\n"
             "# TYPE kvpage_spec_decode_num_draft_tokens_total counter\n"
             "kvpage_spec_decode_num_draft_tokens_total %lld\n"
             "# HELP kvpage_spec_decode_num_accepted_tokens_total Speculation: draft tokens kept.\n"
             "# TYPE kvpage_spec_decode_num_accepted_tokens_total counter\n"
             "kvpage_spec_decode_num_accepted_tokens_total %lld\n"
             "# HELP kvpage_prefix_cache_queries_total Prompt tokens looked up in the prefix cache at admission.\n"
             "# TYPE kvpage_prefix_cache_queries_total counter\n"
             "kvpage_prefix_cache_queries_total %lld\n"
             "# HELP kvpage_prefix_cache_hits_total Prompt tokens the prefix cache served.\n"
             "# TYPE kvpage_prefix_cache_hits_total counter\n"
             "kvpage_prefix_cache_hits_total %lld\n"
             "# HELP kvpage_host_cache_hits_total Prompt tokens the prefix cache's host tier served (loaded).\n"
             "# TYPE kvpage_host_cache_hits_total counter\n"
             "kvpage_host_cache_hits_total %lld\n"
             "# HELP kvpage_host_cache_loaded_blocks_total Blocks copied from the host tier.\n"
             "# TYPE kvpage_host_cache_loaded_blocks_total counter\n"
             "kvpage_host_cache_loaded_blocks_total %lld\n"
             "# HELP kvpage_host_cache_stored_blocks_total Blocks copied to the host tier.\n"
             "# TYPE kvpage_host_cache_stored_blocks_total counter\n"
             "kvpage_host_cache_stored_blocks_total %lld\n"
             "# HELP kvpage_kv_blocks KV cache blocks.\n"
             "# TYPE kvpage_kv_blocks gauge\n"
             "kvpage_kv_blocks %d\n"
             "# HELP kvpage_kv_blocks_free KV blocks neither held by a sequence nor cached.\n"
             "# TYPE kvpage_kv_blocks_free gauge\n"
             "kvpage_kv_blocks_free %d\n"
             "# HELP kvpage_kv_cache_usage_ratio Share of the KV blocks in use (held or cached).\n"
             "# TYPE kvpage_kv_cache_usage_ratio gauge\n"
             "kvpage_kv_cache_usage_ratio %.6f\n",
             (long long)a[0], (long long)a[1], (long long)a[2], (long long)cancelled, (long long)pt, (long long)ct, (long long)s.requests,
             (long long)s.finished, (long long)s.waiting, (long long)s.running_seqs, (long long)s.preempted_seqs,
             (long long)s.steps, (long long)s.computed_tokens, (long long)s.preemptions, (long long)s.spec_drafts,
             (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens,
             (long long)s.admitted_prompt_tokens, (long long)s.prefix_hit_tokens, (long long)s.host_hit_tokens,
             (long long)s.host_loaded_blocks, (long long)s.host_stored_blocks, s.num_blocks, s.free_blocks, used);
    histo_print(t, cap, &len, "kvpage_time_to_first_token_seconds",
                "Finished prompts: time from the engine taking the prompt to its first token.", &ttft);
    histo_print(t, cap, &len, "kvpage_time_per_output_token_seconds",
                "Finished prompts of two tokens or more: mean time per token after the first.", &tpot);
    histo_print(t, cap, &len, "kvpage_e2e_request_latency_seconds",
                "Finished prompts: time from the engine taking the prompt to its last token.", &e2e);
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
        /* a body announced larger than we take: answered now, not after reading (and dropping) all of it */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > MAX_BODY) {
            b->too_big = 1;
            return reply_too_big(sv, c);
        }
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
    if (b->j) return completion_answer(sv, c, b);
    const int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0)
        return post ? completions(sv, c, b, 0) : reply_error(sv, c, 405, "use POST for /v1/completions");
    if (strcmp(url, "/v1/chat/completions") == 0)
        return post ? completions(sv, c, b, 1) : reply_error(sv, c, 405, "use POST for /v1/chat/completions");
    if (strcmp(url, "/v1/models") == 0) return get ? models(sv, c) : reply_error(sv, c, 405, "use GET for /v1/models");
    if (strcmp(url, "/tokenize") == 0) return post ? tokenize(sv, c, b) : reply_error(sv, c, 405, "use POST for /tokenize");
    if (strcmp(url, "/detokenize") == 0)
        return post ? detokenize(sv, c, b) : reply_error(sv, c, 405, "use POST for /detokenize");
    if (strcmp(url, "/metrics") == 0) return get ? metrics(sv, c) : reply_error(sv, c, 405, "use GET for /metrics");
    if (strcmp(url, "/reset_prefix_cache") == 0 || strcmp(url, "/flush_cache") == 0)
        return post ? reset_cache(sv, c, b) : reply_error(sv, c, 405, "use POST to reset the prefix cache");
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
    (void)c, (void)why;
    server *sv = cls;
    body *b = *con_cls;
    if (b && b->j) { /* ended before its answer (the daemon stopping): the engine aborts the job */
        pthread_mutex_lock(&sv->mu);
        b->j->suspended = 0; /* the connection is going: no one may resume it */
        cancel_job(sv, b->j);
        job_release(b->j);
        pthread_mutex_unlock(&sv->mu);
    }
    if (b) kvp_free(b->buf);
    kvp_free(b);
    *con_cls = NULL;
}

/* ---------------------------------------------------------------- command */

typedef struct {
    const char *model, *tokenizer, *host, *name, *chat_template;
    int32_t port, num_blocks, threads, max_conns, tp, max_model_len;
    int64_t kv_mem, offload_bytes, swap_bytes; /* swap: -1 as much as the KV cache */
    int json;
    kvp_matmul_kind matmul;
    kvp_weight_type weight_dtype;
    int kv_auto; /* --kv-dtype auto: the gen config's kv_dtype is set once the model is loaded */
    int reasoning;
    int32_t stream_interval;
    int generation_config; /* --generation-config auto (1): the model's sampling defaults; vllm (0): vLLM's */
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

/* sv->dflt: vLLM's request defaults, then (auto) the fields the model gives (generation_config.json, GGUF
 * general.sampling.*), said on stderr as vLLM says it. */
static void sampling_defaults(server *sv, int from_model)
{
    kvp_sampling_defaults *d = &sv->dflt;
    *d = (kvp_sampling_defaults){.temperature = 1, .top_p = 1, .top_k = -1, .min_p = 0, .repetition_penalty = 1,
                                 .max_tokens = 16};
    const kvp_sampling_defaults *g = &kvp_model_cfg(sv->m)->sampling;
    if (!from_model || !g->given) return;
    char said[512] = "";
    size_t n = 0;
#define TAKE(bit, field)                                                                                             \
    if (g->given & (bit)) {                                                                                          \
        d->field = g->field;                                                                                         \
        n += (size_t)snprintf(said + n, sizeof said - n, "%s" #field " %.10g", n ? ", " : "", (double)g->field);     \
    }
    TAKE(KVP_SAMPLING_TEMPERATURE, temperature)
    TAKE(KVP_SAMPLING_TOP_P, top_p)
    TAKE(KVP_SAMPLING_TOP_K, top_k)
    TAKE(KVP_SAMPLING_MIN_P, min_p)
    TAKE(KVP_SAMPLING_REPETITION, repetition_penalty)
    TAKE(KVP_SAMPLING_MAX_TOKENS, max_tokens)
#undef TAKE
    KVP_LOG_W("serve: default sampling from the model's %s: %s (a request's own values win; --generation-config "
              "vllm: vLLM's defaults)", kvp_model_is_gguf(sv->m) ? "general.sampling.* metadata" :
              "generation_config.json", said);
}

/* Rank 0 (the only one without --tp): serves model m until SIGINT or SIGTERM. */

static int serve(const serve_opts *o, const kvp_session_config *cfg, kvp_comm *comm, kvp_model *m)
{
    server sv;
    memset(&sv, 0, sizeof sv);
    sv.started = time(NULL);
    sv.m = m;
    sv.comm = comm;
    sv.tp = o->tp;
    sv.reasoning = o->reasoning;
    sv.stream_interval = o->stream_interval;
    sv.cfg = *cfg;
    sampling_defaults(&sv, o->generation_config);
    kvp_status st = kvp_tok_for_model(sv.m, o->model, o->tokenizer, &sv.tok);
    int jinja = 0;
    if (st == KVP_OK)
        st = o->chat_template ? kvp_chat_template_parse(o->chat_template, &sv.chat)
                              : kvp_chat_template_of_model(o->model, kvp_model_is_gguf(m), &sv.chat, &jinja);
    if (st == KVP_OK && jinja && sv.chat == KVP_CHAT_NONE)
        KVP_LOG_W("serve: the model's chat template is none of the built-in ones (see --help): chat requests get "
                  "400 unless --chat-template names one");
    if (st == KVP_OK) st = kvp_cpu_session_create(sv.m, &sv.cfg, &sv.s);
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
        kvp_session_destroy(sv.s);
        kvp_tok_destroy(sv.tok);
        return kvp_cli_fail(CMD, st);
    }
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.wake, NULL);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    pthread_t engine;
    int rc = KVP_EXIT_OK;
    struct MHD_Daemon *d = NULL;
    const int piped = pipe(g_sig_pipe) == 0;
    if (piped) {
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (!piped) {
        rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EIO, "cannot make a pipe for signals"));
    } else if (pthread_create(&engine, NULL, engine_main, &sv) != 0) {
        rc = kvp_cli_fail(CMD, KVP_ERR(KVP_ENOMEM, "cannot start the engine thread"));
    } else {
        /* one event-driven thread over poll() (descriptors past FD_SETSIZE are served too; MHD's epoll mode
         * left half-closed connections with an unfinished request open, found by the serve fuzz target),
         * connections suspended while they wait on the engine */
        d = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME, 0, NULL,
                             NULL, handle, &sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                             MHD_OPTION_NOTIFY_COMPLETED, request_done, &sv, MHD_OPTION_CONNECTION_TIMEOUT,
                             (unsigned)600, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns, MHD_OPTION_END);
        if (!d) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EIO, "cannot listen on %s:%d (in use, or not an address of this "
                                                    "machine)", o->host, o->port));
        } else {
            const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
            const int port = info ? info->port : o->port;
            fprintf(stderr, "kvpage serve: listening on http://%s:%d (model %s, %d KV blocks of %d tokens)\n", o->host,
                    port, sv.name, sv.cfg.num_blocks, sv.cfg.engine.block_size);
            if (o->json) {
                char url[64];
                snprintf(url, sizeof url, "http://%s:%d", o->host, port);
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "url", url);
                cJSON_AddStringToObject(j, "model", sv.name);
                cJSON_AddNumberToObject(j, "num_blocks", sv.cfg.num_blocks);
                cJSON_AddNumberToObject(j, "block_size", sv.cfg.engine.block_size);
                cJSON_AddStringToObject(j, "chat_template", kvp_chat_template_name(sv.chat));
                cJSON_AddStringToObject(j, "weight_dtype", kvp_weight_type_name(kvp_model_weight_type(m)));
                cJSON_AddStringToObject(j, "kv_dtype", kvp_dtype_name(sv.cfg.kv_dtype));
                cJSON *ds = cJSON_AddObjectToObject(j, "default_sampling");
                cJSON_AddNumberToObject(ds, "temperature", sv.dflt.temperature);
                cJSON_AddNumberToObject(ds, "top_p", sv.dflt.top_p);
                cJSON_AddNumberToObject(ds, "top_k", (double)sv.dflt.top_k);
                cJSON_AddNumberToObject(ds, "min_p", sv.dflt.min_p);
                cJSON_AddNumberToObject(ds, "repetition_penalty", sv.dflt.repetition_penalty);
                cJSON_AddNumberToObject(ds, "max_tokens", (double)sv.dflt.max_tokens);
                cJSON_AddNumberToObject(j, "pid", (double)getpid()); /* with --tp: rank 0's, the one to signal */
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
    /* the handler and its pipe stay until the process ends: a second signal meanwhile is ignored (closing the
     * pipe would race with a handler about to write to it) */
    kvp_session_destroy(sv.s); /* with --tp: its executor tells the other ranks to stop */
    kvp_free(sv.live);
    kvp_free(sv.wake_list);
    pthread_cond_destroy(&sv.wake);
    pthread_mutex_destroy(&sv.mu);
    kvp_tok_destroy(sv.tok);
    return rc;
}

/* Every rank: the communicator and this rank's part of the model; rank 0 serves, the others follow it. */
static int serve_ranks(const serve_opts *o, kvp_session_config cfg)
{
    kvp_comm *comm = NULL;
    kvp_model *m = NULL;
    kvp_status st = o->tp > 1 ? kvp_comm_mpi_create(o->tp, &comm) : kvp_comm_single_create(&comm);
    if (st == KVP_OK) st = kvp_comm_quiet_other_ranks(comm);
    if (st == KVP_OK) st = kvp_model_load_ex(o->model, comm, o->weight_dtype, &m);
    if (st == KVP_OK) {
        kvp_model_set_threads(m, o->threads);
        kvp_model_set_matmul(m, o->matmul);
        if (o->kv_auto) cfg.kv_dtype = kvp_model_kv_dtype_auto(m);
        st = kvp_model_set_max_len(m, o->max_model_len);
    }
    /* this rank's bytes per block: the same on every rank */
    if (st == KVP_OK && cfg.num_blocks == 0)
        st = kvp_kv_blocks_in(m, cfg.kv_dtype, cfg.engine.block_size, o->kv_mem, "--kv-mem", &cfg.num_blocks);
    if (st == KVP_OK && cfg.engine.preempt == KVP_PREEMPT_SWAP)
        st = o->swap_bytes < 0 ? (cfg.swap_blocks = cfg.num_blocks, KVP_OK)
                               : kvp_kv_blocks_in(m, cfg.kv_dtype, cfg.engine.block_size, o->swap_bytes, "--swap-space",
                                                  &cfg.swap_blocks);
    if (st == KVP_OK && o->offload_bytes > 0)
        st = kvp_kv_blocks_in(m, cfg.kv_dtype, cfg.engine.block_size, o->offload_bytes, "--kv-offloading-size",
                               &cfg.host_cache_blocks);
    int rc;
    if (st != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
    } else if (kvp_comm_rank(comm) == 0) {
        rc = serve(o, &cfg, comm, m);
    } else { /* mpirun passes SIGTERM to every rank: rank 0 stops the others when it stops */
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        st = kvp_cpu_follow(m, NULL);
        rc = st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail(CMD, st);
    }
    kvp_model_destroy(m);
    if (rc != KVP_EXIT_OK && comm) kvp_comm_abort(comm, rc); /* a rank that fails alone ends the whole job */
    kvp_comm_destroy(comm);
    return rc;
}

int kvp_cmd_serve(int argc, char **argv)
{
    enum { O_TOK = 256, O_HOST, O_PORT, O_NAME, O_KVMEM, O_NB, O_DT, O_THREADS, O_MATMUL, O_CONNS, O_TP, O_JSON, O_CHAT,
           O_WDTYPE, O_REASON, O_STREAMIV,
           O_MAXLEN, O_GENCFG };
    static const struct option own[] = {
        {"model", required_argument, 0, 'm'},        {"tokenizer", required_argument, 0, O_TOK},
        {"host", required_argument, 0, O_HOST},      {"port", required_argument, 0, O_PORT},
        {"served-model-name", required_argument, 0, O_NAME}, {"kv-mem", required_argument, 0, O_KVMEM},
        {"num-blocks", required_argument, 0, O_NB},  {"kv-dtype", required_argument, 0, O_DT},    {"weight-dtype", required_argument, 0, O_WDTYPE},
        {"max-model-len", required_argument, 0, O_MAXLEN}, {"generation-config", required_argument, 0, O_GENCFG},
        {"threads", required_argument, 0, O_THREADS}, {"matmul", required_argument, 0, O_MATMUL},
        {"max-connections", required_argument, 0, O_CONNS}, {"tp", required_argument, 0, O_TP},
        {"stream-interval", required_argument, 0, O_STREAMIV}, {"json", no_argument, 0, O_JSON},            {"help", no_argument, 0, 'h'},
        {"chat-template", required_argument, 0, O_CHAT}, {"reasoning-parser", required_argument, 0, O_REASON}};
    struct option opts[sizeof own / sizeof own[0] + KVP_EO_END - KVP_EO_BLOCK + 1];
    kvp_engine_opts_table(own, (int)(sizeof own / sizeof own[0]), opts, (int)(sizeof opts / sizeof opts[0]));
    serve_opts o = {.generation_config = 1, .host = "127.0.0.1", .port = 8000, .threads = 1, .kv_mem = (int64_t)512 << 20, .max_conns = 4096, .tp = 1, .stream_interval = 1,
                    .matmul = KVP_MATMUL_INVARIANT, .weight_dtype = KVP_WEIGHT_AUTO, .kv_auto = 1};
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.skip_logprob = 1; /* no answer carries a sample's cumulative log-probability ("logprobs" are their own) */
    int c, li = -1;
    kvp_status st = KVP_OK;
    optind = 0;
    kvp_engine_opts eo;
    kvp_engine_opts_init(&eo, &cfg.engine);
    while ((c = getopt_long(argc, argv, ":m:h", opts, &li)) != -1) {
        if (kvp_engine_opt(&eo, c, optarg, &st)) {
            if (st != KVP_OK) return kvp_cli_usage_error(CMD, "--%s: %s", opts[li].name, kvp_error_message());
            li = -1;
            continue;
        }
        switch (c) {
        case 'm': o.model = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_HOST: o.host = optarg; break;
        case O_PORT: st = kvp_parse_i32(optarg, 0, 65535, &o.port); break;
        case O_NAME: o.name = optarg; break;
        case O_CHAT: {
            kvp_chat_template t;
            st = kvp_chat_template_parse(optarg, &t);
            o.chat_template = optarg;
            break;
        }
        case O_KVMEM: st = kvp_parse_bytes(optarg, &o.kv_mem); break;
        case O_NB: st = kvp_parse_i32(optarg, 1, INT32_MAX / 2, &cfg.num_blocks); break;
        case O_DT: st = kvp_kv_dtype_parse(optarg, &cfg.kv_dtype, &o.kv_auto); break;
        case O_WDTYPE: st = kvp_weight_type_parse(optarg, &o.weight_dtype); break;
        case O_MAXLEN: st = kvp_parse_i32(optarg, 2, INT32_MAX, &o.max_model_len); break;
        case O_GENCFG:
            if (!strcmp(optarg, "auto") || !strcmp(optarg, "vllm")) o.generation_config = !strcmp(optarg, "auto");
            else st = KVP_ERR(KVP_EINVAL, "--generation-config: '%s' is neither auto nor vllm", optarg);
            break;
        case O_THREADS: st = kvp_parse_i32(optarg, 1, 1024, &o.threads); break;
        case O_MATMUL: st = kvp_matmul_kind_parse(optarg, &o.matmul); break;
        case O_CONNS: st = kvp_parse_i32(optarg, 1, 1 << 20, &o.max_conns); break;
        case O_STREAMIV: st = kvp_parse_i32(optarg, 1, 1 << 20, &o.stream_interval); break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 1024, &o.tp); break;
        case O_JSON: o.json = 1; break;
        case O_REASON:
            o.reasoning = strcmp(optarg, "deepseek_r1") == 0;
            if (!o.reasoning) st = KVP_ERR(KVP_EINVAL, "unknown reasoning parser '%s' (deepseek_r1)", optarg);
            break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(CMD, c, argv);
        }
        if (st != KVP_OK)
            return kvp_cli_usage_error(CMD, "--%s: %s", li >= 0 ? opts[li].name : "model", kvp_error_message());
        li = -1;
    }
    if (optind < argc) return kvp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!o.model) return kvp_cli_usage_error(CMD, "--model is required");
    if ((st = kvp_engine_opts_check(&eo)) != KVP_OK) return kvp_cli_usage_error(CMD, "%s", kvp_error_message());
    o.offload_bytes = eo.offload_bytes;
    o.swap_bytes = eo.swap_bytes;
    if (o.name && (!o.name[0] || strlen(o.name) >= 256))
        return kvp_cli_usage_error(CMD, "--served-model-name must have 1 to 255 characters");
    return serve_ranks(&o, cfg);
}
