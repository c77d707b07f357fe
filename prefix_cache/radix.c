/* prefix_cache/radix.c — the radix-tree prefix cache (SGLang RadixAttention with pages).
 *
 *   node 0 = root (no blocks)
 *     |  children found through pc->map: key = H(first block tokens [, extra key under the root]) ^ mix(parent)
 *     v
 *   node { blocks[nblocks], tokens[nblocks*bs], next_use[nblocks], lock, meta }   nodes live in one array,
 *                                                                                 linked parent/child/sibling
 * A match or insert that ends inside an edge splits the node (prefix part M becomes the parent of the rest),
 * so all blocks of a node always share one access history and locks cover whole nodes. Locks count the
 * requests using a path: a node's lock >= the sum of its children's. Eviction pops the policy-minimum
 * unlocked leaf from the heap and trims ONE block from its tail; an emptied leaf is removed and its parent
 * may become an evictable leaf. Nodes are never merged back.
 *
 * Failure atomicity: every call first walks read-only, then reserves node slots, map room and the arrays of
 * new nodes, and only then changes the tree (commit steps cannot fail).
 */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"
#include "prefix_cache/policies/policy.h"

#define NODE(i) (&pc->nodes[(i)])
#define IN_USE (-2)

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t child_key(const kvp_prefix_cache *pc, int32_t parent, const int32_t *btoks, uint64_t extra)
{
    return kvp_pc_block_hash(0, btoks, pc->bs, parent == 0 ? extra : 0) ^ mix((uint64_t)parent + 1);
}

static int32_t find_child(const kvp_prefix_cache *pc, int32_t parent, const int32_t *btoks, uint64_t extra)
{
    uint64_t key = child_key(pc, parent, btoks, extra);
    for (int64_t s = pc_map_first(&pc->map, key); s >= 0; s = pc_map_next(&pc->map, key, s)) {
        const pc_node *c = NODE(pc->map.slots[s].val);
        if (c->parent == parent && (parent != 0 || c->extra_key == extra) &&
            memcmp(c->tokens, btoks, (size_t)pc->bs * sizeof *btoks) == 0)
            return pc->map.slots[s].val;
    }
    return -1;
}

/* The policy's view of a node: its last block (the one eviction trims) and its size. */
static pc_unit node_unit(const kvp_prefix_cache *pc, const pc_node *n)
{
    return (pc_unit){n->next_use ? n->next_use[n->nblocks - 1] : 0, n->depth_end, n->nblocks, pc->bs, n->hashes};
}

static pc_key node_key(const kvp_prefix_cache *pc, const pc_node *n)
{
    const pc_unit u = node_unit(pc, n);
    return pc_unit_key(pc, &n->m, &u);
}

/* out[0..nb) = the chain hashes of the blocks tokens[0..nb*bs) of a node under parent p (which continue
 * p's last block's chain; extra mixes into a first block under the root). */
static void node_hashes(const kvp_prefix_cache *pc, int32_t p, const int32_t *tokens, int32_t nb, uint64_t extra,
                        uint64_t *out)
{
    uint64_t h = p == 0 ? 0 : NODE(p)->hashes[NODE(p)->nblocks - 1];
    for (int32_t j = 0; j < nb; j++)
        out[j] = h = kvp_pc_block_hash(h, tokens + (size_t)j * pc->bs, pc->bs, p == 0 && j == 0 ? extra : 0);
}

/* ---- node slots and arrays ----------------------------------------------------------------------- */

