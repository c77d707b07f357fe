/* kvp_comm_contract — runs the communicator contract (parallel/comm_check.h) over one backend, as a plain
 * program: under mpirun for the mpi backend (Criterion's forked test runner cannot host MPI ranks), in
 * threads for the others. The tests in test_comm_contract_mpi.c start it; it needs no Criterion.
 *
 *   mpirun -np 3 --oversubscribe build/tests/kvp_comm_contract mpi
 *   build/tests/kvp_comm_contract fake-nccl --ranks 3 --json
 *   mpirun -np 2 build/tests/kvp_comm_contract mpi --scenario never-calls --timeout 1   # exits 2, no hang
 *
 * Exit status: 0 every check passed on every rank; 1 a check failed; 2 a usage error or a communicator
 * error (creation, a failed collective, a timeout), after which an MPI job is ended with that status.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_nccl.h"
#include "parallel/comm.h"
#include "parallel/comm_check.h"
#include "parallel/nccl_api.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvp_comm_contract BACKEND [options]\n\n"
            "Runs the communicator contract (every collective, sizes, dtypes, in place, errors) on one backend.\n\n"
            "  BACKEND          single | threads | mpi | fake-nccl (ncclCommInitAll on the fake NCCL) |\n"
            "                   fake-nccl-boot (the MPI bootstrap protocol over a threads host, fake NCCL)\n"
            "  --ranks N        ranks of threads and fake-nccl* (default 2); mpi: the job size required\n"
            "  --timeout S      seconds a collective may wait (default: KVPAGE_COMM_TIMEOUT, else 600)\n"
            "  --scenario S     contract (default) | never-calls: rank 1 skips a barrier, the others must\n"
            "                   time out | dies: rank 1 exits at once (mpi), the job must end\n"
            "  --json           one JSON object on stdout instead of a line of text\n"
            "  -h, --help       this help\n\n"
            "Exit status: 0 all checks passed, 1 a check failed, 2 usage or communicator error.\n");
}

typedef struct {
    kvp_comm *host, *c; /* fake-nccl-boot: host is the threads plane, c the nccl communicator */
    int scenario;       /* 0 contract, 1 never-calls, 2 dies */
    int boot;
    int device;
    double timeout;
    kvp_comm_check_report rep;
    kvp_status st;
    char err[600];
} rank_job;

/* One rank: the contract, or the scenario. */
static void run_rank(rank_job *j)
{
    if (j->boot) { /* bootstrap this rank's nccl communicator over its threads host */
        j->st = kvp_comm_nccl_create(j->host, j->device, &j->c);
        if (j->st != KVP_OK) {
            snprintf(j->err, sizeof j->err, "%s", kvp_error_message());
            return;
        }
        j->host = NULL; /* owned by the nccl communicator now */
    }
    if (j->timeout >= 0) kvp_comm_set_timeout(j->c, j->timeout);
    if (j->scenario == 1) { /* rank 1 never calls the barrier the others wait in */
        j->st = kvp_comm_rank(j->c) == 1 ? KVP_OK : kvp_comm_barrier(j->c);
    } else if (j->scenario == 2) {
        if (kvp_comm_rank(j->c) == 1) _exit(3);
        j->st = kvp_comm_barrier(j->c);
    } else {
        j->st = kvp_comm_check_contract(j->c, &j->rep);
    }
    if (j->st != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_message());
}

static void *rank_thread(void *arg)
{
    run_rank(arg);
    return NULL;
}

static void print_summary(const char *backend, int n, int checks, int failures, int code, const char *err, int json)
{
    if (json) {
        printf("{\"backend\":\"%s\",\"ranks\":%d,\"checks\":%d,\"failures\":%d,\"exit\":%d,\"error\":\"", backend, n,
               checks, failures, code);
        for (const char *p = err; *p; p++) {
            if (*p == '"' || *p == '\\') printf("\\%c", *p);
            else putchar((unsigned char)*p < 32 ? ' ' : *p);
        }
        printf("\"}\n");
    } else {
        printf("comm contract: %s, %d rank%s: %d checks, %d failed%s%s\n", backend, n, n == 1 ? "" : "s", checks, failures,
               *err ? ": " : "", err);
    }
}

/* A rank's exit status: 0 passed, 1 a check failed, 2 an error (printed on stderr). */
static int rank_code(const char *backend, int r, const rank_job *j)
{
    if (j->st == KVP_OK) return 0;
    fprintf(stderr, "kvp_comm_contract: %s rank %d: %s: %s\n", backend, r, kvp_status_str(j->st), j->err);
    return j->st == KVP_ESTATE && j->rep.failures ? 1 : 2;
}

/* Threads: every rank's counts and the worst status. */
static int report(const char *backend, rank_job *jobs, int n, int json)
{
    int code = 0, checks = 0, failures = 0;
    const char *err = "";
    kvp_status err_st = KVP_OK;
    for (int r = 0; r < n; r++) {
        checks += jobs[r].rep.checks;
        failures += jobs[r].rep.failures;
        const int c = rank_code(backend, r, &jobs[r]);
        /* the cause rather than its echo: a timeout before "another rank timed out" */
        if (c && (!*err || (jobs[r].st == KVP_ETIMEDOUT && err_st != KVP_ETIMEDOUT))) err = jobs[r].err, err_st = jobs[r].st;
        code = code > c ? code : c;
    }
    print_summary(backend, n, checks, failures, code, err, json);
    return code;
}

