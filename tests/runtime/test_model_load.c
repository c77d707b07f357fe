/* Loading a checkpoint that is wrong: errors that name the file and the problem (missing or misshapen
 * tensors, numbers out of range, tensors the config does not use, overlaps), every allocation failing in turn,
 * thousands of random corruptions of GGUF and safetensors headers, and GGUF sampling metadata. */
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

Test(model, load_errors_name_the_problem)
{
    tu_require_shared();
    struct {
        const char *cf, *ct, *tf, *tt;
        kvp_status want;
        const char *needle;
    } cases[] = {
        {"\"llama\"", "\"gpt2\"", NULL, NULL, KVP_EUNSUPPORTED, "gpt2"},
        {"\"num_hidden_layers\": 5", "\"num_hidden_layers\": 6", NULL, NULL, KVP_ENOTFOUND, "model.layers.5"},
        {"\"intermediate_size\": 172", "\"intermediate_size\": 173", NULL, NULL, KVP_EPARSE, "gate_proj"},
        {NULL, NULL, "model.layers.3.mlp.up_proj", "model.layers.3.mlp.xx_proj", KVP_ENOTFOUND, "up_proj"},
        {NULL, NULL, "\"F32\",\"shape\":[64]", "\"F32\",\"shape\":[65]", KVP_EPARSE, "bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = tu_hf_copy(cases[i].cf, cases[i].ct, cases[i].tf, cases[i].tt);
        kvp_model *m = NULL;
        kvp_status st = kvp_model_load(dir, &m);
        cr_assert_eq(st, cases[i].want, "case %zu: %s (%s)", i, kvp_status_str(st), kvp_error_message());
        cr_assert(strstr(kvp_error_message(), cases[i].needle), "case %zu: %s", i, kvp_error_message());
        cr_assert_null(m);
    }
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load("/nonexistent/model.gguf", &m), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "/nonexistent/model.gguf"));
    /* a folder without config.json: the error says what --model takes, and names the folder's GGUF file */
    cr_assert_eq(kvp_model_load(S260_DIR "/", &m), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "stories260K.gguf"), "%s", kvp_error_message());
    cr_assert_eq(kvp_model_load(S260_DIR "/llama2c", &m), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "config.json"), "%s", kvp_error_message());
    cr_assert_null(m);
}

Test(model, load_survives_every_allocation_failure)
{
    tu_require_shared();
    tu_every_alloc_failure("model load", tu_load_model, tu_destroy_model, S260_GGUF, 0);
}

/* ---- random corruption: every mutant either loads and runs, or fails with an error naming its file ---- */

/* Loads a mutant model (and, from a GGUF, its tokenizer); one that loads runs a 5-token prompt, which may
 * fail only with a clear error. Returns 1 when the model loaded. */
static int fz_try(const char *path, const char *file, int gguf, int trial)
{
    kvp_model *m = NULL;
    kvp_status st = kvp_model_load(path, &m);
    if (st != KVP_OK) {
        FZ_FAILED_CLEANLY(st, m, file, trial);
        return 0;
    }
    const int64_t V = kvp_model_cfg(m)->vocab_size;
    if (gguf) {
        kvp_tokenizer *t = NULL;
        st = kvp_tok_load(path, (int32_t)V, &t);
        if (st != KVP_OK) FZ_FAILED_CLEANLY(st, t, file, trial);
        else {
            int32_t *ids = NULL, n = 0;
            char *text = NULL;
            if (kvp_tok_encode(t, "Once upon a time", 16, 1, &ids, &n) == KVP_OK &&
                kvp_tok_decode(t, -1, ids, n, &text) == KVP_OK)
                cr_assert_not_null(text);
            kvp_free(text);
            kvp_free(ids);
            kvp_tok_destroy(t);
        }
    }
    float *logits = malloc(sizeof(float) * 5 * (size_t)V);
    st = tu_forward_prompt5(m, logits);
    cr_assert(st == KVP_OK || kvp_error_message()[0] != '\0', "trial %d: the forward pass failed without a message",
              trial);
    free(logits);
    kvp_model_destroy(m);
    return 1;
}

Test(model, random_corruption_of_gguf_headers_loads_or_fails_cleanly)
{
    tu_require_shared();
    size_t len;
    unsigned char *orig = tu_read_all(S260_GGUF, &len), *c = malloc(len);
    char path[300];
    snprintf(path, sizeof path, "%s/mutant.gguf", tu_tmpdir());
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int loaded = 0;
    const int trials = 3000;
    for (int i = 0; i < trials; i++) {
        tu_write_mutant(path, orig, c, len, 0, S260_GGUF_DATA_START, 1, &rng);
        loaded += fz_try(path, "mutant.gguf", 1, i);
    }
    /* a fifth of the mutants tu_load (their edits hit token strings or scores): both outcomes were tested */
    cr_assert(loaded > 0 && loaded < trials, "%d of %d mutants loaded", loaded, trials);
    free(c);
    free(orig);
}

