/* tests/runtime/checkpoint_testutil.c — see checkpoint_testutil.h. */
#include "checkpoint_testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_test.h"
#include "runtime/loader/gguf.h"
#include "runtime/model/model.h"

/* Copies the HF folder into a temp dir with an edited config.json or safetensors header. */
const char *tu_hf_copy(const char *config_from, const char *config_to, const char *tensor_from,
                       const char *tensor_to)
{
    const char *dir = tu_tmpdir();
    size_t n;
    char p[400];
    unsigned char *cfg = tu_read_all(S260_HF "/config.json", &n);
    char *c = malloc(n + (config_to ? strlen(config_to) : 0) + 1);
    memcpy(c, cfg, n);
    c[n] = '\0';
    if (config_from) {
        char *at = strstr(c, config_from);
        cr_assert_not_null(at);
        char rest[2048];
        snprintf(rest, sizeof rest, "%s", at + strlen(config_from));
        sprintf(at, "%s%s", config_to, rest);
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    tu_write_all(p, c, strlen(c));
    unsigned char *st = tu_read_all(S260_HF "/model.safetensors", &n);
    if (tensor_from) {
        cr_assert_eq(strlen(tensor_from), strlen(tensor_to));
        unsigned char *at = memmem(st, 8 + 5000, tensor_from, strlen(tensor_from));
        cr_assert_not_null(at);
        memcpy(at, tensor_to, strlen(tensor_to));
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    tu_write_all(p, st, n);
    free(cfg);
    free(c);
    free(st);
    return dir;
}

/* Rewrites stories260K.gguf with 2-D weights in F16, or in Q8_0 / Q4_0 (rows of a multiple of 32; the
 * others in F16), norms in F32. */
void tu_write_quantized_gguf(const char *path, int mode)
{
    size_t len;
    unsigned char *src = tu_read_all(S260_GGUF, &len);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    /* metadata bytes: from offset 24 to the first tensor info (name length 17 + "token_embd.weight") */
    unsigned char *ti = memmem(src, len, "\x11\0\0\0\0\0\0\0token_embd.weight", 25);
    cr_assert_not_null(ti);
    tu_buf hdr = {0}, data = {0};
    tu_put(&hdr, src, 24);
    tu_put(&hdr, src + 24, (size_t)(ti - src - 24));
    int64_t nt = kvp_gguf_num_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        kvp_tensor_view v;
        kvp_gguf_tensor_at(g, i, &v);
        float *f = malloc(sizeof(float) * (size_t)v.numel);
        kvp_tensor_to_f32(&v, f);
        uint32_t type = 0;
        int64_t ne0 = v.shape[v.ndim - 1];
        if (v.ndim == 2) type = mode != TU_QF16 && ne0 % 32 == 0 ? (mode == TU_QQ8_0 ? 8 : 2) : 1;
        tu_pad(&data, 32);
        tu_str(&hdr, v.name);
        tu_u32(&hdr, (uint32_t)v.ndim);
        for (int d = v.ndim - 1; d >= 0; d--) tu_u64(&hdr, (uint64_t)v.shape[d]);
        tu_u32(&hdr, type);
        tu_u64(&hdr, data.n);
        if (type == 0) tu_put(&data, f, sizeof(float) * (size_t)v.numel);
        if (type == 1)
            for (int64_t j = 0; j < v.numel; j++) {
                uint16_t h = kvp_wt_f32_to_f16(f[j]);
                tu_put(&data, &h, 2);
            }
        if (type == 8)
            for (int64_t b0 = 0; b0 < v.numel; b0 += 32) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fabsf(f[b0 + j]) > amax ? fabsf(f[b0 + j]) : amax;
                float d = amax / 127.0f;
                uint16_t dh = kvp_wt_f32_to_f16(d);
                tu_put(&data, &dh, 2);
                for (int j = 0; j < 32; j++) {
                    int8_t q = (int8_t)(d > 0 ? lrintf(f[b0 + j] / d) : 0);
                    tu_put(&data, &q, 1);
                }
            }
        if (type == 2) /* ggml's quantize_row_q4_0_ref: d = (the weight of largest magnitude) / -8 */
            for (int64_t b0 = 0; b0 < v.numel; b0 += 32) {
                float mx = 0;
                for (int j = 0; j < 32; j++) mx = fabsf(f[b0 + j]) > fabsf(mx) ? f[b0 + j] : mx;
                const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                uint16_t dh = kvp_wt_f32_to_f16(d);
                tu_put(&data, &dh, 2);
                for (int j = 0; j < 16; j++) {
                    int lo = (int)(f[b0 + j] * id + 8.5f), hi = (int)(f[b0 + 16 + j] * id + 8.5f);
                    uint8_t qs = (uint8_t)((lo > 15 ? 15 : lo) | (hi > 15 ? 15 : hi) << 4);
                    tu_put(&data, &qs, 1);
                }
            }
        free(f);
    }
    tu_pad(&hdr, 32);
    tu_buf all = {0};
    tu_put(&all, hdr.p, hdr.n);
    tu_put(&all, data.p, data.n);
    tu_write_all(path, all.p, all.n);
    free(all.p), free(hdr.p), free(data.p), free(src);
    kvp_gguf_close(g);
}

