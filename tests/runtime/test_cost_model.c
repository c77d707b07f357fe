/* Cost model against step times computed by hand (see the comments next to each expected value). */
#include <criterion/criterion.h>
#include <math.h>

#include "runtime/executor/cost_model.h"

static kvp_cost_model toy(void)
{
    kvp_cost_model cm = {
        .num_layers = 2,
        .hidden_size = 4,
        .num_kv_heads = 2,
        .matmul_flops_per_token = 1e12,
        .lm_head_flops_per_seq = 1e11,
        .attn_flops_per_pair = 1e9,
        .dense_weight_bytes = 8e9,
        .kv_bytes_per_token = 1e6,
        .act_bytes = 2,
        .peak_flops = 1e15,
        .mem_bw = 1e12,
        .link_bw = 1e11,
        .tp = 1,
        .flops_efficiency = 1,
        .bw_efficiency = 1,
        .step_overhead_s = 1e-3,
        .allreduce_latency_s = 1e-5,
    };
    return cm;
}

#define NEAR(a, b) cr_assert(fabs((a) - (b)) <= 1e-9 * fmax(1.0, fabs(b)), "%s = %.12g, expected %.12g", #a, (a), (b))

Test(cost_model, decode_is_memory_bound_by_hand)
{
    kvp_cost_model cm = toy();
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_OK);
    kvp_step_shape s = {0};
    for (int i = 0; i < 4; i++) kvp_step_shape_add(&s, 1000, 1, 1);
    cr_assert_eq(s.new_tokens, 4);
    cr_assert_eq(s.kv_read_tokens, 4000);
    NEAR(s.attn_pairs, 4004.0); /* each decode token attends to 1000 + 1 keys */
    kvp_step_cost c;
    double t = kvp_cost_step_time(&cm, &s, &c);
    /* flops = 4 x 1e12 + 4 x 1e11 + 4004 x 1e9 = 8.404e12 -> 8.404 ms at 1e15 */
    NEAR(c.flops, 8.404e12);
    NEAR(c.compute_s, 8.404e-3);
    /* bytes = 8e9 weights + 1e6 x (4000 read + 4 written) = 12.004e9 -> 12.004 ms at 1e12 B/s */
    NEAR(c.bytes, 12.004e9);
    NEAR(c.memory_s, 12.004e-3);
    NEAR(c.comm_s, 0.0);
    NEAR(t, 12.004e-3 + 1e-3);
}

Test(cost_model, prefill_is_compute_bound_by_hand)
{
    kvp_cost_model cm = toy();
    kvp_step_shape s = {0};
    kvp_step_shape_add(&s, 0, 2000, 1);
    NEAR(s.attn_pairs, 2001000.0); /* 2000 x 2001 / 2 causal pairs */
    kvp_step_cost c;
    double t = kvp_cost_step_time(&cm, &s, &c);
    /* 2000 x 1e12 + 1e11 + 2.001e6 x 1e9 = 4.0011e15 flops -> 4.0011 s */
    NEAR(c.compute_s, 4.0011);
    NEAR(c.memory_s, (8e9 + 2000 * 1e6) / 1e12);
    NEAR(t, 4.0011 + 1e-3);

    /* A chunk after 500 cached tokens: 100 x 500 + 100 x 101 / 2 = 55050 pairs, not sampled */
    kvp_step_shape s2 = {0};
    kvp_step_shape_add(&s2, 500, 100, 0);
    NEAR(s2.attn_pairs, 55050.0);
    kvp_cost_step_time(&cm, &s2, &c);
    NEAR(c.flops, 100 * 1e12 + 55050 * 1e9);
}

Test(cost_model, tensor_parallel_divides_work_and_adds_allreduce)
{
    kvp_cost_model cm = toy();
    cm.tp = 2;
    kvp_step_shape s = {0};
    for (int i = 0; i < 4; i++) kvp_step_shape_add(&s, 1000, 1, 1);
    kvp_step_cost c;
    double t = kvp_cost_step_time(&cm, &s, &c);
    NEAR(c.compute_s, 8.404e-3 / 2);
    /* 2 KV heads over 2 ranks: one each, half the KV bytes per rank */
    NEAR(c.memory_s, (8e9 / 2 + 4.004e9 / 2) / 1e12);
    /* 2 all-reduces x 2 layers, each: 2 x (1/2) x (4 tokens x 4 hidden x 2 B) / 1e11 + 1e-5 */
    double one = 2.0 * 0.5 * 32.0 / 1e11 + 1e-5;
    NEAR(c.comm_s, 4 * one);
    NEAR(t, c.memory_s + 4 * one + 1e-3);

    /* tp = 4 > 2 KV heads: each rank keeps a whole head, so KV per rank is still half */
    cm.tp = 4;
    kvp_cost_step_time(&cm, &s, &c);
    NEAR(c.memory_s, (8e9 / 4 + 4.004e9 / 2) / 1e12);
    NEAR(kvp_cost_kv_bytes_per_token_per_rank(&cm), 0.5e6);
    NEAR(kvp_cost_weight_bytes_per_rank(&cm), 2e9);
}

