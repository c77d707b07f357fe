/* runtime/server/http.c — the libmicrohttpd glue: one event-driven thread over every connection, the request
 * body read (1 MiB at most), routing to the endpoints, the answers and error objects, and the daemon's life
 * from listening to the signal that stops it. */
#include <arpa/inet.h>
#include <math.h>
#include <poll.h>
#include <sys/socket.h>
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

enum MHD_Result srv_reply(struct MHD_Connection *c, unsigned code, const char *ctype, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

void srv_count_answer(server *sv, unsigned code)
{
    pthread_mutex_lock(&sv->mu);
    sv->mx.answered[code >= 500 ? 2 : code >= 400 ? 1 : 0]++;
    pthread_mutex_unlock(&sv->mu);
}

/* Answers cJSON object o (consumed) with code. */
enum MHD_Result srv_reply_json(server *sv, struct MHD_Connection *c, unsigned code, cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) code = 503; /* out of memory: this answer only, the server goes on */
    srv_count_answer(sv, code);
    enum MHD_Result r = srv_reply(c, code, "application/json", text ? text : "{\"error\":{\"message\":\"out of memory building the answer\",\"type\":\"server_error\",\"code\":503}}");
    cJSON_free(text);
    return r;
}

/* OpenAI's error object. */
enum MHD_Result srv_reply_error(server *sv, struct MHD_Connection *c, unsigned code, const char *msg)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    kvp_json_add_text(e, "message", msg); /* a message quoting a client's bytes stays valid UTF-8 */
    cJSON_AddStringToObject(e, "type", code == 404 ? "not_found_error" : code < 500 ? "invalid_request_error" : "server_error");
    cJSON_AddNumberToObject(e, "code", code);
    return srv_reply_json(sv, c, code, o);
}

enum MHD_Result srv_reply_too_big(server *sv, struct MHD_Connection *c)
{
    return srv_reply_error(sv, c, 413, "the request body is larger than 1 MiB");
}

int srv_has_nul(const char *s) { return strstr(s, "\xC0\x80") != NULL; }

/* Length of the valid UTF-8 character at s[0, n) (1-4), or 0 (overlong forms, surrogates, above U+10FFFF). */
static int utf8_char(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    const int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* The body as a strict JSON reader (Python's, vLLM's) takes it: valid UTF-8, no raw control byte inside a
 * string (JSON wants them escaped). A string's escaped NUL (\u0000) becomes the two bytes C0 80 (an overlong
 * NUL, never valid UTF-8, so never a client's own bytes): the strings keep their length through cJSON, and
 * srv_text_nul gives the NUL back where a NUL is taken (a prompt). *len shrinks accordingly. 0, or 400 with
 * err naming the byte. */
static int body_check(char *buf, size_t *len, char *err, size_t cap)
{
    unsigned char *s = (unsigned char *)buf;
    size_t w = 0, n = *len;
    int in_str = 0;
    for (size_t r = 0; r < n;) {
        const int k = utf8_char(s + r, n - r);
        if (k == 0)
            return snprintf(err, cap, "the request body is not valid UTF-8 (byte %zu)", r), 400;
        if (s[r] < 0x20 && (in_str || (s[r] != ' ' && s[r] != '\t' && s[r] != '\n' && s[r] != '\r')))
            return snprintf(err, cap, "invalid control character 0x%02x at byte %zu of the request body (JSON wants it "
                                      "escaped, \\u%04x)", s[r], r, s[r]), 400;
        if (in_str && s[r] == '\\' && r + 1 < n) {
            if (r + 5 < n && s[r + 1] == 'u' && memcmp(s + r + 2, "0000", 4) == 0) {
                s[w++] = 0xC0, s[w++] = 0x80; /* \u0000 */
                r += 6;
            } else {
                s[w++] = s[r++], s[w++] = s[r++]; /* an escape: its second byte is no quote */
            }
            continue;
        }
        if (s[r] == '"') in_str = !in_str;
        for (int i = 0; i < k; i++) s[w++] = s[r++];
    }
    *len = w;
    return 0;
}

/* The request body as a JSON object, or NULL with the 4xx answer queued in *ret. */
cJSON *srv_body_object(server *sv, struct MHD_Connection *c, body *b, enum MHD_Result *ret)
{
    if (b->too_big) {
        *ret = srv_reply_too_big(sv, c);
        return NULL;
    }
    char err[200];
    if (b->len && body_check(b->buf, &b->len, err, sizeof err)) {
        *ret = srv_reply_error(sv, c, 400, err);
        return NULL;
    }
    cJSON *req = b->len ? cJSON_ParseWithLength(b->buf, b->len) : NULL;
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        *ret = srv_reply_error(sv, c, 400, "the request body is not a JSON object");
        return NULL;
    }
    return req;
}

