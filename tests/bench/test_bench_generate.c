/* Tests of `kvpage bench generate` end to end on stories260K: the greedy output is validated (golden story,
 * batch invariance) before timing, each mode generates exactly sequences x max_tokens tokens in its fastest
 * of --reps rounds, the batched row's speedup is its tokens/s over the single row's, kv_read_gbps counts the
 * keys each row reads; with --speculative-config the rows speculate (fewer steps, the same validation); bad
 * input exits 2. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"
#include "common/json.h"

#include "cli_testutil.h"

Test(bench_generate, validated_rows_per_mode, .timeout = 120)
{
    static char out[1 << 15], err[1 << 14];
    int rc = kvp_test_cli("bench generate --batch 5 --max-tokens 12 --reps 2 --threads 1,2 --format json", out, sizeof out,
                          err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "stdout is not JSON: %.200s", out);
    const cJSON *rows = kvp_test_rows(o);
    cr_assert_eq(cJSON_GetArraySize(rows), 4, "two thread counts x (single, batched)");
    for (int i = 0; i < 4; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const int batched = i % 2;
        const cJSON *mode = cJSON_GetObjectItemCaseSensitive(r, "mode");
        cr_assert(cJSON_IsString(mode));
        cr_assert_str_eq(mode->valuestring, batched ? "batched" : "single");
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")), "row %d not validated", i);
        cr_assert_eq(kvp_test_num(r, "threads"), i < 2 ? 1 : 2);
        cr_assert_eq(kvp_test_num(r, "reps"), 2);
        cr_assert_eq(kvp_test_num(r, "sequences"), batched ? 5 : 1);
        cr_assert_eq(kvp_test_num(r, "generated"), kvp_test_num(r, "sequences") * 12,
                     "every sequence generates max_tokens (EOS ignored)");
        cr_assert_gt(kvp_test_num(r, "wall_s"), 0);
        cr_assert_float_eq(kvp_test_num(r, "tokens_per_s"), kvp_test_num(r, "generated") / kvp_test_num(r, "wall_s"),
                           1e-6 * kvp_test_num(r, "tokens_per_s"));
        /* each sequence's rows sit at positions 0 .. 11 (BOS, then 11 sampled tokens) and read 1 + ... + 12
         * keys; a key is K and V of 4 KV heads x 8 dims in f32 in each of stories260K's 5 layers */
        const double kv_bytes = kvp_test_num(r, "sequences") * (12 * 13 / 2) * (5 * 2 * 4 * 8 * 4.0);
        cr_assert_float_eq(kvp_test_num(r, "kv_read_gbps"), kv_bytes / kvp_test_num(r, "wall_s") / 1e9,
                           1e-6 * kvp_test_num(r, "kv_read_gbps"));
        if (batched) {
            const cJSON *single = cJSON_GetArrayItem(rows, i - 1);
            cr_assert_float_eq(kvp_test_num(r, "speedup_vs_single"),
                               kvp_test_num(r, "tokens_per_s") / kvp_test_num(single, "tokens_per_s"),
                               1e-3 * kvp_test_num(r, "speedup_vs_single"));
        } else {
            cr_assert_eq(kvp_test_num(r, "speedup_vs_single"), 1);
        }
    }
    cJSON_Delete(o);
}

/* `bench generate ARGS --reps 1 --format json` (exit 0): its rows, a single and a batched one; *doc is the
 * report (the caller deletes it). */
static const cJSON *two_rows(const char *args, cJSON **doc)
{
    static char out[1 << 15], err[1 << 14];
    char cmd[512];
    snprintf(cmd, sizeof cmd, "bench generate %s --reps 1 --format json", args);
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: exit %d: %s", args, rc, err);
    *doc = cJSON_Parse(out);
    cr_assert_not_null(*doc, "stdout is not JSON: %.200s", out);
    const cJSON *rows = kvp_test_rows(*doc);
    cr_assert_eq(cJSON_GetArraySize(rows), 2);
    return rows;
}

/* --speculative-config: the greedy validation (golden story, batch invariance) passes speculating, each mode
 * still generates exactly sequences x max_tokens tokens, in fewer steps than tokens, with drafts kept. */
Test(bench_generate, speculative_rows, .timeout = 120)
{
    cJSON *o;
    const cJSON *rows = two_rows("--batch 3 --max-tokens 120 --temperature 0 --speculative-config "
                                 "'{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":3,"
                                 "\"prompt_lookup_min\":2}'", &o);
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")), "row %d not validated", i);
        cr_assert_eq(kvp_test_num(r, "spec_tokens"), 4);
        cr_assert_eq(kvp_test_num(r, "temperature"), 0);
        cr_assert_eq(kvp_test_num(r, "generated"), kvp_test_num(r, "sequences") * 120);
        cr_assert_lt(kvp_test_num(r, "steps"), 120, "row %d: no step gained a token", i);
        cr_assert(kvp_test_num(r, "spec_acceptance") > 0 && kvp_test_num(r, "spec_acceptance") <= 1, "row %d", i);
    }
    cJSON_Delete(o);
}

/* --skip-attention: the rows say so, are not validated (their tokens are not the model's) and read no K/V,
 * and still generate every token; without it the rows say the attention ran. */
Test(bench_generate, skip_attention_rows, .timeout = 120)
{
    for (int skip = 0; skip < 2; skip++) {
        cJSON *o;
        const cJSON *rows =
            two_rows(skip ? "--batch 3 --max-tokens 8 --skip-attention" : "--batch 3 --max-tokens 8", &o);
        for (int i = 0; i < 2; i++) {
            const cJSON *r = cJSON_GetArrayItem(rows, i);
            cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(r, "attention")->valuestring, skip ? "skipped" : "on");
            cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")) == !skip, "skip %d row %d",
                      skip, i);
            cr_assert_eq(kvp_test_num(r, "kv_read_gbps") > 0, !skip, "skip %d row %d", skip, i);
            cr_assert_eq(kvp_test_num(r, "generated"), kvp_test_num(r, "sequences") * 8);
        }
        cJSON_Delete(o);
    }
}

