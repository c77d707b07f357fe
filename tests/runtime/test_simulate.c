/* End-to-end simulations (engine + block manager / arena + prefix cache + sim executor) with every
 * invariant walker run after every step, the workload sources of workload_synth.h, the capacity
 * derivation, and the `kvpage simulate` command line (exit codes, --json keys), also with the cpu executor
 * on stories260K. Reads ../shared/data and ../shared/models. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/json.h"
#include "runtime/planner/simulate.h"
#include "runtime/workload/workload_synth.h"

#include "cli_testutil.h"

#define OPT13B "../shared/data/configs/derived/opt-13b.json"
#define LLAMA8B "../shared/data/configs/Meta-Llama-3.1-8B.json"
#define LLAMA405B "../shared/data/configs/Meta-Llama-3.1-405B.json"
#define AZURE_CONV "../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
#define S260_GGUF "../shared/models/stories260K/stories260K.gguf"
#define S260_CONFIG "../shared/models/stories260K/hf/config.json"

static void load(const char *path, kvp_model_config *cfg)
{
    kvp_status st = kvp_model_config_load(path, cfg);
    cr_assert_eq(st, KVP_OK, "cannot read %s (is ../shared there?): %s", path, kvp_error_detail());
}

static double share_sum(const kvp_engine_metrics *m)
{
    return m->kv_token_states + m->kv_reserved + m->kv_internal_frag + m->kv_external_frag + m->kv_cached + m->kv_free;
}

/* Runs w with the given strategy on OPT-13B / A100-40G with kv_mem bytes of KV, checking every step. */
static kvp_engine_metrics run_checked(const kvp_workload *w, kvp_alloc_kind alloc, kvp_pc_kind cache,
                                      kvp_preempt_mode preempt, bool chunked, int64_t kv_mem)
{
    kvp_model_config cfg;
    load(OPT13B, &cfg);
    const kvp_gpu_profile *gpu;
    cr_assert_eq(kvp_gpu_profile_find("A100-40G", &gpu), KVP_OK);
    kvp_engine_config ec;
    kvp_engine_config_default(&ec);
    ec.alloc = alloc;
    ec.cache = cache;
    ec.preempt = preempt;
    ec.chunked_prefill = chunked;
    ec.max_model_len = 2048;
    ec.max_batched_tokens = chunked ? 512 : 2048;
    ec.check_every_step = true;
    ec.block_size = alloc == KVP_ALLOC_PAGED ? 16 : 1;
    kvp_sim_hw hw;
    kvp_sim_hw_default(&hw);
    hw.kv_mem_bytes = kv_mem;
    hw.swap_bytes = 1LL << 30;
    kvp_cost_model cm;
    kvp_sim_memory mem;
    cr_assert_eq(kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(mem.kv_bytes_per_token, 819200.0, "OPT-13B: 2 x 40 layers x 5120 x 2 bytes");
    cr_assert_eq(ec.kv_slots, kv_mem / 819200);
    kvp_engine_metrics m;
    kvp_status st = kvp_simulate(&ec, &cm, w, NULL, NULL, &m, NULL);
    cr_assert_eq(st, KVP_OK, "%s/%s: %s", kvp_alloc_kind_name(alloc), kvp_pc_kind_name(cache), kvp_error_detail());
    cr_assert_float_eq(share_sum(&m), 1.0, 1e-9, "shares of KV memory must sum to 1");
    cr_assert_eq(m.leaked_blocks, 0);
    cr_assert_eq(m.finished + m.rejected, m.requests);
    cr_assert_eq(m.finished, w->n);
    cr_assert_gt(m.sim_duration_s, 0);
    cr_assert_gt(m.throughput_tok_s, 0);
    cr_assert_leq(m.ttft_p50_s, m.ttft_p99_s);
    cr_assert_leq(m.tpot_p50_s, m.tpot_p99_s);
    int64_t missed = 0;
    for (int c = 0; c < KVP_MISS_CLASSES; c++) missed += c == KVP_MISS_PREEMPTED ? 0 : m.miss_tokens[c];
    if (cache != KVP_PC_NONE)
        cr_assert_eq(m.prefix_hit_tokens + m.host_hit_tokens + missed, m.admitted_prompt_tokens,
                     "hits %lld + host %lld + misses %lld of %lld prompt tokens", (long long)m.prefix_hit_tokens,
                     (long long)m.host_hit_tokens, (long long)missed, (long long)m.admitted_prompt_tokens);
    return m;
}

Test(simulate, every_strategy_end_to_end_with_accounting_checked_every_step)
{
    kvp_synth_opts o = {.kind = KVP_SYNTH_SHAREGPT, .num_requests = 120, .rate = INFINITY, .seed = 3, .max_total = 2048};
    kvp_workload *w;
    cr_assert_eq(kvp_workload_synth(&o, &w), KVP_OK);
    const int64_t kv = 3000LL * 819200; /* 3000 token slots: memory-bound */
    kvp_engine_metrics paged = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, false, kv);
    kvp_engine_metrics omax = run_checked(w, KVP_ALLOC_ORCA_MAX, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, false, kv);
    kvp_engine_metrics pow2 = run_checked(w, KVP_ALLOC_ORCA_POW2, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, false, kv);
    kvp_engine_metrics orac = run_checked(w, KVP_ALLOC_ORCA_ORACLE, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, false, kv);
    /* the ordering of the paper's Figure 2 */
    cr_assert_gt(paged.kv_util_in_use, 0.9, "paged: %.3f", paged.kv_util_in_use);
    cr_assert_gt(paged.kv_util_in_use, orac.kv_util_in_use);
    cr_assert_gt(orac.kv_util_in_use, pow2.kv_util_in_use);
    cr_assert_gt(pow2.kv_util_in_use, omax.kv_util_in_use);
    cr_assert_gt(paged.mean_running, orac.mean_running);
    cr_assert_gt(orac.mean_running, omax.mean_running);
    cr_assert_float_eq(orac.kv_internal_frag, 0, 1e-12, "Oracle never over-reserves");
    cr_assert_gt(omax.kv_internal_frag, 0.3);
    cr_assert_float_eq(paged.kv_reserved, 0, 1e-12);
    cr_assert_float_eq(paged.kv_external_frag, 0, 1e-12);
    cr_assert_gt(paged.preemptions, 0, "3000 slots for 120 queued requests must preempt");
    cr_assert_eq(omax.preemptions, 0);
    cr_assert_eq(paged.output_tokens, omax.output_tokens, "same requests, same tokens");
    kvp_engine_metrics chunked = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, true, kv);
    kvp_engine_metrics swap = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_NONE, KVP_PREEMPT_SWAP, true, kv);
    cr_assert_eq(chunked.output_tokens, paged.output_tokens);
    cr_assert_gt(swap.swap_outs, 0);
    cr_assert_eq(swap.swap_ins, swap.swap_outs);
    kvp_workload_destroy(w);
}

