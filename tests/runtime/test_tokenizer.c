/* Tokenizer tests: golden encodings of stories260K (GGUF and llama2.c vocabularies), decode of the golden
 * story, round trips with byte fallback, corrupted tokenizer files. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "model_testutil.h"
#include "runtime/tokenizer.h"

static kvp_tokenizer *load_gguf_tok(kvp_gguf **g)
{
    tu_require_shared();
    cr_assert_eq(kvp_gguf_open(S260_GGUF, g), KVP_OK, "%s", kvp_error_detail());
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_from_gguf(*g, &t), KVP_OK, "%s", kvp_error_detail());
    return t;
}

static kvp_tokenizer *load_bin_tok(void)
{
    tu_require_shared();
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_load_llama2c(S260_TOKBIN, 512, &t), KVP_OK, "%s", kvp_error_detail());
    return t;
}

static void check_encode(const kvp_tokenizer *t, const char *text, const int32_t *want, int32_t nwant)
{
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(t, text, strlen(text), 1, &ids, &n), KVP_OK);
    cr_assert_eq(n, nwant, "'%s': %d tokens, want %d", text, n, nwant);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "'%s' token %d: %d, want %d", text, i, ids[i], want[i]);
    kvp_free(ids);
}

Test(tokenizer, golden_encodings_both_vocabularies)
{
    kvp_gguf *g;
    kvp_tokenizer *tg = load_gguf_tok(&g), *tb = load_bin_tok();
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
    {
        const char *prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        const cJSON *pt = cJSON_GetObjectItem(c, "prompt_tokens");
        int32_t want[256], nw = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, pt) want[nw++] = x->valueint;
        check_encode(tg, prompt, want, nw);
        check_encode(tb, prompt, want, nw);
        ncases++;
    }
    cr_assert_geq(ncases, 2);
    cr_assert_eq(kvp_tok_vocab_size(tg), 512);
    cr_assert_eq(kvp_tok_bos(tg), 1);
    cr_assert_eq(kvp_tok_eos(tb), 2);
    cJSON_Delete(gold);
    kvp_tok_destroy(tg);
    kvp_tok_destroy(tb);
    kvp_gguf_close(g);
}

Test(tokenizer, decodes_the_published_story)
{
    kvp_gguf *g;
    kvp_tokenizer *tg = load_gguf_tok(&g), *tb = load_bin_tok();
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
    {
        const cJSON *ta = cJSON_GetObjectItem(c, "tokens_after_bos"), *x;
        int32_t ids[1024], n = 0;
        cJSON_ArrayForEach(x, ta) ids[n++] = x->valueint;
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        kvp_tokenizer *ts[2] = {tg, tb};
        for (int k = 0; k < 2; k++) {
            char *text;
            cr_assert_eq(kvp_tok_decode(ts[k], 1, ids, n, &text), KVP_OK);
            cr_assert_str_eq(text, want);
            kvp_free(text);
        }
    }
    cJSON_Delete(gold);
    kvp_tok_destroy(tg);
    kvp_tok_destroy(tb);
    kvp_gguf_close(g);
}

Test(tokenizer, round_trips_with_byte_fallback)
{
    kvp_gguf *g;
    kvp_tokenizer *tg = load_gguf_tok(&g), *tb = load_bin_tok();
    const char *texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "Lily's mom said, \"Lily, let's go!\"\nThe end.",
        "h\xc3\xa9llo w\xc3\xb6rld \xe2\x98\x83 \xf0\x9f\x98\x80 tabs\tand\r\nlines",
        "\xff\xfe invalid utf-8 \xc3",
        "a",
        "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        "1234567890 !@#$%^&*()_+-=[]{}|;':,./<>?",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *a, *b, na, nb;
        cr_assert_eq(kvp_tok_encode(tg, texts[i], strlen(texts[i]), 1, &a, &na), KVP_OK);
        cr_assert_eq(kvp_tok_encode(tb, texts[i], strlen(texts[i]), 1, &b, &nb), KVP_OK);
        cr_assert_eq(na, nb, "text %zu: the two vocabularies disagree", i);
        for (int32_t j = 0; j < na; j++) cr_assert_eq(a[j], b[j], "text %zu token %d", i, j);
        cr_assert_eq(a[0], 1);
        char *back;
        cr_assert_eq(kvp_tok_decode(tg, -1, a, na, &back), KVP_OK);
        cr_assert_str_eq(back, texts[i], "text %zu did not round-trip", i);
        kvp_free(back);
        /* Without BOS the dummy prefix space stays. */
        kvp_free(a);
        cr_assert_eq(kvp_tok_encode(tg, texts[i], strlen(texts[i]), 0, &a, &na), KVP_OK);
        cr_assert_eq(kvp_tok_decode(tg, -1, a, na, &back), KVP_OK);
        cr_assert_eq(back[0], ' ');
        cr_assert_str_eq(back + 1, texts[i]);
        kvp_free(back);
        kvp_free(a);
        kvp_free(b);
    }
    /* Byte fallback really produces byte tokens: the snowman is not in a 512-piece vocabulary. */
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(tg, "\xe2\x98\x83", 3, 0, &ids, &n), KVP_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(ids[1], 0xe2 + 3);
    cr_assert_eq(ids[2], 0x98 + 3);
    cr_assert_eq(ids[3], 0x83 + 3);
    kvp_free(ids);
    cr_assert_eq(kvp_tok_encode(tg, "", 0, 1, &ids, &n), KVP_OK);
    cr_assert_eq(n, 1);
    kvp_free(ids);
    /* Control tokens decode to nothing; out-of-range ids are an error. */
    int32_t bad[3] = {1, 2, 600};
    char *s;
    cr_assert_eq(kvp_tok_decode(tg, -1, bad, 2, &s), KVP_OK);
    cr_assert_str_eq(s, "");
    kvp_free(s);
    cr_assert_eq(kvp_tok_decode(tg, -1, bad, 3, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "600"));
    kvp_tok_destroy(tg);
    kvp_tok_destroy(tb);
    kvp_gguf_close(g);
}