/* ---------------------------------------------------------------- connections
 *
 * Every open connection is in sv->conns with its state: idle (waiting for a request's head: new, or between
 * two requests), reading (its head came, its body is coming) or busy (its request is read: waiting on the
 * engine, answering, streaming). libmicrohttpd closes a connection on which no byte moved for --idle-timeout;
 * the server closes an idle or reading one whose request has not all come within --header-timeout of the
 * connection's opening or its previous answer (a slow-loris client), and a busy one has no timeout. When a new
 * connection makes more than --max-connections, the oldest idle or reading one is closed to make room (nginx
 * drops idle keep-alive connections so); when every one is busy, the new one is answered 503. A connection is
 * closed by shutdown(2) on its socket, under cmu, and stays listed until libmicrohttpd reports it closed, so
 * the descriptor is never reused meanwhile. */

enum { CONN_IDLE = 0, CONN_READING, CONN_BUSY };

typedef struct srv_conn {
    struct srv_conn *prev, *next;
    int fd;
    int state;
    double since;  /* when it became idle (opened, or its last answer done) */
    int closing;   /* shut down by the server */
    int refused;   /* over the limit with every other busy: its request gets 503 */
} srv_conn;

/* Closes conn x (caller holds cmu). */
static void conn_close(server *sv, srv_conn *x)
{
    if (x->closing) return;
    x->closing = 1;
    sv->nclosing++;
    shutdown(x->fd, SHUT_RDWR);
}

static srv_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void conn_set(server *sv, struct MHD_Connection *c, int state)
{
    srv_conn *x = conn_of(c);
    if (!x) return;
    pthread_mutex_lock(&sv->cmu);
    x->state = state;
    if (state == CONN_IDLE) x->since = srv_now();
    pthread_mutex_unlock(&sv->cmu);
    /* a busy connection waits on the engine or streams: no idle timeout (0: none) */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, state == CONN_BUSY ? 0u : (unsigned)ceil(sv->o.idle_timeout_s));
}

static void on_connection(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode what)
{
    server *sv = cls;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conn *x = *ctx;
        if (!x) return;
        pthread_mutex_lock(&sv->cmu);
        if (x->prev) x->prev->next = x->next;
        else sv->conns = x->next;
        if (x->next) x->next->prev = x->prev;
        sv->nconns--;
        sv->nclosing -= x->closing;
        pthread_mutex_unlock(&sv->cmu);
        kvp_free(x);
        *ctx = NULL;
        return;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    srv_conn *x = ci ? kvp_calloc(1, sizeof *x) : NULL;
    *ctx = x;
    if (!x) return; /* untracked: it still has libmicrohttpd's own timeout */
    x->fd = ci->connect_fd;
    x->since = srv_now();
    pthread_mutex_lock(&sv->cmu);
    if (sv->nconns - sv->nclosing >= sv->o.max_conns) { /* make room: the idle one waiting longest */
        srv_conn *victim = NULL;
        for (srv_conn *y = sv->conns; y; y = y->next)
            if (!y->closing && y->state != CONN_BUSY && (!victim || y->since < victim->since)) victim = y;
        if (victim) conn_close(sv, victim);
        else x->refused = 1;
    }
    x->next = sv->conns;
    if (sv->conns) sv->conns->prev = x;
    sv->conns = x;
    sv->nconns++;
    pthread_mutex_unlock(&sv->cmu);
}

