/* The communicator contract over the mpi backend, under mpirun with 1, 2 and 3 ranks (3 oversubscribed on
 * this 2-core machine), by the contract program (kvp_comm_contract, tests/parallel/comm_contract_main.c,
 * pointed at by $KVP_COMM_CONTRACT_BIN); and what ends a job instead of hanging it: a rank that never calls
 * (the others time out, exit 2 with a message), a rank that dies (mpirun ends the job), a job of the wrong
 * size (exit 2 naming both sizes). The threads and fake-NCCL timeouts run through the same program. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"

/* As test_tp_mpi.c: Open MPI keeps allocations to its end (no LeakSanitizer exit check in MPI processes);
 * mpirun as root needs the two OMPI_ALLOW variables; --oversubscribe: more ranks than cores. `timeout`
 * turns a hang into a failure of this test instead of CTest's. */
#define NO_LSAN "ASAN_OPTIONS=detect_leaks=0 "
#define MPIRUN NO_LSAN "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe"

static const char *contract_bin(void)
{
    const char *b = getenv("KVP_COMM_CONTRACT_BIN");
    cr_assert_not_null(b, "KVP_COMM_CONTRACT_BIN is not set (run the tests through ctest)");
    return b;
}

/* Runs cmd; returns its exit code with stdout and stderr (freed by the caller). */
static int run(const char *cmd, char **out, char **err)
{
    const int rc = kvp_test_sh(cmd, out, err);
    cr_assert_neq(rc, 124, "`%s` hung (killed by timeout): %s", cmd, *err);
    return rc;
}

Test(comm_contract_mpi, contract_on_1_2_and_3_ranks)
{
    for (int np = 1; np <= 3; np++) {
        char cmd[1024], want[128], *out, *err;
        snprintf(cmd, sizeof cmd, MPIRUN " -np %d %s mpi --ranks %d --json", np, contract_bin(), np);
        const int rc = run(cmd, &out, &err);
        cr_assert_eq(rc, 0, "`%s` exited %d: %s%s", cmd, rc, out, err);
        snprintf(want, sizeof want, "\"backend\":\"mpi\",\"ranks\":%d,", np);
        cr_assert(strstr(out, want), "`%s` printed %s", cmd, out);
        cr_assert(strstr(out, "\"failures\":0,\"exit\":0"), "%s", out);
        const char *checks = strstr(out, "\"checks\":");
        cr_assert(checks && atoi(checks + 9) > 100 * np, "%s", out);
        free(out);
        free(err);
    }
}

Test(comm_contract_mpi, a_rank_that_never_calls_ends_the_job_with_exit_2)
{
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s mpi --scenario never-calls --timeout 1", contract_bin());
    const int rc = run(cmd, &out, &err);
    cr_assert_eq(rc, 2, "`%s` exited %d: %s", cmd, rc, err);
    cr_assert(strstr(err, "KVP_ETIMEDOUT"), "%s", err);
    cr_assert(strstr(err, "mpi barrier (MPI_Ibarrier) on rank 0 of 2: not complete after 1 s"), "%s", err);
    cr_assert(strstr(err, "KVPAGE_COMM_TIMEOUT=SECONDS sets the limit"), "%s", err);
    free(out);
    free(err);
    /* the same timeout from the environment, on 3 ranks */
    snprintf(cmd, sizeof cmd, "KVPAGE_COMM_TIMEOUT=0.5 " MPIRUN " -np 3 %s mpi --scenario never-calls", contract_bin());
    cr_assert_eq(run(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "not complete after 0.5 s"), "%s", err);
    free(out);
    free(err);
}

Test(comm_contract_mpi, a_rank_that_dies_ends_the_job)
{
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s mpi --scenario dies --timeout 60", contract_bin());
    const int rc = run(cmd, &out, &err);
    cr_assert(rc != 0 && rc != -1, "`%s` exited %d: %s", cmd, rc, err);
    cr_assert(strstr(err, "exited with non-zero status") || strstr(err, "returned\na non-zero exit code") ||
                  strstr(err, "non-zero"), "mpirun says why: %s", err);
    free(out);
    free(err);
}

Test(comm_contract_mpi, a_job_of_the_wrong_size_exits_2_naming_both)
{
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, MPIRUN " -np 2 %s mpi --ranks 3", contract_bin());
    cr_assert_eq(run(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "tensor parallelism over 3 ranks, but this MPI job has 2 (start it with `mpirun -np 3 ...`)"), "%s", err);
    free(out);
    free(err);
}

/* The in-process backends through the same program: timeouts with a message and exit 2, never a hang. */
Test(comm_contract_mpi, threads_and_fake_nccl_time_out_with_exit_2)
{
    static const char *backends[] = {"threads", "fake-nccl", "fake-nccl-boot"};
    for (int i = 0; i < 3; i++) {
        char cmd[1024], *out, *err;
        snprintf(cmd, sizeof cmd, NO_LSAN "timeout 60 %s %s --ranks 3 --scenario never-calls --timeout 0.3 --json",
                 contract_bin(), backends[i]);
        const int rc = run(cmd, &out, &err);
        cr_assert_eq(rc, 2, "`%s` exited %d: %s", cmd, rc, err);
        cr_assert(strstr(out, "\"exit\":2") && strstr(out, "not complete after 0.3 s"), "%s", out);
        free(out);
        free(err);
        snprintf(cmd, sizeof cmd, "%s %s --ranks 3", contract_bin(), backends[i]);
        cr_assert_eq(run(cmd, &out, &err), 0, "`%s`: %s%s", cmd, out, err);
        free(out);
        free(err);
    }
    char *out, *err;
    cr_assert_eq(run("$KVP_COMM_CONTRACT_BIN nosuch", &out, &err), 2);
    cr_assert(strstr(err, "backend 'nosuch' is unknown"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(run("$KVP_COMM_CONTRACT_BIN --help", &out, &err), 0);
    cr_assert(strstr(out, "usage: kvp_comm_contract BACKEND"), "%s", out);
    free(out);
    free(err);
}
