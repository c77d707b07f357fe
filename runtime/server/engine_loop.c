/* runtime/server/engine_loop.c — the engine thread: it owns the session, adds the queued jobs' prompts, steps,
 * hands each finished request (or a stream's new text) to its job and resumes its connection; and the
 * server's start: the model on every rank, rank 0 serving, the others following its steps. */
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "runtime/server/server_internal.h"
#include "common/cli.h"
#include "parallel/comm.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/executor/tp_threads.h"

/* ---------------------------------------------------------------- tensor parallelism
 *
 * With --tp N, rank 0 runs the server and its engine; its executor broadcasts every step's plan and the other
 * ranks only execute it (kvp_cpu_follow, or kvp_cuda_follow with --device cuda; runtime/executor/tp_plan.h)
 * until rank 0's session ends. */

static kvp_status sess_add(server *sv, const kvp_session_request *r, int32_t *id) { return kvp_session_add(sv->s, r, id); }

static void sess_stop(server *sv, int32_t id, int32_t k, int32_t n_keep) { (void)kvp_session_stop_at(sv->s, id, k, n_keep); }

static void sess_abort(server *sv, int32_t id) { (void)kvp_session_abort(sv->s, id); }

static kvp_status sess_reset_cache(server *sv, int64_t *evicted) { return kvp_session_reset_prefix_cache(sv->s, evicted); }

/* A new session on the executor the server was started with: the cpu executor, or (--device cuda) a cuda
 * executor whose memory split gives the KV blocks, *num_blocks (sv->cfg.num_blocks for the cpu executor; the
 * caller stores it in sv->cfg for the start line and /metrics). A later session asks again for what the
 * options asked, not for the first split's count. */
static kvp_status sess_create(server *sv, int32_t *num_blocks)
{
    *num_blocks = sv->cfg.num_blocks;
    if (!sv->o.cuda) return kvp_cpu_session_create(sv->m, &sv->cfg, &sv->s);
    kvp_session_config c = sv->cfg;
    c.num_blocks = sv->cuda_blocks_asked;
    kvp_cuda_info info;
    KVP_TRY(kvp_cuda_session_create(sv->m, &sv->o.cu, &c, &sv->s, &info));
    *num_blocks = info.split.num_blocks;
    if (!sv->cuda_info.split.num_blocks) sv->cuda_info = info; /* the start line's: the first session's split */
    return KVP_OK;
}

/* ---------------------------------------------------------------- engine thread */

void srv_job_free(job *j)
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
void srv_job_release(job *j)
{
    if (--j->refs == 0) srv_job_free(j);
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
void srv_job_suspend(job *j, struct MHD_Connection *c)
{
    j->conn = c;
    j->suspended = 1;
    MHD_suspend_connection(c);
}

/* Ends job j (caller holds mu): answered with status/err unless 0. The engine lets go of the job here:
 * nothing of the engine refers to it after this. */
void srv_job_finish(server *sv, job *j, int status, const char *err)
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
    srv_job_release(j);
}

/* Adds a job's prompts to the session; one that is refused ends the job with 400 once the prompts already
 * added are back. A job whose client already left is not added. */
static void add_job(server *sv, job *j)
{
    int32_t added = 0;
    char err[512] = "";
    pthread_mutex_lock(&sv->mu);
    const int gone = j->cancelled;
    sv->mx.queued_prompts -= j->n;
    pthread_mutex_unlock(&sv->mu);
    j->t_added = srv_now();
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
    if (added == 0) srv_job_finish(sv, j, 0, NULL);
    pthread_mutex_unlock(&sv->mu);
}

/* Ends every job in flight with status and err. */
static void fail_in_flight(server *sv, int status, const char *err)
{
    pthread_mutex_lock(&sv->mu);
    while (sv->nlive > 0) srv_job_finish(sv, sv->live[sv->nlive - 1], status, err);
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
        if (sv->live[x]->suspended && srv_client_gone(sv->live[x]->conn)) srv_cancel_job(sv, sv->live[x]);
    pthread_mutex_unlock(&sv->mu);
}

