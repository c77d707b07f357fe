/* kvp-nccl-smoke — the nccl communicator on this machine's GPU(s), one short run: the communicator contract
 * (parallel/comm_check.h: all-reduce f32/bf16, all-gather, broadcast, barrier on device buffers, checked
 * against host references) on one rank through both constructors, NCCL's refusal of two ranks on one GPU,
 * and the contract on two GPUs when there are two. For bench/gpu_check.sh; built only when CMake found CUDA
 * and NCCL. Needs libnccl, libcudart and libc (and jemalloc outside sanitizer builds) at run time; no MPI,
 * Criterion or cJSON.
 *
 *   build/parallel/kvp-nccl-smoke [--device N] [--timeout S] [--json]
 *
 * Exit status: 0 every step passed; 1 a check failed (wrong values, or a fact that did not hold); 2 a step
 * could not run (no GPU, a CUDA or NCCL error, a timeout) or a usage error.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/comm_check.h"
#include "parallel/nccl_api.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvp-nccl-smoke [options]\n\n"
            "The nccl communicator on this machine's GPUs: the communicator contract on 1 rank (ncclCommInitAll and\n"
            "the ncclCommInitRank bootstrap), two ranks on one GPU (NCCL must refuse: Duplicate GPU detected), and\n"
            "the contract on 2 GPUs when the machine has them.\n\n"
            "  --device N     the GPU of the 1-rank steps (default 0)\n"
            "  --timeout S    seconds a collective may take before it counts as hung (default 60)\n"
            "  --json         one JSON array of steps on stdout instead of a table\n"
            "  -h, --help     this help\n\n"
            "Exit status: 0 all passed, 1 a check failed, 2 a step could not run or bad usage.\n");
}

typedef struct {
    const char *name;
    int code;         /* 0 passed, 1 check failed, 2 could not run */
    int checks;
    char detail[600];
} step;

static step steps[8];
static int nsteps;

static step *begin(const char *name)
{
    step *s = &steps[nsteps++];
    memset(s, 0, sizeof *s);
    s->name = name;
    return s;
}

/* The contract on one rank's communicator c (destroyed here). */
static void contract(step *s, kvp_comm *c, double timeout)
{
    kvp_comm_set_timeout(c, timeout);
    kvp_comm_check_report rep;
    const kvp_status st = kvp_comm_check_contract(c, &rep);
    s->checks = rep.checks;
    s->code = st == KVP_OK ? 0 : st == KVP_ESTATE && rep.failures ? 1 : 2;
    snprintf(s->detail, sizeof s->detail, "%s", st == KVP_OK ? "" : kvp_error_message());
    kvp_comm_destroy(c);
}

typedef struct {
    kvp_comm *c;
    double timeout;
    step part;
} rank_run;

static void *rank_main(void *p)
{
    rank_run *r = p;
    contract(&r->part, r->c, r->timeout);
    return NULL;
}

/* The contract on two ranks of one process, each on its own thread (a rank's collectives wait for the
 * other's). */
static void two_ranks(step *s, kvp_comm **two, double timeout)
{
    rank_run r[2] = {{.c = two[0], .timeout = timeout}, {.c = two[1], .timeout = timeout}};
    pthread_t t;
    if (pthread_create(&t, NULL, rank_main, &r[1]) != 0) {
        s->code = 2;
        snprintf(s->detail, sizeof s->detail, "cannot start a thread for rank 1");
        kvp_comm_destroy(two[0]), kvp_comm_destroy(two[1]);
        return;
    }
    rank_main(&r[0]);
    pthread_join(t, NULL);
    const int worse = r[1].part.code > r[0].part.code;
    s->code = r[worse].part.code;
    s->checks = r[0].part.checks + r[1].part.checks;
    snprintf(s->detail, sizeof s->detail, "%s", r[worse].part.detail);
}

