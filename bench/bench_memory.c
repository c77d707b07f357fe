/* bench/bench_memory.c — `kvpage bench memory`: where the KV memory goes (token states, reservation,
 * internal and external fragmentation, free) for each allocation strategy and block size, on one workload,
 * in the style of the PagedAttention paper's Figure 2, plus the mean number of running requests.
 *
 * Default = the paper's setting: OPT-13B (../shared/data/configs/derived/opt-13b.json) on one A100-40G with
 * 12 GB of KV memory (800 KiB per token -> about 14.6k token slots), max_model_len 2048, a ShareGPT-like
 * workload (runtime/workload/workload_synth.h) of 1000 requests all queued at t = 0 (memory-bound, saturated), the
 * vLLM v0 scheduler of the paper's time (no chunked prefill, 2048 batched tokens, 256 sequences, 1 %
 * watermark, recompute preemption). Every strategy runs the same requests through the same engine; only
 * the KV allocator differs. Shares are time averages over the whole run (sim_duration_s). The Orca
 * baselines run in a buddy arena, as the paper's emulation of Orca did, and again in a first-fit arena
 * (rows "-ff"): the buddy's power-of-two rounding is most of their external fragmentation.
 *
 * Output: the table on stdout (--format; by default the shares, the batch and rejections in 100 columns,
 * --wide every field), and OUT/memory.csv, OUT/memory.json, OUT/memory.png (OUT: --out, else build/results).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "bench/plot.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/report.h"
#include "common/timer.h"
#include "runtime/planner/simulate.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage bench memory [options]\n"
            "\n"
            "Sweeps KV allocation strategies (paged at every block size, Orca-Max, Orca-Pow2, Orca-Oracle) on\n"
            "one workload through the serving simulator and reports the time-averaged shares of KV memory:\n"
            "token states, reserved, internal fragmentation, external fragmentation, free; plus the memory in\n"
            "use that holds tokens (util_in_use) and the mean number of running requests.\n"
            "Defaults: the PagedAttention paper's setting (OPT-13B, A100-40G, 12 GB of KV, ShareGPT-like).\n"
            "\n"
            "  --model CONFIG        (default ../shared/data/configs/derived/opt-13b.json)\n"
            "  --gpu NAME            (default A100-40G)\n"
            "  --kv-mem BYTES        KV memory (default 12GB); 0: what the planner leaves after the weights\n"
            "  --workload SPEC       sharegpt | alpaca | ... as in kvpage simulate (default sharegpt)\n"
            "  --trace FILE          a trace instead of --workload\n"
            "  --num-requests N      (default 1000)\n"
            "  --rate R              requests/s or inf (default inf: all queued at t = 0)\n"
            "  --block-sizes LIST    paged block sizes (default 1,2,4,8,16,32,64,128,256)\n"
            "  --allocs LIST         strategies (default orca-max,orca-pow2,orca-oracle,paged)\n"
            "  --arena LIST          where the orca-* strategies place reservations: buddy (the paper's Orca\n"
            "                        emulation) and/or first-fit, one row each, first-fit rows labelled -ff\n"
            "                        (default buddy,first-fit)\n"
            "  --max-model-len N     (default: the model's, at most 32768; OPT-13B: 2048)\n"
            "  --max-num-seqs N      (default 256)\n"
            "  --chunked-prefill     mix prefill chunks with decodes (default: vLLM v0 prefill-only steps)\n"
            "  --tp N                (default 1)\n"
            "  --format F            table | wide | csv | json on stdout (default table: the main columns in\n"
            "                        100 characters; wide, csv and json: every column)\n"
            "  --wide                same as --format wide        --json  same as --format json\n"
            "  --out DIR             where memory.csv/json/png go (default: results/ beside the program,\n"
            "                        build/results; --out bench/results updates the committed figures)\n"
            "  --no-plot             skip the PNG\n"
            "  -h, --help\n");
}

enum { O_MODEL = 256, O_GPU, O_KVMEM, O_WORKLOAD, O_TRACE, O_NUMREQ, O_RATE, O_BS, O_ALLOCS, O_MAXLEN,
       O_MAXSEQS, O_CHUNK, O_TP, O_FORMAT, O_OUT, O_NOPLOT, O_ARENA, O_WIDE, O_JSON };

static double r4(double x) { return round(x * 1e4) / 1e4; }

static kvp_status parse_alloc(const char *s, void *out) { return kvp_alloc_kind_parse(s, out); }
static kvp_status parse_arena(const char *s, void *out) { return kvp_contig_placement_parse(s, out); }

/* The comma-separated items of list, each parsed into out[i] (elem bytes each, at most max, at least one). */
static kvp_status parse_list(const char *opt, const char *list, kvp_status (*parse)(const char *, void *), void *out,
                             size_t elem, int max, int *n)
{
    if (kvp_parse_list(list, parse, out, elem, max, n) != KVP_OK)
        return KVP_ERR(KVP_EINVAL, "%s: %s", opt, kvp_error_message());
    return KVP_OK;
}

