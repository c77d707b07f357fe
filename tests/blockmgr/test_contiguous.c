#include <criterion/criterion.h>
#include <stdlib.h>

#include "blockmgr/contiguous.h"
#include "bm_testutil.h"
#include "common/alloc.h"

#define CCHECK(c) cr_assert_eq(kvp_contig_check(c), KVP_OK, "walker: %s", kvp_error_detail())

static kvp_contig *mk(int64_t cap)
{
    kvp_contig *c = NULL;
    cr_assert_eq(kvp_contig_create(cap, &c), KVP_OK);
    return c;
}

static int64_t off_of(kvp_contig *c, int64_t id)
{
    int64_t off;
    cr_assert_eq(kvp_contig_get(c, id, &off, NULL, NULL), KVP_OK);
    return off;
}

static kvp_kv_accounting acc(kvp_contig *c, int64_t pending)
{
    kvp_kv_accounting a;
    kvp_contig_account(c, pending, &a);
    cr_assert_eq(kvp_kv_accounting_residual(&a), 0, "identity");
    return a;
}

Test(contiguous, reserve_length_per_policy)
{
    int64_t r;
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 2048, 100, &r), KVP_OK);
    cr_assert_eq(r, 2048);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 100, &r), KVP_OK);
    cr_assert_eq(r, 128);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 128, &r), KVP_OK);
    cr_assert_eq(r, 128);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 129, &r), KVP_OK);
    cr_assert_eq(r, 256);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2000, 1500, &r), KVP_OK);
    cr_assert_eq(r, 2000, "capped at max_model_len");
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 1, &r), KVP_OK);
    cr_assert_eq(r, 1);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 2048, 777, &r), KVP_OK);
    cr_assert_eq(r, 777);
    r = -9;
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 2048, 0, &r), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 2048, 2049, &r), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 0, 1, &r), KVP_EINVAL);
    cr_assert_eq(r, -9);
    kvp_contig_policy p;
    cr_assert_eq(kvp_contig_policy_parse("pow2", &p), KVP_OK);
    cr_assert_eq(p, KVP_CONTIG_POW2);
    cr_assert_str_eq(kvp_contig_policy_name(KVP_CONTIG_ORACLE), "oracle");
    cr_assert_eq(kvp_contig_policy_parse("best", &p), KVP_EINVAL);
    cr_assert_eq(kvp_contig_policy_parse(NULL, &p), KVP_EINVAL);
}

/* Orca-Max: every request reserves max_model_len = 300 in an arena of 1000 slots. */
Test(contiguous, orca_max_hand_case)
{
    kvp_contig *c = mk(1000);
    int64_t finals[3] = {100, 50, 250};
    for (int i = 0; i < 3; i++) {
        int64_t len, off;
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 300, finals[i], &len), KVP_OK);
        cr_assert_eq(kvp_contig_reserve(c, i, len, finals[i], &off), KVP_OK);
        cr_assert_eq(off, 300 * i);
    }
    cr_assert_not(kvp_contig_can_reserve(c, 300));
    cr_assert_eq(kvp_contig_reserve(c, 3, 300, 10, NULL), KVP_ENOBLOCKS);
    cr_assert_eq(kvp_contig_grow(c, 0, 60), KVP_OK); /* the prompt of request 0 */
    kvp_kv_accounting a = acc(c, 300);
    cr_assert_eq(a.capacity, 1000);
    cr_assert_eq(a.token_states, 60);
    cr_assert_eq(a.reserved, 40 + 50 + 250);
    cr_assert_eq(a.internal_frag, 200 + 250 + 50);
    cr_assert_eq(a.external_frag, 100, "the 100-slot tail cannot hold a 300-slot request");
    cr_assert_eq(a.free, 0);
    cr_assert_eq(a.num_seqs, 3);
    a = acc(c, 0);
    cr_assert_eq(a.external_frag, 0);
    cr_assert_eq(a.free, 100);
    CCHECK(c);
    kvp_contig_destroy(c);
}

