/* Tensor parallelism inside the cuda executor (runtime/executor/cuda_executor.h): stories260K split over 2, 4
 * and 8 ranks, each a thread of this process with its own executor, summing and gathering through the nccl
 * communicator on the fake NCCL (tests/parallel/fake_nccl.h) over the CPU emulator of CUDA, whose device
 * memory the fake is told to accept (fake_nccl_foreign). Rank 0 steps the executor (or runs the engine) and
 * broadcasts each plan; the others follow (kvp_cuda_follow). Checked: the logits rows of a prefill step and
 * decode steps against one rank's within 1e-5 at tp 2, 4 and 8 (8: each KV head on two ranks), the golden
 * greedy tokens, each rank's share of the KV bytes, the collectives NCCL saw, and the splits and communicators
 * that are refused; the same for a qwen3_moe checkpoint, its experts' units split over 2 ranks; and
 * `kvpage generate --device cuda --tp 2` without mpirun (rank 1 a thread of the process).
 *
 * The fake NCCL works on host memory, so the suite runs on the emulator only (runtime_test_cuda_tp_emu);
 * the native build skips it (a GPU's tensor parallelism needs the real NCCL and several GPUs). */
#include "common/kvp_test.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "fake_nccl.h"
#include "golden_testutil.h"
#include "parallel/comm.h"
#include "parallel/nccl_api.h"
#include "generate_testutil.h"
#include "runtime/executor/cuda/cuda_dev.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/executor/tp_plan.h"
#include "runtime/model/model.h"

/* tu_moe_model's checkpoint writer, compiled in (the standalone runner of kvp_test.h is one file) */
#include "checkpoint_testutil.c"

#define S260 "../shared/models/stories260K"
#define GGUF S260 "/stories260K.gguf"
#define HF S260 "/hf"

enum { BS = 4, NBLOCKS = 12, MAX_TOKENS = 16, MAX_SEQS = 4, STEPS = 4, VOCAB = 512, ROWS = 8, LAYERS = 5, MAXR = 8 };

/* Skips the suite unless the device layer is the emulator (the only one the fake NCCL can share memory with). */
static void require_emulator(void)
{
    int n;
    if (kvp_cudev_count(&n) != KVP_OK) cr_skip_test("%s", kvp_error_message());
    kvp_cudev *d;
    kvp_cudev_info info;
    cr_assert_eq(kvp_cudev_open(0, &d, &info), KVP_OK, "%s", kvp_error_detail());
    kvp_cudev_close(d);
    if (!info.emulated) cr_skip_test("the fake NCCL shares memory with the CUDA emulator only (this is %s)", info.name);
}

/* ndev fake GPUs, nccl communicators created from now on on the fake, the emulator's memory accepted. */
static void fake_on(int ndev)
{
    fake_nccl_reset(ndev);
    fake_nccl_foreign(kvp_cudev_is_device);
    kvp_nccl_api_set(fake_nccl_api());
}

static kvp_cuda_options opts_for_test(void)
{
    kvp_cuda_options o = kvp_cuda_options_default();
    o.kv_cache_memory = (int64_t)NBLOCKS * 2 * LAYERS * 4 * BS * 8 * 4; /* NBLOCKS at one rank's 4 KV heads, f32 */
    return o;
}

/* ---------------------------------------------------------------- hand-made steps */

/* Two sequences: "Once upon a time" (5 tokens) and BOS alone, prefilled in one step (every row's logits for
 * the first), then decoded together with the greedy token of each step; pages in scattered blocks. */
typedef struct {
    kvp_exec_seq seqs[2];
    int32_t tok[2][MAX_TOKENS], flat_tok[2 * MAX_TOKENS], pos[2 * MAX_TOKENS], qo[3], kvi[3], idx[8], last[2];
    int64_t slots[2 * MAX_TOKENS];
    uint8_t every[2];
    kvp_exec_batch b;
} tbatch;

static const int32_t table[2][4] = {{9, 2, 7, 1}, {3, 11, 6, 4}};
static const int32_t prompt0[5] = {1, 403, 407, 261, 378};

