/* The config reader on every real config in ../shared/data/configs/, on broken ones and on random edits of
 * the real ones. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_testutil.h"
#include "runtime/loader/model_config.h"
#include "runtime/planner/planner.h"

#define CONFIGS "../shared/data/configs"

static kvp_model_config load(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, CONFIGS "/%s", rel);
    kvp_model_config c;
    kvp_status st = kvp_model_config_load(path, &c);
    cr_assert_eq(st, KVP_OK, "%s: %s", path, kvp_error_detail());
    return c;
}

/* Every *.json in the folder and derived/ loads, with sane, self-consistent fields. */
static int load_dir(const char *sub)
{
    char dir[256];
    snprintf(dir, sizeof dir, CONFIGS "%s", sub);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s: the shared data must be present", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
        char rel[300];
        snprintf(rel, sizeof rel, "%s%s%s", sub[0] ? sub + 1 : "", sub[0] ? "/" : "", e->d_name);
        kvp_model_config c = load(rel);
        cr_assert_gt(c.num_layers, 0, "%s", rel);
        cr_assert_eq(c.num_q_heads % c.num_kv_heads, 0, "%s", rel);
        cr_assert_gt(c.head_dim, 0, "%s", rel);
        cr_assert_gt(c.vocab_size, 0, "%s", rel);
        cr_assert_gt(kvp_model_num_params(&c), 100000000LL, "%s", rel);
        cr_assert_leq(kvp_model_active_params(&c), kvp_model_num_params(&c), "%s", rel);
        n++;
    }
    closedir(d);
    return n;
}

Test(model_config, every_shared_config_loads)
{
    cr_assert_geq(load_dir(""), 11);
    cr_assert_geq(load_dir("/derived"), 16);
}

