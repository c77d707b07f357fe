/* Tests of prefix_cache/ledger.h on hand-made requests (blocks of 2 tokens): each miss class on a case built to
 * produce it, with the exact token counts; the health histograms' samples; the walker after every step;
 * allocation failures that change nothing; histogram quantiles; bad arguments. The bench tests check the sums
 * and the classes against brute force on every workload. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "blockmgr/block_pool.h"
#include "common/alloc.h"
#include "prefix_cache/ledger.h"

typedef struct {
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    kvp_ledger *lg;
    double t;
} rig;

static rig mk(int32_t blocks)
{
    rig r = {0};
    cr_assert_eq(kvp_pool_create(blocks, 2, &r.pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(KVP_PC_RADIX, KVP_EVICT_LRU, r.pool, 2, &r.pc), KVP_OK);
    cr_assert_eq(kvp_ledger_create(2, 0, &r.lg), KVP_OK);
    cr_assert_eq(kvp_ledger_attach(r.lg, r.pc), KVP_OK);
    return r;
}

static void rm(rig *r)
{
    kvp_ledger_destroy(r->lg);
    kvp_pc_destroy(r->pc);
    kvp_pool_destroy(r->pool);
}

/* One request as bench prefix replays it: match, classify, allocate, insert the full blocks, learn what was
 * computed, release. Returns the classes of its missed tokens in m. */
static void request(rig *r, const int32_t *t, int32_t n, int readmission, int64_t m[KVP_MISS_CLASSES])
{
    kvp_ledger_set_time(r->lg, r->t);
    r->t += 1;
    int32_t hit[16], blocks[16], nh = 0, nb = (n + 1) / 2;
    memset(m, 0, KVP_MISS_CLASSES * sizeof *m);
    cr_assert_eq(kvp_pc_match(r->pc, t, n, NULL, 1, hit, 16, &nh), KVP_OK);
    cr_assert_eq(kvp_ledger_lookup(r->lg, t, n, 0, nh, 0, readmission, m), KVP_OK, "%s", kvp_error_detail());
    for (int32_t i = 0; i < nh; i++) kvp_pool_incref(r->pool, hit[i]);
    memcpy(blocks, hit, (size_t)nh * sizeof *blocks);
    cr_assert_eq(kvp_pc_evict_until_free(r->pc, nb - nh), KVP_OK);
    cr_assert_eq(kvp_pool_alloc(r->pool, nb - nh, blocks + nh), KVP_OK);
    cr_assert_eq(kvp_pc_insert(r->pc, t, n, blocks, n / 2, NULL, 0, NULL), KVP_OK);
    cr_assert_eq(kvp_ledger_computed(r->lg, t, n, 0), KVP_OK);
    cr_assert_eq(kvp_pc_unlock(r->pc, hit, nh), KVP_OK);
    cr_assert_eq(kvp_pool_release(r->pool, blocks, nb), KVP_OK);
    cr_assert_eq(kvp_ledger_check(r->lg), KVP_OK, "%s", kvp_error_detail());
    int64_t sum = (int64_t)nh * 2;
    for (int c = 0; c < KVP_MISS_CLASSES; c++) sum += m[c];
    cr_assert_eq(sum, n, "hits and classes sum to the request's tokens");
}

#define CLASSES(m, cold, evicted, last, partial, preempted, host)                                                  \
    do {                                                                                                           \
        const int64_t want_[KVP_MISS_CLASSES] = {cold, evicted, last, partial, preempted, host};                   \
        for (int c_ = 0; c_ < KVP_MISS_CLASSES; c_++)                                                              \
            cr_assert_eq((m)[c_], want_[c_], "line %d: %s %lld, expected %lld", __LINE__,                           \
                         kvp_miss_class_name((kvp_miss_class)c_), (long long)(m)[c_], (long long)want_[c_]);       \
    } while (0)

