/* Tests of prefix_cache/: radix and hash against a brute-force model (the set of cached block prefixes, as
 * chain hashes) over random workloads with the invariant walker after every operation, node splits,
 * lock/unlock, each eviction policy's order on a hand-made case, allocation failures, belady next uses. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/block_pool.h"
#include "common/alloc.h"
#include "prefix_cache/prefix_cache.h"

/* ---- snapshots through kvp_pc_visit ---------------------------------------------------------------- */

typedef struct {
    uint64_t hash;
    int32_t depth, block, locks;
} snap_item;

typedef struct {
    snap_item *v;
    int64_t n, cap;
} snap;

static void snap_fn(void *ctx, uint64_t h, int32_t depth, int32_t block, int32_t locks, const int32_t *toks)
{
    (void)toks;
    snap *s = ctx;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
        cr_assert(s->v);
    }
    s->v[s->n++] = (snap_item){h, depth, block, locks};
}

static int snap_cmp(const void *a, const void *b)
{
    const snap_item *x = a, *y = b;
    return x->hash < y->hash ? -1 : x->hash > y->hash ? 1 : 0;
}

static snap take_snap(const kvp_prefix_cache *pc)
{
    snap s = {0};
    cr_assert_eq(kvp_pc_visit(pc, snap_fn, &s), KVP_OK);
    if (s.n) qsort(s.v, (size_t)s.n, sizeof *s.v, snap_cmp);
    return s;
}

static const snap_item *snap_find(const snap *s, uint64_t h)
{
    snap_item key = {h, 0, 0, 0};
    return s->n ? bsearch(&key, s->v, (size_t)s->n, sizeof key, snap_cmp) : NULL;
}

static int snap_equal(const snap *a, const snap *b)
{
    return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v) == 0);
}

static void chain(const int32_t *t, int32_t nb, int32_t bs, uint64_t *h)
{
    uint64_t p = 0;
    for (int32_t i = 0; i < nb; i++) p = h[i] = kvp_pc_block_hash(p, t + (size_t)i * bs, bs, 0);
}

static void check_all(const kvp_prefix_cache *pc, const kvp_block_pool *pool, const int32_t *req_refs, int32_t nblocks,
                      uint64_t seed)
{
    cr_assert_eq(kvp_pc_check(pc), KVP_OK, "seed %llu: walker: %s", (unsigned long long)seed, kvp_error_detail());
    cr_assert_eq(kvp_pool_check(pool), KVP_OK, "seed %llu: pool: %s", (unsigned long long)seed, kvp_error_detail());
    if (req_refs == NULL) return;
    snap s = take_snap(pc);
    int32_t *cached = calloc((size_t)nblocks, sizeof *cached);
    for (int64_t i = 0; i < s.n; i++) cached[s.v[i].block]++;
    for (int32_t b = 0; b < nblocks; b++) {
        cr_assert_leq(cached[b], 1, "seed %llu: block %d cached twice", (unsigned long long)seed, b);
        cr_assert_eq(kvp_pool_refcount(pool, b), cached[b] + req_refs[b], "seed %llu: block %d refcount %d, cache %d + requests %d",
                     (unsigned long long)seed, b, kvp_pool_refcount(pool, b), cached[b], req_refs[b]);
    }
    free(cached);
    free(s.v);
}

/* ---- the randomized model test ------------------------------------------------------------------- */

typedef struct {
    int32_t *hit, nh;      /* match lock */
    int32_t *cached, nc;   /* insert lock */
    int32_t *own, nown;    /* the request's own references */
} active_req;