/* Writes an HF folder: config.json = stories260K's with `from` replaced by `to`, and its safetensors plus
 * zero-filled 1-D tensors extra[i] of lens[i] floats. Returns the folder. */
const char *tu_hf_variant(const char *from, const char *to, const char *const *extra, const int64_t *lens,
                          int n_extra)
{
    const char *dir = tu_hf_copy(from, to, NULL, NULL);
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    tu_buf hdr = {0}, data = {0};
    tu_put(&hdr, "{", 1);
    char e[400];
    for (int64_t i = 0; i < kvp_st_num_tensors(s); i++) {
        kvp_tensor_view v;
        kvp_st_tensor_at(s, i, &v);
        int m = v.ndim == 2 ? snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                       i ? "," : "", v.name, (long long)v.shape[0], (long long)v.shape[1], data.n,
                                       data.n + v.nbytes)
                            : snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                       i ? "," : "", v.name, (long long)v.shape[0], data.n, data.n + v.nbytes);
        tu_put(&hdr, e, (size_t)m);
        tu_put(&data, v.data, v.nbytes);
    }
    for (int i = 0; i < n_extra; i++) {
        float *z = calloc((size_t)lens[i], sizeof(float));
        int m = snprintf(e, sizeof e, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}", extra[i],
                         (long long)lens[i], data.n, data.n + (size_t)lens[i] * 4);
        tu_put(&hdr, e, (size_t)m);
        tu_put(&data, z, (size_t)lens[i] * 4);
        free(z);
    }
    tu_put(&hdr, "}", 1);
    tu_buf file = {0};
    tu_u64(&file, hdr.n);
    tu_put(&file, hdr.p, hdr.n);
    tu_put(&file, data.p, data.n);
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    tu_write_all(p, file.p, file.n);
    free(file.p), free(hdr.p), free(data.p);
    kvp_st_close(s);
    /* qwen variants: this config says "attention_bias": false explicitly; say true (same length) */
    if (strstr(to, "qwen")) {
        size_t n;
        snprintf(p, sizeof p, "%s/config.json", dir);
        char *cfg = (char *)tu_read_all(p, &n);
        char *at = memmem(cfg, n, "\"attention_bias\": false", 23);
        cr_assert_not_null(at);
        memcpy(at, "\"attention_bias\": true ", 23);
        tu_write_all(p, cfg, n);
        free(cfg);
    }
    return dir;
}

/* Writes dir/name: stories260K.gguf with 4-byte metadata `key` set to *v (GGUF type `type`), or, when key is
 * NULL, tensor `tensor`'s data offset set to `offset`. Returns the path (static). */
const char *tu_gguf_variant(const char *name, const char *key, uint32_t type, const void *v, const char *tensor,
                            uint64_t offset)
{
    static char path[400];
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    if (key) tu_gguf_set_kv4(buf, len, key, type, v);
    else tu_gguf_set_offset(buf, len, tensor, offset);
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    tu_write_all(path, buf, len);
    free(buf);
    return path;
}

/* Where stories260K.gguf's tensor infos end (buf, len: the file) and how many tensors it has. */
size_t tu_gguf_info_end(const unsigned char *buf, size_t len, int64_t *num_tensors)
{
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    const int64_t nt = kvp_gguf_num_tensors(g);
    kvp_tensor_view last;
    kvp_gguf_tensor_at(g, nt - 1, &last);
    /* the last tensor info: name (u64 length, bytes), u32 n_dims, u64 dims, u32 type, u64 offset */
    const size_t end = tu_gguf_find_str(buf, len, last.name) + 8 + strlen(last.name) + 4 + 8 * (size_t)last.ndim + 4 + 8;
    kvp_gguf_close(g);
    if (num_tensors) *num_tensors = nt;
    return end;
}

