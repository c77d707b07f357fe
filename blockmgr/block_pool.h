/* blockmgr/block_pool.h — a pool of physical KV blocks: reference counts and an O(1) free list. A block is
 * an int32_t id in [0, num_blocks); a block with refcount 0 is free and on the free list, an intrusive
 * doubly linked list in two int32 arrays:
 *
 *   head -> [ 7 ] <-> [ 2 ] <-> [ 9 ] <-> ... <-> [ 4 ] <-> [ 0 ] <- tail     next[]/prev[] by block id
 *           alloc pops here                     release appends here
 *
 * So the free list is in release order, oldest first (LRU reuse for a cache), and kvp_pool_take removes a
 * given free block from anywhere in O(1). The pool owns its arrays and knows nothing of tokens, sequences
 * or tensors. Errors: KVP_EINVAL (arguments), KVP_ENOBLOCKS (too few free), KVP_ESTATE (a block in the wrong
 * state), KVP_ENOMEM, each with a detail; a failed call leaves the pool as it was. One owner at a time.
 */
#ifndef KVP_BLOCKMGR_BLOCK_POOL_H
#define KVP_BLOCKMGR_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvp_block_pool kvp_block_pool;

/* num_blocks in [1, INT32_MAX - 1], block_size >= 1 (recorded for the layers above). Every block starts
 * free, in id order (0 first). *out is the caller's. */
kvp_status kvp_pool_create(int32_t num_blocks, int32_t block_size, kvp_block_pool **out);
void kvp_pool_destroy(kvp_block_pool *pool); /* NULL is a no-op */

int32_t kvp_pool_num_blocks(const kvp_block_pool *pool);
int32_t kvp_pool_block_size(const kvp_block_pool *pool);
int32_t kvp_pool_num_free(const kvp_block_pool *pool);

/* n >= 0 blocks from the head into ids_out[0..n) (NULL only for n == 0), refcount 1 each; all or nothing:
 * KVP_ENOBLOCKS leaves ids_out untouched. */
kvp_status kvp_pool_alloc(kvp_block_pool *pool, int32_t n, int32_t *ids_out);

kvp_status kvp_pool_take(kvp_block_pool *pool, int32_t id);   /* a free block, wherever it is: refcount 1 */

kvp_status kvp_pool_incref(kvp_block_pool *pool, int32_t id); /* the block must be held (refcount >= 1) */
kvp_status kvp_pool_decref(kvp_block_pool *pool, int32_t id); /* at 0 the block goes to the tail */
/* Decrefs ids[0..n) in order, all or nothing (a repeated id counts twice). */
kvp_status kvp_pool_release(kvp_block_pool *pool, const int32_t *ids, int32_t n);

int32_t kvp_pool_refcount(const kvp_block_pool *pool, int32_t id); /* -1: id out of range */
bool kvp_pool_is_free(const kvp_block_pool *pool, int32_t id);

/* Free ids, head to tail, into out[0..max) (tests, tools); returns how many. */
int32_t kvp_pool_free_list(const kvp_block_pool *pool, int32_t *out, int32_t max);

/* Invariant walker, O(num_blocks): the free list is an acyclic chain (prev/next agree) of exactly the
 * refcount-0 blocks, num_free long; no refcount is negative. KVP_ESTATE names the first violation. */
kvp_status kvp_pool_check(const kvp_block_pool *pool);

#endif
