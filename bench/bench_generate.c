/* bench/bench_generate.c — `kvpage bench generate`: decode throughput of the CPU executor on a real model,
 * single-stream (one sequence) vs batched (N concurrent sequences), through the same continuous-batching
 * loop (runtime/engine/session.h) as `kvpage generate`.
 *
 * Before timing, the model's greedy output is validated: on stories260K the single-stream greedy tokens from an
 * empty prompt must equal golden.json's published story (not with an fp8 KV cache, nor bf16 or q8_0 weights:
 * their rounding changes the story), and one prompt's greedy tokens must be the same alone and inside the batch
 * (batch invariance). Timed runs sample at temperature 1 with per sequence seeds (so the N sequences differ) and
 * ignore EOS, so every run generates exactly sequences x max_tokens tokens. tokens_per_s is wall time;
 * tokens_per_cpu_s uses the process CPU time, which a busy shared machine disturbs less. The two modes are timed
 * interleaved, --reps rounds of (single, batched), and each reports its fastest round: a load swing
 * on the shared machine hits both alike, and a single-stream run (tens of milliseconds) is not judged on
 * one sample. kv_read_gbps is the K/V bytes the attention read in that round (each row's keys and values up
 * to its position, every layer; kvp_run_stats.attended_positions) over its wall time, to read against the
 * machine's memory bandwidth once a batch's KV outgrows the caches. With --speculative-config every run (the
 * validation too) speculates; spec_acceptance is the share of draft tokens kept and steps the round's steps.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "attention/attention.h"
#include "bench/bench.h"
#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/timer.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/model/model.h"

static const char *const k_fields[] = {"model",        "mode",         "sequences",        "threads",          "matmul",
                                       "lanes",        "attn_lanes",   "block_size",       "kv_dtype",         "weight_dtype",
                                       "max_tokens",   "temperature",  "spec_tokens",      "spec_max_batch",
                                       "reps",         "generated",    "wall_s",           "cpu_s",            "tokens_per_s",
                                       "tokens_per_cpu_s", "speedup_vs_single", "kv_read_gbps", "steps",
                                       "spec_acceptance", "attention", "validated"};
#define NFIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))
/* the default table's columns (--wide: all) */
static const char *const k_brief[] = {"mode", "sequences", "threads", "kv_dtype", "weight_dtype", "tokens_per_s", "speedup_vs_single", "validated"};


