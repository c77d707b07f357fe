/* RoPE variants: llama3 scaling (config.json and GGUF rope_freqs), linear, YaRN and dynamic scaling against
 * scripts/rope-reference.py and from both formats, partial rotary embeddings, LongRoPE, and the rope_scaling
 * configs that are refused. */
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

/* llama3 rope scaling in its two forms agree: an HF folder whose config.json has rope_scaling (factor 8,
 * original context 2000: of stories260K's 4 frequencies, wavelengths 6.3, 63, 628 and 6283 tokens, two
 * are untouched, one is in the smoothed band and one is divided by 8) and the GGUF with llama.cpp's
 * rope_freqs.weight, the factors computed here as llama.cpp's converter does. Factors of 1 change nothing;
 * these change the 256-token story. */
Test(model, gguf_rope_freqs_match_hf_llama3_rope_scaling)
{
    const double factor = 8, lo = 1, hi = 4, orig = 2000;
    float ff[4], ones[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; i++) {
        const double wl = 2 * M_PI * pow(10000.0, i / 4.0);
        if (wl < orig / hi) ff[i] = 1;
        else if (wl > orig / lo) ff[i] = (float)factor;
        else {
            const double smooth = (orig / wl - lo) / (hi - lo);
            ff[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    cr_assert(ff[0] == 1 && ff[1] == 1 && ff[2] > 1 && ff[2] < 8 && ff[3] == 8, "%g %g %g %g", ff[0], ff[1], ff[2],
              ff[3]);
    const char *hf = tu_hf_copy("\"rope_scaling\": null",
                             "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 2000}",
                             NULL, NULL);
    const int32_t bos = 1, steps = 256;
    int32_t want[256], got[256], plain[256];
    kvp_model *m = tu_load(hf);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, want);
    kvp_model_destroy(m);
    m = tu_load(tu_gguf_with_rope_freqs(ff));
    tu_greedy_one(m, 16, &bos, 1, steps, 0, got);
    kvp_model_destroy(m);
    for (int i = 0; i < steps; i++)
        cr_assert_eq(got[i], want[i], "token %d: GGUF rope_freqs %d, HF rope_scaling %d", i, got[i], want[i]);
    m = tu_load(tu_gguf_with_rope_freqs(ones));
    tu_check_golden(m, 16, 0);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += plain[i] != want[i];
    cr_assert_gt(differ, 0, "llama3 scaling must change the story");
    float bad[4] = {1, 0, 1, 1};
    kvp_model *none = NULL;
    cr_assert_eq(kvp_model_load(tu_gguf_with_rope_freqs(bad), &none), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "rope_freqs.weight[1]"), "%s", kvp_error_message());
}

/* kvp_rope_frequencies against scripts/rope-reference.py, which computes YaRN, linear and dynamic scaling from
 * their published definitions (the YaRN paper, Hugging Face's _compute_yarn_parameters), not from this code.
 * The configs are parsed from JSON (Qwen3-8B's with rope_scaling replaced, and head_dim and theta replaced when
 * given), so the rope_scaling fields' defaults (beta_fast 32, beta_slow 1, truncate) are the parser's. */
static void rope_of(const char *rope_scaling, int32_t head_dim, double theta, kvp_model_config *c, double *inv,
                    double *scale)
{
    cJSON *root;
    cr_assert_eq(kvp_json_parse_file("../shared/data/configs/Qwen3-8B.json", &root), KVP_OK, "%s",
                 kvp_error_detail());
    cJSON_ReplaceItemInObject(root, "rope_scaling", cJSON_Parse(rope_scaling));
    cr_assert_eq(kvp_model_config_from_json(root, "Qwen3-8B.json", c), KVP_OK, "%s", kvp_error_detail());
    cJSON_Delete(root);
    if (head_dim) c->head_dim = c->rotary_dim = head_dim, c->rope_theta = theta;
    kvp_rope_frequencies(c, kvp_model_config_context(c), inv, scale);
}

static void expect_rel(double got, double want, const char *what, int i)
{
    cr_assert(fabs(got - want) <= 1e-12 * fabs(want), "%s[%d]: %.17g, the reference %.17g", what, i, got, want);
}

Test(model, rope_frequencies_match_the_reference)
{
    kvp_model_config c;
    double inv[128], scale;
    /* Qwen3-8B (head_dim 128, theta 1e6) with its model card's YaRN: dimensions 0-23 keep their frequency,
     * 24-39 are on the ramp, 40 and up are divided by 4 */
    rope_of("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}", 0, 0, &c,
            inv, &scale);
    const int at[] = {0, 20, 23, 24, 30, 35, 39, 40, 63};
    const double want[] = {1.0, 0.01333521432163324, 0.006978305848598663, 0.005375321490790102,
                           0.001064360981247002, 0.0002462584069089387, 6.490394320837029e-05,
                           4.445698525097307e-05, 3.102344401879299e-07};
    for (int k = 0; k < 9; k++) expect_rel(inv[at[k]], want[k], "qwen3 yarn", at[k]);
    expect_rel(scale, 1.138629436111989, "qwen3 yarn scale", 0);
    /* stories260K's shape (head_dim 8, theta 1e4), 128 original positions: pair 1 is half-way up the ramp;
     * without truncation the ramp starts at dimension -0.196 and ends at 1.309 */
    rope_of("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}", 8, 10000, &c,
            inv, &scale);
    const double yarn8[] = {1.0, 0.0625, 0.0025, 0.00025}, untrunc8[] = {1.0, 0.04270567198866974, 0.0025, 0.00025};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], yarn8[i], "yarn 8", i);
    c.rope_truncate = 0;
    kvp_rope_frequencies(&c, kvp_model_config_context(&c), inv, &scale);
    for (int i = 0; i < 4; i++) expect_rel(inv[i], untrunc8[i], "yarn 8 untruncated", i);
    /* attention_factor replaces the default scale; DeepSeek's mscale / mscale_all_dim make it their ratio */
    rope_of("{\"type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 0.75}", 0, 0, &c, inv, &scale);
    cr_assert_eq(scale, 0.75);
    rope_of("{\"type\": \"yarn\", \"factor\": 40.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}", 0, 0, &c, inv,
            &scale);
    expect_rel(scale, (0.1 * log(40.0) + 1) / (0.05 * log(40.0) + 1), "mscale ratio", 0);
    rope_of("{\"rope_type\": \"linear\", \"factor\": 2.0}", 8, 10000, &c, inv, &scale);
    const double lin8[] = {0.5, 0.05, 0.005, 0.0005};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], lin8[i], "linear 8", i);
    cr_assert_eq(scale, 1.0);
    /* dynamic NTK at twice the context: the base grows 3^(8/6) times */
    rope_of("{\"rope_type\": \"dynamic\", \"factor\": 2.0}", 8, 10000, &c, inv, &scale);
    const double dyn8[] = {1.0, 0.06933612743506347, 0.004807498567691361, 0.0003333333333333334};
    for (int i = 0; i < 4; i++) expect_rel(inv[i], dyn8[i], "dynamic 8", i);
    cr_assert_eq(scale, 1.0);
}

