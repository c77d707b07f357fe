/* runtime/server/openai.c — OpenAI's completions and chat protocol: a request's JSON checked and turned into a
 * job (prompts tokenized or rendered by the chat template, sampling parameters), the answer's JSON (choices,
 * logprobs, usage), and the endpoints /v1/completions, /v1/chat/completions, /v1/models, vLLM's /tokenize,
 * /detokenize and /reset_prefix_cache. */
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
#include "runtime/text/chat.h"
#include "runtime/text/reasoning.h"
#include "runtime/text/tokenizer.h"

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
    /* OpenAI's and vLLM's options that need what this server does not have (tool calling, structured output,
     * beam search, multimodal input, prompt logprobs, token filters) */
    static const char *const keys[] = {
        "suffix", "tools", "functions", "function_call", "response_format", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "guided_whitespace_pattern", "guided_decoding_backend", "structured_outputs",
        "prompt_logprobs", "use_beam_search", "bad_words", "allowed_token_ids", "truncate_prompt_tokens",
        "logits_processors", "prediction", "audio", "prompt_embeds", "mm_processor_kwargs", "multi_modal_data",
        "lora_request", "kv_transfer_params", "vllm_xargs"};
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice"); /* "none" (and "auto": no tools) is none */
    if (tc && !cJSON_IsNull(tc) &&
        !(cJSON_IsString(tc) && (strcmp(tc->valuestring, "none") == 0 || strcmp(tc->valuestring, "auto") == 0)))
        return snprintf(err, cap, "\"tool_choice\" is not supported by this server: it has no tool calling "
                                  "(\"none\" and \"auto\" without tools are accepted)"), 1;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format"), *rt = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (rf && !cJSON_IsNull(rf) && cJSON_IsString(rt) && strcmp(rt->valuestring, "text") == 0 && cJSON_GetArraySize(rf) == 1)
        rf = NULL; /* {"type": "text"}: plain text, what it gives anyway */
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(req, "modalities");
    if (mo && !cJSON_IsNull(mo) &&
        !(cJSON_IsArray(mo) && cJSON_GetArraySize(mo) == 1 && cJSON_IsString(mo->child) && !strcmp(mo->child->valuestring, "text")))
        return snprintf(err, cap, "\"modalities\" other than [\"text\"] are not supported by this server"), 1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!strcmp(keys[i], "response_format") && !rf) continue;
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
            if (len > 0 && srv_has_nul(x->valuestring))
                return snprintf(err, cap, "\"stop\" item %d has a NUL character (\\u0000), which no text can hold", j->nstop), 400;
            if (len < 1 || len > MAX_STOP_LEN)
                return snprintf(err, cap, "\"stop\" item %d is not a string of 1 to %d bytes", j->nstop, MAX_STOP_LEN), 400;
            if (!(j->stop[j->nstop] = kvp_malloc(len + 1))) return snprintf(err, cap, "out of memory: the server has no room for this request now"), 503;
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

/* s without the body check's NUL marks (C0 80: a NUL decodes to nothing, as <0x00> does), a copy. */
static char *dup_no_nul(const char *s)
{
    char *d = kvp_malloc(strlen(s) + 1), *w = d;
    if (!d) return NULL;
    for (const char *r = s; *r;) {
        if ((unsigned char)r[0] == 0xC0 && (unsigned char)r[1] == 0x80) r += 2;
        else *w++ = *r++;
    }
    *w = '\0';
    return d;
}

/* Tokenizes a client's text, its escaped NULs (kept as C0 80 by the body's check) as NUL bytes, as vLLM's
 * tokenizer sees "\u0000": kvp_tok_encode_ex's errors. */
