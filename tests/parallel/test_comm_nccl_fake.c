/* The nccl communicator against the fake NCCL (tests/parallel/fake_nccl.h): which NCCL and CUDA calls it
 * makes and in what order, how each library error becomes KVP_ENCCL / KVP_ECUDA with the library's own
 * words, and that a failing init, a failing or mismatched collective, a missing device, two ranks on one
 * GPU or a rank that never calls end in a named error on every rank, never in a hang, with nothing left
 * allocated. The messages injected are the real libraries' (NCCL 2.28.9 and CUDA 13 print exactly these on
 * a machine without a driver; "Duplicate GPU detected" is NCCL's init.cc). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "comm_testutil.h"
#include "common/alloc.h"
#include "fake_nccl.h"
#include "parallel/nccl_api.h"

static tu_rank ranks[KVP_COMM_MAX_THREADS];

#define HAS(s, needle) cr_assert(strstr((s), (needle)) != NULL, "'%s' lacks '%s'", (s), (needle))

/* Bootstrap over a threads host: rank r on device devs[r] (arg). */
static kvp_status boot(tu_rank *r)
{
    KVP_TRY(kvp_comm_nccl_create(r->host, (int)(intptr_t)r->arg, &r->c));
    r->host = NULL;
    return KVP_OK;
}

/* n ranks bootstrapped on devices devs; returns through ranks[]. */
static void boot_ranks(int n, const int *devs)
{
    kvp_comm *h[KVP_COMM_MAX_THREADS];
    cr_assert_eq(kvp_comm_threads_create(n, h), KVP_OK);
    for (int r = 0; r < n; r++) ranks[r] = (tu_rank){.host = h[r], .arg = (void *)(intptr_t)devs[r]};
    tu_run_ranks(ranks, n, boot);
}

static void destroy_ranks(int n)
{
    for (int r = 0; r < n; r++) {
        kvp_comm_destroy(ranks[r].c);
        kvp_comm_destroy(ranks[r].host);
        ranks[r].c = ranks[r].host = NULL;
    }
}

Test(nccl_fake, bootstrap_calls_in_order)
{
    tu_fake_on(2);
    const int devs[2] = {0, 1};
    boot_ranks(2, devs);
    for (int r = 0; r < 2; r++) cr_assert_eq(ranks[r].st, KVP_OK, "rank %d: %s", r, ranks[r].err);
    for (int d = 0; d < 2; d++) { /* per rank: how many devices, its device, NCCL, then the barrier's float */
        const long count = fake_nccl_find("cudaGetDeviceCount", 0, 0), set = fake_nccl_find("cudaSetDevice", d, 0),
                   init = fake_nccl_find("ncclCommInitRank", d, 0), scratch = fake_nccl_find("cudaMalloc", d, 0);
        cr_assert(count >= 0 && set > count && init > set && scratch > init, "device %d: %s", d, fake_nccl_log());
    }
    const long id = fake_nccl_find("ncclGetUniqueId", 0, 0);
    cr_assert(id >= 0 && id < fake_nccl_find("ncclCommInitRank", 0, 0) && id < fake_nccl_find("ncclCommInitRank", 1, 0),
              "the id is made before either rank initializes: %s", fake_nccl_log());
    cr_assert_eq(fake_nccl_count("ncclGetUniqueId", -1), 1);
    /* a collective: the device, NCCL, then polls of the stream and of NCCL's asynchronous error */
    const long mark = (long)strlen(fake_nccl_log());
    tu_run_ranks(ranks, 2, tu_contract);
    const long ar = fake_nccl_find("ncclAllReduce", 1, mark), q = fake_nccl_find("cudaStreamQuery", 1, ar),
               as = fake_nccl_find("ncclCommGetAsyncError", 1, q);
    const char *log = fake_nccl_log();
    long set = -1; /* the last cudaSetDevice@1 before the all-reduce */
    for (long at = fake_nccl_find("cudaSetDevice", 1, mark); at >= 0 && at < ar; at = fake_nccl_find("cudaSetDevice", 1, at + 1))
        set = at;
    cr_assert(ar > 0 && set >= 0 && q > ar && as > q, "%s", log + mark);
    tu_assert_contract(ranks, 2, "nccl");
    destroy_ranks(2);
    cr_assert_eq(fake_nccl_count("ncclCommDestroy", -1), 2);
    cr_assert_eq(fake_nccl_count("ncclCommAbort", -1), 0, "a healthy communicator is destroyed, not aborted");
    cr_assert_eq(fake_nccl_count("cudaFree", -1), fake_nccl_count("cudaMalloc", -1));
    tu_fake_off();
}