Test(cost_model, moe_reads_only_touched_experts)
{
    kvp_cost_model cm = toy();
    cm.num_experts = 8;
    cm.experts_per_tok = 2;
    cm.expert_weight_bytes = 1e9;
    kvp_step_shape s = {0};
    kvp_step_shape_add(&s, 0, 1, 1); /* one token: 2 experts */
    kvp_step_cost c;
    kvp_cost_step_time(&cm, &s, &c);
    NEAR(c.bytes, 8e9 + 2e9 + 1e6);
    kvp_step_shape big = {0};
    for (int i = 0; i < 10; i++) kvp_step_shape_add(&big, 0, 1, 1); /* 20 > 8: every expert */
    kvp_cost_step_time(&cm, &big, &c);
    NEAR(c.bytes, 8e9 + 8e9 + 10e6);
    NEAR(kvp_cost_weight_bytes_per_rank(&cm), 16e9);
}

Test(cost_model, efficiency_and_empty_step)
{
    kvp_cost_model cm = toy();
    cm.bw_efficiency = 0.5;
    kvp_step_shape s = {0};
    kvp_step_cost c;
    NEAR(kvp_cost_step_time(&cm, &s, &c), 1e-3); /* empty: overhead only */
    kvp_step_shape_add(&s, 0, 1, 1);
    kvp_cost_step_time(&cm, &s, &c);
    NEAR(c.memory_s, (8e9 + 1e6) / 0.5e12);
}

Test(cost_model, validate_rejects_bad_numbers)
{
    kvp_cost_model cm = toy();
    cm.mem_bw = 0;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_EINVAL);
    cm = toy();
    cm.flops_efficiency = 1.5;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_EINVAL);
    cm = toy();
    cm.tp = 2;
    cm.link_bw = 0;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_EINVAL);
    cm = toy();
    cm.num_experts = 2;
    cm.experts_per_tok = 4;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_EINVAL);
}

/* Sliding window: half the layers read at most 600 keys per query. */
Test(cost_model, sliding_window_by_hand)
{
    kvp_cost_model cm = toy();
    cm.window = 600;
    cm.window_share = 0.5;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_OK);
    kvp_step_shape s = {.window = cm.window};
    for (int i = 0; i < 4; i++) kvp_step_shape_add(&s, 1000, 1, 1);
    cr_assert_eq(s.kv_read_win, 4 * 600);
    NEAR(s.attn_pairs_win, 4 * 600.0);
    kvp_step_cost c;
    kvp_cost_step_time(&cm, &s, &c);
    /* flops = 4e12 + 4e11 + 1e9 x (0.5 x 4004 + 0.5 x 2400) = 7.602e12 */
    NEAR(c.flops, 7.602e12);
    /* bytes = 8e9 + 1e6 x (0.5 x 4000 + 0.5 x 2400 + 4 written) = 11.204e9 */
    NEAR(c.bytes, 11.204e9);
    /* prefill of 2000 tokens: query v attends to min(v, 600) keys: 600 x 601 / 2 + 600 x 1400 */
    kvp_step_shape p = {.window = cm.window};
    kvp_step_shape_add(&p, 0, 2000, 1);
    NEAR(p.attn_pairs_win, 180300.0 + 840000.0);
    NEAR(p.attn_pairs, 2001000.0);
    /* a chunk that starts inside the window and ends beyond it: keys 501 .. 800 capped at 600 */
    kvp_step_shape q = {.window = cm.window};
    kvp_step_shape_add(&q, 500, 300, 0);
    NEAR(q.attn_pairs_win, (501.0 + 600.0) * 100 / 2 + 600.0 * 200);
    cr_assert_eq(q.kv_read_win, 500);
    /* short contexts are not affected: the same time as without a window */
    kvp_step_shape a = {.window = cm.window}, b = {0};
    kvp_step_shape_add(&a, 100, 1, 1);
    kvp_step_shape_add(&b, 100, 1, 1);
    kvp_cost_model nw = toy();
    NEAR(kvp_cost_step_time(&cm, &a, NULL), kvp_cost_step_time(&nw, &b, NULL));
    cm.window_share = 1.5;
    cr_assert_eq(kvp_cost_model_validate(&cm), KVP_EINVAL);
}

