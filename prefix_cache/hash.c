/* prefix_cache/hash.c — the hash prefix cache (vLLM automatic prefix caching).
 *
 *   block i of a prompt  --h_i = XXH3(h_{i-1}, tokens of block i [, extra key for i = 0])-->  pc->map
 *                                                                                              |
 *   ents[e] { hash, block, depth, lock, meta, next_use }  <------------------------------------+
 *
 * One entry per cached block. Matching walks the chain until the first hash that is not cached. Any
 * unlocked entry is evictable (ties in the policy key evict deeper blocks first), so a middle block can go
 * before the later blocks of its chain, which then stay cached but unreachable until evicted or re-reached
 * by re-inserting the missing block, exactly as in vLLM. Entries keep no tokens: a 64-bit chain-hash
 * collision would alias two prefixes (probability ~ n^2 / 2^64).
 *
 * Failure atomicity: insert computes all hashes and reserves entries, map room and heap room before it
 * creates any entry.
 */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"
#include "prefix_cache/policies/policy.h"

#define ENT(i) (&pc->ents[(i)])
#define IN_USE (-2)

/* The map's key is the chain hash itself, so a slot with an equal key is the entry: no need to read the
 * entry (a cache miss) to confirm it. */
static int32_t find(const kvp_prefix_cache *pc, uint64_t h)
{
    int64_t s = pc_map_first(&pc->map, h);
    return s >= 0 ? pc->map.slots[s].val : -1;
}

/* Chain hashes of the first nb blocks into pc->scr_h (reserved by the caller). Computing them all first lets
 * the map lookups that follow prefetch PREFETCH slots ahead: the lookups are independent, so their cache
 * misses overlap. */
#define PREFETCH 8
static void hash_chain(kvp_prefix_cache *pc, const int32_t *tokens, int32_t nb, uint64_t extra)
{
    kvp_pc_chain_hashes(tokens, nb, pc->bs, extra, pc->scr_h);
    for (int32_t i = 0; i < nb && i < PREFETCH; i++) pc_map_prefetch(&pc->map, pc->scr_h[i]);
}

/* The policy's view of an entry: one block at depth + 1. */
static pc_unit ent_unit(const kvp_prefix_cache *pc, const pc_entry *e)
{
    return (pc_unit){e->next_use, e->depth + 1, 1, pc->bs, &e->hash};
}

static pc_key ent_key(const kvp_prefix_cache *pc, const pc_entry *e)
{
    const pc_unit u = ent_unit(pc, e);
    return pc_unit_key(pc, &e->m, &u);
}

kvp_status pc_hash_init(kvp_prefix_cache *pc)
{
    return pc_map_reserve(&pc->map, 16);
}

void pc_hash_fini(kvp_prefix_cache *pc)
{
    kvp_free(pc->ents);
    kvp_free(pc->scr_h);
    kvp_free(pc->scr_e);
    kvp_free(pc->scr_new);
}

static void touch_entry(kvp_prefix_cache *pc, int32_t u, const kvp_pc_hint *hint, int lock)
{
    pc_entry *e = ENT(u);
    if (pc_uses_next_use(pc)) e->next_use = hint->next_use[e->depth];
    const pc_unit uv = ent_unit(pc, e);
    const int old_seg = pc_touch(pc, &e->m, &uv, hint);
    if (lock && e->lock++ == 0) pc->st.evictable_blocks--;
    if (e->m.seg != old_seg && e->lock == 0) pc_requeue(pc, u, &e->m, ent_key(pc, e));
    /* Lazy heap: only a lower key must be recorded, and only next-use keys can go down on an access. */
    if (pc_uses_next_use(pc)) pc_heap_lower(pc_heap_of(pc, &e->m), u, ent_key(pc, e));
}

