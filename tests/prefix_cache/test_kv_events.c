/* Tests of prefix_cache/kv_events.h: a randomized replay through bounded radix and hash caches (several
 * policies, flushes with and without locked blocks) writes vLLM-schema event lines; an independent reader
 * (kv_events_testutil.h) replays them into its own index after every batch, which must hold exactly the chain
 * hashes the cache holds (kvp_pc_visit), with each stored block's tokens and parent consistent with its hash.
 * Also: write errors come back from flush, and the attach checks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockmgr/block_pool.h"
#include "prefix_cache/kv_events.h"
#include "prefix_cache/kv_events_testutil.h"

typedef struct {
    uint64_t h[256];
    int32_t toks[256][8];
    int n, bs;
} cached_set;

static void collect(void *ctx, uint64_t h, int32_t depth, int32_t block, int32_t locks, const int32_t *t)
{
    (void)depth, (void)block, (void)locks;
    cached_set *c = ctx;
    cr_assert_lt(c->n, 256);
    c->h[c->n] = h;
    if (t) memcpy(c->toks[c->n], t, (size_t)c->bs * sizeof *t);
    c->n++;
}

/* The index equals the cache: the same hashes; radix: the same tokens; every block's hash is its parent's hash
 * chained with its tokens (the event's content is what the cache computed). */
static void same_as_cache(const kv_index *ix, const kvp_prefix_cache *pc, int kind, int step)
{
    cached_set c = {.n = 0, .bs = ix->bs};
    cr_assert_eq(kvp_pc_visit(pc, collect, &c), KVP_OK);
    cr_assert_eq(ix->n, c.n, "step %d: events rebuild %lld blocks, the cache holds %d", step, (long long)ix->n, c.n);
    for (int i = 0; i < c.n; i++) {
        int64_t at = kv_ix_find(ix, c.h[i]);
        cr_assert_geq(at, 0, "step %d: cached block %d is not in the rebuilt index", step, i);
        if (kind == KVP_PC_RADIX)
            cr_assert_eq(memcmp(ix->v[at].tokens, c.toks[i], (size_t)ix->bs * sizeof(int32_t)), 0, "step %d: tokens differ", step);
    }
    for (int64_t i = 0; i < ix->n; i++)
        cr_assert_eq(kvp_pc_block_hash(ix->v[i].parent, ix->v[i].tokens, ix->bs, 0), ix->v[i].hash,
                     "step %d: a stored block's tokens and parent do not make its hash", step);
}

static uint64_t rng(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void replay(kvp_pc_kind kind, kvp_evict_policy pol, uint64_t seed)
{
    const int32_t bs = 4, pool_blocks = 48;
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    cr_assert_eq(kvp_pool_create(pool_blocks, bs, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(kind, pol, pool, bs, &pc), KVP_OK);
    char path[] = "/tmp/kvp_kve_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    kvp_kv_events *ev;
    cr_assert_eq(kvp_kve_open(path, bs, &ev), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_kve_attach(ev, pc), KVP_OK, "%s", kvp_error_detail());
    FILE *in = fopen(path, "r");
    kv_index ix = {.bs = bs};
    int32_t base[5][40];
    uint64_t s = seed;
    for (int b = 0; b < 5; b++)
        for (int j = 0; j < 40; j++) base[b][j] = (int32_t)(rng(&s) % 3);
    int64_t batches = 0, flushes = 0;
    int want_flush = 0;
    for (int step = 0; step < 300; step++) {
        int32_t tok[48], n = 0, b = (int32_t)(rng(&s) % 5), L = (int32_t)(rng(&s) % 41);
        for (int32_t j = 0; j < L; j++) tok[n++] = base[b][j];
        for (int32_t j = (int32_t)(rng(&s) % 8); j > 0; j--) tok[n++] = (int32_t)(rng(&s) % 3);
        if (n == 0) tok[n++] = 1;
        const int32_t nb = n / bs;
        int32_t hit[12], blocks[12], nh = 0;
        cr_assert_eq(kvp_pc_match(pc, tok, n, NULL, 1, hit, 12, &nh), KVP_OK);
        for (int32_t i = 0; i < nh; i++) kvp_pool_incref(pool, hit[i]);
        memcpy(blocks, hit, (size_t)nh * sizeof *blocks);
        cr_assert_eq(kvp_pc_evict_until_free(pc, nb - nh), KVP_OK);
        int32_t got = nb - nh < kvp_pool_num_free(pool) ? nb - nh : kvp_pool_num_free(pool);
        cr_assert_eq(kvp_pool_alloc(pool, got, blocks + nh), KVP_OK);
        cr_assert_eq(kvp_pc_insert(pc, tok, n, blocks, nh + got, NULL, 0, NULL), KVP_OK, "%s", kvp_error_detail());
        want_flush |= step % 60 == 30;
        if (want_flush && nh > 0) { /* a flush while this request holds its hit: removals, not a clear */
            int64_t gone;
            kvp_pc_flush(pc, &gone);
            flushes += gone > 0;
            want_flush = 0;
        }
        cr_assert_eq(kvp_pc_unlock(pc, hit, nh), KVP_OK);
        cr_assert_eq(kvp_pool_release(pool, blocks, nh + got), KVP_OK);
        int64_t before = kvp_kve_batches(ev);
        cr_assert_eq(kvp_kve_flush(ev, (double)step), KVP_OK, "%s", kvp_error_detail());
        batches += kvp_kve_batches(ev) - before;
        kv_ix_apply_file(&ix, in);
        same_as_cache(&ix, pc, kind, step);
    }
    cr_assert_gt(ix.removed, 0, "the pool of %d blocks must evict", pool_blocks);
    cr_assert_eq(ix.cleared, 0);
    cr_assert_gt(flushes, 0, "flushes with locked blocks happened");
    int64_t gone = 0;
    kvp_pc_flush(pc, &gone); /* nothing locked: everything goes, one AllBlocksCleared */
    cr_assert_gt(gone, 0);
    cr_assert_eq(kvp_kve_flush(ev, 300.0), KVP_OK);
    cr_assert_eq(kv_ix_apply_file(&ix, in), 1);
    cr_assert_eq(ix.cleared, 1);
    same_as_cache(&ix, pc, kind, 300);
    cr_assert_eq(ix.n, 0);
    cr_assert_eq(ix.next_seq, batches + 1, "every batch was read, in order");
    cr_assert_eq(kvp_kve_close(ev), KVP_OK);
    fclose(in);
    unlink(path);
    free(ix.v);
    kvp_pc_destroy(pc);
    kvp_pool_destroy(pool);
}

Test(kv_events, the_events_rebuild_the_cache)
{
    const kvp_evict_policy pols[] = {KVP_EVICT_LRU, KVP_EVICT_ARC, KVP_EVICT_COST, KVP_EVICT_FIFO};
    for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++)
        for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++)
            for (uint64_t seed = 1; seed <= 2; seed++) replay((kvp_pc_kind)kind, pols[p], seed * 31 + p);
}