Test(ledger, cold_partial_last_token)
{
    rig r = mk(64);
    int64_t m[KVP_MISS_CLASSES];
    int32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 3, 4, 5, 6}, c[] = {1, 2, 3}, d[] = {1, 2, 9, 9}, e[] = {7, 8};
    request(&r, a, 5, 0, m); /* nothing before it */
    CLASSES(m, 5, 0, 0, 0, 0, 0);
    request(&r, b, 6, 0, m); /* [12][34] hit; [5 6]: 5 was a's partial tail, 6 new */
    CLASSES(m, 1, 0, 0, 1, 0, 0);
    request(&r, b, 6, 0, m); /* [5 6] is cached now, but it holds the last token */
    CLASSES(m, 0, 0, 2, 0, 0, 0);
    request(&r, c, 3, 0, m); /* [12] hit; 3 was computed inside a full block, but this prompt ends inside it */
    CLASSES(m, 0, 0, 0, 1, 0, 0);
    request(&r, d, 4, 0, m); /* [12] hit; [9 9] never computed after [12] */
    CLASSES(m, 2, 0, 0, 0, 0, 0);
    request(&r, e, 2, 0, m); /* a one-block prompt: never computed */
    CLASSES(m, 2, 0, 0, 0, 0, 0);
    kvp_ledger_stats st;
    kvp_ledger_get_stats(r.lg, &st);
    cr_assert_eq(st.lookups, 6);
    cr_assert_eq(st.prompt_tokens, 5 + 6 + 6 + 3 + 4 + 2);
    cr_assert_eq(st.miss_tokens[KVP_MISS_COLD], 10);
    cr_assert_eq(st.miss_tokens[KVP_MISS_PARTIAL], 2);
    cr_assert_eq(st.miss_tokens[KVP_MISS_LAST_TOKEN], 2);
    cr_assert_eq(st.hit_tokens, 4 + 4 + 2 + 2);
    cr_assert_eq(st.reuse_gap.n, 2 + 2 + 1 + 1, "one gap per hit block");
    cr_assert_eq(st.lifetime.n, 0, "nothing was evicted");
    rm(&r);
}

Test(ledger, evicted_host_flush_preempted_and_ages)
{
    rig r = mk(64);
    int64_t m[KVP_MISS_CLASSES];
    int32_t a[] = {1, 2, 3, 4, 0};
    request(&r, a, 5, 0, m); /* t = 0: caches [12][34], the tail [0] is partial */
    kvp_ledger_set_time(r.lg, 5);
    cr_assert_eq(kvp_pc_evict(r.pc, 2, NULL), KVP_OK); /* both blocks, 5 after their store and last use */
    r.t = 10;
    request(&r, a, 5, 0, m);
    CLASSES(m, 0, 4, 0, 1, 0, 0);
    kvp_ledger_stats st;
    kvp_ledger_get_stats(r.lg, &st);
    cr_assert_eq(st.lifetime.n, 2);
    cr_assert_float_eq(st.lifetime.sum, 10.0, 1e-12);
    cr_assert_float_eq(st.idle_before_evict.sum, 10.0, 1e-12);
    cr_assert_eq(st.miss_evicted_age.n, 2);
    cr_assert_float_eq(st.miss_evicted_age.sum, 10.0, 1e-12, "each missed block had been idle 5 when evicted");
    cr_assert_float_eq(kvp_hist_quantile(&st.miss_evicted_age, 0.5), 3.5, 1e-9, "in the (2, 5] bucket");
    /* copied to a host tier, then evicted: the tier once held them */
    uint64_t h[2];
    kvp_pc_chain_hashes(a, 2, 2, 0, h);
    kvp_ledger_host_stored(r.lg, h, 2);
    kvp_ledger_set_time(r.lg, 12);
    cr_assert_eq(kvp_pc_evict(r.pc, 2, NULL), KVP_OK);
    r.t = 13;
    request(&r, a, 5, 0, m);
    CLASSES(m, 0, 0, 0, 1, 0, 4);
    /* a flush (nothing locked: one CLEARED) */
    int64_t gone;
    kvp_pc_flush(r.pc, &gone);
    cr_assert_eq(gone, 2);
    int32_t b[] = {1, 2, 3, 4, 5, 6, 7};
    request(&r, b, 7, 0, m); /* [12][34] flushed (and once in the tier: host), [5 6] cold, 7 cold */
    CLASSES(m, 3, 0, 0, 0, 0, 4);
    kvp_ledger_get_stats(r.lg, &st);
    cr_assert_eq(st.evicted_flush_tokens, 0, "a block once in the tier counts as host");
    int32_t c[] = {1, 2, 3, 4, 5, 6, 7, 8, 1};
    kvp_pc_flush(r.pc, &gone);
    request(&r, c, 9, 0, m); /* [12][34] host, [56] flushed: evicted, [7 8]: 7 partial, 8 cold; 1 cold */
    CLASSES(m, 2, 2, 0, 1, 0, 4);
    kvp_ledger_get_stats(r.lg, &st);
    cr_assert_eq(st.evicted_flush_tokens, 2);
    /* a readmission: its misses are recomputation after preemption */
    request(&r, c, 9, 1, m);
    CLASSES(m, 0, 0, 0, 0, 1, 0);
    kvp_ledger_get_stats(r.lg, &st);
    cr_assert_eq(st.readmissions, 1);
    cr_assert_eq(st.readmitted_tokens, 9);
    cr_assert_eq(st.readmit_hit_tokens, 8);
    cr_assert_eq(kvp_ledger_check(r.lg), KVP_OK, "%s", kvp_error_detail());
    rm(&r);
}

