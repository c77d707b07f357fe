/* The communicator contract (parallel/comm_check.h) over every backend that runs inside one process:
 * single, threads, and nccl on the fake NCCL (tests/parallel/fake_nccl.h) both ways: ncclCommInitAll
 * (one process, one thread per GPU) and the MPI bootstrap protocol over a threads host plane
 * (kvp_comm_nccl_create: rank 0's ncclGetUniqueId, broadcast, ncclCommInitRank on every rank). The mpi
 * backend runs the same contract under mpirun in test_comm_contract_mpi.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "comm_testutil.h"
#include "fake_nccl.h"
#include "parallel/nccl_api.h"

static tu_rank ranks[KVP_COMM_MAX_THREADS];

Test(comm_contract, single)
{
    cr_assert_eq(kvp_comm_single_create(&ranks[0].c), KVP_OK);
    tu_run_ranks(ranks, 1, tu_contract);
    tu_assert_contract(ranks, 1, "single");
    cr_assert_str_eq(kvp_comm_backend(ranks[0].c), "single");
    kvp_comm_destroy(ranks[0].c);
}

/* The CPU backends never call CUDA or NCCL: with the fake installed, its log stays empty. */
Test(comm_contract, threads_1_to_4_ranks_without_a_cuda_call)
{
    tu_fake_on(4);
    for (int n = 1; n <= 4; n++) {
        kvp_comm *c[4];
        cr_assert_eq(kvp_comm_threads_create(n, c), KVP_OK);
        for (int r = 0; r < n; r++) ranks[r].c = c[r];
        tu_run_ranks(ranks, n, tu_contract);
        tu_assert_contract(ranks, n, "threads");
        for (int r = 0; r < n; r++) {
            cr_assert_eq(kvp_comm_memory(c[r]), KVP_COMM_MEM_HOST);
            cr_assert_eq(kvp_comm_device(c[r]), -1);
            cr_assert_eq(kvp_comm_host(c[r]), c[r]);
            kvp_comm_destroy(c[r]);
        }
    }
    kvp_comm *s;
    cr_assert_eq(kvp_comm_single_create(&s), KVP_OK);
    ranks[0].c = s;
    tu_run_ranks(ranks, 1, tu_contract);
    kvp_comm_destroy(s);
    cr_assert_str_eq(fake_nccl_log(), "", "a CPU backend called the GPU libraries: %s", fake_nccl_log());
    tu_fake_off();
}

Test(comm_contract, nccl_init_all_on_1_2_3_fake_gpus)
{
    for (int n = 1; n <= 3; n++) {
        tu_fake_on(n);
        kvp_comm *c[3];
        cr_assert_eq(kvp_comm_nccl_threads_create(n, NULL, c), KVP_OK, "%s", kvp_error_detail());
        for (int r = 0; r < n; r++) {
            ranks[r].c = c[r];
            cr_assert_str_eq(kvp_comm_backend(c[r]), "nccl");
            cr_assert_eq(kvp_comm_memory(c[r]), KVP_COMM_MEM_DEVICE);
            cr_assert_eq(kvp_comm_device(c[r]), r);
            cr_assert_str_eq(kvp_comm_backend(kvp_comm_host(c[r])), "threads");
        }
        tu_run_ranks(ranks, n, tu_contract);
        tu_assert_contract(ranks, n, "nccl (ncclCommInitAll)");
        cr_assert_eq(fake_nccl_count("ncclCommInitAll", -1), 1);
        cr_assert_gt(fake_nccl_count("ncclAllReduce", -1), 30 * n); /* every case of the contract went through NCCL */
        for (int r = 0; r < n; r++) kvp_comm_destroy(c[r]);
        cr_assert_eq(fake_nccl_count("ncclCommDestroy", -1), n);
        cr_assert_eq(fake_nccl_count("ncclCommAbort", -1), 0);
        tu_fake_off();
    }
}

/* Each rank bootstraps over its threads host, then runs the contract. */
static kvp_status boot_and_contract(tu_rank *r)
{
    KVP_TRY(kvp_comm_nccl_create(r->host, (int)(intptr_t)r->arg, &r->c));
    r->host = NULL; /* the nccl communicator owns it now */
    return kvp_comm_check_contract(r->c, &r->rep);
}

Test(comm_contract, nccl_bootstrapped_over_a_host_plane_on_2_and_3_fake_gpus)
{
    for (int n = 2; n <= 3; n++) {
        tu_fake_on(n);
        kvp_comm *h[3];
        cr_assert_eq(kvp_comm_threads_create(n, h), KVP_OK);
        for (int r = 0; r < n; r++) ranks[r] = (tu_rank){.host = h[r], .arg = (void *)(intptr_t)(n - 1 - r)};
        tu_run_ranks(ranks, n, boot_and_contract);
        tu_assert_contract(ranks, n, "nccl (bootstrap)");
        for (int r = 0; r < n; r++) cr_assert_eq(kvp_comm_device(ranks[r].c), n - 1 - r); /* any device order */
        cr_assert_eq(fake_nccl_count("ncclGetUniqueId", -1), 1, "only rank 0 makes the id");
        cr_assert_eq(fake_nccl_count("ncclCommInitRank", -1), n);
        for (int r = 0; r < n; r++) kvp_comm_destroy(ranks[r].c);
        tu_fake_off();
    }
}

/* On the executor's own stream, with collectives that return once enqueued: the downloads the contract
 * makes are ordered after them on that stream, and kvp_comm_wait reports their completion. */
static kvp_status on_stream(tu_rank *r)
{
    KVP_TRY(kvp_comm_set_stream(r->c, r->arg, 0));
    return kvp_comm_check_contract(r->c, &r->rep);
}

Test(comm_contract, nccl_on_a_caller_stream_without_waiting)
{
    tu_fake_on(3);
    kvp_comm *c[3];
    cr_assert_eq(kvp_comm_nccl_threads_create(3, NULL, c), KVP_OK);
    for (int r = 0; r < 3; r++) ranks[r] = (tu_rank){.c = c[r], .arg = fake_nccl_stream_create(r)};
    tu_run_ranks(ranks, 3, on_stream);
    tu_assert_contract(ranks, 3, "nccl (caller stream, no wait)");
    for (int r = 0; r < 3; r++) kvp_comm_destroy(c[r]);
    tu_fake_off();
}
