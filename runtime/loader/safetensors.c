/* runtime/loader/safetensors.c — safetensors reader (single file or sharded folder). */
#include "runtime/loader/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/json.h"
#include "runtime/loader/mapfile.h"

typedef struct {
    char *name; /* owned */
    int32_t file;
    kvp_wtype dtype;
    int32_t ndim;
    int64_t shape[KVP_TENSOR_MAX_DIMS];
    int64_t numel;
    uint64_t begin; /* absolute byte offset in the file */
    size_t nbytes;
} st_tensor;

struct kvp_st {
    char *path;
    kvp_mapfile *files;
    int32_t n_files;
    st_tensor *tensors;
    int64_t n_tensors;
    size_t cap_tensors;
};

static kvp_status parse_dtype(const char *file, const char *name, const char *s, kvp_wtype *dt)
{
    if (strcmp(s, "F32") == 0) *dt = KVP_WT_F32;
    else if (strcmp(s, "F16") == 0) *dt = KVP_WT_F16;
    else if (strcmp(s, "BF16") == 0) *dt = KVP_WT_BF16;
    else
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", file, name, s);
    return KVP_OK;
}

static kvp_status read_u64_item(const cJSON *it, const char *file, const char *name, const char *field, uint64_t max,
                                uint64_t *out)
{
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > (double)max ||
        it->valuedouble != (double)(uint64_t)it->valuedouble)
        return KVP_ERR(KVP_EPARSE, "%s: tensor '%s': bad %s entry", file, name, field);
    *out = (uint64_t)it->valuedouble;
    return KVP_OK;
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* The format forbids tensors sharing bytes: sorted by offset, each non-empty tensor of file fi (tensors
 * first.. of s) must start at or after the end of the one before. (Holes are tolerated.) data_start: the
 * data section's offset in the file, to report data_offsets as the header spells them. */
static kvp_status check_overlap(const kvp_st *s, int32_t fi, int64_t first, uint64_t data_start)
{
    int64_t n = s->n_tensors - first;
    if (n < 2) return KVP_OK;
    const char *file = s->files[fi].path;
    const st_tensor **by = kvp_malloc((size_t)n * sizeof *by);
    if (!by) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", file);
    int64_t m = 0;
    for (int64_t i = first; i < s->n_tensors; i++)
        if (s->tensors[i].nbytes > 0) by[m++] = &s->tensors[i];
    qsort(by, (size_t)m, sizeof *by, cmp_begin);
    kvp_status st = KVP_OK;
    for (int64_t i = 1; i < m; i++) {
        const st_tensor *a = by[i - 1], *b = by[i];
        if (b->begin < a->begin + a->nbytes) {
            uint64_t ab = a->begin - data_start, bb = b->begin - data_start;
            st = KVP_ERR(KVP_EPARSE, "%s: corrupt: tensors '%s' (data_offsets [%" PRIu64 ", %" PRIu64
                                     "]) and '%s' ([%" PRIu64 ", %" PRIu64 "]) overlap",
                         file, a->name, ab, ab + a->nbytes, b->name, bb, bb + b->nbytes);
            break;
        }
    }
    kvp_free(by);
    return st;
}

