/* `kvpage plan` — the memory planner's command line (formulas in runtime/planner/planner.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/cli.h"
#include "common/json.h"
#include "common/parse.h"
#include "runtime/cli/commands.h"
#include "runtime/executor/gpu_profile.h"
#include "runtime/planner/planner.h"

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
            "  --weight-dtype T       f32|f16|bf16|fp8|int8 (default bf16; fp32 and fp16 also, as aliases)\n"
            "  --kv-dtype T           f32|f16|bf16|fp8|int8 (default bf16; fp32 and fp16 also)\n"
            "  --block-size N         tokens per KV block (default 16)\n"
            "  --seq-len N            tokens cached per sequence (default: the model's context,\n"
            "                         max_position_embeddings stretched by rope_scaling as vLLM derives it)\n"
            "  --num-seqs N           sequences for the total KV figure (default 1)\n"
            "  --shared-prefix N      tokens of a prefix shared by all sequences, stored once (default 0); its\n"
            "                         full blocks count once in the concurrent sequences too\n"
            "  --tp N                 tensor-parallel ranks (default 1); the whole-model column sums the ranks,\n"
            "                         copies of KV heads replicated when tp > KV heads (or of an MLA cache) included\n"
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

/* The canonical spellings of the weight and KV dtypes (kvp_plan_dtype_parse). */
typedef struct {
    const char *weights, *kv;
} dtype_names;

