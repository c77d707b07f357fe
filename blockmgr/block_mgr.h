/* blockmgr/block_mgr.h — block tables per sequence over a device block pool (and a host pool for swap).
 * A sequence (an int64_t id the caller picks) has a token count and a block table, logical block i ->
 * physical block; token t lives in slot blocks[t / block_size] * block_size + t % block_size (the slot
 * mapping), and every block before the last is full.
 *
 *   seq 17: num_tokens = 37, block_size 16        device pool
 *     logical  0    1    2                        +----+----+----+----+----+----+
 *     physical 5    2    9   (9 holds 5 tokens)   | .. | 2  | .. | 5  | .. | 9  | ...
 *                                                 +----+----+----+----+----+----+
 *
 * kvp_bm_fork shares the parent's blocks (refcount++). Appending into a shared last block copies it on
 * write: a fresh block, and a (src, dst) copy in the step ops, kept until kvp_bm_step_ops_clear (one launch
 * a step). A prefix cache holds its own references (kvp_bm_incref or the pool); blocks only it holds are
 * "cached" (accounting.h). Swap moves whole sequences between the pools, recorded in the step ops; a
 * swapped-out sequence can only be swapped in or freed. Recompute preemption is kvp_bm_free.
 *
 * A failed call leaves pools, tables, accounting and step ops as they were, a failed host allocation
 * included (common/alloc.h injects them). Cost: O(blocks touched), O(1) lookup by id; append allocates host
 * memory only when a table grows (geometrically); kvp_bm_account is O(1). One owner at a time.
 */
#ifndef KVP_BLOCKMGR_BLOCK_MGR_H
#define KVP_BLOCKMGR_BLOCK_MGR_H

#include <stdbool.h>
#include <stdint.h>

#include "blockmgr/accounting.h"
#include "blockmgr/block_pool.h"
#include "common/status.h"

typedef struct kvp_block_mgr kvp_block_mgr;

typedef struct {
    int32_t num_blocks;       /* device blocks, >= 1 */
    int32_t block_size;       /* tokens per block, >= 1 */
    int32_t num_host_blocks;  /* swap space, >= 0; 0: swap returns KVP_EUNSUPPORTED */
    int32_t max_seq_len;      /* most tokens one sequence may hold, >= 1; 0 = no limit other than int32 */
    int32_t watermark_blocks; /* free device blocks kvp_bm_can_allocate keeps back, >= 0 */
} kvp_bm_config;

/* A copy-on-write copy (device -> device), a swap out (device -> host) or a swap in (host -> device). */
typedef struct {
    int32_t src;
    int32_t dst;
} kvp_block_copy;

/* The moves since the last clear, to run as swap_out, swap_in, copies, then the step's token writes.
 * Borrowed: valid until the next call that changes the manager. Within a step the scheduler calls, as in
 * vLLM, (1) free, truncate, swap-out, cache eviction, (2) swap-in, (3) fork, (4) allocate, append, reserve;
 * then copies never chain, no block a move reads is handed out again, and no copy reads a token written
 * this step. Out of order, a copy may miss tokens (a fork after an append), and a swap-out after a
 * copy-on-write append of the sequence is KVP_ESTATE. */
typedef struct {
    const kvp_block_copy *swap_out; /* [n_swap_out] device block -> host block */
    int32_t n_swap_out;
    const kvp_block_copy *swap_in;  /* [n_swap_in] host block -> device block */
    int32_t n_swap_in;
    const kvp_block_copy *copies;   /* [n_copies] device block -> device block (copy-on-write) */
    int32_t n_copies;
} kvp_bm_step_ops;

/* Borrowed: valid until the next call that changes this sequence or destroys the manager. */
typedef struct {
    const int32_t *blocks; /* [num_blocks] physical ids (host pool ids when on_host) */
    int32_t num_blocks;    /* >= ceil(num_tokens / block_size); more when reserved */
    int32_t num_tokens;
    bool on_host;          /* swapped out */
} kvp_bm_table_view;

/* The manager owns its pools. KVP_EINVAL names the bad field. */
kvp_status kvp_bm_create(const kvp_bm_config *cfg, kvp_block_mgr **out);
void kvp_bm_destroy(kvp_block_mgr *bm); /* NULL is a no-op; frees every table and both pools */

/* Borrowed while bm lives; host_pool NULL without swap space. Callers may incref, decref and take device
 * blocks through it, never dropping a reference they do not hold (kvp_bm_check finds that). */
kvp_block_pool *kvp_bm_pool(kvp_block_mgr *bm);
kvp_block_pool *kvp_bm_host_pool(kvp_block_mgr *bm);
int32_t kvp_bm_block_size(const kvp_block_mgr *bm);
int32_t kvp_bm_num_free(const kvp_block_mgr *bm); /* free device blocks */

/* A prefix cache's references. incref: a held block; decref: KVP_ESTATE unless the block has more
 * references than tables; take: a free block -> refcount 1. */
kvp_status kvp_bm_incref(kvp_block_mgr *bm, int32_t block);
kvp_status kvp_bm_decref(kvp_block_mgr *bm, int32_t block);
kvp_status kvp_bm_take(kvp_block_mgr *bm, int32_t block);

