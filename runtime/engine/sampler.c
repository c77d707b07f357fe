/* runtime/engine/sampler.c — greedy / temperature / top-k / top-p sampling with per-sequence generators. */
#include "runtime/engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

struct kvp_sampler_ws {
    int32_t vocab;
    int32_t *idx;  /* (vocab) */
    double *prob;  /* (vocab) */
};

kvp_sampler_params kvp_sampler_default(void)
{
    kvp_sampler_params p = {.temperature = 0.0, .top_k = 0, .top_p = 1.0, .seed = 0};
    return p;
}

kvp_status kvp_sampler_check(const kvp_sampler_params *p)
{
    if (!(p->temperature >= 0.0) || isinf(p->temperature))
        return KVP_ERR(KVP_EINVAL, "sampler: temperature %g must be finite and >= 0", p->temperature);
    if (p->top_k < 0) return KVP_ERR(KVP_EINVAL, "sampler: top_k %d must be >= 0", p->top_k);
    if (!(p->top_p > 0.0 && p->top_p <= 1.0))
        return KVP_ERR(KVP_EINVAL, "sampler: top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0.0 && p->min_p <= 1.0))
        return KVP_ERR(KVP_EINVAL, "sampler: min_p %g must be in [0, 1]", p->min_p);
    if (!(fabsf(p->presence_penalty) <= 2.0f) || !(fabsf(p->frequency_penalty) <= 2.0f))
        return KVP_ERR(KVP_EINVAL, "sampler: presence_penalty %g and frequency_penalty %g must be in [-2, 2]",
                       (double)p->presence_penalty, (double)p->frequency_penalty);
    if (!(p->repetition_penalty >= 0.0f && p->repetition_penalty <= 10.0f))
        return KVP_ERR(KVP_EINVAL, "sampler: repetition_penalty %g must be in (0, 10] (0 or 1: none)",
                       (double)p->repetition_penalty);
    return KVP_OK;
}

int kvp_sampler_penalized(const kvp_sampler_params *p)
{
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f);
}

