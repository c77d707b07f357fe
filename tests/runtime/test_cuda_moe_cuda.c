/* Mixture of experts on the cuda executor (kvp_cudev_moe_ffn, runtime/executor/cuda/cuda_dev.h): the layer
 * against a float64 reference of its definition written here (softmax routing, the k likeliest experts, SiLU
 * experts), with ties, experts whose rows fill several tiles, f32 and bf16 experts, and its replay from a CUDA
 * graph against eager runs; then mixtral and qwen3_moe checkpoints through the executor against the float64
 * forward pass of tests/runtime/reference_testutil.c and the CPU model's greedy tokens (graphs and eager), and
 * random MoE weights made on the device. Built by kvp_cuda_test: runtime_test_cuda_moe_emu on the CPU emulator
 * of CUDA (CI), runtime_test_cuda_moe natively (skipped without a device). */
#include "common/kvp_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/paged_kv.h"
#include "cuda_testutil.h"
#include "runtime/executor/cuda/cuda_dev.h"
#include "runtime/executor/cuda_executor.h"

/* The checkpoint writers, the float64 reference and the CPU model's greedy decoding, in this translation unit:
 * the standalone runner of kvp_test.h is one file. */
#include "checkpoint_testutil.c"
#include "forward_testutil.c"
#include "reference_testutil.c"

static float bf16_round(float x) { return kvp_bf16_to_f32(kvp_f32_to_bf16(x)); }

/* ---------------------------------------------------------------- the layer against its definition */

enum { MH = 40, MMAXE = 8, MMF = 24, MMAXT = 70 };

/* One row through the MoE FFN as Mixtral's and Qwen3-MoE's model cards define it, in float64: p = softmax(R x),
 * the k largest p (the lower expert first among equals), weights p (divided by their sum when norm), and
 * out = sum of weight * down_e(silu(gate_e x) * up_e x). bf: the experts' inputs rounded to bf16 as the device's
 * GEMMs round them (x, and each expert's activations). The picks into picks (k). */
static void ref_layer(const float *x, const float *R, const float *gu, const float *dn, int E, int k, int norm,
                      int bf, double *out, int *picks)
{
    double lg[MMAXE], p[MMAXE], mx = -INFINITY, sum = 0, wsum = 0;
    for (int e = 0; e < E; e++) {
        lg[e] = 0;
        for (int j = 0; j < MH; j++) lg[e] += (double)R[e * MH + j] * x[j];
        lg[e] = (float)lg[e]; /* the router's GEMM writes f32 logits */
        mx = lg[e] > mx ? lg[e] : mx;
    }
    for (int e = 0; e < E; e++) sum += p[e] = exp(lg[e] - mx);
    int used[MMAXE] = {0};
    double w[MMAXE];
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (b < 0 || lg[e] > lg[b])) b = e;
        used[b] = 1;
        picks[j] = b;
        w[j] = p[b] / sum;
        wsum += w[j];
    }
    for (int i = 0; i < MH; i++) out[i] = 0;
    for (int j = 0; j < k; j++) {
        const int e = picks[j];
        const float *G = gu + (size_t)e * 2 * MMF * MH, *U = G + MMF * MH, *D = dn + (size_t)e * MH * MMF;
        double a[MMF];
        for (int r = 0; r < MMF; r++) {
            double g = 0, u = 0;
            for (int c = 0; c < MH; c++) {
                const double xc = bf ? bf16_round(x[c]) : x[c];
                g += (double)G[r * MH + c] * xc;
                u += (double)U[r * MH + c] * xc;
            }
            a[r] = g / (1 + exp(-g)) * u;
            if (bf) a[r] = bf16_round((float)a[r]);
        }
        const double wt = norm ? w[j] / wsum : w[j];
        for (int i = 0; i < MH; i++) {
            double y = 0;
            for (int r = 0; r < MMF; r++) y += (double)D[i * MMF + r] * a[r];
            out[i] += wt * y;
        }
    }
}

/* T rows through kvp_cudev_moe_ffn with E experts, k per row, f32 or bf16 experts, against ref_layer, both
 * ways: the default (per-expert GEMMs from T k >= 16 E on, else the grouped tiled kernel) and the tiled kernel
 * forced (kvp_cudev_set_invariant_gemm), which under the emulator give the same bits. tie: every router row the
 * same (all logits equal: experts 0 .. k-1 must win). Returns the experts chosen as a bit set. */
