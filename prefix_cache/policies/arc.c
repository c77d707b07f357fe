/* prefix_cache/policies/arc.c — Adaptive Replacement Cache (Megiddo and Modha, FAST 2003), over blocks.
 *
 *   T1 (segment 0): units accessed once since cached        B1: chain hashes of blocks evicted from T1
 *   T2 (segment 1): units accessed again, or re-cached      B2: chain hashes of blocks evicted from T2
 *                   soon after their eviction (a ghost hit)
 *   p: the target size of T1 in blocks, in [0, c], c = the pool's blocks
 *
 * Each segment is in LRU order. The victim comes from T1 while T1 holds more than p blocks (locked ones counted,
 * as ARC counts |T1|), else from T2; from the other one when the chosen one has nothing evictable. When a block
 * is cached again while its hash is a ghost, ARC learns: a ghost of B1 (recency was lost) raises p by
 * max(1, |B2| / |B1|), a ghost of B2 (frequency was lost) lowers it by max(1, |B1| / |B2|), and the unit starts
 * in T2. Each ghost list keeps at most c hashes, oldest dropped first. A radix unit is a node: a new node whose
 * blocks hit ghosts counts each hit, and the node as a whole starts in T2.
 *
 * Adaptations to a prefix cache: the cache, not ARC, decides when to evict (a request allocating blocks), and a
 * radix cache only evicts leaves, so "the LRU end of T1" is the LRU evictable leaf of T1. Flushes (kvp_pc_flush)
 * leave no ghosts. Ghost storage grows with the evictions (at most 2c hashes), reserved at insert time so that
 * eviction never allocates.
 */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/policies/policy.h"

typedef struct {
    int64_t p, c;
    /* ghost nodes: doubly linked FIFO lists B1 (0) and B2 (1), and a free stack */
    uint64_t *hash;       /* [cap] */
    int32_t *prev, *next; /* [cap] -1 for none; next[] also links the free stack */
    int8_t *list;         /* [cap] 0, 1, or -1 while free */
    size_t cap;
    int32_t head[2], tail[2], free_head;
    int64_t len[2];
    pc_map map; /* hash -> node */
} arc_state;

static arc_state *st_of(const kvp_prefix_cache *pc)
{
    return pc->pol_state;
}

static kvp_status init(kvp_prefix_cache *pc)
{
    arc_state *s = kvp_calloc(1, sizeof *s);
    if (s == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory for the arc policy");
    s->c = kvp_pool_num_blocks(pc->pool);
    s->head[0] = s->head[1] = s->tail[0] = s->tail[1] = s->free_head = -1;
    pc->pol_state = s;
    return KVP_OK;
}

static void fini(kvp_prefix_cache *pc)
{
    arc_state *s = st_of(pc);
    if (s == NULL) return;
    kvp_free(s->hash);
    kvp_free(s->prev);
    kvp_free(s->next);
    kvp_free(s->list);
    pc_map_fini(&s->map);
    kvp_free(s);
    pc->pol_state = NULL;
}

/* Room for min(2c, blocks ever inserted + n_new) ghosts: every ghost is a block evicted once. */
static kvp_status reserve(kvp_prefix_cache *pc, int64_t n_new)
{
    arc_state *s = st_of(pc);
    int64_t want = pc->st.inserted_blocks + n_new;
    if (want > 2 * s->c) want = 2 * s->c;
    if ((size_t)want <= s->cap) return KVP_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < (size_t)want) cap *= 2;
    KVP_TRY(pc_map_reserve(&s->map, cap - s->map.n));
    uint64_t *h = kvp_malloc(cap * sizeof *h);
    int32_t *pv = kvp_malloc(cap * sizeof *pv), *nx = kvp_malloc(cap * sizeof *nx);
    int8_t *l = kvp_malloc(cap);
    if (h == NULL || pv == NULL || nx == NULL || l == NULL) {
        kvp_free(h);
        kvp_free(pv);
        kvp_free(nx);
        kvp_free(l);
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the arc ghost lists to %zu blocks", cap);
    }
    if (s->cap) {
        memcpy(h, s->hash, s->cap * sizeof *h);
        memcpy(pv, s->prev, s->cap * sizeof *pv);
        memcpy(nx, s->next, s->cap * sizeof *nx);
        memcpy(l, s->list, s->cap);
    }
    for (size_t i = s->cap; i < cap; i++) { /* the new slots join the free stack */
        l[i] = -1;
        nx[i] = i + 1 < cap ? (int32_t)(i + 1) : s->free_head;
    }
    s->free_head = (int32_t)s->cap;
    kvp_free(s->hash);
    kvp_free(s->prev);
    kvp_free(s->next);
    kvp_free(s->list);
    s->hash = h;
    s->prev = pv;
    s->next = nx;
    s->list = l;
    s->cap = cap;
    return KVP_OK;
}

