/* tests/runtime/reference_testutil.h — a float64 forward pass of the checkpoints checkpoint_testutil.h builds,
 * written from the models' published definitions (transformers' modeling code) and sharing no code with
 * runtime/model/: RMSNorm, matrix-vector products, SwiGLU, causal GQA attention with rotate-half RoPE, and the
 * whole MoE (mixtral, qwen3_moe) and gemma 1-3 models. Inputs are the HF tensors (ck_tensor, by name);
 * logits are (P, 512) doubles. Built into the kvp_model_testutil library (tests/CMakeLists.txt). */
#ifndef KVP_TESTS_RUNTIME_REFERENCE_TESTUTIL_H
#define KVP_TESTS_RUNTIME_REFERENCE_TESTUTIL_H

#include <stdint.h>

#include "checkpoint_testutil.h"

/* y (n) = x normalized (eps 1e-5) and scaled by w */
void ref_rmsnorm(double *y, const double *x, const float *w, int n);

/* y (rows) = w (rows x cols, row-major) x */
void ref_mv(double *y, const float *w, const double *x, int rows, int cols);

/* y (64) = down(silu(gate x) * up x), the FFN of mf units whose matrices are named pre + gate/up/down. */
void ref_swiglu(double *y, const ck_tensor *t, int nt, const char *const names[3], int mf, const double *x);

/* logits (P, 512) of prompt tok, every position; *distinct: the experts any token chose, as a bit set */
void ref_moe_logits(const ck_tensor *t, int nt, const moe_spec *sp, const int32_t *tok, int P, double *logits,
                    unsigned *distinct);

/* ref_moe_logits of the HF checkpoint sp describes (sp->gguf ignored: the same weights), asserting that the prompt
 * routes to every expert (a case that leaves one out checks less) */
void ref_moe_spec_logits(const moe_spec *sp, const int32_t *tok, int P, double *logits);

/* x (n) normalized and scaled by 1 + w, as gemma's RMSNorm (w as HF stores it) */
void ref_gemma_norm(double *y, const double *x, const float *w, int n);

/* logits (P, 512) of the HF model in t that sp describes, as transformers computes it (sp->qpas 0: 1/sqrt(8);
 * caps 0: off; a window of sp->window keys on the sliding layers, 0: none) */
void ref_gemma_logits(const ck_tensor *t, int nt, const gemma_spec *sp, const int32_t *tok, int P,
                      double *logits);

#endif