Test(simulate, prefix_workload_with_radix_and_hash_caches)
{
    kvp_workload *w;
    kvp_status st = kvp_workload_generate("system:n=60,prefix=512,suffix=64,rate=50,output=32,seed=2", &w);
    cr_assert_eq(st, KVP_OK, "%s", kvp_error_detail());
    kvp_engine_metrics none = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_NONE, KVP_PREEMPT_RECOMPUTE, true, 2000LL * 819200);
    kvp_engine_metrics radix = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_RADIX, KVP_PREEMPT_RECOMPUTE, true, 2000LL * 819200);
    kvp_engine_metrics hash = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_HASH, KVP_PREEMPT_SWAP, true, 2000LL * 819200);
    cr_assert_float_eq(none.prefix_hit_rate, 0, 1e-12);
    cr_assert_gt(radix.prefix_hit_rate, 0.5, "512 shared tokens of ~576: radix %.3f", radix.prefix_hit_rate);
    cr_assert_gt(hash.prefix_hit_rate, 0.5, "hash %.3f", hash.prefix_hit_rate);
    cr_assert_lt(radix.computed_tokens, none.computed_tokens, "hits must save prefill work");
    cr_assert_gt(radix.kv_shared_savings, 0);
    cr_assert_gt(radix.evicted_blocks, 0, "2000 slots cannot keep every distinct block");
    /* 40000 slots hold all of them: nothing is evicted during the run (the cache is emptied by the
     * end-of-run check, which does not count) */
    kvp_engine_metrics roomy = run_checked(w, KVP_ALLOC_PAGED, KVP_PC_RADIX, KVP_PREEMPT_RECOMPUTE, true, 40000LL * 819200);
    cr_assert_eq(roomy.evicted_blocks, 0);
    kvp_workload_destroy(w);
}

/* Every prompt token of a first admission is a hit, a host-tier hit, or a miss of exactly one class (the
 * preempted class counts what readmissions compute again, outside the prompt tokens), on every prefix workload, with and without a host tier, in memory small enough to evict and preempt; a block's
 * lifetime, idle time and reuse gap are measured in engine seconds. */
Test(simulate, miss_classes_and_hits_add_up_to_the_prompt_tokens)
{
    static const char *const specs[] = {"system:n=60,prefix=512,suffix=64,rate=50,output=32,seed=2",
                                        "chat:conversations=8,turns=4,rate=20,seed=3",
                                        "fewshot:n=60,tasks=4,rate=50,seed=4", "branch:n=60,depth=3,fanout=3,rate=50,seed=5"};
    kvp_model_config cfg;
    load(OPT13B, &cfg);
    const kvp_gpu_profile *gpu;
    cr_assert_eq(kvp_gpu_profile_find("A100-40G", &gpu), KVP_OK);
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int tier = 0; tier < 2; tier++) {
            kvp_workload *w;
            cr_assert_eq(kvp_workload_generate(specs[i], &w), KVP_OK, "%s", kvp_error_detail());
            kvp_engine_config ec;
            kvp_engine_config_default(&ec);
            ec.cache = KVP_PC_RADIX;
            ec.max_model_len = 4096;
            ec.max_batched_tokens = 1024;
            kvp_sim_hw hw;
            kvp_sim_hw_default(&hw);
            hw.kv_mem_bytes = 1500LL * 819200;
            hw.offload_bytes = tier ? 3000LL * 819200 : 0;
            kvp_cost_model cm;
            kvp_sim_memory mem;
            cr_assert_eq(kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem), KVP_OK, "%s", kvp_error_detail());
            kvp_engine_metrics m;
            cr_assert_eq(kvp_simulate(&ec, &cm, w, NULL, NULL, &m, NULL), KVP_OK, "%s: %s", specs[i], kvp_error_detail());
            int64_t missed = 0;
            for (int c = 0; c < KVP_MISS_CLASSES; c++) missed += c == KVP_MISS_PREEMPTED ? 0 : m.miss_tokens[c];
            cr_assert_eq(m.prefix_hit_tokens + m.host_hit_tokens + missed, m.admitted_prompt_tokens,
                         "%s, tier %d: hits %lld + host %lld + misses %lld of %lld prompt tokens", specs[i], tier,
                         (long long)m.prefix_hit_tokens, (long long)m.host_hit_tokens, (long long)missed,
                         (long long)m.admitted_prompt_tokens);
            cr_assert_gt(m.miss_tokens[KVP_MISS_COLD], 0, "%s: every workload starts cold", specs[i]);
            cr_assert_gt(m.prefix_hit_tokens, 0, "%s: the prefixes were meant to hit", specs[i]);
            cr_assert_gt(m.evicted_blocks, 0, "%s: the memory was meant to evict", specs[i]);
            cr_assert_gt(m.block_lifetime.n, 0, "%s", specs[i]);
            cr_assert_gt(m.block_lifetime.sum, 0, "%s: lifetimes in engine seconds", specs[i]);
            kvp_workload_destroy(w);
        }
}

Test(simulate, synthetic_lengths_match_the_paper_means)
{
    for (int k = 0; k < 2; k++) {
        kvp_synth_opts o = {.kind = k ? KVP_SYNTH_ALPACA : KVP_SYNTH_SHAREGPT, .num_requests = 20000, .rate = 4.0,
                            .seed = 11};
        kvp_workload *w;
        cr_assert_eq(kvp_workload_synth(&o, &w), KVP_OK);
        double in = 0, out = 0, want_in, want_out;
        kvp_synth_means(o.kind, &want_in, &want_out);
        for (int64_t i = 0; i < w->n; i++) {
            in += w->reqs[i].prompt_len;
            out += w->reqs[i].output_len;
            cr_assert_geq(w->reqs[i].prompt_len, 1);
            if (i > 0) cr_assert_geq(w->reqs[i].arrival_s, w->reqs[i - 1].arrival_s);
        }
        in /= (double)w->n;
        out /= (double)w->n;
        cr_assert(fabs(in / want_in - 1) < 0.05, "%s input mean %.2f vs %.2f", w->name, in, want_in);
        cr_assert(fabs(out / want_out - 1) < 0.05, "%s output mean %.2f vs %.2f", w->name, out, want_out);
        double rate = (double)(w->n - 1) / (w->reqs[w->n - 1].arrival_s - w->reqs[0].arrival_s);
        cr_assert(fabs(rate / 4.0 - 1) < 0.05, "Poisson rate %.3f", rate);
        /* different requests never share a first token: no accidental prefix hits */
        cr_assert_neq(w->reqs[0].tokens[0], w->reqs[1].tokens[0]);
        kvp_workload *w2;
        cr_assert_eq(kvp_workload_synth(&o, &w2), KVP_OK);
        cr_assert_eq(w2->reqs[777].prompt_len, w->reqs[777].prompt_len, "same seed, same workload");
        cr_assert_eq(w2->reqs[777].arrival_s, w->reqs[777].arrival_s);
        kvp_workload_destroy(w2);
        kvp_workload_destroy(w);
    }
    kvp_synth_opts bad = {.kind = KVP_SYNTH_SHAREGPT, .num_requests = 10, .rate = 0};
    kvp_workload *w;
    cr_assert_eq(kvp_workload_synth(&bad, &w), KVP_EINVAL);
    /* max_total bounds every request */
    kvp_synth_opts o = {.kind = KVP_SYNTH_SHAREGPT, .num_requests = 5000, .rate = 1, .seed = 1, .max_total = 512};
    cr_assert_eq(kvp_workload_synth(&o, &w), KVP_OK);
    for (int64_t i = 0; i < w->n; i++) cr_assert_leq(w->reqs[i].prompt_len + w->reqs[i].output_len, 512);
    kvp_workload_destroy(w);
    /* a max_total far below the means (almost no draw fits: redrawing forever hung) ends with shrunk pairs */
    for (int32_t mt = 2; mt <= 16; mt += 7) {
        o.max_total = mt;
        o.num_requests = 200;
        cr_assert_eq(kvp_workload_synth(&o, &w), KVP_OK);
        for (int64_t i = 0; i < w->n; i++) {
            cr_assert_leq(w->reqs[i].prompt_len + w->reqs[i].output_len, mt);
            cr_assert(w->reqs[i].prompt_len >= 1 && w->reqs[i].output_len >= 1);
        }
        kvp_workload_destroy(w);
    }
}

