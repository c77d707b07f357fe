/* Tokenizer tests: golden encodings of stories260K (GGUF and llama2.c vocabularies), decode of the golden
 * story, round trips with byte fallback, corrupted tokenizer files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "cli_testutil.h"
#include "common/json.h"
#include "model_testutil.h"
#include "runtime/text/tokenizer.h"

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

/* BOS/EOS ids outside the token list are an error naming the file and the key; 0xFFFFFFFF means none. */
Test(tokenizer, gguf_special_ids_outside_the_vocabulary_fail)
{
    tu_require_shared();
    size_t len;
    unsigned char *all = tu_read_all(S260_GGUF, &len), *c = malloc(len);
    char path[300];
    snprintf(path, sizeof path, "%s/special.gguf", tu_tmpdir());
    const struct {
        const char *key;
        uint32_t v;
    } cases[] = {{"tokenizer.ggml.bos_token_id", 100000}, {"tokenizer.ggml.eos_token_id", 512},
                 {"tokenizer.ggml.bos_token_id", 0x80000000u}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(c, all, len);
        tu_gguf_set_kv4(c, len, cases[i].key, 4, &cases[i].v);
        tu_write_all(path, c, len);
        kvp_gguf *g;
        cr_assert_eq(kvp_gguf_open(path, &g), KVP_OK, "%s", kvp_error_detail());
        kvp_tokenizer *t = NULL;
        cr_assert_eq(kvp_tok_from_gguf(g, &t), KVP_EPARSE, "case %zu", i);
        char v[32];
        snprintf(v, sizeof v, "%u", cases[i].v);
        const char *msg = kvp_error_message();
        cr_assert(strstr(msg, "special.gguf") && strstr(msg, cases[i].key) && strstr(msg, v), "case %zu: %s", i, msg);
        cr_assert_null(t);
        kvp_gguf_close(g);
    }
    memcpy(c, all, len);
    const uint32_t none = UINT32_MAX;
    tu_gguf_set_kv4(c, len, "tokenizer.ggml.bos_token_id", 4, &none);
    tu_write_all(path, c, len);
    kvp_gguf *g;
    cr_assert_eq(kvp_gguf_open(path, &g), KVP_OK);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_from_gguf(g, &t), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(kvp_tok_bos(t), -1);
    cr_assert_eq(kvp_tok_eos(t), 2);
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(t, "Once", 4, 1, &ids, &n), KVP_OK);
    cr_assert_neq(ids[0], 1, "no BOS to prepend");
    kvp_free(ids);
    kvp_tok_destroy(t);
    kvp_gguf_close(g);
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

/* ---- the merge heap against run.c's quadratic scan ---- */

/* The reference tokenizer: kvp_tok_encode as it was before the heap (run.c semantics, O(n^2)), over the
 * public accessors. Pieces are found by binary search in ids sorted by (length, bytes, id), so that among
 * equal pieces the lowest id wins, as in the tokenizer's table. */
typedef struct {
    const kvp_tokenizer *t;
    int32_t *sorted; /* ids of the normal and user pieces, non-empty */
    int32_t nsorted;
    int32_t byte_id[256];
    size_t max_len;
} ref_tok;

static const kvp_tokenizer *ref_sort_tok;

static int ref_cmp_piece(const char *a, size_t la, int32_t ia, const char *b, size_t lb, int32_t ib)
{
    if (la != lb) return la < lb ? -1 : 1;
    int c = memcmp(a, b, la);
    if (c) return c;
    return ia < ib ? -1 : ia > ib;
}

static int ref_cmp_ids(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la, lb;
    const char *pa = kvp_tok_piece(ref_sort_tok, a, &la), *pb = kvp_tok_piece(ref_sort_tok, b, &lb);
    return ref_cmp_piece(pa, la, a, pb, lb, b);
}

static void ref_init(ref_tok *r, const kvp_tokenizer *t)
{
    int32_t V = kvp_tok_vocab_size(t);
    r->t = t;
    r->sorted = malloc(sizeof(int32_t) * (size_t)V);
    r->nsorted = 0;
    r->max_len = 0;
    for (int b = 0; b < 256; b++) r->byte_id[b] = -1;
    for (int32_t id = 0; id < V; id++) {
        size_t len;
        const char *p = kvp_tok_piece(t, id, &len);
        if (len > r->max_len) r->max_len = len;
        kvp_tok_type ty = kvp_tok_type_of(t, id);
        unsigned b;
        char close;
        if (ty == KVP_TOK_BYTE && len == 6 && sscanf(p, "<0x%2X%c", &b, &close) == 2 && close == '>' &&
            r->byte_id[b] < 0)
            r->byte_id[b] = id;
        if ((ty == KVP_TOK_NORMAL || ty == KVP_TOK_USER) && len > 0) r->sorted[r->nsorted++] = id;
    }
    ref_sort_tok = t;
    qsort(r->sorted, (size_t)r->nsorted, sizeof(int32_t), ref_cmp_ids);
}

