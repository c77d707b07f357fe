/* Loader tests: GGUF and safetensors, good files (stories260K, generated F16/BF16/Q8_0, sharded) and
 * corrupted copies made here (truncations, offsets outside the file, bad shapes/dtypes). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "model_testutil.h"
#include "runtime/loader/gguf.h"
#include "runtime/model/model.h"
#include "runtime/loader/safetensors.h"

Test(loaders, gguf_stories260k_metadata_and_tensors)
{
    tu_require_shared();
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_gguf_version(g), 3);
    cr_assert_eq(kvp_gguf_num_tensors(g), 48);
    kvp_tensor_view t;
    cr_assert_eq(kvp_gguf_tensor(g, "token_embd.weight", &t), KVP_OK);
    cr_assert_eq(t.ndim, 2);
    cr_assert_eq(t.shape[0], 512);
    cr_assert_eq(t.shape[1], 64);
    cr_assert_eq(t.dtype, KVP_WT_F32);
    cr_assert_eq(kvp_gguf_tensor(g, "blk.0.attn_k.weight", &t), KVP_OK);
    cr_assert_eq(t.shape[0], 32);
    cr_assert_eq(t.shape[1], 64);
    cr_assert_eq(kvp_gguf_tensor(g, "blk.9.attn_k.weight", &t), KVP_ENOTFOUND);
    cr_assert(strstr(kvp_error_message(), "blk.9.attn_k.weight") && strstr(kvp_error_message(), "stories260K.gguf"));

    kvp_model_config c;
    cr_assert_eq(kvp_gguf_model_config(g, &c), KVP_OK, "%s", kvp_error_detail());
    cr_assert_str_eq(c.model_type, "llama");
    cr_assert_eq(c.num_layers, 5);
    cr_assert_eq(c.hidden_size, 64);
    cr_assert_eq(c.num_q_heads, 8);
    cr_assert_eq(c.num_kv_heads, 4);
    cr_assert_eq(c.head_dim, 8);
    cr_assert_eq(c.intermediate_size, 172);
    cr_assert_eq(c.vocab_size, 512);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.eos_token_id, 2);
    cr_assert_eq(c.tie_word_embeddings, 0); /* this file stores output.weight */
    cr_assert_float_eq(c.rms_norm_eps, 1e-5, 1e-9);
    cr_assert_float_eq(c.rope_theta, 10000.0, 1e-9);

    const kvp_gguf_str *toks;
    uint64_t n;
    cr_assert_eq(kvp_gguf_arr_str(g, "tokenizer.ggml.tokens", &toks, &n), KVP_OK);
    cr_assert_eq(n, 512);
    cr_assert_eq(toks[1].len, 3);
    cr_assert(memcmp(toks[1].ptr, "<s>", 3) == 0);
    float scores[512];
    cr_assert_eq(kvp_gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 512), KVP_OK);
    cr_assert_float_eq(scores[260], -1.0f, 1e-6);
    cr_assert_eq(kvp_gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 511), KVP_EPARSE);
    int64_t iv;
    int present;
    cr_assert_eq(kvp_gguf_get_int(g, "general.architecture", &iv, &present), KVP_EPARSE);
    cr_assert_eq(kvp_gguf_get_int(g, "no.such.key", &iv, &present), KVP_OK);
    cr_assert_eq(present, 0);
    kvp_gguf_close(g);
    kvp_gguf_close(NULL);
}

