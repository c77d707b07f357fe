/* prefix_cache/lru_curve.c — one-pass LRU hit-rate curve (contract and proof sketch in lru_curve.h).
 *
 *   chain hash --map--> block slot --ts[]--> its last access time t (1, 2, ...: one tick per block access)
 *   present times in a Fenwick tree over t: position p = 1 + (times present after t)
 *   per looked-up block with a finite p: lt[p] += block_size   (a hit at every C >= p + 1)
 *                                        eq[p] += block_size   (and at C = p, unless delta_{a-1}(p) = 1)
 *   hit_tokens(C) = sum_{p < C} lt[p] + eq[C]
 * The Fenwick tree doubles when the clock outgrows it and is rebuilt from the presence bits (amortized O(1)).
 */
#include "prefix_cache/lru_curve.h"

#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"

struct kvp_lru_curve {
    int32_t bs;
    pc_map map;      /* chain hash -> slot */
    int64_t *ts;     /* [slot] last access time */
    size_t ts_cap;
    int64_t nslots;
    int32_t *fen;    /* Fenwick tree over times 1..fen_cap-1 */
    uint8_t *present;/* [time] */
    size_t fen_cap;
    int64_t clock, npresent;
    int64_t *lt, *eq; /* [position], grown with nslots */
    size_t lt_cap;
    int64_t *prefix;  /* after finish: prefix[C] = sum_{p < C} lt[p] */
    uint64_t *h;      /* scratch: an access's chain hashes */
    int64_t *pos;     /* scratch: their positions (-1: never seen) */
    int64_t *slot;    /* scratch: their slots (-1: new) */
    size_t h_cap, pos_cap, slot_cap;
    int64_t lookup_tokens, max_blocks;
    int prev_partial;      /* the previous access: its last block partial, */
    int64_t prev_blocks;   /* its blocks (ceil), */
    int64_t prev_maxpos;   /* the largest position of its full blocks before it (INT64_MAX: one was new) */
    int have_prev, exact, finished;
};