static uint64_t rng(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void finish(kvp_prefix_cache *pc, kvp_block_pool *pool, active_req *r, int32_t *req_refs)
{
    cr_assert_eq(kvp_pc_unlock(pc, r->hit, r->nh), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_pc_unlock(pc, r->cached, r->nc), KVP_OK, "%s", kvp_error_detail());
    for (int32_t i = 0; i < r->nown; i++) {
        cr_assert_eq(kvp_pool_decref(pool, r->own[i]), KVP_OK);
        req_refs[r->own[i]]--;
    }
    free(r->hit);
    free(r->cached);
    free(r->own);
    memset(r, 0, sizeof *r);
}

/* The eviction hook's record: what kvp_pc_evict reported. */
typedef struct {
    uint64_t hash[64];
    int32_t block[64], n;
} evicted_log;

static void log_evicted(void *ctx, uint64_t hash, int32_t block)
{
    evicted_log *l = ctx;
    cr_assert_lt(l->n, 64);
    l->hash[l->n] = hash;
    l->block[l->n++] = block;
}

/* Runs `steps` random requests; returns total hit tokens. hits_out[i] (may be NULL) = hit blocks of request i. */
static int64_t run_random(kvp_pc_kind kind, kvp_evict_policy pol, int32_t pool_blocks, uint64_t seed, int steps,
                          int32_t *hits_out)
{
    const int32_t bs = 4;
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    cr_assert_eq(kvp_pool_create(pool_blocks, bs, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(kind, pol, pool, bs, &pc), KVP_OK);
    evicted_log elog;
    kvp_pc_set_evict_hook(pc, log_evicted, &elog);
    int32_t *req_refs = calloc((size_t)pool_blocks, sizeof *req_refs);
    int32_t base[6][48];
    uint64_t s = seed;
    for (int b = 0; b < 6; b++)
        for (int j = 0; j < 48; j++) base[b][j] = (int32_t)(rng(&s) % 3);
    active_req act[3] = {{0}};
    int64_t total_hit = 0;
    for (int step = 0; step < steps; step++) {
        /* prompt: a prefix of a base text, then a short random tail */
        int32_t tok[64], n = 0, b = (int32_t)(rng(&s) % 6), L = (int32_t)(rng(&s) % 49), tail = (int32_t)(rng(&s) % 12);
        for (int32_t j = 0; j < L; j++) tok[n++] = base[b][j];
        for (int32_t j = 0; j < tail && n < 64; j++) tok[n++] = (int32_t)(rng(&s) % 3);
        if (n == 0) tok[n++] = 1;
        int32_t nb = n / bs;
        int64_t next_use[16];
        for (int32_t i = 0; i < 16; i++) next_use[i] = step + 1 + (int64_t)(rng(&s) % 50);
        kvp_pc_hint hint = {.priority = (int32_t)(rng(&s) % 3), .next_use = next_use};

        /* finish a random running request first (keeps up to 3 running) */
        int slot = (int)(rng(&s) % 3);
        if (act[slot].hit || act[slot].cached || act[slot].own) finish(pc, pool, &act[slot], req_refs);
        check_all(pc, pool, req_refs, pool_blocks, seed);

        /* expected hit from the model */
        snap before = take_snap(pc);
        uint64_t h[16];
        chain(tok, nb, bs, h);
        int32_t want = 0, maxb = (n - 1) / bs;
        while (want < maxb && snap_find(&before, h[want])) want++;

        active_req *r = &act[slot];
        r->hit = calloc(16, sizeof(int32_t));
        r->cached = calloc(16, sizeof(int32_t));
        r->own = calloc(16, sizeof(int32_t));
        int32_t nh = -1;
        cr_assert_eq(kvp_pc_match(pc, tok, n, &hint, 1, r->hit, 16, &nh), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(nh, want, "seed %llu step %d: hit %d blocks, model says %d", (unsigned long long)seed, step, nh, want);
        for (int32_t i = 0; i < nh; i++) cr_assert_eq(r->hit[i], snap_find(&before, h[i])->block);
        r->nh = nh;
        if (hits_out) hits_out[step] = nh;
        total_hit += (int64_t)nh * bs;
        for (int32_t i = 0; i < nh; i++) {
            cr_assert_eq(kvp_pool_incref(pool, r->hit[i]), KVP_OK);
            req_refs[r->hit[i]]++;
            r->own[r->nown++] = r->hit[i];
        }
        check_all(pc, pool, req_refs, pool_blocks, seed);

        /* make room: evict what is missing, as far as possible */
        int32_t need = nb - nh, fr = kvp_pool_num_free(pool);
        if (fr < need) {
            int32_t ev = need - fr;
            if (ev > kvp_pc_num_evictable(pc)) {
                cr_assert_eq(kvp_pc_evict(pc, (int32_t)kvp_pc_num_evictable(pc) + 1, NULL), KVP_ENOBLOCKS);
                ev = (int32_t)kvp_pc_num_evictable(pc);
            }
            snap s0 = take_snap(pc);
            int32_t freed = -1;
            elog.n = 0;
            cr_assert_eq(kvp_pc_evict(pc, ev, &freed), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(freed, ev, "unreferenced cached blocks go back to the pool");
            snap s1 = take_snap(pc);
            cr_assert_eq(s1.n, s0.n - ev);
            /* the hook named exactly the blocks that left, each with its chain hash (visit's, from tokens) */
            cr_assert_eq(elog.n, ev, "the hook reported %d evictions of %d", elog.n, ev);
            for (int32_t i = 0; i < elog.n; i++) {
                const snap_item *o = snap_find(&s0, elog.hash[i]);
                cr_assert(o && o->block == elog.block[i] && !snap_find(&s1, elog.hash[i]),
                          "seed %llu: eviction %d reported block %d under a hash that did not leave with it",
                          (unsigned long long)seed, i, elog.block[i]);
                for (int32_t j = 0; j < i; j++) cr_assert_neq(elog.block[j], elog.block[i], "a block reported twice");
            }
            for (int64_t i = 0; i < s1.n; i++) {
                const snap_item *o = snap_find(&s0, s1.v[i].hash);
                cr_assert(o && o->block == s1.v[i].block, "eviction changed a surviving entry");
            }
            for (int64_t i = 0; i < s0.n; i++)
                if (!snap_find(&s1, s0.v[i].hash)) cr_assert_eq(s0.v[i].locks, 0, "a locked block was evicted");
            free(s0.v);
            free(s1.v);
            check_all(pc, pool, req_refs, pool_blocks, seed);
        }
        fr = kvp_pool_num_free(pool);
        int32_t k = need < fr ? need : fr;
        int32_t blocks[16];
        memcpy(blocks, r->hit, (size_t)nh * sizeof *blocks);
        cr_assert_eq(kvp_pool_alloc(pool, k, blocks + nh), KVP_OK);
        for (int32_t i = 0; i < k; i++) {
            req_refs[blocks[nh + i]]++;
            r->own[r->nown++] = blocks[nh + i];
        }
        snap s0 = take_snap(pc);
        cr_assert_eq(kvp_pc_insert(pc, tok, n, blocks, nh + k, &hint, 1, r->cached), KVP_OK, "%s", kvp_error_detail());
        r->nc = nh + k;
        snap s1 = take_snap(pc);
        for (int32_t i = 0; i < nh + k; i++) {
            const snap_item *o = snap_find(&s0, h[i]), *x = snap_find(&s1, h[i]);
            cr_assert(x != NULL, "seed %llu step %d: block %d not cached after insert", (unsigned long long)seed, step, i);
            cr_assert_eq(x->block, o ? o->block : blocks[i], "insert must keep an existing block, else take the caller's");
            cr_assert_eq(r->cached[i], x->block);
        }
        for (int64_t i = 0; i < s0.n; i++) cr_assert(snap_find(&s1, s0.v[i].hash), "insert dropped an entry");
        int64_t added = 0;
        for (int64_t i = 0; i < s1.n; i++)
            if (!snap_find(&s0, s1.v[i].hash)) added++;
        cr_assert_eq(s1.n, s0.n + added);
        free(s0.v);
        free(s1.v);
        free(before.v);
        check_all(pc, pool, req_refs, pool_blocks, seed);
    }
    for (int i = 0; i < 3; i++)
        if (act[i].hit || act[i].cached || act[i].own) finish(pc, pool, &act[i], req_refs);
    check_all(pc, pool, req_refs, pool_blocks, seed);
    cr_assert_eq(kvp_pc_num_evictable(pc), kvp_pc_num_cached(pc), "nothing is locked at the end");
    kvp_pc_stats st;
    kvp_pc_get_stats(pc, &st);
    cr_assert_eq(st.hit_tokens, total_hit);
    cr_assert_eq(st.lookups, steps);
    /* a flush drops every block (radix: leaves, then the parents they leave as leaves) without the hook */
    elog.n = 0;
    int64_t flushed = -1;
    kvp_pc_flush(pc, &flushed);
    cr_assert_eq(flushed, st.cached_blocks);
    cr_assert_eq(elog.n, 0, "a flush is no eviction to write back");
    cr_assert_eq(kvp_pc_num_cached(pc), 0);
    cr_assert_eq(kvp_pool_num_free(pool), pool_blocks, "evicting everything returns every block");
    kvp_pc_destroy(pc);
    kvp_pool_destroy(pool);
    free(req_refs);
    return total_hit;
}

Test(prefix_cache, radix_and_hash_match_the_model_bounded)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++)
        for (int pol = KVP_EVICT_LRU; pol <= KVP_EVICT_BELADY; pol++)
            for (uint64_t seed = 1; seed <= 2; seed++) run_random((kvp_pc_kind)kind, (kvp_evict_policy)pol, 40, seed * 7 + (uint64_t)pol, 300, NULL);
}

Test(prefix_cache, radix_and_hash_agree_unbounded)
{
    for (uint64_t seed = 11; seed <= 15; seed++) {
        int32_t hr[400], hh[400];
        int64_t a = run_random(KVP_PC_RADIX, KVP_EVICT_LRU, 4000, seed, 400, hr);
        int64_t b = run_random(KVP_PC_HASH, KVP_EVICT_LRU, 4000, seed, 400, hh);
        cr_assert_eq(a, b, "seed %llu", (unsigned long long)seed);
        cr_assert_gt(a, 0, "the workload must share prefixes");
        for (int i = 0; i < 400; i++) cr_assert_eq(hr[i], hh[i], "seed %llu request %d", (unsigned long long)seed, i);
    }
}

/* ---- hand-made cases ------------------------------------------------------------------------------ */

typedef struct {
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
} fixture;

static fixture mk(kvp_pc_kind kind, kvp_evict_policy pol, int32_t nblocks, int32_t bs)
{
    fixture f;
    cr_assert_eq(kvp_pool_create(nblocks, bs, &f.pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(kind, pol, f.pool, bs, &f.pc), KVP_OK);
    return f;
}

static void rm(fixture *f)
{
    cr_assert_eq(kvp_pc_check(f->pc), KVP_OK, "%s", kvp_error_detail());
    kvp_pc_destroy(f->pc);
    cr_assert_eq(kvp_pool_num_free(f->pool), kvp_pool_num_blocks(f->pool), "destroy drops every cache reference");
    kvp_pool_destroy(f->pool);
}

/* Caches the first nb full blocks of tokens with fresh blocks (request refs dropped at once). */
static void put(fixture *f, const int32_t *tokens, int32_t n, int32_t nb, const kvp_pc_hint *hint, int32_t *ids)
{
    int32_t hit[64], nh = 0;
    cr_assert_eq(kvp_pc_match(f->pc, tokens, n, hint, 0, hit, 64, &nh), KVP_OK);
    int32_t blocks[64];
    memcpy(blocks, hit, (size_t)nh * sizeof *blocks);
    cr_assert_eq(kvp_pool_alloc(f->pool, nb - nh, blocks + nh), KVP_OK);
    cr_assert_eq(kvp_pc_insert(f->pc, tokens, n, blocks, nb, hint, 0, NULL), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_pool_release(f->pool, blocks + nh, nb - nh), KVP_OK);
    if (ids) memcpy(ids, blocks, (size_t)nb * sizeof *ids);
    cr_assert_eq(kvp_pc_check(f->pc), KVP_OK, "%s", kvp_error_detail());
}

static int32_t hits(fixture *f, const int32_t *tokens, int32_t n, const kvp_pc_hint *hint)
{
    int32_t hit[64], nh = -1;
    cr_assert_eq(kvp_pc_match(f->pc, tokens, n, hint, 0, hit, 64, &nh), KVP_OK);
    cr_assert_eq(kvp_pc_check(f->pc), KVP_OK, "%s", kvp_error_detail());
    return nh;
}

static int32_t evict1(fixture *f)
{
    snap a = take_snap(f->pc);
    int32_t freed = 0;
    cr_assert_eq(kvp_pc_evict(f->pc, 1, &freed), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(freed, 1);
    snap b = take_snap(f->pc);
    cr_assert_eq(b.n, a.n - 1);
    int32_t gone = -1;
    for (int64_t i = 0; i < a.n; i++)
        if (!snap_find(&b, a.v[i].hash)) gone = a.v[i].block;
    free(a.v);
    free(b.v);
    cr_assert_eq(kvp_pc_check(f->pc), KVP_OK, "%s", kvp_error_detail());
    return gone;
}

/* Evicts one block at a time: the victims must be order[0..n), in that order. */
static void victims(fixture *f, const int32_t *order, int n)
{
    for (int i = 0; i < n; i++) {
        const int32_t got = evict1(f);
        cr_assert_eq(got, order[i], "victim %d is block %d, block %d expected", i, got, order[i]);
    }
}
#define VICTIMS(f, ...) victims((f), (const int32_t[]){__VA_ARGS__}, (int)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))

Test(prefix_cache, radix_node_splits)
{
    fixture f = mk(KVP_PC_RADIX, KVP_EVICT_LRU, 32, 2);
    int32_t abcd[] = {1, 1, 2, 2, 3, 3, 4, 4, 9}; /* blocks A B C D + one token */
    int32_t ids[4];
    put(&f, abcd, 9, 4, NULL, ids);
    kvp_pc_stats st;
    kvp_pc_get_stats(f.pc, &st);
    cr_assert_eq(st.nodes, 1);
    /* a match diverging inside the edge splits it after B */
    int32_t abx[] = {1, 1, 2, 2, 7, 7, 9};
    cr_assert_eq(hits(&f, abx, 7, NULL), 2);
    kvp_pc_get_stats(f.pc, &st);
    cr_assert_eq(st.nodes, 2);
    /* an insert diverging at the new boundary adds a sibling of [C D] */
    int32_t abe[] = {1, 1, 2, 2, 5, 5, 9}, ids_e[3];
    put(&f, abe, 7, 3, NULL, ids_e);
    kvp_pc_get_stats(f.pc, &st);
    cr_assert_eq(st.nodes, 3);
    cr_assert_eq(st.cached_blocks, 5);
    /* the last-token rule ends a match inside [C D]: split after C */
    cr_assert_eq(hits(&f, abcd, 8, NULL), 3, "8 tokens = 4 blocks but the last token is never covered");
    kvp_pc_get_stats(f.pc, &st);
    cr_assert_eq(st.nodes, 4);
    cr_assert_eq(hits(&f, abcd, 9, NULL), 4);
    /* an insert ending inside an edge splits too and adds nothing */
    int32_t a_only[] = {1, 1, 2};
    int32_t blk = ids[0];
    cr_assert_eq(kvp_pc_insert(f.pc, a_only, 3, &blk, 1, NULL, 0, NULL), KVP_OK);
    kvp_pc_get_stats(f.pc, &st);
    cr_assert_eq(st.nodes, 5);
    cr_assert_eq(st.cached_blocks, 5);
    /* a split inside a different first block does not confuse siblings */
    int32_t zz[] = {8, 8, 8, 8, 1};
    cr_assert_eq(hits(&f, zz, 5, NULL), 0);
    /* leaves are [D] (just used) and [E] (older): E goes first, then D; [B] has a child until then */
    cr_assert_eq(hits(&f, abcd, 9, NULL), 4);
    cr_assert_eq(evict1(&f), ids_e[2], "the least recently used leaf goes first");
    cr_assert_eq(evict1(&f), ids[3]);
    cr_assert_eq(hits(&f, abcd, 9, NULL), 3);
    cr_assert_eq(hits(&f, abe, 7, NULL), 2);
    rm(&f);
}

Test(prefix_cache, extra_key_separates)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 16, 2);
        int32_t t[] = {1, 2, 3, 4, 5};
        kvp_pc_hint k1 = {.extra_key = 1}, k2 = {.extra_key = 2};
        put(&f, t, 5, 2, &k1, NULL);
        cr_assert_eq(hits(&f, t, 5, &k1), 2);
        cr_assert_eq(hits(&f, t, 5, &k2), 0);
        cr_assert_eq(hits(&f, t, 5, NULL), 0);
        rm(&f);
    }
}

Test(prefix_cache, locks_prevent_eviction)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 16, 2);
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_ENOBLOCKS, "an empty cache has nothing to evict");
        int32_t t[] = {1, 1, 2, 2, 3, 3, 4};
        int32_t u[] = {1, 1, 5, 5, 6};
        put(&f, t, 7, 3, NULL, NULL);
        put(&f, u, 5, 2, NULL, NULL);
        cr_assert_eq(kvp_pc_num_cached(f.pc), 4);
        int32_t hit[8], nh;
        cr_assert_eq(kvp_pc_match(f.pc, t, 7, NULL, 1, hit, 8, &nh), KVP_OK);
        cr_assert_eq(nh, 3);
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 1, "only [5 5] is not on the locked path");
        snap a = take_snap(f.pc);
        cr_assert_eq(kvp_pc_evict(f.pc, 2, NULL), KVP_ENOBLOCKS);
        snap b = take_snap(f.pc);
        cr_assert(snap_equal(&a, &b), "a failed eviction changes nothing");
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_OK);
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_ENOBLOCKS);
        cr_assert_eq(kvp_pc_check(f.pc), KVP_OK, "%s", kvp_error_detail());
        /* a second lock on a prefix of the path */
        int32_t hit2[8], nh2;
        cr_assert_eq(kvp_pc_match(f.pc, t, 3, NULL, 1, hit2, 8, &nh2), KVP_OK);
        cr_assert_eq(nh2, 1);
        cr_assert_eq(kvp_pc_unlock(f.pc, hit, nh), KVP_OK);
        cr_assert_eq(kvp_pc_check(f.pc), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 2, "[1 1] is still locked by the second match");
        cr_assert_eq(kvp_pc_unlock(f.pc, hit, nh), KVP_ESTATE, "a second unlock of the same path is refused");
        cr_assert_eq(kvp_pc_evict(f.pc, 2, NULL), KVP_OK);
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_ENOBLOCKS);
        cr_assert_eq(kvp_pc_unlock(f.pc, hit2, nh2), KVP_OK);
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_OK);
        cr_assert_eq(kvp_pc_num_cached(f.pc), 0);
        int32_t bogus = 3;
        cr_assert_eq(kvp_pc_unlock(f.pc, &bogus, 1), KVP_ESTATE);
        /* a block listed twice under one lock is refused and changes nothing */
        int32_t t1[] = {1, 1, 0}, one[2], none;
        put(&f, t1, 3, 1, NULL, NULL);
        cr_assert_eq(kvp_pc_match(f.pc, t1, 3, NULL, 1, one, 1, &none), KVP_OK);
        cr_assert_eq(none, 1);
        one[1] = one[0];
        cr_assert_eq(kvp_pc_unlock(f.pc, one, 2), KVP_ESTATE);
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 0);
        cr_assert_eq(kvp_pc_check(f.pc), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_pc_unlock(f.pc, one, 1), KVP_OK);
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 1);
        rm(&f);
    }
}

