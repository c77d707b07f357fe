#include <criterion/criterion.h>

#include "blockmgr/block_pool.h"
#include "blockmgr/block_pool_internal.h"
#include "common/alloc.h"

static int32_t free_list(const kvp_block_pool *p, int32_t *out, int32_t max) { return kvp_pool_free_list(p, out, max); }

Test(block_pool, create_rejects_bad_sizes)
{
    kvp_block_pool *p = (kvp_block_pool *)0x1;
    cr_assert_eq(kvp_pool_create(0, 16, &p), KVP_EINVAL);
    cr_assert_eq(kvp_pool_create(-3, 16, &p), KVP_EINVAL);
    cr_assert_eq(kvp_pool_create(8, 0, &p), KVP_EINVAL);
    cr_assert_eq(kvp_pool_create(8, -16, &p), KVP_EINVAL);
    cr_assert_eq(p, (kvp_block_pool *)0x1, "out must be untouched on failure");
    kvp_pool_destroy(NULL);
}

Test(block_pool, every_block_size_works)
{
    for (int32_t bs = 1; bs <= 256; bs++) {
        kvp_block_pool *p;
        cr_assert_eq(kvp_pool_create(5, bs, &p), KVP_OK, "bs %d", bs);
        cr_assert_eq(kvp_pool_block_size(p), bs);
        cr_assert_eq(kvp_pool_num_blocks(p), 5);
        cr_assert_eq(kvp_pool_num_free(p), 5);
        cr_assert_eq(kvp_pool_check(p), KVP_OK);
        kvp_pool_destroy(p);
    }
}

Test(block_pool, alloc_is_all_or_nothing_and_fifo)
{
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(8, 16, &p), KVP_OK);
    int32_t ids[8] = {-5, -5, -5, -5, -5, -5, -5, -5};
    cr_assert_eq(kvp_pool_alloc(p, 3, ids), KVP_OK);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ids[i], i);
        cr_assert_eq(kvp_pool_refcount(p, i), 1);
    }
    cr_assert_eq(kvp_pool_num_free(p), 5);
    int32_t more[8] = {-5, -5, -5, -5, -5, -5, -5, -5};
    cr_assert_eq(kvp_pool_alloc(p, 6, more), KVP_ENOBLOCKS);
    cr_assert_eq(more[0], -5, "ids_out untouched on failure");
    cr_assert_eq(kvp_pool_num_free(p), 5);
    cr_assert_eq(kvp_pool_alloc(p, -1, more), KVP_EINVAL);
    cr_assert_eq(kvp_pool_alloc(p, 0, NULL), KVP_OK);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    /* released blocks go to the tail, in release order */
    cr_assert_eq(kvp_pool_decref(p, 1), KVP_OK);
    cr_assert_eq(kvp_pool_decref(p, 0), KVP_OK);
    int32_t fl[8];
    cr_assert_eq(free_list(p, fl, 8), 7);
    int32_t want[7] = {3, 4, 5, 6, 7, 1, 0};
    for (int i = 0; i < 7; i++) cr_assert_eq(fl[i], want[i], "free list position %d", i);
    cr_assert_eq(kvp_pool_alloc(p, 7, more), KVP_OK);
    for (int i = 0; i < 7; i++) cr_assert_eq(more[i], want[i]);
    cr_assert_eq(kvp_pool_num_free(p), 0);
    cr_assert_eq(kvp_pool_alloc(p, 1, more), KVP_ENOBLOCKS);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    kvp_pool_destroy(p);
}

Test(block_pool, refcounts_and_double_free)
{
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(4, 8, &p), KVP_OK);
    int32_t id;
    cr_assert_eq(kvp_pool_alloc(p, 1, &id), KVP_OK);
    cr_assert_eq(kvp_pool_incref(p, id), KVP_OK);
    cr_assert_eq(kvp_pool_refcount(p, id), 2);
    cr_assert_eq(kvp_pool_decref(p, id), KVP_OK);
    cr_assert_eq(kvp_pool_num_free(p), 3);
    cr_assert_eq(kvp_pool_decref(p, id), KVP_OK);
    cr_assert_eq(kvp_pool_num_free(p), 4);
    cr_assert_eq(kvp_pool_decref(p, id), KVP_ESTATE, "double free");
    cr_assert_eq(kvp_pool_incref(p, id), KVP_ESTATE, "incref of a free block");
    cr_assert_eq(kvp_pool_incref(p, 4), KVP_EINVAL);
    cr_assert_eq(kvp_pool_decref(p, -1), KVP_EINVAL);
    cr_assert_eq(kvp_pool_refcount(p, 99), -1);
    cr_assert_eq(kvp_pool_num_free(p), 4);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    kvp_pool_destroy(p);
}

