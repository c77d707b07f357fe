/* The same model stored in other weight types (converted here): GGUF F16, Q8_0 and Q4_0, HF F16 and BF16
 * track the f32 logits, and each held as stored (or as q8_0) gives the logits of its f32 load bit for bit. */
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

/* The file at path loaded with its matrices held as `wt` (kvp_model_load_ex) gives the logits of m bit for
 * bit, with either matmul: m is its f32 tu_load, and the values held are the file's, widened in registers
 * (Q8_0: d * q, exact in f32, as the f32 tu_load dequantizes them). `want` is the type the tu_load reports. */
static void expect_same_logits(const char *path, kvp_model *m, kvp_weight_type wt, kvp_weight_type want)
{
    kvp_model *h;
    cr_assert_eq(kvp_model_load_ex(path, NULL, wt, &h), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_model_weight_type(h), want, "%s held as %s: reports %s, not %s", path, kvp_weight_type_name(wt),
                 kvp_weight_type_name(kvp_model_weight_type(h)), kvp_weight_type_name(want));
    float a[5 * 512], b[5 * 512];
    for (int blas = 0; blas < 2; blas++) {
        kvp_model_set_matmul(m, blas ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
        kvp_model_set_matmul(h, blas ? KVP_MATMUL_BLAS : KVP_MATMUL_INVARIANT);
        tu_logits_of(m, a);
        tu_logits_of(h, b);
        for (int i = 0; i < 5 * 512; i++)
            cr_assert_eq(b[i], a[i], "%s held as %s, %s: logit %d: %g vs %g", path, kvp_weight_type_name(wt),
                         blas ? "blas" : "invariant", i, b[i], a[i]);
    }
    kvp_model_set_matmul(m, KVP_MATMUL_INVARIANT);
    kvp_model_destroy(h);
}

/* expect_same_logits held as wt, and held as stored (auto), which reports auto_wt. */
static void expect_held_as_stored(const char *path, kvp_model *m, kvp_weight_type wt, kvp_weight_type auto_wt)
{
    expect_same_logits(path, m, wt, wt);
    expect_same_logits(path, m, KVP_WEIGHT_AUTO, auto_wt);
}

Test(model, gguf_f16_and_q8_0_weights_track_f32)
{
    tu_require_shared();
    kvp_model *ref = tu_load(S260_GGUF);
    float want[5 * 512], got[5 * 512];
    tu_logits_of(ref, want);
    const char *dir = tu_tmpdir();
    for (int q8 = 0; q8 < 2; q8++) {
        char path[400];
        snprintf(path, sizeof path, "%s/s260_%s.gguf", dir, q8 ? "q8_0" : "f16");
        tu_write_quantized_gguf(path, q8 ? TU_QQ8_0 : TU_QF16);
        kvp_model *m = tu_load(path);
        tu_logits_of(m, got);
        double e = tu_max_rel(got, want, 5 * 512);
        /* f16 keeps ~3 decimal digits per weight, q8_0 ~2: the logits move but the argmax does not */
        cr_assert_lt(e, q8 ? 0.25 : 0.03, "%s: max relative logit error %g", path, e);
        cr_assert_gt(e, 0.0, "%s: the conversion changed nothing?", path);
        for (int r = 0; r < 5; r++) cr_assert_eq(kvp_argmax(got + r * 512, 512), kvp_argmax(want + r * 512, 512));
        /* auto: Q8_0 and F16 matrices (inputs not a multiple of 32) held side by side, reported as auto */
        expect_held_as_stored(path, m, q8 ? KVP_WEIGHT_Q8_0 : KVP_WEIGHT_F16, q8 ? KVP_WEIGHT_AUTO : KVP_WEIGHT_F16);
        kvp_model_destroy(m);
    }
    kvp_model_destroy(ref);
}

/* auto holds an f32 file in f32, and GGUF's other quantized types as q8_0: the logits of an explicit q8_0
 * tu_load, bit for bit (the Q4_0 matrices dequantized, then quantized to Q8_0 the same way; the F16 ones, whose
 * inputs are not a multiple of 32, exact in f16 under auto and in f32 under q8_0). */
Test(model, auto_weights_keep_f32_and_hold_other_quant_types_as_q8_0)
{
    tu_require_shared();
    kvp_model *f32 = tu_load(S260_GGUF);
    expect_same_logits(S260_GGUF, f32, KVP_WEIGHT_AUTO, KVP_WEIGHT_F32);
    kvp_model_destroy(f32);
    char path[400];
    snprintf(path, sizeof path, "%s/s260_q4_0.gguf", tu_tmpdir());
    tu_write_quantized_gguf(path, TU_QQ4_0);
    kvp_model *q8;
    cr_assert_eq(kvp_model_load_ex(path, NULL, KVP_WEIGHT_Q8_0, &q8), KVP_OK, "%s", kvp_error_detail());
    expect_same_logits(path, q8, KVP_WEIGHT_AUTO, KVP_WEIGHT_AUTO);
    /* and Q4_0 is really what was read: the f32 tu_load differs from the q8_0 one */
    kvp_model *q4 = tu_load(path);
    float a[5 * 512], b[5 * 512];
    tu_logits_of(q4, a);
    tu_logits_of(q8, b);
    cr_assert_gt(tu_max_rel(a, b, 5 * 512), 0.0);
    kvp_model_destroy(q4);
    kvp_model_destroy(q8);
}

/* Rewrites the HF safetensors in F16 or BF16 (config.json copied); loads each as f32 and with its matrices
 * in 16 bits. */
Test(model, hf_f16_and_bf16_safetensors_track_f32)
{
    tu_require_shared();
    kvp_model *ref = tu_load(S260_HF);
    float want[5 * 512], got[5 * 512];
    tu_logits_of(ref, want);
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    for (int bf = 0; bf < 2; bf++) {
        const char *dir = tu_tmpdir();
        char p[400];
        size_t n;
        unsigned char *cfg = tu_read_all(S260_HF "/config.json", &n);
        snprintf(p, sizeof p, "%s/config.json", dir);
        tu_write_all(p, cfg, n);
        free(cfg);
        tu_buf hdr = {0}, data = {0};
        tu_put(&hdr, "{", 1);
        for (int64_t i = 0; i < kvp_st_num_tensors(s); i++) {
            kvp_tensor_view v;
            kvp_st_tensor_at(s, i, &v);
            float *f = malloc(sizeof(float) * (size_t)v.numel);
            kvp_tensor_to_f32(&v, f);
            char e[400];
            int m = v.ndim == 2 ? snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                           i ? "," : "", v.name, bf ? "BF16" : "F16", (long long)v.shape[0],
                                           (long long)v.shape[1], data.n, data.n + 2 * (size_t)v.numel)
                                : snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                           i ? "," : "", v.name, bf ? "BF16" : "F16", (long long)v.shape[0], data.n,
                                           data.n + 2 * (size_t)v.numel);
            tu_put(&hdr, e, (size_t)m);
            for (int64_t j = 0; j < v.numel; j++) {
                uint16_t h = bf ? kvp_wt_f32_to_bf16(f[j]) : kvp_wt_f32_to_f16(f[j]);
                tu_put(&data, &h, 2);
            }
            free(f);
        }
        tu_put(&hdr, "}", 1);
        tu_buf file = {0};
        tu_u64(&file, hdr.n);
        tu_put(&file, hdr.p, hdr.n);
        tu_put(&file, data.p, data.n);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        tu_write_all(p, file.p, file.n);
        free(file.p), free(hdr.p), free(data.p);
        kvp_model *m = tu_load(dir);
        tu_logits_of(m, got);
        double e = tu_max_rel(got, want, 5 * 512);
        cr_assert_lt(e, bf ? 0.2 : 0.03, "%s: max relative logit error %g", bf ? "bf16" : "f16", e);
        cr_assert_gt(e, 0.0);
        for (int r = 0; r < 5; r++) cr_assert_eq(kvp_argmax(got + r * 512, 512), kvp_argmax(want + r * 512, 512));
        expect_held_as_stored(dir, m, bf ? KVP_WEIGHT_BF16 : KVP_WEIGHT_F16, bf ? KVP_WEIGHT_BF16 : KVP_WEIGHT_F16);
        kvp_model_destroy(m);
    }
    kvp_st_close(s);
    kvp_model_destroy(ref);
}
