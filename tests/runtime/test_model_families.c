/* Model families beyond llama built from stories260K's weights: qwen2 biases, mistral's sliding window,
 * phi3's fused weights, and gemma 1-3 (scaled embedding, (1 + w) norms, GeGLU, post-norms, soft caps, windows)
 * against the float64 reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_testutil.h"
#include "common/alloc.h"
#include "common/json.h"
#include "forward_testutil.h"
#include "model_testutil.h"
#include "reference_testutil.h"
#include "runtime/engine/sampler.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

Test(model, qwen2_bias_and_mistral_window_paths)
{
    tu_require_shared();
    kvp_model *ref = tu_load(S260_HF);
    float want[5 * 512], got[5 * 512];
    tu_logits_of(ref, want);
    kvp_model_destroy(ref);
    /* qwen2 with zero q/k/v biases (q: 64 entries, k/v: 32 under GQA) computes exactly the llama logits */
    char buf[15][96];
    const char *names[15];
    int64_t lens[15];
    for (int l = 0, k = 0; l < 5; l++)
        for (int j = 0; j < 3; j++, k++) {
            snprintf(buf[k], sizeof buf[k], "model.layers.%d.self_attn.%c_proj.bias", l, "qkv"[j]);
            names[k] = buf[k];
            lens[k] = j == 0 ? 64 : 32;
        }
    const char *qwen = "\"model_type\": \"qwen2\", \"use_sliding_window\": false";
    const char *dir = tu_hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 15);
    kvp_model *m = tu_load(dir);
    cr_assert(kvp_model_cfg(m)->attention_bias);
    tu_logits_of(m, got);
    cr_assert_lt(tu_max_rel(got, want, 5 * 512), 1e-6, "qwen2 with zero biases must equal llama");
    kvp_model_destroy(m);
    /* a k bias of the q size is a shape error naming the tensor */
    lens[1] = 64;
    dir = tu_hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 15);
    m = NULL;
    cr_assert_eq(kvp_model_load(dir, &m), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "model.layers.0.self_attn.k_proj.bias"), "%s", kvp_error_message());
    /* a missing bias is named too */
    lens[1] = 32;
    dir = tu_hf_variant("\"model_type\": \"llama\"", qwen, names, lens, 14);
    cr_assert_eq(kvp_model_load(dir, &m), KVP_ENOTFOUND);
    cr_assert(strstr(kvp_error_message(), "model.layers.4.self_attn.v_proj.bias"), "%s", kvp_error_message());
    /* mistral with a 3-token sliding window: positions 0..2 see every key (same logits), 3 and 4 do not */
    dir = tu_hf_variant("\"model_type\": \"llama\"", "\"model_type\": \"mistral\", \"sliding_window\": 3", NULL, NULL, 0);
    m = tu_load(dir);
    cr_assert_eq(kvp_model_cfg(m)->sliding_window, 3);
    tu_logits_of(m, got);
    cr_assert_lt(tu_max_rel(got, want, 3 * 512), 1e-6);
    cr_assert_gt(tu_max_rel(got + 3 * 512, want + 3 * 512, 2 * 512), 1e-3, "the window changed nothing at position 3+");
    kvp_model_destroy(m);
}

/* Both formats of the fused phi3 layout compute stories260K: the golden story, token for token. */
Test(model, phi3_fused_weights_in_both_formats_give_the_golden_story)
{
    tu_require_shared();
    for (int g = 0; g < 2; g++) {
        kvp_model *m = tu_load(tu_phi3_model(&(phi3_spec){.gguf = g, .rot = 8}));
        cr_assert_eq(kvp_model_cfg(m)->family, KVP_FAMILY_PHI3);
        cr_assert_eq(kvp_model_rope_style(m), KVP_ROPE_HALF);
        tu_check_golden(m, 16, 0);
        kvp_model_destroy(m);
    }
}

static double max_rel_d(const double *a, const double *b, int n)
{
    double e = 0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i]) / (fabs(b[i]) + 1.0));
    return e;
}

/* gemma, gemma2 and gemma3 from an HF folder and a GGUF against the float64 reference above. In the HF gemma2
 * and gemma3 cases each feature is set where it changes the logits (checked on the reference: the reference
 * without it differs), so a forward pass that skipped it would fail. */