static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage bench generate [options]\n\n"
               "Decode tokens/s of the CPU executor: one sequence vs a batch of concurrent sequences, and\n"
               "kv_read_gbps, the K/V bytes the attention read per second (every row's keys and values, every layer).\n\n"
               "  --model PATH          GGUF file or HF folder (default ../shared/models/stories260K/stories260K.gguf)\n"
               "  --batch N             concurrent sequences of the batched run (default 64)\n"
               "  --max-tokens N        tokens generated per sequence (default 256)\n"
               "  --threads LIST        comma-separated thread counts (default 2)\n"
               "  --matmul LIST         invariant,blas (default invariant)\n"
               "  --lanes LIST          vector lanes of the invariant matmul: 8, 16 (AVX-512; the same bits)\n"
               "                        (default: the widest this CPU has; blas rows report 0)\n"
               "  --attn-lanes L        vector lanes of the attention: auto, 8 or 16 (AVX-512;\n"
               "                        equal to rounding) (default auto; column attn_lanes: the score/value\n"
               "                        passes' lanes in decode)\n"
               "  --block-size N        KV block size (default 16)\n"
               "  --kv-dtype T          KV cache element type: auto (the model's dtype), f32, f16, bf16 or fp8\n"
               "                        (default auto)\n"
               "  --weight-dtype T      weight matrices in f32, f16, bf16, q8_0 or auto (default: as stored)\n"
               "  --temperature F       of the timed runs (default 1; 0: greedy)\n"
               "  --speculative-config J  n-gram speculative decoding in every run, vLLM's JSON (as for generate)\n"
               "  --skip-attention      timing only: each layer's attention output is a copy of its queries\n"
               "                        (wrong tokens; rows not validated, column attention \"skipped\"): the\n"
               "                        rest of the step, the ceiling no attention kernel could pass\n"
               "  --reps N              rounds of (single, batched), fastest round reported (default 3)\n"
               "  --golden PATH         golden.json to validate against (default: golden.json beside the model)\n"
               "  --format table|csv|json  (default table, 100 columns wide)\n"
               "  --json                same as --format json\n"
               "  --wide                a table with every column (same as --format wide)\n"
               "  -h, --help            this help\n");
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Greedy checks with the runs' config sp: the golden story (when a golden file is given) and batch invariance. */
static kvp_status validate(kvp_model *m, const char *golden, const kvp_session_config *sp, int *ok)
{
    *ok = 1;
    int32_t bos = 1;
    const kvp_dtype kv_dtype = sp->kv_dtype;
    const kvp_weight_type wt = kvp_model_weight_type(m);
    if (golden && kv_dtype != KVP_DTYPE_FP8_E4M3 && (wt == KVP_WEIGHT_F32 || wt == KVP_WEIGHT_F16)) {
        cJSON *g;
        KVP_TRY(kvp_json_parse_file(golden, &g));
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "cases"), 0);
        const cJSON *want = cJSON_GetObjectItem(c0, "tokens_after_bos");
        int32_t n = cJSON_IsArray(want) ? cJSON_GetArraySize(want) : 0;
        for (int32_t i = 0; i < n; i++)
            if (!cJSON_IsNumber(cJSON_GetArrayItem(want, i))) n = 0;
        if (n == 0) { /* nothing to compare would pass every model */
            cJSON_Delete(g);
            return KVP_ERR(KVP_EPARSE, "%s: no \"cases\"[0].\"tokens_after_bos\" token list to validate against", golden);
        }
        kvp_session_request r = {.prompt = &bos, .n_prompt = 1, .max_tokens = n, .sampler = kvp_sampler_default(), .n = 1};
        kvp_session_result res;
        kvp_status st = kvp_cpu_generate(m, sp, &r, 1, &res, NULL, NULL, NULL);
        if (st != KVP_OK) {
            cJSON_Delete(g);
            return st;
        }
        for (int32_t i = 0; i < n; i++)
            if (i >= res.n_tokens[0] || res.tokens[0][i] != cJSON_GetArrayItem(want, i)->valueint) *ok = 0;
        kvp_session_results_free(&res, 1);
        cJSON_Delete(g);
    }
    /* one greedy prompt alone and among 7 sampled ones */
    kvp_session_request rs[8];
    for (int i = 0; i < 8; i++)
        rs[i] = (kvp_session_request){.prompt = &bos, .n_prompt = 1, .max_tokens = 32, .n = 1,
                                  .sampler = {.temperature = i ? 1.0 : 0.0, .top_k = 0, .top_p = 1.0, .seed = (uint64_t)i}};
    kvp_session_result a, all[8];
    KVP_TRY(kvp_cpu_generate(m, sp, rs, 1, &a, NULL, NULL, NULL));
    kvp_status st = kvp_cpu_generate(m, sp, rs, 8, all, NULL, NULL, NULL);
    if (st == KVP_OK) {
        if (a.n_tokens[0] != all[0].n_tokens[0] ||
            memcmp(a.tokens[0], all[0].tokens[0], sizeof(int32_t) * (size_t)a.n_tokens[0]) != 0)
            *ok = 0;
        kvp_session_results_free(all, 8);
    }
    kvp_session_results_free(&a, 1);
    return st;
}

