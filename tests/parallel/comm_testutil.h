/* tests/parallel/comm_testutil.h — running rank threads in the communicator tests: each rank runs a
 * function on its own thread and keeps its status and message (no Criterion assert off the main thread). */
#ifndef KVP_TESTS_COMM_TESTUTIL_H
#define KVP_TESTS_COMM_TESTUTIL_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "fake_nccl.h"
#include "parallel/comm.h"
#include "parallel/comm_check.h"
#include "parallel/nccl_api.h"

typedef struct tu_rank tu_rank;
struct tu_rank {
    int rank;
    kvp_comm *c;     /* the rank's communicator (fn may create or replace it) */
    kvp_comm *host;  /* a host plane to bootstrap from, when the test has one */
    void *arg;       /* the test's */
    kvp_status (*fn)(tu_rank *);
    kvp_status st;
    char err[600];
    kvp_comm_check_report rep;
};

static void *tu_rank_main(void *p)
{
    tu_rank *r = p;
    r->st = r->fn(r);
    if (r->st != KVP_OK) snprintf(r->err, sizeof r->err, "%s", kvp_error_message());
    return NULL;
}

/* Runs fn on n rank threads (ranks[r].c and .host as the caller set them) and waits for all. */
static inline void tu_run_ranks(tu_rank *ranks, int n, kvp_status (*fn)(tu_rank *))
{
    pthread_t tid[KVP_COMM_MAX_THREADS];
    for (int r = 0; r < n; r++) {
        ranks[r].rank = r;
        ranks[r].fn = fn;
        ranks[r].st = KVP_OK;
        ranks[r].err[0] = '\0';
        cr_assert_eq(pthread_create(&tid[r], NULL, tu_rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(tid[r], NULL);
}

/* The contract on one rank. */
static inline kvp_status tu_contract(tu_rank *r) { return kvp_comm_check_contract(r->c, &r->rep); }

/* Every rank passed the contract, with a plausible number of checks. */
static inline void tu_assert_contract(const tu_rank *ranks, int n, const char *what)
{
    for (int r = 0; r < n; r++) {
        cr_assert_eq(ranks[r].st, KVP_OK, "%s rank %d: %s", what, r, ranks[r].err);
        cr_assert_eq(ranks[r].rep.failures, 0, "%s rank %d: %s", what, r, ranks[r].rep.first);
        cr_assert_gt(ranks[r].rep.checks, 100, "%s rank %d made only %d checks", what, r, ranks[r].rep.checks);
    }
}

/* nccl communicators created from now on run on a fresh fake NCCL with `devices` GPUs. */
static inline void tu_fake_on(int devices)
{
    fake_nccl_reset(devices);
    kvp_nccl_api_set(fake_nccl_api());
}

/* After every nccl communicator is destroyed, the fake holds nothing and saw no misuse; back to the linked
 * library. */
static inline void tu_fake_off(void)
{
    cr_assert_eq(fake_nccl_live_allocs(), 0, "device allocations left: %lld", (long long)fake_nccl_live_allocs());
    cr_assert_eq(fake_nccl_live_comms(), 0, "NCCL communicators left: %d", fake_nccl_live_comms());
    cr_assert_eq(fake_nccl_misuses(), 0, "misuse: %s", fake_nccl_last_misuse());
    kvp_nccl_api_set(NULL);
    fake_nccl_reset(0);
}

#endif
