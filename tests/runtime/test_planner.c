/* The planner's formulas against the seed article's examples and hand-computed figures. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "attention/paged_kv.h"
#include "runtime/planner/planner.h"

#include "cli_testutil.h"

#define GiB (1LL << 30)

/* The seed article's model: 32 layers, 8 KV heads, head_dim 128. */
static kvp_model_config seed_model(int kv_heads)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"model_type\":\"llama\",\"num_hidden_layers\":32,\"hidden_size\":4096,\"num_attention_heads\":32,"
             "\"num_key_value_heads\":%d,\"intermediate_size\":14336,\"vocab_size\":128256,"
             "\"max_position_embeddings\":131072}", kv_heads);
    cJSON *o = cJSON_Parse(text);
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_from_json(o, "seed", &c), KVP_OK, "%s", kvp_error_detail());
    cJSON_Delete(o);
    return c;
}

static kvp_plan plan(const kvp_model_config *c, kvp_plan_params *p)
{
    kvp_plan r;
    cr_assert_eq(kvp_plan_compute(c, p, &r), KVP_OK, "%s", kvp_error_detail());
    return r;
}

Test(planner, seed_article_kv_examples)
{
    kvp_model_config c = seed_model(8);
    kvp_plan_params p;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    static const struct { long long seq; long long bytes; } ex[] = {
        {4096, 536870912LL}, {8192, 1 * GiB}, {32768, 4 * GiB}, {131072, 16 * GiB},
    };
    for (size_t i = 0; i < 4; i++) {
        p.seq_len = ex[i].seq;
        kvp_plan r = plan(&c, &p);
        cr_expect_eq(r.total.kv_bytes_per_seq, ex[i].bytes, "%lld tokens", ex[i].seq);
    }
    p.seq_len = 4096;
    p.num_seqs = 32;
    cr_expect_eq(plan(&c, &p).total.kv_bytes_total, 16 * GiB, "32 sequences x 4096 tokens");
    cr_expect_eq(plan(&c, &p).total.kv_bytes_per_token, 131072);

    kvp_model_config half = seed_model(4);
    cr_expect_eq(plan(&half, &p).total.kv_bytes_total, 8 * GiB, "4 KV heads: half");

    /* 32 requests sharing a 2048-token system prompt store those tokens once. */
    p.shared_prefix = 2048;
    long long per_tok = 131072;
    cr_expect_eq(plan(&c, &p).total.kv_bytes_total, 32LL * 4096 * per_tok - 31LL * 2048 * per_tok);
}

Test(planner, weights_and_training_examples)
{
    /* A 7B model: 7e9 x 2 bytes = 14 GB of weights, x 16 = 112 GB to train with AdamW. The planner takes the
     * parameter count from the config, so build one whose count is known and scale. */
    kvp_model_config c = seed_model(8);
    kvp_plan_params p;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    kvp_plan r = plan(&c, &p);
    cr_assert_eq(r.params, 8030261248LL, "Llama-3.1-8B shape");
    cr_assert_eq(r.total.weights_bytes, 2 * r.params);
    cr_assert_eq(r.train_bytes, 16 * r.params);
    double b;
    cr_assert_eq(kvp_dtype_bytes("bf16", &b), KVP_OK);
    cr_assert_eq((long long)(7e9 * b), 14000000000LL, "7B in BF16 -> 14 GB");
    cr_assert_eq((long long)(7e9 * 16), 112000000000LL, "7B AdamW -> 112 GB");
    p.weight_bytes = 1;
    cr_assert_eq(plan(&c, &p).total.weights_bytes, r.params, "fp8 weights: one byte each");
    cr_assert_eq(kvp_dtype_bytes("fp4", &b), KVP_EINVAL);
}

