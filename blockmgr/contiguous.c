/* blockmgr/contiguous.c — contiguous reservations in one arena (Orca baselines), first-fit or buddy.
 *
 * Holes are kept sorted by offset in an array. First-fit: always merged with their neighbours. Buddy: each
 * hole is a free power-of-two block aligned to its size; a free merges it with its buddy, which (blocks
 * being aligned and holes sorted) can only be the hole just before or just after it. A free adds at most
 * one hole, so room for nholes + nreqs + 1 holes is kept (secured when a request is admitted, counting the
 * splits a buddy reservation makes) and kvp_contig_free never allocates (it cannot fail for a known id).
 *
 * Buddy placement, as the paper's Orca emulation allocated: the arena is cut into power-of-two top-level
 * blocks, largest first (capacity 14648 = 8192 + 4096 + 2048 + 256 + 32 + 16 + 8); a reservation takes
 * the smallest free block that fits, split in halves down to its rounded size, and a freed block merges
 * with its buddy (offset XOR size) while that one is free and the same size.
 */
#include "blockmgr/contiguous.h"

#include <stdlib.h>
#include <string.h>

#include "blockmgr/id_map_internal.h"
#include "common/alloc.h"

typedef struct {
    int64_t off, len;
} hole_t;

typedef struct {
    int64_t id, off, len, used, final; /* final <= 0: unknown */
    int64_t blk;                       /* slots taken from the arena: len (first-fit), its power of two (buddy) */
} req_t;

struct kvp_contig {
    int64_t capacity;
    kvp_contig_placement placement;
    int64_t max_reserve; /* capacity, or the largest top-level buddy block */
    hole_t *holes; /* sorted by off */
    size_t nholes, cap_holes;
    req_t *reqs;
    size_t nreqs, cap_reqs;
    kvp_idmap map;
    int64_t sum_len, sum_used, sum_final; /* sum_final: sum of effective final lengths */
    int64_t sum_blk;
};

kvp_status kvp_contig_policy_parse(const char *s, kvp_contig_policy *out)
{
    if (s && strcmp(s, "max") == 0) *out = KVP_CONTIG_MAX;
    else if (s && strcmp(s, "pow2") == 0) *out = KVP_CONTIG_POW2;
    else if (s && strcmp(s, "oracle") == 0) *out = KVP_CONTIG_ORACLE;
    else return KVP_ERR(KVP_EINVAL, "unknown contiguous policy '%s' (expected max, pow2 or oracle)", s ? s : "(null)");
    return KVP_OK;
}

const char *kvp_contig_policy_name(kvp_contig_policy p)
{
    switch (p) {
    case KVP_CONTIG_MAX: return "max";
    case KVP_CONTIG_POW2: return "pow2";
    case KVP_CONTIG_ORACLE: return "oracle";
    }
    return "?";
}

kvp_status kvp_contig_placement_parse(const char *s, kvp_contig_placement *out)
{
    if (s && strcmp(s, "first-fit") == 0) *out = KVP_CONTIG_FIRST_FIT;
    else if (s && strcmp(s, "buddy") == 0) *out = KVP_CONTIG_BUDDY;
    else return KVP_ERR(KVP_EINVAL, "unknown arena placement '%s' (expected buddy or first-fit)", s ? s : "(null)");
    return KVP_OK;
}

const char *kvp_contig_placement_name(kvp_contig_placement p) { return p == KVP_CONTIG_BUDDY ? "buddy" : "first-fit"; }

static int64_t pow2_at_least(int64_t n)
{
    int64_t r = 1;
    while (r < n) r <<= 1;
    return r;
}

kvp_status kvp_contig_reserve_len(kvp_contig_policy p, int64_t max_model_len, int64_t prompt_len, int64_t output_len,
                                  int64_t *out)
{
    if (max_model_len < 1) return KVP_ERR(KVP_EINVAL, "reserve length: max_model_len must be >= 1, got %lld", (long long)max_model_len);
    if (prompt_len < 0 || output_len < 1 || prompt_len + output_len > max_model_len)
        return KVP_ERR(KVP_EINVAL, "reserve length: prompt %lld + output %lld tokens (output >= 1) outside [1, max_model_len %lld]",
                       (long long)prompt_len, (long long)output_len, (long long)max_model_len);
    switch (p) {
    case KVP_CONTIG_MAX: *out = max_model_len; return KVP_OK;
    case KVP_CONTIG_ORACLE: *out = prompt_len + output_len; return KVP_OK;
    case KVP_CONTIG_POW2: {
        int64_t r = prompt_len + pow2_at_least(output_len);
        *out = r < max_model_len ? r : max_model_len;
        return KVP_OK;
    }
    }
    return KVP_ERR(KVP_EINVAL, "reserve length: unknown policy %d", (int)p);
}