static kvp_status reserve_nodes(kvp_prefix_cache *pc, int32_t k)
{
    size_t need = (size_t)pc->nodes_used + (size_t)k;
    if (need > pc->nodes_cap && kvp_grow((void **)&pc->nodes, &pc->nodes_cap, need, sizeof *pc->nodes) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the radix tree to %zu nodes", need);
    return pc_heaps_reserve(pc, pc->nodes_cap);
}

static int32_t take_node(kvp_prefix_cache *pc)
{
    int32_t u;
    if (pc->node_free >= 0) {
        u = pc->node_free;
        pc->node_free = NODE(u)->free_next;
    } else {
        u = pc->nodes_used++;
    }
    memset(NODE(u), 0, sizeof(pc_node));
    NODE(u)->free_next = IN_USE;
    NODE(u)->parent = NODE(u)->first_child = NODE(u)->next_sib = NODE(u)->prev_sib = -1;
    for (int s = 0; s < pc->nseg; s++) pc->heaps[s].pos[u] = -1;
    return u;
}

typedef struct {
    int32_t *blocks, *tokens;
    uint64_t *hashes;
    int64_t *next_use;
} node_arrays;

static void arrays_free(node_arrays *a)
{
    kvp_free(a->blocks);
    kvp_free(a->tokens);
    kvp_free(a->hashes);
    kvp_free(a->next_use);
    memset(a, 0, sizeof *a);
}

static kvp_status arrays_alloc(const kvp_prefix_cache *pc, int32_t nb, node_arrays *a)
{
    memset(a, 0, sizeof *a);
    a->blocks = kvp_malloc((size_t)nb * sizeof *a->blocks);
    a->tokens = kvp_malloc((size_t)nb * (size_t)pc->bs * sizeof *a->tokens);
    a->hashes = kvp_malloc((size_t)nb * sizeof *a->hashes);
    if (pc_uses_next_use(pc)) a->next_use = kvp_malloc((size_t)nb * sizeof *a->next_use);
    if (a->blocks == NULL || a->tokens == NULL || a->hashes == NULL || (pc_uses_next_use(pc) && a->next_use == NULL)) {
        arrays_free(a);
        return KVP_ERR(KVP_ENOMEM, "out of memory for a radix node of %d blocks", nb);
    }
    return KVP_OK;
}

static void link_child(kvp_prefix_cache *pc, int32_t p, int32_t c)
{
    pc_node *P = NODE(p), *C = NODE(c);
    C->parent = p;
    C->prev_sib = -1;
    C->next_sib = P->first_child;
    if (P->first_child >= 0) NODE(P->first_child)->prev_sib = c;
    P->first_child = c;
    P->nchildren++;
}

static void unlink_child(kvp_prefix_cache *pc, int32_t c)
{
    pc_node *C = NODE(c), *P = NODE(C->parent);
    if (C->prev_sib >= 0) NODE(C->prev_sib)->next_sib = C->next_sib;
    else P->first_child = C->next_sib;
    if (C->next_sib >= 0) NODE(C->next_sib)->prev_sib = C->prev_sib;
    P->nchildren--;
    C->prev_sib = C->next_sib = -1;
}

kvp_status pc_radix_init(kvp_prefix_cache *pc)
{
    KVP_TRY(reserve_nodes(pc, 16));
    KVP_TRY(pc_map_reserve(&pc->map, 16));
    take_node(pc); /* the root, node 0 */
    return KVP_OK;
}

void pc_radix_fini(kvp_prefix_cache *pc)
{
    for (int32_t u = 0; u < pc->nodes_used; u++)
        if (NODE(u)->free_next == IN_USE) {
            kvp_free(NODE(u)->blocks);
            kvp_free(NODE(u)->tokens);
            kvp_free(NODE(u)->hashes);
            kvp_free(NODE(u)->next_use);
        }
    kvp_free(pc->nodes);
}

/* ---- walk, split, touch ---------------------------------------------------------------------------- */

typedef struct {
    int32_t cur;     /* deepest node fully matched (0 = root) */
    int32_t got;     /* blocks matched */
    int32_t split;   /* node whose edge the match ends inside, or -1 */
    int32_t split_k; /* blocks of that edge matched (0 < split_k < nblocks) */
} walk_res;

static void walk(const kvp_prefix_cache *pc, const int32_t *tokens, int32_t maxb, uint64_t extra, walk_res *w)
{
    const size_t bbytes = (size_t)pc->bs * sizeof *tokens;
    w->cur = 0;
    w->got = 0;
    w->split = -1;
    w->split_k = 0;
    while (w->got < maxb) {
        int32_t c = find_child(pc, w->cur, tokens + (size_t)w->got * pc->bs, extra);
        if (c < 0) return;
        const pc_node *C = NODE(c);
        int32_t k = 1;
        while (k < C->nblocks && w->got + k < maxb &&
               memcmp(C->tokens + (size_t)k * pc->bs, tokens + (size_t)(w->got + k) * pc->bs, bbytes) == 0)
            k++;
        w->got += k;
        if (k < C->nblocks) {
            w->split = c;
            w->split_k = k;
            return;
        }
        w->cur = c;
    }
}

/* Splits node x after its first k blocks: a new node M takes them and becomes x's parent. Returns M.
 * Needs one reserved node slot, one map slot and M's arrays (taken over). */
static int32_t split(kvp_prefix_cache *pc, int32_t x, int32_t k, node_arrays *a)
{
    int32_t m = take_node(pc);
    pc_node *X = NODE(x), *M = NODE(m);
    const size_t bs = (size_t)pc->bs;
    M->blocks = a->blocks;
    M->tokens = a->tokens;
    M->hashes = a->hashes;
    M->next_use = a->next_use;
    memset(a, 0, sizeof *a);
    memcpy(M->blocks, X->blocks, (size_t)k * sizeof *M->blocks);
    memcpy(M->tokens, X->tokens, (size_t)k * bs * sizeof *M->tokens);
    memcpy(M->hashes, X->hashes, (size_t)k * sizeof *M->hashes);
    if (M->next_use) memcpy(M->next_use, X->next_use, (size_t)k * sizeof *M->next_use);
    M->nblocks = k;
    M->depth_end = X->depth_end - (X->nblocks - k);
    M->lock = X->lock;
    M->m = X->m;
    M->extra_key = X->extra_key;
    M->mapkey = X->mapkey;
    /* M takes x's place among its siblings and in the map. */
    int32_t p = X->parent;
    M->parent = p;
    M->prev_sib = X->prev_sib;
    M->next_sib = X->next_sib;
    if (X->prev_sib >= 0) NODE(X->prev_sib)->next_sib = m;
    else NODE(p)->first_child = m;
    if (X->next_sib >= 0) NODE(X->next_sib)->prev_sib = m;
    pc_map_set(&pc->map, X->mapkey, x, m);
    X->prev_sib = X->next_sib = -1;
    X->parent = m;
    M->first_child = x;
    M->nchildren = 1;
    memmove(X->blocks, X->blocks + k, (size_t)(X->nblocks - k) * sizeof *X->blocks);
    memmove(X->tokens, X->tokens + (size_t)k * bs, (size_t)(X->nblocks - k) * bs * sizeof *X->tokens);
    memmove(X->hashes, X->hashes + k, (size_t)(X->nblocks - k) * sizeof *X->hashes);
    if (X->next_use) memmove(X->next_use, X->next_use + k, (size_t)(X->nblocks - k) * sizeof *X->next_use);
    X->nblocks -= k;
    X->extra_key = 0;
    X->mapkey = child_key(pc, m, X->tokens, 0);
    pc_map_put(&pc->map, X->mapkey, x);
    for (int32_t j = 0; j < k; j++) pc->block_unit[M->blocks[j]] = m;
    pc->st.nodes++;
    /* x's key is unchanged (same tail, same depth_end, same meta); M has a child, so it is not a leaf. */
    return m;
}

/* Records an access on the path root..last, copies its blocks to out (may be NULL), locks it if asked. */
static void touch_path(kvp_prefix_cache *pc, int32_t last, const kvp_pc_hint *hint, int lock, int32_t *out)
{
    for (int32_t u = last; u != 0; u = NODE(u)->parent) {
        pc_node *n = NODE(u);
        int32_t start = n->depth_end - n->nblocks;
        if (out) memcpy(out + start, n->blocks, (size_t)n->nblocks * sizeof *out);
        if (n->next_use)
            memcpy(n->next_use, hint->next_use + start, (size_t)n->nblocks * sizeof *n->next_use);
        const pc_unit uv = node_unit(pc, n);
        const int old_seg = pc_touch(pc, &n->m, &uv, hint);
        if (lock && n->lock++ == 0) pc->st.evictable_blocks -= n->nblocks;
        if (n->m.seg != old_seg && n->lock == 0 && n->nchildren == 0) pc_requeue(pc, u, &n->m, node_key(pc, n));
        /* Lazy heap: only a lower key must be recorded, and only next-use keys can go down on an access. */
        if (pc_uses_next_use(pc)) pc_heap_lower(pc_heap_of(pc, &n->m), u, node_key(pc, n));
    }
}

kvp_status pc_radix_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t maxb, const kvp_pc_hint *hint, int lock,
                          int32_t *blocks_out, int32_t *n_hit)
{
    uint64_t extra = hint ? hint->extra_key : 0;
    walk_res w;
    walk(pc, tokens, maxb, extra, &w);
    *n_hit = 0;
    if (w.got == 0) return KVP_OK;
    int32_t last = w.cur;
    if (w.split >= 0) {
        node_arrays a;
        KVP_TRY(reserve_nodes(pc, 1));
        KVP_TRY(pc_map_reserve(&pc->map, 1));
        KVP_TRY(arrays_alloc(pc, w.split_k, &a));
        last = split(pc, w.split, w.split_k, &a);
    }
    touch_path(pc, last, hint, lock, blocks_out);
    *n_hit = w.got;
    return KVP_OK;
}