static unsigned layer_case(int T, int E, int k, int norm, int bf, int tie)
{
    static float x[MMAXT * MH], R[MMAXE * MH], gu[MMAXE * 2 * MMF * MH], dn[MMAXE * MH * MMF], got[MMAXT * MH];
    static uint16_t gub[MMAXE * 2 * MMF * MH], dnb[MMAXE * MH * MMF];
    for (int i = 0; i < T * MH; i++) x[i] = frand();
    for (int i = 0; i < E * MH; i++) R[i] = tie ? 0.3f * frand() : frand();
    for (int e = 1; tie && e < E; e++) memcpy(R + e * MH, R, sizeof(float) * MH);
    for (int i = 0; i < E * 2 * MMF * MH; i++) gu[i] = 0.4f * frand();
    for (int i = 0; i < E * MH * MMF; i++) dn[i] = 0.4f * frand();
    if (bf) { /* the reference gets the rounded weights */
        for (int i = 0; i < E * 2 * MMF * MH; i++) gu[i] = bf16_round(gu[i]), gub[i] = kvp_f32_to_bf16(gu[i]);
        for (int i = 0; i < E * MH * MMF; i++) dn[i] = bf16_round(dn[i]), dnb[i] = kvp_f32_to_bf16(dn[i]);
    }
    const size_t es = bf ? 2 : 4, ws = kvp_cudev_moe_workspace_bytes(T, MH, E, k, MMF);
    float *dx = up(x, sizeof(float) * (size_t)(T * MH)), *dR = up(R, sizeof(float) * (size_t)(E * MH));
    void *dgu = up(bf ? (void *)gub : (void *)gu, es * (size_t)(E * 2 * MMF * MH));
    void *ddn = up(bf ? (void *)dnb : (void *)dn, es * (size_t)(E * MH * MMF));
    void *dws;
    cr_assert_eq(kvp_cudev_malloc(dev, &dws, ws, "ws"), KVP_OK);
    cr_assert_eq(kvp_cudev_memset(dev, dws, 0xFF, ws), KVP_OK); /* nothing may read what it did not write */
    float *dout;
    cr_assert_eq(kvp_cudev_malloc(dev, (void **)&dout, sizeof(float) * (size_t)(T * MH), "out"), KVP_OK);
    static float tiled[MMAXT * MH];
    for (int inv = 1; inv >= 0; inv--) { /* tiled into `tiled`, then the default into got */
        kvp_cudev_set_invariant_gemm(dev, inv);
        cr_assert_eq(kvp_cudev_moe_ffn(dev, dout, dx, dR, dgu, ddn, bf ? KVP_DTYPE_BF16 : KVP_DTYPE_F32, T, MH, E, k,
                                       MMF, norm, dws, ws),
                     KVP_OK, "%s", kvp_error_detail());
        down(inv ? tiled : got, dout, sizeof(float) * (size_t)(T * MH));
    }
    if (dev_info.emulated)
        cr_assert_eq(memcmp(tiled, got, sizeof(float) * (size_t)(T * MH)), 0, "T %d E %d k %d: the two ways differ", T,
                     E, k);
    unsigned chosen = 0;
    const double tol = bf ? 2e-3 : 1e-5;
    for (int t = 0; t < T; t++) {
        double want[MH];
        int picks[MMAXE];
        ref_layer(x + t * MH, R, gu, dn, E, k, norm, bf, want, picks);
        for (int j = 0; j < k; j++) chosen |= 1u << picks[j];
        if (tie)
            for (int j = 0; j < k; j++) cr_assert_eq(picks[j], j, "a tie goes to the lower expert");
        for (int i = 0; i < MH; i++)
            for (int w = 0; w < 2; w++) {
                const float g = (w ? tiled : got)[t * MH + i];
                cr_assert(fabs(g - want[i]) <= tol * (1 + fabs(want[i])),
                          "%s: T %d E %d k %d norm %d bf %d tie %d row %d [%d]: %.7g, want %.7g", w ? "tiled" : "default",
                          T, E, k, norm, bf, tie, t, i, g, want[i]);
            }
    }
    void *ps[] = {dx, dR, dgu, ddn, dws, dout};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(dev, ps[i]);
    return chosen;
}

/* Decode-sized and prefill-sized batches (70 rows of top 2 of 4: about 35 rows an expert, three tiles each, and
 * the per-expert GEMMs by default), renormalized or not, f32 and bf16 experts, and a router that cannot tell
 * the experts apart. */
