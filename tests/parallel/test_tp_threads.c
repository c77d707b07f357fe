/* Tensor parallelism inside one process: the threads communicator (parallel/comm.h), then stories260K split
 * over 2, 4 and 8 rank threads: rank 0 runs the engine and broadcasts each step's plan, the others execute
 * it on their shards (runtime/executor/tp_plan.h). Same checks as the MPI test (golden tokens, 1/tp of the KV
 * cache per rank), plus what one process allows: log-probabilities against one rank, every follower ran
 * rank 0's steps, and every allocation failure of a shard's load (the sanitizer build checks for leaks); a
 * rank that aborts ends the others' waits; and `kvpage generate --tp N` without mpirun (rank threads). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"
#include "common/json.h"
#include "parallel/comm.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/model/model.h"
#include "runtime/model_testutil.h"

typedef struct {
    kvp_comm *comm;
    const char *path;
    const tu_golden *g;
    kvp_session_result res[8];
    kvp_run_stats st;
    int64_t followed; /* a follower: the plans it executed */
    kvp_status status;
    char err[512];
} rank_job;

/* One rank: load its shard; rank 0 generates every golden case and keeps the results, the others follow its
 * plans (no asserts off the main thread). */
static void *rank_main(void *arg)
{
    rank_job *j = arg;
    kvp_model *m = NULL;
    j->status = kvp_model_load_tp(j->path, j->comm, &m);
    if (j->status == KVP_OK && kvp_comm_rank(j->comm) == 0) {
        kvp_session_config cfg = kvp_session_config_default();
        j->status = kvp_cpu_generate(m, &cfg, j->g->reqs, j->g->n, j->res, &j->st, NULL, NULL);
    } else if (j->status == KVP_OK) {
        j->status = kvp_cpu_follow(m, &j->followed);
    }
    if (j->status != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    return NULL;
}

/* Runs the golden cases on tp rank threads; jobs[r] holds rank r's results. */
static void run_ranks(int tp, const char *path, const tu_golden *g, rank_job *jobs)
{
    kvp_comm *comms[8];
    cr_assert_eq(kvp_comm_threads_create(tp, comms), KVP_OK);
    pthread_t tid[8];
    for (int r = 0; r < tp; r++) {
        jobs[r] = (rank_job){.comm = comms[r], .path = path, .g = g};
        cr_assert_eq(pthread_create(&tid[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < tp; r++) pthread_join(tid[r], NULL);
    for (int r = 0; r < tp; r++) kvp_comm_destroy(comms[r]);
    for (int r = 0; r < tp; r++) cr_assert_eq(jobs[r].status, KVP_OK, "tp %d rank %d: %s", tp, r, jobs[r].err);
}

Test(tp_threads, golden_tokens_at_tp_2_4_8_with_one_ranks_logprobs_and_every_rank_following_rank_0)
{
    tu_require_shared();
    static tu_golden g;
    tu_golden_load(&g);
    static rank_job one[1], jobs[8];
    run_ranks(1, S260_GGUF, &g, one);
    const int tps[3] = {2, 4, 8};
    for (int k = 0; k < 3; k++) {
        const int tp = tps[k];
        run_ranks(tp, k == 1 ? S260_HF : S260_GGUF, &g, jobs);
        for (int r = 1; r < tp; r++)
            cr_assert_eq(jobs[r].followed, jobs[0].st.steps, "tp %d rank %d ran %lld of rank 0's %lld steps", tp, r,
                         (long long)jobs[r].followed, (long long)jobs[0].st.steps);
        for (int i = 0; i < g.n; i++) { /* rank 0's results: the golden story */
            const kvp_session_result *x = &jobs[0].res[i];
            cr_assert_eq(x->n_tokens[0], g.nwant[i], "tp %d case %d", tp, i);
            for (int t = 0; t < g.nwant[i]; t++)
                cr_assert_eq(x->tokens[0][t], g.want[i][t], "tp %d case %d token %d", tp, i, t);
            const double a = one[0].res[i].logprob[0], b = x->logprob[0];
            cr_assert(fabs(a - b) <= 1e-4 * fabs(a) + 1e-5, "tp %d case %d: log-probability %.9g, %.9g on one rank",
                      tp, i, b, a);
        }
        /* 4 KV heads: 4/tp of them per rank, one replica past 4 ranks */
        const double share = tp <= 4 ? 1.0 / tp : 0.25;
        cr_assert_float_eq((double)jobs[0].st.kv_pool_bytes, one[0].st.kv_pool_bytes * share, 0.5, "tp %d", tp);
        kvp_session_results_free(jobs[0].res, g.n);
    }
    kvp_session_results_free(one[0].res, g.n);
}

/* Four rank threads: sums in rank order with the same bits everywhere, gathers in rank order, broadcasts,
 * and a check that every rank holds the same value, which fails on all of them when one rank differs. */
typedef struct {
    kvp_comm *c;
    float sum[1000], gathered[4 * 3];
    uint64_t word;
    kvp_status st, differ_st;
} coll_job;

static void *coll_main(void *arg)
{
    coll_job *j = arg;
    const int r = kvp_comm_rank(j->c);
    for (int i = 0; i < 1000; i++) j->sum[i] = (float)(r + 1) * 0.1f + (float)i * 1e-3f * (float)(r * r);
    float mine[3] = {(float)r, (float)r + 0.5f, -(float)r};
    j->word = r == 2 ? 0x1234567890abcdefull : 0;
    j->st = kvp_comm_all_reduce_sum_f32(j->c, j->sum, 1000);
    if (j->st == KVP_OK) j->st = kvp_comm_all_gather_f32(j->c, mine, 3, j->gathered);
    if (j->st == KVP_OK) j->st = kvp_comm_broadcast(j->c, &j->word, sizeof j->word, 2);
    if (j->st == KVP_OK) j->st = kvp_comm_barrier(j->c);
    if (j->st == KVP_OK) j->st = kvp_comm_check_same(j->c, 42, "same everywhere");
    if (j->st == KVP_OK) j->differ_st = kvp_comm_check_same(j->c, r == 3 ? 7 : 42, "rank 3 differs");
    return NULL;
}

Test(comm, threads_collectives)
{
    kvp_comm *comms[4];
    cr_assert_eq(kvp_comm_threads_create(4, comms), KVP_OK);
    static coll_job jobs[4];
    pthread_t tid[4];
    for (int r = 0; r < 4; r++) {
        jobs[r].c = comms[r];
        cr_assert_str_eq(kvp_comm_backend(comms[r]), "threads");
        cr_assert_eq(pthread_create(&tid[r], NULL, coll_main, &jobs[r]), 0);
    }
    for (int r = 0; r < 4; r++) pthread_join(tid[r], NULL);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(jobs[r].st, KVP_OK);
        cr_assert(memcmp(jobs[r].sum, jobs[0].sum, sizeof jobs[0].sum) == 0, "rank %d's sum differs", r);
        for (int k = 0; k < 4; k++) {
            cr_assert_eq(jobs[r].gathered[3 * k], (float)k);
            cr_assert_eq(jobs[r].gathered[3 * k + 1], (float)k + 0.5f);
        }
        cr_assert_eq(jobs[r].word, 0x1234567890abcdefull);
        cr_assert_eq(jobs[r].differ_st, KVP_EMPI, "rank %d did not learn that rank 3 differs", r);
        kvp_comm_destroy(comms[r]);
    }
    for (int i = 0; i < 1000; i++) {
        float want = 0;
        for (int r = 0; r < 4; r++) want += (float)(r + 1) * 0.1f + (float)i * 1e-3f * (float)(r * r);
        cr_assert_eq(jobs[0].sum[i], want, "element %d", i);
    }
    cr_assert_eq(kvp_comm_threads_create(0, comms), KVP_EINVAL);
    cr_assert_eq(kvp_comm_threads_create(KVP_COMM_MAX_THREADS + 1, comms), KVP_EINVAL);
}

static kvp_comm *g_shard_comms[2];
static kvp_status make_threads(void *ctx, void **obj)
{
    (void)ctx;
    kvp_comm *c[3] = {NULL, NULL, NULL};
    kvp_status st = kvp_comm_threads_create(3, c);
    *obj = st == KVP_OK ? c[0] : NULL;
    if (st == KVP_OK) kvp_comm_destroy(c[1]), kvp_comm_destroy(c[2]);
    return st;
}
static void destroy_comm(void *c) { kvp_comm_destroy(c); }
static kvp_status load_rank1(void *path, void **m) { return kvp_model_load_tp(path, g_shard_comms[1], (kvp_model **)m); }
static void destroy_model(void *m) { kvp_model_destroy(m); }

/* Loading needs no collective: rank 1's shard loads on this thread, through every allocation failure. */
Test(tp_threads, every_allocation_failure_of_a_shard_load_and_of_the_communicator)
{
    tu_require_shared();
    tu_every_alloc_failure("threads communicator", make_threads, destroy_comm, NULL, 0);
    cr_assert_eq(kvp_comm_threads_create(2, g_shard_comms), KVP_OK);
    tu_every_alloc_failure("rank 1 of 2, GGUF", load_rank1, destroy_model, S260_GGUF, 0);
    tu_every_alloc_failure("rank 1 of 2, HF", load_rank1, destroy_model, S260_HF, 0);
    kvp_comm_destroy(g_shard_comms[0]);
    kvp_comm_destroy(g_shard_comms[1]);
}

/* A split the heads do not allow is refused at load, naming the file. */
Test(tp_threads, a_split_that_does_not_divide_the_heads_is_refused)
{
    tu_require_shared();
    kvp_comm *c[3];
    cr_assert_eq(kvp_comm_threads_create(3, c), KVP_OK);
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load_tp(S260_GGUF, c[0], &m), KVP_EINVAL);
    cr_assert_null(m);
    cr_assert(strstr(kvp_error_message(), "stories260K.gguf: cannot split the model over 3 ranks"), "%s",
              kvp_error_message());
    for (int r = 0; r < 3; r++) kvp_comm_destroy(c[r]);
}

/* kvp_comm_abort on a threads communicator breaks the group: rank 0, waiting for a plan (broadcast_idle, no
 * deadline), returns KVP_ESTATE naming rank 1 and why it gave up; later collectives fail the same way. */
typedef struct {
    kvp_comm *c;
    kvp_status st;
    char err[512];
} abort_job;

static void *wait_plan(void *arg)
{
    abort_job *j = arg;
    int64_t word = 0;
    j->st = kvp_comm_broadcast_idle(j->c, &word, sizeof word, 0);
    snprintf(j->err, sizeof j->err, "%s", kvp_error_message());
    return NULL;
}

Test(comm, threads_abort_ends_the_other_ranks_waits_naming_why)
{
    kvp_comm *c[3];
    cr_assert_eq(kvp_comm_threads_create(3, c), KVP_OK);
    abort_job j[2] = {{.c = c[0]}, {.c = c[2]}};
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&tid[i], NULL, wait_plan, &j[i]), 0);
    (void)KVP_ERR(KVP_ENOMEM, "rank 1: out of device memory for its KV pools");
    kvp_comm_abort(c[1], 1);
    for (int i = 0; i < 2; i++) {
        pthread_join(tid[i], NULL);
        cr_assert_eq(j[i].st, KVP_ESTATE);
        cr_assert(strstr(j[i].err, "rank 1 gave up: rank 1: out of device memory"), "%s", j[i].err);
    }
    cr_assert_eq(kvp_comm_barrier(c[0]), KVP_ESTATE);
    for (int r = 0; r < 3; r++) kvp_comm_destroy(c[r]);
}

