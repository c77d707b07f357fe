/* prefix_cache/policies/belady.c — the offline optimum (Belady's MIN): the unit whose next use lies furthest in
 * the future first, "never" first of all. Every access must carry kvp_pc_hint.next_use (kvp_pc_next_use); a
 * unit's next use moves earlier on an access, so its key can fall (PC_POLICY_NEXT_USE: lowered eagerly). */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){-u->next_use, -(int64_t)u->depth, m->last_access};
}

const pc_policy pc_policy_belady = {
    .name = "belady",
    .summary = "next use furthest in the future first (offline optimum; needs next-use hints)",
    .flags = PC_POLICY_NEXT_USE,
    .nseg = 1,
    .key = key,
};
