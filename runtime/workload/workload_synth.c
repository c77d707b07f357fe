/* runtime/workload/workload_synth.c — Azure CSV reader, ShareGPT/Alpaca-like generators, cut and rate helpers
 * (contracts in workload_synth.h).
 *
 * The length distributions are ASSUMED: the PagedAttention paper reports only the means. They are
 * log-normal, rounded to the nearest integer >= 1, with mu = ln(mean) - sigma^2 / 2 so that the untruncated
 * mean is the target; ShareGPT gets the higher variance, as the paper says. Redrawing pairs longer than
 * max_total moves the sharegpt means by under 2 % at 2048. */
#include "runtime/workload/workload_synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"

/* splitmix64: small, seedable, good enough for workload generation. */
static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double unif01(uint64_t *s) { return ((double)(sm64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static double std_normal(uint64_t *s)
{
    double u1 = unif01(s), u2 = unif01(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Unique prompt tokens for request index i (token 0 encodes i; the rest a cheap mix). Fills buf[0..n). */
static void unique_tokens(int64_t i, int32_t *buf, int32_t n)
{
    uint64_t s = (uint64_t)i * 0x2545F4914F6CDD1DULL + 1;
    buf[0] = (int32_t)(i & 0x7fffffff);
    for (int32_t j = 1; j < n; j++) buf[j] = (int32_t)(sm64(&s) & 0x7fff);
}

/* Appends request (idx, arrival, lengths) with unique tokens; tok is a scratch buffer grown as needed. */
static kvp_status add_unique(kvp_workload *w, int64_t idx, double arrival, int32_t in, int32_t out, int32_t **tok,
                             size_t *cap)
{
    KVP_TRY(kvp_grow((void **)tok, cap, (size_t)in, sizeof(int32_t)));
    unique_tokens(idx, *tok, in);
    kvp_request r = {.id = idx, .arrival_s = arrival, .prompt_len = in, .output_len = out, .priority = 0};
    return kvp_workload_add(w, &r, *tok);
}

void kvp_synth_means(kvp_synth_kind kind, double *input_mean, double *output_mean)
{
    *input_mean = kind == KVP_SYNTH_ALPACA ? 19.31 : 161.31;
    *output_mean = kind == KVP_SYNTH_ALPACA ? 58.45 : 337.99;
}

static int32_t draw_lognormal(uint64_t *s, double mean, double sigma)
{
    double mu = log(mean) - 0.5 * sigma * sigma;
    double x = exp(mu + sigma * std_normal(s));
    double r = floor(x + 0.5);
    if (r < 1) r = 1;
    if (r > 1e9) r = 1e9;
    return (int32_t)r;
}

enum { SYNTH_TRIES = 64 }; /* redraws of a pair of lengths longer than max_total before shrinking it */

kvp_status kvp_workload_synth(const kvp_synth_opts *o, kvp_workload **out)
{
    if (o == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "synthetic workload: NULL argument");
    if (o->kind != KVP_SYNTH_SHAREGPT && o->kind != KVP_SYNTH_ALPACA)
        return KVP_ERR(KVP_EINVAL, "synthetic workload: unknown kind %d", (int)o->kind);
    if (o->num_requests < 1) return KVP_ERR(KVP_EINVAL, "synthetic workload: number of requests must be >= 1");
    if (!(o->rate > 0)) return KVP_ERR(KVP_EINVAL, "request rate must be > 0 (got %g)", o->rate);
    if (o->max_total != 0 && o->max_total < 2)
        return KVP_ERR(KVP_EINVAL, "synthetic workload: max_total must be 0 or >= 2 (got %d)", (int)o->max_total);
    double in_mean, out_mean;
    kvp_synth_means(o->kind, &in_mean, &out_mean);
    const double in_sigma = o->kind == KVP_SYNTH_ALPACA ? 0.5 : 1.0, out_sigma = 0.8;
    kvp_workload *w = NULL;
    KVP_TRY(kvp_workload_create(o->kind == KVP_SYNTH_ALPACA ? "alpaca" : "sharegpt", &w));
    uint64_t s = o->seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    int32_t *tok = NULL;
    size_t cap = 0;
    double t = 0;
    kvp_status st = KVP_OK;
    for (int64_t i = 0; i < o->num_requests && st == KVP_OK; i++) {
        if (isfinite(o->rate)) t += -log(unif01(&s)) / o->rate;
        int32_t in, outl, tries = 0;
        do {
            in = draw_lognormal(&s, in_mean, in_sigma);
            outl = draw_lognormal(&s, out_mean, out_sigma);
        } while (o->max_total > 0 && (int64_t)in + outl > o->max_total && ++tries < SYNTH_TRIES);
        if (o->max_total > 0 && (int64_t)in + outl > o->max_total) { /* a max_total the lengths rarely fit */
            in = (int32_t)((double)in * o->max_total / ((double)in + outl));
            in = in < 1 ? 1 : in > o->max_total - 1 ? o->max_total - 1 : in;
            outl = o->max_total - in;
        }
        st = add_unique(w, i, t, in, outl, &tok, &cap);
    }
    kvp_free(tok);
    if (st != KVP_OK) {
        kvp_workload_destroy(w);
        return st;
    }
    *out = w;
    return KVP_OK;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD HH:MM:SS[.frac]" -> seconds since the epoch; 0 on success. */
static int parse_timestamp(const char *s, size_t len, double *out)
{
    int y, mo, d, h, mi, n = 0;
    double sec;
    char buf[64];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (sscanf(buf, "%4d-%2d-%2d %2d:%2d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || (size_t)n != len) return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || !(sec >= 0 && sec < 61))
        return -1;
    *out = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
    return 0;
}

static int parse_int_field(const char *s, size_t len, int64_t *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (end != buf + len || errno == ERANGE || v < 0 || v > INT32_MAX) return -1; /* a NUL inside ends early */
    *out = v;
    return 0;
}

kvp_status kvp_workload_read_azure(const char *path, int64_t max_requests, kvp_workload **out)
{
    if (path == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "Azure trace: NULL argument");
    char *data = NULL;
    size_t len = 0;
    KVP_TRY(kvp_read_file(path, (size_t)1 << 30, &data, &len));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[64];
    snprintf(name, sizeof name, "azure:%s", base);
    kvp_workload *w = NULL;
    kvp_status st = kvp_workload_create(name, &w);
    int32_t *tok = NULL;
    size_t cap = 0;
    double t0 = 0;
    int64_t lineno = 0, n = 0;
    const char *p = data, *end = data + len;
    while (st == KVP_OK && p < end && (max_requests <= 0 || n < max_requests)) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        size_t ll = (size_t)(le - p);
        if (ll > 0 && p[ll - 1] == '\r') ll--;
        lineno++;
        const char *line = p;
        p = nl ? nl + 1 : end;
        if (ll == 0) continue;
        if (lineno == 1) {
            if (ll < 9 || strncmp(line, "TIMESTAMP", 9) != 0)
                st = KVP_ERR(KVP_EPARSE, "%s:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens", path);
            continue;
        }
        const char *c1 = memchr(line, ',', ll);
        const char *c2 = c1 ? memchr(c1 + 1, ',', (size_t)(line + ll - c1 - 1)) : NULL;
        double ts;
        int64_t ctx, gen;
        if (!c1 || !c2 || parse_timestamp(line, (size_t)(c1 - line), &ts) != 0 ||
            parse_int_field(c1 + 1, (size_t)(c2 - c1 - 1), &ctx) != 0 ||
            parse_int_field(c2 + 1, (size_t)(line + ll - c2 - 1), &gen) != 0) {
            st = KVP_ERR(KVP_EPARSE, "%s:%lld: expected 'YYYY-MM-DD HH:MM:SS.f,ContextTokens,GeneratedTokens'",
                         path, (long long)lineno);
            break;
        }
        if (ctx < 1 || ctx > KVP_MAX_PROMPT_TOKENS) {
            st = KVP_ERR(KVP_EPARSE, "%s:%lld: ContextTokens %lld out of range [1, %d]", path, (long long)lineno,
                         (long long)ctx, KVP_MAX_PROMPT_TOKENS);
            break;
        }
        if (n == 0) t0 = ts;
        st = add_unique(w, n, ts - t0, (int32_t)ctx, (int32_t)gen, &tok, &cap);
        n++;
    }
    if (st == KVP_OK && n == 0) st = KVP_ERR(KVP_EPARSE, "%s: no requests in the trace", path);
    kvp_free(tok);
    kvp_free(data);
    if (st != KVP_OK) {
        kvp_workload_destroy(w);
        return st;
    }
    *out = w;
    return KVP_OK;
}

kvp_status kvp_workload_cut(const kvp_workload *w, int64_t max_requests, double duration_s, kvp_workload **out)
{
    if (w == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "workload cut: NULL argument");
    kvp_workload *c = NULL;
    KVP_TRY(kvp_workload_create(w->name, &c));
    kvp_status st = KVP_OK;
    int64_t *kept = kvp_malloc((size_t)(w->n > 0 ? w->n : 1) * sizeof *kept); /* 1 + new index, 0: dropped */
    if (kept == NULL) st = KVP_ERR(KVP_ENOMEM, "workload cut: out of memory");
    for (int64_t i = 0; i < w->n_pins && st == KVP_OK; i++) st = kvp_workload_add_pin(c, &w->pins[i], w->pins[i].tokens);
    for (int64_t i = 0; i < w->n && st == KVP_OK; i++) {
        kept[i] = 0;
        if (max_requests > 0 && c->n >= max_requests) continue;
        if (duration_s > 0 && !(w->reqs[i].arrival_s < duration_s)) continue;
        kvp_request r = w->reqs[i];
        const int64_t a = r.after; /* the request waited for, renumbered; dropped: none */
        r.after = a > 0 && a <= i ? kept[a - 1] : 0;
        if (r.after == 0) r.after_prompt = false; /* its request dropped: a request of its own */
        if ((st = kvp_workload_add(c, &r, r.tokens)) == KVP_OK) kept[i] = c->n;
    }
    kvp_free(kept);
    if (st != KVP_OK) {
        kvp_workload_destroy(c);
        return st;
    }
    c->skipped_lines = w->skipped_lines;
    *out = c;
    return KVP_OK;
}

kvp_status kvp_workload_fork(const kvp_workload *w, int32_t n, kvp_workload **out)
{
    if (w == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "workload fork: NULL argument");
    if (n < 1) return KVP_ERR(KVP_EINVAL, "parallel samples per request must be >= 1 (got %d)", (int)n);
    /* every sample holds a copy of its prompt: refuse at once what would not fit (as kvp_workload_add would,
     * but only after filling the memory) */
    KVP_TRY(kvp_check_fits_in_memory(2.0 * (double)n * (double)w->total_prompt_tokens * sizeof(int32_t),
                                     "the parallel samples' prompt token ids, with room for a copy,"));
    kvp_workload *c = NULL;
    KVP_TRY(kvp_workload_create(w->name, &c));
    kvp_status st = KVP_OK;
    for (int64_t i = 0; i < w->n_pins && st == KVP_OK; i++) st = kvp_workload_add_pin(c, &w->pins[i], w->pins[i].tokens);
    for (int64_t i = 0; i < w->n && st == KVP_OK; i++) {
        for (int32_t k = 0; k < n && st == KVP_OK; k++) {
            kvp_request r = w->reqs[i];
            r.id = c->n;
            if (k == 0) {
                r.after = r.after > 0 && r.after <= i ? (r.after - 1) * n + 1 : 0;
            } else {
                r.after = i * n + 1;
                r.after_prompt = true;
                r.think_s = 0;
                r.output_tokens = NULL;
            }
            st = kvp_workload_add(c, &r, r.tokens);
        }
    }
    if (st != KVP_OK) {
        kvp_workload_destroy(c);
        return st;
    }
    c->skipped_lines = w->skipped_lines;
    *out = c;
    return KVP_OK;
}

kvp_status kvp_workload_set_rate(kvp_workload *w, double rate)
{
    if (w == NULL) return KVP_ERR(KVP_EINVAL, "workload: NULL");
    if (!(rate > 0)) return KVP_ERR(KVP_EINVAL, "request rate must be > 0 (got %g)", rate);
    if (w->n < 1) return KVP_OK;
    if (isinf(rate)) {
        for (int64_t i = 0; i < w->n; i++) w->reqs[i].arrival_s = 0;
        return KVP_OK;
    }
    double lo = w->reqs[0].arrival_s, hi = lo;
    for (int64_t i = 1; i < w->n; i++) {
        if (w->reqs[i].arrival_s < lo) lo = w->reqs[i].arrival_s;
        if (w->reqs[i].arrival_s > hi) hi = w->reqs[i].arrival_s;
    }
    if (w->n < 2 || !(hi > lo)) return KVP_OK;
    double scale = ((double)(w->n - 1) / rate) / (hi - lo);
    for (int64_t i = 0; i < w->n; i++) w->reqs[i].arrival_s = (w->reqs[i].arrival_s - lo) * scale;
    return KVP_OK;
}
