/* prefix_cache/policies/cost.c — frequency x recompute cost (vllm#23641): the retention benefit of a cached
 * block is how often it is used times what recomputing it would cost, and the block with the smallest benefit
 * goes first. The cost of the prefix a block completes grows as its length squared (attention; the issue's
 * alpha = 2), so the key is freq x depth^2 (depth in blocks; the block size is a common factor), ties by LRU.
 *
 * Shallow, rarely used prefixes go before deep ones. In the hash cache, which may drop any unlocked block, that
 * includes the first blocks of chains whose deeper blocks then stay cached but unreachable until they are
 * evicted in turn (as they would in vLLM): the sweeps show what it costs. The radix cache trims leaves only. */
#include "prefix_cache/policies/policy.h"

static pc_key key(const pc_meta *m, const pc_unit *u)
{
    const double d = (double)u->depth;
    return (pc_key){pc_key_of_double((double)m->freq * d * d), m->last_access, -(int64_t)u->depth};
}

const pc_policy pc_policy_cost = {
    .name = "cost",
    .summary = "smallest frequency x recompute cost (depth^2) first, ties by lru (vllm#23641)",
    .nseg = 1,
    .key = key,
};
