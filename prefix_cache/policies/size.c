/* prefix_cache/policies/size.c — hits per token (HPT, sglang#30300): the unit with the fewest accesses per
 * token it holds goes first, ties by LRU. A large node that was used rarely frees many blocks for little loss;
 * a small hot one stays. In the radix cache a unit is a node (nblocks x block_size tokens, and trimming its
 * tail raises what is left); in the hash cache every unit is one block, so the order is LFU's (ties LRU). */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    const double tokens = (double)u->nblocks * (double)u->block_size;
    return (pc_key){pc_key_of_double((double)m->freq / tokens), m->last_access, -(int64_t)u->depth};
}

const pc_policy pc_policy_size = {
    .name = "size",
    .summary = "fewest hits per cached token first (radix: per node), ties by lru (sglang#30300)",
    .nseg = 1,
    .key = key,
};