Test(cuda_moe, layer_matches_a_float64_reference, .timeout = 600)
{
    open_dev();
    static const struct {
        int T, E, k, norm, bf, tie;
    } cases[] = {{1, 4, 2, 1, 0, 0},  {5, 6, 3, 0, 0, 0},  {37, 6, 3, 1, 0, 0}, {70, 4, 2, 1, 0, 0},
                 {70, 8, 1, 0, 0, 0}, {23, 6, 3, 0, 1, 0}, {9, 8, 8, 1, 0, 0},  {7, 5, 2, 0, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const unsigned chosen = layer_case(cases[i].T, cases[i].E, cases[i].k, cases[i].norm, cases[i].bf, cases[i].tie);
        if (cases[i].T >= 23 && !cases[i].tie)
            cr_assert_eq(chosen, (1u << cases[i].E) - 1, "case %zu: every expert should be chosen", i);
    }
    close_dev();
}

/* The limits are named, and a workspace too small is refused (nothing launched past it). */
Test(cuda_moe, unsupported_shapes_and_short_workspace_are_refused)
{
    open_dev();
    void *dws;
    const size_t ws = kvp_cudev_moe_workspace_bytes(4, MH, 4, 2, MMF);
    cr_assert_eq(kvp_cudev_malloc(dev, &dws, ws, "ws"), KVP_OK);
    float *p = dws;
    cr_assert_eq(kvp_cudev_moe_ffn(dev, p, p, p, p, p, KVP_DTYPE_F32, 4, MH, 4, 5, MMF, 0, dws, ws), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "per token"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cudev_moe_ffn(dev, p, p, p, p, p, KVP_DTYPE_F32, 4, MH, KVP_CUDEV_MOE_MAX_E + 1, 2, MMF, 0, dws, ws),
                 KVP_EUNSUPPORTED);
    cr_assert_eq(kvp_cudev_moe_ffn(dev, p, p, p, p, p, KVP_DTYPE_F16, 4, MH, 4, 2, MMF, 0, dws, ws), KVP_EUNSUPPORTED);
    cr_assert_eq(kvp_cudev_moe_ffn(dev, p, p, p, p, p, KVP_DTYPE_F32, 4, MH, 4, 2, MMF, 0, dws, ws - 1), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "workspace"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cudev_moe_workspace_bytes(0, MH, 4, 2, MMF), 0);
    kvp_cudev_free(dev, dws);
    close_dev();
}

/* The layer captured into a graph (nothing runs), then replayed over other inputs written into the same
 * buffers: each replay gives that input's eager result bit for bit (the routing and the tile layout are
 * recomputed on the device at every replay; the grouped GEMMs read the tile count there). */
Test(cuda_moe, graph_replay_matches_eager, .timeout = 600)
{
    open_dev();
    enum { T = 9, E = 6, K = 3 };
    static float x[3][T * MH], R[E * MH], gu[E * 2 * MMF * MH], dn[E * MH * MMF], eager[3][T * MH], got[T * MH];
    for (int i = 0; i < E * MH; i++) R[i] = frand();
    for (int i = 0; i < E * 2 * MMF * MH; i++) gu[i] = 0.4f * frand();
    for (int i = 0; i < E * MH * MMF; i++) dn[i] = 0.4f * frand();
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < T * MH; i++) x[v][i] = frand();
    const size_t ws = kvp_cudev_moe_workspace_bytes(T, MH, E, K, MMF);
    float *dx = up(x[0], sizeof x[0]), *dR = up(R, sizeof R), *dout;
    void *dgu = up(gu, sizeof gu), *ddn = up(dn, sizeof dn), *dws;
    cr_assert_eq(kvp_cudev_malloc(dev, &dws, ws, "ws"), KVP_OK);
    cr_assert_eq(kvp_cudev_malloc(dev, (void **)&dout, sizeof got, "out"), KVP_OK);
    for (int v = 0; v < 3; v++) {
        cr_assert_eq(kvp_cudev_copy(dev, dx, x[v], sizeof x[v], 0), KVP_OK);
        cr_assert_eq(kvp_cudev_moe_ffn(dev, dout, dx, dR, dgu, ddn, KVP_DTYPE_F32, T, MH, E, K, MMF, 1, dws, ws), KVP_OK,
                     "%s", kvp_error_detail());
        down(eager[v], dout, sizeof got);
    }
    cr_assert_neq(memcmp(eager[0], eager[1], sizeof got), 0);
    cr_assert_eq(kvp_cudev_memset(dev, dout, 0, sizeof got), KVP_OK);
    kvp_cudev_graph *g;
    cr_assert_eq(kvp_cudev_capture_begin(dev), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_cudev_moe_ffn(dev, dout, dx, dR, dgu, ddn, KVP_DTYPE_F32, T, MH, E, K, MMF, 1, dws, ws), KVP_OK,
                 "%s", kvp_error_detail());
    cr_assert_eq(kvp_cudev_capture_end(dev, &g), KVP_OK, "%s", kvp_error_detail());
    down(got, dout, sizeof got);
    for (int i = 0; i < T * MH; i++) cr_assert_eq(got[i], 0.0f, "the capture ran the layer");
    for (int v = 1; v >= 0; v--) { /* x[2] is in the buffer: replay over x[1], then x[0] */
        cr_assert_eq(kvp_cudev_copy(dev, dx, x[v], sizeof x[v], 0), KVP_OK);
        cr_assert_eq(kvp_cudev_graph_launch(dev, g), KVP_OK, "%s", kvp_error_detail());
        down(got, dout, sizeof got);
        cr_assert_eq(memcmp(got, eager[v], sizeof got), 0, "replay over input %d differs from its eager run", v);
    }
    kvp_cudev_graph_destroy(dev, g);
    void *ps[] = {dx, dR, dgu, ddn, dws, dout};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvp_cudev_free(dev, ps[i]);
    close_dev();
}

