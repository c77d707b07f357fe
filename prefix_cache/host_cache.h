/* prefix_cache/host_cache.h — a second tier of the prefix cache in host memory (CPU offloading, as vLLM's
 * OffloadingConnector and SGLang's HiCache do): full KV blocks copied from the device to host slots, keyed by
 * the chain hash of the prefix they complete (kvp_pc_block_hash), so that a prompt whose prefix has left
 * the device cache loads it back over PCIe instead of computing it again.
 *
 *   device prefix cache (radix / hash)      host cache: capacity slots, LRU
 *     match: n_hit blocks  ─────────────►   match the chain hashes of blocks n_hit.. : n_load more blocks,
 *                                            copied host slot -> fresh device block (a "load")
 *     insert (computed blocks) ─────────►   store (write-through): each full block not yet held gets a slot
 *                                            and is copied device block -> host slot (a "store")
 *     evict (write-back instead) ───────►   store the evicted block (kvp_pc_set_evict_hook)
 *
 * The host cache holds no KV itself: it only says which slot holds which block, and the caller moves the
 * data (the engine hands the moves to its executor; `bench prefix` only counts them). Slots are
 * [0, capacity). Nothing is locked: a load is copied before anything else can evict its slot.
 *
 * Eviction is LRU over blocks. A match touches its hits from the deepest to the first, and a store stores
 * from the last block to the first, so that within a prompt the deeper blocks are older and leave first:
 * the held set of a prompt stays a prefix (a hit needs a run of consecutive blocks).
 *
 * Every call but create is O(blocks given) and never allocates: the map and the lists are sized at create.
 * A 64-bit chain hash (kvp_pc_chain_hashes) names a block (a collision would load a wrong block, as in vLLM's hash cache).
 * Not thread-safe: one owner at a time.
 */
#ifndef KVP_PREFIX_CACHE_HOST_CACHE_H
#define KVP_PREFIX_CACHE_HOST_CACHE_H

#include <stdint.h>

#include "common/status.h"

typedef struct kvp_host_cache kvp_host_cache;

typedef struct {
    int64_t lookups;        /* kvp_hc_match calls with n > 0 */
    int64_t queried_blocks; /* blocks asked for by those calls */
    int64_t hit_blocks;     /* blocks found (to be loaded) */
    int64_t stored_blocks;  /* blocks given a slot (to be copied to the host) */
    int64_t evicted_blocks; /* blocks dropped to make room */
    int64_t held_blocks;    /* blocks held now */
} kvp_hc_stats;

/* capacity >= 1 slots (KVP_EINVAL otherwise); KVP_ENOMEM. *out is owned by the caller. */
kvp_status kvp_hc_create(int32_t capacity, kvp_host_cache **out);
void kvp_hc_destroy(kvp_host_cache *hc); /* NULL: no-op */
int32_t kvp_hc_capacity(const kvp_host_cache *hc);

/* The longest run hashes[0..k) held, k <= n: slots_out[0..k) their slots (slots_out holds n entries).
 * Touches them (most recently used, the first block last). Returns k (0 for n <= 0). */
int32_t kvp_hc_match(kvp_host_cache *hc, const uint64_t *hashes, int32_t n, int32_t *slots_out);

/* Write-through of the full blocks hashes[0..n) of one sequence, first block first. Each block not held
 * gets a slot (evicting the least recently used block when the cache is full): slots_out[i] = that slot, to
 * be filled with the block's KV; a block already held is touched and gets slots_out[i] = -1. When n exceeds
 * the capacity, only the first `capacity` blocks are stored (the rest get -1). Returns the number of new
 * slots (copies to make). */
int32_t kvp_hc_store(kvp_host_cache *hc, const uint64_t *hashes, int32_t n, int32_t *slots_out);

/* The slot the next new block would take from another: -1 while a slot is free, else the least recently
 * used one (a caller with a copy still to read from a slot holds back a store that would take it). */
int32_t kvp_hc_victim(const kvp_host_cache *hc);

/* When blocks are written to the tier (SGLang's --hicache-write-policy):
 *   write_through  every block the device cache takes in is stored at once (vLLM's CPU offloading too):
 *                  the tier is a superset of what the device cache has held lately, and the copies run
 *                  in the background, off the step's critical path;
 *   write_back     a block is stored only when the device cache evicts it, and must be copied before its
 *                  device block is reused (on the critical path): far fewer copies, and the tier holds
 *                  mostly what the device cache does not, so the two capacities add up;
 *   write_through_selective  (SGLang's default) a block is stored, in the background, once it has been
 *                  reused: when a sequence that found it in the device cache caches its blocks (SGLang
 *                  stores a radix node when its hit count reaches 2: its first caching, then a reuse).
 *                  Blocks used once never take a tier slot, so the tier keeps the ones that come back. */
typedef enum {
    KVP_HC_WRITE_THROUGH,
    KVP_HC_WRITE_BACK,
    KVP_HC_WRITE_THROUGH_SELECTIVE,
    KVP_HC_WRITE_POLICIES /* how many */
} kvp_hc_write_policy;
kvp_status kvp_hc_write_policy_parse(const char *s, kvp_hc_write_policy *out);
const char *kvp_hc_write_policy_name(kvp_hc_write_policy p);
/* How many of a sequence's first n_full full blocks a caching of them offers the tier (kvp_hc_store) under
 * policy p: all of them (write_through), the first n_hit, those it found in the device cache
 * (write_through_selective), none (write_back: evictions store). */
int32_t kvp_hc_blocks_to_store(kvp_hc_write_policy p, int32_t n_full, int32_t n_hit);

/* Drops every block (a cold cache); the counters but held_blocks are kept. */
void kvp_hc_clear(kvp_host_cache *hc);

void kvp_hc_get_stats(const kvp_host_cache *hc, kvp_hc_stats *out);

/* Invariant walker (tests): the LRU list and the free list partition the slots, the map holds exactly the
 * listed slots under their hashes, held_blocks agrees. KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_hc_check(const kvp_host_cache *hc);

#endif
