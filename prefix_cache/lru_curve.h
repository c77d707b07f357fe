/* prefix_cache/lru_curve.h — the LRU hit rate of a prefix cache at every capacity, in one pass (Mattson's
 * stack algorithm over blocks, with the two corrections a replay through a block pool needs).
 *
 * Feed the accesses of a replay in order (kvp_lruc_access), then read the hit tokens at any capacity C blocks
 * (kvp_lruc_hit_tokens), from 1 to unbounded, for the price of one replay: O(blocks x log accesses) time,
 * O(distinct blocks + block accesses) memory.
 *
 * The stack. Blocks are named by chain hash. After each access its full blocks move to the top of a recency
 * stack, its first block on top and its last one lowest: the order of the caches' LRU key (last access, then
 * the deeper block first), in which a block's prefix is always above it. Each looked-up block's position p
 * before the access (1 = top; never seen: infinite) is its stack distance.
 *
 * When the curve is a replay, exactly. For `bench prefix`'s replay (bench_prefix.h) through a radix or a hash
 * cache with lru eviction, no host tier, and pins (workload prefixes inserted first) that repeat no cached
 * content, hit_tokens(C) equals the replay's hit tokens at capacity C for EVERY C >= 1 (tested at 10+ capacities
 * on every workload, tests/prefix_cache/test_lru_curve.c and tests/bench/test_bench_prefix.c). Why:
 *   - Inclusion holds: LRU never evicts a block while keeping a less recent one, except the current request's
 *     locked hits, which are the most recent anyway; a block's prefix is more recent than the block, so the
 *     cached set is prefix-closed and is always a top-L of the stack, for radix (leaf-only eviction trims the
 *     least recent leaf, which is the least recent block) and for hash alike (in LRU order a hash cache never
 *     orphans a block: its parent is more recent). Both caches therefore hold the same blocks.
 *   - L is not C: a request allocates its blocks before it caches them. Its partial last block holds a pool
 *     block while it runs and is then freed; and a block-aligned prompt whose last full block is cached cannot
 *     match it (the last token is always computed), allocates a fresh block for it and drops that copy at insert
 *     time, having evicted one block too many. So after request b the cache holds L_b = C - delta_b blocks,
 *     with delta_b in {0, 1} once the pool has filled: delta_b = 1 when b's last block is partial and b fits in
 *     the pool (C >= its blocks), or when b is block-aligned and all its blocks were within the top C - 1 of the
 *     stack (p_max(b) < C); 0 otherwise. A request that does not fit (C < its blocks) caches its first C blocks,
 *     the stack's top C: delta = 0, and the curve stays exact below the largest request too.
 *   - So a block looked up by request a hits at C iff p <= C - delta_{a-1}(C): at every C >= p + 1, and at C = p
 *     unless delta_{a-1}(p) = 1. The curve adds these per block; the plain stack curve counts p <= C and the exact
 *     one lies between the plain curve at C - 1 and at C (kvp_lruc_stack_hit_tokens).
 * Not a replay: any other policy (lfu, ..., arc; only lru has the stack property), a host tier behind the cache
 * (write-through or write-back change nothing of the device hits, but the device curve says nothing of the
 * tier's hits), pins repeating cached content (kvp_lruc_exact says so), and the engine (kvp_lruc is a replay's
 * stack: concurrent requests lock each other's blocks and the scheduler interleaves them).
 */
#ifndef KVP_PREFIX_CACHE_LRU_CURVE_H
#define KVP_PREFIX_CACHE_LRU_CURVE_H

#include <stdint.h>

#include "common/status.h"

typedef struct kvp_lru_curve kvp_lru_curve;

/* block_size >= 1. *out owned by the caller. KVP_EINVAL, KVP_ENOMEM. */
kvp_status kvp_lruc_create(int32_t block_size, kvp_lru_curve **out);
void kvp_lruc_destroy(kvp_lru_curve *c); /* NULL: no-op */

/* One access in replay order: the full blocks of tokens[0..n_tokens) are cached; its first match_tokens tokens
 * (<= n_tokens) are looked up, (match_tokens - 1) / block_size blocks as the caches match them; match_tokens = 0
 * for a pin (inserted without a lookup). extra_key as kvp_pc_hint's. KVP_EINVAL; KVP_ENOMEM with the curve
 * unchanged; KVP_ESTATE after kvp_lruc_finish. */
kvp_status kvp_lruc_access(kvp_lru_curve *c, const int32_t *tokens, int32_t n_tokens, int32_t match_tokens,
                           uint64_t extra_key);

/* Ends the accesses and builds the curve (KVP_ENOMEM). The queries below need it. */
kvp_status kvp_lruc_finish(kvp_lru_curve *c);

/* Distinct blocks seen: above this capacity the curve is flat at its unbounded value. */
int64_t kvp_lruc_blocks(const kvp_lru_curve *c);
/* Tokens looked up (the sum of match_tokens) and hit at capacity C blocks (C <= 0: unbounded). */
int64_t kvp_lruc_lookup_tokens(const kvp_lru_curve *c);
int64_t kvp_lruc_hit_tokens(const kvp_lru_curve *c, int64_t capacity);
/* The plain stack-distance curve (Mattson): looked-up blocks with p <= C. */
int64_t kvp_lruc_stack_hit_tokens(const kvp_lru_curve *c, int64_t capacity);
/* The largest access in blocks (ceil(n_tokens / block_size)): requests do not fit below it. */
int64_t kvp_lruc_max_access_blocks(const kvp_lru_curve *c);
/* 1 unless a pin repeated content already seen (then the curve is not the replay's). */
int kvp_lruc_exact(const kvp_lru_curve *c);

#endif