Test(loaders, gguf_and_safetensors_hold_the_same_embedding)
{
    tu_require_shared();
    kvp_gguf *g;
    kvp_st *s;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_st_num_tensors(s), 48 - 1); /* HF ties the classifier: no lm_head */
    kvp_tensor_view a, b;
    cr_assert_eq(kvp_gguf_tensor(g, "token_embd.weight", &a), KVP_OK);
    cr_assert_eq(kvp_st_tensor(s, "model.embed_tokens.weight", &b), KVP_OK);
    cr_assert_eq(a.numel, b.numel);
    cr_assert_eq(a.shape[0], b.shape[0]);
    cr_assert(memcmp(a.data, b.data, a.nbytes) == 0);
    /* ffn_down is [hidden, intermediate] in both after the GGUF dims are reversed. */
    cr_assert_eq(kvp_gguf_tensor(g, "blk.2.ffn_down.weight", &a), KVP_OK);
    cr_assert_eq(kvp_st_tensor(s, "model.layers.2.mlp.down_proj.weight", &b), KVP_OK);
    cr_assert_eq(a.shape[0], 64);
    cr_assert_eq(a.shape[1], 172);
    cr_assert_eq(b.shape[0], 64);
    cr_assert_eq(b.shape[1], 172);
    cr_assert(memcmp(a.data, b.data, a.nbytes) == 0);
    kvp_gguf_close(g);
    kvp_st_close(s);
}

/* A GGUF with F16, BF16 and Q8_0 tensors written here. */
static void write_small_gguf(const char *path, uint32_t q8_type, uint64_t c_offset_extra)
{
    tu_buf b = {0};
    tu_u32(&b, 0x46554747u);
    tu_u32(&b, 3);
    tu_u64(&b, 3); /* tensors */
    tu_u64(&b, 2); /* kv */
    tu_kv_str(&b, "general.architecture", "test");
    tu_kv_u32(&b, "general.alignment", 32);
    /* a: F16, rows 2 x cols 3 (ne = 3, 2) at 0 */
    tu_str(&b, "a");
    tu_u32(&b, 2);
    tu_u64(&b, 3);
    tu_u64(&b, 2);
    tu_u32(&b, 1);
    tu_u64(&b, 0);
    /* b: Q8_0 (or another type), 1 x 64 at 32 */
    tu_str(&b, "b");
    tu_u32(&b, 1);
    tu_u64(&b, 64);
    tu_u32(&b, q8_type);
    tu_u64(&b, 32);
    /* c: BF16, 4 at 128 */
    tu_str(&b, "c");
    tu_u32(&b, 1);
    tu_u64(&b, 4);
    tu_u32(&b, 30);
    tu_u64(&b, 128 + c_offset_extra);
    tu_pad(&b, 32);
    size_t base = b.n;
    float av[6] = {1.0f, -2.5f, 0.099976f, 65504.0f, -0.0f, 3.0e-5f};
    for (int i = 0; i < 6; i++) {
        uint16_t h = kvp_wt_f32_to_f16(av[i]);
        tu_put(&b, &h, 2);
    }
    tu_pad(&b, 32);
    cr_assert_eq(b.n - base, 32);
    for (int blk = 0; blk < 2; blk++) {
        uint16_t d = kvp_wt_f32_to_f16(blk ? 0.5f : 0.25f);
        tu_put(&b, &d, 2);
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)(j - 16);
            tu_put(&b, &q, 1);
        }
    }
    tu_pad(&b, 32);
    cr_assert_eq(b.n - base, 128);
    float cv[4] = {1.0f, -3.0f, 0.15625f, 1024.0f};
    for (int i = 0; i < 4; i++) {
        uint16_t h = kvp_wt_f32_to_bf16(cv[i]);
        tu_put(&b, &h, 2);
    }
    tu_write_all(path, b.p, b.n);
    free(b.p);
}