/* From real configs: Gemma-2 slides on half its layers (4096), Llama-3.1 has no window. */
Test(cost_model, sliding_window_from_configs)
{
    const kvp_gpu_profile *gpu;
    cr_assert_eq(kvp_gpu_profile_find("H200", &gpu), KVP_OK);
    kvp_model_config cfg;
    kvp_cost_model cm;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/derived/gemma2_9b.json", &cfg), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_cost_model_from_config(&cfg, gpu, 1, 2, &cm), KVP_OK);
    cr_assert_eq(cm.window, 4096);
    NEAR(cm.window_share, 0.5);
    /* a decode over 8000 tokens reads 8000 keys in the global layers and 4096 in the local ones */
    kvp_step_shape s = {.window = cm.window}, full = {0};
    kvp_step_shape_add(&s, 8000, 1, 1);
    kvp_step_shape_add(&full, 8000, 1, 1);
    kvp_step_cost cw, cf;
    kvp_cost_step_time(&cm, &s, &cw);
    kvp_cost_step_time(&cm, &full, &cf);
    NEAR(cf.bytes - cw.bytes, cm.kv_bytes_per_token * 0.5 * (8000 - 4096));
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/Meta-Llama-3.1-8B.json", &cfg), KVP_OK);
    cr_assert_eq(kvp_cost_model_from_config(&cfg, gpu, 1, 2, &cm), KVP_OK);
    cr_assert_eq(cm.window, 0);
    NEAR(cm.window_share, 0.0);
}

/* The all-reduce term takes NCCL's bus bandwidth for each interconnect (cost_model.c gives the sources):
 * NVLink 3 (A100 SXM) 12 x 20 GB/s, NVLink 4 (H100/H200 SXM) 18 x 20.6 GB/s, PCIe Gen4 / Gen5 x16 24 / 48
 * GB/s, never above the link's one-direction datasheet figure. */
Test(cost_model, nccl_bus_bandwidth_per_interconnect)
{
    static const struct {
        const char *gpu;
        double busbw;
    } want[] = {{"A100-40G", 240e9}, {"A100-80G", 240e9}, {"H100-SXM", 370.8e9},
                {"H200", 370.8e9},   {"A100-80G-PCIe", 24e9}, {"H100-PCIe", 48e9}};
    kvp_model_config cfg;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/Meta-Llama-3.1-70B.json", &cfg), KVP_OK, "%s", kvp_error_detail());
    int n = 0;
    const kvp_gpu_profile *all = kvp_gpu_profile_list(&n);
    cr_assert_eq(n, (int)(sizeof want / sizeof want[0]), "every profile has an interconnect figure");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kvp_gpu_profile *gpu;
        cr_assert_eq(kvp_gpu_profile_find(want[i].gpu, &gpu), KVP_OK);
        kvp_cost_model cm;
        cr_assert_eq(kvp_cost_model_from_config(&cfg, gpu, 8, 2, &cm), KVP_OK);
        NEAR(cm.link_bw, want[i].busbw);
        cr_assert_leq(cm.link_bw, gpu->nvlink_bw_bytes_s, "%s", gpu->name);
        cr_assert_str_eq(all[i].name, want[i].gpu);
    }
}

/* The communication share of a step (comm_s / total_s): Llama-3.1-70B decoding 64 sequences of 2048 tokens
 * over 8 GPUs, by hand: 2 all-reduces x 80 layers of 64 x 8192 bf16 (1 MiB), each 2 x 7/8 x 1 MiB / busbw
 * + 10 us: 2.39 ms on NVLink 4, most of it the 160 latencies, 7.72 ms on PCIe Gen5 (a larger share of a step that is also slower); none on 1 GPU. */
Test(cost_model, communication_share_of_a_tensor_parallel_step)
{
    kvp_model_config cfg;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/Meta-Llama-3.1-70B.json", &cfg), KVP_OK);
    const char *gpus[2] = {"H200", "H100-PCIe"};
    const double busbw[2] = {370.8e9, 48e9};
    double share[2], comm[2];
    for (int g = 0; g < 2; g++) {
        const kvp_gpu_profile *gpu;
        cr_assert_eq(kvp_gpu_profile_find(gpus[g], &gpu), KVP_OK);
        kvp_cost_model cm;
        cr_assert_eq(kvp_cost_model_from_config(&cfg, gpu, 8, 2, &cm), KVP_OK);
        kvp_step_shape s = {.window = cm.window};
        for (int i = 0; i < 64; i++) kvp_step_shape_add(&s, 2048, 1, 1);
        kvp_step_cost c;
        kvp_cost_step_time(&cm, &s, &c);
        const double one = 2.0 * 7.0 / 8.0 * (64.0 * 8192 * 2) / busbw[g] + KVP_COST_DEFAULT_ALLREDUCE_LATENCY_S;
        NEAR(c.comm_s, 2 * 80 * one);
        share[g] = c.comm_s / c.total_s;
        comm[g] = c.comm_s;
        cr_assert(share[g] > 0 && share[g] < 1, "%s: %g", gpus[g], share[g]);
        if (g == 0) {
            kvp_cost_model one_gpu;
            cr_assert_eq(kvp_cost_model_from_config(&cfg, gpu, 1, 2, &one_gpu), KVP_OK);
            kvp_cost_step_time(&one_gpu, &s, &c);
            cr_assert_eq(c.comm_s, 0);
        }
    }
    cr_assert(fabs(comm[0] - 2.3918e-3) < 1e-7 && fabs(comm[1] - 7.7167e-3) < 1e-7, "%g %g", comm[0], comm[1]);
    cr_assert_gt(share[1], share[0], "PCIe %g vs NVLink %g", share[1], share[0]);
}
