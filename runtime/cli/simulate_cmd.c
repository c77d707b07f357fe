/* runtime/cli/simulate_cmd.c — `kvpage simulate`: replay a trace or a synthetic workload through the scheduler,
 * the block manager and the prefix cache, on the `sim` executor (no GPU, simulated time) or on the `cpu`
 * executor (a real model run on this machine's CPU, measured time). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/parse.h"
#include "common/stats.h"
#include "common/timer.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/engine_opts.h"
#include "parallel/comm.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/planner/simulate.h"
#include "runtime/executor/sim_executor.h"
#include "runtime/workload/workload_synth.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage simulate --model CONFIG (--trace FILE | --workload SPEC) [options]\n"
            "\n"
            "Replays requests through the serving engine (continuous batching, chunked prefill, preemption,\n"
            "block manager, prefix cache) while a roofline cost model replaces the model's execution:\n"
            "step time = max(FLOPs / peak FLOP/s, bytes of weights + KV / memory bandwidth) + all-reduce\n"
            "+ a fixed per-step overhead (runtime/executor/cost_model.h). Simulated time only; no GPU needed.\n"
            "With --executor cpu a real model runs every step on this machine's CPU instead (greedy): step\n"
            "times are measured, and the clock still jumps over idle gaps to the next arrival.\n"
            "\n"
            "workload:\n"
            "  --trace FILE              Azure LLM trace CSV (*.csv) or Mooncake JSONL\n"
            "  --workload SPEC           sharegpt[:n=N,seed=S] | alpaca[:n=N,seed=S] (log-normal lengths with the\n"
            "                            PagedAttention paper's means, Poisson arrivals), or a prefix workload:\n"
            "                            system:... chat:... fewshot:... branch:... (runtime/workload/workload.h)\n"
            "  --rate R                  requests/s (> 0, or inf: all at once); traces are rescaled to it\n"
            "  --num-requests N          keep the first N requests\n"
            "  --duration S              keep the requests arriving in the first S seconds\n"
            "  --n N                     parallel samples per request (vLLM's n; default 1): each request fans out\n"
            "                            into N sequences of its prompt, arrival and output length, as vLLM v1 does;\n"
            "                            the samples start once the prompt is computed and, with --cache, share its\n"
            "                            full blocks; without a cache, or with orca-*, each holds its own copy\n"
            "model and hardware:\n"
            "  --executor sim|cpu        sim: the cost model (default); cpu: run the model (--model is then a GGUF\n"
            "                            file or a Hugging Face folder with weights); prompt token ids are hashed\n"
            "                            into the model's vocabulary (equal ids stay equal)\n"
            "  --executor cuda           the model on an NVIDIA GPU (runtime/executor/cuda_executor.h): KV blocks\n"
            "                            from the device's memory split (--gpu-memory-utilization, --kv-cache-memory\n"
            "                            or --kv-mem), --device cuda:N picks the GPU\n"
            "  --random-weights          with --executor cuda: --model is a config.json, its shape built with seeded\n"
            "                            random bf16 weights on the device (timing real shapes without a checkpoint)\n"
            "  --model CONFIG            Hugging Face config.json (sim), a model (cpu)\n"
            "  --gpu NAME                A100-40G | A100-80G | A100-80G-PCIe | H100-SXM | H100-PCIe | H200\n"
            "                            (default H200; sim)\n"
            "  --tp N                    tensor-parallel GPUs (default 1; sim reports the all-reduce share of step\n"
            "                            time); cpu: N MPI ranks, each holding 1/N of the model and of the KV cache\n"
            "                            (run as `mpirun -np N kvpage simulate ...`; rank 0 schedules and\n"
            "                            broadcasts each step's plan; --kv-mem is per rank)\n"
            "  --gpu-util F              share of GPU memory the runtime may use (default 0.9; sim)\n"
            "  --kv-mem BYTES            KV memory per GPU instead of what is left after weights (e.g. 12GB);\n"
            "                            cpu: the KV cache's size (default 1GiB)\n"
            "  --threads N               cpu: threads (default 1)\n"
            "  --kv-dtype T              cpu: KV element type auto (default: the model's dtype), f32, f16, bf16\n"
            "                            or fp8 (fp32 and fp16 also)\n"
            "memory management:\n"
            "  --alloc KIND              paged | orca-max | orca-pow2 | orca-oracle (default paged)\n"
            "  --arena PLACEMENT         buddy | first-fit: where the orca-* baselines place reservations\n"
            "                            (default buddy, as the PagedAttention paper's Orca emulation)\n"
            "limits:\n"
            "  --max-model-len N         prompt + output at most (default: the model's, at most 32768)\n"
            "output:\n"
            "  --json                    one JSON object on stdout\n"
            "  --requests-out FILE       also a CSV row per request (arrival order): id, arrival, prompt and\n"
            "                            output lengths, state, prompt tokens found cached, preemptions,\n"
            "                            admission / first token / finish times, TTFT, TPOT, end-to-end\n"
            "  --steps-out FILE          also a CSV row per step: time, batch, preemptions, finishes, queue\n"
            "                            lengths and the KV memory's split (tokens, reserved, internal and\n"
            "                            external fragmentation, cached, free) in slots\n"
            "  --check                   run every invariant walker after each step (slow)\n"
            "  -h, --help\n\n");
    kvp_engine_config d;
    kvp_engine_config_default(&d);
    kvp_engine_opts_usage(f, &d);
    kvp_device_opts_usage(f);
}

enum {
    O_MODEL = 256, O_GPU, O_TRACE, O_WORKLOAD, O_RATE, O_NUMREQ, O_DURATION, O_ALLOC, O_TP, O_MAXLEN, O_JSON,
    O_GPUUTIL, O_KVMEM, O_CHECK, O_ARENA, O_EXECUTOR, O_THREADS, O_KVDTYPE, O_REQOUT, O_STEPOUT, O_N, O_RANDOM,
};

enum { CPU_MEM_DEFAULT = 1 << 30 }; /* KV cache and swap space of the cpu executor when not given */