/* Hand-computed blocks and sequences for real models. */
Test(planner, blocks_and_sequences_for_real_models)
{
    static const struct { const char *file; const char *gpu_note; long long mem; int tp; long long seq; } cases[] = {
        {"Meta-Llama-3.1-8B.json", "H200", 143771LL << 20, 1, 8192},
        {"derived/opt-13b.json", "A100-40G", 40960LL << 20, 1, 2048},
        {"Meta-Llama-3.1-70B.json", "4xH100", 81559LL << 20, 4, 32768},
        {"derived/qwen2_7b.json", "A100-80G", 81920LL << 20, 2, 4096},
        {"derived/gemma2_9b.json", "H100", 81559LL << 20, 1, 8192},
        {"DeepSeek-V3.json", "8xH200", 143771LL << 20, 8, 16384},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "../shared/data/configs/%s", cases[i].file);
        kvp_model_config c;
        cr_assert_eq(kvp_model_config_load(path, &c), KVP_OK, "%s", kvp_error_detail());
        kvp_plan_params p;
        kvp_plan_params_default(&c, &p);
        p.gpu_mem_bytes = cases[i].mem;
        p.tp = cases[i].tp;
        p.seq_len = cases[i].seq;
        p.activation_reserve = 1 * GiB;
        kvp_plan r = plan(&c, &p);
        long long params = kvp_model_num_params(&c);
        long long weights_rank = 2 * params / cases[i].tp;
        long long kv_heads_rank = c.kv_lora_rank ? 0 : (c.num_kv_heads >= cases[i].tp ? c.num_kv_heads / cases[i].tp : 1);
        long long per_tok_rank = c.kv_lora_rank ? 2LL * c.num_layers * (c.kv_lora_rank + c.qk_rope_head_dim)
                                                : 2LL * c.num_layers * 2 * kv_heads_rank * c.head_dim;
        long long budget = (long long)((double)cases[i].mem * 0.9) - weights_rank - GiB;
        cr_expect_eq(r.per_rank.weights_bytes, weights_rank, "%s", cases[i].file);
        cr_expect_eq(r.per_rank.kv_bytes_per_token, per_tok_rank, "%s", cases[i].file);
        cr_expect_eq(r.per_rank.kv_budget_bytes, budget, "%s", cases[i].file);
        cr_expect_eq(r.total.num_blocks, budget > 0 ? budget / (16 * per_tok_rank) : 0, "%s", cases[i].file);
        if (c.sliding_window == 0)
            cr_expect_eq(r.total.max_concurrent_seqs, budget > 0 ? budget / (cases[i].seq * per_tok_rank) : 0, "%s",
                         cases[i].file);
    }
}

Test(planner, sliding_windows_and_mla_per_sequence)
{
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/derived/gemma2_9b.json", &c), KVP_OK);
    /* 42 layers, 21 sliding at 4096: at 8192 tokens the sliding half stores 4096 tokens. */
    long long per_layer_tok = 2LL * 8 * 256 * 2;
    cr_assert_eq(kvp_plan_kv_bytes_for_tokens(&c, 8192, 2), 21 * 8192 * per_layer_tok + 21 * 4096 * per_layer_tok);
    cr_assert_eq(kvp_plan_kv_bytes_for_tokens(&c, 1000, 2), 42 * 1000 * per_layer_tok);
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/DeepSeek-V3.json", &c), KVP_OK);
    cr_assert_eq(kvp_plan_kv_bytes_for_tokens(&c, 1000, 2), 61LL * 576 * 2 * 1000, "MLA latent: 576 elements");
}

Test(planner, impossible_parameters_rejected)
{
    kvp_model_config c = seed_model(8);
    kvp_plan_params p;
    kvp_plan r;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    p.tp = 3;
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--tp 3") != NULL);
    p.tp = 16; /* 16 > 8 KV heads: replicated, allowed */
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_OK);
    cr_assert_eq(r.per_rank.kv_bytes_per_token, 2LL * 32 * 1 * 128 * 2);
    p.tp = 1;
    p.shared_prefix = p.seq_len + 1;
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    p.shared_prefix = 0;
    p.gpu_util = 1.5;
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    p.gpu_util = 0.9;
    p.gpu_mem_bytes = 1 * GiB; /* weights do not fit: a plan with a negative budget and no blocks */
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_OK);
    cr_assert_lt(r.per_rank.kv_budget_bytes, 0);
    cr_assert_eq(r.total.num_blocks, 0);
}

