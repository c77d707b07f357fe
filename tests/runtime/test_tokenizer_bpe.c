/* BPE tokenizers (Llama-3, Qwen2, GPT-2, DeepSeek-Coder, Command-R and Tekken pre-tokenizers; Llama-2's sentencepiece
 * vocabulary as tokenizer.json) against Hugging Face's tokenizers.
 *
 * tests/data/tokenizers/ (written by scripts/bpe-tokenizer-fixture.py) holds six small vocabularies trained
 * by Hugging Face's trainer, each as tokenizer.json and as the GGUF llama.cpp's converter writes, and
 * cases.json: Hugging Face's own encodings of fixed and random strings. Both files of each vocabulary must
 * give exactly those ids, and decode them back to the text.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_testutil.h"
#include "common/alloc.h"
#include "common/json.h"
#include "model_testutil.h"
#include "runtime/loader/gguf.h"
#include "runtime/text/tokenizer.h"

#define TOKDIR "tests/data/tokenizers"
static const char *const k_families[] = {"llama3", "qwen2", "gpt2", "deepseek", "commandr", "tekken", "qwen35"};

static kvp_tokenizer *load_json(const char *family)
{
    char path[256];
    snprintf(path, sizeof path, TOKDIR "/%s/tokenizer.json", family);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_from_hf_json(path, &t), KVP_OK, "%s", kvp_error_detail());
    return t;
}

static kvp_tokenizer *load_gguf(const char *family)
{
    char path[256];
    snprintf(path, sizeof path, TOKDIR "/%s.gguf", family);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_load(path, 0, &t), KVP_OK, "%s", kvp_error_detail());
    return t;
}

static cJSON *load_cases(void)
{
    cJSON *c;
    cr_assert_eq(kvp_json_parse_file(TOKDIR "/cases.json", &c), KVP_OK, "the fixture is missing: %s", kvp_error_detail());
    return c;
}

/* Every case of `family` encodes to Hugging Face's ids and decodes back to its text. */
static void check_cases(const kvp_tokenizer *t, const cJSON *cases, const char *family, const char *src)
{
    const cJSON *rows = cJSON_GetObjectItem(cases, family), *r;
    cr_assert_geq(cJSON_GetArraySize(rows), 70, "%s: too few cases", family);
    int k = 0;
    cJSON_ArrayForEach(r, rows)
    {
        const char *text = cJSON_GetObjectItem(r, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(r, "ids");
        int special = cJSON_IsTrue(cJSON_GetObjectItem(r, "special"));
        int32_t *ids, n;
        unsigned flags = KVP_TOK_ADD_BOS | (special ? KVP_TOK_PARSE_SPECIAL : 0);
        cr_assert_eq(kvp_tok_encode_ex(t, text, strlen(text), flags, &ids, &n), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(n, cJSON_GetArraySize(want), "%s %s case %d '%s': %d ids, Hugging Face %d", family, src, k, text, n,
                     cJSON_GetArraySize(want));
        for (int32_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], cJSON_GetArrayItem(want, i)->valueint, "%s %s case %d '%s': id %d is %d, Hugging Face %d",
                         family, src, k, text, i, ids[i], cJSON_GetArrayItem(want, i)->valueint);
        if (!special) {
            char *back;
            cr_assert_eq(kvp_tok_decode(t, -1, ids, n, &back), KVP_OK);
            cr_assert_str_eq(back, text, "%s %s case %d: the decode is not the text", family, src, k);
            kvp_free(back);
        }
        kvp_free(ids);
        k++;
    }
}

Test(tokenizer_bpe, json_and_gguf_match_hugging_face)
{
    cJSON *cases = load_cases();
    for (size_t f = 0; f < sizeof k_families / sizeof *k_families; f++) {
        kvp_tokenizer *j = load_json(k_families[f]), *g = load_gguf(k_families[f]);
        check_cases(j, cases, k_families[f], "tokenizer.json");
        check_cases(g, cases, k_families[f], "gguf");
        cr_assert_eq(kvp_tok_vocab_size(j), kvp_tok_vocab_size(g));
        cr_assert_eq(kvp_tok_bos(j), kvp_tok_bos(g), "%s", k_families[f]);
        cr_assert_eq(kvp_tok_adds_bos(j), kvp_tok_adds_bos(g), "%s", k_families[f]);
        cr_assert_eq(kvp_tok_eos(j), kvp_tok_eos(g), "%s", k_families[f]);
        kvp_tok_destroy(j);
        kvp_tok_destroy(g);
    }
    cJSON_Delete(cases);
}

/* The Llama-2-style tokenizer.json of stories260K's vocabulary (merges instead of scores) gives Hugging Face's
 * ids, and so does the same vocabulary read from the model's GGUF (scores, run.c's algorithm). */
Test(tokenizer_bpe, llama2_style_json_and_the_gguf_match_hugging_face)
{
    tu_require_shared();
    cJSON *cases = load_cases();
    kvp_tokenizer *j = load_json("spm");
    kvp_tokenizer *s = NULL;
    cr_assert_eq(kvp_tok_load(S260_GGUF, 0, &s), KVP_OK, "%s", kvp_error_detail());
    check_cases(j, cases, "spm", "tokenizer.json");
    check_cases(s, cases, "spm", "stories260K.gguf");
    cr_assert_eq(kvp_tok_bos(j), 1);
    cr_assert_eq(kvp_tok_eos(j), 2);
    kvp_tok_destroy(j);
    kvp_tok_destroy(s);
    cJSON_Delete(cases);
}

/* Llama-3 adds BOS, Qwen2 and GPT-2 do not; EOS is the configured one. */
Test(tokenizer_bpe, bos_and_eos)
{
    kvp_tokenizer *l = load_json("llama3"), *q = load_gguf("qwen2");
    size_t len;
    cr_assert(kvp_tok_adds_bos(l));
    cr_assert_str_eq(kvp_tok_piece(l, kvp_tok_bos(l), &len), "<|begin_of_text|>");
    cr_assert_str_eq(kvp_tok_piece(l, kvp_tok_eos(l), &len), "<|eot_id|>");
    cr_assert_not(kvp_tok_adds_bos(q));
    cr_assert_str_eq(kvp_tok_piece(q, kvp_tok_eos(q), &len), "<|im_end|>");
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(q, "hi", 2, 1, &ids, &n), KVP_OK);
    cr_assert(n >= 1 && kvp_tok_type_of(q, ids[0]) == KVP_TOK_NORMAL, "no BOS for Qwen2");
    kvp_free(ids);
    kvp_tok_destroy(l);
    kvp_tok_destroy(q);
}

