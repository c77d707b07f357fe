/* runtime/text/chat.c — built-in chat templates (see chat.h). What each one renders, from its model's template:
 *
 *   llama2   Llama-2-chat:  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
 *            (contents stripped of surrounding whitespace; roles alternate user/assistant after one system)
 *   mistral  Mistral-7B-Instruct v0.1:  <s>[INST] {user} [/INST]{assistant}</s>[INST] ...  (no system role)
 *   mistral-v3  mistralai's "v3" (Mistral-Large-Instruct-2407):  <s>[INST] {user}[/INST] {assistant, stripped}</s>
 *            [INST] ...; a system message goes before the last message when that is the user's: "{system}\n\n{user}"
 *   mistral-v3-tekken  mistralai's "v3-tekken" (Mistral-Nemo-Instruct-2407):  as v3 without the spaces and with the
 *            answer as it is:  <s>[INST]{user}[/INST]{assistant}</s>[INST]...
 *   mistral-v7  mistralai's "v7" (Mistral-Large-Instruct-2411):  <s>[SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT][INST]
 *            {user}[/INST] {assistant}</s>... (every message in order; [INST], [SYSTEM_PROMPT] are control tokens)
 *            (none of the mistral templates writes a generation prompt: the prompt ends at [/INST])
 *   mistral-small-3  mistralai's "v7-tekken" (Mistral-Small-3.1-24B-Instruct-2503):  <s>[SYSTEM_PROMPT]{system, or
 *            the model's default one with today's date}[/SYSTEM_PROMPT][INST]{user}[/INST]{assistant}</s>...
 *   qwen3-thinking  Qwen3-4B-Thinking-2507: ChatML; an answer's "<think>..</think>" reasoning is dropped before the
 *            last user message and rewritten "<think>\n{reasoning}\n</think>\n\n{answer}" after it; the generation
 *            prompt is "<|im_start|>assistant\n<think>\n"
 *   deepseek-r1  DeepSeek-R1-Distill-*: <s>{system}<｜User｜>{user}<｜Assistant｜>{answer after its </think>}
 *            <｜end▁of▁sentence｜>...; the generation prompt is <｜Assistant｜>
 *   zephyr   Zephyr / TinyLlama-chat:  <|system|>\n{system}</s>\n<|user|>\n{user}</s>\n<|assistant|>\n
 *   llama3   Llama-3-Instruct:  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>...
 *            (contents stripped)
 *   llama3.1 Llama-3.1-Instruct: the same after a system message that opens "Cutting Knowledge Date:
 *            December 2023\nToday Date: 26 Jul 2024\n\n" and holds the conversation's system message
 *   llama3.2 Llama-3.2/3.3-Instruct: as llama3.1 with today's date ("%d %b %Y", as their templates'
 *            strftime_now writes it)
 *   chatml   ChatML (Qwen3, and others):  <|im_start|>{role}\n{content}<|im_end|>\n...
 *   qwen2    ChatML with Qwen2-Instruct's default system message ("You are a helpful assistant.")
 *   qwen2.5  ChatML with Qwen2.5-Instruct's ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
 *   gemma    Gemma and Gemma 2 (-it):  <bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n{assistant}
 *            <end_of_turn>\n...  (contents stripped; no system message; the prompt ends "<start_of_turn>model\n")
 *   gemma3   Gemma 3 (-it): the same, a first system message going, as it is, before the first turn's content:
 *            "{system}\n\n{user}"
 */
#include "runtime/text/chat.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/json.h"
#include "runtime/loader/gguf.h"

static const char *const k_names[] = {"none",     "llama2",   "mistral",  "zephyr",     "llama3",
                                      "chatml",   "qwen2",    "qwen2.5",  "llama3.1",   "llama3.2",
                                      "smollm2",  "mistral-v3", "mistral-v3-tekken", "mistral-v7",
                                      "qwen3-thinking", "deepseek-r1", "mistral-small-3", "gemma", "gemma3"};