/* ctx[i] tokens cached, nn[i] new ones tok[i][..]; seq 0's every-row flag `every0`. */
static void make_batch(tbatch *t, const int32_t *ctx, const int32_t *nn, int every0)
{
    int32_t T = 0, P = 0;
    t->qo[0] = t->kvi[0] = 0;
    for (int i = 0; i < 2; i++) {
        const int32_t len = ctx[i] + nn[i], pages = (len + BS - 1) / BS;
        for (int32_t j = 0; j < nn[i]; j++, T++) {
            const int32_t p = ctx[i] + j;
            t->flat_tok[T] = t->tok[i][j];
            t->pos[T] = p;
            t->slots[T] = (int64_t)table[i][p / BS] * BS + p % BS;
        }
        for (int32_t j = 0; j < pages; j++) t->idx[P++] = table[i][j];
        t->qo[i + 1] = T;
        t->kvi[i + 1] = P;
        t->last[i] = len - (pages - 1) * BS;
        t->every[i] = i == 0 && every0;
        t->seqs[i] = (kvp_exec_seq){.req_id = i, .context_len = ctx[i], .num_new = nn[i], .sample = 1,
                                    .all_logits = t->every[i], .tokens = t->tok[i], .block_table = table[i],
                                    .num_blocks = pages};
    }
    t->b = (kvp_exec_batch){.seqs = t->seqs, .n = 2, .block_size = BS,
                            .flat = {.num_tokens = T, .tokens = t->flat_tok, .positions = t->pos,
                                     .slot_mapping = t->slots, .qo_indptr = t->qo, .kv_indptr = t->kvi,
                                     .kv_indices = t->idx, .kv_last_page_len = t->last, .all_logits = t->every,
                                     .num_rows = (every0 ? nn[0] : 1) + 1}};
}

