#include <criterion/criterion.h>
#include <stdlib.h>

#include "blockmgr/contiguous.h"
#include "bm_testutil.h"
#include "common/alloc.h"

#define CCHECK(c) cr_assert_eq(kvp_contig_check(c), KVP_OK, "walker: %s", kvp_error_detail())

static kvp_contig *mkp(int64_t cap, kvp_contig_placement pl)
{
    kvp_contig *c = NULL;
    cr_assert_eq(kvp_contig_create(cap, pl, &c), KVP_OK);
    return c;
}

static kvp_contig *mk(int64_t cap) { return mkp(cap, KVP_CONTIG_FIRST_FIT); }

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
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 2048, 60, 40, &r), KVP_OK);
    cr_assert_eq(r, 2048);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 100, 25, &r), KVP_OK);
    cr_assert_eq(r, 100 + 32, "the paper: 25 output tokens reserve 32");
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 0, 128, &r), KVP_OK);
    cr_assert_eq(r, 128);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 7, 129, &r), KVP_OK);
    cr_assert_eq(r, 7 + 256);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2000, 500, 1500, &r), KVP_OK);
    cr_assert_eq(r, 2000, "capped at max_model_len");
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 2048, 0, 1, &r), KVP_OK);
    cr_assert_eq(r, 1);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 2048, 700, 77, &r), KVP_OK);
    cr_assert_eq(r, 777);
    r = -9;
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 2048, 10, 0, &r), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 2048, -1, 5, &r), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 2048, 2000, 49, &r), KVP_EINVAL);
    cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 0, 0, 1, &r), KVP_EINVAL);
    cr_assert_eq(r, -9);
    kvp_contig_policy p;
    cr_assert_eq(kvp_contig_policy_parse("pow2", &p), KVP_OK);
    cr_assert_eq(p, KVP_CONTIG_POW2);
    cr_assert_str_eq(kvp_contig_policy_name(KVP_CONTIG_ORACLE), "oracle");
    cr_assert_eq(kvp_contig_policy_parse("best", &p), KVP_EINVAL);
    cr_assert_eq(kvp_contig_policy_parse(NULL, &p), KVP_EINVAL);
    kvp_contig_placement pl;
    cr_assert_eq(kvp_contig_placement_parse("buddy", &pl), KVP_OK);
    cr_assert_eq(pl, KVP_CONTIG_BUDDY);
    cr_assert_eq(kvp_contig_placement_parse("first-fit", &pl), KVP_OK);
    cr_assert_eq(pl, KVP_CONTIG_FIRST_FIT);
    cr_assert_str_eq(kvp_contig_placement_name(KVP_CONTIG_BUDDY), "buddy");
    cr_assert_eq(kvp_contig_placement_parse("best-fit", &pl), KVP_EINVAL);
}

