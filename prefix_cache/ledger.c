/* prefix_cache/ledger.c — the miss ledger (contract in ledger.h).
 *
 *   recs[r] { hash, parent, len, tok -> the arena's tokens [tok, tok+len), flags, times }
 *     by_hash:   hash -> r        full blocks under their chain hash; partial tails under a salted hash of
 *                                 (parent, their tokens)
 *     by_start:  (parent, first token) -> r, several per key: the contents computed after a prefix, for the
 *                longest common prefix of a missed block with anything computed there
 * A full block's parent is the chain hash of the block before it, or the root key (the extra key's) for a first
 * block, so parent + tokens name a content exactly as the chain hash does.
 *
 * The arena holds the records' tokens in chunks that never move (doubling from 4,096 tokens to 1 M, and at least
 * a block each; a record lies in one chunk): the history grows without copying what it holds. tok is the chunk's
 * index << 32 | the offset in it.
 */
#include "prefix_cache/ledger.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"

enum {
    R_FULL = 1,        /* a full block (else a partial tail) */
    R_CACHED = 2,      /* in the device cache now */
    R_EVER_CACHED = 4, /* was cached at some time */
    R_HOST = 8,        /* was copied to the host tier */
    R_FLUSHED = 16,    /* its last removal was a flush */
};

/* ---- the token arena ------------------------------------------------------------------------------ */

typedef struct {
    int32_t **ch;     /* [n] chunks; chunk i holds chunk_tokens(i) tokens */
    size_t n, cap;    /* chunks allocated, room in ch */
    int64_t cur, used; /* the chunk being filled (index < n once one is allocated) and its tokens used */
    int64_t total;    /* tokens stored */
    int32_t bs;       /* the longest piece: every record is at most a block */
} tok_arena;

static int64_t chunk_tokens(const tok_arena *a, size_t i)
{
    const int64_t t = i < 8 ? (int64_t)4096 << i : (int64_t)1 << 20;
    return t > a->bs ? t : a->bs;
}

static void arena_fini(tok_arena *a)
{
    for (size_t i = 0; i < a->n; i++) kvp_free(a->ch[i]);
    kvp_free(a->ch);
    memset(a, 0, sizeof *a);
}

/* Room for k more pieces of at most bs tokens each, allocated now (puts cannot fail). Nothing changes on failure
 * but chunks added for later. */
static kvp_status arena_reserve(tok_arena *a, int64_t k)
{
    int64_t fit = (int64_t)a->n > a->cur ? (chunk_tokens(a, (size_t)a->cur) - a->used) / a->bs : 0;
    for (size_t i = (size_t)a->cur + 1; i < a->n; i++) fit += chunk_tokens(a, i) / a->bs;
    while (fit < k) {
        if (kvp_grow((void **)&a->ch, &a->cap, a->n + 1, sizeof *a->ch) != KVP_OK) return KVP_ENOMEM;
        int32_t *c = kvp_malloc((size_t)chunk_tokens(a, a->n) * sizeof *c);
        if (c == NULL) return KVP_ENOMEM;
        fit += chunk_tokens(a, a->n) / a->bs;
        a->ch[a->n++] = c;
    }
    return KVP_OK;
}

/* Stores t[0..len) (1 <= len <= bs, room reserved); returns where. */
static int64_t arena_put(tok_arena *a, const int32_t *t, int32_t len)
{
    if (a->used + len > chunk_tokens(a, (size_t)a->cur)) a->cur++, a->used = 0;
    const int64_t at = a->cur << 32 | a->used;
    memcpy(a->ch[a->cur] + a->used, t, (size_t)len * sizeof *t);
    a->used += len;
    a->total += len;
    return at;
}

static const int32_t *arena_at(const tok_arena *a, int64_t tok)
{
    return a->ch[tok >> 32] + (tok & 0xffffffff);
}

/* tok names len tokens inside one stored chunk, before the fill point. */
static int arena_holds(const tok_arena *a, int64_t tok, int32_t len)
{
    const int64_t c = tok >> 32, off = tok & 0xffffffff;
    return tok >= 0 && c < (int64_t)a->n && c <= a->cur && len >= 1 && off + len <= (c < a->cur ? chunk_tokens(a, (size_t)c) : a->used);
}

/* ---- records ------------------------------------------------------------------------------------- */

typedef struct {
    uint64_t hash, parent;
    int64_t tok;    /* in the arena: chunk << 32 | offset */
    int32_t len;    /* tokens */
    uint32_t flags;
    double t_store, t_access, evict_idle;
} rec;

