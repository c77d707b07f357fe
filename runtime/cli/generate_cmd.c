/* `kvpage generate` — run a real model on the CPU executor (or, with --device cuda, the cuda executor): prompts -> tokens -> continuous batching over the
 * paged KV cache (runtime/engine/session.h) -> text. Text to stdout (or one JSON object with --json); logs to stderr. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/cli.h"
#include "common/json.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/timer.h"
#include "runtime/text/chat.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/engine_opts.h"
#include "runtime/executor/cpu_executor.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/executor/tp_threads.h"
#include "runtime/model/model.h"
#include "runtime/text/stop_text.h"
#include "runtime/text/tokenizer.h"

static const char *const CMD = "generate";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage generate --model PATH (--prompt TEXT ... | --prompts-file FILE) [options]\n\n"
            "Runs a Llama-family model (llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3; mixtral and\n"
            "qwen3_moe experts) on the CPU through the paged KV cache: all prompts run concurrently (continuous\n"
            "batching), sharing prefixes through the prefix cache.\n"
            "Text goes to stdout: streamed as it comes for one prompt with one sample, else at the end.\n\n"
            "  --model PATH            a GGUF file (F32/F16/BF16, or quantized Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K..Q6_K:\n"
            "                          converted to f32 at load) or a Hugging Face folder (config.json +\n"
            "                          safetensors, F32/F16/BF16)\n"
            "  --tokenizer PATH        a Hugging Face tokenizer.json, a GGUF holding a tokenizer, or a llama2.c\n"
            "                          tokenizer.bin (default: the GGUF's own; for an HF folder: its tokenizer.json,\n"
            "                          else tokenizer.bin or tok*.bin in the folder or in ../llama2c beside it)\n"
            "  --prompt TEXT           a prompt (repeatable); BOS is prepended when the model's tokenizer adds it;\n"
            "                          control tokens written in it (<s>, <|im_start|>) are those tokens\n"
            "  --prompts-file FILE     one prompt a line (empty lines are empty prompts); -: standard input; a\n"
            "                          .jsonl file: one {\"prompt\": TEXT, \"max_tokens\": N} a line (max_tokens\n"
            "                          optional, default --max-tokens)\n"
            "  --max-tokens N          tokens generated after each prompt (default 64)\n"
            "  --temperature F         0 = greedy (default 0)\n"
            "  --top-k N               keep the N most likely tokens (default 0 = all)\n"
            "  --top-p F               nucleus sampling mass (default 1)\n"
            "  --min-p F               [0, 1]: leave out the tokens less likely than F x the likeliest, after\n"
            "                          the temperature and before top-k and top-p (vLLM's min_p; default 0)\n"
            "  --seed N                sampling seed (default 0); prompt i uses seed + i\n"
            "  --presence-penalty F    [-2, 2], subtracted once from the logit of each token already generated\n"
            "  --frequency-penalty F   [-2, 2], subtracted as many times as the token was generated\n"
            "  --repetition-penalty F  (0, 10]: logits of the prompt's and generated tokens divided by F (times F\n"
            "                          when negative), as vLLM's (default 1: none)\n"
            "  --n N                   samples per prompt, forked from the prompt's blocks (default 1)\n"
            "  --beam-width W          beam search with W beams (default 0 = off); returns the --n best\n"
            "  --ignore-eos            keep generating after EOS\n"
            "  --chat                  each prompt is a user message, through the model's chat template (GGUF\n"
            "                          tokenizer.chat_template, HF tokenizer_config.json); a reply ends at the\n"
            "                          template's end of turn\n"
            "  --chat-template NAME    --chat with a built-in template: llama2, mistral, zephyr, llama3, llama3.1,\n"
            "                          llama3.2, chatml, qwen2, qwen2.5, smollm2, mistral-v3, mistral-v3-tekken,\n"
            "                          mistral-v7, mistral-small-3, qwen3-thinking, deepseek-r1, gemma, gemma3\n"
            "  --system TEXT           with --chat: a system message before each prompt\n"
            "  --stop TEXT             a stop string (repeatable, up to 16): a sample's text ends where the first\n"
            "                          one starts, and its generation ends there (not with --beam-width)\n"
            "  --min-tokens N          no EOS before N tokens (vLLM's min_tokens; at most --max-tokens)\n"
            "  --num-blocks N          KV blocks (default 0 = enough for every request at once)\n"
            "  --kv-dtype T            KV cache element type: auto (default: the model's dtype: f32 for f32\n"
            "                          weights, bf16 for bf16, else f16; vLLM's auto runs an f32 checkpoint in\n"
            "                          f16, here --kv-dtype f16 --weight-dtype f16), f32, f16, bf16 or fp8 (e4m3,\n"
            "                          scale 1); f16/bf16 halve an f32 cache, fp8 quarters it (new K/V rows are\n"
            "                          rounded); fp32 and fp16 are aliases of f32 and f16 (plan's spelling)\n"
            "  --max-model-len N       prompt + generated tokens at most (vLLM's; default: the model's context, at\n"
            "                          most that)\n"
            "  --threads N             CPU threads (default 1)\n"
            "  --tp N                  tensor parallelism over N ranks (default 1): threads of this process (with\n"
            "                          --device cuda: GPUs 0 .. N-1, NCCL between them), or under\n"
            "                          `mpirun -np N kvpage generate --tp N ...` a process a rank (with --device cuda:\n"
            "                          one GPU per rank, its index on its node); each rank holds 1/N of the heads,\n"
            "                          of the MLP and of the vocabulary, and 1/N of the KV cache; rank 0 prints\n"
            "  --matmul invariant|blas invariant: batch-invariant kernels, the same greedy tokens in any batch\n"
            "                          (default); blas: OpenBLAS sgemm and tiled prefill attention\n"
            "  --weight-dtype T        weight matrices held as f32, f16 or bf16 (half the memory and the bytes each\n"
            "                          decode step reads) or q8_0 (ggml's Q8_0: about a quarter), rounded at load;\n"
            "                          auto (default): as the file stores each one (F32, F16, BF16, Q8_0), GGUF's\n"
            "                          other quantized types as q8_0; blas makes an f32 copy; fp32 and fp16 also\n"
            "  --json                  one JSON object: per-prompt results and totals\n"
            "  --logprobs K            with --json: each generated token's log-probability and the K (0..20) likeliest\n"
            "                          tokens at its place ([id, logprob] pairs), per sample (not with --beam-width)\n"
            "  --prompt-logprobs       with --logprobs: the same for each prompt token (the prompt is then computed\n"
            "                          whole, without prefix-cache hits)\n"
            "  -h, --help              this help\n\n");
    const kvp_session_config d = kvp_session_config_default();
    kvp_engine_opts_usage(f, &d.engine);
    kvp_device_opts_usage(f);
}

typedef struct {
    char **items;
    int32_t n;
    size_t cap;
} strlist;

static kvp_status strlist_add(strlist *l, const char *s, size_t len)
{
    KVP_TRY(kvp_grow((void **)&l->items, &l->cap, (size_t)l->n + 1, sizeof *l->items));
    char *d = kvp_malloc(len + 1);
    if (!d) return KVP_ERR(KVP_ENOMEM, "out of memory");
    memcpy(d, s, len);
    d[len] = '\0';
    l->items[l->n++] = d;
    return KVP_OK;
}

static void strlist_free(strlist *l)
{
    for (int32_t i = 0; i < l->n; i++) kvp_free(l->items[i]);
    kvp_free(l->items);
}

static int is_jsonl(const char *path)
{
    const size_t n = strlen(path);
    return n > 6 && strcmp(path + n - 6, ".jsonl") == 0;
}

/* Line `line` of a .jsonl prompts file: {"prompt": TEXT} and optionally "max_tokens": N (0 .. 2^24, as
 * --max-tokens); anything else is an error naming the line. */