/* Published parameter totals (Hugging Face model cards / safetensors metadata). */
Test(model_config, parameter_counts_match_published_totals)
{
    static const struct { const char *file; long long params; } cases[] = {
        {"Meta-Llama-3.1-8B.json", 8030261248LL},   {"Meta-Llama-3.1-70B.json", 70553706496LL},
        {"Meta-Llama-3.1-405B.json", 405853388800LL}, {"Mixtral-8x7B-v0.1.json", 46702792704LL},
        {"Qwen3-8B.json", 8190735360LL},            {"Qwen3-0.6B.json", 596049920LL},
        {"Qwen3-30B-A3B.json", 30532122624LL},      {"derived/qwen2_7b.json", 7615616512LL},
        {"derived/qwen2_0_5b.json", 494032768LL},   {"derived/gemma2_9b.json", 9241705984LL},
        {"derived/phi-3_5.json", 3821079552LL},     {"derived/mistral_7b.json", 7241732096LL},
        {"derived/llama2_7b.json", 6738415616LL},   {"derived/tinyllama_1b_chat_v1.0.json", 1100048384LL},
        {"derived/deepseek_v2_lite.json", 15706484224LL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_model_config c = load(cases[i].file);
        cr_expect_eq(kvp_model_num_params(&c), cases[i].params, "%s: %lld != %lld", cases[i].file,
                     (long long)kvp_model_num_params(&c), cases[i].params);
    }
}

Test(model_config, family_specific_fields)
{
    kvp_model_config c = load("Meta-Llama-3.1-8B.json");
    cr_assert_eq(c.family, KVP_FAMILY_LLAMA);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_str_eq(c.rope_scaling_type, "llama3");
    cr_assert_float_eq(c.rope_scaling_factor, 8.0, 0);
    cr_assert_eq(c.rope_original_max_position, 8192);
    cr_assert_eq(c.tie_word_embeddings, 0);
    cr_assert_eq(c.sliding_window, 0);

    c = load("derived/gemma2_9b.json");
    cr_assert_eq(c.tie_word_embeddings, 1, "gemma ties by default");
    cr_assert_eq(c.head_dim, 256, "explicit head_dim, not 3584/16");
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert(c.layer_is_sliding[0] && !c.layer_is_sliding[1] && c.layer_is_sliding[40] && !c.layer_is_sliding[41]);
    cr_assert(c.query_pre_attn_scalar == 256 && c.attn_logit_softcapping == 50 && c.final_logit_softcapping == 30);
    cr_assert_eq(c.ffn_act, KVP_ACT_GELU_TANH);

    c = load("derived/mistral_7b.json");
    cr_assert_eq(c.sliding_window, 4096, "sliding_window_size (MLC name) is read");
    cr_assert(c.layer_is_sliding[0] && c.layer_is_sliding[31]);

    c = load("derived/qwen2_7b.json");
    cr_assert_eq(c.attention_bias, 1, "qwen2 has q/k/v biases");
    cr_assert_eq(c.sliding_window, 0, "use_sliding_window false");

    c = load("Qwen3-8B.json");
    cr_assert_eq(c.qk_norm, 1);

    c = load("derived/opt-13b.json");
    cr_assert_eq(c.family, KVP_FAMILY_OPT);
    cr_assert_eq(c.intermediate_size, 20480, "ffn_dim");
    cr_assert_eq(c.tie_word_embeddings, 1);
    cr_assert_eq(kvp_model_kv_elems_per_token(&c) * 2, 819200, "800 KB per token, as the paper says");

    c = load("DeepSeek-V3.json");
    cr_assert_eq(c.family, KVP_FAMILY_DEEPSEEK);
    cr_assert_eq(kvp_model_kv_elems_per_token_layer(&c, 0), 576, "MLA caches kv_lora_rank + qk_rope_head_dim");
    cr_assert_eq(c.head_dim, 192);
    cr_assert_eq(c.num_experts, 256);
    cr_assert(!c.layer_is_moe[2] && c.layer_is_moe[3], "first_k_dense_replace = 3");
    cr_assert_str_eq(c.rope_scaling_type, "yarn");

    c = load("Qwen3-30B-A3B.json");
    cr_assert_eq(c.num_experts, 128);
    cr_assert_eq(c.num_experts_per_tok, 8);
    cr_assert_eq(c.moe_intermediate_size, 768);
    long long active = kvp_model_active_params(&c);
    cr_assert(active > 3000000000LL && active < 3500000000LL, "A3B: about 3.3B active, got %lld", active);

    c = load("derived/llama3_1_8b.json");
    cr_assert_eq(c.eos_token_id, 128001, "first of an eos list");
    cr_assert_eq(c.n_eos, 3, "every id of the list ends generation");
    cr_assert(c.eos_token_ids[0] == 128001 && c.eos_token_ids[1] == 128008 && c.eos_token_ids[2] == 128009);
    /* generation_config.json's ids add to them, once each */
    cJSON *gen = cJSON_Parse("{\"eos_token_id\": [128009, 7]}");
    cr_assert_eq(kvp_model_config_eos(gen, "generation_config.json", &c), KVP_OK);
    cr_assert_eq(c.n_eos, 4);
    cr_assert_eq(c.eos_token_ids[3], 7);
    cJSON_Delete(gen);
    gen = cJSON_Parse("{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}");
    cr_assert_eq(kvp_model_config_eos(gen, "generation_config.json", &c), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "generation_config.json") && strstr(kvp_error_message(), "9 ids"), "%s",
              kvp_error_message());
    cJSON_Delete(gen);
}

static kvp_status from_text(const char *text, kvp_model_config *c)
{
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o, "test JSON must parse: %s", text);
    kvp_status st = kvp_model_config_from_json(o, "t.json", c);
    cJSON_Delete(o);
    return st;
}