Test(prefix_cache, duplicate_insert_keeps_the_cached_block)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 8, 2);
        int32_t t[] = {1, 1, 2, 2, 3}, a[2], b[2], out[2];
        cr_assert_eq(kvp_pool_alloc(f.pool, 2, a), KVP_OK);
        cr_assert_eq(kvp_pool_alloc(f.pool, 2, b), KVP_OK);
        cr_assert_eq(kvp_pc_insert(f.pc, t, 5, a, 2, NULL, 0, NULL), KVP_OK);
        /* a second request computed the same prefix into its own blocks */
        cr_assert_eq(kvp_pc_insert(f.pc, t, 5, b, 2, NULL, 1, out), KVP_OK);
        cr_assert_eq(out[0], a[0]);
        cr_assert_eq(out[1], a[1]);
        cr_assert_eq(kvp_pool_refcount(f.pool, b[0]), 1, "the duplicate is not referenced by the cache");
        cr_assert_eq(kvp_pool_refcount(f.pool, a[0]), 2);
        cr_assert_eq(kvp_pc_num_cached(f.pc), 2);
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 0, "the insert locked the path");
        cr_assert_eq(kvp_pc_unlock(f.pc, out, 2), KVP_OK);
        cr_assert_eq(kvp_pool_release(f.pool, a, 2), KVP_OK);
        cr_assert_eq(kvp_pool_release(f.pool, b, 2), KVP_OK);
        rm(&f);
    }
}

