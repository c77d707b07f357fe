/* Tensor-parallel shard arithmetic (parallel/shard.h) against a brute-force count of who holds what, and the
 * single communicator (parallel/comm.h). The mpi communicator runs for real in test_tp_mpi.c. */
#include <criterion/criterion.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/shard.h"

/* Every query head, intermediate unit and vocabulary row is held by exactly one rank; the KV head a rank's
 * query heads read (q / group) is one it holds; every KV head is held by kv_replicas ranks. */
static void check_split(int32_t tp, int32_t nq, int32_t nkv, int64_t ff, int64_t vocab)
{
    int qcount[256] = {0}, kvcount[256] = {0};
    static int ffcount[4096], vcount[4096];
    memset(ffcount, 0, sizeof ffcount);
    memset(vcount, 0, sizeof vcount);
    const int32_t group = nq / nkv;
    for (int32_t r = 0; r < tp; r++) {
        kvp_tp_shard s;
        cr_assert_eq(kvp_tp_shard_of(tp, r, nq, nkv, ff, vocab, &s), KVP_OK, "tp %d rank %d: %s", tp, r,
                     kvp_error_message());
        cr_assert_eq(s.nq * tp, nq);
        for (int32_t q = s.q0; q < s.q0 + s.nq; q++) {
            qcount[q]++;
            cr_assert(q / group >= s.kv0 && q / group < s.kv0 + s.nkv, "tp %d: rank %d's head %d reads KV head %d, "
                      "not held", tp, r, q, q / group);
        }
        cr_assert_eq(s.nq / s.nkv * s.nkv, s.nq, "a rank's query heads group evenly over its KV heads");
        for (int32_t h = s.kv0; h < s.kv0 + s.nkv; h++) kvcount[h]++;
        cr_assert(s.nff >= ff / tp && s.nff <= ff / tp + 1);
        for (int64_t f = s.ff0; f < s.ff0 + s.nff; f++) ffcount[f]++;
        cr_assert(s.nv <= s.vpad && s.vpad * tp >= vocab && s.vpad * (tp - 1) < vocab);
        for (int64_t v = s.v0; v < s.v0 + s.nv; v++) vcount[v]++;
        cr_assert_eq(s.kv_replicas, tp > nkv ? tp / nkv : 1);
    }
    for (int32_t q = 0; q < nq; q++) cr_assert_eq(qcount[q], 1, "tp %d: query head %d", tp, q);
    for (int32_t h = 0; h < nkv; h++) cr_assert_eq(kvcount[h], tp > nkv ? tp / nkv : 1, "tp %d: KV head %d", tp, h);
    for (int64_t f = 0; f < ff; f++) cr_assert_eq(ffcount[f], 1, "tp %d: unit %lld", tp, (long long)f);
    for (int64_t v = 0; v < vocab; v++) cr_assert_eq(vcount[v], 1, "tp %d: row %lld", tp, (long long)v);
}

Test(shard, every_head_unit_and_row_held_once_kv_heads_replicated_when_short)
{
    /* stories260K (8/4 heads, 172 units, 512 tokens), Llama-3-8B-like (32/8), MHA, MQA, odd sizes */
    const int32_t shapes[][2] = {{8, 4}, {32, 8}, {16, 16}, {16, 1}, {12, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int32_t tp = 1; tp <= 32; tp++)
            if (shapes[k][0] % tp == 0 && (tp <= shapes[k][1] ? shapes[k][1] % tp : tp % shapes[k][1]) == 0)
                check_split(tp, shapes[k][0], shapes[k][1], 172 + tp, 509);
}

Test(shard, splits_that_do_not_work_are_named)
{
    kvp_tp_shard s;
    cr_assert_eq(kvp_tp_shard_of(3, 0, 8, 4, 172, 512, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "does not divide the 8 attention heads"), "%s", kvp_error_message());
    cr_assert_eq(kvp_tp_shard_of(4, 0, 12, 6, 172, 512, &s), KVP_EINVAL); /* 4 neither divides 6 nor is a multiple */
    cr_assert(strstr(kvp_error_message(), "6 KV heads"), "%s", kvp_error_message());
    cr_assert_eq(kvp_tp_shard_of(0, 0, 8, 4, 172, 512, &s), KVP_EINVAL);
    cr_assert_eq(kvp_tp_shard_of(2, 2, 8, 4, 172, 512, &s), KVP_EINVAL);  /* no rank 2 of 2 */
    cr_assert_eq(kvp_tp_shard_of(2, -1, 8, 4, 172, 512, &s), KVP_EINVAL);
    cr_assert_eq(kvp_tp_shard_of(8, 0, 8, 4, 7, 512, &s), KVP_EINVAL);    /* fewer MLP units than ranks */
    cr_assert_eq(kvp_tp_check(2, 8, 3), KVP_EINVAL);                      /* 8 heads over 3 KV heads */
}

Test(comm, single_rank_collectives_are_identities_and_check_their_arguments)
{
    kvp_comm *c;
    cr_assert_eq(kvp_comm_single_create(&c), KVP_OK);
    cr_assert_eq(kvp_comm_rank(c), 0);
    cr_assert_eq(kvp_comm_size(c), 1);
    cr_assert_str_eq(kvp_comm_backend(c), "single");
    float x[3] = {1, -2, 3}, y[3] = {0};
    cr_assert_eq(kvp_comm_all_reduce_sum_f32(c, x, 3), KVP_OK);
    cr_assert(x[0] == 1 && x[1] == -2 && x[2] == 3);
    cr_assert_eq(kvp_comm_all_gather_f32(c, x, 3, y), KVP_OK);
    cr_assert(memcmp(x, y, sizeof x) == 0);
    cr_assert_eq(kvp_comm_broadcast(c, y, sizeof y, 0), KVP_OK);
    cr_assert_eq(kvp_comm_broadcast(c, y, sizeof y, 1), KVP_EINVAL); /* no rank 1 */
    cr_assert_eq(kvp_comm_all_reduce_sum_f32(c, NULL, 3), KVP_EINVAL);
    cr_assert_eq(kvp_comm_all_reduce_sum_f32(c, x, -1), KVP_EINVAL);
    cr_assert_eq(kvp_comm_all_gather_f32(c, x, 3, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_comm_barrier(c), KVP_OK);
    kvp_comm_abort(c, 2); /* one rank: returns */
    kvp_comm_destroy(c);
    kvp_comm_destroy(NULL);
    cr_assert(kvp_comm_have_mpi(), "this build has no MPI: scripts/install-deps.sh installs libopenmpi-dev");
}