int kvp_bench_memory(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, O_MODEL},   {"gpu", required_argument, NULL, O_GPU},
        {"kv-mem", required_argument, NULL, O_KVMEM},  {"workload", required_argument, NULL, O_WORKLOAD},
        {"trace", required_argument, NULL, O_TRACE},   {"num-requests", required_argument, NULL, O_NUMREQ},
        {"rate", required_argument, NULL, O_RATE},     {"block-sizes", required_argument, NULL, O_BS},
        {"allocs", required_argument, NULL, O_ALLOCS}, {"max-model-len", required_argument, NULL, O_MAXLEN},
        {"max-num-seqs", required_argument, NULL, O_MAXSEQS}, {"chunked-prefill", no_argument, NULL, O_CHUNK},
        {"tp", required_argument, NULL, O_TP},         {"format", required_argument, NULL, O_FORMAT},
        {"out", required_argument, NULL, O_OUT},       {"no-plot", no_argument, NULL, O_NOPLOT},
        {"arena", required_argument, NULL, O_ARENA},   {"help", no_argument, NULL, 'h'},
        {"wide", no_argument, NULL, O_WIDE},           {"json", no_argument, NULL, O_JSON},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = "bench memory";
    const char *model = "../shared/data/configs/derived/opt-13b.json", *gpu_name = "A100-40G";
    const char *spec = NULL, *trace = NULL, *allocs = "orca-max,orca-pow2,orca-oracle,paged", *outdir = kvp_bench_default_out();
    const char *arena_list = "buddy,first-fit";
    int64_t kv_mem = 12000000000LL, num_req = 1000;
    double rate = INFINITY;
    int32_t bsizes[32] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    int nbs = 9, plot = 1, max_len_set = 0;
    kvp_format fmt = KVP_FMT_TABLE;
    kvp_engine_config ec;
    kvp_engine_config_default(&ec);
    ec.chunked_prefill = false;
    ec.max_batched_tokens = 2048;
    kvp_sim_hw hw;
    kvp_sim_hw_default(&hw);
    kvp_status st = KVP_OK;
    int c;
    optind = 0;
    int li = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_GPU: gpu_name = optarg; break;
        case O_KVMEM: st = kvp_parse_bytes(optarg, &kv_mem); break;
        case O_WORKLOAD: spec = optarg; break;
        case O_TRACE: trace = optarg; break;
        case O_NUMREQ: st = kvp_parse_i64(optarg, 1, INT32_MAX, &num_req); break;
        case O_RATE: st = kvp_parse_rate(optarg, &rate); break;
        case O_BS: st = kvp_parse_i32_list(optarg, 1, 1 << 16, bsizes, 32, &nbs); break;
        case O_ALLOCS: allocs = optarg; break;
        case O_ARENA: arena_list = optarg; break;
        case O_MAXLEN:
            st = kvp_parse_i32(optarg, 2, INT32_MAX / 2, &ec.max_model_len);
            max_len_set = 1;
            break;
        case O_MAXSEQS: st = kvp_parse_i32(optarg, 1, 1 << 20, &ec.max_num_seqs); break;
        case O_CHUNK: ec.chunked_prefill = true; break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 1024, &hw.tp); break;
        case O_FORMAT: st = kvp_format_parse(optarg, &fmt); break;
        case O_WIDE: fmt = KVP_FMT_WIDE; break;
        case O_JSON: fmt = KVP_FMT_JSON; break;
        case O_OUT: outdir = optarg; break;
        case O_NOPLOT: plot = 0; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
        if (st != KVP_OK) return kvp_cli_usage_error(cmd, "--%s: %s", opts[li].name, kvp_error_message());
    }
    if (optind < argc) return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (kvp_bench_out_dir("--out", outdir) != KVP_OK) return kvp_cli_usage_error(cmd, "%s", kvp_error_message());
    if (spec && trace) return kvp_cli_usage_error(cmd, "give at most one of --workload and --trace");
    if (!spec && !trace) spec = "sharegpt";

    kvp_alloc_kind kinds[8];
    kvp_contig_placement arenas[2];
    int nk = 0, na = 0;
    if ((st = parse_list("--allocs", allocs, parse_alloc, kinds, sizeof kinds[0], 8, &nk)) != KVP_OK ||
        (st = parse_list("--arena", arena_list, parse_arena, arenas, sizeof arenas[0], 2, &na)) != KVP_OK)
        return kvp_cli_usage_error(cmd, "%s", kvp_error_message());

    const kvp_gpu_profile *gpu = NULL;
    if ((st = kvp_gpu_profile_find(gpu_name, &gpu)) != KVP_OK) return kvp_cli_fail(cmd, st);
    kvp_model_config cfg;
    if ((st = kvp_model_config_load(model, &cfg)) != KVP_OK) return kvp_cli_fail(cmd, st);
    if (!max_len_set) ec.max_model_len = kvp_sim_default_max_model_len(&cfg);
    if (ec.max_batched_tokens < ec.max_model_len) ec.max_batched_tokens = ec.max_model_len;
    hw.kv_mem_bytes = kv_mem;

    kvp_workload *w = NULL;
    if ((st = kvp_sim_load_workload(trace, spec, num_req, 0, rate, ec.max_model_len, 1, &w)) != KVP_OK)
        return kvp_cli_fail(cmd, st);

    static const char *const fields[] = {
        "label", "alloc", "arena", "block_size", "token_states", "reserved", "internal_frag", "external_frag", "cached", "free",
        "util_in_use", "mean_running", "max_running", "throughput_tok_s", "req_per_s", "preemptions",
        "sim_duration_s", "requests", "finished", "rejected", "kv_capacity_tokens", "kv_bytes_per_token", "workload", "model", "gpu",
        "wall_s", "validated"};
    static const char *const brief[] = {"label", "token_states", "reserved", "internal_frag", "external_frag",
                                        "free", "mean_running", "rejected"};
    kvp_report *rep = NULL;
    if ((st = kvp_report_create(fields, (int)(sizeof fields / sizeof fields[0]), &rep)) != KVP_OK ||
        (st = kvp_report_set_brief(rep, brief, (int)(sizeof brief / sizeof brief[0]))) != KVP_OK) {
        kvp_report_destroy(rep);
        kvp_workload_destroy(w);
        return kvp_cli_fail(cmd, st);
    }
    double paged16_util = -1, paged16_running = -1, oracle_running = -1, max_share = -1, oracle_share = -1;
    int rc = KVP_EXIT_OK;
    for (int k = 0; k < nk && rc == KVP_EXIT_OK; k++) {
        const bool pg = kinds[k] == KVP_ALLOC_PAGED;
        int nrun = pg ? nbs : na; /* paged: one row per block size; orca-*: one per placement */
        for (int b = 0; b < nrun && rc == KVP_EXIT_OK; b++) {
            kvp_engine_config e = ec;
            e.alloc = kinds[k];
            e.block_size = pg ? bsizes[b] : 1;
            if (!pg) e.arena = arenas[b];
            kvp_cost_model cm;
            kvp_sim_memory mem;
            if ((st = kvp_sim_prepare(&cfg, gpu, &hw, &e, &cm, &mem)) != KVP_OK) {
                rc = kvp_cli_fail(cmd, st);
                break;
            }
            /* vLLM's default: 1 % of the blocks kept free at admission */
            e.watermark_blocks = kinds[k] == KVP_ALLOC_PAGED ? (int32_t)((e.kv_slots / e.block_size) / 100) : 0;
            char label[48];
            if (pg) snprintf(label, sizeof label, "paged-%d", (int)e.block_size);
            else snprintf(label, sizeof label, "%s%s", kvp_alloc_kind_name(kinds[k]), e.arena == KVP_CONTIG_FIRST_FIT ? "-ff" : "");
            fprintf(stderr, "bench memory: %-14s ", label);
            kvp_progress_bar bar;
            kvp_progress_bar_init(&bar, label);
            double t0 = kvp_now_s();
            kvp_engine_metrics m;
            st = kvp_simulate(&e, &cm, w, kvp_progress_bar_fn, &bar, &m, NULL);
            kvp_progress_bar_end(&bar);
            double wall = kvp_now_s() - t0;
            if (st != KVP_OK) {
                fprintf(stderr, "\n");
                rc = kvp_cli_fail(cmd, st);
                break;
            }
            fprintf(stderr, "tokens %5.1f %% of KV, %5.1f %% of KV in use, %6.2f running (%.2f s)\n",
                    m.kv_token_states * 100, m.kv_util_in_use * 100, m.mean_running, wall);
            cJSON *row;
            if ((st = kvp_report_row(rep, &row)) != KVP_OK) {
                rc = kvp_cli_fail(cmd, st);
                break;
            }
            cJSON_AddStringToObject(row, "label", label);
            cJSON_AddStringToObject(row, "alloc", kvp_alloc_kind_name(kinds[k]));
            cJSON_AddStringToObject(row, "arena", pg ? "-" : kvp_contig_placement_name(e.arena));
            cJSON_AddNumberToObject(row, "block_size", pg ? e.block_size : 0);
            cJSON_AddNumberToObject(row, "token_states", r4(m.kv_token_states));
            cJSON_AddNumberToObject(row, "reserved", r4(m.kv_reserved));
            cJSON_AddNumberToObject(row, "internal_frag", r4(m.kv_internal_frag));
            cJSON_AddNumberToObject(row, "external_frag", r4(m.kv_external_frag));
            cJSON_AddNumberToObject(row, "cached", r4(m.kv_cached));
            cJSON_AddNumberToObject(row, "free", r4(m.kv_free));
            cJSON_AddNumberToObject(row, "util_in_use", r4(m.kv_util_in_use));
            cJSON_AddNumberToObject(row, "mean_running", round(m.mean_running * 100) / 100);
            cJSON_AddNumberToObject(row, "max_running", (double)m.max_running);
            cJSON_AddNumberToObject(row, "throughput_tok_s", round(m.throughput_tok_s * 10) / 10);
            cJSON_AddNumberToObject(row, "req_per_s", r4(m.req_per_s));
            cJSON_AddNumberToObject(row, "preemptions", (double)m.preemptions);
            cJSON_AddNumberToObject(row, "sim_duration_s", round(m.sim_duration_s * 100) / 100);
            cJSON_AddNumberToObject(row, "requests", (double)m.requests);
            cJSON_AddNumberToObject(row, "finished", (double)m.finished);
            cJSON_AddNumberToObject(row, "rejected", (double)m.rejected); /* too long for its memory: never run */
            cJSON_AddNumberToObject(row, "kv_capacity_tokens", (double)m.kv_capacity_slots);
            cJSON_AddNumberToObject(row, "kv_bytes_per_token", mem.kv_bytes_per_token);
            cJSON_AddStringToObject(row, "workload", w->name);
            cJSON_AddStringToObject(row, "model", cfg.model_type);
            cJSON_AddStringToObject(row, "gpu", gpu->name);
            cJSON_AddNumberToObject(row, "wall_s", round(wall * 1000) / 1000);
            /* kvp_simulate returned OK: every block / slot was back in the pool at the end and the
             * accounting identity held (checked by the engine), and every request finished or was rejected
             * (rows with rejections compare a different set of requests: a warning says so) */
            if (m.rejected > 0)
                KVP_LOG_W("bench memory: %s rejected %lld of %lld requests (they can never fit its KV memory); its "
                          "shares cover the others", label, (long long)m.rejected, (long long)m.requests);
            cJSON_AddBoolToObject(row, "validated", m.leaked_blocks == 0 && m.finished + m.rejected == m.requests);
            if (pg && e.block_size == 16) {
                paged16_util = m.kv_util_in_use;
                paged16_running = m.mean_running;
            }
            if (kinds[k] == KVP_ALLOC_ORCA_ORACLE && b == 0) { /* the summary uses the first placement */
                oracle_running = m.mean_running;
                oracle_share = m.kv_token_states;
            }
            if (kinds[k] == KVP_ALLOC_ORCA_MAX && b == 0) max_share = m.kv_token_states;
        }
    }
    if (rc == KVP_EXIT_OK) {
        kvp_report_print(rep, stdout, fmt);
        char csv[1024], js[1024], png[1024];
        snprintf(csv, sizeof csv, "%s/memory.csv", outdir);
        snprintf(js, sizeof js, "%s/memory.json", outdir);
        snprintf(png, sizeof png, "%s/memory.png", outdir);
        if ((st = kvp_report_write_csv(rep, csv)) != KVP_OK || (st = kvp_report_write_json(rep, js)) != KVP_OK) {
            rc = kvp_cli_fail(cmd, st);
        } else {
            fprintf(stderr, "bench memory: wrote %s and %s\n", csv, js);
            if (paged16_util >= 0)
                fprintf(stderr, "bench memory: paged-16 keeps %.1f %% of the KV memory in use as token states\n",
                        paged16_util * 100);
            if (max_share >= 0 && oracle_share >= 0) /* both measured (-1: the strategy did not run) */
                fprintf(stderr, "bench memory: token states: orca-max %.1f %%, orca-oracle %.1f %% of KV memory (%s)\n",
                        max_share * 100, oracle_share * 100, kvp_contig_placement_name(arenas[0]));
            if (paged16_running > 0 && oracle_running > 0)
                fprintf(stderr, "bench memory: mean running requests paged-16 / orca-oracle = %.2f / %.2f = %.2fx\n",
                        paged16_running, oracle_running, paged16_running / oracle_running);
            if (plot) {
                char title[512], name[256];
                kvp_bench_model_name(model, name, sizeof name);
                snprintf(title, sizeof title, "KV memory by strategy: %s, %s, %s", name, gpu->name, w->name);
                const char *args[] = {"stacked", csv, png, "--label", "label", "--stack",
                                      "token_states,reserved,internal_frag,external_frag,free",
                                      "--line", "mean_running", "--title", title, NULL};
                if ((st = kvp_bench_plot(args)) == KVP_OK) fprintf(stderr, "bench memory: wrote %s\n", png);
                else KVP_LOG_W("bench memory: no plot: %s", kvp_error_message());
            }
        }
    }
    kvp_report_destroy(rep);
    kvp_workload_destroy(w);
    return rc;
}
