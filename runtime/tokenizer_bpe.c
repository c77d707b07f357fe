/* runtime/tokenizer_bpe.c — vocabularies that come with a merge list: GGUF "gpt2" (byte-level BPE, as
 * llama.cpp's convert script writes Llama-3 and Qwen vocabularies) and Hugging Face tokenizer.json (model
 * "BPE", byte-level or sentencepiece-like). Builds the merge table and the pre-tokenizer regex; encoding
 * itself is tokenizer.c's.
 *
 * Byte-level vocabularies spell bytes as code points (GPT-2's bytes_to_unicode): the printable bytes
 * 33..126, 161..172 and 174..255 stand for themselves, the other 68 for U+0100, U+0101, ... in byte order
 * (' ' is "Ġ", '\n' is "Ċ"). Pieces are stored as the bytes they stand for.
 */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/json.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer_internal.h"

/* Pre-tokenizer regexes, as llama.cpp and the models' tokenizer.json files spell them. */
static const char k_re_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char k_re_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int printable(uint32_t b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

/* The byte a code point stands for, or -1. */
static int byte_of(uint32_t cp)
{
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    uint32_t k = cp - 256; /* the k-th byte that is not printable */
    for (uint32_t b = 0; b < 256; b++)
        if (!printable(b) && k-- == 0) return (int)b;
    return -1;
}

/* Decodes a byte-level spelling s[0..len) into out (at most len bytes); 0 when some code point stands for
 * no byte (it then is not a byte-level spelling). Only 1- and 2-byte UTF-8 sequences can be. */
static int unmap(const char *s, size_t len, char *out, uint32_t *out_len)
{
    uint32_t j = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xe0) == 0xc0 && i + 1 < len && ((unsigned char)s[i + 1] & 0xc0) == 0x80) {
            cp = (uint32_t)(c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f);
            i += 2;
        } else {
            return 0;
        }
        int b = byte_of(cp);
        if (b < 0) return 0;
        out[j++] = (char)b;
    }
    *out_len = j;
    return 1;
}

char *kvp_tok_bpe_piece(const char *s, size_t len, uint8_t type, uint32_t *out_len)
{
    char *d = kvp_malloc(len + 1);
    if (!d) return NULL;
    if ((type != 0 && type != KVP_TOK_NORMAL) || !unmap(s, len, d, out_len)) {
        memcpy(d, s, len);
        *out_len = (uint32_t)len;
    }
    d[*out_len] = '\0';
    return d;
}

/* A piece of a merge, spelled as the vocabulary spells it, as its id; -1 when it is not a piece. */
static int32_t merge_side(const kvp_tokenizer *t, const char *s, size_t len, char *buf)
{
    uint32_t n;
    if (t->byte_level) {
        if (!unmap(s, len, buf, &n)) return -1;
        return kvp_tok_lookup(t, buf, n);
    }
    char *p = kvp_tok_copy_spm_piece(s, len, &n);
    if (!p) return -2;
    int32_t id = kvp_tok_lookup(t, p, n);
    kvp_free(p);
    return id;
}

/* Merge list under construction: rank r joins pieces (l, r). */
typedef struct {
    kvp_tokenizer *t;
    const char *what; /* file and key, for messages */
    char *buf;        /* 2 x max piece length + 8 */
} merge_build;

