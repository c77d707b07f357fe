/* runtime/server/server_internal.h — what the files of runtime/server/ share: a job (one HTTP completion
 * request, its prompts as session requests), the server (the session, the queue, the metrics), a request's
 * body, a stream's state, and the functions each file offers the others (prefix srv_).
 *
 * Locking: sv->mu guards the queue, the live jobs, every job's flags and streamed text, and the metrics; the
 * engine thread alone touches the session. A job has two references (the engine's, the answer's); the last
 * one released frees it.
 */
#ifndef KVP_RUNTIME_SERVER_INTERNAL_H
#define KVP_RUNTIME_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "common/json.h"
#include "parallel/comm.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/server/server.h"
#include "runtime/text/chat.h"
#include "runtime/text/reasoning.h"
#include "runtime/text/stop_text.h"
#include "runtime/text/tokenizer.h"

#define CMD "serve"

enum {
    MAX_BODY = 1 << 20,
    MAX_PROMPTS = 256,
    MAX_STREAM = 64, /* choices of a streamed request */
    MAX_STOP = 16,   /* stop strings of a request */
    MAX_STOP_LEN = 256,
    MAX_STOP_IDS = 64,
    MAX_BIAS = 1024, /* logit_bias entries */
};

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
    double t_arrival, t_queued, t_added; /* monotonic seconds: its head read, queued for the engine, added to it */
} job;

/* A Prometheus histogram over the nb rising bounds le (then +Inf): n[i] observations in bucket i (not
 * cumulative), their sum. */
enum { NLAT = 22, SRV_MAX_BOUNDS = 40 };
typedef struct {
    const double *le; /* [nb] borrowed: static, or the server's */
    int nb;
    int64_t n[SRV_MAX_BOUNDS + 1];
    double sum;
} histo;

/* What /metrics shows (under mu): the engine's counts after the last step, and per finished request (one
 * prompt of an HTTP request, with its n samples) the histograms of vLLM's names. Times in seconds. */
typedef struct {
    kvp_session_stats stats;
    int32_t num_blocks;                 /* the KV pool's blocks (with --device cuda: its session's split) */
    int64_t held_blocks, cached_blocks; /* KV blocks sequences hold; blocks only the prefix cache holds */
    int have_ledger;
    kvp_ledger_stats ledger;            /* the prefix cache's miss classes and block health */
    int64_t queued_prompts;             /* prompts parsed and queued, not yet given to the engine */
    int64_t answered[3];                /* HTTP answers: 2xx, 4xx, 5xx */
    int64_t cancelled;                  /* requests whose client left before the answer */
    int64_t prompt_tokens, generation_tokens; /* of finished requests */
    int64_t success[3];                 /* finished samples by reason: stop, length, abort */
    histo ttft, ttft_engine, itl, tpot, e2e, queue, inference, prefill, decode; /* latencies */
    histo prompt_len, gen_len, max_gen_len, params_n, params_max_tokens, prefill_computed, preempts, iteration;
} srv_metrics_state;

/* The server: the model and its tokenizer, the options, the engine thread's session and queues, the open
 * connections, the metrics. One for the process (rank 0). */
typedef struct {
    kvp_model *m;
    kvp_tokenizer *tok;
    kvp_chat_template chat;
    int reasoning; /* --reasoning-parser deepseek_r1: chat answers split at </think> (runtime/text/reasoning.h) */
    int32_t stream_interval; /* --stream-interval: a stream is resumed every N steps that extend it */
    char name[256];
    kvp_server_opts o;   /* the options it was started with (limits, timeouts, metric names) */
    const char *mprefix; /* metric names' prefix: "kvpage:" or "vllm:" */
    double tok_le[SRV_MAX_BOUNDS]; /* token-count histograms' bounds: 1, 2, 5, 10, ... up to the context */
    int tok_nb;
    kvp_session_config cfg; /* with --device cuda, num_blocks is the split's once the session exists (the
                               engine thread writes it; /metrics reads mx.num_blocks) */
    int32_t cuda_blocks_asked; /* --device cuda: the num_blocks asked for (0: the split's), for a new session */
    kvp_cuda_info cuda_info;   /* --device cuda: the device and its memory split */
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
    /* connections (http.c, under cmu): every open one, to close idle ones at the limit, past the header
     * timeout and at shutdown */
    pthread_mutex_t cmu;
    struct srv_conn *conns;
    int32_t nconns, nclosing; /* open; of them, shut down by the server and not closed yet */
    int64_t last_computed; /* engine thread: computed tokens after the step before (iteration_tokens) */
    /* under mu */
    srv_metrics_state mx;
    uint64_t next_seed, next_id;
    time_t started;
} server;

