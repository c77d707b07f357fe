/* blockmgr/block_mgr.h — block tables per sequence on top of a device block pool (and a host pool for swap).
 *
 * A sequence (int64_t id chosen by the caller) has a block table: logical block i -> physical block id,
 * plus its token count. Token t of the sequence lives in slot  blocks[t / block_size] * block_size +
 * t % block_size  (the slot mapping). Every block of a table before the last one is full.
 *
 *   seq 17: num_tokens = 37, block_size 16        device pool
 *     logical  0    1    2                        +----+----+----+----+----+----+
 *     physical 5    2    9   (9 holds 5 tokens)   | .. | 2  | .. | 5  | .. | 9  | ...
 *                                                 +----+----+----+----+----+----+
 *
 * Sharing: kvp_bm_fork gives the child the parent's blocks (refcount++, no KV copied). Appending into a
 * last block whose refcount > 1 (copy-on-write) allocates a fresh block for the appending sequence and
 * records a (src, dst) copy; copies accumulate as a batch until kvp_bm_step_ops_clear (one kernel launch
 * per step). A prefix cache holds its own references on blocks through kvp_bm_incref/kvp_bm_decref (or the
 * pool directly); a block held only by such references is "cached" in the accounting (accounting.h).
 *
 * Swap: sequences move between the device pool and the host pool (kvp_bm_swap_out/kvp_bm_swap_in), all or
 * nothing; the moves are recorded as (device block -> host block) and (host -> device) pairs in the step
 * ops. A swapped-out sequence can only be swapped in or freed. Recompute preemption is kvp_bm_free.
 *
 * Every operation either succeeds or returns a status and leaves the pools, the tables, the accounting and
 * the pending step ops exactly as before (all allocations and checks happen before the first change),
 * including when a host allocation fails (failure injection: common/alloc.h).
 *
 * Cost: append, allocate, fork and free are O(blocks touched) with O(1) sequence lookup (open-addressing
 * hash map), no host allocation on append except when a table's array grows (geometric). The decode hot
 * path (one token into a non-full, unshared last block) is a few loads and stores; kvp_bm_append_ref skips
 * the hash lookup too (a scheduler keeps one kvp_bm_seq_ref per running sequence).
 * Accounting (kvp_bm_account) is O(1): counters maintained incrementally; kvp_bm_check recomputes
 * everything from scratch and compares.
 * Not thread-safe: one owner at a time.
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
    int32_t num_host_blocks;  /* host (swap space) blocks, >= 0; 0 = swapping disabled (KVP_EUNSUPPORTED) */
    int32_t max_seq_len;      /* most tokens one sequence may hold, >= 1; 0 = no limit other than int32 */
    int32_t watermark_blocks; /* free device blocks kvp_bm_can_allocate keeps back, >= 0 */
} kvp_bm_config;

/* A (source block, destination block) pair: a CoW copy (device -> device), a swap out (device -> host) or
 * a swap in (host -> device). */
typedef struct {
    int32_t src;
    int32_t dst;
} kvp_block_copy;

/* The block moves requested since the last kvp_bm_step_ops_clear, to be run in this order:
 * swap_out, swap_in, copies, and before the step's new tokens are written through the slot mapping.
 * Arrays borrowed from the manager: valid until the next call that changes it.
 * Ordering rule for the scheduler (as in vLLM), within one step (between two clears):
 *   (1) frees, truncations, swap-outs, prefix-cache evictions; (2) swap-ins; (3) forks; (4) admissions
 *   (allocate), appends, reservations.
 * In that order the batch is exact: copies never chain, no block that a move reads is handed out again in
 * the step, and no token written in the step is read by a copy. (The randomized step-mode test checks this
 * order, simulating the executor.) Out of order, e.g. a fork after an append of the same sequence, the
 * copies run before the new tokens are written and a copy misses them; a swap-out after a copy-on-write
 * append of the same sequence is refused with KVP_ESTATE. */
typedef struct {
    const kvp_block_copy *swap_out; /* [n_swap_out] device block -> host block */
    int32_t n_swap_out;
    const kvp_block_copy *swap_in;  /* [n_swap_in] host block -> device block */
    int32_t n_swap_in;
    const kvp_block_copy *copies;   /* [n_copies] device block -> device block (copy-on-write) */
    int32_t n_copies;
} kvp_bm_step_ops;

/* A sequence's block table, borrowed: `blocks` stays valid until the next call that changes this sequence
 * (append, truncate, reserve, swap, free) or destroys the manager. */