Test(nccl_fake, zero_length_collectives_make_no_nccl_call)
{
    tu_fake_on(1);
    kvp_comm *c;
    cr_assert_eq(kvp_comm_nccl_threads_create(1, NULL, &c), KVP_OK);
    cr_assert_eq(kvp_comm_all_reduce_sum(c, NULL, 0, KVP_COMM_BF16), KVP_OK);
    cr_assert_eq(kvp_comm_all_gather(c, NULL, 0, NULL), KVP_OK);
    cr_assert_eq(kvp_comm_broadcast(c, NULL, 0, 0), KVP_OK);
    cr_assert_eq(fake_nccl_count("ncclAllReduce", -1) + fake_nccl_count("ncclAllGather", -1) +
                     fake_nccl_count("ncclBroadcast", -1), 0, "%s", fake_nccl_log());
    /* host-plane calls make none either; the barrier is an all-reduce of one float, waited for */
    cr_assert_eq(kvp_comm_check_same(c, 7, "seven"), KVP_OK);
    char m[4] = "abc";
    cr_assert_eq(kvp_comm_broadcast_idle(c, m, 4, 0), KVP_OK);
    cr_assert_eq(fake_nccl_count("ncclAllReduce", -1) + fake_nccl_count("ncclBroadcast", -1), 0);
    cr_assert_eq(kvp_comm_set_stream(c, NULL, 0), KVP_OK);
    cr_assert_eq(kvp_comm_barrier(c), KVP_OK);
    cr_assert_eq(fake_nccl_count("ncclAllReduce", -1), 1);
    cr_assert_gt(fake_nccl_count("cudaStreamQuery", -1), 0, "a barrier waits even when collectives do not");
    kvp_comm_destroy(c);
    tu_fake_off();
}

/* Without a driver: cudaGetDeviceCount fails first (KVP_ECUDA), and had it not, ncclCommInitRank would
 * (KVP_ENCCL with NCCL's words and its last error). */
Test(nccl_fake, driver_insufficient)
{
    static const char *cuda_text = "CUDA driver version is insufficient for CUDA runtime version";
    tu_fake_on(2);
    fake_nccl_fail("cudaGetDeviceCount", -1, KVP_CUDA_ERROR_INSUFFICIENT_DRIVER, 0, NULL, -1);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_ECUDA);
    HAS(kvp_error_message(), "cudaGetDeviceCount failed");
    HAS(kvp_error_message(), cuda_text);
    const int devs[2] = {0, 1};
    boot_ranks(2, devs);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ranks[r].st, KVP_ECUDA, "rank %d: %s", r, ranks[r].err);
        HAS(ranks[r].err, cuda_text);
    }
    cr_assert_eq(fake_nccl_count("ncclCommInitRank", -1), 0, "no rank entered NCCL's init");
    destroy_ranks(2);
    tu_fake_off();

    tu_fake_on(2);
    fake_nccl_fail("ncclCommInitRank", -1, KVP_NCCL_UNHANDLED_CUDA_ERROR, 0,
                   "Cuda failure 'CUDA driver version is insufficient for CUDA runtime version'", -1);
    boot_ranks(2, devs);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ranks[r].st, KVP_ENCCL, "rank %d: %s", r, ranks[r].err);
        HAS(ranks[r].err, "ncclCommInitRank failed on rank");
        HAS(ranks[r].err, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
        HAS(ranks[r].err, "NCCL's last error: Cuda failure 'CUDA driver version is insufficient");
    }
    destroy_ranks(2);
    tu_fake_off();
}