/* Orca-Max: every request reserves max_model_len = 300 in an arena of 1000 slots. */
Test(contiguous, orca_max_hand_case)
{
    kvp_contig *c = mk(1000);
    int64_t finals[3] = {100, 50, 250};
    for (int i = 0; i < 3; i++) {
        int64_t len, off;
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_MAX, 300, 0, finals[i], &len), KVP_OK);
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
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_POW2, 64, 0, finals[i], &len), KVP_OK);
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
        cr_assert_eq(kvp_contig_reserve_len(KVP_CONTIG_ORACLE, 100, 0, finals[i], &len), KVP_OK);
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
    cr_assert_eq(kvp_contig_create(0, KVP_CONTIG_FIRST_FIT, &c), KVP_EINVAL);
    cr_assert_eq(kvp_contig_create(-5, KVP_CONTIG_BUDDY, &c), KVP_EINVAL);
    cr_assert_eq(kvp_contig_create(5, (kvp_contig_placement)7, &c), KVP_EINVAL);
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
    for (int pre = 0; pre < 80; pre++) {
        kvp_contig *c = mkp(10000, pre % 4 < 2 ? KVP_CONTIG_FIRST_FIT : KVP_CONTIG_BUDDY);
        for (int i = 0; i < pre; i++) cr_assert_eq(kvp_contig_reserve(c, 100 + i, 7, 0, NULL), KVP_OK);
        /* a hole in the middle when there is room for one; the arrays are still at their growth points */
        if (pre >= 3 && pre % 2) cr_assert_eq(kvp_contig_free(c, 101), KVP_OK);
        if (pre >= 3 && pre % 2) cr_assert_eq(kvp_contig_free(c, 102), KVP_OK);
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

/* The random tests' grow or free step: request i (random) grows by 0..10 tokens (refused past its
 * reservation) or is freed, in the arena and in the slot model (owner per slot; ids/used/len per request). */
static void grow_or_free(kvp_contig *c, uint64_t *seed, bool grow, int it, int64_t *owner, int cap, int64_t *ids,
                         int64_t *used, int64_t *len, int *nr)
{
    int i = rng_int(seed, 0, *nr - 1);
    if (grow) {
        int64_t g = rng_int(seed, 0, 10);
        kvp_status st = kvp_contig_grow(c, ids[i], g);
        cr_assert_eq(st, used[i] + g <= len[i] ? KVP_OK : KVP_EINVAL, "it %d", it);
        if (st == KVP_OK) used[i] += g;
        return;
    }
    cr_assert_eq(kvp_contig_free(c, ids[i]), KVP_OK);
    for (int s = 0; s < cap; s++)
        if (owner[s] == ids[i]) owner[s] = -1;
    (*nr)--;
    ids[i] = ids[*nr];
    used[i] = used[*nr];
    len[i] = len[*nr];
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
        } else if (nr) {
            grow_or_free(c, &seed, r < 7, it, owner, CAP, ids, used, len, &nr);
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

/* Buddy placement by hand: capacity 100 = top-level blocks [0,64) [64,96) [96,100). */
Test(contiguous, buddy_hand_case)
{
    kvp_contig *c = mkp(100, KVP_CONTIG_BUDDY);
    cr_assert_eq(kvp_contig_max_reserve(c), 64);
    cr_assert_eq(kvp_contig_num_holes(c), 3);
    CCHECK(c);
    int64_t lens[4] = {20, 30, 3, 17}, want[4] = {64, 0, 96, 32}, off;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(kvp_contig_reserve(c, i, lens[i], lens[i], &off), KVP_OK);
        cr_assert_eq(off, want[i], "request %d: the smallest free block that fits, split in halves", i);
        CCHECK(c);
    }
    cr_assert_eq(kvp_contig_num_holes(c), 0);
    cr_assert_eq(kvp_contig_taken(c), 100);
    kvp_kv_accounting a = acc(c, 0);
    cr_assert_eq(a.reserved, 70);
    cr_assert_eq(a.internal_frag, 0);
    cr_assert_eq(a.external_frag, 12 + 2 + 1 + 15, "the rounding of each run to its block");
    cr_assert_eq(a.free, 0);
    cr_assert_not(kvp_contig_can_reserve(c, 1));
    cr_assert_eq(kvp_contig_reserve(c, 9, 65, 0, NULL), KVP_EINVAL, "above the largest top-level block");
    cr_assert_eq(kvp_contig_reserve(c, 9, 1, 0, NULL), KVP_ENOBLOCKS);
    cr_assert_eq(kvp_contig_free(c, 1), KVP_OK); /* [0,32) free, its buddy [32,64) taken */
    cr_assert_eq(kvp_contig_largest_hole(c), 32);
    a = acc(c, 40); /* a 40-slot request needs a 64-slot block: the free 32 are external fragmentation */
    cr_assert_eq(a.external_frag, 32 + 12 + 1 + 15);
    cr_assert_eq(a.free, 0);
    CCHECK(c);
    cr_assert_eq(kvp_contig_free(c, 3), KVP_OK); /* merges with [0,32) into [0,64) */
    cr_assert_eq(kvp_contig_num_holes(c), 1);
    cr_assert_eq(kvp_contig_largest_hole(c), 64);
    a = acc(c, 40);
    cr_assert_eq(a.external_frag, 12 + 1);
    cr_assert_eq(a.free, 64);
    CCHECK(c);
    cr_assert_eq(kvp_contig_free(c, 0), KVP_OK);
    cr_assert_eq(kvp_contig_free(c, 2), KVP_OK);
    cr_assert_eq(kvp_contig_taken(c), 0);
    cr_assert_eq(kvp_contig_num_holes(c), 3, "top-level blocks never merge with each other");
    CCHECK(c);
    kvp_contig_destroy(c);
}

/* Random reserve/grow/free in a buddy arena against a slot model that knows nothing of free lists: a
 * reservation of l must succeed exactly when some run of pow2(l) free slots, aligned to its size, lies in
 * one top-level block, and must land on such a run. */
Test(contiguous, buddy_random_against_model)
{
    enum { CAP = 300, MAXR = 64 }; /* 256 + 32 + 8 + 4 */
    const int64_t top_off[4] = {0, 256, 288, 296}, top_len[4] = {256, 32, 8, 4};
    uint64_t seed = 0xB0DD1Eull;
    kvp_contig *c = mkp(CAP, KVP_CONTIG_BUDDY);
    int64_t owner[CAP];
    for (int i = 0; i < CAP; i++) owner[i] = -1;
    int64_t ids[MAXR], used[MAXR], len[MAXR];
    int nr = 0, placed = 0, refused = 0;
    int64_t next = 1;
    for (int it = 0; it < 20000; it++) {
        int r = rng_int(&seed, 0, 9);
        if (r < 4 && nr < MAXR) {
            int64_t l = rng_int(&seed, 1, 70), B = 1;
            while (B < l) B <<= 1;
            bool fits = false;
            for (int t = 0; t < 4 && !fits; t++)
                for (int64_t o = top_off[t]; o + B <= top_off[t] + top_len[t] && !fits; o += B) {
                    bool all = true;
                    for (int64_t s = o; s < o + B && all; s++) all = owner[s] < 0;
                    fits = all;
                }
            int64_t off = -1;
            kvp_status st = kvp_contig_reserve(c, next, l, rng_int(&seed, 0, 70), &off);
            if (B > 256) {
                cr_assert_eq(st, KVP_EINVAL, "it %d", it);
            } else if (!fits) {
                cr_assert_eq(st, KVP_ENOBLOCKS, "it %d: no aligned free run of %lld, yet placed", it, (long long)B);
                refused++;
            } else {
                cr_assert_eq(st, KVP_OK, "it %d: an aligned free run of %lld exists", it, (long long)B);
                cr_assert_eq(off % B, 0, "it %d: block at %lld not aligned to %lld", it, (long long)off, (long long)B);
                for (int64_t s = off; s < off + B; s++) {
                    cr_assert_lt(s, CAP);
                    cr_assert_eq(owner[s], -1, "it %d: slot %lld given twice", it, (long long)s);
                    owner[s] = next;
                }
                ids[nr] = next;
                used[nr] = 0;
                len[nr] = l;
                nr++;
                placed++;
            }
            next++;
        } else if (nr) {
            grow_or_free(c, &seed, r < 7, it, owner, CAP, ids, used, len, &nr);
        }
        CCHECK(c);
        int64_t tok = 0, lensum = 0, freeslots = 0;
        for (int i = 0; i < nr; i++) tok += used[i], lensum += len[i];
        for (int s = 0; s < CAP; s++) freeslots += owner[s] < 0;
        kvp_kv_accounting a = acc(c, 0);
        cr_assert_eq(a.token_states, tok, "it %d", it);
        cr_assert_eq(a.free, freeslots, "it %d", it);
        cr_assert_eq(a.external_frag, CAP - freeslots - lensum, "it %d: rounding", it);
        cr_assert_eq(a.num_seqs, nr);
    }
    cr_assert_gt(placed, 1000);
    cr_assert_gt(refused, 100, "the arena was never full enough to refuse");
    for (int i = 0; i < nr; i++) cr_assert_eq(kvp_contig_free(c, ids[i]), KVP_OK);
    cr_assert_eq(kvp_contig_taken(c), 0);
    cr_assert_eq(kvp_contig_num_holes(c), 4, "everything merged back into the top-level blocks");
    CCHECK(c);
    kvp_contig_destroy(c);
}