kvp_status kvp_lruc_create(int32_t block_size, kvp_lru_curve **out)
{
    if (out == NULL || block_size < 1) return KVP_ERR(KVP_EINVAL, "kvp_lruc_create: block size %d", block_size);
    kvp_lru_curve *c = kvp_calloc(1, sizeof *c);
    if (c == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory for an lru curve");
    c->bs = block_size;
    c->exact = 1;
    *out = c;
    return KVP_OK;
}

void kvp_lruc_destroy(kvp_lru_curve *c)
{
    if (c == NULL) return;
    pc_map_fini(&c->map);
    kvp_free(c->ts);
    kvp_free(c->fen);
    kvp_free(c->present);
    kvp_free(c->lt);
    kvp_free(c->eq);
    kvp_free(c->prefix);
    kvp_free(c->h);
    kvp_free(c->pos);
    kvp_free(c->slot);
    kvp_free(c);
}

static void fen_add(kvp_lru_curve *c, int64_t t, int32_t d)
{
    for (size_t i = (size_t)t; i < c->fen_cap; i += i & (~i + 1)) c->fen[i] += d;
}

static int64_t fen_sum(const kvp_lru_curve *c, int64_t t) /* times 1..t present */
{
    int64_t s = 0;
    for (size_t i = (size_t)t; i > 0; i -= i & (~i + 1)) s += c->fen[i];
    return s;
}

/* Room for times up to `need` (exclusive): doubles and rebuilds the tree. */
static kvp_status fen_reserve(kvp_lru_curve *c, int64_t need)
{
    if ((size_t)need < c->fen_cap) return KVP_OK;
    size_t cap = c->fen_cap ? c->fen_cap : 1024;
    while (cap <= (size_t)need) cap *= 2;
    int32_t *fen = kvp_calloc(cap, sizeof *fen);
    uint8_t *pr = kvp_calloc(cap, 1);
    if (fen == NULL || pr == NULL) {
        kvp_free(fen);
        kvp_free(pr);
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the lru curve's clock to %zu", cap);
    }
    if (c->fen_cap) memcpy(pr, c->present, c->fen_cap);
    for (size_t i = 1; i < cap; i++) { /* O(n) build: each node passes its sum to its parent */
        fen[i] += pr[i];
        size_t j = i + (i & (~i + 1));
        if (j < cap) fen[j] += fen[i];
    }
    kvp_free(c->fen);
    kvp_free(c->present);
    c->fen = fen;
    c->present = pr;
    c->fen_cap = cap;
    return KVP_OK;
}

kvp_status kvp_lruc_access(kvp_lru_curve *c, const int32_t *tokens, int32_t n_tokens, int32_t match_tokens,
                           uint64_t extra_key)
{
    if (c == NULL || n_tokens < 0 || match_tokens < 0 || match_tokens > n_tokens || (n_tokens > 0 && tokens == NULL))
        return KVP_ERR(KVP_EINVAL, "kvp_lruc_access: %d tokens, %d looked up", n_tokens, match_tokens);
    if (c->finished) return KVP_ERR(KVP_ESTATE, "kvp_lruc_access: the curve is finished");
    const int32_t bs = c->bs, nfull = n_tokens / bs, nlook = match_tokens > 0 ? (match_tokens - 1) / bs : 0;
    const int64_t nblocks = ((int64_t)n_tokens + bs - 1) / bs;
    /* every allocation first: scratch, slots, clock, position counters */
    const size_t nf = (size_t)(nfull ? nfull : 1);
    if (kvp_grow((void **)&c->h, &c->h_cap, nf, sizeof *c->h) != KVP_OK ||
        kvp_grow((void **)&c->pos, &c->pos_cap, nf, sizeof *c->pos) != KVP_OK ||
        kvp_grow((void **)&c->slot, &c->slot_cap, nf, sizeof *c->slot) != KVP_OK)
        goto nomem;
    if (pc_map_reserve(&c->map, (size_t)nfull) != KVP_OK) goto nomem;
    if (kvp_grow((void **)&c->ts, &c->ts_cap, (size_t)(c->nslots + nfull + 1), sizeof *c->ts) != KVP_OK) goto nomem;
    size_t lcap = c->lt_cap;
    if (kvp_grow((void **)&c->lt, &lcap, (size_t)(c->nslots + nfull + 2), sizeof *c->lt) != KVP_OK) goto nomem;
    if (lcap != c->lt_cap) {
        size_t ecap = c->lt_cap;
        if (kvp_grow((void **)&c->eq, &ecap, lcap, sizeof *c->eq) != KVP_OK) goto nomem;
        memset(c->lt + c->lt_cap, 0, (lcap - c->lt_cap) * sizeof *c->lt);
        memset(c->eq + c->lt_cap, 0, (lcap - c->lt_cap) * sizeof *c->eq);
        c->lt_cap = lcap;
    }
    if (fen_reserve(c, c->clock + nfull + 1) != KVP_OK) goto nomem;

    kvp_pc_chain_hashes(tokens, nfull, bs, extra_key, c->h);
    int64_t maxpos = 0;
    int seen = 0;
    for (int32_t i = 0; i < nfull; i++) { /* positions before the access */
        int64_t s = pc_map_first(&c->map, c->h[i]);
        c->slot[i] = s >= 0 ? c->map.slots[s].val : -1;
        c->pos[i] = c->slot[i] >= 0 ? 1 + c->npresent - fen_sum(c, c->ts[c->slot[i]]) : -1;
        maxpos = c->pos[i] < 0 || maxpos == INT64_MAX ? INT64_MAX : (c->pos[i] > maxpos ? c->pos[i] : maxpos);
        seen |= c->pos[i] >= 0;
    }
    if (match_tokens == 0 && seen) c->exact = 0; /* a pin repeating content: the replay does not match pins */
    for (int32_t i = 0; i < nlook; i++) {
        const int64_t p = c->pos[i];
        if (p < 0) continue;
        c->lt[p] += bs;
        /* at C = p the previous access left delta = 1 when: partial and it fit (p >= its blocks), or block-aligned
         * with every block above position p */
        const int delta = c->have_prev && (c->prev_partial ? p >= c->prev_blocks : p > c->prev_maxpos);
        if (!delta) c->eq[p] += bs;
    }
    /* move the blocks to the top: the last one first, so the first block ends on top */
    for (int32_t i = nfull - 1; i >= 0; i--) {
        int64_t sl = c->slot[i];
        if (sl < 0) {
            sl = c->nslots++;
            pc_map_put(&c->map, c->h[i], (int32_t)sl);
        } else {
            fen_add(c, c->ts[sl], -1);
            c->present[c->ts[sl]] = 0;
            c->npresent--;
        }
        c->ts[sl] = ++c->clock;
        fen_add(c, c->clock, 1);
        c->present[c->clock] = 1;
        c->npresent++;
    }
    c->lookup_tokens += match_tokens;
    if (nblocks > c->max_blocks) c->max_blocks = nblocks;
    c->have_prev = 1;
    c->prev_partial = n_tokens % bs != 0;
    c->prev_blocks = nblocks;
    c->prev_maxpos = nfull > 0 ? maxpos : INT64_MAX;
    return KVP_OK;
nomem:
    return KVP_ERR(KVP_ENOMEM, "out of memory for an access of %d blocks to the lru curve", nfull);
}

kvp_status kvp_lruc_finish(kvp_lru_curve *c)
{
    if (c == NULL) return KVP_ERR(KVP_EINVAL, "kvp_lruc_finish: NULL curve");
    if (c->finished) return KVP_OK;
    c->prefix = kvp_malloc((size_t)(c->nslots + 2) * sizeof *c->prefix);
    if (c->prefix == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory finishing an lru curve of %lld blocks", (long long)c->nslots);
    c->prefix[0] = 0;
    for (int64_t C = 1; C <= c->nslots + 1; C++) c->prefix[C] = c->prefix[C - 1] + (C - 1 < (int64_t)c->lt_cap ? c->lt[C - 1] : 0);
    c->finished = 1;
    return KVP_OK;
}

int64_t kvp_lruc_blocks(const kvp_lru_curve *c)
{
    return c->nslots;
}

int64_t kvp_lruc_lookup_tokens(const kvp_lru_curve *c)
{
    return c->lookup_tokens;
}

int64_t kvp_lruc_hit_tokens(const kvp_lru_curve *c, int64_t capacity)
{
    if (!c->finished) return 0;
    if (capacity <= 0 || capacity > c->nslots) capacity = c->nslots + 1; /* unbounded: every finite position hits */
    return c->prefix[capacity] + (capacity < (int64_t)c->lt_cap ? c->eq[capacity] : 0);
}

int64_t kvp_lruc_stack_hit_tokens(const kvp_lru_curve *c, int64_t capacity)
{
    if (!c->finished) return 0;
    if (capacity <= 0 || capacity > c->nslots) capacity = c->nslots;
    return c->prefix[capacity + 1];
}

int64_t kvp_lruc_max_access_blocks(const kvp_lru_curve *c)
{
    return c->max_blocks;
}

int kvp_lruc_exact(const kvp_lru_curve *c)
{
    return c->exact;
}