typedef struct {
    const int32_t *blocks; /* [num_blocks] physical ids (host pool ids when on_host) */
    int32_t num_blocks;    /* blocks in the table (>= ceil(num_tokens / block_size); more when reserved) */
    int32_t num_tokens;
    bool on_host;          /* swapped out */
} kvp_bm_table_view;

/* Creates the manager and its pools (owned by it). KVP_EINVAL naming the bad field. */
kvp_status kvp_bm_create(const kvp_bm_config *cfg, kvp_block_mgr **out);
void kvp_bm_destroy(kvp_block_mgr *bm); /* NULL is a no-op; frees every table and both pools */

/* The pools, borrowed (valid while bm lives). host_pool is NULL when num_host_blocks == 0.
 * Callers may incref/decref/take device blocks through the pool (prefix cache); they must never drop a
 * reference they do not hold (kvp_bm_check detects refcount < table references). */
kvp_block_pool *kvp_bm_pool(kvp_block_mgr *bm);
kvp_block_pool *kvp_bm_host_pool(kvp_block_mgr *bm);
int32_t kvp_bm_block_size(const kvp_block_mgr *bm);
int32_t kvp_bm_num_free(const kvp_block_mgr *bm); /* free device blocks */

/* External references on device blocks (prefix cache). incref: the block must be held (refcount >= 1).
 * decref: the block must hold more references than the block tables do (KVP_ESTATE otherwise: that
 * reference belongs to a sequence). take: a free block -> refcount 1, off the free list. */
kvp_status kvp_bm_incref(kvp_block_mgr *bm, int32_t block);
kvp_status kvp_bm_decref(kvp_block_mgr *bm, int32_t block);
kvp_status kvp_bm_take(kvp_block_mgr *bm, int32_t block);

/* New sequence seq_id with n_tokens >= 0 tokens: ceil(n_tokens / block_size) fresh device blocks.
 * KVP_ESTATE if seq_id exists, KVP_EINVAL if n_tokens < 0 or > max_seq_len, KVP_ENOBLOCKS if too few free.
 * The watermark is not applied here (use kvp_bm_can_allocate for admission). */
kvp_status kvp_bm_allocate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens);

/* Like kvp_bm_allocate, but the first n_prefix logical blocks are the given already-held device blocks
 * (refcount >= 1 each, e.g. prefix-cache hits): each gets incref'd, the rest are allocated, all or nothing.
 * The prefix blocks must be full in this sequence: n_tokens >= n_prefix * block_size (KVP_EINVAL otherwise);
 * a prefix block that is free is KVP_ESTATE; ids out of range or repeated are KVP_EINVAL.
 * prefix_blocks is borrowed (read during the call only); it may be NULL when n_prefix == 0. */
kvp_status kvp_bm_allocate_prefixed(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens,
                                    const int32_t *prefix_blocks, int32_t n_prefix);

/* Appends k >= 0 tokens to a device-resident sequence. slots_out[0..k) (may be NULL) receives each new
 * token's slot (block * block_size + offset). Allocates a block each time the last one is full, uses
 * reserved blocks first, and copies-on-write a shared partly filled last block (one copy recorded).
 * All or nothing: KVP_ENOTFOUND (unknown id), KVP_ESTATE (swapped out), KVP_EINVAL (k < 0 or past
 * max_seq_len), KVP_ENOBLOCKS, KVP_ENOMEM. */
kvp_status kvp_bm_append(kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *slots_out);

/* A sequence reference for the per-step hot path: the id plus a cached position in the manager, so that a
 * scheduler that keeps one per running sequence appends without the id-map lookup. Plain value, owned by
 * the caller, never needs releasing. It never dangles: every use checks the cached position against the id
 * (one compare) and refreshes it through the id map when other calls (free, fork, allocate, swap) moved the
 * sequence. A reference to a freed id behaves like that id (KVP_ENOTFOUND; valid again if the id is
 * allocated again). */
typedef struct {
    int64_t seq_id;
    int32_t idx; /* cached position: a hint only */
} kvp_bm_seq_ref;

/* Fills *out for seq_id (device or host). KVP_ENOTFOUND for an unknown id, KVP_EINVAL for NULL. */
kvp_status kvp_bm_seq_ref_get(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_seq_ref *out);

/* Exactly kvp_bm_append(bm, ref->seq_id, k, slots_out) (same results, errors and all-or-nothing rule);
 * may refresh ref->idx. KVP_EINVAL for a NULL ref. */
kvp_status kvp_bm_append_ref(kvp_block_mgr *bm, kvp_bm_seq_ref *ref, int32_t k, int32_t *slots_out);

