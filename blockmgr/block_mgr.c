/* blockmgr/block_mgr.c — block tables, copy-on-write, swap and incremental accounting.
 *
 * Per pool side (device = 0, host = 1) the manager keeps, for every block b:
 *   seqref[b]   table entries referring to b (refcount[b] - seqref[b] references are external: the cache)
 *   fill[b]     the largest "view" of b among those entries, where the view of logical block i of a table
 *               with n tokens is clamp(n - i*block_size, 0, block_size): the tokens that table keeps in b
 *   fillcnt[b]  how many entries have a view equal to fill[b]
 * so token_states = sum of fill over used blocks is exact even when shared blocks are seen differently
 * (truncation). Removing the only maximal view of a still-shared block marks it dirty; dirty blocks are
 * recomputed by one scan of that side's tables at the end of the operation (rare: it needs a truncated
 * shared block). Counters n_used, n_empty (used blocks with fill 0: reserved), tokens and logical make
 * kvp_bm_account O(1).
 *
 * Operations follow prepare/commit: every check and every host allocation (table arrays, the id map, the
 * sequence array, the step-op lists) comes first; the commit part cannot fail.
 */
#include "blockmgr/block_mgr.h"

#include <string.h>

#include "blockmgr/block_pool_internal.h"
#include "blockmgr/id_map_internal.h"
#include "common/alloc.h"

enum { DEV = 0, HOST = 1 };
enum { OP_SWAP_OUT = 0, OP_SWAP_IN = 1, OP_COPY = 2 };

typedef struct {
    kvp_block_pool *pool; /* owned; NULL for an absent host side */
    int32_t *rc;          /* pool->refcnt (never reallocated), one load less on the append fast path */
    int32_t *seqref;      /* [num_blocks] */
    int32_t *fill;        /* [num_blocks] valid where seqref > 0 */
    int32_t *fillcnt;     /* [num_blocks] */
    int32_t *remap;       /* [num_blocks] swap scratch: -1 idle, -2 seen, else the block on the other side */
    int32_t *dirty;       /* [num_blocks] blocks whose fill must be recomputed */
    uint8_t *isdirty;     /* [num_blocks] membership in dirty; also a scratch mark (all 0 between calls) */
    int32_t ndirty;
    int64_t n_used;  /* blocks with seqref > 0 */
    int64_t n_empty; /* used blocks with fill 0 */
    int64_t tokens;  /* sum of fill over used blocks */
    int64_t logical; /* sum of num_tokens over this side's sequences */
    int32_t nseqs;
} side_t;

typedef struct {
    int64_t id;
    int32_t *blocks; /* [cap], owned */
    int32_t nblocks, cap, ntok;
    int32_t cur; /* blocks[ntok / bs] when the table has it and the sequence is on the device, else -1:
                  * spares append's fast path one dependent load */
    int32_t slot; /* cur * bs + ntok % bs when cur >= 0, else 0: the next token's slot */
    int32_t left; /* one-token appends the fast path may still make into cur: min(bs - off, max_len - ntok)
                   * when cur >= 0 and off = ntok % bs > 0 (cur holds tokens), else 0 */
    uint8_t host;
    uint8_t mark; /* scratch for duplicate detection, 0 between calls */
} seq_t;

typedef struct {
    kvp_block_copy *v;
    size_t n, cap;
} op_list;

struct kvp_block_mgr {
    kvp_bm_config cfg;
    int32_t bs;
    int bs_shift; /* log2(bs) when bs is a power of two, else -1 */
    int32_t max_len;
    side_t side[2];
    seq_t *seqs; /* [cap_seqs] dense; map gives the index */
    size_t nseqs, cap_seqs;
    kvp_idmap map;
    op_list ops[3];
};

/* ---- small helpers ---------------------------------------------------------------------------------- */

static inline int32_t blk_of(const kvp_block_mgr *bm, int64_t t)
{
    return bm->bs_shift >= 0 ? (int32_t)(t >> bm->bs_shift) : (int32_t)(t / bm->bs);
}
static inline int32_t blocks_for(const kvp_block_mgr *bm, int64_t ntok) { return blk_of(bm, ntok + bm->bs - 1); }

static inline int32_t view_of(const kvp_block_mgr *bm, int32_t ntok, int32_t i)
{
    int64_t v = (int64_t)ntok - (int64_t)i * bm->bs;
    return v <= 0 ? 0 : v >= bm->bs ? bm->bs : (int32_t)v;
}

static inline seq_t *lookup(const kvp_block_mgr *bm, int64_t id)
{
    int32_t i = kvp_idmap_get(&bm->map, id);
    return i < 0 ? NULL : &bm->seqs[i];
}

static inline int32_t cur_of(const kvp_block_mgr *bm, const seq_t *s)
{
    const int32_t li = blk_of(bm, s->ntok);
    return !s->host && li < s->nblocks ? s->blocks[li] : -1;
}

/* The cached fast-path state (cur, slot, left) that s's table implies. */
static inline void cur_state(const kvp_block_mgr *bm, const seq_t *s, int32_t *cur, int32_t *slot, int32_t *left)
{
    *cur = cur_of(bm, s);
    *slot = *left = 0;
    if (*cur >= 0) {
        const int32_t off = s->ntok - blk_of(bm, s->ntok) * bm->bs;
        const int64_t room = (int64_t)bm->max_len - s->ntok;
        *slot = *cur * bm->bs + off;
        if (off > 0) *left = room < bm->bs - off ? (int32_t)room : bm->bs - off;
    }
}

static inline void set_cur(const kvp_block_mgr *bm, seq_t *s) { cur_state(bm, s, &s->cur, &s->slot, &s->left); }

static inline void add_view(side_t *d, int32_t b, int32_t v)
{
    if (d->seqref[b]++ == 0) {
        d->n_used++;
        d->n_empty += v == 0;
        d->tokens += v;
        d->fill[b] = v;
        d->fillcnt[b] = 1;
    } else if (v > d->fill[b]) {
        d->n_empty -= d->fill[b] == 0;
        d->tokens += v - d->fill[b];
        d->fill[b] = v;
        d->fillcnt[b] = 1;
    } else if (v == d->fill[b]) {
        d->fillcnt[b]++;
    }
}

static inline void mark_dirty(side_t *d, int32_t b)
{
    if (!d->isdirty[b]) {
        d->isdirty[b] = 1;
        d->dirty[d->ndirty++] = b;
    }
}

static inline void remove_view(side_t *d, int32_t b, int32_t v)
{
    if (--d->seqref[b] == 0) {
        d->n_used--;
        d->n_empty -= d->fill[b] == 0;
        d->tokens -= d->fill[b];
        d->fill[b] = 0;
        d->fillcnt[b] = 0;
    } else if (v == d->fill[b] && --d->fillcnt[b] == 0) {
        mark_dirty(d, b);
    }
}