Test(prefix_cache, request_reference_outlives_eviction)
{
    fixture f = mk(KVP_PC_HASH, KVP_EVICT_LRU, 8, 2);
    int32_t t[] = {1, 2, 3};
    int32_t b;
    cr_assert_eq(kvp_pool_alloc(f.pool, 1, &b), KVP_OK);
    cr_assert_eq(kvp_pc_insert(f.pc, t, 3, &b, 1, NULL, 0, NULL), KVP_OK);
    cr_assert_eq(kvp_pool_refcount(f.pool, b), 2);
    int32_t freed = -1;
    cr_assert_eq(kvp_pc_evict(f.pc, 1, &freed), KVP_OK);
    cr_assert_eq(freed, 0, "the request still holds the block");
    cr_assert_eq(kvp_pool_refcount(f.pool, b), 1);
    cr_assert_eq(kvp_pool_decref(f.pool, b), KVP_OK);
    rm(&f);
}

/* A pool of 4 blocks: two cached blocks a request still holds and one held by the cache alone. Evicting
 * until 2 blocks are free must go on past the held ones (they free nothing) and stop once the pool has 2
 * free blocks, or when nothing is left to evict. */
Test(prefix_cache, evict_until_free_counts_freed_blocks_not_evicted_ones)
{
    for (int kind = 0; kind < 2; kind++) {
        fixture f = mk(kind ? KVP_PC_HASH : KVP_PC_RADIX, KVP_EVICT_LRU, 4, 2);
        int32_t held[2], t[] = {1, 2, 3, 4, 5}, u[] = {7, 8, 9};
        cr_assert_eq(kvp_pool_alloc(f.pool, 2, held), KVP_OK);
        cr_assert_eq(kvp_pc_insert(f.pc, t, 5, held, 2, NULL, 0, NULL), KVP_OK); /* held: refcount 2 */
        put(&f, u, 3, 1, NULL, NULL);                                          /* the cache's only */
        cr_assert_eq(kvp_pool_num_free(f.pool), 1);
        cr_assert_eq(kvp_pc_num_evictable(f.pc), 3);
        cr_assert_eq(kvp_pc_evict_until_free(f.pc, 2), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_pool_num_free(f.pool), 2);
        cr_assert_eq(kvp_pc_evict_until_free(f.pc, 4), KVP_OK, "nothing evictable is not an error");
        cr_assert_eq(kvp_pc_num_cached(f.pc), 0);
        cr_assert_eq(kvp_pool_num_free(f.pool), 2, "the request's blocks stay with the request");
        cr_assert_eq(kvp_pool_release(f.pool, held, 2), KVP_OK);
        rm(&f);
    }
}

