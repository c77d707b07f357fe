/* runtime/cli/engine_opts.c — the engine options shared by simulate, generate and serve (engine_opts.h). */
#include "runtime/cli/engine_opts.h"

#include <string.h>

#include "common/parse.h"

static const struct option engine_long[] = {
    {"block-size", required_argument, 0, KVP_EO_BLOCK},
    {"cache", required_argument, 0, KVP_EO_CACHE},
    {"evict", required_argument, 0, KVP_EO_EVICT},
    {"sched", required_argument, 0, KVP_EO_SCHED},
    {"preempt", required_argument, 0, KVP_EO_PREEMPT},
    {"swap-space", required_argument, 0, KVP_EO_SWAP},
    {"watermark-blocks", required_argument, 0, KVP_EO_WATERMARK},
    {"max-num-seqs", required_argument, 0, KVP_EO_SEQS},
    {"max-batched-tokens", required_argument, 0, KVP_EO_BATCH},
    {"no-chunked-prefill", no_argument, 0, KVP_EO_NOCHUNK},
    {"speculative-config", required_argument, 0, KVP_EO_SPEC},
    {"kv-offloading-size", required_argument, 0, KVP_EO_OFFLOAD},
    {"kv-offloading-policy", required_argument, 0, KVP_EO_OFFPOL},
    {"kv-events", required_argument, 0, KVP_EO_KVEVENTS},
};
enum { N_ENGINE = sizeof engine_long / sizeof engine_long[0] };
_Static_assert(N_ENGINE == KVP_EO_END - KVP_EO_BLOCK, "one table entry per engine option");

void kvp_engine_opts_init(kvp_engine_opts *o, kvp_engine_config *cfg)
{
    *o = (kvp_engine_opts){.cfg = cfg, .swap_bytes = -1};
}

int kvp_engine_opts_table(const struct option *own, int n_own, struct option *out, int cap)
{
    if (n_own + N_ENGINE + 1 > cap) return 0;
    memcpy(out, own, (size_t)n_own * sizeof *out);
    memcpy(out + n_own, engine_long, sizeof engine_long);
    out[n_own + N_ENGINE] = (struct option){0, 0, 0, 0};
    return n_own + N_ENGINE;
}

int kvp_engine_opt(kvp_engine_opts *o, int c, const char *arg, kvp_status *st)
{
    kvp_engine_config *e = o->cfg;
    switch (c) {
    case KVP_EO_BLOCK: *st = kvp_parse_i32(arg, 1, 1 << 20, &e->block_size); break;
    case KVP_EO_CACHE: *st = kvp_pc_kind_parse(arg, &e->cache); break;
    case KVP_EO_EVICT: *st = kvp_evict_policy_parse(arg, &e->evict); break;
    case KVP_EO_SCHED: *st = kvp_sched_policy_parse(arg, &e->sched); break;
    case KVP_EO_PREEMPT: *st = kvp_preempt_mode_parse(arg, &e->preempt); break;
    case KVP_EO_SWAP: *st = kvp_parse_bytes(arg, &o->swap_bytes); break;
    case KVP_EO_WATERMARK:
        *st = kvp_parse_i32(arg, 0, INT32_MAX, &e->watermark_blocks);
        o->watermark_given = true;
        break;
    case KVP_EO_SEQS: *st = kvp_parse_i32(arg, 1, 1 << 20, &e->max_num_seqs); break;
    case KVP_EO_BATCH:
        *st = kvp_parse_i32(arg, 1, 1 << 30, &e->max_batched_tokens);
        o->batch_given = true;
        break;
    case KVP_EO_NOCHUNK:
        e->chunked_prefill = false;
        *st = KVP_OK;
        break;
    case KVP_EO_SPEC: *st = kvp_spec_parse(arg, &e->spec); break;
    case KVP_EO_OFFLOAD:
        *st = kvp_parse_bytes(arg, &o->offload_bytes);
        if (*st == KVP_OK && o->offload_bytes < 0) *st = KVP_ERR(KVP_EINVAL, "must be >= 0");
        break;
    case KVP_EO_OFFPOL:
        *st = kvp_hc_write_policy_parse(arg, &e->host_write_policy);
        o->offload_policy_given = true;
        break;
    case KVP_EO_KVEVENTS:
        e->kv_events = arg;
        *st = arg[0] ? KVP_OK : KVP_ERR(KVP_EINVAL, "needs a file name");
        break;
    default: return 0;
    }
    return 1;
}