static kvp_status merges_alloc(merge_build *mb, kvp_tokenizer *t, uint64_t n, const char *what)
{
    uint64_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    *mb = (merge_build){.t = t, .what = what};
    t->merges = kvp_malloc(cap * sizeof *t->merges);
    mb->buf = kvp_malloc(2 * (size_t)t->max_len + 8);
    if (!t->merges || !mb->buf) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", what);
    for (uint64_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->merge_mask = cap - 1;
    return KVP_OK;
}

/* Adds merge `rank` of pieces a and b (the vocabulary's spelling); the first of duplicates wins. */
static kvp_status merge_add(merge_build *mb, int32_t rank, const char *a, size_t alen, const char *b, size_t blen)
{
    kvp_tokenizer *t = mb->t;
    int32_t l = merge_side(t, a, alen, mb->buf), r = merge_side(t, b, blen, mb->buf);
    if (l == -2 || r == -2) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", mb->what);
    if (l < 0 || r < 0)
        return KVP_ERR(KVP_EPARSE, "%s: merge %d ('%.*s' '%.*s') joins %s that is not in the vocabulary", mb->what, rank,
                       (int)(alen > 40 ? 40 : alen), a, (int)(blen > 40 ? 40 : blen), b, l < 0 ? "a left piece" : "a right piece");
    memcpy(mb->buf, t->pieces[l], t->lens[l]);
    memcpy(mb->buf + t->lens[l], t->pieces[r], t->lens[r]);
    int32_t id = t->lens[l] + t->lens[r] <= t->max_len ? kvp_tok_lookup(t, mb->buf, t->lens[l] + t->lens[r]) : -1;
    if (id < 0)
        return KVP_ERR(KVP_EPARSE, "%s: merge %d ('%.*s' '%.*s') makes a piece that is not in the vocabulary", mb->what,
                       rank, (int)(alen > 40 ? 40 : alen), a, (int)(blen > 40 ? 40 : blen), b);
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint64_t h = XXH3_64bits(&key, sizeof key) & t->merge_mask;
    while (t->merges[h].key != UINT64_MAX) {
        if (t->merges[h].key == key) return KVP_OK;
        h = (h + 1) & t->merge_mask;
    }
    t->merges[h] = (kvp_tok_merge){.key = key, .rank = rank, .id = id};
    return KVP_OK;
}

/* "a b" (the form of GGUF and of older tokenizer.json files): pieces never hold a space (byte-level spells
 * it "Ġ", sentencepiece "▁"), so the first space splits. */
static kvp_status merge_add_line(merge_build *mb, int32_t rank, const char *s, size_t len)
{
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp) return KVP_ERR(KVP_EPARSE, "%s: merge %d ('%.*s') is not two pieces separated by a space", mb->what, rank,
                            (int)(len > 40 ? 40 : len), s);
    return merge_add(mb, rank, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1);
}

static kvp_status compile_pre(kvp_tokenizer *t, const char *pattern, const char *what)
{
    int err;
    PCRE2_SIZE off;
    t->pre = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                           &err, &off, NULL);
    if (!t->pre) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: the pre-tokenizer regex does not compile at offset %zu: %s", what,
                       (size_t)off, (const char *)msg);
    }
    (void)pcre2_jit_compile(t->pre, PCRE2_JIT_COMPLETE); /* faster when the JIT is there; correct without */
    return KVP_OK;
}

kvp_status kvp_tok_bpe_gguf_setup(const kvp_gguf *g, kvp_tokenizer *t)
{
    const char *path = kvp_gguf_path(g);
    kvp_gguf_str pre = {0};
    int present;
    KVP_TRY(kvp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &present));
    const char *re = k_re_gpt2;
#define PRE_IS(s) (pre.len == sizeof s - 1 && memcmp(pre.ptr, s, pre.len) == 0)
    if (!present || PRE_IS("default") || PRE_IS("gpt-2")) {
        re = k_re_gpt2;
    } else if (PRE_IS("llama-bpe") || PRE_IS("llama3") || PRE_IS("llama-v3")) {
        re = k_re_llama3;
        t->ignore_merges = 1; /* as llama.cpp does for Llama-3 */
    } else if (PRE_IS("qwen2")) {
        re = k_re_qwen2;
    } else {
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not supported (llama-bpe, llama3, qwen2, "
                                         "gpt-2 and default are)",
                       path, (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
    }
#undef PRE_IS
    const kvp_gguf_str *merges;
    uint64_t n;
    KVP_TRY(kvp_gguf_arr_str(g, "tokenizer.ggml.merges", &merges, &n));
    if (n > (1u << 24)) return KVP_ERR(KVP_EPARSE, "%s: tokenizer.ggml.merges has %llu entries", path, (unsigned long long)n);
    char what[1100];
    snprintf(what, sizeof what, "%s: tokenizer.ggml.merges", path);
    merge_build mb;
    kvp_status st = merges_alloc(&mb, t, n, what);
    for (uint64_t i = 0; st == KVP_OK && i < n; i++) st = merge_add_line(&mb, (int32_t)i, merges[i].ptr, merges[i].len);
    kvp_free(mb.buf);
    KVP_TRY(st);
    return compile_pre(t, re, path);
}

/* ---- Hugging Face tokenizer.json */

static const char *type_of(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "";
}

/* The first component of a pre-tokenizer / decoder / post-processor (itself, or inside a "Sequence") whose
 * type is `type`; NULL when none. */
static const cJSON *component(const cJSON *o, const char *list, const char *type)
{
    if (!cJSON_IsObject(o)) return NULL;
    if (strcmp(type_of(o), type) == 0) return o;
    if (strcmp(type_of(o), "Sequence") != 0) return NULL;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(o, list))
        if (strcmp(type_of(x), type) == 0) return x;
    return NULL;
}

