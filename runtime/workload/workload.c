/* runtime/workload/workload.c — workloads: container, Mooncake JSONL reader, synthetic shared-prefix generators.
 * Contract in runtime/workload/workload.h. */
#include "runtime/workload/workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/parse.h"

/* ---- container ---------------------------------------------------------------------------------- */

kvp_status kvp_workload_create(const char *name, kvp_workload **out)
{
    if (out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_workload_create: out is NULL");
    kvp_workload *w = kvp_calloc(1, sizeof *w);
    if (w == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory creating a workload");
    snprintf(w->name, sizeof w->name, "%s", name ? name : "");
    *out = w;
    return KVP_OK;
}

void kvp_workload_destroy(kvp_workload *w)
{
    if (w == NULL) return;
    for (int64_t i = 0; i < w->n; i++) {
        kvp_free(w->reqs[i].tokens);
        kvp_free(w->reqs[i].output_tokens);
    }
    for (int64_t i = 0; i < w->n_pins; i++) {
        kvp_free(w->pins[i].tokens);
        kvp_free(w->pins[i].output_tokens);
    }
    kvp_free(w->reqs);
    kvp_free(w->pins);
    kvp_free(w);
}

/* Appends *r taking ownership of `tokens` and `out` (only on success). */
static kvp_status add_owned(kvp_request **arr, int64_t *n, int64_t *cap, const kvp_request *r, int32_t *tokens,
                            int32_t *out)
{
    size_t c = (size_t)*cap;
    KVP_TRY(kvp_grow((void **)arr, &c, (size_t)*n + 1, sizeof **arr));
    *cap = (int64_t)c;
    kvp_request *d = &(*arr)[(*n)++];
    *d = *r;
    d->tokens = tokens;
    d->output_tokens = out;
    return KVP_OK;
}

/* A copy of n token ids (n >= 1), or NULL (*st = KVP_ENOMEM naming what). */
static int32_t *copy_ids(const int32_t *src, int32_t n, const char *what, kvp_status *st)
{
    int32_t *t = kvp_malloc((size_t)n * sizeof *t);
    if (t == NULL) *st = KVP_ERR(KVP_ENOMEM, "out of memory copying a %d-token %s", n, what);
    else memcpy(t, src, (size_t)n * sizeof *t);
    return t;
}

static kvp_status check_req(const kvp_request *r, const int32_t *tokens)
{
    if (r == NULL) return KVP_ERR(KVP_EINVAL, "request is NULL");
    if (r->prompt_len < 1 || r->prompt_len > KVP_MAX_PROMPT_TOKENS)
        return KVP_ERR(KVP_EINVAL, "request %lld: prompt_len %d out of range [1, %d]", (long long)r->id, r->prompt_len,
                       KVP_MAX_PROMPT_TOKENS);
    if (r->output_len < 0) return KVP_ERR(KVP_EINVAL, "request %lld: output_len %d < 0", (long long)r->id, r->output_len);
    if (tokens == NULL) return KVP_ERR(KVP_EINVAL, "request %lld: tokens is NULL", (long long)r->id);
    return KVP_OK;
}

static kvp_status add_copy(kvp_workload *w, int pin, const kvp_request *r, const int32_t *tokens)
{
    if (w == NULL) return KVP_ERR(KVP_EINVAL, "workload is NULL");
    KVP_TRY(check_req(r, tokens));
    const int64_t held = w->total_prompt_tokens + w->pin_tokens_ + r->prompt_len;
    if (held % 65536 < r->prompt_len) /* about every 256 KiB: the memory size is a system call */
        KVP_TRY(kvp_check_fits_in_memory(2.0 * (double)held * sizeof(int32_t),
                                         "the workload's prompt token ids, with room for a copy,"));
    kvp_status st = KVP_OK;
    int32_t *t = copy_ids(tokens, r->prompt_len, "prompt", &st), *o = NULL;
    if (t && r->output_tokens && r->output_len > 0) o = copy_ids(r->output_tokens, r->output_len, "answer", &st);
    if (st == KVP_OK)
        st = pin ? add_owned(&w->pins, &w->n_pins, &w->cap_pins_, r, t, o) : add_owned(&w->reqs, &w->n, &w->cap_, r, t, o);
    if (st != KVP_OK) {
        kvp_free(t);
        kvp_free(o);
        return KVP_ERR(st, "out of memory adding a request");
    }
    if (!pin) w->total_prompt_tokens += r->prompt_len;
    else w->pin_tokens_ += r->prompt_len;
    return KVP_OK;
}

kvp_status kvp_workload_add(kvp_workload *w, const kvp_request *r, const int32_t *tokens)
{
    return add_copy(w, 0, r, tokens);
}

kvp_status kvp_workload_add_pin(kvp_workload *w, const kvp_request *r, const int32_t *tokens)
{
    return add_copy(w, 1, r, tokens);
}

kvp_status kvp_workload_set_output(kvp_workload *w, int64_t i, const int32_t *tokens)
{
    if (w == NULL || tokens == NULL) return KVP_ERR(KVP_EINVAL, "workload set_output: NULL argument");
    if (i < 0 || i >= w->n) return KVP_ERR(KVP_EINVAL, "workload %s: no request %lld", w->name, (long long)i);
    kvp_request *r = &w->reqs[i];
    int32_t *o = NULL;
    if (r->output_len > 0) {
        kvp_status st = KVP_OK;
        if ((o = copy_ids(tokens, r->output_len, "answer", &st)) == NULL) return st;
    }
    kvp_free(r->output_tokens);
    r->output_tokens = o;
    return KVP_OK;
}

/* ---- Mooncake ------------------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int32_t kvp_mooncake_token(int64_t hash_id, int32_t j)
{
    if (hash_id < (INT32_MAX / KVP_MOONCAKE_BLOCK)) return (int32_t)(hash_id * KVP_MOONCAKE_BLOCK + j);
    /* Beyond the exact range: a 31-bit mix placed above it (distinct from every exact token; a collision
     * between two whole blocks of mixed tokens is negligible). */
    uint64_t m = splitmix64(((uint64_t)hash_id << 9) ^ (uint64_t)j);
    const uint32_t base = (uint32_t)(INT32_MAX / KVP_MOONCAKE_BLOCK) * KVP_MOONCAKE_BLOCK;
    return (int32_t)(base + (uint32_t)(m % ((uint64_t)INT32_MAX - base)));
}

/* Parses one line into (req, tokens). On failure returns KVP_EPARSE with a detail naming path:line. */
static kvp_status parse_mooncake_line(const char *path, int64_t lineno, const char *text, size_t len,
                                      kvp_request *req, int32_t **tokens_out)
{
    char what[512];
    snprintf(what, sizeof what, "%s line %lld", path, (long long)lineno);
    cJSON *obj = NULL;
    kvp_status st = kvp_json_parse(text, len, what, &obj);
    if (st != KVP_OK) return st;
    char why[256] = "";
    double ts = 0;
    int64_t in_len = 0, out_len = 0;
    int p_ts = 0, p_in = 0, p_out = 0;
    int32_t *tok = NULL;
    if (!cJSON_IsObject(obj)) {
        snprintf(why, sizeof why, "not a JSON object");
        goto bad;
    }
    if (kvp_json_num(obj, "timestamp", &ts, &p_ts) != KVP_OK || kvp_json_int(obj, "input_length", &in_len, &p_in) != KVP_OK ||
        kvp_json_int(obj, "output_length", &out_len, &p_out) != KVP_OK) {
        snprintf(why, sizeof why, "%s", kvp_error_message());
        goto bad;
    }
    if (!p_ts || !p_in || !p_out) {
        snprintf(why, sizeof why, "missing \"%s\"", !p_ts ? "timestamp" : !p_in ? "input_length" : "output_length");
        goto bad;
    }
    if (ts < 0) {
        snprintf(why, sizeof why, "negative timestamp %g", ts);
        goto bad;
    }
    if (in_len < 1 || in_len > KVP_MAX_PROMPT_TOKENS) {
        snprintf(why, sizeof why, "input_length %lld out of range [1, %d]", (long long)in_len, KVP_MAX_PROMPT_TOKENS);
        goto bad;
    }
    if (out_len < 0 || out_len > INT32_MAX) {
        snprintf(why, sizeof why, "output_length %lld out of range [0, %d]", (long long)out_len, INT32_MAX);
        goto bad;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(obj, "hash_ids");
    if (!cJSON_IsArray(ids)) {
        snprintf(why, sizeof why, ids ? "\"hash_ids\" must be an array" : "missing \"hash_ids\"");
        goto bad;
    }
    int64_t nb = cJSON_GetArraySize(ids);
    int64_t want = (in_len + KVP_MOONCAKE_BLOCK - 1) / KVP_MOONCAKE_BLOCK;
    if (nb != want) {
        snprintf(why, sizeof why, "%lld hash_ids for input_length %lld (expected ceil(%lld/512) = %lld)", (long long)nb,
                 (long long)in_len, (long long)in_len, (long long)want);
        goto bad;
    }
    tok = kvp_malloc((size_t)in_len * sizeof *tok);
    if (tok == NULL) {
        cJSON_Delete(obj);
        return KVP_ERR(KVP_ENOMEM, "%s: out of memory for %lld tokens", what, (long long)in_len);
    }
    int64_t b = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids)
    {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!cJSON_IsNumber(it) || d != floor(d) || d < 0 || d > 9007199254740992.0) {
            snprintf(why, sizeof why, "hash_ids[%lld] is not a non-negative integer", (long long)b);
            goto bad;
        }
        int64_t h = (int64_t)d;
        int64_t lo = b * KVP_MOONCAKE_BLOCK, hi = lo + KVP_MOONCAKE_BLOCK < in_len ? lo + KVP_MOONCAKE_BLOCK : in_len;
        for (int64_t t = lo; t < hi; t++) tok[t] = kvp_mooncake_token(h, (int32_t)(t - lo));
        b++;
    }
    cJSON_Delete(obj);
    req->arrival_s = ts / 1000.0;
    req->prompt_len = (int32_t)in_len;
    req->output_len = (int32_t)out_len;
    req->priority = 0;
    *tokens_out = tok;
    return KVP_OK;
bad:
    kvp_free(tok);
    cJSON_Delete(obj);
    return KVP_ERR(KVP_EPARSE, "%s: %s", what, why);
}