kvp_status kvp_engine_opts_check(const kvp_engine_opts *o)
{
    if (o->offload_policy_given && o->offload_bytes <= 0)
        return KVP_ERR(KVP_EINVAL, "--kv-offloading-policy needs a host tier (--kv-offloading-size)");
    if (o->cfg->kv_events && o->cfg->cache == KVP_PC_NONE)
        return KVP_ERR(KVP_EINVAL, "--kv-events are the prefix cache's: it needs a prefix cache (give --cache radix or "
                                   "hash)");
    if (o->offload_bytes > 0 && o->cfg->cache == KVP_PC_NONE)
        return KVP_ERR(KVP_EINVAL, "--kv-offloading-size is a tier of the prefix cache: it needs a prefix cache (give --cache radix or hash)");
    return KVP_OK;
}

void kvp_engine_opts_usage(FILE *f, const kvp_engine_config *d)
{
    fprintf(f,
            "engine (the same for simulate, generate and serve):\n"
            "  --block-size B            tokens per KV block (default %d)\n"
            "  --cache KIND              prefix cache: radix | hash | none (default %s)\n"
            "  --evict POLICY            its eviction policy: lru | lfu | fifo | priority (default %s)\n"
            "  --kv-offloading-size BYTES  a host-memory tier of the prefix cache (default 0, none): cached blocks\n"
            "                            are copied there, and an admission loads the blocks after its cache hit\n"
            "                            from there instead of computing them (vLLM's CPU offloading, SGLang's\n"
            "                            HiCache)\n"
            "  --kv-offloading-policy P  write_through (default: every cached block, in the background),\n"
            "                            write_back (each block the prefix cache evicts, before it is reused) or\n"
            "                            write_through_selective (a block once a prompt found it cached)\n"
            "  --kv-events FILE          the prefix cache's KV events, vLLM's schema (BlockStored, BlockRemoved,\n"
            "                            AllBlocksCleared), one JSON batch a step, for testing routers on replays\n"
            "  --sched POLICY            fcfs | lpm (SGLang's longest prefix match) | priority (default %s)\n"
            "  --preempt MODE            recompute | swap (default %s): what a preempted sequence gives up\n"
            "  --swap-space BYTES        host memory for swapped sequences (with --preempt swap; default: as much\n"
            "                            as the KV cache, for every command and executor)\n"
            "  --watermark-blocks N      free blocks kept back at admission (default %d; simulate: 1 %% of them)\n"
            "  --max-num-seqs N          running sequences at most, samples and beams included (default %d)\n"
            "  --max-batched-tokens N    token budget of a step (default %d)\n"
            "  --no-chunked-prefill      prefill whole prompts in prefill-only steps (vLLM v0)\n"
            "  --speculative-config J    n-gram speculative decoding, vLLM's JSON: {\"method\": \"ngram\",\n"
            "                            \"num_speculative_tokens\": K (1..16), \"prompt_lookup_max\": N,\n"
            "                            \"prompt_lookup_min\": M, \"disable_by_batch_size\": B}; answers are those\n"
            "                            without it (requests of a trace draw no tokens: nothing to speculate)\n",
            d->block_size, kvp_pc_kind_name(d->cache), kvp_evict_policy_name(d->evict), kvp_sched_policy_name(d->sched),
            kvp_preempt_mode_name(d->preempt), d->watermark_blocks, d->max_num_seqs, d->max_batched_tokens);
}

/* ---------------------------------------------------------------- device options */

static const struct option device_long[] = {
    {"device", required_argument, 0, KVP_DO_DEVICE},
    {"gpu-memory-utilization", required_argument, 0, KVP_DO_GPU_UTIL},
    {"kv-cache-memory", required_argument, 0, KVP_DO_KV_MEM},
    {"enforce-eager", no_argument, 0, KVP_DO_EAGER},
    {"cuda-attention", required_argument, 0, KVP_DO_CUDA_ATTN},
    {"deterministic", no_argument, 0, KVP_DO_DETERMINISTIC},
};
enum { N_DEVICE = sizeof device_long / sizeof device_long[0] };
_Static_assert(N_DEVICE == KVP_DO_END - KVP_DO_DEVICE, "one table entry per device option");

