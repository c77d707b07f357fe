/* runtime/text/tokenizer_load.c — the tokenizer of a model: GGUF vocabularies (sentencepiece and GPT-2 BPE),
 * llama2.c tokenizer.bin, Hugging Face tokenizer.json (tokenizer_bpe.c), and which one a model path means.
 * The layers: tokenizer.c (the vocabulary, encode, decode) <- tokenizer_bpe.c (byte-level BPE) <- this file. */
#include "runtime/text/tokenizer_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/log.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/mapfile.h"
#include "runtime/model/model.h"

static kvp_status gguf_flags(const kvp_gguf *g, kvp_tokenizer *t)
{
    int64_t v;
    int present;
    KVP_TRY(kvp_gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v, &present));
    if (present) t->add_bos = v != 0;
    KVP_TRY(kvp_gguf_get_int(g, "tokenizer.ggml.add_space_prefix", &v, &present));
    if (present) t->add_space_prefix = v != 0;
    return KVP_OK;
}

kvp_status kvp_tok_from_gguf(const kvp_gguf *g, kvp_tokenizer **out)
{
    const char *path = kvp_gguf_path(g);
    kvp_gguf_str model = {0};
    int present = 0;
    KVP_TRY(kvp_gguf_get_str(g, "tokenizer.ggml.model", &model, &present));
    if (!present) return KVP_ERR(KVP_EPARSE, "%s: no tokenizer (tokenizer.ggml.model is missing)", path);
    const int bpe = model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0;
    if (!bpe && (model.len != 5 || memcmp(model.ptr, "llama", 5) != 0))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (llama/sentencepiece and "
                                         "gpt2/byte-level BPE are)",
                       path, (int)(model.len > 64 ? 64 : model.len), model.ptr);
    const kvp_gguf_str *toks;
    uint64_t n;
    KVP_TRY(kvp_gguf_arr_str(g, "tokenizer.ggml.tokens", &toks, &n));
    if (n == 0 || n > (1u << 24)) return KVP_ERR(KVP_EPARSE, "%s: tokenizer.ggml.tokens has %llu entries", path, (unsigned long long)n);
    kvp_tokenizer *t = kvp_tok_alloc((int32_t)n);
    if (!t) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    if (bpe) { /* llama.cpp's defaults for BPE vocabularies; the flags below may say otherwise */
        t->byte_level = 1;
        t->add_bos = 0;
        t->add_space_prefix = 0;
    }
    kvp_status st = KVP_OK;
    kvp_gguf_type et;
    uint64_t m;
    if ((st = kvp_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &m, &present)) != KVP_OK) goto fail;
    if (present) {
        int32_t *ty = kvp_malloc(n * sizeof *ty);
        if (!ty) {
            st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        st = kvp_gguf_arr_i32(g, "tokenizer.ggml.token_type", ty, n);
        for (uint64_t i = 0; st == KVP_OK && i < n; i++) {
            if (ty[i] < 1 || ty[i] > 6) {
                st = KVP_ERR(KVP_EPARSE, "%s: tokenizer.ggml.token_type[%llu] = %d is not a known type", path,
                             (unsigned long long)i, ty[i]);
                break;
            }
            t->types[i] = (uint8_t)ty[i];
        }
        kvp_free(ty);
        if (st != KVP_OK) goto fail;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (bpe ? !kvp_tok_bpe_set_piece(t, (int32_t)i, toks[i].ptr, toks[i].len)
                : !(t->pieces[i] = kvp_tok_copy_spm_piece(toks[i].ptr, toks[i].len, &t->lens[i]))) {
            st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    if ((st = kvp_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &m, &present)) != KVP_OK) goto fail;
    if (present && (st = kvp_gguf_arr_f32(g, "tokenizer.ggml.scores", t->scores, n)) != KVP_OK) goto fail;
    int64_t bos, eos;
    if ((st = kvp_gguf_special_token(g, "tokenizer.ggml.bos_token_id", (int64_t)n, &bos)) != KVP_OK) goto fail;
    if ((st = kvp_gguf_special_token(g, "tokenizer.ggml.eos_token_id", (int64_t)n, &eos)) != KVP_OK) goto fail;
    t->bos = (int32_t)bos;
    t->eos = (int32_t)eos;
    if ((st = gguf_flags(g, t)) != KVP_OK || (st = kvp_tok_finish(t, path)) != KVP_OK) goto fail;
    if (bpe && (st = kvp_tok_bpe_gguf_setup(g, t)) != KVP_OK) goto fail;
    *out = t;
    return KVP_OK;
fail:
    kvp_tok_destroy(t);
    return st;
}

kvp_status kvp_tok_load_llama2c(const char *path, int32_t vocab_size, kvp_tokenizer **out)
{
    if (vocab_size < 0) return KVP_ERR(KVP_EINVAL, "%s: vocab_size %d < 0", path, vocab_size);
    kvp_mapfile m;
    KVP_TRY(kvp_mapfile_open(path, &m));
    kvp_status st = KVP_OK;
    kvp_tokenizer *t = NULL;
    /* First pass: count and validate. */
    size_t pos = 4;
    int32_t count = 0;
    if (m.size < 4) {
        st = KVP_ERR(KVP_EPARSE, "%s: truncated: no max_token_length header", path);
        goto out;
    }
    while (pos < m.size && (vocab_size == 0 || count < vocab_size)) {
        int32_t len;
        if (m.size - pos < 8) {
            st = KVP_ERR(KVP_EPARSE, "%s: truncated inside token %d (byte %zu)", path, count, pos);
            goto out;
        }
        memcpy(&len, m.data + pos + 4, 4);
        if (len < 0 || (size_t)len > m.size - pos - 8) {
            st = KVP_ERR(KVP_EPARSE, "%s: token %d has length %d, past the end of the file (byte %zu)", path, count,
                         len, pos);
            goto out;
        }
        pos += 8 + (size_t)len;
        count++;
    }
    if (count == 0 || (vocab_size > 0 && count < vocab_size)) {
        st = KVP_ERR(KVP_EPARSE, "%s: truncated: %d tokens, expected %d", path, count, vocab_size);
        goto out;
    }
    t = kvp_tok_alloc(count);
    if (!t) {
        st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    pos = 4;
    for (int32_t i = 0; i < count; i++) {
        int32_t len;
        memcpy(&t->scores[i], m.data + pos, 4);
        memcpy(&len, m.data + pos + 4, 4);
        t->pieces[i] = kvp_malloc((size_t)len + 1);
        if (!t->pieces[i]) {
            st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        memcpy(t->pieces[i], m.data + pos + 8, (size_t)len);
        t->pieces[i][len] = '\0';
        t->lens[i] = (uint32_t)len;
        pos += 8 + (size_t)len;
    }
    /* llama2.c convention: 0 <unk>, 1 BOS, 2 EOS. */
    if (count > 0) t->types[0] = KVP_TOK_UNKNOWN;
    if (count > 1) t->types[1] = KVP_TOK_CONTROL;
    if (count > 2) t->types[2] = KVP_TOK_CONTROL;
    t->bos = count > 1 ? 1 : -1;
    t->eos = count > 2 ? 2 : -1;
    st = kvp_tok_finish(t, path);
out:
    kvp_mapfile_close(&m);
    if (st != KVP_OK) {
        kvp_tok_destroy(t);
        return st;
    }
    *out = t;
    return KVP_OK;
}

/* ---- the tokenizer of a model */

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* First file named tok*.bin in dir, into buf. */
static int find_tok_bin(const char *dir, char *buf, size_t n)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "tok", 3) == 0 && l > 4 && strcmp(e->d_name + l - 4, ".bin") == 0) {
            snprintf(buf, n, "%s/%s", dir, e->d_name);
            found = exists(buf);
        }
    }
    closedir(d);
    return found;
}