/* stories260K.gguf with one more tensor, rope_freqs.weight = ff[0..4) (llama.cpp's llama3 rope factors):
 * its tensor info goes after the others, its data after theirs (offsets stay relative to the data). */
const char *tu_gguf_with_rope_freqs(const float ff[4])
{
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    int64_t nt;
    const size_t info_end = tu_gguf_info_end(buf, len, &nt);
    const size_t data_start = (info_end + 31) / 32 * 32, data_len = len - data_start;
    tu_buf out = {0};
    tu_put(&out, buf, info_end);
    tu_str(&out, "rope_freqs.weight");
    tu_u32(&out, 1);
    tu_u64(&out, 4);
    tu_u32(&out, 0); /* F32 */
    tu_u64(&out, (data_len + 31) / 32 * 32);
    tu_pad(&out, 32);
    tu_put(&out, buf + data_start, data_len);
    tu_pad(&out, 32);
    for (int i = 0; i < 4; i++) tu_f32(&out, ff[i]);
    const uint64_t n1 = (uint64_t)nt + 1;
    memcpy(out.p + 8, &n1, 8); /* header: magic, version, tensor count */
    static char path[400];
    snprintf(path, sizeof path, "%s/rope_freqs.gguf", tu_tmpdir());
    tu_write_all(path, out.p, out.n);
    free(out.p);
    free(buf);
    return path;
}

/* dir/name: stories260K.gguf with n more metadata pairs, kvs (as tu_kv_* write them), first after the header.
 * Everything after them moves by their length, the tensor data to the next multiple of 32 (tensor offsets
 * are relative to it). */
const char *tu_gguf_with_kvs(const char *name, const tu_buf *kvs, uint64_t n)
{
    size_t len;
    unsigned char *buf = tu_read_all(S260_GGUF, &len);
    const size_t info_end = tu_gguf_info_end(buf, len, NULL), data_start = (info_end + 31) / 32 * 32;
    uint64_t nkv;
    memcpy(&nkv, buf + 16, 8); /* header: magic, version, tensor count, metadata count */
    nkv += n;
    tu_buf out = {0};
    tu_put(&out, buf, 16);
    tu_u64(&out, nkv);
    tu_put(&out, kvs->p, kvs->n);
    tu_put(&out, buf + 24, info_end - 24);
    tu_pad(&out, 32);
    tu_put(&out, buf + data_start, len - data_start);
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    tu_write_all(path, out.p, out.n);
    free(out.p);
    free(buf);
    return path;
}

size_t ck_numel(const ck_tensor *t)
{
    return (size_t)((t->experts ? t->experts : 1) * t->rows * (t->cols ? t->cols : 1));
}

float *tu_st_f32(kvp_st *s, const char *name, int64_t *numel)
{
    kvp_tensor_view v;
    cr_assert_eq(kvp_st_tensor(s, name, &v), KVP_OK, "%s", name);
    float *f = malloc(sizeof(float) * (size_t)v.numel);
    kvp_tensor_to_f32(&v, f);
    if (numel) *numel = v.numel;
    return f;
}

/* Rows of the heads of one projection, [heads x 8, 64], each head's dimensions reordered by perm. */
void tu_permute_heads(float *w, int heads, const int *perm)
{
    float tmp[8 * 64];
    for (int h = 0; perm && h < heads; h++) {
        memcpy(tmp, w + h * 8 * 64, sizeof tmp);
        for (int j = 0; j < 8; j++) memcpy(w + (h * 8 + j) * 64, tmp + perm[j] * 64, 64 * sizeof(float));
    }
}

/* Appends tensor f (rows x cols; cols 0: a vector) named gg in a GGUF, else hf; layer l's names get
 * "blk.l." / "model.layers.l." in front (l < 0: a model-level tensor). The checkpoint frees f. */
