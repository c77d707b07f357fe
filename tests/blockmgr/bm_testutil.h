/* tests/blockmgr/bm_testutil.h — helpers shared by the blockmgr tests: a serialized snapshot of everything
 * observable in a block manager (to check "a failing call changes nothing"), and a tiny PRNG. */
#ifndef KVP_TESTS_BM_TESTUTIL_H
#define KVP_TESTS_BM_TESTUTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blockmgr/block_mgr.h"

typedef struct {
    int64_t *v;
    size_t n, cap;
} snap_t;

static inline void snap_put(snap_t *s, int64_t x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = realloc(s->v, s->cap * sizeof(int64_t));
    }
    s->v[s->n++] = x;
}

static inline void snap_pool(snap_t *s, const kvp_block_pool *p)
{
    if (p == NULL) {
        snap_put(s, -7);
        return;
    }
    int32_t nb = kvp_pool_num_blocks(p);
    snap_put(s, nb);
    snap_put(s, kvp_pool_num_free(p));
    for (int32_t b = 0; b < nb; b++) snap_put(s, kvp_pool_refcount(p, b));
    int32_t *fl = malloc(sizeof(int32_t) * (size_t)nb);
    int32_t n = kvp_pool_free_list(p, fl, nb);
    for (int32_t i = 0; i < n; i++) snap_put(s, fl[i]);
    free(fl);
}

static inline void snap_acc(snap_t *s, const kvp_kv_accounting *a)
{
    snap_put(s, a->capacity);
    snap_put(s, a->token_states);
    snap_put(s, a->reserved);
    snap_put(s, a->internal_frag);
    snap_put(s, a->external_frag);
    snap_put(s, a->cached);
    snap_put(s, a->free);
    snap_put(s, a->logical_tokens);
    snap_put(s, a->shared_savings);
    snap_put(s, a->num_seqs);
}

/* Everything observable: pools (refcounts, free-list order), tables in internal order, accounting, step ops. */
static inline void snap_take(kvp_block_mgr *bm, snap_t *s)
{
    s->n = 0;
    snap_pool(s, kvp_bm_pool(bm));
    snap_pool(s, kvp_bm_host_pool(bm));
    int32_t n = kvp_bm_num_seqs(bm);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int32_t got = kvp_bm_seq_ids(bm, ids, n);
    snap_put(s, got);
    for (int32_t i = 0; i < got; i++) {
        kvp_bm_table_view t;
        snap_put(s, ids[i]);
        if (kvp_bm_table(bm, ids[i], &t) != KVP_OK) {
            snap_put(s, -99);
            continue;
        }
        snap_put(s, t.num_tokens);
        snap_put(s, t.num_blocks);
        snap_put(s, t.on_host);
        for (int32_t j = 0; j < t.num_blocks; j++) snap_put(s, t.blocks[j]);
    }
    free(ids);
    kvp_kv_accounting a;
    kvp_bm_account(bm, false, &a);
    snap_acc(s, &a);
    kvp_bm_account(bm, true, &a);
    snap_acc(s, &a);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    snap_put(s, ops.n_swap_out);
    for (int32_t i = 0; i < ops.n_swap_out; i++) snap_put(s, ops.swap_out[i].src * 1000003LL + ops.swap_out[i].dst);
    snap_put(s, ops.n_swap_in);
    for (int32_t i = 0; i < ops.n_swap_in; i++) snap_put(s, ops.swap_in[i].src * 1000003LL + ops.swap_in[i].dst);
    snap_put(s, ops.n_copies);
    for (int32_t i = 0; i < ops.n_copies; i++) snap_put(s, ops.copies[i].src * 1000003LL + ops.copies[i].dst);
}

static inline int snap_equal(const snap_t *a, const snap_t *b)
{
    return a->n == b->n && memcmp(a->v, b->v, a->n * sizeof(int64_t)) == 0;
}

static inline void snap_free(snap_t *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* splitmix64 */
static inline uint64_t rng_next(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline int32_t rng_int(uint64_t *st, int32_t lo, int32_t hi) /* [lo, hi] */
{
    return lo + (int32_t)(rng_next(st) % (uint64_t)(hi - lo + 1));
}

#endif