Test(model, gemma_logits_match_a_float64_reference)
{
    tu_require_shared();
    const gemma_spec specs[] = {
        {.v = 2, .qpas = 32, .attn_cap = 1.5, .final_cap = 8, .window = 3},
        {.gguf = 1, .v = 2, .attn_cap = 1.5, .final_cap = 8, .window = 3},
        {.v = 1},
        {.gguf = 1, .v = 1},
        {.v = 1, .gelu = 1},
        {.v = 3, .qpas = 32, .window = 3, .pattern = 2, .local_theta = 100, .linear = 4},
        {.gguf = 1, .v = 3, .window = 3, .local_theta = 100},
        {.v = 3}, /* Gemma3TextConfig's defaults: window 4096, pattern 6, local base 10,000 */
    };
    static ck_tensor t[128];
    const int32_t toks[5] = {1, 403, 407, 261, 378};
    static double want[5 * 512], other[5 * 512];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        gemma_spec r = specs[i]; /* the model as the reference computes it: r.gguf only picks the sliding layers */
        if (r.gguf) r.qpas = 8;                  /* llama.cpp's 1/sqrt(head_dim) */
        else if (r.v >= 2 && !r.qpas) r.qpas = 256; /* transformers' default */
        r.gguf = 0;
        const int nt = tu_gemma_tensors(&r, t); /* the HF tensors */
        r.gguf = specs[i].gguf;
        ref_gemma_logits(t, nt, &r, toks, 5, want);
        for (int j = 0; j < 5 && r.v >= 2 && !r.gguf && r.window > 0; j++) {
            gemma_spec x = r;
            if (j == 0) x.qpas = 8;
            if (j == 1) x.attn_cap = x.attn_cap > 0 ? 0 : 1.5, x.final_cap = 0;
            if (j == 2) x.window = 0;
            if (j == 3) x.local_theta = 1e4;
            if (j == 4) x.linear = 0;
            if ((j == 3 && r.v != 3) || (j == 4 && !r.linear)) continue;
            ref_gemma_logits(t, nt, &x, toks, 5, other);
            cr_assert_gt(max_rel_d(other, want, 5 * 512), 1e-3, "case %zu: variant %d leaves the logits as they are", i,
                         j);
        }
        for (int j = 0; j < nt; j++) free(t[j].f);
        kvp_model *m = tu_load(tu_gemma_model(&specs[i]));
        const kvp_model_config *c = kvp_model_cfg(m);
        cr_assert_eq(c->family, KVP_FAMILY_GEMMA2, "case %zu", i);
        cr_assert_eq(c->ffn_act, r.gelu ? KVP_ACT_GELU : KVP_ACT_GELU_TANH, "case %zu", i);
        cr_assert_eq(kvp_model_rope_style(m), KVP_ROPE_HALF, "case %zu", i);
        cr_assert_eq(c->qk_norm, r.v == 3, "case %zu", i);
        for (int l = 0; l < 5; l++)
            cr_assert_eq(c->layer_is_sliding[l] && c->sliding_window > 0, tu_gemma_sliding(&r, l), "case %zu layer %d", i,
                         l);
        tu_expect_logits_near(m, want, i);
        kvp_model_destroy(m);
    }
}

/* gemma2 and gemma3 row for row: the same logits alone as in any batch, on 1 and 2 threads. */
Test(model, gemma_rows_bit_identical_for_every_batch_size)
{
    const gemma_spec specs[2] = {{.v = 2, .qpas = 32, .attn_cap = 1.5, .final_cap = 8, .window = 3},
                                 {.v = 3, .window = 3, .pattern = 2, .local_theta = 100}};
    for (int i = 0; i < 2; i++) {
        kvp_model *m = tu_load(tu_gemma_model(&specs[i]));
        static float ref[40 * 512];
        int have_ref = 0;
        tu_expect_batch_invariant(m, i ? "gemma3" : "gemma2", ref, &have_ref);
        kvp_model_destroy(m);
    }
}

/* Defaults as transformers' configs (Gemma2Config: query_pre_attn_scalar 256, caps 50 and 30, null: off;
 * Gemma3TextConfig: no caps, rope_theta 1e6, local base 1e4), and errors that name the field: an activation not
 * computed, a negative cap, in either format. */
