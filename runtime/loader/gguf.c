/* runtime/loader/gguf.c — GGUF reader. Parsing walks a cursor that checks every read against the file size. */
#include "runtime/loader/gguf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/loader/mapfile.h"

typedef struct {
    char *key; /* owned, NUL-terminated */
    kvp_gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
    } v;
    kvp_gguf_str s;          /* STRING */
    kvp_gguf_type arr_type;  /* ARRAY */
    uint64_t arr_n;
    const unsigned char *arr_data; /* numeric arrays: first element in the map */
    kvp_gguf_str *arr_strs;        /* string arrays: owned */
} gguf_kv;

typedef struct {
    char *name; /* owned */
    uint32_t ggml_type;
    kvp_wtype dtype;
    int32_t ndim;
    int64_t shape[KVP_TENSOR_MAX_DIMS]; /* row-major */
    int64_t numel;
    uint64_t offset;
    size_t nbytes;
} gguf_tensor;

struct kvp_gguf {
    kvp_mapfile map;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_start;
};

typedef struct {
    const unsigned char *p;
    uint64_t size, pos;
    const char *path;
} cursor;

static kvp_status need(cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return KVP_ERR(KVP_EPARSE, "%s: truncated or corrupt: %s at byte %" PRIu64 " needs %" PRIu64
                                   " bytes but the file has %" PRIu64 " left",
                       c->path, what, c->pos, n, c->size - c->pos);
    return KVP_OK;
}

static kvp_status rd_u32(cursor *c, uint32_t *v, const char *what)
{
    KVP_TRY(need(c, 4, what));
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return KVP_OK;
}

static kvp_status rd_u64(cursor *c, uint64_t *v, const char *what)
{
    KVP_TRY(need(c, 8, what));
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return KVP_OK;
}

static kvp_status rd_str(cursor *c, kvp_gguf_str *s, const char *what)
{
    uint64_t len;
    KVP_TRY(rd_u64(c, &len, what));
    KVP_TRY(need(c, len, what));
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += len;
    return KVP_OK;
}

static char *dup_str(kvp_gguf_str s)
{
    char *d = kvp_malloc(s.len + 1);
    if (!d) return NULL;
    memcpy(d, s.ptr, s.len);
    d[s.len] = '\0';
    return d;
}

static const char *type_name(uint32_t t)
{
    static const char *const names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32",  "float32",
                                        "bool",  "string", "array",  "uint64", "int64", "float64"};
    return t < KVP_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

static uint64_t scalar_size(uint32_t t)
{
    switch (t) {
    case KVP_GGUF_UINT8:
    case KVP_GGUF_INT8:
    case KVP_GGUF_BOOL: return 1;
    case KVP_GGUF_UINT16:
    case KVP_GGUF_INT16: return 2;
    case KVP_GGUF_UINT32:
    case KVP_GGUF_INT32:
    case KVP_GGUF_FLOAT32: return 4;
    case KVP_GGUF_UINT64:
    case KVP_GGUF_INT64:
    case KVP_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Reads a scalar of type t at p into the union (integers sign- or zero-extended, floats widened). */
static void load_scalar(gguf_kv *kv, uint32_t t, const unsigned char *p)
{
    switch (t) {
    case KVP_GGUF_UINT8:
    case KVP_GGUF_BOOL: kv->v.u = p[0]; break;
    case KVP_GGUF_INT8: kv->v.i = (int8_t)p[0]; break;
    case KVP_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; } break;
    case KVP_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; } break;
    case KVP_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; } break;
    case KVP_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; } break;
    case KVP_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f = x; } break;
    case KVP_GGUF_UINT64: memcpy(&kv->v.u, p, 8); break;
    case KVP_GGUF_INT64: memcpy(&kv->v.i, p, 8); break;
    case KVP_GGUF_FLOAT64: memcpy(&kv->v.f, p, 8); break;
    default: break;
    }
}