Test(simulate, azure_trace_reader_cut_and_rate)
{
    kvp_workload *w;
    kvp_status st = kvp_workload_read_azure(AZURE_CONV, 0, &w);
    cr_assert_eq(st, KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(w->n, 19366);
    cr_assert_eq(w->reqs[0].prompt_len, 374); /* first line: 2023-11-16 18:15:46.6805900,374,44 */
    cr_assert_eq(w->reqs[0].output_len, 44);
    cr_assert_float_eq(w->reqs[0].arrival_s, 0, 1e-12);
    cr_assert_float_eq(w->reqs[1].arrival_s, 50.9951690 - 46.6805900, 1e-6); /* 18:15:50.9951690 */
    cr_assert_gt(w->reqs[w->n - 1].arrival_s, 3000);
    kvp_workload *c;
    cr_assert_eq(kvp_workload_cut(w, 0, 60.0, &c), KVP_OK);
    cr_assert_gt(c->n, 10);
    cr_assert_lt(c->n, 1000);
    for (int64_t i = 0; i < c->n; i++) cr_assert_lt(c->reqs[i].arrival_s, 60.0);
    kvp_workload_destroy(c);
    cr_assert_eq(kvp_workload_cut(w, 100, 0, &c), KVP_OK);
    cr_assert_eq(c->n, 100);
    cr_assert_eq(kvp_workload_set_rate(c, 10.0), KVP_OK);
    cr_assert_float_eq(c->reqs[99].arrival_s - c->reqs[0].arrival_s, 99 / 10.0, 1e-9);
    cr_assert_eq(kvp_workload_set_rate(c, 0), KVP_EINVAL);
    cr_assert_eq(kvp_workload_set_rate(c, INFINITY), KVP_OK);
    cr_assert_float_eq(c->reqs[99].arrival_s, 0, 1e-12);
    kvp_workload_destroy(c);
    kvp_workload_destroy(w);

    cr_assert_eq(kvp_workload_read_azure("../shared/data/traces/no_such.csv", 0, &w), KVP_EIO);
    char path[] = "/tmp/kvp_azure_bad_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47,x,5\n");
    fclose(f);
    cr_assert_eq(kvp_workload_read_azure(path, 0, &w), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), ":3:") != NULL, "the error names line 3: %s", kvp_error_message());
    f = fopen(path, "w"); /* a NUL byte inside a number ("48\08") is not the number 48 */
    fwrite("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,48\0" "8,5\n", 1, 70, f);
    fclose(f);
    cr_assert_eq(kvp_workload_read_azure(path, 0, &w), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), ":2:") != NULL, "%s", kvp_error_message());
    remove(path);
}

/* --duration counts in the times --rate gives: 20 requests at 0.5 req/s leave about 5 in 10 s (all 20
 * were kept when the cut came before the rescaling); --num-requests picks the requests first. */
Test(simulate, duration_is_cut_after_the_rate)
{
    kvp_workload *w;
    cr_assert_eq(kvp_sim_load_workload(NULL, "system:n=20,prefix=48,suffix=8,output=16", 0, 10.0, 0.5, 0, 1, &w), KVP_OK,
                 "%s", kvp_error_detail());
    cr_assert(w->n >= 2 && w->n <= 12, "%lld requests in 10 s at 0.5 req/s", (long long)w->n);
    for (int64_t i = 0; i < w->n; i++) cr_assert_lt(w->reqs[i].arrival_s, 10.0);
    kvp_workload_destroy(w);
    cr_assert_eq(kvp_sim_load_workload(NULL, "system:n=20,prefix=48,suffix=8,output=16", 6, 0, 2.0, 0, 1, &w), KVP_OK);
    cr_assert_eq(w->n, 6);
    cr_assert_float_eq(5.0 / (w->reqs[5].arrival_s - w->reqs[0].arrival_s), 2.0, 1e-9, "the rate over the 6 kept");
    kvp_workload_destroy(w);
    /* parallel samples come last: --num-requests and --rate count requests */
    cr_assert_eq(kvp_sim_load_workload(NULL, "system:n=20,prefix=48,suffix=8,output=16", 6, 0, 2.0, 0, 3, &w), KVP_OK);
    cr_assert_eq(w->n, 18);
    cr_assert_float_eq(5.0 / (w->reqs[15].arrival_s - w->reqs[0].arrival_s), 2.0, 1e-9, "the rate over the 6 requests");
    cr_assert(w->reqs[16].after_prompt && w->reqs[16].after == 16);
    kvp_workload_destroy(w);
    cr_assert_eq(kvp_sim_load_workload(NULL, "system:n=20", 6, 0, 2.0, 0, 0, &w), KVP_EINVAL);
}

Test(simulate, capacity_and_models_that_do_not_fit)
{
    kvp_model_config cfg;
    load(LLAMA405B, &cfg);
    const kvp_gpu_profile *gpu;
    cr_assert_eq(kvp_gpu_profile_find("A100-40G", &gpu), KVP_OK);
    kvp_engine_config ec;
    kvp_engine_config_default(&ec);
    kvp_sim_hw hw;
    kvp_sim_hw_default(&hw);
    kvp_cost_model cm;
    kvp_sim_memory mem;
    cr_assert_eq(kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "does not fit") != NULL, "%s", kvp_error_message());
    cr_assert(strstr(kvp_error_message(), " by ") != NULL, "says by how much: %s", kvp_error_message());

    load(LLAMA8B, &cfg);
    cr_assert_eq(kvp_gpu_profile_find("H200", &gpu), KVP_OK);
    cr_assert_eq(kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(mem.kv_bytes_per_token, 131072.0);
    /* usable 0.9 x 143771 MiB, minus the weights and the activation reserve */
    cr_assert_float_eq(mem.kv_bytes, 0.9 * 143771.0 * 1048576.0 - mem.weight_bytes - mem.activation_bytes, 2.0);
    cr_assert_eq(ec.kv_slots, (int64_t)floor(mem.kv_bytes / 131072.0));
    /* the cost model from the config: one decode at context 1000, memory-bound, by hand:
     * streamed weights = (params - untied embedding) x 2 bytes, KV = 131072 x 1001 bytes, over 4.8 TB/s */
    int64_t P = kvp_model_num_params(&cfg);
    cr_assert_eq(P, 8030261248LL, "Llama-3.1-8B parameter count");
    double weights = (double)(P - 128256LL * 4096) * 2;
    kvp_step_shape s = {0};
    kvp_step_shape_add(&s, 1000, 1, 1);
    kvp_step_cost c;
    double t = kvp_cost_step_time(&cm, &s, &c);
    cr_assert_float_eq(c.memory_s, (weights + 131072.0 * 1001) / 4.8e12, 1e-12);
    cr_assert_float_eq(t, c.memory_s + 0.5e-3, 1e-12);
    cr_assert_lt(c.compute_s, c.memory_s);
    hw.tp = 3; /* does not divide 32 heads */
    cr_assert_eq(kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem), KVP_EINVAL);
}