/* Linear and YaRN scaling give the same 256-token story from config.json's rope_scaling and from GGUF's
 * rope.scaling keys (each with its own RoPE convention), another story than the model's own, and the
 * longer context vLLM derives (linear, dynamic: context x factor; yarn: original context x factor). */
Test(model, rope_scaling_linear_and_yarn_from_both_formats)
{
    tu_require_shared();
    const int32_t bos = 1, steps = 256;
    int32_t plain[256], hf[256], gg[256];
    kvp_model *m = tu_load(S260_GGUF);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    const struct {
        const char *json, *type;
        float factor, attn;
        uint32_t orig;
        int32_t max_hf, max_gguf;
        int legacy; /* the factor as rope.scale_linear, no type */
    } cases[] = {
        {"{\"rope_type\": \"linear\", \"factor\": 2.0}", "linear", 2, 0, 0, 1024, 4096, 0},
        {"{\"rope_type\": \"linear\", \"factor\": 2.0}", NULL, 2, 0, 0, 1024, 4096, 1},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}", "yarn", 4, 0, 128,
         512, 512, 0},
        /* GGUF's attn_factor multiplies the default 0.1 ln 4 + 1; HF's attention_factor replaces it */
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128, "
         "\"attention_factor\": 1.5}", "yarn", 4, (float)(1.5 / (0.1 * log(4.0) + 1)), 128, 512, 512, 0},
    };
    int32_t first_yarn[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char to[300];
        snprintf(to, sizeof to, "\"rope_scaling\": %s", cases[k].json);
        m = tu_load(tu_hf_copy("\"rope_scaling\": null", to, NULL, NULL));
        cr_assert_eq(kvp_model_max_len(m), cases[k].max_hf, "case %zu", k);
        tu_greedy_one(m, 16, &bos, 1, steps, 0, hf);
        kvp_model_destroy(m);
        tu_buf kvs = {0};
        uint64_t n = 0;
        if (cases[k].legacy) {
            tu_kv_f32(&kvs, "llama.rope.scale_linear", cases[k].factor), n++;
        } else {
            tu_kv_str(&kvs, "llama.rope.scaling.type", cases[k].type), n++;
            tu_kv_f32(&kvs, "llama.rope.scaling.factor", cases[k].factor), n++;
        }
        if (cases[k].orig) tu_kv_u32(&kvs, "llama.rope.scaling.original_context_length", cases[k].orig), n++;
        if (cases[k].attn > 0) tu_kv_f32(&kvs, "llama.rope.scaling.attn_factor", cases[k].attn), n++;
        m = tu_load(tu_gguf_with_kvs("scaled.gguf", &kvs, n));
        free(kvs.p);
        cr_assert_eq(kvp_model_max_len(m), cases[k].max_gguf, "case %zu", k);
        tu_greedy_one(m, 16, &bos, 1, steps, 0, gg);
        kvp_model_destroy(m);
        int differ = 0, differ_yarn = 0;
        for (int i = 0; i < steps; i++) {
            cr_assert_eq(gg[i], hf[i], "case %zu, token %d: GGUF %d, HF %d", k, i, gg[i], hf[i]);
            differ += plain[i] != hf[i];
            differ_yarn += k == 3 && first_yarn[i] != hf[i];
        }
        cr_assert_gt(differ, 0, "case %zu: the scaling must change the story", k);
        if (k == 2) memcpy(first_yarn, hf, sizeof hf);
        if (k == 3) cr_assert_gt(differ_yarn, 0, "the attention factor must change the story");
    }
    /* dynamic (config.json only: GGUF has no such type): twice the context, another story */
    m = tu_load(tu_hf_copy("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}", NULL,
                     NULL));
    cr_assert_eq(kvp_model_max_len(m), 1024);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, hf);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += plain[i] != hf[i];
    cr_assert_gt(differ, 0, "dynamic scaling must change the story");
}

