/* blockmgr/contiguous.h — contiguous per-request KV reservations (the Orca baselines) in one linear arena
 * of slots, placed first-fit or by a buddy allocator, with the paged manager's accounting (accounting.h).
 *
 *   +--------+------+------------+---------+--------------+------+
 *   | req 3  | hole | req 8      |  hole   | req 1        | hole |
 *   |uuuurrri|      |uuuuuuurrrii|         |uuurrrrrrriiii|      |      u used, r reserved, i internal frag
 *   +--------+------+------------+---------+--------------+------+
 *   ^0                                                            ^capacity
 *
 * A request reserves a run at admission (kvp_contig_reserve), produces tokens into it (kvp_contig_grow) and
 * frees it. Its length, as the PagedAttention paper defines the baselines (section 6.1): Orca-Max
 * max_model_len; Orca-Pow2 the prompt plus the next power of two >= the output (25 reserve 32), at most
 * max_model_len; Orca-Oracle prompt + output. First-fit takes the lowest hole that fits and merges freed
 * runs with their neighbours. Buddy rounds a run up to a power-of-two block, within power-of-two top-level
 * blocks (largest first); the rounding counts as external fragmentation.
 *
 * Request ids are the caller's int64_t; lookup is O(1), reserve and free O(holes). A failed call returns a
 * status with a detail and leaves the arena unchanged. One owner at a time.
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

/* "max" | "pow2" | "oracle" (else KVP_EINVAL naming it), and back. */
kvp_status kvp_contig_policy_parse(const char *s, kvp_contig_policy *out);
const char *kvp_contig_policy_name(kvp_contig_policy p);

/* The policy's length; KVP_EINVAL unless prompt_len >= 0, output_len >= 1, the sum <= max_model_len. */
kvp_status kvp_contig_reserve_len(kvp_contig_policy p, int64_t max_model_len, int64_t prompt_len, int64_t output_len,
                                  int64_t *out);

typedef enum {
    KVP_CONTIG_FIRST_FIT = 0,
    KVP_CONTIG_BUDDY,
} kvp_contig_placement;

/* "first-fit" | "buddy" (else KVP_EINVAL naming it), and back. */
kvp_status kvp_contig_placement_parse(const char *s, kvp_contig_placement *out);
const char *kvp_contig_placement_name(kvp_contig_placement p);

typedef struct kvp_contig kvp_contig;

/* capacity >= 1 slots, all free. *out is the caller's. */
kvp_status kvp_contig_create(int64_t capacity, kvp_contig_placement placement, kvp_contig **out);
void kvp_contig_destroy(kvp_contig *c); /* NULL is a no-op */

/* reserve_len slots for req_id, the first into *offset_out (may be NULL). final_len, the expected final
 * length, only splits reserved from internal_frag (<= 0: unknown, all reserved). KVP_ESTATE if req_id
 * exists, KVP_EINVAL outside [1, kvp_contig_max_reserve], KVP_ENOBLOCKS when no hole fits, KVP_ENOMEM. */
kvp_status kvp_contig_reserve(kvp_contig *c, int64_t req_id, int64_t reserve_len, int64_t final_len,
                              int64_t *offset_out);
bool kvp_contig_can_reserve(const kvp_contig *c, int64_t len); /* it would be placed now */
/* What an empty arena can hold: capacity (first-fit), the largest top-level block (buddy). */
int64_t kvp_contig_max_reserve(const kvp_contig *c);

/* used += n >= 0 (the prompt, then a token a step). KVP_ENOTFOUND; KVP_EINVAL past the reservation. */
kvp_status kvp_contig_grow(kvp_contig *c, int64_t req_id, int64_t n);
kvp_status kvp_contig_free(kvp_contig *c, int64_t req_id); /* KVP_ENOTFOUND */

/* Any pointer may be NULL. KVP_ENOTFOUND. */
kvp_status kvp_contig_get(const kvp_contig *c, int64_t req_id, int64_t *offset, int64_t *reserve_len,
                          int64_t *used);
int32_t kvp_contig_num_reqs(const kvp_contig *c);
int32_t kvp_contig_num_holes(const kvp_contig *c);
int64_t kvp_contig_largest_hole(const kvp_contig *c);
int64_t kvp_contig_taken(const kvp_contig *c); /* slots reserved, buddy rounding included */

/* O(holes). pending_len: the next waiting request's reservation (<= 0: none); free slots in holes it
 * cannot use (buddy: smaller than its block) are external_frag. */
void kvp_contig_account(const kvp_contig *c, int64_t pending_len, kvp_kv_accounting *out);

/* Invariant walker: holes sorted, disjoint, merged (first-fit: never adjacent; buddy: aligned powers of two
 * in one top-level block, never beside a free buddy); holes and reservations tile the arena; used <=
 * reservation; the id map finds every request; the identity holds. KVP_ESTATE names the first violation. */
kvp_status kvp_contig_check(const kvp_contig *c);

#endif