/* NCCL allows one rank per GPU: two ranks named on one device fail in NCCL, on every rank. */
Test(nccl_fake, duplicate_gpu_detected)
{
    tu_fake_on(1);
    kvp_comm *c[2];
    const int same[2] = {0, 0};
    cr_assert_eq(kvp_comm_nccl_threads_create(2, same, c), KVP_ENCCL);
    HAS(kvp_error_message(), "ncclCommInitAll failed for 2 ranks on CUDA devices 0,0");
    HAS(kvp_error_message(), "invalid usage (run with NCCL_DEBUG=WARN for details)");
    HAS(kvp_error_message(), "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000");
    boot_ranks(2, same);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ranks[r].st, KVP_ENCCL, "rank %d: %s", r, ranks[r].err);
        HAS(ranks[r].err, "Duplicate GPU detected");
    }
    destroy_ranks(2);
    tu_fake_off();
}

/* A rank whose GPU does not exist: KVP_ENODEVICE there, the same status naming it on the others, and no
 * rank waits in NCCL's init for it. */
Test(nccl_fake, missing_device_is_named_on_every_rank)
{
    tu_fake_on(1);
    const int devs[2] = {0, 1};
    boot_ranks(2, devs);
    cr_assert_eq(ranks[1].st, KVP_ENODEVICE);
    HAS(ranks[1].err, "rank 1 of 2: CUDA device 1 does not exist (this process sees 1 device)");
    cr_assert_eq(ranks[0].st, KVP_ENODEVICE, "%s", ranks[0].err);
    HAS(ranks[0].err, "nccl bootstrap: rank 1 of 2 failed: rank 1 of 2: CUDA device 1 does not exist");
    cr_assert_eq(fake_nccl_count("ncclCommInitRank", -1), 0);
    for (int r = 0; r < 2; r++) cr_assert_not_null(ranks[r].host, "a failed bootstrap leaves the host plane to the caller");
    destroy_ranks(2);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, devs, c), KVP_ENODEVICE);
    HAS(kvp_error_message(), "CUDA device 1 does not exist");
    tu_fake_off();
}

/* Init fails on one rank only, after all joined: the others learn it and release their communicators. */
Test(nccl_fake, init_failing_on_one_rank_fails_all)
{
    tu_fake_on(3);
    fake_nccl_fail("ncclCommInitRank", 2, KVP_NCCL_SYSTEM_ERROR, 1, "socketStartConnect: Connect to 10.0.0.2 failed", 1);
    const int devs[3] = {0, 1, 2};
    boot_ranks(3, devs);
    cr_assert_eq(ranks[2].st, KVP_ENCCL);
    HAS(ranks[2].err, "unhandled system error");
    HAS(ranks[2].err, "socketStartConnect");
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ranks[r].st, KVP_ENCCL, "rank %d: %s", r, ranks[r].err);
        HAS(ranks[r].err, "ncclCommInitRank: rank 2 of 3 failed");
    }
    cr_assert_eq(fake_nccl_count("ncclCommAbort", -1), 2, "ranks 0 and 1 abort what they initialized");
    destroy_ranks(3);
    tu_fake_off();
}

static kvp_status one_all_reduce(tu_rank *r)
{
    void *d = NULL;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvp_comm_set_timeout(r->c, 0.3);
    KVP_TRY(kvp_comm_mem_alloc(r->c, sizeof x, &d));
    kvp_status st = kvp_comm_mem_upload(r->c, d, x, sizeof x);
    const int n = r->arg ? (int)(intptr_t)r->arg : 8;
    if (st == KVP_OK && n > 0) st = kvp_comm_all_reduce_sum_f32(r->c, d, n);
    kvp_comm_mem_free(r->c, d);
    return st;
}

/* A collective NCCL refuses on one rank: KVP_ENCCL there; the peer's kernel would wait forever, so it times
 * out; both abort, and both communicators refuse later work. */
