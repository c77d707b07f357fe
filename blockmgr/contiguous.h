/* blockmgr/contiguous.h — contiguous per-request KV reservation (the Orca baselines) in one linear arena of
 * slots, placed first-fit or by a buddy allocator, with the same accounting as the paged manager
 * (accounting.h).
 *
 *   arena (capacity slots)
 *   +--------+------+------------+---------+--------------+------+
 *   | req 3  | hole | req 8      |  hole   | req 1        | hole |
 *   |uuuurrri|      |uuuuuuurrrii|         |uuurrrrrrriiii|      |      u used, r reserved, i internal frag
 *   +--------+------+------------+---------+--------------+------+
 *   ^0                                                            ^capacity
 *
 * Each request reserves a contiguous run of slots at admission (kvp_contig_reserve), produces tokens into
 * it (kvp_contig_grow), and releases it when done (kvp_contig_free). The reservation length comes from the
 * policy, as the PagedAttention paper defines its Orca baselines (section 6.1):
 *   Orca-Max:    max_model_len
 *   Orca-Pow2:   the prompt plus the next power of two >= the output length ("over-reserves the space for
 *                outputs by at most 2x": 25 output tokens reserve 32), capped at max_model_len
 *   Orca-Oracle: exactly prompt + output
 * (kvp_contig_reserve_len computes it). Placement:
 *   first-fit  the lowest-addressed hole that is large enough; a freed run merges with neighbouring holes.
 *   buddy      the run is rounded up to a power-of-two block of a binary buddy allocator (the allocator the
 *              paper's Orca emulation used); the arena is cut into power-of-two top-level blocks, largest
 *              first (capacity 14648 = 8192 + 4096 + 2048 + 256 + 32 + 16 + 8), the smallest free block
 *              that fits is split in halves down to the size, and a freed block merges with its buddy
 *              (offset XOR size) while that one is free and the same size. The rounding (block - run) is
 *              allocator fragmentation: the accounting reports it with external fragmentation.
 * Request ids are int64_t chosen by the caller; lookup is O(1); reserve and free are O(holes).
 *
 * Every failing call returns a status with a detail and leaves the arena unchanged. Not thread-safe.
 */
#ifndef KVP_BLOCKMGR_CONTIGUOUS_H
#define KVP_BLOCKMGR_CONTIGUOUS_H

#include <stdbool.h>
#include <stdint.h>

#include "blockmgr/accounting.h"
#include "common/status.h"

typedef enum {
    KVP_CONTIG_MAX = 0, /* Orca-Max */
    KVP_CONTIG_POW2,    /* Orca-Pow2 */
    KVP_CONTIG_ORACLE,  /* Orca-Oracle */
} kvp_contig_policy;

/* "max" | "pow2" | "oracle" -> policy (KVP_EINVAL naming the value otherwise); and back. */
kvp_status kvp_contig_policy_parse(const char *s, kvp_contig_policy *out);
const char *kvp_contig_policy_name(kvp_contig_policy p);

/* Reservation length for a request of prompt_len >= 0 prompt and output_len >= 1 output tokens,
 * 1 <= prompt_len + output_len <= max_model_len, else KVP_EINVAL. */
kvp_status kvp_contig_reserve_len(kvp_contig_policy p, int64_t max_model_len, int64_t prompt_len, int64_t output_len,
                                  int64_t *out);

typedef enum {
    KVP_CONTIG_FIRST_FIT = 0,
    KVP_CONTIG_BUDDY,
} kvp_contig_placement;

/* "first-fit" | "buddy" -> placement (KVP_EINVAL naming the value otherwise); and back. */
kvp_status kvp_contig_placement_parse(const char *s, kvp_contig_placement *out);
const char *kvp_contig_placement_name(kvp_contig_placement p);

typedef struct kvp_contig kvp_contig;

/* An arena of capacity >= 1 slots, all free. *out owned by the caller (kvp_contig_destroy). */
kvp_status kvp_contig_create(int64_t capacity, kvp_contig_placement placement, kvp_contig **out);
void kvp_contig_destroy(kvp_contig *c); /* NULL is a no-op */

/* Reserves reserve_len >= 1 contiguous slots for request req_id (placed as the arena places). final_len is the expected final
 * length (used only by the accounting to split reserved from internal fragmentation; <= 0 means unknown,
 * i.e. the whole reservation counts as reserved). *offset_out (may be NULL) receives the first slot.
 * KVP_ESTATE if req_id exists, KVP_EINVAL for reserve_len < 1 or above kvp_contig_max_reserve,
 * KVP_ENOBLOCKS when no hole is large enough (external fragmentation or a full arena), KVP_ENOMEM. */
kvp_status kvp_contig_reserve(kvp_contig *c, int64_t req_id, int64_t reserve_len, int64_t final_len,
                              int64_t *offset_out);
/* True when a reservation of len slots would be placed now. */
bool kvp_contig_can_reserve(const kvp_contig *c, int64_t len);
/* The longest reservation an empty arena can hold: capacity (first-fit), the largest top-level block (buddy). */
int64_t kvp_contig_max_reserve(const kvp_contig *c);

/* The request produced n >= 0 more tokens (prompt at admission, then one per decode step): used += n.
 * KVP_ENOTFOUND, KVP_EINVAL when used would exceed the reservation (the request outgrew it). */
kvp_status kvp_contig_grow(kvp_contig *c, int64_t req_id, int64_t n);
/* Releases the reservation; KVP_ENOTFOUND for an unknown (or already freed) id. */
kvp_status kvp_contig_free(kvp_contig *c, int64_t req_id);

/* Reading a request: offset, reservation length and used slots (any pointer may be NULL). KVP_ENOTFOUND. */
kvp_status kvp_contig_get(const kvp_contig *c, int64_t req_id, int64_t *offset, int64_t *reserve_len,
                          int64_t *used);
int32_t kvp_contig_num_reqs(const kvp_contig *c);
int32_t kvp_contig_num_holes(const kvp_contig *c);
int64_t kvp_contig_largest_hole(const kvp_contig *c);
/* Slots taken by reservations, rounding included (0 when every reservation is back). */
int64_t kvp_contig_taken(const kvp_contig *c);

/* Accounting (accounting.h). pending_len is the reservation the next waiting request needs (<= 0: none);
 * free slots in holes smaller than its placement (buddy: its power-of-two block) are external_frag, and so
 * is the buddy rounding of every placed reservation. O(holes). */
void kvp_contig_account(const kvp_contig *c, int64_t pending_len, kvp_kv_accounting *out);

/* Invariant walker: holes sorted, non-overlapping, inside the arena, and merged (first-fit: never adjacent;
 * buddy: power-of-two sized, aligned, inside one top-level block, never beside a free buddy of their size);
 * reservations (buddy: their blocks) and holes tile the arena exactly; used <= reservation for each; the id
 * map finds every request; the accounting identity holds. KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_contig_check(const kvp_contig *c);

#endif
