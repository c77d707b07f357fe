/* runtime/text/tokenizer.c — the vocabulary: lookup, specials, encoding (sentencepiece-style BPE with scores and
 * byte fallback, run.c semantics; byte-level BPE by merge rank) and decoding.
 *
 * Lookup of a byte string -> id is an open-addressing hash table (xxHash) over the pieces that may match
 * text (normal and user-defined pieces). Encoding merges with a linked list of symbols and a heap of
 * candidate pairs (O(n log n)), picking the same pair at every step as run.c's quadratic scan.
 *
 * Sentencepiece encoding, as llama2.c run.c and llama.cpp's SPM tokenizer: a dummy-prefix space when the
 * text is not empty, one piece per UTF-8 code point (or its bytes as <0xNN> pieces when the code point is
 * not in the vocabulary), then repeatedly merge the adjacent pair whose concatenation is a vocabulary piece
 * with the highest score (the leftmost on ties; scores of -1e30 and below, or NaN, never merge) until no
 * pair merges. Control, unknown and byte pieces never match text.
 *
 * Byte-level encoding, as Hugging Face's tokenizers: the text is split into pre-tokens by the model's
 * regexes in turn (PCRE2 with Unicode properties, each splitting what the ones before it left into matches
 * and gaps); each pre-token's bytes are one symbol each, and the adjacent pair with the lowest rank in the
 * merge list merges first (the leftmost on ties) until none does; with ignore_merges (Llama-3) a pre-token
 * that is itself a piece is that piece.
 */
#include "runtime/text/tokenizer_internal.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/log.h"
#include "runtime/loader/gguf.h"

void kvp_tok_destroy(kvp_tokenizer *t)
{
    if (!t) return;
    if (t->pieces)
        for (int32_t i = 0; i < t->n; i++) kvp_free(t->pieces[i]);
    kvp_free(t->pieces);
    kvp_free(t->lens);
    kvp_free(t->scores);
    kvp_free(t->types);
    kvp_free(t->raw);
    kvp_free(t->table);
    kvp_free(t->merges);
    kvp_free(t->special);
    for (int i = 0; i < t->npre; i++) pcre2_code_free(t->pre[i]);
    kvp_free(t);
}

kvp_tokenizer *kvp_tok_alloc(int32_t n)
{
    kvp_tokenizer *t = kvp_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n = n;
    t->pieces = kvp_calloc((size_t)n, sizeof *t->pieces);
    t->lens = kvp_calloc((size_t)n, sizeof *t->lens);
    t->scores = kvp_calloc((size_t)n, sizeof *t->scores);
    t->types = kvp_calloc((size_t)n, sizeof *t->types);
    t->raw = kvp_calloc((size_t)n, sizeof *t->raw);
    if (!t->pieces || !t->lens || !t->scores || !t->types || !t->raw) {
        kvp_tok_destroy(t);
        return NULL;
    }
    t->add_bos = 1;
    t->add_space_prefix = 1;
    return t;
}

int32_t kvp_tok_lookup(const kvp_tokenizer *t, const char *s, size_t len)
{
    uint64_t h = XXH3_64bits(s, len) & t->mask;
    for (;;) {
        int32_t id = t->table[h];
        if (id < 0) return -1;
        if (t->lens[id] == len && memcmp(t->pieces[id], s, len) == 0) return id;
        h = (h + 1) & t->mask;
    }
}