Test(loaders, gguf_f16_bf16_q8_0_conversion)
{
    char path[300];
    snprintf(path, sizeof path, "%s/small.gguf", tu_tmpdir());
    write_small_gguf(path, 8, 0);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_OK, "%s", kvp_error_detail());
    kvp_tensor_view t;
    float out[64];
    cr_assert_eq(kvp_gguf_tensor(g, "a", &t), KVP_OK);
    cr_assert_eq(t.shape[0], 2);
    cr_assert_eq(t.shape[1], 3);
    cr_assert_eq(t.dtype, KVP_WT_F16);
    kvp_tensor_to_f32(&t, out);
    cr_assert_float_eq(out[0], 1.0f, 0);
    cr_assert_float_eq(out[1], -2.5f, 0);
    cr_assert_float_eq(out[2], 0.099976f, 1e-4);
    cr_assert_float_eq(out[3], 65504.0f, 0);
    cr_assert(out[4] == 0.0f && signbit(out[4]));
    cr_assert_float_eq(out[5], 3.0e-5f, 1e-7); /* an f16 subnormal */
    cr_assert_eq(kvp_gguf_tensor(g, "b", &t), KVP_OK);
    cr_assert_eq(t.dtype, KVP_WT_Q8_0);
    cr_assert_eq(t.nbytes, 68);
    kvp_tensor_to_f32(&t, out);
    cr_assert_float_eq(out[0], 0.25f * -16, 0);
    cr_assert_float_eq(out[31], 0.25f * 15, 0);
    cr_assert_float_eq(out[32], 0.5f * -16, 0);
    cr_assert_float_eq(out[63], 0.5f * 15, 0);
    cr_assert_eq(kvp_gguf_tensor(g, "c", &t), KVP_OK);
    kvp_tensor_to_f32(&t, out);
    cr_assert_float_eq(out[1], -3.0f, 0);
    cr_assert_float_eq(out[2], 0.15625f, 0);
    cr_assert_float_eq(out[3], 1024.0f, 0);
    kvp_model_config c;
    cr_assert_eq(kvp_gguf_model_config(g, &c), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "'test'"), "%s", kvp_error_message());
    kvp_gguf_close(g);
}

Test(loaders, gguf_rejects_unsupported_type_and_offsets_outside)
{
    const char *dir = tu_tmpdir();
    char path[300];
    snprintf(path, sizeof path, "%s/iq4.gguf", dir);
    write_small_gguf(path, 23 /* IQ4_XS */, 0);
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "IQ4_XS") && strstr(kvp_error_message(), "iq4.gguf"), "%s",
              kvp_error_message());
    cr_assert_null(g);
    snprintf(path, sizeof path, "%s/off.gguf", dir);
    write_small_gguf(path, 8, 4096); /* c points past the end */
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "'c'") && strstr(kvp_error_message(), "past the end"), "%s",
              kvp_error_message());
    snprintf(path, sizeof path, "%s/unaligned.gguf", dir);
    write_small_gguf(path, 8, 2);
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "aligned"), "%s", kvp_error_message());
    snprintf(path, sizeof path, "%s/overlap.gguf", dir);
    write_small_gguf(path, 8, (uint64_t)-64); /* c at 64, inside b's 68 bytes at 32 */
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "overlap") && strstr(kvp_error_message(), "'b'") &&
                  strstr(kvp_error_message(), "'c'") && strstr(kvp_error_message(), "overlap.gguf"),
              "%s", kvp_error_message());
    cr_assert_null(g);
    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "missing.gguf"));
}

/* Every truncation of the header region, and a sample inside the tensor data: always a clean error. */
Test(loaders, gguf_every_truncation_fails_cleanly)
{
    tu_require_shared();
    size_t len;
    unsigned char *all = tu_read_all(S260_GGUF, &len);
    char path[300];
    snprintf(path, sizeof path, "%s/trunc.gguf", tu_tmpdir());
    size_t header_end = S260_GGUF_DATA_START;
    for (size_t cut = 0; cut < len; cut += (cut < header_end ? 1 : 9973)) {
        /* Header region: test every 7th cut plus all cuts near the structure ends (keeps the test fast). */
        if (cut < header_end && cut > 64 && cut % 7 && cut < header_end - 64) continue;
        tu_write_all(path, all, cut);
        kvp_gguf *g = NULL;
        kvp_status st = kvp_gguf_open(path, &g);
        cr_assert_eq(st, KVP_EPARSE, "cut at %zu: status %s", cut, kvp_status_str(st));
        cr_assert(strstr(kvp_error_message(), "trunc.gguf"), "cut %zu: %s", cut, kvp_error_message());
        cr_assert_null(g);
    }
    free(all);
}