static kvp_status parse_kv(cursor *c, gguf_kv *kv, uint64_t idx)
{
    char what[96];
    snprintf(what, sizeof what, "metadata key %" PRIu64, idx);
    kvp_gguf_str key;
    KVP_TRY(rd_str(c, &key, what));
    if (key.len == 0 || key.len > 65536 || memchr(key.ptr, '\0', key.len))
        return KVP_ERR(KVP_EPARSE, "%s: corrupt metadata key %" PRIu64 " (length %" PRIu64 ") at byte %" PRIu64,
                       c->path, idx, key.len, c->pos - key.len);
    uint32_t t;
    KVP_TRY(rd_u32(c, &t, what));
    kv->key = dup_str(key);
    if (!kv->key) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", c->path);
    kv->type = (kvp_gguf_type)t;
    if (t == KVP_GGUF_STRING) return rd_str(c, &kv->s, kv->key);
    if (t == KVP_GGUF_ARRAY) {
        uint32_t at;
        uint64_t n;
        KVP_TRY(rd_u32(c, &at, kv->key));
        KVP_TRY(rd_u64(c, &n, kv->key));
        kv->arr_type = (kvp_gguf_type)at;
        kv->arr_n = n;
        if (at == KVP_GGUF_STRING) {
            if (n > (c->size - c->pos) / 8)
                return KVP_ERR(KVP_EPARSE, "%s: array '%s' claims %" PRIu64 " strings, more than the file can hold",
                               c->path, kv->key, n);
            kv->arr_strs = kvp_malloc((size_t)(n ? n : 1) * sizeof(kvp_gguf_str));
            if (!kv->arr_strs) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", c->path);
            for (uint64_t i = 0; i < n; i++) KVP_TRY(rd_str(c, &kv->arr_strs[i], kv->key));
            return KVP_OK;
        }
        uint64_t es = scalar_size(at);
        if (es == 0)
            return KVP_ERR(KVP_EPARSE, "%s: array '%s' has unsupported element type %u (%s)", c->path, kv->key, at,
                           type_name(at));
        if (n > (c->size - c->pos) / es)
            return KVP_ERR(KVP_EPARSE, "%s: truncated or corrupt: array '%s' of %" PRIu64 " x %s at byte %" PRIu64
                                       " runs past the end of the file",
                           c->path, kv->key, n, type_name(at), c->pos);
        kv->arr_data = c->p + c->pos;
        c->pos += n * es;
        return KVP_OK;
    }
    uint64_t es = scalar_size(t);
    if (es == 0) return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' has unknown value type %u", c->path, kv->key, t);
    KVP_TRY(need(c, es, kv->key));
    load_scalar(kv, t, c->p + c->pos);
    c->pos += es;
    return KVP_OK;
}

/* Names of ggml's types, for messages about the ones we cannot read. */
static const char *ggml_type_name(uint32_t t)
{
    static const char *const n[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
                                    "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                    "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
    if (t < sizeof n / sizeof n[0]) return n[t];
    if (t == 34 || t == 35) return t == 34 ? "TQ1_0" : "TQ2_0";
    if (t == 39) return "MXFP4";
    return "an unknown type";
}

static kvp_status unsupported_type(const cursor *c, const gguf_tensor *t)
{
    char list[160] = "";
    size_t at = 0;
    for (int i = 0; i < KVP_WT_COUNT && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", kvp_wtype_name((kvp_wtype)i));
    return KVP_ERR(KVP_EUNSUPPORTED, "%s: tensor '%s' has type %u (%s); supported: %s", c->path, t->name,
                   t->ggml_type, ggml_type_name(t->ggml_type), list);
}

static kvp_status parse_tensor(cursor *c, gguf_tensor *t, uint64_t idx)
{
    char what[64];
    snprintf(what, sizeof what, "tensor info %" PRIu64, idx);
    kvp_gguf_str name;
    KVP_TRY(rd_str(c, &name, what));
    if (name.len == 0 || name.len > 4096 || memchr(name.ptr, '\0', name.len))
        return KVP_ERR(KVP_EPARSE, "%s: corrupt name of tensor %" PRIu64, c->path, idx);
    t->name = dup_str(name);
    if (!t->name) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", c->path);
    uint32_t nd;
    KVP_TRY(rd_u32(c, &nd, t->name));
    if (nd < 1 || nd > KVP_TENSOR_MAX_DIMS)
        return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' has %u dimensions (1..%d supported)", c->path, t->name, nd,
                       KVP_TENSOR_MAX_DIMS);
    t->ndim = (int32_t)nd;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        KVP_TRY(rd_u64(c, &ne, t->name));
        if (ne == 0 || ne > ((uint64_t)1 << 40) || numel > ((uint64_t)1 << 50) / ne)
            return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' has an impossible dimension %u: %" PRIu64, c->path, t->name, d,
                           ne);
        numel *= ne;
        t->shape[nd - 1 - d] = (int64_t)ne; /* GGUF lists the innermost dimension first */
    }
    t->numel = (int64_t)numel;
    KVP_TRY(rd_u32(c, &t->ggml_type, t->name));
    KVP_TRY(rd_u64(c, &t->offset, t->name));
    if (!kvp_wtype_from_ggml(t->ggml_type, &t->dtype)) return unsupported_type(c, t);
    int32_t block = kvp_wtype_block(t->dtype);
    if (t->shape[nd - 1] % block)
        return KVP_ERR(KVP_EPARSE, "%s: %s tensor '%s' has a row of %" PRId64 " elements, not a multiple of its "
                                   "block of %d",
                       c->path, kvp_wtype_name(t->dtype), t->name, t->shape[nd - 1], block);
    t->nbytes = kvp_wtype_nbytes(t->dtype, t->numel);
    return KVP_OK;
}