static int hex_byte(const char *p, size_t len, int *out)
{
    /* "<0xNN>" */
    if (len != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *out = v;
    return 1;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

kvp_status kvp_tok_finish(kvp_tokenizer *t, const char *what)
{
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    uint64_t cap = 16;
    while (cap < (uint64_t)t->n * 2) cap <<= 1;
    t->table = kvp_malloc(cap * sizeof *t->table);
    t->special = kvp_malloc((size_t)t->n * sizeof *t->special);
    /* the special list sorted longest piece first, then by id: (~len << 32 | id) ascending */
    uint64_t *order = kvp_malloc((size_t)t->n * sizeof *order);
    if (!t->table || !t->special || !order) {
        kvp_free(order);
        return KVP_ERR(KVP_ENOMEM, "%s: out of memory", what);
    }
    memset(t->table, 0xff, cap * sizeof *t->table);
    t->mask = cap - 1;
    for (int32_t i = 0; i < t->n; i++) {
        int b;
        if (!t->byte_level && hex_byte(t->pieces[i], t->lens[i], &b) &&
            (t->types[i] == KVP_TOK_BYTE || t->types[i] == 0)) {
            t->types[i] = KVP_TOK_BYTE;
            if (t->byte_id[b] < 0) t->byte_id[b] = i;
        }
        if (t->types[i] == 0) t->types[i] = KVP_TOK_NORMAL;
        if (t->lens[i] > t->max_len) t->max_len = t->lens[i];
        uint8_t ty = t->types[i];
        if (t->lens[i] > 0 && (ty == KVP_TOK_CONTROL || ty == KVP_TOK_USER || ty == KVP_TOK_UNKNOWN)) {
            order[t->nspecial++] = (uint64_t)(UINT32_MAX - t->lens[i]) << 32 | (uint32_t)i;
            t->special_first[(unsigned char)t->pieces[i][0]] = 1;
        }
        if ((ty != KVP_TOK_NORMAL && ty != KVP_TOK_USER) || t->raw[i]) continue;
        if (t->lens[i] == 0 || kvp_tok_lookup(t, t->pieces[i], t->lens[i]) >= 0) continue; /* first one wins */
        uint64_t h = XXH3_64bits(t->pieces[i], t->lens[i]) & t->mask;
        while (t->table[h] >= 0) h = (h + 1) & t->mask;
        t->table[h] = i;
    }
    if (t->byte_level)
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            t->byte_id[b] = kvp_tok_lookup(t, &c, 1);
        }
    qsort(order, (size_t)t->nspecial, sizeof *order, u64_cmp);
    for (int32_t i = 0; i < t->nspecial; i++) t->special[i] = (int32_t)(order[i] & UINT32_MAX);
    kvp_free(order);
    return KVP_OK;
}

/* Copies a piece replacing U+2581 (e2 96 81) with ' '. */
char *kvp_tok_copy_spm_piece(const char *s, size_t len, uint32_t *out_len)
{
    char *d = kvp_malloc(len + 1);
    if (!d) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && (unsigned char)s[i] == 0xe2 && (unsigned char)s[i + 1] == 0x96 &&
            (unsigned char)s[i + 2] == 0x81) {
            d[j++] = ' ';
            i += 2;
        } else {
            d[j++] = s[i];
        }
    }
    d[j] = '\0';
    *out_len = (uint32_t)j;
    return d;
}

int32_t kvp_tok_vocab_size(const kvp_tokenizer *t) { return t->n; }
int kvp_tok_adds_bos(const kvp_tokenizer *t) { return t->add_bos && t->bos >= 0; }
int32_t kvp_tok_bos(const kvp_tokenizer *t) { return t->bos; }
int32_t kvp_tok_eos(const kvp_tokenizer *t) { return t->eos; }

const char *kvp_tok_piece(const kvp_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n) return NULL;
    if (len) *len = t->lens[id];
    return t->pieces[id];
}

int32_t kvp_tok_special_id(const kvp_tokenizer *t, const char *text)
{
    size_t len = strlen(text);
    for (int32_t k = 0; k < t->nspecial; k++)
        if (t->lens[t->special[k]] == len && memcmp(t->pieces[t->special[k]], text, len) == 0) return t->special[k];
    return -1;
}

float kvp_tok_score(const kvp_tokenizer *t, int32_t id) { return id >= 0 && id < t->n ? t->scores[id] : 0.0f; }
kvp_tok_type kvp_tok_type_of(const kvp_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n ? (kvp_tok_type)t->types[id] : KVP_TOK_UNUSED;
}

static size_t utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1; /* stray continuation or invalid byte: on its own */
}

/* One adjacent pair that merges: symbol `l` (whose id was lid) followed by symbol `r` (id rid) make piece
 * `id` of score `score`. An entry is stale once either symbol has merged since (its id changed, or l is
 * gone: id -1); stale entries are skipped when they reach the top of the heap. */
typedef struct {
    float score;
    int32_t l, r;
    int32_t lid, rid;
    int32_t id;
} merge_cand;

/* Heap order: higher score first, then the leftmost pair (lower l), as run.c's scan that keeps the first of
 * equal scores. Scores in the heap are never NaN (see push_pair), so this is a total order. */
static int cand_before(const merge_cand *a, const merge_cand *b)
{
    return a->score > b->score || (a->score == b->score && a->l < b->l);
}