/* The CLI: exit codes and one-line errors (kvpage binary from the build, via KVPAGE_BIN). */
Test(planner, cli_bad_input_exits_2_with_one_line)
{
    static const kvp_cli_case cases[] = {
        {"", "--config PATH is required"},
        {"--config /nonexistent.json", "/nonexistent.json"},
        {"--config ../shared/data/configs/INDEX.md", "malformed JSON"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --gpu B200", "unknown GPU"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --kv-dtype fp4", "unknown dtype 'fp4'"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --tp 3", "does not divide"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --seq-len -5", "out of range"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --gpu-mem 80XB", "unknown size unit"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --block-size 0", "out of range"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --frobnicate", "unknown option"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --gpu-util 2", "out of range"},
    };
    kvp_test_cli_rejects("plan", cases, sizeof cases / sizeof cases[0]);
    static char out[1 << 14];
    cr_expect_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --gpu H200 --json", out,
                              sizeof out, NULL, 0), 0);
    cr_expect(strstr(out, "\"max_concurrent_seqs\"") != NULL, "%s", out);
}

/* Sizes past int64_t are errors naming the option (they printed negative or wrapped values with exit 0);
 * a large but representable total stays exact. */
Test(planner, overflowing_sizes_are_errors_naming_the_option)
{
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/Meta-Llama-3.1-8B.json", &c), KVP_OK);
    kvp_plan_params p;
    kvp_plan r;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    p.num_seqs = 1000000000; /* x 16 GiB per 131072-token sequence = 1.7e19 bytes */
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--num-seqs 1000000000") != NULL, "%s", kvp_error_message());
    p.num_seqs = p.seq_len = 1LL << 40; /* printed kv_bytes_total 0 */
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--num-seqs") != NULL, "%s", kvp_error_message());
    p.num_seqs = 1;
    p.seq_len = INT64_MAX / 2;
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--seq-len") != NULL, "%s", kvp_error_message());
    p.seq_len = 4096;
    p.activation_reserve = 9000000000000000000LL;
    p.tp = 8;
    cr_assert_eq(kvp_plan_compute(&c, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--tp 8") != NULL, "%s", kvp_error_message());
    p.activation_reserve = -1;
    p.tp = 1;

    /* 1e6 sequences: 1.7e16 bytes, above 2^53 yet exact. */
    p.seq_len = 131072;
    p.num_seqs = 1000000;
    r = plan(&c, &p);
    cr_assert_eq(r.total.kv_bytes_total, 1000000LL * 16 * GiB);

    /* A config filled by hand past the loader's bounds: its saturated parameter count is refused. */
    kvp_model_config big = c;
    big.intermediate_size = 1LL << 50;
    p.num_seqs = 1;
    cr_assert_eq(kvp_plan_compute(&big, &p, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "parameters") != NULL, "%s", kvp_error_message());
}

/* The tester's command lines: each exits 2 with one line naming the option or the config field. */
Test(planner, cli_overflow_repros_exit_2)
{
    cJSON *o = NULL;
    cr_assert_eq(kvp_json_parse_file("../shared/data/configs/Meta-Llama-3.1-8B.json", &o), KVP_OK);
    static const struct { const char *key; double v; } big[] = {
        {"hidden_size", 1048576}, {"num_attention_heads", 8192}, {"num_key_value_heads", 8192},
        {"num_hidden_layers", 1024}, {"intermediate_size", 2147483647}, {"vocab_size", 2147483647}, {"head_dim", 128},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, big[i].key);
        cJSON_AddNumberToObject(o, big[i].key, big[i].v);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvp_test_plan_big_%d.json", (int)getpid());
    cr_assert_eq(kvp_json_write_file(path, o), KVP_OK);
    cJSON_Delete(o);
    char args[256];
    snprintf(args, sizeof args, "--config %s", path);
    char sim[256];
    snprintf(sim, sizeof sim, "--model %s --workload sharegpt:n=10 --rate inf", path);
    const kvp_cli_case cases[] = {
        {args, "\"intermediate_size\": 2147483647 is out of range"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --num-seqs 1000000000", "--num-seqs 1000000000"},
        {"--config ../shared/data/configs/Meta-Llama-3.1-8B.json --num-seqs 1099511627776 --seq-len 1099511627776 --json",
         "--num-seqs 1099511627776"},
    };
    kvp_test_cli_rejects("plan", cases, sizeof cases / sizeof cases[0]);
    const kvp_cli_case sim_cases[] = {{sim, "\"intermediate_size\": 2147483647 is out of range"}};
    kvp_test_cli_rejects("simulate", sim_cases, 1);
    unlink(path);
}

/* tp > KV heads replicates them (vLLM): the whole-model column is all ranks together, copies included, so it
 * is tp x the per-rank column and its budget / its KV per sequence gives the sequences printed. */
Test(planner, whole_model_counts_replicated_kv_heads)
{
    kvp_model_config c = seed_model(8);
    kvp_plan_params p;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    p.seq_len = 8192; /* whole blocks: the paged sequence is the KV per sequence */
    static const int tps[] = {1, 2, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof tps / sizeof tps[0]; i++) {
        p.tp = tps[i];
        kvp_plan r = plan(&c, &p);
        int replicas = tps[i] > 8 ? tps[i] / 8 : 1;
        cr_expect_eq(r.kv_replicas, replicas, "tp %d", tps[i]);
        cr_expect_eq(r.total.kv_bytes_per_token, r.per_rank.kv_bytes_per_token * tps[i], "tp %d", tps[i]);
        cr_expect_eq(r.total.kv_bytes_per_token, 131072LL * replicas, "tp %d: seed formula x copies", tps[i]);
        cr_expect_eq(r.total.kv_bytes_per_seq, r.per_rank.kv_bytes_per_seq * tps[i], "tp %d", tps[i]);
        cr_expect_eq(r.total.kv_bytes_total, r.per_rank.kv_bytes_total * tps[i], "tp %d", tps[i]);
        cr_expect_eq(r.total.block_bytes, r.per_rank.block_bytes * tps[i], "tp %d", tps[i]);
        cr_expect_eq(r.total.kv_budget_bytes / r.total.kv_bytes_per_seq, r.total.max_concurrent_seqs, "tp %d",
                     tps[i]);
    }

    kvp_model_config ds;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/DeepSeek-V3.json", &ds), KVP_OK);
    kvp_plan_params_default(&ds, &p);
    p.gpu_mem_bytes = 143771LL << 20;
    p.tp = 64;
    p.seq_len = 16384;
    kvp_plan r = plan(&ds, &p);
    cr_assert_eq(r.kv_replicas, 64, "the MLA latent cache is on every rank");
    cr_assert_eq(r.per_rank.kv_bytes_per_token, 61LL * 576 * 2);
    cr_assert_eq(r.total.kv_bytes_per_token, 64 * 61LL * 576 * 2);
    cr_assert_eq(r.total.kv_budget_bytes / r.total.kv_bytes_per_seq, r.total.max_concurrent_seqs);

    static char out[1 << 14];
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --tp 16 --json", out,
                              sizeof out, NULL, 0), 0);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "%s", out);
    cr_expect_eq(kvp_test_num(o, "kv_bytes_per_token"), 262144.0);
    cr_expect_eq(kvp_test_num(o, "kv_replicas"), 2.0);
    cr_expect_eq(kvp_test_num(cJSON_GetObjectItem(o, "per_rank"), "kv_bytes_per_token"), 16384.0);
    cJSON_Delete(o);
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --tp 16", out, sizeof out,
                              NULL, 0), 0);
    cr_expect(strstr(out, "KV replicated: each KV head is held by 2 ranks") != NULL, "%s", out);
}

