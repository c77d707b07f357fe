/* Tensor parallelism for real: `mpirun -np N kvpage generate --tp N` over Open MPI ranks on stories260K.
 * The greedy tokens must be golden.json's for every split (heads split at tp 2 and 4, KV heads replicated
 * and the MLP split unevenly at tp 8), each rank must hold 1/tp of the KV cache, sampled runs must agree
 * across ranks, and the errors (a split that does not divide the heads, --tp N in a job of fewer ranks) must be
 * named. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"
#include "common/json.h"
#include "runtime/model_testutil.h"

/* Every process that starts MPI runs without LeakSanitizer's exit check: Open MPI keeps allocations to its
 * end, many in plugins it has unloaded by then (frames no suppression can name). The sanitizer build still
 * checks these processes for memory errors, and the same code at --tp 1 (no MPI) for leaks.
 * mpirun as root needs the two OMPI_ALLOW variables; --oversubscribe: more ranks than this machine's cores. */
#define NO_LSAN "ASAN_OPTIONS=detect_leaks=0 "
#define MPIRUN NO_LSAN "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe"

/* Runs `generate ARGS --json` on np ranks (np 0: without mpirun); returns the parsed output. */
static cJSON *generate(int np, const char *args)
{
    char cmd[4096], *out, *err;
    if (np > 0) snprintf(cmd, sizeof cmd, MPIRUN " -np %d %s generate --tp %d %s --json", np, kvp_test_bin(), np, args);
    else snprintf(cmd, sizeof cmd, "%s generate %s --json", kvp_test_bin(), args);
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 0, "`%s` exited %d: %s", cmd, rc, err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "generate output", &j), KVP_OK, "`%s` printed: %s", cmd, out);
    free(out);
    free(err);
    return j;
}

static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert_not_null(v, "no field %s", k);
    return v;
}

Test(tp_mpi, golden_story_on_2_4_and_8_ranks_from_gguf_and_hf)
{
    tu_require_shared();
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c0 = cJSON_GetArrayItem(field(gold, "cases"), 0), *want = field(c0, "tokens_after_bos");
    const char *models[2] = {S260_GGUF, S260_HF};
    const int nps[3] = {2, 4, 8};
    double bytes1 = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            if (k == 1 && nps[i] == 8) continue; /* the HF folder at 2 and 4 ranks is enough */
            char args[512];
            snprintf(args, sizeof args, "--model %s --prompt '' --max-tokens %d --ignore-eos", models[k],
                     cJSON_GetArraySize(want));
            cJSON *j = generate(nps[i], args);
            const cJSON *r0 = cJSON_GetArrayItem(field(j, "requests"), 0), *toks = field(r0, "tokens");
            cr_assert_eq(cJSON_GetArraySize(toks), cJSON_GetArraySize(want));
            for (int t = 0; t < cJSON_GetArraySize(want); t++)
                cr_assert_eq(cJSON_GetArrayItem(toks, t)->valueint, cJSON_GetArrayItem(want, t)->valueint,
                             "%s on %d ranks: token %d", models[k], nps[i], t);
            const cJSON *tot = field(j, "totals");
            cr_assert_eq(field(tot, "tp")->valueint, nps[i]);
            if (bytes1 == 0) {
                snprintf(args, sizeof args, "--model %s --prompt '' --max-tokens %d", models[k], cJSON_GetArraySize(want));
                cJSON *one = generate(0, args);
                bytes1 = field(field(one, "totals"), "kv_pool_bytes")->valuedouble;
                cJSON_Delete(one);
            }
            /* 4 KV heads: a rank holds 4/tp of them, or one replica past 4 ranks */
            const double share = nps[i] <= 4 ? 1.0 / nps[i] : 0.25;
            const double pool = field(tot, "kv_pool_bytes")->valuedouble;
            cr_assert_float_eq(pool, bytes1 * share, 0.5, "%d ranks", nps[i]);
            /* and `kvpage plan`'s per-rank KV bytes per token, from config.json alone, agree */
            char cmd[1024], *out, *err;
            snprintf(cmd, sizeof cmd, "%s plan --config " S260_HF "/config.json --tp %d --kv-dtype fp32 --json",
                     kvp_test_bin(), nps[i]);
            cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
            cJSON *plan;
            cr_assert_eq(kvp_json_parse(out, strlen(out), "plan output", &plan), KVP_OK);
            const double per_token = field(field(plan, "per_rank"), "kv_bytes_per_token")->valuedouble;
            cr_assert_float_eq(pool, per_token * field(tot, "num_blocks")->valuedouble *
                                         field(tot, "block_size")->valuedouble, 0.5,
                               "%d ranks: plan says %g bytes per token per rank", nps[i], per_token);
            cJSON_Delete(plan);
            free(out);
            free(err);
            cJSON_Delete(j);
        }
    cJSON_Delete(gold);
}

/* Sampling, parallel samples forked from the prompt's blocks, several prompts batched, block size 1, with and
 * without speculative decoding: every rank must draw the same tokens (the command checks that the ranks agree and fails otherwise), and the
 * split sums' rounding must leave greedy log-probabilities as on one rank. */
