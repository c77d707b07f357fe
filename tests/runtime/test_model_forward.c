/* The forward pass itself: KV cache pools of every element type, batches it rejects, the worker pool
 * (kvp_model_run), bit-identical rows for every batch size, weight type and lane count, and --skip-attention. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
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

/* Element e of a pool of type t, as a float. */
static float elem(const void *pool, kvp_dtype t, size_t e)
{
    switch (t) {
    case KVP_DTYPE_F32: return ((const float *)pool)[e];
    case KVP_DTYPE_F16: return kvp_f16_to_f32(((const uint16_t *)pool)[e]);
    case KVP_DTYPE_BF16: return kvp_bf16_to_f32(((const uint16_t *)pool)[e]);
    default: return kvp_fp8e4m3_to_f32(((const uint8_t *)pool)[e]);
    }
}

/* Each element type gives pools of its size, every slot NaN until written; a bad dtype is refused. */
Test(model, kv_cache_dtypes)
{
    kvp_model *m = tu_load(S260_GGUF);
    const kvp_dtype dts[4] = {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_BF16, KVP_DTYPE_FP8_E4M3};
    for (int i = 0; i < 4; i++) {
        kvp_kv_cache *kv;
        cr_assert_eq(kvp_kv_cache_create(m, dts[i], 3, 16, &kv), KVP_OK, "%s", kvp_error_detail());
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(kv->num_layers, c->num_layers);
        for (int32_t l = 0; l < kv->num_layers; l++) {
            const kvp_paged_kv *p = &kv->layers[l];
            cr_assert_eq(p->dtype, dts[i]);
            const size_t es = kvp_dtype_size(dts[i]), n = kvp_paged_kv_pool_bytes(p);
            cr_assert_eq(n, (size_t)3 * 16 * (size_t)c->num_kv_heads * (size_t)c->head_dim * es);
            for (size_t e = 0; e < n / es; e++)
                cr_assert(isnan(elem(p->k, dts[i], e)) && isnan(elem(p->v, dts[i], e)), "%s layer %d element %zu",
                          kvp_dtype_name(dts[i]), l, e);
        }
        kvp_kv_cache_destroy(kv);
    }
    kvp_kv_cache *kv = NULL;
    cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_COUNT, 3, 16, &kv), KVP_EINVAL);
    cr_assert_null(kv);
    kvp_model_destroy(m);
}

Test(model, forward_rejects_bad_batches)
{
    kvp_model *m = tu_load(S260_GGUF);
    kvp_kv_cache *kv;
    cr_assert_eq(kvp_kv_cache_create(m, KVP_DTYPE_F32, 4, 16, &kv), KVP_OK);
    int32_t toks[1] = {600}, pos[1] = {0}, blocks[1] = {0}, qo[2] = {0, 1}, kvi[2] = {0, 1}, last = 1;
    int64_t slots[1] = {0};
    kvp_fwd_batch b = {.num_seqs = 1, .num_tokens = 1, .tokens = toks, .positions = pos, .slot_mapping = slots,
                       .qo_indptr = qo, .kv_indptr = kvi, .kv_indices = blocks, .kv_last_page_len = &last};
    float logits[512];
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "600"));
    toks[0] = 5;
    pos[0] = 5000;
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "context"), "%s", kvp_error_message());
    pos[0] = 0;
    slots[0] = 64;
    cr_assert_eq(kvp_model_forward(m, kv, &b, logits), KVP_EINVAL);
    kvp_kv_cache_destroy(kv);
    kvp_model_destroy(m);
}

/* kvp_model_run: every task of every run runs exactly once, with the run's own argument, for task counts
 * going up and down (workers made during a run, workers left without a task, the cap at 64). */
typedef struct {
    int count[80];
    int run_id;
    int wrong_run;
} run_probe;

static void probe_task(void *arg, int i)
{
    run_probe *p = arg;
    __atomic_add_fetch(&p->count[i], 1, __ATOMIC_RELAXED);
    if (p->run_id < 0) __atomic_add_fetch(&p->wrong_run, 1, __ATOMIC_RELAXED);
}