Test(model_config, nested_text_config_layer_types_and_unknown_types)
{
    kvp_model_config c;
    cr_assert_eq(from_text("{\"model_type\":\"llava\",\"text_config\":{\"model_type\":\"llama\",\"num_hidden_layers\":4,"
                           "\"hidden_size\":256,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                           "\"intermediate_size\":512,\"vocab_size\":1000,\"sliding_window\":128,"
                           "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]}}",
                           &c),
                 KVP_OK, "%s", kvp_error_detail());
    cr_assert_str_eq(c.model_type, "llama");
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.sliding_window, 128);
    cr_assert(c.layer_is_sliding[0] && !c.layer_is_sliding[1]);

    /* Unknown type with the KV fields: accepted as generic. */
    cr_assert_eq(from_text("{\"model_type\":\"newthing\",\"num_hidden_layers\":2,\"hidden_size\":64,"
                           "\"num_attention_heads\":4,\"num_key_value_heads\":1}", &c), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(c.family, KVP_FAMILY_GENERIC);
    cr_assert_eq(kvp_model_kv_elems_per_token(&c), 2 * 2 * 1 * 16);
    /* Unknown type without them: a clear error naming the type. */
    cr_assert_eq(from_text("{\"model_type\":\"newthing\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":4}", &c),
                 KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "newthing") != NULL);
}

Test(model_config, bad_configs_get_named_errors)
{
    static const struct { const char *json; kvp_status st; const char *needle; } cases[] = {
        {"[1,2]", KVP_EPARSE, "not a JSON object"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4}", KVP_EPARSE, "num_hidden_layers"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":-2,\"hidden_size\":64,\"num_attention_heads\":4}", KVP_EINVAL, "num_hidden_layers"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":\"x\",\"hidden_size\":64,\"num_attention_heads\":4}", KVP_EPARSE, "num_hidden_layers"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":3,"
         "\"intermediate_size\":8,\"vocab_size\":8}", KVP_EINVAL, "num_key_value_heads"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":65,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":8}", KVP_EINVAL, "multiple"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2000000,\"hidden_size\":64,\"num_attention_heads\":4}", KVP_EINVAL, "layers"},
        {"{\"model_type\":\"deepseek_v3\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":8}", KVP_EPARSE, "kv_lora_rank"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_model_config c;
        kvp_status st = from_text(cases[i].json, &c);
        cr_expect_eq(st, cases[i].st, "case %zu: got %s (%s)", i, kvp_status_str(st), kvp_error_detail());
        cr_expect(strstr(kvp_error_message(), cases[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i,
                  kvp_error_message(), cases[i].needle);
        cr_expect(strstr(kvp_error_message(), "t.json") != NULL, "case %zu names the file", i);
    }
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/INDEX.md", &c), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "INDEX.md") != NULL);
}

/* A number too large to be an integer (2^62, 1e999) or above a field's limit is "out of range", naming the
 * field; a fraction is still "must be an integer". */
Test(model_config, too_large_fields_are_out_of_range)
{
#define LLAMA_WITH(extra)                                                                                          \
    "{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":4," extra "}"
