/* blockmgr/contiguous.h — contiguous per-request KV reservation (the Orca baselines), first-fit in one
 * linear arena of slots, with the same accounting as the paged manager (accounting.h).
 *
 *   arena (capacity slots)
 *   +--------+------+------------+---------+--------------+------+
 *   | req 3  | hole | req 8      |  hole   | req 1        | hole |
 *   |uuuurrri|      |uuuuuuurrrii|         |uuurrrrrrriiii|      |      u used, r reserved, i internal frag
 *   +--------+------+------------+---------+--------------+------+
 *   ^0                                                            ^capacity
 *
 * Each request reserves a contiguous run of slots at admission (kvp_contig_reserve, first fit: the
 * lowest-addressed hole that is large enough), produces tokens into it (kvp_contig_grow), and releases it
 * when done (kvp_contig_free; neighbouring holes merge). The reservation length comes from the policy:
 *   Orca-Max:    max_model_len
 *   Orca-Pow2:   the next power of two >= the request's final length (capped at max_model_len)
 *   Orca-Oracle: exactly the final length
 * (kvp_contig_reserve_len computes it). Request ids are int64_t chosen by the caller; lookup is O(1);
 * reserve and free are O(holes).
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

/* Reservation length for a request whose final length (prompt + output tokens) is final_len:
 * 1 <= final_len <= max_model_len, else KVP_EINVAL. */
kvp_status kvp_contig_reserve_len(kvp_contig_policy p, int64_t max_model_len, int64_t final_len, int64_t *out);

typedef struct kvp_contig kvp_contig;

/* An arena of capacity >= 1 slots, all free. *out owned by the caller (kvp_contig_destroy). */
kvp_status kvp_contig_create(int64_t capacity, kvp_contig **out);
void kvp_contig_destroy(kvp_contig *c); /* NULL is a no-op */

/* Reserves reserve_len >= 1 contiguous slots for request req_id, first fit. final_len is the expected final
 * length (used only by the accounting to split reserved from internal fragmentation; <= 0 means unknown,
 * i.e. the whole reservation counts as reserved). *offset_out (may be NULL) receives the first slot.
 * KVP_ESTATE if req_id exists, KVP_EINVAL for reserve_len < 1, KVP_ENOBLOCKS when no hole is large enough
 * (external fragmentation or a full arena), KVP_ENOMEM. */
kvp_status kvp_contig_reserve(kvp_contig *c, int64_t req_id, int64_t reserve_len, int64_t final_len,
                              int64_t *offset_out);
/* True when some hole has at least len slots. */
bool kvp_contig_can_reserve(const kvp_contig *c, int64_t len);

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

/* Accounting (accounting.h). pending_len is the reservation the next waiting request needs (<= 0: none);
 * free slots in holes smaller than it are external_frag. O(holes). */
void kvp_contig_account(const kvp_contig *c, int64_t pending_len, kvp_kv_accounting *out);

/* Invariant walker: holes sorted, non-overlapping, non-adjacent (merged), inside the arena; reservations
 * and holes tile the arena exactly; used <= reservation for each; the id map finds every request; the
 * accounting identity holds. KVP_OK or KVP_ESTATE naming the first violation. */
kvp_status kvp_contig_check(const kvp_contig *c);

#endif