/* The cpu executor: loads the model at path (this rank's shard with comm), sizes its KV cache (and, with swap preemption, host pools)
 * from hw in whole blocks of ec->block_size, and fills ec's capacity and max_model_len (the model's
 * context unless given, never above it). *dtp: the KV element type, or with kv_auto set to the model's. */
static kvp_status cpu_prepare(const char *path, int threads, kvp_dtype *dtp, int kv_auto, const kvp_sim_hw *hw, int max_len_set,
                              kvp_comm *comm, kvp_engine_config *ec, kvp_model **lm, kvp_executor *ex,
                              kvp_sim_memory *mem)
{
    const size_t n = strlen(path);
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
        return KVP_ERR(KVP_EINVAL, "%s: --executor cpu runs a model: give a GGUF file or a Hugging Face folder", path);
    KVP_TRY(kvp_model_load_tp(path, comm, lm));
    kvp_model_set_threads(*lm, threads);
    if (kv_auto) *dtp = kvp_model_kv_dtype_auto(*lm);
    const kvp_dtype dt = *dtp;
    const int32_t ctx = kvp_model_max_len(*lm), bs = ec->block_size;
    if (!max_len_set) ec->max_model_len = ctx;
    else if (ec->max_model_len > ctx)
        return KVP_ERR(KVP_EINVAL, "--max-model-len %d exceeds the context of %s (%d tokens)", (int)ec->max_model_len,
                       path, (int)ctx);
    memset(mem, 0, sizeof *mem);
    mem->kv_bytes_per_token = kvp_kv_cache_bytes(*lm, dt, 1, 1);
    const int64_t blocks = (int64_t)((double)(hw->kv_mem_bytes > 0 ? hw->kv_mem_bytes : CPU_MEM_DEFAULT) /
                                     mem->kv_bytes_per_token) / bs;
    const int64_t host = ec->preempt == KVP_PREEMPT_SWAP ? (int64_t)((double)hw->swap_bytes / mem->kv_bytes_per_token) / bs : 0;
    const int64_t tier = (int64_t)((double)hw->offload_bytes / mem->kv_bytes_per_token) / bs;
    if (blocks < 1)
        return KVP_ERR(KVP_EINVAL, "--kv-mem holds no block of %d tokens of %s (%.0f bytes a token)", (int)bs, path,
                       mem->kv_bytes_per_token);
    if (blocks > INT32_MAX || host + tier > INT32_MAX - 1)
        return KVP_ERR(KVP_EINVAL, "--kv-mem / --swap-space / --kv-offloading-size: more than %d blocks", INT32_MAX - 1);
    if (hw->offload_bytes > 0 && tier < 1)
        return KVP_ERR(KVP_EINVAL, "--kv-offloading-size holds no block of %d tokens of %s (%.0f bytes a token)", (int)bs,
                       path, mem->kv_bytes_per_token);
    ec->kv_slots = mem->kv_slots = blocks * bs;
    ec->host_slots = mem->host_slots = host * bs;
    ec->host_cache_slots = mem->host_cache_slots = tier * bs;
    mem->kv_bytes = (double)ec->kv_slots * mem->kv_bytes_per_token;
    KVP_TRY(kvp_check_fits_in_memory(mem->kv_bytes + (double)(host + tier) * bs * mem->kv_bytes_per_token,
                                     host + tier > 0 ? "--kv-mem plus --swap-space and --kv-offloading-size" : "--kv-mem"));
    if (comm && kvp_comm_rank(comm) != 0) return KVP_OK; /* it executes rank 0's plans (kvp_cpu_follow) */
    return kvp_cpu_executor_create_tp(*lm, (int32_t)blocks, bs, (int32_t)kvp_engine_host_blocks(ec), dt, ex);
}

/* The cuda executor: the model at path (or, with random, a config.json's shape with seeded random bf16
 * weights made on the device), KV blocks from the device's memory split (--kv-mem: the KV pools' bytes, as
 * --kv-cache-memory), host pools for swap and the host tier from their bytes; fills ec as cpu_prepare does. */
static kvp_status cuda_prepare(const char *path, int random, const kvp_cuda_options *co, kvp_dtype *dtp, int kv_auto,
                               const kvp_sim_hw *hw, int max_len_set, kvp_engine_config *ec, kvp_model **lm,
                               kvp_model_config *cfg, kvp_executor *ex, kvp_sim_memory *mem, kvp_cuda_info *info)
{
    int32_t ctx;
    if (random) {
        KVP_TRY(kvp_model_config_load(path, cfg));
        const int64_t c = kvp_model_config_context(cfg);
        ctx = c > 0 && c < INT32_MAX ? (int32_t)c : 4096;
        if (kv_auto) *dtp = KVP_DTYPE_BF16;
    } else {
        KVP_TRY(kvp_model_load(path, lm));
        *cfg = *kvp_model_cfg(*lm);
        ctx = kvp_model_max_len(*lm);
        if (kv_auto) *dtp = kvp_model_kv_dtype_auto(*lm);
    }
    if (!max_len_set) ec->max_model_len = ctx;
    else if (ec->max_model_len > ctx)
        return KVP_ERR(KVP_EINVAL, "--max-model-len %d exceeds the context of %s (%d tokens)", (int)ec->max_model_len,
                       path, (int)ctx);
    const int32_t bs = ec->block_size;
    memset(mem, 0, sizeof *mem);
    mem->kv_bytes_per_token = (double)kvp_model_kv_elems_per_token(cfg) * (double)kvp_dtype_size(*dtp);
    const double per_block = mem->kv_bytes_per_token * bs;
    const int64_t host = ec->preempt == KVP_PREEMPT_SWAP ? (int64_t)((double)hw->swap_bytes / per_block) : 0;
    const int64_t tier = (int64_t)((double)hw->offload_bytes / per_block);
    if (host + tier > INT32_MAX / 2) return KVP_ERR(KVP_EINVAL, "--swap-space / --kv-offloading-size: too many blocks");
    kvp_cuda_options o = *co;
    if (hw->kv_mem_bytes > 0) o.kv_cache_memory = hw->kv_mem_bytes;
    const int32_t max_tokens = ec->chunked_prefill || ec->max_batched_tokens >= ec->max_model_len
                                   ? ec->max_batched_tokens : ec->max_model_len;
    KVP_TRY(kvp_cuda_executor_create(*lm, random ? cfg : NULL, &o, 0, bs, (int32_t)(host + tier), *dtp, max_tokens,
                                     ec->max_num_seqs, ex, info));
    ec->kv_slots = mem->kv_slots = (int64_t)info->split.num_blocks * bs;
    ec->host_slots = mem->host_slots = host * bs;
    ec->host_cache_slots = mem->host_cache_slots = tier * bs;
    mem->kv_bytes = (double)ec->kv_slots * mem->kv_bytes_per_token;
    mem->weight_bytes = (double)info->split.weights;
    kvp_cuda_info_log(info);
    return KVP_OK;
}

