/* Tests of prefix_cache/host_cache.h: random matches and stores against a model that keeps a last-use time
 * per held hash (store and match make the given blocks the most recent, the first block most; the least
 * recent leave when over capacity), with the invariant walker after every call; slots stay put while held;
 * the next victim; allocation failures; the chain hashes; write-policy names. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/host_cache.h"
#include "prefix_cache/prefix_cache.h" /* kvp_pc_chain_hashes */

enum { UNIVERSE = 48, MAXN = 14 };

/* The model: per hash value (an index into the universe) its last-use time, 0 when not held, and the slot
 * the cache gave it. */
typedef struct {
    int64_t t[UNIVERSE], clock;
    int32_t slot[UNIVERSE];
    int32_t cap;
} model;

static int32_t model_held(const model *m)
{
    int32_t n = 0;
    for (int i = 0; i < UNIVERSE; i++) n += m->t[i] > 0;
    return n;
}

/* Blocks v[0..n) used now: v[0] the most recent. */
static void model_use(model *m, const int *v, int32_t n)
{
    for (int32_t i = n - 1; i >= 0; i--) m->t[v[i]] = ++m->clock;
}

static void model_trim(model *m)
{
    while (model_held(m) > m->cap) {
        int lru = -1;
        for (int i = 0; i < UNIVERSE; i++)
            if (m->t[i] > 0 && (lru < 0 || m->t[i] < m->t[lru])) lru = i;
        m->t[lru] = 0;
    }
}

static uint64_t H(int v) { return 0x9e3779b97f4a7c15ull * (uint64_t)(v + 1); }

static void random_chain(int *v, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int x, dup;
        do {
            x = rand() % UNIVERSE;
            dup = 0;
            for (int32_t j = 0; j < i; j++) dup |= v[j] == x;
        } while (dup);
        v[i] = x;
    }
}

static void run_random(int32_t cap, int ops, unsigned seed)
{
    srand(seed);
    kvp_host_cache *hc;
    cr_assert_eq(kvp_hc_create(cap, &hc), KVP_OK);
    model m = {.cap = cap};
    int64_t copies = 0, hits = 0;
    for (int op = 0; op < ops; op++) {
        int v[MAXN];
        uint64_t h[MAXN];
        int32_t slots[MAXN], n = rand() % MAXN;
        /* the victim: none while a slot is free, else the model's least recently used block's slot */
        int lru = -1;
        for (int i = 0; i < UNIVERSE; i++)
            if (m.t[i] > 0 && (lru < 0 || m.t[i] < m.t[lru])) lru = i;
        cr_assert_eq(kvp_hc_victim(hc), model_held(&m) < cap ? -1 : m.slot[lru], "op %d: victim", op);
        random_chain(v, n);
        for (int32_t i = 0; i < n; i++) h[i] = H(v[i]);
        if (rand() % 2) {
            int32_t want = 0;
            while (want < n && m.t[v[want]] > 0) want++;
            int32_t k = kvp_hc_match(hc, h, n, slots);
            cr_assert_eq(k, want, "op %d: match found %d blocks, the model %d", op, k, want);
            for (int32_t i = 0; i < k; i++) cr_assert_eq(slots[i], m.slot[v[i]], "op %d: block %d moved slot", op, i);
            model_use(&m, v, k);
            hits += k;
        } else {
            int32_t mm = n < cap ? n : cap, want = 0;
            for (int32_t i = 0; i < mm; i++) want += m.t[v[i]] == 0;
            int32_t fresh = kvp_hc_store(hc, h, n, slots);
            cr_assert_eq(fresh, want, "op %d: %d new slots, the model %d", op, fresh, want);
            for (int32_t i = 0; i < n; i++) {
                if (i >= mm || m.t[v[i]] > 0) {
                    cr_assert_eq(slots[i], -1, "op %d: block %d needs no copy", op, i);
                    continue;
                }
                cr_assert(slots[i] >= 0 && slots[i] < cap, "op %d: slot %d", op, slots[i]);
                m.slot[v[i]] = slots[i];
            }
            model_use(&m, v, mm);
            model_trim(&m);
            copies += fresh;
            /* a new slot is nobody else's: the held slots are distinct */
            for (int a = 0; a < UNIVERSE; a++)
                for (int b = a + 1; b < UNIVERSE; b++)
                    if (m.t[a] > 0 && m.t[b] > 0) cr_assert_neq(m.slot[a], m.slot[b], "op %d: two blocks in slot %d", op, m.slot[a]);
        }
        cr_assert_eq(kvp_hc_check(hc), KVP_OK, "op %d: %s", op, kvp_error_message());
        kvp_hc_stats s;
        kvp_hc_get_stats(hc, &s);
        cr_assert_eq(s.held_blocks, model_held(&m));
        cr_assert_eq(s.stored_blocks, copies);
        cr_assert_eq(s.hit_blocks, hits);
        cr_assert_eq(s.stored_blocks - s.evicted_blocks, s.held_blocks);
    }
    cr_assert_gt(hits, 0, "the random workload never hit: it checks nothing");
    kvp_hc_destroy(hc);
}