static void heap_push(merge_cand *h, size_t *n, merge_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, size_t *n)
{
    merge_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* The merge of pieces (l, r) in a BPE merge list, or NULL. */
static const kvp_tok_merge *find_merge(const kvp_tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (uint64_t h = XXH3_64bits(&key, sizeof key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        if (t->merges[h].key == key) return &t->merges[h];
        if (t->merges[h].key == UINT64_MAX) return NULL;
    }
}

/* Scratch space of one encode call, sized for the whole text. */
typedef struct {
    int32_t *next, *prev;
    merge_cand *heap;
    char *buf;
    pcre2_match_data *md;
} scratch;

/* Queues the pair (l, r) of symbols sym[] when they merge. With a merge list, by rank (the lowest first:
 * score = -rank, exact in a float below 2^24 merges). Otherwise when their pieces concatenate to a piece,
 * by its score: only scores above -1e30 merge (run.c starts its best score there and keeps a pair only when
 * strictly better; NaN never is). */
static void push_pair(const kvp_tokenizer *t, const int32_t *sym, int32_t l, int32_t r, scratch *s, size_t *nh)
{
    merge_cand c = {.l = l, .r = r, .lid = sym[l], .rid = sym[r]};
    if (t->merges) {
        const kvp_tok_merge *m = find_merge(t, sym[l], sym[r]);
        if (!m) return;
        c.score = -(float)m->rank;
        c.id = m->id;
    } else {
        uint32_t a = t->lens[sym[l]], b = t->lens[sym[r]];
        if (a + b > t->max_len) return;
        memcpy(s->buf, t->pieces[sym[l]], a);
        memcpy(s->buf + a, t->pieces[sym[r]], b);
        c.id = kvp_tok_lookup(t, s->buf, a + b);
        if (c.id < 0 || !(t->scores[c.id] > -1e30f)) return;
        c.score = t->scores[c.id];
    }
    heap_push(s->heap, nh, c);
}

/* Merges the symbols sym[0..ns) in place, O(n log n); returns how many remain. The symbols form a doubly
 * linked list; a merge keeps the left symbol with the merged id and unlinks the right one (id -1). The heap
 * holds every adjacent pair that merges, best first, plus stale pairs skipped when popped.
 *
 *   sym:  [ a ]<->[ b ]<->[ c ]<->[ d ]     merge (b, c) = bc:   [ a ]<->[ bc ]<->[ d ]   [ c ] = -1
 *   heap: (a,b) (b,c) (c,d)                 then push (a, bc) and (bc, d); (a,b), (c,d) are stale
 *
 * Each step takes the same pair as run.c's scan (highest score, leftmost on ties) or as Hugging Face's BPE
 * (lowest rank, leftmost on ties), so the result is token-for-token theirs. */
static int32_t merge_run(const kvp_tokenizer *t, int32_t *sym, int32_t ns, scratch *s)
{
    int32_t *next = s->next, *prev = s->prev;
    size_t nh = 0;
    for (int32_t i = 0; i < ns; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < ns ? i + 1 : -1;
    }
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(t, sym, i, i + 1, s, &nh);
    while (nh > 0) {
        merge_cand c = heap_pop(s->heap, &nh);
        if (sym[c.l] != c.lid || next[c.l] != c.r || sym[c.r] != c.rid) continue; /* stale */
        sym[c.l] = c.id;
        sym[c.r] = -1;
        next[c.l] = next[c.r];
        if (next[c.l] >= 0) prev[next[c.l]] = c.l;
        if (prev[c.l] >= 0) push_pair(t, sym, prev[c.l], c.l, s, &nh);
        if (next[c.l] >= 0) push_pair(t, sym, c.l, next[c.l], s, &nh);
    }
    /* Symbol 0 never merges away (a merge keeps the left symbol): walk the list from it. */
    int32_t m = 0;
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = next[i]) sym[m++] = sym[i];
    return m;
}

static kvp_status no_byte_piece(const char *text, size_t at)
{
    unsigned char c = (unsigned char)text[at];
    return KVP_ERR(KVP_EINVAL, "tokenizer: byte 0x%02x at offset %zu has no piece and no <0x%02X> byte-fallback token",
                   c, at, c);
}

/* Byte-level BPE of one pre-token text[a..b) (offsets into the whole text, for messages). */
static kvp_status encode_pretoken(const kvp_tokenizer *t, const char *text, size_t a, size_t b, int32_t *ids,
                                  int32_t *n, scratch *s)
{
    int32_t whole = t->ignore_merges ? kvp_tok_lookup(t, text + a, b - a) : -1;
    if (whole >= 0) {
        ids[(*n)++] = whole;
        return KVP_OK;
    }
    int32_t first = *n;
    for (size_t i = a; i < b; i++) {
        int32_t id = t->byte_id[(unsigned char)text[i]];
        if (id < 0) return no_byte_piece(text, i);
        ids[(*n)++] = id;
    }
    *n = first + merge_run(t, ids + first, *n - first, s);
    return KVP_OK;
}

/* Pre-tokenizer step k on text[a..b) (a piece the steps before it left): its matches and the gaps between them
 * go on to step k + 1, and past the last step to the merges. The regex sees the piece as a whole subject (^, $
 * and lookarounds stop at its ends). An empty match is skipped over one code point; invalid UTF-8 bytes never
 * match and fall in gaps. */
static kvp_status pre_split(const kvp_tokenizer *t, int k, const char *text, size_t a, size_t b, int32_t *ids,
                            int32_t *n, scratch *s)
{
    if (k == t->npre) return encode_pretoken(t, text, a, b, ids, n, s);
    size_t at = a;
    while (at < b) {
        size_t ms = b, me = b;
        int rc = pcre2_match(t->pre[k], (PCRE2_SPTR)(text + a), b - a, at - a, 0, s->md, NULL);
        if (rc >= 0) { /* 0: the ovector holds only the whole match, all we read */
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            ms = a + ov[0];
            me = ov[1] > ov[0] ? a + ov[1] : ms + 1;
            while (me < b && ((unsigned char)text[me] & 0xc0) == 0x80) me++;
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return KVP_ERR(KVP_EINVAL, "tokenizer: pre-tokenizer regex %d failed at offset %zu (PCRE2 error %d)", k, at,
                           rc);
        }
        if (ms > at) KVP_TRY(pre_split(t, k + 1, text, at, ms, ids, n, s));
        if (me > ms) KVP_TRY(pre_split(t, k + 1, text, ms, me, ids, n, s));
        at = me;
    }
    return KVP_OK;
}

/* Appends the ids of text[a..b), a run with no special piece in it, at ids[*n]. */
static kvp_status encode_run(const kvp_tokenizer *t, const char *text, size_t a, size_t b, int32_t *ids,
                             int32_t *n, scratch *s)
{
    if (t->byte_level) return a < b ? pre_split(t, 0, text, a, b, ids, n, s) : KVP_OK;
    /* sentencepiece: a dummy-prefix space, one symbol per code point (or its <0xNN> bytes), then merges */
    int32_t first = *n;
    if (b > a && t->add_space_prefix) {
        int32_t sp = kvp_tok_lookup(t, " ", 1);
        if (sp >= 0) ids[(*n)++] = sp;
        else if (t->byte_id[' '] >= 0) ids[(*n)++] = t->byte_id[' '];
    }
    for (size_t i = a; i < b;) {
        size_t cl = utf8_len((unsigned char)text[i]);
        if (cl > b - i) cl = 1;
        for (size_t j = 1; j < cl; j++)
            if (((unsigned char)text[i + j] & 0xc0) != 0x80) cl = 1;
        int32_t id = kvp_tok_lookup(t, text + i, cl);
        if (id >= 0) {
            ids[(*n)++] = id;
        } else {
            for (size_t j = 0; j < cl; j++) {
                int32_t bid = t->byte_id[(unsigned char)text[i + j]];
                if (bid < 0) return no_byte_piece(text, i + j);
                ids[(*n)++] = bid;
            }
        }
        i += cl;
    }
    *n = first + merge_run(t, ids + first, *n - first, s);
    return KVP_OK;
}

/* The special piece at text[i..len) (the longest), or -1. Control and unknown pieces only with parse_special;
 * user-defined pieces always (as Hugging Face's added tokens and llama.cpp's user-defined tokens). */
static int32_t special_at(const kvp_tokenizer *t, const char *text, size_t i, size_t len, int parse_special)
{
    if (!t->special_first[(unsigned char)text[i]]) return -1;
    for (int32_t k = 0; k < t->nspecial; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->types[id] != KVP_TOK_USER) continue;
        if (t->lens[id] <= len - i && memcmp(text + i, t->pieces[id], t->lens[id]) == 0) return id;
    }
    return -1;
}

