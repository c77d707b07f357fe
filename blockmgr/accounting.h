/* blockmgr/accounting.h — where every slot of KV memory goes, for paged and contiguous allocation alike.
 *
 * A slot holds the K and V of one token (for every layer). All fields are in slots; multiply by the bytes
 * of one slot (2 x layers x kv_heads x head_dim x bytes_per_element) with kvp_kv_accounting_bytes().
 *
 * THE IDENTITY (checked by the invariant walkers after every operation in the tests):
 *
 *     token_states + reserved + internal_frag + external_frag + cached + free == capacity
 *
 * Paged (kvp_block_mgr, device pool; capacity = num_blocks x block_size):
 *   token_states   physical slots holding a token of some sequence; a slot shared by several sequences
 *                  (fork, common prefix) counts once. Per used block: the largest number of tokens any
 *                  sequence holds in it.
 *   reserved       slots of used blocks that hold no token yet: blocks allocated ahead (kvp_bm_reserve).
 *   internal_frag  unused tail of blocks that hold at least one token (the last block of each sequence).
 *   external_frag  always 0 (any free block serves any request).
 *   cached         slots of blocks held only by someone other than a sequence (refcount >= 1 but no block
 *                  table refers to them): the prefix cache's evictable blocks.
 *   free           slots of free blocks (refcount 0).
 *
 * Contiguous baselines (kvp_contig; capacity = arena slots). Per reservation of R slots with u tokens
 * produced so far and expected final length f (clamped to [u, R]; f = R when unknown):
 *   token_states   u
 *   reserved       f - u   (reserved, will be filled later)
 *   internal_frag  R - f   (reserved, will never be filled: over-reservation)
 *   external_frag  free arena slots lying in holes smaller than the pending request's reservation
 *                  (kvp_contig_account's pending_len; 0 when pending_len <= 0 or every hole fits it);
 *                  in a buddy arena also each reservation's rounding up to its power-of-two block (taken
 *                  from the arena, never usable: the paper's "external fragmentation & others")
 *   cached         0
 *   free           the other free arena slots
 *
 * Outside the identity (information only):
 *   logical_tokens  sum over sequences of their token counts (a shared token counts once per sequence)
 *   shared_savings  logical_tokens - token_states: slots that sharing kept from being stored twice
 *   num_seqs        live sequences (paged: on this pool's side) or reservations (contiguous)
 */
#ifndef KVP_BLOCKMGR_ACCOUNTING_H
#define KVP_BLOCKMGR_ACCOUNTING_H

#include <stdint.h>

typedef struct {
    int64_t capacity;
    int64_t token_states;
    int64_t reserved;
    int64_t internal_frag;
    int64_t external_frag;
    int64_t cached;
    int64_t free;
    int64_t logical_tokens;
    int64_t shared_savings;
    int64_t num_seqs; /* a count, not slots: kvp_kv_accounting_bytes copies it unchanged */
} kvp_kv_accounting;

/* Slots -> bytes: every slot field of `slots` times bytes_per_slot into *bytes (num_seqs copied).
 * bytes may alias slots. */
void kvp_kv_accounting_bytes(const kvp_kv_accounting *slots, int64_t bytes_per_slot, kvp_kv_accounting *bytes);

/* token_states + reserved + internal_frag + external_frag + cached + free - capacity (0 when it holds). */
int64_t kvp_kv_accounting_residual(const kvp_kv_accounting *a);

#endif
