#include "common/json.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"

kvp_status kvp_read_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    const int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (f == NULL) return KVP_ERR(KVP_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    kvp_status st = KVP_OK;
    for (;;) {
        if (kvp_grow((void **)&buf, &cap, n + 65536 + 1, 1) != KVP_OK) {
            st = KVP_ERR(KVP_ENOMEM, "out of memory reading %s", path);
            break;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n > max_bytes) {
            st = KVP_ERR(KVP_EINVAL, "%s is larger than %zu bytes", path, max_bytes);
            break;
        }
        if (got == 0) {
            if (ferror(f)) st = KVP_ERR(KVP_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
    }
    if (!is_stdin) fclose(f);
    if (st != KVP_OK) {
        kvp_free(buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    if (len) *len = n;
    return KVP_OK;
}

kvp_status kvp_json_parse(const char *text, size_t len, const char *what, cJSON **out)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root == NULL) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        if (at == NULL || at < text || at > text + len) at = text + len;
        int line = 1, col = 1;
        for (const char *p = text; p < at; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        return KVP_ERR(KVP_EPARSE, "%s: malformed JSON at line %d, column %d", what, line, col);
    }
    *out = root;
    return KVP_OK;
}

kvp_status kvp_json_parse_file(const char *path, cJSON **out)
{
    char *text;
    size_t len;
    KVP_TRY(kvp_read_file(path, 64u << 20, &text, &len));
    kvp_status st = kvp_json_parse(text, len, path, out);
    kvp_free(text);
    return st;
}

static const cJSON *member(const cJSON *obj, const char *key, int *present)
{
    const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (v != NULL && cJSON_IsNull(v)) v = NULL; /* "key": null means absent */
    if (present) *present = v != NULL;
    return v;
}

kvp_status kvp_json_num(const cJSON *obj, const char *key, double *out, int *present)
{
    const cJSON *v = member(obj, key, present);
    if (v == NULL) return KVP_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return KVP_ERR(KVP_EPARSE, "\"%s\" must be a number", key);
    *out = v->valuedouble;
    return KVP_OK;
}

kvp_status kvp_json_int(const cJSON *obj, const char *key, int64_t *out, int *present)
{
    const cJSON *v = member(obj, key, present);
    if (v == NULL) return KVP_OK;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return KVP_ERR(KVP_EPARSE, "\"%s\" must be an integer", key);
    *out = (int64_t)d;
    return KVP_OK;
}

kvp_status kvp_json_bool(const cJSON *obj, const char *key, int *out, int *present)
{
    const cJSON *v = member(obj, key, present);
    if (v == NULL) return KVP_OK;
    if (!cJSON_IsBool(v)) return KVP_ERR(KVP_EPARSE, "\"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return KVP_OK;
}

kvp_status kvp_json_str(const cJSON *obj, const char *key, const char **out, int *present)
{
    const cJSON *v = member(obj, key, present);
    if (v == NULL) return KVP_OK;
    if (!cJSON_IsString(v)) return KVP_ERR(KVP_EPARSE, "\"%s\" must be a string", key);
    *out = v->valuestring;
    return KVP_OK;
}

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when it is not one. */
static int utf8_len(const unsigned char *s)
{
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n == 0) return 0;
    /* the second byte's range excludes overlong forms, surrogates and code points above U+10FFFF */
    const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return n;
}

int kvp_utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = utf8_len(p);
        if (n == 0) return 0;
        p += n;
    }
    return 1;
}

kvp_status kvp_json_add_text(cJSON *obj, const char *key, const char *s)
{
    const size_t len = strlen(s);
    char *t = kvp_malloc(3 * len + 1); /* each bad byte becomes 3 */
    if (t == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory");
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = utf8_len(p);
        if (n > 0) {
            memcpy(t + o, p, (size_t)n);
            o += (size_t)n;
            p += n;
        } else {
            memcpy(t + o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
        }
    }
    t[o] = '\0';
    cJSON *item = cJSON_AddStringToObject(obj, key, t);
    kvp_free(t);
    return item ? KVP_OK : KVP_ERR(KVP_ENOMEM, "out of memory");
}

kvp_status kvp_json_print(FILE *f, const cJSON *obj)
{
    char *s = cJSON_Print(obj);
    if (s == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory printing JSON");
    int ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    cJSON_free(s);
    return ok ? KVP_OK : KVP_ERR(KVP_EIO, "cannot write JSON: %s", strerror(errno));
}

kvp_status kvp_json_write_file(const char *path, const cJSON *obj)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) return KVP_ERR(KVP_EIO, "cannot create %s: %s", path, strerror(errno));
    kvp_status st = kvp_json_print(f, obj);
    if (fclose(f) != 0 && st == KVP_OK) st = KVP_ERR(KVP_EIO, "cannot write %s: %s", path, strerror(errno));
    return st;
}