#define MIXTRAL_WITH(n)                                                                                            \
    "{\"model_type\":\"mixtral\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":4,"           \
    "\"intermediate_size\":128,\"vocab_size\":100,\"num_experts_per_tok\":2,\"num_local_experts\":" n "}"
    static const struct { const char *json; const char *field; } cases[] = {
        {LLAMA_WITH("\"intermediate_size\":4611686018427387904,\"vocab_size\":8"), "\"intermediate_size\""},
        {LLAMA_WITH("\"intermediate_size\":1e999,\"vocab_size\":8"), "\"intermediate_size\""},
        {LLAMA_WITH("\"intermediate_size\":-1e999,\"vocab_size\":8"), "\"intermediate_size\""},
        {LLAMA_WITH("\"intermediate_size\":2147483647,\"vocab_size\":8"), "\"intermediate_size\""},
        {LLAMA_WITH("\"intermediate_size\":8,\"vocab_size\":2147483647"), "\"vocab_size\""},
        {LLAMA_WITH("\"intermediate_size\":8,\"vocab_size\":8,\"head_dim\":1e300"), "\"head_dim\""},
        {LLAMA_WITH("\"intermediate_size\":8,\"vocab_size\":8,\"max_position_embeddings\":1e17"),
         "\"max_position_embeddings\""},
        {LLAMA_WITH("\"intermediate_size\":8,\"vocab_size\":8,\"eos_token_id\":1e999"), "\"eos_token_id\""},
        {LLAMA_WITH("\"intermediate_size\":8,\"vocab_size\":8,\"eos_token_id\":[2,1e999]"), "\"eos_token_id\""},
        {MIXTRAL_WITH("1000000000"), "\"num_local_experts\""},
        {MIXTRAL_WITH("2147483647"), "\"num_local_experts\""},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":2097152,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":8}", "\"hidden_size\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_model_config c;
        kvp_status st = from_text(cases[i].json, &c);
        const char *msg = kvp_error_message();
        cr_expect_eq(st, KVP_EINVAL, "case %zu: got %s (%s)", i, kvp_status_str(st), msg);
        cr_expect(strstr(msg, cases[i].field) != NULL && strstr(msg, "out of range") != NULL,
                  "case %zu: '%s' should say %s is out of range", i, msg, cases[i].field);
        cr_expect(strstr(msg, "must be an integer") == NULL, "case %zu: '%s'", i, msg);
    }
    kvp_model_config c;
    cr_assert_eq(from_text(LLAMA_WITH("\"intermediate_size\":1.5,\"vocab_size\":8"), &c), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "\"intermediate_size\" must be an integer") != NULL, "%s",
              kvp_error_message());
#undef LLAMA_WITH
#undef MIXTRAL_WITH
}

/* Fields each within their limits whose product is not: the parameter count is bounded by 2^53 (exact in a
 * double, and every byte figure derived from it fits in int64_t), the error naming the field behind the
 * largest part. Below the bound the count is exact. */
Test(model_config, parameter_count_over_2_53_is_rejected)
{
    static const struct { const char *json; const char *field; } cases[] = {
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":1024,\"hidden_size\":1048576,\"num_attention_heads\":8192,"
         "\"head_dim\":128,\"intermediate_size\":16777216,\"vocab_size\":16777216}", "\"intermediate_size\""},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":1024,\"hidden_size\":1048576,\"num_attention_heads\":65536,"
         "\"head_dim\":65536,\"intermediate_size\":8,\"vocab_size\":8}", "\"num_attention_heads\""},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":1048576,\"num_attention_heads\":1,"
         "\"head_dim\":1,\"intermediate_size\":1,\"vocab_size\":16777216,\"tie_word_embeddings\":false}", NULL},
        {"{\"model_type\":\"mixtral\",\"num_hidden_layers\":1024,\"hidden_size\":1048576,\"num_attention_heads\":8,"
         "\"intermediate_size\":1048576,\"vocab_size\":8,\"num_local_experts\":65536,\"num_experts_per_tok\":2}",
         "moe_intermediate_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_model_config c;
        kvp_status st = from_text(cases[i].json, &c);
        const char *msg = kvp_error_message();
        if (cases[i].field == NULL) { /* 2 x 2^24 x 2^20 = 2^45 embedding parameters: fine */
            cr_expect_eq(st, KVP_OK, "case %zu: %s", i, msg);
            cr_expect_gt(kvp_model_num_params(&c), 1LL << 45, "case %zu", i);
            continue;
        }
        cr_expect_eq(st, KVP_EINVAL, "case %zu: got %s (%s)", i, kvp_status_str(st), msg);
        cr_expect(strstr(msg, "parameter count") != NULL && strstr(msg, cases[i].field) != NULL,
                  "case %zu: '%s' lacks the parameter count and %s", i, msg, cases[i].field);
    }
    /* Mixtral-8x7B with 65536 experts: 32 x 65536 x 3 x 4096 x 14336 expert weights, counted exactly. */
    kvp_model_config c = load("Mixtral-8x7B-v0.1.json");
    long long base = kvp_model_num_params(&c), expert = 3LL * 4096 * 14336 + 4096; /* + its router row */
    c.num_experts = 65536;
    cr_assert_eq(kvp_model_num_params(&c), base + 32LL * (65536 - 8) * expert);
    /* A config filled by hand past the bound saturates instead of wrapping negative. */
    c.intermediate_size = c.moe_intermediate_size = 1LL << 40;
    cr_assert_eq(kvp_model_num_params(&c), INT64_MAX);
    cr_assert_gt(kvp_model_active_params(&c), 0);
}