kvp_status kvp_workload_read_mooncake(const char *path, const kvp_mooncake_opts *opts, kvp_workload **out)
{
    if (path == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_workload_read_mooncake: NULL argument");
    kvp_mooncake_opts o = {0, 0};
    if (opts) o = *opts;
    FILE *f = fopen(path, "r");
    if (f == NULL) return KVP_ERR(KVP_EIO, "cannot open %s: %s", path, strerror(errno));
    const char *base = strrchr(path, '/');
    char name[64];
    snprintf(name, sizeof name, "mooncake:%s", base ? base + 1 : path);
    kvp_workload *w = NULL;
    kvp_status st = kvp_workload_create(name, &w);
    char *line = NULL;
    size_t cap = 0;
    int64_t lineno = 0;
    while (st == KVP_OK) {
        errno = 0;
        ssize_t n = getline(&line, &cap, f);
        if (n < 0) {
            if (ferror(f)) st = KVP_ERR(KVP_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        lineno++;
        size_t len = (size_t)n;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            len--;
        size_t s = 0;
        while (s < len && (line[s] == ' ' || line[s] == '\t')) s++;
        if (s == len) continue;
        kvp_request r = {0};
        int32_t *tok = NULL;
        st = parse_mooncake_line(path, lineno, line + s, len - s, &r, &tok);
        if (st == KVP_EPARSE && o.skip_bad) {
            w->skipped_lines++;
            st = KVP_OK;
            continue;
        }
        if (st != KVP_OK) break;
        r.id = w->n;
        st = add_owned(&w->reqs, &w->n, &w->cap_, &r, tok, NULL);
        if (st != KVP_OK) {
            kvp_free(tok);
            st = KVP_ERR(KVP_ENOMEM, "out of memory reading %s", path);
            break;
        }
        w->total_prompt_tokens += r.prompt_len;
        if (o.max_requests > 0 && w->n >= o.max_requests) break;
    }
    free(line); /* getline's buffer comes from the C library */
    fclose(f);
    if (st != KVP_OK) {
        kvp_workload_destroy(w);
        return st;
    }
    *out = w;
    return KVP_OK;
}

/* ---- synthetic generators ------------------------------------------------------------------------ */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    uint64_t x = r->s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [lo, hi] (hi >= lo). */
static int64_t rng_range(rng_t *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

static double rng_exp(rng_t *r, double rate)
{
    double u = ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
    return -log(u) / rate;
}

static void rng_tokens(rng_t *r, int32_t *t, int64_t n, int32_t vocab)
{
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(rng_next(r) % (uint64_t)vocab);
}

/* Length uniform in [m/2, 3m/2], at least lo. */
static int32_t jitter(rng_t *r, int32_t m, int32_t lo)
{
    int64_t v = rng_range(r, m / 2, m + m / 2);
    return (int32_t)(v < lo ? lo : v);
}

#define MAX_KEYS 12

typedef struct {
    const char *key;
    int64_t def, min, max;
    int64_t val;
} gen_param;

typedef struct {
    const char *name;
    gen_param p[MAX_KEYS];
    double share; /* system only */
    double rate;
    double think; /* chat only */
} gen_spec;

static gen_param *param(gen_spec *g, const char *key)
{
    for (int i = 0; i < MAX_KEYS && g->p[i].key; i++)
        if (strcmp(g->p[i].key, key) == 0) return &g->p[i];
    return NULL;
}

static int64_t P(gen_spec *g, const char *key)
{
    return param(g, key)->val;
}

#define LEN_MAX 1048576 /* per segment, so a prompt stays far below INT32_MAX */

static const gen_spec gen_defaults[] = {
    {"system",
     {{"n", 200, 1, 10000000, 0},
      {"prefix", 1024, 0, LEN_MAX, 0},
      {"suffix", 256, 2, LEN_MAX, 0},
      {"seed", 1, 0, INT64_MAX, 0},
      {"vocab", 32000, 2, INT32_MAX, 0},
      {"output", 128, 0, LEN_MAX, 0}},
     1.0, 10.0, 0},
    {"chat",
     {{"conversations", 50, 1, 1000000, 0},
      {"turns", 6, 1, 1000, 0},
      {"system", 256, 0, LEN_MAX, 0},
      {"user", 64, 2, LEN_MAX, 0},
      {"assistant", 192, 2, LEN_MAX, 0},
      {"seed", 1, 0, INT64_MAX, 0},
      {"vocab", 32000, 2, INT32_MAX, 0}},
     0, 10.0, 0},
    {"fewshot",
     {{"n", 200, 1, 10000000, 0},
      {"tasks", 4, 1, 100000, 0},
      {"examples", 8, 0, 1000, 0},
      {"example", 128, 1, LEN_MAX, 0},
      {"question", 64, 2, LEN_MAX, 0},
      {"seed", 1, 0, INT64_MAX, 0},
      {"vocab", 32000, 2, INT32_MAX, 0},
      {"output", 64, 0, LEN_MAX, 0}},
     0, 10.0, 0},
    {"branch",
     {{"n", 200, 1, 10000000, 0},
      {"depth", 4, 1, 64, 0},
      {"fanout", 3, 1, 1000, 0},
      {"segment", 128, 1, LEN_MAX, 0},
      {"suffix", 64, 2, LEN_MAX, 0},
      {"seed", 1, 0, INT64_MAX, 0},
      {"vocab", 32000, 2, INT32_MAX, 0},
      {"output", 64, 0, LEN_MAX, 0}},
     0, 10.0, 0},
};

static kvp_status parse_spec(const char *spec, gen_spec *g)
{
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    int found = 0;
    for (size_t i = 0; i < sizeof gen_defaults / sizeof gen_defaults[0]; i++)
        if (strlen(gen_defaults[i].name) == nlen && strncmp(spec, gen_defaults[i].name, nlen) == 0) {
            *g = gen_defaults[i];
            found = 1;
        }
    if (!found)
        return KVP_ERR(KVP_EINVAL, "unknown workload '%.*s' (expected system, chat, fewshot, branch or mooncake:PATH)",
                       (int)nlen, spec);
    for (int i = 0; i < MAX_KEYS && g->p[i].key; i++) g->p[i].val = g->p[i].def;
    if (!colon || colon[1] == '\0') return KVP_OK;
    char buf[1024];
    if (strlen(colon + 1) >= sizeof buf) return KVP_ERR(KVP_EINVAL, "workload spec too long");
    strcpy(buf, colon + 1);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL) return KVP_ERR(KVP_EINVAL, "workload %s: '%s' is not key=value", g->name, kv);
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(kv, "rate") == 0) {
            if (kvp_parse_f64(v, 1e-9, 1e12, &g->rate) != KVP_OK)
                return KVP_ERR(KVP_EINVAL, "workload %s: rate: %s", g->name, kvp_error_message());
            continue;
        }
        if (strcmp(g->name, "chat") == 0 && strcmp(kv, "think") == 0) {
            if (kvp_parse_f64(v, 0, 1e9, &g->think) != KVP_OK)
                return KVP_ERR(KVP_EINVAL, "workload %s: think: %s", g->name, kvp_error_message());
            continue;
        }
        if (strcmp(g->name, "system") == 0 && strcmp(kv, "share") == 0) {
            if (kvp_parse_f64(v, 0, 1, &g->share) != KVP_OK)
                return KVP_ERR(KVP_EINVAL, "workload %s: share: %s", g->name, kvp_error_message());
            continue;
        }
        gen_param *p = param(g, kv);
        if (p == NULL) return KVP_ERR(KVP_EINVAL, "workload %s: unknown key '%s'", g->name, kv);
        if (kvp_parse_i64(v, p->min, p->max, &p->val) != KVP_OK)
            return KVP_ERR(KVP_EINVAL, "workload %s: %s: %s", g->name, kv, kvp_error_message());
    }
    return KVP_OK;
}

/* Scratch token buffer for building prompts. */
typedef struct {
    int32_t *t;
    size_t n, cap;
} tokbuf;

static kvp_status tb_reserve(tokbuf *b, size_t extra)
{
    if (b->n + extra > (size_t)INT32_MAX) return KVP_ERR(KVP_EINVAL, "a generated prompt exceeds %d tokens", INT32_MAX);
    if (kvp_grow((void **)&b->t, &b->cap, b->n + extra, sizeof *b->t) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "out of memory generating a workload");
    return KVP_OK;
}

static kvp_status tb_append(tokbuf *b, const int32_t *t, size_t n)
{
    KVP_TRY(tb_reserve(b, n));
    if (n) memcpy(b->t + b->n, t, n * sizeof *t);
    b->n += n;
    return KVP_OK;
}

static kvp_status tb_random(tokbuf *b, rng_t *r, size_t n, int32_t vocab)
{
    KVP_TRY(tb_reserve(b, n));
    rng_tokens(r, b->t + b->n, (int64_t)n, vocab);
    b->n += n;
    return KVP_OK;
}

static kvp_status emit(kvp_workload *w, rng_t *r, double rate, double *clock, const tokbuf *b, int32_t out_len,
                       int32_t priority)
{
    if (b->n < 1) return KVP_ERR(KVP_EINVAL, "workload %s: a generated prompt is empty", w->name);
    *clock += rng_exp(r, rate);
    kvp_request q = {.id = w->n, .arrival_s = *clock, .prompt_len = (int32_t)b->n, .output_len = out_len, .priority = priority};
    return kvp_workload_add(w, &q, b->t);
}

static kvp_status gen_system(gen_spec *g, kvp_workload *w, rng_t *r)
{
    int32_t vocab = (int32_t)P(g, "vocab");
    tokbuf sys = {0}, b = {0};
    kvp_status st = tb_random(&sys, r, (size_t)P(g, "prefix"), vocab);
    if (st == KVP_OK && sys.n > 0) {
        kvp_request pin = {.id = 0, .prompt_len = (int32_t)sys.n, .priority = 1};
        st = kvp_workload_add_pin(w, &pin, sys.t);
    }
    double clock = 0;
    for (int64_t i = 0; st == KVP_OK && i < P(g, "n"); i++) {
        b.n = 0;
        int shared = ((double)(rng_next(r) >> 11) / 9007199254740992.0) < g->share;
        if (shared) st = tb_append(&b, sys.t, sys.n);
        if (st == KVP_OK) st = tb_random(&b, r, (size_t)jitter(r, (int32_t)P(g, "suffix"), 1), vocab);
        if (st == KVP_OK) st = emit(w, r, g->rate, &clock, &b, jitter(r, (int32_t)P(g, "output"), 0), 0);
    }
    kvp_free(sys.t);
    kvp_free(b.t);
    return st;
}

static kvp_status gen_chat(gen_spec *g, kvp_workload *w, rng_t *r)
{
    int32_t vocab = (int32_t)P(g, "vocab");
    int64_t nc = P(g, "conversations"), turns = P(g, "turns");
    tokbuf sys = {0}, b = {0};
    tokbuf *hist = kvp_calloc((size_t)nc, sizeof *hist);
    int64_t *done = kvp_calloc((size_t)nc, sizeof *done);
    int64_t *live = kvp_calloc((size_t)nc, sizeof *live);
    int32_t *pending = kvp_calloc((size_t)nc, sizeof *pending); /* answer length of the last turn */
    int64_t *last = kvp_calloc((size_t)nc, sizeof *last);       /* the last turn's request */
    kvp_status st = (hist && done && live && pending && last) ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory generating chat");
    if (st == KVP_OK) st = tb_random(&sys, r, (size_t)P(g, "system"), vocab);
    int64_t nlive = nc;
    for (int64_t c = 0; st == KVP_OK && c < nc; c++) live[c] = c;
    double clock = 0;
    while (st == KVP_OK && nlive > 0) {
        int64_t k = rng_range(r, 0, nlive - 1), c = live[k];
        tokbuf *h = &hist[c];
        if (done[c] == 0) st = tb_append(h, sys.t, sys.n);
        else if ((st = tb_random(h, r, (size_t)pending[c], vocab)) == KVP_OK) /* the previous answer joins the history */
            st = kvp_workload_set_output(w, last[c], h->t + h->n - pending[c]);   /* and is that turn's output */
        if (st == KVP_OK) st = tb_random(h, r, (size_t)jitter(r, (int32_t)P(g, "user"), 1), vocab);
        pending[c] = jitter(r, (int32_t)P(g, "assistant"), 1);
        const int64_t prev = last[c];
        last[c] = w->n;
        if (st == KVP_OK) st = emit(w, r, g->rate, &clock, h, pending[c], 0);
        if (st == KVP_OK && done[c] > 0) { /* after the previous turn's answer */
            w->reqs[w->n - 1].after = prev + 1;
            w->reqs[w->n - 1].think_s = g->think;
        }
        if (++done[c] == turns) {
            kvp_free(h->t);
            *h = (tokbuf){0};
            live[k] = live[--nlive];
        }
    }
    for (int64_t c = 0; hist && c < nc; c++) kvp_free(hist[c].t);
    kvp_free(hist);
    kvp_free(done);
    kvp_free(live);
    kvp_free(pending);
    kvp_free(last);
    kvp_free(sys.t);
    kvp_free(b.t);
    return st;
}

static kvp_status gen_fewshot(gen_spec *g, kvp_workload *w, rng_t *r)
{
    int32_t vocab = (int32_t)P(g, "vocab");
    int64_t ntasks = P(g, "tasks");
    tokbuf *tasks = kvp_calloc((size_t)ntasks, sizeof *tasks), b = {0};
    kvp_status st = tasks ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory generating fewshot");
    for (int64_t t = 0; st == KVP_OK && t < ntasks; t++)
        for (int64_t e = 0; st == KVP_OK && e < P(g, "examples"); e++)
            st = tb_random(&tasks[t], r, (size_t)jitter(r, (int32_t)P(g, "example"), 1), vocab);
    double clock = 0;
    for (int64_t i = 0; st == KVP_OK && i < P(g, "n"); i++) {
        int64_t t = rng_range(r, 0, ntasks - 1);
        b.n = 0;
        st = tb_append(&b, tasks[t].t, tasks[t].n);
        if (st == KVP_OK) st = tb_random(&b, r, (size_t)jitter(r, (int32_t)P(g, "question"), 1), vocab);
        if (st == KVP_OK) st = emit(w, r, g->rate, &clock, &b, jitter(r, (int32_t)P(g, "output"), 0), 0);
    }
    for (int64_t t = 0; tasks && t < ntasks; t++) kvp_free(tasks[t].t);
    kvp_free(tasks);
    kvp_free(b.t);
    return st;
}

static kvp_status gen_branch(gen_spec *g, kvp_workload *w, rng_t *r)
{
    int32_t vocab = (int32_t)P(g, "vocab");
    int64_t depth = P(g, "depth"), fanout = P(g, "fanout"), seg = P(g, "segment");
    tokbuf b = {0};
    kvp_status st = KVP_OK;
    double clock = 0;
    for (int64_t i = 0; st == KVP_OK && i < P(g, "n"); i++) {
        b.n = 0;
        /* Node path: each tree node's text is derived from its path, so equal paths give equal text. */
        uint64_t node = (uint64_t)P(g, "seed") * 0x2545f4914f6cdd1dull + 1;
        for (int64_t d = 0; st == KVP_OK && d < depth; d++) {
            node = splitmix64(node * 31 + (uint64_t)rng_range(r, 0, fanout - 1) + 1);
            rng_t nr = {node};
            st = tb_random(&b, &nr, (size_t)seg, vocab);
        }
        if (st == KVP_OK) st = tb_random(&b, r, (size_t)jitter(r, (int32_t)P(g, "suffix"), 1), vocab);
        if (st == KVP_OK) st = emit(w, r, g->rate, &clock, &b, jitter(r, (int32_t)P(g, "output"), 0), 0);
    }
    kvp_free(b.t);
    return st;
}

kvp_status kvp_workload_generate(const char *spec, kvp_workload **out)
{
    if (spec == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_workload_generate: NULL argument");
    gen_spec g;
    KVP_TRY(parse_spec(spec, &g));
    kvp_workload *w = NULL;
    KVP_TRY(kvp_workload_create(g.name, &w));
    rng_t r = {(uint64_t)P(&g, "seed")};
    kvp_status st;
    if (strcmp(g.name, "system") == 0) st = gen_system(&g, w, &r);
    else if (strcmp(g.name, "chat") == 0) st = gen_chat(&g, w, &r);
    else if (strcmp(g.name, "fewshot") == 0) st = gen_fewshot(&g, w, &r);
    else st = gen_branch(&g, w, &r);
    if (st != KVP_OK) {
        kvp_workload_destroy(w);
        return st;
    }
    *out = w;
    return KVP_OK;
}

kvp_status kvp_workload_load(const char *spec, int skip_bad, kvp_workload **out)
{
    if (spec == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_workload_load: NULL argument");
    if (strncmp(spec, "mooncake:", 9) == 0) {
        kvp_mooncake_opts o = {.skip_bad = skip_bad};
        return kvp_workload_read_mooncake(spec + 9, &o, out);
    }
    return kvp_workload_generate(spec, out);
}

/* 32-bit mix (murmur3's finalizer): a bijection, so distinct ids stay distinct before the reduction. A plain
 * modulo would make every 512-token block of a Mooncake trace the same text. */
static uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    return x ^ (x >> 16);
}

void kvp_workload_fit_vocab(kvp_workload *w, int64_t vocab)
{
    for (int64_t i = 0; i < w->n + w->n_pins; i++) {
        kvp_request *r = i < w->n ? &w->reqs[i] : &w->pins[i - w->n];
        for (int32_t j = 0; j < r->prompt_len; j++) r->tokens[j] = (int32_t)(mix32((uint32_t)r->tokens[j]) % vocab);
        for (int32_t j = 0; r->output_tokens && j < r->output_len; j++)
            r->output_tokens[j] = (int32_t)(mix32((uint32_t)r->output_tokens[j]) % vocab);
    }
}