/* Without KVP_TOK_PARSE_SPECIAL a control piece written in the text is text: no control id comes out and
 * the ids decode back to the text; with it, the piece is its id. */
Test(tokenizer_bpe, control_pieces_in_text_only_when_asked)
{
    kvp_tokenizer *t = load_gguf("qwen2");
    const char *text = "a<|im_start|>b";
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode_ex(t, text, strlen(text), 0, &ids, &n), KVP_OK);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(kvp_tok_type_of(t, ids[i]), KVP_TOK_NORMAL, "id %d", i);
    char *back;
    cr_assert_eq(kvp_tok_decode(t, -1, ids, n, &back), KVP_OK);
    cr_assert_str_eq(back, text);
    kvp_free(back);
    kvp_free(ids);
    cr_assert_eq(kvp_tok_encode_ex(t, text, strlen(text), KVP_TOK_PARSE_SPECIAL, &ids, &n), KVP_OK);
    int found = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        found += kvp_tok_type_of(t, ids[i]) == KVP_TOK_CONTROL &&
                 strcmp(kvp_tok_piece(t, ids[i], &len), "<|im_start|>") == 0;
    }
    cr_assert_eq(found, 1);
    kvp_free(ids);
    kvp_tok_destroy(t);
}

/* Bytes that are not UTF-8 still encode (each is a piece of a byte-level vocabulary) and decode back. */
Test(tokenizer_bpe, invalid_utf8_round_trips)
{
    kvp_tokenizer *t = load_json("llama3");
    const char text[] = "ok \xff\xfe caf\xc3 \xe2\x82 end\x80";
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(t, text, sizeof text - 1, 0, &ids, &n), KVP_OK, "%s", kvp_error_detail());
    char *back;
    cr_assert_eq(kvp_tok_decode(t, -1, ids, n, &back), KVP_OK);
    cr_assert_str_eq(back, text);
    kvp_free(back);
    kvp_free(ids);
    kvp_tok_destroy(t);
}

