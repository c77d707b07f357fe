/* `kvpage serve`: the command line of the OpenAI-compatible server (runtime/server/server.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/parse.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/engine_opts.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/server/server.h"
#include "runtime/text/chat.h"

static const char *const CMD = "serve";

/* A timeout: seconds in (0, 86400]. */
static kvp_status parse_seconds(const char *s, double *out)
{
    char *end;
    const double v = strtod(s, &end);
    if (end == s || *end || !(v > 0 && v <= 86400))
        return KVP_ERR(KVP_EINVAL, "'%s' is not a number of seconds in (0, 86400]", s);
    *out = v;
    return KVP_OK;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage serve --model PATH [options]\n\n"
            "Serves a Llama-family model (as `kvpage generate` runs it) over HTTP with OpenAI's completions API.\n"
            "Requests from every connection share the engine's batches (continuous batching); the prefix cache\n"
            "is shared across requests.\n\n"
            "  POST /v1/completions  {\"prompt\": TEXT | [TOKEN_ID, ...] | an array of either, \"max_tokens\": 16,\n"
            "                        \"temperature\": 1, \"top_p\": 1, \"top_k\": -1, \"min_p\": 0, \"n\": 1,\n"
            "                        \"seed\": N, \"stop\": TEXT | [TEXT, ...], \"stream\": false, \"logprobs\": K,\n"
            "                        \"echo\": false, ...}\n"
            "                        stream: server-sent events, as OpenAI's (stream_options: include_usage, vLLM's\n"
            "                        continuous_usage_stats); logprobs: each token's log-probability and the K\n"
            "                        (0..20) likeliest tokens; echo: the prompt's text first, with\n"
            "                        logprobs its tokens' too; also presence_penalty, frequency_penalty, logit_bias\n"
            "                        and vLLM's repetition_penalty, min_tokens, stop_token_ids, ignore_eos,\n"
            "                        include_stop_str_in_output, return_token_ids (prompt_token_ids and\n"
            "                        token_ids in each choice; streamed, the ids since the last event), priority\n"
            "                        (with --sched priority: lower first)\n"
            "  POST /v1/chat/completions  {\"messages\": [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": TEXT},\n"
            "                        ...], the fields above but prompt and echo; \"logprobs\": true, \"top_logprobs\": K}\n"
            "                        through the model's chat template, or --chat-template; max_tokens\n"
            "                        (default: to the end of the context, or of the KV cache if smaller)\n"
            "  GET  /v1/models       the served model\n"
            "  POST /tokenize        vLLM's: {\"prompt\": TEXT, \"add_special_tokens\": true} or {\"messages\": [...]}\n"
            "                        -> {\"count\", \"max_model_len\", \"tokens\"}\n"
            "  POST /detokenize      vLLM's: {\"tokens\": [TOKEN_ID, ...]} -> {\"prompt\": TEXT}\n"
            "  POST /reset_prefix_cache  vLLM's (SGLang's /flush_cache too): empties the prefix cache, before\n"
            "                        the requests that come after it -> {\"evicted_blocks\"}\n"
            "  GET  /health          200 while serving\n"
            "  GET  /metrics         Prometheus counters and gauges (requests, tokens, KV blocks, prefix hits)\n"
            "                        and latency histograms (time to first token, per output token, end to end)\n\n"
            "  --model PATH              a GGUF file or a Hugging Face folder\n"
            "  --tokenizer PATH          as for generate\n"
            "  --host ADDR               IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N                  TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --served-model-name NAME  the model's name in the API (default: the file or folder's name)\n"
            "  --chat-template NAME      llama2, mistral, zephyr, llama3, llama3.1, llama3.2, chatml, qwen2,\n"
            "                            qwen2.5, smollm2, mistral-v3, mistral-v3-tekken, mistral-v7,\n"
            "                            mistral-small-3, qwen3-thinking, deepseek-r1, gemma or gemma3\n"
            "                            (default: the one the model's own template is (GGUF\n"
            "                            tokenizer.chat_template, HF tokenizer_config.json); without one, chat\n"
            "                            requests get 400)\n"
            "  --reasoning-parser NAME   deepseek_r1 (vLLM's): a chat answer's text up to the first </think> (a\n"
            "                            leading <think> left out) is its message's reasoning_content, the rest its\n"
            "                            content (null while no </think> came); streamed as such deltas. For\n"
            "                            DeepSeek-R1 distills and Qwen3-Thinking-2507, whose prompts open the thought\n"
            "  --kv-mem BYTES            KV cache size (default 512MiB), or --num-blocks N (cpu executor; with\n"
            "                            --device cuda the device's memory split sizes it)\n"
            "  --num-blocks N            KV blocks (overrides --kv-mem; with --device cuda at most the split's)\n"
            "  --kv-dtype T              auto (default: the model's dtype, as for generate), f32, f16, bf16\n"
            "                            or fp8\n"
            "  --max-model-len N         prompt + generated tokens at most (vLLM's; default: the model's\n"
            "                            context, at most that); longer prompts get 400\n"
            "  --generation-config auto|vllm  auto (default): what a request leaves out of temperature, top_p,\n"
            "                            top_k, min_p, repetition_penalty and max_tokens is taken from the\n"
            "                            model's generation_config.json (max_new_tokens) or GGUF\n"
            "                            general.sampling.* keys, as vLLM's; vllm:\n"
            "                            from vLLM's defaults (1, 1, -1, 0, 1, 16) whatever the model says\n"
            "  --threads N               CPU threads (default 1)\n"
            "  --matmul invariant|blas   as for generate (default invariant)\n"
            "  --weight-dtype T          as for generate: auto (default), f32, f16, bf16 or q8_0\n"
            "  --max-connections N       open connections at most (default 4096): one more closes the idle one\n"
            "                            waiting longest, or is answered 503 when every one is busy\n"
            "  --idle-timeout S          a connection on which no byte moves for S seconds while a request is read\n"
            "                            or between requests is closed (default 5, uvicorn's keep-alive)\n"
            "  --header-timeout S        a request's head and body must arrive within S seconds of the connection's\n"
            "                            opening or its previous answer (default 10). A connection waiting on the\n"
            "                            engine or streaming has neither timeout\n"
            "  --max-request-tokens N    a request's sequences (prompts x n) x max_tokens at most (default 1048576)\n"
            "  --max-response-bytes B    an answer's size at most, estimated from the request (default 128MiB)\n"
            "  --metrics-names vllm|kvpage  /metrics names: vllm:NAME as vLLM's, or kvpage:NAME (default; the\n"
            "                            same names and meanings)\n"
            "  --stream-interval N       a stream's new text is sent every N engine steps (its first at once,\n"
            "                            its last at the end; SGLang's): fewer events and wake-ups, higher\n"
            "                            throughput, burstier tokens (default 1)\n"
            "  --tp N                    tensor parallelism over N ranks (default 1): threads of this process (with\n"
            "                            --device cuda: GPUs 0 .. N-1), or a process a rank under\n"
            "                            `mpirun -np N kvpage serve --tp N ...` (with --device cuda: one GPU per rank,\n"
            "                            its index on its node); NCCL between GPUs; rank 0 serves HTTP and schedules,\n"
            "                            every rank holds 1/N of the heads and of the KV cache (--kv-mem is per rank)\n"
            "  --json                    print the listening address, the model, the KV blocks, the chat template,\n"
            "                            the held weight type, the device (with --device cuda: \"cuda\", the memory\n"
            "                            split) and the pid (with --tp: rank 0's, the one to signal) as one JSON\n"
            "                            object on stdout\n"
            "  -h, --help                this help\n\n"
            "Stops on SIGINT or SIGTERM: requests in flight get 503, then the process exits 0.\n\n");
    kvp_session_config d = kvp_session_config_default();
    kvp_engine_opts_usage(f, &d.engine);
    kvp_device_opts_usage(f);
    fprintf(f, "  With --device cuda the engine's session runs on the cuda executor (docs/cuda-executor.md); a\n"
               "  build or machine without a device fails at start-up (exit 2), before listening.\n");
}

