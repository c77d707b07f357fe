#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "blockmgr/block_mgr.h"
#include "bm_testutil.h"
#include "common/alloc.h"

static kvp_block_mgr *mk(int32_t nb, int32_t bs, int32_t nhost, int32_t maxlen, int32_t wm)
{
    kvp_bm_config cfg = {.num_blocks = nb, .block_size = bs, .num_host_blocks = nhost, .max_seq_len = maxlen,
                         .watermark_blocks = wm};
    kvp_block_mgr *bm = NULL;
    cr_assert_eq(kvp_bm_create(&cfg, &bm), KVP_OK, "%s", kvp_error_detail());
    return bm;
}

#define CHECK(bm) cr_assert_eq(kvp_bm_check(bm), KVP_OK, "walker: %s", kvp_error_detail())

static kvp_bm_table_view table(kvp_block_mgr *bm, int64_t id)
{
    kvp_bm_table_view t;
    cr_assert_eq(kvp_bm_table(bm, id, &t), KVP_OK, "table %lld", (long long)id);
    return t;
}

static kvp_kv_accounting acc(kvp_block_mgr *bm)
{
    kvp_kv_accounting a;
    kvp_bm_account(bm, false, &a);
    cr_assert_eq(kvp_kv_accounting_residual(&a), 0);
    return a;
}

/* Runs `call` on a copy of the state and asserts status `want` and an unchanged manager. */
#define EXPECT_FAIL_UNCHANGED(bm, want, call)                                                                       \
    do {                                                                                                            \
        snap_t before_ = {0}, after_ = {0};                                                                         \
        snap_take(bm, &before_);                                                                                    \
        kvp_status st_ = (call);                                                                                    \
        cr_assert_eq(st_, want, "%s returned %s (%s)", #call, kvp_status_str(st_), kvp_error_detail());           \
        cr_assert_neq(kvp_error_detail()[0], '\0', "a failure records a detail");                                   \
        snap_take(bm, &after_);                                                                                     \
        cr_assert(snap_equal(&before_, &after_), "%s changed the manager", #call);                                  \
        snap_free(&before_);                                                                                        \
        snap_free(&after_);                                                                                         \
        CHECK(bm);                                                                                                  \
    } while (0)

Test(block_mgr, create_rejects_bad_config)
{
    kvp_bm_config good = {.num_blocks = 8, .block_size = 16, .num_host_blocks = 4, .max_seq_len = 100, .watermark_blocks = 1};
    kvp_block_mgr *bm = NULL;
    kvp_bm_config c = good;
    c.num_blocks = 0;
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    c = good;
    c.block_size = -1;
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    c = good;
    c.num_host_blocks = -1;
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    c = good;
    c.max_seq_len = -5;
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    c = good;
    c.watermark_blocks = -1;
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    c = good;
    c.num_blocks = 1 << 24;
    c.block_size = 256; /* 2^32 slots: slot ids would overflow int32 */
    cr_assert_eq(kvp_bm_create(&c, &bm), KVP_EINVAL);
    cr_assert_null(bm);
    cr_assert_eq(kvp_bm_create(NULL, &bm), KVP_EINVAL);
    cr_assert_eq(kvp_bm_create(&good, &bm), KVP_OK);
    CHECK(bm);
    kvp_bm_destroy(bm);
    kvp_bm_destroy(NULL);
}

Test(block_mgr, allocate_append_and_slot_mapping)
{
    kvp_block_mgr *bm = mk(10, 16, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 17, 37), KVP_OK);
    kvp_bm_table_view t = table(bm, 17);
    cr_assert_eq(t.num_blocks, 3);
    cr_assert_eq(t.num_tokens, 37);
    cr_assert_eq(t.on_host, false);
    cr_assert_eq(kvp_bm_num_free(bm), 7);
    kvp_kv_accounting a = acc(bm);
    cr_assert_eq(a.capacity, 160);
    cr_assert_eq(a.token_states, 37);
    cr_assert_eq(a.internal_frag, 11);
    cr_assert_eq(a.reserved, 0);
    cr_assert_eq(a.free, 112);
    cr_assert_eq(a.num_seqs, 1);
    int32_t slots[20];
    cr_assert_eq(kvp_bm_append(bm, 17, 1, slots), KVP_OK);
    cr_assert_eq(slots[0], t.blocks[2] * 16 + 5);
    /* 11 more: 10 fill block 2, 1 goes to a new block */
    cr_assert_eq(kvp_bm_append(bm, 17, 11, slots), KVP_OK);
    t = table(bm, 17);
    cr_assert_eq(t.num_blocks, 4);
    cr_assert_eq(t.num_tokens, 49);
    for (int j = 0; j < 10; j++) cr_assert_eq(slots[j], t.blocks[2] * 16 + 6 + j);
    cr_assert_eq(slots[10], t.blocks[3] * 16 + 0);
    a = acc(bm);
    cr_assert_eq(a.token_states, 49);
    cr_assert_eq(a.internal_frag, 15);
    cr_assert_eq(kvp_bm_append(bm, 17, 0, NULL), KVP_OK);
    /* an empty sequence holds no block; its first append allocates one */
    cr_assert_eq(kvp_bm_allocate(bm, -4, 0), KVP_OK);
    cr_assert_eq(table(bm, -4).num_blocks, 0);
    cr_assert_eq(kvp_bm_append(bm, -4, 1, slots), KVP_OK);
    cr_assert_eq(table(bm, -4).num_blocks, 1);
    cr_assert_eq(slots[0], table(bm, -4).blocks[0] * 16);
    CHECK(bm);
    /* amortized append path: one token at a time over many blocks */
    cr_assert_eq(kvp_bm_allocate(bm, 5, 1), KVP_OK);
    for (int i = 1; i < 16 * 4; i++) {
        int32_t s;
        cr_assert_eq(kvp_bm_append(bm, 5, 1, &s), KVP_OK);
        t = table(bm, 5);
        cr_assert_eq(s, t.blocks[i / 16] * 16 + i % 16, "token %d", i);
    }
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, odd_block_sizes_map_slots)
{
    const int32_t sizes[] = {1, 3, 7, 12, 100, 256};
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
        int32_t bs = sizes[z];
        kvp_block_mgr *bm = mk(40, bs, 0, 0, 0);
        cr_assert_eq(kvp_bm_allocate(bm, 1, 2 * bs + 1), KVP_OK);
        int32_t slots[300];
        cr_assert_eq(kvp_bm_append(bm, 1, bs + 2, slots), KVP_OK);
        kvp_bm_table_view t = table(bm, 1);
        for (int32_t j = 0; j < bs + 2; j++) {
            int32_t pos = 2 * bs + 1 + j;
            cr_assert_eq(slots[j], t.blocks[pos / bs] * bs + pos % bs, "bs %d token %d", bs, pos);
        }
        kvp_kv_accounting a = acc(bm);
        cr_assert_eq(a.token_states, 3 * bs + 3);
        CHECK(bm);
        kvp_bm_destroy(bm);
    }
}