static void patch_u64(unsigned char *p, size_t at, uint64_t v) { memcpy(p + at, &v, 8); }

Test(loaders, gguf_corrupt_counts_and_lengths)
{
    tu_require_shared();
    size_t len;
    unsigned char *all = tu_read_all(S260_GGUF, &len);
    unsigned char *c = malloc(len);
    char path[300];
    snprintf(path, sizeof path, "%s/bad.gguf", tu_tmpdir());
    struct {
        size_t at;
        uint64_t v;
        const char *what;
    } cases[] = {
        {8, UINT64_MAX, "tensors"},       /* tensor count */
        {16, 1ull << 40, "metadata"},     /* kv count */
        {24, UINT64_MAX - 3, "metadata"}, /* first key's length */
        {24, 0, "key"},                   /* empty key */
        {57, 1ull << 50, "tokenizer.ggml.tokens"}, /* string array count */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(c, all, len);
        patch_u64(c, cases[i].at, cases[i].v);
        tu_write_all(path, c, len);
        kvp_gguf *g = NULL;
        kvp_status st = kvp_gguf_open(path, &g);
        cr_assert_eq(st, KVP_EPARSE, "case %zu: %s", i, kvp_status_str(st));
        cr_assert_null(g);
    }
    /* A wrong version and a wrong magic. */
    memcpy(c, all, len);
    c[4] = 1;
    tu_write_all(path, c, len);
    kvp_gguf *g = NULL;
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EUNSUPPORTED);
    memcpy(c, all, len);
    c[0] = 'X';
    tu_write_all(path, c, len);
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "magic"));
    free(c);
    free(all);
}

static kvp_status open_gguf(void *path, void **g) { return kvp_gguf_open(path, (kvp_gguf **)g); }
static void close_gguf(void *g) { kvp_gguf_close(g); }
static kvp_status open_st(void *path, void **s) { return kvp_st_open(path, (kvp_st **)s); }
static void close_st(void *s) { kvp_st_close(s); }

Test(loaders, gguf_open_survives_every_allocation_failure)
{
    tu_require_shared();
    tu_every_alloc_failure("gguf open", open_gguf, close_gguf, S260_GGUF, 0);
}

/* ---- safetensors ---- */

/* Writes a safetensors file with the given header text and `data_len` bytes of data (value i*0.5 as f32 or
 * the bytes of `data` when non-NULL). */
static void write_st(const char *path, const char *header, const void *data, size_t data_len)
{
    tu_buf b = {0};
    tu_u64(&b, strlen(header));
    tu_put(&b, header, strlen(header));
    if (data_len) tu_put(&b, data, data_len);
    tu_write_all(path, b.p, b.n);
    free(b.p);
}