/* A block computed while the pool could not cache it, and a hash-cache block left unreachable by the eviction
 * of the block before it: both count as evicted. */
Test(ledger, uncached_and_unreachable_blocks_count_as_evicted)
{
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    kvp_ledger *lg;
    cr_assert_eq(kvp_pool_create(8, 2, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(KVP_PC_HASH, KVP_EVICT_COST, pool, 2, &pc), KVP_OK);
    cr_assert_eq(kvp_ledger_create(2, 0, &lg), KVP_OK);
    cr_assert_eq(kvp_ledger_attach(lg, pc), KVP_OK);
    int32_t t[] = {1, 2, 3, 4, 5, 6, 0}, bl[3];
    int64_t m[KVP_MISS_CLASSES] = {0};
    cr_assert_eq(kvp_ledger_lookup(lg, t, 7, 0, 0, 0, 0, m), KVP_OK);
    cr_assert_eq(kvp_pool_alloc(pool, 2, bl), KVP_OK);
    cr_assert_eq(kvp_pc_insert(pc, t, 7, bl, 2, NULL, 0, NULL), KVP_OK); /* [12][34] cached, [56] not: no room */
    cr_assert_eq(kvp_ledger_computed(lg, t, 7, 0), KVP_OK);
    cr_assert_eq(kvp_pool_release(pool, bl, 2), KVP_OK);
    cr_assert_eq(kvp_pc_evict(pc, 1, NULL), KVP_OK); /* cost: the first block goes, orphaning [34] */
    memset(m, 0, sizeof m);
    cr_assert_eq(kvp_ledger_lookup(lg, t, 7, 0, 0, 0, 0, m), KVP_OK);
    CLASSES(m, 0, 6, 0, 1, 0, 0);
    kvp_ledger_stats st;
    kvp_ledger_get_stats(lg, &st);
    cr_assert_eq(st.evicted_uncached_tokens, 2);
    cr_assert_eq(kvp_ledger_check(lg), KVP_OK, "%s", kvp_error_detail());
    kvp_ledger_destroy(lg);
    kvp_pc_destroy(pc);
    kvp_pool_destroy(pool);
}

Test(ledger, a_record_cap_forgets_the_history_of_uncached_blocks)
{
    kvp_ledger *lg;
    cr_assert_eq(kvp_ledger_create(2, 4, &lg), KVP_OK);
    int32_t a[] = {1, 2, 3, 4, 5}, b[] = {7, 7, 8, 8, 9, 9};
    cr_assert_eq(kvp_ledger_computed(lg, a, 5, 0), KVP_OK); /* 3 records */
    cr_assert_eq(kvp_ledger_computed(lg, b, 6, 0), KVP_OK); /* 3 more: over the cap, a's history goes */
    kvp_ledger_stats st;
    kvp_ledger_get_stats(lg, &st);
    cr_assert_eq(st.forgets, 1);
    cr_assert_eq(st.records, 3);
    int64_t m[KVP_MISS_CLASSES] = {0};
    cr_assert_eq(kvp_ledger_lookup(lg, a, 5, 0, 0, 0, 0, m), KVP_OK);
    cr_assert_eq(m[KVP_MISS_COLD], 5, "forgotten content is cold");
    cr_assert_eq(kvp_ledger_check(lg), KVP_OK, "%s", kvp_error_detail());
    kvp_ledger_destroy(lg);
}

Test(ledger, allocation_failures_change_nothing)
{
    int64_t failures = 0;
    for (int64_t n = 1;; n++) {
        kvp_ledger *lg;
        cr_assert_eq(kvp_ledger_create(4, 0, &lg), KVP_OK);
        int32_t t[200];
        for (int i = 0; i < 200; i++) t[i] = i % 13;
        cr_assert_eq(kvp_ledger_computed(lg, t, 37, 0), KVP_OK);
        kvp_ledger_stats before, after;
        kvp_ledger_get_stats(lg, &before);
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_ledger_computed(lg, t, 200, 0);
        if (st == KVP_OK) st = kvp_ledger_lookup(lg, t, 199, 7, 0, 0, 0, NULL);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st != KVP_OK) {
            cr_assert_eq(st, KVP_ENOMEM, "%s", kvp_error_detail());
            failures++;
            kvp_ledger_get_stats(lg, &after);
            cr_assert_eq(after.records, before.records, "failure %lld added records", (long long)n);
            cr_assert_eq(after.lookups, before.lookups);
        }
        cr_assert_eq(kvp_ledger_check(lg), KVP_OK, "%s", kvp_error_detail());
        kvp_ledger_destroy(lg);
        if (made < n) break;
    }
    cr_assert_gt(failures, 0);
}