Test(block_mgr, bad_input_changes_nothing)
{
    kvp_block_mgr *bm = mk(6, 4, 0, 20, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 9), KVP_OK);
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_allocate(bm, 1, 3));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_allocate(bm, 2, -1));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_allocate(bm, 2, 21));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOBLOCKS, kvp_bm_allocate(bm, 2, 13));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOTFOUND, kvp_bm_append(bm, 99, 1, NULL));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_append(bm, 1, -2, NULL));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_append(bm, 1, 12, NULL)); /* 9 + 12 > max_seq_len 20 */
    cr_assert_eq(kvp_bm_allocate(bm, 2, 8), KVP_OK);                      /* 5 of 6 blocks used */
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOBLOCKS, kvp_bm_append(bm, 1, 8, NULL));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOTFOUND, kvp_bm_fork(bm, 99, 3));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_fork(bm, 1, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_truncate(bm, 1, 10));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_truncate(bm, 1, -1));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOTFOUND, kvp_bm_truncate(bm, 42, 0));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOBLOCKS, kvp_bm_reserve(bm, 1, 10));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EUNSUPPORTED, kvp_bm_swap_out(bm, (int64_t[]){1}, 1));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_incref(bm, 6));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_incref(bm, 5)); /* free */
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_decref(bm, table(bm, 1).blocks[0]));
    cr_assert_eq(kvp_bm_free(bm, 1), KVP_OK);
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOTFOUND, kvp_bm_free(bm, 1)); /* double free */
    cr_assert_eq(kvp_bm_free(bm, 2), KVP_OK);
    cr_assert_eq(kvp_bm_num_free(bm), 6);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, fork_and_copy_on_write)
{
    kvp_block_mgr *bm = mk(10, 16, 0, 0, 0);
    kvp_block_pool *p = kvp_bm_pool(bm);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 20), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK);
    kvp_bm_table_view t1 = table(bm, 1), t2 = table(bm, 2);
    const int32_t a = t1.blocks[0], b = t1.blocks[1];
    cr_assert_eq(t2.blocks[0], a);
    cr_assert_eq(t2.blocks[1], b);
    cr_assert_eq(kvp_pool_refcount(p, a), 2);
    cr_assert_eq(kvp_pool_refcount(p, b), 2);
    cr_assert_eq(kvp_bm_num_free(bm), 8);
    kvp_kv_accounting ac = acc(bm);
    cr_assert_eq(ac.token_states, 20);
    cr_assert_eq(ac.logical_tokens, 40);
    cr_assert_eq(ac.shared_savings, 20);
    cr_assert_eq(ac.internal_frag, 12);
    CHECK(bm);
    int32_t need;
    cr_assert_eq(kvp_bm_append_blocks_needed(bm, 2, 1, &need), KVP_OK);
    cr_assert_eq(need, 1, "CoW needs one block");
    int32_t slot;
    cr_assert_eq(kvp_bm_append(bm, 2, 1, &slot), KVP_OK);
    t2 = table(bm, 2);
    cr_assert_eq(t2.blocks[0], a);
    cr_assert_neq(t2.blocks[1], b);
    cr_assert_eq(slot, t2.blocks[1] * 16 + 4);
    cr_assert_eq(kvp_pool_refcount(p, b), 1);
    cr_assert_eq(kvp_pool_refcount(p, a), 2);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 1);
    cr_assert_eq(ops.copies[0].src, b);
    cr_assert_eq(ops.copies[0].dst, t2.blocks[1]);
    ac = acc(bm);
    cr_assert_eq(ac.token_states, 16 + 4 + 5);
    cr_assert_eq(ac.shared_savings, 16);
    /* the parent now owns b alone: appends in place, no copy */
    cr_assert_eq(kvp_bm_append(bm, 1, 1, &slot), KVP_OK);
    cr_assert_eq(slot, b * 16 + 4);
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 1);
    kvp_bm_step_ops_clear(bm);
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 0);
    /* a full shared last block: the next token gets a fresh block, nothing to copy */
    cr_assert_eq(kvp_bm_allocate(bm, 3, 32), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 3, 4), KVP_OK);
    cr_assert_eq(kvp_bm_append(bm, 4, 1, NULL), KVP_OK);
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 0);
    cr_assert_eq(table(bm, 4).num_blocks, 3);
    CHECK(bm);
    for (int64_t id = 1; id <= 4; id++) cr_assert_eq(kvp_bm_free(bm, id), KVP_OK);
    cr_assert_eq(kvp_bm_num_free(bm), 10);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, truncate_shared_blocks_keeps_exact_accounting)
{
    kvp_block_mgr *bm = mk(10, 16, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 40), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK);
    cr_assert_eq(kvp_bm_truncate(bm, 2, 10), KVP_OK);
    CHECK(bm);
    kvp_kv_accounting a = acc(bm);
    cr_assert_eq(a.token_states, 40);
    cr_assert_eq(a.logical_tokens, 50);
    cr_assert_eq(a.shared_savings, 10);
    cr_assert_eq(kvp_bm_free(bm, 1), KVP_OK); /* the longest view goes: the block keeps 10 tokens */
    CHECK(bm);
    a = acc(bm);
    cr_assert_eq(a.token_states, 10);
    cr_assert_eq(a.internal_frag, 6);
    cr_assert_eq(a.free, 9 * 16);
    /* the survivor owns its block alone now: it appends in place */
    int32_t slot;
    cr_assert_eq(kvp_bm_append(bm, 2, 1, &slot), KVP_OK);
    cr_assert_eq(slot, table(bm, 2).blocks[0] * 16 + 10);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 0);
    cr_assert_eq(kvp_bm_truncate(bm, 2, 0), KVP_OK);
    cr_assert_eq(table(bm, 2).num_blocks, 0);
    cr_assert_eq(kvp_bm_num_free(bm), 10);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, reserve_ahead_counts_as_reserved)
{
    kvp_block_mgr *bm = mk(10, 8, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 5), KVP_OK);
    cr_assert_eq(kvp_bm_reserve(bm, 1, 20), KVP_OK); /* 25 tokens -> 4 blocks */
    kvp_bm_table_view t = table(bm, 1);
    cr_assert_eq(t.num_blocks, 4);
    kvp_kv_accounting a = acc(bm);
    cr_assert_eq(a.token_states, 5);
    cr_assert_eq(a.internal_frag, 3);
    cr_assert_eq(a.reserved, 24);
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK);
    cr_assert_eq(table(bm, 2).num_blocks, 1, "reserved blocks are not shared");
    int32_t slots[8];
    cr_assert_eq(kvp_bm_append(bm, 1, 8, slots), KVP_OK); /* CoW of block 0 (shared), then reserved block 1 */
    t = table(bm, 1);
    cr_assert_eq(t.num_blocks, 4);
    cr_assert_eq(slots[7], t.blocks[1] * 8 + 4);
    a = acc(bm);
    cr_assert_eq(a.reserved, 16);
    CHECK(bm);
    cr_assert_eq(kvp_bm_truncate(bm, 1, 13), KVP_OK); /* reserved blocks released */
    cr_assert_eq(table(bm, 1).num_blocks, 2);
    cr_assert_eq(acc(bm).reserved, 0);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, prefix_blocks_and_cached_accounting)
{
    kvp_block_mgr *bm = mk(10, 16, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 40), KVP_OK);
    kvp_bm_table_view t = table(bm, 1);
    int32_t pre[2] = {t.blocks[0], t.blocks[1]};
    /* the cache takes its own references on the two full blocks */
    cr_assert_eq(kvp_bm_incref(bm, pre[0]), KVP_OK);
    cr_assert_eq(kvp_bm_incref(bm, pre[1]), KVP_OK);
    cr_assert_eq(kvp_bm_free(bm, 1), KVP_OK);
    kvp_kv_accounting a = acc(bm);
    cr_assert_eq(a.cached, 32);
    cr_assert_eq(a.token_states, 0);
    cr_assert_eq(a.free, 8 * 16);
    CHECK(bm);
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_allocate_prefixed(bm, 2, 31, pre, 2)); /* prefix longer than prompt */
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_allocate_prefixed(bm, 2, 40, (int32_t[]){pre[0], pre[0]}, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_EINVAL, kvp_bm_allocate_prefixed(bm, 2, 40, (int32_t[]){pre[0], 10}, 2));
    int32_t free_id = kvp_pool_refcount(kvp_bm_pool(bm), 9) == 0 ? 9 : 8;
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_allocate_prefixed(bm, 2, 40, (int32_t[]){pre[0], free_id}, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOBLOCKS, kvp_bm_allocate_prefixed(bm, 2, 32 + 16 * 8 + 1, pre, 2));
    cr_assert_eq(kvp_bm_allocate_prefixed(bm, 2, 40, pre, 2), KVP_OK);
    t = table(bm, 2);
    cr_assert_eq(t.blocks[0], pre[0]);
    cr_assert_eq(t.blocks[1], pre[1]);
    cr_assert_eq(kvp_pool_refcount(kvp_bm_pool(bm), pre[0]), 2);
    a = acc(bm);
    cr_assert_eq(a.cached, 0);
    cr_assert_eq(a.token_states, 40);
    cr_assert_eq(kvp_bm_allocate_prefixed(bm, 3, 32, pre, 2), KVP_OK); /* exactly the prefix: no new block */
    cr_assert_eq(table(bm, 3).num_blocks, 2);
    a = acc(bm);
    cr_assert_eq(a.token_states, 40);
    cr_assert_eq(a.shared_savings, 32);
    /* an append after a full prefix needs a new block, never a copy */
    cr_assert_eq(kvp_bm_append(bm, 3, 1, NULL), KVP_OK);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 0);
    CHECK(bm);
    cr_assert_eq(kvp_bm_free(bm, 2), KVP_OK);
    cr_assert_eq(kvp_bm_free(bm, 3), KVP_OK);
    cr_assert_eq(acc(bm).cached, 32);
    cr_assert_eq(kvp_bm_decref(bm, pre[0]), KVP_OK); /* eviction */
    cr_assert_eq(kvp_bm_decref(bm, pre[1]), KVP_OK);
    cr_assert_eq(kvp_bm_num_free(bm), 10);
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_decref(bm, pre[1]));
    cr_assert_eq(kvp_bm_take(bm, pre[1]), KVP_OK);
    cr_assert_eq(acc(bm).cached, 16);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, admission_watermark)
{
    kvp_block_mgr *bm = mk(10, 16, 0, 0, 2);
    cr_assert(kvp_bm_can_allocate(bm, 16 * 8));
    cr_assert_not(kvp_bm_can_allocate(bm, 16 * 8 + 1));
    cr_assert_not(kvp_bm_can_allocate(bm, -1));
    cr_assert_eq(kvp_bm_allocate(bm, 1, 16 * 7), KVP_OK);
    cr_assert(kvp_bm_can_allocate(bm, 16));
    cr_assert_not(kvp_bm_can_allocate(bm, 17));
    cr_assert(kvp_bm_can_allocate(bm, 0));
    kvp_bm_destroy(bm);
}