static kvp_status jsonl_prompt(const char *path, int64_t line, const char *text, size_t len, strlist *out,
                               int32_t *max_tokens)
{
    char what[512];
    snprintf(what, sizeof what, "%s:%lld", path, (long long)line);
    cJSON *o;
    KVP_TRY(kvp_json_parse(text, len, what, &o));
    const char *prompt = NULL;
    int has_prompt = 0, has_max = 0;
    int64_t m = -1;
    kvp_status st = cJSON_IsObject(o) ? KVP_OK : KVP_ERR(KVP_EINVAL, "%s: a line is a JSON object", what);
    for (const cJSON *k = o->child; st == KVP_OK && k; k = k->next)
        if (strcmp(k->string, "prompt") != 0 && strcmp(k->string, "max_tokens") != 0)
            st = KVP_ERR(KVP_EINVAL, "%s: unknown key '%s' (a line takes \"prompt\" and \"max_tokens\")", what, k->string);
    if (st == KVP_OK && (kvp_json_str(o, "prompt", &prompt, &has_prompt) != KVP_OK ||
                         kvp_json_int(o, "max_tokens", &m, &has_max) != KVP_OK)) { /* a type: name the line */
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kvp_error_message());
        st = KVP_ERR(KVP_EINVAL, "%s: %s", what, msg);
    }
    if (st == KVP_OK && !has_prompt) st = KVP_ERR(KVP_EINVAL, "%s: no \"prompt\"", what);
    if (st == KVP_OK && has_max && (m < 0 || m > (1 << 24)))
        st = KVP_ERR(KVP_EINVAL, "%s: max_tokens %lld is out of [0, %d]", what, (long long)m, 1 << 24);
    if (st == KVP_OK) st = strlist_add(out, prompt, strlen(prompt));
    *max_tokens = has_max ? (int32_t)m : -1;
    cJSON_Delete(o);
    return st;
}

/* Appends the prompts of `path` to out: one a line, or (a .jsonl file) one JSON object a line, whose
 * max_tokens go to *max_out (out->n entries, -1: --max-tokens; NULL for a plain file). */
static kvp_status read_prompts(const char *path, strlist *out, int32_t **max_out)
{
    char *data;
    size_t len;
    KVP_TRY(kvp_read_file(path, (size_t)1 << 30, &data, &len));
    kvp_status st = KVP_OK;
    const char *nul = memchr(data, '\0', len);
    if (nul) {
        int64_t line = 1;
        for (const char *c = data; c < nul; c++) line += *c == '\n';
        kvp_free(data);
        return KVP_ERR(KVP_EINVAL, "%s:%lld: a NUL byte in a prompt", path, (long long)line);
    }
    const int jsonl = is_jsonl(path);
    const int32_t first = out->n; /* prompts given before (--prompt) */
    int32_t *max = NULL;
    size_t cap = 0;
    size_t start = 0;
    int64_t line = 1;
    for (size_t i = 0; i <= len && st == KVP_OK; i++) {
        if (i == len || data[i] == '\n') {
            size_t e = i;
            if (e > start && data[e - 1] == '\r') e--;
            if (jsonl && e > start) {
                int32_t m;
                st = jsonl_prompt(path, line, data + start, e - start, out, &m);
                if (st == KVP_OK) st = kvp_grow((void **)&max, &cap, (size_t)out->n, sizeof *max);
                if (st == KVP_OK) max[out->n - 1] = m;
            } else if (!jsonl && !(i == len && e == start)) {
                st = strlist_add(out, data + start, e - start);
            }
            start = i + 1;
            line++;
        }
    }
    kvp_free(data);
    if (st == KVP_OK && out->n == 0)
        st = KVP_ERR(KVP_EINVAL, "%s: no prompt in it", strcmp(path, "-") == 0 ? "standard input" : path);
    if (st == KVP_OK && max != NULL) { /* a .jsonl file with a line in it */
        for (int32_t i = 0; i < first; i++) max[i] = -1; /* the --prompt ones */
        *max_out = max;
    } else {
        kvp_free(max);
    }
    return st;
}