static kvp_status timed(kvp_model *m, int32_t nseq, int32_t max_tokens, double temperature, const kvp_session_config *sp,
                        double *cpu, kvp_run_stats *st)
{
    int32_t bos = 1;
    kvp_session_request *rs = kvp_calloc((size_t)nseq, sizeof *rs);
    kvp_session_result *res = kvp_calloc((size_t)nseq, sizeof *res);
    if (!rs || !res) {
        kvp_free(rs);
        kvp_free(res);
        return KVP_ERR(KVP_ENOMEM, "out of memory");
    }
    for (int32_t i = 0; i < nseq; i++)
        rs[i] = (kvp_session_request){.prompt = &bos, .n_prompt = 1, .max_tokens = max_tokens, .n = 1,
                                  .sampler = {.temperature = temperature, .top_k = 0, .top_p = 1.0, .seed = 1000 + (uint64_t)i}};
    kvp_session_config cfg = *sp;
    cfg.engine.cache = KVP_PC_NONE;
    cfg.engine.skip_logprob = 1; /* as serve and generate without --json: no log-sum-exp over the vocabulary per token */
    double c0 = cpu_s();
    kvp_status s = kvp_cpu_generate(m, &cfg, rs, nseq, res, st, NULL, NULL);
    *cpu = cpu_s() - c0;
    if (s == KVP_OK) kvp_session_results_free(res, nseq);
    kvp_free(rs);
    kvp_free(res);
    return s;
}

static kvp_status parse_matmul(const char *s, void *out) { return kvp_matmul_kind_parse(s, out); }