Test(block_mgr, swap_out_and_in)
{
    kvp_block_mgr *bm = mk(10, 4, 6, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 10), KVP_OK); /* 3 blocks */
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK);
    cr_assert_eq(kvp_bm_append(bm, 2, 1, NULL), KVP_OK); /* CoW: 2 has its own last block */
    cr_assert_eq(kvp_bm_allocate(bm, 3, 4), KVP_OK);
    kvp_bm_step_ops_clear(bm);
    kvp_bm_table_view t1 = table(bm, 1);
    int32_t dev1[3] = {t1.blocks[0], t1.blocks[1], t1.blocks[2]};
    /* swapping 1 and 2 together moves the shared blocks once: 3 + 1 = 4 host blocks */
    int64_t ids[2] = {1, 2};
    cr_assert_eq(kvp_bm_swap_out(bm, ids, 2), KVP_OK);
    CHECK(bm);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_swap_out, 4);
    cr_assert_eq(ops.swap_out[0].src, dev1[0]);
    t1 = table(bm, 1);
    kvp_bm_table_view t2 = table(bm, 2);
    cr_assert(t1.on_host && t2.on_host);
    cr_assert_eq(t1.blocks[0], t2.blocks[0]);
    cr_assert_eq(t1.blocks[1], t2.blocks[1]);
    cr_assert_eq(kvp_pool_refcount(kvp_bm_host_pool(bm), t1.blocks[0]), 2);
    cr_assert_eq(kvp_bm_num_free(bm), 9);
    kvp_kv_accounting h;
    kvp_bm_account(bm, true, &h);
    cr_assert_eq(h.token_states, 13); /* 8 shared + 2 + 3 */
    cr_assert_eq(h.logical_tokens, 21);
    cr_assert_eq(h.num_seqs, 2);
    cr_assert_eq(kvp_kv_accounting_residual(&h), 0);
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_append(bm, 1, 1, NULL));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_fork(bm, 1, 7));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_truncate(bm, 1, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_swap_out(bm, ids, 1));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_swap_in(bm, (int64_t[]){1, 3}, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_swap_in(bm, (int64_t[]){1, 1}, 2));
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOTFOUND, kvp_bm_swap_in(bm, (int64_t[]){1, 55}, 2));
    /* 3 needs 1 host block, 2 free of 6: OK; then a 3-block sequence does not fit */
    cr_assert_eq(kvp_bm_allocate(bm, 4, 12), KVP_OK);
    EXPECT_FAIL_UNCHANGED(bm, KVP_ENOBLOCKS, kvp_bm_swap_out(bm, (int64_t[]){4}, 1));
    int32_t need;
    cr_assert_eq(kvp_bm_swap_in_blocks_needed(bm, ids, 2, &need), KVP_OK);
    cr_assert_eq(need, 4);
    cr_assert_eq(kvp_bm_swap_in(bm, ids, 2), KVP_OK);
    CHECK(bm);
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_swap_in, 4);
    t1 = table(bm, 1);
    t2 = table(bm, 2);
    cr_assert_not(t1.on_host);
    cr_assert_eq(t1.num_tokens, 10);
    cr_assert_eq(t2.num_tokens, 11);
    cr_assert_eq(t1.blocks[0], t2.blocks[0]);
    cr_assert_eq(kvp_pool_refcount(kvp_bm_pool(bm), t1.blocks[0]), 2);
    cr_assert_eq(kvp_pool_num_free(kvp_bm_host_pool(bm)), 6);
    cr_assert_eq(kvp_bm_append(bm, 1, 2, NULL), KVP_OK);
    /* a block shared with a sequence that stays: copied, the other keeps the original */
    cr_assert_eq(kvp_bm_fork(bm, 3, 5), KVP_OK);
    int32_t shared = table(bm, 3).blocks[0];
    cr_assert_eq(kvp_bm_swap_out(bm, (int64_t[]){5}, 1), KVP_OK);
    cr_assert_eq(table(bm, 3).blocks[0], shared);
    cr_assert_eq(kvp_pool_refcount(kvp_bm_pool(bm), shared), 1);
    cr_assert_eq(kvp_bm_free(bm, 5), KVP_OK); /* free a swapped-out sequence */
    cr_assert_eq(kvp_pool_num_free(kvp_bm_host_pool(bm)), 6);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

