/* Sampler tests: greedy, and the statistics of temperature / min-p / top-k / top-p sampling with fixed seeds
 * against the exact distributions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/sampler.h"

static const float logits8[8] = {1.0f, 2.5f, 0.0f, 2.0f, -1.0f, 2.5f, 0.5f, 1.5f};

/* order[0..n) := the ids of l[0..n) by value, descending, lowest id first on ties (a plain exchange sort). */
static void sort_desc(const float *l, int n, int32_t *order)
{
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (l[order[j]] > l[order[i]] || (l[order[j]] == l[order[i]] && order[j] < order[i])) {
                int32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
}

/* Exact probabilities after temperature, min-p, top-k, top-p (the reference, written independently: sort by
 * value with a stable rule, then cut). */
static void reference(const float *l, int n, double temp, int top_k, double top_p, double min_p, double *out)
{
    int32_t order[64];
    sort_desc(l, n, order);
    int k = top_k > 0 && top_k < n ? top_k : n;
    double p[64], s = 0;
    for (int i = 1; i < k; i++) /* min-p: probability over the likeliest's, exp((l_i - l_max) / temp) */
        if (exp((l[order[i]] - l[order[0]]) / temp) < min_p) {
            k = i;
            break;
        }
    for (int i = 0; i < k; i++) s += p[i] = exp(l[order[i]] / temp);
    int keep = k;
    double cum = 0;
    for (int i = 0; i < k && top_p < 1.0; i++) {
        cum += p[i] / s;
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    double s2 = 0;
    for (int i = 0; i < keep; i++) s2 += p[i];
    for (int i = 0; i < n; i++) out[i] = 0;
    for (int i = 0; i < keep; i++) out[order[i]] = p[i] / s2;
}

static void check_stats(double temp, int top_k, double top_p, double min_p, uint64_t seed)
{
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(8, &ws), KVP_OK);
    kvp_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p, .seed = seed};
    cr_assert_eq(kvp_sampler_check(&p), KVP_OK);
    kvp_rng rng;
    kvp_rng_seed(&rng, seed, 0);
    const int N = 40000;
    int count[8] = {0};
    for (int i = 0; i < N; i++) {
        int32_t t = kvp_sample(&p, &rng, logits8, 8, ws);
        cr_assert(t >= 0 && t < 8);
        count[t]++;
    }
    double want[8];
    reference(logits8, 8, temp, top_k, top_p, min_p, want);
    for (int i = 0; i < 8; i++) {
        double f = (double)count[i] / N, sd = sqrt(want[i] * (1 - want[i]) / N);
        if (want[i] == 0)
            cr_assert_eq(count[i], 0, "seed %llu temp %g k %d p %g min_p %g: token %d is outside the allowed set",
                         (unsigned long long)seed, temp, top_k, top_p, min_p, i);
        else
            cr_assert_leq(fabs(f - want[i]), 5 * sd + 1e-9,
                          "seed %llu temp %g k %d p %g min_p %g: token %d freq %g want %g", (unsigned long long)seed,
                          temp, top_k, top_p, min_p, i, f, want[i]);
    }
    kvp_sampler_ws_destroy(ws);
}

Test(sampler, greedy_picks_first_maximum)
{
    kvp_sampler_params p = kvp_sampler_default();
    kvp_rng rng;
    kvp_rng_seed(&rng, 1, 0);
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(8, &ws), KVP_OK);
    cr_assert_eq(kvp_sample(&p, &rng, logits8, 8, ws), 1); /* 1 and 5 tie: lowest id */
    p.temperature = 0.8;
    p.top_k = 1;
    cr_assert_eq(kvp_sample(&p, &rng, logits8, 8, ws), 1);
    kvp_sampler_ws_destroy(ws);
}

/* kvp_argmax against the one-id-at-a-time definition (first id holding the largest value; NaN never
 * larger, a NaN at id 0 kept): every length 1..80, values drawn from a few levels (ties), with -inf, +inf
 * and NaNs sprinkled, the largest value anywhere (the vector part, the tail). */