Test(ledger, histograms_and_bad_arguments)
{
    kvp_hist h = {0};
    cr_assert_eq(kvp_hist_quantile(&h, 0.5), 0);
    for (int i = 1; i <= 100; i++) kvp_hist_add(&h, (double)i);
    cr_assert_eq(h.n, 100);
    cr_assert_float_eq(h.sum, 5050.0, 1e-9);
    double q = kvp_hist_quantile(&h, 0.5);
    cr_assert(q > 20 && q <= 50, "the median of 1..100 lies in the (20, 50] bucket: %g", q);
    kvp_hist_add(&h, 1e9);
    cr_assert_eq(h.counts[KVP_HIST_BUCKETS - 1], 1, "beyond 1e7: the +inf bucket");
    cr_assert(isinf(kvp_hist_bound(KVP_HIST_BUCKETS - 1)));
    cr_assert_float_eq(kvp_hist_bound(0), 0.001, 1e-15);
    cr_assert_str_eq(kvp_miss_class_name(KVP_MISS_LAST_TOKEN), "last_token");
    cr_assert_str_eq(kvp_miss_class_name(KVP_MISS_CLASSES), "?");
    kvp_ledger *lg = NULL;
    cr_assert_eq(kvp_ledger_create(0, 0, &lg), KVP_EINVAL);
    cr_assert_eq(kvp_ledger_create(2, -1, &lg), KVP_EINVAL);
    cr_assert_eq(kvp_ledger_create(2, 0, &lg), KVP_OK);
    int32_t t[] = {1, 2, 3};
    cr_assert_eq(kvp_ledger_lookup(lg, t, 3, 0, 2, 0, 0, NULL), KVP_EINVAL, "3 tokens match at most 1 block");
    cr_assert_eq(kvp_ledger_lookup(lg, t, 0, 0, 0, 0, 0, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_ledger_computed(lg, NULL, 2, 0), KVP_EINVAL);
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    cr_assert_eq(kvp_pool_create(4, 4, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(KVP_PC_RADIX, KVP_EVICT_LRU, pool, 4, &pc), KVP_OK);
    cr_assert_eq(kvp_ledger_attach(lg, pc), KVP_EINVAL, "block sizes differ");
    cr_assert(strstr(kvp_error_message(), "a miss ledger of 2-token blocks cannot follow a cache of 4-token blocks"),
              "%s", kvp_error_message());
    cr_assert_eq(kvp_ledger_attach(lg, NULL), KVP_EINVAL);
    kvp_ledger_detach(lg); /* following nothing: a no-op */
    kvp_pc_destroy(pc);
    kvp_pool_destroy(pool);
    kvp_ledger_destroy(lg);
    kvp_ledger_destroy(NULL);
}