Test(loaders, safetensors_f16_bf16_and_bad_headers)
{
    const char *dir = tu_tmpdir();
    char path[300];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    unsigned char data[64] = {0};
    uint16_t h[3] = {kvp_wt_f32_to_f16(1.5f), kvp_wt_f32_to_f16(-2.0f), kvp_wt_f32_to_f16(0.333f)};
    uint16_t bf[2] = {kvp_wt_f32_to_bf16(-7.0f), kvp_wt_f32_to_bf16(0.0078125f)};
    memcpy(data, h, 6);
    memcpy(data + 6, bf, 4);
    write_st(path,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
             "\"bf\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[6,10]},"
             "\"__metadata__\":{\"format\":\"pt\"}}",
             data, 10);
    kvp_st *s = NULL;
    cr_assert_eq(kvp_st_open(path, &s), KVP_OK, "%s", kvp_error_detail());
    kvp_tensor_view t;
    float out[3];
    cr_assert_eq(kvp_st_tensor(s, "h", &t), KVP_OK);
    kvp_tensor_to_f32(&t, out);
    cr_assert_float_eq(out[0], 1.5f, 0);
    cr_assert_float_eq(out[1], -2.0f, 0);
    cr_assert_float_eq(out[2], 0.333f, 1e-3);
    cr_assert_eq(kvp_st_tensor(s, "bf", &t), KVP_OK);
    cr_assert_eq(t.shape[1], 2);
    kvp_tensor_to_f32(&t, out);
    cr_assert_float_eq(out[0], -7.0f, 0);
    cr_assert_float_eq(out[1], 0.0078125f, 0);
    kvp_st_close(s);

    struct {
        const char *header;
        size_t data_len;
        kvp_status want;
        const char *needle;
    } bad[] = {
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,600]}}", 10, KVP_EPARSE, "outside"},
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,6]}}", 10, KVP_EPARSE, "need"},
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[6,0]}}", 10, KVP_EPARSE, "outside"},
        {"{\"h\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 10, KVP_EUNSUPPORTED, "I8"},
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[-3],\"data_offsets\":[0,6]}}", 10, KVP_EPARSE, "shape"},
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[3]}}", 10, KVP_EPARSE, "data_offsets"},
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}", 10, KVP_EPARSE, "x.safetensors"},
        {"[1,2]", 0, KVP_EPARSE, "object"},
        /* bf's bytes [4, 8) run into h's [0, 6) */
        {"{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
         "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
         10, KVP_EPARSE, "overlap"},
        /* the same range twice, listed high offsets first */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
         "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         10, KVP_EPARSE, "overlap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_st(path, bad[i].header, data, bad[i].data_len);
        s = NULL;
        kvp_status st = kvp_st_open(path, &s);
        cr_assert_eq(st, bad[i].want, "case %zu: %s (%s)", i, kvp_status_str(st), kvp_error_message());
        cr_assert(strstr(kvp_error_message(), bad[i].needle), "case %zu: %s", i, kvp_error_message());
        cr_assert(strstr(kvp_error_message(), "x.safetensors"), "case %zu: %s", i, kvp_error_message());
        cr_assert_null(s);
    }
    /* The overlap names both tensors; an empty tensor overlaps nothing, and a hole is tolerated. */
    write_st(path,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
             "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
             data, 10);
    cr_assert_eq(kvp_st_open(path, &s), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "'h'") && strstr(kvp_error_message(), "'bf'"), "%s", kvp_error_message());
    write_st(path,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
             "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[10,10]},"
             "\"after_hole\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[12,14]}}",
             data, 14);
    cr_assert_eq(kvp_st_open(path, &s), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_st_num_tensors(s), 5);
    kvp_st_close(s);
    /* header length beyond the file */
    tu_buf b = {0};
    tu_u64(&b, 1000);
    tu_put(&b, "{}", 2);
    tu_write_all(path, b.p, b.n);
    free(b.p);
    cr_assert_eq(kvp_st_open(path, &s), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "header length"), "%s", kvp_error_message());
}

Test(loaders, safetensors_every_truncation_fails_cleanly)
{
    tu_require_shared();
    size_t len;
    unsigned char *all = tu_read_all(S260_HF "/model.safetensors", &len);
    char path[300];
    snprintf(path, sizeof path, "%s/t.safetensors", tu_tmpdir());
    for (size_t cut = 0; cut < len; cut += cut < 5000 ? 61 : 7919) {
        tu_write_all(path, all, cut);
        kvp_st *s = NULL;
        kvp_status st = kvp_st_open(path, &s);
        cr_assert_eq(st, KVP_EPARSE, "cut %zu: %s", cut, kvp_status_str(st));
        cr_assert(strstr(kvp_error_message(), "t.safetensors"), "cut %zu: %s", cut, kvp_error_message());
        cr_assert_null(s);
    }
    free(all);
}