Test(model, random_corruption_of_safetensors_header_and_config_loads_or_fails_cleanly)
{
    tu_require_shared();
    size_t nst, ncfg;
    unsigned char *st = tu_read_all(S260_HF "/model.safetensors", &nst), *cfg = tu_read_all(S260_HF "/config.json", &ncfg);
    unsigned char *c = malloc(nst > ncfg ? nst : ncfg);
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    cr_assert_lt(hlen, nst);
    const char *dir = tu_tmpdir();
    char stp[300], cfgp[300];
    snprintf(stp, sizeof stp, "%s/model.safetensors", dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    uint64_t rng = 0x2545f4914f6cdd1dull;
    int loaded[2] = {0, 0};
    const int trials = 1500;
    for (int i = 0; i < 2 * trials; i++) {
        const int in_cfg = i % 2; /* alternate: the tensor header, then config.json (the other one intact) */
        if (in_cfg) {
            tu_write_all(stp, st, nst);
            tu_write_mutant(cfgp, cfg, c, ncfg, 0, ncfg, 0, &rng);
        } else {
            tu_write_mutant(stp, st, c, nst, 0, 8 + hlen, 1, &rng);
            tu_write_all(cfgp, cfg, ncfg);
        }
        loaded[in_cfg] += fz_try(dir, dir, 0, i); /* a tensor missing from the folder's files names the folder */
    }
    cr_assert(loaded[0] < trials && loaded[1] < trials, "every mutant loaded: %d, %d", loaded[0], loaded[1]);
    free(c);
    free(cfg);
    free(st);
}

Test(model, hf_config_numbers_out_of_range_are_rejected)
{
    tu_require_shared();
    /* NaN has no JSON spelling (the GGUF test below pours one in); 1e999 parses as infinity. */
    struct {
        const char *from, *to, *field;
    } cases[] = {
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 2", "rms_norm_eps"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e999", "rms_norm_eps"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 0", "rope_theta"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": -10000.0", "rope_theta"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 1e999", "rope_theta"},
        {"\"bos_token_id\": 1", "\"bos_token_id\": 512", "bos_token_id"},
        {"\"eos_token_id\": 2", "\"eos_token_id\": 100000", "eos_token_id"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 1.5", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.1", "partial_rotary_factor"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.1", "partial_rotary_factor"},
        /* 8 x 0.375: 3 rotary dimensions, which do not pair */
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.375", "partial_rotary_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = tu_hf_copy(cases[i].from, cases[i].to, NULL, NULL);
        char cfg[400];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        tu_expect_load_error(dir, KVP_EPARSE, cfg, cases[i].field, NULL, cases[i].to);
    }
}

Test(model, gguf_metadata_out_of_range_is_rejected)
{
    tu_require_shared();
    const float neg = -1.0f, nan = NAN, inf = INFINITY;
    const uint32_t far = 100000, vocab = 512, five = 5, sixteen = 16;
    const char *p = tu_gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &neg, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps -1");
    p = tu_gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &nan, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps NaN");
    p = tu_gguf_variant("eps.gguf", "llama.attention.layer_norm_rms_epsilon", 6, &inf, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "llama.attention.layer_norm_rms_epsilon", NULL, "eps inf");
    p = tu_gguf_variant("bos.gguf", "tokenizer.ggml.bos_token_id", 4, &far, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "tokenizer.ggml.bos_token_id", "100000", "bos 100000");
    p = tu_gguf_variant("eos.gguf", "tokenizer.ggml.eos_token_id", 4, &vocab, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "tokenizer.ggml.eos_token_id", "512", "eos 512");
    /* rotary dimensions: an odd count, or more than a head has */
    p = tu_gguf_variant("rope.gguf", "llama.rope.dimension_count", 4, &five, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "llama.rope.dimension_count", "even", "rope dims 5");
    p = tu_gguf_variant("rope.gguf", "llama.rope.dimension_count", 4, &sixteen, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "llama.rope.dimension_count", "at most the head dimension", "rope dims 16");
    /* 0xFFFFFFFF is "no BOS": loads, without one. */
    const uint32_t none = UINT32_MAX;
    p = tu_gguf_variant("nobos.gguf", "tokenizer.ggml.bos_token_id", 4, &none, NULL, 0);
    kvp_model *m = tu_load(p);
    cr_assert_eq(kvp_model_cfg(m)->bos_token_id, -1);
    cr_assert_eq(kvp_model_cfg(m)->eos_token_id, 2);
    kvp_model_destroy(m);
}

Test(model, tensors_the_config_does_not_use_are_rejected)
{
    tu_require_shared();
    /* Five layers' weights under a four-layer config (HF and GGUF). */
    const char *dir = tu_hf_copy("\"num_hidden_layers\": 5", "\"num_hidden_layers\": 4", NULL, NULL);
    tu_expect_load_error(dir, KVP_EPARSE, "model.layers.4.", "is not used by a 4-layer llama", "model.safetensors",
                      "HF num_hidden_layers 4");
    const uint32_t four = 4;
    const char *p = tu_gguf_variant("four.gguf", "llama.block_count", 4, &four, NULL, 0);
    tu_expect_load_error(p, KVP_EPARSE, p, "'blk.4.", "is not used by a 4-layer llama", "GGUF block_count 4");
    /* A bias the llama config does not ask for (attention_bias false). */
    const char *bias[1] = {"model.layers.2.self_attn.q_proj.bias"};
    const int64_t blen[1] = {64};
    const char *llama = "\"model_type\": \"llama\"";
    dir = tu_hf_variant(llama, llama, bias, blen, 1);
    tu_expect_load_error(dir, KVP_EPARSE, "'model.layers.2.self_attn.q_proj.bias' is not used", "model.safetensors",
                      "(1 unused", "stray bias");
    /* Tied embeddings: no lm_head, the embedding is the classifier (used); untied, lm_head is missing. */
    kvp_model *m = tu_load(S260_HF);
    cr_assert(kvp_model_cfg(m)->tie_word_embeddings);
    kvp_model_destroy(m);
    dir = tu_hf_copy("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", NULL, NULL);
    tu_expect_load_error(dir, KVP_ENOTFOUND, "lm_head.weight", dir, NULL, "untied without lm_head");
    /* HF rotary inv_freq buffers are recomputed from rope_theta: ignored. */
    const char *inv[2] = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                          "model.layers.4.self_attn.rotary_emb.inv_freq"};
    const int64_t ilen[2] = {4, 4};
    dir = tu_hf_variant(llama, llama, inv, ilen, 2);
    m = tu_load(dir);
    kvp_model_destroy(m);
}