Test(model, unsupported_or_impossible_rope_scaling_is_rejected)
{
    tu_require_shared();
    const struct {
        const char *json, *names;
        kvp_status st;
    } hf_cases[] = {
        {"{\"rope_type\": \"mrope\", \"factor\": 2.0}", "'mrope' is not supported", KVP_EUNSUPPORTED},
        {"{\"rope_type\": \"longrope\", \"factor\": 2.0}", "\"long_factor\" must be an array", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1], \"short_factor\": [1, 1, 1], "
         "\"original_max_position_embeddings\": 128}", "\"long_factor\" has 3 factors", KVP_EPARSE},
        {"{\"type\": \"su\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 0, 1, 1], "
         "\"original_max_position_embeddings\": 128}", "\"short_factor\"[1] = 0", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 1, 1]}",
         "\"long_factor\" has 4 entries and \"short_factor\" 3", KVP_EPARSE},
        {"{\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 1], \"short_factor\": [1, 1, 1, 1]}",
         "\"original_max_position_embeddings\"", KVP_EPARSE},
        {"{\"rope_type\": \"linear\", \"factor\": 0.5}", "rope_scaling.factor", KVP_EPARSE},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": -32}", "beta_fast -32", KVP_EPARSE},
        {"{\"rope_type\": \"yarn\", \"factor\": \"4\"}", "\"factor\" must be a number", KVP_EPARSE},
    };
    for (size_t k = 0; k < sizeof hf_cases / sizeof hf_cases[0]; k++) {
        char to[300], cfg[400];
        snprintf(to, sizeof to, "\"rope_scaling\": %s", hf_cases[k].json);
        const char *dir = tu_hf_copy("\"rope_scaling\": null", to, NULL, NULL);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        tu_expect_load_error(dir, hf_cases[k].st, cfg, hf_cases[k].names, NULL, hf_cases[k].json);
    }
    const struct {
        const char *type; /* NULL: no type key */
        float factor;     /* 0: no factor key */
        const char *n1, *n2;
        kvp_status st;
    } gguf_cases[] = {
        {"longrope", 0, "rope_factors_long.weight", "0 factors", KVP_EPARSE}, /* the type without its factors */
        {"yarn", -2, "llama.rope.scaling.factor", "-2", KVP_EPARSE},
        {NULL, NAN, "llama.rope.scaling.factor", "nan", KVP_EPARSE},
    };
    tu_buf kvs = {0};
    for (size_t k = 0; k < sizeof gguf_cases / sizeof gguf_cases[0]; k++) {
        kvs.n = 0;
        uint64_t n = 0;
        if (gguf_cases[k].type) tu_kv_str(&kvs, "llama.rope.scaling.type", gguf_cases[k].type), n++;
        if (gguf_cases[k].factor != 0) tu_kv_f32(&kvs, "llama.rope.scaling.factor", gguf_cases[k].factor), n++;
        const char *p = tu_gguf_with_kvs("bad_rope.gguf", &kvs, n);
        tu_expect_load_error(p, gguf_cases[k].st, p, gguf_cases[k].n1, gguf_cases[k].n2, gguf_cases[k].n1);
    }
    /* type "none" with no factor: the model's own story */
    kvs.n = 0;
    tu_kv_str(&kvs, "llama.rope.scaling.type", "none");
    kvp_model *m = tu_load(tu_gguf_with_kvs("none.gguf", &kvs, 1));
    tu_check_golden(m, 16, 0);
    kvp_model_destroy(m);
    free(kvs.p);
}