static void *srv_engine_main(void *arg)
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
            const int oom = st == KVP_ENOMEM; /* 503: the server has no room now, it is no fault of the request */
            snprintf(err, sizeof err, "%sthe engine failed: %s", oom ? "out of memory: " : "", kvp_error_message());
            KVP_LOG_E("serve: %s", err);
            fail_in_flight(sv, oom ? 503 : 500, err);
            kvp_session_destroy(sv->s);
            sv->s = NULL;
            sv->last_computed = 0;
            int32_t nb;
            if (sess_create(sv, &nb) != KVP_OK) {
                KVP_LOG_E("serve: cannot start a new session: %s", kvp_error_message());
                pthread_mutex_lock(&sv->mu);
                sv->stop = 1;
                pthread_mutex_unlock(&sv->mu);
                break;
            }
            sv->cfg.num_blocks = nb; /* /metrics shows it after the next step (srv_metrics_step) */
            continue;
        }
        pthread_mutex_lock(&sv->mu); /* before any answer: a client that reads /metrics next sees this step */
        sv->nwake = 0;
        track_progress(sv);
        srv_metrics_step(sv);
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
            j->res[o->i] = res;
            if (j->eplp) keep_prompt_logprobs(j, o->i, &res.prompt_logprobs);
            for (int32_t k = 0; j->ch && k < res.n_samples; k++) /* what no step showed (a failed decode) */
                track_choice(sv, j, o->i * j->nsamples + k, res.tokens[k], res.n_tokens[k],
                             res.logprobs ? &res.logprobs[k] : NULL);
            srv_metrics_finished(sv, j, o->i, &res);
            if (--j->remaining == 0) srv_job_finish(sv, j, 0, NULL);
            pthread_mutex_unlock(&sv->mu);
        }
        if (st != KVP_ENOTFOUND) KVP_LOG_E("serve: collecting a result: %s", kvp_error_message());
    }
    /* stopping: everything queued or in flight gets 503; the other ranks stop too */
    if (sv->s) fail_in_flight(sv, 503, "the server is shutting down");
    pthread_mutex_lock(&sv->mu);
    for (job *j = sv->head, *next; j; j = next) {
        next = j->next;
        srv_job_finish(sv, j, 503, "the server is shutting down");
    }
    sv->head = sv->tail = NULL;
    pthread_mutex_unlock(&sv->mu);
    return NULL;
}

/* Queues job j for the engine and answers when it is done: a stream through x, else (x NULL) by
 * completion_answer once the engine has finished the job and resumed the connection (a client that leaves
 * meanwhile cancels its job, and gets no answer). */
enum MHD_Result srv_enqueue(server *sv, struct MHD_Connection *c, body *b, job *j, stream_ctx *x)
{
    pthread_mutex_lock(&sv->mu);
    const uint64_t id = sv->next_id++;
    j->refs = 2; /* the engine's (released by job_finish) and the handler's or the response's */
    j->t_arrival = b->arrival;
    j->t_queued = srv_now();
    if (sv->stop) {
        srv_job_finish(sv, j, 503, "the server is shutting down");
    } else {
        sv->mx.queued_prompts += j->n;
        if (sv->tail) sv->tail->next = j;
        else sv->head = j;
        sv->tail = j;
        pthread_cond_signal(&sv->wake);
    }
    if (x) {
        pthread_mutex_unlock(&sv->mu);
        *x = (stream_ctx){.sv = sv, .j = j, .c = c, .id = id, .created = time(NULL)};
        return srv_stream_reply(c, x);
    }
    b->j = j;
    b->id = id;
    if (!j->finished) srv_job_suspend(j, c);
    pthread_mutex_unlock(&sv->mu);
    return MHD_YES;
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

static int serve(const kvp_server_opts *o, const kvp_session_config *cfg, kvp_comm *comm, kvp_model *m)
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
    sv.cuda_blocks_asked = cfg->num_blocks;
    sv.o = *o;
    sampling_defaults(&sv, o->generation_config);
    kvp_status st = kvp_tok_for_model(sv.m, o->model, o->tokenizer, &sv.tok);
    int jinja = 0;
    if (st == KVP_OK)
        st = o->chat_template ? kvp_chat_template_parse(o->chat_template, &sv.chat)
                              : kvp_chat_template_of_model(o->model, kvp_model_is_gguf(m), &sv.chat, &jinja);
    if (st == KVP_OK && jinja && sv.chat == KVP_CHAT_NONE)
        KVP_LOG_W("serve: the model's chat template is none of the built-in ones (see --help): chat requests get "
                  "400 unless --chat-template names one");
    if (st == KVP_OK) st = sess_create(&sv, &sv.cfg.num_blocks); /* no other thread yet */
    if (st == KVP_OK && o->cuda) kvp_cuda_info_log(&sv.cuda_info); /* the memory split, at KVPAGE_LOG=info */
    if (st == KVP_OK) {
        srv_metrics_init(&sv);
        srv_metrics_step(&sv); /* the pool's size before any step */
    }
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
    pthread_mutex_init(&sv.cmu, NULL);
    pthread_cond_init(&sv.wake, NULL);
    const int rc = srv_http_run(&sv, o, &addr);
    kvp_session_destroy(sv.s); /* with --tp: its executor tells the other ranks to stop */
    kvp_free(sv.live);
    kvp_free(sv.wake_list);
    pthread_cond_destroy(&sv.wake);
    pthread_mutex_destroy(&sv.mu);
    pthread_mutex_destroy(&sv.cmu);
    kvp_tok_destroy(sv.tok);
    return rc;
}