Test(nccl_fake, failing_collective)
{
    tu_fake_on(2);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_OK);
    fake_nccl_fail("ncclAllReduce", 1, KVP_NCCL_UNHANDLED_CUDA_ERROR, 0, "Cuda failure 700 'an illegal memory access was encountered'", 1);
    for (int r = 0; r < 2; r++) ranks[r] = (tu_rank){.c = c[r]};
    tu_run_ranks(ranks, 2, one_all_reduce);
    cr_assert_eq(ranks[1].st, KVP_ENCCL, "%s", ranks[1].err);
    HAS(ranks[1].err, "ncclAllReduce failed on rank 1 of 2 (CUDA device 1): unhandled cuda error");
    HAS(ranks[1].err, "an illegal memory access was encountered");
    cr_assert_eq(ranks[0].st, KVP_ETIMEDOUT, "%s", ranks[0].err);
    HAS(ranks[0].err, "nccl ncclAllReduce on rank 0 of 2: not complete after 0.3 s");
    HAS(ranks[0].err, "KVPAGE_COMM_TIMEOUT");
    cr_assert_eq(fake_nccl_count("ncclCommAbort", -1), 2);
    float x = 0;
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(kvp_comm_all_reduce_sum_f32(c[r], &x, 1), KVP_ESTATE);
        HAS(kvp_error_message(), "unusable after an earlier failure");
        cr_assert_eq(kvp_comm_wait(c[r]), KVP_ESTATE);
        kvp_comm_destroy(c[r]);
    }
    cr_assert_eq(fake_nccl_count("ncclCommDestroy", -1), 0, "aborted communicators are not destroyed again");
    tu_fake_off();
}

/* An error NCCL reports while the collective runs (a peer process died): KVP_ENCCL "asynchronously". */
Test(nccl_fake, asynchronous_error)
{
    tu_fake_on(2);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_OK);
    fake_nccl_fail("ncclAllReduce", 0, KVP_NCCL_REMOTE_ERROR, 1, "socketProgress: Connection closed by remote peer", 1);
    for (int r = 0; r < 2; r++) ranks[r] = (tu_rank){.c = c[r]};
    tu_run_ranks(ranks, 2, one_all_reduce);
    cr_assert_eq(ranks[0].st, KVP_ENCCL, "%s", ranks[0].err);
    HAS(ranks[0].err, "ncclAllReduce (asynchronously) failed on rank 0 of 2");
    HAS(ranks[0].err, "remote process exited or there was a network error");
    HAS(ranks[0].err, "Connection closed by remote peer");
    cr_assert_eq(ranks[1].st, KVP_ETIMEDOUT, "%s", ranks[1].err);
    for (int r = 0; r < 2; r++) kvp_comm_destroy(c[r]);
    tu_fake_off();
}

/* Ranks that disagree on a collective's size: NCCL's kernels would hang or corrupt; the fake flags it and
 * both ranks fail with KVP_ENCCL instead of waiting. */
Test(nccl_fake, mismatched_collectives)
{
    tu_fake_on(2);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_OK);
    ranks[0] = (tu_rank){.c = c[0], .arg = (void *)(intptr_t)4};
    ranks[1] = (tu_rank){.c = c[1], .arg = (void *)(intptr_t)5};
    tu_run_ranks(ranks, 2, one_all_reduce);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(ranks[r].st, KVP_ENCCL, "rank %d: %s", r, ranks[r].err);
        HAS(ranks[r].err, "invalid usage");
    }
    for (int r = 0; r < 2; r++) kvp_comm_destroy(c[r]);
    tu_fake_off();
}

/* A rank that never calls: the other's collective times out with a message, the lazy rank later finds the
 * group unusable or its own wait timing out, and nobody hangs. */
