/* Mixture of experts (mixtral, qwen3_moe): equal experts give the golden story, distinct ones the float64
 * reference's logits, rows are batch-invariant, experts split over tensor-parallel ranks, and checkpoints that
 * disagree with their config are refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_testutil.h"
#include "common/alloc.h"
#include "common/json.h"
#include "forward_testutil.h"
#include "model_testutil.h"
#include "parallel/comm.h"
#include "reference_testutil.h"
#include "runtime/engine/sampler.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

/* Top-1 routing among experts that are all stories260K's FFN weighs the one chosen by exactly 1: the golden
 * story, token for token, from an HF mixtral folder and a GGUF (arch llama, stacked experts). */
Test(model, moe_top1_of_equal_experts_gives_the_golden_story_in_both_formats)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++) {
        kvp_model *m = tu_load(tu_moe_model(&(moe_spec){.gguf = g, .same = 1, .experts = 4, .k = 1, .mf = 172}));
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(c->family, KVP_FAMILY_MIXTRAL);
        cr_assert(c->num_experts == 4 && c->num_experts_per_tok == 1 && c->moe_norm_topk);
        cr_assert_eq(kvp_model_rope_style(m), g ? KVP_ROPE_PAIRS : KVP_ROPE_HALF);
        tu_check_golden(m, 16, 0);
        kvp_model_destroy(m);
    }
}

/* The MoE forward pass against the float64 reference above, on distinct experts and a router that spreads the
 * tokens: mixtral (top 2 of 4, renormalized), qwen3_moe (top 3 of 6 experts of 96 units, with and without
 * norm_topk_prob, q/k norms, a dense layer 2), each from an HF folder and a GGUF (llama with expert keys,
 * qwen3moe; GGUF has no dense layers in an MoE model). */
Test(model, moe_logits_match_a_float64_reference)
{
    tu_require_shared();
    const moe_spec specs[] = {
        {.experts = 4, .k = 2, .mf = 172},
        {.gguf = 1, .experts = 4, .k = 2, .mf = 172},
        {.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1},
        {.qwen = 1, .norm_topk = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1},
        {.gguf = 1, .qwen = 1, .norm_topk = 1, .experts = 6, .k = 3, .mf = 96},
    };
    const int32_t toks[5] = {1, 403, 407, 261, 378};
    static double want[5 * 512];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ref_moe_spec_logits(&specs[i], toks, 5, want);
        kvp_model *m = tu_load(tu_moe_model(&specs[i]));
        cr_assert_eq(kvp_model_cfg(m)->moe_norm_topk, !specs[i].qwen || specs[i].norm_topk, "case %zu", i);
        tu_expect_logits_near(m, want, i);
        kvp_model_destroy(m);
    }
}

/* An MoE model row for row: the same logits alone as in any batch, on 1 and 2 threads. */
Test(model, moe_rows_bit_identical_for_every_batch_size)
{
    kvp_model *m = tu_load(tu_moe_model(&(moe_spec){.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1}));
    static float ref[40 * 512];
    int have_ref = 0;
    tu_expect_batch_invariant(m, "qwen3_moe", ref, &have_ref);
    kvp_model_destroy(m);
}

typedef struct {
    kvp_comm *comm;
    const char *path;
    float logits[5 * 512];
    kvp_status st;
    char err[512];
} moe_rank;