/* Grows t to n ids with unused, empty pieces (rows of the embedding past the vocabulary). */
static kvp_status pad(kvp_tokenizer *t, int32_t n, const char *what)
{
    char **pieces = kvp_realloc(t->pieces, (size_t)n * sizeof *pieces);
    if (pieces) t->pieces = pieces;
    uint32_t *lens = kvp_realloc(t->lens, (size_t)n * sizeof *lens);
    if (lens) t->lens = lens;
    float *scores = kvp_realloc(t->scores, (size_t)n * sizeof *scores);
    if (scores) t->scores = scores;
    uint8_t *types = kvp_realloc(t->types, (size_t)n * sizeof *types);
    if (types) t->types = types;
    uint8_t *raw = kvp_realloc(t->raw, (size_t)n * sizeof *raw);
    if (raw) t->raw = raw;
    if (!pieces || !lens || !scores || !types || !raw) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", what);
    for (int32_t i = t->n; i < n; i++) {
        t->pieces[i] = NULL;
        t->lens[i] = 0;
        t->scores[i] = 0;
        t->types[i] = KVP_TOK_UNUSED;
        t->raw[i] = 0;
    }
    int32_t old = t->n;
    t->n = n; /* destroy frees every piece below n: the new ones are NULL until set */
    for (int32_t i = old; i < n; i++)
        if (!(t->pieces[i] = kvp_calloc(1, 1))) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", what);
    return KVP_OK;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* 1 when the file starts with GGUF's magic. */
static int is_gguf_file(const char *p)
{
    char magic[4] = {0};
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

kvp_status kvp_tok_load(const char *path, int32_t vocab, kvp_tokenizer **out)
{
    char buf[2048];
    if (is_dir(path) || ends_with(path, ".safetensors")) {
        char dir[1100];
        const char *slash = strrchr(path, '/');
        if (is_dir(path)) snprintf(dir, sizeof dir, "%s", path);
        else snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        snprintf(buf, sizeof buf, "%s/tokenizer.json", dir);
        if (!exists(buf)) snprintf(buf, sizeof buf, "%s/tokenizer.bin", dir);
        if (!exists(buf) && !find_tok_bin(dir, buf, sizeof buf)) {
            char sib[1200];
            snprintf(sib, sizeof sib, "%s/../llama2c", dir);
            if (!find_tok_bin(sib, buf, sizeof buf))
                return KVP_ERR(KVP_EINVAL, "%s: no tokenizer this build can read (tokenizer.json or a llama2.c "
                                           "tokenizer.bin); pass --tokenizer PATH",
                               path);
        }
        path = buf;
        KVP_LOG_I("tokenizer %s", path);
    }
    if (is_gguf_file(path)) {
        kvp_gguf *g;
        KVP_TRY(kvp_gguf_open(path, &g));
        kvp_status st = kvp_tok_from_gguf(g, out);
        kvp_gguf_close(g);
        return st;
    }
    if (ends_with(path, ".json")) return kvp_tok_from_hf_json(path, out);
    return kvp_tok_load_llama2c(path, vocab, out);
}

kvp_status kvp_tok_for_model(const kvp_model *m, const char *model_path, const char *tok_path, kvp_tokenizer **out)
{
    const int32_t vocab = (int32_t)kvp_model_cfg(m)->vocab_size;
    const char *path = tok_path ? tok_path : model_path;
    KVP_TRY(kvp_tok_load(path, vocab, out));
    kvp_status st = KVP_OK;
    if (kvp_tok_vocab_size(*out) < vocab) st = pad(*out, vocab, path);
    else if (kvp_tok_vocab_size(*out) > vocab)
        st = KVP_ERR(KVP_EINVAL, "%s: tokenizer has %d tokens but the model's vocabulary is %d", path,
                     kvp_tok_vocab_size(*out), vocab);
    if (st != KVP_OK) {
        kvp_tok_destroy(*out);
        *out = NULL;
    }
    return st;
}