typedef struct {
    const char *model, *tokenizer, *prompts_file;
    strlist prompts;
    int32_t *prompt_max; /* per prompt max_tokens from a .jsonl prompts file (-1: --max-tokens), or NULL */
    int32_t max_tokens, min_tokens, top_k, n, beam, num_blocks, threads, tp;
    int32_t max_model_len; /* 0: the model's context */
    double temperature, top_p, min_p;
    float presence, frequency, repetition;
    int64_t seed;
    kvp_matmul_kind matmul;
    kvp_weight_type weight_dtype;
    kvp_dtype kv_dtype; /* resolved after the model loads when kv_auto */
    int kv_auto;
    int json, ignore_eos;
    int32_t logprobs; /* -1: none */
    strlist stops;
    int prompt_logprobs;
    int chat;                   /* each prompt is a user message through the chat template */
    const char *chat_template;  /* NULL: the model's own */
    const char *system;         /* a system message before each prompt, or NULL */
    kvp_session_config cfg;     /* the session's defaults, with the engine options (engine_opts.h) */
    kvp_engine_opts eo;
    kvp_device_opts dev; /* --device cuda and its options */
} gen_opts;

static cJSON *ids_json(const int32_t *ids, int32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* Log-probabilities as JSON arrays: token_logprobs (null where there is none) and top_logprobs ([id, logprob]
 * pairs, likeliest first, null where there is none) into obj, under prefix + those names. */
static void logprobs_json(cJSON *obj, const char *prefix, const kvp_logprobs *a)
{
    char key[64];
    snprintf(key, sizeof key, "%stoken_logprobs", prefix);
    cJSON *lps = cJSON_AddArrayToObject(obj, key);
    snprintf(key, sizeof key, "%stop_logprobs", prefix);
    cJSON *tops = cJSON_AddArrayToObject(obj, key);
    for (int32_t i = 0; i < a->n; i++) {
        const int none = isnan(a->lp[i]);
        cJSON_AddItemToArray(lps, none ? cJSON_CreateNull() : cJSON_CreateNumber(a->lp[i]));
        cJSON *t = none ? cJSON_CreateNull() : cJSON_CreateArray();
        for (int32_t k = 0; !none && k < a->k; k++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(a->top_ids[i * a->k + k]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(a->top_lps[i * a->k + k]));
            cJSON_AddItemToArray(t, pair);
        }
        cJSON_AddItemToArray(tops, t);
    }
}

/* The samples' texts as their tokens come, one per (prompt, sample): for stop strings, and to stream the text
 * of a single sample to stdout. */
typedef struct {
    const kvp_tokenizer *tok;
    const kvp_session_request *reqs;
    int32_t n, nsamples;
    kvp_stop_set set;
    kvp_stop_text *t; /* [n * nsamples] */
    int stream;       /* one prompt, one sample, plain text: print its text as it comes */
    size_t shown;     /* bytes of it printed */
} stop_track;

/* Prints the streamed sample's text from where it was left up to `upto`. */
static void stream_text(stop_track *x, size_t upto)
{
    if (upto > x->shown) fwrite(x->t[0].text + x->shown, 1, upto - x->shown, stdout);
    x->shown = upto > x->shown ? upto : x->shown;
    fflush(stdout);
}

/* After each step (kvp_gen_run_stepped): each sample's new tokens into its text; a sample whose text reached a
 * stop string ends now. A streamed sample's text is printed as far as no stop string can still cut it. */
static void track_stops(void *ctx, kvp_session *s)
{
    stop_track *x = ctx;
    for (int32_t i = 0; i < x->n; i++)
        for (int32_t k = 0; k < x->nsamples; k++) {
            kvp_stop_text *h = &x->t[i * x->nsamples + k];
            const int32_t *toks;
            int32_t nt;
            if (h->stop || kvp_session_partial(s, i, k, &toks, &nt) != KVP_OK) continue;
            kvp_stop_text_add(h, &x->set, x->tok, x->reqs[i].prompt[x->reqs[i].n_prompt - 1], toks, nt);
            if (h->stop) kvp_session_stop_at(s, i, k, h->ntok); /* a step may add tokens after it */
        }
    if (x->stream) stream_text(x, x->t[0].ready);
}

/* Waits for the in-process ranks (none: rc). A follower's failure becomes the exit code and the one error line
 * when rank 0 succeeded (rank 0's own error names an aborting follower's: comm.h, kvp_comm_abort). */
static int join_followers(kvp_tp_threads *t, int rc)
{
    const kvp_status st = kvp_tp_threads_join(t);
    return st == KVP_OK || rc != KVP_EXIT_OK ? rc : kvp_cli_fail(CMD, st);
}

static int run(gen_opts *o)
{
    kvp_model *m = NULL;
    kvp_comm *comm = NULL;
    kvp_tokenizer *tok = NULL;
    kvp_session_request *reqs = NULL;
    kvp_session_result *res = NULL;
    int32_t **enc = NULL, nres = 0;
    size_t stop_len[16];
    stop_track stops = {.nsamples = o->n};
    int rc = KVP_EXIT_OK;
    kvp_status st;
    double t_load = kvp_now_s();
    /* --tp N: ranks 1 .. N-1 threads of this process, or under mpirun a process a rank (tp_threads.h); with
     * --device cuda rank r's GPU is its communicator's */
    kvp_tp_threads *followers = NULL;
    const kvp_tp_threads_spec spec = {.path = o->model, .weights = o->weight_dtype, .max_len = o->max_model_len,
                                      .threads = o->threads, .matmul = o->matmul, .cuda = o->dev.cuda, .cu = o->dev.cu};
    st = kvp_tp_comm_create(o->tp, &spec, &comm, &followers);
    if (st == KVP_OK && o->dev.cuda && o->tp > 1) o->dev.cu.device = kvp_comm_device(comm);
    if (st == KVP_OK) st = kvp_comm_quiet_other_ranks(comm);
    if (st == KVP_OK) st = kvp_model_load_ex(o->model, comm, o->weight_dtype, &m);
    if (st != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
        if (comm) kvp_comm_abort(comm, rc);
        rc = join_followers(followers, rc);
        kvp_comm_destroy(comm);
        return rc;
    }
    kvp_model_set_threads(m, o->threads);
    kvp_model_set_matmul(m, o->matmul);
    if (o->kv_auto) o->kv_dtype = kvp_model_kv_dtype_auto(m);
    if ((st = kvp_model_set_max_len(m, o->max_model_len)) != KVP_OK ||
        (st = kvp_tok_for_model(m, o->model, o->tokenizer, &tok)) != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
        goto out;
    }
    t_load = kvp_now_s() - t_load;
    const int32_t n = o->prompts.n;
    reqs = kvp_calloc((size_t)n, sizeof *reqs);
    res = kvp_calloc((size_t)n, sizeof *res);
    enc = kvp_calloc((size_t)n, sizeof *enc);
    if (!reqs || !res || !enc) {
        rc = kvp_cli_fail(CMD, KVP_ERR(KVP_ENOMEM, "out of memory"));
        goto out;
    }
    const int32_t maxlen = kvp_model_max_len(m);
    kvp_chat_template tmpl = KVP_CHAT_NONE;
    int32_t eot = -1; /* with --chat: the template's end of turn, a stop token unless it is EOS already */
    if (o->chat) {
        int jinja = 0;
        st = o->chat_template ? kvp_chat_template_parse(o->chat_template, &tmpl)
                              : kvp_chat_template_of_model(o->model, kvp_model_is_gguf(m), &tmpl, &jinja);
        if (st == KVP_OK && tmpl == KVP_CHAT_NONE)
            st = KVP_ERR(KVP_EINVAL, "%s: the model has %s: name one with --chat-template", o->model,
                         jinja ? "a chat template that is none of the built-in ones" : "no chat template");
        if (st != KVP_OK) {
            rc = kvp_cli_fail(CMD, st);
            goto out;
        }
        eot = kvp_chat_end_of_turn(tmpl, tok);
        if (eot >= 0 && kvp_model_is_eos(m, eot)) eot = -1;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t np;
        const kvp_chat_msg msgs[2] = {{"system", o->system}, {"user", o->prompts.items[i]}};
        st = o->chat ? kvp_chat_render_ids(tmpl, tok, msgs + !o->system, 1 + !!o->system, 1, &enc[i], &np)
                     : kvp_tok_encode_ex(tok, o->prompts.items[i], strlen(o->prompts.items[i]),
                                         KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL, &enc[i], &np);
        if (st != KVP_OK) {
            rc = kvp_cli_fail(CMD, st);
            goto out;
        }
        if (np >= maxlen) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EINVAL, "prompt %d is %d tokens long, the model's context is %d tokens",
                                           i + 1, np, maxlen));
            goto out;
        }
        const int32_t max_tokens = o->prompt_max && o->prompt_max[i] >= 0 ? o->prompt_max[i] : o->max_tokens;
        if (o->min_tokens > max_tokens) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_EINVAL, "prompt %d: max_tokens %d is below --min-tokens %d", i + 1,
                                           max_tokens, o->min_tokens));
            goto out;
        }
        reqs[i] = (kvp_session_request){.prompt = enc[i], .n_prompt = np, .max_tokens = max_tokens,
                                    .min_tokens = o->min_tokens, .n = o->n,
                                    .beam_width = o->beam, .logprobs = o->logprobs >= 0,
                                    .prompt_logprobs = o->prompt_logprobs,
                                    .top_logprobs = o->logprobs >= 0 ? o->logprobs : 0,
                                    .sampler = {.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p,
                                                .min_p = o->min_p, .seed = (uint64_t)o->seed + (uint64_t)i,
                                                .presence_penalty = o->presence, .frequency_penalty = o->frequency,
                                                .repetition_penalty = o->repetition}};
        if (eot >= 0 && !o->ignore_eos) {
            reqs[i].stop_ids = &eot;
            reqs[i].n_stop_ids = 1;
        }
    }
    kvp_session_config cfg = o->cfg;
    cfg.num_blocks = o->num_blocks;
    cfg.engine.stop_at_eos = !o->ignore_eos;
    cfg.kv_dtype = o->kv_dtype;
    cfg.engine.skip_logprob = !o->json; /* only --json prints each sample's log-probability */
    if (cfg.engine.preempt == KVP_PREEMPT_SWAP) { /* the swap space: --swap-space, or as much as the cache */
        cfg.swap_blocks = -1;
        if (o->eo.swap_bytes >= 0 &&
            (st = kvp_kv_blocks_in(m, o->kv_dtype, cfg.engine.block_size, o->eo.swap_bytes, "--swap-space",
                                   &cfg.swap_blocks)) != KVP_OK) {
            rc = kvp_cli_fail(CMD, st);
            goto out;
        }
    }
    if (o->eo.offload_bytes > 0 &&
        (st = kvp_kv_blocks_in(m, o->kv_dtype, cfg.engine.block_size, o->eo.offload_bytes, "--kv-offloading-size",
                                &cfg.host_cache_blocks)) != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
        goto out;
    }
    kvp_run_stats stats;
    stops.stream = n == 1 && o->n == 1 && o->beam <= 1 && !o->json;
    if (o->stops.n > 0 || stops.stream) {
        for (int32_t i = 0; i < o->stops.n; i++) {
            stop_len[i] = strlen(o->stops.items[i]);
            stops.set.stop_max = stop_len[i] > stops.set.stop_max ? stop_len[i] : stops.set.stop_max;
        }
        stops.set.stop = o->stops.items;
        stops.set.stop_len = stop_len;
        stops.set.nstop = o->stops.n;
        stops.tok = tok;
        stops.reqs = reqs;
        stops.n = n;
        if (!(stops.t = kvp_calloc((size_t)n * (size_t)o->n, sizeof *stops.t))) {
            rc = kvp_cli_fail(CMD, KVP_ERR(KVP_ENOMEM, "out of memory"));
            goto out;
        }
    }
    if (stops.stream) {
        fputs(o->prompts.items[0], stdout);
        fflush(stdout);
    }
    if (kvp_comm_rank(comm) != 0) { /* rank 0 alone schedules: the others execute its plans */
        st = o->dev.cuda ? kvp_cuda_follow(m, &o->dev.cu, NULL) : kvp_cpu_follow(m, NULL);
        if (st != KVP_OK) rc = kvp_cli_fail(CMD, st);
        goto out;
    }
    kvp_cuda_info cuda_info;
    if (o->dev.cuda) {
        st = kvp_cuda_generate(m, &o->dev.cu, &cfg, reqs, n, res, &stats, stops.t ? track_stops : NULL, &stops,
                               &cuda_info);
        if (st == KVP_OK) kvp_cuda_info_log(&cuda_info);
    } else {
        st = kvp_cpu_generate(m, &cfg, reqs, n, res, &stats, stops.t ? track_stops : NULL, &stops);
    }
    if (st != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
        goto out;
    }
    nres = n;
    cJSON *root = o->json ? cJSON_CreateObject() : NULL, *arr = NULL;
    if (root) {
        cJSON_AddStringToObject(root, "model", o->model);
        arr = cJSON_AddArrayToObject(root, "requests");
    }
    for (int32_t i = 0; i < n; i++) {
        const kvp_session_result *r = &res[i];
        cJSON *obj = NULL, *samples = NULL;
        if (root) {
            obj = cJSON_CreateObject();
            cJSON_AddItemToArray(arr, obj);
            kvp_json_add_text(obj, "prompt", o->prompts.items[i]);
            cJSON_AddItemToObject(obj, "prompt_tokens", ids_json(reqs[i].prompt, reqs[i].n_prompt));
            cJSON_AddNumberToObject(obj, "cached_prompt_tokens", r->prompt_cached_tokens);
            cJSON_AddNumberToObject(obj, "ttft_s", r->ttft_s);
            cJSON_AddNumberToObject(obj, "tpot_s", r->tpot_s);
            if (o->prompt_logprobs) logprobs_json(obj, "prompt_", &r->prompt_logprobs);
            samples = cJSON_AddArrayToObject(obj, "samples");
        } else if (n > 1 || r->n_samples > 1) {
            printf("=== prompt %d ===\n", i + 1);
        }
        for (int32_t s = 0; s < r->n_samples; s++) {
            char *text = NULL;
            size_t len = 0; /* of text (a NUL byte from a byte token may sit inside it) */
            int32_t prev = reqs[i].prompt[reqs[i].n_prompt - 1];
            kvp_stop_text *h = stops.t ? &stops.t[i * o->n + s] : NULL;
            if (h) kvp_stop_text_add(h, &stops.set, tok, prev, r->tokens[s], r->n_tokens[s]); /* the last tokens */
            if (h && h->ntok == r->n_tokens[s]) {
                text = kvp_malloc(h->len + 1);
                if (text) memcpy(text, h->text ? h->text : "", h->len + 1);
                st = text ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory");
                len = h->len;
            } else {
                st = kvp_tok_decode(tok, prev, r->tokens[s], r->n_tokens[s], &text);
                if (st == KVP_OK) len = strlen(text);
            }
            if (st != KVP_OK) {
                rc = kvp_cli_fail(CMD, st);
                cJSON_Delete(root);
                goto out;
            }
            if (root) {
                if (s == 0) {
                    cJSON_AddItemToObject(obj, "tokens", ids_json(r->tokens[0], r->n_tokens[0]));
                    kvp_json_add_text(obj, "text", text);
                    cJSON_AddStringToObject(obj, "finish_reason", kvp_finish_name(r->finish[0]));
                }
                cJSON *so = cJSON_CreateObject();
                cJSON_AddItemToArray(samples, so);
                cJSON_AddItemToObject(so, "tokens", ids_json(r->tokens[s], r->n_tokens[s]));
                kvp_json_add_text(so, "text", text);
                cJSON_AddNumberToObject(so, "logprob", r->logprob[s]);
                cJSON_AddStringToObject(so, "finish_reason", kvp_finish_name(r->finish[s]));
                if (h && h->stop) kvp_json_add_text(so, "stop_str", o->stops.items[h->stop - 1]);
                if (r->logprobs) logprobs_json(so, "", &r->logprobs[s]);
            } else {
                if (r->n_samples > 1) printf("--- sample %d ---\n", s + 1);
                if (stops.stream) { /* the prompt and the text up to stops.shown are out already */
                    if (len > stops.shown) fwrite(text + stops.shown, 1, len - stops.shown, stdout);
                    putchar('\n');
                } else {
                    printf("%s%s\n", o->prompts.items[i], text);
                }
            }
            kvp_free(text);
        }
    }
    if (root) {
        cJSON *t = cJSON_AddObjectToObject(root, "totals");
        cJSON_AddNumberToObject(t, "requests", n);
        cJSON_AddNumberToObject(t, "prompt_tokens", (double)stats.prompt_tokens);
        cJSON_AddNumberToObject(t, "generated_tokens", (double)stats.generated_tokens);
        cJSON_AddNumberToObject(t, "computed_tokens", (double)stats.computed_tokens);
        cJSON_AddNumberToObject(t, "wall_s", stats.wall_s);
        cJSON_AddNumberToObject(t, "load_s", t_load);
        cJSON_AddNumberToObject(t, "tokens_per_s", stats.tokens_per_s);
        cJSON_AddNumberToObject(t, "steps", (double)stats.steps);
        cJSON_AddNumberToObject(t, "prefix_hit_rate", stats.prefix_hit_rate);
        cJSON_AddNumberToObject(t, "prefix_hit_tokens", (double)stats.prefix_hit_tokens);
        cJSON_AddNumberToObject(t, "preemptions", (double)stats.preemptions);
        cJSON_AddNumberToObject(t, "cow_copies", (double)stats.cow_copies);
        if (cfg.host_cache_blocks > 0) {
            cJSON_AddNumberToObject(t, "host_cache_blocks", cfg.host_cache_blocks);
            cJSON_AddNumberToObject(t, "host_hit_tokens", (double)stats.host_hit_tokens);
            cJSON_AddNumberToObject(t, "host_loaded_blocks", (double)stats.host_loaded_blocks);
            cJSON_AddNumberToObject(t, "host_stored_blocks", (double)stats.host_stored_blocks);
        }
        if (cfg.engine.spec.tokens > 0) {
            cJSON_AddNumberToObject(t, "spec_draft_tokens", (double)stats.spec_draft_tokens);
            cJSON_AddNumberToObject(t, "spec_accepted_tokens", (double)stats.spec_accepted_tokens);
            cJSON_AddNumberToObject(t, "spec_acceptance_rate", kvp_spec_acceptance(&stats));
        }
        cJSON_AddNumberToObject(t, "kv_token_states", (double)stats.peak_token_states);
        cJSON_AddNumberToObject(t, "kv_logical_tokens", (double)stats.peak_logical_tokens);
        cJSON_AddNumberToObject(t, "kv_shared_savings", (double)stats.peak_shared_savings);
        cJSON_AddNumberToObject(t, "kv_shared_savings_mean", stats.mean_shared_savings);
        cJSON_AddNumberToObject(t, "kv_used_blocks", (double)stats.peak_used_blocks);
        cJSON_AddNumberToObject(t, "kv_utilization", stats.mean_kv_utilization);
        cJSON_AddNumberToObject(t, "num_blocks", stats.num_blocks);
        cJSON_AddNumberToObject(t, "block_size", stats.block_size);
        cJSON_AddStringToObject(t, "kv_dtype", kvp_dtype_name(o->kv_dtype));
        cJSON_AddNumberToObject(t, "kv_pool_bytes", (double)stats.kv_pool_bytes);
        cJSON_AddNumberToObject(t, "threads", o->threads);
        cJSON_AddNumberToObject(t, "tp", o->tp);
        cJSON_AddStringToObject(t, "matmul", kvp_matmul_kind_name(o->matmul));
        cJSON_AddStringToObject(t, "weight_dtype", kvp_weight_type_name(kvp_model_weight_type(m)));
        cJSON_AddStringToObject(t, "device", o->dev.cuda ? "cuda" : "cpu");
        if (o->dev.cuda) kvp_cuda_info_json(&cuda_info, t);
        st = kvp_json_print(stdout, root);
        cJSON_Delete(root);
        if (st != KVP_OK) rc = kvp_cli_fail(CMD, st);
    }
    if (kvp_comm_rank(comm) == 0)
        fprintf(stderr,
            "kvpage generate: %d prompts, %lld generated tokens in %.3f s (%.1f tokens/s), %lld steps, prefix hit "
            "rate %.3f, peak KV token states %lld, KV cache %.2f MiB of %s\n",
            n, (long long)stats.generated_tokens, stats.wall_s, stats.tokens_per_s, (long long)stats.steps,
            stats.prefix_hit_rate, (long long)stats.peak_token_states, (double)stats.kv_pool_bytes / (1 << 20),
            kvp_dtype_name(o->kv_dtype));
    if (kvp_comm_rank(comm) == 0 && cfg.engine.spec.tokens > 0)
        fprintf(stderr, "kvpage generate: speculation: %lld draft tokens in %lld steps, %lld kept (%.1f %%)\n",
                (long long)stats.spec_draft_tokens, (long long)stats.spec_drafts, (long long)stats.spec_accepted_tokens,
                100.0 * kvp_spec_acceptance(&stats));