Test(sampler, argmax_matches_the_scalar_definition)
{
    kvp_rng rng;
    kvp_rng_seed(&rng, 7, 0);
    float l[80];
    for (int trial = 0; trial < 20000; trial++) {
        const int n = 1 + trial % 80;
        for (int i = 0; i < n; i++) {
            const uint64_t r = kvp_rng_next(&rng) % 16;
            l[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 && trial % 7 == 0 ? INFINITY : (float)(r % 5) - 2.0f;
        }
        int32_t want = 0;
        for (int i = 1; i < n; i++)
            if (l[i] > l[want]) want = i;
        cr_assert_eq(kvp_argmax(l, n), want, "trial %d, n = %d", trial, n);
    }
}

Test(sampler, temperature_top_k_top_p_statistics)
{
    check_stats(1.0, 0, 1.0, 0, 42);
    check_stats(0.5, 0, 1.0, 0, 43);
    check_stats(2.0, 0, 1.0, 0, 44);
    check_stats(1.0, 3, 1.0, 0, 45);  /* ids 1, 5, 3 */
    check_stats(1.0, 0, 0.5, 0, 46);
    check_stats(0.7, 4, 0.8, 0, 47);
    check_stats(1.0, 7, 0.95, 0, 48);
    /* min-p alone (the ids in id order) and before top-k / top-p (the sorted path): 0.3 of the likeliest keeps
     * logits from 2.5 - ln(1/0.3) = 1.296 at temperature 1 (ids 1, 5, 3, 7), at 0.5 from 1.898 (1, 5, 3) */
    check_stats(1.0, 0, 1.0, 0.3, 49);
    check_stats(0.5, 0, 1.0, 0.3, 50);
    check_stats(1.0, 0, 0.7, 0.3, 51);
    check_stats(1.0, 6, 1.0, 0.5, 52); /* min-p cuts top-k's 6 to ids 1, 5, 3 */
    check_stats(2.0, 6, 0.9, 0.5, 53); /* to 1, 5, 3, 7, then top-p */
    check_stats(1.0, 0, 1.0, 1.0, 54); /* only the likeliest: ids 1 and 5 (tied) */
}

Test(sampler, seeds_reproduce_and_streams_differ)
{
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(8, &ws), KVP_OK);
    kvp_sampler_params p = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 9};
    int32_t a[64], b[64], c[64];
    kvp_rng r1, r2, r3;
    kvp_rng_seed(&r1, 9, 0);
    kvp_rng_seed(&r2, 9, 0);
    kvp_rng_seed(&r3, 9, 1);
    for (int i = 0; i < 64; i++) {
        a[i] = kvp_sample(&p, &r1, logits8, 8, ws);
        b[i] = kvp_sample(&p, &r2, logits8, 8, ws);
        c[i] = kvp_sample(&p, &r3, logits8, 8, ws);
    }
    cr_assert(memcmp(a, b, sizeof a) == 0);
    cr_assert(memcmp(a, c, sizeof a) != 0);
    kvp_sampler_ws_destroy(ws);
}

/* A plain-temperature draw is the first id whose running sum of exp(logit - max) (in id order) exceeds
 * u * total, u the sequence's next uniform: checked against that linear walk with libm's exp, over vocab
 * sizes from 1 to 32000, draws landing everywhere in the vocabulary (spread logits). */
Test(sampler, plain_temperature_draw_is_the_linear_walk)
{
    static const int32_t sizes[] = {1, 2, 7, 64, 512, 32000};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const int32_t n = sizes[z];
        float *l = malloc((size_t)n * sizeof *l);
        double *w = malloc((size_t)n * sizeof *w);
        kvp_sampler_ws *ws;
        cr_assert(l && w);
        cr_assert_eq(kvp_sampler_ws_create(n, &ws), KVP_OK);
        kvp_rng g;
        kvp_rng_seed(&g, 77 + (uint64_t)z, 0);
        for (int32_t i = 0; i < n; i++) l[i] = (float)(kvp_rng_uniform(&g) * 6.0 - 3.0);
        double mx = l[0];
        for (int32_t i = 1; i < n; i++) mx = l[i] > mx ? l[i] : mx;
        double total = 0.0;
        for (int32_t i = 0; i < n; i++) total += w[i] = exp((double)l[i] - mx);
        kvp_sampler_params p = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 5};
        kvp_rng r, twin;
        kvp_rng_seed(&r, 5, (uint64_t)z);
        twin = r;
        int32_t lo = n, hi = -1;
        for (int k = 0; k < 400; k++) {
            const int32_t got = kvp_sample(&p, &r, l, n, ws);
            double acc = 0.0;
            const double u = kvp_rng_uniform(&twin) * total;
            int32_t want = n - 1;
            for (int32_t i = 0; i < n; i++)
                if (u < (acc += w[i])) {
                    want = i;
                    break;
                }
            cr_assert_eq(got, want, "vocab %d, draw %d: sampled %d, the linear walk gives %d", n, k, got, want);
            lo = got < lo ? got : lo;
            hi = got > hi ? got : hi;
        }
        if (n >= 64) cr_assert(lo < n / 8 && hi > n - n / 8, "vocab %d: draws spanned only %d..%d", n, lo, hi);
        kvp_sampler_ws_destroy(ws);
        free(l);
        free(w);
    }
}