static kvp_status encode_text(const server *sv, const char *s, unsigned flags, int32_t **ids, int32_t *n)
{
    if (!srv_has_nul(s)) return kvp_tok_encode_ex(sv->tok, s, strlen(s), flags, ids, n);
    char *t = kvp_malloc(strlen(s) + 1);
    if (!t) return KVP_ERR(KVP_ENOMEM, "out of memory: the server has no room for this request now");
    size_t len = 0;
    for (const char *r = s; *r;) {
        if ((unsigned char)r[0] == 0xC0 && (unsigned char)r[1] == 0x80) t[len++] = '\0', r += 2;
        else t[len++] = *r++;
    }
    const kvp_status st = kvp_tok_encode_ex(sv->tok, t, len, flags, ids, n);
    kvp_free(t);
    return st;
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
            if (!j->enc[i]) return snprintf(err, cap, "out of memory: the server has no room for this request now"), 503;
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
            const kvp_status est = encode_text(sv, x->valuestring, KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL, &j->enc[i], &len);
            if (est != KVP_OK) return snprintf(err, cap, "prompt %d: %s", i, kvp_error_message()), est == KVP_ENOMEM ? 503 : 400;
            j->n = i + 1;
            if (len >= maxlen) return snprintf(err, cap, "prompt %d is %d tokens, the model's context is %d", i, len, maxlen), 400;
        } else {
            return snprintf(err, cap, "\"prompt\" item %d is not a string or an array of token ids", i), 400;
        }
        if (j->echo && (cJSON_IsArray(x) ? kvp_tok_decode(sv->tok, -1, j->enc[i], len, &j->ptext[i]) != KVP_OK
                                         : !(j->ptext[i] = dup_no_nul(x->valuestring))))
            return snprintf(err, cap, "out of memory: the server has no room for this request now"), 503;
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
    int code = m && joined ? 0 : (snprintf(err, cap, "out of memory: the server has no room for this request now"), 503);
    int32_t i = 0;
    for (const cJSON *x = ms->child; !code && x; x = x->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role"), *content = cJSON_GetObjectItemCaseSensitive(x, "content");
        m[i].role = cJSON_IsString(role) ? role->valuestring : NULL;
        if (cJSON_IsString(content) && srv_has_nul(content->valuestring)) {
            code = (snprintf(err, cap, "message %d: a NUL character (\\u0000) in \"content\" is not supported (a "
                                       "completion's prompt may have one)", i), 400);
            break;
        }
        if (cJSON_IsString(content)) {
            m[i].content = content->valuestring;
            continue;
        }
        size_t len = 0; /* text parts */
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t) && srv_has_nul(t->valuestring)) {
                code = (snprintf(err, cap, "message %d: a NUL character (\\u0000) in \"content\" is not supported (a "
                                           "completion's prompt may have one)", i), 400);
                break;
            }
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
            code = (snprintf(err, cap, "out of memory: the server has no room for this request now"), 503);
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

/* A request's ceilings, once its prompts and max_tokens are known: vLLM's context check (an explicit max_tokens
 * past the context is 400, as in vLLM and OpenAI; a default one is cut to the room left), --max-num-seqs
 * (the samples of one prompt run at once), --max-request-tokens (sequences x max_tokens) and
 * --max-response-bytes (the answer's size, estimated). 0, or 400 with err naming the limit. */