/* The sole holder's view of b grows from v to nv (refcount 1, so fill == v). */
static inline void grow_view(side_t *d, int32_t b, int32_t v, int32_t nv)
{
    d->n_empty -= (v == 0) & (nv > 0);
    d->tokens += nv - v;
    d->fill[b] = nv;
}

/* Recomputes fill/fillcnt of the dirty blocks of side si from its tables. */
static void fix_dirty(kvp_block_mgr *bm, int si)
{
    side_t *d = &bm->side[si];
    if (d->ndirty == 0) return;
    for (int32_t k = 0; k < d->ndirty; k++) {
        int32_t b = d->dirty[k];
        if (d->seqref[b] == 0) continue;
        d->tokens -= d->fill[b];
        d->n_empty -= d->fill[b] == 0;
        d->fill[b] = -1;
        d->fillcnt[b] = 0;
    }
    for (size_t q = 0; q < bm->nseqs; q++) {
        const seq_t *s = &bm->seqs[q];
        if (s->host != si) continue;
        for (int32_t i = 0; i < s->nblocks; i++) {
            int32_t b = s->blocks[i];
            if (!d->isdirty[b]) continue;
            int32_t v = view_of(bm, s->ntok, i);
            if (v > d->fill[b]) {
                d->fill[b] = v;
                d->fillcnt[b] = 1;
            } else if (v == d->fill[b]) {
                d->fillcnt[b]++;
            }
        }
    }
    for (int32_t k = 0; k < d->ndirty; k++) {
        int32_t b = d->dirty[k];
        d->isdirty[b] = 0;
        if (d->seqref[b] == 0) continue;
        d->tokens += d->fill[b];
        d->n_empty += d->fill[b] == 0;
    }
    d->ndirty = 0;
}

static kvp_status ensure_cap(seq_t *s, int32_t need)
{
    if (need <= s->cap) return KVP_OK;
    int64_t nc = (int64_t)s->cap * 2;
    if (nc < need) nc = need;
    if (nc < 4) nc = 4;
    if (nc > INT32_MAX) nc = INT32_MAX;
    int32_t *nb = kvp_realloc(s->blocks, (size_t)nc * sizeof(int32_t));
    if (nb == NULL) return KVP_ERR(KVP_ENOMEM, "block manager: out of memory growing a table to %d blocks", (int)need);
    s->blocks = nb;
    s->cap = (int32_t)nc;
    return KVP_OK;
}

static kvp_status ensure_ops(op_list *l, size_t extra)
{
    if (l->n + extra <= l->cap) return KVP_OK;
    if (kvp_grow((void **)&l->v, &l->cap, l->n + extra, sizeof(kvp_block_copy)) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "block manager: out of memory for the step's block moves");
    return KVP_OK;
}

static inline void push_op(op_list *l, int32_t src, int32_t dst)
{
    l->v[l->n].src = src;
    l->v[l->n].dst = dst;
    l->n++;
}

/* Room for one more sequence (id map and dense array); may fail, changes nothing visible. */
static kvp_status reserve_seq_slot(kvp_block_mgr *bm)
{
    if (bm->nseqs >= (size_t)INT32_MAX - 1) return KVP_ERR(KVP_ENOMEM, "block manager: too many sequences");
    KVP_TRY(kvp_idmap_reserve(&bm->map, (int32_t)bm->nseqs + 1));
    if (bm->nseqs + 1 > bm->cap_seqs &&
        kvp_grow((void **)&bm->seqs, &bm->cap_seqs, bm->nseqs + 1, sizeof(seq_t)) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "block manager: out of memory for sequence %zu", bm->nseqs + 1);
    return KVP_OK;
}

/* Appends a sequence (slot reserved), returns it. */
static seq_t *push_seq(kvp_block_mgr *bm, int64_t id, int32_t *blocks, int32_t cap, int si)
{
    seq_t *s = &bm->seqs[bm->nseqs];
    memset(s, 0, sizeof *s);
    s->id = id;
    s->blocks = blocks;
    s->cap = cap;
    s->host = (uint8_t)si;
    kvp_idmap_put(&bm->map, id, (int32_t)bm->nseqs);
    bm->nseqs++;
    bm->side[si].nseqs++;
    return s;
}

static void drop_seq(kvp_block_mgr *bm, seq_t *s)
{
    size_t idx = (size_t)(s - bm->seqs), last = bm->nseqs - 1;
    bm->side[s->host].nseqs--;
    kvp_free(s->blocks);
    kvp_idmap_del(&bm->map, s->id);
    if (idx != last) {
        bm->seqs[idx] = bm->seqs[last];
        kvp_idmap_put(&bm->map, bm->seqs[idx].id, (int32_t)idx);
    }
    bm->nseqs--;
}

/* ---- create / destroy --------------------------------------------------------------------------------- */

static void side_fini(side_t *d)
{
    kvp_pool_destroy(d->pool);
    kvp_free(d->seqref);
    kvp_free(d->fill);
    kvp_free(d->fillcnt);
    kvp_free(d->remap);
    kvp_free(d->dirty);
    kvp_free(d->isdirty);
    memset(d, 0, sizeof *d);
}

static kvp_status side_init(side_t *d, int32_t nb, int32_t bs)
{
    memset(d, 0, sizeof *d);
    KVP_TRY(kvp_pool_create(nb, bs, &d->pool));
    d->rc = d->pool->refcnt;
    d->seqref = kvp_calloc((size_t)nb, sizeof(int32_t));
    d->fill = kvp_calloc((size_t)nb, sizeof(int32_t));
    d->fillcnt = kvp_calloc((size_t)nb, sizeof(int32_t));
    d->remap = kvp_malloc((size_t)nb * sizeof(int32_t));
    d->dirty = kvp_malloc((size_t)nb * sizeof(int32_t));
    d->isdirty = kvp_calloc((size_t)nb, 1);
    if (!d->seqref || !d->fill || !d->fillcnt || !d->remap || !d->dirty || !d->isdirty) {
        side_fini(d);
        return KVP_ERR(KVP_ENOMEM, "block manager: out of memory for %d blocks", (int)nb);
    }
    for (int32_t b = 0; b < nb; b++) d->remap[b] = -1;
    return KVP_OK;
}