/* Partial rotary embeddings (Phi-4-mini's partial_rotary_factor, GGUF's rope.dimension_count): with 4 of 8
 * dimensions rotated, pairs (0, 2) and (1, 3) turn at 1 and 10000^(-1/2) radians a position and dimensions 4-7
 * do not turn. That is the full-rotary model whose pairs (0, 4) and (1, 5) turn at those rates (GGUF's
 * rope_freqs.weight divides 10000^(-1/4) by 10) and (2, 6), (3, 7) not at all (divided by 1e30), once each
 * head's dimensions are reordered so that the pairs line up: the same scores, the same 256-token story.
 * config.json's partial_rotary_factor 0.5 gives the same story as the GGUF key. */
Test(model, partial_rotary_matches_full_rotary_with_still_pairs)
{
    tu_require_shared();
    const float freqs[4] = {1, 10, 1e30f, 1e30f};
    const int perm[8] = {0, 1, 4, 5, 2, 3, 6, 7};
    const int32_t bos = 1, steps = 256;
    int32_t full[256], part[256], hf[256], plain[256];
    kvp_model *m = tu_load(tu_phi3_model(&(phi3_spec){.gguf = 1, .rot = 8, .freqs = freqs}));
    tu_greedy_one(m, 16, &bos, 1, steps, 0, full);
    kvp_model_destroy(m);
    m = tu_load(tu_phi3_model(&(phi3_spec){.gguf = 1, .rot = 4, .perm = perm}));
    cr_assert_eq(kvp_model_cfg(m)->rotary_dim, 4);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, part);
    kvp_model_destroy(m);
    m = tu_load(tu_phi3_model(&(phi3_spec){.gguf = 0, .perm = perm, .cfg_add = ", \"partial_rotary_factor\": 0.5"}));
    cr_assert_eq(kvp_model_cfg(m)->rotary_dim, 4);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, hf);
    kvp_model_destroy(m);
    m = tu_load(S260_GGUF);
    tu_greedy_one(m, 16, &bos, 1, steps, 0, plain);
    kvp_model_destroy(m);
    int differ = 0;
    for (int i = 0; i < steps; i++) {
        cr_assert_eq(part[i], full[i], "token %d: partial rotary %d, full rotary with still pairs %d", i, part[i],
                     full[i]);
        cr_assert_eq(hf[i], part[i], "token %d: config.json %d, GGUF %d", i, hf[i], part[i]);
        differ += part[i] != plain[i];
    }
    cr_assert_gt(differ, 0, "rotating half the dimensions must change the story");
}