/* Three one-block prompts A, B, C (ids a, b, c) inserted in that order. */
static void abc(fixture *f, const kvp_pc_hint *ha, const kvp_pc_hint *hb, const kvp_pc_hint *hc, int32_t ids[3],
                int32_t t[3][3])
{
    put(f, t[0], 3, 1, ha, &ids[0]);
    put(f, t[1], 3, 1, hb, &ids[1]);
    put(f, t[2], 3, 1, hc, &ids[2]);
}

Test(prefix_cache, policy_orders)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        int32_t t[3][3] = {{1, 1, 0}, {2, 2, 0}, {3, 3, 0}}, id[3];
        { /* lru: A touched last */
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 8, 2);
            abc(&f, NULL, NULL, NULL, id, t);
            cr_assert_eq(hits(&f, t[0], 3, NULL), 1);
            VICTIMS(&f, id[1], id[2], id[0]);
            rm(&f);
        }
        { /* lfu: A 3 accesses, C 2, B 1 */
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LFU, 8, 2);
            abc(&f, NULL, NULL, NULL, id, t);
            hits(&f, t[0], 3, NULL);
            hits(&f, t[0], 3, NULL);
            hits(&f, t[2], 3, NULL);
            VICTIMS(&f, id[1], id[2], id[0]);
            rm(&f);
        }
        { /* fifo: access does not matter */
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_FIFO, 8, 2);
            abc(&f, NULL, NULL, NULL, id, t);
            hits(&f, t[0], 3, NULL);
            VICTIMS(&f, id[0], id[1], id[2]);
            rm(&f);
        }
        { /* priority: A pinned at 5 (sticky after a priority-0 access), C 1, B 0 and most recent */
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_PRIORITY, 8, 2);
            kvp_pc_hint p5 = {.priority = 5}, p1 = {.priority = 1};
            abc(&f, &p5, NULL, &p1, id, t);
            hits(&f, t[0], 3, NULL);
            hits(&f, t[1], 3, NULL);
            VICTIMS(&f, id[1], id[2], id[0]);
            rm(&f);
        }
        { /* belady: next uses A 10, B 3, C never */
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_BELADY, 8, 2);
            int64_t na = 10, nb = 3, nc = KVP_PC_NEVER;
            kvp_pc_hint ha = {.next_use = &na}, hb = {.next_use = &nb}, hc = {.next_use = &nc};
            abc(&f, &ha, &hb, &hc, id, t);
            int32_t hit[2], nh;
            cr_assert_eq(kvp_pc_match(f.pc, t[0], 3, NULL, 0, hit, 2, &nh), KVP_EINVAL, "belady needs next uses");
            VICTIMS(&f, id[2], id[0], id[1]);
            rm(&f);
        }
    }
}

/* A flush leaves locked blocks, and the hook set before it still reports later evictions. */
Test(prefix_cache, flush_keeps_locked_blocks_and_the_hook)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 16, 2);
        evicted_log elog = {.n = 0};
        kvp_pc_set_evict_hook(f.pc, log_evicted, &elog);
        int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, held[3], nh = 0;
        put(&f, a, 6, 3, NULL, NULL);
        put(&f, b, 6, 3, NULL, NULL);
        cr_assert_eq(kvp_pc_match(f.pc, a, 6, NULL, 1, held, 3, &nh), KVP_OK);
        cr_assert_eq(nh, 2, "a's first two blocks (never the last token's)");
        int64_t n = -1;
        kvp_pc_flush(f.pc, &n);
        cr_assert_eq(n, 4, "b's three blocks and a's unlocked third");
        cr_assert_eq(kvp_pc_num_cached(f.pc), 2);
        cr_assert_eq(elog.n, 0);
        cr_assert_eq(kvp_pc_unlock(f.pc, held, nh), KVP_OK);
        cr_assert_eq(kvp_pc_evict(f.pc, 1, NULL), KVP_OK);
        cr_assert_eq(elog.n, 1, "the hook is back after the flush");
        rm(&f);
    }
}

Test(prefix_cache, chain_evicts_tail_first)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_LRU, 8, 2);
        int32_t t[] = {1, 1, 2, 2, 3, 3, 0}, id[3];
        put(&f, t, 7, 3, NULL, id);
        cr_assert_eq(evict1(&f), id[2]);
        cr_assert_eq(hits(&f, t, 7, NULL), 2);
        VICTIMS(&f, id[1], id[0]);
        rm(&f);
    }
}