Test(sampler, large_vocab_top_k_matches_full_sort)
{
    enum { V = 5000 };
    static float l[V];
    kvp_rng g;
    kvp_rng_seed(&g, 3, 0);
    for (int i = 0; i < V; i++) l[i] = (float)(kvp_rng_uniform(&g) * 10.0);
    l[17] = l[4000] = 11.0f;
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(V, &ws), KVP_OK);
    /* With a tiny temperature the draw is the top token; top-k 2 keeps exactly {17, 4000}. */
    kvp_sampler_params p = {.temperature = 1.0, .top_k = 2, .top_p = 1.0, .seed = 5};
    kvp_rng r;
    kvp_rng_seed(&r, 5, 0);
    int n17 = 0, n4000 = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t t = kvp_sample(&p, &r, l, V, ws);
        cr_assert(t == 17 || t == 4000, "got %d", t);
        n17 += t == 17;
        n4000 += t == 4000;
    }
    cr_assert(n17 > 850 && n4000 > 850, "%d %d", n17, n4000);
    float ls[V];
    kvp_log_softmax(l, V, ls);
    double s = 0;
    for (int i = 0; i < V; i++) s += exp(ls[i]);
    cr_assert_float_eq(s, 1.0, 1e-5);
    kvp_sampler_ws_destroy(ws);
}

Test(sampler, rejects_bad_parameters)
{
    kvp_sampler_params p = kvp_sampler_default();
    p.temperature = -1;
    cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
    p = kvp_sampler_default();
    p.top_p = 0;
    cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
    p.top_p = 1.5;
    cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
    p = kvp_sampler_default();
    p.top_k = -2;
    cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
    p.temperature = NAN;
    p.top_k = 0;
    cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
    const double bad_min_p[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        p = kvp_sampler_default();
        p.min_p = bad_min_p[i];
        cr_assert_eq(kvp_sampler_check(&p), KVP_EINVAL);
        cr_assert(strstr(kvp_error_message(), "min_p"), "%s", kvp_error_message());
    }
    p.min_p = 1.0;
    cr_assert_eq(kvp_sampler_check(&p), KVP_OK);
}

/* kvp_sample_logprob draws the same token as kvp_sample (same generator state after) and gives exactly
 * kvp_log_softmax's value for it, on the one-pass (temperature 1) path and on the others. */
Test(sampler, sample_logprob_equals_sample_plus_log_softmax)
{
    enum { V = 512 };
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(V, &ws), KVP_OK);
    static float logits[V], ref[V];
    kvp_rng gen;
    kvp_rng_seed(&gen, 7, 0);
    const kvp_sampler_params ps[] = {{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 3},
                                     {.temperature = 0.7, .top_k = 0, .top_p = 1.0, .seed = 3},
                                     {.temperature = 1.0, .top_k = 40, .top_p = 1.0, .seed = 3},
                                     {.temperature = 1.0, .top_k = 0, .top_p = 0.9, .seed = 3},
                                     {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.05, .seed = 3}};
    for (size_t c = 0; c < sizeof ps / sizeof ps[0]; c++)
        for (int trial = 0; trial < 200; trial++) {
            double scale = 1.0 + 9.0 * kvp_rng_uniform(&gen);
            for (int i = 0; i < V; i++) logits[i] = (float)((kvp_rng_uniform(&gen) - 0.5) * scale);
            kvp_rng a, b;
            kvp_rng_seed(&a, 11, (uint64_t)trial);
            b = a;
            int32_t want = kvp_sample(&ps[c], &a, logits, V, ws);
            kvp_log_softmax(logits, V, ref);
            double lp = 0;
            int32_t got = kvp_sample_logprob(&ps[c], &b, logits, V, ws, &lp);
            cr_assert_eq(got, want, "case %zu trial %d", c, trial);
            cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "case %zu trial %d: generator states differ", c, trial);
            cr_assert(lp == (double)ref[want], "case %zu trial %d: log-probability %.9g, log_softmax %.9g", c, trial,
                      lp, (double)ref[want]);
            for (int32_t t = 0; t < V; t += 37) /* and for any token */
                cr_assert(kvp_token_logprob(logits, V, t) == (double)ref[t], "token %d: %.9g vs %.9g", t,
                          kvp_token_logprob(logits, V, t), (double)ref[t]);
        }
    kvp_sampler_ws_destroy(ws);
}