static int64_t eff_final(const req_t *r)
{
    int64_t f = r->final > 0 && r->final < r->len ? r->final : r->len;
    return f < r->used ? r->used : f;
}

/* Buddy: the size of the top-level block holding slot off (top-level blocks are the powers of two of
 * capacity's binary form, largest first, so each starts at a multiple of its size). */
static int64_t top_block(int64_t capacity, int64_t off)
{
    int64_t base = 0;
    for (int b = 62; b >= 0; b--) {
        const int64_t sz = (int64_t)1 << b;
        if (!(capacity & sz)) continue;
        if (off < base + sz) return sz;
        base += sz;
    }
    return 0;
}

kvp_status kvp_contig_create(int64_t capacity, kvp_contig_placement placement, kvp_contig **out)
{
    if (out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_contig_create: out is NULL");
    if (capacity < 1) return KVP_ERR(KVP_EINVAL, "contiguous arena: capacity must be >= 1 slot, got %lld", (long long)capacity);
    if (placement != KVP_CONTIG_FIRST_FIT && placement != KVP_CONTIG_BUDDY)
        return KVP_ERR(KVP_EINVAL, "contiguous arena: unknown placement %d", (int)placement);
    kvp_contig *c = kvp_calloc(1, sizeof *c);
    if (c == NULL) return KVP_ERR(KVP_ENOMEM, "contiguous arena: out of memory");
    c->cap_holes = 64; /* buddy: at most one top-level block per bit of capacity */
    c->holes = kvp_malloc(c->cap_holes * sizeof(hole_t));
    if (c->holes == NULL || kvp_idmap_init(&c->map) != KVP_OK) {
        kvp_free(c->holes);
        kvp_free(c);
        return KVP_ERR(KVP_ENOMEM, "contiguous arena: out of memory");
    }
    c->capacity = capacity;
    c->placement = placement;
    if (placement == KVP_CONTIG_FIRST_FIT) {
        c->holes[0] = (hole_t){0, capacity};
        c->nholes = 1;
        c->max_reserve = capacity;
    } else {
        for (int64_t off = 0; off < capacity;) {
            const int64_t sz = top_block(capacity, off);
            c->holes[c->nholes++] = (hole_t){off, sz};
            off += sz;
        }
        c->max_reserve = c->holes[0].len;
    }
    *out = c;
    return KVP_OK;
}

void kvp_contig_destroy(kvp_contig *c)
{
    if (c == NULL) return;
    kvp_free(c->holes);
    kvp_free(c->reqs);
    kvp_idmap_fini(&c->map);
    kvp_free(c);
}

/* Slots a reservation of len takes from the arena. */
static int64_t block_of(const kvp_contig *c, int64_t len) { return c->placement == KVP_CONTIG_BUDDY ? pow2_at_least(len) : len; }

/* The hole a reservation of len goes to (nholes when none): first-fit, the lowest-addressed hole that fits;
 * buddy, the smallest free block that fits, lowest address among equals. */
static size_t find_hole(const kvp_contig *c, int64_t len)
{
    const int64_t need = block_of(c, len);
    size_t best = c->nholes;
    for (size_t i = 0; i < c->nholes; i++) {
        if (c->holes[i].len < need) continue;
        if (c->placement == KVP_CONTIG_FIRST_FIT) return i;
        if (best == c->nholes || c->holes[i].len < c->holes[best].len) best = i;
    }
    return best;
}

bool kvp_contig_can_reserve(const kvp_contig *c, int64_t len)
{
    return len >= 1 && len <= c->max_reserve && find_hole(c, len) < c->nholes;
}

int64_t kvp_contig_max_reserve(const kvp_contig *c) { return c->max_reserve; }
int64_t kvp_contig_taken(const kvp_contig *c) { return c->sum_blk; }

static void hole_remove(kvp_contig *c, size_t h)
{
    memmove(&c->holes[h], &c->holes[h + 1], (c->nholes - h - 1) * sizeof(hole_t));
    c->nholes--;
}

static void hole_insert(kvp_contig *c, size_t h, hole_t x)
{
    memmove(&c->holes[h + 1], &c->holes[h], (c->nholes - h) * sizeof(hole_t));
    c->holes[h] = x;
    c->nholes++;
}

kvp_status kvp_contig_reserve(kvp_contig *c, int64_t req_id, int64_t reserve_len, int64_t final_len, int64_t *offset_out)
{
    if (reserve_len < 1 || reserve_len > c->max_reserve)
        return KVP_ERR(KVP_EINVAL, "reserve request %lld: length %lld outside [1, %lld] (the longest this %s arena holds)",
                       (long long)req_id, (long long)reserve_len, (long long)c->max_reserve, kvp_contig_placement_name(c->placement));
    if (kvp_idmap_get(&c->map, req_id) >= 0) return KVP_ERR(KVP_ESTATE, "reserve: request %lld already holds a reservation", (long long)req_id);
    const size_t h = find_hole(c, reserve_len);
    const int64_t blk = block_of(c, reserve_len);
    if (h == c->nholes)
        return KVP_ERR(KVP_ENOBLOCKS, "reserve request %lld: no hole of %lld slots (largest %lld, free %lld)", (long long)req_id,
                       (long long)blk, (long long)kvp_contig_largest_hole(c), (long long)(c->capacity - c->sum_blk));
    if (c->nreqs >= (size_t)INT32_MAX - 2) return KVP_ERR(KVP_ENOMEM, "reserve: too many requests");
    /* room: one more request, and holes for the splits (one per halving) plus one per later free */
    int splits = 0;
    for (int64_t l = c->holes[h].len; l > blk && c->placement == KVP_CONTIG_BUDDY; l >>= 1) splits++;
    KVP_TRY(kvp_idmap_reserve(&c->map, (int32_t)c->nreqs + 1));
    if (kvp_grow((void **)&c->reqs, &c->cap_reqs, c->nreqs + 1, sizeof(req_t)) != KVP_OK ||
        kvp_grow((void **)&c->holes, &c->cap_holes, c->nholes + (size_t)splits + c->nreqs + 2, sizeof(hole_t)) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "reserve request %lld: out of memory", (long long)req_id);
    /* commit; buddy: halve the block, keeping the lower half, until it has the size */
    while (c->holes[h].len > blk && c->placement == KVP_CONTIG_BUDDY) {
        c->holes[h].len >>= 1;
        hole_insert(c, h + 1, (hole_t){c->holes[h].off + c->holes[h].len, c->holes[h].len});
    }
    hole_t *ho = &c->holes[h];
    const int64_t off = ho->off;
    ho->off += blk;
    ho->len -= blk;
    if (ho->len == 0) hole_remove(c, h);
    req_t *r = &c->reqs[c->nreqs];
    *r = (req_t){req_id, off, reserve_len, 0, final_len > 0 ? final_len : 0, blk};
    kvp_idmap_put(&c->map, req_id, (int32_t)c->nreqs);
    c->nreqs++;
    c->sum_blk += blk;
    c->sum_len += reserve_len;
    c->sum_final += eff_final(r);
    if (offset_out) *offset_out = off;
    return KVP_OK;
}

kvp_status kvp_contig_grow(kvp_contig *c, int64_t req_id, int64_t n)
{
    int32_t i = kvp_idmap_get(&c->map, req_id);
    if (i < 0) return KVP_ERR(KVP_ENOTFOUND, "grow: unknown request %lld", (long long)req_id);
    req_t *r = &c->reqs[i];
    if (n < 0 || n > r->len - r->used)
        return KVP_ERR(KVP_EINVAL, "grow request %lld by %lld: %lld of %lld reserved slots used", (long long)req_id, (long long)n,
                       (long long)r->used, (long long)r->len);
    c->sum_final -= eff_final(r);
    r->used += n;
    c->sum_used += n;
    c->sum_final += eff_final(r);
    return KVP_OK;
}

kvp_status kvp_contig_free(kvp_contig *c, int64_t req_id)
{
    int32_t i = kvp_idmap_get(&c->map, req_id);
    if (i < 0) return KVP_ERR(KVP_ENOTFOUND, "free: unknown request %lld (never reserved or already freed)", (long long)req_id);
    const req_t r = c->reqs[i];
    c->sum_blk -= r.blk;
    c->sum_len -= r.len;
    c->sum_used -= r.used;
    c->sum_final -= eff_final(&r);
    kvp_idmap_del(&c->map, req_id);
    const size_t last = c->nreqs - 1;
    if ((size_t)i != last) {
        c->reqs[i] = c->reqs[last];
        kvp_idmap_put(&c->map, c->reqs[i].id, i);
    }
    c->nreqs--;
    /* insert the hole [r.off, r.off + r.blk) at its sorted place */
    size_t lo = 0, hi = c->nholes;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->holes[mid].off < r.off) lo = mid + 1;
        else hi = mid;
    }
    if (c->placement == KVP_CONTIG_BUDDY) {
        hole_insert(c, lo, (hole_t){r.off, r.blk});
        for (;;) { /* merge with the buddy while it is free and of the same size */
            const hole_t x = c->holes[lo];
            const int64_t bud = x.off ^ x.len;
            if (bud < x.off && lo > 0 && c->holes[lo - 1].off == bud && c->holes[lo - 1].len == x.len) {
                c->holes[lo - 1].len *= 2;
                hole_remove(c, lo);
                lo--;
            } else if (bud > x.off && lo + 1 < c->nholes && c->holes[lo + 1].off == bud && c->holes[lo + 1].len == x.len) {
                c->holes[lo].len *= 2;
                hole_remove(c, lo + 1);
            } else {
                break;
            }
        }
        return KVP_OK;
    }
    const bool merge_prev = lo > 0 && c->holes[lo - 1].off + c->holes[lo - 1].len == r.off;
    const bool merge_next = lo < c->nholes && r.off + r.len == c->holes[lo].off;
    if (merge_prev && merge_next) {
        c->holes[lo - 1].len += r.len + c->holes[lo].len;
        hole_remove(c, lo);
    } else if (merge_prev) {
        c->holes[lo - 1].len += r.len;
    } else if (merge_next) {
        c->holes[lo].off = r.off;
        c->holes[lo].len += r.len;
    } else {
        hole_insert(c, lo, (hole_t){r.off, r.len});
    }
    return KVP_OK;
}