Test(prefix_cache, none_caches_nothing)
{
    fixture f = mk(KVP_PC_NONE, KVP_EVICT_LRU, 8, 2);
    int32_t t[] = {1, 1, 2, 2, 3}, b[2];
    cr_assert_eq(kvp_pool_alloc(f.pool, 2, b), KVP_OK);
    cr_assert_eq(kvp_pc_insert(f.pc, t, 5, b, 2, NULL, 0, NULL), KVP_OK);
    cr_assert_eq(hits(&f, t, 5, NULL), 0);
    cr_assert_eq(kvp_pc_num_cached(f.pc), 0);
    cr_assert_eq(kvp_pool_refcount(f.pool, b[0]), 1);
    cr_assert_eq(kvp_pool_release(f.pool, b, 2), KVP_OK);
    rm(&f);
}

Test(prefix_cache, bad_arguments)
{
    kvp_block_pool *pool;
    kvp_prefix_cache *pc = NULL;
    cr_assert_eq(kvp_pool_create(8, 4, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(KVP_PC_RADIX, KVP_EVICT_LRU, pool, 8, &pc), KVP_EINVAL, "block size must match the pool");
    cr_assert_eq(kvp_pc_create((kvp_pc_kind)9, KVP_EVICT_LRU, pool, 4, &pc), KVP_EINVAL);
    cr_assert_null(pc);
    kvp_pc_kind k;
    kvp_evict_policy p;
    cr_assert_eq(kvp_pc_kind_parse("radix", &k), KVP_OK);
    cr_assert_eq(k, KVP_PC_RADIX);
    cr_assert_eq(kvp_pc_kind_parse("trie", &k), KVP_EINVAL);
    cr_assert_eq(kvp_evict_policy_parse("belady", &p), KVP_OK);
    cr_assert_eq(p, KVP_EVICT_BELADY);
    cr_assert_eq(kvp_evict_policy_parse("random", &p), KVP_EINVAL);
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        cr_assert_eq(kvp_pc_create((kvp_pc_kind)kind, KVP_EVICT_LRU, pool, 4, &pc), KVP_OK);
        int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[2];
        cr_assert_eq(kvp_pool_alloc(pool, 2, b), KVP_OK);
        int32_t free_blk = 7, out_of_pool = 8, dup[2] = {b[0], b[0]};
        cr_assert_eq(kvp_pc_insert(pc, t, 9, b, 3, NULL, 0, NULL), KVP_EINVAL, "3 blocks > 2 full blocks");
        cr_assert_eq(kvp_pc_insert(pc, t, 9, &free_blk, 1, NULL, 0, NULL), KVP_EINVAL, "a free block");
        cr_assert_eq(kvp_pc_insert(pc, t, 9, &out_of_pool, 1, NULL, 0, NULL), KVP_EINVAL);
        cr_assert_eq(kvp_pc_insert(pc, t, 9, dup, 2, NULL, 0, NULL), KVP_EINVAL, "a block used twice");
        cr_assert_eq(kvp_pc_insert(pc, t, 9, b, 2, NULL, 1, NULL), KVP_EINVAL, "lock without cached_out");
        cr_assert_eq(kvp_pc_num_cached(pc), 0);
        cr_assert_eq(kvp_pc_check(pc), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_pc_insert(pc, t, 9, b, 2, NULL, 0, NULL), KVP_OK);
        int32_t other[] = {9, 9, 9, 9, 9};
        cr_assert_eq(kvp_pc_insert(pc, other, 5, b, 1, NULL, 0, NULL), KVP_EINVAL, "block already cached elsewhere");
        int32_t nh;
        cr_assert_eq(kvp_pc_match(pc, t, -1, NULL, 0, b, 2, &nh), KVP_EINVAL);
        cr_assert_eq(kvp_pc_match(pc, NULL, 3, NULL, 0, b, 2, &nh), KVP_EINVAL);
        cr_assert_eq(kvp_pc_evict(pc, -1, NULL), KVP_EINVAL);
        cr_assert_eq(kvp_pc_check(pc), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_pool_release(pool, b, 2), KVP_OK);
        kvp_pc_destroy(pc);
        cr_assert_eq(kvp_pool_num_free(pool), 8);
    }
    kvp_pool_destroy(pool);
}

/* ---- allocation failures --------------------------------------------------------------------------- */

typedef struct {
    snap s;
    kvp_pc_stats st;
    int32_t free;
} state;

static state grab(const fixture *f)
{
    state s;
    s.s = take_snap(f->pc);
    kvp_pc_get_stats(f->pc, &s.st);
    s.free = kvp_pool_num_free(f->pool);
    return s;
}

static void same(const state *a, const state *b, int64_t n)
{
    cr_assert(snap_equal(&a->s, &b->s), "failure %lld changed the cache", (long long)n);
    cr_assert_eq(memcmp(&a->st, &b->st, sizeof a->st), 0, "failure %lld changed the stats", (long long)n);
    cr_assert_eq(a->free, b->free, "failure %lld changed the pool", (long long)n);
}

/* After an operation run with kvp_alloc_fail_at(n): 1 when it failed, which must be KVP_ENOMEM with the cache, its
 * stats and the pool left as `before`; 0 when it succeeded. */
static int failed_unchanged(const fixture *f, kvp_status st, const state *before, int64_t n)
{
    if (st == KVP_OK) return 0;
    cr_assert_eq(st, KVP_ENOMEM, "%s", kvp_error_detail());
    state after = grab(f);
    same(before, &after, n);
    free(after.s.v);
    return 1;
}