static void gguf_free(kvp_gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) {
            kvp_free(g->kv[i].key);
            kvp_free(g->kv[i].arr_strs);
        }
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++) kvp_free(g->tensors[i].name);
    kvp_free(g->kv);
    kvp_free(g->tensors);
    kvp_mapfile_close(&g->map);
    kvp_free(g);
}

void kvp_gguf_close(kvp_gguf *g) { gguf_free(g); }

static const gguf_kv *find_kv(const kvp_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

static int cmp_range(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

/* No two tensors may share data bytes (every tensor has at least one element, so none is empty): sorted by
 * offset, each must start at or after the end of the one before. */
static kvp_status check_overlap(const kvp_gguf *g)
{
    if (g->n_tensors < 2) return KVP_OK;
    const gguf_tensor **by = kvp_malloc(g->n_tensors * sizeof *by);
    if (!by) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", g->map.path);
    for (uint64_t i = 0; i < g->n_tensors; i++) by[i] = &g->tensors[i];
    qsort(by, g->n_tensors, sizeof *by, cmp_range);
    kvp_status st = KVP_OK;
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const gguf_tensor *a = by[i - 1], *b = by[i];
        if (b->offset < a->offset + a->nbytes) {
            st = KVP_ERR(KVP_EPARSE, "%s: corrupt: the data of tensors '%s' (data offsets %" PRIu64 "..%" PRIu64
                                     ") and '%s' (%" PRIu64 "..%" PRIu64 ") overlap",
                         g->map.path, a->name, a->offset, a->offset + a->nbytes, b->name, b->offset,
                         b->offset + b->nbytes);
            break;
        }
    }
    kvp_free(by);
    return st;
}

static kvp_status parse(kvp_gguf *g)
{
    cursor c = {g->map.data, g->map.size, 0, g->map.path};
    uint32_t magic;
    KVP_TRY(rd_u32(&c, &magic, "the magic number"));
    if (magic != 0x46554747u) return KVP_ERR(KVP_EPARSE, "%s: not a GGUF file (bad magic number)", c.path);
    KVP_TRY(rd_u32(&c, &g->version, "the version"));
    if (g->version != 2 && g->version != 3)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)", c.path, g->version);
    uint64_t nt, nkv;
    KVP_TRY(rd_u64(&c, &nt, "the tensor count"));
    KVP_TRY(rd_u64(&c, &nkv, "the metadata count"));
    /* Each key/value takes at least 13 bytes and each tensor info at least 29: bound counts by the size. */
    if (nkv > c.size / 13 || nt > c.size / 29)
        return KVP_ERR(KVP_EPARSE, "%s: corrupt header: %" PRIu64 " tensors and %" PRIu64
                                   " metadata entries cannot fit in %" PRIu64 " bytes",
                       c.path, nt, nkv, c.size);
    g->kv = kvp_calloc(nkv ? nkv : 1, sizeof *g->kv);
    g->tensors = kvp_calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", c.path);
    for (uint64_t i = 0; i < nkv; i++) {
        g->n_kv = i + 1;
        KVP_TRY(parse_kv(&c, &g->kv[i], i));
    }
    g->n_kv = nkv;
    g->alignment = 32;
    const gguf_kv *al = find_kv(g, "general.alignment");
    if (al) {
        if (al->type != KVP_GGUF_UINT32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) || al->v.u > 65536)
            return KVP_ERR(KVP_EPARSE, "%s: general.alignment must be a uint32 power of two", c.path);
        g->alignment = al->v.u;
    }
    for (uint64_t i = 0; i < nt; i++) {
        g->n_tensors = i + 1;
        KVP_TRY(parse_tensor(&c, &g->tensors[i], i));
    }
    g->n_tensors = nt;
    uint64_t ds = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    g->data_start = ds;
    uint64_t data_size = ds <= c.size ? c.size - ds : 0;
    for (uint64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' offset %" PRIu64 " is not aligned to %" PRIu64, c.path,
                           t->name, t->offset, g->alignment);
        if (ds > c.size || t->offset > data_size || t->nbytes > data_size - t->offset)
            return KVP_ERR(KVP_EPARSE, "%s: truncated or corrupt: tensor '%s' (%zu bytes at data offset %" PRIu64
                                       ") runs past the end of the file (%" PRIu64 " data bytes)",
                           c.path, t->name, t->nbytes, t->offset, data_size);
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0)
                return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' appears twice", c.path, t->name);
    }
    return check_overlap(g);
}