/* Parses one file's header and appends its tensors. */
static kvp_status parse_file(kvp_st *s, int32_t fi)
{
    const kvp_mapfile *m = &s->files[fi];
    const char *file = m->path;
    if (m->size < 8) return KVP_ERR(KVP_EPARSE, "%s: truncated: %zu bytes, too short for a safetensors header", file, m->size);
    uint64_t hlen;
    memcpy(&hlen, m->data, 8);
    if (hlen < 2 || hlen > m->size - 8)
        return KVP_ERR(KVP_EPARSE, "%s: truncated or corrupt: header length %" PRIu64 " but the file has %zu bytes",
                       file, hlen, m->size);
    if (hlen > (uint64_t)100 << 20)
        return KVP_ERR(KVP_EPARSE, "%s: header length %" PRIu64 " exceeds 100 MiB", file, hlen);
    uint64_t data_start = 8 + hlen, data_size = m->size - data_start;
    cJSON *root = NULL;
    char what[600];
    snprintf(what, sizeof what, "%s (header)", file);
    KVP_TRY(kvp_json_parse((const char *)m->data + 8, (size_t)hlen, what, &root));
    kvp_status st = KVP_OK;
    const int64_t first = s->n_tensors;
    if (!cJSON_IsObject(root)) {
        st = KVP_ERR(KVP_EPARSE, "%s: header is not a JSON object", file);
        goto out;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        const char *name = e->string;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            st = KVP_ERR(KVP_EPARSE, "%s: tensor '%s' needs dtype, shape and data_offsets [begin, end]", file, name);
            goto out;
        }
        st_tensor t;
        memset(&t, 0, sizeof t);
        t.file = fi;
        if ((st = parse_dtype(file, name, dt->valuestring, &t.dtype)) != KVP_OK) goto out;
        int nd = cJSON_GetArraySize(sh);
        if (nd > KVP_TENSOR_MAX_DIMS) {
            st = KVP_ERR(KVP_EUNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d)", file, name, nd,
                         KVP_TENSOR_MAX_DIMS);
            goto out;
        }
        t.ndim = nd;
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            uint64_t x = 0;
            if ((st = read_u64_item(cJSON_GetArrayItem(sh, d), file, name, "shape", (double)((uint64_t)1 << 40), &x)) !=
                KVP_OK)
                goto out;
            if (x != 0 && numel > ((uint64_t)1 << 50) / x) {
                st = KVP_ERR(KVP_EPARSE, "%s: tensor '%s' has an impossible shape", file, name);
                goto out;
            }
            numel *= x;
            t.shape[d] = (int64_t)x;
        }
        t.numel = (int64_t)numel;
        t.nbytes = kvp_wtype_nbytes(t.dtype, t.numel);
        uint64_t b = 0, en = 0;
        if ((st = read_u64_item(cJSON_GetArrayItem(off, 0), file, name, "data_offsets", 9.0e15, &b)) != KVP_OK ||
            (st = read_u64_item(cJSON_GetArrayItem(off, 1), file, name, "data_offsets", 9.0e15, &en)) != KVP_OK)
            goto out;
        if (en < b || en > data_size) {
            st = KVP_ERR(KVP_EPARSE, "%s: truncated or corrupt: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                                     "] point outside the %" PRIu64 "-byte data section",
                         file, name, b, en, data_size);
            goto out;
        }
        if (en - b != t.nbytes) {
            st = KVP_ERR(KVP_EPARSE, "%s: tensor '%s' has %" PRIu64 " bytes but its shape and dtype need %zu", file,
                         name, en - b, t.nbytes);
            goto out;
        }
        t.begin = data_start + b;
        for (int64_t j = 0; j < s->n_tensors; j++)
            if (strcmp(s->tensors[j].name, name) == 0) {
                st = KVP_ERR(KVP_EPARSE, "%s: tensor '%s' appears twice", file, name);
                goto out;
            }
        if ((st = kvp_grow((void **)&s->tensors, &s->cap_tensors, (size_t)s->n_tensors + 1, sizeof(st_tensor))) !=
            KVP_OK) {
            st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", file);
            goto out;
        }
        size_t nl = strlen(name);
        t.name = kvp_malloc(nl + 1);
        if (!t.name) {
            st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", file);
            goto out;
        }
        memcpy(t.name, name, nl + 1);
        s->tensors[s->n_tensors++] = t;
    }
    st = check_overlap(s, fi, first, data_start);
out:
    cJSON_Delete(root);
    return st;
}