static int32_t find(const arc_state *s, uint64_t h)
{
    int64_t slot = pc_map_first(&s->map, h);
    return slot >= 0 ? s->map.slots[slot].val : -1;
}

static void unlink_node(arc_state *s, int32_t x)
{
    int l = s->list[x];
    if (s->prev[x] >= 0) s->next[s->prev[x]] = s->next[x];
    else s->head[l] = s->next[x];
    if (s->next[x] >= 0) s->prev[s->next[x]] = s->prev[x];
    else s->tail[l] = s->prev[x];
    s->len[l]--;
    pc_map_del(&s->map, s->hash[x], x);
    s->list[x] = -1;
    s->next[x] = s->free_head;
    s->free_head = x;
}

static void evicted(kvp_prefix_cache *pc, const pc_meta *m, uint64_t hash)
{
    arc_state *s = st_of(pc);
    int l = m->seg ? 1 : 0;
    int32_t old = find(s, hash);
    if (old >= 0) unlink_node(s, old); /* a chain-hash collision: keep one ghost */
    if (s->len[l] >= s->c) unlink_node(s, s->head[l]);
    int32_t x = s->free_head; /* reserve() guarantees one: ghosts <= min(2c, blocks ever evicted) */
    s->free_head = s->next[x];
    s->hash[x] = hash;
    s->list[x] = (int8_t)l;
    s->prev[x] = s->tail[l];
    s->next[x] = -1;
    if (s->tail[l] >= 0) s->next[s->tail[l]] = x;
    else s->head[l] = x;
    s->tail[l] = x;
    s->len[l]++;
    pc_map_put(&s->map, hash, x);
}

static void access(kvp_prefix_cache *pc, pc_meta *m, const pc_unit *u, int is_new)
{
    arc_state *s = st_of(pc);
    if (!is_new) {
        m->seg = 1;
        return;
    }
    int ghost = 0;
    for (int32_t i = 0; i < u->nblocks; i++) {
        int32_t x = find(s, u->hashes[i]);
        if (x < 0) continue;
        const int64_t b1 = s->len[0], b2 = s->len[1];
        if (s->list[x] == 0) {
            int64_t d = b2 / b1 > 1 ? b2 / b1 : 1;
            s->p = s->p + d < s->c ? s->p + d : s->c;
        } else {
            int64_t d = b1 / b2 > 1 ? b1 / b2 : 1;
            s->p = s->p > d ? s->p - d : 0;
        }
        unlink_node(s, x);
        ghost = 1;
    }
    m->seg = ghost;
}

static int victim_seg(const kvp_prefix_cache *pc)
{
    return pc->seg_blocks[0] > 0 && pc->seg_blocks[0] > st_of(pc)->p ? 0 : 1;
}

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->last_access, -(int64_t)u->depth, 0};
}

static kvp_status check(const kvp_prefix_cache *pc)
{
    const arc_state *s = st_of(pc);
    if (s->p < 0 || s->p > s->c) return KVP_ERR(KVP_ESTATE, "arc: target %lld outside [0, %lld]", (long long)s->p, (long long)s->c);
    int64_t n[2] = {0, 0};
    for (int l = 0; l < 2; l++)
        for (int32_t x = s->head[l], p = -1; x >= 0; p = x, x = s->next[x]) {
            if ((size_t)x >= s->cap || s->list[x] != l || s->prev[x] != p)
                return KVP_ERR(KVP_ESTATE, "arc: ghost list %d broken at node %d", l + 1, x);
            if (find(s, s->hash[x]) != x) return KVP_ERR(KVP_ESTATE, "arc: ghost node %d is not in the map", x);
            if (++n[l] > (int64_t)s->cap) return KVP_ERR(KVP_ESTATE, "arc: cycle in ghost list %d", l + 1);
            if (s->next[x] < 0 && s->tail[l] != x) return KVP_ERR(KVP_ESTATE, "arc: ghost list %d tail wrong", l + 1);
        }
    for (int l = 0; l < 2; l++)
        if (n[l] != s->len[l] || n[l] > s->c)
            return KVP_ERR(KVP_ESTATE, "arc: ghost list %d holds %lld, counted %lld (capacity %lld)", l + 1,
                           (long long)n[l], (long long)s->len[l], (long long)s->c);
    if ((int64_t)s->map.n != n[0] + n[1]) return KVP_ERR(KVP_ESTATE, "arc: %zu ghosts mapped, %lld listed", s->map.n, (long long)(n[0] + n[1]));
    return KVP_OK;
}

const pc_policy pc_policy_arc = {
    .name = "arc",
    .summary = "adaptive replacement cache: lru over blocks used once (T1) and reused (T2), T1's share learnt from ghosts",
    .nseg = 2,
    .key = key,
    .init = init,
    .fini = fini,
    .access = access,
    .victim_seg = victim_seg,
    .evicted = evicted,
    .reserve = reserve,
    .check = check,
};