kvp_status pc_hash_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t maxb, const kvp_pc_hint *hint, int lock,
                         int32_t *blocks_out, int32_t *n_hit)
{
    uint64_t extra = hint ? hint->extra_key : 0;
    if (kvp_grow((void **)&pc->scr_h, &pc->scr_h_cap, (size_t)maxb, sizeof *pc->scr_h) != KVP_OK ||
        kvp_grow((void **)&pc->scr_e, &pc->scr_e_cap, (size_t)maxb, sizeof *pc->scr_e) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "out of memory matching %d blocks", maxb);
    hash_chain(pc, tokens, maxb, extra);
    /* Two passes: find the entries (prefetching map slots ahead and each entry found), then touch them. */
    int32_t got = 0;
    for (int32_t i = 0; i < maxb; i++) {
        if (i + PREFETCH < maxb) pc_map_prefetch(&pc->map, pc->scr_h[i + PREFETCH]);
        int32_t e = find(pc, pc->scr_h[i]);
        if (e < 0) break;
        __builtin_prefetch(ENT(e), 1);
        pc->scr_e[got++] = e;
    }
    for (int32_t i = 0; i < got; i++) {
        blocks_out[i] = ENT(pc->scr_e[i])->block;
        touch_entry(pc, pc->scr_e[i], hint, lock);
    }
    *n_hit = got;
    return KVP_OK;
}

kvp_status pc_hash_insert(kvp_prefix_cache *pc, const int32_t *tokens, const int32_t *blocks, int32_t n_blocks,
                          const kvp_pc_hint *hint, int lock, int32_t *cached_out)
{
    uint64_t extra = hint ? hint->extra_key : 0;
    if (kvp_grow((void **)&pc->scr_h, &pc->scr_h_cap, (size_t)n_blocks, sizeof *pc->scr_h) != KVP_OK ||
        kvp_grow((void **)&pc->scr_e, &pc->scr_e_cap, (size_t)n_blocks, sizeof *pc->scr_e) != KVP_OK ||
        kvp_grow((void **)&pc->scr_new, &pc->scr_new_cap, (size_t)n_blocks, sizeof *pc->scr_new) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "out of memory inserting %d blocks", n_blocks);
    int32_t nnew = 0, i;
    kvp_status st = KVP_OK;
    hash_chain(pc, tokens, n_blocks, extra);
    for (i = 0; i < n_blocks; i++) {
        if (i + PREFETCH < n_blocks) pc_map_prefetch(&pc->map, pc->scr_h[i + PREFETCH]);
        pc->scr_e[i] = find(pc, pc->scr_h[i]);
        if (pc->scr_e[i] >= 0) {
            __builtin_prefetch(ENT(pc->scr_e[i]), 1);
            continue;
        }
        int32_t b = blocks[i];
        if (pc->block_unit[b] != -1) {
            st = pc->block_unit[b] == -3
                     ? KVP_ERR(KVP_EINVAL, "kvp_pc_insert: block %d appears twice (position %d)", b, i)
                     : KVP_ERR(KVP_EINVAL, "kvp_pc_insert: block %d (position %d) is already cached elsewhere", b, i);
            break;
        }
        pc->block_unit[b] = -3;
        nnew++;
    }
    for (int32_t j = 0; j < i; j++)
        if (pc->scr_e[j] < 0) pc->block_unit[blocks[j]] = -1;
    if (st != KVP_OK) return st;

    size_t need = (size_t)pc->ents_used + (size_t)nnew;
    if (need > pc->ents_cap && kvp_grow((void **)&pc->ents, &pc->ents_cap, need, sizeof *pc->ents) != KVP_OK)
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the hash cache to %zu entries", need);
    KVP_TRY(pc_heaps_reserve(pc, pc->ents_cap));
    KVP_TRY(pc_map_reserve(&pc->map, (size_t)nnew));
    KVP_TRY(pc_policy_reserve(pc, nnew));

    for (i = 0; i < n_blocks; i++) {
        pc->scr_new[i] = pc->scr_e[i] < 0;
        if (pc->scr_e[i] < 0) {
            int32_t u;
            if (pc->ent_free >= 0) {
                u = pc->ent_free;
                pc->ent_free = ENT(u)->free_next;
            } else {
                u = pc->ents_used++;
            }
            pc_entry *e = ENT(u);
            memset(e, 0, sizeof *e);
            e->hash = pc->scr_h[i];
            e->block = blocks[i];
            e->depth = i;
            e->free_next = IN_USE;
            e->m.insert_time = pc->clock;
            e->m.priority = INT32_MIN;
            pc_map_put(&pc->map, e->hash, u);
            pc->block_unit[e->block] = u;
            kvp_pool_incref(pc->pool, e->block);
            pc->st.inserted_blocks++;
            pc->st.cached_blocks++;
            pc->st.evictable_blocks++;
            pc->st.nodes++;
            pc->seg_blocks[0]++;
            for (int s = 0; s < pc->nseg; s++) pc->heaps[s].pos[u] = -1;
            pc->scr_e[i] = u;
            touch_entry(pc, u, hint, lock);
            if (e->lock == 0) pc_requeue(pc, u, &e->m, ent_key(pc, e));
        } else {
            touch_entry(pc, pc->scr_e[i], hint, lock);
        }
        if (cached_out) cached_out[i] = ENT(pc->scr_e[i])->block;
    }
    /* listeners: one STORED per run of positions that were not cached */
    for (i = 0; pc_listening(pc) && i < n_blocks; i++) {
        if (!pc->scr_new[i]) continue;
        int32_t j = i;
        while (j < n_blocks && pc->scr_new[j]) j++;
        const kvp_pc_event ev = {.kind = KVP_PC_EV_STORED,
                                 .n = j - i,
                                 .hashes = pc->scr_h + i,
                                 .blocks = blocks + i,
                                 .depth = i,
                                 .parent_hash = i == 0 ? 0 : pc->scr_h[i - 1],
                                 .tokens = tokens + (size_t)i * pc->bs,
                                 .extra_key = extra};
        pc_emit(pc, &ev);
        i = j;
    }
    return KVP_OK;
}