static int32_t ref_lookup(const ref_tok *r, const char *s, size_t len)
{
    int32_t lo = 0, hi = r->nsorted; /* first entry >= (s, len, id -1) */
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        size_t lm;
        const char *pm = kvp_tok_piece(r->t, r->sorted[mid], &lm);
        if (ref_cmp_piece(pm, lm, r->sorted[mid], s, len, -1) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo == r->nsorted) return -1;
    size_t l;
    const char *p = kvp_tok_piece(r->t, r->sorted[lo], &l);
    return l == len && memcmp(p, s, len) == 0 ? r->sorted[lo] : -1;
}

static size_t ref_utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

/* Returns the ids (malloc) and their count, or NULL when a byte has no piece. */
static int32_t *ref_encode(const ref_tok *r, const char *text, size_t len, int add_bos, int32_t *n_out)
{
    const kvp_tokenizer *t = r->t;
    int32_t *ids = malloc((len + 2) * sizeof *ids);
    char *buf = malloc(r->max_len * 2 + 8);
    int32_t n = 0;
    if (add_bos && kvp_tok_bos(t) >= 0) ids[n++] = kvp_tok_bos(t);
    int32_t first = n;
    if (len > 0) {
        int32_t sp = ref_lookup(r, " ", 1);
        if (sp >= 0) ids[n++] = sp;
        else if (r->byte_id[' '] >= 0) ids[n++] = r->byte_id[' '];
    }
    for (size_t i = 0; i < len;) {
        size_t cl = ref_utf8_len((unsigned char)text[i]);
        if (cl > len - i) cl = 1;
        for (size_t j = 1; j < cl; j++)
            if (((unsigned char)text[i + j] & 0xc0) != 0x80) cl = 1;
        int32_t id = ref_lookup(r, text + i, cl);
        if (id >= 0) {
            ids[n++] = id;
        } else {
            for (size_t j = 0; j < cl; j++) {
                int32_t b = r->byte_id[(unsigned char)text[i + j]];
                if (b < 0) {
                    free(ids);
                    free(buf);
                    return NULL;
                }
                ids[n++] = b;
            }
        }
        i += cl;
    }
    for (;;) {
        float best = -1e30f;
        int32_t best_id = -1, best_i = -1;
        for (int32_t i = first; i + 1 < n; i++) {
            size_t a, b;
            const char *pa = kvp_tok_piece(t, ids[i], &a), *pb = kvp_tok_piece(t, ids[i + 1], &b);
            if (a + b > r->max_len) continue;
            memcpy(buf, pa, a);
            memcpy(buf + a, pb, b);
            int32_t id = ref_lookup(r, buf, a + b);
            if (id >= 0 && kvp_tok_score(t, id) > best) {
                best = kvp_tok_score(t, id);
                best_id = id;
                best_i = i;
            }
        }
        if (best_i < 0) break;
        ids[best_i] = best_id;
        memmove(ids + best_i + 1, ids + best_i + 2, (size_t)(n - best_i - 2) * sizeof *ids);
        n--;
    }
    free(buf);
    *n_out = n;
    return ids;
}

/* kvp_tok_encode and the reference agree on text[0..len), with and without BOS; `what` names the case. */
static void check_same_as_ref(const ref_tok *r, const char *text, size_t len, const char *what)
{
    for (int bos = 0; bos < 2; bos++) {
        int32_t nw = 0, n = 0, *ids = NULL;
        int32_t *want = ref_encode(r, text, len, bos, &nw);
        kvp_status st = kvp_tok_encode(r->t, text, len, bos, &ids, &n);
        if (!want) {
            cr_assert_eq(st, KVP_EINVAL, "%s: the reference finds a byte without a piece, encode gave %s", what,
                         kvp_status_str(st));
            continue;
        }
        cr_assert_eq(st, KVP_OK, "%s: %s", what, kvp_error_message());
        cr_assert_eq(n, nw, "%s (bos %d, %zu bytes): %d tokens, the reference %d", what, bos, len, n, nw);
        for (int32_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], want[i], "%s (bos %d): token %d is %d, the reference %d", what, bos, i, ids[i],
                         want[i]);
        kvp_free(ids);
        free(want);
    }
}

/* Writes a random salad of up to `nwords` words from `words` into buf (NUL-terminated, at most cap bytes);
 * returns its length. */
