/* stories260K against its golden files: the logits of a 5-token prompt from the GGUF (pairs RoPE) and
 * the HF folder (rotate-half) with both matmuls, and the golden greedy stories through the paged KV cache with a
 * shuffled page table, whole and in prefill chunks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_testutil.h"
#include "common/alloc.h"
#include "common/json.h"
#include "forward_testutil.h"
#include "model_testutil.h"
#include "runtime/engine/sampler.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

Test(model, golden_logits_both_formats)
{
    cJSON *gl;
    tu_require_shared();
    cr_assert_eq(kvp_json_parse_file(S260_DIR "/golden_logits.json", &gl), KVP_OK);
    const char *paths[2] = {S260_GGUF, S260_HF};
    for (int f = 0; f < 2; f++) {
        kvp_model *m = tu_load(paths[f]);
        cr_assert_eq(kvp_model_rope_style(m), f == 0 ? KVP_ROPE_PAIRS : KVP_ROPE_HALF);
        for (int mm = 0; mm < 2; mm++) {
            kvp_model_set_matmul(m, mm ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
            int32_t toks[5] = {1, 403, 407, 261, 378}, pos[5] = {0, 1, 2, 3, 4}, blocks[2] = {1, 0};
            int64_t slots[5] = {4, 5, 6, 7, 0};
            int32_t qo[2] = {0, 5}, kvi[2] = {0, 2}, last = 1;
            kvp_kv_cache *kv;
            cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, 2, 4, &kv), KVP_OK);
            kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 5, .tokens = toks, .positions = pos, .slot_mapping = slots,
                               .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last,
                               .all_logits = 1};
            float logits[5 * 512];
            cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_OK, "%s", kvp_error_detail());
            const cJSON *rows = cJSON_GetObjectItem(gl, "logits");
            double maxerr = 0;
            for (int r = 0; r < 5; r++)
                for (int i = 0; i < 512; i++) {
                    double want = cJSON_GetArrayItem(cJSON_GetArrayItem(rows, r), i)->valuedouble;
                    double err = fabs(logits[r * 512 + i] - want) / (fabs(want) + 1.0);
                    if (err > maxerr) maxerr = err;
                }
            cr_assert_lt(maxerr, 1e-4, "%s matmul %d: max relative logit error %g", paths[f], mm, maxerr);
            kvp_kv_cache_destroy(kv);
        }
        kvp_model_destroy(m);
    }
    cJSON_Delete(gl);
}

Test(model, golden_greedy_gguf_paged)
{
    kvp_model *m = tu_load(S260_GGUF);
    tu_check_golden(m, 16, 0);
    tu_check_golden(m, 1, 3);
    kvp_model_destroy(m);
}

Test(model, golden_greedy_hf_paged)
{
    kvp_model *m = tu_load(S260_HF);
    tu_check_golden(m, 64, 0);
    tu_check_golden(m, 7, 2);
    kvp_model_set_matmul(m, KVP_MATMUL_BLAS);
    tu_check_golden(m, 16, 0);
    kvp_model_destroy(m);
}