Test(prefix_cache, allocation_failures_change_nothing)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++)
        for (int op = 0; op < 3; op++) {
            int64_t failures = 0;
            for (int64_t n = 1;; n++) {
                fixture f = mk((kvp_pc_kind)kind, op == 2 ? KVP_EVICT_BELADY : KVP_EVICT_LRU, 64, 2);
                int64_t nu[8] = {1, 2, 3, 4, 5, 6, 7, 8};
                kvp_pc_hint hint = {.next_use = nu};
                int32_t t[] = {1, 1, 2, 2, 3, 3, 4, 4, 0};
                /* radix: a populated tree (the match splits, the insert splits and adds a node);
                 * hash: an empty cache, so that the insert's first allocations happen here */
                if (kind == KVP_PC_RADIX) put(&f, t, 9, 4, &hint, NULL);
                for (int32_t i = 0; kind == KVP_PC_RADIX && i < 20; i++) { /* many nodes so that arrays grow */
                    int32_t u[] = {50 + i, 1, 7, 7, 0};
                    put(&f, u, 5, 2, &hint, NULL);
                }
                state before = grab(&f);
                int32_t b[4], hit[8], nh;
                cr_assert_eq(kvp_pool_alloc(f.pool, 4, b), KVP_OK);
                before.free -= 4;
                int32_t x[] = {1, 1, 2, 2, 8, 8, 9, 9, 0};
                kvp_alloc_fail_at(n);
                kvp_status st;
                if (op == 0) st = kvp_pc_match(f.pc, x, 9, &hint, 1, hit, 8, &nh);
                else {
                    int32_t blocks[4] = {-1, -1, b[2], b[3]};
                    kvp_alloc_fail_at(0);
                    cr_assert_eq(kvp_pc_match(f.pc, x, 9, &hint, 0, hit, 8, &nh), KVP_OK);
                    if (nh == 2) {
                        blocks[0] = hit[0];
                        blocks[1] = hit[1];
                    } else {
                        blocks[0] = b[0];
                        blocks[1] = b[1];
                    }
                    free(before.s.v);
                    before = grab(&f);
                    before.free = kvp_pool_num_free(f.pool);
                    kvp_alloc_fail_at(n);
                    st = kvp_pc_insert(f.pc, x, 9, blocks, 4, &hint, 0, NULL);
                }
                int64_t made = kvp_alloc_count();
                kvp_alloc_fail_at(0);
                if (failed_unchanged(&f, st, &before, n)) failures++;
                else if (op == 0) cr_assert_eq(kvp_pc_unlock(f.pc, hit, nh), KVP_OK);
                cr_assert_eq(kvp_pc_check(f.pc), KVP_OK, "%s", kvp_error_detail());
                free(before.s.v);
                cr_assert_eq(kvp_pool_release(f.pool, b, 4), KVP_OK);
                rm(&f);
                if (made < n) break;
            }
            if (kind == KVP_PC_RADIX || op > 0)
                cr_assert_gt(failures, 0, "kind %d op %d: the operation must allocate", kind, op);
        }
    for (int64_t n = 1;; n++) {
        kvp_block_pool *pool;
        kvp_prefix_cache *pc = NULL;
        cr_assert_eq(kvp_pool_create(8, 2, &pool), KVP_OK);
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_pc_create(KVP_PC_RADIX, KVP_EVICT_LRU, pool, 2, &pc);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st != KVP_OK) cr_assert_null(pc);
        kvp_pc_destroy(pc);
        kvp_pool_destroy(pool);
        if (made < n) break;
    }
}

/* ---- belady next uses ---------------------------------------------------------------------------- */

Test(prefix_cache, next_use)
{
    /* bs 2: P0 = [A B x], P1 = [A C x], P2 = [A B], P3 = [A B D x] */
    int32_t p0[] = {1, 1, 2, 2, 0}, p1[] = {1, 1, 3, 3, 0}, p2[] = {1, 1, 2, 2}, p3[] = {1, 1, 2, 2, 4, 4, 0};
    const int32_t *toks[] = {p0, p1, p2, p3};
    int32_t lens[] = {5, 5, 4, 7};
    int64_t n0[2], n1[2], n2[2], n3[3];
    int64_t *nu[] = {n0, n1, n2, n3};
    cr_assert_eq(kvp_pc_next_use(toks, lens, NULL, NULL, 4, 2, nu), KVP_OK);
    cr_assert_eq(n0[0], 1);
    cr_assert_eq(n0[1], 3, "P2 ends at B's last token, so only P3 can hit B");
    cr_assert_eq(n1[0], 2);
    cr_assert_eq(n1[1], KVP_PC_NEVER);
    cr_assert_eq(n2[0], 3);
    cr_assert_eq(n2[1], 3);
    cr_assert_eq(n3[0], KVP_PC_NEVER);
    cr_assert_eq(n3[2], KVP_PC_NEVER);
    /* The same accesses caching all their tokens but matching only a prompt: P2 its first 3 tokens ([A] is
     * matchable), P3 its first 4 ([A]; B and D only cached). B is then never matched again. */
    int32_t match[] = {5, 5, 3, 4};
    cr_assert_eq(kvp_pc_next_use(toks, lens, match, NULL, 4, 2, nu), KVP_OK);
    cr_assert_eq(n0[0], 1);
    cr_assert_eq(n0[1], KVP_PC_NEVER, "P2 and P3 hold B outside their matched prompts");
    cr_assert_eq(n1[0], 2);
    cr_assert_eq(n2[0], 3);
    cr_assert_eq(n2[1], KVP_PC_NEVER);
    cr_assert_eq(n3[1], KVP_PC_NEVER);
}

/* ---- the policies added behind policies/policy.h: slru, arc, cost, size ------------------------------ */

Test(prefix_cache, new_policies_match_the_model_bounded)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++)
        for (int pol = KVP_EVICT_SLRU; pol < KVP_EVICT_POLICIES; pol++)
            for (uint64_t seed = 1; seed <= 2; seed++)
                run_random((kvp_pc_kind)kind, (kvp_evict_policy)pol, 40, seed * 13 + (uint64_t)pol, 300, NULL);
}

Test(prefix_cache, every_policy_parses_and_names_itself)
{
    for (int p = 0; p < KVP_EVICT_POLICIES; p++) {
        kvp_evict_policy q;
        cr_assert_eq(kvp_evict_policy_parse(kvp_evict_policy_name((kvp_evict_policy)p), &q), KVP_OK);
        cr_assert_eq(q, p);
        cr_assert_gt(strlen(kvp_evict_policy_summary((kvp_evict_policy)p)), 10);
    }
    kvp_evict_policy q;
    cr_assert_eq(kvp_evict_policy_parse("mru", &q), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "'mru'") && strstr(kvp_error_message(), "arc"), "%s", kvp_error_message());
    cr_assert_str_eq(kvp_evict_policy_name(KVP_EVICT_POLICIES), "?");
}

/* slru: A cached and reused (protected) before B and C were cached once: LRU would evict A first (oldest),
 * segmented LRU evicts the never-reused B and C first, in LRU order. */
Test(prefix_cache, slru_order)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        int32_t t[3][3] = {{1, 1, 0}, {2, 2, 0}, {3, 3, 0}}, id[3];
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_SLRU, 8, 2);
        put(&f, t[0], 3, 1, NULL, &id[0]);
        cr_assert_eq(hits(&f, t[0], 3, NULL), 1);
        put(&f, t[1], 3, 1, NULL, &id[1]);
        put(&f, t[2], 3, 1, NULL, &id[2]);
        VICTIMS(&f, id[1], id[2], id[0]);
        rm(&f);
    }
}

