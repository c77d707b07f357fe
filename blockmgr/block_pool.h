/* blockmgr/block_pool.h — a pool of physical KV blocks: reference counts and an O(1) free list.
 *
 * A block is an int32_t id in [0, num_blocks). Each block has a reference count; a block with count 0 is
 * free and sits on the free list, an intrusive doubly linked list kept in two int32 arrays:
 *
 *     head                                         tail
 *      |                                            |
 *      v                                            v
 *   [ 7 ] <-> [ 2 ] <-> [ 9 ] <-> ... <-> [ 4 ] <-> [ 0 ]     next[]/prev[] indexed by block id
 *   alloc pops here                    release appends here
 *
 * - kvp_pool_alloc takes blocks from the head; a block whose count drops to 0 is appended at the tail, so
 *   the free list is in release order (oldest first) — useful to a cache that wants LRU reuse.
 * - kvp_pool_take removes one given free block from the middle of the list in O(1) (a cached block that is
 *   reused before it was reallocated).
 *
 * Ownership: the pool owns its arrays; kvp_pool_destroy releases them. The pool knows nothing of tokens,
 * sequences or tensors (block_size is recorded for the layers above).
 *
 * Errors: every failing call returns a status (KVP_EINVAL for bad arguments, KVP_ENOBLOCKS when too few
 * blocks are free, KVP_ESTATE for an incref/decref/take on a block in the wrong state, KVP_ENOMEM) with a
 * detail naming the problem, and leaves the pool exactly as it was. No call aborts on user input.
 * Not thread-safe: one owner (the scheduler thread) at a time.
 */
#ifndef KVP_BLOCKMGR_BLOCK_POOL_H
#define KVP_BLOCKMGR_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvp_block_pool kvp_block_pool;

/* num_blocks >= 1, block_size >= 1 (any value; powers of two 1..256 are the usual ones).
 * num_blocks is limited to INT32_MAX - 1. All blocks start free, in id order (0 is allocated first).
 * *out is owned by the caller (kvp_pool_destroy). */
kvp_status kvp_pool_create(int32_t num_blocks, int32_t block_size, kvp_block_pool **out);
void kvp_pool_destroy(kvp_block_pool *pool); /* NULL is a no-op */

int32_t kvp_pool_num_blocks(const kvp_block_pool *pool);
int32_t kvp_pool_block_size(const kvp_block_pool *pool);
int32_t kvp_pool_num_free(const kvp_block_pool *pool);

/* Allocates n blocks (n >= 0) from the head of the free list, all or nothing: ids_out[0..n) receive the
 * ids, each with refcount 1. KVP_ENOBLOCKS (pool unchanged, ids_out untouched) when fewer than n are free.
 * ids_out is borrowed; it may be NULL only when n == 0. */
kvp_status kvp_pool_alloc(kvp_block_pool *pool, int32_t n, int32_t *ids_out);

/* Takes the given free block (refcount 0) off the free list, wherever it is, giving it refcount 1.
 * KVP_EINVAL if id is out of range, KVP_ESTATE if the block is not free. */
kvp_status kvp_pool_take(kvp_block_pool *pool, int32_t id);

/* Adds a reference; the block must already be held (refcount >= 1), else KVP_ESTATE. */
kvp_status kvp_pool_incref(kvp_block_pool *pool, int32_t id);
/* Drops a reference; at 0 the block goes to the tail of the free list. KVP_ESTATE if it is already free
 * (double free). */
kvp_status kvp_pool_decref(kvp_block_pool *pool, int32_t id);
/* Decrefs ids[0..n) in order; all or nothing (every id is checked first, a repeated id counts twice). */
kvp_status kvp_pool_release(kvp_block_pool *pool, const int32_t *ids, int32_t n);

/* Reference count of a block, or -1 when id is out of range. */
int32_t kvp_pool_refcount(const kvp_block_pool *pool, int32_t id);
bool kvp_pool_is_free(const kvp_block_pool *pool, int32_t id);

/* Free block ids from head to tail into out[0..max) (for tests and tools); returns how many were written. */
int32_t kvp_pool_free_list(const kvp_block_pool *pool, int32_t *out, int32_t max);

/* Invariant walker: the free list is a well-linked chain without cycles (prev/next agree), it holds exactly
 * the blocks with refcount 0, its length equals num_free, and no refcount is negative.
 * KVP_OK, or KVP_ESTATE with a detail naming the first violation. O(num_blocks). */
kvp_status kvp_pool_check(const kvp_block_pool *pool);

#endif