/* The id of the piece spelled exactly s (a special one first), or -1. */
static int32_t id_of_text(const kvp_tokenizer *t, const char *s)
{
    int32_t id = kvp_tok_special_id(t, s);
    return id >= 0 ? id : kvp_tok_lookup(t, s, strlen(s));
}

/* tokenizer_config.json's bos_token / eos_token: a string, or an object with "content". */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

typedef struct {
    const char *path;
    const cJSON *root, *model, *vocab, *added, *merges, *pre, *norm;
} hf_json;

/* Pieces and types from model.vocab and added_tokens. */
static kvp_status hf_pieces(const hf_json *h, kvp_tokenizer *t)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, h->vocab)
    {
        int32_t id = (int32_t)x->valuedouble;
        if (t->pieces[id]) return KVP_ERR(KVP_EPARSE, "%s: model.vocab gives id %d to two pieces", h->path, id);
        size_t len = strlen(x->string);
        t->pieces[id] = t->byte_level ? kvp_tok_bpe_piece(x->string, len, 0, &t->lens[id])
                                      : kvp_tok_copy_spm_piece(x->string, len, &t->lens[id]);
        if (!t->pieces[id]) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
    }
    cJSON_ArrayForEach(x, h->added)
    {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(x, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
        t->types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "special")) ? KVP_TOK_CONTROL : KVP_TOK_USER;
        kvp_free(t->pieces[id]);
        if (!(t->pieces[id] = kvp_tok_bpe_piece(content, strlen(content), t->types[id], &t->lens[id])))
            return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
    }
    for (int32_t i = 0; i < t->n; i++)
        if (!t->pieces[i]) { /* an id no piece has */
            t->types[i] = KVP_TOK_UNUSED;
            if (!(t->pieces[i] = kvp_tok_bpe_piece("", 0, t->types[i], &t->lens[i])))
                return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
        }
    return KVP_OK;
}

/* The merge list: "a b" strings, or ["a", "b"] pairs (tokenizers >= 0.20). */
static kvp_status hf_merges(const hf_json *h, kvp_tokenizer *t)
{
    char what[1100];
    snprintf(what, sizeof what, "%s: model.merges", h->path);
    merge_build mb;
    kvp_status st = merges_alloc(&mb, t, (uint64_t)cJSON_GetArraySize(h->merges), what);
    int32_t rank = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, h->merges)
    {
        if (st != KVP_OK) break;
        const cJSON *a = cJSON_GetArrayItem(x, 0), *b = cJSON_GetArrayItem(x, 1);
        if (cJSON_IsString(x))
            st = merge_add_line(&mb, rank, x->valuestring, strlen(x->valuestring));
        else if (cJSON_GetArraySize(x) == 2 && cJSON_IsString(a) && cJSON_IsString(b))
            st = merge_add(&mb, rank, a->valuestring, strlen(a->valuestring), b->valuestring, strlen(b->valuestring));
        else
            st = KVP_ERR(KVP_EPARSE, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", what, rank);
        rank++;
    }
    kvp_free(mb.buf);
    return st;
}