/* Splits stories260K's safetensors into two shards with an index and checks the tensors read back. */
Test(loaders, safetensors_sharded_folder)
{
    tu_require_shared();
    kvp_st *one;
    cr_assert_eq(kvp_st_open(S260_HF "/model.safetensors", &one), KVP_OK);
    const char *dir = tu_tmpdir();
    int64_t n = kvp_st_num_tensors(one);
    tu_buf hdr[2] = {{0}, {0}}, dat[2] = {{0}, {0}}, idx = {0};
    tu_put(&idx, "{\"metadata\":{},\"weight_map\":{", 29);
    for (int s = 0; s < 2; s++) tu_put(&hdr[s], "{", 1);
    for (int64_t i = 0; i < n; i++) {
        kvp_tensor_view t;
        kvp_st_tensor_at(one, i, &t);
        int s = (int)(i % 2);
        char e[512];
        int m = snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld%s%lld],\"data_offsets\":[%zu,%zu]}",
                         hdr[s].n > 1 ? "," : "", t.name, (long long)t.shape[0], t.ndim == 2 ? "," : "",
                         t.ndim == 2 ? (long long)t.shape[1] : 0LL, dat[s].n, dat[s].n + t.nbytes);
        if (t.ndim == 1) m = snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                      hdr[s].n > 1 ? "," : "", t.name, (long long)t.shape[0], dat[s].n, dat[s].n + t.nbytes);
        tu_put(&hdr[s], e, (size_t)m);
        tu_put(&dat[s], t.data, t.nbytes);
        m = snprintf(e, sizeof e, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", t.name, s + 1);
        tu_put(&idx, e, (size_t)m);
    }
    tu_put(&idx, "}}", 3);
    for (int s = 0; s < 2; s++) {
        tu_put(&hdr[s], "}", 2);
        char p[400];
        snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
        tu_buf f = {0};
        tu_u64(&f, hdr[s].n - 1);
        tu_put(&f, hdr[s].p, hdr[s].n - 1);
        tu_put(&f, dat[s].p, dat[s].n);
        tu_write_all(p, f.p, f.n);
        free(f.p);
        free(hdr[s].p);
        free(dat[s].p);
    }
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    tu_write_all(p, idx.p, idx.n - 1);
    free(idx.p);
    kvp_st *sh;
    cr_assert_eq(kvp_st_open(dir, &sh), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_st_num_tensors(sh), n);
    for (int64_t i = 0; i < n; i++) {
        kvp_tensor_view a, b;
        kvp_st_tensor_at(one, i, &a);
        cr_assert_eq(kvp_st_tensor(sh, a.name, &b), KVP_OK);
        cr_assert_eq(a.nbytes, b.nbytes);
        cr_assert(memcmp(a.data, b.data, a.nbytes) == 0, "%s differs", a.name);
        cr_assert(strstr(b.file, (i % 2) ? "00002" : "00001"));
    }
    kvp_st_close(sh);
    /* A missing shard names the file. */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(kvp_st_open(dir, &sh), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "model-00002-of-00002"), "%s", kvp_error_message());
    kvp_st_close(one);
}

Test(loaders, safetensors_open_survives_every_allocation_failure)
{
    tu_require_shared();
    tu_every_alloc_failure("safetensors open", open_st, close_st, S260_HF, 1);
}

/* A FIFO is refused as not a regular file; opening one to map it used to wait for a writer forever. */
Test(loaders, a_fifo_is_refused_not_waited_on, .timeout = 20)
{
    char path[300];
    snprintf(path, sizeof path, "%s/model.gguf", tu_tmpdir());
    cr_assert_eq(mkfifo(path, 0600), 0);
    kvp_model *m = NULL;
    cr_assert_eq(kvp_model_load(path, &m), KVP_EIO);
    cr_assert(strstr(kvp_error_message(), "not a regular file"), "%s", kvp_error_message());
    unlink(path);
}
