/* prefix_cache/prefix_cache.h — reuse of KV blocks across requests that share a prompt prefix.
 *
 * One interface, three implementations (kvp_pc_kind):
 *
 *   radix  a radix tree whose edges are whole blocks of token ids (SGLang RadixAttention with pages).
 *          A match that ends inside an edge splits the node, so every node's blocks share one history.
 *
 *              root
 *             /    \
 *        [A B]      [F]            each [..] is one node: a run of full blocks (block ids + their tokens)
 *        /    \       \
 *     [C]    [D E]    [G H I]      evictable = unlocked leaves; eviction trims a leaf from its tail,
 *                                  one block at a time, so the cached set stays prefix-closed
 *
 *   hash   a chain hash per full block, h_i = XXH3(h_{i-1}, tokens of block i, extra_key), in a hash map
 *          hash -> block (vLLM automatic prefix caching). Any unlocked cached block is evictable (a
 *          middle block may go first, orphaning later ones, exactly as in vLLM); ties in the policy's
 *          order evict deeper blocks first.
 *
 *   none   caches nothing: every match returns 0 blocks, insert keeps nothing.
 *
 * Ownership of blocks (agreed with blockmgr/): the cache holds ITS OWN reference (kvp_pool_incref) on
 * every cached block. A request that uses cached blocks takes its own references (kvp_pool_incref, or the
 * block manager's prefixed allocation) and locks them in the cache while it runs. Eviction drops the
 * cache's reference (kvp_pool_decref): a block held by nobody else goes back to the free list. The pool is
 * borrowed: it must outlive the cache.
 *
 * Rules shared by radix and hash:
 *   - Only full blocks are cached (tokens beyond n_tokens / block_size * block_size are ignored).
 *   - A match never covers a prompt's last token (it must be computed to produce logits, as in vLLM):
 *     match considers at most (n_tokens - 1) / block_size blocks.
 *   - Eviction policy (kvp_evict_policy) orders the evictable units (radix: leaves; hash: blocks); each policy
 *     is one file under policies/ (policies/policy.h is the interface, prefix_cache/README.md says how to add
 *     one):
 *       lru       least recently accessed first (default)
 *       lfu       fewest accesses first, ties by lru
 *       fifo      first inserted first
 *       priority  lowest priority first, ties by lru; a block's priority is the HIGHEST priority of any
 *                 access that touched it (sticky), so a system prompt inserted once with a high priority
 *                 is pinned: it is evicted only after every lower-priority block
 *       belady    the offline optimum: the block whose next use is furthest in the future first; needs
 *                 kvp_pc_hint.next_use on every access (see kvp_pc_next_use)
 *       slru      segmented lru (SGLang's): units never accessed again since cached first, then the others,
 *                 each segment in lru order
 *       arc       adaptive replacement cache: lru over units used once and over units reused, the first
 *                 segment's target size adapted from ghost lists of evicted hashes
 *       cost      smallest frequency x squared prefix length (the recompute cost of the block's position,
 *                 vllm#23641) first, ties by lru
 *       size      fewest accesses per cached token first (hits per token, sglang#30300; per radix node, so
 *                 for hash the order is lfu's), ties by lru
 *     An "access" is a match that hits the unit or an insert that reaches it.
 *   - Every call that fails leaves the cache and the pool exactly as they were (allocations are made
 *     before anything is changed).
 *
 * Access protocol of a request (scheduler or bench):
 *     kvp_pc_match(pc, toks, n, &hint, 1, hit, cap, &n_hit);     // lock the hit prefix
 *     ... take own refs on hit[0..n_hit), allocate the rest, prefill ...
 *     kvp_pc_insert(pc, toks, n, blocks, n_full, &hint, 0, NULL); // cache the full blocks
 *     ... decode ...
 *     kvp_pc_unlock(pc, hit, n_hit);                             // at finish
 * Every locking call (match with lock=1 that returned n_hit > 0, insert with lock=1) must be paired with
 * exactly one kvp_pc_unlock with the blocks that call reported. When blocks run out: kvp_pc_evict.
 *
 * Not thread-safe: one owner (the scheduler thread) at a time.
 */
#ifndef KVP_PREFIX_CACHE_PREFIX_CACHE_H
#define KVP_PREFIX_CACHE_PREFIX_CACHE_H

#include <stdint.h>

#include "blockmgr/block_pool.h"
#include "common/status.h"

