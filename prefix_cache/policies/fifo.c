/* prefix_cache/policies/fifo.c — first inserted first, whatever the accesses since; ties (one insert) deeper
 * block first, then LRU. */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    return (pc_key){m->insert_time, -(int64_t)u->depth, m->last_access};
}

const pc_policy pc_policy_fifo = {
    .name = "fifo",
    .summary = "first inserted first",
    .nseg = 1,
    .key = key,
};
