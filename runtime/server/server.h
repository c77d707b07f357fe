/* runtime/server/server.h — `kvpage serve`: an OpenAI-compatible HTTP server over the engine's online session
 * (runtime/engine/session.h), with vLLM's extras (tokenize, detokenize, reset_prefix_cache, Prometheus
 * /metrics). The command line (runtime/cli/serve_cmd.c) fills kvp_server_opts and a session config; this
 * layer never reads argv.
 *
 *   HTTP thread (libmicrohttpd, event-driven)              engine thread (owns the session)
 *   -----------------------------------------------        -----------------------------------------
 *   parse JSON, tokenize, queue a job, suspend the   --->  add the queued jobs' prompts to the session
 *   connection                                             step (one batch of every running sequence)
 *   (resumed) decode, answer or send the new text    <---  hand each finished request (or a stream's new
 *                                                          text) to its job, resume its connection
 *
 * Requests from different connections share batches (continuous batching). Files: http.c (connections,
 * routing, bodies, the daemon's life), openai.c (requests and answers of the OpenAI protocol), stream.c
 * (server-sent events), metrics.c (Prometheus text), engine_loop.c (the engine thread, the ranks).
 */
#ifndef KVP_RUNTIME_SERVER_SERVER_H
#define KVP_RUNTIME_SERVER_SERVER_H

#include <stdint.h>

#include "runtime/engine/session.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/model/model.h"

typedef struct {
    const char *model, *tokenizer;  /* a GGUF file or a Hugging Face folder; the tokenizer (NULL: the model's) */
    const char *host;               /* IPv4 address to listen on */
    const char *name;               /* the model's name in the API (NULL: the file or folder's name) */
    const char *chat_template;      /* a built-in template's name (NULL: the model's own) */
    int32_t port;                   /* 0: any free port */
    int32_t threads, tp, max_model_len; /* max_model_len 0: the model's context */
    int32_t max_conns;              /* open connections at most */
    int64_t kv_mem;                 /* KV cache bytes per rank (when the session config has no num_blocks) */
    int64_t offload_bytes, swap_bytes; /* host tier, swap space (-1: as much as the KV cache) */
    int json;                       /* print the start line as JSON on stdout */
    kvp_matmul_kind matmul;
    kvp_weight_type weight_dtype;
    int kv_auto;                    /* --kv-dtype auto: the model's dtype */
    int reasoning;                  /* --reasoning-parser deepseek_r1 */
    int32_t stream_interval;        /* a stream's text every N engine steps */
    int generation_config;          /* 1: the model's sampling defaults; 0: vLLM's */
    int metrics_vllm;               /* /metrics names: 1 "vllm:...", 0 "kvpage:..." (the same names otherwise) */
    /* --device cuda[:N]: the engine's session runs on the cuda executor (runtime/executor/cuda_executor.h),
     * its KV blocks from the device's memory split (kv_mem does not apply); 0: the cpu executor */
    int cuda;
    kvp_cuda_options cu;            /* the device, --gpu-memory-utilization, --kv-cache-memory, --enforce-eager */
    /* Connections (http.c). A connection waiting on the engine or streaming is exempt from both timeouts. */
    double idle_timeout_s;          /* no byte moved for this long while reading a request or between two: closed */
    double header_timeout_s;        /* a request's head and body must arrive within this of its connection's
                                       opening or of the previous answer */
    /* Ceilings per request (openai.c): a request above one gets 400 naming it. */
    int64_t max_request_tokens;     /* sequences (prompts x n) x max_tokens */
    int64_t max_response_bytes;     /* the answer's size, estimated before running and checked when built */
} kvp_server_opts;

/* vLLM's and this server's defaults: 127.0.0.1:8000, 1 thread, 512 MiB of KV cache, 4096 connections, ... */
void kvp_server_opts_default(kvp_server_opts *o);

/* Loads the model on every rank (tp > 1: under mpirun) and serves it until SIGINT or SIGTERM; rank 0 serves
 * HTTP and schedules, the others follow its steps. With o->cuda the session is a cuda executor's (tp > 1: one
 * GPU per rank, NCCL over the MPI world, the followers run kvp_cuda_follow): a build or machine without a
 * device fails here, before listening and before any rank waits for another, with KVP_ENODEVICE's message
 * and exit 2.
 * Errors are printed ("kvpage serve: error: ..."). Returns the process exit code (common/cli.h). */
int kvp_server_run(const kvp_server_opts *o, kvp_session_config cfg);

#endif