/* Closes the idle and reading connections past the header timeout (every one with all, at shutdown). */
static void close_stale(server *sv, int all)
{
    const double now = srv_now();
    pthread_mutex_lock(&sv->cmu);
    for (srv_conn *x = sv->conns; x; x = x->next)
        if (x->state != CONN_BUSY && (all || now - x->since > sv->o.header_timeout_s)) conn_close(sv, x);
    pthread_mutex_unlock(&sv->cmu);
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
        b->arrival = srv_now();
        conn_set(sv, c, CONN_READING);
        srv_conn *x = conn_of(c);
        if (x && x->refused) { /* one 503, and the connection closes after it */
            b->too_big = 1; /* its body is not read */
            x->refused = 0;
            char msg[256];
            snprintf(msg, sizeof msg, "{\"error\":{\"message\":\"too many connections: all %d (--max-connections) are "
                                      "busy\",\"type\":\"server_error\",\"code\":503}}", (int)sv->o.max_conns);
            struct MHD_Response *r = MHD_create_response_from_buffer(strlen(msg), msg, MHD_RESPMEM_MUST_COPY);
            if (!r) return MHD_NO;
            MHD_add_response_header(r, "Content-Type", "application/json");
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
            srv_count_answer(sv, 503);
            const enum MHD_Result ret = MHD_queue_response(c, 503, r);
            MHD_destroy_response(r);
            return ret;
        }
        /* a body announced larger than we take: answered now, not after reading (and dropping) all of it */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > MAX_BODY) {
            b->too_big = 1;
            return srv_reply_too_big(sv, c);
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
    if (b->j) return srv_completion_answer(sv, c, b);
    conn_set(sv, c, CONN_BUSY);
    const int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0)
        return post ? srv_completions(sv, c, b, 0) : srv_reply_error(sv, c, 405, "use POST for /v1/completions");
    if (strcmp(url, "/v1/chat/completions") == 0)
        return post ? srv_completions(sv, c, b, 1) : srv_reply_error(sv, c, 405, "use POST for /v1/chat/completions");
    if (strcmp(url, "/v1/models") == 0) return get ? srv_models(sv, c) : srv_reply_error(sv, c, 405, "use GET for /v1/models");
    if (strcmp(url, "/tokenize") == 0) return post ? srv_tokenize(sv, c, b) : srv_reply_error(sv, c, 405, "use POST for /tokenize");
    if (strcmp(url, "/detokenize") == 0)
        return post ? srv_detokenize(sv, c, b) : srv_reply_error(sv, c, 405, "use POST for /detokenize");
    if (strcmp(url, "/metrics") == 0) return get ? srv_metrics(sv, c) : srv_reply_error(sv, c, 405, "use GET for /metrics");
    if (strcmp(url, "/reset_prefix_cache") == 0 || strcmp(url, "/flush_cache") == 0)
        return post ? srv_reset_cache(sv, c, b) : srv_reply_error(sv, c, 405, "use POST to reset the prefix cache");
    if (strcmp(url, "/health") == 0) {
        if (!get) return srv_reply_error(sv, c, 405, "use GET for /health");
        srv_count_answer(sv, 200);
        return srv_reply(c, 200, "text/plain", "");
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no such endpoint: %s %.200s", method, url);
    return srv_reply_error(sv, c, 404, msg);
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)c, (void)why;
    server *sv = cls;
    body *b = *con_cls;
    if (b && b->j) { /* ended before its answer (the daemon stopping): the engine aborts the job */
        pthread_mutex_lock(&sv->mu);
        b->j->suspended = 0; /* the connection is going: no one may resume it */
        srv_cancel_job(sv, b->j);
        srv_job_release(b->j);
        pthread_mutex_unlock(&sv->mu);
    }
    if (b) kvp_free(b->buf);
    kvp_free(b);
    *con_cls = NULL;
    conn_set(sv, c, CONN_IDLE);
}

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

/* Serves on addr until SIGINT or SIGTERM: starts the engine thread and the daemon, prints the start line,
 * waits for the signal, then stops the engine (requests in flight get 503), lets the connections send their
 * answers and stops the daemon. The exit code. */