kvp_status pc_hash_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n)
{
    /* Decrement in order; a block that is not locked (or is listed more often than it is locked) rolls the
     * earlier decrements back, so a failing call changes nothing. */
    for (int32_t i = 0; i < n; i++) {
        pc_entry *e = ENT(pc->block_unit[blocks[i]]);
        if (e->lock <= 0) {
            for (int32_t j = i - 1; j >= 0; j--)
                if (ENT(pc->block_unit[blocks[j]])->lock++ == 0) pc->st.evictable_blocks--;
            return KVP_ERR(KVP_ESTATE, "kvp_pc_unlock: block %d (position %d) is not locked", blocks[i], i);
        }
        if (--e->lock == 0) pc->st.evictable_blocks++;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t u = pc->block_unit[blocks[i]];
        if (ENT(u)->lock == 0) pc_requeue(pc, u, &ENT(u)->m, ent_key(pc, ENT(u)));
    }
    return KVP_OK;
}

/* The lazy heaps' view of an entry: unlocked entries are evictable. */
static pc_key evict_key(const kvp_prefix_cache *pc, int32_t u, int *evictable, int *seg)
{
    const pc_entry *e = ENT(u);
    *evictable = e->lock == 0;
    *seg = e->m.seg;
    return ent_key(pc, e);
}

