/* prefix_cache/policies/slru.c — segmented LRU, in SGLang's form (--radix-eviction-policy slru): a probationary
 * segment of units accessed once since they were cached, evicted first, in LRU order, then a protected segment
 * of units accessed again (freq >= 2: a later match or insert reached them), in LRU order. One scan of
 * never-reused prefixes can then not push out the reused ones. As in SGLang the protected segment has no size
 * limit (classic SLRU demotes its LRU end into probation instead), so the order is one key, (protected, LRU). */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->freq >= 2, m->last_access, -(int64_t)u->depth};
}

const pc_policy pc_policy_slru = {
    .name = "slru",
    .summary = "segmented lru: blocks never reused since cached first, then the reused ones, each in lru order",
    .nseg = 1,
    .key = key,
};