/* ---- bad files */

/* Writes the llama3 tokenizer.json with the first occurrence of `from` replaced by `to` into a temporary
 * folder, and loads it: the status, and the message in msg. */
static kvp_status load_edited(const char *from, const char *to, char *msg, size_t cap)
{
    size_t len;
    char *s = (char *)tu_read_all(TOKDIR "/llama3/tokenizer.json", &len);
    char *at = strstr(s, from);
    cr_assert(at, "'%s' is not in the file", from);
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", tu_tmpdir());
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(s, 1, (size_t)(at - s), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(s);
    kvp_tokenizer *t = NULL;
    kvp_status st = kvp_tok_from_hf_json(path, &t);
    snprintf(msg, cap, "%s", st == KVP_OK ? "" : kvp_error_message());
    if (st == KVP_OK) kvp_tok_destroy(t);
    else cr_assert_null(t);
    return st;
}

/* A normal piece not spelled in GPT-2's byte form (Command-R's vocabulary has some: "\u200d" beside its byte
 * spelling "âĢį") decodes to its text, but text never encodes to it: Hugging Face's byte-level encoder
 * looks pieces up by their byte spelling. */
Test(tokenizer_bpe, raw_spelled_pieces_never_match_text)
{
    kvp_tokenizer *plain = load_json("llama3");
    /* the same file with a piece 512 spelled "\u200d" raw (a code point GPT-2's byte map does not use; its
     * bytes e2 80 8d spell "âĢį"); under Llama-3's ignore_merges a pre-token of exactly those bytes would be
     * looked up whole */
    size_t len;
    char *s = (char *)tu_read_all(TOKDIR "/llama3/tokenizer.json", &len);
    char *at = strstr(s, "\"vocab\": {");
    cr_assert(at);
    at += strlen("\"vocab\": {");
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", tu_tmpdir());
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(at - s), f);
    fputs("\"\\u200d\": 512, ", f);
    fputs(at, f);
    fclose(f);
    free(s);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_from_hf_json(path, &t), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_tok_vocab_size(t), 513);
    const char *text = "a\xe2\x80\x8d b \xe2\x80\x8d";
    int32_t *a, na, *b, nb;
    cr_assert_eq(kvp_tok_encode(plain, text, strlen(text), 1, &a, &na), KVP_OK);
    cr_assert_eq(kvp_tok_encode(t, text, strlen(text), 1, &b, &nb), KVP_OK);
    cr_assert_eq(na, nb);
    for (int32_t i = 0; i < na; i++) cr_assert_eq(a[i], b[i], "token %d", i);
    int32_t id = 512;
    char *dec;
    cr_assert_eq(kvp_tok_decode(t, -1, &id, 1, &dec), KVP_OK);
    cr_assert_str_eq(dec, "\xe2\x80\x8d");
    kvp_free(dec);
    kvp_free(a);
    kvp_free(b);
    kvp_tok_destroy(t);
    kvp_tok_destroy(plain);
}