/* Every option's range error names the option, as the other commands do. */
Test(planner, cli_option_errors_name_the_option)
{
#define L8B "--config ../shared/data/configs/Meta-Llama-3.1-8B.json "
    static const kvp_cli_case cases[] = {
        {L8B "--tp 0", "--tp: 0 is out of range [1, 4096]"},
        {L8B "--gpu-util 0", "--gpu-util: 0 is out of range"},
        {L8B "--gpu-util 2", "--gpu-util: 2 is out of range"},
        {L8B "--block-size 0", "--block-size: 0 is out of range"},
        {L8B "--seq-len 0", "--seq-len: 0 is out of range"},
        {L8B "--seq-len 2000000000000", "--seq-len: 2000000000000 is out of range"},
        {L8B "--num-seqs 0", "--num-seqs: 0 is out of range"},
        {L8B "--shared-prefix -1", "--shared-prefix: -1 is out of range"},
        {L8B "--max-batched-tokens 0", "--max-batched-tokens: 0 is out of range"},
        {L8B "--lora-rank 0", "--lora-rank: 0 is out of range"},
        {L8B "--gpu-mem 0", "--gpu-mem: must be positive"},
        {L8B "--gpu-mem 80XB", "--gpu-mem: '80XB': unknown size unit"},
        {L8B "--reserve lots", "--reserve: 'lots' is not a byte size"},
        {L8B "--weight-dtype fp4", "--weight-dtype: unknown dtype 'fp4'"},
        {L8B "--gpu B200", "--gpu: unknown GPU 'B200'"},
    };
#undef L8B
    kvp_test_cli_rejects("plan", cases, sizeof cases / sizeof cases[0]);
}