/* kvp_sample_many gives what one call each gives: the same tokens, log-probabilities and generator states,
 * for groups of 1 to KVP_SAMPLE_MANY draws mixing plain temperature (1 and 0.7), top-k, top-p and greedy, in
 * every order, with and without log-probabilities, and an odd vocabulary size. */
Test(sampler, sample_many_equals_one_call_each)
{
    enum { V = 509 };
    kvp_sampler_ws *ws;
    cr_assert_eq(kvp_sampler_ws_create(V, &ws), KVP_OK);
    static float logits[KVP_SAMPLE_MANY][V];
    const kvp_sampler_params kinds[] = {{.temperature = 1.0, .top_k = 0, .top_p = 1.0},
                                        {.temperature = 0.7, .top_k = 0, .top_p = 1.0},
                                        {.temperature = 1.0, .top_k = V, .top_p = 1.0},
                                        {.temperature = 1.0, .top_k = 40, .top_p = 1.0},
                                        {.temperature = 1.0, .top_k = 0, .top_p = 0.9},
                                        {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.05},
                                        {.temperature = 0.8, .top_k = 50, .top_p = 0.95, .min_p = 0.1},
                                        {.temperature = 0.0, .top_k = 0, .top_p = 1.0}};
    const int nk = (int)(sizeof kinds / sizeof kinds[0]);
    kvp_rng gen;
    kvp_rng_seed(&gen, 5, 0);
    for (int trial = 0; trial < 400; trial++) {
        const int n = 1 + trial % KVP_SAMPLE_MANY, with_lp = trial % 3 != 0;
        const kvp_sampler_params *p[KVP_SAMPLE_MANY];
        const float *lg[KVP_SAMPLE_MANY];
        kvp_rng one[KVP_SAMPLE_MANY], many[KVP_SAMPLE_MANY], *mp[KVP_SAMPLE_MANY];
        int32_t want[KVP_SAMPLE_MANY], got[KVP_SAMPLE_MANY];
        double want_lp[KVP_SAMPLE_MANY] = {0}, got_lp[KVP_SAMPLE_MANY] = {0};
        for (int i = 0; i < n; i++) {
            p[i] = &kinds[kvp_rng_next(&gen) % (uint64_t)nk];
            const double scale = 1.0 + 9.0 * kvp_rng_uniform(&gen);
            for (int t = 0; t < V; t++) logits[i][t] = (float)((kvp_rng_uniform(&gen) - 0.5) * scale);
            lg[i] = logits[i];
            kvp_rng_seed(&one[i], 17, (uint64_t)(trial * KVP_SAMPLE_MANY + i));
            many[i] = one[i];
            mp[i] = &many[i];
        }
        for (int i = 0; i < n; i++)
            want[i] = with_lp ? kvp_sample_logprob(p[i], &one[i], lg[i], V, ws, &want_lp[i])
                              : kvp_sample(p[i], &one[i], lg[i], V, ws);
        kvp_sample_many(n, p, mp, lg, V, ws, got, with_lp ? got_lp : NULL);
        for (int i = 0; i < n; i++) {
            cr_assert_eq(got[i], want[i], "trial %d draw %d", trial, i);
            cr_assert_eq(memcmp(&one[i], &many[i], sizeof one[i]), 0, "trial %d draw %d: generator states differ",
                         trial, i);
            cr_assert(got_lp[i] == want_lp[i], "trial %d draw %d: %.17g vs %.17g", trial, i, got_lp[i], want_lp[i]);
        }
    }
    kvp_sampler_ws_destroy(ws);
}

/* kvp_log_softmax (vector exp inside) against a libm reference in long double: spreads from 1e-3 to 1e3,
 * odd vocabulary sizes (tails of the 4-lane blocks), -inf logits (probability 0, log-probability -inf). */
