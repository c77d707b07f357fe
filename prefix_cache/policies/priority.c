/* prefix_cache/policies/priority.c — lowest priority first, ties by LRU. A unit's priority is the highest
 * kvp_pc_hint.priority of any access that touched it (sticky, pc_touch), so a system prompt inserted once with
 * a high priority is evicted only after every lower-priority block. */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->priority, m->last_access, -(int64_t)u->depth};
}

const pc_policy pc_policy_priority = {
    .name = "priority",
    .summary = "lowest (sticky, highest-seen) priority first, ties by lru",
    .nseg = 1,
    .key = key,
};