/* One dtype spelling everywhere: plan's fp32 / fp16 and generate's f32 / f16 are aliases of one another in the
 * planner, the KV cache and the weights, and plan reports the canonical one (f32, f16). */
Test(planner, dtype_spellings_are_aliases_with_one_canonical_name)
{
    static const struct {
        const char *name, *canonical;
        double bytes;
    } cases[] = {{"f32", "f32", 4}, {"fp32", "f32", 4}, {"f16", "f16", 2}, {"fp16", "f16", 2},
                 {"bf16", "bf16", 2}, {"fp8", "fp8", 1}, {"int8", "int8", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *canon = NULL;
        double b = 0;
        cr_assert_eq(kvp_plan_dtype_parse(cases[i].name, &canon, &b), KVP_OK, "%s", cases[i].name);
        cr_assert_str_eq(canon, cases[i].canonical, "%s", cases[i].name);
        cr_assert_eq(b, cases[i].bytes, "%s", cases[i].name);
    }
    cr_assert_eq(kvp_plan_dtype_parse("fp4", NULL, &(double){0}), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "'fp4'") && strstr(kvp_error_message(), "f16") &&
              strstr(kvp_error_message(), "fp16"), "%s", kvp_error_message());
    kvp_dtype a, b;
    cr_assert_eq(kvp_dtype_parse("fp16", &a), KVP_OK);
    cr_assert_eq(kvp_dtype_parse("f16", &b), KVP_OK);
    cr_assert(a == KVP_DTYPE_F16 && b == KVP_DTYPE_F16);
    cr_assert_eq(kvp_dtype_parse("fp32", &a), KVP_OK);
    cr_assert_eq(a, KVP_DTYPE_F32);
    cr_assert_str_eq(kvp_dtype_name(a), "f32");
    /* the command lines: the same plan whichever spelling, the canonical name in it */
    static char x[1 << 14], y[1 << 14], err[4096];
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --kv-dtype fp16 "
                              "--weight-dtype fp32 --json", x, sizeof x, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --kv-dtype f16 "
                              "--weight-dtype f32 --json", y, sizeof y, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(x, y);
    cr_assert(strstr(x, "\"kv_dtype\":\t\"f16\"") && strstr(x, "\"weight_dtype\":\t\"f32\""), "%s", x);
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --kv-dtype fp16", x,
                              sizeof x, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(x, "weights bf16, KV f16"), "%s", x);
    /* generate and simulate read the KV and weight types through the same parsers */
    cr_assert_eq(kvp_test_cli("simulate --executor cpu --model ../shared/models/stories260K/stories260K.gguf "
                              "--workload system:n=2,prefix=16,suffix=8,output=4 --rate inf --kv-dtype fp16 --json",
                              x, sizeof x, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(x, "\"kv_dtype\":\t\"f16\""), "%s", x);
    cr_assert_eq(kvp_test_cli("generate --model ../shared/models/stories260K/stories260K.gguf --prompt Once "
                              "--max-tokens 4 --kv-dtype fp16 --weight-dtype fp32 --json", x, sizeof x, err, sizeof err),
                 0, "%s", err);
    cr_assert(strstr(x, "\"kv_dtype\":\t\"f16\"") && strstr(x, "\"weight_dtype\":\t\"f32\""), "%s", x);
}