Test(sampler, log_softmax_matches_libm_reference)
{
    enum { VMAX = 1031 };
    static float l[VMAX], got[VMAX];
    kvp_rng g;
    kvp_rng_seed(&g, 21, 0);
    const int sizes[] = {1, 3, 5, 512, 1031};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int trial = 0; trial < 20; trial++) {
            const int V = sizes[si];
            const double spread = pow(10.0, -3.0 + 6.0 * kvp_rng_uniform(&g));
            for (int i = 0; i < V; i++) l[i] = (float)((kvp_rng_uniform(&g) - 0.5) * spread);
            if (V > 4) l[V / 2] = -INFINITY;
            kvp_log_softmax(l, V, got);
            long double mx = -INFINITY, sum = 0;
            for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
            for (int i = 0; i < V; i++) sum += expl((long double)l[i] - mx);
            for (int i = 0; i < V; i++) {
                long double want = (long double)l[i] - mx - logl(sum);
                if (isinf(l[i])) {
                    cr_assert(isinf(got[i]) && got[i] < 0, "V %d trial %d: -inf logit gave %g", V, trial, got[i]);
                    continue;
                }
                double err = fabs((double)(got[i] - want)) / (fabs((double)want) + 1.0);
                cr_assert_lt(err, 1e-6, "V %d trial %d spread %g: id %d got %.9g want %.9Lg", V, trial, spread, i,
                             got[i], want);
            }
        }
}

/* kvp_top_logprobs against a full sort (value desc, id asc): values drawn from few levels so that ties are
 * common, k from 1 to the whole vocabulary. */
Test(sampler, top_logprobs_match_full_sort)
{
    enum { V = 97 };
    float l[V], lps[V];
    int32_t ids[V], order[V];
    kvp_rng g;
    kvp_rng_seed(&g, 5, 0);
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < V; i++) l[i] = (float)(kvp_rng_next(&g) % 12) - 20.0f;
        sort_desc(l, V, order);
        const int k = 1 + (int)(kvp_rng_next(&g) % V);
        kvp_top_logprobs(l, V, k, ids, lps);
        for (int i = 0; i < k; i++) {
            cr_assert_eq(ids[i], order[i], "trial %d k %d: place %d is id %d, want %d", trial, k, i, ids[i], order[i]);
            cr_assert_eq(lps[i], l[order[i]]);
        }
    }
}

/* kvp_apply_penalties against a per-token reference (seen in the prompt or the output, count in the output,
 * then vLLM's formulas one token at a time), random logits of both signs, repeated tokens; the scratch counts
 * come back zero. */
Test(sampler, penalties_match_a_per_token_reference)
{
    enum { V = 50 };
    float l[V], got[V];
    int32_t count[V] = {0}, prompt[20], out[30];
    kvp_rng g;
    kvp_rng_seed(&g, 3, 0);
    for (int trial = 0; trial < 200; trial++) {
        const kvp_sampler_params p = {.top_p = 1, .presence_penalty = (float)(kvp_rng_uniform(&g) * 4 - 2),
                                      .frequency_penalty = (float)(kvp_rng_uniform(&g) * 4 - 2),
                                      .repetition_penalty = trial % 3 == 0 ? 0.0f : (float)(0.5 + kvp_rng_uniform(&g) * 2)};
        cr_assert_eq(kvp_sampler_check(&p), KVP_OK);
        const int np = (int)(kvp_rng_next(&g) % 20), no = (int)(kvp_rng_next(&g) % 30);
        for (int i = 0; i < np; i++) prompt[i] = (int32_t)(kvp_rng_next(&g) % V);
        for (int i = 0; i < no; i++) out[i] = (int32_t)(kvp_rng_next(&g) % 12); /* repeats */
        for (int t = 0; t < V; t++) got[t] = l[t] = (float)(kvp_rng_uniform(&g) * 20 - 10);
        kvp_apply_penalties(&p, got, V, prompt, np, out, no, count);
        const float rep = p.repetition_penalty == 0.0f ? 1.0f : p.repetition_penalty;
        for (int t = 0; t < V; t++) {
            int c = 0, seen = 0;
            for (int i = 0; i < no; i++) c += out[i] == t;
            for (int i = 0; i < np; i++) seen |= prompt[i] == t;
            float x = l[t];
            if (seen || c > 0) x = x > 0.0f ? x / rep : x * rep;
            x = x - p.frequency_penalty * (float)c;
            x = x - p.presence_penalty * (c > 0 ? 1.0f : 0.0f);
            cr_assert_eq(got[t], x, "trial %d token %d: %.9g, want %.9g", trial, t, got[t], x);
            cr_assert_eq(count[t], 0, "the scratch counts come back zero");
        }
    }
    const kvp_sampler_params bad[3] = {{.top_p = 1, .presence_penalty = 2.5f}, {.top_p = 1, .frequency_penalty = -3},
                                       {.top_p = 1, .repetition_penalty = -1}};
    for (int i = 0; i < 3; i++) cr_assert_eq(kvp_sampler_check(&bad[i]), KVP_EINVAL, "case %d", i);
    cr_assert(!kvp_sampler_penalized(&(kvp_sampler_params){.repetition_penalty = 1.0f}));
}