kvp_status kvp_contig_get(const kvp_contig *c, int64_t req_id, int64_t *offset, int64_t *reserve_len, int64_t *used)
{
    int32_t i = kvp_idmap_get(&c->map, req_id);
    if (i < 0) return KVP_ERR(KVP_ENOTFOUND, "get: unknown request %lld", (long long)req_id);
    if (offset) *offset = c->reqs[i].off;
    if (reserve_len) *reserve_len = c->reqs[i].len;
    if (used) *used = c->reqs[i].used;
    return KVP_OK;
}

int32_t kvp_contig_num_reqs(const kvp_contig *c) { return (int32_t)c->nreqs; }
int32_t kvp_contig_num_holes(const kvp_contig *c) { return (int32_t)c->nholes; }

int64_t kvp_contig_largest_hole(const kvp_contig *c)
{
    int64_t m = 0;
    for (size_t i = 0; i < c->nholes; i++)
        if (c->holes[i].len > m) m = c->holes[i].len;
    return m;
}

void kvp_contig_account(const kvp_contig *c, int64_t pending_len, kvp_kv_accounting *out)
{
    memset(out, 0, sizeof *out);
    out->capacity = c->capacity;
    out->token_states = c->sum_used;
    out->reserved = c->sum_final - c->sum_used;
    out->internal_frag = c->sum_len - c->sum_final;
    int64_t ext = 0, need = pending_len > 0 ? block_of(c, pending_len) : 0;
    for (size_t i = 0; i < c->nholes; i++)
        if (c->holes[i].len < need) ext += c->holes[i].len;
    out->external_frag = ext + (c->sum_blk - c->sum_len);
    out->free = c->capacity - c->sum_blk - ext;
    out->logical_tokens = c->sum_used;
    out->num_seqs = (int64_t)c->nreqs;
}

