/* prefix_cache/prefix_cache.c — the public interface: argument checks, dispatch to radix.c / hash.c, the
 * policy table (policies/list.h), listeners, statistics, eviction loop, belady next-use precomputation. The
 * generic side of every policy, which radix.c and hash.c call too, is in pc_unit.c. Contract in prefix_cache.h. */
#include "prefix_cache/prefix_cache.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"
#include "prefix_cache/policies/policy.h"

static const char *const kind_names[] = {"none", "radix", "hash"};

#define KVP_PC_POLICY(ID, name) extern const pc_policy pc_policy_##name;
#include "prefix_cache/policies/list.h"
#undef KVP_PC_POLICY
static const pc_policy *const k_policies[KVP_EVICT_POLICIES] = {
#define KVP_PC_POLICY(ID, name) [KVP_EVICT_##ID] = &pc_policy_##name,
#include "prefix_cache/policies/list.h"
#undef KVP_PC_POLICY
};

const pc_policy *pc_policy_of(kvp_evict_policy p)
{
    return (unsigned)p < KVP_EVICT_POLICIES ? k_policies[p] : NULL;
}

kvp_status kvp_pc_kind_parse(const char *s, kvp_pc_kind *out)
{
    for (int i = 0; s && i < 3; i++)
        if (strcmp(s, kind_names[i]) == 0) {
            *out = (kvp_pc_kind)i;
            return KVP_OK;
        }
    return KVP_ERR(KVP_EINVAL, "unknown prefix cache '%s' (expected radix, hash or none)", s ? s : "(null)");
}

kvp_status kvp_evict_policy_parse(const char *s, kvp_evict_policy *out)
{
    for (int i = 0; s && i < KVP_EVICT_POLICIES; i++)
        if (strcmp(s, k_policies[i]->name) == 0) {
            *out = (kvp_evict_policy)i;
            return KVP_OK;
        }
    char names[256] = "";
    for (int i = 0, off = 0; i < KVP_EVICT_POLICIES && off < (int)sizeof names; i++)
        off += snprintf(names + off, sizeof names - (size_t)off, "%s%s", i == 0 ? "" : i + 1 == KVP_EVICT_POLICIES ? " or " : ", ",
                        k_policies[i]->name);
    return KVP_ERR(KVP_EINVAL, "unknown eviction policy '%s' (expected %s)", s ? s : "(null)", names);
}

const char *kvp_pc_kind_name(kvp_pc_kind k)
{
    return (unsigned)k < 3 ? kind_names[k] : "?";
}

const char *kvp_evict_policy_name(kvp_evict_policy p)
{
    return (unsigned)p < KVP_EVICT_POLICIES ? k_policies[p]->name : "?";
}

const char *kvp_evict_policy_summary(kvp_evict_policy p)
{
    return (unsigned)p < KVP_EVICT_POLICIES ? k_policies[p]->summary : "?";
}

/* ---- listeners ----------------------------------------------------------------------------------- */

