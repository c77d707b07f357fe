/* runtime/server/stream.c — streamed answers as server-sent events (OpenAI's chunks): the response's reader
 * waits (its connection suspended) for the engine's new text, sends whole UTF-8 characters that can no longer
 * become a stop string, and ends with the finish reasons, the usage and [DONE]; a client that leaves cancels
 * its job. */
#include <sys/socket.h>

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
#include "runtime/text/reasoning.h"

/* 1 when the client of connection c has closed it (or it broke): a peek, without waiting. */
int srv_client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    const ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The client of job j left before its answer (caller holds mu): the engine aborts its requests. */
void srv_cancel_job(server *sv, job *j)
{
    if (j->cancelled || j->finished) return;
    j->cancelled = 1;
    sv->cancels++;
    sv->mx.cancelled++;
    pthread_cond_signal(&sv->wake);
}

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
    cJSON *o = srv_completion_head(x->sv, x->j, x->id, x->created);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", c);
    if (x->j->chat) { /* OpenAI's chunks: the role in a choice's first delta, then its new content */
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (!x->began[c]) cJSON_AddStringToObject(d, "role", "assistant");
        if (rn > 0) srv_add_text_n(d, "reasoning_content", reasoning, rn);
        if (n > 0 || (!x->began[c] && rn == 0)) kvp_json_add_text(d, "content", t);
        x->began[c] = 1;
    } else {
        kvp_json_add_text(ch, "text", t);
    }
    kvp_free(t);
    if (j->logprobs >= 0) { /* the places decoded since the last event (echo: the prompt's first) */
        const choice *h = &j->ch[c];
        const kvp_session_request *q = &j->reqs[i];
        cJSON *lp = srv_lp_new(j->chat);
        if (j->echo && !x->echoed[c]) srv_lp_append(x->sv, 0, lp, q->prompt, 0, q->n_prompt, -1, &j->eplp[i], &x->lp_off[c]);
        srv_lp_append(x->sv, j->chat, lp, h->toks, x->lp_sent[c], h->lp.n, q->prompt[q->n_prompt - 1], &h->lp, &x->lp_off[c]);
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
    if (last) srv_add_finish(ch, x->j, c);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (x->j->continuous_usage) cJSON_AddItemToObject(o, "usage", srv_usage_json(x->j));
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
            kvp_json_add_text(e, "message", j->err);
            cJSON_AddStringToObject(e, "type", j->status < 500 ? "invalid_request_error" : "server_error");
            cJSON_AddNumberToObject(e, "code", j->status);
            out_event(x, o);
        } else {
            for (int32_t c = 0; c < nc; c++) /* the rest of the text, then the finish reason */
                stream_text(x, c, j->ch[c].t.text, j->ch[c].t.len, 1);
            if (j->include_usage) { /* OpenAI's last event: no choices, the usage */
                cJSON *o = srv_completion_head(sv, j, x->id, x->created);
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", srv_usage_json(j));
                out_event(x, o);
            }
        }
        out_add(x, "data: [DONE]\n\n");
        x->done = 1;
    } else if (j->cancelled) {
        gone = 1; /* its client left (the engine found it gone) */
    } else {
        srv_job_suspend(j, x->c); /* nothing new: resumed by the engine when there is */
    }
    pthread_mutex_unlock(&sv->mu);
    for (int32_t c = 0; c < nc; c++)
        if (slice[c]) {
            stream_event(x, c, NULL, 0, slice[c], slen[c], 0);
            kvp_free(slice[c]);
        }
    if (x->done) { /* counted when it ends: an error event makes it an error */
        srv_count_answer(sv, j->status ? (unsigned)j->status : 200);
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
    srv_cancel_job(x->sv, x->j);
    srv_job_release(x->j);
    pthread_mutex_unlock(&x->sv->mu);
    kvp_free(x->out);
    kvp_free(x);
}

enum MHD_Result srv_stream_reply(struct MHD_Connection *c, stream_ctx *x)
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