kvp_status kvp_gguf_open(const char *path, kvp_gguf **out)
{
    if (!path || !out) return KVP_ERR(KVP_EINVAL, "kvp_gguf_open: NULL argument");
    kvp_gguf *g = kvp_calloc(1, sizeof *g);
    if (!g) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    kvp_status st = kvp_mapfile_open(path, &g->map);
    if (st == KVP_OK) st = parse(g);
    if (st != KVP_OK) {
        gguf_free(g);
        return st;
    }
    *out = g;
    return KVP_OK;
}

const char *kvp_gguf_path(const kvp_gguf *g) { return g->map.path; }
uint32_t kvp_gguf_version(const kvp_gguf *g) { return g->version; }
int64_t kvp_gguf_num_tensors(const kvp_gguf *g) { return (int64_t)g->n_tensors; }

void kvp_gguf_tensor_at(const kvp_gguf *g, int64_t i, kvp_tensor_view *v)
{
    const gguf_tensor *t = &g->tensors[i];
    memset(v, 0, sizeof *v);
    v->name = t->name;
    v->file = g->map.path;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    v->numel = t->numel;
    v->nbytes = t->nbytes;
    v->data = g->map.data + g->data_start + t->offset;
}

kvp_status kvp_gguf_tensor(const kvp_gguf *g, const char *name, kvp_tensor_view *out)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) {
            kvp_gguf_tensor_at(g, (int64_t)i, out);
            return KVP_OK;
        }
    return KVP_ERR(KVP_ENOTFOUND, "%s: tensor '%s' is missing", g->map.path, name);
}

static kvp_status lookup(const kvp_gguf *g, const char *key, int *present, const gguf_kv **kv)
{
    *kv = find_kv(g, key);
    if (present) *present = *kv != NULL;
    if (!*kv && !present) return KVP_ERR(KVP_ENOTFOUND, "%s: metadata key '%s' is missing", g->map.path, key);
    return KVP_OK;
}

static int is_int_type(kvp_gguf_type t)
{
    return t == KVP_GGUF_UINT8 || t == KVP_GGUF_INT8 || t == KVP_GGUF_UINT16 || t == KVP_GGUF_INT16 ||
           t == KVP_GGUF_UINT32 || t == KVP_GGUF_INT32 || t == KVP_GGUF_UINT64 || t == KVP_GGUF_INT64 ||
           t == KVP_GGUF_BOOL;
}

static int is_signed(kvp_gguf_type t)
{
    return t == KVP_GGUF_INT8 || t == KVP_GGUF_INT16 || t == KVP_GGUF_INT32 || t == KVP_GGUF_INT64;
}

static kvp_status wrong_type(const kvp_gguf *g, const gguf_kv *kv, const char *want)
{
    return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' is a %s, expected %s", g->map.path, kv->key, type_name(kv->type),
                   want);
}