kvp_status kvp_pc_add_listener(kvp_prefix_cache *pc, kvp_pc_event_fn fn, void *ctx)
{
    if (pc == NULL || fn == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_add_listener: NULL cache or function");
    for (int i = 0; i < pc->nlisteners; i++)
        if (pc->listeners[i].fn == fn && pc->listeners[i].ctx == ctx)
            return KVP_ERR(KVP_EINVAL, "kvp_pc_add_listener: that listener is already there");
    if (pc->nlisteners == KVP_PC_MAX_LISTENERS)
        return KVP_ERR(KVP_EINVAL, "kvp_pc_add_listener: at most %d listeners", KVP_PC_MAX_LISTENERS);
    pc->listeners[pc->nlisteners].fn = fn;
    pc->listeners[pc->nlisteners++].ctx = ctx;
    return KVP_OK;
}

void kvp_pc_remove_listener(kvp_prefix_cache *pc, kvp_pc_event_fn fn, void *ctx)
{
    for (int i = 0; pc && i < pc->nlisteners; i++)
        if (pc->listeners[i].fn == fn && pc->listeners[i].ctx == ctx) {
            memmove(&pc->listeners[i], &pc->listeners[i + 1], (size_t)(pc->nlisteners - i - 1) * sizeof pc->listeners[0]);
            pc->nlisteners--;
            return;
        }
}

kvp_status pc_follow(kvp_prefix_cache **followed, kvp_prefix_cache *pc, int32_t bs, kvp_pc_event_fn fn, void *ctx,
                     const char *what)
{
    if (pc == NULL) return KVP_ERR(KVP_EINVAL, "%s: no cache to follow", what);
    if (pc->bs != bs) return KVP_ERR(KVP_EINVAL, "%s of %d-token blocks cannot follow a cache of %d-token blocks", what, bs, pc->bs);
    if (*followed) return KVP_ERR(KVP_EINVAL, "%s already follows a cache", what);
    KVP_TRY(kvp_pc_add_listener(pc, fn, ctx));
    *followed = pc;
    return KVP_OK;
}

void pc_unfollow(kvp_prefix_cache **followed, kvp_pc_event_fn fn, void *ctx)
{
    if (*followed == NULL) return;
    kvp_pc_remove_listener(*followed, fn, ctx);
    *followed = NULL;
}

kvp_status kvp_pc_create(kvp_pc_kind kind, kvp_evict_policy policy, kvp_block_pool *pool, int32_t block_size,
                         kvp_prefix_cache **out)
{
    if (out == NULL || pool == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_create: NULL pool or out");
    if ((unsigned)kind > KVP_PC_HASH) return KVP_ERR(KVP_EINVAL, "kvp_pc_create: bad cache kind %d", (int)kind);
    if ((unsigned)policy >= KVP_EVICT_POLICIES) return KVP_ERR(KVP_EINVAL, "kvp_pc_create: bad policy %d", (int)policy);
    if (block_size < 1 || block_size != kvp_pool_block_size(pool))
        return KVP_ERR(KVP_EINVAL, "kvp_pc_create: block_size %d differs from the pool's %d", block_size,
                       kvp_pool_block_size(pool));
    kvp_prefix_cache *pc = kvp_calloc(1, sizeof *pc);
    if (pc == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory creating a prefix cache");
    pc->kind = kind;
    pc->policy = policy;
    pc->pol = k_policies[policy];
    pc->nseg = pc->pol->nseg;
    pc->pool = pool;
    pc->bs = block_size;
    pc->nblock_ids = kvp_pool_num_blocks(pool);
    pc->node_free = pc->ent_free = -1;
    kvp_status st = KVP_OK;
    pc->block_unit = kvp_malloc((size_t)pc->nblock_ids * sizeof *pc->block_unit);
    if (pc->block_unit == NULL) st = KVP_ERR(KVP_ENOMEM, "out of memory creating a prefix cache");
    else {
        for (int32_t i = 0; i < pc->nblock_ids; i++) pc->block_unit[i] = -1;
        if (kind != KVP_PC_NONE && pc->pol->init) st = pc->pol->init(pc);
        if (st == KVP_OK && kind == KVP_PC_RADIX) st = pc_radix_init(pc);
        else if (st == KVP_OK && kind == KVP_PC_HASH) st = pc_hash_init(pc);
    }
    if (st != KVP_OK) {
        kvp_pc_destroy(pc);
        return st;
    }
    *out = pc;
    return KVP_OK;
}

void kvp_pc_destroy(kvp_prefix_cache *pc)
{
    if (pc == NULL) return;
    if (pc->block_unit)
        for (int32_t b = 0; b < pc->nblock_ids; b++)
            if (pc->block_unit[b] >= 0) kvp_pool_decref(pc->pool, b);
    if (pc->kind == KVP_PC_RADIX) pc_radix_fini(pc);
    if (pc->kind == KVP_PC_HASH) pc_hash_fini(pc);
    if (pc->pol->fini) pc->pol->fini(pc);
    for (int s = 0; s < PC_MAX_SEGS; s++) pc_heap_fini(&pc->heaps[s]);
    pc_map_fini(&pc->map);
    kvp_free(pc->block_unit);
    kvp_free(pc);
}

kvp_pc_kind kvp_pc_get_kind(const kvp_prefix_cache *pc)
{
    return pc->kind;
}

kvp_evict_policy kvp_pc_get_policy(const kvp_prefix_cache *pc)
{
    return pc->policy;
}

int32_t kvp_pc_block_size(const kvp_prefix_cache *pc)
{
    return pc->bs;
}

static kvp_status check_hint(const kvp_prefix_cache *pc, const kvp_pc_hint *hint, int32_t nb, const char *fn)
{
    if (pc_uses_next_use(pc) && pc->kind != KVP_PC_NONE && nb > 0 && (hint == NULL || hint->next_use == NULL))
        return KVP_ERR(KVP_EINVAL, "%s: the %s policy needs hint->next_use on every access", fn, pc->pol->name);
    return KVP_OK;
}

kvp_status kvp_pc_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t n_tokens, const kvp_pc_hint *hint,
                        int lock, int32_t *blocks_out, int32_t max_blocks, int32_t *n_hit)
{
    if (pc == NULL || n_hit == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_match: NULL cache or n_hit");
    if (n_tokens < 0 || (n_tokens > 0 && tokens == NULL))
        return KVP_ERR(KVP_EINVAL, "kvp_pc_match: %d tokens at %p", n_tokens, (const void *)tokens);
    if (max_blocks < 0 || (max_blocks > 0 && blocks_out == NULL))
        return KVP_ERR(KVP_EINVAL, "kvp_pc_match: max_blocks %d with blocks_out %p", max_blocks, (void *)blocks_out);
    int32_t maxb = n_tokens > 0 ? (n_tokens - 1) / pc->bs : 0;
    if (maxb > max_blocks) maxb = max_blocks;
    KVP_TRY(check_hint(pc, hint, maxb, "kvp_pc_match"));
    int32_t got = 0;
    pc->clock++;
    kvp_status st = KVP_OK;
    if (maxb > 0 && pc->kind == KVP_PC_RADIX) st = pc_radix_match(pc, tokens, maxb, hint, lock, blocks_out, &got);
    else if (maxb > 0 && pc->kind == KVP_PC_HASH) st = pc_hash_match(pc, tokens, maxb, hint, lock, blocks_out, &got);
    if (st != KVP_OK) {
        pc->clock--;
        return st;
    }
    pc->st.lookups++;
    pc->st.queried_tokens += n_tokens;
    pc->st.hit_tokens += (int64_t)got * pc->bs;
    *n_hit = got;
    return KVP_OK;
}

kvp_status pc_check_blocks(const kvp_prefix_cache *pc, const int32_t *blocks, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b < 0 || b >= pc->nblock_ids)
            return KVP_ERR(KVP_EINVAL, "block %d (position %d) is not in the pool [0, %d)", b, i, pc->nblock_ids);
        if (kvp_pool_refcount(pc->pool, b) < 1)
            return KVP_ERR(KVP_EINVAL, "block %d (position %d) is free: the caller must hold it", b, i);
    }
    return KVP_OK;
}

kvp_status kvp_pc_insert(kvp_prefix_cache *pc, const int32_t *tokens, int32_t n_tokens, const int32_t *blocks,
                         int32_t n_blocks, const kvp_pc_hint *hint, int lock, int32_t *cached_out)
{
    if (pc == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_insert: NULL cache");
    if (n_tokens < 0 || (n_tokens > 0 && tokens == NULL))
        return KVP_ERR(KVP_EINVAL, "kvp_pc_insert: %d tokens at %p", n_tokens, (const void *)tokens);
    if (n_blocks < 0 || n_blocks > n_tokens / pc->bs)
        return KVP_ERR(KVP_EINVAL, "kvp_pc_insert: %d blocks but only %d full blocks in %d tokens", n_blocks,
                       n_tokens / pc->bs, n_tokens);
    if (n_blocks > 0 && blocks == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_insert: blocks is NULL");
    if (lock && n_blocks > 0 && cached_out == NULL)
        return KVP_ERR(KVP_EINVAL, "kvp_pc_insert: lock needs cached_out (the ids to unlock later)");
    KVP_TRY(check_hint(pc, hint, n_blocks, "kvp_pc_insert"));
    if (pc->kind == KVP_PC_NONE || n_blocks == 0) {
        for (int32_t i = 0; cached_out && pc->kind == KVP_PC_NONE && i < n_blocks; i++) cached_out[i] = blocks[i];
        return KVP_OK;
    }
    KVP_TRY(pc_check_blocks(pc, blocks, n_blocks));
    pc->clock++;
    kvp_status st = pc->kind == KVP_PC_RADIX ? pc_radix_insert(pc, tokens, blocks, n_blocks, hint, lock, cached_out)
                                             : pc_hash_insert(pc, tokens, blocks, n_blocks, hint, lock, cached_out);
    if (st != KVP_OK) {
        pc->clock--;
        return st;
    }
    if (pc->st.cached_blocks > pc->st.peak_cached_blocks) pc->st.peak_cached_blocks = pc->st.cached_blocks;
    return KVP_OK;
}

kvp_status kvp_pc_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n)
{
    if (pc == NULL || n < 0 || (n > 0 && blocks == NULL)) return KVP_ERR(KVP_EINVAL, "kvp_pc_unlock: bad arguments");
    if (n == 0 || pc->kind == KVP_PC_NONE) return KVP_OK;
    for (int32_t i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= pc->nblock_ids || pc->block_unit[blocks[i]] < 0)
            return KVP_ERR(KVP_ESTATE, "kvp_pc_unlock: block %d (position %d) is not cached", blocks[i], i);
    return pc->kind == KVP_PC_RADIX ? pc_radix_unlock(pc, blocks, n) : pc_hash_unlock(pc, blocks, n);
}

kvp_status kvp_pc_evict(kvp_prefix_cache *pc, int32_t n, int32_t *n_freed)
{
    if (pc == NULL || n < 0) return KVP_ERR(KVP_EINVAL, "kvp_pc_evict: bad arguments");
    if (n > pc->st.evictable_blocks)
        return KVP_ERR(KVP_ENOBLOCKS, "cannot evict %d blocks: only %lld of %lld cached blocks are evictable", n,
                       (long long)pc->st.evictable_blocks, (long long)pc->st.cached_blocks);
    int32_t freed = 0;
    for (int32_t i = 0; i < n; i++) {
        if (pc->kind == KVP_PC_RADIX) pc_radix_evict_one(pc, &freed);
        else pc_hash_evict_one(pc, &freed);
    }
    if (n_freed) *n_freed = freed;
    return KVP_OK;
}

void kvp_pc_set_evict_hook(kvp_prefix_cache *pc, kvp_pc_evict_fn fn, void *ctx)
{
    pc->on_evict = fn;
    pc->on_evict_ctx = ctx;
}

void kvp_pc_flush(kvp_prefix_cache *pc, int64_t *n_evicted)
{
    const kvp_pc_evict_fn hook = pc->on_evict;
    int64_t n = 0;
    const int all = pc->st.evictable_blocks > 0 && pc->st.evictable_blocks == pc->st.cached_blocks;
    const int nl = pc->nlisteners;
    if (all) {
        const kvp_pc_event ev = {.kind = KVP_PC_EV_CLEARED};
        pc_emit(pc, &ev);
        pc->nlisteners = 0; /* one CLEARED, not a REMOVED per block */
    }
    pc->on_evict = NULL;
    pc->flushing = 1;
    for (int32_t freed = 0; pc->kind != KVP_PC_NONE && pc->st.evictable_blocks > 0; n++) {
        if (pc->kind == KVP_PC_RADIX) pc_radix_evict_one(pc, &freed);
        else pc_hash_evict_one(pc, &freed);
    }
    pc->flushing = 0;
    pc->nlisteners = nl;
    pc->on_evict = hook;
    if (n_evicted) *n_evicted = n;
}

kvp_status kvp_pc_evict_until_free(kvp_prefix_cache *pc, int32_t need)
{
    if (pc == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_evict_until_free: NULL cache");
    while (kvp_pool_num_free(pc->pool) < need && pc->st.evictable_blocks > 0) {
        int64_t k = need - kvp_pool_num_free(pc->pool);
        KVP_TRY(kvp_pc_evict(pc, (int32_t)(k < pc->st.evictable_blocks ? k : pc->st.evictable_blocks), NULL));
    }
    return KVP_OK;
}

int64_t kvp_pc_num_cached(const kvp_prefix_cache *pc)
{
    return pc->st.cached_blocks;
}

int64_t kvp_pc_num_evictable(const kvp_prefix_cache *pc)
{
    return pc->st.evictable_blocks;
}

void kvp_pc_get_stats(const kvp_prefix_cache *pc, kvp_pc_stats *out)
{
    *out = pc->st;
}

double kvp_pc_hit_rate(const kvp_pc_stats *s)
{
    return s->queried_tokens > 0 ? (double)s->hit_tokens / (double)s->queried_tokens : 0.0;
}

kvp_status kvp_pc_check(const kvp_prefix_cache *pc)
{
    if (pc == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_check: NULL cache");
    if (pc->st.peak_cached_blocks < pc->st.cached_blocks)
        return KVP_ERR(KVP_ESTATE, "peak_cached_blocks %lld < cached_blocks %lld", (long long)pc->st.peak_cached_blocks,
                       (long long)pc->st.cached_blocks);
    if (pc->st.inserted_blocks - pc->st.evicted_blocks != pc->st.cached_blocks)
        return KVP_ERR(KVP_ESTATE, "inserted %lld - evicted %lld != cached %lld", (long long)pc->st.inserted_blocks,
                       (long long)pc->st.evicted_blocks, (long long)pc->st.cached_blocks);
    if (pc->st.evictable_blocks < 0 || pc->st.evictable_blocks > pc->st.cached_blocks)
        return KVP_ERR(KVP_ESTATE, "evictable %lld outside [0, cached %lld]", (long long)pc->st.evictable_blocks,
                       (long long)pc->st.cached_blocks);
    int64_t marked = 0;
    for (int32_t b = 0; b < pc->nblock_ids; b++)
        if (pc->block_unit[b] >= 0) {
            marked++;
            if (kvp_pool_refcount(pc->pool, b) < 1)
                return KVP_ERR(KVP_ESTATE, "cached block %d has refcount %d", b, kvp_pool_refcount(pc->pool, b));
        }
    if (marked != pc->st.cached_blocks)
        return KVP_ERR(KVP_ESTATE, "%lld blocks marked cached, counter says %lld", (long long)marked,
                       (long long)pc->st.cached_blocks);
    for (int sg = 0; sg < PC_MAX_SEGS; sg++)
        if (pc_heap_broken(&pc->heaps[sg]) || (sg >= pc->nseg && pc->heaps[sg].n > 0))
            return KVP_ERR(KVP_ESTATE, "eviction heap %d: order or positions broken", sg);
    int64_t in_segs = 0;
    for (int sg = 0; sg < pc->nseg; sg++) {
        if (pc->seg_blocks[sg] < 0) return KVP_ERR(KVP_ESTATE, "segment %d holds %lld blocks", sg, (long long)pc->seg_blocks[sg]);
        in_segs += pc->seg_blocks[sg];
    }
    if (in_segs != pc->st.cached_blocks)
        return KVP_ERR(KVP_ESTATE, "segments hold %lld blocks, %lld cached", (long long)in_segs, (long long)pc->st.cached_blocks);
    if (pc->kind != KVP_PC_NONE && pc->pol->check) KVP_TRY(pc->pol->check(pc));
    if (pc->kind == KVP_PC_RADIX) return pc_radix_check(pc);
    if (pc->kind == KVP_PC_HASH) return pc_hash_check(pc);
    return pc->st.cached_blocks == 0 ? KVP_OK : KVP_ERR(KVP_ESTATE, "cache 'none' holds blocks");
}

kvp_status kvp_pc_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx)
{
    if (pc == NULL || fn == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pc_visit: NULL argument");
    if (pc->kind == KVP_PC_RADIX) return pc_radix_visit(pc, fn, ctx);
    if (pc->kind == KVP_PC_HASH) return pc_hash_visit(pc, fn, ctx);
    return KVP_OK;
}

kvp_status kvp_pc_next_use(const int32_t *const *tokens, const int32_t *lens, const int32_t *match_lens,
                           const uint64_t *extra_keys, int64_t n_accesses, int32_t block_size,
                           int64_t *const *next_use)
{
    if (n_accesses < 0 || n_accesses > INT32_MAX || block_size < 1 || (n_accesses > 0 && (!tokens || !lens || !next_use)))
        return KVP_ERR(KVP_EINVAL, "kvp_pc_next_use: bad arguments");
    pc_map map = {0};
    uint64_t *h = NULL;
    size_t hcap = 0;
    kvp_status st = KVP_OK;
    /* Backwards: the map holds, per chain hash, the earliest later access whose matchable prefix has it. */
    for (int64_t a = n_accesses - 1; a >= 0 && st == KVP_OK; a--) {
        const int32_t ml = match_lens ? (match_lens[a] < lens[a] ? match_lens[a] : lens[a]) : lens[a];
        int32_t nb = lens[a] / block_size, nm = ml > 0 ? (ml - 1) / block_size : 0;
        if (nb == 0) continue;
        if ((st = kvp_grow((void **)&h, &hcap, (size_t)nb, sizeof *h)) != KVP_OK) break;
        if ((st = pc_map_reserve(&map, (size_t)nm)) != KVP_OK) break;
        kvp_pc_chain_hashes(tokens[a], nb, block_size, extra_keys ? extra_keys[a] : 0, h);
        for (int32_t i = 0; i < nb; i++) {
            int64_t s = pc_map_first(&map, h[i]);
            next_use[a][i] = s >= 0 ? map.slots[s].val : KVP_PC_NEVER;
        }
        for (int32_t i = 0; i < nm; i++) {
            int64_t s = pc_map_first(&map, h[i]);
            if (s >= 0) map.slots[s].val = (int32_t)a;
            else pc_map_put(&map, h[i], (int32_t)a);
        }
    }
    kvp_free(h);
    pc_map_fini(&map);
    if (st != KVP_OK) return KVP_ERR(KVP_ENOMEM, "out of memory computing next uses");
    return KVP_OK;
}