void pc_hash_evict_one(kvp_prefix_cache *pc, int32_t *freed)
{
    int seg;
    const int32_t u = pc_pick_victim(pc, evict_key, &seg);
    pc_entry *e = ENT(u);
    if (pc->on_evict) pc->on_evict(pc->on_evict_ctx, e->hash, e->block);
    pc_policy_evicted(pc, &e->m, e->hash);
    if (pc_listening(pc)) {
        const kvp_pc_event ev = {.kind = KVP_PC_EV_REMOVED, .n = 1, .hashes = &e->hash, .blocks = &e->block, .flush = pc->flushing};
        pc_emit(pc, &ev);
    }
    for (int s = 0; s < pc->nseg; s++)
        if (pc_heap_has(&pc->heaps[s], u)) pc_heap_remove(&pc->heaps[s], u);
    pc->seg_blocks[e->m.seg]--;
    pc_map_del(&pc->map, e->hash, u);
    pc->block_unit[e->block] = -1;
    kvp_pool_decref(pc->pool, e->block);
    if (kvp_pool_refcount(pc->pool, e->block) == 0) (*freed)++;
    pc->st.evicted_blocks++;
    pc->st.cached_blocks--;
    pc->st.evictable_blocks--;
    pc->st.nodes--;
    e->free_next = pc->ent_free;
    pc->ent_free = u;
}

kvp_status pc_hash_check(const kvp_prefix_cache *pc)
{
    int64_t used = 0, evictable = 0, in_seg[PC_MAX_SEGS] = {0};
    for (int32_t u = 0; u < pc->ents_used; u++) {
        const pc_entry *e = ENT(u);
        if (e->free_next != IN_USE) {
            for (int s = 0; s < pc->nseg; s++)
                if (pc_heap_has(&pc->heaps[s], u)) return KVP_ERR(KVP_ESTATE, "hash: free entry %d is in heap %d", u, s);
            continue;
        }
        used++;
        if (e->block < 0 || e->block >= pc->nblock_ids || pc->block_unit[e->block] != u)
            return KVP_ERR(KVP_ESTATE, "hash: entry %d's block %d is not indexed to it", u, e->block);
        if (e->lock < 0) return KVP_ERR(KVP_ESTATE, "hash: entry %d has lock %d", u, e->lock);
        if (find(pc, e->hash) != u) return KVP_ERR(KVP_ESTATE, "hash: entry %d not found by its hash (or duplicated)", u);
        if (e->m.seg < 0 || e->m.seg >= pc->nseg) return KVP_ERR(KVP_ESTATE, "hash: entry %d in segment %d", u, e->m.seg);
        in_seg[e->m.seg]++;
        if (e->lock == 0) evictable++;
        if (e->lock == 0) {
            const pc_heap *h = &pc->heaps[e->m.seg];
            if (!pc_heap_has(h, u)) return KVP_ERR(KVP_ESTATE, "hash: unlocked entry %d is not in the heap", u);
            if (pc_key_cmp(pc_heap_key(h, u), ent_key(pc, e)) > 0)
                return KVP_ERR(KVP_ESTATE, "hash: entry %d heap key is above its policy key", u);
        }
    }
    if (used != pc->st.cached_blocks || used != pc->st.nodes || (int64_t)pc->map.n != used)
        return KVP_ERR(KVP_ESTATE, "hash: %lld entries, cached counter %lld, node counter %lld, map %zu", (long long)used,
                       (long long)pc->st.cached_blocks, (long long)pc->st.nodes, pc->map.n);
    if (evictable != pc->st.evictable_blocks)
        return KVP_ERR(KVP_ESTATE, "hash: %lld unlocked entries, evictable counter %lld", (long long)evictable,
                       (long long)pc->st.evictable_blocks);
    for (int s = 0; s < pc->nseg; s++)
        if (in_seg[s] != pc->seg_blocks[s])
            return KVP_ERR(KVP_ESTATE, "hash: segment %d holds %lld blocks, counter %lld", s, (long long)in_seg[s],
                           (long long)pc->seg_blocks[s]);
    return KVP_OK;
}

kvp_status pc_hash_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx)
{
    for (int32_t u = 0; u < pc->ents_used; u++) {
        const pc_entry *e = ENT(u);
        if (e->free_next == IN_USE) fn(ctx, e->hash, e->depth, e->block, e->lock, NULL);
    }
    return KVP_OK;
}