kvp_status kvp_tok_encode_ex(const kvp_tokenizer *t, const char *text, size_t len, unsigned flags,
                             int32_t **ids_out, int32_t *n_out)
{
    if (len > (size_t)INT32_MAX / 4) return KVP_ERR(KVP_EINVAL, "text of %zu bytes is too long to encode", len);
    /* At most one id per byte, plus BOS, plus a dummy-prefix space per run (a run follows a special piece of
     * at least one byte): below 2 per byte + 2. The heap takes fewer than 3 entries per symbol of a run. */
    int32_t *ids = kvp_malloc((2 * len + 2) * sizeof *ids);
    scratch s = {.next = kvp_malloc((len + 2) * sizeof *s.next),
                 .prev = kvp_malloc((len + 2) * sizeof *s.prev),
                 .heap = kvp_malloc((len + 2) * 3 * sizeof *s.heap),
                 .buf = kvp_malloc((size_t)t->max_len * 2 + 8),
                 .md = t->npre ? pcre2_match_data_create(1, NULL) : NULL}; /* the whole match is all we read */
    kvp_status st = KVP_OK;
    if (!ids || !s.next || !s.prev || !s.heap || !s.buf || (t->npre && !s.md)) {
        st = KVP_ERR(KVP_ENOMEM, "tokenizer: out of memory encoding %zu bytes", len);
        goto out;
    }
    int32_t n = 0;
    if ((flags & KVP_TOK_ADD_BOS) && t->add_bos && t->bos >= 0) ids[n++] = t->bos;
    size_t run = 0;
    for (size_t i = 0; i < len;) {
        int32_t sp = special_at(t, text, i, len, (flags & KVP_TOK_PARSE_SPECIAL) != 0);
        if (sp < 0) {
            i++;
            continue;
        }
        if ((st = encode_run(t, text, run, i, ids, &n, &s)) != KVP_OK) goto out;
        ids[n++] = sp;
        i += t->lens[sp];
        run = i;
    }
    if ((st = encode_run(t, text, run, len, ids, &n, &s)) != KVP_OK) goto out;
    *ids_out = ids;
    *n_out = n;
    ids = NULL;
out:
    kvp_free(ids);
    kvp_free(s.next);
    kvp_free(s.prev);
    kvp_free(s.heap);
    kvp_free(s.buf);
    pcre2_match_data_free(s.md);
    return st;
}