static int32_t argmax(const float *x)
{
    int32_t best = 0;
    for (int32_t i = 1; i < VOCAB; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* STEPS steps on ex (a prefill, then decodes of the greedy tokens); logits[s] the rows of step s, rows[s] how
 * many; tokens[s][i] the greedy token of sequence i. Returns the first failure. */
static kvp_status run_steps(kvp_executor *ex, float logits[STEPS][ROWS * VOCAB], int32_t rows[STEPS],
                            int32_t tokens[STEPS][2])
{
    static _Thread_local tbatch t;
    int32_t ctx[2] = {0, 0}, nn[2] = {5, 1};
    memcpy(t.tok[0], prompt0, sizeof prompt0);
    t.tok[1][0] = 1;
    for (int s = 0; s < STEPS; s++) {
        make_batch(&t, ctx, nn, s == 0);
        kvp_exec_result r;
        KVP_TRY(ex->step(ex->ctx, &t.b, &r));
        if (!r.logits || r.vocab != VOCAB) return KVP_ERR(KVP_ESTATE, "step %d: no logits", s);
        rows[s] = t.b.flat.num_rows;
        memcpy(logits[s], r.logits, (size_t)rows[s] * VOCAB * sizeof(float));
        for (int i = 0; i < 2; i++) {
            ctx[i] += nn[i];
            const int32_t row = i == 0 ? rows[s] - 2 : rows[s] - 1; /* each sequence's last row */
            tokens[s][i] = t.tok[i][0] = argmax(logits[s] + (size_t)row * VOCAB);
            nn[i] = 1;
        }
    }
    return KVP_OK;
}

typedef struct {
    kvp_comm *comm;
    const char *path;
    int golden;                  /* 0: hand-made steps; 1: the engine on the golden prompts; 2: the same in a
                                    cache too small for both, preempting by swap */
    const kvp_session_request *reqs;
    int32_t nreq;
    kvp_session_result res[2];
    kvp_run_stats stats;
    float logits[STEPS][ROWS * VOCAB];
    int32_t rows[STEPS], tokens[STEPS][2];
    kvp_cuda_info info;
    int64_t followed;
    kvp_status st;
    char err[512];
} rank_job;

/* One rank: its shard on its own executor; rank 0 leads, the other follows (no asserts off the main thread). */
static void *rank_main(void *arg)
{
    rank_job *j = arg;
    kvp_model *m = NULL;
    const kvp_cuda_options o = opts_for_test();
    j->st = kvp_model_load_tp(j->path, j->comm, &m);
    if (j->st == KVP_OK && j->comm && kvp_comm_rank(j->comm) > 0) {
        j->st = kvp_cuda_follow(m, &o, &j->followed);
    } else if (j->st == KVP_OK && j->golden) {
        kvp_session_config cfg = kvp_session_config_default();
        cfg.engine.block_size = BS;
        cfg.engine.max_batched_tokens = MAX_TOKENS;
        cfg.engine.max_num_seqs = MAX_SEQS;
        cfg.engine.stop_at_eos = false;
        cfg.kv_dtype = KVP_DTYPE_F32;
        if (j->golden == 2) { /* 6 + 5 blocks wanted, 7 there: one story waits in host memory */
            cfg.num_blocks = 7;
            cfg.engine.preempt = KVP_PREEMPT_SWAP;
            cfg.swap_blocks = 8;
        }
        j->st = kvp_cuda_generate(m, &o, &cfg, j->reqs, j->nreq, j->res, &j->stats, NULL, NULL, &j->info);
    } else if (j->st == KVP_OK) {
        kvp_executor ex;
        j->st = kvp_cuda_executor_create(m, NULL, &o, NBLOCKS, BS, 0, KVP_DTYPE_F32, MAX_TOKENS, MAX_SEQS, &ex, &j->info);
        kvp_comm *comm = kvp_model_comm(m);
        if (j->st == KVP_OK && comm && kvp_comm_size(comm) > 1) { /* as kvp_cuda_session_create leads */
            const kvp_tp_shape shape = {NBLOCKS, BS, 0, KVP_DTYPE_F32, MAX_TOKENS, MAX_SEQS};
            j->st = kvp_tp_leader_create(kvp_comm_host(comm), &shape, ex, &ex);
        }
        if (j->st == KVP_OK) {
            j->st = run_steps(&ex, j->logits, j->rows, j->tokens);
            if (j->st != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_detail());
            kvp_executor_destroy(&ex); /* QUIT: the follower returns */
        }
    }
    if (j->st != KVP_OK && !j->err[0]) snprintf(j->err, sizeof j->err, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    return NULL;
}

/* tp ranks over nccl communicators on the fake (tp 1: no communicator, the whole model on one executor). */
static void run_ranks(int tp, const char *path, rank_job *jobs, int golden, const kvp_session_request *reqs,
                      int32_t nreq)
{
    kvp_comm *comms[MAXR] = {NULL};
    if (tp > 1) cr_assert_eq(kvp_comm_nccl_threads_create(tp, NULL, comms), KVP_OK, "%s", kvp_error_detail());
    pthread_t tid[MAXR];
    for (int r = 0; r < tp; r++) {
        jobs[r] = (rank_job){.comm = comms[r], .path = path, .golden = golden, .reqs = reqs, .nreq = nreq};
        cr_assert_eq(pthread_create(&tid[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < tp; r++) pthread_join(tid[r], NULL);
    for (int r = 0; r < tp; r++) kvp_comm_destroy(comms[r]);
    for (int r = 0; r < tp; r++) cr_assert_eq(jobs[r].st, KVP_OK, "tp %d rank %d: %s", tp, r, jobs[r].err);
}

/* tp ranks against one (one[0]) on the file at path: the logits rows within 1e-5, the same greedy tokens,
 * every follower through every plan, the collectives NCCL saw, each rank's share of the KV cache. */
static void check_split(int tp, const char *path, const rank_job *one)
{
    static rank_job jobs[MAXR];
    const int ar0 = fake_nccl_count("ncclAllReduce", 0), ag0 = fake_nccl_count("ncclAllGather", 0);
    const int arl = fake_nccl_count("ncclAllReduce", tp - 1);
    run_ranks(tp, path, jobs, 0, NULL, 0);
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        cr_assert_eq(jobs[0].rows[s], one->rows[s]);
        for (int64_t i = 0; i < (int64_t)one->rows[s] * VOCAB; i++) {
            const double d = fabs((double)jobs[0].logits[s][i] - one->logits[s][i]);
            cr_assert(isfinite(jobs[0].logits[s][i]), "tp %d step %d logit %lld is %g", tp, s, (long long)i,
                      jobs[0].logits[s][i]);
            worst = d > worst ? d : worst;
        }
        for (int i = 0; i < 2; i++)
            cr_assert_eq(jobs[0].tokens[s][i], one->tokens[s][i], "tp %d step %d sequence %d: greedy %d, one rank %d",
                         tp, s, i, jobs[0].tokens[s][i], one->tokens[s][i]);
    }
    fprintf(stderr, "cuda_tp: %s, tp %d against tp 1, %d steps (%d + %d x 2 logits rows): max |diff| %.3g\n", path, tp,
            STEPS, one->rows[0], STEPS - 1, worst);
    cr_assert(worst <= 1e-5, "%s: tp %d logits differ from one rank's by %.3g", path, tp, worst);
    for (int r = 1; r < tp; r++)
        cr_assert_eq(jobs[r].followed, STEPS, "tp %d rank %d ran %lld of %d plans", tp, r, (long long)jobs[r].followed,
                     STEPS);
    /* every step through NCCL: the embedding and 2 per layer summed, the LM head's slices gathered (the LM
     * head runs max_num_seqs rows at a time) */
    int chunks = 0;
    for (int s = 0; s < STEPS; s++) chunks += (one->rows[s] + MAX_SEQS - 1) / MAX_SEQS;
    cr_assert_eq(fake_nccl_count("ncclAllReduce", 0) - ar0, STEPS * (1 + 2 * LAYERS), "tp %d: %d all-reduces", tp,
                 fake_nccl_count("ncclAllReduce", 0) - ar0);
    cr_assert_eq(fake_nccl_count("ncclAllReduce", tp - 1) - arl, STEPS * (1 + 2 * LAYERS));
    cr_assert_eq(fake_nccl_count("ncclAllGather", 0) - ag0, chunks, "tp %d: %d all-gathers, %d LM head chunks", tp,
                 fake_nccl_count("ncclAllGather", 0) - ag0, chunks);
    /* 4 KV heads: 4 / tp of them per rank, one (replicated) past 4 ranks */
    const int64_t share = tp <= 4 ? tp : 4;
    cr_assert_eq(jobs[0].info.split.block_bytes * share, one->info.split.block_bytes, "tp %d", tp);
    cr_assert_lt(jobs[tp - 1].info.split.weights, one->info.split.weights, "a rank holds its shard, not the model");
    cr_assert_eq(fake_nccl_misuses(), 0, "%s", fake_nccl_last_misuse());
}

Test(cuda_tp, two_four_and_eight_ranks_give_one_ranks_logits_over_the_fake_nccl, .timeout = 600)
{
    require_emulator();
    fake_on(MAXR);
    static rank_job one[1], one_hf[1];
    run_ranks(1, GGUF, one, 0, NULL, 0);
    cr_assert_eq(fake_nccl_count("ncclAllReduce", -1) + fake_nccl_count("ncclAllGather", -1), 0,
                 "one rank made collectives");
    /* the story goes on as golden.json's: "Once upon a time" -> ",", "there"; BOS -> "Once" */
    cr_assert_eq(one[0].tokens[0][0], 432);
    cr_assert_eq(one[0].tokens[1][0], 383);
    cr_assert_eq(one[0].tokens[0][1], 403);
    check_split(2, GGUF, one);
    check_split(4, GGUF, one);
    check_split(8, GGUF, one); /* one query head a rank, each KV head on two ranks */
    run_ranks(1, HF, one_hf, 0, NULL, 0); /* the Hugging Face layout: rotate-half RoPE, its own loader path */
    check_split(2, HF, one_hf);
    kvp_nccl_api_set(NULL);
}

/* qwen3_moe (top 3 of 6 experts of 96 units, q/k norms, a dense layer 2) over 2 ranks: each rank routes every
 * row with the whole router and runs its 48 units of every expert; the all-reduce after the FFN sums them into
 * one rank's logits (within 1e-5) and greedy tokens. */
Test(cuda_tp, moe_experts_split_over_two_ranks_give_one_ranks_logits, .timeout = 600)
{
    require_emulator();
    fake_on(2);
    static char path[1100];
    snprintf(path, sizeof path, "%s", tu_moe_model(&(moe_spec){.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1}));
    static rank_job one[1];
    run_ranks(1, path, one, 0, NULL, 0);
    check_split(2, path, one);
    kvp_nccl_api_set(NULL);
}

Test(cuda_tp, two_ranks_tell_the_golden_stories_through_the_engine_also_swapping, .timeout = 600)
{
    require_emulator();
    fake_on(2);
    static tu_golden g;
    tu_golden_load(&g);
    cr_assert_eq(g.n, 2);
    enum { NGEN = 16 };
    kvp_session_request reqs[2];
    int32_t (*want)[512] = g.want; /* each story's first NGEN tokens are the ones checked */
    for (int i = 0; i < 2; i++) {
        cr_assert_geq(g.nwant[i], NGEN);
        reqs[i] = g.reqs[i];
        reqs[i].max_tokens = NGEN;
    }
    /* one rank's cumulative log-probabilities: the tokens of this small model survive errors the
     * log-probabilities show */
    static rank_job one[1], two[2];
    run_ranks(1, GGUF, one, 1, reqs, 2);
    for (int mode = 1; mode <= 2; mode++) { /* a cache for both; then one too small, swapping a story out */
        run_ranks(2, GGUF, two, mode, reqs, 2);
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(two[0].res[i].n_tokens[0], NGEN);
            for (int t = 0; t < NGEN; t++)
                cr_assert_eq(two[0].res[i].tokens[0][t], want[i][t], "mode %d story %d token %d: %d, golden %d", mode,
                             i, t, two[0].res[i].tokens[0][t], want[i][t]);
        }
        cr_assert_eq(two[1].followed, two[0].stats.steps, "rank 1 ran %lld of rank 0's %lld plans",
                     (long long)two[1].followed, (long long)two[0].stats.steps);
        for (int i = 0; i < 2; i++) {
            const double a = one[0].res[i].logprob[0], b = two[0].res[i].logprob[0];
            cr_assert(a < 0 && fabs(a - b) <= 1e-5 * fabs(a), "mode %d story %d: log-probability %.9g, one rank %.9g",
                      mode, i, b, a);
        }
        if (mode == 2) cr_assert_gt(two[0].stats.preemptions, 0, "7 blocks held both stories");
        kvp_session_results_free(two[0].res, 2);
    }
    kvp_session_results_free(one[0].res, 2);
    kvp_nccl_api_set(NULL);
}

/* Three seeded samples of one prompt share its blocks and copy the last on write: each rank copies its heads'
 * part; the samples' tokens and log-probabilities are one rank's. */
Test(cuda_tp, two_ranks_sample_in_parallel_with_copy_on_write, .timeout = 600)
{
    require_emulator();
    fake_on(2);
    kvp_session_request r = {.prompt = prompt0, .n_prompt = 5, .max_tokens = 10, .n = 3,
                             .sampler = kvp_sampler_default()};
    r.sampler.temperature = 1.0;
    r.sampler.seed = 7;
    static rank_job one[1], two[2];
    run_ranks(1, GGUF, one, 1, &r, 1);
    run_ranks(2, GGUF, two, 1, &r, 1);
    cr_assert_gt(two[0].stats.cow_copies, 0, "the samples shared no partly filled block");
    cr_assert_eq(two[0].stats.cow_copies, one[0].stats.cow_copies);
    int differ = 0;
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(two[0].res[0].n_tokens[k], one[0].res[0].n_tokens[k]);
        for (int t = 0; t < one[0].res[0].n_tokens[k]; t++) {
            cr_assert_eq(two[0].res[0].tokens[k][t], one[0].res[0].tokens[k][t], "sample %d token %d", k, t);
            differ |= k > 0 && one[0].res[0].tokens[k][t] != one[0].res[0].tokens[0][t];
        }
        const double a = one[0].res[0].logprob[k], b = two[0].res[0].logprob[k];
        cr_assert(a < 0 && fabs(a - b) <= 1e-5 * fabs(a), "sample %d: log-probability %.9g, one rank %.9g", k, b, a);
    }
    cr_assert(differ, "the three samples are one story: the seeds do not sample");
    kvp_session_results_free(one[0].res, 1);
    kvp_session_results_free(two[0].res, 1);
    kvp_nccl_api_set(NULL);
}

/* Splits the heads do not allow, a communicator without device memory, and the roles of the ranks. */
Test(cuda_tp, bad_splits_and_communicators_are_refused)
{
    require_emulator();
    fake_on(16);
    kvp_comm *c[16];
    kvp_model *m = NULL;
    /* 3 does not divide the 8 query heads; 16 ranks are more than the 8 heads allow */
    const int bad[2] = {3, 16};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(kvp_comm_nccl_threads_create(bad[k], NULL, c), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_model_load_tp(GGUF, c[0], &m), KVP_EINVAL);
        cr_assert_null(m);
        cr_assert(strstr(kvp_error_message(), "does not divide the 8 attention heads"), "%s", kvp_error_message());
        for (int r = 0; r < bad[k]; r++) kvp_comm_destroy(c[r]);
    }
    /* the threads communicator sums host memory: not the device's */
    cr_assert_eq(kvp_comm_threads_create(2, c), KVP_OK);
    cr_assert_eq(kvp_model_load_tp(GGUF, c[0], &m), KVP_OK, "%s", kvp_error_detail());
    const kvp_cuda_options o = opts_for_test();
    kvp_executor ex;
    cr_assert_eq(kvp_cuda_executor_create(m, NULL, &o, NBLOCKS, BS, 0, KVP_DTYPE_F32, MAX_TOKENS, MAX_SEQS, &ex, NULL),
                 KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "needs an nccl communicator"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cuda_follow(m, &o, NULL), KVP_EINVAL, "rank 0 does not follow");
    kvp_model_destroy(m);
    cr_assert_eq(kvp_model_load_tp(GGUF, c[1], &m), KVP_OK, "%s", kvp_error_detail());
    kvp_session_config cfg = kvp_session_config_default();
    kvp_session *s;
    cr_assert_eq(kvp_cuda_session_create(m, &o, &cfg, &s, NULL), KVP_ESTATE, "rank 1 does not schedule");
    kvp_model_destroy(m);
    kvp_comm_destroy(c[0]);
    kvp_comm_destroy(c[1]);
    kvp_nccl_api_set(NULL);
}

/* `kvpage generate --device cuda --tp 2` without mpirun (kvp_cmd_generate, runtime/executor/tp_threads.h): rank 1
 * a thread of this process with its own executor, NCCL (the fake) between the two; the golden story's first
 * 16 tokens, two ranks in the JSON, NCCL's all-reduces seen on rank 1 too. */
Test(cuda_tp, generate_tp_2_on_the_device_without_mpirun, .timeout = 600)
{
    require_emulator();
    fake_on(2);
    tu_golden g;
    tu_golden_load(&g);
    const int ar1 = fake_nccl_count("ncclAllReduce", 1);
    char *argv[] = {"generate", "--model", GGUF, "--prompt", "Once upon a time", "--max-tokens", "16", "--ignore-eos",
                    "--device", "cuda", "--tp", "2", "--kv-cache-memory", "1MiB", "--json", NULL};
    const cJSON *toks;
    cJSON *out = tu_generate_json(15, argv, &toks);
    cr_assert_eq(cJSON_GetArraySize(toks), 16);
    for (int j = 0; j < 16; j++)
        cr_assert_eq(cJSON_GetArrayItem(toks, j)->valueint, g.want[1][j], "token %d", j); /* "Once upon a time" */
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(out, "totals"), "tp")->valueint, 2);
    cJSON_Delete(out);
    cr_assert_gt(fake_nccl_count("ncclAllReduce", 1) - ar1, 16 * (1 + 2 * LAYERS) - 1, "rank 1 summed every step");
    cr_assert_eq(fake_nccl_misuses(), 0, "%s", fake_nccl_last_misuse());
    kvp_nccl_api_set(NULL);
}