/* For every allocation an operation makes, failing it returns KVP_ENOMEM and changes nothing. */
typedef kvp_status (*op_fn)(kvp_block_mgr *bm, int arg);

static kvp_status op_allocate(kvp_block_mgr *bm, int arg) { return kvp_bm_allocate(bm, 1000 + arg, 9); }
static kvp_status op_prefixed(kvp_block_mgr *bm, int arg)
{
    kvp_bm_table_view t;
    kvp_bm_table(bm, 0, &t);
    return kvp_bm_allocate_prefixed(bm, 1000 + arg, 20, t.blocks, 1);
}
static kvp_status op_fork(kvp_block_mgr *bm, int arg) { return kvp_bm_fork(bm, 0, 1000 + arg); }
static kvp_status op_append_grow(kvp_block_mgr *bm, int arg)
{
    (void)arg;
    return kvp_bm_append(bm, 0, 40, NULL);
}
static kvp_status op_append_cow(kvp_block_mgr *bm, int arg)
{
    (void)arg;
    return kvp_bm_append(bm, 1, 1, NULL);
}
static kvp_status op_reserve(kvp_block_mgr *bm, int arg)
{
    (void)arg;
    return kvp_bm_reserve(bm, 0, 60);
}
static kvp_status op_swap_out(kvp_block_mgr *bm, int arg)
{
    (void)arg;
    return kvp_bm_swap_out(bm, (int64_t[]){0, 1}, 2);
}

