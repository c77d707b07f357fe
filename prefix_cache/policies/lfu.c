/* prefix_cache/policies/lfu.c — least frequently used first: fewest accesses (matches that hit the unit and
 * inserts that reached it), ties by LRU, then the deeper block. */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->freq, m->last_access, -(int64_t)u->depth};
}

const pc_policy pc_policy_lfu = {
    .name = "lfu",
    .summary = "fewest accesses first, ties by lru",
    .nseg = 1,
    .key = key,
};