void ck_add(ck_tensor *t, int *nt, int g, int l, const char *gg, const char *hf, int64_t rows,
                     int64_t cols, float *f)
{
    ck_tensor *x = &t[(*nt)++];
    *x = (ck_tensor){"", rows, cols, f, 0};
    if (l < 0) snprintf(x->name, sizeof x->name, "%s", g ? gg : hf);
    else snprintf(x->name, sizeof x->name, g ? "blk.%d.%s" : "model.layers.%d.%s", l, g ? gg : hf);
}

/* Writes tensors t (and frees their data); returns the GGUF file or HF folder. */
const char *tu_write_checkpoint(ck_tensor *t, int nt, const ck_format *fm)
{
    const int g = fm->gguf;
    char dir[300];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_hf_copy makes another */
    static char path[400];
    tu_buf hdr = {0}, data = {0}, file = {0};
    if (g) {
        tu_buf kv = {0};
        tu_kv_str(&kv, "general.architecture", fm->arch);
        const char *keys[] = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                              "attention.head_count_kv", "context_length", "rope.dimension_count"};
        const uint32_t vals[] = {5, 64, 172, 8, 4, 512, fm->rot};
        char key[128];
        for (int i = 0; i < 7; i++) {
            snprintf(key, sizeof key, "%s.%s", fm->arch, keys[i]);
            tu_kv_u32(&kv, key, vals[i]);
        }
        tu_kv_u32(&kv, "tokenizer.ggml.bos_token_id", 1);
        tu_kv_u32(&kv, "tokenizer.ggml.eos_token_id", 2);
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", fm->arch);
        tu_kv_f32(&kv, key, 1e-5f);
        if (fm->kvs) tu_put(&kv, fm->kvs->p, fm->kvs->n);
        tu_put(&file, "GGUF", 4);
        tu_u32(&file, 3);
        tu_u64(&file, (uint64_t)nt);
        tu_u64(&file, 11 + fm->nkv);
        tu_put(&file, kv.p, kv.n);
        free(kv.p);
        for (int i = 0; i < nt; i++) {
            tu_str(&file, t[i].name);
            tu_u32(&file, 1 + (t[i].cols > 0) + (t[i].experts > 0));
            if (t[i].cols) tu_u64(&file, (uint64_t)t[i].cols); /* GGUF lists the fastest dimension first */
            tu_u64(&file, (uint64_t)t[i].rows);
            if (t[i].experts) tu_u64(&file, (uint64_t)t[i].experts);
            tu_u32(&file, 0); /* F32 */
            tu_u64(&file, data.n);
            tu_put(&data, t[i].f, sizeof(float) * ck_numel(&t[i]));
            tu_pad(&data, 32);
        }
        tu_pad(&file, 32);
        tu_put(&file, data.p, data.n);
        snprintf(path, sizeof path, "%s/%s.gguf", dir, fm->arch);
        tu_write_all(path, file.p, file.n);
    } else {
        tu_put(&hdr, "{", 1);
        for (int i = 0; i < nt; i++) {
            cr_assert_eq(t[i].experts, 0, "%s: HF keeps one matrix per expert", t[i].name);
            const size_t bytes = sizeof(float) * ck_numel(&t[i]);
            char e[300], shape[48];
            snprintf(shape, sizeof shape, t[i].cols ? "%lld,%lld" : "%lld", (long long)t[i].rows, (long long)t[i].cols);
            int m = snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", t[i].name, shape, data.n, data.n + bytes);
            tu_put(&hdr, e, (size_t)m);
            tu_put(&data, t[i].f, bytes);
        }
        tu_put(&hdr, "}", 1);
        tu_u64(&file, hdr.n);
        tu_put(&file, hdr.p, hdr.n);
        tu_put(&file, data.p, data.n);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        tu_write_all(path, file.p, file.n);
        char to[4096];
        snprintf(to, sizeof to, "\"model_type\": \"%s\"%s", fm->arch, fm->cfg_add ? fm->cfg_add : "");
        const char *cfgdir = tu_hf_copy("\"model_type\": \"llama\"", to, NULL, NULL);
        size_t len;
        char cp[400];
        snprintf(cp, sizeof cp, "%s/config.json", cfgdir);
        unsigned char *cfg = tu_read_all(cp, &len);
        snprintf(cp, sizeof cp, "%s/config.json", dir);
        tu_write_all(cp, cfg, len);
        free(cfg);
        snprintf(path, sizeof path, "%s", dir);
    }
    for (int i = 0; i < nt; i++) free(t[i].f);
    free(hdr.p), free(data.p), free(file.p);
    return path;
}