/* LongRoPE against the reference script on Phi-3.5-mini's own config.json: its 48 long factors served past
 * the original 4,096 tokens, its short ones within them, and the attention factor sqrt(1 + ln 32 / ln 4096). */
Test(model, longrope_frequencies_match_the_reference)
{
    kvp_model_config c;
    cr_assert_eq(kvp_model_config_load("../shared/data/configs/derived/phi-3_5.json", &c), KVP_OK, "%s",
                 kvp_error_detail());
    cr_assert_str_eq(c.rope_scaling_type, "longrope");
    cr_assert_eq(c.rope_n_factors, 48);
    cr_assert_eq(c.rope_original_max_position, 4096);
    double inv[48], scale;
    const int at[] = {0, 1, 2, 10, 20, 30, 47};
    const double lng[] = {0.9259258891329368, 0.7436073645320989, 0.5976246294798686, 0.030642991217357887,
                          0.0006610722392653191, 5.0507545706277315e-05, 1.8684881663397117e-06};
    const double shrt[] = {1.0, 0.8092198046104523, 0.6614486291088916, 0.13343630862516817,
                           0.011645594269833658, 0.0015654841897367014, 4.2659433051390916e-05};
    kvp_rope_frequencies(&c, kvp_model_config_context(&c), inv, &scale);
    cr_assert_eq(kvp_model_config_context(&c), 131072);
    for (int k = 0; k < 7; k++) expect_rel(inv[at[k]], lng[k], "phi3.5 long", at[k]);
    expect_rel(scale, 1.1902380714238083, "phi3.5 scale", 0);
    kvp_rope_frequencies(&c, 4096, inv, &scale);
    for (int k = 0; k < 7; k++) expect_rel(inv[at[k]], shrt[k], "phi3.5 short", at[k]);
    expect_rel(scale, 1.1902380714238083, "phi3.5 short scale", 0);
}

/* LongRoPE in a model: with the attention factor 1, long factors (1, 2, 4, 8) are llama.cpp's rope_freqs
 * divisors (1, 2, 4, 8) on the same weights, so the phi3 story is that GGUF's; served within the original 128
 * tokens (--max-model-len 128) the short factors (all 1) give the model's own story. config.json's
 * rope_scaling and GGUF's factor tensors and keys agree, with the attention factor given and by default. */
