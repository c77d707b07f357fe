/* prefix_cache/policies/lru.c — least recently used first (the default; vLLM's and SGLang's): the unit whose
 * last access is oldest, the deeper block first among those of one access. */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->last_access, -(int64_t)u->depth, 0};
}

const pc_policy pc_policy_lru = {
    .name = "lru",
    .summary = "least recently used first",
    .nseg = 1,
    .key = key,
};