/* Device blocks kvp_bm_append(seq_id, k) would allocate (including a CoW block), into *out. */
kvp_status kvp_bm_append_blocks_needed(const kvp_block_mgr *bm, int64_t seq_id, int32_t k, int32_t *out);

/* Makes sure the table has blocks for n_ahead >= 0 more tokens (lookahead); new blocks count as
 * `reserved` until tokens are appended into them. Same errors as append. */
kvp_status kvp_bm_reserve(kvp_block_mgr *bm, int64_t seq_id, int32_t n_ahead);

/* New sequence child sharing every token-holding block of parent (refcount++ each, no copy). Reserved
 * (empty) blocks of the parent are not shared. KVP_ENOTFOUND (parent), KVP_ESTATE (child exists, or parent
 * swapped out), KVP_ENOMEM. */
kvp_status kvp_bm_fork(kvp_block_mgr *bm, int64_t parent_id, int64_t child_id);

/* Drops the sequence: decref every block (device or host); a block goes back to its free list at 0.
 * KVP_ENOTFOUND for an unknown (or already freed) id. Recompute preemption is exactly this call. */
kvp_status kvp_bm_free(kvp_block_mgr *bm, int64_t seq_id);

/* Keeps the first n_tokens tokens (0 <= n_tokens <= current count, else KVP_EINVAL): blocks past
 * ceil(n_tokens / block_size), reserved ones included, are released. Device-resident sequences only. */
kvp_status kvp_bm_truncate(kvp_block_mgr *bm, int64_t seq_id, int32_t n_tokens);

/* Admission: true when ceil(n_tokens / block_size) blocks can be allocated while keeping
 * watermark_blocks free. False for n_tokens < 0. */
bool kvp_bm_can_allocate(const kvp_block_mgr *bm, int32_t n_tokens);

/* Swap the n sequences seq_ids[0..n) out to the host pool (all device-resident) or in again (all on host).
 * Blocks shared among the given sequences move once and stay shared; a block also used by a sequence that
 * is not moved is copied (the other keeps the original). All or nothing: KVP_ENOTFOUND, KVP_ESTATE (wrong
 * side, a repeated id, or a block of theirs is the destination of a copy still pending in this step),
 * KVP_ENOBLOCKS (target pool too small), KVP_EUNSUPPORTED (no host pool), KVP_ENOMEM. The moves are appended
 * to the step ops. seq_ids is borrowed for the call. */
kvp_status kvp_bm_swap_out(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n);
kvp_status kvp_bm_swap_in(kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n);
/* Blocks kvp_bm_swap_in would allocate on the device (into *out); same errors as swap_in, nothing changed. */
kvp_status kvp_bm_swap_in_blocks_needed(const kvp_block_mgr *bm, const int64_t *seq_ids, int32_t n, int32_t *out);

/* Reading sequences. */
bool kvp_bm_has_seq(const kvp_block_mgr *bm, int64_t seq_id);
int32_t kvp_bm_num_seqs(const kvp_block_mgr *bm); /* device and host */
kvp_status kvp_bm_table(const kvp_block_mgr *bm, int64_t seq_id, kvp_bm_table_view *out); /* KVP_ENOTFOUND */
/* Sequence ids in internal order into out[0..max); returns the number written (<= kvp_bm_num_seqs). */
int32_t kvp_bm_seq_ids(const kvp_block_mgr *bm, int64_t *out, int32_t max);

/* Step ops (CoW copies and swap moves) since the last clear; see kvp_bm_step_ops. */
void kvp_bm_step_ops_get(const kvp_block_mgr *bm, kvp_bm_step_ops *out);
void kvp_bm_step_ops_clear(kvp_block_mgr *bm);

/* Accounting of the device pool (host = false) or the host pool (host = true), in slots; O(1).
 * See accounting.h for the categories and the identity. */
void kvp_bm_account(const kvp_block_mgr *bm, bool host, kvp_kv_accounting *out);

/* Invariant walker, O(total table entries + blocks), allocates scratch (KVP_ENOMEM possible): both pools pass kvp_pool_check; every block's
 * refcount >= the number of table entries referring to it; blocks in tables are not free; tables are
 * well formed (num_tokens <= num_blocks * block_size, all blocks before the last token-holding one full,
 * within max_seq_len); the hash map finds every sequence; the incremental accounting equals a from-scratch
 * recomputation and satisfies the identity. KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_bm_check(const kvp_block_mgr *bm);

#endif