static void *moe_rank_main(void *arg)
{
    moe_rank *j = arg;
    kvp_model *m = NULL;
    j->st = kvp_model_load_tp(j->path, j->comm, &m);
    if (j->st == KVP_OK) j->st = tu_forward_prompt5(m, j->logits);
    if (j->st != KVP_OK) snprintf(j->err, sizeof j->err, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    return NULL;
}

/* Tensor parallelism splits every expert's units over the ranks as a dense FFN's (the router on every rank):
 * at 2 and 4 rank threads every rank's logits are one rank's, up to the order of the sums. */
Test(model, moe_experts_split_over_ranks_give_one_ranks_logits)
{
    const char *path = tu_moe_model(&(moe_spec){.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1});
    static moe_rank jobs[4];
    static float one[5 * 512];
    for (int tp = 1; tp <= 4; tp *= 2) {
        kvp_comm *comms[4];
        pthread_t tid[4];
        cr_assert_eq(kvp_comm_threads_create(tp, comms), KVP_OK);
        for (int r = 0; r < tp; r++) {
            jobs[r].comm = comms[r], jobs[r].path = path;
            cr_assert_eq(pthread_create(&tid[r], NULL, moe_rank_main, &jobs[r]), 0);
        }
        for (int r = 0; r < tp; r++) pthread_join(tid[r], NULL);
        for (int r = 0; r < tp; r++) kvp_comm_destroy(comms[r]);
        for (int r = 0; r < tp; r++) {
            cr_assert_eq(jobs[r].st, KVP_OK, "tp %d rank %d: %s", tp, r, jobs[r].err);
            if (tp == 1) memcpy(one, jobs[0].logits, sizeof one);
            double e = tu_max_rel(jobs[r].logits, one, 5 * 512);
            cr_assert_lt(e, 1e-5, "tp %d rank %d: max relative logit error %g", tp, r, e);
        }
    }
}

/* Experts that disagree with the config, and expert counts out of range: an error naming file and problem. */
Test(model, moe_checkpoints_that_disagree_with_the_config_are_rejected)
{
    tu_require_shared();
    const moe_spec mix = {.experts = 4, .k = 2, .mf = 172};
    /* config.json names 5 experts, the folder holds 4 */
    char dir[400], cfg[500];
    snprintf(dir, sizeof dir, "%s", tu_moe_model(&mix));
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    size_t n;
    char *c = (char *)tu_read_all(cfg, &n);
    char *at = strstr(c, "\"num_local_experts\": 4");
    cr_assert_not_null(at);
    at[strlen("\"num_local_experts\": ")] = '5';
    tu_write_all(cfg, c, n);
    tu_expect_load_error(dir, KVP_EPARSE, "model.layers.0.block_sparse_moe.gate.weight", "[4, 64]", "[5, 64]",
                      "5 experts in config.json, 4 in the weights");
    at[strlen("\"num_local_experts\": ")] = '3';
    tu_write_all(cfg, c, n);
    tu_expect_load_error(dir, KVP_EPARSE, "model.layers.0.block_sparse_moe.gate.weight", "[4, 64]", "[3, 64]",
                      "3 experts in config.json, 4 in the weights");
    free(c);
    /* GGUF: more experts a token than experts; a stacked tensor of the wrong shape */
    const char *g = tu_moe_model(&(moe_spec){.gguf = 1, .experts = 4, .k = 2, .mf = 172});
    size_t len;
    unsigned char *buf = tu_read_all(g, &len);
    const uint32_t five = 5;
    tu_gguf_set_kv4(buf, len, "llama.expert_used_count", 4 /* UINT32 */, &five);
    char p[400];
    snprintf(p, sizeof p, "%s/used.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    tu_expect_load_error(p, KVP_EPARSE, "llama.expert_used_count", "5 is out of range (1..4)", NULL, "top 5 of 4");
    tu_gguf_set_kv4(buf, len, "llama.expert_used_count", 4, &(uint32_t){2});
    tu_gguf_set_kv4(buf, len, "llama.expert_count", 4, &(uint32_t){3});
    snprintf(p, sizeof p, "%s/count.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    tu_expect_load_error(p, KVP_EPARSE, "blk.0.ffn_gate_inp.weight", "[4, 64]", "[3, 64]", "3 experts, 4 stored");
    free(buf);
}

/* A dense llama GGUF whose converter wrote expert_count 0 and expert_used_count 0 is the dense model: the
 * golden story. qwen3moe with no experts is refused, naming the key. */
Test(model, moe_gguf_expert_count_zero_is_a_dense_llama)
{
    tu_require_shared();
    kvp_model *m = tu_load(tu_moe_model(&(moe_spec){.gguf = 1}));
    const kvp_model_config *c = kvp_model_cfg(m);
    cr_assert_eq(c->family, KVP_FAMILY_LLAMA);
    cr_assert_eq(c->num_experts, 0);
    tu_check_golden(m, 16, 0);
    kvp_model_destroy(m);
    const char *q = tu_moe_model(&(moe_spec){.gguf = 1, .qwen = 1, .experts = 4, .k = 2, .mf = 172});
    size_t len;
    unsigned char *buf = tu_read_all(q, &len);
    tu_gguf_set_kv4(buf, len, "qwen3moe.expert_count", 4 /* UINT32 */, &(uint32_t){0});
    char p[400];
    snprintf(p, sizeof p, "%s/none.gguf", tu_tmpdir());
    tu_write_all(p, buf, len);
    free(buf);
    tu_expect_load_error(p, KVP_EPARSE, "qwen3moe.expert_count", "0 is out of range (1..65536)", NULL, "qwen3moe, 0");
}

/* Every allocation of an MoE checkpoint's tu_load (router, experts) failing in turn: a clean ENOMEM, no leak
 * (the sanitizer build). */
Test(model, moe_load_survives_every_allocation_failure)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++)
        tu_every_alloc_failure("MoE model load", tu_load_model, tu_destroy_model,
                               (void *)tu_moe_model(&(moe_spec){.gguf = g, .experts = 4, .k = 2, .mf = 172}), 0);
}