out:
    for (int32_t i = 0; stops.t && i < stops.n * stops.nsamples; i++) kvp_stop_text_free(&stops.t[i]);
    kvp_free(stops.t);
    if (enc)
        for (int32_t i = 0; i < o->prompts.n; i++) kvp_free(enc[i]);
    kvp_free(enc);
    kvp_session_results_free(res, nres);
    kvp_free(res);
    kvp_free(reqs);
    kvp_tok_destroy(tok);
    kvp_model_destroy(m);
    /* a rank that fails alone would leave the others waiting in a collective: end the whole job */
    if (rc != KVP_EXIT_OK) kvp_comm_abort(comm, rc);
    rc = join_followers(followers, rc);
    kvp_comm_destroy(comm);
    return rc;
}

int kvp_cmd_generate(int argc, char **argv)
{
    enum { O_PROMPTS_FILE = 256, O_MAX_TOKENS, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_SEED, O_N, O_BEAM, O_NB, O_THREADS,
           O_MATMUL, O_JSON, O_TOK, O_IGNORE_EOS, O_KV_DTYPE, O_TP, O_WDTYPE, O_LOGPROBS, O_PROMPT_LOGPROBS, O_PRESENCE,
           O_FREQUENCY, O_REPETITION, O_MIN_TOKENS, O_STOP, O_CHAT, O_CHAT_TEMPLATE, O_SYSTEM, O_MAXLEN };
    static const struct option own[] = {
        {"model", required_argument, 0, 'm'},         {"prompt", required_argument, 0, 'p'},
        {"prompts-file", required_argument, 0, O_PROMPTS_FILE}, {"max-tokens", required_argument, 0, O_MAX_TOKENS},
        {"temperature", required_argument, 0, O_TEMP}, {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},       {"min-p", required_argument, 0, O_MINP},
        {"seed", required_argument, 0, O_SEED},
        {"n", required_argument, 0, O_N},              {"beam-width", required_argument, 0, O_BEAM},
        {"num-blocks", required_argument, 0, O_NB},
        {"threads", required_argument, 0, O_THREADS},
        {"max-model-len", required_argument, 0, O_MAXLEN},
        {"matmul", required_argument, 0, O_MATMUL},    {"json", no_argument, 0, O_JSON},
        {"tokenizer", required_argument, 0, O_TOK},    {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"kv-dtype", required_argument, 0, O_KV_DTYPE}, {"tp", required_argument, 0, O_TP},
        {"weight-dtype", required_argument, 0, O_WDTYPE},
        {"logprobs", required_argument, 0, O_LOGPROBS}, {"prompt-logprobs", no_argument, 0, O_PROMPT_LOGPROBS},
        {"presence-penalty", required_argument, 0, O_PRESENCE}, {"frequency-penalty", required_argument, 0, O_FREQUENCY},
        {"repetition-penalty", required_argument, 0, O_REPETITION}, {"min-tokens", required_argument, 0, O_MIN_TOKENS},
        {"stop", required_argument, 0, O_STOP},       {"chat", no_argument, 0, O_CHAT},
        {"chat-template", required_argument, 0, O_CHAT_TEMPLATE}, {"system", required_argument, 0, O_SYSTEM},
        {"help", no_argument, 0, 'h'}};
    struct option opts[sizeof own / sizeof own[0] + KVP_EO_END - KVP_EO_BLOCK + KVP_DO_END - KVP_DO_DEVICE + 1];
    kvp_device_opts_append(opts, kvp_engine_opts_table(own, (int)(sizeof own / sizeof own[0]), opts,
                                                       (int)(sizeof opts / sizeof opts[0])),
                           (int)(sizeof opts / sizeof opts[0]));
    gen_opts o;
    memset(&o, 0, sizeof o);
    o.max_tokens = 64;
    o.top_p = 1.0;
    o.n = 1;
    o.threads = 1;
    o.tp = 1;
    o.matmul = KVP_MATMUL_INVARIANT;
    o.kv_dtype = KVP_DTYPE_F32;
    o.kv_auto = 1;
    o.weight_dtype = KVP_WEIGHT_AUTO;
    o.logprobs = -1;
    o.cfg = kvp_session_config_default();
    kvp_engine_opts_init(&o.eo, &o.cfg.engine);
    kvp_device_opts_init(&o.dev);
    int c, rc = KVP_EXIT_OK;
    kvp_status st = KVP_OK;
    optind = 0;
    int li = -1;
    while ((c = getopt_long(argc, argv, ":m:p:h", opts, &li)) != -1) {
        int64_t v;
        double d;
        if (kvp_engine_opt(&o.eo, c, optarg, &st) || kvp_device_opt(&o.dev, c, optarg, &st)) {
            if (st != KVP_OK) {
                rc = kvp_cli_usage_error(CMD, "--%s: %s", opts[li].name, kvp_error_message());
                goto done;
            }
            continue;
        }
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': st = strlist_add(&o.prompts, optarg, strlen(optarg)); break;
        case O_PROMPTS_FILE: o.prompts_file = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_MAX_TOKENS: st = kvp_parse_i32(optarg, 0, 1 << 24, &o.max_tokens); break;
        case O_MIN_TOKENS: st = kvp_parse_i32(optarg, 0, 1 << 24, &o.min_tokens); break;
        case O_TEMP: st = kvp_parse_f64(optarg, 0.0, 1e6, &o.temperature); break;
        case O_TOPK: st = kvp_parse_i32(optarg, 0, INT32_MAX, &o.top_k); break;
        case O_TOPP: st = kvp_parse_f64(optarg, 1e-9, 1.0, &o.top_p); break;
        case O_MINP: st = kvp_parse_f64(optarg, 0.0, 1.0, &o.min_p); break;
        case O_SEED: st = kvp_parse_i64(optarg, 0, INT64_MAX, &v), o.seed = v; break;
        case O_N: st = kvp_parse_i32(optarg, 1, 1000, &o.n); break;
        case O_BEAM: st = kvp_parse_i32(optarg, 0, 1000, &o.beam); break;
        case O_NB: st = kvp_parse_i32(optarg, 0, INT32_MAX / 2, &o.num_blocks); break;
        case O_KV_DTYPE: st = kvp_kv_dtype_parse(optarg, &o.kv_dtype, &o.kv_auto); break;
        case O_WDTYPE: st = kvp_weight_type_parse(optarg, &o.weight_dtype); break;
        case O_MAXLEN: st = kvp_parse_i32(optarg, 2, INT32_MAX, &o.max_model_len); break;
        case O_THREADS: st = kvp_parse_i32(optarg, 1, 1024, &o.threads); break;
        case O_TP: st = kvp_parse_i32(optarg, 1, 1024, &o.tp); break;
        case O_MATMUL:
            st = kvp_matmul_kind_parse(optarg, &o.matmul);
            break;
        case O_JSON: o.json = 1; break;
        case O_IGNORE_EOS: o.ignore_eos = 1; break;
        case O_LOGPROBS: st = kvp_parse_i32(optarg, 0, KVP_MAX_TOP_LOGPROBS, &o.logprobs); break;
        case O_PROMPT_LOGPROBS: o.prompt_logprobs = 1; break;
        case O_CHAT: o.chat = 1; break;
        case O_CHAT_TEMPLATE: o.chat = 1, o.chat_template = optarg; break;
        case O_SYSTEM: o.system = optarg; break;
        case O_STOP:
            if (o.stops.n >= 16 || strlen(optarg) < 1 || strlen(optarg) > 256)
                st = KVP_ERR(KVP_EINVAL, "at most 16 stop strings of 1 to 256 bytes");
            else
                st = strlist_add(&o.stops, optarg, strlen(optarg));
            break;
        case O_PRESENCE: st = kvp_parse_f64(optarg, -2.0, 2.0, &d), o.presence = (float)d; break;
        case O_FREQUENCY: st = kvp_parse_f64(optarg, -2.0, 2.0, &d), o.frequency = (float)d; break;
        case O_REPETITION: st = kvp_parse_f64(optarg, 1e-6, 10.0, &d), o.repetition = (float)d; break;
        case 'h':
            usage(stdout);
            strlist_free(&o.prompts);
            strlist_free(&o.stops);
            return KVP_EXIT_OK;
        default:
            strlist_free(&o.prompts);
            strlist_free(&o.stops);
            return kvp_cli_getopt_error(CMD, c, argv);
        }
        if (st != KVP_OK) {
            const char *opt = li >= 0 ? opts[li].name : c == 'p' ? "prompt" : "model";
            rc = kvp_cli_usage_error(CMD, "--%s: %s", opt, kvp_error_message());
            goto done;
        }
        li = -1;
    }
    if (optind < argc) {
        rc = kvp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
        goto done;
    }
    if (!o.model) {
        rc = kvp_cli_usage_error(CMD, "--model is required");
        goto done;
    }
    if ((st = kvp_engine_opts_check(&o.eo)) != KVP_OK || (st = kvp_device_opts_check(&o.dev)) != KVP_OK) {
        rc = kvp_cli_usage_error(CMD, "%s", kvp_error_message());
        goto done;
    }
    if (o.dev.cuda && o.tp > 1 && o.dev.cu.device != 0) {
        rc = kvp_cli_usage_error(CMD, "--device cuda:%d with --tp %d: each rank takes the GPU of its index on its "
                                      "node (choose them with CUDA_VISIBLE_DEVICES)", o.dev.cu.device, o.tp);
        goto done;
    }
    if (o.cfg.engine.sched == KVP_SCHED_PRIORITY) {
        rc = kvp_cli_usage_error(CMD, "--sched: 'priority' needs each request's priority (kvpage serve takes them): "
                                      "fcfs or lpm");
        goto done;
    }
    if (o.prompts_file && (st = read_prompts(o.prompts_file, &o.prompts, &o.prompt_max)) != KVP_OK) {
        rc = kvp_cli_fail(CMD, st);
        goto done;
    }
    if (o.prompts.n == 0) {
        rc = kvp_cli_usage_error(CMD, "give at least one --prompt or a --prompts-file");
        goto done;
    }
    if ((o.logprobs >= 0 && !o.json) || (o.prompt_logprobs && o.logprobs < 0)) {
        rc = kvp_cli_usage_error(CMD, "--logprobs needs --json, and --prompt-logprobs needs --logprobs");
        goto done;
    }
    if (o.system && !o.chat) {
        rc = kvp_cli_usage_error(CMD, "--system needs --chat or --chat-template");
        goto done;
    }
    if (o.stops.n > 0 && o.beam > 1) {
        rc = kvp_cli_usage_error(CMD, "--stop does not apply to --beam-width");
        goto done;
    }
    if (o.logprobs >= 0 && o.beam > 1) {
        rc = kvp_cli_usage_error(CMD, "--logprobs does not apply to --beam-width (each beam's score is its logprob)");
        goto done;
    }
    if (o.min_tokens > o.max_tokens || (o.min_tokens > 0 && o.beam > 1)) {
        rc = kvp_cli_usage_error(CMD, "--min-tokens %d must be at most --max-tokens %d, and needs sampling (no --beam-width)",
                                 o.min_tokens, o.max_tokens);
        goto done;
    }
    if (o.beam > 1 && o.n > o.beam) {
        rc = kvp_cli_usage_error(CMD, "--n %d is larger than --beam-width %d", o.n, o.beam);
        goto done;
    }
    if (o.beam > 1 && (o.temperature > 0 || o.top_k > 0 || o.top_p < 1 || o.min_p > 0 || o.presence != 0 ||
                       o.frequency != 0 || (o.repetition != 0 && o.repetition != 1))) { /* rather than silently ignored */
        rc = kvp_cli_usage_error(CMD, "--temperature, --top-k, --top-p, --min-p and the penalties do not apply to "
                                      "--beam-width (beam search keeps the most likely extensions)");
        goto done;
    }
    rc = run(&o);
done:
    strlist_free(&o.prompts);
    strlist_free(&o.stops);
    kvp_free(o.prompt_max);
    return rc;
}
