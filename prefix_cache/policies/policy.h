/* prefix_cache/policies/policy.h — the interface between the prefix caches and an eviction policy.
 *
 * A policy is one file in this folder, policies/<name>.c, defining `const pc_policy pc_policy_<name>`, and one
 * line in policies/list.h. The caches (radix.c, hash.c) call it; nothing outside prefix_cache/ sees it.
 *
 *   cache (radix node / hash entry = a "unit")            policy
 *   --------------------------------------------------   ---------------------------------------------------
 *   every access (match hit, insert)  -> pc_touch ------> generic metadata (clock, freq, sticky priority),
 *                                                          then access() (optional: segment changes)
 *   eviction: the minimum of key()  <------------------- key(meta, unit): an exact order, smaller = evicted first
 *             in segment victim_seg()                     victim_seg() (optional, policies with 2 segments)
 *   a block leaves                    -> evicted() -----> (optional: ghost lists)
 *   insert about to add n blocks      -> reserve(n) ----> (optional: room for the policy's own state; the only
 *                                                          hook that may fail, KVP_ENOMEM, before any change)
 *
 * Contract of key(): a function of the unit's metadata (pc_meta) and shape (pc_unit) only. The eviction heap is lazy
 * (prefix_cache_internal.h): a unit's key may rise at any time (an access, a radix trim or split) without the cache
 * telling the heap, but it must never fall, except for policies flagged PC_POLICY_NEXT_USE, whose keys the caches lower
 * eagerly after every access. A policy whose ranking needs global state (a fraction of the cache, an adaptive target)
 * expresses it through segments: units of each segment (pc_meta.seg, set by access()) sit in their own heap, key()
 * orders a segment, and victim_seg() says which segment gives the next victim (the other one when it holds nothing
 * evictable).
 *
 * Radix units are nodes: a run of blocks sharing one access history; eviction trims the node's LAST block, so
 * pc_unit describes that block (depth, next use) and the node's size (nblocks). Hash units are single blocks.
 * Ties in key() should end with the depth (deeper first), as every built-in policy does: within one request
 * every block gets the same clock, and a prefix cache must drop a chain from its tail.
 */
#ifndef KVP_PREFIX_CACHE_POLICIES_POLICY_H
#define KVP_PREFIX_CACHE_POLICIES_POLICY_H

#include <stdint.h>

#include "prefix_cache/prefix_cache_internal.h"

/* The shape of a unit, for key() and access(). */
typedef struct pc_unit_s {
    int64_t next_use;       /* PC_POLICY_NEXT_USE policies: next use of the unit's last block, else 0 */
    int32_t depth;          /* blocks from the root through the unit's last block (>= 1) */
    int32_t nblocks;        /* blocks in the unit (>= 1; 1 for a hash entry) */
    int32_t block_size;     /* tokens per block */
    const uint64_t *hashes; /* [nblocks] the chain hash of each block of the unit (borrowed during the call) */
} pc_unit;

enum {
    PC_POLICY_NEXT_USE = 1, /* needs kvp_pc_hint.next_use on every access; keys may fall on an access */
};

typedef struct pc_policy {
    const char *name;    /* as --evict takes it */
    const char *summary; /* one line: what it evicts first */
    unsigned flags;      /* PC_POLICY_* */
    int nseg;            /* segments (heaps): 1, or up to PC_MAX_SEGS */
    /* The unit's place in its segment's eviction order: the smallest key goes first. Required. */
    pc_key (*key)(const pc_meta *m, const pc_unit *u);
    /* Optional. Sets up pc->pol_state at kvp_pc_create (the pool is known: pc->pool); KVP_ENOMEM. */
    kvp_status (*init)(kvp_prefix_cache *pc);
    /* Optional. After the generic update of m on an access; is_new: the unit was just created (its first access).
     * May set m->seg (the cache moves the unit between heaps and segment counts). */
    void (*access)(kvp_prefix_cache *pc, pc_meta *m, const pc_unit *u, int is_new);
    /* Optional. Segment to take the next victim from (0..nseg-1). */
    int (*victim_seg)(const kvp_prefix_cache *pc);
    /* Optional. Block `hash` of a unit with metadata m leaves the cache by eviction (not by a flush). */
    void (*evicted)(kvp_prefix_cache *pc, const pc_meta *m, uint64_t hash);
    /* Optional. An insert will add up to n_new blocks: make room for the policy's state (KVP_ENOMEM, nothing
     * changed). Called before the insert changes anything. */
    kvp_status (*reserve)(kvp_prefix_cache *pc, int64_t n_new);
    /* Optional. Frees pc->pol_state (called by kvp_pc_destroy). */
    void (*fini)(kvp_prefix_cache *pc);
    /* Optional. Invariants of the policy's own state (kvp_pc_check): KVP_OK or KVP_ESTATE naming the problem. */
    kvp_status (*check)(const kvp_prefix_cache *pc);
} pc_policy;

/* The policy of each kvp_evict_policy value (prefix_cache.c). */
const pc_policy *pc_policy_of(kvp_evict_policy p);

/* An int64 that orders like the finite non-negative double x (its IEEE-754 bits): for keys that are ratios or
 * products, compared exactly without a common denominator. */
static inline int64_t pc_key_of_double(double x)
{
    union {
        double d;
        int64_t i;
    } u = {.d = x > 0 ? x : 0.0};
    return u.i;
}

#endif