void kvp_apply_penalties(const kvp_sampler_params *p, float *logits, int32_t vocab, const int32_t *prompt,
                         int32_t n_prompt, const int32_t *out, int32_t n_out, int32_t *count)
{
    (void)vocab;
    const float rep = p->repetition_penalty != 0.0f ? p->repetition_penalty : 1.0f;
    for (int32_t i = 0; i < n_out; i++) count[out[i]]++;
    /* each distinct token once: its count is set to -1 when it has been penalized */
    for (int32_t i = 0; i < n_out; i++) {
        const int32_t t = out[i];
        if (count[t] < 0) continue;
        float x = logits[t];
        x = x > 0.0f ? x / rep : x * rep;
        logits[t] = x - p->frequency_penalty * (float)count[t] - p->presence_penalty;
        count[t] = -1;
    }
    for (int32_t i = 0; rep != 1.0f && i < n_prompt; i++) {
        const int32_t t = prompt[i];
        if (count[t] < 0) continue;
        logits[t] = logits[t] > 0.0f ? logits[t] / rep : logits[t] * rep;
        count[t] = -1;
    }
    for (int32_t i = 0; i < n_out; i++) count[out[i]] = 0;
    for (int32_t i = 0; rep != 1.0f && i < n_prompt; i++) count[prompt[i]] = 0;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvp_rng_seed(kvp_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull + 0x2545f4914f6cdd1dull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvp_rng_next(kvp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kvp_rng_uniform(kvp_rng *r) { return (double)(kvp_rng_next(r) >> 11) * 0x1.0p-53; }

kvp_status kvp_sampler_ws_create(int32_t vocab, kvp_sampler_ws **out)
{
    if (vocab < 1) return KVP_ERR(KVP_EINVAL, "sampler: vocab %d < 1", vocab);
    kvp_sampler_ws *w = kvp_calloc(1, sizeof *w);
    if (w) {
        w->idx = kvp_malloc((size_t)vocab * sizeof *w->idx);
        w->prob = kvp_malloc((size_t)vocab * KVP_SAMPLE_MANY * sizeof *w->prob); /* one per kvp_sample_many draw */
    }
    if (!w || !w->idx || !w->prob) {
        kvp_sampler_ws_destroy(w);
        return KVP_ERR(KVP_ENOMEM, "sampler: out of memory");
    }
    w->vocab = vocab;
    *out = w;
    return KVP_OK;
}

void kvp_sampler_ws_destroy(kvp_sampler_ws *w)
{
    if (!w) return;
    kvp_free(w->idx);
    kvp_free(w->prob);
    kvp_free(w);
}

/* The largest logit, NaNs skipped (NaN only when logits[0] is and nothing compares greater): kvp_argmax's
 * value without its scan for the index. On 8 lanes, then the lanes and the tail. */
static float max_logit(const float *logits, int32_t vocab)
{
    typedef float v8 __attribute__((vector_size(32)));
    typedef int32_t v8i __attribute__((vector_size(32)));
    float mx = logits[0];
    if (vocab < 16 || isnan(mx)) {
        for (int32_t i = 1; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
        return mx;
    }
    v8 m = {mx, mx, mx, mx, mx, mx, mx, mx};
    int32_t i = 0;
    for (; i + 8 <= vocab; i += 8) {
        v8 x;
        memcpy(&x, logits + i, sizeof x);
        const v8i gt = x > m; /* lane-wise; a NaN x keeps m */
        m = (v8)((gt & (v8i)x) | (~gt & (v8i)m));
    }
    for (int j = 0; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    return mx;
}

int32_t kvp_argmax(const float *logits, int32_t vocab)
{
    /* the first id holding the largest value, NaNs skipped (a NaN logits[0] is kept: nothing compares
     * greater): the largest value, then a scan for it (no per-id dependence on `best`) */
    if (isnan(logits[0])) return 0;
    const float mx = max_logit(logits, vocab);
    int32_t i = 0;
    while (logits[i] != mx) i++;
    return i;
}

/* *io = exp(*io) on eight lanes of double: 2^n * p(r) with r = x - n ln2 (n
 * rounded to nearest, ln2 split in two so that n * ln2_hi is exact) and p the degree-13 Taylor polynomial
 * (|r| <= ln2/2: truncation 4e-18; <= 2 ulp from libm in all); x < -708 gives 0 (2^n would leave the normal
 * range), NaN stays NaN. Plain vector operations: the same bits in every build, whatever the batch.
 * The sampler only ever takes x <= 0 (logit - max). */
typedef double kvp_v8d __attribute__((vector_size(64))); /* 8 lanes: one AVX-512 vector, or two AVX2 ones */
typedef int64_t kvp_v8l __attribute__((vector_size(64)));
#define V8_BC(x) ((kvp_v8d){(x), (x), (x), (x), (x), (x), (x), (x)})

static inline __attribute__((always_inline)) void exp_v8(kvp_v8d *io)
{
    kvp_v8d v = *io;
    const kvp_v8l tiny = v < V8_BC(-708.0);
    kvp_v8l vi, lo;
    const kvp_v8d lov = V8_BC(-708.0);
    memcpy(&vi, &v, sizeof vi);
    memcpy(&lo, &lov, sizeof lo);
    vi = (tiny & lo) | (~tiny & vi);
    memcpy(&v, &vi, sizeof v);
    const kvp_v8d shifter = V8_BC(0x1.8p52);
    const kvp_v8d t = v * V8_BC(1.4426950408889634074) + shifter;
    const kvp_v8d n = t - shifter;
    const kvp_v8d r = v - n * V8_BC(6.93147180369123816490e-01) - n * V8_BC(1.90821492927058770002e-10);
    /* sum r^k / k!, k = 0..13, in Estrin's scheme (pairs, then r^2, r^4, r^8): a dependency chain of 4
     * multiply-adds instead of 13 */
    const kvp_v8d r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    const kvp_v8d q0 = V8_BC(1.0) + r, q1 = V8_BC(0.5) + r * V8_BC(1.0 / 6.0),
                  q2 = V8_BC(1.0 / 24.0) + r * V8_BC(1.0 / 120.0), q3 = V8_BC(1.0 / 720.0) + r * V8_BC(1.0 / 5040.0),
                  q4 = V8_BC(1.0 / 40320.0) + r * V8_BC(1.0 / 362880.0),
                  q5 = V8_BC(1.0 / 3628800.0) + r * V8_BC(1.0 / 39916800.0),
                  q6 = V8_BC(1.0 / 479001600.0) + r * V8_BC(1.0 / 6227020800.0);
    const kvp_v8d s0 = q0 + r2 * q1, s1 = q2 + r2 * q3, s2 = q4 + r2 * q5;
    const kvp_v8d u0 = s0 + r4 * s1, u1 = s2 + r4 * q6;
    const kvp_v8d p = u0 + r8 * u1;
    kvp_v8l tb, sb;
    memcpy(&tb, &t, sizeof tb);
    memcpy(&sb, &shifter, sizeof sb);
    const kvp_v8l e = (tb - sb + 1023) << 52;
    kvp_v8d scale;
    memcpy(&scale, &e, sizeof scale);
    kvp_v8d res = p * scale;
    kvp_v8l ri;
    memcpy(&ri, &res, sizeof ri);
    ri = ~tiny & ri; /* exp(x < -708) = 0 */
    memcpy(io, &ri, sizeof ri);
}

/* x[i] = exp(x[i]) for i < n, in place: 8-lane vectors, the tail through a zero-padded block, so each
 * element gets the same operations wherever it sits. Built twice (ifunc): with AVX-512F where the CPU has
 * it, a vector is one instruction's operand instead of two (the same operations, the same bits). */
__attribute__((target_clones("avx512f", "default"))) static void exp_inplace(double *x, int32_t n)
{
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        kvp_v8d v;
        memcpy(&v, x + i, sizeof v);
        exp_v8(&v);
        memcpy(x + i, &v, sizeof v);
    }
    for (; i < n; i += 8) {
        double tmp[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        const int32_t c = n - i < 8 ? n - i : 8;
        memcpy(tmp, x + i, (size_t)c * sizeof(double));
        kvp_v8d v;
        memcpy(&v, tmp, sizeof v);
        exp_v8(&v);
        memcpy(tmp, &v, sizeof v);
        memcpy(x + i, tmp, (size_t)c * sizeof(double));
    }
}

/* log sum_i exp(logits[i]) as max + log(sum exp(logits[i] - max)), summed in id order in double. */
static double log_sum_exp(const float *logits, int32_t vocab)
{
    float mx = max_logit(logits, vocab);
    double sum = 0.0;
    for (int32_t i0 = 0; i0 < vocab; i0 += 64) {
        const int32_t cnt = vocab - i0 < 64 ? vocab - i0 : 64;
        double e[64];
        for (int32_t j = 0; j < cnt; j++) e[j] = (double)logits[i0 + j] - mx;
        exp_inplace(e, cnt);
        for (int32_t j = 0; j < cnt; j++) sum += e[j]; /* in id order */
    }
    return mx + log(sum);
}

void kvp_log_softmax(const float *logits, int32_t vocab, float *out)
{
    const double lse = log_sum_exp(logits, vocab);
    for (int32_t i = 0; i < vocab; i++) out[i] = (float)((double)logits[i] - lse);
}

void kvp_top_logprobs(const float *lsm, int32_t vocab, int32_t k, int32_t *ids, float *lps)
{
    int32_t n = 0; /* kept so far, sorted: insertion from the back (k is small, most ids fail the first test) */
    for (int32_t t = 0; t < vocab && k > 0; t++) {
        if (n == k && !(lsm[t] > lps[k - 1])) continue;
        int32_t i = n < k ? n++ : k - 1;
        for (; i > 0 && lsm[t] > lps[i - 1]; i--) {
            ids[i] = ids[i - 1];
            lps[i] = lps[i - 1];
        }
        ids[i] = t;
        lps[i] = lsm[t];
    }
}

static _Thread_local const float *g_sort_logits; /* qsort has no context argument */

static int by_logit_desc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = g_sort_logits[x], ly = g_sort_logits[y];
    if (lx > ly) return -1;
    if (lx < ly) return 1;
    return (x > y) - (x < y);
}

/* Moves the k largest logits (ties: lower id) to idx[0..k), sorted descending. */
static void top_sorted(const float *logits, int32_t vocab, int32_t k, int32_t *idx)
{
    for (int32_t i = 0; i < vocab; i++) idx[i] = i;
    /* Full sort when k is a large share of the vocabulary, else insertion into a sorted top-k list. */
    if ((int64_t)k * 8 >= vocab) {
        g_sort_logits = logits;
        qsort(idx, (size_t)vocab, sizeof *idx, by_logit_desc);
        return;
    }
    /* Maintain idx[0..k) sorted descending by insertion. */
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        float l = logits[i];
        if (n == k && !(l > logits[idx[k - 1]])) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && l > logits[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

/* The first index of the running sums c[0..n) (nondecreasing, c[n-1] = sum) that exceeds u * sum, u drawn
 * from rng: a binary search, the index a linear walk would stop at. */
static int32_t pick(const double *c, int32_t n, kvp_rng *rng)
{
    const double u = kvp_rng_uniform(rng) * c[n - 1];
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (u < c[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Index i of w[0..n) drawn with probability w[i] / sum(w): w becomes its running sums (in index order) and
 * the draw is the first index whose running sum exceeds u * sum (pick), without a second dependent pass over
 * w. *sum_out (if not NULL) gets the sum. */
static int32_t draw_weighted(double *w, int32_t n, kvp_rng *rng, double *sum_out)
{
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) w[i] = sum += w[i];
    if (sum_out) *sum_out = sum;
    return pick(w, n, rng);
}

/* Plain temperature (no top-k, no top-p; min-p or not): no ordering needed, the draw is over ids in order. */
static int is_plain(const kvp_sampler_params *p, int32_t vocab)
{
    return p->temperature > 0.0 && p->top_k != 1 && (p->top_k <= 0 || p->top_k >= vocab) && p->top_p >= 1.0;
}

/* w[i] = exp((logits[i] - max) / temperature), the plain draw's weights (the likeliest id's is 1), and 0 for
 * the ids below min_p of it. */
static void plain_weights(const kvp_sampler_params *p, const float *logits, int32_t vocab, double *w)
{
    double mx = max_logit(logits, vocab);
    if (p->temperature == 1.0) /* x / 1.0 == x: no division per id */
        for (int32_t i = 0; i < vocab; i++) w[i] = (double)logits[i] - mx;
    else
        for (int32_t i = 0; i < vocab; i++) w[i] = ((double)logits[i] - mx) / p->temperature;
    exp_inplace(w, vocab);
    if (p->min_p > 0.0)
        for (int32_t i = 0; i < vocab; i++) w[i] = w[i] < p->min_p ? 0.0 : w[i];
}

/* The draw of kvp_sample; *sum_out (plain temperature only, else untouched) gets the sum of the draw's
 * weights, in id order. */
static int32_t sample(const kvp_sampler_params *p, kvp_rng *rng, const float *logits, int32_t vocab, kvp_sampler_ws *ws,
                      double *sum_out)
{
    if (p->temperature <= 0.0 || p->top_k == 1) return kvp_argmax(logits, vocab);
    int32_t k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
    int32_t *idx = ws->idx;
    double *prob = ws->prob;
    if (is_plain(p, vocab)) {
        plain_weights(p, logits, vocab, prob);
        return draw_weighted(prob, vocab, rng, sum_out);
    }
    top_sorted(logits, vocab, k, idx);
    double mx = logits[idx[0]];
    for (int32_t i = 0; i < k; i++) prob[i] = ((double)logits[idx[i]] - mx) / p->temperature;
    exp_inplace(prob, k);
    int32_t n = k;
    while (n > 1 && prob[n - 1] < p->min_p) n--; /* descending from prob[0] = 1: min-p keeps a prefix */
    if (p->top_p < 1.0) {
        double sum = 0.0, cum = 0.0;
        for (int32_t i = 0; i < n; i++) sum += prob[i];
        for (int32_t i = 0; i < n; i++) {
            cum += prob[i] / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    return idx[draw_weighted(prob, n, rng, NULL)];
}

int32_t kvp_sample(const kvp_sampler_params *p, kvp_rng *rng, const float *logits, int32_t vocab, kvp_sampler_ws *ws)
{
    return sample(p, rng, logits, vocab, ws, NULL);
}

double kvp_token_logprob(const float *logits, int32_t vocab, int32_t tok)
{
    return (float)((double)logits[tok] - log_sum_exp(logits, vocab));
}

/* Whether the plain draw's sum of weights is kvp_log_softmax's sum: at temperature 1 without min-p it is,
 * term for term and in the same order (x / 1.0 is exact), and gives the log-probability without a second
 * pass of exp. */
static int sum_is_lse(const kvp_sampler_params *p) { return p->temperature == 1.0 && p->min_p == 0.0; }

/* The log-probability of tok under logits, given sum (> 0: a draw's sum for which sum_is_lse). */
static double logprob_of(const float *logits, int32_t vocab, int32_t tok, double sum)
{
    if (sum > 0.0) return (float)((double)logits[tok] - (max_logit(logits, vocab) + log(sum)));
    return kvp_token_logprob(logits, vocab, tok);
}

int32_t kvp_sample_logprob(const kvp_sampler_params *p, kvp_rng *rng, const float *logits, int32_t vocab,
                           kvp_sampler_ws *ws, double *logprob)
{
    double sum = -1.0;
    int32_t tok = sample(p, rng, logits, vocab, ws, sum_is_lse(p) ? &sum : NULL);
    *logprob = logprob_of(logits, vocab, tok, sum);
    return tok;
}

void kvp_sample_many(int n, const kvp_sampler_params *const *p, kvp_rng *const *rng, const float *const *logits,
                     int32_t vocab, kvp_sampler_ws *ws, int32_t *tok, double *logprob)
{
    double *w[KVP_SAMPLE_MANY];
    int plain[KVP_SAMPLE_MANY], np = 0;
    for (int i = 0; i < n; i++) /* the others now: they use the workspace's first weights too */
        if (is_plain(p[i], vocab)) plain[np++] = i;
        else tok[i] = logprob ? kvp_sample_logprob(p[i], rng[i], logits[i], vocab, ws, &logprob[i])
                              : kvp_sample(p[i], rng[i], logits[i], vocab, ws);
    if (np == 0) return;
    for (int k = 0; k < np; k++) {
        w[k] = ws->prob + (int64_t)k * vocab;
        plain_weights(p[plain[k]], logits[plain[k]], vocab, w[k]);
    }
    /* the running sums of every plain draw, one chain each, in one loop: the chains' add latencies overlap */
    double c[KVP_SAMPLE_MANY] = {0.0};
    _Static_assert(KVP_SAMPLE_MANY == 4, "the loop below runs 4 chains");
    if (np == KVP_SAMPLE_MANY) {
        double *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
        for (int32_t t = 0; t < vocab; t++) {
            w0[t] = c[0] += w0[t];
            w1[t] = c[1] += w1[t];
            w2[t] = c[2] += w2[t];
            w3[t] = c[3] += w3[t];
        }
    } else {
        for (int k = 0; k < np; k++)
            for (int32_t t = 0; t < vocab; t++) w[k][t] = c[k] += w[k][t];
    }
    for (int k = 0; k < np; k++) {
        const int i = plain[k];
        tok[i] = pick(w[k], vocab, rng[i]);
        if (logprob) logprob[i] = logprob_of(logits[i], vocab, tok[i], sum_is_lse(p[i]) ? c[k] : -1.0);
    }
}