struct kvp_ledger {
    int32_t bs;
    int64_t max_records;
    double now;
    kvp_prefix_cache *pc;
    rec *recs;
    size_t recs_cap;
    int64_t nrecs;
    tok_arena arena;
    pc_map by_hash, by_start;
    uint64_t *h; /* scratch: chain hashes of a sequence */
    size_t h_cap;
    kvp_ledger_stats st;
    kvp_status err; /* kept from the listener */
    char errmsg[200];
};

static const char *const k_class_names[KVP_MISS_CLASSES] = {"cold", "evicted", "last_token", "partial", "preempted", "host"};

const char *kvp_miss_class_name(kvp_miss_class c)
{
    return (unsigned)c < KVP_MISS_CLASSES ? k_class_names[c] : "?";
}

/* ---- histograms ---------------------------------------------------------------------------------- */

/* 0.001, 0.002, 0.005, 0.01, ..., 5e6, 1e7: 31 finite bounds, then +inf */
static const double k_bounds[KVP_HIST_BUCKETS - 1] = {
    1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3,
    1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7};

double kvp_hist_bound(int i)
{
    if (i < 0) return 0;
    return i >= KVP_HIST_BUCKETS - 1 ? INFINITY : k_bounds[i];
}

void kvp_hist_add(kvp_hist *h, double x)
{
    if (!(x > 0)) x = 0;
    int lo = 0, hi = KVP_HIST_BUCKETS - 1; /* the first bucket whose bound is >= x (hi: +inf) */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (x <= k_bounds[mid]) hi = mid;
        else lo = mid + 1;
    }
    const int i = lo;
    h->counts[i]++;
    h->n++;
    h->sum += x;
}