kvp_status pc_radix_insert(kvp_prefix_cache *pc, const int32_t *tokens, const int32_t *blocks, int32_t n_blocks,
                           const kvp_pc_hint *hint, int lock, int32_t *cached_out)
{
    uint64_t extra = hint ? hint->extra_key : 0;
    walk_res w;
    walk(pc, tokens, n_blocks, extra, &w);
    int32_t nnew = n_blocks - w.got;
    /* The caller's blocks for new positions must not be cached already, nor repeated. */
    kvp_status st = KVP_OK;
    int32_t i;
    for (i = w.got; i < n_blocks; i++) {
        int32_t b = blocks[i];
        if (pc->block_unit[b] != -1) {
            st = pc->block_unit[b] == -3
                     ? KVP_ERR(KVP_EINVAL, "kvp_pc_insert: block %d appears twice (position %d)", b, i)
                     : KVP_ERR(KVP_EINVAL, "kvp_pc_insert: block %d (position %d) is already cached elsewhere", b, i);
            break;
        }
        pc->block_unit[b] = -3;
    }
    for (int32_t j = w.got; j < i; j++) pc->block_unit[blocks[j]] = -1;
    if (st != KVP_OK) return st;

    node_arrays am = {0}, an = {0};
    st = reserve_nodes(pc, (w.split >= 0) + (nnew > 0));
    if (st == KVP_OK) st = pc_policy_reserve(pc, nnew);
    if (st == KVP_OK) st = pc_map_reserve(&pc->map, 2);
    if (st == KVP_OK && w.split >= 0) st = arrays_alloc(pc, w.split_k, &am);
    if (st == KVP_OK && nnew > 0) st = arrays_alloc(pc, nnew, &an);
    if (st != KVP_OK) {
        arrays_free(&am);
        arrays_free(&an);
        return st;
    }

    int32_t p = w.cur;
    if (w.split >= 0) p = split(pc, w.split, w.split_k, &am);
    int32_t last = p;
    if (nnew > 0) {
        int32_t u = take_node(pc);
        pc_node *N = NODE(u);
        N->blocks = an.blocks;
        N->tokens = an.tokens;
        N->hashes = an.hashes;
        N->next_use = an.next_use;
        memcpy(N->blocks, blocks + w.got, (size_t)nnew * sizeof *N->blocks);
        memcpy(N->tokens, tokens + (size_t)w.got * pc->bs, (size_t)nnew * pc->bs * sizeof *N->tokens);
        node_hashes(pc, p, N->tokens, nnew, extra, N->hashes);
        N->nblocks = nnew;
        N->depth_end = n_blocks;
        N->extra_key = p == 0 ? extra : 0;
        N->mapkey = child_key(pc, p, N->tokens, extra);
        N->m.insert_time = pc->clock;
        N->m.priority = INT32_MIN;
        link_child(pc, p, u); /* p stops being a leaf; if it is in the heap, eviction will drop it */
        pc_map_put(&pc->map, N->mapkey, u);
        for (int32_t j = 0; j < nnew; j++) {
            pc->block_unit[N->blocks[j]] = u;
            kvp_pool_incref(pc->pool, N->blocks[j]);
        }
        pc->st.nodes++;
        pc->st.inserted_blocks += nnew;
        pc->st.cached_blocks += nnew;
        pc->st.evictable_blocks += nnew;
        pc->seg_blocks[N->m.seg] += nnew;
        last = u;
    }
    touch_path(pc, last, hint, lock, cached_out);
    if (nnew > 0 && NODE(last)->lock == 0) pc_requeue(pc, last, &NODE(last)->m, node_key(pc, NODE(last)));
    if (nnew > 0 && pc_listening(pc)) {
        const pc_node *N = NODE(last);
        const kvp_pc_event ev = {.kind = KVP_PC_EV_STORED,
                                 .n = nnew,
                                 .hashes = N->hashes,
                                 .blocks = N->blocks,
                                 .depth = w.got,
                                 .parent_hash = p == 0 ? 0 : NODE(p)->hashes[NODE(p)->nblocks - 1],
                                 .tokens = N->tokens,
                                 .extra_key = extra};
        pc_emit(pc, &ev);
    }
    return KVP_OK;
}