Test(model, longrope_follows_the_served_context_in_both_formats)
{
    tu_require_shared();
    const int32_t bos = 1, steps = 256;
    const float lf[4] = {1, 2, 4, 8}, sf[4] = {1, 1, 1, 1};
    int32_t want[256], plain[128], got[256], dflt[256];
    kvp_model *m = tu_load(tu_gguf_with_rope_freqs(lf));
    tu_greedy_one(m, 16, &bos, 1, steps, 0, want);
    kvp_model_destroy(m);
    m = tu_load(S260_GGUF);
    tu_greedy_one(m, 16, &bos, 1, 128, 0, plain);
    kvp_model_destroy(m);
    tu_buf kvs = {0};
    for (int attn = 0; attn < 2; attn++)
        for (int g = 0; g < 2; g++) {
            char cfg[300];
            snprintf(cfg, sizeof cfg, ", \"original_max_position_embeddings\": 128, \"rope_scaling\": {\"type\": "
                     "\"longrope\", \"long_factor\": [1, 2, 4, 8], \"short_factor\": [1, 1, 1, 1]%s}",
                     attn ? ", \"attention_factor\": 1.0" : "");
            kvs.n = 0;
            tu_kv_u32(&kvs, "phi3.rope.scaling.original_context_length", 128);
            if (attn) tu_kv_f32(&kvs, "phi3.rope.scaling.attn_factor", 1.0f);
            const char *p = tu_phi3_model(&(phi3_spec){.gguf = g, .rot = 8, .cfg_add = cfg, .kvs = &kvs,
                                                    .nkv = 1u + (unsigned)attn, .longf = lf, .shortf = sf});
            if (!g) { /* the rope_scaling added replaces stories260K's null one */
                char cp[400];
                size_t len;
                snprintf(cp, sizeof cp, "%s/config.json", p);
                unsigned char *raw = tu_read_all(cp, &len);
                char *text = calloc(len + 1, 1);
                memcpy(text, raw, len);
                free(raw);
                char *null_rs = strstr(text, "\"rope_scaling\": null,");
                cr_assert_not_null(null_rs);
                memmove(null_rs, null_rs + 21, strlen(null_rs + 21) + 1);
                tu_write_all(cp, text, strlen(text));
                free(text);
            }
            m = tu_load(p);
            cr_assert_str_eq(kvp_model_cfg(m)->rope_scaling_type, "longrope");
            tu_greedy_one(m, 16, &bos, 1, steps, 0, got);
            for (int i = 0; i < steps; i++)
                if (attn) cr_assert_eq(got[i], want[i], "%s token %d: %d, rope_freqs %d", p, i, got[i], want[i]);
                else if (g) cr_assert_eq(got[i], dflt[i], "token %d: GGUF %d, config.json %d", i, got[i], dflt[i]);
            if (!attn && !g) memcpy(dflt, got, sizeof got);
            if (attn) { /* served within the original context: the short factors, all 1 */
                cr_assert_eq(kvp_model_set_max_len(m, 128), KVP_OK);
                tu_greedy_one(m, 16, &bos, 1, 128, 0, got);
                for (int i = 0; i < 127; i++)
                    cr_assert_eq(got[i], plain[i], "%s within 128 tokens, token %d: %d, the model's own %d", p, i,
                                 got[i], plain[i]);
            }
            kvp_model_destroy(m);
        }
    int differ = 0;
    for (int i = 0; i < steps; i++) differ += dflt[i] != want[i];
    cr_assert_gt(differ, 0, "the default attention factor, sqrt(1 + ln 4 / ln 128), must change the story");
    /* one factor tensor without the other */
    kvs.n = 0;
    tu_kv_u32(&kvs, "phi3.rope.scaling.original_context_length", 128);
    const char *p = tu_phi3_model(&(phi3_spec){.gguf = 1, .rot = 8, .kvs = &kvs, .nkv = 1, .longf = lf});
    tu_expect_load_error(p, KVP_EPARSE, p, "rope_factors_long.weight", "rope_factors_short.weight", "one factor tensor");
    free(kvs.p);
}
