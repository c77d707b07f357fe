/* runtime/workload/workload.h — a workload: requests in arrival order, each with its prompt's token ids.
 * A workload owns its requests and their tokens, valid until kvp_workload_destroy; requests keep the order
 * they were added in (arrival_s is not checked). Other readers (workload_synth.h) use create + add.
 *
 * Mooncake JSONL (../shared/data/traces/mooncake/), one object a line: {"timestamp": ms, "input_length":
 * n, "output_length": m, "hash_ids": [ceil(n / 512) ids]}. Each id expands to 512 token ids no other id
 * has (the last block cut to n), so requests share a prefix exactly where they share leading ids, at any
 * block size. Blank lines are skipped; a malformed line is KVP_EPARSE naming file and line (skip_bad:
 * counted in skipped_lines).
 *
 * Generators "NAME[:key=value,...]" (defaults shown; each also takes seed=1 vocab=32000 rate=10): lengths
 * in tokens, ids uniform in [0, vocab), Poisson arrivals at `rate` req/s, outputs uniform in [output/2,
 * 3*output/2]; the same seed gives the same workload; a bad name, key or value is KVP_EINVAL naming it.
 *   system   n=200 prefix=1024 suffix=256 share=1.0 output=128: a fraction `share` starts with one system
 *            prompt (also a pin, priority 1), then a suffix of [suffix/2, 3*suffix/2] random tokens
 *   chat     conversations=50 turns=6 system=256 user=64 assistant=192 think=0: a turn = the shared system
 *            prompt + its conversation so far + a user message; output_len the answer's. Conversations
 *            interleave; a turn carries its answer (output_tokens) unless last, and the next waits for it
 *            (after), then `think` s, and for its own Poisson time
 *   fewshot  n=200 tasks=4 examples=8 example=128 question=64 output=64: a random task's examples, a question
 *   branch   n=200 depth=4 fanout=3 segment=128 suffix=64 output=64: `depth` segments down a tree with
 *            `fanout` children a node, then a suffix
 */
#ifndef KVP_RUNTIME_WORKLOAD_H
#define KVP_RUNTIME_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/engine/request.h"

typedef struct {
    kvp_request *reqs; /* [n]: tokens[prompt_len], output_tokens[output_len] or NULL */
    int64_t n;
    kvp_request *pins; /* [n_pins] prefixes to pin in a prefix cache before replay, with their priority */
    int64_t n_pins;
    int64_t skipped_lines; /* readers with skip_bad: malformed lines skipped */
    int64_t total_prompt_tokens;
    char name[64];     /* "mooncake:synthetic_trace.jsonl", "system", ... */
    /* private */
    int64_t cap_, cap_pins_, pin_tokens_;
} kvp_workload;

/* An empty workload named `name` (truncated to 63 bytes), owned by the caller. */
kvp_status kvp_workload_create(const char *name, kvp_workload **out);
void kvp_workload_destroy(kvp_workload *w); /* NULL: no-op */

/* Appends a copy of *r, of tokens[0..prompt_len) (r->tokens is ignored) and of r->output_tokens if not
 * NULL. KVP_EINVAL for prompt_len < 1 or output_len < 0; KVP_ENOMEM. A failure leaves w unchanged. */
kvp_status kvp_workload_add(kvp_workload *w, const kvp_request *r, const int32_t *tokens);
kvp_status kvp_workload_add_pin(kvp_workload *w, const kvp_request *r, const int32_t *tokens);

/* Request i's answer := a copy of tokens[0..output_len). KVP_EINVAL (bad i, NULL), KVP_ENOMEM; w unchanged */
kvp_status kvp_workload_set_output(kvp_workload *w, int64_t i, const int32_t *tokens);

typedef struct {
    int skip_bad;      /* 1: count and skip malformed lines */
    int64_t max_requests; /* 0: all */
} kvp_mooncake_opts;

/* opts may be NULL (defaults). */
kvp_status kvp_workload_read_mooncake(const char *path, const kvp_mooncake_opts *opts, kvp_workload **out);

/* Token j (0 <= j < 512) of hash id h >= 0: h * 512 + j while that fits in int32, else a 31-bit mix. */
int32_t kvp_mooncake_token(int64_t hash_id, int32_t j);
#define KVP_MOONCAKE_BLOCK 512

/* The longest prompt (16M tokens): readers reject a longer one naming the line, and a workload refuses
 * prompt tokens beyond half the machine's memory, so a bad line or option is an error, not an OOM kill. */
#define KVP_MAX_PROMPT_TOKENS (1 << 24)

/* Hashes every prompt and answer token into [0, vocab), for a real model (simulate --executor cpu, bench
 * serve): equal ids stay equal, so shared prefixes stay shared; distinct ids rarely collide. */
void kvp_workload_fit_vocab(kvp_workload *w, int64_t vocab);
kvp_status kvp_workload_generate(const char *spec, kvp_workload **out); /* a generator spec (above) */

/* Either "mooncake:PATH" (skip_bad as given) or a generator spec. */
kvp_status kvp_workload_load(const char *spec, int skip_bad, kvp_workload **out);

#endif