kvp_status pc_radix_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n)
{
    int32_t last = pc->block_unit[blocks[n - 1]];
    const pc_node *L = NODE(last);
    if (L->depth_end != n || L->blocks[L->nblocks - 1] != blocks[n - 1])
        return KVP_ERR(KVP_ESTATE, "kvp_pc_unlock: blocks[%d] = %d does not end a locked path of %d blocks", n - 1,
                       blocks[n - 1], n);
    for (int32_t u = last; u != 0; u = NODE(u)->parent) {
        const pc_node *x = NODE(u);
        int32_t start = x->depth_end - x->nblocks;
        if (memcmp(blocks + start, x->blocks, (size_t)x->nblocks * sizeof *blocks) != 0)
            return KVP_ERR(KVP_ESTATE, "kvp_pc_unlock: blocks %d..%d are not the cached path", start,
                           x->depth_end - 1);
        if (x->lock <= 0)
            return KVP_ERR(KVP_ESTATE, "kvp_pc_unlock: blocks %d..%d are not locked", start, x->depth_end - 1);
    }
    for (int32_t u = last; u != 0; u = NODE(u)->parent) {
        pc_node *x = NODE(u);
        if (--x->lock == 0) {
            pc->st.evictable_blocks += x->nblocks;
            if (x->nchildren == 0) pc_requeue(pc, u, &x->m, node_key(pc, x));
        }
    }
    return KVP_OK;
}