Test(block_pool, take_from_the_middle)
{
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(6, 4, &p), KVP_OK);
    cr_assert_eq(kvp_pool_take(p, 3), KVP_OK);
    cr_assert_eq(kvp_pool_refcount(p, 3), 1);
    cr_assert_eq(kvp_pool_take(p, 3), KVP_ESTATE);
    cr_assert_eq(kvp_pool_take(p, 0), KVP_OK); /* head */
    cr_assert_eq(kvp_pool_take(p, 5), KVP_OK); /* tail */
    cr_assert_eq(kvp_pool_take(p, 6), KVP_EINVAL);
    int32_t fl[6];
    cr_assert_eq(free_list(p, fl, 6), 3);
    cr_assert_eq(fl[0], 1);
    cr_assert_eq(fl[1], 2);
    cr_assert_eq(fl[2], 4);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    int32_t ids[3];
    cr_assert_eq(kvp_pool_alloc(p, 3, ids), KVP_OK);
    cr_assert_eq(ids[2], 4);
    cr_assert_eq(kvp_pool_take(p, 2), KVP_ESTATE);
    kvp_pool_destroy(p);
}

Test(block_pool, release_is_all_or_nothing)
{
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(4, 4, &p), KVP_OK);
    int32_t ids[2];
    cr_assert_eq(kvp_pool_alloc(p, 2, ids), KVP_OK);
    int32_t bad[3] = {ids[0], ids[1], ids[1]}; /* ids[1] released twice: refcount 1 */
    cr_assert_eq(kvp_pool_release(p, bad, 3), KVP_ESTATE);
    cr_assert_eq(kvp_pool_refcount(p, ids[0]), 1);
    cr_assert_eq(kvp_pool_refcount(p, ids[1]), 1);
    int32_t bad2[2] = {ids[0], 17};
    cr_assert_eq(kvp_pool_release(p, bad2, 2), KVP_EINVAL);
    cr_assert_eq(kvp_pool_refcount(p, ids[0]), 1);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    cr_assert_eq(kvp_pool_release(p, ids, 2), KVP_OK);
    cr_assert_eq(kvp_pool_num_free(p), 4);
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    kvp_pool_destroy(p);
}

Test(block_pool, walker_detects_corruption)
{
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(5, 4, &p), KVP_OK);
    int32_t id;
    cr_assert_eq(kvp_pool_alloc(p, 1, &id), KVP_OK);
    p->refcnt[id] = 0; /* held block claims to be free, but is not on the list */
    cr_assert_eq(kvp_pool_check(p), KVP_ESTATE);
    p->refcnt[id] = 1;
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    int32_t saved = p->next[2];
    p->next[2] = 2; /* a cycle */
    cr_assert_eq(kvp_pool_check(p), KVP_ESTATE);
    p->next[2] = saved;
    p->num_free++;
    cr_assert_eq(kvp_pool_check(p), KVP_ESTATE);
    p->num_free--;
    cr_assert_eq(kvp_pool_check(p), KVP_OK);
    kvp_pool_destroy(p);
}

Test(block_pool, create_survives_every_allocation_failure)
{
    for (int64_t n = 1;; n++) {
        kvp_block_pool *p = NULL;
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_pool_create(100, 16, &p);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (made < n) {
            cr_assert_eq(st, KVP_OK);
            kvp_pool_destroy(p);
            cr_assert_geq(n, 2, "create makes at least one allocation");
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM, "failing allocation %lld", (long long)n);
        cr_assert_null(p);
    }
}

Test(block_pool, random_against_model)
{
    uint64_t seed = 12345;
    enum { NB = 50 };
    kvp_block_pool *p;
    cr_assert_eq(kvp_pool_create(NB, 16, &p), KVP_OK);
    int32_t model[NB] = {0};
    for (int it = 0; it < 20000; it++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(seed >> 33);
        int32_t id = (int32_t)(r % NB);
        int op = (int)((r >> 8) % 4);
        int nfree = 0;
        for (int b = 0; b < NB; b++) nfree += model[b] == 0;
        kvp_status st;
        if (op == 0) {
            int32_t n = (int32_t)((r >> 12) % 5), ids[5];
            st = kvp_pool_alloc(p, n, ids);
            cr_assert_eq(st, n <= nfree ? KVP_OK : KVP_ENOBLOCKS, "it %d", it);
            if (st == KVP_OK)
                for (int i = 0; i < n; i++) {
                    cr_assert_eq(model[ids[i]], 0, "it %d: allocated a held block", it);
                    model[ids[i]] = 1;
                }
        } else if (op == 1) {
            st = kvp_pool_incref(p, id);
            cr_assert_eq(st, model[id] ? KVP_OK : KVP_ESTATE);
            if (st == KVP_OK) model[id]++;
        } else if (op == 2) {
            st = kvp_pool_decref(p, id);
            cr_assert_eq(st, model[id] ? KVP_OK : KVP_ESTATE);
            if (st == KVP_OK) model[id]--;
        } else {
            st = kvp_pool_take(p, id);
            cr_assert_eq(st, model[id] ? KVP_ESTATE : KVP_OK);
            if (st == KVP_OK) model[id] = 1;
        }
        for (int b = 0; b < NB; b++) cr_assert_eq(kvp_pool_refcount(p, b), model[b], "it %d block %d", it, b);
        cr_assert_eq(kvp_pool_check(p), KVP_OK, "it %d: %s", it, kvp_error_detail());
    }
    kvp_pool_destroy(p);
}
