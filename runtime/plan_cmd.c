/* `kvpage plan` — the memory planner's command line (formulas in runtime/planner.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/cli.h"
#include "common/json.h"
#include "common/parse.h"
#include "runtime/commands.h"
#include "runtime/gpu_profile.h"
#include "runtime/planner.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage plan --config PATH [options]\n\n"
            "Memory planner: weights, KV cache per token / sequence / batch, KV blocks that fit on the GPU,\n"
            "concurrent sequences, and training memory, from a Hugging Face config.json.\n\n"
            "  --config PATH          model config.json (required)\n"
            "  --gpu NAME             GPU profile (default H100-SXM; known: ");
    int n;
    const kvp_gpu_profile *g = kvp_gpu_profile_list(&n);
    for (int i = 0; i < n; i++) fprintf(f, "%s%s", g[i].name, i + 1 < n ? ", " : ")\n");
    fprintf(f,
            "  --gpu-mem BYTES        GPU memory instead of a profile (80GiB, 141GB, ...)\n"
            "  --gpu-util F           fraction of GPU memory the runtime may use (default 0.9)\n"
            "  --weight-dtype T       fp32|bf16|fp16|fp8|int8 (default bf16)\n"
            "  --kv-dtype T           fp32|bf16|fp16|fp8|int8 (default bf16)\n"
            "  --block-size N         tokens per KV block (default 16)\n"
            "  --seq-len N            tokens cached per sequence (default max_position_embeddings)\n"
            "  --num-seqs N           sequences for the total KV figure (default 1)\n"
            "  --shared-prefix N      tokens of a prefix shared by all sequences, stored once (default 0)\n"
            "  --tp N                 tensor-parallel ranks (default 1)\n"
            "  --reserve BYTES        activation reserve per GPU (default: an estimate, see planner.c)\n"
            "  --max-batched-tokens N tokens per step for the activation estimate (default 2048)\n"
            "  --train                also print training memory (mixed-precision AdamW, and LoRA)\n"
            "  --lora-rank N          LoRA rank for the training figure (default 16)\n"
            "  --json                 one JSON object instead of the table\n"
            "  -h, --help             this help\n");
}

static cJSON *figures_json(const kvp_plan_figures *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "weights_bytes", (double)f->weights_bytes);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)f->kv_bytes_per_token);
    cJSON_AddNumberToObject(o, "kv_bytes_per_seq", (double)f->kv_bytes_per_seq);
    cJSON_AddNumberToObject(o, "kv_bytes_total", (double)f->kv_bytes_total);
    cJSON_AddNumberToObject(o, "block_bytes", (double)f->block_bytes);
    cJSON_AddNumberToObject(o, "activation_bytes", (double)f->activation_bytes);
    cJSON_AddNumberToObject(o, "kv_budget_bytes", (double)f->kv_budget_bytes);
    cJSON_AddNumberToObject(o, "num_blocks", (double)f->num_blocks);
    cJSON_AddNumberToObject(o, "max_concurrent_seqs", (double)f->max_concurrent_seqs);
    return o;
}

static const char *human(double b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    double a = b < 0 ? -b : b;
    while (a >= 1024 && i < 5) a /= 1024, b /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

static void print_table(const kvp_model_config *c, const char *gpu, const kvp_plan_params *p, const kvp_plan *r, int train)
{
    char a[32], b[32];
    printf("model        %s, %d layers, %d q heads / %d kv heads x %d, hidden %d%s%s\n", c->model_type, c->num_layers,
           c->num_q_heads, c->num_kv_heads, c->head_dim, c->hidden_size, c->kv_lora_rank ? ", MLA latent cache" : "",
           c->num_experts ? ", MoE" : "");
    printf("gpu          %s, %s x %.2f usable, tp %d\n", gpu, human((double)p->gpu_mem_bytes, a, sizeof a), p->gpu_util, p->tp);
    printf("parameters   %lld\n\n", (long long)r->params);
    printf("%-22s %18s %14s %18s %14s\n", "", "whole model", "", "per rank", "");
    const struct { const char *name; int64_t t, k; } rows[] = {
        {"weights", r->total.weights_bytes, r->per_rank.weights_bytes},
        {"KV per token", r->total.kv_bytes_per_token, r->per_rank.kv_bytes_per_token},
        {"KV per sequence", r->total.kv_bytes_per_seq, r->per_rank.kv_bytes_per_seq},
        {"KV for all sequences", r->total.kv_bytes_total, r->per_rank.kv_bytes_total},
        {"KV block", r->total.block_bytes, r->per_rank.block_bytes},
        {"activation reserve", r->total.activation_bytes, r->per_rank.activation_bytes},
        {"KV budget", r->total.kv_budget_bytes, r->per_rank.kv_budget_bytes},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        printf("%-22s %18lld %14s %18lld %14s\n", rows[i].name, (long long)rows[i].t, human((double)rows[i].t, a, sizeof a),
               (long long)rows[i].k, human((double)rows[i].k, b, sizeof b));
    printf("\nseq len %lld, %lld sequences, shared prefix %lld, block size %d\n", (long long)p->seq_len,
           (long long)p->num_seqs, (long long)p->shared_prefix, p->block_size);
    printf("KV blocks that fit     %lld\n", (long long)r->total.num_blocks);
    printf("concurrent sequences   %lld (at %lld tokens each)\n", (long long)r->total.max_concurrent_seqs, (long long)p->seq_len);
    if (r->per_rank.kv_budget_bytes <= 0)
        printf("WARNING: the weights and activation reserve exceed the usable GPU memory by %s per rank\n",
               human((double)-r->per_rank.kv_budget_bytes, a, sizeof a));
    if (train) {
        printf("training, AdamW mixed precision (16 B/param)   %lld (%s)\n", (long long)r->train_bytes,
               human((double)r->train_bytes, a, sizeof a));
        printf("training, LoRA rank %d (%lld adapter params)   %lld (%s)\n", p->lora_rank, (long long)r->lora_params,
               (long long)r->lora_train_bytes, human((double)r->lora_train_bytes, a, sizeof a));
    }
}

static cJSON *plan_json(const kvp_model_config *c, const char *gpu, const kvp_plan_params *p, const kvp_plan *r, int train)
{
    cJSON *o = figures_json(&r->total);
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddStringToObject(o, "gpu", gpu);
    cJSON_AddNumberToObject(o, "gpu_mem_bytes", (double)p->gpu_mem_bytes);
    cJSON_AddNumberToObject(o, "gpu_util", p->gpu_util);
    cJSON_AddNumberToObject(o, "params", (double)r->params);
    cJSON_AddNumberToObject(o, "seq_len", (double)p->seq_len);
    cJSON_AddNumberToObject(o, "num_seqs", (double)p->num_seqs);
    cJSON_AddNumberToObject(o, "shared_prefix", (double)p->shared_prefix);
    cJSON_AddNumberToObject(o, "block_size", p->block_size);
    cJSON_AddNumberToObject(o, "tp", p->tp);
    cJSON_AddItemToObject(o, "per_rank", figures_json(&r->per_rank));
    if (train) {
        cJSON_AddNumberToObject(o, "train_bytes", (double)r->train_bytes);
        cJSON_AddNumberToObject(o, "lora_rank", p->lora_rank);
        cJSON_AddNumberToObject(o, "lora_params", (double)r->lora_params);
        cJSON_AddNumberToObject(o, "lora_train_bytes", (double)r->lora_train_bytes);
    }
    return o;
}

int kvp_cmd_plan(int argc, char **argv)
{
    enum { O_GPU = 256, O_GPU_MEM, O_UTIL, O_WDT, O_KVDT, O_BS, O_SEQ, O_NSEQ, O_PREFIX, O_TP, O_RESERVE, O_MBT,
           O_TRAIN, O_LORA, O_JSON, O_CONFIG };
    static const struct option opts[] = {
        {"config", required_argument, 0, O_CONFIG}, {"gpu", required_argument, 0, O_GPU},
        {"gpu-mem", required_argument, 0, O_GPU_MEM}, {"gpu-util", required_argument, 0, O_UTIL},
        {"weight-dtype", required_argument, 0, O_WDT}, {"kv-dtype", required_argument, 0, O_KVDT},
        {"block-size", required_argument, 0, O_BS}, {"seq-len", required_argument, 0, O_SEQ},
        {"num-seqs", required_argument, 0, O_NSEQ}, {"shared-prefix", required_argument, 0, O_PREFIX},
        {"tp", required_argument, 0, O_TP}, {"reserve", required_argument, 0, O_RESERVE},
        {"max-batched-tokens", required_argument, 0, O_MBT}, {"train", no_argument, 0, O_TRAIN},
        {"lora-rank", required_argument, 0, O_LORA}, {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    /* Values are kept as text until the config is read: the defaults depend on it. */
    const char *config = NULL, *gpu = NULL, *gpu_mem = NULL, *util = NULL, *wdt = "bf16", *kvdt = "bf16", *bs = NULL,
               *seq = NULL, *nseq = NULL, *prefix = NULL, *tp = NULL, *reserve = NULL, *mbt = NULL, *lora = NULL;
    int json = 0, train = 0, ch;
    optind = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case O_CONFIG: config = optarg; break;
        case O_GPU: gpu = optarg; break;
        case O_GPU_MEM: gpu_mem = optarg; break;
        case O_UTIL: util = optarg; break;
        case O_WDT: wdt = optarg; break;
        case O_KVDT: kvdt = optarg; break;
        case O_BS: bs = optarg; break;
        case O_SEQ: seq = optarg; break;
        case O_NSEQ: nseq = optarg; break;
        case O_PREFIX: prefix = optarg; break;
        case O_TP: tp = optarg; break;
        case O_RESERVE: reserve = optarg; break;
        case O_MBT: mbt = optarg; break;
        case O_TRAIN: train = 1; break;
        case O_LORA: lora = optarg; break;
        case O_JSON: json = 1; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error("plan", ch, argv);
        }
    }
    if (optind < argc) return kvp_cli_usage_error("plan", "unexpected argument '%s'", argv[optind]);
    if (config == NULL) return kvp_cli_usage_error("plan", "--config PATH is required");
    if (gpu && gpu_mem) return kvp_cli_usage_error("plan", "give --gpu or --gpu-mem, not both");

    kvp_model_config cfg;
    kvp_status st = kvp_model_config_load(config, &cfg);
    if (st != KVP_OK) return kvp_cli_fail("plan", st);
    kvp_plan_params p;
    kvp_plan_params_default(&cfg, &p);
    const char *gpu_name = gpu ? gpu : "H100-SXM";
    if (gpu_mem) {
        gpu_name = "custom";
        st = kvp_parse_bytes(gpu_mem, &p.gpu_mem_bytes);
        if (st == KVP_OK && p.gpu_mem_bytes <= 0) st = KVP_ERR(KVP_EINVAL, "--gpu-mem must be positive");
    } else {
        const kvp_gpu_profile *prof;
        st = kvp_gpu_profile_find(gpu_name, &prof);
        if (st == KVP_OK) p.gpu_mem_bytes = prof->mem_bytes, gpu_name = prof->name;
    }
    if (st == KVP_OK && util) st = kvp_parse_f64(util, 1e-6, 1.0, &p.gpu_util);
    if (st == KVP_OK) st = kvp_dtype_bytes(wdt, &p.weight_bytes);
    if (st == KVP_OK) st = kvp_dtype_bytes(kvdt, &p.kv_bytes);
    if (st == KVP_OK && bs) st = kvp_parse_i32(bs, 1, 1 << 20, &p.block_size);
    if (st == KVP_OK && seq) st = kvp_parse_i64(seq, 1, 1LL << 40, &p.seq_len);
    if (st == KVP_OK && nseq) st = kvp_parse_i64(nseq, 1, 1LL << 40, &p.num_seqs);
    if (st == KVP_OK && prefix) st = kvp_parse_i64(prefix, 0, 1LL << 40, &p.shared_prefix);
    if (st == KVP_OK && tp) st = kvp_parse_i32(tp, 1, 4096, &p.tp);
    if (st == KVP_OK && reserve) st = kvp_parse_bytes(reserve, &p.activation_reserve);
    if (st == KVP_OK && mbt) st = kvp_parse_i32(mbt, 1, 1 << 24, &p.max_batched_tokens);
    if (st == KVP_OK && lora) st = kvp_parse_i32(lora, 1, 1 << 16, &p.lora_rank);
    kvp_plan plan;
    if (st == KVP_OK) st = kvp_plan_compute(&cfg, &p, &plan);
    if (st != KVP_OK) return kvp_cli_fail("plan", st);

    if (json) {
        cJSON *o = plan_json(&cfg, gpu_name, &p, &plan, train);
        st = o ? kvp_json_print(stdout, o) : KVP_ERR(KVP_ENOMEM, "out of memory");
        cJSON_Delete(o);
        if (st != KVP_OK) return kvp_cli_fail("plan", st);
    } else {
        print_table(&cfg, gpu_name, &p, &plan, train);
    }
    return KVP_EXIT_OK;
}
