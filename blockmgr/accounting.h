/* blockmgr/accounting.h — where every slot of KV memory goes, for paged and contiguous allocation alike.
 * A slot holds one token's K and V in every layer (2 x layers x kv_heads x head_dim x bytes_per_element
 * bytes); every field but num_seqs counts slots. The invariant walkers check after every operation that
 *
 *     token_states + reserved + internal_frag + external_frag + cached + free == capacity
 *
 * Contiguous (kvp_contig), per reservation of R slots with u tokens so far and expected final length f
 * (clamped to [u, R]; R when unknown): token_states u, reserved f - u, internal_frag R - f, cached 0.
 */
#ifndef KVP_BLOCKMGR_ACCOUNTING_H
#define KVP_BLOCKMGR_ACCOUNTING_H

#include <stdint.h>

typedef struct {
    int64_t capacity;       /* paged: num_blocks x block_size; contiguous: arena slots */
    int64_t token_states;   /* paged: per used block, the most tokens a sequence holds in it (shared: once) */
    int64_t reserved;       /* paged: empty slots of used blocks allocated ahead (kvp_bm_reserve) */
    int64_t internal_frag;  /* paged: the unused tail of blocks holding a token */
    int64_t external_frag;  /* paged: 0 (any free block fits any request). contiguous: free slots in holes
                             * smaller than the pending request's reservation (pending_len; 0 if <= 0 or
                             * every hole fits), plus a buddy arena's rounding up to its power-of-two blocks
                             * (never usable: the paper's "external fragmentation & others") */
    int64_t cached;         /* paged: blocks held (refcount >= 1) by no block table: prefix-cache evictable */
    int64_t free;           /* paged: free blocks (refcount 0); contiguous: the other free arena slots */
    int64_t logical_tokens; /* outside the identity: sum of sequence lengths (shared: once per sequence) */
    int64_t shared_savings; /* logical_tokens - token_states: slots sharing kept from being stored twice */
    int64_t num_seqs;       /* live sequences (paged: this pool's side) or reservations; a count, not slots */
} kvp_kv_accounting;

/* Every slot field times bytes_per_slot into *bytes (num_seqs copied); bytes may alias slots. */
void kvp_kv_accounting_bytes(const kvp_kv_accounting *slots, int64_t bytes_per_slot, kvp_kv_accounting *bytes);

/* token_states + reserved + internal_frag + external_frag + cached + free - capacity (0 when it holds). */
int64_t kvp_kv_accounting_residual(const kvp_kv_accounting *a);

#endif