kvp_status kvp_bm_create(const kvp_bm_config *cfg, kvp_block_mgr **out)
{
    if (cfg == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_bm_create: NULL argument");
    if (cfg->num_blocks < 1) return KVP_ERR(KVP_EINVAL, "block manager: num_blocks must be >= 1, got %d", (int)cfg->num_blocks);
    if (cfg->block_size < 1) return KVP_ERR(KVP_EINVAL, "block manager: block_size must be >= 1, got %d", (int)cfg->block_size);
    if (cfg->num_host_blocks < 0)
        return KVP_ERR(KVP_EINVAL, "block manager: num_host_blocks must be >= 0, got %d", (int)cfg->num_host_blocks);
    if (cfg->max_seq_len < 0) return KVP_ERR(KVP_EINVAL, "block manager: max_seq_len must be >= 0, got %d", (int)cfg->max_seq_len);
    if (cfg->watermark_blocks < 0)
        return KVP_ERR(KVP_EINVAL, "block manager: watermark_blocks must be >= 0, got %d", (int)cfg->watermark_blocks);
    if ((int64_t)cfg->num_blocks * cfg->block_size > INT32_MAX)
        return KVP_ERR(KVP_EINVAL, "block manager: num_blocks x block_size = %lld slots exceeds int32 slot ids",
                       (long long)cfg->num_blocks * cfg->block_size);
    kvp_block_mgr *bm = kvp_calloc(1, sizeof *bm);
    if (bm == NULL) return KVP_ERR(KVP_ENOMEM, "block manager: out of memory");
    bm->cfg = *cfg;
    bm->bs = cfg->block_size;
    bm->bs_shift = -1;
    if ((bm->bs & (bm->bs - 1)) == 0)
        for (int sh = 0; sh < 31; sh++)
            if ((1 << sh) == bm->bs) bm->bs_shift = sh;
    bm->max_len = cfg->max_seq_len > 0 ? cfg->max_seq_len : INT32_MAX - bm->bs;
    kvp_status st = side_init(&bm->side[DEV], cfg->num_blocks, cfg->block_size);
    if (st == KVP_OK && cfg->num_host_blocks > 0) st = side_init(&bm->side[HOST], cfg->num_host_blocks, cfg->block_size);
    if (st == KVP_OK) st = kvp_idmap_init(&bm->map);
    if (st != KVP_OK) {
        kvp_bm_destroy(bm);
        return st;
    }
    *out = bm;
    return KVP_OK;
}

void kvp_bm_destroy(kvp_block_mgr *bm)
{
    if (bm == NULL) return;
    for (size_t i = 0; i < bm->nseqs; i++) kvp_free(bm->seqs[i].blocks);
    kvp_free(bm->seqs);
    kvp_idmap_fini(&bm->map);
    side_fini(&bm->side[DEV]);
    side_fini(&bm->side[HOST]);
    for (int i = 0; i < 3; i++) kvp_free(bm->ops[i].v);
    kvp_free(bm);
}

kvp_block_pool *kvp_bm_pool(kvp_block_mgr *bm) { return bm->side[DEV].pool; }
kvp_block_pool *kvp_bm_host_pool(kvp_block_mgr *bm) { return bm->side[HOST].pool; }
int32_t kvp_bm_block_size(const kvp_block_mgr *bm) { return bm->bs; }
int32_t kvp_bm_num_free(const kvp_block_mgr *bm) { return bm->side[DEV].pool->num_free; }

/* ---- external references ------------------------------------------------------------------------------- */

kvp_status kvp_bm_incref(kvp_block_mgr *bm, int32_t block) { return kvp_pool_incref(bm->side[DEV].pool, block); }
kvp_status kvp_bm_take(kvp_block_mgr *bm, int32_t block) { return kvp_pool_take(bm->side[DEV].pool, block); }

kvp_status kvp_bm_decref(kvp_block_mgr *bm, int32_t block)
{
    side_t *d = &bm->side[DEV];
    if (block < 0 || block >= d->pool->num_blocks)
        return KVP_ERR(KVP_EINVAL, "block manager decref: block id %d out of range [0, %d)", (int)block,
                       (int)d->pool->num_blocks);
    if (d->pool->refcnt[block] <= d->seqref[block])
        return KVP_ERR(KVP_ESTATE, "block manager decref: block %d has %d references, all held by block tables",
                       (int)block, (int)d->pool->refcnt[block]);
    kvp_pool_decref_(d->pool, block);
    return KVP_OK;
}

/* ---- allocate ------------------------------------------------------------------------------------------ */

kvp_status kvp_bm_allocate_prefixed(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens,
                                    const int32_t *prefix_blocks, int32_t n_prefix)
{
    side_t *d = &bm->side[DEV];
    if (n_tokens < 0 || n_tokens > bm->max_len)
        return KVP_ERR(KVP_EINVAL, "allocate seq %lld: n_tokens %d outside [0, %d]", (long long)seq_id, (int)n_tokens,
                       (int)bm->max_len);
    if (n_prefix < 0 || (n_prefix > 0 && prefix_blocks == NULL))
        return KVP_ERR(KVP_EINVAL, "allocate seq %lld: bad prefix list (n_prefix %d)", (long long)seq_id, (int)n_prefix);
    if ((int64_t)n_prefix * bm->bs > n_tokens)
        return KVP_ERR(KVP_EINVAL, "allocate seq %lld: %d prefix blocks hold %lld tokens, more than n_tokens %d",
                       (long long)seq_id, (int)n_prefix, (long long)n_prefix * bm->bs, (int)n_tokens);
    if (lookup(bm, seq_id) != NULL) return KVP_ERR(KVP_ESTATE, "allocate: sequence %lld already exists", (long long)seq_id);
    kvp_status st = KVP_OK;
    int32_t i = 0;
    for (; i < n_prefix; i++) {
        int32_t b = prefix_blocks[i];
        if (b < 0 || b >= d->pool->num_blocks) {
            st = KVP_ERR(KVP_EINVAL, "allocate seq %lld: prefix block %d (entry %d) out of range [0, %d)",
                         (long long)seq_id, (int)b, (int)i, (int)d->pool->num_blocks);
            break;
        }
        if (d->pool->refcnt[b] < 1) {
            st = KVP_ERR(KVP_ESTATE, "allocate seq %lld: prefix block %d (entry %d) is free", (long long)seq_id, (int)b, (int)i);
            break;
        }
        if (d->pool->refcnt[b] == INT32_MAX) {
            st = KVP_ERR(KVP_ESTATE, "allocate seq %lld: prefix block %d refcount would overflow", (long long)seq_id, (int)b);
            break;
        }
        if (d->isdirty[b]) {
            st = KVP_ERR(KVP_EINVAL, "allocate seq %lld: prefix block %d is repeated (entry %d)", (long long)seq_id, (int)b, (int)i);
            break;
        }
        d->isdirty[b] = 1;
    }
    for (int32_t j = 0; j < i; j++) d->isdirty[prefix_blocks[j]] = 0;
    if (st != KVP_OK) return st;

    const int32_t nb = blocks_for(bm, n_tokens), nnew = nb - n_prefix;
    if (nnew > d->pool->num_free)
        return KVP_ERR(KVP_ENOBLOCKS, "allocate seq %lld: needs %d blocks, %d free", (long long)seq_id, (int)nnew,
                       (int)d->pool->num_free);
    const int32_t cap = nb < 4 ? 4 : nb;
    int32_t *blocks = kvp_malloc((size_t)cap * sizeof(int32_t));
    if (blocks == NULL) return KVP_ERR(KVP_ENOMEM, "allocate seq %lld: out of memory for its table", (long long)seq_id);
    st = reserve_seq_slot(bm);
    if (st != KVP_OK) {
        kvp_free(blocks);
        return st;
    }
    /* commit */
    for (i = 0; i < n_prefix; i++) {
        int32_t b = prefix_blocks[i];
        d->pool->refcnt[b]++;
        blocks[i] = b;
        add_view(d, b, bm->bs);
    }
    for (; i < nb; i++) {
        int32_t b = kvp_pool_pop_(d->pool);
        blocks[i] = b;
        add_view(d, b, view_of(bm, n_tokens, i));
    }
    seq_t *s = push_seq(bm, seq_id, blocks, cap, DEV);
    s->nblocks = nb;
    s->ntok = n_tokens;
    set_cur(bm, s);
    d->logical += n_tokens;
    return KVP_OK;
}

kvp_status kvp_bm_allocate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens)
{
    return kvp_bm_allocate_prefixed(bm, seq_id, n_tokens, NULL, 0);
}