/* Orca-Pow2 with external fragmentation: two 16-slot holes cannot take a 32-slot request. */
Test(contiguous, orca_pow2_external_fragmentation)
{
    kvp_contig *c = mk(64);
    int64_t finals[3] = {10, 20, 9}, len;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 64, finals[i], &len), KVP_OK);
        cr_assert_eq(kvp_contig_reserve(c, 10 + i, len, finals[i], NULL), KVP_OK);
        cr_assert_eq(kvp_contig_grow(c, 10 + i, finals[i]), KVP_OK);
    }
    cr_assert_eq(off_of(c, 11), 16);
    cr_assert_eq(off_of(c, 12), 48);
    kvp_kv_accounting a = acc(c, 0);
    cr_assert_eq(a.token_states, 39);
    cr_assert_eq(a.reserved, 0);
    cr_assert_eq(a.internal_frag, 6 + 12 + 7);
    cr_assert_eq(a.free, 0);
    cr_assert_eq(kvp_contig_free(c, 10), KVP_OK);
    cr_assert_eq(kvp_contig_free(c, 12), KVP_OK);
    cr_assert_eq(kvp_contig_num_holes(c), 2);
    cr_assert_eq(kvp_contig_largest_hole(c), 16);
    cr_assert_not(kvp_contig_can_reserve(c, 32));
    cr_assert_eq(kvp_contig_reserve(c, 20, 32, 30, NULL), KVP_ENOBLOCKS);
    a = acc(c, 32);
    cr_assert_eq(a.external_frag, 32);
    cr_assert_eq(a.free, 0);
    a = acc(c, 16);
    cr_assert_eq(a.external_frag, 0);
    cr_assert_eq(a.free, 32);
    CCHECK(c);
    cr_assert_eq(kvp_contig_free(c, 11), KVP_OK); /* merges with both neighbours */
    cr_assert_eq(kvp_contig_num_holes(c), 1);
    cr_assert_eq(kvp_contig_largest_hole(c), 64);
    CCHECK(c);
    kvp_contig_destroy(c);
}

/* Orca-Oracle: exact reservations leave neither reserved nor internal fragmentation once complete. */
Test(contiguous, orca_oracle_exact)
{
    kvp_contig *c = mk(100);
    int64_t finals[3] = {30, 30, 40};
    for (int i = 0; i < 3; i++) {
        int64_t len;
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 100, finals[i], &len), KVP_OK);
        cr_assert_eq(kvp_contig_reserve(c, i, len, finals[i], NULL), KVP_OK);
        cr_assert_eq(kvp_contig_grow(c, i, 10), KVP_OK);
    }
    kvp_kv_accounting a = acc(c, 0);
    cr_assert_eq(a.token_states, 30);
    cr_assert_eq(a.reserved, 70);
    cr_assert_eq(a.internal_frag, 0);
    for (int i = 0; i < 3; i++) cr_assert_eq(kvp_contig_grow(c, i, finals[i] - 10), KVP_OK);
    a = acc(c, 0);
    cr_assert_eq(a.token_states, 100);
    cr_assert_eq(a.reserved, 0);
    cr_assert_eq(a.internal_frag, 0);
    cr_assert_eq(a.free, 0);
    cr_assert_eq(kvp_contig_grow(c, 0, 1), KVP_EINVAL, "cannot outgrow the reservation");
    CCHECK(c);
    kvp_contig_destroy(c);
}