/* mpi: this process is one rank; rank 0 prints the job's counts when no rank hit an error. */
static int run_mpi(int ranks, int scenario, double timeout, int json)
{
    kvp_comm *m = NULL;
    kvp_status st = kvp_comm_mpi_create(ranks, &m);
    if (st != KVP_OK) {
        fprintf(stderr, "kvp_comm_contract: error: %s\n", kvp_error_message());
        return 2;
    }
    static rank_job j;
    j = (rank_job){.c = m, .scenario = scenario, .timeout = timeout};
    run_rank(&j);
    const int r = kvp_comm_rank(m), n = kvp_comm_size(m);
    if (scenario == 1 && r == 1) sleep(30); /* never joins: rank 0 must time out and end the job first */
    int code = rank_code("mpi", r, &j);
    float v[3] = {(float)j.rep.checks, (float)j.rep.failures, (float)code};
    if (code < 2 && kvp_comm_all_reduce_sum_f32(m, v, 3) != KVP_OK) code = 2;
    if (code < 2 && v[2] > 0) code = 1;
    if (r == 0) print_summary("mpi", n, (int)v[0], (int)v[1], code, j.err, json);
    fflush(NULL);
    if (code == 2) kvp_comm_abort(m, 2); /* ends every rank, also those waiting for this one */
    kvp_comm_destroy(m);
    return code;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"ranks", required_argument, NULL, 'n'}, {"timeout", required_argument, NULL, 't'},
                                         {"scenario", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int ranks = 2, ranks_given = 0, json = 0, scenario = 0, c;
    double timeout = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'n':
            ranks = (int)strtol(optarg, &end, 10);
            if (*end || ranks < 1 || ranks > KVP_COMM_MAX_THREADS) {
                fprintf(stderr, "kvp_comm_contract: error: --ranks '%s': 1 to %d\n", optarg, KVP_COMM_MAX_THREADS);
                return 2;
            }
            ranks_given = 1;
            break;
        case 't':
            timeout = strtod(optarg, &end);
            if (*end || timeout < 0) {
                fprintf(stderr, "kvp_comm_contract: error: --timeout '%s': seconds >= 0\n", optarg);
                return 2;
            }
            break;
        case 's':
            scenario = !strcmp(optarg, "contract") ? 0 : !strcmp(optarg, "never-calls") ? 1 : !strcmp(optarg, "dies") ? 2 : -1;
            if (scenario < 0) {
                fprintf(stderr, "kvp_comm_contract: error: --scenario '%s': contract, never-calls or dies\n", optarg);
                return 2;
            }
            break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "kvp_comm_contract: error: bad option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *backend = argv[optind];
    static rank_job jobs[KVP_COMM_MAX_THREADS];
    kvp_comm *comms[KVP_COMM_MAX_THREADS];
    kvp_status st = KVP_OK;

    if (!strcmp(backend, "mpi")) return run_mpi(ranks_given ? ranks : 0, scenario, timeout, json);
    const int fake = !strcmp(backend, "fake-nccl") || !strcmp(backend, "fake-nccl-boot");
    if (scenario == 2 || (!fake && strcmp(backend, "single") && strcmp(backend, "threads"))) {
        fprintf(stderr, "kvp_comm_contract: error: backend '%s'%s (see --help)\n", backend,
                scenario == 2 ? " cannot run the dies scenario" : " is unknown");
        return 2;
    }
    if (!strcmp(backend, "single")) ranks = 1;
    if (fake) {
        fake_nccl_reset(ranks);
        kvp_nccl_api_set(fake_nccl_api());
    }
    if (!strcmp(backend, "single")) st = kvp_comm_single_create(&comms[0]);
    else if (!strcmp(backend, "fake-nccl")) st = kvp_comm_nccl_threads_create(ranks, NULL, comms);
    else st = kvp_comm_threads_create(ranks, comms);
    if (st != KVP_OK) {
        fprintf(stderr, "kvp_comm_contract: error: %s\n", kvp_error_message());
        return 2;
    }
    const int boot = !strcmp(backend, "fake-nccl-boot");
    pthread_t tid[KVP_COMM_MAX_THREADS];
    for (int r = 0; r < ranks; r++) {
        jobs[r] = (rank_job){.c = boot ? NULL : comms[r], .host = boot ? comms[r] : NULL, .boot = boot, .device = r,
                             .scenario = scenario, .timeout = timeout};
        if (pthread_create(&tid[r], NULL, rank_thread, &jobs[r]) != 0) {
            fprintf(stderr, "kvp_comm_contract: error: cannot start rank thread %d\n", r);
            return 2;
        }
    }
    for (int r = 0; r < ranks; r++) pthread_join(tid[r], NULL);
    const int code = report(backend, jobs, ranks, json);
    for (int r = 0; r < ranks; r++) {
        kvp_comm_destroy(jobs[r].c);
        kvp_comm_destroy(jobs[r].host);
    }
    if (fake) {
        if (fake_nccl_live_allocs() || fake_nccl_live_comms() || fake_nccl_misuses()) {
            fprintf(stderr, "kvp_comm_contract: the fake NCCL holds %lld allocations and %d communicators after destroy; "
                    "%d misuses (%s)\n", (long long)fake_nccl_live_allocs(), fake_nccl_live_comms(), fake_nccl_misuses(),
                    fake_nccl_last_misuse());
            return 2;
        }
        kvp_nccl_api_set(NULL);
        fake_nccl_reset(0);
    }
    return code;
}