/* Every rank: the communicator and this rank's part of the model; rank 0 serves, the others follow it. */
int kvp_server_run(const kvp_server_opts *o, kvp_session_config cfg)
{
    kvp_comm *comm = NULL;
    kvp_model *m = NULL;
    kvp_server_opts ro = *o;
    /* --tp N: as generate's (tp_threads.h, kvp_tp_comm_create) */
    kvp_tp_threads *followers = NULL;
    const kvp_tp_threads_spec spec = {.path = o->model, .weights = o->weight_dtype, .max_len = o->max_model_len,
                                      .threads = o->threads, .matmul = o->matmul, .cuda = o->cuda, .cu = o->cu};
    kvp_status st = kvp_tp_comm_create(o->tp, &spec, &comm, &followers);
    if (st == KVP_OK && o->cuda && o->tp > 1) ro.cu.device = kvp_comm_device(comm);
    o = &ro;
    if (st == KVP_OK) st = kvp_comm_quiet_other_ranks(comm);
    if (st == KVP_OK) st = kvp_model_load_ex(o->model, comm, o->weight_dtype, &m);
    if (st == KVP_OK) {
        kvp_model_set_threads(m, o->threads);
        kvp_model_set_matmul(m, o->matmul);
        if (o->kv_auto) cfg.kv_dtype = kvp_model_kv_dtype_auto(m);
        st = kvp_model_set_max_len(m, o->max_model_len);
    }
    /* this rank's bytes per block: the same on every rank (cuda: the device's split sizes the pool) */
    if (st == KVP_OK && cfg.num_blocks == 0 && !o->cuda)
        st = kvp_kv_blocks_in(m, cfg.kv_dtype, cfg.engine.block_size, o->kv_mem, "--kv-mem", &cfg.num_blocks);
    /* swap space as large as the cache by default; -1 when only the cuda split knows that size (the cuda
     * executor then asks for --swap-space) */
    if (st == KVP_OK && cfg.engine.preempt == KVP_PREEMPT_SWAP)
        st = o->swap_bytes < 0 ? (cfg.swap_blocks = cfg.num_blocks > 0 ? cfg.num_blocks : -1, KVP_OK)
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
        st = o->cuda ? kvp_cuda_follow(m, &o->cu, NULL) : kvp_cpu_follow(m, NULL);
        rc = st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail(CMD, st);
    }
    kvp_model_destroy(m);
    if (rc != KVP_EXIT_OK && comm) kvp_comm_abort(comm, rc); /* a rank that fails alone ends the whole job */
    /* the in-process ranks: a follower's failure is the one error line when rank 0 succeeded (rank 0's own
     * error names an aborting follower's) */
    if ((st = kvp_tp_threads_join(followers)) != KVP_OK && rc == KVP_EXIT_OK) rc = kvp_cli_fail(CMD, st);
    kvp_comm_destroy(comm);
    return rc;
}


kvp_status srv_engine_start(server *sv, pthread_t *thread)
{
    return pthread_create(thread, NULL, srv_engine_main, sv) == 0 ? KVP_OK
                                                                  : KVP_ERR(KVP_ENOMEM, "cannot start the engine thread");
}

void srv_engine_stop(server *sv, pthread_t thread)
{
    pthread_mutex_lock(&sv->mu);
    sv->stop = 1;
    pthread_cond_broadcast(&sv->wake);
    pthread_mutex_unlock(&sv->mu);
    pthread_join(thread, NULL); /* every request in flight has its answer (503) now */
}

void kvp_server_opts_default(kvp_server_opts *o)
{
    *o = (kvp_server_opts){.generation_config = 1, .host = "127.0.0.1", .port = 8000, .threads = 1,
                           .kv_mem = (int64_t)512 << 20, .max_conns = 4096, .tp = 1, .stream_interval = 1,
                           .matmul = KVP_MATMUL_INVARIANT, .weight_dtype = KVP_WEIGHT_AUTO, .kv_auto = 1,
                           .idle_timeout_s = 5, .header_timeout_s = 10, .max_request_tokens = (int64_t)1 << 20,
                           .max_response_bytes = (int64_t)128 << 20};
}
