/* Tests of prefix_cache/lru_curve.h: the stack distances against a brute-force recency list (a plain array,
 * searched and shifted), on random accesses with shared prefixes, partial blocks and pins; the corrected curve
 * between the plain one at C - 1 and at C, and non-decreasing in C (inclusion); the exactness flag; bad
 * arguments; allocation failures that change nothing. The curve's equality with replays is tested in
 * tests/bench/test_bench_prefix.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/lru_curve.h"
#include "prefix_cache/prefix_cache.h"

typedef struct {
    uint64_t *v; /* most recent first */
    int64_t n;
} stack;

static int64_t stack_pos(const stack *s, uint64_t h)
{
    for (int64_t i = 0; i < s->n; i++)
        if (s->v[i] == h) return i + 1;
    return -1;
}

static void stack_top(stack *s, uint64_t h)
{
    int64_t p = stack_pos(s, h);
    if (p < 0) {
        s->v = realloc(s->v, (size_t)(s->n + 1) * sizeof *s->v);
        p = ++s->n;
    }
    memmove(s->v + 1, s->v, (size_t)(p - 1) * sizeof *s->v);
    s->v[0] = h;
}

static uint64_t rng(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

Test(lru_curve, stack_distances_match_a_brute_force_stack)
{
    for (uint64_t seed = 1; seed <= 4; seed++) {
        const int32_t bs = (int32_t)(2 + seed % 3);
        kvp_lru_curve *c;
        cr_assert_eq(kvp_lruc_create(bs, &c), KVP_OK);
        stack st = {0};
        int64_t *at = calloc(4096, sizeof *at); /* brute force: lookups per position */
        int32_t base[6][60];
        uint64_t s = seed;
        for (int b = 0; b < 6; b++)
            for (int j = 0; j < 60; j++) base[b][j] = (int32_t)(rng(&s) % 4);
        int64_t look = 0;
        for (int a = 0; a < 400; a++) {
            int32_t t[80], n = 0, b = (int32_t)(rng(&s) % 6), L = (int32_t)(rng(&s) % 61);
            for (int32_t j = 0; j < L; j++) t[n++] = base[b][j];
            for (int32_t j = (int32_t)(rng(&s) % 15); j > 0; j--) t[n++] = (int32_t)(rng(&s) % 4);
            if (n == 0) t[n++] = 3;
            if (a < 3) /* pins: their own content */
                for (int32_t j = 0; j < n; j++) t[j] = 100 + a * 100 + j;
            const int32_t match = a < 3 ? 0 : n - (int32_t)(rng(&s) % 4 == 0 ? rng(&s) % (uint64_t)n : 0);
            cr_assert_eq(kvp_lruc_access(c, t, n, match, 0), KVP_OK);
            uint64_t h[40];
            const int32_t nfull = n / bs, nlook = match > 0 ? (match - 1) / bs : 0;
            kvp_pc_chain_hashes(t, nfull, bs, 0, h);
            for (int32_t i = 0; i < nlook; i++) {
                int64_t p = stack_pos(&st, h[i]);
                if (p > 0) at[p] += bs;
            }
            for (int32_t i = nfull - 1; i >= 0; i--) stack_top(&st, h[i]);
            look += match;
        }
        cr_assert_eq(kvp_lruc_finish(c), KVP_OK);
        cr_assert_eq(kvp_lruc_access(c, base[0], 4, 4, 0), KVP_ESTATE, "no access after finish");
        cr_assert_eq(kvp_lruc_blocks(c), st.n);
        cr_assert_eq(kvp_lruc_lookup_tokens(c), look);
        int64_t cum = 0, prev = 0;
        for (int64_t C = 1; C <= st.n + 2; C++) {
            if (C <= st.n) cum += at[C];
            cr_assert_eq(kvp_lruc_stack_hit_tokens(c, C), cum, "seed %llu capacity %lld", (unsigned long long)seed, (long long)C);
            const int64_t hit = kvp_lruc_hit_tokens(c, C);
            cr_assert(hit >= kvp_lruc_stack_hit_tokens(c, C - 1 > 0 ? C - 1 : 1) - (C == 1 ? at[1] : 0) && hit <= cum,
                      "capacity %lld: %lld outside [stack(C-1), stack(C)]", (long long)C, (long long)hit);
            cr_assert_geq(hit, prev, "the curve must not fall as the capacity grows (inclusion)");
            prev = hit;
        }
        cr_assert_eq(kvp_lruc_hit_tokens(c, 0), cum, "unbounded: every seen block hits");
        cr_assert_gt(cum, 0);
        cr_assert(kvp_lruc_exact(c), "pins with new content keep the curve exact");
        kvp_lruc_destroy(c);
        free(st.v);
        free(at);
    }
}

Test(lru_curve, a_pin_repeating_content_is_flagged_and_arguments_are_checked)
{
    kvp_lru_curve *c = NULL;
    cr_assert_eq(kvp_lruc_create(0, &c), KVP_EINVAL);
    cr_assert_eq(kvp_lruc_create(2, &c), KVP_OK);
    int32_t t[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(kvp_lruc_access(c, t, 5, 6, 0), KVP_EINVAL, "more tokens looked up than cached");
    cr_assert_eq(kvp_lruc_access(c, NULL, 3, 0, 0), KVP_EINVAL);
    cr_assert_eq(kvp_lruc_access(c, t, 5, 0, 0), KVP_OK);
    cr_assert(kvp_lruc_exact(c));
    cr_assert_eq(kvp_lruc_access(c, t, 5, 0, 0), KVP_OK);
    cr_assert(!kvp_lruc_exact(c), "a pin of content already cached");
    cr_assert_eq(kvp_lruc_access(c, t, 5, 5, 0), KVP_OK);
    cr_assert_eq(kvp_lruc_finish(c), KVP_OK);
    cr_assert_eq(kvp_lruc_hit_tokens(c, 0), 4);
    cr_assert_eq(kvp_lruc_max_access_blocks(c), 3);
    kvp_lruc_destroy(c);
    kvp_lruc_destroy(NULL);
}

Test(lru_curve, allocation_failures_change_nothing)
{
    int64_t failures = 0;
    for (int64_t n = 1;; n++) {
        kvp_lru_curve *c;
        cr_assert_eq(kvp_lruc_create(2, &c), KVP_OK);
        int32_t t[3000];
        for (int i = 0; i < 3000; i++) t[i] = i;
        cr_assert_eq(kvp_lruc_access(c, t, 9, 9, 0), KVP_OK);
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_lruc_access(c, t, 3000, 3000, 0); /* grows every array, the clock's tree too */
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        cr_assert_eq(kvp_lruc_finish(c), KVP_OK);
        if (st != KVP_OK) {
            cr_assert_eq(st, KVP_ENOMEM);
            failures++;
            cr_assert_eq(kvp_lruc_blocks(c), 4, "failure %lld changed the curve", (long long)n);
            cr_assert_eq(kvp_lruc_lookup_tokens(c), 9);
        } else {
            cr_assert_eq(kvp_lruc_hit_tokens(c, 0), 8);
        }
        kvp_lruc_destroy(c);
        if (made < n) break;
    }
    cr_assert_gt(failures, 0);
}