#define N_TEMPLATES ((int)(sizeof k_names / sizeof k_names[0]))

/* The system message Qwen's and SmolLM2's templates put first when the conversation has none. */
static const char *default_system(kvp_chat_template t)
{
    if (t == KVP_CHAT_QWEN2) return "You are a helpful assistant.";
    if (t == KVP_CHAT_QWEN25) return "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    if (t == KVP_CHAT_SMOLLM2) return "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
    return NULL;
}

kvp_status kvp_chat_template_parse(const char *name, kvp_chat_template *out)
{
    for (int t = KVP_CHAT_LLAMA2; t < N_TEMPLATES; t++)
        if (strcmp(name, k_names[t]) == 0) {
            *out = (kvp_chat_template)t;
            return KVP_OK;
        }
    char names[256];
    kvp_chat_template_list(names, sizeof names);
    return KVP_ERR(KVP_EINVAL, "unknown chat template '%s' (%s)", name, names);
}

void kvp_chat_template_list(char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int t = KVP_CHAT_LLAMA2; t < N_TEMPLATES && at < cap; t++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", t == KVP_CHAT_LLAMA2 ? "" : t + 1 == N_TEMPLATES ? " or " : ", ",
                               k_names[t]);
}

const char *kvp_chat_template_name(kvp_chat_template t)
{
    return (unsigned)t < sizeof k_names / sizeof k_names[0] ? k_names[t] : "?";
}

kvp_chat_template kvp_chat_template_detect(const char *jinja)
{
    if (!jinja) return KVP_CHAT_NONE;
    if (strstr(jinja, "[INST]")) { /* mistralai's v7 has a system prompt token, v3-tekken no space after [INST] */
        if (strstr(jinja, "[SYSTEM_PROMPT]")) /* v7, or v7-tekken (Mistral-Small-3.x: no space after [INST]) */
            return strstr(jinja, "'[INST]'") || strstr(jinja, "\"[INST]\"") ? KVP_CHAT_MISTRAL_SMALL3 : KVP_CHAT_MISTRAL_V7;
        if (strstr(jinja, "<<SYS>>")) return KVP_CHAT_LLAMA2;
        if (strstr(jinja, "\"[INST]\"") || strstr(jinja, "'[INST]'")) return KVP_CHAT_MISTRAL_V3_TEKKEN;
        return strstr(jinja, "[AVAILABLE_TOOLS]") ? KVP_CHAT_MISTRAL_V3 : KVP_CHAT_MISTRAL;
    }
    if (strstr(jinja, "<|user|>") && strstr(jinja, "<|assistant|>")) return KVP_CHAT_ZEPHYR;
    if (strstr(jinja, "<start_of_turn>")) return strstr(jinja, "first_user_prefix") ? KVP_CHAT_GEMMA3 : KVP_CHAT_GEMMA;
    if (strstr(jinja, "<\uff5cUser\uff5c>") && strstr(jinja, "<\uff5cAssistant\uff5c>"))
        return KVP_CHAT_DEEPSEEK_R1; /* <｜User｜>, <｜Assistant｜> (U+FF5C) */
    /* Llama 3.1 and later open with a dated system preamble: 3.1's date is fixed, 3.2's and 3.3's today's */
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>")) {
        if (!strstr(jinja, "Cutting Knowledge Date")) return KVP_CHAT_LLAMA3;
        return strstr(jinja, "strftime_now") ? KVP_CHAT_LLAMA32 : KVP_CHAT_LLAMA31;
    }
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "<|im_end|>")) {
        if (strstr(jinja, "<|im_start|>assistant\\n<think>\\n")) return KVP_CHAT_QWEN3_THINKING; /* its prompt opens a thought */
        if (strstr(jinja, default_system(KVP_CHAT_QWEN25))) return KVP_CHAT_QWEN25; /* it holds Qwen2's text */
        if (strstr(jinja, default_system(KVP_CHAT_SMOLLM2))) return KVP_CHAT_SMOLLM2;
        if (strstr(jinja, default_system(KVP_CHAT_QWEN2))) return KVP_CHAT_QWEN2;
        return KVP_CHAT_CHATML;
    }
    return KVP_CHAT_NONE;
}

