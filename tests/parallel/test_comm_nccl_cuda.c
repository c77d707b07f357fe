/* The nccl communicator on the linked libnccl and libcudart (no fake). Skipped, as a skip, when the build
 * has no NCCL. Without a usable GPU (this CPU machine: no driver) it checks that the real libraries'
 * errors arrive as KVP_ECUDA with CUDA's own words; with one GPU, the contract on 1 rank over both
 * constructors and NCCL's refusal of two ranks on one GPU; with more, the contract on 2 ranks. */
#include <criterion/criterion.h>
#include <string.h>

#include "comm_testutil.h"
#include "parallel/nccl_api.h"

static tu_rank ranks[2];

static kvp_status boot(tu_rank *r)
{
    KVP_TRY(kvp_comm_nccl_create(r->host, (int)(intptr_t)r->arg, &r->c));
    r->host = NULL;
    return kvp_comm_check_contract(r->c, &r->rep);
}

Test(nccl_cuda, real_libraries)
{
    const char *why = "";
    const kvp_nccl_api *api = kvp_nccl_api_linked(&why);
    if (!api) cr_skip_test("%s", why);
    int n = 0;
    const int e = api->cudaGetDeviceCount(&n);
    kvp_comm *c[2] = {0};
    if (e != KVP_CUDA_SUCCESS || n == 0) {
        const kvp_status st = kvp_comm_nccl_threads_create(1, NULL, c);
        cr_assert_eq(st, e != KVP_CUDA_SUCCESS ? KVP_ECUDA : KVP_ENODEVICE, "%s", kvp_error_message());
        if (e != KVP_CUDA_SUCCESS) {
            cr_assert(strstr(kvp_error_message(), "cudaGetDeviceCount failed on rank 0 of 1"), "%s", kvp_error_message());
            cr_assert(strstr(kvp_error_message(), api->cudaGetErrorString(e)), "%s", kvp_error_message());
        }
        cr_log_info("no usable GPU here (cudaError %d: %s): the error path was checked", e, api->cudaGetErrorString(e));
        return;
    }
    cr_assert_eq(kvp_comm_nccl_threads_create(1, NULL, c), KVP_OK, "%s", kvp_error_message());
    ranks[0] = (tu_rank){.c = c[0]};
    tu_run_ranks(ranks, 1, tu_contract);
    tu_assert_contract(ranks, 1, "nccl, 1 GPU (ncclCommInitAll)");
    kvp_comm_destroy(c[0]);
    kvp_comm *h;
    cr_assert_eq(kvp_comm_threads_create(1, &h), KVP_OK);
    ranks[0] = (tu_rank){.host = h, .arg = (void *)(intptr_t)0};
    tu_run_ranks(ranks, 1, boot);
    tu_assert_contract(ranks, 1, "nccl, 1 GPU (bootstrap)");
    kvp_comm_destroy(ranks[0].c);
    const int same[2] = {0, 0};
    cr_assert_eq(kvp_comm_nccl_threads_create(2, same, c), KVP_ENCCL, "two ranks on GPU 0");
    cr_assert(strstr(kvp_error_message(), "Duplicate GPU detected"), "%s", kvp_error_message());
    if (n >= 2) {
        cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_OK, "%s", kvp_error_message());
        ranks[0] = (tu_rank){.c = c[0]};
        ranks[1] = (tu_rank){.c = c[1]};
        tu_run_ranks(ranks, 2, tu_contract);
        tu_assert_contract(ranks, 2, "nccl, 2 GPUs");
        kvp_comm_destroy(c[0]);
        kvp_comm_destroy(c[1]);
    }
}