const char *tu_phi3_model(const phi3_spec *sp)
{
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    ck_tensor t[64];
    int nt = 0;
    const int g = sp->gguf;
    char n[96];
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
             tu_st_f32(s, "model.embed_tokens.weight", NULL));
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, tu_st_f32(s, "model.norm.weight", NULL));
    for (int l = 0; l < 5; l++) {
#define HF(x) (snprintf(n, sizeof n, "model.layers.%d.%s", l, x), n)
        float *q = tu_st_f32(s, HF("self_attn.q_proj.weight"), NULL), *k = tu_st_f32(s, HF("self_attn.k_proj.weight"), NULL);
        float *v = tu_st_f32(s, HF("self_attn.v_proj.weight"), NULL), *qkv = malloc(sizeof(float) * 128 * 64);
        tu_permute_heads(q, 8, sp->perm);
        tu_permute_heads(k, 4, sp->perm);
        memcpy(qkv, q, sizeof(float) * 64 * 64);
        memcpy(qkv + 64 * 64, k, sizeof(float) * 32 * 64);
        memcpy(qkv + 96 * 64, v, sizeof(float) * 32 * 64);
        free(q), free(k), free(v);
        float *gate = tu_st_f32(s, HF("mlp.gate_proj.weight"), NULL), *up = tu_st_f32(s, HF("mlp.up_proj.weight"), NULL);
        float *gu = malloc(sizeof(float) * 344 * 64);
        memcpy(gu, gate, sizeof(float) * 172 * 64);
        memcpy(gu + 172 * 64, up, sizeof(float) * 172 * 64);
        free(gate), free(up);
        ck_add(t, &nt, g, l, "attn_norm.weight", "input_layernorm.weight", 64, 0,
                 tu_st_f32(s, HF("input_layernorm.weight"), NULL));
        ck_add(t, &nt, g, l, "attn_qkv.weight", "self_attn.qkv_proj.weight", 128, 64, qkv);
        ck_add(t, &nt, g, l, "attn_output.weight", "self_attn.o_proj.weight", 64, 64,
                 tu_st_f32(s, HF("self_attn.o_proj.weight"), NULL));
        ck_add(t, &nt, g, l, "ffn_norm.weight", "post_attention_layernorm.weight", 64, 0,
                 tu_st_f32(s, HF("post_attention_layernorm.weight"), NULL));
        ck_add(t, &nt, g, l, "ffn_up.weight", "mlp.gate_up_proj.weight", 344, 64, gu);
        ck_add(t, &nt, g, l, "ffn_down.weight", "mlp.down_proj.weight", 64, 172,
                 tu_st_f32(s, HF("mlp.down_proj.weight"), NULL));
#undef HF
    }
    kvp_st_close(s);
    const float *vec[3] = {sp->longf, sp->shortf, sp->freqs};
    const char *vname[3] = {"rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight"};
    for (int i = 0; g && i < 3; i++)
        if (vec[i]) {
            float *f = malloc(sizeof(float) * (size_t)(sp->rot / 2));
            memcpy(f, vec[i], sizeof(float) * (size_t)(sp->rot / 2));
            ck_add(t, &nt, g, -1, vname[i], vname[i], sp->rot / 2, 0, f);
        }
    return tu_write_checkpoint(t, nt, &(ck_format){.gguf = g, .arch = "phi3", .rot = (uint32_t)sp->rot,
                                                .cfg_add = sp->cfg_add, .kvs = sp->kvs, .nkv = sp->nkv});
}

/* experts 0: every layer dense (a GGUF that says expert_count 0) */
int tu_moe_dense_layer(const moe_spec *sp, int l) { return (sp->dense2 && l == 2) || sp->experts == 0; }