/* The Jinja template of a Hugging Face folder (or of the folder of a .safetensors file): tokenizer_config.json's
 * chat_template, a string or a list of {name, template}. *out NULL when there is none. */
static kvp_status hf_chat_template(const char *model_path, char **out)
{
    *out = NULL;
    struct stat sb;
    char path[4096];
    if (stat(model_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model_path);
    } else {
        const char *slash = strrchr(model_path, '/');
        snprintf(path, sizeof path, "%.*s/tokenizer_config.json", slash ? (int)(slash - model_path) : 1,
                 slash ? model_path : ".");
    }
    if (stat(path, &sb) != 0) return KVP_OK;
    cJSON *j;
    KVP_TRY(kvp_json_parse_file(path, &j));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template"), *x;
    if (cJSON_IsArray(t))
        cJSON_ArrayForEach(x, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0) {
                t = cJSON_GetObjectItemCaseSensitive(x, "template");
                break;
            }
        }
    kvp_status st = KVP_OK;
    if (t && !cJSON_IsNull(t) && !cJSON_IsString(t))
        st = KVP_ERR(KVP_EPARSE, "%s: chat_template is not a string (or a list holding a \"default\" one)", path);
    else if (cJSON_IsString(t) && !(*out = kvp_malloc(strlen(t->valuestring) + 1)))
        st = KVP_ERR(KVP_ENOMEM, "out of memory");
    else if (cJSON_IsString(t))
        strcpy(*out, t->valuestring);
    cJSON_Delete(j);
    return st;
}

kvp_status kvp_chat_template_of_model(const char *model_path, int is_gguf, kvp_chat_template *out, int *jinja_found)
{
    *out = KVP_CHAT_NONE;
    *jinja_found = 0;
    char *jinja = NULL;
    if (is_gguf) {
        kvp_gguf *g;
        KVP_TRY(kvp_gguf_open(model_path, &g));
        kvp_gguf_str s;
        int present = 0;
        kvp_status st = kvp_gguf_get_str(g, "tokenizer.chat_template", &s, &present);
        if (st == KVP_OK && present && !(jinja = kvp_malloc(s.len + 1))) st = KVP_ERR(KVP_ENOMEM, "out of memory");
        if (st == KVP_OK && present) {
            memcpy(jinja, s.ptr, s.len);
            jinja[s.len] = '\0';
        }
        kvp_gguf_close(g);
        KVP_TRY(st);
    } else {
        KVP_TRY(hf_chat_template(model_path, &jinja));
    }
    *jinja_found = jinja != NULL;
    *out = kvp_chat_template_detect(jinja);
    kvp_free(jinja);
    return KVP_OK;
}

/* Where a rendering goes: text with "<s>" / "</s>" markers (tok NULL), or token ids (each run of text
 * between special tokens is held in text until the next special token or the end, then tokenized). */
typedef struct {
    const kvp_tokenizer *tok;
    char *text;
    size_t len, cap;
    int32_t *ids;
    size_t nids, cap_ids;
    kvp_status st;
} sink;

static void put(sink *k, const char *s, size_t n)
{
    if (k->st != KVP_OK) return;
    if ((k->st = kvp_grow((void **)&k->text, &k->cap, k->len + n + 1, 1)) != KVP_OK) return;
    memcpy(k->text + k->len, s, n);
    k->len += n;
    k->text[k->len] = '\0';
}

static void puts_(sink *k, const char *s) { put(k, s, strlen(s)); }

/* The text run so far, tokenized (ids mode). */
static void flush(sink *k)
{
    if (k->st != KVP_OK || !k->tok || k->len == 0) return;
    int32_t *enc = NULL, n = 0;
    if ((k->st = kvp_tok_encode(k->tok, k->text, k->len, 0, &enc, &n)) != KVP_OK) return;
    if ((k->st = kvp_grow((void **)&k->ids, &k->cap_ids, k->nids + (size_t)n, sizeof *k->ids)) == KVP_OK) {
        memcpy(k->ids + k->nids, enc, (size_t)n * sizeof *enc);
        k->nids += (size_t)n;
    }
    kvp_free(enc);
    k->len = 0;
}