bool kvp_bm_can_allocate(const kvp_block_mgr *bm, int32_t n_tokens)
{
    if (n_tokens < 0 || n_tokens > bm->max_len) return false;
    return (int64_t)bm->side[DEV].pool->num_free - blocks_for(bm, n_tokens) >= bm->cfg.watermark_blocks;
}

/* ---- append / reserve ----------------------------------------------------------------------------------- */

static kvp_status device_seq(const kvp_block_mgr *bm, int64_t seq_id, const char *op, seq_t **out)
{
    seq_t *s = lookup(bm, seq_id);
    if (s == NULL) return KVP_ERR(KVP_ENOTFOUND, "%s: unknown sequence %lld", op, (long long)seq_id);
    if (s->host) return KVP_ERR(KVP_ESTATE, "%s: sequence %lld is swapped out", op, (long long)seq_id);
    *out = s;
    return KVP_OK;
}

/* Blocks an append of k tokens needs: copy-on-write replacements among existing blocks it writes into, and
 * new blocks past the table's end. */
static void append_needs(const kvp_block_mgr *bm, const seq_t *s, int32_t k, int32_t *ncow, int32_t *nnew, int32_t *need)
{
    const kvp_block_pool *p = bm->side[DEV].pool;
    const int32_t li = blk_of(bm, s->ntok);
    *need = blocks_for(bm, (int64_t)s->ntok + k);
    if (k == 0) {
        *ncow = *nnew = 0;
        return;
    }
    const int32_t hi = *need < s->nblocks ? *need : s->nblocks;
    int32_t c = 0;
    for (int32_t i = li; i < hi; i++) c += p->refcnt[s->blocks[i]] > 1;
    *ncow = c;
    *nnew = *need > s->nblocks ? *need - s->nblocks : 0;
}

static kvp_status check_append(const kvp_block_mgr *bm, const seq_t *s, int32_t k, const char *op)
{
    if (k < 0) return KVP_ERR(KVP_EINVAL, "%s seq %lld: negative token count %d", op, (long long)s->id, (int)k);
    if ((int64_t)s->ntok + k > bm->max_len)
        return KVP_ERR(KVP_EINVAL, "%s seq %lld: %d + %d tokens exceeds max_seq_len %d", op, (long long)s->id, (int)s->ntok,
                       (int)k, (int)bm->max_len);
    return KVP_OK;
}

/* The general append (new blocks, copy-on-write, reserved blocks); kvp_bm_append handles the common case
 * inline and falls back here, which also produces every error. */
static __attribute__((noinline)) kvp_status append_slow(kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *slots_out)
{
    seq_t *s;
    KVP_TRY(device_seq(bm, seq_id, "append", &s));
    KVP_TRY(check_append(bm, s, k, "append"));
    if (k == 0) return KVP_OK; /* nothing to write: in particular no copy-on-write */
    side_t *d = &bm->side[DEV];
    kvp_block_pool *p = d->pool;
    const int32_t bs = bm->bs, ntok = s->ntok, newtok = ntok + k;
    const int32_t li = blk_of(bm, ntok);
    int32_t ncow, nnew, need;
    append_needs(bm, s, k, &ncow, &nnew, &need);
    if (ncow + nnew > p->num_free)
        return KVP_ERR(KVP_ENOBLOCKS, "append seq %lld: needs %d blocks, %d free", (long long)seq_id, (int)(ncow + nnew),
                       (int)p->num_free);
    KVP_TRY(ensure_cap(s, need));
    if (ncow) KVP_TRY(ensure_ops(&bm->ops[OP_COPY], (size_t)ncow));

    /* commit */
    const int32_t nb = s->nblocks, hi = need < nb ? need : nb;
    for (int32_t i = li; i < hi; i++) {
        int32_t b = s->blocks[i];
        const int32_t v = view_of(bm, ntok, i);
        if (p->refcnt[b] > 1) {
            const int32_t nbk = kvp_pool_pop_(p);
            remove_view(d, b, v);
            kvp_pool_decref_(p, b);
            add_view(d, nbk, v);
            if (v > 0) push_op(&bm->ops[OP_COPY], b, nbk);
            s->blocks[i] = b = nbk;
        }
        grow_view(d, b, v, view_of(bm, newtok, i));
    }
    for (int32_t i = nb; i < need; i++) {
        const int32_t b = kvp_pool_pop_(p);
        s->blocks[i] = b;
        add_view(d, b, view_of(bm, newtok, i));
    }
    if (need > nb) s->nblocks = need;
    if (slots_out) {
        int32_t i = li, off = ntok - li * bs;
        for (int32_t j = 0; j < k; j++) {
            slots_out[j] = s->blocks[i] * bs + off;
            if (++off == bs) {
                off = 0;
                i++;
            }
        }
    }
    s->ntok = newtok;
    set_cur(bm, s);
    d->logical += k;
    fix_dirty(bm, DEV);
    return KVP_OK;
}

/* One-token appends that the hot path leaves: the first token of a reserved block or of a fresh block,
 * a token past max_len (error) or into a shared block (copy-on-write); everything else, errors included,
 * goes to append_slow. */