Test(block_mgr, allocation_failures_change_nothing)
{
    const struct {
        const char *name;
        op_fn fn;
    } ops[] = {{"allocate", op_allocate}, {"allocate_prefixed", op_prefixed}, {"fork", op_fork},
               {"append_grow", op_append_grow}, {"append_cow", op_append_cow}, {"reserve", op_reserve},
               {"swap_out", op_swap_out}};
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        int most = 0;
        for (int nseq = 2; nseq <= 40; nseq += 1) {
            /* nseq sequences exist before the operation so that the id map and arrays cross growth points */
            kvp_block_mgr *bm = mk(400, 4, 200, 0, 0);
            cr_assert_eq(kvp_bm_allocate(bm, 0, 6), KVP_OK);
            cr_assert_eq(kvp_bm_fork(bm, 0, 1), KVP_OK);
            for (int s = 2; s < nseq; s++) cr_assert_eq(kvp_bm_allocate(bm, 5000 + s, 3), KVP_OK);
            int failures = 0;
            for (int64_t n = 1;; n++) {
                snap_t before = {0}, after = {0};
                snap_take(bm, &before);
                kvp_alloc_fail_at(n);
                kvp_status st = ops[o].fn(bm, nseq);
                int64_t made = kvp_alloc_count();
                kvp_alloc_fail_at(0);
                if (made < n) {
                    cr_assert_eq(st, KVP_OK, "%s (nseq %d) without failure: %s", ops[o].name, nseq, kvp_error_detail());
                    snap_free(&before);
                    break;
                }
                failures++;
                cr_assert_eq(st, KVP_ENOMEM, "%s nseq %d failing allocation %lld: %s", ops[o].name, nseq, (long long)n,
                             kvp_status_str(st));
                snap_take(bm, &after);
                cr_assert(snap_equal(&before, &after), "%s nseq %d: failing allocation %lld changed the manager",
                          ops[o].name, nseq, (long long)n);
                snap_free(&before);
                snap_free(&after);
                CHECK(bm);
            }
            CHECK(bm);
            kvp_bm_destroy(bm);
            if (failures > most) most = failures;
        }
        cr_assert_geq(most, 1, "%s never allocated: the failure loop tested nothing", ops[o].name);
        if (o < 3) cr_assert_geq(most, 2, "%s: table + map/array growth expected", ops[o].name);
    }
}