/* --tp N without mpirun: ranks 1 .. N-1 are threads of the one process (runtime/executor/tp_threads.h): the
 * golden story at tp 2 and 4 through `kvpage generate`, 1/tp of the KV cache a rank, and a split the heads do
 * not allow is one error line naming it (every rank fails alike; rank 0 says so once). */
Test(tp_threads, generate_tp_without_mpirun_runs_the_ranks_as_threads)
{
    tu_require_shared();
    tu_golden g; /* case 0: BOS alone */
    tu_golden_load(&g);
    double bytes1 = 0;
    for (int tp = 1; tp <= 4; tp *= 2) {
        char cmd[1024], *out, *err;
        snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt '' --max-tokens %d --ignore-eos --tp %d --json",
                 kvp_test_bin(), S260_GGUF, g.nwant[0], tp);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "`%s`: %s", cmd, err);
        cJSON *j;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "%s", out);
        const cJSON *toks = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "requests"), 0), "tokens");
        cr_assert_eq(cJSON_GetArraySize(toks), g.nwant[0]);
        for (int t = 0; t < g.nwant[0]; t++)
            cr_assert_eq(cJSON_GetArrayItem(toks, t)->valueint, g.want[0][t], "tp %d token %d", tp, t);
        const cJSON *tot = cJSON_GetObjectItem(j, "totals");
        cr_assert_eq(cJSON_GetObjectItem(tot, "tp")->valueint, tp);
        const double pool = cJSON_GetObjectItem(tot, "kv_pool_bytes")->valuedouble;
        if (tp == 1) bytes1 = pool;
        else cr_assert_float_eq(pool, bytes1 / tp, 0.5, "tp %d: %g KV bytes a rank", tp, pool);
        cJSON_Delete(j);
        free(out);
        free(err);
    }
    char cmd[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt hi --tp 3", kvp_test_bin(), S260_GGUF);
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", err);
    cr_assert(strstr(err, "cannot split the model over 3 ranks"), "%s", err);
    const char *nl = strchr(err, '\n');
    cr_assert(nl && nl[1] == '\0', "not one error line: %s", err);
    free(out);
    free(err);
}