/* One HTTP request on its connection (libmicrohttpd's con_cls): its body as read, and its job once queued. */
typedef struct {
    char *buf;
    size_t len;
    int too_big;
    struct job *j; /* a completion waiting (suspended) for its answer: the handler's reference */
    uint64_t id;
    double arrival;  /* monotonic seconds when its head was read */
} body;

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


/* ---- engine_loop.c */
void srv_job_free(job *j);
void srv_job_release(job *j);                                /* caller holds mu; the last reference frees */
void srv_job_suspend(job *j, struct MHD_Connection *c);      /* caller holds mu: waits until the engine resumes */
void srv_job_finish(server *sv, job *j, int status, const char *err); /* caller holds mu */
/* Queues j for the engine; answers through stream x, else (x NULL) by srv_completion_answer once resumed. */
enum MHD_Result srv_enqueue(server *sv, struct MHD_Connection *c, body *b, job *j, stream_ctx *x);
kvp_status srv_engine_start(server *sv, pthread_t *thread);
void srv_engine_stop(server *sv, pthread_t thread);          /* in-flight and queued jobs get 503 */

/* ---- http.c */
enum MHD_Result srv_reply(struct MHD_Connection *c, unsigned code, const char *ctype, const char *text);
void srv_count_answer(server *sv, unsigned code);
enum MHD_Result srv_reply_json(server *sv, struct MHD_Connection *c, unsigned code, cJSON *o); /* o consumed */
enum MHD_Result srv_reply_error(server *sv, struct MHD_Connection *c, unsigned code, const char *msg);
enum MHD_Result srv_reply_too_big(server *sv, struct MHD_Connection *c);
/* The body as a JSON object, or NULL with the 4xx answer queued in *ret. */
cJSON *srv_body_object(server *sv, struct MHD_Connection *c, body *b, enum MHD_Result *ret);
/* A client string with its escaped NULs (kept as C0 80 by the body's check): 1 when it has one. */
int srv_has_nul(const char *s);
int srv_http_run(server *sv, const kvp_server_opts *o, const struct sockaddr_in *addr);

/* ---- openai.c */
cJSON *srv_completion_head(const server *sv, const job *j, uint64_t id, time_t created);
void srv_add_finish(cJSON *o, const job *j, int32_t c);
cJSON *srv_lp_new(int chat);
void srv_lp_append(const server *sv, int chat, cJSON *o, const int32_t *seq, int32_t from, int32_t to, int32_t prev0,
                   const kvp_logprobs *a, long *off);
cJSON *srv_usage_json(const job *j);
void srv_add_text_n(cJSON *obj, const char *key, const char *s, size_t n);
enum MHD_Result srv_completions(server *sv, struct MHD_Connection *c, body *b, int chat);
enum MHD_Result srv_completion_answer(server *sv, struct MHD_Connection *c, body *b);
enum MHD_Result srv_models(server *sv, struct MHD_Connection *c);
enum MHD_Result srv_tokenize(server *sv, struct MHD_Connection *c, body *b);
enum MHD_Result srv_detokenize(server *sv, struct MHD_Connection *c, body *b);
enum MHD_Result srv_reset_cache(server *sv, struct MHD_Connection *c, body *b);

/* ---- stream.c */
int srv_client_gone(struct MHD_Connection *c);  /* a peek: the client closed its connection */
void srv_cancel_job(server *sv, job *j);       /* caller holds mu: the client left, the engine aborts */
enum MHD_Result srv_stream_reply(struct MHD_Connection *c, stream_ctx *x);

/* ---- metrics.c */
extern const double srv_lat_le[NLAT];
void srv_histo_init(histo *h, const double *le, int nb);
void srv_histo_add(histo *h, double x);
void srv_histo_add_n(histo *h, double x, int64_t count); /* count observations of x */
void srv_metrics_init(server *sv);                      /* the histograms' bounds; caller holds nothing */
/* After a step (engine thread, caller holds mu): the engine's counts, KV use, ledger, tokens of the step. */
void srv_metrics_step(server *sv);
/* A finished session request r of job j, prompt i (engine thread, caller holds mu). */
void srv_metrics_finished(server *sv, const struct job *j, int32_t i, const kvp_session_result *r);
double srv_now(void); /* monotonic seconds */
enum MHD_Result srv_metrics(server *sv, struct MHD_Connection *c);

#endif