Test(contiguous, first_fit_not_best_fit)
{
    kvp_contig *c = mk(100);
    int64_t lens[4] = {10, 10, 30, 10};
    for (int i = 0; i < 4; i++) cr_assert_eq(kvp_contig_reserve(c, i, lens[i], 0, NULL), KVP_OK);
    cr_assert_eq(kvp_contig_free(c, 0), KVP_OK);
    cr_assert_eq(kvp_contig_free(c, 2), KVP_OK); /* holes [0,10) [20,50) [60,100) */
    cr_assert_eq(kvp_contig_num_holes(c), 3);
    int64_t off;
    cr_assert_eq(kvp_contig_reserve(c, 7, 25, 0, &off), KVP_OK);
    cr_assert_eq(off, 20, "first hole that fits, although [60,100) fits too");
    cr_assert_eq(kvp_contig_reserve(c, 8, 8, 0, &off), KVP_OK);
    cr_assert_eq(off, 0);
    cr_assert_eq(kvp_contig_reserve(c, 9, 40, 0, &off), KVP_OK);
    cr_assert_eq(off, 60);
    /* unknown final length: the whole unfilled reservation is "reserved" */
    kvp_kv_accounting a = acc(c, 0);
    cr_assert_eq(a.internal_frag, 0);
    cr_assert_eq(a.reserved, 10 + 10 + 25 + 8 + 40);
    cr_assert_eq(a.free, 100 - 93);
    CCHECK(c);
    kvp_contig_destroy(c);
}