static __attribute__((noinline)) kvp_status append_mid(kvp_block_mgr *bm, seq_t *s, int64_t seq_id, int32_t k,
                                                      int32_t *slots_out)
{
    side_t *d = &bm->side[DEV];
    if (k == 1 && s->cur >= 0) {
        /* The first token into an existing block that holds none yet (reserved), not shared. */
        const int32_t ntok = s->ntok, b = s->cur;
        const int32_t off = s->slot - b * bm->bs;
        if (off == 0 && ntok < bm->max_len && d->rc[b] == 1) {
            d->n_empty--;
            d->tokens++;
            d->fill[b] = 1;
            d->logical++;
            if (slots_out) *slots_out = s->slot;
            s->ntok = ntok + 1;
            set_cur(bm, s);
            return KVP_OK;
        }
    } else if (k == 1 && !s->host) {
        /* Every block full (cur < 0 on the device): the token opens a fresh block, once per block_size. */
        const int32_t ntok = s->ntok, nb = s->nblocks;
        if (ntok < bm->max_len && nb < s->cap && d->pool->num_free > 0) {
            const int32_t b = kvp_pool_pop_(d->pool);
            s->blocks[nb] = b;
            s->nblocks = nb + 1;
            d->seqref[b] = 1;
            d->fill[b] = 1;
            d->fillcnt[b] = 1;
            d->n_used++;
            d->tokens++;
            d->logical++;
            if (slots_out) *slots_out = b * bm->bs;
            s->ntok = ntok + 1;
            set_cur(bm, s);
            return KVP_OK;
        }
    }
    return append_slow(bm, seq_id, k, slots_out);
}

/* The decode hot path, inlined into both entry points: one token into the sequence's current block, which
 * already holds tokens (left > 0: room in it and under max_len) and is not shared (refcount 1). Then this
 * table is the block's sole holder, so fill[b] is this table's view of it and simply grows by one. */
static inline __attribute__((always_inline)) kvp_status append_fast(kvp_block_mgr *bm, seq_t *s, int64_t seq_id,
                                                                     int32_t k, int32_t *slots_out)
{
    side_t *d = &bm->side[DEV];
    if (__builtin_expect(k == 1 && s->left > 0, 1)) {
        const int32_t b = s->cur;
        if (__builtin_expect(d->rc[b] == 1, 1)) {
            const int32_t slot = s->slot;
            d->fill[b]++;
            d->tokens++;
            d->logical++;
            s->ntok++;
            s->slot = slot + 1;
            if (--s->left == 0) set_cur(bm, s); /* the block is full now (or max_len reached) */
            if (slots_out) *slots_out = slot;
            return KVP_OK;
        }
    }
    return append_mid(bm, s, seq_id, k, slots_out);
}

kvp_status kvp_bm_append(kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *slots_out)
{
    seq_t *s = lookup(bm, seq_id);
    if (__builtin_expect(s == NULL, 0)) return append_slow(bm, seq_id, k, slots_out);
    return append_fast(bm, s, seq_id, k, slots_out);
}

kvp_status kvp_bm_seq_ref_get(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_seq_ref *out)
{
    if (out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_bm_seq_ref_get: NULL output");
    const int32_t i = kvp_idmap_get(&bm->map, seq_id);
    if (i < 0) return KVP_ERR(KVP_ENOTFOUND, "sequence reference: unknown sequence %lld", (long long)seq_id);
    out->seq_id = seq_id;
    out->idx = i;
    return KVP_OK;
}

kvp_status kvp_bm_append_ref(kvp_block_mgr *bm, kvp_bm_seq_ref *ref, int32_t k, int32_t *slots_out)
{
    if (__builtin_expect(ref == NULL, 0)) return KVP_ERR(KVP_EINVAL, "kvp_bm_append_ref: NULL reference");
    const int64_t id = ref->seq_id;
    const uint32_t i = (uint32_t)ref->idx;
    seq_t *s;
    if (__builtin_expect(i < bm->nseqs && bm->seqs[i].id == id, 1)) {
        s = &bm->seqs[i];
    } else { /* stale hint: the sequence moved or is gone */
        const int32_t j = kvp_idmap_get(&bm->map, id);
        if (j < 0) return append_slow(bm, id, k, slots_out); /* KVP_ENOTFOUND */
        ref->idx = j;
        s = &bm->seqs[j];
    }
    return append_fast(bm, s, id, k, slots_out);
}

kvp_status kvp_bm_append_blocks_needed(const kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *out)
{
    seq_t *s;
    KVP_TRY(device_seq(bm, seq_id, "append_blocks_needed", &s));
    KVP_TRY(check_append(bm, s, k, "append_blocks_needed"));
    int32_t ncow, nnew, need;
    append_needs(bm, s, k, &ncow, &nnew, &need);
    *out = ncow + nnew;
    return KVP_OK;
}

kvp_status kvp_bm_reserve(kvp_block_mgr *bm, int64_t seq_id, int32_t n_ahead)
{
    seq_t *s;
    KVP_TRY(device_seq(bm, seq_id, "reserve", &s));
    KVP_TRY(check_append(bm, s, n_ahead, "reserve"));
    side_t *d = &bm->side[DEV];
    const int32_t need = blocks_for(bm, (int64_t)s->ntok + n_ahead);
    if (need <= s->nblocks) return KVP_OK;
    const int32_t nnew = need - s->nblocks;
    if (nnew > d->pool->num_free)
        return KVP_ERR(KVP_ENOBLOCKS, "reserve seq %lld: needs %d blocks, %d free", (long long)seq_id, (int)nnew,
                       (int)d->pool->num_free);
    KVP_TRY(ensure_cap(s, need));
    for (int32_t i = s->nblocks; i < need; i++) {
        const int32_t b = kvp_pool_pop_(d->pool);
        s->blocks[i] = b;
        add_view(d, b, 0);
    }
    s->nblocks = need;
    set_cur(bm, s);
    return KVP_OK;
}

/* ---- fork / free / truncate ------------------------------------------------------------------------------ */

kvp_status kvp_bm_fork(kvp_block_mgr *bm, int64_t parent_id, int64_t child_id)
{
    seq_t *ps;
    KVP_TRY(device_seq(bm, parent_id, "fork", &ps));
    if (lookup(bm, child_id) != NULL)
        return KVP_ERR(KVP_ESTATE, "fork %lld -> %lld: the child already exists", (long long)parent_id, (long long)child_id);
    side_t *d = &bm->side[DEV];
    const int32_t n = blocks_for(bm, ps->ntok);
    for (int32_t i = 0; i < n; i++)
        if (d->pool->refcnt[ps->blocks[i]] == INT32_MAX)
            return KVP_ERR(KVP_ESTATE, "fork %lld: block %d refcount would overflow", (long long)parent_id, (int)ps->blocks[i]);
    const int32_t cap = n < 4 ? 4 : n;
    int32_t *blocks = kvp_malloc((size_t)cap * sizeof(int32_t));
    if (blocks == NULL) return KVP_ERR(KVP_ENOMEM, "fork %lld: out of memory for the child's table", (long long)parent_id);
    kvp_status st = reserve_seq_slot(bm); /* may move bm->seqs: look the parent up again */
    if (st != KVP_OK) {
        kvp_free(blocks);
        return st;
    }
    ps = lookup(bm, parent_id);
    const int32_t ntok = ps->ntok, *pb = ps->blocks, bs = bm->bs;
    int32_t *rc = d->pool->refcnt, *sr = d->seqref, *fl = d->fill, *fc = d->fillcnt;
    /* Every block but the last is full in the parent, so its fill is block_size: add_view reduces to counts. */
    for (int32_t i = 0; i < n - 1; i++) {
        const int32_t b = pb[i];
        blocks[i] = b;
        rc[b]++;
        sr[b]++;
        fc[b] += fl[b] == bs;
    }
    if (n > 0) {
        const int32_t b = pb[n - 1];
        blocks[n - 1] = b;
        rc[b]++;
        add_view(d, b, view_of(bm, ntok, n - 1));
    }
    seq_t *c = push_seq(bm, child_id, blocks, cap, DEV);
    c->nblocks = n;
    c->ntok = ntok;
    set_cur(bm, c);
    d->logical += ntok;
    return KVP_OK;
}

kvp_status kvp_bm_free(kvp_block_mgr *bm, int64_t seq_id)
{
    seq_t *s = lookup(bm, seq_id);
    if (s == NULL) return KVP_ERR(KVP_ENOTFOUND, "free: unknown sequence %lld (never allocated or already freed)", (long long)seq_id);
    const int si = s->host;
    side_t *d = &bm->side[si];
    for (int32_t i = 0; i < s->nblocks; i++) {
        const int32_t b = s->blocks[i];
        remove_view(d, b, view_of(bm, s->ntok, i));
        kvp_pool_decref_(d->pool, b);
    }
    d->logical -= s->ntok;
    drop_seq(bm, s);
    fix_dirty(bm, si);
    return KVP_OK;
}

kvp_status kvp_bm_truncate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens)
{
    seq_t *s;
    KVP_TRY(device_seq(bm, seq_id, "truncate", &s));
    if (n_tokens < 0 || n_tokens > s->ntok)
        return KVP_ERR(KVP_EINVAL, "truncate seq %lld: n_tokens %d outside [0, %d]", (long long)seq_id, (int)n_tokens,
                       (int)s->ntok);
    side_t *d = &bm->side[DEV];
    const int32_t keep = blocks_for(bm, n_tokens);
    for (int32_t i = keep; i < s->nblocks; i++) {
        const int32_t b = s->blocks[i];
        remove_view(d, b, view_of(bm, s->ntok, i));
        kvp_pool_decref_(d->pool, b);
    }
    if (keep > 0) {
        const int32_t b = s->blocks[keep - 1], vo = view_of(bm, s->ntok, keep - 1), vn = view_of(bm, n_tokens, keep - 1);
        if (vo != vn) {
            remove_view(d, b, vo);
            add_view(d, b, vn);
        }
    }
    s->nblocks = keep;
    d->logical -= s->ntok - n_tokens;
    s->ntok = n_tokens;
    set_cur(bm, s);
    fix_dirty(bm, DEV);
    return KVP_OK;
}