static kvp_status known_step(const hf_json *h, const cJSON *step)
{
    if (strcmp(type_of(step), "Split") == 0 || strcmp(type_of(step), "ByteLevel") == 0) return KVP_OK;
    return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer '%s' is not supported with a byte-level vocabulary (Split and "
                                     "ByteLevel are)",
                   h->path, type_of(step));
}

/* The pre-tokenizer of a byte-level vocabulary: a Split regex, or ByteLevel's own (GPT-2's) regex. */
static kvp_status hf_pre(const hf_json *h, kvp_tokenizer *t)
{
    const int seq = strcmp(type_of(h->pre), "Sequence") == 0;
    const cJSON *x, *steps = seq ? cJSON_GetObjectItemCaseSensitive(h->pre, "pretokenizers") : NULL;
    cJSON_ArrayForEach(x, steps) KVP_TRY(known_step(h, x));
    if (cJSON_IsObject(h->pre) && !seq) KVP_TRY(known_step(h, h->pre));
    const cJSON *bl = component(h->pre, "pretokenizers", "ByteLevel");
    const cJSON *split = component(h->pre, "pretokenizers", "Split");
    if (bl && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space")))
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel with add_prefix_space is not supported", h->path);
    if (split) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
        if (!cJSON_IsString(re))
            return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer Split without a \"Regex\" pattern is not supported", h->path);
        int n = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(h->pre, "pretokenizers")) n += strcmp(type_of(x), "Split") == 0;
        if (n > 1) return KVP_ERR(KVP_EUNSUPPORTED, "%s: a pre_tokenizer with %d Split steps is not supported (one is)", h->path, n);
        return compile_pre(t, re->valuestring, h->path);
    }
    const cJSON *use = bl ? cJSON_GetObjectItemCaseSensitive(bl, "use_regex") : NULL;
    if (bl && !cJSON_IsFalse(use)) return compile_pre(t, k_re_gpt2, h->path);
    return KVP_OK; /* ByteLevel without a regex: the whole text is one pre-token */
}

/* Checks the shape of the file before anything is trusted; fills h. */
static kvp_status hf_check(hf_json *h, int32_t *n)
{
    const char *path = h->path;
    h->model = cJSON_GetObjectItemCaseSensitive(h->root, "model");
    if (!cJSON_IsObject(h->model)) return KVP_ERR(KVP_EPARSE, "%s: no \"model\" object", path);
    if (strcmp(type_of(h->model), "BPE") != 0)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: tokenizer model type '%s' is not supported (BPE is)", path, type_of(h->model));
    h->vocab = cJSON_GetObjectItemCaseSensitive(h->model, "vocab");
    h->merges = cJSON_GetObjectItemCaseSensitive(h->model, "merges");
    h->added = cJSON_GetObjectItemCaseSensitive(h->root, "added_tokens");
    h->pre = cJSON_GetObjectItemCaseSensitive(h->root, "pre_tokenizer");
    h->norm = cJSON_GetObjectItemCaseSensitive(h->root, "normalizer");
    if (!cJSON_IsObject(h->vocab) || !cJSON_GetArraySize(h->vocab))
        return KVP_ERR(KVP_EPARSE, "%s: model.vocab is not a non-empty object", path);
    if (!cJSON_IsArray(h->merges)) return KVP_ERR(KVP_EPARSE, "%s: model.merges is not an array", path);
    if (h->added && !cJSON_IsArray(h->added)) return KVP_ERR(KVP_EPARSE, "%s: added_tokens is not an array", path);
    double top = -1;
    const cJSON *x;
    cJSON_ArrayForEach(x, h->vocab)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= (1 << 24) || x->valuedouble != (int32_t)x->valuedouble)
            return KVP_ERR(KVP_EPARSE, "%s: model.vocab['%.40s'] is not an id in [0, 2^24)", path, x->string);
        if (x->valuedouble > top) top = x->valuedouble;
    }
    int i = 0;
    cJSON_ArrayForEach(x, h->added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id"), *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) ||
            id->valuedouble != (int32_t)id->valuedouble || !cJSON_IsString(c) || !c->valuestring[0])
            return KVP_ERR(KVP_EPARSE, "%s: added_tokens[%d] has no id in [0, 2^24) or no content", path, i);
        if (id->valuedouble > top) top = id->valuedouble;
        i++;
    }
    *n = (int32_t)top + 1;
    return KVP_OK;
}