double kvp_hist_quantile(const kvp_hist *h, double q)
{
    if (h->n == 0) return 0;
    const double want = q * (double)h->n;
    int64_t below = 0;
    for (int i = 0; i < KVP_HIST_BUCKETS; i++) {
        if (h->counts[i] > 0 && (double)(below + h->counts[i]) >= want) {
            const double lo = i ? kvp_hist_bound(i - 1) : 0, hi = kvp_hist_bound(i);
            if (isinf(hi)) return lo;
            return lo + (hi - lo) * ((want - (double)below) / (double)h->counts[i]);
        }
        below += h->counts[i];
    }
    return kvp_hist_bound(KVP_HIST_BUCKETS - 2);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t root_key(uint64_t extra)
{
    return extra ? mix(extra ^ 0x6b76706167654c47ull) : 0;
}

static uint64_t start_key(uint64_t parent, int32_t first)
{
    return mix(parent ^ mix((uint64_t)(uint32_t)first + 0x51ull));
}

static uint64_t partial_hash(uint64_t parent, const int32_t *t, int32_t r, int32_t bs)
{
    return kvp_pc_block_hash(parent, t, r, 0) ^ mix((uint64_t)bs << 32 | (uint64_t)r);
}

static int64_t find(const kvp_ledger *lg, uint64_t h, uint32_t full)
{
    for (int64_t s = pc_map_first(&lg->by_hash, h); s >= 0; s = pc_map_next(&lg->by_hash, h, s)) {
        const rec *r = &lg->recs[lg->by_hash.slots[s].val];
        if ((r->flags & R_FULL) == full) return lg->by_hash.slots[s].val;
    }
    return -1;
}

/* Room for k more records: nothing changes on failure (but room made for later). */
static kvp_status reserve(kvp_ledger *lg, int64_t k)
{
    if (kvp_grow((void **)&lg->recs, &lg->recs_cap, (size_t)(lg->nrecs + k), sizeof *lg->recs) != KVP_OK ||
        arena_reserve(&lg->arena, k) != KVP_OK ||
        pc_map_reserve(&lg->by_hash, (size_t)k) != KVP_OK || pc_map_reserve(&lg->by_start, (size_t)k) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "miss ledger: out of memory for %lld more blocks of history", (long long)k);
    return KVP_OK;
}

/* Adds a record (room reserved). */
static int64_t add(kvp_ledger *lg, uint64_t hash, uint64_t parent, const int32_t *t, int32_t len, uint32_t flags)
{
    const int64_t r = lg->nrecs++;
    rec *x = &lg->recs[r];
    memset(x, 0, sizeof *x);
    x->hash = hash;
    x->parent = parent;
    x->len = len;
    x->flags = flags;
    x->tok = arena_put(&lg->arena, t, len);
    pc_map_put(&lg->by_hash, hash, (int32_t)r);
    pc_map_put(&lg->by_start, start_key(parent, t[0]), (int32_t)r);
    return r;
}

/* The longest common prefix of t[0..limit) with any content computed after `parent`. */
static int32_t longest_seen(const kvp_ledger *lg, uint64_t parent, const int32_t *t, int32_t limit)
{
    const uint64_t key = start_key(parent, t[0]);
    int32_t best = 0;
    for (int64_t s = pc_map_first(&lg->by_start, key); s >= 0; s = pc_map_next(&lg->by_start, key, s)) {
        const rec *r = &lg->recs[lg->by_start.slots[s].val];
        if (r->parent != parent) continue;
        const int32_t *u = arena_at(&lg->arena, r->tok);
        const int32_t m = r->len < limit ? r->len : limit;
        int32_t l = 0;
        while (l < m && u[l] == t[l]) l++;
        if (l > best) best = l;
    }
    return best;
}

/* Forgets the history of every block not cached now (max_records reached). */
static kvp_status forget(kvp_ledger *lg)
{
    int64_t keep = 0;
    for (int64_t r = 0; r < lg->nrecs; r++) keep += (lg->recs[r].flags & R_CACHED) != 0;
    rec *recs = kvp_malloc((size_t)(keep ? keep : 1) * sizeof *recs);
    tok_arena arena = {.bs = lg->bs};
    pc_map bh = {0}, bs = {0};
    if (recs == NULL || arena_reserve(&arena, keep) != KVP_OK || pc_map_reserve(&bh, (size_t)keep) != KVP_OK ||
        pc_map_reserve(&bs, (size_t)keep) != KVP_OK) {
        kvp_free(recs);
        arena_fini(&arena);
        pc_map_fini(&bh);
        pc_map_fini(&bs);
        return KVP_ERR(KVP_ENOMEM, "miss ledger: out of memory forgetting its history");
    }
    int64_t n = 0;
    for (int64_t r = 0; r < lg->nrecs; r++) {
        const rec *x = &lg->recs[r];
        if (!(x->flags & R_CACHED)) continue;
        const int32_t *t = arena_at(&lg->arena, x->tok);
        recs[n] = *x;
        recs[n].tok = arena_put(&arena, t, x->len);
        pc_map_put(&bh, x->hash, (int32_t)n);
        pc_map_put(&bs, start_key(x->parent, t[0]), (int32_t)n);
        n++;
    }
    kvp_free(lg->recs);
    arena_fini(&lg->arena);
    pc_map_fini(&lg->by_hash);
    pc_map_fini(&lg->by_start);
    lg->recs = recs;
    lg->recs_cap = (size_t)(keep ? keep : 1);
    lg->arena = arena;
    lg->nrecs = n;
    lg->by_hash = bh;
    lg->by_start = bs;
    lg->st.forgets++;
    return KVP_OK;
}

/* Before adding up to k records: forgets when the cap would be passed. */
static kvp_status make_room(kvp_ledger *lg, int64_t k)
{
    if (lg->max_records > 0 && lg->nrecs + k > lg->max_records) KVP_TRY(forget(lg));
    return KVP_OK;
}

static kvp_status kept(const kvp_ledger *lg)
{
    return lg->err == KVP_OK ? KVP_OK : KVP_ERR(lg->err, "%s", lg->errmsg);
}

/* ---- the listener -------------------------------------------------------------------------------- */

static void removed(kvp_ledger *lg, rec *x, int flush)
{
    x->flags &= ~(uint32_t)(R_CACHED | R_FLUSHED);
    if (flush) x->flags |= R_FLUSHED;
    x->evict_idle = lg->now - x->t_access;
    kvp_hist_add(&lg->st.lifetime, lg->now - x->t_store);
    kvp_hist_add(&lg->st.idle_before_evict, x->evict_idle);
}

static void on_event(void *ctx, const kvp_pc_event *e)
{
    kvp_ledger *lg = ctx;
    if (e->kind == KVP_PC_EV_CLEARED) {
        for (int64_t r = 0; r < lg->nrecs; r++)
            if (lg->recs[r].flags & R_CACHED) removed(lg, &lg->recs[r], 1);
        return;
    }
    if (e->kind == KVP_PC_EV_REMOVED) {
        for (int32_t i = 0; i < e->n; i++) {
            int64_t r = find(lg, e->hashes[i], R_FULL);
            if (r >= 0 && (lg->recs[r].flags & R_CACHED)) removed(lg, &lg->recs[r], e->flush);
        }
        return;
    }
    if (lg->err != KVP_OK) return;
    kvp_status st = make_room(lg, e->n);
    if (st == KVP_OK) st = reserve(lg, e->n);
    if (st != KVP_OK) {
        lg->err = st;
        snprintf(lg->errmsg, sizeof lg->errmsg, "%s", kvp_error_message());
        return;
    }
    for (int32_t i = 0; i < e->n; i++) {
        int64_t r = find(lg, e->hashes[i], R_FULL);
        if (r < 0) {
            const uint64_t parent = i > 0 ? e->hashes[i - 1] : e->depth > 0 ? e->parent_hash : root_key(e->extra_key);
            r = add(lg, e->hashes[i], parent, e->tokens + (size_t)i * lg->bs, lg->bs, R_FULL);
        }
        rec *x = &lg->recs[r];
        x->flags |= R_CACHED | R_EVER_CACHED;
        x->t_store = x->t_access = lg->now;
    }
}

/* ---- public -------------------------------------------------------------------------------------- */

kvp_status kvp_ledger_create(int32_t block_size, int64_t max_records, kvp_ledger **out)
{
    if (out == NULL || block_size < 1 || max_records < 0)
        return KVP_ERR(KVP_EINVAL, "kvp_ledger_create: block size %d, max_records %lld", block_size, (long long)max_records);
    kvp_ledger *lg = kvp_calloc(1, sizeof *lg);
    if (lg == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory for a miss ledger");
    lg->bs = block_size;
    lg->arena.bs = block_size;
    lg->max_records = max_records;
    *out = lg;
    return KVP_OK;
}

void kvp_ledger_destroy(kvp_ledger *lg)
{
    if (lg == NULL) return;
    kvp_ledger_detach(lg);
    kvp_free(lg->recs);
    arena_fini(&lg->arena);
    kvp_free(lg->h);
    pc_map_fini(&lg->by_hash);
    pc_map_fini(&lg->by_start);
    kvp_free(lg);
}

kvp_status kvp_ledger_attach(kvp_ledger *lg, kvp_prefix_cache *pc)
{
    if (lg == NULL) return KVP_ERR(KVP_EINVAL, "kvp_ledger_attach: NULL ledger");
    return pc_follow(&lg->pc, pc, lg->bs, on_event, lg, "a miss ledger");
}

void kvp_ledger_detach(kvp_ledger *lg)
{
    if (lg) pc_unfollow(&lg->pc, on_event, lg);
}

void kvp_ledger_set_time(kvp_ledger *lg, double now)
{
    lg->now = now;
}

static kvp_status hashes_of(kvp_ledger *lg, const int32_t *tokens, int32_t nb, uint64_t extra)
{
    if (kvp_grow((void **)&lg->h, &lg->h_cap, (size_t)(nb ? nb : 1), sizeof *lg->h) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "miss ledger: out of memory hashing %d blocks", nb);
    kvp_pc_chain_hashes(tokens, nb, lg->bs, extra, lg->h);
    return KVP_OK;
}

kvp_status kvp_ledger_lookup(kvp_ledger *lg, const int32_t *tokens, int32_t n_tokens, uint64_t extra_key, int32_t n_hit,
                             int32_t n_host, int readmission, int64_t miss_out[KVP_MISS_CLASSES])
{
    if (lg == NULL || n_tokens < 1 || tokens == NULL || n_hit < 0 || n_host < 0)
        return KVP_ERR(KVP_EINVAL, "kvp_ledger_lookup: bad arguments (%d tokens, %d hit, %d host)", n_tokens, n_hit, n_host);
    const int32_t bs = lg->bs, full = n_tokens / bs, maxb = (n_tokens - 1) / bs, nblocks = (n_tokens + bs - 1) / bs;
    if (n_hit + n_host > maxb)
        return KVP_ERR(KVP_EINVAL, "kvp_ledger_lookup: %d + %d blocks found, but a match of %d tokens returns at most %d",
                       n_hit, n_host, n_tokens, maxb);
    KVP_TRY(kept(lg));
    KVP_TRY(hashes_of(lg, tokens, full, extra_key));
    int64_t miss[KVP_MISS_CLASSES] = {0};
    kvp_ledger_stats *st = &lg->st;
    for (int32_t i = 0; i < n_hit; i++) { /* the hits' accesses */
        if (i + 8 < n_hit) pc_map_prefetch(&lg->by_hash, lg->h[i + 8]);
        const int64_t r = find(lg, lg->h[i], R_FULL);
        if (r < 0 || !(lg->recs[r].flags & R_CACHED)) continue; /* cached before the ledger followed the cache */
        kvp_hist_add(&st->reuse_gap, lg->now - lg->recs[r].t_access);
        lg->recs[r].t_access = lg->now;
    }
    const int32_t found = n_hit + n_host, missed = n_tokens - found * bs;
    if (readmission) {
        st->readmissions++;
        st->readmitted_tokens += n_tokens;
        st->readmit_hit_tokens += (int64_t)found * bs;
        miss[KVP_MISS_PREEMPTED] = missed;
    } else {
        st->lookups++;
        st->prompt_tokens += n_tokens;
        st->hit_tokens += (int64_t)n_hit * bs;
        st->host_hit_tokens += (int64_t)n_host * bs;
        for (int32_t k = found; k < nblocks; k++) {
            const int32_t len = k < full ? bs : n_tokens - k * bs;
            const uint64_t parent = k > 0 ? lg->h[k - 1] : root_key(extra_key);
            const int64_t r = k < full ? find(lg, lg->h[k], R_FULL) : -1;
            if (r < 0) { /* never computed as this full block: the tokens seen before are partial, then cold */
                const int32_t seen = longest_seen(lg, parent, tokens + (size_t)k * bs, len);
                miss[KVP_MISS_PARTIAL] += seen;
                miss[KVP_MISS_COLD] += n_tokens - k * bs - seen; /* nothing after it was computed either */
                break;
            }
            const rec *x = &lg->recs[r];
            if (k == maxb && (x->flags & R_CACHED) && k == found) miss[KVP_MISS_LAST_TOKEN] += len;
            else if (x->flags & R_CACHED) miss[KVP_MISS_EVICTED] += len; /* unreachable: an earlier block is gone */
            else if (!(x->flags & R_EVER_CACHED)) {
                miss[KVP_MISS_EVICTED] += len;
                st->evicted_uncached_tokens += len;
            } else {
                miss[(x->flags & R_HOST) ? KVP_MISS_HOST : KVP_MISS_EVICTED] += len;
                if ((x->flags & (R_HOST | R_FLUSHED)) == R_FLUSHED) st->evicted_flush_tokens += len;
                kvp_hist_add(&st->miss_evicted_age, x->evict_idle);
            }
        }
    }
    for (int c = 0; c < KVP_MISS_CLASSES; c++) {
        st->miss_tokens[c] += miss[c];
        if (miss_out) miss_out[c] += miss[c];
    }
    return KVP_OK;
}

kvp_status kvp_ledger_computed(kvp_ledger *lg, const int32_t *tokens, int32_t n_tokens, uint64_t extra_key)
{
    if (lg == NULL || n_tokens < 0 || (n_tokens > 0 && tokens == NULL))
        return KVP_ERR(KVP_EINVAL, "kvp_ledger_computed: bad arguments (%d tokens)", n_tokens);
    KVP_TRY(kept(lg));
    if (n_tokens == 0) return KVP_OK;
    const int32_t bs = lg->bs, full = n_tokens / bs, tail = n_tokens - full * bs;
    KVP_TRY(hashes_of(lg, tokens, full, extra_key));
    const uint64_t tparent = full > 0 ? lg->h[full - 1] : root_key(extra_key);
    const uint64_t th = tail ? partial_hash(tparent, tokens + (size_t)full * bs, tail, bs) : 0;
    /* what is new, so that room is made before anything changes (counted again after a forget) */
    int64_t fresh = 0;
    int new_tail = 0;
    for (int pass = 0; pass < 2; pass++) {
        fresh = 0;
        for (int32_t i = 0; i < full; i++) {
            if (i + 8 < full) pc_map_prefetch(&lg->by_hash, lg->h[i + 8]);
            fresh += find(lg, lg->h[i], R_FULL) < 0;
        }
        new_tail = tail && find(lg, th, 0) < 0;
        if (pass == 0 && fresh + new_tail > 0 && lg->max_records > 0 && lg->nrecs + fresh + new_tail > lg->max_records)
            KVP_TRY(forget(lg));
        else break;
    }
    if (fresh + new_tail == 0) return KVP_OK;
    KVP_TRY(reserve(lg, fresh + new_tail));
    for (int32_t i = 0; fresh > 0 && i < full; i++)
        if (find(lg, lg->h[i], R_FULL) < 0)
            add(lg, lg->h[i], i > 0 ? lg->h[i - 1] : root_key(extra_key), tokens + (size_t)i * bs, bs, R_FULL);
    if (new_tail) add(lg, th, tparent, tokens + (size_t)full * bs, tail, 0);
    return KVP_OK;
}

void kvp_ledger_host_stored(kvp_ledger *lg, const uint64_t *hashes, int32_t n)
{
    for (int32_t i = 0; lg && i < n; i++) {
        const int64_t r = find(lg, hashes[i], R_FULL);
        if (r >= 0) lg->recs[r].flags |= R_HOST;
    }
}

void kvp_ledger_get_stats(const kvp_ledger *lg, kvp_ledger_stats *out)
{
    *out = lg->st;
    out->records = lg->nrecs;
    out->history_tokens = lg->arena.total;
}

static kvp_status check_hist(const kvp_hist *h, const char *name)
{
    int64_t n = 0;
    for (int i = 0; i < KVP_HIST_BUCKETS; i++) n += h->counts[i];
    if (n != h->n || h->sum < 0) return KVP_ERR(KVP_ESTATE, "ledger: histogram %s counts %lld of %lld samples", name, (long long)n, (long long)h->n);
    return KVP_OK;
}

kvp_status kvp_ledger_check(const kvp_ledger *lg)
{
    const kvp_ledger_stats *s = &lg->st;
    int64_t sum = s->hit_tokens + s->host_hit_tokens;
    for (int c = 0; c < KVP_MISS_CLASSES; c++) sum += c == KVP_MISS_PREEMPTED ? 0 : s->miss_tokens[c];
    if (sum != s->prompt_tokens)
        return KVP_ERR(KVP_ESTATE, "ledger: hits and misses sum to %lld of %lld prompt tokens", (long long)sum, (long long)s->prompt_tokens);
    if (s->readmit_hit_tokens + s->miss_tokens[KVP_MISS_PREEMPTED] != s->readmitted_tokens)
        return KVP_ERR(KVP_ESTATE, "ledger: readmission hits and misses do not sum to the readmitted tokens");
    if (s->evicted_flush_tokens + s->evicted_uncached_tokens > s->miss_tokens[KVP_MISS_EVICTED])
        return KVP_ERR(KVP_ESTATE, "ledger: parts of the evicted class exceed it");
    if ((int64_t)lg->by_hash.n != lg->nrecs || (int64_t)lg->by_start.n != lg->nrecs)
        return KVP_ERR(KVP_ESTATE, "ledger: %lld records, maps hold %zu and %zu", (long long)lg->nrecs, lg->by_hash.n, lg->by_start.n);
    int64_t toks = 0;
    for (int64_t r = 0; r < lg->nrecs; r++) {
        const rec *x = &lg->recs[r];
        if (!arena_holds(&lg->arena, x->tok, x->len) || ((x->flags & R_FULL) != 0) != (x->len == lg->bs))
            return KVP_ERR(KVP_ESTATE, "ledger: record %lld has tokens [%lld, +%d)", (long long)r, (long long)x->tok, x->len);
        if ((x->flags & R_CACHED) && !(x->flags & R_EVER_CACHED)) return KVP_ERR(KVP_ESTATE, "ledger: record %lld cached but never cached", (long long)r);
        int found = 0;
        for (int64_t sl = pc_map_first(&lg->by_hash, x->hash); sl >= 0; sl = pc_map_next(&lg->by_hash, x->hash, sl))
            found += lg->by_hash.slots[sl].val == (int32_t)r;
        const uint64_t sk = start_key(x->parent, arena_at(&lg->arena, x->tok)[0]);
        for (int64_t sl = pc_map_first(&lg->by_start, sk); sl >= 0; sl = pc_map_next(&lg->by_start, sk, sl))
            found += 2 * (lg->by_start.slots[sl].val == (int32_t)r);
        if (found != 3) return KVP_ERR(KVP_ESTATE, "ledger: record %lld is not indexed exactly once in both maps", (long long)r);
        toks += x->len;
    }
    if (toks != lg->arena.total)
        return KVP_ERR(KVP_ESTATE, "ledger: records hold %lld of %lld arena tokens", (long long)toks, (long long)lg->arena.total);
    KVP_TRY(check_hist(&s->lifetime, "lifetime"));
    KVP_TRY(check_hist(&s->idle_before_evict, "idle_before_evict"));
    KVP_TRY(check_hist(&s->reuse_gap, "reuse_gap"));
    return check_hist(&s->miss_evicted_age, "miss_evicted_age");
}