kvp_status kvp_gguf_get_int(const kvp_gguf *g, const char *key, int64_t *out, int *present)
{
    const gguf_kv *kv;
    KVP_TRY(lookup(g, key, present, &kv));
    if (!kv) return KVP_OK;
    if (!is_int_type(kv->type)) return wrong_type(g, kv, "an integer");
    if (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %" PRIu64 " is out of range", g->map.path, key, kv->v.u);
    *out = is_signed(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return KVP_OK;
}

kvp_status kvp_gguf_get_float(const kvp_gguf *g, const char *key, double *out, int *present)
{
    const gguf_kv *kv;
    KVP_TRY(lookup(g, key, present, &kv));
    if (!kv) return KVP_OK;
    if (kv->type == KVP_GGUF_FLOAT32 || kv->type == KVP_GGUF_FLOAT64)
        *out = kv->v.f;
    else if (is_int_type(kv->type))
        *out = is_signed(kv->type) ? (double)kv->v.i : (double)kv->v.u;
    else
        return wrong_type(g, kv, "a number");
    return KVP_OK;
}

kvp_status kvp_gguf_get_str(const kvp_gguf *g, const char *key, kvp_gguf_str *out, int *present)
{
    const gguf_kv *kv;
    KVP_TRY(lookup(g, key, present, &kv));
    if (!kv) return KVP_OK;
    if (kv->type != KVP_GGUF_STRING) return wrong_type(g, kv, "a string");
    *out = kv->s;
    return KVP_OK;
}

kvp_status kvp_gguf_get_arr(const kvp_gguf *g, const char *key, kvp_gguf_type *elem, uint64_t *n, int *present)
{
    const gguf_kv *kv;
    KVP_TRY(lookup(g, key, present, &kv));
    if (!kv) return KVP_OK;
    if (kv->type != KVP_GGUF_ARRAY) return wrong_type(g, kv, "an array");
    *elem = kv->arr_type;
    *n = kv->arr_n;
    return KVP_OK;
}

kvp_status kvp_gguf_arr_str(const kvp_gguf *g, const char *key, const kvp_gguf_str **strs, uint64_t *n)
{
    const gguf_kv *kv;
    KVP_TRY(lookup(g, key, NULL, &kv));
    if (kv->type != KVP_GGUF_ARRAY || kv->arr_type != KVP_GGUF_STRING) return wrong_type(g, kv, "an array of strings");
    *strs = kv->arr_strs;
    *n = kv->arr_n;
    return KVP_OK;
}

static kvp_status numeric_array(const kvp_gguf *g, const char *key, uint64_t n, const gguf_kv **kv)
{
    KVP_TRY(lookup(g, key, NULL, kv));
    if ((*kv)->type != KVP_GGUF_ARRAY || scalar_size((*kv)->arr_type) == 0)
        return wrong_type(g, *kv, "a numeric array");
    if ((*kv)->arr_n != n)
        return KVP_ERR(KVP_EPARSE, "%s: metadata array '%s' has %" PRIu64 " entries, expected %" PRIu64, g->map.path,
                       key, (*kv)->arr_n, n);
    return KVP_OK;
}

kvp_status kvp_gguf_arr_f32(const kvp_gguf *g, const char *key, float *out, uint64_t n)
{
    const gguf_kv *kv;
    KVP_TRY(numeric_array(g, key, n, &kv));
    uint64_t es = scalar_size(kv->arr_type);
    for (uint64_t i = 0; i < n; i++) {
        gguf_kv tmp = {0};
        load_scalar(&tmp, kv->arr_type, kv->arr_data + i * es);
        if (kv->arr_type == KVP_GGUF_FLOAT32 || kv->arr_type == KVP_GGUF_FLOAT64)
            out[i] = (float)tmp.v.f;
        else
            out[i] = is_signed(kv->arr_type) ? (float)tmp.v.i : (float)tmp.v.u;
    }
    return KVP_OK;
}

kvp_status kvp_gguf_arr_i32(const kvp_gguf *g, const char *key, int32_t *out, uint64_t n)
{
    const gguf_kv *kv;
    KVP_TRY(numeric_array(g, key, n, &kv));
    if (!is_int_type(kv->arr_type)) return wrong_type(g, kv, "an integer array");
    uint64_t es = scalar_size(kv->arr_type);
    for (uint64_t i = 0; i < n; i++) {
        gguf_kv tmp = {0};
        load_scalar(&tmp, kv->arr_type, kv->arr_data + i * es);
        int64_t v = is_signed(kv->arr_type) ? tmp.v.i : (int64_t)tmp.v.u;
        if (v < INT32_MIN || v > INT32_MAX)
            return KVP_ERR(KVP_EPARSE, "%s: metadata array '%s'[%" PRIu64 "] = %" PRId64 " is out of int32 range",
                           g->map.path, key, i, v);
        out[i] = (int32_t)v;
    }
    return KVP_OK;
}

kvp_status kvp_gguf_special_token(const kvp_gguf *g, const char *key, int64_t n_vocab, int64_t *id)
{
    int present = 0;
    int64_t v = -1;
    KVP_TRY(kvp_gguf_get_int(g, key, &v, &present));
    if (!present || v == -1 || v == (int64_t)UINT32_MAX) {
        *id = -1;
        return KVP_OK;
    }
    if (v < 0 || v >= n_vocab)
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %" PRId64 " is outside the vocabulary (%" PRId64 " tokens)",
                       g->map.path, key, v, n_vocab);
    *id = v;
    return KVP_OK;
}

static kvp_status get_int_in(const kvp_gguf *g, const char *arch, const char *suffix, int required, int64_t min,
                             int64_t max, int64_t *out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int present = 0;
    KVP_TRY(kvp_gguf_get_int(g, key, out, &present));
    if (!present) {
        if (required) return KVP_ERR(KVP_EPARSE, "%s: metadata key '%s' is missing", g->map.path, key);
        return KVP_OK;
    }
    if (*out < min || *out > max)
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %" PRId64 " is out of range (%" PRId64 "..%" PRId64 ")",
                       g->map.path, key, *out, min, max);
    return KVP_OK;
}

static kvp_status get_pos_int(const kvp_gguf *g, const char *arch, const char *suffix, int required, int64_t max,
                              int64_t *out)
{
    return get_int_in(g, arch, suffix, required, 1, max, out);
}

/* LongRoPE as llama.cpp's converter writes it (Phi-3 128k): tensors rope_factors_long.weight and
 * rope_factors_short.weight, one divisor per rotary pair each (the model checks their count and values), and
 * rope.scaling.attn_factor, the whole scale of cos and sin. */