Test(nccl_fake, a_rank_that_never_calls)
{
    tu_fake_on(2);
    kvp_comm *c[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, c), KVP_OK);
    ranks[0] = (tu_rank){.c = c[0]};
    ranks[1] = (tu_rank){.c = c[1], .arg = (void *)(intptr_t)-1}; /* n < 0: skips the collective */
    tu_run_ranks(ranks, 2, one_all_reduce);
    cr_assert_eq(ranks[1].st, KVP_OK);
    cr_assert_eq(ranks[0].st, KVP_ETIMEDOUT, "%s", ranks[0].err);
    HAS(ranks[0].err, "not complete after 0.3 s (CUDA device 0, its stream still busy; ncclCommAbort called)");
    cr_assert_eq(fake_nccl_count("ncclCommAbort", 0), 1);
    /* the peer's next collective waits for the aborted rank in vain, and times out too */
    ranks[1].arg = NULL;
    cr_assert_eq(one_all_reduce(&ranks[1]), KVP_ETIMEDOUT, "%s", kvp_error_message());
    for (int r = 0; r < 2; r++) kvp_comm_destroy(c[r]);
    tu_fake_off();
}

Test(nccl_fake, cuda_errors_keep_cudas_words)
{
    tu_fake_on(1);
    kvp_comm *c;
    cr_assert_eq(kvp_comm_nccl_threads_create(1, NULL, &c), KVP_OK);
    fake_nccl_fail("cudaMalloc", 0, KVP_CUDA_ERROR_MEMORY_ALLOCATION, 0, NULL, 1);
    void *p = (void *)1;
    cr_assert_eq(kvp_comm_mem_alloc(c, 1 << 20, &p), KVP_ECUDA);
    cr_assert_null(p);
    HAS(kvp_error_message(), "cudaMalloc failed on rank 0 of 1 (CUDA device 0): out of memory (cudaError 2)");
    cr_assert_eq(kvp_comm_mem_alloc(c, 64, &p), KVP_OK, "an allocation failure leaves the communicator usable");
    fake_nccl_fail("cudaMemcpyAsync", 0, KVP_CUDA_ERROR_ILLEGAL_ADDRESS, 0, NULL, 1);
    cr_assert_eq(kvp_comm_mem_upload(c, p, "0123456789", 10), KVP_ECUDA);
    HAS(kvp_error_message(), "an illegal memory access was encountered (cudaError 700)");
    kvp_comm_mem_free(c, p);
    kvp_comm_destroy(c);
    /* the barrier's float cannot be allocated: every rank's NCCL communicator is aborted, nothing is left */
    fake_nccl_reset(2);
    fake_nccl_fail("cudaMalloc", 1, KVP_CUDA_ERROR_MEMORY_ALLOCATION, 0, NULL, 1);
    kvp_comm *cs[2];
    cr_assert_eq(kvp_comm_nccl_threads_create(2, NULL, cs), KVP_ECUDA);
    cr_assert_eq(fake_nccl_count("ncclCommAbort", -1), 2);
    tu_fake_off();
}

/* Every host allocation of the one-process constructor fails in turn: KVP_ENOMEM, nothing left, in host
 * memory (the sanitizer build checks) or in the fake's device memory and communicators. */
Test(nccl_fake, every_allocation_failure_of_the_constructor)
{
    tu_fake_on(3);
    for (int64_t n = 1;; n++) {
        kvp_comm *c[3] = {0};
        kvp_alloc_fail_at(n);
        const kvp_status st = kvp_comm_nccl_threads_create(3, NULL, c);
        const int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st == KVP_OK) {
            cr_assert_lt(made, n, "allocation %lld failed but the constructor succeeded", (long long)n);
            for (int r = 0; r < 3; r++) kvp_comm_destroy(c[r]);
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM, "allocation %lld: %s", (long long)n, kvp_error_detail());
        cr_assert_eq(fake_nccl_live_allocs(), 0, "allocation %lld", (long long)n);
        cr_assert_eq(fake_nccl_live_comms(), 0, "allocation %lld", (long long)n);
    }
    tu_fake_off();
}

/* The same for the bootstrap over a host plane, on one rank (two ranks would need every rank to fail the
 * same allocation to stay in step; the agreement step covers the others). */