static size_t salad(char *buf, size_t cap, const char *const *words, int nw, int nwords)
{
    static const char *const seps[] = {" ", " ", " ", ", ", ". ", "\n", "  ", "!", "\"", "'s "};
    size_t at = 0;
    for (int i = 0; i < nwords; i++) {
        const char *w = words[rand() % nw], *s = seps[rand() % (int)(sizeof seps / sizeof seps[0])];
        size_t lw = strlen(w), ls = strlen(s);
        if (at + lw + ls + 1 > cap) break;
        memcpy(buf + at, w, lw);
        memcpy(buf + at + lw, s, ls);
        at += lw + ls;
    }
    buf[at] = '\0';
    return at;
}

Test(tokenizer, heap_merges_match_the_quadratic_reference)
{
    kvp_gguf *g;
    kvp_tokenizer *ts[2] = {load_gguf_tok(&g), load_bin_tok()};
    cJSON *gold;
    cr_assert_eq(kvp_json_parse_file(S260_GOLDEN, &gold), KVP_OK);
    static const char *const words[] = {
        "Once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "She", "loved", "to",
        "play", "outside", "in", "the", "park", "One", "day", "saw", "big", "red", "ball", "wanted", "with",
        "it", "but", "too", "high", "mom", "said", "let's", "go", "sad", "and", "didn't", "know", "what", "do",
        "I", "want", "your", "can't", "find", "sorry", "help", "her", "Tim", "dog", "happy", "tree", "zzz",
        "qu", "xylophone", "h\xc3\xa9llo", "\xe2\x98\x83", "\xf0\x9f\x98\x80", "na\xc3\xafve", "\t", "42",
    };
    const int nwords = (int)(sizeof words / sizeof words[0]);
    for (int k = 0; k < 2; k++) {
        ref_tok r;
        ref_init(&r, ts[k]);
        char what[96];
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(gold, "cases"))
        {
            const char *p = cJSON_GetObjectItem(c, "prompt")->valuestring;
            const char *x = cJSON_GetObjectItem(c, "text")->valuestring;
            check_same_as_ref(&r, p, strlen(p), "golden prompt");
            check_same_as_ref(&r, x, strlen(x), "golden text");
        }
        check_same_as_ref(&r, "", 0, "empty text");
        char long_text[17 * 60 + 1] = "";
        for (int i = 0; i < 60; i++) strcat(long_text, "Once upon a time ");
        check_same_as_ref(&r, long_text, strlen(long_text), "60 x 'Once upon a time '");
        const unsigned seed = 4321;
        srand(seed);
        char buf[700];
        for (int iter = 0; iter < 200; iter++) {
            size_t len = salad(buf, sizeof buf, words, nwords, 1 + rand() % 40);
            snprintf(what, sizeof what, "vocab %d seed %u salad %d", k, seed, iter);
            check_same_as_ref(&r, buf, len, what);
        }
        /* Random bytes: byte fallback, invalid and truncated UTF-8, NULs, runs of one letter. */
        for (int iter = 0; iter < 300; iter++) {
            size_t len = (size_t)(rand() % 80);
            for (size_t i = 0; i < len; i++) {
                int kind = rand() % 4;
                buf[i] = kind == 0   ? (char)(rand() % 256)
                         : kind == 1 ? "eeeee  tt"[rand() % 9]
                                     : (char)(32 + rand() % 95);
            }
            snprintf(what, sizeof what, "vocab %d seed %u bytes %d", k, seed, iter);
            check_same_as_ref(&r, buf, len, what);
        }
        free(r.sorted);
    }
    cJSON_Delete(gold);
    kvp_tok_destroy(ts[0]);
    kvp_tok_destroy(ts[1]);
    kvp_gguf_close(g);
}

/* A llama2.c vocabulary made here where scores tie (the leftmost pair must win), where some pieces have
 * scores that never merge (-1e30 and below, NaN), +/-0 and +inf, a duplicate piece (the first id wins) and
 * a piece that spells a byte token's text ("<0x63>a": pieces concatenate verbatim). */