Test(kv_events, errors)
{
    kvp_kv_events *ev = NULL;
    cr_assert_eq(kvp_kve_open("/nonexistent/dir/events.jsonl", 16, &ev), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "/nonexistent/dir/events.jsonl"), "%s", kvp_error_message());
    cr_assert_eq(kvp_kve_open("/tmp/x", 0, &ev), KVP_EINVAL);
    cr_assert_eq(kvp_kve_close(NULL), KVP_OK);
    kvp_block_pool *pool;
    kvp_prefix_cache *pc;
    cr_assert_eq(kvp_pool_create(8, 2, &pool), KVP_OK);
    cr_assert_eq(kvp_pc_create(KVP_PC_HASH, KVP_EVICT_LRU, pool, 2, &pc), KVP_OK);
    FILE *full = fopen("/dev/full", "w");
    cr_assert_not_null(full);
    cr_assert_eq(kvp_kve_create(full, 4, &ev), KVP_OK);
    cr_assert_eq(kvp_kve_attach(ev, pc), KVP_EINVAL, "block sizes differ");
    cr_assert(strstr(kvp_error_message(), "kv events of 4-token blocks cannot follow a cache of 2-token blocks"), "%s",
              kvp_error_message());
    cr_assert_eq(kvp_kve_attach(ev, NULL), KVP_EINVAL);
    kvp_kve_close(ev);
    cr_assert_eq(kvp_kve_create(full, 2, &ev), KVP_OK);
    cr_assert_eq(kvp_kve_attach(ev, pc), KVP_OK);
    cr_assert_eq(kvp_kve_attach(ev, pc), KVP_EINVAL, "one cache at a time");
    cr_assert(strstr(kvp_error_message(), "kv events already follows a cache"), "%s", kvp_error_message());
    cr_assert_eq(kvp_kve_flush(ev, 0), KVP_OK, "no events: nothing is written");
    int32_t t[5] = {1, 2, 3, 4, 5}, b[2];
    cr_assert_eq(kvp_pool_alloc(pool, 2, b), KVP_OK);
    cr_assert_eq(kvp_pc_insert(pc, t, 5, b, 2, NULL, 0, NULL), KVP_OK);
    cr_assert_eq(kvp_kve_flush(ev, 1), KVP_EIO, "a full device");
    cr_assert_eq(kvp_kve_flush(ev, 2), KVP_EIO, "the error is kept");
    cr_assert_eq(kvp_kve_close(ev), KVP_EIO);
    fclose(full);
    cr_assert_eq(kvp_pool_release(pool, b, 2), KVP_OK);
    kvp_pc_destroy(pc);
    kvp_pool_destroy(pool);
}