/* ---- the command line (KVPAGE_BIN is set by CTest) */


Test(simulate_cli, json_has_every_documented_key)
{
    static char out[1 << 16];
    int rc = kvp_test_cli("simulate --model " LLAMA8B " --gpu h200 --trace " AZURE_CONV " --num-requests 200 --json", out,
                          sizeof out, NULL, 0);
    cr_assert_eq(rc, 0, "%s", out);
    cJSON *o;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
    static const char *keys[] = {"requests", "sim_duration_s", "throughput_tok_s", "req_per_s", "ttft_p50_s",
                                 "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "mean_running", "preemptions",
                                 "prefix_hit_rate", "kv_token_states", "kv_reserved", "kv_internal_frag",
                                 "kv_external_frag", "kv_free", "wall_s"};
    double sum = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        cr_assert(cJSON_IsNumber(v), "missing key %s", keys[i]);
        if (strncmp(keys[i], "kv_", 3) == 0) sum += v->valuedouble;
    }
    sum += cJSON_GetObjectItemCaseSensitive(o, "kv_cached")->valuedouble;
    cr_assert_float_eq(sum, 1.0, 1e-6);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "requests")->valuedouble, 200);
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "leaked_blocks")->valuedouble, 0);
    cJSON_Delete(o);
}

/* The all-reduce share of step time: none on one GPU; on four its time is the cost model's comm term and a
 * share strictly between 0 and 1, and it grows with the rank count (each rank computes less, the ring moves
 * 2 (N - 1) / N of the activations). */
Test(simulate_cli, tensor_parallel_reports_the_communication_share)
{
    static char out[1 << 16];
    double share[3];
    const char *runs[] = {"--tp 1", "--tp 2", "--tp 4"};
    for (int i = 0; i < 3; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "simulate --model " LLAMA8B " --gpu h200 %s --trace " AZURE_CONV " --num-requests 100 --json",
                 runs[i]);
        int rc = kvp_test_cli(cmd, out, sizeof out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", cmd, out);
        cJSON *o;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "comm_share");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "comm_s");
        cr_assert(cJSON_IsNumber(c) && cJSON_IsNumber(s), "%s: no comm_share / comm_s", cmd);
        share[i] = c->valuedouble;
        if (i == 0) cr_assert_eq(s->valuedouble, 0, "one GPU has no all-reduce");
        else cr_assert(share[i] > 0 && share[i] < 1, "%s: share %g", cmd, share[i]);
        cJSON_Delete(o);
    }
    cr_assert_eq(share[0], 0);
    cr_assert_lt(share[1], share[2], "tp 2 %g vs tp 4 %g", share[1], share[2]);
}

/* A chat whose history does not stay in 2 GB of KV memory: a host tier brings back what the device cache
 * lost. Device and host hits together reach the hit rate of a KV memory that keeps everything, written
 * through or back; write-back copies fewer blocks, on the steps' time. Written through selectively, the
 * tier gets only reused blocks (fewer still, off the steps' time) and brings back less. */
Test(simulate_cli, a_host_tier_restores_what_the_device_cache_lost)
{
    static char out[1 << 16];
    double rate[5], host[5], loaded[5], stored[5], sync[5];
    const char *runs[5] = {"--kv-mem 2GB", "--kv-mem 2GB --kv-offloading-size 64GiB", "--kv-mem 100GB",
                           "--kv-mem 2GB --kv-offloading-size 64GiB --kv-offloading-policy write_back",
                           "--kv-mem 2GB --kv-offloading-size 64GiB --kv-offloading-policy write_through_selective"};
    static const char *const policy[5] = {"write_through", "write_through", "write_through", "write_back",
                                          "write_through_selective"};
    for (int i = 0; i < 5; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "simulate --model " LLAMA8B " --workload chat --cache radix --json %s", runs[i]);
        int rc = kvp_test_cli(cmd, out, sizeof out, NULL, 0);
        cr_assert_eq(rc, 0, "%s: %s", runs[i], out);
        cJSON *o;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
        const char *keys[] = {"prefix_hit_rate", "prefix_host_hit_rate", "host_loaded_blocks", "host_stored_blocks",
                              "host_cache_tokens", "host_store_backlog_max_s", "host_store_sync_s"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            cr_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, keys[k])), "missing key %s", keys[k]);
        rate[i] = cJSON_GetObjectItemCaseSensitive(o, "prefix_hit_rate")->valuedouble;
        host[i] = cJSON_GetObjectItemCaseSensitive(o, "prefix_host_hit_rate")->valuedouble;
        loaded[i] = cJSON_GetObjectItemCaseSensitive(o, "host_loaded_blocks")->valuedouble;
        stored[i] = cJSON_GetObjectItemCaseSensitive(o, "host_stored_blocks")->valuedouble;
        sync[i] = cJSON_GetObjectItemCaseSensitive(o, "host_store_sync_s")->valuedouble;
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(o, "host_write_policy")->valuestring, policy[i]);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "leaked_blocks")->valuedouble, 0);
        cJSON_Delete(o);
    }
    cr_assert(host[0] == 0 && loaded[0] == 0 && host[2] == 0);
    cr_assert_lt(rate[0] + 0.1, rate[2], "2 GB was meant to lose hits: %.3f vs %.3f", rate[0], rate[2]);
    cr_assert_gt(loaded[1], 0);
    cr_assert_float_eq(rate[1] + host[1], rate[2], 0.01, "device %.4f + host %.4f vs %.4f", rate[1], host[1], rate[2]);
    cr_assert_float_eq(rate[3] + host[3], rate[2], 0.01, "write-back: device %.4f + host %.4f vs %.4f", rate[3], host[3], rate[2]);
    cr_assert_lt(stored[3], stored[1], "write-back stores fewer blocks");
    cr_assert(sync[1] == 0 && sync[3] > 0, "write-back stores are on the steps' time: %g %g", sync[1], sync[3]);
    cr_assert(stored[4] > 0 && stored[4] < stored[3], "selective stores fewer still: %g vs %g", stored[4], stored[3]);
    cr_assert(host[4] > 0 && host[4] < host[1], "and brings back less: %.4f vs %.4f", host[4], host[1]);
    cr_assert_eq(sync[4], 0, "selective stores are in the background");
}

/* --n: every request fans out into n sequences; with a prefix cache they share the prompt's full blocks
 * (saved memory, prompt tokens found cached), without one they do not. */
Test(simulate_cli, parallel_samples_share_the_prompt_with_a_cache)
{
    static char out[1 << 16];
    double saved[2], hits[2];
    for (int cache = 0; cache < 2; cache++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "simulate --model " LLAMA8B " --workload alpaca:n=50 --rate inf --n 3 --json%s",
                 cache ? " --cache radix" : "");
        int rc = kvp_test_cli(cmd, out, sizeof out, NULL, 0);
        cr_assert_eq(rc, 0, "%s", out);
        cJSON *o;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "n")->valuedouble, 3);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "requests")->valuedouble, 150, "sequences");
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "finished")->valuedouble, 150);
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(o, "leaked_blocks")->valuedouble, 0);
        saved[cache] = cJSON_GetObjectItemCaseSensitive(o, "kv_shared_savings")->valuedouble;
        hits[cache] = cJSON_GetObjectItemCaseSensitive(o, "prefix_hit_rate")->valuedouble;
        cJSON_Delete(o);
    }
    cr_assert(saved[0] == 0 && hits[0] == 0, "nothing shared without a cache: %g %g", saved[0], hits[0]);
    cr_assert(saved[1] > 0 && hits[1] > 0, "the samples share the prompt: %g %g", saved[1], hits[1]);
}