Test(block_mgr, accounting_in_bytes)
{
    kvp_block_mgr *bm = mk(4, 16, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 20), KVP_OK);
    kvp_kv_accounting s, b;
    kvp_bm_account(bm, false, &s);
    /* Llama-2-7B-like slot: 2 x 32 layers x 32 heads x 128 x 2 bytes = 524288 bytes */
    kvp_kv_accounting_bytes(&s, 524288, &b);
    cr_assert_eq(b.capacity, 64LL * 524288);
    cr_assert_eq(b.token_states, 20LL * 524288);
    cr_assert_eq(b.internal_frag, 12LL * 524288);
    cr_assert_eq(b.free, 32LL * 524288);
    cr_assert_eq(b.num_seqs, 1);
    cr_assert_eq(kvp_kv_accounting_residual(&b), 0);
    kvp_bm_destroy(bm);
}

/* The walker is only useful if it notices damage: corrupt state behind the manager's back, one way at a time. */
Test(block_mgr, walker_detects_corruption)
{
    kvp_block_mgr *bm = mk(8, 4, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 6), KVP_OK);
    cr_assert_eq(kvp_bm_allocate(bm, 2, 3), KVP_OK);
    CHECK(bm);
    kvp_block_pool *p = kvp_bm_pool(bm);
    kvp_bm_table_view t = table(bm, 1);
    int32_t b0 = t.blocks[0];
    /* a reference dropped by someone who did not hold it: refcount below the table references */
    cr_assert_eq(kvp_pool_decref(p, b0), KVP_OK);
    cr_assert_eq(kvp_bm_check(bm), KVP_ESTATE);
    cr_assert(strstr(kvp_error_detail(), "block") != NULL, "detail names the block: %s", kvp_error_detail());
    cr_assert_eq(kvp_pool_take(p, b0), KVP_OK); /* repaired */
    CHECK(bm);
    /* a table entry rewritten to another block */
    int32_t *w = (int32_t *)t.blocks;
    int32_t saved = w[1];
    w[1] = table(bm, 2).blocks[0];
    cr_assert_eq(kvp_bm_check(bm), KVP_ESTATE);
    w[1] = saved;
    CHECK(bm);
    /* an extra reference is legal (a cache holds it): the block is simply not free */
    cr_assert_eq(kvp_pool_incref(p, b0), KVP_OK);
    CHECK(bm);
    cr_assert_eq(kvp_pool_decref(p, b0), KVP_OK);
    kvp_bm_destroy(bm);
}