/* Seeded random edits of every shared config: each mutant either loads, and then its parameter count, KV
 * size and memory plan (tp 1, 2, 8) come out or fail with a named error, or it fails to load with an error
 * naming the file. Under the sanitizer build an overflow in any of those products is a failure. */
Test(model_config, random_corruption_loads_and_plans_or_fails_cleanly)
{
    const char *sub[] = {"", "/derived"};
    char path[300];
    snprintf(path, sizeof path, "%s/kvp_config_mutant.json", tu_tmpdir());
    uint64_t rng = 0x6a09e667f3bcc908ull;
    int loaded = 0, trials = 0;
    for (int d = 0; d < 2; d++) {
        char dir[256];
        snprintf(dir, sizeof dir, CONFIGS "%s", sub[d]);
        DIR *dp = opendir(dir);
        cr_assert_not_null(dp, "cannot open %s: the shared data must be present", dir);
        struct dirent *e;
        while ((e = readdir(dp)) != NULL) {
            size_t n = strlen(e->d_name);
            if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
            char src[600];
            snprintf(src, sizeof src, "%s/%s", dir, e->d_name);
            size_t len;
            unsigned char *orig = tu_read_all(src, &len), *c = malloc(len);
            for (int i = 0; i < 150; i++, trials++) {
                tu_write_mutant(path, orig, c, len, 0, len, 0, &rng);
                kvp_model_config cfg;
                kvp_status st = kvp_model_config_load(path, &cfg);
                if (st != KVP_OK) {
                    void *none = NULL;
                    FZ_FAILED_CLEANLY(st, none, "kvp_config_mutant.json", trials);
                    continue;
                }
                loaded++;
                cr_assert_geq(kvp_model_active_params(&cfg), 0, "trial %d", trials);
                cr_assert_leq(kvp_model_active_params(&cfg), kvp_model_num_params(&cfg), "trial %d", trials);
                cr_assert_geq(kvp_model_kv_elems_per_token(&cfg), 0, "trial %d", trials);
                for (int tp = 1; tp <= 8; tp *= 2) {
                    if (tp == 4) continue;
                    kvp_plan_params p;
                    kvp_plan_params_default(&cfg, &p);
                    p.gpu_mem_bytes = 80LL << 30;
                    p.tp = tp;
                    kvp_plan plan;
                    st = kvp_plan_compute(&cfg, &p, &plan);
                    cr_assert(st == KVP_OK || (st == KVP_EINVAL && kvp_error_message()[0]), "trial %d: %s", trials,
                              kvp_status_str(st));
                    if (st == KVP_OK) cr_assert_geq(plan.per_rank.num_blocks, 0, "trial %d", trials);
                }
            }
            free(c);
            free(orig);
        }
        closedir(dp);
    }
    cr_assert(loaded > 0 && loaded < trials, "%d of %d mutants loaded", loaded, trials);
}