typedef enum { KVP_PC_NONE = 0, KVP_PC_RADIX, KVP_PC_HASH } kvp_pc_kind;

/* KVP_EVICT_LRU = 0, LFU, FIFO, PRIORITY, BELADY, SLRU, ARC, COST, SIZE (policies/list.h), then
 * KVP_EVICT_POLICIES, their number. */
typedef enum {
#define KVP_PC_POLICY(ID, name) KVP_EVICT_##ID,
#include "prefix_cache/policies/list.h"
#undef KVP_PC_POLICY
    KVP_EVICT_POLICIES
} kvp_evict_policy;

/* "radix" | "hash" | "none" and a policy's name ("lru", "lfu", ..., kvp_evict_policy_name); KVP_EINVAL naming
 * the value and listing the choices otherwise. The _name functions return a static string ("?" for an unknown
 * value); kvp_evict_policy_summary one line saying what the policy evicts first. */
kvp_status kvp_pc_kind_parse(const char *s, kvp_pc_kind *out);
kvp_status kvp_evict_policy_parse(const char *s, kvp_evict_policy *out);
const char *kvp_pc_kind_name(kvp_pc_kind k);
const char *kvp_evict_policy_name(kvp_evict_policy p);
const char *kvp_evict_policy_summary(kvp_evict_policy p);

/* "Never used again" for kvp_pc_hint.next_use. */
#define KVP_PC_NEVER INT64_MAX

/* Per-access hints. A NULL hint means priority 0, extra_key 0, no next-use information. */
typedef struct {
    int32_t priority;        /* priority policy: higher is kept longer (sticky maximum per block) */
    uint64_t extra_key;      /* salt of the first block (LoRA id, multimodal hash...): different keys
                                never share blocks (both radix and hash) */
    const int64_t *next_use; /* [n_tokens / block_size] or NULL. For block i of this prompt: the logical
                                time (e.g. request index) of the next access that will need it, or
                                KVP_PC_NEVER. Borrowed for the duration of the call. Required by belady
                                (KVP_EINVAL without it), ignored by the other policies. */
} kvp_pc_hint;

typedef struct {
    int64_t lookups;            /* kvp_pc_match calls */
    int64_t queried_tokens;     /* sum of n_tokens over matches */
    int64_t hit_tokens;         /* sum of n_hit * block_size over matches */
    int64_t inserted_blocks;    /* blocks that became cached */
    int64_t evicted_blocks;     /* blocks dropped by eviction */
    int64_t cached_blocks;      /* blocks cached now */
    int64_t peak_cached_blocks; /* maximum of cached_blocks over time */
    int64_t evictable_blocks;   /* blocks that kvp_pc_evict could drop now */
    int64_t nodes;              /* radix: tree nodes without the root; hash: map entries */
} kvp_pc_stats;

typedef struct kvp_prefix_cache kvp_prefix_cache;

/* block_size must equal kvp_pool_block_size(pool) (KVP_EINVAL otherwise). The pool is borrowed and must
 * outlive the cache. *out is owned by the caller (kvp_pc_destroy). */
kvp_status kvp_pc_create(kvp_pc_kind kind, kvp_evict_policy policy, kvp_block_pool *pool, int32_t block_size,
                         kvp_prefix_cache **out);
/* Drops the cache's reference on every cached block (locked or not) and frees the cache. NULL: no-op. */
void kvp_pc_destroy(kvp_prefix_cache *pc);

kvp_pc_kind kvp_pc_get_kind(const kvp_prefix_cache *pc);
kvp_evict_policy kvp_pc_get_policy(const kvp_prefix_cache *pc);
int32_t kvp_pc_block_size(const kvp_prefix_cache *pc);

/* Longest cached prefix of tokens[0..n_tokens) in whole blocks, never covering the last token.
 * blocks_out[0..*n_hit) receive the cached block ids in order (blocks_out may hold max_blocks entries;
 * a hit is cut at max_blocks). Counts a lookup, n_tokens queried and *n_hit * block_size hit tokens, and
 * records an access (policy metadata) on the hit blocks. With lock = 1 the hit blocks become
 * unevictable until kvp_pc_unlock(pc, blocks_out, *n_hit). Radix may split a node (KVP_ENOMEM possible,
 * cache unchanged). n_tokens >= 0; tokens may be NULL only when n_tokens == 0. */