void kvp_device_opts_init(kvp_device_opts *o)
{
    *o = (kvp_device_opts){.cu = kvp_cuda_options_default()};
}

int kvp_device_opts_append(struct option *table, int n, int cap)
{
    if (n + N_DEVICE + 1 > cap) return 0;
    memcpy(table + n, device_long, sizeof device_long);
    table[n + N_DEVICE] = (struct option){0, 0, 0, 0};
    return n + N_DEVICE;
}

int kvp_device_opt(kvp_device_opts *o, int c, const char *arg, kvp_status *st)
{
    switch (c) {
    case KVP_DO_DEVICE: *st = kvp_device_parse(arg, &o->cuda, &o->cu.device); break;
    case KVP_DO_GPU_UTIL:
        *st = kvp_parse_f64(arg, 0.0, 1.0, &o->cu.gpu_memory_utilization);
        if (*st == KVP_OK && !(o->cu.gpu_memory_utilization > 0)) *st = KVP_ERR(KVP_EINVAL, "must be in (0, 1]");
        o->cuda_only = "--gpu-memory-utilization";
        break;
    case KVP_DO_KV_MEM:
        *st = kvp_parse_bytes(arg, &o->cu.kv_cache_memory);
        if (*st == KVP_OK && o->cu.kv_cache_memory <= 0) *st = KVP_ERR(KVP_EINVAL, "must be > 0");
        o->cuda_only = "--kv-cache-memory";
        break;
    case KVP_DO_EAGER:
        o->cu.enforce_eager = 1;
        o->cuda_only = "--enforce-eager";
        *st = KVP_OK;
        break;
    case KVP_DO_DETERMINISTIC:
        o->cu.deterministic = 1;
        o->cuda_only = "--deterministic";
        *st = KVP_OK;
        break;
    case KVP_DO_CUDA_ATTN:
        if (strcmp(arg, "paged") == 0) o->cu.attention = KVP_CUDA_ATTN_PAGED, *st = KVP_OK;
        else if (strcmp(arg, "rowwise") == 0) o->cu.attention = KVP_CUDA_ATTN_ROWWISE, *st = KVP_OK;
        else *st = KVP_ERR(KVP_EINVAL, "'%s' is not paged or rowwise", arg);
        o->cuda_only = "--cuda-attention";
        break;
    default: return 0;
    }
    return 1;
}

kvp_status kvp_device_opts_check(const kvp_device_opts *o)
{
    if (!o->cuda && o->cuda_only) return KVP_ERR(KVP_EINVAL, "%s applies to --device cuda only", o->cuda_only);
    return KVP_OK;
}

void kvp_device_opts_usage(FILE *f)
{
    fprintf(f,
            "device:\n"
            "  --device D                cpu (default) | cuda | cuda:N: the cuda executor runs the model on GPU N\n"
            "                            (weights converted at load: f32 checkpoints stay f32, others become bf16)\n"
            "  --gpu-memory-utilization F  share of the GPU's memory to use (default 0.9): weights, the activation\n"
            "                            peak of a profiling pass at the largest batch, and KV blocks in the rest\n"
            "  --kv-cache-memory BYTES   the KV pools' size instead of what the split leaves (vLLM's option)\n"
            "  --enforce-eager           no CUDA graphs (nor their batch buckets) for decode steps\n"
            "  --cuda-attention A        paged (default): attention/cuda's split-KV decode and FlashAttention-2\n"
            "                            prefill kernels; rowwise: one warp per query row, the same result for a\n"
            "                            row in any batch (the CPU's batch-invariant form), slower\n"
            "  --deterministic           batch-invariant results on the GPU: GEMMs by a tiled kernel that sums each\n"
            "                            output in one order (not cuBLAS), rowwise attention; a row's logits do not\n"
            "                            depend on what else is in the batch (slower: no tensor cores)\n");
}