Test(model, overlapping_gguf_tensors_are_rejected)
{
    tu_require_shared();
    /* output_norm.weight's 256 bytes moved inside token_embd.weight's 131072. */
    const char *p = tu_gguf_variant("overlap.gguf", NULL, 0, NULL, "output_norm.weight", 128);
    tu_expect_load_error(p, KVP_EPARSE, p, "overlap", "'output_norm.weight'", "overlap");
    cr_assert(strstr(kvp_error_message(), "'token_embd.weight'"), "%s", kvp_error_message());
}

/* GGUF's general.sampling.* keys (llama.cpp's converter writes them from generation_config.json) become the
 * model's default sampling, as an HF folder's generation_config.json does; an impossible value is refused. */
Test(model, gguf_sampling_metadata_gives_the_default_sampling)
{
    tu_require_shared();
    tu_buf kvs = {0};
    tu_kv_f32(&kvs, "general.sampling.temp", 0.5f);
    tu_kv_u32(&kvs, "general.sampling.top_k", 20);
    tu_kv_f32(&kvs, "general.sampling.top_p", 0.75f);
    tu_kv_f32(&kvs, "general.sampling.penalty_repeat", 1.25f);
    kvp_model *m = tu_load(tu_gguf_with_kvs("sampling.gguf", &kvs, 4));
    const kvp_sampling_defaults *d = &kvp_model_cfg(m)->sampling;
    cr_assert_eq(d->given, KVP_SAMPLING_TEMPERATURE | KVP_SAMPLING_TOP_K | KVP_SAMPLING_TOP_P | KVP_SAMPLING_REPETITION);
    cr_assert(d->temperature == 0.5 && d->top_k == 20 && d->top_p == 0.75 && d->repetition_penalty == 1.25);
    kvp_model_destroy(m);
    m = tu_load(S260_GGUF);
    cr_assert_eq(kvp_model_cfg(m)->sampling.given, 0u);
    kvp_model_destroy(m);
    kvs.n = 0;
    tu_kv_f32(&kvs, "general.sampling.top_p", 1.5f);
    const char *p = tu_gguf_with_kvs("bad_sampling.gguf", &kvs, 1);
    tu_expect_load_error(p, KVP_EPARSE, p, "\"general.sampling.top_p\": 1.5 is out of range (0, 1]", NULL, "top_p 1.5");
    free(kvs.p);
}