Test(block_mgr, listing_sequences)
{
    kvp_block_mgr *bm = mk(16, 4, 0, 0, 0);
    int64_t ids[5] = {7, -3, 1LL << 40, 0, 99};
    for (int i = 0; i < 5; i++) cr_assert_eq(kvp_bm_allocate(bm, ids[i], i), KVP_OK);
    cr_assert_eq(kvp_bm_num_seqs(bm), 5);
    cr_assert_eq(kvp_bm_free(bm, -3), KVP_OK);
    int64_t out[8];
    cr_assert_eq(kvp_bm_seq_ids(bm, out, 8), 4);
    cr_assert_eq(kvp_bm_seq_ids(bm, out, 2), 2);
    cr_assert_eq(kvp_bm_seq_ids(bm, out, 8), 4);
    int seen = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            if (out[i] == ids[j]) seen |= 1 << j;
    cr_assert_eq(seen, 0x1f & ~2);
    cr_assert(kvp_bm_has_seq(bm, 1LL << 40));
    cr_assert_not(kvp_bm_has_seq(bm, -3));
    cr_assert_eq(kvp_bm_block_size(bm), 4);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, swap_out_waits_for_pending_copies)
{
    kvp_block_mgr *bm = mk(10, 4, 10, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 6), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK);
    cr_assert_eq(kvp_bm_append(bm, 2, 1, NULL), KVP_OK); /* CoW into a fresh block of 2 */
    EXPECT_FAIL_UNCHANGED(bm, KVP_ESTATE, kvp_bm_swap_out(bm, (int64_t[]){2}, 1));
    cr_assert_eq(kvp_bm_swap_out(bm, (int64_t[]){1}, 1), KVP_OK, "the copy's source may move (swap out runs first)");
    kvp_bm_step_ops_clear(bm);
    cr_assert_eq(kvp_bm_swap_out(bm, (int64_t[]){2}, 1), KVP_OK);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

Test(block_mgr, append_of_zero_tokens_changes_nothing)
{
    kvp_block_mgr *bm = mk(8, 4, 0, 0, 0);
    cr_assert_eq(kvp_bm_allocate(bm, 1, 6), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 1, 2), KVP_OK); /* shared partly filled last block */
    snap_t a = {0}, b = {0};
    snap_take(bm, &a);
    int32_t need = -1;
    cr_assert_eq(kvp_bm_append_blocks_needed(bm, 2, 0, &need), KVP_OK);
    cr_assert_eq(need, 0);
    cr_assert_eq(kvp_bm_append(bm, 2, 0, NULL), KVP_OK);
    snap_take(bm, &b);
    cr_assert(snap_equal(&a, &b), "an empty append must not copy-on-write");
    snap_free(&a);
    snap_free(&b);
    CHECK(bm);
    kvp_bm_destroy(bm);
}

/* kvp_bm_append_ref equals kvp_bm_append by id, and its cached position survives every call that moves
 * sequences in the manager (frees reorder them, admissions grow the array, swaps, forks). */
