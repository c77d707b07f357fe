/* tests/prefix_cache/kv_events_testutil.h — an independent reader of KV event lines (prefix_cache/kv_events.h):
 * a small JSON parser of its own (64-bit hashes stay exact, which cJSON's doubles would not keep) and a
 * trivially correct index (a flat array searched linearly) that the events are replayed into. Shared by the
 * prefix-cache and bench tests. */
#ifndef KVP_TESTS_KV_EVENTS_TESTUTIL_H
#define KVP_TESTS_KV_EVENTS_TESTUTIL_H

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- a minimal JSON value tree --------------------------------------------------------------------- */

typedef enum { KJ_NULL, KJ_NUM, KJ_STR, KJ_ARR, KJ_OBJ } kj_kind;

typedef struct kj {
    kj_kind kind;
    char *text;      /* KJ_NUM: the number as written; KJ_STR: the string (no escapes are produced) */
    char **keys;     /* KJ_OBJ */
    struct kj *kids; /* KJ_ARR, KJ_OBJ */
    int n;
} kj;

static inline void kj_ws(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

/* Parses one value at *p into *v; returns 0, or -1 on a syntax error. */
static inline int kj_parse(const char **p, kj *v)
{
    memset(v, 0, sizeof *v);
    kj_ws(p);
    const char *s = *p;
    if (*s == '{' || *s == '[') {
        const int obj = *s == '{';
        v->kind = obj ? KJ_OBJ : KJ_ARR;
        (*p)++;
        kj_ws(p);
        if (**p == (obj ? '}' : ']')) {
            (*p)++;
            return 0;
        }
        for (;;) {
            v->kids = realloc(v->kids, (size_t)(v->n + 1) * sizeof *v->kids);
            if (obj) {
                v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
                kj key;
                if (kj_parse(p, &key) != 0 || key.kind != KJ_STR) return -1;
                v->keys[v->n] = key.text;
                kj_ws(p);
                if (*(*p)++ != ':') return -1;
            }
            if (kj_parse(p, &v->kids[v->n++]) != 0) return -1;
            kj_ws(p);
            if (**p == ',') {
                (*p)++;
                continue;
            }
            if (*(*p)++ != (obj ? '}' : ']')) return -1;
            return 0;
        }
    }
    if (*s == '"') {
        const char *e = strchr(s + 1, '"');
        if (e == NULL) return -1;
        v->kind = KJ_STR;
        v->text = strndup(s + 1, (size_t)(e - s - 1));
        *p = e + 1;
        return 0;
    }
    if (strncmp(s, "null", 4) == 0) {
        v->kind = KJ_NULL;
        *p = s + 4;
        return 0;
    }
    const char *e = s;
    while (*e == '-' || *e == '+' || *e == '.' || *e == 'e' || *e == 'E' || (*e >= '0' && *e <= '9')) e++;
    if (e == s) return -1;
    v->kind = KJ_NUM;
    v->text = strndup(s, (size_t)(e - s));
    *p = e;
    return 0;
}

static inline void kj_free(kj *v)
{
    for (int i = 0; i < v->n; i++) {
        kj_free(&v->kids[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->kids);
    free(v->keys);
    free(v->text);
    memset(v, 0, sizeof *v);
}

static inline const kj *kj_get(const kj *o, const char *key)
{
    for (int i = 0; o->kind == KJ_OBJ && i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0) return &o->kids[i];
    return NULL;
}

static inline uint64_t kj_u64(const kj *v)
{
    cr_assert(v && v->kind == KJ_NUM, "a number was expected");
    return strtoull(v->text, NULL, 10);
}

/* ---- the index the events are replayed into ------------------------------------------------------- */

typedef struct {
    uint64_t hash, parent; /* parent 0 with has_parent 0: a first block */
    int has_parent;
    int32_t tokens[64];
} kv_ix_block;

typedef struct {
    kv_ix_block *v;
    int64_t n, cap;
    int64_t next_seq;  /* the sequence number the next line must carry */
    double last_ts;
    int32_t bs;
    int64_t stored, removed, cleared; /* events applied */
} kv_index;

static inline int64_t kv_ix_find(const kv_index *ix, uint64_t h)
{
    for (int64_t i = 0; i < ix->n; i++)
        if (ix->v[i].hash == h) return i;
    return -1;
}

/* Applies one event line: checks its sequence number, time order, schema and each event's consistency (a stored
 * hash must be new, a removed one present); returns the number of events. */
static inline int kv_ix_apply_line(kv_index *ix, const char *line)
{
    kj root;
    const char *p = line;
    cr_assert_leq(ix->bs, 64, "the test index holds blocks of at most 64 tokens");
    cr_assert_eq(kj_parse(&p, &root), 0, "not JSON: %.200s", line);
    kj_ws(&p);
    cr_assert_eq(*p, '\0', "trailing text after the batch: %.80s", p);
    cr_assert_eq((int64_t)kj_u64(kj_get(&root, "seq")), ix->next_seq, "batches must be numbered 0, 1, 2, ...");
    ix->next_seq++;
    const double ts = strtod(kj_get(&root, "ts")->text, NULL);
    cr_assert_geq(ts, ix->last_ts, "time goes backwards");
    ix->last_ts = ts;
    const kj *evs = kj_get(&root, "events");
    cr_assert(evs && evs->kind == KJ_ARR && evs->n > 0, "a batch carries events");
    for (int e = 0; e < evs->n; e++) {
        const kj *ev = &evs->kids[e];
        const char *type = kj_get(ev, "type")->text;
        if (strcmp(type, "BlockStored") == 0) {
            const kj *hs = kj_get(ev, "block_hashes"), *toks = kj_get(ev, "token_ids"), *par = kj_get(ev, "parent_block_hash");
            cr_assert_eq((int32_t)kj_u64(kj_get(ev, "block_size")), ix->bs);
            cr_assert_str_eq(kj_get(ev, "medium")->text, "GPU");
            cr_assert(kj_get(ev, "lora_id") && kj_get(ev, "lora_name"), "vLLM's BlockStored has lora_id and lora_name");
            cr_assert(hs->n >= 1 && toks->n == hs->n * ix->bs, "%d hashes, %d tokens", hs->n, toks->n);
            for (int i = 0; i < hs->n; i++) {
                kv_ix_block b = {.hash = kj_u64(&hs->kids[i])};
                b.has_parent = i > 0 || par->kind != KJ_NULL;
                b.parent = i > 0 ? kj_u64(&hs->kids[i - 1]) : b.has_parent ? kj_u64(par) : 0;
                for (int32_t j = 0; j < ix->bs; j++) b.tokens[j] = (int32_t)strtol(toks->kids[i * ix->bs + j].text, NULL, 10);
                cr_assert_eq(kv_ix_find(ix, b.hash), -1, "block %" PRIu64 " stored twice", b.hash);
                if (ix->n == ix->cap) {
                    ix->cap = ix->cap ? 2 * ix->cap : 64;
                    ix->v = realloc(ix->v, (size_t)ix->cap * sizeof *ix->v);
                }
                ix->v[ix->n++] = b;
            }
            ix->stored++;
        } else if (strcmp(type, "BlockRemoved") == 0) {
            const kj *hs = kj_get(ev, "block_hashes");
            cr_assert_str_eq(kj_get(ev, "medium")->text, "GPU");
            for (int i = 0; i < hs->n; i++) {
                int64_t at = kv_ix_find(ix, kj_u64(&hs->kids[i]));
                cr_assert_geq(at, 0, "removed block %s was not stored", hs->kids[i].text);
                ix->v[at] = ix->v[--ix->n];
            }
            ix->removed++;
        } else {
            cr_assert_str_eq(type, "AllBlocksCleared");
            ix->n = 0;
            ix->cleared++;
        }
    }
    int n = evs->n;
    kj_free(&root);
    return n;
}

/* Applies every complete line of f from its current position; returns the lines applied. */
static inline int kv_ix_apply_file(kv_index *ix, FILE *f)
{
    char *line = NULL;
    size_t cap = 0;
    int lines = 0;
    while (getline(&line, &cap, f) > 0) {
        kv_ix_apply_line(ix, line);
        lines++;
    }
    clearerr(f);
    free(line);
    return lines;
}

#endif