/* --requests-out / --steps-out: rows go to PATH.tmp, created before the run (a path that cannot be written
 * fails at once), renamed to PATH after a successful run and removed otherwise (PATH is never left half
 * written). */
typedef struct {
    FILE *f;
    const char *opt, *path;
    char tmp[4096];
} out_file;

static kvp_status out_file_open(out_file *of, const char *opt, const char *path, const char *header)
{
    of->opt = opt;
    of->path = path;
    if (snprintf(of->tmp, sizeof of->tmp, "%s.tmp", path) >= (int)sizeof of->tmp)
        return KVP_ERR(KVP_EINVAL, "%s: path too long", opt);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return KVP_ERR(KVP_EINVAL, "%s: %s is a directory", opt, path);
    if ((of->f = fopen(of->tmp, "w")) == NULL)
        return KVP_ERR(KVP_EIO, "%s: cannot create %s: %s", opt, of->tmp, strerror(errno));
    fputs(header, of->f);
    return KVP_OK;
}

/* Closes (nothing open: st), then renames when st is KVP_OK, removes otherwise. Returns st or the error. */
static kvp_status out_file_close(out_file *of, kvp_status st)
{
    if (of->f == NULL) return st;
    const int werr = ferror(of->f), cerr = fclose(of->f) != 0;
    of->f = NULL;
    if (st == KVP_OK && (werr || cerr)) st = KVP_ERR(KVP_EIO, "%s: cannot write %s", of->opt, of->tmp);
    if (st == KVP_OK && rename(of->tmp, of->path) != 0)
        st = KVP_ERR(KVP_EIO, "%s: cannot rename %s to %s: %s", of->opt, of->tmp, of->path, strerror(errno));
    if (st != KVP_OK) remove(of->tmp);
    return st;
}

static const char REQ_HEADER[] = "id,arrival_s,prompt_len,output_len,state,cached_tokens,preemptions,admit_s,"
                                 "first_token_s,finish_s,ttft_s,tpot_s,e2e_s\n";

static const char *req_state_name(kvp_req_state s)
{
    static const char *const names[] = {"pending", "waiting", "running", "swapped", "finished", "rejected"};
    return (unsigned)s <= KVP_REQ_REJECTED ? names[s] : "?";
}

static void write_requests(FILE *f, const kvp_req_result *r, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const kvp_req_result *q = &r[i];
        fprintf(f, "%lld,%.9g,%d,%d,%s,%d,%d,", (long long)q->id, q->arrival_s, (int)q->prompt_len, (int)q->output_len,
                req_state_name(q->state), (int)q->cached_tokens, (int)q->preemptions);
        if (q->state != KVP_REQ_FINISHED) {
            fputs(",,,,,\n", f);
            continue;
        }
        fprintf(f, "%.9g,%.9g,%.9g,%.9g,", q->admit_s, q->first_token_s, q->finish_s, q->first_token_s - q->arrival_s);
        if (q->num_generated >= 2) fprintf(f, "%.9g", (q->finish_s - q->first_token_s) / (q->num_generated - 1));
        fprintf(f, ",%.9g\n", q->finish_s - q->arrival_s);
    }
}

/* Latencies of whole requests when each has n samples (kvp_workload_fork: request g's are g * n .. g * n + n - 1),
 * as a streaming client of an n > 1 request sees them: TTFT to the first sample's first token, end-to-end to
 * the last sample's finish. A request with a sample not finished is left out. */
typedef struct {
    double ttft_p50, ttft_p99, e2e_p50, e2e_p99;
} group_latency;

static kvp_status group_latencies(const kvp_req_result *r, int64_t nseq, int32_t n, group_latency *out)
{
    const int64_t ng = nseq / n;
    const size_t cap = (size_t)(ng > 0 ? ng : 1);
    double *ttft = kvp_malloc(cap * sizeof *ttft), *e2e = kvp_malloc(cap * sizeof *e2e);
    if (!ttft || !e2e) {
        kvp_free(ttft);
        kvp_free(e2e);
        return KVP_ERR(KVP_ENOMEM, "out of memory for %lld request latencies", (long long)ng);
    }
    int64_t k = 0;
    for (int64_t g = 0; g < ng; g++) {
        const kvp_req_result *q = &r[g * n];
        double first = INFINITY, last = -INFINITY;
        int32_t j = 0;
        for (; j < n && q[j].state == KVP_REQ_FINISHED; j++) {
            first = q[j].first_token_s < first ? q[j].first_token_s : first;
            last = q[j].finish_s > last ? q[j].finish_s : last;
        }
        if (j < n) continue;
        ttft[k] = first - q[0].arrival_s;
        e2e[k++] = last - q[0].arrival_s;
    }
    kvp_sort_doubles(ttft, k);
    kvp_sort_doubles(e2e, k);
    *out = (group_latency){kvp_percentile(ttft, k, 50), kvp_percentile(ttft, k, 99), kvp_percentile(e2e, k, 50),
                           kvp_percentile(e2e, k, 99)};
    kvp_free(ttft);
    kvp_free(e2e);
    return KVP_OK;
}

static const char STEP_HEADER[] = "step,time_s,step_s,batch_seqs,batch_tokens,preempted,finished,running,waiting,"
                                  "swapped,token_states,reserved,internal_frag,external_frag,cached,free\n";