static kvp_status longrope_factors(const kvp_gguf *g, kvp_model_config *c)
{
    static const char *const names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    kvp_tensor_view v[2];
    int have[2];
    for (int i = 0; i < 2; i++) {
        have[i] = kvp_gguf_tensor(g, names[i], &v[i]) == KVP_OK;
        kvp_error_clear();
    }
    if (!have[0] && !have[1]) return KVP_OK;
    if (!have[0] || !have[1])
        return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' without '%s' (LongRoPE needs both)", g->map.path,
                       names[have[0] ? 0 : 1], names[have[0] ? 1 : 0]);
    if (c->rope_scaling_type[0])
        return KVP_ERR(KVP_EPARSE, "%s: LongRoPE factor tensors and rope.scaling.type '%s' contradict each other",
                       g->map.path, c->rope_scaling_type);
    for (int i = 0; i < 2; i++)
        if (v[i].ndim != 1 || v[i].shape[0] != v[0].shape[0] || v[i].shape[0] > KVP_MAX_ROPE_PAIRS)
            return KVP_ERR(KVP_EPARSE, "%s: tensor '%s' must be one vector of at most %d factors, as long as '%s'",
                           g->map.path, names[i], KVP_MAX_ROPE_PAIRS, names[0]);
    float f[KVP_MAX_ROPE_PAIRS];
    c->rope_n_factors = (int32_t)v[0].shape[0];
    for (int i = 0; i < 2; i++) {
        kvp_tensor_to_f32(&v[i], f);
        for (int32_t k = 0; k < c->rope_n_factors; k++) (i ? c->rope_short_factor : c->rope_long_factor)[k] = f[k];
    }
    snprintf(c->rope_scaling_type, sizeof c->rope_scaling_type, "longrope");
    return KVP_OK;
}

/* gemma, gemma2 and gemma3 as llama.cpp reads them: GeGLU (tanh); gemma2's soft caps (50 and 30 when absent,
 * llama.cpp's defaults; gemma3 has none); the window on every other layer (gemma2: the even ones) or on five
 * layers of six (gemma3: all but layers 5, 11, ...); gemma3's sliding layers' RoPE base (rope.freq_base_swa,
 * else llama.cpp's 10,000; unscaled); and the attention scale llama.cpp derives in place of
 * query_pre_attn_scalar, which GGUF does not keep: 1/sqrt(hidden / heads) for the 27B models (Gemma 2: 46
 * layers, Gemma 3: 62), else 1/sqrt(head_dim). The converter stores every norm weight as 1 + weight (q/k norms
 * too), so the norms need nothing more. */
static kvp_status gemma_keys(const kvp_gguf *g, const char *arch, kvp_model_config *c)
{
    c->ffn_act = KVP_ACT_GELU_TANH;
    const int g3 = !strcmp(arch, "gemma3");
    if (strcmp(arch, "gemma2") != 0 && !g3) return KVP_OK;
    c->post_norms = 1;
    char key[160];
    double f;
    int present;
    static const char *const caps[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
    double *out[2] = {&c->attn_logit_softcapping, &c->final_logit_softcapping};
    for (int i = 0; !g3 && i < 2; i++) {
        f = i ? 30.0 : 50.0;
        snprintf(key, sizeof key, "%s.%s", arch, caps[i]);
        KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
        if (!(f >= 0) || f > 1e30)
            return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %g is out of range [0, 1e30]", g->map.path, key, f);
        *out[i] = f;
    }
    if (g3) {
        f = 1e4;
        snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
        KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
        if (!(f > 0) || !isfinite(f))
            return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %g is out of range (a positive finite number)",
                           g->map.path, key, f);
        c->rope_local_theta = f;
    }
    c->query_pre_attn_scalar =
        c->num_layers == (g3 ? 62 : 46) ? (double)c->hidden_size / c->num_q_heads : c->head_dim;
    int64_t w = 0;
    KVP_TRY(get_int_in(g, arch, "attention.sliding_window", 0, 0, INT32_MAX, &w));
    c->sliding_window = w;
    for (int i = 0; i < c->num_layers; i++) c->layer_is_sliding[i] = w > 0 && (g3 ? i % 6 < 5 : i % 2 == 0);
    return KVP_OK;
}