/* BOS from the post-processor (TemplateProcessing whose "single" starts with a special token), and BOS/EOS
 * from tokenizer_config.json beside the file when there is one. */
static kvp_status hf_specials(const hf_json *h, kvp_tokenizer *t)
{
    const cJSON *tp = component(cJSON_GetObjectItemCaseSensitive(h->root, "post_processor"), "processors",
                                "TemplateProcessing");
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tp, "single"), 0);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    if (cJSON_IsString(bos)) {
        t->bos = id_of_text(t, bos->valuestring);
        if (t->bos < 0)
            return KVP_ERR(KVP_EPARSE, "%s: post_processor adds '%.40s', which is no piece", h->path, bos->valuestring);
        t->add_bos = 1;
    }
    char cfg_path[2048];
    const char *slash = strrchr(h->path, '/');
    snprintf(cfg_path, sizeof cfg_path, "%.*stokenizer_config.json", slash ? (int)(slash - h->path + 1) : 0, h->path);
    FILE *f = fopen(cfg_path, "rb");
    if (!f) return KVP_OK;
    fclose(f);
    cJSON *cfg;
    KVP_TRY(kvp_json_parse_file(cfg_path, &cfg));
    const char *b = config_token(cfg, "bos_token"), *e = config_token(cfg, "eos_token");
    kvp_status st = KVP_OK;
    if (b && (t->bos = id_of_text(t, b)) < 0) st = KVP_ERR(KVP_EPARSE, "%s: bos_token '%.40s' is no piece", cfg_path, b);
    if (st == KVP_OK && e && (t->eos = id_of_text(t, e)) < 0)
        st = KVP_ERR(KVP_EPARSE, "%s: eos_token '%.40s' is no piece", cfg_path, e);
    cJSON_Delete(cfg);
    return st;
}

/* A sentencepiece-like file prepends "▁": a normalizer Prepend, or a Metaspace pre-tokenizer (whose
 * prepend_scheme is not "never"). */
static int hf_space_prefix(const hf_json *h)
{
    if (component(h->norm, "normalizers", "Prepend")) return 1;
    const cJSON *ms = component(h->pre, "pretokenizers", "Metaspace");
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(ms, "prepend_scheme");
    return ms && !(cJSON_IsString(scheme) && strcmp(scheme->valuestring, "never") == 0);
}

kvp_status kvp_tok_from_hf_json(const char *path, kvp_tokenizer **out)
{
    hf_json h = {.path = path};
    cJSON *root;
    KVP_TRY(kvp_json_parse_file(path, &root));
    h.root = root;
    int32_t n = 0;
    kvp_tokenizer *t = NULL;
    kvp_status st = hf_check(&h, &n);
    if (st != KVP_OK) goto out;
    if (!(t = kvp_tok_alloc(n))) {
        st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    t->byte_level = component(h.pre, "pretokenizers", "ByteLevel") ||
                    component(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoders", "ByteLevel");
    t->add_bos = 0;
    t->add_space_prefix = !t->byte_level && hf_space_prefix(&h);
    t->bos = t->eos = -1;
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h.model, "ignore_merges"));
    const cJSON *ms = component(h.pre, "pretokenizers", "Metaspace");
    if (!t->byte_level && ms && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(ms, "split"))) {
        st = KVP_ERR(KVP_EUNSUPPORTED, "%s: a Metaspace pre-tokenizer that splits words is not supported", path);
        goto out;
    }
    if ((st = hf_pieces(&h, t)) != KVP_OK || (st = kvp_tok_finish(t, path)) != KVP_OK ||
        (st = hf_merges(&h, t)) != KVP_OK || (st = hf_specials(&h, t)) != KVP_OK)
        goto out;
    if (t->byte_level && (st = hf_pre(&h, t)) != KVP_OK) goto out;
    *out = t;
    t = NULL;
out:
    kvp_tok_destroy(t);
    cJSON_Delete(root);
    return st;
}