Test(model, gemma_config_defaults_and_bad_fields)
{
    kvp_model *m = tu_load(tu_gemma_model(&(gemma_spec){.v = 2}));
    const kvp_model_config *c = kvp_model_cfg(m);
    cr_assert(c->query_pre_attn_scalar == 256 && c->attn_logit_softcapping == 50 && c->final_logit_softcapping == 30);
    cr_assert(c->post_norms && c->rope_local_theta == 0);
    kvp_model_destroy(m);
    m = tu_load(tu_gemma_model(&(gemma_spec){.v = 2, .cfg_extra = ", \"attn_logit_softcapping\": null"}));
    cr_assert(kvp_model_cfg(m)->attn_logit_softcapping == 0 && kvp_model_cfg(m)->final_logit_softcapping == 30);
    kvp_model_destroy(m);
    m = tu_load(tu_gemma_model(&(gemma_spec){.v = 3}));
    c = kvp_model_cfg(m);
    cr_assert(c->attn_logit_softcapping == 0 && c->final_logit_softcapping == 0 && c->rope_local_theta == 1e4);
    cr_assert(c->query_pre_attn_scalar == 256 && c->sliding_window == 4096 && c->post_norms && c->qk_norm);
    kvp_model_destroy(m);
    m = tu_load(tu_gemma_model(&(gemma_spec){.gguf = 1, .v = 3, .window = 7}));
    c = kvp_model_cfg(m);
    cr_assert(c->rope_local_theta == 1e4 && c->query_pre_attn_scalar == 8 && c->sliding_window == 7);
    kvp_model_destroy(m);
    const char *p = tu_gemma_model(&(gemma_spec){.v = 2, .cfg_extra = ", \"hidden_activation\": \"relu\""});
    tu_expect_load_error(p, KVP_EUNSUPPORTED, "config.json", "\"hidden_activation\": \"relu\"", NULL, "relu");
    p = tu_gemma_model(&(gemma_spec){.v = 2, .attn_cap = -2});
    tu_expect_load_error(p, KVP_EINVAL, "config.json", "\"attn_logit_softcapping\": -2", NULL, "negative cap");
    p = tu_gemma_model(&(gemma_spec){.gguf = 1, .v = 2, .final_cap = -3});
    tu_expect_load_error(p, KVP_EPARSE, p, "'gemma2.final_logit_softcapping' = -3", NULL, "negative GGUF cap");
    p = tu_gemma_model(&(gemma_spec){.gguf = 1, .v = 3, .local_theta = -5});
    tu_expect_load_error(p, KVP_EPARSE, p, "'gemma3.rope.freq_base_swa' = -5", NULL, "negative local base");
}

/* A multimodal Gemma 3 folder (Gemma3ForConditionalGeneration): config.json's text_config holds the language
 * model, whose tensors sit under language_model. (transformers before 4.52) or model.language_model. (since),
 * beside a vision tower and a projector. It runs the language model alone: the logits of the same weights as
 * a gemma3_text folder, bit for bit. */
Test(model, gemma3_multimodal_folders_run_their_language_model)
{
    tu_require_shared();
    const gemma_spec sp = {.v = 3, .window = 3, .pattern = 2, .local_theta = 100};
    static float plain[5 * 512], got[5 * 512];
    kvp_model *m = tu_load(tu_gemma_model(&sp));
    cr_assert_eq(tu_forward_prompt5(m, plain), KVP_OK, "%s", kvp_error_detail());
    kvp_model_destroy(m);
    for (int wrap = 1; wrap <= 2; wrap++) {
        static ck_tensor t[128];
        int nt = tu_gemma_tensors(&sp, t);
        for (int i = 0; i < nt; i++) {
            const char *pre = wrap == 1 ? "language_model." : "model.language_model.";
            const char *rest = wrap == 1 ? t[i].name : t[i].name + strlen("model.");
            const size_t a = strlen(pre), b = strlen(rest);
            cr_assert_lt(a + b, sizeof t[i].name);
            memmove(t[i].name + a, rest, b + 1);
            memcpy(t[i].name, pre, a);
        }
        const char *vis[2] = {"vision_tower.vision_model.post_layernorm.weight",
                              "multi_modal_projector.mm_soft_emb_norm.weight"};
        for (int i = 0; i < 2; i++) {
            char n[128];
            snprintf(n, sizeof n, "%s%s", wrap == 2 ? "model." : "", vis[i]);
            ck_add(t, &nt, 0, -1, "", n, 64, 0, calloc(64, sizeof(float)));
        }
        const char *dir = tu_write_checkpoint(
            t, nt,
            &(ck_format){.arch = "gemma3_text",
                         .cfg_add = ", \"sliding_window\": 3, \"sliding_window_pattern\": 2, "
                                    "\"rope_local_base_freq\": 100"});
        char cp[512];
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        size_t len;
        unsigned char *flat = tu_read_all(cp, &len);
        tu_buf wrapped = {0};
        const char head[] = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                            "\"text_config\": ";
        tu_put(&wrapped, head, strlen(head));
        tu_put(&wrapped, flat, len);
        tu_put(&wrapped, "}", 1);
        tu_write_all(cp, wrapped.p, wrapped.n);
        free(flat), free(wrapped.p);
        m = tu_load(dir);
        cr_assert_str_eq(kvp_model_cfg(m)->model_type, "gemma3_text");
        cr_assert_eq(tu_forward_prompt5(m, got), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(memcmp(got, plain, sizeof got), 0, "wrap %d: other logits than the gemma3_text folder's", wrap);
        kvp_model_destroy(m);
    }
}