/* With a shared prefix the concurrent sequences are those whose KV, the prefix's full blocks stored once, fits
 * the budget, as "KV for all sequences" counts them: N sequences fit, N + 1 do not (lengths in whole blocks, so
 * that paged and exact figures agree), and more than without the prefix. */
Test(planner, shared_prefix_counts_once_in_the_concurrent_sequences)
{
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/Meta-Llama-3.1-8B.json", &c), KVP_OK, "%s",
                 kvp_error_detail());
    const int64_t prefixes[] = {0, 1024, 16384, 32000};
    int64_t ns[4];
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        kvp_plan_params p;
        kvp_plan_params_default(&c, &p);
        p.gpu_mem_bytes = 80 * GiB;
        p.seq_len = 32768;
        p.shared_prefix = prefixes[i];
        const kvp_plan r = plan(&c, &p);
        const int64_t n = r.per_rank.max_concurrent_seqs;
        ns[i] = n;
        cr_assert(i == 0 || n >= ns[i - 1], "prefix %lld: %lld concurrent sequences, fewer than %lld with a shorter one",
                  (long long)prefixes[i], (long long)n, (long long)ns[i - 1]);
        p.num_seqs = n;
        cr_assert_leq(plan(&c, &p).per_rank.kv_bytes_total, r.per_rank.kv_budget_bytes, "prefix %lld: %lld sequences",
                      (long long)prefixes[i], (long long)n);
        p.num_seqs = n + 1;
        cr_assert_gt(plan(&c, &p).per_rank.kv_bytes_total, r.per_rank.kv_budget_bytes, "prefix %lld: %lld sequences",
                     (long long)prefixes[i], (long long)n + 1);
    }
    cr_assert(ns[2] > ns[0] && ns[3] > ns[2], "half the sequence shared: %lld sequences, none shared %lld",
              (long long)ns[2], (long long)ns[0]);
    /* a partial last block of the prefix is each sequence's own: 1,032 shared tokens share 64 blocks, as 1,024 do */
    kvp_plan_params p;
    kvp_plan_params_default(&c, &p);
    p.gpu_mem_bytes = 80 * GiB;
    p.seq_len = 32768;
    p.shared_prefix = 1024;
    const int64_t whole = plan(&c, &p).per_rank.max_concurrent_seqs;
    p.shared_prefix = 1032;
    cr_assert_eq(plan(&c, &p).per_rank.max_concurrent_seqs, whole);
    /* the table says so */
    static char out[1 << 14], err[4096];
    cr_assert_eq(kvp_test_cli("plan --config ../shared/data/configs/Meta-Llama-3.1-8B.json --seq-len 32768 "
                              "--shared-prefix 16384 --num-seqs 30", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(out, "prefix stored once"), "%s", out);
}
