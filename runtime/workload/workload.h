/* runtime/workload/workload.h — a workload: requests in arrival order, each with its prompt's token ids.
 *
 *   kvp_workload
 *     reqs[0..n)   kvp_request (runtime/engine/request.h) { id, arrival_s, tokens -> [prompt_len] int32,
 *                               prompt_len, output_len, priority, output_tokens -> [output_len] int32 or NULL }
 *     pins[0..n_pins)  optional prefixes to pin in a prefix cache before replay (e.g. a system prompt);
 *                      same struct, meant to be inserted with their priority
 *
 * Sources (this file): the Mooncake JSONL reader and four seeded synthetic shared-prefix generators.
 * Other readers (Azure CSV, ShareGPT-like) live in their own runtime/ files and build workloads with
 * kvp_workload_create + kvp_workload_add.
 *
 * Ownership: a kvp_workload owns its requests and every tokens array; pointers into it stay valid until
 * kvp_workload_destroy. Requests are appended in arrival order (arrival_s non-decreasing is not enforced;
 * readers keep the file's order).
 *
 * Mooncake traces (../shared/data/traces/mooncake/): one JSON object a line,
 *   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [h0, h1, ...]}
 * with len(hash_ids) == ceil(n / 512). Each hash id h expands to 512 deterministic token ids, distinct
 * from those of every other hash id: token j of id h is h * 512 + j while that fits in int32
 * (h < 4194304), else a 31-bit mix of (h, j); the last block is cut to input_length. So two requests
 * share a token prefix exactly where they share leading hash ids, at any cache block size.
 * Blank lines are skipped. A malformed line (bad JSON, a missing or mistyped field, negative or
 * inconsistent lengths, a bad hash id) is KVP_EPARSE naming the file and the line number; with
 * skip_bad it is counted in kvp_workload.skipped_lines instead.
 *
 * Synthetic generators (spec "NAME[:key=value,...]", every key optional; all lengths in tokens; token
 * ids uniform in [0, vocab); arrivals Poisson at `rate` requests/s; output lengths uniform in
 * [output/2, 3*output/2]; the same seed gives the same workload):
 *   system   n=200 prefix=1024 suffix=256 share=1.0 seed=1 vocab=32000 rate=10 output=128
 *            N requests; a fraction `share` starts with one common S-token system prompt (also listed as a
 *            pin with priority 1), then a random suffix of length uniform in [suffix/2, 3*suffix/2].
 *   chat     conversations=50 turns=6 system=256 user=64 assistant=192 seed=1 vocab=32000 rate=10 think=0
 *            Multi-turn chat: turn t's prompt = system prompt (shared by all conversations) + every
 *            earlier user message and assistant answer of that conversation + the new user message;
 *            output_len is the answer's length. Conversations interleave at random, turns in order.
 *            Every turn but a conversation's last carries its answer as output_tokens, and every turn
 *            after the first waits for the previous one's answer (after), then `think` seconds (default
 *            0, a decimal), and arrives no earlier than its own Poisson time.
 *   fewshot  n=200 tasks=4 examples=8 example=128 question=64 seed=1 vocab=32000 rate=10 output=64
 *            Each task has k examples; a request picks a task and asks a random question after them.
 *   branch   n=200 depth=4 fanout=3 segment=128 suffix=64 seed=1 vocab=32000 rate=10 output=64
 *            A tree of prompts: a request walks from the root choosing one of `fanout` children at each
 *            of `depth` levels (each node a fixed `segment`-token text), then adds a random suffix, so
 *            prompts fork at every depth.
 * Unknown names or keys and out-of-range values are KVP_EINVAL naming them.
 */
#ifndef KVP_RUNTIME_WORKLOAD_H
#define KVP_RUNTIME_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/request.h"


typedef struct {
    kvp_request *reqs; /* [n] */
    int64_t n;
    kvp_request *pins; /* [n_pins] prefixes to pin (may be empty) */
    int64_t n_pins;
    int64_t skipped_lines; /* readers with skip_bad: malformed lines skipped */
    int64_t total_prompt_tokens;
    char name[64];     /* "mooncake:synthetic_trace.jsonl", "system", ... */
    /* private */
    int64_t cap_, cap_pins_, pin_tokens_;
} kvp_workload;

/* An empty workload named `name` (truncated to 63 bytes). *out owned by the caller. */
kvp_status kvp_workload_create(const char *name, kvp_workload **out);
void kvp_workload_destroy(kvp_workload *w); /* NULL: no-op */

/* Appends a request (or a pin) with a copy of tokens[0..r->prompt_len); r->tokens is ignored. The id,
 * arrival, lengths and priority are taken from *r, and a copy of r->output_tokens when it is not NULL.
 * KVP_EINVAL for prompt_len < 1 or output_len < 0, KVP_ENOMEM with w unchanged. */
kvp_status kvp_workload_add(kvp_workload *w, const kvp_request *r, const int32_t *tokens);
kvp_status kvp_workload_add_pin(kvp_workload *w, const kvp_request *r, const int32_t *tokens);

/* Gives request i a copy of tokens[0..output_len) as its answer (replacing any). KVP_EINVAL for i out of
 * range or tokens NULL, KVP_ENOMEM with w unchanged. */
kvp_status kvp_workload_set_output(kvp_workload *w, int64_t i, const int32_t *tokens);

typedef struct {
    int skip_bad;      /* 1: count and skip malformed lines instead of failing */
    int64_t max_requests; /* 0: all */
} kvp_mooncake_opts;

/* Reads a Mooncake JSONL trace (see above). opts may be NULL (defaults). */
kvp_status kvp_workload_read_mooncake(const char *path, const kvp_mooncake_opts *opts, kvp_workload **out);

/* Token j (0 <= j < 512) of the Mooncake block with hash id h (h >= 0). */
int32_t kvp_mooncake_token(int64_t hash_id, int32_t j);
#define KVP_MOONCAKE_BLOCK 512

/* The longest prompt a workload takes (16M tokens, 64 MiB of ids: beyond any model's context). Readers
 * reject a longer one naming the line before building its tokens, and a workload refuses prompt tokens
 * beyond half of the machine's memory, so a bad trace line or generator option is an error, not the OOM
 * killer. */
#define KVP_MAX_PROMPT_TOKENS (1 << 24)

/* Maps the token ids of every prompt and known answer (hash-derived, or drawn from another vocabulary)
 * into [0, vocab) by a hash: equal ids stay equal, so shared prefixes stay shared, and distinct ids rarely
 * collide (a plain modulo would make every 512-token block of a Mooncake trace the same text). For a real
 * model's vocabulary (simulate --executor cpu, bench serve). */
void kvp_workload_fit_vocab(kvp_workload *w, int64_t vocab);
/* A synthetic workload from a spec "NAME[:key=value,...]" (see above). */
kvp_status kvp_workload_generate(const char *spec, kvp_workload **out);

/* Either "mooncake:PATH" (skip_bad as given) or a generator spec. */
kvp_status kvp_workload_load(const char *spec, int skip_bad, kvp_workload **out);

#endif