static void print_table(const kvp_model_config *c, const char *gpu, const kvp_plan_params *p, const kvp_plan *r,
                        const dtype_names *dt, int train)
{
    char a[32], b[32];
    printf("model        %s, %d layers, %d q heads / %d kv heads x %d, hidden %d%s%s\n", c->model_type, c->num_layers,
           c->num_q_heads, c->num_kv_heads, c->head_dim, c->hidden_size, c->kv_lora_rank ? ", MLA latent cache" : "",
           c->num_experts ? ", MoE" : "");
    printf("gpu          %s, %s x %.2f usable, tp %d\n", gpu, human((double)p->gpu_mem_bytes, a, sizeof a), p->gpu_util, p->tp);
    printf("parameters   %lld\n", (long long)r->params);
    printf("dtypes       weights %s, KV %s\n\n", dt->weights, dt->kv);
    printf("%-22s %18s %14s %18s %14s\n", "", "whole model", "", "per rank", "");
    /* whole model = all ranks together, replicas included (planner.h) */
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
    if (r->kv_replicas > 1)
        printf("\nKV replicated: %s is held by %d ranks; the whole-model KV figures count every copy (one copy: "
               "%s per token)\n",
               c->kv_lora_rank ? "the MLA latent cache" : "each KV head", r->kv_replicas,
               human((double)(r->total.kv_bytes_per_token / r->kv_replicas), a, sizeof a));
    printf("\nseq len %lld, %lld sequences, shared prefix %lld, block size %d\n", (long long)p->seq_len,
           (long long)p->num_seqs, (long long)p->shared_prefix, p->block_size);
    printf("KV blocks that fit     %lld\n", (long long)r->total.num_blocks);
    if (p->shared_prefix / p->block_size > 0)
        printf("concurrent sequences   %lld (at %lld tokens each, the full blocks of the %lld-token prefix stored "
               "once)\n", (long long)r->total.max_concurrent_seqs, (long long)p->seq_len, (long long)p->shared_prefix);
    else
        printf("concurrent sequences   %lld (at %lld tokens each)\n", (long long)r->total.max_concurrent_seqs,
               (long long)p->seq_len);
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

static cJSON *plan_json(const kvp_model_config *c, const char *gpu, const kvp_plan_params *p, const kvp_plan *r,
                        const dtype_names *dt, int train)
{
    cJSON *o = figures_json(&r->total);
    cJSON_AddStringToObject(o, "weight_dtype", dt->weights);
    cJSON_AddStringToObject(o, "kv_dtype", dt->kv);
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
    cJSON_AddNumberToObject(o, "kv_replicas", r->kv_replicas);
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
    /* Values are parsed here, so that an error names its option, and applied once the config has given the
     * defaults; 0 (-1 for the prefix and the reserve) means "not given". */
    const char *config = NULL, *gpu = NULL;
    int64_t gpu_mem = 0, seq = 0, nseq = 0, prefix = -1, reserve = -1;
    int32_t bs = 0, tp = 0, mbt = 0, lora = 0;
    double util = 0, wbytes = 2, kvbytes = 2;
    dtype_names dt = {"bf16", "bf16"};
    int json = 0, train = 0, ch, li = -1;
    kvp_status st = KVP_OK;
    optind = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        switch (ch) {
        case O_CONFIG: config = optarg; break;
        case O_GPU: gpu = optarg; break;
        case O_GPU_MEM:
            st = kvp_parse_bytes(optarg, &gpu_mem);
            if (st == KVP_OK && gpu_mem <= 0) st = KVP_ERR(KVP_EINVAL, "must be positive");
            break;
        case O_UTIL: st = kvp_parse_f64(optarg, 1e-6, 1.0, &util); break;
        case O_WDT: st = kvp_plan_dtype_parse(optarg, &dt.weights, &wbytes); break;
        case O_KVDT: st = kvp_plan_dtype_parse(optarg, &dt.kv, &kvbytes); break;
        case O_BS: st = kvp_parse_i32(optarg, 1, 1 << 20, &bs); break;
        case O_SEQ: st = kvp_parse_i64(optarg, 1, 1LL << 40, &seq); break;
        case O_NSEQ: st = kvp_parse_i64(optarg, 1, 1LL << 40, &nseq); break;
        case O_PREFIX: st = kvp_parse_i64(optarg, 0, 1LL << 40, &prefix); break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 4096, &tp); break;
        case O_RESERVE: st = kvp_parse_bytes(optarg, &reserve); break;
        case O_MBT: st = kvp_parse_i32(optarg, 1, 1 << 24, &mbt); break;
        case O_TRAIN: train = 1; break;
        case O_LORA: st = kvp_parse_i32(optarg, 1, 1 << 16, &lora); break;
        case O_JSON: json = 1; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error("plan", ch, argv);
        }
        if (st != KVP_OK) return kvp_cli_usage_error("plan", "--%s: %s", opts[li].name, kvp_error_message());
    }
    if (optind < argc) return kvp_cli_usage_error("plan", "unexpected argument '%s'", argv[optind]);
    if (config == NULL) return kvp_cli_usage_error("plan", "--config PATH is required");
    if (gpu && gpu_mem) return kvp_cli_usage_error("plan", "give --gpu or --gpu-mem, not both");

    kvp_model_config cfg;
    st = kvp_model_config_load(config, &cfg);
    if (st != KVP_OK) return kvp_cli_fail("plan", st);
    kvp_plan_params p;
    kvp_plan_params_default(&cfg, &p);
    const char *gpu_name = gpu ? gpu : "H100-SXM";
    if (gpu_mem) {
        gpu_name = "custom";
        p.gpu_mem_bytes = gpu_mem;
    } else {
        const kvp_gpu_profile *prof;
        st = kvp_gpu_profile_find(gpu_name, &prof);
        if (st != KVP_OK) return kvp_cli_usage_error("plan", "--gpu: %s", kvp_error_message());
        p.gpu_mem_bytes = prof->mem_bytes, gpu_name = prof->name;
    }
    if (util > 0) p.gpu_util = util;
    p.weight_bytes = wbytes;
    p.kv_bytes = kvbytes;
    if (bs) p.block_size = bs;
    if (seq) p.seq_len = seq;
    if (nseq) p.num_seqs = nseq;
    if (prefix >= 0) p.shared_prefix = prefix;
    if (tp) p.tp = tp;
    if (reserve >= 0) p.activation_reserve = reserve;
    if (mbt) p.max_batched_tokens = mbt;
    if (lora) p.lora_rank = lora;
    kvp_plan plan;
    st = kvp_plan_compute(&cfg, &p, &plan);
    if (st != KVP_OK) return kvp_cli_fail("plan", st);

    if (json) {
        cJSON *o = plan_json(&cfg, gpu_name, &p, &plan, &dt, train);
        st = o ? kvp_json_print(stdout, o) : KVP_ERR(KVP_ENOMEM, "out of memory");
        cJSON_Delete(o);
        if (st != KVP_OK) return kvp_cli_fail("plan", st);
    } else {
        print_table(&cfg, gpu_name, &p, &plan, &dt, train);
    }
    return KVP_EXIT_OK;
}