static void put_special(sink *k, int eos)
{
    if (!k->tok) {
        puts_(k, eos ? "</s>" : "<s>");
        return;
    }
    flush(k);
    const int32_t id = eos ? kvp_tok_eos(k->tok) : kvp_tok_bos(k->tok);
    if (k->st != KVP_OK || id < 0) return; /* a tokenizer without it: nothing, as HF's None token */
    if ((k->st = kvp_grow((void **)&k->ids, &k->cap_ids, k->nids + 1, sizeof *k->ids)) == KVP_OK) k->ids[k->nids++] = id;
}

/* A control token of the template written by its text ("<|im_start|>"): the text, or in ids mode its id
 * (the tokenizer's piece of exactly that text). */
static void put_marker(sink *k, const char *marker)
{
    if (!k->tok) {
        puts_(k, marker);
        return;
    }
    flush(k);
    if (k->st != KVP_OK) return;
    const int32_t id = kvp_tok_special_id(k->tok, marker);
    if (id < 0) {
        k->st = KVP_ERR(KVP_EINVAL, "chat: the template needs a '%s' token, which the tokenizer does not have", marker);
        return;
    }
    if ((k->st = kvp_grow((void **)&k->ids, &k->cap_ids, k->nids + 1, sizeof *k->ids)) == KVP_OK) k->ids[k->nids++] = id;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* s without the whitespace around it (Python's str.strip for ASCII whitespace). */
static void put_stripped(sink *k, const char *s)
{
    size_t a = 0, b = strlen(s);
    while (a < b && is_space(s[a])) a++;
    while (b > a && is_space(s[b - 1])) b--;
    put(k, s + a, b - a);
}

/* ChatML's "<|im_start|>{role}\n" and "<|im_end|>\n" around a turn. */
static void chatml_open(sink *k, const char *role)
{
    put_marker(k, "<|im_start|>");
    puts_(k, role);
    puts_(k, "\n");
}

static void chatml_close(sink *k)
{
    put_marker(k, "<|im_end|>");
    puts_(k, "\n");
}

/* Today's local date as strftime writes it with fmt (a template's strftime_now); "" when there is none. */
static void put_today(sink *k, const char *fmt)
{
    char date[32] = "";
    const time_t now = time(NULL);
    struct tm tmv;
    if (localtime_r(&now, &tmv)) strftime(date, sizeof date, fmt, &tmv);
    puts_(k, date);
}

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_of(const kvp_chat_msg *m)
{
    static const char *const roles[] = {"system", "user", "assistant"};
    for (int r = 0; r < 3; r++)
        if (m->role && strcmp(m->role, roles[r]) == 0) return r;
    return -1;
}

/* Messages from i0 on must go user, assistant, user, ... (Hugging Face's templates raise otherwise). Gemma's
 * templates test only where the user's messages are: a system message in an assistant's place passes there, as a
 * turn of its own. */
static kvp_status check_alternation(kvp_chat_template t, const kvp_chat_msg *m, int32_t n, int32_t i0)
{
    const int gemma = t == KVP_CHAT_GEMMA || t == KVP_CHAT_GEMMA3;
    for (int32_t i = i0; i < n; i++) {
        const int r = role_of(&m[i]);
        if (r == ROLE_SYSTEM && !gemma)
            return t == KVP_CHAT_MISTRAL
                       ? KVP_ERR(KVP_EINVAL, "chat: message %d: the mistral template has no system role", i)
                       : KVP_ERR(KVP_EINVAL, "chat: message %d: a system message can only come first", i);
        if ((r == ROLE_USER) != ((i - i0) % 2 == 0))
            return KVP_ERR(KVP_EINVAL, "chat: message %d is %s: roles must alternate user, assistant, user, ...%s", i,
                           m[i].role, i0 ? " after the system message" : "");
    }
    return KVP_OK;
}


/* The last occurrence of sub in s, or NULL. */
static const char *last_of(const char *s, const char *sub)
{
    const char *last = NULL;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) last = p;
    return last;
}

/* Qwen3-4B-Thinking-2507's template (no tools): ChatML; an answer's reasoning ("<think>...</think>" in its
 * content) is kept only after the last user message, where it is rewritten "<think>\n{reasoning}\n</think>\n\n"
 * (and the last answer always gets one); the generation prompt opens a thought. */
static kvp_status render_qwen3_thinking(const kvp_chat_msg *m, int32_t n, int agp, sink *k)
{
    int32_t last_query = n - 1;
    for (int32_t i = n - 1; i >= 0; i--) {
        const char *c = m[i].content;
        const size_t cl = strlen(c);
        const int wrapped = strncmp(c, "<tool_response>", 15) == 0 && cl >= 16 && strcmp(c + cl - 16, "</tool_response>") == 0;
        if (role_of(&m[i]) == ROLE_USER && !wrapped) {
            last_query = i;
            break;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const int r = role_of(&m[i]);
        const char *c = m[i].content;
        chatml_open(k, m[i].role);
        if (r != ROLE_ASSISTANT) {
            puts_(k, c);
            chatml_close(k);
            continue;
        }
        const char *end = strstr(c, "</think>"), *after = c;
        const char *reason = "";
        size_t rlen = 0;
        if (end) { /* reasoning: before the first </think>, after the last <think> there; the answer after the last </think> */
            const char *open = c;
            for (const char *p = strstr(c, "<think>"); p && p < end; p = strstr(p + 1, "<think>")) open = p + 7;
            reason = open;
            rlen = (size_t)(end - open);
            while (rlen > 0 && reason[rlen - 1] == '\n') rlen--; /* rstrip, then the lstrip below */
            while (rlen > 0 && reason[0] == '\n') reason++, rlen--;
            after = last_of(c, "</think>") + 8;
            while (*after == '\n') after++;
        }
        if (i > last_query && (i == n - 1 || rlen > 0)) {
            puts_(k, "<think>\n");
            put(k, reason, rlen);
            puts_(k, "\n</think>\n\n");
            while (*after == '\n') after++; /* lstrip('\n') */
        }
        puts_(k, after);
        chatml_close(k);
    }
    if (agp) {
        chatml_open(k, "assistant");
        puts_(k, "<think>\n");
    }
    return KVP_OK;
}

/* DeepSeek-R1-Distill's template (no tools): BOS, the (last) system message's text, then <｜User｜>{user} and
 * <｜Assistant｜>{answer after its last </think>}<｜end▁of▁sentence｜>; the generation prompt is <｜Assistant｜>. */
static kvp_status render_deepseek_r1(const kvp_chat_msg *m, int32_t n, int agp, sink *k)
{
    static const char user[] = "<\uff5cUser\uff5c>", assistant[] = "<\uff5cAssistant\uff5c>",
                      eos[] = "<\uff5cend\u2581of\u2581sentence\uff5c>";
    put_special(k, 0);
    const char *sys = NULL;
    for (int32_t i = 0; i < n; i++)
        if (role_of(&m[i]) == ROLE_SYSTEM) sys = m[i].content;
    if (sys) puts_(k, sys);
    for (int32_t i = 0; i < n; i++) {
        const int r = role_of(&m[i]);
        if (r == ROLE_USER) {
            put_marker(k, user);
            puts_(k, m[i].content);
        } else if (r == ROLE_ASSISTANT) {
            const char *end = last_of(m[i].content, "</think>");
            put_marker(k, assistant);
            puts_(k, end ? end + 8 : m[i].content);
            put_marker(k, eos);
        }
    }
    if (agp) put_marker(k, assistant);
    return KVP_OK;
}

/* Gemma's templates: BOS, then per message "<start_of_turn>{user|model|system}\n{content, stripped}<end_of_turn>\n".
 * gemma refuses a first system message; gemma3 takes it out of the turns and writes it, as it is, and "\n\n"
 * before the first turn's content. */
static kvp_status render_gemma(kvp_chat_template t, const kvp_chat_msg *m, int32_t n, int agp, sink *k)
{
    const int32_t i0 = role_of(&m[0]) == ROLE_SYSTEM;
    if (i0 && t == KVP_CHAT_GEMMA) return KVP_ERR(KVP_EINVAL, "chat: the gemma template has no system role");
    KVP_TRY(check_alternation(t, m, n, i0));
    put_special(k, 0);
    for (int32_t i = i0; i < n; i++) {
        put_marker(k, "<start_of_turn>");
        puts_(k, role_of(&m[i]) == ROLE_ASSISTANT ? "model" : m[i].role);
        puts_(k, "\n");
        if (i == 1 && i0) {
            puts_(k, m[0].content);
            puts_(k, "\n\n");
        }
        put_stripped(k, m[i].content);
        put_marker(k, "<end_of_turn>");
        puts_(k, "\n");
    }
    if (agp) {
        put_marker(k, "<start_of_turn>");
        puts_(k, "model\n");
    }
    return KVP_OK;
}

static kvp_status render(kvp_chat_template t, const kvp_chat_msg *m, int32_t n, int agp, sink *k)
{
    if (t == KVP_CHAT_NONE) return KVP_ERR(KVP_EINVAL, "chat: no chat template");
    if (n < 1 || !m) return KVP_ERR(KVP_EINVAL, "chat: no message");
    for (int32_t i = 0; i < n; i++) {
        if (role_of(&m[i]) < 0)
            return KVP_ERR(KVP_EINVAL, "chat: message %d has role \"%s\" (system, user or assistant)", i,
                           m[i].role ? m[i].role : "");
        if (!m[i].content) return KVP_ERR(KVP_EINVAL, "chat: message %d has no content", i);
    }
    if (t == KVP_CHAT_QWEN3_THINKING) return render_qwen3_thinking(m, n, agp, k);
    if (t == KVP_CHAT_GEMMA || t == KVP_CHAT_GEMMA3) return render_gemma(t, m, n, agp, k);
    if (t == KVP_CHAT_DEEPSEEK_R1) return render_deepseek_r1(m, n, agp, k);
    if (t == KVP_CHAT_ZEPHYR) {
        for (int32_t i = 0; i < n; i++) {
            puts_(k, "<|");
            puts_(k, m[i].role);
            puts_(k, "|>\n");
            puts_(k, m[i].content);
            put_special(k, 1);
            puts_(k, "\n");
        }
        if (agp) puts_(k, "<|assistant|>\n");
        return KVP_OK;
    }
    if (t == KVP_CHAT_LLAMA3 || t == KVP_CHAT_LLAMA31 || t == KVP_CHAT_LLAMA32) {
        /* BOS, [3.1+: a system message opening with the dates, holding the conversation's own, stripped], then
         * each message's header and stripped content */
        put_special(k, 0);
        int32_t i = 0;
        if (t != KVP_CHAT_LLAMA3) {
            put_marker(k, "<|start_header_id|>");
            puts_(k, "system");
            put_marker(k, "<|end_header_id|>");
            puts_(k, "\n\nCutting Knowledge Date: December 2023\nToday Date: ");
            if (t == KVP_CHAT_LLAMA32) put_today(k, "%d %b %Y"); /* strftime_now("%d %b %Y") */
            else puts_(k, "26 Jul 2024");                        /* 3.1's, fixed */
            puts_(k, "\n\n");
            if (role_of(&m[0]) == ROLE_SYSTEM) put_stripped(k, m[i++].content);
            put_marker(k, "<|eot_id|>");
        }
        for (; i < n; i++) {
            put_marker(k, "<|start_header_id|>");
            puts_(k, m[i].role);
            put_marker(k, "<|end_header_id|>");
            puts_(k, "\n\n");
            put_stripped(k, m[i].content);
            put_marker(k, "<|eot_id|>");
        }
        if (agp) {
            put_marker(k, "<|start_header_id|>");
            puts_(k, "assistant");
            put_marker(k, "<|end_header_id|>");
            puts_(k, "\n\n");
        }
        return KVP_OK;
    }
    if (t == KVP_CHAT_CHATML || default_system(t)) { /* ChatML, with the model's default system message */
        const kvp_chat_msg sys = {"system", default_system(t)};
        for (int32_t i = sys.content && role_of(&m[0]) != ROLE_SYSTEM ? -1 : 0; i < n; i++) {
            const kvp_chat_msg *x = i < 0 ? &sys : &m[i];
            chatml_open(k, x->role);
            puts_(k, x->content);
            chatml_close(k);
        }
        if (agp) chatml_open(k, "assistant");
        return KVP_OK;
    }
    if (t == KVP_CHAT_MISTRAL_SMALL3) { /* one [SYSTEM_PROMPT] first (the model's default one, dated, when none) */
        const int32_t i0 = role_of(&m[0]) == ROLE_SYSTEM;
        for (int32_t i = i0; i < n; i++) /* its role check never runs (a Jinja scoping slip): only a late system raises */
            if (role_of(&m[i]) == ROLE_SYSTEM)
                return KVP_ERR(KVP_EINVAL, "chat: message %d: a system message can only come first", i);
        put_special(k, 0);
        put_marker(k, "[SYSTEM_PROMPT]");
        if (i0) {
            puts_(k, m[0].content);
        } else { /* its Jinja text, whose backslash-newlines jinja2 drops */
            puts_(k, "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup "
                     "headquartered in Paris.Your knowledge base was last updated on 2023-10-01. The current date is ");
            put_today(k, "%Y-%m-%d");
            puts_(k, ".When you're not sure about some information, you say that you don't have the information and "
                     "don't make up anything.If the user's question is not clear, ambiguous, or does not provide enough "
                     "context for you to accurately answer the question, you do not try to answer it right away and you "
                     "rather ask the user to clarify their request (e.g. \"What are some good restaurants around me?\" => "
                     "\"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where do you travel from?\")");
        }
        put_marker(k, "[/SYSTEM_PROMPT]");
        for (int32_t i = i0; i < n; i++) {
            if (role_of(&m[i]) == ROLE_USER) {
                put_marker(k, "[INST]");
                puts_(k, m[i].content);
                put_marker(k, "[/INST]");
            } else {
                puts_(k, m[i].content);
                put_special(k, 1);
            }
        }
        return KVP_OK;
    }
    if (t == KVP_CHAT_MISTRAL_V7) { /* every message in order, the system ones as [SYSTEM_PROMPT] */
        put_special(k, 0);
        for (int32_t i = 0; i < n; i++) {
            const int r = role_of(&m[i]);
            if (r == ROLE_ASSISTANT) {
                puts_(k, " ");
                puts_(k, m[i].content);
                put_special(k, 1);
                continue;
            }
            put_marker(k, r == ROLE_USER ? "[INST]" : "[SYSTEM_PROMPT]");
            puts_(k, " ");
            puts_(k, m[i].content);
            put_marker(k, r == ROLE_USER ? "[/INST]" : "[/SYSTEM_PROMPT]");
        }
        return KVP_OK;
    }
    const int v3 = t == KVP_CHAT_MISTRAL_V3 || t == KVP_CHAT_MISTRAL_V3_TEKKEN;
    /* llama2 and mistral v3: the system message (v3: inside the last message when it is the user's) */
    const int32_t i0 = (t == KVP_CHAT_LLAMA2 || v3) && role_of(&m[0]) == ROLE_SYSTEM;
    KVP_TRY(check_alternation(t, m, n, i0));
    if (t == KVP_CHAT_MISTRAL || v3) put_special(k, 0);
    for (int32_t i = i0; i < n; i++) {
        const int user = role_of(&m[i]) == ROLE_USER;
        if (v3) { /* v3: "[INST] " and " " + the stripped answer; v3-tekken: "[INST]" and the answer as it is */
            const int tekken = t == KVP_CHAT_MISTRAL_V3_TEKKEN;
            if (user) {
                put_marker(k, "[INST]");
                if (!tekken) puts_(k, " ");
                if (i0 && i == n - 1) {
                    puts_(k, m[0].content);
                    puts_(k, "\n\n");
                }
                puts_(k, m[i].content);
                put_marker(k, "[/INST]");
            } else {
                if (tekken) {
                    puts_(k, m[i].content);
                } else {
                    puts_(k, " ");
                    put_stripped(k, m[i].content);
                }
                put_special(k, 1);
            }
            continue;
        }
        if (t == KVP_CHAT_MISTRAL) {
            if (user) {
                puts_(k, "[INST] ");
                puts_(k, m[i].content);
                puts_(k, " [/INST]");
            } else {
                puts_(k, m[i].content);
                put_special(k, 1);
            }
            continue;
        }
        if (!user) { /* llama2 */
            puts_(k, " ");
            put_stripped(k, m[i].content);
            puts_(k, " ");
            put_special(k, 1);
            continue;
        }
        put_special(k, 0);
        puts_(k, "[INST] ");
        if (i == i0 && i0 == 1) { /* the system message opens the first user message; the whole is stripped */
            puts_(k, "<<SYS>>\n");
            puts_(k, m[0].content);
            puts_(k, "\n<</SYS>>\n\n");
            const char *c = m[i].content;
            size_t b = strlen(c);
            while (b > 0 && is_space(c[b - 1])) b--;
            put(k, c, b);
        } else {
            put_stripped(k, m[i].content);
        }
        puts_(k, " [/INST]");
    }
    return KVP_OK;
}

int32_t kvp_chat_end_of_turn(kvp_chat_template t, const kvp_tokenizer *tok)
{
    if (t == KVP_CHAT_LLAMA3 || t == KVP_CHAT_LLAMA31 || t == KVP_CHAT_LLAMA32) return kvp_tok_special_id(tok, "<|eot_id|>");
    if (t == KVP_CHAT_CHATML || t == KVP_CHAT_QWEN3_THINKING || default_system(t)) return kvp_tok_special_id(tok, "<|im_end|>");
    if (t == KVP_CHAT_GEMMA || t == KVP_CHAT_GEMMA3) return kvp_tok_special_id(tok, "<end_of_turn>");
    return kvp_tok_eos(tok);
}

kvp_status kvp_chat_render_text(kvp_chat_template t, const kvp_chat_msg *msgs, int32_t n, int add_generation_prompt,
                                char **out)
{
    *out = NULL;
    sink k = {.st = KVP_OK};
    kvp_status st = render(t, msgs, n, add_generation_prompt, &k);
    if (st == KVP_OK) st = k.st;
    if (st == KVP_OK && !k.text) put(&k, "", 0), st = k.st;
    if (st != KVP_OK) {
        kvp_free(k.text);
        return st;
    }
    *out = k.text;
    return KVP_OK;
}

kvp_status kvp_chat_render_ids(kvp_chat_template t, const kvp_tokenizer *tok, const kvp_chat_msg *msgs, int32_t n,
                               int add_generation_prompt, int32_t **ids, int32_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    sink k = {.tok = tok, .st = KVP_OK};
    kvp_status st = render(t, msgs, n, add_generation_prompt, &k);
    flush(&k);
    if (st == KVP_OK) st = k.st;
    if (st == KVP_OK && k.nids == 0) st = KVP_ERR(KVP_EINVAL, "chat: the conversation renders to no token");
    kvp_free(k.text);
    if (st != KVP_OK) {
        kvp_free(k.ids);
        return st;
    }
    *ids = k.ids;
    *n_ids = (int32_t)k.nids;
    return KVP_OK;
}