int kvp_bench_generate(int argc, char **argv)
{
    const char *cmd = "bench generate";
    const char *model = "../shared/models/stories260K/stories260K.gguf", *golden = NULL;
    int32_t threads_v[16] = {2};
    kvp_matmul_kind matmul_v[4] = {KVP_MATMUL_INVARIANT};
    int32_t lanes_v[2];
    int nthreads = 1, nmatmul = 1, nlanes = 0, attn_lanes = 0, skip_attn = 0;
    int32_t batch = 64, max_tokens = 256, bs = 16, reps = 3;
    kvp_dtype kv_dtype = KVP_DTYPE_F32;
    double temperature = 1.0;
    kvp_session_config sp = kvp_session_config_default(); /* the runs' config: speculation (--speculative-config), and below */
    int kv_auto = 1;
    kvp_weight_type wdtype = KVP_WEIGHT_AUTO;
    kvp_format fmt = KVP_FMT_TABLE;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},      {"batch", required_argument, 0, 'b'},
                                         {"max-tokens", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
                                         {"matmul", required_argument, 0, 'x'},     {"block-size", required_argument, 0, 's'},
                                         {"golden", required_argument, 0, 'g'},     {"format", required_argument, 0, 'f'},
                                         {"reps", required_argument, 0, 'r'},       {"kv-dtype", required_argument, 0, 'k'},
                                         {"weight-dtype", required_argument, 0, 'w'}, {"lanes", required_argument, 0, 'l'},
                                         {"attn-lanes", required_argument, 0, 'a'},
                                         {"temperature", required_argument, 0, 'T'},
                                         {"speculative-config", required_argument, 0, 'S'},
                                         {"skip-attention", no_argument, 0, 'A'},
                                         {"json", no_argument, 0, 'j'},           {"wide", no_argument, 0, 'W'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c, li = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        kvp_status st = KVP_OK;
        switch (c) {
        case 'm': model = optarg; break;
        case 'b': st = kvp_parse_i32(optarg, 1, 4096, &batch); break;
        case 'n': st = kvp_parse_i32(optarg, 1, 1 << 20, &max_tokens); break;
        case 't': st = kvp_parse_i32_list(optarg, 1, 1024, threads_v, 16, &nthreads); break;
        case 'x': st = kvp_parse_list(optarg, parse_matmul, matmul_v, sizeof matmul_v[0], 4, &nmatmul); break;
        case 'l': st = kvp_parse_i32_list(optarg, 8, 16, lanes_v, 2, &nlanes); break;
        case 'a':
            if ((st = kvp_attn_lanes_parse(optarg, &attn_lanes)) == KVP_OK) st = kvp_attn_set_lanes(attn_lanes);
            break;
        case 's': st = kvp_parse_i32(optarg, 1, 4096, &bs); break;
        case 'g': golden = optarg; break;
        case 'r': st = kvp_parse_i32(optarg, 1, 1000, &reps); break;
        case 'k': st = kvp_kv_dtype_parse(optarg, &kv_dtype, &kv_auto); break;
        case 'w': st = kvp_weight_type_parse(optarg, &wdtype); break;
        case 'T': st = kvp_parse_f64(optarg, 0.0, 1e6, &temperature); break;
        case 'S': st = kvp_spec_parse(optarg, &sp.engine.spec); break;
        case 'A': skip_attn = 1; break;
        case 'f': st = kvp_format_parse(optarg, &fmt); break;
        case 'j': fmt = KVP_FMT_JSON; break;
        case 'W': fmt = KVP_FMT_WIDE; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
        if (st != KVP_OK) return kvp_cli_usage_error(cmd, "--%s: %s", opts[li].name, kvp_error_message());
    }
    if (nlanes == 0) lanes_v[nlanes++] = kvp_cpu_max_lanes();
    char golden_buf[1200];
    if (!golden) {
        const char *slash = strrchr(model, '/');
        snprintf(golden_buf, sizeof golden_buf, "%.*s/golden.json", slash ? (int)(slash - model) : 1, slash ? model : ".");
        FILE *f = fopen(golden_buf, "r");
        if (f) {
            fclose(f);
            golden = golden_buf;
        }
    }
    kvp_model *m;
    kvp_status st = kvp_model_load_ex(model, NULL, wdtype, &m);
    if (st != KVP_OK) return kvp_cli_fail(cmd, st);
    if (kv_auto) kv_dtype = kvp_model_kv_dtype_auto(m);
    sp.engine.block_size = bs;
    sp.kv_dtype = kv_dtype;
    sp.engine.stop_at_eos = 0; /* every sequence generates max_tokens */
    kvp_report *rep = NULL;
    if ((st = kvp_report_create(k_fields, NFIELDS, &rep)) != KVP_OK ||
        (st = kvp_report_set_brief(rep, k_brief, (int)(sizeof k_brief / sizeof k_brief[0]))) != KVP_OK) {
        kvp_report_destroy(rep);
        kvp_model_destroy(m);
        return kvp_cli_fail(cmd, st);
    }
    int rc = KVP_EXIT_OK;
    for (int ti = 0; ti < nthreads && rc == KVP_EXIT_OK; ti++) {
        const int32_t threads = threads_v[ti];
        for (int mli = 0; mli < nmatmul * nlanes && rc == KVP_EXIT_OK; mli++) {
            const kvp_matmul_kind mk = matmul_v[mli / nlanes];
            const char *ms = kvp_matmul_kind_name(mk);
            const int32_t lanes = mk == KVP_MATMUL_BLAS ? 0 : lanes_v[mli % nlanes];
            if (mk == KVP_MATMUL_BLAS && mli % nlanes > 0) continue; /* OpenBLAS picks its own kernels */
            kvp_model_set_threads(m, threads);
            kvp_model_set_matmul(m, mk);
            if (lanes && (st = kvp_model_set_lanes(m, lanes)) != KVP_OK) {
                rc = kvp_cli_fail(cmd, st);
                break;
            }
            int ok = 0;
            kvp_model_set_skip_attention(m, 0); /* the validation runs the whole model */
            if ((st = validate(m, golden, &sp, &ok)) != KVP_OK) {
                rc = kvp_cli_fail(cmd, st);
                break;
            }
            kvp_model_set_skip_attention(m, skip_attn);
            /* fastest round of each mode (wall time; cpu time of that round) */
            double cpu[2] = {0, 0};
            kvp_run_stats best[2];
            for (int r = 0; r < reps && rc == KVP_EXIT_OK; r++)
                for (int mode = 0; mode < 2; mode++) {
                    int32_t nseq = mode ? batch : 1;
                    double cs = 0;
                    kvp_run_stats gs;
                    fprintf(stderr, "bench generate: round %d/%d, %s, %d sequence(s), %d threads, %s ...\n", r + 1, reps,
                            mode ? "batched" : "single", nseq, threads, ms);
                    if ((st = timed(m, nseq, max_tokens, temperature, &sp, &cs, &gs)) != KVP_OK) {
                        rc = kvp_cli_fail(cmd, st);
                        break;
                    }
                    if (r == 0 || gs.wall_s < best[mode].wall_s) best[mode] = gs, cpu[mode] = cs;
                }
            double single_tps = 0;
            for (int mode = 0; mode < 2 && rc == KVP_EXIT_OK; mode++) {
                int32_t nseq = mode ? batch : 1;
                const kvp_run_stats *b = &best[mode];
                double tps = b->generated_tokens / b->wall_s;
                if (!mode) single_tps = tps;
                cJSON *row;
                if ((st = kvp_report_row(rep, &row)) != KVP_OK) {
                    rc = kvp_cli_fail(cmd, st);
                    break;
                }
                cJSON_AddStringToObject(row, "model", model);
                cJSON_AddStringToObject(row, "mode", mode ? "batched" : "single");
                cJSON_AddNumberToObject(row, "sequences", nseq);
                cJSON_AddNumberToObject(row, "threads", threads);
                cJSON_AddStringToObject(row, "matmul", ms);
                cJSON_AddNumberToObject(row, "lanes", lanes);
                const kvp_paged_kv shape = {.dtype = kv_dtype, .head_dim = kvp_model_cfg(m)->head_dim, .block_size = bs};
                int sl, vl;
                kvp_attn_lanes_for(&shape, 1, &sl, &vl);
                char al[16];
                snprintf(al, sizeof al, "%d/%d", sl, vl);
                cJSON_AddStringToObject(row, "attn_lanes", al);
                cJSON_AddNumberToObject(row, "block_size", bs);
                cJSON_AddStringToObject(row, "kv_dtype", kvp_dtype_name(kv_dtype));
                cJSON_AddStringToObject(row, "weight_dtype", kvp_weight_type_name(kvp_model_weight_type(m)));
                cJSON_AddNumberToObject(row, "max_tokens", max_tokens);
                cJSON_AddNumberToObject(row, "temperature", temperature);
                cJSON_AddNumberToObject(row, "spec_tokens", sp.engine.spec.tokens);
                cJSON_AddNumberToObject(row, "spec_max_batch", sp.engine.spec.max_batch);
                cJSON_AddNumberToObject(row, "reps", reps);
                cJSON_AddNumberToObject(row, "generated", (double)b->generated_tokens);
                cJSON_AddNumberToObject(row, "wall_s", b->wall_s);
                cJSON_AddNumberToObject(row, "cpu_s", cpu[mode]);
                cJSON_AddNumberToObject(row, "tokens_per_s", tps);
                cJSON_AddNumberToObject(row, "tokens_per_cpu_s", cpu[mode] > 0 ? b->generated_tokens / cpu[mode] : 0);
                cJSON_AddNumberToObject(row, "speedup_vs_single", single_tps > 0 ? tps / single_tps : 0);
                /* the K/V bytes attention read (every row's keys, every layer), per second of the round */
                cJSON_AddNumberToObject(row, "kv_read_gbps", skip_attn ? 0.0 :
                                        (double)b->attended_positions * kvp_kv_cache_bytes(m, kv_dtype, 1, 1) / b->wall_s / 1e9);
                cJSON_AddNumberToObject(row, "steps", (double)b->steps);
                cJSON_AddNumberToObject(row, "spec_acceptance", kvp_spec_acceptance(b));
                cJSON_AddStringToObject(row, "attention", skip_attn ? "skipped" : "on");
                cJSON_AddBoolToObject(row, "validated", ok && !skip_attn);
            }
        }
    }
    if (rc == KVP_EXIT_OK && (st = kvp_report_print(rep, stdout, fmt)) != KVP_OK) rc = kvp_cli_fail(cmd, st);
    kvp_report_destroy(rep);
    kvp_model_destroy(m);
    return rc;
}