/* generation_config.json's sampling defaults: the fields given, and each out-of-range value refused by name. */
Test(model_config, generation_config_sampling_defaults)
{
    kvp_model_config c;
    memset(&c, 0, sizeof c);
    cJSON *j = cJSON_Parse("{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
                           "\"eos_token_id\": [151645, 151643]}");
    cr_assert_eq(kvp_model_config_sampling(j, "g.json", &c), KVP_OK, "%s", kvp_error_detail());
    cJSON_Delete(j);
    cr_assert_eq(c.sampling.given, KVP_SAMPLING_TEMPERATURE | KVP_SAMPLING_TOP_K | KVP_SAMPLING_TOP_P);
    cr_assert(c.sampling.temperature == 0.6 && c.sampling.top_k == 20 && c.sampling.top_p == 0.95);
    /* a real one: DeepSeek-R1-Distill-Qwen-32B's (do_sample, temperature 0.6, top_p 0.95) */
    memset(&c, 0, sizeof c);
    cr_assert_eq(kvp_json_parse_file(CONFIGS "/tokenizer_configs/DeepSeek-R1-Distill-Qwen-32B.generation_config.json", &j),
                 KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_model_config_sampling(j, "generation_config.json", &c), KVP_OK, "%s", kvp_error_detail());
    cJSON_Delete(j);
    cr_assert_eq(c.sampling.given, KVP_SAMPLING_TEMPERATURE | KVP_SAMPLING_TOP_P);
    cr_assert(c.sampling.temperature == 0.6 && c.sampling.top_p == 0.95);
    static const struct {
        const char *json, *names;
    } bad[] = {
        {"{\"temperature\": -0.1}", "\"temperature\": -0.1 is out of range [0, 1e+06]"},
        {"{\"top_p\": 0}", "\"top_p\": 0 is out of range (0, 1]"},
        {"{\"top_k\": 2.5}", "\"top_k\": 2.5 is out of range [-1, 2.14748e+09], an integer"},
        {"{\"min_p\": 1.5}", "\"min_p\": 1.5"},
        {"{\"repetition_penalty\": 0}", "\"repetition_penalty\": 0 is out of range (0, 10]"},
        {"{\"max_new_tokens\": 0}", "\"max_new_tokens\": 0"},
        {"{\"temperature\": \"hot\"}", "\"temperature\" must be a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&c, 0, sizeof c);
        j = cJSON_Parse(bad[i].json);
        cr_assert_eq(kvp_model_config_sampling(j, "g.json", &c), KVP_EPARSE, "%s", bad[i].json);
        cJSON_Delete(j);
        cr_assert(strstr(kvp_error_message(), bad[i].names) && strstr(kvp_error_message(), "g.json"), "%s: %s",
                  bad[i].json, kvp_error_message());
    }
}

/* The context vLLM derives: max_position_embeddings, stretched by linear/dynamic factors, or YaRN's original
 * context times its factor (Qwen3 with its model card's YaRN: 131,072); plan's default --seq-len is it. */
Test(model_config, context_length_as_vllm_derives_it)
{
    kvp_model_config c = load("Qwen3-8B.json");
    cr_assert_eq(kvp_model_config_context(&c), 40960);
    kvp_plan_params p;
    snprintf(c.rope_scaling_type, sizeof c.rope_scaling_type, "yarn");
    c.rope_scaling_factor = 4;
    c.rope_original_max_position = 32768;
    cr_assert_eq(kvp_model_config_context(&c), 131072);
    kvp_plan_params_default(&c, &p);
    cr_assert_eq(p.seq_len, 131072);
    c.rope_original_max_position = 0; /* none given: max_position_embeddings is the original */
    cr_assert_eq(kvp_model_config_context(&c), 4 * 40960);
    snprintf(c.rope_scaling_type, sizeof c.rope_scaling_type, "linear");
    c.rope_scaling_factor = 2;
    cr_assert_eq(kvp_model_config_context(&c), 81920);
    snprintf(c.rope_scaling_type, sizeof c.rope_scaling_type, "dynamic");
    cr_assert_eq(kvp_model_config_context(&c), 81920);
    c = load("DeepSeek-V3.json"); /* yarn: 4,096 x 40, its max_position_embeddings too */
    cr_assert_eq(kvp_model_config_context(&c), 163840);
    c = load("Meta-Llama-3.1-8B.json"); /* llama3 scaling: the length is max_position_embeddings already */
    cr_assert_eq(kvp_model_config_context(&c), 131072);
}