/* ---- swap ------------------------------------------------------------------------------------------------ */

static void clear_marks(kvp_block_mgr *bm, const int64_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        seq_t *s = lookup(bm, ids[i]);
        if (s) s->mark = 0;
    }
}

static void swap_reset(kvp_block_mgr *bm, const int64_t *ids, int32_t n, int from)
{
    side_t *d = &bm->side[from];
    for (int32_t i = 0; i < n; i++) {
        const seq_t *s = lookup(bm, ids[i]);
        for (int32_t j = 0; j < s->nblocks; j++) d->remap[s->blocks[j]] = -1;
    }
}

/* Validates a swap of ids from side `from`; on success *need = distinct blocks to move, and the moved
 * blocks carry remap = -2 (the caller must reset them). */
static kvp_status swap_prepare(const kvp_block_mgr *bm, const int64_t *ids, int32_t n, int from, const char *op,
                               int32_t *need)
{
    if (bm->side[HOST].pool == NULL) return KVP_ERR(KVP_EUNSUPPORTED, "%s: no host pool (num_host_blocks is 0)", op);
    if (n < 0 || (n > 0 && ids == NULL)) return KVP_ERR(KVP_EINVAL, "%s: bad sequence list (n = %d)", op, (int)n);
    kvp_block_mgr *m = (kvp_block_mgr *)bm; /* marks are scratch, restored before returning */
    kvp_status st = KVP_OK;
    int32_t i = 0;
    for (; i < n; i++) {
        seq_t *s = lookup(bm, ids[i]);
        if (s == NULL) {
            st = KVP_ERR(KVP_ENOTFOUND, "%s: unknown sequence %lld", op, (long long)ids[i]);
            break;
        }
        if (s->host != from) {
            st = KVP_ERR(KVP_ESTATE, "%s: sequence %lld is %s", op, (long long)ids[i], s->host ? "swapped out" : "on the device");
            break;
        }
        if (s->mark) {
            st = KVP_ERR(KVP_ESTATE, "%s: sequence %lld is listed twice", op, (long long)ids[i]);
            break;
        }
        s->mark = 1;
    }
    clear_marks(m, ids, i);
    if (st != KVP_OK) return st;
    const side_t *d = &bm->side[from];
    int32_t cnt = 0;
    for (i = 0; i < n; i++) {
        const seq_t *s = lookup(bm, ids[i]);
        for (int32_t j = 0; j < s->nblocks; j++) {
            const int32_t b = s->blocks[j];
            if (d->remap[b] == -1) {
                d->remap[b] = -2;
                cnt++;
            }
        }
    }
    /* A block about to receive a pending copy holds no valid data yet: moving it would lose the copy. */
    if (from == DEV)
        for (size_t k = 0; k < bm->ops[OP_COPY].n; k++) {
            const int32_t dst = bm->ops[OP_COPY].v[k].dst;
            if (d->remap[dst] == -2) {
                swap_reset(m, ids, n, from);
                return KVP_ERR(KVP_ESTATE, "%s: block %d has a copy-on-write copy pending in this step; run the step's "
                               "copies (kvp_bm_step_ops_clear) before swapping its sequence out", op, (int)dst);
            }
        }
    *need = cnt;
    return KVP_OK;
}