int kvp_cmd_serve(int argc, char **argv)
{
    enum { O_TOK = 256, O_HOST, O_PORT, O_NAME, O_KVMEM, O_NB, O_DT, O_THREADS, O_MATMUL, O_CONNS, O_TP, O_JSON, O_CHAT,
           O_WDTYPE, O_REASON, O_STREAMIV,
           O_MAXLEN, O_GENCFG, O_IDLE, O_HEADER, O_MAXREQ, O_MAXRESP, O_MNAMES };
    static const struct option own[] = {
        {"model", required_argument, 0, 'm'},        {"tokenizer", required_argument, 0, O_TOK},
        {"host", required_argument, 0, O_HOST},      {"port", required_argument, 0, O_PORT},
        {"served-model-name", required_argument, 0, O_NAME}, {"kv-mem", required_argument, 0, O_KVMEM},
        {"num-blocks", required_argument, 0, O_NB},  {"kv-dtype", required_argument, 0, O_DT},    {"weight-dtype", required_argument, 0, O_WDTYPE},
        {"max-model-len", required_argument, 0, O_MAXLEN}, {"generation-config", required_argument, 0, O_GENCFG},
        {"threads", required_argument, 0, O_THREADS}, {"matmul", required_argument, 0, O_MATMUL},
        {"max-connections", required_argument, 0, O_CONNS}, {"tp", required_argument, 0, O_TP},
        {"stream-interval", required_argument, 0, O_STREAMIV}, {"json", no_argument, 0, O_JSON},            {"help", no_argument, 0, 'h'},
        {"chat-template", required_argument, 0, O_CHAT}, {"reasoning-parser", required_argument, 0, O_REASON},
        {"idle-timeout", required_argument, 0, O_IDLE}, {"header-timeout", required_argument, 0, O_HEADER},
        {"max-request-tokens", required_argument, 0, O_MAXREQ}, {"max-response-bytes", required_argument, 0, O_MAXRESP},
        {"metrics-names", required_argument, 0, O_MNAMES}};
    struct option opts[sizeof own / sizeof own[0] + KVP_EO_END - KVP_EO_BLOCK + KVP_DO_END - KVP_DO_DEVICE + 1];
    kvp_device_opts_append(opts, kvp_engine_opts_table(own, (int)(sizeof own / sizeof own[0]), opts,
                                                       (int)(sizeof opts / sizeof opts[0])),
                           (int)(sizeof opts / sizeof opts[0]));
    kvp_server_opts o;
    kvp_server_opts_default(&o);
    kvp_session_config cfg = kvp_session_config_default();
    cfg.engine.skip_logprob = 1; /* no answer carries a sample's cumulative log-probability ("logprobs" are their own) */
    int c, li = -1;
    kvp_status st = KVP_OK;
    optind = 0;
    kvp_engine_opts eo;
    kvp_engine_opts_init(&eo, &cfg.engine);
    kvp_device_opts dev; /* --device cuda and its options */
    kvp_device_opts_init(&dev);
    int kv_mem_given = 0;
    while ((c = getopt_long(argc, argv, ":m:h", opts, &li)) != -1) {
        if (kvp_engine_opt(&eo, c, optarg, &st) || kvp_device_opt(&dev, c, optarg, &st)) {
            if (st != KVP_OK) return kvp_cli_usage_error(CMD, "--%s: %s", opts[li].name, kvp_error_message());
            li = -1;
            continue;
        }
        switch (c) {
        case 'm': o.model = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_HOST: o.host = optarg; break;
        case O_PORT: st = kvp_parse_i32(optarg, 0, 65535, &o.port); break;
        case O_NAME: o.name = optarg; break;
        case O_CHAT: {
            kvp_chat_template t;
            st = kvp_chat_template_parse(optarg, &t);
            o.chat_template = optarg;
            break;
        }
        case O_KVMEM: st = kvp_parse_bytes(optarg, &o.kv_mem), kv_mem_given = 1; break;
        case O_NB: st = kvp_parse_i32(optarg, 1, INT32_MAX / 2, &cfg.num_blocks); break;
        case O_DT: st = kvp_kv_dtype_parse(optarg, &cfg.kv_dtype, &o.kv_auto); break;
        case O_WDTYPE: st = kvp_weight_type_parse(optarg, &o.weight_dtype); break;
        case O_MAXLEN: st = kvp_parse_i32(optarg, 2, INT32_MAX, &o.max_model_len); break;
        case O_GENCFG:
            if (!strcmp(optarg, "auto") || !strcmp(optarg, "vllm")) o.generation_config = !strcmp(optarg, "auto");
            else st = KVP_ERR(KVP_EINVAL, "--generation-config: '%s' is neither auto nor vllm", optarg);
            break;
        case O_THREADS: st = kvp_parse_i32(optarg, 1, 1024, &o.threads); break;
        case O_MATMUL: st = kvp_matmul_kind_parse(optarg, &o.matmul); break;
        case O_CONNS: st = kvp_parse_i32(optarg, 1, 1 << 20, &o.max_conns); break;
        case O_STREAMIV: st = kvp_parse_i32(optarg, 1, 1 << 20, &o.stream_interval); break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 1024, &o.tp); break;
        case O_IDLE: st = parse_seconds(optarg, &o.idle_timeout_s); break;
        case O_HEADER: st = parse_seconds(optarg, &o.header_timeout_s); break;
        case O_MAXREQ: st = kvp_parse_i64(optarg, 1, INT64_MAX / 2, &o.max_request_tokens); break;
        case O_MAXRESP: st = kvp_parse_bytes(optarg, &o.max_response_bytes); break;
        case O_MNAMES:
            if (!strcmp(optarg, "vllm") || !strcmp(optarg, "kvpage")) o.metrics_vllm = !strcmp(optarg, "vllm");
            else st = KVP_ERR(KVP_EINVAL, "'%s' is neither vllm nor kvpage", optarg);
            break;
        case O_JSON: o.json = 1; break;
        case O_REASON:
            o.reasoning = strcmp(optarg, "deepseek_r1") == 0;
            if (!o.reasoning) st = KVP_ERR(KVP_EINVAL, "unknown reasoning parser '%s' (deepseek_r1)", optarg);
            break;
        case 'h': usage(stdout); return KVP_EXIT_OK;
        default: return kvp_cli_getopt_error(CMD, c, argv);
        }
        if (st != KVP_OK)
            return kvp_cli_usage_error(CMD, "--%s: %s", li >= 0 ? opts[li].name : "model", kvp_error_message());
        li = -1;
    }
    if (optind < argc) return kvp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!o.model) return kvp_cli_usage_error(CMD, "--model is required");
    if ((st = kvp_engine_opts_check(&eo)) != KVP_OK || (st = kvp_device_opts_check(&dev)) != KVP_OK)
        return kvp_cli_usage_error(CMD, "%s", kvp_error_message());
    if (dev.cuda && o.tp > 1 && dev.cu.device != 0)
        return kvp_cli_usage_error(CMD, "--device cuda:%d with --tp %d: each rank takes the GPU of its index on its "
                                        "node (choose them with CUDA_VISIBLE_DEVICES)", dev.cu.device, o.tp);
    if (dev.cuda && kv_mem_given)
        return kvp_cli_usage_error(CMD, "--kv-mem sizes the cpu executor's cache: with --device cuda the memory split "
                                        "does (--gpu-memory-utilization, --kv-cache-memory BYTES or --num-blocks N)");
    o.cuda = dev.cuda;
    o.cu = dev.cu;
    o.offload_bytes = eo.offload_bytes;
    o.swap_bytes = eo.swap_bytes;
    if (o.name && (!o.name[0] || strlen(o.name) >= 256))
        return kvp_cli_usage_error(CMD, "--served-model-name must have 1 to 255 characters");
    return kvp_server_run(&o, cfg);
}