Test(tokenizer, heap_merges_match_the_reference_on_ties_and_odd_scores)
{
    static const struct {
        const char *piece;
        float score;
    } vocab[] = {
        {"<unk>", 0}, {"<s>", 0}, {"</s>", 0}, {"<0x63>", 0}, {"<0x20>", 0},
        {"a", 0}, {"b", 0}, {" ", 0},
        {"ab", -1}, {"ba", -1}, {"aa", -1}, {"bb", -1},
        {"aba", -1}, {"bab", -1}, {"abab", -2}, {" a", -1}, {" b", -1},
        {"aab", -0.0f}, {"abb", 0.0f}, {"bba", 1e30f}, {"baa", -1e30f}, {"aaa", -1e31f},
        {" ab", -INFINITY}, {" ba", NAN}, {"bbb", INFINITY}, {"ab", 5}, {"<0x63>a", -1}, {"a<0x63>", -1},
        {"abba", -2}, {"baab", -2}, {" aba", -2}, {"aabb", -2},
    };
    const int nv = (int)(sizeof vocab / sizeof vocab[0]);
    tu_buf b = {0};
    tu_u32(&b, 8);
    for (int i = 0; i < nv; i++) {
        tu_f32(&b, vocab[i].score);
        tu_u32(&b, (uint32_t)strlen(vocab[i].piece));
        tu_put(&b, vocab[i].piece, strlen(vocab[i].piece));
    }
    char path[300];
    snprintf(path, sizeof path, "%s/ties.bin", tu_tmpdir());
    tu_write_all(path, b.p, b.n);
    free(b.p);
    kvp_tokenizer *t = NULL;
    cr_assert_eq(kvp_tok_load_llama2c(path, 0, &t), KVP_OK, "%s", kvp_error_detail());
    ref_tok r;
    ref_init(&r, t);
    /* Equal scores, leftmost wins. " abab": pairs " a" ab ba ab all score -1 -> " a" b a b; then " ab" (-inf)
     * never merges, ba and ab tie -> " a" ba b; then " aba" (-2) loses to bab (-1) -> " a" bab (ids 15, 13). */
    int32_t *ids, n;
    cr_assert_eq(kvp_tok_encode(t, "abab", 4, 0, &ids, &n), KVP_OK);
    int32_t nw, *want = ref_encode(&r, "abab", 4, 0, &nw);
    cr_assert_eq(n, 2);
    cr_assert(ids[0] == 15 && ids[1] == 13, "got %d %d", ids[0], ids[1]);
    cr_assert_eq(nw, 2);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i]);
    kvp_free(ids);
    free(want);
    const unsigned seed = 99;
    srand(seed);
    char buf[64], what[64];
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = (size_t)(rand() % 40);
        for (size_t i = 0; i < len; i++) buf[i] = "aaabbb c"[rand() % 8];
        snprintf(what, sizeof what, "seed %u iter %d '%.*s'", seed, iter, (int)len, buf);
        check_same_as_ref(&r, buf, len, what);
    }
    /* 'x' has neither a piece nor a byte token. */
    cr_assert_eq(kvp_tok_encode(t, "abx", 3, 1, &ids, &n), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "0x78"), "%s", kvp_error_message());
    free(r.sorted);
    kvp_tok_destroy(t);
}

typedef struct {
    const kvp_tokenizer *t;
    const char *text;
} encode_ctx;

static kvp_status encode_for_alloc(void *ctx, void **out)
{
    encode_ctx *c = ctx;
    int32_t *ids = NULL, n;
    kvp_status st = kvp_tok_encode(c->t, c->text, strlen(c->text), 1, &ids, &n);
    *out = st == KVP_OK ? ids : NULL;
    return st;
}

Test(tokenizer, encode_survives_every_allocation_failure)
{
    kvp_tokenizer *t = load_bin_tok();
    encode_ctx c = {t, "Once upon a time, there was a little girl named Lily."};
    tu_every_alloc_failure("encode", encode_for_alloc, kvp_free, &c, 0);
    kvp_tok_destroy(t);
}

/* `tokenize --decode IDS` as documented: the ids after the option (one argument or several, or --decode=IDS)
 * are one text's; --decode --text IDS still works, and ids without --decode are an error. */
Test(tokenize_cli, decode_takes_the_ids_after_it)
{
    static const char *const forms[] = {
        "--decode 1 403 407 261 378", "--decode '1 403 407 261 378'", "--decode=1,403,407,261,378",
        "--decode --text '1 403 407 261 378'", "--text '1, 403, 407, 261, 378' --decode",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char cmd[512], *out, *err;
        snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer " S260_GGUF " %s", kvp_test_bin(), forms[i]);
        cr_assert_eq(kvp_test_sh(cmd, &out, &err), 0, "%s: %s", cmd, err);
        cr_assert_str_eq(out, "Once upon a time\n", "%s", cmd);
        free(out);
        free(err);
    }
    char cmd[512], *out, *err;
    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer " S260_GGUF " 1 403", kvp_test_bin());
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", out);
    cr_assert(strstr(err, "unexpected argument '1'") && strstr(err, "--decode"), "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer " S260_GGUF " --decode 1 512", kvp_test_bin());
    cr_assert_eq(kvp_test_sh(cmd, &out, &err), 2, "%s", out);
    cr_assert(strstr(err, "'512' is not a token id"), "%s", err);
    free(out);
    free(err);
}