int srv_http_run(server *sv, const kvp_server_opts *o, const struct sockaddr_in *addr)
{
    kvp_status st;
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
    } else if ((st = srv_engine_start(sv, &engine)) != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
    } else {
        /* one event-driven thread over poll() (descriptors past FD_SETSIZE are served too; MHD's epoll mode
         * left half-closed connections with an unfinished request open, found by the serve fuzz target),
         * connections suspended while they wait on the engine */
        d = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME, 0, NULL,
                             NULL, handle, sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)addr,
                             MHD_OPTION_NOTIFY_COMPLETED, request_done, sv, MHD_OPTION_NOTIFY_CONNECTION,
                             on_connection, sv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ceil(o->idle_timeout_s),
                             /* room above the limit: connections the server closed and libmicrohttpd has not */
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns + 64u, MHD_OPTION_END);
        if (!d) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EIO, "cannot listen on %s:%d (in use, or not an address of this "
                                                    "machine)", o->host, o->port));
        } else {
            const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
            const int port = info ? info->port : o->port;
            fprintf(stderr, "kvpage serve: listening on http://%s:%d (model %s, %d KV blocks of %d tokens)\n", o->host,
                    port, sv->name, sv->cfg.num_blocks, sv->cfg.engine.block_size);
            if (o->cuda) { /* the memory split, always (kvp_cuda_info_log's lines are info-level) */
                const kvp_cuda_mem_split *ms = &sv->cuda_info.split;
                const double G = 1024.0 * 1024 * 1024;
                fprintf(stderr, "kvpage serve: cuda:%d %s%s: %.2f GiB, budget %.2f GiB (utilization %.2f) = weights "
                                "%.3f + activations %.3f + KV %.3f GiB%s (%d blocks of %lld bytes)\n", o->cu.device,
                        sv->cuda_info.device_name, sv->cuda_info.emulated ? " (the CPU emulator of CUDA)" : "",
                        ms->total / G, ms->budget / G, ms->utilization, ms->weights / G, ms->activations / G, ms->kv / G,
                        ms->kv_given ? " (--kv-cache-memory)" : "", ms->num_blocks, (long long)ms->block_bytes);
            }
            if (o->json) {
                char url[64];
                snprintf(url, sizeof url, "http://%s:%d", o->host, port);
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "url", url);
                cJSON_AddStringToObject(j, "model", sv->name);
                cJSON_AddNumberToObject(j, "num_blocks", sv->cfg.num_blocks);
                cJSON_AddNumberToObject(j, "block_size", sv->cfg.engine.block_size);
                cJSON_AddStringToObject(j, "chat_template", kvp_chat_template_name(sv->chat));
                cJSON_AddStringToObject(j, "weight_dtype", kvp_weight_type_name(kvp_model_weight_type(sv->m)));
                cJSON_AddStringToObject(j, "kv_dtype", kvp_dtype_name(sv->cfg.kv_dtype));
                cJSON_AddStringToObject(j, "device", o->cuda ? "cuda" : "cpu");
                if (o->cuda) kvp_cuda_info_json(&sv->cuda_info, j); /* "cuda": the device and its memory split */
                cJSON *ds = cJSON_AddObjectToObject(j, "default_sampling");
                cJSON_AddNumberToObject(ds, "temperature", sv->dflt.temperature);
                cJSON_AddNumberToObject(ds, "top_p", sv->dflt.top_p);
                cJSON_AddNumberToObject(ds, "top_k", (double)sv->dflt.top_k);
                cJSON_AddNumberToObject(ds, "min_p", sv->dflt.min_p);
                cJSON_AddNumberToObject(ds, "repetition_penalty", sv->dflt.repetition_penalty);
                cJSON_AddNumberToObject(ds, "max_tokens", (double)sv->dflt.max_tokens);
                cJSON_AddNumberToObject(j, "pid", (double)getpid()); /* with --tp: rank 0's, the one to signal */
                char *line = cJSON_PrintUnformatted(j); /* one line: a script reads it with readline */
                if (!line || printf("%s\n", line) < 0) KVP_LOG_W("serve: cannot print the --json line");
                cJSON_free(line);
                cJSON_Delete(j);
                fflush(stdout);
            }
            unsigned char sig = 0;
            for (;;) { /* the signal, and four times a second the header timeout */
                struct pollfd pf = {.fd = g_sig_pipe[0], .events = POLLIN};
                const int r = poll(&pf, 1, 250);
                if (r > 0 && read(g_sig_pipe[0], &sig, 1) == 1) break;
                if (r < 0 && errno != EINTR) break;
                close_stale(sv, 0);
            }
            fprintf(stderr, "kvpage serve: signal %d, stopping\n", sig);
            MHD_quiesce_daemon(d); /* no new connections */
        }
        srv_engine_stop(sv, engine); /* every request in flight has its answer (503) now */
        /* idle connections are closed at once; the others send those answers (stopping the daemon closes them
         * mid-way), 5 s at most, and are closed as they become idle */
        for (int i = 0; d && i < 500; i++) {
            close_stale(sv, 1);
            const union MHD_DaemonInfo *ci = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
            if (!ci || ci->num_connections == 0) break;
            usleep(10 * 1000);
        }
        if (d) MHD_stop_daemon(d);
    }
    /* the handler and its pipe stay until the process ends: a second signal meanwhile is ignored (closing the
     * pipe would race with a handler about to write to it) */
    return rc;
}