Test(nccl_fake, every_allocation_failure_of_the_bootstrap)
{
    tu_fake_on(1);
    for (int64_t n = 1;; n++) {
        kvp_comm *h, *c = NULL;
        cr_assert_eq(kvp_comm_threads_create(1, &h), KVP_OK);
        kvp_alloc_fail_at(n);
        const kvp_status st = kvp_comm_nccl_create(h, 0, &c);
        const int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st == KVP_OK) {
            cr_assert_lt(made, n);
            kvp_comm_destroy(c);
            break;
        }
        cr_assert_eq(st, KVP_ENOMEM, "allocation %lld: %s", (long long)n, kvp_error_detail());
        kvp_comm_destroy(h);
        cr_assert_eq(fake_nccl_live_allocs(), 0);
        cr_assert_eq(fake_nccl_live_comms(), 0);
    }
    tu_fake_off();
}

Test(nccl_fake, arguments_and_the_build)
{
    kvp_comm *c[2], *h;
    cr_assert_eq(kvp_comm_nccl_threads_create(0, NULL, c), KVP_EINVAL);
    cr_assert_eq(kvp_comm_nccl_threads_create(KVP_COMM_MAX_THREADS + 1, NULL, c), KVP_EINVAL);
    const int neg[2] = {0, -1};
    tu_fake_on(2);
    cr_assert_eq(kvp_comm_nccl_threads_create(2, neg, c), KVP_EINVAL);
    cr_assert_eq(kvp_comm_single_create(&h), KVP_OK);
    cr_assert_eq(kvp_comm_nccl_create(h, -1, &c[0]), KVP_EINVAL);
    cr_assert_eq(kvp_comm_nccl_create(NULL, 0, &c[0]), KVP_EINVAL);
    cr_assert_eq(kvp_comm_nccl_create(h, 0, &c[0]), KVP_OK, "a single host plane works: %s", kvp_error_detail());
    cr_assert_eq(kvp_comm_nccl_create(c[0], 0, &c[1]), KVP_EINVAL, "an nccl communicator is no host plane");
    kvp_comm_destroy(c[0]);
    tu_fake_off();
    /* without a table: the linked library, or KVP_EUNSUPPORTED naming what the build lacks */
    const char *why = NULL;
    if (kvp_nccl_api_linked(&why)) {
        cr_assert(kvp_comm_have_nccl(NULL));
    } else {
        cr_assert(!kvp_comm_have_nccl(&why));
        HAS(why, "this build has no NCCL");
        cr_assert_eq(kvp_comm_nccl_threads_create(1, NULL, c), KVP_EUNSUPPORTED);
        HAS(kvp_error_message(), "this build has no NCCL");
    }
}

/* KVPAGE_COMM_TIMEOUT sets the default of every backend; a malformed value is refused by name. */
Test(nccl_fake, timeout_from_the_environment)
{
    kvp_comm *c;
    cr_assert_eq(setenv("KVPAGE_COMM_TIMEOUT", "0.25", 1), 0);
    cr_assert_eq(kvp_comm_single_create(&c), KVP_OK);
    cr_assert_float_eq(kvp_comm_timeout(c), 0.25, 1e-12);
    kvp_comm_destroy(c);
    cr_assert_eq(setenv("KVPAGE_COMM_TIMEOUT", "soon", 1), 0);
    cr_assert_eq(kvp_comm_single_create(&c), KVP_EINVAL);
    HAS(kvp_error_message(), "KVPAGE_COMM_TIMEOUT='soon'");
    kvp_comm *t[2];
    cr_assert_eq(kvp_comm_threads_create(2, t), KVP_EINVAL);
    cr_assert_eq(unsetenv("KVPAGE_COMM_TIMEOUT"), 0);
    cr_assert_eq(kvp_comm_single_create(&c), KVP_OK);
    cr_assert_float_eq(kvp_comm_timeout(c), KVP_COMM_DEFAULT_TIMEOUT_S, 1e-9);
    kvp_comm_set_timeout(c, -3);
    cr_assert_eq(kvp_comm_timeout(c), 0, "negative: no limit");
    kvp_comm_destroy(c);
}