Test(tokenizer_bpe, bad_tokenizer_json_names_the_problem)
{
    char msg[512];
    const struct {
        const char *from, *to;
        kvp_status st;
        const char *says;
    } cases[] = {
        {"\"type\": \"BPE\"", "\"type\": \"Unigram\"", KVP_EUNSUPPORTED, "Unigram"},
        {"\"merges\": [", "\"merges\": [[\"Ġ\", \"zzqq\"], ", KVP_EPARSE, "merge 0"},
        {"\"merges\": [", "\"merges\": [\"Ġ\", ", KVP_EPARSE, "merge 0"},
        {"\"merges\": [", "\"merges\": [[\"Ġ\", \"Ġ\", \"Ġ\"], ", KVP_EPARSE, "merge 0"},
        {"\"Ġ\": 225", "\"Ġ\": -3", KVP_EPARSE, "model.vocab"},
        {"\"id\": 0,", "\"id\": \"zero\",", KVP_EPARSE, "added_tokens[0]"},
        {"(?i:'s", "(?i:('s", KVP_EUNSUPPORTED, "regex"},
        {"\"type\": \"Split\"", "\"type\": \"Whitespace\"", KVP_EUNSUPPORTED, "Whitespace"},
        {"{", "[", KVP_EPARSE, "tokenizer.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvp_status st = load_edited(cases[i].from, cases[i].to, msg, sizeof msg);
        cr_assert_eq(st, cases[i].st, "case %zu: %s (%s)", i, kvp_status_str(st), msg);
        cr_assert(strstr(msg, "tokenizer.json") && strstr(msg, cases[i].says), "case %zu: %s", i, msg);
    }
}

Test(tokenizer_bpe, unknown_gguf_pre_tokenizer_is_refused)
{
    size_t len;
    unsigned char *b = tu_read_all(TOKDIR "/qwen2.gguf", &len);
    size_t at = tu_gguf_find_str(b, len, "qwen2");
    cr_assert(at > 0);
    memcpy(b + at + 8, "qwenX", 5);
    char path[300];
    snprintf(path, sizeof path, "%s/pre.gguf", tu_tmpdir());
    tu_write_all(path, b, len);
    free(b);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_OK);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_from_gguf(g, &t), KVP_EUNSUPPORTED);
    cr_assert(strstr(kvp_error_message(), "qwenX") && strstr(kvp_error_message(), "pre.gguf"), "%s", kvp_error_message());
    cr_assert_null(t);
    kvp_gguf_close(g);
}

/* Without tokenizer.ggml.add_bos_token, BOS is added as llama.cpp decides for the pre-tokenizer: tekken and
 * llama-bpe add it, deepseek-coder does not; with the key, the key decides (all three fixtures say true). */
Test(tokenizer_bpe, gguf_without_add_bos_takes_the_pre_tokenizers_default)
{
    static const struct {
        const char *family;
        int adds;
    } k[] = {{"tekken", 1}, {"llama3", 1}, {"deepseek", 0}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char path[300];
        snprintf(path, sizeof path, TOKDIR "/%s.gguf", k[i].family);
        kvp_tokenizer *said = load_gguf(k[i].family);
        cr_assert(kvp_tok_adds_bos(said), "%s: the file says add BOS", k[i].family);
        kvp_tok_destroy(said);
        size_t len;
        unsigned char *b = tu_read_all(path, &len);
        size_t at = tu_gguf_find_str(b, len, "tokenizer.ggml.add_bos_token"); /* the key: renamed, so absent */
        cr_assert(at > 0, "%s: no add_bos_token key", path);
        memcpy(b + at + 8, "tokenizer.ggml.add_bos_tokeX", 28);
        snprintf(path, sizeof path, "%s/nobos-%s.gguf", tu_tmpdir(), k[i].family);
        tu_write_all(path, b, len);
        free(b);
        kvp_gguf *g;
        cr_assert_eq(kvp_gguf_open(path, &g), KVP_OK);
        kvp_tokenizer *t = NULL;
        cr_assert_eq(kvp_tok_from_gguf(g, &t), KVP_OK, "%s", kvp_error_message());
        cr_assert_eq(kvp_tok_adds_bos(t), k[i].adds, "%s without the key", k[i].family);
        kvp_tok_destroy(t);
        kvp_gguf_close(g);
    }
}

/* Names llama.cpp gives the same regexes as a checked family: the family's GGUF with its tokenizer.ggml.pre
 * renamed still gives Hugging Face's ids for every case of the family. */