/* The KV cache's element type reaches the rows; f16 still reproduces the golden story, fp8 (whose story
 * differs) is validated by batch invariance alone. */
Test(bench_generate, kv_dtype_rows, .timeout = 120)
{
    static const char *const dts[2] = {"f16", "fp8"};
    for (int k = 0; k < 2; k++) {
        char args[64];
        snprintf(args, sizeof args, "--batch 3 --max-tokens 8 --kv-dtype %s", dts[k]);
        cJSON *o;
        const cJSON *rows = two_rows(args, &o);
        for (int i = 0; i < 2; i++) {
            const cJSON *r = cJSON_GetArrayItem(rows, i);
            cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(r, "kv_dtype")->valuestring, dts[k]);
            cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")), "%s row %d", dts[k], i);
            cr_assert_eq(kvp_test_num(r, "generated"), kvp_test_num(r, "sequences") * 8);
        }
        cJSON_Delete(o);
    }
}

/* --lanes picks the invariant matmul's vectors (the default: the widest the CPU has); blas rows report 0 and
 * come once. */
Test(bench_generate, lanes_rows, .timeout = 120)
{
    static char out[1 << 14], err[1 << 14];
    int rc = kvp_test_cli("bench generate --batch 2 --max-tokens 4 --reps 1 --lanes 8 --matmul invariant,blas "
                          "--format json",
                          out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "stdout is not JSON: %.200s", out);
    const cJSON *rows = kvp_test_rows(o);
    cr_assert_eq(cJSON_GetArraySize(rows), 4, "invariant and blas x (single, batched)");
    for (int i = 0; i < 4; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert_eq(kvp_test_num(r, "lanes"), i < 2 ? 8 : 0, "row %d", i);
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")), "row %d", i);
    }
    cJSON_Delete(o);
    rc = kvp_test_cli("bench generate --batch 2 --max-tokens 4 --reps 1 --format json", out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert_not_null(o = cJSON_Parse(out));
    rows = kvp_test_rows(o);
    const double lanes = kvp_test_num(cJSON_GetArrayItem(rows, 0), "lanes");
    cr_assert(lanes == 8 || lanes == 16, "default lanes %g", lanes);
    /* stories260K's head_dim 8: both attention passes on the widest lanes by default */
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(rows, 0), "attn_lanes");
    const char *want = kvp_cpu_max_lanes() == 16 ? "16/16" : "8/8";
    cr_assert(cJSON_IsString(al) && strcmp(al->valuestring, want) == 0, "attn_lanes %s, expected %s",
              cJSON_IsString(al) ? al->valuestring : "(missing)", want);
    cJSON_Delete(o);
}

Test(bench_generate, bad_input_exits_2)
{
    static const kvp_cli_case cases[] = {
        {"--reps 0", "--reps"},
        {"--batch x", "--batch"},
        {"--matmul fast", "fast"},
        {"--threads 0", "--threads"},
        {"--threads 1,,2", "--threads"},
        {"--matmul blas,", "empty item"},
        {"--model ../shared/models/nope.gguf", "nope.gguf"},
        {"--bogus", "bogus"},
        {"--kv-dtype f17", "--kv-dtype"},
        {"--lanes 4", "--lanes"},
        {"--lanes 12", "8 or 16"},
        {"--attn-lanes 9", "'9' is not a lane count"},
        {"--temperature -1", "--temperature"},
        {"--speculative-config '{\"method\":\"eagle\",\"num_speculative_tokens\":2}'", "not \"ngram\""},
        /* a golden file with nothing to compare would validate any model */
        {"--golden /tmp/kvp_bg_empty_golden.json", "no \"cases\"[0].\"tokens_after_bos\" token list"},
    };
    FILE *f = fopen("/tmp/kvp_bg_empty_golden.json", "w");
    cr_assert_not_null(f);
    fputs("{\"cases\": [{\"tokens_after_bos\": \"abc\"}]}\n", f);
    fclose(f);
    kvp_test_cli_rejects("bench generate --max-tokens 2", cases, sizeof cases / sizeof cases[0]);
    remove("/tmp/kvp_bg_empty_golden.json");
}

/* scripts/synth-model.py writes an HF folder the loader takes (random weights, the stories260K tokenizer):
 * the bench validates its batch invariance and generates with it; an impossible shape is refused. */
Test(bench_generate, synthetic_model_runs, .timeout = 120)
{
    char dir[] = "/tmp/kvp_synth_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s scripts/synth-model.py %s --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 2>/dev/null",
             kvp_test_python(), dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    static char out[1 << 14], err[1 << 14];
    snprintf(cmd, sizeof cmd, "bench generate --model %s --batch 3 --max-tokens 5 --reps 1 --format json", dir);
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "stdout is not JSON: %.200s", out);
    const cJSON *rows = kvp_test_rows(o);
    cr_assert_eq(cJSON_GetArraySize(rows), 2);
    const cJSON *r;
    cJSON_ArrayForEach(r, rows)
    {
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "validated")));
        cr_assert_eq(kvp_test_num(r, "generated"), kvp_test_num(r, "sequences") * 5);
    }
    cJSON_Delete(o);
    snprintf(cmd, sizeof cmd, "%s scripts/synth-model.py %s --hidden 60 --heads 8 2>/dev/null", kvp_test_python(), dir);
    cr_assert_neq(system(cmd), 0, "hidden 60 is not a multiple of 8 heads");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