static int cmp_off(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

kvp_status kvp_contig_check(const kvp_contig *c)
{
    if (c->map.count != (int32_t)c->nreqs)
        return KVP_ERR(KVP_ESTATE, "contig check: id map holds %d ids for %zu requests", (int)c->map.count, c->nreqs);
    if (c->cap_holes < c->nholes + c->nreqs)
        return KVP_ERR(KVP_ESTATE, "contig check: room for %zu holes, %zu holes and %zu requests", c->cap_holes, c->nholes, c->nreqs);
    const bool buddy = c->placement == KVP_CONTIG_BUDDY;
    int64_t sum_len = 0, sum_used = 0, sum_final = 0, sum_blk = 0;
    for (size_t i = 0; i < c->nreqs; i++) {
        const req_t *r = &c->reqs[i];
        if (kvp_idmap_get(&c->map, r->id) != (int32_t)i)
            return KVP_ERR(KVP_ESTATE, "contig check: id map does not find request %lld", (long long)r->id);
        if (r->len < 1 || r->used < 0 || r->used > r->len || r->off < 0 || r->off + r->blk > c->capacity ||
            r->blk != block_of(c, r->len) || (buddy && (r->off % r->blk != 0 || r->blk > top_block(c->capacity, r->off))))
            return KVP_ERR(KVP_ESTATE, "contig check: request %lld off %lld len %lld block %lld used %lld", (long long)r->id,
                           (long long)r->off, (long long)r->len, (long long)r->blk, (long long)r->used);
        sum_blk += r->blk;
        sum_len += r->len;
        sum_used += r->used;
        sum_final += eff_final(r);
    }
    if (sum_len != c->sum_len || sum_used != c->sum_used || sum_final != c->sum_final || sum_blk != c->sum_blk)
        return KVP_ERR(KVP_ESTATE, "contig check: sums len/used/final %lld/%lld/%lld, recomputed %lld/%lld/%lld",
                       (long long)c->sum_len, (long long)c->sum_used, (long long)c->sum_final, (long long)sum_len,
                       (long long)sum_used, (long long)sum_final);
    for (size_t i = 0; i < c->nholes; i++) {
        const hole_t *h = &c->holes[i];
        if (h->len < 1 || h->off < 0 || h->off + h->len > c->capacity)
            return KVP_ERR(KVP_ESTATE, "contig check: hole %zu at %lld len %lld", i, (long long)h->off, (long long)h->len);
        if (i > 0 && c->holes[i - 1].off + c->holes[i - 1].len > h->off)
            return KVP_ERR(KVP_ESTATE, "contig check: holes %zu and %zu overlap", i - 1, i);
        if (!buddy && i > 0 && c->holes[i - 1].off + c->holes[i - 1].len == h->off)
            return KVP_ERR(KVP_ESTATE, "contig check: holes %zu and %zu touch (unmerged)", i - 1, i);
        if (buddy && (h->len != pow2_at_least(h->len) || h->off % h->len != 0 || h->len > top_block(c->capacity, h->off)))
            return KVP_ERR(KVP_ESTATE, "contig check: hole %zu at %lld len %lld is not a buddy block", i, (long long)h->off,
                           (long long)h->len);
        if (buddy && i > 0 && c->holes[i - 1].len == h->len && (h->off ^ h->len) == c->holes[i - 1].off)
            return KVP_ERR(KVP_ESTATE, "contig check: free buddies at %lld and %lld (unmerged)", (long long)c->holes[i - 1].off,
                           (long long)h->off);
    }
    /* tiling: reservations and holes, sorted by offset, cover [0, capacity) without gap or overlap */
    size_t n = c->nreqs + c->nholes;
    int64_t *seg = kvp_malloc((n ? n : 1) * 2 * sizeof(int64_t));
    if (seg == NULL) return KVP_ERR(KVP_ENOMEM, "contig check: out of memory");
    for (size_t i = 0; i < c->nreqs; i++) {
        seg[2 * i] = c->reqs[i].off;
        seg[2 * i + 1] = c->reqs[i].blk;
    }
    for (size_t i = 0; i < c->nholes; i++) {
        seg[2 * (c->nreqs + i)] = c->holes[i].off;
        seg[2 * (c->nreqs + i) + 1] = c->holes[i].len;
    }
    qsort(seg, n, 2 * sizeof(int64_t), cmp_off);
    int64_t at = 0;
    kvp_status st = KVP_OK;
    for (size_t i = 0; i < n; i++) {
        if (seg[2 * i] != at) {
            st = KVP_ERR(KVP_ESTATE, "contig check: arena not tiled at slot %lld (next segment at %lld)", (long long)at,
                         (long long)seg[2 * i]);
            break;
        }
        at += seg[2 * i + 1];
    }
    kvp_free(seg);
    if (st != KVP_OK) return st;
    if (at != c->capacity)
        return KVP_ERR(KVP_ESTATE, "contig check: segments end at %lld, capacity %lld", (long long)at, (long long)c->capacity);
    kvp_kv_accounting a;
    kvp_contig_account(c, 0, &a);
    if (kvp_kv_accounting_residual(&a) != 0) return KVP_ERR(KVP_ESTATE, "contig check: accounting identity fails");
    return KVP_OK;
}