Test(model, run_runs_every_task_once)
{
    kvp_model *m = tu_load(S260_GGUF);
    const int ns[] = {1, 2, 3, 2, 8, 1, 5, 64, 70, 4, 2};
    for (int rep = 0; rep < 50; rep++)
        for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
            run_probe p;
            memset(&p, 0, sizeof p);
            p.run_id = (int)c;
            kvp_model_run(m, ns[c], probe_task, &p);
            const int n = ns[c] < 64 ? ns[c] : 64;
            for (int i = 0; i < 80; i++)
                cr_assert_eq(p.count[i], i < n ? 1 : 0, "rep %d run of %d tasks: task %d ran %d times", rep, ns[c], i,
                             p.count[i]);
            cr_assert_eq(p.wrong_run, 0);
        }
    kvp_model_destroy(m);
}

/* Every weight type, on 8 lanes then 16 where the CPU has AVX-512F: batches go through the row tiles (8
 * lanes: 6, 4, 2..3 rows; 16: 12, 8, 4, 1..3), a single row through several panels at once, each widening
 * 16-bit and Q8_0 panels in registers (w_down, whose 172 inputs are not a multiple of 32, stays f32 under
 * q8_0); the two lane counts give the same bits. */
Test(model, invariant_rows_bit_identical_for_every_batch_size)
{
    tu_require_shared();
    static float ref[40 * 512];
    for (kvp_weight_type wt = KVP_WEIGHT_F32; wt <= KVP_WEIGHT_Q8_0; wt++) {
        kvp_model *m;
        cr_assert_eq(kvp_model_load_ex(S260_GGUF, NULL, wt, &m), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_model_lanes(m), kvp_cpu_max_lanes(), "a load takes the widest matmul the CPU has");
        cr_assert_eq(kvp_model_set_lanes(m, 4), KVP_EINVAL);
        int have_ref = 0;
        for (int lanes = 8; lanes <= 16; lanes *= 2) {
            if (lanes > kvp_cpu_max_lanes()) {
                cr_assert_eq(kvp_model_set_lanes(m, lanes), KVP_EUNSUPPORTED);
                cr_log_info("this CPU lacks AVX-512F: the 16-lane matmul is not compared with the 8-lane one");
                continue;
            }
            cr_assert_eq(kvp_model_set_lanes(m, lanes), KVP_OK);
            char what[64];
            snprintf(what, sizeof what, "%s weights, %d lanes", kvp_weight_type_name(wt), lanes);
            tu_expect_batch_invariant(m, what, ref, &have_ref);
        }
        kvp_model_destroy(m);
    }
}

/* kvp_model_set_skip_attention (bench generate's --skip-attention): the same token at the same position
 * after two different histories gives different logits through attention, the same ones with it skipped
 * (nothing but the token and its position reaches the row); off again, attention is back. */
Test(model, skip_attention_cuts_the_history_out)
{
    tu_require_shared();
    kvp_model *m;
    cr_assert_eq(kvp_model_load(S260_GGUF, &m), KVP_OK, "%s", kvp_error_detail());
    static const int32_t h1[5] = {1, 403, 407, 261, 300}, h2[5] = {1, 378, 286, 376, 300};
    static float a[5 * 512], b[5 * 512], c[5 * 512];
    const float *la = a + 4 * 512, *lb = b + 4 * 512, *lc = c + 4 * 512; /* the last rows */
    const size_t row = sizeof(float) * 512;
    cr_assert_eq(tu_forward_tokens5(m, h1, a), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(tu_forward_tokens5(m, h2, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(la, lb, row) != 0, "attention: the history moves the last row's logits");
    kvp_model_set_skip_attention(m, 1);
    cr_assert_eq(tu_forward_tokens5(m, h1, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(tu_forward_tokens5(m, h2, c), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(lb, lc, row) == 0, "skipped: the history does not reach the last row");
    cr_assert(memcmp(la, lb, row) != 0, "skipped: the logits are not the model's");
    kvp_model_set_skip_attention(m, 0);
    cr_assert_eq(tu_forward_tokens5(m, h1, b), KVP_OK, "%s", kvp_error_detail());
    cr_assert(memcmp(la, lb, row) == 0, "attention back on: the model's logits again");
    kvp_model_destroy(m);
}