/* --steps-out: a row after every step that ran a batch, with the KV memory in slots (tokens) then. */
static kvp_status write_step(void *ctx, const kvp_engine *e, const kvp_step_info *inf)
{
    FILE *f = ctx;
    kvp_kv_accounting a;
    kvp_engine_account(e, &a);
    fprintf(f, "%lld,%.9g,%.9g,%d,%d,%d,%d,%d,%d,%d,%lld,%lld,%lld,%lld,%lld,%lld\n", (long long)kvp_engine_steps(e),
            inf->time_s, inf->step_s, (int)inf->num_scheduled, (int)inf->num_tokens, (int)inf->num_preempted,
            (int)inf->num_finished, (int)kvp_engine_num_running(e), (int)kvp_engine_num_waiting(e),
            (int)kvp_engine_num_swapped(e), (long long)a.token_states, (long long)a.reserved, (long long)a.internal_frag,
            (long long)a.external_frag, (long long)a.cached, (long long)a.free);
    return ferror(f) ? KVP_ERR(KVP_EIO, "--steps-out: cannot write") : KVP_OK;
}

enum { SUMMARY_COLS = 100, SUMMARY_INDENT = 19 }; /* the summary fits 100 columns; values start at column 19 */

/* One line of the summary: LABEL padded to 19 columns, then the text, wrapped at spaces so that no line is
 * longer than 100 characters, continuation lines indented under the text (a word too long for a line, as a
 * long model path, stays whole on its own line). */