static void sort_up(double *v, int n) /* insertion sort */
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
}

/* With --n the summary gives whole requests' latencies: TTFT to a request's first sample's first token, E2E to
 * its last sample's finish. Recomputed here from the --requests-out rows (request g's samples are rows
 * 3g .. 3g + 2): the median of 40 is the mean of the middle two, p99 sits 0.61 of the way from the 39th to
 * the 40th. */
Test(simulate_cli, request_latencies_of_parallel_samples_match_their_rows)
{
    static char out[1 << 16], err[4096];
    char path[] = "/tmp/kvp_nreq_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char args[512];
    snprintf(args, sizeof args, "simulate --model " LLAMA8B " --workload alpaca:n=40 --rate 20 --n 3 --cache radix "
             "--json --requests-out %s", path);
    cr_assert_eq(kvp_test_cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cJSON *o;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char line[1024];
    cr_assert_not_null(fgets(line, sizeof line, f));
    double ttft[40], e2e[40];
    for (int g = 0; g < 40; g++) ttft[g] = INFINITY, e2e[g] = -INFINITY;
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        long long id;
        double arr, adm, first, fin;
        char state[16];
        int k = sscanf(line, "%lld,%lf,%*d,%*d,%15[a-z],%*d,%*d,%lf,%lf,%lf", &id, &arr, state, &adm, &first, &fin);
        cr_assert_eq(k, 6, "%s", line);
        cr_assert(id == rows && id < 120 && strcmp(state, "finished") == 0, "%s", line);
        const int g = (int)(id / 3);
        ttft[g] = first - arr < ttft[g] ? first - arr : ttft[g];
        e2e[g] = fin - arr > e2e[g] ? fin - arr : e2e[g];
        rows++;
    }
    fclose(f);
    unlink(path);
    cr_assert_eq(rows, 120);
    sort_up(ttft, 40);
    sort_up(e2e, 40);
    cr_assert_float_eq(kvp_test_num(o, "request_ttft_p50_s"), (ttft[19] + ttft[20]) / 2, 1e-6);
    cr_assert_float_eq(kvp_test_num(o, "request_e2e_p50_s"), (e2e[19] + e2e[20]) / 2, 1e-6);
    cr_assert_float_eq(kvp_test_num(o, "request_ttft_p99_s"), ttft[38] + 0.61 * (ttft[39] - ttft[38]), 1e-6);
    cr_assert_float_eq(kvp_test_num(o, "request_e2e_p99_s"), e2e[38] + 0.61 * (e2e[39] - e2e[38]), 1e-6);
    cr_assert_gt(kvp_test_num(o, "request_e2e_p50_s"), kvp_test_num(o, "request_ttft_p50_s"));
    cJSON_Delete(o);
}

Test(simulate_cli, bad_input_is_one_error_line_and_exit_2)
{
    static char out[1 << 14], err[4096];
    struct {
        const char *args, *needle;
    } cases[] = {
        {"simulate --model " LLAMA8B " --workload sharegpt --rate 1 --bogus", "unknown option"},
        {"simulate --model " LLAMA8B " --workload sharegpt --rate 0", "rate"},
        {"simulate --model " LLAMA8B " --trace ../shared/data/traces/nope.csv", "nope.csv"},
        {"simulate --model " LLAMA405B " --gpu A100-40G --workload sharegpt --rate 1", "does not fit"},
        {"simulate --model " LLAMA8B " --gpu V100 --workload sharegpt --rate 1", "V100"},
        {"simulate --model " LLAMA8B " --workload sharegpt --rate 1 --alloc buddy", "buddy"},
        {"simulate --model " LLAMA8B " --workload sharegpt --rate 1 --alloc orca-pow2 --arena best-fit", "--arena: "},
        {"simulate --model " LLAMA8B, "exactly one"},
        {"simulate --model " LLAMA8B " --workload nosuch --rate 1", "expected sharegpt, alpaca, system"},
        {"simulate --model " LLAMA8B " --workload sharegpt --rate 1 --no-chunked-prefill --max-batched-tokens 512",
         "--max-batched-tokens 512 is below max_model_len"},
        {"simulate --model " LLAMA8B " --workload sharegpt:n=0 --rate 1", "workload 'sharegpt:n=0': n: "},
        {"simulate --model " LLAMA8B " --workload alpaca:n=1000000000 --rate 1", "out of range [1, 10000000]"},
        {"simulate --model " LLAMA8B " --workload system:share=2 --rate 1", "workload system: share: 2 is out of range"},
        {"simulate --model " LLAMA8B " --trace " AZURE_CONV " --rate 1e-300", "--rate: 1e-300 is out of range"},
        {"simulate --model " LLAMA8B " --trace " AZURE_CONV " --kv-mem 1GB --watermark-blocks 7000", "watermark_blocks 7000"},
        {"simulate --model " LLAMA8B " --trace /tmp/kvp_test_huge_ctx.csv", "kvp_test_huge_ctx.csv:2: ContextTokens"},
        {"simulate --model " LLAMA8B " --workload chat --kv-offloading-size 4GiB", "give --cache radix or hash"},
        {"simulate --model " LLAMA8B " --workload chat --cache radix --kv-offloading-size 4Q", "--kv-offloading-size: "},
        {"simulate --model " LLAMA8B " --workload chat --cache radix --kv-offloading-size 1MB", "holds no block of 16 tokens"},
        {"simulate --model " LLAMA8B " --workload chat --cache radix --kv-offloading-size 4GiB --kv-offloading-policy write_around",
         "'write_around'"},
        {"simulate --model " LLAMA8B " --workload chat --cache radix --kv-offloading-policy write_back", "needs a host tier"},
        {"simulate --model " LLAMA8B " --workload alpaca --rate 1 --n 0", "--n: 0 is out of range"},
        {"simulate --model " LLAMA8B " --trace " AZURE_CONV " --n 1024", "the parallel samples' prompt token ids"},
    };
    FILE *f = fopen("/tmp/kvp_test_huge_ctx.csv", "w"); /* a 2e9-token prompt: refused before its tokens are made */
    cr_assert_not_null(f);
    fputs("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,2000000000,10\n", f);
    fclose(f);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kvp_test_cli(cases[i].args, out, sizeof out, err, sizeof err);
        cr_assert_eq(rc, 2, "'%s' exited %d", cases[i].args, rc);
        cr_assert(strstr(err, cases[i].needle) != NULL, "'%s': stderr '%s' lacks '%s'", cases[i].args, err,
                  cases[i].needle);
        cr_assert(strstr(err, "error:") != NULL);
        char *nl = strchr(err, '\n');
        cr_assert(nl != NULL && nl[1] == '\0', "one line: '%s'", err);
        cr_assert_eq(out[0], '\0', "nothing on stdout");
    }
    unlink("/tmp/kvp_test_huge_ctx.csv");
    int rc = kvp_test_cli("simulate --help", out, sizeof out, NULL, 0);
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "--max-batched-tokens") != NULL);
}