kvp_status kvp_tok_encode(const kvp_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                          int32_t *n)
{
    return kvp_tok_encode_ex(t, text, len, add_bos ? KVP_TOK_ADD_BOS : 0, ids, n);
}

int kvp_tok_decode_piece(const kvp_tokenizer *t, int32_t prev, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n) return -1;
    uint8_t ty = t->types[id];
    if (ty == KVP_TOK_CONTROL || ty == KVP_TOK_UNKNOWN || ty == KVP_TOK_UNUSED) return 0;
    const char *p = t->pieces[id];
    size_t len = t->lens[id];
    int b;
    if (ty == KVP_TOK_BYTE && hex_byte(p, len, &b)) {
        if (cap < 1) return -1;
        buf[0] = (char)b;
        return 1;
    }
    if (t->add_space_prefix && prev >= 0 && prev == t->bos && len > 0 && p[0] == ' ') {
        p++;
        len--;
    }
    if (len > cap) return -1;
    memcpy(buf, p, len);
    return (int)len;
}

kvp_status kvp_tok_decode(const kvp_tokenizer *t, int32_t prev, const int32_t *ids, int32_t n, char **text)
{
    size_t cap = 1;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n)
            return KVP_ERR(KVP_EINVAL, "tokenizer: token id %d at index %d is out of range (vocab %d)", ids[i], i, t->n);
        cap += t->lens[ids[i]] + 1;
    }
    char *s = kvp_malloc(cap);
    if (!s) return KVP_ERR(KVP_ENOMEM, "tokenizer: out of memory decoding %d tokens", n);
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        int k = kvp_tok_decode_piece(t, prev, ids[i], s + at, cap - at);
        if (k == 1 && s[at] == '\0') k = 0; /* <0x00>: a C string cannot hold it (it would end the text) */
        if (k > 0) at += (size_t)k;
        prev = ids[i];
    }
    s[at] = '\0';
    *text = s;
    return KVP_OK;
}