static void remove_node(kvp_prefix_cache *pc, int32_t u)
{
    pc_node *x = NODE(u);
    int32_t p = x->parent;
    for (int s = 0; s < pc->nseg; s++)
        if (pc_heap_has(&pc->heaps[s], u)) pc_heap_remove(&pc->heaps[s], u);
    pc_map_del(&pc->map, x->mapkey, u);
    unlink_child(pc, u);
    if (p != 0 && NODE(p)->nchildren == 0 && NODE(p)->lock == 0) pc_requeue(pc, p, &NODE(p)->m, node_key(pc, NODE(p)));
    kvp_free(x->blocks);
    kvp_free(x->tokens);
    kvp_free(x->hashes);
    kvp_free(x->next_use);
    x->blocks = x->tokens = NULL;
    x->hashes = NULL;
    x->next_use = NULL;
    x->free_next = pc->node_free;
    pc->node_free = u;
    pc->st.nodes--;
}

/* The lazy heaps' view of a node: only unlocked leaves are evictable. */
static pc_key evict_key(const kvp_prefix_cache *pc, int32_t u, int *evictable, int *seg)
{
    const pc_node *x = NODE(u);
    *evictable = x->lock == 0 && x->nchildren == 0;
    *seg = x->m.seg;
    return node_key(pc, x);
}

