/* parallel/shard.h — the arithmetic of Megatron-style tensor parallelism over tp ranks.
 *
 *   query heads     split: rank r holds heads [r*nq/tp, (r+1)*nq/tp)              (tp divides nq)
 *   KV heads        split when tp <= nkv (tp divides nkv); replicated when tp > nkv (nkv divides tp):
 *                   rank r holds KV head r / (tp/nkv), the one its query heads read
 *   QKV, gate/up    column-parallel (rows of W [out, in] for the rank's heads / intermediate slice)
 *   o_proj, down    row-parallel (the matching columns), each followed by an all-reduce of the output
 *   embedding, LM   vocab-parallel: rank r holds rows [r*vpad, r*vpad + nv), vpad = ceil(vocab/tp); logits
 *   head            are all-gathered as tp padded slices of vpad
 *   intermediate    split in tp near-equal ranges (need not divide)
 */
#ifndef KVP_PARALLEL_SHARD_H
#define KVP_PARALLEL_SHARD_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t tp, rank;
    int32_t q0, nq;     /* query heads [q0, q0 + nq) */
    int32_t kv0, nkv;   /* KV heads [kv0, kv0 + nkv) */
    int32_t kv_replicas; /* ranks holding each KV head (1 when split) */
    int64_t ff0, nff;   /* intermediate units [ff0, ff0 + nff) */
    int64_t v0, nv;     /* vocabulary rows [v0, v0 + nv), nv <= vpad (0 on a rank past the vocabulary) */
    int64_t vpad;       /* ceil(vocab / tp): each rank's slice of the gathered logits */
} kvp_tp_shard;

/* Checks that tp ranks can split these heads: KVP_EINVAL naming the numbers otherwise (tp < 1, tp not
 * dividing the query heads, or neither dividing nor a multiple of the KV heads). */
kvp_status kvp_tp_check(int32_t tp, int32_t num_q_heads, int32_t num_kv_heads);

/* Rank `rank`'s shard (after kvp_tp_check; KVP_EINVAL also for rank outside [0, tp) or sizes < 1). */
kvp_status kvp_tp_shard_of(int32_t tp, int32_t rank, int32_t num_q_heads, int32_t num_kv_heads,
                           int64_t intermediate, int64_t vocab, kvp_tp_shard *out);

#ifdef __cplusplus
}
#endif
#endif