static kvp_status swap_move(kvp_block_mgr *bm, const int64_t *ids, int32_t n, int from, const char *op)
{
    const int to = 1 - from;
    int32_t need;
    KVP_TRY(swap_prepare(bm, ids, n, from, op, &need));
    side_t *sd = &bm->side[from], *dd = &bm->side[to];
    op_list *l = &bm->ops[from == DEV ? OP_SWAP_OUT : OP_SWAP_IN];
    kvp_status st = KVP_OK;
    if (need > dd->pool->num_free)
        st = KVP_ERR(KVP_ENOBLOCKS, "%s: needs %d %s blocks, %d free", op, (int)need, to == HOST ? "host" : "device",
                     (int)dd->pool->num_free);
    if (st == KVP_OK) st = ensure_ops(l, (size_t)need);
    if (st != KVP_OK) {
        swap_reset(bm, ids, n, from);
        return st;
    }
    /* commit */
    for (int32_t i = 0; i < n; i++) {
        seq_t *s = lookup(bm, ids[i]);
        for (int32_t j = 0; j < s->nblocks; j++) {
            const int32_t b = s->blocks[j], v = view_of(bm, s->ntok, j);
            int32_t nbk = sd->remap[b];
            if (nbk < 0) {
                nbk = kvp_pool_pop_(dd->pool);
                sd->remap[b] = nbk;
                push_op(l, b, nbk);
            } else {
                dd->pool->refcnt[nbk]++;
            }
            add_view(dd, nbk, v);
            remove_view(sd, b, v);
            kvp_pool_decref_(sd->pool, b);
            s->blocks[j] = nbk;
        }
        s->host = (uint8_t)to;
        set_cur(bm, s);
        sd->logical -= s->ntok;
        dd->logical += s->ntok;
        sd->nseqs--;
        dd->nseqs++;
    }
    for (size_t k = l->n - (size_t)need; k < l->n; k++) sd->remap[l->v[k].src] = -1;
    fix_dirty(bm, from);
    return KVP_OK;
}

kvp_status kvp_bm_swap_out(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n)
{
    return swap_move(bm, seq_ids, n, DEV, "swap_out");
}

kvp_status kvp_bm_swap_in(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n)
{
    return swap_move(bm, seq_ids, n, HOST, "swap_in");
}

kvp_status kvp_bm_swap_in_blocks_needed(const kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n, int32_t *out)
{
    int32_t need;
    KVP_TRY(swap_prepare(bm, seq_ids, n, HOST, "swap_in_blocks_needed", &need));
    swap_reset((kvp_block_mgr *)bm, seq_ids, n, HOST);
    *out = need;
    return KVP_OK;
}

/* ---- reading ----------------------------------------------------------------------------------------------- */

bool kvp_bm_has_seq(const kvp_block_mgr *bm, int64_t seq_id) { return lookup(bm, seq_id) != NULL; }
int32_t kvp_bm_num_seqs(const kvp_block_mgr *bm) { return (int32_t)bm->nseqs; }

kvp_status kvp_bm_table(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_table_view *out)
{
    const seq_t *s = lookup(bm, seq_id);
    if (s == NULL) return KVP_ERR(KVP_ENOTFOUND, "table: unknown sequence %lld", (long long)seq_id);
    out->blocks = s->blocks;
    out->num_blocks = s->nblocks;
    out->num_tokens = s->ntok;
    out->on_host = s->host != 0;
    return KVP_OK;
}

int32_t kvp_bm_seq_ids(const kvp_block_mgr *bm, int64_t *out, int32_t max)
{
    int32_t n = 0;
    for (size_t i = 0; i < bm->nseqs && n < max; i++) out[n++] = bm->seqs[i].id;
    return n;
}

void kvp_bm_step_ops_get(const kvp_block_mgr *bm, kvp_bm_step_ops *out)
{
    out->swap_out = bm->ops[OP_SWAP_OUT].v;
    out->n_swap_out = (int32_t)bm->ops[OP_SWAP_OUT].n;
    out->swap_in = bm->ops[OP_SWAP_IN].v;
    out->n_swap_in = (int32_t)bm->ops[OP_SWAP_IN].n;
    out->copies = bm->ops[OP_COPY].v;
    out->n_copies = (int32_t)bm->ops[OP_COPY].n;
}

void kvp_bm_step_ops_clear(kvp_block_mgr *bm)
{
    for (int i = 0; i < 3; i++) bm->ops[i].n = 0;
}

void kvp_bm_account(const kvp_block_mgr *bm, bool host, kvp_kv_accounting *out)
{
    memset(out, 0, sizeof *out);
    const side_t *d = &bm->side[host ? HOST : DEV];
    if (d->pool == NULL) return;
    const int64_t bs = bm->bs, nb = d->pool->num_blocks, nfree = d->pool->num_free;
    out->capacity = nb * bs;
    out->token_states = d->tokens;
    out->reserved = d->n_empty * bs;
    out->internal_frag = (d->n_used - d->n_empty) * bs - d->tokens;
    out->external_frag = 0;
    out->cached = (nb - nfree - d->n_used) * bs;
    out->free = nfree * bs;
    out->logical_tokens = d->logical;
    out->shared_savings = d->logical - d->tokens;
    out->num_seqs = d->nseqs;
}

/* ---- invariant walker ------------------------------------------------------------------------------------ */