Test(host_cache, random_ops_follow_the_lru_model)
{
    run_random(1, 400, 1);
    run_random(5, 3000, 2);
    run_random(16, 3000, 3);
    run_random(UNIVERSE, 2000, 4); /* never evicts */
}

Test(host_cache, a_prompt_leaves_from_its_last_block)
{
    kvp_host_cache *hc;
    cr_assert_eq(kvp_hc_create(4, &hc), KVP_OK);
    uint64_t a[4] = {H(0), H(1), H(2), H(3)}, b[2] = {H(10), H(11)};
    int32_t slots[4];
    cr_assert_eq(kvp_hc_store(hc, a, 4, slots), 4);
    cr_assert_eq(kvp_hc_store(hc, b, 2, slots), 2); /* evicts a's blocks 3 and 2, not its first ones */
    cr_assert_eq(kvp_hc_match(hc, a, 4, slots), 2);
    cr_assert_eq(kvp_hc_match(hc, b, 2, slots), 2);
    /* a store larger than the cache keeps its first blocks */
    uint64_t c[6] = {H(20), H(21), H(22), H(23), H(24), H(25)};
    int32_t s6[6];
    cr_assert_eq(kvp_hc_store(hc, c, 6, s6), 4);
    cr_assert(s6[4] == -1 && s6[5] == -1);
    cr_assert_eq(kvp_hc_match(hc, c, 6, s6), 4);
    cr_assert_eq(kvp_hc_match(hc, a, 4, slots), 0);
    cr_assert_eq(kvp_hc_check(hc), KVP_OK);
    kvp_hc_destroy(hc);
}

Test(host_cache, clear_leaves_a_cold_cache)
{
    kvp_host_cache *hc;
    cr_assert_eq(kvp_hc_create(3, &hc), KVP_OK);
    uint64_t a[3] = {H(0), H(1), H(2)};
    int32_t slots[3];
    cr_assert_eq(kvp_hc_store(hc, a, 3, slots), 3);
    kvp_hc_clear(hc);
    cr_assert_eq(kvp_hc_check(hc), KVP_OK, "%s", kvp_error_message());
    cr_assert_eq(kvp_hc_match(hc, a, 3, slots), 0);
    cr_assert_eq(kvp_hc_store(hc, a, 3, slots), 3, "every block is new again");
    cr_assert_eq(kvp_hc_check(hc), KVP_OK, "%s", kvp_error_message());
    kvp_hc_destroy(hc);
}

Test(host_cache, a_hash_given_twice_is_stored_once)
{
    kvp_host_cache *hc;
    cr_assert_eq(kvp_hc_create(4, &hc), KVP_OK);
    uint64_t h[3] = {H(1), H(2), H(1)};
    int32_t slots[3];
    cr_assert_eq(kvp_hc_store(hc, h, 3, slots), 2);
    cr_assert_eq(kvp_hc_check(hc), KVP_OK, "%s", kvp_error_message());
    kvp_hc_destroy(hc);
}