Test(tp_mpi, sampled_batched_runs_agree_across_ranks)
{
    tu_require_shared();
    const char *args = "--model " S260_GGUF " --prompt 'Once upon a time' --prompt 'The cat' --prompt '' "
                       "--max-tokens 24 --temperature 0.9 --top-p 0.95 --n 3 --block-size 1 --seed 7";
    cJSON *j = generate(2, args);
    const cJSON *reqs = field(j, "requests");
    cr_assert_eq(cJSON_GetArraySize(reqs), 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(cJSON_GetArraySize(field(cJSON_GetArrayItem(reqs, i), "samples")), 3);
    /* speculating, the ranks still agree, and draw what they drew without it */
    char spec[1024];
    snprintf(spec, sizeof spec, "%s --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":4,"
             "\"prompt_lookup_max\":2,\"prompt_lookup_min\":1}'", args);
    cJSON *k = generate(2, spec);
    for (int i = 0; i < 3; i++)
        cr_assert(cJSON_Compare(field(cJSON_GetArrayItem(reqs, i), "samples"),
                                field(cJSON_GetArrayItem(field(k, "requests"), i), "samples"), 1),
                  "prompt %d: the speculating ranks drew other samples", i);
    cr_assert_gt(field(field(k, "totals"), "spec_accepted_tokens")->valuedouble, 0);
    cJSON_Delete(k);
    cJSON_Delete(j);

    const char *greedy = "--model " S260_GGUF " --prompt 'Once upon a time' --prompt 'Lily' --max-tokens 40";
    cJSON *a = generate(0, greedy), *b = generate(4, greedy);
    for (int i = 0; i < 2; i++) {
        const cJSON *ra = cJSON_GetArrayItem(field(a, "requests"), i), *rb = cJSON_GetArrayItem(field(b, "requests"), i);
        cr_assert_str_eq(field(ra, "text")->valuestring, field(rb, "text")->valuestring);
        const double la = field(cJSON_GetArrayItem(field(ra, "samples"), 0), "logprob")->valuedouble,
                     lb = field(cJSON_GetArrayItem(field(rb, "samples"), 0), "logprob")->valuedouble;
        cr_assert(fabs(la - lb) <= 1e-4 * fabs(la) + 1e-5, "prompt %d: log-probability %.9g on 1 rank, %.9g on 4", i,
                  la, lb);
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* The engine on the cpu executor (`simulate --executor cpu`) over 2 ranks, each with half the KV memory and
 * so the same number of blocks: rank 0's clock drives both, and the run's decisions (admissions,
 * preemptions by swap or recompute, prefix hits, evictions) are those of one rank; only times differ. */
Test(tp_mpi, the_engine_on_two_ranks_decides_as_on_one)
{
    tu_require_shared();
    static const char *same[] = {"finished", "steps", "preemptions", "swap_outs", "prefix_hit_rate", "evicted_blocks",
                                 "kv_capacity_tokens", "leaked_blocks"};
    const char *preempt[2] = {"swap", "recompute"};
    for (int k = 0; k < 2; k++) {
        char cmd[2][2048], *out, *err;
        cJSON *o[2];
        for (int tp = 1; tp <= 2; tp++) {
            snprintf(cmd[tp - 1], sizeof cmd[0],
                     "%s%s simulate --executor cpu --tp %d --model %s --workload system:n=24,prefix=64,suffix=16,"
                     "output=16 --rate inf --cache radix --watermark-blocks 0 --max-num-seqs 4 --preempt %s "
                     "--swap-space 1MB --kv-mem %s --check --json",
                     tp > 1 ? MPIRUN " -np 2 " : "", kvp_test_bin(), tp, S260_GGUF, preempt[k], tp > 1 ? "100KB" : "200KB");
            int rc = kvp_test_sh(cmd[tp - 1], &out, &err);
            cr_assert_eq(rc, 0, "`%s` exited %d: %s", cmd[tp - 1], rc, err);
            cr_assert_eq(kvp_json_parse(out, strlen(out), "simulate output", &o[tp - 1]), KVP_OK, "%s", out);
            free(out);
            free(err);
        }
        for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
            cr_assert_eq(kvp_test_num(o[1], same[i]), kvp_test_num(o[0], same[i]), "--preempt %s: %s %g on 2 ranks, "
                         "%g on one", preempt[k], same[i], kvp_test_num(o[1], same[i]), kvp_test_num(o[0], same[i]));
        cr_assert_eq(kvp_test_num(o[1], "finished"), 24);
        cr_assert_gt(kvp_test_num(o[1], "preemptions"), 0, "--preempt %s was meant to preempt", preempt[k]);
        cr_assert_eq(kvp_test_num(o[1], "tp"), 2);
        cr_assert_eq(kvp_test_num(o[1], "kv_bytes_per_token") * 2, kvp_test_num(o[0], "kv_bytes_per_token"));
        cJSON_Delete(o[0]);
        cJSON_Delete(o[1]);
    }
}

/* Runs cmd: it must exit 2 with needle in its error. */
static void expect_error(const char *cmd, const char *needle)
{
    char *out, *err;
    int rc = kvp_test_sh(cmd, &out, &err);
    cr_assert_eq(rc, 2, "`%s` exited %d: %s", cmd, rc, err);
    cr_assert(strstr(err, needle), "`%s`: '%s' lacks '%s'", cmd, err, needle);
    free(out);
    free(err);
}

Test(tp_mpi, splits_that_do_not_work_fail_with_a_named_error)
{
    tu_require_shared();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, MPIRUN " -np 3 %s generate --tp 3 --model %s --prompt hi", kvp_test_bin(), S260_GGUF);
    expect_error(cmd, "cannot split the model over 3 ranks: --tp 3 does not divide the 8 attention heads");
    /* --tp 2 in a job of one rank (without mpirun the ranks are threads instead: test_tp_threads.c) */
    snprintf(cmd, sizeof cmd, MPIRUN " -np 1 %s generate --tp 2 --model %s --prompt hi", kvp_test_bin(), S260_GGUF);
    expect_error(cmd, "this MPI job has 1 (start it with `mpirun -np 2 ...`)");
    snprintf(cmd, sizeof cmd, "%s generate --tp 0 --model %s --prompt hi", kvp_test_bin(), S260_GGUF);
    expect_error(cmd, "--tp: ");
}