/* The cpu executor runs stories260K under the same scheduler: with every request there at t = 0 no
 * decision depends on step times, so with the same capacity (an f16 cache: the config's 2-byte KV) it
 * must make the same schedule as the cost model, preemptions, prefix hits and evictions included; the
 * prefix hits also show that mapping the workload's ids into the model's vocabulary kept them shared. */
Test(simulate_cli, cpu_executor_makes_the_cost_model_schedule)
{
    static char out[1 << 16];
    static const char *keys[] = {"finished", "steps", "preemptions", "swap_outs", "prefix_hit_rate", "evicted_blocks",
                                 "kv_capacity_tokens"};
    const struct {
        const char *mem, *preempt;
        int preempts;
    } runs[] = {{"300KB", "recompute", 0}, {"100KB", "recompute", 1}, {"100KB", "swap", 1}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        cJSON *o[2];
        for (int cpu = 0; cpu < 2; cpu++) {
            char args[1024];
            snprintf(args, sizeof args,
                     "simulate %s --workload system:n=24,prefix=64,suffix=16,output=16 --rate inf --cache radix "
                     "--watermark-blocks 0 --max-num-seqs 4 --kv-mem %s --preempt %s --swap-space 1MB --json%s",
                     cpu ? "--executor cpu --kv-dtype f16 --threads 2 --model " S260_GGUF : "--model " S260_CONFIG,
                     runs[k].mem, runs[k].preempt, cpu ? " --check" : "");
            int rc = kvp_test_cli(args, out, sizeof out, NULL, 0);
            cr_assert_eq(rc, 0, "%s: exit %d\n%s", args, rc, out);
            cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o[cpu]), KVP_OK, "%s", out);
        }
        const cJSON *ex = cJSON_GetObjectItemCaseSensitive(o[1], "executor");
        cr_assert(cJSON_IsString(ex) && strcmp(ex->valuestring, "cpu") == 0);
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            cr_assert_eq(kvp_test_num(o[1], keys[i]), kvp_test_num(o[0], keys[i]), "%s %s: %s cpu %g, sim %g",
                         runs[k].mem, runs[k].preempt, keys[i], kvp_test_num(o[1], keys[i]), kvp_test_num(o[0], keys[i]));
        cr_assert_eq(kvp_test_num(o[1], "finished"), 24);
        cr_assert_eq(kvp_test_num(o[1], "leaked_blocks"), 0);
        cr_assert_gt(kvp_test_num(o[1], "prefix_hit_rate"), 0.5);
        if (runs[k].preempts) cr_assert_gt(kvp_test_num(o[1], "preemptions"), 0, "%s was meant to preempt", runs[k].mem);
        if (runs[k].preempts && runs[k].preempt[0] == 's') cr_assert_gt(kvp_test_num(o[1], "swap_outs"), 0);
        cJSON_Delete(o[0]);
        cJSON_Delete(o[1]);
    }
}

Test(simulate_cli, cpu_executor_bad_input)
{
    static const kvp_cli_case cases[] = {
        {"--executor gpu --model " S260_GGUF, "unknown executor 'gpu'"},
        {"--executor cpu --model " S260_GGUF " --gpu H200", "--gpu applies to --executor sim only"},
        {"--model " S260_CONFIG " --threads 2", "--threads applies to --executor cpu only"},
        {"--executor cpu --model " S260_CONFIG, "give a GGUF file or a Hugging Face folder"},
        {"--executor cpu --model " S260_GGUF " --alloc orca-max", "needs --executor sim"},
        {"--executor cpu --model " S260_GGUF " --max-model-len 5000", "exceeds the context"},
        {"--executor cpu --model " S260_GGUF " --kv-mem 1KB", "holds no block"},
        {"--executor cpu --model " S260_GGUF " --kv-dtype f8", "unknown KV cache dtype 'f8'"},
        {"--executor cpu --model ../shared/models/nope.gguf", "nope.gguf"},
    };
    kvp_test_cli_rejects("simulate --workload system:n=4 --rate inf", cases, sizeof cases / sizeof cases[0]);
}

/* --requests-out: one CSV row per request whose figures agree with the run's summary (the hit tokens sum
 * to the hit rate's numerator, the TTFT median is the summary's p50); --steps-out: one row per step, also
 * agreeing with it; an unwritable path fails before the run without touching anything. */
Test(simulate_cli, requests_and_steps_out_rows_agree_with_the_summary)
{
    static char out[1 << 16], err[4096];
    char dir[] = "/tmp/kvp_reqout_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], args[1024];
    snprintf(path, sizeof path, "%s/req.csv", dir);
    char spath[256];
    snprintf(spath, sizeof spath, "%s/steps.csv", dir);
    snprintf(args, sizeof args, "simulate --model " LLAMA8B " --workload chat:conversations=12,turns=4 --cache radix "
             "--kv-mem 256MB --json --requests-out %s --steps-out %s", path, spath); /* 17 preemptions */
    int rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cJSON *o;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s not written", path);
    char line[1024];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_eq(strncmp(line, "id,arrival_s,prompt_len,output_len,state,cached_tokens,", 55), 0, "header: %s", line);
    double ttft[64], prompt = 0, cached = 0;
    int n = 0, preempted = 0;
    while (fgets(line, sizeof line, f)) {
        long long id;
        double arr, adm, first, fin, t, e2e;
        int pl, ol, ct, pre;
        char state[16];
        int k = sscanf(line, "%lld,%lf,%d,%d,%15[a-z],%d,%d,%lf,%lf,%lf,%lf,%*[^,],%lf", &id, &arr, &pl, &ol, state, &ct,
                       &pre, &adm, &first, &fin, &t, &e2e);
        cr_assert_eq(k, 12, "row %d: %s", n, line);
        cr_assert_str_eq(state, "finished");
        cr_assert(arr <= adm && adm < first && first <= fin, "row %d times out of order: %s", n, line);
        cr_assert_float_eq(t, first - arr, 1e-6);
        cr_assert_float_eq(e2e, fin - arr, 1e-6);
        cr_assert(ct >= 0 && ct < pl && ct % 16 == 0, "row %d cached tokens %d", n, ct);
        cr_assert_lt(n, 64);
        ttft[n++] = t;
        prompt += pl;
        cached += ct;
        preempted += pre;
    }
    fclose(f);
    cr_assert_eq(n, 48);
    cr_assert_float_eq(cached / prompt, kvp_test_num(o, "prefix_hit_rate"), 1e-9);
    cr_assert_eq(preempted, (int)kvp_test_num(o, "preemptions"));
    for (int i = 1; i < n; i++) /* insertion sort, then the median of 48: the mean of the middle two */
        for (int j = i; j > 0 && ttft[j] < ttft[j - 1]; j--) {
            double x = ttft[j];
            ttft[j] = ttft[j - 1];
            ttft[j - 1] = x;
        }
    cr_assert_float_eq((ttft[23] + ttft[24]) / 2, kvp_test_num(o, "ttft_p50_s"), 1e-6);
    /* --steps-out: a row per step; its finishes and preemptions add up to the summary's, time only moves
     * forward, and every row's KV split adds up to the capacity */
    f = fopen(spath, "r");
    cr_assert_not_null(f, "%s not written", spath);
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_eq(strncmp(line, "step,time_s,step_s,batch_seqs,batch_tokens,preempted,finished,", 62), 0, "%s", line);
    long long steps = 0, fin = 0, pre = 0, last_step = 0;
    double last_t = 0;
    const long long cap = (long long)kvp_test_num(o, "kv_capacity_tokens");
    while (fgets(line, sizeof line, f)) {
        long long st, kv[6];
        double t, dt;
        int bseq, btok, np, nf, nr, nw, ns;
        int k = sscanf(line, "%lld,%lf,%lf,%d,%d,%d,%d,%d,%d,%d,%lld,%lld,%lld,%lld,%lld,%lld", &st, &t, &dt, &bseq, &btok,
                       &np, &nf, &nr, &nw, &ns, &kv[0], &kv[1], &kv[2], &kv[3], &kv[4], &kv[5]);
        cr_assert_eq(k, 16, "%s", line);
        cr_assert_eq(st, last_step + 1, "every batch step has a row");
        cr_assert(t > last_t && dt > 0 && bseq >= 1 && btok >= bseq, "%s", line);
        cr_assert_eq(kv[0] + kv[1] + kv[2] + kv[3] + kv[4] + kv[5], cap, "%s", line);
        last_step = st;
        last_t = t;
        fin += nf;
        pre += np;
        steps++;
    }
    fclose(f);
    cr_assert_eq(steps, (long long)kvp_test_num(o, "steps"));
    cr_assert_eq(fin, (long long)kvp_test_num(o, "finished"));
    cr_assert_eq(pre, (long long)kvp_test_num(o, "preemptions"));
    cr_assert_float_eq(last_t, kvp_test_num(o, "sim_duration_s"), 1e-6, "the last step finishes the last request");
    cJSON_Delete(o);
    unlink(path);
    unlink(spath);
    /* a directory that does not exist: an error naming the option, before anything runs */
    snprintf(args, sizeof args, "simulate --model " LLAMA8B " --workload chat --requests-out %s/nodir/req.csv", dir);
    rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "--requests-out") && strstr(err, "nodir"), "%s", err);
    cr_assert_eq(out[0], '\0', "no summary for a run that did not happen");
    snprintf(args, sizeof args, "simulate --model " LLAMA8B " --workload chat --requests-out %s", dir);
    rc = kvp_test_cli(args, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "is a directory"), "%s", err);
    cr_assert_eq(out[0], '\0');
    rmdir(dir);
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* --kv-events: the engine's cache as vLLM's KV events, one batch a step with consecutive sequence numbers.
 * Replayed into an index of hashes, every BlockRemoved removes a block stored before, the evictions are
 * the run's evicted blocks, and the end-of-run flush clears what is left. */