static void print_json_string(const char *p)
{
    putchar('"');
    for (; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else putchar((unsigned char)*p < 32 ? ' ' : *p);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"device", required_argument, NULL, 'd'}, {"timeout", required_argument, NULL, 't'},
                                         {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int device = 0, json = 0, c;
    double timeout = 60;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'd':
            device = (int)strtol(optarg, &end, 10);
            if (*end || device < 0) {
                fprintf(stderr, "kvp-nccl-smoke: error: --device '%s': a GPU index >= 0\n", optarg);
                return 2;
            }
            break;
        case 't':
            timeout = strtod(optarg, &end);
            if (*end || !(timeout > 0)) {
                fprintf(stderr, "kvp-nccl-smoke: error: --timeout '%s': seconds > 0\n", optarg);
                return 2;
            }
            break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "kvp-nccl-smoke: error: bad option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "kvp-nccl-smoke: error: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    const char *why = "";
    const kvp_nccl_api *api = kvp_nccl_api_linked(&why);
    int ngpu = 0;
    step *s = begin("devices");
    const int e = api ? api->cudaGetDeviceCount(&ngpu) : 0;
    if (!api || e != KVP_CUDA_SUCCESS || device >= ngpu) {
        s->code = 2;
        if (!api) snprintf(s->detail, sizeof s->detail, "%s", why);
        else if (e != KVP_CUDA_SUCCESS) snprintf(s->detail, sizeof s->detail, "cudaGetDeviceCount: %s (cudaError %d)", api->cudaGetErrorString(e), e);
        else snprintf(s->detail, sizeof s->detail, "GPU %d does not exist (this process sees %d)", device, ngpu);
    } else {
        snprintf(s->detail, sizeof s->detail, "%d GPU%s, %s", ngpu, ngpu == 1 ? "" : "s", api->name);
        kvp_comm *one = NULL, *host = NULL;
        /* 1. one rank, ncclCommInitAll */
        s = begin("1 rank, ncclCommInitAll");
        if (kvp_comm_nccl_threads_create(1, &device, &one) == KVP_OK) contract(s, one, timeout);
        else s->code = 2, snprintf(s->detail, sizeof s->detail, "%s", kvp_error_message());
        /* 2. one rank, the bootstrap (ncclGetUniqueId, ncclCommInitRank) over a single host plane */
        s = begin("1 rank, ncclCommInitRank bootstrap");
        kvp_status st = kvp_comm_single_create(&host);
        if (st == KVP_OK) st = kvp_comm_nccl_create(host, device, &one);
        if (st == KVP_OK) contract(s, one, timeout);
        else s->code = 2, snprintf(s->detail, sizeof s->detail, "%s", kvp_error_message()), kvp_comm_destroy(host);
        /* 3. NCCL allows one rank per GPU */
        s = begin("2 ranks on one GPU are refused");
        kvp_comm *two[2] = {0};
        const int same[2] = {device, device};
        st = kvp_comm_nccl_threads_create(2, same, two);
        s->checks = 1;
        if (st == KVP_OK) {
            s->code = 1;
            snprintf(s->detail, sizeof s->detail, "NCCL accepted two ranks on GPU %d", device);
            kvp_comm_destroy(two[0]), kvp_comm_destroy(two[1]);
        } else {
            s->code = st == KVP_ENCCL && strstr(kvp_error_message(), "Duplicate GPU detected") ? 0 : 1;
            snprintf(s->detail, sizeof s->detail, "%s", kvp_error_message());
        }
        /* 4. two GPUs, one thread each */
        if (ngpu >= 2) {
            s = begin("2 ranks on 2 GPUs, ncclCommInitAll");
            st = kvp_comm_nccl_threads_create(2, NULL, two);
            if (st != KVP_OK) {
                s->code = 2;
                snprintf(s->detail, sizeof s->detail, "%s", kvp_error_message());
            } else {
                two_ranks(s, two, timeout);
            }
        }
    }
    int code = 0;
    if (json) putchar('[');
    for (int i = 0; i < nsteps; i++) {
        code = steps[i].code > code ? steps[i].code : code;
        if (json) {
            printf("%s{\"step\":", i ? "," : "");
            print_json_string(steps[i].name);
            printf(",\"result\":\"%s\",\"checks\":%d,\"detail\":", steps[i].code == 0 ? "pass" : steps[i].code == 1 ? "fail" : "error",
                   steps[i].checks);
            print_json_string(steps[i].detail);
            putchar('}');
        } else {
            printf("%-36s %-5s %5d checks  %s\n", steps[i].name, steps[i].code == 0 ? "pass" : steps[i].code == 1 ? "FAIL" : "ERROR",
                   steps[i].checks, steps[i].detail);
        }
    }
    if (json) printf("]\n");
    return code;
}
