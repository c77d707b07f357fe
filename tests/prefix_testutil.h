/* tests/prefix_testutil.h — a brute-force reference for prefix-cache hits, sharing no code with the caches:
 * requests served one after another in workload order, every block ever cached kept. */
#ifndef KVP_TESTS_PREFIX_TESTUTIL_H
#define KVP_TESTS_PREFIX_TESTUTIL_H

#include <stdint.h>
#include <stdlib.h>

#include "runtime/workload/workload.h"

/* Hit tokens of request i of w: the longest prefix it shares with the tokens an earlier request computed
 * (its prompt, and its known answer but the last token), in whole blocks of bs, never covering its own last
 * prompt token. */
static inline int32_t kvp_test_bruteforce_hit(const kvp_workload *w, int64_t i, int32_t bs)
{
    const kvp_request *r = &w->reqs[i];
    int32_t best = 0;
    for (int64_t j = 0; j < i; j++) {
        const kvp_request *q = &w->reqs[j];
        int32_t nk = q->prompt_len + (q->output_tokens ? q->output_len - 1 : 0), l = 0;
        while (l < r->prompt_len && l < nk &&
               r->tokens[l] == (l < q->prompt_len ? q->tokens[l] : q->output_tokens[l - q->prompt_len]))
            l++;
        best = l > best ? l : best;
    }
    best = best < r->prompt_len - 1 ? best : r->prompt_len - 1;
    return best / bs * bs;
}

/* Hit tokens over w's requests (kvp_test_bruteforce_hit of each). */
static inline int64_t kvp_test_bruteforce_hits(const kvp_workload *w, int32_t bs)
{
    int64_t hits = 0;
    for (int64_t i = 1; i < w->n; i++) hits += kvp_test_bruteforce_hit(w, i, bs);
    return hits;
}

/* Distinct blocks ever hit: block k of request i (its first (k + 1) * bs prompt tokens) for k below its hit,
 * counted once however many requests hit it. */
static inline int64_t kvp_test_bruteforce_hit_blocks(const kvp_workload *w, int32_t bs)
{
    int32_t *hit = calloc((size_t)(w->n > 0 ? w->n : 1), sizeof *hit);
    if (hit == NULL) return -1;
    for (int64_t i = 1; i < w->n; i++) hit[i] = kvp_test_bruteforce_hit(w, i, bs);
    int64_t n = 0;
    for (int64_t i = 1; i < w->n; i++)
        for (int32_t len = bs; len <= hit[i]; len += bs) {
            int seen = 0; /* an earlier request hit the same prefix */
            for (int64_t j = 1; j < i && !seen; j++) {
                int32_t l = 0;
                if (hit[j] < len) continue;
                while (l < len && w->reqs[j].tokens[l] == w->reqs[i].tokens[l]) l++;
                seen = l == len;
            }
            n += !seen;
        }
    free(hit);
    return n;
}

#endif