Test(contiguous, bad_input_changes_nothing)
{
    kvp_contig *c = NULL;
    cr_assert_eq(kvp_contig_create(0, &c), KVP_EINVAL);
    cr_assert_eq(kvp_contig_create(-5, &c), KVP_EINVAL);
    cr_assert_null(c);
    c = mk(50);
    cr_assert_eq(kvp_contig_reserve(c, 1, 20, 15, NULL), KVP_OK);
    cr_assert_eq(kvp_contig_grow(c, 1, 5), KVP_OK);
    kvp_kv_accounting a0 = acc(c, 10);
    cr_assert_eq(kvp_contig_reserve(c, 1, 5, 0, NULL), KVP_ESTATE);
    cr_assert_eq(kvp_contig_reserve(c, 2, 0, 0, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve(c, 2, 31, 0, NULL), KVP_ENOBLOCKS);
    cr_assert_eq(kvp_contig_grow(c, 1, -1), KVP_EINVAL);
    cr_assert_eq(kvp_contig_grow(c, 1, 16), KVP_EINVAL);
    cr_assert_eq(kvp_contig_grow(c, 3, 1), KVP_ENOTFOUND);
    cr_assert_eq(kvp_contig_free(c, 3), KVP_ENOTFOUND);
    cr_assert_eq(kvp_contig_get(c, 3, NULL, NULL, NULL), KVP_ENOTFOUND);
    kvp_kv_accounting a1 = acc(c, 10);
    cr_assert_eq(memcmp(&a0, &a1, sizeof a0), 0, "failed calls changed the accounting");
    cr_assert_eq(kvp_contig_num_reqs(c), 1);
    cr_assert_eq(kvp_contig_num_holes(c), 1);
    CCHECK(c);
    cr_assert_eq(kvp_contig_free(c, 1), KVP_OK);
    cr_assert_eq(kvp_contig_free(c, 1), KVP_ENOTFOUND, "double free");
    cr_assert_eq(kvp_contig_largest_hole(c), 50);
    CCHECK(c);
    kvp_contig_destroy(c);
    kvp_contig_destroy(NULL);
}

Test(contiguous, allocation_failures_change_nothing)
{
    int total_failures = 0;
    for (int pre = 0; pre < 40; pre++) {
        kvp_contig *c = mk(10000);
        for (int i = 0; i < pre; i++) cr_assert_eq(kvp_contig_reserve(c, 100 + i, 7, 0, NULL), KVP_OK);
        /* a hole in the middle when there is room for one; the arrays are still at their growth points */
        if (pre >= 3 && pre % 2) cr_assert_eq(kvp_contig_free(c, 101), KVP_OK);
        for (int64_t n = 1;; n++) {
            int32_t nr = kvp_contig_num_reqs(c), nh = kvp_contig_num_holes(c);
            kvp_kv_accounting a0 = acc(c, 5);
            kvp_alloc_fail_at(n);
            kvp_status st = kvp_contig_reserve(c, 1, 9, 0, NULL);
            int64_t made = kvp_alloc_count();
            kvp_alloc_fail_at(0);
            if (made < n) {
                cr_assert_eq(st, KVP_OK);
                break;
            }
            cr_assert_eq(st, KVP_ENOMEM);
            total_failures++;
            kvp_kv_accounting a1 = acc(c, 5);
            cr_assert_eq(memcmp(&a0, &a1, sizeof a0), 0);
            cr_assert_eq(kvp_contig_num_reqs(c), nr);
            cr_assert_eq(kvp_contig_num_holes(c), nh);
            CCHECK(c);
        }
        CCHECK(c);
        kvp_contig_destroy(c);
    }
    cr_assert_geq(total_failures, 3, "the growth points of the id map and arrays were not reached");
}

/* Random reserve/grow/free against a slot-by-slot model of the arena (owner per slot, first fit by scan). */
Test(contiguous, random_against_model)
{
    enum { CAP = 400, MAXR = 64 };
    uint64_t seed = 0xC0471Full;
    kvp_contig *c = mk(CAP);
    int64_t owner[CAP];
    for (int i = 0; i < CAP; i++) owner[i] = -1;
    int64_t ids[MAXR], used[MAXR], len[MAXR];
    int nr = 0;
    int64_t next = 1;
    for (int it = 0; it < 30000; it++) {
        int r = rng_int(&seed, 0, 9);
        if (r < 4 && nr < MAXR) {
            int64_t l = rng_int(&seed, 1, 60), want = -1;
            for (int s = 0, run = 0; s < CAP; s++) { /* model first fit */
                run = owner[s] < 0 ? run + 1 : 0;
                if (run == l) {
                    want = s - l + 1;
                    break;
                }
            }
            int64_t off = -1;
            kvp_status st = kvp_contig_reserve(c, next, l, rng_int(&seed, 0, 60), &off);
            if (want < 0) {
                cr_assert_eq(st, KVP_ENOBLOCKS, "it %d", it);
            } else {
                cr_assert_eq(st, KVP_OK, "it %d", it);
                cr_assert_eq(off, want, "it %d: first fit at %lld, model %lld", it, (long long)off, (long long)want);
                for (int64_t s = off; s < off + l; s++) owner[s] = next;
                ids[nr] = next;
                used[nr] = 0;
                len[nr] = l;
                nr++;
            }
            next++;
        } else if (r < 7 && nr) {
            int i = rng_int(&seed, 0, nr - 1);
            int64_t g = rng_int(&seed, 0, 10);
            kvp_status st = kvp_contig_grow(c, ids[i], g);
            cr_assert_eq(st, used[i] + g <= len[i] ? KVP_OK : KVP_EINVAL, "it %d", it);
            if (st == KVP_OK) used[i] += g;
        } else if (nr) {
            int i = rng_int(&seed, 0, nr - 1);
            cr_assert_eq(kvp_contig_free(c, ids[i]), KVP_OK);
            for (int s = 0; s < CAP; s++)
                if (owner[s] == ids[i]) owner[s] = -1;
            nr--;
            ids[i] = ids[nr];
            used[i] = used[nr];
            len[i] = len[nr];
        }
        CCHECK(c);
        int64_t tok = 0, freeslots = 0;
        for (int i = 0; i < nr; i++) tok += used[i];
        for (int s = 0; s < CAP; s++) freeslots += owner[s] < 0;
        kvp_kv_accounting a = acc(c, 0);
        cr_assert_eq(a.token_states, tok, "it %d", it);
        cr_assert_eq(a.free, freeslots, "it %d", it);
        cr_assert_eq(a.num_seqs, nr);
    }
    kvp_contig_destroy(c);
}
