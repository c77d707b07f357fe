/* tests/runtime/forward_testutil.h — running a model in the model tests: loading with an assert, greedy decoding
 * through a paged cache with a shuffled page table, the golden story of stories260K, one 5-token forward pass,
 * row-for-row batch invariance, and load errors that must name their problem. Every call asserts (Criterion),
 * so it belongs inside a Test. Built into the kvp_model_testutil library (tests/CMakeLists.txt). */
#ifndef KVP_TESTS_RUNTIME_FORWARD_TESTUTIL_H
#define KVP_TESTS_RUNTIME_FORWARD_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model/model.h"

/* Loads path (a GGUF file or an HF folder), asserting success and that ../shared is there. Owned by the caller. */
kvp_model *tu_load(const char *path);

/* Runs a prompt then greedy decoding on one sequence whose blocks are a shuffled set of the cache's blocks.
 * out[0..steps-np] receives the generated tokens (steps - np + 1: the last one after the final step). Prefill
 * in chunks of `chunk` tokens (0: all at once). */
void tu_greedy_one(kvp_model *m, int32_t bs, const int32_t *prompt, int32_t np, int32_t steps, int32_t chunk,
                   int32_t *out);

/* Every case of stories260K's golden.json through tu_greedy_one (block size bs, prefill chunk `chunk`): m must
 * generate the golden tokens, each mismatch named by model, block size and position. */
void tu_check_golden(kvp_model *m, int32_t bs, int32_t chunk);

/* kvp_model_load and kvp_model_destroy in the shape tu_every_alloc_failure (model_testutil.h) calls. */
kvp_status tu_load_model(void *path, void **m);
void tu_destroy_model(void *m);

/* The logits of every row of the 5-token prompt ids (taken modulo the vocabulary) in out (5 x vocab), from a
 * fresh one-block cache. */
kvp_status tu_forward_tokens5(kvp_model *m, const int32_t *ids, float *out);

/* tu_forward_tokens5 on a fixed prompt (1, 403, 407, 261, 378). */
kvp_status tu_forward_prompt5(kvp_model *m, float *out);

/* tu_forward_prompt5, asserting success; out: 5 x 512. */
void tu_logits_of(kvp_model *m, float *out);

/* max |a - b| / (|b| + 1) over n values */
double tu_max_rel(const float *a, const float *b, int n);

/* Invariant matmul tiling (every row tile of the lane count, single rows, every panel including the partial
 * one of the 172-wide FFN; on 16 lanes tiles of two panels, and that FFN's eleventh panel alone; from 8 rows on,
 * the LM head's tiles and left-over rows split over the threads): one token a step, then prompts of n = 1..40
 * tokens in one forward pass; every row equals the same token alone, bit for bit, on 1 and 2 threads. ref
 * (40 x V): with *have_ref, the tokens alone must give it too (another lane count's results); else it gets
 * them. */
void tu_expect_batch_invariant(kvp_model *m, const char *what, float *ref, int *have_ref);

/* Loading path fails with `want`, leaves no model, and the message holds n1, n2 and n3 (n3 may be NULL);
 * `what` names the case in a failure. */
void tu_expect_load_error(const char *path, kvp_status want, const char *n1, const char *n2, const char *n3,
                          const char *what);

/* tu_forward_prompt5's logits of m against a float64 reference (5 x 512): max |got - want| / (|want| + 1) under
 * 1e-4; i names the case. */
void tu_expect_logits_near(kvp_model *m, const double *want, size_t i);

#endif
