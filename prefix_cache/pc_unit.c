/* prefix_cache/pc_unit.c — what the radix and hash halves share with the dispatcher, one unit (a radix node or
 * a hash entry) at a time: the chain hashes, the generic side of every eviction policy (access metadata,
 * segments, heaps, the next victim) and the listeners' calls. It calls no function of prefix_cache.c, radix.c or
 * hash.c, so the dispatcher sits above the two halves and both above this file. Contract in prefix_cache_internal.h. */
#include <xxhash.h>

#include "prefix_cache/prefix_cache_internal.h"
#include "prefix_cache/policies/policy.h"

uint64_t kvp_pc_block_hash(uint64_t prev, const int32_t *block_tokens, int32_t block_size, uint64_t extra_key)
{
    /* The previous hash is the seed; the extra key (first block only, by the callers' convention) is
     * folded into the seed through a second hash so that (prev, extra) pairs do not cancel out. */
    uint64_t seed = prev;
    if (extra_key) seed ^= XXH3_64bits_withSeed(&extra_key, sizeof extra_key, 0x6b76706167650001ull);
    return XXH3_64bits_withSeed(block_tokens, (size_t)block_size * sizeof(int32_t), seed);
}

void kvp_pc_chain_hashes(const int32_t *tokens, int32_t n_blocks, int32_t block_size, uint64_t extra_key, uint64_t *out)
{
    uint64_t h = 0;
    for (int32_t i = 0; i < n_blocks; i++)
        out[i] = h = kvp_pc_block_hash(h, tokens + (size_t)i * block_size, block_size, i == 0 ? extra_key : 0);
}

/* ---- the generic side of every policy ------------------------------------------------------------ */

pc_key pc_unit_key(const kvp_prefix_cache *pc, const pc_meta *m, const pc_unit *u)
{
    return pc->pol->key(m, u);
}

int pc_touch(kvp_prefix_cache *pc, pc_meta *m, const pc_unit *u, const kvp_pc_hint *hint)
{
    const int old = m->seg, is_new = m->freq == 0;
    m->last_access = pc->clock;
    m->freq++;
    int32_t p = hint ? hint->priority : 0;
    if (p > m->priority) m->priority = p;
    if (pc->pol->access) pc->pol->access(pc, m, u, is_new);
    if (m->seg != old) {
        pc->seg_blocks[old] -= u->nblocks;
        pc->seg_blocks[m->seg] += u->nblocks;
    }
    return old;
}

void pc_requeue(kvp_prefix_cache *pc, int32_t unit, const pc_meta *m, pc_key k)
{
    pc_heap *h = pc_heap_of(pc, m);
    if (!pc_heap_has(h, unit)) pc_heap_push(h, unit, k);
}

kvp_status pc_heaps_reserve(kvp_prefix_cache *pc, size_t units)
{
    for (int s = 0; s < pc->nseg; s++) KVP_TRY(pc_heap_reserve(&pc->heaps[s], units));
    return KVP_OK;
}

int32_t pc_pick_victim(kvp_prefix_cache *pc, pc_unit_key_fn key, int *seg_out)
{
    const int first = pc->pol->victim_seg ? pc->pol->victim_seg(pc) : 0;
    for (int i = 0; i < pc->nseg; i++) {
        const int s = (first + i) % pc->nseg;
        const int32_t u = pc_heap_settle(pc, s, key);
        if (u >= 0) {
            *seg_out = s;
            return u;
        }
    }
    return -1;
}

void pc_policy_evicted(kvp_prefix_cache *pc, const pc_meta *m, uint64_t hash)
{
    if (!pc->flushing && pc->pol->evicted) pc->pol->evicted(pc, m, hash);
}

kvp_status pc_policy_reserve(kvp_prefix_cache *pc, int64_t n_new)
{
    return pc->pol->reserve ? pc->pol->reserve(pc, n_new) : KVP_OK;
}

int pc_uses_next_use(const kvp_prefix_cache *pc)
{
    return (pc->pol->flags & PC_POLICY_NEXT_USE) != 0;
}

void pc_emit(const kvp_prefix_cache *pc, const kvp_pc_event *ev)
{
    for (int i = 0; i < pc->nlisteners; i++) pc->listeners[i].fn(pc->listeners[i].ctx, ev);
}
