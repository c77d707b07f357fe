/* runtime/text/tokenizer_bpe.c — vocabularies that come with a merge list: GGUF "gpt2" (byte-level BPE, as
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
#include "runtime/loader/gguf.h"
#include "runtime/text/tokenizer_internal.h"

/* Pre-tokenizer regexes, as the models' tokenizer.json files (and llama.cpp) spell them. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_CJK "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
/* Qwen3.5's: letters with their combining marks (\p{M}) in one piece */
#define RE_QWEN35                                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral-Nemo's (Tekken): upper-case runs apart from lower-case ones, single digits */
#define RE_TEKKEN                                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"             \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"      \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* tokenizer.ggml.pre: the regexes, in order, ignore_merges, and whether BOS is added when the file does not
 * say (tokenizer.ggml.add_bos_token), as llama.cpp decides. Only regex sets checked against a model's own
 * Hugging Face encodings (scripts/check-llama-cpp-vocabs.py), or against Hugging Face's tokenizers running the
 * model's tokenizer.json regex on a trained vocabulary (tekken: scripts/bpe-tokenizer-fixture.py), are listed;
 * the names after the first ones of a row (olmo, jais, ...; falcon3, pixtral, ...; deepseek-r1-qwen, ...; smollm,
 * codeshell, ...) are those llama.cpp gives the same regexes and flags. */