/* The merge rule: highest score first, leftmost on ties; checked against a brute-force re-implementation on
 * random strings over the letters the vocabulary knows. */
Test(tokenizer, merges_follow_scores_on_random_text)
{
    kvp_tokenizer *t = load_bin_tok();
    srand(1234);
    const char alphabet[] = " abdehilnostwyLO.,";
    for (int iter = 0; iter < 300; iter++) {
        char text[64];
        int len = 1 + rand() % 40;
        for (int i = 0; i < len; i++) text[i] = alphabet[rand() % (int)(sizeof alphabet - 1)];
        text[len] = '\0';
        int32_t *ids, n;
        cr_assert_eq(kvp_tok_encode(t, text, (size_t)len, 0, &ids, &n), KVP_OK);
        /* Every adjacent pair left must not be a vocabulary piece (else a merge was missed). */
        for (int32_t i = 0; i + 1 < n; i++) {
            size_t la, lb;
            const char *a = kvp_tok_piece(t, ids[i], &la), *b = kvp_tok_piece(t, ids[i + 1], &lb);
            char cat[64];
            memcpy(cat, a, la);
            memcpy(cat + la, b, lb);
            for (int32_t id = 3 + 256; id < kvp_tok_vocab_size(t); id++) {
                size_t lp;
                const char *p = kvp_tok_piece(t, id, &lp);
                cr_assert(!(lp == la + lb && memcmp(p, cat, lp) == 0), "seed 1234 iter %d: '%s' left unmerged pair", iter,
                          text);
            }
        }
        char *back;
        cr_assert_eq(kvp_tok_decode(t, 1, ids, n, &back), KVP_OK);
        cr_assert_str_eq(back, text);
        kvp_free(back);
        kvp_free(ids);
    }
    kvp_tok_destroy(t);
}

Test(tokenizer, corrupted_llama2c_files_fail_cleanly)
{
    tu_require_shared();
    size_t len;
    unsigned char *all = tu_read_all(S260_TOKBIN, &len);
    char path[300];
    snprintf(path, sizeof path, "%s/tok.bin", tu_tmpdir());
    for (size_t cut = 0; cut < len; cut += 13) {
        tu_write_all(path, all, cut);
        kvp_tokenizer *t = NULL;
        kvp_status st = kvp_tok_load_llama2c(path, 512, &t);
        cr_assert_eq(st, KVP_EPARSE, "cut %zu: %s", cut, kvp_status_str(st));
        cr_assert(strstr(kvp_error_message(), "tok.bin"));
        cr_assert_null(t);
    }
    /* A token length pointing past the end. */
    unsigned char *c = malloc(len);
    memcpy(c, all, len);
    int32_t huge = 1 << 30;
    memcpy(c + 4 + 4, &huge, 4);
    tu_write_all(path, c, len);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_load_llama2c(path, 512, &t), KVP_EPARSE);
    cr_assert(strstr(kvp_error_message(), "token 0"), "%s", kvp_error_message());
    free(c);
    free(all);
}

static kvp_status tok_from_gguf(void *g, void **t) { return kvp_tok_from_gguf(g, (kvp_tokenizer **)t); }
static kvp_status tok_llama2c(void *path, void **t) { return kvp_tok_load_llama2c(path, 512, (kvp_tokenizer **)t); }
static void destroy_tok(void *t) { kvp_tok_destroy(t); }

Test(tokenizer, load_survives_every_allocation_failure)
{
    tu_require_shared();
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(S260_GGUF, &g), KVP_OK);
    tu_every_alloc_failure("tokenizer from gguf", tok_from_gguf, destroy_tok, g, 0);
    tu_every_alloc_failure("llama2.c tokenizer", tok_llama2c, destroy_tok, S260_TOKBIN, 0);
    kvp_gguf_close(g);
}