void kvp_st_close(kvp_st *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_files; i++) kvp_mapfile_close(&s->files[i]);
    for (int64_t i = 0; i < s->n_tensors; i++) kvp_free(s->tensors[i].name);
    kvp_free(s->files);
    kvp_free(s->tensors);
    kvp_free(s->path);
    kvp_free(s);
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static kvp_status add_file(kvp_st *s, const char *path, int32_t *index)
{
    for (int32_t i = 0; i < s->n_files; i++)
        if (strcmp(s->files[i].path, path) == 0) {
            *index = i;
            return KVP_OK;
        }
    kvp_mapfile *nf = kvp_realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    s->files = nf;
    KVP_TRY(kvp_mapfile_open(path, &s->files[s->n_files]));
    *index = s->n_files++;
    return parse_file(s, *index);
}

static kvp_status open_index(kvp_st *s, const char *dir, const char *index_path)
{
    cJSON *root = NULL;
    KVP_TRY(kvp_json_parse_file(index_path, &root));
    kvp_status st = KVP_OK;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        st = KVP_ERR(KVP_EPARSE, "%s: missing object 'weight_map'", index_path);
        goto out;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
            st = KVP_ERR(KVP_EPARSE, "%s: weight_map entry '%s' is not a file name in the folder", index_path, e->string);
            goto out;
        }
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->valuestring);
        int32_t fi;
        if ((st = add_file(s, p, &fi)) != KVP_OK) goto out;
    }
    /* Every tensor the index names must be in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        int found = 0;
        for (int64_t i = 0; i < s->n_tensors && !found; i++)
            if (strcmp(s->tensors[i].name, e->string) == 0) {
                const char *f = s->files[s->tensors[i].file].path;
                const char *base = strrchr(f, '/');
                found = strcmp(base ? base + 1 : f, e->valuestring) == 0 ? 1 : -1;
            }
        if (found != 1) {
            st = KVP_ERR(KVP_EPARSE, "%s: tensor '%s' is not in shard %s", index_path, e->string, e->valuestring);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return st;
}

kvp_status kvp_st_open(const char *path, kvp_st **out)
{
    if (!path || !out) return KVP_ERR(KVP_EINVAL, "kvp_st_open: NULL argument");
    kvp_st *s = kvp_calloc(1, sizeof *s);
    if (!s) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    size_t n = strlen(path);
    s->path = kvp_malloc(n + 1);
    kvp_status st = KVP_OK;
    if (!s->path) {
        st = KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(s->path, path, n + 1);
    int32_t fi;
    if (is_dir(path)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (exists(p)) {
            st = open_index(s, path, p);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            if (!exists(p)) {
                st = KVP_ERR(KVP_EIO, "%s: folder has neither model.safetensors.index.json nor model.safetensors", path);
                goto fail;
            }
            st = add_file(s, p, &fi);
        }
    } else {
        st = add_file(s, path, &fi);
    }
    if (st != KVP_OK) goto fail;
    *out = s;
    return KVP_OK;
fail:
    kvp_st_close(s);
    return st;
}

int64_t kvp_st_num_tensors(const kvp_st *s) { return s->n_tensors; }

void kvp_st_tensor_at(const kvp_st *s, int64_t i, kvp_tensor_view *v)
{
    const st_tensor *t = &s->tensors[i];
    memset(v, 0, sizeof *v);
    v->name = t->name;
    v->file = s->files[t->file].path;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    v->numel = t->numel;
    v->nbytes = t->nbytes;
    v->data = s->files[t->file].data ? s->files[t->file].data + t->begin : NULL;
}

int kvp_st_has(const kvp_st *s, const char *name)
{
    for (int64_t i = 0; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return 1;
    return 0;
}

kvp_status kvp_st_tensor(const kvp_st *s, const char *name, kvp_tensor_view *out)
{
    for (int64_t i = 0; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) {
            kvp_st_tensor_at(s, i, out);
            return KVP_OK;
        }
    return KVP_ERR(KVP_ENOTFOUND, "%s: tensor '%s' is missing", s->path, name);
}