/* A new sequence of n_tokens in [0, max_seq_len]: ceil(n_tokens / block_size) fresh blocks, ignoring the
 * watermark (see kvp_bm_can_allocate). KVP_ESTATE if seq_id exists, KVP_EINVAL, KVP_ENOBLOCKS. */
kvp_status kvp_bm_allocate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens);

/* kvp_bm_allocate with held blocks prefix_blocks[0..n_prefix) (cache hits; NULL if none) incref'd as the
 * first blocks, which must be full: KVP_EINVAL unless n_tokens >= n_prefix * block_size, or for ids out of
 * range or repeated; KVP_ESTATE for a free one. */
kvp_status kvp_bm_allocate_prefixed(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens,
                                    const int32_t *prefix_blocks, int32_t n_prefix);

/* k >= 0 tokens onto a device-resident sequence, their slots into slots_out[0..k) (may be NULL): reserved
 * blocks first, then new ones; a shared last block is copied on write. KVP_ENOTFOUND, KVP_ESTATE (swapped
 * out), KVP_EINVAL (past max_seq_len), KVP_ENOBLOCKS, KVP_ENOMEM. Decode (one token, unshared) is O(1). */
kvp_status kvp_bm_append(kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *slots_out);

/* An id plus a cached position, so that a scheduler holding one per running sequence appends without the
 * id lookup. A plain value, never released, never dangling: each use checks the hint against the id and
 * refreshes it when the sequence moved; a freed id's reference acts as the id (KVP_ENOTFOUND). */
typedef struct {
    int64_t seq_id;
    int32_t idx; /* cached position: a hint only */
} kvp_bm_seq_ref;

kvp_status kvp_bm_seq_ref_get(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_seq_ref *out); /* ENOTFOUND */

/* Exactly kvp_bm_append(bm, ref->seq_id, k, slots_out); may refresh ref->idx. KVP_EINVAL for NULL. */
kvp_status kvp_bm_append_ref(kvp_block_mgr *bm, kvp_bm_seq_ref *ref, int32_t k, int32_t *slots_out);

/* Blocks kvp_bm_append(seq_id, k) would allocate, a copy-on-write one included. */
kvp_status kvp_bm_append_blocks_needed(const kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *out);

/* Blocks for n_ahead >= 0 more tokens (lookahead), `reserved` until filled. Errors as append. */
kvp_status kvp_bm_reserve(kvp_block_mgr *bm, int64_t seq_id, int32_t n_ahead);

/* child shares parent's token-holding blocks (not its reserved ones). KVP_ENOTFOUND, KVP_ESTATE (child
 * exists, parent swapped out), KVP_ENOMEM. */
kvp_status kvp_bm_fork(kvp_block_mgr *bm, int64_t parent_id, int64_t child_id);

kvp_status kvp_bm_free(kvp_block_mgr *bm, int64_t seq_id); /* decrefs its blocks (either pool); ENOTFOUND */

/* Keeps the first n_tokens (KVP_EINVAL above the count) of a device-resident sequence; later blocks,
 * reserved ones included, are released. */
kvp_status kvp_bm_truncate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens);

/* Admission: ceil(n_tokens / block_size) blocks fit, watermark_blocks kept free (false for n_tokens < 0). */
bool kvp_bm_can_allocate(const kvp_block_mgr *bm, int32_t n_tokens);

/* Moves seq_ids[0..n) to the host pool or back, into the step ops. Blocks they share move once; a block
 * another sequence uses is copied. KVP_ENOTFOUND, KVP_ESTATE (wrong side, repeated id, a block that a
 * pending copy writes), KVP_ENOBLOCKS, KVP_EUNSUPPORTED (no host pool), KVP_ENOMEM. */
kvp_status kvp_bm_swap_out(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n);
kvp_status kvp_bm_swap_in(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n);
/* Device blocks kvp_bm_swap_in would allocate; its errors. */
kvp_status kvp_bm_swap_in_blocks_needed(const kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n, int32_t *out);

bool kvp_bm_has_seq(const kvp_block_mgr *bm, int64_t seq_id);
int32_t kvp_bm_num_seqs(const kvp_block_mgr *bm); /* device and host */
kvp_status kvp_bm_table(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_table_view *out); /* KVP_ENOTFOUND */
int32_t kvp_bm_seq_ids(const kvp_block_mgr *bm, int64_t *out, int32_t max); /* returns how many written */

void kvp_bm_step_ops_get(const kvp_block_mgr *bm, kvp_bm_step_ops *out);
void kvp_bm_step_ops_clear(kvp_block_mgr *bm);

void kvp_bm_account(const kvp_block_mgr *bm, bool host, kvp_kv_accounting *out); /* that pool's, in slots */

/* Invariant walker, O(table entries + blocks), KVP_ENOMEM for its scratch: both pools pass kvp_pool_check;
 * refcounts >= table references, and no tabled block free; tables well formed (full but the last, within
 * max_seq_len); the id map finds every sequence; the accounting equals a recount and the identity holds.
 * KVP_ESTATE names the first violation. */
kvp_status kvp_bm_check(const kvp_block_mgr *bm);

#endif