kvp_status kvp_gguf_model_config(const kvp_gguf *g, kvp_model_config *cfg)
{
    kvp_gguf_str arch_s = {0};
    int present = 0;
    KVP_TRY(kvp_gguf_get_str(g, "general.architecture", &arch_s, &present));
    if (!present) return KVP_ERR(KVP_EPARSE, "%s: metadata 'general.architecture' is missing", g->map.path);
    char arch[64];
    if (arch_s.len >= sizeof arch) return KVP_ERR(KVP_EUNSUPPORTED, "%s: architecture name too long", g->map.path);
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = '\0';
    int qwen2 = strcmp(arch, "qwen2") == 0, qwen3 = strncmp(arch, "qwen3", 5) == 0, phi3 = strcmp(arch, "phi3") == 0;
    const int qwen3moe = strcmp(arch, "qwen3moe") == 0;
    const int gemma = !strcmp(arch, "gemma") || !strcmp(arch, "gemma2") || !strcmp(arch, "gemma3");
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "mistral") != 0 && !qwen2 && strcmp(arch, "qwen3") && !qwen3moe &&
        !phi3 && !gemma)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: architecture '%s' is not supported (llama, mistral, qwen2, qwen3, "
                       "qwen3moe, phi3, gemma, gemma2, gemma3 are)", g->map.path, arch);
    kvp_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "%s", arch);
    c.family = phi3 ? KVP_FAMILY_PHI3 : gemma ? KVP_FAMILY_GEMMA2 : KVP_FAMILY_LLAMA;
    int64_t v = 0;
    KVP_TRY(get_pos_int(g, arch, "block_count", 1, KVP_MAX_LAYERS, &v));
    c.num_layers = (int32_t)v;
    KVP_TRY(get_pos_int(g, arch, "embedding_length", 1, 1 << 20, &v));
    c.hidden_size = (int32_t)v;
    KVP_TRY(get_pos_int(g, arch, "feed_forward_length", 1, 1 << 24, &v));
    c.intermediate_size = v;
    /* Mixture of experts as llama.cpp writes it (Mixtral as arch llama, qwen3moe): every layer routes each
     * token to expert_used_count of expert_count experts of expert_feed_forward_length units (default: the
     * feed-forward length) and renormalizes their weights, as llama.cpp computes both. A dense llama may say
     * expert_count 0 (some converters write it, with expert_used_count 0). */
    v = 0;
    KVP_TRY(get_int_in(g, arch, "expert_count", qwen3moe, qwen3moe, 1 << 16, &v));
    if (v > 0) {
        c.family = KVP_FAMILY_MIXTRAL;
        c.num_experts = (int32_t)v;
        KVP_TRY(get_pos_int(g, arch, "expert_used_count", 1, c.num_experts, &v));
        c.num_experts_per_tok = (int32_t)v;
        v = c.intermediate_size;
        KVP_TRY(get_pos_int(g, arch, "expert_feed_forward_length", 0, 1 << 24, &v));
        c.moe_intermediate_size = v;
        c.moe_norm_topk = 1;
        memset(c.layer_is_moe, 1, sizeof c.layer_is_moe);
    }
    KVP_TRY(get_pos_int(g, arch, "attention.head_count", 1, 1 << 16, &v));
    c.num_q_heads = (int32_t)v;
    v = c.num_q_heads;
    KVP_TRY(get_pos_int(g, arch, "attention.head_count_kv", 0, 1 << 16, &v));
    c.num_kv_heads = (int32_t)v;
    if (c.hidden_size % c.num_q_heads != 0 && !qwen3 && !gemma)
        return KVP_ERR(KVP_EPARSE, "%s: embedding_length %d is not a multiple of head_count %d", g->map.path,
                       c.hidden_size, c.num_q_heads);
    v = c.hidden_size / c.num_q_heads;
    KVP_TRY(get_pos_int(g, arch, "attention.key_length", 0, 1 << 16, &v));
    c.head_dim = (int32_t)v;
    c.v_head_dim = c.head_dim;
    if (c.num_q_heads % c.num_kv_heads)
        return KVP_ERR(KVP_EPARSE, "%s: head_count %d is not a multiple of head_count_kv %d", g->map.path,
                       c.num_q_heads, c.num_kv_heads);
    v = 2048;
    KVP_TRY(get_pos_int(g, arch, "context_length", 0, INT32_MAX, &v));
    c.max_position_embeddings = v;
    char key[160];
    double f = 10000.0;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
    c.rope_theta = f;
    f = 1e-5;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
    c.rms_norm_eps = f;
    if (!(c.rope_theta > 0) || !isfinite(c.rope_theta))
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s.rope.freq_base' = %g is out of range (a positive finite number)",
                       g->map.path, arch, c.rope_theta);
    if (!(c.rms_norm_eps > 0) || c.rms_norm_eps > 1)
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s' = %g is out of range (0, 1]", g->map.path, key, c.rms_norm_eps);
    /* the leading dimensions of a head RoPE rotates (Phi-4-mini: 96 of 128) */
    v = c.head_dim;
    KVP_TRY(get_pos_int(g, arch, "rope.dimension_count", 0, 1 << 16, &v));
    if (v < 2 || v % 2 || v > c.head_dim)
        return KVP_ERR(KVP_EPARSE, "%s: metadata '%s.rope.dimension_count' = %" PRId64 " must be even, at least 2 "
                                   "and at most the head dimension, %d", g->map.path, arch, v, c.head_dim);
    c.rotary_dim = (int32_t)v;
    /* RoPE scaling, llama.cpp's keys: rope.scaling.type (llama.cpp's default, linear, when only a factor is
     * given; other types are refused by the model's checks), rope.scaling.factor (or the older
     * rope.scale_linear), original_context_length (yarn; default: context_length), and attn_factor, which
     * llama.cpp multiplies into yarn's default attention factor, 0.1 ln(factor) + 1. */
    kvp_gguf_str rs = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    KVP_TRY(kvp_gguf_get_str(g, key, &rs, &present));
    if (rs.len >= sizeof c.rope_scaling_type)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: metadata '%s' names an unknown type (%zu bytes)", g->map.path, key,
                       (size_t)rs.len);
    if (present && !(rs.len == 4 && memcmp(rs.ptr, "none", 4) == 0)) {
        memcpy(c.rope_scaling_type, rs.ptr, rs.len);
        c.rope_scaling_type[rs.len] = '\0';
    }
    f = 1.0;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
    snprintf(key, sizeof key, "%s.rope.scale_linear", arch);
    if (!present) KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
    c.rope_scaling_factor = f;
    if (f != 1.0 && !c.rope_scaling_type[0]) snprintf(c.rope_scaling_type, sizeof c.rope_scaling_type, "linear");
    KVP_TRY(get_pos_int(g, arch, "rope.scaling.original_context_length", 0, INT32_MAX, &c.rope_original_max_position));
    c.rope_beta_fast = 32;
    c.rope_beta_slow = 1;
    c.rope_truncate = 1;
    f = 1.0;
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch);
    KVP_TRY(kvp_gguf_get_float(g, key, &f, &present));
    if (present) c.rope_attention_factor = f * kvp_yarn_mscale(c.rope_scaling_factor, 1.0);
    KVP_TRY(longrope_factors(g, &c));
    /* The sampling the model's authors recommend, as llama.cpp's converter writes it from generation_config.json
     * (kvpage serve's defaults, as HF folders' generation_config.json) */
    static const struct {
        const char *key;
        unsigned bit;
    } samp[] = {{"general.sampling.temp", KVP_SAMPLING_TEMPERATURE}, {"general.sampling.top_p", KVP_SAMPLING_TOP_P},
                {"general.sampling.top_k", KVP_SAMPLING_TOP_K},      {"general.sampling.min_p", KVP_SAMPLING_MIN_P},
                {"general.sampling.penalty_repeat", KVP_SAMPLING_REPETITION}};
    for (size_t i = 0; i < sizeof samp / sizeof samp[0]; i++) {
        KVP_TRY(kvp_gguf_get_float(g, samp[i].key, &f, &present));
        if (present) KVP_TRY(kvp_sampling_set(&c.sampling, samp[i].bit, f, g->map.path, samp[i].key));
    }
    kvp_tensor_view emb;
    KVP_TRY(kvp_gguf_tensor(g, "token_embd.weight", &emb));
    if (emb.ndim != 2 || emb.shape[1] != c.hidden_size)
        return KVP_ERR(KVP_EPARSE, "%s: tensor 'token_embd.weight' has the wrong shape (want [vocab, %d])",
                       g->map.path, c.hidden_size);
    c.vocab_size = emb.shape[0];
    kvp_tensor_view outw;
    c.tie_word_embeddings = kvp_gguf_tensor(g, "output.weight", &outw) != KVP_OK;
    kvp_error_clear();
    kvp_tensor_view qb;
    c.attention_bias = kvp_gguf_tensor(g, "blk.0.attn_q.bias", &qb) == KVP_OK;
    c.qk_norm = kvp_gguf_tensor(g, "blk.0.attn_q_norm.weight", &qb) == KVP_OK;
    kvp_error_clear();
    KVP_TRY(kvp_gguf_special_token(g, "tokenizer.ggml.bos_token_id", c.vocab_size, &c.bos_token_id));
    /* EOS, then llama.cpp's end-of-turn and end-of-message ids (Llama-3-Instruct's <|eot_id|>): each ends
     * generation */
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    c.eos_token_id = -1;
    c.n_eos = 0;
    for (int i = 0; i < 3; i++) {
        int64_t id;
        KVP_TRY(kvp_gguf_special_token(g, eos_keys[i], c.vocab_size, &id));
        kvp_model_config_add_eos(&c, id);
    }
    c.moe_layer_step = 1;
    if (gemma) KVP_TRY(gemma_keys(g, arch, &c));
    *cfg = c;
    return KVP_OK;
}