Test(simulate_cli, kv_events_replay_into_the_cache)
{
    static char out[1 << 16], err[4096];
    char path[] = "/tmp/kvp_events_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char args[512];
    snprintf(args, sizeof args, "simulate --model " LLAMA8B " --workload chat:conversations=10,turns=3 --cache radix "
             "--kv-mem 512MB --json --kv-events %s", path);
    cr_assert_eq(kvp_test_cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cJSON *o;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t cap = 1 << 16, n = 0;
    uint64_t *held = calloc(cap, sizeof *held); /* sorted */
    static char line[1 << 22];
    long long seq = -1, removed = 0, stored = 0, cleared = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *b;
        cr_assert_eq(kvp_json_parse(line, strlen(line), "an event batch", &b), KVP_OK, "%.200s", line);
        cr_assert_eq((long long)cJSON_GetObjectItem(b, "seq")->valuedouble, seq + 1, "sequence numbers in order");
        seq++;
        /* the hashes as the text has them (64-bit integers: a JSON number in a double would round them) */
        for (const char *p = strstr(line, "\"type\":"); p; p = strstr(p + 1, "\"type\":")) {
            const int clear = strncmp(p, "\"type\":\"AllBlocksCleared\"", strlen("\"type\":\"AllBlocksCleared\"")) == 0;
            const int store = strncmp(p, "\"type\":\"BlockStored\"", strlen("\"type\":\"BlockStored\"")) == 0;
            if (clear) {
                n = 0;
                cleared++;
                continue;
            }
            cr_assert(store || strncmp(p, "\"type\":\"BlockRemoved\"", strlen("\"type\":\"BlockRemoved\"")) == 0, "%.40s", p);
            const char *q = strstr(p, "\"block_hashes\":[");
            cr_assert_not_null(q);
            for (q += strlen("\"block_hashes\":["); *q != ']';) {
                char *end;
                const uint64_t x = strtoull(q, &end, 10);
                cr_assert(end > q, "a hash: %.20s", q);
                q = *end == ',' ? end + 1 : end;
                uint64_t *at = bsearch(&x, held, n, sizeof *held, cmp_u64);
                if (store) {
                    cr_assert_null(at, "a block stored twice without its removal");
                    cr_assert_lt(n, cap);
                    held[n++] = x;
                    qsort(held, n, sizeof *held, cmp_u64);
                    stored++;
                } else {
                    cr_assert_not_null(at, "a removal of a block never stored");
                    memmove(at, at + 1, (size_t)(held + n - at - 1) * sizeof *held);
                    n--;
                    removed++;
                }
            }
        }
        cJSON_Delete(b);
    }
    fclose(f);
    unlink(path);
    cr_assert_gt(stored, 0);
    cr_assert_eq(removed, (long long)kvp_test_num(o, "evicted_blocks"), "%lld removals, %g evictions", removed,
                 kvp_test_num(o, "evicted_blocks"));
    cr_assert_gt(removed, 0, "512 MB was meant to evict");
    cr_assert(cleared >= 1 && n == 0, "the end of the run empties the cache (%lld blocks left)", (long long)n);
    free(held);
    cJSON_Delete(o);
}