kvp_status kvp_pc_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t n_tokens, const kvp_pc_hint *hint,
                        int lock, int32_t *blocks_out, int32_t max_blocks, int32_t *n_hit);

/* Caches the first n_blocks full blocks of tokens (n_blocks <= n_tokens / block_size), block i being
 * blocks[i] (a block id held by the caller). A position already cached keeps the cache's block: the
 * caller's block is not referenced and the caller should use the cached one (cached_out). New entries take
 * a cache reference (incref). Records an access on every block of the path. With lock = 1 the whole path
 * (n_blocks blocks) is locked until kvp_pc_unlock(pc, cached_out, n_blocks). cached_out (may be NULL unless
 * lock = 1) receives the cache's block for each position (for hash: the block cached at that chain hash).
 * Does not evict: with a bounded pool the caller evicts first. KVP_EINVAL for a block id out of the pool
 * or a free block; KVP_ENOMEM with nothing changed. Not counted as a lookup. */
kvp_status kvp_pc_insert(kvp_prefix_cache *pc, const int32_t *tokens, int32_t n_tokens, const int32_t *blocks,
                         int32_t n_blocks, const kvp_pc_hint *hint, int lock, int32_t *cached_out);

/* Releases one lock taken by a match or an insert on blocks[0..n) (the ids that call reported, in order).
 * KVP_ESTATE (nothing changed) when those blocks are not cached or not locked. n == 0 is a no-op. */
kvp_status kvp_pc_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n);

/* Drops exactly n evictable blocks in policy order (their cache references are decref'ed; blocks held by
 * nobody else return to the free list). KVP_ENOBLOCKS with nothing evicted when fewer than n blocks are
 * evictable (never loops). *n_freed (may be NULL) = how many of them reached the free list. */
kvp_status kvp_pc_evict(kvp_prefix_cache *pc, int32_t n, int32_t *n_freed);

/* Evicts in policy order until the pool has at least `need` free blocks or nothing is evictable. A block
 * still referenced outside the cache (a running sequence's) frees nothing when evicted, so the pool's free
 * blocks plus the evictable ones overstate what eviction gives: callers check the free count afterwards. */
kvp_status kvp_pc_evict_until_free(kvp_prefix_cache *pc, int32_t need);

/* Eviction hook (write-back to a host tier, host_cache.h): fn(ctx, chain_hash, block) is called for every
 * block eviction drops, before the cache's reference on it goes (its KV is intact until the caller reuses
 * the block). chain_hash is the key of the prefix the block completes (kvp_pc_chain_hashes: its key in the
 * hash cache and in the host tier). fn must not call back into the cache. NULL fn: none (the default). */
typedef void (*kvp_pc_evict_fn)(void *ctx, uint64_t chain_hash, int32_t block);
void kvp_pc_set_evict_hook(kvp_prefix_cache *pc, kvp_pc_evict_fn fn, void *ctx);

/* Listeners: what enters and leaves the cache, for KV events (kv_events.h: vLLM's BlockStored, BlockRemoved,
 * AllBlocksCleared) and the miss ledger (ledger.h). fn(ctx, ev) is called
 *   KVP_PC_EV_STORED   once per run of consecutive blocks an insert adds (radix: the new node; hash: each run of
 *                      positions that were not cached), after they are cached;
 *   KVP_PC_EV_REMOVED  once per block that eviction or a flush drops (flush = 1 for a flush), before its
 *                      cache reference goes;
 *   KVP_PC_EV_CLEARED  once when a flush drops everything (nothing was locked), instead of one REMOVED per block.
 * Pointers in ev are borrowed for the call. fn must not call back into the cache. At most KVP_PC_MAX_LISTENERS
 * listeners (KVP_EINVAL beyond; the same fn and ctx twice is KVP_EINVAL too); removing one that is not there
 * is a no-op. */