enum { KVP_PRE_NAMES = 16 };
static const struct {
    const char *names[KVP_PRE_NAMES];
    int ignore_merges, add_bos;
    const char *re[KVP_TOK_MAX_PRE];
} k_pre[] = {
    {{"default", "gpt-2", "mpt", "olmo", "jais", "exaone4", "phi-2", "gigachat", "a.x-4.0", "mellum", "trillion",
      "granite-docling"},
     0,
     0,
     {RE_GPT2}},
    {{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, 1, 1, {RE_LLAMA3}},
    {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"}, 0, 0, {RE_QWEN2}},
    {{"qwen35"}, 0, 0, {RE_QWEN35}},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, 0, 0, {"\\p{N}", RE_GPT2}},
    {{"falcon"}, 0, 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {{"deepseek-coder"}, 0, 0, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {{"tekken"}, 1, 1, {RE_TEKKEN}},
    {{"deepseek-llm"},
     0,
     0,
     {"[\r\n]",
      "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
      "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
      "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
      "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
      "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
      "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
      "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
      "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
      "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
      "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$", RE_CJK, "\\p{N}+"}},
};

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

int kvp_tok_bpe_set_piece(kvp_tokenizer *t, int32_t id, const char *s, size_t len)
{
    char *d = kvp_malloc(len + 1);
    if (!d) return 0;
    const uint8_t type = t->types[id];
    const int normal = type == 0 || type == KVP_TOK_NORMAL;
    if (!normal || !unmap(s, len, d, &t->lens[id])) {
        memcpy(d, s, len);
        t->lens[id] = (uint32_t)len;
        t->raw[id] = normal;
    }
    d[t->lens[id]] = '\0';
    t->pieces[id] = d;
    return 1;
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

/* Appends a regex to t's pre-tokenizer steps. */
static kvp_status compile_pre(kvp_tokenizer *t, const char *pattern, const char *what)
{
    if (t->npre == KVP_TOK_MAX_PRE)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: a pre-tokenizer of more than %d regex steps is not supported", what,
                       KVP_TOK_MAX_PRE);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: the pre-tokenizer regex does not compile at offset %zu: %s", what,
                       (size_t)off, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* faster when the JIT is there; correct without */
    t->pre[t->npre++] = re;
    return KVP_OK;
}

kvp_status kvp_tok_bpe_gguf_setup(const kvp_gguf *g, kvp_tokenizer *t)
{
    const char *path = kvp_gguf_path(g);
    kvp_gguf_str pre = {0};
    int present;
    KVP_TRY(kvp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &present));
    int found = -1;
    for (size_t i = 0; found < 0 && i < sizeof k_pre / sizeof *k_pre; i++)
        for (int j = 0; j < KVP_PRE_NAMES && k_pre[i].names[j]; j++)
            if (!present ? i == 0 : strlen(k_pre[i].names[j]) == pre.len && memcmp(pre.ptr, k_pre[i].names[j], pre.len) == 0)
                found = (int)i;
    if (found < 0) {
        char known[1024] = "";
        size_t at = 0;
        for (size_t i = 0; i < sizeof k_pre / sizeof *k_pre; i++)
            for (int j = 0; j < KVP_PRE_NAMES && k_pre[i].names[j] && at < sizeof known; j++)
                at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", at ? ", " : "", k_pre[i].names[j]);
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not supported (%s are)", path,
                       (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, known);
    }
    t->ignore_merges = k_pre[found].ignore_merges;
    int64_t v;
    int says;
    KVP_TRY(kvp_gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v, &says));
    if (!says) t->add_bos = k_pre[found].add_bos;
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
    for (int k = 0; st == KVP_OK && k < KVP_TOK_MAX_PRE && k_pre[found].re[k]; k++)
        st = compile_pre(t, k_pre[found].re[k], path);
    return st;
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
        if (t->byte_level ? !kvp_tok_bpe_set_piece(t, id, x->string, len)
                          : !(t->pieces[id] = kvp_tok_copy_spm_piece(x->string, len, &t->lens[id])))
            return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
    }
    cJSON_ArrayForEach(x, h->added)
    {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(x, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
        t->types[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "special")) ? KVP_TOK_CONTROL : KVP_TOK_USER;
        kvp_free(t->pieces[id]);
        t->pieces[id] = NULL;
        t->raw[id] = 0;
        if (!kvp_tok_bpe_set_piece(t, id, content, strlen(content)))
            return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
    }
    for (int32_t i = 0; i < t->n; i++)
        if (!t->pieces[i]) { /* an id no piece has */
            t->types[i] = KVP_TOK_UNUSED;
            if (!kvp_tok_bpe_set_piece(t, i, "", 0)) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", h->path);
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

/* One step of a byte-level vocabulary's pre-tokenizer as a regex step of t: Split (a regex, behavior
 * "Isolated"), Digits ("\p{N}" one by one, or runs), ByteLevel (GPT-2's regex when use_regex). */
static kvp_status hf_pre_step(const hf_json *h, const cJSON *step, kvp_tokenizer *t)
{
    const char *ty = type_of(step);
    if (strcmp(ty, "Split") == 0) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(step, "pattern"), "Regex");
        const cJSON *bh = cJSON_GetObjectItemCaseSensitive(step, "behavior");
        if (!cJSON_IsString(re) || !cJSON_IsString(bh) || strcmp(bh->valuestring, "Isolated") != 0 ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(step, "invert")))
            return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer Split is supported with a \"Regex\" pattern, behavior "
                                             "\"Isolated\" and no invert",
                           h->path);
        return compile_pre(t, re->valuestring, h->path);
    }
    if (strcmp(ty, "Digits") == 0)
        return compile_pre(t, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(step, "individual_digits")) ? "\\p{N}" : "\\p{N}+",
                           h->path);
    if (strcmp(ty, "ByteLevel") == 0) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(step, "add_prefix_space")))
            return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel with add_prefix_space is not supported", h->path);
        return cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(step, "use_regex")) ? KVP_OK : compile_pre(t, RE_GPT2, h->path);
    }
    return KVP_ERR(KVP_EUNSUPPORTED, "%s: pre_tokenizer '%s' is not supported with a byte-level vocabulary (Split, Digits "
                                     "and ByteLevel are)",
                   h->path, ty);
}

/* The pre-tokenizer of a byte-level vocabulary: its steps in order (a Sequence, or one step). */
static kvp_status hf_pre(const hf_json *h, kvp_tokenizer *t)
{
    if (!cJSON_IsObject(h->pre)) return KVP_OK; /* none: the whole text is one pre-token */
    if (strcmp(type_of(h->pre), "Sequence") != 0) return hf_pre_step(h, h->pre, t);
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(h->pre, "pretokenizers")) KVP_TRY(hf_pre_step(h, x, t));
    return KVP_OK;
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