static kvp_status check_side(const kvp_block_mgr *bm, int si)
{
    const side_t *d = &bm->side[si];
    const char *name = si == DEV ? "device" : "host";
    KVP_TRY(kvp_pool_check(d->pool));
    const int32_t nb = d->pool->num_blocks, bs = bm->bs;
    int32_t *cnt = kvp_calloc((size_t)nb * 4, sizeof(int32_t));
    if (cnt == NULL) return KVP_ERR(KVP_ENOMEM, "check: out of memory");
    int32_t *mx = cnt + nb, *mxc = cnt + 2 * (size_t)nb, *lastq = cnt + 3 * (size_t)nb; /* lastq: table index + 1 */
    kvp_status st = KVP_OK;
    int64_t logical = 0, nseqs = 0;
    int32_t ecur, eslot, eleft;
    for (size_t q = 0; q < bm->nseqs && st == KVP_OK; q++) {
        const seq_t *s = &bm->seqs[q];
        if (s->host != si) continue;
        nseqs++;
        logical += s->ntok;
        if (s->mark) st = KVP_ERR(KVP_ESTATE, "check: seq %lld has a stale mark", (long long)s->id);
        else if (s->cur != cur_of(bm, s))
            st = KVP_ERR(KVP_ESTATE, "check: seq %lld caches current block %d, table says %d", (long long)s->id, (int)s->cur,
                         (int)cur_of(bm, s));
        else if (cur_state(bm, s, &ecur, &eslot, &eleft), s->slot != eslot || s->left != eleft)
            st = KVP_ERR(KVP_ESTATE, "check: seq %lld caches next slot %d and %d fast appends, table says %d and %d",
                         (long long)s->id, (int)s->slot, (int)s->left, (int)eslot, (int)eleft);
        else if (s->ntok < 0 || s->ntok > bm->max_len)
            st = KVP_ERR(KVP_ESTATE, "check: seq %lld has %d tokens (max %d)", (long long)s->id, (int)s->ntok, (int)bm->max_len);
        else if (s->nblocks < blocks_for(bm, s->ntok) || s->nblocks > s->cap)
            st = KVP_ERR(KVP_ESTATE, "check: seq %lld has %d blocks for %d tokens (cap %d)", (long long)s->id,
                         (int)s->nblocks, (int)s->ntok, (int)s->cap);
        for (int32_t i = 0; i < s->nblocks && st == KVP_OK; i++) {
            const int32_t b = s->blocks[i];
            if (b < 0 || b >= nb) {
                st = KVP_ERR(KVP_ESTATE, "check: seq %lld block %d = %d out of the %s pool", (long long)s->id, (int)i, (int)b, name);
                break;
            }
            if (lastq[b] == (int32_t)q + 1) {
                st = KVP_ERR(KVP_ESTATE, "check: seq %lld holds block %d twice", (long long)s->id, (int)b);
                break;
            }
            lastq[b] = (int32_t)q + 1;
            const int32_t v = view_of(bm, s->ntok, i);
            cnt[b]++;
            if (cnt[b] == 1 || v > mx[b]) {
                mx[b] = v;
                mxc[b] = 1;
            } else if (v == mx[b]) {
                mxc[b]++;
            }
        }
    }
    int64_t used = 0, empty = 0, tokens = 0;
    for (int32_t b = 0; b < nb && st == KVP_OK; b++) {
        const int32_t rc = d->pool->refcnt[b];
        if (cnt[b] != d->seqref[b])
            st = KVP_ERR(KVP_ESTATE, "check: %s block %d is in %d tables but seqref says %d", name, (int)b, (int)cnt[b],
                         (int)d->seqref[b]);
        else if (rc < cnt[b])
            st = KVP_ERR(KVP_ESTATE, "check: %s block %d has refcount %d < %d table references", name, (int)b, (int)rc, (int)cnt[b]);
        else if (cnt[b] > 0 && (d->fill[b] != mx[b] || d->fillcnt[b] != mxc[b]))
            st = KVP_ERR(KVP_ESTATE, "check: %s block %d fill %d x%d, recomputed %d x%d", name, (int)b, (int)d->fill[b],
                         (int)d->fillcnt[b], (int)mx[b], (int)mxc[b]);
        else if (d->isdirty[b] || d->remap[b] != -1)
            st = KVP_ERR(KVP_ESTATE, "check: %s block %d has stale scratch state", name, (int)b);
        if (cnt[b] > 0) {
            used++;
            empty += mx[b] == 0;
            tokens += mx[b];
            if (mx[b] < 0 || mx[b] > bs) st = KVP_ERR(KVP_ESTATE, "check: %s block %d fill %d", name, (int)b, (int)mx[b]);
        }
    }
    kvp_free(cnt);
    if (st != KVP_OK) return st;
    if (d->ndirty != 0) return KVP_ERR(KVP_ESTATE, "check: %s side has %d dirty blocks left", name, (int)d->ndirty);
    if (used != d->n_used || empty != d->n_empty || tokens != d->tokens || logical != d->logical || nseqs != d->nseqs)
        return KVP_ERR(KVP_ESTATE,
                       "check: %s counters used/empty/tokens/logical/seqs = %lld/%lld/%lld/%lld/%d, recomputed "
                       "%lld/%lld/%lld/%lld/%lld",
                       name, (long long)d->n_used, (long long)d->n_empty, (long long)d->tokens, (long long)d->logical,
                       (int)d->nseqs, (long long)used, (long long)empty, (long long)tokens, (long long)logical,
                       (long long)nseqs);
    kvp_kv_accounting a;
    kvp_bm_account(bm, si == HOST, &a);
    if (kvp_kv_accounting_residual(&a) != 0 || a.internal_frag < 0 || a.cached < 0 || a.shared_savings < 0)
        return KVP_ERR(KVP_ESTATE, "check: %s accounting identity fails (residual %lld, internal %lld, cached %lld, savings %lld)",
                       name, (long long)kvp_kv_accounting_residual(&a), (long long)a.internal_frag, (long long)a.cached,
                       (long long)a.shared_savings);
    return KVP_OK;
}

kvp_status kvp_bm_check(const kvp_block_mgr *bm)
{
    if (bm->map.count != (int32_t)bm->nseqs)
        return KVP_ERR(KVP_ESTATE, "check: id map holds %d ids for %zu sequences", (int)bm->map.count, bm->nseqs);
    for (size_t q = 0; q < bm->nseqs; q++)
        if (kvp_idmap_get(&bm->map, bm->seqs[q].id) != (int32_t)q)
            return KVP_ERR(KVP_ESTATE, "check: id map does not find seq %lld at %zu", (long long)bm->seqs[q].id, q);
    KVP_TRY(check_side(bm, DEV));
    if (bm->side[HOST].pool) KVP_TRY(check_side(bm, HOST));
    const int32_t nd = bm->side[DEV].pool->num_blocks, nh = bm->side[HOST].pool ? bm->side[HOST].pool->num_blocks : 0;
    for (size_t k = 0; k < bm->ops[OP_COPY].n; k++) {
        const kvp_block_copy c = bm->ops[OP_COPY].v[k];
        if (c.src < 0 || c.src >= nd || c.dst < 0 || c.dst >= nd || c.src == c.dst)
            return KVP_ERR(KVP_ESTATE, "check: bad copy (%d -> %d)", (int)c.src, (int)c.dst);
    }
    for (int w = 0; w < 2; w++)
        for (size_t k = 0; k < bm->ops[w].n; k++) {
            const kvp_block_copy c = bm->ops[w].v[k];
            const int32_t ns = w == OP_SWAP_OUT ? nd : nh, ndst = w == OP_SWAP_OUT ? nh : nd;
            if (c.src < 0 || c.src >= ns || c.dst < 0 || c.dst >= ndst)
                return KVP_ERR(KVP_ESTATE, "check: bad swap move (%d -> %d)", (int)c.src, (int)c.dst);
        }
    return KVP_OK;
}