/* The tensors of the model sp describes, as its format names and lays them out, into t; returns the count. */
int tu_moe_tensors(const moe_spec *sp, ck_tensor *t)
{
    static const int pairs[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* GGUF row 2i + j <- HF row 4 j + i */
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    int nt = 0;
    const int g = sp->gguf, E = sp->experts, mf = sp->mf;
    const char *blk = sp->qwen ? "mlp" : "block_sparse_moe";
    char n[96], hn[64], gn[64];
    kvp_rng rng;
    kvp_rng_seed(&rng, 20261201, 0);
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
           tu_st_f32(s, "model.embed_tokens.weight", NULL));
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, tu_st_f32(s, "model.norm.weight", NULL));
    for (int l = 0; l < 5; l++) {
#define HF(x) (snprintf(n, sizeof n, "model.layers.%d.%s", l, x), n)
        static const char *const att[5][2] = {{"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"},
                                              {"attn_k", "self_attn.k_proj"},   {"attn_v", "self_attn.v_proj"},
                                              {"attn_output", "self_attn.o_proj"}};
        const int64_t rows[5] = {64, 64, 32, 32, 64}, cols[5] = {0, 64, 64, 64, 64};
        for (int i = 0; i < 5; i++) {
            snprintf(gn, sizeof gn, "%s.weight", att[i][0]);
            snprintf(hn, sizeof hn, "%s.weight", att[i][1]);
            float *f = tu_st_f32(s, HF(hn), NULL);
            if (g && !sp->qwen && (i == 1 || i == 2)) tu_permute_heads(f, (int)rows[i] / 8, pairs);
            ck_add(t, &nt, g, l, gn, hn, rows[i], cols[i], f);
        }
        for (int i = 0; sp->qwen && i < 2; i++) {
            float *f = malloc(sizeof(float) * 8);
            for (int j = 0; j < 8; j++) f[j] = i ? 1.0f - 0.05f * (float)j : 1.0f + 0.1f * (float)j;
            ck_add(t, &nt, g, l, i ? "attn_k_norm.weight" : "attn_q_norm.weight",
                   i ? "self_attn.k_norm.weight" : "self_attn.q_norm.weight", 8, 0, f);
        }
        ck_add(t, &nt, g, l, "ffn_norm.weight", "post_attention_layernorm.weight", 64, 0,
               tu_st_f32(s, HF("post_attention_layernorm.weight"), NULL));
        float *gate = tu_st_f32(s, HF("mlp.gate_proj.weight"), NULL), *up = tu_st_f32(s, HF("mlp.up_proj.weight"), NULL);
        float *down = tu_st_f32(s, HF("mlp.down_proj.weight"), NULL);
        if (tu_moe_dense_layer(sp, l)) {
            ck_add(t, &nt, g, l, "ffn_gate.weight", "mlp.gate_proj.weight", 172, 64, gate);
            ck_add(t, &nt, g, l, "ffn_up.weight", "mlp.up_proj.weight", 172, 64, up);
            ck_add(t, &nt, g, l, "ffn_down.weight", "mlp.down_proj.weight", 64, 172, down);
            continue;
        }
        float *router = malloc(sizeof(float) * (size_t)(E * 64));
        for (int i = 0; i < E * 64; i++) router[i] = (float)(kvp_rng_uniform(&rng) - 0.5);
        snprintf(hn, sizeof hn, "%s.gate.weight", blk);
        ck_add(t, &nt, g, l, "ffn_gate_inp.weight", hn, E, 64, router);
        /* expert e's gate, up, down: all experts in one stacked tensor each (GGUF) or one matrix each (HF) */
        float *ex[3];
        for (int j = 0; j < 3; j++) ex[j] = malloc(sizeof(float) * (size_t)(E * mf * 64));
        for (int e = 0; e < E; e++) {
            float *eg = ex[0] + e * mf * 64, *eu = ex[1] + e * mf * 64, *ed = ex[2] + e * 64 * mf;
            for (int r = 0; r < mf; r++) {
                const int gr = sp->same ? r : (r + 13 * e) % 172;
                memcpy(eg + r * 64, gate + gr * 64, sizeof(float) * 64);
                memcpy(eu + r * 64, up + r * 64, sizeof(float) * 64);
                for (int o = 0; o < 64; o++) ed[o * mf + r] = down[o * 172 + r] * (sp->same ? 1.0f : 1.0f - 0.15f * (float)e);
            }
        }
        free(gate), free(up), free(down);
        static const char *const gg[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
        static const char *const hf[2][3] = {{"w1", "w3", "w2"}, {"gate_proj", "up_proj", "down_proj"}};
        for (int j = 0; j < 3; j++) {
            const int64_t r = j < 2 ? mf : 64, c = j < 2 ? 64 : mf;
            if (g) {
                ck_add(t, &nt, g, l, gg[j], "", r, c, ex[j]);
                t[nt - 1].experts = E;
                continue;
            }
            for (int e = 0; e < E; e++) {
                float *f = malloc(sizeof(float) * (size_t)(r * c));
                memcpy(f, ex[j] + e * r * c, sizeof(float) * (size_t)(r * c));
                snprintf(hn, sizeof hn, "%s.experts.%d.%s.weight", blk, e, hf[sp->qwen][j]);
                ck_add(t, &nt, g, l, "", hn, r, c, f);
            }
            free(ex[j]);
        }
#undef HF
    }
    kvp_st_close(s);
    return nt;
}