/* The summary's wrapped lines joined again: a newline and the 19 spaces of a continuation become one space. */
static void unwrap(char *s)
{
    static const char cont[] = "\n                   ";
    char *w = s;
    for (const char *r = s; *r;) {
        if (strncmp(r, cont, sizeof cont - 1) == 0) {
            *w++ = ' ';
            r += sizeof cont - 1;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

/* The summary says why requests were rejected: the reasons add up to the rejected count, each reason's count is
 * the requests of the trace it fits (prompts of max_model_len or more; the others longer than the KV cache),
 * and the words name the figures. */
Test(simulate_cli, rejections_say_why)
{
    static char out[1 << 16], err[8192];
    const char *args = "simulate --model " LLAMA8B " --gpu H100-SXM --kv-mem 64MB --trace " AZURE_CONV
                       " --num-requests 200 --max-model-len 1024 --json";
    cr_assert_eq(kvp_test_cli(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cJSON *o;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
    const double rejected = cJSON_GetObjectItem(o, "rejected")->valuedouble;
    const double kv = cJSON_GetObjectItem(o, "rejected_kv")->valuedouble;
    const double context = cJSON_GetObjectItem(o, "rejected_context")->valuedouble;
    const double other = cJSON_GetObjectItem(o, "rejected_other")->valuedouble;
    const double cap = cJSON_GetObjectItem(o, "kv_capacity_tokens")->valuedouble;
    cr_assert_eq(kv + context + other, rejected);
    /* the trace's own lengths: prompts of 1,024 tokens or more, and prompt + output (clamped) over the cache */
    kvp_workload *w;
    cr_assert_eq(kvp_sim_load_workload(AZURE_CONV, NULL, 200, 0, 0, 1024, 1, &w), KVP_OK, "%s", kvp_error_detail());
    int64_t want_context = 0, want_kv = 0;
    for (int64_t i = 0; i < w->n; i++) {
        const int64_t p = w->reqs[i].prompt_len, len = p + w->reqs[i].output_len;
        if (p >= 1024) want_context++;
        else if ((len < 1024 ? len : 1024) > cap) want_kv++;
    }
    kvp_workload_destroy(w);
    cr_assert(want_context > 0 && want_kv > 0, "the case should reject for both reasons: %lld, %lld",
              (long long)want_context, (long long)want_kv);
    cr_assert_eq(context, (double)want_context);
    cr_assert_eq(kv, (double)want_kv);
    static char why[1024]; /* kept past cJSON_Delete for the text summary's check */
    snprintf(why, sizeof why, "%s", cJSON_GetObjectItem(o, "rejected_reason")->valuestring);
    char cap_s[64];
    snprintf(cap_s, sizeof cap_s, "> %d)", (int)cap); /* under 1,000: no separator */
    cr_assert(strstr(why, "prompt + max_tokens exceed the KV cache") && strstr(why, cap_s) &&
              strstr(why, "max_model_len (the longest") && strstr(why, ">= 1,024)"), "%s", why);
    cJSON_Delete(o);
    /* the text summary has the same line */
    const char *text = "simulate --model " LLAMA8B " --gpu H100-SXM --kv-mem 64MB --trace " AZURE_CONV
                       " --num-requests 200 --max-model-len 1024";
    cr_assert_eq(kvp_test_cli(text, out, sizeof out, err, sizeof err), 0, "%s", err);
    unwrap(out);
    cr_assert(strstr(out, "rejected           ") && strstr(out, why), "%s", out);
}

/* The text summary fits 100 columns, its long lines (the rejections, the model, the KV memory's shares, n
 * samples, the host tier, tensor parallelism) wrapped under their values, and says what --json says. */
Test(simulate_cli, summary_fits_100_columns)
{
    static const char *const cases[] = {
        "--model " LLAMA8B " --gpu H100-SXM --kv-mem 64MB --trace " AZURE_CONV " --num-requests 200 --max-model-len 1024",
        "--model " LLAMA8B " --gpu H200 --tp 2 --workload chat:conversations=10 --cache radix --kv-mem 256MB "
        "--kv-offloading-size 1GiB --preempt swap --n 3",
        "--executor cpu --model " S260_GGUF " --workload system:n=8,prefix=64,suffix=8,output=8 --rate inf "
        "--cache radix --kv-mem 1MB --preempt swap",
    };
    static char out[1 << 16], err[8192], args[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "simulate %s", cases[i]);
        cr_assert_eq(kvp_test_cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", args, err);
        int lines = 0, wrapped = 0;
        for (const char *p = out; *p;) {
            const size_t n = strcspn(p, "\n");
            cr_assert_leq(n, 100u, "%s: a line of %zu characters: %.*s", args, n, (int)n, p);
            lines++;
            if (n > 19 && strspn(p, " ") == 19) wrapped++;
            p += n + (p[n] == '\n');
        }
        cr_assert_gt(lines, 8, "%s: %s", args, out);
        cr_assert_gt(wrapped, 0, "%s: the KV memory line at least is longer than 100 columns: %s", args, out);
        unwrap(out);
        cr_assert(strstr(out, "KV memory          time-averaged share: tokens ") &&
                  strstr(out, "; tokens / memory in use "), "%s", out);
    }
}

/* kvp_sim_rejections_summary's words, for one reason and for several. */
Test(simulate, rejection_summary_words)
{
    char buf[512];
    kvp_sim_rejections r = {.n = 3, .kv = 3, .longest_tokens = 12345, .kv_tokens = 8192, .max_model_len = 4096};
    kvp_sim_rejections_summary(&r, buf, sizeof buf);
    cr_assert_str_eq(buf, "3: prompt + max_tokens exceed the KV cache (the longest 12,345 tokens > 8,192)");
    r = (kvp_sim_rejections){.n = 1, .context = 1, .longest_prompt = 5000, .max_model_len = 4096};
    kvp_sim_rejections_summary(&r, buf, sizeof buf);
    cr_assert_str_eq(buf, "1: prompt reaches max_model_len (5,000 tokens >= 4,096)");
    r = (kvp_sim_rejections){.n = 4, .kv = 1, .context = 2, .other = 1, .longest_tokens = 9000, .kv_tokens = 8192,
                             .longest_prompt = 1234567, .max_model_len = 4096};
    snprintf(r.other_reason, sizeof r.other_reason, "8 samples are more than max_num_seqs (4) can run at once");
    kvp_sim_rejections_summary(&r, buf, sizeof buf);
    cr_assert_str_eq(buf, "4: 1 whose prompt + max_tokens exceed the KV cache (9,000 tokens > 8,192); 2 whose prompt "
                          "reaches max_model_len (the longest 1,234,567 tokens >= 4,096); 1 with another reason (8 "
                          "samples are more than max_num_seqs (4) can run at once)");
    r = (kvp_sim_rejections){0};
    kvp_sim_rejections_summary(&r, buf, sizeof buf);
    cr_assert_str_eq(buf, "none");
    kvp_sim_rejections_summary(&(kvp_sim_rejections){.n = 2, .kv = 2, .longest_tokens = 99999, .kv_tokens = 10},
                               buf, 20); /* cut, still terminated */
    cr_assert_eq(strlen(buf), 19u);
}

/* --preempt swap sizes the host pool as the KV cache unless --swap-space says otherwise, on both executors;
 * without swap preemption there is none. */
Test(simulate_cli, swap_space_defaults_to_the_kv_cache)
{
    static const struct {
        const char *args;
        int64_t swap; /* -1: as the cache; 0: none; else the bytes --swap-space gives */
    } cases[] = {
        {"--model " LLAMA8B " --gpu H100-SXM --kv-mem 1GB --preempt swap", -1},
        {"--model " LLAMA8B " --gpu H100-SXM --kv-mem 1GB --preempt swap --swap-space 64MB", 64000000},
        {"--model " LLAMA8B " --gpu H100-SXM --kv-mem 1GB", 0},
        {"--executor cpu --model " S260_GGUF " --kv-mem 4MB --preempt swap", -1},
        {"--executor cpu --model " S260_GGUF " --kv-mem 4MB --preempt swap --swap-space 1MB", 1000000},
    };
    static char out[1 << 16], err[8192], args[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "simulate %s --workload system:n=4,prefix=32,suffix=8,output=8 --rate inf --json",
                 cases[i].args);
        cr_assert_eq(kvp_test_cli(args, out, sizeof out, err, sizeof err), 0, "%s: %s", args, err);
        cJSON *o;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o), KVP_OK, "%s", out);
        const double swap = cJSON_GetObjectItem(o, "swap_tokens")->valuedouble;
        const double cap = cJSON_GetObjectItem(o, "kv_capacity_tokens")->valuedouble;
        const double bpt = cJSON_GetObjectItem(o, "kv_bytes_per_token")->valuedouble;
        const int64_t bs = (int64_t)cJSON_GetObjectItem(o, "block_size")->valuedouble;
        const double want = cases[i].swap < 0 ? cap : (double)((int64_t)((double)cases[i].swap / bpt) / bs * bs);
        cr_assert_eq(swap, want, "%s: a host pool of %g tokens, not %g (the cache: %g)", args, swap, want, cap);
        cJSON_Delete(o);
    }
}