Test(tokenizer_bpe, gguf_pre_aliases_take_their_familys_regexes)
{
    static const struct {
        const char *family, *pre, *alias;
    } k[] = {{"gpt2", "gpt-2", "olmo"},           {"gpt2", "gpt-2", "jais"},        {"gpt2", "gpt-2", "exaone4"},
             {"gpt2", "gpt-2", "phi-2"},          {"gpt2", "gpt-2", "gigachat"},    {"gpt2", "gpt-2", "a.x-4.0"},
             {"gpt2", "gpt-2", "mellum"},         {"gpt2", "gpt-2", "trillion"},    {"gpt2", "gpt-2", "granite-docling"},
             {"llama3", "llama-bpe", "falcon3"},  {"llama3", "llama-bpe", "falcon-h1"}, {"llama3", "llama-bpe", "pixtral"},
             {"llama3", "llama-bpe", "midm-2.0"}, {"llama3", "llama-bpe", "lfm2"},
             {"qwen2", "qwen2", "deepseek-r1-qwen"}, {"qwen2", "qwen2", "kormo"}, {"qwen2", "qwen2", "f2llmv2"},
             {"qwen2", "qwen2", "megrez"},        {"qwen2", "qwen2", "stablelm2"}, {"qwen2", "qwen2", "hunyuan"},
             {"qwen2", "qwen2", "solar-open"},
             {"commandr", "command-r", "smollm"}, {"commandr", "command-r", "codeshell"},
             {"commandr", "command-r", "exaone"}, {"commandr", "command-r", "minerva-7b"}};
    cJSON *cases = load_cases();
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char path[300];
        snprintf(path, sizeof path, TOKDIR "/%s.gguf", k[i].family);
        size_t len, old = strlen(k[i].pre), now = strlen(k[i].alias);
        unsigned char *b = tu_read_all(path, &len);
        size_t at = tu_gguf_find_str(b, len, k[i].pre); /* its u64 length, then the bytes; no tensors follow */
        cr_assert(at > 0, "%s: no '%s'", path, k[i].pre);
        tu_buf f = {0};
        uint64_t n = now;
        tu_put(&f, b, at);
        tu_put(&f, &n, 8);
        tu_put(&f, k[i].alias, now);
        tu_put(&f, b + at + 8 + old, len - at - 8 - old);
        snprintf(path, sizeof path, "%s/%s.gguf", tu_tmpdir(), k[i].alias);
        tu_write_all(path, f.p, f.n);
        free(f.p);
        free(b);
        kvp_tokenizer *t = NULL;
        cr_assert_eq(kvp_tok_load(path, 0, &t), KVP_OK, "%s: %s", k[i].alias, kvp_error_detail());
        check_cases(t, cases, k[i].family, k[i].alias);
        kvp_tok_destroy(t);
    }
    cJSON_Delete(cases);
}

static kvp_status tok_json(void *path, void **t) { return kvp_tok_from_hf_json(path, (kvp_tokenizer **)t); }
static kvp_status tok_gguf(void *g, void **t) { return kvp_tok_from_gguf(g, (kvp_tokenizer **)t); }
static void destroy_tok(void *t) { kvp_tok_destroy(t); }

typedef struct {
    kvp_tokenizer *t;
    const char *text;
} enc_ctx;
static kvp_status encode(void *c, void **ids)
{
    enc_ctx *e = c;
    int32_t n;
    return kvp_tok_encode_ex(e->t, e->text, strlen(e->text), KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL, (int32_t **)ids, &n);
}

/* Random edits of every vocabulary's tokenizer.json and GGUF: each mutant either loads, and then encodes and
 * decodes text without fault, or fails with an error naming its file. */
Test(tokenizer_bpe, random_corruption_loads_or_fails_cleanly)
{
    const char *dir = tu_tmpdir();
    uint64_t rng = 0x51f15e5d2c0ffee1ull;
    const char *texts[] = {"Hello, world! 123 4567", "  tabs\tand\nnewlines, caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
                           "<|begin_of_text|><s></s>[INST]"};
    int loaded = 0, trials = 0;
    for (size_t f = 0; f < sizeof k_families / sizeof *k_families; f++)
        for (int gguf = 0; gguf < 2; gguf++) {
            char src[256], dst[300], *name = gguf ? "mutant.gguf" : "tokenizer.json";
            snprintf(src, sizeof src, gguf ? TOKDIR "/%s.gguf" : TOKDIR "/%s/tokenizer.json", k_families[f]);
            snprintf(dst, sizeof dst, "%s/%s", dir, name);
            size_t len;
            unsigned char *orig = tu_read_all(src, &len), *c = malloc(len);
            for (int i = 0; i < 150; i++, trials++) {
                tu_write_mutant(dst, orig, c, len, 0, len, gguf, &rng);
                kvp_tokenizer *t = NULL;
                kvp_status st = gguf ? kvp_tok_load(dst, 0, &t) : kvp_tok_from_hf_json(dst, &t);
                if (st != KVP_OK) {
                    FZ_FAILED_CLEANLY(st, t, name, trials);
                    continue;
                }
                loaded++;
                for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
                    int32_t *ids = NULL, n = 0;
                    char *back = NULL;
                    if (kvp_tok_encode_ex(t, texts[k], strlen(texts[k]), KVP_TOK_ADD_BOS | KVP_TOK_PARSE_SPECIAL, &ids,
                                          &n) == KVP_OK &&
                        kvp_tok_decode(t, -1, ids, n, &back) == KVP_OK)
                        cr_assert_not_null(back);
                    kvp_free(back);
                    kvp_free(ids);
                }
                kvp_tok_destroy(t);
            }
            free(c);
            free(orig);
        }
    cr_assert(loaded > 0 && loaded < trials, "%d of %d mutants loaded", loaded, trials);
}