Test(host_cache, bad_capacity_and_allocation_failures)
{
    kvp_host_cache *hc = NULL;
    cr_assert_eq(kvp_hc_create(0, &hc), KVP_EINVAL);
    cr_assert_eq(kvp_hc_create(-3, &hc), KVP_EINVAL);
    cr_assert_eq(kvp_hc_create(4, NULL), KVP_EINVAL);
    int failed = 0;
    for (int64_t n = 1;; n++) {
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_hc_create(100, &hc);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st == KVP_OK) {
            cr_assert_lt(made, n, "allocation %lld failed but create succeeded", (long long)n);
            kvp_hc_destroy(hc);
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM);
        failed++;
    }
    cr_assert_geq(failed, 5, "create makes at least 5 allocations; %d failed", failed);
}

Test(host_cache, chain_hashes_are_the_caches_keys)
{
    int32_t toks[12], other[12];
    for (int i = 0; i < 12; i++) toks[i] = other[i] = 100 + i;
    other[9] = 7; /* differs in the last of 4 blocks */
    uint64_t h[4], g[4];
    kvp_pc_chain_hashes(toks, 4, 3, 0, h);
    kvp_pc_chain_hashes(other, 4, 3, 0, g);
    cr_assert_eq(h[0], kvp_pc_block_hash(0, toks, 3, 0));
    cr_assert_eq(h[3], kvp_pc_block_hash(h[2], toks + 9, 3, 0));
    cr_assert(h[0] == g[0] && h[1] == g[1] && h[2] == g[2]);
    cr_assert_neq(h[3], g[3]);
    uint64_t x[4]; /* an extra key (a LoRA id, say) changes every block's hash, through the first */
    kvp_pc_chain_hashes(toks, 4, 3, 42, x);
    cr_assert_eq(x[0], kvp_pc_block_hash(0, toks, 3, 42));
    cr_assert_eq(x[1], kvp_pc_block_hash(x[0], toks + 3, 3, 0));
    for (int i = 0; i < 4; i++) cr_assert_neq(x[i], h[i]);
}

Test(host_cache, write_policy_names)
{
    kvp_hc_write_policy p = KVP_HC_WRITE_THROUGH;
    cr_assert_eq(kvp_hc_write_policy_parse("write_back", &p), KVP_OK);
    cr_assert_eq(p, KVP_HC_WRITE_BACK);
    cr_assert_str_eq(kvp_hc_write_policy_name(p), "write_back");
    cr_assert_eq(kvp_hc_write_policy_parse("write_through", &p), KVP_OK);
    cr_assert_eq(p, KVP_HC_WRITE_THROUGH);
    cr_assert_eq(kvp_hc_write_policy_parse("write_through_selective", &p), KVP_OK);
    cr_assert_eq(p, KVP_HC_WRITE_THROUGH_SELECTIVE);
    cr_assert_str_eq(kvp_hc_write_policy_name(p), "write_through_selective");
    cr_assert_eq(kvp_hc_write_policy_parse("write_around", &p), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "write_around") != NULL, "the error names the value");
    cr_assert_eq(kvp_hc_write_policy_parse(NULL, &p), KVP_EINVAL);
    cr_assert_eq(p, KVP_HC_WRITE_THROUGH_SELECTIVE, "a failed parse leaves the value");
    cr_assert_str_eq(kvp_hc_write_policy_name(KVP_HC_WRITE_POLICIES), "?");
}

/* What a caching of a sequence's full blocks offers the tier under each policy. */
Test(host_cache, blocks_to_store_per_policy)
{
    for (int32_t n_full = 0; n_full <= 5; n_full++)
        for (int32_t n_hit = 0; n_hit <= 7; n_hit++) {
            cr_assert_eq(kvp_hc_blocks_to_store(KVP_HC_WRITE_THROUGH, n_full, n_hit), n_full);
            cr_assert_eq(kvp_hc_blocks_to_store(KVP_HC_WRITE_BACK, n_full, n_hit), 0);
            cr_assert_eq(kvp_hc_blocks_to_store(KVP_HC_WRITE_THROUGH_SELECTIVE, n_full, n_hit),
                         n_hit < n_full ? n_hit : n_full, "the reused blocks only, never past the cached ones");
        }
}
