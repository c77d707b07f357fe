/* parallel/shard.c — which heads, intermediate units and vocabulary rows a rank holds (parallel/shard.h). */
#include "parallel/shard.h"

kvp_status kvp_tp_check(int32_t tp, int32_t nq, int32_t nkv)
{
    if (tp < 1) return KVP_ERR(KVP_EINVAL, "--tp %d must be positive", tp);
    if (nq < 1 || nkv < 1 || nq % nkv) return KVP_ERR(KVP_EINVAL, "%d query heads over %d KV heads", nq, nkv);
    if (nq % tp) return KVP_ERR(KVP_EINVAL, "--tp %d does not divide the %d attention heads", tp, nq);
    if (tp <= nkv ? nkv % tp : tp % nkv)
        return KVP_ERR(KVP_EINVAL, "--tp %d does not divide the %d KV heads (nor is it a multiple of them)", tp, nkv);
    return KVP_OK;
}

kvp_status kvp_tp_shard_of(int32_t tp, int32_t rank, int32_t nq, int32_t nkv, int64_t ff, int64_t vocab,
                           kvp_tp_shard *out)
{
    KVP_TRY(kvp_tp_check(tp, nq, nkv));
    if (rank < 0 || rank >= tp) return KVP_ERR(KVP_EINVAL, "rank %d is not in [0, %d)", rank, tp);
    if (ff < tp || vocab < 1)
        return KVP_ERR(KVP_EINVAL, "intermediate size %lld (at least one unit per rank of %d) and vocabulary %lld",
                       (long long)ff, tp, (long long)vocab);
    kvp_tp_shard s = {.tp = tp, .rank = rank, .nq = nq / tp, .kv_replicas = tp > nkv ? tp / nkv : 1};
    s.q0 = rank * s.nq;
    s.nkv = tp > nkv ? 1 : nkv / tp;
    s.kv0 = tp > nkv ? rank / s.kv_replicas : rank * s.nkv; /* = q0 / (nq / nkv): the heads its queries read */
    s.ff0 = ff * rank / tp;
    s.nff = ff * (rank + 1) / tp - s.ff0;
    s.vpad = (vocab + tp - 1) / tp;
    s.v0 = (int64_t)rank * s.vpad;
    s.nv = vocab - s.v0 < 0 ? 0 : vocab - s.v0 < s.vpad ? vocab - s.v0 : s.vpad;
    if (s.v0 > vocab) s.v0 = vocab;
    *out = s;
    return KVP_OK;
}