#define KVP_PC_MAX_LISTENERS 4
typedef enum { KVP_PC_EV_STORED = 0, KVP_PC_EV_REMOVED, KVP_PC_EV_CLEARED } kvp_pc_event_kind;
typedef struct {
    kvp_pc_event_kind kind;
    int32_t n;              /* blocks (0 for CLEARED) */
    const uint64_t *hashes; /* [n] the chain hash of each block (kvp_pc_chain_hashes) */
    const int32_t *blocks;  /* [n] their block ids */
    int32_t depth;          /* STORED: position of hashes[0] in its chain (0 = a first block) */
    uint64_t parent_hash;   /* STORED: the chain hash of the block before hashes[0]; 0 when depth == 0 */
    const int32_t *tokens;  /* STORED: [n * block_size] the blocks' tokens */
    uint64_t extra_key;     /* STORED: the access's extra key (salt of the first block) */
    int flush;              /* REMOVED: dropped by kvp_pc_flush, not by eviction */
} kvp_pc_event;
typedef void (*kvp_pc_event_fn)(void *ctx, const kvp_pc_event *ev);
kvp_status kvp_pc_add_listener(kvp_prefix_cache *pc, kvp_pc_event_fn fn, void *ctx);
void kvp_pc_remove_listener(kvp_prefix_cache *pc, kvp_pc_event_fn fn, void *ctx);

/* Drops every evictable block (radix: round after round, a trimmed leaf's parent becoming one), as a reset
 * does: locked blocks stay. Not eviction under pressure: the hook is not called (nothing to write back), and
 * policies keep no trace of the dropped blocks (arc's ghosts). Listeners get one REMOVED (flush = 1) per block,
 * or one CLEARED when nothing stays. *n_evicted (may be NULL) = the blocks dropped. */
void kvp_pc_flush(kvp_prefix_cache *pc, int64_t *n_evicted);

int64_t kvp_pc_num_cached(const kvp_prefix_cache *pc);
int64_t kvp_pc_num_evictable(const kvp_prefix_cache *pc);
void kvp_pc_get_stats(const kvp_prefix_cache *pc, kvp_pc_stats *out);
/* hit_tokens / queried_tokens, 0 when nothing was queried. */
double kvp_pc_hit_rate(const kvp_pc_stats *s);

/* Invariant walker (tests): radix: parent/child links, edge lengths, lock counts (a node's lock >= each
 * child's), the evictable set = unlocked leaves, block -> node index, each block's stored chain hash; hash:
 * map <-> entries, evictable
 * set = unlocked entries; both: counters, every cached block has pool refcount >= 1 + (locks? 0 : 0),
 * no block cached twice. KVP_OK or KVP_ESTATE naming the first violation. O(cached blocks). */
kvp_status kvp_pc_check(const kvp_prefix_cache *pc);

/* Cached blocks for tests: calls fn once per cached block with the chain hash of the prefix it completes
 * (kvp_pc_block_hash applied from block 0 to this block, extra key included), its depth (0 for a first
 * block), its block id, its lock count and its tokens (radix only: block_size tokens, borrowed during the
 * call; NULL for hash, which does not keep tokens). */
typedef void (*kvp_pc_visit_fn)(void *ctx, uint64_t chain_hash, int32_t depth, int32_t block, int32_t locks,
                                const int32_t *block_tokens);
kvp_status kvp_pc_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx);

/* Belady support: given a sequence of accesses (access a caches tokens[a][0..lens[a]) and matches its first
 * match_lens[a] <= lens[a] tokens, its prompt; match_lens NULL: lens; in the order they will be made),
 * fills next_use[a][i] for each full block i < lens[a] / block_size of each access with the index of the
 * next access a' > a whose matchable prefix ((match_lens[a'] - 1) / block_size blocks, extra keys equal)
 * contains the same prefix block, or KVP_PC_NEVER. next_use[a] arrays are caller-owned and hold
 * lens[a] / block_size entries. extra_keys may be NULL (all 0). On KVP_ENOMEM the arrays' contents are
 * unspecified. */
kvp_status kvp_pc_next_use(const int32_t *const *tokens, const int32_t *lens, const int32_t *match_lens,
                           const uint64_t *extra_keys, int64_t n_accesses, int32_t block_size,
                           int64_t *const *next_use);

/* The chain hash of block i given the previous block's hash (h_{-1} = 0 for block 0; extra_key mixes into
 * block 0 only): the function used by the hash cache and kvp_pc_next_use. */
uint64_t kvp_pc_block_hash(uint64_t prev, const int32_t *block_tokens, int32_t block_size, uint64_t extra_key);
/* out[i] = the chain hash of block i of tokens, for the first n_blocks full blocks (kvp_pc_block_hash from
 * block 0, extra_key mixed into block 0): the key of a block in the hash cache and in the host tier. */
void kvp_pc_chain_hashes(const int32_t *tokens, int32_t n_blocks, int32_t block_size, uint64_t extra_key, uint64_t *out);

#endif