const char *tu_moe_model(const moe_spec *sp)
{
    static ck_tensor t[512];
    const int nt = tu_moe_tensors(sp, t);
    char add[256];
    tu_buf kvs = {0};
    uint64_t nkv = 0;
    const char *arch = sp->gguf ? (sp->qwen ? "qwen3moe" : "llama") : (sp->qwen ? "qwen3_moe" : "mixtral");
    if (sp->gguf) {
        char key[96];
        const uint32_t vals[3] = {(uint32_t)sp->experts, (uint32_t)sp->k, (uint32_t)sp->mf};
        const char *keys[3] = {"expert_count", "expert_used_count", "expert_feed_forward_length"};
        for (nkv = 0; nkv < (sp->qwen ? 3u : 2u); nkv++) {
            snprintf(key, sizeof key, "%s.%s", arch, keys[nkv]);
            tu_kv_u32(&kvs, key, vals[nkv]);
        }
    } else if (sp->qwen) {
        snprintf(add, sizeof add, ", \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
                 "\"norm_topk_prob\": %s, \"mlp_only_layers\": [%s]", sp->experts, sp->k, sp->mf,
                 sp->norm_topk ? "true" : "false", sp->dense2 ? "2" : "");
    } else {
        snprintf(add, sizeof add, ", \"num_local_experts\": %d, \"num_experts_per_tok\": %d", sp->experts, sp->k);
    }
    const char *p = tu_write_checkpoint(t, nt, &(ck_format){.gguf = sp->gguf, .arch = arch, .rot = 8,
                                                          .cfg_add = sp->gguf ? NULL : add, .kvs = &kvs, .nkv = nkv});
    free(kvs.p);
    return p;
}

const float *ck_find(const ck_tensor *t, int nt, const char *name)
{
    for (int i = 0; i < nt; i++)
        if (!strcmp(t[i].name, name)) return t[i].f;
    cr_assert_fail("no tensor %s", name);
    return NULL;
}

int tu_gemma_tensors(const gemma_spec *sp, ck_tensor *t)
{
    kvp_st *s;
    cr_assert_eq(kvp_st_open(S260_HF, &s), KVP_OK);
    int nt = 0;
    const int g = sp->gguf, post = sp->v >= 2;
    const float one = g ? 0.0f : 1.0f; /* subtracted from the norm weights HF stores */
    char n[96];
    kvp_rng rng;
    kvp_rng_seed(&rng, 7, 0);
    ck_add(t, &nt, g, -1, "token_embd.weight", "model.embed_tokens.weight", 512, 64,
           tu_st_f32(s, "model.embed_tokens.weight", NULL));
    float *on = tu_st_f32(s, "model.norm.weight", NULL);
    for (int i = 0; i < 64; i++) on[i] -= one;
    ck_add(t, &nt, g, -1, "output_norm.weight", "model.norm.weight", 64, 0, on);
    for (int l = 0; l < 5; l++) {
        /* {GGUF name, HF name, stories260K's tensor ("-": noise around 1), rows, cols, in this model} */
        const struct {
            const char *gg, *hf, *from;
            int64_t rows, cols;
            int here;
        } w[] = {{"attn_norm", "input_layernorm", "input_layernorm", 64, 0, 1},
                 {"attn_q", "self_attn.q_proj", "self_attn.q_proj", 64, 64, 1},
                 {"attn_k", "self_attn.k_proj", "self_attn.k_proj", 32, 64, 1},
                 {"attn_v", "self_attn.v_proj", "self_attn.v_proj", 32, 64, 1},
                 {"attn_q_norm", "self_attn.q_norm", "-", 8, 0, sp->v == 3},
                 {"attn_k_norm", "self_attn.k_norm", "-", 8, 0, sp->v == 3},
                 {"attn_output", "self_attn.o_proj", "self_attn.o_proj", 64, 64, 1},
                 {"post_attention_norm", "post_attention_layernorm", "-", 64, 0, post},
                 {"ffn_norm", post ? "pre_feedforward_layernorm" : "post_attention_layernorm",
                  "post_attention_layernorm", 64, 0, 1},
                 {"post_ffw_norm", "post_feedforward_layernorm", "-", 64, 0, post},
                 {"ffn_gate", "mlp.gate_proj", "mlp.gate_proj", 172, 64, 1},
                 {"ffn_up", "mlp.up_proj", "mlp.up_proj", 172, 64, 1},
                 {"ffn_down", "mlp.down_proj", "mlp.down_proj", 64, 172, 1}};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            if (!w[i].here) continue;
            char gn[64], hn[64];
            snprintf(gn, sizeof gn, "%s.weight", w[i].gg);
            snprintf(hn, sizeof hn, "%s.weight", w[i].hf);
            float *f;
            if (strcmp(w[i].from, "-") != 0) {
                snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, w[i].from);
                f = tu_st_f32(s, n, NULL);
            } else {
                f = malloc(sizeof(float) * (size_t)w[i].rows);
                for (int j = 0; j < w[i].rows; j++) f[j] = 1.0f + 0.2f * (float)(kvp_rng_uniform(&rng) - 0.5);
            }
            if (!w[i].cols)
                for (int j = 0; j < w[i].rows; j++) f[j] -= one;
            ck_add(t, &nt, g, l, gn, hn, w[i].rows, w[i].cols, f);
        }
    }
    kvp_st_close(s);
    return nt;
}