void pc_radix_evict_one(kvp_prefix_cache *pc, int32_t *freed)
{
    int s;
    const int32_t u = pc_pick_victim(pc, evict_key, &s);
    pc_node *x = NODE(u);
    int32_t b = x->blocks[--x->nblocks];
    const uint64_t h = x->hashes[x->nblocks];
    if (pc->on_evict) pc->on_evict(pc->on_evict_ctx, h, b);
    pc_policy_evicted(pc, &x->m, h);
    if (pc_listening(pc)) {
        const kvp_pc_event ev = {.kind = KVP_PC_EV_REMOVED, .n = 1, .hashes = &h, .blocks = &b, .flush = pc->flushing};
        pc_emit(pc, &ev);
    }
    x->depth_end--;
    pc->block_unit[b] = -1;
    kvp_pool_decref(pc->pool, b);
    if (kvp_pool_refcount(pc->pool, b) == 0) (*freed)++;
    pc->st.evicted_blocks++;
    pc->st.cached_blocks--;
    pc->st.evictable_blocks--;
    pc->seg_blocks[x->m.seg]--;
    if (x->nblocks == 0) remove_node(pc, u);
    else pc_heap_update(&pc->heaps[s], u, node_key(pc, x));
}

/* ---- checks and visits ---------------------------------------------------------------------------- */