static int check_limits(const server *sv, const cJSON *req, const job *j, int32_t n, int64_t max_tokens, char *err,
                        size_t cap)
{
    const kvp_server_opts *o = &sv->o;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(req, "max_tokens");
    const cJSON *mct = j->chat ? cJSON_GetObjectItemCaseSensitive(req, "max_completion_tokens") : NULL;
    const int given = (mt && !cJSON_IsNull(mt)) || (mct && !cJSON_IsNull(mct));
    const int32_t ctx = kvp_model_max_len(sv->m);
    int64_t prompt_tokens = 0;
    for (int32_t i = 0; i < j->n; i++) {
        const int64_t p = j->reqs[i].n_prompt;
        prompt_tokens += p;
        if (given && p + max_tokens > ctx)
            return snprintf(err, cap, "This model's maximum context length is %d tokens. However, you requested %lld "
                                      "tokens (%lld in the %s, %lld in the completion). Please reduce the length of the "
                                      "%s or completion.", ctx, (long long)(p + max_tokens), (long long)p,
                            j->chat ? "messages" : "prompt", (long long)max_tokens, j->chat ? "messages" : "prompt"), 400;
    }
    if (n > sv->cfg.engine.max_num_seqs)
        return snprintf(err, cap, "\"n\" is %d: more samples than --max-num-seqs (%d) can run at once", n,
                        (int)sv->cfg.engine.max_num_seqs), 400;
    const int64_t seqs = (int64_t)j->n * n, work = seqs * (max_tokens > 0 ? max_tokens : 1);
    if (work > o->max_request_tokens)
        return snprintf(err, cap, "the request asks for %lld sequences (prompts x n) x %lld tokens (max_tokens) = %lld, "
                                  "above the ceiling of one request, --max-request-tokens %lld", (long long)seqs,
                        (long long)max_tokens, (long long)work, (long long)o->max_request_tokens), 400;
    /* bytes a token adds to the answer: its text, with logprobs the token and its alternatives (the chat form
     * has bytes arrays), return_token_ids its id, a stream an event per token */
    const int64_t k = j->logprobs >= 0 ? j->logprobs + 1 : 0;
    const int64_t per_token = 16 + k * (j->chat ? 100 : 56) + (j->return_ids ? 12 : 0) + (j->stream ? 160 : 0);
    const int64_t bytes = seqs * 512 + (seqs * max_tokens + (j->echo ? prompt_tokens * n : 0)) * per_token;
    if (bytes > o->max_response_bytes)
        return snprintf(err, cap, "the answer could reach about %lld bytes (%lld choices x %lld tokens x ~%lld bytes a "
                                  "token%s), above the ceiling of one answer, --max-response-bytes %lld", (long long)bytes,
                        (long long)seqs, (long long)max_tokens, (long long)per_token, k ? " with its logprobs" : "",
                        (long long)o->max_response_bytes), 400;
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
    if ((code = check_limits(sv, req, j, (int32_t)n, (int64_t)max_tokens, err, cap))) return code;
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
        if (!j->ch) return snprintf(err, cap, "out of memory: the server has no room for this request now"), 503;
    }
    if (j->stream && j->echo && j->logprobs >= 0 && !(j->eplp = kvp_calloc((size_t)j->n, sizeof *j->eplp)))
        return snprintf(err, cap, "out of memory: the server has no room for this request now"), 503;
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

/* A completion object's head (the whole answer's, or a streamed event's): id, object, created, model. */
cJSON *srv_completion_head(const server *sv, const job *j, uint64_t id, time_t created)
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
void srv_add_finish(cJSON *o, const job *j, int32_t c)
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
cJSON *srv_lp_new(int chat)
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
void srv_lp_append(const server *sv, int chat, cJSON *o, const int32_t *seq, int32_t from, int32_t to, int32_t prev0,
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
cJSON *srv_usage_json(const job *j)
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
void srv_add_text_n(cJSON *obj, const char *key, const char *s, size_t n)
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
    srv_add_text_n(msg, "reasoning_content", p.reasoning, p.reasoning_len);
    if (p.content) kvp_json_add_text(msg, "content", p.content);
    else cJSON_AddNullToObject(msg, "content");
}

/* The response of a finished job. */
static cJSON *completion_json(server *sv, const job *j, uint64_t id)
{
    cJSON *o = srv_completion_head(sv, j, id, time(NULL));
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
                cJSON *lp = srv_lp_new(j->chat);
                long off = 0;
                if (j->echo) srv_lp_append(sv, 0, lp, q->prompt, 0, q->n_prompt, -1, &r->prompt_logprobs, &off);
                if (r->logprobs)
                    srv_lp_append(sv, j->chat, lp, r->tokens[s], 0, r->n_tokens[s], q->prompt[q->n_prompt - 1],
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
            srv_add_finish(ch, j, c);
        }
    }
    cJSON_AddItemToObject(o, "usage", srv_usage_json(j));
    return o;
}

/* vLLM's POST /reset_prefix_cache (SGLang's /flush_cache): done by the engine between two steps, before the
 * requests that came after it are added. */
enum MHD_Result srv_reset_cache(server *sv, struct MHD_Connection *c, body *b)
{
    job *j = kvp_calloc(1, sizeof *j);
    if (!j) return srv_reply_error(sv, c, 503, "out of memory: the server has no room for this request now");
    j->reset_cache = 1;
    return srv_enqueue(sv, c, b, j, NULL);
}