const char *tu_gemma_model(const gemma_spec *sp)
{
    static ck_tensor t[128];
    const int nt = tu_gemma_tensors(sp, t);
    const char *arch = sp->v == 3 ? (sp->gguf ? "gemma3" : "gemma3_text") : sp->v == 2 ? "gemma2" : "gemma";
    char add[1024] = "", part[160];
    tu_buf kvs = {0};
    uint64_t nkv = 0;
    /* {config.json key, GGUF key after "arch.", value (0: left out), GGUF u32} */
    const struct {
        const char *hf, *gg;
        double v;
        int u32;
    } f[] = {{"attn_logit_softcapping", "attn_logit_softcapping", sp->attn_cap, 0},
             {"final_logit_softcapping", "final_logit_softcapping", sp->final_cap, 0},
             {"sliding_window", "attention.sliding_window", sp->window, 1},
             {"rope_local_base_freq", "rope.freq_base_swa", sp->local_theta, 0},
             {"query_pre_attn_scalar", NULL, sp->qpas, 0},
             {"sliding_window_pattern", NULL, sp->pattern, 0}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].v == 0) continue;
        if (!sp->gguf) {
            snprintf(part, sizeof part, ", \"%s\": %g", f[i].hf, f[i].v);
            strcat(add, part);
        } else if (f[i].gg) {
            snprintf(part, sizeof part, "%s.%s", arch, f[i].gg);
            if (f[i].u32) tu_kv_u32(&kvs, part, (uint32_t)f[i].v);
            else tu_kv_f32(&kvs, part, (float)f[i].v);
            nkv++;
        }
    }
    if (sp->gelu) strcat(add, ", \"hidden_activation\": \"gelu\"");
    if (sp->linear > 0) { /* read before the file's own "rope_scaling": null, which comes later */
        snprintf(part, sizeof part, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %g}", sp->linear);
        strcat(add, part);
    }
    if (sp->cfg_extra) strcat(add, sp->cfg_extra);
    const char *p = tu_write_checkpoint(t, nt, &(ck_format){.gguf = sp->gguf, .arch = arch, .rot = 8, .cfg_add = add,
                                                          .kvs = &kvs, .nkv = nkv});
    free(kvs.p);
    return p;
}

/* Whether layer l of the model sp describes slides (gemma3: also its RoPE base) */
int tu_gemma_sliding(const gemma_spec *sp, int l)
{
    if (sp->v == 3) return sp->gguf ? sp->window > 0 && l % 6 < 5 : (l + 1) % (sp->pattern ? sp->pattern : 6) != 0;
    return sp->v == 2 && sp->window > 0 && l % 2 == 0;
}