Test(tokenizer_bpe, survives_every_allocation_failure)
{
    tu_every_alloc_failure("qwen2 tokenizer.json", tok_json, destroy_tok, TOKDIR "/qwen2/tokenizer.json", 0);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(TOKDIR "/llama3.gguf", &g), KVP_OK);
    tu_every_alloc_failure("llama3 gguf", tok_gguf, destroy_tok, g, 0);
    kvp_gguf_close(g);
    enc_ctx e = {load_json("llama3"), "Hello<|eot_id|> world's 12345"};
    tu_every_alloc_failure("encode", encode, kvp_free, &e, 0);
    kvp_tok_destroy(e.t);
}

/* `kvpage tokenize`: Hugging Face's ids for the fixed cases of each vocabulary (texts passed as --text, read
 * from a tokenizer.json, a GGUF or a folder), --decode back to the texts, and bad command lines exit 2. */
Test(tokenizer_cli, tokenize_prints_hugging_faces_ids)
{
    cJSON *cases = load_cases();
    const char *srcs[3] = {TOKDIR "/qwen2/tokenizer.json", TOKDIR "/llama3.gguf", TOKDIR "/gpt2"};
    const char *fams[3] = {"qwen2", "llama3", "gpt2"};
    for (int k = 0; k < 3; k++) {
        const cJSON *rows = cJSON_GetObjectItem(cases, fams[k]);
        for (int c = 1; c < 6; c++) { /* cases 1..5: plain ASCII text, safe in single quotes */
            const cJSON *r = cJSON_GetArrayItem(rows, c), *want = cJSON_GetObjectItem(r, "ids");
            const char *text = cJSON_GetObjectItem(r, "text")->valuestring;
            char cmd[2048], *out, *err, exp[1024] = "";
            if (strchr(text, '\'')) continue;
            snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer %s --text '%s'", kvp_test_bin(), srcs[k], text);
            cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
            for (int i = 0; i < cJSON_GetArraySize(want); i++)
                snprintf(exp + strlen(exp), sizeof exp - strlen(exp), i ? " %d" : "%d", cJSON_GetArrayItem(want, i)->valueint);
            strcat(exp, "\n");
            cr_assert_str_eq(out, exp, "%s '%s'", fams[k], text);
            free(out);
            free(err);
            snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer %s --decode --text '%s'", kvp_test_bin(), srcs[k], exp);
            cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s", err);
            cr_assert_eq(strncmp(out, text, strlen(text)), 0, "decode: '%s' vs '%s'", out, text);
            free(out);
            free(err);
        }
    }
    cJSON_Delete(cases);
    char cmd0[512], *o0, *e0;
    snprintf(cmd0, sizeof cmd0, "%s tokenize --help", kvp_test_bin());
    cr_assert_eq(kvp_test_sh(cmd0, &o0, &e0), 0);
    cr_assert(strstr(o0, "usage: kvpage tokenize"), "%s", o0);
    free(o0);
    free(e0);
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"tokenize --text hi", "--tokenizer"},
        {"tokenize --tokenizer " TOKDIR "/qwen2.gguf --frobnicate", "frobnicate"},
        {"tokenize --tokenizer /nonexistent.gguf --text hi", "nonexistent"},
        {"tokenize --tokenizer " TOKDIR "/qwen2.gguf --decode --text '1 512'", "'512' is not a token id"},
        {"tokenize --tokenizer /tmp --text hi", "no tokenizer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cmd[1024], *out, *err;
        snprintf(cmd, sizeof cmd, "%s %s", kvp_test_bin(), bad[i].args);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s: %s", bad[i].args, err);
        cr_assert(strstr(err, bad[i].says), "%s: %s", bad[i].args, err);
        free(out);
        free(err);
    }
}