/* arc: B and X cached once (T1), A cached and reused (T2). The first victim is T1's LRU, B (T1 is over its
 * target p = 0). B cached again hits its ghost: p rises to 1 and B starts in T2. T1 then holds X alone, not more
 * than p, so the victims come from T2 (A, then B) although X is the oldest block: plain LRU would take X. */
Test(prefix_cache, arc_order)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        int32_t b[3] = {2, 2, 0}, x[3] = {5, 5, 0}, a[3] = {1, 1, 0}, idb, idx, ida;
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_ARC, 8, 2);
        put(&f, b, 3, 1, NULL, &idb);
        put(&f, x, 3, 1, NULL, &idx);
        put(&f, a, 3, 1, NULL, &ida);
        cr_assert_eq(hits(&f, a, 3, NULL), 1);
        cr_assert_eq(evict1(&f), idb, "T1 over its target: its LRU block");
        put(&f, b, 3, 1, NULL, &idb);
        cr_assert_eq(evict1(&f), ida, "after B's ghost hit, T1 (X) is within its target: T2's LRU");
        VICTIMS(&f, idb, idx);
        rm(&f);
        /* the same without the ghost hit: X, T1's LRU, goes before A */
        f = mk((kvp_pc_kind)kind, KVP_EVICT_ARC, 8, 2);
        put(&f, x, 3, 1, NULL, &idx);
        put(&f, a, 3, 1, NULL, &ida);
        cr_assert_eq(hits(&f, a, 3, NULL), 1);
        put(&f, b, 3, 1, NULL, &idb);
        VICTIMS(&f, idx, idb, ida);
        rm(&f);
    }
}

/* cost: a two-block chain [X Y] cached before a one-block [Z], each used once. LRU evicts Y, X, Z. Cost keeps
 * the block whose prefix is longest: freq x depth^2 is 4 for Y, 1 for X and Z. Radix evicts leaves only: Z, Y,
 * then X. Hash may evict any block: X (key 1, older than Z) first, orphaning Y, then Z, then Y. With Z used
 * five times (key 5 > 4), radix evicts Y and X before Z. */
Test(prefix_cache, cost_order)
{
    int32_t xy[5] = {1, 1, 2, 2, 0}, z[3] = {3, 3, 0}, ids[2], idz;
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_COST, 8, 2);
        put(&f, xy, 5, 2, NULL, ids);
        put(&f, z, 3, 1, NULL, &idz);
        if (kind == KVP_PC_RADIX) {
            VICTIMS(&f, idz, ids[1], ids[0]);
        } else {
            cr_assert_eq(evict1(&f), ids[0], "hash: X first, though Y stays cached and unreachable");
            cr_assert_eq(hits(&f, xy, 5, NULL), 0);
            VICTIMS(&f, idz, ids[1]);
        }
        rm(&f);
    }
    fixture f = mk(KVP_PC_RADIX, KVP_EVICT_COST, 8, 2);
    put(&f, xy, 5, 2, NULL, ids);
    put(&f, z, 3, 1, NULL, &idz);
    for (int i = 0; i < 4; i++) cr_assert_eq(hits(&f, z, 3, NULL), 1);
    VICTIMS(&f, ids[1], ids[0], idz);
    rm(&f);
}

/* size (hits per token): a three-block prompt L = [A1 A2 A3], used twice, then a one-block S used once.
 * Radix: L's node holds 6 tokens, 2 accesses (0.33 per token) against S's 0.5: L's tail goes first; then L holds
 * 4 tokens (0.5, tied with S, and older): A2; then 2 tokens (1.0): S, then A1. LRU would evict A3, A2, A1, S.
 * Hash: every unit is one block, so the order is LFU's: S (1 access), then A3, A2, A1. */
Test(prefix_cache, size_order)
{
    int32_t l[7] = {1, 1, 2, 2, 3, 3, 0}, s[3] = {4, 4, 0}, ids[3], ida;
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_SIZE, 8, 2);
        put(&f, l, 7, 3, NULL, ids);
        cr_assert_eq(hits(&f, l, 7, NULL), 3);
        put(&f, s, 3, 1, NULL, &ida);
        if (kind == KVP_PC_RADIX) {
            VICTIMS(&f, ids[2], ids[1], ida, ids[0]);
        } else {
            VICTIMS(&f, ida, ids[2], ids[1], ids[0]);
        }
        rm(&f);
    }
}

/* arc reserves its ghost lists at insert time: a failing allocation there changes nothing, and evictions that
 * follow never allocate. */
Test(prefix_cache, arc_allocation_failures_change_nothing)
{
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++) {
        int64_t failures = 0;
        for (int64_t n = 1;; n++) {
            fixture f = mk((kvp_pc_kind)kind, KVP_EVICT_ARC, 256, 2);
            for (int32_t i = 0; i < 40; i++) { /* enough inserts and evictions that the ghost lists grow */
                int32_t u[] = {100 + i, 1, 7, 7, 0};
                put(&f, u, 5, 2, NULL, NULL);
                if (i % 2) evict1(&f);
            }
            state before = grab(&f);
            int32_t b[40];
            cr_assert_eq(kvp_pool_alloc(f.pool, 40, b), KVP_OK);
            before.free -= 40;
            int32_t x[81];
            for (int32_t j = 0; j < 81; j++) x[j] = 9000 + j;
            kvp_alloc_fail_at(n);
            kvp_status st = kvp_pc_insert(f.pc, x, 81, b, 40, NULL, 0, NULL);
            int64_t made = kvp_alloc_count();
            kvp_alloc_fail_at(0);
            if (failed_unchanged(&f, st, &before, n)) {
                failures++;
            } else {
                int64_t k0 = kvp_alloc_count();
                cr_assert_eq(kvp_pc_evict(f.pc, 30, NULL), KVP_OK);
                cr_assert_eq(kvp_alloc_count(), k0, "eviction allocated");
            }
            cr_assert_eq(kvp_pc_check(f.pc), KVP_OK, "%s", kvp_error_detail());
            free(before.s.v);
            cr_assert_eq(kvp_pool_release(f.pool, b, 40), KVP_OK);
            rm(&f);
            if (made < n) break;
        }
        cr_assert_gt(failures, 0, "kind %d: the insert must allocate", kind);
    }
}