kvp_status pc_radix_check(const kvp_prefix_cache *pc)
{
    if (pc->nodes_used < 1 || NODE(0)->free_next != IN_USE || NODE(0)->parent != -1 || NODE(0)->nblocks != 0)
        return KVP_ERR(KVP_ESTATE, "radix: bad root");
    int64_t used = 0, children = 0, cached = 0, evictable = 0, in_seg[PC_MAX_SEGS] = {0};
    for (int32_t u = 0; u < pc->nodes_used; u++) {
        const pc_node *x = NODE(u);
        if (x->free_next != IN_USE) {
            for (int s = 0; s < pc->nseg; s++)
                if (pc_heap_has(&pc->heaps[s], u)) return KVP_ERR(KVP_ESTATE, "radix: free node %d is in heap %d", u, s);
            continue;
        }
        used++;
        int64_t child_locks = 0, nc = 0;
        int32_t prev = -1;
        for (int32_t c = x->first_child; c >= 0; c = NODE(c)->next_sib) {
            if (c >= pc->nodes_used || NODE(c)->free_next != IN_USE || NODE(c)->parent != u || NODE(c)->prev_sib != prev)
                return KVP_ERR(KVP_ESTATE, "radix: child list of node %d is broken at node %d", u, c);
            child_locks += NODE(c)->lock;
            prev = c;
            if (++nc > pc->nodes_used) return KVP_ERR(KVP_ESTATE, "radix: cycle in the child list of node %d", u);
        }
        if (nc != x->nchildren)
            return KVP_ERR(KVP_ESTATE, "radix: node %d has %lld children, count says %d", u, (long long)nc, x->nchildren);
        children += nc;
        if (u == 0) continue;
        const pc_node *p = NODE(x->parent);
        if (x->nblocks < 1) return KVP_ERR(KVP_ESTATE, "radix: node %d has no blocks", u);
        if (x->depth_end != p->depth_end + x->nblocks)
            return KVP_ERR(KVP_ESTATE, "radix: node %d ends at depth %d, parent at %d plus %d blocks", u, x->depth_end,
                           p->depth_end, x->nblocks);
        if (x->lock < child_locks)
            return KVP_ERR(KVP_ESTATE, "radix: node %d lock %d < its children's %lld", u, x->lock, (long long)child_locks);
        if (pc_uses_next_use(pc) != (x->next_use != NULL))
            return KVP_ERR(KVP_ESTATE, "radix: node %d next_use array presence wrong", u);
        for (int32_t j = 0; j < x->nblocks; j++)
            if (pc->block_unit[x->blocks[j]] != u)
                return KVP_ERR(KVP_ESTATE, "radix: block %d of node %d indexed to node %d", x->blocks[j], u,
                               pc->block_unit[x->blocks[j]]);
        cached += x->nblocks;
        if (x->m.seg < 0 || x->m.seg >= pc->nseg) return KVP_ERR(KVP_ESTATE, "radix: node %d in segment %d", u, x->m.seg);
        in_seg[x->m.seg] += x->nblocks;
        if (x->lock == 0) evictable += x->nblocks;
        if (x->parent != 0 && x->extra_key != 0) return KVP_ERR(KVP_ESTATE, "radix: inner node %d has an extra key", u);
        uint64_t h = x->parent == 0 ? 0 : p->hashes[p->nblocks - 1];
        for (int32_t j = 0; j < x->nblocks; j++) {
            h = kvp_pc_block_hash(h, x->tokens + (size_t)j * pc->bs, pc->bs, x->parent == 0 && j == 0 ? x->extra_key : 0);
            if (x->hashes[j] != h) return KVP_ERR(KVP_ESTATE, "radix: block %d of node %d has a stale chain hash", j, u);
        }
        if (x->mapkey != child_key(pc, x->parent, x->tokens, x->extra_key))
            return KVP_ERR(KVP_ESTATE, "radix: node %d map key is stale", u);
        if (find_child(pc, x->parent, x->tokens, x->extra_key) != u)
            return KVP_ERR(KVP_ESTATE, "radix: node %d is not found from its parent (missing or duplicate first block)", u);
        if (x->nchildren == 0 && x->lock == 0) {
            const pc_heap *h = &pc->heaps[x->m.seg];
            if (!pc_heap_has(h, u)) return KVP_ERR(KVP_ESTATE, "radix: evictable leaf %d is not in the heap", u);
            if (pc_key_cmp(pc_heap_key(h, u), node_key(pc, x)) > 0)
                return KVP_ERR(KVP_ESTATE, "radix: node %d heap key is above its policy key", u);
        }
    }
    for (int s = 0; s < pc->nseg; s++) {
        if (pc_heap_has(&pc->heaps[s], 0)) return KVP_ERR(KVP_ESTATE, "radix: the root is in heap %d", s);
        if (in_seg[s] != pc->seg_blocks[s])
            return KVP_ERR(KVP_ESTATE, "radix: segment %d holds %lld blocks, counter %lld", s, (long long)in_seg[s],
                           (long long)pc->seg_blocks[s]);
    }
    if (children != used - 1) return KVP_ERR(KVP_ESTATE, "radix: %lld nodes but %lld child links", (long long)used, (long long)children);
    if ((int64_t)pc->map.n != used - 1) return KVP_ERR(KVP_ESTATE, "radix: map holds %zu keys for %lld nodes", pc->map.n, (long long)used - 1);
    if (cached != pc->st.cached_blocks) return KVP_ERR(KVP_ESTATE, "radix: tree holds %lld blocks, counter %lld", (long long)cached, (long long)pc->st.cached_blocks);
    if (evictable != pc->st.evictable_blocks)
        return KVP_ERR(KVP_ESTATE, "radix: %lld unlocked blocks, evictable counter %lld", (long long)evictable,
                       (long long)pc->st.evictable_blocks);
    if (pc->st.nodes != used - 1)
        return KVP_ERR(KVP_ESTATE, "radix: node counter %lld, tree has %lld", (long long)pc->st.nodes, (long long)used - 1);
    return KVP_OK;
}

kvp_status pc_radix_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx)
{
    /* Depth-first with an explicit stack of (node, chain hash at the node's start). */
    typedef struct {
        int32_t u;
        uint64_t h;
    } item;
    size_t cap = (size_t)pc->nodes_used + 1;
    item *stack = kvp_malloc(cap * sizeof *stack);
    if (stack == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory visiting the radix tree");
    size_t n = 0;
    for (int32_t c = NODE(0)->first_child; c >= 0; c = NODE(c)->next_sib) stack[n++] = (item){c, 0};
    while (n > 0) {
        item it = stack[--n];
        const pc_node *x = NODE(it.u);
        uint64_t h = it.h;
        int32_t start = x->depth_end - x->nblocks;
        for (int32_t j = 0; j < x->nblocks; j++) {
            const int32_t *t = x->tokens + (size_t)j * pc->bs;
            h = kvp_pc_block_hash(h, t, pc->bs, start + j == 0 ? x->extra_key : 0);
            fn(ctx, h, start + j, x->blocks[j], x->lock, t);
        }
        for (int32_t c = x->first_child; c >= 0; c = NODE(c)->next_sib) stack[n++] = (item){c, h};
    }
    kvp_free(stack);
    return KVP_OK;
}