/* ---------------------------------------------------------------- MoE checkpoints through the executor */

/* The logits of every row of prompt tok (5 tokens, vocabulary 512) from one prefill step of ex. */
static void prompt5_step(kvp_executor *ex, const int32_t *tok, float *out)
{
    const int32_t pos[5] = {0, 1, 2, 3, 4}, qo[2] = {0, 5}, kvi[2] = {0, 1}, idx[1] = {2}, last[1] = {5};
    const int64_t slot[5] = {32, 33, 34, 35, 36};
    const uint8_t every[1] = {1};
    kvp_exec_seq seq = {.num_new = 5, .sample = 1, .tokens = tok};
    kvp_exec_batch b = {.seqs = &seq, .n = 1, .block_size = 16,
                        .flat = {.num_tokens = 5, .tokens = tok, .positions = pos, .slot_mapping = slot,
                                 .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last,
                                 .all_logits = every, .num_rows = 5}};
    kvp_exec_result r;
    cr_assert_eq(ex->step(ex->ctx, &b, &r), KVP_OK, "%s", kvp_error_detail());
    cr_assert(r.logits && r.vocab == 512);
    memcpy(out, r.logits, 5 * 512 * sizeof(float));
}

/* prompt5_step through a cuda executor over m (f32 weights). */
static void exec_prompt5(kvp_model *m, const int32_t *tok, float *out)
{
    kvp_cuda_options o = kvp_cuda_options_default();
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex;
    kvp_cuda_info info;
    cr_assert_eq(kvp_cuda_executor_create(m, NULL, &o, 0, 16, 0, KVP_DTYPE_F32, 64, 4, &ex, &info), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_eq(info.weights, KVP_DTYPE_F32, "an f32 checkpoint stays f32 on the device");
    prompt5_step(&ex, tok, out);
    kvp_executor_destroy(&ex);
}

/* greedy tokens of prompt through kvp_cuda_generate, with graphs or eagerly */
static void exec_greedy(kvp_model *m, const int32_t *prompt, int32_t np, int32_t n, int eager, int32_t *out)
{
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.block_size = 4;
    cfg.engine.max_batched_tokens = 64;
    cfg.engine.max_num_seqs = 4;
    cfg.kv_dtype = KVP_DTYPE_F32;
    cfg.engine.stop_at_eos = false;
    kvp_cuda_options o = kvp_cuda_options_default();
    o.enforce_eager = eager;
    o.kv_cache_memory = 1 << 20;
    kvp_session_request r = {.prompt = prompt, .n_prompt = np, .max_tokens = n, .sampler = kvp_sampler_default(),
                             .n = 1};
    kvp_session_result res;
    kvp_cuda_info info;
    cr_assert_eq(kvp_cuda_generate(m, &o, &cfg, &r, 1, &res, NULL, NULL, NULL, &info), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_eq(res.n_tokens[0], n);
    if (!eager) cr_assert(info.graphs_captured == info.graph_buckets && info.graph_replays == n - 1, "%d graphs, %lld replays",
                          info.graphs_captured, (long long)info.graph_replays);
    memcpy(out, res.tokens[0], sizeof(int32_t) * (size_t)n);
    kvp_session_results_free(&res, 1);
}

/* mixtral (top 2 of 4, renormalized) and qwen3_moe (top 3 of 6 experts of 96 units, with and without
 * norm_topk_prob, q/k norms, a dense layer 2), from HF folders and GGUFs: the executor's logits within 1e-4 of
 * the float64 reference (the CPU model's bar, test_model_moe.c), and the CPU model's 24 greedy tokens, with
 * graphs and eagerly. */
Test(cuda_moe, checkpoints_match_the_float64_reference_and_the_cpu_tokens, .timeout = 600)
{
    open_dev();
    close_dev();
    const moe_spec specs[] = {
        {.experts = 4, .k = 2, .mf = 172},
        {.gguf = 1, .experts = 4, .k = 2, .mf = 172},
        {.qwen = 1, .experts = 6, .k = 3, .mf = 96, .dense2 = 1},
        {.gguf = 1, .qwen = 1, .norm_topk = 1, .experts = 6, .k = 3, .mf = 96},
    };
    const int32_t toks[5] = {1, 403, 407, 261, 378};
    static double want[5 * 512];
    static float got[5 * 512];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ref_moe_spec_logits(&specs[i], toks, 5, want);
        kvp_model *m = tu_load(tu_moe_model(&specs[i]));
        exec_prompt5(m, toks, got);
        double worst = 0;
        for (int j = 0; j < 5 * 512; j++) {
            const double e = fabs(got[j] - want[j]) / (fabs(want[j]) + 1);
            worst = e > worst ? e : worst;
        }
        cr_assert_lt(worst, 1e-4, "case %zu: logits %.3g from the float64 reference", i, worst);
        int32_t cpu[25], gpu[24]; /* tu_greedy_one also writes the token after the last step */
        tu_greedy_one(m, 4, toks, 5, 5 + 24, 0, cpu);
        for (int eager = 0; eager < 2; eager++) {
            exec_greedy(m, toks, 5, 24, eager, gpu);
            for (int j = 0; j < 24; j++)
                cr_assert_eq(gpu[j], cpu[j], "case %zu eager %d token %d: %d, the cpu's %d", i, eager, j, gpu[j], cpu[j]);
        }
        kvp_model_destroy(m);
    }
}

/* --random-weights of a mixtral config (4 experts of 172 units, top 2): bf16 experts and an f32 router made on
 * the device, counted in the weights; the same seed gives the same logits, finite; shapes the device does not
 * run are refused. */
static void random_moe_logits(const kvp_model_config *cfg, uint64_t seed, float *out)
{
    kvp_cuda_options o = kvp_cuda_options_default();
    o.random_seed = seed;
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex;
    kvp_cuda_info info;
    cr_assert_eq(kvp_cuda_executor_create(NULL, cfg, &o, 0, 16, 0, KVP_DTYPE_BF16, 64, 4, &ex, &info), KVP_OK, "%s",
                 kvp_error_detail());
    const int64_t H = 64, E = 4, L = 5;
    /* bf16 matrices; f32 norms (2 a layer and the final one) and routers count twice their bf16 size */
    cr_assert_eq(info.split.weights, kvp_model_num_params(cfg) * 2 + 2 * H * (2 * L + 1) + 2 * E * H * L,
                 "%lld bytes of weights", (long long)info.split.weights);
    const int32_t tok[5] = {1, 403, 407, 261, 378};
    prompt5_step(&ex, tok, out);
    kvp_executor_destroy(&ex);
}

Test(cuda_moe, random_weights_of_a_mixtral_shape, .timeout = 600)
{
    open_dev();
    close_dev();
    kvp_model_config cfg;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", tu_moe_model(&(moe_spec){.experts = 4, .k = 2, .mf = 172}));
    cr_assert_eq(kvp_model_config_load(path, &cfg), KVP_OK, "%s", kvp_error_detail());
    cr_assert(cfg.num_experts == 4 && cfg.num_experts_per_tok == 2);
    static float a[5 * 512], b[5 * 512];
    random_moe_logits(&cfg, 7, a);
    random_moe_logits(&cfg, 7, b);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed gave other logits");
    for (int i = 0; i < 5 * 512; i++) cr_assert(isfinite(a[i]), "logit %d is %g", i, a[i]);
    kvp_cuda_options o = kvp_cuda_options_default();
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex;
    /* top 40 of 4; shared experts (deepseek); OPT's learned positions: refused, naming why */
    kvp_model_config bad[3] = {cfg, cfg, cfg};
    bad[0].num_experts_per_tok = 40;
    bad[1].num_shared_experts = 1;
    bad[2].family = KVP_FAMILY_OPT, bad[2].num_experts = 0;
    const char *why[3] = {"per token", "shared experts", "learned positions"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvp_cuda_executor_create(NULL, &bad[i], &o, 0, 16, 0, KVP_DTYPE_BF16, 64, 4, &ex, NULL),
                     KVP_EUNSUPPORTED, "case %d", i);
        cr_assert(strstr(kvp_error_message(), why[i]), "%s", kvp_error_message());
    }
}