static void summary_line(const char *label, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void summary_line(const char *label, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int col = printf("%-*s ", SUMMARY_INDENT - 1, label);
    const int start = col;
    for (const char *p = text; *p;) {
        size_t sp = strspn(p, " "), w = strcspn(p + sp, " ");
        if (col > start && col + (int)(sp + w) > SUMMARY_COLS) { /* break here: the spaces become the break */
            printf("\n%*s", SUMMARY_INDENT, "");
            col = SUMMARY_INDENT;
            sp = 0;
            p += strspn(p, " ");
        }
        fwrite(p, 1, sp + w, stdout);
        col += (int)(sp + w);
        p += sp + w;
    }
    putchar('\n');
}

static int simulate(int argc, char **argv, kvp_comm **comm)
{
    static const struct option own[] = {
        {"model", required_argument, NULL, O_MODEL},
        {"gpu", required_argument, NULL, O_GPU},
        {"trace", required_argument, NULL, O_TRACE},
        {"workload", required_argument, NULL, O_WORKLOAD},
        {"rate", required_argument, NULL, O_RATE},
        {"num-requests", required_argument, NULL, O_NUMREQ},
        {"duration", required_argument, NULL, O_DURATION},
        {"n", required_argument, NULL, O_N},
        {"alloc", required_argument, NULL, O_ALLOC},
        {"arena", required_argument, NULL, O_ARENA},
        {"tp", required_argument, NULL, O_TP},
        {"max-model-len", required_argument, NULL, O_MAXLEN},
        {"gpu-util", required_argument, NULL, O_GPUUTIL},
        {"kv-mem", required_argument, NULL, O_KVMEM},
        {"json", no_argument, NULL, O_JSON},
        {"check", no_argument, NULL, O_CHECK},
        {"executor", required_argument, NULL, O_EXECUTOR},
        {"threads", required_argument, NULL, O_THREADS},
        {"kv-dtype", required_argument, NULL, O_KVDTYPE},
        {"requests-out", required_argument, NULL, O_REQOUT},
        {"steps-out", required_argument, NULL, O_STEPOUT},
        {"random-weights", no_argument, NULL, O_RANDOM},
        {"help", no_argument, NULL, 'h'},
    };
    struct option opts[sizeof own / sizeof own[0] + KVP_EO_END - KVP_EO_BLOCK + KVP_DO_END - KVP_DO_DEVICE + 1];
    kvp_device_opts_append(opts, kvp_engine_opts_table(own, (int)(sizeof own / sizeof own[0]), opts,
                                                       (int)(sizeof opts / sizeof opts[0])),
                           (int)(sizeof opts / sizeof opts[0]));
    kvp_device_opts dev;
    kvp_device_opts_init(&dev);
    int cuda = 0, random = 0;
    kvp_cuda_info cuda_info;
    memset(&cuda_info, 0, sizeof cuda_info);
    const char *cmd = "simulate", *model = NULL, *gpu_name = "H200", *trace = NULL, *spec = NULL, *req_out = NULL,
               *step_out = NULL;
    double rate = 0, duration = 0;
    int64_t num_req = 0;
    int32_t n_samples = 1;
    int json = 0, max_len_set = 0, cpu = 0, threads = 1;
    const char *sim_only = NULL, *cpu_only = NULL; /* an option given that the other executor does not take */
    kvp_dtype kv_dtype = KVP_DTYPE_F32;
    int kv_auto = 1;
    kvp_engine_config ec;
    kvp_engine_config_default(&ec);
    kvp_sim_hw hw;
    kvp_sim_hw_default(&hw);
    kvp_status st = KVP_OK;
    int c;
    optind = 0;
    int li = -1;
    kvp_engine_opts eo;
    kvp_engine_opts_init(&eo, &ec);
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        if (kvp_engine_opt(&eo, c, optarg, &st) || kvp_device_opt(&dev, c, optarg, &st)) {
            if (st != KVP_OK) return kvp_cli_usage_error(cmd, "--%s: %s", opts[li].name, kvp_error_message());
            continue;
        }
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_GPU:
            gpu_name = optarg;
            sim_only = "--gpu";
            break;
        case O_TRACE: trace = optarg; break;
        case O_WORKLOAD: spec = optarg; break;
        case O_RATE: st = kvp_parse_rate(optarg, &rate); break;
        case O_NUMREQ: st = kvp_parse_i64(optarg, 1, INT32_MAX, &num_req); break;
        case O_N: st = kvp_parse_i32(optarg, 1, 1024, &n_samples); break;
        case O_DURATION:
            st = kvp_parse_f64(optarg, 1e-9, 1e9, &duration);
            break;
        case O_ALLOC: st = kvp_alloc_kind_parse(optarg, &ec.alloc); break;
        case O_ARENA: st = kvp_contig_placement_parse(optarg, &ec.arena); break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 1024, &hw.tp); break;
        case O_MAXLEN:
            st = kvp_parse_i32(optarg, 2, INT32_MAX / 2, &ec.max_model_len);
            max_len_set = 1;
            break;
        case O_GPUUTIL:
            sim_only = "--gpu-util";
            st = kvp_parse_f64(optarg, 0, 1, &hw.gpu_util);
            if (st == KVP_OK && !(hw.gpu_util > 0)) st = KVP_ERR(KVP_EINVAL, "must be in (0, 1]");
            break;
        case O_KVMEM:
            st = kvp_parse_bytes(optarg, &hw.kv_mem_bytes);
            if (st == KVP_OK && hw.kv_mem_bytes <= 0) st = KVP_ERR(KVP_EINVAL, "must be > 0");
            break;
        case O_JSON: json = 1; break;
        case O_CHECK: ec.check_every_step = true; break;
        case O_EXECUTOR:
            if (strcmp(optarg, "cpu") == 0 || strcmp(optarg, "sim") == 0 || strcmp(optarg, "cuda") == 0)
                cpu = optarg[0] == 'c', cuda = optarg[1] == 'u'; /* cuda runs a real model too: cpu's paths */
            else st = KVP_ERR(KVP_EINVAL, "unknown executor '%s' (use sim, cpu or cuda)", optarg);
            break;
        case O_RANDOM: random = 1; break;
        case O_THREADS:
            st = kvp_parse_i32(optarg, 1, 1024, &threads);
            cpu_only = "--threads";
            break;
        case O_KVDTYPE:
            st = kvp_kv_dtype_parse(optarg, &kv_dtype, &kv_auto);
            cpu_only = "--kv-dtype";
            break;
        case O_REQOUT: req_out = optarg; break;
        case O_STEPOUT: step_out = optarg; break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(cmd, c, argv);
        }
        if (st != KVP_OK) return kvp_cli_usage_error(cmd, "--%s: %s", opts[li].name, kvp_error_message());
    }
    if (optind < argc) return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (model == NULL) return kvp_cli_usage_error(cmd, "--model CONFIG is required");
    if ((trace == NULL) == (spec == NULL)) return kvp_cli_usage_error(cmd, "give exactly one of --trace and --workload");
    if (cpu && sim_only) return kvp_cli_usage_error(cmd, "%s applies to --executor sim only", sim_only);
    if (!cpu && cpu_only) return kvp_cli_usage_error(cmd, "%s applies to --executor cpu only", cpu_only);
    if ((st = kvp_engine_opts_check(&eo)) != KVP_OK) return kvp_cli_usage_error(cmd, "%s", kvp_error_message());
    if (cuda) dev.cuda = 1; /* --executor cuda: the device options apply (--device cuda:N picks the GPU) */
    if ((st = kvp_device_opts_check(&dev)) != KVP_OK)
        return kvp_cli_usage_error(cmd, "%s (simulate: --executor cuda)", kvp_error_message());
    if (random && !cuda)
        return kvp_cli_usage_error(cmd, "--random-weights builds the model on the device: it needs --executor cuda (the "
                                        "cpu executor runs weights from a file)");
    if (cuda && hw.tp > 1)
        return kvp_cli_usage_error(cmd, "--tp %d with --executor cuda: simulate runs the cuda executor on one GPU "
                                        "(tensor parallelism on GPUs: mpirun -np N kvpage generate --device cuda --tp N)",
                                   hw.tp);
    if (cuda && threads != 1) return kvp_cli_usage_error(cmd, "--threads applies to --executor cpu only");
    hw.offload_bytes = eo.offload_bytes;
    if (eo.swap_bytes >= 0) hw.swap_bytes = eo.swap_bytes;
    if (cpu && ec.alloc != KVP_ALLOC_PAGED)
        return kvp_cli_usage_error(cmd, "--alloc %s needs --executor sim (the cpu executor reads block tables)",
                                   kvp_alloc_kind_name(ec.alloc));

    const kvp_gpu_profile *gpu = NULL;
    kvp_model_config cfg;
    kvp_cost_model cm;
    kvp_sim_memory mem;
    kvp_model *lm = NULL; /* the cpu executor's model */
    kvp_executor ex = {0};
    if (cpu && hw.tp > 1) { /* MPI ranks; rank 0 alone prints and writes files */
        st = kvp_comm_mpi_create(hw.tp, comm);
        if (st == KVP_OK && kvp_comm_rank(*comm) != 0) req_out = step_out = NULL;
        if (st == KVP_OK) st = kvp_comm_quiet_other_ranks(*comm);
        if (st != KVP_OK) return kvp_cli_fail(cmd, st);
    }
    if (cuda) {
        if (eo.swap_bytes < 0) hw.swap_bytes = hw.kv_mem_bytes > 0 ? hw.kv_mem_bytes : CPU_MEM_DEFAULT;
        st = cuda_prepare(model, random, &dev.cu, &kv_dtype, kv_auto, &hw, max_len_set, &ec, &lm, &cfg, &ex, &mem,
                          &cuda_info);
    } else if (cpu) {
        if (eo.swap_bytes < 0) hw.swap_bytes = hw.kv_mem_bytes > 0 ? hw.kv_mem_bytes : CPU_MEM_DEFAULT; /* as the cache */
        st = cpu_prepare(model, threads, &kv_dtype, kv_auto, &hw, max_len_set, *comm, &ec, &lm, &ex, &mem);
        if (st == KVP_OK && *comm && kvp_comm_rank(*comm) != 0) { /* rank 0 alone schedules */
            st = kvp_cpu_follow(lm, NULL);
            kvp_model_destroy(lm);
            return st == KVP_OK ? KVP_EXIT_OK : kvp_cli_fail(cmd, st);
        }
        if (st == KVP_OK) cfg = *kvp_model_cfg(lm);
    } else {
        st = kvp_gpu_profile_find(gpu_name, &gpu);
        if (st == KVP_OK) st = kvp_model_config_load(model, &cfg);
        if (st == KVP_OK && !max_len_set) ec.max_model_len = kvp_sim_default_max_model_len(&cfg);
    }
    if (st == KVP_OK && !ec.chunked_prefill && ec.max_batched_tokens < ec.max_model_len) {
        if (eo.batch_given) /* as vLLM: a whole prompt must fit one step */
            st = KVP_ERR(KVP_EINVAL, "--no-chunked-prefill: --max-batched-tokens %d is below max_model_len %d (a prompt "
                                     "is computed in one step)", (int)ec.max_batched_tokens, (int)ec.max_model_len);
        ec.max_batched_tokens = ec.max_model_len;
    }
    if (st == KVP_OK && !cpu) st = kvp_sim_prepare(&cfg, gpu, &hw, &ec, &cm, &mem);
    if (!eo.watermark_given && ec.alloc == KVP_ALLOC_PAGED) ec.watermark_blocks = (int32_t)((ec.kv_slots / ec.block_size) / 100);

    double t0 = kvp_now_s();
    kvp_workload *w = NULL;
    if (st == KVP_OK) st = kvp_sim_load_workload(trace, spec, num_req, duration, rate, ec.max_model_len, n_samples, &w);
    kvp_engine_metrics m;
    kvp_sim_rejections rej = {0};
    char wname[64] = "", why[512] = "";
    out_file rf = {0}, sf = {0};
    kvp_req_result *per_req = NULL; /* every sequence's results: --requests-out, and requests of n samples */
    group_latency gl = {0};
    if (st == KVP_OK && req_out) /* created before the run, renamed over req_out only after it */
        st = out_file_open(&rf, "--requests-out", req_out, REQ_HEADER);
    if (st == KVP_OK && (req_out || n_samples > 1) && (per_req = kvp_calloc((size_t)w->n, sizeof *per_req)) == NULL)
        st = KVP_ERR(KVP_ENOMEM, "out of memory for %lld request results", (long long)w->n);
    if (st == KVP_OK && step_out && (st = out_file_open(&sf, "--steps-out", step_out, STEP_HEADER)) == KVP_OK) {
        ec.on_step = write_step;
        ec.on_step_ctx = sf.f;
    }
    if (st == KVP_OK) {
        if (cpu) kvp_workload_fit_vocab(w, cfg.vocab_size);
        kvp_progress_bar bar;
        kvp_progress_bar_init(&bar, "simulate");
        if (!cpu) st = kvp_sim_executor_create(&cm, 0, &ex);
        if (st == KVP_OK)
            st = kvp_simulate_run(&ec, &ex, w, kvp_progress_bar_fn, &bar, &m, per_req, &rej);
        kvp_progress_bar_end(&bar);
        snprintf(wname, sizeof wname, "%s", w->name);
    }
    if (st == KVP_OK && rf.f) write_requests(rf.f, per_req, w->n);
    if (st == KVP_OK && n_samples > 1) st = group_latencies(per_req, w->n, n_samples, &gl);
    st = out_file_close(&rf, st);
    st = out_file_close(&sf, st);
    double wall = kvp_now_s() - t0;
    kvp_sim_stats ss;
    kvp_sim_executor_stats(&ex, &ss); /* zeros for the cpu executor */
    if (cuda && st == KVP_OK && kvp_cuda_executor_info(&ex, &cuda_info) == KVP_OK) kvp_cuda_info_log(&cuda_info);
    kvp_free(per_req);
    kvp_workload_destroy(w);
    kvp_executor_destroy(&ex);
    kvp_model_destroy(lm);
    if (st != KVP_OK) return kvp_cli_fail(cmd, st);

    cJSON *o = cJSON_CreateObject();
    if (o == NULL) return kvp_cli_fail(cmd, KVP_ERR(KVP_ENOMEM, "out of memory"));
    cJSON_AddStringToObject(o, "workload", wname);
    cJSON_AddStringToObject(o, "model", cfg.model_type);
    cJSON_AddStringToObject(o, "executor", cuda ? "cuda" : cpu ? "cpu" : "sim");
    if (cuda) {
        cJSON_AddStringToObject(o, "kv_dtype", kvp_dtype_name(kv_dtype));
        cJSON_AddBoolToObject(o, "random_weights", random);
        kvp_cuda_info_json(&cuda_info, o);
    } else if (cpu) {
        cJSON_AddNumberToObject(o, "threads", threads);
        cJSON_AddStringToObject(o, "kv_dtype", kvp_dtype_name(kv_dtype));
    } else {
        cJSON_AddStringToObject(o, "gpu", gpu->name);
    }
    cJSON_AddNumberToObject(o, "tp", hw.tp);
    cJSON_AddStringToObject(o, "alloc", kvp_alloc_kind_name(ec.alloc));
    if (ec.alloc != KVP_ALLOC_PAGED) cJSON_AddStringToObject(o, "arena", kvp_contig_placement_name(ec.arena));
    cJSON_AddNumberToObject(o, "block_size", ec.block_size);
    cJSON_AddNumberToObject(o, "max_model_len", ec.max_model_len);
    cJSON_AddStringToObject(o, "cache", kvp_pc_kind_name(ec.cache));
    cJSON_AddStringToObject(o, "sched", kvp_sched_policy_name(ec.sched));
    cJSON_AddStringToObject(o, "preempt", kvp_preempt_mode_name(ec.preempt));
    const int64_t swap_tokens = ec.preempt == KVP_PREEMPT_SWAP ? ec.host_slots / ec.block_size * ec.block_size : 0;
    cJSON_AddNumberToObject(o, "swap_tokens", (double)swap_tokens); /* whole blocks, as the engine uses them */
    cJSON_AddNumberToObject(o, "kv_capacity_tokens", (double)m.kv_capacity_slots);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", mem.kv_bytes_per_token);
    cJSON_AddNumberToObject(o, "kv_mem_bytes", mem.kv_bytes);
    if (!cpu) cJSON_AddNumberToObject(o, "weight_bytes_per_gpu", mem.weight_bytes);
    cJSON_AddNumberToObject(o, "n", n_samples);
    cJSON_AddNumberToObject(o, "requests", (double)m.requests);
    cJSON_AddNumberToObject(o, "finished", (double)m.finished);
    cJSON_AddNumberToObject(o, "rejected", (double)m.rejected);
    /* why, by reason (runtime/planner/simulate.h), and in words */
    kvp_sim_rejections_summary(&rej, why, sizeof why);
    cJSON_AddNumberToObject(o, "rejected_kv", (double)rej.kv);
    cJSON_AddNumberToObject(o, "rejected_context", (double)rej.context);
    cJSON_AddNumberToObject(o, "rejected_other", (double)rej.other);
    cJSON_AddStringToObject(o, "rejected_reason", why);
    cJSON_AddNumberToObject(o, "steps", (double)m.steps);
    cJSON_AddNumberToObject(o, "sim_duration_s", m.sim_duration_s);
    cJSON_AddNumberToObject(o, "throughput_tok_s", m.throughput_tok_s);
    cJSON_AddNumberToObject(o, "total_tok_s", m.total_tok_s);
    cJSON_AddNumberToObject(o, "req_per_s", m.req_per_s);
    cJSON_AddNumberToObject(o, "ttft_p50_s", m.ttft_p50_s);
    cJSON_AddNumberToObject(o, "ttft_p99_s", m.ttft_p99_s);
    cJSON_AddNumberToObject(o, "tpot_p50_s", m.tpot_p50_s);
    cJSON_AddNumberToObject(o, "tpot_p99_s", m.tpot_p99_s);
    cJSON_AddNumberToObject(o, "e2e_p50_s", m.e2e_p50_s);
    cJSON_AddNumberToObject(o, "e2e_p99_s", m.e2e_p99_s);
    if (n_samples > 1) { /* whole requests: the first sample's first token, the last sample's finish */
        cJSON_AddNumberToObject(o, "request_ttft_p50_s", gl.ttft_p50);
        cJSON_AddNumberToObject(o, "request_ttft_p99_s", gl.ttft_p99);
        cJSON_AddNumberToObject(o, "request_e2e_p50_s", gl.e2e_p50);
        cJSON_AddNumberToObject(o, "request_e2e_p99_s", gl.e2e_p99);
    }
    cJSON_AddNumberToObject(o, "norm_latency_s", m.norm_latency_s);
    cJSON_AddNumberToObject(o, "mean_running", m.mean_running);
    cJSON_AddNumberToObject(o, "max_running", (double)m.max_running);
    cJSON_AddNumberToObject(o, "preemptions", (double)m.preemptions);
    cJSON_AddNumberToObject(o, "swap_outs", (double)m.swap_outs);
    cJSON_AddNumberToObject(o, "readmit_hit_tokens", (double)m.readmit_hit_tokens);
    cJSON_AddNumberToObject(o, "prefix_hit_rate", m.prefix_hit_rate);
    cJSON_AddNumberToObject(o, "host_cache_tokens", (double)ec.host_cache_slots);
    cJSON_AddNumberToObject(o, "prefix_host_hit_rate", m.prefix_host_hit_rate);
    cJSON_AddNumberToObject(o, "host_loaded_blocks", (double)m.host_loaded_blocks);
    cJSON_AddNumberToObject(o, "host_stored_blocks", (double)m.host_stored_blocks);
    cJSON_AddStringToObject(o, "host_write_policy", kvp_hc_write_policy_name(ec.host_write_policy));
    if (!cpu) cJSON_AddNumberToObject(o, "host_store_backlog_max_s", ss.store_backlog_max_s);
    if (!cpu) cJSON_AddNumberToObject(o, "host_store_sync_s", ss.sync_store_s);
    /* the tensor-parallel all-reduces' share of the executor's step time (0 at --tp 1) */
    const double comm_share = ss.total_s > 0 ? ss.comm_s / ss.total_s : 0;
    if (!cpu) cJSON_AddNumberToObject(o, "comm_s", ss.comm_s);
    if (!cpu) cJSON_AddNumberToObject(o, "comm_share", comm_share);
    cJSON_AddNumberToObject(o, "evicted_blocks", (double)m.evicted_blocks);
    if (ec.cache != KVP_PC_NONE) { /* why prompt tokens missed, and the cache's health (prefix_cache/ledger.h) */
        char key[64];
        for (int c = 0; c < KVP_MISS_CLASSES; c++) {
            snprintf(key, sizeof key, "miss_%s_tokens", kvp_miss_class_name((kvp_miss_class)c));
            cJSON_AddNumberToObject(o, key, (double)m.miss_tokens[c]);
        }
        const struct {
            const char *name;
            const kvp_hist *h;
        } hs[] = {{"kv_block_lifetime", &m.block_lifetime}, {"kv_block_idle_before_evict", &m.block_idle_before_evict},
                  {"kv_block_reuse_gap", &m.block_reuse_gap}};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            snprintf(key, sizeof key, "%s_p50_s", hs[i].name);
            cJSON_AddNumberToObject(o, key, kvp_hist_quantile(hs[i].h, 0.5));
            snprintf(key, sizeof key, "%s_p99_s", hs[i].name);
            cJSON_AddNumberToObject(o, key, kvp_hist_quantile(hs[i].h, 0.99));
            snprintf(key, sizeof key, "%s_count", hs[i].name);
            cJSON_AddNumberToObject(o, key, (double)hs[i].h->n);
        }
    }
    cJSON_AddNumberToObject(o, "kv_token_states", m.kv_token_states);
    cJSON_AddNumberToObject(o, "kv_reserved", m.kv_reserved);
    cJSON_AddNumberToObject(o, "kv_internal_frag", m.kv_internal_frag);
    cJSON_AddNumberToObject(o, "kv_external_frag", m.kv_external_frag);
    cJSON_AddNumberToObject(o, "kv_cached", m.kv_cached);
    cJSON_AddNumberToObject(o, "kv_free", m.kv_free);
    cJSON_AddNumberToObject(o, "kv_util_in_use", m.kv_util_in_use);
    cJSON_AddNumberToObject(o, "kv_shared_savings", m.kv_shared_savings);
    cJSON_AddNumberToObject(o, "leaked_blocks", (double)m.leaked_blocks);
    cJSON_AddNumberToObject(o, "wall_s", wall);
    if (json) {
        kvp_json_print(stdout, o);
    } else {
        summary_line("workload", "%s (%lld %s, %lld finished, %lld rejected)", wname, (long long)m.requests,
                     n_samples > 1 ? "sequences" : "requests", (long long)m.finished, (long long)m.rejected);
        if (m.rejected > 0) summary_line("rejected", "%s", why);
        if (n_samples > 1) summary_line("parallel samples", "%d per request", (int)n_samples);
        if (cpu)
            summary_line("model / cpu", "%s on %d thread%s; KV %.3g GB of %s = %lld tokens of %.0f bytes", model,
                         threads, threads > 1 ? "s" : "", mem.kv_bytes / 1e9, kvp_dtype_name(kv_dtype),
                         (long long)m.kv_capacity_slots, mem.kv_bytes_per_token);
        else
            summary_line("model / gpu", "%s on %d x %s; KV %.2f GB = %lld tokens of %.0f bytes", model, (int)hw.tp,
                         gpu->name, mem.kv_bytes / 1e9, (long long)m.kv_capacity_slots, mem.kv_bytes_per_token);
        if (!cpu && hw.tp > 1)
            summary_line("communication", "%.1f %% of step time in all-reduces (%.3f s of %.3f s)", 100 * comm_share,
                         ss.comm_s, ss.total_s);
        char alloc[64];
        if (ec.alloc == KVP_ALLOC_PAGED) snprintf(alloc, sizeof alloc, "paged, block %d", (int)ec.block_size);
        else snprintf(alloc, sizeof alloc, "%s in a %s arena", kvp_alloc_kind_name(ec.alloc), kvp_contig_placement_name(ec.arena));
        char swap[64] = "";
        if (swap_tokens > 0) snprintf(swap, sizeof swap, " (host pool %lld tokens)", (long long)swap_tokens);
        summary_line("memory manager", "%s, cache %s, sched %s, preempt %s%s", alloc, kvp_pc_kind_name(ec.cache),
                     kvp_sched_policy_name(ec.sched), kvp_preempt_mode_name(ec.preempt), swap);
        summary_line(cpu ? "time" : "simulated time", "%.2f s in %lld steps%s (wall %.2f s)", m.sim_duration_s,
                     (long long)m.steps, cpu ? ", each step's time measured" : "", wall);
        /* a request's samples have its lengths: they finish or are rejected together */
        char req_rate[48] = "";
        if (n_samples > 1) snprintf(req_rate, sizeof req_rate, " (%.3f requests/s)", m.req_per_s / n_samples);
        summary_line("throughput", "%.1f output tok/s, %.1f total tok/s, %.3f %s/s%s", m.throughput_tok_s,
                     m.total_tok_s, m.req_per_s, n_samples > 1 ? "sequences" : "req", req_rate);
        summary_line("TTFT p50 / p99", "%.4f / %.4f s%s", m.ttft_p50_s, m.ttft_p99_s,
                     n_samples > 1 ? " (sequences)" : "");
        if (n_samples > 1) {
            char label[32];
            snprintf(label, sizeof label, "requests of %d", (int)n_samples);
            summary_line(label, "TTFT p50 / p99 %.4f / %.4f s (first sample), E2E p50 / p99 %.4f / %.4f s (last)",
                         gl.ttft_p50, gl.ttft_p99, gl.e2e_p50, gl.e2e_p99);
        }
        summary_line("TPOT p50 / p99", "%.5f / %.5f s", m.tpot_p50_s, m.tpot_p99_s);
        summary_line("normalized latency", "%.5f s/token (mean of end-to-end latency / output tokens)",
                     m.norm_latency_s);
        summary_line("running", "mean %.2f, max %lld; preemptions %lld (swap-outs %lld; %lld tokens found cached on "
                     "readmission)", m.mean_running, (long long)m.max_running, (long long)m.preemptions,
                     (long long)m.swap_outs, (long long)m.readmit_hit_tokens);
        summary_line("prefix hit rate", "%.2f %%", m.prefix_hit_rate * 100);
        if (ec.cache != KVP_PC_NONE) {
            char misses[512];
            size_t off = 0;
            for (int c = 0; c < KVP_MISS_CLASSES && off < sizeof misses; c++)
                off += (size_t)snprintf(misses + off, sizeof misses - off, "%s%s %lld", c ? ", " : "",
                                      kvp_miss_class_name((kvp_miss_class)c), (long long)m.miss_tokens[c]);
            summary_line("prompt misses", "%s tokens", misses);
        }
        if (ec.host_cache_slots > 0)
            summary_line("host tier", "%lld tokens, %s: %.2f %% of prompt tokens loaded from it; %lld blocks loaded, "
                         "%lld stored", (long long)ec.host_cache_slots, kvp_hc_write_policy_name(ec.host_write_policy),
                         m.prefix_host_hit_rate * 100, (long long)m.host_loaded_blocks, (long long)m.host_stored_blocks);
        summary_line("KV memory", "time-averaged share: tokens %.1f %%, reserved %.1f %%, internal frag %.1f %%, "
                     "external frag %.1f %%, cached %.1f %%, free %.1f %%; tokens / memory in use %.1f %%",
                     m.kv_token_states * 100, m.kv_reserved * 100, m.kv_internal_frag * 100, m.kv_external_frag * 100,
                     m.kv_cached * 100, m.kv_free * 100, m.kv_util_in_use * 100);
        if (m.kv_shared_savings > 0)
            summary_line("sharing saved", "%.3g %% of the KV capacity (time-averaged slots not stored twice)",
                         m.kv_shared_savings * 100);
    }
    cJSON_Delete(o);
    return KVP_EXIT_OK;
}

/* With --executor cpu --tp N this process is one of N MPI ranks: a rank that fails ends the whole job. */
int kvp_cmd_simulate(int argc, char **argv)
{
    kvp_comm *comm = NULL;
    int rc = simulate(argc, argv, &comm);
    if (comm && rc != KVP_EXIT_OK) kvp_comm_abort(comm, rc);
    kvp_comm_destroy(comm);
    return rc;
}