Test(block_mgr, append_by_reference_follows_moved_sequences)
{
    kvp_block_mgr *bm = mk(64, 4, 16, 0, 0);
    kvp_bm_seq_ref r[6];
    for (int64_t id = 0; id < 6; id++) {
        cr_assert_eq(kvp_bm_allocate(bm, 100 + id, (int32_t)id), KVP_OK);
        cr_assert_eq(kvp_bm_seq_ref_get(bm, 100 + id, &r[id]), KVP_OK);
        cr_assert_eq(r[id].seq_id, 100 + id);
    }
    kvp_bm_seq_ref bad;
    cr_assert_eq(kvp_bm_seq_ref_get(bm, 7, &bad), KVP_ENOTFOUND);
    cr_assert_eq(kvp_bm_seq_ref_get(bm, 100, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_bm_append_ref(bm, NULL, 1, NULL), KVP_EINVAL);
    /* freeing sequence 100 moves the last one (105) into its place: 105's reference must follow it */
    cr_assert_eq(kvp_bm_free(bm, 100), KVP_OK);
    int32_t slot_ref, slot_id;
    for (int rep = 0; rep < 9; rep++) {
        cr_assert_eq(kvp_bm_append_ref(bm, &r[5], 1, &slot_ref), KVP_OK);
        kvp_bm_table_view t;
        cr_assert_eq(kvp_bm_table(bm, 105, &t), KVP_OK);
        cr_assert_eq(t.num_tokens, 5 + rep + 1);
        const int32_t last = t.num_tokens - 1;
        cr_assert_eq(slot_ref, t.blocks[last / 4] * 4 + last % 4, "slot of token %d", last);
        CHECK(bm);
    }
    /* the freed sequence: unknown, nothing changes; its reference works again once the id is back */
    snap_t a = {0}, b = {0};
    snap_take(bm, &a);
    cr_assert_eq(kvp_bm_append_ref(bm, &r[0], 1, &slot_ref), KVP_ENOTFOUND);
    snap_take(bm, &b);
    cr_assert(snap_equal(&a, &b), "a failed append by reference changes nothing");
    cr_assert_eq(kvp_bm_allocate(bm, 100, 3), KVP_OK);
    cr_assert_eq(kvp_bm_append_ref(bm, &r[0], 1, &slot_ref), KVP_OK);
    kvp_bm_table_view t;
    cr_assert_eq(kvp_bm_table(bm, 100, &t), KVP_OK);
    cr_assert_eq(t.num_tokens, 4);
    cr_assert_eq(slot_ref, t.blocks[0] * 4 + 3);
    /* swapped out: KVP_ESTATE through the reference as by id */
    int64_t sw = 102;
    cr_assert_eq(kvp_bm_swap_out(bm, &sw, 1), KVP_OK);
    snap_take(bm, &a);
    cr_assert_eq(kvp_bm_append_ref(bm, &r[2], 1, &slot_ref), KVP_ESTATE);
    snap_take(bm, &b);
    cr_assert(snap_equal(&a, &b));
    cr_assert_eq(kvp_bm_swap_in(bm, &sw, 1), KVP_OK);
    kvp_bm_step_ops_clear(bm);
    /* many new sequences grow the manager's arrays; copy-on-write after a fork; k > 1 */
    for (int64_t id = 200; id < 240; id++) cr_assert_eq(kvp_bm_allocate(bm, id, 0), KVP_OK);
    cr_assert_eq(kvp_bm_fork(bm, 103, 300), KVP_OK); /* 103 holds 3 tokens: its block is shared now */
    int32_t slots[6];
    cr_assert_eq(kvp_bm_append_ref(bm, &r[3], 6, slots), KVP_OK);
    kvp_bm_step_ops ops;
    kvp_bm_step_ops_get(bm, &ops);
    cr_assert_eq(ops.n_copies, 1, "copy-on-write through the reference");
    cr_assert_eq(kvp_bm_table(bm, 103, &t), KVP_OK);
    cr_assert_eq(t.num_tokens, 9);
    for (int j = 0; j < 6; j++) cr_assert_eq(slots[j], t.blocks[(3 + j) / 4] * 4 + (3 + j) % 4);
    /* the same operations by id on a twin give the same accounting */
    cr_assert_eq(kvp_bm_append(bm, 104, 1, &slot_id), KVP_OK);
    cr_assert_eq(kvp_bm_table(bm, 104, &t), KVP_OK);
    cr_assert_eq(slot_id, t.blocks[1] * 4);
    snap_free(&a);
    snap_free(&b);
    CHECK(bm);
    kvp_bm_destroy(bm);
}