/* POST /v1/completions (chat 0) or /v1/chat/completions (chat 1). */
enum MHD_Result srv_completions(server *sv, struct MHD_Connection *c, body *b, int chat)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = srv_body_object(sv, c, b, &ret);
    if (!req) return ret;
    job *j = kvp_calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(req);
        return srv_reply_error(sv, c, 503, "out of memory: the server has no room for this request now");
    }
    char err[512] = "";
    j->chat = chat;
    int code = build_job(sv, req, j, err, sizeof err);
    cJSON_Delete(req);
    if (code) {
        srv_job_free(j);
        return srv_reply_error(sv, c, (unsigned)code, err);
    }
    stream_ctx *x = j->stream ? kvp_calloc(1, sizeof *x) : NULL;
    if (j->stream && !x) {
        srv_job_free(j);
        return srv_reply_error(sv, c, 503, "out of memory: the server has no room for this request now");
    }
    return srv_enqueue(sv, c, b, j, x);
}

/* The answer of b's completion, called again by MHD until the job is finished (then the handler lets go
 * of it). */
enum MHD_Result srv_completion_answer(server *sv, struct MHD_Connection *c, body *b)
{
    job *j = b->j;
    enum MHD_Result ret;
    pthread_mutex_lock(&sv->mu);
    if (!j->finished) { /* not for us yet */
        if (!j->suspended) srv_job_suspend(j, c);
        pthread_mutex_unlock(&sv->mu);
        return MHD_YES;
    }
    const int gone = j->cancelled;
    pthread_mutex_unlock(&sv->mu);
    if (gone) {
        ret = MHD_NO;
    } else if (j->status) {
        ret = srv_reply_error(sv, c, (unsigned)j->status, j->err);
    } else if (j->reset_cache) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "evicted_blocks", (double)j->evicted);
        ret = srv_reply_json(sv, c, 200, o);
    } else {
        cJSON *o = completion_json(sv, j, b->id);
        ret = o ? srv_reply_json(sv, c, 200, o) : srv_reply_error(sv, c, 503, "out of memory building the answer: the server has no room for it now");
    }
    pthread_mutex_lock(&sv->mu);
    srv_job_release(j);
    pthread_mutex_unlock(&sv->mu);
    b->j = NULL;
    return ret;
}

enum MHD_Result srv_models(server *sv, struct MHD_Connection *c)
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
    return srv_reply_json(sv, c, 200, o);
}

/* vLLM's POST /tokenize: {"prompt": TEXT, "add_special_tokens": true} or {"messages": [...],
 * "add_generation_prompt": true} (the chat template's prompt) -> {"count", "max_model_len", "tokens"}. */
enum MHD_Result srv_tokenize(server *sv, struct MHD_Connection *c, body *b)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = srv_body_object(sv, c, b, &ret);
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
        else if (encode_text(sv, p->valuestring, (bos ? KVP_TOK_ADD_BOS : 0) | KVP_TOK_PARSE_SPECIAL, &ids, &n) != KVP_OK)
            code = (snprintf(err, sizeof err, "%s", kvp_error_message()), 400);
    }
    cJSON_Delete(req);
    if (code) {
        kvp_free(ids);
        return srv_reply_error(sv, c, (unsigned)code, err);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", n);
    cJSON_AddNumberToObject(o, "max_model_len", kvp_model_max_len(sv->m));
    cJSON *t = cJSON_AddArrayToObject(o, "tokens");
    for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[i]));
    kvp_free(ids);
    return srv_reply_json(sv, c, 200, o);
}

/* vLLM's POST /detokenize: {"tokens": [TOKEN_ID, ...]} -> {"prompt": TEXT}. */
enum MHD_Result srv_detokenize(server *sv, struct MHD_Connection *c, body *b)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *req = srv_body_object(sv, c, b, &ret);
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
    if (err[0] || oom) return srv_reply_error(sv, c, err[0] ? 400 : 503, err[0] ? err : "out of memory: the server has no room for this request now");
    cJSON *o = cJSON_CreateObject();
    kvp_json_add_text(o, "prompt", text);
    kvp_free(text);
    return srv_reply_json(sv, c, 200, o);
}

